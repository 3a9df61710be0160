//! Framing over a byte stream: read and validate `[header][body]`, encode with checksums.
//!
//! A frame is read header first; the header is validated (checksum, size, version, command,
//! operation) before one body byte is read or allocated, so a hostile `size` costs nothing. The
//! body is read into uninitialized capacity (no zero-fill) and checked against `checksum_body`.
//! This module must never hand out a frame whose checksums did not match, and never allocate more
//! than `max_message_size` for one frame.

use compio::BufResult;
use compio::buf::{IntoInner, IoBuf};
use compio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use crate::header::{HEADER_SIZE, Header, PROTOCOL_VERSION};

/// One validated message.
#[derive(Debug)]
pub struct Frame {
    pub header: Header,
    pub body: Vec<u8>,
}

/// Why a frame was rejected; every variant closes that connection (logged with this Display).
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("truncated frame: connection closed after {received} of {expected} bytes")]
    Truncated { received: usize, expected: usize },
    #[error("bad header checksum")]
    HeaderChecksum,
    #[error("bad body checksum")]
    BodyChecksum,
    #[error("message size {size} is below the 256-byte header")]
    SizeTooSmall { size: u32 },
    #[error("message size {size} exceeds max_message_size {max}")]
    SizeTooLarge { size: u32, max: u32 },
    /// `read_request_header` only: as `SizeTooLarge`, with the request header (whose checksum
    /// matched, so its fields are trusted), so a server can answer `MessageTooLarge` to that
    /// request before it closes the connection (the unread body cannot be skipped safely).
    #[error("message size {size} exceeds max_message_size {max}")]
    RequestTooLarge {
        request: Box<Header>,
        size: u32,
        max: u32,
    },
    /// A request header that verifies but names another protocol version; returned by
    /// `read_request_header` only, with the header, so that a server can answer a client of an
    /// older release in that release's own version (`reply::older_protocol_error_reply`) before
    /// closing. Worded as `ProtocolVersion`.
    #[error("unsupported protocol version {version}")]
    RequestOfOtherVersion { request: Box<Header>, version: u16 },
    #[error("unknown command {command}")]
    UnknownCommand { command: u8 },
    #[error("unknown operation {operation}")]
    UnknownOperation { operation: u8 },
    #[error("unsupported protocol version {version}")]
    ProtocolVersion { version: u16 },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads `length` bytes into a fresh buffer without zero-filling it first.
///
/// Returns the buffer; on an error its `len()` is the count of bytes that did arrive.
async fn read_exactly<R: AsyncRead + ?Sized>(
    reader: &mut R,
    length: usize,
) -> BufResult<(), Vec<u8>> {
    // `read_exact` fills `buf_capacity()` of what it is given; a `Slice` bounded at `length`
    // pins that to exactly `length` even if the allocator rounded the capacity up. Each read
    // sets the Vec's length to the bytes received so far (compio `SetLen`).
    let BufResult(result, slice) = reader
        .read_exact(Vec::with_capacity(length).slice(..length))
        .await;
    BufResult(result, slice.into_inner())
}

/// Reads one frame and validates it.
///
/// Reads exactly 256 header bytes, validates them with `Header::validate_prefix` (so an
/// oversized `size` is rejected before any body allocation), reads `size - 256` body bytes, and
/// checks `checksum_body`.
///
/// # Errors
/// - `Closed`: clean EOF before the first header byte.
/// - `Truncated { received, expected }`: EOF inside the frame; both count whole-frame bytes
///   (header included), `expected` is 256 while the header is incomplete, else `size`.
/// - any error of `Header::validate_prefix` (`HeaderChecksum`, `SizeTooSmall`, `SizeTooLarge`,
///   `ProtocolVersion`, `UnknownCommand`, `UnknownOperation`).
/// - `BodyChecksum`: the body does not match `checksum_body`.
/// - `Io`: the socket failed.
///
/// # Cancel safety
/// Not cancel safe: a dropped read loses partial bytes; the connection must then be closed.
pub async fn read_frame<R: AsyncRead + ?Sized>(
    reader: &mut R,
    max_message_size: u32,
) -> Result<Frame, FrameError> {
    let header = read_header(reader, max_message_size).await?;
    let body = read_body(reader, &header).await?;
    Ok(Frame { header, body })
}

