//! Which cores the shards run on: the allowed set (affinity mask, cgroup quota), `--cpus` lists,
//! `--shards N|all`, `--no-pin`. Never spawns threads and never changes any affinity: it only
//! reads the process's limits and decides the placement.

use std::fmt::{self, Write as _};
use std::path::Path;
use std::str::FromStr;

use crate::limits::{CPU_ID_MAX, SHARD_COUNT_MAX};

/// A parsed CPU list such as `0-3,8`: sorted, distinct CPU ids, each at most `CPU_ID_MAX`.
///
/// `Display` writes the compact form (`0-3,8`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl FromStr for CpuList {
    type Err = TopologyError;
    /// Parses comma-separated CPU ids and inclusive ranges (`0-3,8`); whitespace around entries is
    /// ignored.
    ///
    /// # Errors
    /// `TopologyError::CpuListSyntax` naming the value and the rule: an empty list or entry, an
    /// entry that is not a number, a range whose start is above its end (`3-1`), a CPU id above
    /// `CPU_ID_MAX`, a CPU listed more than once (`1,1`, or overlapping ranges `0-3,2`: each CPU
    /// runs one shard, so a repeat is a typo, never a request for two shards on it).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let syntax = |rule: String| TopologyError::CpuListSyntax {
            value: s.to_owned(),
            rule,
        };
        if s.trim().is_empty() {
            return Err(syntax("the list is empty".to_owned()));
        }
        let parse_id = |text: &str| -> Result<usize, TopologyError> {
            let text = text.trim();
            if text.is_empty() {
                return Err(syntax("a range is missing its start or end".to_owned()));
            }
            let id: usize = text
                .parse()
                .map_err(|_| syntax(format!("{text:?} is not a CPU number")))?;
            if id > CPU_ID_MAX {
                return Err(syntax(format!(
                    "CPU {id} is above the largest supported CPU id {CPU_ID_MAX}"
                )));
            }
            Ok(id)
        };
        let mut cpus = Vec::new();
        for entry in s.split(',') {
            if entry.trim().is_empty() {
                return Err(syntax("the list has an empty entry".to_owned()));
            }
            if let Some((start_text, end_text)) = entry.split_once('-') {
                let start = parse_id(start_text)?;
                let end = parse_id(end_text)?;
                if start > end {
                    return Err(syntax(format!(
                        "range start {start} is above range end {end}"
                    )));
                }
                cpus.extend(start..=end);
            } else {
                cpus.push(parse_id(entry)?);
            }
        }
        cpus.sort_unstable();
        if let Some(cpu) = first_repeated_cpu(&cpus) {
            return Err(syntax(repeated_cpu_rule(cpu)));
        }
        Ok(CpuList(cpus))
    }
}

impl fmt::Display for CpuList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&compact_cpu_list(&self.0))
    }
}

/// The smallest CPU id that `cpus` holds more than once, if any.
fn first_repeated_cpu(cpus: &[usize]) -> Option<usize> {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    sorted
        .windows(2)
        .find(|pair| pair[0] == pair[1])
        .map(|pair| pair[0])
}

fn repeated_cpu_rule(cpu: usize) -> String {
    format!("CPU {cpu} is listed more than once")
}

/// Writes sorted CPU ids in the kernel's list format: runs of two or more as `a-b`, e.g. `0-3,8`.
fn compact_cpu_list(cpus: &[usize]) -> String {
    let mut text = String::new();
    let mut index = 0;
    while index < cpus.len() {
        let start = cpus[index];
        let mut end = start;
        while index + 1 < cpus.len() && cpus[index + 1] == end + 1 {
            index += 1;
            end = cpus[index];
        }
        if !text.is_empty() {
            text.push(',');
        }
        // Writing to a String cannot fail.
        let _ = if start == end {
            write!(text, "{start}")
        } else {
            write!(text, "{start}-{end}")
        };
        index += 1;
    }
    text
}

/// `--shards N|all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCountArg {
    /// Exactly N shards (1 <= N <= `SHARD_COUNT_MAX`).
    Count(u16),
    /// One shard per allowed core (or per `--cpus` entry).
    All,
}

