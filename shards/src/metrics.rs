//! Server metrics (issue 10 section 1): counters live on the shard that counts them (`Cell`s, no
//! shared atomics on the hot path) and are gathered per scrape. A scrape asks every shard over its
//! own bounded metrics lane; each shard answers with a [`ShardMetricsSnapshot`] built on its own
//! thread, between two events of its loop, so gathering never touches another thread's state.
//!
//! The exposition (Prometheus text format, the HTTP listener) is the binary's business
//! (`tools/src/metrics/`); this module only defines what a shard reports and how it is asked.

use std::cell::Cell;
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

/// Requests one shard's metrics lane holds at once; a scrape that finds it full reports that
/// shard as not answering instead of waiting.
pub const METRICS_LANE_CAPACITY: usize = 4;

/// How long a scrape waits for every shard's snapshot before it reports the missing ones.
pub const GATHER_TIMEOUT_DEFAULT: Duration = Duration::from_secs(2);

/// Fixed-bucket histogram of seconds, counted on one shard (`Cell`s: not `Sync`).
///
/// `bounds` are the inclusive upper bounds of the buckets, ascending, in the histogram's unit
/// (seconds for latencies, a plain count for batch sizes); values above the last bound count only
/// in `+Inf`.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [f64],
    /// One count per bound, plus the `+Inf` bucket last; not cumulative.
    counts: Box<[Cell<u64>]>,
    sum: Cell<f64>,
}

/// Bucket bounds for latencies in seconds: 50 µs to 10 s.
pub const LATENCY_BOUNDS_SECONDS: &[f64] = &[
    0.000_05, 0.000_1, 0.000_25, 0.000_5, 0.001, 0.002_5, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
    1.0, 2.5, 10.0,
];

/// Bucket bounds for group-commit batch sizes (appends covered by one fsync).
pub const BATCH_SIZE_BOUNDS: &[f64] = &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 1024.0];

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds).
    ///
    /// # Panics
    /// If `bounds` is not strictly ascending.
    pub fn new(bounds: &'static [f64]) -> Histogram {
        assert!(
            bounds.windows(2).all(|pair| pair[0] < pair[1]),
            "histogram bounds must ascend"
        );
        Histogram {
            bounds,
            counts: (0..=bounds.len()).map(|_| Cell::new(0)).collect(),
            sum: Cell::new(0.0),
        }
    }

    /// Counts one observation of `value` (same unit as the bounds).
    pub fn observe(&self, value: f64) {
        let index = self.bounds.partition_point(|bound| *bound < value);
        let cell = &self.counts[index];
        cell.set(cell.get() + 1);
        self.sum.set(self.sum.get() + value);
    }

    /// Counts one duration, in seconds.
    pub fn observe_duration(&self, elapsed: Duration) {
        self.observe(elapsed.as_secs_f64());
    }

    /// The buckets as Prometheus wants them: cumulative counts per upper bound.
    pub fn snapshot(&self) -> HistogramSnapshot {
        let mut cumulative = 0;
        let mut buckets = Vec::with_capacity(self.bounds.len());
        for (bound, count) in self.bounds.iter().zip(self.counts.iter()) {
            cumulative += count.get();
            buckets.push((*bound, cumulative));
        }
        let count = cumulative + self.counts[self.bounds.len()].get();
        HistogramSnapshot {
            buckets,
            sum: self.sum.get(),
            count,
        }
    }
}

/// A histogram as gathered: `buckets` are `(upper bound, cumulative count)` ascending, without
/// `+Inf` (whose count is `count`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct HistogramSnapshot {
    pub buckets: Vec<(f64, u64)>,
    pub sum: f64,
    pub count: u64,
}

/// Requests answered by this shard, by operation and result.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestCount {
    /// The operation in snake case (`send_messages`, `poll_messages`, `create_topic`, ...), or
    /// `unknown` for a frame whose operation is not known.
    pub operation: &'static str,
    /// `ok`, or the error code in snake case (`busy`, `invalid_batch`, `not_primary`, ...).
    pub result: &'static str,
    pub count: u64,
}

