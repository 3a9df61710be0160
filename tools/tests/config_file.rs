//! `shardline serve --config FILE` (issue 8 section 3): flags beat `SHARDLINE_*` variables, which
//! beat the file, which beats the defaults; an unknown key is refused naming it and the file; a
//! bad value names the key, the value, the file and the rule, whether a flag parser or
//! `ServerConfig::validate` refuses it. Also the cluster flags' own refusals.

mod common;

use std::path::Path;
use std::process::Command;

use common::{BIN, Server};

fn write_config(dir: &Path, text: &str) -> std::path::PathBuf {
    let path = dir.join("shardline.toml");
    std::fs::write(&path, text).unwrap();
    path
}

/// Runs `serve` (a data dir of its own, `extra` args) expecting it to refuse; its stderr.
fn serve_refusal(command: Command, extra: &[&str]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mut command = command;
    let output = command
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "{extra:?} should be refused; stderr:\n{stderr}"
    );
    stderr
}

#[test]
fn flag_beats_env_beats_file_beats_default() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\ntick-ms = 7\nheartbeat-ticks = 3\n\
         view-change-timeout-ticks = 40\nclients-table-max = 99\n",
    );
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_HEARTBEAT_TICKS", "4");
    command.env("SHARDLINE_VIEW_CHANGE_TIMEOUT_TICKS", "45");
    let config_arg = config.to_str().unwrap();
    let server = Server::start_with(
        command,
        &dir.path().join("data"),
        &["--config", config_arg, "--view-change-timeout-ticks", "50"],
    );
    let stderr = server.stderr();
    let starting = stderr
        .lines()
        .find(|line| line.contains("starting"))
        .unwrap_or_else(|| panic!("no starting line in:\n{stderr}"));
    // File only: tick-ms. Env over file: heartbeat-ticks. Flag over env and file: the timeout.
    assert!(starting.contains("tick_ms=7"), "{starting}");
    assert!(starting.contains("heartbeat_ticks=4"), "{starting}");
    assert!(
        starting.contains("view_change_timeout_ticks=50"),
        "{starting}"
    );
    assert!(starting.contains("replica_count=1"), "{starting}");
    assert!(starting.contains("none (single replica)"), "{starting}");
    assert!(starting.contains(config_arg), "{starting}");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn the_config_file_can_come_from_the_environment() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\ncluster = \"0x5eed\"\n",
    );
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_CONFIG", &config);
    let server = Server::start_with(command, &dir.path().join("data"), &[]);
    let stderr = server.stderr();
    assert!(stderr.contains("cluster=0x5eed"), "{stderr}");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn an_unknown_key_is_refused_naming_it_and_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "shards = 1\nheartbeat-tick = 3\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains(&format!(
            "error: config file {}: unknown key \"heartbeat-tick\"; keys are the long flag \
             names of `serve`",
            config.display()
        )) && stderr.contains("heartbeat-ticks"),
        "{stderr}"
    );
}

#[test]
fn a_bad_file_value_names_key_value_file_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    // Refused by the flag's parser.
    let config = write_config(dir.path(), "max-message-size = \"64MB\"\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains(&format!(
            "error: config file {}: invalid max-message-size value \"64MB\": \"64MB\" is not a \
             size",
            config.display()
        )),
        "{stderr}"
    );
    // Refused by the flag's parser with the range rule ServerConfig::validate states too.
    let config = write_config(dir.path(), "tick-ms = 0\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains(&format!(
            "error: config file {}: invalid tick-ms value \"0\": must be between 1 and 1000 ms",
            config.display()
        )),
        "{stderr}"
    );
    // The same rule broken by a flag names the flag, not the file.
    let config = write_config(dir.path(), "tick-ms = 5\n");
    let stderr = serve_refusal(
        Command::new(BIN),
        &["--config", config.to_str().unwrap(), "--tick-ms", "2000"],
    );
    assert!(
        stderr.contains("invalid value '2000' for '--tick-ms <MS>': must be between 1 and 1000 ms")
            && !stderr.contains("config file"),
        "{stderr}"
    );
    // A wrong TOML type.
    let config = write_config(dir.path(), "no-pin = \"yes\"\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains(
            "key no-pin has the string \"yes\": a flag without a value takes true or false"
        ),
        "{stderr}"
    );
}

