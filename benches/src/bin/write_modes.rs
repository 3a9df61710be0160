//! Write modes of a partition log, measured side by side in one run (issue 12 item 3): what a GB
//! written costs in CPU, counting the kernel's writeback wherever it runs.
//!
//! Each measurement writes `--gib` GiB to a fresh file under `--dir`, one group of entries at a
//! time at the file's end through compio's io_uring, as the log writer does (a group is
//! `--group-kib` of entries of `--entry-bytes`, written by one vectored `pwritev`), in one of:
//!
//! * `buffered`: buffered `pwritev`, as the log does today;
//! * `writeback`: `buffered`, plus after every `--writeback-mib` written, writeback of that range
//!   started early (`sync_file_range(SYNC_FILE_RANGE_WRITE)`), and the range before it waited for
//!   (`WAIT_BEFORE | WRITE | WAIT_AFTER`) so dirty pages stay within about three ranges. Both
//!   calls run on compio's blocking pool (`spawn_blocking`), off the writer's path: io_uring's
//!   `IORING_OP_SYNC_FILE_RANGE` is always punted to an io-wq worker anyway (the kernel marks it
//!   `REQ_F_FORCE_ASYNC`), so a custom op would buy the same thread hop for an `unsafe` `OpCode`
//!   implementation per driver (io_uring and the polling fallback). At most one such job is in
//!   flight; the writer waits for it only when the next range is due before it finished (the disk
//!   is slower than the writes);
//! * `direct`: `O_DIRECT` through one 4 KiB-aligned staging buffer: the group is copied in after
//!   the carried-over partial last block, whole blocks are written (the partial one padded with
//!   zeros, then rewritten by the next write), and the file is cut to its exact length at the end.
//!
//! each under `never` (no fsync while writing) and `always` (`fdatasync` after each group, group
//! commit with one writer). Rounds alternate the modes, rotating their order each round.
//!
//! Per measurement: GB/s of the write loop; process CPU-s per GB (`getrusage(RUSAGE_SELF)`: every
//! thread of this process, io-wq workers and the blocking pool included); process + kernel CPU-s
//! per GB (adds every kernel thread's `/proc/PID/stat` delta: kworker writeback, jbd2,
//! ksoftirqd; and all CPUs' irq + softirq time from `/proc/stat`: block completions); host
//! CPU-s per GB (`/proc/stat`: all CPUs' user + nice + system + irq + softirq). The window opens
//! after a `sync(2)` of everything older and closes after an `fdatasync` of the file completes,
//! so writeback that `never` defers is counted in the measurement that caused it (the fdatasync
//! does it in the caller's context, or waits for the flusher threads that started it). The host
//! figure counts every other tenant too (on a host whose CPUs other tenants keep busy it is about
//! CPUs x window, whatever was written); the process + kernel figure does not count other
//! processes, only kernel threads and interrupts working for them as well.
//!
//! ```sh
//! cargo build --release -p benches --bin write_modes
//! target/release/write_modes --gib 2 --rounds 3 --dir /work/write-modes
//! ```
//!
//! Must never leave its files behind: each is deleted after its measurement, and the default
//! directory is a temporary one under the current directory (not /tmp, which may be tmpfs).

use std::collections::HashMap;
use std::fmt::Write as _;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use benches::median;
use clap::Parser;
use compio::BufResult;
use compio::buf::{IntoInner as _, IoBuf as _};
use compio::fs::OpenOptions;
use compio::io::AsyncWriteAtExt as _;
use procfs::process::all_processes;
use procfs::{CurrentSI as _, KernelStats};

/// Direct I/O alignment of file offsets, lengths and buffer addresses (the logical block size of
/// every disk we run on is at most 4 KiB).
const DIRECT_ALIGNMENT_BYTES: usize = 4096;
/// `PF_KTHREAD` in a `/proc/PID/stat` `flags` field (include/linux/sched.h).
const PF_KTHREAD: u32 = 0x0020_0000;
const GIB: f64 = 1024.0 * 1024.0 * 1024.0;

