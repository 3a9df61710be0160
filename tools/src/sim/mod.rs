//! `shardline sim`: the deterministic simulator (issue 8 section 4). It runs the real consensus
//! core (`shards::vsr::replica::Replica`), the real journal, superblock and snapshot encodings
//! and the real client table against a simulated network, disk and clock, all driven by one
//! PRNG seeded by `--seed`, and checks named safety and liveness rules (see [`checker`]).
//!
//! The same seed gives the same trace digest on every run and machine; a failing seed prints the
//! first violated rule and the last events. `--seeds A..B` runs each seed on its own thread (one
//! seed is one job; the threads share nothing, so each seed stays deterministic).
//!
//! Replica messages cross the simulated network as frames of the real replica codec
//! (`shards::vsr::wire`: a 256-byte checksummed bus header and a body), decoded on delivery.
//!
//! State transfer (issue 9): every replica runs the real serving side
//! (`shards::vsr::transfer::server::OfferServer`, fed the transfer requests addressed to it and
//! building offers from its simulated disk's checkpoint) and the core's own receiving side; the
//! disk releases the journal in whole segments and performs `Action::InstallCheckpoint`. `--transfer`
//! turns on the lagging-replica scenario and the transfer faults (see `cluster::transfer`).

pub mod checker;
pub mod cluster;
pub mod disk;
pub mod network;
pub mod prng;
pub mod trace;
pub mod workload;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::Write as _;
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use self::checker::Violation;
use self::cluster::{FaultCounts, TransferStats, World};
use crate::arg_values::whole_number;

/// Default `--ticks`: the safety phase (10 ms ticks: 30 simulated seconds).
pub const TICKS_DEFAULT: u64 = 3000;
/// Default `--requests`: metadata changes the clients send (besides their Registers).
pub const REQUESTS_DEFAULT: u64 = 100;
/// Committed ops between checkpoints in the simulator: small, so that most runs take several
/// checkpoints and restart from a snapshot.
pub const CHECKPOINT_INTERVAL: u64 = 16;
/// Default `--clients`.
pub const CLIENTS_DEFAULT: usize = 4;
/// Default `--liveness-ticks`: after the heal, ticks within which the cluster must converge.
pub const LIVENESS_TICKS_DEFAULT: u64 = 5000;
/// Largest `--ticks` and `--liveness-ticks`: 10^8 ticks is 11 simulated days and hours of wall
/// time per seed (a debug build runs about 10^4 ticks a second); the bound keeps
/// `ticks + liveness_ticks` far from `u64` overflow.
pub const TICKS_MAX: u64 = 100_000_000;
/// Largest `--requests`: the workload is generated up front (`workload::generate_operations`,
/// about a hundred bytes per change, so 100 MB at this bound), and stream ids, which count up
/// with the requests, stay far below `u32::MAX`.
pub const REQUESTS_MAX: u64 = 1_000_000;
/// Largest `--journal-segment-ops`: records per journal segment; far above any checkpoint
/// interval, past which a segment is simply never released in a run.
pub const JOURNAL_SEGMENT_OPS_MAX: u64 = 1_000_000;
/// Most seeds one `--seeds A..B` runs: a default seed takes about a wall second in a debug build
/// (`TICKS_DEFAULT` at about 10^4 ticks a second), so this bound is months of CPU, never an
/// accident; a range of `u64`'s width otherwise runs until killed.
pub const SEED_COUNT_MAX: u64 = 10_000_000;
/// Largest `--jobs`: threads for `--seeds`, far above the cores of any host that runs it.
pub const JOBS_MAX: u32 = 1024;
const _: () = assert!(TICKS_DEFAULT <= TICKS_MAX && LIVENESS_TICKS_DEFAULT <= TICKS_MAX);
const _: () = assert!(REQUESTS_DEFAULT <= REQUESTS_MAX);
/// `--transfer`: records per journal segment (small, so checkpoints release the journal and a
/// lagging replica cannot repair by journal alone).
pub const TRANSFER_JOURNAL_SEGMENT_OPS: u64 = 8;
/// `--transfer`: probability that a state chunk's payload gets one byte flipped.
pub const TRANSFER_CHUNK_CORRUPTION: f64 = 0.02;
/// `--transfer`: probability that one write of a checkpoint install fails.
pub const TRANSFER_INSTALL_WRITE_FAIL: f64 = 0.05;
/// `--transfer`: probability that a server finds its checkpoint unreadable when building an offer.
pub const TRANSFER_OFFER_UNREADABLE: f64 = 0.05;
/// Largest state chunk payload the simulated servers send (bytes): small, so a transfer takes
/// several chunks and faults can land in the middle of one.
pub const TRANSFER_CHUNK_SIZE: u32 = 256;
/// Session slots of each replica's client table: above any `--clients`, so no session is
/// evicted (an eviction would be reported as an exactly-once violation).
pub const CLIENTS_TABLE_MAX: usize = 64;