/// Reads and validates one header (the first half of `read_frame`), so a server can account for
/// the body's memory before reading it.
///
/// # Errors
/// As `read_frame`, for the header: `Closed`, `Truncated`, `Io`, and every prefix check.
///
/// # Cancel safety
/// Not cancel safe: close the connection if the future is dropped.
pub async fn read_header<R: AsyncRead + ?Sized>(
    reader: &mut R,
    max_message_size: u32,
) -> Result<Header, FrameError> {
    let header = read_header_bytes(reader).await?;
    header.validate_prefix(max_message_size)?;
    Ok(header)
}

/// `read_header` for a server: a header that verifies but announces more than
/// `max_message_size` comes back as `RequestTooLarge` with the header, so the server can answer
/// that request (`ErrorCode::MessageTooLarge`) before closing.
///
/// A header that verifies but names another protocol version comes back as
/// `RequestOfOtherVersion` with the header, so the server can tell an older client why.
///
/// # Errors
/// As `read_header`, with `RequestTooLarge` in place of `SizeTooLarge` and
/// `RequestOfOtherVersion` in place of `ProtocolVersion`.
///
/// # Cancel safety
/// Not cancel safe: close the connection if the future is dropped.
pub async fn read_request_header<R: AsyncRead + ?Sized>(
    reader: &mut R,
    max_message_size: u32,
) -> Result<Header, FrameError> {
    let header = read_header_bytes(reader).await?;
    match header.validate_prefix(max_message_size) {
        Ok(()) => Ok(header),
        // The size is checked before the version; an older client must hear about its version
        // (in its own version) before anything else, or it cannot read the answer.
        Err(FrameError::SizeTooLarge { .. }) if header.protocol_version != PROTOCOL_VERSION => {
            Err(FrameError::RequestOfOtherVersion {
                version: header.protocol_version,
                request: Box::new(header),
            })
        }
        Err(FrameError::SizeTooLarge { size, max }) => Err(FrameError::RequestTooLarge {
            request: Box::new(header),
            size,
            max,
        }),
        Err(FrameError::ProtocolVersion { version }) => Err(FrameError::RequestOfOtherVersion {
            request: Box::new(header),
            version,
        }),
        Err(error) => Err(error),
    }
}

/// Reads 256 header bytes, unvalidated.
async fn read_header_bytes<R: AsyncRead + ?Sized>(reader: &mut R) -> Result<Header, FrameError> {
    let BufResult(result, header_bytes) = read_exactly(reader, HEADER_SIZE).await;
    if let Err(error) = result {
        return Err(match error.kind() {
            std::io::ErrorKind::UnexpectedEof if header_bytes.is_empty() => FrameError::Closed,
            std::io::ErrorKind::UnexpectedEof => FrameError::Truncated {
                received: header_bytes.len(),
                expected: HEADER_SIZE,
            },
            _ => FrameError::Io(error),
        });
    }
    assert_eq!(header_bytes.len(), HEADER_SIZE);
    Ok(bytemuck::pod_read_unaligned(&header_bytes))
}

