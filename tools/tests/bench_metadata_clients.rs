//! `shardline bench --workload metadata --clients N` end to end: the flag's validation, concurrent
//! clients against the embedded server and against a running one (`--addr`), and a backup's
//! `NotPrimary` turned into an error naming the primary. The report's figures are checked for
//! presence and consistency, never against a time or a target (issue 8: targets are reported).

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpListener;
use std::path::Path;
use std::process::{Command, Output};

use bus::{ErrorCode, HEADER_SIZE, Header, encode_frame, reply_header};
use common::{BIN, Server};
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

/// Runs `bench args` and returns its stderr, asserting that it failed.
fn refused(args: &[&str]) -> String {
    let output = bench(args);
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(!output.status.success(), "{args:?} succeeded: {stderr}");
    stderr
}

/// The `clients` block of `run` holds `clients` clients, a positive rate, and ordered
/// percentiles of at least 1 µs; returns its committed op count.
fn assert_consistent_clients(run: &Value, clients: u64) -> u64 {
    let block = &run["clients"];
    assert_eq!(u64_at(block, "/clients"), clients, "{run:#}");
    assert_eq!(u64_at(run, "/config/clients"), clients, "{run:#}");
    let committed = u64_at(block, "/committed_ops");
    assert!(committed >= 1, "{run:#}");
    let ops_per_second = block["ops_per_second"].as_f64().unwrap();
    assert!(ops_per_second > 0.0, "{run:#}");
    assert!(block["elapsed_seconds"].as_f64().unwrap() > 0.0, "{run:#}");
    let latency = |name: &str| u64_at(block, &format!("/latency_us/{name}"));
    assert!(latency("p50") >= 1, "{run:#}");
    assert!(latency("p50") <= latency("p99"), "{run:#}");
    assert!(latency("p99") <= latency("max"), "{run:#}");
    let threads = u64_at(block, "/threads");
    assert!((1..=clients).contains(&threads), "{run:#}");
    let target = &block["target"];
    assert_eq!(u64_at(target, "/clients"), 64);
    assert_eq!(u64_at(target, "/ops_per_second_min_one_replica"), 10_000);
    assert_eq!(u64_at(target, "/ops_per_second_min_three_replicas"), 5_000);
    assert_eq!(target["p99_ratio_max"].as_f64(), Some(2.0));
    // The target names 64 clients: a run of another count is not judged.
    assert_eq!(target["met"], Value::Null, "{run:#}");
    committed
}

#[test]
fn clients_out_of_range_or_on_the_produce_workload_are_refused() {
    let rule = "the count of concurrent client connections";
    for value in ["0", "2000"] {
        let stderr = refused(&["--workload", "metadata", "--clients", value]);
        assert!(
            stderr.contains(&format!(
                "invalid value '{value}' for '--clients <N>': \"{value}\" is not a client \
                 count: use a whole number from 1 to 1024: {rule}"
            )),
            "{stderr}"
        );
    }
    let stderr = refused(&["--clients", "4"]);
    assert!(
        stderr.contains(
            "--clients applies to --workload metadata only, not to --workload produce-consume"
        ),
        "{stderr}"
    );
    let stderr = refused(&["--workload", "metadata", "--duration", "2"]);
    assert!(stderr.contains("needs --clients 2 or more"), "{stderr}");
}

#[test]
fn embedded_run_with_four_clients_for_a_second_reports_their_rate() {
    let dir = tempfile::tempdir().unwrap();
    let data_root = dir.path().join("root");
    let json = dir.path().join("metadata.json");
    let output = bench(&[
        "--workload",
        "metadata",
        "--metadata-ops",
        "5",
        "--clients",
        "4",
        "--duration",
        "1",
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
    let run = &report["runs"][0];
    // The single-client rounds are reported as before.
    assert_eq!(u64_at(run, "/rounds"), 5);
    assert_eq!(u64_at(run, "/register/count"), 5);
    assert_consistent_clients(run, 4);
    assert_eq!(u64_at(run, "/clients/duration_seconds"), 1);
    assert_eq!(run["clients"]["registers_per_client"], Value::Null);
    assert_eq!(u64_at(run, "/config/replica_count"), 1);
    let target = &run["clients"]["target"];
    assert_eq!(u64_at(target, "/replica_count"), 1);
    assert_eq!(u64_at(target, "/ops_per_second_min"), 10_000);
    assert_eq!(
        u64_at(target, "/three_replica_register_p99_max_us"),
        2 * u64_at(run, "/register/latency_us/p99")
    );
    assert!(stdout.contains("clients: 4 connections on "), "{stdout}");
    assert!(
        stdout.contains("issue 8 throughput (64 clients registering): >= 10000 ops/s"),
        "{stdout}"
    );
    assert!(
        stdout.contains("issue 8 latency: with 3 replicas"),
        "{stdout}"
    );
    assert_eq!(std::fs::read_dir(&data_root).unwrap().count(), 0);
}

#[test]
fn clients_on_a_running_server_commit_their_registers_each() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir(&data_dir).unwrap();
    let server = Server::start(&data_dir, &["--shards", "1", "--no-pin"]);
    let json = dir.path().join("metadata.json");
    let output = bench(&[
        "--workload",
        "metadata",
        "--metadata-ops",
        "3",
        "--clients",
        "4",
        "--addr",
        &server.addr.to_string(),
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
    // 4 clients × 3 Registers, each with a fresh client id: each one committed.
    assert_eq!(assert_consistent_clients(run, 4), 12);
    assert_eq!(u64_at(run, "/clients/registers_per_client"), 3);
    assert_eq!(run["config"]["replica_count"], Value::Null);
    assert_eq!(run["clients"]["target"]["ops_per_second_min"], Value::Null);
    assert!(
        stdout.contains("the bench does not know this server's replica count (--addr)"),
        "{stdout}"
    );
    assert_eq!(server.stop(), Some(0));
}

/// A server that answers every request `NotPrimary` in view 4 naming replica 1 at `primary`, as
/// a cluster's backup does (issue 8 section 2).
fn fake_backup(primary: &'static str) -> std::net::SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let mut bytes = [0u8; HEADER_SIZE];
            while stream.read_exact(&mut bytes).is_ok() {
                let request: Header = bytemuck::pod_read_unaligned(&bytes);
                let mut body = vec![0u8; request.size as usize - HEADER_SIZE];
                if stream.read_exact(&mut body).is_err() {
                    break;
                }
                let mut reply = reply_header(&request);
                reply.error_code = ErrorCode::NotPrimary as u32;
                reply.view = 4;
                reply.replica = 1;
                if stream
                    .write_all(&encode_frame(&mut reply, primary.as_bytes()))
                    .is_err()
                {
                    break;
                }
            }
        }
    });
    addr
}

#[test]
fn a_backup_at_addr_is_named_with_the_primary_it_points_to() {
    let backup = fake_backup("127.0.0.1:9000");
    let dir = tempfile::tempdir().unwrap();
    let stderr = refused(&[
        "--workload",
        "metadata",
        "--metadata-ops",
        "3",
        "--clients",
        "4",
        "--addr",
        &backup.to_string(),
        "--data-root",
        dir.path().to_str().unwrap(),
    ]);
    assert!(
        stderr.contains(&format!(
            "--addr {backup} is not the cluster's primary (its view is 4): it names the primary, \
             replica 1, at 127.0.0.1:9000; run the bench again with --addr 127.0.0.1:9000"
        )),
        "{stderr}"
    );
    // Nothing was left in the baseline directory.
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
}
