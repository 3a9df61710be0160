//! `bench --shards 1,2,4,all --repeat K` / `--shards sweep`: median and spread per shard count,
//! and the recommendation (issue 10 section 2): the shard count that maximizes total throughput
//! while per-core efficiency (msgs per server-CPU-second) stays within a stated margin of the
//! 1-shard figure. Pure: report figures in, text out; must never measure or print anything itself.
//!
//! Both the throughput and the efficiency that drive the recommendation are the produce phase's:
//! producing is where the shard count does its work (appends, group commit, forwarding between
//! shards), the consume phase only reads back what was produced, and under `--concurrent` only
//! the produce phase has CPU figures (they cover both phases). The consume figures are still
//! shown in the summary table.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use super::report::RunReport;

/// Per-core efficiency a larger shard count must keep, as a fraction of the 1-shard figure,
/// to be recommended.
pub const EFFICIENCY_MARGIN_DEFAULT: f64 = 0.8;

/// The smallest throughput gain (fraction of the smaller count's median) worth the cores of a
/// larger shard count, even when repeats agree closely or there is a single run (which measures
/// no spread): below it the curve is called flat. 5% is about what two runs of the same count
/// differ by on a quiet host.
pub const GAIN_MIN: f64 = 0.05;

/// Median and range of one figure over the repeats of one shard count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: u32,
}

impl Spread {
    /// Median (the mean of the middle two for an even count), min and max of `values`; `None`
    /// for no values.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        let count = sorted.len();
        let (&min, &max) = (sorted.first()?, sorted.last()?);
        let median = if count % 2 == 1 {
            sorted[count / 2]
        } else {
            f64::midpoint(sorted[count / 2 - 1], sorted[count / 2])
        };
        Some(Spread {
            median,
            min,
            max,
            runs: count as u32,
        })
    }

    /// `(max - min) / median`: how far the repeats disagree, as a fraction of the median; 0 for
    /// a single run or a zero median.
    pub fn relative_range(&self) -> f64 {
        if self.median > 0.0 {
            (self.max - self.min) / self.median
        } else {
            0.0
        }
    }
}

/// The figures of one shard count over its repeats.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CountSummary {
    pub shards: u16,
    pub produce_msgs_per_sec: Spread,
    pub consume_msgs_per_sec: Spread,
    /// Absent when no run of this count had a CPU figure (`--addr` without `--server-pid`).
    pub produce_msgs_per_server_cpu_second: Option<Spread>,
    pub consume_msgs_per_server_cpu_second: Option<Spread>,
    /// Host CPU-seconds of the phase (`report::PhaseFigures::host_cpu_seconds`); absent when
    /// no run of this count had one.
    pub produce_host_cpu_seconds: Option<Spread>,
    pub consume_host_cpu_seconds: Option<Spread>,
    /// Host CPU-seconds per 10^9 payload bytes of the phase.
    pub produce_host_cpu_seconds_per_gb: Option<Spread>,
    pub consume_host_cpu_seconds_per_gb: Option<Spread>,
}

/// Groups `runs` by resolved shard count, ascending. A count's efficiency spread covers only
/// the runs that had a CPU figure (its `runs` says how many).
pub fn summarize(runs: &[RunReport]) -> Vec<CountSummary> {
    let mut by_count: BTreeMap<u16, Vec<&RunReport>> = BTreeMap::new();
    for run in runs {
        by_count.entry(run.shards).or_default().push(run);
    }
    by_count
        .into_iter()
        .map(|(shards, runs)| {
            let spread = |figure: &dyn Fn(&RunReport) -> Option<f64>| {
                let values: Vec<f64> = runs.iter().filter_map(|run| figure(run)).collect();
                Spread::of(&values)
            };
            CountSummary {
                shards,
                produce_msgs_per_sec: spread(&|run| Some(run.produce.msgs_per_sec))
                    .expect("every group holds at least one run"),
                consume_msgs_per_sec: spread(&|run| Some(run.consume.msgs_per_sec))
                    .expect("every group holds at least one run"),
                produce_msgs_per_server_cpu_second: spread(&|run| {
                    run.produce.msgs_per_server_cpu_second
                }),
                consume_msgs_per_server_cpu_second: spread(&|run| {
                    run.consume.msgs_per_server_cpu_second
                }),
                produce_host_cpu_seconds: spread(&|run| run.produce.host_cpu_seconds),
                consume_host_cpu_seconds: spread(&|run| run.consume.host_cpu_seconds),
                produce_host_cpu_seconds_per_gb: spread(&|run| run.produce.host_cpu_seconds_per_gb),
                consume_host_cpu_seconds_per_gb: spread(&|run| run.consume.host_cpu_seconds_per_gb),
            }
        })
        .collect()
}

