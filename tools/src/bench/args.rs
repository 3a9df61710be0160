//! The `shardline bench` flags and their validation into a `BenchPlan`.
//!
//! Every rule is checked before anything starts, and every error names the flag, the value and the
//! rule. Must never start a server or touch the network.

use std::path::PathBuf;
use std::time::Duration;

use bus::limits::{BATCH_MESSAGE_COUNT_MAX, MESSAGE_SIZE_MAX_DEFAULT, PARTITION_COUNT_MAX};
use bus::{BATCH_HEADER_SIZE, HEADER_SIZE, MESSAGE_HEADER_SIZE};

use super::limits::{
    CONSUMER_COUNT_MAX, MESSAGE_COUNT_MAX, METADATA_OP_COUNT_MAX, PRODUCER_COUNT_MAX,
    REPEAT_COUNT_MAX, RUN_DURATION_MAX,
};
use super::metadata::METADATA_CLIENT_COUNT_MAX;
use super::plan::{
    BenchPlan, MetadataClients, PayloadChoice, ServerTarget, ShardRequest, Workload,
};
use super::server::ServerOptions;
use super::sweep::EFFICIENCY_MARGIN_DEFAULT;
use super::workload::ProduceStop;
use crate::arg_values::{parse_byte_size_u32, parse_duration, whole_number};

/// Default total messages when neither `--messages` nor `--duration` is given.
const MESSAGES_DEFAULT: u64 = 1_000_000;
/// Default payload bytes when neither `--message-size` nor `--payload-file` is given.
const MESSAGE_SIZE_DEFAULT: u32 = 1000;
/// Default rounds of `--workload metadata`: enough samples for a p99 that is not the maximum.
const METADATA_OPS_DEFAULT: u32 = 200;
/// Defaults of the produce-consume flags that have one; `--workload metadata` rejects any other
/// value, since it would be silently ignored.
const PRODUCERS_DEFAULT: u32 = 2;
const CONSUMERS_DEFAULT: u32 = 2;
const BATCH_DEFAULT: u32 = 1000;
const STREAM_ID_DEFAULT: u32 = 1;
/// Runs of each shard count unless `--repeat` says otherwise.
const REPEAT_DEFAULT: u32 = 1;

/// The largest `--server-pid`: a pid is a positive `pid_t` (a C `int`).
const SERVER_PID_MAX: u32 = i32::MAX.unsigned_abs();

/// The largest `--inbox-capacity`: the server's own bound.
#[allow(
    clippy::cast_possible_truncation,
    reason = "checked at compile time below"
)]
const INBOX_CAPACITY_MAX: u32 = runtime::limits::INBOX_CAPACITY_MAX as u32;
const _: () = assert!(runtime::limits::INBOX_CAPACITY_MAX <= u32::MAX as usize);

/// The largest `--idle-poll-us`: the server's `IDLE_POLL_MAX` in microseconds.
#[allow(
    clippy::cast_possible_truncation,
    reason = "checked at compile time below"
)]
const IDLE_POLL_US_MAX: u32 = shards::config::IDLE_POLL_MAX.as_micros() as u32;
const _: () = assert!(shards::config::IDLE_POLL_MAX.as_micros() <= u32::MAX as u128);

