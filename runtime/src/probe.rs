//! Startup `io_uring` probe: creates one small ring (and one with `IORING_SETUP_COOP_TASKRUN`, which
//! the shard runtimes request) and, if that fails, names the cause and the fix. Never keeps a ring
//! and never touches the shards' runtimes.

use std::fmt;
use std::str::FromStr;

use crate::limits::PROBE_RING_ENTRIES;

/// Which completion driver each shard's compio runtime uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoDriver {
    /// `io_uring` (the default): one ring per shard.
    #[default]
    IoUring,
    /// epoll-style readiness driver: the fallback where `io_uring` is unavailable.
    Poll,
}

impl FromStr for IoDriver {
    type Err = String;
    /// Accepts `io-uring`, `io_uring`, `uring` and `poll`.
    ///
    /// # Errors
    /// A message naming the value and the accepted words.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "io-uring" | "io_uring" | "uring" => Ok(IoDriver::IoUring),
            "poll" => Ok(IoDriver::Poll),
            other => Err(format!(
                "invalid --io-driver value {other:?}: expected one of io-uring, io_uring, uring, poll"
            )),
        }
    }
}

impl fmt::Display for IoDriver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            IoDriver::IoUring => "io-uring",
            IoDriver::Poll => "poll",
        })
    }
}

/// `io_uring` cannot be used here; Display names the cause (seccomp EPERM, `RLIMIT_MEMLOCK` ENOMEM,
/// ENOSYS / `io_uring_disabled`, old kernel) and suggests `--io-driver poll`.
#[derive(Debug, thiserror::Error)]
#[error(
    "io_uring is unavailable: {cause} (errno {errno}); start with --io-driver poll to use the polling driver"
)]
pub struct IoUringUnavailable {
    /// What blocked `io_uring_setup` and how to fix it.
    pub cause: String,
    /// The errno of `io_uring_setup` (0 if the error carried none).
    pub errno: i32,
}

/// Creates and drops one small ring (`PROBE_RING_ENTRIES` entries), then one with
/// `IORING_SETUP_COOP_TASKRUN` (Linux 5.19), the flag the shard runtimes set.
///
/// # Errors
/// `IoUringUnavailable` with the diagnosed cause (see `io_uring_setup(2)`, ERRORS).
pub fn probe_io_uring() -> Result<(), IoUringUnavailable> {
    let disabled_sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
    let unavailable = |error: &std::io::Error, coop_taskrun: bool| {
        let errno = error.raw_os_error().unwrap_or(0);
        IoUringUnavailable {
            cause: diagnose(errno, disabled_sysctl.as_deref(), coop_taskrun, error),
            errno,
        }
    };
    drop(io_uring::IoUring::new(PROBE_RING_ENTRIES).map_err(|error| unavailable(&error, false))?);
    drop(
        io_uring::IoUring::<io_uring::squeue::Entry>::builder()
            .setup_coop_taskrun()
            .build(PROBE_RING_ENTRIES)
            .map_err(|error| unavailable(&error, true))?,
    );
    Ok(())
}

/// Names the cause of a failed `io_uring_setup(2)` from its errno and the
/// `kernel.io_uring_disabled` sysctl (Linux 6.6: 1 = only a privileged group, 2 = nobody).
fn diagnose(
    errno: i32,
    io_uring_disabled: Option<&str>,
    coop_taskrun: bool,
    error: &std::io::Error,
) -> String {
    let disabled = io_uring_disabled
        .map(str::trim)
        .filter(|value| *value == "1" || *value == "2");
    if let Some(value) = disabled
        && matches!(errno, libc::EPERM | libc::EACCES | libc::ENOSYS)
    {
        return format!("disabled by sysctl kernel.io_uring_disabled={value}");
    }
    match errno {
        libc::EPERM => {
            "blocked by seccomp or a security policy (EPERM), common under container default profiles"
                .to_owned()
        }
        libc::ENOMEM => "RLIMIT_MEMLOCK too low (ENOMEM); raise `ulimit -l`".to_owned(),
        libc::ENOSYS => "kernel has no io_uring (ENOSYS)".to_owned(),
        libc::EINVAL if coop_taskrun => {
            "kernel too old for the requested ring features (IORING_SETUP_COOP_TASKRUN needs Linux 5.19)"
                .to_owned()
        }
        libc::EINVAL => "kernel too old for the requested ring features".to_owned(),
        _ => format!("io_uring_setup failed: {error}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cause(errno: i32, sysctl: Option<&str>, coop_taskrun: bool) -> String {
        diagnose(
            errno,
            sysctl,
            coop_taskrun,
            &std::io::Error::from_raw_os_error(errno),
        )
    }

    #[test]
    fn driver_words() {
        for word in ["io-uring", "io_uring", "uring"] {
            assert_eq!(word.parse::<IoDriver>(), Ok(IoDriver::IoUring));
        }
        assert_eq!("poll".parse::<IoDriver>(), Ok(IoDriver::Poll));
        assert_eq!(
            "epoll".parse::<IoDriver>(),
            Err(r#"invalid --io-driver value "epoll": expected one of io-uring, io_uring, uring, poll"#
                .to_owned())
        );
        assert_eq!(IoDriver::IoUring.to_string(), "io-uring");
        assert_eq!(IoDriver::Poll.to_string(), "poll");
    }

    #[test]
    fn causes_are_named() {
        assert_eq!(
            cause(libc::EPERM, Some("0\n"), false),
            "blocked by seccomp or a security policy (EPERM), common under container default profiles"
        );
        assert_eq!(
            cause(libc::ENOMEM, None, false),
            "RLIMIT_MEMLOCK too low (ENOMEM); raise `ulimit -l`"
        );
        assert_eq!(
            cause(libc::ENOSYS, None, false),
            "kernel has no io_uring (ENOSYS)"
        );
        assert_eq!(
            cause(libc::EPERM, Some("2\n"), false),
            "disabled by sysctl kernel.io_uring_disabled=2"
        );
        assert_eq!(
            cause(libc::EPERM, Some("1"), false),
            "disabled by sysctl kernel.io_uring_disabled=1"
        );
        assert_eq!(
            cause(libc::EINVAL, None, false),
            "kernel too old for the requested ring features"
        );
        assert_eq!(
            cause(libc::EINVAL, None, true),
            "kernel too old for the requested ring features (IORING_SETUP_COOP_TASKRUN needs Linux 5.19)"
        );
    }

    #[test]
    fn unavailable_display_suggests_poll() {
        let error = IoUringUnavailable {
            cause: cause(libc::ENOSYS, None, false),
            errno: libc::ENOSYS,
        };
        assert_eq!(
            error.to_string(),
            "io_uring is unavailable: kernel has no io_uring (ENOSYS) (errno 38); start with --io-driver poll to use the polling driver"
        );
    }

    #[test]
    fn io_uring_works_on_this_machine() {
        probe_io_uring().unwrap();
    }
}
