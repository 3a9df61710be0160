//! `bench --csv FILE`: one row per run and phase, with a header (issue 10 section 2).

use std::path::Path;

use super::report::RunReport;

/// The CSV text: header, then one row per (run, phase).
pub fn render_csv(runs: &[RunReport]) -> String {
    let _ = runs;
    todo!("bench outputs helper")
}

/// Writes [`render_csv`] to `path` (replacing it).
///
/// # Errors
/// The path cannot be written (named in the error).
pub fn write_csv(path: &Path, runs: &[RunReport]) -> anyhow::Result<()> {
    let _ = (path, runs);
    todo!("bench outputs helper")
}
