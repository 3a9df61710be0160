//! CPU of the whole host during a bench phase, less the load generator's own: the figure that
//! counts what the server costs wherever the kernel does it (issue 12 item 4). Under `--fsync
//! never` the page cache is written back by kernel threads (kworker flush threads) that are not
//! the server's, so msgs per server-CPU-second alone would let a configuration look cheaper by
//! moving work out of the process; this figure cannot be moved that way.
//!
//! Sources (proc(5)): the `cpu` line of `/proc/stat` (all CPUs, clock ticks of
//! `sysconf(_SC_CLK_TCK)`), and `/proc/self/stat` for the bench process itself. The embedded
//! server is a child process (`server.rs`) and an `--addr` server is another process, so the
//! bench process is the load generator and nothing else: its whole CPU (producer and consumer
//! threads, the sampler, progress drawing) is subtracted.
//!
//! Every other tenant of the host (other processes, a build, another VM's steal excluded) is
//! counted: the figure is a ceiling on what the server costs, never a floor.
//!
//! Must never write to `/proc`; it only reads.

use procfs::process::Process;
use procfs::{CpuTime, KernelStats, ProcError};

/// Busy clock ticks of all CPUs in one `/proc/stat` `cpu` line: user, nice, system, irq and
/// softirq. Left out: idle and iowait (the CPU did nothing), steal (the hypervisor ran someone
/// else: not this host's work), guest and guest_nice (already inside user and nice, proc(5)).
pub fn busy_ticks(cpu: &CpuTime) -> u64 {
    cpu.user + cpu.nice + cpu.system + cpu.irq.unwrap_or(0) + cpu.softirq.unwrap_or(0)
}

/// The host figure of one phase, in CPU-seconds (summed over CPUs, so up to CPUs x wall time).
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct HostCpu {
    /// Every CPU's busy time during the phase ([`busy_ticks`] delta).
    pub host_busy_cpu_seconds: f64,
    /// The bench process's own user + system time during the phase (the load generator).
    pub load_generator_cpu_seconds: f64,
    /// `host_busy_cpu_seconds - load_generator_cpu_seconds`, never below 0: the server, the
    /// kernel work it causes (writeback, softirqs), and whatever else ran on the host.
    pub host_cpu_seconds: f64,
}

impl HostCpu {
    /// The figure from tick counts at the phase's start and end. Counters that went backwards
    /// (they do not; a wrapped or reset counter would) give 0 for that delta, and a load
    /// generator above the host total (the two files are read a few µs apart) gives 0 host, so
    /// no figure is ever negative.
    pub fn from_ticks(
        busy_ticks: (u64, u64),
        load_generator_ticks: (u64, u64),
        ticks_per_second: u64,
    ) -> HostCpu {
        assert!(ticks_per_second > 0, "checked by clock_ticks_per_second");
        let busy_delta_ticks = busy_ticks.1.saturating_sub(busy_ticks.0);
        let own_delta_ticks = load_generator_ticks
            .1
            .saturating_sub(load_generator_ticks.0);
        let seconds = |ticks: u64| ticks as f64 / ticks_per_second as f64;
        HostCpu {
            host_busy_cpu_seconds: seconds(busy_delta_ticks),
            load_generator_cpu_seconds: seconds(own_delta_ticks),
            host_cpu_seconds: seconds(busy_delta_ticks.saturating_sub(own_delta_ticks)),
        }
    }

    /// Host CPU-seconds per 10^9 payload bytes; `None` when no payload moved.
    pub fn seconds_per_gb(&self, payload_bytes: u64) -> Option<f64> {
        (payload_bytes > 0).then(|| self.host_cpu_seconds / (payload_bytes as f64 / 1e9))
    }
}

#[derive(Debug, thiserror::Error)]
pub enum HostCpuError {
    /// `/proc/stat` or `/proc/self/stat` could not be read or parsed: `/proc` is not mounted or
    /// not readable here.
    #[error("cannot read {what}: {source}")]
    Proc {
        what: &'static str,
        source: ProcError,
    },
    /// The kernel reported 0 clock ticks per second (`AT_CLKTCK`); the times cannot be converted.
    #[error("the kernel reports {0} clock ticks per second")]
    ClockTicks(u64),
}

fn host_busy_ticks() -> Result<u64, HostCpuError> {
    use procfs::CurrentSI as _;
    let stats = KernelStats::current().map_err(|source| HostCpuError::Proc {
        what: "/proc/stat",
        source,
    })?;
    Ok(busy_ticks(&stats.total))
}

