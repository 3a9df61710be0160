//! The disk baseline of `--workload metadata`: one 4 KiB write at offset 0 of a scratch file
//! followed by fdatasync, timed, on the filesystem the server writes to. A metadata commit cannot
//! be faster than one such write, so its p99 is reported as a multiple of this one's.
//!
//! Must never write anywhere but its own scratch file (created fresh, never an existing file), and
//! never leave that file behind: it is removed when the baseline is dropped.

use std::os::unix::fs::{FileExt as _, MetadataExt as _};
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::limits::BASELINE_WRITE_BYTES;

/// An open scratch file for timed 4 KiB write + fdatasync pairs.
#[derive(Debug)]
pub struct DiskBaseline {
    file: tempfile::NamedTempFile,
    buffer: Vec<u8>,
    write_count: u64,
}

impl DiskBaseline {
    /// Creates a fresh scratch file in `dir` and writes and syncs its block once, untimed, so
    /// that every timed write overwrites an allocated block: the target compares against "one
    /// 4 KiB write+fdatasync", not a file extension with its inode update.
    ///
    /// # Errors
    /// The file cannot be created in `dir`, or the first write or fdatasync fails (each naming
    /// the path).
    pub fn create(dir: &Path) -> anyhow::Result<DiskBaseline> {
        let file = tempfile::Builder::new()
            .prefix("baseline-write-fdatasync-")
            .suffix(".scratch")
            .tempfile_in(dir)
            .with_context(|| {
                format!(
                    "cannot create the disk-baseline scratch file in {}",
                    dir.display()
                )
            })?;
        let mut baseline = DiskBaseline {
            file,
            buffer: vec![0; BASELINE_WRITE_BYTES],
            write_count: 0,
        };
        baseline.write_and_sync()?;
        Ok(baseline)
    }

    /// The scratch file.
    pub fn path(&self) -> &Path {
        self.file.path()
    }

    /// Writes [`BASELINE_WRITE_BYTES`] at offset 0 (each write different bytes from the last),
    /// then fdatasync(2) (`File::sync_data`), and returns how long both took together.
    ///
    /// # Errors
    /// The write or the fdatasync fails, naming the path and the OS error.
    pub fn write_and_sync(&mut self) -> anyhow::Result<Duration> {
        self.write_count += 1;
        // The low byte of the count: consecutive writes never carry the same bytes.
        self.buffer.fill(self.write_count.to_le_bytes()[0]);
        let file = self.file.as_file();
        let started_at = Instant::now();
        file.write_all_at(&self.buffer, 0)
            .and_then(|()| file.sync_data())
            .with_context(|| {
                format!(
                    "disk baseline: cannot write and fdatasync {}",
                    self.file.path().display()
                )
            })?;
        Ok(started_at.elapsed())
    }
}

/// Whether `first` and `second` lie on the same filesystem (the same `st_dev`).
///
/// # Errors
/// Either path cannot be stat'ed (naming it).
pub fn same_filesystem(first: &Path, second: &Path) -> anyhow::Result<bool> {
    let device = |path: &Path| {
        std::fs::metadata(path)
            .map(|metadata| metadata.dev())
            .with_context(|| format!("cannot stat {}", path.display()))
    };
    Ok(device(first)? == device(second)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_write_replaces_the_first_4_kib_and_the_file_is_removed_on_drop() {
        let dir = tempfile::tempdir().unwrap();
        let mut baseline = DiskBaseline::create(dir.path()).unwrap();
        let path = baseline.path().to_path_buf();
        assert_eq!(path.parent().unwrap(), dir.path());
        assert_eq!(std::fs::read(&path).unwrap(), vec![1; 4096]);
        baseline.write_and_sync().unwrap();
        baseline.write_and_sync().unwrap();
        assert_eq!(std::fs::read(&path).unwrap(), vec![3; 4096]);
        drop(baseline);
        assert!(!path.exists());
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }

    #[test]
    fn a_missing_directory_fails_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        let error = DiskBaseline::create(&missing).unwrap_err();
        assert!(
            format!("{error:#}").starts_with(&format!(
                "cannot create the disk-baseline scratch file in {}: ",
                missing.display()
            )),
            "{error:#}"
        );
    }

    #[test]
    fn same_filesystem_compares_devices() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("data")).unwrap();
        assert!(same_filesystem(dir.path(), &dir.path().join("data")).unwrap());
        // /proc is its own filesystem everywhere Linux runs.
        assert!(!same_filesystem(dir.path(), Path::new("/proc")).unwrap());
        assert!(same_filesystem(dir.path(), &dir.path().join("nope")).is_err());
    }
}