/// One run's parameters (everything but the seed).
#[derive(Debug, Clone, PartialEq)]
pub struct SimConfig {
    pub cluster: u128,
    /// 3 or 5.
    pub replica_count: u8,
    /// Ticks of the safety phase (faults on).
    pub ticks: u64,
    /// Ticks the liveness phase may take at most.
    pub liveness_ticks: u64,
    pub requests: u64,
    pub clients: usize,
    pub clients_table_max: usize,
    /// Committed ops between two checkpoints of each replica (small, so runs checkpoint often).
    pub checkpoint_interval: u64,
    /// Ops each journal keeps below a checkpoint (`disk::JOURNAL_RETAIN_OPS` by default).
    pub journal_retain_ops: u64,
    /// Records per journal segment (the journal is released in whole segments); 1 by default.
    pub journal_segment_ops: u64,
    /// The lagging-replica scenario (issue 9): one replica is crashed or cut off early and kept
    /// so until the others committed enough checkpoint intervals to release the journal it
    /// needs, then comes back and must catch up by state transfer while the workload goes on.
    pub lagging_replica: bool,
    /// Per state chunk sent: one payload byte flips before encoding (the frame stays valid, the
    /// artifact checksum fails).
    pub chunk_corruption: f64,
    /// Per write of a checkpoint install (snapshot, then pairing): the write fails.
    pub install_write_fail: f64,
    /// Per offer build: the server finds its checkpoint unreadable.
    pub offer_unreadable: f64,
    /// Largest state chunk payload (bytes).
    pub transfer_chunk_size: u32,
    /// Per packet.
    pub packet_loss: f64,
    /// Per packet.
    pub packet_duplicate: f64,
    /// Per tick, when no partition is active.
    pub partition: f64,
    /// Per tick.
    pub crash: f64,
    /// Per crash: the write in progress tears.
    pub torn_write: f64,
    /// Per tick: a bit flips in a durable journal record.
    pub read_corruption: f64,
    /// Print every event to stderr (does not change the run or its digest).
    pub echo_trace: bool,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            cluster: 0x5eed,
            replica_count: 3,
            ticks: TICKS_DEFAULT,
            liveness_ticks: LIVENESS_TICKS_DEFAULT,
            requests: REQUESTS_DEFAULT,
            clients: CLIENTS_DEFAULT,
            clients_table_max: CLIENTS_TABLE_MAX,
            checkpoint_interval: CHECKPOINT_INTERVAL,
            journal_retain_ops: disk::JOURNAL_RETAIN_OPS,
            journal_segment_ops: 1,
            lagging_replica: false,
            chunk_corruption: 0.0,
            install_write_fail: 0.0,
            offer_unreadable: 0.0,
            transfer_chunk_size: TRANSFER_CHUNK_SIZE,
            packet_loss: 0.02,
            packet_duplicate: 0.02,
            partition: 0.002,
            crash: 0.002,
            torn_write: 0.5,
            read_corruption: 0.001,
            echo_trace: false,
        }
    }
}

