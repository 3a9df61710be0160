//! CPU accounting of the server process from `/proc`: shard threads, `io_uring` kernel workers, and
//! the whole process, per bench phase (`CpuSampler`) or at one instant (`process_cpu_snapshot`,
//! which the metrics endpoint reports).
//!
//! Sources (proc(5)), read and parsed by the `procfs` crate: `/proc/PID/task/TID/stat` for each
//! thread and `/proc/PID/stat` for the process, whose `utime` and `stime` are in clock ticks
//! (`sysconf(_SC_CLK_TCK)`) and whose `starttime` tells a reused tid from the thread that had it.
//! The thread name is the stat line's `comm` field, the same `task->comm` that
//! `/proc/PID/task/TID/comm` shows. Threads named `shard-N` are shards; `iou-wrk-*` (io-wq workers)
//! and `iou-sqp-*` (SQPOLL threads) are the `io_uring` kernel workers that do the shards' blocking
//! I/O (buffered writes, fsync) and belong to the server process.
//!
//! io-wq workers come and go within a phase, so the sampler reads every thread every
//! ~100 ms and keeps the last value seen per thread. The process total also counts threads that
//! have exited; whatever the process spent beyond the sum of the live threads' deltas is CPU of
//! threads that exited (or were born and died) between samples, and in the server those are
//! io-wq workers, so it is attributed to io workers.
//!
//! Must never write to `/proc` or signal the process; it only reads.

use std::collections::{BTreeMap, HashMap};

use procfs::ProcError;
use procfs::process::{Process, Stat};

/// What a server thread does, from its name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ThreadKind {
    Shard(u16),
    IoWorker,
    Other,
}

pub fn classify_thread(comm: &str) -> ThreadKind {
    if let Some(id) = comm.strip_prefix("shard-")
        && let Ok(shard_id) = id.parse::<u16>()
    {
        return ThreadKind::Shard(shard_id);
    }
    if comm.starts_with("iou-wrk-") || comm.starts_with("iou-sqp-") {
        return ThreadKind::IoWorker;
    }
    ThreadKind::Other
}

/// A thread across samples: a tid can be reused, the (tid, start time) pair cannot.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ThreadKey {
    pub tid: u32,
    pub start_time_ticks: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ThreadSample {
    pub kind: ThreadKind,
    pub cpu_ticks: u64,
}

/// The key and sample of one thread from its `/proc/PID/task/TID/stat` (whose `pid` field is the
/// tid): user + system ticks, kind from the name.
fn thread_entry(stat: &Stat) -> (ThreadKey, ThreadSample) {
    (
        ThreadKey {
            tid: stat.pid.unsigned_abs(),
            start_time_ticks: stat.starttime,
        },
        ThreadSample {
            kind: classify_thread(&stat.comm),
            cpu_ticks: stat.utime + stat.stime,
        },
    )
}

/// CPU of one phase in clock ticks, by kind.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct CpuTicks {
    pub process_ticks: u64,
    pub shard_ticks: BTreeMap<u16, u64>,
    /// Deltas of io workers seen alive by a sample.
    pub io_worker_live_ticks: u64,
    /// Process delta not explained by any thread seen alive (exited threads: io-wq workers).
    pub unobserved_ticks: u64,
    pub other_ticks: u64,
}

impl CpuTicks {
    pub fn shard_total_ticks(&self) -> u64 {
        self.shard_ticks.values().sum()
    }
    pub fn io_worker_ticks(&self) -> u64 {
        self.io_worker_live_ticks + self.unobserved_ticks
    }
}

