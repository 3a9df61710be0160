//! CPU accounting of the server process from `/proc`: shard threads, `io_uring` kernel workers, and
//! the whole process, per bench phase.
//!
//! Sources (proc(5)): `/proc/PID/task/TID/stat` for each thread and `/proc/PID/stat` for the
//! process. `utime` and `stime` are fields 14 and 15 and `starttime` field 22, counted from 1 over
//! the whole line, in clock ticks (`sysconf(_SC_CLK_TCK)`). The thread name is the stat line's
//! `comm` field, the same `task->comm` that `/proc/PID/task/TID/comm` shows. Threads named
//! `shard-N` are shards; `iou-wrk-*` (io-wq workers) and `iou-sqp-*` (SQPOLL threads) are the
//! `io_uring` kernel workers that do the shards' blocking I/O (buffered writes, fsync) and belong to
//! the server process.
//!
//! io-wq workers come and go within a phase, so the sampler reads every thread every
//! ~100 ms and keeps the last value seen per thread. The process total also counts threads that
//! have exited; whatever the process spent beyond the sum of the live threads' deltas is CPU of
//! threads that exited (or were born and died) between samples, and in the server those are
//! io-wq workers, so it is attributed to io workers.
//!
//! Must never write to `/proc` or signal the process; it only reads.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

/// The fields of a stat line the bench uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskStat {
    pub comm: String,
    pub utime_ticks: u64,
    pub stime_ticks: u64,
    pub start_time_ticks: u64,
}

impl TaskStat {
    pub fn cpu_ticks(&self) -> u64 {
        self.utime_ticks + self.stime_ticks
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum StatParseError {
    #[error("stat line has no `(comm)` field")]
    NoComm,
    #[error("stat line ends before field {field}")]
    TooShort { field: usize },
    #[error("stat field {field} is not a number: {value:?}")]
    NotANumber { field: usize, value: String },
}

/// Parses one `/proc/.../stat` line. `comm` may contain spaces and parentheses, so it is the text
/// between the first `(` and the last `)`.
pub fn parse_stat(line: &str) -> Result<TaskStat, StatParseError> {
    let open = line.find('(').ok_or(StatParseError::NoComm)?;
    let close = line.rfind(')').ok_or(StatParseError::NoComm)?;
    if close < open {
        return Err(StatParseError::NoComm);
    }
    let comm = line[open + 1..close].to_string();
    // Fields after the comm start at field 3 (state).
    let rest: Vec<&str> = line[close + 1..].split_ascii_whitespace().collect();
    let field = |number: usize| -> Result<u64, StatParseError> {
        let value = rest
            .get(number - 3)
            .ok_or(StatParseError::TooShort { field: number })?;
        value
            .parse::<u64>()
            .map_err(|_| StatParseError::NotANumber {
                field: number,
                value: (*value).to_string(),
            })
    };
    Ok(TaskStat {
        comm,
        utime_ticks: field(14)?,
        stime_ticks: field(15)?,
        start_time_ticks: field(22)?,
    })
}

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
    #[error("cannot read {path}: {source} (did the server exit?)")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot parse {path}: {source}")]
    Parse {
        path: PathBuf,
        source: StatParseError,
    },
    #[error("sysconf(_SC_CLK_TCK) returned {0}")]
    ClockTicks(i64),
}

/// Clock ticks per second of the `/proc` stat times.
pub fn clock_ticks_per_second() -> Result<u64, CpuError> {
    // SAFETY: sysconf has no preconditions; it only reads a configuration value.
    let value = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    u64::try_from(value)
        .ok()
        .filter(|ticks| *ticks > 0)
        .ok_or(CpuError::ClockTicks(value))
}

fn read_stat(path: &Path) -> Result<TaskStat, CpuError> {
    let text = std::fs::read_to_string(path).map_err(|source| CpuError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_stat(&text).map_err(|source| CpuError::Parse {
        path: path.to_path_buf(),
        source,
    })
}

/// Reads every live thread of the process. Threads that exit while being read are skipped.
fn read_threads(process_dir: &Path) -> Result<HashMap<ThreadKey, ThreadSample>, CpuError> {
    let task_dir = process_dir.join("task");
    let entries = std::fs::read_dir(&task_dir).map_err(|source| CpuError::Read {
        path: task_dir.clone(),
        source,
    })?;
    let mut threads = HashMap::new();
    for entry in entries {
        let Ok(entry) = entry else { continue };
        let Some(tid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let stat = match read_stat(&entry.path().join("stat")) {
            Ok(stat) => stat,
            Err(CpuError::Read { .. }) => continue,
            Err(error) => return Err(error),
        };
        threads.insert(
            ThreadKey {
                tid,
                start_time_ticks: stat.start_time_ticks,
            },
            ThreadSample {
                kind: classify_thread(&stat.comm),
                cpu_ticks: stat.cpu_ticks(),
            },
        );
    }
    Ok(threads)
}

/// Samples one process over one phase: `start`, then `sample` every
/// [`super::limits::CPU_SAMPLE_INTERVAL`], then `finish`.
#[derive(Debug)]
pub struct CpuSampler {
    process_dir: PathBuf,
    ticks_per_second: u64,
    process_ticks_start: u64,
    baseline: HashMap<ThreadKey, ThreadSample>,
    last_seen: HashMap<ThreadKey, ThreadSample>,
}

impl CpuSampler {
    /// Takes the baseline: the process total first, then the threads, so that the process delta
    /// is never smaller than the thread deltas.
    pub fn start(pid: u32) -> Result<CpuSampler, CpuError> {
        let process_dir = PathBuf::from(format!("/proc/{pid}"));
        let ticks_per_second = clock_ticks_per_second()?;
        let process_ticks_start = read_stat(&process_dir.join("stat"))?.cpu_ticks();
        let baseline = read_threads(&process_dir)?;
        Ok(CpuSampler {
            process_dir,
            ticks_per_second,
            process_ticks_start,
            last_seen: baseline.clone(),
            baseline,
        })
    }

    /// Records the current value of every live thread.
    pub fn sample(&mut self) -> Result<(), CpuError> {
        let threads = read_threads(&self.process_dir)?;
        self.last_seen.extend(threads);
        Ok(())
    }

    /// Takes a last sample (threads, then the process total) and attributes the phase's CPU.
    pub fn finish(mut self) -> Result<PhaseCpu, CpuError> {
        self.sample()?;
        let process_ticks_end = read_stat(&self.process_dir.join("stat"))?.cpu_ticks();
        let process_delta_ticks = process_ticks_end.saturating_sub(self.process_ticks_start);
        let ticks = attribute_cpu(&self.baseline, &self.last_seen, process_delta_ticks);
        Ok(PhaseCpu::from_ticks(&ticks, self.ticks_per_second))
    }
}

#[cfg(test)]
#[allow(
    clippy::float_cmp,
    reason = "expected values are the exact quotients computed"
)]
mod tests {
    use super::*;