/// Reads and verifies the body announced by a header from `read_header` (the second half of
/// `read_frame`).
///
/// # Errors
/// `Truncated` (EOF inside the body), `Io`, `BodyChecksum`.
///
/// # Cancel safety
/// Not cancel safe: close the connection if the future is dropped.
pub async fn read_body<R: AsyncRead + ?Sized>(
    reader: &mut R,
    header: &Header,
) -> Result<Vec<u8>, FrameError> {
    let body_size = header.body_size();
    let body = if body_size == 0 {
        Vec::new()
    } else {
        let BufResult(result, body) = read_exactly(reader, body_size).await;
        if let Err(error) = result {
            return Err(match error.kind() {
                std::io::ErrorKind::UnexpectedEof => FrameError::Truncated {
                    received: HEADER_SIZE + body.len(),
                    expected: header.size as usize,
                },
                _ => FrameError::Io(error),
            });
        }
        body
    };
    assert_eq!(body.len(), body_size);
    if !header.valid_checksum_body(&body) {
        return Err(FrameError::BodyChecksum);
    }
    Ok(body)
}

/// Writes all of `bytes` (normally one or more encoded frames) and flushes.
///
/// Returns the buffer for reuse, as compio's owned-buffer I/O does.
///
/// # Errors
/// The `std::io::Error` of the failed write (`WriteZero` if the peer stopped accepting bytes);
/// how much was written is then unknown and the connection must be closed.
///
/// # Cancel safety
/// Not cancel safe: a dropped write may have sent part of the frame; close the connection.
pub async fn write_frame<W: AsyncWrite + ?Sized, B: IoBuf>(
    writer: &mut W,
    bytes: B,
) -> BufResult<(), B> {
    let BufResult(result, bytes) = writer.write_all(bytes).await;
    if let Err(error) = result {
        return BufResult(Err(error), bytes);
    }
    BufResult(writer.flush().await, bytes)
}