/// Splits the process delta of a phase over thread kinds. `baseline` holds every thread at the
/// phase start, `last_seen` the last sample of every thread seen during the phase (a thread born
/// during the phase started at 0 ticks). The process delta never goes below the sum of thread
/// deltas in the result: any excess of the threads (sampling skew) is clamped to 0 unobserved.
pub fn attribute_cpu<S: std::hash::BuildHasher>(
    baseline: &HashMap<ThreadKey, ThreadSample, S>,
    last_seen: &HashMap<ThreadKey, ThreadSample, S>,
    process_delta_ticks: u64,
) -> CpuTicks {
    let mut ticks = CpuTicks {
        process_ticks: process_delta_ticks,
        ..CpuTicks::default()
    };
    let mut thread_sum_ticks = 0;
    for (key, last) in last_seen {
        let base_ticks = baseline.get(key).map_or(0, |sample| sample.cpu_ticks);
        let delta_ticks = last.cpu_ticks.saturating_sub(base_ticks);
        thread_sum_ticks += delta_ticks;
        match last.kind {
            ThreadKind::Shard(shard_id) => {
                *ticks.shard_ticks.entry(shard_id).or_default() += delta_ticks;
            }
            ThreadKind::IoWorker => ticks.io_worker_live_ticks += delta_ticks,
            ThreadKind::Other => ticks.other_ticks += delta_ticks,
        }
    }
    ticks.unobserved_ticks = process_delta_ticks.saturating_sub(thread_sum_ticks);
    ticks
}

/// CPU of one phase in seconds.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PhaseCpu {
    /// Sum over `shard-N` threads.
    pub shard_cpu_seconds: f64,
    /// `io_uring` kernel workers, including CPU of threads that exited between samples.
    pub io_worker_cpu_seconds: f64,
    /// The whole server process (`/proc/PID/stat`).
    pub server_cpu_seconds: f64,
    /// Threads that are neither shards nor io workers (main thread, logging).
    pub other_cpu_seconds: f64,
    pub per_shard_cpu_seconds: BTreeMap<u16, f64>,
}