#[test]
fn a_rule_between_two_keys_judges_the_values_in_effect_not_the_overridden_file_value() {
    let dir = tempfile::tempdir().unwrap();
    // heartbeat-ticks = 40 would break "view change timeout (30) above heartbeat" if it took
    // effect; the flag's 5 is what is judged.
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\nheartbeat-ticks = 40\n",
    );
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--config",
            config.to_str().unwrap(),
            "--heartbeat-ticks",
            "5",
        ],
    );
    assert!(
        server.stderr().contains("heartbeat_ticks=5"),
        "{}",
        server.stderr()
    );
    assert_eq!(server.stop(), Some(0));
}

/// A value's own range is the flag parser's rule: a file value out of range is refused even
/// where a flag overrides it (the file is wrong either way), naming the file, the key and the
/// rule, with exit status 2.
#[test]
fn a_file_value_out_of_its_range_is_refused_even_when_a_flag_overrides_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), "shards = 1\nno-pin = true\ntick-ms = 0\n");
    let output = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(["--config", config.to_str().unwrap(), "--tick-ms", "5"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "error: config file {}: invalid tick-ms value \"0\": must be between 1 and 1000 ms",
            config.display()
        )),
        "{stderr}"
    );
}

#[test]
fn cluster_flags_are_parsed_and_checked() {
    let stderr = serve_refusal(Command::new(BIN), &["--cluster", "zz"]);
    assert!(
        stderr.contains("--cluster") && stderr.contains("\"zz\" is not a cluster id"),
        "{stderr}"
    );
    let stderr = serve_refusal(
        Command::new(BIN),
        &["--addresses", "127.0.0.1:7001,127.0.0.1:7002"],
    );
    assert!(
        stderr.contains("invalid --addresses value \"127.0.0.1:7001,127.0.0.1:7002\": must list 1, 3 or 5 replica addresses"),
        "{stderr}"
    );
    let stderr = serve_refusal(
        Command::new(BIN),
        &[
            "--addresses",
            "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003",
            "--replica",
            "3",
        ],
    );
    assert!(
        stderr.contains("invalid --replica value \"3\": must be below the replica count 3"),
        "{stderr}"
    );
    let stderr = serve_refusal(
        Command::new(BIN),
        &[
            "--addresses",
            "127.0.0.1:7001,127.0.0.1:7002,127.0.0.1:7003",
            "--replica",
            "1",
            "--listen",
            "127.0.0.1:7002",
        ],
    );
    assert!(
        stderr.contains("invalid --listen value \"127.0.0.1:7002\": is also this replica's"),
        "{stderr}"
    );
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_ADDRESSES", "127.0.0.1:7001,,127.0.0.1:7003");
    let stderr = serve_refusal(command, &[]);
    assert!(
        stderr.contains("address 2 of the list is empty"),
        "{stderr}"
    );
    let stderr = serve_refusal(
        Command::new(BIN),
        &[
            "--heartbeat-ticks",
            "30",
            "--view-change-timeout-ticks",
            "30",
        ],
    );
    assert!(
        stderr.contains("invalid --view-change-timeout-ticks value \"30\": must be greater than --heartbeat-ticks (30)"),
        "{stderr}"
    );
}

