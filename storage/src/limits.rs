//! Every bound of the storage crate, each with why it has its value and the memory it implies.
//! Nothing here may be changed without checking the relations asserted at the bottom.

use crate::entry::ENTRY_HEADER_SIZE;

/// Default segment size before rolling to a new segment file (bytes).
pub const SEGMENT_SIZE_MAX_DEFAULT: u64 = 1 << 30;
/// Largest `segment_size_max` a log accepts (bytes). Bounds a closed segment's index file: at most
/// one 16-byte row per 32-byte entry, so an index is at most half a segment and fits
/// [`DURABLE_FILE_SIZE_MAX`].
pub const SEGMENT_SIZE_MAX_LIMIT: u64 = 1 << 30;
/// Longest `FsyncPolicy::Interval` (milliseconds): one hour. Beyond it the policy is `never` in
/// all but name, and a mistyped huge value (`interval=18446744073709551615`) would silently be
/// that; `--fsync never` says so plainly.
pub const FSYNC_INTERVAL_MS_MAX: u64 = 3_600_000;
/// Largest single entry (bytes, header included); equals the default max message size.
pub const ENTRY_SIZE_MAX: u32 = 64 * 1024 * 1024;
/// Largest reply of one read (bytes), bounding poll memory.
pub const READ_BYTES_MAX_DEFAULT: usize = 8 * 1024 * 1024;
/// Largest file `read_verified` loads (bytes, trailer included). The size comes from the disk, so it
/// is checked before allocating; the largest legitimate file is a full segment's index.
pub const DURABLE_FILE_SIZE_MAX: u64 = 1 << 30;
/// Largest buffer hashed (XXH3-64) on the calling thread by a durable replace or a snapshot read;
/// anything larger is hashed on compio's blocking pool so a shard's reactor never does O(size) work
/// for a big file. XXH3-64 runs at roughly 10-30 GB/s, so 1 MiB is at most ~100 us of reactor time,
/// the same order as handing the work to a pool thread and back; a 64 MiB snapshot hashed inline
/// would stall every connection of shard 0 for several milliseconds.
pub const HASH_INLINE_BYTES_MAX: usize = 1 << 20;
/// Bytes read per I/O while scanning a segment on open. One buffer of this size (grown to one
/// whole entry when an entry is larger) lives for the duration of a scan.
pub const SCAN_CHUNK_BYTES: usize = 1 << 20;
/// Budget of the resync search after damage in the last segment, per byte after the damage: the
/// search may charge at most `RESYNC_CHARGED_BYTES_PER_TAIL_BYTE * (bytes after the damage)`
/// payload bytes (each candidate whose header passes the rules is charged 32 bytes per message
/// header its framing walk reads, and the rest of its payload once framed, before it is hashed:
/// `verify::ResyncCandidate`; a candidate fits in the bytes after the damage, so no additive term
/// is needed), then stops, and open quarantines the tail (the
/// conservative verdict: the bytes are kept). An honest segment needs about 1x: garbage inside
/// the damaged entry rarely passes the header rules with their offset and message-count bounds
/// (`verify::resync_entry_header`), and the first valid entry found is followed
/// back to back to the end, each byte hashed once; 3x leaves room for a couple of false
/// candidates as long as the tail. A crafted payload (a chain of fake headers whose lengths step
/// to the end) would otherwise cost quadratic time (4 MiB took 48 s, a 64 MiB message hours);
/// with the budget the worst case is 3 GiB hashed (and at most 3 GiB / 32 message headers
/// walked) for a full 1 GiB segment: seconds of boot, once per damage.
pub const RESYNC_CHARGED_BYTES_PER_TAIL_BYTE: u64 = 3;
/// Entries per vectored write: Linux rejects more than `IOV_MAX` (1024) iovecs in one
/// `pwritev`/`IORING_OP_WRITEV`. A larger group is written with several writes and one fsync.
pub const WRITE_IOVEC_COUNT_MAX: usize = 1024;
/// Alignment of every `O_DIRECT` write of a log in direct write mode (`WriteMode::Direct`,
/// `storage/FORMAT.md` section 3, "Write modes"): buffer address, file position and length are
/// multiples of it. 4096 is the logical block size of every common disk and page-cache page size
/// (a 512-byte device accepts it too); a filesystem that refuses it answers `EINVAL` and the log
/// falls back to buffered writes. It is also the padding bound recovery accepts: a direct write
/// leaves less than one unit of zeros past the logical end of the active segment.
pub const DIRECT_WRITE_ALIGNMENT_BYTES: usize = 4096;
/// Entry bytes one direct write stages at most before the batch is cut (direct mode only; an
/// entry larger than this is staged alone). Bounds a staging buffer to this plus two alignment
/// units in the common case, as [`WRITE_IOVEC_COUNT_MAX`] bounds a buffered write's iovecs.
pub const DIRECT_STAGING_BYTES_MAX: usize = 4 * 1024 * 1024;
/// Staging buffers a shard keeps for reuse between direct writes (a thread-local free list: one
/// shard runs the writers of many logs, each with at most one write in flight). Bounded so that
/// thousands of partitions cost at most this many buffers per shard, not one each.
pub const STAGING_BUFFERS_KEPT_MAX: usize = 4;
/// Largest staging buffer the free list keeps (bytes); a larger one (a batch holding an entry
/// above [`DIRECT_STAGING_BYTES_MAX`]) is freed after its write. With
/// [`STAGING_BUFFERS_KEPT_MAX`]: at most 4 x 4 MiB + 8 KiB, about 16 MiB per shard.
pub const STAGING_BUFFER_KEPT_BYTES_MAX: usize =
    DIRECT_STAGING_BYTES_MAX + 2 * DIRECT_WRITE_ALIGNMENT_BYTES;
