//! Issue 3: while shard 0 writes a snapshot of at least 64 MiB, its reactor keeps answering Ping
//! round trips (the JSON is encoded on the blocking pool and the file is written through
//! `io_uring`, so nothing in the write blocks the reactor).
//!
//! The data directory is built offline as a checkpoint the server itself could have written: a
//! snapshot at op `CHECKPOINT_OP` holding a few thousand streams and a full client table (every
//! session with its reply ring full), paired in the superblock, and an empty journal segment that
//! starts right above it. Two client ops then make a checkpoint due (`--checkpoint-interval 2`);
//! pings answered between the observed "checkpoint started" and "checkpoint done" log lines prove
//! the reactor was not blocked. It must never assert on durations: only on what was answered
//! inside the window.
//!
//! The bulk of the snapshot is the client table, not streams: booting checks the metadata by
//! replaying every stream as a create, and each create scans every stream name
//! (`MetadataState::validate`), which is quadratic in the stream count and takes minutes for the
//! ~240k streams a metadata-only 64 MiB snapshot would need.

mod common;

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Server, block_on};
use shards::metadata::{MetadataState, StreamState};
use shards::vsr::client_table::{CachedReply, ClientTableSnapshot, SessionSnapshot};
use shards::vsr::snapshot::{SNAPSHOT_PAYLOAD_VERSION, SnapshotPayload};
use storage::superblock::{Superblock, SuperblockState};

/// Streams in the fixture, each with a name of `bus::limits::NAME_LEN_MAX` bytes.
const STREAM_COUNT: u32 = 2_000;
/// Client sessions in the fixture: with full reply rings this makes the payload about 66 MiB.
const SESSION_COUNT: u64 = 100_000;
/// Ops per fixture session: its Register, then one committed request per cached reply.
const OPS_PER_SESSION: u64 = 1 + shards::limits::REPLY_RING_LEN_MAX as u64;
/// The fixture's checkpoint: the last op of the last session.
const CHECKPOINT_OP: u64 = SESSION_COUNT * OPS_PER_SESSION;
/// The size the issue asks for.
const SNAPSHOT_SIZE_MIN_BYTES: u64 = 64 * 1024 * 1024;
/// Room for the fixture's sessions plus the test client's.
const CLIENTS_TABLE_MAX: &str = "131072";
/// Pings answered inside the checkpoint window for the test to accept it.
const PINGS_IN_WINDOW_MIN: usize = 3;
/// How long to wait for each checkpoint log line.
const LOG_WAIT_MAX: Duration = Duration::from_mins(2);
/// How often the watcher reads the server's log.
const LOG_POLL_INTERVAL: Duration = Duration::from_millis(2);
/// Pause between two pings, so the pinger does not take a whole core from the server.
const PING_INTERVAL: Duration = Duration::from_millis(1);

fn server_args() -> [&'static str; 7] {
    [
        "--shards",
        "1",
        "--no-pin",
        "--checkpoint-interval",
        "2",
        "--clients-table-max",
        CLIENTS_TABLE_MAX,
    ]
}

fn stream_name(stream_id: u32) -> String {
    let mut name = format!("stream-{stream_id:06}-");
    name.extend(std::iter::repeat_n(
        'x',
        bus::limits::NAME_LEN_MAX - name.len(),
    ));
    name
}

/// Distinct, non-zero, full-width ids: multiplying by an odd constant is a bijection mod 2^128.
fn client_id(index: u64) -> u128 {
    (u128::from(index) + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15_f39c_c060_5ced_c835)
}

/// Session `index` registered at op `index * OPS_PER_SESSION + 1` and committed one CreateStream
/// request per later op of its block; its ring holds the replies to all of them.
fn session(index: u64) -> SessionSnapshot {
    let register_op = index * OPS_PER_SESSION + 1;
    let request_count = OPS_PER_SESSION - 1;
    SessionSnapshot {
        client: format!("{:#x}", client_id(index)),
        session: register_op,
        request: request_count,
        commit_op: register_op + request_count,
        replies: (1..=request_count)
            .map(|request| CachedReply {
                request,
                operation: bus::Operation::CreateStream as u8,
                error_code: 0,
                offset: 0,
                count: 0,
                body: Vec::new(),
            })
            .collect(),
    }
}

