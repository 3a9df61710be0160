//! Shard 0's recovery at boot (DESIGN section 9, `storage/FORMAT.md` sections 7-9), in this
//! order: the superblock (highest valid copy), then the snapshot (envelope trailer, payload
//! rules), then the pairing rule, then the journal (damage at or below the checkpoint op covered
//! by the snapshot and skipped; above it, a torn tail truncated, other damage refused) replayed
//! above the snapshot. A fresh data directory gets a superblock; one from the earlier
//! `metadata.json` format is migrated into a snapshot at op 0.
//!
//! Every refusal names the file and the rule it breaks. It must never boot from a state that
//! differs from what was acknowledged, and never skip, rewrite or delete a damaged file.

use std::cell::{Cell, RefCell};
use std::path::Path;

use futures_util::lock::Mutex;
use storage::journal::{
    DamagedRecord, Journal, JournalConfig, JournalRecovery, JournalScan, TailDisposition,
};
use storage::superblock::{Superblock, SuperblockError, SuperblockState};

use super::client_table::{CachedReply, ClientTable, Lookup, request_checksum};
use super::prepare::{PrepareBody, PrepareOperation};
use super::snapshot::{SNAPSHOT_PAYLOAD_VERSION, SnapshotPayload};
use super::{ReplicaStore, journal_dir, snapshot_path, superblock_path};
use crate::config::ServerConfig;
use crate::metadata::{MetadataOp, MetadataState, store};

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

fn refuse(reason: impl std::fmt::Display) -> String {
    format!("{reason}; refusing to boot")
}

