//! Startup `io_uring` probe: creates one small ring (and one with `IORING_SETUP_COOP_TASKRUN`, which
//! the shard runtimes request) and, if that fails, names the cause and the fix. Never keeps a ring
//! and never touches the shards' runtimes.

use std::fmt;
use std::str::FromStr;

use crate::limits::{COMPIO_PROBE_RING_ENTRIES, PROBE_RING_ENTRIES, SHARD_RING_ENTRIES};

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
    /// A message naming the value and the accepted words, not the flag: clap and the config file
    /// name the flag (or key) themselves.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "io-uring" | "io_uring" | "uring" => Ok(IoDriver::IoUring),
            "poll" => Ok(IoDriver::Poll),
            other => Err(format!(
                "{other:?} is not an I/O driver: expected one of io-uring, io_uring, uring, poll"
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

/// `io_uring` cannot be used here; Display names the cause (seccomp EPERM, `RLIMIT_MEMLOCK` too low
/// for the rings, ENOSYS / `io_uring_disabled`, old kernel, a missing opcode) and suggests
/// `--io-driver poll`.
#[derive(Debug, thiserror::Error)]
#[error("io_uring is unavailable: {cause}; start with --io-driver poll to use the polling driver")]
pub struct IoUringUnavailable {
    /// What blocked `io_uring` and how to fix it.
    pub cause: String,
    /// The errno of the failed call (0 when the refusal is ours, e.g. a missing opcode).
    pub errno: i32,
}

/// The opcodes shard runtimes submit, by name. Reads, writes and fsync have no blocking fallback
/// in compio: a kernel without them would fail the first such operation, so the probe refuses
/// at startup instead. The others are what the partition logs, the metadata journal and the
/// client connections use (open, stat, close, accept, recv, send, sendmsg, cancellation).
pub const REQUIRED_OPCODES: [(u8, &str); 11] = [
    (io_uring::opcode::Read::CODE, "IORING_OP_READ"),
    (io_uring::opcode::Write::CODE, "IORING_OP_WRITE"),
    (io_uring::opcode::Fsync::CODE, "IORING_OP_FSYNC"),
    (io_uring::opcode::OpenAt::CODE, "IORING_OP_OPENAT"),
    (io_uring::opcode::Statx::CODE, "IORING_OP_STATX"),
    (io_uring::opcode::Close::CODE, "IORING_OP_CLOSE"),
    (io_uring::opcode::Accept::CODE, "IORING_OP_ACCEPT"),
    (io_uring::opcode::Recv::CODE, "IORING_OP_RECV"),
    (io_uring::opcode::Send::CODE, "IORING_OP_SEND"),
    (io_uring::opcode::SendMsg::CODE, "IORING_OP_SENDMSG"),
    (
        io_uring::opcode::AsyncCancel::CODE,
        "IORING_OP_ASYNC_CANCEL",
    ),
];

/// Bytes of `struct io_rings` before its CQE array (two cache-line-aligned head/tail pairs, then
/// the masks, counts and flags, then the cache-line-aligned `cqes[]`): include/linux/io_uring_types.h.
const IO_RINGS_HEADER_BYTES: u64 = 192;
/// `sizeof(struct io_uring_cqe)` without `IORING_SETUP_CQE32`.
const CQE_BYTES: u64 = 16;
/// `sizeof(struct io_uring_sqe)` without `IORING_SETUP_SQE128`.
const SQE_BYTES: u64 = 64;
/// `SMP_CACHE_BYTES` on x86-64 and arm64: the SQ index array starts at this alignment.
const CACHE_LINE_BYTES: u64 = 64;

/// Locked memory (bytes) one ring of `sq_entries` submission entries (rounded up to a power of
/// two) and twice as many completion entries (the `io_uring_setup(2)` default) is charged: its
/// rings region (`struct io_rings`, the CQEs, the SQ index array) and its SQE array, each rounded
/// up to whole pages (`rings_size` and `io_allocate_scq_urings` in io_uring/io_uring.c).
pub fn ring_locked_bytes(sq_entries: u32, page_size: u64) -> u64 {
    let sq = u64::from(sq_entries.max(1).next_power_of_two());
    let cq = 2 * sq;
    let rings =
        (IO_RINGS_HEADER_BYTES + cq * CQE_BYTES).next_multiple_of(CACHE_LINE_BYTES) + sq * 4;
    rings.next_multiple_of(page_size) + (sq * SQE_BYTES).next_multiple_of(page_size)
}

/// Locked memory (bytes) a start with `shard_count` shards is charged at most: one ring of
/// `SHARD_RING_ENTRIES` per shard, plus the probe's ring, the ring of the runtime that primes
/// compio's opcode table and compio's own two-entry probe ring. The kernel frees a closed ring
/// asynchronously, so the three short-lived rings may still be charged while the shards start.
pub fn memlock_needed_bytes(shard_count: u16, page_size: u64) -> u64 {
    u64::from(shard_count) * ring_locked_bytes(SHARD_RING_ENTRIES, page_size)
        + 2 * ring_locked_bytes(PROBE_RING_ENTRIES, page_size)
        + ring_locked_bytes(COMPIO_PROBE_RING_ENTRIES, page_size)
}

/// The refusal for a locked-memory limit below what the rings need: names `RLIMIT_MEMLOCK`, the
/// limit, the need (both in KiB, rounded up) and the two ways to raise it.
pub fn memlock_unavailable(
    limit_bytes: u64,
    needed_bytes: u64,
    shard_count: u16,
) -> IoUringUnavailable {
    let needed_kib = needed_bytes.div_ceil(1024);
    let (shards, need) = if shard_count == 1 {
        ("shard", "needs")
    } else {
        ("shards", "need")
    };
    IoUringUnavailable {
        cause: format!(
            "RLIMIT_MEMLOCK is {limit_kib} KiB but {shard_count} {shards} {need} {needed_kib} KiB of \
             locked memory for io_uring rings (ENOMEM; the limit counts every process of \
             the same user); raise it to at least {needed_kib} KiB with `ulimit -l {needed_kib}` \
             in the shell that starts shardline, or `LimitMEMLOCK={needed_kib}K` in its systemd unit",
            limit_kib = limit_bytes / 1024,
        ),
        errno: libc::ENOMEM,
    }
}

/// Decides from the raised limit (`None`: unlimited), the need and whether this kernel charges
/// ring memory to this user's `RLIMIT_MEMLOCK` whether the rings cannot fit.
///
/// # Errors
/// `memlock_unavailable` when the rings are charged and `needed_bytes` exceeds the limit.
pub fn check_memlock(
    limit_bytes: Option<u64>,
    needed_bytes: u64,
    rings_charged: bool,
    shard_count: u16,
) -> Result<(), IoUringUnavailable> {
    match limit_bytes {
        Some(limit) if rings_charged && needed_bytes > limit => {
            Err(memlock_unavailable(limit, needed_bytes, shard_count))
        }
        _ => Ok(()),
    }
}

/// The opcodes of `REQUIRED_OPCODES` that `supported` rejects, by name.
///
/// # Errors
/// A cause naming every missing opcode.
pub fn check_opcodes(supported: impl Fn(u8) -> bool) -> Result<(), IoUringUnavailable> {
    let missing: Vec<&str> = REQUIRED_OPCODES
        .iter()
        .filter(|(code, _)| !supported(*code))
        .map(|(_, name)| *name)
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    Err(IoUringUnavailable {
        cause: format!(
            "this kernel's io_uring lacks {}, which the shards use (Linux 5.19 or later has all of them)",
            missing.join(", ")
        ),
        errno: 0,
    })
}

/// Checks everything a start of `shard_count` shards on `io_uring` needs, before any shard
/// thread exists:
/// 1. raises the soft `RLIMIT_MEMLOCK` to the hard limit and compares it with
///    `memlock_needed_bytes` where this kernel charges rings to it for this user (which kernels
///    do has changed over time, so `rings_charged_to_memlock` measures it);
/// 2. creates one small ring with `IORING_SETUP_COOP_TASKRUN` (Linux 5.19), the flag the shard
///    runtimes set, and asks it which opcodes the kernel supports (`REQUIRED_OPCODES`);
/// 3. primes compio's process-wide opcode table while the rings are few: compio probes once, on
///    the first operation, and a probe that fails (its ring refused for want of locked memory)
///    makes every opcode look unsupported, after which the first fsync panics.
///
/// # Errors
/// `IoUringUnavailable` with the diagnosed cause (see `io_uring_setup(2)`, ERRORS).
pub fn probe_io_uring(shard_count: u16) -> Result<(), IoUringUnavailable> {
    let page_size = page_size_bytes();
    let needed_bytes = memlock_needed_bytes(shard_count, page_size);
    let limit_bytes = raise_memlock_limit();
    let rings_charged = limit_bytes.is_some() && rings_charged_to_memlock();
    check_memlock(limit_bytes, needed_bytes, rings_charged, shard_count)?;
    let disabled_sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled").ok();
    let unavailable = |error: &std::io::Error, coop_taskrun: bool| {
        let errno = error.raw_os_error().unwrap_or(0);
        if errno == libc::ENOMEM
            && let Some(limit) = limit_bytes
        {
            return memlock_unavailable(limit, needed_bytes, shard_count);
        }
        IoUringUnavailable {
            cause: format!(
                "{} (errno {errno})",
                diagnose(errno, disabled_sysctl.as_deref(), coop_taskrun, error)
            ),
            errno,
        }
    };
    let ring = match io_uring::IoUring::<io_uring::squeue::Entry>::builder()
        .setup_coop_taskrun()
        .build(PROBE_RING_ENTRIES)
    {
        Ok(ring) => ring,
        Err(error) => {
            // Tell "no io_uring at all" from "no COOP_TASKRUN" with a plain ring.
            drop(io_uring::IoUring::new(PROBE_RING_ENTRIES).map_err(|e| unavailable(&e, false))?);
            return Err(unavailable(&error, true));
        }
    };
    let mut probe = io_uring::Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|error| unavailable(&error, false))?;
    drop(ring);
    check_opcodes(|code| probe.is_supported(code))?;
    prime_compio_opcode_table().map_err(|error| unavailable(&error, false))
}

/// Runs one file operation on a throwaway compio runtime so that compio's opcode table is filled
/// now, while only the probe's rings are charged (see `probe_io_uring`).
fn prime_compio_opcode_table() -> std::io::Result<()> {
    let mut proactor = compio::driver::ProactorBuilder::new();
    proactor
        .driver_type(compio::driver::DriverType::IoUring)
        .capacity(PROBE_RING_ENTRIES);
    let runtime = compio::runtime::RuntimeBuilder::new()
        .with_proactor(proactor)
        .build()?;
    runtime.block_on(async { compio::fs::metadata("/").await.map(drop) })
}

/// The page size the kernel rounds ring regions to (bytes).
fn page_size_bytes() -> u64 {
    // SAFETY: sysconf has no memory-safety preconditions.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    u64::try_from(size).unwrap_or(4096).max(1)
}

/// Raises the soft `RLIMIT_MEMLOCK` to the hard one (as the open-file limit is raised) and returns
/// the resulting soft limit in bytes; `None` when unlimited.
pub fn raise_memlock_limit() -> Option<u64> {
    raise_soft_limit_to_hard(libc::RLIMIT_MEMLOCK)
        .and_then(|soft| (soft != libc::RLIM_INFINITY).then_some(soft))
}

/// Raises the soft limit of `resource` to its hard limit (what Kafka and Redpanda ask operators
/// to do by hand) and returns the soft limit in force afterwards (`RLIM_INFINITY` when
/// unlimited; unchanged if the raise is refused); `None` when `getrlimit` fails.
pub fn raise_soft_limit_to_hard(resource: libc::__rlimit_resource_t) -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read or write the plain struct passed to them.
    unsafe {
        if libc::getrlimit(resource, &raw mut limit) != 0 {
            return None;
        }
        if limit.rlim_cur < limit.rlim_max {
            let raised = libc::rlimit {
                rlim_cur: limit.rlim_max,
                rlim_max: limit.rlim_max,
            };
            if libc::setrlimit(resource, &raw const raised) == 0 {
                limit.rlim_cur = limit.rlim_max;
            }
        }
    }
    Some(limit.rlim_cur)
}

