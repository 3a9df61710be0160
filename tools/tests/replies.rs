//! Issue 7 section 4, "replies that tell the truth": poll replies carry the partition's next and
//! first offsets and refuse a poll beyond the end; a poll across a damaged entry returns the
//! messages before it; `inspect segment` reports exactly the damaged entry, with open's index
//! verdict; an oversized frame is answered `MessageTooLarge` before the close; the CLI retries
//! its first connect for `--connect-timeout`.

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use bus::{BatchBuilder, ClientError, ErrorCode, Header, Namespace, Operation};
use common::{BIN, Server, block_on};

/// Stream 1, topic 1, partition 0.
fn namespace() -> Namespace {
    Namespace::new(1, 1, 0)
}

/// Creates stream 1 and topic 1 (one partition) and sends `batch_count` batches of
/// `batch_size` messages of `payload_size` bytes (payload byte = message number).
fn fill(addr: SocketAddr, batch_count: u64, batch_size: u64, payload_size: usize) {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        for batch in 0..batch_count {
            let mut builder = BatchBuilder::with_capacity(batch_size as usize, 0);
            for index in 0..batch_size {
                let id = batch * batch_size + index;
                builder.push(id, 1, &vec![id as u8; payload_size]);
            }
            let ack = client
                .send_messages(namespace(), builder.finish())
                .await
                .unwrap();
            assert_eq!(ack.base_offset, batch * batch_size);
        }
    });
}

fn cli(args: &[&str]) -> Output {
    Command::new(BIN)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap()
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn cli_poll(addr: SocketAddr, offset: u64, count: u32) -> Output {
    cli(&[
        "poll",
        "--stream",
        "1",
        "--topic",
        "1",
        "--offset",
        &offset.to_string(),
        "--count",
        &count.to_string(),
        "--addr",
        &addr.to_string(),
    ])
}

/// Sends one raw frame and reads one reply (header and body).
fn raw_exchange(stream: &mut TcpStream, header: &mut Header, body: &[u8]) -> (Header, Vec<u8>) {
    stream.write_all(&bus::encode_frame(header, body)).unwrap();
    read_reply(stream)
}

fn read_reply(stream: &mut TcpStream) -> (Header, Vec<u8>) {
    let mut head = [0u8; 256];
    stream.read_exact(&mut head).unwrap();
    let header: Header = bytemuck::pod_read_unaligned(&head);
    assert!(header.valid_checksum());
    let mut body = vec![0u8; header.size as usize - 256];
    stream.read_exact(&mut body).unwrap();
    (header, body)
}

fn raw_connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    // A hang guard only: every read below has an answer coming.
    stream
        .set_read_timeout(Some(Duration::from_mins(1)))
        .unwrap();
    stream
}

fn poll_header(offset: u64) -> Header {
    let mut header = Header::new(bus::Command::Request, Operation::PollMessages);
    header.namespace = namespace().0;
    header.offset = offset;
    header.count = 100;
    header.request = 1;
    header
}

