//! `ShardFrame`: everything one shard sends another over the mesh. Owned data only (frames cross
//! threads); never a reference into shard state.

use bus::{ErrorCode, Namespace};

use crate::metadata::{MetadataOp, MetadataState};
use crate::vsr::client_table::CachedReply;
use crate::vsr::prepare::PrepareOperation;

#[derive(Debug)]
pub enum ShardFrame {
    /// Shard 0 -> every other shard at startup: the recovered metadata.
    Bootstrap(Box<MetadataState>),
    /// A request for the target shard (owner of a partition, or shard 0 for metadata). The reply
    /// goes back to the envelope's `from` on its reply lane.
    Request {
        request_id: u64,
        request: ShardRequest,
    },
    /// The answer to a `Request`, on the reply lane.
    Reply { request_id: u64, reply: ShardReply },
    /// Shard 0 -> every other shard: apply this committed op, in op order.
    MetadataApply { op_number: u64, op: MetadataOp },
    /// Shard 0 -> every other shard: replace your metadata copy with this installed checkpoint
    /// (state transfer, issue 9 section 4), opening and closing partitions to match; acked with
    /// `MetadataApplied { op_number: checkpoint_op }`.
    MetadataRestore {
        checkpoint_op: u64,
        metadata: std::sync::Arc<MetadataState>,
    },
    /// Shard 0 -> every other shard: the replica's view, primary and status changed.
    Status(crate::shard::ReplicaStatus),
    /// Every other shard -> shard 0, on the reply lane: the op is applied here (`failures`: its
    /// partitions that could not be opened; each is retried on its next send or poll).
    MetadataApplied {
        op_number: u64,
        failures: Vec<crate::unopened::OpenFailure>,
    },
}

#[derive(Debug)]
pub enum ShardRequest {
    /// Append a validated batch (full batch bytes) to the owned partition.
    Send {
        namespace: Namespace,
        batch: Vec<u8>,
    },
    /// Read from the owned partition, answering at once.
    Poll {
        namespace: Namespace,
        offset: u64,
        max_count: u32,
    },
    /// Wait, without reading, until the owned partition has a message at `offset` (issue 11
    /// section 3): answered `Parked(Appended)` at once when it has one (or `offset` is not its
    /// end: the poll that follows answers that), else parked until an append (`Appended`), for
    /// at most `wait` (`TimedOut`), or until the server stops (`Stopped`). A full parked set is
    /// an `Error` with `ResourceExhausted`. The connection reserves its reply budget only after
    /// this answer, then polls.
    AwaitMessage {
        namespace: Namespace,
        offset: u64,
        wait: std::time::Duration,
    },
    /// Store `consumer`'s offset in the owned partition (issue 11 section 1); a group's store
    /// was authorized by shard 0 before it was sent here.
    StoreOffset {
        namespace: Namespace,
        consumer: bus::Consumer,
        offset: u64,
    },
    /// Read `consumer`'s stored offset in the owned partition.
    GetOffset {
        namespace: Namespace,
        consumer: bus::Consumer,
    },
    /// A consumer-group request for shard 0 (issue 11 section 2).
    Group(crate::groups::GroupRequest),
    /// Order, persist and apply a Register or metadata change of client `client`'s request
    /// `request` (shard 0 only; deduplicated through the client table).
    Metadata {
        client: u128,
        request: u64,
        operation: PrepareOperation,
    },
    /// First and next offsets of every partition this shard owns (for GetMetadata).
    PartitionOffsets,
    /// Shard 0's current replica status: view, primary, commit (for GetMetadata).
    ReplicaStatus,
    /// Refuse a request about the owned partition `namespace` that the receiving shard already
    /// judged (e.g. an invalid batch): the owner answers `PartitionError` with `code` and
    /// `message` and the partition's ends, so the refusal carries them like every send reply.
    Refuse {
        namespace: Namespace,
        code: ErrorCode,
        message: String,
    },
}

/// Where a partition's data is, as of a reply: `first_offset` is the first offset a poll can
/// return, `next_offset` one past the last acknowledged message. Sent and poll replies carry
/// both (header fields `first_offset`, `next_offset`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PartitionEnds {
    pub first_offset: u64,
    pub next_offset: u64,
}

#[derive(Debug)]
pub enum ShardReply {
    Sent {
        base_offset: u64,
        message_count: u32,
        ends: PartitionEnds,
    },
    /// A poll's verified entries, as file ranges (issue 12 item 2): the connection's shard
    /// sends them without a copy when it can (`splice.rs`), or copies them.
    Polled {
        spans: storage::VerifiedSpans,
        message_count: u32,
        ends: PartitionEnds,
    },
    /// A poll at an offset beyond the partition's next offset, or below its first offset
    /// (retention deleted it, issue 11 section 4).
    OffsetOutOfRange {
        namespace: Namespace,
        offset: u64,
        ends: PartitionEnds,
    },
    MetadataDone,
    /// The answer to `AwaitMessage`: why the wait ended.
    Parked(crate::parked::Release),
    /// A Register committed at op `session`.
    Registered {
        session: u64,
    },
    /// A duplicate of a committed request: its reply as first sent.
    Cached(CachedReply),
    /// This replica is not the primary (issue 8 section 2): the reply header carries `view` and
    /// the primary's index, the body the primary's client address (empty when unknown).
    NotPrimary {
        view: u32,
        primary: Option<u8>,
        address: String,
    },
    /// The client has no session (never registered, or evicted): answer with an Eviction.
    Evicted {
        reason: String,
    },
    Offsets(Vec<(Namespace, PartitionEnds)>),
    /// A success with no partition ends: the reply header's `offset`, `count` and `generation`,
    /// and a body (stored offsets, group assignments).
    Ok {
        offset: u64,
        count: u32,
        generation: u32,
        body: Vec<u8>,
    },
    /// A consumer-group answer between shards (never encoded for a client).
    Group(crate::groups::GroupReply),
    Status(crate::shard::ReplicaStatus),
    Error {
        code: ErrorCode,
        message: String,
    },
    /// An error about an existing, open partition: the reply header also carries its ends.
    PartitionError {
        code: ErrorCode,
        message: String,
        ends: PartitionEnds,
    },
}

impl ShardReply {
    pub fn error(code: ErrorCode, message: impl Into<String>) -> ShardReply {
        ShardReply::Error {
            code,
            message: message.into(),
        }
    }

    /// This reply with `ends` attached when it is an `Error` (a refusal about a partition whose
    /// log is open); any other reply unchanged.
    #[must_use]
    pub fn with_ends(self, ends: PartitionEnds) -> ShardReply {
        match self {
            ShardReply::Error { code, message } => ShardReply::PartitionError {
                code,
                message,
                ends,
            },
            other => other,
        }
    }
}
