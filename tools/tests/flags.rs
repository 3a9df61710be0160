//! Bad flags exit non-zero with a message naming the key, the value and the rule; `--shards all`
//! under `taskset -c 1` runs exactly one shard pinned to CPU 1. Client commands too: a count out
//! of range meets its range rule first (never descriptor advice), a negative number reaches the
//! flag's parser (never clap's "unexpected argument"), and a duration in a unit not taken (`2h`)
//! or too large says which units are taken and the largest value. Every whole-number, size and
//! duration flag of `serve`, `sim` and `doctor` refuses `-1` and a value out of its range with
//! exit 2, naming the flag, the value and the range.

mod common;

use std::process::Command;

use common::{BIN, Server};

fn serve_error(args: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(dir.path())
        .args(args)
        .output()
        .unwrap();
    assert!(!output.status.success(), "{args:?} should fail");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Runs `shardline ARGS` against no server (each case fails while parsing its arguments) and
/// returns its stderr, asserting exit status 2 (a usage error).
fn usage_error(args: &[&str]) -> String {
    let output = Command::new(BIN).args(args).output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{args:?}: {stderr}");
    stderr
}

/// The `error: ` line of a stderr that also holds log lines.
fn error_line(stderr: &str) -> &str {
    stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("no error line in {stderr}"))
}

fn allowed_cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

#[test]
fn shards_zero_is_rejected() {
    let message = serve_error(&["--shards", "0"]);
    assert!(
        message.contains(
            "error: invalid value '0' for '--shards <N|all>': shard count must be between 1 and \
             1024"
        ),
        "{message}"
    );
}

#[test]
fn more_shards_than_cores_without_no_pin_is_rejected() {
    let shards = (allowed_cpu_count() + 1).to_string();
    let message = serve_error(&["--shards", &shards]);
    assert!(message.contains(&format!("--shards {shards}")), "{message}");
    let allowed = allowed_cpu_count();
    let cores = if allowed == 1 { "core" } else { "cores" };
    assert!(
        message.contains(&format!(
            "more shards than allowed cores ({allowed} allowed {cores}: "
        )) && message.contains(
            "); lower --shards, or pass --no-pin to overprovision (--shards from the command \
                 line; --no-pin from its default)"
        ),
        "{message}"
    );
}

/// With `--cpus`, the cores are its list: the refusal says so, names where `--cpus` came from
/// (not `--no-pin`'s default, which cannot help), and advises only what the flags allow.
#[test]
fn more_shards_than_the_cpus_list_names_cpus_and_not_no_pin() {
    let first = runtime::topology::allowed_cpus().unwrap()[0].to_string();
    let rule = format!(
        "--shards 2: more shards than the cores --cpus lists (1 allowed core: {first}); lower \
         --shards, or widen or drop --cpus (--no-pin is refused with it)"
    );
    let message = serve_error(&["--cpus", &first, "--shards", "2"]);
    assert_eq!(
        error_line(&message),
        format!("error: {rule} (--shards from the command line; --cpus from the command line)")
    );
    let dir = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "2",
            "--data-dir",
        ])
        .arg(dir.path())
        .env("SHARDLINE_CPUS", &first)
        .output()
        .unwrap();
    assert_eq!(
        error_line(&String::from_utf8_lossy(&output.stderr)),
        format!("error: {rule} (--shards from the command line; --cpus from SHARDLINE_CPUS)")
    );
    // The bench checks the same rule before starting a server, with its own flags.
    let root = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args([
            "bench",
            "--cpus",
            &first,
            "--shards",
            "2",
            "--messages",
            "10",
        ])
        .arg("--data-root")
        .arg(root.path())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        String::from_utf8_lossy(&output.stderr),
        format!("error: {rule}\n")
    );
    assert_eq!(std::fs::read_dir(root.path()).unwrap().count(), 0);
}

#[test]
fn cpu_outside_the_allowed_set_is_rejected() {
    let message = serve_error(&["--cpus", "99"]);
    assert!(
        message.contains("--cpus 99") && message.contains("CPU 99 is not in the allowed set"),
        "{message}"
    );
}

