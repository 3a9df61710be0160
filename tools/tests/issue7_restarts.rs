//! Issue 7 section 3: restarts and signals. A restart right after `kill -9` on the same port
//! starts; SIGHUP stops the server cleanly (exit 0, final fsync and checkpoint); SIGTERM drains:
//! every request read before it is finished and answered, so the batches on disk after a restart
//! are exactly the acknowledged ones.

mod common;

use std::collections::BTreeSet;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use bus::{ErrorCode, Header, Namespace, Operation};
use common::{BIN, Server, block_on, read_all};

/// Two shards without pinning: CI has two cores.
const SHARDS: [&str; 3] = ["--shards", "2", "--no-pin"];

/// How long a read may wait for an answer before the test gives up (not a timed assertion).
const WAIT_MAX: Duration = Duration::from_mins(1);

fn signal(server: &Server, signal: i32) {
    // SAFETY: kill(2) on our own child.
    assert_eq!(unsafe { libc::kill(server.pid() as i32, signal) }, 0);
}

fn wait_exit_code(server: &mut Server) -> Option<i32> {
    server.child.wait().unwrap().code()
}

#[test]
fn issue7_3_restart_right_after_kill9_binds_the_same_port() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let listen = format!("127.0.0.1:{port}");
    let mut restarted_count = 0;
    for cycle in 0..10 {
        // Panics with the server's stderr if it does not listen.
        let server = Server::start_listening(Command::new(BIN), &listen, &data_dir, &SHARDS);
        assert_eq!(server.addr.port(), port, "cycle {cycle}");
        block_on(async {
            let mut client = bus::Client::connect(server.addr).await.unwrap();
            client.ping().await.unwrap();
        });
        server.kill9();
        restarted_count += 1;
    }
    assert_eq!(restarted_count, 10);
}

#[test]
fn issue7_3_sighup_stops_cleanly_with_the_final_fsync() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let flags = ["--shards", "2", "--no-pin", "--fsync", "never"];
    let mut server = Server::start(&data_dir, &flags);
    let namespace = Namespace::new(1, 1, 0);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        for batch_index in 0..10_u64 {
            let mut batch = bus::BatchBuilder::with_capacity(10, 100);
            for message_index in 0..10 {
                batch.push(batch_index * 10 + message_index, 0, b"payload");
            }
            client
                .send_messages(namespace, batch.finish())
                .await
                .unwrap();
        }
    });
    signal(&server, libc::SIGHUP);
    assert_eq!(wait_exit_code(&mut server), Some(0));
    let stderr = server.stderr();
    assert!(stderr.contains("name=\"SIGHUP\""), "{stderr}");
    assert!(stderr.contains("shut down cleanly"), "{stderr}");
    // The clean stop checkpointed: the next boot replays nothing and every message is there.
    assert!(data_dir.join("snapshot").exists());
    drop(server);
    let server = Server::start(&data_dir, &flags);
    let messages = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        read_all(&mut client, namespace).await
    });
    let ids: Vec<u64> = messages.iter().map(|(_, id, _)| *id).collect();
    assert_eq!(ids, (0..100).collect::<Vec<u64>>());
    assert_eq!(server.stop(), Some(0));
}

/// What became of one batch, seen from the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    /// Replied with success: must be on disk.
    Acknowledged,
    /// Replied with an error (`ShuttingDown`): must not be on disk.
    Refused,
    /// The connection ended before a reply: must not be on disk either (the drain answers every
    /// request it read).
    NoReply,
}

const MESSAGES_PER_BATCH: u64 = 20;
const PARTITION_COUNT: u16 = 4;
const SENDER_COUNT: u64 = 8;

fn batch_id(sender: u64, batch_index: u64) -> u64 {
    sender * 1_000_000 + batch_index
}