#[derive(Debug, Parser)]
#[command(about = "CPU per GB of buffered, early-writeback and O_DIRECT log writes")]
struct Args {
    /// GiB written per measurement.
    #[arg(long, default_value_t = 2.0)]
    gib: f64,
    /// Directory for the files (default: a temporary directory under the current one).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Measurements of each mode and policy.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// `writeback`: start writeback after every this many MiB.
    #[arg(long, default_value_t = 8)]
    writeback_mib: u64,
    /// Bytes per entry (a 32-byte header and its payload; 64 KiB + 32 keeps groups unaligned).
    #[arg(long, default_value_t = 65_568)]
    entry_bytes: usize,
    /// KiB per group (whole entries, at least this much).
    #[arg(long, default_value_t = 1024)]
    group_kib: usize,
    /// Modes to measure, comma-separated.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "buffered,writeback,direct"
    )]
    modes: Vec<Mode>,
    /// Policies to measure, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "never,always")]
    policies: Vec<Policy>,
    /// After each measurement (outside its window), read the file back and check its length and
    /// every byte (the groups back to back): a check of the modes, not a measurement.
    #[arg(long)]
    verify: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
enum Mode {
    Buffered,
    Writeback,
    Direct,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, clap::ValueEnum)]
enum Policy {
    Never,
    Always,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Buffered => "buffered",
            Mode::Writeback => "writeback",
            Mode::Direct => "direct",
        }
    }
}

impl Policy {
    fn name(self) -> &'static str {
        match self {
            Policy::Never => "never",
            Policy::Always => "always",
        }
    }
}

/// The counters a window is the difference of.
#[derive(Debug, Clone)]
struct Counters {
    at: Instant,
    process_us: u64,
    host_busy_ticks: u64,
    /// irq + softirq of all CPUs (`/proc/stat`): block completions, whoever they interrupted.
    host_interrupt_ticks: u64,
    kthread_ticks: HashMap<(i32, u64), u64>,
}

fn process_cpu_us() -> anyhow::Result<u64> {
    let mut usage = std::mem::MaybeUninit::<libc::rusage>::zeroed();
    // SAFETY: getrusage writes only the rusage passed to it.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_SELF, usage.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error()).context("getrusage");
    }
    // SAFETY: getrusage returned 0, so it filled the struct (it was zeroed before anyway).
    let usage = unsafe { usage.assume_init() };
    let micros = |time: libc::timeval| time.tv_sec as u64 * 1_000_000 + time.tv_usec as u64;
    Ok(micros(usage.ru_utime) + micros(usage.ru_stime))
}

/// (busy, irq + softirq) ticks of all CPUs.
fn host_ticks() -> anyhow::Result<(u64, u64)> {
    let cpu = KernelStats::current().context("/proc/stat")?.total;
    // Guest time is already inside user and nice; steal is the hypervisor's, idle and iowait
    // are no work.
    let interrupt_ticks = cpu.irq.unwrap_or(0) + cpu.softirq.unwrap_or(0);
    Ok((
        cpu.user + cpu.nice + cpu.system + interrupt_ticks,
        interrupt_ticks,
    ))
}

/// Every kernel thread's user + system ticks, by (pid, start time). Threads that exit between
/// two reads are skipped.
fn kthread_ticks() -> anyhow::Result<HashMap<(i32, u64), u64>> {
    let mut ticks = HashMap::new();
    for process in all_processes().context("/proc")? {
        let Ok(stat) = process.and_then(|process| process.stat()) else {
            continue;
        };
        if stat.flags & PF_KTHREAD != 0 {
            ticks.insert((stat.pid, stat.starttime), stat.utime + stat.stime);
        }
    }
    Ok(ticks)
}

fn read_counters() -> anyhow::Result<Counters> {
    let kthread_ticks = kthread_ticks()?;
    let (host_busy_ticks, host_interrupt_ticks) = host_ticks()?;
    Ok(Counters {
        at: Instant::now(),
        process_us: process_cpu_us()?,
        host_busy_ticks,
        host_interrupt_ticks,
        kthread_ticks,
    })
}

/// One measurement's figures.
#[derive(Debug, Clone)]
struct Sample {
    mode: Mode,
    policy: Policy,
    round: u32,
    bytes: u64,
    write_seconds: f64,
    window_seconds: f64,
    process_cpu_seconds: f64,
    /// Kernel threads' CPU plus all CPUs' irq and softirq time.
    kernel_cpu_seconds: f64,
    host_cpu_seconds: f64,
}

impl Sample {
    fn gb(&self) -> f64 {
        self.bytes as f64 / 1e9
    }
    fn gb_per_second(&self) -> f64 {
        self.gb() / self.write_seconds
    }
    fn process_per_gb(&self) -> f64 {
        self.process_cpu_seconds / self.gb()
    }
    fn kernel_per_gb(&self) -> f64 {
        (self.process_cpu_seconds + self.kernel_cpu_seconds) / self.gb()
    }
    fn host_per_gb(&self) -> f64 {
        self.host_cpu_seconds / self.gb()
    }
}

