//! The bench report: figures per run and phase (throughput, CPU, latency), per shard, the table on
//! stdout and the `--json` document.
//!
//! Must never measure anything itself: it only turns measurements into figures. A figure that
//! cannot be computed (no CPU data, zero CPU time) is `null` in JSON and `n/a` in the table, never
//! a made-up number.

use std::fmt::Write as _;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::cpu::PhaseCpu;
use super::host_cpu::HostCpu;
use super::limits::{LATENCY_SIGNIFICANT_DIGITS, LATENCY_US_MAX, PAGE_CACHE_NOTE_BYTES_MIN};
use super::sweep::{CountSummary, Recommendation};

/// An empty latency histogram, µs, 1 µs .. [`LATENCY_US_MAX`].
pub fn new_latency_histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, LATENCY_US_MAX, LATENCY_SIGNIFICANT_DIGITS)
        .expect("constant histogram bounds are valid")
}

/// A latency histogram holding `values` (µs): test fixtures of this module and its siblings.
#[cfg(test)]
pub fn histogram_of(values: &[u64]) -> Histogram<u64> {
    let mut histogram = new_latency_histogram();
    for value in values {
        histogram
            .record(*value)
            .expect("test values are within the histogram's bounds");
    }
    histogram
}

/// Latency percentiles, µs. All zero when nothing was recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct LatencySummary {
    pub p50: u64,
    pub p90: u64,
    pub p99: u64,
    pub p999: u64,
    pub max: u64,
}

impl LatencySummary {
    pub fn from_histogram(histogram: &Histogram<u64>) -> LatencySummary {
        if histogram.is_empty() {
            return LatencySummary::default();
        }
        LatencySummary {
            p50: histogram.value_at_quantile(0.50),
            p90: histogram.value_at_quantile(0.90),
            p99: histogram.value_at_quantile(0.99),
            p999: histogram.value_at_quantile(0.999),
            max: histogram.max(),
        }
    }
}

/// Figures of one phase (produce or consume).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PhaseFigures {
    pub msgs_per_sec: f64,
    /// Payload bytes (no headers) per second, in 10^6 bytes.
    pub mb_per_sec: f64,
    pub shard_cpu_seconds: Option<f64>,
    pub io_worker_cpu_seconds: Option<f64>,
    pub server_cpu_seconds: Option<f64>,
    /// The headline: messages per second of server CPU (shards + io workers + the rest).
    pub msgs_per_server_cpu_second: Option<f64>,
    pub msgs_per_shard_cpu_second: Option<f64>,
    /// All CPUs' busy time on the host during the phase less the bench process's own
    /// (`host_cpu`): the server, the kernel work it causes wherever it runs (writeback by
    /// kworker threads under `--fsync never`, softirqs), and any other tenant of the host, so a
    /// ceiling on what the server costs.
    pub host_cpu_seconds: Option<f64>,
    /// `host_cpu_seconds` per 10^9 payload bytes of the phase.
    pub host_cpu_seconds_per_gb: Option<f64>,
    /// The bench process's own CPU over the phase (what `host_cpu_seconds` leaves out).
    pub load_generator_cpu_seconds: Option<f64>,
    /// Wall seconds of the `syncfs(2)` of the embedded server's data directory that ended the
    /// host window of the produce phase (`writeback`), so that writeback deferred by `--fsync
    /// never` is inside `host_cpu_seconds`; outside `msgs_per_sec` and latency. `null` for the
    /// consume phase and with `--addr` (a remote data directory cannot be flushed).
    pub writeback_flush_seconds: Option<f64>,
    /// Round trip per batch (produce) or per poll that returned new messages (consume).
    pub latency_us: LatencySummary,
    pub elapsed_seconds: f64,
    /// Requests answered with a retryable error (`Busy`) and sent again.
    pub busy_retries: u64,
}

/// One shard's share of a phase: the messages of the partitions it owns.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardPhase {
    pub messages: u64,
    pub msgs_per_sec: f64,
    pub mb_per_sec: f64,
    /// CPU of thread `shard-N`.
    pub cpu_seconds: Option<f64>,
    pub msgs_per_cpu_second: Option<f64>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ShardReport {
    pub shard: u16,
    pub partition_ids: Vec<u16>,
    pub produce: ShardPhase,
    pub consume: ShardPhase,
}

