//! Every bound of the storage crate.

/// Default segment size before rolling to a new segment file (bytes).
pub const SEGMENT_SIZE_MAX_DEFAULT: u64 = 1 << 30;
/// Largest single entry (bytes, header included); equals the default max message size.
pub const ENTRY_SIZE_MAX: u32 = 64 * 1024 * 1024;
/// Largest reply of one read (bytes), bounding poll memory.
pub const READ_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;
