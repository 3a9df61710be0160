//! The sans-IO consensus core: Viewstamped Replication (VSR Revisited, Liskov & Cowling 2012)
//! over the metadata state machine and the client table. It takes one input at a time (a peer's
//! message, a client request, a tick, an I/O completion) and returns the actions its driver must
//! perform, in order. It never awaits, reads a clock, touches a file or a socket: shard 0's
//! driver runs it in `serve`, and `shardline sim` runs the very same code against a simulated
//! network, disk and clock (issue 8 section 1).
//!
//! Layout: this file holds the state, the inputs, the normal case (section 4.1) and the apply
//! path; `replica/view_change.rs` the view change (section 4.2); `replica/repair.rs` the
//! repair of missing or forked prepares (issue 8 section 2, section 4.3 style catch-up);
//! `replica/transfer.rs` state transfer's receiving side (issue 9 section 4), for a replica
//! whose gap lies below every peer's retained journal.
//!
//! Invariants (checked by the tests and the simulator):
//! - The in-memory log holds every prepare in `(lowest held, op]`, contiguous and chained: each
//!   prepare's body names the checksum of the prepare below it. The journal mirrors it (writes
//!   are appended in op order; a fork is cut with `TruncateJournal` before the rewrite).
//! - `commit_min <= verified_op <= op` and `commit_min <= commit_max`: a replica applies only ops
//!   that are both known committed (`commit_max`) and on the current primary's chain
//!   (`verified_op`), in op order, each exactly once.
//! - A committed op is never truncated; a replica acts on a view (sends `StartViewChange`,
//!   `DoViewChange`, `PrepareOk` in it, or prepares in it) only after the superblock holds it.
//! - A backup never applies a client's change before it is committed, and never answers a
//!   client other than `NotPrimary`.
//! - While a transferred checkpoint installs (receiver stage `Installing`), nothing is applied,
//!   checkpointed or journaled, and the view does not move; after it, `commit_min = op =
//!   checkpoint_op` and the log restarts empty above it (issue 9 section 4).

mod repair;
#[cfg(test)]
mod tests;
mod transfer;
mod view_change;

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;

use storage::journal::{JournalHeader, Prepare};

use super::apply::{self, Applied};
use super::client_table::{ClientTable, Lookup};
use super::message::{
    Action, ClientReply, ClientRequest, ClientToken, Completion, Message, ReplicaIndex, Status,
};
use super::prepare::{PrepareBody, PrepareOperation};
use super::transfer::manifest::ManifestCaps;
use super::transfer::receiver::Receiver;
use super::transfer::{Availability, UnavailableReason};
use crate::metadata::MetadataState;

/// Client requests a primary queues while its pipeline is full; beyond it a request gets
/// `Busy`.
pub const REQUEST_QUEUE_MAX: usize = 1024;

/// The largest view a replica enters: one below `u32::MAX`, so moving to the next view never
/// wraps around to a lower one (a view never decreases: VSR Revisited section 4.2, issue 8
/// section 2). A message naming a higher view is ignored. Four billion view changes are out of
/// reach of any real cluster; a forged or broken peer is not.
pub const VIEW_MAX: u32 = u32::MAX - 1;

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
    /// Committed ops between two checkpoints (`--checkpoint-interval`), at least 1.
    pub checkpoint_interval: u64,
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

/// One prepare the replica holds, with its identity.
#[derive(Debug, Clone)]
struct Entry {
    prepare: Prepare,
    /// `JournalHeader::for_prepare(&prepare).checksum`.
    checksum: u128,
    /// The checksum of the prepare below, as the body names it (0: unknown/legacy, or op 1).
    parent: u128,
    /// The journal reported the write durable (`Completion::JournalWritten`).
    durable: bool,
}

impl Entry {
    /// Checks and identifies `prepare`; `None` (with the reason) when its body is too large for
    /// a journal record or does not decode as a prepare body.
    fn new(prepare: Prepare) -> Result<Entry, String> {
        if prepare.body.len() > storage::limits::JOURNAL_BODY_SIZE_MAX as usize {
            return Err(format!(
                "prepare at op {} has a {}-byte body, above the journal's limit",
                prepare.op,
                prepare.body.len()
            ));
        }
        if prepare.op == 0 {
            return Err("prepare at op 0".to_owned());
        }
        let body = PrepareBody::decode(&prepare.body)
            .map_err(|reason| format!("prepare at op {}: body: {reason}", prepare.op))?;
        let parent = body
            .parent_checksum()
            .map_err(|reason| format!("prepare at op {}: {reason}", prepare.op))?;
        let checksum = JournalHeader::for_prepare(&prepare).checksum;
        Ok(Entry {
            prepare,
            checksum,
            parent,
            durable: false,
        })
    }
}

/// A `DoViewChange` as the new primary keeps it (section 4.2 step 3).
#[derive(Debug, Clone)]
struct DoViewChange {
    log_view: u32,
    op: u64,
    commit: u64,
    prepares: Vec<Prepare>,
}

/// The log the new primary of a view chose and is installing (section 4.2 step 3).
#[derive(Debug, Clone, Copy)]
struct Install {
    /// The chosen log's highest op.
    op: u64,
    /// The checksum of the chosen log's prepare at `op`, when the chosen DVC carried it.
    checksum: Option<u128>,
    /// Who sent the chosen log (asked first for repairs).
    source: ReplicaIndex,
}

/// A repair request in flight.
#[derive(Debug, Clone, Copy)]
struct Requested {
    checksum: u128,
    attempts: u32,
    last_tick: u64,
}

/// One replica's consensus state. `!Send` is not required, but only one driver owns it.
#[derive(Debug)]
pub struct Replica {
    config: CoreConfig,
    quorum: usize,
    status: Status,
    view: u32,
    log_view: u32,
    /// The highest op in the log.
    op: u64,
    /// The highest op applied.
    commit_min: u64,
    /// The highest op known committed.
    commit_max: u64,
    /// The highest op whose prepare (and so, by the parent chain, every one below it) is known
    /// to be on the current primary's log; a backup applies up to `min(commit_max, verified)`.
    verified_op: u64,
    checkpoint_op: u64,
    checkpoint_in_progress: Option<u64>,
    journal_first_op: u64,
    metadata: Arc<MetadataState>,
    client_table: ClientTable,
    /// Prepares from the checkpoint before the latest one up to `op` (after a restart: from
    /// `checkpoint_op + 1`), contiguous and chained.
    log: BTreeMap<u64, Entry>,
    /// The checksum of the prepare at `op` when the log does not hold it (a restart from a
    /// checkpoint at `op`), learned from a peer's committed header: the parent of the next
    /// prepare this replica makes as primary.
    top_checksum: Option<u128>,
    /// The last tick a header for `op` was asked for (`top_checksum` unknown).
    top_asked: Option<u64>,
    /// `(op, asks)`: how many times the header of the top op `op` was asked for.
    top_asks: (u64, u32),

