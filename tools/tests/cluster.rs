//! Three real `shardline serve` processes on 127.0.0.1 forming one VSR cluster (issue 8, "Tests
//! it must have"): changes through any replica's address, kill -9 of the primary or a backup,
//! the restarted replica catching up by repair (also with its last journal record torn), a
//! retried request answered with its original reply after failover, identity refusals, and
//! malformed replica frames that do not stop a replica.
//!
//! Each replica runs `--shards 1 --no-pin` with its own data directory, client port and replica
//! address. Waits poll with a deadline (a loaded 2-core host is slow); nothing asserts a time.

mod common;

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::cluster::{CLUSTER, Cluster, cli, others, request_at_primary, stream_names, tail};
use common::{BIN, Server};

/// Creates stream `id` named `s{id}` with one topic, through the address list.
fn create_stream_and_topic(cluster: &Cluster, id: u32) {
    let addrs = cluster.all_clients();
    cli(&[
        "stream",
        "create",
        &id.to_string(),
        &format!("s{id}"),
        "--addr",
        &addrs,
    ]);
    cli(&[
        "topic",
        "create",
        &id.to_string(),
        "1",
        "events",
        "--addr",
        &addrs,
    ]);
}

fn expected_names(ids: impl IntoIterator<Item = u32>) -> Vec<String> {
    ids.into_iter().map(|id| format!("s{id}")).collect()
}

/// Kill -9 of `victim` (the primary or a backup), more changes, restart: every acknowledged
/// change is on all three exactly once.
fn kill_commit_restart(victim_is_primary: bool, damage: impl Fn(&Path)) {
    let mut cluster = Cluster::start();
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    for id in 1..=3 {
        create_stream_and_topic(&cluster, id);
    }
    cluster.wait_converged(&[0, 1, 2]);
    let victim = if victim_is_primary {
        primary
    } else {
        (primary + 1) % 3
    };
    cluster.kill9(victim);
    let survivors = others(victim);
    let new_primary = cluster.wait_for_primary(&survivors);
    if victim_is_primary {
        assert_ne!(new_primary, victim);
    }
    for id in 4..=6 {
        create_stream_and_topic(&cluster, id);
    }
    damage(&cluster.dirs[victim]);
    cluster.start_replica(victim);
    let converged = cluster.wait_converged(&[0, 1, 2]);
    let mut names = stream_names(&converged);
    names.sort();
    assert_eq!(names, expected_names(1..=6), "{converged:#}");
    for stream in converged["streams"].as_array().unwrap() {
        assert_eq!(stream["topics"].as_array().unwrap().len(), 1, "{stream:#}");
    }
}

#[test]
fn issue8_cluster_kill_9_of_the_primary_elects_a_new_one_and_the_restarted_replica_repairs() {
    kill_commit_restart(true, |_| {});
}

#[test]
fn issue8_cluster_kill_9_of_a_backup_keeps_committing_and_it_catches_up() {
    kill_commit_restart(false, |_| {});
}

