//! The offset index of one segment: one row (`base_offset`, file position) per entry, kept in memory
//! whole for the active segment and persisted as `{base_offset:020}.index` (through
//! `durable_replace`) when a segment is closed; a sealed segment's index is read back from that
//! file on demand (`log/sealed.rs`, issue 11 section 4). This module encodes, decodes and checks; it never does I/O and never trusts a
//! decoded file before `decode` has checked every row against the segment it describes.

use crate::entry::ENTRY_HEADER_SIZE;
use crate::limits::ENTRY_SIZE_MAX;

/// First 8 bytes of an index file payload.
pub(crate) const INDEX_MAGIC: [u8; 8] = *b"SLINDEX\0";
/// Current index file layout version.
pub(crate) const INDEX_VERSION: u32 = 1;
/// Bytes before the rows: magic, version, reserved, base, end, size, row count.
pub(crate) const INDEX_HEADER_SIZE: usize = 48;
/// Bytes per row: `base_offset` u64 LE, position u64 LE.
pub(crate) const INDEX_ROW_SIZE: usize = 16;

/// Where one entry starts: its first offset and its byte position in the segment file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct IndexRow {
    pub(crate) base_offset: u64,
    pub(crate) position: u64,
}

/// The entries of one segment. Entry `i` spans bytes `rows[i].position..rows[i+1].position` (the
/// last one up to `size_bytes`) and offsets `rows[i].base_offset..rows[i+1].base_offset` (the last
/// one up to `end_offset`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SegmentIndex {
    pub(crate) base_offset: u64,
    /// One past the last offset in the segment (`base_offset` when empty).
    pub(crate) end_offset: u64,
    pub(crate) size_bytes: u64,
    pub(crate) rows: Vec<IndexRow>,
}

impl SegmentIndex {
    pub(crate) fn empty(base_offset: u64) -> Self {
        SegmentIndex {
            base_offset,
            end_offset: base_offset,
            size_bytes: 0,
            rows: Vec::new(),
        }
    }

    /// Byte position just past entry `row_index`.
    pub(crate) fn entry_end_position(&self, row_index: usize) -> u64 {
        self.rows
            .get(row_index + 1)
            .map_or(self.size_bytes, |next| next.position)
    }

    /// Offset just past entry `row_index`.
    pub(crate) fn entry_end_offset(&self, row_index: usize) -> u64 {
        self.rows
            .get(row_index + 1)
            .map_or(self.end_offset, |next| next.base_offset)
    }

    /// Records an entry appended at the end of the segment.
    ///
    /// # Panics
    /// If the entry does not start exactly at the current end (offset and position): the writer
    /// appends in offset order, so anything else is a bug.
    pub(crate) fn push(&mut self, base_offset: u64, message_count: u32, size_bytes: u64) {
        assert_eq!(
            base_offset, self.end_offset,
            "entries are appended in offset order"
        );
        assert!(message_count >= 1 && size_bytes >= ENTRY_HEADER_SIZE as u64);
        self.rows.push(IndexRow {
            base_offset,
            position: self.size_bytes,
        });
        self.end_offset = base_offset + u64::from(message_count);
        self.size_bytes += size_bytes;
    }

    /// Forgets every entry at or after `end_offset`, which must be an entry boundary of this
    /// segment (used when a refused write rolls the log back to its acknowledged end).
    ///
    /// # Panics
    /// If `end_offset` is outside the segment or not where an entry starts or the last one ends:
    /// the writer rolls back only to an acknowledged end, which is always a boundary.
    pub(crate) fn truncate_to(&mut self, end_offset: u64) {
        assert!(
            self.base_offset <= end_offset && end_offset <= self.end_offset,
            "roll back to offset {end_offset} outside segment {}..{}",
            self.base_offset,
            self.end_offset
        );
        if end_offset == self.end_offset {
            return;
        }
        let keep_count = self
            .rows
            .partition_point(|row| row.base_offset < end_offset);
        let first_dropped = self.rows[keep_count];
        assert_eq!(
            first_dropped.base_offset, end_offset,
            "roll back to offset {end_offset}, which is inside an entry"
        );
        self.rows.truncate(keep_count);
        self.size_bytes = first_dropped.position;
        self.end_offset = end_offset;
    }

