//! Message batches: the `SendMessages` body and the `PollMessages` reply body, byte-identical to the
//! storage entry (a test in `shards` checks the two layouts and checksum rules agree).
//!
//! Batch: `BatchHeader` (32 bytes) then `message_count` messages, each `MessageHeader` (32 bytes)
//! then payload. All integers little-endian.
//!
//! `BatchHeader`: 0 `base_offset` u64, 8 `base_timestamp_us` u64, 16 `message_count` u32,
//! 20 `length` u32 (bytes after the batch header: the *message section*), 24 `checksum` u64
//! (XXH3-64, over the bytes the checksum rule below names).
//!
//! `MessageHeader`: 0 `length` u32 (payload bytes), 4 `offset_delta` u32 (= index in the batch),
//! 8 `timestamp_delta_us` u32, 12 `reserved` u32 (flags, first message only), 16 `id` u64,
//! 24 `checksum` u64 (XXH3-64 of the payload).
//!
//! A message's offset is `base_offset + offset_delta` and its timestamp
//! `base_timestamp_us + timestamp_delta_us`. `base_offset` is assigned by the owner shard after
//! validation and is not covered by the checksum.
//!
//! Checksum rule (issue 12 item 1, "hash each byte once"), chosen per batch by bit 1
//! (`MESSAGE_FLAG_CHECKSUM_OF_HEADERS`) of the first message's `reserved`:
//! - set (`ChecksumRule::MessageHeaders`, what `BatchBuilder` writes since issue 12): the batch
//!   `checksum` is XXH3-64 of the message section with every payload left out, i.e. of the
//!   32-byte message headers in order, then the producer stamp when flagged. Each message header
//!   holds the XXH3-64 of its own payload, so every byte of the section is covered, and verifying
//!   the batch hashes each payload byte once (its message checksum) plus 32 bytes per message.
//! - clear (`ChecksumRule::Section`, every batch built before issue 12): the batch `checksum` is
//!   XXH3-64 of the whole message section; the message checksums are then a second pass.
//!
//! Timestamp rule (issue 12, "checksums still catch every flipped byte ... on disk"): when bit 2
//! (`MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP`) of the first message's `reserved` is set, the bytes the
//! rule above hashes are preceded by the batch header's `base_timestamp_us` (8 bytes,
//! little-endian), so the checksum covers the one header field the owner shard neither assigns
//! (`base_offset`) nor ties to the section (`message_count`, `length`). `BatchBuilder` sets it on
//! every batch; a batch without it (built before this rule) keeps an unprotected timestamp.
//!
//! Either way the flags sit in a hashed message header, so flipping one fails the batch checksum.
//! `BatchView::parse` verifies a batch by its rule (one pass over the payloads under
//! `MessageHeaders`); `BatchView::parse_verified` also checks the message checksums of a
//! `Section` batch, which is what the server requires of a `SendMessages` batch before it stores
//! it. `storage/FORMAT.md` section 3 ("Which checksum protects what") says what each receiver
//! checks.
//!
//! Producer stamp (idempotent sends): when bit 0 (`MESSAGE_FLAG_PRODUCER_STAMP`) of the first
//! message's `reserved` is set, the message section ends with a 16-byte `ProducerStamp` after the
//! last message: 0 `producer` u64 (non-zero), 8 `sequence` u64 (the producer's sequence number of
//! the first message; message `i` has `sequence + i`). It is inside `length` and covered by the
//! checksum (either rule), so the stored entry carries it and recovery rebuilds deduplication from
//! the log (`storage/FORMAT.md` section 3). A batch without the flag has no stamp (every batch
//! before issue 7). Other `reserved` bits, and the `reserved` field of later messages, carry no
//! meaning.
//!
//! Parsing never panics and never reads out of bounds, whatever the bytes.

use crate::limits::BATCH_MESSAGE_COUNT_MAX;

pub const BATCH_HEADER_SIZE: usize = 32;
pub const MESSAGE_HEADER_SIZE: usize = 32;
/// Bytes of a [`ProducerStamp`] at the end of a stamped batch's message section.
pub const PRODUCER_STAMP_SIZE: usize = 16;
/// Bit of the first message's `reserved` field saying the batch ends with a [`ProducerStamp`].
pub const MESSAGE_FLAG_PRODUCER_STAMP: u32 = 1;
/// Bit of the first message's `reserved` field saying the batch `checksum` covers the message
/// headers and the stamp, not the payloads ([`ChecksumRule::MessageHeaders`]; issue 12 item 1).
pub const MESSAGE_FLAG_CHECKSUM_OF_HEADERS: u32 = 2;
/// Bit of the first message's `reserved` field saying the batch `checksum`'s input starts with the
/// batch header's `base_timestamp_us` (8 bytes, little-endian), before the bytes its
/// [`ChecksumRule`] names (module docs, "Timestamp rule"; `storage/FORMAT.md` section 3).
pub const MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP: u32 = 4;
/// Every bit of the first message's `reserved` field this release gives a meaning (bits 0..=2). A
/// batch setting another is refused by [`BatchView::parse_for_append`]: a later release may give
/// the bit a meaning (as bit 1 and 2 changed the checksum), and must never meet stored entries
/// where it meant nothing.
pub const MESSAGE_FLAGS_KNOWN: u32 = MESSAGE_FLAG_PRODUCER_STAMP
    | MESSAGE_FLAG_CHECKSUM_OF_HEADERS
    | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP;
/// Message-header bytes gathered on the stack before they are fed to the streaming XXH3-64 of
/// [`ChecksumRule::MessageHeaders`] (32 headers): one hasher call per 1 KiB instead of one per
/// 32-byte header. Measured (`benches/benches/codec.rs`, group `message_headers_checksum`, 1000
/// headers of a 1 MB batch): one streaming write per header ~18 µs, this stage ~11 µs, all
/// headers gathered into a heap buffer and hashed at once ~7.5 µs but with a per-batch
/// allocation of up to 32 MiB (`BATCH_MESSAGE_COUNT_MAX` headers); the payload checks of the same
/// batch take ~70 µs.
const HEADERS_STAGE_SIZE: usize = 1024;
/// Position of the first message's `reserved` field in the message section.
const FIRST_RESERVED_AT: usize = 12;

/// An idempotent producer's mark on a batch: who sent it and the sequence number of its first
/// message in this partition (each message takes one).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProducerStamp {
    /// Producer id, never 0 (0 on the wire means "not idempotent").
    pub producer: u64,
    /// Sequence number of the batch's first message.
    pub sequence: u64,
}

impl ProducerStamp {
    fn encode(self) -> [u8; PRODUCER_STAMP_SIZE] {
        let mut bytes = [0u8; PRODUCER_STAMP_SIZE];
        bytes[..8].copy_from_slice(&self.producer.to_le_bytes());
        bytes[8..].copy_from_slice(&self.sequence.to_le_bytes());
        bytes
    }

    /// The stamp of a message section whose first message carries the flag, unchecked; `None`
    /// when the flag is clear or the section is too short to hold a message and a stamp.
    fn of_section(section: &[u8]) -> Option<ProducerStamp> {
        let flags = section.get(FIRST_RESERVED_AT..FIRST_RESERVED_AT + 4)?;
        let flags = u32::from_le_bytes(flags.try_into().ok()?);
        if flags & MESSAGE_FLAG_PRODUCER_STAMP == 0
            || section.len() < MESSAGE_HEADER_SIZE + PRODUCER_STAMP_SIZE
        {
            return None;
        }
        let stamp = &section[section.len() - PRODUCER_STAMP_SIZE..];
        let u64_at = |at: usize| {
            let mut field = [0u8; 8];
            field.copy_from_slice(&stamp[at..at + 8]);
            u64::from_le_bytes(field)
        };
        Some(ProducerStamp {
            producer: u64_at(0),
            sequence: u64_at(8),
        })
    }
}

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

/// XXH3-64 (seed 0), the checksum of payloads and, by the batch's rule, of its message section.
fn checksum64(bytes: &[u8]) -> u64 {
    twox_hash::XxHash3_64::oneshot(bytes)
}

/// Which bytes a batch header's `checksum` covers (module docs; issue 12 item 1), chosen by bit 1
/// (`MESSAGE_FLAG_CHECKSUM_OF_HEADERS`) of the first message's `reserved` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChecksumRule {
    /// XXH3-64 of the whole message section (flag clear: every batch before issue 12). The
    /// message checksums are a second hash of the payloads (`BatchView::verify_messages`).
    Section,
    /// XXH3-64 of the message headers in order, then the producer stamp when flagged (flag set:
    /// `BatchBuilder` since issue 12). Each message checksum covers its payload, so a verifier
    /// hashes every payload byte once.
    MessageHeaders,
}

