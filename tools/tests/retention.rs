//! Issue 11 section 4 (retention) end to end, through the real `shardline serve` binary: a topic
//! created or altered with a retention by size or by age loses its oldest sealed segments (never
//! the active one), its partition's first offset moves and `metadata` shows it, a poll below it
//! is `OffsetOutOfRange` naming the first offset, and a restart (clean or kill -9) accepts the
//! retained log.
//!
//! Every batch here is one 1000-byte message: a 1064-byte entry, so a 4096-byte segment holds
//! exactly three. Timestamps are chosen by the test (an hour old or now) and the age limit is
//! half an hour, so which segments expire never depends on how long the test takes (a loaded
//! 2-core CI machine may take minutes). Waits poll for a condition with a generous deadline and
//! fail naming what they last saw; nothing asserts a duration.
//!
//! A pass moves the first offset (what `metadata` shows) before it unlinks the segment files
//! (`PartitionLog::apply_retention`: floor, then the log, then the files), so the files on disk
//! are waited for, never read once right after the first offset moved: that read raced the
//! unlink and failed about 1 run in 15 under load.

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bus::{BatchBuilder, Client, ClientError, ErrorCode, Namespace};
use common::{Server, block_on};

const SEGMENT_SIZE: &str = "4096";
/// Batches per 4096-byte segment (1064-byte entries).
const BATCHES_PER_SEGMENT: u64 = 3;
const ENTRY_SIZE_BYTES: u64 = 1064;
/// How long the test waits for a retention pass before it gives up.
const WAIT_MAX: Duration = Duration::from_mins(1);
/// How long a wait sleeps between two looks.
const WAIT_POLL_INTERVAL: Duration = Duration::from_millis(20);
/// Microseconds in an hour: the age of the test's old batches.
const HOUR_US: u64 = 3_600_000_000;
/// The age limit set by `AlterTopic`: half an hour, so batches an hour old are expired and
/// batches stamped during the test never are, however slowly it runs.
const AGE_MAX_MS: u64 = 1_800_000;

fn start(data_dir: &Path) -> Server {
    Server::start(
        data_dir,
        &[
            "--shards",
            "2",
            "--no-pin",
            "--segment-size",
            SEGMENT_SIZE,
            "--retention-interval",
            "100ms",
        ],
    )
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_micros() as u64
}

/// A batch of one 1000-byte message stamped `timestamp_us`.
fn batch(timestamp_us: u64, seed: u8) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(1, 1000);
    builder.push(u64::from(seed), timestamp_us, &[seed; 1000]);
    builder.finish()
}

async fn send_all(client: &mut Client, namespace: Namespace, timestamps_us: &[u64]) {
    for (seed, &timestamp_us) in timestamps_us.iter().enumerate() {
        client
            .send_messages(namespace, batch(timestamp_us, seed as u8))
            .await
            .unwrap();
    }
}

/// `(first_offset, next_offset)` of `namespace` as `metadata` shows it.
async fn offsets(client: &mut Client, namespace: Namespace) -> (u64, u64) {
    let metadata = client.get_metadata().await.unwrap();
    let stream = metadata
        .streams
        .iter()
        .find(|stream| stream.stream_id == namespace.stream_id())
        .unwrap();
    let topic = stream
        .topics
        .iter()
        .find(|topic| topic.topic_id == namespace.topic_id())
        .unwrap();
    let partition = &topic.partitions[usize::from(namespace.partition_id())];
    (partition.first_offset, partition.next_offset)
}

/// Waits until `metadata` shows `first_offset` for `namespace`.
async fn wait_for_first_offset(client: &mut Client, namespace: Namespace, first_offset: u64) {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let (now_first, _) = offsets(client, namespace).await;
        if now_first == first_offset {
            return;
        }
        assert!(
            now_first < first_offset,
            "first offset {now_first} of {namespace} passed the expected {first_offset}"
        );
        assert!(
            Instant::now() < deadline,
            "first offset of {namespace} still {now_first} after {WAIT_MAX:?}, expected {first_offset}"
        );
        compio::time::sleep(WAIT_POLL_INTERVAL).await;
    }
}

