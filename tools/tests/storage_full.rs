//! Issue 7 item 1 end to end: the real `shardline serve` on a small tmpfs that the test fills.
//! A send or a metadata change refused for lack of space is answered `StorageFull` naming the
//! partition or the journal and the free bytes, nothing acknowledged is lost, and once the test
//! frees space the same server accepts sends, stream creates and Registers again and SIGTERM
//! exits 0.
//!
//! Mounting needs root (CAP_SYS_ADMIN); where `mount` is refused each test prints why and returns
//! (the same rollback is covered without a mount by `storage/tests/storage_full.rs`). The mount is
//! removed by a Drop guard after the server is gone.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use bus::{BatchBuilder, ClientError, ErrorCode, Namespace};
use common::{Server, block_on, read_all, set_process_rlimit, with_rlimit};

/// tmpfs size: a few segments of data plus the journal, superblock and snapshot.
const TMPFS_SIZE: &str = "size=4m";
const SERVE_ARGS: [&str; 6] = [
    "--shards",
    "1",
    "--no-pin",
    "--segment-size",
    "65536",
    "--fsync=always",
];
/// Bounds every "until StorageFull" loop; a 4 MiB filesystem fills long before.
const ATTEMPT_COUNT_MAX: usize = 2000;

/// A tmpfs mounted on a fresh directory, unmounted on drop.
struct TmpfsMount {
    dir: PathBuf,
    _parent: tempfile::TempDir,
}

impl TmpfsMount {
    /// Mounts a tmpfs of `options` (e.g. `size=4m`), or says why it cannot.
    fn new(options: &str) -> Result<TmpfsMount, String> {
        let parent = tempfile::tempdir().map_err(|error| error.to_string())?;
        let dir = parent.path().join("mnt");
        std::fs::create_dir(&dir).map_err(|error| error.to_string())?;
        let output = Command::new("mount")
            .args(["-t", "tmpfs", "-o", options, "tmpfs"])
            .arg(&dir)
            .output()
            .map_err(|error| format!("cannot run mount: {error}"))?;
        if !output.status.success() {
            return Err(format!(
                "mount -t tmpfs failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ));
        }
        Ok(TmpfsMount {
            dir,
            _parent: parent,
        })
    }
}

impl TmpfsMount {
    /// Changes the mount's options in place (`mount -o remount,OPTIONS`), e.g. more inodes.
    fn remount(&self, options: &str) {
        let status = Command::new("mount")
            .args(["-o", &format!("remount,{options}")])
            .arg(&self.dir)
            .status()
            .unwrap();
        assert!(status.success(), "remount {options}: {status}");
    }
}

impl Drop for TmpfsMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.dir).status();
    }
}

/// Mounts the test's tmpfs, or prints why the test is skipped.
fn mount_or_skip(test: &str) -> Option<TmpfsMount> {
    mount_with_or_skip(test, TMPFS_SIZE)
}

/// Mounts a tmpfs of `options`, or prints why the test is skipped.
fn mount_with_or_skip(test: &str, options: &str) -> Option<TmpfsMount> {
    match TmpfsMount::new(options) {
        Ok(mount) => Some(mount),
        Err(why) => {
            eprintln!(
                "{test}: skipped, no small filesystem to fill: {why} (the fault-seam tests in \
                 storage/tests/storage_full.rs still cover the rollback)"
            );
            None
        }
    }
}

/// Writes a file in `dir` until the filesystem refuses with ENOSPC; returns its path.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0xa5u8; 4096];
    loop {
        match file.write_all(&chunk) {
            Ok(()) => {}
            Err(error) if error.raw_os_error() == Some(libc::ENOSPC) => break,
            Err(error) => panic!("filling {}: {error}", path.display()),
        }
    }
    path
}

fn batch(first_id: u64, count: u64, payload_size: usize) -> Vec<u8> {
    let mut builder = BatchBuilder::with_capacity(count as usize, payload_size * count as usize);
    for id in first_id..first_id + count {
        builder.push(id, 0, &payload(id, payload_size));
    }
    builder.finish()
}

fn payload(id: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|index| (id as usize * 13 + index) as u8)
        .collect()
}

