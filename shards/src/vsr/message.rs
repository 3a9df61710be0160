//! The typed inputs and outputs of the sans-IO consensus core ([`super::replica::Replica`]):
//! replica-to-replica messages, client requests and replies, the actions the core asks its driver
//! to perform, and the completions the driver reports back.
//!
//! Terms as in "Viewstamped Replication Revisited" (Liskov, Cowling 2012) and DESIGN section 1:
//! `view`, `op`, `commit` (the commit number), `log_view` (the latest view in which the replica's
//! status was normal). Every replica message travels as a 256-byte checksummed `bus` header plus
//! a body (`super::wire`); these types are what the core sees after decoding.
//!
//! Nothing here does I/O or reads a clock.

use std::sync::Arc;

use storage::journal::Prepare;

use super::client_table::{CachedReply, ClientTableSnapshot};
use super::prepare::PrepareOperation;
use super::transfer::{ArtifactKind, TransferTarget};
use crate::metadata::MetadataState;

/// Index of a replica in `0..replica_count`.
pub type ReplicaIndex = u8;

/// The identity of one prepare as peers exchange it for repair and view changes: enough to tell
/// whether two replicas hold the same prepare at an op without sending its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrepareHeader {
    pub op: u64,
    pub view: u32,
    pub commit: u64,
    /// The journal record header checksum of the prepare (`JournalHeader::for_prepare`): covers
    /// op, view, commit and the body, and so the parent checksum the body carries.
    pub checksum: u128,
    /// The checksum of the prepare at `op - 1` (0 for op 1 and for a legacy single-replica
    /// record written before prepares were chained: "unknown").
    pub parent: u128,
}

/// One replica-to-replica message (the sender's index travels beside it, see
/// [`super::replica::Replica::on_message`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// Primary to backups: the prepare at `prepare.op` in view `prepare.view`; `prepare.commit`
    /// piggybacks the primary's commit number (VSR Revisited section 4.1 step 3). The body is a
    /// `PrepareBody` (JSON) that names the parent checksum.
    Prepare { prepare: Prepare },
    /// Backup to primary: the prepare at `op` with `checksum` is durable in the sender's journal
    /// (section 4.1 step 4).
    PrepareOk { view: u32, op: u64, checksum: u128 },
    /// Primary heartbeat: everything up to `commit` is committed, and the prepare at `commit`
    /// has `commit_checksum` (so a backup applies only the prepares the primary committed).
    Commit {
        view: u32,
        commit: u64,
        commit_checksum: u128,
    },
    /// Section 4.2 step 1: the sender moved to `view` and asks for a view change.
    StartViewChange { view: u32 },
    /// Section 4.2 step 2: the sender's log for the new primary of `view`: its `log_view`, its
    /// highest `op`, its `commit` number, and its prepares above `commit` (at most the pipeline's
    /// worth, oldest first).
    DoViewChange {
        view: u32,
        log_view: u32,
        op: u64,
        commit: u64,
        prepares: Vec<Prepare>,
    },
    /// Section 4.2 step 3 (and 4.3 for a lagging backup): the new primary's log above `commit`
    /// (oldest first), its `op` and `commit`. A backup truncates its journal above the first
    /// prepare that differs and installs these.
    StartView {
        view: u32,
        op: u64,
        commit: u64,
        prepares: Vec<Prepare>,
    },
    /// Repair: send me the prepare at `op` (with `checksum`, or any if 0).
    RequestPrepare { view: u32, op: u64, checksum: u128 },
    /// Repair: send me the headers of the prepares at `op_min..=op_max` that you hold.
    RequestHeaders { view: u32, op_min: u64, op_max: u64 },
    /// Repair: the answer to `RequestHeaders`, ascending by op.
    Headers {
        view: u32,
        headers: Vec<PrepareHeader>,
    },
    /// State transfer (DESIGN section 10, issue 9 section 1): the sender's gap is below every
    /// peer's retained journal; it asks for the checkpoint. `nonce` names this attempt (a
    /// rebooted requester picks a fresh one). Routed to the serving side
    /// (`super::transfer::server`), not to the core. Header only on the wire.
    RequestStateTransfer { view: u32, nonce: u64 },
    /// The answer to `RequestStateTransfer{nonce}`: a refusal with its reason, or the offer of
    /// the checkpoint at `checkpoint_op` with its manifest. Routed to the core's receiver.
    StateTransferTarget {
        view: u32,
        nonce: u64,
        target: TransferTarget,
    },
    /// Send me `len` bytes (at least 1; the server may send fewer) of `artifact` of the offer of
    /// transfer `nonce`, from byte `offset`. Routed to the serving side. Header only.
    RequestStateChunk {
        view: u32,
        nonce: u64,
        artifact: ArtifactKind,
        offset: u64,
        len: u32,
    },
    /// Bytes `offset..offset + payload.len()` of `artifact` of the offer of transfer `nonce`
    /// (never empty). Routed to the core's receiver.
    StateChunk {
        view: u32,
        nonce: u64,
        artifact: ArtifactKind,
        offset: u64,
        payload: Vec<u8>,
    },
}

