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
pub use install::{InstallDone, InstallError};

use std::cell::{Cell, RefCell};
use std::path::{Path, PathBuf};

use futures_util::lock::{Mutex, MutexGuard};
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
    /// The op of the latest checkpoint recorded in the superblock (or found newer at boot, or
    /// installed by state transfer even when its pairing write failed).
    checkpoint_op: Cell<u64>,
    /// Every lock a [`LockSession`] took, in order (tests read it: issue 9 section 4, the lock
    /// order is asserted and observable). Bounded: cleared by [`ReplicaStore::take_lock_trace`]
    /// and kept to [`LOCK_TRACE_MAX`] entries.
    lock_trace: RefCell<Vec<LockName>>,
    /// Test seam: the next install's superblock pairing write fails (issue 9 section 4,
    /// degraded install) without touching the superblock file or handle.
    fail_next_install_pairing: Cell<bool>,
    /// Installs whose pairing write failed since the process started (issue 9 section 4).
    degraded_install_count: Cell<u64>,
}

/// Entries [`ReplicaStore`] keeps in its lock trace (oldest dropped): enough for a test to see
/// one checkpoint's or install's acquisitions.
pub const LOCK_TRACE_MAX: usize = 64;

/// The two ordered locks of the store (DESIGN section 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LockName {
    Checkpoint,
    Superblock,
}

/// The locks one checkpoint or install holds, taken through it so the order is asserted
/// (DESIGN section 9, issue 9 section 4): `checkpoint_lock` may never be taken while this session
/// holds `superblock_lock`. Guards are dropped with the session, or earlier by the caller.
pub struct LockSession<'store> {
    store: &'store ReplicaStore,
    checkpoint: Option<MutexGuard<'store, ()>>,
    superblock_held: bool,
}

impl std::fmt::Debug for LockSession<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LockSession")
            .field("checkpoint_held", &self.checkpoint.is_some())
            .field("superblock_held", &self.superblock_held)
            .finish_non_exhaustive()
    }
}

impl<'store> LockSession<'store> {
    /// Takes `checkpoint_lock` for the rest of the session.
    ///
    /// # Panics
    /// If this session holds `superblock_lock` (the order would be reversed: a bug).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held until the lock is.
    pub async fn lock_checkpoint(&mut self) {
        assert!(
            !self.superblock_held,
            "lock order violated: checkpoint_lock taken while superblock_lock is held \
             (DESIGN section 9: checkpoint_lock, then superblock_lock)"
        );
        let guard = self.store.checkpoint_lock.lock().await;
        self.store.trace(LockName::Checkpoint);
        self.checkpoint = Some(guard);
    }

    /// Takes `superblock_lock` for one superblock write; `checkpoint_lock` may not be taken
    /// until the returned guard is given back with [`LockSession::release_superblock`].
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is held until the lock is.
    pub async fn lock_superblock(&mut self) -> MutexGuard<'store, Superblock> {
        let guard = self.store.superblock_lock.lock().await;
        self.store.trace(LockName::Superblock);
        self.superblock_held = true;
        guard
    }

    /// Gives back the guard [`LockSession::lock_superblock`] returned.
    pub fn release_superblock(&mut self, guard: MutexGuard<'store, Superblock>) {
        drop(guard);
        self.superblock_held = false;
    }
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
            lock_trace: RefCell::new(Vec::new()),
            fail_next_install_pairing: Cell::new(false),
            degraded_install_count: Cell::new(0),
        }
    }

    /// A session to take the ordered locks through (see [`LockSession`]).
    pub fn lock_session(&self) -> LockSession<'_> {
        LockSession {
            store: self,
            checkpoint: None,
            superblock_held: false,
        }
    }

    /// The locks sessions took since the last call, oldest first (at most [`LOCK_TRACE_MAX`]).
    pub fn take_lock_trace(&self) -> Vec<LockName> {
        std::mem::take(&mut self.lock_trace.borrow_mut())
    }

    fn trace(&self, lock: LockName) {
        let mut trace = self.lock_trace.borrow_mut();
        if trace.len() == LOCK_TRACE_MAX {
            trace.remove(0);
        }
        trace.push(lock);
    }

    /// Test seam (issue 9 section 4, degraded install): the next
    /// [`ReplicaStore::install_checkpoint`]'s superblock pairing write fails with an injected
    /// I/O error after the snapshot is in place. The superblock file and handle stay as they
    /// were, as if the write had failed before its first copy.
    pub fn fail_next_install_pairing(&self) {
        self.fail_next_install_pairing.set(true);
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

/// `DATA_DIR/install.pending`: present (holding the op) from just before a state-transfer
/// install writes its snapshot until its journal restart is durable (`install.rs`); boot
/// finishes the restart when it finds it beside the installed snapshot (`boot.rs`).
pub fn install_marker_path(data_dir: &Path) -> PathBuf {
    data_dir.join(INSTALL_MARKER_FILE_NAME)
}

/// File name of [`install_marker_path`].
pub const INSTALL_MARKER_FILE_NAME: &str = "install.pending";

/// `DATA_DIR/superblock`.
pub fn superblock_path(data_dir: &Path) -> PathBuf {
    data_dir.join(storage::SUPERBLOCK_FILE_NAME)
}

/// `DATA_DIR/journal`.
pub fn journal_dir(data_dir: &Path) -> PathBuf {
    data_dir.join(crate::limits::JOURNAL_DIR_NAME)
}
