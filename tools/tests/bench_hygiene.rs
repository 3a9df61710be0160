//! `shardline bench` leaves the machine as it found it: a run that cannot fit on the data root's
//! filesystem, or asks for more messages than the documented bound, is refused before any server
//! starts; Ctrl-C during a run stops the embedded server, removes the run directory and the
//! report outputs it created, and exits 130; a SIGKILL of the bench kills its server too. The real binary, tiny or refused workloads; never asserts a timing.

mod common;

use common::{BIN, bench, path_arg, text};

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// The bench's run directories under `root`.
fn run_dirs(root: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(root)
        .map(|entries| {
            entries
                .map(|entry| entry.unwrap().path())
                .filter(|path| {
                    path.file_name()
                        .is_some_and(|name| name.to_string_lossy().starts_with("shardline-bench-"))
                })
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn a_run_larger_than_the_free_space_is_refused_before_any_server_starts() {
    let root = tempfile::tempdir().unwrap();
    // 10^10 messages of 1000 bytes: about 10 TB, past any test machine's disk.
    let output = bench(&[
        "--no-pin",
        "--messages",
        "10000000000",
        "--data-root",
        path_arg(root.path()),
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains(
            "--messages 10000000000 would write up to 10320547108960 bytes (9611.76 GiB: "
        ),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!(
            "under {}, but its filesystem has ",
            root.path().display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(
            "free for this user; pass a smaller --messages or a --data-root on a filesystem \
             with more free space"
        ),
        "{stderr}"
    );
    assert_eq!(run_dirs(root.path()), Vec::<PathBuf>::new());
}

#[test]
fn a_message_count_outside_its_range_names_the_flag_value_and_rule() {
    for value in ["10000000001", "0", "-1", "1e6"] {
        let output = bench(&["--messages", value]);
        let stderr = text(&output.stderr);
        // A clap value error, as for any other bad value.
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid value '{value}' for '--messages <M>': \"{value}\" is not a message \
                 count: use a whole number from 1 to 10000000000: a run writes every message to \
                 disk"
            )),
            "{stderr}"
        );
    }
    let output = bench(&["--partitions", "-4"]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "invalid value '-4' for '--partitions <K>': \"-4\" is not a partition count: use a \
             whole number from 1 to 4096"
        ),
        "{stderr}"
    );
}

#[test]
fn sigint_during_a_run_stops_the_server_removes_the_run_directory_and_exits_130() {
    stop_signal_mid_run_cleans_up(libc::SIGINT, 130);
}

#[test]
fn sigterm_during_a_run_stops_the_server_removes_the_run_directory_and_exits_143() {
    stop_signal_mid_run_cleans_up(libc::SIGTERM, 143);
}

/// A process's parent pid and start time (clock ticks since boot), from `/proc/PID/stat`
/// (proc(5): fields 4 and 22, counted after the parenthesised command name), or `None` once
/// it is gone or a zombie (dead, only not yet reaped by whoever inherited it).
fn live_process(pid: u32) -> Option<(u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split(' ').collect();
    if fields[0] == "Z" || fields[0] == "X" {
        return None;
    }
    Some((fields[1].parse().ok()?, fields[19].parse().ok()?))
}

/// The pids whose parent is `parent`.
fn children_of(parent: u32) -> Vec<u32> {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|&pid| live_process(pid).is_some_and(|(ppid, _)| ppid == parent))
        .collect()
}

/// Starts a bench of 200 000 one-message round trips (seconds of work) writing into `root`,
/// with `extra` flags, and waits until its run is mid-way: the bench topic's directory
/// (`data/partitions/STREAM/TOPIC`) exists once the server is up and the topic is created,
/// right before the produce phase starts. Returns the bench and its run directory.
fn bench_mid_run(root: &Path, extra: &[&str]) -> (std::process::Child, PathBuf) {
    let mut child = Command::new(BIN)
        .args([
            "bench",
            "--no-pin",
            "--messages",
            "200000",
            "--message-size",
            "16",
            "--batch",
            "1",
            "--producers",
            "1",
            "--consumers",
            "1",
            "--fsync",
            "never",
            "--data-root",
            path_arg(root),
        ])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // A bound on the wait, not an assertion on timing.
    let deadline = Instant::now() + Duration::from_mins(1);
    let run_dir = loop {
        if let Some(dir) = run_dirs(root).pop()
            && dir
                .join("data")
                .join("partitions")
                .join("1")
                .join("1")
                .exists()
        {
            break dir;
        }
        assert!(
            child.try_wait().unwrap().is_none(),
            "the bench ended before its run directory appeared"
        );
        assert!(Instant::now() < deadline, "no run directory appeared");
        std::thread::sleep(Duration::from_millis(20));
    };
    (child, run_dir)
}