impl PhaseCpu {
    pub fn from_ticks(ticks: &CpuTicks, ticks_per_second: u64) -> PhaseCpu {
        let seconds = |value: u64| value as f64 / ticks_per_second as f64;
        PhaseCpu {
            shard_cpu_seconds: seconds(ticks.shard_total_ticks()),
            io_worker_cpu_seconds: seconds(ticks.io_worker_ticks()),
            server_cpu_seconds: seconds(ticks.process_ticks),
            other_cpu_seconds: seconds(ticks.other_ticks),
            per_shard_cpu_seconds: ticks
                .shard_ticks
                .iter()
                .map(|(shard_id, value)| (*shard_id, seconds(*value)))
                .collect(),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CpuError {
    /// A `/proc` file of the process could not be read or parsed: the process has exited (the
    /// server died: look at its log), or `/proc` is not mounted or not readable here.
    #[error("cannot read {what} of process {pid}: {source} (did the server exit?)")]
    Proc {
        pid: u32,
        what: &'static str,
        source: ProcError,
    },
    /// The kernel reported 0 clock ticks per second (`AT_CLKTCK`); the times cannot be converted.
    #[error("the kernel reports {0} clock ticks per second")]
    ClockTicks(u64),
}

/// Clock ticks per second of the `/proc` stat times (`sysconf(_SC_CLK_TCK)`, usually 100).
///
/// # Errors
/// `CpuError::ClockTicks` when the kernel reports 0.
pub fn clock_ticks_per_second() -> Result<u64, CpuError> {
    let ticks = procfs::ticks_per_second();
    if ticks == 0 {
        return Err(CpuError::ClockTicks(ticks));
    }
    Ok(ticks)
}

fn open_process(pid: u32) -> Result<Process, CpuError> {
    let proc_error = |source| CpuError::Proc {
        pid,
        what: "/proc/PID",
        source,
    };
    let pid_signed = i32::try_from(pid).map_err(|_| {
        proc_error(ProcError::Other(format!(
            "pid {pid} is above the kernel's pid range"
        )))
    })?;
    Process::new(pid_signed).map_err(proc_error)
}

/// The process total (user + system ticks, exited threads included) from `/proc/PID/stat`.
fn process_ticks(process: &Process) -> Result<u64, CpuError> {
    let stat = process.stat().map_err(|source| CpuError::Proc {
        pid: process.pid.unsigned_abs(),
        what: "stat",
        source,
    })?;
    Ok(stat.utime + stat.stime)
}

/// Reads every live thread of the process. Threads that exit while being read are skipped (their
/// directory or stat file is gone: `NotFound`).
fn read_threads(process: &Process) -> Result<HashMap<ThreadKey, ThreadSample>, CpuError> {
    let proc_error = |what, source| CpuError::Proc {
        pid: process.pid.unsigned_abs(),
        what,
        source,
    };
    let tasks = process
        .tasks()
        .map_err(|source| proc_error("task/", source))?;
    let mut threads = HashMap::new();
    for task in tasks {
        let stat = match task.and_then(|task| task.stat()) {
            Ok(stat) => stat,
            Err(ProcError::NotFound(_)) => continue,
            Err(source) => return Err(proc_error("task/TID/stat", source)),
        };
        let (key, sample) = thread_entry(&stat);
        threads.insert(key, sample);
    }
    Ok(threads)
}

/// Samples one process over one phase: `start`, then `sample` every
/// [`super::limits::CPU_SAMPLE_INTERVAL`], then `finish`.
#[derive(Debug)]
pub struct CpuSampler {
    process: Process,
    ticks_per_second: u64,
    process_ticks_start: u64,
    baseline: HashMap<ThreadKey, ThreadSample>,
    last_seen: HashMap<ThreadKey, ThreadSample>,
}

impl CpuSampler {
    /// Takes the baseline: the process total first, then the threads, so that the process delta
    /// is never smaller than the thread deltas.
    ///
    /// # Errors
    /// `CpuError::Proc` when the process is gone or `/proc` cannot be read; `ClockTicks`.
    pub fn start(pid: u32) -> Result<CpuSampler, CpuError> {
        let process = open_process(pid)?;
        let ticks_per_second = clock_ticks_per_second()?;
        let process_ticks_start = process_ticks(&process)?;
        let baseline = read_threads(&process)?;
        Ok(CpuSampler {
            process,
            ticks_per_second,
            process_ticks_start,
            last_seen: baseline.clone(),
            baseline,
        })
    }

    /// Records the current value of every live thread.
    ///
    /// # Errors
    /// `CpuError::Proc` when the process is gone.
    pub fn sample(&mut self) -> Result<(), CpuError> {
        let threads = read_threads(&self.process)?;
        self.last_seen.extend(threads);
        Ok(())
    }

    /// Takes a last sample (threads, then the process total) and attributes the phase's CPU.
    ///
    /// # Errors
    /// `CpuError::Proc` when the process is gone.
    pub fn finish(mut self) -> Result<PhaseCpu, CpuError> {
        self.sample()?;
        let process_ticks_end = process_ticks(&self.process)?;
        let process_delta_ticks = process_ticks_end.saturating_sub(self.process_ticks_start);
        let ticks = attribute_cpu(&self.baseline, &self.last_seen, process_delta_ticks);
        Ok(PhaseCpu::from_ticks(&ticks, self.ticks_per_second))
    }
}

/// CPU of a whole process at one instant, seconds since each thread started: what the metrics
/// endpoint reports as counters (`serve --metrics-listen`).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ProcessCpuSnapshot {
    /// The process total (user + system, exited threads included).
    pub process_seconds: f64,
    /// Live `shard-N` threads, by shard.
    pub shard_seconds: BTreeMap<u16, f64>,
    /// Live io_uring workers (`iou-wrk-*`, `iou-sqp-*`).
    pub io_worker_live_seconds: f64,
    /// Live threads of any other kind.
    pub other_live_seconds: f64,
    /// `process_seconds` minus every live thread: threads that exited, mostly io_uring workers
    /// (they come and go with the load).
    pub exited_seconds: f64,
}

impl ProcessCpuSnapshot {
    /// Sums live threads by kind against the process total (all in clock ticks) and converts to
    /// seconds. Live threads summing above the process total (sampling skew) give 0 exited.
    fn from_ticks<'a>(
        process_ticks: u64,
        threads: impl IntoIterator<Item = &'a ThreadSample>,
        ticks_per_second: u64,
    ) -> ProcessCpuSnapshot {
        let seconds = |ticks: u64| ticks as f64 / ticks_per_second as f64;
        let mut snapshot = ProcessCpuSnapshot {
            process_seconds: seconds(process_ticks),
            ..ProcessCpuSnapshot::default()
        };
        let mut live_ticks = 0;
        for sample in threads {
            live_ticks += sample.cpu_ticks;
            let value = seconds(sample.cpu_ticks);
            match sample.kind {
                ThreadKind::Shard(shard) => {
                    *snapshot.shard_seconds.entry(shard).or_default() += value;
                }
                ThreadKind::IoWorker => snapshot.io_worker_live_seconds += value,
                ThreadKind::Other => snapshot.other_live_seconds += value,
            }
        }
        snapshot.exited_seconds = seconds(process_ticks.saturating_sub(live_ticks));
        snapshot
    }
}

/// Reads `/proc/PID/stat` and every `/proc/PID/task/*/stat` once.
///
/// # Errors
/// `CpuError::Proc` when the process is gone or `/proc` cannot be read (naming the file);
/// `ClockTicks`.
pub fn process_cpu_snapshot(pid: u32) -> Result<ProcessCpuSnapshot, CpuError> {
    let ticks_per_second = clock_ticks_per_second()?;
    let process = open_process(pid)?;
    let process_ticks = process_ticks(&process)?;
    let threads = read_threads(&process)?;
    Ok(ProcessCpuSnapshot::from_ticks(
        process_ticks,
        threads.values(),
        ticks_per_second,
    ))
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are the exact quotients computed"
)]
mod tests {
    use std::sync::mpsc;

