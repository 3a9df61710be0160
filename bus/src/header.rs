//! The 256-byte message header (DESIGN section 5), a `#[repr(C)]` bytemuck type.
//!
//! Every message on the wire is `[header: 256 bytes][body: size - 256 bytes]`. This module owns
//! the header's layout, its two checksums and the checks of its common prefix. It never does I/O
//! and never trusts a field of a header whose `checksum` did not match.
//!
//! Layout (little-endian, byte offsets; `layout_matches_module_doc` checks each one):
//!
//! | bytes    | field              | meaning                                                   |
//! |----------|--------------------|-----------------------------------------------------------|
//! | 0..16    | `checksum`         | u128, XXH3-128 of header bytes 16..256                     |
//! | 16..32   | `checksum_body`    | u128, XXH3-128 of the body (also of an empty body); of a batch body only its batch headers (below) |
//! | 32..48   | `cluster`          | u128, cluster id                                           |
//! | 48..52   | `size`             | u32, whole message bytes, header included (>= 256)         |
//! | 52..56   | `view`             | u32, VSR view of the sender                                |
//! | 56..58   | `protocol_version` | u16, `PROTOCOL_VERSION`                                    |
//! | 58       | `command`          | u8, `Command`                                              |
//! | 59       | `replica`          | u8, sending replica id                                     |
//! | 60       | `operation`        | u8, `Operation` of a Request/Reply/Eviction                |
//! | 61..64   | `reserved_prefix`  | zero                                                       |
//! | 64..80   | `client`           | u128, client id                                            |
//! | 80..88   | `request`          | u64, client request number, echoed in the reply            |
//! | 88..96   | `namespace`        | u64, `Namespace` packing                                   |
//! | 96..104  | `offset`           | u64, poll: first offset wanted; send reply: base offset    |
//! | 104..108 | `count`            | u32, topic: partitions; poll: max messages; reply: count   |
//! | 108..112 | `error_code`       | u32, 0 = success, else `ErrorCode` with a UTF-8 body       |
//! | 112..120 | `timestamp_us`     | u64, microseconds since the Unix epoch                     |
//! | 120..128 | `next_offset`      | u64, send/poll reply: the partition's next offset          |
//! | 128..136 | `first_offset`     | u64, send/poll reply: the partition's first offset         |
//! | 136..144 | `producer`         | u64, send: idempotent producer id (0 = not idempotent)     |
//! | 144..152 | `sequence`         | u64, send: producer's sequence of this batch's first message |
//! | 152..160 | `retention_bytes`  | u64, topic create/alter: size limit (0 = none, alter: MAX = keep) |
//! | 160..168 | `retention_ms`     | u64, topic create/alter: age limit (0 = none, alter: MAX = keep) |
//! | 168..172 | `wait_ms`          | u32, poll: how long the owner may park it for new data     |
//! | 172..176 | `generation`       | u32, group: the member's generation (store, assignment)    |
//! | 176..256 | `reserved`         | zero                                                       |
//!
//! **Batch bodies** (a `SendMessages` request, a successful `PollMessages` reply: a sequence of
//! batches, `crate::batch`): `checksum_body` is XXH3-128 of the batches' 32-byte headers only,
//! concatenated in order (`crate::batch::checksum_of_batches`). Each batch header's own
//! `checksum` (XXH3-64 of its message section) covers every other byte, so the body is still
//! covered end to end while the receiver hashes each byte once (issue 12 item 1;
//! `storage/FORMAT.md` section 3, "Which checksum protects what"). A receiver of a batch body
//! must therefore check every batch's checksum (`BatchView::parse` does) before trusting it.
//!
//! The header is cast with bytemuck in native byte order; `lib.rs` refuses to compile on a
//! big-endian target so that native order is the little-endian wire order.

use crate::command::{Command, Operation};
use crate::frame::FrameError;

pub const HEADER_SIZE: usize = 256;
/// 2 since issue 12 item 1: the `checksum_body` of batch bodies covers their batch headers only.
/// 3 since issue 12's timestamp rule: batches carry `MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP`, whose
/// checksum a peer of version 2 would compute without the timestamp and refuse (or, polling, call
/// damage); a version-2 peer is refused at its first frame instead (`ProtocolVersion`).
pub const PROTOCOL_VERSION: u16 = 3;

