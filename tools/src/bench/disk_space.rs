//! Refuses a `--messages` run that cannot fit on the embedded server's filesystem, before the
//! server starts: an estimate of the bytes one run writes against the free space `statvfs(3)`
//! reports for the data root. A bench that filled a shared disk broke every other tenant of it.
//!
//! Must never write to the data root: it only measures. The estimate is an upper bound of the
//! log's bytes (storage/FORMAT.md sections 3 and 4), not of the page cache or of other tenants.

use std::path::{Path, PathBuf};

use bus::{BATCH_HEADER_SIZE, MESSAGE_HEADER_SIZE};

use super::limits::SERVER_FIXED_FILES_BYTES_MAX;

/// Bytes of one closed segment's index row per entry (storage/FORMAT.md section 4: base offset
/// and position, u64 each).
const INDEX_ROW_BYTES: u64 = 16;

/// What a `--messages` run writes, for [`check_fits`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSize {
    pub message_count: u64,
    /// Payload bytes of all `message_count` messages as the producers send them (`--message-size`
    /// each, or a `--payload-file`'s lines as each producer cycles through them: the corpus's own
    /// mix, not its longest line for every message).
    pub payload_bytes: u64,
    pub batch_message_count: u32,
    pub producer_count: u32,
}

impl RunSize {
    /// Upper bound of the bytes one run leaves on disk, saturating at `u64::MAX`: every message
    /// as a 32-byte message header, plus `payload_bytes` (storage/FORMAT.md section 3, entry payload),
    /// every batch as a 32-byte entry header and a 16-byte index row (section 4), with each
    /// producer's last batch possibly partial (so up to `producer_count` batches more than
    /// `message_count / batch`), plus [`SERVER_FIXED_FILES_BYTES_MAX`] for the server's own
    /// files. The embedded server is one replica: nothing is multiplied by a replica count.
    pub fn estimate_bytes(&self) -> u64 {
        let message_bytes = self
            .message_count
            .saturating_mul(MESSAGE_HEADER_SIZE as u64)
            .saturating_add(self.payload_bytes);
        let batch_count = self
            .message_count
            .div_ceil(u64::from(self.batch_message_count.max(1)))
            .saturating_add(u64::from(self.producer_count));
        let batch_bytes = batch_count.saturating_mul(BATCH_HEADER_SIZE as u64 + INDEX_ROW_BYTES);
        message_bytes
            .saturating_add(batch_bytes)
            .saturating_add(SERVER_FIXED_FILES_BYTES_MAX)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DiskSpaceError {
    /// The estimate exceeds the free space: the caller lowers `--messages` or moves
    /// `--data-root`.
    #[error(
        "--messages {message_count} would write up to {estimate_bytes} bytes ({estimate_gib:.2} \
         GiB: {payload_bytes} payload bytes ({payload_mean:.1} per message on average) + \
         {message_count} x {MESSAGE_HEADER_SIZE} header bytes, batch headers and index rows, and \
         {SERVER_FIXED_FILES_BYTES_MAX} bytes for the server's own files) under {path}, but its \
         filesystem has {available_bytes} bytes ({available_gib:.2} GiB) free for this user; pass \
         a smaller --messages or a --data-root on a filesystem with more free space",
        estimate_gib = *estimate_bytes as f64 / GIB,
        available_gib = *available_bytes as f64 / GIB,
        payload_mean = *payload_bytes as f64 / (*message_count).max(1) as f64
    )]
    WouldNotFit {
        message_count: u64,
        payload_bytes: u64,
        estimate_bytes: u64,
        available_bytes: u64,
        path: PathBuf,
    },
    /// statvfs(3) failed on the data root: it is missing or unreadable.
    #[error("cannot read the free space of {path} (statvfs): {source}")]
    Statvfs {
        path: PathBuf,
        source: std::io::Error,
    },
}

const GIB: f64 = (1_u64 << 30) as f64;