/// Operation label of each request-table row: index = the wire operation number (0 and unknown
/// numbers count as `unknown`).
const OPERATION_LABELS: [&str; 18] = [
    "unknown",
    "ping",
    "create_stream",
    "delete_stream",
    "create_topic",
    "delete_topic",
    "get_metadata",
    "send_messages",
    "poll_messages",
    "register",
    "store_offset",
    "get_offset",
    "create_group",
    "delete_group",
    "join_group",
    "leave_group",
    "group_heartbeat",
    "alter_topic",
];

/// Result label of each request-table column: index = the reply's wire error code (0 = `ok`),
/// the last column for a code this table does not know.
const RESULT_LABELS: [&str; 25] = [
    "ok",
    "busy",
    "stream_not_found",
    "stream_already_exists",
    "topic_not_found",
    "topic_already_exists",
    "partition_not_found",
    "invalid_batch",
    "invalid_argument",
    "shutting_down",
    "storage_failure",
    "internal",
    "session_evicted",
    "request_stale",
    "storage_full",
    "offset_out_of_range",
    "message_too_large",
    "sequence_gap",
    "resource_exhausted",
    "not_primary",
    "group_not_found",
    "group_already_exists",
    "not_group_member",
    "partition_not_assigned",
    "unknown",
];

const OPERATION_COUNT: usize = OPERATION_LABELS.len();
const RESULT_COUNT: usize = RESULT_LABELS.len();
const _: () = assert!(OPERATION_COUNT == bus::Operation::ALL.len() + 1);
const _: () = assert!(RESULT_COUNT == bus::ErrorCode::ALL.len() + 2);

/// Requests answered by one shard, by operation x result: a fixed table of `Cell`s indexed by
/// the wire numbers, so counting a request is two bounds checks and an add (no allocation, no
/// hashing).
#[derive(Debug)]
pub struct RequestCounts {
    counts: [[Cell<u64>; RESULT_COUNT]; OPERATION_COUNT],
}

impl Default for RequestCounts {
    fn default() -> RequestCounts {
        RequestCounts {
            counts: std::array::from_fn(|_| std::array::from_fn(|_| Cell::new(0))),
        }
    }
}

impl RequestCounts {
    /// Counts one reply to a request of wire operation `operation` with wire `error_code` (0 =
    /// success). Numbers outside the tables count as `unknown`.
    pub fn record(&self, operation: u8, error_code: u32) {
        let row = usize::from(operation);
        let row = if row < OPERATION_COUNT { row } else { 0 };
        let column = usize::try_from(error_code)
            .ok()
            .filter(|column| *column < RESULT_COUNT - 1)
            .unwrap_or(RESULT_COUNT - 1);
        let cell = &self.counts[row][column];
        cell.set(cell.get() + 1);
    }

    /// The nonzero counts, by operation then result, in table order.
    pub fn snapshot(&self) -> Vec<RequestCount> {
        let mut nonzero = Vec::new();
        for (operation, row) in OPERATION_LABELS.iter().zip(&self.counts) {
            for (result, cell) in RESULT_LABELS.iter().zip(row) {
                if cell.get() > 0 {
                    nonzero.push(RequestCount {
                        operation,
                        result,
                        count: cell.get(),
                    });
                }
            }
        }
        nonzero
    }
}

/// Adds `amount` to a `Cell` counter.
fn add(cell: &Cell<u64>, amount: u64) {
    cell.set(cell.get() + amount);
}

/// The counters one shard keeps (issue 10 section 1): owned by the shard (`Rc`, `Cell`s: never
/// touched by another thread), read by [`crate::shard::Shard::metrics_snapshot`] on the shard's
/// thread. Every partition log of the shard reports its fsyncs here (`storage::log::LogStats`),
/// so the counts outlive a deleted partition.
#[derive(Debug)]
pub struct ShardMetrics {
    messages_appended: Cell<u64>,
    bytes_appended: Cell<u64>,
    messages_read: Cell<u64>,
    bytes_read: Cell<u64>,
    requests: RequestCounts,
    busy_replies: Cell<u64>,
    mesh_frames_sent: Cell<u64>,
    mesh_inbox_full: Cell<u64>,
    connections_refused: Cell<u64>,
    fsyncs: Cell<u64>,
    group_commit_batch_size: Histogram,
    fsync_latency_seconds: Histogram,
}

