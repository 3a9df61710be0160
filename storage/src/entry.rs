//! One log entry: a 32-byte header then `length` payload bytes. The layout is byte-identical to the
//! wire batch header of `bus::batch` (checked by a test in `shards`), so a stored entry is served to
//! a poller without transformation.
//!
//! `EntryHeader`: `base_offset` u64, `base_timestamp_us` u64, `message_count` u32, `length` u32
//! (payload bytes), `checksum` u64 (XXH3-64 of the payload), all little-endian. `base_offset` is assigned by the
//! log on append. This module only encodes and decodes; it never does I/O.

use twox_hash::XxHash3_64;

/// Bytes of [`EntryHeader`] on disk and on the wire.
pub const ENTRY_HEADER_SIZE: usize = 32;

/// The header of one entry; see the module docs and `storage/FORMAT.md` for the byte layout.
///
/// The `Pod` derive casts in native byte order; the on-disk format is little-endian, so use
/// [`EntryHeader::decode`] and [`EntryHeader::encode`] for bytes that leave memory.
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

impl EntryHeader {
    /// Decodes the first 32 bytes of `bytes` (little-endian); `None` if shorter than 32 bytes.
    /// Checks nothing about the values.
    pub fn decode(bytes: &[u8]) -> Option<EntryHeader> {
        let bytes: &[u8; ENTRY_HEADER_SIZE] = bytes.get(..ENTRY_HEADER_SIZE)?.try_into().ok()?;
        let u64_at = |at: usize| {
            let mut field = [0u8; 8];
            field.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(field)
        };
        let u32_at = |at: usize| {
            let mut field = [0u8; 4];
            field.copy_from_slice(&bytes[at..at + 4]);
            u32::from_le_bytes(field)
        };
        Some(EntryHeader {
            base_offset: u64_at(0),
            base_timestamp_us: u64_at(8),
            message_count: u32_at(16),
            length: u32_at(20),
            checksum: u64_at(24),
        })
    }

    /// Encodes the header as 32 little-endian bytes.
    pub fn encode(&self) -> [u8; ENTRY_HEADER_SIZE] {
        let mut bytes = [0u8; ENTRY_HEADER_SIZE];
        bytes[0..8].copy_from_slice(&self.base_offset.to_le_bytes());
        bytes[8..16].copy_from_slice(&self.base_timestamp_us.to_le_bytes());
        bytes[16..20].copy_from_slice(&self.message_count.to_le_bytes());
        bytes[20..24].copy_from_slice(&self.length.to_le_bytes());
        bytes[24..32].copy_from_slice(&self.checksum.to_le_bytes());
        bytes
    }
}

/// XXH3-64 (seed 0) of `payload`, the checksum stored in [`EntryHeader::checksum`].
pub fn payload_checksum(payload: &[u8]) -> u64 {
    XxHash3_64::oneshot(payload)
}

/// Builds a whole entry (header + payload) with a correct `length` and `checksum`; `base_offset` is
/// left 0 for the log to assign. For tests, benches and tools; the server builds entries from wire
/// batches instead.
///
/// # Panics
/// If `payload` is longer than `u32::MAX` bytes.
pub fn build_entry(base_timestamp_us: u64, message_count: u32, payload: &[u8]) -> Vec<u8> {
    let header = EntryHeader {
        base_offset: 0,
        base_timestamp_us,
        message_count,
        length: u32::try_from(payload.len()).expect("payload length fits u32"),
        checksum: payload_checksum(payload),
    };
    let mut entry = Vec::with_capacity(ENTRY_HEADER_SIZE + payload.len());
    entry.extend_from_slice(&header.encode());
    entry.extend_from_slice(payload);
    entry
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encode_is_little_endian_field_by_field() {
        let header = EntryHeader {
            base_offset: 0x0102_0304_0506_0708,
            base_timestamp_us: 0x1112_1314_1516_1718,
            message_count: 0x2122_2324,
            length: 0x3132_3334,
            checksum: 0x4142_4344_4546_4748,
        };
        let bytes = header.encode();
        assert_eq!(&bytes[0..8], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(
            &bytes[8..16],
            &[0x18, 0x17, 0x16, 0x15, 0x14, 0x13, 0x12, 0x11]
        );
        assert_eq!(&bytes[16..20], &[0x24, 0x23, 0x22, 0x21]);
        assert_eq!(&bytes[20..24], &[0x34, 0x33, 0x32, 0x31]);
        assert_eq!(
            &bytes[24..32],
            &[0x48, 0x47, 0x46, 0x45, 0x44, 0x43, 0x42, 0x41]
        );
        assert_eq!(EntryHeader::decode(&bytes), Some(header));
    }

    #[test]
    fn decode_rejects_short_input() {
        assert_eq!(EntryHeader::decode(&[0u8; 31]), None);
    }

    #[test]
    fn build_entry_sets_length_and_checksum() {
        let entry = build_entry(7, 3, b"abc");
        let header = EntryHeader::decode(&entry).unwrap();
        assert_eq!(header.length, 3);
        assert_eq!(header.message_count, 3);
        assert_eq!(header.base_timestamp_us, 7);
        assert_eq!(header.checksum, XxHash3_64::oneshot(b"abc"));
        assert_eq!(&entry[ENTRY_HEADER_SIZE..], b"abc");
    }
}
