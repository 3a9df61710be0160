//! Installing a checkpoint fetched by state transfer (DESIGN sections 9-10, issue 9 section 4).
//! FOUNDATION STUB: the store helper fills this in.

use std::sync::Arc;

use super::ReplicaStore;
use crate::metadata::MetadataState;
use crate::vsr::client_table::ClientTableSnapshot;

/// What one completed install did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct InstallDone {
    pub checkpoint_op: u64,
    /// The superblock pairing write failed after the snapshot was in place: the install
    /// succeeded (boot accepts a snapshot newer than its pairing); the next checkpoint repairs
    /// the pairing.
    pub degraded: bool,
    pub snapshot_size_bytes: u64,
}

/// Why an install stopped.
#[derive(Debug, thiserror::Error)]
pub enum InstallError {
    /// The snapshot write failed: nothing durable changed, the previous checkpoint and journal
    /// stay valid; the caller may retry the transfer.
    #[error("snapshot write failed: {0}")]
    Snapshot(#[from] storage::snapshot::SnapshotError),
}

impl ReplicaStore {
    /// Installs the checkpoint at `checkpoint_op` holding `metadata` and `client_table`.
    ///
    /// # Errors
    /// See [`InstallError`].
    #[allow(clippy::unused_async)]
    pub async fn install_checkpoint(
        &self,
        checkpoint_op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    ) -> Result<InstallDone, InstallError> {
        let _ = (checkpoint_op, metadata, client_table);
        todo!("store helper")
    }
}