/// Opens (or creates) shard 0's durable state under `config.data_dir` and rebuilds the metadata
/// and client table at the last committed op.
///
/// # Errors
/// A message naming the file and the rule: an unreadable superblock (all copies invalid, or
/// copies contradicting each other), a snapshot whose trailer, envelope or payload is damaged, a
/// pairing broken (snapshot missing, older than the superblock's checkpoint, or the same op with
/// another checksum), journal damage above the checkpoint op that a torn tail does not explain
/// (damage at or below it is covered by the snapshot and only logged), no journal segment at
/// all, a gap between snapshot and journal, a journal record that does not apply, or an I/O
/// failure.
///
/// # Cancel safety
/// Not cancel safe; runs once at boot.
pub async fn open(config: &ServerConfig) -> Result<(ReplicaStore, MetadataState), String> {
    let data_dir = config.data_dir.as_path();
    let superblock_file = superblock_path(data_dir);
    let snapshot_file = snapshot_path(data_dir);
    let superblock = match Superblock::open(&superblock_file).await {
        Ok((superblock, report)) => {
            for (copy_index, defect) in report.invalid_copies() {
                tracing::warn!(
                    path = %superblock_file.display(), copy_index, %defect,
                    "superblock copy invalid; booting from the newest valid copy, the next \
                     checkpoint rewrites it"
                );
            }
            let legacy_file = store::metadata_path(data_dir);
            if compio::fs::metadata(&legacy_file).await.is_ok() {
                tracing::warn!(
                    path = %legacy_file.display(),
                    "ignoring metadata.json: this directory was migrated to the journal format \
                     (a crash after the migration can leave it); it may be removed"
                );
            }
            superblock
        }
        Err(SuperblockError::NotFound { .. }) => format(data_dir).await?,
        Err(error) => return Err(refuse(error)),
    };
    let superblock_state = *superblock.state();
    if superblock_state.replica_count != 1 {
        return Err(refuse(format!(
            "{}: replica_count is {}, but this build runs a single replica",
            superblock_file.display(),
            superblock_state.replica_count
        )));
    }

    let clients_max = config.clients_table_max;
    let snapshot = storage::snapshot::read_snapshot(&snapshot_file)
        .await
        .map_err(refuse)?;
    let (mut metadata, mut client_table, snapshot_op) = match snapshot {
        None => {
            if superblock_state.checkpoint_op != 0 || superblock_state.snapshot_checksum != 0 {
                return Err(refuse(format!(
                    "{}: missing, but {} records a checkpoint at op {} (checksum {:#018x})",
                    snapshot_file.display(),
                    superblock_file.display(),
                    superblock_state.checkpoint_op,
                    superblock_state.snapshot_checksum
                )));
            }
            (MetadataState::new(), ClientTable::new(clients_max), 0)
        }
        Some(snapshot) => {
            check_pairing(
                &snapshot_file,
                &superblock_file,
                &superblock_state,
                snapshot.checkpoint_op,
                snapshot.checksum,
            )?;
            let restored =
                SnapshotPayload::decode(&snapshot.payload, snapshot.checkpoint_op, clients_max)
                    .map_err(|reason| {
                        refuse(format!(
                            "{}: snapshot payload at op {}: {reason}",
                            snapshot_file.display(),
                            snapshot.checkpoint_op
                        ))
                    })?;
            if !restored.evicted_clients.is_empty() {
                tracing::warn!(
                    evicted_count = restored.evicted_clients.len(),
                    clients_table_max = clients_max,
                    "the snapshot holds more client sessions than --clients-table-max; the least \
                     recently committed were evicted and are told so on their next request"
                );
            }
            (
                restored.metadata,
                restored.client_table,
                snapshot.checkpoint_op,
            )
        }
    };

    let journal_path = journal_dir(data_dir);
    let journal_present = {
        let journal_path = journal_path.clone();
        compio::runtime::spawn_blocking(move || !journal_segment_sizes(&journal_path).is_empty())
            .await
    };
    if !matches!(journal_present, Ok(true)) {
        // Format creates the journal before the superblock, so it was removed. The superblock
        // cannot say whether ops above the checkpoint were acknowledged since: `commit_max` is
        // written only at a checkpoint, so it equals `checkpoint_op` either way. Booting could
        // silently drop them.
        let checkpoint_op = superblock_state.checkpoint_op;
        return Err(refuse(format!(
            "{}: no journal segment, but {} exists (the journal is created before the superblock, \
             so it was removed): any ops acknowledged since checkpoint op {checkpoint_op} would \
             be lost, and the superblock cannot tell whether there were any (its commit_max \
             {} is written only at checkpoints). Restore the journal; or, if the server's last \
             log lines show a clean stop with \"checkpoint done\" at checkpoint_op \
             {checkpoint_op} (every acknowledged op is then in the snapshot), create the empty \
             segment {}",
            journal_path.display(),
            superblock_file.display(),
            superblock_state.commit_max,
            storage::journal::segment_path(&journal_path, checkpoint_op + 1).display()
        )));
    }
    // Decide first, write after: the journal is scanned read-only, checked against the snapshot
    // and replayed, and only then repaired (a torn tail cut, or a segment started after a
    // damaged record the snapshot covers), so a refusal leaves every file as it was.
    let scan = Journal::scan(&journal_path, snapshot_op)
        .await
        .map_err(refuse)?;
    check_journal_span(&scan, &journal_path, &snapshot_file, snapshot_op)?;
    let replayed_count = replay_journal(
        scan.recovery(),
        &journal_path,
        snapshot_op,
        &mut metadata,
        &mut client_table,
    )?;
    warn_about_orphan_partitions(data_dir, &metadata).await;
    let (journal, recovery) = Journal::open_scanned(scan, JournalConfig::default())
        .await
        .map_err(refuse)?;
    for damaged in &recovery.damaged_records {
        warn_damaged_record(damaged, snapshot_op);
    }
    let commit_min = journal.last_op().max(snapshot_op);
    tracing::info!(
        checkpoint_op = superblock_state.checkpoint_op,
        snapshot_op,
        replayed_count,
        commit_min,
        sessions = client_table.session_count(),
        "metadata recovered"
    );
    let replica = ReplicaStore {
        data_dir: data_dir.to_path_buf(),
        journal: Mutex::new(journal),
        checkpoint_lock: Mutex::new(()),
        superblock_lock: Mutex::new(superblock),
        commit_min: Cell::new(commit_min),
        checkpoint_op: Cell::new(snapshot_op),
        checkpoint_interval: config.checkpoint_interval,
        checkpoint_pending: Cell::new(false),
        checkpoint_op_in_progress: Cell::new(0),
        client_table: RefCell::new(client_table),
    };
    Ok((replica, metadata))
}

