//! The checkpoint snapshot's payload (`storage/FORMAT.md` section 9.1): the metadata state and
//! the client table at `checkpoint_op`, as JSON inside storage's snapshot envelope (magic,
//! version, checkpoint_op, XXH3-64 trailer).
//!
//! Decoding checks every rule the live state keeps before anything uses it; a payload that does
//! not decode or breaks a rule refuses boot, naming the file. It never does I/O.

use crate::metadata::{METADATA_VERSION, MetadataState};
use crate::vsr::client_table::{ClientTable, ClientTableSnapshot};

/// Version of the payload layout; a payload with another version refuses to load.
pub const SNAPSHOT_PAYLOAD_VERSION: u32 = 1;

/// Everything shard 0 needs to resume at `checkpoint_op` without the journal below it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SnapshotPayload {
    pub version: u32,
    /// The op whose effects are the last included; equals the envelope's `checkpoint_op`.
    pub checkpoint_op: u64,
    pub metadata: MetadataState,
    pub client_table: ClientTableSnapshot,
}

/// A decoded, checked snapshot payload.
#[derive(Debug)]
pub struct RestoredSnapshot {
    pub metadata: MetadataState,
    pub client_table: ClientTable,
    /// Sessions dropped because the snapshot held more than `--clients-table-max`.
    pub evicted_clients: Vec<u128>,
}

/// Why a checkpoint's state (from a snapshot at boot, or fetched by state transfer) is not
/// restorable. The replica keeps the state it had; nothing was mutated.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreRefused {
    /// The metadata was written by a build with another layout version.
    #[error(
        "metadata version {found} is not supported (this build reads version {METADATA_VERSION})"
    )]
    MetadataVersion { found: u32 },
    /// The metadata claims effects of an op after the checkpoint.
    #[error("metadata is at op {op}, above the checkpoint op {checkpoint_op}")]
    MetadataAboveCheckpoint { op: u64, checkpoint_op: u64 },
    /// The metadata breaks one of its rules (`MetadataState::check`).
    #[error("metadata breaks a rule: {reason}")]
    MetadataRule { reason: String },
    /// The client table breaks one of its rules (`ClientTable::from_snapshot`).
    #[error("client table breaks a rule: {reason}")]
    ClientTableRule { reason: String },
    /// A session committed after the checkpoint.
    #[error(
        "client table: client {client} committed at op {commit_op}, above the checkpoint op \
         {checkpoint_op}"
    )]
    SessionAboveCheckpoint {
        client: String,
        commit_op: u64,
        checkpoint_op: u64,
    },
}

/// Checks that `metadata` and `client_table` are the state after `checkpoint_op` and keep every
/// rule the live state keeps (phase one of a two-phase restore: issue 9 section 4, DESIGN
/// section 10), and builds the client table of a replica holding at most `clients_max`
/// sessions. Mutates nothing; both the boot path ([`SnapshotPayload::decode`]) and the state
/// transfer receiver use it.
///
/// Returns the table and the sessions evicted because there were more than `clients_max`.
///
/// # Errors
/// The first rule broken, as a [`RestoreRefused`] variant.
///
/// # Panics
/// If `clients_max` is 0 (the configuration validates it).
pub fn check_restorable(
    checkpoint_op: u64,
    metadata: &MetadataState,
    client_table: &ClientTableSnapshot,
    clients_max: usize,
) -> Result<(ClientTable, Vec<u128>), RestoreRefused> {
    if metadata.version != METADATA_VERSION {
        return Err(RestoreRefused::MetadataVersion {
            found: metadata.version,
        });
    }
    if metadata.op > checkpoint_op {
        return Err(RestoreRefused::MetadataAboveCheckpoint {
            op: metadata.op,
            checkpoint_op,
        });
    }
    metadata
        .check()
        .map_err(|reason| RestoreRefused::MetadataRule { reason })?;
    let (table, evicted) = ClientTable::from_snapshot(client_table, clients_max)
        .map_err(|reason| RestoreRefused::ClientTableRule { reason })?;
    if let Some(session) = client_table
        .sessions
        .iter()
        .find(|session| session.commit_op > checkpoint_op)
    {
        return Err(RestoreRefused::SessionAboveCheckpoint {
            client: session.client.clone(),
            commit_op: session.commit_op,
            checkpoint_op,
        });
    }
    Ok((table, evicted))
}

/// The same JSON as [`SnapshotPayload`], from borrowed parts (so a checkpoint serializes the
/// shared state without copying it first).
#[derive(serde::Serialize)]
struct SnapshotPayloadRef<'a> {
    version: u32,
    checkpoint_op: u64,
    metadata: &'a MetadataState,
    client_table: &'a ClientTableSnapshot,
}

