//! Commands, client operations, and stable numeric error codes.
//!
//! The numbers here are wire format: a value is never renumbered or reused, new values are only
//! appended. Decoding never panics: an unknown number is `None`, and the caller decides whether
//! that closes the connection (`Command`, `Operation`) or is a protocol violation (`ErrorCode`).

/// Header `command`. Unknown values close the connection.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Request = 1,
    Reply = 2,
    /// Sent by the server instead of a `Reply` to a session-tracked request whose client has no
    /// session (never registered, or evicted from the full client table). It echoes the request's
    /// `client`, `request` and `operation`; `error_code` is `SessionEvicted`; the body is the
    /// UTF-8 reason. The client must `Register` again before its next session-tracked request.
    Eviction = 3,
    // Replica-to-replica commands (the replica bus, `shards::vsr::wire`). A client connection
    // that sends one of these is closed like for any other unexpected command.
    /// Primary to backups: one prepare (VSR Revisited section 4.1 step 3).
    Prepare = 4,
    /// Backup to primary: the prepare at `op` is durable here (section 4.1 step 4).
    PrepareOk = 5,
    /// Primary to backups: the commit number, when no prepare carries it (section 4.1 step 7).
    Commit = 6,
    /// Section 4.2 step 1.
    StartViewChange = 7,
    /// Section 4.2 step 2.
    DoViewChange = 8,
    /// Section 4.2 step 3.
    StartView = 9,
    /// Repair: ask a peer for the prepare at an op (section 4.3 of DESIGN, issue 8 section 2).
    RequestPrepare = 10,
    /// Repair: ask a peer for the headers of a range of ops.
    RequestHeaders = 11,
    /// Repair: the answer to `RequestHeaders`.
    Headers = 12,
    /// The first frame on a replica link: cluster id, replica index, client address.
    Hello = 13,
    /// State transfer (DESIGN section 10, issue 9): a lagging replica asks the primary for its
    /// checkpoint. Header only.
    RequestStateTransfer = 14,
    /// State transfer: the primary's answer, a refusal (header only) or an offer whose body is
    /// the manifest.
    StateTransferTarget = 15,
    /// State transfer: ask for one chunk of one artifact of the offer. Header only.
    RequestStateChunk = 16,
    /// State transfer: one chunk of one artifact.
    StateChunk = 17,
}

/// Header `operation` of a client Request/Reply (v1).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    /// Empty round trip; the reply's `count` is the server's `max_message_size` (bytes, header
    /// included), or 0 from a server that predates it.
    Ping = 1,
    CreateStream = 2,
    DeleteStream = 3,
    CreateTopic = 4,
    DeleteTopic = 5,
    GetMetadata = 6,
    SendMessages = 7,
    PollMessages = 8,
    /// Opens a client session. Request: `client` = the client id (non-zero), `request` = 0, empty
    /// body. Success reply: `offset` = the session number (the op number that committed the
    /// Register), empty body.
    Register = 9,
    /// Stores a consumer's offset in one partition on its owner shard (issue 11 section 1).
    /// Request: `namespace` = the partition, `offset` = the next offset the consumer will read
    /// (Kafka's committed position: everything below it is consumed), `count` = `ConsumerKind`
    /// (0 consumer, 1 group), `generation` = the member's group generation (kind 1 only), body =
    /// the consumer or group name (UTF-8, 1..=`NAME_LEN_MAX` bytes). Reply: empty. Durable by the
    /// partition's fsync policy before the reply.
    StoreOffset = 10,
    /// Reads a stored consumer offset. Request as `StoreOffset` without `offset`. Reply: `count`
    /// = 1 and `offset` = the stored offset, or `count` = 0 when none is stored.
    GetOffset = 11,
    /// Creates a consumer group on a topic (session-tracked metadata change). Request:
    /// `namespace` = (stream, topic, 0), body = the group name.
    CreateGroup = 12,
    /// Deletes a consumer group (session-tracked). Request as `CreateGroup`.
    DeleteGroup = 13,
    /// The calling client (`client` id) joins a group as a member; not committed: membership is
    /// the primary's soft state. Request as `CreateGroup`; reply body: `GroupAssignment` JSON.
    JoinGroup = 14,
    /// The calling client leaves a group. Request as `CreateGroup`; empty reply.
    LeaveGroup = 15,
    /// A member's heartbeat: keeps its membership alive, reports the partitions it still reads,
    /// and returns its current assignment. Request: `namespace` = (stream, topic, 0), body =
    /// `bus::group::Heartbeat` JSON; reply body: `GroupAssignment` JSON.
    GroupHeartbeat = 16,
    /// Changes a topic's retention (session-tracked). Request: `namespace` = (stream, topic, 0),
    /// `retention_bytes` / `retention_ms`: the new limit, 0 = unlimited, `u64::MAX` = unchanged.
    AlterTopic = 17,
}

