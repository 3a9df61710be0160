//! Read-only shared mappings of segment files, one per segment a log reads (issue 12 item 2):
//! reads verify entries in place on the mapping and hand out the verified byte ranges, which a
//! server sends to a socket without copying them through user space (`vmsplice` + `splice`).
//!
//! It must never let anything touch a mapped byte outside a range the log acknowledged and
//! verified: the mapping spans more than the file (a segment is mapped once at the size it may
//! grow to), and a page past the end of the file faults with `SIGBUS`. What makes handing the
//! bytes out as `&[u8]` sound is the log's invariant (`storage/FORMAT.md` section 3, "Reads"):
//! segment bytes below `acked_offset` are never rewritten or cut (a rollback cuts only
//! unacknowledged bytes past it; retention deletes whole sealed segments, and a mapping keeps a
//! deleted file's pages alive). Everything here is `Send` and `Sync`: a mapping is immutable
//! memory, and a reply may be sent by another shard than the owner.

use std::collections::VecDeque;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::ptr::NonNull;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::limits::{MAPPED_SEGMENTS_PER_LOG_MAX, MAPPED_SEGMENTS_PROCESS_MAX};

/// Segment mappings alive in this process, over every log (`MAPPED_SEGMENTS_PROCESS_MAX`).
static LIVE_MAPPING_COUNT: AtomicUsize = AtomicUsize::new(0);

/// A read-only, shared (`PROT_READ`, `MAP_SHARED`) mapping of a segment file from byte 0, `len`
/// bytes long (possibly past the file's end: only acknowledged ranges are ever touched).
#[derive(Debug)]
pub(crate) struct SegmentMapping {
    address: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is read-only memory owned by this value alone (unmapped once, in `drop`);
// the bytes handed out through it are never written while mapped (the acknowledged-range
// invariant in the module doc), so sharing or moving it between threads races with nothing.
unsafe impl Send for SegmentMapping {}
// SAFETY: as for `Send`: `&SegmentMapping` only reads immutable memory.
unsafe impl Sync for SegmentMapping {}

impl SegmentMapping {
    /// Maps the first `len` bytes (`len` > 0) of the file `fd` read-only and shared (mmap(2)).
    /// Maps only: no byte is read (no `MAP_POPULATE`), so it never blocks on the disk.
    ///
    /// # Errors
    /// `OutOfMemory` when the process already holds `MAPPED_SEGMENTS_PROCESS_MAX` segment
    /// mappings; mmap(2)'s: `ENOMEM` when the process is at `vm.max_map_count` mappings or out of
    /// address space (`RLIMIT_AS`), `ENODEV`/`EACCES` for a file that cannot be mapped. The caller
    /// reads with a copy instead.
    pub(crate) fn map(fd: BorrowedFd<'_>, len: usize) -> io::Result<SegmentMapping> {
        assert!(len > 0, "a segment mapping covers at least one byte");
        if !reserve_slot(&LIVE_MAPPING_COUNT, MAPPED_SEGMENTS_PROCESS_MAX) {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "the process holds {MAPPED_SEGMENTS_PROCESS_MAX} segment mappings \
                     (MAPPED_SEGMENTS_PROCESS_MAX)"
                ),
            ));
        }
        let mapping = SegmentMapping::map_reserved(fd, len);
        if mapping.is_err() {
            LIVE_MAPPING_COUNT.fetch_sub(1, Ordering::AcqRel);
        }
        mapping
    }

    /// `map` once its slot in `LIVE_MAPPING_COUNT` is taken.
    fn map_reserved(fd: BorrowedFd<'_>, len: usize) -> io::Result<SegmentMapping> {
        // SAFETY: a fresh mapping chosen by the kernel (address hint null), so no existing memory
        // is replaced; the result is checked for MAP_FAILED before use.
        let address = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                0,
            )
        };
        if address == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let address = NonNull::new(address.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null address without failing"))?;
        Ok(SegmentMapping { address, len })
    }

    /// Bytes the mapping spans (the file may be shorter).
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// The `size` bytes at file position `position`.
    ///
    /// # Safety
    /// `position .. position + size` must lie inside a range of the file the log acknowledged
    /// (so inside the file, and never rewritten or cut while this mapping lives: the module
    /// doc's invariant). Touching a byte past the file's end raises `SIGBUS`.
    ///
    /// # Panics
    /// If the range is not inside the mapping (a caller bug).
    pub(crate) unsafe fn range(&self, position: u64, size: u64) -> &[u8] {
        let end = position.checked_add(size).expect("range end fits u64");
        assert!(
            end <= self.len as u64,
            "range {position}..{end} is outside the {}-byte mapping",
            self.len
        );
        // SAFETY: inside the mapping (asserted), which lives as long as `&self`; the caller
        // guarantees the bytes are in the file and immutable while mapped.
        unsafe {
            std::slice::from_raw_parts(self.address.as_ptr().add(position as usize), size as usize)
        }
    }

    /// Whether every page of `position .. position + size` is in the page cache now
    /// (mincore(2)), so that touching them faults no disk read on the calling shard thread.
    ///
    /// # Errors
    /// mincore(2)'s (`ENOMEM` for a range outside the mapping: a bug, treated as not resident).
    pub(crate) fn is_resident(&self, position: u64, size: u64) -> io::Result<bool> {
        if size == 0 {
            return Ok(true);
        }
        let page_size = page_size();
        let start = position - position % page_size;
        let end = position + size;
        let pages = end.div_ceil(page_size) - start / page_size;
        let mut residency = vec![0u8; pages as usize];
        // SAFETY: `start .. end` lies inside the mapping (the callers pass spans of it, and
        // mincore fails with ENOMEM rather than fault outside one); `residency` holds one byte per
        // page of that range, as mincore(2) writes.
        let result = unsafe {
            libc::mincore(
                self.address.as_ptr().add(start as usize).cast(),
                (end - start) as usize,
                residency.as_mut_ptr(),
            )
        };
        if result != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(residency.iter().all(|page| page & 1 == 1))
    }
}

