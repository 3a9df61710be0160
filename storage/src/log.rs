//! A partition's append-only log: segment files `{base_offset:020}.log` plus offset index and
//! producer-state snapshot, append through `io_uring`, reads by offset, torn tail truncated on
//! open, fsync policy with group commit.
//!
//! One `PartitionLog` is owned by one shard and is `!Send`: its writer task runs on the runtime that
//! opened it. It must never acknowledge an entry before it is written (and fsynced under
//! `FsyncPolicy::Always`), never expose an unacknowledged entry to `read`, and never keep writing
//! after a failed fsync or any failed write other than a full filesystem (the tail state is then
//! unknown; see the 2018 "fsyncgate" discussion: a failed fsync may have dropped dirty pages, and
//! retrying it reports success). A write refused with `ENOSPC`, `EDQUOT` or `EFBIG` is the one
//! recoverable failure: the writer rolls the files back to the acknowledged end and goes on.
//! The byte layouts and crash cases are in `storage/FORMAT.md`.

mod closed_files;
mod completion;
mod direct;
mod index;
mod mapped;
mod producer_state;
mod read;
mod recovery;
pub mod retention;
mod sealed;
mod stats;
pub mod verify;
mod writer;

use std::cell::RefCell;
use std::collections::VecDeque;
use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use compio::fs::File;

use crate::entry::{ENTRY_HEADER_SIZE, EntryHeader, entry_checksum};
use crate::fault::FaultInjector;
use crate::limits::{
    APPEND_QUEUE_BYTES_MAX, APPEND_QUEUE_ENTRY_COUNT_MAX, ENTRY_SIZE_MAX, SEGMENT_SIZE_MAX_LIMIT,
};
use crate::space::{FreeBytes, is_descriptors_exhausted, is_storage_full};
use closed_files::{ClosedFiles, ReadFile, Reserve, SlotReservation};
use completion::Completion;
use index::SegmentIndex;
pub use read::{VerifiedSpan, VerifiedSpans};
pub use retention::{RetentionOutcome, RetentionPolicy, UnverifiedAge};
use sealed::{SealedSegment, SealedSegments, load_sealed_index};
pub use stats::LogStats;

/// When an append is acknowledged relative to fsync (`--fsync`, DESIGN section 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FsyncPolicy {
    /// Acknowledge after fsync; concurrent appends share one fsync (group commit). Default.
    #[default]
    Always,
    /// Acknowledge after the write; fsync at most every interval.
    Interval(Duration),
    /// Page cache only.
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    /// `always`, `never`, `interval=MS` (MS a whole number of milliseconds, 1..=
    /// [`FSYNC_INTERVAL_MS_MAX`](crate::limits::FSYNC_INTERVAL_MS_MAX)).
    ///
    /// # Errors
    /// A message naming the value and the rule it breaks.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "always" => Ok(FsyncPolicy::Always),
            "never" => Ok(FsyncPolicy::Never),
            _ => {
                let Some(interval_ms) = s.strip_prefix("interval=") else {
                    return Err(format!(
                        "fsync policy {s:?}: expected \"always\", \"never\" or \"interval=MS\""
                    ));
                };
                let max = crate::limits::FSYNC_INTERVAL_MS_MAX;
                let rule = format!("MS must be a whole number of milliseconds from 1 to {max}");
                let in_range = interval_ms
                    .parse::<u64>()
                    .ok()
                    .filter(|ms| (1..=max).contains(ms));
                let Some(interval_ms) = in_range else {
                    return Err(format!("fsync policy {s:?}: {rule}"));
                };
                Ok(FsyncPolicy::Interval(Duration::from_millis(interval_ms)))
            }
        }
    }
}

/// How a log writes its entries (`--write-mode`, issue 12 item 3, `storage/FORMAT.md` section 3,
/// "Write modes"). Reads are the same in both: the page cache, through a mapping or a copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriteMode {
    /// Vectored buffered writes (`pwritev`) at the end of the active segment; the kernel's
    /// writeback threads copy the dirty pages to disk later. Default.
    #[default]
    Buffered,
    /// One `O_DIRECT` write per batch from an aligned staging buffer (the last partial block,
    /// carried in memory, plus the batch, padded with zeros to [`DIRECT_WRITE_ALIGNMENT_BYTES`]),
    /// through a second, write-only descriptor of the active segment. No dirty pages, so no
    /// writeback threads: it costs less host CPU per written GB past the dirty-page limits, but
    /// with one write in flight per log it acknowledges fewer messages per second and polls of
    /// its data read the disk, so it is not the default (`storage/FORMAT.md` section 3, "Write
    /// modes", gives the figures). A filesystem that refuses
    /// `O_DIRECT` (`EINVAL` at the open or at a write) gets buffered writes for that log, logged
    /// once. Durability is unchanged: fsync policies still `fdatasync`.
    ///
    /// [`DIRECT_WRITE_ALIGNMENT_BYTES`]: crate::limits::DIRECT_WRITE_ALIGNMENT_BYTES
    Direct,
}

impl std::str::FromStr for WriteMode {
    type Err = String;
    /// `buffered` or `direct`.
    ///
    /// # Errors
    /// A message naming the value and the accepted ones.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "buffered" => Ok(WriteMode::Buffered),
            "direct" => Ok(WriteMode::Direct),
            _ => Err(format!(
                "write mode {s:?}: expected \"buffered\" or \"direct\""
            )),
        }
    }
}

impl std::fmt::Display for WriteMode {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(match self {
            WriteMode::Buffered => "buffered",
            WriteMode::Direct => "direct",
        })
    }
}

/// How a `PartitionLog` writes.
#[derive(Debug, Clone)]
pub struct LogConfig {
    pub fsync: FsyncPolicy,
    /// A segment is closed and a new one started when the next entry would make it larger than
    /// this (bytes); an entry larger than this gets a segment of its own. At most
    /// [`SEGMENT_SIZE_MAX_LIMIT`].
    pub segment_size_max: u64,
    /// Buffered or `O_DIRECT` entry writes ([`WriteMode`]).
    pub write_mode: WriteMode,
}