/// Whether a run of `size` fits in `available_bytes` free under `path`: it does when
/// [`RunSize::estimate_bytes`] is at most the free space.
///
/// # Errors
/// `WouldNotFit` naming the estimate, the free space, the path and how to proceed.
pub fn check_fits(size: &RunSize, available_bytes: u64, path: &Path) -> Result<(), DiskSpaceError> {
    let estimate_bytes = size.estimate_bytes();
    if estimate_bytes > available_bytes {
        return Err(DiskSpaceError::WouldNotFit {
            message_count: size.message_count,
            payload_bytes: size.payload_bytes,
            estimate_bytes,
            available_bytes,
            path: path.to_path_buf(),
        });
    }
    Ok(())
}

/// Bytes an unprivileged user may still write on the filesystem holding `path`: statvfs(3)
/// `f_bavail` x `f_frsize`.
///
/// # Errors
/// `Statvfs` when the call fails (the path is missing, unreadable, or holds a NUL byte).
pub fn available_bytes(path: &Path) -> Result<u64, DiskSpaceError> {
    let fail = |source| DiskSpaceError::Statvfs {
        path: path.to_path_buf(),
        source,
    };
    let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| fail(std::io::Error::from(std::io::ErrorKind::InvalidInput)))?;
    let mut stats = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is NUL-terminated and outlives the call; `stats` is writable and sized
    // for the struct statvfs(3) fills.
    let rc = unsafe { libc::statvfs(c_path.as_ptr(), stats.as_mut_ptr()) };
    if rc != 0 {
        return Err(fail(std::io::Error::last_os_error()));
    }
    // SAFETY: statvfs returned 0, so it initialized `stats`.
    let stats = unsafe { stats.assume_init() };
    Ok(stats.f_bavail.saturating_mul(stats.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    const SIZE: RunSize = RunSize {
        message_count: 1_000_000,
        payload_bytes: 1_000_000_000,
        batch_message_count: 1000,
        producer_count: 2,
    };

    #[test]
    fn the_estimate_counts_headers_batches_and_the_servers_files() {
        // 10^6 x (1000 + 32) message bytes, (1000 + 2) batches x (32 + 16), the fixed files.
        assert_eq!(
            SIZE.estimate_bytes(),
            1_032_000_000 + 1002 * 48 + SERVER_FIXED_FILES_BYTES_MAX
        );
        let huge = RunSize {
            message_count: u64::MAX,
            ..SIZE
        };
        assert_eq!(huge.estimate_bytes(), u64::MAX);
        let huge_payload = RunSize {
            payload_bytes: u64::MAX,
            ..SIZE
        };
        assert_eq!(huge_payload.estimate_bytes(), u64::MAX);
    }

    #[test]
    fn a_run_that_fits_exactly_passes_and_one_byte_less_free_is_refused() {
        let estimate = SIZE.estimate_bytes();
        let path = Path::new("/srv/bench");
        check_fits(&SIZE, estimate, path).unwrap();
        let error = check_fits(&SIZE, estimate - 1, path).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "--messages 1000000 would write up to {estimate} bytes (1.02 GiB: 1000000000 \
                 payload bytes (1000.0 per message on average) + 1000000 x 32 header bytes, batch \
                 headers and index rows, and 67108864 bytes for the server's own files) under \
                 /srv/bench, but its filesystem has {} bytes (1.02 \
                 GiB) free for this user; pass a smaller --messages or a --data-root on a \
                 filesystem with more free space",
                estimate - 1
            )
        );
    }

    #[test]
    fn free_space_is_read_from_the_filesystem_or_the_path_is_named() {
        let dir = tempfile::tempdir().unwrap();
        assert!(available_bytes(dir.path()).unwrap() > 0);
        let missing = dir.path().join("missing");
        let error = available_bytes(&missing).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "cannot read the free space of {} (statvfs): No such file or directory (os error \
                 2)",
                missing.display()
            )
        );
    }
}
