//! Server-side helpers to answer a client Request: the reply header that echoes the request's
//! identity, a complete encoded error reply, and the Eviction sent instead of a reply to a client
//! without a session. Pure functions: no I/O, and never an answer that names another request than
//! the one it answers.

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
    encode_frame(&mut header, error_text(code, message))
}

/// The answer to a request whose header verifies but names an older protocol version
/// (1..`PROTOCOL_VERSION`: releases whose header layout and error replies are this one's): an
/// `InvalidArgument` error reply written in the request's own version, so that the older client
/// accepts it and shows its text instead of seeing a closed connection. `None` for a header that
/// is not a request, or names version 0 or a version at or above this release's (a newer client
/// must read this server's version in the message it gets from its own library).
pub fn older_protocol_error_reply(request: &Header) -> Option<Vec<u8>> {
    let version = request.protocol_version;
    if version == 0 || version >= PROTOCOL_VERSION || request.command != Command::Request as u8 {
        return None;
    }
    let mut header = reply_header(request);
    header.protocol_version = version;
    header.error_code = ErrorCode::InvalidArgument as u32;
    let message = format!(
        "this server speaks protocol version {PROTOCOL_VERSION} and this client speaks version \
         {version}: upgrade the client to the server's release (README, \"Upgrading and \
         downgrading\"); nothing was applied and the server closes the connection"
    );
    Some(encode_frame(
        &mut header,
        error_text(ErrorCode::InvalidArgument, &message),
    ))
}

/// `error_reply` for a request about an existing partition: the header also carries the
/// partition's `next_offset` and `first_offset` as of the refusal, as every send and poll reply
/// does.
pub fn partition_error_reply(
    request: &Header,
    code: ErrorCode,
    message: &str,
    next_offset: u64,
    first_offset: u64,
) -> Vec<u8> {
    let mut header = reply_header(request);
    header.error_code = code as u32;
    header.next_offset = next_offset;
    header.first_offset = first_offset;
    encode_frame(&mut header, error_text(code, message))
}

/// An encoded Eviction answering `request` (header + body, checksums set), sent instead of a
/// reply to a session-tracked request whose client has no session: command `Eviction`, the same
/// `operation`, `request`, `client`, `namespace` and `cluster` as `reply_header`, `error_code` =
/// `SessionEvicted`, body = `reason` as UTF-8, cut to at most `ERROR_MESSAGE_SIZE_MAX` bytes at a
/// character boundary. An empty `reason` is replaced by `SessionEvicted.message()`.
pub fn eviction(request: &Header, reason: &str) -> Vec<u8> {
    let mut header = reply_header(request);
    header.command = Command::Eviction as u8;
    header.error_code = ErrorCode::SessionEvicted as u32;
    encode_frame(&mut header, error_text(ErrorCode::SessionEvicted, reason))
}

/// An encoded `NotPrimary` error reply to `request` (issue 8 section 2): `error_code` =
/// `NotPrimary`, `view` = the answering replica's view, `replica` = that view's primary
/// (`view % replica_count`), body = the primary's client address as UTF-8 (`host:port`), or
/// empty while a view change is under way or the address is not known yet. Nothing was applied;
/// `Client` follows it.
pub fn not_primary(
    request: &Header,
    view: u32,
    primary: u8,
    primary_addr: Option<&str>,
) -> Vec<u8> {
    let mut header = reply_header(request);
    header.error_code = ErrorCode::NotPrimary as u32;
    header.view = view;
    header.replica = primary;
    let body = primary_addr.unwrap_or_default().as_bytes();
    let end = body.len().min(ERROR_MESSAGE_SIZE_MAX);
    encode_frame(&mut header, &body[..end])
}

