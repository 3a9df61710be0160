//! The report of `--workload metadata`: latency of each metadata round trip and of the disk
//! baseline (4 KiB write + fdatasync), their p99 ratio against the target, the table on stdout
//! and the `--json` document (keys listed in README's bench section; they are stable). With
//! `--clients` N >= 2 also the concurrent clients' committed ops per second and commit latency,
//! beside issue 8's targets (`clients`; `null` with one client).
//!
//! Must never measure anything itself, and never turn a missed target into an error: the target
//! is a figure to report, and a ratio that cannot be computed is `null` / `n/a`, never made up.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

use super::limits::{BASELINE_WRITE_BYTES, METADATA_P99_RATIO_TARGET};
use super::report::LatencySummary;

/// Partitions of the topic each round creates: one, so a round trip is one metadata commit and
/// one partition directory, not a fan-out.
pub const TOPIC_PARTITION_COUNT: u32 = 1;

/// The metadata op the target is judged on: issue 3 names "Register or CreateTopic round trip";
/// Register is one journaled op with no partition directories and no broadcast, the commit path
/// itself.
pub const TARGET_OP: &str = "register";

/// Issue 8 ("Targets"): the throughput targets are judged with this many concurrent clients
/// registering.
pub const CLIENTS_TARGET_CLIENT_COUNT: u32 = 64;

/// Issue 8: committed metadata ops per second with [`CLIENTS_TARGET_CLIENT_COUNT`] clients and
/// one replica.
pub const OPS_PER_SECOND_TARGET_ONE_REPLICA: u64 = 10_000;

/// Issue 8: committed metadata ops per second with [`CLIENTS_TARGET_CLIENT_COUNT`] clients and
/// three replicas.
pub const OPS_PER_SECOND_TARGET_THREE_REPLICAS: u64 = 5_000;

/// Issue 8: a 3-replica cluster's metadata commit p99 within this many times the single-replica
/// p99 measured in the same run.
pub const CLUSTER_P99_RATIO_TARGET: f64 = 2.0;

/// How the baseline samples are ordered against the metadata rounds.
pub const BASELINE_ORDER: &str = "interleaved: one write+fdatasync right before each round";

/// Where the baseline's scratch file was, which says how far its figure can be trusted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum BaselineLocation {
    /// Beside the embedded server's data directory: its filesystem, by construction.
    ServerRunDir,
    /// `--data-root` given with `--addr`: where the user says the server's disk is.
    DataRoot,
    /// `--addr` without `--data-root`: the system temp dir, perhaps not the server's disk.
    SystemTempDir,
}

impl BaselineLocation {
    fn describe(self) -> &'static str {
        match self {
            BaselineLocation::ServerRunDir => "beside the embedded server's data directory",
            BaselineLocation::DataRoot => "in --data-root, given with --addr",
            BaselineLocation::SystemTempDir => {
                "in the system temp dir: --addr without --data-root, so maybe not the server's disk"
            }
        }
    }
}

/// What one metadata run measured, µs per round trip.
#[derive(Debug)]
pub struct MetadataMeasurement {
    pub round_count: u32,
    pub first_stream_id: u32,
    pub baseline_us: Histogram<u64>,
    pub register_us: Histogram<u64>,
    pub create_stream_us: Histogram<u64>,
    pub create_topic_us: Histogram<u64>,
    pub delete_stream_us: Histogram<u64>,
    pub baseline_path: PathBuf,
    pub baseline_location: BaselineLocation,
    /// `None` when the server's data directory is unknown (`--addr`).
    pub same_filesystem_as_server: Option<bool>,
    /// The concurrent clients' phase; `None` with `--clients 1`.
    pub clients: Option<ClientsMeasurement>,
}

/// What the concurrent clients measured: every committed Register, µs from its first send to its
/// reply (`Busy` retries included).
#[derive(Debug)]
pub struct ClientsMeasurement {
    pub client_count: u32,
    /// OS threads (one compio runtime each) the clients were dealt over.
    pub thread_count: u32,
    /// `Some(n)`: each client sent `n` Registers; `None`: they ran for `duration`.
    pub registers_per_client: Option<u32>,
    pub duration: Option<Duration>,
    pub commit_us: Histogram<u64>,
    /// From the start line to the last client's last reply.
    pub elapsed: Duration,
    pub busy_retry_count: u64,
}