/// First byte covered by `checksum` (everything after the checksum field itself).
const CHECKSUM_COVERAGE_START: usize = 16;

#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct Header {
    pub checksum: u128,
    pub checksum_body: u128,
    pub cluster: u128,
    pub size: u32,
    pub view: u32,
    pub protocol_version: u16,
    pub command: u8,
    pub replica: u8,
    pub operation: u8,
    pub reserved_prefix: [u8; 3],
    pub client: u128,
    /// Request number chosen by the client; echoed in the reply.
    pub request: u64,
    pub namespace: u64,
    /// Poll: first offset wanted. Send reply: base offset assigned.
    pub offset: u64,
    /// `CreateTopic`: partition count. Poll: max message count. Replies: message count; a Ping
    /// reply: the server's `max_message_size` (bytes).
    pub count: u32,
    /// 0 = success; otherwise an `ErrorCode`, with a UTF-8 message as the body.
    pub error_code: u32,
    pub timestamp_us: u64,
    /// SendMessages and PollMessages replies: the partition's next offset (one past its last
    /// message), so a consumer can tell "caught up" from "beyond the end".
    pub next_offset: u64,
    /// SendMessages and PollMessages replies: the partition's first retained offset.
    pub first_offset: u64,
    /// SendMessages: the idempotent producer id (0 = not idempotent, no deduplication).
    pub producer: u64,
    /// SendMessages with `producer != 0`: the producer's sequence number of this batch's first
    /// message in this partition (each message takes one sequence number).
    pub sequence: u64,
    /// `CreateTopic` / `AlterTopic`: the topic's retention by size, bytes per partition (0 =
    /// unlimited; `AlterTopic`: `u64::MAX` = unchanged).
    pub retention_bytes: u64,
    /// `CreateTopic` / `AlterTopic`: the topic's retention by age, milliseconds (0 = unlimited;
    /// `AlterTopic`: `u64::MAX` = unchanged).
    pub retention_ms: u64,
    /// `PollMessages`: with no message at `offset`, the owner shard may hold the poll this many
    /// milliseconds for one to arrive (0 = answer at once; bounded by the server).
    pub wait_ms: u32,
    /// `StoreOffset` of a group (`count` = 1): the member's generation; `JoinGroup` /
    /// `GroupHeartbeat` replies: the group's generation.
    pub generation: u32,
    pub reserved: [u8; 80],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);
const _: () = assert!(std::mem::offset_of!(Header, checksum_body) == CHECKSUM_COVERAGE_START);

impl Header {
    /// A zeroed header with `protocol_version`, `command` and `operation` set. `size` is 0 until
    /// `set_checksums` (or `encode_frame`) fills it in.
    pub fn new(command: Command, operation: Operation) -> Header {
        let mut header: Header = bytemuck::Zeroable::zeroed();
        header.protocol_version = PROTOCOL_VERSION;
        header.command = command as u8;
        header.operation = operation as u8;
        header
    }

    /// XXH3-128 of header bytes 16..256 (every field but `checksum` itself).
    pub fn calculate_checksum(&self) -> u128 {
        twox_hash::XxHash3_128::oneshot(&bytemuck::bytes_of(self)[CHECKSUM_COVERAGE_START..])
    }

    /// XXH3-128 of a whole body: the `checksum_body` of every frame whose body is not made of
    /// batches (see `body_is_batches`).
    pub fn calculate_checksum_body(body: &[u8]) -> u128 {
        twox_hash::XxHash3_128::oneshot(body)
    }

    /// Whether this frame's body is a sequence of batches, whose `checksum_body` covers only the
    /// batch headers (`crate::batch::checksum_of_batches`): a `SendMessages` request, and a
    /// `PollMessages` reply with `error_code` 0 (an error reply's body is its UTF-8 message).
    pub fn body_is_batches(&self) -> bool {
        let operation = self.operation;
        (self.command == Command::Request as u8 && operation == Operation::SendMessages as u8)
            || (self.command == Command::Reply as u8
                && operation == Operation::PollMessages as u8
                && self.error_code == 0)
    }