    use procfs::FromRead;

    use super::*;

    /// A real-shaped stat line (from a 6.x kernel) with a given comm and utime/stime/starttime.
    fn stat_line(comm: &str, utime: u64, stime: u64, start: u64) -> String {
        format!(
            "4242 ({comm}) S 1 4242 4242 0 -1 4194368 1234 0 0 0 {utime} {stime} 0 0 20 0 9 0 \
             {start} 123456789 2345 18446744073709551615 1 1 0 0 0 0 0 4096 17642 0 0 0 17 3 0 0 \
             0 0 0 0 0 0 0 0 0 0 0\n"
        )
    }

    fn parse(line: &str) -> Result<Stat, ProcError> {
        Stat::from_read(line.as_bytes())
    }

    #[test]
    fn a_stat_line_gives_key_and_sample() {
        let (key, sample) = thread_entry(&parse(&stat_line("shard-3", 120, 45, 9876)).unwrap());
        assert_eq!(
            key,
            ThreadKey {
                tid: 4242,
                start_time_ticks: 9876
            }
        );
        assert_eq!(
            sample,
            ThreadSample {
                kind: ThreadKind::Shard(3),
                cpu_ticks: 165
            }
        );
    }

    #[test]
    fn a_comm_with_spaces_and_parentheses_keeps_the_fields_in_place() {
        let stat = parse(&stat_line("a) b (c) 1 2 3", 7, 8, 9)).unwrap();
        assert_eq!(stat.comm, "a) b (c) 1 2 3");
        assert_eq!((stat.utime, stat.stime, stat.starttime), (7, 8, 9));
        let (key, sample) = thread_entry(&parse(&stat_line("iou-wrk-4242", 1, 2, 3)).unwrap());
        assert_eq!((key.start_time_ticks, sample.cpu_ticks), (3, 3));
        assert_eq!(sample.kind, ThreadKind::IoWorker);
    }

    #[test]
    fn malformed_lines_are_errors_not_zeros() {
        assert!(parse("4242 shard-0 S 1").is_err());
        assert!(parse("4242 (x) S 1 2 3").is_err());
        let line = stat_line("x", 1, 2, 3).replace(" 1 2 0 0 20", " 1 zz 0 0 20");
        assert!(parse(&line).is_err());
    }

