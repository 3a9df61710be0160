//! Every bound of the wire protocol, with why it has its value. Relations between bounds are
//! checked at compile time at the bottom. Nothing here may depend on configuration.

use crate::batch::{BATCH_HEADER_SIZE, MESSAGE_HEADER_SIZE};
use crate::header::HEADER_SIZE;

/// Default `max_message_size` (bytes, header included). DESIGN section 5. Also the most memory
/// one connection's read may allocate for a body.
pub const MESSAGE_SIZE_MAX_DEFAULT: u32 = 64 * 1024 * 1024;
/// Largest name of a stream or topic, bytes of UTF-8.
pub const NAME_LEN_MAX: usize = 255;
/// Largest partition count of one topic.
pub const PARTITION_COUNT_MAX: u32 = 4096;
/// Largest message count in one batch. With 32-byte message headers this is 32 MiB of headers
/// alone, half the default message size, so a parser's work per batch stays bounded.
pub const BATCH_MESSAGE_COUNT_MAX: u32 = 1 << 20;
/// Longest message body of an error reply, bytes of UTF-8; longer texts are cut at a character
/// boundary. Error texts are for people and logs, not for data.
pub const ERROR_MESSAGE_SIZE_MAX: usize = 4096;

// A full batch of empty messages fits in a default-sized message.
const _: () = assert!(
    BATCH_HEADER_SIZE + (BATCH_MESSAGE_COUNT_MAX as usize) * MESSAGE_HEADER_SIZE
        <= MESSAGE_SIZE_MAX_DEFAULT as usize - HEADER_SIZE
);
// An error reply always fits in the smallest sensible max_message_size.
const _: () = assert!(HEADER_SIZE + ERROR_MESSAGE_SIZE_MAX <= 64 * 1024);
const _: () = assert!(MESSAGE_SIZE_MAX_DEFAULT as usize >= HEADER_SIZE);