/// How the run was set up, as given and as resolved.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RunConfig {
    /// `embedded` or the `--addr` given.
    pub server: String,
    pub server_pid: Option<u32>,
    /// As requested (`all` or a number); the resolved count is the run's `shards`.
    pub shards_requested: String,
    pub producers: u32,
    pub consumers: u32,
    pub partitions: u32,
    pub batch_messages: u32,
    pub messages: Option<u64>,
    pub duration_seconds: Option<u64>,
    pub payload: String,
    pub concurrent: bool,
    pub fsync: String,
    /// `--write-mode` as given (`None`: the server default, `buffered`).
    pub write_mode: Option<String>,
    pub cpus: Option<String>,
    pub no_pin: bool,
    pub io_driver: Option<String>,
    pub inbox_capacity: Option<u32>,
    pub idle_poll_us: Option<u32>,
    pub stream_id: u32,
    /// Why CPU figures are missing or shared between phases; absent when they are complete.
    pub cpu_note: Option<String>,
    /// The embedded server's data directory (removed when the run ends); absent with `--addr`.
    pub data_dir: Option<String>,
    /// Whether `data_dir` is on tmpfs (memory), where fsync costs nothing; absent when unknown.
    pub data_dir_on_tmpfs: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RunReport {
    pub shards: u16,
    pub messages_sent: u64,
    pub messages_verified: u64,
    pub messages_lost: u64,
    /// The produce phase, flattened into the run.
    #[serde(flatten)]
    pub produce: PhaseFigures,
    pub consume: PhaseFigures,
    pub per_shard: Vec<ShardReport>,
    pub config: RunConfig,
    /// 1-based index of this run among the runs of its shard count (`--repeat`).
    pub repeat: u32,
    /// 0-based position of this run in the invocation (first run of a sequence vs later ones).
    pub sequence: u32,
    /// Set when the run moved enough bytes for the VM page-cache effects (README, Benchmarking)
    /// to matter, saying whether it is the first run of the sequence; absent otherwise.
    pub page_cache_note: Option<String>,
}

/// The `--json` document.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BenchReport {
    /// Every completed run, in the order they ran.
    pub runs: Vec<RunReport>,
    /// Median and spread per resolved shard count, ascending (`sweep::summarize` of `runs`).
    pub summary: Vec<CountSummary>,
    /// The recommended shard count and why; `null` when there is nothing to choose from (see
    /// `sweep::recommend`).
    pub recommendation: Option<Recommendation>,
}

/// What one phase measured.
#[derive(Debug)]
pub struct PhaseMeasurement {
    pub elapsed: Duration,
    /// Messages acknowledged (produce) or verified (consume), and their payload bytes.
    pub message_count: u64,
    pub payload_bytes: u64,
    /// `None` when the server's pid is unknown, or (consume, concurrent mode) when the produce
    /// figures cover both phases.
    pub cpu: Option<PhaseCpu>,
    /// `None` in the consume phase of a `--concurrent` run (the produce figure covers both).
    pub host_cpu: Option<HostCpu>,
    /// The `syncfs(2)` that ended the host window (`writeback`); `None` when none ran.
    pub writeback_flush: Option<Duration>,
    pub latency_us: Histogram<u64>,
    /// Per partition index: (messages, payload bytes).
    pub per_partition: Vec<(u64, u64)>,
    pub busy_retry_count: u64,
}

fn per_second(count: f64, elapsed: Duration) -> f64 {
    if elapsed.is_zero() {
        0.0
    } else {
        count / elapsed.as_secs_f64()
    }
}

/// `count / cpu_seconds`, absent when there is no CPU figure or it is zero (too short a phase
/// for the clock-tick resolution).
fn per_cpu_second(count: u64, cpu_seconds: Option<f64>) -> Option<f64> {
    cpu_seconds
        .filter(|seconds| *seconds > 0.0)
        .map(|seconds| count as f64 / seconds)
}

impl PhaseFigures {
    pub fn from_measurement(phase: &PhaseMeasurement) -> PhaseFigures {
        let cpu = phase.cpu.as_ref();
        let shard_cpu_seconds = cpu.map(|cpu| cpu.shard_cpu_seconds);
        let server_cpu_seconds = cpu.map(|cpu| cpu.server_cpu_seconds);
        PhaseFigures {
            msgs_per_sec: per_second(phase.message_count as f64, phase.elapsed),
            mb_per_sec: per_second(phase.payload_bytes as f64 / 1e6, phase.elapsed),
            shard_cpu_seconds,
            io_worker_cpu_seconds: cpu.map(|cpu| cpu.io_worker_cpu_seconds),
            server_cpu_seconds,
            msgs_per_server_cpu_second: per_cpu_second(phase.message_count, server_cpu_seconds),
            msgs_per_shard_cpu_second: per_cpu_second(phase.message_count, shard_cpu_seconds),
            host_cpu_seconds: phase.host_cpu.map(|host| host.host_cpu_seconds),
            host_cpu_seconds_per_gb: phase
                .host_cpu
                .and_then(|host| host.seconds_per_gb(phase.payload_bytes)),
            load_generator_cpu_seconds: phase.host_cpu.map(|host| host.load_generator_cpu_seconds),
            writeback_flush_seconds: phase.writeback_flush.map(|flush| flush.as_secs_f64()),
            latency_us: LatencySummary::from_histogram(&phase.latency_us),
            elapsed_seconds: phase.elapsed.as_secs_f64(),
            busy_retries: phase.busy_retry_count,
        }
    }
}

