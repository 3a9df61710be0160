//! Bad flags exit non-zero with a message naming the key, the value and the rule; `--shards all`
//! under `taskset -c 1` runs exactly one shard pinned to CPU 1.

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

fn allowed_cpu_count() -> usize {
    std::thread::available_parallelism().map_or(1, std::num::NonZero::get)
}

#[test]
fn shards_zero_is_rejected() {
    let message = serve_error(&["--shards", "0"]);
    assert!(
        message.contains("--shards") && message.contains("'0'") && message.contains("at least 1"),
        "{message}"
    );
}

#[test]
fn more_shards_than_cores_without_no_pin_is_rejected() {
    let shards = (allowed_cpu_count() + 1).to_string();
    let message = serve_error(&["--shards", &shards]);
    assert!(message.contains(&format!("--shards {shards}")), "{message}");
    assert!(
        message.contains("more shards than allowed cores") && message.contains("--no-pin"),
        "{message}"
    );
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
    let message = serve_error(&["--max-message-size", "100"]);
    assert!(
        message.contains("--max-message-size")
            && message.contains("\"100\"")
            && message.contains("between 1024"),
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