    /// The `checksum_body` this header must hold for `body`: XXH3-128 of the batch headers
    /// for a batch body (`body_is_batches`), else of the whole body.
    pub fn checksum_body_of(&self, body: &[u8]) -> u128 {
        if self.body_is_batches() {
            crate::batch::checksum_of_batches(body)
        } else {
            Header::calculate_checksum_body(body)
        }
    }

    /// Seals the header for `body`: sets `size` to 256 + `body.len()`, then `checksum_body`
    /// (`checksum_body_of`, so set `command`, `operation` and `error_code` first), then
    /// `checksum` (last, because it covers the other two). Change no field after this.
    ///
    /// # Panics
    /// If 256 + `body.len()` does not fit the u32 `size` field (a caller bug: bodies are bounded by
    /// the max message size long before that).
    pub fn set_checksums(&mut self, body: &[u8]) {
        let checksum_body = self.checksum_body_of(body);
        self.seal(body.len(), checksum_body);
    }

    /// Seals the header for a body of `body_size` bytes whose `checksum_body` the caller
    /// computed (a poll reply served from files: `crate::batch::BatchesChecksum` over the batch
    /// headers it verified), then sets `checksum`. Change no field after this.
    ///
    /// # Panics
    /// If 256 + `body_size` does not fit the u32 `size` field.
    pub fn seal(&mut self, body_size: usize, checksum_body: u128) {
        let size = HEADER_SIZE + body_size;
        assert!(
            u32::try_from(size).is_ok(),
            "message of {size} bytes does not fit a u32 size"
        );
        self.size = size as u32;
        self.checksum_body = checksum_body;
        self.checksum = self.calculate_checksum();
    }

    /// Whether `checksum` matches the header bytes 16..256.
    pub fn valid_checksum(&self) -> bool {
        self.checksum == self.calculate_checksum()
    }

    /// Whether `checksum_body` matches `body` (`checksum_body_of`). For a batch body this proves
    /// the batch headers only; the batches' own checksums prove the rest.
    pub fn valid_checksum_body(&self, body: &[u8]) -> bool {
        self.checksum_body == self.checksum_body_of(body)
    }

    /// Body bytes announced by `size` (0 if `size` is below 256; validate first).
    pub fn body_size(&self) -> usize {
        (self.size as usize).saturating_sub(HEADER_SIZE)
    }