#[test]
fn issue7_4_poll_replies_carry_next_and_first_offset_and_refuse_beyond_the_end() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &["--shards", "2", "--no-pin"]);
    fill(server.addr, 1, 5, 10);

    // The send reply carries the ends too.
    let mut stream = raw_connect(server.addr);
    let mut send = Header::new(bus::Command::Request, Operation::SendMessages);
    send.namespace = namespace().0;
    send.request = 1;
    let mut builder = BatchBuilder::with_capacity(2, 0);
    builder.push(5, 1, b"five");
    builder.push(6, 1, b"six");
    let (reply, _) = raw_exchange(&mut stream, &mut send, &builder.finish());
    assert_eq!(
        (reply.error_code, reply.offset, reply.count),
        (0, 5, 2),
        "send reply"
    );
    assert_eq!((reply.next_offset, reply.first_offset), (7, 0));

    // Within the log: messages, and where the log ends.
    let (reply, body) = raw_exchange(&mut stream, &mut poll_header(3), &[]);
    assert_eq!((reply.error_code, reply.count), (0, 4));
    assert_eq!((reply.next_offset, reply.first_offset), (7, 0));
    assert!(!body.is_empty());
    // Exactly at the end: caught up, an empty success.
    let (reply, body) = raw_exchange(&mut stream, &mut poll_header(7), &[]);
    assert_eq!((reply.error_code, reply.count, body.len()), (0, 0, 0));
    assert_eq!((reply.next_offset, reply.first_offset), (7, 0));
    // Beyond the end: OffsetOutOfRange naming both, with the ends in the header.
    for offset in [10, u64::MAX] {
        let (reply, body) = raw_exchange(&mut stream, &mut poll_header(offset), &[]);
        assert_eq!(reply.error_code, ErrorCode::OffsetOutOfRange as u32);
        assert_eq!((reply.next_offset, reply.first_offset), (7, 0));
        assert_eq!(
            text(&body),
            format!(
                "offset {offset} is beyond the end of partition 1/1/0: its next offset is 7 \
                 (first offset 0); poll at or below the next offset"
            )
        );
    }

    // The client library exposes the same.
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let result = client.poll(namespace(), 2, 100).await.unwrap();
        assert_eq!(
            (
                result.message_count,
                result.next_offset,
                result.first_offset
            ),
            (5, 7, 0)
        );
        assert!(!result.caught_up());
        let offsets: Vec<u64> = result
            .messages()
            .unwrap()
            .iter()
            .map(|m| m.offset)
            .collect();
        assert_eq!(offsets, [2, 3, 4, 5, 6]);
        let result = client.poll(namespace(), 7, 100).await.unwrap();
        assert!(result.caught_up());
        assert_eq!((result.message_count, result.next_offset), (0, 7));
        match client.poll(namespace(), 10, 100).await {
            Err(ClientError::Server {
                code: ErrorCode::OffsetOutOfRange,
                message,
            }) => assert!(message.starts_with("offset 10 is beyond"), "{message}"),
            other => panic!("expected OffsetOutOfRange, got {other:?}"),
        }
    });

    // The CLI: beyond the end is an error, exit 1; at the end it says caught up, exit 0.
    for offset in [10, u64::MAX] {
        let output = cli_poll(server.addr, offset, 10);
        assert_eq!(output.status.code(), Some(1), "{output:?}");
        assert_eq!(text(&output.stdout), "");
        assert!(
            text(&output.stderr).contains(&format!(
                "server error OffsetOutOfRange (15): offset {offset} is beyond the end of \
                 partition 1/1/0: its next offset is 7 (first offset 0)"
            )),
            "{output:?}"
        );
    }
    let output = cli_poll(server.addr, 7, 10);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(text(&output.stdout), "");
    assert_eq!(
        text(&output.stderr),
        "caught up: no messages at or after offset 7 in 1/1/0 (its next offset is 7)\n"
    );
    let output = cli_poll(server.addr, 5, 10);
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    assert_eq!(text(&output.stdout), "5\tfive\n6\tsix\n");
    assert_eq!(server.stop(), Some(0));
}

fn partition_dir(data_dir: &Path) -> PathBuf {
    data_dir.join("partitions/1/1/0")
}

fn segment_file(data_dir: &Path, base_offset: u64) -> PathBuf {
    partition_dir(data_dir).join(format!("{base_offset:020}.log"))
}

/// Byte positions of the entries of a segment file, from their headers.
fn entry_positions(path: &Path) -> Vec<u64> {
    let bytes = std::fs::read(path).unwrap();
    let mut positions = Vec::new();
    let mut at = 0usize;
    while at < bytes.len() {
        positions.push(at as u64);
        let header = storage::EntryHeader::decode(&bytes[at..]).unwrap();
        at += storage::ENTRY_HEADER_SIZE + header.length as usize;
    }
    positions
}

