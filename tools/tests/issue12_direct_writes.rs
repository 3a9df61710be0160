//! Issue 12 item 3 through a real server: `shardline serve --write-mode direct` stores messages
//! of odd sizes across segment rolls, serves them back, survives `kill -9` (open cuts the
//! padding of the last direct write, logged as such) and a graceful restart, with no fallback to
//! buffered writes on this filesystem.

mod common;

use bus::{BatchBuilder, Namespace};
use common::{Server, block_on, read_all};

const SERVE_ARGS: [&str; 9] = [
    "--shards",
    "1",
    "--no-pin",
    "--fsync",
    "always",
    "--write-mode",
    "direct",
    "--segment-size",
    "64KiB",
];

/// Message `index`'s payload: sizes around the 4096-byte alignment and one of several blocks.
fn payload(index: u64) -> Vec<u8> {
    let size = [1, 4095, 4096, 4097, 30_000, 7][(index % 6) as usize];
    (0..size)
        .map(|byte| (byte as u64 * 7 + index) as u8)
        .collect()
}

/// Sends messages `range`, one per batch (one direct write each), to `namespace`.
fn send(addr: std::net::SocketAddr, namespace: Namespace, range: std::ops::Range<u64>) {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        for index in range {
            let mut builder = BatchBuilder::with_capacity(1, 0);
            builder.push(index, 1_700_000_000_000_000 + index, &payload(index));
            let ack = client
                .send_messages(namespace, builder.finish())
                .await
                .unwrap();
            assert_eq!(ack.base_offset, index);
        }
    });
}

fn check(addr: std::net::SocketAddr, namespace: Namespace, count: u64) {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let got = read_all(&mut client, namespace).await;
        assert_eq!(got.len() as u64, count);
        for (index, (offset, id, bytes)) in (0_u64..).zip(got) {
            assert_eq!((offset, id), (index, index));
            assert!(bytes == payload(index), "payload at offset {index} differs");
        }
    });
}

#[test]
fn issue12_3_serve_write_mode_direct_round_trips_across_kill_9_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let namespace = Namespace::new(1, 1, 0);

    let server = Server::start(&data_dir, &SERVE_ARGS);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "direct").await.unwrap();
        client.create_topic(1, 1, "writes", 1).await.unwrap();
    });
    send(server.addr, namespace, 0..40);
    check(server.addr, namespace, 40);
    server.kill9();

    let server = Server::start(&data_dir, &SERVE_ARGS);
    check(server.addr, namespace, 40);
    let stderr = server.stderr();
    assert!(
        stderr.contains("cutting the zero padding past the last entry"),
        "open names the padding of the last direct write:\n{stderr}"
    );
    send(server.addr, namespace, 40..52);
    check(server.addr, namespace, 52);
    let stderr = server.stderr();
    assert_eq!(server.stop(), Some(0), "graceful shutdown exits 0");
    assert!(
        !stderr.contains("falls back to buffered writes"),
        "ext4 takes O_DIRECT:\n{stderr}"
    );

    // The servers of one test share their stderr file: judge the last one's lines alone.
    let earlier_len = stderr.len();
    let server = Server::start(&data_dir, &["--shards", "1", "--no-pin"]);
    check(server.addr, namespace, 52);
    let stderr = server.stderr();
    assert_eq!(server.stop(), Some(0));
    let last_run = &stderr[earlier_len..];
    assert!(
        !last_run.contains("cutting the zero padding"),
        "a graceful stop leaves no padding:\n{last_run}"
    );
}
