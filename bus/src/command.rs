//! Commands, client operations, and stable numeric error codes.

/// Header `command`. Unknown values close the connection.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    Request = 1,
    Reply = 2,
}

/// Header `operation` of a client Request/Reply (v1).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Operation {
    Ping = 1,
    CreateStream = 2,
    DeleteStream = 3,
    CreateTopic = 4,
    DeleteTopic = 5,
    GetMetadata = 6,
    SendMessages = 7,
    PollMessages = 8,
}

/// Stable numeric error codes (never renumbered). `Busy` is retryable.
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
}

impl Command {
    pub fn from_u8(value: u8) -> Option<Command> {
        todo!("{value}")
    }
}
impl Operation {
    pub fn from_u8(value: u8) -> Option<Operation> {
        todo!("{value}")
    }
}
impl ErrorCode {
    pub fn from_u32(value: u32) -> Option<ErrorCode> {
        todo!("{value}")
    }
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorCode::Busy | ErrorCode::ShuttingDown)
    }
}