    // Primary (section 4.1).
    /// Who holds each uncommitted op durably (`PrepareOk`, own after `JournalWritten`).
    oks: BTreeMap<u64, BTreeSet<ReplicaIndex>>,
    /// `(client, request)` of every prepared op above `commit_min` -> its op (a retry attaches
    /// its token instead of preparing again).
    in_flight: BTreeMap<(u128, u64), u64>,
    /// Requests waiting for room in the pipeline.
    queue: VecDeque<ClientRequest>,
    /// Tokens waiting for the commit of `(client, request)`.
    waiting: BTreeMap<(u128, u64), Vec<ClientToken>>,
    /// Requests whose answer ("no session") waits for a confirmed lease.
    deferred: Vec<ClientRequest>,
    /// The tick each backup last acknowledged this primary in its view (lease).
    acked_at: BTreeMap<ReplicaIndex, u64>,

    // Timers, in ticks.
    now: u64,
    primary_deadline: u64,
    view_change_deadline: u64,
    heartbeat_due: u64,
    /// Last tick a StartView was sent to a replica found in an older view.
    start_view_sent: BTreeMap<ReplicaIndex, u64>,
    /// Last tick this replica asked a newer view's primary for a StartView.
    start_view_asked: u64,

    // View change (section 4.2).
    svc_sent: bool,
    svc_from: BTreeSet<ReplicaIndex>,
    dvc_sent: bool,
    dvcs: BTreeMap<ReplicaIndex, DoViewChange>,
    install: Option<Install>,
    /// The commit number of the StartView this backup adopted (it PrepareOks above it).
    start_view_commit: u64,
    /// The op of that StartView: `log_view` becomes the view only once the log is verified up
    /// to it (until then the log is not the view's log, and a DoViewChange must not say so).
    start_view_op: u64,

    // Persistence: (view, log_view) asked for and known durable.
    superblock_requested: (u32, u32),
    superblock_durable: (u32, u32),
    /// The highest `commit_max` this core wrote or recovered: the superblock's never decreases.
    superblock_commit: u64,

    // Repair.
    /// Checksums known to be on the current primary's (or the chosen) log, by op.
    targets: BTreeMap<u64, u128>,
    /// Verified prepares not yet connected to the log.
    pending: BTreeMap<u64, Entry>,
    requested: BTreeMap<u64, Requested>,
    /// Peers waiting for a journal read: op -> (peer, checksum).
    reads: BTreeMap<u64, Vec<(ReplicaIndex, u128)>>,
    state_transfer_warned: bool,
    fork_warned: bool,

    // Journal.
    journal_retry_from: Option<u64>,
    stopped: bool,
    /// A message above [`VIEW_MAX`] was ignored and logged (logged once).
    view_max_warned: bool,
    /// `(log_view, op)`: recovery found damaged journal records up to `op` above the valid
    /// prefix, in `log_view`. They may be prepares this replica acknowledged; until its log
    /// reaches `op` in that log_view, or it installs a newer view, it sends no DoViewChange.
    lost_acked: Option<(u32, u64)>,
    rng: u64,

    // State transfer (issue 9 section 4, `replica/transfer.rs`).
    /// The receiving side's stages and retry budget, for the replica's lifetime.
    receiver: Receiver,
    /// The checked checkpoint being installed (stage `Installing`).
    transfer_install: Option<transfer::PendingInstall>,
}

impl Replica {
    /// Starts the core from what recovery found. Returns the first actions (e.g. a superblock
    /// write that moves a restarted primary into a view change, or the Apply of journaled ops a
    /// single replica may commit at once).
    ///
    /// - `replica_count == 1`: every journaled prepare was committed by its fsync: all are
    ///   applied now; the replica is the primary, status normal.
    /// - otherwise: prepares up to `recovered.commit_max` were committed and applied before the
    ///   crash and are applied again; the rest stay an uncommitted log. A replica that was the
    ///   primary of `recovered.view` moves to `view + 1` (it may have lost prepares it sent but
    ///   had not made durable: reusing their op numbers in the same view would fork the log); one
    ///   whose `log_view < view` resumes the view change; any other is a backup in its view.
    /// - a journal whose highest record is above the last valid prepare is truncated there
    ///   (`TruncateJournal`); the missing ops are repaired from peers.
    ///
    /// # Panics
    /// If the config is inconsistent: `replica_count` 0, `replica >= replica_count`, or a zero
    /// `pipeline_max`, `heartbeat_ticks`, `view_change_timeout_ticks`, `checkpoint_interval`.
    pub fn open(config: CoreConfig, recovered: Recovered) -> (Replica, Vec<Action>) {
        assert!(
            config.replica_count >= 1,
            "replica_count must be at least 1"
        );
        assert!(
            config.replica < config.replica_count,
            "replica index {} is not below replica_count {}",
            config.replica,
            config.replica_count
        );
        assert!(config.pipeline_max >= 1, "pipeline_max must be at least 1");
        assert!(
            config.heartbeat_ticks >= 1,
            "heartbeat_ticks must be at least 1"
        );
        assert!(
            config.view_change_timeout_ticks >= 1,
            "view_change_timeout_ticks must be at least 1"
        );
        assert!(
            config.checkpoint_interval >= 1,
            "checkpoint_interval must be at least 1"
        );
        let mut actions = Vec::new();
        let mut log = BTreeMap::new();
        let mut last_valid = recovered.checkpoint_op;
        let mut last_checksum = None;
        for prepare in recovered.prepares {
            if prepare.op != last_valid + 1 {
                tracing::warn!(
                    op = prepare.op,
                    expected = last_valid + 1,
                    "recovered journal is not contiguous; keeping the prefix and repairing"
                );
                break;
            }
            let entry = match Entry::new(prepare) {
                Ok(entry) => entry,
                Err(reason) => {
                    tracing::warn!(%reason, "recovered prepare unusable; truncating and repairing");
                    break;
                }
            };
            if let Some(below) = last_checksum
                && entry.parent != 0
                && entry.parent != below
            {
                tracing::warn!(
                    op = entry.prepare.op,
                    "recovered prepare does not chain to the one below; truncating and repairing"
                );
                break;
            }
            last_checksum = Some(entry.checksum);
            last_valid = entry.prepare.op;
            log.insert(
                last_valid,
                Entry {
                    durable: true,
                    ..entry
                },
            );
        }
        let mut lost_acked = None;
        if recovered.journal_last_op > last_valid {
            actions.push(Action::TruncateJournal { op: last_valid });
            lost_acked = Some((recovered.log_view, recovered.journal_last_op));
        }
        let single = config.replica_count == 1;
        let apply_to = if single {
            last_valid
        } else {
            recovered
                .commit_max
                .clamp(recovered.checkpoint_op, last_valid)
        };
        let rng = config.seed ^ 0x9e37_79b9_7f4a_7c15;
        let quorum = usize::from(config.replica_count) / 2 + 1;
        let mut replica = Replica {
            quorum,
            status: Status::Normal,
            view: recovered.view,
            log_view: recovered.log_view,
            op: last_valid,
            commit_min: recovered.checkpoint_op,
            commit_max: recovered.commit_max.max(apply_to),
            verified_op: apply_to,
            checkpoint_op: recovered.checkpoint_op,
            checkpoint_in_progress: None,
            journal_first_op: recovered.journal_first_op,
            metadata: Arc::new(recovered.metadata),
            client_table: recovered.client_table,
            log,
            top_checksum: None,
            top_asked: None,
            top_asks: (0, 0),
            oks: BTreeMap::new(),
            in_flight: BTreeMap::new(),
            queue: VecDeque::new(),
            waiting: BTreeMap::new(),
            deferred: Vec::new(),
            acked_at: BTreeMap::new(),
            now: 0,
            primary_deadline: 0,
            view_change_deadline: 0,
            heartbeat_due: 0,
            start_view_sent: BTreeMap::new(),
            start_view_asked: 0,
            svc_sent: false,
            svc_from: BTreeSet::new(),
            dvc_sent: false,
            dvcs: BTreeMap::new(),
            install: None,
            start_view_commit: 0,
            start_view_op: 0,
            superblock_requested: (recovered.view, recovered.log_view),
            superblock_durable: (recovered.view, recovered.log_view),
            superblock_commit: recovered.commit_max,
            targets: BTreeMap::new(),
            pending: BTreeMap::new(),
            requested: BTreeMap::new(),
            reads: BTreeMap::new(),
            state_transfer_warned: false,
            fork_warned: false,
            journal_retry_from: None,
            stopped: false,
            view_max_warned: false,
            lost_acked,
            rng,
            receiver: Receiver::new(ManifestCaps::for_receiver(config.clients_table_max)),
            transfer_install: None,
            config,
        };
        if single {
            replica.commit_max = replica.op;
            replica.verified_op = replica.op;
            replica.apply_committed(&mut actions);
            replica.log_view = replica.view;
            return (replica, actions);
        }
        replica.apply_committed(&mut actions);
        tracing::info!(
            replica = replica.config.replica,
            view = replica.view,
            log_view = replica.log_view,
            op = replica.op,
            commit_min = replica.commit_min,
            "consensus core opened"
        );
        if replica.primary_of(replica.view) == replica.config.replica {
            replica.start_next_view(&mut actions);
        } else if replica.log_view < replica.view {
            let view = replica.view;
            replica.enter_view_change(view, &mut actions);
        } else {
            // A restarted backup rejoins its view: the links to its peers take a moment to come
            // back, so the first primary timeout is doubled before it suspects the primary.
            replica.reset_primary_deadline();
            replica.primary_deadline += replica.config.view_change_timeout_ticks;
        }
        (replica, actions)
    }