impl ChecksumRule {
    /// The rule a message section's first message flags; `Section` when the section is too short
    /// to hold the flags word.
    pub fn of_section(section: &[u8]) -> ChecksumRule {
        let flagged = section
            .get(FIRST_RESERVED_AT..FIRST_RESERVED_AT + 4)
            .is_some_and(|flags| u32::from(flags[0]) & MESSAGE_FLAG_CHECKSUM_OF_HEADERS != 0);
        if flagged {
            ChecksumRule::MessageHeaders
        } else {
            ChecksumRule::Section
        }
    }
}

/// Whether a message section's first message flags the timestamp rule
/// (`MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP`); `false` when the section is too short to hold the flags
/// word.
pub fn checksum_covers_timestamp(section: &[u8]) -> bool {
    section
        .get(FIRST_RESERVED_AT..FIRST_RESERVED_AT + 4)
        .is_some_and(|flags| u32::from(flags[0]) & MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP != 0)
}

/// The streaming XXH3-64 of [`ChecksumRule::MessageHeaders`]: fed each 32-byte message header in
/// order, then the producer stamp; gathers `HEADERS_STAGE_SIZE` bytes on the stack per hasher
/// call. The result equals `XxHash3_64::oneshot` of the concatenation.
struct MessageHeadersChecksum {
    hasher: twox_hash::XxHash3_64,
    stage: [u8; HEADERS_STAGE_SIZE],
    staged_len: usize,
}

impl MessageHeadersChecksum {
    fn new() -> MessageHeadersChecksum {
        MessageHeadersChecksum {
            hasher: twox_hash::XxHash3_64::new(),
            stage: [0; HEADERS_STAGE_SIZE],
            staged_len: 0,
        }
    }

    /// Adds bytes (a message header, or the stamp) after those pushed before.
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

/// The XXH3-64 of [`ChecksumRule::Section`] for a batch whose timestamp is `base_timestamp_us`:
/// of the whole section, preceded by the timestamp's 8 little-endian bytes when the section flags
/// the timestamp rule.
fn whole_section_checksum(base_timestamp_us: u64, section: &[u8]) -> u64 {
    if !checksum_covers_timestamp(section) {
        return checksum64(section);
    }
    let mut hasher = twox_hash::XxHash3_64::new();
    std::hash::Hasher::write(&mut hasher, &base_timestamp_us.to_le_bytes());
    std::hash::Hasher::write(&mut hasher, section);
    std::hash::Hasher::finish(&hasher)
}

/// The streaming checksum of [`ChecksumRule::MessageHeaders`] for a batch whose timestamp is
/// `base_timestamp_us`, already fed the timestamp when the section flags the timestamp rule.
fn message_headers_checksum(base_timestamp_us: u64, section: &[u8]) -> MessageHeadersChecksum {
    let mut checksum = MessageHeadersChecksum::new();
    if checksum_covers_timestamp(section) {
        checksum.push(&base_timestamp_us.to_le_bytes());
    }
    checksum
}

/// The `checksum` a batch header whose timestamp is `base_timestamp_us` must hold for `section`
/// by the rules its first message flags: under `MessageHeaders`, the hash of the message headers
/// the framing walk reaches (it stops, without panicking, at the first message that does not fit)
/// and of the stamp when flagged and room is left for it; under the timestamp rule, preceded by
/// the timestamp. Defined for any bytes so that tests can reseal edited batches.
fn section_checksum(base_timestamp_us: u64, section: &[u8]) -> u64 {
    match ChecksumRule::of_section(section) {
        ChecksumRule::Section => whole_section_checksum(base_timestamp_us, section),
        ChecksumRule::MessageHeaders => {
            let stamp = ProducerStamp::of_section(section).map(ProducerStamp::encode);
            let mut rest = if stamp.is_some() {
                &section[..section.len() - PRODUCER_STAMP_SIZE]
            } else {
                section
            };
            let mut checksum = message_headers_checksum(base_timestamp_us, section);
            while let Some(message) = split_message(rest) {
                checksum.push(message.header_bytes);
                rest = message.rest;
            }
            if let Some(stamp) = stamp {
                checksum.push(&stamp);
            }
            checksum.finish()
        }
    }
}

/// The `checksum_body` of a batch body (a `SendMessages` request, a successful `PollMessages`
/// reply; `Header::body_is_batches`), fed one batch header at a time, in body order: XXH3-128 of
/// the batches' 32-byte headers concatenated. Each header's `checksum` covers its message
/// section, so hashing the headers covers the whole body once (issue 12 item 1). A server that
/// sends stored entries without copying them feeds each entry's header here as it verifies it.
#[derive(Clone, Default)]
pub struct BatchesChecksum {
    hasher: twox_hash::XxHash3_128,
}

impl std::fmt::Debug for BatchesChecksum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BatchesChecksum").finish_non_exhaustive()
    }
}

impl BatchesChecksum {
    pub fn new() -> BatchesChecksum {
        BatchesChecksum::default()
    }

    /// Adds the next batch's header (its first 32 bytes, as sent).
    pub fn push_header(&mut self, header: &[u8; BATCH_HEADER_SIZE]) {
        self.hasher.write(header);
    }

    /// Adds bytes that do not split into whole batches (a malformed body's tail), as they are.
    pub fn push_remainder(&mut self, bytes: &[u8]) {
        self.hasher.write(bytes);
    }

    /// The XXH3-128 of everything pushed.
    pub fn finish(&self) -> u128 {
        self.hasher.finish_128()
    }
}

/// The `checksum_body` of `body` read as a batch body: walks the batches by their `length`
/// fields and hashes each 32-byte batch header (`BatchesChecksum`). Defined for any bytes: where
/// the body does not split into whole batches (fewer than 32 bytes left, or a batch whose
/// `length` runs past the end) the bytes from that batch's start to the end are hashed as they
/// are, so a damaged `length` changes the checksum and a malformed body still has one (its
/// batches are then refused by `BatchView::parse_many`). One pass over the headers only: O(batch
/// count), not O(bytes).
pub fn checksum_of_batches(body: &[u8]) -> u128 {
    let mut checksum = BatchesChecksum::new();
    let mut rest = body;
    while !rest.is_empty() {
        let Some((header, after)) = rest.split_first_chunk::<BATCH_HEADER_SIZE>() else {
            checksum.push_remainder(rest);
            break;
        };
        let length = u32::from_le_bytes([header[20], header[21], header[22], header[23]]) as usize;
        if length > after.len() {
            checksum.push_remainder(rest);
            break;
        }
        checksum.push_header(header);
        rest = &after[length..];
    }
    checksum.finish()
}

/// Builds one batch (`base_offset` 0: the owner shard assigns it) under
/// [`ChecksumRule::MessageHeaders`] and the timestamp rule: the first message carries
/// `MESSAGE_FLAG_CHECKSUM_OF_HEADERS | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP`.
///
/// Bytes are written in place as messages are pushed, each payload hashed once for its message
/// checksum, so `finish` only hashes the message headers (32 bytes per message) and fills the
/// batch header.
#[derive(Debug)]
pub struct BatchBuilder {
    /// Batch header placeholder (32 zero bytes) followed by the messages pushed so far.
    bytes: Vec<u8>,
    message_count: u32,
    base_timestamp_us: u64,
}

impl Default for BatchBuilder {
    fn default() -> BatchBuilder {
        BatchBuilder::with_capacity(0, 0)
    }
}

impl BatchBuilder {
    /// An empty builder with room for `message_count` messages totalling `payload_bytes` bytes
    /// of payload (a hint: pushing more grows the buffer).
    pub fn with_capacity(message_count: usize, payload_bytes: usize) -> BatchBuilder {
        let capacity = message_count
            .saturating_mul(MESSAGE_HEADER_SIZE)
            .saturating_add(payload_bytes)
            .saturating_add(BATCH_HEADER_SIZE);
        let mut bytes = Vec::with_capacity(capacity);
        bytes.resize(BATCH_HEADER_SIZE, 0);
        BatchBuilder {
            bytes,
            message_count: 0,
            base_timestamp_us: 0,
        }
    }