/// What recovery found on open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segment_count: u32,
    pub entry_count: u64,
    pub next_offset: u64,
    /// Bytes cut from a torn tail of the last segment (0 if clean). Direct-write padding is not
    /// a torn tail: it is counted in `direct_padding_bytes` instead.
    pub truncated_bytes: u64,
    /// Zero bytes cut from the end of the last segment as the padding of a direct write
    /// (`WriteMode::Direct`) that a crash left: all zero from the end of the last valid entry up
    /// to an end of file aligned to `DIRECT_WRITE_ALIGNMENT_BYTES`, less than one alignment
    /// unit (`storage/FORMAT.md` section 3, "Write modes"). Never quarantined, logged at info;
    /// 0 when there was none.
    pub direct_padding_bytes: u64,
    /// Segments whose entries were read and checked on open: always the last one, plus each closed
    /// segment whose index file was missing or did not verify (its index is rewritten).
    pub scanned_segment_count: u32,
    /// The last `PRODUCER_WINDOW_BATCH_COUNT` stamped batches of each idempotent producer of the
    /// log (at most `PRODUCER_STATE_COUNT_MAX` producers, the most recently appended), in log
    /// order: from the active segment's producer-state snapshot plus the stamps in the active
    /// segment, or, when that snapshot is missing or damaged (logged), from the newest usable
    /// snapshot of the last `PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX` closed segments plus
    /// the stamps of every segment after it (the same state), or, only when none is usable
    /// (logged), from the stamps in the active segment and the last
    /// `RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES` of the one before.
    /// The owner shard rebuilds its producer table from these (`storage/FORMAT.md` section 3,
    /// "Producer stamp", and section 3a).
    pub producer_batches: Vec<crate::entry::ProducerBatch>,
    /// Damage in the last segment kept before the cut: a complete entry (header within the rules,
    /// whole in the file) whose payload fails its checksum or framing, or any invalid entry
    /// followed by valid entries, or one after which the resync search spent its budget. Its
    /// bytes and everything after were copied to a quarantine file before the segment was
    /// truncated there (`truncated_bytes` counts them); `None` for a plain torn tail (a short
    /// entry with nothing valid after it) or a clean segment.
    pub quarantined: Option<Quarantine>,
}

/// Bytes cut from the last segment on open although valid entries followed the damage, kept in a
/// quarantine file beside the segment (`storage/FORMAT.md` section 3, "Open").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Quarantine {
    /// The segment that was truncated.
    pub segment: PathBuf,
    /// Byte position in `segment` of the damaged entry, where the truncation cut.
    pub position: u64,
    /// The file holding the cut bytes, byte for byte (`{base_offset:020}.log.damaged-at-{position}`,
    /// with a `.N` suffix when that name was taken).
    pub path: PathBuf,
    /// Bytes cut and copied (from `position` to the old end of the segment).
    pub size_bytes: u64,
    /// First offset cut: the damaged entry's base offset.
    pub first_offset: u64,
    /// Last offset known to be cut: the last valid entry's after the damage (they may have been
    /// acknowledged), else the complete damaged entry's own last offset, else `first_offset`
    /// (the resync search spent its budget: what follows is unknown).
    pub last_offset: u64,
    /// Payload bytes the resync search after the damage charged to its budget
    /// (`verify::ResyncBudget`, at most `RESYNC_CHARGED_BYTES_PER_TAIL_BYTE * size_bytes`): the
    /// bound on the hashing it did.
    pub resync_charged_bytes: u64,
}

/// Why a log operation failed; the variants say how the caller recovers.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    /// An I/O step failed. After a failed append write (other than [`LogError::StorageFull`]) or
    /// fsync the log is poisoned: every later append, sync and close fails with this error
    /// again, and the log must be reopened (which truncates whatever tail did not survive).
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    /// A write was refused for lack of space (`ENOSPC`, `EDQUOT` or `EFBIG`) at `op` on `path`.
    /// The log rolled its files back to the acknowledged end: this append, the others of its
    /// group and those queued behind it were not kept and got no offset; the log is not poisoned
    /// and accepts appends again (they succeed once space is freed). `free_bytes` is what the
    /// filesystem of the log had free after the rollback.
    #[error(
        "{path}: {op} failed: {source} ({free_bytes}); nothing of this append was kept, retry once space is freed"
    )]
    StorageFull {
        path: PathBuf,
        op: &'static str,
        free_bytes: FreeBytes,
        source: std::io::Error,
    },
    /// An open (or creation) of a file or directory at `op` on `path` was refused because no file
    /// descriptor was left (`EMFILE`: the process is at its open-file limit; `ENFILE`: the
    /// system's file table is full). Nothing was written or read: an append's group was rolled
    /// back to the acknowledged end as for [`LogError::StorageFull`] (the appends got no
    /// offset), and the log is not poisoned: retry once descriptors are freed.
    #[error(
        "{path}: {op} failed: {source}; the open-file limit is reached, nothing was kept or read, retry once file descriptors are freed"
    )]
    DescriptorsExhausted {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    /// Stored bytes are damaged where a torn write cannot explain them (inside a closed segment,
    /// or bytes read back that no longer match their checksum). Never skipped silently.
    #[error("{path}: corrupt entry at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// Open found damage in the last segment that it keeps (a complete damaged entry, valid
    /// entries after a damaged one, or a resync search out of budget) but could not copy the `size_bytes` bytes from byte `position` of `segment` to the quarantine
    /// file `path` (step `op`). Nothing was truncated and the partial copy was removed, so the
    /// segment is as before: free space (at least `size_bytes` bytes; `free_bytes` was free
    /// after the failure) and open again (restart the server). `source` says whether space was
    /// the cause (`space::is_storage_full`).
    #[error(
        "{segment}: damaged entry at byte {position} may have been acknowledged; the {size_bytes} \
         bytes from there must be copied to a quarantine file before the segment is truncated, but \
         {op} of {path} failed: {source} ({free_bytes}). Nothing was truncated and the partial copy \
         was removed: free at least {size_bytes} bytes and restart"
    )]
    QuarantineFailed {
        segment: PathBuf,
        position: u64,
        size_bytes: u64,
        path: PathBuf,
        op: &'static str,
        free_bytes: FreeBytes,
        source: std::io::Error,
    },
    /// The appended bytes are not a well-formed entry; nothing was written.
    #[error("invalid entry: {0}")]
    InvalidEntry(String),
    /// The writer queue of this log holds [`APPEND_QUEUE_ENTRY_COUNT_MAX`] entries or
    /// [`APPEND_QUEUE_BYTES_MAX`] bytes; nothing was written, retry after earlier appends finish.
    #[error("append queue full: {queued_count} entries, {queued_bytes} bytes queued")]
    QueueFull {
        queued_count: usize,
        queued_bytes: usize,
    },
    /// The `LogConfig` passed to `open` is out of bounds.
    #[error("invalid log config: {0}")]
    InvalidConfig(String),
    /// `close` was called (or is in progress).
    #[error("log is closed")]
    Closed,
    /// A read asked for an offset beyond the log's end: nothing was written there. The reader
    /// resumes at `next_offset` (one past the last acknowledged message).
    #[error("offset {offset} is beyond the next offset {next_offset}")]
    OffsetOutOfRange { offset: u64, next_offset: u64 },
    /// A read asked for an offset below the log's first offset: retention deleted the segments
    /// holding it (issue 11 section 4). The reader resumes at `first_offset`.
    #[error("offset {offset} is below the first offset {first_offset}: retention deleted it")]
    OffsetRetained { offset: u64, first_offset: u64 },
}