/// Issue 8's figures for the concurrent clients, beside this run's.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientsTarget {
    pub rule: String,
    /// The client count the throughput targets name.
    pub clients: u32,
    pub ops_per_second_min_one_replica: u64,
    pub ops_per_second_min_three_replicas: u64,
    /// The server's replica count where the bench knows it (1 for the embedded server); `None`
    /// with `--addr`.
    pub replica_count: Option<u8>,
    /// The target for `replica_count`; `None` when that is unknown or has no target.
    pub ops_per_second_min: Option<u64>,
    /// `ops_per_second / ops_per_second_min`.
    pub ops_per_second_ratio: Option<f64>,
    /// Judged only with the client count the target names and a known replica count.
    pub met: Option<bool>,
    pub p99_rule: String,
    pub p99_ratio_max: f64,
    /// `p99_ratio_max` × this run's register p99 (single-client rounds), µs, when this run is
    /// single-replica: the most a 3-replica run's register p99 may be.
    pub three_replica_register_p99_max_us: Option<u64>,
}

/// The concurrent clients' figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ClientsFigures {
    pub clients: u32,
    pub threads: u32,
    pub registers_per_client: Option<u32>,
    pub duration_seconds: Option<u64>,
    /// Committed Registers: one metadata op each (a fresh client id per Register).
    pub committed_ops: u64,
    pub elapsed_seconds: f64,
    pub ops_per_second: f64,
    pub latency_us: LatencySummary,
    pub busy_retries: u64,
    pub target: ClientsTarget,
}

/// The baseline's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BaselineFigures {
    pub count: u64,
    pub latency_us: LatencySummary,
    pub write_bytes: u64,
    pub path: String,
    pub location: BaselineLocation,
    pub same_filesystem_as_server: Option<bool>,
    pub order: String,
}

/// One metadata operation's figures.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct OpFigures {
    pub count: u64,
    pub latency_us: LatencySummary,
    /// p99 of this op / p99 of the baseline; `None` without baseline samples.
    pub p99_ratio_to_baseline: Option<f64>,
    /// `p99_ratio_to_baseline <= METADATA_P99_RATIO_TARGET`.
    pub target_met: Option<bool>,
}

/// The target line: `op`'s p99 within `p99_ratio_max` times the baseline's p99.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TargetVerdict {
    pub op: &'static str,
    pub rule: String,
    pub p99_ratio_max: f64,
    pub p99_ratio: Option<f64>,
    pub met: Option<bool>,
}

/// How the run was set up.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MetadataRunConfig {
    /// `embedded` or the `--addr` given.
    pub server: String,
    pub server_pid: Option<u32>,
    pub shards_requested: String,
    pub fsync: String,
    /// `--write-mode` as given (`None`: the server default, `buffered`).
    pub write_mode: Option<String>,
    pub cpus: Option<String>,
    pub no_pin: bool,
    pub io_driver: Option<String>,
    pub inbox_capacity: Option<u32>,
    pub idle_poll_us: Option<u32>,
    /// Round `i` (from 0) used stream `first_stream_id + i`.
    pub first_stream_id: u32,
    pub topic_partitions: u32,
    /// `--clients`.
    pub clients: u32,
    /// The server's replica count where the bench knows it: 1 for the embedded server, `None`
    /// for `--addr`.
    pub replica_count: Option<u8>,
}

/// One run of the metadata workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetadataRunReport {
    pub shards: u16,
    pub rounds: u32,
    pub baseline: BaselineFigures,
    pub register: OpFigures,
    pub create_stream: OpFigures,
    pub create_topic: OpFigures,
    pub delete_stream: OpFigures,
    pub target: TargetVerdict,
    /// `None` with `--clients 1`.
    pub clients: Option<ClientsFigures>,
    pub config: MetadataRunConfig,
}

/// The `--json` document of `--workload metadata`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct MetadataBenchReport {
    /// Always `metadata`, so a reader can tell this document from the produce-consume one.
    pub workload: &'static str,
    pub runs: Vec<MetadataRunReport>,
}

impl MetadataBenchReport {
    pub fn new(runs: Vec<MetadataRunReport>) -> MetadataBenchReport {
        MetadataBenchReport {
            workload: "metadata",
            runs,
        }
    }
}