/// The recommended shard count and why, in one line.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Recommendation {
    pub shards: u16,
    pub margin: f64,
    /// E.g. "4 shards: 3.6x the 1-shard throughput at 0.91x per-core efficiency; 8 shards adds
    /// 4% for 0.62x".
    pub line: String,
}

/// The count the others are measured against: 1 shard, or the smallest count run.
fn baseline(summaries: &[CountSummary]) -> Option<&CountSummary> {
    summaries
        .iter()
        .find(|summary| summary.shards == 1)
        .or_else(|| summaries.iter().min_by_key(|summary| summary.shards))
}

/// Produce-phase efficiency of `summary` relative to `base_efficiency`; `None` without a figure.
fn efficiency_ratio(summary: &CountSummary, base_efficiency: f64) -> Option<f64> {
    summary
        .produce_msgs_per_server_cpu_second
        .map(|spread| spread.median / base_efficiency)
}

/// The throughput gain `larger` must show over `smaller` to count as more than noise: the wider
/// relative range of their repeats, and at least [`GAIN_MIN`].
fn gain_needed(smaller: &CountSummary, larger: &CountSummary) -> f64 {
    smaller
        .produce_msgs_per_sec
        .relative_range()
        .max(larger.produce_msgs_per_sec.relative_range())
        .max(GAIN_MIN)
}

/// `value / base` to one decimal, or "n/a" for a base of zero (a run that moved nothing).
fn ratio_text(value: f64, base: f64) -> String {
    if base > 0.0 {
        format!("{:.1}x", value / base)
    } else {
        "n/a".to_string()
    }
}

fn shard_noun(count: u16) -> &'static str {
    if count == 1 { "shard" } else { "shards" }
}

/// The shard count that maximizes total (produce) throughput while its produce efficiency
/// median stays `>= margin` x the 1-shard figure, with the reason in one line.
///
/// A larger count must beat the smallest count that comes close to the best by more than the
/// run-to-run spread (and at least [`GAIN_MIN`]): on a flat curve, or when the repeats scatter
/// wider than the counts differ, the smallest such count is recommended and the line says why.
/// Without a 1-shard run, the smallest count run is the baseline and the line says so. `margin`
/// is a fraction (0.8 = 80%).
///
/// `None` when there is nothing to choose from: no runs, or no CPU figure for the baseline count
/// (see [`no_recommendation_reason`]).
pub fn recommend(summaries: &[CountSummary], margin: f64) -> Option<Recommendation> {
    let base = baseline(summaries)?;
    let base_efficiency = base
        .produce_msgs_per_server_cpu_second
        .map(|spread| spread.median)
        .filter(|median| *median > 0.0)?;
    let mut eligible: Vec<&CountSummary> = summaries
        .iter()
        .filter(|summary| {
            // The baseline qualifies whatever the margin (even one above 1).
            summary.shards == base.shards
                || efficiency_ratio(summary, base_efficiency).is_some_and(|ratio| ratio >= margin)
        })
        .collect();
    eligible.sort_by_key(|summary| summary.shards);
    let best = eligible
        .iter()
        .copied()
        .max_by(|a, b| {
            a.produce_msgs_per_sec
                .median
                .total_cmp(&b.produce_msgs_per_sec.median)
        })
        .expect("the baseline is always eligible");
    let chosen = eligible
        .iter()
        .copied()
        .find(|summary| {
            summary.produce_msgs_per_sec.median * (1.0 + gain_needed(summary, best))
                >= best.produce_msgs_per_sec.median
        })
        .expect("the best count is within noise of itself");
    let line = recommendation_line(summaries, base, base_efficiency, chosen, best, margin);
    Some(Recommendation {
        shards: chosen.shards,
        margin,
        line,
    })
}

