//! Framing over a real compio TCP socket pair on 127.0.0.1: round trips, and every way
//! `read_frame` rejects a frame. Each test writes exact bytes on one end and asserts exactly what
//! the other end reads.

use bus::{
    Command, FrameError, HEADER_SIZE, Header, Operation, PROTOCOL_VERSION, encode_frame,
    read_frame, write_frame,
};
use compio::net::{TcpListener, TcpStream};

const MAX: u32 = bus::limits::MESSAGE_SIZE_MAX_DEFAULT;

fn run<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new()
        .expect("compio runtime")
        .block_on(future)
}

/// A connected (writer, reader) pair.
async fn socket_pair() -> (TcpStream, TcpStream) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let writer = TcpStream::connect(addr).await.unwrap();
    let (reader, _) = listener.accept().await.unwrap();
    (writer, reader)
}

/// Writes `bytes` from a spawned task (so writes larger than the socket buffers cannot
/// deadlock), closes the writer, and returns what `read_frame` made of them on the reader.
async fn send_then_read(bytes: Vec<u8>, max: u32) -> Result<bus::Frame, FrameError> {
    let (mut writer, mut reader) = socket_pair().await;
    let task = compio::runtime::spawn(async move {
        write_frame(&mut writer, bytes).await.0.unwrap();
        drop(writer);
    });
    let result = read_frame(&mut reader, max).await;
    task.await.unwrap();
    result
}

fn request(operation: Operation) -> Header {
    let mut header = Header::new(Command::Request, operation);
    header.request = 3;
    header.namespace = 0x0000_0007_0001_0002;
    header
}

/// Header bytes with `edit` applied after sealing, then the checksum recomputed.
fn resealed(body: &[u8], edit: impl FnOnce(&mut Header)) -> Vec<u8> {
    let mut header = request(Operation::Ping);
    let mut bytes = encode_frame(&mut header, body);
    edit(&mut header);
    header.checksum = header.calculate_checksum();
    bytes[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
    bytes
}

#[test]
fn frames_round_trip_back_to_back_then_closed() {
    run(async {
        let (mut writer, mut reader) = socket_pair().await;
        let large: Vec<u8> = (0..3 * 1024 * 1024 + 17)
            .map(|i: u32| (i % 251) as u8)
            .collect();
        let bodies: Vec<Vec<u8>> = vec![Vec::new(), b"hello".to_vec(), large];
        let mut headers = Vec::new();
        let mut stream = Vec::new();
        for (index, body) in bodies.iter().enumerate() {
            let mut header = request(Operation::SendMessages);
            header.offset = index as u64;
            stream.extend_from_slice(&encode_frame(&mut header, body));
            headers.push(header);
        }
        let task = compio::runtime::spawn(async move {
            write_frame(&mut writer, stream).await.0.unwrap();
            drop(writer);
        });
        for (header, body) in headers.iter().zip(&bodies) {
            let frame = read_frame(&mut reader, MAX).await.unwrap();
            assert_eq!(frame.header, *header);
            assert_eq!(frame.header.size as usize, HEADER_SIZE + body.len());
            assert_eq!(frame.body.len(), body.len());
            assert!(frame.body == *body, "body differs");
        }
        assert!(matches!(
            read_frame(&mut reader, MAX).await,
            Err(FrameError::Closed)
        ));
        task.await.unwrap();
    });
}

#[test]
fn encode_frame_sets_size_and_checksums() {
    let mut header = request(Operation::CreateStream);
    let bytes = encode_frame(&mut header, b"orders");
    assert_eq!(bytes.len(), 262);
    assert_eq!(header.size, 262);
    assert_eq!(&bytes[..HEADER_SIZE], bytemuck::bytes_of(&header));
    assert_eq!(&bytes[HEADER_SIZE..], b"orders");
    assert_eq!(
        header.checksum_body,
        Header::calculate_checksum_body(b"orders")
    );
    assert_eq!(header.checksum, header.calculate_checksum());
}

#[test]
fn closed_before_any_byte() {
    let result = run(send_then_read(Vec::new(), MAX));
    assert!(matches!(result, Err(FrameError::Closed)), "{result:?}");
}

#[test]
fn truncated_header() {
    let mut bytes = encode_frame(&mut request(Operation::Ping), b"");
    bytes.truncate(100);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(
            result,
            Err(FrameError::Truncated {
                received: 100,
                expected: 256
            })
        ),
        "{result:?}"
    );
}

#[test]
fn truncated_body() {
    let mut bytes = encode_frame(&mut request(Operation::SendMessages), &[7; 50]);
    bytes.truncate(HEADER_SIZE + 20);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(
            result,
            Err(FrameError::Truncated {
                received: 276,
                expected: 306
            })
        ),
        "{result:?}"
    );
}

#[test]
fn bad_header_checksum() {
    let mut bytes = encode_frame(&mut request(Operation::Ping), b"x");
    bytes[100] ^= 0x80;
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::HeaderChecksum)),
        "{result:?}"
    );
}

#[test]
fn bad_body_checksum() {
    let mut bytes = encode_frame(&mut request(Operation::SendMessages), b"payload");
    *bytes.last_mut().unwrap() ^= 1;
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::BodyChecksum)),
        "{result:?}"
    );
}

#[test]
fn size_below_header() {
    let bytes = resealed(b"", |header| header.size = 255);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::SizeTooSmall { size: 255 })),
        "{result:?}"
    );
}

#[test]
fn size_above_max_is_rejected_before_the_body_is_read() {
    // Only the header is sent: it announces a 1 GiB message, which must be refused as soon as
    // the header arrives, not after waiting for (or allocating) the body.
    let mut bytes = resealed(b"", |header| header.size = 1 << 30);
    bytes.truncate(HEADER_SIZE);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(
            result,
            Err(FrameError::SizeTooLarge {
                size: 1_073_741_824,
                max: MAX
            })
        ),
        "{result:?}"
    );
    let bytes = encode_frame(&mut request(Operation::Ping), &[0; 100]);
    let result = run(send_then_read(bytes, 355));
    assert!(
        matches!(
            result,
            Err(FrameError::SizeTooLarge {
                size: 356,
                max: 355
            })
        ),
        "{result:?}"
    );
}

#[test]
fn unknown_command() {
    let bytes = resealed(b"", |header| header.command = 0);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::UnknownCommand { command: 0 })),
        "{result:?}"
    );
}

#[test]
fn unknown_operation() {
    let bytes = resealed(b"", |header| header.operation = 99);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::UnknownOperation { operation: 99 })),
        "{result:?}"
    );
}

#[test]
fn unsupported_protocol_version() {
    let bytes = resealed(b"", |header| header.protocol_version = PROTOCOL_VERSION + 1);
    let result = run(send_then_read(bytes, MAX));
    assert!(
        matches!(result, Err(FrameError::ProtocolVersion { version }) if version == PROTOCOL_VERSION + 1),
        "{result:?}"
    );
}

#[test]
fn frame_error_display_names_the_numbers() {
    let error = FrameError::Truncated {
        received: 276,
        expected: 306,
    };
    assert_eq!(
        error.to_string(),
        "truncated frame: connection closed after 276 of 306 bytes"
    );
    let error = FrameError::SizeTooLarge {
        size: 356,
        max: 355,
    };
    assert_eq!(
        error.to_string(),
        "message size 356 exceeds max_message_size 355"
    );
}
