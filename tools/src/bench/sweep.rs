//! `bench --shards 1,2,4,all --repeat K` / `--shards sweep`: median and spread per shard count,
//! and the recommendation (issue 10 section 2): the shard count that maximizes total throughput
//! while per-core efficiency (msgs per server-CPU-second) stays within a stated margin of the
//! 1-shard figure. Pure: report figures in, text out.

use serde::{Deserialize, Serialize};

use super::report::RunReport;

/// Per-core efficiency a larger shard count must keep, as a fraction of the 1-shard figure,
/// to be recommended.
pub const EFFICIENCY_MARGIN_DEFAULT: f64 = 0.8;

/// Median and range of one figure over the repeats of one shard count.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Spread {
    pub median: f64,
    pub min: f64,
    pub max: f64,
    pub runs: u32,
}

impl Spread {
    /// `None` for no values.
    pub fn of(values: &[f64]) -> Option<Spread> {
        let _ = values;
        todo!("bench outputs helper")
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
}

/// Groups `runs` by resolved shard count, ascending.
pub fn summarize(runs: &[RunReport]) -> Vec<CountSummary> {
    let _ = runs;
    todo!("bench outputs helper")
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

/// `None` when there is nothing to choose from (no 1-shard run, or no CPU figures: the line
/// printed instead comes from [`render_summary`]).
pub fn recommend(summaries: &[CountSummary], margin: f64) -> Option<Recommendation> {
    let _ = (summaries, margin);
    todo!("bench outputs helper")
}

/// The per-count table: median and spread of throughput and efficiency.
pub fn render_summary(summaries: &[CountSummary]) -> String {
    let _ = summaries;
    todo!("bench outputs helper")
}