impl Default for ShardMetrics {
    fn default() -> ShardMetrics {
        ShardMetrics {
            messages_appended: Cell::new(0),
            bytes_appended: Cell::new(0),
            messages_read: Cell::new(0),
            bytes_read: Cell::new(0),
            requests: RequestCounts::default(),
            busy_replies: Cell::new(0),
            mesh_frames_sent: Cell::new(0),
            mesh_inbox_full: Cell::new(0),
            connections_refused: Cell::new(0),
            fsyncs: Cell::new(0),
            group_commit_batch_size: Histogram::new(BATCH_SIZE_BOUNDS),
            fsync_latency_seconds: Histogram::new(LATENCY_BOUNDS_SECONDS),
        }
    }
}

impl ShardMetrics {
    /// A batch of `message_count` messages, `byte_count` bytes (batch header included, as
    /// stored), was appended to a partition this shard owns and acknowledged.
    pub fn appended(&self, message_count: u32, byte_count: usize) {
        add(&self.messages_appended, u64::from(message_count));
        add(&self.bytes_appended, byte_count as u64);
    }

    /// A poll of a partition this shard owns returned `message_count` messages in `byte_count`
    /// bytes of batches.
    pub fn read(&self, message_count: u32, byte_count: usize) {
        add(&self.messages_read, u64::from(message_count));
        add(&self.bytes_read, byte_count as u64);
    }

    /// This shard's connection answered a request of wire `operation` with wire `error_code`
    /// (0 = success); a `Busy` answer also counts in `busy_replies`.
    pub fn answered(&self, operation: u8, error_code: u32) {
        self.requests.record(operation, error_code);
        if error_code == bus::ErrorCode::Busy as u32 {
            add(&self.busy_replies, 1);
        }
    }

    /// A mesh send of this shard to another shard's inbox or reply lane: delivered (`true`), or
    /// refused because the lane was full (`false`).
    pub fn mesh_send(&self, delivered: bool) {
        if delivered {
            add(&self.mesh_frames_sent, 1);
        } else {
            add(&self.mesh_inbox_full, 1);
        }
    }

    /// A client connection was refused at accept (connection budget, or no descriptor left).
    pub fn connection_refused(&self) {
        add(&self.connections_refused, 1);
    }

    /// Fills the counter fields of `snapshot` (the gauges are the shard's to fill).
    pub fn fill(&self, snapshot: &mut ShardMetricsSnapshot) {
        snapshot.messages_appended = self.messages_appended.get();
        snapshot.bytes_appended = self.bytes_appended.get();
        snapshot.messages_read = self.messages_read.get();
        snapshot.bytes_read = self.bytes_read.get();
        snapshot.requests = self.requests.snapshot();
        snapshot.busy_replies = self.busy_replies.get();
        snapshot.mesh_frames_sent = self.mesh_frames_sent.get();
        snapshot.mesh_inbox_full = self.mesh_inbox_full.get();
        snapshot.connections_refused = self.connections_refused.get();
        snapshot.fsyncs = self.fsyncs.get();
        snapshot.group_commit_batch_size = self.group_commit_batch_size.snapshot();
        snapshot.fsync_latency_seconds = self.fsync_latency_seconds.snapshot();
    }
}

impl storage::log::LogStats for ShardMetrics {
    fn fsync_done(&self, append_count: u64, elapsed: Duration) {
        add(&self.fsyncs, 1);
        self.group_commit_batch_size.observe(append_count as f64);
        self.fsync_latency_seconds.observe_duration(elapsed);
    }
}

/// Shard 0's metadata counters (its `ShardMetrics` holds the data-plane ones).
#[derive(Debug)]
pub struct ReplicaMetrics {
    ops_committed: Cell<u64>,
    commit_latency_seconds: Histogram,
    checkpoints: Cell<u64>,
    checkpoint_duration_seconds: Histogram,
    /// The journal's size as last read (`Journal::size_bytes`), kept for a scrape that finds
    /// the journal locked by a write.
    journal_bytes: Cell<u64>,
}