/// Load generator and report: starts a server (or uses `--addr`), writes messages, reads every
/// acknowledged message back and verifies it, and reports throughput, latency and the server's CPU.
/// The headline is messages per server-CPU-second: shard threads plus the `io_uring` kernel workers
/// doing their I/O, so the figure does not depend on the bench's own CPU.
///
/// `--workload metadata` measures metadata commit latency instead: see `--workload`.
#[derive(Debug, Clone, PartialEq, clap::Args)]
pub struct BenchArgs {
    /// Shard counts to compare, one run per count on a fresh embedded server: a comma-separated
    /// list such as `1,2,4`; `all` runs one shard per CPU the process may use (its affinity mask,
    /// capped by the cgroup CPU quota, or the `--cpus` list); `sweep` alone runs 1, 2, 4, ...
    /// doubling up to that count, and that count itself when it is not a power of two (6 CPUs:
    /// 1,2,4,6). With more than one count or `--repeat`, the report ends with the median and
    /// spread per count and a recommended count.
    #[arg(
        long,
        value_name = "LIST",
        default_value = "all",
        allow_hyphen_values = true,
        value_parser = parse_shards_value
    )]
    pub shards: String,

    /// Runs of each shard count, 1..=100, each on a fresh server. The runs go in rounds
    /// (`--shards 1,2 --repeat 3`: 1,2,1,2,1,2) so that drift over the sequence (page cache,
    /// other tenants) is spread over every count; the report gives the median and spread.
    #[arg(
        long,
        value_name = "K",
        default_value_t = REPEAT_DEFAULT,
        allow_negative_numbers = true,
        value_parser = whole_number_because("a repeat count", 1, REPEAT_COUNT_MAX, REPEAT_COUNT_RULE)
    )]
    pub repeat: u32,

    /// The recommendation's margin: a larger shard count is recommended only while its msgs per
    /// server-CPU-second stay at least this fraction of the 1-shard figure (0 < F <= 1)
    /// [default: 0.8].
    #[arg(long, value_name = "F", allow_negative_numbers = true)]
    pub efficiency_margin: Option<f64>,

    /// Bench a server that is already running instead of starting one. Its stream `--stream-id`
    /// must not exist yet. `--shards` may then name at most one count (checked against the server).
    #[arg(long, value_name = "HOST:PORT")]
    pub addr: Option<String>,

    /// With `--addr`: the server's process id, so its CPU can be read from /proc. Without it the
    /// CPU figures (and the msgs per CPU-second headline) are reported as n/a.
    #[arg(
        long,
        value_name = "PID",
        allow_negative_numbers = true,
        value_parser = whole_number("a process id", 1, SERVER_PID_MAX)
    )]
    pub server_pid: Option<u32>,

    /// Embedded server: when an append is acknowledged. `always` (after fsync, group commit; the
    /// server default), `interval=MS` (fsync every MS ms), `never` (page cache only; measures the
    /// server, not the disk).
    #[arg(long, value_name = "POLICY", value_parser = parse_fsync_value)]
    pub fsync: Option<String>,

    /// Embedded server: how partition logs write, `buffered` (the server default) or `direct`
    /// (O_DIRECT; polls then read the disk). Passed to `serve --write-mode`; compare the two on
    /// your host with `--json` and `--compare` (`serve --help` gives this VM's figures).
    #[arg(long, value_name = "MODE", value_parser = parse_write_mode_value)]
    pub write_mode: Option<String>,

    /// Embedded server: the exact CPUs of the shards, e.g. `0-3,8` (each must be allowed).
    #[arg(long, value_name = "LIST")]
    pub cpus: Option<String>,

    /// Embedded server: do not pin shards to cores (shared hosts, containers, more shards than
    /// cores). Pinned runs are the ones to compare.
    #[arg(long)]
    pub no_pin: bool,

    /// Embedded server: `io-uring` (default) or `poll`, the fallback where `io_uring` is unavailable.
    #[arg(long, value_name = "DRIVER", value_parser = parse_io_driver_value)]
    pub io_driver: Option<String>,

    /// Embedded server: capacity of each shard's mesh inbox (1..=1048576). Small values make
    /// cross-shard forwarding answer `Busy`, which the bench retries and counts.
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = whole_number("an inbox capacity", 1, INBOX_CAPACITY_MAX)
    )]
    pub inbox_capacity: Option<u32>,

    /// Embedded server: microseconds an idle shard keeps polling before it sleeps (0..=10000).
    /// Lower cross-shard latency, more CPU burnt while idle.
    #[arg(
        long,
        value_name = "US",
        allow_negative_numbers = true,
        value_parser = whole_number("an idle poll in microseconds", 0, IDLE_POLL_US_MAX)
    )]
    pub idle_poll_us: Option<u32>,

    /// Embedded server: directory under which each run's fresh data directory is created (default:
    /// the system temp dir; created if missing, as `serve --data-dir` is). Put it on the disk you
    /// mean to measure: /tmp is often tmpfs, where fsync costs nothing (the report warns). With
    /// `--workload metadata --addr`: where the disk-baseline file goes.
    #[arg(long, value_name = "DIR")]
    pub data_root: Option<PathBuf>,

    /// Producer threads, each with its own runtime and connection, one batch in flight.
    #[arg(
        long,
        value_name = "P",
        default_value_t = PRODUCERS_DEFAULT,
        allow_negative_numbers = true,
        value_parser = whole_number("a producer count", 1, PRODUCER_COUNT_MAX)
    )]
    pub producers: u32,

    /// Consumer threads that read everything back and verify it (at most one per partition).
    #[arg(
        long,
        value_name = "C",
        default_value_t = CONSUMERS_DEFAULT,
        allow_negative_numbers = true,
        value_parser = whole_number("a consumer count", 1, CONSUMER_COUNT_MAX)
    )]
    pub consumers: u32,

    /// Partitions of the bench topic (default: one per producer). Producer i writes partitions
    /// i, i+P, ...; the server places a topic's consecutive partitions on consecutive shards, so
    /// a multiple of the shard count loads every shard evenly (the report warns otherwise).
    #[arg(
        long,
        value_name = "K",
        allow_negative_numbers = true,
        value_parser = whole_number("a partition count", 1, PARTITION_COUNT_MAX)
    )]
    pub partitions: Option<u32>,

    /// Messages per batch (one `SendMessages` request). Larger batches amortize per-request costs.
    #[arg(
        long,
        value_name = "B",
        default_value_t = BATCH_DEFAULT,
        allow_negative_numbers = true,
        value_parser = whole_number("a batch message count", 1, BATCH_MESSAGE_COUNT_MAX)
    )]
    pub batch: u32,

    /// Total messages to produce over all producers, 1..=10^10 [default: 1000000 unless
    /// --duration]. A run whose estimated bytes exceed the free space of the data root's
    /// filesystem is refused before it starts.
    #[arg(
        long,
        value_name = "M",
        allow_negative_numbers = true,
        value_parser = whole_number_because("a message count", 1, MESSAGE_COUNT_MAX, MESSAGE_COUNT_RULE)
    )]
    pub messages: Option<u64>,

    /// Produce for this long instead of a message count, then read back what was acknowledged:
    /// `10s`, `2m`, or plain seconds (`10`); whole seconds, 1 s to 24 h. With `--workload
    /// metadata --clients N` (N >= 2): how long the concurrent clients register, instead of
    /// `--metadata-ops` Registers each.
    #[arg(
        long,
        value_name = "DURATION",
        allow_negative_numbers = true,
        value_parser = parse_run_duration
    )]
    pub duration: Option<Duration>,

    /// Payload bytes per message: plain bytes (`1000`) or with a binary suffix (`1KiB`, `1MiB`)
    /// [default: 1000 unless --payload-file].
    #[arg(
        long,
        value_name = "BYTES",
        allow_negative_numbers = true,
        value_parser = parse_byte_size_u32
    )]
    pub message_size: Option<u32>,

    /// Send the lines of this file as payloads (one message per line, cycled; empty lines
    /// skipped, as `shardline send` skips them), e.g. a real log for uneven sizes.
    #[arg(long, value_name = "FILE")]
    pub payload_file: Option<PathBuf>,

    /// Produce and consume at the same time (consumers follow the producers). By default all
    /// messages are produced first and then read back, as iggy-bench's pinned producer and pinned
    /// consumer do.
    #[arg(long)]
    pub concurrent: bool,

    /// Read the consume phase with the members of one consumer group (issue 11 section 2, like
    /// iggy-bench's balanced consumer group): each of --consumers joins group `bench`, the server
    /// assigns the partitions, members store the group's offsets, and every message must be
    /// consumed exactly once across them. Not with --concurrent.
    #[arg(long, conflicts_with = "concurrent")]
    pub consumer_group: bool,

    /// With --consumer-group: every member but the first leaves and joins again every 64 polls,
    /// so partitions move between members all through the phase (still exactly once).
    #[arg(long, requires = "consumer_group")]
    pub group_churn: bool,

    /// Also write the report as JSON to this file (opened before the first run: a path that
    /// cannot be created fails at once).
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// Also write one CSV row per run and phase to this file (created before the first run, so a
    /// path that cannot be written fails at once; written when the runs end, also after a failed
    /// verification, for the runs that completed).
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,

    /// Also write SVG charts into this directory (created before the first run): throughput and
    /// per-core efficiency vs shard count, latency percentiles per count, per-shard CPU.
    #[arg(long, value_name = "DIR")]
    pub charts: Option<PathBuf>,

    /// Compare this run's figures with an earlier `--json` report (read before the first run):
    /// each figure as new/old, flagged where it moved beyond the run-to-run spread.
    #[arg(long, value_name = "OLD.json")]
    pub compare: Option<PathBuf>,

    /// Id of the stream the bench creates (with topic 1 `bench`). Change it to bench a running
    /// server again (`--addr`), since the stream must not exist yet.
    #[arg(
        long,
        value_name = "ID",
        default_value_t = STREAM_ID_DEFAULT,
        allow_negative_numbers = true,
        value_parser = whole_number("a stream id", 1, u32::MAX)
    )]
    pub stream_id: u32,

    /// What to measure (values below). For `metadata`, the baseline file is written beside the
    /// embedded server's data directory, so put `--data-root` on the disk you mean to measure; the
    /// server's default `--fsync always` applies. With `--addr`, `--data-root` names where the
    /// baseline file goes (default: the system temp dir, which may not be the server's disk), and
    /// the streams created are above the highest existing id, each deleted before the next round.
    /// A missed target is reported, never a failure.
    #[arg(
        long,
        value_enum,
        value_name = "WORKLOAD",
        default_value_t = Workload::ProduceConsume
    )]
    pub workload: Workload,

    /// `--workload metadata`: rounds to time (each: register, create stream, create topic,
    /// delete stream, plus one baseline write + fdatasync) [default: 200]. With `--clients` N >= 2
    /// and no `--duration`, also the Registers each concurrent client sends.
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = whole_number("a metadata op count", 1, METADATA_OP_COUNT_MAX)
    )]
    pub metadata_ops: Option<u32>,

    /// `--workload metadata`: concurrent client connections, 1..=1024 [default: 1]. With 2 or
    /// more, after the rounds every connection registers fresh sessions in a loop (a new client
    /// id per Register, so each is one committed metadata op), `--metadata-ops` times or for
    /// `--duration` seconds, and the report adds committed ops per second and the p50/p99/max
    /// latency of those commits beside issue 8's targets (64 clients: 10,000 ops/s with 1
    /// replica, 5,000 with 3). With `--addr`, name the cluster's primary.
    #[arg(
        long,
        value_name = "N",
        allow_negative_numbers = true,
        value_parser = whole_number_because(
            "a client count",
            1,
            METADATA_CLIENT_COUNT_MAX,
            CLIENT_COUNT_RULE
        )
    )]
    pub clients: Option<u32>,
}

/// Why `--messages` is bounded.
const MESSAGE_COUNT_RULE: &str = "a run writes every message to disk and keeps every \
                                  acknowledged range in memory; 10^10 messages is past any bench disk";

/// Why `--repeat` is bounded.
const REPEAT_COUNT_RULE: &str = "runs of each shard count, each on a fresh server";

/// Why `--clients` is bounded.
const CLIENT_COUNT_RULE: &str = "the count of concurrent client connections (each one a task of \
                                 the bench; past a thousand it measures its own scheduling, not \
                                 the server)";

/// [`whole_number`] with the reason for its range after its error: `"0" is not a message count:
/// use a whole number from 1 to 10000000000: a run writes every message ...`. A clap value
/// parser; clap prefixes the flag and the value and exits 2.
fn whole_number_because<T>(
    what: &'static str,
    min: T,
    max: T,
    rule: &'static str,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: std::str::FromStr + PartialOrd + std::fmt::Display + Copy + Send + Sync + 'static,
{
    let parse = whole_number(what, min, max);
    move |text: &str| parse(text).map_err(|error| format!("{error}: {rule}"))
}

/// Why the flags cannot be run.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum BenchArgsError {
    #[error("--{flag} must be at least 1")]
    Zero { flag: &'static str },
    #[error(
        "--efficiency-margin {value}: expected a fraction above 0 and at most 1, the share of the \
         1-shard msgs per server-CPU-second a larger count must keep (e.g. 0.8)"
    )]
    EfficiencyMargin { value: String },
    /// `--shards sweep` could not learn what `all` resolves to (the server's rule says why).
    #[error("--shards sweep: {reason}")]
    Topology { reason: String },
    #[error("--{flag} {value} exceeds the limit {max}")]
    AboveLimit {
        flag: &'static str,
        value: u64,
        max: u64,
    },
    #[error("--{flag} {value} is outside {min}..={max}: {rule}")]
    OutOfRange {
        flag: &'static str,
        value: u64,
        min: u64,
        max: u64,
        rule: &'static str,
    },
    #[error(
        "--duration {seconds} with --workload metadata times the concurrent clients, so it needs --clients 2 or more; the single-client rounds are counted by --metadata-ops"
    )]
    MetadataDurationWithOneClient { seconds: u64 },
    #[error("--{first} and --{second} cannot both be given: {rule}")]
    Conflict {
        first: &'static str,
        second: &'static str,
        rule: &'static str,
    },
    #[error(
        "--partitions {partitions} is below --producers {producers}: every producer needs a partition of its own"
    )]
    PartitionsBelowProducers { partitions: u32, producers: u32 },
    #[error(
        "--consumers {consumers} exceeds --partitions {partitions}: each partition is read by one consumer"
    )]
    ConsumersAbovePartitions { consumers: u32, partitions: u32 },
    #[error("--shards {value}: {rule}")]
    Shards { value: String, rule: String },
    #[error(
        "--{flag} configures the embedded server and cannot be used with --addr; configure the running server instead"
    )]
    EmbeddedOnly { flag: &'static str },
    #[error("--{flag} applies to --workload {applies_to} only, not to --workload {workload}")]
    WrongWorkload {
        flag: &'static str,
        applies_to: Workload,
        workload: Workload,
    },
    #[error("--server-pid needs --addr: the embedded server's pid is known")]
    ServerPidWithoutAddr,
    #[error("--fsync {value}: {}", fsync_rule())]
    Fsync { value: String },
    #[error("--io-driver {value}: {IO_DRIVER_RULE}")]
    IoDriver { value: String },
    #[error("--write-mode {value}: {WRITE_MODE_RULE}")]
    WriteMode { value: String },
    /// The server's own `--cpus` parser rejected the list (its message names value and rule).
    #[error("{reason}")]
    Cpus { reason: String },
    /// One batch's request frame exceeds the frame limit; `limit` names it and whose it is.
    #[error(
        "--batch {batch} messages of up to {payload_len_max} payload bytes make a {request_bytes}-byte request frame, above {limit}; lower --batch or the payload size"
    )]
    BatchTooLarge {
        batch: u32,
        payload_len_max: usize,
        request_bytes: u64,
        limit: String,
    },
}

