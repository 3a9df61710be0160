//! Installing a checkpoint fetched by state transfer (DESIGN sections 9-10, issue 9 section 4):
//! under `checkpoint_lock` then `superblock_lock` (the order asserted by [`super::LockSession`]),
//! a durable install marker, the snapshot by the durable replace through io_uring, then the
//! superblock pairing, then the journal restarted after the checkpoint, then the marker removed,
//! then the store's checkpoint op. It shares the
//! snapshot and pairing steps with the checkpoint (`checkpoint.rs`).
//!
//! It must never report failure once the snapshot is in place (the replica then holds the
//! installed state: a pairing write that failed after it is a degraded success, which boot
//! accepts as a snapshot newer than its pairing), and never leave the journal holding ops the
//! installed checkpoint replaced without boot finishing its restart.

use std::sync::Arc;

use storage::journal::JournalError;

use super::{CheckpointError, ReplicaStore, failpoint};
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
    /// The snapshot encoding task failed: nothing was written; the caller may retry.
    #[error("snapshot encoding task failed")]
    Encode,
    /// The store already holds a checkpoint at or above `checkpoint_op` (`current`): nothing
    /// was written; the transfer fetched a stale checkpoint, the caller starts over.
    #[error(
        "cannot install checkpoint op {checkpoint_op}: this replica's checkpoint is already at op \
         {current}"
    )]
    Stale { checkpoint_op: u64, current: u64 },
    /// The snapshot is installed (and maybe its pairing), but restarting the journal after it
    /// failed: the journal is poisoned. The caller stops the server; the next boot finishes the
    /// restart (`store::boot`), since the journal then holds nothing above the snapshot.
    #[error("checkpoint installed, but restarting the journal after it failed: {0}")]
    Journal(#[from] JournalError),
    /// Writing the install marker (`DATA_DIR/install.pending`) failed, before the snapshot:
    /// nothing else was written; the caller may retry the transfer.
    #[error("writing the install marker failed: {0}")]
    MarkerWrite(storage::DurableError),
    /// Removing the install marker failed after the journal restart: the install is complete on
    /// disk, but the marker may survive, and a boot that finds it beside this snapshot restarts
    /// the journal again: the caller stops the server before anything is appended (fail-stop,
    /// like `Journal`).
    #[error("checkpoint installed, but removing the install marker failed: {0}")]
    MarkerRemove(storage::DurableError),
}

impl ReplicaStore {
    /// Installs the checkpoint at `checkpoint_op` holding `metadata` and `client_table` (issue
    /// 9 section 4): under `checkpoint_lock` then `superblock_lock`, (0) the install marker
    /// (`DATA_DIR/install.pending` holding `checkpoint_op`); (1) the snapshot by durable
    /// replace through io_uring, its payload encoded off the reactor; (2) the superblock
    /// pairing (checkpoint_op, snapshot checksum, commit_max at least checkpoint_op); (3) the
    /// journal restarted after `checkpoint_op` (no record kept, next op `checkpoint_op + 1`);
    /// (4) the marker removed; (5) the store's checkpoint op. A pairing write that fails after (1) is not an error: the
    /// install returns `degraded: true` (logged, counted by [`ReplicaStore::degraded_install_count`]).
    ///
    /// # Errors
    /// - `Stale`: a checkpoint at or above `checkpoint_op` is already held; nothing written.
    /// - `Encode`, `Snapshot`: step (1) failed; the previous checkpoint and journal stay valid.
    /// - `MarkerWrite`: step (0), the install marker, failed; nothing else written.
    /// - `Journal`: step (3) failed after the snapshot was installed (see the variant).
    /// - `MarkerRemove`: step (4), removing the marker, failed (see the variant).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped install may leave the superblock or journal handle poisoned;
    /// the files are a crash state boot accepts.
    pub async fn install_checkpoint(
        &self,
        checkpoint_op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    ) -> Result<InstallDone, InstallError> {
        let mut locks = self.lock_session();
        locks.lock_checkpoint().await;
        let current = self.checkpoint_op.get();
        if checkpoint_op <= current {
            return Err(InstallError::Stale {
                checkpoint_op,
                current,
            });
        }
        self.write_install_marker(checkpoint_op).await?;
        let written = self
            .write_snapshot_of(
                checkpoint_op,
                metadata,
                client_table,
                super::checkpoint::SnapshotPurpose::Install,
                |_| None,
            )
            .await
            .map_err(|error| match error {
                CheckpointError::Snapshot(error) => InstallError::Snapshot(error),
                _ => InstallError::Encode,
            })?;
        failpoint::hit("install.after_snapshot");
        let degraded = match self
            .install_pairing(&mut locks, checkpoint_op, written.checksum)
            .await
        {
            Ok(()) => false,
            Err(error) => {
                self.note_degraded(checkpoint_op, &error);
                self.reopen_superblock(&mut locks).await;
                true
            }
        };
        failpoint::hit("install.after_superblock");
        self.journal
            .lock()
            .await
            .restart_after(checkpoint_op)
            .await?;
        failpoint::hit("install.after_journal_restart");
        storage::durable::durable_remove(&super::install_marker_path(&self.data_dir))
            .await
            .map_err(InstallError::MarkerRemove)?;
        self.checkpoint_op.set(checkpoint_op);
        tracing::info!(
            checkpoint_op,
            snapshot_checksum = format_args!("{:#018x}", written.checksum),
            snapshot_size_bytes = written.size_bytes,
            degraded,
            "state transfer: checkpoint installed; the journal continues at the next op"
        );
        Ok(InstallDone {
            checkpoint_op,
            degraded,
            snapshot_size_bytes: written.size_bytes,
        })
    }

