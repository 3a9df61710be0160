//! Server-side reply helpers.

use crate::{ErrorCode, Header};

/// A Reply header answering `request` (same operation, request number, client, namespace).
pub fn reply_header(request: &Header) -> Header {
    todo!("{request:?}")
}

/// An encoded error reply frame: `error_code` set, body = UTF-8 message.
pub fn error_reply(request: &Header, code: ErrorCode, message: &str) -> Vec<u8> {
    todo!("{request:?}{code:?}{message}")
}
