//! Every bound of the runtime crate, with why it has its value.

/// Default capacity of one shard inbox (frames). DESIGN section 4.
pub const INBOX_CAPACITY_DEFAULT: usize = 1024;
/// Largest inbox capacity accepted by configuration (frames): 1<<20 frames of a few words each
/// keeps one inbox well under 100 MiB.
pub const INBOX_CAPACITY_MAX: usize = 1 << 20;
/// Frames drained from an inbox in one pump turn before yielding, to amortize wakeups without
/// starving the tick.
pub const PUMP_BATCH_MAX: usize = 256;
/// Period of the shard tick that drives timers (VSR timeouts, fsync interval). DESIGN section 4.
pub const TICK_MS: u64 = 10;
/// Upper bound on shard count (ShardId is u16).
pub const SHARD_COUNT_MAX: usize = 1024;
