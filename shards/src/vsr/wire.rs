//! The replica bus codec: [`Message`] to and from a 256-byte checksummed `bus` [`Header`] plus a
//! body, exactly like client frames (issue 8 section 2, DESIGN section 5). Pure: no I/O, no
//! clock; the driver reads and writes the bytes.
//!
//! A replica frame is `[header: 256 bytes][body: size - 256 bytes]`. Common header fields:
//! `checksum` and `checksum_body` (set by [`Header::set_checksums`]), `cluster` (the cluster id),
//! `size`, `view` (the message's view, [`Message::view`]), `protocol_version`, `command` (a
//! replica-bus [`Command`], 4..=17) and `replica` (the sender's index). Every other field is zero
//! unless the table below gives it a meaning; decoding ignores the fields a command does not use.
//!
//! | command          | `offset` (96..104) | `next_offset` (120..128) | `count` (104..108) | `reserved[0..16]` (176..192) | body |
//! |------------------|--------------------|--------------------------|--------------------|------------------------------|------|
//! | Prepare          | op                 | commit                   |                    |                              | one journal record |
//! | PrepareOk        | op                 |                          |                    | checksum                     | empty |
//! | Commit           |                    | commit                   |                    | commit_checksum              | empty |
//! | StartViewChange  |                    |                          |                    |                              | empty |
//! | DoViewChange     | op                 | commit                   | log_view           |                              | record list |
//! | StartView        | op                 | commit                   |                    |                              | record list |
//! | RequestPrepare   | op                 |                          |                    | checksum                     | empty |
//! | RequestHeaders   | op_min             | op_max                   |                    |                              | empty |
//! | Headers          |                    |                          |                    |                              | header list |
//! | Hello            | addresses_checksum |                          |                    |                              | client address |
//!
//! u128 values in `reserved[0..16]` are little-endian like every other field.
//!
//! State transfer (issue 9 section 1, DESIGN section 10):
//!
//! | command              | `request` (80..88) | `operation` (60) | `offset` (96..104) | `count` (104..108) | `error_code` (108..112) | `next_offset` (120..128) | body |
//! |----------------------|--------------------|------------------|--------------------|--------------------|-------------------------|--------------------------|------|
//! | RequestStateTransfer | nonce              |                  |                    |                    |                         |                          | none: header only |
//! | StateTransferTarget  | nonce              |                  |                    | available (0 or 1) | reason (available = 0)  | checkpoint_op (available = 1) | none if available = 0; the manifest if 1 |
//! | RequestStateChunk    | nonce              | artifact         | offset             | len (at least 1)   |                         |                          | none: header only |
//! | StateChunk           | nonce              | artifact         | offset             |                    |                         |                          | payload (at least 1 byte) |
//!
//! `artifact` is an [`ArtifactKind`] wire value (unknown ones refuse); `reason` an
//! [`UnavailableReason`] wire value (one this build does not know reads as `Unknown`). A
//! header-only command (and a bare refusal, `available = 0`) with any body is refused as
//! `InvalidSize`; a chunk request for 0 bytes, an `available` other than 0 or 1 and an empty
//! chunk are refused. The manifest is decoded by [`manifest::decode`] with the absolute caps
//! `ManifestCaps::for_receiver(CLIENTS_TABLE_MAX_LIMIT)`; the receiver re-checks it against its
//! own live caps ([`ManifestCaps::check`]). A chunk's payload is at most
//! [`STATE_CHUNK_PAYLOAD_MAX`] bytes, what fits one frame.
//!
//! A Hello's `addresses_checksum` is [`addresses_checksum`] of the sender's configured replica
//! address list: XXH3-64 (seed 0) of the canonical `--addresses` text, each address formatted
//! as `SocketAddr`'s `Display` and comma-joined in index order (`127.0.0.1:7101,127.0.0.1:7102`).
//! The receiver refuses a Hello whose list checksum differs from its own (`replica_bus`): two
//! replicas that disagree on who is at which index cannot form a working cluster.
//!
//! Bodies:
//! - *journal record*: the prepare exactly as the journal stores it (`storage/FORMAT.md`
//!   section 8): the 64-byte `JournalHeader::for_prepare` encoding, then the `PrepareBody` JSON.
//!   The receiver verifies it with `storage::journal::record::parse_record` (header checksum,
//!   reserved bytes, size bound, body checksum), checks that its op, view and commit equal the
//!   bus header's, and that the body decodes as a `PrepareBody`. The record's checksum is the
//!   prepare's identity, so a prepare is checksummed end to end from the primary's encoder to
//!   every backup's journal.
//! - *record list*: a u32 count (at most [`PREPARES_COUNT_MAX`]) then that many journal records
//!   back to back, each verified like a Prepare's (its op, view and commit are its own).
//! - *header list*: a u32 count (at most [`HEADERS_COUNT_MAX`]) then that many
//!   [`HEADER_ENTRY_SIZE`]-byte entries: op u64, view u32, 4 zero bytes, commit u64, checksum
//!   u128, parent u128 (all little-endian).
//! - *client address*: the sender's client address (`host:port`) as UTF-8, at most
//!   [`HELLO_ADDRESS_BYTES_MAX`] bytes (empty if it has none to announce).
//! - *manifest*: `storage/FORMAT.md` section 11 ([`manifest`]).
//! - *payload*: bytes `offset .. offset + len` of the artifact, as they are.
//!
//! A whole frame is at most [`REPLICA_MESSAGE_SIZE_MAX`] bytes. Decoding checks, in order: 256
//! header bytes present, header checksum, `size` within `[256, REPLICA_MESSAGE_SIZE_MAX]`,
//! protocol version, command (known, and a replica-bus one), cluster, sender index, then the
//! body (length, checksum, contents). It never panics on any input and never trusts a field of a
//! header whose checksum failed. It does not check the prepare chain (a parent checksum against
//! the journal): that needs the receiver's log, and the core does it.

use bus::{Command, HEADER_SIZE, Header, PROTOCOL_VERSION};
use storage::journal::{JOURNAL_HEADER_SIZE, JournalHeader, Prepare, parse_record};

use super::message::{Message, PrepareHeader, ReplicaIndex};
use super::prepare::PrepareBody;
use super::transfer::manifest::{self, ManifestCaps, ManifestError};
use super::transfer::{ArtifactKind, TransferTarget, UnavailableReason};
use crate::limits::{CLIENTS_TABLE_MAX_LIMIT, PIPELINE_PREPARE_MAX, REPLICA_MESSAGE_SIZE_MAX};

/// Most prepares a DoViewChange or StartView carries: the pipeline's worth (the uncommitted
/// prepares a view change can have to carry, `PIPELINE_PREPARE_MAX`).
pub const PREPARES_COUNT_MAX: usize = PIPELINE_PREPARE_MAX;
/// Most entries one Headers message carries (56 KiB of entries); a repair asks for larger ranges
/// in several requests.
pub const HEADERS_COUNT_MAX: usize = 1024;
/// Bytes of one Headers entry.
pub const HEADER_ENTRY_SIZE: usize = 56;
/// Longest client address a Hello carries (bytes of UTF-8): a host name is at most 253 bytes,
/// plus `:` and a port.
pub const HELLO_ADDRESS_BYTES_MAX: usize = 260;

/// Largest payload of one StateChunk (bytes): a whole frame is at most
/// [`REPLICA_MESSAGE_SIZE_MAX`], header included.
pub const STATE_CHUNK_PAYLOAD_MAX: usize = REPLICA_MESSAGE_SIZE_MAX as usize - HEADER_SIZE;

const _: () = assert!(
    HEADER_SIZE + manifest::MANIFEST_ENCODED_LEN_MAX <= REPLICA_MESSAGE_SIZE_MAX as usize,
    "the largest offer fits one frame"
);

/// Bytes of a list's count prefix.
const LIST_COUNT_SIZE: usize = 4;
/// Where the u128 of PrepareOk, Commit and RequestPrepare lives in `Header::reserved`.
const RESERVED_U128: std::ops::Range<usize> = 0..16;

