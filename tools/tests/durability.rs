//! Shard 0 durability end to end (issue 3, DESIGN sections 7-9, `storage/FORMAT.md` sections
//! 7-9): a crash at every checkpoint step, corruption of the superblock, snapshot and journal,
//! duplicate requests across restarts, client-table eviction, and the checkpoint pairing rule.
//! Every test drives the real `shardline serve` binary on its own temporary data directory and
//! talks to it with raw frames where it needs exact control of client ids and request numbers.
//!
//! It must never depend on timing: waits have generous deadlines, nothing asserts a duration.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use bus::{ErrorCode, Header, Namespace, Operation};
use common::{BIN, Server, block_on};

/// Two shards without pinning: CI has two cores.
const SHARDS: [&str; 3] = ["--shards", "2", "--no-pin"];

/// How long any wait (a reply, a process exit) may take before the test gives up.
const WAIT_MAX: Duration = Duration::from_mins(1);

use shards::store::failpoint::FAILPOINTS;

// ------------------------------------------------------------------------------------------------
// Raw client: exact client id and request numbers.

/// One answer frame (Reply or Eviction).
#[derive(Debug)]
struct Answer {
    header: Header,
    body: Vec<u8>,
}

impl Answer {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Asserts a successful Reply to `request`.
    fn assert_ok(&self, request: u64, what: &str) {
        assert_eq!(
            (self.header.command, self.header.error_code),
            (bus::Command::Reply as u8, 0),
            "{what}: expected success, got {self:?} ({})",
            self.text()
        );
        assert_eq!(
            self.header.request, request,
            "{what}: reply to another request"
        );
    }

    /// Asserts a Reply carrying `code`.
    fn assert_error(&self, code: ErrorCode, what: &str) {
        assert_eq!(
            (self.header.command, self.header.error_code),
            (bus::Command::Reply as u8, code as u32),
            "{what}: expected {code:?}, got {self:?} ({})",
            self.text()
        );
    }

    /// Asserts an Eviction frame (command 3, `SessionEvicted`) whose body says why.
    fn assert_evicted(&self, what: &str) {
        assert_eq!(
            (self.header.command, self.header.error_code),
            (
                bus::Command::Eviction as u8,
                ErrorCode::SessionEvicted as u32
            ),
            "{what}: expected an Eviction, got {self:?} ({})",
            self.text()
        );
        let text = self.text();
        assert!(
            text.contains("no session") && text.contains("--clients-table-max"),
            "{what}: eviction body does not name the reason: {text:?}"
        );
    }
}

/// A blocking TCP connection that sends requests with a fixed client id and the request
/// numbers the test chooses.
struct RawClient {
    stream: TcpStream,
    client: u128,
}

impl RawClient {
    fn connect(addr: SocketAddr, client: u128) -> RawClient {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
        stream.set_nodelay(true).unwrap();
        RawClient { stream, client }
    }

    /// Sends one request and reads its answer; an I/O error means the connection failed.
    fn send(
        &mut self,
        operation: Operation,
        request: u64,
        namespace: Namespace,
        body: &[u8],
    ) -> std::io::Result<Answer> {
        let mut header = Header::new(bus::Command::Request, operation);
        header.client = self.client;
        header.request = request;
        header.namespace = namespace.0;
        let bytes = bus::encode_frame(&mut header, body);
        self.stream.write_all(&bytes)?;
        let mut head = [0u8; bus::HEADER_SIZE];
        self.stream.read_exact(&mut head)?;
        let reply: Header = bytemuck::pod_read_unaligned(&head);
        assert!(reply.valid_checksum(), "answer header checksum");
        let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
        self.stream.read_exact(&mut body)?;
        assert!(reply.valid_checksum_body(&body), "answer body checksum");
        assert_eq!(reply.client, self.client, "answer for another client");
        assert_eq!(
            reply.operation, operation as u8,
            "answer for another operation"
        );
        Ok(Answer {
            header: reply,
            body,
        })
    }

    /// Registers (request 0) and returns the session number.
    fn register(&mut self) -> u64 {
        let answer = self
            .send(Operation::Register, 0, Namespace(0), &[])
            .unwrap();
        answer.assert_ok(0, "register");
        answer.header.offset
    }

    /// CreateStream `stream_id` named `s{stream_id}` as request `request`.
    fn create_stream(&mut self, request: u64, stream_id: u32) -> std::io::Result<Answer> {
        self.send(
            Operation::CreateStream,
            request,
            Namespace::new(stream_id, 0, 0),
            format!("s{stream_id}").as_bytes(),
        )
    }

    /// As `create_stream`, panicking if the connection fails.
    fn create(&mut self, request: u64, stream_id: u32) -> Answer {
        self.create_stream(request, stream_id)
            .unwrap_or_else(|e| panic!("create stream {stream_id} request {request}: {e}"))
    }
}

// ------------------------------------------------------------------------------------------------
// Server and file helpers.

/// The server's streams as (id, name), in the order the server lists them.
fn streams(addr: SocketAddr) -> Vec<(u32, String)> {
    block_on(async move {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let metadata = client.get_metadata().await.unwrap();
        metadata
            .streams
            .into_iter()
            .map(|stream| (stream.stream_id, stream.name))
            .collect()
    })
}

/// `(i, "s{i}")` for each id.
fn named(ids: impl IntoIterator<Item = u32>) -> Vec<(u32, String)> {
    ids.into_iter().map(|i| (i, format!("s{i}"))).collect()
}

/// Asserts the server lists exactly the streams `ids` (each once, named `s{i}`).
fn assert_streams(addr: SocketAddr, ids: impl IntoIterator<Item = u32>, what: &str) {
    let mut found = streams(addr);
    found.sort();
    let mut expected = named(ids);
    expected.sort();
    assert_eq!(found, expected, "{what}: streams");
}

/// Waits for `child` to exit (at most `WAIT_MAX`).
fn wait_exit(child: &mut Child, what: &str) -> ExitStatus {
    let deadline = Instant::now() + WAIT_MAX;
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            return status;
        }
        assert!(Instant::now() < deadline, "{what}: process did not exit");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs `shardline serve` on `data_dir` expecting it to refuse to boot; returns its stderr.
fn serve_refuses(data_dir: &Path, extra: &[&str]) -> String {
    let log = data_dir.with_extension("refusal.log");
    let stderr = std::fs::File::create(&log).unwrap();
    let mut child = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .args(SHARDS)
        .args(extra)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr)
        .spawn()
        .unwrap();
    let deadline = Instant::now() + WAIT_MAX;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "server booted (or hung) instead of refusing; stderr:\n{}",
                std::fs::read_to_string(&log).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert!(
        !status.success() && status.code().is_some(),
        "refusal must be a non-zero exit, got {status:?}; stderr:\n{stderr}"
    );
    stderr
}

