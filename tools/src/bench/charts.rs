//! `bench --charts DIR`: SVG charts (plotters) of throughput and per-core efficiency vs shard
//! count, latency percentiles per shard count, and per-shard CPU bars (issue 10 section 2).

use std::path::{Path, PathBuf};

use super::report::RunReport;
use super::sweep::CountSummary;

/// Writes every chart into `dir` (created if missing); returns the files written.
///
/// # Errors
/// `dir` cannot be created or a chart cannot be drawn (named in the error).
pub fn write_charts(
    dir: &Path,
    runs: &[RunReport],
    summaries: &[CountSummary],
) -> anyhow::Result<Vec<PathBuf>> {
    let _ = (dir, runs, summaries);
    todo!("bench outputs helper")
}
