//! Every threshold and sample count of `shardline doctor`, with why it has that value.
//!
//! Must never hold a value without its reason.

use std::time::Duration;

/// Partition count the open-file check plans for when `--partitions` is not given: a thousand
/// partitions is a mid-sized deployment (tens of topics of tens of partitions), and its open-file
/// need (`shards::resources::open_file_limit_for_partitions`) is above the common soft limit of
/// 1024, which is what the check is there to catch.
pub const PARTITIONS_DEFAULT: u64 = 1000;

/// Largest `--partitions`: 2^30. `fs.nr_open` cannot go above `INT_MAX` rounded down
/// (`sysctl_nr_open_max`, fs/file.c), about 2^31, and a partition holds at least 2 descriptors
/// (`shards::limits::FDS_PER_PARTITION`), so no host holds more partitions than this. It also
/// keeps the open-file arithmetic of the check far from `u64` overflow.
pub const PARTITIONS_MAX: u64 = 1 << 30;
const _: () = assert!(PARTITIONS_DEFAULT <= PARTITIONS_MAX);
const _: () = assert!(PARTITIONS_MAX * shards::limits::FDS_PER_PARTITION >= 1 << 31);

/// 4 KiB write + fdatasync samples the latency check takes. Sixteen gives a stable median on a
/// quiet disk in well under a second (16 x ~1 ms on an SSD; a few hundred ms on a slow disk).
pub const FSYNC_SAMPLE_COUNT: usize = 16;

/// Bytes of each latency sample: one 4 KiB page, the unit the kernel and disks write, and what a
/// small acknowledged append costs under `--fsync always`.
pub const FSYNC_WRITE_BYTES: usize = 4096;

/// Median write + fdatasync above which the check warns: every acknowledged append under
/// `--fsync always` waits at least this long, so throughput per partition is bounded by batching
/// alone. A local SSD or NVMe answers in well under 1 ms, network block storage in 1-5 ms.
pub const FSYNC_P50_WARN: Duration = Duration::from_millis(10);

/// Free bytes below which the data directory's filesystem warns: one default log segment
/// (`storage::limits::SEGMENT_SIZE_MAX_DEFAULT`, 1 GiB); below it a single busy partition can fill
/// the disk and appends fail with `StorageFull`.
pub const FREE_SPACE_WARN_BYTES: u64 = storage::limits::SEGMENT_SIZE_MAX_DEFAULT;

/// Alignment and length of the `O_DIRECT` probe write: 4096 bytes satisfies the logical block
/// size of every common device (512 or 4096), which `O_DIRECT` requires of buffer, offset and
/// length.
pub const DIRECT_IO_ALIGN_BYTES: usize = 4096;

/// `CAP_SYS_ADMIN`'s bit in `CapEff` (include/uapi/linux/capability.h): it lets a process create
/// rings under `kernel.io_uring_disabled=1` whatever its groups.
pub const CAP_SYS_ADMIN_BIT: u32 = 21;
