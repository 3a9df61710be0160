//! The `io_uring` check: runs the probe `serve` runs (`runtime::probe_io_uring`) and, when it
//! refuses, names the exact cause from what the kernel shows this process: the seccomp mode
//! (`/proc/self/status` `Seccomp:`), the `kernel.io_uring_disabled` and `kernel.io_uring_group`
//! sysctls (Linux 6.6, `io_uring_allowed` in io_uring/io_uring.c), the locked-memory limit, the
//! kernel release. Must never keep a ring open; the probe closes its own.

use procfs::process::Process;

use super::limits::CAP_SYS_ADMIN_BIT;
use super::{Check, SizedShards};

const NAME: &str = "io_uring";

/// The poll-driver fallback every refusal offers.
const POLL_FALLBACK: &str = "or start with --io-driver poll (epoll readiness, no rings)";

/// What the kernel says about this process that decides whether it may create a ring.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct RingPolicy {
    /// `Seccomp:` of `/proc/self/status`: 0 off, 1 strict, 2 filter; `None` when unreadable.
    pub seccomp_mode: Option<u32>,
    /// `/proc/sys/kernel/io_uring_disabled`: 0 allowed, 1 only `io_uring_group` or
    /// `CAP_SYS_ADMIN`, 2 nobody; `None` before Linux 6.6 (no such sysctl).
    pub io_uring_disabled: Option<u32>,
    /// `/proc/sys/kernel/io_uring_group` (-1: no group).
    pub io_uring_group: Option<i64>,
    /// The process's filesystem gid or a supplementary group is `io_uring_group`.
    pub in_io_uring_group: bool,
    /// `CAP_SYS_ADMIN` is in the effective set.
    pub cap_sys_admin: bool,
    /// `uname -r`.
    pub kernel_release: String,
}

impl RingPolicy {
    /// Reads the policy of this process; what cannot be read stays `None` / false.
    fn read() -> RingPolicy {
        let status = Process::myself().and_then(|process| process.status()).ok();
        let read_number = |path: &str| {
            std::fs::read_to_string(path)
                .ok()
                .and_then(|text| text.trim().parse::<i64>().ok())
        };
        let io_uring_group = read_number("/proc/sys/kernel/io_uring_group");
        let in_io_uring_group = match (&status, io_uring_group) {
            (Some(status), Some(group)) => u32::try_from(group)
                .is_ok_and(|gid| status.fgid == gid || status.groups.contains(&gid)),
            _ => false,
        };
        RingPolicy {
            seccomp_mode: status.as_ref().and_then(|status| status.seccomp),
            io_uring_disabled: read_number("/proc/sys/kernel/io_uring_disabled")
                .and_then(|value| u32::try_from(value).ok()),
            io_uring_group,
            in_io_uring_group,
            cap_sys_admin: status
                .as_ref()
                .is_some_and(|status| status.capeff & (1 << CAP_SYS_ADMIN_BIT) != 0),
            kernel_release: std::fs::read_to_string("/proc/sys/kernel/osrelease")
                .map_or_else(|_| "unknown".to_owned(), |text| text.trim().to_owned()),
        }
    }
}

/// Runs the startup probe for `shard_count` shards: `ok` with the locked-memory figures, or `fail`
/// with the cause and its fix.
pub(super) fn check(shards: &SizedShards) -> Check {
    let page_size = procfs::page_size();
    let needed_bytes = runtime::probe::memlock_needed_bytes(shards.count, page_size);
    match runtime::probe_io_uring(shards.count) {
        Ok(()) => Check::ok(
            NAME,
            format!(
                "available: a ring with IORING_SETUP_COOP_TASKRUN and every opcode the shards use; \
                 {}",
                memlock_text(memlock_limit_bytes(), needed_bytes, shards)
            ),
        ),
        Err(refusal) => {
            let (found, fix) = diagnose(
                refusal.errno,
                &refusal.cause,
                &RingPolicy::read(),
                needed_bytes,
            );
            Check::fail(NAME, found, fix)
        }
    }
}

/// The soft `RLIMIT_MEMLOCK` in bytes (`None`: unlimited), as the probe left it (raised to the
/// hard limit, as `serve` does).
fn memlock_limit_bytes() -> Option<u64> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the plain struct passed to it.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut limit) };
    (rc == 0 && limit.rlim_cur != libc::RLIM_INFINITY).then_some(limit.rlim_cur)
}

/// `RLIMIT_MEMLOCK unlimited|N KiB, S shard(s) need M KiB of ring memory` (with why S was
/// counted when `serve` would refuse the topology), noting when the limit is below the need
/// (the probe passed, so this kernel does not charge rings to it).
fn memlock_text(limit_bytes: Option<u64>, needed_bytes: u64, shards: &SizedShards) -> String {
    let limit = limit_bytes.map_or_else(
        || "unlimited".to_owned(),
        |bytes| format!("{} KiB", bytes / 1024),
    );
    let mut text = format!(
        "RLIMIT_MEMLOCK {limit}, {shards} need {} KiB of ring memory",
        needed_bytes.div_ceil(1024)
    );
    if limit_bytes.is_some_and(|bytes| bytes < needed_bytes) {
        text.push_str(" (this kernel does not charge rings against it)");
    }
    text
}