fn flip_byte(path: &Path, position: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position as usize] ^= 0x20;
    std::fs::write(path, bytes).unwrap();
}

/// 10-message batches of 100-byte payloads are 1352-byte entries: 3 per 4096-byte segment.
const SMALL_SEGMENTS: [&str; 4] = ["--shards", "1", "--segment-size", "4096"];

#[test]
fn issue7_4_poll_across_a_corrupt_entry_returns_the_messages_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &SMALL_SEGMENTS);
    fill(server.addr, 5, 10, 100);
    assert_eq!(server.stop(), Some(0));
    // Second entry of segment 0 (offsets 10..=19): flip a payload byte.
    let segment = segment_file(&data_dir, 0);
    let positions = entry_positions(&segment);
    assert_eq!(positions, [0, 1352, 2704]);
    flip_byte(&segment, 1352 + 32 + 100);

    let server = Server::start(&data_dir, &SMALL_SEGMENTS);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let result = client.poll(namespace(), 3, 100).await.unwrap();
        assert_eq!(
            (result.message_count, result.next_offset),
            (7, 50),
            "the intact messages before the damaged entry"
        );
        let offsets: Vec<u64> = result
            .messages()
            .unwrap()
            .iter()
            .map(|m| m.offset)
            .collect();
        assert_eq!(offsets, (3..10).collect::<Vec<_>>());
        match client.poll(namespace(), 10, 100).await {
            Err(ClientError::Server {
                code: ErrorCode::StorageFailure,
                message,
            }) => assert!(
                message.contains(&format!(
                    "{}: corrupt entry at byte 1352: payload checksum",
                    segment.display()
                )),
                "{message}"
            ),
            other => panic!("expected StorageFailure, got {other:?}"),
        }
        // Past the damaged entry the partition reads again.
        let result = client.poll(namespace(), 20, 100).await.unwrap();
        assert_eq!(result.message_count, 30);
    });
    let output = cli_poll(server.addr, 0, 100);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let lines: Vec<String> = text(&output.stdout).lines().map(str::to_owned).collect();
    assert_eq!(lines.len(), 10, "{output:?}");
    assert!(lines[9].starts_with("9\t"), "{lines:?}");
    assert!(
        text(&output.stderr).contains("corrupt entry at byte 1352"),
        "{output:?}"
    );
    assert_eq!(server.stop(), Some(0));
}

fn inspect_json(path: &Path) -> (Option<i32>, serde_json::Value) {
    let output = cli(&["inspect", "segment", path.to_str().unwrap(), "--json"]);
    let json = serde_json::from_slice(&output.stdout)
        .unwrap_or_else(|error| panic!("{error}: {output:?}"));
    (output.status.code(), json)
}

