//! The sealed (closed) segments of one partition log, oldest first: a fixed-size summary of each
//! (offsets, bytes, entry count, and its last entry's timestamp once retention verified it) and a
//! bounded least-recently-used cache of their indexes. A
//! sealed segment's index is not kept in memory for the life of the log: a read that needs it
//! loads it from the segment's index file (checked as open checks it, rebuilt from the segment
//! when that file is missing or damaged) and caches it. So a log's memory grows with its segment
//! count, not with its entry count (issue 11 section 4, "Memory must not grow with retained
//! data"; `storage/FORMAT.md` section 4).
//!
//! This module must never hold more index rows than [`SEALED_INDEX_CACHE_BYTES_MAX`] and
//! [`SEALED_INDEX_CACHE_COUNT_MAX`] allow (beyond the one index used last), and never serve an
//! index it has not checked against the segment's summary.

use std::collections::VecDeque;
use std::path::Path;
use std::rc::Rc;

use super::LogError;
use super::index::{IndexRow, SegmentIndex};
use super::recovery::{load_closed_index, segment_path};
use crate::limits::{SEALED_INDEX_CACHE_BYTES_MAX, SEALED_INDEX_CACHE_COUNT_MAX};
use crate::space::is_descriptors_exhausted;

/// What a log remembers of a sealed segment without its index: 48 bytes per segment (plus the 16
/// bytes of its verified last timestamp, kept beside it in [`SealedSegments`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedSegment {
    pub(crate) base_offset: u64,
    /// One past the segment's last offset.
    pub(crate) end_offset: u64,
    /// The segment file's length, bytes.
    pub(crate) size_bytes: u64,
    /// Entries (batches) in the segment.
    pub(crate) entry_count: u64,
    /// Byte position of the segment's last entry (`None` for an empty segment): retention by age
    /// reads that entry's timestamp (issue 11 section 4).
    pub(crate) last_entry_position: Option<u64>,
}

impl SealedSegment {
    /// The summary of the segment `index` describes.
    pub(crate) fn of(index: &SegmentIndex) -> Self {
        SealedSegment {
            base_offset: index.base_offset,
            end_offset: index.end_offset,
            size_bytes: index.size_bytes,
            entry_count: index.rows.len() as u64,
            last_entry_position: index.rows.last().map(|row| row.position),
        }
    }

    /// Whether `index` describes exactly this segment (a loaded index must, or the files changed
    /// since the segment was sealed or opened).
    fn matches(&self, index: &SegmentIndex) -> bool {
        *self == SealedSegment::of(index)
    }
}

/// The sealed segments of a log, oldest first, and the cache of their indexes.
#[derive(Debug, Default)]
pub(crate) struct SealedSegments {
    segments: VecDeque<SealedSegment>,
    /// For each of `segments` (same order), its last entry's newest message timestamp once
    /// retention by age verified that entry (`retention.rs`, `last_entry_newest_timestamp_us`):
    /// a sealed segment never
    /// changes, so the verified value stays true, and a pass need not reread and rehash the
    /// entry (up to `ENTRY_SIZE_MAX` bytes) every `--retention-interval` until it expires.
    last_timestamps_us: VecDeque<Option<u64>>,
    /// Sum of the segments' `size_bytes`.
    size_bytes: u64,
    cache: IndexCache,
}

impl SealedSegments {
    /// Sealed segments held.
    pub(crate) fn len(&self) -> usize {
        self.segments.len()
    }

