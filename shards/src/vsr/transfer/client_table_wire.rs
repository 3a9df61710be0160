//! The client table's transfer encoding (issue 9 section 2, `storage/FORMAT.md` section 11): the
//! `ClientTable` artifact of a state-transfer offer.
//!
//! Layout (all integers little-endian):
//!
//! | bytes      | field           | meaning                                              |
//! |------------|-----------------|------------------------------------------------------|
//! | `0 .. 8`   | `magic`         | `"SLCLITAB"` ([`CLIENT_TABLE_MAGIC`])                |
//! | `8 .. 12`  | `session_count` | `u32`, at most the receiver's `--clients-table-max`  |
//! | `12 ..`    | sessions        | `session_count` sessions, see below                  |
//! | last 8     | trailer         | XXH3-64 of every byte before it                      |
//!
//! Session (48 bytes + its replies): `client` `u128` (non-zero, unique), `session` `u64`,
//! `request` `u64`, `commit_op` `u64`, `reply_count` `u8` (at most
//! [`REPLY_RING_LEN_MAX`]), 7 zero bytes, then `reply_count` replies.
//!
//! Reply (37 bytes + body): `request` `u64`, `operation` `u8`, `error_code` `u32`, `offset`
//! `u64`, `count` `u32`, `request_checksum` `u64`, `body_len` `u32` (at most
//! [`REPLY_BODY_LEN_MAX`]), then `body_len` body bytes.
//!
//! Decode checks the trailer first, then reads with the shared [`Reader`]. It enforces the wire
//! rules only; the session rules a live table keeps (increasing reply request numbers, unique
//! commit ops) are checked by `ClientTable::from_snapshot` when the table is installed.

use std::collections::BTreeSet;

use storage::codec::{
    DecodeError, NonZeroByte, Reader, TRAILER_SIZE, Writer, split_verified_trailer,
};

use crate::limits::REPLY_RING_LEN_MAX;
use crate::vsr::client_table::{CachedReply, ClientTableSnapshot, SessionSnapshot};

/// The first 8 bytes of the encoding.
pub const CLIENT_TABLE_MAGIC: [u8; 8] = *b"SLCLITAB";
/// Bytes before the first session: magic and session count.
pub const CLIENT_TABLE_HEADER_SIZE: usize = 12;
/// Bytes of a session before its replies: client, session, request, commit op, reply count,
/// padding.
pub const SESSION_FIXED_SIZE: usize = 48;
/// Bytes of a reply before its body: request, operation, error code, offset, count, request
/// checksum, body length.
pub const REPLY_FIXED_SIZE: usize = 37;
/// Zero bytes after a session's reply count.
const SESSION_PADDING_SIZE: usize = 7;
/// Longest reply body the server caches (bytes). A cached body is either empty (an applied
/// change, `vsr::apply::change_reply`) or a rejection's message (`vsr::apply::rejection_reply`),
/// which quotes at most one name of at most `bus::limits::NAME_LEN_MAX` (255) bytes, escaped at
/// most 4x, so it stays far below the error-reply bound `bus::limits::ERROR_MESSAGE_SIZE_MAX`
/// (4096), the most of it a client is ever sent. A longer body is hostile or damaged.
pub const REPLY_BODY_LEN_MAX: usize = bus::limits::ERROR_MESSAGE_SIZE_MAX;

const _: () = assert!(SESSION_FIXED_SIZE == 16 + 8 + 8 + 8 + 1 + SESSION_PADDING_SIZE);
const _: () = assert!(REPLY_FIXED_SIZE == 8 + 1 + 4 + 8 + 4 + 8 + 4);
const _: () = assert!(REPLY_RING_LEN_MAX <= u8::MAX as usize);
const _: () = assert!(REPLY_BODY_LEN_MAX <= u32::MAX as usize);