/// `shardline inspect KIND PATH`: (exit code, stdout + stderr).
fn inspect(kind: &str, path: &Path) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .args(["inspect", kind])
        .arg(path)
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.code(), text)
}

/// Copies directory `from` to `to` recursively (regular files and directories only).
fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// XORs byte `position` of `path` with 0xFF.
fn flip_byte(path: &Path, position: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    let index = usize::try_from(position).unwrap();
    assert!(
        index < bytes.len(),
        "{}: no byte {position}",
        path.display()
    );
    bytes[index] ^= 0xFF;
    std::fs::write(path, bytes).unwrap();
}

/// The first journal segment of `data_dir`.
fn wal_path(data_dir: &Path) -> PathBuf {
    data_dir.join("journal").join("00000000000000000001.wal")
}

/// Each journal record of `wal` as (position, body size), by the layout of FORMAT.md section 8.
fn wal_records(wal: &Path) -> Vec<(u64, u64)> {
    let bytes = std::fs::read(wal).unwrap();
    let mut records = Vec::new();
    let mut position = 0usize;
    while position + 64 <= bytes.len() {
        let size = u32::from_le_bytes(bytes[position + 44..position + 48].try_into().unwrap());
        records.push((position as u64, u64::from(size)));
        position += 64 + size as usize;
    }
    assert_eq!(
        position,
        bytes.len(),
        "{}: records do not tile the file",
        wal.display()
    );
    records
}

/// Asserts `text` contains `needle`, printing `text` otherwise.
fn assert_contains(text: &str, needle: &str, what: &str) {
    assert!(text.contains(needle), "{what}: no {needle:?} in:\n{text}");
}

// ------------------------------------------------------------------------------------------------
// 1. A crash at every step of a checkpoint.

/// Runs the crash scenario for one failpoint; see `crash_at_every_checkpoint_step`.
fn crash_at(failpoint: &str, root: &Path) {
    let data_dir = root.join(failpoint.replace('.', "_"));
    let what = |step: &str| format!("{failpoint}: {step}");
    let flags = [SHARDS.as_slice(), &["--checkpoint-interval", "4"]].concat();
    let mut command = Command::new(BIN);
    command.env("SHARDLINE_FAILPOINT", failpoint);
    let mut server = Server::start_with(command, &data_dir, &flags);

    // Register is op 1, request i is op i + 1: the checkpoint at op 4 runs while requests go on.
    let client_id = 0x00D0_0000_0000_0000_0000_0000_0000_0001u128;
    let mut client = RawClient::connect(server.addr, client_id);
    client.register();
    let mut acked = Vec::new();
    let mut in_flight = None;
    for request in 1..=1000u64 {
        let stream_id = u32::try_from(request).unwrap();
        // A failed send or read means the process died: this request is in flight.
        let Ok(answer) = client.create_stream(request, stream_id) else {
            in_flight = Some(stream_id);
            break;
        };
        answer.assert_ok(request, &what("create before the crash"));
        acked.push(stream_id);
    }
    let in_flight = in_flight.unwrap_or_else(|| panic!("{}", what("the server never died")));
    drop(client);
    let status = wait_exit(&mut server.child, &what("crash"));
    assert_eq!(
        status.signal(),
        Some(libc::SIGKILL),
        "{}",
        what("exit status")
    );
    assert_contains(
        &server.stderr(),
        &format!("failpoint {failpoint}: killing the process with SIGKILL"),
        &what("stderr"),
    );
    drop(server);
    assert_crash_state(failpoint, &data_dir, u64::from(in_flight) + 1);

    // Restart without the failpoint.
    let server = Server::start(&data_dir, &flags);
    if ["checkpoint.after_rename", "checkpoint.after_dir_fsync"].contains(&failpoint) {
        assert_contains(
            &server.stderr(),
            "snapshot is newer than the superblock's checkpoint",
            &what("boot from a snapshot the superblock does not record yet"),
        );
    }
    let mut found = streams(server.addr);
    found.sort();
    for id in &acked {
        assert!(
            found.contains(&(*id, format!("s{id}"))),
            "{failpoint}: acknowledged stream {id} lost; found {found:?}"
        );
    }
    let mut client = RawClient::connect(server.addr, client_id);
    let request_in_flight = u64::from(in_flight);
    client
        .create(request_in_flight, in_flight)
        .assert_ok(request_in_flight, &what("resent in-flight request"));
    assert_streams(
        server.addr,
        1..=in_flight,
        &what("after resending the in-flight request"),
    );
    let last_acked = *acked
        .last()
        .expect("requests before the checkpoint were acked");
    client.create(u64::from(last_acked), last_acked).assert_ok(
        u64::from(last_acked),
        &what("resent last acked request (cached reply)"),
    );
    // The ring holds the replies of the latest 8 requests: in_flight - 7 ..= in_flight.
    let request_1 = client.create(1, 1);
    if in_flight <= 8 {
        request_1.assert_ok(1, &what("resent request 1 (cached reply)"));
    } else {
        request_1.assert_error(
            ErrorCode::RequestStale,
            &what("resent request 1 (out of the ring)"),
        );
    }
    client
        .create(request_in_flight + 1, in_flight)
        .assert_error(
            ErrorCode::StreamAlreadyExists,
            &what("new request for an existing stream"),
        );
    assert_streams(server.addr, 1..=in_flight, &what("after the duplicates"));
    drop(client);
    assert_eq!(server.stop(), Some(0), "{}", what("clean stop"));

    let server = Server::start(&data_dir, &flags);
    assert_streams(server.addr, 1..=in_flight, &what("after a clean restart"));
    let mut client = RawClient::connect(server.addr, client_id);
    client.create(request_in_flight, in_flight).assert_ok(
        request_in_flight,
        &what("in-flight request after the clean restart"),
    );
    drop(client);
    assert_eq!(server.stop(), Some(0), "{}", what("second clean stop"));

    for (kind, path) in [
        ("superblock", data_dir.clone()),
        ("wal", data_dir.join("journal")),
    ] {
        let (code, text) = inspect(kind, &path);
        assert_eq!(
            code,
            Some(0),
            "{}:\n{text}",
            what(&format!("inspect {kind}"))
        );
    }
}

/// `checkpoint_op` of each superblock copy (FORMAT.md section 7: bytes 56..64 of the copy).
fn superblock_checkpoint_ops(data_dir: &Path) -> [u64; 4] {
    let bytes = std::fs::read(data_dir.join("superblock")).unwrap();
    std::array::from_fn(|copy| {
        let at = copy * 4096 + 56;
        u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap())
    })
}