    /// The index file payload (before the durable-replace trailer); see `storage/FORMAT.md`.
    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut bytes = Vec::with_capacity(INDEX_HEADER_SIZE + self.rows.len() * INDEX_ROW_SIZE);
        bytes.extend_from_slice(&INDEX_MAGIC);
        bytes.extend_from_slice(&INDEX_VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&self.base_offset.to_le_bytes());
        bytes.extend_from_slice(&self.end_offset.to_le_bytes());
        bytes.extend_from_slice(&self.size_bytes.to_le_bytes());
        bytes.extend_from_slice(&(self.rows.len() as u64).to_le_bytes());
        for row in &self.rows {
            bytes.extend_from_slice(&row.base_offset.to_le_bytes());
            bytes.extend_from_slice(&row.position.to_le_bytes());
        }
        bytes
    }

    /// Decodes an index file payload and checks it describes a segment starting at `base_offset`
    /// whose file is `size_bytes` long, with rows that are well-formed entries.
    ///
    /// # Errors
    /// A sentence saying what does not match.
    pub(crate) fn decode(
        bytes: &[u8],
        base_offset: u64,
        size_bytes: u64,
    ) -> Result<SegmentIndex, String> {
        let u64_at = |at: usize| {
            let mut field = [0u8; 8];
            field.copy_from_slice(&bytes[at..at + 8]);
            u64::from_le_bytes(field)
        };
        if bytes.len() < INDEX_HEADER_SIZE {
            return Err(format!(
                "{} bytes is shorter than the {INDEX_HEADER_SIZE}-byte index header",
                bytes.len()
            ));
        }
        if bytes[0..8] != INDEX_MAGIC {
            return Err("bad magic".to_owned());
        }
        let mut version = [0u8; 4];
        version.copy_from_slice(&bytes[8..12]);
        let version = u32::from_le_bytes(version);
        if version != INDEX_VERSION {
            return Err(format!("version {version}, expected {INDEX_VERSION}"));
        }
        let stored_base_offset = u64_at(16);
        let end_offset = u64_at(24);
        let stored_size_bytes = u64_at(32);
        let row_count = u64_at(40);
        if stored_base_offset != base_offset {
            return Err(format!(
                "index is for base offset {stored_base_offset}, the segment's is {base_offset}"
            ));
        }
        if stored_size_bytes != size_bytes {
            return Err(format!(
                "index records {stored_size_bytes} segment bytes, the segment has {size_bytes}"
            ));
        }
        let rows_size = bytes.len() - INDEX_HEADER_SIZE;
        if row_count.checked_mul(INDEX_ROW_SIZE as u64) != Some(rows_size as u64) {
            return Err(format!(
                "row count {row_count} does not match {rows_size} row bytes"
            ));
        }
        let rows: Vec<IndexRow> = bytes[INDEX_HEADER_SIZE..]
            .chunks_exact(INDEX_ROW_SIZE)
            .map(|row| {
                let mut base = [0u8; 8];
                let mut position = [0u8; 8];
                base.copy_from_slice(&row[0..8]);
                position.copy_from_slice(&row[8..16]);
                IndexRow {
                    base_offset: u64::from_le_bytes(base),
                    position: u64::from_le_bytes(position),
                }
            })
            .collect();
        let index = SegmentIndex {
            base_offset,
            end_offset,
            size_bytes,
            rows,
        };
        index.check()?;
        Ok(index)
    }

    /// Checks the rows describe back-to-back entries filling the segment exactly.
    fn check(&self) -> Result<(), String> {
        let Some(first) = self.rows.first() else {
            if self.size_bytes != 0 || self.end_offset != self.base_offset {
                return Err("no rows for a non-empty segment".to_owned());
            }
            return Ok(());
        };
        if first.base_offset != self.base_offset || first.position != 0 {
            return Err(format!(
                "first row is (offset {}, byte {}), expected (offset {}, byte 0)",
                first.base_offset, first.position, self.base_offset
            ));
        }
        for row_index in 0..self.rows.len() {
            let row = self.rows[row_index];
            let end_position = self.entry_end_position(row_index);
            let end_offset = self.entry_end_offset(row_index);
            let entry_size = end_position.checked_sub(row.position);
            if !entry_size.is_some_and(|size| {
                size >= ENTRY_HEADER_SIZE as u64 && size <= u64::from(ENTRY_SIZE_MAX)
            }) {
                return Err(format!(
                    "row {row_index} at byte {} spans to byte {end_position}: not a valid entry size",
                    row.position
                ));
            }
            let message_count = end_offset.checked_sub(row.base_offset);
            if !message_count.is_some_and(|count| count >= 1 && u32::try_from(count).is_ok()) {
                return Err(format!(
                    "row {row_index} at offset {} spans to offset {end_offset}: not a valid \
                     message count",
                    row.base_offset
                ));
            }
        }
        Ok(())
    }

    /// The row of the entry containing `offset`, or of the first entry if `offset` precedes it;
    /// `None` when the segment is empty.
    pub(crate) fn row_containing(&self, offset: u64) -> Option<usize> {
        if self.rows.is_empty() {
            return None;
        }
        Some(
            self.rows
                .partition_point(|row| row.base_offset <= offset)
                .saturating_sub(1),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sample() -> SegmentIndex {
        let mut index = SegmentIndex::empty(100);
        index.push(100, 3, 40);
        index.push(103, 1, 32);
        index.push(104, 10, 1000);
        index
    }

    #[test]
    fn round_trip() {
        let index = sample();
        assert_eq!(index.end_offset, 114);
        assert_eq!(index.size_bytes, 1072);
        let bytes = index.encode();
        assert_eq!(bytes.len(), INDEX_HEADER_SIZE + 3 * INDEX_ROW_SIZE);
        assert_eq!(SegmentIndex::decode(&bytes, 100, 1072), Ok(index));
    }

    #[test]
    fn decode_rejects_other_segment_or_size() {
        let bytes = sample().encode();
        assert_eq!(
            SegmentIndex::decode(&bytes, 101, 1072),
            Err("index is for base offset 100, the segment's is 101".to_owned())
        );
        assert_eq!(
            SegmentIndex::decode(&bytes, 100, 2000),
            Err("index records 1072 segment bytes, the segment has 2000".to_owned())
        );
    }

    #[test]
    fn decode_rejects_rows_that_are_not_entries() {
        let mut index = sample();
        index.rows[1].position = 41; // entry 0 would be 41 bytes, entry 1 31 bytes
        assert!(
            SegmentIndex::decode(&index.encode(), 100, 1072)
                .unwrap_err()
                .contains("row 1")
        );
        let mut index = sample();
        index.rows[2].base_offset = 103; // entry 1 would hold 0 messages
        assert!(
            SegmentIndex::decode(&index.encode(), 100, 1072)
                .unwrap_err()
                .contains("row 1")
        );
    }

    #[test]
    fn row_containing_finds_the_entry() {
        let index = sample();
        assert_eq!(index.row_containing(99), Some(0));
        assert_eq!(index.row_containing(100), Some(0));
        assert_eq!(index.row_containing(102), Some(0));
        assert_eq!(index.row_containing(103), Some(1));
        assert_eq!(index.row_containing(113), Some(2));
        assert_eq!(SegmentIndex::empty(5).row_containing(5), None);
    }

    #[test]
    fn truncate_to_drops_the_entries_from_a_boundary() {
        let mut index = sample();
        let full = index.clone();
        index.truncate_to(full.end_offset);
        assert_eq!(index, full);
        index.truncate_to(103);
        assert_eq!(index.rows, full.rows[..1]);
        assert_eq!(
            (index.end_offset, index.size_bytes),
            (103, full.rows[1].position)
        );
        index.truncate_to(100);
        assert_eq!(index, SegmentIndex::empty(100));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256),
                               base in any::<u64>(), size in any::<u64>()) {
            let _ = SegmentIndex::decode(&bytes, base, size);
        }

        #[test]
        fn decode_never_panics_on_valid_header(
            rows in proptest::collection::vec((any::<u64>(), any::<u64>()), 0..8),
            end in any::<u64>(), base in any::<u64>(), size in any::<u64>()) {
            let index = SegmentIndex {
                base_offset: base,
                end_offset: end,
                size_bytes: size,
                rows: rows.iter().map(|&(b, p)| IndexRow { base_offset: b, position: p }).collect(),
            };
            if let Ok(decoded) = SegmentIndex::decode(&index.encode(), base, size) {
                prop_assert_eq!(decoded, index);
            }
        }

        #[test]
        fn encode_decode_round_trips(entries in proptest::collection::vec((1u32..100, 32u64..5000), 0..50),
                                     base in 0u64..1 << 40) {
            let mut index = SegmentIndex::empty(base);
            for (count, size) in entries {
                index.push(index.end_offset, count, size);
            }
            let decoded = SegmentIndex::decode(&index.encode(), base, index.size_bytes);
            prop_assert_eq!(decoded, Ok(index));
        }
    }
}