/// Stable numeric error codes (never renumbered). `Busy` and `ShuttingDown` are retryable.
#[repr(u32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorCode {
    Busy = 1,
    StreamNotFound = 2,
    StreamAlreadyExists = 3,
    TopicNotFound = 4,
    TopicAlreadyExists = 5,
    PartitionNotFound = 6,
    InvalidBatch = 7,
    InvalidArgument = 8,
    ShuttingDown = 9,
    StorageFailure = 10,
    Internal = 11,
    /// The client has no session (never registered, or evicted); register again. Carried by an
    /// `Eviction` message.
    SessionEvicted = 12,
    /// The request number is at or below the session's last committed request but its reply is
    /// no longer cached: the request was applied once and its answer is gone.
    RequestStale = 13,
    /// A write failed for lack of space or quota (ENOSPC, EDQUOT, EFBIG). The partition log or
    /// the metadata journal was rolled back to its last acknowledged end, so nothing of this
    /// request was applied; the body names the partition or the journal and the free space.
    /// Retryable once space is freed.
    StorageFull = 14,
    /// A poll asked for an offset beyond the partition's next offset, or below its first offset
    /// (retention deleted it, issue 11 section 4); the body names the offset asked and both
    /// ends. The reply's `next_offset` and `first_offset` say where the partition's data is.
    OffsetOutOfRange = 15,
    /// A frame's `size` exceeds the server's `max_message_size`; the body names both. The server
    /// closes the connection after this reply (it cannot skip the unread body safely).
    MessageTooLarge = 16,
    /// An idempotent send's sequence is not the producer's next one in this partition (a gap):
    /// the body names the expected and the received sequence. Nothing was appended.
    SequenceGap = 17,
    /// The server is at its connection, partition or file-descriptor limit; the body names the
    /// limit. Retryable later. As the refusal of a new connection (request 0, sent before any
    /// request was read) the server closes the connection after it; as the reply to a request
    /// (a send or poll whose file open met the open-file limit, a topic past the partition
    /// budget) nothing was applied and the connection stays open.
    ResourceExhausted = 18,
    /// This replica is not the primary of its view (it is a backup, or a view change is under
    /// way). The reply's `view` is the replica's view, `replica` the index of that view's primary
    /// (`view % replica_count`), and the body the primary's client address as UTF-8 (empty while
    /// a view change is under way or the address is not known yet). Nothing was applied; the
    /// client retries against that address (or the next one it knows).
    NotPrimary = 19,
    /// The consumer group named in the request does not exist on that topic.
    GroupNotFound = 20,
    /// A group with that name already exists on the topic.
    GroupAlreadyExists = 21,
    /// The client is not a member of the group (never joined, left, or its session timed out,
    /// or the primary changed and membership was lost): join again.
    NotGroupMember = 22,
    /// A group member stored an offset for a partition not assigned to it in the current
    /// generation (the body names both): a rebalance moved it; heartbeat for the new assignment.
    PartitionNotAssigned = 23,
}

impl Command {
    /// Every command, in numeric order.
    pub const ALL: [Command; 17] = [
        Command::Request,
        Command::Reply,
        Command::Eviction,
        Command::Prepare,
        Command::PrepareOk,
        Command::Commit,
        Command::StartViewChange,
        Command::DoViewChange,
        Command::StartView,
        Command::RequestPrepare,
        Command::RequestHeaders,
        Command::Headers,
        Command::Hello,
        Command::RequestStateTransfer,
        Command::StateTransferTarget,
        Command::RequestStateChunk,
        Command::StateChunk,
    ];

