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
}

impl Command {
    /// Every command, in numeric order.
    pub const ALL: [Command; 2] = [Command::Request, Command::Reply];

    /// The command numbered `value`, or `None` for a number no command has.
    pub fn from_u8(value: u8) -> Option<Command> {
        match value {
            1 => Some(Command::Request),
            2 => Some(Command::Reply),
            _ => None,
        }
    }
}

impl Operation {
    /// Every v1 operation, in numeric order.
    pub const ALL: [Operation; 8] = [
        Operation::Ping,
        Operation::CreateStream,
        Operation::DeleteStream,
        Operation::CreateTopic,
        Operation::DeleteTopic,
        Operation::GetMetadata,
        Operation::SendMessages,
        Operation::PollMessages,
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
            _ => None,
        }
    }
}

impl ErrorCode {
    /// Every error code, in numeric order.
    pub const ALL: [ErrorCode; 11] = [
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
            _ => None,
        }
    }

    /// Whether the same request may succeed if sent again later (nothing was applied).
    pub fn is_retryable(self) -> bool {
        matches!(self, ErrorCode::Busy | ErrorCode::ShuttingDown)
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
        assert_eq!(Operation::from_u8(9), None);
        assert_eq!(Operation::from_u8(u8::MAX), None);
        assert_eq!(
            (1..=u8::MAX)
                .filter(|&v| Operation::from_u8(v).is_some())
                .count(),
            8
        );
    }

    #[test]
    fn error_code_numbers_are_stable() {
        let numbers: Vec<u32> = ErrorCode::ALL.iter().map(|&c| c as u32).collect();
        assert_eq!(numbers, (1..=11).collect::<Vec<u32>>());
        for code in ErrorCode::ALL {
            assert_eq!(ErrorCode::from_u32(code as u32), Some(code));
        }
        assert_eq!(ErrorCode::from_u32(0), None);
        assert_eq!(ErrorCode::from_u32(12), None);
        assert_eq!(ErrorCode::from_u32(u32::MAX), None);
    }

    #[test]
    fn only_busy_and_shutting_down_are_retryable() {
        let retryable: Vec<ErrorCode> = ErrorCode::ALL
            .into_iter()
            .filter(|c| c.is_retryable())
            .collect();
        assert_eq!(retryable, vec![ErrorCode::Busy, ErrorCode::ShuttingDown]);
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
    }
}
