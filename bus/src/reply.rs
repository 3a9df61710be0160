//! Server-side helpers to answer a client Request: the reply header that echoes the request's
//! identity, and a complete encoded error reply. Pure functions: no I/O, and never a reply that
//! names another request than the one it answers.

use crate::command::{Command, ErrorCode};
use crate::frame::encode_frame;
use crate::header::{Header, PROTOCOL_VERSION};
use crate::limits::ERROR_MESSAGE_SIZE_MAX;

/// The header of a reply to `request`: command `Reply`, the same `operation`, `request`,
/// `client`, `namespace` and `cluster`; everything else zero (`error_code` 0 = success).
/// The caller sets `offset`/`count` as the operation needs and seals it with `encode_frame`.
pub fn reply_header(request: &Header) -> Header {
    let mut header: Header = bytemuck::Zeroable::zeroed();
    header.protocol_version = PROTOCOL_VERSION;
    header.command = Command::Reply as u8;
    header.operation = request.operation;
    header.request = request.request;
    header.client = request.client;
    header.namespace = request.namespace;
    header.cluster = request.cluster;
    header
}

/// An encoded error reply to `request` (header + body, checksums set): `error_code` = `code`,
/// body = `message` as UTF-8, cut to at most `ERROR_MESSAGE_SIZE_MAX` bytes at a character
/// boundary. An empty `message` is replaced by `code.message()`.
pub fn error_reply(request: &Header, code: ErrorCode, message: &str) -> Vec<u8> {
    let mut header = reply_header(request);
    header.error_code = code as u32;
    let message = if message.is_empty() {
        code.message()
    } else {
        message
    };
    let mut end = message.len().min(ERROR_MESSAGE_SIZE_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    encode_frame(&mut header, &message.as_bytes()[..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Operation;
    use crate::limits::MESSAGE_SIZE_MAX_DEFAULT;

    fn request() -> Header {
        let mut header = Header::new(Command::Request, Operation::CreateTopic);
        header.request = 42;
        header.client = 0xabcd;
        header.namespace = 0x0000_0001_0002_0000;
        header.cluster = 9;
        header.offset = 77;
        header.count = 3;
        header.view = 5;
        header
    }

    #[test]
    fn reply_header_echoes_identity_only() {
        let reply = reply_header(&request());
        let mut expected = Header::new(Command::Reply, Operation::CreateTopic);
        expected.request = 42;
        expected.client = 0xabcd;
        expected.namespace = 0x0000_0001_0002_0000;
        expected.cluster = 9;
        assert_eq!(reply, expected);
    }

    #[test]
    fn error_reply_is_a_valid_frame_with_code_and_text() {
        let bytes = error_reply(&request(), ErrorCode::TopicAlreadyExists, "topic 2 exists");
        let header: Header = bytemuck::pod_read_unaligned(&bytes[..256]);
        header.validate_prefix(MESSAGE_SIZE_MAX_DEFAULT).unwrap();
        assert_eq!(header.size as usize, bytes.len());
        assert_eq!(header.error_code, 5);
        assert_eq!(header.request, 42);
        assert_eq!(header.command, Command::Reply as u8);
        assert!(header.valid_checksum_body(&bytes[256..]));
        assert_eq!(&bytes[256..], b"topic 2 exists");
    }

    #[test]
    fn error_reply_defaults_and_truncates_the_text() {
        let bytes = error_reply(&request(), ErrorCode::Busy, "");
        assert_eq!(&bytes[256..], b"target shard inbox full, retry");

        let long = "é".repeat(ERROR_MESSAGE_SIZE_MAX); // 2 bytes each
        let bytes = error_reply(&request(), ErrorCode::Internal, &long);
        let body = std::str::from_utf8(&bytes[256..]).unwrap();
        assert_eq!(body.len(), ERROR_MESSAGE_SIZE_MAX);
        let odd = format!("a{long}");
        let bytes = error_reply(&request(), ErrorCode::Internal, &odd);
        let body = std::str::from_utf8(&bytes[256..]).unwrap();
        assert_eq!(body.len(), ERROR_MESSAGE_SIZE_MAX - 1);
    }
}
