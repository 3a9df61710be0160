//! Shard 0's replica: the durable side of the metadata plane (DESIGN sections 7-9). Every metadata
//! change and every client Register is a prepare appended to the journal and fsynced before it is
//! applied; with `replica_count = 1` that fsync is the commit (VSR Revisited section 4.1: the
//! primary commits once a quorum, here itself, has the prepare in its log). Every
//! `checkpoint_interval` committed ops, and at clean shutdown, a checkpoint writes a snapshot of
//! the metadata and the client table, records the (checkpoint_op, checksum) pairing in the
//! superblock, and releases the journal below it. Boot verifies superblock, snapshot and pairing,
//! then replays the journal above the snapshot.
//!
//! Lives on shard 0 only and is `!Send`. It must never apply an op that is not durable in the
//! journal, never reply to a duplicate by applying it again, never let a failed checkpoint step
//! invalidate the previous checkpoint, and never take its locks out of order.

pub mod apply;
pub mod boot;
pub mod client_table;
pub mod failpoint;
pub mod message;
pub mod prepare;
pub mod replica;
pub mod snapshot;
pub mod wire;

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

use futures_util::lock::Mutex;
use storage::durable::ReplaceStep;
use storage::journal::{Journal, JournalError, Prepare};
use storage::superblock::{Superblock, SuperblockState};

use crate::metadata::MetadataState;
use client_table::ClientTable;
use prepare::PrepareBody;

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

/// Shard 0's durable metadata state: journal, superblock, checkpoint, client table.
///
/// Lock order (DESIGN section 9): `checkpoint_lock`, then `superblock_lock`; never the reverse,
/// and neither is held across anything but the checkpoint (or, later, a state-transfer install)
/// it protects. `journal` is a leaf lock: nothing else is taken while it is held.
pub struct ReplicaStore {
    data_dir: PathBuf,
    /// The metadata WAL. Held for one append (by the metadata task) or one release (by a
    /// checkpoint).
    journal: Mutex<Journal>,
    /// Held for a whole checkpoint, so two never interleave. Taken before `superblock_lock`.
    checkpoint_lock: Mutex<()>,
    /// Held for one superblock write; guards the superblock handle itself. Taken after
    /// `checkpoint_lock` when both are needed.
    superblock_lock: Mutex<Superblock>,
    /// The highest op applied to the state machine and client table.
    commit_min: Cell<u64>,
    /// The op of the latest checkpoint recorded in the superblock (or found newer at boot).
    checkpoint_op: Cell<u64>,
    checkpoint_interval: u64,
    /// A checkpoint task is running or queued.
    checkpoint_pending: Cell<bool>,
    /// The op the running checkpoint covers (0 when none runs): ops up to it are being
    /// checkpointed, so they do not count toward the next one.
    checkpoint_op_in_progress: Cell<u64>,
    pub client_table: RefCell<ClientTable>,
}

impl std::fmt::Debug for ReplicaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaStore")
            .field("data_dir", &self.data_dir)
            .field("commit_min", &self.commit_min.get())
            .field("checkpoint_op", &self.checkpoint_op.get())
            .finish_non_exhaustive()
    }
}

impl ReplicaStore {
    /// The highest op applied to the state machine and client table.
    pub fn commit_min(&self) -> u64 {
        self.commit_min.get()
    }

