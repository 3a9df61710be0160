//! Issue 3: while shard 0 writes a snapshot of at least 64 MiB, its reactor keeps answering Ping
//! round trips (the JSON is encoded on the blocking pool and the file is written through
//! `io_uring`, so nothing in the write blocks the reactor).
//!
//! The data directory is built offline as a checkpoint the server itself could have written: a
//! snapshot at op `CHECKPOINT_OP` holding a few thousand streams and a full client table (every
//! session with its reply ring full), paired in the superblock, and an empty journal segment that
//! starts right above it. Two client ops then make a checkpoint due (`--checkpoint-interval 2`);
//! pings answered between the observed "checkpoint started" line and both the snapshot file's
//! rename and the "checkpoint done" line prove the reactor was not blocked. It must never assert
//! on durations: only on what was answered inside those windows.
//!
//! The bulk of the snapshot is the client table, not streams: booting checks the metadata by
//! replaying every stream as a create, and each create scans every stream name
//! (`MetadataState::validate`), which is quadratic in the stream count and takes minutes for the
//! ~240k streams a metadata-only 64 MiB snapshot would need.

mod common;

use std::collections::BTreeMap;
use std::os::unix::fs::MetadataExt;
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
                request_checksum: request,
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
    let snapshot_file = shards::store::snapshot_path(data_dir);
    block_on(async {
        let snapshot_checksum =
            storage::snapshot::write_snapshot(&snapshot_file, CHECKPOINT_OP, bytes, &mut |_| {})
                .await
                .unwrap();
        Superblock::create(
            &shards::store::superblock_path(data_dir),
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
    let journal_dir = shards::store::journal_dir(data_dir);
    std::fs::create_dir_all(&journal_dir).unwrap();
    std::fs::File::create(storage::journal::segment_path(
        &journal_dir,
        CHECKPOINT_OP + 1,
    ))
    .unwrap();
    std::fs::metadata(&snapshot_file).unwrap().len()
}

/// What the watcher saw during the checkpoint, each at the instant it was first seen.
struct Observed {
    started_at: Instant,
    /// `DATA/snapshot` names a new file: the durable replace renamed its written, fsynced tmp
    /// file over it, so the whole snapshot write lies between `started_at` and this.
    renamed_at: Instant,
    done_at: Instant,
    /// Byte positions in the log just past "checkpoint started" and "checkpoint done".
    started_end: usize,
    done_end: usize,
}

/// Polls the server's log (after byte `from_bytes`) and the snapshot file's inode every
/// `LOG_POLL_INTERVAL` until "checkpoint done" is logged.
///
/// # Panics
/// If a step is not seen within `LOG_WAIT_MAX`, or the steps are seen out of order.
fn watch_checkpoint(server: &Server, data_dir: &Path, from_bytes: usize) -> Observed {
    let snapshot_file = shards::store::snapshot_path(data_dir);
    let inode = || std::fs::metadata(&snapshot_file).unwrap().ino();
    let inode_before = inode();
    let deadline = Instant::now() + LOG_WAIT_MAX;
    let mut started: Option<(Instant, usize)> = None;
    let mut renamed_at: Option<Instant> = None;
    loop {
        let renamed = inode() != inode_before;
        let log = server.stderr();
        let now = Instant::now();
        let find = |needle: &str, from: usize| {
            log.get(from..)
                .and_then(|tail| tail.find(needle))
                .map(|position| from + position + needle.len())
        };
        if started.is_none() {
            started = find("checkpoint started", from_bytes).map(|end| (now, end));
        }
        if let Some((started_at, started_end)) = started {
            if renamed && renamed_at.is_none() {
                renamed_at = Some(now);
            }
            if let Some(done_end) = find("checkpoint done", started_end) {
                let renamed_at =
                    renamed_at.expect("the snapshot is renamed before checkpoint done");
                return Observed {
                    started_at,
                    renamed_at,
                    done_at: now,
                    started_end,
                    done_end,
                };
            }
        } else {
            assert!(
                !renamed,
                "snapshot replaced before \"checkpoint started\" was logged"
            );
        }
        assert!(
            now < deadline,
            "checkpoint not done within {LOG_WAIT_MAX:?}; log:\n{log}"
        );
        std::thread::sleep(LOG_POLL_INTERVAL);
    }
}

/// The log line containing byte `position` of `log`.
fn line_at(log: &str, position: usize) -> &str {
    let start = log[..position].rfind('\n').map_or(0, |i| i + 1);
    let end = log[position..]
        .find('\n')
        .map_or(log.len(), |i| position + i);
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
    let observed = watch_checkpoint(&server, &data_dir, log_start);
    stop.store(true, Ordering::Relaxed);
    let answered = pinger.join().unwrap();
    creator.join().unwrap();

    let log = server.stderr();
    eprintln!("{}", line_at(&log, observed.started_end - 1));
    eprintln!("{}", line_at(&log, observed.done_end - 1));
    let between = |from: Instant, to: Instant| -> Vec<Instant> {
        answered
            .iter()
            .copied()
            .filter(|at| *at > from && *at < to)
            .collect()
    };
    let gap_max = |pings: &[Instant]| {
        pings
            .windows(2)
            .map(|pair| pair[1] - pair[0])
            .max()
            .unwrap_or_default()
    };
    let in_checkpoint = between(observed.started_at, observed.done_at);
    let in_write = between(observed.started_at, observed.renamed_at);
    eprintln!(
        "fixture snapshot {snapshot_size_bytes} bytes; {} pings answered in all",
        answered.len()
    );
    eprintln!(
        "\"checkpoint started\" to \"checkpoint done\": {:?}, {} pings answered, largest gap {:?}",
        observed.done_at - observed.started_at,
        in_checkpoint.len(),
        gap_max(&in_checkpoint)
    );
    eprintln!(
        "\"checkpoint started\" to snapshot renamed: {:?}, {} pings answered, largest gap {:?}",
        observed.renamed_at - observed.started_at,
        in_write.len(),
        gap_max(&in_write)
    );
    // The window between the log lines also holds the superblock writes and the journal
    // release; the window up to the rename holds only the snapshot write, so a reactor blocked
    // by the write fails this one even if pings slip through during the superblock fsyncs.
    for (window, pings) in [
        ("between the two log lines", &in_checkpoint),
        ("while the snapshot file was written", &in_write),
    ] {
        assert!(
            pings.len() >= PINGS_IN_WINDOW_MIN,
            "only {} pings answered {window} (at least {PINGS_IN_WINDOW_MIN} expected): the \
             reactor was blocked",
            pings.len()
        );
    }

    assert_eq!(server.stop(), Some(0), "clean shutdown exits 0");
    let server = Server::start(&data_dir, &server_args());
    let metadata = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.get_metadata().await.unwrap()
    });
    assert_eq!(metadata.streams.len(), STREAM_COUNT as usize + 1);
    assert_eq!(server.stop(), Some(0));
}