/// Encodes the payload of a snapshot at `checkpoint_op` (what [`SnapshotPayload::decode`] reads).
///
/// # Panics
/// Never in practice: the payload is plain data.
pub fn encode_payload(
    checkpoint_op: u64,
    metadata: &MetadataState,
    client_table: &ClientTableSnapshot,
) -> Vec<u8> {
    serde_json::to_vec(&SnapshotPayloadRef {
        version: SNAPSHOT_PAYLOAD_VERSION,
        checkpoint_op,
        metadata,
        client_table,
    })
    .expect("snapshot payload serializes: plain data")
}

impl SnapshotPayload {
    /// # Panics
    /// Never in practice: the payload is plain data.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("snapshot payload serializes: plain data")
    }

    /// Decodes and checks `bytes` taken from a snapshot whose envelope says `checkpoint_op`.
    ///
    /// # Errors
    /// The payload does not decode, has another version, names another op than the envelope,
    /// or its metadata or client table breaks a rule (the message names which).
    pub fn decode(
        bytes: &[u8],
        checkpoint_op: u64,
        clients_max: usize,
    ) -> Result<RestoredSnapshot, String> {
        let payload: SnapshotPayload =
            serde_json::from_slice(bytes).map_err(|e| format!("payload does not decode: {e}"))?;
        if payload.version != SNAPSHOT_PAYLOAD_VERSION {
            return Err(format!(
                "payload version {} is not supported (this build reads version {SNAPSHOT_PAYLOAD_VERSION})",
                payload.version
            ));
        }
        if payload.checkpoint_op != checkpoint_op {
            return Err(format!(
                "payload is for op {} but the envelope says op {checkpoint_op}",
                payload.checkpoint_op
            ));
        }
        let (client_table, evicted_clients) = check_restorable(
            checkpoint_op,
            &payload.metadata,
            &payload.client_table,
            clients_max,
        )
        .map_err(|refused| refused.to_string())?;
        Ok(RestoredSnapshot {
            metadata: payload.metadata,
            client_table,
            evicted_clients,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metadata::MetadataOp;

    fn payload() -> SnapshotPayload {
        let mut metadata = MetadataState::new();
        metadata.apply(
            2,
            &MetadataOp::CreateStream {
                stream_id: 1,
                name: "a".to_owned(),
            },
        );
        let mut table = ClientTable::new(4);
        table.register(9, 1);
        SnapshotPayload {
            version: SNAPSHOT_PAYLOAD_VERSION,
            checkpoint_op: 2,
            metadata,
            client_table: table.to_snapshot(),
        }
    }

    #[test]
    fn borrowed_encoding_is_the_same_json() {
        let payload = payload();
        assert_eq!(
            encode_payload(2, &payload.metadata, &payload.client_table),
            payload.encode()
        );
    }

    #[test]
    fn round_trips() {
        let payload = payload();
        let restored = SnapshotPayload::decode(&payload.encode(), 2, 4).unwrap();
        assert_eq!(restored.metadata, payload.metadata);
        assert_eq!(restored.client_table.session(9).map(|s| s.session), Some(1));
    }

    #[test]
    fn refuses_what_breaks_a_rule() {
        let payload = payload();
        let bytes = payload.encode();
        let cases: Vec<(Vec<u8>, u64, &str)> = vec![
            (bytes.clone(), 3, "envelope says op 3"),
            (b"{".to_vec(), 2, "does not decode"),
            (
                SnapshotPayload {
                    version: 9,
                    ..payload.clone()
                }
                .encode(),
                2,
                "payload version 9",
            ),
            (
                SnapshotPayload {
                    checkpoint_op: 1,
                    ..payload.clone()
                }
                .encode(),
                1,
                "above the checkpoint op",
            ),
        ];
        let nested = String::from_utf8(bytes.clone())
            .unwrap()
            .replacen("\"name\":\"a\"", "\"name\":\"a\",\"bogus\":1", 1)
            .into_bytes();
        assert_ne!(nested, bytes);
        let session_field = String::from_utf8(bytes.clone())
            .unwrap()
            .replacen("\"commit_op\"", "\"bogus\":1,\"commit_op\"", 1)
            .into_bytes();
        assert_ne!(session_field, bytes);
        for unknown in [nested, session_field] {
            let error = SnapshotPayload::decode(&unknown, 2, 4).unwrap_err();
            assert!(error.contains("unknown field"), "{error}");
        }
        for (bytes, op, expected) in cases {
            let error = SnapshotPayload::decode(&bytes, op, 4).unwrap_err();
            assert!(error.contains(expected), "{error} lacks {expected}");
        }
    }
}
