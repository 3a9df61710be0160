//! Issue 7 item 5, exactly-once sends: idempotent producers against the real `shardline serve`.
//! A resent batch gets its original offset, a gap is refused, the owner shard's producer state
//! is rebuilt from the log after a restart, and under repeated kill -9 during concurrent sends
//! with client retries every message is stored exactly once, in each producer's order.
//!
//! It must never depend on timing: the kill cycles pace themselves with sleeps, but every
//! assertion is on the data, which must be exact whatever the timing.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bus::{
    BatchBuilder, Client, ClientError, ErrorCode, Namespace, Operation, Producer, ProducerStamp,
};
use common::{BIN, Server, block_on, read_all};

/// Two shards without pinning (CI has two cores); every ack after an fsync.
const SERVE_ARGS: [&str; 5] = ["--shards", "2", "--no-pin", "--fsync", "always"];
const PARTITION: Namespace = Namespace(0x0000_0001_0001_0000);

fn partition(partition_id: u16) -> Namespace {
    Namespace::new(1, 1, partition_id)
}

/// Creates stream 1 with topic 1 of `partition_count` partitions.
fn create_topic(addr: SocketAddr, partition_count: u32) {
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        client.create_stream(1, "once").await.unwrap();
        client
            .create_topic(1, 1, "t", partition_count)
            .await
            .unwrap();
    });
}

/// A batch of `payloads`, stamped.
fn stamped(stamp: ProducerStamp, payloads: &[&str]) -> Vec<u8> {
    let mut builder = BatchBuilder::default();
    for (index, payload) in payloads.iter().enumerate() {
        builder.push(index as u64, 0, payload.as_bytes());
    }
    builder.finish_stamped(stamp)
}

fn stamp(producer: u64, sequence: u64) -> ProducerStamp {
    ProducerStamp { producer, sequence }
}

/// The payloads of a partition, in offset order.
async fn payloads(client: &mut Client, namespace: Namespace) -> Vec<String> {
    read_all(client, namespace)
        .await
        .into_iter()
        .map(|(_, _, payload)| String::from_utf8(payload).unwrap())
        .collect()
}

fn server_error(result: Result<bus::SendAck, ClientError>) -> (ErrorCode, String) {
    match result {
        Err(ClientError::Server { code, message }) => (code, message),
        other => panic!("expected a server error, got {other:?}"),
    }
}

#[test]
fn issue7_5_duplicate_gets_original_offset_and_gap_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &SERVE_ARGS);
    create_topic(server.addr, 1);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let first = stamped(stamp(7, 0), &["a", "b"]);
        let ack = client
            .send_stamped(PARTITION, first.clone(), stamp(7, 0))
            .await
            .unwrap();
        assert_eq!((ack.base_offset, ack.message_count), (0, 2));
        // A plain send in between moves the partition on.
        let mut plain = BatchBuilder::default();
        plain.push(0, 0, b"plain");
        assert_eq!(
            client
                .send_messages(PARTITION, plain.finish())
                .await
                .unwrap()
                .base_offset,
            2
        );
        // The resend of the first batch: its original offsets, nothing appended.
        let again = client
            .send_stamped(PARTITION, first, stamp(7, 0))
            .await
            .unwrap();
        assert_eq!((again.base_offset, again.message_count), (0, 2));
        // The next batch in order is appended.
        let next = client
            .send_stamped(PARTITION, stamped(stamp(7, 2), &["c"]), stamp(7, 2))
            .await
            .unwrap();
        assert_eq!(next.base_offset, 3);
        // A gap: refused, naming expected and received, nothing appended.
        let (code, message) = server_error(
            client
                .send_stamped(PARTITION, stamped(stamp(7, 5), &["gap"]), stamp(7, 5))
                .await,
        );
        assert_eq!(code, ErrorCode::SequenceGap);
        assert_eq!(
            message,
            format!(
                "producer 7 in {PARTITION}: expected sequence 3, received 5; nothing was appended"
            )
        );
        // A batch overlapping a remembered one without matching it.
        let (code, _) = server_error(
            client
                .send_stamped(PARTITION, stamped(stamp(7, 1), &["x"]), stamp(7, 1))
                .await,
        );
        assert_eq!(code, ErrorCode::InvalidArgument);
        // Header and stamp disagree.
        let mut header = bus::Header::new(bus::Command::Request, Operation::SendMessages);
        header.namespace = PARTITION.0;
        header.producer = 7;
        header.sequence = 4;
        let error = client
            .request(header, &stamped(stamp(7, 3), &["mismatch"]))
            .await
            .unwrap_err();
        let ClientError::Server { code, message } = error else {
            panic!("expected InvalidBatch, got {error:?}");
        };
        assert_eq!(code, ErrorCode::InvalidBatch);
        assert_eq!(
            message,
            "request header says producer 7 sequence 4 but the batch carries producer 7 \
             sequence 3"
        );
        assert_eq!(
            payloads(&mut client, PARTITION).await,
            vec!["a", "b", "plain", "c"]
        );
    });
}