impl SimConfig {
    /// Applies the `--transfer` scenario: no journal retention beyond whole segments of
    /// [`TRANSFER_JOURNAL_SEGMENT_OPS`], a lagging replica, and the transfer faults (chunk
    /// corruption, failed install writes, unreadable checkpoints) at their default rates.
    #[must_use]
    pub fn with_transfer(self) -> SimConfig {
        SimConfig {
            journal_retain_ops: 0,
            journal_segment_ops: TRANSFER_JOURNAL_SEGMENT_OPS,
            lagging_replica: true,
            chunk_corruption: TRANSFER_CHUNK_CORRUPTION,
            install_write_fail: TRANSFER_INSTALL_WRITE_FAIL,
            offer_unreadable: TRANSFER_OFFER_UNREADABLE,
            ..self
        }
    }
}

/// The outcome of one seed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedReport {
    pub seed: u64,
    /// `None` if every rule held.
    pub failure: Option<SeedFailure>,
    /// The commit every replica converged to (or the highest committed op, on failure).
    pub commit: u64,
    /// Simulated ticks.
    pub ticks: u64,
    pub faults: FaultCounts,
    /// What state transfer did in the run (all zero unless some replica needed one).
    pub transfers: TransferStats,
    /// XXH3-64 of the event log.
    pub trace_digest: u64,
    pub event_count: u64,
}

/// The first rule a seed broke, and the events before it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeedFailure {
    pub rule: &'static str,
    pub detail: String,
    /// The last events, oldest first.
    pub last_events: Vec<String>,
}

impl SeedReport {
    /// The one line `shardline sim` prints for the seed.
    pub fn line(&self) -> String {
        let transfers = if self.transfers == TransferStats::default() {
            String::new()
        } else {
            format!(" transfers ({})", self.transfers)
        };
        format!(
            "seed {} {} commit {} ticks {} faults {} ({}){transfers} digest {:#018x}",
            self.seed,
            match &self.failure {
                None => "ok".to_owned(),
                Some(failure) => format!("FAILED {}", failure.rule),
            },
            self.commit,
            self.ticks,
            self.faults.total(),
            self.faults,
            self.trace_digest
        )
    }
}

thread_local! {
    /// Where the last panic on this thread happened, if [`quiet_panic_hook`] is installed.
    static PANIC_LOCATION: std::cell::RefCell<Option<String>> = const { std::cell::RefCell::new(None) };
}

/// Replaces the process's panic hook with one that prints nothing and records the panic's
/// location for the seed's report (a core panic is a finding reported as the rule
/// `core-panic`, not a crash of `shardline sim`).
fn quiet_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let location = info
            .location()
            .map(|location| format!("{}:{}", location.file(), location.line()));
        PANIC_LOCATION.with(|slot| *slot.borrow_mut() = location);
    }));
}

fn panic_text(payload: &(dyn std::any::Any + Send)) -> String {
    let message = payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| {
            payload
                .downcast_ref::<&str>()
                .map(|text| (*text).to_owned())
        })
        .unwrap_or_else(|| "non-text panic payload".to_owned());
    match PANIC_LOCATION.with(|slot| slot.borrow_mut().take()) {
        Some(location) => format!("{message} (at {location})"),
        None => message,
    }
}

/// Runs seed `seed` under `config`. A panic of the core (an assertion) is reported as the rule
/// `core-panic`, with its message.
pub fn run_seed(config: &SimConfig, seed: u64) -> SeedReport {
    run_seed_with(config, seed, |_| Ok(()))
}