/// `checkpoint_op` in a snapshot file's header (FORMAT.md section 9: bytes 16..24).
fn snapshot_checkpoint_op(path: &Path) -> u64 {
    let bytes = std::fs::read(path).unwrap();
    u64::from_le_bytes(bytes[16..24].try_into().unwrap())
}

/// Checks that the files show the crash happened exactly at `failpoint` of the first checkpoint
/// (which covers op 4, the first due with `--checkpoint-interval 4`, or a later op committed
/// before it started, at most `last_op`).
fn assert_crash_state(failpoint: &str, data_dir: &Path, last_op: u64) {
    let snapshot = data_dir.join("snapshot");
    let tmp = data_dir.join("snapshot.tmp");
    let copies = superblock_checkpoint_ops(data_dir);
    let step = FAILPOINTS.iter().position(|&f| f == failpoint).unwrap();
    let checkpoint_op = if step < 2 {
        assert!(tmp.exists() && !snapshot.exists(), "{failpoint}: tmp only");
        snapshot_checkpoint_op(&tmp)
    } else {
        assert!(!tmp.exists() && snapshot.exists(), "{failpoint}: renamed");
        snapshot_checkpoint_op(&snapshot)
    };
    assert!(
        (4..=last_op).contains(&checkpoint_op),
        "{failpoint}: checkpoint op {checkpoint_op} outside 4..={last_op}"
    );
    // Copies written before the crash hold the new pairing; the others still the format's 0.
    let written = step.saturating_sub(3).min(4);
    let expected: [u64; 4] =
        std::array::from_fn(|copy| if copy < written { checkpoint_op } else { 0 });
    assert_eq!(
        copies, expected,
        "{failpoint}: superblock copies' checkpoint_op"
    );
}

#[test]
fn crash_at_every_checkpoint_step() {
    let root = tempfile::tempdir().unwrap();
    for failpoint in FAILPOINTS {
        crash_at(failpoint, root.path());
    }
}

// ------------------------------------------------------------------------------------------------
// 2-4. Superblock and snapshot corruption.

/// A data directory with streams 1..=3 (client `0xA1`, requests 1..=3), stopped cleanly so the
/// superblock records a checkpoint and the snapshot holds it.
fn checkpointed_data_dir(root: &Path) -> PathBuf {
    let data_dir = root.join("base");
    let server = Server::start(&data_dir, &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xA1);
    client.register();
    for id in 1..=3u32 {
        client
            .create(u64::from(id), id)
            .assert_ok(u64::from(id), "create");
    }
    drop(client);
    assert_eq!(server.stop(), Some(0));
    assert!(
        data_dir.join("snapshot").exists(),
        "clean stop wrote no snapshot"
    );
    data_dir
}

#[test]
fn superblock_single_copy_corruption_boots() {
    let root = tempfile::tempdir().unwrap();
    let base = checkpointed_data_dir(root.path());
    for copy_index in 0..4u64 {
        let data_dir = root.path().join(format!("copy{copy_index}"));
        copy_dir(&base, &data_dir);
        let superblock = data_dir.join("superblock");
        flip_byte(&superblock, copy_index * 4096 + 40);
        let server = Server::start(&data_dir, &SHARDS);
        let what = format!("copy {copy_index} corrupt");
        assert_streams(server.addr, 1..=3, &what);
        // The client table came back too: request 3 is answered from the cache.
        let mut client = RawClient::connect(server.addr, 0xA1);
        client.create(3, 3).assert_ok(3, &what);
        drop(client);
        let log = server.stderr();
        let warning = log
            .lines()
            .find(|line| line.contains("superblock copy invalid"))
            .unwrap_or_else(|| panic!("{what}: no warning in:\n{log}"));
        assert_contains(warning, &format!("copy_index={copy_index}"), &what);
        assert_contains(warning, &superblock.display().to_string(), &what);
        assert_contains(warning, "checksum", &what);
        assert_eq!(server.stop(), Some(0));
    }
}

#[test]
fn superblock_all_copies_corrupt_refuses() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = checkpointed_data_dir(root.path());
    let superblock = data_dir.join("superblock");
    for copy_index in 0..4u64 {
        flip_byte(&superblock, copy_index * 4096 + 40);
    }
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, &superblock.display().to_string(), "refusal");
    assert_contains(&stderr, "all 4 superblock copies are invalid", "refusal");
    assert_contains(&stderr, "refusing to boot", "refusal");
}

#[test]
fn snapshot_payload_corruption_refuses() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = checkpointed_data_dir(root.path());
    let snapshot = data_dir.join("snapshot");
    let bytes = std::fs::read(&snapshot).unwrap();
    let payload_size = u64::from_le_bytes(bytes[24..32].try_into().unwrap());
    assert_eq!(payload_size + 72, bytes.len() as u64, "snapshot layout");
    flip_byte(&snapshot, 64 + payload_size / 2);
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, &snapshot.display().to_string(), "refusal");
    assert_contains(&stderr, "checksum", "refusal");
    assert_contains(&stderr, "refusing to boot", "refusal");
}

// ------------------------------------------------------------------------------------------------
// 5-6. Journal corruption.

/// Creates streams 1..=5 (client `0xB1`, requests 1..=5) with checkpoints far away, then kills
/// the server with SIGKILL: every op (Register and five creates) is only in the journal.
fn journal_only_data_dir(root: &Path, name: &str) -> PathBuf {
    let data_dir = root.join(name);
    let server = Server::start(
        &data_dir,
        &[SHARDS.as_slice(), &["--checkpoint-interval", "1000"]].concat(),
    );
    let mut client = RawClient::connect(server.addr, 0xB1);
    client.register();
    for id in 1..=5u32 {
        client
            .create(u64::from(id), id)
            .assert_ok(u64::from(id), "create");
    }
    drop(client);
    server.kill9();
    assert!(!data_dir.join("snapshot").exists(), "a checkpoint ran");
    assert_eq!(
        wal_records(&wal_path(&data_dir)).len(),
        6,
        "journal records"
    );
    data_dir
}

#[test]
fn wal_interior_corruption_refuses() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = journal_only_data_dir(root.path(), "interior");
    let wal = wal_path(&data_dir);
    let (position, size) = wal_records(&wal)[1];
    flip_byte(&wal, position + 64 + size / 2);
    let before = std::fs::read(&wal).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!(
            "{}: corrupt journal record at byte {position}",
            wal.display()
        ),
        "refusal",
    );
    assert_contains(&stderr, "refusing to boot", "refusal");
    // Nothing was truncated or rewritten.
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        before,
        "a refused boot changed the journal"
    );
    assert_eq!(
        std::fs::read_dir(data_dir.join("journal")).unwrap().count(),
        1,
        "a refused boot added a segment"
    );
}