impl FromStr for ShardCountArg {
    type Err = TopologyError;
    /// Parses `all` or a whole number in `1..=SHARD_COUNT_MAX`.
    ///
    /// # Errors
    /// `TopologyError::ShardCount` naming the value and the rule.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let rejected = |rule: String| TopologyError::ShardCount {
            value: s.to_owned(),
            rule,
        };
        let text = s.trim();
        if text == "all" {
            return Ok(ShardCountArg::All);
        }
        let count: u64 = text.parse().map_err(|_| {
            rejected(format!(
                "expected `all` or a whole number of shards from 1 to {SHARD_COUNT_MAX}"
            ))
        })?;
        if count == 0 || count > SHARD_COUNT_MAX as u64 {
            return Err(rejected(format!(
                "shard count must be between 1 and {SHARD_COUNT_MAX}"
            )));
        }
        Ok(ShardCountArg::Count(count as u16))
    }
}

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    /// `--shards`.
    pub shards: ShardCountArg,
    /// `--cpus`, if given.
    pub cpus: Option<CpuList>,
    /// false with `--no-pin`.
    pub pin: bool,
}

/// The resolved placement: one entry per shard, `Some(cpu)` when pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    /// Index = shard id; `None` when unpinned (`--no-pin`).
    pub shard_cores: Vec<Option<usize>>,
    /// The process's allowed CPUs (`sched_getaffinity`), for logs and error messages.
    pub allowed_cpus: Vec<usize>,
}

impl Topology {
    /// Resolves the config against the process affinity mask (`sched_getaffinity`) and the
    /// cgroup v2 CPU quota (`cpu.max`); see [`Topology::resolve_with`] for the rules.
    ///
    /// # Errors
    /// Each variant names the flag, the value and the rule (`--shards 0`, more shards than allowed
    /// cores without `--no-pin`, a `--cpus` entry outside the allowed set, `--cpus` with
    /// `--no-pin`), or `Affinity` when the mask cannot be read.
    pub fn resolve(config: &TopologyConfig) -> Result<Topology, TopologyError> {
        let allowed = allowed_cpus()?;
        let quota_cpu_count = cgroup_cpu_quota_count();
        Topology::resolve_with(config, &allowed, quota_cpu_count)
    }

    /// The pure core of [`Topology::resolve`], for any allowed set and quota.
    ///
    /// `allowed` is the sorted affinity mask; `quota_cpu_count` is the cgroup CPU quota rounded up
    /// to whole CPUs (`None`: no quota). Rules (DESIGN section 3):
    /// - `--cpus LIST`: every entry must be allowed; `all` is one shard per entry, `N` the first N
    ///   entries (more than the list holds is `TooManyShards` when pinning).
    /// - no `--cpus`: `all` is one shard per allowed core, capped by the quota (at least 1) and by
    ///   `SHARD_COUNT_MAX`; `N` takes the first N allowed cores, and more than allowed is
    ///   `TooManyShards` unless `--no-pin`.
    /// - `--no-pin`: the same counts, but every shard is unpinned (`None`) and any N is accepted.
    /// - `--cpus` with `--no-pin` is `CpusWithoutPin`: the list only says where to pin, so
    ///   accepting both would silently drop one of them.
    /// - a CPU listed twice in `--cpus` is `CpuListSyntax` (the parser rejects it; this checks
    ///   a `CpuList` built by hand).
    ///
    /// # Errors
    /// `CpusWithoutPin`, `CpuListSyntax`, `CpuNotAllowed`, `TooManyShards`.
    ///
    /// # Panics
    /// If `allowed` is empty: the kernel never runs a process with an empty affinity mask.
    pub fn resolve_with(
        config: &TopologyConfig,
        allowed: &[usize],
        quota_cpu_count: Option<usize>,
    ) -> Result<Topology, TopologyError> {
        assert!(!allowed.is_empty(), "the affinity mask is never empty");
        let allowed_text = compact_cpu_list(allowed);
        let candidates: Vec<usize> = match &config.cpus {
            Some(list) => {
                if !config.pin {
                    return Err(TopologyError::CpusWithoutPin {
                        value: list.to_string(),
                    });
                }
                if let Some(cpu) = first_repeated_cpu(&list.0) {
                    return Err(TopologyError::CpuListSyntax {
                        value: list.to_string(),
                        rule: repeated_cpu_rule(cpu),
                    });
                }
                for &cpu in &list.0 {
                    if allowed.binary_search(&cpu).is_err() {
                        return Err(TopologyError::CpuNotAllowed {
                            value: list.to_string(),
                            cpu,
                            allowed: allowed_text,
                        });
                    }
                }
                if let Some(quota) = quota_cpu_count
                    && list.0.len() > quota
                {
                    tracing::warn!(
                        cpus = %list,
                        quota_cpu_count = quota,
                        "--cpus lists more CPUs than the cgroup CPU quota grants; shards will be throttled"
                    );
                }
                list.0.clone()
            }
            None => allowed.to_vec(),
        };
        let shard_count = match config.shards {
            ShardCountArg::All => {
                let mut count = candidates.len();
                if config.cpus.is_none()
                    && let Some(quota) = quota_cpu_count
                {
                    count = count.min(quota.max(1));
                }
                count.min(SHARD_COUNT_MAX)
            }
            ShardCountArg::Count(requested) => {
                let requested = usize::from(requested);
                if config.pin && requested > candidates.len() {
                    return Err(TopologyError::TooManyShards {
                        requested,
                        allowed_count: candidates.len(),
                        allowed: compact_cpu_list(&candidates),
                        from_cpus: config.cpus.is_some(),
                    });
                }
                requested
            }
        };
        assert!((1..=SHARD_COUNT_MAX).contains(&shard_count));
        let shard_cores = if config.pin {
            candidates[..shard_count]
                .iter()
                .copied()
                .map(Some)
                .collect()
        } else {
            vec![None; shard_count]
        };
        Ok(Topology {
            shard_cores,
            allowed_cpus: allowed.to_vec(),
        })
    }

