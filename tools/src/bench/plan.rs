//! The validated bench plan: what `BenchArgs` resolve to, and the `config` object each run
//! reports.
//!
//! Must never hold an unchecked value: a `BenchPlan` comes only from `BenchArgs::validate`.

use std::path::PathBuf;
use std::time::Duration;

use super::payload::PayloadSource;
use super::report::RunConfig;
use super::server::ServerOptions;
use super::workload::ProduceStop;

/// What a run measures (`--workload`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Workload {
    /// Produce messages, then read every acknowledged one back and verify it: throughput,
    /// latency and messages per server-CPU-second.
    #[default]
    ProduceConsume,
    /// Metadata commit latency: one connection registers (a journaled op with nothing else to
    /// do), creates a stream, creates a 1-partition topic in it and deletes the stream,
    /// `--metadata-ops` times, each round trip timed; before each round one 4 KiB write +
    /// fdatasync on the server's filesystem is timed as the baseline. Reports p50/p90/p99/p99.9/
    /// max of each, p99 / baseline p99, and the target (register p99 within 3x of the baseline).
    /// With `--clients N`, then N connections register concurrently: committed ops/s and their
    /// p50/p99/max beside issue 8's targets.
    Metadata,
}

impl std::fmt::Display for Workload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Workload::ProduceConsume => "produce-consume",
            Workload::Metadata => "metadata",
        })
    }
}

/// One `--shards` entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ShardRequest {
    /// One shard per allowed CPU, resolved by the server.
    All,
    Count(u16),
}

impl std::fmt::Display for ShardRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShardRequest::All => f.write_str("all"),
            ShardRequest::Count(count) => write!(f, "{count}"),
        }
    }
}

/// One run of the sequence: the shard count, which repeat of it this is, and where the run
/// stands in the invocation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScheduledRun {
    pub request: ShardRequest,
    /// 1-based: the k-th run of this shard count.
    pub repeat: u32,
    /// 0-based position in the invocation: 0 is the first run of the sequence.
    pub sequence: u32,
}

/// The order of the runs: `repeat_count` rounds, each running every request once in the order
/// given (`1,2,4,1,2,4`), not each count `repeat_count` times in a row (`1,1,2,2,4,4`).
/// Interleaving spreads slow drift (another tenant of the VM, thermal limits, the page cache and
/// guest memory warming up over the first runs) over every count instead of charging it all to
/// the counts that happen to run first, so the medians compare like with like and the spread
/// per count includes the drift instead of hiding it.
///
/// # Panics
/// If `repeat_count` is 0 or the sequence exceeds `u32::MAX` runs (both refused by `validate`).
pub fn run_order(requests: &[ShardRequest], repeat_count: u32) -> Vec<ScheduledRun> {
    assert!(repeat_count >= 1, "validate refuses --repeat 0");
    (1..=repeat_count)
        .flat_map(|repeat| requests.iter().map(move |request| (*request, repeat)))
        .enumerate()
        .map(|(sequence, (request, repeat))| ScheduledRun {
            request,
            repeat,
            sequence: u32::try_from(sequence).expect("validate bounds the run count"),
        })
        .collect()
}

/// Where the payloads come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadChoice {
    Size(u32),
    File(PathBuf),
}

/// The server every run talks to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServerTarget {
    Embedded {
        options: ServerOptions,
        data_root: Option<PathBuf>,
    },
    External {
        addr: String,
        pid: Option<u32>,
    },
}

/// The concurrent-register phase of `--workload metadata`: `count` connections each register
/// fresh sessions in a loop, for `duration` or, when it is `None`, `metadata_op_count` Registers
/// each. A `count` of 1 runs no such phase (the single-client rounds only).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MetadataClients {
    /// Concurrent client connections (`--clients`, 1..=`METADATA_CLIENT_COUNT_MAX`).
    pub count: u32,
    /// `--duration`: how long the phase runs; only with `count` >= 2.
    pub duration: Option<Duration>,
}

impl MetadataClients {
    /// One client, no concurrent phase: the default.
    pub const ONE: MetadataClients = MetadataClients {
        count: 1,
        duration: None,
    };
}

/// Validated flags.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchPlan {
    /// The shard counts to run, in order (`--shards`, `sweep` expanded).
    pub shard_requests: Vec<ShardRequest>,
    /// Runs of each shard count, each on a fresh server (`--repeat`, 1..=`REPEAT_COUNT_MAX`).
    pub repeat_count: u32,
    /// Per-core efficiency a larger shard count must keep, as a fraction of the 1-shard figure,
    /// to be recommended (`--efficiency-margin`, 0 < F <= 1).
    pub efficiency_margin: f64,
    pub server: ServerTarget,
    pub producer_count: u32,
    pub consumer_count: u32,
    pub partition_count: u32,
    pub batch_message_count: u32,
    pub stop: ProduceStop,
    pub payload: PayloadChoice,
    pub concurrent: bool,
    pub json: Option<PathBuf>,
    /// `--csv`: one row per run and phase.
    pub csv: Option<PathBuf>,
    /// `--charts`: the directory the SVG charts go to.
    pub charts: Option<PathBuf>,
    /// `--compare`: an earlier `--json` report to hold this one against.
    pub compare: Option<PathBuf>,
    pub stream_id: u32,
    pub workload: Workload,
    /// Metadata rounds (`--metadata-ops`); used by [`Workload::Metadata`] only.
    pub metadata_op_count: u32,
    /// The concurrent-register phase of [`Workload::Metadata`] (`--clients`, `--duration`).
    pub metadata_clients: MetadataClients,
    /// Where the metadata workload's disk baseline writes its scratch file when the server is
    /// `--addr` (`--data-root`); `None` there means the system temp dir. Always `None` for an
    /// embedded server, whose run directory is used.
    pub baseline_root: Option<PathBuf>,
    /// `--consumer-group [--group-churn]`: the consume phase is read by the members of one
    /// consumer group (`super::group`); `None` for pinned consumers.
    pub consumer_group: Option<super::group::GroupMode>,
}