/// The journal must reach the snapshot: it may not end below `snapshot_op` (records the snapshot
/// was taken after are missing) nor start above `snapshot_op + 1` (ops between them are missing).
/// A damaged last record the snapshot covers does not end it below: `scan.last_op()` is then
/// `snapshot_op` (the journal continues at `snapshot_op + 1`).
fn check_journal_span(
    scan: &JournalScan,
    journal_path: &Path,
    snapshot_file: &Path,
    snapshot_op: u64,
) -> Result<(), String> {
    if scan.last_op() < snapshot_op {
        return Err(refuse(format!(
            "{}: ends at op {} but the snapshot {} is at op {snapshot_op}: journal records are \
             missing",
            journal_path.display(),
            scan.last_op(),
            snapshot_file.display()
        )));
    }
    if scan.first_op() > snapshot_op + 1 {
        return Err(refuse(format!(
            "{}: starts at op {} but the snapshot {} covers only ops up to {snapshot_op}: ops {} \
             to {} are missing",
            journal_path.display(),
            scan.first_op(),
            snapshot_file.display(),
            snapshot_op + 1,
            scan.first_op() - 1
        )));
    }
    Ok(())
}

/// Applies every journaled prepare above `snapshot_op` to `metadata` and `client_table`, in op
/// order; returns how many. A record that does not decode or apply is named by file, byte and
/// op in the refusal.
fn replay_journal(
    recovery: &JournalRecovery,
    journal_path: &Path,
    snapshot_op: u64,
    metadata: &mut MetadataState,
    client_table: &mut ClientTable,
) -> Result<u64, String> {
    assert_eq!(
        recovery.prepares.len(),
        recovery.record_positions.len(),
        "the journal reports one position per record"
    );
    let mut replayed_count = 0u64;
    let replay = recovery
        .prepares
        .iter()
        .zip(&recovery.record_positions)
        .filter(|(prepare, _)| prepare.op > snapshot_op);
    for (prepare, &(segment_first_op, position)) in replay {
        // Names the record as `FILE at byte N (op K)`, the way journal damage is named.
        let record = || {
            format!(
                "{} at byte {position} (op {})",
                storage::journal::segment_path(journal_path, segment_first_op).display(),
                prepare.op
            )
        };
        let body = PrepareBody::decode(&prepare.body).map_err(|reason| {
            refuse(format!(
                "{}: the prepare body does not decode: {reason}",
                record()
            ))
        })?;
        apply_prepare(metadata, client_table, prepare.op, &body)
            .map_err(|reason| refuse(format!("{}: {reason}", record())))?;
        replayed_count += 1;
    }
    Ok(replayed_count)
}

/// Logs what boot did with a damaged journal record, naming file, byte and op. Only a record
/// above the checkpoint can be a prepare that was never acknowledged (the journal fsyncs each
/// prepare before it is acknowledged, so a crash can tear only an unacknowledged one); one at or
/// below it was acknowledged, and the snapshot holds it.
fn warn_damaged_record(damaged: &DamagedRecord, snapshot_op: u64) {
    match damaged.disposition {
        TailDisposition::Truncated => tracing::warn!(
            path = %damaged.path.display(), position = damaged.position, op = damaged.op,
            truncated_bytes = damaged.size_bytes, checkpoint_op = snapshot_op,
            reason = %damaged.reason,
            "journal had a torn tail; truncated it. Its op is above the checkpoint op, so if a \
             crash cut the write short that prepare was never acknowledged"
        ),
        TailDisposition::CoveredBySnapshot { resume_op } => tracing::warn!(
            path = %damaged.path.display(), position = damaged.position, op = damaged.op,
            skipped_bytes = damaged.size_bytes, checkpoint_op = snapshot_op, resume_op,
            reason = %damaged.reason,
            "damaged journal record covered by the snapshot (its op is at or below the \
             checkpoint op, so the snapshot holds it and it is never replayed); left in place, \
             the journal resumes at resume_op and the next checkpoint releases the damaged segment"
        ),
        // Boot opens the journal without repair from peers, so this never comes back here
        // (placeholder arm until boot's typed results land, branch wt3).
        TailDisposition::AwaitingRepair { highest_op } => tracing::warn!(
            path = %damaged.path.display(), position = damaged.position, op = damaged.op,
            highest_op, reason = %damaged.reason,
            "damaged journal record awaiting repair from peers"
        ),
    }
}