#[test]
fn reversed_cpu_range_is_rejected() {
    let message = serve_error(&["--cpus", "3-1"]);
    assert!(
        message.contains("--cpus") && message.contains("3-1"),
        "{message}"
    );
    assert!(
        message.contains("start") && message.contains("end"),
        "{message}"
    );
}

#[test]
fn tiny_max_message_size_is_rejected() {
    let message = usage_error(&["serve", "--max-message-size", "100"]);
    assert!(
        message.contains(
            "invalid value '100' for '--max-message-size <BYTES>': must be between 1024 and \
             67108864 bytes"
        ),
        "{message}"
    );
}

#[test]
fn unknown_fsync_policy_is_rejected() {
    let message = serve_error(&["--fsync", "sometimes"]);
    assert!(
        message.contains("--fsync") && message.contains("sometimes"),
        "{message}"
    );
}

#[test]
fn unknown_write_mode_is_rejected() {
    let message = serve_error(&["--write-mode", "odirect"]);
    assert!(
        message.contains("--write-mode")
            && message.contains("odirect")
            && message.contains("\"buffered\" or \"direct\""),
        "{message}"
    );
}

#[test]
fn partition_count_above_the_limit_names_the_range_not_descriptors() {
    let message = usage_error(&[
        "topic",
        "create",
        "1",
        "1",
        "t",
        "--partitions",
        "100000000",
    ]);
    assert!(
        message.contains(
            "invalid value '100000000' for '--partitions <PARTITIONS>': \"100000000\" is not a \
             partition count: use a whole number from 1 to 4096"
        ),
        "{message}"
    );
    assert!(!message.contains("ulimit"), "{message}");
}

/// A client that skips the CLI gets the range rule from the server too, before the open-file
/// budget (whose advice, `ulimit -n`, would be wrong for a count no limit can allow).
#[test]
fn server_checks_the_partition_range_before_the_descriptor_budget() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--shards", "1", "--no-pin"]);
    common::block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        for count in [100_000_000, 4097, 0] {
            match client.create_topic(1, 1, "t", count).await {
                Err(bus::ClientError::Server {
                    code: bus::ErrorCode::InvalidArgument,
                    message,
                }) => assert_eq!(
                    message,
                    format!("partition count must be between 1 and 4096, got {count}")
                ),
                other => panic!("{count} partitions: expected InvalidArgument, got {other:?}"),
            }
        }
        // In range, the count goes on to the budget and the rest (4096 itself may exceed this
        // host's open-file budget, which is then the right answer).
        client.create_topic(1, 1, "t", 8).await.unwrap();
    });
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn negative_numbers_reach_the_value_parser_and_get_its_rule() {
    for (args, expected) in [
        (
            &["topic", "create", "1", "1", "t", "--partitions", "-1"][..],
            "invalid value '-1' for '--partitions <PARTITIONS>': \"-1\" is not a partition \
             count: use a whole number from 1 to 4096",
        ),
        (
            &["topic", "create", "1", "-1", "t"],
            "invalid value '-1' for '[ID]': \"-1\" is not a topic id: use a whole number from 1 \
             to 65535",
        ),
        (
            &["stream", "create", "-3", "s"],
            "invalid value '-3' for '[ID]': \"-3\" is not a stream id: use a whole number from 1 \
             to 4294967295",
        ),
        (
            &["topic", "create", "1", "1", "t", "--retention-bytes", "-5"],
            "invalid value '-5' for '--retention-bytes <SIZE>': \"-5\" is not a retention size: \
             use bytes (e.g. 1073741824), or a whole number with a suffix KiB, MiB, GiB or TiB \
             (e.g. 512MiB, 1GiB); 0 keeps every byte",
        ),
        (
            &["topic", "alter", "1", "1", "--retention-ms", "-1h"],
            "invalid value '-1h' for '--retention-ms <DURATION>': \"-1h\" is not a retention \
             age: use milliseconds (e.g. 3600000) or a whole number with a unit ms, s, m, h or d \
             (e.g. 90s, 12h, 7d); 0 keeps messages of any age",
        ),
        (
            &["poll", "--stream", "1", "--topic", "1", "--offset", "-1"],
            "invalid value '-1' for '--offset <OFFSET>': \"-1\" is not an offset: use a whole \
             number from 0 to 18446744073709551615",
        ),
        (
            &["poll", "--stream", "1", "--topic", "1", "--partition", "-2"],
            "invalid value '-2' for '--partition <PARTITION>': \"-2\" is not a partition id: \
             use a whole number from 0 to 65535",
        ),
        (
            &["poll", "--stream", "1", "--topic", "1", "--count", "-10"],
            "invalid value '-10' for '--count <COUNT>': \"-10\" is not a message count: use a \
             whole number from 1 to 4294967295",
        ),
        (
            &["send", "--stream", "1", "--topic", "1", "--batch", "-1"],
            "invalid value '-1' for '--batch <BATCH>': \"-1\" is not a batch size: use a whole \
             number from 1 to 1048576",
        ),
        (
            &["metadata", "--timeout", "-5s"],
            "invalid value '-5s' for '--timeout <DURATION>': \"-5s\" is not a duration: use a \
             whole number of seconds (5, 5s), milliseconds (300ms) or minutes (2m), no other \
             unit, at most 3600 s (60m) for the request timeout",
        ),
    ] {
        let message = usage_error(args);
        assert!(message.contains(expected), "{args:?}: {message}");
        assert!(
            !message.contains("unexpected argument"),
            "{args:?}: {message}"
        );
    }
}

