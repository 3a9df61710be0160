//! `shardline sim` as CI runs it: a fixed range of seeds through the library API (not the
//! binary), each of which must break no rule; the seeds that once failed, as regression tests;
//! the same seed giving the same trace digest twice; and checks that the checker does catch a
//! forged commit, a forged reply and a diverging state digest (a checker that cannot fail is
//! worthless).
//!
//! Sized for CI's debug build on 2 cores: see `CI_SEEDS` and `ci_config`.

use shardline::sim::cluster::TransferStats;
use shardline::sim::{SeedReport, SimArgs, SimConfig, run_seed, run_seed_with, run_seeds};
use shards::vsr::client_table::CachedReply;
use shards::vsr::message::ClientReply;

/// The seeds every CI run simulates.
const CI_SEEDS: std::ops::Range<u64> = 0..200;

/// A shorter run than the CLI default (debug builds are ~20x slower than release), with the
/// default fault probabilities raised so every kind of fault shows up in most seeds.
fn ci_config() -> SimConfig {
    SimConfig {
        ticks: 2000,
        requests: 50,
        crash: 0.004,
        partition: 0.004,
        read_corruption: 0.002,
        ..SimConfig::default()
    }
}

fn failure_text(report: &SeedReport) -> String {
    let Some(failure) = &report.failure else {
        return report.line();
    };
    format!(
        "{}\n  rule {}: {}\n  last events:\n    {}",
        report.line(),
        failure.rule,
        failure.detail,
        failure.last_events.join("\n    ")
    )
}

fn jobs() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

#[test]
fn every_ci_seed_passes() {
    let config = ci_config();
    let reports = run_seeds(&config, CI_SEEDS, jobs(), |_| {});
    assert_eq!(reports.len(), (CI_SEEDS.end - CI_SEEDS.start) as usize);
    let failures: Vec<String> = reports
        .iter()
        .filter(|report| report.failure.is_some())
        .map(failure_text)
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} seeds failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
    // The run must actually have exercised the faults it claims to check.
    let crashes: u64 = reports.iter().map(|report| report.faults.crashes).sum();
    let partitions: u64 = reports.iter().map(|report| report.faults.partitions).sum();
    let torn: u64 = reports.iter().map(|report| report.faults.torn_writes).sum();
    let corruptions: u64 = reports.iter().map(|report| report.faults.corruptions).sum();
    assert!(
        crashes > 0 && partitions > 0 && torn > 0 && corruptions > 0,
        "crashes {crashes} partitions {partitions} torn {torn} corruptions {corruptions}"
    );
    assert!(reports.iter().all(|report| report.commit > 0));
}

/// A lossy, often partitioned network with crashes (most findings came from such settings).
#[test]
fn harsh_networks_pass() {
    let config = SimConfig {
        packet_loss: 0.2,
        packet_duplicate: 0.05,
        partition: 0.01,
        crash: 0.005,
        ..ci_config()
    };
    for report in run_seeds(&config, 0..100, jobs(), |_| {}) {
        assert!(report.failure.is_none(), "{}", failure_text(&report));
    }
}

#[test]
fn five_replicas_pass_too() {
    let config = SimConfig {
        replica_count: 5,
        packet_loss: 0.1,
        partition: 0.01,
        ..ci_config()
    };
    for report in run_seeds(&config, 0..50, jobs(), |_| {}) {
        assert!(report.failure.is_none(), "{}", failure_text(&report));
    }
}

#[test]
fn the_same_seed_gives_the_same_trace_digest_twice() {
    let config = ci_config();
    let first = run_seed(&config, 42);
    let second = run_seed(&config, 42);
    assert_eq!(first, second);
    assert!(first.event_count > 1000, "{}", first.event_count);
    let other = run_seed(&config, 43);
    assert_ne!(first.trace_digest, other.trace_digest);
    // Run on several threads, a seed's outcome is the same as alone.
    let together = run_seeds(&config, 41..44, 3, |_| {});
    assert_eq!(together[1], first);
    assert_eq!(together[2], other);
}

#[test]
fn the_checker_catches_a_forged_commit() {
    let report = run_seed_with(&ci_config(), 7, |world| {
        world.checker_mut().on_commit(2, 1, 0xdead_beef)
    });
    let failure = report
        .failure
        .expect("a forged commit at op 1 must fail the seed");
    assert_eq!(failure.rule, "agreement");
    assert!(
        failure.detail.contains("op 1: replica 2"),
        "{}",
        failure.detail
    );
    assert!(!failure.last_events.is_empty());
}

