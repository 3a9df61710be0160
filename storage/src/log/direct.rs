//! Direct write mode of a log (`WriteMode::Direct`, issue 12 item 3, `storage/FORMAT.md` section
//! 3, "Write modes"): each batch of entries is copied, after the carried-over bytes of the active
//! segment's last partial block, into an aligned staging buffer, padded with zeros to
//! [`DIRECT_WRITE_ALIGNMENT_BYTES`], and written with one `O_DIRECT` write at the aligned position
//! below the logical end, through a second, write-only descriptor of the active segment. Reads
//! keep the buffered descriptor and the mappings.
//!
//! Page-cache coherence: an `O_DIRECT` write flushes and then invalidates the cached pages of the
//! range it writes, and readers map or copy those pages. That is safe because the only block a
//! direct write rewrites below the logical end is the carry block, whose old bytes it rewrites
//! with identical content (the carry is those bytes), and readers only ever read acknowledged
//! bytes, all below the logical end at the write's start: a reader that faults a page in before,
//! during or after the write reads the same acknowledged bytes from the disk. The bytes the
//! write adds past the logical end are not acknowledged until the write completed, and a page
//! faulted in before then is invalidated by the write's completion. Readers verify every entry's
//! checksum, so even a stale page (a failed invalidation, which the kernel logs) is an error,
//! never bytes served silently.
//!
//! It must never write anywhere but at the carry block's position, never write bytes below the
//! logical end that differ from what is there, and never let the zero padding past the logical
//! end outlive the segment being active (a roll and a close cut it; recovery cuts what a crash
//! left, `recovery::open_last_segment`).

use std::alloc::Layout;
use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::ptr::NonNull;

use compio::BufResult;
use compio::buf::{IntoInner, IoBuf};
use compio::fs::{File, OpenOptions};
use compio::io::AsyncWriteAtExt;

use crate::durable::read_exact_at;
use crate::fault::{FaultInjector, FaultOp};
use crate::limits::{
    DIRECT_WRITE_ALIGNMENT_BYTES, STAGING_BUFFER_KEPT_BYTES_MAX, STAGING_BUFFERS_KEPT_MAX,
};

/// A heap buffer whose start is aligned to [`DIRECT_WRITE_ALIGNMENT_BYTES`], as `O_DIRECT`
/// requires; `len` bytes of `capacity` hold data (all `capacity` bytes are initialised, zeroed at
/// allocation).
#[derive(Debug)]
pub(super) struct AlignedBuffer {
    address: NonNull<u8>,
    capacity: usize,
    len: usize,
}