impl Drop for SegmentMapping {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `map`, unmapped exactly once; every `&[u8]` into it
        // borrows `self` (or an `Arc` of it), so none outlives this.
        let result = unsafe { libc::munmap(self.address.as_ptr().cast(), self.len) };
        debug_assert_eq!(result, 0, "munmap of a mapping we made");
        LIVE_MAPPING_COUNT.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Takes one of `count_max` slots counted by `count`; false when all are taken.
fn reserve_slot(count: &AtomicUsize, count_max: usize) -> bool {
    count
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |taken| {
            (taken < count_max).then_some(taken + 1)
        })
        .is_ok()
}

/// The page size in bytes (sysconf(3) `_SC_PAGESIZE`).
fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size)
        .ok()
        .filter(|size| *size > 0)
        .unwrap_or(4096)
}

/// The mappings one log keeps, by segment base offset, the most recently used last; at most
/// [`MAPPED_SEGMENTS_PER_LOG_MAX`]. A mapping holds no file descriptor (mmap(2): closing the
/// descriptor does not unmap), so this bounds address space and `vm.max_map_count` entries,
/// not the descriptor budget. A reply in flight holds its own `Arc`.
///
/// Keyed by base offset alone, which is sound because a mapped segment holds acknowledged
/// entries (reads only read below `acked_offset`): it is never removed by a rollback, whose new
/// segment could reuse the base offset, only by retention, which drops its mapping here.
#[derive(Debug, Default)]
pub(crate) struct SegmentMappings {
    mappings: VecDeque<(u64, Arc<SegmentMapping>)>,
}

impl SegmentMappings {
    /// The mapping of the segment at `base_offset` if it covers `end` bytes, marked most recent.
    pub(crate) fn get(&mut self, base_offset: u64, end: u64) -> Option<Arc<SegmentMapping>> {
        let index = self
            .mappings
            .iter()
            .position(|(base, mapping)| *base == base_offset && mapping.len() as u64 >= end)?;
        let entry = self.mappings.remove(index)?;
        let mapping = Arc::clone(&entry.1);
        self.mappings.push_back(entry);
        Some(mapping)
    }

    /// Keeps `mapping` of the segment at `base_offset` as the most recent (replacing a shorter
    /// one), unmapping the least recently used beyond [`MAPPED_SEGMENTS_PER_LOG_MAX`] (replies in
    /// flight keep theirs until they complete).
    pub(crate) fn insert(&mut self, base_offset: u64, mapping: Arc<SegmentMapping>) {
        self.mappings.retain(|(base, _)| *base != base_offset);
        self.mappings.push_back((base_offset, mapping));
        while self.mappings.len() > MAPPED_SEGMENTS_PER_LOG_MAX {
            self.mappings.pop_front();
        }
    }

    /// Unmaps the segments below `floor` (retention deleted them), so their disk space is freed
    /// once no reply in flight holds them.
    pub(crate) fn drop_below(&mut self, floor: u64) {
        self.mappings.retain(|(base, _)| *base >= floor);
    }

    /// Base offsets of the mappings kept, least recently used first (for tests).
    #[cfg(test)]
    pub(crate) fn base_offsets(&self) -> Vec<u64> {
        self.mappings.iter().map(|(base, _)| *base).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    #[test]
    fn issue12_2_review_mappings_are_bounded_per_process_by_slots() {
        let count = AtomicUsize::new(0);
        assert!((0..3).all(|_| reserve_slot(&count, 3)), "three slots");
        assert!(!reserve_slot(&count, 3), "the fourth is refused");
        assert_eq!(count.load(Ordering::Acquire), 3);
        count.fetch_sub(1, Ordering::AcqRel);
        assert!(reserve_slot(&count, 3), "a freed slot is taken again");
    }

    #[test]
    fn issue12_2_a_log_keeps_a_bounded_few_mappings_and_retention_drops_its_own() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[7u8; 8192]).unwrap();
        let map = || Arc::new(SegmentMapping::map(file.as_fd(), 1 << 20).unwrap());
        let mut mappings = SegmentMappings::default();
        for base in 0..=MAPPED_SEGMENTS_PER_LOG_MAX as u64 {
            mappings.insert(base * 10, map());
        }
        // The least recently used (base 0) was unmapped to stay within the bound.
        let kept: Vec<u64> = (1..=MAPPED_SEGMENTS_PER_LOG_MAX as u64)
            .map(|b| b * 10)
            .collect();
        assert_eq!(mappings.base_offsets(), kept);
        // A hit marks it most recent; a mapping shorter than the range asked is no hit.
        assert!(mappings.get(10, 8192).is_some());
        assert!(mappings.get(20, (1 << 20) + 1).is_none());
        assert_eq!(*mappings.base_offsets().last().unwrap(), 10);
        mappings.drop_below(30);
        assert_eq!(mappings.base_offsets(), vec![30, 40]);
        let held = mappings.get(30, 8192).unwrap();
        mappings.drop_below(u64::MAX);
        // A reply's reference outlives the cache's: the bytes stay readable.
        // SAFETY: bytes 0..8192 exist in the file, and nothing writes it.
        assert_eq!(unsafe { held.range(0, 8192) }, &[7u8; 8192][..]);
        assert!(held.is_resident(0, 8192).unwrap());
    }
}
