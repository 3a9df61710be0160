//! `bench --compare OLD.json`: each figure of this run against an earlier `--json` report, as a
//! ratio, flagged where it moved beyond the run-to-run spread (issue 10 section 2).

use std::path::Path;

use super::report::RunReport;

/// An earlier report, loaded before this run starts (so a bad path fails fast).
#[derive(Debug, Clone)]
pub struct Baseline {
    pub path: std::path::PathBuf,
    pub report: serde_json::Value,
}

/// Reads and checks `path` (a `bench --json` report of the message workload).
///
/// # Errors
/// The file cannot be read, is not JSON, or is not a bench report (each naming the path).
pub fn load_baseline(path: &Path) -> anyhow::Result<Baseline> {
    let _ = path;
    todo!("bench outputs helper")
}

/// The comparison table: per shard count and figure, old, new, new/old, and a flag where the
/// change exceeds the spread seen between repeats.
pub fn render_comparison(baseline: &Baseline, runs: &[RunReport]) -> String {
    let _ = (baseline, runs);
    todo!("bench outputs helper")
}
