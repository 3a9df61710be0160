//! The validity rules `PartitionLog::open` applies to segment entries and index files
//! (`storage/FORMAT.md` sections 3 and 4), public so that offline checkers (`shardline inspect
//! segment`) reach the same verdicts as open instead of keeping a copy of the rules. Pure
//! functions: no I/O, and no rule here that open does not use itself.

use super::index::SegmentIndex;
use crate::entry::{
    ENTRY_HEADER_SIZE, EntryHeader, MESSAGE_HEADER_SIZE, PRODUCER_STAMP_SIZE, check_payload,
};
use crate::limits::{
    DIRECT_WRITE_ALIGNMENT_BYTES, ENTRY_SIZE_MAX, RESYNC_CHARGED_BYTES_PER_TAIL_BYTE,
};

/// Whether the tail of the last segment after its last valid entry is the zero padding of a
/// direct write (`WriteMode::Direct`) that a crash left (`storage/FORMAT.md` section 3, "Write
/// modes"), to cut as such (logged at info, never quarantined, not a torn tail): the tail runs
/// from `position` to the end of a file of `file_size_bytes` bytes, which is a multiple of
/// [`DIRECT_WRITE_ALIGNMENT_BYTES`]; it is shorter than one alignment unit, and it is all zero
/// (`tail_bytes` are its bytes; `None` when the caller did not read them because the sizes
/// already rule it out). Zeros hold no entry (`message_count` 0 is invalid), so cutting them
/// never loses one.
pub fn is_direct_write_padding(position: u64, file_size_bytes: u64, tail_bytes: &[u8]) -> bool {
    direct_write_padding_len(position, file_size_bytes)
        .is_some_and(|len| len == tail_bytes.len() && tail_bytes.iter().all(|byte| *byte == 0))
}

/// The length of the tail `is_direct_write_padding` would read (`None` when the sizes rule the
/// padding out: an unaligned file end, an empty tail, or one of a whole alignment unit or more).
pub fn direct_write_padding_len(position: u64, file_size_bytes: u64) -> Option<usize> {
    let alignment = DIRECT_WRITE_ALIGNMENT_BYTES as u64;
    let len = file_size_bytes.checked_sub(position)?;
    (len > 0 && len < alignment && file_size_bytes.is_multiple_of(alignment))
        .then_some(len as usize)
}

/// Checks an entry header read at a position with `bytes_left` bytes to the end of the segment,
/// where the entry must start at offset `expected_base_offset`: the entry is at most
/// `ENTRY_SIZE_MAX`, holds at least one message, starts at the expected offset, does not overflow
/// the offset space, and fits in the bytes left. Returns the entry's size in bytes (header
/// included). The checksums are `check_entry_payload`'s.
///
/// # Errors
/// A sentence naming the rule the header breaks (the scan of open stops there).
pub fn check_entry_header(
    header: &EntryHeader,
    expected_base_offset: u64,
    bytes_left: u64,
) -> Result<u64, String> {
    let entry_size = ENTRY_HEADER_SIZE as u64 + u64::from(header.length);
    if entry_size > u64::from(ENTRY_SIZE_MAX) {
        return Err(format!(
            "entry of {entry_size} bytes exceeds the {ENTRY_SIZE_MAX}-byte limit"
        ));
    }
    if header.message_count == 0 {
        return Err("message_count is 0".to_owned());
    }
    if header.base_offset != expected_base_offset {
        return Err(format!(
            "base offset {} where offset {expected_base_offset} was expected",
            header.base_offset
        ));
    }
    if expected_base_offset
        .checked_add(u64::from(header.message_count))
        .is_none()
    {
        return Err(format!(
            "{} messages at offset {expected_base_offset} overflow the offset space",
            header.message_count
        ));
    }
    if entry_size > bytes_left {
        return Err(format!(
            "entry of {entry_size} bytes but only {bytes_left} bytes left"
        ));
    }
    Ok(entry_size)
}

