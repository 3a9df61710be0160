//! Wire format and transport: the 256-byte header, XXH3-128 checksums, framing over compio TCP,
//! the v1 client operations, message batches, stable error codes, and the async client library.
//!
//! `bus` never touches files and never depends on `storage`.

pub mod batch;
pub mod client;
pub mod command;
pub mod frame;
pub mod header;
pub mod limits;
pub mod namespace;
pub mod reply;
pub mod wire;

pub use batch::{
    BATCH_HEADER_SIZE, BatchBuilder, BatchError, BatchHeader, BatchView, MESSAGE_HEADER_SIZE,
    MessageHeader, MessageView,
};
pub use client::{Client, ClientError, SendAck};
pub use command::{Command, ErrorCode, Operation};
pub use frame::{Frame, FrameError, encode_frame, read_frame};
pub use header::{HEADER_SIZE, Header, PROTOCOL_VERSION};
pub use namespace::Namespace;
pub use wire::{Metadata, PartitionInfo, StreamInfo, TopicInfo};