    /// The command numbered `value`, or `None` for a number no command has.
    pub fn from_u8(value: u8) -> Option<Command> {
        match value {
            1 => Some(Command::Request),
            2 => Some(Command::Reply),
            3 => Some(Command::Eviction),
            4 => Some(Command::Prepare),
            5 => Some(Command::PrepareOk),
            6 => Some(Command::Commit),
            7 => Some(Command::StartViewChange),
            8 => Some(Command::DoViewChange),
            9 => Some(Command::StartView),
            10 => Some(Command::RequestPrepare),
            11 => Some(Command::RequestHeaders),
            12 => Some(Command::Headers),
            13 => Some(Command::Hello),
            14 => Some(Command::RequestStateTransfer),
            15 => Some(Command::StateTransferTarget),
            16 => Some(Command::RequestStateChunk),
            17 => Some(Command::StateChunk),
            _ => None,
        }
    }
}

impl Operation {
    /// Every v1 operation, in numeric order.
    pub const ALL: [Operation; 17] = [
        Operation::Ping,
        Operation::CreateStream,
        Operation::DeleteStream,
        Operation::CreateTopic,
        Operation::DeleteTopic,
        Operation::GetMetadata,
        Operation::SendMessages,
        Operation::PollMessages,
        Operation::Register,
        Operation::StoreOffset,
        Operation::GetOffset,
        Operation::CreateGroup,
        Operation::DeleteGroup,
        Operation::JoinGroup,
        Operation::LeaveGroup,
        Operation::GroupHeartbeat,
        Operation::AlterTopic,
    ];

    /// The operation numbered `value`, or `None` for a number no operation has.
    pub fn from_u8(value: u8) -> Option<Operation> {
        match value {
            1 => Some(Operation::Ping),
            2 => Some(Operation::CreateStream),
            3 => Some(Operation::DeleteStream),
            4 => Some(Operation::CreateTopic),
            5 => Some(Operation::DeleteTopic),
            6 => Some(Operation::GetMetadata),
            7 => Some(Operation::SendMessages),
            8 => Some(Operation::PollMessages),
            9 => Some(Operation::Register),
            10 => Some(Operation::StoreOffset),
            11 => Some(Operation::GetOffset),
            12 => Some(Operation::CreateGroup),
            13 => Some(Operation::DeleteGroup),
            14 => Some(Operation::JoinGroup),
            15 => Some(Operation::LeaveGroup),
            16 => Some(Operation::GroupHeartbeat),
            17 => Some(Operation::AlterTopic),
            _ => None,
        }
    }

    /// Whether the server deduplicates this operation by (client, request) through the client's
    /// session: the metadata changes. A retried request with a number at or below the session's
    /// last committed one gets the cached reply (or `RequestStale`) instead of a second apply.
    /// `Register` itself and every other operation are not deduplicated.
    pub fn is_session_tracked(self) -> bool {
        matches!(
            self,
            Operation::CreateStream
                | Operation::DeleteStream
                | Operation::CreateTopic
                | Operation::DeleteTopic
                | Operation::CreateGroup
                | Operation::DeleteGroup
                | Operation::AlterTopic
        )
    }
}

impl ErrorCode {
    /// Every error code, in numeric order.
    pub const ALL: [ErrorCode; 23] = [
        ErrorCode::Busy,
        ErrorCode::StreamNotFound,
        ErrorCode::StreamAlreadyExists,
        ErrorCode::TopicNotFound,
        ErrorCode::TopicAlreadyExists,
        ErrorCode::PartitionNotFound,
        ErrorCode::InvalidBatch,
        ErrorCode::InvalidArgument,
        ErrorCode::ShuttingDown,
        ErrorCode::StorageFailure,
        ErrorCode::Internal,
        ErrorCode::SessionEvicted,
        ErrorCode::RequestStale,
        ErrorCode::StorageFull,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::MessageTooLarge,
        ErrorCode::SequenceGap,
        ErrorCode::ResourceExhausted,
        ErrorCode::NotPrimary,
        ErrorCode::GroupNotFound,
        ErrorCode::GroupAlreadyExists,
        ErrorCode::NotGroupMember,
        ErrorCode::PartitionNotAssigned,
    ];