/// Whether this kernel charges ring memory to this user's `RLIMIT_MEMLOCK`: a forked child sets
/// its own limit to zero and creates a one-entry ring. ENOMEM means charged (users without
/// `CAP_IPC_LOCK`, on kernels that account ring pages as locked memory); success means not. The child never touches
/// the parent's limit, and a refused ring allocates nothing, so the check leaves no charge behind.
fn rings_charged_to_memlock() -> bool {
    // SAFETY: the child only calls async-signal-safe functions (setrlimit, syscall, _exit)
    // before it exits; the parent only waits for it.
    unsafe {
        let pid = libc::fork();
        if pid == 0 {
            let zero = libc::rlimit {
                rlim_cur: 0,
                rlim_max: 0,
            };
            libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const zero);
            // struct io_uring_params is 120 bytes; zeroed asks for a default ring.
            let mut params = [0u8; 120];
            let fd = libc::syscall(libc::SYS_io_uring_setup, 1_u32, params.as_mut_ptr());
            let code = if fd >= 0 {
                0
            } else if *libc::__errno_location() == libc::ENOMEM {
                1
            } else {
                2
            };
            libc::_exit(code);
        }
        if pid < 0 {
            // Cannot tell: assume charged, so that a low limit is named rather than hit.
            return true;
        }
        let mut status = 0;
        if libc::waitpid(pid, &raw mut status, 0) != pid {
            return true;
        }
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 1
    }
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
            Err(
                r#""epoll" is not an I/O driver: expected one of io-uring, io_uring, uring, poll"#
                    .to_owned()
            )
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
    fn issue7_2_ring_sizes_match_the_kernel_layout() {
        // 1024 entries: 192 + 2048 * 16 + 4096 = 37,056 bytes -> 10 pages, 64 KiB of SQEs.
        assert_eq!(ring_locked_bytes(1024, 4096), 104 * 1024);
        // 8 and 2 entries: one page of rings and one of SQEs each.
        assert_eq!(ring_locked_bytes(8, 4096), 8 * 1024);
        assert_eq!(ring_locked_bytes(2, 4096), 8 * 1024);
        // Rounded up to a power of two, as io_uring_setup does.
        assert_eq!(ring_locked_bytes(1000, 4096), 104 * 1024);
        assert_eq!(memlock_needed_bytes(1, 4096), 128 * 1024);
        assert_eq!(memlock_needed_bytes(2, 4096), 232 * 1024);
        assert_eq!(
            memlock_needed_bytes(2, 65536),
            2 * 128 * 1024 + 3 * 128 * 1024
        );
    }

    #[test]
    fn issue7_2_memlock_refusal_names_limit_need_and_fixes() {
        let error = check_memlock(Some(224 * 1024), 232 * 1024, true, 2).unwrap_err();
        assert_eq!(error.errno, libc::ENOMEM);
        assert_eq!(
            error.to_string(),
            "io_uring is unavailable: RLIMIT_MEMLOCK is 224 KiB but 2 shards need 232 KiB of \
             locked memory for io_uring rings (ENOMEM; the limit counts every process of \
             the same user); raise it to at least 232 KiB with `ulimit -l 232` in the shell that \
             starts shardline, or `LimitMEMLOCK=232K` in its systemd unit; start with \
             --io-driver poll to use the polling driver"
        );
        assert_eq!(
            memlock_unavailable(0, 128 * 1024 + 1, 1).cause,
            "RLIMIT_MEMLOCK is 0 KiB but 1 shard needs 129 KiB of locked memory for io_uring \
             rings (ENOMEM; the limit counts every process of the same user); raise it to at least \
             129 KiB with `ulimit -l 129` in the shell that starts shardline, or \
             `LimitMEMLOCK=129K` in its systemd unit"
        );
    }

    #[test]
    fn issue7_2_memlock_decision() {
        // Exactly enough fits; one byte short does not.
        assert!(check_memlock(Some(232 * 1024), 232 * 1024, true, 2).is_ok());
        assert!(check_memlock(Some(232 * 1024 - 1), 232 * 1024, true, 2).is_err());
        // Unlimited, or a kernel (or a CAP_IPC_LOCK user) that does not charge rings: no refusal.
        assert!(check_memlock(None, 232 * 1024, true, 2).is_ok());
        assert!(check_memlock(Some(0), 232 * 1024, false, 2).is_ok());
    }

    #[test]
    fn issue7_2_missing_opcodes_are_named() {
        assert!(check_opcodes(|_| true).is_ok());
        let error = check_opcodes(|code| {
            code != io_uring::opcode::Fsync::CODE && code != io_uring::opcode::Statx::CODE
        })
        .unwrap_err();
        assert_eq!(error.errno, 0);
        assert_eq!(
            error.to_string(),
            "io_uring is unavailable: this kernel's io_uring lacks IORING_OP_FSYNC, IORING_OP_STATX, \
             which the shards use (Linux 5.19 or later has all of them); start with --io-driver poll \
             to use the polling driver"
        );
        // Every opcode the probe looks for is supported here.
        let ring = io_uring::IoUring::new(PROBE_RING_ENTRIES).unwrap();
        let mut probe = io_uring::Probe::new();
        ring.submitter().register_probe(&mut probe).unwrap();
        assert!(check_opcodes(|code| probe.is_supported(code)).is_ok());
    }

    #[test]
    fn unavailable_display_suggests_poll() {
        let error = IoUringUnavailable {
            cause: cause(libc::ENOSYS, None, false),
            errno: libc::ENOSYS,
        };
        assert_eq!(
            error.to_string(),
            "io_uring is unavailable: kernel has no io_uring (ENOSYS); start with --io-driver poll to use the polling driver"
        );
    }

    #[test]
    fn io_uring_works_on_this_machine() {
        probe_io_uring(2).unwrap();
    }
}