/// A write or fsync failure: kept to fail everything after it with the same error (poisoned), or,
/// when `refusal` is set, given to the appends a rollback discarded.
#[derive(Debug, Clone)]
struct Failure {
    path: PathBuf,
    op: &'static str,
    kind: io::ErrorKind,
    raw_os_error: Option<i32>,
    message: String,
    /// Set when nothing was stored that was not also reported written, so rolling back to the
    /// acknowledged end recovers (never set for a failed fsync or write of another class).
    refusal: Option<Refusal>,
    /// Free bytes of the log's filesystem, measured after the rollback (`StorageFull` only).
    free_bytes: FreeBytes,
}

/// Why a failed step is recoverable by rolling back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    /// A write or creation refused for lack of space (`ENOSPC`, `EDQUOT`, `EFBIG`).
    StorageFull,
    /// An open refused for lack of file descriptors (`EMFILE`, `ENFILE`).
    DescriptorsExhausted,
}

impl Failure {
    /// A failure that poisons the log whatever its errno (fsync, rename, truncate), except an
    /// errno of the descriptor class: only descriptor-allocating calls return it, so it was an
    /// open (a directory fsync opens the directory first) that wrote nothing.
    fn new(path: &Path, op: &'static str, error: &io::Error) -> Self {
        Failure {
            path: path.to_path_buf(),
            op,
            kind: error.kind(),
            raw_os_error: error.raw_os_error(),
            message: error.to_string(),
            refusal: is_descriptors_exhausted(error).then_some(Refusal::DescriptorsExhausted),
            free_bytes: FreeBytes(None),
        }
    }

    /// A failed write (or file creation): recoverable when the filesystem is full or no
    /// descriptor was left for the creation.
    fn write(path: &Path, op: &'static str, error: &io::Error) -> Self {
        let failure = Failure::new(path, op, error);
        if is_storage_full(error) {
            return Failure {
                refusal: Some(Refusal::StorageFull),
                ..failure
            };
        }
        failure
    }

    /// Whether rolling back to the acknowledged end recovers from this failure.
    fn is_refusal(&self) -> bool {
        self.refusal.is_some()
    }

    fn source(&self) -> io::Error {
        match self.raw_os_error {
            Some(errno) => io::Error::from_raw_os_error(errno),
            None => io::Error::new(self.kind, self.message.clone()),
        }
    }

    fn to_error(&self) -> LogError {
        match self.refusal {
            Some(Refusal::StorageFull) => LogError::StorageFull {
                path: self.path.clone(),
                op: self.op,
                free_bytes: self.free_bytes,
                source: self.source(),
            },
            Some(Refusal::DescriptorsExhausted) => LogError::DescriptorsExhausted {
                path: self.path.clone(),
                op: self.op,
                source: self.source(),
            },
            None => LogError::Io {
                path: self.path.clone(),
                op: self.op,
                source: self.source(),
            },
        }
    }
}

/// One segment as readers see it: its file and the index of every entry written to it.
#[derive(Debug)]
struct Segment {
    path: PathBuf,
    /// The open file (read-write) while this is the active segment; `None` once closed: a closed
    /// segment holds no descriptor, reads open it on demand through `ClosedFiles`.
    file: Option<File>,
    index: SegmentIndex,
}

impl Segment {
    /// The file of the active segment.
    ///
    /// # Panics
    /// On a closed segment (a bug: only the active segment is written or fsynced).
    fn active_file(&self) -> &File {
        self.file
            .as_ref()
            .expect("the active segment keeps its file open")
    }
}

/// An entry waiting for the writer, with its offset already assigned.
#[derive(Debug)]
struct PendingAppend {
    base_offset: u64,
    message_count: u32,
    entry: Vec<u8>,
    completion: Completion<Result<u64, LogError>>,
}

#[derive(Debug)]
struct State {
    /// Next offset `append` assigns.
    next_offset: u64,
    /// One past the last acknowledged offset; `read` never returns an entry at or beyond it.
    acked_offset: u64,
    queue: VecDeque<PendingAppend>,
    queued_bytes: usize,
    sync_waiters: Vec<Completion<Result<(), LogError>>>,
    close_waiters: Vec<Completion<Result<(), LogError>>>,
    /// Set by `close` or drop: no new appends; the writer drains the queue, fsyncs and stops.
    closing: bool,
    writer_done: bool,
    writer_waker: Option<Waker>,
    /// The closed segments before the active one, by summary, with a bounded cache of their
    /// indexes (issue 11 section 4: only the active segment's index is always in memory).
    sealed: SealedSegments,
    /// The segment the writer appends to; its whole index is in memory.
    active: Segment,
    /// Open files of closed segments, for reads.
    closed_files: ClosedFiles,
    /// Read-only mappings of the segments reads verify and hand out (issue 12 item 2).
    mappings: mapped::SegmentMappings,
    failure: Option<Failure>,
    /// Bytes written to the active segment since its last fsync.
    dirty: bool,
    last_sync_at: Instant,
    fsync_count: u64,
    /// Entries written since the last fsync (the group-commit batch the next fsync covers).
    unsynced_append_count: u64,
    /// Every idempotent producer's last batches among the acknowledged entries; written as the
    /// new segment's snapshot at each roll.
    producers: producer_state::ProducerStates,
    /// Base offsets of the producer-state snapshot files in the directory.
    producer_snapshot_base_offsets: std::collections::BTreeSet<u64>,
    /// Where direct writes stand (`WriteMode::Direct`), `Off` in buffered mode.
    direct: direct::DirectState,
}

impl State {
    fn active(&self) -> &Segment {
        &self.active
    }

    fn active_mut(&mut self) -> &mut Segment {
        &mut self.active
    }

    /// Segments of the log, the active one included.
    fn segment_count(&self) -> usize {
        self.sealed.len() + 1
    }

    /// Closes the active segment and starts `next` (a roll): the closed one's file moves to the
    /// closed-file cache and its index to the sealed-index cache (readers catching up read it
    /// next), so the log keeps one descriptor for its active segment and at most
    /// [`CLOSED_SEGMENT_FILES_OPEN_MAX`] for reads, and the closed index only while the cache
    /// bound allows.
    fn start_segment(&mut self, next: Segment) {
        let mut closed = std::mem::replace(&mut self.active, next);
        let base_offset = closed.index.base_offset;
        if let Some(file) = closed.file.take() {
            self.closed_files.keep_rolled(base_offset, file);
        }
        self.sealed.push(closed.index);
    }

    fn wake_writer(&mut self) {
        if let Some(waker) = self.writer_waker.take() {
            waker.wake();
        }
    }
}