#[test]
fn issue7_4_inspect_segment_reports_exactly_the_flipped_entry_with_opens_index_verdict() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &SMALL_SEGMENTS);
    fill(server.addr, 20, 10, 100);
    assert_eq!(server.stop(), Some(0));
    // Second entry of segment 30 (offsets 40..=49).
    let segment = segment_file(&data_dir, 30);
    flip_byte(&segment, 1352 + 32 + 7);

    let (code, json) = inspect_json(&partition_dir(&data_dir));
    assert_eq!(code, Some(1), "{json}");
    assert_eq!(json["segment_count"], 7);
    assert_eq!(json["entry_count"], 20);
    assert_eq!(json["message_count"], 200);
    assert_eq!(json["damaged_entry_count"], 1);
    assert_eq!(json["damaged_message_count"], 10);
    assert_eq!(json["next_offset"], 200);
    let damage = json["damage"].as_array().unwrap();
    assert_eq!(damage.len(), 1, "{json}");
    assert_eq!(damage[0]["file"], segment.display().to_string());
    assert_eq!(damage[0]["position"], 1352);
    assert_eq!(damage[0]["torn_tail"], false);
    let reason = damage[0]["reason"].as_str().unwrap();
    // Byte 7 of the first message header (its offset_delta): under the issue-12 rules the entry
    // checksum, over the base timestamp, message headers and stamp, is what fails.
    assert!(
        reason.starts_with("entry checksum")
            && reason.contains(
                " of the base timestamp, message headers and stamp differs from the header's"
            )
            && reason.contains("(offsets 40 to 49; in a closed segment whose index open uses"),
        "{reason}"
    );
    let segments = json["segments"].as_array().unwrap();
    for (index, segment) in segments.iter().enumerate() {
        let last = index == 6;
        assert_eq!(segment["last"], last);
        let status = if last { "absent" } else { "used_by_open" };
        assert_eq!(segment["index"]["status"], status, "segment {index}");
        for (entry_index, entry) in segment["entries"].as_array().unwrap().iter().enumerate() {
            let damaged = index == 1 && entry_index == 1;
            assert_eq!(
                entry["checksum_ok"], !damaged,
                "segment {index} entry {entry_index}"
            );
        }
    }
    assert_eq!(segments[1]["index"]["row_count"], 3);
    assert_eq!(segments[1]["entries"][1]["base_offset"], 40);
    assert_eq!(segments[1]["entries"][1]["message_count"], 10);

    // Open agrees: with the index, the server boots (polls fail only at the damaged entry).
    let server = Server::start(&data_dir, &SMALL_SEGMENTS);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        assert_eq!(
            client
                .poll(namespace(), 30, 100)
                .await
                .unwrap()
                .message_count,
            10
        );
        assert_eq!(
            client
                .poll(namespace(), 50, 100)
                .await
                .unwrap()
                .message_count,
            100
        );
    });
    assert_eq!(server.stop(), Some(0));

    // Without the index, open rescans the segment and refuses to boot; inspect says so.
    std::fs::remove_file(partition_dir(&data_dir).join(format!("{:020}.index", 30))).unwrap();
    let (code, json) = inspect_json(&partition_dir(&data_dir));
    assert_eq!(code, Some(1));
    assert_eq!(json["segments"][1]["index"]["status"], "absent");
    let damage = json["damage"].as_array().unwrap();
    assert_eq!(damage.len(), 1, "{json}");
    assert_eq!(damage[0]["position"], 1352);
    assert!(
        damage[0]["reason"]
            .as_str()
            .unwrap()
            .ends_with("(in a closed segment without an index open can use: open rescans it and refuses to boot)"),
        "{json}"
    );
    let output = cli(&[
        "serve",
        "--listen",
        "127.0.0.1:0",
        "--data-dir",
        data_dir.to_str().unwrap(),
        "--shards",
        "1",
        "--segment-size",
        "4096",
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        text(&output.stderr).contains(&format!(
            "{}: corrupt entry at byte 1352: in a closed segment: entry checksum",
            segment.display()
        )),
        "{output:?}"
    );
}

