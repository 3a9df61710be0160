//! Every bound of `shardline bench`: worker counts, retry budgets, timeouts, histogram range.
//!
//! Must never hold a value without the reason it has that value.

use std::time::Duration;

/// Most producer threads (each one OS thread, one compio runtime, one connection). The message id
/// packs the producer index into its top 24 bits, and past a thousand client threads the bench
/// measures its own scheduling rather than the server.
pub const PRODUCER_COUNT_MAX: u32 = 1024;

/// Most consumer threads, for the same reason as [`PRODUCER_COUNT_MAX`].
pub const CONSUMER_COUNT_MAX: u32 = 1024;

/// Most rounds of `--workload metadata`. Each round is three durable metadata commits (a few
/// milliseconds each on a real disk), so 100 000 rounds is already most of an hour; a larger value
/// is a typo more often than a plan.
pub const METADATA_OP_COUNT_MAX: u32 = 100_000;

/// Bytes of one disk-baseline write of `--workload metadata`: one 4 KiB page, the unit the
/// issue's target names ("one 4 KiB write+fdatasync").
pub const BASELINE_WRITE_BYTES: usize = 4096;

/// The metadata workload's target: p99 of a metadata commit within this many times the p99 of
/// one baseline write + fdatasync (issue 3, "Targets").
pub const METADATA_P99_RATIO_TARGET: f64 = 3.0;

/// Bits of a message id below the producer index: the per-producer sequence. 2^40 messages per
/// producer is far beyond any run, and leaves 24 bits for the index.
pub const MESSAGE_SEQUENCE_BITS: u32 = 40;

const _: () = assert!(PRODUCER_COUNT_MAX <= 1 << (64 - MESSAGE_SEQUENCE_BITS));

/// Most messages of one run (`--messages`, 1..=10^10). A run keeps every acknowledged batch's
/// range in memory for the read-back and writes every message to disk: 10^10 messages of even
/// 100 bytes is over a terabyte, past any bench disk; a larger value is a typo more often than a
/// plan. The free-space check (`disk_space`) then bounds what actually fits.
pub const MESSAGE_COUNT_MAX: u64 = 10_000_000_000;

/// Bytes the free-space check (`disk_space`) allows for the embedded server's own files besides
/// the partition logs: the metadata journal (one segment of at most 64 MiB,
/// `storage::limits::JOURNAL_SEGMENT_SIZE_MAX`, in practice kilobytes for a bench), the superblock,
/// consumer offsets and `server.log`. One journal segment's worth bounds them all.
pub const SERVER_FIXED_FILES_BYTES_MAX: u64 = 64 << 20;

/// How long the embedded server may take to print its `listening on` line (recovery of an empty
/// data directory takes milliseconds; 30 s covers a slow CI host creating rings).
pub const SERVER_READY_TIMEOUT: Duration = Duration::from_secs(30);

/// How long the embedded server may take to exit after SIGTERM: it flushes and fsyncs every
/// partition, which on a slow disk after a `--fsync never` run is seconds of writeback.
pub const SERVER_STOP_TIMEOUT: Duration = Duration::from_mins(1);

/// Lines of the server's stderr log quoted in an error when it fails to start or stop.
pub const SERVER_LOG_TAIL_LINES: usize = 20;

/// Period of the /proc CPU sampler. `io_uring` workers live for seconds at most, so sampling every
/// 100 ms sees most of them; what it misses is still counted (see `cpu.rs`).
pub const CPU_SAMPLE_INTERVAL: Duration = Duration::from_millis(100);

/// Retries of one batch answered `Busy` (or another retryable error) before the run fails.
/// With the backoff below this is about ten seconds of a shard refusing work.
pub const BUSY_RETRY_COUNT_MAX: u32 = 1000;

/// First backoff after a retryable error; doubles per consecutive retry up to the cap.
pub const BUSY_BACKOFF_INITIAL: Duration = Duration::from_micros(100);

/// Backoff cap: a full inbox drains within one 10 ms shard tick.
pub const BUSY_BACKOFF_MAX: Duration = Duration::from_millis(10);

/// Polls in a row that return nothing new below the acknowledged end, after every producer has
/// finished, before the consumer declares the rest of that partition missing.
pub const STALLED_POLL_COUNT_MAX: u32 = 200;

/// Sleep of a consumer whose partitions had nothing new in one round (concurrent mode, or
/// stalled polls): short enough not to distort read latency, long enough not to spin a core.
pub const CONSUMER_IDLE_SLEEP: Duration = Duration::from_millis(1);

/// Polls in a row whose reply fails to parse (corrupt batch) before the consumer gives up on the
/// partition and counts the rest as missing.
pub const UNREADABLE_POLL_COUNT_MAX: u32 = 3;

/// Highest latency the histograms hold, µs (60 s); longer round trips saturate at this value.
pub const LATENCY_US_MAX: u64 = 60_000_000;

/// Significant decimal digits of the latency histograms (0.1 % relative error).
pub const LATENCY_SIGNIFICANT_DIGITS: u8 = 3;

/// Most runs of each shard count (`--repeat`). Three to five repeats show the spread a median
/// needs; a hundred runs of a one-minute bench is already most of a working day, so a larger
/// value is a typo more often than a plan.
pub const REPEAT_COUNT_MAX: u32 = 100;

/// Longest `--duration` of one run. A run keeps every acknowledged batch's range in memory for
/// the read-back, and a day of producing is a soak test, not a bench.
pub const RUN_DURATION_MAX: Duration = Duration::from_hours(24);

/// Payload bytes a run must produce before its report carries a page-cache note (first run of
/// the sequence or a later one; README, Benchmarking). 256 MiB is 65 536 pages of 4 KiB; at
/// microseconds per first-touch fault on a VM whose host backs guest memory lazily, that is on
/// the order of a few hundred milliseconds, as long as the default 1 GB run itself. A chosen
/// bound, not measured per host: smaller runs are short enough for other noise to dominate.
pub const PAGE_CACHE_NOTE_BYTES_MIN: u64 = 256 << 20;