/// Appends queued for the writer of one log before `append` answers `QueueFull`. Each queued entry
/// holds its own buffer, so this with [`APPEND_QUEUE_BYTES_MAX`] bounds a log's queued memory.
pub const APPEND_QUEUE_ENTRY_COUNT_MAX: usize = 16 * 1024;
/// Bytes queued for the writer of one log before `append` answers `QueueFull`: four maximal
/// entries, enough to keep a disk busy while bounding memory per partition.
pub const APPEND_QUEUE_BYTES_MAX: usize = 4 * ENTRY_SIZE_MAX as usize;

/// Batches remembered per idempotent producer in one log's producer state (`log/producer_state.rs`)
/// and its snapshots: the owner shard's window (`shards` `PRODUCER_WINDOW_BATCH_COUNT`, the 5 of
/// Kafka's `max.in.flight.requests.per.connection` with idempotence) must not be larger, or a
/// restart would forget batches the running server answered resends of.
pub const PRODUCER_WINDOW_BATCH_COUNT: usize = 5;
/// Producers one log's producer state holds; one more evicts the least recently appended (its
/// next batch after a restart is then taken as a first batch). Equal to the owner shard's table
/// (`shards` `PRODUCER_STATE_COUNT_MAX` producer-partition pairs per shard), so a partition never
/// forgets across a restart a producer its shard could still hold. About 250 bytes per producer
/// (window, map and order entries): 8 MiB per log at most, reached only with that many producers;
/// a snapshot file is at most 32 + 32 Ki x (16 + 5 x 24) bytes, about 4.3 MiB.
pub const PRODUCER_STATE_COUNT_MAX: usize = 32 * 1024;

/// Stamped batches that opening a log reports (`RecoveryReport::producer_batches`): the whole
/// producer state, 160 Ki x 32 bytes = 5 MiB per log at most, held while the owner shard folds
/// them into its producer table.
pub const RECOVERED_PRODUCER_BATCH_COUNT_MAX: usize =
    PRODUCER_STATE_COUNT_MAX * PRODUCER_WINDOW_BATCH_COUNT;

/// Bytes at the end of the segment before the last one that opening a log reads for producer
/// stamps when no producer-state snapshot it tries is usable (the last fallback, see
/// [`PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX`];
/// whole entries starting in this range, or the last entry alone if it is larger). One read per
/// log at open, only then; small next to the scan of the whole last segment.
pub const RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES: u64 = 1 << 20;

/// Closed segments whose producer-state snapshots opening a log tries, newest first, when the
/// active segment's snapshot is missing or damaged: the state is that snapshot plus the stamps of
/// every segment from it to the active one (each closed one read whole, in [`SCAN_CHUNK_BYTES`]
/// reads). A roll keeps the snapshots of the active segment and the one before (the first
/// segment's state is empty and needs none), so two covers what is on disk and bounds the extra
/// reading to two closed segments; only when none of them is usable does open fall back to
/// [`RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES`] of stamps.
pub const PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX: usize = 2;

/// Files of closed segments one log holds open at once, kept for the next read or held by reads
/// in flight, together (`log/closed_files.rs`). A closed segment holds no descriptor otherwise: a
/// read of one not kept open takes a free slot (closing kept files no read holds to make one),
/// opens it (one `openat`) and keeps it; when reads in flight hold every slot it waits for one
/// to complete instead of opening another file. On a roll the segment just closed takes the
/// place, since readers catching up read it next (or is closed, when reads hold every slot). One
/// is what a consumer reading forward needs; more would multiply the server's descriptors per
/// partition, which its budget counts (`shards::limits::FDS_PER_PARTITION`). The one exception
/// is transient: a read of the active segment holds that file until it completes, so right after
/// a roll the old active file may stay open for one read beyond the slot.
pub const CLOSED_SEGMENT_FILES_OPEN_MAX: usize = 1;