/// "N shards: Tx the B-shard throughput at Ex per-core efficiency; M shards adds G% for E'x",
/// where M is the next larger count (not chosen), plus why M was not chosen when that is not
/// plain from its efficiency, and a note when there was no 1-shard run.
fn recommendation_line(
    summaries: &[CountSummary],
    base: &CountSummary,
    base_efficiency: f64,
    chosen: &CountSummary,
    best: &CountSummary,
    margin: f64,
) -> String {
    let mut line = if chosen.shards == base.shards {
        format!(
            "{} {}: the baseline",
            chosen.shards,
            shard_noun(chosen.shards)
        )
    } else {
        format!(
            "{} shards: {} the {}-shard throughput at {:.2}x per-core efficiency",
            chosen.shards,
            ratio_text(
                chosen.produce_msgs_per_sec.median,
                base.produce_msgs_per_sec.median
            ),
            base.shards,
            efficiency_ratio(chosen, base_efficiency).expect("a chosen count has a CPU figure"),
        )
    };
    let next = summaries
        .iter()
        .filter(|summary| summary.shards > chosen.shards)
        .min_by_key(|summary| summary.shards);
    match next {
        None => line.push_str("; no larger count was run"),
        Some(next) => {
            let gain = next.produce_msgs_per_sec.median / chosen.produce_msgs_per_sec.median - 1.0;
            let change = if !gain.is_finite() {
                format!("runs at {:.0} msgs/s", next.produce_msgs_per_sec.median)
            } else if gain >= 0.0 {
                format!("adds {:.0}%", gain * 100.0)
            } else {
                format!("loses {:.0}%", -gain * 100.0)
            };
            let _ = write!(line, "; {} shards {change}", next.shards);
            match efficiency_ratio(next, base_efficiency) {
                None => line.push_str(" with no CPU figure to judge its efficiency"),
                Some(ratio) if ratio < margin => {
                    let _ = write!(line, " for {ratio:.2}x");
                }
                Some(ratio) => {
                    let _ = write!(line, " for {ratio:.2}x");
                    line.push_str(&within_noise_clause(chosen, best, margin));
                }
            }
        }
    }
    if base.shards != 1 {
        let _ = write!(
            line,
            "; no 1-shard run, so figures are relative to {} shards, the smallest count run",
            base.shards
        );
    }
    line
}

/// Why an eligible larger count was not chosen: its gain is within what the repeats scatter
/// (noisy: the figures cannot separate the counts) or below [`GAIN_MIN`] (flat curve).
fn within_noise_clause(chosen: &CountSummary, best: &CountSummary, margin: f64) -> String {
    let needed = gain_needed(chosen, best);
    if needed > GAIN_MIN {
        format!(
            ", within the {:.0}% run-to-run spread: the figures cannot separate these counts, \
             so the smallest is recommended (rerun with a larger --repeat)",
            needed * 100.0
        )
    } else {
        format!(
            ", and no larger count at >= {margin:.2}x efficiency adds more than {:.0}% (flat \
             curve), so the smallest is recommended",
            GAIN_MIN * 100.0
        )
    }
}