/// [`run_seed`], calling `tamper` on the world after the run's own checks passed, so a test can
/// feed the checker something a broken core would do and see the run fail.
pub fn run_seed_with(
    config: &SimConfig,
    seed: u64,
    tamper: impl FnOnce(&mut World) -> Result<(), Violation>,
) -> SeedReport {
    let mut world = None;
    let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let world = world.insert(World::new(config, seed));
        let summary = world.run()?;
        tamper(world)?;
        Ok::<_, Violation>(summary)
    }));
    let (failure, commit) = match outcome {
        Ok(Ok(summary)) => (None, summary.commit),
        Ok(Err(violation)) => (Some((violation.rule, violation.detail)), 0),
        Err(payload) => (Some(("core-panic", panic_text(payload.as_ref()))), 0),
    };
    let Some(world) = world else {
        let (rule, detail) = failure.expect("no world: World::new panicked");
        return SeedReport {
            seed,
            failure: Some(SeedFailure {
                rule,
                detail,
                last_events: Vec::new(),
            }),
            commit: 0,
            ticks: 0,
            faults: FaultCounts::default(),
            transfers: TransferStats::default(),
            trace_digest: 0,
            event_count: 0,
        };
    };
    let commit = if failure.is_some() {
        world.committed_op_max()
    } else {
        commit
    };
    SeedReport {
        seed,
        failure: failure.map(|(rule, detail)| SeedFailure {
            rule,
            detail: format!("{detail} [at {}]", world.status_line()),
            last_events: world.trace.tail(),
        }),
        commit,
        ticks: world.tick(),
        faults: world.faults,
        transfers: world.transfer_stats(),
        trace_digest: world.trace.digest(),
        event_count: world.trace.event_count(),
    }
}

/// Runs every seed of `seeds` on `jobs` threads (one seed per job) and calls `on_report` for
/// each, in seed order. Returns the reports in seed order.
///
/// # Panics
/// If `jobs` is 0.
pub fn run_seeds(
    config: &SimConfig,
    seeds: Range<u64>,
    jobs: usize,
    mut on_report: impl FnMut(&SeedReport),
) -> Vec<SeedReport> {
    assert!(jobs > 0, "jobs must be at least 1");
    let next_seed = AtomicU64::new(seeds.start);
    let finished: Mutex<BTreeMap<u64, SeedReport>> = Mutex::new(BTreeMap::new());
    let (sender, receiver) = std::sync::mpsc::channel::<u64>();
    let mut reports = Vec::new();
    std::thread::scope(|scope| {
        for _ in 0..jobs
            .min(seeds.end.saturating_sub(seeds.start) as usize)
            .max(1)
        {
            let sender = sender.clone();
            let (next_seed, finished) = (&next_seed, &finished);
            scope.spawn(move || {
                loop {
                    let seed = next_seed.fetch_add(1, Ordering::Relaxed);
                    if seed >= seeds.end {
                        break;
                    }
                    let report = run_seed(config, seed);
                    finished
                        .lock()
                        .expect("no thread panics holding it")
                        .insert(seed, report);
                    // Err: the receiver is gone only after every seed was reported.
                    let _ = sender.send(seed);
                }
            });
        }
        drop(sender);
        let mut next_to_report = seeds.start;
        for _ in receiver {
            let mut finished = finished.lock().expect("no thread panics holding it");
            while let Some(report) = finished.remove(&next_to_report) {
                on_report(&report);
                reports.push(report);
                next_to_report += 1;
            }
        }
    });
    reports
}