/// `message` (or `code.message()` if empty) cut to `ERROR_MESSAGE_SIZE_MAX` bytes at a character
/// boundary.
fn error_text(code: ErrorCode, message: &str) -> &[u8] {
    let message = if message.is_empty() {
        code.message()
    } else {
        message
    };
    let mut end = message.len().min(ERROR_MESSAGE_SIZE_MAX);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    &message.as_bytes()[..end]
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

    /// Review finding (an older client against this server waited out its retries and printed
    /// only "connection closed"): a request of an older version gets an error reply in that
    /// version, which a reader of that version accepts; newer, zero or non-request headers get
    /// none.
    #[test]
    fn older_protocol_error_reply_is_written_in_the_requests_version() {
        let mut old = request();
        old.protocol_version = PROTOCOL_VERSION - 1;
        let bytes = older_protocol_error_reply(&old).unwrap();
        let mut header: Header = bytemuck::pod_read_unaligned(&bytes[..256]);
        assert_eq!(header.protocol_version, PROTOCOL_VERSION - 1);
        assert_eq!(header.error_code, ErrorCode::InvalidArgument as u32);
        assert_eq!((header.request, header.client), (42, 0xabcd));
        assert!(header.valid_checksum());
        assert!(header.valid_checksum_body(&bytes[256..]));
        assert_eq!(header.size as usize, bytes.len());
        assert_eq!(
            String::from_utf8_lossy(&bytes[256..]),
            format!(
                "this server speaks protocol version {PROTOCOL_VERSION} and this client speaks \
                 version {}: upgrade the client to the server's release (README, \"Upgrading \
                 and downgrading\"); nothing was applied and the server closes the connection",
                PROTOCOL_VERSION - 1
            )
        );
        // Read as this release reads, it is refused only for its version.
        assert!(matches!(
            header.validate_prefix(MESSAGE_SIZE_MAX_DEFAULT),
            Err(crate::FrameError::ProtocolVersion { .. })
        ));
        header.protocol_version = PROTOCOL_VERSION;
        header.set_checksums(&bytes[256..]);
        header.validate_prefix(MESSAGE_SIZE_MAX_DEFAULT).unwrap();
        for version in [0, PROTOCOL_VERSION, PROTOCOL_VERSION + 1] {
            let mut other = request();
            other.protocol_version = version;
            assert_eq!(
                older_protocol_error_reply(&other),
                None,
                "version {version}"
            );
        }
        let mut reply = request();
        reply.protocol_version = PROTOCOL_VERSION - 1;
        reply.command = Command::Reply as u8;
        assert_eq!(older_protocol_error_reply(&reply), None);
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

    #[test]
    fn eviction_echoes_the_request_with_session_evicted_and_reason() {
        let bytes = eviction(&request(), "client table full");
        let header: Header = bytemuck::pod_read_unaligned(&bytes[..256]);
        header.validate_prefix(MESSAGE_SIZE_MAX_DEFAULT).unwrap();
        assert!(header.valid_checksum_body(&bytes[256..]));
        assert_eq!(&bytes[256..], b"client table full");
        let mut expected = reply_header(&request());
        expected.command = Command::Eviction as u8;
        expected.error_code = ErrorCode::SessionEvicted as u32;
        expected.size = header.size;
        expected.checksum_body = header.checksum_body;
        expected.checksum = expected.calculate_checksum();
        assert_eq!(header, expected);
        assert_eq!(header.operation, Operation::CreateTopic as u8);

        let bytes = eviction(&request(), "");
        assert_eq!(&bytes[256..], b"client session evicted; register again");
        let long = "é".repeat(ERROR_MESSAGE_SIZE_MAX);
        let bytes = eviction(&request(), &format!("a{long}"));
        assert_eq!(bytes.len(), 256 + ERROR_MESSAGE_SIZE_MAX - 1);
    }

    #[test]
    fn not_primary_carries_view_primary_and_its_address() {
        let bytes = not_primary(&request(), 7, 1, Some("127.0.0.1:8091"));
        let header: Header = bytemuck::pod_read_unaligned(&bytes[..256]);
        header.validate_prefix(MESSAGE_SIZE_MAX_DEFAULT).unwrap();
        assert!(header.valid_checksum_body(&bytes[256..]));
        assert_eq!(&bytes[256..], b"127.0.0.1:8091");
        let mut expected = reply_header(&request());
        expected.error_code = ErrorCode::NotPrimary as u32;
        expected.view = 7;
        expected.replica = 1;
        expected.size = header.size;
        expected.checksum_body = header.checksum_body;
        expected.checksum = expected.calculate_checksum();
        assert_eq!(header, expected);
        // During a view change: no address, and the body stays empty (no default text).
        let bytes = not_primary(&request(), 8, 2, None);
        assert_eq!(bytes.len(), 256);
    }
}