/// Why [`recommend`] gave `None` for `summaries`, or `None` when it gives a recommendation.
pub fn no_recommendation_reason(summaries: &[CountSummary]) -> Option<String> {
    let base = baseline(summaries)?;
    let has_figure = base
        .produce_msgs_per_server_cpu_second
        .is_some_and(|spread| spread.median > 0.0);
    (!has_figure).then(|| {
        format!(
            "no recommendation: the {} {} run has no CPU figure to measure per-core efficiency \
             against (with --addr, pass --server-pid)",
            base.shards,
            shard_noun(base.shards)
        )
    })
}

fn spread_cell(spread: Option<Spread>) -> String {
    spread_cell_with(spread, 0)
}

/// `median [min..max]` with `decimals` decimals, or `n/a`.
fn spread_cell_with(spread: Option<Spread>, decimals: usize) -> String {
    spread.map_or_else(
        || "n/a".to_string(),
        |spread| {
            format!(
                "{:.decimals$} [{:.decimals$}..{:.decimals$}]",
                spread.median, spread.min, spread.max
            )
        },
    )
}

/// The host-CPU table under the summary: per count and phase, host CPU-seconds and host
/// CPU-seconds per 10^9 payload bytes, each as median [min..max] (`report::PhaseFigures`).
fn render_host_summary(summaries: &[CountSummary]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "host CPU (CPU-seconds of the whole host less the bench's own; s/GB per 10^9 payload \
         bytes; median [min..max])"
    );
    let _ = writeln!(
        out,
        "{:>6} {:>4} {:>24} {:>27} {:>24} {:>27}",
        "shards",
        "runs",
        "produce host-cpu",
        "produce host-s/GB",
        "consume host-cpu",
        "consume host-s/GB"
    );
    for summary in summaries {
        let _ = writeln!(
            out,
            "{:>6} {:>4} {:>24} {:>27} {:>24} {:>27}",
            summary.shards,
            summary.produce_msgs_per_sec.runs,
            spread_cell_with(summary.produce_host_cpu_seconds, 2),
            spread_cell_with(summary.produce_host_cpu_seconds_per_gb, 3),
            spread_cell_with(summary.consume_host_cpu_seconds, 2),
            spread_cell_with(summary.consume_host_cpu_seconds_per_gb, 3),
        );
    }
    out
}

fn ratio_cell(value: Option<Spread>, base: Option<Spread>) -> String {
    match (value, base) {
        (Some(value), Some(base)) if base.median > 0.0 => {
            format!("{:.2}x", value.median / base.median)
        }
        _ => "n/a".to_string(),
    }
}

/// The per-count table: runs, then for produce and consume the msgs/s and the msgs per
/// server-CPU-second, each as median [min..max] and relative to the baseline count's median
/// (1 shard, or the smallest count run, named in the header). Ends with a line saying why there
/// is no recommendation, when [`recommend`] gives none.
pub fn render_summary(summaries: &[CountSummary]) -> String {
    let mut out = String::new();
    let Some(base) = baseline(summaries) else {
        return "no runs to summarize\n".to_string();
    };
    let _ = writeln!(
        out,
        "\n== summary per shard count (median [min..max] over repeats; x = relative to {} {})",
        base.shards,
        shard_noun(base.shards)
    );
    let _ = writeln!(
        out,
        "{:>6} {:>4} {:>30} {:>6} {:>30} {:>6} {:>30} {:>6} {:>30} {:>6}",
        "shards",
        "runs",
        "produce msgs/s",
        "x",
        "produce msgs/srv-cpu-s",
        "x",
        "consume msgs/s",
        "x",
        "consume msgs/srv-cpu-s",
        "x"
    );
    for summary in summaries {
        let _ = writeln!(
            out,
            "{:>6} {:>4} {:>30} {:>6} {:>30} {:>6} {:>30} {:>6} {:>30} {:>6}",
            summary.shards,
            summary.produce_msgs_per_sec.runs,
            spread_cell(Some(summary.produce_msgs_per_sec)),
            ratio_cell(
                Some(summary.produce_msgs_per_sec),
                Some(base.produce_msgs_per_sec)
            ),
            spread_cell(summary.produce_msgs_per_server_cpu_second),
            ratio_cell(
                summary.produce_msgs_per_server_cpu_second,
                base.produce_msgs_per_server_cpu_second
            ),
            spread_cell(Some(summary.consume_msgs_per_sec)),
            ratio_cell(
                Some(summary.consume_msgs_per_sec),
                Some(base.consume_msgs_per_sec)
            ),
            spread_cell(summary.consume_msgs_per_server_cpu_second),
            ratio_cell(
                summary.consume_msgs_per_server_cpu_second,
                base.consume_msgs_per_server_cpu_second
            ),
        );
    }
    out.push_str(&render_host_summary(summaries));
    if let Some(reason) = no_recommendation_reason(summaries) {
        let _ = writeln!(out, "{reason}");
    }
    out
}