/// `shardline sim`'s flags.
///
/// Runs the real consensus core of 3 or 5 replicas against a simulated network, disk and clock,
/// all from one PRNG: the same seed prints the same trace digest on every run and machine.
/// Faults (packet loss, duplication, reorder, partitions, crashes, torn writes, latent
/// corruption) are injected for `--ticks` ticks, never leaving more than f replicas faulty; then
/// faults stop and every replica must converge within `--liveness-ticks`. Each seed prints one
/// line; a failing seed prints the first violated rule and the last events, and the command
/// exits 1. Probabilities are 0..=1.
#[derive(Debug, Clone, PartialEq, clap::Args)]
#[command(group(clap::ArgGroup::new("which").required(true).args(["seed", "seeds"])))]
pub struct SimArgs {
    /// Run this one seed (0..=18446744073709551615).
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = whole_number("a seed", 0, u64::MAX)
    )]
    pub seed: Option<u64>,

    /// Run the seeds A, A+1, ..., B-1 (e.g. `1..2000`; at most 10000000 of them), one per
    /// thread on all allowed CPUs.
    #[arg(long, value_name = "A..B", value_parser = parse_seed_range, allow_hyphen_values = true)]
    pub seeds: Option<Range<u64>>,

    /// Replicas in the simulated cluster: 3 (f = 1) or 5 (f = 2).
    #[arg(long, value_name = "N", default_value_t = 3, value_parser = parse_replica_count, allow_hyphen_values = true)]
    pub replicas: u8,

    /// Ticks (10 ms each) of the safety phase, during which faults are injected
    /// (0..=100000000).
    #[arg(
        long,
        value_name = "T",
        default_value_t = TICKS_DEFAULT,
        allow_hyphen_values = true,
        value_parser = whole_number("a tick count", 0, TICKS_MAX)
    )]
    pub ticks: u64,

    /// Ticks after the heal within which every replica must reach the same commit and every
    /// request must be answered (1..=100000000, 10 ms each).
    #[arg(
        long,
        value_name = "T",
        default_value_t = LIVENESS_TICKS_DEFAULT,
        allow_hyphen_values = true,
        value_parser = whole_number("a liveness tick count", 1, TICKS_MAX)
    )]
    pub liveness_ticks: u64,

    /// Metadata changes the clients send (each client also registers first; 0..=1000000).
    #[arg(
        long,
        value_name = "R",
        default_value_t = REQUESTS_DEFAULT,
        allow_hyphen_values = true,
        value_parser = whole_number("a request count", 0, REQUESTS_MAX)
    )]
    pub requests: u64,

    /// Simulated clients, each with one request in flight (1..=32).
    #[arg(long, value_name = "C", default_value_t = CLIENTS_DEFAULT, value_parser = parse_client_count, allow_hyphen_values = true)]
    pub clients: usize,

    /// Probability that a packet is lost.
    #[arg(long, value_name = "P", default_value_t = 0.02, value_parser = parse_probability, allow_hyphen_values = true)]
    pub packet_loss: f64,

    /// Probability that a packet is delivered twice.
    #[arg(long, value_name = "P", default_value_t = 0.02, value_parser = parse_probability, allow_hyphen_values = true)]
    pub packet_duplicate: f64,

    /// Probability per tick that a partition starts (symmetric, asymmetric, or the primary
    /// isolated), while none is active.
    #[arg(long, value_name = "P", default_value_t = 0.002, value_parser = parse_probability, allow_hyphen_values = true)]
    pub partition: f64,

    /// Probability per tick that a replica crashes (losing its unfinished writes) and restarts
    /// later from its disk.
    #[arg(long, value_name = "P", default_value_t = 0.002, value_parser = parse_probability, allow_hyphen_values = true)]
    pub crash: f64,

    /// Probability that a crash tears the write in progress (a journal record prefix, one
    /// superblock copy, a checkpoint between its steps).
    #[arg(long, value_name = "P", default_value_t = 0.5, value_parser = parse_probability, allow_hyphen_values = true)]
    pub torn_write: f64,

    /// Probability per tick that a bit flips in a durable journal record (a latent sector error).
    #[arg(long, value_name = "P", default_value_t = 0.001, value_parser = parse_probability, allow_hyphen_values = true)]
    pub read_corruption: f64,

    /// The state-transfer scenario (issue 9): journals released in whole segments of
    /// `--journal-segment-ops` records with nothing retained beyond them, one replica crashed or
    /// cut off until the others released what it needs (it must catch up by state transfer), the
    /// crashes during a transfer aimed at it half the time, and the
    /// transfer faults on (`--chunk-corruption`, `--install-write-fail`, `--offer-unreadable`
    /// default to 0.02, 0.05, 0.05 with it, 0 without).
    #[arg(long)]
    pub transfer: bool,

    /// Records per journal segment: a checkpoint releases the journal in whole segments
    /// (1..=1000000; default 8 with `--transfer`, else 1 with 4096 ops retained: never released
    /// in a run).
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = whole_number("a journal segment record count", 1, JOURNAL_SEGMENT_OPS_MAX)
    )]
    pub journal_segment_ops: Option<u64>,

    /// Probability that a state chunk's payload gets one byte flipped in flight (the frame stays
    /// valid; the artifact checksum must catch it).
    #[arg(long, value_name = "P", value_parser = parse_probability, allow_hyphen_values = true)]
    pub chunk_corruption: Option<f64>,

    /// Probability that one write of a checkpoint install fails (the snapshot write: the
    /// install fails; the pairing write after it: the install succeeds degraded).
    #[arg(long, value_name = "P", value_parser = parse_probability, allow_hyphen_values = true)]
    pub install_write_fail: Option<f64>,

    /// Probability that a serving replica finds its checkpoint unreadable when building an
    /// offer (it answers unavailable).
    #[arg(long, value_name = "P", value_parser = parse_probability, allow_hyphen_values = true)]
    pub offer_unreadable: Option<f64>,

    /// Print every event of the run to stderr (with `--seed`; the trace the digest covers).
    #[arg(long, conflicts_with = "seeds")]
    pub trace: bool,

    /// Threads for `--seeds`, 1..=1024 (default: the CPUs this process may use).
    #[arg(
        long,
        value_name = "N",
        allow_hyphen_values = true,
        value_parser = whole_number("a thread count", 1, JOBS_MAX)
    )]
    pub jobs: Option<u32>,
}