impl Default for ReplicaMetrics {
    fn default() -> ReplicaMetrics {
        ReplicaMetrics {
            ops_committed: Cell::new(0),
            commit_latency_seconds: Histogram::new(LATENCY_BOUNDS_SECONDS),
            checkpoints: Cell::new(0),
            checkpoint_duration_seconds: Histogram::new(LATENCY_BOUNDS_SECONDS),
            journal_bytes: Cell::new(0),
        }
    }
}

impl ReplicaMetrics {
    /// The driver took one committed op to apply (every operation counts: a Register, and a
    /// change the state machine rejected, whose rejection is the committed reply).
    pub fn committed(&self) {
        add(&self.ops_committed, 1);
    }

    /// A client request that arrived on shard 0 `elapsed` ago was committed and answered.
    pub fn commit_latency(&self, elapsed: Duration) {
        self.commit_latency_seconds.observe_duration(elapsed);
    }

    /// A checkpoint became durable after `elapsed`.
    pub fn checkpointed(&self, elapsed: Duration) {
        add(&self.checkpoints, 1);
        self.checkpoint_duration_seconds.observe_duration(elapsed);
    }

    /// The journal's size as read now; `None` when it could not be read (locked by a write):
    /// the last value read stands.
    pub fn journal_bytes(&self, read_now: Option<u64>) -> u64 {
        if let Some(bytes) = read_now {
            self.journal_bytes.set(bytes);
        }
        self.journal_bytes.get()
    }

    /// Fills the counter fields of `snapshot` (the state fields are the shard's to fill).
    pub fn fill(&self, snapshot: &mut ReplicaMetricsSnapshot) {
        snapshot.ops_committed = self.ops_committed.get();
        snapshot.commit_latency_seconds = self.commit_latency_seconds.snapshot();
        snapshot.checkpoints = self.checkpoints.get();
        snapshot.checkpoint_duration_seconds = self.checkpoint_duration_seconds.snapshot();
    }
}

/// Everything one shard reports at a scrape. Counters are totals since the shard started; gauges
/// are values at the moment of the snapshot.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ShardMetricsSnapshot {
    pub shard: u16,
    /// Messages and bytes appended (acknowledged) to partition logs this shard owns; the bytes
    /// are the batches as stored (batch and message headers included).
    pub messages_appended: u64,
    pub bytes_appended: u64,
    /// Messages and bytes returned by polls of partitions this shard owns: the messages at or
    /// after each poll's offset (the reply's count), and the bytes of the whole batches served.
    pub messages_read: u64,
    pub bytes_read: u64,
    /// Client requests answered by this shard's connections (nonzero counts only).
    pub requests: Vec<RequestCount>,
    /// `Busy` answers this shard sent (a full inbox, a full queue).
    pub busy_replies: u64,
    /// Mesh frames this shard sent to other shards (requests and replies).
    pub mesh_frames_sent: u64,
    /// Mesh sends this shard attempted that found the target's inbox full.
    pub mesh_inbox_full: u64,
    /// Frames waiting in this shard's inbox (gauge).
    pub inbox_depth: u64,
    /// Frames waiting in this shard's reply lane (replies to requests it forwarded, metadata
    /// acks; gauge).
    pub reply_lane_depth: u64,
    /// Client connections open on this shard (gauge) and refused at accept (counter).
    pub connections_open: u64,
    pub connections_refused: u64,
    /// The connections this shard admits at once (its share of the open-file budget; gauge).
    pub connections_max: u64,
    /// Bytes of request bodies and poll replies held against the receive budget (gauge), and the
    /// budget.
    pub receive_budget_bytes_in_use: u64,
    pub receive_budget_bytes_max: u64,
    /// Partition log fsyncs and how many appends each covered (group commit).
    pub fsyncs: u64,
    pub group_commit_batch_size: HistogramSnapshot,
    pub fsync_latency_seconds: HistogramSnapshot,
    /// CPU time of this shard's thread (user + system, `RUSAGE_THREAD`), seconds.
    pub cpu_seconds: f64,
    /// Partitions this shard owns and has open (gauge).
    pub partitions: u64,
    /// Polls parked on this shard's partitions waiting for data (gauge; issue 11 section 3).
    pub parked_polls: u64,
    /// Shard 0 only: metadata consensus and checkpoint figures.
    pub replica: Option<ReplicaMetricsSnapshot>,
}