impl AlignedBuffer {
    /// A zeroed buffer of `capacity` bytes (> 0, a multiple of the alignment).
    ///
    /// # Panics
    /// When `capacity` breaks those rules (a bug), or on allocation failure (as `Vec` does).
    fn zeroed(capacity: usize) -> AlignedBuffer {
        assert!(
            capacity > 0 && capacity.is_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES),
            "a staging buffer holds whole alignment units"
        );
        let layout = Self::layout(capacity);
        // SAFETY: the layout has a non-zero size (checked above).
        let address = unsafe { std::alloc::alloc_zeroed(layout) };
        let Some(address) = NonNull::new(address) else {
            std::alloc::handle_alloc_error(layout);
        };
        AlignedBuffer {
            address,
            capacity,
            len: 0,
        }
    }

    fn layout(capacity: usize) -> Layout {
        Layout::from_size_align(capacity, DIRECT_WRITE_ALIGNMENT_BYTES)
            .expect("the alignment is a power of two and the capacity fits isize")
    }

    fn as_slice(&self) -> &[u8] {
        // SAFETY: `address` points to `capacity` initialised bytes owned by this value (zeroed
        // at allocation, written only through `extend_from_slice`), and `len <= capacity`.
        unsafe { std::slice::from_raw_parts(self.address.as_ptr(), self.len) }
    }

    fn clear(&mut self) {
        self.len = 0;
    }

    /// Appends `bytes`.
    ///
    /// # Panics
    /// When they do not fit the capacity (a bug: the caller sized the buffer).
    fn extend_from_slice(&mut self, bytes: &[u8]) {
        assert!(
            bytes.len() <= self.capacity - self.len,
            "the staging buffer was sized for the batch"
        );
        // SAFETY: the destination `address + len .. + bytes.len()` lies within the allocation
        // (checked above) and is owned by this value; `bytes` is a different allocation (a
        // shared borrow cannot alias this buffer, which is borrowed mutably).
        unsafe {
            std::ptr::copy_nonoverlapping(
                bytes.as_ptr(),
                self.address.as_ptr().add(self.len),
                bytes.len(),
            );
        }
        self.len += bytes.len();
    }

    /// Pads with zeros to the next multiple of the alignment.
    fn pad_to_alignment(&mut self) {
        let padded_len = self.len.next_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES);
        assert!(padded_len <= self.capacity, "capacities are aligned");
        // SAFETY: `len..padded_len` lies within the allocation (checked above).
        unsafe {
            std::ptr::write_bytes(
                self.address.as_ptr().add(self.len),
                0,
                padded_len - self.len,
            );
        }
        self.len = padded_len;
    }
}

impl Drop for AlignedBuffer {
    fn drop(&mut self) {
        // SAFETY: allocated in `zeroed` with this very layout, freed once here.
        unsafe { std::alloc::dealloc(self.address.as_ptr(), Self::layout(self.capacity)) };
    }
}

/// compio reads the initialised bytes of a write's buffer through this while the kernel writes
/// them: the heap allocation does not move when the `AlignedBuffer` value moves into the
/// operation, and nothing else can touch it until the operation hands it back.
impl IoBuf for AlignedBuffer {
    fn as_init(&self) -> &[u8] {
        self.as_slice()
    }
}

thread_local! {
    /// Staging buffers of this shard free for the next direct write (`STAGING_BUFFERS_KEPT_MAX`,
    /// each at most `STAGING_BUFFER_KEPT_BYTES_MAX`).
    static FREE_STAGING_BUFFERS: RefCell<Vec<AlignedBuffer>> = const { RefCell::new(Vec::new()) };
}

/// An empty staging buffer of at least `capacity_min` bytes: a free one of this shard, else a new
/// one of `capacity_min` rounded up to the alignment.
fn take_staging_buffer(capacity_min: usize) -> AlignedBuffer {
    let reused = FREE_STAGING_BUFFERS.with_borrow_mut(|free| {
        let index = free
            .iter()
            .position(|buffer| buffer.capacity >= capacity_min)?;
        Some(free.swap_remove(index))
    });
    match reused {
        Some(mut buffer) => {
            buffer.clear();
            buffer
        }
        None => AlignedBuffer::zeroed(
            capacity_min
                .max(1)
                .next_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES),
        ),
    }
}

/// Keeps `buffer` for a later write when the free list has room and it is not oversized.
fn give_back_staging_buffer(buffer: AlignedBuffer) {
    if buffer.capacity > STAGING_BUFFER_KEPT_BYTES_MAX {
        return;
    }
    FREE_STAGING_BUFFERS.with_borrow_mut(|free| {
        if free.len() < STAGING_BUFFERS_KEPT_MAX {
            free.push(buffer);
        }
    });
}

/// The staging buffers this thread keeps (tests of the bound).
#[cfg(test)]
fn free_staging_buffer_count() -> usize {
    FREE_STAGING_BUFFERS.with_borrow(Vec::len)
}