#[test]
fn sigkill_of_the_bench_takes_its_embedded_server_down_too() {
    let root = tempfile::tempdir().unwrap();
    let (mut child, run_dir) = bench_mid_run(root.path(), &[]);
    let servers = children_of(child.id());
    assert_eq!(servers.len(), 1, "the bench has one child: {servers:?}");
    let server = servers[0];
    let (_, server_start) = live_process(server).expect("the server runs");
    let cmdline = std::fs::read(format!("/proc/{server}/cmdline")).unwrap();
    assert!(
        String::from_utf8_lossy(&cmdline).contains("serve"),
        "{cmdline:?}"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    // Polled with a bound, not timed: the death signal is delivered as the bench exits. A pid
    // reused by another process has another start time.
    let deadline = Instant::now() + Duration::from_mins(1);
    while live_process(server).is_some_and(|(_, start)| start == server_start) {
        if Instant::now() >= deadline {
            // SAFETY: kill(2) on the orphan checked above (same pid and start time), so a
            // failing run leaves no server behind.
            unsafe { libc::kill(libc::pid_t::try_from(server).unwrap(), libc::SIGKILL) };
            panic!("the embedded server (pid {server}) outlived its SIGKILLed bench");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // No handler ran: the run directory stays, as any killed program's files do.
    std::fs::remove_dir_all(run_dir).unwrap();
}

/// Sends `signal` to a bench mid-run; it must kill its server, remove the run directory, say so
/// and exit with `exit_code` (128 + the signal).
fn stop_signal_mid_run_cleans_up(signal: libc::c_int, exit_code: i32) {
    let root = tempfile::tempdir().unwrap();
    let outputs = tempfile::tempdir().unwrap();
    let json = outputs.path().join("b.json");
    let csv = outputs.path().join("b.csv");
    let charts = outputs.path().join("out").join("charts");
    let (child, run_dir) = bench_mid_run(
        root.path(),
        &[
            "--json",
            path_arg(&json),
            "--csv",
            path_arg(&csv),
            "--charts",
            path_arg(&charts),
        ],
    );
    assert!(json.exists() && csv.exists() && charts.is_dir());
    let pid = libc::pid_t::try_from(child.id()).unwrap();
    // SAFETY: kill(2) on our own unreaped child.
    assert_eq!(unsafe { libc::kill(pid, signal) }, 0);
    let output = child.wait_with_output().unwrap();
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(exit_code), "{stderr}");
    assert!(!run_dir.exists(), "{} is left: {stderr}", run_dir.display());
    assert_eq!(run_dirs(root.path()), Vec::<PathBuf>::new());
    assert!(
        stderr.contains(&format!("removed the run directory {}", run_dir.display())),
        "{stderr}"
    );
    assert!(
        stderr.contains("interrupted: stopped the embedded server (pid "),
        "{stderr}"
    );
    // The report outputs it created, unwritten, go too; the directory that held them stays.
    for line in [
        format!("removed the unwritten --csv {}", csv.display()),
        format!("removed the unwritten --json {}", json.display()),
        format!("removed the empty --charts {}", charts.display()),
        format!(
            "removed the empty --charts {}",
            outputs.path().join("out").display()
        ),
    ] {
        assert!(stderr.contains(&line), "{line} not in: {stderr}");
    }
    assert_eq!(std::fs::read_dir(outputs.path()).unwrap().count(), 0);
}

/// New-user review: `bench --write-mode odirect`, `--fsync sometimes` and `--io-driver epoll`
/// exited 1 while `serve` exits 2 for the same values. They are usage errors now: exit 2,
/// naming the flag, the value and the rule, before anything starts.
#[test]
fn bad_server_flag_values_are_usage_errors_as_in_serve() {
    for (flag, value, rule) in [
        (
            "--write-mode <MODE>",
            "odirect",
            "expected buffered or direct",
        ),
        (
            "--fsync <POLICY>",
            "sometimes",
            "expected always, never or interval=MS with MS from 1 to 3600000",
        ),
        ("--io-driver <DRIVER>", "epoll", "expected io-uring or poll"),
    ] {
        let name = flag.split_once(' ').unwrap().0;
        let output = bench(&[name, value]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "error: invalid value '{value}' for '{flag}': {rule}\n"
            )),
            "{stderr}"
        );
    }
}