fn assert_storage_full(error: &ClientError, names: &str) {
    let ClientError::Server { code, message } = error else {
        panic!("expected StorageFull, got {error}");
    };
    assert_eq!(*code, ErrorCode::StorageFull, "{message}");
    assert!(message.contains(names), "{message:?} does not name {names}");
    assert!(
        message.contains(" bytes free"),
        "{message:?} does not give the free bytes"
    );
}

const PAYLOAD_SIZE: usize = 1500;
const BATCH_COUNT: u64 = 4;

/// The messages acknowledged so far (ids equal offsets) and the next id to send.
struct Sent {
    acked_ids: Vec<u64>,
    next_id: u64,
}

impl Sent {
    async fn send(
        &mut self,
        client: &mut bus::Client,
        namespace: Namespace,
    ) -> Result<(), ClientError> {
        let ack = client
            .send_messages(namespace, batch(self.next_id, BATCH_COUNT, PAYLOAD_SIZE))
            .await?;
        assert_eq!(
            ack.base_offset, self.next_id,
            "refused sends took no offsets"
        );
        self.acked_ids
            .extend(self.next_id..self.next_id + BATCH_COUNT);
        self.next_id += BATCH_COUNT;
        Ok(())
    }
}

/// Sends `sends_before_fill` batches, fills the filesystem, sends until refused (asserting the
/// refusal names the partition, the free bytes and `failed_step`), is refused once more, frees
/// the space and sends once more.
async fn fill_refuse_free(
    client: &mut bus::Client,
    dir: &Path,
    namespace: Namespace,
    sent: &mut Sent,
    sends_before_fill: usize,
    failed_step: &str,
) {
    for _ in 0..sends_before_fill {
        sent.send(client, namespace).await.unwrap();
    }
    let filler = fill(dir);
    let mut refusal = None;
    for _ in 0..ATTEMPT_COUNT_MAX {
        if let Err(error) = sent.send(client, namespace).await {
            refusal = Some(error);
            break;
        }
    }
    let refusal = refusal.expect("the filled filesystem refused a send");
    assert_storage_full(
        &refusal,
        "partition 1/1/0 (stream 1, topic 1, partition 0) is full",
    );
    assert_storage_full(&refusal, failed_step);
    // Still full: refused again; the log rolled back instead of poisoning.
    let again = sent.send(client, namespace).await.unwrap_err();
    assert_storage_full(&again, "partition 1/1/0");
    std::fs::remove_file(&filler).unwrap();
    sent.send(client, namespace).await.unwrap();
}

#[test]
fn issue7_1_partition_full_then_space_recovers() {
    let Some(mount) = mount_or_skip("issue7_1_partition_full_then_space_recovers") else {
        return;
    };
    let namespace = Namespace::new(1, 1, 0);
    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    let sent = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "full").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        let mut sent = Sent {
            acked_ids: Vec::new(),
            next_id: 0,
        };
        // Batches of about 6 KiB: the refused one crosses a page of the first segment and is
        // partly written, which the rollback cuts.
        let mid_segment = "00000000000000000000.log: write entries failed";
        fill_refuse_free(
            &mut client,
            &mount.dir,
            namespace,
            &mut sent,
            3,
            mid_segment,
        )
        .await;
        // Ten batches fill most of the 64 KiB segment: the refused one needs a roll, whose
        // index file write is refused.
        let at_roll = "00000000000000000000.index.tmp: write temporary file failed";
        fill_refuse_free(&mut client, &mount.dir, namespace, &mut sent, 6, at_roll).await;
        let read: Vec<u64> = read_all(&mut client, namespace)
            .await
            .into_iter()
            .map(|(offset, id, body)| {
                assert_eq!((offset, body), (id, payload(id, PAYLOAD_SIZE)));
                id
            })
            .collect();
        assert_eq!(read, sent.acked_ids);
        sent
    });
    assert_eq!(server.stop(), Some(0), "SIGTERM after a recovered ENOSPC");

    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let read: Vec<u64> = read_all(&mut client, namespace)
            .await
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        assert_eq!(
            read, sent.acked_ids,
            "every acknowledged message survives the restart"
        );
        assert_eq!(read.len() as u64, sent.next_id);
    });
    assert_eq!(server.stop(), Some(0));
    drop(mount);
}