/// Sends batches on one connection until one is not acknowledged; returns each batch's outcome.
fn send_until_refused(
    addr: SocketAddr,
    sender: u64,
    acknowledged_count: &AtomicUsize,
) -> Vec<(u64, Outcome)> {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream.set_read_timeout(Some(WAIT_MAX)).unwrap();
    let namespace = Namespace::new(1, 1, (sender % u64::from(PARTITION_COUNT)) as u16);
    let mut outcomes = Vec::new();
    for batch_index in 0.. {
        let id = batch_id(sender, batch_index);
        let mut batch = bus::BatchBuilder::with_capacity(MESSAGES_PER_BATCH as usize, 2000);
        for message_index in 0..MESSAGES_PER_BATCH {
            batch.push(id * 100 + message_index, 0, &[7u8; 100]);
        }
        let mut header = Header::new(bus::Command::Request, Operation::SendMessages);
        header.request = batch_index + 1;
        header.namespace = namespace.0;
        let frame = bus::encode_frame(&mut header, &batch.finish());
        if stream.write_all(&frame).is_err() {
            // Not fully written: the server cannot have read it.
            outcomes.push((id, Outcome::NoReply));
            return outcomes;
        }
        let mut head = [0u8; bus::HEADER_SIZE];
        if stream.read_exact(&mut head).is_err() {
            outcomes.push((id, Outcome::NoReply));
            return outcomes;
        }
        let reply: Header = bytemuck::pod_read_unaligned(&head);
        let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
        stream.read_exact(&mut body).unwrap();
        assert_eq!(reply.request, batch_index + 1);
        if reply.error_code == 0 {
            outcomes.push((id, Outcome::Acknowledged));
            acknowledged_count.fetch_add(1, Ordering::SeqCst);
            continue;
        }
        assert_eq!(
            reply.error_code,
            ErrorCode::ShuttingDown as u32,
            "{}",
            String::from_utf8_lossy(&body)
        );
        outcomes.push((id, Outcome::Refused));
        return outcomes;
    }
    unreachable!()
}

#[test]
fn issue7_3_sigterm_answers_every_request_it_read() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let mut server = Server::start(&data_dir, &SHARDS);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client
            .create_topic(1, 1, "t", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
    });
    // An idle client: the drain must end its connection at once, not wait for the deadline.
    let mut idle = TcpStream::connect(server.addr).unwrap();
    idle.set_read_timeout(Some(WAIT_MAX)).unwrap();
    let acknowledged_count = Arc::new(AtomicUsize::new(0));
    let senders: Vec<_> = (0..SENDER_COUNT)
        .map(|sender| {
            let addr = server.addr;
            let acknowledged_count = Arc::clone(&acknowledged_count);
            std::thread::spawn(move || send_until_refused(addr, sender, &acknowledged_count))
        })
        .collect();
    // SIGTERM mid-stream: once the senders are well under way.
    while acknowledged_count.load(Ordering::SeqCst) < 200 {
        std::thread::sleep(Duration::from_millis(5));
    }
    signal(&server, libc::SIGTERM);
    let outcomes: Vec<(u64, Outcome)> = senders
        .into_iter()
        .flat_map(|sender| sender.join().unwrap())
        .collect();
    assert_eq!(wait_exit_code(&mut server), Some(0), "{}", server.stderr());
    assert_eq!(
        idle.read(&mut [0u8; 1]).unwrap(),
        0,
        "idle connection closed"
    );
    // Shutting the read side woke every idle connection: the drain ended well before its deadline.
    let stderr = server.stderr();
    assert!(stderr.contains("draining connections"), "{stderr}");
    assert!(!stderr.contains("drain deadline passed"), "{stderr}");
    drop(server);

    let server = Server::start(&data_dir, &SHARDS);
    let on_disk: Vec<(u64, u64)> = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let mut ids = Vec::new();
        for partition in 0..PARTITION_COUNT {
            let messages = read_all(&mut client, Namespace::new(1, 1, partition)).await;
            ids.extend(messages.into_iter().map(|(_, id, _)| (id / 100, id % 100)));
        }
        ids
    });
    assert_eq!(server.stop(), Some(0));

    // Every batch on disk is whole.
    let batches_on_disk: BTreeSet<u64> = on_disk.iter().map(|(batch, _)| *batch).collect();
    assert_eq!(
        on_disk.len() as u64,
        batches_on_disk.len() as u64 * MESSAGES_PER_BATCH
    );
    let acknowledged: BTreeSet<u64> = outcomes
        .iter()
        .filter(|(_, outcome)| *outcome == Outcome::Acknowledged)
        .map(|(id, _)| *id)
        .collect();
    let not_acknowledged: Vec<(u64, Outcome)> = outcomes
        .iter()
        .filter(|(_, outcome)| *outcome != Outcome::Acknowledged)
        .copied()
        .collect();
    eprintln!(
        "acknowledged {} batches, on disk {}, not acknowledged {not_acknowledged:?}",
        acknowledged.len(),
        batches_on_disk.len()
    );
    // Each sender ended on exactly one batch that was not acknowledged.
    assert_eq!(not_acknowledged.len() as u64, SENDER_COUNT);
    assert!(acknowledged.len() >= 200);
    // Exactly the acknowledged batches are on disk: none lost, none applied without its reply.
    assert_eq!(
        batches_on_disk, acknowledged,
        "not acknowledged: {not_acknowledged:?}"
    );
}