#[test]
fn the_checker_catches_a_reply_nobody_committed_and_a_diverging_digest() {
    let forged = ClientReply::Committed(CachedReply {
        request: 999,
        operation: 2,
        error_code: 0,
        offset: 0,
        count: 0,
        body: Vec::new(),
        request_checksum: 0,
    });
    let report = run_seed_with(&ci_config(), 8, |world| {
        world.checker_mut().on_reply(0x1000, 999, &forged)
    });
    assert_eq!(report.failure.expect("forged reply").rule, "exactly-once");

    let report = run_seed_with(&ci_config(), 9, |world| {
        world.checker_mut().on_digest(1, 1, 0x0bad)?;
        world.checker_mut().on_digest(2, 1, 0x0bad)
    });
    assert_eq!(
        report.failure.expect("diverging digest").rule,
        "state-digest"
    );
}

/// The seeds of the state-transfer scenario (issue 9) every CI run simulates.
const TRANSFER_SEEDS: std::ops::Range<u64> = 0..50;

/// The state-transfer scenario (`shardline sim --transfer`) with five replicas, so that besides
/// the lagging replica a crash or a partition of the serving primary fits the fault budget of 2,
/// and with crashes and partitions frequent enough that some land in the middle of a transfer.
fn transfer_config() -> SimConfig {
    SimConfig {
        replica_count: 5,
        ticks: 2000,
        // Enough that the clients still commit (and the primary checkpoints) while the lagging
        // replica transfers.
        requests: 150,
        crash: 0.015,
        partition: 0.01,
        packet_loss: 0.05,
        ..SimConfig::default().with_transfer()
    }
}

/// Issue 9, "Tests it must have": in `shardline sim`, transfers under packet loss, chunk
/// corruption, a primary crash mid-transfer, a view change mid-transfer and a new checkpoint
/// mid-transfer; safety and convergence hold on every seed. The range must actually have
/// transferred, installed and been interrupted in every way, so this fails if state transfer
/// silently stops happening.
#[test]
fn issue9_transfers_keep_safety_and_converge_under_faults() {
    let reports = run_seeds(&transfer_config(), TRANSFER_SEEDS, jobs(), |_| {});
    let failures: Vec<String> = reports
        .iter()
        .filter(|report| report.failure.is_some())
        .map(failure_text)
        .collect();
    assert!(
        failures.is_empty(),
        "{} of {} transfer seeds failed:\n{}",
        failures.len(),
        reports.len(),
        failures.join("\n")
    );
    let mut total = TransferStats::default();
    for report in &reports {
        total.add(&report.transfers);
    }
    let lost: u64 = reports
        .iter()
        .map(|report| report.faults.packets_lost)
        .sum();
    let exercised = [
        ("transfers started", total.started),
        ("installs", total.installs),
        ("chunks corrupted", total.chunks_corrupted),
        ("packets lost", lost),
        (
            "primary crashes mid-transfer",
            total.interrupted_by_primary_crash,
        ),
        (
            "view changes mid-transfer",
            total.interrupted_by_view_change,
        ),
        (
            "new checkpoints mid-transfer",
            total.interrupted_by_new_checkpoint,
        ),
    ];
    let missing: Vec<&str> = exercised
        .iter()
        .filter(|(_, count)| *count == 0)
        .map(|(what, _)| *what)
        .collect();
    assert!(missing.is_empty(), "never happened: {missing:?} ({total})");
}

/// The install check can fail: an install of a state no replica had at that commit point is
/// reported as `install-committed-state`.
#[test]
fn issue9_the_checker_catches_an_install_of_a_state_nobody_committed() {
    let report = run_seed_with(&transfer_config(), 3, |world| {
        let op = world.committed_op_max();
        world.checker_mut().on_install(1, op + 1, 0x0bad)
    });
    assert_eq!(
        report.failure.expect("a forged install").rule,
        "install-committed-state"
    );
}