    /// Whether the log has no sealed segment (only its active one).
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.segments.is_empty()
    }

    /// Bytes of all sealed segment files together (what retention by size weighs; issue 11
    /// section 4).
    pub(crate) fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The oldest sealed segment: the first one retention deletes.
    pub(crate) fn oldest(&self) -> Option<&SealedSegment> {
        self.segments.front()
    }

    /// The newest sealed segment: the one just before the active segment.
    pub(crate) fn newest(&self) -> Option<&SealedSegment> {
        self.segments.back()
    }

    /// The sealed segments, oldest first.
    pub(crate) fn iter(&self) -> impl DoubleEndedIterator<Item = &SealedSegment> {
        self.segments.iter()
    }

    /// Adds the segment a roll just sealed (or open loaded), with its index, which is cached as
    /// the most recently used one: readers catching up read it next.
    ///
    /// # Panics
    /// If it does not start where the newest sealed segment ends: segments are contiguous.
    pub(crate) fn push(&mut self, index: SegmentIndex) {
        let segment = SealedSegment::of(&index);
        self.push_summary(segment);
        self.cache.insert(segment.base_offset, Rc::new(index));
    }

    /// Adds a segment by its summary alone (its index stays on disk until a read needs it).
    ///
    /// # Panics
    /// If it does not start where the newest sealed segment ends.
    pub(crate) fn push_summary(&mut self, segment: SealedSegment) {
        if let Some(newest) = self.segments.back() {
            assert_eq!(
                newest.end_offset, segment.base_offset,
                "sealed segments are contiguous"
            );
        }
        self.size_bytes += segment.size_bytes;
        self.segments.push_back(segment);
        self.last_timestamps_us.push_back(None);
    }

    /// The verified `base_timestamp_us` of `segment`'s last entry, if retention remembered one
    /// for it ([`Self::remember_last_timestamp_us`]); `None` when never verified or when
    /// `segment` is no longer one of the log's sealed segments.
    pub(crate) fn last_timestamp_us(&self, segment: &SealedSegment) -> Option<u64> {
        let index = self.position_of(segment)?;
        self.last_timestamps_us[index]
    }

    /// Remembers `timestamp_us`, the `base_timestamp_us` of `segment`'s last entry, which the
    /// caller verified (`storage/FORMAT.md` section 3c). Forgotten with the segment. Does
    /// nothing when `segment` is no longer one of the log's sealed segments (retention or a
    /// rollback removed it meanwhile).
    pub(crate) fn remember_last_timestamp_us(
        &mut self,
        segment: &SealedSegment,
        timestamp_us: u64,
    ) {
        if let Some(index) = self.position_of(segment) {
            self.last_timestamps_us[index] = Some(timestamp_us);
        }
    }

    /// Where `segment` is in `segments`, if it is exactly one of them.
    fn position_of(&self, segment: &SealedSegment) -> Option<usize> {
        let index = self
            .segments
            .partition_point(|held| held.base_offset < segment.base_offset);
        (self.segments.get(index) == Some(segment)).then_some(index)
    }

    /// Forgets the oldest sealed segment and its cached index (retention deleted its files, or
    /// is about to). Constant time.
    pub(crate) fn pop_oldest(&mut self) -> Option<SealedSegment> {
        let segment = self.segments.pop_front()?;
        self.last_timestamps_us.pop_front();
        self.size_bytes -= segment.size_bytes;
        self.cache.remove(segment.base_offset);
        Some(segment)
    }

    /// Forgets the newest sealed segment and its cached index (a rollback makes it the active
    /// segment again).
    pub(crate) fn pop_newest(&mut self) -> Option<SealedSegment> {
        let segment = self.segments.pop_back()?;
        self.last_timestamps_us.pop_back();
        self.size_bytes -= segment.size_bytes;
        self.cache.remove(segment.base_offset);
        Some(segment)
    }

    /// The sealed segment holding `offset`, or the oldest one when `offset` precedes it; `None`
    /// when `offset` is at or past the newest one's end (it is in the active segment) or there
    /// is no sealed segment.
    pub(crate) fn lookup(&self, offset: u64) -> Option<SealedSegment> {
        let after = self
            .segments
            .partition_point(|segment| segment.base_offset <= offset);
        let segment = *self.segments.get(after.saturating_sub(1))?;
        (offset < segment.end_offset).then_some(segment)
    }

    /// The cached index of the sealed segment at `base_offset` (marked most recently used), or
    /// `None` when it is not cached: load it with [`load_sealed_index`] and [`Self::cache`] it.
    pub(crate) fn cached_index(&mut self, base_offset: u64) -> Option<Rc<SegmentIndex>> {
        self.cache.get(base_offset)
    }

    /// Caches `index`, loaded for `segment`, as the most recently used one, evicting the least
    /// recently used beyond the bounds. Returns `false` (caching nothing) when `segment` is no
    /// longer one of the log's sealed segments (retention or a rollback removed it meanwhile).
    pub(crate) fn cache(&mut self, segment: SealedSegment, index: Rc<SegmentIndex>) -> bool {
        assert!(segment.matches(&index), "a loaded index is checked first");
        if self.lookup(segment.base_offset) != Some(segment) {
            return false;
        }
        self.cache.insert(segment.base_offset, index);
        true
    }

    /// Drops every cached index (tests of the paths that load one).
    #[cfg(test)]
    pub(crate) fn clear_cache(&mut self) {
        self.cache = IndexCache::default();
    }

    /// Bytes of index rows cached now (for tests and metrics).
    #[cfg(test)]
    pub(crate) fn cached_row_bytes(&self) -> usize {
        self.cache.row_bytes
    }

    /// Indexes cached now.
    #[cfg(test)]
    pub(crate) fn cached_count(&self) -> usize {
        self.cache.entries.len()
    }
}

