//! One log entry: a 32-byte header then `length` payload bytes. The layout is byte-identical to the
//! wire batch header of `bus::batch` (checked by a test in `shards`), so a stored entry is served to
//! a poller without transformation.
//!
//! `EntryHeader`: `base_offset` u64, `base_timestamp_us` u64, `message_count` u32, `length` u32
//! (payload bytes), `checksum` u64, all little-endian. `base_offset` is assigned by the log on
//! append. This module only encodes, decodes and checks; it never does I/O.
//!
//! Checksum rule (issue 12 item 1; `storage/FORMAT.md` section 3), mirroring `bus::ChecksumRule`:
//! when bit 1 of payload bytes 12..16 (the first message's `reserved`, u32) is set, `checksum` is
//! XXH3-64 of the payload with every message's own payload left out (the 32-byte message headers
//! in order, then the producer stamp when flagged), and each message header's checksum (u64 at
//! 24) is XXH3-64 of its payload; otherwise (every entry before issue 12) `checksum` is XXH3-64
//! of the whole payload. [`check_payload`] verifies either, the flagged one in one pass.
//! Timestamp rule (issue 12, "checksums still catch every flipped byte ... on disk"): when bit 2
//! of the flags is set, the bytes either rule hashes are preceded by the header's
//! `base_timestamp_us` (8 bytes, little-endian), so the checksum covers the timestamp that
//! retention by age and consumers read.
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
/// Bit of payload bytes 12..16 (u32) that says the entry checksum covers the message headers
/// and the stamp, each message checksum its own payload (`bus::MESSAGE_FLAG_CHECKSUM_OF_HEADERS`,
/// issue 12 item 1).
pub const PAYLOAD_FLAG_CHECKSUM_OF_HEADERS: u32 = 2;
/// Bit of payload bytes 12..16 (u32) that says the entry checksum's input starts with the entry
/// header's `base_timestamp_us` (8 bytes, little-endian), under either rule
/// (`bus::MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP`; `storage/FORMAT.md` section 3).
pub const PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP: u32 = 4;
/// Message-header bytes gathered on the stack per call of the streaming XXH3-64 of the
/// message-headers rule (32 headers), as `bus` does.
const HEADERS_STAGE_SIZE: usize = 1024;
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
    let (section, _stamp) = split_stamp(payload)?;
    let mut rest = section;
    let mut found: u32 = 0;
    while !rest.is_empty() {
        rest = &rest[message_size(rest, found)?..];
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

/// XXH3-64 (seed 0) of `payload`: a message's checksum of its payload, and the
/// [`EntryHeader::checksum`] of an entry without `PAYLOAD_FLAG_CHECKSUM_OF_HEADERS` (the rule
/// before issue 12). [`entry_checksum`] picks the rule.
pub fn payload_checksum(payload: &[u8]) -> u64 {
    XxHash3_64::oneshot(payload)
}

/// Whether `payload`'s first message flags the message-headers checksum rule (bit 1 of payload
/// bytes 12..16); `false` when the payload is too short to hold the flags.
pub fn checksums_message_headers(payload: &[u8]) -> bool {
    payload
        .get(PAYLOAD_FLAGS_AT..PAYLOAD_FLAGS_AT + 4)
        .is_some_and(|flags| u32::from(flags[0]) & PAYLOAD_FLAG_CHECKSUM_OF_HEADERS != 0)
}

/// Whether `payload`'s first message flags the timestamp rule (bit 2 of payload bytes 12..16);
/// `false` when the payload is too short to hold the flags.
pub fn checksum_covers_timestamp(payload: &[u8]) -> bool {
    payload
        .get(PAYLOAD_FLAGS_AT..PAYLOAD_FLAGS_AT + 4)
        .is_some_and(|flags| u32::from(flags[0]) & PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP != 0)
}

/// The whole-payload rule's checksum of an entry whose timestamp is `base_timestamp_us`: XXH3-64
/// of `payload`, preceded by the timestamp's 8 little-endian bytes when the payload flags the
/// timestamp rule.
fn whole_payload_checksum(base_timestamp_us: u64, payload: &[u8]) -> u64 {
    if !checksum_covers_timestamp(payload) {
        return payload_checksum(payload);
    }
    let mut hasher = XxHash3_64::new();
    std::hash::Hasher::write(&mut hasher, &base_timestamp_us.to_le_bytes());
    std::hash::Hasher::write(&mut hasher, payload);
    std::hash::Hasher::finish(&hasher)
}

/// The streaming XXH3-64 of the message-headers rule: message headers in order, then the stamp,
/// gathered `HEADERS_STAGE_SIZE` bytes at a time. Equals `XxHash3_64::oneshot` of the
/// concatenation.
struct MessageHeadersChecksum {
    hasher: XxHash3_64,
    stage: [u8; HEADERS_STAGE_SIZE],
    staged_len: usize,
}

impl MessageHeadersChecksum {
    /// A hasher for the entry whose timestamp is `base_timestamp_us` and payload `payload`, fed
    /// the timestamp first when the payload flags the timestamp rule.
    fn new(base_timestamp_us: u64, payload: &[u8]) -> MessageHeadersChecksum {
        let mut checksum = MessageHeadersChecksum {
            hasher: XxHash3_64::new(),
            stage: [0; HEADERS_STAGE_SIZE],
            staged_len: 0,
        };
        if checksum_covers_timestamp(payload) {
            checksum.push(&base_timestamp_us.to_le_bytes());
        }
        checksum
    }

    fn push(&mut self, bytes: &[u8]) {
        if self.staged_len + bytes.len() > HEADERS_STAGE_SIZE {
            std::hash::Hasher::write(&mut self.hasher, &self.stage[..self.staged_len]);
            self.staged_len = 0;
            if bytes.len() > HEADERS_STAGE_SIZE {
                std::hash::Hasher::write(&mut self.hasher, bytes);
                return;
            }
        }
        self.stage[self.staged_len..self.staged_len + bytes.len()].copy_from_slice(bytes);
        self.staged_len += bytes.len();
    }

    fn finish(mut self) -> u64 {
        std::hash::Hasher::write(&mut self.hasher, &self.stage[..self.staged_len]);
        std::hash::Hasher::finish(&self.hasher)
    }
}

/// The messages of `payload` and its stamp (empty when not flagged).
///
/// # Errors
/// A flagged payload too short for a message header and the stamp.
fn split_stamp(payload: &[u8]) -> Result<(&[u8], &[u8]), String> {
    let flagged = payload
        .get(PAYLOAD_FLAGS_AT..PAYLOAD_FLAGS_AT + 4)
        .is_some_and(|flags| u32::from(flags[0]) & PAYLOAD_FLAG_PRODUCER_STAMP != 0);
    if !flagged {
        return Ok((payload, &[]));
    }
    if payload.len() < STAMPED_PAYLOAD_SIZE_MIN {
        return Err(format!(
            "the first message flags a producer stamp but the payload holds only {} bytes",
            payload.len()
        ));
    }
    Ok(payload.split_at(payload.len() - PRODUCER_STAMP_SIZE))
}

/// The [`EntryHeader::checksum`] an entry whose timestamp is `base_timestamp_us` needs for
/// `payload` by the rules its first message flags: XXH3-64 of the whole payload, or under the
/// message-headers rule of the message headers the framing walk reaches (it stops at the first
/// message that does not fit) then the stamp; under the timestamp rule, preceded by the
/// timestamp. Defined for any bytes, so that tests and tools can build damaged entries with a
/// matching checksum.
pub fn entry_checksum(base_timestamp_us: u64, payload: &[u8]) -> u64 {
    if !checksums_message_headers(payload) {
        return whole_payload_checksum(base_timestamp_us, payload);
    }
    let (mut rest, stamp) = split_stamp(payload).unwrap_or((payload, &[]));
    let mut checksum = MessageHeadersChecksum::new(base_timestamp_us, payload);
    while rest.len() >= MESSAGE_HEADER_SIZE {
        let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
        let size = MESSAGE_HEADER_SIZE.saturating_add(length);
        if size > rest.len() {
            break;
        }
        checksum.push(&rest[..MESSAGE_HEADER_SIZE]);
        rest = &rest[size..];
    }
    checksum.push(stamp);
    checksum.finish()
}

/// Verifies `payload` against its entry `header`'s `checksum` and `message_count` by the rules its
/// first message flags (`storage/FORMAT.md` section 3): without bit 1, XXH3-64 of the payload
/// equals `checksum`, then [`check_message_section`]; with it, in one pass, the message section
/// frames exactly `message_count` messages, each message's payload hashes to its header's
/// checksum, and the XXH3-64 of the message headers then the stamp equals `checksum`; with bit 2,
/// either hash starts with the header's `base_timestamp_us`. Either way each payload byte is
/// hashed once (the old rule does not check message checksums: the server checked them before
/// the append). Walks at most `payload.len() / 32` headers.
///
/// # Errors
/// A sentence starting "payload checksum" when a payload's checksum differs (the whole
/// payload's without the flag; under it, the message's, naming it), one starting "entry
/// checksum" when, under the flag, the checksum of the message headers and stamp differs
/// (`storage/FORMAT.md` section 3, "Which checksum protects what"), or why the messages do not
/// match the header ([`check_message_section`]'s sentences).
pub fn check_payload(header: &EntryHeader, payload: &[u8]) -> Result<(), String> {
    let EntryHeader {
        base_timestamp_us,
        message_count,
        checksum,
        ..
    } = *header;
    if !checksums_message_headers(payload) {
        let computed = whole_payload_checksum(base_timestamp_us, payload);
        if computed != checksum {
            return Err(format!(
                "payload checksum {computed:#018x}{} differs from the header's {checksum:#018x}",
                timestamp_named(payload)
            ));
        }
        return check_message_section(payload, message_count);
    }
    let (section, stamp) = split_stamp(payload)?;
    let mut headers_checksum = MessageHeadersChecksum::new(base_timestamp_us, payload);
    let mut rest = section;
    let mut found: u32 = 0;
    while !rest.is_empty() {
        let size = message_size(rest, found)?;
        let (message, next) = rest.split_at(size);
        let (header, own_payload) = message.split_at(MESSAGE_HEADER_SIZE);
        let recorded = u64::from_le_bytes(header[24..32].try_into().expect("8 bytes"));
        let computed = payload_checksum(own_payload);
        if computed != recorded {
            let offset_delta = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
            return Err(format!(
                "payload checksum of message {found} (offset_delta {offset_delta}, {} bytes) \
                 {computed:#018x} differs from its message header's {recorded:#018x}",
                own_payload.len()
            ));
        }
        headers_checksum.push(header);
        rest = next;
        found = found.saturating_add(1);
    }
    if found != message_count {
        return Err(format!(
            "header declares {message_count} messages but the payload holds {found}"
        ));
    }
    headers_checksum.push(stamp);
    let computed = headers_checksum.finish();
    if computed != checksum {
        return Err(format!(
            "entry checksum {computed:#018x} of the{} message headers and stamp differs from the \
             header's {checksum:#018x}",
            timestamp_named(payload)
        ));
    }
    Ok(())
}

/// The newest message timestamp of an entry, in microseconds since the Unix epoch: the header's
/// `base_timestamp_us` plus the largest `timestamp_delta_us` (u32 at bytes 8..12 of each message
/// header, bus layout) among its messages; the base alone when the payload holds no whole
/// message. Saturates at `u64::MAX`. Meaningful for a payload that passed [`check_payload`]
/// (under the timestamp rule every input is then checksummed).
pub fn newest_message_timestamp_us(header: &EntryHeader, payload: &[u8]) -> u64 {
    let (mut rest, _stamp) = split_stamp(payload).unwrap_or((payload, &[]));
    let mut newest_delta: u32 = 0;
    while !rest.is_empty() {
        let Ok(size) = message_size(rest, 0) else {
            break;
        };
        let delta = u32::from_le_bytes([rest[8], rest[9], rest[10], rest[11]]);
        newest_delta = newest_delta.max(delta);
        rest = &rest[size..];
    }
    header
        .base_timestamp_us
        .saturating_add(u64::from(newest_delta))
}

/// The words a checksum error adds when the checksum covers the entry header's timestamp too, so
/// that a reader of the error knows a damaged timestamp is one of the candidates.
fn timestamp_named(payload: &[u8]) -> &'static str {
    if !checksum_covers_timestamp(payload) {
        return "";
    }
    if checksums_message_headers(payload) {
        " base timestamp,"
    } else {
        " (of the base timestamp and payload)"
    }
}