/// Boots `data_dir` whose last journal record (request 5 of client `0xB1`) is torn or damaged:
/// it must be truncated, streams 1..=4 present, and request 5 is then new (never acknowledged).
fn assert_tail_truncated(data_dir: &Path, what: &str) {
    let server = Server::start(data_dir, &SHARDS);
    assert_streams(server.addr, 1..=4, what);
    let log = server.stderr();
    assert_contains(&log, "torn tail", what);
    assert_contains(&log, "truncated", what);
    assert_eq!(
        wal_records(&wal_path(data_dir)).len(),
        5,
        "{what}: journal after boot"
    );
    let mut client = RawClient::connect(server.addr, 0xB1);
    client
        .create(4, 4)
        .assert_ok(4, &format!("{what}: request 4 cached"));
    client
        .create(5, 5)
        .assert_ok(5, &format!("{what}: request 5 is new"));
    drop(client);
    assert_streams(server.addr, 1..=5, what);
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn wal_torn_tail_is_truncated() {
    let root = tempfile::tempdir().unwrap();

    let data_dir = journal_only_data_dir(root.path(), "torn");
    let wal = wal_path(&data_dir);
    let length = std::fs::metadata(&wal).unwrap().len();
    std::fs::OpenOptions::new()
        .write(true)
        .open(&wal)
        .unwrap()
        .set_len(length - 10)
        .unwrap();
    assert_tail_truncated(&data_dir, "torn append");

    let data_dir = journal_only_data_dir(root.path(), "damaged_tail");
    let wal = wal_path(&data_dir);
    let (position, size) = *wal_records(&wal).last().unwrap();
    flip_byte(&wal, position + 64 + size / 2);
    assert_tail_truncated(&data_dir, "damaged last record");
}

// ------------------------------------------------------------------------------------------------
// 7-8. Client sessions across restarts.

#[test]
fn duplicate_request_after_restart_gets_cached_reply() {
    let root = tempfile::tempdir().unwrap();
    for clean in [true, false] {
        let what = if clean { "clean stop" } else { "kill -9" };
        let data_dir = root.path().join(if clean { "clean" } else { "killed" });
        let server = Server::start(&data_dir, &SHARDS);
        let mut client = RawClient::connect(server.addr, 0xC1);
        client.register();
        client.create(1, 7).assert_ok(1, what);
        drop(client);
        if clean {
            assert_eq!(server.stop(), Some(0));
        } else {
            server.kill9();
        }
        let server = Server::start(&data_dir, &SHARDS);
        let mut client = RawClient::connect(server.addr, 0xC1);
        client
            .create(1, 7)
            .assert_ok(1, &format!("{what}: duplicate"));
        assert_streams(server.addr, [7], what);
        client
            .create(2, 7)
            .assert_error(ErrorCode::StreamAlreadyExists, what);
        drop(client);
        assert_eq!(server.stop(), Some(0));
    }
}

#[test]
fn eviction_tells_the_evicted_client() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    let flags = [SHARDS.as_slice(), &["--clients-table-max", "2"]].concat();
    let server = Server::start(&data_dir, &flags);
    let mut a = RawClient::connect(server.addr, 0xA);
    let mut b = RawClient::connect(server.addr, 0xB);
    let mut c = RawClient::connect(server.addr, 0xC);
    a.register();
    b.register();
    c.register();
    a.create(1, 1).assert_evicted("A after C registered");
    b.create(1, 2).assert_ok(1, "B");
    c.create(1, 3).assert_ok(1, "C");
    assert_streams(server.addr, [2, 3], "A's create applied nothing");
    drop((a, b, c));

    // The table survives a crash (journal replay), then a clean restart (snapshot).
    server.kill9();
    for what in ["after kill -9", "after a clean restart"] {
        let server = Server::start(&data_dir, &flags);
        let mut a = RawClient::connect(server.addr, 0xA);
        let mut b = RawClient::connect(server.addr, 0xB);
        let mut c = RawClient::connect(server.addr, 0xC);
        a.create(1, 1).assert_evicted(what);
        b.create(1, 2).assert_ok(1, &format!("{what}: B cached"));
        c.create(1, 3).assert_ok(1, &format!("{what}: C cached"));
        assert_streams(server.addr, [2, 3], what);
        drop((a, b, c));
        assert_eq!(server.stop(), Some(0));
    }

    // The client library: told, then registers again by itself.
    let server = Server::start(&data_dir, &flags);
    let addr = server.addr;
    block_on(async move {
        let mut x = bus::Client::connect(addr).await.unwrap();
        x.create_stream(10, "s10").await.unwrap();
        let session = x.session().expect("registered");
        // D and E register: X's session is among the two least recently committed.
        RawClient::connect(addr, 0xD).register();
        RawClient::connect(addr, 0xE).register();
        match x.create_stream(11, "s11").await {
            Err(bus::ClientError::Evicted { reason }) => {
                assert_contains(&reason, "--clients-table-max 2", "bus client eviction");
            }
            other => panic!("expected Evicted, got {other:?}"),
        }
        assert_eq!(x.session(), None, "eviction clears the session");
        x.create_stream(11, "s11").await.unwrap();
        assert!(x.session().is_some_and(|s| s > session), "registered again");
    });
    assert_streams(addr, [2, 3, 10, 11], "bus client");
    assert_eq!(server.stop(), Some(0));
}

// ------------------------------------------------------------------------------------------------
// 9. The pairing rule, and the legacy format.

#[test]
fn pairing_rule_refuses_an_older_snapshot() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = checkpointed_data_dir(root.path());
    let snapshot = data_dir.join("snapshot");
    let old = std::fs::read(&snapshot).unwrap();

    let server = Server::start(&data_dir, &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xA1);
    client
        .create(4, 4)
        .assert_ok(4, "create after the first checkpoint");
    drop(client);
    assert_eq!(server.stop(), Some(0));
    assert_ne!(
        std::fs::read(&snapshot).unwrap(),
        old,
        "no second checkpoint"
    );

    std::fs::write(&snapshot, &old).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, "pairing rule", "refusal");
    assert_contains(&stderr, &snapshot.display().to_string(), "refusal");
    assert_contains(&stderr, "older than the checkpoint op", "refusal");
}