#[test]
fn negative_shard_count_names_the_range() {
    let message = serve_error(&["--shards", "-2"]);
    assert!(
        message.contains(
            "invalid value '-2' for '--shards <N|all>': expected `all` or a whole number of shards \
             from 1 to 1024"
        ),
        "{message}"
    );
    let message = serve_error(&["--segment-size", "-4KiB"]);
    assert!(
        message.contains(
            "invalid value '-4KiB' for '--segment-size <BYTES>': \"-4KiB\" is not a size"
        ),
        "{message}"
    );
}

/// Asserts that `shardline SUBCOMMAND [before...] FLAG VALUE` exits 2 with clap's
/// `invalid value 'VALUE' for 'FLAG <...>'` (the flag and the value) followed, on the same
/// line, by a text that holds `rule`, and never with clap's "unexpected argument".
fn assert_refused(subcommand: &str, before: &[&str], flag: &str, value: &str, rule: &str) {
    let args: Vec<&str> = [subcommand]
        .into_iter()
        .chain(before.iter().copied())
        .chain([flag, value])
        .collect();
    let message = usage_error(&args);
    let line = message
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("{args:?}: no error line in {message}"));
    let framing = format!("error: invalid value '{value}' for '{flag} <");
    assert!(line.starts_with(&framing), "{args:?}: {line}");
    assert!(line.contains(rule), "{args:?}: expected {rule:?} in {line}");
    assert!(
        !message.contains("unexpected argument"),
        "{args:?}: {message}"
    );
}