fn partition_dir(data_dir: &Path, namespace: Namespace) -> PathBuf {
    shards::shard::partition_dir(data_dir, namespace)
}

/// Base offsets of the segment files in `dir`, ascending.
fn segment_bases(dir: &Path) -> Vec<u64> {
    let mut bases: Vec<u64> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|entry| {
            let name = entry.unwrap().file_name().into_string().unwrap();
            name.strip_suffix(".log")?.parse().ok()
        })
        .collect();
    bases.sort_unstable();
    bases
}

/// Waits until the segment files in `dir` are exactly `expected` (base offsets, ascending).
/// Retention only deletes a prefix, so every look must end with `expected`; a look that does not
/// fails at once, and so does one still showing more files after `WAIT_MAX`.
fn wait_for_segment_bases(dir: &Path, expected: &[u64]) {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        let bases = segment_bases(dir);
        if bases == expected {
            return;
        }
        assert!(
            bases.ends_with(expected),
            "segment files {bases:?} in {} are not the expected {expected:?} plus older ones",
            dir.display()
        );
        assert!(
            Instant::now() < deadline,
            "segment files still {bases:?} in {} after {WAIT_MAX:?}, expected {expected:?}",
            dir.display()
        );
        std::thread::sleep(WAIT_POLL_INTERVAL);
    }
}

/// The floor recorded in `dir`'s `retention-floor` file.
fn floor_on_disk(dir: &Path) -> u64 {
    let bytes =
        std::fs::read(dir.join(storage::log::retention::RETENTION_FLOOR_FILE_NAME)).unwrap();
    let payload = &bytes[..bytes.len() - storage::durable::TRAILER_SIZE];
    storage::log::retention::decode_retention_floor(payload).unwrap()
}

/// A poll at `offset` below the first offset: `OffsetOutOfRange` whose message names it.
async fn assert_poll_below(client: &mut Client, namespace: Namespace, offset: u64, first: u64) {
    match client.poll(namespace, offset, 10).await {
        Err(ClientError::Server {
            code: ErrorCode::OffsetOutOfRange,
            message,
        }) => assert!(
            message.contains(&format!(
                "offset {offset} is below the first offset {first} of partition"
            )),
            "{message}"
        ),
        other => panic!("poll at {offset}: expected OffsetOutOfRange, got {other:?}"),
    }
}

/// A poll at `first` returns the batch at `first` and says where the partition starts.
async fn assert_poll_at_first(client: &mut Client, namespace: Namespace, first: u64, next: u64) {
    let polled = client.poll(namespace, first, 1).await.unwrap();
    assert_eq!((polled.first_offset, polled.next_offset), (first, next));
    let messages = polled.messages().unwrap();
    assert_eq!(messages[0].offset, first);
}