    /// The op of the latest checkpoint.
    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op.get()
    }

    /// The snapshot file's path.
    pub fn snapshot_path(&self) -> PathBuf {
        snapshot_path(&self.data_dir)
    }

    /// Makes `body` durable as the next op's prepare and returns that op. The caller then
    /// applies it and calls [`ReplicaStore::committed`]; one prepare at a time (the metadata task).
    ///
    /// # Errors
    /// The journal's: `BodyTooLarge` (nothing written), `StorageFull` (the write was refused for
    /// lack of space and rolled back: nothing is journaled, `commit_min` is unchanged, and the
    /// next append reuses the op once space is freed), `Io` or `Poisoned` (the journal refuses
    /// every later append until the server restarts and reopens it; the op may or may not be on
    /// disk, and if it is, boot applies it).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped append poisons the journal.
    pub async fn append(&self, body: &PrepareBody) -> Result<u64, JournalError> {
        let op = self.commit_min.get() + 1;
        let prepare = Prepare {
            op,
            view: 0,
            commit: op - 1,
            body: body.encode(),
        };
        let mut journal = self.journal.lock().await;
        assert_eq!(
            journal.last_op(),
            op - 1,
            "single-replica journal ahead of commit_min"
        );
        journal.append(&prepare).await?;
        Ok(op)
    }

    /// Records that `op` (returned by [`ReplicaStore::append`]) is applied; returns whether a
    /// checkpoint is now due (and marks it pending, so exactly one caller starts it).
    ///
    /// # Panics
    /// If `op` is not the next op.
    pub fn committed(&self, op: u64) -> bool {
        assert_eq!(op, self.commit_min.get() + 1, "ops commit in order");
        self.commit_min.set(op);
        let covered_op = self
            .checkpoint_op
            .get()
            .max(self.checkpoint_op_in_progress.get());
        let due = op - covered_op >= self.checkpoint_interval;
        if due && !self.checkpoint_pending.get() {
            self.checkpoint_pending.set(true);
            return true;
        }
        false
    }

    /// Runs one checkpoint of the state at the current `commit_min` (DESIGN section 9): (1) the
    /// snapshot, by durable replace through io_uring, its JSON encoded off the reactor; (2) the
    /// superblock pairing; (3) the journal released below the checkpoint. Each step only after
    /// the previous succeeded. Does nothing if nothing committed since the last checkpoint.
    ///
    /// # Errors
    /// The step that failed; earlier steps stay done and the previous pairing stays valid (a
    /// snapshot written without its superblock write is accepted at boot as newer).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped checkpoint may leave the superblock or journal handle poisoned
    /// (later checkpoints then fail until restart); the files stay a valid checkpoint.
    pub async fn checkpoint(
        &self,
        metadata: &RefCell<std::sync::Arc<MetadataState>>,
    ) -> Result<Option<CheckpointDone>, CheckpointError> {
        let _checkpoint_guard = self.checkpoint_lock.lock().await;
        self.checkpoint_pending.set(false);
        let checkpoint_op = self.commit_min.get();
        if checkpoint_op <= self.checkpoint_op.get() {
            return Ok(None);
        }
        self.checkpoint_op_in_progress.set(checkpoint_op);
        let result = self.checkpoint_at(checkpoint_op, metadata).await;
        self.checkpoint_op_in_progress.set(0);
        result.map(Some)
    }

    /// The steps of [`ReplicaStore::checkpoint`] for `checkpoint_op`, under `checkpoint_lock`.
    async fn checkpoint_at(
        &self,
        checkpoint_op: u64,
        metadata: &RefCell<std::sync::Arc<MetadataState>>,
    ) -> Result<CheckpointDone, CheckpointError> {
        // One synchronous step, so metadata and client table are both exactly at checkpoint_op.
        // The metadata is shared, not copied: an op applied while the encoder runs copies it
        // (Arc::make_mut), so the reactor never copies the whole state for a checkpoint.
        let metadata = std::sync::Arc::clone(&*metadata.borrow());
        let client_table = self.client_table.borrow().to_snapshot();
        let started = std::time::Instant::now();
        let bytes = compio::runtime::spawn_blocking(move || {
            snapshot::encode_payload(checkpoint_op, &metadata, &client_table)
        })
        .await
        .map_err(|_| CheckpointError::Encode)?;
        let snapshot_size_bytes = bytes.len() as u64;
        tracing::info!(checkpoint_op, snapshot_size_bytes, "checkpoint started");
        let snapshot_checksum = storage::snapshot::write_snapshot(
            &self.snapshot_path(),
            checkpoint_op,
            bytes,
            &mut |step| {
                failpoint::hit(match step {
                    ReplaceStep::TmpWritten => "checkpoint.after_tmp_write",
                    ReplaceStep::TmpSynced => "checkpoint.after_tmp_fsync",
                    ReplaceStep::Renamed => "checkpoint.after_rename",
                    ReplaceStep::DirSynced => "checkpoint.after_dir_fsync",
                });
            },
        )
        .await?;
        {
            let mut superblock = self.superblock_lock.lock().await;
            let old = *superblock.state();
            let new = SuperblockState {
                commit_max: old.commit_max.max(checkpoint_op),
                checkpoint_op,
                snapshot_checksum,
                ..old
            };
            superblock
                .write_observed(new, &mut |copy_index| {
                    failpoint::hit(match copy_index {
                        0 => "checkpoint.after_superblock_copy_0",
                        1 => "checkpoint.after_superblock_copy_1",
                        2 => "checkpoint.after_superblock_copy_2",
                        _ => "checkpoint.after_superblock_copy_3",
                    });
                })
                .await?;
        }
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
}

/// `DATA_DIR/snapshot`.
pub fn snapshot_path(data_dir: &Path) -> PathBuf {
    data_dir.join(storage::snapshot::SNAPSHOT_FILE_NAME)
}

/// `DATA_DIR/superblock`.
pub fn superblock_path(data_dir: &Path) -> PathBuf {
    data_dir.join(storage::SUPERBLOCK_FILE_NAME)
}

/// `DATA_DIR/journal`.
pub fn journal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(crate::limits::JOURNAL_DIR_NAME)
}