fn own_ticks(process: &Process) -> Result<u64, HostCpuError> {
    let stat = process.stat().map_err(|source| HostCpuError::Proc {
        what: "/proc/self/stat",
        source,
    })?;
    Ok(stat.utime + stat.stime)
}

/// Measures one phase: `start` before the workers are released, `finish` after they are joined.
#[derive(Debug)]
pub struct HostCpuSampler {
    process: Process,
    ticks_per_second: u64,
    busy_start_ticks: u64,
    own_start_ticks: u64,
}

impl HostCpuSampler {
    /// Reads the starting counters.
    ///
    /// # Errors
    /// `HostCpuError::Proc` when `/proc/stat` or `/proc/self/stat` cannot be read; `ClockTicks`.
    pub fn start() -> Result<HostCpuSampler, HostCpuError> {
        let ticks_per_second = procfs::ticks_per_second();
        if ticks_per_second == 0 {
            return Err(HostCpuError::ClockTicks(ticks_per_second));
        }
        let process = Process::myself().map_err(|source| HostCpuError::Proc {
            what: "/proc/self",
            source,
        })?;
        let busy_start_ticks = host_busy_ticks()?;
        let own_start_ticks = own_ticks(&process)?;
        Ok(HostCpuSampler {
            process,
            ticks_per_second,
            busy_start_ticks,
            own_start_ticks,
        })
    }

    /// Reads the ending counters (own first, then host; `start` reads host, then own), so the
    /// bench's own window lies inside the host's and what is subtracted is never more than the
    /// bench used while the host was counted: the figure stays a ceiling.
    ///
    /// # Errors
    /// As [`HostCpuSampler::start`].
    pub fn finish(self) -> Result<HostCpu, HostCpuError> {
        self.finish_after(|| ()).map(|(host, ())| host)
    }

    /// As [`HostCpuSampler::finish`], but runs `before_host_end` between reading the bench's own
    /// end counter and the host's: whatever it costs (a `syncfs(2)` that makes the kernel write
    /// back the phase's dirty pages, in the calling thread and in kworker threads) counts as
    /// host work, never as load-generator CPU. Returns the figure and what `before_host_end`
    /// returned.
    ///
    /// # Errors
    /// As [`HostCpuSampler::start`]; `before_host_end` has run unless reading the bench's own
    /// counter failed.
    pub fn finish_after<R>(
        self,
        before_host_end: impl FnOnce() -> R,
    ) -> Result<(HostCpu, R), HostCpuError> {
        let (own_end_ticks, returned, busy_end_ticks) = end_window(
            || own_ticks(&self.process),
            before_host_end,
            host_busy_ticks,
        )?;
        let host = HostCpu::from_ticks(
            (self.busy_start_ticks, busy_end_ticks),
            (self.own_start_ticks, own_end_ticks),
            self.ticks_per_second,
        );
        Ok((host, returned))
    }
}

/// The end of a host window, in the order that keeps the figure a ceiling: the bench's own
/// counter first, then `between`, then the host's. Returns (own end ticks, what `between`
/// returned, host end ticks).
fn end_window<R, E>(
    read_own_ticks: impl FnOnce() -> Result<u64, E>,
    between: impl FnOnce() -> R,
    read_busy_ticks: impl FnOnce() -> Result<u64, E>,
) -> Result<(u64, R, u64), E> {
    let own_end_ticks = read_own_ticks()?;
    let returned = between();
    let busy_end_ticks = read_busy_ticks()?;
    Ok((own_end_ticks, returned, busy_end_ticks))
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are the exact quotients computed"
)]
mod tests {
    use procfs::{ExplicitSystemInfo, FromReadSI as _};

    use super::*;

    /// A `/proc/stat` of a 2-CPU host (6.x kernel layout), with the `cpu` line's fields given.
    fn proc_stat(fields: [u64; 10]) -> String {
        let line = fields.map(|value| value.to_string()).join(" ");
        format!(
            "cpu  {line}\ncpu0 1 2 3 4 5 6 7 8 9 10\ncpu1 1 2 3 4 5 6 7 8 9 10\nintr 1 0 0\n\
             ctxt 4242\nbtime 1700000000\nprocesses 99\nprocs_running 2\nprocs_blocked 0\n\
             softirq 1 0 0 0 0 0 0 0 0 0 0\n"
        )
    }

    fn parse_busy(text: &str) -> u64 {
        let info = ExplicitSystemInfo {
            boot_time_secs: 1_700_000_000,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: true,
        };
        busy_ticks(
            &KernelStats::from_read(text.as_bytes(), &info)
                .unwrap()
                .total,
        )
    }