/// Run reports made from a few figures, for the tests of this module and its siblings (CSV,
/// charts, compare).
#[cfg(test)]
pub(crate) mod fixtures {
    use super::super::report::{
        LatencySummary, PhaseFigures, RunConfig, RunReport, ShardPhase, ShardReport,
    };

    /// A phase with `msgs_per_sec` and, when given, `efficiency` msgs per server-CPU-second
    /// (over a 10 s phase of 1000-byte messages).
    pub fn phase(msgs_per_sec: f64, efficiency: Option<f64>) -> PhaseFigures {
        let elapsed_seconds = 10.0;
        let messages = msgs_per_sec * elapsed_seconds;
        let server_cpu_seconds = efficiency.map(|efficiency| messages / efficiency);
        PhaseFigures {
            msgs_per_sec,
            mb_per_sec: msgs_per_sec * 1000.0 / 1e6,
            shard_cpu_seconds: server_cpu_seconds.map(|seconds| seconds * 0.75),
            io_worker_cpu_seconds: server_cpu_seconds.map(|seconds| seconds * 0.2),
            server_cpu_seconds,
            msgs_per_server_cpu_second: efficiency,
            msgs_per_shard_cpu_second: efficiency.map(|efficiency| efficiency / 0.75),
            // Writeback and the rest of the host: a quarter more than the server's own.
            host_cpu_seconds: server_cpu_seconds.map(|seconds| seconds * 1.25),
            host_cpu_seconds_per_gb: server_cpu_seconds
                .map(|seconds| seconds * 1.25 / (messages * 1000.0 / 1e9)),
            load_generator_cpu_seconds: server_cpu_seconds,
            writeback_flush_seconds: efficiency.map(|_| 0.5),
            latency_us: LatencySummary {
                p50: 100,
                p90: 200,
                p99: 400,
                p999: 900,
                max: 1500,
            },
            elapsed_seconds,
            busy_retries: 0,
        }
    }

    fn config(shards: u16) -> RunConfig {
        RunConfig {
            server: "embedded".to_string(),
            server_pid: Some(42),
            shards_requested: shards.to_string(),
            producers: 2,
            consumers: 2,
            partitions: 8,
            batch_messages: 1000,
            messages: None,
            duration_seconds: Some(10),
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
            data_dir: None,
            data_dir_on_tmpfs: None,
        }
    }