/// Checks an entry's payload against its header by the checksum rules its first message flags
/// (`crate::entry::check_payload`; issue 12 item 1): without bit 1 its XXH3-64 equals the
/// header's checksum; with it, each message's payload matches its message checksum and the
/// message headers and stamp hash to the header's checksum, in one pass; with bit 2 (the
/// timestamp rule) either hash starts with the header's `base_timestamp_us`. Either way (the
/// header itself has no checksum of its own) the checksummed message section agrees with the
/// header, holding
/// exactly `message_count` messages that fill the payload. Every reader of entries applies it:
/// open's scan, reads, the resync after damage, producer recovery, and `shardline inspect
/// segment`.
///
/// # Errors
/// A sentence starting "payload checksum" (the whole payload's, or a message's) or "entry
/// checksum" (the message headers and stamp, issue-12 rule) with both checksums when they
/// differ, or why the messages do not match the header.
pub fn check_entry_payload(header: &EntryHeader, payload: &[u8]) -> Result<(), String> {
    check_payload(header, payload)
}

/// The resync rule after damage in the last segment (`storage/FORMAT.md` section 4, "Open" step
/// 4): whether the header read `bytes_after_damage` bytes past the damaged entry's position
/// (with `bytes_left` to the end of the segment) could start a valid entry. It must pass
/// `check_entry_header` at its own `base_offset`, and two bounds that every entry of a segment
/// meets because every message takes a 32-byte message header in the file:
/// - its `base_offset` lies in `min_base_offset ..= min_base_offset + bytes_after_damage / 32`
///   (`min_base_offset` is the end of the valid entries before the damage; the offsets between
///   were written back to back in the bytes between, at least 32 bytes each);
/// - its payload holds `message_count` message headers: `message_count * 32 <= length`.
///
/// Returns the entry's size; the caller then checks its payload with `check_entry_payload`. A
/// valid entry found this way means the damage is interior (open quarantines the bytes), not a
/// torn tail. The bounds reject the garbage of a damaged entry cheaply: without them, in a
/// 100 KB entry of text lines, 13,944 positions passed the header rules and were charged 139 MB,
/// spending the search's budget before it reached the next valid entry (issue 12 follow-up).
pub fn resync_entry_header(
    header: &EntryHeader,
    min_base_offset: u64,
    bytes_after_damage: u64,
    bytes_left: u64,
) -> Option<u64> {
    let offsets_between = header.base_offset.checked_sub(min_base_offset)?;
    if offsets_between > bytes_after_damage / MESSAGE_HEADER_SIZE as u64 {
        return None;
    }
    if u64::from(header.message_count) * MESSAGE_HEADER_SIZE as u64 > u64::from(header.length) {
        return None;
    }
    check_entry_header(header, header.base_offset, bytes_left).ok()
}

/// The work budget of the resync search after damage at some position of the last segment
/// (`RESYNC_CHARGED_BYTES_PER_TAIL_BYTE` in `limits.rs`): every candidate entry whose header
/// passes the rules (`resync_entry_header`, or `check_entry_header` further in a run) is charged
/// 32 bytes per message header its framing walk reads, then, when framed, the rest of its
/// payload before it is hashed ([`ResyncCandidate`]). Open and `shardline inspect
/// segment` charge at the same points, so they spend the budget alike and reach the same verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncBudget {
    limit: u64,
    charged: u64,
}

impl ResyncBudget {
    /// The budget of a search over `bytes_after_damage` bytes (from the damaged entry to the end
    /// of the segment).
    pub fn new(bytes_after_damage: u64) -> Self {
        Self {
            limit: bytes_after_damage.saturating_mul(RESYNC_CHARGED_BYTES_PER_TAIL_BYTE),
            charged: 0,
        }
    }

    /// Charges a candidate's `payload_bytes`; `false` (nothing charged) when that would exceed
    /// the budget: the search must stop with `Resync::BudgetSpent`.
    pub fn charge(&mut self, payload_bytes: u32) -> bool {
        let charged = self.charged + u64::from(payload_bytes);
        if charged > self.limit {
            return false;
        }
        self.charged = charged;
        true
    }

    /// Payload bytes charged so far (at most `limit`).
    pub fn charged(&self) -> u64 {
        self.charged
    }

    /// The most the search may charge (bytes).
    pub fn limit(&self) -> u64 {
        self.limit
    }
}