/// Shard 0's metadata figures.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicaMetricsSnapshot {
    /// Metadata ops committed since start.
    pub ops_committed: u64,
    /// From a request's arrival at shard 0 to its commit (primary only).
    pub commit_latency_seconds: HistogramSnapshot,
    pub checkpoints: u64,
    pub checkpoint_duration_seconds: HistogramSnapshot,
    /// `checkpoint_op` of the newest durable checkpoint.
    pub checkpoint_op: u64,
    /// Bytes of journal segment files on disk (gauge).
    pub journal_bytes: u64,
    /// Client sessions in the client table (gauge).
    pub sessions: u64,
    pub view: u32,
    /// This replica's index, the primary of its view (`None` during a view change), whether this
    /// replica is it.
    pub replica: u8,
    pub primary: Option<u8>,
    pub is_primary: bool,
    pub commit_min: u64,
    pub commit_max: u64,
    /// State transfers this replica started, completed and failed as a receiver (the receiver's
    /// counters: attempts started, checkpoints installed, failed rounds; each failed round ends
    /// its attempt and a retry starts a new one, so started = completed + failed + the attempt
    /// in progress).
    pub state_transfers_started: u64,
    pub state_transfers_completed: u64,
    pub state_transfers_failed: u64,
}

/// One request on a shard's metrics lane: where to send the snapshot.
#[derive(Debug)]
pub struct MetricsRequest {
    pub reply: std_mpsc::SyncSender<ShardMetricsSnapshot>,
}

type Lane = crossfire::mpsc::Array<MetricsRequest>;
/// The sending side (any thread).
pub type MetricsLaneTx = crossfire::MTx<Lane>;
/// The receiving side, polled by a task on the shard's runtime.
pub type MetricsLaneRx = crossfire::AsyncRx<Lane>;

/// One bounded lane per shard.
pub fn metrics_lanes(shard_count: u16) -> (MetricsGatherer, Vec<MetricsLaneRx>) {
    let (senders, receivers) = (0..shard_count)
        .map(|_| crossfire::mpsc::bounded_blocking_async::<MetricsRequest>(METRICS_LANE_CAPACITY))
        .unzip();
    (MetricsGatherer { senders }, receivers)
}

/// Asks every shard for its snapshot. `Send + Sync`: the metrics listener's thread holds it.
#[derive(Debug)]
pub struct MetricsGatherer {
    senders: Vec<MetricsLaneTx>,
}

/// What a scrape got: one entry per shard, `Err` naming why a shard did not answer.
#[derive(Debug)]
pub struct Gathered {
    pub shards: Vec<Result<ShardMetricsSnapshot, GatherError>>,
    /// How long gathering took.
    pub elapsed: Duration,
}

/// Why one shard's snapshot is missing from a scrape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GatherError {
    /// The shard's lane held `METRICS_LANE_CAPACITY` unanswered requests (a stalled shard, or
    /// scrapes faster than it answers): reported, never waited on.
    #[error("shard {shard}: metrics lane full (the shard is not answering)")]
    LaneFull { shard: u16 },
    /// The shard stopped (shutdown, or a failure).
    #[error("shard {shard}: stopped")]
    Stopped { shard: u16 },
    /// No answer within the gather timeout.
    #[error("shard {shard}: no answer within {timeout_ms} ms")]
    Timeout { shard: u16, timeout_ms: u64 },
}

impl MetricsGatherer {
    /// Shards this gatherer asks.
    pub fn shard_count(&self) -> u16 {
        self.senders.len() as u16
    }

