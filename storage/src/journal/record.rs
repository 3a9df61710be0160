//! One journal record: a 64-byte header then `size` body bytes (the caller's serialized prepare).
//! Encoding, decoding and validation only; this module never does I/O and never interprets the
//! body. Byte layout: `storage/FORMAT.md` section 8.

use twox_hash::XxHash3_128;

use crate::limits::JOURNAL_BODY_SIZE_MAX;

/// Bytes of [`JournalHeader`] on disk.
pub const JOURNAL_HEADER_SIZE: usize = 64;

/// The header of one journal record; see `storage/FORMAT.md` section 8 for the byte layout.
///
/// The `Pod` derive casts in native byte order; the on-disk format is little-endian, so use
/// [`JournalHeader::encode`] and [`JournalHeader::decode`] for bytes that leave memory.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct JournalHeader {
    /// XXH3-128 of header bytes 16..64 (so it covers `checksum_body` and every field after it).
    pub checksum: u128,
    /// XXH3-128 of the `size` body bytes.
    pub checksum_body: u128,
    /// The prepare's op number (>= 1; op 0 is VSR's root prepare and is never journaled).
    pub op: u64,
    /// The view in which the prepare was made.
    pub view: u32,
    /// Body bytes, at most [`JOURNAL_BODY_SIZE_MAX`].
    pub size: u32,
    /// The commit number the primary knew when it prepared `op` (always < `op`).
    pub commit: u64,
    /// Zero; a record with other bytes here is invalid.
    pub reserved: u64,
}

const _: () = assert!(std::mem::size_of::<JournalHeader>() == JOURNAL_HEADER_SIZE);

/// One metadata prepare as the journal stores it: VSR's (op, view, commit) plus the opaque body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prepare {
    /// Op number, >= 1; each appended prepare has the journal's `last_op() + 1`.
    pub op: u64,
    pub view: u32,
    /// Commit number known when the prepare was made (< `op`).
    pub commit: u64,
    /// The caller's serialized prepare, at most [`JOURNAL_BODY_SIZE_MAX`] bytes.
    pub body: Vec<u8>,
}

fn u128_at(bytes: &[u8; JOURNAL_HEADER_SIZE], at: usize) -> u128 {
    let mut field = [0u8; 16];
    field.copy_from_slice(&bytes[at..at + 16]);
    u128::from_le_bytes(field)
}

fn u64_at(bytes: &[u8; JOURNAL_HEADER_SIZE], at: usize) -> u64 {
    let mut field = [0u8; 8];
    field.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(field)
}

fn u32_at(bytes: &[u8; JOURNAL_HEADER_SIZE], at: usize) -> u32 {
    let mut field = [0u8; 4];
    field.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(field)
}

/// XXH3-128 (seed 0) of header bytes 16..64: the value [`JournalHeader::checksum`] must hold.
pub fn header_checksum(header_bytes: &[u8; JOURNAL_HEADER_SIZE]) -> u128 {
    XxHash3_128::oneshot(&header_bytes[16..])
}

impl JournalHeader {
    /// The header of `prepare`, with both checksums computed.
    ///
    /// # Panics
    /// If the body is longer than [`JOURNAL_BODY_SIZE_MAX`] (the journal checks this before).
    pub fn for_prepare(prepare: &Prepare) -> JournalHeader {
        assert!(
            prepare.body.len() <= JOURNAL_BODY_SIZE_MAX as usize,
            "journal body of {} bytes exceeds JOURNAL_BODY_SIZE_MAX",
            prepare.body.len()
        );
        let mut header = JournalHeader {
            checksum: 0,
            checksum_body: XxHash3_128::oneshot(&prepare.body),
            op: prepare.op,
            view: prepare.view,
            size: prepare.body.len() as u32,
            commit: prepare.commit,
            reserved: 0,
        };
        header.checksum = header_checksum(&header.encode());
        header
    }

