//! The files of closed segments one log holds open for reads, bounded as a whole: a file kept
//! for the next read and a file a read in flight holds both count, and together they never exceed
//! [`CLOSED_SEGMENT_FILES_OPEN_MAX`] (the figure the server's descriptor budget counts per
//! partition). A read of a closed segment that is not kept open takes a free slot, closing kept
//! files no read holds to make one, and otherwise waits until a read in flight lets go of its
//! file; waiting is not an error. Everything here lives on the log's shard thread (`Rc`, `Cell`).

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use compio::fs::File;

use crate::limits::CLOSED_SEGMENT_FILES_OPEN_MAX;

/// The count of one log's open closed-segment files against [`CLOSED_SEGMENT_FILES_OPEN_MAX`],
/// and the reads waiting for one to close.
#[derive(Debug, Default)]
pub(super) struct FileSlots {
    /// Files open now (kept, held by reads, or reserved by a read opening one).
    open: Cell<usize>,
    /// Most files open at once since the log opened.
    peak: Cell<usize>,
    /// Reads waiting for a slot; all are woken when one frees (a woken read that was cancelled
    /// meanwhile simply never polls again).
    waiters: RefCell<Vec<Waker>>,
}

impl FileSlots {
    /// Takes a slot if one is free.
    fn try_take(&self) -> bool {
        let open = self.open.get();
        if open >= CLOSED_SEGMENT_FILES_OPEN_MAX {
            return false;
        }
        self.open.set(open + 1);
        self.peak.set(self.peak.get().max(open + 1));
        true
    }

    /// Gives a slot back and wakes the reads waiting for one.
    fn release(&self) {
        self.open.set(self.open.get() - 1);
        self.wake_waiters();
    }

    /// Wakes the reads waiting for a slot: one freed, or a read let go of a kept file, which a
    /// waiting read may now close to free its slot.
    fn wake_waiters(&self) {
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for waker in waiters {
            waker.wake();
        }
    }

    /// Most closed-segment files the log held open at once.
    #[cfg(test)]
    pub(super) fn peak(&self) -> usize {
        self.peak.get()
    }

    /// Completes once a slot is free or a read let go of a file (it takes nothing: the caller
    /// tries again).
    ///
    /// # Cancel safety
    /// Cancel safe: it takes nothing.
    pub(super) fn free(self: Rc<Self>) -> SlotFree {
        SlotFree {
            slots: self,
            waited: false,
        }
    }
}

/// Future of [`FileSlots::free`].
#[derive(Debug)]
pub(super) struct SlotFree {
    slots: Rc<FileSlots>,
    /// Set once it returned `Pending`: the next poll comes from a wake, so the caller retries.
    waited: bool,
}

impl Future for SlotFree {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<()> {
        if self.waited || self.slots.open.get() < CLOSED_SEGMENT_FILES_OPEN_MAX {
            return Poll::Ready(());
        }
        self.waited = true;
        self.slots
            .waiters
            .borrow_mut()
            .push(context.waker().clone());
        Poll::Pending
    }
}

/// A slot taken for a file being opened; given back if dropped before [`Self::into_file`]
/// (a failed open, or a read cancelled while opening).
#[derive(Debug)]
pub(super) struct SlotReservation {
    slots: Option<Rc<FileSlots>>,
}

impl SlotReservation {
    /// The opened `file` (`writable`: opened read-write), holding this slot until its last
    /// handle drops.
    pub(super) fn into_file(mut self, file: File, writable: bool) -> Rc<SlotFile> {
        let slots = self.slots.take().expect("a reservation is used once");
        Rc::new(SlotFile {
            file: Some(file),
            slots,
            writable,
        })
    }
}

impl Drop for SlotReservation {
    fn drop(&mut self) {
        if let Some(slots) = self.slots.take() {
            slots.release();
        }
    }
}

/// An open closed-segment file holding one slot; the file closes, and the slot frees, when the
/// last handle (the cache's, or a read's) drops.
#[derive(Debug)]
pub(super) struct SlotFile {
    file: Option<File>,
    slots: Rc<FileSlots>,
    /// Opened read-write (the active file a roll closed), not read-only by a read.
    writable: bool,
}

impl SlotFile {
    /// The file.
    pub(super) fn file(&self) -> &File {
        self.file.as_ref().expect("set until drop")
    }
}