/// Every whole-number, size and duration flag of `serve`: `-1` and a value out of range each
/// exit 2 naming the flag, the value and the rule (the range, in the flag's unit).
#[test]
fn serve_flags_refuse_negative_and_out_of_range_values_naming_the_rule() {
    for (flag, out_of_range, rule) in [
        (
            "--max-message-size",
            "100",
            "must be between 1024 and 67108864 bytes",
        ),
        (
            "--inbox-capacity",
            "1048577",
            "must be between 1 and 1048576 frames",
        ),
        (
            "--segment-size",
            "2GiB",
            "must be between 4096 and 1073741824 bytes",
        ),
        ("--idle-poll-us", "10001", "must be between 0 and 10000 µs"),
        (
            "--idle-timeout-s",
            "0",
            "must be between 1 and 86400 seconds",
        ),
        (
            "--clients-table-max",
            "0",
            "must be between 1 and 1048576 sessions",
        ),
        (
            "--parked-polls-max",
            "1048577",
            "must be between 1 and 1048576 parked polls per shard",
        ),
        (
            "--checkpoint-interval",
            "0",
            "must be between 1 and 1048576 ops",
        ),
        (
            "--journal-segment-size",
            "65MiB",
            "must be between 65536 and 67108864 bytes",
        ),
        ("--tick-ms", "1001", "must be between 1 and 1000 ms"),
        (
            "--heartbeat-ticks",
            "0",
            "must be between 1 and 1000000 ticks",
        ),
        (
            "--view-change-timeout-ticks",
            "1000001",
            "must be between 2 and 1000000 ticks",
        ),
        (
            "--replica",
            "5",
            "is not a replica index: use a whole number from 0 to 4",
        ),
        (
            "--group-session-timeout",
            "50ms",
            "the smallest group session timeout, 100 ms",
        ),
        (
            "--retention-interval",
            "1ms",
            "the smallest retention interval, 10 ms",
        ),
    ] {
        assert_refused("serve", &[], flag, out_of_range, rule);
        assert_refused("serve", &[], flag, "-1", rule_of_negative(flag, rule));
    }
    // A malformed negative value reaches the parser too (clap would take `-5k` for a flag).
    for (flag, value, rule) in [
        (
            "--tick-ms",
            "-5k",
            "\"-5k\" is not a whole number; must be between 1 and 1000 ms",
        ),
        ("--replica", "-one", "\"-one\" is not a replica index"),
        (
            "--shards",
            "-all",
            "a whole number of shards from 1 to 1024",
        ),
    ] {
        assert_refused("serve", &[], flag, value, rule);
    }
    // Not a whole number at all: said so, with the range.
    assert_refused(
        "serve",
        &[],
        "--tick-ms",
        "1e3",
        "\"1e3\" is not a whole number; must be between 1 and 1000 ms",
    );
    assert_refused(
        "serve",
        &[],
        "--cluster",
        "-1",
        "\"-1\" is not a cluster id: use a decimal number (e.g. 7) or 0x-prefixed hex",
    );
    assert_refused(
        "serve",
        &[],
        "--shards",
        "1025",
        "shard count must be between 1 and 1024",
    );
    assert_refused(
        "serve",
        &[],
        "--shards",
        "-1",
        "a whole number of shards from 1 to 1024",
    );
}

/// `-0` is 0 to a reader: refused (unsigned flags take no sign) with a message that says so,
/// never one that refuses 0 by a range holding it (`--idle-poll-us -0` said "must be between 0
/// and 10000 µs"). Each exits 2 naming the flag and the value.
#[test]
fn minus_zero_is_refused_for_its_sign_not_by_a_range_that_holds_zero() {
    for (subcommand, before, flag, rule) in [
        (
            "serve",
            &[][..],
            "--idle-poll-us",
            "\"-0\" has a minus sign, which no whole number here takes; must be between 0 and \
             10000 µs",
        ),
        (
            "serve",
            &[],
            "--tick-ms",
            "\"-0\" has a minus sign, which no whole number here takes; must be between 1 and \
             1000 ms",
        ),
        (
            "serve",
            &[],
            "--replica",
            "\"-0\" is not a replica index: use a whole number from 0 to 4, without a minus sign",
        ),
        (
            "sim",
            &["--seed", "1"],
            "--requests",
            "\"-0\" is not a request count: use a whole number from 0 to 1000000, without a minus \
             sign",
        ),
        (
            "bench",
            &[],
            "--idle-poll-us",
            "\"-0\" is not an idle poll in microseconds: use a whole number from 0 to 10000, \
             without a minus sign",
        ),
    ] {
        assert_refused(subcommand, before, flag, "-0", rule);
    }
}