fn op_figures(histogram: &Histogram<u64>, baseline_p99_us: u64) -> OpFigures {
    let latency_us = LatencySummary::from_histogram(histogram);
    let p99_ratio_to_baseline = (baseline_p99_us > 0 && !histogram.is_empty())
        .then(|| latency_us.p99 as f64 / baseline_p99_us as f64);
    OpFigures {
        count: histogram.len(),
        latency_us,
        p99_ratio_to_baseline,
        target_met: p99_ratio_to_baseline.map(|ratio| ratio <= METADATA_P99_RATIO_TARGET),
    }
}

/// The issue 8 target line for `ops_per_second` measured by `client_count` clients against a
/// server of `replica_count` replicas, whose single-client register p99 was `register_p99_us`.
fn clients_target(
    client_count: u32,
    ops_per_second: f64,
    replica_count: Option<u8>,
    register_p99_us: u64,
) -> ClientsTarget {
    let ops_per_second_min = match replica_count {
        Some(1) => Some(OPS_PER_SECOND_TARGET_ONE_REPLICA),
        Some(3) => Some(OPS_PER_SECOND_TARGET_THREE_REPLICAS),
        _ => None,
    };
    let ops_per_second_ratio = ops_per_second_min.map(|min| ops_per_second / min as f64);
    let met = ops_per_second_ratio
        .filter(|_| client_count == CLIENTS_TARGET_CLIENT_COUNT)
        .map(|ratio| ratio >= 1.0);
    let three_replica_register_p99_max_us = (replica_count == Some(1) && register_p99_us > 0)
        .then(|| (register_p99_us as f64 * CLUSTER_P99_RATIO_TARGET).round() as u64);
    ClientsTarget {
        rule: format!(
            "issue 8: with {CLIENTS_TARGET_CLIENT_COUNT} concurrent clients registering, at least \
             {OPS_PER_SECOND_TARGET_ONE_REPLICA} committed metadata ops/s with 1 replica and \
             {OPS_PER_SECOND_TARGET_THREE_REPLICAS} with 3"
        ),
        clients: CLIENTS_TARGET_CLIENT_COUNT,
        ops_per_second_min_one_replica: OPS_PER_SECOND_TARGET_ONE_REPLICA,
        ops_per_second_min_three_replicas: OPS_PER_SECOND_TARGET_THREE_REPLICAS,
        replica_count,
        ops_per_second_min,
        ops_per_second_ratio,
        met,
        p99_rule: format!(
            "issue 8: with 3 replicas, the {TARGET_OP} p99 within {CLUSTER_P99_RATIO_TARGET}x of \
             the single-replica {TARGET_OP} p99 measured in the same run"
        ),
        p99_ratio_max: CLUSTER_P99_RATIO_TARGET,
        three_replica_register_p99_max_us,
    }
}

impl ClientsFigures {
    /// The figures of `measured`; `replica_count` and `register_p99_us` as `clients_target`.
    pub fn new(
        measured: &ClientsMeasurement,
        replica_count: Option<u8>,
        register_p99_us: u64,
    ) -> ClientsFigures {
        let committed_ops = measured.commit_us.len();
        // At least 1 µs, so that a degenerate run reports a figure rather than infinity.
        let elapsed_seconds = measured.elapsed.max(Duration::from_micros(1)).as_secs_f64();
        let ops_per_second = committed_ops as f64 / elapsed_seconds;
        ClientsFigures {
            clients: measured.client_count,
            threads: measured.thread_count,
            registers_per_client: measured.registers_per_client,
            duration_seconds: measured.duration.map(|duration| duration.as_secs()),
            committed_ops,
            elapsed_seconds,
            ops_per_second,
            latency_us: LatencySummary::from_histogram(&measured.commit_us),
            busy_retries: measured.busy_retry_count,
            target: clients_target(
                measured.client_count,
                ops_per_second,
                replica_count,
                register_p99_us,
            ),
        }
    }
}

