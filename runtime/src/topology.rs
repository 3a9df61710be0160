//! Which cores the shards run on: the allowed set (affinity mask, cgroup quota), `--cpus` lists,
//! `--shards N|all`, `--no-pin`. Never spawns threads.

use std::str::FromStr;

/// A parsed CPU list such as `0-3,8`: sorted, deduplicated CPU ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CpuList(pub Vec<usize>);

impl FromStr for CpuList {
    type Err = TopologyError;
    /// # Errors
    /// `TopologyError::CpuListSyntax` naming the value and the rule (e.g. `3-1`: range start above end).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!("{s}")
    }
}

/// `--shards N|all`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardCountArg {
    /// Exactly N shards (N >= 1).
    Count(u16),
    /// One shard per allowed core (or per `--cpus` entry).
    All,
}

impl FromStr for ShardCountArg {
    type Err = TopologyError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!("{s}")
    }
}

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct TopologyConfig {
    pub shards: ShardCountArg,
    pub cpus: Option<CpuList>,
    /// false with `--no-pin`.
    pub pin: bool,
}

/// The resolved placement: one entry per shard, `Some(cpu)` when pinned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Topology {
    pub shard_cores: Vec<Option<usize>>,
    /// The process's allowed CPUs (sched_getaffinity), for logs and error messages.
    pub allowed_cpus: Vec<usize>,
}

impl Topology {
    /// Resolves the config against the process affinity mask and cgroup quota.
    ///
    /// # Errors
    /// Each variant names the flag, the value and the rule (`--shards 0`, more shards than allowed
    /// cores without `--no-pin`, a `--cpus` entry outside the allowed set).
    pub fn resolve(config: &TopologyConfig) -> Result<Topology, TopologyError> {
        todo!("{config:?}")
    }

    pub fn shard_count(&self) -> u16 {
        self.shard_cores.len() as u16
    }
}

/// Why a topology flag was rejected. Display names key, value and rule.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    #[error("invalid --cpus value {value:?}: {rule}")]
    CpuListSyntax { value: String, rule: String },
    #[error("invalid --shards value {value:?}: {rule}")]
    ShardCount { value: String, rule: String },
    #[error("--cpus {value}: CPU {cpu} is not in the allowed set {allowed} (affinity mask)")]
    CpuNotAllowed {
        value: String,
        cpu: usize,
        allowed: String,
    },
    #[error(
        "--shards {requested}: more shards than allowed cores ({allowed_count}: {allowed}); pass --no-pin to overprovision"
    )]
    TooManyShards {
        requested: usize,
        allowed_count: usize,
        allowed: String,
    },
    #[error("cannot read the process affinity mask: {0}")]
    Affinity(std::io::Error),
}
