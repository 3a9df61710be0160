//! Issue 10 section 1: the counters each shard keeps, gathered over the metrics lanes
//! (`RunningServer::metrics`), agree with what a client sent and read. A two-shard server (no
//! pinning, fsync always) on a temp directory: one topic with partitions on both shards, batches
//! sent to every partition and polled back, then one gather checked shard by shard against the
//! acknowledgements, the poll replies and the owners GetMetadata reports.

use std::collections::BTreeMap;
use std::time::Duration;

use bus::Namespace;
use shards::metrics::{RequestCount, ShardMetricsSnapshot};
use shards::{RunningServer, ServerConfig};

const STREAM_ID: u32 = 1;
const TOPIC_ID: u16 = 1;
const PARTITION_COUNT: u32 = 4;
const BATCH_COUNT_PER_PARTITION: u32 = 5;
const MESSAGE_COUNT_PER_BATCH: u32 = 10;
/// Small enough that a partition takes several polls to read back.
const POLL_MAX_COUNT: u32 = 15;

fn config(data_dir: &std::path::Path) -> ServerConfig {
    let mut config = ServerConfig::new(data_dir.to_path_buf());
    config.listen = "127.0.0.1:0".parse().unwrap();
    config.topology.shards = runtime::ShardCountArg::Count(2);
    config.topology.pin = false;
    config.fsync = storage::FsyncPolicy::Always;
    config
}

/// What the client saw of one owner shard's partitions.
#[derive(Debug, Default)]
struct Expected {
    partitions: u64,
    batches_appended: u64,
    messages_appended: u64,
    bytes_appended: u64,
    messages_read: u64,
    bytes_read: u64,
    polls: u64,
}

fn batch(partition: u32, index: u32) -> Vec<u8> {
    let mut builder = bus::BatchBuilder::default();
    for message in 0..MESSAGE_COUNT_PER_BATCH {
        let payload = format!("partition {partition} batch {index} message {message}");
        builder.push(u64::from(message), 1, payload.as_bytes());
    }
    builder.finish()
}

fn request_count(snapshots: &[ShardMetricsSnapshot], operation: &str, result: &str) -> u64 {
    snapshots
        .iter()
        .flat_map(|snapshot| &snapshot.requests)
        .filter(|count| count.operation == operation && count.result == result)
        .map(|count| count.count)
        .sum()
}