/// The rule `-1` meets for `flag`, whose out-of-range value meets `rule`: the same, but for the
/// durations, whose `-1` is no duration (the message gives the units and both bounds).
fn rule_of_negative<'a>(flag: &str, rule: &'a str) -> &'a str {
    match flag {
        "--group-session-timeout" => {
            "at most 3600 s (60m) for the group session timeout; the smallest is 100 ms"
        }
        "--retention-interval" => {
            "at most 86400 s (1440m) for the retention interval; the smallest is 10 ms"
        }
        _ => rule,
    }
}

/// Every whole-number and probability flag of `sim`: `-1` and a value out of range each exit 2
/// naming the flag, the value and the rule.
#[test]
fn sim_flags_refuse_negative_and_out_of_range_values_naming_the_rule() {
    const SEED: &[&str] = &["--seed", "1"];
    let u64_max = u64::MAX.to_string();
    let seed_rule = format!("is not a seed: use a whole number from 0 to {u64_max}");
    for (before, flag, out_of_range, rule) in [
        (
            &[][..],
            "--seed",
            "18446744073709551616",
            seed_rule.as_str(),
        ),
        (
            &[],
            "--seeds",
            "1..18446744073709551616",
            seed_rule.as_str(),
        ),
        (
            SEED,
            "--replicas",
            "4",
            "the simulator runs 3 or 5 replicas",
        ),
        (
            SEED,
            "--ticks",
            "100000001",
            "is not a tick count: use a whole number from 0 to 100000000",
        ),
        (
            SEED,
            "--liveness-ticks",
            "0",
            "is not a liveness tick count: use a whole number from 1 to 100000000",
        ),
        (
            SEED,
            "--requests",
            "1000001",
            "is not a request count: use a whole number from 0 to 1000000",
        ),
        (
            SEED,
            "--clients",
            "33",
            "is not a client count from 1 to 32",
        ),
        (
            SEED,
            "--journal-segment-ops",
            "0",
            "is not a journal segment record count: use a whole number from 1 to 1000000",
        ),
        (
            &["--seeds", "1..2"],
            "--jobs",
            "1025",
            "is not a thread count: use a whole number from 1 to 1024",
        ),
    ] {
        assert_refused("sim", before, flag, out_of_range, rule);
        let negative = if flag == "--seeds" { "-1..5" } else { "-1" };
        assert_refused("sim", before, flag, negative, rule);
    }
    for flag in [
        "--packet-loss",
        "--packet-duplicate",
        "--partition",
        "--crash",
        "--torn-write",
        "--read-corruption",
        "--chunk-corruption",
        "--install-write-fail",
        "--offer-unreadable",
    ] {
        for value in ["-1", "1.5"] {
            assert_refused(
                "sim",
                SEED,
                flag,
                value,
                "is not a probability: it must be from 0 to 1",
            );
        }
    }
}

/// Every whole-number flag of `doctor`: `-1` and a value out of range each exit 2 naming the
/// flag, the value and the rule.
#[test]
fn doctor_flags_refuse_negative_and_out_of_range_values_naming_the_rule() {
    for (flag, value, rule) in [
        ("--shards", "-1", "a whole number of shards from 1 to 1024"),
        ("--shards", "1025", "shard count must be between 1 and 1024"),
        (
            "--partitions",
            "-1",
            "is not a planned partition count: use a whole number from 1 to 1073741824",
        ),
        (
            "--partitions",
            "1073741825",
            "is not a planned partition count: use a whole number from 1 to 1073741824",
        ),
        (
            "--partitions",
            "0",
            "is not a planned partition count: use a whole number from 1 to 1073741824",
        ),
    ] {
        assert_refused("doctor", &[], flag, value, rule);
    }
}

