//! The report files (`--json`, `--csv`): opened before the first run, so that a path that cannot
//! be written fails at once, naming the flag and the path, instead of after the whole bench;
//! written once, when the report exists.
//!
//! Must never leave a file or `--charts` directory it created behind without a report (a bench
//! that fails before its report removes it on drop; a stop signal, which skips drops, removes it
//! through `interrupt`, where each created output is registered under `interrupt::outputs_lock`
//! until its report is written) and never empties a file that existed until the report replaces
//! its contents.

use std::fs::{File, OpenOptions};
use std::io::Write as _;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use serde::Serialize;

use super::interrupt::{self, CreatedOutput, OutputKind};

/// An open report file, waiting for its report.
#[derive(Debug)]
pub struct ReportFile {
    /// The flag that named the file (`--csv`), for errors.
    flag: &'static str,
    path: PathBuf,
    file: File,
    /// This bench created the file (it did not exist), so removes it if no report comes.
    created: bool,
    /// The report is in the file.
    written: bool,
}

impl ReportFile {
    /// Opens `path`, named by `flag` (`--csv`), for writing, creating it if missing; an existing
    /// file keeps its contents.
    ///
    /// # Errors
    /// `cannot create FLAG PATH` with the OS error: a missing parent directory, no write
    /// permission, a directory at `path`.
    pub fn open(flag: &'static str, path: &Path) -> anyhow::Result<ReportFile> {
        let context = || format!("cannot create {flag} {}", path.display());
        // Held from the creation to its registration: a stop signal in between waits, then
        // finds the file.
        let mut outputs = interrupt::outputs_lock();
        let (file, created) = match OpenOptions::new().write(true).create_new(true).open(path) {
            Ok(file) => (file, true),
            Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => (
                OpenOptions::new()
                    .write(true)
                    .open(path)
                    .with_context(context)?,
                false,
            ),
            Err(error) => return Err(error).with_context(context),
        };
        if created {
            outputs.created(CreatedOutput {
                flag,
                path: path.to_path_buf(),
                kind: OutputKind::File,
            });
        }
        Ok(ReportFile {
            flag,
            path: path.to_path_buf(),
            file,
            created,
            written: false,
        })
    }

    /// Replaces the file's contents with `text`.
    ///
    /// # Errors
    /// `cannot write FLAG PATH` with the OS error.
    pub fn write_text(mut self, text: &str) -> anyhow::Result<()> {
        // Held across the write: a stop signal never removes a file being written, nor one
        // whose report is complete.
        let mut outputs = interrupt::outputs_lock();
        self.file
            .set_len(0)
            .and_then(|()| self.file.write_all(text.as_bytes()))
            .with_context(|| format!("cannot write {} {}", self.flag, self.path.display()))?;
        self.written = true;
        outputs.forget(&self.path);
        Ok(())
    }
}

impl Drop for ReportFile {
    fn drop(&mut self) {
        if self.created && !self.written {
            let mut outputs = interrupt::outputs_lock();
            // Err: it is gone already or its directory changed; an empty file is all that stays.
            let _ = std::fs::remove_file(&self.path);
            outputs.forget(&self.path);
        }
    }
}

/// A `--charts` directory, checked to take files and waiting for its charts. The directories
/// this bench created for it (it and any missing parents) are removed, while empty, if no
/// charts come.
#[derive(Debug)]
pub struct ChartsDir {
    path: PathBuf,
    /// Created by this bench, outermost first.
    created: Vec<PathBuf>,
}

impl ChartsDir {
    /// Creates `path` (with its parents) and checks that a file can be created in it.
    ///
    /// # Errors
    /// `cannot create --charts PATH` or `cannot write into --charts PATH` with the OS error.
    pub fn prepare(path: &Path) -> anyhow::Result<ChartsDir> {
        let mut missing: Vec<PathBuf> = path
            .ancestors()
            .take_while(|dir| !dir.as_os_str().is_empty() && !dir.exists())
            .map(Path::to_path_buf)
            .collect();
        missing.reverse();
        let mut outputs = interrupt::outputs_lock();
        let created = std::fs::create_dir_all(path);
        // Registered even after a failure: the parents that were created are removed on drop.
        for dir in &missing {
            if dir.is_dir() {
                outputs.created(CreatedOutput {
                    flag: "--charts",
                    path: dir.clone(),
                    kind: OutputKind::Dir,
                });
            }
        }
        drop(outputs);
        let charts = ChartsDir {
            path: path.to_path_buf(),
            created: missing,
        };
        created.with_context(|| format!("cannot create --charts {}", path.display()))?;
        let probe = path.join(".shardline-bench-write-check");
        std::fs::write(&probe, b"")
            .and_then(|()| std::fs::remove_file(&probe))
            .with_context(|| format!("cannot write into --charts {}", path.display()))?;
        Ok(charts)
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Runs `write` (which writes the charts into [`ChartsDir::path`]) while holding the
    /// created-outputs lock, then keeps the directory whatever `write` returned (a failed write
    /// may have left some charts).
    ///
    /// # Errors
    /// Those of `write`.
    pub fn write<T>(mut self, write: impl FnOnce(&Path) -> anyhow::Result<T>) -> anyhow::Result<T> {
        let mut outputs = interrupt::outputs_lock();
        let result = write(&self.path);
        for dir in std::mem::take(&mut self.created) {
            outputs.forget(&dir);
        }
        result
    }
}

impl Drop for ChartsDir {
    fn drop(&mut self) {
        let mut outputs = interrupt::outputs_lock();
        for dir in self.created.iter().rev() {
            // Err: not empty (something else was put there) or already gone; it stays.
            let _ = std::fs::remove_dir(dir);
            outputs.forget(dir);
        }
    }
}

/// An open `--json` file, waiting for its report.
#[derive(Debug)]
pub struct JsonReportFile(ReportFile);

impl JsonReportFile {
    /// Opens `path` for writing, creating it if missing; an existing file keeps its contents.
    ///
    /// # Errors
    /// `cannot create --json PATH` with the OS error: a missing parent directory, no write
    /// permission, a directory at `path`.
    pub fn open(path: &Path) -> anyhow::Result<JsonReportFile> {
        ReportFile::open("--json", path).map(JsonReportFile)
    }