/// Parses a probability flag: a number in 0..=1.
///
/// # Errors
/// The text is not a number, or the number is outside 0..=1.
pub fn parse_probability(text: &str) -> Result<f64, String> {
    let value: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{text:?} is not a number (a probability from 0 to 1, e.g. 0.05)"))?;
    if !(0.0..=1.0).contains(&value) {
        return Err(format!(
            "{value} is not a probability: it must be from 0 to 1"
        ));
    }
    Ok(value)
}

/// Parses `A..B` (B excluded, B > A, at most `SEED_COUNT_MAX` seeds).
///
/// # Errors
/// Not two numbers joined by `..`, an empty range, or one of more than `SEED_COUNT_MAX` seeds.
pub fn parse_seed_range(text: &str) -> Result<Range<u64>, String> {
    let (start, end) = text
        .split_once("..")
        .ok_or_else(|| format!("{text:?} is not a seed range A..B (e.g. 1..2000, B excluded)"))?;
    let parse = |part: &str| {
        part.trim().parse::<u64>().map_err(|_| {
            format!(
                "{text:?}: {part:?} is not a seed: use a whole number from 0 to {}",
                u64::MAX
            )
        })
    };
    let (start, end) = (parse(start)?, parse(end)?);
    if end <= start {
        return Err(format!(
            "{text:?} is empty: B must be above A (B is excluded)"
        ));
    }
    let seed_count = end - start;
    if seed_count > SEED_COUNT_MAX {
        return Err(format!(
            "{text:?} is {seed_count} seeds: a range runs at most {SEED_COUNT_MAX} seeds (B - A)"
        ));
    }
    Ok(start..end)
}

/// Parses `--replicas`: 3 or 5.
///
/// # Errors
/// Any other value.
pub fn parse_replica_count(text: &str) -> Result<u8, String> {
    match text.trim() {
        "3" => Ok(3),
        "5" => Ok(5),
        _ => Err(format!(
            "{text:?}: the simulator runs 3 or 5 replicas (a single replica has no peers to fault)"
        )),
    }
}

/// Parses `--clients`: 1..=32 (below the client table's size, so no session is evicted).
///
/// # Errors
/// Not a number, or outside 1..=32.
pub fn parse_client_count(text: &str) -> Result<usize, String> {
    match text.trim().parse::<usize>() {
        Ok(count) if (1..=32).contains(&count) => Ok(count),
        _ => Err(format!("{text:?} is not a client count from 1 to 32")),
    }
}

impl SimArgs {
    /// The run parameters these flags name.
    pub fn config(&self) -> SimConfig {
        let base = if self.transfer {
            SimConfig::default().with_transfer()
        } else {
            SimConfig::default()
        };
        let config = SimConfig {
            replica_count: self.replicas,
            ticks: self.ticks,
            liveness_ticks: self.liveness_ticks,
            requests: self.requests,
            clients: self.clients,
            packet_loss: self.packet_loss,
            packet_duplicate: self.packet_duplicate,
            partition: self.partition,
            crash: self.crash,
            torn_write: self.torn_write,
            read_corruption: self.read_corruption,
            echo_trace: self.trace,
            ..base
        };
        SimConfig {
            journal_segment_ops: self
                .journal_segment_ops
                .unwrap_or(config.journal_segment_ops),
            chunk_corruption: self.chunk_corruption.unwrap_or(config.chunk_corruption),
            install_write_fail: self.install_write_fail.unwrap_or(config.install_write_fail),
            offer_unreadable: self.offer_unreadable.unwrap_or(config.offer_unreadable),
            ..config
        }
    }
}