/// The journal segment with the highest first op under `data_dir/journal`.
fn last_journal_segment(data_dir: &Path) -> PathBuf {
    let mut segments: Vec<PathBuf> = std::fs::read_dir(data_dir.join("journal"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    segments.sort();
    segments.pop().expect("a journal segment")
}

#[test]
fn issue8_cluster_restarted_replica_with_a_torn_last_journal_record_repairs_from_peers() {
    kill_commit_restart(true, |data_dir| {
        let segment = last_journal_segment(data_dir);
        let size = std::fs::metadata(&segment).unwrap().len();
        assert!(size > 40, "{} holds a record", segment.display());
        // A torn write: the last record loses its final bytes.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&segment)
            .unwrap();
        file.set_len(size - 17).unwrap();
    });
}

#[test]
fn issue8_cluster_retried_request_after_failover_gets_its_original_reply() {
    let mut cluster = Cluster::start();
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    let client = 0x5eed_0001_u128;
    let (registered, _) = request_at_primary(
        &cluster,
        client,
        0,
        bus::Operation::Register,
        bus::Namespace(0),
        &[],
    );
    assert_eq!(registered.error_code, 0);
    let stream = bus::Namespace::new(42, 0, 0);
    let (first, first_body) = request_at_primary(
        &cluster,
        client,
        1,
        bus::Operation::CreateStream,
        stream,
        b"orders",
    );
    assert_eq!(
        first.error_code,
        0,
        "{}",
        String::from_utf8_lossy(&first_body)
    );
    cluster.kill9(primary);
    cluster.wait_for_primary(&others(primary));
    // The same client and request number, resent to the new primary: the original reply, not a
    // second apply (which would answer StreamAlreadyExists).
    let (retried, retried_body) = request_at_primary(
        &cluster,
        client,
        1,
        bus::Operation::CreateStream,
        stream,
        b"orders",
    );
    assert_eq!(
        retried.error_code,
        0,
        "{}",
        String::from_utf8_lossy(&retried_body)
    );
    assert_eq!(
        (retried.operation, retried.offset, retried.count),
        (first.operation, first.offset, first.count)
    );
    let converged = cluster.wait_converged(&others(primary));
    assert_eq!(stream_names(&converged), vec!["orders".to_owned()]);
}

#[test]
fn issue8_cluster_data_directory_refuses_another_cluster_id_or_replica_index() {
    let mut cluster = Cluster::start();
    cluster.wait_for_primary(&[0, 1, 2]);
    cluster.kill9(2);
    let dir = cluster.dirs[2].clone();
    let listen = cluster.clients[2].to_string();
    let addresses = cluster.addresses();
    for (flag, value, named) in [("--cluster", "8", "8"), ("--replica", "1", "1")] {
        let mut args = vec![
            "--shards",
            "1",
            "--no-pin",
            "--cluster",
            CLUSTER,
            "--replica",
            "2",
            "--addresses",
            &addresses,
        ];
        let at = args.iter().position(|a| *a == flag).unwrap();
        args[at + 1] = value;
        let stderr = match Server::try_start_on(Command::new(BIN), &dir, &listen, &args) {
            Ok(server) => panic!(
                "replica 2's directory booted with {flag} {value}:\n{}",
                server.stderr()
            ),
            Err(stderr) => stderr,
        };
        assert!(
            stderr.contains(named) && stderr.to_lowercase().contains("refus"),
            "{flag} {value}: {stderr}"
        );
    }
}

/// Connects to replica `index`'s replica address and writes `bytes`; the replica may close.
fn send_to_replica_port(cluster: &Cluster, index: usize, bytes: &[u8]) {
    let mut stream =
        TcpStream::connect_timeout(&cluster.replicas[index], Duration::from_secs(5)).unwrap();
    let _ = stream.write_all(bytes);
    stream
        .set_read_timeout(Some(Duration::from_secs(2)))
        .unwrap();
    let mut sink = [0u8; 512];
    let _ = stream.read(&mut sink);
}

/// A replica-bus frame with a valid checksum: `command`, `cluster`, `replica`, and `body`.
fn replica_frame(command: u8, cluster: u128, replica: u8, body: &[u8]) -> Vec<u8> {
    let mut header = bus::Header::new(bus::Command::Hello, bus::Operation::Ping);
    header.command = command;
    header.operation = 0;
    header.cluster = cluster;
    header.replica = replica;
    bus::encode_frame(&mut header, body)
}

/// A Hello from `replica` of `cluster` announcing `addresses_checksum` as its list's checksum.
fn hello_frame(cluster: u128, replica: u8, addresses_checksum: u64) -> Vec<u8> {
    shards::vsr::wire::encode_hello(cluster, replica, "127.0.0.1:1", addresses_checksum)
}

#[test]
fn issue8_cluster_malformed_replica_frames_are_refused_and_the_replica_keeps_running() {
    let mut cluster = Cluster::start();
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    let target = (primary + 1) % 3;
    let list = shards::vsr::wire::addresses_checksum(&cluster.replicas);
    // Garbage: no valid header checksum.
    send_to_replica_port(&cluster, target, &[0xAB; 300]);
    // A header whose checksum does not match.
    let mut bad_checksum = replica_frame(bus::Command::Hello as u8, 7, 0, b"127.0.0.1:1");
    bad_checksum[100] ^= 0xFF;
    send_to_replica_port(&cluster, target, &bad_checksum);
    // Hello from another cluster, and from an unknown replica index.
    send_to_replica_port(
        &cluster,
        target,
        &replica_frame(bus::Command::Hello as u8, 8, 0, b"127.0.0.1:1"),
    );
    send_to_replica_port(
        &cluster,
        target,
        &replica_frame(bus::Command::Hello as u8, 7, 9, b"127.0.0.1:1"),
    );
    // A Hello from a replica configured with another --addresses list.
    send_to_replica_port(&cluster, target, &hello_frame(7, primary as u8, list ^ 1));
    // An unknown command after a valid Hello from a known index.
    let mut hello_then_unknown = hello_frame(7, primary as u8, list);
    hello_then_unknown.extend(replica_frame(200, 7, primary as u8, &[]));
    send_to_replica_port(&cluster, target, &hello_then_unknown);
    // A prepare whose parent chain is broken (its body is not a record of the log).
    let mut hello_then_prepare = hello_frame(7, primary as u8, list);
    hello_then_prepare.extend(replica_frame(
        bus::Command::Prepare as u8,
        7,
        primary as u8,
        &[0x11; 96],
    ));
    send_to_replica_port(&cluster, target, &hello_then_prepare);

    // The cluster still commits, and the attacked replica still follows.
    for id in 1..=2 {
        create_stream_and_topic(&cluster, id);
    }
    let converged = cluster.wait_converged(&[0, 1, 2]);
    assert_eq!(stream_names(&converged), expected_names(1..=2));
    assert!(
        cluster.servers[target]
            .as_mut()
            .unwrap()
            .child
            .try_wait()
            .unwrap()
            .is_none()
    );
    let stderr = cluster.stderr(target);
    for reason in [
        "hello from cluster 0x8",
        "hello from replica index 9, outside 0..3",
        "--addresses differ from this replica's: every replica must be started with the same \
         --addresses list in the same order",
        "malformed frame",
        "replica keeps running",
    ] {
        assert!(
            stderr.contains(reason),
            "the refusal {reason:?} is logged: {}",
            tail(&stderr, 40)
        );
    }
}

/// The bytes of every file under `dir`, recursively (0 when it does not exist).
fn bytes_under(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .flatten()
        .map(|entry| {
            let path = entry.path();
            if path.is_dir() {
                bytes_under(&path)
            } else {
                entry.metadata().map_or(0, |m| m.len())
            }
        })
        .sum()
}

/// Adversarial review: a primary killed after messages were appended, whose last journal record
/// (the CreateTopic) is damaged, rejoins by repair and applies that CreateTopic again: its
/// partition directory is the same topic's and keeps its messages (it emptied it before).
#[test]
fn issue8_cluster_rejoining_replica_applying_its_create_topic_again_keeps_its_partition_data() {
    let mut cluster = Cluster::start();
    let primary = cluster.wait_for_primary(&[0, 1, 2]);
    create_stream_and_topic(&cluster, 1);
    let mut send = Command::new(BIN)
        .args(["send", "--stream", "1", "--topic", "1", "--addr"])
        .arg(cluster.all_clients())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    send.stdin
        .take()
        .unwrap()
        .write_all(b"m1\nm2\nm3\n")
        .unwrap();
    let output = send.wait_with_output().unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    cluster.wait_converged(&[0, 1, 2]);
    let partition = cluster.dirs[primary].join("partitions/1/1/0");
    let stored = bytes_under(&partition);
    assert!(stored > 0, "{} holds the messages", partition.display());
    cluster.kill9(primary);
    cluster.wait_for_primary(&others(primary));
    // Damage the last record (the CreateTopic): the restarted replica cuts it and repairs it.
    let segment = last_journal_segment(&cluster.dirs[primary]);
    let mut raw = std::fs::read(&segment).unwrap();
    let at = raw.len() - 30;
    raw[at] ^= 0xFF;
    std::fs::write(&segment, &raw).unwrap();
    cluster.start_replica(primary);
    let converged = cluster.wait_converged(&[0, 1, 2]);
    assert_eq!(stream_names(&converged), expected_names(1..=1));
    assert_eq!(
        bytes_under(&partition),
        stored,
        "{} kept its data\n{}",
        partition.display(),
        cluster.stderrs()
    );
}