#[derive(Debug)]
struct Shared {
    dir: PathBuf,
    config: LogConfig,
    state: RefCell<State>,
    /// Test seam: consulted before every entry write and segment fsync.
    faults: FaultInjector,
    /// Where fsyncs are reported (`PartitionLog::open_with_stats`).
    stats: Option<Rc<dyn LogStats>>,
    /// Set while a retention pass runs on this log (`retention.rs`): passes never overlap.
    retention_running: std::cell::Cell<bool>,
}

/// One partition's log, owned by one shard (!Send). Methods take `&self`; concurrent appends from
/// tasks on the owner shard are group-committed.
///
/// Dropping it stops accepting appends and lets the writer finish the queued ones (and fsync) in
/// the background; `close` does the same and waits for it.
pub struct PartitionLog {
    shared: Rc<Shared>,
}

impl std::fmt::Debug for PartitionLog {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = self.shared.state.borrow();
        formatter
            .debug_struct("PartitionLog")
            .field("dir", &self.shared.dir)
            .field("config", &self.shared.config)
            .field("next_offset", &state.next_offset)
            .field("acked_offset", &state.acked_offset)
            .field("segment_count", &state.segment_count())
            .field("failure", &state.failure)
            .finish_non_exhaustive()
    }
}

/// The future `append` returns: the base offset once the entry is durable per the fsync policy.
///
/// The entry is queued (and its offset reserved) when `append` is called, not when this is first
/// polled; dropping this does not cancel the write.
#[derive(Debug)]
#[must_use = "the entry is written either way; await this to learn its offset and whether it is durable"]
pub struct AppendFuture {
    completion: Completion<Result<u64, LogError>>,
}

impl Future for AppendFuture {
    type Output = Result<u64, LogError>;

    fn poll(mut self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.completion).poll(context)
    }
}

impl PartitionLog {
    /// Opens or creates the log in `dir`, scanning the last segment and truncating a torn tail
    /// (after copying it to a quarantine file when valid entries follow the damage:
    /// `RecoveryReport::quarantined`), and starts the log's writer task on the current compio
    /// runtime.
    ///
    /// # Errors
    /// `InvalidConfig` for a `segment_size_max` of 0 or above [`SEGMENT_SIZE_MAX_LIMIT`]; `Io`
    /// naming the path and step (a quarantine file that cannot be written durably included:
    /// nothing is truncated then); `Corrupt` naming the file and byte position for damage inside a
    /// closed segment, segments that do not follow each other, or a first segment that does not
    /// start at offset 0 (the segments before it are missing; storage/FORMAT.md section 3).
    ///
    /// # Panics
    /// Outside a compio runtime.
    ///
    /// # Cancel safety
    /// Not cancel safe: dropped midway, a torn tail may already be truncated (harmless; the next
    /// open finds nothing to cut) or an index file rewritten (also harmless).
    pub async fn open(
        dir: &Path,
        config: LogConfig,
    ) -> Result<(PartitionLog, RecoveryReport), LogError> {
        Self::open_reporting(dir, config, None).await
    }

    /// As [`PartitionLog::open`], and every segment fsync of this log is reported to `stats`
    /// (count, latency, appends covered; see [`LogStats`]). The owner shares one sink among its
    /// logs.
    ///
    /// # Errors
    /// As [`PartitionLog::open`].
    ///
    /// # Panics
    /// Outside a compio runtime.
    ///
    /// # Cancel safety
    /// As [`PartitionLog::open`].
    pub async fn open_with_stats(
        dir: &Path,
        config: LogConfig,
        stats: Rc<dyn LogStats>,
    ) -> Result<(PartitionLog, RecoveryReport), LogError> {
        Self::open_reporting(dir, config, Some(stats)).await
    }

    async fn open_reporting(
        dir: &Path,
        config: LogConfig,
        stats: Option<Rc<dyn LogStats>>,
    ) -> Result<(PartitionLog, RecoveryReport), LogError> {
        if config.segment_size_max == 0 || config.segment_size_max > SEGMENT_SIZE_MAX_LIMIT {
            return Err(LogError::InvalidConfig(format!(
                "segment_size_max {} must be within 1..={SEGMENT_SIZE_MAX_LIMIT} bytes",
                config.segment_size_max
            )));
        }
        let recovered = recovery::recover(dir).await?;
        let next_offset = recovered.report.next_offset;
        let state = State {
            next_offset,
            acked_offset: next_offset,
            queue: VecDeque::new(),
            queued_bytes: 0,
            sync_waiters: Vec::new(),
            close_waiters: Vec::new(),
            closing: false,
            writer_done: false,
            writer_waker: None,
            sealed: recovered.sealed,
            active: recovered.active,
            closed_files: ClosedFiles::default(),
            mappings: mapped::SegmentMappings::default(),
            failure: None,
            dirty: false,
            last_sync_at: Instant::now(),
            fsync_count: 0,
            unsynced_append_count: 0,
            producers: recovered.producers.states,
            producer_snapshot_base_offsets: recovered.producers.snapshot_base_offsets,
            direct: match config.write_mode {
                WriteMode::Buffered => direct::DirectState::Off,
                WriteMode::Direct => direct::DirectState::Idle,
            },
        };
        let shared = Rc::new(Shared {
            dir: dir.to_path_buf(),
            config,
            state: RefCell::new(state),
            faults: FaultInjector::default(),
            stats,
            retention_running: std::cell::Cell::new(false),
        });
        compio::runtime::spawn(writer::run(Rc::clone(&shared))).detach();
        Ok((PartitionLog { shared }, recovered.report))
    }

    /// Next offset to be assigned.
    pub fn next_offset(&self) -> u64 {
        self.shared.state.borrow().next_offset
    }

    /// One past the last acknowledged offset: `read` returns entries below it only. Equals
    /// `next_offset()` when no append is in flight.
    pub fn acked_offset(&self) -> u64 {
        self.shared.state.borrow().acked_offset
    }

    /// Segment fsyncs this log has issued since open (group commits, `sync`, rolls, close). A
    /// counter for tests and metrics: under `Always`, fewer than the appends when they overlap.
    pub fn fsync_count(&self) -> u64 {
        self.shared.state.borrow().fsync_count
    }

    /// The write mode this log's entry writes use now: `LogConfig::write_mode`, except
    /// `Buffered` once a direct log fell back because `O_DIRECT` was refused (`EINVAL` at the
    /// open of a segment or at a write; logged once). A direct log opens its `O_DIRECT`
    /// descriptor at its first write, so a refusal shows only after one.
    pub fn write_mode_in_use(&self) -> WriteMode {
        self.shared.state.borrow().direct.write_mode()
    }

    /// The directory holding this log's files.
    pub fn dir(&self) -> &Path {
        &self.shared.dir
    }

    /// The fault-injecting seam of this log (entry writes, segment fsyncs and producer-state
    /// snapshot writes), for tests of the failure paths; unarmed unless a caller arms it.
    pub fn fault_injector(&self) -> FaultInjector {
        self.shared.faults.clone()
    }