#[test]
fn issue7_1_journal_full_then_space_recovers() {
    let Some(mount) = mount_or_skip("issue7_1_journal_full_then_space_recovers") else {
        return;
    };
    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    let created = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.register().await.unwrap();
        let filler = fill(&mount.dir);
        // The journal's last page has some room left: creates succeed until a record needs a
        // new page.
        // Long names (unique, as stream names must be) fill the page in fewer records.
        let long_name = |stream_id: u32| format!("{stream_id:s>255}");
        assert_eq!(long_name(1).len(), bus::limits::NAME_LEN_MAX);
        let mut created = Vec::new();
        let mut refused_stream = None;
        for stream_id in 1..=ATTEMPT_COUNT_MAX as u32 {
            match client.create_stream(stream_id, &long_name(stream_id)).await {
                Ok(()) => created.push(stream_id),
                Err(error) => {
                    assert_storage_full(&error, "metadata journal full");
                    assert_storage_full(&error, "journal/");
                    refused_stream = Some(stream_id);
                    break;
                }
            }
        }
        let refused_stream = refused_stream.expect("the filled filesystem refused a create");
        let metadata = client.get_metadata().await.unwrap();
        let stream_ids: Vec<u32> = metadata
            .streams
            .iter()
            .map(|stream| stream.stream_id)
            .collect();
        assert_eq!(stream_ids, created, "the refused create is not applied");

        std::fs::remove_file(&filler).unwrap();
        client
            .create_stream(refused_stream, &long_name(refused_stream))
            .await
            .unwrap();
        created.push(refused_stream);
        let mut other = bus::Client::connect(addr).await.unwrap();
        other.register().await.unwrap();
        other
            .create_stream(refused_stream + 1, "after")
            .await
            .unwrap();
        created.push(refused_stream + 1);
        created
    });
    assert_eq!(server.stop(), Some(0), "SIGTERM after a recovered ENOSPC");

    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let metadata = client.get_metadata().await.unwrap();
        let stream_ids: Vec<u32> = metadata
            .streams
            .iter()
            .map(|stream| stream.stream_id)
            .collect();
        assert_eq!(stream_ids, created);
    });
    assert_eq!(server.stop(), Some(0));
    drop(mount);
}

/// A file-size limit (`RLIMIT_FSIZE`, `ulimit -f`) below the largest file shardline writes
/// refuses at startup, naming the limit, what is needed, `ulimit -f` and `LimitFSIZE=` (freeing
/// disk space would never cure the EFBIG it causes). Needs no mount.
#[test]
fn issue7_1_file_size_limit_below_the_segment_size_refuses_at_startup() {
    const FILE_SIZE_LIMIT_BYTES: u64 = 48 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let output = with_rlimit(
        Command::new(env!("CARGO_BIN_EXE_shardline")),
        libc::RLIMIT_FSIZE,
        FILE_SIZE_LIMIT_BYTES,
    )
    .args([
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--shards",
        "1",
        "--no-pin",
    ])
    .args(["--segment-size", "1048576", "--data-dir"])
    .arg(&data_dir)
    .output()
    .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(
            format!(
                "error: startup failed: the file-size limit (RLIMIT_FSIZE) is 49152 bytes but \
                 shardline writes files of up to 67108864 bytes (the larger of a 67108864-byte \
                 metadata journal segment, --segment-size 1048576 and --max-message-size {}); a \
                 write past the limit fails with EFBIG, which freeing disk space does not cure: \
                 raise it (`ulimit -f unlimited`, or at least `ulimit -f 65536` in 1024-byte \
                 blocks, in the shell that starts shardline, or `LimitFSIZE=infinity` in its \
                 systemd unit)",
                bus::limits::MESSAGE_SIZE_MAX_DEFAULT
            )
            .as_str()
        ),
        "{stderr}"
    );
    assert!(!data_dir.exists(), "a refused start writes nothing");
}