/// Where a log's direct writes stand.
#[derive(Debug)]
pub(super) enum DirectState {
    /// The log is configured for buffered writes.
    Off,
    /// Direct writes, but no direct descriptor is open for the active segment: at open, and
    /// after a roll or a rollback (the next write opens one and loads the carry).
    Idle,
    /// Direct writes through this descriptor (taken out while a write is in flight).
    Open(DirectFile),
    /// `O_DIRECT` was refused (`EINVAL`) at an open or a write: buffered writes for the rest of
    /// this log's life (logged once).
    FellBack,
}

impl DirectState {
    /// The mode the log's writes use now.
    pub(super) fn write_mode(&self) -> super::WriteMode {
        match self {
            DirectState::Off | DirectState::FellBack => super::WriteMode::Buffered,
            DirectState::Idle | DirectState::Open(_) => super::WriteMode::Direct,
        }
    }
}

/// The `O_DIRECT` descriptor of the active segment and what writing through it needs.
#[derive(Debug)]
pub(super) struct DirectFile {
    file: File,
    /// The segment `file` writes.
    pub(super) base_offset: u64,
    /// The bytes of the last partial block below the logical end (logical end % alignment of
    /// them, fewer than one alignment unit), as they are in the file.
    carry: Vec<u8>,
    /// The file's length: past the logical end (by zero padding) after a write whose end was
    /// not aligned.
    pub(super) file_len: u64,
}

/// Why a direct descriptor could not be had.
pub(super) enum OpenRefused {
    /// `O_DIRECT` refused (`EINVAL`): fall back to buffered writes.
    Unsupported(io::Error),
    /// Another failure of the open (`op` names the step).
    Failed(&'static str, io::Error),
}

impl DirectFile {
    /// Opens `path` (the active segment, `base_offset`) write-only with `O_DIRECT`, through the
    /// fault seam (`FaultOp::DirectOpen`), and loads the carry of `logical_end` from
    /// `buffered_file` (the segment's read-write descriptor): the file must be exactly
    /// `logical_end` bytes long (recovery, a roll, a rollback and a fallback all leave it so).
    ///
    /// # Errors
    /// `Unsupported` for `EINVAL` at the open; `Failed` for any other failure of the open or of
    /// the read of the carry.
    pub(super) async fn open(
        faults: &FaultInjector,
        path: &Path,
        base_offset: u64,
        buffered_file: &File,
        logical_end: u64,
    ) -> Result<DirectFile, OpenRefused> {
        let opened = match faults.check(FaultOp::DirectOpen) {
            Ok(()) => {
                OpenOptions::new()
                    .write(true)
                    .custom_flags(libc::O_DIRECT)
                    .open(path)
                    .await
            }
            Err(error) => Err(error),
        };
        let file = match opened {
            Ok(file) => file,
            Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
                return Err(OpenRefused::Unsupported(error));
            }
            Err(error) => {
                return Err(OpenRefused::Failed(
                    "open segment with O_DIRECT for direct writes",
                    error,
                ));
            }
        };
        let carry_len = logical_end % DIRECT_WRITE_ALIGNMENT_BYTES as u64;
        let carry = if carry_len == 0 {
            Vec::new()
        } else {
            read_exact_at(buffered_file, logical_end - carry_len, carry_len as usize)
                .await
                .map_err(|error| {
                    OpenRefused::Failed(
                        "read the last partial block of the segment for direct writes",
                        error,
                    )
                })?
        };
        Ok(DirectFile {
            file,
            base_offset,
            carry,
            file_len: logical_end,
        })
    }