/// Per-shard figures: shard `s` gets the partitions whose owner shard is `s`. `owners[i]` is the
/// owner shard of partition index `i`; every shard below `shard_count` is listed.
pub fn per_shard_reports(
    shard_count: u16,
    partition_ids: &[u16],
    owners: &[u16],
    produce: &PhaseMeasurement,
    consume: &PhaseMeasurement,
) -> Vec<ShardReport> {
    assert_eq!(partition_ids.len(), owners.len());
    let shard_phase = |shard: u16, phase: &PhaseMeasurement| {
        let (messages, payload_bytes) = owners
            .iter()
            .zip(&phase.per_partition)
            .filter(|(owner, _)| **owner == shard)
            .fold((0, 0), |(messages, bytes), (_, (count, size))| {
                (messages + count, bytes + size)
            });
        let cpu_seconds = phase
            .cpu
            .as_ref()
            .and_then(|cpu| cpu.per_shard_cpu_seconds.get(&shard).copied());
        ShardPhase {
            messages,
            msgs_per_sec: per_second(messages as f64, phase.elapsed),
            mb_per_sec: per_second(payload_bytes as f64 / 1e6, phase.elapsed),
            cpu_seconds,
            msgs_per_cpu_second: per_cpu_second(messages, cpu_seconds),
        }
    };
    (0..shard_count)
        .map(|shard| ShardReport {
            shard,
            partition_ids: partition_ids
                .iter()
                .zip(owners)
                .filter(|(_, owner)| **owner == shard)
                .map(|(partition_id, _)| *partition_id)
                .collect(),
            produce: shard_phase(shard, produce),
            consume: shard_phase(shard, consume),
        })
        .collect()
}

fn or_na(value: Option<f64>, decimals: usize) -> String {
    value.map_or_else(|| "n/a".to_string(), |value| format!("{value:.decimals$}"))
}

/// The run's setup in one line: `server=embedded producers=2 ... fsync=never`.
pub fn render_config(config: &RunConfig) -> String {
    let size = match (config.messages, config.duration_seconds) {
        (_, Some(seconds)) => format!("duration={seconds}s"),
        (messages, None) => format!("messages={}", messages.unwrap_or(0)),
    };
    // An external server's write mode is its own; the embedded one's is `--write-mode` or the
    // server default.
    let write_mode = match (&config.write_mode, config.data_dir.is_some()) {
        (Some(mode), _) => format!(" write-mode={mode}"),
        (None, true) => " write-mode=buffered (server default)".to_string(),
        (None, false) => String::new(),
    };
    format!(
        "server={} producers={} consumers={} partitions={} batch={} {size} payload={} fsync={}\
         {write_mode}{}",
        config.server,
        config.producers,
        config.consumers,
        config.partitions,
        config.batch_messages,
        config.payload,
        config.fsync,
        if config.concurrent { " concurrent" } else { "" },
    )
}

