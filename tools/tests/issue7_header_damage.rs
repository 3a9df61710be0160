//! Issue 7 (second review) item 1 end to end: damage in an entry header (which no checksum
//! covers) of the active segment, found by the real `shardline serve` at boot. Ten single-message
//! entries are acknowledged under `--fsync always`, the server stops cleanly, one header field of
//! entry 3 is flipped, and the server restarts twice: the acknowledged entries 3..=9 must be
//! copied to a quarantine file (never cut silently as a torn tail), the partition must serve
//! offsets 0..3 with next offset 3 (no phantom offsets), and the second restart changes nothing.

mod common;

use std::path::{Path, PathBuf};

use bus::{BatchBuilder, Client, Namespace};
use common::{Server, block_on, read_all};

const SERVE_ARGS: [&str; 5] = ["--shards", "2", "--no-pin", "--fsync", "always"];
const PARTITION: Namespace = Namespace(0x0000_0001_0001_0000);

/// Ten single-message entries in one segment, server stopped cleanly; returns (data dir, segment).
fn ten_entries(dir: &Path) -> (PathBuf, PathBuf) {
    let data_dir = dir.join("data");
    let server = Server::start(&data_dir, &SERVE_ARGS);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        for index in 0..10u64 {
            let mut builder = BatchBuilder::default();
            builder.push(index, 0, format!("msg-{index}").as_bytes());
            let ack = client
                .send_messages(PARTITION, builder.finish())
                .await
                .unwrap();
            assert_eq!(ack.base_offset, index);
        }
    });
    assert_eq!(server.stop(), Some(0));
    let segment = data_dir.join("partitions/1/1/0/00000000000000000000.log");
    (data_dir, segment)
}

/// Byte positions of the entries of a segment (by their `length` fields).
fn entry_positions(bytes: &[u8]) -> Vec<usize> {
    let mut positions = Vec::new();
    let mut at = 0;
    while at + 32 <= bytes.len() {
        positions.push(at);
        let length = u32::from_le_bytes(bytes[at + 20..at + 24].try_into().unwrap()) as usize;
        at += 32 + length;
    }
    positions
}

fn quarantine_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains(".damaged-at-"))
        .collect();
    names.sort();
    names
}

/// Flips `mask` at byte `field_at` of entry 3 of ten, restarts twice and checks the exact
/// outcome each time.
fn flip_entry_3(field_at: usize, mask: u8) {
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, segment) = ten_entries(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    let positions = entry_positions(&bytes);
    assert_eq!(positions.len(), 10);
    let damage_at = positions[3];
    bytes[damage_at + field_at] ^= mask;
    std::fs::write(&segment, &bytes).unwrap();
    let partition_dir = segment.parent().unwrap().to_path_buf();
    let quarantine_name = format!("00000000000000000000.log.damaged-at-{damage_at}");
    for round in 0..2 {
        let server = Server::start(&data_dir, &SERVE_ARGS);
        let (messages, next_offset) = block_on(async {
            let mut client = Client::connect(server.addr).await.unwrap();
            let messages = read_all(&mut client, PARTITION).await;
            let next_offset = client.poll(PARTITION, 0, 1).await.unwrap().next_offset;
            (messages, next_offset)
        });
        let stderr = server.stderr();
        assert_eq!(server.stop(), Some(0), "round {round}");
        let served: Vec<(u64, Vec<u8>)> = messages
            .into_iter()
            .map(|(offset, _id, payload)| (offset, payload))
            .collect();
        assert_eq!(
            served,
            (0..3u64)
                .map(|offset| (offset, format!("msg-{offset}").into_bytes()))
                .collect::<Vec<_>>(),
            "round {round}"
        );
        assert_eq!(next_offset, 3, "round {round}");
        assert_eq!(
            quarantine_files(&partition_dir),
            vec![quarantine_name.clone()],
            "round {round}"
        );
        // The server's stderr log accumulates across the rounds: one quarantine, in round 0.
        assert_eq!(
            stderr.matches("not a torn write").count(),
            1,
            "round {round}: {stderr}"
        );
        assert!(!stderr.contains("torn tail"), "round {round}: {stderr}");
    }
    assert_eq!(
        std::fs::read(partition_dir.join(&quarantine_name)).unwrap(),
        bytes[damage_at..]
    );
    assert_eq!(std::fs::metadata(&segment).unwrap().len(), damage_at as u64);
}

#[test]
fn issue7_1_flipped_message_count_of_an_interior_entry_is_quarantined() {
    flip_entry_3(16, 0x02); // 1 -> 3 messages
}

#[test]
fn issue7_1_flipped_base_offset_of_an_interior_entry_is_quarantined() {
    flip_entry_3(0, 0x40);
}

#[test]
fn issue7_1_flipped_length_of_an_interior_entry_is_quarantined() {
    flip_entry_3(20, 0x01);
}

#[test]
fn issue7_1_flipped_payload_byte_of_an_interior_entry_is_quarantined() {
    flip_entry_3(32 + 2, 0x01);
}
