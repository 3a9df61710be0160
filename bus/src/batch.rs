//! Message batches: the SendMessages body and the PollMessages reply body, byte-identical to the
//! storage entry (a test in `shards` checks the two layouts agree).
//!
//! Batch: `BatchHeader` (32 bytes) then `message_count` messages, each `MessageHeader` (32 bytes)
//! then payload. BatchHeader: base_offset u64, base_timestamp_us u64, message_count u32,
//! length u32 (bytes after the batch header), checksum u64 (XXH3-64 of those bytes).
//! MessageHeader: length u32 (payload bytes), offset_delta u32, timestamp_delta_us u32,
//! reserved u32, id u64, checksum u64 (XXH3-64 of the payload).

pub const BATCH_HEADER_SIZE: usize = 32;
pub const MESSAGE_HEADER_SIZE: usize = 32;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct BatchHeader {
    pub base_offset: u64,
    pub base_timestamp_us: u64,
    pub message_count: u32,
    pub length: u32,
    pub checksum: u64,
}

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct MessageHeader {
    pub length: u32,
    pub offset_delta: u32,
    pub timestamp_delta_us: u32,
    pub reserved: u32,
    pub id: u64,
    pub checksum: u64,
}

const _: () = assert!(std::mem::size_of::<BatchHeader>() == BATCH_HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<MessageHeader>() == MESSAGE_HEADER_SIZE);

/// Builds one batch (base_offset 0: the owner shard assigns it).
#[derive(Debug, Default)]
pub struct BatchBuilder {}

impl BatchBuilder {
    pub fn with_capacity(message_count: usize, payload_bytes: usize) -> BatchBuilder {
        todo!("{message_count}{payload_bytes}")
    }
    pub fn push(&mut self, id: u64, timestamp_us: u64, payload: &[u8]) {
        todo!("{id}{timestamp_us}{}", payload.len())
    }
    pub fn message_count(&self) -> u32 {
        todo!()
    }
    /// Finishes the batch (writes header length and checksum) and returns its bytes.
    pub fn finish(self) -> Vec<u8> {
        todo!()
    }
}

/// A validated batch borrowed from a buffer.
#[derive(Debug, Clone, Copy)]
pub struct BatchView<'a> {
    pub header: BatchHeader,
    /// The whole batch (header included).
    pub bytes: &'a [u8],
}

/// One message of a batch.
#[derive(Debug, Clone, Copy)]
pub struct MessageView<'a> {
    pub offset: u64,
    pub timestamp_us: u64,
    pub id: u64,
    pub checksum: u64,
    pub payload: &'a [u8],
}

impl MessageView<'_> {
    /// XXH3-64 of the payload equals the stored checksum.
    pub fn verify(&self) -> bool {
        todo!()
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BatchError {
    #[error("batch shorter than its 32-byte header ({len} bytes)")]
    TooShort { len: usize },
    #[error("batch length field {length} does not match the {actual} bytes after the header")]
    LengthMismatch { length: u32, actual: usize },
    #[error("batch checksum mismatch")]
    Checksum,
    #[error("batch declares {declared} messages but holds {found}")]
    CountMismatch { declared: u32, found: u32 },
    #[error("message {index} overruns the batch")]
    MessageOverrun { index: u32 },
    #[error("batch is empty")]
    Empty,
    #[error("batch holds {count} messages, above the limit {max}")]
    TooManyMessages { count: u32, max: u32 },
}

impl<'a> BatchView<'a> {
    /// Validates the header, the checksum of the message section and the message framing.
    /// `bytes` must be exactly one batch.
    pub fn parse(bytes: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        todo!("{}", bytes.len())
    }
    /// Splits a buffer of concatenated batches (a poll reply) and validates each.
    pub fn parse_many(bytes: &'a [u8]) -> Result<Vec<BatchView<'a>>, BatchError> {
        todo!("{}", bytes.len())
    }
    pub fn messages(&self) -> impl Iterator<Item = MessageView<'a>> + use<'a> {
        std::iter::empty()
    }
}

/// Rewrites base_offset in place in a batch's bytes (not covered by the checksum).
pub fn set_base_offset(batch: &mut [u8], base_offset: u64) {
    todo!("{}{base_offset}", batch.len())
}
