//! The checkpoint of shard 0's durable store (DESIGN section 9, `storage/FORMAT.md` section 10):
//! snapshot, superblock pairing, journal release, each step only after the previous succeeded,
//! under `checkpoint_lock` then `superblock_lock`.

use storage::durable::ReplaceStep;
use storage::journal::JournalError;
use storage::superblock::SuperblockState;

use super::{LockSession, ReplicaStore, failpoint};
use crate::metadata::MetadataState;
use crate::vsr::snapshot;

/// Why a checkpoint stopped; the previous checkpoint stays valid in every case.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("snapshot write failed: {0}")]
    Snapshot(#[from] storage::snapshot::SnapshotError),
    #[error("superblock write failed: {0}")]
    Superblock(#[from] storage::SuperblockError),
    #[error("journal release failed: {0}")]
    Journal(#[from] JournalError),
    #[error("snapshot encoding task failed")]
    Encode,
}

impl CheckpointError {
    /// The file whose write or creation was refused for lack of a resource: space, quota or file
    /// size (`ENOSPC`, `EDQUOT`, `EFBIG`: `storage::space::is_storage_full`) or file descriptors
    /// (`EMFILE`, `ENFILE`: `storage::space::is_descriptors_exhausted`); `None` for any other
    /// failure. Such a checkpoint changed nothing durable: the previous checkpoint stays valid and
    /// the journal keeps every op above it, so the caller may warn and carry on.
    pub fn resource_refused(&self) -> Option<&std::path::Path> {
        let (CheckpointError::Snapshot(storage::snapshot::SnapshotError::Io {
            path, source, ..
        })
        | CheckpointError::Superblock(storage::SuperblockError::Io { path, source, .. })) = self
        else {
            return None;
        };
        (storage::space::is_storage_full(source)
            || storage::space::is_descriptors_exhausted(source))
        .then_some(path.as_path())
    }
}

/// What one completed checkpoint did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointDone {
    pub checkpoint_op: u64,
    pub snapshot_checksum: u64,
    pub snapshot_size_bytes: u64,
    pub released_segment_count: usize,
}

impl ReplicaStore {
    /// Runs one checkpoint of `metadata` and `client_table`, the state after `op` (the core's
    /// `Checkpoint` action carries them), in the steps of `checkpoint_at`. Does
    /// nothing (`Ok(None)`) if a checkpoint at or above `op` is already recorded.
    ///
    /// # Errors
    /// The step that failed; earlier steps stay done and the previous pairing stays valid (a
    /// snapshot written without its superblock write is accepted at boot as newer).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped checkpoint may leave the superblock or journal handle poisoned
    /// (later checkpoints then fail until restart); the files stay a valid checkpoint.
    pub async fn checkpoint_state(
        &self,
        op: u64,
        metadata: std::sync::Arc<MetadataState>,
        client_table: crate::vsr::client_table::ClientTableSnapshot,
    ) -> Result<Option<CheckpointDone>, CheckpointError> {
        let mut locks = self.lock_session();
        locks.lock_checkpoint().await;
        if op <= self.checkpoint_op.get() {
            return Ok(None);
        }
        self.checkpoint_at(&mut locks, op, metadata, client_table)
            .await
            .map(Some)
    }

    /// The steps of a checkpoint of `metadata` and `client_table` at `checkpoint_op`, under
    /// `checkpoint_lock` (held by `locks`): (1) the snapshot, by durable replace through
    /// io_uring, its JSON encoded off the reactor; (2) the superblock pairing; (3) the journal
    /// released below the checkpoint. Each step only after the previous succeeded.
    async fn checkpoint_at(
        &self,
        locks: &mut LockSession<'_>,
        checkpoint_op: u64,
        metadata: std::sync::Arc<MetadataState>,
        client_table: crate::vsr::client_table::ClientTableSnapshot,
    ) -> Result<CheckpointDone, CheckpointError> {
        let started = std::time::Instant::now();
        let written = self
            .write_snapshot_of(
                checkpoint_op,
                metadata,
                client_table,
                SnapshotPurpose::Checkpoint,
                |step| {
                    Some(match step {
                        ReplaceStep::TmpWritten => "checkpoint.after_tmp_write",
                        ReplaceStep::TmpSynced => "checkpoint.after_tmp_fsync",
                        ReplaceStep::Renamed => "checkpoint.after_rename",
                        ReplaceStep::DirSynced => "checkpoint.after_dir_fsync",
                    })
                },
            )
            .await?;
        let snapshot_checksum = written.checksum;
        let snapshot_size_bytes = written.size_bytes;
        self.write_pairing(locks, checkpoint_op, snapshot_checksum, |copy_index| {
            Some(match copy_index {
                0 => "checkpoint.after_superblock_copy_0",
                1 => "checkpoint.after_superblock_copy_1",
                2 => "checkpoint.after_superblock_copy_2",
                _ => "checkpoint.after_superblock_copy_3",
            })
        })
        .await?;
        self.checkpoint_op.set(checkpoint_op);
        let released = self
            .journal
            .lock()
            .await
            .release_below(checkpoint_op + 1)
            .await;
        let released_segment_count = match released {
            Ok(count) => count,
            // An append was interrupted (a metadata commit cancelled at shutdown) or failed
            // earlier: the new checkpoint is durable and valid; the journal merely keeps
            // segments that boot skips. Not a checkpoint failure.
            Err(JournalError::Poisoned { path, op, reason }) => {
                tracing::warn!(
                    path = %path.display(), op, %reason, checkpoint_op,
                    "checkpoint recorded, journal not released: an earlier journal write did not \
                     complete; the next boot replays only above the checkpoint"
                );
                0
            }
            Err(error) => return Err(error.into()),
        };
        failpoint::hit("checkpoint.after_wal_release");
        tracing::info!(
            checkpoint_op,
            snapshot_checksum = format_args!("{snapshot_checksum:#018x}"),
            snapshot_size_bytes,
            released_segment_count,
            duration_ms = started.elapsed().as_millis() as u64,
            "checkpoint done"
        );
        Ok(CheckpointDone {
            checkpoint_op,
            snapshot_checksum,
            snapshot_size_bytes,
            released_segment_count,
        })
    }

    /// Writes the snapshot of `metadata` and `client_table` at `checkpoint_op` (a checkpoint's
    /// and an install's step 1): the payload JSON is encoded off the reactor
    /// (`spawn_blocking`), then written by the durable replace through io_uring
    /// (`storage::snapshot::write_snapshot`), the failpoint `failpoint_of(step)` names (if any)
    /// hit after each step.
    ///
    /// # Errors
    /// `Encode` if the encoding task failed; `Snapshot` if the write failed (the old snapshot,
    /// or the new one only if the rename happened, is in place).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped write may leave `snapshot.tmp` behind (ignored at boot).
    pub(super) async fn write_snapshot_of(
        &self,
        checkpoint_op: u64,
        metadata: std::sync::Arc<MetadataState>,
        client_table: crate::vsr::client_table::ClientTableSnapshot,
        purpose: SnapshotPurpose,
        failpoint_of: fn(ReplaceStep) -> Option<&'static str>,
    ) -> Result<SnapshotWritten, CheckpointError> {
        let bytes = compio::runtime::spawn_blocking(move || {
            snapshot::encode_payload(checkpoint_op, &metadata, &client_table)
        })
        .await
        .map_err(|_| CheckpointError::Encode)?;
        let size_bytes = bytes.len() as u64;
        // "checkpoint started" or "install started": tests and operators watch for it.
        tracing::info!(
            checkpoint_op,
            snapshot_size_bytes = size_bytes,
            "{} started",
            purpose.name()
        );
        let checksum = storage::snapshot::write_snapshot(
            &self.snapshot_path(),
            checkpoint_op,
            bytes,
            &mut |step| {
                if let Some(name) = failpoint_of(step) {
                    failpoint::hit(name);
                }
            },
        )
        .await?;
        Ok(SnapshotWritten {
            checksum,
            size_bytes,
        })
    }

    /// Records the pairing (`checkpoint_op`, `snapshot_checksum`, and `commit_max` raised to at
    /// least `checkpoint_op`) in the superblock under `superblock_lock`, taken through `locks`
    /// (after its `checkpoint_lock`), the failpoint `failpoint_of(copy_index)` names (if any)
    /// hit after each copy.
    ///
    /// # Errors
    /// The superblock write's (its handle is then poisoned).
    ///
    /// # Panics
    /// If `checkpoint_op` is below the superblock's (VSR monotonicity, a caller bug).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped write poisons the superblock handle.
    pub(super) async fn write_pairing(
        &self,
        locks: &mut LockSession<'_>,
        checkpoint_op: u64,
        snapshot_checksum: u64,
        failpoint_of: fn(usize) -> Option<&'static str>,
    ) -> Result<(), storage::SuperblockError> {
        let mut superblock = locks.lock_superblock().await;
        let old = *superblock.state();
        let new = SuperblockState {
            commit_max: old.commit_max.max(checkpoint_op),
            checkpoint_op,
            snapshot_checksum,
            ..old
        };
        let result = superblock
            .write_observed(new, &mut |copy_index| {
                if let Some(name) = failpoint_of(copy_index) {
                    failpoint::hit(name);
                }
            })
            .await;
        locks.release_superblock(superblock);
        result
    }
}

/// What [`ReplicaStore::write_snapshot_of`] wrote.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct SnapshotWritten {
    /// The snapshot file's trailer checksum (XXH3-64), the pairing's.
    pub checksum: u64,
    /// The encoded payload's size.
    pub size_bytes: u64,
}

/// Why a snapshot is written: a checkpoint of this replica's state, or the install of one
/// fetched by state transfer (named in the "... started" log line).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum SnapshotPurpose {
    Checkpoint,
    Install,
}

impl SnapshotPurpose {
    fn name(self) -> &'static str {
        match self {
            SnapshotPurpose::Checkpoint => "checkpoint",
            SnapshotPurpose::Install => "state transfer: install",
        }
    }
}
