//! Issue 7 section 2: resource limits are named before they bite. A locked-memory limit too low
//! for the io_uring rings refuses at startup with the limit, the need and the fixes (never a
//! panic, never a bare ENOMEM); a data directory with more partitions than the open-file budget
//! refuses at boot before opening any; clients refused at the connection budget or at the real
//! open-file limit read a `ResourceExhausted` frame that names the limit before the close.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use bus::{ErrorCode, Header, Operation};
use common::{BIN, Server, block_on, set_process_rlimit, with_rlimit};

/// How long a read may wait for an answer before the test gives up (not a timed assertion).
const WAIT_MAX: Duration = Duration::from_mins(1);

/// The tests of this file run one at a time: `RLIMIT_MEMLOCK` counts the locked memory of every
/// process of a user, so another test's server, run by the same (non-root) user, would change
/// what the memlock test's servers can lock.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// The server binary as a user that the locked-memory limit binds: root (`CAP_IPC_LOCK`) ignores
/// it, so a root test runs the server as `nobody` through `setpriv`; any other user runs it as
/// itself.
fn unprivileged_server() -> Command {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Command::new(BIN);
    }
    let mut command = Command::new("setpriv");
    command.args(["--reuid=65534", "--regid=65534", "--clear-groups", BIN]);
    command
}

fn page_size() -> u64 {
    // SAFETY: sysconf has no preconditions.
    u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap()
}

/// Runs `serve` with RLIMIT_MEMLOCK at `limit_bytes`; stops it if it starts. Returns whether it
/// started, its exit code and its stderr.
fn serve_under_memlock(root: &std::path::Path, shards: u16, limit_bytes: u64) -> (bool, String) {
    let data_dir = root.join(format!("data-{shards}-{limit_bytes}"));
    let mut child = with_rlimit(unprivileged_server(), libc::RLIMIT_MEMLOCK, limit_bytes)
        .args(["serve", "--listen", "127.0.0.1:0", "--no-pin", "--shards"])
        .arg(shards.to_string())
        .arg("--data-dir")
        .arg(&data_dir)
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut first_line = String::new();
    let mut stdout = child.stdout.take().unwrap();
    let mut byte = [0u8; 1];
    while stdout.read(&mut byte).unwrap_or(0) == 1 && byte[0] != b'\n' {
        first_line.push(byte[0] as char);
    }
    let started = first_line.starts_with("listening on ");
    if started {
        // SAFETY: kill(2) on our own child.
        assert_eq!(unsafe { libc::kill(child.id() as i32, libc::SIGTERM) }, 0);
    }
    let output = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !stderr.contains("panicked"),
        "limit {limit_bytes}: {stderr}"
    );
    let expected_code = i32::from(!started);
    assert_eq!(
        output.status.code(),
        Some(expected_code),
        "limit {limit_bytes}: {stderr}"
    );
    (started, stderr)
}

#[test]
fn issue7_2_memlock_too_low_is_named_at_every_value() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // `nobody` creates the data directories.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let page = page_size();
    // Whether this kernel charges rings to the limit at all: if a zero limit starts, every
    // value must start (kernels that account ring memory to the memory cgroup only).
    let (started_at_zero, _) = serve_under_memlock(dir.path(), 1, 0);
    for shards in [1_u16, 2] {
        let needed = runtime::probe::memlock_needed_bytes(shards, page);
        // Every page-sized value below the need refuses, naming limit, need and the fixes. These
        // runs create no ring (the check comes first), so they leave nothing charged to the user
        // for the run that follows.
        for limit in (0..needed).step_by(page as usize) {
            let (started, stderr) = serve_under_memlock(dir.path(), shards, limit);
            if started_at_zero {
                assert!(started, "limit {limit}: {stderr}");
                continue;
            }
            assert!(!started, "limit {limit} started");
            let expected = runtime::probe::memlock_unavailable(limit, needed, shards).to_string();
            assert!(
                stderr.contains(&expected),
                "limit {limit}, shards {shards}: expected {expected:?} in {stderr}"
            );
            assert!(!stderr.contains("Cannot allocate memory"), "{stderr}");
        }
    }
    eprintln!("rings charged to RLIMIT_MEMLOCK here: {}", !started_at_zero);
    // Exactly the need starts, with two shards (the most rings).
    let needed = runtime::probe::memlock_needed_bytes(2, page);
    let (started, stderr) = serve_under_memlock(dir.path(), 2, needed);
    assert!(started, "limit {needed}: {stderr}");
}