/// One resync candidate's framing walk and its charges to the `ResyncBudget`, sans-IO so that
/// open (async, `recovery.rs`) and `shardline inspect segment` (sync) walk and charge alike
/// (`storage/FORMAT.md` section 4, "Open" step 4). After its header passes
/// `resync_entry_header` (or `check_entry_header` further in a run), a candidate's message
/// headers are read one by one, each charged its 32 bytes before it is read, and their `length`
/// fields must step exactly to the end of the message section (16 bytes before the payload's end
/// when the first message flags a stamp): a necessary condition of `check_message_section` that
/// reads no payload. Only a candidate so framed is charged the rest of its payload
/// (`length` minus the headers already charged), then hashed by the caller with
/// `check_entry_payload`. A valid entry is thus charged its `length` once; garbage is mostly
/// refused at its first message header for 32 bytes, where charging the whole claimed `length`
/// up front spent the budget on entries of small messages (an adversarial review found 62
/// candidates inside an entry of 500 one-byte messages charging over 3x the tail).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResyncCandidate {
    /// Payload bytes of the candidate (its header's `length`).
    length: u32,
    /// Where the payload ends in the file.
    payload_end: u64,
    /// Where the message section ends; known once the first message header is read.
    section_end: Option<u64>,
    /// Where the next message header starts.
    at: u64,
    /// Message headers still to walk.
    messages_left: u32,
    /// Bytes charged so far (32 per message header read).
    charged: u32,
    /// The framing broke.
    broken: bool,
}

/// What a [`ResyncCandidate`] asks of its caller next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CandidateStep {
    /// Read the 32 bytes at this file position and pass them to [`ResyncCandidate::feed`].
    Read(u64),
    /// The framing fits and the whole payload is charged: read it and check it with
    /// `check_entry_payload`.
    Check,
    /// Not an entry: the framing breaks.
    Refused,
    /// The next charge would exceed the budget: the search stops (`Resync::BudgetSpent`).
    BudgetSpent,
}

impl ResyncCandidate {
    /// The walk of the candidate whose header is `header`, its payload starting at file position
    /// `payload_position`.
    pub fn new(header: &EntryHeader, payload_position: u64) -> Self {
        Self {
            length: header.length,
            payload_end: payload_position + u64::from(header.length),
            section_end: None,
            at: payload_position,
            messages_left: header.message_count,
            charged: 0,
            broken: header.length < MESSAGE_HEADER_SIZE as u32 || header.message_count == 0,
        }
    }

    /// The next step; charges `budget` for the header it asks to read, or for the rest of the
    /// payload when it answers `Check`.
    pub fn next(&mut self, budget: &mut ResyncBudget) -> CandidateStep {
        if self.broken {
            return CandidateStep::Refused;
        }
        if self.messages_left == 0 {
            if Some(self.at) != self.section_end {
                return CandidateStep::Refused;
            }
            return if budget.charge(self.length - self.charged) {
                self.charged = self.length;
                CandidateStep::Check
            } else {
                CandidateStep::BudgetSpent
            };
        }
        let end = self.section_end.unwrap_or(self.payload_end);
        if end.saturating_sub(self.at) < MESSAGE_HEADER_SIZE as u64 {
            return CandidateStep::Refused;
        }
        if !budget.charge(MESSAGE_HEADER_SIZE as u32) {
            return CandidateStep::BudgetSpent;
        }
        self.charged += MESSAGE_HEADER_SIZE as u32;
        CandidateStep::Read(self.at)
    }

    /// Takes the 32-byte message header read at the position `next` asked for.
    ///
    /// # Panics
    /// `message_header` is shorter than 32 bytes.
    pub fn feed(&mut self, message_header: &[u8]) {
        let section_end = *self.section_end.get_or_insert_with(|| {
            if message_header[12] & 1 == 1 {
                self.payload_end.saturating_sub(PRODUCER_STAMP_SIZE as u64)
            } else {
                self.payload_end
            }
        });
        if section_end.saturating_sub(self.at) < MESSAGE_HEADER_SIZE as u64 {
            self.broken = true;
            return;
        }
        let length = u32::from_le_bytes([
            message_header[0],
            message_header[1],
            message_header[2],
            message_header[3],
        ]);
        self.at += MESSAGE_HEADER_SIZE as u64 + u64::from(length);
        self.messages_left -= 1;
        if self.at > section_end {
            self.broken = true;
        }
    }
}

/// What the resync search after damage in the last segment found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Resync {
    /// Valid entries start after the damage; the last offset of their back-to-back run.
    Found { last_offset: u64 },
    /// No valid entry starts anywhere after the damage.
    NotFound,
    /// The search spent its `ResyncBudget` without a verdict.
    BudgetSpent,
}

