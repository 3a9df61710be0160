//! `bench --compare OLD.json`: each figure of this run against an earlier `--json` report, as a
//! ratio, flagged where it moved beyond the run-to-run spread (issue 10 section 2).
//!
//! Reads only the figures it compares, so reports written by older or newer versions (with fewer
//! or more fields) still load; must never guess a figure an old report lacks (it shows `n/a`).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::Path;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use super::report::RunReport;
use super::sweep::Spread;

/// The spread assumed on a side with a single run, which measures none: a move smaller than this
/// fraction is not flagged.
pub const SINGLE_RUN_SPREAD_FLOOR: f64 = 0.05;

/// An earlier report, loaded before this run starts (so a bad path fails fast).
#[derive(Debug, Clone)]
pub struct Baseline {
    pub path: std::path::PathBuf,
    pub report: serde_json::Value,
    /// The figures compared, one per run of `report`.
    pub runs: Vec<BaselineRun>,
}

/// Latency percentiles of a baseline phase, µs.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
pub struct BaselineLatency {
    pub p50: u64,
    pub p99: u64,
}

/// The compared figures of one phase of a baseline run; absent figures are `None`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BaselinePhase {
    pub msgs_per_sec: f64,
    #[serde(default)]
    pub msgs_per_server_cpu_second: Option<f64>,
    #[serde(default)]
    pub latency_us: Option<BaselineLatency>,
    /// Absent from reports written before issue 12.
    #[serde(default)]
    pub host_cpu_seconds_per_gb: Option<f64>,
}

/// The compared figures of one run of a baseline report (the produce phase is flattened into
/// the run, as `bench --json` writes it); other fields are ignored.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct BaselineRun {
    pub shards: u16,
    #[serde(flatten)]
    pub produce: BaselinePhase,
    pub consume: BaselinePhase,
}

/// Reads and checks `path` (a `bench --json` report of the message workload).
///
/// # Errors
/// The file cannot be read, is not JSON, or is not a bench report (each naming the path): a
/// `--workload metadata` report is refused, and so is a document without a `runs` array or whose
/// runs lack a compared figure (`shards`, `msgs_per_sec`, `consume.msgs_per_sec`).
pub fn load_baseline(path: &Path) -> anyhow::Result<Baseline> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --compare {}", path.display()))?;
    let report: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("--compare {} is not JSON", path.display()))?;
    if let Some(workload) = report.get("workload").and_then(serde_json::Value::as_str) {
        bail!(
            "--compare {} is a --workload {workload} report; --compare takes a report of the \
             message workload (bench --json without --workload)",
            path.display()
        );
    }
    let Some(runs) = report.get("runs").filter(|runs| runs.is_array()) else {
        bail!(
            "--compare {} is not a bench --json report: it has no \"runs\" array",
            path.display()
        );
    };
    let runs: Vec<BaselineRun> = serde_json::from_value(runs.clone()).with_context(|| {
        format!(
            "--compare {}: its runs lack the figures of a bench --json report",
            path.display()
        )
    })?;
    Ok(Baseline {
        path: path.to_path_buf(),
        report,
        runs,
    })
}

/// The headline figures compared, per run, in row order; `None` where the run has no figure.
const FIGURE_NAMES: [&str; 10] = [
    "produce msgs/s",
    "consume msgs/s",
    "produce msgs/srv-cpu-s",
    "consume msgs/srv-cpu-s",
    "produce host-cpu-s/GB",
    "consume host-cpu-s/GB",
    "produce p50 us",
    "produce p99 us",
    "consume p50 us",
    "consume p99 us",
];

/// Decimals shown for each of [`FIGURE_NAMES`]: CPU-seconds per GB are fractions.
const FIGURE_DECIMALS: [usize; FIGURE_NAMES.len()] = [0, 0, 0, 0, 3, 3, 0, 0, 0, 0];

type Figures = [Option<f64>; FIGURE_NAMES.len()];

/// A latency percentile as a figure: `None` for a phase that recorded no latency (all zeros).
fn latency_figure(value: u64) -> Option<f64> {
    (value > 0).then_some(value as f64)
}

fn new_figures(run: &RunReport) -> Figures {
    [
        Some(run.produce.msgs_per_sec),
        Some(run.consume.msgs_per_sec),
        run.produce.msgs_per_server_cpu_second,
        run.consume.msgs_per_server_cpu_second,
        run.produce.host_cpu_seconds_per_gb,
        run.consume.host_cpu_seconds_per_gb,
        latency_figure(run.produce.latency_us.p50),
        latency_figure(run.produce.latency_us.p99),
        latency_figure(run.consume.latency_us.p50),
        latency_figure(run.consume.latency_us.p99),
    ]
}