/// A data directory holding one topic of `partition_count` partitions.
fn data_dir_with_partitions(root: &std::path::Path, partition_count: u32) -> std::path::PathBuf {
    let data_dir = root.join("data");
    let server = Server::start(&data_dir, &["--shards", "2", "--no-pin"]);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client
            .create_topic(1, 1, "t", partition_count)
            .await
            .unwrap();
    });
    assert_eq!(server.stop(), Some(0));
    data_dir
}

#[test]
fn issue7_2_boot_refuses_partitions_beyond_the_open_file_budget() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = data_dir_with_partitions(dir.path(), 100);
    // 600 descriptors: 344 after the reserve, half for partitions at three each: 57 < 100.
    let output = with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, 600)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "2",
            "--no-pin",
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    let refusal = shards::resources::ResourceBudget::from_open_file_limit(600, 2)
        .partitions_refusal(100)
        .unwrap();
    let expected = format!(
        "shard 0: cannot open the partitions of {}: {refusal}",
        data_dir.display()
    );
    assert!(
        stderr.contains(&expected),
        "expected {expected:?} in {stderr}"
    );
    assert!(refusal.contains("ulimit -n 856"), "{refusal}");
    assert!(!stderr.contains("Too many open files"), "{stderr}");
    // At the named limit it boots and serves every partition.
    let server = Server::start_with(
        with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, 856),
        &data_dir,
        &["--shards", "2", "--no-pin"],
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let metadata = client.get_metadata().await.unwrap();
        assert_eq!(metadata.streams[0].topics[0].partitions.len(), 100);
    });
    assert_eq!(server.stop(), Some(0));
}

/// What one new client gets: `Ok(())` when its Ping is answered (admitted), or the refusal frame.
fn ping_or_refusal(addr: SocketAddr) -> (TcpStream, Result<(), (Header, String)>) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
    let mut header = Header::new(bus::Command::Request, Operation::Ping);
    header.request = 7;
    stream
        .write_all(&bus::encode_frame(&mut header, &[]))
        .unwrap();
    let mut head = [0u8; bus::HEADER_SIZE];
    stream.read_exact(&mut head).unwrap();
    let reply: Header = bytemuck::pod_read_unaligned(&head);
    assert!(reply.valid_checksum());
    let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
    stream.read_exact(&mut body).unwrap();
    if reply.error_code == 0 {
        assert_eq!(reply.request, 7);
        return (stream, Ok(()));
    }
    // The refusal is followed by the close.
    let mut rest = [0u8; 1];
    assert_eq!(stream.read(&mut rest).unwrap_or(0), 0);
    (
        stream,
        Err((reply, String::from_utf8_lossy(&body).into_owned())),
    )
}

/// `ulimit -n 40` once gave a budget floor of 16 partitions and 16 connections that the process
/// could not open (accepts failed with EMFILE after about 8 clients). The budget has no floor
/// now: a limit that leaves nothing after the reserve refuses at startup, naming what is needed,
/// before anything is written. (The EMFILE answer at accept stays for descriptors that run out
/// outside the budget; no test can make the server's own descriptors run out on purpose.)
#[test]
fn issue7_review_6_an_open_file_limit_too_small_to_serve_refuses_at_startup() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let output = with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, 40)
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--shards",
            "1",
            "--no-pin",
        ])
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_eq!(
        stderr.lines().last(),
        Some(
            "error: startup failed: the open-file limit (RLIMIT_NOFILE) is 40 but the server \
             reserves 256 descriptors for itself (listeners, io_uring rings, journal, logs) and \
             needs at least 262 in all to hold one partition and one client connection on each \
             of its 1 shards; raise it (`ulimit -n 262` or more in the shell that starts \
             shardline, or `LimitNOFILE=262` in its systemd unit)"
        ),
        "{stderr}"
    );
    assert!(!data_dir.exists(), "a refused start writes nothing");
}