    /// Shards placed (1..=`SHARD_COUNT_MAX`).
    pub fn shard_count(&self) -> u16 {
        self.shard_cores.len() as u16
    }
}

/// The CPUs this process may run on (`sched_getaffinity(2)` of the calling thread), sorted. It
/// reflects `taskset`, cgroup cpusets and systemd `AllowedCPUs`; CPUs above `CPU_ID_MAX` are
/// ignored.
///
/// # Errors
/// `TopologyError::Affinity` when the syscall fails.
pub fn allowed_cpus() -> Result<Vec<usize>, TopologyError> {
    const WORD_BITS: usize = u64::BITS as usize;
    let mut mask = [0_u64; (CPU_ID_MAX + 1).div_ceil(WORD_BITS)];
    // SAFETY: the kernel writes at most `size_of_val(&mask)` bytes into `mask`, which is a plain
    // bitset laid out like `cpu_set_t` (an array of unsigned longs) and lives across the call.
    let rc = unsafe {
        libc::sched_getaffinity(0, std::mem::size_of_val(&mask), mask.as_mut_ptr().cast())
    };
    if rc != 0 {
        return Err(TopologyError::Affinity(std::io::Error::last_os_error()));
    }
    let cpus: Vec<usize> = (0..=CPU_ID_MAX)
        .filter(|cpu| mask[cpu / WORD_BITS] & (1 << (cpu % WORD_BITS)) != 0)
        .collect();
    if cpus.is_empty() {
        return Err(TopologyError::Affinity(std::io::Error::other(
            "the affinity mask holds no CPU at or below the supported maximum",
        )));
    }
    Ok(cpus)
}

/// The cgroup v2 CPU quota of this process in whole CPUs (`ceil(quota / period)`, at least 1), or
/// `None` when no cgroup on the path to the root sets one (or cgroup v2 is not mounted). The
/// tightest quota between the process's own cgroup and the root wins, as the kernel enforces all.
pub fn cgroup_cpu_quota_count() -> Option<usize> {
    let own_path = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|text| cgroup_v2_path(&text));
    let root = Path::new("/sys/fs/cgroup");
    let mut limits = Vec::new();
    if let Some(own_path) = own_path {
        let mut dir = root.join(own_path.trim_start_matches('/'));
        while dir.starts_with(root) && dir != root {
            if let Ok(text) = std::fs::read_to_string(dir.join("cpu.max")) {
                limits.extend(parse_cpu_max(&text));
            }
            if !dir.pop() {
                break;
            }
        }
    }
    // Inside a cgroup namespace the process's own cgroup is mounted at the root.
    if let Ok(text) = std::fs::read_to_string(root.join("cpu.max")) {
        limits.extend(parse_cpu_max(&text));
    }
    limits.into_iter().min()
}