#[test]
fn issue7_5_batches_older_than_the_window_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &SERVE_ARGS);
    create_topic(server.addr, 1);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        for sequence in 0..6 {
            let batch = stamped(stamp(9, sequence), &["m"]);
            let ack = client
                .send_stamped(PARTITION, batch, stamp(9, sequence))
                .await
                .unwrap();
            assert_eq!(ack.base_offset, sequence);
        }
        let (code, message) = server_error(
            client
                .send_stamped(PARTITION, stamped(stamp(9, 0), &["m"]), stamp(9, 0))
                .await,
        );
        assert_eq!(code, ErrorCode::SequenceGap);
        assert_eq!(
            message,
            format!(
                "producer 9 in {PARTITION}: sequence 0 is older than the batches remembered \
                 (oldest 1, next expected 6), so whether it was appended cannot be told; nothing \
                 was appended"
            )
        );
    });
}

/// With 4 KiB segments, a plain batch larger than that after the producer's batch takes a segment
/// of its own: the producer's batch is then in the segment before the last, whose tail recovery
/// reads too.
#[test]
fn issue7_5_producer_state_is_recovered_from_the_log_after_restart() {
    let big = "x".repeat(5000);
    for kill in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let data_dir = dir.path().join("data");
        let serve_args: Vec<&str> = SERVE_ARGS
            .iter()
            .chain(&["--segment-size", "4096"])
            .copied()
            .collect();
        let server = Server::start(&data_dir, &serve_args);
        create_topic(server.addr, 1);
        let first = stamped(stamp(11, 0), &["a", "b", "c"]);
        block_on(async {
            let mut client = Client::connect(server.addr).await.unwrap();
            let ack = client
                .send_stamped(PARTITION, first.clone(), stamp(11, 0))
                .await
                .unwrap();
            assert_eq!(ack.base_offset, 0);
            let mut plain = BatchBuilder::default();
            plain.push(0, 0, big.as_bytes());
            let ack = client
                .send_messages(PARTITION, plain.finish())
                .await
                .unwrap();
            assert_eq!(ack.base_offset, 3);
        });
        if kill {
            server.kill9();
        } else {
            assert_eq!(server.stop(), Some(0));
        }
        let segments = std::fs::read_dir(data_dir.join("partitions/1/1/0"))
            .unwrap()
            .filter(|entry| {
                entry
                    .as_ref()
                    .unwrap()
                    .path()
                    .extension()
                    .is_some_and(|extension| extension == "log")
            })
            .count();
        assert_eq!(segments, 2, "the big batch rolled the log");
        let server = Server::start(&data_dir, &serve_args);
        block_on(async {
            let mut client = Client::connect(server.addr).await.unwrap();
            let again = client
                .send_stamped(PARTITION, first, stamp(11, 0))
                .await
                .unwrap();
            assert_eq!(
                (again.base_offset, again.message_count),
                (0, 3),
                "kill {kill}"
            );
            let (code, _) = server_error(
                client
                    .send_stamped(PARTITION, stamped(stamp(11, 4), &["gap"]), stamp(11, 4))
                    .await,
            );
            assert_eq!(code, ErrorCode::SequenceGap, "kill {kill}");
            let next = client
                .send_stamped(PARTITION, stamped(stamp(11, 3), &["d"]), stamp(11, 3))
                .await
                .unwrap();
            assert_eq!(next.base_offset, 4, "kill {kill}");
            assert_eq!(
                payloads(&mut client, PARTITION).await,
                vec!["a", "b", "c", big.as_str(), "d"],
                "kill {kill}"
            );
        });
    }
}