/// Why a replica frame was refused. Every variant means "drop the frame, log it, keep the link
/// or close it": none is the receiver's fault, and none changes the receiver's state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    #[error("frame of {len} bytes is shorter than the {HEADER_SIZE}-byte header")]
    TruncatedHeader { len: usize },
    #[error("header checksum does not match: the header is corrupt, no field is trusted")]
    HeaderChecksum,
    #[error("header size {size} is outside [{HEADER_SIZE}, {max}] bytes")]
    SizeOutOfRange { size: u32, max: u32 },
    #[error("header size {size} but the frame holds {actual} bytes")]
    SizeMismatch { size: u32, actual: usize },
    #[error("protocol version {version}, this build speaks {PROTOCOL_VERSION}")]
    ProtocolVersion { version: u16 },
    #[error("unknown command {command}")]
    UnknownCommand { command: u8 },
    #[error("command {command:?} is not expected here (a replica link carries {expected})")]
    UnexpectedCommand {
        command: Command,
        expected: &'static str,
    },
    #[error("cluster {cluster:#034x}, this replica belongs to cluster {expected:#034x}")]
    WrongCluster { cluster: u128, expected: u128 },
    #[error("sender replica index {replica} is not below the replica count {replica_count}")]
    ReplicaOutOfRange { replica: u8, replica_count: u8 },
    #[error("body checksum does not match the header's")]
    BodyChecksum,
    #[error("{what}: needs {needed} more bytes, the body has {remaining} left")]
    BodyTruncated {
        what: &'static str,
        needed: usize,
        remaining: usize,
    },
    #[error("{count} bytes after the end of the {command:?} body")]
    TrailingBody { command: Command, count: usize },
    #[error("prepare record {index} does not verify: {reason}")]
    PrepareRecord { index: usize, reason: String },
    #[error("prepare record {index}: {field} is {record} but the header says {header}")]
    PrepareMismatch {
        index: usize,
        field: &'static str,
        record: u64,
        header: u64,
    },
    #[error("prepare record {index} body is not a prepare body: {reason}")]
    NotPrepareBody { index: usize, reason: String },
    #[error("{what}: {count} entries, at most {max}")]
    TooManyEntries {
        what: &'static str,
        count: u64,
        max: usize,
    },
    #[error("headers entry {index}: padding bytes are not zero")]
    HeaderEntryPadding { index: usize },
    #[error("hello address: {reason}")]
    HelloAddress { reason: String },
    /// A header-only command (or a bare refusal) with a body (issue 9 section 1).
    #[error("{command:?} frame of {size} bytes, must be header only ({expected} bytes)")]
    InvalidSize {
        command: Command,
        size: u32,
        expected: u32,
    },
    #[error("state chunk request for 0 bytes")]
    ZeroLengthChunkRequest,
    #[error("{command:?}: unknown artifact kind {artifact}")]
    UnknownArtifact { command: Command, artifact: u8 },
    #[error("state transfer target: available is {available}, must be 0 or 1")]
    InvalidAvailability { available: u32 },
    #[error("state chunk with an empty payload")]
    EmptyChunk,
    #[error("state transfer target: {0}")]
    Manifest(#[from] ManifestError),
}

/// Encodes `message` from replica `from` of `cluster` as one frame (header + body), at most
/// [`REPLICA_MESSAGE_SIZE_MAX`] bytes.
///
/// # Panics
/// A caller bug the core never commits: more than [`PREPARES_COUNT_MAX`] prepares or
/// [`HEADERS_COUNT_MAX`] headers, a prepare body over `storage::limits::JOURNAL_BODY_SIZE_MAX`,
/// a manifest of more than `MANIFEST_ENTRY_COUNT_MAX` entries, or a chunk payload over
/// [`STATE_CHUNK_PAYLOAD_MAX`].
pub fn encode(cluster: u128, from: ReplicaIndex, message: &Message) -> Vec<u8> {
    let mut header = replica_header(command_of(message), cluster, from);
    header.view = message.view();
    // The body is written straight after room for the header, and the header sealed into that
    // room: a chunk's payload is copied once into the frame, not into a body and then a frame.
    let mut body = vec![0u8; HEADER_SIZE];
    match message {
        Message::Prepare { prepare } => {
            header.offset = prepare.op;
            header.next_offset = prepare.commit;
            encode_record(prepare, &mut body);
        }
        Message::PrepareOk { op, checksum, .. } | Message::RequestPrepare { op, checksum, .. } => {
            header.offset = *op;
            header.reserved[RESERVED_U128].copy_from_slice(&checksum.to_le_bytes());
        }
        Message::Commit {
            commit,
            commit_checksum,
            ..
        } => {
            header.next_offset = *commit;
            header.reserved[RESERVED_U128].copy_from_slice(&commit_checksum.to_le_bytes());
        }
        Message::StartViewChange { .. } => {}
        Message::DoViewChange {
            log_view,
            op,
            commit,
            prepares,
            ..
        } => {
            header.offset = *op;
            header.next_offset = *commit;
            header.count = *log_view;
            encode_records(prepares, &mut body);
        }
        Message::StartView {
            op,
            commit,
            prepares,
            ..
        } => {
            header.offset = *op;
            header.next_offset = *commit;
            encode_records(prepares, &mut body);
        }
        Message::RequestHeaders { op_min, op_max, .. } => {
            header.offset = *op_min;
            header.next_offset = *op_max;
        }
        Message::Headers { headers, .. } => encode_headers(headers, &mut body),
        Message::RequestStateTransfer { nonce, .. } => header.request = *nonce,
        Message::StateTransferTarget { nonce, target, .. } => {
            header.request = *nonce;
            body.extend_from_slice(&encode_target(target, &mut header));
        }
        Message::RequestStateChunk {
            nonce,
            artifact,
            offset,
            len,
            ..
        } => {
            header.request = *nonce;
            header.operation = *artifact as u8;
            header.offset = *offset;
            header.count = *len;
        }
        Message::StateChunk {
            nonce,
            artifact,
            offset,
            payload,
            ..
        } => {
            assert!(
                payload.len() <= STATE_CHUNK_PAYLOAD_MAX,
                "chunk payload of {} bytes exceeds STATE_CHUNK_PAYLOAD_MAX",
                payload.len()
            );
            header.request = *nonce;
            header.operation = *artifact as u8;
            header.offset = *offset;
            body.reserve_exact(payload.len());
            body.extend_from_slice(payload);
        }
    }
    seal_in_place(header, body)
}

/// Fills a StateTransferTarget's `count` (available), `error_code` (reason) or `next_offset`
/// (checkpoint_op); returns the body (empty for a refusal, the manifest for an offer).
fn encode_target(target: &TransferTarget, header: &mut Header) -> Vec<u8> {
    match target {
        TransferTarget::Unavailable { reason } => {
            header.count = 0;
            header.error_code = u32::from(*reason as u8);
            Vec::new()
        }
        TransferTarget::Available {
            checkpoint_op,
            manifest,
        } => {
            header.count = 1;
            header.next_offset = *checkpoint_op;
            manifest::encode(manifest)
        }
    }
}

/// The canonical text of a replica address list: each address's `Display` form, comma-joined
/// in index order (`127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103`). Generic over the address
/// type so this pure module names no socket type.
pub fn addresses_text<A: std::fmt::Display>(addresses: &[A]) -> String {
    addresses
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// The checksum a Hello carries of the sender's replica address list: XXH3-64 (seed 0) of
/// [`addresses_text`].
pub fn addresses_checksum<A: std::fmt::Display>(addresses: &[A]) -> u64 {
    twox_hash::XxHash3_64::oneshot(addresses_text(addresses).as_bytes())
}

/// What a Hello announces: the sender's client address and its address-list checksum.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloFields {
    /// The sender's client listen address (possibly empty).
    pub client_address: String,
    /// [`addresses_checksum`] of the sender's `--addresses` list (header `offset`).
    pub addresses_checksum: u64,
}

/// Encodes the Hello frame that opens a replica link: `replica` of `cluster`, announcing its
/// client address `client_addr` (so peers can point clients at it in `NotPrimary` replies) and
/// the [`addresses_checksum`] of its configured replica address list (in header `offset`).
///
/// # Panics
/// If `client_addr` is longer than [`HELLO_ADDRESS_BYTES_MAX`] bytes (config validation bounds
/// addresses long before).
pub fn encode_hello(
    cluster: u128,
    replica: ReplicaIndex,
    client_addr: &str,
    addresses_checksum: u64,
) -> Vec<u8> {
    assert!(
        client_addr.len() <= HELLO_ADDRESS_BYTES_MAX,
        "hello address of {} bytes exceeds HELLO_ADDRESS_BYTES_MAX",
        client_addr.len()
    );
    let mut header = replica_header(Command::Hello, cluster, replica);
    header.offset = addresses_checksum;
    seal(header, client_addr.as_bytes())
}