/// The cgroup v2 path from `/proc/self/cgroup` (the `0::/path` line).
fn cgroup_v2_path(proc_self_cgroup: &str) -> Option<String> {
    proc_self_cgroup
        .lines()
        .find_map(|line| line.strip_prefix("0::"))
        .map(str::to_owned)
}

/// Parses a cgroup v2 `cpu.max` (`"$QUOTA $PERIOD"` in microseconds, `"max ..."` for none) into
/// whole CPUs, rounded up and at least 1; `None` for no quota or unreadable text.
fn parse_cpu_max(text: &str) -> Option<usize> {
    let mut fields = text.split_whitespace();
    let quota_us: u64 = fields.next()?.parse().ok()?;
    let period_us: u64 = fields.next().map_or(Some(100_000), |p| p.parse().ok())?;
    if period_us == 0 {
        return None;
    }
    Some((quota_us.div_ceil(period_us) as usize).max(1))
}

/// Why a topology flag was rejected. Display names key, value and rule.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// `--cpus` is not a valid CPU list.
    #[error("invalid --cpus value {value:?}: {rule}")]
    CpuListSyntax { value: String, rule: String },
    /// `--shards` is not `all` or a count in range.
    #[error("invalid --shards value {value:?}: {rule}")]
    ShardCount { value: String, rule: String },
    /// A `--cpus` entry is outside the affinity mask (`value` is the list in compact form).
    #[error("--cpus {value}: CPU {cpu} is not in the allowed set {allowed} (affinity mask)")]
    CpuNotAllowed {
        value: String,
        cpu: usize,
        allowed: String,
    },
    /// More pinned shards than usable cores. The cores are `--cpus`'s list when `from_cpus`
    /// (widen or drop it, or lower `--shards`: `--no-pin` cannot be combined with `--cpus`),
    /// else the affinity mask (lower `--shards`, or pass `--no-pin`).
    #[error("{}", too_many_shards_message(*requested, *allowed_count, allowed, *from_cpus))]
    TooManyShards {
        requested: usize,
        /// How many cores the shards may be pinned to.
        allowed_count: usize,
        /// Those cores, in compact form (`0-3,8`).
        allowed: String,
        /// Whether the cores are `--cpus`'s list rather than the whole affinity mask.
        from_cpus: bool,
    },
    /// `--cpus` together with `--no-pin`: drop one of them.
    #[error("--cpus {value} pins shards to CPUs; it cannot be combined with --no-pin")]
    CpusWithoutPin { value: String },
    /// `sched_getaffinity` failed.
    #[error("cannot read the process affinity mask: {0}")]
    Affinity(std::io::Error),
}