/// The adversarial case of issue 7 item 5 (`adv_dedup`): producer A's batch, then another
/// producer fills three 4 KiB segments. Before the restart the resend of A's batch is a
/// duplicate; after kill -9 and a restart it must still be one, though A's batch lies three
/// segments before the active one: the active segment's producer-state snapshot remembers it.
#[test]
fn issue7_5_resend_after_restart_is_deduplicated_across_segment_rolls() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let serve_args: Vec<&str> = SERVE_ARGS
        .iter()
        .chain(&["--segment-size", "4096"])
        .copied()
        .collect();
    let server = Server::start(&data_dir, &serve_args);
    create_topic(server.addr, 1);
    let first = stamped(stamp(0xA, 0), &["A0"]);
    let filler = "b".repeat(400);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let ack = client
            .send_stamped(PARTITION, first.clone(), stamp(0xA, 0))
            .await
            .unwrap();
        assert_eq!(ack.base_offset, 0);
        let mut producer = Producer::new(Client::connect(server.addr).await.unwrap());
        for index in 0..30u64 {
            let mut builder = BatchBuilder::default();
            builder.push(index, 0, filler.as_bytes());
            let ack = producer.send(PARTITION, builder).await.unwrap();
            assert_eq!(ack.base_offset, 1 + index);
        }
        let again = client
            .send_stamped(PARTITION, first.clone(), stamp(0xA, 0))
            .await
            .unwrap();
        assert_eq!((again.base_offset, again.message_count), (0, 1));
    });
    server.kill9();
    let partition_dir = data_dir.join("partitions/1/1/0");
    let segment_count = std::fs::read_dir(&partition_dir)
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .path()
                .extension()
                .is_some_and(|extension| extension == "log")
        })
        .count();
    assert!(
        segment_count >= 4,
        "the filler rolled the log at least three times: {segment_count} segments"
    );
    let server = Server::start(&data_dir, &serve_args);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let again = client
            .send_stamped(PARTITION, first, stamp(0xA, 0))
            .await
            .unwrap();
        assert_eq!((again.base_offset, again.message_count), (0, 1));
        let next = client
            .send_stamped(PARTITION, stamped(stamp(0xA, 1), &["A1"]), stamp(0xA, 1))
            .await
            .unwrap();
        assert_eq!(next.base_offset, 31);
        let stored = payloads(&mut client, PARTITION).await;
        assert_eq!(stored.len(), 32);
        assert_eq!(stored.iter().filter(|payload| *payload == "A0").count(), 1);
        assert_eq!(stored[0], "A0");
        assert_eq!(stored[31], "A1");
    });
    assert_eq!(server.stop(), Some(0));
    // The snapshot files are the log's own: `inspect segment` reports no damage beside them.
    let output = Command::new(BIN)
        .args(["inspect", "segment"])
        .arg(&partition_dir)
        .output()
        .unwrap();
    assert_eq!(
        output.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stdout)
    );
}

/// Producer A's batch at offset 0, then a plain producer fills 4 KiB segments; kill -9, then
/// `damage` the active segment's producer-state snapshot before the restart. Open rebuilds the
/// state from the previous segment's snapshot (which still holds A) and the stamps after it, so
/// A's resend gets offset 0 again. Returns the resend's offset and how often "A0" is stored.
fn resend_after_damaging_the_active_snapshot(damage: impl Fn(&Path)) -> (u64, usize) {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let serve_args: Vec<&str> = SERVE_ARGS
        .iter()
        .chain(&["--segment-size", "4096"])
        .copied()
        .collect();
    let server = Server::start(&data_dir, &serve_args);
    create_topic(server.addr, 1);
    let first = stamped(stamp(0xA, 0), &["A0"]);
    let filler = "b".repeat(400);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client
            .send_stamped(PARTITION, first.clone(), stamp(0xA, 0))
            .await
            .unwrap();
        let mut producer = Producer::new(Client::connect(server.addr).await.unwrap());
        for index in 0..40u64 {
            let mut builder = BatchBuilder::default();
            builder.push(index, 0, filler.as_bytes());
            producer.send(PARTITION, builder).await.unwrap();
        }
    });
    server.kill9();
    let partition_dir = data_dir.join("partitions/1/1/0");
    let mut snapshots: Vec<_> = std::fs::read_dir(&partition_dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| {
            path.extension()
                .is_some_and(|extension| extension == "producers")
        })
        .collect();
    snapshots.sort();
    assert_eq!(
        snapshots.len(),
        2,
        "the active segment's and the previous one's: {snapshots:?}"
    );
    damage(&snapshots[1]);
    let server = Server::start(&data_dir, &serve_args);
    let (offset, stored) = block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let again = client
            .send_stamped(PARTITION, first, stamp(0xA, 0))
            .await
            .unwrap();
        (again.base_offset, payloads(&mut client, PARTITION).await)
    });
    assert_eq!(server.stop(), Some(0));
    assert_eq!(stored.len(), 41);
    (
        offset,
        stored.iter().filter(|payload| *payload == "A0").count(),
    )
}