/// Checks a frame's header alone, before its body is read (the driver reads 256 bytes, calls
/// this, then reads `header.body_size()` bytes): header checksum, `size` within
/// `[256, REPLICA_MESSAGE_SIZE_MAX]`, protocol version, a replica-bus command (4..=17, Hello
/// included), `cluster == expected_cluster`, `replica < replica_count`. Returns the command.
///
/// # Errors
/// `HeaderChecksum`, `SizeOutOfRange`, `ProtocolVersion`, `UnknownCommand`,
/// `UnexpectedCommand` (a client command), `WrongCluster`, `ReplicaOutOfRange`, in that order.
pub fn check_header(
    header: &Header,
    expected_cluster: u128,
    replica_count: u8,
) -> Result<Command, WireError> {
    if !header.valid_checksum() {
        return Err(WireError::HeaderChecksum);
    }
    if (header.size as usize) < HEADER_SIZE || header.size > REPLICA_MESSAGE_SIZE_MAX {
        return Err(WireError::SizeOutOfRange {
            size: header.size,
            max: REPLICA_MESSAGE_SIZE_MAX,
        });
    }
    if header.protocol_version != PROTOCOL_VERSION {
        return Err(WireError::ProtocolVersion {
            version: header.protocol_version,
        });
    }
    let command = Command::from_u8(header.command).ok_or(WireError::UnknownCommand {
        command: header.command,
    })?;
    if matches!(
        command,
        Command::Request | Command::Reply | Command::Eviction
    ) {
        return Err(WireError::UnexpectedCommand {
            command,
            expected: "replica commands 4..=17",
        });
    }
    if header.cluster != expected_cluster {
        return Err(WireError::WrongCluster {
            cluster: header.cluster,
            expected: expected_cluster,
        });
    }
    if header.replica >= replica_count {
        return Err(WireError::ReplicaOutOfRange {
            replica: header.replica,
            replica_count,
        });
    }
    Ok(command)
}

/// Decodes one whole replica message frame (`bytes` is exactly the frame): the sender's index and
/// the message. Hello is refused here (see [`decode_hello`]).
///
/// # Errors
/// Any [`WireError`]: the header checks of [`check_header`], `TruncatedHeader`, `SizeMismatch`
/// (`size` differs from `bytes.len()`), then those of [`decode_body`].
pub fn decode(
    bytes: &[u8],
    expected_cluster: u128,
    replica_count: u8,
) -> Result<(ReplicaIndex, Message), WireError> {
    let (header, body) = split_frame(bytes, expected_cluster, replica_count)?;
    Ok((header.replica, decode_body(&header, body)?))
}

/// Decodes the body of a frame whose header passed [`check_header`]; `body` is the
/// `header.body_size()` bytes that followed it.
///
/// # Errors
/// `SizeMismatch` (`body.len()` is not `header.body_size()`), `BodyChecksum`,
/// `UnexpectedCommand` (Hello or a client command), `BodyTruncated`, `TrailingBody`,
/// `TooManyEntries`, `PrepareRecord`, `PrepareMismatch`, `NotPrepareBody`,
/// `HeaderEntryPadding`; for state transfer (issue 9 section 1) `InvalidSize`,
/// `ZeroLengthChunkRequest`, `UnknownArtifact`, `InvalidAvailability`, `EmptyChunk`, `Manifest`.
pub fn decode_body(header: &Header, body: &[u8]) -> Result<Message, WireError> {
    check_body(header, body)?;
    let command = Command::from_u8(header.command).ok_or(WireError::UnknownCommand {
        command: header.command,
    })?;
    let view = header.view;
    let mut reader = Reader { bytes: body };
    let message = match command {
        Command::Prepare => {
            let prepare = reader.record(0)?;
            check_field(0, "op", prepare.op, header.offset)?;
            check_field(0, "commit", prepare.commit, header.next_offset)?;
            check_field(0, "view", u64::from(prepare.view), u64::from(view))?;
            Message::Prepare { prepare }
        }
        Command::PrepareOk => Message::PrepareOk {
            view,
            op: header.offset,
            checksum: reserved_u128(header),
        },
        Command::Commit => Message::Commit {
            view,
            commit: header.next_offset,
            commit_checksum: reserved_u128(header),
        },
        Command::StartViewChange => Message::StartViewChange { view },
        Command::DoViewChange => Message::DoViewChange {
            view,
            log_view: header.count,
            op: header.offset,
            commit: header.next_offset,
            prepares: reader.records()?,
        },
        Command::StartView => Message::StartView {
            view,
            op: header.offset,
            commit: header.next_offset,
            prepares: reader.records()?,
        },
        Command::RequestPrepare => Message::RequestPrepare {
            view,
            op: header.offset,
            checksum: reserved_u128(header),
        },
        Command::RequestHeaders => Message::RequestHeaders {
            view,
            op_min: header.offset,
            op_max: header.next_offset,
        },
        Command::Headers => Message::Headers {
            view,
            headers: reader.headers()?,
        },
        // State transfer: the whole body is the manifest or the payload, no list to finish.
        Command::RequestStateTransfer => return decode_transfer_request(header),
        Command::StateTransferTarget => {
            return Ok(Message::StateTransferTarget {
                view,
                nonce: header.request,
                target: decode_target(header, body)?,
            });
        }
        Command::RequestStateChunk => return decode_chunk_request(header),
        Command::StateChunk => return decode_chunk(header, body),
        Command::Request | Command::Reply | Command::Eviction | Command::Hello => {
            return Err(WireError::UnexpectedCommand {
                command,
                expected: "replica messages 4..=12 and 14..=17",
            });
        }
    };
    reader.finish(command)?;
    Ok(message)
}

/// A RequestStateTransfer: header only (issue 9 section 1).
fn decode_transfer_request(header: &Header) -> Result<Message, WireError> {
    check_header_only(header, Command::RequestStateTransfer)?;
    Ok(Message::RequestStateTransfer {
        view: header.view,
        nonce: header.request,
    })
}

/// A RequestStateChunk: header only, a known artifact, `len` at least 1 (issue 9 section 1).
fn decode_chunk_request(header: &Header) -> Result<Message, WireError> {
    let command = Command::RequestStateChunk;
    check_header_only(header, command)?;
    if header.count == 0 {
        return Err(WireError::ZeroLengthChunkRequest);
    }
    Ok(Message::RequestStateChunk {
        view: header.view,
        nonce: header.request,
        artifact: artifact_of(header, command)?,
        offset: header.offset,
        len: header.count,
    })
}

/// A StateChunk: a known artifact and a payload of at least 1 byte.
fn decode_chunk(header: &Header, body: &[u8]) -> Result<Message, WireError> {
    let artifact = artifact_of(header, Command::StateChunk)?;
    if body.is_empty() {
        return Err(WireError::EmptyChunk);
    }
    Ok(Message::StateChunk {
        view: header.view,
        nonce: header.request,
        artifact,
        offset: header.offset,
        payload: body.to_vec(),
    })
}

/// A StateTransferTarget's answer: a bare refusal (header only) or an offer with its manifest.
fn decode_target(header: &Header, body: &[u8]) -> Result<TransferTarget, WireError> {
    match header.count {
        0 => {
            check_header_only(header, Command::StateTransferTarget)?;
            let reason = u8::try_from(header.error_code)
                .map_or(UnavailableReason::Unknown, UnavailableReason::from_u8);
            Ok(TransferTarget::Unavailable { reason })
        }
        1 => {
            let caps = ManifestCaps::for_receiver(CLIENTS_TABLE_MAX_LIMIT);
            Ok(TransferTarget::Available {
                checkpoint_op: header.next_offset,
                manifest: manifest::decode(body, &caps)?,
            })
        }
        available => Err(WireError::InvalidAvailability { available }),
    }
}

/// `InvalidSize` unless the frame is exactly its header.
fn check_header_only(header: &Header, command: Command) -> Result<(), WireError> {
    if header.size as usize != HEADER_SIZE {
        return Err(WireError::InvalidSize {
            command,
            size: header.size,
            expected: HEADER_SIZE as u32,
        });
    }
    Ok(())
}

/// The artifact kind in the header's `operation`.
fn artifact_of(header: &Header, command: Command) -> Result<ArtifactKind, WireError> {
    ArtifactKind::from_u8(header.operation).ok_or(WireError::UnknownArtifact {
        command,
        artifact: header.operation,
    })
}