    /// Decodes the first 64 bytes of `bytes` (little-endian); `None` if shorter. Checks nothing.
    pub fn decode(bytes: &[u8]) -> Option<JournalHeader> {
        let bytes: &[u8; JOURNAL_HEADER_SIZE] =
            bytes.get(..JOURNAL_HEADER_SIZE)?.try_into().ok()?;
        Some(JournalHeader {
            checksum: u128_at(bytes, 0),
            checksum_body: u128_at(bytes, 16),
            op: u64_at(bytes, 32),
            view: u32_at(bytes, 40),
            size: u32_at(bytes, 44),
            commit: u64_at(bytes, 48),
            reserved: u64_at(bytes, 56),
        })
    }

    /// Encodes the header as 64 little-endian bytes.
    pub fn encode(&self) -> [u8; JOURNAL_HEADER_SIZE] {
        let mut bytes = [0u8; JOURNAL_HEADER_SIZE];
        bytes[0..16].copy_from_slice(&self.checksum.to_le_bytes());
        bytes[16..32].copy_from_slice(&self.checksum_body.to_le_bytes());
        bytes[32..40].copy_from_slice(&self.op.to_le_bytes());
        bytes[40..44].copy_from_slice(&self.view.to_le_bytes());
        bytes[44..48].copy_from_slice(&self.size.to_le_bytes());
        bytes[48..56].copy_from_slice(&self.commit.to_le_bytes());
        bytes[56..64].copy_from_slice(&self.reserved.to_le_bytes());
        bytes
    }

    /// Header bytes + body bytes of this record.
    pub fn record_size(&self) -> u64 {
        JOURNAL_HEADER_SIZE as u64 + u64::from(self.size)
    }
}

/// Appends the record of `prepare` (header then body) to `buffer`.
pub(crate) fn encode_record(prepare: &Prepare, buffer: &mut Vec<u8>) {
    let header = JournalHeader::for_prepare(prepare);
    buffer.reserve(JOURNAL_HEADER_SIZE + prepare.body.len());
    buffer.extend_from_slice(&header.encode());
    buffer.extend_from_slice(&prepare.body);
}