    #[test]
    fn busy_ticks_leave_out_idle_iowait_steal_and_guest() {
        // user nice system idle iowait irq softirq steal guest guest_nice
        let busy = parse_busy(&proc_stat([1000, 20, 300, 9000, 50, 4, 6, 70, 200, 10]));
        assert_eq!(busy, 1000 + 20 + 300 + 4 + 6);
    }

    #[test]
    fn two_snapshots_give_busy_seconds_less_the_load_generator() {
        let before = parse_busy(&proc_stat([1000, 20, 300, 9000, 50, 4, 6, 70, 0, 0]));
        // 250 user + 150 system + 10 softirq ticks later, and 500 idle and 30 iowait that count
        // for nothing.
        let after = parse_busy(&proc_stat([1250, 20, 450, 9500, 80, 4, 16, 70, 0, 0]));
        let host = HostCpu::from_ticks((before, after), (40, 160), 100);
        assert_eq!(host.host_busy_cpu_seconds, 4.1);
        assert_eq!(host.load_generator_cpu_seconds, 1.2);
        assert_eq!(host.host_cpu_seconds, 2.9);
        // 2.9 CPU-s over 2 * 10^9 payload bytes.
        assert_eq!(host.seconds_per_gb(2_000_000_000), Some(1.45));
        assert_eq!(host.seconds_per_gb(0), None);
    }

    #[test]
    fn the_figure_is_never_negative() {
        // The bench's own CPU above the host delta (read apart): 0, not negative.
        let host = HostCpu::from_ticks((100, 150), (0, 80), 100);
        assert_eq!(host.host_busy_cpu_seconds, 0.5);
        assert_eq!(host.host_cpu_seconds, 0.0);
        // Counters that went backwards give 0 deltas.
        let host = HostCpu::from_ticks((150, 100), (80, 0), 100);
        assert_eq!(host, HostCpu::default());
        assert_eq!(host.seconds_per_gb(1_000_000_000), Some(0.0));
    }

    #[test]
    fn a_malformed_cpu_line_is_an_error_not_zero() {
        let info = ExplicitSystemInfo {
            boot_time_secs: 0,
            ticks_per_second: 100,
            page_size: 4096,
            is_little_endian: true,
        };
        let text = "cpu  1 x 3 4\nctxt 1\nbtime 1\nprocesses 1\nprocs_running 1\nprocs_blocked 0\n";
        assert!(KernelStats::from_read(text.as_bytes(), &info).is_err());
    }

    #[test]
    fn work_between_the_own_and_host_end_reads_counts_as_host_not_load_generator() {
        use std::cell::Cell;
        // A fake host where the bench has used 100 of 300 busy ticks when the window ends, and
        // the flush between the two reads costs the bench's thread 40 ticks and kworkers 60.
        let own = Cell::new(100_u64);
        let busy = Cell::new(300_u64);
        let (own_end, flushed, busy_end) = end_window(
            || Ok::<u64, ()>(own.get()),
            || {
                own.set(own.get() + 40);
                busy.set(busy.get() + 40 + 60);
                "flushed"
            },
            || Ok(busy.get()),
        )
        .unwrap();
        assert_eq!((own_end, flushed, busy_end), (100, "flushed", 400));
        let host = HostCpu::from_ticks((0, busy_end), (0, own_end), 100);
        // All 100 flush ticks are host work; the bench's own 100 before the flush are not.
        assert_eq!(host.load_generator_cpu_seconds, 1.0);
        assert_eq!(host.host_cpu_seconds, 3.0);
    }

    #[test]
    fn a_failed_own_read_ends_the_window_before_the_flush() {
        let mut flushed = false;
        let result = end_window(|| Err("no /proc"), || flushed = true, || Ok(1));
        assert_eq!(result, Err("no /proc"));
        assert!(!flushed);
    }

    #[test]
    fn a_sampler_over_this_process_reads_both_files() {
        let sampler = HostCpuSampler::start().unwrap();
        let mut value = 0_u64;
        for index in 0..2_000_000_u64 {
            value = std::hint::black_box(value.wrapping_mul(31).wrapping_add(index));
        }
        let host = sampler.finish().unwrap();
        assert!(host.host_cpu_seconds >= 0.0, "{host:?}");
        assert!(
            host.host_cpu_seconds <= host.host_busy_cpu_seconds,
            "{host:?}"
        );
    }
}