/// Bytes of the message at the start of `rest` (header and its payload), the message being the
/// `index`th of its section.
///
/// # Errors
/// The message header or its payload runs past the end of `rest`.
fn message_size(rest: &[u8], index: u32) -> Result<usize, String> {
    if rest.len() < MESSAGE_HEADER_SIZE {
        return Err(format!(
            "message {index}: {} bytes left, less than a {MESSAGE_HEADER_SIZE}-byte message \
             header",
            rest.len()
        ));
    }
    let length = u32::from_le_bytes([rest[0], rest[1], rest[2], rest[3]]) as usize;
    let size = MESSAGE_HEADER_SIZE.saturating_add(length);
    if size > rest.len() {
        return Err(format!(
            "message {index} of {size} bytes runs past the payload ({} bytes left)",
            rest.len()
        ));
    }
    Ok(size)
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
/// `length` and a `checksum` by the rule the section flags ([`entry_checksum`]); `base_offset`
/// is left 0. For tests and tools that shape payloads themselves (producer stamps, damaged
/// sections, the message-headers rule).
///
/// # Panics
/// If `section` is longer than `u32::MAX` bytes.
pub fn build_entry_raw(base_timestamp_us: u64, message_count: u32, section: &[u8]) -> Vec<u8> {
    let header = EntryHeader {
        base_offset: 0,
        base_timestamp_us,
        message_count,
        length: u32::try_from(section.len()).expect("payload length fits u32"),
        checksum: entry_checksum(base_timestamp_us, section),
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

    /// The entry header `check_payload` is given: `message_count`, `checksum`, timestamp 0.
    fn header_of(message_count: u32, checksum: u64) -> EntryHeader {
        EntryHeader {
            base_offset: 0,
            base_timestamp_us: 0,
            message_count,
            length: 0,
            checksum,
        }
    }

    /// A stamped section of 3 messages (payloads "ab", "", "cdef") under the message-headers
    /// rule, as `bus::BatchBuilder` laid it out before the timestamp rule.
    fn message_headers_section() -> Vec<u8> {
        let mut section = Vec::new();
        for (index, payload) in [&b"ab"[..], b"", b"cdef"].into_iter().enumerate() {
            let mut header = [0u8; MESSAGE_HEADER_SIZE];
            header[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
            header[4..8].copy_from_slice(&(index as u32).to_le_bytes());
            header[16..24].copy_from_slice(&(100 + index as u64).to_le_bytes());
            header[24..32].copy_from_slice(&payload_checksum(payload).to_le_bytes());
            section.extend_from_slice(&header);
            section.extend_from_slice(payload);
        }
        section[PAYLOAD_FLAGS_AT] =
            (PAYLOAD_FLAG_CHECKSUM_OF_HEADERS | PAYLOAD_FLAG_PRODUCER_STAMP) as u8;
        section.extend_from_slice(&7u64.to_le_bytes());
        section.extend_from_slice(&1u64.to_le_bytes());
        section
    }

    #[test]
    fn issue12_1_message_headers_rule_hashes_headers_and_stamp_only() {
        let section = message_headers_section();
        assert!(checksums_message_headers(&section));
        let headers = [
            &section[0..32],
            &section[34..66],
            &section[66..98],
            &section[102..118],
        ]
        .concat();
        assert_eq!(section.len(), 118);
        assert_eq!(entry_checksum(5, &section), XxHash3_64::oneshot(&headers));
        let entry = build_entry_raw(5, 3, &section);
        let header = EntryHeader::decode(&entry).unwrap();
        assert_eq!(header.checksum, XxHash3_64::oneshot(&headers));
        assert_eq!(check_payload(&header, &section), Ok(()));
        assert_eq!(producer_stamp(&section), Some((7, 1)));
        assert_eq!(check_message_section(&section, 3), Ok(()));
        // An entry without the flag keeps the rule before issue 12.
        let old = build_entry(5, 2, b"xyz");
        let old_header = EntryHeader::decode(&old).unwrap();
        assert!(!checksums_message_headers(&old[ENTRY_HEADER_SIZE..]));
        assert_eq!(
            old_header.checksum,
            XxHash3_64::oneshot(&old[ENTRY_HEADER_SIZE..])
        );
        assert_eq!(
            check_payload(&old_header, &old[ENTRY_HEADER_SIZE..]),
            Ok(())
        );
    }

    #[test]
    fn issue12_1_message_headers_rule_names_what_fails() {
        let section = message_headers_section();
        let checksum = entry_checksum(0, &section);
        let flipped = |at: usize| {
            let mut bytes = section.clone();
            bytes[at] ^= 0x20;
            check_payload(&header_of(3, checksum), &bytes).unwrap_err()
        };
        // Message 2's payload "cdef" (at 98..102).
        let damaged = payload_checksum(b"cdEf");
        assert_eq!(
            flipped(100),
            format!(
                "payload checksum of message 2 (offset_delta 2, 4 bytes) {damaged:#018x} differs \
                 from its message header's {:#018x}",
                payload_checksum(b"cdef")
            )
        );
        // Message 1's id, then the stamp: only the headers checksum sees them.
        for at in [34 + 16, 110] {
            let reason = flipped(at);
            assert!(
                reason.starts_with("entry checksum ")
                    && reason
                        .contains(" of the message headers and stamp differs from the header's"),
                "{reason}"
            );
        }
        // The entry header's count, then its checksum.
        assert_eq!(
            check_payload(&header_of(4, checksum), &section).unwrap_err(),
            "header declares 4 messages but the payload holds 3"
        );
        assert!(check_payload(&header_of(3, checksum ^ 1), &section).is_err());
        // Every single flipped bit of the payload fails, the flag bits included.
        for bit in 0..section.len() * 8 {
            let mut bytes = section.clone();
            bytes[bit / 8] ^= 1 << (bit % 8);
            assert!(
                check_payload(&header_of(3, checksum), &bytes).is_err(),
                "bit {bit} of the payload"
            );
        }
    }

    /// Issue 12 ("checksums still catch every flipped byte ... in a batch header ... on disk"),
    /// timestamp rule: with bit 2 the entry checksum starts with `base_timestamp_us`, so every
    /// flipped bit of the timestamp fails the entry, under either rule, and the error names the
    /// timestamp among what the checksum covers; without bit 2 the timestamp is not covered.
    #[test]
    fn issue12_timestamp_rule_catches_every_flipped_bit_of_the_base_timestamp() {
        let mut headers_rule = message_headers_section();
        headers_rule[PAYLOAD_FLAGS_AT] |= PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
        let mut whole_rule = message_section(2, b"xyz");
        whole_rule[PAYLOAD_FLAGS_AT] |= PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
        for (section, count) in [(&headers_rule, 3), (&whole_rule, 2)] {
            assert!(checksum_covers_timestamp(section));
            let entry = build_entry_raw(1_795_900_000_000_000, count, section);
            let header = EntryHeader::decode(&entry).unwrap();
            let hashed_first = 1_795_900_000_000_000u64.to_le_bytes();
            assert_ne!(header.checksum, entry_checksum(0, section));
            assert_eq!(check_payload(&header, section), Ok(()));
            for bit in 0..64 {
                let damaged = EntryHeader {
                    base_timestamp_us: header.base_timestamp_us ^ (1 << bit),
                    ..header
                };
                let reason = check_payload(&damaged, section).unwrap_err();
                assert!(reason.contains("base timestamp"), "bit {bit}: {reason}");
            }
            // What the checksum hashes: the timestamp's 8 bytes, then the rule's bytes.
            if count == 2 {
                let hashed = [&hashed_first[..], section].concat();
                assert_eq!(header.checksum, XxHash3_64::oneshot(&hashed));
            }
        }
        assert_eq!(
            check_payload(&header_of(3, 1), &headers_rule).unwrap_err(),
            format!(
                "entry checksum {:#018x} of the base timestamp, message headers and stamp \
                 differs from the header's {:#018x}",
                entry_checksum(0, &headers_rule),
                1
            )
        );
        // Without bit 2 any timestamp passes (entries written before the rule).
        let old = build_entry(5, 2, b"xyz");
        let mut header = EntryHeader::decode(&old).unwrap();
        header.base_timestamp_us ^= 1 << 40;
        assert!(!checksum_covers_timestamp(&old[ENTRY_HEADER_SIZE..]));
        assert_eq!(check_payload(&header, &old[ENTRY_HEADER_SIZE..]), Ok(()));
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