    /// Replaces the file's contents with `report` (a `BenchReport` or a `MetadataBenchReport`) as
    /// pretty JSON and a final newline.
    ///
    /// # Errors
    /// The report cannot be serialized, or `cannot write --json PATH` with the OS error.
    pub fn write(self, report: &impl Serialize) -> anyhow::Result<()> {
        let mut text =
            serde_json::to_string_pretty(report).context("cannot serialize the report")?;
        text.push('\n');
        self.0.write_text(&text)
    }
}

#[cfg(test)]
mod tests {
    use super::super::report::BenchReport;
    use super::*;

    fn empty_report() -> BenchReport {
        BenchReport {
            runs: Vec::new(),
            summary: Vec::new(),
            recommendation: None,
        }
    }

    #[test]
    fn a_missing_directory_fails_at_open_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.json");
        let error = JsonReportFile::open(&path).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "cannot create --json {}: No such file or directory (os error 2)",
                path.display()
            )
        );
    }

    #[test]
    fn a_directory_at_the_path_fails_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let error = JsonReportFile::open(dir.path()).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "cannot create --json {}: Is a directory (os error 21)",
                dir.path().display()
            )
        );
    }

    #[test]
    fn the_report_replaces_an_existing_file_only_when_written() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.json");
        std::fs::write(&path, "an older, longer report\n").unwrap();
        let file = JsonReportFile::open(&path).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "an older, longer report\n"
        );
        file.write(&empty_report()).unwrap();
        assert_eq!(
            std::fs::read_to_string(&path).unwrap(),
            "{\n  \"runs\": [],\n  \"summary\": [],\n  \"recommendation\": null\n}\n"
        );
    }

    #[test]
    fn other_report_files_name_their_flag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("missing").join("x.csv");
        let error = ReportFile::open("--csv", &path).unwrap_err();
        assert_eq!(
            format!("{error:#}"),
            format!(
                "cannot create --csv {}: No such file or directory (os error 2)",
                path.display()
            )
        );
        let path = dir.path().join("x.csv");
        let file = ReportFile::open("--csv", &path).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "");
        file.write_text("a,b\n").unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "a,b\n");
    }

    #[test]
    fn an_unwritten_charts_dir_is_removed_with_the_parents_this_bench_created() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("old");
        std::fs::create_dir(&existing).unwrap();
        let charts = existing.join("a").join("charts");
        let prepared = ChartsDir::prepare(&charts).unwrap();
        assert_eq!(prepared.path(), charts);
        assert_eq!(std::fs::read_dir(&charts).unwrap().count(), 0);
        drop(prepared);
        assert!(!existing.join("a").exists());
        assert!(existing.is_dir());
        // An existing directory is never removed.
        drop(ChartsDir::prepare(&existing).unwrap());
        assert!(existing.is_dir());
        // A written one stays.
        let written = ChartsDir::prepare(&charts).unwrap();
        written
            .write(|path| std::fs::write(path.join("x.svg"), "svg").map_err(anyhow::Error::from))
            .unwrap();
        assert_eq!(
            std::fs::read_to_string(charts.join("x.svg")).unwrap(),
            "svg"
        );
    }

    #[test]
    fn an_unwritten_file_is_removed_only_if_created() {
        let dir = tempfile::tempdir().unwrap();
        let created = dir.path().join("new.json");
        drop(JsonReportFile::open(&created).unwrap());
        assert!(!created.exists());
        let existing = dir.path().join("old.json");
        std::fs::write(&existing, "kept").unwrap();
        drop(JsonReportFile::open(&existing).unwrap());
        assert_eq!(std::fs::read_to_string(&existing).unwrap(), "kept");
    }
}