#[test]
fn issue7_adv2_missing_active_snapshot_keeps_exactly_once() {
    let resent = resend_after_damaging_the_active_snapshot(|path| {
        std::fs::remove_file(path).unwrap();
    });
    assert_eq!(resent, (0, 1));
}

#[test]
fn issue7_adv2_truncated_active_snapshot_keeps_exactly_once() {
    let resent = resend_after_damaging_the_active_snapshot(|path| {
        let bytes = std::fs::read(path).unwrap();
        std::fs::write(path, &bytes[..bytes.len() - 3]).unwrap();
    });
    assert_eq!(resent, (0, 1));
}

/// The same stamped batch sent on two connections at once (two shards may route it): the owner
/// shard checks and enqueues in one step, so it is appended once and both senders get its offset
/// (one of them possibly after a `Busy` while the first append is in flight, which the client
/// resends).
#[test]
fn issue7_5_concurrent_resends_of_one_batch_append_it_once() {
    const ROUNDS: u64 = 20;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &SERVE_ARGS);
    create_topic(server.addr, 1);
    let addr = server.addr;
    for round in 0..ROUNDS {
        let batch = stamped(stamp(21, round), &[&format!("round {round}")]);
        let barrier = std::sync::Barrier::new(2);
        let acks: Vec<u64> = std::thread::scope(|scope| {
            let senders: Vec<_> = (0..2)
                .map(|_| {
                    let (batch, barrier) = (batch.clone(), &barrier);
                    scope.spawn(move || {
                        block_on(async move {
                            let mut client = Client::connect(addr).await.unwrap();
                            client.ping().await.unwrap();
                            barrier.wait();
                            client
                                .send_stamped(PARTITION, batch, stamp(21, round))
                                .await
                                .unwrap()
                                .base_offset
                        })
                    })
                })
                .collect();
            senders
                .into_iter()
                .map(|sender| sender.join().unwrap())
                .collect()
        });
        assert_eq!(acks, vec![round, round], "round {round}");
    }
    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let expected: Vec<String> = (0..ROUNDS).map(|round| format!("round {round}")).collect();
        assert_eq!(payloads(&mut client, PARTITION).await, expected);
    });
}

/// Runs `shardline send` for the partition with `input` on stdin and `--batch 2`; returns the
/// exit code and the trimmed stdout.
fn cli_send(addr: SocketAddr, input: &str) -> (Option<i32>, String) {
    use std::io::Write;
    let mut child = Command::new(BIN)
        .args([
            "send", "--stream", "1", "--topic", "1", "--batch", "2", "--addr",
        ])
        .arg(addr.to_string())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(input.as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap().trim().to_owned(),
    )
}

#[test]
fn issue7_5_cli_send_stamps_batches_with_a_new_producer_per_invocation() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &SERVE_ARGS);
    create_topic(server.addr, 1);
    assert_eq!(cli_send(server.addr, "a\nb\nc\n").0, Some(0));
    assert_eq!(cli_send(server.addr, "d\n").0, Some(0));
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let body = client.poll_messages(PARTITION, 0, 100).await.unwrap();
        let stamps: Vec<ProducerStamp> = bus::BatchView::parse_many(&body)
            .unwrap()
            .iter()
            .map(|batch| {
                batch
                    .producer_stamp()
                    .expect("the CLI sends stamped batches")
            })
            .collect();
        assert_eq!(stamps.len(), 3, "batches of 2, 1 and 1 messages");
        assert_eq!(
            stamps
                .iter()
                .map(|stamp| stamp.sequence)
                .collect::<Vec<_>>(),
            vec![0, 2, 0]
        );
        assert_eq!(stamps[0].producer, stamps[1].producer);
        assert_ne!(stamps[0].producer, stamps[2].producer);
        assert!(stamps.iter().all(|stamp| stamp.producer != 0));
        assert_eq!(
            payloads(&mut client, PARTITION).await,
            vec!["a", "b", "c", "d"]
        );
    });
}

// ------------------------------------------------------------------------------------------------
// Repeated kill -9 during concurrent idempotent sends.

const PRODUCER_COUNT: u16 = 3;
const PARTITION_COUNT: u16 = 2;
const KILL_CYCLES: u32 = 6;
const MESSAGES_PER_BATCH: u32 = 4;
/// Longer than any restart here takes, so no send runs out of retries.
const PRODUCER_RETRY_BUDGET: Duration = Duration::from_mins(2);

fn message_payload(producer: u16, batch: u32, index: u32) -> String {
    format!("producer {producer} batch {batch} message {index}")
}

