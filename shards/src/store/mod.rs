//! Shard 0's durable store: the I/O side of the metadata plane (DESIGN sections 7-9), kept out of
//! the pure `crate::vsr` core (issue 8 section 1). Every metadata
//! change and every client Register is a prepare appended to the journal and fsynced before it is
//! applied; with `replica_count = 1` that fsync is the commit (VSR Revisited section 4.1: the
//! primary commits once a quorum, here itself, has the prepare in its log). Every
//! `checkpoint_interval` committed ops, and at clean shutdown, a checkpoint writes a snapshot of
//! the metadata and the client table, records the (checkpoint_op, checksum) pairing in the
//! superblock, and releases the journal below it. Boot ([`boot`]) verifies superblock, snapshot,
//! pairing, cluster identity and the journal, and returns what it recovered for the core
//! (`crate::vsr::replica::Recovered`) with the open journal and superblock for the driver.
//!
//! Lives on shard 0 only and is `!Send`. It must never apply an op that is not durable in the
//! journal, never reply to a duplicate by applying it again, never let a failed checkpoint step
//! invalidate the previous checkpoint, and never take its locks out of order.

pub mod boot;
pub mod failpoint;
pub mod replay;

use std::cell::Cell;
use std::path::{Path, PathBuf};

use futures_util::lock::Mutex;
use storage::durable::ReplaceStep;
use storage::journal::{Journal, JournalError};
use storage::superblock::{Superblock, SuperblockState};

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

/// Shard 0's durable metadata state: journal, superblock, checkpoint (the state itself, metadata
/// and client table, is the consensus core's).
///
/// Lock order (DESIGN section 9): `checkpoint_lock`, then `superblock_lock`; never the reverse,
/// and neither is held across anything but the checkpoint (or, later, a state-transfer install)
/// it protects. `journal` is a leaf lock: nothing else is taken while it is held.
pub struct ReplicaStore {
    data_dir: PathBuf,
    /// The metadata WAL. Held for one batch of appends (the driver's journal writer), one
    /// truncation or read (the driver), or one release (a checkpoint).
    journal: Mutex<Journal>,
    /// Held for a whole checkpoint, so two never interleave. Taken before `superblock_lock`.
    checkpoint_lock: Mutex<()>,
    /// Held for one superblock write; guards the superblock handle itself. Taken after
    /// `checkpoint_lock` when both are needed.
    superblock_lock: Mutex<Superblock>,
    /// The highest op `replay::open` applied (the driver's store leaves it at the checkpoint:
    /// the core holds the commit number).
    commit_min: Cell<u64>,
    /// The op of the latest checkpoint recorded in the superblock (or found newer at boot).
    checkpoint_op: Cell<u64>,
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
    /// The store shard 0's driver uses: the journal and superblock boot opened
    /// (`boot::Boot`), the last checkpoint at `checkpoint_op`. The driver checkpoints with
    /// [`ReplicaStore::checkpoint_state`] (the core holds the state).
    pub fn for_driver(
        config: &crate::config::ServerConfig,
        journal: Journal,
        superblock: Superblock,
        checkpoint_op: u64,
    ) -> ReplicaStore {
        ReplicaStore {
            data_dir: config.data_dir.clone(),
            journal: Mutex::new(journal),
            checkpoint_lock: Mutex::new(()),
            superblock_lock: Mutex::new(superblock),
            commit_min: Cell::new(checkpoint_op),
            checkpoint_op: Cell::new(checkpoint_op),
        }
    }

    /// The journal (a leaf lock: see the struct's lock order), for the driver's journal actions.
    pub fn journal(&self) -> &Mutex<Journal> {
        &self.journal
    }

    /// The superblock (taken after `checkpoint_lock` when both are needed), for the driver's
    /// superblock writes.
    pub fn superblock(&self) -> &Mutex<Superblock> {
        &self.superblock_lock
    }

    /// Runs one checkpoint of `metadata` and `client_table`, the state after `op` (the core's
    /// `Checkpoint` action carries them), with the steps of [`ReplicaStore::checkpoint`]. Does
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
        let _checkpoint_guard = self.checkpoint_lock.lock().await;
        if op <= self.checkpoint_op.get() {
            return Ok(None);
        }
        self.checkpoint_at(op, metadata, client_table)
            .await
            .map(Some)
    }

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

    /// The steps of a checkpoint of `metadata` and `client_table` at `checkpoint_op`, under
    /// `checkpoint_lock`: (1) the snapshot, by durable replace through io_uring, its JSON encoded
    /// off the reactor; (2) the superblock pairing; (3) the journal released below the
    /// checkpoint. Each step only after the previous succeeded.
    async fn checkpoint_at(
        &self,
        checkpoint_op: u64,
        metadata: std::sync::Arc<MetadataState>,
        client_table: crate::vsr::client_table::ClientTableSnapshot,
    ) -> Result<CheckpointDone, CheckpointError> {
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