/// Segment mappings one log keeps for reads (`log/mapped.rs`, issue 12 item 2): the active
/// segment and the sealed ones consumers are catching up through. A segment is mapped once, at
/// `max(segment_size_max, ENTRY_SIZE_MAX)` bytes (or its size, when larger), so that reads verify
/// and hand out its bytes without a map/unmap per read (measured: a mapping per read costs as
/// much CPU as the copy it replaces, in page faults and unmaps). A mapping holds no descriptor;
/// this bounds address space (at most 4 x `SEGMENT_SIZE_MAX_LIMIT` = 4 GiB per log, of which
/// only pages read get page-table entries) and `vm.max_map_count` entries. Retention unmaps the
/// segments it deletes; a reply in flight keeps its own reference until it is sent.
pub const MAPPED_SEGMENTS_PER_LOG_MAX: usize = 4;
/// Segment mappings the whole process may hold at once, over every log (issue 12 item 2, found
/// by review): each takes one of the process's `vm.max_map_count` memory-map entries (65,530 by
/// default), which thread stacks, the allocator and libraries need too; at that limit mmap,
/// thread creation and large allocations all fail. A read that finds the bound reached reads with
/// a copy instead. A quarter of the default limit: 4,096 partitions read at once, 4 segments each.
pub const MAPPED_SEGMENTS_PROCESS_MAX: usize = 16_384;

/// Names tried for the quarantine file of one damaged position (`X.log.damaged-at-P`, then
/// `.1`, `.2`, ...): an existing one is never overwritten. A second copy exists only when a crash
/// came between writing a quarantine file and truncating the segment, so a few suffice; when all
/// are taken open refuses (naming the files) rather than drop the bytes.
pub const QUARANTINE_FILE_NAME_ATTEMPT_COUNT_MAX: u32 = 16;

const _: () = assert!(ENTRY_SIZE_MAX as usize > ENTRY_HEADER_SIZE);
// A single maximal entry must always be accepted by an empty queue.
const _: () = assert!(APPEND_QUEUE_BYTES_MAX >= ENTRY_SIZE_MAX as usize);
// A segment holds at most max(segment_size_max, one entry) bytes; its index (48-byte header, one
// 16-byte row per >= 32-byte entry, 8-byte trailer) must fit what read_verified accepts.
const _: () = assert!(SEGMENT_SIZE_MAX_LIMIT >= ENTRY_SIZE_MAX as u64);
const _: () = assert!(SEGMENT_SIZE_MAX_LIMIT / 2 + 48 + 8 <= DURABLE_FILE_SIZE_MAX);
const _: () = assert!(SEGMENT_SIZE_MAX_DEFAULT <= SEGMENT_SIZE_MAX_LIMIT);
const _: () = assert!(SCAN_CHUNK_BYTES >= ENTRY_HEADER_SIZE);
const _: () =
    assert!(DIRECT_WRITE_ALIGNMENT_BYTES.is_power_of_two() && DIRECT_WRITE_ALIGNMENT_BYTES >= 512);
const _: () = assert!(DIRECT_STAGING_BYTES_MAX.is_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES));
const _: () = assert!(HASH_INLINE_BYTES_MAX as u64 <= DURABLE_FILE_SIZE_MAX);

/// Largest snapshot file (bytes: 64-byte header, payload, 8-byte trailer) that `write_snapshot`
/// writes and `read_snapshot` loads; the size comes from the disk, so it is checked before
/// allocating. The payload (metadata and client table) is far smaller; the bound is what
/// `read_verified` accepts for any durably replaced file.
pub const SNAPSHOT_FILE_SIZE_MAX: u64 = DURABLE_FILE_SIZE_MAX;

/// Bytes of one superblock copy: one 4 KiB page, the sector size of common SSDs and the alignment
/// `O_DIRECT` needs, so each copy is written as whole sectors and a torn write damages at most the
/// copy being written. The 128-byte header is zero-padded to this size.
pub const SUPERBLOCK_COPY_SIZE: usize = 4096;
/// Redundant superblock copies. At least two are needed so a torn write always leaves one valid
/// copy; four (TigerBeetle's default) also survive a damaged sector in a second copy, for 16 KiB.
pub const SUPERBLOCK_COPY_COUNT: usize = 4;
/// Bytes of the superblock file: every copy, back to back. Open reads this much into memory.
pub const SUPERBLOCK_FILE_SIZE: usize = SUPERBLOCK_COPY_SIZE * SUPERBLOCK_COPY_COUNT;

const _: () = assert!(SUPERBLOCK_COPY_COUNT >= 2);
const _: () = assert!(SUPERBLOCK_COPY_SIZE.is_multiple_of(4096));