fn window(start: &Counters, end: &Counters, ticks_per_second: u64) -> (f64, f64, f64, f64) {
    let tick_seconds = |ticks: u64| ticks as f64 / ticks_per_second as f64;
    let kthread_delta: u64 = end
        .kthread_ticks
        .iter()
        .map(|(key, value)| {
            value.saturating_sub(start.kthread_ticks.get(key).copied().unwrap_or(0))
        })
        .sum();
    (
        end.at.duration_since(start.at).as_secs_f64(),
        end.process_us.saturating_sub(start.process_us) as f64 / 1e6,
        tick_seconds(
            kthread_delta
                + end
                    .host_interrupt_ticks
                    .saturating_sub(start.host_interrupt_ticks),
        ),
        tick_seconds(end.host_busy_ticks.saturating_sub(start.host_busy_ticks)),
    )
}

/// The entries of one group: `group_bytes_min` or a little more, of whole entries, filled with
/// bytes that do not compress or dedupe to nothing.
fn make_group(entry_bytes: usize, group_bytes_min: usize) -> Vec<Vec<u8>> {
    let count = group_bytes_min.div_ceil(entry_bytes).max(1);
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    (0..count)
        .map(|_| {
            (0..entry_bytes)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect()
        })
        .collect()
}

/// `sync_file_range(2)` of `length` bytes at `offset`.
fn sync_file_range(
    file: &std::fs::File,
    offset: u64,
    length: u64,
    flags: u32,
) -> std::io::Result<()> {
    // SAFETY: a plain syscall on a descriptor `file` keeps open.
    let rc =
        unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, length as i64, flags) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Early writeback of `writeback` mode: at most one job in flight on the blocking pool.
struct EarlyWriteback {
    file: Arc<std::fs::File>,
    range_bytes: u64,
    /// End of the last range whose writeback was started.
    started_end: u64,
    /// The range started last, which the next job waits for.
    previous: Option<(u64, u64)>,
    job: Option<compio::runtime::JoinHandle<std::io::Result<()>>>,
}

impl EarlyWriteback {
    /// Called after each write with the file's written end.
    async fn written_to(&mut self, end: u64) -> anyhow::Result<()> {
        if end - self.started_end < self.range_bytes {
            return Ok(());
        }
        self.wait().await?;
        let range = (self.started_end, end - self.started_end);
        let previous = self.previous.replace(range);
        self.started_end = end;
        let file = Arc::clone(&self.file);
        self.job = Some(compio::runtime::spawn_blocking(move || {
            sync_file_range(&file, range.0, range.1, libc::SYNC_FILE_RANGE_WRITE)?;
            if let Some((offset, length)) = previous {
                sync_file_range(
                    &file,
                    offset,
                    length,
                    libc::SYNC_FILE_RANGE_WAIT_BEFORE
                        | libc::SYNC_FILE_RANGE_WRITE
                        | libc::SYNC_FILE_RANGE_WAIT_AFTER,
                )?;
            }
            Ok(())
        }));
        Ok(())
    }

    async fn wait(&mut self) -> anyhow::Result<()> {
        if let Some(job) = self.job.take() {
            job.await
                .map_err(|_| anyhow::anyhow!("sync_file_range job panicked"))?
                .context("sync_file_range")?;
        }
        Ok(())
    }
}