/// [`TopologyError::TooManyShards`] in words: the count, the cores and where they came from, then
/// what works: only remedies the flags allow (`--no-pin` is refused with `--cpus`).
fn too_many_shards_message(
    requested: usize,
    allowed_count: usize,
    allowed: &str,
    from_cpus: bool,
) -> String {
    let cores = if allowed_count == 1 { "core" } else { "cores" };
    if from_cpus {
        format!(
            "--shards {requested}: more shards than the cores --cpus lists ({allowed_count} \
             allowed {cores}: {allowed}); lower --shards, or widen or drop --cpus (--no-pin \
             is refused with it)"
        )
    } else {
        format!(
            "--shards {requested}: more shards than allowed cores ({allowed_count} allowed \
             {cores}: {allowed}); lower --shards, or pass --no-pin to overprovision"
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(shards: &str, cpus: Option<&str>, pin: bool) -> TopologyConfig {
        TopologyConfig {
            shards: shards.parse().unwrap(),
            cpus: cpus.map(|text| text.parse().unwrap()),
            pin,
        }
    }

    fn resolve(
        shards: &str,
        cpus: Option<&str>,
        pin: bool,
        allowed: &[usize],
        quota: Option<usize>,
    ) -> Result<Topology, TopologyError> {
        Topology::resolve_with(&config(shards, cpus, pin), allowed, quota)
    }

    fn error_text(shards: &str, cpus: Option<&str>, pin: bool, allowed: &[usize]) -> String {
        resolve(shards, cpus, pin, allowed, None)
            .unwrap_err()
            .to_string()
    }

    #[test]
    fn cpu_list_parses_ranges_sorted() {
        let list: CpuList = "8,0-3, 5".parse().unwrap();
        assert_eq!(list, CpuList(vec![0, 1, 2, 3, 5, 8]));
        assert_eq!(list.to_string(), "0-3,5,8");
        assert_eq!("7".parse::<CpuList>().unwrap(), CpuList(vec![7]));
        assert_eq!("4095".parse::<CpuList>().unwrap(), CpuList(vec![4095]));
        assert_eq!("1-1".parse::<CpuList>().unwrap(), CpuList(vec![1]));
    }

    #[test]
    fn cpu_list_errors_name_value_and_rule() {
        let text = |s: &str| s.parse::<CpuList>().unwrap_err().to_string();
        assert_eq!(text(""), r#"invalid --cpus value "": the list is empty"#);
        assert_eq!(
            text("0,,1"),
            r#"invalid --cpus value "0,,1": the list has an empty entry"#
        );
        assert_eq!(
            text("x"),
            r#"invalid --cpus value "x": "x" is not a CPU number"#
        );
        assert_eq!(
            text("-1"),
            r#"invalid --cpus value "-1": a range is missing its start or end"#
        );
        assert_eq!(
            text("3-1"),
            r#"invalid --cpus value "3-1": range start 3 is above range end 1"#
        );
        assert_eq!(
            text("1,1,1"),
            r#"invalid --cpus value "1,1,1": CPU 1 is listed more than once"#
        );
        assert_eq!(
            text("8,0-3,2,5"),
            r#"invalid --cpus value "8,0-3,2,5": CPU 2 is listed more than once"#
        );
        assert_eq!(
            text("4-6,0-5"),
            r#"invalid --cpus value "4-6,0-5": CPU 4 is listed more than once"#
        );
        assert_eq!(
            text("0-4096"),
            r#"invalid --cpus value "0-4096": CPU 4096 is above the largest supported CPU id 4095"#
        );
    }

    #[test]
    fn shard_count_parses_all_and_bounds() {
        assert_eq!("all".parse::<ShardCountArg>().unwrap(), ShardCountArg::All);
        assert_eq!(
            "1".parse::<ShardCountArg>().unwrap(),
            ShardCountArg::Count(1)
        );
        assert_eq!(
            "1024".parse::<ShardCountArg>().unwrap(),
            ShardCountArg::Count(1024)
        );
        let text = |s: &str| s.parse::<ShardCountArg>().unwrap_err().to_string();
        assert_eq!(
            text("0"),
            r#"invalid --shards value "0": shard count must be between 1 and 1024"#
        );
        assert_eq!(
            text("1025"),
            r#"invalid --shards value "1025": shard count must be between 1 and 1024"#
        );
        assert_eq!(
            text("four"),
            r#"invalid --shards value "four": expected `all` or a whole number of shards from 1 to 1024"#
        );
        assert_eq!(
            text("-2"),
            r#"invalid --shards value "-2": expected `all` or a whole number of shards from 1 to 1024"#
        );
    }

    #[test]
    fn all_without_cpus_is_one_pinned_shard_per_allowed_core() {
        let topology = resolve("all", None, true, &[0, 1, 4, 5], None).unwrap();
        assert_eq!(
            topology.shard_cores,
            vec![Some(0), Some(1), Some(4), Some(5)]
        );
        assert_eq!(topology.allowed_cpus, vec![0, 1, 4, 5]);
        assert_eq!(topology.shard_count(), 4);
    }

    #[test]
    fn all_is_capped_by_the_cgroup_quota() {
        let topology = resolve("all", None, true, &[0, 1, 2, 3], Some(2)).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(0), Some(1)]);
        let topology = resolve("all", None, false, &[0, 1, 2, 3], Some(3)).unwrap();
        assert_eq!(topology.shard_cores, vec![None, None, None]);
        // A quota above the mask leaves the mask as the bound.
        let topology = resolve("all", None, true, &[0, 1], Some(16)).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(0), Some(1)]);
    }

    #[test]
    fn count_takes_the_first_allowed_cores() {
        let topology = resolve("2", None, true, &[2, 3, 6], None).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(2), Some(3)]);
    }

    #[test]
    fn too_many_shards_names_both_numbers() {
        assert_eq!(
            error_text("2", None, true, &[5]),
            "--shards 2: more shards than allowed cores (1 allowed core: 5); lower --shards, or \
             pass --no-pin to overprovision"
        );
        assert_eq!(
            error_text("3", None, true, &[0, 1]),
            "--shards 3: more shards than allowed cores (2 allowed cores: 0-1); lower --shards, \
             or pass --no-pin to overprovision"
        );
    }

    #[test]
    fn no_pin_accepts_any_count_unpinned() {
        let topology = resolve("5", None, false, &[0, 1], None).unwrap();
        assert_eq!(topology.shard_cores, vec![None; 5]);
        assert_eq!(topology.shard_count(), 5);
    }

    #[test]
    fn cpus_list_places_shards_on_listed_cores() {
        let topology = resolve("all", Some("1,3"), true, &[0, 1, 2, 3], Some(1)).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(1), Some(3)]);
        let topology = resolve("1", Some("2-3"), true, &[0, 1, 2, 3], None).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(2)]);
    }

    #[test]
    fn cpus_entry_outside_the_mask_is_rejected() {
        assert_eq!(
            error_text("all", Some("99"), true, &[0, 1]),
            "--cpus 99: CPU 99 is not in the allowed set 0-1 (affinity mask)"
        );
        assert_eq!(
            error_text("1", Some("0-2,7"), true, &[0, 1, 2, 4]),
            "--cpus 0-2,7: CPU 7 is not in the allowed set 0-2,4 (affinity mask)"
        );
    }

    #[test]
    fn cpus_with_no_pin_is_rejected() {
        assert_eq!(
            error_text("all", Some("0-1"), false, &[0, 1]),
            "--cpus 0-1 pins shards to CPUs; it cannot be combined with --no-pin"
        );
        assert_eq!(
            error_text("1", Some("5"), false, &[0, 1]),
            "--cpus 5 pins shards to CPUs; it cannot be combined with --no-pin",
            "the conflict is reported before the CPU check"
        );
    }

    #[test]
    fn a_hand_built_cpu_list_with_a_repeat_is_rejected() {
        let config = TopologyConfig {
            shards: ShardCountArg::All,
            cpus: Some(CpuList(vec![1, 1, 1])),
            pin: true,
        };
        assert_eq!(
            Topology::resolve_with(&config, &[0, 1], None)
                .unwrap_err()
                .to_string(),
            r#"invalid --cpus value "1,1,1": CPU 1 is listed more than once"#
        );
    }

    #[test]
    fn cpus_list_shorter_than_count_is_too_many_shards() {
        assert_eq!(
            error_text("3", Some("0,2"), true, &[0, 1, 2, 3]),
            "--shards 3: more shards than the cores --cpus lists (2 allowed cores: 0,2); lower \
             --shards, or widen or drop --cpus (--no-pin is refused with it)"
        );
        assert_eq!(
            error_text("2", Some("0"), true, &[0, 1, 2, 3]),
            "--shards 2: more shards than the cores --cpus lists (1 allowed core: 0); lower \
             --shards, or widen or drop --cpus (--no-pin is refused with it)"
        );
    }

    #[test]
    fn cpu_max_parsing() {
        assert_eq!(parse_cpu_max("max 100000\n"), None);
        assert_eq!(parse_cpu_max("200000 100000\n"), Some(2));
        assert_eq!(parse_cpu_max("150000 100000"), Some(2));
        assert_eq!(parse_cpu_max("5000 100000"), Some(1));
        assert_eq!(parse_cpu_max("50000"), Some(1));
        assert_eq!(parse_cpu_max("100000 0"), None);
        assert_eq!(parse_cpu_max(""), None);
    }

    #[test]
    fn cgroup_path_is_the_v2_line() {
        let text = "12:cpu,cpuacct:/old\n0::/system.slice/shardline.service\n";
        assert_eq!(
            cgroup_v2_path(text).as_deref(),
            Some("/system.slice/shardline.service")
        );
        assert_eq!(cgroup_v2_path("4:memory:/x\n"), None);
    }

    #[test]
    fn the_real_mask_is_readable_and_resolves() {
        let allowed = allowed_cpus().unwrap();
        assert!(!allowed.is_empty());
        assert!(allowed.windows(2).all(|pair| pair[0] < pair[1]));
        let topology = Topology::resolve(&config("1", None, true)).unwrap();
        assert_eq!(topology.shard_cores, vec![Some(allowed[0])]);
    }
}