/// Decodes a Hello frame (`bytes` is exactly the frame): the sender's index, the client
/// address it announced (possibly empty) and its address-list checksum.
///
/// # Errors
/// The header checks of [`check_header`], `TruncatedHeader`, `SizeMismatch`, `BodyChecksum`,
/// `UnexpectedCommand` (any command but Hello), `HelloAddress` (longer than
/// [`HELLO_ADDRESS_BYTES_MAX`] or not UTF-8).
pub fn decode_hello(
    bytes: &[u8],
    expected_cluster: u128,
    replica_count: u8,
) -> Result<(ReplicaIndex, HelloFields), WireError> {
    let (header, body) = split_frame(bytes, expected_cluster, replica_count)?;
    Ok((header.replica, decode_hello_body(&header, body)?))
}

/// Decodes the body of a Hello whose header passed [`check_header`], with the header's
/// address-list checksum.
///
/// # Errors
/// As [`decode_hello`], less the header checks.
pub fn decode_hello_body(header: &Header, body: &[u8]) -> Result<HelloFields, WireError> {
    check_body(header, body)?;
    if header.command != Command::Hello as u8 {
        return Err(WireError::UnexpectedCommand {
            command: Command::from_u8(header.command).ok_or(WireError::UnknownCommand {
                command: header.command,
            })?,
            expected: "Hello as the first frame",
        });
    }
    if body.len() > HELLO_ADDRESS_BYTES_MAX {
        return Err(WireError::HelloAddress {
            reason: format!("{} bytes, at most {HELLO_ADDRESS_BYTES_MAX}", body.len()),
        });
    }
    let client_address = std::str::from_utf8(body)
        .map(str::to_owned)
        .map_err(|error| WireError::HelloAddress {
            reason: format!("not UTF-8: {error}"),
        })?;
    Ok(HelloFields {
        client_address,
        addresses_checksum: header.offset,
    })
}

fn command_of(message: &Message) -> Command {
    match message {
        Message::Prepare { .. } => Command::Prepare,
        Message::PrepareOk { .. } => Command::PrepareOk,
        Message::Commit { .. } => Command::Commit,
        Message::StartViewChange { .. } => Command::StartViewChange,
        Message::DoViewChange { .. } => Command::DoViewChange,
        Message::StartView { .. } => Command::StartView,
        Message::RequestPrepare { .. } => Command::RequestPrepare,
        Message::RequestHeaders { .. } => Command::RequestHeaders,
        Message::Headers { .. } => Command::Headers,
        Message::RequestStateTransfer { .. } => Command::RequestStateTransfer,
        Message::StateTransferTarget { .. } => Command::StateTransferTarget,
        Message::RequestStateChunk { .. } => Command::RequestStateChunk,
        Message::StateChunk { .. } => Command::StateChunk,
    }
}

/// A zeroed header with the protocol version, `command`, `cluster` and sender `from` set
/// (`operation` stays 0 but for the artifact of the chunk commands: replica commands carry no
/// client operation).
fn replica_header(command: Command, cluster: u128, from: ReplicaIndex) -> Header {
    let mut header: Header = bytemuck::Zeroable::zeroed();
    header.protocol_version = PROTOCOL_VERSION;
    header.command = command as u8;
    header.cluster = cluster;
    header.replica = from;
    header
}

/// Seals `header` over `frame[HEADER_SIZE..]` (the body) and writes it into `frame[..HEADER_SIZE]`.
fn seal_in_place(mut header: Header, mut frame: Vec<u8>) -> Vec<u8> {
    header.set_checksums(&frame[HEADER_SIZE..]);
    debug_assert!(header.size <= REPLICA_MESSAGE_SIZE_MAX);
    frame[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
    frame
}

fn seal(mut header: Header, body: &[u8]) -> Vec<u8> {
    header.set_checksums(body);
    debug_assert!(header.size <= REPLICA_MESSAGE_SIZE_MAX);
    let mut frame = Vec::with_capacity(HEADER_SIZE + body.len());
    frame.extend_from_slice(bytemuck::bytes_of(&header));
    frame.extend_from_slice(body);
    frame
}

fn encode_record(prepare: &Prepare, body: &mut Vec<u8>) {
    body.extend_from_slice(&JournalHeader::for_prepare(prepare).encode());
    body.extend_from_slice(&prepare.body);
}

fn encode_records(prepares: &[Prepare], body: &mut Vec<u8>) {
    assert!(
        prepares.len() <= PREPARES_COUNT_MAX,
        "{} prepares exceed PREPARES_COUNT_MAX",
        prepares.len()
    );
    body.extend_from_slice(&(prepares.len() as u32).to_le_bytes());
    for prepare in prepares {
        encode_record(prepare, body);
    }
}

fn encode_headers(headers: &[PrepareHeader], body: &mut Vec<u8>) {
    assert!(
        headers.len() <= HEADERS_COUNT_MAX,
        "{} headers exceed HEADERS_COUNT_MAX",
        headers.len()
    );
    body.reserve(LIST_COUNT_SIZE + headers.len() * HEADER_ENTRY_SIZE);
    body.extend_from_slice(&(headers.len() as u32).to_le_bytes());
    for entry in headers {
        body.extend_from_slice(&entry.op.to_le_bytes());
        body.extend_from_slice(&entry.view.to_le_bytes());
        body.extend_from_slice(&[0; 4]);
        body.extend_from_slice(&entry.commit.to_le_bytes());
        body.extend_from_slice(&entry.checksum.to_le_bytes());
        body.extend_from_slice(&entry.parent.to_le_bytes());
    }
}

fn reserved_u128(header: &Header) -> u128 {
    let mut bytes = [0u8; 16];
    bytes.copy_from_slice(&header.reserved[RESERVED_U128]);
    u128::from_le_bytes(bytes)
}

/// The header checks, then the split of a whole frame into its header and body.
fn split_frame(
    bytes: &[u8],
    expected_cluster: u128,
    replica_count: u8,
) -> Result<(Header, &[u8]), WireError> {
    let Some(header_bytes) = bytes.first_chunk::<HEADER_SIZE>() else {
        return Err(WireError::TruncatedHeader { len: bytes.len() });
    };
    let header: Header = bytemuck::pod_read_unaligned(header_bytes);
    check_header(&header, expected_cluster, replica_count)?;
    if header.size as usize != bytes.len() {
        return Err(WireError::SizeMismatch {
            size: header.size,
            actual: bytes.len(),
        });
    }
    Ok((header, &bytes[HEADER_SIZE..]))
}

fn check_body(header: &Header, body: &[u8]) -> Result<(), WireError> {
    if body.len() != header.body_size() {
        return Err(WireError::SizeMismatch {
            size: header.size,
            actual: HEADER_SIZE + body.len(),
        });
    }
    if !header.valid_checksum_body(body) {
        return Err(WireError::BodyChecksum);
    }
    Ok(())
}

fn check_field(
    index: usize,
    field: &'static str,
    record: u64,
    header: u64,
) -> Result<(), WireError> {
    if record == header {
        Ok(())
    } else {
        Err(WireError::PrepareMismatch {
            index,
            field,
            record,
            header,
        })
    }
}

/// A cursor over a body; every read is bounds-checked.
struct Reader<'a> {
    bytes: &'a [u8],
}

impl<'a> Reader<'a> {
    fn take(&mut self, what: &'static str, len: usize) -> Result<&'a [u8], WireError> {
        if self.bytes.len() < len {
            return Err(WireError::BodyTruncated {
                what,
                needed: len,
                remaining: self.bytes.len(),
            });
        }
        let (taken, rest) = self.bytes.split_at(len);
        self.bytes = rest;
        Ok(taken)
    }

    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], WireError> {
        let mut array = [0u8; N];
        array.copy_from_slice(self.take(what, N)?);
        Ok(array)
    }

    fn count(&mut self, what: &'static str, max: usize) -> Result<usize, WireError> {
        let count = u32::from_le_bytes(self.array::<4>(what)?);
        if count as usize > max {
            return Err(WireError::TooManyEntries {
                what,
                count: u64::from(count),
                max,
            });
        }
        Ok(count as usize)
    }

    /// One verified journal record whose body is a prepare body.
    fn record(&mut self, index: usize) -> Result<Prepare, WireError> {
        let (header, body) = parse_record(self.bytes)
            .map_err(|reason| WireError::PrepareRecord { index, reason })?;
        PrepareBody::decode(body).map_err(|reason| WireError::NotPrepareBody { index, reason })?;
        let prepare = Prepare {
            op: header.op,
            view: header.view,
            commit: header.commit,
            body: body.to_vec(),
        };
        self.bytes = &self.bytes[JOURNAL_HEADER_SIZE + body.len()..];
        Ok(prepare)
    }