/// Sets `size`, `checksum_body` and `checksum` in `header` and returns header+body bytes.
///
/// # Panics
/// If the message would exceed `u32::MAX` bytes (see `Header::set_checksums`).
pub fn encode_frame(header: &mut Header, body: &[u8]) -> Vec<u8> {
    header.set_checksums(body);
    let mut bytes = Vec::with_capacity(HEADER_SIZE + body.len());
    bytes.extend_from_slice(bytemuck::bytes_of(header));
    bytes.extend_from_slice(body);
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::{Command, Operation};
    use proptest::prelude::*;
    use std::pin::pin;
    use std::task::{Context, Poll, Waker};

    /// Drives a future over an in-memory reader, which never waits.
    fn poll_once<F: Future>(future: F) -> F::Output {
        match pin!(future).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(output) => output,
            Poll::Pending => panic!("an in-memory read must not be pending"),
        }
    }

    fn read_bytes(bytes: &[u8], max: u32) -> Result<Frame, FrameError> {
        let mut reader = bytes;
        poll_once(read_frame(&mut reader, max))
    }

    #[test]
    fn body_is_read_into_exact_capacity() {
        let body: Vec<u8> = (0..100_000u32).map(|i| (i * 7) as u8).collect();
        let bytes = encode_frame(
            &mut Header::new(Command::Request, Operation::SendMessages),
            &body,
        );
        let frame = read_bytes(&bytes, u32::MAX).unwrap();
        assert_eq!(frame.body, body);
        assert_eq!(frame.body.capacity(), body.len());
    }

    /// A request of another protocol version comes back with its header from
    /// `read_request_header` (so the server can answer an older client), worded as
    /// `ProtocolVersion`; `read_header` keeps the plain error.
    #[test]
    fn other_protocol_version_request_header_comes_back_with_the_error() {
        let mut header = Header::new(Command::Request, Operation::Ping);
        header.protocol_version = crate::PROTOCOL_VERSION - 1;
        let bytes = encode_frame(&mut header, b"");
        let mut reader = &bytes[..];
        match poll_once(read_request_header(&mut reader, 1024)) {
            Err(error @ FrameError::RequestOfOtherVersion { .. }) => {
                assert_eq!(
                    error.to_string(),
                    format!(
                        "unsupported protocol version {}",
                        crate::PROTOCOL_VERSION - 1
                    )
                );
                let FrameError::RequestOfOtherVersion { request, version } = error else {
                    unreachable!()
                };
                assert_eq!((*request, version), (header, crate::PROTOCOL_VERSION - 1));
            }
            other => panic!("expected RequestOfOtherVersion, got {other:?}"),
        }
        let mut reader = &bytes[..];
        assert!(matches!(
            poll_once(read_header(&mut reader, 1024)),
            Err(FrameError::ProtocolVersion { .. })
        ));
        // Review finding: an oversized request of an older version was answered
        // `MessageTooLarge` in this version, which that client cannot read; its version wins.
        let mut big = Header::new(Command::Request, Operation::SendMessages);
        big.protocol_version = crate::PROTOCOL_VERSION - 1;
        let bytes = encode_frame(&mut big, &[0u8; 2000]);
        let mut reader = &bytes[..];
        assert!(matches!(
            poll_once(read_request_header(&mut reader, 1024)),
            Err(FrameError::RequestOfOtherVersion { .. })
        ));
    }

    #[test]
    fn issue7_4_oversized_request_header_comes_back_with_the_error() {
        let mut header = Header::new(Command::Request, Operation::SendMessages);
        header.request = 9;
        let bytes = encode_frame(&mut header, &[7u8; 1000]);
        let mut reader = &bytes[..];
        match poll_once(read_request_header(&mut reader, 1024)) {
            Err(FrameError::RequestTooLarge { request, size, max }) => {
                assert_eq!((*request, size, max), (header, 1256, 1024));
            }
            other => panic!("expected RequestTooLarge, got {other:?}"),
        }
        // `read_header` keeps reporting the plain size error.
        let mut reader = &bytes[..];
        assert!(matches!(
            poll_once(read_header(&mut reader, 1024)),
            Err(FrameError::SizeTooLarge {
                size: 1256,
                max: 1024
            })
        ));
    }

    #[test]
    fn io_errors_other_than_eof_are_io() {
        struct Failing;
        impl AsyncRead for Failing {
            async fn read<B: compio::buf::IoBufMut>(&mut self, buf: B) -> BufResult<usize, B> {
                BufResult(Err(std::io::ErrorKind::ConnectionReset.into()), buf)
            }
        }
        let result = poll_once(read_frame(&mut Failing, u32::MAX));
        assert!(
            matches!(&result, Err(FrameError::Io(e)) if e.kind() == std::io::ErrorKind::ConnectionReset),
            "{result:?}"
        );
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
            let _ = read_bytes(&bytes, 1024);
        }

        #[test]
        fn encoded_frames_round_trip(
            operation in 1u8..=8,
            command in 1u8..=2,
            request in any::<u64>(),
            namespace in any::<u64>(),
            offset in any::<u64>(),
            count in any::<u32>(),
            body in proptest::collection::vec(any::<u8>(), 0..600),
            cut in any::<prop::sample::Index>(),
        ) {
            let command = Command::from_u8(command).unwrap();
            let mut header = Header::new(command, Operation::from_u8(operation).unwrap());
            header.request = request;
            header.namespace = namespace;
            header.offset = offset;
            header.count = count;
            let bytes = encode_frame(&mut header, &body);
            let frame = read_bytes(&bytes, u32::MAX).unwrap();
            prop_assert_eq!(frame.header, header);
            prop_assert_eq!(&frame.body, &body);

            // Any strict prefix is Closed (empty) or Truncated with the exact counts.
            let cut = cut.index(bytes.len());
            match read_bytes(&bytes[..cut], u32::MAX) {
                Err(FrameError::Closed) => prop_assert_eq!(cut, 0),
                Err(FrameError::Truncated { received, expected }) => {
                    prop_assert_eq!(received, cut);
                    prop_assert_eq!(expected, if cut < HEADER_SIZE { HEADER_SIZE } else { bytes.len() });
                }
                other => prop_assert!(false, "prefix of {} bytes: {:?}", cut, other),
            }
        }
    }
}