/// Runs `shardline sim`: prints one line per seed, the failure details of each failing seed,
/// and a summary (seeds, failures, simulated ticks, ticks per wall second).
///
/// # Errors
/// Writing to stdout failed. A failing seed is not an error here: the caller exits non-zero
/// when the returned count of failures is not 0.
pub fn run(args: &SimArgs) -> std::io::Result<usize> {
    let config = args.config();
    quiet_panic_hook();
    let seeds = match (&args.seeds, args.seed) {
        (Some(range), _) => range.clone(),
        (None, Some(seed)) => seed..seed.saturating_add(1),
        (None, None) => unreachable!("clap requires --seed or --seeds"),
    };
    let jobs = args.jobs.map_or_else(
        || std::thread::available_parallelism().map_or(1, std::num::NonZero::get),
        |jobs| jobs as usize,
    );
    let started = Instant::now();
    let mut stdout = std::io::stdout().lock();
    let mut write_error = None;
    let mut failures = 0usize;
    let mut ticks = 0u64;
    let mut fault_count = 0u64;
    let mut transfers = TransferStats::default();
    let reports = run_seeds(&config, seeds, jobs, |report| {
        ticks += report.ticks;
        fault_count += report.faults.total();
        transfers.add(&report.transfers);
        let mut text = report.line();
        text.push('\n');
        if let Some(failure) = &report.failure {
            failures += 1;
            // Err: writing to a String never fails.
            let _ = write!(
                text,
                "  seed {} violated rule {}: {}\n  last events:\n",
                report.seed, failure.rule, failure.detail
            );
            for event in &failure.last_events {
                let _ = writeln!(text, "    {event}");
            }
        }
        if write_error.is_none()
            && let Err(error) = stdout.write_all(text.as_bytes())
        {
            write_error = Some(error);
        }
    });
    if let Some(error) = write_error {
        return Err(error);
    }
    let wall_s = started.elapsed().as_secs_f64();
    writeln!(
        stdout,
        "seeds {} failures {failures} ticks {ticks} faults {fault_count} wall {wall_s:.2} s \
         ticks/s {:.0} (jobs {jobs})",
        reports.len(),
        ticks as f64 / wall_s.max(1e-9)
    )?;
    if transfers != TransferStats::default() {
        writeln!(stdout, "transfers {transfers}")?;
    }
    Ok(failures)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_values_are_validated_with_clear_errors() {
        assert_eq!(parse_probability("0.05"), Ok(0.05));
        assert_eq!(parse_probability("1"), Ok(1.0));
        assert!(
            parse_probability("1.5")
                .unwrap_err()
                .contains("from 0 to 1")
        );
        assert!(
            parse_probability("-0.1")
                .unwrap_err()
                .contains("from 0 to 1")
        );
        assert!(parse_probability("x").unwrap_err().contains("not a number"));
        assert_eq!(parse_seed_range("1..2000"), Ok(1..2000));
        assert!(parse_seed_range("5..5").unwrap_err().contains("empty"));
        assert!(parse_seed_range("5").unwrap_err().contains("A..B"));
        assert!(parse_seed_range("a..5").unwrap_err().contains("\"a\""));
        assert_eq!(parse_seed_range("0..10000000"), Ok(0..SEED_COUNT_MAX));
        assert_eq!(
            parse_seed_range("0..10000001"),
            Err(
                "\"0..10000001\" is 10000001 seeds: a range runs at most 10000000 seeds (B - A)"
                    .to_owned()
            )
        );
        assert_eq!(parse_replica_count("5"), Ok(5));
        assert!(parse_replica_count("4").unwrap_err().contains("3 or 5"));
        assert!(parse_client_count("0").is_err());
    }
}