/// The file-size limit lowered under a running server (prlimit, as an operator could): the
/// write past it fails with EFBIG instead of SIGXFSZ killing the server (its default action,
/// which a write from a thread of the process raises: `--io-driver poll`), the refusal is a
/// `StorageFull` whose message names the file-size limit (not free space), nothing acknowledged
/// is lost, and SIGTERM exits 0.
#[test]
fn issue7_1_file_size_limit_lowered_at_runtime_is_named_not_a_kill() {
    const FILE_SIZE_LIMIT_BYTES: u64 = 48 * 1024;
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        dir.path(),
        // The poll driver writes from a thread of the process, where SIGXFSZ's default action
        // would kill it (io_uring's kernel workers get no such signal).
        &[
            "--shards",
            "1",
            "--no-pin",
            "--segment-size",
            "1048576",
            "--io-driver",
            "poll",
        ],
    );
    let namespace = Namespace::new(1, 1, 0);
    let addr = server.addr;
    let pid = server.pid();
    let sent = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "capped").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        set_process_rlimit(pid, libc::RLIMIT_FSIZE, FILE_SIZE_LIMIT_BYTES);
        let mut sent = Sent {
            acked_ids: Vec::new(),
            next_id: 0,
        };
        let mut refusal = None;
        for _ in 0..ATTEMPT_COUNT_MAX {
            if let Err(error) = sent.send(&mut client, namespace).await {
                refusal = Some(error);
                break;
            }
        }
        let refusal = refusal.expect("the file-size limit refused a send");
        let ClientError::Server { code, message } = &refusal else {
            panic!("expected StorageFull, got {refusal}");
        };
        assert_eq!(*code, ErrorCode::StorageFull, "{message}");
        assert!(
            message.starts_with(
                "partition 1/1/0 (stream 1, topic 1, partition 0) cannot grow, nothing was \
                 appended: "
            ),
            "{message}"
        );
        assert!(
            message.ends_with(
                "failed: File too large (os error 27): the file would pass the process's \
                 file-size limit (RLIMIT_FSIZE, 49152 bytes); freeing disk space does not help: \
                 raise it (`ulimit -f unlimited`, or `LimitFSIZE=infinity` in the systemd unit) \
                 and restart the server"
            ),
            "{message}"
        );
        assert!(!message.contains("bytes free"), "{message}");
        // 7 batches of 6,160 bytes (entry header, 4 messages of 32 + 1500) fit under 48 KiB;
        // the eighth would cross it.
        assert_eq!(sent.acked_ids.len(), 28);
        let read: Vec<u64> = read_all(&mut client, namespace)
            .await
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        assert_eq!(read, sent.acked_ids);
        client.ping().await.unwrap();
        sent
    });
    assert_eq!(server.stop(), Some(0), "SIGTERM after EFBIG exits 0");
    assert_eq!(sent.acked_ids.len(), 28);
}

/// SIGTERM while the filesystem is still full: the final checkpoint's snapshot write is refused
/// (ENOSPC), which loses nothing (the previous checkpoint stays valid, the journal keeps every
/// op), so the server warns naming the file and exits 0; the next boot replays the journal.
#[test]
fn issue7_1_sigterm_with_the_disk_still_full_exits_0() {
    let Some(mount) = mount_or_skip("issue7_1_sigterm_with_the_disk_still_full_exits_0") else {
        return;
    };
    let namespace = Namespace::new(1, 1, 0);
    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    let (sent, filler) = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "full").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        let mut sent = Sent {
            acked_ids: Vec::new(),
            next_id: 0,
        };
        for _ in 0..3 {
            sent.send(&mut client, namespace).await.unwrap();
        }
        (sent, fill(&mount.dir))
    });
    let stderr_log = server.stderr_log.clone();
    assert_eq!(server.stop(), Some(0), "SIGTERM with the disk full");
    let stderr = std::fs::read_to_string(&stderr_log).unwrap();
    let warning = stderr
        .lines()
        .find(|line| line.contains("checkpoint refused for lack of space"))
        .unwrap_or_else(|| panic!("no checkpoint warning in:\n{stderr}"));
    assert!(warning.contains("WARN"), "{warning}");
    assert!(warning.contains("snapshot.tmp"), "{warning}");
    assert!(warning.contains("No space left on device"), "{warning}");
    assert!(
        warning.contains("the journal keeps every op above it"),
        "{warning}"
    );
    assert!(!stderr.contains("final checkpoint failed"), "{stderr}");

    std::fs::remove_file(&filler).unwrap();
    let server = Server::start(&mount.dir, &SERVE_ARGS);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let metadata = client.get_metadata().await.unwrap();
        assert_eq!(metadata.streams[0].topics[0].name, "t");
        let read: Vec<u64> = read_all(&mut client, namespace)
            .await
            .into_iter()
            .map(|(_, id, _)| id)
            .collect();
        assert_eq!(read, sent.acked_ids);
    });
    assert_eq!(server.stop(), Some(0));
    drop(mount);
}