#[test]
fn durations_in_hours_or_too_long_name_the_units_and_the_largest() {
    for (args, expected) in [
        (
            &["metadata", "--timeout", "2h"][..],
            "invalid value '2h' for '--timeout <DURATION>': \"2h\" is not a duration: use a \
             whole number of seconds (5, 5s), milliseconds (300ms) or minutes (2m), no other \
             unit, at most 3600 s (60m) for the request timeout",
        ),
        (
            &["metadata", "--connect-timeout", "61m"],
            "invalid value '61m' for '--connect-timeout <DURATION>': \"61m\" exceeds the \
             largest connect timeout, 3600 s (60m)",
        ),
        (
            &["serve", "--retention-interval", "1d"],
            "invalid value '1d' for '--retention-interval <DURATION>': \"1d\" is not a \
             duration: use a whole number of seconds (5, 5s), milliseconds (300ms) or minutes \
             (2m), no other unit, at most 86400 s (1440m) for the retention interval",
        ),
        (
            &["serve", "--group-session-timeout", "2h"],
            "invalid value '2h' for '--group-session-timeout <DURATION>': \"2h\" is not a \
             duration: use a whole number of seconds (5, 5s), milliseconds (300ms) or minutes \
             (2m), no other unit, at most",
        ),
    ] {
        let message = usage_error(args);
        assert!(message.contains(expected), "{args:?}: {message}");
    }
}

