//! Issue 7, defects found in review: exact replies for a bad data directory, per-message
//! checksums at send, the partition ends on send error replies, and the open-file budget.

mod common;

use std::process::Command;

use bus::{BatchBuilder, ErrorCode, Namespace, ProducerStamp};
use common::{BIN, Server, block_on, raw_send, read_all};

/// Runs `shardline serve --data-dir DATA_DIR` on port 0 and returns its exit code and last
/// stderr line.
fn serve_refused(data_dir: &std::path::Path) -> (Option<i32>, String) {
    let output = Command::new(BIN)
        .args(["serve", "--no-pin", "--listen", "127.0.0.1:0", "--data-dir"])
        .arg(data_dir)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    let last = stderr.lines().last().unwrap_or_default().to_owned();
    (output.status.code(), last)
}

#[test]
fn issue7_review_7_a_data_dir_that_is_a_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("plain-file");
    std::fs::write(&file, b"not a directory").unwrap();
    assert_eq!(
        serve_refused(&file),
        (
            Some(1),
            format!(
                "error: --data-dir {} is not a directory; choose a directory (it is created if \
                 missing)",
                file.display()
            )
        )
    );
}

#[test]
fn issue7_review_7_a_data_dir_that_cannot_be_created_is_named() {
    let (code, last) = serve_refused(std::path::Path::new("/proc/nope"));
    assert_eq!(code, Some(1));
    assert_eq!(
        last,
        "error: cannot create data directory /proc/nope: No such file or directory (os error 2)"
    );
}

fn batch_of(payloads: &[&[u8]]) -> BatchBuilder {
    let mut builder = BatchBuilder::default();
    for (id, payload) in payloads.iter().enumerate() {
        builder.push(id as u64, 1, payload);
    }
    builder
}

fn text(body: &[u8]) -> &str {
    std::str::from_utf8(body).unwrap()
}

/// A batch whose batch checksum is right but whose message 1 carries a wrong payload checksum
/// is refused `InvalidBatch` naming the message; every send refusal about the partition (the
/// invalid batch, a sequence gap, an overlap) carries its exact next and first offsets.
#[test]
fn issue7_review_4_5_send_refusals_name_the_message_and_carry_the_partition_ends() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--shards", "2", "--no-pin"]);
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
    });
    let namespace = Namespace::new(1, 1, 0);
    let (reply, _) = raw_send(
        addr,
        namespace,
        0,
        0,
        &batch_of(&[b"a0", b"a1", b"a2"]).finish(),
    );
    assert_eq!(
        (
            reply.error_code,
            reply.offset,
            reply.next_offset,
            reply.first_offset
        ),
        (0, 0, 3, 0)
    );

    // Message 1's checksum field (batch header, message 0 of 32 + 2 bytes, then byte 24), flipped,
    // and the batch checksum recomputed over the edited section.
    let mut bad = batch_of(&[b"b0", b"b1", b"b2"]).finish();
    bad[32 + 34 + 24] ^= 0xff;
    let section_checksum = twox_hash::XxHash3_64::oneshot(&bad[32..]);
    bad[24..32].copy_from_slice(&section_checksum.to_le_bytes());
    let (reply, body) = raw_send(addr, namespace, 0, 0, &bad);
    assert_eq!(reply.error_code, ErrorCode::InvalidBatch as u32);
    assert_eq!((reply.next_offset, reply.first_offset), (3, 0));
    let good = twox_hash::XxHash3_64::oneshot(b"b1");
    assert_eq!(
        text(&body),
        format!(
            "message 1 (offset_delta 1) fails its payload checksum: the message header says \
             {:#018x}, its 2-byte payload hashes to {good:#018x}",
            good ^ 0xff
        )
    );

    let stamped = |sequence: u64, payloads: &[&[u8]]| {
        let stamp = ProducerStamp {
            producer: 20,
            sequence,
        };
        raw_send(
            addr,
            namespace,
            20,
            sequence,
            &batch_of(payloads).finish_stamped(stamp),
        )
    };
    let (reply, _) = stamped(0, &[b"c0", b"c1"]);
    assert_eq!(
        (
            reply.error_code,
            reply.offset,
            reply.next_offset,
            reply.first_offset
        ),
        (0, 3, 5, 0)
    );
    let (reply, body) = stamped(5, &[b"d0"]);
    assert_eq!(reply.error_code, ErrorCode::SequenceGap as u32);
    assert_eq!((reply.next_offset, reply.first_offset), (5, 0));
    assert_eq!(
        text(&body),
        format!(
            "producer 20 in {namespace}: expected sequence 2, received 5; nothing was appended"
        )
    );
    let (reply, _) = stamped(1, &[b"e0", b"e1"]);
    assert_eq!(reply.error_code, ErrorCode::InvalidArgument as u32);
    assert_eq!((reply.next_offset, reply.first_offset), (5, 0));

    // Only the accepted batches were stored, and every stored message verifies.
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let read: Vec<(u64, Vec<u8>)> = read_all(&mut client, namespace)
            .await
            .into_iter()
            .map(|(offset, _, payload)| (offset, payload))
            .collect();
        let expected: Vec<(u64, Vec<u8>)> = [b"a0", b"a1", b"a2", b"c0", b"c1"]
            .iter()
            .enumerate()
            .map(|(offset, payload)| (offset as u64, payload.to_vec()))
            .collect();
        assert_eq!(read, expected);
    });
    assert_eq!(server.stop(), Some(0));
}
