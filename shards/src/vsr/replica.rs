//! The sans-IO consensus core: Viewstamped Replication (VSR Revisited, Liskov & Cowling 2012)
//! over the metadata state machine and the client table. It takes one input at a time (a peer's
//! message, a client request, a tick, an I/O completion) and returns the actions its driver must
//! perform, in order. It never awaits, reads a clock, touches a file or a socket: shard 0's
//! driver runs it in `serve`, and `shardline sim` runs the very same code against a simulated
//! network, disk and clock (issue 8 section 1).
//!
//! INTERFACE SKELETON: the bodies are filled in by the core's implementation.
#![allow(clippy::needless_pass_by_value)]

use storage::journal::Prepare;

use super::client_table::ClientTable;
use super::message::{Action, ClientRequest, Completion, Message, ReplicaIndex, Status};
use crate::metadata::MetadataState;

/// Fixed parameters of one replica's core.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CoreConfig {
    pub cluster: u128,
    pub replica: ReplicaIndex,
    /// 1, 3 or 5.
    pub replica_count: u8,
    /// Prepares in flight at most (`crate::limits::PIPELINE_PREPARE_MAX`).
    pub pipeline_max: usize,
    /// Ticks between two heartbeats of an idle primary.
    pub heartbeat_ticks: u64,
    /// Ticks without a message from the primary before a backup starts a view change; the core
    /// randomizes the actual timeout in `timeout..2*timeout` from `seed`.
    pub view_change_timeout_ticks: u64,
    /// `--clients-table-max`.
    pub clients_table_max: usize,
    /// Seeds the core's own PRNG (view-change backoff). The driver passes something random; the
    /// simulator passes a value derived from its seed.
    pub seed: u64,
}

/// What recovery at boot found on disk: the input of [`Replica::open`].
#[derive(Debug)]
pub struct Recovered {
    /// From the superblock.
    pub view: u32,
    pub log_view: u32,
    pub commit_max: u64,
    /// The checkpoint (snapshot) op; `metadata` and `client_table` are the state after it.
    pub checkpoint_op: u64,
    pub metadata: MetadataState,
    pub client_table: ClientTable,
    /// The valid prepares the journal holds above `checkpoint_op`, ascending and contiguous from
    /// `checkpoint_op + 1` (recovery stops at the first missing, torn or corrupt record).
    pub prepares: Vec<Prepare>,
    /// The highest op of any record in the journal, valid or not (above the last of `prepares`
    /// when a damaged record sits in the middle: the core truncates there and repairs).
    pub journal_last_op: u64,
    /// The lowest op the journal still holds (records below were released by a checkpoint).
    pub journal_first_op: u64,
}

/// One replica's consensus state. `!Send` is not required, but only one driver owns it.
#[derive(Debug)]
pub struct Replica {
    config: CoreConfig,
}

impl Replica {
    /// Starts the core from what recovery found. Returns the first actions (e.g. a superblock
    /// write that moves a restarted primary into a view change, or the Apply of journaled ops a
    /// single replica may commit at once).
    pub fn open(config: CoreConfig, recovered: Recovered) -> (Replica, Vec<Action>) {
        let _ = recovered;
        todo!("core implementation: {config:?}")
    }

    /// A message from peer `from` (already checked for cluster id and checksum by the wire
    /// codec).
    pub fn on_message(&mut self, from: ReplicaIndex, message: Message) -> Vec<Action> {
        let _ = (from, message);
        todo!()
    }

    /// A client request (Register or a metadata change). A backup answers `NotPrimary`.
    pub fn on_request(&mut self, request: ClientRequest) -> Vec<Action> {
        let _ = request;
        todo!()
    }

    /// One tick of the driver's clock.
    pub fn on_tick(&mut self) -> Vec<Action> {
        todo!()
    }

    /// The outcome of an I/O action this core asked for.
    pub fn on_io_done(&mut self, completion: Completion) -> Vec<Action> {
        let _ = completion;
        todo!()
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    pub fn view(&self) -> u32 {
        todo!()
    }

    pub fn log_view(&self) -> u32 {
        todo!()
    }

    pub fn status(&self) -> Status {
        todo!()
    }

    /// The primary of the current view: `view % replica_count`.
    pub fn primary(&self) -> ReplicaIndex {
        todo!()
    }

    /// Whether this replica is the primary of its view with status normal.
    pub fn is_primary(&self) -> bool {
        todo!()
    }

    /// The highest op applied to the state machine.
    pub fn commit_min(&self) -> u64 {
        todo!()
    }

    /// The highest op known committed.
    pub fn commit_max(&self) -> u64 {
        todo!()
    }

    /// The highest op in the log (prepared, maybe not committed).
    pub fn op(&self) -> u64 {
        todo!()
    }

    pub fn checkpoint_op(&self) -> u64 {
        todo!()
    }

    /// The state machine at `commit_min`.
    pub fn metadata(&self) -> &std::sync::Arc<MetadataState> {
        todo!()
    }

    pub fn client_table(&self) -> &ClientTable {
        todo!()
    }

    /// XXH3-64 of the state machine and the client table at `commit_min` (the simulator compares
    /// replicas with it).
    pub fn state_digest(&self) -> u64 {
        todo!()
    }

    /// The checksum of the prepare this replica committed at `op`, if it still holds it in
    /// memory (the simulator's "same prepare at the same op" check).
    pub fn committed_checksum(&self, op: u64) -> Option<u128> {
        let _ = op;
        todo!()
    }
}