    /// Appends one message. The first message's `timestamp_us` becomes the batch's
    /// base timestamp; a later timestamp is stored as a u32 delta from it, so a timestamp below
    /// the base is stored as the base and one more than `u32::MAX` µs (~71 minutes) above it
    /// is clamped to that.
    ///
    /// # Panics
    /// If the batch already holds `BATCH_MESSAGE_COUNT_MAX` messages, or the message section
    /// would exceed `u32::MAX` bytes: a caller bug, since such a batch could never be sent.
    pub fn push(&mut self, id: u64, timestamp_us: u64, payload: &[u8]) {
        assert!(
            self.message_count < BATCH_MESSAGE_COUNT_MAX,
            "batch is full"
        );
        let section_bytes =
            self.bytes.len() - BATCH_HEADER_SIZE + MESSAGE_HEADER_SIZE + payload.len();
        assert!(
            u32::try_from(section_bytes).is_ok(),
            "batch exceeds u32::MAX bytes"
        );
        if self.message_count == 0 {
            self.base_timestamp_us = timestamp_us;
        }
        let timestamp_delta_us = timestamp_us.saturating_sub(self.base_timestamp_us);
        let header = MessageHeader {
            length: payload.len() as u32,
            offset_delta: self.message_count,
            timestamp_delta_us: u32::try_from(timestamp_delta_us).unwrap_or(u32::MAX),
            reserved: if self.message_count == 0 {
                MESSAGE_FLAG_CHECKSUM_OF_HEADERS | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP
            } else {
                0
            },
            id,
            checksum: checksum64(payload),
        };
        self.bytes.extend_from_slice(bytemuck::bytes_of(&header));
        self.bytes.extend_from_slice(payload);
        self.message_count += 1;
    }

    /// Messages pushed so far.
    pub fn message_count(&self) -> u32 {
        self.message_count
    }

    /// Finishes the batch (writes header length and checksum) and returns its bytes.
    /// A builder with no message yields a batch that `BatchView::parse` rejects as `Empty`.
    pub fn finish(self) -> Vec<u8> {
        self.seal()
    }

    /// Finishes the batch with `stamp` after its last message (the first message's
    /// `MESSAGE_FLAG_PRODUCER_STAMP` set): what an idempotent producer sends. A builder with no
    /// message yields a batch without a stamp, which `parse` rejects as `Empty`.
    pub fn finish_stamped(mut self, stamp: ProducerStamp) -> Vec<u8> {
        if self.message_count > 0 {
            let at = BATCH_HEADER_SIZE + FIRST_RESERVED_AT;
            let mut flags = [0u8; 4];
            flags.copy_from_slice(&self.bytes[at..at + 4]);
            let flags = u32::from_le_bytes(flags) | MESSAGE_FLAG_PRODUCER_STAMP;
            self.bytes[at..at + 4].copy_from_slice(&flags.to_le_bytes());
            self.bytes.extend_from_slice(&stamp.encode());
        }
        self.seal()
    }

    fn seal(mut self) -> Vec<u8> {
        let section = &self.bytes[BATCH_HEADER_SIZE..];
        let header = BatchHeader {
            base_offset: 0,
            base_timestamp_us: self.base_timestamp_us,
            message_count: self.message_count,
            length: section.len() as u32,
            checksum: section_checksum(self.base_timestamp_us, section),
        };
        self.bytes[..BATCH_HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
        self.bytes
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
        checksum64(self.payload) == self.checksum
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
    #[error("message {index} has offset_delta {offset_delta}, expected its index")]
    OffsetDelta { index: u32, offset_delta: u32 },
    /// A message's payload does not match its own checksum: under `ChecksumRule::MessageHeaders`
    /// a damaged payload or message checksum (found by `parse`, before the batch checksum); under
    /// `Section`, found by `verify_messages` although the batch checksum (computed over the
    /// already wrong bytes) matches: the sender built a damaged batch.
    #[error(
        "message {index} (offset_delta {offset_delta}) fails its payload checksum: the message \
         header says {recorded:#018x}, its {payload_len}-byte payload hashes to {actual:#018x}"
    )]
    MessageChecksum {
        index: u32,
        offset_delta: u32,
        payload_len: u32,
        recorded: u64,
        actual: u64,
    },
    #[error(
        "the first message flags a producer stamp but the section of {section_len} bytes cannot \
         hold a message and the 16-byte stamp"
    )]
    StampTruncated { section_len: usize },
    /// A `SendMessages` batch whose checksum does not cover its `base_timestamp_us` (bit 2 of the
    /// first message's `reserved` clear): stored, its timestamp would be covered by nothing on
    /// disk (`parse_for_append`).
    #[error(
        "the batch checksum does not cover its base timestamp (flag bit 2, \
         MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP, of the first message's reserved field is clear): \
         protocol version 3 stores only batches whose timestamp a checksum protects; build \
         batches with bus::BatchBuilder, or see storage/FORMAT.md section 3, \"Timestamp rule\""
    )]
    TimestampNotCovered,
    /// A `SendMessages` batch whose first message sets `reserved` bits this release gives no
    /// meaning (`parse_for_append`).
    #[error(
        "the first message's reserved flags {flags:#x} set bits {unknown:#x} that this release \
         gives no meaning (known: {MESSAGE_FLAGS_KNOWN:#x}: producer stamp, message-headers \
         checksum, timestamp checksum)"
    )]
    UnknownFlags { flags: u32, unknown: u32 },
    /// A `SendMessages` batch with a non-zero `reserved` field in a message after the first
    /// (`parse_for_append`): no release gives it a meaning yet, so it must be zero when stored.
    #[error(
        "message {index} has reserved field {reserved:#x}; only the first message's reserved \
         field carries flags, the others must be 0"
    )]
    ReservedNotZero { index: u32, reserved: u32 },
    #[error("the producer stamp names producer 0, which means \"not idempotent\"")]
    StampProducerZero,
    #[error(
        "producer stamp sequence {sequence} plus {message_count} messages overflows the sequence \
         space"
    )]
    StampSequenceOverflow { sequence: u64, message_count: u32 },
    #[error(
        "request header says producer {header_producer} sequence {header_sequence} but the batch \
         carries {batch}"
    )]
    StampMismatch {
        header_producer: u64,
        header_sequence: u64,
        batch: String,
    },
}

/// The messages of a checksummed section: the section without its producer stamp when the
/// first message flags one (the stamp checked), else the whole section.
fn messages_section(section: &[u8], message_count: u32) -> Result<&[u8], BatchError> {
    let flagged = section
        .get(FIRST_RESERVED_AT..FIRST_RESERVED_AT + 4)
        .is_some_and(|flags| flags[0] & MESSAGE_FLAG_PRODUCER_STAMP as u8 != 0);
    if !flagged {
        return Ok(section);
    }
    let Some(stamp) = ProducerStamp::of_section(section) else {
        return Err(BatchError::StampTruncated {
            section_len: section.len(),
        });
    };
    if stamp.producer == 0 {
        return Err(BatchError::StampProducerZero);
    }
    if stamp
        .sequence
        .checked_add(u64::from(message_count))
        .is_none()
    {
        return Err(BatchError::StampSequenceOverflow {
            sequence: stamp.sequence,
            message_count,
        });
    }
    Ok(&section[..section.len() - PRODUCER_STAMP_SIZE])
}

/// One message split off the front of a message section.
struct SplitMessage<'a> {
    header: MessageHeader,
    /// The 32 header bytes as sent (what the message-headers checksum hashes).
    header_bytes: &'a [u8],
    payload: &'a [u8],
    /// The section after this message.
    rest: &'a [u8],
}

/// Splits the next message off a message section: its header (decoded and as bytes) and
/// payload, and the rest. `None` if the header or the payload runs past the end.
fn split_message(section: &[u8]) -> Option<SplitMessage<'_>> {
    let header_bytes = section.get(..MESSAGE_HEADER_SIZE)?;
    let header: MessageHeader = bytemuck::pod_read_unaligned(header_bytes);
    let rest = &section[MESSAGE_HEADER_SIZE..];
    let payload_len = header.length as usize;
    let payload = rest.get(..payload_len)?;
    Some(SplitMessage {
        header,
        header_bytes,
        payload,
        rest: &rest[payload_len..],
    })
}

/// `MessageChecksum` for message `index` when XXH3-64 of `payload` differs from its header's.
fn check_message_checksum(
    index: u32,
    message: &MessageHeader,
    payload: &[u8],
) -> Result<(), BatchError> {
    let actual = checksum64(payload);
    if actual == message.checksum {
        return Ok(());
    }
    Err(BatchError::MessageChecksum {
        index,
        offset_delta: message.offset_delta,
        payload_len: message.length,
        recorded: message.checksum,
        actual,
    })
}