    /// Appends one entry (`EntryHeader` + payload, `base_offset` is overwritten). Returns the base
    /// offset once the entry is durable per the fsync policy.
    ///
    /// The header is checked (`length` == payload bytes, `message_count` >= 1, whole entry <=
    /// [`ENTRY_SIZE_MAX`]) and the offset assigned synchronously, in call order; the payload
    /// checksum is trusted (the server checked it) and only checked in debug builds.
    ///
    /// # Errors
    /// `InvalidEntry`, `QueueFull`, `Closed`, or the poisoning `Io` error, without writing;
    /// `StorageFull` if a write of its group was refused for lack of space, or it was queued
    /// behind such a group: nothing of the group or of the queue behind it is kept, the offsets
    /// are reused, and the log keeps accepting appends; `Io` if any other write or an
    /// fsync of its group fails (nothing in that group is acknowledged, and the log is
    /// poisoned).
    ///
    /// # Cancel safety
    /// The offset is reserved and the write proceeds even if the future is dropped.
    pub fn append(&self, entry: Vec<u8>) -> AppendFuture {
        let completion = match self.enqueue(entry) {
            Ok(completion) => completion,
            Err(error) => Completion::ready(Err(error)),
        };
        AppendFuture { completion }
    }

    fn enqueue(&self, mut entry: Vec<u8>) -> Result<Completion<Result<u64, LogError>>, LogError> {
        let header = check_entry(&entry)?;
        debug_assert_eq!(
            header.checksum,
            entry_checksum(header.base_timestamp_us, &entry[ENTRY_HEADER_SIZE..]),
            "the server appends only entries whose checksum it verified"
        );
        let mut state = self.shared.state.borrow_mut();
        if let Some(failure) = &state.failure {
            return Err(failure.to_error());
        }
        if state.closing {
            return Err(LogError::Closed);
        }
        if state.queue.len() >= APPEND_QUEUE_ENTRY_COUNT_MAX
            || state.queued_bytes + entry.len() > APPEND_QUEUE_BYTES_MAX
        {
            return Err(LogError::QueueFull {
                queued_count: state.queue.len(),
                queued_bytes: state.queued_bytes,
            });
        }
        let base_offset = state.next_offset;
        let Some(next_offset) = base_offset.checked_add(u64::from(header.message_count)) else {
            return Err(LogError::InvalidEntry(format!(
                "{} messages at offset {base_offset} overflow the offset space",
                header.message_count
            )));
        };
        entry[0..8].copy_from_slice(&base_offset.to_le_bytes());
        state.next_offset = next_offset;
        state.queued_bytes += entry.len();
        let completion = Completion::new();
        state.queue.push_back(PendingAppend {
            base_offset,
            message_count: header.message_count,
            entry,
            completion: completion.clone(),
        });
        state.wake_writer();
        Ok(completion)
    }

    /// The file of the closed segment `span` reads: from the closed-file cache, or opened
    /// read-only with a free slot and kept there. When reads in flight hold every slot
    /// (`CLOSED_SEGMENT_FILES_OPEN_MAX`) it waits for one to complete, so the descriptors the
    /// log's reads hold stay within what the server's budget counts.
    async fn closed_segment_file(&self, span: &ReadSpan) -> Result<ReadFile, LogError> {
        let reservation = loop {
            let reserved = self
                .shared
                .state
                .borrow_mut()
                .closed_files
                .reserve(span.segment_base_offset);
            match reserved {
                Reserve::Cached(file) => return Ok(file),
                Reserve::Reserved(reservation) => break reservation,
                Reserve::Full(slots) => slots.free().await,
            }
        };
        let file = File::open(&span.path).await.map_err(|source| {
            let path = span.path.clone();
            let op = "open closed segment for a read";
            if is_descriptors_exhausted(&source) {
                LogError::DescriptorsExhausted { path, op, source }
            } else {
                LogError::Io { path, op, source }
            }
        })?;
        Ok(self.shared.state.borrow_mut().closed_files.keep_opened(
            span.segment_base_offset,
            reservation,
            file,
        ))
    }

    /// A closed-file slot for loading a sealed segment's index file, waiting while reads in
    /// flight hold every slot (issue 7 section 2: a partition's descriptors stay within its
    /// budget).
    ///
    /// # Cancel safety
    /// Cancel safe: a reservation dropped unused gives its slot back.
    async fn index_load_slot(&self) -> SlotReservation {
        loop {
            let reserved = self.shared.state.borrow_mut().closed_files.reserve_slot();
            match reserved {
                Ok(reservation) => return reservation,
                Err(slots) => slots.free().await,
            }
        }
    }

    /// The first offset a read can return: the base offset of the first segment (0 until
    /// retention deletes segments).
    pub fn first_offset(&self) -> u64 {
        let state = self.shared.state.borrow();
        state
            .sealed
            .oldest()
            .map_or(state.active.index.base_offset, |segment| {
                segment.base_offset
            })
    }

    /// Chooses the byte ranges `read` returns, segment by segment from the one holding `offset`:
    /// the active segment's rows are in memory; a sealed segment's index comes from the
    /// sealed-index cache, or is loaded from its file and cached (issue 11 section 4).
    ///
    /// # Errors
    /// `load_sealed_index`'s, when the index of the first segment to read cannot be loaded; a
    /// later segment's failure ends the plan before that segment instead (the read returns what
    /// precedes it, and a read starting there gets the error).
    async fn plan_read(
        &self,
        offset: u64,
        max_count: u32,
        max_bytes: usize,
    ) -> Result<Vec<ReadSpan>, LogError> {
        let mut plan = ReadPlan {
            offset,
            acked_offset: self.acked_offset(),
            max_count: u64::from(max_count),
            max_bytes: max_bytes as u64,
            collected_count: 0,
            collected_bytes: 0,
            done: false,
            spans: Vec::new(),
        };
        loop {
            let missing = {
                let mut state = self.shared.state.borrow_mut();
                match plan.extend(&self.shared.dir, &mut state) {
                    Some(segment) => segment,
                    None => return Ok(plan.spans),
                }
            };
            // The index file counts against the log's closed-file descriptors like a segment
            // a read opens (`closed_files.rs`); a read that waited for the slot may find the
            // index cached by another meanwhile.
            let _slot = self.index_load_slot().await;
            if self
                .shared
                .state
                .borrow_mut()
                .sealed
                .cached_index(missing.base_offset)
                .is_some()
            {
                continue;
            }
            match load_sealed_index(&self.shared.dir, missing).await {
                // Not cached when retention or a rollback removed the segment meanwhile: the
                // plan then goes on from the segment that holds the offset now.
                Ok(index) => {
                    self.shared
                        .state
                        .borrow_mut()
                        .sealed
                        .cache(missing, Rc::new(index));
                }
                Err(error) if plan.spans.is_empty() => return Err(error),
                Err(error) => {
                    tracing::warn!(%error, "read stopped before a sealed segment whose index cannot be loaded");
                    return Ok(plan.spans);
                }
            }
        }
    }