    /// A real-shaped stat line (from a 6.x kernel) with a given comm and utime/stime/starttime.
    fn stat_line(comm: &str, utime: u64, stime: u64, start: u64) -> String {
        format!(
            "4242 ({comm}) S 1 4242 4242 0 -1 4194368 1234 0 0 0 {utime} {stime} 0 0 20 0 9 0 \
             {start} 123456789 2345 18446744073709551615 1 1 0 0 0 0 0 4096 17642 0 0 0 17 3 0 0 \
             0 0 0 0 0 0 0 0 0 0 0\n"
        )
    }

    #[test]
    fn parses_a_plain_stat_line() {
        let stat = parse_stat(&stat_line("shard-3", 120, 45, 9876)).unwrap();
        assert_eq!(
            stat,
            TaskStat {
                comm: "shard-3".to_string(),
                utime_ticks: 120,
                stime_ticks: 45,
                start_time_ticks: 9876
            }
        );
        assert_eq!(stat.cpu_ticks(), 165);
    }

    #[test]
    fn parses_a_comm_with_spaces_and_parentheses() {
        let stat = parse_stat(&stat_line("a) b (c) 1 2 3", 7, 8, 9)).unwrap();
        assert_eq!(stat.comm, "a) b (c) 1 2 3");
        assert_eq!(
            (stat.utime_ticks, stat.stime_ticks, stat.start_time_ticks),
            (7, 8, 9)
        );
    }

    #[test]
    fn rejects_malformed_lines() {
        assert_eq!(parse_stat("4242 shard-0 S 1"), Err(StatParseError::NoComm));
        assert_eq!(
            parse_stat("4242 (x) S 1 2 3"),
            Err(StatParseError::TooShort { field: 14 })
        );
        let line = stat_line("x", 1, 2, 3).replace(" 1 2 0 0 20", " 1 zz 0 0 20");
        assert_eq!(
            parse_stat(&line),
            Err(StatParseError::NotANumber {
                field: 15,
                value: "zz".to_string()
            })
        );
    }

    #[test]
    fn reads_this_process() {
        let stat = read_stat(Path::new("/proc/self/stat")).unwrap();
        assert!(!stat.comm.is_empty());
        let threads = read_threads(Path::new("/proc/self")).unwrap();
        assert!(!threads.is_empty());
        assert!(clock_ticks_per_second().unwrap() > 0);
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
    fn sampler_measures_this_process() {
        let mut sampler = CpuSampler::start(std::process::id()).unwrap();
        sampler.sample().unwrap();
        let cpu = sampler.finish().unwrap();
        assert!(cpu.server_cpu_seconds >= 0.0);
        assert!(
            cpu.shard_cpu_seconds == 0.0,
            "no thread of the test binary is a shard"
        );
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

/// Reads `/proc/PID/stat` and every `/proc/PID/task/*/stat` once.
///
/// # Errors
/// The process is gone or `/proc` cannot be read (naming the path).
pub fn process_cpu_snapshot(pid: u32) -> Result<ProcessCpuSnapshot, CpuError> {
    let ticks_per_second = clock_ticks_per_second()? as f64;
    let process_dir = PathBuf::from(format!("/proc/{pid}"));
    let process_ticks = read_stat(&process_dir.join("stat"))?.cpu_ticks();
    let threads = read_threads(&process_dir)?;
    let seconds = |ticks: u64| ticks as f64 / ticks_per_second;
    let mut snapshot = ProcessCpuSnapshot {
        process_seconds: seconds(process_ticks),
        ..ProcessCpuSnapshot::default()
    };
    let mut live_ticks = 0;
    for sample in threads.values() {
        live_ticks += sample.cpu_ticks;
        let value = seconds(sample.cpu_ticks);
        match sample.kind {
            ThreadKind::Shard(shard) => *snapshot.shard_seconds.entry(shard).or_default() += value,
            ThreadKind::IoWorker => snapshot.io_worker_live_seconds += value,
            ThreadKind::Other => snapshot.other_live_seconds += value,
        }
    }
    snapshot.exited_seconds = seconds(process_ticks.saturating_sub(live_ticks));
    Ok(snapshot)
}