    fn records(&mut self) -> Result<Vec<Prepare>, WireError> {
        let count = self.count("prepare records", PREPARES_COUNT_MAX)?;
        (0..count).map(|index| self.record(index)).collect()
    }

    fn headers(&mut self) -> Result<Vec<PrepareHeader>, WireError> {
        let count = self.count("headers", HEADERS_COUNT_MAX)?;
        if self.bytes.len() < count * HEADER_ENTRY_SIZE {
            return Err(WireError::BodyTruncated {
                what: "headers entries",
                needed: count * HEADER_ENTRY_SIZE,
                remaining: self.bytes.len(),
            });
        }
        let mut headers = Vec::with_capacity(count);
        for index in 0..count {
            let op = u64::from_le_bytes(self.array("headers entry op")?);
            let view = u32::from_le_bytes(self.array("headers entry view")?);
            if self.array::<4>("headers entry padding")? != [0; 4] {
                return Err(WireError::HeaderEntryPadding { index });
            }
            let commit = u64::from_le_bytes(self.array("headers entry commit")?);
            let checksum = u128::from_le_bytes(self.array("headers entry checksum")?);
            let parent = u128::from_le_bytes(self.array("headers entry parent")?);
            headers.push(PrepareHeader {
                op,
                view,
                commit,
                checksum,
                parent,
            });
        }
        Ok(headers)
    }

    fn finish(&self, command: Command) -> Result<(), WireError> {
        if self.bytes.is_empty() {
            Ok(())
        } else {
            Err(WireError::TrailingBody {
                command,
                count: self.bytes.len(),
            })
        }
    }
}