#[test]
fn serve_help_teaches_a_three_replica_cluster_and_the_config_file() {
    let output = Command::new(BIN)
        .args(["serve", "--help"])
        .output()
        .unwrap();
    assert!(output.status.success());
    let help = String::from_utf8_lossy(&output.stdout);
    for needle in [
        "--cluster <ID>",
        "--replica <I>",
        "--addresses <A0,A1,A2>",
        "--tick-ms <MS>",
        "--heartbeat-ticks <TICKS>",
        "--view-change-timeout-ticks <TICKS>",
        "--config <FILE>",
        "SHARDLINE_ADDRESSES",
        "A 3-replica cluster on one host",
        "--replica 2 --listen 127.0.0.1:8092",
        "addresses = [\"127.0.0.1:7000\"",
    ] {
        assert!(help.contains(needle), "{needle:?} missing from:\n{help}");
    }
}

/// Issue 9 section 0: `--journal-segment-size` is a key like the others: the file sets it, its
/// variable beats the file, the flag beats both, and a value out of 64KiB..=64MiB is refused
/// naming the key, the value, the file and the rule.
#[test]
fn issue9_journal_segment_size_from_file_env_and_flag() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\njournal-segment-size = \"128KiB\"\n",
    );
    let config_arg = config.to_str().unwrap();
    let starting_line = |command: Command, extra: &[&str]| {
        let data = tempfile::tempdir().unwrap();
        let mut args = vec!["--config", config_arg];
        args.extend_from_slice(extra);
        let server = Server::start_with(command, data.path(), &args);
        let stderr = server.stderr();
        assert_eq!(server.stop(), Some(0));
        stderr
            .lines()
            .find(|line| line.contains("starting"))
            .unwrap_or_else(|| panic!("no starting line in:\n{stderr}"))
            .to_owned()
    };
    let line = starting_line(Command::new(BIN), &[]);
    assert!(line.contains("journal_segment_size=131072"), "{line}");
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_JOURNAL_SEGMENT_SIZE", "256KiB");
    let line = starting_line(command, &[]);
    assert!(line.contains("journal_segment_size=262144"), "{line}");
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_JOURNAL_SEGMENT_SIZE", "256KiB");
    let line = starting_line(command, &["--journal-segment-size", "64KiB"]);
    assert!(line.contains("journal_segment_size=65536"), "{line}");

    let bad = write_config(dir.path(), "journal-segment-size = \"1KiB\"\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", bad.to_str().unwrap()]);
    assert!(
        stderr.contains(&format!(
            "error: config file {}: invalid journal-segment-size value \"1KiB\": must be between \
             65536 and 67108864 bytes (64KiB..=64MiB: opening the journal reads a whole segment \
             into memory)",
            bad.display()
        )),
        "{stderr}"
    );
    let stderr = serve_refusal(Command::new(BIN), &["--journal-segment-size", "65MiB"]);
    assert!(
        stderr.contains(
            "invalid value '65MiB' for '--journal-segment-size <BYTES>': must be between 65536"
        ),
        "{stderr}"
    );
}

/// Issue 12 item 3: `write-mode` comes from the file like `--write-mode` (the server says which
/// in its starting line), and a bad value names the key, the value, the file and the choices.
#[test]
fn issue12_3_write_mode_from_the_file_and_its_refusal() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\nwrite-mode = \"direct\"\n",
    );
    let server = Server::start(
        &dir.path().join("data"),
        &["--config", config.to_str().unwrap()],
    );
    let stderr = server.stderr();
    assert_eq!(server.stop(), Some(0));
    let starting = stderr
        .lines()
        .find(|line| line.contains("starting"))
        .unwrap_or_else(|| panic!("no starting line in:\n{stderr}"));
    assert!(starting.contains("write_mode=direct"), "{starting}");

    let config = write_config(dir.path(), "write-mode = \"odirect\"\n");
    let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
    assert!(
        stderr.contains(&format!(
            "error: config file {}: invalid write-mode value \"odirect\": write mode \
             \"odirect\": expected \"buffered\" or \"direct\"",
            config.display()
        )),
        "{stderr}"
    );
}

