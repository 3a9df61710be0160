//! Every bound of the wire protocol.

/// Default `max_message_size` (bytes, header included). DESIGN section 5.
pub const MESSAGE_SIZE_MAX_DEFAULT: u32 = 64 * 1024 * 1024;
/// Largest name of a stream or topic, bytes of UTF-8.
pub const NAME_LEN_MAX: usize = 255;
/// Largest partition count of one topic.
pub const PARTITION_COUNT_MAX: u32 = 4096;
/// Largest message count in one batch.
pub const BATCH_MESSAGE_COUNT_MAX: u32 = 1 << 20;