/// The partitions a `StorageFull` create reply names as not opened (`partition 1/2/4: `).
fn unopened_partitions(message: &str, topic: &str) -> Vec<u16> {
    let mut partitions: Vec<u16> = message
        .split("partition ")
        .skip(1)
        .filter_map(|rest| rest.strip_prefix(topic))
        .filter_map(|rest| rest.split(':').next()?.parse().ok())
        .collect();
    partitions.sort_unstable();
    partitions.dedup();
    partitions
}

/// Inodes run out while a topic's partitions are opened (after the change is committed): the
/// create is answered `StorageFull` naming each partition not opened; a send to one of them is
/// answered `StorageFull` while the filesystem is still full, and succeeds at offset 0 once
/// inodes are added, without a restart.
#[test]
fn issue7_review_2_a_partition_not_opened_for_lack_of_inodes_opens_once_space_returns() {
    let Some(mount) = mount_with_or_skip(
        "issue7_review_2_a_partition_not_opened_for_lack_of_inodes_opens_once_space_returns",
        "size=4m,nr_inodes=40",
    ) else {
        return;
    };
    let data_dir = mount.dir.join("d");
    let serve_args = ["--shards", "2", "--no-pin", "--fsync=always"];
    let server = Server::start(&data_dir, &serve_args);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 8).await.unwrap();
        let error = client.create_topic(1, 2, "u", 8).await.unwrap_err();
        let ClientError::Server { code, message } = &error else {
            panic!("expected StorageFull, got {error}");
        };
        assert_eq!(*code, ErrorCode::StorageFull, "{message}");
        assert!(
            message.starts_with("the change is committed, but "),
            "{message}"
        );
        assert!(
            message.ends_with(
                "each is opened again on its next send or poll, which answers StorageFull until \
                 the cause is fixed (free space for StorageFull, file descriptors for \
                 ResourceExhausted), then succeeds"
            ),
            "{message}"
        );
        let unopened = unopened_partitions(message, "1/2/");
        assert!(!unopened.is_empty(), "{message}");
        assert!(
            message.contains(&format!("but {} of its partitions", unopened.len())),
            "{message}"
        );
        let metadata = client.get_metadata().await.unwrap();
        assert_eq!(metadata.streams[0].topics[1].partitions.len(), 8);

        // Still full: each unopened partition answers StorageFull naming why.
        for &partition in &unopened {
            let namespace = Namespace::new(1, 2, partition);
            let error = client
                .send_messages(namespace, batch(0, 1, 10))
                .await
                .unwrap_err();
            let ClientError::Server { code, message } = &error else {
                panic!("expected StorageFull, got {error}");
            };
            assert_eq!(*code, ErrorCode::StorageFull, "{message}");
            assert!(
                message
                    .starts_with("the partition is committed but its log cannot be opened: shard ")
                    && message.contains(&format!("partition {namespace}: "))
                    && message.contains("No space left on device")
                    && message.ends_with(", here once space is freed)"),
                "{message}"
            );
            let error = client.poll_messages(namespace, 0, 10).await.unwrap_err();
            assert!(
                matches!(
                    error,
                    ClientError::Server {
                        code: ErrorCode::StorageFull,
                        ..
                    }
                ),
                "{error}"
            );
        }

        mount.remount("nr_inodes=400");
        for partition in 0..8u16 {
            let namespace = Namespace::new(1, 2, partition);
            let ack = client
                .send_messages(namespace, batch(100 + u64::from(partition), 1, 10))
                .await
                .unwrap();
            assert_eq!(ack.base_offset, 0, "partition {partition}");
            let read = read_all(&mut client, namespace).await;
            assert_eq!(
                read,
                vec![(
                    0,
                    100 + u64::from(partition),
                    payload(100 + u64::from(partition), 10)
                )]
            );
        }
    });
    assert_eq!(server.stop(), Some(0));

    let server = Server::start(&data_dir, &serve_args);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        for partition in 0..8u16 {
            let namespace = Namespace::new(1, 2, partition);
            let ids: Vec<u64> = read_all(&mut client, namespace)
                .await
                .into_iter()
                .map(|(_, id, _)| id)
                .collect();
            assert_eq!(ids, vec![100 + u64::from(partition)]);
        }
    });
    assert_eq!(server.stop(), Some(0));
    drop(mount);
}