impl BenchPlan {
    /// Every run of the invocation in order: see [`run_order`].
    pub fn schedule(&self) -> Vec<ScheduledRun> {
        run_order(&self.shard_requests, self.repeat_count)
    }

    /// The embedded server's options (defaults for `--addr`) and the fsync policy as reported.
    pub fn server_options_and_fsync(&self) -> (ServerOptions, String) {
        match &self.server {
            ServerTarget::Embedded { options, .. } => (
                options.clone(),
                options
                    .fsync
                    .clone()
                    .unwrap_or_else(|| "always (server default)".to_string()),
            ),
            ServerTarget::External { .. } => (
                ServerOptions::default(),
                "set by the running server".to_string(),
            ),
        }
    }

    /// The `config` object of a run's report.
    pub fn run_config(
        &self,
        request: ShardRequest,
        server_label: &str,
        server_pid: Option<u32>,
        payload: &PayloadSource,
        cpu_note: Option<String>,
        data_dir: Option<&std::path::Path>,
    ) -> RunConfig {
        let (options, fsync) = self.server_options_and_fsync();
        let (messages, duration_seconds) = match self.stop {
            ProduceStop::MessageCount(count) => (Some(count), None),
            ProduceStop::Duration(duration) => (None, Some(duration.as_secs())),
        };
        RunConfig {
            server: server_label.to_string(),
            server_pid,
            shards_requested: request.to_string(),
            producers: self.producer_count,
            consumers: self.consumer_count,
            partitions: self.partition_count,
            batch_messages: self.batch_message_count,
            messages,
            duration_seconds,
            payload: payload.describe(),
            concurrent: self.concurrent,
            fsync,
            write_mode: options.write_mode,
            cpus: options.cpus,
            no_pin: options.no_pin,
            io_driver: options.io_driver,
            inbox_capacity: options.inbox_capacity,
            idle_poll_us: options.idle_poll_us,
            stream_id: self.stream_id,
            cpu_note,
            data_dir: data_dir.map(|dir| dir.display().to_string()),
            data_dir_on_tmpfs: data_dir.and_then(data_dir_on_tmpfs),
        }
    }
}

/// Whether a run's data directory was on tmpfs. The run directory is removed when its server
/// stops, before the report is built: its nearest existing ancestor (the `--data-root` or temp
/// dir that held it) is on the same filesystem. `None`: cannot be inspected (no warning then).
fn data_dir_on_tmpfs(dir: &std::path::Path) -> Option<bool> {
    let existing = dir.ancestors().find(|ancestor| ancestor.exists())?;
    super::server::is_on_tmpfs(existing).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_removed_run_directory_is_judged_by_the_directory_that_held_it() {
        for root in [std::path::Path::new("/dev/shm"), std::path::Path::new(".")] {
            let Ok(held) = tempfile::tempdir_in(root) else {
                continue;
            };
            let expected = super::super::server::is_on_tmpfs(held.path()).ok();
            assert!(expected.is_some(), "{}", held.path().display());
            let removed = held.path().join("run-1").join("data");
            assert_eq!(
                data_dir_on_tmpfs(&removed),
                expected,
                "{}",
                removed.display()
            );
        }
    }

    #[test]
    fn repeats_run_in_interleaved_rounds_numbered_per_count_and_in_sequence() {
        let requests = [
            ShardRequest::Count(1),
            ShardRequest::Count(2),
            ShardRequest::All,
        ];
        let order: Vec<(String, u32, u32)> = run_order(&requests, 2)
            .into_iter()
            .map(|run| (run.request.to_string(), run.repeat, run.sequence))
            .collect();
        let expected = [
            ("1", 1, 0),
            ("2", 1, 1),
            ("all", 1, 2),
            ("1", 2, 3),
            ("2", 2, 4),
            ("all", 2, 5),
        ]
        .map(|(request, repeat, sequence)| (request.to_string(), repeat, sequence));
        assert_eq!(order, expected);
    }

    #[test]
    fn one_repeat_is_the_list_in_order() {
        let requests = [ShardRequest::Count(4), ShardRequest::Count(1)];
        assert_eq!(
            run_order(&requests, 1),
            [
                ScheduledRun {
                    request: ShardRequest::Count(4),
                    repeat: 1,
                    sequence: 0
                },
                ScheduledRun {
                    request: ShardRequest::Count(1),
                    repeat: 1,
                    sequence: 1
                },
            ]
        );
    }
}