/// New-user review: a file value that a flag parser refused said the key and value twice
/// (`invalid shards value "0": invalid --shards value "0": shard count must be at least 1`).
/// It reads once, naming the file, the key, the value and the rule (both bounds), and no
/// key's refusal repeats a flag's own `invalid --FLAG value` framing.
#[test]
fn a_file_value_refused_by_a_flag_parser_names_key_value_and_rule_once() {
    let dir = tempfile::tempdir().unwrap();
    for (line, expected) in [
        (
            "shards = 0",
            "invalid shards value \"0\": shard count must be between 1 and 1024",
        ),
        (
            "shards = 1025",
            "invalid shards value \"1025\": shard count must be between 1 and 1024",
        ),
        (
            "cpus = \"x\"",
            "invalid cpus value \"x\": \"x\" is not a CPU number",
        ),
        (
            "io-driver = \"epoll\"",
            "invalid io-driver value \"epoll\": \"epoll\" is not an I/O driver: expected one of \
             io-uring, io_uring, uring, poll",
        ),
    ] {
        let config = write_config(dir.path(), &format!("{line}\n"));
        let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
        assert!(
            stderr.contains(&format!(
                "error: config file {}: {expected}\n",
                config.display()
            )),
            "{line}: {stderr}"
        );
    }
    for line in [
        "listen = \"x\"",
        "fsync = \"sometimes\"",
        "write-mode = \"odirect\"",
        "max-message-size = \"x\"",
        "inbox-capacity = -1",
        "segment-size = \"x\"",
        "idle-poll-us = -1",
        "idle-timeout-s = -1",
        "clients-table-max = -1",
        "parked-polls-max = -1",
        "checkpoint-interval = 0",
        "journal-segment-size = \"x\"",
        "retention-interval = \"x\"",
        "cluster = \"x\"",
        "replica = -1",
        "addresses = \"x\"",
        "tick-ms = 0",
        "heartbeat-ticks = 0",
        "view-change-timeout-ticks = 0",
        "metrics-listen = \"x\"",
        "group-session-timeout = \"x\"",
    ] {
        let config = write_config(dir.path(), &format!("{line}\n"));
        let stderr = serve_refusal(Command::new(BIN), &["--config", config.to_str().unwrap()]);
        assert!(
            stderr.contains(&format!(
                "error: config file {}: invalid ",
                config.display()
            )),
            "{line}: {stderr}"
        );
        assert!(!stderr.contains("invalid --"), "{line}: {stderr}");
    }
}

/// `--shards 0` on the command line states both bounds, once.
#[test]
fn a_shard_count_flag_out_of_range_states_both_bounds_once() {
    for value in ["0", "1025"] {
        let stderr = serve_refusal(Command::new(BIN), &["--shards", value]);
        assert!(
            stderr.contains(&format!(
                "error: invalid value '{value}' for '--shards <N|all>': shard count must be \
                 between 1 and 1024\n"
            )),
            "{stderr}"
        );
    }
}

/// Runs `serve` (a data dir of its own, `extra` args, `env` set) expecting it to refuse with
/// exit status 1 (a rule between settings, checked at startup); the first line of its stderr.
fn startup_refusal(env: &[(&str, &str)], extra: &[&str]) -> String {
    let mut command = Command::new(BIN);
    for (name, value) in env {
        command.env(name, value);
    }
    let dir = tempfile::tempdir().unwrap();
    let output = command
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(1), "{extra:?}: {stderr}");
    stderr
        .lines()
        .find(|line| line.starts_with("error: "))
        .unwrap_or_else(|| panic!("{extra:?}: no error line in {stderr}"))
        .to_owned()
}