/// Open's verdict on the first invalid entry of the last segment (`storage/FORMAT.md` section
/// 3): `Some(last_offset)` when its bytes are kept in a quarantine file before the truncation,
/// `None` for a plain torn tail. `complete` is `Some(last offset the entry claims)` when the
/// entry is complete (its header passes `check_entry_header`, so it lies whole in the file, and
/// only its payload fails `check_entry_payload`): it may have been acknowledged, a torn write
/// and bit rot look alike there, so it is kept whatever follows. A short tail (the header
/// incomplete or breaking the rules) is kept only when the search finds valid entries after it
/// or spends its budget first (conservative). `last_offset` is the last offset known to be in
/// the kept bytes: the found run's, else the complete entry's own, else `first_offset` (the
/// damaged entry's expected offset; what follows is unknown).
pub fn damage_verdict(complete: Option<u64>, resync: Resync, first_offset: u64) -> Option<u64> {
    match (resync, complete) {
        (Resync::Found { last_offset }, _) | (_, Some(last_offset)) => Some(last_offset),
        (Resync::BudgetSpent, None) => Some(first_offset),
        (Resync::NotFound, None) => None,
    }
}

/// One entry as a segment's index file describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexedEntry {
    pub base_offset: u64,
    pub message_count: u64,
    /// Byte position of the entry in its segment file.
    pub position: u64,
    /// Bytes of the entry, header included.
    pub size_bytes: u64,
}

/// What a usable index file says about its closed segment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClosedSegmentIndex {
    /// One past the segment's last offset.
    pub end_offset: u64,
    pub entries: Vec<IndexedEntry>,
}

