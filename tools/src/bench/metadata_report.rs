//! The report of `--workload metadata`: latency of each metadata round trip and of the disk
//! baseline (4 KiB write + fdatasync), their p99 ratio against the target, the table on stdout
//! and the `--json` document (keys listed in README's bench section; they are stable).
//!
//! Must never measure anything itself, and never turn a missed target into an error: the target
//! is a figure to report, and a ratio that cannot be computed is `null` / `n/a`, never made up.

use std::fmt::Write as _;
use std::path::PathBuf;

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
    pub cpus: Option<String>,
    pub no_pin: bool,
    pub io_driver: Option<String>,
    pub inbox_capacity: Option<u32>,
    pub idle_poll_us: Option<u32>,
    /// Round `i` (from 0) used stream `first_stream_id + i`.
    pub first_stream_id: u32,
    pub topic_partitions: u32,
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
            register,
            create_topic,
            delete_stream: figures(&measured.delete_stream_us),
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
            cpus: None,
            no_pin: false,
            io_driver: None,
            inbox_capacity: None,
            idle_poll_us: None,
            first_stream_id: 1,
            topic_partitions: TOPIC_PARTITION_COUNT,
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
        }
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
        assert_eq!(run["baseline"]["location"], "server_run_dir");
        assert_eq!(run["target"]["p99_ratio"], 2.0);
        assert_eq!(
            run["target"]["rule"],
            "p99 of register within 3x of the p99 of one 4096-byte write+fdatasync on the \
             same disk"
        );
    }
}