/// `bench --shards 0` said "a shard count must be at least 1" and exited 1, with no upper
/// bound; `-1` was taken for a flag. The list is a usage error now, exit 2 through clap like the
/// other bench flags, each count by `serve --shards`'s own rule (1..=1024), before anything
/// starts.
#[test]
fn a_bad_shard_list_is_a_usage_error_with_the_serve_rule() {
    for (value, rule) in [
        ("0", "shard count must be between 1 and 1024"),
        ("1025", "shard count must be between 1 and 1024"),
        (
            "-1",
            "expected `all` or a whole number of shards from 1 to 1024",
        ),
        ("1,0", "\"0\": shard count must be between 1 and 1024"),
        (
            "1,x",
            "\"x\": expected `all` or a whole number of shards from 1 to 1024",
        ),
        (
            "2,2",
            "count 2 is listed twice (entries 1 and 2): each count runs once per round; list it \
             once (--repeat runs rounds)",
        ),
        (
            "1,,2",
            "entry 2 of the list is empty: separate the counts with single commas (e.g. 1,2,4)",
        ),
        (
            "1,sweep",
            "`sweep` stands alone: it already runs 1, 2, 4, ... up to the allowed CPUs",
        ),
    ] {
        let output = bench(&["--shards", value]);
        let stderr = text(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{value}: {stderr}");
        assert!(
            stderr.contains(&format!(
                "error: invalid value '{value}' for '--shards <LIST>': {rule}\n"
            )),
            "{value}: {stderr}"
        );
    }
    // `all` with the count it resolves to is the same repeat; resolving it needs --cpus and
    // --no-pin, so it is refused after parsing (exit 1), still before anything starts.
    let root = tempfile::tempdir().unwrap();
    let first = runtime::topology::allowed_cpus().unwrap()[0].to_string();
    let output = bench(&[
        "--shards",
        "all,1",
        "--cpus",
        &first,
        "--data-root",
        path_arg(root.path()),
    ]);
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(
        text(&output.stderr),
        "error: --shards all,1: entries 1 and 2 are the same count: `all` resolves to 1 shard \
         here (one per allowed core, or per --cpus entry); list the count once\n"
    );
    assert_eq!(run_dirs(root.path()), Vec::<PathBuf>::new());
}

/// The free-space estimate counted the longest `--payload-file` line for every message: a corpus
/// of one 100 KB line and 99 short ones (1 KB per message on average) was estimated at 100 KB
/// per message, about 100x what the run writes, and refused runs that fit. It counts the bytes
/// the run sends now: the lines as each producer cycles through them.
#[test]
fn the_disk_estimate_of_a_payload_file_counts_its_lines_not_its_longest_line_each_time() {
    let root = tempfile::tempdir().unwrap();
    let corpus = root.path().join("corpus.txt");
    let mut text_lines = vec!["x".repeat(100_000)];
    text_lines.extend((0..99).map(|index| format!("short {index:04}")));
    std::fs::write(&corpus, text_lines.join("\n")).unwrap();
    let data_root = root.path().join("data");
    // 10^10 messages still outgrow any test machine's disk: refused before any server starts.
    let output = bench(&[
        "--no-pin",
        "--messages",
        "10000000000",
        "--producers",
        "1",
        "--consumers",
        "1",
        "--batch",
        "100",
        "--payload-file",
        path_arg(&corpus),
        "--data-root",
        path_arg(&data_root),
    ]);
    let stderr = text(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    // 10^8 cycles of the 100 lines (100000 + 99 x 10 bytes), 32 header bytes per message,
    // 10^8 + 1 batches of 48 bytes (entry header and index row), 64 MiB of server files.
    let payload_bytes: u64 = 100_000_000 * (100_000 + 99 * 10);
    let estimate = payload_bytes + 10_000_000_000 * 32 + (100_000_000 + 1) * 48 + (64 << 20);
    assert!(
        stderr.contains(&format!(
            "--messages 10000000000 would write up to {estimate} bytes (9707.98 GiB: \
             {payload_bytes} payload bytes (1009.9 per message on average) + 10000000000 x 32 \
             header bytes, batch headers and index rows"
        )),
        "{stderr}"
    );
    assert_eq!(run_dirs(&data_root), Vec::<PathBuf>::new());
}

#[test]
fn the_embedded_server_ignores_shardline_variables_and_the_report_says_what_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let data_root = dir.path().join("data");
    let json = dir.path().join("run.json");
    // `bogus` would kill a server that read it: the run succeeding shows it never got it.
    let output = Command::new(BIN)
        .arg("bench")
        .args([
            "--no-pin",
            "--shards",
            "1",
            "--messages",
            "2000",
            "--message-size",
            "100",
            "--batch",
            "100",
            "--partitions=2",
            "--data-root",
            path_arg(&data_root),
            "--json",
            path_arg(&json),
        ])
        .env("SHARDLINE_FSYNC", "never")
        .env("SHARDLINE_WRITE_MODE", "bogus")
        .output()
        .unwrap();
    let stdout = text(&output.stdout);
    let stderr = text(&output.stderr);
    assert!(output.status.success(), "{stdout}\n{stderr}");
    assert!(
        stderr.contains(
            "bench: the embedded server ignores SHARDLINE_FSYNC=never (pass --fsync never), \
             SHARDLINE_WRITE_MODE=bogus (pass --write-mode bogus); the bench passes its \
             settings as flags, so the report shows what the server runs\n"
        ),
        "{stderr}"
    );
    assert!(
        stdout.contains("fsync=always (server default) write-mode=buffered (server default)"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let config = &report["runs"][0]["config"];
    assert_eq!(config["fsync"], "always (server default)", "{config}");
    assert_eq!(config["write_mode"], serde_json::Value::Null, "{config}");
    assert_eq!(run_dirs(&data_root), Vec::<PathBuf>::new());
}