impl Message {
    /// The view the message was sent in.
    pub fn view(&self) -> u32 {
        match self {
            Message::Prepare { prepare } => prepare.view,
            Message::PrepareOk { view, .. }
            | Message::Commit { view, .. }
            | Message::StartViewChange { view }
            | Message::DoViewChange { view, .. }
            | Message::StartView { view, .. }
            | Message::RequestPrepare { view, .. }
            | Message::RequestHeaders { view, .. }
            | Message::Headers { view, .. }
            | Message::RequestStateTransfer { view, .. }
            | Message::StateTransferTarget { view, .. }
            | Message::RequestStateChunk { view, .. }
            | Message::StateChunk { view, .. } => *view,
        }
    }

    /// Whether the serving side of state transfer (`super::transfer::server::OfferServer`)
    /// handles this message instead of the core.
    pub fn is_state_transfer_request(&self) -> bool {
        matches!(
            self,
            Message::RequestStateTransfer { .. } | Message::RequestStateChunk { .. }
        )
    }
}

/// An opaque token the driver attaches to a client request and gets back with its reply (the
/// driver maps it to the waiting connection). The core never interprets it.
pub type ClientToken = u64;

/// A client's request as it reaches the core (only a primary prepares it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientRequest {
    pub token: ClientToken,
    /// Non-zero client id.
    pub client: u128,
    /// The client's request number (0 for Register).
    pub request: u64,
    pub operation: PrepareOperation,
    /// The driver's wall clock when the request arrived, microseconds since the Unix epoch: the
    /// primary stamps it into the prepare (the core never reads a clock).
    pub timestamp_us: u64,
}

/// What the core answers a client request with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientReply {
    /// The committed reply (or the cached one, for a duplicate): a metadata change's outcome,
    /// success or a deterministic rejection, exactly as every replica cached it.
    Committed(CachedReply),
    /// A Register committed (or the client already had this session).
    Registered { session: u64 },
    /// Refused before anything was prepared (nothing applied): stale request number, reused
    /// request number with other arguments, invalid client id, body too large, ...
    Error {
        code: bus::ErrorCode,
        message: String,
    },
    /// The client has no session; it must Register again.
    Evicted { reason: String },
    /// This replica is not the primary of `view`; `primary` is that view's primary (its client
    /// address is the driver's to add), `None` while a view change is under way.
    NotPrimary {
        view: u32,
        primary: Option<ReplicaIndex>,
    },
}