    /// Fsyncs everything written so far (a no-op when nothing was written since the last fsync).
    ///
    /// # Errors
    /// The poisoning `Io` error, or `Io` if this fsync fails (which poisons the log); `Closed`
    /// after `close`.
    ///
    /// # Cancel safety
    /// The fsync proceeds even if the future is dropped.
    pub async fn sync(&self) -> Result<(), LogError> {
        let completion = {
            let mut state = self.shared.state.borrow_mut();
            if let Some(failure) = &state.failure {
                return Err(failure.to_error());
            }
            if state.writer_done {
                return Err(LogError::Closed);
            }
            let completion = Completion::new();
            state.sync_waiters.push(completion.clone());
            state.wake_writer();
            completion
        };
        completion.await
    }

    /// Called on the shard tick; fsyncs under `Interval` when something was written and the
    /// interval has passed since the last fsync. Does nothing under the other policies.
    ///
    /// # Errors
    /// As `sync`.
    ///
    /// # Cancel safety
    /// As `sync`.
    pub async fn on_tick(&self) -> Result<(), LogError> {
        let FsyncPolicy::Interval(interval) = self.shared.config.fsync else {
            return Ok(());
        };
        let due = {
            let state = self.shared.state.borrow();
            if let Some(failure) = &state.failure {
                return Err(failure.to_error());
            }
            state.dirty && !state.closing && state.last_sync_at.elapsed() >= interval
        };
        if due { self.sync().await } else { Ok(()) }
    }

    /// Stops accepting appends, waits until every queued entry is written, fsyncs, and stops the
    /// writer task. Reads keep working afterwards. Calling it again returns the same outcome.
    ///
    /// # Errors
    /// The poisoning `Io` error if a write or fsync failed at any point.
    ///
    /// # Cancel safety
    /// Cancel safe: closing proceeds without the future, and a later call waits again.
    pub async fn close(&self) -> Result<(), LogError> {
        let completion = {
            let mut state = self.shared.state.borrow_mut();
            if state.writer_done {
                return match &state.failure {
                    Some(failure) => Err(failure.to_error()),
                    None => Ok(()),
                };
            }
            state.closing = true;
            let completion = Completion::new();
            state.close_waiters.push(completion.clone());
            state.wake_writer();
            completion
        };
        completion.await
    }
}

impl Drop for PartitionLog {
    fn drop(&mut self) {
        let mut state = self.shared.state.borrow_mut();
        state.closing = true;
        state.wake_writer();
    }
}

/// The file one span of a read reads: the active segment's own, or a closed segment's, holding
/// one of the log's closed-file slots until the span is read.
enum SpanFile {
    Active(File),
    Closed(ReadFile),
}

impl SpanFile {
    fn file(&self) -> &File {
        match self {
            SpanFile::Active(file) => file,
            SpanFile::Closed(file) => file.file(),
        }
    }
}

/// Checks an appended entry's header against its bytes.
fn check_entry(entry: &[u8]) -> Result<EntryHeader, LogError> {
    let Some(header) = EntryHeader::decode(entry) else {
        return Err(LogError::InvalidEntry(format!(
            "{} bytes is shorter than the {ENTRY_HEADER_SIZE}-byte header",
            entry.len()
        )));
    };
    if entry.len() > ENTRY_SIZE_MAX as usize {
        return Err(LogError::InvalidEntry(format!(
            "{} bytes exceeds the {ENTRY_SIZE_MAX}-byte entry limit",
            entry.len()
        )));
    }
    let payload_size = entry.len() - ENTRY_HEADER_SIZE;
    if header.length as usize != payload_size {
        return Err(LogError::InvalidEntry(format!(
            "header length {} does not match the {payload_size} payload bytes",
            header.length
        )));
    }
    if header.message_count == 0 {
        return Err(LogError::InvalidEntry("message_count is 0".to_owned()));
    }
    // Open and reads refuse an entry whose messages do not match its header: never store one.
    crate::entry::check_message_section(&entry[ENTRY_HEADER_SIZE..], header.message_count)
        .map_err(LogError::InvalidEntry)?;
    Ok(header)
}

/// What the index says an entry in a read span looks like.
#[derive(Debug)]
struct ExpectedEntry {
    base_offset: u64,
    message_count: u64,
    size_bytes: u64,
}

/// Contiguous entries of one segment that `read` returns.
#[derive(Debug)]
struct ReadSpan {
    path: PathBuf,
    segment_base_offset: u64,
    /// The active segment's file; `None` for a closed segment (opened when read).
    file: Option<File>,
    position: u64,
    size_bytes: u64,
    rows: Vec<ExpectedEntry>,
}

/// A read being planned: where it has got to and what it has collected.
#[derive(Debug)]
struct ReadPlan {
    /// The next offset to plan from.
    offset: u64,
    /// The acknowledged end when the read began: no entry at or past it is returned.
    acked_offset: u64,
    max_count: u64,
    max_bytes: u64,
    collected_count: u64,
    collected_bytes: u64,
    /// A bound or the acknowledged end was reached.
    done: bool,
    spans: Vec<ReadSpan>,
}

impl ReadPlan {
    /// Adds the spans of the segments holding the next offsets, from the active segment's index
    /// and the cached indexes of sealed segments, until the read is complete (`None`) or a
    /// sealed segment's index is not cached (returned: the caller loads it and calls again).
    fn extend(&mut self, dir: &Path, state: &mut State) -> Option<SealedSegment> {
        while !self.done && self.offset < self.acked_offset {
            let Some(segment) = state.sealed.lookup(self.offset) else {
                let active = &state.active;
                self.add_rows(&active.index, &active.path, active.file.as_ref());
                return None;
            };
            let Some(index) = state.sealed.cached_index(segment.base_offset) else {
                return Some(segment);
            };
            let path = recovery::segment_path(dir, segment.base_offset);
            self.add_rows(&index, &path, None);
            self.offset = index.end_offset;
        }
        None
    }

