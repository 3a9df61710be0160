//! `shardline bench --workload metadata` end to end: the real binary against an embedded server
//! and against a running one (`--addr`), checking the report's keys and consistency (never its
//! timings) and that the bench leaves nothing behind.

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{BIN, Server, block_on};
use serde_json::Value;

fn bench(args: &[&str]) -> Output {
    Command::new(BIN)
        .arg("bench")
        .args(args)
        .output()
        .expect("run shardline bench")
}

fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn u64_at(value: &Value, pointer: &str) -> u64 {
    value
        .pointer(pointer)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("{pointer} is not a u64 in {value:#}"))
}

/// Every latency block of a run holds `rounds` samples with p50 <= p99 <= max, all at least 1 µs.
fn assert_consistent_run(run: &Value, rounds: u64) {
    assert_eq!(u64_at(run, "/rounds"), rounds);
    for block in [
        "baseline",
        "register",
        "create_stream",
        "create_topic",
        "delete_stream",
    ] {
        assert_eq!(u64_at(run, &format!("/{block}/count")), rounds, "{block}");
        let latency = |name: &str| u64_at(run, &format!("/{block}/latency_us/{name}"));
        assert!(latency("p50") >= 1, "{block}: {run:#}");
        assert!(latency("p50") <= latency("p99"), "{block}: {run:#}");
        assert!(latency("p99") <= latency("max"), "{block}: {run:#}");
    }
    for op in ["register", "create_stream", "create_topic", "delete_stream"] {
        let ratio = run[op]["p99_ratio_to_baseline"].as_f64().unwrap();
        assert!(ratio > 0.0, "{op}: {run:#}");
        assert_eq!(
            run[op]["target_met"].as_bool().unwrap(),
            ratio <= 3.0,
            "{op}: {run:#}"
        );
    }
    let target = &run["target"];
    assert_eq!(target["op"], "register");
    assert_eq!(target["p99_ratio_max"].as_f64(), Some(3.0));
    assert_eq!(
        target["p99_ratio"],
        run["register"]["p99_ratio_to_baseline"]
    );
    assert_eq!(target["met"], run["register"]["target_met"]);
    assert_eq!(u64_at(run, "/baseline/write_bytes"), 4096);
    assert_eq!(u64_at(run, "/config/topic_partitions"), 1);
}

#[test]
fn embedded_run_reports_every_figure_and_leaves_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let data_root = dir.path().join("root");
    std::fs::create_dir(&data_root).unwrap();
    let json = dir.path().join("metadata.json");
    let output = bench(&[
        "--workload",
        "metadata",
        "--metadata-ops",
        "20",
        "--shards",
        "1",
        "--data-root",
        data_root.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );

    let report = read_json(&json);
    assert_eq!(report["workload"], "metadata");
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 1);
    let run = &runs[0];
    assert_eq!(u64_at(run, "/shards"), 1);
    assert_consistent_run(run, 20);
    assert_eq!(run["baseline"]["location"], "server_run_dir");
    assert_eq!(run["baseline"]["same_filesystem_as_server"], true);
    let scratch = run["baseline"]["path"].as_str().unwrap();
    assert!(Path::new(scratch).starts_with(&data_root), "{scratch}");
    assert_eq!(run["config"]["server"], "embedded");
    assert_eq!(run["config"]["fsync"], "always (server default)");
    assert_eq!(u64_at(run, "/config/first_stream_id"), 1);

    assert!(stdout.contains("== workload=metadata shards=1"), "{stdout}");
    assert!(
        stdout.contains("target: p99 within 3x: register p99 "),
        "{stdout}"
    );
    // The run directory (data, log, baseline file) goes with a clean stop.
    assert_eq!(std::fs::read_dir(&data_root).unwrap().count(), 0);
}

#[test]
fn a_running_server_keeps_its_streams_and_gets_none_of_the_bench_ones() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let server = Server::start(&data_dir, &["--shards", "1", "--no-pin"]);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(5, "orders").await.unwrap();
    });
    let json = dir.path().join("metadata.json");
    let output = bench(&[
        "--workload",
        "metadata",
        "--metadata-ops",
        "3",
        "--addr",
        &addr.to_string(),
        "--data-root",
        dir.path().to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
    ]);
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "stdout:\n{stdout}\nstderr:\n{stderr}"
    );
    let report = read_json(&json);
    let run = &report["runs"][0];
    assert_consistent_run(run, 3);
    assert_eq!(u64_at(run, "/config/first_stream_id"), 6);
    assert_eq!(run["config"]["server"], addr.to_string());
    assert_eq!(run["baseline"]["location"], "data_root");
    assert_eq!(run["baseline"]["same_filesystem_as_server"], Value::Null);
    let metadata = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.get_metadata().await.unwrap()
    });
    let stream_ids: Vec<u32> = metadata.streams.iter().map(|s| s.stream_id).collect();
    assert_eq!(stream_ids, [5]);
    // Only the server's data directory and the report: the baseline file is gone.
    let mut left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| !name.starts_with("data."))
        .collect();
    left.sort();
    assert_eq!(left, ["data", "metadata.json"]);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn bad_metadata_flags_name_the_flag_and_the_rule() {
    let output = bench(&["--workload", "metadata", "--metadata-ops", "0"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(
            "invalid value '0' for '--metadata-ops <N>': \"0\" is not a metadata op count: use a \
             whole number from 1 to 100000"
        ),
        "{stderr}"
    );

    let output = bench(&["--workload", "metadata", "--messages", "10"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "--messages applies to --workload produce-consume only, not to --workload metadata"
        ),
        "{stderr}"
    );

    let output = bench(&["--workload", "metadata-commit"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("invalid value 'metadata-commit' for '--workload <WORKLOAD>'"),
        "{stderr}"
    );
    assert!(stderr.contains("produce-consume, metadata"), "{stderr}");
}
