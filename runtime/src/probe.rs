//! Startup io_uring probe: creates one ring and, if that fails, names the cause and the fix.

use std::str::FromStr;

/// Which completion driver each shard's compio runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoDriver {
    #[default]
    IoUring,
    /// epoll-style readiness driver: the fallback where io_uring is unavailable.
    Poll,
}

impl FromStr for IoDriver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!("{s}")
    }
}

/// io_uring cannot be used here; Display names the cause (seccomp EPERM, RLIMIT_MEMLOCK ENOMEM,
/// ENOSYS / io_uring_disabled, old kernel) and suggests `--io-driver poll`.
#[derive(Debug, thiserror::Error)]
#[error(
    "io_uring is unavailable: {cause} (errno {errno}); start with --io-driver poll to use the polling driver"
)]
pub struct IoUringUnavailable {
    pub cause: String,
    pub errno: i32,
}

/// Creates and drops one small ring.
///
/// # Errors
/// `IoUringUnavailable` with the diagnosed cause.
pub fn probe_io_uring() -> Result<(), IoUringUnavailable> {
    todo!()
}