#[test]
fn gathered_counters_match_what_the_client_sent_and_read() {
    let dir = tempfile::tempdir().unwrap();
    let server = RunningServer::start(config(dir.path())).unwrap();
    let addr = server.local_addr;
    let runtime = compio::runtime::Runtime::new().unwrap();
    let (expected, sends, polls, snapshots) = runtime.block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.register().await.unwrap();
        client.create_stream(STREAM_ID, "metrics").await.unwrap();
        client
            .create_topic(STREAM_ID, TOPIC_ID, "gather", PARTITION_COUNT)
            .await
            .unwrap();
        let metadata = client.get_metadata().await.unwrap();
        let owners: BTreeMap<u16, u16> = metadata.streams[0].topics[0]
            .partitions
            .iter()
            .map(|partition| (partition.partition_id, partition.owner_shard))
            .collect();
        assert_eq!(
            owners
                .values()
                .copied()
                .collect::<std::collections::BTreeSet<_>>(),
            [0, 1].into(),
            "the topic's partitions must lie on both shards: {owners:?}"
        );
        let mut expected: BTreeMap<u16, Expected> = BTreeMap::new();
        let (mut sends, mut polls) = (0u64, 0u64);
        for (partition, owner) in &owners {
            let namespace = Namespace::new(STREAM_ID, TOPIC_ID, *partition);
            let figures = expected.entry(*owner).or_default();
            figures.partitions += 1;
            for index in 0..BATCH_COUNT_PER_PARTITION {
                let batch = batch(u32::from(*partition), index);
                let byte_count = batch.len() as u64;
                let ack = client.send_messages(namespace, batch).await.unwrap();
                sends += 1;
                figures.batches_appended += 1;
                figures.messages_appended += u64::from(ack.message_count);
                figures.bytes_appended += byte_count;
            }
            let mut offset = 0;
            loop {
                let polled = client
                    .poll(namespace, offset, POLL_MAX_COUNT)
                    .await
                    .unwrap();
                polls += 1;
                figures.polls += 1;
                figures.messages_read += u64::from(polled.message_count);
                figures.bytes_read += polled.batches.len() as u64;
                if polled.caught_up() {
                    break;
                }
                offset += u64::from(polled.message_count);
            }
        }
        // Gathered while the client's connection is still open.
        let gathered = server.metrics.gather(Duration::from_secs(10));
        let snapshots: Vec<ShardMetricsSnapshot> = gathered
            .shards
            .into_iter()
            .map(|snapshot| snapshot.expect("every shard answers"))
            .collect();
        (expected, sends, polls, snapshots)
    });
    server.stop_handle().stop();
    server.join().unwrap();

    assert_eq!(snapshots.len(), 2);
    let sent_messages =
        u64::from(PARTITION_COUNT * BATCH_COUNT_PER_PARTITION * MESSAGE_COUNT_PER_BATCH);
    assert_eq!(
        expected.values().map(|e| e.messages_appended).sum::<u64>(),
        sent_messages
    );
    assert_eq!(
        expected.values().map(|e| e.messages_read).sum::<u64>(),
        sent_messages,
        "the polls read back every message once"
    );
    for (index, snapshot) in snapshots.iter().enumerate() {
        let shard = u16::try_from(index).unwrap();
        assert_eq!(snapshot.shard, shard);
        let figures = &expected[&shard];
        assert_eq!(snapshot.partitions, figures.partitions, "shard {shard}");
        assert_eq!(
            (snapshot.messages_appended, snapshot.bytes_appended),
            (figures.messages_appended, figures.bytes_appended),
            "shard {shard}: appended = acknowledged"
        );
        assert_eq!(
            (snapshot.messages_read, snapshot.bytes_read),
            (figures.messages_read, figures.bytes_read),
            "shard {shard}: read = what the polls returned"
        );
        assert!(snapshot.fsyncs >= 1, "shard {shard} owns partitions");
        assert_eq!(snapshot.fsync_latency_seconds.count, snapshot.fsyncs);
        assert_eq!(snapshot.group_commit_batch_size.count, snapshot.fsyncs);
        // Under `always` every acknowledged append was covered by exactly one fsync.
        assert!(
            (snapshot.group_commit_batch_size.sum - figures.batches_appended as f64).abs() < 1e-9,
            "shard {shard}: fsyncs covered {} appends, {} batches were acknowledged",
            snapshot.group_commit_batch_size.sum,
            figures.batches_appended
        );
        assert!(snapshot.cpu_seconds > 0.0, "shard {shard}");
        assert_eq!(snapshot.mesh_inbox_full, 0, "shard {shard}");
        assert_eq!(snapshot.busy_replies, 0, "shard {shard}");
        assert_eq!(snapshot.connections_refused, 0, "shard {shard}");
        assert!(snapshot.connections_max > 0, "shard {shard}");
        assert_eq!(
            snapshot.receive_budget_bytes_in_use, 0,
            "shard {shard}: at rest"
        );
        assert!(snapshot.receive_budget_bytes_max > 0, "shard {shard}");
        assert_eq!(snapshot.replica.is_some(), shard == 0, "shard {shard}");
    }
    assert_eq!(
        snapshots.iter().map(|s| s.connections_open).sum::<u64>(),
        1,
        "one client connection, on one shard"
    );
    assert_eq!(request_count(&snapshots, "send_messages", "ok"), sends);
    assert_eq!(request_count(&snapshots, "poll_messages", "ok"), polls);
    assert_eq!(request_count(&snapshots, "register", "ok"), 1);
    assert_eq!(request_count(&snapshots, "create_stream", "ok"), 1);
    assert_eq!(request_count(&snapshots, "create_topic", "ok"), 1);
    assert_eq!(request_count(&snapshots, "get_metadata", "ok"), 1);
    let errors: Vec<&RequestCount> = snapshots
        .iter()
        .flat_map(|snapshot| &snapshot.requests)
        .filter(|count| count.result != "ok")
        .collect();
    assert!(errors.is_empty(), "no request failed: {errors:?}");
    // The connection's shard forwards every send and poll of the other shard's partitions and
    // gets a reply for each: two frames per request at least.
    let client_shard = snapshots
        .iter()
        .position(|s| s.connections_open == 1)
        .unwrap();
    let other = &expected[&u16::try_from(1 - client_shard).unwrap()];
    let remote_requests = other.batches_appended + other.polls;
    assert!(
        snapshots.iter().map(|s| s.mesh_frames_sent).sum::<u64>() >= 2 * remote_requests,
        "{snapshots:#?}"
    );

    let replica = snapshots[0].replica.as_ref().unwrap();
    assert!(replica.ops_committed >= 2, "{replica:#?}");
    assert!(replica.sessions >= 1, "{replica:#?}");
    assert_eq!(
        replica.commit_latency_seconds.count, 3,
        "register, create_stream, create_topic: {replica:#?}"
    );
    assert!(replica.is_primary && replica.primary == Some(0) && replica.replica == 0);
    assert!(replica.commit_min >= 3 && replica.commit_max >= replica.commit_min);
    assert!(
        replica.journal_bytes > 0,
        "three ops journaled: {replica:#?}"
    );
    assert_eq!(
        (
            replica.state_transfers_started,
            replica.state_transfers_completed,
            replica.state_transfers_failed
        ),
        (0, 0, 0)
    );
}
