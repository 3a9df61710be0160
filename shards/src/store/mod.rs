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
mod checkpoint;
pub mod failpoint;
pub mod replay;

pub use checkpoint::{CheckpointDone, CheckpointError};

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

use futures_util::lock::Mutex;
use storage::journal::{Journal, JournalError, Prepare};
use storage::superblock::Superblock;

use crate::vsr::client_table::ClientTable;
use crate::vsr::prepare::PrepareBody;

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
