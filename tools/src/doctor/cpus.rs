//! The CPU checks: the affinity mask and what `--shards` resolves to (`runtime::Topology`, the
//! same resolution `serve` does), the cgroup CPU quota (v2 `cpu.max`, v1 CFS quota), and the NUMA
//! nodes the allowed CPUs span (`/sys/devices/system/node`). Only reads; never changes affinity.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use procfs::process::{MountInfo, Process};
use runtime::topology::{CpuList, ShardCountArg, Topology, TopologyError, allowed_cpus};

use super::Check;

/// A cgroup CPU quota: `quota_us` of CPU time per `period_us`, set in `path`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct CpuQuota {
    pub quota_us: u64,
    pub period_us: u64,
    /// The control file that sets it (`.../cpu.max` or `.../cpu.cfs_quota_us`).
    pub path: PathBuf,
}

impl CpuQuota {
    /// The quota in CPUs (`quota / period`, fractional).
    pub fn cpus(&self) -> f64 {
        self.quota_us as f64 / self.period_us as f64
    }
}

/// What the host grants this process in CPUs.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct HostCpus {
    /// The affinity mask (empty when it could not be read; the `cpus` check reports why).
    pub allowed: Vec<usize>,
    /// The tightest cgroup v2 `cpu.max` between this process's cgroup and the root.
    pub quota_v2: Option<CpuQuota>,
    /// The tightest cgroup v1 CFS quota (`cpu.cfs_quota_us` / `cpu.cfs_period_us`).
    pub quota_v1: Option<CpuQuota>,
    /// NUMA nodes and their CPUs; empty when `/sys/devices/system/node` is missing.
    pub nodes: Vec<(usize, Vec<usize>)>,
}

impl HostCpus {
    /// Reads the affinity mask, the cgroup quotas and the NUMA layout of this host.
    pub fn read() -> HostCpus {
        let allowed = allowed_cpus().unwrap_or_default();
        let mounts = Process::myself()
            .and_then(|process| process.mountinfo())
            .map(|mounts| mounts.0)
            .unwrap_or_default();
        let own_cgroups = std::fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
        let paths = CgroupPaths::parse(&own_cgroups);
        HostCpus {
            allowed,
            quota_v2: read_quota_v2(&mounts, paths.v2.as_deref()),
            quota_v1: read_quota_v1(&mounts, paths.v1_cpu.as_deref()),
            nodes: read_numa_nodes(Path::new("/sys/devices/system/node")),
        }
    }
}

/// This process's cgroup paths from `/proc/self/cgroup`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub(super) struct CgroupPaths {
    /// The `0::PATH` line (cgroup v2).
    pub v2: Option<String>,
    /// The v1 line whose controller list holds `cpu` (`N:cpu,cpuacct:PATH`).
    pub v1_cpu: Option<String>,
}

