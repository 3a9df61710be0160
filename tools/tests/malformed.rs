//! Malformed frames close that one connection with a logged reason; a second client on the same
//! server keeps working.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bus::{Command, Header, Operation};
use common::{Server, block_on};

fn ping_frame() -> (Header, Vec<u8>) {
    let mut header = Header::new(Command::Request, Operation::Ping);
    let bytes = bus::encode_frame(&mut header, &[]);
    (header, bytes)
}

fn reseal(header: &mut Header) -> Vec<u8> {
    header.checksum = header.calculate_checksum();
    bytemuck::bytes_of(header).to_vec()
}

/// Writes `bytes` (then half-closes if `shutdown`), and asserts the server closes the connection.
fn assert_closed(addr: std::net::SocketAddr, bytes: &[u8], shutdown: bool) {
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(bytes).unwrap();
    if shutdown {
        stream.shutdown(std::net::Shutdown::Write).unwrap();
    }
    let mut buffer = [0u8; 512];
    match stream.read(&mut buffer) {
        Ok(0) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
        other => panic!("connection was not closed: {other:?}"),
    }
}

#[test]
fn malformed_frames_close_only_their_connection() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--shards", "2", "--no-pin", "--max-message-size", "4096"],
    );

    let addr = server.addr;
    let good = std::thread::spawn(move || {
        block_on(async move {
            let mut client = bus::Client::connect(addr).await.unwrap();
            for _ in 0..200 {
                client.ping().await.unwrap();
                compio::time::sleep(Duration::from_millis(5)).await;
            }
        });
    });

    let (header, valid) = ping_frame();

    let mut bad_checksum = valid.clone();
    bad_checksum[100] ^= 0xFF;
    assert_closed(addr, &bad_checksum, false);

    let mut small = header;
    small.size = 100;
    assert_closed(addr, &reseal(&mut small), false);

    // Oversized: answered MessageTooLarge first (tools/tests/replies.rs checks the reply), then
    // closed.
    let mut large = header;
    large.size = 4097;
    let mut stream = TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    stream.write_all(&reseal(&mut large)).unwrap();
    let mut answer = Vec::new();
    stream.read_to_end(&mut answer).unwrap();
    let reply: Header = bytemuck::pod_read_unaligned(&answer[..256]);
    assert_eq!(reply.error_code, bus::ErrorCode::MessageTooLarge as u32);
    assert_eq!(
        answer.len(),
        reply.size as usize,
        "one reply, then the close"
    );

    let mut unknown = header;
    unknown.command = 99;
    assert_closed(addr, &reseal(&mut unknown), false);

    let mut truncated = header;
    truncated.size = 256 + 100;
    let mut bytes = reseal(&mut truncated);
    bytes.extend_from_slice(&[7u8; 50]);
    assert_closed(addr, &bytes, true);

    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let random: Vec<u8> = (0..512)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state as u8
        })
        .collect();
    assert_closed(addr, &random, false);

    good.join().expect("the well-behaved client kept working");
    block_on(async {
        bus::Client::connect(addr)
            .await
            .unwrap()
            .ping()
            .await
            .unwrap();
    });

    let log = server.stderr();
    for reason in [
        "bad header checksum",
        "message size 100 is below the 256-byte header",
        "message size 4097 exceeds max_message_size 4096",
        "unknown command 99",
        "truncated frame",
    ] {
        assert!(log.contains(reason), "log lacks {reason:?}:\n{log}");
    }
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn idle_and_half_sent_connections_are_closed_after_the_idle_timeout() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &["--shards", "1", "--idle-timeout-s", "3"],
    );
    let (_, valid) = ping_frame();
    // One connection sends nothing, one sends half a header; both must be closed by the server
    // (the read timeout below is only a hang guard).
    assert_closed(server.addr, &[], false);
    assert_closed(server.addr, &valid[..100], false);
    // A client that keeps talking is not affected.
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        for _ in 0..3 {
            client.ping().await.unwrap();
            compio::time::sleep(Duration::from_millis(300)).await;
        }
    });
    assert!(
        server
            .stderr()
            .contains("closing connection: no complete frame within the idle timeout"),
        "{}",
        server.stderr()
    );
    assert_eq!(server.stop(), Some(0));
}