#[test]
fn pairing_rule_refuses_same_op_with_another_checksum() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = checkpointed_data_dir(root.path());
    let snapshot = data_dir.join("snapshot");
    let decoded = storage::snapshot::decode(&std::fs::read(&snapshot).unwrap()).unwrap();
    // A well-formed snapshot at the recorded op whose state differs: stream 1 renamed.
    let payload = String::from_utf8(decoded.payload).unwrap();
    assert_eq!(payload.matches("\"s1\"").count(), 1, "payload: {payload}");
    let forged = payload.replace("\"s1\"", "\"x1\"");
    let mut bytes = storage::snapshot::encode(decoded.checkpoint_op, forged.as_bytes());
    let trailer = twox_hash::XxHash3_64::oneshot(&bytes);
    bytes.extend_from_slice(&trailer.to_le_bytes());
    assert_eq!(
        storage::snapshot::decode(&bytes).unwrap().checkpoint_op,
        decoded.checkpoint_op,
        "forged snapshot is well-formed"
    );
    std::fs::write(&snapshot, bytes).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, "pairing rule", "refusal");
    assert_contains(&stderr, &snapshot.display().to_string(), "refusal");
    assert_contains(
        &stderr,
        &format!("snapshot at op {} has checksum", decoded.checkpoint_op),
        "refusal",
    );
}

#[test]
fn clients_table_max_lowered_evicts_at_boot() {
    let root = tempfile::tempdir().unwrap();
    for clean in [true, false] {
        let what = if clean {
            "from the snapshot"
        } else {
            "from the journal"
        };
        let data_dir = root.path().join(if clean { "clean" } else { "killed" });
        let server = Server::start(
            &data_dir,
            &[SHARDS.as_slice(), &["--clients-table-max", "4"]].concat(),
        );
        let mut clients: Vec<RawClient> = [0xA, 0xB, 0xC]
            .into_iter()
            .map(|id| RawClient::connect(server.addr, id))
            .collect();
        for client in &mut clients {
            client.register();
        }
        for (client, id) in clients.iter_mut().zip(1u32..) {
            client.create(1, id).assert_ok(1, what);
        }
        drop(clients);
        if clean {
            assert_eq!(server.stop(), Some(0));
        } else {
            server.kill9();
        }

        // With room for two, A (the least recently committed) loses its session at boot; its
        // change stays committed.
        let server = Server::start(
            &data_dir,
            &[SHARDS.as_slice(), &["--clients-table-max", "2"]].concat(),
        );
        assert_streams(server.addr, 1..=3, what);
        RawClient::connect(server.addr, 0xA)
            .create(1, 1)
            .assert_evicted(what);
        RawClient::connect(server.addr, 0xB)
            .create(1, 2)
            .assert_ok(1, &format!("{what}: B cached"));
        RawClient::connect(server.addr, 0xC)
            .create(1, 3)
            .assert_ok(1, &format!("{what}: C cached"));
        assert_eq!(server.stop(), Some(0));
    }
}

#[test]
fn legacy_metadata_json_is_migrated() {
    use shards::metadata::{MetadataOp, MetadataState};

    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("legacy");
    std::fs::create_dir_all(&data_dir).unwrap();
    // As the pre-journal server left it: `op` is the last applied op (2), not 0.
    let mut state = MetadataState::new();
    for (op, id) in (1..).zip([5u32, 6]) {
        state.apply(
            op,
            &MetadataOp::CreateStream {
                stream_id: id,
                name: format!("s{id}"),
            },
        );
    }
    let dir = data_dir.clone();
    block_on(async move {
        shards::metadata::store::save(&dir, &state).await.unwrap();
    });
    let legacy = data_dir.join("metadata.json");
    assert!(legacy.exists());

    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [5, 6], "migrated");
    assert_contains(&server.stderr(), "migrated metadata.json", "log");
    assert!(!legacy.exists(), "metadata.json kept after the migration");
    assert!(
        data_dir.join("snapshot").exists(),
        "no snapshot after the migration"
    );
    assert_eq!(server.stop(), Some(0));

    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [5, 6], "after a restart");
    // A change after the migration, then a clean stop: its checkpoint (op 2, three streams
    // of which two came from op 0) must boot again.
    let mut client = RawClient::connect(server.addr, 0xE1);
    client.register();
    client
        .create(1, 7)
        .assert_ok(1, "create after the migration");
    drop(client);
    assert_eq!(server.stop(), Some(0));
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(
        server.addr,
        [5, 6, 7],
        "after a checkpoint above the migration",
    );
    assert_eq!(server.stop(), Some(0));
}

// ------------------------------------------------------------------------------------------------
// Regressions from the adversarial pass.

#[test]
fn a_removed_journal_refuses_instead_of_booting_empty() {
    let root = tempfile::tempdir().unwrap();
    // Before any checkpoint: every change lives only in the journal.
    let data_dir = journal_only_data_dir(root.path(), "no-journal");
    let journal = data_dir.join("journal");
    std::fs::remove_dir_all(&journal).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!("{}: no journal segment", journal.display()),
        "removed dir",
    );
    assert_contains(&stderr, "refusing to boot", "removed dir");
    // Emptied of segments: the same.
    std::fs::create_dir_all(&journal).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, "no journal segment", "empty dir");
    assert!(
        std::fs::read_dir(&journal).unwrap().next().is_none(),
        "a refused boot created a segment"
    );
}