/// Descriptors running out outside the budget (here: the limit lowered under the running server
/// with prlimit, to a few above what it holds): a client is not left in the listen backlog; the
/// spare descriptor lets the shard accept it, answer `ResourceExhausted` naming the limit, and
/// close; once descriptors are free again, clients are served. (Without the spare descriptor the
/// client would sit in the backlog: the read timeout in `ping_or_refusal` fails the test then.)
#[test]
fn issue7_2_clients_refused_at_the_open_file_limit_read_why() {
    const SPARE_FD_COUNT: u64 = 3;
    const CLIENT_COUNT_MAX: usize = 32;
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start_with(
        with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, 600),
        &dir.path().join("data"),
        &["--shards", "1"],
    );
    let open_fd_count = std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
        .unwrap()
        .count() as u64;
    set_process_rlimit(
        server.pid(),
        libc::RLIMIT_NOFILE,
        open_fd_count + SPARE_FD_COUNT,
    );
    let mut admitted = Vec::new();
    let mut refusal = None;
    for _ in 0..CLIENT_COUNT_MAX {
        match ping_or_refusal(server.addr) {
            (stream, Ok(())) => admitted.push(stream),
            (_, Err(refused)) => {
                refusal = Some(refused);
                break;
            }
        }
    }
    let (header, body) = refusal.expect("a client was refused at the descriptor limit");
    assert_eq!(header.error_code, ErrorCode::ResourceExhausted as u32);
    assert_eq!(
        body,
        "the server is out of file descriptors (open-file limit 600); retry later, or raise the \
         open-file limit (ulimit -n / LimitNOFILE=)"
    );
    // One more than the spares at most: a descriptor the server held when they were counted (a
    // startup file) may be closed by the time the clients come.
    assert!(
        admitted.len() as u64 <= SPARE_FD_COUNT + 1,
        "{} clients admitted with {SPARE_FD_COUNT} spare descriptors",
        admitted.len()
    );
    // Refused again while full; served once a connection closes.
    assert!(ping_or_refusal(server.addr).1.is_err());
    admitted.clear();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (_stream, answer) = ping_or_refusal(server.addr);
    assert_eq!(answer, Ok(()));
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue7_2_clients_refused_by_the_connection_budget_read_why() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    // 600 descriptors: 172 connections on the one shard, far below the descriptor limit.
    let server = Server::start_with(
        with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, 600),
        &dir.path().join("data"),
        &["--shards", "1"],
    );
    let mut admitted = Vec::new();
    for _ in 0..172 {
        let (stream, answer) = ping_or_refusal(server.addr);
        assert_eq!(answer, Ok(()));
        admitted.push(stream);
    }
    let (header, body) = ping_or_refusal(server.addr).1.unwrap_err();
    assert_eq!(header.error_code, ErrorCode::ResourceExhausted as u32);
    assert_eq!(
        body,
        "shard 0 is at its limit of 172 client connections (its share of the open-file limit \
         600); retry later, close idle connections, or raise the open-file limit (ulimit -n / \
         LimitNOFILE=)"
    );
    assert_eq!(server.stop(), Some(0));
}

/// A payload of 3,000 bytes that differs per message id.
fn segment_filling_payload(id: u64) -> Vec<u8> {
    (0..3_000u64).map(|index| (id * 7 + index) as u8).collect()
}

/// Sends messages `ids` one batch each (one 3,000-byte message: one entry per 4 KiB segment).
async fn send_one_per_segment(
    client: &mut bus::Client,
    namespace: bus::Namespace,
    ids: std::ops::Range<u64>,
) {
    for id in ids {
        let mut batch = bus::BatchBuilder::default();
        batch.push(id, 1_000 + id, &segment_filling_payload(id));
        let ack = client
            .send_messages(namespace, batch.finish())
            .await
            .unwrap_or_else(|error| panic!("send of message {id}: {error}"));
        assert_eq!(ack.base_offset, id);
    }
}

/// Polls one message at each of `offsets` and checks its id and payload.
async fn poll_each(client: &mut bus::Client, namespace: bus::Namespace, offsets: &[u64]) {
    for &offset in offsets {
        let body = client.poll_messages(namespace, offset, 1).await.unwrap();
        let messages = bus::client::messages_from(&body, offset).unwrap();
        assert_eq!(messages.len(), 1, "poll at {offset}");
        assert_eq!(messages[0].id, offset);
        assert_eq!(messages[0].payload, segment_filling_payload(offset));
    }
}

