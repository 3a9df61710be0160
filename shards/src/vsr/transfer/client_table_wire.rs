//! The client table's transfer encoding (issue 9 section 2, `storage/FORMAT.md` section 11).
//! FOUNDATION STUB: the codec helper fills this in.

use crate::vsr::client_table::ClientTableSnapshot;

/// Why a client-table artifact was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClientTableWireError {
    #[error("client table: {0}")]
    Decode(#[from] storage::codec::DecodeError),
}

/// Longest encoding of a table of `clients_max` sessions with full reply rings (bytes).
pub fn encoded_len_max(clients_max: usize) -> u64 {
    let _ = clients_max;
    todo!("codec helper")
}

/// Encodes `table` (magic, count, entries, trailer).
pub fn encode(table: &ClientTableSnapshot) -> Vec<u8> {
    let _ = table;
    todo!("codec helper")
}

/// Decodes and checks a client table for a receiver holding at most `clients_max` sessions.
///
/// # Errors
/// The first rule the bytes break.
pub fn decode(
    bytes: &[u8],
    clients_max: usize,
) -> Result<ClientTableSnapshot, ClientTableWireError> {
    let _ = (bytes, clients_max);
    todo!("codec helper")
}
