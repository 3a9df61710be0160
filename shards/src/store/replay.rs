//! Applying committed prepares on the single-replica commit path that `Shard` runs today, and
//! the boot that rebuilds its state by replaying the journal ([`open`]). The replicated driver
//! replaces both: the core (`crate::vsr::replica`) applies prepares, and boot returns what it
//! recovered (`super::boot::recover`). Until then this keeps `serve` working as before.

use std::cell::Cell;

use futures_util::lock::Mutex;

use super::ReplicaStore;
use super::boot::{BootError, RecoveryOutcome, recover, warn_about_orphan_partitions};
use crate::config::ServerConfig;
use crate::metadata::{MetadataOp, MetadataState};
use crate::vsr::client_table::{CachedReply, ClientTable, Lookup, request_checksum};
use crate::vsr::prepare::{PrepareBody, PrepareOperation};

/// The checksum of a metadata change's arguments (see [`CachedReply::request_checksum`]).
pub fn change_checksum(op: &MetadataOp) -> u64 {
    request_checksum(&serde_json::to_vec(op).expect("metadata op serializes: plain data"))
}

/// The reply a committed metadata change sent (and a duplicate gets again).
pub fn change_reply(request: u64, op: &MetadataOp) -> CachedReply {
    let operation = match op {
        MetadataOp::CreateStream { .. } => bus::Operation::CreateStream,
        MetadataOp::DeleteStream { .. } => bus::Operation::DeleteStream,
        MetadataOp::CreateTopic { .. } => bus::Operation::CreateTopic,
        MetadataOp::DeleteTopic { .. } => bus::Operation::DeleteTopic,
    };
    CachedReply {
        request,
        operation: operation as u8,
        error_code: 0,
        offset: 0,
        count: 0,
        body: Vec::new(),
        request_checksum: change_checksum(op),
    }
}

/// What applying one committed prepare did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// A session opened; `evicted` lost its slot to make room.
    Registered { session: u64, evicted: Option<u128> },
    /// A metadata change was applied to `MetadataState` (the caller applies it elsewhere too).
    Changed,
}

/// Applies committed prepare `op` to the client table and, for a change, to `metadata`. The live
/// commit path and boot replay both use it, so replay rebuilds exactly what the server had.
///
/// # Errors
/// The body's client id is invalid, a change does not validate against `metadata`, or the
/// request number does not advance the session: a journal that cannot have been written by
/// this replica (the caller refuses to boot).
pub fn apply_prepare(
    metadata: &mut MetadataState,
    client_table: &mut ClientTable,
    op: u64,
    body: &PrepareBody,
) -> Result<Applied, String> {
    let client = body.client_id()?;
    match &body.operation {
        PrepareOperation::Register => {
            let evicted = client_table.register(client, op);
            Ok(Applied::Registered {
                session: op,
                evicted,
            })
        }
        PrepareOperation::Metadata(change) => {
            metadata
                .validate(change)
                .map_err(|rejection| format!("{change:?} does not apply: {}", rejection.message))?;
            match client_table.lookup(client, body.request) {
                Lookup::New => {
                    client_table.commit(client, op, change_reply(body.request, change));
                }
                // Evicted at boot because --clients-table-max was lowered: the change still
                // committed; only its cached reply is lost (the client is told it was evicted).
                Lookup::NoSession => {}
                Lookup::Cached(_) | Lookup::Stale { .. } => {
                    return Err(format!(
                        "client {client:#034x} request {} was already committed",
                        body.request
                    ));
                }
            }
            metadata.apply(op, change);
            Ok(Applied::Changed)
        }
    }
}

/// Opens shard 0's durable state for the single-replica commit path: [`recover`], then replays
/// the journaled prepares above the checkpoint into the metadata and client table with
/// [`apply_prepare`], so the server has exactly the state it acknowledged.
///
/// # Errors
/// As [`recover`]; and [`BootError::Refuse`] when a journaled prepare does not apply (named by
/// file, byte and op), or when `config` names a cluster (`--addresses`: this commit path runs a
/// single replica; the replicated driver boots through [`recover`]), checked before anything is
/// formatted.
///
/// # Cancel safety
/// Not cancel safe; runs once at boot.
pub async fn open(config: &ServerConfig) -> Result<(ReplicaStore, MetadataState), BootError> {
    let data_dir = config.data_dir.as_path();
    if config.replica_count() != 1 {
        return Err(BootError::Refuse {
            path: data_dir.to_path_buf(),
            rule: format!(
                "{}: --addresses names {} replicas, but the single-replica commit path cannot \
                 serve a replica of a cluster",
                data_dir.display(),
                config.replica_count()
            ),
        });
    }
    let boot = recover(config).await?;
    // A single replica refuses what a cluster would repair or transfer: recover never reports it.
    assert_eq!(
        boot.outcome,
        RecoveryOutcome::Clean,
        "a single replica's boot is clean or refused"
    );
    let mut recovered = boot.recovered;
    let journal_path = boot.journal.dir().to_path_buf();
    for (prepare, &(segment_first_op, position)) in
        recovered.prepares.iter().zip(&boot.prepare_positions)
    {
        let path = storage::journal::segment_path(&journal_path, segment_first_op);
        let refuse = |reason: String| BootError::Refuse {
            path: path.clone(),
            rule: format!(
                "{} at byte {position} (op {}): {reason}",
                path.display(),
                prepare.op
            ),
        };
        // Boot checked that every body decodes.
        let body = PrepareBody::decode(&prepare.body).map_err(&refuse)?;
        apply_prepare(
            &mut recovered.metadata,
            &mut recovered.client_table,
            prepare.op,
            &body,
        )
        .map_err(&refuse)?;
    }
    warn_about_orphan_partitions(data_dir, &recovered.metadata).await;
    let commit_min = boot.journal.last_op().max(recovered.checkpoint_op);
    tracing::info!(
        checkpoint_op = recovered.checkpoint_op,
        replayed_count = recovered.prepares.len(),
        commit_min,
        "metadata replayed"
    );
    let replica = ReplicaStore {
        data_dir: data_dir.to_path_buf(),
        journal: Mutex::new(boot.journal),
        checkpoint_lock: Mutex::new(()),
        superblock_lock: Mutex::new(boot.superblock),
        commit_min: Cell::new(commit_min),
        checkpoint_op: Cell::new(recovered.checkpoint_op),
    };
    Ok((replica, recovered.metadata))
}