/// Reads the index of the sealed `segment` of the log in `dir`: its index file when it verifies
/// and describes the segment file as it is, else (logged) by a strict scan of the segment, as
/// open does (`storage/FORMAT.md` section 3, "Open", step 3). A rebuilt index is not written
/// back here (two reads could race to replace the file); the next open rewrites it.
///
/// # Errors
/// `Io` naming the file when it cannot be read; `Corrupt` naming the segment and byte position
/// when the scan finds an invalid entry, or position 0 when the segment no longer matches what
/// the log recorded when it was sealed (its length or offsets changed under the log).
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub(crate) async fn load_sealed_index(
    dir: &Path,
    segment: SealedSegment,
) -> Result<SegmentIndex, LogError> {
    let path = segment_path(dir, segment.base_offset);
    let (index, _scanned) = load_closed_index(dir, &path, segment.base_offset)
        .await
        .map_err(descriptors_exhausted_as_such)?;
    if !segment.matches(&index) {
        let found = SealedSegment::of(&index);
        return Err(LogError::Corrupt {
            path,
            position: 0,
            reason: format!(
                "sealed segment changed since the log recorded it: offsets {}..{}, {} bytes, {} \
                 entries, now offsets {}..{}, {} bytes, {} entries",
                segment.base_offset,
                segment.end_offset,
                segment.size_bytes,
                segment.entry_count,
                found.base_offset,
                found.end_offset,
                found.size_bytes,
                found.entry_count
            ),
        });
    }
    Ok(index)
}

/// An I/O failure that ran out of file descriptors (`EMFILE`, `ENFILE`) as
/// `LogError::DescriptorsExhausted`: a transient refusal (`ResourceExhausted` to the client, as a
/// segment open's), not storage damage.
fn descriptors_exhausted_as_such(error: LogError) -> LogError {
    match error {
        LogError::Io { path, op, source } if is_descriptors_exhausted(&source) => {
            LogError::DescriptorsExhausted { path, op, source }
        }
        other => other,
    }
}

/// Sealed-segment indexes, least recently used first, within [`SEALED_INDEX_CACHE_BYTES_MAX`] row
/// bytes and [`SEALED_INDEX_CACHE_COUNT_MAX`] indexes, except that the most recently used one is
/// always kept.
#[derive(Debug, Default)]
struct IndexCache {
    entries: VecDeque<(u64, Rc<SegmentIndex>)>,
    row_bytes: usize,
}