impl CgroupPaths {
    /// Parses `/proc/self/cgroup` (`ID:CONTROLLERS:PATH` lines).
    pub fn parse(text: &str) -> CgroupPaths {
        let mut paths = CgroupPaths::default();
        for line in text.lines() {
            let mut fields = line.splitn(3, ':');
            let (Some(id), Some(controllers), Some(path)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            if id == "0" && controllers.is_empty() {
                paths.v2 = Some(path.to_owned());
            } else if controllers.split(',').any(|name| name == "cpu") {
                paths.v1_cpu = Some(path.to_owned());
            }
        }
        paths
    }
}

/// Parses a cgroup v2 `cpu.max` (`"$QUOTA $PERIOD"` in microseconds, `"max $PERIOD"` for none).
///
/// # Errors
/// A message quoting the text when it is neither form (or the period is 0).
pub(super) fn parse_cpu_max(text: &str) -> Result<Option<(u64, u64)>, String> {
    let malformed = || {
        format!(
            "cpu.max {:?} is not `QUOTA PERIOD` or `max PERIOD`",
            text.trim()
        )
    };
    let mut fields = text.split_whitespace();
    let quota = fields.next().ok_or_else(malformed)?;
    let period_us: u64 = match fields.next() {
        Some(period) => period.parse().map_err(|_| malformed())?,
        None => 100_000,
    };
    if fields.next().is_some() || period_us == 0 {
        return Err(malformed());
    }
    if quota == "max" {
        return Ok(None);
    }
    let quota_us: u64 = quota.parse().map_err(|_| malformed())?;
    Ok(Some((quota_us, period_us)))
}

/// Parses a cgroup v1 CFS quota pair (`cpu.cfs_quota_us`, -1 for none; `cpu.cfs_period_us`).
/// `None` for no quota or unparsable text.
pub(super) fn parse_cfs(quota_text: &str, period_text: &str) -> Option<(u64, u64)> {
    let quota_us: i64 = quota_text.trim().parse().ok()?;
    let period_us: u64 = period_text.trim().parse().ok()?;
    let quota_us = u64::try_from(quota_us).ok()?;
    (period_us > 0).then_some((quota_us, period_us))
}

/// The directories from this process's cgroup up to the root of `mount` (where the hierarchy is
/// mounted), deepest first. `own_path` is relative to the hierarchy root; the mount may show a
/// subtree of it (`mount.root`), as inside a container.
fn cgroup_dirs(mount: &MountInfo, own_path: &str) -> Vec<PathBuf> {
    let relative = own_path
        .strip_prefix(mount.root.as_str())
        .unwrap_or(own_path)
        .trim_start_matches('/');
    let mut dir = mount.mount_point.join(relative);
    let mut dirs = vec![dir.clone()];
    while dir != mount.mount_point && dir.pop() {
        dirs.push(dir.clone());
    }
    dirs
}

/// The tightest `cpu.max` on the way from this process's cgroup to the v2 root.
fn read_quota_v2(mounts: &[MountInfo], own_path: Option<&str>) -> Option<CpuQuota> {
    let mount = mounts.iter().find(|mount| mount.fs_type == "cgroup2")?;
    let quotas = cgroup_dirs(mount, own_path.unwrap_or("/"))
        .into_iter()
        .filter_map(|dir| {
            let path = dir.join("cpu.max");
            let text = std::fs::read_to_string(&path).ok()?;
            let (quota_us, period_us) = parse_cpu_max(&text).ok()??;
            Some(CpuQuota {
                quota_us,
                period_us,
                path,
            })
        });
    tightest(quotas)
}

/// The tightest CFS quota on the way from this process's v1 `cpu` cgroup to its root.
fn read_quota_v1(mounts: &[MountInfo], own_path: Option<&str>) -> Option<CpuQuota> {
    let mount = mounts
        .iter()
        .find(|mount| mount.fs_type == "cgroup" && mount.super_options.contains_key("cpu"))?;
    let quotas = cgroup_dirs(mount, own_path.unwrap_or("/"))
        .into_iter()
        .filter_map(|dir| {
            let path = dir.join("cpu.cfs_quota_us");
            let quota_text = std::fs::read_to_string(&path).ok()?;
            let period_text = std::fs::read_to_string(dir.join("cpu.cfs_period_us")).ok()?;
            let (quota_us, period_us) = parse_cfs(&quota_text, &period_text)?;
            Some(CpuQuota {
                quota_us,
                period_us,
                path,
            })
        });
    tightest(quotas)
}

/// The quota with the fewest CPUs: the kernel enforces every level, so the tightest binds.
fn tightest(quotas: impl Iterator<Item = CpuQuota>) -> Option<CpuQuota> {
    quotas.min_by(|a, b| a.cpus().total_cmp(&b.cpus()))
}

/// A sysfs CPU list (`0-3,8`; empty for a node without CPUs).
fn parse_sysfs_cpu_list(text: &str) -> Option<Vec<usize>> {
    if text.trim().is_empty() {
        return Some(Vec::new());
    }
    text.trim().parse::<CpuList>().ok().map(|list| list.0)
}

/// NUMA nodes under `root` (`/sys/devices/system/node`): the `online` list, each node's `cpulist`.
fn read_numa_nodes(root: &Path) -> Vec<(usize, Vec<usize>)> {
    let Some(online) = std::fs::read_to_string(root.join("online"))
        .ok()
        .and_then(|text| parse_sysfs_cpu_list(&text))
    else {
        return Vec::new();
    };
    online
        .into_iter()
        .map(|node| {
            let cpus = std::fs::read_to_string(root.join(format!("node{node}/cpulist")))
                .ok()
                .and_then(|text| parse_sysfs_cpu_list(&text))
                .unwrap_or_default();
            (node, cpus)
        })
        .collect()
}

/// `0-3,8` for a sorted list of CPU ids.
fn compact(cpus: &[usize]) -> String {
    if cpus.is_empty() {
        return "none".to_owned();
    }
    CpuList(cpus.to_vec()).to_string()
}

/// The affinity mask and what `--shards` resolves to: `fail` when `serve` would refuse the
/// placement (the resolution error is its refusal).
pub(super) fn shards_check(
    host: &HostCpus,
    shards: ShardCountArg,
    topology: &Result<Topology, TopologyError>,
) -> Check {
    const NAME: &str = "cpus";
    let shards_flag = match shards {
        ShardCountArg::All => "all".to_owned(),
        ShardCountArg::Count(count) => count.to_string(),
    };
    match topology {
        Ok(topology) => {
            let pinned: Vec<usize> = topology.shard_cores.iter().flatten().copied().collect();
            let placement = if pinned.is_empty() {
                "unpinned (--no-pin)".to_owned()
            } else {
                format!("pinned to CPUs {}", compact(&pinned))
            };
            Check::ok(
                NAME,
                format!(
                    "affinity mask {} ({} CPUs); --shards {shards_flag} runs {} shard(s), {placement}",
                    compact(&host.allowed),
                    host.allowed.len(),
                    topology.shard_count(),
                ),
            )
        }
        Err(error @ TopologyError::Affinity(_)) => Check::fail(
            NAME,
            error.to_string(),
            "serve cannot place shards without the affinity mask; check that sched_getaffinity \
             is allowed (seccomp profile)",
        ),
        Err(error) => Check::fail(
            NAME,
            format!(
                "affinity mask {} ({} CPUs); serve would refuse: {error}",
                compact(&host.allowed),
                host.allowed.len()
            ),
            format!(
                "use --shards {} or fewer (or all), or pass --no-pin to run more shards than cores",
                host.allowed.len()
            ),
        ),
    }
}

/// One quota in words: `cgroup v2 cpu.max 150000/100000 us = 1.50 CPUs (PATH)`.
fn quota_text(version: &str, quota: &CpuQuota) -> String {
    format!(
        "cgroup {version} quota {}/{} us = {:.2} CPUs ({})",
        quota.quota_us,
        quota.period_us,
        quota.cpus(),
        quota.path.display()
    )
}

/// The cgroup CPU quota against the allowed CPUs: `warn` when it is below them (shards, one per
/// allowed CPU, would be throttled).
pub(super) fn quota_check(host: &HostCpus) -> Check {
    const NAME: &str = "cpu_quota";
    let allowed_count = host.allowed.len();
    let quotas: Vec<(&str, &CpuQuota)> = [
        ("v2", host.quota_v2.as_ref()),
        ("v1", host.quota_v1.as_ref()),
    ]
    .into_iter()
    .filter_map(|(version, quota)| quota.map(|quota| (version, quota)))
    .collect();
    let Some((version, binding)) = quotas
        .iter()
        .min_by(|a, b| a.1.cpus().total_cmp(&b.1.cpus()))
        .copied()
    else {
        return Check::ok(
            NAME,
            "no cgroup CPU quota (cgroup v2 cpu.max and v1 cpu.cfs_quota_us unset or absent)",
        );
    };
    let described: Vec<String> = quotas
        .iter()
        .map(|(version, quota)| quota_text(version, quota))
        .collect();
    let found = described.join("; ");
    if binding.cpus() >= allowed_count as f64 {
        return Check::ok(
            NAME,
            format!("{found}: not below the {allowed_count} allowed CPUs"),
        );
    }
    let whole_cpus = binding.cpus().floor().max(1.0) as usize;
    let serve_note = if version == "v2" {
        "--shards all runs one shard per whole CPU of it, rounded up"
    } else {
        "serve reads only the v2 quota, so --shards all still runs one shard per allowed CPU"
    };
    Check::warn(
        NAME,
        format!(
            "{found}: below the {allowed_count} allowed CPUs, so shards pinned one per CPU are \
             throttled ({serve_note})"
        ),
        format!(
            "grant the cgroup {allowed_count} CPUs (systemd CPUQuota={}%, docker --cpus \
             {allowed_count}, Kubernetes resources.limits.cpu: {allowed_count}), or run --shards \
             {whole_cpus}",
            allowed_count * 100
        ),
    )
}

/// NUMA nodes and which of them the allowed CPUs span. Always `ok` (shardline places no memory by
/// node), but a span over several nodes is named with the `--cpus` list that keeps one node.
pub(super) fn numa_check(host: &HostCpus) -> Check {
    const NAME: &str = "numa";
    if host.nodes.is_empty() {
        return Check::ok(
            NAME,
            "no NUMA layout in /sys/devices/system/node: one memory node assumed",
        );
    }
    let spanned: Vec<&(usize, Vec<usize>)> = host
        .nodes
        .iter()
        .filter(|(_, cpus)| {
            cpus.iter()
                .any(|cpu| host.allowed.binary_search(cpu).is_ok())
        })
        .collect();
    let layout: Vec<String> = host
        .nodes
        .iter()
        .map(|(node, cpus)| format!("node{node}: CPUs {}", compact(cpus)))
        .collect();
    let mut found = format!(
        "{} node(s) ({}); the allowed CPUs span {} of them",
        host.nodes.len(),
        layout.join(", "),
        spanned.len()
    );
    if let Some((node, cpus)) = spanned.first()
        && spanned.len() > 1
    {
        let on_node: Vec<usize> = cpus
            .iter()
            .copied()
            .filter(|cpu| host.allowed.binary_search(cpu).is_ok())
            .collect();
        // Writing to a String cannot fail.
        let _ = write!(
            found,
            "; shards on different nodes exchange messages across the interconnect \
             (--cpus {} keeps a server on node{node})",
            compact(&on_node)
        );
    }
    Check::ok(NAME, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(allowed: &[usize]) -> HostCpus {
        HostCpus {
            allowed: allowed.to_vec(),
            quota_v2: None,
            quota_v1: None,
            nodes: Vec::new(),
        }
    }

    fn quota(quota_us: u64, period_us: u64, path: &str) -> CpuQuota {
        CpuQuota {
            quota_us,
            period_us,
            path: PathBuf::from(path),
        }
    }

    #[test]
    fn cpu_max_forms() {
        assert_eq!(parse_cpu_max("max 100000\n"), Ok(None));
        assert_eq!(
            parse_cpu_max("150000 100000\n"),
            Ok(Some((150_000, 100_000)))
        );
        assert_eq!(parse_cpu_max("50000"), Ok(Some((50_000, 100_000))));
        assert_eq!(
            parse_cpu_max("lots 100000"),
            Err("cpu.max \"lots 100000\" is not `QUOTA PERIOD` or `max PERIOD`".to_owned())
        );
        assert!(parse_cpu_max("100 0").is_err());
        assert!(parse_cpu_max("").is_err());
        assert!(parse_cpu_max("1 2 3").is_err());
    }

    #[test]
    fn cfs_forms() {
        assert_eq!(parse_cfs("-1\n", "100000\n"), None);
        assert_eq!(parse_cfs("250000\n", "100000\n"), Some((250_000, 100_000)));
        assert_eq!(parse_cfs("x", "100000"), None);
        assert_eq!(parse_cfs("100", "0"), None);
    }

    #[test]
    fn cgroup_paths_of_v2_hybrid_and_v1() {
        assert_eq!(
            CgroupPaths::parse("0::/system.slice/shardline.service\n"),
            CgroupPaths {
                v2: Some("/system.slice/shardline.service".to_owned()),
                v1_cpu: None
            }
        );
        assert_eq!(
            CgroupPaths::parse("4:memory:/x\n3:cpu,cpuacct:/docker/abc\n0::/\n"),
            CgroupPaths {
                v2: Some("/".to_owned()),
                v1_cpu: Some("/docker/abc".to_owned())
            }
        );
        // `cpuset` and `cpuacct` are not `cpu`.
        assert_eq!(
            CgroupPaths::parse("2:cpuset:/a\n3:cpuacct:/b\n").v1_cpu,
            None
        );
    }

    #[test]
    fn cgroup_dirs_walk_from_the_own_cgroup_to_the_mount() {
        let host_mount = MountInfo::from_line(
            "35 24 0:30 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate",
        )
        .unwrap();
        assert_eq!(
            cgroup_dirs(&host_mount, "/system.slice/shardline.service"),
            [
                PathBuf::from("/sys/fs/cgroup/system.slice/shardline.service"),
                PathBuf::from("/sys/fs/cgroup/system.slice"),
                PathBuf::from("/sys/fs/cgroup"),
            ]
        );
        // A container sees a subtree of the hierarchy mounted at /sys/fs/cgroup.
        let container_mount = MountInfo::from_line(
            "700 690 0:30 /docker/abc /sys/fs/cgroup ro,nosuid - cgroup2 cgroup2 rw",
        )
        .unwrap();
        assert_eq!(
            cgroup_dirs(&container_mount, "/docker/abc"),
            [PathBuf::from("/sys/fs/cgroup")]
        );
        assert_eq!(
            cgroup_dirs(&host_mount, "/"),
            [PathBuf::from("/sys/fs/cgroup")]
        );
    }

    #[test]
    fn the_tightest_quota_binds() {
        let quotas = [quota(400_000, 100_000, "/a"), quota(150_000, 100_000, "/b")];
        assert_eq!(
            tightest(quotas.into_iter()).unwrap().path,
            PathBuf::from("/b")
        );
        assert_eq!(tightest(std::iter::empty()), None);
    }

    #[test]
    fn quota_below_the_allowed_cpus_warns() {
        assert_eq!(quota_check(&host(&[0, 1])).status, super::super::Status::Ok);
        let mut throttled = host(&[0, 1, 2, 3]);
        throttled.quota_v2 = Some(quota(150_000, 100_000, "/sys/fs/cgroup/x/cpu.max"));
        let check = quota_check(&throttled);
        assert_eq!(
            check.found,
            "cgroup v2 quota 150000/100000 us = 1.50 CPUs (/sys/fs/cgroup/x/cpu.max): below the \
             4 allowed CPUs, so shards pinned one per CPU are throttled (--shards all runs one \
             shard per whole CPU of it, rounded up)"
        );
        assert_eq!(
            check.fix,
            "grant the cgroup 4 CPUs (systemd CPUQuota=400%, docker --cpus 4, Kubernetes \
             resources.limits.cpu: 4), or run --shards 1"
        );
        let mut enough = host(&[0, 1]);
        enough.quota_v1 = Some(quota(
            200_000,
            100_000,
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        ));
        assert_eq!(quota_check(&enough).status, super::super::Status::Ok);
        enough.quota_v1 = Some(quota(100_000, 100_000, "/q"));
        let check = quota_check(&enough);
        assert_eq!(check.status, super::super::Status::Warn);
        assert!(
            check.found.contains("serve reads only the v2 quota"),
            "{}",
            check.found
        );
    }

    #[test]
    fn numa_span_names_the_nodes() {
        let mut one = host(&[0, 1]);
        one.nodes = vec![(0, vec![0, 1])];
        assert_eq!(
            numa_check(&one).found,
            "1 node(s) (node0: CPUs 0-1); the allowed CPUs span 1 of them"
        );
        let mut two = host(&[2, 3, 4, 5]);
        two.nodes = vec![(0, vec![0, 1, 2, 3]), (1, vec![4, 5, 6, 7])];
        assert_eq!(
            numa_check(&two).found,
            "2 node(s) (node0: CPUs 0-3, node1: CPUs 4-7); the allowed CPUs span 2 of them; \
             shards on different nodes exchange messages across the interconnect (--cpus 2-3 \
             keeps a server on node0)"
        );
        assert_eq!(parse_sysfs_cpu_list("\n"), Some(Vec::new()));
        assert_eq!(parse_sysfs_cpu_list("0-2,8\n"), Some(vec![0, 1, 2, 8]));
    }

    #[test]
    fn shards_check_reports_serves_refusal() {
        let host = host(&[0, 1]);
        let refused = Topology::resolve_with(
            &runtime::topology::TopologyConfig {
                shards: ShardCountArg::Count(4),
                cpus: None,
                pin: true,
            },
            &host.allowed,
            None,
        );
        let check = shards_check(&host, ShardCountArg::Count(4), &refused);
        assert_eq!(check.status, super::super::Status::Fail);
        assert!(
            check
                .found
                .starts_with("affinity mask 0-1 (2 CPUs); serve would refuse: --shards 4"),
            "{}",
            check.found
        );
        let placed = Topology::resolve_with(
            &runtime::topology::TopologyConfig {
                shards: ShardCountArg::All,
                cpus: None,
                pin: true,
            },
            &host.allowed,
            None,
        );
        assert_eq!(
            shards_check(&host, ShardCountArg::All, &placed).found,
            "affinity mask 0-1 (2 CPUs); --shards all runs 2 shard(s), pinned to CPUs 0-1"
        );
    }
}
