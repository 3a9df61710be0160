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
    flip_entry(3, field_at, mask);
}

/// Flips `mask` at byte `field_at` of entry `index` of ten, restarts twice and checks the exact
/// outcome each time: offsets `0..index` served, the bytes from the entry on quarantined once.
fn flip_entry(index: usize, field_at: usize, mask: u8) {
    let dir = tempfile::tempdir().unwrap();
    let (data_dir, segment) = ten_entries(dir.path());
    let mut bytes = std::fs::read(&segment).unwrap();
    let positions = entry_positions(&bytes);
    assert_eq!(positions.len(), 10);
    let damage_at = positions[index];
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
            (0..index as u64)
                .map(|offset| (offset, format!("msg-{offset}").into_bytes()))
                .collect::<Vec<_>>(),
            "round {round}"
        );
        assert_eq!(next_offset, index as u64, "round {round}");
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

/// Adversarial round 3: a bit flip in the payload of the LAST acknowledged entry (fsync always,
/// full length on disk) is no longer cut as a torn tail: the entry is complete, so it may have
/// been acknowledged, and its bytes are kept.
#[test]
fn issue7_4_bit_flip_in_the_last_acked_entry_is_quarantined() {
    // "msg-9" is the last 5 bytes of the segment; flip a bit of its "9".
    let dir = tempfile::tempdir().unwrap();
    let (_, segment) = ten_entries(dir.path());
    let bytes = std::fs::read(&segment).unwrap();
    let positions = entry_positions(&bytes);
    assert_eq!(&bytes[bytes.len() - 5..], b"msg-9");
    let field_at = bytes.len() - 1 - positions[9];
    drop(dir);
    flip_entry(9, field_at, 0x01);
}

/// A message content of `blocks` 64-byte blocks, each a fake entry header (offset 32, inside the
/// resync's offset bound from about 1 KiB after the damage on) whose length steps to the end of
/// the content (adversarial round 3): an unbounded resync checksums
/// `(blocks - k) * 64` bytes at block `k`.
fn crafted_region(blocks: u64) -> Vec<u8> {
    let mut out = vec![0u8; (blocks * 64) as usize];
    for k in 0..blocks {
        let at = (k * 64) as usize;
        out[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
        out[at + 16..at + 20].copy_from_slice(&((blocks - k) as u32).to_le_bytes());
        out[at + 20..at + 24].copy_from_slice(&(((blocks - k) * 64 - 32) as u32).to_le_bytes());
        out[at + 24..at + 32].copy_from_slice(&0x5555_5555_5555_5554u64.to_le_bytes());
    }
    out
}

/// Adversarial round 3: header damage in front of a 1 MiB crafted message (entry 3 of 6). The
/// resync stops on its budget (logged as `BudgetSpent`) and keeps the bytes: offsets 0..3
/// served, the rest quarantined byte for byte (the budget itself is checked exactly in
/// `storage/tests/log.rs`).
#[test]
fn issue7_1_crafted_payload_after_header_damage_is_quarantined_within_the_resync_budget() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &SERVE_ARGS);
    block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        for index in 0..6u64 {
            let mut builder = BatchBuilder::default();
            if index == 3 {
                builder.push(index, 0, &crafted_region(16_384));
            } else {
                builder.push(index, 0, format!("msg-{index}").as_bytes());
            }
            client
                .send_messages(PARTITION, builder.finish())
                .await
                .unwrap();
        }
    });
    assert_eq!(server.stop(), Some(0));
    let segment = data_dir.join("partitions/1/1/0/00000000000000000000.log");
    let mut bytes = std::fs::read(&segment).unwrap();
    let positions = entry_positions(&bytes);
    assert_eq!(positions.len(), 6);
    let damage_at = positions[3];
    bytes[damage_at + 23] ^= 0x80; // length beyond ENTRY_SIZE_MAX: the header breaks the rules
    std::fs::write(&segment, &bytes).unwrap();
    let server = Server::start(&data_dir, &SERVE_ARGS);
    let (served, next_offset) = block_on(async {
        let mut client = Client::connect(server.addr).await.unwrap();
        let messages = read_all(&mut client, PARTITION).await;
        let next_offset = client.poll(PARTITION, 0, 1).await.unwrap().next_offset;
        (messages.len(), next_offset)
    });
    let stderr = server.stderr();
    assert_eq!(server.stop(), Some(0));
    assert_eq!((served, next_offset), (3, 3));
    assert_eq!(stderr.matches("BudgetSpent").count(), 1, "{stderr}");
    let partition_dir = segment.parent().unwrap();
    let quarantine_name = format!("00000000000000000000.log.damaged-at-{damage_at}");
    assert_eq!(
        quarantine_files(partition_dir),
        vec![quarantine_name.clone()]
    );
    assert_eq!(
        std::fs::read(partition_dir.join(&quarantine_name)).unwrap(),
        bytes[damage_at..]
    );
}