    /// The error code numbered `value`, or `None` for 0 (success) and unknown numbers.
    pub fn from_u32(value: u32) -> Option<ErrorCode> {
        match value {
            1 => Some(ErrorCode::Busy),
            2 => Some(ErrorCode::StreamNotFound),
            3 => Some(ErrorCode::StreamAlreadyExists),
            4 => Some(ErrorCode::TopicNotFound),
            5 => Some(ErrorCode::TopicAlreadyExists),
            6 => Some(ErrorCode::PartitionNotFound),
            7 => Some(ErrorCode::InvalidBatch),
            8 => Some(ErrorCode::InvalidArgument),
            9 => Some(ErrorCode::ShuttingDown),
            10 => Some(ErrorCode::StorageFailure),
            11 => Some(ErrorCode::Internal),
            12 => Some(ErrorCode::SessionEvicted),
            13 => Some(ErrorCode::RequestStale),
            14 => Some(ErrorCode::StorageFull),
            15 => Some(ErrorCode::OffsetOutOfRange),
            16 => Some(ErrorCode::MessageTooLarge),
            17 => Some(ErrorCode::SequenceGap),
            18 => Some(ErrorCode::ResourceExhausted),
            19 => Some(ErrorCode::NotPrimary),
            20 => Some(ErrorCode::GroupNotFound),
            21 => Some(ErrorCode::GroupAlreadyExists),
            22 => Some(ErrorCode::NotGroupMember),
            23 => Some(ErrorCode::PartitionNotAssigned),
            _ => None,
        }
    }

    /// Whether the same request may succeed if sent again later (nothing was applied).
    /// `StorageFull` and `ResourceExhausted` are retryable only after an operator acts, so the
    /// client library reports them instead of resending within its retry budget.
    pub fn is_retryable(self) -> bool {
        matches!(
            self,
            ErrorCode::Busy
                | ErrorCode::ShuttingDown
                | ErrorCode::StorageFull
                | ErrorCode::ResourceExhausted
        )
    }

    /// The default human-readable text of this code, used when a server has nothing more precise
    /// to say. Lower case, no trailing period.
    pub fn message(self) -> &'static str {
        match self {
            ErrorCode::Busy => "target shard inbox full, retry",
            ErrorCode::StreamNotFound => "stream not found",
            ErrorCode::StreamAlreadyExists => "stream already exists",
            ErrorCode::TopicNotFound => "topic not found",
            ErrorCode::TopicAlreadyExists => "topic already exists",
            ErrorCode::PartitionNotFound => "partition not found",
            ErrorCode::InvalidBatch => "invalid message batch",
            ErrorCode::InvalidArgument => "invalid argument",
            ErrorCode::ShuttingDown => "server shutting down, retry",
            ErrorCode::StorageFailure => "storage failure",
            ErrorCode::Internal => "internal server error",
            ErrorCode::SessionEvicted => "client session evicted; register again",
            ErrorCode::RequestStale => "request number older than the session's cached replies",
            ErrorCode::StorageFull => {
                "storage full; nothing was applied, retry after freeing space"
            }
            ErrorCode::OffsetOutOfRange => {
                "offset beyond the partition's next offset or below its first offset"
            }
            ErrorCode::MessageTooLarge => "message larger than the server's max message size",
            ErrorCode::SequenceGap => "producer sequence gap; nothing was appended",
            ErrorCode::ResourceExhausted => {
                "server at a connection, partition or open-file limit, retry later"
            }
            ErrorCode::NotPrimary => "this replica is not the primary; retry at the primary",
            ErrorCode::GroupNotFound => "consumer group not found",
            ErrorCode::GroupAlreadyExists => "consumer group already exists",
            ErrorCode::NotGroupMember => "not a member of the consumer group; join again",
            ErrorCode::PartitionNotAssigned => {
                "partition not assigned to this member in the current generation; heartbeat"
            }
        }
    }
}