/// What `--shards` asked for, before `sweep` is expanded against the allowed CPUs.
#[derive(Debug, Clone, PartialEq, Eq)]
enum ShardSpec {
    List(Vec<ShardRequest>),
    Sweep,
}

/// Parses `--shards`: `sweep` alone, or a comma-separated list of `all` and counts, each count
/// by `serve --shards`'s own rule (`runtime::ShardCountArg`: 1 to `SHARD_COUNT_MAX`), none
/// listed twice.
///
/// # Errors
/// The rule (clap and [`BenchArgsError::Shards`] name the flag and the value): serve's for a
/// bad count, after the count (`"0": shard count must be between 1 and 1024`) in a list of more
/// than one; else that `sweep` stands alone or that a count is listed twice.
fn parse_shards(value: &str) -> Result<ShardSpec, String> {
    if value.trim() == "sweep" {
        return Ok(ShardSpec::Sweep);
    }
    let items: Vec<&str> = value.split(',').map(str::trim).collect();
    if items.contains(&"sweep") {
        return Err(
            "`sweep` stands alone: it already runs 1, 2, 4, ... up to the allowed CPUs".to_owned(),
        );
    }
    if items.len() > 1
        && let Some(empty_index) = items.iter().position(|item| item.is_empty())
    {
        return Err(format!(
            "entry {} of the list is empty: separate the counts with single commas (e.g. 1,2,4)",
            empty_index + 1
        ));
    }
    let requests = items
        .iter()
        .map(|item| match crate::arg_values::parse_shard_count(item) {
            Ok(runtime::ShardCountArg::All) => Ok(ShardRequest::All),
            Ok(runtime::ShardCountArg::Count(count)) => Ok(ShardRequest::Count(count)),
            Err(rule) if items.len() == 1 => Err(rule),
            Err(rule) => Err(format!("{item:?}: {rule}")),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if let Some((first_index, second_index)) = first_repeat(&requests) {
        let what = match requests[first_index] {
            ShardRequest::All => "`all`".to_owned(),
            ShardRequest::Count(count) => format!("count {count}"),
        };
        return Err(format!(
            "{what} is listed twice (entries {} and {}): each count runs once per round; list \
             it once (--repeat runs rounds)",
            first_index + 1,
            second_index + 1
        ));
    }
    Ok(ShardSpec::List(requests))
}

/// The 0-based indexes of the first entry of `items` that a later one repeats, and of that
/// later one; `None` when all differ.
fn first_repeat<T: PartialEq>(items: &[T]) -> Option<(usize, usize)> {
    items.iter().enumerate().find_map(|(second_index, item)| {
        items[..second_index]
            .iter()
            .position(|earlier| earlier == item)
            .map(|first_index| (first_index, second_index))
    })
}

/// Refuses a `--shards` list of the embedded server where `all` resolves to the same count as
/// a number listed with it (`all,2` on a 2-CPU host is `2,2`). `all` resolves by the server's
/// own rule (`runtime::Topology`: affinity mask, cgroup quota, `--cpus`); when it cannot be
/// resolved, nothing is refused here: the topology check before the first run names the cause.
///
/// # Errors
/// [`BenchArgsError::Shards`], naming both entries and what `all` resolves to.
fn check_all_is_not_listed_again(
    value: &str,
    requests: &[ShardRequest],
    options: &ServerOptions,
) -> Result<(), BenchArgsError> {
    let Some(all_index) = requests
        .iter()
        .position(|request| *request == ShardRequest::All)
    else {
        return Ok(());
    };
    let Ok(all_count) = all_shard_count(options) else {
        return Ok(());
    };
    let Some(count_index) = requests
        .iter()
        .position(|request| *request == ShardRequest::Count(all_count))
    else {
        return Ok(());
    };
    let (first_index, second_index) = (all_index.min(count_index), all_index.max(count_index));
    Err(BenchArgsError::Shards {
        value: value.to_owned(),
        rule: format!(
            "entries {} and {} are the same count: `all` resolves to {all_count} {} here (one \
             per allowed core, or per --cpus entry); list the count once",
            first_index + 1,
            second_index + 1,
            if all_count == 1 { "shard" } else { "shards" },
        ),
    })
}

/// The shard count `--shards all` resolves to for the embedded server `options` describe, by
/// the server's own rule (`runtime::Topology`: affinity mask, cgroup quota, `--cpus`).
///
/// # Errors
/// [`BenchArgsError::Cpus`] for a `--cpus` that does not parse, [`BenchArgsError::Topology`]
/// when the server's rule refuses the settings.
fn all_shard_count(options: &ServerOptions) -> Result<u16, BenchArgsError> {
    let cpus = options
        .cpus
        .as_deref()
        .map(str::parse::<runtime::CpuList>)
        .transpose()
        .map_err(|error| BenchArgsError::Cpus {
            reason: error.to_string(),
        })?;
    let topology = runtime::Topology::resolve(&runtime::TopologyConfig {
        shards: runtime::ShardCountArg::All,
        cpus,
        pin: !options.no_pin,
    })
    .map_err(|error| BenchArgsError::Topology {
        reason: error.to_string(),
    })?;
    Ok(topology.shard_count())
}

/// clap parser of `--shards`: checks `text` by [`parse_shards`] and keeps it as text (the plan
/// parses it again), so that a bad list is a usage error (exit 2) as `serve --shards` is.
///
/// # Errors
/// Those of [`parse_shards`].
fn parse_shards_value(text: &str) -> Result<String, String> {
    parse_shards(text).map(|_| text.to_owned())
}

/// The counts of `--shards sweep` when `all` resolves to `all_count` shards: 1, 2, 4, ...
/// doubling while at most `all_count`, then `all_count` itself if it is not a power of two.
///
/// # Panics
/// If `all_count` is 0 (a topology always places at least one shard).
pub fn sweep_counts(all_count: u16) -> Vec<u16> {
    assert!(all_count >= 1, "a topology places at least one shard");
    let mut counts: Vec<u16> = std::iter::successors(Some(1_u16), |count| count.checked_mul(2))
        .take_while(|count| *count <= all_count)
        .collect();
    if !all_count.is_power_of_two() {
        counts.push(all_count);
    }
    counts
}

/// `--shards sweep` for the embedded server `options` describe: the shard count `--shards all`
/// resolves to by the server's own rule (affinity mask, cgroup quota, `--cpus`), swept.
fn sweep_requests(options: &ServerOptions) -> Result<Vec<ShardRequest>, BenchArgsError> {
    Ok(sweep_counts(all_shard_count(options)?)
        .into_iter()
        .map(ShardRequest::Count)
        .collect())
}

/// `--duration`: the forms of [`parse_duration`] (`10s`, `2m`, plain seconds), a whole number of
/// seconds from 1 s to [`RUN_DURATION_MAX`]. A run under a second measures its own start (the
/// connections, the first batches), not throughput, and the report counts whole seconds.
fn parse_run_duration(text: &str) -> Result<Duration, String> {
    let duration = parse_duration(text, "bench duration", RUN_DURATION_MAX)?;
    if duration < Duration::from_secs(1) {
        return Err(format!(
            "{text:?} is under a second: a run needs at least 1 s to measure throughput rather \
             than its own start (e.g. 10s, 2m)"
        ));
    }
    if duration.subsec_nanos() != 0 {
        return Err(format!(
            "{text:?} is not a whole number of seconds: runs are timed in seconds (e.g. 10s, 2m)"
        ));
    }
    Ok(duration)
}

/// What `--fsync` takes: the server's own `storage::FsyncPolicy` rule.
fn fsync_rule() -> String {
    format!(
        "expected always, never or interval=MS with MS from 1 to {}",
        storage::limits::FSYNC_INTERVAL_MS_MAX
    )
}

/// What `--io-driver` takes: the server's two drivers, by their canonical names (the run's
/// metadata records the text, so the aliases `serve` also accepts are not taken here).
const IO_DRIVER_RULE: &str = "expected io-uring or poll";

/// What `--write-mode` takes: the server's own `storage::WriteMode` rule.
const WRITE_MODE_RULE: &str = "expected buffered or direct";

/// clap parser of `--fsync`: checks `text` by the server's `storage::FsyncPolicy` parser and
/// keeps it as text (passed on to the embedded server as `serve --fsync`).
///
/// # Errors
/// The rule (clap names the flag and the value), exit 2 as `serve` does.
fn parse_fsync_value(text: &str) -> Result<String, String> {
    match text.parse::<storage::FsyncPolicy>() {
        Ok(_) => Ok(text.to_owned()),
        Err(_) => Err(fsync_rule()),
    }
}

/// clap parser of `--io-driver`: `io-uring` or `poll`, kept as text.
///
/// # Errors
/// The rule, as [`parse_fsync_value`] says.
fn parse_io_driver_value(text: &str) -> Result<String, String> {
    match text {
        "io-uring" | "poll" => Ok(text.to_owned()),
        _ => Err(IO_DRIVER_RULE.to_owned()),
    }
}

/// clap parser of `--write-mode`: checks `text` by the server's `storage::WriteMode` parser and
/// keeps it as text.
///
/// # Errors
/// The rule, as [`parse_fsync_value`] says.
fn parse_write_mode_value(text: &str) -> Result<String, String> {
    match text.parse::<storage::WriteMode>() {
        Ok(_) => Ok(text.to_owned()),
        Err(_) => Err(WRITE_MODE_RULE.to_owned()),
    }
}

fn check_fsync(value: &str) -> Result<(), BenchArgsError> {
    match value.parse::<storage::FsyncPolicy>() {
        Ok(_) => Ok(()),
        Err(_) => Err(BenchArgsError::Fsync {
            value: value.to_string(),
        }),
    }
}

/// Bytes of the SendMessages request frame the bench sends for `batch` messages of
/// `payload_len` bytes: frame header, batch header, then a message header and payload each.
pub fn batch_frame_size(batch: u32, payload_len: usize) -> u64 {
    (HEADER_SIZE + BATCH_HEADER_SIZE) as u64
        + u64::from(batch) * (MESSAGE_HEADER_SIZE + payload_len) as u64
}

/// Checks that a batch of `batch` messages of up to `payload_len_max` bytes fits one request
/// frame of at most `frame_size_max` bytes; `limit_owner` says whose limit that is in the error
/// (e.g. `the server's default`, `the server at 127.0.0.1:8090's`).
///
/// # Errors
/// `BatchTooLarge` naming the batch, the payload size, the frame size and the limit.
pub fn check_batch_size(
    batch: u32,
    payload_len_max: usize,
    frame_size_max: u32,
    limit_owner: &str,
) -> Result<(), BenchArgsError> {
    let request_bytes = batch_frame_size(batch, payload_len_max);
    if request_bytes > u64::from(frame_size_max) {
        return Err(BenchArgsError::BatchTooLarge {
            batch,
            payload_len_max,
            request_bytes,
            limit: format!("{limit_owner} --max-message-size {frame_size_max}"),
        });
    }
    Ok(())
}

/// Whose limit `validate` checks batches against: any server's, as none can be configured above
/// the default.
pub const DEFAULT_LIMIT_OWNER: &str = "the server's default";

impl BenchArgs {
    /// Checks every rule and resolves defaults.
    ///
    /// # Errors
    /// The first broken rule, as a [`BenchArgsError`] naming the flag.
    pub fn validate(&self) -> Result<BenchPlan, BenchArgsError> {
        self.check_workload_flags()?;
        let at_least_one = |flag, value: u64| {
            if value == 0 {
                Err(BenchArgsError::Zero { flag })
            } else {
                Ok(())
            }
        };
        let at_most = |flag, value: u64, max: u64| {
            if value > max {
                Err(BenchArgsError::AboveLimit { flag, value, max })
            } else {
                Ok(())
            }
        };
        at_least_one("producers", self.producers.into())?;
        at_most(
            "producers",
            self.producers.into(),
            PRODUCER_COUNT_MAX.into(),
        )?;
        at_least_one("consumers", self.consumers.into())?;
        at_most(
            "consumers",
            self.consumers.into(),
            CONSUMER_COUNT_MAX.into(),
        )?;
        at_least_one("batch", self.batch.into())?;
        at_most("batch", self.batch.into(), BATCH_MESSAGE_COUNT_MAX.into())?;
        let partition_count = self.partitions.unwrap_or(self.producers);
        at_least_one("partitions", partition_count.into())?;
        at_most(
            "partitions",
            partition_count.into(),
            PARTITION_COUNT_MAX.into(),
        )?;
        if partition_count < self.producers {
            return Err(BenchArgsError::PartitionsBelowProducers {
                partitions: partition_count,
                producers: self.producers,
            });
        }
        if self.consumers > partition_count {
            return Err(BenchArgsError::ConsumersAbovePartitions {
                consumers: self.consumers,
                partitions: partition_count,
            });
        }
        let stop = match (self.messages, self.duration) {
            (Some(_), Some(_)) => {
                return Err(BenchArgsError::Conflict {
                    first: "messages",
                    second: "duration",
                    rule: "a run stops after a message count or after a time, not both",
                });
            }
            // `parse_run_duration` guarantees whole seconds, at least one.
            (_, Some(duration)) => ProduceStop::Duration(duration),
            (messages, None) => {
                let messages = messages.unwrap_or(MESSAGES_DEFAULT);
                at_least_one("messages", messages)?;
                if messages > MESSAGE_COUNT_MAX {
                    return Err(BenchArgsError::OutOfRange {
                        flag: "messages",
                        value: messages,
                        min: 1,
                        max: MESSAGE_COUNT_MAX,
                        rule: MESSAGE_COUNT_RULE,
                    });
                }
                ProduceStop::MessageCount(messages)
            }
        };
        let payload = match (self.message_size, &self.payload_file) {
            (Some(_), Some(_)) => {
                return Err(BenchArgsError::Conflict {
                    first: "message-size",
                    second: "payload-file",
                    rule: "payloads are either fixed-size or the lines of a file",
                });
            }
            (_, Some(path)) => PayloadChoice::File(path.clone()),
            (size, None) => {
                let size = size.unwrap_or(MESSAGE_SIZE_DEFAULT);
                at_least_one("message-size", size.into())?;
                check_batch_size(
                    self.batch,
                    size as usize,
                    MESSAGE_SIZE_MAX_DEFAULT,
                    DEFAULT_LIMIT_OWNER,
                )?;
                PayloadChoice::Size(size)
            }
        };
        let shard_spec = parse_shards(&self.shards).map_err(|rule| BenchArgsError::Shards {
            value: self.shards.clone(),
            rule,
        })?;
        if let Some(value) = &self.fsync {
            check_fsync(value)?;
        }
        if let Some(value) = &self.io_driver
            && value != "io-uring"
            && value != "poll"
        {
            return Err(BenchArgsError::IoDriver {
                value: value.clone(),
            });
        }
        if let Some(value) = &self.write_mode
            && value.parse::<storage::WriteMode>().is_err()
        {
            return Err(BenchArgsError::WriteMode {
                value: value.clone(),
            });
        }
        let server = self.server_target(&shard_spec)?;
        let shard_requests = match (shard_spec, &server) {
            (ShardSpec::List(requests), ServerTarget::Embedded { options, .. }) => {
                check_all_is_not_listed_again(&self.shards, &requests, options)?;
                requests
            }
            (ShardSpec::List(requests), ServerTarget::External { .. }) => requests,
            (ShardSpec::Sweep, ServerTarget::Embedded { options, .. }) => sweep_requests(options)?,
            (ShardSpec::Sweep, ServerTarget::External { .. }) => {
                unreachable!("server_target refuses sweep with --addr")
            }
        };
        let repeat_count = self.repeat;
        if !(1..=REPEAT_COUNT_MAX).contains(&repeat_count) {
            return Err(BenchArgsError::OutOfRange {
                flag: "repeat",
                value: repeat_count.into(),
                min: 1,
                max: REPEAT_COUNT_MAX.into(),
                rule: REPEAT_COUNT_RULE,
            });
        }
        let efficiency_margin = self.efficiency_margin.unwrap_or(EFFICIENCY_MARGIN_DEFAULT);
        if !(efficiency_margin > 0.0 && efficiency_margin <= 1.0) {
            return Err(BenchArgsError::EfficiencyMargin {
                value: efficiency_margin.to_string(),
            });
        }
        at_least_one("stream-id", self.stream_id.into())?;
        let metadata_op_count = self.metadata_ops.unwrap_or(METADATA_OPS_DEFAULT);
        at_least_one("metadata-ops", metadata_op_count.into())?;
        at_most(
            "metadata-ops",
            metadata_op_count.into(),
            METADATA_OP_COUNT_MAX.into(),
        )?;
        let metadata_clients = self.metadata_clients()?;
        let baseline_root = match (&server, self.workload) {
            (ServerTarget::External { .. }, Workload::Metadata) => self.data_root.clone(),
            _ => None,
        };
        Ok(BenchPlan {
            shard_requests,
            repeat_count,
            efficiency_margin,
            server,
            producer_count: self.producers,
            consumer_count: self.consumers,
            partition_count,
            batch_message_count: self.batch,
            stop,
            payload,
            concurrent: self.concurrent,
            json: self.json.clone(),
            csv: self.csv.clone(),
            charts: self.charts.clone(),
            compare: self.compare.clone(),
            stream_id: self.stream_id,
            workload: self.workload,
            metadata_op_count,
            metadata_clients,
            baseline_root,
            consumer_group: self.consumer_group.then_some(super::group::GroupMode {
                churn: self.group_churn,
            }),
        })
    }

    /// `--clients` and, for `--workload metadata`, `--duration`, checked.
    fn metadata_clients(&self) -> Result<MetadataClients, BenchArgsError> {
        let count = self.clients.unwrap_or(MetadataClients::ONE.count);
        if !(1..=METADATA_CLIENT_COUNT_MAX).contains(&count) {
            return Err(BenchArgsError::OutOfRange {
                flag: "clients",
                value: count.into(),
                min: 1,
                max: METADATA_CLIENT_COUNT_MAX.into(),
                rule: CLIENT_COUNT_RULE,
            });
        }
        let duration = match (self.workload, self.duration) {
            (Workload::Metadata, Some(duration)) if count == 1 => {
                return Err(BenchArgsError::MetadataDurationWithOneClient {
                    seconds: duration.as_secs(),
                });
            }
            (Workload::Metadata, Some(duration)) => Some(duration),
            _ => None,
        };
        Ok(MetadataClients { count, duration })
    }

    /// Rejects flags of the other workload: they would be silently ignored. Flags with a default
    /// are rejected when they differ from it (clap does not say whether a default was typed).
    fn check_workload_flags(&self) -> Result<(), BenchArgsError> {
        let (other, given) = match self.workload {
            Workload::ProduceConsume => (
                Workload::Metadata,
                vec![
                    ("metadata-ops", self.metadata_ops.is_some()),
                    ("clients", self.clients.is_some()),
                ],
            ),
            Workload::Metadata => (
                Workload::ProduceConsume,
                vec![
                    ("producers", self.producers != PRODUCERS_DEFAULT),
                    ("consumers", self.consumers != CONSUMERS_DEFAULT),
                    ("partitions", self.partitions.is_some()),
                    ("batch", self.batch != BATCH_DEFAULT),
                    ("messages", self.messages.is_some()),
                    // `--duration` times the concurrent clients there (`metadata_clients`).
                    ("message-size", self.message_size.is_some()),
                    ("payload-file", self.payload_file.is_some()),
                    ("concurrent", self.concurrent),
                    ("consumer-group", self.consumer_group),
                    ("stream-id", self.stream_id != STREAM_ID_DEFAULT),
                    // The metadata workload reports its own latency figures per run, which the
                    // sweep summary, CSV, charts and comparison do not read.
                    ("repeat", self.repeat != REPEAT_DEFAULT),
                    ("efficiency-margin", self.efficiency_margin.is_some()),
                    ("csv", self.csv.is_some()),
                    ("charts", self.charts.is_some()),
                    ("compare", self.compare.is_some()),
                ],
            ),
        };
        match given.into_iter().find(|(_, given)| *given) {
            Some((flag, _)) => Err(BenchArgsError::WrongWorkload {
                flag,
                applies_to: other,
                workload: self.workload,
            }),
            None => Ok(()),
        }
    }
    /// The server the runs talk to; server flags belong to the embedded server only.
    fn server_target(&self, shard_spec: &ShardSpec) -> Result<ServerTarget, BenchArgsError> {
        if self.addr.is_some() && self.repeat != REPEAT_DEFAULT {
            return Err(BenchArgsError::Conflict {
                first: "repeat",
                second: "addr",
                rule: "each repeat needs a fresh server, where the bench stream does not exist \
                       yet; against a running server, run the bench again with another \
                       --stream-id",
            });
        }
        let Some(addr) = &self.addr else {
            if self.server_pid.is_some() {
                return Err(BenchArgsError::ServerPidWithoutAddr);
            }
            // The embedded server would reject these too, but only after the bench started it.
            if let Some(cpus) = &self.cpus {
                if self.no_pin {
                    return Err(BenchArgsError::Conflict {
                        first: "cpus",
                        second: "no-pin",
                        rule: "--cpus pins shards to CPUs",
                    });
                }
                cpus.parse::<runtime::CpuList>()
                    .map_err(|error| BenchArgsError::Cpus {
                        reason: error.to_string(),
                    })?;
            }
            return Ok(ServerTarget::Embedded {
                options: ServerOptions {
                    fsync: self.fsync.clone(),
                    write_mode: self.write_mode.clone(),
                    cpus: self.cpus.clone(),
                    no_pin: self.no_pin,
                    io_driver: self.io_driver.clone(),
                    inbox_capacity: self.inbox_capacity,
                    idle_poll_us: self.idle_poll_us,
                },
                data_root: self.data_root.clone(),
            });
        };
        match shard_spec {
            ShardSpec::Sweep => {
                return Err(BenchArgsError::Shards {
                    value: self.shards.clone(),
                    rule: "`sweep` starts embedded servers on this host's CPUs; --addr targets \
                           one running server, so list at most one count"
                        .to_owned(),
                });
            }
            ShardSpec::List(requests) if requests.len() > 1 => {
                return Err(BenchArgsError::Shards {
                    value: self.shards.clone(),
                    rule: "--addr targets one running server, so list at most one count".to_owned(),
                });
            }
            ShardSpec::List(_) => {}
        }
        let embedded_only = [
            ("fsync", self.fsync.is_some()),
            ("write-mode", self.write_mode.is_some()),
            ("cpus", self.cpus.is_some()),
            ("no-pin", self.no_pin),
            ("io-driver", self.io_driver.is_some()),
            ("inbox-capacity", self.inbox_capacity.is_some()),
            ("idle-poll-us", self.idle_poll_us.is_some()),
            // The metadata workload's baseline file goes there instead (see `--workload`).
            (
                "data-root",
                self.data_root.is_some() && self.workload != Workload::Metadata,
            ),
        ];
        if let Some((flag, _)) = embedded_only.iter().find(|(_, given)| *given) {
            return Err(BenchArgsError::EmbeddedOnly { flag });
        }
        Ok(ServerTarget::External {
            addr: addr.clone(),
            pid: self.server_pid,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(flatten)]
        bench: BenchArgs,
    }

    fn parse(flags: &[&str]) -> BenchArgs {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(flags);
        Cli::try_parse_from(argv).unwrap().bench
    }

    fn error(flags: &[&str]) -> String {
        parse(flags).validate().unwrap_err().to_string()
    }

    /// The first line of clap's refusal (a `value_parser` error names the flag and the value).
    fn parse_error(flags: &[&str]) -> String {
        let mut argv = vec!["bench"];
        argv.extend_from_slice(flags);
        let error = Cli::try_parse_from(argv).unwrap_err().to_string();
        error.lines().next().unwrap().to_string()
    }

    #[test]
    fn clap_definition_is_consistent_and_help_teaches() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--payload-file <FILE>"), "{help}");
        for taught in [
            "--repeat <K>",
            "`sweep` alone runs 1, 2, 4, ...",
            "--duration <DURATION>",
            "`10s`, `2m`",
            "`1KiB`",
            "--csv <FILE>",
            "--charts <DIR>",
            "--compare <OLD.json>",
            "--efficiency-margin <F>",
        ] {
            assert!(help.contains(taught), "{taught}: {help}");
        }
    }

    #[test]
    fn defaults_are_two_by_two_one_million_messages_of_1000_bytes() {
        let plan = parse(&[]).validate().unwrap();
        assert_eq!(
            plan,
            BenchPlan {
                shard_requests: vec![ShardRequest::All],
                repeat_count: 1,
                efficiency_margin: EFFICIENCY_MARGIN_DEFAULT,
                server: ServerTarget::Embedded {
                    options: ServerOptions::default(),
                    data_root: None
                },
                producer_count: 2,
                consumer_count: 2,
                partition_count: 2,
                batch_message_count: 1000,
                stop: ProduceStop::MessageCount(1_000_000),
                payload: PayloadChoice::Size(1000),
                concurrent: false,
                json: None,
                csv: None,
                charts: None,
                compare: None,
                stream_id: 1,
                workload: Workload::ProduceConsume,
                metadata_op_count: 200,
                metadata_clients: MetadataClients::ONE,
                baseline_root: None,
                consumer_group: None,
            }
        );
    }

    #[test]
    fn target_command_parses() {
        let flags = "--shards 1,2 --fsync never --producers 4 --consumers 4 --partitions 8 \
                     --duration 10 --json out.json";
        let plan = parse(&flags.split_whitespace().collect::<Vec<_>>())
            .validate()
            .unwrap();
        assert_eq!(
            plan.shard_requests,
            vec![ShardRequest::Count(1), ShardRequest::Count(2)]
        );
        assert_eq!(plan.partition_count, 8);
        assert_eq!(plan.stop, ProduceStop::Duration(Duration::from_secs(10)));
        let ServerTarget::Embedded { options, .. } = &plan.server else {
            panic!("embedded")
        };
        assert_eq!(options.fsync.as_deref(), Some("never"));
    }

    #[test]
    fn zero_counts_are_rejected_naming_the_flag() {
        for (value, quoted) in [("0", "0"), ("10000000001", "10000000001"), ("-1", "-1")] {
            assert_eq!(
                parse_error(&["--messages", value]),
                format!(
                    "error: invalid value '{value}' for '--messages <M>': \"{quoted}\" is not a \
                     message count: use a whole number from 1 to 10000000000: {MESSAGE_COUNT_RULE}"
                )
            );
        }
        parse(&["--messages", "10000000000"]).validate().unwrap();
        assert_eq!(
            parse_error(&["--batch", "0"]),
            "error: invalid value '0' for '--batch <B>': \"0\" is not a batch message count: use \
             a whole number from 1 to 1048576"
        );
        assert_eq!(
            parse_error(&["--producers", "-2"]),
            "error: invalid value '-2' for '--producers <P>': \"-2\" is not a producer count: use \
             a whole number from 1 to 1024"
        );
        assert_eq!(
            parse_error(&["--consumers", "0"]),
            "error: invalid value '0' for '--consumers <C>': \"0\" is not a consumer count: use \
             a whole number from 1 to 1024"
        );
        assert_eq!(
            error(&["--message-size", "0"]),
            "--message-size must be at least 1"
        );
    }

    #[test]
    fn conflicting_flags_are_rejected_with_the_rule() {
        assert_eq!(
            error(&["--message-size", "100", "--payload-file", "x.log"]),
            "--message-size and --payload-file cannot both be given: payloads are either \
             fixed-size or the lines of a file"
        );
        assert_eq!(
            error(&["--messages", "10", "--duration", "5"]),
            "--messages and --duration cannot both be given: a run stops after a message count \
             or after a time, not both"
        );
    }

    #[test]
    fn server_cpu_flags_are_checked_before_the_server_starts() {
        assert_eq!(
            error(&["--cpus", "0-1", "--no-pin"]),
            "--cpus and --no-pin cannot both be given: --cpus pins shards to CPUs"
        );
        assert_eq!(
            error(&["--cpus", "1,1,1"]),
            r#"invalid --cpus value "1,1,1": CPU 1 is listed more than once"#
        );
        assert!(parse(&["--cpus", "0-1"]).validate().is_ok());
    }

    #[test]
    fn partition_rules_are_enforced() {
        assert_eq!(
            error(&["--producers", "4", "--partitions", "2", "--consumers", "1"]),
            "--partitions 2 is below --producers 4: every producer needs a partition of its own"
        );
        assert_eq!(
            error(&["--consumers", "3"]),
            "--consumers 3 exceeds --partitions 2: each partition is read by one consumer"
        );
        assert_eq!(
            parse_error(&["--producers", "2000"]),
            "error: invalid value '2000' for '--producers <P>': \"2000\" is not a producer \
             count: use a whole number from 1 to 1024"
        );
        for value in ["0", "-1", "4097", "1.5"] {
            assert_eq!(
                parse_error(&["--partitions", value]),
                format!(
                    "error: invalid value '{value}' for '--partitions <K>': \"{value}\" is not a \
                     partition count: use a whole number from 1 to 4096"
                )
            );
        }
    }

    #[test]
    fn negative_numbers_reach_the_value_parsers() {
        for (flag, value, what) in [
            (
                "--inbox-capacity",
                "-1",
                "an inbox capacity: use a whole number from 1 to 1048576",
            ),
            (
                "--idle-poll-us",
                "-5",
                "an idle poll in microseconds: use a whole number from 0 to 10000",
            ),
            (
                "--stream-id",
                "-1",
                "a stream id: use a whole number from 1 to 4294967295",
            ),
            (
                "--server-pid",
                "-1",
                "a process id: use a whole number from 1 to 2147483647",
            ),
            (
                "--metadata-ops",
                "-3",
                "a metadata op count: use a whole number from 1 to 100000",
            ),
        ] {
            let line = parse_error(&[flag, value]);
            assert!(
                line.starts_with(&format!("error: invalid value '{value}' for '{flag} <"))
                    && line.ends_with(&format!("\"{value}\" is not {what}")),
                "{line}"
            );
        }
        for (flag, value) in [("--duration", "-5"), ("--message-size", "-1")] {
            let line = parse_error(&[flag, value]);
            assert!(
                line.starts_with(&format!("error: invalid value '{value}' for '{flag} <")),
                "{line}"
            );
        }
        assert_eq!(
            error(&["--efficiency-margin", "-0.5"]),
            "--efficiency-margin -0.5: expected a fraction above 0 and at most 1, the share of the \
             1-shard msgs per server-CPU-second a larger count must keep (e.g. 0.8)"
        );
    }

    #[test]
    fn shard_lists_are_checked() {
        assert_eq!(
            parse_shards("1, 2,all").unwrap(),
            ShardSpec::List(vec![
                ShardRequest::Count(1),
                ShardRequest::Count(2),
                ShardRequest::All
            ])
        );
        // Refused by clap (exit 2), each count by serve's rule.
        for (value, rule) in [
            ("0", "shard count must be between 1 and 1024"),
            ("1025", "shard count must be between 1 and 1024"),
            (
                "-1",
                "expected `all` or a whole number of shards from 1 to 1024",
            ),
            ("1,0", "\"0\": shard count must be between 1 and 1024"),
            (
                "1,x",
                "\"x\": expected `all` or a whole number of shards from 1 to 1024",
            ),
            (
                "2,2",
                "count 2 is listed twice (entries 1 and 2): each count runs once per round; list \
                 it once (--repeat runs rounds)",
            ),
            (
                "all,1,all",
                "`all` is listed twice (entries 1 and 3): each count runs once per round; list \
                 it once (--repeat runs rounds)",
            ),
            (
                "1,,2",
                "entry 2 of the list is empty: separate the counts with single commas (e.g. 1,2,4)",
            ),
            (
                "1,2,",
                "entry 3 of the list is empty: separate the counts with single commas (e.g. 1,2,4)",
            ),
        ] {
            assert_eq!(
                parse_error(&["--shards", value]),
                format!("error: invalid value '{value}' for '--shards <LIST>': {rule}")
            );
        }
        assert_eq!(parse(&["--shards", "1024"]).shards, "1024");
    }

    #[test]
    fn all_listed_with_the_count_it_resolves_to_is_refused() {
        let allowed = runtime::allowed_cpus().unwrap();
        let one = allowed[0].to_string();
        assert_eq!(
            error(&["--shards", "all,1", "--cpus", &one]),
            "--shards all,1: entries 1 and 2 are the same count: `all` resolves to 1 shard here \
             (one per allowed core, or per --cpus entry); list the count once"
        );
        if let [first, second, ..] = allowed[..] {
            let two = format!("{first},{second}");
            assert_eq!(
                error(&["--shards", "1,2,all", "--cpus", &two]),
                "--shards 1,2,all: entries 2 and 3 are the same count: `all` resolves to 2 \
                 shards here (one per allowed core, or per --cpus entry); list the count once"
            );
        }
        // A different count is no repeat (the topology check before the first run refuses 2
        // shards on one core, not this one).
        let plan = parse(&["--shards", "all,2", "--cpus", &one])
            .validate()
            .unwrap();
        assert_eq!(
            plan.shard_requests,
            vec![ShardRequest::All, ShardRequest::Count(2)]
        );
    }

    #[test]
    fn sweep_doubles_up_to_the_all_count_and_ends_on_it() {
        let table: [(u16, &[u16]); 9] = [
            (1, &[1]),
            (2, &[1, 2]),
            (3, &[1, 2, 3]),
            (4, &[1, 2, 4]),
            (6, &[1, 2, 4, 6]),
            (8, &[1, 2, 4, 8]),
            (12, &[1, 2, 4, 8, 12]),
            (1024, &[1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024]),
            (
                u16::MAX,
                &[
                    1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384, 32768,
                    65535,
                ],
            ),
        ];
        for (all_count, expected) in table {
            assert_eq!(sweep_counts(all_count), expected, "all = {all_count}");
        }
    }

    #[test]
    fn sweep_expands_against_what_all_resolves_to() {
        // `--cpus` fixes what `all` resolves to (no quota applies to an explicit list).
        let allowed = runtime::allowed_cpus().unwrap();
        for take in 1..=allowed.len().min(3) {
            let cpus = allowed[..take]
                .iter()
                .map(usize::to_string)
                .collect::<Vec<_>>()
                .join(",");
            let plan = parse(&["--shards", "sweep", "--cpus", &cpus])
                .validate()
                .unwrap();
            let expected: Vec<ShardRequest> = sweep_counts(u16::try_from(take).unwrap())
                .into_iter()
                .map(ShardRequest::Count)
                .collect();
            assert_eq!(plan.shard_requests, expected, "--cpus {cpus}");
        }
        // Without --cpus: the affinity mask, capped by a cgroup quota, as `serve --shards all`.
        let all_count = runtime::Topology::resolve(&runtime::TopologyConfig {
            shards: runtime::ShardCountArg::All,
            cpus: None,
            pin: false,
        })
        .unwrap()
        .shard_count();
        let plan = parse(&["--shards", "sweep", "--no-pin"])
            .validate()
            .unwrap();
        assert_eq!(
            plan.shard_requests.last(),
            Some(&ShardRequest::Count(all_count))
        );
        assert_eq!(plan.shard_requests[0], ShardRequest::Count(1));
    }

    #[test]
    fn sweep_stands_alone_and_needs_the_embedded_server() {
        assert_eq!(
            parse_error(&["--shards", "1,sweep"]),
            "error: invalid value '1,sweep' for '--shards <LIST>': `sweep` stands alone: it \
             already runs 1, 2, 4, ... up to the allowed CPUs"
        );
        assert_eq!(
            error(&["--shards", "sweep", "--addr", "127.0.0.1:9000"]),
            "--shards sweep: `sweep` starts embedded servers on this host's CPUs; --addr targets \
             one running server, so list at most one count"
        );
    }

    #[test]
    fn repeat_is_bounded_and_needs_fresh_servers() {
        for value in ["0", "101", "-1"] {
            assert_eq!(
                parse_error(&["--repeat", value]),
                format!(
                    "error: invalid value '{value}' for '--repeat <K>': \"{value}\" is not a \
                     repeat count: use a whole number from 1 to 100: {REPEAT_COUNT_RULE}"
                )
            );
        }
        assert_eq!(
            parse(&["--repeat", "100"]).validate().unwrap().repeat_count,
            100
        );
        assert_eq!(
            error(&["--repeat", "2", "--addr", "127.0.0.1:9000"]),
            "--repeat and --addr cannot both be given: each repeat needs a fresh server, where \
             the bench stream does not exist yet; against a running server, run the bench again \
             with another --stream-id"
        );
    }

    #[test]
    fn efficiency_margin_is_a_fraction_up_to_one() {
        for bad in ["0", "-0.5", "1.5", "NaN"] {
            assert_eq!(
                error(&[&format!("--efficiency-margin={bad}")]),
                format!(
                    "--efficiency-margin {bad}: expected a fraction above 0 and at most 1, the \
                     share of the 1-shard msgs per server-CPU-second a larger count must keep \
                     (e.g. 0.8)"
                )
            );
        }
        for (text, margin) in [("1", 1.0), ("0.5", 0.5)] {
            let plan = parse(&["--efficiency-margin", text]).validate().unwrap();
            assert!((plan.efficiency_margin - margin).abs() < f64::EPSILON);
        }
    }

    #[test]
    fn durations_take_units_and_plain_seconds() {
        for (text, seconds) in [("10", 10), ("10s", 10), ("2m", 120), ("2000ms", 2)] {
            let plan = parse(&["--duration", text]).validate().unwrap();
            assert_eq!(
                plan.stop,
                ProduceStop::Duration(Duration::from_secs(seconds)),
                "{text}"
            );
        }
        let flag = "error: invalid value";
        assert_eq!(
            parse_error(&["--duration", "500ms"]),
            format!(
                "{flag} '500ms' for '--duration <DURATION>': \"500ms\" is under a second: a run \
                 needs at least 1 s to measure throughput rather than its own start (e.g. 10s, 2m)"
            )
        );
        assert_eq!(
            parse_error(&["--duration", "1500ms"]),
            format!(
                "{flag} '1500ms' for '--duration <DURATION>': \"1500ms\" is not a whole number \
                 of seconds: runs are timed in seconds (e.g. 10s, 2m)"
            )
        );
        assert_eq!(
            parse_error(&["--duration", "2h"]),
            format!(
                "{flag} '2h' for '--duration <DURATION>': \"2h\" is not a duration: use a whole \
                 number of seconds (5, 5s), milliseconds (300ms) or minutes (2m), no other unit, \
                 at most 86400 s (1440m) for the bench duration"
            )
        );
        assert_eq!(
            parse_error(&["--duration", "1441m"]),
            format!(
                "{flag} '1441m' for '--duration <DURATION>': \"1441m\" exceeds the largest \
                 bench duration, 86400 s (1440m)"
            )
        );
        assert!(parse(&["--duration", "1440m"]).validate().is_ok());
    }

    #[test]
    fn message_sizes_take_binary_suffixes_and_plain_bytes() {
        for (text, bytes) in [
            ("1000", 1000),
            ("1KiB", 1024),
            ("4 kib", 4096),
            ("1MiB", 1 << 20),
        ] {
            let plan = parse(&["--message-size", text, "--batch", "10"])
                .validate()
                .unwrap();
            assert_eq!(plan.payload, PayloadChoice::Size(bytes), "{text}");
        }
        assert_eq!(
            parse_error(&["--message-size", "1KB"]),
            "error: invalid value '1KB' for '--message-size <BYTES>': \"1KB\" is not a size: use \
             bytes, an integer (e.g. 67108864), or one with a suffix KiB, MiB or GiB (e.g. 64MiB)"
        );
        assert_eq!(
            error(&["--message-size", "0KiB"]),
            "--message-size must be at least 1"
        );
    }

    /// Issue 12 item 3: `--write-mode` is checked here and passed to the embedded server.
    #[test]
    fn write_mode_is_checked_and_passed_to_the_embedded_server() {
        assert_eq!(
            parse_error(&["--write-mode", "odirect"]),
            "error: invalid value 'odirect' for '--write-mode <MODE>': expected buffered or direct"
        );
        assert_eq!(
            error(&["--addr", "127.0.0.1:9000", "--write-mode", "direct"]),
            "--write-mode configures the embedded server and cannot be used with --addr; \
             configure the running server instead"
        );
        let plan = parse(&["--write-mode", "direct"]).validate().unwrap();
        let ServerTarget::Embedded { options, .. } = &plan.server else {
            panic!("{:?}", plan.server);
        };
        assert_eq!(options.write_mode.as_deref(), Some("direct"));
    }

    #[test]
    fn addr_rules_are_enforced() {
        assert_eq!(
            error(&["--addr", "127.0.0.1:9000", "--shards", "1,2"]),
            "--shards 1,2: --addr targets one running server, so list at most one count"
        );
        assert_eq!(
            error(&["--addr", "127.0.0.1:9000", "--fsync", "never"]),
            "--fsync configures the embedded server and cannot be used with --addr; configure \
             the running server instead"
        );
        assert_eq!(
            error(&["--server-pid", "42"]),
            "--server-pid needs --addr: the embedded server's pid is known"
        );
        let plan = parse(&["--addr", "localhost:9000", "--server-pid", "42"])
            .validate()
            .unwrap();
        assert_eq!(
            plan.server,
            ServerTarget::External {
                addr: "localhost:9000".to_string(),
                pid: Some(42)
            }
        );
    }

    /// New-user review: bad `--fsync`, `--io-driver` and `--write-mode` values exited 1 from
    /// validate() while `serve` exits 2 for them; clap's value parsers now refuse them, naming
    /// the flag, the value and the rule.
    #[test]
    fn server_flag_values_are_checked() {
        for good in ["always", "never", "interval=5"] {
            assert_eq!(check_fsync(good), Ok(()));
            assert_eq!(parse(&["--fsync", good]).fsync.as_deref(), Some(good));
        }
        for (flag, value, rule) in [
            (
                "--fsync <POLICY>",
                "sometimes",
                "expected always, never or interval=MS with MS from 1 to 3600000",
            ),
            (
                "--fsync <POLICY>",
                "interval=0",
                "expected always, never or interval=MS with MS from 1 to 3600000",
            ),
            (
                "--fsync <POLICY>",
                "interval=3600001",
                "expected always, never or interval=MS with MS from 1 to 3600000",
            ),
            ("--io-driver <DRIVER>", "epoll", "expected io-uring or poll"),
            (
                "--write-mode <MODE>",
                "odirect",
                "expected buffered or direct",
            ),
        ] {
            let name = flag.split_once(' ').unwrap().0;
            assert_eq!(
                parse_error(&[name, value]),
                format!("error: invalid value '{value}' for '{flag}': {rule}")
            );
        }
        // validate() stays the backstop for values set without clap.
        let mut args = parse(&[]);
        args.fsync = Some("interval=0".to_owned());
        assert_eq!(
            args.validate().unwrap_err().to_string(),
            "--fsync interval=0: expected always, never or interval=MS with MS from 1 to 3600000"
        );
        let mut args = parse(&[]);
        args.io_driver = Some("epoll".to_owned());
        assert_eq!(
            args.validate().unwrap_err().to_string(),
            "--io-driver epoll: expected io-uring or poll"
        );
        let mut args = parse(&[]);
        args.write_mode = Some("odirect".to_owned());
        assert_eq!(
            args.validate().unwrap_err().to_string(),
            "--write-mode odirect: expected buffered or direct"
        );
    }

    #[test]
    fn issue11_2_consumer_group_mode_parses_and_refuses_what_it_cannot_do() {
        use crate::bench::group::GroupMode;
        assert_eq!(parse(&[]).validate().unwrap().consumer_group, None);
        let plan = parse(&["--consumer-group"]).validate().unwrap();
        assert_eq!(plan.consumer_group, Some(GroupMode { churn: false }));
        let plan = parse(&["--consumer-group", "--group-churn"])
            .validate()
            .unwrap();
        assert_eq!(plan.consumer_group, Some(GroupMode { churn: true }));
        assert_eq!(
            parse_error(&["--group-churn"]),
            "error: the following required arguments were not provided:",
            "churn needs the group mode"
        );
        assert!(
            parse_error(&["--consumer-group", "--concurrent"]).contains("cannot be used with"),
            "the group mode reads after the produce phase"
        );
        assert_eq!(
            error(&["--workload", "metadata", "--consumer-group"]),
            "--consumer-group applies to --workload produce-consume only, not to --workload metadata"
        );
    }

    #[test]
    fn the_metadata_workload_parses_with_its_defaults() {
        let plan = parse(&["--workload", "metadata"]).validate().unwrap();
        assert_eq!(plan.workload, Workload::Metadata);
        assert_eq!(plan.metadata_op_count, 200);
        assert_eq!(plan.baseline_root, None);
        let plan = parse(&[
            "--workload",
            "metadata",
            "--metadata-ops",
            "20",
            "--shards",
            "1",
        ])
        .validate()
        .unwrap();
        assert_eq!(plan.metadata_op_count, 20);
        assert_eq!(plan.shard_requests, vec![ShardRequest::Count(1)]);
        assert_eq!(
            parse(&[]).validate().unwrap().workload,
            Workload::ProduceConsume
        );
    }

    #[test]
    fn metadata_ops_must_be_in_range() {
        for value in ["0", "100001"] {
            assert_eq!(
                parse_error(&["--workload", "metadata", "--metadata-ops", value]),
                format!(
                    "error: invalid value '{value}' for '--metadata-ops <N>': \"{value}\" is not \
                     a metadata op count: use a whole number from 1 to 100000"
                )
            );
        }
    }

    #[test]
    fn flags_of_the_other_workload_are_rejected() {
        assert_eq!(
            error(&["--metadata-ops", "5"]),
            "--metadata-ops applies to --workload metadata only, not to --workload produce-consume"
        );
        for flags in [
            &["--producers", "3"][..],
            &["--consumers", "1"],
            &["--partitions", "2"],
            &["--batch", "10"],
            &["--messages", "10"],
            &["--message-size", "10"],
            &["--payload-file", "x.log"],
            &["--concurrent"],
            &["--stream-id", "7"],
            &["--repeat", "3"],
            &["--efficiency-margin", "0.5"],
            &["--csv", "x.csv"],
            &["--charts", "charts"],
            &["--compare", "old.json"],
        ] {
            let mut argv = vec!["--workload", "metadata"];
            argv.extend_from_slice(flags);
            let flag = flags[0].trim_start_matches("--");
            assert_eq!(
                error(&argv),
                format!(
                    "--{flag} applies to --workload produce-consume only, not to --workload \
                     metadata"
                )
            );
        }
        // Typed defaults cannot be told from absent ones, and are harmless.
        assert!(
            parse(&["--workload", "metadata", "--producers", "2"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn clients_parse_with_a_count_or_a_duration() {
        let plan = parse(&["--workload", "metadata"]).validate().unwrap();
        assert_eq!(plan.metadata_clients, MetadataClients::ONE);
        let plan = parse(&["--workload", "metadata", "--clients", "64"])
            .validate()
            .unwrap();
        assert_eq!(
            plan.metadata_clients,
            MetadataClients {
                count: 64,
                duration: None
            }
        );
        let plan = parse(&[
            "--workload",
            "metadata",
            "--clients",
            "1024",
            "--duration",
            "5",
        ])
        .validate()
        .unwrap();
        assert_eq!(
            plan.metadata_clients,
            MetadataClients {
                count: 1024,
                duration: Some(Duration::from_secs(5))
            }
        );
        // A produce-consume run's --duration is its own, not the metadata clients'.
        let plan = parse(&["--duration", "5"]).validate().unwrap();
        assert_eq!(plan.metadata_clients, MetadataClients::ONE);
    }

    #[test]
    fn clients_out_of_range_are_rejected_naming_flag_value_and_rule() {
        for value in ["0", "2000"] {
            assert_eq!(
                parse_error(&["--workload", "metadata", "--clients", value]),
                format!(
                    "error: invalid value '{value}' for '--clients <N>': \"{value}\" is not a \
                     client count: use a whole number from 1 to 1024: {CLIENT_COUNT_RULE}"
                )
            );
        }
        assert!(
            parse(&["--workload", "metadata", "--clients", "1"])
                .validate()
                .is_ok()
        );
    }

    #[test]
    fn clients_belong_to_the_metadata_workload_and_duration_needs_two() {
        for count in ["1", "4"] {
            assert_eq!(
                error(&["--clients", count]),
                "--clients applies to --workload metadata only, not to --workload \
                 produce-consume"
            );
        }
        assert_eq!(
            error(&["--workload", "metadata", "--duration", "3"]),
            "--duration 3 with --workload metadata times the concurrent clients, so it needs \
             --clients 2 or more; the single-client rounds are counted by --metadata-ops"
        );
        assert_eq!(
            parse_error(&[
                "--workload",
                "metadata",
                "--clients",
                "2",
                "--duration",
                "0"
            ]),
            "error: invalid value '0' for '--duration <DURATION>': \"0\" is under a second: a \
             run needs at least 1 s to measure throughput rather than its own start (e.g. 10s, 2m)"
        );
    }

    #[test]
    fn data_root_names_the_baseline_dir_of_a_metadata_run_on_addr() {
        let plan = parse(&[
            "--workload",
            "metadata",
            "--addr",
            "127.0.0.1:9000",
            "--data-root",
            "/srv/disk",
        ])
        .validate()
        .unwrap();
        assert_eq!(plan.baseline_root, Some(PathBuf::from("/srv/disk")));
        assert_eq!(
            error(&["--addr", "127.0.0.1:9000", "--data-root", "/srv/disk"]),
            "--data-root configures the embedded server and cannot be used with --addr; \
             configure the running server instead"
        );
        let embedded = parse(&["--workload", "metadata", "--data-root", "/srv/disk"])
            .validate()
            .unwrap();
        assert_eq!(embedded.baseline_root, None);
        assert_eq!(
            embedded.server,
            ServerTarget::Embedded {
                options: ServerOptions::default(),
                data_root: Some(PathBuf::from("/srv/disk"))
            }
        );
    }

    #[test]
    fn help_teaches_the_workloads() {
        use clap::CommandFactory as _;
        let help = Cli::command().render_long_help().to_string();
        assert!(help.contains("--workload <WORKLOAD>"), "{help}");
        assert!(help.contains("produce-consume"), "{help}");
        assert!(help.contains("Metadata commit latency"), "{help}");
        assert!(help.contains("--metadata-ops <N>"), "{help}");
    }

    #[test]
    fn oversized_batches_are_rejected() {
        assert_eq!(
            check_batch_size(1000, 1000, MESSAGE_SIZE_MAX_DEFAULT, DEFAULT_LIMIT_OWNER),
            Ok(())
        );
        assert_eq!(
            error(&["--batch", "100000", "--message-size", "1000"]),
            "--batch 100000 messages of up to 1000 payload bytes make a 103200288-byte request \
             frame, above the server's default --max-message-size 67108864; lower --batch or the \
             payload size"
        );
        // 256 + 32 + 10 × (32 + 2000) = 20608 bytes.
        assert_eq!(
            check_batch_size(10, 2000, 1024, "the server at 127.0.0.1:8090's")
                .unwrap_err()
                .to_string(),
            "--batch 10 messages of up to 2000 payload bytes make a 20608-byte request frame, \
             above the server at 127.0.0.1:8090's --max-message-size 1024; lower --batch or the \
             payload size"
        );
        // 288 + 2 × 232 = 752 bytes: a frame exactly at the limit fits.
        assert_eq!(check_batch_size(2, 200, 752, "x"), Ok(()));
        assert!(check_batch_size(2, 200, 751, "x").is_err());
    }
}