impl<'a> BatchView<'a> {
    /// Validates the header, the batch checksum by the batch's `ChecksumRule` and the message
    /// framing. `bytes` must be exactly one batch. Under `MessageHeaders` this is one pass over
    /// the payloads: each message's checksum is verified as the walk reaches it, and its header
    /// fed to the batch checksum (issue 12 item 1). Under `Section` the message checksums are
    /// not checked (the batch checksum covers the payloads; `verify_messages` is the second pass,
    /// `parse_verified` does both).
    ///
    /// # Errors
    /// Checked in this order, the first failure wins:
    /// - `TooShort`: fewer than 32 bytes.
    /// - `LengthMismatch`: `length` differs from the bytes after the header.
    /// - `Empty`: `message_count` is 0.
    /// - `TooManyMessages`: `message_count` > `BATCH_MESSAGE_COUNT_MAX`.
    /// - `Checksum` (`Section` only): XXH3-64 of the message section differs from `checksum`.
    /// - `StampTruncated`, `StampProducerZero`, `StampSequenceOverflow`: a flagged stamp.
    /// - per message, in order: `MessageOverrun { index }` (its header or payload runs past the
    ///   end), `OffsetDelta` (its `offset_delta` is not its index), and under `MessageHeaders`
    ///   `MessageChecksum` (its payload does not hash to its checksum).
    /// - `CountMismatch`: the section holds another number of messages than declared.
    /// - `Checksum` (`MessageHeaders` only): XXH3-64 of the message headers and stamp differs
    ///   from `checksum` (a damaged message header, stamp, flag or batch `checksum`).
    pub fn parse(bytes: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        BatchView::parse_walk(bytes, false)
    }