fn old_figures(run: &BaselineRun) -> Figures {
    let latency = |phase: &BaselinePhase, pick: fn(&BaselineLatency) -> u64| {
        phase
            .latency_us
            .as_ref()
            .and_then(|latency| latency_figure(pick(latency)))
    };
    [
        Some(run.produce.msgs_per_sec),
        Some(run.consume.msgs_per_sec),
        run.produce.msgs_per_server_cpu_second,
        run.consume.msgs_per_server_cpu_second,
        run.produce.host_cpu_seconds_per_gb,
        run.consume.host_cpu_seconds_per_gb,
        latency(&run.produce, |latency| latency.p50),
        latency(&run.produce, |latency| latency.p99),
        latency(&run.consume, |latency| latency.p50),
        latency(&run.consume, |latency| latency.p99),
    ]
}

/// Per shard count, the spread of each figure over the count's runs.
fn spreads_by_count(
    runs: impl Iterator<Item = (u16, Figures)>,
) -> BTreeMap<u16, Vec<Option<Spread>>> {
    let mut by_count: BTreeMap<u16, Vec<Figures>> = BTreeMap::new();
    for (shards, figures) in runs {
        by_count.entry(shards).or_default().push(figures);
    }
    by_count
        .into_iter()
        .map(|(shards, runs)| {
            let spreads = (0..FIGURE_NAMES.len())
                .map(|index| {
                    let values: Vec<f64> = runs.iter().filter_map(|run| run[index]).collect();
                    Spread::of(&values)
                })
                .collect();
            (shards, spreads)
        })
        .collect()
}

/// The change a figure must exceed to be flagged: the larger relative range of its old and new
/// repeats, and at least [`SINGLE_RUN_SPREAD_FLOOR`] always: a single run measures no spread,
/// and repeats can agree exactly (CPU figures come in 10 ms ticks), which measures none either.
fn spread_allowed(old: &Spread, new: &Spread) -> f64 {
    old.relative_range()
        .max(new.relative_range())
        .max(SINGLE_RUN_SPREAD_FLOOR)
}

/// One row: figure, old median, new median, new/old, spread allowed and the flag.
fn comparison_row(
    out: &mut String,
    shards: u16,
    (name, decimals): (&str, usize),
    old: Option<Spread>,
    new: Option<Spread>,
) {
    let median = |spread: Option<Spread>| {
        spread.map_or_else(
            || "n/a".to_string(),
            |spread| format!("{:.decimals$}", spread.median),
        )
    };
    let (ratio, spread, flag) = match (old, new) {
        (Some(old), Some(new)) if old.median > 0.0 => {
            let ratio = new.median / old.median;
            let allowed = spread_allowed(&old, &new);
            let flag = if (ratio - 1.0).abs() > allowed {
                "*"
            } else {
                ""
            };
            (
                format!("{ratio:.2}x"),
                format!("{:.0}%", allowed * 100.0),
                flag,
            )
        }
        _ => ("n/a".to_string(), String::new(), ""),
    };
    let _ = writeln!(
        out,
        "{shards:>6} {name:<24} {:>12} {:>12} {ratio:>8} {spread:>7} {flag}",
        median(old),
        median(new),
    );
}

