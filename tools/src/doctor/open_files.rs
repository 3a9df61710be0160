//! The open-file check: `RLIMIT_NOFILE` against what the server's descriptor budget
//! (`shards::resources::ResourceBudget`, the arithmetic `serve` uses) needs for the shards and the
//! planned partition count. Reads the limit; never raises it.

use shards::resources::{ResourceBudget, open_file_limit_for_partitions, open_file_limit_to_start};

use super::Check;

const NAME: &str = "open_files";

/// Reads this process's open-file limits and checks them for `shard_count` shards and
/// `partition_count` partitions.
pub(super) fn check(shard_count: u16, partition_count: u64) -> Check {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the plain struct passed to it.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) } != 0 {
        return Check::fail(
            NAME,
            format!(
                "cannot read RLIMIT_NOFILE: {}",
                std::io::Error::last_os_error()
            ),
            "check that getrlimit is allowed (seccomp profile)",
        );
    }
    let check = check_limits(limit.rlim_cur, limit.rlim_max, shard_count, partition_count);
    match kernel_open_file_ceiling() {
        Some(nr_open) => check_kernel_ceiling(nr_open, partition_count).unwrap_or(check),
        None => check,
    }
}

/// `/proc/sys/fs/nr_open`: the most descriptors any process may be allowed (the ceiling of
/// `RLIMIT_NOFILE`, see proc(5)); `None` when it cannot be read.
fn kernel_open_file_ceiling() -> Option<u64> {
    std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// `fail` when the planned `partition_count` needs more descriptors than the kernel lets any
/// process have (`nr_open`): no `ulimit -n` can allow it, so the advice is to plan fewer
/// partitions per server or raise `fs.nr_open` first; `None` when the plan fits under it.
pub(super) fn check_kernel_ceiling(nr_open: u64, partition_count: u64) -> Option<Check> {
    let needed = open_file_limit_for_partitions(partition_count);
    (needed > nr_open).then(|| {
        Check::fail(
            NAME,
            format!(
                "{partition_count} partitions (--partitions) need an open-file limit of {needed}, \
                 above the kernel's ceiling for any process (fs.nr_open = {nr_open}): no ulimit \
                 can allow that many"
            ),
            format!(
                "plan fewer partitions per server, or raise the ceiling first (`sysctl \
                 fs.nr_open={needed}`, if the host's memory allows that many open files) and \
                 then the open-file limit"
            ),
        )
    })
}

/// The decision for a soft and hard limit: `serve` raises the soft limit to the hard one, so the
/// hard limit is what its budget gets. `fail` when the budget cannot hold one partition and one
/// connection per shard (`serve` refuses to start), `warn` when it holds fewer partitions than
/// planned (topics past the budget are refused, and a data directory holding more refuses to
/// boot), else `ok`.
pub(super) fn check_limits(soft: u64, hard: u64, shard_count: u16, partition_count: u64) -> Check {
    let budget = ResourceBudget::from_open_file_limit(hard, shard_count);
    let limits = format!("soft {soft}, hard {hard} (serve raises the soft limit to the hard one)");
    if budget.startup_refusal(shard_count).is_some() {
        let needed = open_file_limit_to_start(shard_count);
        return Check::fail(
            NAME,
            format!(
                "{limits}: too few for one partition and one client connection on each of \
                 {shard_count} shard(s); serve refuses to start below {needed}"
            ),
            raise_fix(needed),
        );
    }
    if budget.partitions_refusal(partition_count).is_some() {
        return Check::warn(
            NAME,
            format!(
                "{limits}: room for {} partitions, below the {partition_count} planned \
                 (--partitions); creating more is refused, and a data directory holding more \
                 refuses to boot",
                budget.partitions_max
            ),
            raise_fix(open_file_limit_for_partitions(partition_count)),
        );
    }
    Check::ok(
        NAME,
        format!(
            "{limits}: room for {} partitions (planned {partition_count}) and {} client \
             connections per shard",
            budget.partitions_max, budget.connections_per_shard_max
        ),
    )
}

/// How to raise the limit to `needed`.
fn raise_fix(needed: u64) -> String {
    format!(
        "raise the open-file limit to at least {needed}: `ulimit -n {needed}` in the shell that \
         starts shardline (the hard limit too: /etc/security/limits.conf nofile), \
         `LimitNOFILE={needed}` in its systemd unit, or `--ulimit nofile={needed}` for a container"
    )
}

#[cfg(test)]
mod tests {
    use super::super::Status;
    use super::*;

    #[test]
    fn enough_for_the_plan_is_ok() {
        // 20 000: 19 744 usable, half for partitions at 3 descriptors each = 3290.
        let check = check_limits(1024, 20_000, 2, 1000);
        assert_eq!(check.status, Status::Ok);
        assert_eq!(
            check.found,
            "soft 1024, hard 20000 (serve raises the soft limit to the hard one): room for 3290 \
             partitions (planned 1000) and 4936 client connections per shard"
        );
    }

    #[test]
    fn fewer_partitions_than_planned_warns_with_the_limit_that_fits() {
        let check = check_limits(1024, 1024, 2, 1000);
        assert_eq!(check.status, Status::Warn);
        assert_eq!(
            check.found,
            "soft 1024, hard 1024 (serve raises the soft limit to the hard one): room for 128 \
             partitions, below the 1000 planned (--partitions); creating more is refused, and a \
             data directory holding more refuses to boot"
        );
        let needed = open_file_limit_for_partitions(1000);
        assert!(check.fix.starts_with(&format!(
            "raise the open-file limit to at least {needed}: `ulimit -n {needed}`"
        )));
        // The limit the fix names is enough.
        assert_eq!(check_limits(needed, needed, 2, 1000).status, Status::Ok);
    }

    /// The planned count needs more descriptors than fs.nr_open: no ulimit advice, a failure
    /// naming the count, the need and the ceiling.
    #[test]
    fn a_plan_above_the_kernel_ceiling_fails_without_ulimit_advice() {
        let check = check_kernel_ceiling(1_048_576, 100_000_000).unwrap();
        assert_eq!(check.status, Status::Fail);
        let needed = open_file_limit_for_partitions(100_000_000);
        assert!(
            check.found.starts_with(&format!(
                "100000000 partitions (--partitions) need an open-file limit of {needed}, above \
                 the kernel's ceiling for any process (fs.nr_open = 1048576)"
            )),
            "{}",
            check.found
        );
        assert!(!check.fix.contains("ulimit -n"), "{}", check.fix);
        assert_eq!(check_kernel_ceiling(1_048_576, 5000), None);
        assert_eq!(check_kernel_ceiling(needed, 100_000_000), None);
    }

    #[test]
    fn too_few_to_start_fails() {
        let check = check_limits(64, 64, 4, 1);
        assert_eq!(check.status, Status::Fail);
        let needed = open_file_limit_to_start(4);
        assert!(
            check
                .found
                .ends_with(&format!("serve refuses to start below {needed}")),
            "{}",
            check.found
        );
        assert_eq!(check_limits(needed, needed, 4, 1).status, Status::Ok);
    }
}