impl MetadataRunReport {
    /// The figures of `measured`, on a server with `shards` shards.
    pub fn new(
        shards: u16,
        config: MetadataRunConfig,
        measured: &MetadataMeasurement,
    ) -> MetadataRunReport {
        let baseline_latency = LatencySummary::from_histogram(&measured.baseline_us);
        let figures = |histogram| op_figures(histogram, baseline_latency.p99);
        let create_topic = figures(&measured.create_topic_us);
        let register = figures(&measured.register_us);
        let target_figures = &register;
        let target = TargetVerdict {
            op: TARGET_OP,
            rule: format!(
                "p99 of {TARGET_OP} within {METADATA_P99_RATIO_TARGET}x of the p99 of one \
                 {BASELINE_WRITE_BYTES}-byte write+fdatasync on the same disk"
            ),
            p99_ratio_max: METADATA_P99_RATIO_TARGET,
            p99_ratio: target_figures.p99_ratio_to_baseline,
            met: target_figures.target_met,
        };
        MetadataRunReport {
            shards,
            rounds: measured.round_count,
            baseline: BaselineFigures {
                count: measured.baseline_us.len(),
                latency_us: baseline_latency,
                write_bytes: BASELINE_WRITE_BYTES as u64,
                path: measured.baseline_path.display().to_string(),
                location: measured.baseline_location,
                same_filesystem_as_server: measured.same_filesystem_as_server,
                order: BASELINE_ORDER.to_string(),
            },
            create_stream: figures(&measured.create_stream_us),
            create_topic,
            delete_stream: figures(&measured.delete_stream_us),
            clients: measured.clients.as_ref().map(|clients| {
                ClientsFigures::new(clients, config.replica_count, register.latency_us.p99)
            }),
            register,
            target,
            config,
        }
    }
}

fn ratio_text(ratio: Option<f64>) -> String {
    ratio.map_or_else(|| "n/a".to_string(), |ratio| format!("{ratio:.2}x"))
}

fn verdict_text(met: Option<bool>) -> &'static str {
    match met {
        Some(true) => "met",
        Some(false) => "NOT met",
        None => "n/a",
    }
}

/// The table for one metadata run, as printed on stdout.
pub fn render_metadata_run(run: &MetadataRunReport) -> String {
    let config = &run.config;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n== workload=metadata shards={} (requested {}) server={} rounds={} fsync={} \
         topic_partitions={} first_stream_id={}",
        run.shards,
        config.shards_requested,
        config.server,
        run.rounds,
        config.fsync,
        config.topic_partitions,
        config.first_stream_id,
    );
    let _ = writeln!(
        out,
        "{:<22} {:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {:>13} {:>7}",
        "round trip",
        "count",
        "p50us",
        "p90us",
        "p99us",
        "p99.9us",
        "max-us",
        "p99/baseline",
        "<=3x"
    );
    let baseline_name = format!("write+fdatasync {} KiB", BASELINE_WRITE_BYTES / 1024);
    let rows = [
        (
            baseline_name.as_str(),
            run.baseline.count,
            run.baseline.latency_us,
            None,
        ),
        (
            "register",
            run.register.count,
            run.register.latency_us,
            Some(&run.register),
        ),
        (
            "create_stream",
            run.create_stream.count,
            run.create_stream.latency_us,
            Some(&run.create_stream),
        ),
        (
            "create_topic",
            run.create_topic.count,
            run.create_topic.latency_us,
            Some(&run.create_topic),
        ),
        (
            "delete_stream",
            run.delete_stream.count,
            run.delete_stream.latency_us,
            Some(&run.delete_stream),
        ),
    ];
    for (name, count, latency, op) in rows {
        let (ratio, met) = op.map_or(("-".to_string(), "-"), |op| {
            (
                ratio_text(op.p99_ratio_to_baseline),
                verdict_text(op.target_met),
            )
        });
        let _ = writeln!(
            out,
            "{name:<22} {count:>7} {:>8} {:>8} {:>8} {:>8} {:>8} {ratio:>13} {met:>7}",
            latency.p50, latency.p90, latency.p99, latency.p999, latency.max,
        );
    }
    let same_filesystem = match run.baseline.same_filesystem_as_server {
        Some(true) => ", same filesystem as the server's data",
        Some(false) => ", NOT the filesystem of the server's data",
        None => "",
    };
    let _ = writeln!(
        out,
        "baseline: {} {}{same_filesystem}; {}",
        run.baseline.path,
        run.baseline.location.describe(),
        run.baseline.order
    );
    let _ = writeln!(
        out,
        "target: p99 within {}x: {} p99 {}us is {} the baseline p99 {}us: {} (the target is judged \
         on {}; the other rows are for reference)",
        run.target.p99_ratio_max,
        run.target.op,
        run.register.latency_us.p99,
        ratio_text(run.target.p99_ratio),
        run.baseline.latency_us.p99,
        verdict_text(run.target.met),
        run.target.op,
    );
    if let Some(clients) = &run.clients {
        render_clients(&mut out, clients, run.register.latency_us.p99);
    }
    if run.rounds < 1000 {
        let _ = writeln!(
            out,
            "note: with {} rounds the p99.9 is one of the slowest few samples; use \
             --metadata-ops 1000 or more for a stable tail",
            run.rounds
        );
    }
    out
}

