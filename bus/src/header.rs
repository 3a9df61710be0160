//! The 256-byte message header (DESIGN section 5), a `#[repr(C)]` bytemuck type.
//!
//! Layout (little-endian): 0 checksum u128 (XXH3-128 of bytes 16..256), 16 checksum_body u128
//! (XXH3-128 of the body), 32 cluster u128, 48 size u32 (whole message), 52 view u32,
//! 56 protocol_version u16, 58 command u8, 59 replica u8, 60 operation u8, 61..64 reserved,
//! 64 client u128, 80 request u64, 88 namespace u64, 96 offset u64, 104 count u32,
//! 108 error_code u32, 112 timestamp_us u64, 120..256 reserved (zero).

pub const HEADER_SIZE: usize = 256;
pub const PROTOCOL_VERSION: u16 = 1;

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
    /// CreateTopic: partition count. Poll: max message count. Replies: message count.
    pub count: u32,
    /// 0 = success; otherwise an `ErrorCode`, with a UTF-8 message as the body.
    pub error_code: u32,
    pub timestamp_us: u64,
    pub reserved: [u8; 136],
}

const _: () = assert!(std::mem::size_of::<Header>() == HEADER_SIZE);

impl Header {
    /// A zeroed header with protocol_version set.
    pub fn new(command: crate::Command, operation: crate::Operation) -> Header {
        todo!("{command:?}{operation:?}")
    }
    /// XXH3-128 of header bytes 16..256.
    pub fn calculate_checksum(&self) -> u128 {
        todo!()
    }
}