/// `inspect --help` describes the checksums `inspect segment` checks by the issue-12 rule
/// (storage/FORMAT.md section 3): message checksums over payloads, the entry checksum over the
/// message headers and stamp; never "payload checksum" for the entry checksum of such entries.
#[test]
fn inspect_help_names_what_each_checksum_covers() {
    let output = Command::new(BIN)
        .args(["inspect", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    assert!(
        help.contains(
            "XXH3-64 checksums by the entry's rule: each message's checksum over its payload and \
             the entry checksum over the message headers and stamp, or for an entry from before \
             issue 12 the entry checksum over the whole payload"
        ),
        "{help}"
    );
    assert!(!help.contains("XXH3-64 payload checksum"), "{help}");
}

/// Threads named `shard-*` of a process, with their allowed CPU list.
fn shard_threads(pid: u32) -> Vec<(String, String)> {
    let mut shards = Vec::new();
    for entry in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let task = entry.unwrap().path();
        let comm = std::fs::read_to_string(task.join("comm"))
            .unwrap()
            .trim()
            .to_owned();
        if comm.starts_with("shard-") {
            let status = std::fs::read_to_string(task.join("status")).unwrap();
            let cpus = status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .unwrap()
                .trim()
                .to_owned();
            shards.push((comm, cpus));
        }
    }
    shards
}

#[test]
fn shards_all_under_taskset_runs_one_shard_pinned_to_cpu_1() {
    if allowed_cpu_count() < 2 {
        // CPU 1 does not exist in the mask; the rule cannot be exercised on a 1-CPU machine.
        eprintln!("skipping: needs at least 2 allowed CPUs");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let mut taskset = Command::new("taskset");
    taskset.args(["-c", "1", BIN]);
    let server = Server::start_with(taskset, &dir.path().join("data"), &["--shards", "all"]);
    // compio's blocking-pool threads (spawn_blocking: snapshot encoding, directory creation)
    // inherit their shard's name and CPU mask, so one shard may show up as several threads.
    let mut threads = shard_threads(server.pid());
    threads.dedup();
    assert_eq!(threads, vec![("shard-0".to_owned(), "1".to_owned())]);
    assert_eq!(server.stop(), Some(0));
}

/// New-user review: `sim --seeds 0..18446744073709551615` was accepted and ran until killed. A
/// range runs at most `SEED_COUNT_MAX` seeds; a wider one exits 2 naming flag, value and rule.
#[test]
fn sim_seed_range_wider_than_the_bound_is_refused() {
    assert_refused(
        "sim",
        &[],
        "--seeds",
        "0..18446744073709551615",
        "\"0..18446744073709551615\" is 18446744073709551615 seeds: a range runs at most \
         10000000 seeds (B - A)",
    );
    assert_refused(
        "sim",
        &[],
        "--seeds",
        "5..10000006",
        "\"5..10000006\" is 10000001 seeds: a range runs at most 10000000 seeds (B - A)",
    );
}

/// Values that start with a hyphen but are no number clap knows (`-5k`, `-inf`, `-1e-3`) reach
/// the flag's parser too, so the error names the flag, the value and the rule instead of clap's
/// bare "unexpected argument" (adversarial review, session 9).
#[test]
fn malformed_hyphen_values_of_sim_and_doctor_reach_the_parser() {
    const SEED: &[&str] = &["--seed", "1"];
    assert_refused("sim", SEED, "--ticks", "-5k", "is not a tick count");
    assert_refused(
        "sim",
        SEED,
        "--torn-write",
        "-inf",
        "it must be from 0 to 1",
    );
    assert_refused("sim", SEED, "--crash", "-1e-3", "it must be from 0 to 1");
    assert_refused(
        "doctor",
        &[],
        "--partitions",
        "-1k",
        "is not a planned partition count",
    );
}

/// Runs `shardline ARGS` with the environment variables `env` set, asserting exit status 2 (a
/// usage error), and returns the first line of its stderr.
fn env_usage_error(env: &[(&str, &str)], args: &[&str]) -> String {
    let mut command = Command::new(BIN);
    command.args(args);
    for (name, value) in env {
        command.env(name, value);
    }
    let output = command.output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{env:?} {args:?}: {stderr}");
    stderr.lines().next().unwrap_or_default().to_owned()
}

/// A bad value from a `SHARDLINE_*` variable names the variable it came from (it was not typed
/// as the flag), the value and the rule, exit 2; a bad flag value still names the flag, even
/// where the variable holds the same text, and a variable that a flag overrides is not read.
#[test]
fn a_bad_value_from_the_environment_names_the_variable() {
    for (env, args, expected) in [
        (
            ("SHARDLINE_SHARDS", "0"),
            &["serve"][..],
            "error: SHARDLINE_SHARDS=\"0\" (the environment variable for --shards): shard count \
             must be between 1 and 1024",
        ),
        (
            ("SHARDLINE_TICK_MS", "-0"),
            &["serve"],
            "error: SHARDLINE_TICK_MS=\"-0\" (the environment variable for --tick-ms): \"-0\" has \
             a minus sign, which no whole number here takes; must be between 1 and 1000 ms",
        ),
        (
            ("SHARDLINE_IO_DRIVER", "uring2"),
            &["serve"],
            "error: SHARDLINE_IO_DRIVER=\"uring2\" (the environment variable for --io-driver): \
             \"uring2\" is not an I/O driver: expected one of io-uring, io_uring, uring, poll",
        ),
        (
            ("SHARDLINE_NO_PIN", "maybe"),
            &["serve"],
            "error: SHARDLINE_NO_PIN=\"maybe\" (the environment variable for --no-pin): \"maybe\" \
             is not a boolean; accepted: 1, 0, true, false, yes, no, on, off (any case), or empty",
        ),
        (
            ("SHARDLINE_SHARDS", "2000"),
            &["doctor"],
            "error: SHARDLINE_SHARDS=\"2000\" (the environment variable for --shards): shard \
             count must be between 1 and 1024",
        ),
        (
            ("SHARDLINE_TIMEOUT", "-5s"),
            &["metadata"],
            "error: SHARDLINE_TIMEOUT=\"-5s\" (the environment variable for --timeout): \"-5s\" \
             is not a duration: use a whole number of seconds (5, 5s), milliseconds (300ms) or \
             minutes (2m), no other unit, at most 3600 s (60m) for the request timeout",
        ),
    ] {
        assert_eq!(env_usage_error(&[env], args), expected, "{env:?}");
    }
    // Typed: the flag, as clap names it, even with the same text in the variable.
    assert_eq!(
        env_usage_error(&[("SHARDLINE_SHARDS", "0")], &["serve", "--shards", "0"]),
        "error: invalid value '0' for '--shards <N|all>': shard count must be between 1 and 1024"
    );
    // Overridden by its flag: not read, so the error is about the other flag.
    assert_eq!(
        env_usage_error(
            &[("SHARDLINE_TICK_MS", "0")],
            &["serve", "--tick-ms", "5", "--heartbeat-ticks", "0"]
        ),
        "error: invalid value '0' for '--heartbeat-ticks <TICKS>': must be between 1 and 1000000 \
         ticks"
    );
}
