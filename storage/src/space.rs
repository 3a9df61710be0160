//! Recognising a full filesystem and reporting its free space, for the refusals of the log and
//! the journal when a write fails with `ENOSPC`, `EDQUOT` or `EFBIG`, and recognising an open
//! refused for lack of file descriptors (`EMFILE`, `ENFILE`).
//!
//! Only these three errnos are recoverable by rolling back: the kernel refused to store bytes, so
//! the page cache holds nothing that was not also reported written. It must never classify an
//! fsync failure or any other errno as recoverable (after a failed fsync the page cache state is
//! unknown; FORMAT.md section 1).

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

/// Whether `error` says the filesystem (or the quota, or the file size limit) has no room:
/// `ENOSPC`, `EDQUOT` or `EFBIG` (write(2) ERRORS).
pub fn is_storage_full(error: &io::Error) -> bool {
    matches!(
        error.raw_os_error(),
        Some(libc::ENOSPC | libc::EDQUOT | libc::EFBIG)
    )
}

/// Whether `error` says no file descriptor could be allocated: `EMFILE` (the process is at its
/// `RLIMIT_NOFILE`) or `ENFILE` (the system-wide file table is full). Only calls that allocate a
/// descriptor (`open`, `openat`, `accept`, ...) return these, never `write` or `fsync`, so an
/// error of this class means an open was refused and nothing was written: recoverable once
/// descriptors are freed.
pub fn is_descriptors_exhausted(error: &io::Error) -> bool {
    matches!(error.raw_os_error(), Some(libc::EMFILE | libc::ENFILE))
}

/// What an unprivileged writer can still use on the filesystem holding `path` (`statvfs(3)`:
/// `f_bavail * f_frsize` bytes, and `f_favail` inodes when the filesystem counts them), or `None`
/// if `statvfs` fails.
///
/// A plain syscall on the calling thread: it reads the superblock counters the kernel keeps in
/// memory, and it runs only on the rare path of a refused write.
pub fn free_bytes(path: &Path) -> Option<FreeSpace> {
    let c_path = CString::new(path.as_os_str().as_bytes()).ok()?;
    // SAFETY: statvfs is plain old data, valid when zeroed; `c_path` is a NUL-terminated string
    // that outlives the call, and the kernel writes only within `stat`.
    let mut stat: libc::statvfs = unsafe { std::mem::zeroed() };
    let result = unsafe { libc::statvfs(c_path.as_ptr(), &raw mut stat) };
    if result != 0 {
        return None;
    }
    #[allow(
        clippy::unnecessary_cast,
        reason = "the field widths differ between targets"
    )]
    Some(FreeSpace {
        bytes: (stat.f_bavail as u64).saturating_mul(stat.f_frsize as u64),
        // Filesystems without a fixed inode table (btrfs) report 0 total inodes: no limit.
        inodes: (stat.f_files != 0).then_some(stat.f_favail as u64),
    })
}

/// Free space of a filesystem, as `statvfs` reports it to an unprivileged writer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeSpace {
    /// Free bytes (`f_bavail * f_frsize`).
    pub bytes: u64,
    /// Free inodes (`f_favail`); `None` where the filesystem has no inode limit.
    pub inodes: Option<u64>,
}

/// Free space for a message: bytes, plus inodes when there are none left (a write refused with
/// `ENOSPC` while bytes are free is then explained), or that it is unknown.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FreeBytes(pub Option<FreeSpace>);

impl fmt::Display for FreeBytes {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Some(FreeSpace {
                bytes,
                inodes: Some(0),
            }) => write!(formatter, "{bytes} bytes free, 0 inodes free"),
            Some(FreeSpace { bytes, .. }) => write!(formatter, "{bytes} bytes free"),
            None => formatter.write_str("free space unknown (statvfs failed)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_errnos_are_recoverable_and_others_are_not() {
        for errno in [libc::ENOSPC, libc::EDQUOT, libc::EFBIG] {
            assert!(is_storage_full(&io::Error::from_raw_os_error(errno)));
        }
        for errno in [libc::EIO, libc::EBADF, libc::EROFS] {
            assert!(!is_storage_full(&io::Error::from_raw_os_error(errno)));
        }
        assert!(!is_storage_full(&io::Error::other("no errno")));
    }

    #[test]
    fn issue7_2_only_emfile_and_enfile_are_descriptor_exhaustion() {
        for errno in [libc::EMFILE, libc::ENFILE] {
            assert!(is_descriptors_exhausted(&io::Error::from_raw_os_error(
                errno
            )));
        }
        for errno in [libc::ENOSPC, libc::EIO, libc::EBADF, libc::ENOMEM] {
            assert!(!is_descriptors_exhausted(&io::Error::from_raw_os_error(
                errno
            )));
        }
    }

    #[test]
    fn free_bytes_of_a_directory_and_of_a_missing_path() {
        let dir = tempfile::tempdir().unwrap();
        assert!(free_bytes(dir.path()).is_some());
        assert_eq!(free_bytes(&dir.path().join("missing")), None);
    }

    #[test]
    fn issue7_1_storage_full_names_inodes_only_when_none_are_left() {
        let space = |bytes, inodes| FreeBytes(Some(FreeSpace { bytes, inodes }));
        assert_eq!(space(12, Some(40)).to_string(), "12 bytes free");
        assert_eq!(space(12, None).to_string(), "12 bytes free");
        assert_eq!(
            space(4_153_344, Some(0)).to_string(),
            "4153344 bytes free, 0 inodes free"
        );
        assert_eq!(
            FreeBytes(None).to_string(),
            "free space unknown (statvfs failed)"
        );
    }
}