    /// Asks every shard at once, then waits up to `timeout` overall for their snapshots. Blocks
    /// the calling thread (never call it on a shard).
    pub fn gather(&self, timeout: Duration) -> Gathered {
        let started = Instant::now();
        let deadline = started + timeout;
        let pending: Vec<Result<std_mpsc::Receiver<ShardMetricsSnapshot>, GatherError>> = self
            .senders
            .iter()
            .enumerate()
            .map(|(index, sender)| {
                let shard = index as u16;
                let (reply, receiver) = std_mpsc::sync_channel(1);
                sender
                    .try_send(MetricsRequest { reply })
                    .map(|()| receiver)
                    .map_err(|error| match error {
                        crossfire::TrySendError::Full(_) => GatherError::LaneFull { shard },
                        crossfire::TrySendError::Disconnected(_) => GatherError::Stopped { shard },
                    })
            })
            .collect();
        let shards = pending
            .into_iter()
            .enumerate()
            .map(|(index, receiver)| {
                let shard = index as u16;
                let receiver = receiver?;
                let left = deadline.saturating_duration_since(Instant::now());
                receiver.recv_timeout(left).map_err(|error| match error {
                    std_mpsc::RecvTimeoutError::Timeout => GatherError::Timeout {
                        shard,
                        timeout_ms: timeout.as_millis() as u64,
                    },
                    std_mpsc::RecvTimeoutError::Disconnected => GatherError::Stopped { shard },
                })
            })
            .collect();
        Gathered {
            shards,
            elapsed: started.elapsed(),
        }
    }
}

