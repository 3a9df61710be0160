//! Issue 12 item 2: poll replies are sent from verified segment mappings to the socket without a
//! user-space copy (vmsplice + splice), by the owner shard or by another connection's shard.
//! These tests hold the replies to the bytes stored in the segment files, and check that a
//! client leaving mid-reply costs only its own connection.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bus::{BatchBuilder, Namespace, Operation};
use common::{Server, block_on};

const PARTITION_COUNT: u16 = 4;

/// Sends `batch_count` batches of `batch_size` messages of `payload_size` bytes to each of the
/// topic's partitions.
fn fill(addr: SocketAddr, batch_count: u64, batch_size: u64, payload_size: usize) {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client
            .create_topic(1, 1, "t", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
        for partition in 0..PARTITION_COUNT {
            for batch in 0..batch_count {
                let mut builder = BatchBuilder::with_capacity(batch_size as usize, 0);
                for index in 0..batch_size {
                    let id = batch * batch_size + index;
                    builder.push(
                        id,
                        1,
                        &vec![(id + u64::from(partition)) as u8; payload_size],
                    );
                }
                let namespace = Namespace::new(1, 1, partition);
                client
                    .send_messages(namespace, builder.finish())
                    .await
                    .unwrap();
            }
        }
    });
}

/// A partition's whole log as stored: its segment files concatenated in offset order.
fn stored_bytes(data_dir: &Path, partition: u16) -> Vec<u8> {
    let dir = data_dir.join(format!("partitions/1/1/{partition}"));
    let mut segments: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "log"))
        .collect();
    segments.sort();
    assert!(segments.len() > 3, "{segments:?}");
    segments
        .iter()
        .flat_map(|path| std::fs::read(path).unwrap())
        .collect()
}

/// Every batch of the partition, polled from offset 0 until caught up, concatenated.
async fn poll_all(client: &mut bus::Client, partition: u16, max_count: u32) -> Vec<u8> {
    let namespace = Namespace::new(1, 1, partition);
    let mut bytes = Vec::new();
    let mut offset = 0;
    loop {
        let result = client.poll(namespace, offset, max_count).await.unwrap();
        if result.caught_up() {
            return bytes;
        }
        bytes.extend_from_slice(&result.batches);
        offset += u64::from(result.message_count);
    }
}

/// Two shards, 64 KiB segments.
const SEGMENTS: [&str; 7] = [
    "--shards",
    "2",
    "--no-pin",
    "--fsync",
    "never",
    "--segment-size",
    "65536",
];

#[test]
fn issue12_2_polls_return_the_stored_bytes_from_the_owner_and_from_another_shard() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &SEGMENTS);
    // 20 KiB batches: three per 64 KiB segment, so polls cross rolls into the active segment.
    fill(server.addr, 40, 20, 1000);
    let expected: Vec<Vec<u8>> = (0..PARTITION_COUNT)
        .map(|partition| stored_bytes(&data_dir, partition))
        .collect();
    // Connections land on either shard (SO_REUSEPORT), so each partition is read both by its
    // owner's connections and across the mesh.
    std::thread::scope(|scope| {
        for connection in 0..8u32 {
            let expected = &expected;
            let addr = server.addr;
            scope.spawn(move || {
                block_on(async move {
                    let mut client = bus::Client::connect(addr).await.unwrap();
                    for partition in 0..PARTITION_COUNT {
                        // Small and large replies: one batch, and many segments at once.
                        let max_count = if connection % 2 == 0 { 1 } else { 100_000 };
                        let polled = poll_all(&mut client, partition, max_count).await;
                        assert!(
                            polled == expected[partition as usize],
                            "partition {partition}: {} bytes polled, {} stored",
                            polled.len(),
                            expected[partition as usize].len()
                        );
                    }
                });
            });
        }
    });
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue12_2_a_client_that_disconnects_mid_reply_leaves_the_server_serving_others() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &SEGMENTS);
    // 4 MB per partition: a poll reply of several MiB, far beyond a socket's buffer.
    fill(server.addr, 200, 20, 1000);
    for round in 0..8u16 {
        let mut stream = TcpStream::connect(server.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        let mut header = bus::Header::new(bus::Command::Request, Operation::PollMessages);
        header.client = 1 + u128::from(round);
        header.namespace = Namespace::new(1, 1, round % PARTITION_COUNT).0;
        header.offset = 0;
        header.count = u32::MAX;
        stream
            .write_all(&bus::encode_frame(&mut header, &[]))
            .unwrap();
        let mut head = [0u8; bus::HEADER_SIZE];
        stream.read_exact(&mut head).unwrap();
        let reply: bus::Header = bytemuck::pod_read_unaligned(&head);
        assert_eq!(reply.error_code, 0);
        assert!(reply.size > 3 << 20, "a reply of {} bytes", reply.size);
        let mut some = vec![0u8; 1000];
        stream.read_exact(&mut some).unwrap();
        // Closed with most of the reply unread: the server's send fails midway.
    }
    let expected = stored_bytes(&data_dir, 1);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        assert!(poll_all(&mut client, 1, 100_000).await == expected);
    });
    assert_eq!(server.stop(), Some(0));
}