/// Logs partition directories the recovered metadata does not name: a deletion whose
/// directory removal a crash interrupted (the delete is committed), or a topic whose creation
/// never committed. They are left in place (never delete data on a guess); creating a topic
/// with the same ids removes them, and an operator may delete them.
async fn warn_about_orphan_partitions(data_dir: &Path, metadata: &MetadataState) {
    let partitions = data_dir.join(crate::limits::PARTITIONS_DIR_NAME);
    let known: std::collections::BTreeSet<(u32, u16)> = metadata
        .streams
        .iter()
        .flat_map(|(stream_id, stream)| {
            stream.topics.keys().map(|topic_id| (*stream_id, *topic_id))
        })
        .collect();
    let scan = compio::runtime::spawn_blocking(move || {
        let mut orphans = Vec::new();
        let Ok(streams) = std::fs::read_dir(&partitions) else {
            return orphans;
        };
        for stream in streams.flatten() {
            let stream_id = stream
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<u32>().ok());
            let Ok(topics) = std::fs::read_dir(stream.path()) else {
                continue;
            };
            for topic in topics.flatten() {
                let topic_id = topic
                    .file_name()
                    .to_str()
                    .and_then(|n| n.parse::<u16>().ok());
                let named =
                    matches!((stream_id, topic_id), (Some(s), Some(t)) if known.contains(&(s, t)));
                if !named {
                    orphans.push(topic.path());
                }
            }
        }
        orphans
    })
    .await;
    let Ok(orphans) = scan else {
        return;
    };
    if !orphans.is_empty() {
        let shown: Vec<String> = orphans
            .iter()
            .take(10)
            .map(|path| path.display().to_string())
            .collect();
        tracing::warn!(
            orphan_count = orphans.len(),
            first = %shown.join(", "),
            "partition directories that no topic names (a deletion interrupted by a crash, or a \
             creation that never committed): left in place; creating a topic with the same ids \
             removes them, or delete them by hand"
        );
    }
}

/// The sizes of the `*.wal` files in `dir` (empty if there are none or it cannot be listed):
/// whether a journal exists, and whether it holds records. Blocking; run off the reactor.
fn journal_segment_sizes(dir: &Path) -> Vec<u64> {
    std::fs::read_dir(dir).map_or_else(
        |_| Vec::new(),
        |entries| {
            entries
                .flatten()
                .filter(|entry| entry.path().extension().is_some_and(|e| e == "wal"))
                .map(|entry| entry.metadata().map_or(0, |m| m.len()))
                .collect()
        },
    )
}

/// The pairing rule (DESIGN section 9): the snapshot may not be older than the superblock's
/// checkpoint, nor at the same op with another checksum. A newer one is the crash between the
/// snapshot's rename and the superblock write: the journal above the old checkpoint is intact
/// (it is released only after the superblock write), so it is used.
fn check_pairing(
    snapshot_file: &Path,
    superblock_file: &Path,
    superblock: &SuperblockState,
    snapshot_op: u64,
    snapshot_checksum: u64,
) -> Result<(), String> {
    if snapshot_op < superblock.checkpoint_op {
        return Err(refuse(format!(
            "{}: snapshot is at op {snapshot_op}, older than the checkpoint op {} recorded in {} \
             (pairing rule)",
            snapshot_file.display(),
            superblock.checkpoint_op,
            superblock_file.display()
        )));
    }
    if snapshot_op == superblock.checkpoint_op && snapshot_checksum != superblock.snapshot_checksum
    {
        return Err(refuse(format!(
            "{}: snapshot at op {snapshot_op} has checksum {snapshot_checksum:#018x}, but {} \
             records {:#018x} for that op (pairing rule)",
            snapshot_file.display(),
            superblock_file.display(),
            superblock.snapshot_checksum
        )));
    }
    if snapshot_op > superblock.checkpoint_op {
        tracing::warn!(
            snapshot_op,
            superblock_checkpoint_op = superblock.checkpoint_op,
            "snapshot is newer than the superblock's checkpoint (a crash between the snapshot \
             rename and the superblock write); booting from it, the next checkpoint records it"
        );
    }
    Ok(())
}