    /// Checks the header alone, before any body byte is read, in this order (the first failure
    /// wins): header checksum (a bad one means no other field is trusted), `size` within
    /// `[256, max_message_size]`, `protocol_version`, `command`, and `operation`.
    ///
    /// # Errors
    /// - `HeaderChecksum`: `checksum` does not match bytes 16..256.
    /// - `SizeTooSmall`: `size` < 256.
    /// - `SizeTooLarge`: `size` > `max_message_size`.
    /// - `ProtocolVersion`: `protocol_version` != `PROTOCOL_VERSION`.
    /// - `UnknownCommand`: `command` is no `Command`.
    /// - `UnknownOperation`: `operation` of a Request, Reply or Eviction is no `Operation`.
    pub fn validate_prefix(&self, max_message_size: u32) -> Result<(), FrameError> {
        if !self.valid_checksum() {
            return Err(FrameError::HeaderChecksum);
        }
        if (self.size as usize) < HEADER_SIZE {
            return Err(FrameError::SizeTooSmall { size: self.size });
        }
        if self.size > max_message_size {
            return Err(FrameError::SizeTooLarge {
                size: self.size,
                max: max_message_size,
            });
        }
        if self.protocol_version != PROTOCOL_VERSION {
            return Err(FrameError::ProtocolVersion {
                version: self.protocol_version,
            });
        }
        match Command::from_u8(self.command) {
            None => Err(FrameError::UnknownCommand {
                command: self.command,
            }),
            Some(Command::Request | Command::Reply | Command::Eviction) => {
                match Operation::from_u8(self.operation) {
                    None => Err(FrameError::UnknownOperation {
                        operation: self.operation,
                    }),
                    Some(_) => Ok(()),
                }
            }
            // Replica-bus commands carry no client operation; `shards::vsr::wire` checks the
            // rest, and a client connection refuses them (`shards::frame`).
            Some(_) => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::offset_of;

    const MAX: u32 = crate::limits::MESSAGE_SIZE_MAX_DEFAULT;

    fn sealed(body: &[u8]) -> Header {
        let mut header = Header::new(Command::Request, Operation::Ping);
        header.set_checksums(body);
        header
    }

    #[test]
    fn layout_matches_module_doc() {
        assert_eq!(offset_of!(Header, checksum), 0);
        assert_eq!(offset_of!(Header, checksum_body), 16);
        assert_eq!(offset_of!(Header, cluster), 32);
        assert_eq!(offset_of!(Header, size), 48);
        assert_eq!(offset_of!(Header, view), 52);
        assert_eq!(offset_of!(Header, protocol_version), 56);
        assert_eq!(offset_of!(Header, command), 58);
        assert_eq!(offset_of!(Header, replica), 59);
        assert_eq!(offset_of!(Header, operation), 60);
        assert_eq!(offset_of!(Header, reserved_prefix), 61);
        assert_eq!(offset_of!(Header, client), 64);
        assert_eq!(offset_of!(Header, request), 80);
        assert_eq!(offset_of!(Header, namespace), 88);
        assert_eq!(offset_of!(Header, offset), 96);
        assert_eq!(offset_of!(Header, count), 104);
        assert_eq!(offset_of!(Header, error_code), 108);
        assert_eq!(offset_of!(Header, timestamp_us), 112);
        assert_eq!(offset_of!(Header, retention_bytes), 152);
        assert_eq!(offset_of!(Header, retention_ms), 160);
        assert_eq!(offset_of!(Header, wait_ms), 168);
        assert_eq!(offset_of!(Header, generation), 172);
        assert_eq!(offset_of!(Header, next_offset), 120);
        assert_eq!(offset_of!(Header, first_offset), 128);
        assert_eq!(offset_of!(Header, producer), 136);
        assert_eq!(offset_of!(Header, sequence), 144);
        assert_eq!(offset_of!(Header, reserved), 176);
        assert_eq!(std::mem::size_of::<Header>(), 256);
    }

    #[test]
    fn fields_are_little_endian_at_their_offsets() {
        let mut header = Header::new(Command::Reply, Operation::PollMessages);
        header.size = 0x0102_0304;
        header.request = 0x1122_3344_5566_7788;
        let bytes = bytemuck::bytes_of(&header);
        assert_eq!(&bytes[48..52], &[0x04, 0x03, 0x02, 0x01]);
        assert_eq!(&bytes[56..58], &[3, 0]);
        assert_eq!(bytes[58], 2);
        assert_eq!(bytes[60], 8);
        assert_eq!(&bytes[80..88], &0x1122_3344_5566_7788_u64.to_le_bytes());
    }

    #[test]
    fn new_is_zeroed_but_version_command_operation() {
        let header = Header::new(Command::Request, Operation::CreateTopic);
        let mut expected: Header = bytemuck::Zeroable::zeroed();
        expected.protocol_version = 3;
        expected.command = 1;
        expected.operation = 4;
        assert_eq!(header, expected);
    }

    #[test]
    fn checksum_covers_bytes_16_to_256_and_nothing_else() {
        let header = sealed(b"body");
        let original = header.calculate_checksum();
        for index in 0..HEADER_SIZE {
            let mut bytes = *bytemuck::bytes_of(&header)
                .first_chunk::<HEADER_SIZE>()
                .unwrap();
            bytes[index] ^= 0x01;
            let flipped: Header = bytemuck::pod_read_unaligned(&bytes);
            let changed = flipped.calculate_checksum() != original;
            assert_eq!(changed, index >= 16, "byte {index}");
        }
    }

    #[test]
    fn set_checksums_fills_size_and_both_checksums() {
        let header = sealed(b"hello");
        assert_eq!(header.size, 261);
        assert_eq!(
            header.checksum_body,
            twox_hash::XxHash3_128::oneshot(b"hello")
        );
        assert!(header.valid_checksum());
        assert!(header.valid_checksum_body(b"hello"));
        assert!(!header.valid_checksum_body(b"hellO"));
        assert_eq!(header.body_size(), 5);
        assert_eq!(header.validate_prefix(MAX).unwrap(), ());
    }

    #[test]
    fn validate_prefix_rejects_each_field() {
        fn resealed(edit: impl FnOnce(&mut Header)) -> Header {
            let mut header = sealed(b"");
            edit(&mut header);
            header.checksum = header.calculate_checksum();
            header
        }
        let mut header = sealed(b"");
        header.view = 7;
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::HeaderChecksum)
        ));

