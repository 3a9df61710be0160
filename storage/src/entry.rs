//! One log entry: a 32-byte header then `length` payload bytes. The layout is byte-identical to the
//! wire batch header of `bus::batch` (checked by a test in `shards`), so a stored entry is served to
//! a poller without transformation.
//!
//! `EntryHeader`: `base_offset` u64, `base_timestamp_us` u64, `message_count` u32, `length` u32
//! (payload bytes), `checksum` u64 (XXH3-64 of the payload), all little-endian. `base_offset` is assigned by the
//! log on append. This module only encodes and decodes; it never does I/O.
//!
//! Producer stamp: the payload is owned by `bus`, except for the one rule recovery needs to
//! rebuild idempotent producers' state from the log (`storage/FORMAT.md` section 3, "Producer
//! stamp"): when bit 0 of payload bytes 12..16 (the first message's `reserved`, u32) is set and
//! the payload holds at least 48 bytes, its last 16 bytes are `producer` u64 and `sequence` u64.

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

/// Bytes of the producer stamp at the end of a stamped payload.
pub const PRODUCER_STAMP_SIZE: usize = 16;
/// Bit of payload bytes 12..16 (u32) that says the payload ends with a producer stamp.
pub const PAYLOAD_FLAG_PRODUCER_STAMP: u32 = 1;
/// Position of the flags word in the payload (the first message header's `reserved` field).
const PAYLOAD_FLAGS_AT: usize = 12;
/// Smallest stamped payload: one 32-byte message header and the stamp.
const STAMPED_PAYLOAD_SIZE_MIN: usize = 32 + PRODUCER_STAMP_SIZE;

/// One stored batch of an idempotent producer, as recovery found it in the log: enough to
/// answer a resend of it with its original offsets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProducerBatch {
    /// Producer id (non-zero).
    pub producer: u64,
    /// The producer's sequence number of the batch's first message.
    pub sequence: u64,
    /// Messages (and sequence numbers) the batch covers.
    pub message_count: u32,
    /// Offset of the batch's first message.
    pub base_offset: u64,
}

/// The (producer, sequence) stamp at the end of an entry `payload`, if its flag is set; `None`
/// for an unstamped payload, one too short to hold a stamp, or a stamp naming producer 0.
pub fn producer_stamp(payload: &[u8]) -> Option<(u64, u64)> {
    let flags = payload.get(PAYLOAD_FLAGS_AT..PAYLOAD_FLAGS_AT + 4)?;
    let flags = u32::from_le_bytes(flags.try_into().ok()?);
    if flags & PAYLOAD_FLAG_PRODUCER_STAMP == 0 || payload.len() < STAMPED_PAYLOAD_SIZE_MIN {
        return None;
    }
    let stamp = &payload[payload.len() - PRODUCER_STAMP_SIZE..];
    let producer = u64::from_le_bytes(stamp[..8].try_into().ok()?);
    let sequence = u64::from_le_bytes(stamp[8..].try_into().ok()?);
    (producer != 0).then_some((producer, sequence))
}

/// Bytes of one message header inside a payload (bus `MessageHeader`): `length` u32 at 0 is the
/// bytes of the message's own payload that follow it.
pub const MESSAGE_HEADER_SIZE: usize = 32;

/// Checks that `payload` is laid out as `message_count` messages, as bus lays out a batch's
/// message section: without its producer stamp when the first message flags one (bit 0 of payload
/// bytes 12..16), the section is exactly `message_count` messages, each a 32-byte header whose
/// `length` (u32 at 0) gives the bytes that follow it. The checksum covers these bytes but not the
/// entry header, so this is what ties the header's `message_count` and `length` to checksummed
/// data (`storage/FORMAT.md` section 3). Walks at most `payload.len() / 32` headers.
///
/// # Errors
/// A sentence naming the message that does not fit, or the two counts when they differ.
pub fn check_message_section(payload: &[u8], message_count: u32) -> Result<(), String> {
    let flagged = payload
        .get(PAYLOAD_FLAGS_AT..PAYLOAD_FLAGS_AT + 4)
        .is_some_and(|flags| u32::from(flags[0]) & PAYLOAD_FLAG_PRODUCER_STAMP != 0);
    let section = if flagged {
        if payload.len() < STAMPED_PAYLOAD_SIZE_MIN {
            return Err(format!(
                "the first message flags a producer stamp but the payload holds only {} bytes",
                payload.len()
            ));
        }
        &payload[..payload.len() - PRODUCER_STAMP_SIZE]
    } else {
        payload
    };
    let mut rest = section;
    let mut found: u32 = 0;
    while !rest.is_empty() {
        if rest.len() < MESSAGE_HEADER_SIZE {
            return Err(format!(
                "message {found}: {} bytes left, less than a {MESSAGE_HEADER_SIZE}-byte message \
                 header",
                rest.len()
            ));
        }
        let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let size = MESSAGE_HEADER_SIZE.saturating_add(length);
        if size > rest.len() {
            return Err(format!(
                "message {found} of {size} bytes runs past the payload ({} bytes left)",
                rest.len()
            ));
        }
        rest = &rest[size..];
        found = found.saturating_add(1);
    }
    if found != message_count {
        return Err(format!(
            "header declares {message_count} messages but the payload holds {found}"
        ));
    }
    Ok(())
}

