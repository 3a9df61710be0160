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
pub mod install;

pub use checkpoint::{CheckpointDone, CheckpointError};

use std::cell::Cell;
use std::path::{Path, PathBuf};

use futures_util::lock::Mutex;
use storage::journal::Journal;
use storage::superblock::Superblock;

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
    /// The op of the latest checkpoint recorded in the superblock (or found newer at boot).
    checkpoint_op: Cell<u64>,
}

impl std::fmt::Debug for ReplicaStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaStore")
            .field("data_dir", &self.data_dir)
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

    /// The op of the latest checkpoint.
    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op.get()
    }

    /// The snapshot file's path.
    pub fn snapshot_path(&self) -> PathBuf {
        snapshot_path(&self.data_dir)
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