/// The issue's case: `ulimit -n 300`, 4 KiB segments, one partition, keep sending. Every closed
/// segment used to keep its descriptor, so after about 285 segments a roll failed with `Too many
/// open files` (and so did a reboot). 400 segments now send, poll from old segments, stop with
/// status 0 and boot again at the same limit.
#[test]
fn issue7_2_many_segments_under_a_low_open_file_limit_keep_serving() {
    const OPEN_FILE_LIMIT: u64 = 300;
    const MESSAGE_COUNT: u64 = 400;
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let namespace = bus::Namespace::new(1, 1, 0);
    let args = [
        "--shards",
        "1",
        "--no-pin",
        "--segment-size",
        "4096",
        "--fsync",
        "never",
    ];
    let server = Server::start_with(
        with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, OPEN_FILE_LIMIT),
        dir.path(),
        &args,
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "many").await.unwrap();
        client.create_topic(1, 1, "segments", 1).await.unwrap();
        send_one_per_segment(&mut client, namespace, 0..MESSAGE_COUNT).await;
        poll_each(&mut client, namespace, &[0, 1, 150, 298, 399]).await;
    });
    let segment_count = std::fs::read_dir(dir.path().join("partitions/1/1/0"))
        .unwrap()
        .filter(|entry| {
            entry
                .as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .ends_with(".log")
        })
        .count();
    assert_eq!(segment_count, MESSAGE_COUNT as usize);
    assert_eq!(server.stop(), Some(0), "SIGTERM exits 0");

    let server = Server::start_with(
        with_rlimit(Command::new(BIN), libc::RLIMIT_NOFILE, OPEN_FILE_LIMIT),
        dir.path(),
        &args,
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        poll_each(&mut client, namespace, &[7, 399, 0]).await;
        send_one_per_segment(&mut client, namespace, MESSAGE_COUNT..MESSAGE_COUNT + 5).await;
        poll_each(&mut client, namespace, &[MESSAGE_COUNT + 4]).await;
    });
    assert_eq!(server.stop(), Some(0));
}

/// Descriptors the process `pid` holds now.
fn fd_count(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .unwrap()
        .count() as u64
}

/// The refusal `error` must be: `ResourceExhausted`, the message starting with `prefix` and
/// naming the errno.
fn assert_refused_at_the_open_file_limit(error: &bus::ClientError, prefix: &str) {
    let bus::ClientError::Server { code, message } = error else {
        panic!("expected ResourceExhausted, got {error}");
    };
    assert_eq!(*code, ErrorCode::ResourceExhausted, "{message}");
    assert!(
        message.starts_with(prefix)
            && message.contains(
                "Too many open files (os error 24); the open-file limit is \
                                 reached, nothing was kept or read, retry once file \
                                 descriptors are freed"
            ),
        "{message}"
    );
}

/// The open-file limit lowered under the running server below what it holds (an operator's
/// prlimit, or other files of the process at the limit): a poll of a closed segment (opened on
/// demand) and a send whose segment roll must open files are answered `ResourceExhausted`,
/// nothing appended or read; once the limit is raised again the same partition serves both
/// without a restart, SIGTERM exits 0 and a restart reads every acknowledged message once. (The
/// roll's refused open used to poison the partition until restart, and SIGTERM then exited 1.)
#[test]
fn issue7_2_emfile_at_a_segment_roll_or_a_closed_segment_read_is_transient() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let namespace = bus::Namespace::new(1, 1, 0);
    let args = [
        "--shards",
        "1",
        "--no-pin",
        "--segment-size",
        "4096",
        "--fsync",
        "always",
    ];
    let server = Server::start(dir.path(), &args);
    let pid = server.pid();
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        send_one_per_segment(&mut client, namespace, 0..20).await;
        client.ping().await.unwrap();
        let limit = common::process_soft_nofile(pid);
        // 3: only the standard streams' numbers are allowed, so every descriptor the server
        // opens now fails with EMFILE, even one whose number a closed cached file just freed.
        common::set_process_soft_nofile(pid, 3);
        let polled = client.poll_messages(namespace, 0, 1).await.unwrap_err();
        assert_refused_at_the_open_file_limit(
            &polled,
            "read of 1/1/0 refused: the server is at its open-file limit, nothing was read: ",
        );
        // The connection stays open: a second poll on it is refused the same way (a reconnect
        // would be refused at accept instead, with request 0).
        let polled = client.poll_messages(namespace, 5, 1).await.unwrap_err();
        assert_refused_at_the_open_file_limit(
            &polled,
            "read of 1/1/0 refused: the server is at its open-file limit, nothing was read: ",
        );
        // The first file such a read opens is the sealed segment's index (loaded on demand since
        // issue 11 section 4), so the refusal names it.
        assert!(
            polled
                .to_string()
                .contains("00000000000000000005.index: open failed: "),
            "{polled}"
        );
        let mut batch = bus::BatchBuilder::default();
        batch.push(20, 1_020, &segment_filling_payload(20));
        let sent = client
            .send_messages(namespace, batch.finish())
            .await
            .unwrap_err();
        assert_refused_at_the_open_file_limit(
            &sent,
            "partition 1/1/0 (stream 1, topic 1, partition 0): the server is at its open-file \
             limit, nothing was appended: ",
        );
        common::set_process_soft_nofile(pid, limit);
        poll_each(&mut client, namespace, &[0, 19]).await;
        send_one_per_segment(&mut client, namespace, 20..22).await;
    });
    assert_eq!(server.stop(), Some(0));
    let server = Server::start(dir.path(), &args);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let offsets: Vec<u64> = (0..22).collect();
        poll_each(&mut client, namespace, &offsets).await;
        let body = client.poll_messages(namespace, 22, 1).await.unwrap();
        assert_eq!(bus::client::messages_from(&body, 22).unwrap().len(), 0);
    });
    assert_eq!(server.stop(), Some(0));
}