    /// Step (0): the durable install marker holding `checkpoint_op`, written before the
    /// snapshot. A crash after the snapshot is in place and before the journal restart is
    /// durable leaves the marker beside a snapshot at `checkpoint_op`: boot then finishes the
    /// restart, so the old journal's suffix (possibly another chain above the installed op) is
    /// never replayed on top of the installed state (issue 9 section 4).
    async fn write_install_marker(&self, checkpoint_op: u64) -> Result<(), InstallError> {
        storage::durable::durable_replace(
            &super::install_marker_path(&self.data_dir),
            checkpoint_op.to_le_bytes().to_vec(),
        )
        .await
        .map_err(InstallError::MarkerWrite)
    }

    /// Installs whose superblock pairing write failed, since the process started.
    pub fn degraded_install_count(&self) -> u64 {
        self.degraded_install_count.get()
    }

    /// Step (2) of an install, through the test seam [`ReplicaStore::fail_next_install_pairing`].
    async fn install_pairing(
        &self,
        locks: &mut super::LockSession<'_>,
        checkpoint_op: u64,
        snapshot_checksum: u64,
    ) -> Result<(), storage::SuperblockError> {
        if self.fail_next_install_pairing.replace(false) {
            let guard = locks.lock_superblock().await;
            let path = guard.path().to_path_buf();
            locks.release_superblock(guard);
            return Err(storage::SuperblockError::Io {
                path,
                op: "write superblock copy",
                source: std::io::Error::other("injected failure (fail_next_install_pairing)"),
            });
        }
        self.write_pairing(locks, checkpoint_op, snapshot_checksum, |_| None)
            .await
    }

    /// After a failed pairing write: replaces the superblock handle (which a failed write
    /// poisons) with a fresh open of the file, so later view changes and the next checkpoint can
    /// write it again (the next checkpoint then records the pairing). Open picks the highest
    /// valid copy, old or new pairing alike. If the reopen fails too, the handle stays poisoned
    /// and the next superblock write stops the server (fail-stop, as before).
    async fn reopen_superblock(&self, locks: &mut super::LockSession<'_>) {
        let mut superblock = locks.lock_superblock().await;
        let path = superblock.path().to_path_buf();
        match storage::superblock::Superblock::open(&path).await {
            Ok((reopened, _report)) => {
                tracing::info!(
                    path = %path.display(),
                    checkpoint_op = reopened.state().checkpoint_op,
                    "superblock reopened after the failed pairing write"
                );
                *superblock = reopened;
            }
            Err(error) => tracing::error!(
                path = %path.display(), %error,
                "cannot reopen the superblock after the failed pairing write; its next write \
                 stops the server"
            ),
        }
        locks.release_superblock(superblock);
    }

    /// Logs and counts a degraded install (issue 9 section 4).
    fn note_degraded(&self, checkpoint_op: u64, error: &storage::SuperblockError) {
        let count = self.degraded_install_count.get() + 1;
        self.degraded_install_count.set(count);
        tracing::warn!(
            checkpoint_op, %error, degraded_install_count = count,
            "state transfer: checkpoint installed DEGRADED: the snapshot is in place but the \
             superblock pairing write failed; boot accepts the newer snapshot and the next \
             checkpoint records the pairing"
        );
    }
}

#[cfg(test)]
#[path = "install_tests.rs"]
mod tests;