/// The lines of the concurrent clients: the figures, then each issue 8 target beside them.
fn render_clients(out: &mut String, clients: &ClientsFigures, register_p99_us: u64) {
    let per_client = match (clients.registers_per_client, clients.duration_seconds) {
        (_, Some(seconds)) => format!("for {seconds} s"),
        (Some(count), None) => format!("{count} Registers each"),
        (None, None) => "until stopped".to_string(),
    };
    let latency = clients.latency_us;
    let _ = writeln!(
        out,
        "clients: {} connections on {} threads, {per_client} (a fresh client id per Register): \
         {} committed in {:.3} s = {:.0} ops/s; commit latency p50 {}us p99 {}us max {}us; busy \
         retries {}",
        clients.clients,
        clients.threads,
        clients.committed_ops,
        clients.elapsed_seconds,
        clients.ops_per_second,
        latency.p50,
        latency.p99,
        latency.max,
        clients.busy_retries,
    );
    let target = &clients.target;
    let judged = match (target.replica_count, target.ops_per_second_min) {
        (Some(replicas), Some(min)) => {
            let verdict = if clients.clients == target.clients {
                verdict_text(target.met).to_string()
            } else {
                format!(
                    "not judged: the target names {} clients, this run used {}",
                    target.clients, clients.clients
                )
            };
            format!(
                "this server has {replicas} replica{}: {:.0} ops/s is {} its {min}: {verdict}",
                if replicas == 1 { "" } else { "s" },
                clients.ops_per_second,
                ratio_text(target.ops_per_second_ratio),
            )
        }
        (Some(replicas), None) => {
            format!("this server has {replicas} replicas, for which issue 8 names no target")
        }
        (None, _) => format!(
            "the bench does not know this server's replica count (--addr): compare {:.0} ops/s \
             with the target for its count",
            clients.ops_per_second
        ),
    };
    let _ = writeln!(
        out,
        "issue 8 throughput ({} clients registering): >= {} ops/s with 1 replica, >= {} with 3; \
         {judged}",
        target.clients,
        target.ops_per_second_min_one_replica,
        target.ops_per_second_min_three_replicas,
    );
    let bound = match target.three_replica_register_p99_max_us {
        Some(max) => format!(
            "this single-replica run's register p99 is {register_p99_us}us, so a 3-replica \
             run's must be <= {max}us"
        ),
        None => format!(
            "this run's register p99 is {register_p99_us}us: compare it with a single-replica \
             run's on the same machine"
        ),
    };
    let _ = writeln!(
        out,
        "issue 8 latency: with 3 replicas, register p99 within {}x of the single-replica p99 of \
         the same run; {bound}",
        target.p99_ratio_max,
    );
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are the exact quotients computed"
)]
mod tests {
    use super::super::report::histogram_of;
    use super::*;

    fn config() -> MetadataRunConfig {
        MetadataRunConfig {
            server: "embedded".to_string(),
            server_pid: Some(42),
            shards_requested: "1".to_string(),
            fsync: "always (server default)".to_string(),
            write_mode: None,
            cpus: None,
            no_pin: false,
            io_driver: None,
            inbox_capacity: None,
            idle_poll_us: None,
            first_stream_id: 1,
            topic_partitions: TOPIC_PARTITION_COUNT,
            clients: 1,
            replica_count: Some(1),
        }
    }

    /// `target` gives both the register (judged) and the create_topic latencies.
    fn measured(baseline: &[u64], target: &[u64]) -> MetadataMeasurement {
        let create_topic = target;
        MetadataMeasurement {
            round_count: 4,
            first_stream_id: 1,
            baseline_us: histogram_of(baseline),
            register_us: histogram_of(target),
            create_stream_us: histogram_of(&[100, 200, 300, 400]),
            create_topic_us: histogram_of(create_topic),
            delete_stream_us: histogram_of(&[1000, 1000, 1000, 1000]),
            baseline_path: PathBuf::from("/d/baseline.scratch"),
            baseline_location: BaselineLocation::ServerRunDir,
            same_filesystem_as_server: Some(true),
            clients: None,
        }
    }