/// A restart while partitions are still unopened for lack of inodes (the filesystem still full):
/// boot leaves them unopened with a warning naming each and "0 inodes free", serves the other
/// partitions, answers `StorageFull` for the unopened ones, and opens them once inodes are added,
/// without another restart. (Boot used to fail "create segment failed: No space left on device",
/// taking every partition down.)
#[test]
fn issue7_1_restart_with_partitions_still_unopened_for_lack_of_inodes_boots() {
    let Some(mount) = mount_with_or_skip(
        "issue7_1_restart_with_partitions_still_unopened_for_lack_of_inodes_boots",
        "size=4m,nr_inodes=40",
    ) else {
        return;
    };
    let data_dir = mount.dir.join("d");
    let serve_args = ["--shards", "2", "--no-pin", "--fsync=always"];
    let kept = Namespace::new(1, 1, 0);
    let server = Server::start(&data_dir, &serve_args);
    let unopened = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 8).await.unwrap();
        assert_eq!(
            client
                .send_messages(kept, batch(7, 1, 10))
                .await
                .unwrap()
                .base_offset,
            0
        );
        let error = client.create_topic(1, 2, "u", 8).await.unwrap_err();
        let ClientError::Server { code, message } = &error else {
            panic!("expected StorageFull, got {error}");
        };
        assert_eq!(*code, ErrorCode::StorageFull, "{message}");
        unopened_partitions(message, "1/2/")
    });
    assert!(!unopened.is_empty());
    assert_eq!(server.stop(), Some(0));

    let server = Server::try_start_on(
        Command::new(common::BIN),
        &data_dir,
        "127.0.0.1:0",
        &serve_args,
    )
    .unwrap_or_else(|stderr| panic!("restart refused while partitions are unopened:\n{stderr}"));
    let stderr = server.stderr();
    let warned: Vec<u16> = (0..8u16)
        .filter(|&partition| {
            stderr.lines().any(|line| {
                line.contains("WARN")
                    && line.contains("partition log cannot be opened at boot: no space (")
                    && line.contains(
                        ", 0 inodes free); the partition stays unopened, its sends \
                                      and polls answer StorageFull and retry the open until it \
                                      succeeds",
                    )
                    && line.contains(&format!("namespace=1/2/{partition} "))
            })
        })
        .collect();
    assert_eq!(warned, unopened, "{stderr}");
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let read = read_all(&mut client, kept).await;
        assert_eq!(read, vec![(0, 7, payload(7, 10))]);
        let namespace = Namespace::new(1, 2, unopened[0]);
        let error = client
            .send_messages(namespace, batch(0, 1, 10))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, ClientError::Server { code: ErrorCode::StorageFull, message }
                if message.contains("No space left on device")),
            "{error}"
        );
        mount.remount("nr_inodes=400");
        for partition in 0..8u16 {
            let namespace = Namespace::new(1, 2, partition);
            let ack = client
                .send_messages(namespace, batch(100, 1, 10))
                .await
                .unwrap();
            assert_eq!(ack.base_offset, 0, "partition {partition}");
        }
    });
    assert_eq!(server.stop(), Some(0));
    drop(mount);
}