/// The decision open makes about a closed segment's index file, given its payload (the file
/// without its verified durable trailer): `Ok` when open uses it as the segment's index (and
/// does not scan the segment; reads then check each entry they return), `Err` when open rescans
/// the segment and rewrites the index.
///
/// # Errors
/// Why open does not use the index (a sentence).
pub fn closed_segment_index(
    payload: &[u8],
    base_offset: u64,
    segment_size_bytes: u64,
) -> Result<ClosedSegmentIndex, String> {
    let index = SegmentIndex::decode(payload, base_offset, segment_size_bytes)?;
    let entries = (0..index.rows.len())
        .map(|row_index| {
            let row = index.rows[row_index];
            IndexedEntry {
                base_offset: row.base_offset,
                message_count: index.entry_end_offset(row_index) - row.base_offset,
                position: row.position,
                size_bytes: index.entry_end_position(row_index) - row.position,
            }
        })
        .collect();
    Ok(ClosedSegmentIndex {
        end_offset: index.end_offset,
        entries,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 12 item 3: direct-write padding is all zero, fewer than one alignment unit of
    /// bytes, up to an aligned end of file; each rule is checked at its edge.
    #[test]
    fn issue12_3_direct_write_padding_rule_edges() {
        let unit = DIRECT_WRITE_ALIGNMENT_BYTES as u64;
        assert_eq!(direct_write_padding_len(4000, unit), Some(96));
        assert_eq!(direct_write_padding_len(unit + 1, 2 * unit), Some(4095));
        assert_eq!(
            direct_write_padding_len(unit, 2 * unit),
            None,
            "a whole unit"
        );
        assert_eq!(direct_write_padding_len(unit, unit), None, "no tail");
        assert_eq!(
            direct_write_padding_len(4000, unit + 8),
            None,
            "unaligned end"
        );
        assert_eq!(
            direct_write_padding_len(unit + 1, unit),
            None,
            "end before position"
        );
        assert!(is_direct_write_padding(4000, unit, &[0; 96]));
        let mut tail = [0; 96];
        tail[95] = 1;
        assert!(
            !is_direct_write_padding(4000, unit, &tail),
            "a non-zero byte"
        );
        assert!(
            !is_direct_write_padding(4000, unit, &[0; 95]),
            "a short read"
        );
    }

    /// `resync_entry_header`'s bounds (FORMAT.md section 4, "Open" step 4): the offset lies in
    /// `min ..= min + bytes_after_damage / 32`, and `message_count * 32 <= length`; each bound
    /// is checked at its edge.
    #[test]
    fn issue12_resync_header_bounds_offset_by_bytes_after_damage_and_count_by_length() {
        let header = |base_offset: u64, message_count: u32, length: u32| EntryHeader {
            base_offset,
            base_timestamp_us: 0,
            message_count,
            length,
            checksum: 0,
        };
        let left = 1 << 20;
        // 640 bytes after the damage hold at most 20 messages: offsets 100..=120.
        assert_eq!(
            resync_entry_header(&header(120, 2, 64), 100, 640, left),
            Some(96)
        );
        assert_eq!(
            resync_entry_header(&header(121, 2, 64), 100, 640, left),
            None
        );
        assert_eq!(
            resync_entry_header(&header(100, 2, 64), 100, 640, left),
            Some(96)
        );
        assert_eq!(
            resync_entry_header(&header(99, 2, 64), 100, 640, left),
            None
        );
        // Two messages need at least 64 payload bytes for their headers.
        assert_eq!(
            resync_entry_header(&header(110, 2, 63), 100, 640, left),
            None
        );
        // The header rules still apply: no message, or more bytes than are left.
        assert_eq!(
            resync_entry_header(&header(110, 0, 64), 100, 640, left),
            None
        );
        assert_eq!(resync_entry_header(&header(110, 2, 64), 100, 640, 95), None);
    }

    /// `ResyncCandidate`: a framed candidate is charged 32 bytes per message header walked and
    /// then the rest of its payload, its `length` in all; a candidate whose first message header
    /// oversteps is refused for 32 bytes.
    #[test]
    fn issue12_resync_candidate_charges_headers_walked_then_the_rest_once_framed() {
        let message = |length: u32| {
            let mut bytes = [0u8; 32];
            bytes[0..4].copy_from_slice(&length.to_le_bytes());
            bytes
        };
        let header = EntryHeader {
            base_offset: 0,
            base_timestamp_us: 0,
            message_count: 2,
            length: 32 + 10 + 32 + 6,
            checksum: 0,
        };
        let mut budget = ResyncBudget::new(1000);
        let mut candidate = ResyncCandidate::new(&header, 100);
        assert_eq!(candidate.next(&mut budget), CandidateStep::Read(100));
        candidate.feed(&message(10));
        assert_eq!(candidate.next(&mut budget), CandidateStep::Read(142));
        candidate.feed(&message(6));
        assert_eq!(candidate.next(&mut budget), CandidateStep::Check);
        assert_eq!(budget.charged(), u64::from(header.length));

        let mut budget = ResyncBudget::new(1000);
        let mut candidate = ResyncCandidate::new(&header, 100);
        assert_eq!(candidate.next(&mut budget), CandidateStep::Read(100));
        candidate.feed(&message(1 << 20));
        assert_eq!(candidate.next(&mut budget), CandidateStep::Refused);
        assert_eq!(budget.charged(), 32);

        // Out of budget before the first header is read.
        let mut budget = ResyncBudget::new(10);
        let mut candidate = ResyncCandidate::new(&header, 100);
        assert!(budget.charge(10));
        assert_eq!(candidate.next(&mut budget), CandidateStep::BudgetSpent);
    }

    #[test]
    fn issue7_4_damage_verdict_keeps_complete_entries_and_spent_searches() {
        let found = Resync::Found { last_offset: 9 };
        assert_eq!(damage_verdict(None, found, 3), Some(9));
        assert_eq!(damage_verdict(Some(5), found, 3), Some(9));
        assert_eq!(damage_verdict(Some(5), Resync::NotFound, 3), Some(5));
        assert_eq!(damage_verdict(Some(5), Resync::BudgetSpent, 3), Some(5));
        assert_eq!(damage_verdict(None, Resync::BudgetSpent, 3), Some(3));
        assert_eq!(damage_verdict(None, Resync::NotFound, 3), None);
    }

    #[test]
    fn issue7_1_resync_budget_is_three_bytes_per_tail_byte() {
        let mut budget = ResyncBudget::new(100);
        assert_eq!(budget.limit(), 300);
        assert!(budget.charge(250));
        assert!(!budget.charge(51));
        assert_eq!(budget.charged(), 250);
        assert!(budget.charge(50));
        assert!(!budget.charge(1));
        assert_eq!(budget.charged(), 300);
    }
}