/// CPU time (user + system) of the calling thread, seconds (`getrusage(RUSAGE_THREAD)`); 0 if
/// the call fails (it cannot, for the calling thread, on Linux).
pub fn thread_cpu_seconds() -> f64 {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: `usage` is a valid, writable rusage; RUSAGE_THREAD reads the calling thread.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_THREAD, usage.as_mut_ptr()) };
    if rc != 0 {
        return 0.0;
    }
    // SAFETY: getrusage returned 0, so it filled the struct.
    let usage = unsafe { usage.assume_init() };
    let seconds = |time: libc::timeval| time.tv_sec as f64 + time.tv_usec as f64 / 1e6;
    seconds(usage.ru_utime) + seconds(usage.ru_stime)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_with_inf_in_count() {
        let histogram = Histogram::new(&[1.0, 2.0, 4.0]);
        for value in [0.5, 1.0, 1.5, 3.0, 9.0] {
            histogram.observe(value);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.buckets, vec![(1.0, 2), (2.0, 3), (4.0, 4)]);
        assert_eq!(snapshot.count, 5);
        assert!((snapshot.sum - 15.0).abs() < 1e-9);
    }

    #[test]
    fn request_counts_label_wire_numbers_in_snake_case_and_skip_zeros() {
        let counts = RequestCounts::default();
        assert!(counts.snapshot().is_empty());
        counts.record(bus::Operation::SendMessages as u8, 0);
        counts.record(bus::Operation::SendMessages as u8, 0);
        counts.record(
            bus::Operation::SendMessages as u8,
            bus::ErrorCode::Busy as u32,
        );
        counts.record(
            bus::Operation::PollMessages as u8,
            bus::ErrorCode::NotPrimary as u32,
        );
        counts.record(200, 0);
        counts.record(bus::Operation::Ping as u8, 999);
        let row = |operation, result, count| RequestCount {
            operation,
            result,
            count,
        };
        assert_eq!(
            counts.snapshot(),
            vec![
                row("unknown", "ok", 1),
                row("ping", "unknown", 1),
                row("send_messages", "ok", 2),
                row("send_messages", "busy", 1),
                row("poll_messages", "not_primary", 1),
            ]
        );
    }

    #[test]
    fn result_labels_follow_the_error_code_numbers() {
        for code in bus::ErrorCode::ALL {
            let name = format!("{code:?}");
            let snake: String = name
                .chars()
                .enumerate()
                .flat_map(|(index, c)| {
                    let lower = c.to_ascii_lowercase();
                    if c.is_ascii_uppercase() && index > 0 {
                        vec!['_', lower]
                    } else {
                        vec![lower]
                    }
                })
                .collect();
            assert_eq!(RESULT_LABELS[code as usize], snake, "{name}");
        }
        for operation in bus::Operation::ALL {
            let name = format!("{operation:?}").to_ascii_lowercase();
            assert_eq!(
                OPERATION_LABELS[operation as usize].replace('_', ""),
                name,
                "{operation:?}"
            );
        }
    }

    #[test]
    fn shard_metrics_count_busy_answers_mesh_sends_and_fsyncs() {
        use storage::log::LogStats;
        let metrics = ShardMetrics::default();
        metrics.appended(10, 400);
        metrics.appended(5, 200);
        metrics.read(7, 300);
        metrics.answered(bus::Operation::SendMessages as u8, 0);
        metrics.answered(
            bus::Operation::SendMessages as u8,
            bus::ErrorCode::Busy as u32,
        );
        metrics.mesh_send(true);
        metrics.mesh_send(true);
        metrics.mesh_send(false);
        metrics.connection_refused();
        metrics.fsync_done(3, Duration::from_micros(700));
        metrics.fsync_done(1, Duration::from_millis(20));
        let mut snapshot = ShardMetricsSnapshot::default();
        metrics.fill(&mut snapshot);
        assert_eq!(
            (snapshot.messages_appended, snapshot.bytes_appended),
            (15, 600)
        );
        assert_eq!((snapshot.messages_read, snapshot.bytes_read), (7, 300));
        assert_eq!(snapshot.busy_replies, 1);
        assert_eq!(snapshot.requests.len(), 2);
        assert_eq!(
            (snapshot.mesh_frames_sent, snapshot.mesh_inbox_full),
            (2, 1)
        );
        assert_eq!(snapshot.connections_refused, 1);
        assert_eq!(snapshot.fsyncs, 2);
        assert_eq!(snapshot.group_commit_batch_size.count, 2);
        assert!((snapshot.group_commit_batch_size.sum - 4.0).abs() < 1e-9);
        // 700 µs lands in the 1 ms bucket, 20 ms in the 25 ms one.
        let bucket = |bound: f64| {
            snapshot
                .fsync_latency_seconds
                .buckets
                .iter()
                .find(|(upper, _)| (*upper - bound).abs() < 1e-12)
                .map(|(_, count)| *count)
        };
        assert_eq!(bucket(0.000_5), Some(0));
        assert_eq!(bucket(0.001), Some(1));
        assert_eq!(bucket(0.01), Some(1));
        assert_eq!(bucket(0.025), Some(2));
    }

    #[test]
    fn replica_metrics_keep_the_last_journal_size_read() {
        let metrics = ReplicaMetrics::default();
        assert_eq!(metrics.journal_bytes(None), 0);
        assert_eq!(metrics.journal_bytes(Some(4096)), 4096);
        assert_eq!(
            metrics.journal_bytes(None),
            4096,
            "locked: the last read stands"
        );
        metrics.committed();
        metrics.committed();
        metrics.commit_latency(Duration::from_millis(3));
        metrics.checkpointed(Duration::from_millis(40));
        let mut snapshot = ReplicaMetricsSnapshot::default();
        metrics.fill(&mut snapshot);
        assert_eq!(snapshot.ops_committed, 2);
        assert_eq!(snapshot.commit_latency_seconds.count, 1);
        assert_eq!(snapshot.checkpoints, 1);
        assert_eq!(snapshot.checkpoint_duration_seconds.count, 1);
    }

    #[test]
    fn gather_reports_a_stopped_shard_and_a_silent_one() {
        let (gatherer, mut receivers) = metrics_lanes(2);
        // Shard 1's receiver is dropped: stopped. Shard 0's is kept but never answers: timeout.
        drop(receivers.pop());
        let gathered = gatherer.gather(Duration::from_millis(20));
        assert_eq!(
            gathered.shards[0],
            Err(GatherError::Timeout {
                shard: 0,
                timeout_ms: 20
            })
        );
        assert_eq!(gathered.shards[1], Err(GatherError::Stopped { shard: 1 }));
        drop(receivers);
    }

    #[test]
    fn thread_cpu_seconds_grows_with_work() {
        let before = thread_cpu_seconds();
        let mut x = 0u64;
        let spin_until = Instant::now() + Duration::from_millis(30);
        while Instant::now() < spin_until {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        assert!(thread_cpu_seconds() > before, "{x}");
    }
}