/// A rule between two settings names where each side came from (the command line, a
/// `SHARDLINE_*` variable, the config file and its key, or the default): with one side in the
/// file and the other elsewhere, the file is named even when the refused key is not the file's.
#[test]
fn a_rule_between_two_keys_names_the_source_of_each_side() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\nheartbeat-ticks = 40\n",
    );
    let path = config.to_str().unwrap();
    let rule = "must be greater than --heartbeat-ticks (40): a backup that starts a view change \
                before the next heartbeat could arrive deposes a healthy primary";
    // The heartbeat from the file, the timeout from a flag.
    assert_eq!(
        startup_refusal(
            &[],
            &["--config", path, "--view-change-timeout-ticks", "35"]
        ),
        format!(
            "error: invalid --view-change-timeout-ticks value \"35\": {rule} \
             (--view-change-timeout-ticks from the command line; --heartbeat-ticks from config \
             file {path}, key heartbeat-ticks)"
        )
    );
    // ... from a variable.
    assert_eq!(
        startup_refusal(
            &[("SHARDLINE_VIEW_CHANGE_TIMEOUT_TICKS", "35")],
            &["--config", path]
        ),
        format!(
            "error: invalid --view-change-timeout-ticks value \"35\": {rule} \
             (--view-change-timeout-ticks from SHARDLINE_VIEW_CHANGE_TIMEOUT_TICKS; \
             --heartbeat-ticks from config file {path}, key heartbeat-ticks)"
        )
    );
    // ... its default.
    assert_eq!(
        startup_refusal(&[], &["--config", path]),
        format!(
            "error: invalid --view-change-timeout-ticks value \"30\": {rule} \
             (--view-change-timeout-ticks from its default; --heartbeat-ticks from config file \
             {path}, key heartbeat-ticks)"
        )
    );
    // Both sides in the file: the file frames it, and each side is still named.
    let config = write_config(
        dir.path(),
        "shards = 1\nno-pin = true\nheartbeat-ticks = 40\nview-change-timeout-ticks = 35\n",
    );
    let path = config.to_str().unwrap();
    assert_eq!(
        startup_refusal(&[], &["--config", path]),
        format!(
            "error: config file {path}: invalid view-change-timeout-ticks value \"35\": {rule} \
             (--view-change-timeout-ticks from config file {path}, key \
             view-change-timeout-ticks; --heartbeat-ticks from config file {path}, key \
             heartbeat-ticks)"
        )
    );
    // No file: flags and variables are named all the same; an unset side says so.
    assert_eq!(
        startup_refusal(
            &[("SHARDLINE_HEARTBEAT_TICKS", "40")],
            &[
                "--shards",
                "1",
                "--no-pin",
                "--view-change-timeout-ticks",
                "35"
            ]
        ),
        format!(
            "error: invalid --view-change-timeout-ticks value \"35\": {rule} \
             (--view-change-timeout-ticks from the command line; --heartbeat-ticks from \
             SHARDLINE_HEARTBEAT_TICKS)"
        )
    );
    assert_eq!(
        startup_refusal(&[], &["--shards", "1", "--no-pin", "--replica", "2"]),
        "error: invalid --replica value \"2\": a replica index needs --addresses (one replica \
         address per replica, this one's at index --replica); without them the server is a \
         single replica, index 0 (--replica from the command line; --addresses not set)"
    );
}

/// Runs `serve --config FILE` for a file holding `text`, expecting exit status 2; the first
/// line of stderr, with the file's path written as `FILE`.
fn file_refusal(text: &str) -> String {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), text);
    let output = Command::new(BIN)
        .args(["serve", "--data-dir"])
        .arg(dir.path().join("data"))
        .arg("--config")
        .arg(&config)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert_eq!(output.status.code(), Some(2), "{text}: {stderr}");
    stderr
        .lines()
        .next()
        .unwrap_or_default()
        .replace(config.to_str().unwrap(), "FILE")
}