impl IndexCache {
    fn row_bytes_of(index: &SegmentIndex) -> usize {
        index.rows.len() * std::mem::size_of::<IndexRow>()
    }

    fn get(&mut self, base_offset: u64) -> Option<Rc<SegmentIndex>> {
        let at = self
            .entries
            .iter()
            .position(|(cached, _)| *cached == base_offset)?;
        let entry = self.entries.remove(at)?;
        let index = Rc::clone(&entry.1);
        self.entries.push_back(entry);
        Some(index)
    }

    fn insert(&mut self, base_offset: u64, index: Rc<SegmentIndex>) {
        self.remove(base_offset);
        self.row_bytes += Self::row_bytes_of(&index);
        self.entries.push_back((base_offset, index));
        while self.entries.len() > 1
            && (self.entries.len() > SEALED_INDEX_CACHE_COUNT_MAX
                || self.row_bytes > SEALED_INDEX_CACHE_BYTES_MAX)
        {
            let (_, evicted) = self
                .entries
                .pop_front()
                .expect("more than one entry is cached");
            self.row_bytes -= Self::row_bytes_of(&evicted);
        }
    }

    fn remove(&mut self, base_offset: u64) {
        if let Some(at) = self
            .entries
            .iter()
            .position(|(cached, _)| *cached == base_offset)
            && let Some((_, removed)) = self.entries.remove(at)
        {
            self.row_bytes -= Self::row_bytes_of(&removed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{FsyncPolicy, LogConfig, PartitionLog};

    fn block_on<F: std::future::Future>(future: F) -> F::Output {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    /// An index of `entry_count` entries of 100 bytes, one message each, from `base_offset`.
    fn index_of(base_offset: u64, entry_count: u64) -> SegmentIndex {
        let mut index = SegmentIndex::empty(base_offset);
        for entry in 0..entry_count {
            index.push(base_offset + entry, 1, 100);
        }
        index
    }

    /// A verified last timestamp is remembered against exactly one segment and forgotten with
    /// it: a segment rolled back and sealed again at the same base offset starts with none.
    #[test]
    fn issue12_a_remembered_last_timestamp_leaves_with_its_segment() {
        let mut sealed = SealedSegments::default();
        for segment in 0..3 {
            sealed.push(index_of(segment * 10, 10));
        }
        let segments: Vec<SealedSegment> = sealed.iter().copied().collect();
        assert_eq!(sealed.last_timestamp_us(&segments[1]), None);
        sealed.remember_last_timestamp_us(&segments[1], 7);
        sealed.remember_last_timestamp_us(&segments[2], 9);
        assert_eq!(
            segments
                .iter()
                .map(|segment| sealed.last_timestamp_us(segment))
                .collect::<Vec<_>>(),
            [None, Some(7), Some(9)]
        );
        // Not a segment of the log (same base, other shape): nothing remembered or returned.
        let other = SealedSegment::of(&index_of(10, 4));
        sealed.remember_last_timestamp_us(&other, 1);
        assert_eq!(sealed.last_timestamp_us(&other), None);
        assert_eq!(sealed.last_timestamp_us(&segments[1]), Some(7));
        // Retention drops the oldest; the others keep theirs.
        sealed.pop_oldest();
        assert_eq!(sealed.last_timestamp_us(&segments[0]), None);
        assert_eq!(sealed.last_timestamp_us(&segments[1]), Some(7));
        // A rollback drops the newest; sealed again, it has to be verified again.
        sealed.pop_newest();
        sealed.push(index_of(20, 10));
        assert_eq!(sealed.last_timestamp_us(&segments[2]), None);
        assert_eq!(sealed.last_timestamp_us(&segments[1]), Some(7));
    }

    /// What `PartitionLog::read` must return, computed from the appended entries alone: whole
    /// entries from the one holding `offset`, the first always, then while the next stays within
    /// `max_count` messages and `max_bytes`.
    fn expected_read(
        entries: &[(u64, Vec<u8>)],
        offset: u64,
        max_count: u32,
        max_bytes: usize,
    ) -> Vec<u8> {
        let first = entries.partition_point(|(base_offset, _)| *base_offset <= offset) - 1;
        let mut bytes = Vec::new();
        let mut collected_count = 0u64;
        for (base_offset, entry) in &entries[first..] {
            if collected_count > 0
                && (collected_count >= u64::from(max_count)
                    || bytes.len() + entry.len() > max_bytes)
            {
                break;
            }
            let message_count = crate::entry::EntryHeader::decode(entry)
                .unwrap()
                .message_count;
            assert_eq!(
                crate::entry::EntryHeader::decode(entry)
                    .unwrap()
                    .base_offset,
                *base_offset
            );
            collected_count += u64::from(message_count);
            bytes.extend_from_slice(entry);
        }
        bytes
    }

    /// Appends 120 entries of 1..=3 messages and varied sizes to a log of 400-byte segments
    /// (about 40 sealed segments), returning each stored entry with its base offset.
    async fn fill(log: &PartitionLog) -> Vec<(u64, Vec<u8>)> {
        let mut entries = Vec::new();
        for seed in 0..120u32 {
            let message_count = seed % 3 + 1;
            let payload = vec![seed as u8; (seed as usize * 7) % 90];
            let mut entry = crate::entry::build_entry(u64::from(seed), message_count, &payload);
            let offset = log.append(entry.clone()).await.unwrap();
            entry[0..8].copy_from_slice(&offset.to_le_bytes());
            entries.push((offset, entry));
        }
        entries
    }

    fn assert_cache_within_bounds(log: &PartitionLog) {
        let state = log.shared.state.borrow();
        let count = state.sealed.cached_count();
        assert!(
            count <= SEALED_INDEX_CACHE_COUNT_MAX,
            "{count} indexes cached"
        );
        assert!(
            count == 1 || state.sealed.cached_row_bytes() <= SEALED_INDEX_CACHE_BYTES_MAX,
            "{} row bytes cached in {count} indexes",
            state.sealed.cached_row_bytes()
        );
    }

    /// Issue 11 section 4: polls across many sealed segments, whose indexes are loaded on demand
    /// and mostly not cached, return exactly what the appends stored, before and after a reopen
    /// (which keeps no sealed index in memory), and the cache stays within its bounds.
    #[test]
    fn issue11_4_polls_across_many_sealed_segments_return_what_was_appended() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            fsync: FsyncPolicy::Never,
            segment_size_max: 400,
            write_mode: crate::log::WriteMode::Buffered,
        };
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), config.clone())
                .await
                .unwrap();
            let entries = fill(&log).await;
            let end_offset = log.acked_offset();
            let sealed_count = log.shared.state.borrow().sealed.len();
            assert!(sealed_count >= 30, "{sealed_count} sealed segments");
            let check_every_read = async |log: &PartitionLog| {
                for (max_count, max_bytes) in [(1, usize::MAX), (7, 900), (u32::MAX, usize::MAX)] {
                    for offset in 0..end_offset {
                        let read = log.read(offset, max_count, max_bytes).await.unwrap();
                        assert_eq!(
                            read,
                            expected_read(&entries, offset, max_count, max_bytes),
                            "read({offset}, {max_count}, {max_bytes})"
                        );
                        assert_cache_within_bounds(log);
                    }
                }
                assert!(
                    log.read(end_offset, 1, usize::MAX)
                        .await
                        .unwrap()
                        .is_empty()
                );
            };
            check_every_read(&log).await;
            log.close().await.unwrap();
            drop(log);

            let (log, report) = PartitionLog::open(dir.path(), config).await.unwrap();
            assert_eq!(report.next_offset, end_offset);
            assert_eq!(report.scanned_segment_count, 1, "every index file was used");
            assert_eq!(
                log.shared.state.borrow().sealed.cached_count(),
                0,
                "open keeps no sealed index"
            );
            check_every_read(&log).await;
        });
    }

    /// The cache keeps at most `SEALED_INDEX_CACHE_COUNT_MAX` indexes and
    /// `SEALED_INDEX_CACHE_BYTES_MAX` row bytes, least recently used out first, except the index
    /// used last, which stays even when it alone is larger.
    #[test]
    fn issue11_4_index_cache_stays_within_its_bounds() {
        let mut sealed = SealedSegments::default();
        for segment in 0..10u64 {
            sealed.push(index_of(segment * 10, 10));
            assert!(sealed.cached_count() <= SEALED_INDEX_CACHE_COUNT_MAX);
        }
        assert_eq!(sealed.len(), 10);
        assert_eq!(sealed.cached_count(), SEALED_INDEX_CACHE_COUNT_MAX);
        assert_eq!(
            sealed.cached_row_bytes(),
            SEALED_INDEX_CACHE_COUNT_MAX * 10 * 16
        );
        assert!(sealed.cached_index(50).is_none(), "evicted");
        // Using 60 makes 70 the least recently used: the next insertion evicts it.
        assert!(sealed.cached_index(60).is_some());
        let segment_50 = sealed.lookup(55).unwrap();
        assert_eq!(segment_50.base_offset, 50);
        assert!(sealed.cache(segment_50, Rc::new(index_of(50, 10))));
        assert!(sealed.cached_index(70).is_none());
        assert!(sealed.cached_index(60).is_some());

        // Row bytes: an index of half the budget leaves room for one more such only.
        let half_row_count = (SEALED_INDEX_CACHE_BYTES_MAX / 16 / 2) as u64;
        let mut big = SealedSegments::default();
        big.push(index_of(0, half_row_count));
        big.push(index_of(half_row_count, half_row_count));
        assert_eq!(big.cached_count(), 2);
        big.push(index_of(2 * half_row_count, half_row_count));
        assert_eq!(big.cached_count(), 2);
        assert!(big.cached_row_bytes() <= SEALED_INDEX_CACHE_BYTES_MAX);
        // One index over the budget is kept alone (a forward reader uses it poll after poll).
        big.push(index_of(3 * half_row_count, 3 * half_row_count));
        assert_eq!(big.cached_count(), 1);
        assert!(big.cached_index(3 * half_row_count).is_some());
        assert_eq!(big.cached_row_bytes(), 3 * half_row_count as usize * 16);
    }

    /// Retention drops the oldest segment cheaply, with its cached index; lookups and sizes
    /// follow.
    #[test]
    fn issue11_4_pop_oldest_forgets_the_segment_and_its_index() {
        let mut sealed = SealedSegments::default();
        assert!(sealed.is_empty());
        for segment in 0..3u64 {
            sealed.push(index_of(segment * 10, 10));
        }
        assert_eq!(sealed.size_bytes(), 3 * 10 * 100);
        assert_eq!(sealed.lookup(0).map(|segment| segment.base_offset), Some(0));
        assert_eq!(
            sealed.lookup(29).map(|segment| segment.base_offset),
            Some(20)
        );
        assert_eq!(
            sealed.lookup(30),
            None,
            "past the newest: the active segment"
        );
        let oldest = sealed.pop_oldest().unwrap();
        assert_eq!((oldest.base_offset, oldest.end_offset), (0, 10));
        assert_eq!(oldest.entry_count, 10);
        assert_eq!(sealed.size_bytes(), 2 * 10 * 100);
        assert_eq!(sealed.oldest().map(|segment| segment.base_offset), Some(10));
        assert_eq!(
            sealed.lookup(3).map(|segment| segment.base_offset),
            Some(10),
            "an offset before the oldest maps to the oldest"
        );
        assert_eq!(sealed.cached_count(), 2);
        assert!(
            !sealed.cache(oldest, Rc::new(index_of(0, 10))),
            "a dropped segment is not cached again"
        );
        assert_eq!(
            sealed
                .iter()
                .map(|segment| segment.base_offset)
                .collect::<Vec<_>>(),
            vec![10, 20]
        );
    }

    /// FORMAT.md section 3 ("Open", step 3) and section 4: a sealed segment's index file that is
    /// missing or damaged when a read loads it is rebuilt from the segment (and the read
    /// returns the same bytes); if the segment itself is damaged too, the read fails naming the
    /// segment file and byte position, and the entries before the damage are still served.
    #[test]
    fn issue11_4_a_damaged_sealed_index_is_rebuilt_or_the_damage_reported() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            fsync: FsyncPolicy::Never,
            segment_size_max: 400,
            write_mode: crate::log::WriteMode::Buffered,
        };
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), config.clone())
                .await
                .unwrap();
            let entries = fill(&log).await;
            log.close().await.unwrap();
            drop(log);
            let (log, _) = PartitionLog::open(dir.path(), config).await.unwrap();
            let sealed: Vec<SealedSegment> =
                log.shared.state.borrow().sealed.iter().copied().collect();

            // Damaged after open verified it: the trailer no longer matches.
            let index_0 = super::super::recovery::index_path(dir.path(), 0);
            let mut bytes = std::fs::read(&index_0).unwrap();
            bytes[60] ^= 0x40;
            std::fs::write(&index_0, &bytes).unwrap();
            // Missing.
            let index_1 = super::super::recovery::index_path(dir.path(), sealed[1].base_offset);
            std::fs::remove_file(&index_1).unwrap();
            // A later segment of two entries or more, with its index file gone and its second
            // entry's payload flipped: the rebuild scans strictly and reports the entry.
            let damaged = (2..sealed.len())
                .find(|&at| sealed[at].entry_count >= 2)
                .unwrap();
            let segment = sealed[damaged];
            std::fs::remove_file(super::super::recovery::index_path(
                dir.path(),
                segment.base_offset,
            ))
            .unwrap();
            let path = segment_path(dir.path(), segment.base_offset);
            let first_entry = entries
                .iter()
                .find(|(base_offset, _)| *base_offset == segment.base_offset)
                .unwrap();
            let damaged_position = first_entry.1.len() as u64;
            let mut bytes = std::fs::read(&path).unwrap();
            bytes[damaged_position as usize + 40] ^= 0x01;
            std::fs::write(&path, &bytes).unwrap();

            // Reads from segments 0 and 1 get every entry up to the damaged segment.
            for from in [0, 1] {
                let offset = sealed[from].base_offset;
                let intact_bytes: u64 = sealed[from..damaged]
                    .iter()
                    .map(|segment| segment.size_bytes)
                    .sum();
                let expected = expected_read(&entries, offset, u32::MAX, usize::MAX);
                assert_eq!(
                    log.read(offset, u32::MAX, usize::MAX).await.unwrap(),
                    expected[..intact_bytes as usize],
                    "read from segment {from}"
                );
                assert_eq!(
                    log.read(offset, 1, usize::MAX).await.unwrap(),
                    expected_read(&entries, offset, 1, usize::MAX)
                );
            }
            let error = log
                .read(segment.base_offset, 1, usize::MAX)
                .await
                .unwrap_err();
            assert!(
                matches!(&error, LogError::Corrupt { path: error_path, position, .. }
                    if *error_path == path && *position == damaged_position),
                "{error}"
            );
            assert!(error.to_string().contains("in a closed segment"), "{error}");
            // The segment after it is unaffected.
            let next = sealed[damaged + 1].base_offset;
            assert_eq!(
                log.read(next, 1, usize::MAX).await.unwrap(),
                expected_read(&entries, next, 1, usize::MAX)
            );
        });
    }
}