/// Interior damage in the active segment found by open while the filesystem is full: the
/// quarantine copy is refused, the error names the segment, the byte, the bytes needed and the
/// free space, and no partial quarantine file stays behind, however many times open is retried
/// (more than there are `.N` names). Once space is freed the next open quarantines the tail
/// into the plain `damaged-at-P` name and truncates.
#[test]
fn issue7_2_quarantine_on_a_full_disk_leaves_no_file_and_succeeds_once_space_is_freed() {
    let Some(mount) = mount_with_or_skip(
        "issue7_2_quarantine_on_a_full_disk_leaves_no_file_and_succeeds_once_space_is_freed",
        "size=1m",
    ) else {
        return;
    };
    let dir = mount.dir.join("log");
    let config = || storage::LogConfig {
        fsync: storage::FsyncPolicy::Always,
        segment_size_max: 1 << 20,
        write_mode: storage::WriteMode::Buffered,
    };
    // Ten 1-message entries of 20 000 bytes: 20 064 bytes each.
    block_on(async {
        let (log, _) = storage::PartitionLog::open(&dir, config()).await.unwrap();
        for seed in 0..10u8 {
            let entry = storage::build_entry(0, 1, &vec![seed; 20_000]);
            log.append(entry).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let segment = dir.join("00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    assert_eq!(bytes.len(), 10 * 20_064);
    let position = 3 * 20_064;
    bytes[position + 40] ^= 0x01; // payload of entry 3
    std::fs::write(&segment, &bytes).unwrap();
    let quarantine_path = dir.join(format!("00000000000000000000.log.damaged-at-{position}"));
    let quarantine_files = || -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|entry| entry.unwrap().file_name().into_string().unwrap())
            .filter(|name| name.contains(".damaged-at-"))
            .collect();
        names.sort();
        names
    };

    let filler = fill(&mount.dir);
    let attempts = storage::limits::QUARANTINE_FILE_NAME_ATTEMPT_COUNT_MAX + 2;
    for attempt in 0..attempts {
        let error = block_on(storage::PartitionLog::open(&dir, config())).unwrap_err();
        let message = error.to_string();
        match &error {
            storage::LogError::QuarantineFailed {
                segment: named,
                position: at,
                size_bytes,
                path,
                op,
                free_bytes,
                source,
            } => {
                assert_eq!(named, &segment, "attempt {attempt}");
                assert_eq!(*at, position as u64);
                assert_eq!(*size_bytes, 7 * 20_064);
                assert_eq!(path, &quarantine_path);
                assert_eq!(*op, "write");
                assert_eq!(source.raw_os_error(), Some(libc::ENOSPC), "{message}");
                let free = free_bytes.0.expect("statvfs works on tmpfs").bytes;
                assert!(free < 7 * 20_064, "{message}");
                assert_eq!(
                    message,
                    format!(
                        "{}: damaged entry at byte {position} may have been acknowledged; the \
                         140448 bytes from there must be copied to a quarantine file before the \
                         segment is truncated, but write of {} failed: {source} ({} bytes free). \
                         Nothing was truncated and the partial copy was removed: free at least \
                         140448 bytes and restart",
                        segment.display(),
                        quarantine_path.display(),
                        free
                    )
                );
            }
            other => panic!("attempt {attempt}: expected QuarantineFailed, got {other}"),
        }
        assert_eq!(
            quarantine_files(),
            Vec::<String>::new(),
            "attempt {attempt}"
        );
        assert_eq!(std::fs::read(&segment).unwrap(), bytes, "nothing truncated");
    }

    std::fs::remove_file(&filler).unwrap();
    block_on(async {
        let (log, report) = storage::PartitionLog::open(&dir, config()).await.unwrap();
        assert_eq!(
            report.quarantined,
            Some(storage::Quarantine {
                segment: segment.clone(),
                position: position as u64,
                path: quarantine_path.clone(),
                size_bytes: 7 * 20_064,
                first_offset: 3,
                last_offset: 9,
                // Entries 4..=9's payloads, nothing else.
                resync_charged_bytes: 120_192,
            })
        );
        assert_eq!((report.entry_count, report.next_offset), (3, 3));
        assert_eq!(log.next_offset(), 3);
    });
    assert_eq!(
        quarantine_files(),
        vec![format!("00000000000000000000.log.damaged-at-{position}")]
    );
    assert_eq!(std::fs::read(&quarantine_path).unwrap(), bytes[position..]);
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), position as u64);
}