#[test]
fn an_interrupted_migration_is_redone() {
    use shards::metadata::{MetadataOp, MetadataState};

    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("half-migrated");
    std::fs::create_dir_all(&data_dir).unwrap();
    let mut state = MetadataState::new();
    state.apply(
        3,
        &MetadataOp::CreateStream {
            stream_id: 8,
            name: "s8".to_owned(),
        },
    );
    let dir = data_dir.clone();
    block_on(async move {
        shards::metadata::store::save(&dir, &state).await.unwrap();
        // A crash after the migration's snapshot and empty journal, before its superblock.
        storage::snapshot::write_snapshot(&dir.join("snapshot"), 0, b"{}".to_vec(), &mut |_| {})
            .await
            .unwrap();
        storage::Journal::open(&dir.join("journal")).await.unwrap();
    });
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [8], "migration redone");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn registering_again_keeps_the_session_and_its_deduplication() {
    let root = tempfile::tempdir().unwrap();
    let server = Server::start(&root.path().join("data"), &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xC4);
    let session = client.register();
    client.create(1, 7).assert_ok(1, "create");
    let answer = client
        .send(Operation::DeleteStream, 2, Namespace::new(7, 0, 0), &[])
        .unwrap();
    answer.assert_ok(2, "delete");
    assert_eq!(
        client.register(),
        session,
        "a second Register keeps the session"
    );
    // Request 1 is still a duplicate: answered from the cache, the stream is not re-created.
    client.create(1, 7).assert_ok(1, "resend after re-register");
    assert_streams(server.addr, [], "stream 7 stays deleted");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_reused_request_number_with_other_arguments_is_refused() {
    let root = tempfile::tempdir().unwrap();
    let server = Server::start(&root.path().join("data"), &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xC5);
    client.register();
    client.create(1, 200).assert_ok(1, "create 200");
    let answer = client.create(1, 201);
    answer.assert_error(ErrorCode::InvalidArgument, "same number, other stream");
    assert_contains(&answer.text(), "other arguments", "message");
    assert_streams(server.addr, [200], "201 was not created");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_fifo_journal_segment_refuses_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = journal_only_data_dir(root.path(), "fifo");
    let fifo = data_dir.join("journal/00000000000000000099.wal");
    let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
    assert!(status.success());
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(&stderr, &fifo.display().to_string(), "fifo");
    assert_contains(&stderr, "not a regular file", "fifo");
}

#[test]
fn a_misspelled_failpoint_is_a_startup_error_not_a_panic() {
    let root = tempfile::tempdir().unwrap();
    let output = Command::new(BIN)
        .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(root.path().join("data"))
        .env("SHARDLINE_FAILPOINT", "checkpoint.after_nothing")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert_contains(
        &stderr,
        "invalid SHARDLINE_FAILPOINT value \"checkpoint.after_nothing\"",
        "message",
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
    // Empty means unset.
    let server = Server::start_with(
        {
            let mut command = Command::new(BIN);
            command.env("SHARDLINE_FAILPOINT", "");
            command
        },
        &root.path().join("data2"),
        &SHARDS,
    );
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn orphan_partition_directories_are_reported_and_kept() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = checkpointed_data_dir(root.path());
    // As a crash between a committed DeleteTopic and its directory removal leaves it.
    let orphan = data_dir.join("partitions/99/1/0");
    std::fs::create_dir_all(&orphan).unwrap();
    std::fs::write(orphan.join("00000000000000000000.log"), b"").unwrap();
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, 1..=3, "orphan ignored by the metadata");
    let log = server.stderr();
    assert_contains(&log, "partition directories that no topic names", "warning");
    assert_contains(&log, "orphan_count=1", "warning");
    assert_contains(
        &log,
        &data_dir.join("partitions/99/1").display().to_string(),
        "warning",
    );
    assert!(orphan.exists(), "an orphan was deleted on a guess");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_journal_record_that_does_not_decode_is_named_by_file_and_byte() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = journal_only_data_dir(root.path(), "bad-body");
    let wal = wal_path(&data_dir);
    let position = std::fs::metadata(&wal).unwrap().len();
    // A well-formed record (checksums verify) whose body is no prepare this build knows.
    let journal_dir = data_dir.join("journal");
    block_on(async move {
        let (mut journal, _) = storage::Journal::open(&journal_dir).await.unwrap();
        let prepare = storage::journal::Prepare {
            op: journal.last_op() + 1,
            view: 0,
            commit: journal.last_op(),
            body: br#"{"client":"0x1","request":9,"timestamp_us":0,"operation":"RenameStream"}"#
                .to_vec(),
        };
        journal.append(&prepare).await.unwrap();
    });
    let before = std::fs::read(&wal).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!(
            "{} at byte {position} (op 7): the prepare body does not decode",
            wal.display()
        ),
        "refusal",
    );
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        before,
        "a refused boot changed the journal"
    );
}

// ------------------------------------------------------------------------------------------------
// Issue 7: a damaged last journal record at or below the checkpoint is covered by the snapshot.

/// The adversarial repro: create stream 1 (client `0xC1`: Register is op 1, the create op 2),
/// stop cleanly (a checkpoint at op 2, the last journal record), then flip the byte 10 before the
/// end of the last segment, inside op 2's record.
fn covered_tail_data_dir(root: &Path) -> PathBuf {
    let data_dir = root.join("covered");
    let server = Server::start(&data_dir, &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xC1);
    client.register();
    client.create(1, 1).assert_ok(1, "create");
    drop(client);
    assert_eq!(server.stop(), Some(0));
    assert_eq!(superblock_checkpoint_ops(&data_dir), [2; 4], "checkpoint");
    let wal = wal_path(&data_dir);
    assert_eq!(wal_records(&wal).len(), 2, "journal records");
    flip_byte(&wal, std::fs::metadata(&wal).unwrap().len() - 10);
    data_dir
}

#[test]
fn issue7_wal_damaged_last_record_covered_by_the_snapshot_boots() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = covered_tail_data_dir(root.path());
    let wal = wal_path(&data_dir);
    let damaged = std::fs::read(&wal).unwrap();
    // The record layout is intact (only a body byte flipped), so it still tiles the file.
    let (op2_position, op2_body_size) = wal_records(&wal)[1];

    // Before boot, inspect tells the truth: covered, not "never acknowledged".
    let (code, text) = inspect("wal", &data_dir.join("journal"));
    assert_eq!(code, Some(1), "{text}");
    assert_contains(
        &text,
        &format!(
            "damage: {} at byte {op2_position}: body checksum",
            wal.display()
        ),
        "inspect",
    );
    assert_contains(
        &text,
        &format!(
            "the damaged last record (op 2, {} bytes) is covered by the snapshot at checkpoint op \
             2: open leaves it in place and continues the journal in a new segment at op 3; \
             nothing acknowledged is lost",
            64 + op2_body_size
        ),
        "inspect",
    );
    assert!(!text.contains("never acknowledged"), "inspect: {text}");

    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [1], "boot over the covered record");
    let log = server.stderr();
    let warning = log
        .lines()
        .find(|line| line.contains("covered by the snapshot"))
        .unwrap_or_else(|| panic!("no warning in:\n{log}"));
    for field in [
        format!("path={}", wal.display()),
        format!("position={op2_position}"),
        "op=2".to_owned(),
        "checkpoint_op=2".to_owned(),
        "resume_op=3".to_owned(),
    ] {
        assert_contains(warning, &field, "warning");
    }
    assert!(!log.contains("never acknowledged"), "boot log: {log}");
    // Nothing was cut: the damaged segment is as it was, and the journal goes on in segment 3.
    assert_eq!(std::fs::read(&wal).unwrap(), damaged, "damaged segment");
    let resumed = data_dir.join("journal").join("00000000000000000003.wal");
    assert_eq!(std::fs::metadata(&resumed).unwrap().len(), 0, "new segment");

    // The client table came back from the snapshot: request 1 is answered from the cache, and
    // request 2 is new.
    let mut client = RawClient::connect(server.addr, 0xC1);
    client.create(1, 1).assert_ok(1, "request 1 cached");
    client.create(2, 2).assert_ok(2, "request 2 is new");
    drop(client);
    assert_streams(server.addr, [1, 2], "after a new create");
    assert_eq!(server.stop(), Some(0));

    // The clean stop checkpointed op 3 and released the damaged segment.
    assert_eq!(superblock_checkpoint_ops(&data_dir), [3; 4], "checkpoint");
    assert!(!wal.exists(), "the damaged segment was not released");
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [1, 2], "after another restart");
    assert_eq!(server.stop(), Some(0));
    let (code, text) = inspect("wal", &data_dir.join("journal"));
    assert_eq!(code, Some(0), "{text}");
}