#[test]
fn issue11_4_retention_by_size_moves_the_first_offset_and_restarts_accept_it() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let namespace = Namespace::new(1, 1, 0);
    let partition = partition_dir(&data_dir, namespace);
    // Three full segments may stay.
    let retention_bytes = BATCHES_PER_SEGMENT * ENTRY_SIZE_BYTES * 3;
    let server = start(&data_dir);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client
            .create_topic_with_retention(1, 1, "t", 1, retention_bytes, 0)
            .await
            .unwrap();
        send_all(&mut client, namespace, &[now_us(); 20]).await;
        // Segments 0, 3, .., 15 sealed and 18 active (two entries): the oldest four go, so that
        // 12 and 15 (two full) plus the active one fit the limit.
        wait_for_first_offset(&mut client, namespace, 12).await;
        assert_eq!(offsets(&mut client, namespace).await, (12, 20));
        assert_poll_below(&mut client, namespace, 0, 12).await;
        assert_poll_below(&mut client, namespace, 11, 12).await;
        assert_poll_at_first(&mut client, namespace, 12, 20).await;
    });
    wait_for_segment_bases(&partition, &[12, 15, 18]);
    assert_eq!(floor_on_disk(&partition), 12);
    assert_cli_poll_starts_at_first_offset(server.addr, 12, 20);

    assert_eq!(server.stop(), Some(0));
    let server = start(&data_dir);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        assert_eq!(offsets(&mut client, namespace).await, (12, 20));
        assert_poll_below(&mut client, namespace, 3, 12).await;
        assert_poll_at_first(&mut client, namespace, 12, 20).await;
        // Appends go on after the retained prefix; more data moves the floor on.
        send_all(&mut client, namespace, &[now_us(); 4]).await;
        wait_for_first_offset(&mut client, namespace, 15).await;
        assert_eq!(offsets(&mut client, namespace).await, (15, 24));
    });
    server.kill9();
    let server = start(&data_dir);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        assert_eq!(offsets(&mut client, namespace).await, (15, 24));
        assert_poll_at_first(&mut client, namespace, 15, 24).await;
    });
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue11_4_retention_by_age_set_by_alter_deletes_expired_sealed_segments_only() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mixed = Namespace::new(1, 1, 0);
    let all_old = Namespace::new(1, 2, 0);
    let server = start(&data_dir);
    let hour_ago = now_us() - HOUR_US;
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "mixed", 1).await.unwrap();
        client.create_topic(1, 2, "old", 1).await.unwrap();
        // Mixed: segments 0, 3, 6 an hour old, 9 recent (sealed), 12 active.
        let mut timestamps = vec![hour_ago; 9];
        timestamps.extend([now_us(); 4]);
        send_all(&mut client, mixed, &timestamps).await;
        // All old: segments 0 and 3 sealed, 6 active (one entry), every batch an hour old.
        send_all(&mut client, all_old, &[hour_ago; 7]).await;
        assert_eq!(offsets(&mut client, mixed).await, (0, 13));
        // Half an hour of age allowed, set on the existing topics through the metadata path.
        client
            .alter_topic(1, 1, None, Some(AGE_MAX_MS))
            .await
            .unwrap();
        client
            .alter_topic(1, 2, None, Some(AGE_MAX_MS))
            .await
            .unwrap();
        wait_for_first_offset(&mut client, mixed, 9).await;
        // The active segment stays however old its batches are.
        wait_for_first_offset(&mut client, all_old, 6).await;
        assert_poll_below(&mut client, mixed, 8, 9).await;
        assert_poll_at_first(&mut client, mixed, 9, 13).await;
        assert_poll_at_first(&mut client, all_old, 6, 7).await;
    });
    wait_for_segment_bases(&partition_dir(&data_dir, mixed), &[9, 12]);
    wait_for_segment_bases(&partition_dir(&data_dir, all_old), &[6]);
    server.kill9();
    let server = start(&data_dir);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        assert_eq!(offsets(&mut client, mixed).await, (9, 13));
        assert_eq!(offsets(&mut client, all_old).await, (6, 7));
        // The log whose only segment is the retained active one takes appends after restart.
        let ack = client
            .send_messages(all_old, batch(now_us(), 7))
            .await
            .unwrap();
        assert_eq!((ack.base_offset, ack.first_offset), (7, 6));
    });
    assert_eq!(server.stop(), Some(0));
}

/// `shardline poll` without `--offset` starts at the partition's first retained offset (it was
/// offset 0, which retention turned into `OffsetOutOfRange`): it prints offsets `first..next`.
fn assert_cli_poll_starts_at_first_offset(addr: std::net::SocketAddr, first: u64, next: u64) {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args([
            "poll",
            "--stream",
            "1",
            "--topic",
            "1",
            "--partition",
            "0",
            "--addr",
        ])
        .arg(addr.to_string())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "poll failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let printed: Vec<u64> = stdout
        .lines()
        .filter_map(|line| line.split('\t').next()?.parse().ok())
        .collect();
    assert_eq!(printed, (first..next).collect::<Vec<_>>(), "{stdout}");
}