    /// `parse`, and with `later_reserved_zero` also `ReservedNotZero` for the first message after
    /// the first whose `reserved` is not 0, checked in the same walk over the messages.
    fn parse_walk(bytes: &'a [u8], later_reserved_zero: bool) -> Result<BatchView<'a>, BatchError> {
        let Some(header_bytes) = bytes.get(..BATCH_HEADER_SIZE) else {
            return Err(BatchError::TooShort { len: bytes.len() });
        };
        let header: BatchHeader = bytemuck::pod_read_unaligned(header_bytes);
        let section = &bytes[BATCH_HEADER_SIZE..];
        if header.length as usize != section.len() {
            return Err(BatchError::LengthMismatch {
                length: header.length,
                actual: section.len(),
            });
        }
        if header.message_count == 0 {
            return Err(BatchError::Empty);
        }
        if header.message_count > BATCH_MESSAGE_COUNT_MAX {
            return Err(BatchError::TooManyMessages {
                count: header.message_count,
                max: BATCH_MESSAGE_COUNT_MAX,
            });
        }
        let rule = ChecksumRule::of_section(section);
        if rule == ChecksumRule::Section
            && whole_section_checksum(header.base_timestamp_us, section) != header.checksum
        {
            return Err(BatchError::Checksum);
        }
        let messages = messages_section(section, header.message_count)?;
        let mut headers_checksum = (rule == ChecksumRule::MessageHeaders)
            .then(|| message_headers_checksum(header.base_timestamp_us, section));
        // Walks the whole section: bounded, since every message takes at least 32 bytes.
        let mut rest = messages;
        let mut found: u32 = 0;
        while !rest.is_empty() {
            let Some(SplitMessage {
                header: message,
                header_bytes,
                payload,
                rest: next,
            }) = split_message(rest)
            else {
                return Err(BatchError::MessageOverrun { index: found });
            };
            if message.offset_delta != found {
                return Err(BatchError::OffsetDelta {
                    index: found,
                    offset_delta: message.offset_delta,
                });
            }
            if later_reserved_zero && found > 0 && message.reserved != 0 {
                return Err(BatchError::ReservedNotZero {
                    index: found,
                    reserved: message.reserved,
                });
            }
            if let Some(checksum) = headers_checksum.as_mut() {
                check_message_checksum(found, &message, payload)?;
                checksum.push(header_bytes);
            }
            found += 1;
            rest = next;
        }
        if found != header.message_count {
            return Err(BatchError::CountMismatch {
                declared: header.message_count,
                found,
            });
        }
        if let Some(mut checksum) = headers_checksum {
            // The stamp, when flagged, is what `messages_section` left out.
            checksum.push(&section[messages.len()..]);
            if checksum.finish() != header.checksum {
                return Err(BatchError::Checksum);
            }
        }
        Ok(BatchView { header, bytes })
    }

    /// `parse`, then, for a `ChecksumRule::Section` batch, `verify_messages`: every message
    /// checksum verified, each payload byte hashed once under `MessageHeaders` and twice under
    /// `Section` (the rule before issue 12). What the server requires of a `SendMessages` batch
    /// before it stores it (`storage/FORMAT.md` section 3, "Which checksum protects what").
    ///
    /// # Errors
    /// As `parse`; then `MessageChecksum` from `verify_messages` for a `Section` batch.
    pub fn parse_verified(bytes: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        let view = BatchView::parse(bytes)?;
        if view.checksum_rule() == ChecksumRule::Section {
            view.verify_messages()?;
        }
        Ok(view)
    }

    /// `parse_verified`, then what the server requires before it stores a `SendMessages` batch
    /// (protocol version 3; `storage/FORMAT.md` section 3, "Timestamp rule"): the checksum covers
    /// the base timestamp (flag bit 2), and the first message sets no flag bit outside
    /// [`MESSAGE_FLAGS_KNOWN`], and every later message's `reserved` is 0 (so that a later
    /// release can give those bits a meaning without meeting stored entries where they meant
    /// nothing). Every batch `BatchBuilder` builds passes. Batches without bit 2
    /// still parse (`parse`, polls of entries stored before the rule) but are never stored again.
    ///
    /// # Errors
    /// As `parse_verified`, with `ReservedNotZero` (the first later message whose `reserved` is
    /// not 0) among the per-message checks of `parse`'s walk; then `UnknownFlags`, then
    /// `TimestampNotCovered`.
    pub fn parse_for_append(bytes: &'a [u8]) -> Result<BatchView<'a>, BatchError> {
        let view = BatchView::parse_walk(bytes, true)?;
        if view.checksum_rule() == ChecksumRule::Section {
            view.verify_messages()?;
        }
        let section = view.bytes.get(BATCH_HEADER_SIZE..).unwrap_or_default();
        let flags = section
            .get(FIRST_RESERVED_AT..FIRST_RESERVED_AT + 4)
            .map_or(0, |flags| {
                u32::from_le_bytes(flags.try_into().expect("4 bytes"))
            });
        let unknown = flags & !MESSAGE_FLAGS_KNOWN;
        if unknown != 0 {
            return Err(BatchError::UnknownFlags { flags, unknown });
        }
        if !checksum_covers_timestamp(section) {
            return Err(BatchError::TimestampNotCovered);
        }
        Ok(view)
    }

    /// The checksum rule the batch's first message flags (`Section` for a view whose bytes hold
    /// no message).
    pub fn checksum_rule(&self) -> ChecksumRule {
        ChecksumRule::of_section(self.bytes.get(BATCH_HEADER_SIZE..).unwrap_or_default())
    }

    /// Splits a buffer of concatenated batches (a poll reply) and validates each.
    /// An empty buffer is no batch (`Ok` of an empty list).
    ///
    /// # Errors
    /// The first batch's error from `parse`; a batch whose `length` runs past the end of `bytes`
    /// is `LengthMismatch` (`actual` = bytes left after its header), trailing bytes shorter than
    /// a batch header are `TooShort`.
    pub fn parse_many(bytes: &'a [u8]) -> Result<Vec<BatchView<'a>>, BatchError> {
        let mut batches = Vec::new();
        let mut rest = bytes;
        while !rest.is_empty() {
            let Some(header_bytes) = rest.get(..BATCH_HEADER_SIZE) else {
                return Err(BatchError::TooShort { len: rest.len() });
            };
            let header: BatchHeader = bytemuck::pod_read_unaligned(header_bytes);
            let batch_len = BATCH_HEADER_SIZE + header.length as usize;
            let Some(batch) = rest.get(..batch_len) else {
                return Err(BatchError::LengthMismatch {
                    length: header.length,
                    actual: rest.len() - BATCH_HEADER_SIZE,
                });
            };
            batches.push(BatchView::parse(batch)?);
            rest = &rest[batch_len..];
        }
        Ok(batches)
    }

    /// The messages in order, with absolute offsets and timestamps. Stops early, without
    /// panicking, if `bytes` was not validated by `parse` and is malformed.
    pub fn messages(&self) -> impl Iterator<Item = MessageView<'a>> + use<'a> {
        let header = self.header;
        let mut rest = self.bytes.get(BATCH_HEADER_SIZE..).unwrap_or_default();
        let mut remaining_count = header.message_count;
        std::iter::from_fn(move || {
            if remaining_count == 0 {
                return None;
            }
            let SplitMessage {
                header: message,
                payload,
                rest: next,
                ..
            } = split_message(rest)?;
            rest = next;
            remaining_count -= 1;
            Some(MessageView {
                offset: header
                    .base_offset
                    .saturating_add(u64::from(message.offset_delta)),
                timestamp_us: header
                    .base_timestamp_us
                    .saturating_add(u64::from(message.timestamp_delta_us)),
                id: message.id,
                checksum: message.checksum,
                payload,
            })
        })
    }

    /// The producer stamp of a validated batch, if it carries one.
    pub fn producer_stamp(&self) -> Option<ProducerStamp> {
        ProducerStamp::of_section(self.bytes.get(BATCH_HEADER_SIZE..)?)
    }

    /// Checks that the request header's `producer` and `sequence` agree with the batch: both
    /// absent (producer 0, no stamp) or the same stamp.
    ///
    /// # Errors
    /// `StampMismatch` naming both sides.
    pub fn check_producer(&self, producer: u64, sequence: u64) -> Result<(), BatchError> {
        let stamp = self.producer_stamp();
        let agrees = match stamp {
            None => producer == 0,
            Some(stamp) => stamp.producer == producer && stamp.sequence == sequence,
        };
        if agrees {
            return Ok(());
        }
        Err(BatchError::StampMismatch {
            header_producer: producer,
            header_sequence: sequence,
            batch: stamp.map_or_else(
                || "no producer stamp".to_owned(),
                |stamp| format!("producer {} sequence {}", stamp.producer, stamp.sequence),
            ),
        })
    }

    /// Checks every message's payload against its own checksum (XXH3-64), whatever the rule:
    /// a second pass over the payloads. Under `ChecksumRule::Section`, `parse` does not check
    /// them (the batch checksum covers the section as sent, so a sender that hashed a payload
    /// wrongly passes it); under `MessageHeaders`, `parse` already did, so callers holding a
    /// parsed view need this only for `Section` batches: `parse_verified` calls it exactly then.
    ///
    /// # Errors
    /// `MessageChecksum` for the first message whose payload does not match, naming its index
    /// and offset delta; `MessageOverrun` when a view not built by `parse` runs out of bytes.
    pub fn verify_messages(&self) -> Result<(), BatchError> {
        let mut rest = self.bytes.get(BATCH_HEADER_SIZE..).unwrap_or_default();
        for index in 0..self.header.message_count {
            let Some(SplitMessage {
                header: message,
                payload,
                rest: next,
                ..
            }) = split_message(rest)
            else {
                return Err(BatchError::MessageOverrun { index });
            };
            check_message_checksum(index, &message, payload)?;
            rest = next;
        }
        Ok(())
    }

    /// Offset of the last message (`base_offset + message_count - 1`).
    pub fn last_offset(&self) -> u64 {
        self.header
            .base_offset
            .saturating_add(u64::from(self.header.message_count.saturating_sub(1)))
    }
}

/// Rewrites `base_offset` in place in a batch's bytes (not covered by the checksum).
///
/// # Panics
/// If `batch` is shorter than a batch header (a caller bug: the batch was parsed before).
pub fn set_base_offset(batch: &mut [u8], base_offset: u64) {
    assert!(
        batch.len() >= BATCH_HEADER_SIZE,
        "not a batch: {} bytes",
        batch.len()
    );
    batch[..8].copy_from_slice(&base_offset.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn build(messages: &[(u64, u64, &[u8])]) -> Vec<u8> {
        let mut builder = BatchBuilder::default();
        for &(id, timestamp_us, payload) in messages {
            builder.push(id, timestamp_us, payload);
        }
        builder.finish()
    }

    /// Rewrites the batch checksum, by the batch's rule, after a test edited the message section.
    fn reseal(batch: &mut [u8]) {
        let base_timestamp_us = u64::from_le_bytes(batch[8..16].try_into().expect("8 bytes"));
        let checksum = section_checksum(base_timestamp_us, &batch[BATCH_HEADER_SIZE..]);
        batch[24..32].copy_from_slice(&checksum.to_le_bytes());
    }

    /// Turns a built batch into one of the rule before issue 12 (`ChecksumRule::Section`, the
    /// timestamp not covered): both flags cleared and the checksum over the whole message section.
    fn to_section_rule(batch: &mut [u8]) {
        batch[BATCH_HEADER_SIZE + FIRST_RESERVED_AT] &=
            !((MESSAGE_FLAG_CHECKSUM_OF_HEADERS | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP) as u8);
        let checksum = checksum64(&batch[BATCH_HEADER_SIZE..]);
        batch[24..32].copy_from_slice(&checksum.to_le_bytes());
    }

    #[test]
    fn issue7_review_4_a_wrong_message_checksum_is_named_by_index_and_offset_delta() {
        let mut batch = build(&[(1, 0, b"ab"), (2, 0, b"cd"), (3, 0, b"ef")]);
        BatchView::parse(&batch).unwrap().verify_messages().unwrap();
        // Message 1's checksum field: batch header, message 0 (header + 2 bytes), then byte 24.
        let at = BATCH_HEADER_SIZE + MESSAGE_HEADER_SIZE + 2 + 24;
        batch[at] ^= 0xff;
        let recorded = checksum64(b"cd") ^ 0xff;
        let expected = || BatchError::MessageChecksum {
            index: 1,
            offset_delta: 1,
            payload_len: 2,
            recorded,
            actual: checksum64(b"cd"),
        };
        // Issue 12 item 1: under the message-headers rule, parse finds it (before the batch
        // checksum, resealed or not).
        assert_eq!(BatchView::parse(&batch).unwrap_err(), expected());
        reseal(&mut batch);
        assert_eq!(BatchView::parse(&batch).unwrap_err(), expected());
        assert_eq!(
            expected().to_string(),
            format!(
                "message 1 (offset_delta 1) fails its payload checksum: the message header says \
                 {recorded:#018x}, its 2-byte payload hashes to {:#018x}",
                checksum64(b"cd")
            )
        );
        // Under the section rule the batch checksum passes; verify_messages finds it.
        to_section_rule(&mut batch);
        let view = BatchView::parse(&batch).expect("the batch checksum covers the edited bytes");
        assert_eq!(view.verify_messages(), Err(expected()));
        assert_eq!(BatchView::parse_verified(&batch).unwrap_err(), expected());
    }

    /// Issue 12 item 1: the builder flags the message-headers rule and its checksum is XXH3-64
    /// of the message headers then the stamp; a batch of the section rule still parses.
    #[test]
    fn issue12_1_builder_checksums_message_headers_and_both_rules_parse() {
        let stamp = ProducerStamp {
            producer: 9,
            sequence: 100,
        };
        let mut builder = BatchBuilder::default();
        builder.push(1, 10, b"first");
        builder.push(2, 11, b"");
        builder.push(3, 12, b"third!");
        let batch = builder.finish_stamped(stamp);
        let header: BatchHeader = bytemuck::pod_read_unaligned(&batch[..32]);
        let mut headers = Vec::new();
        headers.extend_from_slice(&batch[32..64]);
        headers.extend_from_slice(&batch[69..101]);
        headers.extend_from_slice(&batch[101..133]);
        headers.extend_from_slice(&batch[139..155]);
        assert_eq!(batch.len(), 155);
        // The timestamp rule: the base timestamp (10) first, then the headers and stamp.
        let hashed = [&10u64.to_le_bytes()[..], &headers].concat();
        assert_eq!(header.checksum, twox_hash::XxHash3_64::oneshot(&hashed));
        assert_eq!(
            &batch[32 + 12..32 + 16],
            &(MESSAGE_FLAG_CHECKSUM_OF_HEADERS
                | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP
                | MESSAGE_FLAG_PRODUCER_STAMP)
                .to_le_bytes()
        );
        let view = BatchView::parse_verified(&batch).unwrap();
        assert_eq!(view.checksum_rule(), ChecksumRule::MessageHeaders);
        assert_eq!(view.producer_stamp(), Some(stamp));

        let mut old = batch.clone();
        to_section_rule(&mut old);
        let view = BatchView::parse_verified(&old).unwrap();
        assert_eq!(view.checksum_rule(), ChecksumRule::Section);
        assert_eq!(view.producer_stamp(), Some(stamp));
        assert_eq!(view.messages().count(), 3);

        // The flag itself is covered: cleared on a new batch, or set on an old one, the batch
        // checksum no longer matches.
        let mut cleared = batch.clone();
        cleared[32 + 12] &= !2;
        assert_eq!(
            BatchView::parse(&cleared).unwrap_err(),
            BatchError::Checksum
        );
        let mut set = old.clone();
        set[32 + 12] |= 2;
        assert_eq!(BatchView::parse(&set).unwrap_err(), BatchError::Checksum);
    }

    /// Issue 12 item 1: the staged streaming hash equals XXH3-64 of the concatenated headers
    /// past the 1 KiB stage (100 headers and a stamp: 3216 bytes, four flushes).
    #[test]
    fn issue12_1_staged_headers_checksum_equals_the_oneshot_of_the_headers() {
        let mut builder = BatchBuilder::default();
        let mut headers = Vec::new();
        let mut at = BATCH_HEADER_SIZE;
        for index in 0..100u64 {
            let payload = vec![index as u8; index as usize % 7];
            builder.push(index, index, &payload);
            headers.push(at);
            at += MESSAGE_HEADER_SIZE + payload.len();
        }
        let stamp = ProducerStamp {
            producer: 1,
            sequence: 2,
        };
        let batch = builder.finish_stamped(stamp);
        let mut expected = Vec::new();
        for at in headers {
            expected.extend_from_slice(&batch[at..at + MESSAGE_HEADER_SIZE]);
        }
        expected.extend_from_slice(&batch[batch.len() - PRODUCER_STAMP_SIZE..]);
        assert_eq!(expected.len(), 3216);
        let header: BatchHeader = bytemuck::pod_read_unaligned(&batch[..32]);
        // The timestamp rule puts the base timestamp (0) first.
        let hashed = [&0u64.to_le_bytes()[..], &expected].concat();
        assert_eq!(header.checksum, twox_hash::XxHash3_64::oneshot(&hashed));
        assert!(BatchView::parse_verified(&batch).is_ok());
    }

    /// Issue 12 item 1: a flipped byte in a message payload, a message header or the batch
    /// header's checksum fails `parse` of a new batch, each with the error its rule gives.
    #[test]
    fn issue12_1_a_flipped_byte_fails_parse_by_where_it_is() {
        let batch = build(&[(1, 0, b"ab"), (2, 0, b"cd")]);
        let flipped = |at: usize| {
            let mut bytes = batch.clone();
            bytes[at] ^= 0x20;
            BatchView::parse(&bytes).unwrap_err()
        };
        // Message 1's payload ("cd" at 32 + 34 + 32).
        assert!(matches!(
            flipped(32 + 34 + 32 + 1),
            BatchError::MessageChecksum { index: 1, .. }
        ));
        // Message 1's id (header byte 16): only the headers checksum sees it.
        assert_eq!(flipped(32 + 34 + 16), BatchError::Checksum);
        // Message 0's timestamp delta.
        assert_eq!(flipped(32 + 8), BatchError::Checksum);
        // The batch header's base timestamp (issue 12, timestamp rule).
        assert_eq!(flipped(8), BatchError::Checksum);
        assert_eq!(flipped(15), BatchError::Checksum);
        // The batch header's checksum, count and length.
        assert_eq!(flipped(24), BatchError::Checksum);
        assert_eq!(
            flipped(16),
            BatchError::CountMismatch {
                declared: 34,
                found: 2
            }
        );
        assert!(matches!(flipped(20), BatchError::LengthMismatch { .. }));
    }

    /// Issue 12 ("checksums still catch every flipped byte ... in a batch header"), timestamp
    /// rule: bit 2 prefixes the checksum's input with `base_timestamp_us` under either rule, so a
    /// changed timestamp fails `parse`; a batch without bit 2 keeps the old checksum, and any
    /// timestamp parses.
    #[test]
    fn issue12_timestamp_rule_covers_the_base_timestamp_under_both_rules() {
        let batch = build(&[(1, 5_000, b"ab"), (2, 5_001, b"cd")]);
        assert!(checksum_covers_timestamp(&batch[BATCH_HEADER_SIZE..]));
        let with_timestamp = |batch: &[u8], base_timestamp_us: u64| {
            let mut bytes = batch.to_vec();
            bytes[8..16].copy_from_slice(&base_timestamp_us.to_le_bytes());
            BatchView::parse(&bytes).map(|view| view.messages().next().unwrap().timestamp_us)
        };
        assert_eq!(with_timestamp(&batch, 5_000), Ok(5_000));
        assert_eq!(with_timestamp(&batch, 4_999), Err(BatchError::Checksum));
        assert_eq!(with_timestamp(&batch, 0), Err(BatchError::Checksum));

        // The section rule with bit 2: XXH3-64 of the timestamp then the whole section.
        let mut section_rule = batch.clone();
        section_rule[BATCH_HEADER_SIZE + FIRST_RESERVED_AT] &=
            !(MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8);
        reseal(&mut section_rule);
        let hashed = [
            &5_000u64.to_le_bytes()[..],
            &section_rule[BATCH_HEADER_SIZE..],
        ]
        .concat();
        assert_eq!(
            BatchView::parse_verified(&section_rule)
                .unwrap()
                .header
                .checksum,
            checksum64(&hashed)
        );
        assert_eq!(with_timestamp(&section_rule, 5_000), Ok(5_000));
        assert_eq!(
            with_timestamp(&section_rule, 1 << 40),
            Err(BatchError::Checksum)
        );

        // Without bit 2 (every batch before the rule) the timestamp is not covered.
        let mut old = batch.clone();
        to_section_rule(&mut old);
        assert!(!checksum_covers_timestamp(&old[BATCH_HEADER_SIZE..]));
        assert_eq!(with_timestamp(&old, 7), Ok(7));
        // Bit 2 is itself covered: set on an old batch, or cleared on a new one, it fails.
        let mut set = old.clone();
        set[BATCH_HEADER_SIZE + FIRST_RESERVED_AT] |= MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
        assert_eq!(BatchView::parse(&set).unwrap_err(), BatchError::Checksum);
        let mut cleared = batch.clone();
        cleared[BATCH_HEADER_SIZE + FIRST_RESERVED_AT] &=
            !(MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8);
        assert_eq!(
            BatchView::parse(&cleared).unwrap_err(),
            BatchError::Checksum
        );
    }

    /// Issue 12, timestamp rule (review finding: a server of protocol 3 stored batches without
    /// bit 2, whose timestamp then had no cover on disk): `parse_for_append` accepts what the
    /// builder builds, stamped or not, and refuses a batch without bit 2 or with a flag bit this
    /// release does not know, each resealed so that only the rule objects.
    #[test]
    fn issue12_timestamp_rule_parse_for_append_requires_bit_2_and_known_flags() {
        let batch = build(&[(1, 5_000, b"ab"), (2, 5_001, b"cd")]);
        assert!(BatchView::parse_for_append(&batch).is_ok());
        let mut stamped = BatchBuilder::default();
        stamped.push(1, 5, b"x");
        let stamped = stamped.finish_stamped(ProducerStamp {
            producer: 3,
            sequence: 0,
        });
        assert!(BatchView::parse_for_append(&stamped).is_ok());
        let flags_at = BATCH_HEADER_SIZE + FIRST_RESERVED_AT;

        let mut without_timestamp = batch.clone();
        without_timestamp[flags_at] &= !(MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8);
        reseal(&mut without_timestamp);
        assert!(BatchView::parse_verified(&without_timestamp).is_ok());
        assert_eq!(
            BatchView::parse_for_append(&without_timestamp).unwrap_err(),
            BatchError::TimestampNotCovered
        );
        let mut old = batch.clone();
        to_section_rule(&mut old);
        assert_eq!(
            BatchView::parse_for_append(&old).unwrap_err(),
            BatchError::TimestampNotCovered
        );

        let mut unknown = batch.clone();
        unknown[flags_at] |= 8;
        unknown[flags_at + 3] |= 0x80;
        reseal(&mut unknown);
        assert!(BatchView::parse_verified(&unknown).is_ok());
        let error = BatchView::parse_for_append(&unknown).unwrap_err();
        assert_eq!(
            error,
            BatchError::UnknownFlags {
                flags: 0x8000_000e,
                unknown: 0x8000_0008
            }
        );
        assert_eq!(
            error.to_string(),
            "the first message's reserved flags 0x8000000e set bits 0x80000008 that this release \
             gives no meaning (known: 0x7: producer stamp, message-headers checksum, timestamp \
             checksum)"
        );
        // A later message's reserved field must be 0 (second review's finding).
        let mut later = batch.clone();
        let second_reserved = BATCH_HEADER_SIZE + MESSAGE_HEADER_SIZE + 2 + 12;
        later[second_reserved] = 1;
        reseal(&mut later);
        assert!(BatchView::parse_verified(&later).is_ok());
        assert_eq!(
            BatchView::parse_for_append(&later).unwrap_err(),
            BatchError::ReservedNotZero {
                index: 1,
                reserved: 1
            }
        );
        // A damaged batch fails as parse_verified says, before any flag rule.
        let mut damaged = batch.clone();
        damaged[24] ^= 1;
        assert_eq!(
            BatchView::parse_for_append(&damaged).unwrap_err(),
            BatchError::Checksum
        );
    }

    #[test]
    fn layout_offsets() {
        use std::mem::offset_of;
        assert_eq!(offset_of!(BatchHeader, base_offset), 0);
        assert_eq!(offset_of!(BatchHeader, base_timestamp_us), 8);
        assert_eq!(offset_of!(BatchHeader, message_count), 16);
        assert_eq!(offset_of!(BatchHeader, length), 20);
        assert_eq!(offset_of!(BatchHeader, checksum), 24);
        assert_eq!(offset_of!(MessageHeader, length), 0);
        assert_eq!(offset_of!(MessageHeader, offset_delta), 4);
        assert_eq!(offset_of!(MessageHeader, timestamp_delta_us), 8);
        assert_eq!(offset_of!(MessageHeader, reserved), 12);
        assert_eq!(offset_of!(MessageHeader, id), 16);
        assert_eq!(offset_of!(MessageHeader, checksum), 24);
    }

    #[test]
    fn builder_writes_exact_bytes() {
        let batch = build(&[(7, 1_000, b"ab"), (8, 1_250, b"")]);
        assert_eq!(batch.len(), 32 + 32 + 2 + 32);
        let header: BatchHeader = bytemuck::pod_read_unaligned(&batch[..32]);
        // Issue 12 item 1: the checksum covers the two message headers, not the payload, after
        // the base timestamp (the timestamp rule).
        let headers = [&1_000u64.to_le_bytes()[..], &batch[32..64], &batch[66..98]].concat();
        assert_eq!(
            header,
            BatchHeader {
                base_offset: 0,
                base_timestamp_us: 1_000,
                message_count: 2,
                length: 66,
                checksum: twox_hash::XxHash3_64::oneshot(&headers),
            }
        );
        let first: MessageHeader = bytemuck::pod_read_unaligned(&batch[32..64]);
        assert_eq!(
            first,
            MessageHeader {
                length: 2,
                offset_delta: 0,
                timestamp_delta_us: 0,
                reserved: MESSAGE_FLAG_CHECKSUM_OF_HEADERS | MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP,
                id: 7,
                checksum: twox_hash::XxHash3_64::oneshot(b"ab"),
            }
        );
        assert_eq!(&batch[64..66], b"ab");
        let second: MessageHeader = bytemuck::pod_read_unaligned(&batch[66..98]);
        assert_eq!(
            (
                second.length,
                second.offset_delta,
                second.timestamp_delta_us,
                second.id
            ),
            (0, 1, 250, 8)
        );
    }

    #[test]
    fn timestamps_before_base_and_far_after_are_clamped() {
        let batch = build(&[
            (1, 10_000, b"x"),
            (2, 5, b"y"),
            (3, 10_000 + (1 << 33), b"z"),
        ]);
        let view = BatchView::parse(&batch).unwrap();
        let timestamps: Vec<u64> = view.messages().map(|m| m.timestamp_us).collect();
        assert_eq!(
            timestamps,
            vec![10_000, 10_000, 10_000 + u64::from(u32::MAX)]
        );
    }

    #[test]
    fn parse_and_messages_with_base_offset() {
        let mut batch = build(&[(1, 100, b"one"), (2, 101, b"two"), (3, 103, b"three")]);
        set_base_offset(&mut batch, 40);
        let view = BatchView::parse(&batch).unwrap();
        assert_eq!(view.header.base_offset, 40);
        assert_eq!(view.last_offset(), 42);
        let messages: Vec<_> = view.messages().collect();
        assert_eq!(messages.len(), 3);
        let summary: Vec<(u64, u64, u64, &[u8])> = messages
            .iter()
            .map(|m| (m.offset, m.timestamp_us, m.id, m.payload))
            .collect();
        assert_eq!(
            summary,
            vec![
                (40, 100, 1, &b"one"[..]),
                (41, 101, 2, &b"two"[..]),
                (42, 103, 3, &b"three"[..])
            ]
        );
        assert!(messages.iter().all(MessageView::verify));
        let mut corrupt = messages[0];
        corrupt.payload = b"oNe";
        assert!(!corrupt.verify());
    }

    #[test]
    fn parse_errors_each_variant() {
        let good = build(&[(1, 1, b"abc"), (2, 2, b"de")]);
        assert_eq!(
            BatchView::parse(&good[..31]).unwrap_err(),
            BatchError::TooShort { len: 31 }
        );
        assert_eq!(
            BatchView::parse(&good[..good.len() - 1]).unwrap_err(),
            BatchError::LengthMismatch {
                length: 69,
                actual: 68
            }
        );
        assert_eq!(
            BatchView::parse(&build(&[])).unwrap_err(),
            BatchError::Empty
        );

        let mut too_many = good.clone();
        too_many[16..20].copy_from_slice(&(BATCH_MESSAGE_COUNT_MAX + 1).to_le_bytes());
        assert_eq!(
            BatchView::parse(&too_many).unwrap_err(),
            BatchError::TooManyMessages {
                count: BATCH_MESSAGE_COUNT_MAX + 1,
                max: BATCH_MESSAGE_COUNT_MAX
            }
        );

        let mut flipped = good.clone();
        *flipped.last_mut().unwrap() ^= 1;
        assert!(matches!(
            BatchView::parse(&flipped).unwrap_err(),
            BatchError::MessageChecksum { index: 1, .. }
        ));
        to_section_rule(&mut flipped);
        *flipped.last_mut().unwrap() ^= 1;
        assert_eq!(
            BatchView::parse(&flipped).unwrap_err(),
            BatchError::Checksum
        );

        let mut declared_three = good.clone();
        declared_three[16..20].copy_from_slice(&3u32.to_le_bytes());
        assert_eq!(
            BatchView::parse(&declared_three).unwrap_err(),
            BatchError::CountMismatch {
                declared: 3,
                found: 2
            }
        );

        let mut overrun = good.clone();
        overrun[32 + 35..32 + 39].copy_from_slice(&1000u32.to_le_bytes()); // message 1 length
        reseal(&mut overrun);
        assert_eq!(
            BatchView::parse(&overrun).unwrap_err(),
            BatchError::MessageOverrun { index: 1 }
        );

        let mut bad_delta = good.clone();
        bad_delta[32 + 35 + 4..32 + 35 + 8].copy_from_slice(&5u32.to_le_bytes());
        reseal(&mut bad_delta);
        assert_eq!(
            BatchView::parse(&bad_delta).unwrap_err(),
            BatchError::OffsetDelta {
                index: 1,
                offset_delta: 5
            }
        );
    }

    #[test]
    fn parse_many_walks_concatenated_batches() {
        let mut first = build(&[(1, 1, b"a"), (2, 1, b"b")]);
        set_base_offset(&mut first, 10);
        let mut second = build(&[(3, 5, b"ccc")]);
        set_base_offset(&mut second, 12);
        let mut both = first.clone();
        both.extend_from_slice(&second);
        let views = BatchView::parse_many(&both).unwrap();
        assert_eq!(views.len(), 2);
        let offsets: Vec<u64> = views
            .iter()
            .flat_map(BatchView::messages)
            .map(|m| m.offset)
            .collect();
        assert_eq!(offsets, vec![10, 11, 12]);
        assert_eq!(views[1].bytes, &second[..]);

        assert!(BatchView::parse_many(&[]).unwrap().is_empty());
        assert_eq!(
            BatchView::parse_many(&both[..both.len() - 1]).unwrap_err(),
            BatchError::LengthMismatch {
                length: 35,
                actual: 34
            }
        );
        let mut trailing = both.clone();
        trailing.extend_from_slice(&[0; 5]);
        assert_eq!(
            BatchView::parse_many(&trailing).unwrap_err(),
            BatchError::TooShort { len: 5 }
        );

        let polled = crate::client::messages_from(&both, 11).unwrap();
        let ids: Vec<u64> = polled.iter().map(|m| m.id).collect();
        assert_eq!(ids, vec![2, 3]);
    }

    #[test]
    fn messages_of_an_unvalidated_view_stop_without_panicking() {
        let batch = build(&[(1, 1, b"abc")]);
        let mut header: BatchHeader = bytemuck::pod_read_unaligned(&batch[..32]);
        header.message_count = 5;
        let view = BatchView {
            header,
            bytes: &batch[..40],
        };
        assert_eq!(view.messages().count(), 0);
        let view = BatchView {
            header,
            bytes: &batch,
        };
        assert_eq!(view.messages().count(), 1);
        let view = BatchView {
            header,
            bytes: &batch[..3],
        };
        assert_eq!(view.messages().count(), 0);
    }

    #[test]
    fn issue7_5_stamped_batch_round_trips_and_keeps_its_messages() {
        let stamp = ProducerStamp {
            producer: 0xABCD,
            sequence: 41,
        };
        let mut builder = BatchBuilder::default();
        builder.push(1, 100, b"one");
        builder.push(2, 101, b"two");
        let mut batch = builder.finish_stamped(stamp);
        assert_eq!(batch.len(), 32 + 2 * 32 + 6 + PRODUCER_STAMP_SIZE);
        assert_eq!(
            &batch[batch.len() - 16..batch.len() - 8],
            &0xABCDu64.to_le_bytes()
        );
        assert_eq!(&batch[batch.len() - 8..], &41u64.to_le_bytes());
        // Flags: producer stamp (1), message-headers rule (2), timestamp rule (4).
        assert_eq!(&batch[32 + 12..32 + 16], &7u32.to_le_bytes());
        set_base_offset(&mut batch, 7);
        let view = BatchView::parse(&batch).unwrap();
        assert_eq!(view.producer_stamp(), Some(stamp));
        let messages: Vec<(u64, &[u8])> = view.messages().map(|m| (m.offset, m.payload)).collect();
        assert_eq!(messages, vec![(7, &b"one"[..]), (8, &b"two"[..])]);
        assert_eq!(view.check_producer(0xABCD, 41), Ok(()));
        assert_eq!(
            view.check_producer(0xABCD, 40).unwrap_err().to_string(),
            "request header says producer 43981 sequence 40 but the batch carries producer 43981 \
             sequence 41"
        );
        let plain = build(&[(1, 1, b"x")]);
        let plain_view = BatchView::parse(&plain).unwrap();
        assert_eq!(plain_view.producer_stamp(), None);
        assert_eq!(plain_view.check_producer(0, 9), Ok(()));
        assert_eq!(
            plain_view.check_producer(5, 0).unwrap_err().to_string(),
            "request header says producer 5 sequence 0 but the batch carries no producer stamp"
        );
        let mut twice = batch.clone();
        twice.extend_from_slice(&plain);
        let views = BatchView::parse_many(&twice).unwrap();
        assert_eq!(views.iter().map(|v| v.messages().count()).sum::<usize>(), 3);
    }

    #[test]
    fn issue7_5_bad_stamps_are_refused() {
        let one = |stamp: ProducerStamp| {
            let mut builder = BatchBuilder::default();
            builder.push(1, 1, b"");
            builder.finish_stamped(stamp)
        };
        assert_eq!(
            BatchView::parse(&one(ProducerStamp {
                producer: 0,
                sequence: 0
            }))
            .unwrap_err(),
            BatchError::StampProducerZero
        );
        assert_eq!(
            BatchView::parse(&one(ProducerStamp {
                producer: 1,
                sequence: u64::MAX
            }))
            .unwrap_err(),
            BatchError::StampSequenceOverflow {
                sequence: u64::MAX,
                message_count: 1
            }
        );
        // The flag without room for the stamp.
        let mut flagged = build(&[(1, 1, b"")]);
        flagged[32 + 12] = 1;
        reseal(&mut flagged);
        assert_eq!(
            BatchView::parse(&flagged).unwrap_err(),
            BatchError::StampTruncated { section_len: 32 }
        );
    }

    #[test]
    #[should_panic(expected = "not a batch")]
    fn set_base_offset_on_a_short_buffer_is_a_bug() {
        set_base_offset(&mut [0; 31], 1);
    }

    fn arbitrary_messages() -> impl Strategy<Value = Vec<(u64, u64, Vec<u8>)>> {
        proptest::collection::vec(
            (
                any::<u64>(),
                0u64..1_000_000,
                proptest::collection::vec(any::<u8>(), 0..64),
            ),
            1..20,
        )
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn parse_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = BatchView::parse(&bytes).map(|view| view.messages().count());
            let _ = BatchView::parse_many(&bytes);
        }

        /// Random message sections behind a header whose length and checksum are right reach
        /// the framing checks; they must never panic either.
        #[test]
        fn resealed_random_sections_never_panic(
            section in proptest::collection::vec(any::<u8>(), 0..512),
            message_count in 0u32..8,
        ) {
            let header = BatchHeader {
                base_offset: 0,
                base_timestamp_us: 0,
                message_count,
                length: section.len() as u32,
                checksum: section_checksum(0, &section),
            };
            let mut bytes = bytemuck::bytes_of(&header).to_vec();
            bytes.extend_from_slice(&section);
            if let Ok(view) = BatchView::parse(&bytes) {
                prop_assert_eq!(view.messages().count(), message_count as usize);
            }
            let _ = BatchView::parse_many(&bytes);
        }

        #[test]
        fn builder_round_trips(messages in arbitrary_messages(), base_offset in 0u64..1 << 40) {
            let mut builder = BatchBuilder::with_capacity(messages.len(), 0);
            for (id, timestamp_us, payload) in &messages {
                builder.push(*id, *timestamp_us, payload);
            }
            prop_assert_eq!(builder.message_count() as usize, messages.len());
            let mut batch = builder.finish();
            set_base_offset(&mut batch, base_offset);
            let view = BatchView::parse(&batch).unwrap();
            prop_assert_eq!(view.header.message_count as usize, messages.len());
            let base_timestamp_us = messages[0].1;
            let parsed: Vec<_> = view.messages().collect();
            prop_assert_eq!(parsed.len(), messages.len());
            for (index, (message, (id, timestamp_us, payload))) in parsed.iter().zip(&messages).enumerate() {
                prop_assert_eq!(message.offset, base_offset + index as u64);
                prop_assert_eq!(message.id, *id);
                prop_assert_eq!(message.payload, &payload[..]);
                prop_assert_eq!(message.timestamp_us, (*timestamp_us).max(base_timestamp_us));
                prop_assert!(message.verify());
            }
            let mut twice = batch.clone();
            twice.extend_from_slice(&batch);
            prop_assert_eq!(BatchView::parse_many(&twice).unwrap().len(), 2);
        }

        /// Issue 12 item 1: under either rule, a flipped bit anywhere in a built batch is caught:
        /// past byte 16 (count, length, checksum, message section) by `parse_verified`, in
        /// `base_timestamp_us` (bytes 8..16) by `parse_verified` too when the batch flags the
        /// timestamp rule (what the builder writes), and in the rest of the batch header
        /// (`base_offset`, which the owner shard assigns; the timestamp of a batch without the
        /// timestamp rule) by the frame's `checksum_body`, `checksum_of_batches`.
        #[test]
        fn issue12_1_every_flipped_bit_is_caught_under_both_rules(
            messages in arbitrary_messages(),
            stamped in any::<bool>(),
            section_rule in any::<bool>(),
            bit in any::<proptest::sample::Index>(),
        ) {
            let mut builder = BatchBuilder::default();
            for (id, timestamp_us, payload) in &messages {
                builder.push(*id, *timestamp_us, payload);
            }
            let mut batch = if stamped {
                builder.finish_stamped(ProducerStamp { producer: 7, sequence: 1 })
            } else {
                builder.finish()
            };
            if section_rule {
                to_section_rule(&mut batch);
            }
            prop_assert!(BatchView::parse_verified(&batch).is_ok());
            let bit = bit.index(batch.len() * 8);
            let mut flipped = batch.clone();
            flipped[bit / 8] ^= 1 << (bit % 8);
            let covered_from = if section_rule { 16 } else { 8 };
            if bit / 8 >= covered_from {
                prop_assert!(BatchView::parse_verified(&flipped).is_err(), "bit {}", bit);
            } else {
                prop_assert_ne!(checksum_of_batches(&flipped), checksum_of_batches(&batch));
            }
        }

        /// Issue 12 item 1: `parse` of a message-headers batch agrees with `parse` of the same
        /// batch under the section rule followed by `verify_messages` on random edits that
        /// keep the batch checksum right (resealed): both accept or both refuse.
        #[test]
        fn issue12_1_one_pass_agrees_with_two_passes_on_resealed_edits(
            messages in arbitrary_messages(),
            at in any::<proptest::sample::Index>(),
            value in any::<u8>(),
        ) {
            let mut builder = BatchBuilder::default();
            for (id, timestamp_us, payload) in &messages {
                builder.push(*id, *timestamp_us, payload);
            }
            let mut batch = builder.finish();
            // Any byte of the message section except the flags byte (which picks the rule).
            let at = BATCH_HEADER_SIZE + at.index(batch.len() - BATCH_HEADER_SIZE);
            prop_assume!(at != BATCH_HEADER_SIZE + FIRST_RESERVED_AT);
            batch[at] = value;
            reseal(&mut batch);
            let one_pass = BatchView::parse(&batch).map(|_| ());
            let mut old = batch.clone();
            to_section_rule(&mut old);
            let two_passes = BatchView::parse_verified(&old).map(|_| ());
            prop_assert_eq!(one_pass.is_ok(), two_passes.is_ok());
            // With a checksum computed over the edit, only the message checksums can object.
            if let Err(error) = one_pass {
                prop_assert!(
                    !matches!(error, BatchError::Checksum),
                    "{error:?} for an edit resealed under the rule"
                );
            }
        }
    }
}