/// Seeds that once failed, with the `shardline sim` flags they failed under (the rest are the
/// CLI's defaults) and their finding in the simulator findings log (F1..): reproduce one with
/// `shardline sim --seed SEED FLAGS --trace`.
const REGRESSION_SEEDS: &[(u64, &str, &str)] = &[
    (
        19,
        "",
        "F1 session-kept: a new primary answered Evicted for a Register above its commit",
    ),
    (46, "", "F1 session-kept"),
    (369, "", "F1 session-kept"),
    (382, "", "F1 session-kept"),
    (47, "--replicas 5", "F1 session-kept"),
    (
        106,
        "",
        "F2 superblock-monotonic: a restarted replica wrote a lower commit_max",
    ),
    (364, "", "F2 superblock-monotonic"),
    (
        167,
        "",
        "F3 agreement: stale prepares kept under a later log_view, then committed",
    ),
    (392, "", "F3 agreement"),
    (487, "--replicas 5", "F3 agreement"),
    (
        642,
        "--replicas 5",
        "F3 agreement: one replica committed two prepares at one op",
    ),
    (
        1048,
        "",
        "F4 liveness: a new primary chose a shorter log of the same log_view",
    ),
    (
        455,
        "--partition 0.02",
        "F3/F4 session-kept: a new primary started view 11 at op 0",
    ),
    (72, "--partition 0.02", "F3/F4 agreement"),
    (
        357,
        "--packet-loss 0.3 --packet-duplicate 0.1",
        "F3/F4 agreement",
    ),
    (16, "--crash 0.02 --torn-write 1", "F3/F4 liveness"),
    (
        433,
        LOSSY,
        "F5 session-kept: an isolated old primary answered Evicted",
    ),
    (143, LOSSY, "F5 session-kept"),
    (
        161,
        LOSSY,
        "F6 liveness: a primary committed op 103 but never applied it",
    ),
    (255, LOSSY, "F6 liveness"),
    (463, "--replicas 5 --packet-loss 0.2", "F5 session-kept"),
    (
        490,
        FIVE_FAULTY,
        "F7 liveness: a replica with an empty journal stops repairing",
    ),
    (68, FIVE_FAULTY, "F7 liveness"),
    (449, FIVE_FAULTY, "F7 liveness"),
    (
        122,
        FIVE_FAULTY,
        "F7 liveness: peers serve headers only for in-memory prepares",
    ),
    (
        412,
        FIVE_FAULTY,
        "F7 liveness; F9 RequestHeaders never answered",
    ),
    (157, FIVE_FAULTY, "F7 liveness"),
    (478, LOSSY, "F5 session-kept"),
    (
        105,
        "--replicas 5 --packet-loss 0.2",
        "F8 agreement: a stale view-5 prepare installed in view 7",
    ),
    (
        1547,
        LOSSY,
        "F10 agreement: a DVC from a log cut at a corrupt record dropped an acked op",
    ),
    (
        257,
        HARSH_TRANSFER,
        "T1 liveness (simulator model): chunk corruption, failed install writes and unreadable \
         offers went on after the heal, so a receiver never finished its transfer",
    ),
];

/// The harshest state-transfer scan (issue 9): five replicas, every fault raised.
const HARSH_TRANSFER: &str = "--transfer --replicas 5 --crash 0.02 --partition 0.02 \
     --packet-loss 0.2 --packet-duplicate 0.1 --torn-write 1 --read-corruption 0.005 \
     --chunk-corruption 0.1 --install-write-fail 0.2 --offer-unreadable 0.1 \
     --journal-segment-ops 4";

/// Five replicas with frequent partitions and crashes (the scan that found F7).
const FIVE_FAULTY: &str = "--replicas 5 --partition 0.02 --crash 0.01";

/// The flags of the lossy-network scan that found F5 and F6.
const LOSSY: &str = "--packet-loss 0.3 --packet-duplicate 0.1";

/// `shardline sim`'s flags, parsed as the CLI parses them.
#[derive(Debug, clap::Parser)]
struct Flags {
    #[command(flatten)]
    sim: SimArgs,
}

fn config_of(seed: u64, flags: &str) -> SimConfig {
    let arguments = format!("sim --seed {seed} {flags}");
    let flags = <Flags as clap::Parser>::try_parse_from(arguments.split_whitespace())
        .unwrap_or_else(|error| panic!("{arguments}: {error}"));
    flags.sim.config()
}

/// `--transfer` turns the scenario on with its defaults; an explicit transfer flag overrides
/// them; without `--transfer` nothing of it is on (the other CI seeds keep their runs).
#[test]
fn issue9_transfer_flags_set_the_scenario() {
    let config = config_of(1, "--transfer --chunk-corruption 0.5");
    assert!(config.lagging_replica);
    assert_eq!(config.journal_retain_ops, 0);
    assert_eq!(
        config.journal_segment_ops,
        shardline::sim::TRANSFER_JOURNAL_SEGMENT_OPS
    );
    // Probabilities compared bit for bit: they are copied, never computed.
    assert_eq!(config.chunk_corruption.to_bits(), 0.5f64.to_bits());
    assert_eq!(
        config.install_write_fail.to_bits(),
        shardline::sim::TRANSFER_INSTALL_WRITE_FAIL.to_bits()
    );
    let plain = config_of(1, "--journal-segment-ops 4");
    assert!(!plain.lagging_replica);
    assert_eq!(plain.journal_segment_ops, 4);
    assert_eq!(
        (
            plain.chunk_corruption.to_bits(),
            plain.install_write_fail.to_bits(),
            plain.offer_unreadable.to_bits()
        ),
        (0, 0, 0)
    );
}

#[test]
fn seeds_that_once_failed_pass() {
    let failures: Vec<String> = REGRESSION_SEEDS
        .iter()
        .filter_map(|&(seed, flags, finding)| {
            let report = run_seed(&config_of(seed, flags), seed);
            report
                .failure
                .is_some()
                .then(|| format!("({finding}; flags {flags:?})\n{}", failure_text(&report)))
        })
        .collect();
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