impl Drop for SlotFile {
    fn drop(&mut self) {
        // Close first, so the count never reads lower than the descriptors held.
        drop(self.file.take());
        self.slots.release();
    }
}

/// A read's handle on a closed-segment file. Dropping it wakes the reads waiting for a slot:
/// the file may now be held by the cache alone, which a waiting read closes to take its slot.
#[derive(Debug)]
pub(super) struct ReadFile(Rc<SlotFile>);

impl ReadFile {
    /// The file.
    pub(super) fn file(&self) -> &File {
        self.0.file()
    }
}

impl Drop for ReadFile {
    fn drop(&mut self) {
        // The waiters run after this handle is gone (one thread).
        self.0.slots.wake_waiters();
    }
}

/// What a read of a closed segment gets from [`ClosedFiles::reserve`].
#[derive(Debug)]
pub(super) enum Reserve {
    /// The segment's file is kept open: read it.
    Cached(ReadFile),
    /// A slot to open the segment with, then [`ClosedFiles::keep_opened`].
    Reserved(SlotReservation),
    /// Every slot is held by reads in flight: wait for [`FileSlots::free`], then try again.
    Full(Rc<FileSlots>),
}

/// The closed segment files a log keeps open for the next reads (the most recently read last),
/// and the slot count bounding them together with the files reads in flight hold.
#[derive(Debug, Default)]
pub(super) struct ClosedFiles {
    /// `(base_offset, file)`, least recently read first.
    pub(super) files: VecDeque<(u64, Rc<SlotFile>)>,
    slots: Rc<FileSlots>,
}

impl ClosedFiles {
    /// The slot count (for tests: its peak).
    #[cfg(test)]
    pub(super) fn slots(&self) -> &FileSlots {
        &self.slots
    }

    /// The kept file of the closed segment at `base_offset` (marked most recent), or a slot to
    /// open it with: a free one, or one freed by closing the kept files no read holds (least
    /// recently read first); `Full` when reads in flight hold every slot.
    pub(super) fn reserve(&mut self, base_offset: u64) -> Reserve {
        if let Some(index) = self.files.iter().position(|(base, _)| *base == base_offset) {
            let entry = self.files.remove(index).expect("position is in range");
            let file = ReadFile(Rc::clone(&entry.1));
            self.files.push_back(entry);
            return Reserve::Cached(file);
        }
        match self.reserve_slot() {
            Ok(reservation) => Reserve::Reserved(reservation),
            Err(slots) => Reserve::Full(slots),
        }
    }

    /// A slot for a file a read opens and closes itself (a sealed segment's index file, issue
    /// 11 section 4): a free one, or one freed by closing the kept files no read holds (least
    /// recently read first). The slot frees when the reservation drops.
    ///
    /// # Errors
    /// The slot count, to wait on with [`FileSlots::free`], when reads in flight hold every
    /// slot.
    pub(super) fn reserve_slot(&mut self) -> Result<SlotReservation, Rc<FileSlots>> {
        loop {
            if self.slots.try_take() {
                return Ok(SlotReservation {
                    slots: Some(Rc::clone(&self.slots)),
                });
            }
            // Dropping the cache's handle closes the file and frees its slot unless a read
            // holds it (then the slot frees when that read completes).
            if self.files.pop_front().is_none() {
                return Err(Rc::clone(&self.slots));
            }
        }
    }

    /// Keeps `file`, opened with a slot from [`Self::reserve`], as the most recently read one,
    /// closing the least recently read beyond [`CLOSED_SEGMENT_FILES_OPEN_MAX`].
    pub(super) fn keep_opened(
        &mut self,
        base_offset: u64,
        reservation: SlotReservation,
        file: File,
    ) -> ReadFile {
        let file = reservation.into_file(file, false);
        self.files.retain(|(base, _)| *base != base_offset);
        self.files.push_back((base_offset, Rc::clone(&file)));
        while self.files.len() > CLOSED_SEGMENT_FILES_OPEN_MAX {
            self.files.pop_front();
        }
        ReadFile(file)
    }

