//! The end of a produce phase on the embedded server: a `syncfs(2)` of the data directory's
//! filesystem, so that the page cache the phase dirtied is written back while the host-CPU window
//! is still open (issue 12 item 4). Under `--fsync never` the kernel would otherwise write those
//! pages back after the phase, in kworker threads, and the host figure would miss that cost.
//!
//! Must never run inside the acknowledgement window: msgs/s and latency end when the last
//! producer has its last acknowledgement, before this flush starts.

use std::path::Path;
use std::time::{Duration, Instant};

/// Writes back every dirty page of the filesystem holding `dir` (syncfs(2)) and returns how long
/// that took (wall clock).
///
/// # Errors
/// `dir` cannot be opened, or syncfs(2) fails (`EIO`, `ENOSPC`, `EDQUOT`: the writeback failed).
pub fn flush_filesystem(dir: &Path) -> std::io::Result<Duration> {
    let handle = std::fs::File::open(dir)?;
    let started_at = Instant::now();
    // SAFETY: syncfs(2) reads only the descriptor, which `handle` keeps open for the call.
    let rc = unsafe { libc::syncfs(std::os::fd::AsRawFd::as_raw_fd(&handle)) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(started_at.elapsed())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_with_dirty_pages_is_flushed() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("dirty"), vec![7_u8; 1 << 20]).unwrap();
        flush_filesystem(dir.path()).unwrap();
    }

    #[test]
    fn a_missing_directory_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let error = flush_filesystem(&dir.path().join("gone")).unwrap_err();
        assert_eq!(error.kind(), std::io::ErrorKind::NotFound);
    }
}