/// `Name (number): default message`, e.g. `Busy (1): target shard inbox full, retry`.
impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?} ({}): {}", *self as u32, self.message())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_round_trips_and_rejects_unknown() {
        for command in Command::ALL {
            assert_eq!(Command::from_u8(command as u8), Some(command));
        }
        let known: Vec<u8> = Command::ALL.iter().map(|&c| c as u8).collect();
        for value in 0..=u8::MAX {
            assert_eq!(
                Command::from_u8(value).is_some(),
                known.contains(&value),
                "{value}"
            );
        }
    }

    #[test]
    fn operation_round_trips_and_rejects_unknown() {
        for operation in Operation::ALL {
            assert_eq!(Operation::from_u8(operation as u8), Some(operation));
        }
        assert_eq!(Operation::from_u8(0), None);
        assert_eq!(Operation::from_u8(18), None);
        assert_eq!(Operation::from_u8(u8::MAX), None);
        assert_eq!(
            (1..=u8::MAX)
                .filter(|&v| Operation::from_u8(v).is_some())
                .count(),
            17
        );
    }

    #[test]
    fn wire_numbers_of_commands_and_operations_are_stable() {
        let commands: Vec<u8> = Command::ALL.iter().map(|&c| c as u8).collect();
        assert_eq!(commands, (1..=17).collect::<Vec<u8>>());
        assert_eq!(Command::Hello as u8, 13);
        assert_eq!(Command::StateChunk as u8, 17);
        let operations: Vec<u8> = Operation::ALL.iter().map(|&o| o as u8).collect();
        assert_eq!(operations, (1..=17).collect::<Vec<u8>>());
        assert_eq!(Operation::StoreOffset as u8, 10);
        assert_eq!(Operation::AlterTopic as u8, 17);
        assert_eq!(Command::Eviction as u8, 3);
        assert_eq!(Operation::Register as u8, 9);
    }

    #[test]
    fn only_metadata_changes_are_session_tracked() {
        let tracked: Vec<Operation> = Operation::ALL
            .into_iter()
            .filter(|o| o.is_session_tracked())
            .collect();
        assert_eq!(
            tracked,
            vec![
                Operation::CreateStream,
                Operation::DeleteStream,
                Operation::CreateTopic,
                Operation::DeleteTopic,
                Operation::CreateGroup,
                Operation::DeleteGroup,
                Operation::AlterTopic,
            ]
        );
    }

    #[test]
    fn error_code_numbers_are_stable() {
        let numbers: Vec<u32> = ErrorCode::ALL.iter().map(|&c| c as u32).collect();
        assert_eq!(numbers, (1..=23).collect::<Vec<u32>>());
        assert_eq!(ErrorCode::PartitionNotAssigned as u32, 23);
        assert_eq!(ErrorCode::NotPrimary as u32, 19);
        assert_eq!(ErrorCode::StorageFull as u32, 14);
        assert_eq!(ErrorCode::ResourceExhausted as u32, 18);
        assert_eq!(ErrorCode::SessionEvicted as u32, 12);
        assert_eq!(ErrorCode::RequestStale as u32, 13);
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u32(code as u32), Some(code));
        }
        assert_eq!(ErrorCode::from_u32(0), None);
        assert_eq!(ErrorCode::from_u32(24), None);
        assert_eq!(ErrorCode::from_u32(u32::MAX), None);
    }

    #[test]
    fn retryable_codes_are_the_ones_that_applied_nothing_and_may_pass_later() {
        let retryable: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|c| c.is_retryable())
            .collect();
        assert_eq!(
            retryable,
            vec![
                ErrorCode::Busy,
                ErrorCode::ShuttingDown,
                ErrorCode::StorageFull,
                ErrorCode::ResourceExhausted
            ]
        );
    }

    #[test]
    fn error_code_display() {
        assert_eq!(
            ErrorCode::Busy.to_string(),
            "Busy (1): target shard inbox full, retry"
        );
        assert_eq!(
            ErrorCode::TopicNotFound.to_string(),
            "TopicNotFound (4): topic not found"
        );
        assert_eq!(
            ErrorCode::Internal.to_string(),
            "Internal (11): internal server error"
        );
        assert_eq!(
            ErrorCode::SessionEvicted.to_string(),
            "SessionEvicted (12): client session evicted; register again"
        );
        assert_eq!(
            ErrorCode::RequestStale.to_string(),
            "RequestStale (13): request number older than the session's cached replies"
        );
    }
}
