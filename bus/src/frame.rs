//! Framing over a byte stream: read and validate `[header][body]`, encode with checksums.

use crate::header::Header;

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
    #[error("unknown command {command}")]
    UnknownCommand { command: u8 },
    #[error("unknown operation {operation}")]
    UnknownOperation { operation: u8 },
    #[error("unsupported protocol version {version}")]
    ProtocolVersion { version: u16 },
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// Reads one frame; `body_buffer` is reused (owned-buffer I/O).
///
/// # Errors
/// Any `FrameError`; `Closed` only for a clean EOF before the first header byte.
///
/// # Cancel safety
/// Not cancel safe: a dropped read loses partial bytes; the connection must then be closed.
pub async fn read_frame<R: compio::io::AsyncRead>(
    reader: &mut R,
    max_message_size: u32,
) -> Result<Frame, FrameError> {
    todo!("{}{max_message_size}", std::mem::size_of_val(reader))
}

/// Sets `size`, `checksum_body` and `checksum` in `header` and returns header+body bytes.
pub fn encode_frame(header: &mut Header, body: &[u8]) -> Vec<u8> {
    todo!("{header:?}{}", body.len())
}