fn count_list(counts: &[u16]) -> String {
    counts
        .iter()
        .map(u16::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// A setting compared between the two reports: its `report::RunConfig` key, the bench flag that
/// sets it (what the warning names, since that is what the user changes), and the value `serve`
/// uses when the flag is not given (`None`: no server default stands in for an absent value).
struct Setting {
    key: &'static str,
    flag: &'static str,
    server_default: Option<&'static str>,
}

/// The server's default I/O driver (`serve --io-driver`'s default, `tools/src/serve.rs`).
const IO_DRIVER_DEFAULT: &str = "io-uring";

/// What `RunConfig::fsync` appends to the policy when `--fsync` was not given; the policy
/// before it is the effective one.
const FSYNC_DEFAULT_SUFFIX: &str = " (server default)";

/// The settings whose difference between the two reports makes the figures differ for a reason
/// other than the code under test. The shard count is not here: rows are per count already, and
/// counts run in one report only are listed as such.
const SETTINGS: [Setting; 16] = [
    Setting {
        key: "server",
        flag: "--addr",
        server_default: None,
    },
    Setting {
        key: "producers",
        flag: "--producers",
        server_default: None,
    },
    Setting {
        key: "consumers",
        flag: "--consumers",
        server_default: None,
    },
    Setting {
        key: "partitions",
        flag: "--partitions",
        server_default: None,
    },
    Setting {
        key: "batch_messages",
        flag: "--batch",
        server_default: None,
    },
    Setting {
        key: "messages",
        flag: "--messages",
        server_default: None,
    },
    Setting {
        key: "duration_seconds",
        flag: "--duration (s)",
        server_default: None,
    },
    Setting {
        key: "payload",
        flag: "--message-size/--payload-file",
        server_default: None,
    },
    Setting {
        key: "fsync",
        flag: "--fsync",
        server_default: None,
    },
    Setting {
        key: "write_mode",
        flag: "--write-mode",
        server_default: Some("buffered"),
    },
    Setting {
        key: "concurrent",
        flag: "--concurrent",
        server_default: None,
    },
    Setting {
        key: "cpus",
        flag: "--cpus",
        server_default: None,
    },
    Setting {
        key: "no_pin",
        flag: "--no-pin",
        server_default: None,
    },
    Setting {
        key: "io_driver",
        flag: "--io-driver",
        server_default: Some(IO_DRIVER_DEFAULT),
    },
    Setting {
        key: "inbox_capacity",
        flag: "--inbox-capacity",
        server_default: Some(INBOX_CAPACITY_DEFAULT_TEXT),
    },
    Setting {
        key: "idle_poll_us",
        flag: "--idle-poll-us",
        server_default: Some("0"),
    },
];

/// `runtime::limits::INBOX_CAPACITY_DEFAULT` as text (checked by a test).
const INBOX_CAPACITY_DEFAULT_TEXT: &str = "1024";

/// A setting's effective value as the warning shows it: strings bare, the server default for
/// an unset value that has one (`unset` otherwise), and `fsync`'s `always (server default)` as
/// the policy alone, so a default and the same value given explicitly compare equal.
fn setting_text(setting: &Setting, value: &serde_json::Value) -> String {
    match value {
        serde_json::Value::String(text) if setting.key == "fsync" => text
            .strip_suffix(FSYNC_DEFAULT_SUFFIX)
            .unwrap_or(text)
            .to_string(),
        serde_json::Value::String(text) => text.clone(),
        serde_json::Value::Null => setting.server_default.unwrap_or("unset").to_string(),
        other => other.to_string(),
    }
}

/// The distinct effective values of `setting` over `configs`, joined with `,`; `None` when any
/// config lacks the key (a report from before it existed: nothing to compare).
fn setting_values(configs: &[&serde_json::Value], setting: &Setting) -> Option<String> {
    let values: BTreeSet<String> = configs
        .iter()
        .map(|config| {
            config
                .get(setting.key)
                .map(|value| setting_text(setting, value))
        })
        .collect::<Option<_>>()?;
    Some(values.into_iter().collect::<Vec<_>>().join(","))
}

/// One warning line per setting of [`SETTINGS`] whose effective values differ between the
/// baseline's runs and `runs`, naming its flag and both values; empty when they agree or the
/// baseline carries no `config`.
pub fn settings_warnings(baseline: &Baseline, runs: &[RunReport]) -> Vec<String> {
    let old_configs: Vec<&serde_json::Value> = baseline
        .report
        .get("runs")
        .and_then(serde_json::Value::as_array)
        .map(|runs| runs.iter().filter_map(|run| run.get("config")).collect())
        .unwrap_or_default();
    let new_configs: Vec<serde_json::Value> = runs
        .iter()
        .map(|run| serde_json::to_value(&run.config).expect("a RunConfig serializes"))
        .collect();
    let new_configs: Vec<&serde_json::Value> = new_configs.iter().collect();
    if old_configs.is_empty() || new_configs.is_empty() {
        return Vec::new();
    }
    SETTINGS
        .iter()
        .filter_map(|setting| {
            let old = setting_values(&old_configs, setting)?;
            let new = setting_values(&new_configs, setting)?;
            (old != new).then(|| {
                format!(
                    "warning: settings differ: {} is {old} in {} but {new} in this run, so \
                     the figures below differ for that reason too",
                    setting.flag,
                    baseline.path.display()
                )
            })
        })
        .collect()
}

/// The comparison table: per shard count and figure, old, new, new/old, and a flag where the
/// change exceeds the spread seen between repeats.
///
/// Figures are medians over the runs of each count: produce and consume msgs/s, msgs per
/// server-CPU-second, host CPU-seconds per GB of payload, and p50/p99 latency (µs). A figure is flagged `*` where |new/old - 1|
/// exceeds the larger relative range (max - min) / median of its old and new repeats, with a
/// floor of [`SINGLE_RUN_SPREAD_FLOOR`] (the footer says so).
/// Counts present in only one report are listed as such, and settings that differ between the
/// two reports ([`settings_warnings`]) are warned about above the table.
pub fn render_comparison(baseline: &Baseline, runs: &[RunReport]) -> String {
    let old = spreads_by_count(
        baseline
            .runs
            .iter()
            .map(|run| (run.shards, old_figures(run))),
    );
    let new = spreads_by_count(runs.iter().map(|run| (run.shards, new_figures(run))));
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n== compared with {} (medians per shard count; * = moved beyond the run-to-run spread)",
        baseline.path.display()
    );
    for line in settings_warnings(baseline, runs) {
        let _ = writeln!(out, "{line}");
    }
    let _ = writeln!(
        out,
        "{:>6} {:<24} {:>12} {:>12} {:>8} {:>7}",
        "shards", "figure", "old", "new", "new/old", "spread"
    );
    for (shards, new_spreads) in &new {
        let Some(old_spreads) = old.get(shards) else {
            continue;
        };
        for (index, name) in FIGURE_NAMES.iter().enumerate() {
            comparison_row(
                &mut out,
                *shards,
                (name, FIGURE_DECIMALS[index]),
                old_spreads[index],
                new_spreads[index],
            );
        }
    }
    let only_old: Vec<u16> = old
        .keys()
        .filter(|count| !new.contains_key(count))
        .copied()
        .collect();
    let only_new: Vec<u16> = new
        .keys()
        .filter(|count| !old.contains_key(count))
        .copied()
        .collect();
    if !only_old.is_empty() {
        let _ = writeln!(
            out,
            "shard counts only in {}: {}",
            baseline.path.display(),
            count_list(&only_old)
        );
    }
    if !only_new.is_empty() {
        let _ = writeln!(
            out,
            "shard counts only in this run: {}",
            count_list(&only_new)
        );
    }
    let _ = writeln!(
        out,
        "spread: the larger (max - min) / median of the old and new repeats of that figure, at \
         least {:.0}% (a single run measures no spread, and repeats can agree to the 10 ms CPU tick)",
        SINGLE_RUN_SPREAD_FLOOR * 100.0
    );
    out
}

#[cfg(test)]
mod tests {
    use super::super::sweep::fixtures::{Table, runs};
    use super::*;

    fn baseline_of(table: &Table<'_>) -> (tempfile::TempDir, Baseline) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        // The runs as `bench --json` writes them (other top-level keys do not matter here).
        let report = serde_json::json!({ "runs": runs(table) });
        std::fs::write(&path, serde_json::to_string_pretty(&report).unwrap()).unwrap();
        let baseline = load_baseline(&path).unwrap();
        (dir, baseline)
    }

    /// The row of `figure` for `shards`, as whitespace-separated cells.
    fn row(text: &str, shards: u16, figure: &str) -> String {
        let prefix = format!("{shards} {figure} ");
        text.lines()
            .map(|line| line.split_whitespace().collect::<Vec<_>>().join(" "))
            .find(|line| line.starts_with(&prefix))
            .unwrap_or_else(|| panic!("no row {prefix:?} in\n{text}"))
    }

    #[test]
    fn comparison_gives_ratios_and_flags_moves_beyond_the_spread() {
        let (_dir, baseline) = baseline_of(&[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (104_000.0, Some(50_000.0))],
            ),
            (2, &[(200_000.0, Some(48_000.0))]),
            (8, &[(300_000.0, Some(30_000.0))]),
        ]);
        assert_eq!(baseline.runs.len(), 4);
        let new = runs(&[
            // 1 shard: +3% against a 4% (old) spread, floored at 5%: not flagged; efficiency +20% against repeats
            // that agree exactly (0% spread, 5% floor): flagged.
            (
                1,
                &[(105_000.0, Some(60_000.0)), (105_000.0, Some(60_000.0))],
            ),
            // 2 shards: single runs, 5% floor: +4% is not flagged, +10% efficiency is.
            (2, &[(208_000.0, Some(52_800.0))]),
            (4, &[(350_000.0, Some(44_000.0))]),
        ]);
        let text = render_comparison(&baseline, &new);
        assert_eq!(
            row(&text, 1, "produce msgs/s"),
            "1 produce msgs/s 102000 105000 1.03x 5%"
        );
        assert_eq!(
            row(&text, 1, "produce msgs/srv-cpu-s"),
            "1 produce msgs/srv-cpu-s 50000 60000 1.20x 5% *"
        );
        assert_eq!(
            row(&text, 2, "produce msgs/s"),
            "2 produce msgs/s 200000 208000 1.04x 5%"
        );
        assert_eq!(
            row(&text, 2, "consume msgs/srv-cpu-s"),
            "2 consume msgs/srv-cpu-s 96000 105600 1.10x 5% *"
        );
        assert_eq!(
            row(&text, 2, "produce p99 us"),
            "2 produce p99 us 400 400 1.00x 5%"
        );
        assert!(
            text.contains(&format!(
                "shard counts only in {}: 8\n",
                baseline.path.display()
            )),
            "{text}"
        );
        assert!(
            text.contains("shard counts only in this run: 4\n"),
            "{text}"
        );
        assert!(
            text.contains("at least 5% (a single run measures no spread"),
            "{text}"
        );
        // Host CPU per GB follows the efficiency in these fixtures (1.25 x server CPU): 1 shard
        // 25.000 -> 20.833 CPU-s/GB, flagged like the efficiency it mirrors.
        assert_eq!(
            row(&text, 1, "produce host-cpu-s/GB"),
            "1 produce host-cpu-s/GB 25.000 20.833 0.83x 5% *"
        );
        assert_eq!(
            text.lines().filter(|line| line.ends_with('*')).count(),
            8,
            "{text}"
        );
    }

    #[test]
    fn settings_that_differ_are_warned_about_with_both_values() {
        let (_dir, baseline) = baseline_of(&[(1, &[(100_000.0, Some(50_000.0))])]);
        let mut new = runs(&[(1, &[(100_000.0, Some(50_000.0))]), (2, &[(1.0, None)])]);
        assert_eq!(settings_warnings(&baseline, &new), Vec::<String>::new());
        let text = render_comparison(&baseline, &new);
        assert!(!text.contains("warning:"), "{text}");
        new[0].config.fsync = "always".to_string();
        new[1].config.batch_messages = 10;
        new[1].config.io_driver = Some("poll".to_string());
        let path = baseline.path.display();
        assert_eq!(
            settings_warnings(&baseline, &new),
            [
                format!(
                    "warning: settings differ: --batch is 1000 in {path} but 10,1000 in this \
                     run, so the figures below differ for that reason too"
                ),
                format!(
                    "warning: settings differ: --fsync is never in {path} but always,never in \
                     this run, so the figures below differ for that reason too"
                ),
                format!(
                    "warning: settings differ: --io-driver is io-uring in {path} but \
                     io-uring,poll in this run, so the figures below differ for that reason too"
                ),
            ]
        );
        let text = render_comparison(&baseline, &new);
        assert_eq!(
            text.lines().nth(2).unwrap(),
            settings_warnings(&baseline, &new)[0]
        );
    }

    #[test]
    fn a_server_default_equals_the_same_value_given_explicitly() {
        let (_dir, baseline) = baseline_of(&[(1, &[(100_000.0, Some(50_000.0))])]);
        let mut new = runs(&[(1, &[(100_000.0, Some(50_000.0))])]);
        // The baseline's runs leave every server setting unset and ran `--fsync never`.
        new[0].config.fsync = "always (server default)".to_string();
        let mut explicit = new.clone();
        explicit[0].config.fsync = "always".to_string();
        explicit[0].config.io_driver = Some("io-uring".to_string());
        explicit[0].config.inbox_capacity = Some(1024);
        explicit[0].config.idle_poll_us = Some(0);
        let (dir, default_baseline) = baseline_of(&[(1, &[(100_000.0, Some(50_000.0))])]);
        let mut report = default_baseline.report.clone();
        report["runs"][0]["config"] = serde_json::to_value(&new[0].config).unwrap();
        let default_path = dir.path().join("default.json");
        std::fs::write(&default_path, report.to_string()).unwrap();
        let default_baseline = load_baseline(&default_path).unwrap();
        assert_eq!(
            settings_warnings(&default_baseline, &explicit),
            Vec::<String>::new()
        );
        explicit[0].config.inbox_capacity = Some(64);
        explicit[0].config.idle_poll_us = Some(50);
        let path = default_path.display();
        assert_eq!(
            settings_warnings(&default_baseline, &explicit),
            [
                format!(
                    "warning: settings differ: --inbox-capacity is 1024 in {path} but 64 in \
                     this run, so the figures below differ for that reason too"
                ),
                format!(
                    "warning: settings differ: --idle-poll-us is 0 in {path} but 50 in this \
                     run, so the figures below differ for that reason too"
                ),
            ]
        );
        assert_eq!(settings_warnings(&baseline, &new).len(), 1);
    }

    #[test]
    fn the_inbox_capacity_default_is_the_runtimes() {
        assert_eq!(
            INBOX_CAPACITY_DEFAULT_TEXT,
            runtime::limits::INBOX_CAPACITY_DEFAULT.to_string()
        );
    }

    #[test]
    fn a_baseline_without_config_warns_about_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(
            &path,
            r#"{"runs": [{"shards": 1, "msgs_per_sec": 10.0, "consume": {"msgs_per_sec": 20.0}}]}"#,
        )
        .unwrap();
        let baseline = load_baseline(&path).unwrap();
        let new = runs(&[(1, &[(10.0, None)])]);
        assert_eq!(settings_warnings(&baseline, &new), Vec::<String>::new());
    }

    #[test]
    fn figures_missing_on_either_side_are_n_a() {
        let (_dir, baseline) = baseline_of(&[(1, &[(100_000.0, None)])]);
        let text = render_comparison(&baseline, &runs(&[(1, &[(100_000.0, Some(5.0))])]));
        assert_eq!(
            row(&text, 1, "produce msgs/srv-cpu-s"),
            "1 produce msgs/srv-cpu-s n/a 5 n/a"
        );
    }

    #[test]
    fn unknown_fields_are_ignored_and_old_reports_without_cpu_or_latency_load() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("old.json");
        std::fs::write(
            &path,
            r#"{"runs": [{"shards": 2, "msgs_per_sec": 10.0, "future_field": [1, 2],
                "consume": {"msgs_per_sec": 20.0}}], "host": "x"}"#,
        )
        .unwrap();
        let baseline = load_baseline(&path).unwrap();
        assert_eq!(baseline.runs[0].shards, 2);
        assert_eq!(baseline.runs[0].produce.msgs_per_server_cpu_second, None);
        assert_eq!(baseline.runs[0].consume.latency_us, None);
        assert_eq!(baseline.runs[0].produce.host_cpu_seconds_per_gb, None);
        let text = render_comparison(&baseline, &runs(&[(2, &[(10.0, Some(5.0))])]));
        assert_eq!(
            row(&text, 2, "produce host-cpu-s/GB"),
            "2 produce host-cpu-s/GB n/a 250000.000 n/a"
        );
    }

    #[test]
    fn a_metadata_report_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        std::fs::write(&path, r#"{"workload": "metadata", "runs": []}"#).unwrap();
        assert_eq!(
            format!("{:#}", load_baseline(&path).unwrap_err()),
            format!(
                "--compare {} is a --workload metadata report; --compare takes a report of the \
                 message workload (bench --json without --workload)",
                path.display()
            )
        );
    }

    #[test]
    fn bad_files_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing.json");
        assert_eq!(
            format!("{:#}", load_baseline(&missing).unwrap_err()),
            format!(
                "cannot read --compare {}: No such file or directory (os error 2)",
                missing.display()
            )
        );
        let not_json = dir.path().join("x.json");
        std::fs::write(&not_json, "shards,msgs\n").unwrap();
        assert!(
            format!("{:#}", load_baseline(&not_json).unwrap_err())
                .starts_with(&format!("--compare {} is not JSON: ", not_json.display()))
        );
        let no_runs = dir.path().join("y.json");
        std::fs::write(&no_runs, r#"{"rows": []}"#).unwrap();
        assert_eq!(
            format!("{:#}", load_baseline(&no_runs).unwrap_err()),
            format!(
                "--compare {} is not a bench --json report: it has no \"runs\" array",
                no_runs.display()
            )
        );
        let no_shards = dir.path().join("z.json");
        std::fs::write(&no_shards, r#"{"runs": [{"msgs_per_sec": 1.0}]}"#).unwrap();
        assert!(
            format!("{:#}", load_baseline(&no_shards).unwrap_err()).starts_with(&format!(
                "--compare {}: its runs lack the figures of a bench --json report: missing field",
                no_shards.display()
            ))
        );
    }
}