/// Writes the fixture into `data_dir`; returns the snapshot file's size in bytes.
fn build_data_dir(data_dir: &Path) -> u64 {
    let mut metadata = MetadataState::new();
    for stream_id in 1..=STREAM_COUNT {
        metadata.streams.insert(
            stream_id,
            StreamState {
                name: stream_name(stream_id),
                topics: BTreeMap::new(),
            },
        );
    }
    metadata.op = CHECKPOINT_OP;
    let payload = SnapshotPayload {
        version: SNAPSHOT_PAYLOAD_VERSION,
        checkpoint_op: CHECKPOINT_OP,
        metadata,
        client_table: ClientTableSnapshot {
            sessions: (0..SESSION_COUNT).map(session).collect(),
        },
    };
    let bytes = payload.encode();
    drop(payload);
    std::fs::create_dir_all(data_dir).unwrap();
    let snapshot_file = shards::vsr::snapshot_path(data_dir);
    block_on(async {
        let snapshot_checksum =
            storage::snapshot::write_snapshot(&snapshot_file, CHECKPOINT_OP, bytes, &mut |_| {})
                .await
                .unwrap();
        Superblock::create(
            &shards::vsr::superblock_path(data_dir),
            SuperblockState {
                replica_count: 1,
                checkpoint_op: CHECKPOINT_OP,
                commit_max: CHECKPOINT_OP,
                snapshot_checksum,
                ..SuperblockState::default()
            },
        )
        .await
        .unwrap();
    });
    // The journal as a checkpoint leaves it: every op up to the checkpoint released, the active
    // segment empty and starting at the next op.
    let journal_dir = shards::vsr::journal_dir(data_dir);
    std::fs::create_dir_all(&journal_dir).unwrap();
    std::fs::File::create(storage::journal::segment_path(
        &journal_dir,
        CHECKPOINT_OP + 1,
    ))
    .unwrap();
    std::fs::metadata(&snapshot_file).unwrap().len()
}

/// Polls `server`'s log until it holds `needle` (after `from_bytes`); returns the instant it was
/// first seen and the log's length then.
fn wait_for_log(server: &Server, needle: &str, from_bytes: usize) -> (Instant, usize) {
    let deadline = Instant::now() + LOG_WAIT_MAX;
    loop {
        let log = server.stderr();
        if let Some(position) = log.get(from_bytes..).and_then(|tail| tail.find(needle)) {
            return (Instant::now(), from_bytes + position + needle.len());
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the server log within {LOG_WAIT_MAX:?}; log:\n{log}"
        );
        std::thread::sleep(LOG_POLL_INTERVAL);
    }
}

/// The log line containing byte `position` of `log`.
fn line_at(log: &str, position: usize) -> &str {
    let start = log[..position].rfind('\n').map_or(0, |i| i + 1);
    let end = log[position..].find('\n').map_or(log.len(), |i| position + i);
    &log[start..end]
}

#[test]
fn pings_are_answered_while_a_64_mib_snapshot_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let snapshot_size_bytes = build_data_dir(&data_dir);
    assert!(
        snapshot_size_bytes >= SNAPSHOT_SIZE_MIN_BYTES,
        "fixture snapshot is {snapshot_size_bytes} bytes, below {SNAPSHOT_SIZE_MIN_BYTES}"
    );

    let server = Server::start(&data_dir, &server_args());
    let addr = server.addr;
    let boot_log = server.stderr();
    assert!(
        boot_log.contains("metadata recovered"),
        "boot did not recover from the fixture; log:\n{boot_log}"
    );
    let log_start = boot_log.len();

    let stop = Arc::new(AtomicBool::new(false));
    let pinger = {
        let stop = Arc::clone(&stop);
        std::thread::spawn(move || {
            block_on(async move {
                let mut client = bus::Client::connect(addr).await.unwrap();
                let mut answered = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    client.ping().await.unwrap();
                    answered.push(Instant::now());
                    compio::time::sleep(PING_INTERVAL).await;
                }
                answered
            })
        })
    };
    // Register (op CHECKPOINT_OP + 1) and CreateStream (op CHECKPOINT_OP + 2): the checkpoint
    // is due and starts.
    let creator = std::thread::spawn(move || {
        block_on(async move {
            let mut client = bus::Client::connect(addr).await.unwrap();
            client
                .create_stream(STREAM_COUNT + 1, "checkpoint-trigger")
                .await
                .unwrap();
        });
    });
    let (started_at, started_end) = wait_for_log(&server, "checkpoint started", log_start);
    let (done_at, done_end) = wait_for_log(&server, "checkpoint done", started_end);
    stop.store(true, Ordering::Relaxed);
    let answered = pinger.join().unwrap();
    creator.join().unwrap();

    let log = server.stderr();
    eprintln!("{}", line_at(&log, started_end - 1));
    eprintln!("{}", line_at(&log, done_end - 1));
    let in_window: Vec<Instant> = answered
        .iter()
        .copied()
        .filter(|at| *at > started_at && *at < done_at)
        .collect();
    let gap_max = in_window
        .windows(2)
        .map(|pair| pair[1] - pair[0])
        .max()
        .unwrap_or_default();
    eprintln!(
        "fixture snapshot {snapshot_size_bytes} bytes; checkpoint window {:?}; pings answered in \
         it {} (of {} in all); largest gap between consecutive pings in it {gap_max:?}",
        done_at - started_at,
        in_window.len(),
        answered.len()
    );
    assert!(
        in_window.len() >= PINGS_IN_WINDOW_MIN,
        "only {} pings answered while the snapshot was written (at least {PINGS_IN_WINDOW_MIN} \
         expected): the reactor was blocked",
        in_window.len()
    );

    assert_eq!(server.stop(), Some(0), "clean shutdown exits 0");
    let server = Server::start(&data_dir, &server_args());
    let metadata = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.get_metadata().await.unwrap()
    });
    assert_eq!(metadata.streams.len(), STREAM_COUNT as usize + 1);
    assert_eq!(server.stop(), Some(0));
}