#[test]
fn issue7_wal_damaged_last_record_covered_restarts_before_the_next_checkpoint() {
    // A second boot before any new op finds the damaged closed segment and the empty segment 3
    // after it, and accepts them: the snapshot covers the gap.
    let root = tempfile::tempdir().unwrap();
    let data_dir = covered_tail_data_dir(root.path());
    let wal = wal_path(&data_dir);
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [1], "first boot");
    server.kill9();
    let (code, text) = inspect("wal", &data_dir.join("journal"));
    assert_eq!(code, Some(1), "{text}");
    assert_contains(
        &text,
        "damage in a closed segment at op 2 is covered by the snapshot at checkpoint op 2: \
         open leaves it in place, the journal continues at op 3",
        "inspect",
    );
    assert!(!text.contains("op gap"), "inspect: {text}");
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [1], "second boot");
    assert_contains(&server.stderr(), "covered by the snapshot", "second boot");
    let mut client = RawClient::connect(server.addr, 0xC1);
    client.create(2, 2).assert_ok(2, "request 2 is new");
    drop(client);
    assert_eq!(server.stop(), Some(0));
    assert!(!wal.exists(), "the damaged segment was not released");
}

#[test]
fn issue7_wal_damaged_last_record_above_the_checkpoint_is_truncated() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = covered_tail_data_dir(root.path());
    // Undo the flip, then journal op 3 (stream 2) without a checkpoint and damage it.
    let wal = wal_path(&data_dir);
    flip_byte(&wal, std::fs::metadata(&wal).unwrap().len() - 10);
    let server = Server::start(&data_dir, &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xC1);
    client.create(2, 2).assert_ok(2, "create");
    drop(client);
    server.kill9();
    let (op3_position, _) = *wal_records(&wal).last().unwrap();
    flip_byte(&wal, std::fs::metadata(&wal).unwrap().len() - 10);

    let (code, text) = inspect("wal", &data_dir.join("journal"));
    assert_eq!(code, Some(1), "{text}");
    assert_contains(
        &text,
        &format!(
            "torn tail: {} at byte {op3_position}: body checksum",
            wal.display()
        ),
        "inspect",
    );
    assert_contains(
        &text,
        &format!(
            "which open would truncate (op 3 is above the checkpoint op 2 in {}: if a crash cut \
             the write short, that prepare was never acknowledged)",
            data_dir.join("superblock").display()
        ),
        "inspect",
    );

    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, [1], "boot");
    let log = server.stderr();
    let warning = log
        .lines()
        .find(|line| line.contains("torn tail"))
        .unwrap_or_else(|| panic!("no warning in:\n{log}"));
    for field in [
        format!("path={}", wal.display()),
        format!("position={op3_position}"),
        "op=3".to_owned(),
        "checkpoint_op=2".to_owned(),
        "never acknowledged".to_owned(),
    ] {
        assert_contains(warning, &field, "warning");
    }
    assert_eq!(wal_records(&wal).len(), 2, "journal after boot");
    let mut client = RawClient::connect(server.addr, 0xC1);
    client.create(2, 2).assert_ok(2, "request 2 is new again");
    drop(client);
    assert_streams(server.addr, [1, 2], "after the retry");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue7_wal_refusal_after_a_torn_tail_changes_nothing() {
    // A record that does not decode (op 7) before a damaged last record (op 8): boot used to cut
    // op 8 and then refuse at op 7. It must refuse with the journal as it was.
    let root = tempfile::tempdir().unwrap();
    let data_dir = journal_only_data_dir(root.path(), "refuse-then-cut");
    let wal = wal_path(&data_dir);
    let journal_dir = data_dir.join("journal");
    block_on(async move {
        let (mut journal, _) = storage::Journal::open(&journal_dir).await.unwrap();
        for body in [&br#"{"operation":"RenameStream"}"#[..], &b"torn"[..]] {
            let prepare = storage::journal::Prepare {
                op: journal.last_op() + 1,
                view: 0,
                commit: journal.last_op(),
                body: body.to_vec(),
            };
            journal.append(&prepare).await.unwrap();
        }
    });
    let (op7_position, _) = wal_records(&wal)[6];
    flip_byte(&wal, std::fs::metadata(&wal).unwrap().len() - 2);
    let before = std::fs::read(&wal).unwrap();
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!(
            "{} at byte {op7_position} (op 7): the prepare body does not decode",
            wal.display()
        ),
        "refusal",
    );
    assert_eq!(
        std::fs::read(&wal).unwrap(),
        before,
        "a refused boot changed the journal"
    );
}

// ------------------------------------------------------------------------------------------------
// Issue 7 (adv2): journal damage anywhere at or below the checkpoint is covered by the snapshot.

/// Every file under `dir` (relative path, bytes), sorted: what a refused boot must leave as is.
fn dir_bytes(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(at) = pending.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                pending.push(entry.path());
            } else {
                let relative = entry.path().strip_prefix(dir).unwrap().to_path_buf();
                files.push((relative, std::fs::read(entry.path()).unwrap()));
            }
        }
    }
    files.sort();
    files
}

/// Client `0xD1` registers (op 1) and creates streams 1..=4 (ops 2..=5); a clean stop
/// checkpoints op 5, the last journal record.
fn four_streams_stopped_cleanly(root: &Path) -> PathBuf {
    let data_dir = root.join("four");
    let server = Server::start(&data_dir, &SHARDS);
    let mut client = RawClient::connect(server.addr, 0xD1);
    client.register();
    for id in 1..=4u32 {
        client
            .create(u64::from(id), id)
            .assert_ok(u64::from(id), "create");
    }
    drop(client);
    assert_eq!(server.stop(), Some(0));
    assert_eq!(superblock_checkpoint_ops(&data_dir), [5; 4], "checkpoint");
    assert_eq!(
        wal_records(&wal_path(&data_dir)).len(),
        5,
        "journal records"
    );
    data_dir
}