/// The table for one run, as printed on stdout.
pub fn render_run(run: &RunReport) -> String {
    let config = &run.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n== shards={} (requested {}) {}",
        run.shards,
        config.shards_requested,
        render_config(config),
    );
    let _ = writeln!(
        out,
        "{:<8} {:>12} {:>9} {:>10} {:>10} {:>10} {:>14} {:>9} {:>9} {:>14} {:>8} {:>8} {:>8} {:>8} {:>8}",
        "phase",
        "msgs/s",
        "MB/s",
        "shard-cpu",
        "io-wrk-cpu",
        "server-cpu",
        "msgs/srv-cpu-s",
        "host-cpu",
        "host-s/GB",
        "msgs/shd-cpu-s",
        "p50us",
        "p90us",
        "p99us",
        "p99.9us",
        "max-us"
    );
    for (name, phase) in [("produce", &run.produce), ("consume", &run.consume)] {
        let latency = phase.latency_us;
        let _ = writeln!(
            out,
            "{:<8} {:>12.0} {:>9.1} {:>10} {:>10} {:>10} {:>14} {:>9} {:>9} {:>14} {:>8} {:>8} {:>8} {:>8} {:>8}",
            name,
            phase.msgs_per_sec,
            phase.mb_per_sec,
            or_na(phase.shard_cpu_seconds, 2),
            or_na(phase.io_worker_cpu_seconds, 2),
            or_na(phase.server_cpu_seconds, 2),
            or_na(phase.msgs_per_server_cpu_second, 0),
            or_na(phase.host_cpu_seconds, 2),
            or_na(phase.host_cpu_seconds_per_gb, 3),
            or_na(phase.msgs_per_shard_cpu_second, 0),
            latency.p50,
            latency.p90,
            latency.p99,
            latency.p999,
            latency.max
        );
    }
    let _ = writeln!(
        out,
        "{:<6} {:<16} {:>12} {:>9} {:>9} {:>12} {:>9} {:>9}",
        "shard", "partitions", "prod msgs/s", "MB/s", "cpu-s", "cons msgs/s", "MB/s", "cpu-s"
    );
    for shard in &run.per_shard {
        let partitions = shard
            .partition_ids
            .iter()
            .map(u16::to_string)
            .collect::<Vec<_>>()
            .join(",");
        let _ = writeln!(
            out,
            "{:<6} {:<16} {:>12.0} {:>9.1} {:>9} {:>12.0} {:>9.1} {:>9}",
            shard.shard,
            if partitions.is_empty() {
                "-".to_string()
            } else {
                partitions
            },
            shard.produce.msgs_per_sec,
            shard.produce.mb_per_sec,
            or_na(shard.produce.cpu_seconds, 2),
            shard.consume.msgs_per_sec,
            shard.consume.mb_per_sec,
            or_na(shard.consume.cpu_seconds, 2),
        );
    }
    let _ = writeln!(
        out,
        "sent {} acknowledged messages in {:.2}s, verified {} in {:.2}s, lost {}; busy retries: \
         produce {}, consume {}",
        run.messages_sent,
        run.produce.elapsed_seconds,
        run.messages_verified,
        run.consume.elapsed_seconds,
        run.messages_lost,
        run.produce.busy_retries,
        run.consume.busy_retries
    );
    if let Some(note) = &config.cpu_note {
        let _ = writeln!(out, "note: {note}");
    }
    let _ = writeln!(out, "{}", writeback_line(run));
    for line in run_notes(run) {
        let _ = writeln!(out, "{line}");
    }
    out
}

/// One run in one line, for sequences with `--repeat` above 1 (`repeat_count`), followed by its
/// warnings and page-cache note, each on an indented line of its own:
/// `run 4: shards=2 repeat 2/3 | produce 2167265 msgs/s 2127660 msgs/srv-cpu-s 1.87 host-cpu
/// 1.870 host-s/GB p99 2049us | consume ... | lost 0`.
pub fn render_run_compact(run: &RunReport, repeat_count: u32) -> String {
    let phase = |name: &str, phase: &PhaseFigures| {
        format!(
            "{name} {:.0} msgs/s {} msgs/srv-cpu-s {} host-cpu {} host-s/GB p99 {}us",
            phase.msgs_per_sec,
            or_na(phase.msgs_per_server_cpu_second, 0),
            or_na(phase.host_cpu_seconds, 2),
            or_na(phase.host_cpu_seconds_per_gb, 3),
            phase.latency_us.p99
        )
    };
    let mut out = format!(
        "run {}: shards={} repeat {}/{repeat_count} | {} | {} | lost {}\n",
        run.sequence + 1,
        run.shards,
        run.repeat,
        phase("produce", &run.produce),
        phase("consume", &run.consume),
        run.messages_lost
    );
    for line in run.config.cpu_note.iter().chain(&run_warnings(run)) {
        let _ = writeln!(out, "  {line}");
    }
    out
}

/// What the figures mean and what may skew them: where the data was, what the latency columns
/// time, then [`run_warnings`].
pub fn run_notes(run: &RunReport) -> Vec<String> {
    let config = &run.config;
    let mut lines = vec![LATENCY_NOTE.to_string()];
    match &config.data_dir {
        Some(dir) => lines.push(format!(
            "data: {dir} (embedded server, fsync={}; removed when the run ends)",
            config.fsync
        )),
        None => lines.push(format!(
            "data: wherever the server at {} keeps it (fsync set by that server)",
            config.server
        )),
    }
    lines.extend(run_warnings(run));
    lines
}

/// How the produce phase's host figure treats deferred writeback: the flush that ended its
/// window, or why there was none.
pub fn writeback_line(run: &RunReport) -> String {
    match run.produce.writeback_flush_seconds {
        Some(seconds) => format!(
            "writeback: {seconds:.3} s flushing the data directory's filesystem (syncfs) after \
             the last ack, counted in produce host-cpu, not in msgs/s or latency"
        ),
        None => format!(
            "note: host figure excludes deferred writeback: remote server ({}); its dirty pages \
             are written back outside the produce window",
            run.config.server
        ),
    }
}

