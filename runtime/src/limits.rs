//! Every bound of the runtime crate, with why it has its value. Holds constants only: never code
//! that runs.

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
/// Upper bound on shard count (`ShardId` is `u16`).
pub const SHARD_COUNT_MAX: usize = 1024;
/// Largest CPU id accepted in `--cpus` and read from the affinity mask: the kernel's default
/// `CONFIG_NR_CPUS` maximum is 8192 on x86-64, but no host we target has more than 4096 CPUs, and
/// a 4096-bit mask is 512 bytes on the stack.
pub const CPU_ID_MAX: usize = 4095;
/// Submission-queue entries of the ring that the startup probe creates and drops at once: the
/// smallest power of two that exercises the same setup path as a shard's ring (a few KiB of
/// locked memory).
pub const PROBE_RING_ENTRIES: u32 = 8;
/// Submission-queue entries of each shard's ring (compio's default, set explicitly so that
/// `probe::memlock_needed_bytes` and the rings agree): 104 KiB of locked memory with 4 KiB pages
/// (the ring header, 2048 CQEs and the 4 KiB SQ index rounded up to 40 KiB, plus 64 KiB of SQEs).
pub const SHARD_RING_ENTRIES: u32 = 1024;
/// Entries of the ring compio-driver creates once to probe opcodes (`is_op_supported`).
pub const COMPIO_PROBE_RING_ENTRIES: u32 = 2;
/// Capacity of one stop (and ready-barrier release) lane: the signal is a level stored in an
/// atomic, the lane only wakes the waiting task, so one queued wakeup is enough.
pub const STOP_LANE_CAPACITY: usize = 1;

const _: () = assert!(INBOX_CAPACITY_DEFAULT >= 1 && INBOX_CAPACITY_DEFAULT <= INBOX_CAPACITY_MAX);
const _: () = assert!(PUMP_BATCH_MAX >= 1);
const _: () = assert!(TICK_MS >= 1);
const _: () = assert!(SHARD_COUNT_MAX >= 1 && SHARD_COUNT_MAX <= u16::MAX as usize + 1);
const _: () = assert!(STOP_LANE_CAPACITY >= 1);
const _: () = assert!(SHARD_RING_ENTRIES.is_power_of_two() && PROBE_RING_ENTRIES.is_power_of_two());
