//! The CLI in front of a cluster (issue 8 section 2): `--addr` takes a comma-separated list and
//! skips addresses that do not answer; a backup's `NotPrimary` answer moves the command to the
//! primary it names, which applies the request once; `metadata --json` prints the cluster fields
//! on one line. The backup here is a tiny fake that answers every request `NotPrimary`; the
//! primary is a real single-replica server.

mod common;

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};

use common::{BIN, Server};

fn shardline(args: &[&str]) -> Output {
    Command::new(BIN).args(args).output().unwrap()
}

fn stderr_of(output: &Output) -> String {
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A fake backup on its own thread: answers every request `NotPrimary` (view 1, primary 0)
/// naming `primary` (or nothing). Returns its address and the (operation, client, request) of
/// each request it was sent.
/// (operation, client, request) of each request a fake backup received.
type Received = Arc<Mutex<Vec<(u8, u128, u64)>>>;

fn fake_backup(primary: Option<SocketAddr>) -> (SocketAddr, Received) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    let received = Arc::new(Mutex::new(Vec::new()));
    let log = Arc::clone(&received);
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                loop {
                    let mut header_bytes = [0u8; bus::HEADER_SIZE];
                    if stream.read_exact(&mut header_bytes).is_err() {
                        return;
                    }
                    let header: bus::Header = bytemuck::pod_read_unaligned(&header_bytes);
                    let mut body = vec![0u8; header.body_size()];
                    if stream.read_exact(&mut body).is_err() {
                        return;
                    }
                    log.lock()
                        .unwrap()
                        .push((header.operation, header.client, header.request));
                    let primary = primary.map(|addr| addr.to_string());
                    let answer = bus::not_primary(&header, 1, 0, primary.as_deref());
                    if stream.write_all(&answer).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (addr, received)
}

/// A fake replica that cannot reach a majority: on its own thread, it accepts connections and
/// reads requests but never answers. Returns its address.
fn fake_silent_replica() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { return };
            std::thread::spawn(move || {
                // Read (and drop) whatever comes until the client closes the connection.
                let mut sink = [0u8; 4096];
                while matches!(stream.read(&mut sink), Ok(count) if count > 0) {}
            });
        }
    });
    addr
}

fn dead_address() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[test]
fn a_command_sent_to_a_backup_follows_not_primary_to_the_primary() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(dir.path(), &["--shards", "1", "--no-pin"]);
    let (backup, received) = fake_backup(Some(server.addr));
    let output = shardline(&[
        "stream",
        "create",
        "5",
        "orders",
        "--addr",
        &backup.to_string(),
    ]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    // The Register was refused by the backup, then the whole exchange ran on the primary.
    let register = bus::Operation::Register as u8;
    let seen = received.lock().unwrap().clone();
    assert_eq!(seen.len(), 1, "{seen:?}");
    assert_eq!((seen[0].0, seen[0].2), (register, 0));

    // A list: the fake backup first, the primary second; a dead address in front of both.
    let dead = dead_address();
    let list = format!("{dead},{backup},{}", server.addr);
    let output = shardline(&["metadata", "--json", "--addr", &list]);
    assert!(output.status.success(), "{}", stderr_of(&output));
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        stdout.lines().count(),
        1,
        "--json prints one line: {stdout}"
    );
    let metadata: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(metadata["streams"][0]["name"], "orders", "{metadata}");
    assert_eq!(
        metadata["streams"].as_array().unwrap().len(),
        1,
        "applied exactly once: {metadata}"
    );
    for key in ["view", "replica", "primary", "commit"] {
        assert!(metadata[key].is_u64(), "{key} missing: {metadata}");
    }
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn no_primary_in_the_list_is_a_clear_error() {
    // Two backups in a view change (no primary named): the client asks each in turn, waiting
    // its backoff, until NOT_PRIMARY_REDIRECT_MAX answers (about 10 s).
    let (backup, received) = fake_backup(None);
    let (other, _) = fake_backup(None);
    let list = format!("{backup},{other}");
    let mut command = Command::new(BIN);
    let output = command
        .args(["metadata", "--addr", &list])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = stderr_of(&output);
    assert!(
        stderr.starts_with("error: no primary answered: 17 attempts over ")
            && stderr.contains(&list),
        "{stderr}"
    );
    assert!(!received.lock().unwrap().is_empty());
}

#[test]
fn a_request_no_replica_answers_ends_at_the_timeout_with_a_clear_error() {
    // Two replicas of three down, the third holding the request: the command must not hang.
    let silent = fake_silent_replica();
    let list = format!("{silent},{},{}", dead_address(), dead_address());
    let output = shardline(&[
        "stream",
        "create",
        "9",
        "x",
        "--timeout",
        "1s",
        "--addr",
        &list,
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = stderr_of(&output);
    for part in [
        &format!("error: no reply from {silent} within the request timeout of 1000 ms"),
        "is a majority of the replicas up?",
        "may or may not have been applied",
    ] {
        assert!(stderr.contains(part), "{part:?} missing from: {stderr}");
    }
    assert!(output.stdout.is_empty(), "nothing was created: {output:?}");
}

#[test]
fn timeout_is_on_every_client_command_and_its_help_says_what_it_bounds() {
    for command in [
        &["stream", "create"][..],
        &["stream", "delete"],
        &["stream", "list"],
        &["topic", "create"],
        &["topic", "delete"],
        &["topic", "alter"],
        &["topic", "list"],
        &["send"],
        &["poll"],
        &["metadata"],
    ] {
        let output = shardline(&[command, &["--help"]].concat());
        assert!(output.status.success(), "{command:?}: {output:?}");
        let help = String::from_utf8_lossy(&output.stdout);
        assert!(
            help.contains("--timeout <DURATION>")
                && help.contains("Deadline of each request")
                && help.contains("SHARDLINE_TIMEOUT"),
            "{command:?}: {help}"
        );
    }
}