/// Why a client-table artifact was refused (or could not be encoded). Decode variants mean a
/// damaged or hostile artifact: the receiver drops the transfer and starts over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientTableWireError {
    /// Trailer mismatch, no trailer, truncated input or trailing bytes.
    #[error("client table: {0}")]
    Decode(#[from] DecodeError),
    #[error("client table: magic {found:?} is not {CLIENT_TABLE_MAGIC:?}")]
    Magic { found: [u8; 8] },
    #[error(
        "client table: {count} sessions, above this replica's --clients-table-max {clients_max}"
    )]
    TooManySessions { count: u64, clients_max: usize },
    #[error("client table: session {index} has the reserved client id 0")]
    ClientIdZero { index: usize },
    /// Encode only: a snapshot's client id is not a `0x`-prefixed u128.
    #[error("client table: client id {client:?} is not a 0x-prefixed u128")]
    ClientIdUnparsable { client: String },
    #[error("client table: client {client:#034x} appears twice")]
    DuplicateClient { client: u128 },
    #[error(
        "client table: client {client:#034x} caches {count} replies, above the ring length \
         {REPLY_RING_LEN_MAX}"
    )]
    ReplyRingTooLong { client: u128, count: usize },
    #[error(
        "client table: client {client:#034x} reply to request {request} has a {len}-byte body, \
         above {REPLY_BODY_LEN_MAX}"
    )]
    ReplyBodyTooLong {
        client: u128,
        request: u64,
        len: usize,
    },
    #[error("client table: padding byte at {position} is {value:#04x}, must be zero")]
    NonZeroPadding { position: usize, value: u8 },
}

impl ClientTableWireError {
    /// The byte position in the encoding the error points at, when one field is to blame.
    pub fn position(&self) -> Option<usize> {
        match self {
            ClientTableWireError::Decode(error) => Some(error.position()),
            ClientTableWireError::Magic { .. } => Some(0),
            ClientTableWireError::TooManySessions { .. } => Some(8),
            ClientTableWireError::NonZeroPadding { position, .. } => Some(*position),
            ClientTableWireError::ClientIdZero { .. }
            | ClientTableWireError::ClientIdUnparsable { .. }
            | ClientTableWireError::DuplicateClient { .. }
            | ClientTableWireError::ReplyRingTooLong { .. }
            | ClientTableWireError::ReplyBodyTooLong { .. } => None,
        }
    }
}

/// Longest encoding of a table of `clients_max` sessions with full reply rings of the longest
/// bodies (bytes): an exact upper bound, reached by such a table. Saturates at `u64::MAX`.
pub fn encoded_len_max(clients_max: usize) -> u64 {
    let reply_max = (REPLY_FIXED_SIZE + REPLY_BODY_LEN_MAX) as u64;
    let session_max = SESSION_FIXED_SIZE as u64 + REPLY_RING_LEN_MAX as u64 * reply_max;
    (clients_max as u64)
        .saturating_mul(session_max)
        .saturating_add((CLIENT_TABLE_HEADER_SIZE + TRAILER_SIZE) as u64)
}

/// Encodes `table` (magic, count, sessions, trailer; see the module doc), sessions in the
/// snapshot's order.
///
/// # Errors
/// The rules decode enforces that do not depend on the receiver: `ClientIdUnparsable`,
/// `ClientIdZero`, `DuplicateClient`, `ReplyRingTooLong`, `ReplyBodyTooLong`; `TooManySessions`
/// above `u32::MAX` sessions.
pub fn encode(table: &ClientTableSnapshot) -> Result<Vec<u8>, ClientTableWireError> {
    let count =
        u32::try_from(table.sessions.len()).map_err(|_| ClientTableWireError::TooManySessions {
            count: table.sessions.len() as u64,
            clients_max: u32::MAX as usize,
        })?;
    let mut writer = Writer::default();
    writer.bytes(&CLIENT_TABLE_MAGIC).u32(count);
    let mut seen = BTreeSet::new();
    for (index, session) in table.sessions.iter().enumerate() {
        let client = parse_client_id(&session.client)?;
        check_client(&mut seen, index, client)?;
        check_ring_len(client, session.replies.len())?;
        write_session(&mut writer, client, session)?;
    }
    Ok(writer.seal())
}