/// An integer beyond TOML's 64 bits got TOML's own "invalid type: integer ... as i128" without
/// the key's rule; it is judged by its flag's parser like any value, naming the file, the key,
/// the value and the range, or, for a value the flag takes (a 128-bit cluster id), told to be
/// written as a string.
#[test]
fn an_integer_beyond_64_bits_names_the_file_key_value_and_range() {
    for (text, expected) in [
        (
            "tick-ms = 99999999999999999999\n",
            "error: config file FILE: invalid tick-ms value \"99999999999999999999\": must be \
             between 1 and 1000 ms",
        ),
        (
            "shards = 1\nheartbeat-ticks = -99999999999999999999\n",
            "error: config file FILE: invalid heartbeat-ticks value \"-99999999999999999999\": \
             must be between 1 and 1000000 ticks",
        ),
        (
            "max-message-size = 99999999999999999999\n",
            "error: config file FILE: invalid max-message-size value \"99999999999999999999\": \
             \"99999999999999999999\" is too large a size; must be between 1024 and 67108864 \
             bytes (the 256-byte header plus at least one batch must fit)",
        ),
        (
            "replica = 0x1_0000_0000_0000_0000\n",
            "error: config file FILE: invalid replica value \"0x10000000000000000\": \
             \"0x10000000000000000\" is not a replica index: use a whole number from 0 to 4",
        ),
        (
            "cluster = 99999999999999999999\n",
            "error: config file FILE: invalid cluster value \"99999999999999999999\": a TOML \
             integer holds -9223372036854775808 to 9223372036854775807; write a larger value as \
             a string: cluster = \"99999999999999999999\"",
        ),
        (
            "tick-ms = 99999999999999999999\nticks = 3\n",
            "error: config file FILE: unknown key \"ticks\"; keys are the long flag names of \
             `serve` (see `shardline serve --help`): ",
        ),
    ] {
        let line = file_refusal(text);
        assert!(
            line.starts_with(expected),
            "{text}:\n{line}\nexpected:\n{expected}"
        );
    }
}

/// The host rules of `--shards` and `--cpus` (more pinned shards than allowed cores; `--cpus`
/// with `--no-pin`), checked as the server starts, name where each setting came from too: a
/// shard count from the file sends the operator to the file, not to a flag they never typed.
#[test]
fn a_host_rule_of_the_shard_settings_names_where_each_came_from() {
    let dir = tempfile::tempdir().unwrap();
    let allowed = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
    let shards = allowed + 1;
    let config = write_config(dir.path(), &format!("shards = {shards}\n"));
    let path = config.to_str().unwrap();
    let line = startup_refusal(&[], &["--config", path]);
    assert!(
        line.starts_with(&format!(
            "error: --shards {shards}: more shards than allowed cores ({allowed} allowed {}: ",
            if allowed == 1 { "core" } else { "cores" }
        )) && line.ends_with(&format!(
            "); lower --shards, or pass --no-pin to overprovision (--shards from config file \
             {path}, key shards; --no-pin from its default)"
        )),
        "{line}"
    );
    let config = write_config(dir.path(), "no-pin = true\n");
    let path = config.to_str().unwrap();
    assert_eq!(
        startup_refusal(&[("SHARDLINE_CPUS", "0")], &["--config", path]),
        format!(
            "error: --cpus 0 pins shards to CPUs; it cannot be combined with --no-pin (--cpus \
             from SHARDLINE_CPUS; --no-pin from config file {path}, key no-pin)"
        )
    );
    // A --cpus list too short for --shards: the list's source, not --no-pin's default.
    let first = runtime::topology::allowed_cpus().unwrap()[0];
    let config = write_config(dir.path(), "shards = 2\n");
    let path = config.to_str().unwrap();
    assert_eq!(
        startup_refusal(
            &[("SHARDLINE_CPUS", &first.to_string())],
            &["--config", path]
        ),
        format!(
            "error: --shards 2: more shards than the cores --cpus lists (1 allowed core: \
             {first}); lower --shards, or widen or drop --cpus (--no-pin is refused with it) \
             (--shards from config file {path}, key shards; --cpus from SHARDLINE_CPUS)"
        )
    );
}