#[test]
fn issue7_4_oversized_frame_gets_message_too_large_then_close() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--shards", "1", "--max-message-size", "4096"],
    );
    fill(server.addr, 1, 1, 10);

    // A header announcing 4097 bytes, then a 1 MiB frame sent whole: each answered, then closed.
    for size in [4097u32, 1 << 20] {
        let mut stream = raw_connect(server.addr);
        let mut header = Header::new(bus::Command::Request, Operation::SendMessages);
        header.namespace = namespace().0;
        header.request = 7;
        let body = vec![0u8; size as usize - 256];
        let mut bytes = bus::encode_frame(&mut header, &body);
        if size == 4097 {
            bytes.truncate(256);
        }
        stream.write_all(&bytes).unwrap();
        let (reply, body) = read_reply(&mut stream);
        assert_eq!(reply.error_code, ErrorCode::MessageTooLarge as u32);
        assert_eq!(
            (reply.request, reply.operation),
            (7, Operation::SendMessages as u8)
        );
        assert_eq!(
            text(&body),
            format!(
                "request of {size} bytes exceeds the server's max_message_size of 4096 bytes (a \
                 whole frame: the 256-byte header plus the body; serve --max-message-size); the \
                 connection is closed"
            )
        );
        let mut rest = Vec::new();
        stream.read_to_end(&mut rest).unwrap();
        assert_eq!(rest.len(), 0, "closed after the reply");
    }

    // The client library surfaces it as a server error, and reconnects for the next call.
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let mut builder = BatchBuilder::with_capacity(1, 5000);
        builder.push(0, 1, &[b'x'; 5000]);
        match client.send_messages(namespace(), builder.finish()).await {
            Err(ClientError::Server {
                code: ErrorCode::MessageTooLarge,
                message,
            }) => assert!(
                message.starts_with(
                    "request of 5320 bytes exceeds the server's max_message_size of 4096 bytes"
                ),
                "{message}"
            ),
            other => panic!("expected MessageTooLarge, got {other:?}"),
        }
        client.ping().await.unwrap();
    });

    // The CLI asks the server for its limit first (issue 7 section 6), so it refuses the record
    // itself, naming its size and the limit, before sending anything.
    let file = dir.path().join("big.txt");
    std::fs::write(&file, format!("{}\n", "y".repeat(5000))).unwrap();
    let output = cli(&[
        "send",
        "--stream",
        "1",
        "--topic",
        "1",
        "--file",
        file.to_str().unwrap(),
        "--addr",
        &server.addr.to_string(),
    ]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    assert!(
        text(&output.stderr).contains(
            "line 1 holds 5000 bytes, more than the 3760 bytes a message may hold under the \
             server's --max-message-size 4096"
        ),
        "{output:?}"
    );
    assert_eq!(server.stop(), Some(0));
}

/// A port nothing listens on right now (bound, then released).
fn free_port() -> SocketAddr {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
}

#[test]
fn issue7_4_cli_connect_retries_until_the_server_listens() {
    let dir = tempfile::tempdir().unwrap();
    let addr = free_port();
    let client = Command::new(BIN)
        .args(["metadata", "--addr", &addr.to_string()])
        .args(["--connect-timeout", "60s"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let server = Server::start_listening(
        Command::new(BIN),
        &addr.to_string(),
        &dir.path().join("data"),
        &["--shards", "1"],
    );
    assert_eq!(server.addr, addr);
    let output = client.wait_with_output().unwrap();
    assert_eq!(output.status.code(), Some(0), "{output:?}");
    let metadata: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(metadata["streams"].is_array(), "{metadata}");
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue7_4_cli_connect_gives_up_after_the_timeout_naming_address_and_timeout() {
    let addr = free_port();
    let started = Instant::now();
    let output = cli(&[
        "metadata",
        "--addr",
        &addr.to_string(),
        "--connect-timeout",
        "700ms",
    ]);
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = text(&output.stderr);
    assert!(
        stderr.starts_with(&format!(
            "error: is `shardline serve` running at {addr}? pass --addr HOST:PORT or set \
             SHARDLINE_ADDR, and --connect-timeout to wait longer for it: cannot connect to \
             {addr} within the connect timeout of 700 ms ("
        )) && stderr.contains("Connection refused"),
        "{stderr}"
    );

    // The environment sets it too; a bad value names the accepted forms.
    let output = Command::new(BIN)
        .args(["metadata", "--addr", &addr.to_string()])
        .env("SHARDLINE_CONNECT_TIMEOUT", "0")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(&format!(
            "cannot connect to {addr} in one attempt, no retry (--connect-timeout 0): "
        )),
        "{output:?}"
    );
    let output = cli(&["metadata", "--connect-timeout", "soon"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr)
            .contains("\"soon\" is not a duration: use a whole number of seconds (5, 5s), milliseconds (300ms)"),
        "{output:?}"
    );
}