/// The u128 of a snapshot's `0x`-hex client id.
fn parse_client_id(client: &str) -> Result<u128, ClientTableWireError> {
    client
        .strip_prefix("0x")
        .and_then(|hex| u128::from_str_radix(hex, 16).ok())
        .ok_or_else(|| ClientTableWireError::ClientIdUnparsable {
            client: client.to_owned(),
        })
}

/// Client id `client` of session `index` is non-zero and not in `seen`; adds it.
fn check_client(
    seen: &mut BTreeSet<u128>,
    index: usize,
    client: u128,
) -> Result<(), ClientTableWireError> {
    if client == 0 {
        return Err(ClientTableWireError::ClientIdZero { index });
    }
    if !seen.insert(client) {
        return Err(ClientTableWireError::DuplicateClient { client });
    }
    Ok(())
}

fn check_ring_len(client: u128, count: usize) -> Result<(), ClientTableWireError> {
    if count > REPLY_RING_LEN_MAX {
        return Err(ClientTableWireError::ReplyRingTooLong { client, count });
    }
    Ok(())
}

fn check_body_len(client: u128, request: u64, len: usize) -> Result<(), ClientTableWireError> {
    if len > REPLY_BODY_LEN_MAX {
        return Err(ClientTableWireError::ReplyBodyTooLong {
            client,
            request,
            len,
        });
    }
    Ok(())
}

/// Writes one session and its replies; the ring length was checked.
fn write_session(
    writer: &mut Writer,
    client: u128,
    session: &SessionSnapshot,
) -> Result<(), ClientTableWireError> {
    writer
        .u128(client)
        .u64(session.session)
        .u64(session.request)
        .u64(session.commit_op)
        .u8(session.replies.len() as u8)
        .zeros(SESSION_PADDING_SIZE);
    for reply in &session.replies {
        check_body_len(client, reply.request, reply.body.len())?;
        writer
            .u64(reply.request)
            .u8(reply.operation)
            .u32(reply.error_code)
            .u64(reply.offset)
            .u32(reply.count)
            .u64(reply.request_checksum)
            .u32(reply.body.len() as u32)
            .bytes(&reply.body);
    }
    Ok(())
}

/// Decodes and checks a client table for a receiver holding at most `clients_max` sessions
/// (its live `--clients-table-max`): the trailer first, then magic, count, every session.
///
/// # Errors
/// The first rule the bytes break (see [`ClientTableWireError`]). Never panics.
pub fn decode(
    bytes: &[u8],
    clients_max: usize,
) -> Result<ClientTableSnapshot, ClientTableWireError> {
    let (body, _) = split_verified_trailer(bytes)?;
    let mut reader = Reader::new(body);
    let found = reader.array::<8>("magic")?;
    if found != CLIENT_TABLE_MAGIC {
        return Err(ClientTableWireError::Magic { found });
    }
    let count = reader.u32("session_count")?;
    if u64::from(count) > clients_max as u64 {
        return Err(ClientTableWireError::TooManySessions {
            count: u64::from(count),
            clients_max,
        });
    }
    // Every session takes at least SESSION_FIXED_SIZE bytes: never reserve more than fits.
    let capacity = (count as usize).min(reader.remaining() / SESSION_FIXED_SIZE);
    let mut sessions = Vec::with_capacity(capacity);
    let mut seen = BTreeSet::new();
    for index in 0..count as usize {
        sessions.push(read_session(&mut reader, &mut seen, index)?);
    }
    reader.finish()?;
    Ok(ClientTableSnapshot { sessions })
}