/// 48 connections poll 48 different old segments of one partition at once (the adversary's
/// case): each read of a closed segment not kept open used to open its own file, taking the
/// server from 64 to 94 descriptors. A log's closed-segment files are now bounded as a whole,
/// reads waiting for a slot, so the partition never holds more than the budget's
/// `FDS_PER_PARTITION`: idle, it holds its active segment and the segment closed last (kept for
/// reads), so the polls may add at most the budget's remaining one.
#[test]
fn issue7_adv2_concurrent_polls_of_old_segments_stay_within_the_partition_budget() {
    const READERS: u64 = 48;
    let dir = tempfile::tempdir().unwrap();
    let namespace = bus::Namespace::new(1, 1, 0);
    let args = [
        "--shards",
        "1",
        "--no-pin",
        "--fsync",
        "never",
        "--segment-size",
        "4096",
    ];
    let server = Server::start(&dir.path().join("data"), &args);
    let pid = server.pid();
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "old").await.unwrap();
        client.create_topic(1, 1, "segments", 1).await.unwrap();
        send_one_per_segment(&mut client, namespace, 0..100).await;
    });
    let connected = std::sync::Barrier::new(READERS as usize + 1);
    let barrier = std::sync::Barrier::new(READERS as usize + 1);
    let done = std::sync::atomic::AtomicBool::new(false);
    let (baseline, peak) = std::thread::scope(|scope| {
        let readers: Vec<_> = (0..READERS)
            .map(|reader| {
                let (connected, barrier) = (&connected, &barrier);
                scope.spawn(move || {
                    block_on(async move {
                        let mut client = bus::Client::connect(addr).await.unwrap();
                        client.ping().await.unwrap();
                        connected.wait();
                        barrier.wait();
                        for round in 0..30u64 {
                            let offset = (reader * 2 + round * 7) % 99;
                            poll_each(&mut client, namespace, &[offset]).await;
                        }
                    });
                })
            })
            .collect();
        // Every reader is connected (the server answered its ping) before the baseline.
        connected.wait();
        let baseline = fd_count(pid);
        barrier.wait();
        let sampler = scope.spawn(|| {
            let mut peak = 0;
            while !done.load(std::sync::atomic::Ordering::Acquire) {
                peak = peak.max(fd_count(pid));
            }
            peak
        });
        for reader in readers {
            reader.join().unwrap();
        }
        done.store(true, std::sync::atomic::Ordering::Release);
        (baseline, sampler.join().unwrap())
    });
    assert_eq!(server.stop(), Some(0));
    assert!(
        peak <= baseline + (shards::limits::FDS_PER_PARTITION - 2),
        "one partition's polls held {} descriptors beyond its idle two (budget {})",
        peak - baseline,
        shards::limits::FDS_PER_PARTITION
    );
}

/// SIGTERM while the process is at its open-file limit (lowered under it to the standard
/// streams): the final checkpoint cannot create its snapshot file (EMFILE), which changes nothing
/// durable, so it is a warning and the exit is 0; a restart replays the journal and serves every
/// message. (It used to exit 1.)
#[test]
fn issue7_3_sigterm_at_the_open_file_limit_exits_0() {
    let _serial = one_at_a_time();
    let dir = tempfile::tempdir().unwrap();
    let namespace = bus::Namespace::new(1, 1, 0);
    let args = ["--shards", "1", "--no-pin", "--fsync", "always"];
    let server = Server::start(dir.path(), &args);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        send_one_per_segment(&mut client, namespace, 0..3).await;
    });
    common::set_process_soft_nofile(server.pid(), 3);
    let stderr_log = server.stderr_log.clone();
    assert_eq!(server.stop(), Some(0));
    let stderr = std::fs::read_to_string(&stderr_log).unwrap();
    assert!(
        stderr.lines().any(|line| line.contains("WARN")
            && line.contains("checkpoint refused for lack of space or file descriptors")
            && line.contains("Too many open files")),
        "{stderr}"
    );
    let server = Server::start(dir.path(), &args);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        poll_each(&mut client, namespace, &[0, 1, 2]).await;
    });
    assert_eq!(server.stop(), Some(0));
}