/// Writes `group_count` groups to a new file at `path`; returns the write loop's duration (the
/// final `fdatasync` excluded).
async fn write_file(
    mode: Mode,
    policy: Policy,
    path: &Path,
    group: &mut Vec<Vec<u8>>,
    group_count: u64,
    writeback_bytes: u64,
) -> anyhow::Result<Duration> {
    let mut options = OpenOptions::new();
    options.read(true).write(true).create_new(true);
    if mode == Mode::Direct {
        options.custom_flags(libc::O_DIRECT);
    }
    let file = options
        .open(path)
        .await
        .with_context(|| format!("create {}", path.display()))?;
    let mut early = (mode == Mode::Writeback)
        .then(|| -> anyhow::Result<EarlyWriteback> {
            Ok(EarlyWriteback {
                file: Arc::new(std::fs::OpenOptions::new().write(true).open(path)?),
                range_bytes: writeback_bytes,
                started_end: 0,
                previous: None,
                job: None,
            })
        })
        .transpose()?;
    let group_bytes: usize = group.iter().map(Vec::len).sum();
    // Direct: the staging buffer, its aligned start, the carried bytes and the aligned position.
    let mut staging = vec![0_u8; group_bytes + 3 * DIRECT_ALIGNMENT_BYTES];
    let aligned = staging.as_ptr().align_offset(DIRECT_ALIGNMENT_BYTES);
    let mut carry_bytes = 0_usize;
    let mut block_position = 0_u64;
    let mut position = 0_u64;
    let started = Instant::now();
    for _ in 0..group_count {
        if mode == Mode::Direct {
            let mut fill = aligned + carry_bytes;
            for entry in group.iter() {
                staging[fill..fill + entry.len()].copy_from_slice(entry);
                fill += entry.len();
            }
            let filled_bytes = fill - aligned;
            let write_bytes = filled_bytes.next_multiple_of(DIRECT_ALIGNMENT_BYTES);
            staging[fill..aligned + write_bytes].fill(0);
            let mut writer = &file;
            let BufResult(result, slice) = writer
                .write_all_at(
                    staging.slice(aligned..aligned + write_bytes),
                    block_position,
                )
                .await;
            staging = slice.into_inner();
            result.context("O_DIRECT write")?;
            let whole_bytes = filled_bytes / DIRECT_ALIGNMENT_BYTES * DIRECT_ALIGNMENT_BYTES;
            staging.copy_within(aligned + whole_bytes..aligned + filled_bytes, aligned);
            carry_bytes = filled_bytes - whole_bytes;
            block_position += whole_bytes as u64;
            position = block_position + carry_bytes as u64;
        } else {
            let mut writer = &file;
            let BufResult(result, buffers) = writer
                .write_vectored_all_at(std::mem::take(group), position)
                .await;
            *group = buffers;
            result.context("pwritev")?;
            position += group_bytes as u64;
        }
        if policy == Policy::Always {
            file.sync_data().await.context("fdatasync")?;
        }
        if let Some(early) = early.as_mut() {
            early.written_to(position).await?;
        }
    }
    let write_elapsed = started.elapsed();
    if let Some(early) = early.as_mut() {
        early.wait().await?;
    }
    if mode == Mode::Direct {
        file.set_len(position).await.context("ftruncate")?;
    }
    file.sync_data().await.context("final fdatasync")?;
    file.close().await.context("close")?;
    Ok(write_elapsed)
}

/// Checks that `path` holds exactly `group_count` copies of `group`'s entries back to back.
fn verify_file(path: &Path, group: &[Vec<u8>], group_count: u64) -> anyhow::Result<()> {
    use std::io::Read as _;
    let expected: Vec<u8> = group.concat();
    let mut file = std::fs::File::open(path).with_context(|| format!("open {}", path.display()))?;
    let length_bytes = file.metadata()?.len();
    if length_bytes != group_count * expected.len() as u64 {
        bail!(
            "{} is {length_bytes} bytes, not {}",
            path.display(),
            group_count * expected.len() as u64
        );
    }
    let mut actual = vec![0_u8; expected.len()];
    for group_index in 0..group_count {
        file.read_exact(&mut actual)?;
        if actual != expected {
            bail!("{}: group {group_index} differs", path.display());
        }
    }
    Ok(())
}