fn read_session(
    reader: &mut Reader<'_>,
    seen: &mut BTreeSet<u128>,
    index: usize,
) -> Result<SessionSnapshot, ClientTableWireError> {
    let client = reader.u128("client")?;
    check_client(seen, index, client)?;
    let session = reader.u64("session")?;
    let request = reader.u64("request")?;
    let commit_op = reader.u64("commit_op")?;
    let reply_count = usize::from(reader.u8("reply_count")?);
    check_ring_len(client, reply_count)?;
    read_padding(reader)?;
    let mut replies = Vec::with_capacity(reply_count);
    for _ in 0..reply_count {
        replies.push(read_reply(reader, client)?);
    }
    Ok(SessionSnapshot {
        client: format!("{client:#034x}"),
        session,
        request,
        commit_op,
        replies,
    })
}

fn read_padding(reader: &mut Reader<'_>) -> Result<(), ClientTableWireError> {
    match reader.zeros("session padding", SESSION_PADDING_SIZE)? {
        None => Ok(()),
        Some(NonZeroByte { position, value }) => {
            Err(ClientTableWireError::NonZeroPadding { position, value })
        }
    }
}

fn read_reply(reader: &mut Reader<'_>, client: u128) -> Result<CachedReply, ClientTableWireError> {
    let request = reader.u64("reply request")?;
    let operation = reader.u8("reply operation")?;
    let error_code = reader.u32("reply error_code")?;
    let offset = reader.u64("reply offset")?;
    let count = reader.u32("reply count")?;
    let request_checksum = reader.u64("reply request_checksum")?;
    let body_len = reader.u32("reply body_len")? as usize;
    check_body_len(client, request, body_len)?;
    let body = reader.bytes("reply body", body_len)?.to_vec();
    Ok(CachedReply {
        request,
        operation,
        error_code,
        offset,
        count,
        body,
        request_checksum,
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;
    use storage::codec::seal;

    use super::*;
    use crate::metadata::{MetadataOp, MetadataState};

    fn reply(request: u64, body_len: usize) -> CachedReply {
        CachedReply {
            request,
            operation: 2,
            error_code: 7,
            offset: 11,
            count: 3,
            body: vec![b'x'; body_len],
            request_checksum: 0xfeed,
        }
    }

    fn session(client: u128, replies: Vec<CachedReply>) -> SessionSnapshot {
        SessionSnapshot {
            client: format!("{client:#034x}"),
            session: 5,
            request: replies.last().map_or(0, |r| r.request),
            commit_op: 9,
            replies,
        }
    }

    fn table(sessions: Vec<SessionSnapshot>) -> ClientTableSnapshot {
        ClientTableSnapshot { sessions }
    }

    fn sample() -> ClientTableSnapshot {
        table(vec![
            session(1, vec![reply(1, 0), reply(2, 5)]),
            session(u128::MAX, Vec::new()),
        ])
    }

    /// Re-seals `bytes` after `edit` changed its body, so the rule under test (not the trailer)
    /// is what refuses it.
    fn edited(bytes: &[u8], edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let (body, _) = split_verified_trailer(bytes).expect("sealed");
        let mut body = body.to_vec();
        edit(&mut body);
        seal(&mut body);
        body
    }

    /// Byte position of session 1 in the encoding of [`sample`].
    const SECOND_SESSION: usize =
        CLIENT_TABLE_HEADER_SIZE + SESSION_FIXED_SIZE + 2 * REPLY_FIXED_SIZE + 5;

    #[test]
    fn round_trip_and_layout() {
        let bytes = encode(&sample()).expect("encodes");
        assert_eq!(&bytes[..8], b"SLCLITAB");
        assert_eq!(&bytes[8..12], &2u32.to_le_bytes());
        assert_eq!(&bytes[12..28], &1u128.to_le_bytes());
        assert_eq!(bytes[12 + 40], 2, "reply count");
        assert_eq!(
            bytes.len(),
            SECOND_SESSION + SESSION_FIXED_SIZE + TRAILER_SIZE
        );
        assert_eq!(decode(&bytes, 2), Ok(sample()));
    }

    #[test]
    fn issue9_client_table_trailer_checked_first() {
        let mut bytes = encode(&sample()).expect("encodes");
        bytes[0] ^= 1;
        assert!(matches!(
            decode(&bytes, 2),
            Err(ClientTableWireError::Decode(
                DecodeError::TrailerMismatch { .. }
            ))
        ));
    }

    #[test]
    fn issue9_client_table_refuses_bad_magic() {
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| body[7] = b'!');
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::Magic {
                found: *b"SLCLITA!"
            })
        );
    }

    #[test]
    fn issue9_client_table_refuses_duplicate_client_ids() {
        let duplicated = table(vec![session(4, Vec::new()), session(4, Vec::new())]);
        assert_eq!(
            encode(&duplicated),
            Err(ClientTableWireError::DuplicateClient { client: 4 })
        );
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body[SECOND_SESSION..SECOND_SESSION + 16].copy_from_slice(&1u128.to_le_bytes());
        });
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::DuplicateClient { client: 1 })
        );
    }

    #[test]
    fn issue9_client_table_refuses_client_id_zero_or_unparsable() {
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body[SECOND_SESSION..SECOND_SESSION + 16].copy_from_slice(&0u128.to_le_bytes());
        });
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::ClientIdZero { index: 1 })
        );
        let mut unparsable = sample();
        unparsable.sessions[0].client = "12".to_owned();
        assert_eq!(
            encode(&unparsable),
            Err(ClientTableWireError::ClientIdUnparsable {
                client: "12".to_owned()
            })
        );
    }

    #[test]
    fn issue9_client_table_refuses_reply_ring_over_capacity() {
        let ring = (1..=REPLY_RING_LEN_MAX as u64 + 1)
            .map(|r| reply(r, 0))
            .collect();
        assert_eq!(
            encode(&table(vec![session(3, ring)])),
            Err(ClientTableWireError::ReplyRingTooLong {
                client: 3,
                count: REPLY_RING_LEN_MAX + 1
            })
        );
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body[SECOND_SESSION + 40] = REPLY_RING_LEN_MAX as u8 + 1;
        });
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::ReplyRingTooLong {
                client: u128::MAX,
                count: REPLY_RING_LEN_MAX + 1
            })
        );
    }

    #[test]
    fn issue9_client_table_refuses_more_sessions_than_clients_max() {
        let bytes = encode(&sample()).expect("encodes");
        assert_eq!(
            decode(&bytes, 1),
            Err(ClientTableWireError::TooManySessions {
                count: 2,
                clients_max: 1
            })
        );
        // A huge announced count is refused before any session is read or reserved.
        let huge = edited(&bytes, |body| {
            body[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        });
        assert!(matches!(
            decode(&huge, 1 << 20),
            Err(ClientTableWireError::TooManySessions { .. })
        ));
    }

    #[test]
    fn issue9_client_table_refuses_reply_body_over_cache_bound() {
        let long = table(vec![session(3, vec![reply(1, REPLY_BODY_LEN_MAX + 1)])]);
        assert_eq!(
            encode(&long),
            Err(ClientTableWireError::ReplyBodyTooLong {
                client: 3,
                request: 1,
                len: REPLY_BODY_LEN_MAX + 1
            })
        );
        let body_len_at = CLIENT_TABLE_HEADER_SIZE + SESSION_FIXED_SIZE + REPLY_FIXED_SIZE - 4;
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body[body_len_at..body_len_at + 4]
                .copy_from_slice(&(REPLY_BODY_LEN_MAX as u32 + 1).to_le_bytes());
        });
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::ReplyBodyTooLong {
                client: 1,
                request: 1,
                len: REPLY_BODY_LEN_MAX + 1
            })
        );
    }

    #[test]
    fn issue9_client_table_refuses_nonzero_padding() {
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body[12 + 41] = 1;
        });
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::NonZeroPadding {
                position: 53,
                value: 1
            })
        );
    }

    #[test]
    fn issue9_client_table_refuses_truncated() {
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| {
            body.truncate(body.len() - 1);
        });
        assert!(matches!(
            decode(&bytes, 2),
            Err(ClientTableWireError::Decode(DecodeError::Truncated {
                field: "session padding",
                ..
            }))
        ));
    }

    #[test]
    fn issue9_client_table_refuses_trailing_bytes() {
        let bytes = edited(&encode(&sample()).expect("encodes"), |body| body.push(0));
        assert_eq!(
            decode(&bytes, 2),
            Err(ClientTableWireError::Decode(DecodeError::TrailingBytes {
                position: SECOND_SESSION + SESSION_FIXED_SIZE,
                count: 1
            }))
        );
    }

    #[test]
    fn issue9_client_table_encoded_len_max_is_exact() {
        let full_ring = |client: u128| {
            let ring = (1..=REPLY_RING_LEN_MAX as u64)
                .map(|r| reply(r, REPLY_BODY_LEN_MAX))
                .collect();
            session(client, ring)
        };
        let full = table((1..=3).map(full_ring).collect());
        let bytes = encode(&full).expect("encodes");
        assert_eq!(bytes.len() as u64, encoded_len_max(3));
        assert_eq!(decode(&bytes, 3), Ok(full));
        assert_eq!(encoded_len_max(0), 20, "an empty table: header and trailer");
    }

    #[test]
    fn issue9_longest_rejection_message_fits_reply_body_bound() {
        // A 255-byte name of non-printable 2-byte chars (escaped as `\u{378}`) plus a control
        // char: the rejection quotes it Debug-escaped, the longest message apply can cache.
        let name = format!("{}\u{1}", "\u{378}".repeat(127));
        assert_eq!(name.len(), bus::limits::NAME_LEN_MAX);
        let op = MetadataOp::CreateStream { stream_id: 1, name };
        let rejection = MetadataState::new()
            .validate(&op)
            .expect_err("control char");
        assert!(rejection.message.len() > 2 * bus::limits::NAME_LEN_MAX);
        assert!(rejection.message.len() <= REPLY_BODY_LEN_MAX);
    }

    fn arb_reply() -> impl Strategy<Value = CachedReply> {
        (
            any::<(u64, u8, u32, u64, u32, u64)>(),
            proptest::collection::vec(any::<u8>(), 0..40),
        )
            .prop_map(
                |((request, operation, error_code, offset, count, checksum), body)| CachedReply {
                    request,
                    operation,
                    error_code,
                    offset,
                    count,
                    body,
                    request_checksum: checksum,
                },
            )
    }

    fn arb_table() -> impl Strategy<Value = ClientTableSnapshot> {
        let session = (
            any::<(u64, u64, u64)>(),
            proptest::collection::vec(arb_reply(), 0..=REPLY_RING_LEN_MAX),
        );
        (
            proptest::collection::btree_set(1u128.., 0..6),
            proptest::collection::vec(session, 6),
        )
            .prop_map(|(clients, sessions)| {
                let sessions = clients
                    .into_iter()
                    .zip(sessions)
                    .map(
                        |(client, ((session, request, commit_op), replies))| SessionSnapshot {
                            client: format!("{client:#034x}"),
                            session,
                            request,
                            commit_op,
                            replies,
                        },
                    )
                    .collect();
                ClientTableSnapshot { sessions }
            })
    }

    proptest! {
        #![proptest_config(crate::vsr::wire::proptest_config())]

        #[test]
        fn issue9_client_table_round_trips(table in arb_table()) {
            let bytes = encode(&table).expect("valid table encodes");
            prop_assert!(bytes.len() as u64 <= encoded_len_max(table.sessions.len()));
            prop_assert_eq!(decode(&bytes, 6), Ok(table));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = decode(&bytes, 4);
            let mut sealed = bytes;
            seal(&mut sealed);
            let _ = decode(&sealed, 4);
        }
    }
}
