//! The state-transfer manifest codec (issue 9 section 2, `storage/FORMAT.md` section 11).
//! FOUNDATION STUB: the codec helper fills this in.

use super::{ArtifactKind, Manifest};

/// Most entries a manifest holds (one per artifact kind, with room for kinds added later).
pub const MANIFEST_ENTRY_COUNT_MAX: usize = 16;

/// The receiver's bounds on what it accepts to fetch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestCaps {
    /// Longest metadata artifact (bytes).
    pub metadata_len_max: u64,
    /// Longest client-table artifact (bytes).
    pub client_table_len_max: u64,
    /// Longest sum of all artifact lengths (bytes).
    pub total_len_max: u64,
}

impl ManifestCaps {
    /// The caps of a receiver whose `--clients-table-max` is `clients_table_max`.
    pub fn for_receiver(clients_table_max: usize) -> ManifestCaps {
        let _ = clients_table_max;
        todo!("codec helper")
    }

    /// The cap of one artifact kind.
    pub fn len_max(&self, kind: ArtifactKind) -> u64 {
        match kind {
            ArtifactKind::Metadata => self.metadata_len_max,
            ArtifactKind::ClientTable => self.client_table_len_max,
        }
    }
}

/// Why a manifest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ManifestError {
    #[error("manifest: {0}")]
    Decode(#[from] storage::codec::DecodeError),
}

/// Encodes `manifest` (magic, version, count, entry length, entries, trailer).
pub fn encode(manifest: &Manifest) -> Vec<u8> {
    let _ = manifest;
    todo!("codec helper")
}

/// Decodes and checks a manifest against `caps`.
///
/// # Errors
/// The first rule the bytes break.
pub fn decode(bytes: &[u8], caps: &ManifestCaps) -> Result<Manifest, ManifestError> {
    let _ = (bytes, caps);
    todo!("codec helper")
}