    /// Keeps the file of the segment a roll just closed (readers catching up read it next) in
    /// place of the kept ones; when reads in flight hold every slot it is closed instead (a
    /// later read opens it again).
    pub(super) fn keep_rolled(&mut self, base_offset: u64, file: File) {
        while self.files.len() >= CLOSED_SEGMENT_FILES_OPEN_MAX {
            if self.files.pop_front().is_none() {
                break;
            }
        }
        if self.slots.try_take() {
            let reservation = SlotReservation {
                slots: Some(Rc::clone(&self.slots)),
            };
            self.files
                .push_back((base_offset, reservation.into_file(file, true)));
        }
    }

    /// Takes the file of the segment at `base_offset` out of the cache (it becomes active again
    /// after a rolled-back roll); its slot frees, the descriptor stays open as the active file.
    /// `None` when it is not kept, or was opened read-only by a read (the caller reopens it
    /// read-write).
    pub(super) fn take(&mut self, base_offset: u64) -> Option<File> {
        let index = self
            .files
            .iter()
            .position(|(base, _)| *base == base_offset)?;
        let (_, kept) = self.files.remove(index)?;
        kept.writable.then(|| kept.file().clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn file(dir: &std::path::Path, name: &str) -> File {
        compio::fs::File::create(dir.join(name)).await.unwrap()
    }

    fn bases(cache: &ClosedFiles) -> Vec<u64> {
        cache.files.iter().map(|(base, _)| *base).collect()
    }

    #[test]
    fn issue7_2_closed_file_cache_keeps_the_most_recently_read() {
        let dir = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let mut cache = ClosedFiles::default();
            cache.keep_rolled(0, file(dir.path(), "a").await);
            cache.keep_rolled(5, file(dir.path(), "b").await);
            assert_eq!(bases(&cache), vec![5]);
            assert!(matches!(cache.reserve(5), Reserve::Cached(_)));
            assert!(cache.take(5).is_some());
            assert_eq!(bases(&cache), Vec::<u64>::new());
            assert_eq!(cache.slots.open.get(), 0);
        });
    }

    #[test]
    fn issue7_adv2_a_read_holding_the_only_slot_makes_the_next_wait() {
        let dir = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let mut cache = ClosedFiles::default();
            cache.keep_rolled(0, file(dir.path(), "a").await);
            // A read of segment 0 holds the kept file.
            let Reserve::Cached(held) = cache.reserve(0) else {
                panic!("segment 0 is kept");
            };
            // A read of segment 5 closes the kept handle but the read still holds the file.
            let Reserve::Full(slots) = cache.reserve(5) else {
                panic!("the only slot is held by a read");
            };
            assert_eq!(bases(&cache), Vec::<u64>::new());
            assert_eq!(slots.open.get(), CLOSED_SEGMENT_FILES_OPEN_MAX);
            let mut free = std::pin::pin!(Rc::clone(&slots).free());
            let waker = Waker::noop();
            let mut context = Context::from_waker(waker);
            assert_eq!(free.as_mut().poll(&mut context), Poll::Pending);
            assert_eq!(slots.waiters.borrow().len(), 1);
            // The roll meanwhile cannot keep its file either: it is closed instead.
            cache.keep_rolled(9, file(dir.path(), "c").await);
            assert_eq!(bases(&cache), Vec::<u64>::new());
            drop(held);
            assert_eq!(slots.waiters.borrow().len(), 0, "woken");
            assert_eq!(free.as_mut().poll(&mut context), Poll::Ready(()));
            let Reserve::Reserved(reservation) = cache.reserve(5) else {
                panic!("the slot is free again");
            };
            // A reservation dropped before its file opened gives the slot back.
            drop(reservation);
            assert_eq!(slots.open.get(), 0);
            let Reserve::Reserved(reservation) = cache.reserve(5) else {
                panic!("the slot is free again");
            };
            let opened = cache.keep_opened(5, reservation, file(dir.path(), "b").await);
            assert_eq!(bases(&cache), vec![5]);
            drop(opened);
            // Opened read-only by a read: a rollback must reopen it read-write.
            assert!(cache.take(5).is_none());
            let Reserve::Reserved(reservation) = cache.reserve(5) else {
                panic!("taking it freed the slot");
            };
            drop(cache.keep_opened(5, reservation, file(dir.path(), "b").await));
            assert_eq!(slots.open.get(), 1, "the kept file holds the slot");
            assert_eq!(slots.peak(), CLOSED_SEGMENT_FILES_OPEN_MAX);
        });
    }
}