    /// `client_count` clients committed `commits` (µs) in `elapsed`.
    fn clients(client_count: u32, commits: &[u64], elapsed: Duration) -> ClientsMeasurement {
        ClientsMeasurement {
            client_count,
            thread_count: 2,
            registers_per_client: Some(100),
            duration: None,
            commit_us: histogram_of(commits),
            elapsed,
            busy_retry_count: 3,
        }
    }

    /// A run of `client_count` clients with 20 000 commits in 2 s (10 000 ops/s), against a
    /// server of `replica_count` replicas; the single-client register p99 is 600 µs.
    fn clients_run(client_count: u32, replica_count: Option<u8>) -> MetadataRunReport {
        let mut measured = measured(&[100; 4], &[300, 300, 300, 600]);
        measured.clients = Some(clients(
            client_count,
            &vec![1000; 20_000],
            Duration::from_secs(2),
        ));
        let config = MetadataRunConfig {
            clients: client_count,
            replica_count,
            ..config()
        };
        MetadataRunReport::new(1, config, &measured)
    }

    #[test]
    fn ratios_and_verdicts_come_from_the_p99s() {
        let run = MetadataRunReport::new(
            1,
            config(),
            &measured(&[100, 100, 100, 200], &[300, 300, 300, 600]),
        );
        assert_eq!(run.baseline.count, 4);
        assert_eq!(run.baseline.latency_us.p99, 200);
        assert_eq!(run.baseline.write_bytes, 4096);
        assert_eq!(run.create_stream.p99_ratio_to_baseline, Some(2.0));
        assert_eq!(run.create_stream.target_met, Some(true));
        assert_eq!(run.create_topic.p99_ratio_to_baseline, Some(3.0));
        assert_eq!(run.create_topic.target_met, Some(true));
        assert_eq!(run.delete_stream.p99_ratio_to_baseline, Some(5.0));
        assert_eq!(run.delete_stream.target_met, Some(false));
        assert_eq!(run.target.op, "register");
        assert_eq!(run.register.p99_ratio_to_baseline, Some(3.0));
        assert_eq!(run.target.p99_ratio, Some(3.0));
        assert_eq!(run.target.met, Some(true));
        let text = render_metadata_run(&run);
        assert!(
            text.contains(
                "target: p99 within 3x: register p99 600us is 3.00x the baseline p99 200us: met"
            ),
            "{text}"
        );
        assert!(text.contains("delete_stream"), "{text}");
        assert!(text.contains("5.00x NOT met"), "{text}");
        assert!(
            text.contains(
                "baseline: /d/baseline.scratch beside the embedded server's data directory, \
                 same filesystem as the server's data; interleaved"
            ),
            "{text}"
        );
    }

    #[test]
    fn a_missed_target_is_reported_not_failed() {
        let run = MetadataRunReport::new(1, config(), &measured(&[100; 4], &[301; 4]));
        assert_eq!(run.target.met, Some(false));
        assert!(
            render_metadata_run(&run).contains("is 3.01x the baseline p99 100us: NOT met"),
            "{}",
            render_metadata_run(&run)
        );
    }

    #[test]
    fn without_baseline_samples_ratios_are_absent() {
        let run = MetadataRunReport::new(1, config(), &measured(&[], &[300]));
        assert_eq!(run.baseline.count, 0);
        assert_eq!(run.create_topic.p99_ratio_to_baseline, None);
        assert_eq!(run.create_topic.target_met, None);
        assert_eq!(run.target.met, None);
        assert!(render_metadata_run(&run).contains("is n/a the baseline"));
    }

    #[test]
    fn json_keys_are_stable() {
        let run = MetadataRunReport::new(1, config(), &measured(&[100; 4], &[200; 4]));
        let json = serde_json::to_value(MetadataBenchReport::new(vec![run])).unwrap();
        assert_eq!(json["workload"], "metadata");
        let run = &json["runs"][0];
        let keys = |value: &serde_json::Value| {
            value
                .as_object()
                .unwrap()
                .keys()
                .cloned()
                .collect::<Vec<_>>()
        };
        assert_eq!(
            keys(run),
            [
                "baseline",
                "clients",
                "config",
                "create_stream",
                "create_topic",
                "delete_stream",
                "register",
                "rounds",
                "shards",
                "target"
            ]
        );
        assert_eq!(
            keys(&run["create_topic"]),
            ["count", "latency_us", "p99_ratio_to_baseline", "target_met"]
        );
        assert_eq!(
            keys(&run["create_topic"]["latency_us"]),
            ["max", "p50", "p90", "p99", "p999"]
        );
        assert_eq!(
            keys(&run["target"]),
            ["met", "op", "p99_ratio", "p99_ratio_max", "rule"]
        );
        assert_eq!(run["clients"], serde_json::Value::Null);
        assert_eq!(run["baseline"]["location"], "server_run_dir");
        assert_eq!(run["target"]["p99_ratio"], 2.0);
        assert_eq!(
            run["target"]["rule"],
            "p99 of register within 3x of the p99 of one 4096-byte write+fdatasync on the \
             same disk"
        );
    }