/// Formats a data directory without a superblock: refuses if it holds a journal or snapshot
/// (their superblock was lost), migrates `metadata.json` (the pre-journal format) into a
/// snapshot at op 0, and creates the superblock.
async fn format(data_dir: &Path) -> Result<Superblock, String> {
    let superblock_file = superblock_path(data_dir);
    let snapshot_file = snapshot_path(data_dir);
    let journal_path = journal_dir(data_dir);
    let probe = {
        let (journal_path, snapshot_file) = (journal_path.clone(), snapshot_file.clone());
        let legacy_file = store::metadata_path(data_dir);
        // A few stats and a directory listing, once at boot: off the reactor anyway.
        compio::runtime::spawn_blocking(move || {
            (
                journal_segment_sizes(&journal_path)
                    .iter()
                    .any(|&size| size > 0),
                snapshot_file.exists(),
                legacy_file.exists(),
            )
        })
        .await
    };
    let Ok((journal_has_records, snapshot_exists, legacy)) = probe else {
        return Err(refuse("the data directory probe task failed"));
    };
    // Format writes snapshot (migration only) and an empty journal before the superblock, so
    // those alone are what a crash during format leaves: format again. Journal records, or a
    // snapshot without metadata.json to migrate, mean a superblock existed and was lost.
    if journal_has_records || (snapshot_exists && !legacy) {
        return Err(refuse(format!(
            "{}: missing, but {} exists: the superblock that pairs with it was lost. Restore \
             the superblock from a backup; do not start this directory empty, its partition data \
             would be orphaned",
            superblock_file.display(),
            if journal_has_records {
                journal_path.display()
            } else {
                snapshot_file.display()
            }
        )));
    }
    // Cluster 0, replica 0 of 1, everything else at its start.
    let mut state = SuperblockState {
        replica_count: 1,
        ..SuperblockState::default()
    };
    let legacy_file = store::metadata_path(data_dir);
    if legacy {
        let mut metadata = store::load(data_dir).await.map_err(refuse)?;
        // The journal starts over at op 1: the old op numbers describe a log that no longer
        // exists, and the state machine's op must not be above the snapshot's.
        metadata.op = 0;
        let payload = SnapshotPayload {
            version: SNAPSHOT_PAYLOAD_VERSION,
            checkpoint_op: 0,
            metadata,
            client_table: ClientTable::new(1).to_snapshot(),
        };
        // Refuse before anything is written if boot would refuse the result: metadata.json is
        // removed below, and must never be traded for a snapshot that cannot load.
        SnapshotPayload::decode(&payload.encode(), 0, 1).map_err(|reason| {
            refuse(format!(
                "{}: cannot be migrated: {reason}",
                legacy_file.display()
            ))
        })?;
        state.snapshot_checksum =
            storage::snapshot::write_snapshot(&snapshot_file, 0, payload.encode(), &mut |_| {})
                .await
                .map_err(refuse)?;
    }
    // The journal before the superblock: a superblock without a journal then always means the
    // journal was lost (boot refuses), never an interrupted format.
    Journal::open(&journal_path).await.map_err(refuse)?;
    let superblock = Superblock::create(&superblock_file, state)
        .await
        .map_err(refuse)?;
    if legacy {
        // The snapshot and the superblock that pairs with it are durable: the old file is now
        // redundant, and keeping it would suggest it is still read.
        if let Err(error) = compio::fs::remove_file(&legacy_file).await {
            tracing::warn!(path = %legacy_file.display(), %error, "cannot remove the migrated metadata.json");
        }
        tracing::info!(
            from = %legacy_file.display(), to = %snapshot_file.display(),
            "migrated metadata.json into a snapshot at op 0"
        );
    } else {
        tracing::info!(path = %superblock_file.display(), "formatted a new data directory");
    }
    Ok(superblock)
}