/// Checks the record that starts at `bytes[0]` (`bytes` runs to the end of the file) and returns
/// its header and body. Valid iff: 64 header bytes fit; the header checksum matches; `reserved` is
/// 0; `size <= JOURNAL_BODY_SIZE_MAX`; the body fits; the body checksum matches. The op is not
/// checked here (the caller knows which op it expects).
///
/// # Errors
/// Why the record is invalid, as a sentence for a `Corrupt` reason or a torn-tail warning.
pub fn parse_record(bytes: &[u8]) -> Result<(JournalHeader, &[u8]), String> {
    let Some(header_bytes) = bytes.first_chunk::<JOURNAL_HEADER_SIZE>() else {
        return Err(format!(
            "{} bytes left, less than the {JOURNAL_HEADER_SIZE}-byte record header",
            bytes.len()
        ));
    };
    let header = JournalHeader::decode(header_bytes).expect("64 bytes decode");
    let computed = header_checksum(header_bytes);
    if computed != header.checksum {
        return Err(format!(
            "header checksum {computed:#034x} differs from the stored {:#034x}",
            header.checksum
        ));
    }
    if header.reserved != 0 {
        return Err(format!(
            "reserved header bytes are {:#018x}, not 0",
            header.reserved
        ));
    }
    if header.size > JOURNAL_BODY_SIZE_MAX {
        return Err(format!(
            "body of {} bytes exceeds the {JOURNAL_BODY_SIZE_MAX}-byte limit",
            header.size
        ));
    }
    let body_end = JOURNAL_HEADER_SIZE + header.size as usize;
    let Some(body) = bytes.get(JOURNAL_HEADER_SIZE..body_end) else {
        return Err(format!(
            "body of {} bytes but only {} bytes left after the header",
            header.size,
            bytes.len() - JOURNAL_HEADER_SIZE
        ));
    };
    let computed = XxHash3_128::oneshot(body);
    if computed != header.checksum_body {
        return Err(format!(
            "body checksum {computed:#034x} differs from the header's {:#034x}",
            header.checksum_body
        ));
    }
    Ok((header, body))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn prepare(op: u64, body: &[u8]) -> Prepare {
        Prepare {
            op,
            view: 3,
            commit: op - 1,
            body: body.to_vec(),
        }
    }

    #[test]
    fn encode_is_little_endian_field_by_field() {
        let header = JournalHeader {
            checksum: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
            checksum_body: 0x1112_1314_1516_1718_191a_1b1c_1d1e_1f20,
            op: 0x2122_2324_2526_2728,
            view: 0x3132_3334,
            size: 0x4142_4344,
            commit: 0x5152_5354_5556_5758,
            reserved: 0,
        };
        let bytes = header.encode();
        assert_eq!(bytes[0], 0x10);
        assert_eq!(bytes[15], 0x01);
        assert_eq!(bytes[16], 0x20);
        assert_eq!(bytes[31], 0x11);
        assert_eq!(
            &bytes[32..40],
            &[0x28, 0x27, 0x26, 0x25, 0x24, 0x23, 0x22, 0x21]
        );
        assert_eq!(&bytes[40..44], &[0x34, 0x33, 0x32, 0x31]);
        assert_eq!(&bytes[44..48], &[0x44, 0x43, 0x42, 0x41]);
        assert_eq!(
            &bytes[48..56],
            &[0x58, 0x57, 0x56, 0x55, 0x54, 0x53, 0x52, 0x51]
        );
        assert_eq!(&bytes[56..64], &[0; 8]);
        assert_eq!(JournalHeader::decode(&bytes), Some(header));
        assert_eq!(JournalHeader::decode(&bytes[..63]), None);
    }

    #[test]
    fn checksums_cover_header_bytes_16_to_64_and_the_body() {
        let mut record = Vec::new();
        encode_record(&prepare(7, b"body bytes"), &mut record);
        assert_eq!(record.len(), JOURNAL_HEADER_SIZE + 10);
        let header = JournalHeader::decode(&record).unwrap();
        assert_eq!(header.checksum, XxHash3_128::oneshot(&record[16..64]));
        assert_eq!(header.checksum_body, XxHash3_128::oneshot(b"body bytes"));
        assert_eq!(header.size, 10);
        assert_eq!((header.op, header.view, header.commit), (7, 3, 6));
        let (parsed, body) = parse_record(&record).unwrap();
        assert_eq!(parsed, header);
        assert_eq!(body, b"body bytes");
        // Trailing bytes belong to the next record, not this one.
        record.extend_from_slice(b"next");
        assert_eq!(parse_record(&record).unwrap().1, b"body bytes");
    }

    #[test]
    fn every_flipped_bit_is_detected() {
        let mut record = Vec::new();
        encode_record(&prepare(1, b"abc"), &mut record);
        for byte_index in 0..record.len() {
            for bit in 0..8 {
                let mut damaged = record.clone();
                damaged[byte_index] ^= 1 << bit;
                assert!(
                    parse_record(&damaged).is_err(),
                    "flip of bit {bit} in byte {byte_index} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn short_and_oversized_records_are_invalid_with_reasons() {
        let mut record = Vec::new();
        encode_record(&prepare(1, b"abcdef"), &mut record);
        assert_eq!(
            parse_record(&record[..63]).unwrap_err(),
            "63 bytes left, less than the 64-byte record header"
        );
        assert_eq!(
            parse_record(&record[..66]).unwrap_err(),
            "body of 6 bytes but only 2 bytes left after the header"
        );
        // A header that claims a body over the limit, with a correct header checksum.
        let mut header = JournalHeader::decode(&record).unwrap();
        header.size = JOURNAL_BODY_SIZE_MAX + 1;
        header.checksum = header_checksum(&header.encode());
        assert_eq!(
            parse_record(&header.encode()).unwrap_err(),
            format!(
                "body of {} bytes exceeds the {JOURNAL_BODY_SIZE_MAX}-byte limit",
                JOURNAL_BODY_SIZE_MAX + 1
            )
        );
        let mut header = JournalHeader::decode(&record).unwrap();
        header.reserved = 1;
        header.checksum = header_checksum(&header.encode());
        assert_eq!(
            parse_record(&header.encode()).unwrap_err(),
            "reserved header bytes are 0x0000000000000001, not 0"
        );
        // Zeros (an unwritten hole) never form a valid header.
        assert!(
            parse_record(&[0u8; 128])
                .unwrap_err()
                .starts_with("header checksum")
        );
    }
}