    /// Adds the entries of one segment from the one holding `self.offset` while the bounds
    /// allow; `file` is the active segment's (a closed segment is opened when read).
    fn add_rows(&mut self, index: &SegmentIndex, path: &Path, file: Option<&File>) {
        let Some(first_row) = index.row_containing(self.offset) else {
            return;
        };
        let mut span: Option<ReadSpan> = None;
        for row_index in first_row..index.rows.len() {
            let row = index.rows[row_index];
            let entry_size = index.entry_end_position(row_index) - row.position;
            let entry_count = index.entry_end_offset(row_index) - row.base_offset;
            if row.base_offset >= self.acked_offset
                || (self.collected_count > 0
                    && (self.collected_count >= self.max_count
                        || self.collected_bytes + entry_size > self.max_bytes))
            {
                self.done = true;
                break;
            }
            self.collected_count += entry_count;
            self.collected_bytes += entry_size;
            let span = span.get_or_insert_with(|| ReadSpan {
                path: path.to_path_buf(),
                segment_base_offset: index.base_offset,
                file: file.cloned(),
                position: row.position,
                size_bytes: 0,
                rows: Vec::new(),
            });
            span.size_bytes += entry_size;
            span.rows.push(ExpectedEntry {
                base_offset: row.base_offset,
                message_count: entry_count,
                size_bytes: entry_size,
            });
        }
        if let Some(span) = span {
            self.spans.push(span);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::CLOSED_SEGMENT_FILES_OPEN_MAX;

    #[test]
    fn fsync_policy_parses() {
        assert_eq!("always".parse(), Ok(FsyncPolicy::Always));
        assert_eq!("never".parse(), Ok(FsyncPolicy::Never));
        assert_eq!(
            "interval=250".parse(),
            Ok(FsyncPolicy::Interval(Duration::from_millis(250)))
        );
        assert_eq!(FsyncPolicy::default(), FsyncPolicy::Always);
    }

    #[test]
    fn fsync_policy_errors_name_value_and_rule() {
        assert_eq!(
            "interval=0".parse::<FsyncPolicy>(),
            Err(
                "fsync policy \"interval=0\": MS must be a whole number of milliseconds from 1 to \
                 3600000"
                    .to_owned()
            )
        );
        for value in [
            "interval=-1",
            "interval=3600001",
            "interval=99999999999999999999",
        ] {
            assert_eq!(
                value.parse::<FsyncPolicy>(),
                Err(format!(
                    "fsync policy {value:?}: MS must be a whole number of milliseconds from 1 \
                     to 3600000"
                ))
            );
        }
        assert_eq!(
            "interval=3600000".parse(),
            Ok(FsyncPolicy::Interval(Duration::from_hours(1)))
        );
        assert_eq!(
            "interval=1.5".parse::<FsyncPolicy>(),
            Err(
                "fsync policy \"interval=1.5\": MS must be a whole number of milliseconds from 1 \
                 to 3600000"
                    .to_owned()
            )
        );
        assert_eq!(
            "sometimes".parse::<FsyncPolicy>(),
            Err(
                "fsync policy \"sometimes\": expected \"always\", \"never\" or \"interval=MS\""
                    .to_owned()
            )
        );
        assert!("Always".parse::<FsyncPolicy>().is_err());
    }

    /// Issue 10 section 1: every segment fsync is reported to the log's stats sink with the
    /// appends it made durable (one group commit covers every append queued before it ran).
    #[test]
    fn log_stats_report_each_fsync_with_the_appends_it_covered() {
        use stats::tests::RecordingStats;
        let dir = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let stats = Rc::new(RecordingStats::default());
            let config = LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: crate::log::WriteMode::Buffered,
            };
            let sink: Rc<dyn LogStats> = stats.clone();
            let (log, _) = PartitionLog::open_with_stats(dir.path(), config, sink)
                .await
                .unwrap();
            // Queued before the writer runs: one group, one fsync.
            let appends: Vec<AppendFuture> = (0..10)
                .map(|_| log.append(crate::entry::build_entry(0, 1, b"m")))
                .collect();
            for append in appends {
                append.await.unwrap();
            }
            log.append(crate::entry::build_entry(0, 2, b"alone"))
                .await
                .unwrap();
            log.close().await.unwrap();
            let counts: Vec<u64> = stats.fsyncs.borrow().iter().map(|(n, _)| *n).collect();
            assert_eq!(
                counts,
                vec![10, 1],
                "nothing dirty at close: no third fsync"
            );
            assert_eq!(log.fsync_count(), 2);
        });
        let never = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let stats = Rc::new(RecordingStats::default());
            let config = LogConfig {
                fsync: FsyncPolicy::Never,
                segment_size_max: 1 << 20,
                write_mode: crate::log::WriteMode::Buffered,
            };
            let sink: Rc<dyn LogStats> = stats.clone();
            let (log, _) = PartitionLog::open_with_stats(never.path(), config, sink)
                .await
                .unwrap();
            for _ in 0..3 {
                log.append(crate::entry::build_entry(0, 1, b"m"))
                    .await
                    .unwrap();
            }
            assert!(
                stats.fsyncs.borrow().is_empty(),
                "Never: no fsync per append"
            );
            log.close().await.unwrap();
            let counts: Vec<u64> = stats.fsyncs.borrow().iter().map(|(n, _)| *n).collect();
            assert_eq!(counts, vec![3], "the close fsync covers the three appends");
        });
    }

    #[test]
    fn read_stops_at_the_acknowledged_watermark() {
        let dir = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let config = LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: crate::log::WriteMode::Buffered,
            };
            let (log, _) = PartitionLog::open(dir.path(), config).await.unwrap();
            let first = crate::entry::build_entry(0, 2, b"first");
            assert_eq!(log.append(first.clone()).await.unwrap(), 0);
            assert_eq!(
                log.append(crate::entry::build_entry(0, 3, b"second"))
                    .await
                    .unwrap(),
                2
            );
            // Both entries are written and indexed; pretend only the first was acknowledged.
            log.shared.state.borrow_mut().acked_offset = 2;
            assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), first);
            assert!(log.read(2, u32::MAX, usize::MAX).await.unwrap().is_empty());
            assert!(matches!(
                log.read(4, u32::MAX, usize::MAX).await,
                Err(LogError::OffsetOutOfRange {
                    offset: 4,
                    next_offset: 2
                })
            ));
            assert!(matches!(
                log.read(u64::MAX, 1, usize::MAX).await,
                Err(LogError::OffsetOutOfRange {
                    offset: u64::MAX,
                    next_offset: 2
                })
            ));
            assert_eq!(log.first_offset(), 0);
            log.shared.state.borrow_mut().acked_offset = 5;
            // The second entry: 32-byte header, 3 message headers, "second".
            assert_eq!(
                log.read(4, u32::MAX, usize::MAX).await.unwrap().len(),
                32 + 3 * 32 + 6
            );
        });
    }

    #[test]
    fn failed_write_poisons_the_log() {
        let dir = tempfile::tempdir().unwrap();
        let segment_path = dir.path().join("00000000000000000000.log");
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let config = LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: crate::log::WriteMode::Buffered,
            };
            let (log, _) = PartitionLog::open(dir.path(), config.clone())
                .await
                .unwrap();
            let first = crate::entry::build_entry(0, 1, b"first");
            assert_eq!(log.append(first.clone()).await.unwrap(), 0);
            // A read-only descriptor makes the next write fail with EBADF, like a failing disk.
            let read_only = File::open(&segment_path).await.unwrap();
            log.shared.state.borrow_mut().active_mut().file = Some(read_only);

            let second = log.append(crate::entry::build_entry(0, 1, b"second"));
            let third = log.append(crate::entry::build_entry(0, 1, b"third"));
            for result in [second.await, third.await] {
                assert!(
                    matches!(&result, Err(LogError::Io { op: "write entries", path, .. })
                        if *path == segment_path),
                    "{result:?}"
                );
            }
            // Poisoned: everything after fails with the same error, without writing.
            let later = log.append(crate::entry::build_entry(0, 1, b"later")).await;
            assert!(
                matches!(
                    later,
                    Err(LogError::Io {
                        op: "write entries",
                        ..
                    })
                ),
                "{later:?}"
            );
            assert!(matches!(
                log.sync().await,
                Err(LogError::Io {
                    op: "write entries",
                    ..
                })
            ));
            assert_eq!(log.acked_offset(), 1);
            assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), first);
            assert!(matches!(
                log.close().await,
                Err(LogError::Io {
                    op: "write entries",
                    ..
                })
            ));
            assert!(matches!(
                log.close().await,
                Err(LogError::Io {
                    op: "write entries",
                    ..
                })
            ));
            drop(log);

            let (log, report) = PartitionLog::open(dir.path(), config).await.unwrap();
            assert_eq!(report.next_offset, 1);
            assert_eq!(report.truncated_bytes, 0);
            assert_eq!(
                log.append(crate::entry::build_entry(0, 1, b"again"))
                    .await
                    .unwrap(),
                1
            );
        });
    }

    /// Segments holding an open file (the active one), and the closed files kept for reads.
    fn open_files(log: &PartitionLog) -> (usize, Vec<u64>) {
        let state = log.shared.state.borrow();
        // Sealed segments are summaries: they have no file to hold.
        let active_count = usize::from(state.active.file.is_some());
        let closed = state
            .closed_files
            .files
            .iter()
            .map(|(base, _)| *base)
            .collect();
        (active_count, closed)
    }

    #[test]
    fn issue7_2_closed_segments_hold_no_descriptor_and_reads_keep_a_bounded_few() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            fsync: FsyncPolicy::Always,
            // 37-byte entries: one entry per segment.
            segment_size_max: 40,
            write_mode: crate::log::WriteMode::Buffered,
        };
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), config.clone())
                .await
                .unwrap();
            let mut stored = Vec::new();
            for seed in 0..10u8 {
                let entry = crate::entry::build_entry(0, 1, &[seed; 5]);
                let offset = log.append(entry.clone()).await.unwrap();
                let mut entry = entry;
                entry[0..8].copy_from_slice(&offset.to_le_bytes());
                stored.push(entry);
            }
            assert_eq!(log.shared.state.borrow().segment_count(), 10);
            // The active segment's file, and the one closed last (moved there by the roll).
            assert_eq!(open_files(&log), (1, vec![8]));
            for offset in 0..10u64 {
                assert_eq!(
                    log.read(offset, 1, usize::MAX).await.unwrap(),
                    stored[offset as usize]
                );
                let (active_count, closed) = open_files(&log);
                assert_eq!(active_count, 1);
                assert_eq!(closed.len(), CLOSED_SEGMENT_FILES_OPEN_MAX);
                // The active segment (9) is read through its own file.
                let expected_closed = if offset == 9 { 8 } else { offset };
                assert_eq!(closed, vec![expected_closed]);
            }
            // One read across every segment opens each closed one in turn, keeping the bound.
            assert_eq!(
                log.read(0, u32::MAX, usize::MAX).await.unwrap(),
                stored.concat()
            );
            assert_eq!(open_files(&log), (1, vec![8]));
            log.close().await.unwrap();
            drop(log);

            // Reopened: only the active segment is open; recovery kept no closed file.
            let (log, report) = PartitionLog::open(dir.path(), config).await.unwrap();
            assert_eq!((report.segment_count, report.next_offset), (10, 10));
            assert_eq!(open_files(&log), (1, Vec::new()));
            assert_eq!(log.read(3, 1, usize::MAX).await.unwrap(), stored[3]);
            assert_eq!(open_files(&log), (1, vec![3]));
        });
    }

    #[test]
    fn issue7_adv2_concurrent_reads_of_closed_segments_hold_at_most_the_budgeted_files() {
        let dir = tempfile::tempdir().unwrap();
        let config = LogConfig {
            fsync: FsyncPolicy::Never,
            // 37-byte entries: one entry per segment.
            segment_size_max: 40,
            write_mode: crate::log::WriteMode::Buffered,
        };
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), config).await.unwrap();
            let mut stored = Vec::new();
            for seed in 0..24u8 {
                let entry = crate::entry::build_entry(0, 1, &[seed; 5]);
                let offset = log.append(entry.clone()).await.unwrap();
                let mut entry = entry;
                entry[0..8].copy_from_slice(&offset.to_le_bytes());
                stored.push(entry);
            }
            // 23 reads at once, each of a different closed segment, three times over: each
            // waits for the slot rather than opening its own file, and each returns its entry.
            let reads = (0..69u64).map(|index| {
                let log = &log;
                async move { (index % 23, log.read(index % 23, 1, usize::MAX).await) }
            });
            for (offset, read) in futures_util::future::join_all(reads).await {
                assert_eq!(read.unwrap(), stored[offset as usize]);
            }
            let state = log.shared.state.borrow();
            assert_eq!(
                state.closed_files.slots().peak(),
                CLOSED_SEGMENT_FILES_OPEN_MAX
            );
            assert_eq!(
                state.closed_files.files.len(),
                CLOSED_SEGMENT_FILES_OPEN_MAX
            );
        });
    }

    #[test]
    fn check_entry_rejects_malformed_headers() {
        let good = crate::entry::build_entry(0, 2, b"hello");
        assert_eq!(check_entry(&good).unwrap().message_count, 2);
        let message = |entry: &[u8]| check_entry(entry).unwrap_err().to_string();
        assert_eq!(
            message(&good[..20]),
            "invalid entry: 20 bytes is shorter than the 32-byte header"
        );
        assert_eq!(
            message(&good[..36]),
            "invalid entry: header length 69 does not match the 4 payload bytes"
        );
        let zero_count = crate::entry::build_entry(0, 0, b"hello");
        assert_eq!(message(&zero_count), "invalid entry: message_count is 0");
        let miscounted =
            crate::entry::build_entry_raw(0, 3, &crate::entry::message_section(1, b"x"));
        assert_eq!(
            message(&miscounted),
            "invalid entry: header declares 3 messages but the payload holds 1"
        );
    }
}
