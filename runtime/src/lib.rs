//! Thread-per-core shard runtime: topology (which cores), the `io_uring` probe, the mesh of bounded
//! crossfire inboxes, and the launcher that runs one pinned compio runtime per shard thread.
//!
//! This crate knows no domain type: the mesh is generic over the frame type. It never blocks a shard
//! thread.

pub mod launcher;
pub mod limits;
pub mod mesh;
pub mod probe;
pub mod topology;

pub use launcher::{
    LaunchConfig, LaunchError, ReadyGate, ShardContext, ShardFuture, ShardResult, ShardSet,
    StopHandle, block_on_with_idle_poll,
};
pub use mesh::{Envelope, MeshEndpoint, MeshSendError, MeshStats, Pump, PumpEvent, ShardId, mesh};
pub use probe::{IoDriver, IoUringUnavailable, probe_io_uring};
pub use topology::{
    CpuList, ShardCountArg, Topology, TopologyConfig, TopologyError, allowed_cpus,
    cgroup_cpu_quota_count,
};