/// Sends batches from producer `producer_index` to its partition until `stop` is set and at
/// least one more batch went out after it; returns the payloads acknowledged, in order.
fn run_producer(addr: SocketAddr, producer_index: u16, stop: &AtomicBool) -> Vec<String> {
    block_on(async move {
        let client = Client::connect(addr)
            .await
            .unwrap()
            .with_retry_budget(PRODUCER_RETRY_BUDGET);
        let mut producer = Producer::new(client);
        let namespace = partition(producer_index % PARTITION_COUNT);
        let mut acknowledged = Vec::new();
        for batch in 0u32.. {
            let stopping = stop.load(Ordering::Acquire);
            let mut builder = BatchBuilder::default();
            for index in 0..MESSAGES_PER_BATCH {
                builder.push(
                    u64::from(index),
                    0,
                    message_payload(producer_index, batch, index).as_bytes(),
                );
            }
            let producer_id = producer.producer_id();
            let ack = producer
                .send(namespace, builder)
                .await
                .unwrap_or_else(|error| {
                    panic!(
                        "producer {producer_index} batch {batch} (id {producer_id}) failed: {error}"
                    )
                });
            assert_eq!(ack.message_count, MESSAGES_PER_BATCH);
            acknowledged.extend(
                (0..MESSAGES_PER_BATCH).map(|index| message_payload(producer_index, batch, index)),
            );
            if stopping {
                return acknowledged;
            }
        }
        unreachable!("the loop ends when stop is set")
    })
}

/// Restarts the server on `addr` (the port the producers reconnect to); the server itself retries
/// a port the killed one still holds (issue 7 section 3).
fn restart_on(data_dir: &Path, addr: SocketAddr, serve_args: &[&str]) -> Server {
    Server::start_listening(Command::new(BIN), &addr.to_string(), data_dir, serve_args)
}

#[test]
fn issue7_5_kill_9_during_idempotent_sends_stores_every_message_exactly_once() {
    kill_9_during_idempotent_sends(&[]);
}

/// The same with 4 KiB segments: a partition rolls every dozen batches, so resends after a
/// restart also find their batch in the tail of the segment before the last.
#[test]
fn issue7_5_kill_9_during_idempotent_sends_across_segment_rolls_stores_every_message_once() {
    kill_9_during_idempotent_sends(&["--segment-size", "4096"]);
}

fn kill_9_during_idempotent_sends(extra_args: &[&str]) {
    let serve_args: Vec<&str> = SERVE_ARGS.iter().chain(extra_args).copied().collect();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut server = Server::start(&data_dir, &serve_args);
    let addr = server.addr;
    create_topic(addr, u32::from(PARTITION_COUNT));

    let stop = Arc::new(AtomicBool::new(false));
    let producers: Vec<_> = (0..PRODUCER_COUNT)
        .map(|producer_index| {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || run_producer(addr, producer_index, &stop))
        })
        .collect();
    for cycle in 0..KILL_CYCLES {
        // Pacing only: whatever the timing, the data must check out below.
        std::thread::sleep(Duration::from_millis(300 + 100 * u64::from(cycle % 3)));
        server.kill9();
        server = restart_on(&data_dir, addr, &serve_args);
    }
    stop.store(true, Ordering::Release);
    let acknowledged: Vec<Vec<String>> = producers
        .into_iter()
        .map(|producer| producer.join().unwrap())
        .collect();

    block_on(async {
        let mut client = Client::connect(addr).await.unwrap();
        let mut stored: BTreeMap<u16, Vec<String>> = BTreeMap::new();
        for partition_id in 0..PARTITION_COUNT {
            stored.insert(
                partition_id,
                payloads(&mut client, partition(partition_id)).await,
            );
        }
        for (producer_index, sent) in acknowledged.iter().enumerate() {
            let producer_index = producer_index as u16;
            let prefix = format!("producer {producer_index} ");
            let in_partition: Vec<&String> = stored[&(producer_index % PARTITION_COUNT)]
                .iter()
                .filter(|payload| payload.starts_with(&prefix))
                .collect();
            let sent: Vec<&String> = sent.iter().collect();
            assert_eq!(
                in_partition, sent,
                "producer {producer_index}: stored messages differ from the acknowledged ones \
                 (a duplicate, a loss or another order)"
            );
        }
        let total_stored: usize = stored.values().map(Vec::len).sum();
        let total_sent: usize = acknowledged.iter().map(Vec::len).sum();
        assert_eq!(
            total_stored, total_sent,
            "messages no producer acknowledged"
        );
    });
    assert_eq!(server.stop(), Some(0));
}