/// One thing the core asks its driver to do. The driver performs actions in the order given and
/// reports each I/O action's outcome with a [`Completion`]; `Send`, `Apply`, `Reply` and `Log`
/// complete immediately.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Send `message` to replica `to` (best effort: dropped if the link is down or full; the
    /// protocol retries on its own timers).
    Send { to: ReplicaIndex, message: Message },
    /// Append `prepare` to the journal (its op is the journal's last op + 1) and make it durable
    /// (the driver may share one fsync among consecutive writes). Completes with
    /// [`Completion::JournalWritten`] or [`Completion::JournalFailed`].
    WriteJournal { prepare: Prepare },
    /// Durably drop every journal record above `op`. Completes with
    /// [`Completion::JournalTruncated`] or [`Completion::JournalFailed`].
    TruncateJournal { op: u64 },
    /// Read the prepare at `op` from the journal. Completes with [`Completion::JournalRead`].
    ReadJournal { op: u64 },
    /// Durably record `view`, `log_view` and `commit_max` in the superblock before the core acts
    /// on them (a restarted replica never goes back in view, never votes twice in a view).
    /// Completes with [`Completion::SuperblockWritten`].
    WriteSuperblock {
        view: u32,
        log_view: u32,
        commit_max: u64,
    },
    /// The core applied committed prepare `op` to its state machine and client table; the driver
    /// applies the same change to every shard's copy (creating or removing partition
    /// directories) before it performs the next `Reply`. `operation` is what was applied;
    /// `applied` is false for a change the state machine rejected (the client's cached reply
    /// carries the rejection; nothing changes anywhere).
    Apply {
        op: u64,
        operation: PrepareOperation,
        applied: bool,
    },
    /// Answer the client request that carried `token`.
    Reply {
        token: ClientToken,
        reply: ClientReply,
    },
    /// Take a checkpoint of this state, which is the state after applying `op` (the core
    /// clones it when it emits the action). Completes with [`Completion::CheckpointDone`] or
    /// [`Completion::CheckpointFailed`].
    Checkpoint {
        op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    },
    /// State transfer install (DESIGN section 10, issue 9 section 4): make the fetched and
    /// verified checkpoint at `checkpoint_op` this replica's, under `checkpoint_lock` then
    /// `superblock_lock`: the snapshot by durable replace, then the superblock pairing (with
    /// `commit_max` at least `checkpoint_op`), then the journal restarted empty so its next op is
    /// `checkpoint_op + 1` (every record at or below it dropped, and the stale suffix above it
    /// too: the core repairs the tail from peers), then every shard's copy of the metadata
    /// replaced (partition directories of the installed metadata created). The core checked
    /// every part restorable before asking. Completes with
    /// [`Completion::CheckpointInstalled`] or [`Completion::InstallFailed`].
    InstallCheckpoint {
        checkpoint_op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    },
}

/// The outcome of an I/O action, fed back through
/// [`super::replica::Replica::on_io_done`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Completion {
    /// The prepare at `op` with `checksum` is durable.
    JournalWritten { op: u64, checksum: u128 },
    /// Every record above `op` is durably gone.
    JournalTruncated { op: u64 },
    /// The prepare at `op`, or `None` if the journal does not hold it (released, never written,
    /// or damaged: a torn or corrupt record reads as missing and is repaired from peers).
    JournalRead { op: u64, prepare: Option<Prepare> },
    /// A journal write or truncate failed; `retryable` is true when nothing changed (space
    /// refused and rolled back), false when the journal is unusable until restart.
    /// `reason` is the driver's description of the failure, naming the journal file and, for a
    /// refused write, the free space (the core adds it to the clients' error replies).
    JournalFailed {
        op: u64,
        retryable: bool,
        reason: String,
    },
    /// The superblock now durably holds this view and log_view.
    SuperblockWritten { view: u32, log_view: u32 },
    /// A checkpoint at `op` is durable; the journal now starts at `journal_first_op`.
    CheckpointDone { op: u64, journal_first_op: u64 },
    /// The checkpoint at `op` did not complete; the previous one stays valid.
    CheckpointFailed { op: u64 },
    /// The transferred checkpoint at `checkpoint_op` is durable (snapshot in place, journal
    /// restarted above it, shards restored). `degraded`: the superblock pairing write failed
    /// after the snapshot was in place; the install still succeeded (boot accepts a snapshot
    /// newer than its pairing) and the next checkpoint repairs the pairing.
    CheckpointInstalled { checkpoint_op: u64, degraded: bool },
    /// The install at `checkpoint_op` changed nothing durable (the snapshot write failed): the
    /// previous checkpoint and journal stay as they were. `reason` names the file and error.
    InstallFailed { checkpoint_op: u64, reason: String },
}

/// Status of a replica (VSR Revisited section 4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Normal,
    ViewChange,
}