/// Largest body of one metadata journal record (bytes): a serialized metadata prepare (create a
/// topic, register a client) is small; 1 MiB bounds what one append writes and what a torn tail
/// can be, and the tail search on open scans at most one record's bytes.
pub const JOURNAL_BODY_SIZE_MAX: u32 = 1 << 20;
/// Largest journal record: 64-byte header + the largest body (bytes).
pub const JOURNAL_RECORD_SIZE_MAX: usize =
    crate::journal::JOURNAL_HEADER_SIZE + JOURNAL_BODY_SIZE_MAX as usize;
/// Default and largest `segment_size_max` of the metadata journal (bytes). Open reads one whole
/// segment into memory at a time (checked against this before allocating), so this bounds the
/// transient memory of recovery besides the replayed prepares themselves; 64 MiB holds at least
/// 63 maximal records and many thousands of typical ones.
pub const JOURNAL_SEGMENT_SIZE_MAX: u64 = 64 * 1024 * 1024;

// A maximal record must fit a segment of the largest size, so a segment file is never larger
// than JOURNAL_SEGMENT_SIZE_MAX (a record larger than a configured size gets its own segment).
const _: () = assert!(JOURNAL_RECORD_SIZE_MAX as u64 <= JOURNAL_SEGMENT_SIZE_MAX);
const _: () = assert!(JOURNAL_BODY_SIZE_MAX as u64 <= u32::MAX as u64);

/// Bytes of sealed-segment index rows one log keeps in memory (`log/sealed.rs`, issue 11 section
/// 4: memory must not grow with retained data). Only the active segment's index is always held;
/// a sealed segment's index is read from its file when a read needs it and kept in a
/// least-recently-used cache of at most this many row bytes and
/// [`SEALED_INDEX_CACHE_COUNT_MAX`] indexes, except that the index used last is always kept, so
/// a consumer reading forward through a segment whose index alone exceeds this does not reread
/// it per poll. The bound per log is therefore `max(1 MiB, one index)`; one index holds 16 bytes
/// per entry of at least 64 bytes (header and one message header), at most
/// `segment_size_max / 4` bytes (about 40 KiB per 64 MiB segment of 25 KiB batches). 1 MiB holds
/// the whole index of a 1 GiB segment of batches of 16 KiB or more.
pub const SEALED_INDEX_CACHE_BYTES_MAX: usize = 1 << 20;

/// Sealed-segment indexes one log keeps in memory at once (see
/// [`SEALED_INDEX_CACHE_BYTES_MAX`]): the one a consumer reads, the one just sealed by a roll
/// (readers catching up read it next), and two more for consumers at other positions.
pub const SEALED_INDEX_CACHE_COUNT_MAX: usize = 4;

const _: () = assert!(SEALED_INDEX_CACHE_COUNT_MAX >= 1);

/// Consumers (and groups) whose offsets one partition keeps (issue 11 section 1). Each costs at
/// most one record of [`OFFSET_RECORD_SIZE_MAX`] bytes on disk after compaction and about as much
/// in memory, so 4096 bound a partition's offsets to about 1.1 MiB either way; more consumers on
/// one partition is a naming bug (a fresh name per run), refused with
/// `OffsetsError::TooManyConsumers` rather than grown without bound.
pub const CONSUMERS_PER_PARTITION_MAX: usize = 4096;
/// Longest consumer or group name in an offsets record (bytes), as `bus::limits::NAME_LEN_MAX`.
pub const CONSUMER_NAME_LEN_MAX: usize = 255;
/// Largest offsets record: 24-byte header + the longest name (bytes).
pub const OFFSET_RECORD_SIZE_MAX: usize =
    crate::offsets::OFFSET_RECORD_HEADER_SIZE + CONSUMER_NAME_LEN_MAX;
/// An offsets file is compacted (rewritten with one record per consumer) before an append that
/// would make it larger than this or twice its live records, whichever is larger (bytes). 64 KiB
/// is about 1,700 stores of one consumer between compactions, so compaction (two fsyncs and a
/// rename) costs well under 1% of the stores even under `--fsync always`.
pub const OFFSETS_COMPACT_BYTES_MIN: u64 = 64 * 1024;
/// Largest offsets file this version writes (bytes): the header, then at most twice the live
/// records of the most consumers (compaction runs before an append past that) or the minimal
/// compaction bound. Open refuses a larger file as corrupt before reading it.
pub const OFFSETS_FILE_SIZE_MAX: u64 = crate::offsets::OFFSETS_FILE_HEADER_SIZE as u64
    + OFFSETS_COMPACT_BYTES_MIN
    + 2 * (CONSUMERS_PER_PARTITION_MAX * OFFSET_RECORD_SIZE_MAX) as u64;

const _: () = assert!(CONSUMER_NAME_LEN_MAX <= u16::MAX as usize);
const _: () = assert!(OFFSET_RECORD_SIZE_MAX as u64 <= OFFSETS_COMPACT_BYTES_MIN);