/// What may skew one run's figures: a data directory on tmpfs, partitions that load shards
/// unevenly, and the page-cache note (first run of the sequence or a later one).
pub fn run_warnings(run: &RunReport) -> Vec<String> {
    let mut lines = Vec::new();
    if run.config.data_dir_on_tmpfs == Some(true) {
        lines.push(
            "warning: the data directory is on tmpfs (memory): fsync costs nothing there, so \
             these figures do not measure a disk; pass --data-root on the disk you mean to measure"
                .to_string(),
        );
    }
    lines.extend(placement_warning(&run.per_shard));
    lines.extend(run.page_cache_note.clone());
    lines
}

/// The page-cache label of a run that produced `payload_bytes` and stands at `sequence`
/// (0-based) in its invocation; `None` below [`PAGE_CACHE_NOTE_BYTES_MIN`]. The first run's
/// page cache grows into guest memory nothing touched since the VM booted, which on a VM whose
/// host backs memory lazily costs a fault per page; later runs reuse the pages the earlier
/// runs freed (their data directories are removed). The two kinds are labelled so that a
/// reader does not compare them blindly (README, Benchmarking).
pub fn page_cache_note(payload_bytes: u64, sequence: u32) -> Option<String> {
    if payload_bytes < PAGE_CACHE_NOTE_BYTES_MIN {
        return None;
    }
    let written = format!("{} MiB of payload", payload_bytes >> 20);
    Some(if sequence == 0 {
        format!(
            "page cache: first run of this sequence ({written}): its page cache grew into memory \
             untouched since boot, slower to fault in on a VM than the memory later runs reuse; \
             compare it with later runs with care"
        )
    } else {
        format!(
            "page cache: run {} of this sequence ({written}): its page cache reuses memory the \
             earlier runs faulted in, which the first run could not; compare it with the first \
             run with care",
            sequence + 1
        )
    })
}

/// What the p50us..max-us columns time.
pub const LATENCY_NOTE: &str = "latency: p50us..max-us time one batch round trip per request \
     (produce: a SendMessages batch until its acknowledgement; consume: a poll until its reply)";

/// A warning when the partitions do not load every shard evenly (some shard owns more partitions
/// than another, or none), naming how many each owns.
pub fn placement_warning(per_shard: &[ShardReport]) -> Option<String> {
    let counts: Vec<usize> = per_shard
        .iter()
        .map(|shard| shard.partition_ids.len())
        .collect();
    let (min, max) = (counts.iter().min()?, counts.iter().max()?);
    if min == max {
        return None;
    }
    let owned = per_shard
        .iter()
        .map(|shard| format!("shard {} owns {}", shard.shard, shard.partition_ids.len()))
        .collect::<Vec<_>>()
        .join(", ");
    Some(format!(
        "warning: partitions are spread unevenly over the {shard_count} shards ({owned}); pass \
         --partitions as a multiple of {shard_count} to load every shard evenly",
        shard_count = per_shard.len()
    ))
}