    #[test]
    fn clients_report_ops_per_second_and_the_commit_latency() {
        let run = clients_run(64, Some(1));
        let clients = run.clients.as_ref().unwrap();
        assert_eq!(clients.committed_ops, 20_000);
        assert_eq!(clients.elapsed_seconds, 2.0);
        assert_eq!(clients.ops_per_second, 10_000.0);
        assert_eq!(clients.latency_us.p50, 1000);
        assert_eq!(clients.latency_us.max, 1000);
        assert_eq!(clients.busy_retries, 3);
        assert_eq!(clients.target.ops_per_second_min, Some(10_000));
        assert_eq!(clients.target.ops_per_second_ratio, Some(1.0));
        assert_eq!(clients.target.met, Some(true));
        assert_eq!(clients.target.three_replica_register_p99_max_us, Some(1200));
        let text = render_metadata_run(&run);
        assert!(
            text.contains(
                "clients: 64 connections on 2 threads, 100 Registers each (a fresh client id per \
                 Register): 20000 committed in 2.000 s = 10000 ops/s; commit latency p50 1000us \
                 p99 1000us max 1000us; busy retries 3"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "issue 8 throughput (64 clients registering): >= 10000 ops/s with 1 replica, >= \
                 5000 with 3; this server has 1 replica: 10000 ops/s is 1.00x its 10000: met"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "this single-replica run's register p99 is 600us, so a 3-replica run's must be \
                 <= 1200us"
            ),
            "{text}"
        );
        let json = serde_json::to_value(&run).unwrap();
        assert_eq!(json["clients"]["ops_per_second"], 10_000.0);
        assert_eq!(json["clients"]["latency_us"]["p99"], 1000);
        assert_eq!(json["config"]["clients"], 64);
    }

    #[test]
    fn clients_targets_follow_the_replica_count_and_the_client_count() {
        let three = clients_run(64, Some(3));
        let target = &three.clients.as_ref().unwrap().target;
        assert_eq!(target.ops_per_second_min, Some(5000));
        assert_eq!(target.ops_per_second_ratio, Some(2.0));
        assert_eq!(target.met, Some(true));
        assert_eq!(target.three_replica_register_p99_max_us, None);

        let unknown = clients_run(64, None);
        let target = &unknown.clients.as_ref().unwrap().target;
        assert_eq!(target.ops_per_second_min, None);
        assert_eq!(target.met, None);
        let text = render_metadata_run(&unknown);
        assert!(
            text.contains(
                "the bench does not know this server's replica count (--addr): compare 10000 \
                 ops/s with the target for its count"
            ),
            "{text}"
        );
        assert!(
            text.contains(
                "this run's register p99 is 600us: compare it with a single-replica run's"
            ),
            "{text}"
        );

        let few = clients_run(4, Some(1));
        let target = &few.clients.as_ref().unwrap().target;
        assert_eq!(target.ops_per_second_ratio, Some(1.0));
        assert_eq!(target.met, None);
        assert!(
            render_metadata_run(&few)
                .contains("not judged: the target names 64 clients, this run used 4"),
            "{}",
            render_metadata_run(&few)
        );
    }

    #[test]
    fn a_missed_throughput_target_is_reported_not_failed() {
        let mut measured = measured(&[100; 4], &[300; 4]);
        measured.clients = Some(clients(64, &[1000; 1000], Duration::from_secs(1)));
        let run = MetadataRunReport::new(1, config(), &measured);
        let clients = run.clients.as_ref().unwrap();
        assert_eq!(clients.target.ops_per_second_ratio, Some(0.1));
        assert_eq!(clients.target.met, Some(false));
        assert!(
            render_metadata_run(&run).contains("1000 ops/s is 0.10x its 10000: NOT met"),
            "{}",
            render_metadata_run(&run)
        );
    }
}