/// Lays `payload` out as `message_count` messages (bus layout, see [`check_message_section`]):
/// message 0 holds all of `payload`, the others are empty. Each message header carries its
/// `offset_delta` (its index) and the XXH3-64 of its payload as bus writes them; no stamp flag,
/// zero ids and timestamps. For tests, benches and tools.
pub fn message_section(message_count: u32, payload: &[u8]) -> Vec<u8> {
    let count = message_count as usize;
    let mut section = Vec::with_capacity(count * MESSAGE_HEADER_SIZE + payload.len());
    for index in 0..message_count {
        let mut header = [0u8; MESSAGE_HEADER_SIZE];
        let own_payload: &[u8] = if index == 0 { payload } else { &[] };
        let length = u32::try_from(own_payload.len()).unwrap_or(u32::MAX);
        header[0..4].copy_from_slice(&length.to_le_bytes());
        header[4..8].copy_from_slice(&index.to_le_bytes());
        header[24..32].copy_from_slice(&payload_checksum(own_payload).to_le_bytes());
        section.extend_from_slice(&header);
        section.extend_from_slice(own_payload);
    }
    section
}

/// XXH3-64 (seed 0) of `payload`, the checksum stored in [`EntryHeader::checksum`].
pub fn payload_checksum(payload: &[u8]) -> u64 {
    XxHash3_64::oneshot(payload)
}

/// Builds a whole entry (header + payload) whose payload is `payload` laid out as
/// `message_count` messages by [`message_section`] (message 0 holds `payload`), with a correct
/// `length` and `checksum`; `base_offset` is left 0 for the log to assign. For tests, benches and
/// tools; the server builds entries from wire batches instead.
///
/// # Panics
/// If the payload is longer than `u32::MAX` bytes.
pub fn build_entry(base_timestamp_us: u64, message_count: u32, payload: &[u8]) -> Vec<u8> {
    build_entry_raw(
        base_timestamp_us,
        message_count,
        &message_section(message_count, payload),
    )
}

/// Builds a whole entry around `section`, used as the payload byte for byte (it should already
/// be laid out as `message_count` messages, see [`check_message_section`]), with a correct
/// `length` and `checksum`; `base_offset` is left 0. For tests and tools that shape payloads
/// themselves (producer stamps, damaged sections).
///
/// # Panics
/// If `section` is longer than `u32::MAX` bytes.
pub fn build_entry_raw(base_timestamp_us: u64, message_count: u32, section: &[u8]) -> Vec<u8> {
    let header = EntryHeader {
        base_offset: 0,
        base_timestamp_us,
        message_count,
        length: u32::try_from(section.len()).expect("payload length fits u32"),
        checksum: payload_checksum(section),
    };
    let mut entry = Vec::with_capacity(ENTRY_HEADER_SIZE + section.len());
    entry.extend_from_slice(&header.encode());
    entry.extend_from_slice(section);
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
    fn issue7_5_producer_stamp_is_read_from_the_payload_end() {
        let mut payload = vec![0u8; 32 + 5];
        payload[12] = 1;
        payload.extend_from_slice(&7u64.to_le_bytes());
        payload.extend_from_slice(&41u64.to_le_bytes());
        assert_eq!(producer_stamp(&payload), Some((7, 41)));
        payload[12] = 0;
        assert_eq!(producer_stamp(&payload), None);
        payload[12] = 1;
        assert_eq!(producer_stamp(&payload[..47]), None);
        payload[37..45].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(producer_stamp(&payload), None);
    }

    #[test]
    fn decode_rejects_short_input() {
        assert_eq!(EntryHeader::decode(&[0u8; 31]), None);
    }

    #[test]
    fn build_entry_sets_length_and_checksum() {
        let entry = build_entry(7, 3, b"abc");
        let header = EntryHeader::decode(&entry).unwrap();
        assert_eq!(header.length, 3 * 32 + 3);
        assert_eq!(header.message_count, 3);
        assert_eq!(header.base_timestamp_us, 7);
        let payload = &entry[ENTRY_HEADER_SIZE..];
        assert_eq!(header.checksum, XxHash3_64::oneshot(payload));
        assert_eq!(&payload[..4], &3u32.to_le_bytes());
        assert_eq!(&payload[32..35], b"abc");
        assert_eq!(&payload[35 + 4..35 + 8], &1u32.to_le_bytes());
        assert_eq!(check_message_section(payload, 3), Ok(()));
    }

    #[test]
    fn issue7_1_message_section_must_match_the_declared_count() {
        let section = message_section(1, b"msg-3");
        assert_eq!(check_message_section(&section, 1), Ok(()));
        assert_eq!(
            check_message_section(&section, 3),
            Err("header declares 3 messages but the payload holds 1".to_owned())
        );
        assert_eq!(
            check_message_section(&section[..36], 1),
            Err("message 0 of 37 bytes runs past the payload (36 bytes left)".to_owned())
        );
        let mut trailing = section.clone();
        trailing.extend_from_slice(&[0u8; 5]);
        assert_eq!(
            check_message_section(&trailing, 1),
            Err("message 1: 5 bytes left, less than a 32-byte message header".to_owned())
        );
        assert_eq!(
            check_message_section(b"", 1),
            Err("header declares 1 messages but the payload holds 0".to_owned())
        );
        let mut stamped = section.clone();
        stamped[12] = 1;
        stamped.extend_from_slice(&[7u8; PRODUCER_STAMP_SIZE]);
        assert_eq!(check_message_section(&stamped, 1), Ok(()));
        assert_eq!(
            check_message_section(&stamped[..20], 1),
            Err(
                "the first message flags a producer stamp but the payload holds only 20 bytes"
                    .to_owned()
            )
        );
    }
}