/// Each run's messages per server-CPU-second relative to the 1-shard run (or, without one, to
/// the first run); `None` with fewer than two runs.
pub fn render_ratios(runs: &[RunReport]) -> Option<String> {
    if runs.len() < 2 {
        return None;
    }
    let base = runs.iter().find(|run| run.shards == 1).unwrap_or(&runs[0]);
    let mut out = format!(
        "msgs per server-CPU-second relative to the {}-shard run:",
        base.shards
    );
    for run in runs {
        let ratio = run
            .produce
            .msgs_per_server_cpu_second
            .zip(base.produce.msgs_per_server_cpu_second)
            .map_or_else(
                || "n/a".to_string(),
                |(value, base_value)| format!("{:.2}x", value / base_value),
            );
        let noun = if run.shards == 1 { "shard" } else { "shards" };
        let _ = write!(out, " {} {noun} {ratio};", run.shards);
    }
    out.pop();
    Some(out)
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are the exact quotients computed"
)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn phase(cpu: Option<PhaseCpu>) -> PhaseMeasurement {
        PhaseMeasurement {
            elapsed: Duration::from_secs(2),
            message_count: 4000,
            payload_bytes: 4_000_000,
            host_cpu: cpu.as_ref().map(|cpu| HostCpu {
                host_busy_cpu_seconds: cpu.server_cpu_seconds + 1.5,
                load_generator_cpu_seconds: 1.0,
                host_cpu_seconds: cpu.server_cpu_seconds + 0.5,
            }),
            writeback_flush: cpu.as_ref().map(|_| Duration::from_millis(250)),
            cpu,
            latency_us: histogram_of(&[100, 200, 300]),
            per_partition: vec![(1000, 1_000_000), (3000, 3_000_000)],
            busy_retry_count: 2,
        }
    }

    fn cpu() -> PhaseCpu {
        PhaseCpu {
            shard_cpu_seconds: 1.0,
            io_worker_cpu_seconds: 0.5,
            server_cpu_seconds: 2.0,
            other_cpu_seconds: 0.5,
            per_shard_cpu_seconds: BTreeMap::from([(0, 0.25), (1, 0.75)]),
        }
    }

    fn config() -> RunConfig {
        RunConfig {
            server: "embedded".to_string(),
            server_pid: Some(42),
            shards_requested: "2".to_string(),
            producers: 2,
            consumers: 2,
            partitions: 2,
            batch_messages: 1000,
            messages: Some(4000),
            duration_seconds: None,
            payload: "1000 B".to_string(),
            concurrent: false,
            fsync: "never".to_string(),
            write_mode: None,
            cpus: None,
            no_pin: false,
            io_driver: None,
            inbox_capacity: None,
            idle_poll_us: None,
            stream_id: 1,
            cpu_note: None,
            data_dir: Some("/srv/bench/shardline-bench-x/data".to_string()),
            data_dir_on_tmpfs: Some(false),
        }
    }

    fn run(cpu: Option<PhaseCpu>, shards: u16) -> RunReport {
        let produce = phase(cpu.clone());
        let consume = phase(cpu);
        RunReport {
            shards,
            messages_sent: 4000,
            messages_verified: 4000,
            messages_lost: 0,
            produce: PhaseFigures::from_measurement(&produce),
            consume: PhaseFigures::from_measurement(&consume),
            per_shard: per_shard_reports(2, &[1, 2], &[1, 0], &produce, &consume),
            config: config(),
            repeat: 1,
            sequence: 0,
            page_cache_note: None,
        }
    }

    #[test]
    fn phase_figures_are_computed_from_the_measurement() {
        let figures = PhaseFigures::from_measurement(&phase(Some(cpu())));
        assert_eq!(figures.msgs_per_sec, 2000.0);
        assert_eq!(figures.mb_per_sec, 2.0);
        assert_eq!(figures.msgs_per_server_cpu_second, Some(2000.0));
        assert_eq!(figures.msgs_per_shard_cpu_second, Some(4000.0));
        assert_eq!(figures.io_worker_cpu_seconds, Some(0.5));
        assert_eq!(figures.latency_us.max, 300);
        assert_eq!(figures.latency_us.p50, 200);
        assert_eq!(figures.busy_retries, 2);
        // 2.5 host CPU-s over 4 * 10^6 payload bytes.
        assert_eq!(figures.host_cpu_seconds, Some(2.5));
        assert_eq!(figures.host_cpu_seconds_per_gb, Some(625.0));
        assert_eq!(figures.load_generator_cpu_seconds, Some(1.0));
        assert_eq!(figures.writeback_flush_seconds, Some(0.25));
        let without_cpu = PhaseFigures::from_measurement(&phase(None));
        assert_eq!(without_cpu.host_cpu_seconds, None);
        assert_eq!(without_cpu.host_cpu_seconds_per_gb, None);
        assert_eq!(without_cpu.server_cpu_seconds, None);
        assert_eq!(without_cpu.msgs_per_server_cpu_second, None);
    }

    #[test]
    fn empty_histogram_summarizes_to_zero() {
        assert_eq!(
            LatencySummary::from_histogram(&new_latency_histogram()),
            LatencySummary::default()
        );
    }

    #[test]
    fn per_shard_figures_follow_partition_owners() {
        let report = run(Some(cpu()), 2);
        let shard0 = &report.per_shard[0];
        assert_eq!(shard0.partition_ids, vec![2]);
        assert_eq!(shard0.produce.messages, 3000);
        assert_eq!(shard0.produce.msgs_per_sec, 1500.0);
        assert_eq!(shard0.produce.cpu_seconds, Some(0.25));
        assert_eq!(shard0.produce.msgs_per_cpu_second, Some(12000.0));
        assert_eq!(report.per_shard[1].partition_ids, vec![1]);
        assert_eq!(report.per_shard[1].consume.messages, 1000);
    }

    fn keys(value: &serde_json::Value) -> Vec<String> {
        let mut keys: Vec<String> = value.as_object().unwrap().keys().cloned().collect();
        keys.sort();
        keys
    }

    #[test]
    fn json_has_exactly_the_documented_keys() {
        let report = BenchReport {
            runs: vec![run(None, 1)],
            summary: Vec::new(),
            recommendation: None,
        };
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(keys(&value), ["recommendation", "runs", "summary"]);
        assert!(value["recommendation"].is_null());
        let run = &value["runs"][0];
        let phase_keys = [
            "busy_retries",
            "elapsed_seconds",
            "host_cpu_seconds",
            "host_cpu_seconds_per_gb",
            "io_worker_cpu_seconds",
            "latency_us",
            "load_generator_cpu_seconds",
            "mb_per_sec",
            "msgs_per_sec",
            "msgs_per_server_cpu_second",
            "msgs_per_shard_cpu_second",
            "server_cpu_seconds",
            "shard_cpu_seconds",
            "writeback_flush_seconds",
        ];
        let mut run_keys: Vec<&str> = phase_keys.to_vec();
        run_keys.extend([
            "config",
            "consume",
            "messages_lost",
            "messages_sent",
            "messages_verified",
            "page_cache_note",
            "per_shard",
            "repeat",
            "sequence",
            "shards",
        ]);
        run_keys.sort_unstable();
        assert_eq!(keys(run), run_keys);
        assert_eq!(keys(&run["consume"]), phase_keys);
        assert_eq!(
            keys(&run["latency_us"]),
            ["max", "p50", "p90", "p99", "p999"]
        );
        assert_eq!(
            keys(&run["per_shard"][0]),
            ["consume", "partition_ids", "produce", "shard"]
        );
        assert_eq!(
            keys(&run["per_shard"][0]["produce"]),
            [
                "cpu_seconds",
                "mb_per_sec",
                "messages",
                "msgs_per_cpu_second",
                "msgs_per_sec"
            ]
        );
        assert!(run["server_cpu_seconds"].is_null());
        assert_eq!(run["shards"], 1);
        assert_eq!(run["config"]["fsync"], "never");
    }

    #[test]
    fn issue12_3_config_line_names_the_write_mode_of_the_embedded_server() {
        let mut report = run(None, 1);
        report.config.data_dir = Some("/srv/bench/data".to_string());
        report.config.write_mode = None;
        assert!(
            render_config(&report.config)
                .contains("fsync=never write-mode=buffered (server default)"),
            "{}",
            render_config(&report.config)
        );
        report.config.write_mode = Some("direct".to_string());
        assert!(render_config(&report.config).contains("fsync=never write-mode=direct"));
        // An external server's mode is its own: the line does not guess it.
        report.config.data_dir = None;
        report.config.write_mode = None;
        assert!(!render_config(&report.config).contains("write-mode"));
    }

    #[test]
    fn table_says_n_a_without_cpu_figures() {
        let table = render_run(&run(None, 1));
        assert!(
            table.contains("== shards=1 (requested 2) server=embedded producers=2"),
            "{table}"
        );
        assert!(table.contains("n/a"), "{table}");
        assert!(table.contains("sent 4000 acknowledged messages in 2.00s, verified 4000"));
        assert!(!render_run(&run(Some(cpu()), 1)).contains("n/a"));
    }

    #[test]
    fn issue7_6_report_says_what_latency_times_and_where_the_data_was() {
        let mut report = run(None, 2);
        assert_eq!(
            run_notes(&report),
            [
                "latency: p50us..max-us time one batch round trip per request (produce: a \
                 SendMessages batch until its acknowledgement; consume: a poll until its reply)",
                "data: /srv/bench/shardline-bench-x/data (embedded server, fsync=never; removed \
                 when the run ends)",
            ]
        );
        report.config.data_dir_on_tmpfs = Some(true);
        assert_eq!(
            run_notes(&report)[2],
            "warning: the data directory is on tmpfs (memory): fsync costs nothing there, so \
             these figures do not measure a disk; pass --data-root on the disk you mean to measure"
        );
        report.config.data_dir = None;
        report.config.data_dir_on_tmpfs = None;
        report.config.server = "127.0.0.1:8090".to_string();
        assert_eq!(
            run_notes(&report)[1],
            "data: wherever the server at 127.0.0.1:8090 keeps it (fsync set by that server)"
        );
    }

    #[test]
    fn the_table_says_how_long_the_writeback_flush_took_or_why_there_was_none() {
        let mut report = run(Some(cpu()), 2);
        let line = "writeback: 0.250 s flushing the data directory's filesystem (syncfs) after \
                    the last ack, counted in produce host-cpu, not in msgs/s or latency";
        assert_eq!(writeback_line(&report), line);
        assert!(render_run(&report).contains(&format!("\n{line}\n")));
        report.produce.writeback_flush_seconds = None;
        report.config.server = "10.0.0.7:8090".to_string();
        assert_eq!(
            writeback_line(&report),
            "note: host figure excludes deferred writeback: remote server (10.0.0.7:8090); its \
             dirty pages are written back outside the produce window"
        );
    }

    #[test]
    fn issue7_6_bench_warns_when_partitions_load_shards_unevenly() {
        let produce = phase(None);
        let even = per_shard_reports(2, &[0, 1], &[1, 0], &produce, &produce);
        assert_eq!(placement_warning(&even), None);
        let uneven = per_shard_reports(2, &[0, 1, 2], &[1, 0, 1], &produce, &produce);
        assert_eq!(
            placement_warning(&uneven).unwrap(),
            "warning: partitions are spread unevenly over the 2 shards (shard 0 owns 1, shard 1 \
             owns 2); pass --partitions as a multiple of 2 to load every shard evenly"
        );
        let idle_shard = per_shard_reports(2, &[0], &[0], &produce, &produce);
        assert_eq!(
            placement_warning(&idle_shard).unwrap(),
            "warning: partitions are spread unevenly over the 2 shards (shard 0 owns 1, shard 1 \
             owns 0); pass --partitions as a multiple of 2 to load every shard evenly"
        );
    }

    #[test]
    fn issue7_6_tmpfs_is_detected() {
        use super::super::server::is_on_tmpfs;
        let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
        let mount_point_of = |fs_type: &str| {
            mounts.lines().find_map(|line| {
                let fields: Vec<&str> = line.split(' ').collect();
                (fields[2] == fs_type && !fields[1].contains('\\')).then(|| fields[1].to_string())
            })
        };
        if let Some(tmpfs) = mount_point_of("tmpfs") {
            assert!(
                is_on_tmpfs(std::path::Path::new(&tmpfs)).unwrap(),
                "{tmpfs}"
            );
        }
        assert!(!is_on_tmpfs(std::path::Path::new("/proc")).unwrap());
        assert_eq!(
            is_on_tmpfs(std::path::Path::new("/no/such/dir"))
                .unwrap_err()
                .kind(),
            std::io::ErrorKind::NotFound
        );
    }

    #[test]
    fn page_cache_notes_label_large_runs_first_or_later() {
        assert_eq!(page_cache_note(PAGE_CACHE_NOTE_BYTES_MIN - 1, 0), None);
        assert_eq!(page_cache_note(0, 3), None);
        assert_eq!(
            page_cache_note(1_000_000_000, 0).unwrap(),
            "page cache: first run of this sequence (953 MiB of payload): its page cache grew \
             into memory untouched since boot, slower to fault in on a VM than the memory later \
             runs reuse; compare it with later runs with care"
        );
        assert_eq!(
            page_cache_note(PAGE_CACHE_NOTE_BYTES_MIN, 2).unwrap(),
            "page cache: run 3 of this sequence (256 MiB of payload): its page cache reuses \
             memory the earlier runs faulted in, which the first run could not; compare it with \
             the first run with care"
        );
    }

    #[test]
    fn the_page_cache_note_is_printed_and_serialized_with_the_run() {
        let mut report = run(Some(cpu()), 2);
        report.page_cache_note = page_cache_note(1 << 30, 0);
        let note = report.page_cache_note.clone().unwrap();
        assert!(render_run(&report).contains(&format!("\n{note}\n")));
        assert_eq!(run_notes(&report).last(), Some(&note));
        let value = serde_json::to_value(&report).unwrap();
        assert_eq!(value["page_cache_note"], note.as_str());
        assert!(serde_json::to_value(run(None, 1)).unwrap()["page_cache_note"].is_null());
    }

    #[test]
    fn compact_lines_give_the_headline_figures_and_the_warnings() {
        let mut report = run(Some(cpu()), 2);
        report.repeat = 2;
        report.sequence = 4;
        assert_eq!(
            render_run_compact(&report, 3),
            "run 5: shards=2 repeat 2/3 | produce 2000 msgs/s 2000 msgs/srv-cpu-s 2.50 host-cpu \
             625.000 host-s/GB p99 300us | consume 2000 msgs/s 2000 msgs/srv-cpu-s 2.50 host-cpu \
             625.000 host-s/GB p99 300us | lost 0\n"
        );
        report.page_cache_note = Some("page cache: x".to_string());
        report.config.data_dir_on_tmpfs = Some(true);
        let text = render_run_compact(&run(None, 1), 1);
        assert!(text.contains("n/a msgs/srv-cpu-s"), "{text}");
        let lines: Vec<String> = render_run_compact(&report, 3)
            .lines()
            .skip(1)
            .map(str::to_string)
            .collect();
        assert_eq!(lines.len(), 2, "{lines:?}");
        assert!(lines[0].starts_with("  warning: the data directory is on tmpfs"));
        assert_eq!(lines[1], "  page cache: x");
    }

    #[test]
    fn ratios_are_relative_to_the_one_shard_run() {
        let one = run(Some(cpu()), 1);
        let mut two = run(Some(cpu()), 2);
        two.produce.msgs_per_server_cpu_second = Some(3000.0);
        assert_eq!(render_ratios(std::slice::from_ref(&one)), None);
        assert_eq!(
            render_ratios(&[one, two, run(None, 4)]).unwrap(),
            "msgs per server-CPU-second relative to the 1-shard run: 1 shard 1.00x; \
             2 shards 1.50x; 4 shards n/a"
        );
    }
}