    /// One run of `shards` shards: produce at `produce` msgs/s and `efficiency`, consume at
    /// twice that; each shard gets an equal share and CPU.
    pub fn run(
        shards: u16,
        repeat: u32,
        sequence: u32,
        produce: f64,
        efficiency: Option<f64>,
    ) -> RunReport {
        let produce_figures = phase(produce, efficiency);
        let consume_figures = phase(produce * 2.0, efficiency.map(|value| value * 2.0));
        let share = |figures: &PhaseFigures| ShardPhase {
            messages: (figures.msgs_per_sec * figures.elapsed_seconds) as u64 / u64::from(shards),
            msgs_per_sec: figures.msgs_per_sec / f64::from(shards),
            mb_per_sec: figures.mb_per_sec / f64::from(shards),
            cpu_seconds: figures
                .shard_cpu_seconds
                .map(|seconds| seconds / f64::from(shards)),
            msgs_per_cpu_second: figures.msgs_per_shard_cpu_second,
        };
        RunReport {
            shards,
            messages_sent: (produce * 10.0) as u64,
            messages_verified: (produce * 10.0) as u64,
            messages_lost: 0,
            per_shard: (0..shards)
                .map(|shard| ShardReport {
                    shard,
                    partition_ids: vec![shard],
                    produce: share(&produce_figures),
                    consume: share(&consume_figures),
                })
                .collect(),
            produce: produce_figures,
            consume: consume_figures,
            config: config(shards),
            repeat,
            sequence,
            page_cache_note: None,
        }
    }