        let header = resealed(|h| h.size = 255);
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::SizeTooSmall { size: 255 })
        ));
        let header = resealed(|h| h.size = 1001);
        assert!(matches!(
            header.validate_prefix(1000),
            Err(FrameError::SizeTooLarge {
                size: 1001,
                max: 1000
            })
        ));
        assert!(resealed(|h| h.size = 1000).validate_prefix(1000).is_ok());
        let header = resealed(|h| h.protocol_version = PROTOCOL_VERSION + 1);
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::ProtocolVersion { version: 4 })
        ));
        let header = resealed(|h| h.command = 18);
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownCommand { command: 18 })
        ));
        // A replica-bus command carries no client operation.
        let header = resealed(|h| {
            h.command = Command::Prepare as u8;
            h.operation = 0;
        });
        assert!(header.validate_prefix(MAX).is_ok());
        let header = resealed(|h| h.operation = 0);
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownOperation { operation: 0 })
        ));
        let header = resealed(|h| {
            h.command = Command::Reply as u8;
            h.operation = 200;
        });
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownOperation { operation: 200 })
        ));
    }

    #[test]
    fn validate_prefix_accepts_eviction_and_checks_its_operation() {
        let mut header = Header::new(Command::Eviction, Operation::CreateStream);
        header.set_checksums(b"reason");
        assert!(header.validate_prefix(MAX).is_ok());
        let mut header = Header::new(Command::Request, Operation::Register);
        header.set_checksums(b"");
        assert!(header.validate_prefix(MAX).is_ok());
        header.command = Command::Eviction as u8;
        header.operation = 18;
        header.checksum = header.calculate_checksum();
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownOperation { operation: 18 })
        ));
    }

    #[test]
    fn validate_prefix_order_checksum_then_size_then_version_then_command() {
        let mut header = sealed(b"");
        header.size = 1;
        header.protocol_version = 9;
        header.command = 0;
        header.operation = 0;
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::HeaderChecksum)
        ));
        header.checksum = header.calculate_checksum();
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::SizeTooSmall { size: 1 })
        ));
        header.size = 256;
        header.checksum = header.calculate_checksum();
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::ProtocolVersion { version: 9 })
        ));
        header.protocol_version = PROTOCOL_VERSION;
        header.checksum = header.calculate_checksum();
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownCommand { command: 0 })
        ));
        header.command = 1;
        header.checksum = header.calculate_checksum();
        assert!(matches!(
            header.validate_prefix(MAX),
            Err(FrameError::UnknownOperation { operation: 0 })
        ));
    }

    mod properties {
        use super::*;
        use proptest::prelude::*;

        proptest! {
            #![proptest_config(crate::test_support::proptest_config())]

            /// Random bytes never panic and virtually never pass the checksum.
            #[test]
            fn random_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), HEADER_SIZE)) {
                let header: Header = bytemuck::pod_read_unaligned(&bytes);
                prop_assert!(matches!(header.validate_prefix(MAX), Err(FrameError::HeaderChecksum)));
            }

            /// With a valid checksum, the verdict follows the fields exactly.
            #[test]
            fn resealed_random_bytes_follow_the_rules(
                bytes in proptest::collection::vec(any::<u8>(), HEADER_SIZE),
                size in prop_oneof![0u32..1200, any::<u32>()],
                version in 0u16..3,
                command in 0u8..16,
                operation in prop_oneof![0u8..11, any::<u8>()],
                max in prop_oneof![256u32..1200, any::<u32>()],
            ) {
                let mut header: Header = bytemuck::pod_read_unaligned(&bytes);
                header.size = size;
                header.protocol_version = version;
                header.command = command;
                header.operation = operation;
                header.checksum = header.calculate_checksum();
                let verdict = header.validate_prefix(max);
                let expected_ok = size >= 256
                    && size <= max
                    && version == PROTOCOL_VERSION
                    && (1..=17).contains(&command)
                    && ((4..=17).contains(&command) || (1..=9).contains(&operation));
                prop_assert_eq!(verdict.is_ok(), expected_ok, "{:?}", verdict);
            }
        }
    }
}