    /// This thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`).
    fn thread_cpu_time() -> std::time::Duration {
        let mut now = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: clock_gettime only writes the timespec passed to it.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &raw mut now) };
        assert_eq!(rc, 0);
        std::time::Duration::new(now.tv_sec.unsigned_abs(), now.tv_nsec.unsigned_abs() as u32)
    }

    /// Spawns a thread named `name` that spins until it has used 50 ms of CPU (five ticks at the
    /// usual 100 Hz), then waits for the returned sender to drop.
    fn named_thread(name: &str) -> (mpsc::Sender<()>, std::thread::JoinHandle<()>) {
        let (stop_tx, stop_rx) = mpsc::channel::<()>();
        let (ready_tx, ready_rx) = mpsc::channel::<()>();
        let handle = std::thread::Builder::new()
            .name(name.to_owned())
            .spawn(move || {
                let mut value = 0_u64;
                while thread_cpu_time() < std::time::Duration::from_millis(50) {
                    for index in 0..10_000_u64 {
                        value = std::hint::black_box(value.wrapping_mul(31).wrapping_add(index));
                    }
                }
                ready_tx.send(()).unwrap();
                let _ = stop_rx.recv();
            })
            .unwrap();
        ready_rx.recv().unwrap();
        (stop_tx, handle)
    }

    #[test]
    fn reads_this_process_and_names_its_threads() {
        let (stop, handle) = named_thread("shard-7");
        let process = open_process(std::process::id()).unwrap();
        let threads = read_threads(&process).unwrap();
        let total_ticks = process_ticks(&process).unwrap();
        let shard_threads: Vec<_> = threads
            .iter()
            .filter(|(_, sample)| sample.kind == ThreadKind::Shard(7))
            .collect();
        assert_eq!(shard_threads.len(), 1, "{threads:?}");
        assert!(shard_threads[0].1.cpu_ticks <= total_ticks);
        assert!(clock_ticks_per_second().unwrap() > 0);

        let snapshot = process_cpu_snapshot(std::process::id()).unwrap();
        // Other tests of this binary may run shard-named threads too; this one is there.
        assert!(snapshot.shard_seconds.contains_key(&7), "{snapshot:?}");
        drop(stop);
        handle.join().unwrap();
    }

    #[test]
    fn a_missing_process_is_an_error_naming_it() {
        // Above /proc/sys/kernel/pid_max's ceiling (2^22), so never a live process.
        let error = process_cpu_snapshot(1 << 23).unwrap_err();
        assert!(
            error
                .to_string()
                .starts_with("cannot read /proc/PID of process 8388608"),
            "{error}"
        );
    }

    #[test]
    fn classifies_thread_names() {
        assert_eq!(classify_thread("shard-0"), ThreadKind::Shard(0));
        assert_eq!(classify_thread("shard-17"), ThreadKind::Shard(17));
        assert_eq!(classify_thread("iou-wrk-4242"), ThreadKind::IoWorker);
        assert_eq!(classify_thread("iou-sqp-4242"), ThreadKind::IoWorker);
        assert_eq!(classify_thread("shardline"), ThreadKind::Other);
        assert_eq!(classify_thread("shard-x"), ThreadKind::Other);
    }

    fn key(tid: u32) -> ThreadKey {
        ThreadKey {
            tid,
            start_time_ticks: 100,
        }
    }

    fn sample(kind: ThreadKind, cpu_ticks: u64) -> ThreadSample {
        ThreadSample { kind, cpu_ticks }
    }

    #[test]
    fn attribution_gives_exited_thread_cpu_to_io_workers() {
        let baseline = HashMap::from([
            (key(1), sample(ThreadKind::Other, 50)),
            (key(2), sample(ThreadKind::Shard(0), 100)),
            (key(3), sample(ThreadKind::Shard(1), 200)),
        ]);
        let mut last_seen = baseline.clone();
        last_seen.insert(key(1), sample(ThreadKind::Other, 52));
        last_seen.insert(key(2), sample(ThreadKind::Shard(0), 400));
        last_seen.insert(key(3), sample(ThreadKind::Shard(1), 350));
        // Born during the phase: its whole time counts.
        last_seen.insert(key(4), sample(ThreadKind::IoWorker, 30));
        // Thread deltas: 2 + 300 + 150 + 30 = 482; the process spent 500, so 18 ticks went to
        // threads that exited between samples.
        let ticks = attribute_cpu(&baseline, &last_seen, 500);
        assert_eq!(ticks.shard_ticks, BTreeMap::from([(0, 300), (1, 150)]));
        assert_eq!(ticks.shard_total_ticks(), 450);
        assert_eq!(ticks.io_worker_live_ticks, 30);
        assert_eq!(ticks.unobserved_ticks, 18);
        assert_eq!(ticks.io_worker_ticks(), 48);
        assert_eq!(ticks.other_ticks, 2);

        let cpu = PhaseCpu::from_ticks(&ticks, 100);
        assert_eq!(cpu.shard_cpu_seconds, 4.5);
        assert_eq!(cpu.io_worker_cpu_seconds, 0.48);
        assert_eq!(cpu.server_cpu_seconds, 5.0);
        assert_eq!(cpu.other_cpu_seconds, 0.02);
        assert_eq!(
            cpu.per_shard_cpu_seconds,
            BTreeMap::from([(0, 3.0), (1, 1.5)])
        );
    }

    #[test]
    fn attribution_never_goes_negative_and_treats_reused_tids_as_new() {
        let baseline = HashMap::from([(key(2), sample(ThreadKind::Shard(0), 100))]);
        // Same tid, later start time: a different thread that reused the tid.
        let reused = ThreadKey {
            tid: 2,
            start_time_ticks: 900,
        };
        let last_seen = HashMap::from([
            (key(2), sample(ThreadKind::Shard(0), 160)),
            (reused, sample(ThreadKind::IoWorker, 5)),
        ]);
        // Sampling skew: the process total reads lower than the thread sum.
        let ticks = attribute_cpu(&baseline, &last_seen, 60);
        assert_eq!(ticks.shard_total_ticks(), 60);
        assert_eq!(ticks.io_worker_live_ticks, 5);
        assert_eq!(ticks.unobserved_ticks, 0);
    }

    #[test]
    fn snapshot_sums_threads_by_kind_and_the_rest_is_exited() {
        let threads = [
            sample(ThreadKind::Shard(0), 300),
            sample(ThreadKind::Shard(1), 150),
            sample(ThreadKind::Shard(1), 50),
            sample(ThreadKind::IoWorker, 30),
            sample(ThreadKind::Other, 2),
        ];
        let snapshot = ProcessCpuSnapshot::from_ticks(600, &threads, 100);
        assert_eq!(
            snapshot,
            ProcessCpuSnapshot {
                process_seconds: 6.0,
                shard_seconds: BTreeMap::from([(0, 3.0), (1, 2.0)]),
                io_worker_live_seconds: 0.3,
                other_live_seconds: 0.02,
                exited_seconds: 0.68,
            }
        );
        // Skew: live threads above the total give no negative exited time.
        assert_eq!(
            ProcessCpuSnapshot::from_ticks(400, &threads, 100).exited_seconds,
            0.0
        );
    }

    #[test]
    fn sampler_attributes_a_shard_thread_born_in_the_phase() {
        let mut sampler = CpuSampler::start(std::process::id()).unwrap();
        let (stop, handle) = named_thread("shard-9");
        sampler.sample().unwrap();
        let cpu = sampler.finish().unwrap();
        drop(stop);
        handle.join().unwrap();
        let shard_9_seconds = cpu.per_shard_cpu_seconds.get(&9).copied();
        assert!(
            shard_9_seconds.is_some_and(|seconds| seconds > 0.0),
            "{cpu:?}"
        );
        // Another test's `shard-7` thread may be alive too: the total is one division of the
        // summed ticks, the per-shard figures one division each, so they agree to rounding.
        let per_shard_sum_seconds = cpu.per_shard_cpu_seconds.values().sum::<f64>();
        assert!(
            (cpu.shard_cpu_seconds - per_shard_sum_seconds).abs() < 1e-9,
            "{cpu:?}"
        );
    }
}