    /// One repeat: produce msgs/s and msgs per server-CPU-second.
    pub type Repeat = (f64, Option<f64>);
    /// A recorded sweep: `(shards, repeats)` per count.
    pub type Table<'a> = [(u16, &'a [Repeat])];

    /// Runs from a table of `(shards, [(produce msgs/s, efficiency)...])`, one per repeat, in
    /// the order given.
    pub fn runs(table: &Table<'_>) -> Vec<RunReport> {
        let mut sequence = 0;
        let mut out = Vec::new();
        for (shards, repeats) in table {
            for (index, (produce, efficiency)) in repeats.iter().enumerate() {
                out.push(run(
                    *shards,
                    index as u32 + 1,
                    sequence,
                    *produce,
                    *efficiency,
                ));
                sequence += 1;
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are exact medians of the given figures"
)]
mod tests {
    use super::fixtures::{Table, runs};
    use super::*;

    fn recommend_line(table: &Table<'_>) -> Option<(u16, String)> {
        recommend(&summarize(&runs(table)), EFFICIENCY_MARGIN_DEFAULT)
            .map(|recommendation| (recommendation.shards, recommendation.line))
    }

    #[test]
    fn spread_takes_the_median_and_range() {
        assert_eq!(Spread::of(&[]), None);
        assert_eq!(
            Spread::of(&[3.0, 1.0, 2.0]),
            Some(Spread {
                median: 2.0,
                min: 1.0,
                max: 3.0,
                runs: 3
            })
        );
        let even = Spread::of(&[4.0, 1.0, 2.0, 10.0]).unwrap();
        assert_eq!(
            (even.median, even.min, even.max, even.runs),
            (3.0, 1.0, 10.0, 4)
        );
        assert_eq!(Spread::of(&[5.0]).unwrap().relative_range(), 0.0);
        assert_eq!(even.relative_range(), 3.0);
    }

    #[test]
    fn summarize_groups_by_count_ascending() {
        let summaries = summarize(&runs(&[
            (4, &[(300.0, Some(90.0)), (340.0, None)]),
            (1, &[(100.0, Some(100.0))]),
        ]));
        assert_eq!(
            summaries.iter().map(|s| s.shards).collect::<Vec<_>>(),
            [1, 4]
        );
        let four = &summaries[1];
        assert_eq!(four.produce_msgs_per_sec.median, 320.0);
        assert_eq!(four.produce_msgs_per_sec.runs, 2);
        assert_eq!(four.consume_msgs_per_sec.median, 640.0);
        // Only the run with a CPU figure counts towards the efficiency spread.
        let efficiency = four.produce_msgs_per_server_cpu_second.unwrap();
        assert_eq!((efficiency.median, efficiency.runs), (90.0, 1));
        assert_eq!(
            four.consume_msgs_per_server_cpu_second.unwrap().median,
            180.0
        );
    }

    #[test]
    fn knee_recommends_the_largest_efficient_count() {
        // Throughput climbs to 4 shards at 91% efficiency; 8 adds 4% at 62%.
        let table: &Table<'_> = &[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (101_000.0, Some(50_500.0))],
            ),
            (
                2,
                &[(190_000.0, Some(48_000.0)), (191_000.0, Some(48_200.0))],
            ),
            (
                4,
                &[(360_000.0, Some(45_500.0)), (361_000.0, Some(45_700.0))],
            ),
            (
                8,
                &[(375_000.0, Some(31_000.0)), (376_000.0, Some(31_200.0))],
            ),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                4,
                "4 shards: 3.6x the 1-shard throughput at 0.91x per-core efficiency; 8 shards \
                 adds 4% for 0.62x"
                    .to_string()
            )
        );
    }

    #[test]
    fn largest_count_says_none_was_larger() {
        let table: &Table<'_> = &[
            (1, &[(100_000.0, Some(50_000.0))]),
            (2, &[(196_000.0, Some(47_500.0))]),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                2,
                "2 shards: 2.0x the 1-shard throughput at 0.95x per-core efficiency; no larger \
                 count was run"
                    .to_string()
            )
        );
    }

    #[test]
    fn flat_curve_recommends_the_smallest_count_near_the_best() {
        // Repeats agree within 1%, and no count adds more than 5% over 1 shard.
        let table: &Table<'_> = &[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (100_500.0, Some(50_100.0))],
            ),
            (
                2,
                &[(102_000.0, Some(49_000.0)), (102_400.0, Some(49_100.0))],
            ),
            (
                4,
                &[(103_000.0, Some(45_000.0)), (103_500.0, Some(45_100.0))],
            ),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                1,
                "1 shard: the baseline; 2 shards adds 2% for 0.98x, and no larger count at >= \
                 0.80x efficiency adds more than 5% (flat curve), so the smallest is recommended"
                    .to_string()
            )
        );
    }

    #[test]
    fn noisy_run_cannot_separate_the_counts() {
        // 2 shards scatter over 30% of their median; 4 shards are 12% faster, within that.
        let table: &Table<'_> = &[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (101_000.0, Some(50_000.0))],
            ),
            (
                2,
                &[
                    (170_000.0, Some(47_000.0)),
                    (200_000.0, Some(47_000.0)),
                    (230_000.0, Some(47_000.0)),
                ],
            ),
            (4, &[(224_000.0, Some(44_000.0))]),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                2,
                "2 shards: 2.0x the 1-shard throughput at 0.94x per-core efficiency; 4 shards \
                 adds 12% for 0.88x, within the 30% run-to-run spread: the figures cannot \
                 separate these counts, so the smallest is recommended (rerun with a larger \
                 --repeat)"
                    .to_string()
            )
        );
    }

    #[test]
    fn without_a_one_shard_run_the_smallest_count_is_the_baseline() {
        let table: &Table<'_> = &[
            (2, &[(200_000.0, Some(50_000.0))]),
            (4, &[(380_000.0, Some(46_000.0))]),
            (8, &[(370_000.0, Some(25_000.0))]),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                4,
                "4 shards: 1.9x the 2-shard throughput at 0.92x per-core efficiency; 8 shards \
                 loses 3% for 0.50x; no 1-shard run, so figures are relative to 2 shards, the \
                 smallest count run"
                    .to_string()
            )
        );
    }

    #[test]
    fn missing_cpu_figures_give_no_recommendation_and_say_why() {
        let table: &Table<'_> = &[(1, &[(100_000.0, None)]), (2, &[(190_000.0, None)])];
        let summaries = summarize(&runs(table));
        assert_eq!(recommend(&summaries, EFFICIENCY_MARGIN_DEFAULT), None);
        assert_eq!(
            no_recommendation_reason(&summaries).unwrap(),
            "no recommendation: the 1 shard run has no CPU figure to measure per-core \
             efficiency against (with --addr, pass --server-pid)"
        );
        assert!(render_summary(&summaries).contains("no recommendation: the 1 shard run"));
        assert_eq!(recommend(&[], EFFICIENCY_MARGIN_DEFAULT), None);
    }

    #[test]
    fn a_larger_count_without_cpu_figures_is_not_recommended() {
        let table: &Table<'_> = &[
            (1, &[(100_000.0, Some(50_000.0))]),
            (2, &[(190_000.0, None)]),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                1,
                "1 shard: the baseline; 2 shards adds 90% with no CPU figure to judge its \
                 efficiency"
                    .to_string()
            )
        );
    }

    #[test]
    fn a_baseline_that_moved_nothing_gives_no_ratio() {
        let table: &Table<'_> = &[
            (1, &[(0.0, Some(50_000.0))]),
            (2, &[(0.0, Some(50_000.0))]),
            (4, &[(100_000.0, Some(45_000.0))]),
        ];
        assert_eq!(
            recommend_line(table).unwrap(),
            (
                4,
                "4 shards: n/a the 1-shard throughput at 0.90x per-core efficiency; no larger \
                 count was run"
                    .to_string()
            )
        );
    }

    #[test]
    fn margin_decides_which_counts_qualify() {
        let table: &Table<'_> = &[
            (1, &[(100_000.0, Some(50_000.0))]),
            (2, &[(180_000.0, Some(35_000.0))]),
        ];
        let summaries = summarize(&runs(table));
        assert_eq!(recommend(&summaries, 0.8).unwrap().shards, 1);
        let loose = recommend(&summaries, 0.6).unwrap();
        assert_eq!((loose.shards, loose.margin), (2, 0.6));
        // A margin no count can meet still recommends the baseline.
        let strict = recommend(&summaries, 1.5).unwrap();
        assert_eq!(
            (strict.shards, strict.line.as_str()),
            (1, "1 shard: the baseline; 2 shards adds 80% for 0.70x")
        );
    }

    #[test]
    fn summary_table_shows_median_range_and_ratios() {
        let table: &Table<'_> = &[
            (
                1,
                &[(100_000.0, Some(50_000.0)), (110_000.0, Some(52_000.0))],
            ),
            (2, &[(190_000.0, Some(48_000.0)), (200_000.0, None)]),
        ];
        let text = render_summary(&summarize(&runs(table)));
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(
            lines[1],
            "== summary per shard count (median [min..max] over repeats; x = relative to 1 shard)"
        );
        let cells = |line: &str| line.split_whitespace().collect::<Vec<_>>().join(" ");
        assert_eq!(
            cells(lines[3]),
            "1 2 105000 [100000..110000] 1.00x 51000 [50000..52000] 1.00x \
             210000 [200000..220000] 1.00x 102000 [100000..104000] 1.00x"
        );
        assert_eq!(
            cells(lines[4]),
            "2 2 195000 [190000..200000] 1.86x 48000 [48000..48000] 0.94x \
             390000 [380000..400000] 1.86x 96000 [96000..96000] 0.94x"
        );
        // Host CPU: the fixtures' 1.25 x server CPU-seconds, e.g. 1 shard's produce runs
        // 25.00 (10^6 msgs / 50 000 x 1.25) and 26.44 CPU-s, over 1.0 and 1.1 GB.
        assert_eq!(
            lines[5],
            "host CPU (CPU-seconds of the whole host less the bench's own; s/GB per 10^9 payload \
             bytes; median [min..max])"
        );
        assert_eq!(
            cells(lines[6]),
            "shards runs produce host-cpu produce host-s/GB consume host-cpu consume host-s/GB"
        );
        assert_eq!(
            cells(lines[7]),
            "1 2 25.72 [25.00..26.44] 24.519 [24.038..25.000] 25.72 [25.00..26.44] \
             12.260 [12.019..12.500]"
        );
        assert_eq!(
            cells(lines[8]),
            "2 2 49.48 [49.48..49.48] 26.042 [26.042..26.042] 49.48 [49.48..49.48] \
             13.021 [13.021..13.021]"
        );
        assert_eq!(lines.len(), 9, "{text}");
    }
}