    /// Writes `entries` at `logical_end` (the segment's logical end, whose last partial block is
    /// the carry) with one `O_DIRECT` write of carry + entries + zero padding at the aligned
    /// position below it, through the fault seam (`FaultOp::Write`: an injected fault first
    /// writes the first half of the staged bytes, rounded down to whole alignment units, as a
    /// short write before `ENOSPC` does). On success the carry becomes the new logical end's
    /// last partial block; on failure it is unchanged (the bytes below `logical_end` are too:
    /// every byte of the carry block the write may have reached was written with its own value).
    ///
    /// # Errors
    /// The write's (`EINVAL` when the filesystem refuses the alignment: the caller falls back).
    pub(super) async fn write(
        &mut self,
        faults: &FaultInjector,
        entries: &[Vec<u8>],
        logical_end: u64,
    ) -> io::Result<()> {
        let carry_len = self.carry.len() as u64;
        assert_eq!(
            logical_end % DIRECT_WRITE_ALIGNMENT_BYTES as u64,
            carry_len,
            "the carry is the logical end's partial block"
        );
        let block_position = logical_end - carry_len;
        let filled_len = self.carry.len() + entries.iter().map(Vec::len).sum::<usize>();
        let mut staging = take_staging_buffer(filled_len);
        staging.extend_from_slice(&self.carry);
        for entry in entries {
            staging.extend_from_slice(entry);
        }
        staging.pad_to_alignment();
        let write_len = staging.len;
        let mut writer = &self.file;
        if let Err(error) = faults.check(FaultOp::Write) {
            let partial_len =
                write_len / 2 / DIRECT_WRITE_ALIGNMENT_BYTES * DIRECT_WRITE_ALIGNMENT_BYTES;
            if partial_len > 0 {
                let BufResult(_, slice) = writer
                    .write_all_at(staging.slice(..partial_len), block_position)
                    .await;
                staging = slice.into_inner();
            }
            give_back_staging_buffer(staging);
            return Err(error);
        }
        let BufResult(result, staging) = writer.write_all_at(staging, block_position).await;
        if result.is_ok() {
            let whole_len =
                filled_len / DIRECT_WRITE_ALIGNMENT_BYTES * DIRECT_WRITE_ALIGNMENT_BYTES;
            self.carry.clear();
            self.carry
                .extend_from_slice(&staging.as_slice()[whole_len..filled_len]);
            self.file_len = self.file_len.max(block_position + write_len as u64);
        }
        give_back_staging_buffer(staging);
        result
    }
}

impl DirectFile {
    /// Closes the `O_DIRECT` descriptor (its writes bypassed the page cache and completed, so
    /// a failed close loses nothing; it is logged).
    pub(super) async fn close(self) {
        if let Err(error) = self.file.close().await {
            tracing::warn!(%error, "closing a segment's O_DIRECT descriptor failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staging_buffers_are_aligned_padded_and_kept_within_bounds() {
        let mut buffer = take_staging_buffer(5000);
        assert_eq!(buffer.capacity, 8192);
        assert_eq!(
            buffer.address.as_ptr() as usize % DIRECT_WRITE_ALIGNMENT_BYTES,
            0
        );
        buffer.extend_from_slice(&[7; 4097]);
        buffer.pad_to_alignment();
        assert_eq!(buffer.as_init().len(), 8192);
        assert!(buffer.as_init()[..4097].iter().all(|byte| *byte == 7));
        assert!(buffer.as_init()[4097..].iter().all(|byte| *byte == 0));
        give_back_staging_buffer(buffer);
        // Reused: a smaller request takes the kept buffer, emptied.
        let reused = take_staging_buffer(100);
        assert_eq!((reused.capacity, reused.len), (8192, 0));
        give_back_staging_buffer(reused);
        // Bounded: oversized buffers are freed, and at most STAGING_BUFFERS_KEPT_MAX are kept.
        give_back_staging_buffer(take_staging_buffer(STAGING_BUFFER_KEPT_BYTES_MAX + 1));
        assert_eq!(free_staging_buffer_count(), 1);
        let many: Vec<AlignedBuffer> = (0..STAGING_BUFFERS_KEPT_MAX + 3)
            .map(|_| take_staging_buffer(4096))
            .collect();
        for buffer in many {
            give_back_staging_buffer(buffer);
        }
        assert_eq!(free_staging_buffer_count(), STAGING_BUFFERS_KEPT_MAX);
    }
}
