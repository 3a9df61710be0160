//! Persistence of the metadata state: `metadata.json` in the data directory, written by the
//! durable replace of `storage` (tmp, fsync, rename, fsync dir, XXH3-64 trailer). A corrupt file is
//! an error naming the path; it is never skipped or overwritten.

use std::path::{Path, PathBuf};

use super::{METADATA_VERSION, MetadataState};

#[derive(Debug, thiserror::Error)]
pub enum MetadataStoreError {
    #[error(transparent)]
    Durable(#[from] storage::DurableError),
    #[error("{path}: metadata payload does not decode: {reason}")]
    Decode { path: PathBuf, reason: String },
    #[error(
        "{path}: metadata version {found} is not supported (this build reads version {expected})"
    )]
    Version {
        path: PathBuf,
        found: u32,
        expected: u32,
    },
}

pub fn metadata_path(data_dir: &Path) -> PathBuf {
    data_dir.join(crate::limits::METADATA_FILE_NAME)
}

/// Loads the metadata, or a fresh state if the file does not exist yet.
pub async fn load(data_dir: &Path) -> Result<MetadataState, MetadataStoreError> {
    let path = metadata_path(data_dir);
    let Some(payload) = storage::read_verified(&path).await? else {
        return Ok(MetadataState::new());
    };
    let state: MetadataState =
        serde_json::from_slice(&payload).map_err(|e| MetadataStoreError::Decode {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    state.check().map_err(|reason| MetadataStoreError::Decode {
        path: path.clone(),
        reason,
    })?;
    if state.version != METADATA_VERSION {
        return Err(MetadataStoreError::Version {
            path,
            found: state.version,
            expected: METADATA_VERSION,
        });
    }
    Ok(state)
}

/// Durably replaces the metadata file with `state`.
pub async fn save(data_dir: &Path, state: &MetadataState) -> Result<(), MetadataStoreError> {
    let payload = serde_json::to_vec_pretty(state).expect("metadata serializes: plain data");
    storage::durable_replace(&metadata_path(data_dir), payload).await?;
    Ok(())
}