/// The cause (found) and the fix of a refused probe, from its errno, its own cause text and the
/// process's ring policy.
pub(super) fn diagnose(
    errno: i32,
    probe_cause: &str,
    policy: &RingPolicy,
    memlock_needed_bytes: u64,
) -> (String, String) {
    match errno {
        libc::ENOMEM => {
            let kib = memlock_needed_bytes.div_ceil(1024);
            (
                probe_cause.to_owned(),
                format!(
                    "raise the locked-memory limit to at least {kib} KiB: `ulimit -l {kib}` in the \
                     shell that starts shardline, `LimitMEMLOCK={kib}K` in its systemd unit, or \
                     `--ulimit memlock={}` for a container; {POLL_FALLBACK}",
                    kib * 1024
                ),
            )
        }
        libc::EPERM | libc::EACCES => permission_causes(errno, policy),
        libc::ENOSYS => {
            let mut found = format!(
                "io_uring_setup returned ENOSYS: kernel {} has no io_uring (built without \
                 CONFIG_IO_URING, or older than 5.1)",
                policy.kernel_release
            );
            if policy.seccomp_mode == Some(2) {
                found.push_str(
                    ", or the seccomp filter in force (Seccomp: 2 in /proc/self/status) answers \
                     ENOSYS for it",
                );
            }
            (
                found,
                format!(
                    "run on Linux 5.19 or later built with io_uring, or allow io_uring_setup, \
                     io_uring_enter and io_uring_register in the seccomp profile; {POLL_FALLBACK}"
                ),
            )
        }
        _ => (
            format!("{probe_cause} (kernel {})", policy.kernel_release),
            format!("run on Linux 5.19 or later; {POLL_FALLBACK}"),
        ),
    }
}