fn render(samples: &[Sample], modes: &[Mode], policies: &[Policy]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<10} {:<7} {:>5} {:>7} {:>8} {:>8} {:>8} {:>11} {:>13} {:>9}",
        "mode",
        "policy",
        "round",
        "GB",
        "write-s",
        "window-s",
        "GB/s",
        "proc-s/GB",
        "proc+kern-s/GB",
        "host-s/GB"
    );
    for sample in samples {
        let _ = writeln!(
            out,
            "{:<10} {:<7} {:>5} {:>7.3} {:>8.2} {:>8.2} {:>8.3} {:>11.3} {:>13.3} {:>9.3}",
            sample.mode.name(),
            sample.policy.name(),
            sample.round,
            sample.gb(),
            sample.write_seconds,
            sample.window_seconds,
            sample.gb_per_second(),
            sample.process_per_gb(),
            sample.kernel_per_gb(),
            sample.host_per_gb(),
        );
    }
    let _ = writeln!(
        out,
        "\nmedians (ratio to buffered of the same policy)\n{:<10} {:<7} {:>15} {:>15} {:>15} {:>15}",
        "mode", "policy", "GB/s", "proc-s/GB", "proc+kern-s/GB", "host-s/GB"
    );
    for policy in policies {
        let medians_of = |mode: Mode| {
            let of = |figure: fn(&Sample) -> f64| {
                let mut values: Vec<f64> = samples
                    .iter()
                    .filter(|sample| sample.mode == mode && sample.policy == *policy)
                    .map(figure)
                    .collect();
                (!values.is_empty()).then(|| median(&mut values))
            };
            [
                of(Sample::gb_per_second),
                of(Sample::process_per_gb),
                of(Sample::kernel_per_gb),
                of(Sample::host_per_gb),
            ]
        };
        let base = medians_of(Mode::Buffered);
        for mode in modes {
            let figures = medians_of(*mode);
            let mut line = format!("{:<10} {:<7}", mode.name(), policy.name());
            for (value, base_value) in figures.iter().zip(base) {
                let cell = match (value, base_value) {
                    (Some(value), Some(base_value)) if base_value > 0.0 => {
                        format!("{value:.3} ({:.2}x)", value / base_value)
                    }
                    (Some(value), _) => format!("{value:.3}"),
                    (None, _) => "n/a".to_string(),
                };
                let _ = write!(line, " {cell:>15}");
            }
            let _ = writeln!(out, "{line}");
        }
    }
    out
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.gib.is_nan()
        || args.gib <= 0.0
        || args.rounds == 0
        || args.entry_bytes == 0
        || args.writeback_mib == 0
    {
        bail!("--gib, --rounds, --entry-bytes and --writeback-mib must be positive");
    }
    let ticks_per_second = procfs::ticks_per_second();
    if ticks_per_second == 0 {
        bail!("the kernel reports 0 clock ticks per second");
    }
    let temporary;
    let dir = if let Some(dir) = &args.dir {
        std::fs::create_dir_all(dir).with_context(|| format!("create {}", dir.display()))?;
        dir.clone()
    } else {
        temporary = tempfile::Builder::new()
            .prefix("write-modes-")
            .tempdir_in(".")
            .context("create a temporary directory under the current one")?;
        temporary.path().to_path_buf()
    };
    let mut group = make_group(args.entry_bytes, args.group_kib * 1024);
    let group_bytes: usize = group.iter().map(Vec::len).sum();
    let group_count = ((args.gib * GIB) / group_bytes as f64).ceil() as u64;
    let writeback_bytes = args.writeback_mib * 1024 * 1024;
    println!(
        "{} groups of {} entries x {} bytes ({group_bytes} bytes) per measurement in {}; \
         writeback every {} MiB",
        group_count,
        group.len(),
        args.entry_bytes,
        dir.display(),
        args.writeback_mib
    );
    let runtime = compio::runtime::Runtime::new().context("compio runtime")?;
    let mut samples = Vec::new();
    for round in 0..args.rounds {
        for policy in &args.policies {
            for index in 0..args.modes.len() {
                let mode = args.modes[(index + round as usize) % args.modes.len()];
                let path = dir.join(format!(
                    "write-modes-{}-{}-{round}.dat",
                    mode.name(),
                    policy.name()
                ));
                // SAFETY: sync(2) takes no arguments and cannot fail.
                unsafe { libc::sync() };
                let start = read_counters()?;
                let write_elapsed = runtime.block_on(write_file(
                    mode,
                    *policy,
                    &path,
                    &mut group,
                    group_count,
                    writeback_bytes,
                ))?;
                let end = read_counters()?;
                if args.verify {
                    verify_file(&path, &group, group_count)?;
                }
                std::fs::remove_file(&path)
                    .with_context(|| format!("remove {}", path.display()))?;
                let (window_seconds, process_cpu_seconds, kernel_cpu_seconds, host_cpu_seconds) =
                    window(&start, &end, ticks_per_second);
                let sample = Sample {
                    mode,
                    policy: *policy,
                    round,
                    bytes: group_count * group_bytes as u64,
                    write_seconds: write_elapsed.as_secs_f64(),
                    window_seconds,
                    process_cpu_seconds,
                    kernel_cpu_seconds,
                    host_cpu_seconds,
                };
                eprintln!(
                    "round {round} {} {}: {:.3} GB/s, host {:.3} CPU-s/GB",
                    mode.name(),
                    policy.name(),
                    sample.gb_per_second(),
                    sample.host_per_gb()
                );
                samples.push(sample);
            }
        }
    }
    print!("{}", render(&samples, &args.modes, &args.policies));
    Ok(())
}