/// The adversary's repro (`adv2_journal_damage_below_the_checkpoint_refuses_boot`): a body byte
/// flipped in op 3's record, not the last, after a clean stop. It used to refuse ("damage before
/// the tail refuses to boot"); the snapshot holds every op, so boot continues, warns with file,
/// byte and op, leaves the segment as it is and continues the journal at op 6.
#[test]
fn issue7_adv2_journal_damage_below_the_checkpoint_boots() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = four_streams_stopped_cleanly(root.path());
    let wal = wal_path(&data_dir);
    let records = wal_records(&wal);
    let (op3_position, _) = records[2];
    let (op4_position, _) = records[3];
    flip_byte(&wal, op3_position + 64 + 5);
    let damaged = std::fs::read(&wal).unwrap();

    let (code, text) = inspect("wal", &data_dir.join("journal"));
    assert_eq!(code, Some(1), "{text}");
    assert_contains(
        &text,
        &format!(
            "damage: {} at byte {op3_position}: body checksum",
            wal.display()
        ),
        "inspect",
    );
    assert_contains(
        &text,
        &format!(
            "damage at op 3 covered by the snapshot at checkpoint op 5: open skips it (never \
             replayed) and resumes at op 4 at byte {op4_position}, then continues the journal \
             in a new segment; nothing acknowledged is lost"
        ),
        "inspect",
    );

    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, 1..=4, "boot over covered damage");
    let log = server.stderr();
    let warning = log
        .lines()
        .find(|line| line.contains("covered by the snapshot"))
        .unwrap_or_else(|| panic!("no warning in:\n{log}"));
    for field in [
        format!("path={}", wal.display()),
        format!("position={op3_position}"),
        "op=3".to_owned(),
        format!("skipped_bytes={}", op4_position - op3_position),
        "checkpoint_op=5".to_owned(),
        "resume_op=4".to_owned(),
    ] {
        assert_contains(warning, &field, "warning");
    }
    assert_eq!(std::fs::read(&wal).unwrap(), damaged, "damaged segment");
    let resumed = data_dir.join("journal").join("00000000000000000006.wal");
    assert_eq!(std::fs::metadata(&resumed).unwrap().len(), 0, "new segment");
    let mut client = RawClient::connect(server.addr, 0xD1);
    client.create(4, 4).assert_ok(4, "request 4 cached");
    client.create(5, 5).assert_ok(5, "request 5 is new");
    drop(client);
    assert_eq!(server.stop(), Some(0));
    // The clean stop checkpointed op 6 and released the damaged segment.
    assert_eq!(superblock_checkpoint_ops(&data_dir), [6; 4], "checkpoint");
    assert!(!wal.exists(), "the damaged segment was not released");
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, 1..=5, "after another restart");
    assert_eq!(server.stop(), Some(0));
}

/// Damage at op 3 (covered by the checkpoint at op 5) in a segment that goes on with ops 6 and
/// 7 journaled after it: boot skips op 3 and replays 6 and 7. Damage at op 6 instead (above the
/// checkpoint, not a torn tail) refuses exactly as before, naming file and byte, and changes no
/// byte of the data directory.
#[test]
fn issue7_journal_damage_below_the_checkpoint_keeps_the_ops_above_it() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = four_streams_stopped_cleanly(root.path());
    let server = Server::start(
        &data_dir,
        &[SHARDS.as_slice(), &["--checkpoint-interval", "1000"]].concat(),
    );
    let mut client = RawClient::connect(server.addr, 0xD1);
    for id in 5..=6u32 {
        client
            .create(u64::from(id), id)
            .assert_ok(u64::from(id), "create");
    }
    drop(client);
    server.kill9();
    let wal = wal_path(&data_dir);
    let records = wal_records(&wal);
    assert_eq!(records.len(), 7, "journal records");
    let clean = std::fs::read(&wal).unwrap();

    // Above the checkpoint: refused, nothing changed.
    let (op6_position, _) = records[5];
    flip_byte(&wal, op6_position + 64 + 5);
    let before = dir_bytes(&data_dir);
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!(
            "{}: corrupt journal record at byte {op6_position}: body checksum",
            wal.display()
        ),
        "refusal",
    );
    assert_contains(&stderr, "refusing to boot", "refusal");
    assert_eq!(
        dir_bytes(&data_dir),
        before,
        "a refused boot changed the files"
    );

    // At or below it: skipped, and the ops above it replayed.
    std::fs::write(&wal, &clean).unwrap();
    let (op3_position, _) = records[2];
    flip_byte(&wal, op3_position + 64 + 5);
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, 1..=6, "boot over covered damage");
    assert_contains(&server.stderr(), "resume_op=4", "warning");
    let resumed = data_dir.join("journal").join("00000000000000000008.wal");
    assert_eq!(std::fs::metadata(&resumed).unwrap().len(), 0, "new segment");
    assert_eq!(server.stop(), Some(0));
}

/// The journal directory emptied after a clean stop at checkpoint op 5: the superblock cannot
/// tell whether ops above the checkpoint were acknowledged (`commit_max` is written only at
/// checkpoints), so boot refuses, says how to tell and what to create, and changes nothing;
/// `inspect wal` gives the same verdict; the empty segment it names boots.
#[test]
fn issue7_a_journal_without_segments_refuses_and_says_how_to_tell() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = four_streams_stopped_cleanly(root.path());
    let journal = data_dir.join("journal");
    std::fs::remove_file(wal_path(&data_dir)).unwrap();
    let before = dir_bytes(&data_dir);
    let segment = journal.join("00000000000000000006.wal");
    let stderr = serve_refuses(&data_dir, &[]);
    assert_contains(
        &stderr,
        &format!(
            "{}: no journal segment, but {} exists (the journal is created before the \
             superblock, so it was removed): any ops acknowledged since checkpoint op 5 would be \
             lost, and the superblock cannot tell whether there were any (its commit_max 5 is \
             written only at checkpoints). Restore the journal; or, if the server's last log \
             lines show a clean stop with \"checkpoint done\" at checkpoint_op 5 (every \
             acknowledged op is then in the snapshot), create the empty segment {}",
            journal.display(),
            data_dir.join("superblock").display(),
            segment.display()
        ),
        "refusal",
    );
    assert_eq!(
        dir_bytes(&data_dir),
        before,
        "a refused boot changed the files"
    );

    let (code, text) = inspect("wal", &journal);
    assert_eq!(code, Some(1), "{text}");
    assert_contains(
        &text,
        &format!(
            "no journal segment, but {} (checkpoint op 5) exists: boot refuses, since the \
             superblock cannot tell whether ops above the checkpoint were acknowledged. Restore \
             the journal; or, if the server's last log lines show a clean stop with \"checkpoint \
             done\" at checkpoint_op 5, create the empty segment {}",
            data_dir.join("superblock").display(),
            segment.display()
        ),
        "inspect",
    );

    std::fs::write(&segment, b"").unwrap();
    let server = Server::start(&data_dir, &SHARDS);
    assert_streams(server.addr, 1..=4, "boot with the empty segment");
    let mut client = RawClient::connect(server.addr, 0xD1);
    client.create(5, 5).assert_ok(5, "request 5 is new");
    drop(client);
    assert_eq!(server.stop(), Some(0));
}