/// EPERM / EACCES: every rule that refuses, in the order the kernel applies them (seccomp at
/// syscall entry, then `io_uring_disabled` and its group, then a security module).
fn permission_causes(errno: i32, policy: &RingPolicy) -> (String, String) {
    let errno_name = if errno == libc::EPERM {
        "EPERM"
    } else {
        "EACCES"
    };
    let mut causes = Vec::new();
    let mut fixes = Vec::new();
    if policy.seccomp_mode == Some(2) {
        causes.push(format!(
            "a seccomp filter (Seccomp: 2 in /proc/self/status) refuses io_uring_setup with \
             {errno_name}, as container runtimes' default profiles do"
        ));
        fixes.push(
            "allow io_uring_setup, io_uring_enter and io_uring_register in the seccomp profile \
             (docker/podman --security-opt seccomp=PROFILE.json, Kubernetes \
             securityContext.seccompProfile, systemd SystemCallFilter=)"
                .to_owned(),
        );
    }
    match policy.io_uring_disabled {
        Some(2) => {
            causes.push(
                "sysctl kernel.io_uring_disabled=2 disables io_uring for every process".to_owned(),
            );
            fixes.push(
                "`sysctl -w kernel.io_uring_disabled=0` (persist it in /etc/sysctl.d/)".to_owned(),
            );
        }
        Some(1) if !policy.cap_sys_admin && !policy.in_io_uring_group => {
            let group = match policy.io_uring_group {
                Some(gid) if gid >= 0 => format!("group {gid} (kernel.io_uring_group)"),
                _ => "kernel.io_uring_group, which is unset (-1)".to_owned(),
            };
            causes.push(format!(
                "sysctl kernel.io_uring_disabled=1 allows io_uring only to {group} and \
                 CAP_SYS_ADMIN, and this process has neither"
            ));
            fixes.push(
                "add the server's user to the kernel.io_uring_group group (`sysctl -w \
                 kernel.io_uring_group=GID` names it), or `sysctl -w kernel.io_uring_disabled=0`"
                    .to_owned(),
            );
        }
        _ => {}
    }
    if causes.is_empty() {
        causes.push(format!(
            "io_uring_setup refused with {errno_name} though seccomp is off and \
             kernel.io_uring_disabled allows it: a security module policy (SELinux, AppArmor) \
             denies io_uring"
        ));
        fixes
            .push("allow io_uring in that policy (SELinux boolean or AppArmor profile)".to_owned());
    }
    fixes.push(POLL_FALLBACK.to_owned());
    (causes.join("; and "), fixes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RingPolicy {
        RingPolicy {
            seccomp_mode: Some(0),
            io_uring_disabled: Some(0),
            io_uring_group: Some(-1),
            in_io_uring_group: false,
            cap_sys_admin: false,
            kernel_release: "6.8.0".to_owned(),
        }
    }

    #[test]
    fn seccomp_is_named_when_the_filter_is_on() {
        let (found, fix) = diagnose(
            libc::EPERM,
            "",
            &RingPolicy {
                seccomp_mode: Some(2),
                ..policy()
            },
            0,
        );
        assert_eq!(
            found,
            "a seccomp filter (Seccomp: 2 in /proc/self/status) refuses io_uring_setup with EPERM, \
             as container runtimes' default profiles do"
        );
        assert!(fix.starts_with("allow io_uring_setup, io_uring_enter and io_uring_register"));
        assert!(fix.ends_with("or start with --io-driver poll (epoll readiness, no rings)"));
    }

    #[test]
    fn the_sysctl_and_its_group_rule_are_named() {
        let (found, fix) = diagnose(
            libc::EPERM,
            "",
            &RingPolicy {
                io_uring_disabled: Some(2),
                ..policy()
            },
            0,
        );
        assert_eq!(
            found,
            "sysctl kernel.io_uring_disabled=2 disables io_uring for every process"
        );
        assert!(
            fix.starts_with("`sysctl -w kernel.io_uring_disabled=0`"),
            "{fix}"
        );

        let one = RingPolicy {
            io_uring_disabled: Some(1),
            io_uring_group: Some(1234),
            ..policy()
        };
        let (found, _) = diagnose(libc::EPERM, "", &one, 0);
        assert_eq!(
            found,
            "sysctl kernel.io_uring_disabled=1 allows io_uring only to group 1234 \
             (kernel.io_uring_group) and CAP_SYS_ADMIN, and this process has neither"
        );
        // In the group (or privileged), the sysctl is not the cause: a security module is.
        for allowed in [
            RingPolicy {
                in_io_uring_group: true,
                ..one.clone()
            },
            RingPolicy {
                cap_sys_admin: true,
                ..one
            },
        ] {
            let (found, _) = diagnose(libc::EPERM, "", &allowed, 0);
            assert!(found.contains("a security module policy"), "{found}");
        }
    }

    #[test]
    fn seccomp_and_sysctl_together_are_both_named() {
        let (found, fix) = diagnose(
            libc::EPERM,
            "",
            &RingPolicy {
                seccomp_mode: Some(2),
                io_uring_disabled: Some(2),
                ..policy()
            },
            0,
        );
        assert!(found.starts_with("a seccomp filter"), "{found}");
        assert!(found.ends_with(
            "; and sysctl kernel.io_uring_disabled=2 disables io_uring for every process"
        ));
        assert!(fix.contains("seccomp profile") && fix.contains("kernel.io_uring_disabled=0"));
    }

    #[test]
    fn memlock_fix_gives_the_needed_size_three_ways() {
        let (found, fix) = diagnose(
            libc::ENOMEM,
            "RLIMIT_MEMLOCK is 64 KiB but ...",
            &policy(),
            232 * 1024,
        );
        assert_eq!(found, "RLIMIT_MEMLOCK is 64 KiB but ...");
        assert_eq!(
            fix,
            "raise the locked-memory limit to at least 232 KiB: `ulimit -l 232` in the shell that \
             starts shardline, `LimitMEMLOCK=232K` in its systemd unit, or `--ulimit \
             memlock=237568` for a container; or start with --io-driver poll (epoll readiness, no \
             rings)"
        );
    }

    #[test]
    fn enosys_and_old_kernels_name_the_release() {
        let (found, _) = diagnose(libc::ENOSYS, "", &policy(), 0);
        assert_eq!(
            found,
            "io_uring_setup returned ENOSYS: kernel 6.8.0 has no io_uring (built without \
             CONFIG_IO_URING, or older than 5.1)"
        );
        let (found, fix) = diagnose(
            libc::EINVAL,
            "kernel too old for the requested ring features",
            &policy(),
            0,
        );
        assert_eq!(
            found,
            "kernel too old for the requested ring features (kernel 6.8.0)"
        );
        assert!(fix.starts_with("run on Linux 5.19 or later"));
    }

    fn shards(count: u16) -> SizedShards {
        SizedShards { count, basis: None }
    }

    #[test]
    fn memlock_text_shows_limit_and_need() {
        assert_eq!(
            memlock_text(Some(8192 * 1024), 232 * 1024, &shards(2)),
            "RLIMIT_MEMLOCK 8192 KiB, 2 shard(s) need 232 KiB of ring memory"
        );
        let refused = SizedShards {
            count: 8,
            basis: Some("the 8 requested: why".to_owned()),
        };
        assert_eq!(
            memlock_text(Some(8192 * 1024), 824 * 1024, &refused),
            "RLIMIT_MEMLOCK 8192 KiB, 8 shard(s) (the 8 requested: why) need 824 KiB of ring memory"
        );
        assert_eq!(
            memlock_text(None, 128 * 1024, &shards(1)),
            "RLIMIT_MEMLOCK unlimited, 1 shard(s) need 128 KiB of ring memory"
        );
        assert_eq!(
            memlock_text(Some(64 * 1024), 128 * 1024, &shards(1)),
            "RLIMIT_MEMLOCK 64 KiB, 1 shard(s) need 128 KiB of ring memory (this kernel does not charge \
             rings against it)"
        );
    }
}