/// The configuration of the replica-bus decoders' property tests (here and in
/// `super::transfer`): 512 cases, a fixed seed unless `PROPTEST_RNG_SEED` overrides it, so a
/// failure reproduces.
#[cfg(test)]
pub(crate) fn proptest_config() -> proptest::test_runner::Config {
    let mut config = proptest::test_runner::Config::with_cases(512);
    if matches!(config.rng_seed, proptest::test_runner::RngSeed::Random) {
        config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x0057_1e5e);
    }
    config.failure_persistence = None;
    config
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::MetadataOp;
    use crate::vsr::prepare::PrepareOperation;
    use crate::vsr::transfer::{Manifest, ManifestEntry};

    const CLUSTER: u128 = 0x00c0_ffee_0000_0000_0000_0000_0000_0007;

    fn prepare(op: u64, view: u32, parent: u128) -> Prepare {
        let body = PrepareBody::new(
            0xabc,
            op,
            PrepareOperation::Metadata(MetadataOp::CreateStream {
                stream_id: op as u32,
                name: format!("stream-{op}"),
            }),
            1_700_000_000_000_000 + op,
            parent,
        );
        Prepare {
            op,
            view,
            commit: op - 1,
            body: body.encode(),
        }
    }

    fn chain(first_op: u64, count: usize, view: u32) -> Vec<Prepare> {
        let mut parent = 0;
        (0..count as u64)
            .map(|index| {
                let prepare = prepare(first_op + index, view, parent);
                parent = JournalHeader::for_prepare(&prepare).checksum;
                prepare
            })
            .collect()
    }

    fn every_variant() -> Vec<Message> {
        let prepares = chain(5, PREPARES_COUNT_MAX, 3);
        vec![
            Message::Prepare {
                prepare: prepare(9, 4, 0x1234),
            },
            Message::PrepareOk {
                view: 4,
                op: 9,
                checksum: u128::MAX - 1,
            },
            Message::Commit {
                view: 4,
                commit: 8,
                commit_checksum: 0x0102_0304_0506_0708_090a_0b0c_0d0e_0f10,
            },
            Message::StartViewChange { view: u32::MAX },
            Message::DoViewChange {
                view: 5,
                log_view: 3,
                op: 12,
                commit: 4,
                prepares: prepares.clone(),
            },
            Message::DoViewChange {
                view: 5,
                log_view: 0,
                op: 0,
                commit: 0,
                prepares: Vec::new(),
            },
            Message::StartView {
                view: 5,
                op: 12,
                commit: 4,
                prepares,
            },
            Message::RequestPrepare {
                view: 5,
                op: 7,
                checksum: 0,
            },
            Message::RequestHeaders {
                view: 5,
                op_min: 1,
                op_max: u64::MAX,
            },
            Message::Headers {
                view: 5,
                headers: (1..=HEADERS_COUNT_MAX as u64)
                    .map(|op| PrepareHeader {
                        op,
                        view: 2,
                        commit: op - 1,
                        checksum: u128::from(op) << 64 | 7,
                        parent: u128::from(op),
                    })
                    .collect(),
            },
            Message::Headers {
                view: 0,
                headers: Vec::new(),
            },
        ]
        .into_iter()
        .chain(transfer_variants())
        .collect()
    }

    fn sample_manifest() -> Manifest {
        Manifest {
            entries: vec![
                ManifestEntry {
                    kind: ArtifactKind::Metadata,
                    frontier_op: 64,
                    len: 300,
                    checksum: 0xaaaa_bbbb,
                },
                ManifestEntry {
                    kind: ArtifactKind::ClientTable,
                    frontier_op: 64,
                    len: 20,
                    checksum: u128::MAX,
                },
            ],
        }
    }

    /// Every state-transfer message shape (issue 9 section 1).
    fn transfer_variants() -> Vec<Message> {
        let mut messages = vec![
            Message::RequestStateTransfer {
                view: 6,
                nonce: u64::MAX,
            },
            Message::StateTransferTarget {
                view: 6,
                nonce: 7,
                target: TransferTarget::Available {
                    checkpoint_op: 64,
                    manifest: sample_manifest(),
                },
            },
            Message::RequestStateChunk {
                view: 6,
                nonce: 7,
                artifact: ArtifactKind::ClientTable,
                offset: 1 << 40,
                len: u32::MAX,
            },
            Message::StateChunk {
                view: 6,
                nonce: 7,
                artifact: ArtifactKind::Metadata,
                offset: 4096,
                payload: vec![0xab; 3000],
            },
        ];
        for reason in [
            UnavailableReason::NotPrimary,
            UnavailableReason::ViewChange,
            UnavailableReason::NotCaughtUp,
            UnavailableReason::NoCheckpointYet,
            UnavailableReason::CheckpointUnreadable,
            UnavailableReason::CheckpointBeingReplaced,
            UnavailableReason::Unknown,
        ] {
            messages.push(Message::StateTransferTarget {
                view: 6,
                nonce: 8,
                target: TransferTarget::Unavailable { reason },
            });
        }
        messages
    }

    fn header_of(frame: &[u8]) -> Header {
        bytemuck::pod_read_unaligned(&frame[..HEADER_SIZE])
    }

    /// Rewrites a frame's header with `edit` applied and both checksums recomputed over `body`.
    fn resealed(frame: &[u8], body: &[u8], edit: impl FnOnce(&mut Header)) -> Vec<u8> {
        let mut header = header_of(frame);
        edit(&mut header);
        seal(header, body)
    }

    #[test]
    fn every_variant_round_trips() {
        for message in every_variant() {
            let frame = encode(CLUSTER, 2, &message);
            let header = header_of(&frame);
            assert_eq!(header.size as usize, frame.len());
            assert!(header.size <= REPLICA_MESSAGE_SIZE_MAX);
            assert_eq!(header.cluster, CLUSTER);
            assert_eq!(header.replica, 2);
            assert_eq!(header.view, message.view());
            assert_eq!(header.command, command_of(&message) as u8);
            assert!((4..=17).contains(&header.command));
            assert_ne!(header.command, Command::Hello as u8);
            assert_eq!(check_header(&header, CLUSTER, 3), Ok(command_of(&message)));
            assert_eq!(decode(&frame, CLUSTER, 3), Ok((2, message.clone())));
            assert_eq!(
                decode_body(&header, &frame[HEADER_SIZE..]),
                Ok(message.clone())
            );
        }
    }

    #[test]
    fn fields_sit_where_the_table_says() {
        let frame = encode(
            CLUSTER,
            1,
            &Message::DoViewChange {
                view: 9,
                log_view: 7,
                op: 0x1111,
                commit: 0x2222,
                prepares: Vec::new(),
            },
        );
        assert_eq!(&frame[96..104], &0x1111_u64.to_le_bytes());
        assert_eq!(&frame[120..128], &0x2222_u64.to_le_bytes());
        assert_eq!(&frame[104..108], &7_u32.to_le_bytes());
        assert_eq!(&frame[52..56], &9_u32.to_le_bytes());
        assert_eq!(&frame[HEADER_SIZE..], &0_u32.to_le_bytes());
        let frame = encode(
            CLUSTER,
            1,
            &Message::PrepareOk {
                view: 1,
                op: 3,
                checksum: 0xfeed,
            },
        );
        assert_eq!(&frame[176..192], &0xfeed_u128.to_le_bytes());
        assert_eq!(frame.len(), HEADER_SIZE);
    }

    /// A bare refusal for `reason` (view 9, nonce 0x1234).
    fn refusal(reason: UnavailableReason) -> Message {
        Message::StateTransferTarget {
            view: 9,
            nonce: 0x1234,
            target: TransferTarget::Unavailable { reason },
        }
    }

    /// An offer of the checkpoint at `checkpoint_op` with [`sample_manifest`].
    fn offer(checkpoint_op: u64) -> Message {
        Message::StateTransferTarget {
            view: 9,
            nonce: 0x1234,
            target: TransferTarget::Available {
                checkpoint_op,
                manifest: sample_manifest(),
            },
        }
    }

    fn chunk_request(artifact: ArtifactKind, offset: u64, len: u32) -> Message {
        Message::RequestStateChunk {
            view: 9,
            nonce: 0x1234,
            artifact,
            offset,
            len,
        }
    }

    fn chunk(artifact: ArtifactKind, offset: u64, payload: Vec<u8>) -> Message {
        Message::StateChunk {
            view: 9,
            nonce: 0x1234,
            artifact,
            offset,
            payload,
        }
    }

    #[test]
    fn transfer_fields_sit_where_the_table_says() {
        let frame = encode(
            CLUSTER,
            1,
            &chunk_request(ArtifactKind::ClientTable, 0x5555, 77),
        );
        assert_eq!(frame.len(), HEADER_SIZE);
        assert_eq!(&frame[80..88], &0x1234_u64.to_le_bytes());
        assert_eq!(frame[60], ArtifactKind::ClientTable as u8);
        assert_eq!(&frame[96..104], &0x5555_u64.to_le_bytes());
        assert_eq!(&frame[104..108], &77_u32.to_le_bytes());
        let offer = encode(CLUSTER, 1, &offer(0x4444));
        assert_eq!(&offer[80..88], &0x1234_u64.to_le_bytes());
        assert_eq!(&offer[104..108], &1_u32.to_le_bytes());
        assert_eq!(&offer[120..128], &0x4444_u64.to_le_bytes());
        assert_eq!(
            &offer[HEADER_SIZE..],
            &manifest::encode(&sample_manifest())[..]
        );
        let refusal = encode(CLUSTER, 1, &refusal(UnavailableReason::NoCheckpointYet));
        assert_eq!(refusal.len(), HEADER_SIZE);
        assert_eq!(&refusal[104..108], &0_u32.to_le_bytes());
        assert_eq!(
            &refusal[108..112],
            &(UnavailableReason::NoCheckpointYet as u32).to_le_bytes()
        );
        let chunk = encode(
            CLUSTER,
            1,
            &chunk(ArtifactKind::Metadata, 10, b"abc".to_vec()),
        );
        assert_eq!(chunk[60], ArtifactKind::Metadata as u8);
        assert_eq!(&chunk[96..104], &10_u64.to_le_bytes());
        assert_eq!(&chunk[HEADER_SIZE..], b"abc");
    }

    #[test]
    fn issue9_header_only_requests_refuse_a_body() {
        let requests = [
            Message::RequestStateTransfer { view: 1, nonce: 2 },
            chunk_request(ArtifactKind::Metadata, 0, 10),
        ];
        for request in requests {
            let frame = encode(CLUSTER, 0, &request);
            let command = command_of(&request);
            assert_eq!(decode(&frame, CLUSTER, 3), Ok((0, request)));
            assert_eq!(
                decode(&resealed(&frame, b"x", |_| {}), CLUSTER, 3),
                Err(WireError::InvalidSize {
                    command,
                    size: HEADER_SIZE as u32 + 1,
                    expected: HEADER_SIZE as u32
                })
            );
        }
    }

    #[test]
    fn issue9_zero_length_chunk_request_refused() {
        let frame = encode(CLUSTER, 0, &chunk_request(ArtifactKind::Metadata, 5, 1));
        assert!(decode(&frame, CLUSTER, 3).is_ok());
        assert_eq!(
            decode(&resealed(&frame, &[], |h| h.count = 0), CLUSTER, 3),
            Err(WireError::ZeroLengthChunkRequest)
        );
    }

    #[test]
    fn issue9_unknown_artifact_refused() {
        let frames = [
            (
                encode(CLUSTER, 0, &chunk_request(ArtifactKind::Metadata, 0, 1)),
                Command::RequestStateChunk,
            ),
            (
                encode(CLUSTER, 0, &chunk(ArtifactKind::Metadata, 0, vec![1])),
                Command::StateChunk,
            ),
        ];
        for (frame, command) in frames {
            for artifact in [0, 3, 255] {
                let body = frame[HEADER_SIZE..].to_vec();
                assert_eq!(
                    decode(
                        &resealed(&frame, &body, |h| h.operation = artifact),
                        CLUSTER,
                        3
                    ),
                    Err(WireError::UnknownArtifact { command, artifact })
                );
            }
        }
    }

    #[test]
    fn issue9_bare_refusal_is_header_only() {
        let refusal = encode(CLUSTER, 0, &refusal(UnavailableReason::NotPrimary));
        assert_eq!(refusal.len(), HEADER_SIZE);
        let manifest = manifest::encode(&sample_manifest());
        assert_eq!(
            decode(&resealed(&refusal, &manifest, |_| {}), CLUSTER, 3),
            Err(WireError::InvalidSize {
                command: Command::StateTransferTarget,
                size: (HEADER_SIZE + manifest.len()) as u32,
                expected: HEADER_SIZE as u32
            })
        );
    }

    #[test]
    fn issue9_unknown_unavailable_reason_reads_as_unknown() {
        let frame = encode(CLUSTER, 0, &refusal(UnavailableReason::NotPrimary));
        for code in [0, 7, 254, 256 + 1, u32::MAX] {
            assert_eq!(
                decode(&resealed(&frame, &[], |h| h.error_code = code), CLUSTER, 3),
                Ok((0, refusal(UnavailableReason::Unknown))),
                "reason {code}"
            );
        }
    }

    #[test]
    fn issue9_availability_other_than_0_or_1_refused() {
        let frame = encode(CLUSTER, 0, &refusal(UnavailableReason::NotPrimary));
        for available in [2, u32::MAX] {
            assert_eq!(
                decode(&resealed(&frame, &[], |h| h.count = available), CLUSTER, 3),
                Err(WireError::InvalidAvailability { available })
            );
        }
    }

    #[test]
    fn issue9_offer_manifest_is_checked() {
        let offer = encode(CLUSTER, 0, &offer(9));
        // An offer without a manifest.
        assert!(matches!(
            decode(&resealed(&offer, &[], |_| {}), CLUSTER, 3),
            Err(WireError::Manifest(ManifestError::Decode(
                storage::codec::DecodeError::NoTrailer { len: 0 }
            )))
        ));
        // A damaged manifest under valid bus checksums.
        let mut body = offer[HEADER_SIZE..].to_vec();
        body[20] ^= 1;
        assert!(matches!(
            decode(&resealed(&offer, &body, |_| {}), CLUSTER, 3),
            Err(WireError::Manifest(ManifestError::Decode(
                storage::codec::DecodeError::TrailerMismatch { .. }
            )))
        ));
        // An artifact above the absolute caps.
        let huge = Manifest {
            entries: vec![ManifestEntry {
                kind: ArtifactKind::Metadata,
                frontier_op: 9,
                len: manifest::METADATA_ARTIFACT_LEN_MAX + 1,
                checksum: 1,
            }],
        };
        assert!(matches!(
            decode(
                &resealed(&offer, &manifest::encode(&huge), |_| {}),
                CLUSTER,
                3
            ),
            Err(WireError::Manifest(ManifestError::ArtifactTooLong { .. }))
        ));
    }

    #[test]
    fn issue9_empty_chunk_refused() {
        let frame = encode(CLUSTER, 0, &chunk(ArtifactKind::ClientTable, 0, vec![1]));
        assert_eq!(
            decode(&resealed(&frame, &[], |_| {}), CLUSTER, 3),
            Err(WireError::EmptyChunk)
        );
    }

    #[test]
    fn issue9_largest_state_chunk_fits_the_replica_frame_limit() {
        let message = chunk(ArtifactKind::Metadata, 0, vec![7; STATE_CHUNK_PAYLOAD_MAX]);
        let frame = encode(CLUSTER, 0, &message);
        assert_eq!(frame.len(), REPLICA_MESSAGE_SIZE_MAX as usize);
        assert_eq!(decode(&frame, CLUSTER, 3), Ok((0, message)));
    }

    #[test]
    #[should_panic(expected = "exceeds STATE_CHUNK_PAYLOAD_MAX")]
    fn oversized_chunk_payload_is_a_caller_bug() {
        let payload = vec![7; STATE_CHUNK_PAYLOAD_MAX + 1];
        encode(CLUSTER, 0, &chunk(ArtifactKind::Metadata, 0, payload));
    }

    #[test]
    fn prepare_body_is_the_journal_record() {
        let prepare = prepare(3, 1, 0x99);
        let frame = encode(
            CLUSTER,
            0,
            &Message::Prepare {
                prepare: prepare.clone(),
            },
        );
        let (record, body) = parse_record(&frame[HEADER_SIZE..]).unwrap();
        assert_eq!(record, JournalHeader::for_prepare(&prepare));
        assert_eq!(body, prepare.body.as_slice());
        assert_eq!(frame.len(), HEADER_SIZE + JOURNAL_HEADER_SIZE + body.len());
    }

    #[test]
    fn hello_round_trips_and_is_bounded() {
        let addresses = ["127.0.0.1:7101", "127.0.0.1:7102"];
        assert_eq!(addresses_text(&addresses), "127.0.0.1:7101,127.0.0.1:7102");
        let list = addresses_checksum(&addresses);
        assert_eq!(
            list,
            twox_hash::XxHash3_64::oneshot(b"127.0.0.1:7101,127.0.0.1:7102")
        );
        assert_ne!(list, addresses_checksum(&addresses[..1]));
        for (address, checksum) in [
            ("127.0.0.1:7001", list),
            ("", 0),
            (&"h".repeat(HELLO_ADDRESS_BYTES_MAX), u64::MAX),
        ] {
            let frame = encode_hello(CLUSTER, 4, address, checksum);
            assert_eq!(header_of(&frame).command, Command::Hello as u8);
            assert_eq!(header_of(&frame).offset, checksum, "where the table says");
            assert_eq!(
                decode_hello(&frame, CLUSTER, 5),
                Ok((
                    4,
                    HelloFields {
                        client_address: address.to_owned(),
                        addresses_checksum: checksum,
                    }
                ))
            );
            assert!(matches!(
                decode(&frame, CLUSTER, 5),
                Err(WireError::UnexpectedCommand {
                    command: Command::Hello,
                    ..
                })
            ));
        }
        let long = "h".repeat(HELLO_ADDRESS_BYTES_MAX + 1);
        let frame = encode_hello(CLUSTER, 0, "", list);
        let frame = resealed(&frame, long.as_bytes(), |_| {});
        assert!(matches!(
            decode_hello(&frame, CLUSTER, 1),
            Err(WireError::HelloAddress { .. })
        ));
        let frame = resealed(&frame, &[0xff, 0xfe], |_| {});
        assert!(matches!(
            decode_hello(&frame, CLUSTER, 1),
            Err(WireError::HelloAddress { .. })
        ));
        let commit = encode(CLUSTER, 0, &Message::StartViewChange { view: 1 });
        assert!(matches!(
            decode_hello(&commit, CLUSTER, 1),
            Err(WireError::UnexpectedCommand {
                command: Command::StartViewChange,
                ..
            })
        ));
    }

    #[test]
    fn refuses_damaged_headers_in_order() {
        let frame = encode(CLUSTER, 1, &Message::StartViewChange { view: 2 });
        assert_eq!(
            decode(&frame[..255], CLUSTER, 3),
            Err(WireError::TruncatedHeader { len: 255 })
        );
        let mut flipped = frame.clone();
        flipped[52] ^= 1;
        assert_eq!(decode(&flipped, CLUSTER, 3), Err(WireError::HeaderChecksum));
        assert_eq!(
            decode(&frame, CLUSTER + 1, 3),
            Err(WireError::WrongCluster {
                cluster: CLUSTER,
                expected: CLUSTER + 1
            })
        );
        assert_eq!(
            decode(&frame, CLUSTER, 1),
            Err(WireError::ReplicaOutOfRange {
                replica: 1,
                replica_count: 1
            })
        );
        let reseal = |edit: fn(&mut Header)| resealed(&frame, &[], edit);
        assert_eq!(
            decode(&reseal(|h| h.command = 18), CLUSTER, 3),
            Err(WireError::UnknownCommand { command: 18 })
        );
        for command in [Command::Request, Command::Reply, Command::Eviction] {
            let bytes = resealed(&frame, &[], |h| h.command = command as u8);
            assert!(matches!(
                decode(&bytes, CLUSTER, 3),
                Err(WireError::UnexpectedCommand { command: c, .. }) if c == command
            ));
        }
        assert_eq!(
            decode(
                &reseal(|h| h.protocol_version = PROTOCOL_VERSION + 1),
                CLUSTER,
                3
            ),
            Err(WireError::ProtocolVersion {
                version: PROTOCOL_VERSION + 1
            })
        );
        let mut bytes = reseal(|_| {});
        let mut header = header_of(&bytes);
        header.size = REPLICA_MESSAGE_SIZE_MAX + 1;
        header.checksum = header.calculate_checksum();
        bytes[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
        assert_eq!(
            decode(&bytes, CLUSTER, 3),
            Err(WireError::SizeOutOfRange {
                size: REPLICA_MESSAGE_SIZE_MAX + 1,
                max: REPLICA_MESSAGE_SIZE_MAX
            })
        );
        header.size = 100;
        header.checksum = header.calculate_checksum();
        bytes[..HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
        assert!(matches!(
            decode(&bytes, CLUSTER, 3),
            Err(WireError::SizeOutOfRange { size: 100, .. })
        ));
        // Bytes after the announced size, or fewer than it.
        let mut long = frame.clone();
        long.push(0);
        assert_eq!(
            decode(&long, CLUSTER, 3),
            Err(WireError::SizeMismatch {
                size: 256,
                actual: 257
            })
        );
        let prepare_frame = encode(
            CLUSTER,
            0,
            &Message::Prepare {
                prepare: prepare(1, 0, 0),
            },
        );
        assert!(matches!(
            decode(&prepare_frame[..prepare_frame.len() - 1], CLUSTER, 3),
            Err(WireError::SizeMismatch { .. })
        ));
        let header = header_of(&prepare_frame);
        assert!(matches!(
            decode_body(&header, &prepare_frame[HEADER_SIZE + 1..]),
            Err(WireError::SizeMismatch { .. })
        ));
    }

    #[test]
    fn refuses_damaged_bodies() {
        let prepare = prepare(2, 1, 0x42);
        let frame = encode(
            CLUSTER,
            0,
            &Message::Prepare {
                prepare: prepare.clone(),
            },
        );
        // A flipped body byte with the bus checksums left alone.
        let mut flipped = frame.clone();
        let last = flipped.len() - 1;
        flipped[last] ^= 1;
        assert_eq!(decode(&flipped, CLUSTER, 3), Err(WireError::BodyChecksum));
        // The same flip resealed: the bus checksums pass, the journal record does not.
        let body = &flipped[HEADER_SIZE..];
        assert!(matches!(
            decode(&resealed(&frame, body, |_| {}), CLUSTER, 3),
            Err(WireError::PrepareRecord { index: 0, .. })
        ));
        // A valid record whose body is no prepare body.
        let not_json = Prepare {
            body: b"not json".to_vec(),
            ..prepare.clone()
        };
        let mut body = JournalHeader::for_prepare(&not_json).encode().to_vec();
        body.extend_from_slice(&not_json.body);
        assert!(matches!(
            decode(&resealed(&frame, &body, |_| {}), CLUSTER, 3),
            Err(WireError::NotPrepareBody { index: 0, .. })
        ));
        // The record and the bus header disagree.
        assert_eq!(
            decode(
                &resealed(&frame, &frame[HEADER_SIZE..], |h| h.offset = 3),
                CLUSTER,
                3
            ),
            Err(WireError::PrepareMismatch {
                index: 0,
                field: "op",
                record: 2,
                header: 3
            })
        );
        assert!(matches!(
            decode(
                &resealed(&frame, &frame[HEADER_SIZE..], |h| h.view = 7),
                CLUSTER,
                3
            ),
            Err(WireError::PrepareMismatch { field: "view", .. })
        ));
        assert!(matches!(
            decode(
                &resealed(&frame, &frame[HEADER_SIZE..], |h| h.next_offset = 0),
                CLUSTER,
                3
            ),
            Err(WireError::PrepareMismatch {
                field: "commit",
                ..
            })
        ));
        // Trailing bytes after the record.
        let mut trailing = frame[HEADER_SIZE..].to_vec();
        trailing.extend_from_slice(b"xx");
        assert_eq!(
            decode(&resealed(&frame, &trailing, |_| {}), CLUSTER, 3),
            Err(WireError::TrailingBody {
                command: Command::Prepare,
                count: 2
            })
        );
        // A body on a command that takes none.
        let ok = encode(
            CLUSTER,
            1,
            &Message::PrepareOk {
                view: 1,
                op: 2,
                checksum: 3,
            },
        );
        assert_eq!(
            decode(&resealed(&ok, b"x", |_| {}), CLUSTER, 3),
            Err(WireError::TrailingBody {
                command: Command::PrepareOk,
                count: 1
            })
        );
        // An empty Prepare body.
        assert!(matches!(
            decode(&resealed(&frame, &[], |_| {}), CLUSTER, 3),
            Err(WireError::PrepareRecord { index: 0, .. })
        ));
    }

    #[test]
    fn refuses_bad_lists() {
        let start_view = encode(
            CLUSTER,
            0,
            &Message::StartView {
                view: 1,
                op: 3,
                commit: 1,
                prepares: chain(2, 2, 1),
            },
        );
        let body = &start_view[HEADER_SIZE..];
        // More entries than the bound.
        let mut too_many = body.to_vec();
        too_many[..4].copy_from_slice(&(PREPARES_COUNT_MAX as u32 + 1).to_le_bytes());
        assert_eq!(
            decode(&resealed(&start_view, &too_many, |_| {}), CLUSTER, 3),
            Err(WireError::TooManyEntries {
                what: "prepare records",
                count: PREPARES_COUNT_MAX as u64 + 1,
                max: PREPARES_COUNT_MAX
            })
        );
        // A count above what follows.
        let mut short = body.to_vec();
        short[..4].copy_from_slice(&3_u32.to_le_bytes());
        assert!(matches!(
            decode(&resealed(&start_view, &short, |_| {}), CLUSTER, 3),
            Err(WireError::PrepareRecord { index: 2, .. })
        ));
        // A count below what follows.
        let mut long = body.to_vec();
        long[..4].copy_from_slice(&1_u32.to_le_bytes());
        assert!(matches!(
            decode(&resealed(&start_view, &long, |_| {}), CLUSTER, 3),
            Err(WireError::TrailingBody {
                command: Command::StartView,
                ..
            })
        ));
        // No count at all.
        assert!(matches!(
            decode(&resealed(&start_view, &body[..3], |_| {}), CLUSTER, 3),
            Err(WireError::BodyTruncated { .. })
        ));
        // The second record damaged.
        let mut damaged = body.to_vec();
        let last = damaged.len() - 1;
        damaged[last] ^= 1;
        assert!(matches!(
            decode(&resealed(&start_view, &damaged, |_| {}), CLUSTER, 3),
            Err(WireError::PrepareRecord { index: 1, .. })
        ));

        let headers = encode(
            CLUSTER,
            0,
            &Message::Headers {
                view: 1,
                headers: vec![PrepareHeader {
                    op: 1,
                    view: 1,
                    commit: 0,
                    checksum: 5,
                    parent: 0,
                }],
            },
        );
        let body = &headers[HEADER_SIZE..];
        assert_eq!(body.len(), LIST_COUNT_SIZE + HEADER_ENTRY_SIZE);
        let mut padded = body.to_vec();
        padded[LIST_COUNT_SIZE + 12] = 1;
        assert_eq!(
            decode(&resealed(&headers, &padded, |_| {}), CLUSTER, 3),
            Err(WireError::HeaderEntryPadding { index: 0 })
        );
        let mut too_many = body.to_vec();
        too_many[..4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&resealed(&headers, &too_many, |_| {}), CLUSTER, 3),
            Err(WireError::TooManyEntries {
                what: "headers",
                ..
            })
        ));
        let mut short = body.to_vec();
        short[..4].copy_from_slice(&2_u32.to_le_bytes());
        assert!(matches!(
            decode(&resealed(&headers, &short, |_| {}), CLUSTER, 3),
            Err(WireError::BodyTruncated { .. })
        ));
        assert!(matches!(
            decode(
                &resealed(&headers, &body[..body.len() - 1], |_| {}),
                CLUSTER,
                3
            ),
            Err(WireError::BodyTruncated { .. })
        ));
    }

    #[test]
    fn the_largest_view_change_fits_the_limit() {
        // PREPARES_COUNT_MAX records of the largest journal body.
        let big = Prepare {
            op: 1,
            view: 1,
            commit: 0,
            body: vec![b' '; storage::limits::JOURNAL_BODY_SIZE_MAX as usize],
        };
        let mut body = Vec::new();
        encode_records(&vec![big; PREPARES_COUNT_MAX], &mut body);
        assert!(HEADER_SIZE + body.len() <= REPLICA_MESSAGE_SIZE_MAX as usize);
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(proptest_config())]

            /// Random bytes never panic, and never decode (the header checksum fails).
            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..1024)) {
                prop_assert!(decode(&bytes, CLUSTER, 5).is_err());
                prop_assert!(decode_hello(&bytes, CLUSTER, 5).is_err());
            }

            /// Random bodies behind a valid header of every command never panic.
            #[test]
            fn resealed_random_bodies_never_panic(
                command in 4u8..=17,
                fields in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
                body in proptest::collection::vec(any::<u8>(), 0..600),
            ) {
                let mut header: Header = bytemuck::pod_read_unaligned(&fields);
                header.command = command;
                header.protocol_version = PROTOCOL_VERSION;
                header.cluster = CLUSTER;
                header.replica %= 5;
                let frame = seal(header, &body);
                let _ = decode(&frame, CLUSTER, 5);
                let _ = decode_hello(&frame, CLUSTER, 5);
            }

            /// Flipping any one byte of a valid frame is refused (never a different message).
            #[test]
            fn any_flipped_byte_is_refused(index in 0usize..4096, bit in 0u8..8) {
                let message = Message::StartView {
                    view: 3,
                    op: 6,
                    commit: 4,
                    prepares: chain(5, 2, 3),
                };
                let mut frame = encode(CLUSTER, 1, &message);
                let index = index % frame.len();
                frame[index] ^= 1 << bit;
                prop_assert!(decode(&frame, CLUSTER, 3).is_err());
            }

            /// State-transfer messages of any valid content round trip (issue 9 section 1).
            #[test]
            fn transfer_messages_round_trip(
                view in any::<u32>(),
                nonce in any::<u64>(),
                client_table in any::<bool>(),
                offset in any::<u64>(),
                len in 1u32..,
                payload in proptest::collection::vec(any::<u8>(), 1..300),
                reason in any::<u8>(),
            ) {
                let artifact = if client_table { ArtifactKind::ClientTable } else { ArtifactKind::Metadata };
                let messages = [
                    Message::RequestStateTransfer { view, nonce },
                    Message::RequestStateChunk { view, nonce, artifact, offset, len },
                    Message::StateChunk { view, nonce, artifact, offset, payload },
                    Message::StateTransferTarget {
                        view,
                        nonce,
                        target: TransferTarget::Unavailable { reason: UnavailableReason::from_u8(reason) },
                    },
                ];
                for message in messages {
                    let frame = encode(CLUSTER, 0, &message);
                    prop_assert_eq!(decode(&frame, CLUSTER, 1), Ok((0, message)));
                }
            }

            /// Headers lists of any content round trip.
            #[test]
            fn headers_round_trip(
                entries in proptest::collection::vec(
                    (any::<u64>(), any::<u32>(), any::<u64>(), any::<u128>(), any::<u128>()),
                    0..40,
                ),
                view in any::<u32>(),
            ) {
                let headers = entries
                    .into_iter()
                    .map(|(op, view, commit, checksum, parent)| PrepareHeader { op, view, commit, checksum, parent })
                    .collect();
                let message = Message::Headers { view, headers };
                let frame = encode(CLUSTER, 0, &message);
                prop_assert_eq!(decode(&frame, CLUSTER, 1), Ok((0, message)));
            }
        }
    }
}