    /// A message from peer `from` (already checked for cluster id and checksum by the wire
    /// codec). Messages from an index `>= replica_count` or from this replica are ignored, and
    /// so are messages of an older view, except that a primary answers them with a
    /// `StartView` (VSR Revisited section 4.3 style catch-up) and repair requests are served in
    /// any view.
    pub fn on_message(&mut self, from: ReplicaIndex, message: Message) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.stopped || from >= self.config.replica_count || from == self.config.replica {
            return actions;
        }
        if self.installing() {
            self.on_message_while_installing(from, &message, &mut actions);
            return actions;
        }
        if message.view() > VIEW_MAX {
            // No replica ever enters such a view (`start_next_view`): the sender is not one of
            // ours, or it is broken. Taking it would leave no next view to move to.
            if !self.view_max_warned {
                self.view_max_warned = true;
                tracing::warn!(
                    replica = self.config.replica,
                    from,
                    view = message.view(),
                    "ignoring a message whose view is above the largest view a replica enters \
                     (u32::MAX - 1); logged once"
                );
            }
            return actions;
        }
        // A Prepare's view is the prepare's own (kept when a later primary re-sends it), not
        // the sender's.
        if message.view() < self.view && !matches!(message, Message::Prepare { .. }) {
            self.answer_older_view(from, &mut actions);
        }
        match message {
            Message::Prepare { prepare } => self.on_prepare(from, prepare, &mut actions),
            Message::PrepareOk { view, op, checksum } => {
                self.on_prepare_ok(from, view, op, checksum, &mut actions);
            }
            Message::Commit {
                view,
                commit,
                commit_checksum,
            } => self.on_commit(from, view, commit, commit_checksum, &mut actions),
            Message::StartViewChange { view } => {
                self.on_start_view_change(from, view, &mut actions);
            }
            Message::DoViewChange {
                view,
                log_view,
                op,
                commit,
                prepares,
            } => self.on_do_view_change(
                from,
                view,
                DoViewChange {
                    log_view,
                    op,
                    commit,
                    prepares,
                },
                &mut actions,
            ),
            Message::StartView {
                view,
                op,
                commit,
                prepares,
            } => self.on_start_view(from, view, op, commit, prepares, &mut actions),
            Message::RequestPrepare { op, checksum, .. } => {
                self.on_request_prepare(from, op, checksum, &mut actions);
            }
            Message::RequestHeaders { op_min, op_max, .. } => {
                self.on_request_headers(from, op_min, op_max, &mut actions);
            }
            Message::Headers { headers, .. } => self.on_headers(&headers, &mut actions),
            // Served by `super::transfer::server` (the driver routes them there).
            Message::RequestStateTransfer { .. } | Message::RequestStateChunk { .. } => {}
            Message::StateTransferTarget { nonce, target, .. } => {
                self.on_transfer_target(from, nonce, target, &mut actions);
            }
            Message::StateChunk {
                nonce,
                artifact,
                offset,
                payload,
                ..
            } => self.on_transfer_chunk(from, nonce, artifact, offset, &payload, &mut actions),
        }
        self.request_repairs(&mut actions);
        actions
    }

    /// A client request (Register or a metadata change). A backup answers `NotPrimary`; a
    /// primary answers a duplicate from the client table, attaches a retry of a request in the
    /// pipeline to it, prepares a new one (VSR Revisited section 4.1 steps 1-3), or queues it
    /// while the pipeline is full (`Busy` beyond [`REQUEST_QUEUE_MAX`]).
    pub fn on_request(&mut self, request: ClientRequest) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.stopped {
            reply(
                &mut actions,
                request.token,
                ClientReply::Error {
                    code: bus::ErrorCode::StorageFailure,
                    message: "the metadata journal failed; this replica stopped".to_owned(),
                },
            );
        } else if !self.is_primary() {
            let primary = (self.status == Status::Normal).then(|| self.primary());
            reply(
                &mut actions,
                request.token,
                ClientReply::NotPrimary {
                    view: self.view,
                    primary,
                },
            );
        } else {
            self.accept_request(request, &mut actions);
        }
        actions
    }

    /// One tick of the driver's clock: heartbeats and prepare resends (primary), the primary
    /// timeout (backup), the view-change timeout, repair retries, journal write retries.
    pub fn on_tick(&mut self) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.stopped {
            return actions;
        }
        self.now += 1;
        if self.installing() {
            // Nothing moves while the driver installs a transferred checkpoint: no view-change
            // timer (the view is kept until the install completes), no journal retry.
            return actions;
        }
        if let Some(from) = self.journal_retry_from.take() {
            self.retry_journal(from, &mut actions);
        }
        if self.config.replica_count > 1 {
            match self.status {
                Status::Normal if self.is_primary() => {
                    if self.now >= self.heartbeat_due {
                        self.heartbeat_due = self.now + self.config.heartbeat_ticks;
                        self.send_commit_heartbeat(&mut actions);
                        self.resend_prepares(&mut actions);
                    }
                }
                Status::Normal => {
                    if self.now >= self.primary_deadline {
                        tracing::info!(
                            replica = self.config.replica,
                            view = self.view,
                            "no message from the primary within the timeout; starting a view change"
                        );
                        self.start_next_view(&mut actions);
                    }
                }
                Status::ViewChange => {
                    if self.now >= self.view_change_deadline {
                        tracing::info!(
                            replica = self.config.replica,
                            view = self.view,
                            "view change did not complete within the timeout; trying the next view"
                        );
                        self.start_next_view(&mut actions);
                    } else if self.now.is_multiple_of(self.config.heartbeat_ticks) {
                        self.resend_view_change(&mut actions);
                    }
                }
            }
            self.retry_repairs(&mut actions);
            self.tick_transfer(&mut actions);
        }
        actions
    }

    /// The outcome of an I/O action this core asked for.
    pub fn on_io_done(&mut self, completion: Completion) -> Vec<Action> {
        let mut actions = Vec::new();
        if self.stopped {
            return actions;
        }
        if self.installing() {
            self.on_io_done_while_installing(completion, &mut actions);
            self.request_repairs(&mut actions);
            return actions;
        }
        match completion {
            Completion::JournalWritten { op, checksum } => {
                self.on_journal_written(op, checksum, &mut actions);
            }
            Completion::JournalTruncated { .. } => {}
            Completion::CheckpointInstalled { checkpoint_op, .. }
            | Completion::InstallFailed { checkpoint_op, .. } => {
                tracing::error!(
                    replica = self.config.replica,
                    checkpoint_op,
                    "install completion without an install in progress; ignored"
                );
            }
            Completion::JournalRead { op, prepare } => {
                self.on_journal_read(op, prepare, &mut actions);
            }
            Completion::JournalFailed {
                op,
                retryable,
                reason,
            } => {
                self.on_journal_failed(op, retryable, &reason, &mut actions);
            }
            Completion::SuperblockWritten { view, log_view } => {
                self.superblock_durable = self.superblock_durable.max((view, log_view));
                self.after_persist(&mut actions);
            }
            Completion::CheckpointDone {
                op,
                journal_first_op,
            } => self.on_checkpoint_done(op, journal_first_op, &mut actions),
            Completion::CheckpointFailed { op } => self.on_checkpoint_failed(op),
        }
        self.request_repairs(&mut actions);
        actions
    }

    fn on_checkpoint_done(&mut self, op: u64, journal_first_op: u64, actions: &mut Vec<Action>) {
        self.checkpoint_in_progress = None;
        // The driver's checkpoint recorded at least this op as committed.
        self.superblock_commit = self.superblock_commit.max(op);
        // Memory keeps the prepares from the previous checkpoint on (one to two
        // intervals): a lagging peer repairs from them, headers included, without
        // journal reads; and the prepare at the checkpoint anchors the next op's chain.
        let floor = self.checkpoint_op.min(op);
        self.checkpoint_op = self.checkpoint_op.max(op);
        self.journal_first_op = journal_first_op;
        self.log = self.log.split_off(&floor);
        self.maybe_checkpoint(actions);
    }

    fn on_checkpoint_failed(&mut self, op: u64) {
        tracing::warn!(
            op,
            "checkpoint failed; the previous one stays valid, retried at the next commit"
        );
        self.checkpoint_in_progress = None;
    }

    pub fn config(&self) -> &CoreConfig {
        &self.config
    }

    pub fn view(&self) -> u32 {
        self.view
    }

    pub fn log_view(&self) -> u32 {
        self.log_view
    }

    pub fn status(&self) -> Status {
        self.status
    }

    /// The primary of the current view: `view % replica_count`.
    pub fn primary(&self) -> ReplicaIndex {
        self.primary_of(self.view)
    }

    /// Whether this replica is the primary of its view with status normal.
    pub fn is_primary(&self) -> bool {
        self.status == Status::Normal && self.primary() == self.config.replica
    }

    /// The highest op applied to the state machine.
    pub fn commit_min(&self) -> u64 {
        self.commit_min
    }

    /// The highest op known committed.
    pub fn commit_max(&self) -> u64 {
        self.commit_max
    }

    /// The highest op in the log (prepared, maybe not committed).
    pub fn op(&self) -> u64 {
        self.op
    }

    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op
    }

    /// Whether this replica serves a state transfer now, and of which checkpoint (DESIGN
    /// section 10, issue 9 section 3): only the primary of its view, in normal status, caught
    /// up (it applied every op it knows committed), with a durable checkpoint (`checkpoint_op`
    /// moves only on `CheckpointDone`, after the snapshot and its pairing are on disk).
    /// Otherwise the reason, checked in that order.
    pub fn transfer_availability(&self) -> Availability {
        if self.primary() != self.config.replica {
            Availability::Unavailable(UnavailableReason::NotPrimary)
        } else if self.status != Status::Normal {
            Availability::Unavailable(UnavailableReason::ViewChange)
        } else if self.commit_min < self.commit_max {
            Availability::Unavailable(UnavailableReason::NotCaughtUp)
        } else if self.checkpoint_op == 0 {
            Availability::Unavailable(UnavailableReason::NoCheckpointYet)
        } else {
            Availability::Available {
                checkpoint_op: self.checkpoint_op,
            }
        }
    }

    /// Whether a non-retryable journal failure stopped this core (the driver exits).
    pub fn is_stopped(&self) -> bool {
        self.stopped
    }

    /// The state machine at `commit_min`.
    pub fn metadata(&self) -> &Arc<MetadataState> {
        &self.metadata
    }

    pub fn client_table(&self) -> &ClientTable {
        &self.client_table
    }

    /// XXH3-64 of the state machine and the client table at `commit_min` (the simulator compares
    /// replicas with it): the snapshot payload encoding at `commit_min`.
    pub fn state_digest(&self) -> u64 {
        let bytes = super::snapshot::encode_payload(
            self.commit_min,
            &self.metadata,
            &self.client_table.to_snapshot(),
        );
        twox_hash::XxHash3_64::oneshot(&bytes)
    }

    /// The checksum of the prepare this replica committed at `op`, if it still holds it in
    /// memory (the simulator's "same prepare at the same op" check).
    pub fn committed_checksum(&self, op: u64) -> Option<u128> {
        if op > self.commit_min {
            return None;
        }
        self.log.get(&op).map(|entry| entry.checksum)
    }

    fn primary_of(&self, view: u32) -> ReplicaIndex {
        (view % u32::from(self.config.replica_count)) as ReplicaIndex
    }

    /// The other replicas, ascending.
    fn peers(&self) -> impl Iterator<Item = ReplicaIndex> + use<> {
        let me = self.config.replica;
        (0..self.config.replica_count).filter(move |&index| index != me)
    }

    fn broadcast(&self, message: &Message, actions: &mut Vec<Action>) {
        for to in self.peers() {
            actions.push(Action::Send {
                to,
                message: message.clone(),
            });
        }
    }

    /// The next value of the core's xorshift64* PRNG (view-change backoff only).
    fn next_random(&mut self) -> u64 {
        let mut x = self.rng;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.rng = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// A timeout in `timeout..2*timeout` ticks (issue 8 section 3: randomized, so two backups do
    /// not collide forever).
    fn random_timeout(&mut self) -> u64 {
        let timeout = self.config.view_change_timeout_ticks;
        timeout + self.next_random() % timeout
    }

    fn reset_primary_deadline(&mut self) {
        self.primary_deadline = self.now + self.random_timeout();
    }

    /// Asks the driver to persist the current view and log_view, unless that write is already
    /// asked for. The superblock's `commit_max` is `commit_min` (what was applied: every journaled
    /// prepare up to it is the committed one, so a restart may apply them again), or the value
    /// written before when that is higher (it never decreases; a restart applies only the
    /// journaled prepares up to it and repairs the rest).
    fn persist(&mut self, actions: &mut Vec<Action>) {
        let state = (self.view, self.log_view);
        if self.superblock_requested == state {
            return;
        }
        self.superblock_requested = state;
        self.superblock_commit = self.superblock_commit.max(self.commit_min);
        actions.push(Action::WriteSuperblock {
            view: self.view,
            log_view: self.log_view,
            commit_max: self.superblock_commit,
        });
    }

    /// Whether this backup may send PrepareOks: its log is the current view's (`log_view ==
    /// view`) and the superblock durably says so (section 4.2 step 5: a replica acts in a view
    /// only once the view is persisted).
    fn can_acknowledge(&self) -> bool {
        self.log_view == self.view && self.superblock_durable >= (self.view, self.view)
    }

    // ---- Normal case, primary (section 4.1) ----

    fn accept_request(&mut self, request: ClientRequest, actions: &mut Vec<Action>) {
        let client = request.client;
        if client == 0 {
            reply(
                actions,
                request.token,
                ClientReply::Error {
                    code: bus::ErrorCode::InvalidArgument,
                    message: "client id 0 is reserved".to_owned(),
                },
            );
            return;
        }
        let key = match &request.operation {
            PrepareOperation::Register => {
                if let Some(session) = self.client_table.session(client) {
                    let session = session.session;
                    tracing::debug!(
                        client = format_args!("{client:#034x}"),
                        session,
                        "client already registered"
                    );
                    reply(actions, request.token, ClientReply::Registered { session });
                    return;
                }
                (client, 0)
            }
            PrepareOperation::Metadata(change) => {
                match self.client_table.lookup(client, request.request) {
                    Lookup::New => {}
                    Lookup::Cached(cached) => {
                        let answer = if cached.request_checksum == apply::change_checksum(change) {
                            ClientReply::Committed(cached)
                        } else {
                            ClientReply::Error {
                                code: bus::ErrorCode::InvalidArgument,
                                message: apply::reused_request_message(
                                    client,
                                    request.request,
                                    change,
                                ),
                            }
                        };
                        reply(actions, request.token, answer);
                        return;
                    }
                    Lookup::Stale {
                        oldest_cached_request,
                    } => {
                        reply(
                            actions,
                            request.token,
                            ClientReply::Error {
                                code: bus::ErrorCode::RequestStale,
                                message: apply::stale_request_message(
                                    client,
                                    request.request,
                                    oldest_cached_request,
                                ),
                            },
                        );
                        return;
                    }
                    // The client's Register is prepared but not yet applied (a new primary
                    // inherits uncommitted prepares): prepare this one after it.
                    Lookup::NoSession if self.register_in_flight(client) => {}
                    // A primary cut off from its backups may be deposed already, and the
                    // client registered in the newer view: "no session" is only answered by a
                    // primary a quorum confirmed recently; until then the request waits.
                    Lookup::NoSession if !self.lease_confirmed() => {
                        if self.deferred.len() < REQUEST_QUEUE_MAX {
                            self.deferred.push(request);
                        } else {
                            reply(actions, request.token, busy(self.config.pipeline_max));
                        }
                        return;
                    }
                    Lookup::NoSession => {
                        reply(
                            actions,
                            request.token,
                            ClientReply::Evicted {
                                reason: apply::no_session_reason(
                                    client,
                                    self.config.clients_table_max,
                                ),
                            },
                        );
                        return;
                    }
                }
                (client, request.request)
            }
        };
        // A retry of a request already prepared or queued: answer it at commit.
        let prepared = self
            .in_flight
            .get(&key)
            .and_then(|op| self.log.get(op))
            .and_then(|entry| PrepareBody::decode(&entry.prepare.body).ok())
            .map(|body| body.operation);
        let queued = self
            .queue
            .iter()
            .find(|queued| request_key(queued) == key)
            .map(|queued| queued.operation.clone());
        if let Some(operation) = prepared.or(queued) {
            if operation == request.operation {
                self.waiting.entry(key).or_default().push(request.token);
            } else {
                reply(
                    actions,
                    request.token,
                    ClientReply::Error {
                        code: bus::ErrorCode::InvalidArgument,
                        message: format!(
                            "request {} of client {client:#034x} is being committed with other \
                             arguments; request numbers must not be reused",
                            request.request
                        ),
                    },
                );
            }
            return;
        }
        if self.queue.is_empty() && self.pipeline_has_room() {
            let token = request.token;
            if let Err(message) = self.prepare(request, actions) {
                reply(
                    actions,
                    token,
                    ClientReply::Error {
                        code: bus::ErrorCode::InvalidArgument,
                        message,
                    },
                );
                return;
            }
            self.waiting.entry(key).or_default().push(token);
        } else if self.queue.len() < REQUEST_QUEUE_MAX {
            self.waiting.entry(key).or_default().push(request.token);
            self.queue.push_back(request);
        } else {
            reply(actions, request.token, busy(self.config.pipeline_max));
        }
    }

    /// Whether a Register of `client` is prepared or queued and not yet applied.
    fn register_in_flight(&self, client: u128) -> bool {
        self.in_flight.contains_key(&(client, 0))
            || self.queue.iter().any(|queued| {
                queued.client == client && queued.operation == PrepareOperation::Register
            })
    }

    /// Whether a quorum (this primary included) acknowledged it in its view within the last
    /// `view_change_timeout_ticks / 2` ticks: no backup of that quorum starts a view change
    /// within `view_change_timeout_ticks` of hearing its primary, so a newer view is unlikely
    /// to exist (a lease; a backup that adopts a newer view from another's StartViewChange
    /// shortens it, so this narrows the window of a stale answer rather than closing it).
    fn lease_confirmed(&self) -> bool {
        if self.config.replica_count == 1 {
            return true;
        }
        let lease = (self.config.view_change_timeout_ticks / 2).max(1);
        let fresh = self
            .acked_at
            .values()
            .filter(|&&at| at + lease > self.now)
            .count();
        fresh + 1 >= self.quorum
    }

    /// Answers the requests that waited for a confirmed lease.
    fn retry_deferred(&mut self, actions: &mut Vec<Action>) {
        if self.deferred.is_empty() || !self.is_primary() || !self.lease_confirmed() {
            return;
        }
        for request in std::mem::take(&mut self.deferred) {
            self.accept_request(request, actions);
        }
    }

    fn pipeline_has_room(&self) -> bool {
        self.op - self.commit_max.min(self.op) < self.config.pipeline_max as u64
    }

    /// Prepares `request` at `op + 1` (section 4.1 step 3): journals it and sends it to every
    /// backup. The caller handles the token.
    fn prepare(&mut self, request: ClientRequest, actions: &mut Vec<Action>) -> Result<(), String> {
        let op = self.op + 1;
        let parent = self
            .log
            .get(&self.op)
            .map(|entry| entry.checksum)
            .or(self.top_checksum)
            .unwrap_or(0);
        let key = request_key(&request);
        let body = PrepareBody::new(
            request.client,
            key.1,
            request.operation,
            request.timestamp_us,
            parent,
        );
        let prepare = Prepare {
            op,
            view: self.view,
            commit: self.commit_max,
            body: body.encode(),
        };
        let entry = Entry::new(prepare)?;
        let message = Message::Prepare {
            prepare: entry.prepare.clone(),
        };
        actions.push(Action::WriteJournal {
            prepare: entry.prepare.clone(),
        });
        self.log.insert(op, entry);
        self.op = op;
        self.verified_op = op;
        self.in_flight.insert(key, op);
        self.oks.insert(op, BTreeSet::new());
        self.broadcast(&message, actions);
        Ok(())
    }

    /// Prepares queued requests while the pipeline has room.
    fn drain_queue(&mut self, actions: &mut Vec<Action>) {
        while self.is_primary() && self.pipeline_has_room() {
            let Some(request) = self.queue.pop_front() else {
                return;
            };
            let key = request_key(&request);
            if let Err(message) = self.prepare(request, actions) {
                for token in self.waiting.remove(&key).unwrap_or_default() {
                    reply(
                        actions,
                        token,
                        ClientReply::Error {
                            code: bus::ErrorCode::InvalidArgument,
                            message: message.clone(),
                        },
                    );
                }
            }
        }
    }

    fn on_prepare_ok(
        &mut self,
        from: ReplicaIndex,
        view: u32,
        op: u64,
        checksum: u128,
        actions: &mut Vec<Action>,
    ) {
        if view != self.view || !self.is_primary() {
            return;
        }
        self.acked_at.insert(from, self.now);
        self.retry_deferred(actions);
        if op <= self.commit_max {
            return;
        }
        if self
            .log
            .get(&op)
            .is_none_or(|entry| entry.checksum != checksum)
        {
            return;
        }
        self.oks.entry(op).or_default().insert(from);
        self.advance_commit(actions);
    }

    /// Primary: commits ops in order while each has a quorum (section 4.1 step 5), applies
    /// them, and prepares queued requests into the room made.
    fn advance_commit(&mut self, actions: &mut Vec<Action>) {
        while self.commit_max < self.op
            && self
                .oks
                .get(&(self.commit_max + 1))
                .is_some_and(|oks| oks.len() >= self.quorum)
        {
            self.commit_max += 1;
            self.oks.remove(&self.commit_max);
        }
        self.apply_committed(actions);
        self.drain_queue(actions);
    }

    fn send_commit_heartbeat(&self, actions: &mut Vec<Action>) {
        let commit_checksum = self.log.get(&self.commit_max).map_or(0, |e| e.checksum);
        self.broadcast(
            &Message::Commit {
                view: self.view,
                commit: self.commit_max,
                commit_checksum,
            },
            actions,
        );
    }

    /// Primary: re-sends every uncommitted prepare to the backups that have not acknowledged it
    /// (the network loses messages).
    fn resend_prepares(&self, actions: &mut Vec<Action>) {
        for (op, entry) in self.log.range(self.commit_max + 1..) {
            let oks = self.oks.get(op);
            for to in self.peers() {
                if oks.is_none_or(|oks| !oks.contains(&to)) {
                    actions.push(Action::Send {
                        to,
                        message: Message::Prepare {
                            prepare: entry.prepare.clone(),
                        },
                    });
                }
            }
        }
    }

    // ---- Normal case, backup (section 4.1 step 4) ----

    fn on_prepare(&mut self, from: ReplicaIndex, prepare: Prepare, actions: &mut Vec<Action>) {
        let entry = match Entry::new(prepare) {
            Ok(entry) => entry,
            Err(reason) => {
                tracing::warn!(from, %reason, "refusing a malformed prepare");
                return;
            }
        };
        let op = entry.prepare.op;
        let view = entry.prepare.view;
        // A repair answer: any view, any sender, as long as its checksum is one we wait for.
        if self.targets.get(&op) == Some(&entry.checksum) {
            self.accept_verified(entry, actions);
            self.after_log_change(actions);
            return;
        }
        if view > self.view {
            self.ask_for_start_view(from, actions);
            return;
        }
        if from != self.primary() || self.is_primary() {
            return;
        }
        if self.status != Status::Normal {
            if view == self.view {
                self.ask_for_start_view(from, actions);
            }
            return;
        }
        if view < self.view {
            // The prepare's own view is older: either this view's primary re-sends an inherited
            // prepare (to re-collect PrepareOks), or a stale message of an older view whose
            // primary had the same index. Either way it proves nothing about the current log:
            // acknowledge it only if the log already holds it verified (or committed).
            self.ack_held_prepare(&entry, actions);
            return;
        }
        self.reset_primary_deadline();
        self.commit_max = self.commit_max.max(entry.prepare.commit);
        if op <= self.commit_min {
            // Already committed here; the primary may still count it (a new view re-collects).
            if self.can_acknowledge()
                && self
                    .log
                    .get(&op)
                    .is_none_or(|e| e.checksum == entry.checksum)
            {
                self.send_prepare_ok(op, entry.checksum, actions);
            }
        } else if let Some(held) = self.log.get(&op)
            && held.checksum == entry.checksum
        {
            let durable = held.durable;
            self.verified_op = self.verified_op.max(op);
            self.prune_targets();
            if durable && self.can_acknowledge() {
                self.send_prepare_ok(op, entry.checksum, actions);
            }
        } else {
            self.accept_verified(entry, actions);
        }
        self.after_log_change(actions);
    }

    /// A backup acknowledges a prepare of an older view the current primary re-sent, if its
    /// log holds the same prepare durably and verified (or committed).
    fn ack_held_prepare(&self, entry: &Entry, actions: &mut Vec<Action>) {
        let op = entry.prepare.op;
        let held = self.log.get(&op);
        let acknowledged = if op <= self.commit_min {
            held.is_none_or(|held| held.checksum == entry.checksum)
        } else {
            op <= self.verified_op
                && held.is_some_and(|held| held.checksum == entry.checksum && held.durable)
        };
        if acknowledged && self.can_acknowledge() {
            self.send_prepare_ok(op, entry.checksum, actions);
        }
    }

    fn on_commit(
        &mut self,
        from: ReplicaIndex,
        view: u32,
        commit: u64,
        commit_checksum: u128,
        actions: &mut Vec<Action>,
    ) {
        if view > self.view {
            self.ask_for_start_view(from, actions);
            return;
        }
        if view != self.view || from != self.primary() || self.is_primary() {
            return;
        }
        if self.status != Status::Normal {
            self.ask_for_start_view(from, actions);
            return;
        }
        self.reset_primary_deadline();
        // Acknowledge the heartbeat (the primary's lease; below its commit number, it counts
        // toward nothing else).
        actions.push(Action::Send {
            to: from,
            message: Message::PrepareOk {
                view,
                op: commit,
                checksum: commit_checksum,
            },
        });
        self.commit_max = self.commit_max.max(commit);
        if commit > self.commit_min && commit_checksum != 0 {
            if self
                .log
                .get(&commit)
                .is_some_and(|entry| entry.checksum == commit_checksum)
            {
                self.verified_op = self.verified_op.max(commit);
                self.prune_targets();
            } else {
                self.targets.insert(commit, commit_checksum);
            }
        }
        self.after_log_change(actions);
    }

    fn send_prepare_ok(&self, op: u64, checksum: u128, actions: &mut Vec<Action>) {
        actions.push(Action::Send {
            to: self.primary(),
            message: Message::PrepareOk {
                view: self.view,
                op,
                checksum,
            },
        });
    }

    /// Backup: PrepareOks every durable, verified op above `above` (after a StartView, or once
    /// the superblock holds the view).
    fn send_prepare_oks_above(&self, above: u64, actions: &mut Vec<Action>) {
        if self.status != Status::Normal || self.is_primary() || !self.can_acknowledge() {
            return;
        }
        for (&op, entry) in self
            .log
            .range(above + 1..)
            .take_while(|(op, _)| **op <= self.verified_op)
        {
            if entry.durable {
                self.send_prepare_ok(op, entry.checksum, actions);
            }
        }
    }

    fn on_journal_written(&mut self, op: u64, checksum: u128, actions: &mut Vec<Action>) {
        let Some(entry) = self.log.get_mut(&op) else {
            return;
        };
        if entry.checksum != checksum {
            return;
        }
        entry.durable = true;
        if self.status == Status::Normal {
            if self.primary() == self.config.replica {
                if op > self.commit_max {
                    self.oks.entry(op).or_default().insert(self.config.replica);
                }
                self.advance_commit(actions);
            } else if op <= self.verified_op && self.can_acknowledge() {
                self.send_prepare_ok(op, checksum, actions);
            }
        }
        self.after_log_change(actions);
    }

    /// Whether every prepare in `(commit_min, op]` is durable in the journal (the newest are
    /// the likeliest not to be, so the scan runs downward and stops at the first).
    fn durable_through(&self, op: u64) -> bool {
        self.log
            .range(self.commit_min + 1..)
            .rev()
            .filter(|(held, _)| **held <= op)
            .all(|(_, entry)| entry.durable)
    }

    fn on_journal_failed(
        &mut self,
        op: u64,
        retryable: bool,
        reason: &str,
        actions: &mut Vec<Action>,
    ) {
        if retryable {
            if self.config.replica_count == 1 {
                self.roll_back_refused(op, reason, actions);
                return;
            }
            tracing::warn!(
                op,
                reason,
                "journal write refused (retryable); retrying on the next tick"
            );
            // The prepare may already be at backups: its op is never reused in this view, so
            // the write is retried; its clients are told now instead of waiting for space.
            self.answer_storage_full(op, reason, actions);
            let from = self.journal_retry_from.map_or(op, |from| from.min(op));
            self.journal_retry_from = Some(from.max(1));
            return;
        }
        tracing::error!(
            op,
            replica = self.config.replica,
            "journal failed and is unusable until restart; this replica stops acting"
        );
        self.stopped = true;
        for (_, tokens) in std::mem::take(&mut self.waiting) {
            for token in tokens {
                reply(
                    actions,
                    token,
                    ClientReply::Error {
                        code: bus::ErrorCode::StorageFailure,
                        message: format!(
                            "metadata not persisted: the journal failed at op {op}: {reason}"
                        ),
                    },
                );
            }
        }
        self.queue.clear();
    }

    /// A single replica whose journal refused the write at `op` for lack of space (rolled back,
    /// nothing durable): drops that prepare and every later one (their op numbers are reused
    /// once space returns) and answers their clients, and the queued ones, `StorageFull`.
    fn roll_back_refused(&mut self, op: u64, reason: &str, actions: &mut Vec<Action>) {
        let from = op.max(self.commit_min + 1);
        if from > self.op {
            return;
        }
        tracing::warn!(
            op = from,
            dropped = self.op - from + 1,
            "metadata journal full: the write was refused and rolled back; the change is not \
             applied"
        );
        self.answer_storage_full(from, reason, actions);
        self.log.split_off(&from);
        self.op = from - 1;
        self.verified_op = self.verified_op.min(self.op);
        self.commit_max = self.commit_max.min(self.op);
        self.oks.retain(|&held, _| held < from);
        self.in_flight.retain(|_, held| *held < from);
        actions.push(Action::TruncateJournal { op: from - 1 });
        for request in std::mem::take(&mut self.queue) {
            let key = request_key(&request);
            for token in self.waiting.remove(&key).unwrap_or_default() {
                reply(actions, token, storage_full(from, reason));
            }
        }
    }

    /// Answers `StorageFull` to the clients waiting on prepares at or above `op`.
    fn answer_storage_full(&mut self, op: u64, reason: &str, actions: &mut Vec<Action>) {
        let keys: Vec<(u128, u64)> = self
            .in_flight
            .iter()
            .filter(|(_, held)| **held >= op)
            .map(|(key, _)| *key)
            .collect();
        for key in keys {
            for token in self.waiting.remove(&key).unwrap_or_default() {
                reply(actions, token, storage_full(op, reason));
            }
        }
    }

    /// Rewrites every held prepare from `from` up (after a retryable failure, nothing of it is
    /// durable): truncates above `from - 1` first, so the journal's next op is `from`.
    fn retry_journal(&mut self, from: u64, actions: &mut Vec<Action>) {
        let lowest = self.log.keys().next().copied().unwrap_or(self.op + 1);
        let from = from.max(lowest).max(self.commit_min.min(self.op) + 1);
        if from > self.op {
            return;
        }
        actions.push(Action::TruncateJournal { op: from - 1 });
        for entry in self.log.range_mut(from..).map(|(_, entry)| entry) {
            entry.durable = false;
            actions.push(Action::WriteJournal {
                prepare: entry.prepare.clone(),
            });
        }
    }

    /// After the log or the commit number changed: apply what is now committed and verified.
    fn after_log_change(&mut self, actions: &mut Vec<Action>) {
        self.install_pending(actions);
        self.check_view_installed(actions);
        self.apply_committed(actions);
        if self.install.is_some() {
            self.check_install(actions);
        }
    }

    // ---- Apply (section 4.1 step 5, 4.2 step 4) ----

    /// Applies every op in `(commit_min, min(commit_max, verified_op, op)]`, in order, up to the
    /// first whose journal write is not yet durable.
    fn apply_committed(&mut self, actions: &mut Vec<Action>) {
        if self.installing() {
            return;
        }
        let bound = self.commit_max.min(self.verified_op).min(self.op);
        while self.commit_min < bound {
            let op = self.commit_min + 1;
            let Some(entry) = self.log.get(&op) else {
                tracing::error!(op, "committed op not held in memory; cannot apply");
                return;
            };
            // Apply only what the journal holds durably: the superblock's commit_max (written
            // from commit_min) promises a restart finds these very prepares in the journal,
            // not an older one a lost truncate-and-rewrite would leave there.
            if !entry.durable {
                return;
            }
            let body = entry.prepare.body.clone();
            self.commit_min = op;
            self.apply_one(op, &body, actions);
            self.maybe_checkpoint(actions);
        }
    }

    fn apply_one(&mut self, op: u64, body: &[u8], actions: &mut Vec<Action>) {
        let decoded = PrepareBody::decode(body).and_then(|body| Ok((body.client_id()?, body)));
        let (client, body) = match decoded {
            Ok(decoded) => decoded,
            Err(reason) => {
                // Every replica holds the same bytes, so every replica skips it.
                tracing::error!(op, %reason, "committed prepare body does not decode; skipped");
                return;
            }
        };
        let applied = apply::apply_prepare(
            Arc::make_mut(&mut self.metadata),
            &mut self.client_table,
            op,
            client,
            &body,
        );
        if let Applied::Registered {
            evicted: Some(evicted),
            ..
        } = &applied
        {
            tracing::info!(
                client = format_args!("{evicted:#034x}"),
                clients_table_max = self.config.clients_table_max,
                "client session evicted: the client table is full; the client is told on its \
                 next request"
            );
        }
        actions.push(Action::Apply {
            op,
            operation: body.operation.clone(),
            applied: applied.changed_metadata() || matches!(applied, Applied::Registered { .. }),
        });
        let key = (
            client,
            match body.operation {
                PrepareOperation::Register => 0,
                PrepareOperation::Metadata(_) => body.request,
            },
        );
        if self.in_flight.get(&key) == Some(&op) {
            self.in_flight.remove(&key);
        }
        let Some(tokens) = self.waiting.remove(&key) else {
            return;
        };
        let answer = match applied {
            Applied::Registered { session, .. } | Applied::AlreadyRegistered { session } => {
                ClientReply::Registered { session }
            }
            Applied::Changed { reply } | Applied::Rejected { reply } => {
                ClientReply::Committed(reply)
            }
            Applied::Duplicate { lookup } => self.duplicate_answer(client, &body, lookup),
        };
        for token in tokens {
            reply(actions, token, answer.clone());
        }
    }

    /// The answer to a request whose prepare committed as a duplicate.
    fn duplicate_answer(&self, client: u128, body: &PrepareBody, lookup: Lookup) -> ClientReply {
        let PrepareOperation::Metadata(change) = &body.operation else {
            unreachable!("a Register never commits as a duplicate");
        };
        match lookup {
            Lookup::Cached(cached) if cached.request_checksum == apply::change_checksum(change) => {
                ClientReply::Committed(cached)
            }
            Lookup::Cached(_) => ClientReply::Error {
                code: bus::ErrorCode::InvalidArgument,
                message: apply::reused_request_message(client, body.request, change),
            },
            Lookup::Stale {
                oldest_cached_request,
            } => ClientReply::Error {
                code: bus::ErrorCode::RequestStale,
                message: apply::stale_request_message(client, body.request, oldest_cached_request),
            },
            Lookup::New | Lookup::NoSession => ClientReply::Evicted {
                reason: apply::no_session_reason(client, self.config.clients_table_max),
            },
        }
    }

    fn maybe_checkpoint(&mut self, actions: &mut Vec<Action>) {
        if self.checkpoint_in_progress.is_some()
            || self.installing()
            || self.commit_min < self.checkpoint_op + self.config.checkpoint_interval
        {
            return;
        }
        self.checkpoint_in_progress = Some(self.commit_min);
        actions.push(Action::Checkpoint {
            op: self.commit_min,
            metadata: Arc::clone(&self.metadata),
            client_table: self.client_table.to_snapshot(),
        });
    }

    /// A deposed primary (or one whose journal stopped) answers every waiting client: the
    /// client retries at the new primary, whose client table deduplicates.
    fn release_clients(&mut self, actions: &mut Vec<Action>) {
        let answer = ClientReply::NotPrimary {
            view: self.view,
            primary: None,
        };
        for (_, tokens) in std::mem::take(&mut self.waiting) {
            for token in tokens {
                reply(actions, token, answer.clone());
            }
        }
        for request in std::mem::take(&mut self.deferred) {
            reply(actions, request.token, answer.clone());
        }
        self.queue.clear();
        self.in_flight.clear();
        self.oks.clear();
        self.acked_at.clear();
    }
}

/// The key a client request is deduplicated by: `(client, request)`, request 0 for Register.
fn request_key(request: &ClientRequest) -> (u128, u64) {
    match request.operation {
        PrepareOperation::Register => (request.client, 0),
        PrepareOperation::Metadata(_) => (request.client, request.request),
    }
}

/// `reason`: the driver's text, naming the journal file and the free space.
fn storage_full(op: u64, reason: &str) -> ClientReply {
    ClientReply::Error {
        code: bus::ErrorCode::StorageFull,
        message: format!(
            "metadata journal full: the write of op {op} was refused for lack of space and \
             rolled back, so the change is not applied (with replicas it may still commit once \
             space returns: retry to learn its outcome): {reason}"
        ),
    }
}

fn busy(pipeline_max: usize) -> ClientReply {
    ClientReply::Error {
        code: bus::ErrorCode::Busy,
        message: format!(
            "the metadata pipeline ({pipeline_max} prepares) and its queue ({REQUEST_QUEUE_MAX} \
             requests) are full; retry later"
        ),
    }
}

fn reply(actions: &mut Vec<Action>, token: ClientToken, reply: ClientReply) {
    actions.push(Action::Reply { token, reply });
}
