//! One log entry: a 32-byte header then `length` payload bytes. The layout is byte-identical to the
//! wire batch header of `bus::batch` (checked by a test in `shards`), so a stored entry is served to
//! a poller without transformation.
//!
//! EntryHeader: base_offset u64, base_timestamp_us u64, message_count u32, length u32 (payload
//! bytes), checksum u64 (XXH3-64 of the payload). base_offset is assigned by the log on append.

pub const ENTRY_HEADER_SIZE: usize = 32;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct EntryHeader {
    pub base_offset: u64,
    pub base_timestamp_us: u64,
    pub message_count: u32,
    pub length: u32,
    pub checksum: u64,
}

const _: () = assert!(std::mem::size_of::<EntryHeader>() == ENTRY_HEADER_SIZE);
