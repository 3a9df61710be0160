//! Shard 0's recovery at boot (DESIGN section 9, `storage/FORMAT.md` sections 7-10), in this
//! order: the superblock (highest valid copy), the cluster identity it was formatted for (issue 8
//! section 3), the snapshot (envelope trailer, payload rules), the pairing rule, then the journal
//! (damage at or below the checkpoint op covered by the snapshot and skipped; above it, a torn
//! tail truncated, other damage refused by a single replica and kept for repair from peers by a
//! replica of a cluster), every journaled body decoded and its parent chain checked. A fresh data
//! directory gets a superblock; one from the earlier `metadata.json` format is migrated into a
//! snapshot at op 0.
//!
//! Last, a superblock of an older version is upgraded to `SUPERBLOCK_VERSION` (issue 12's
//! downgrade guard, `storage/FORMAT.md` section 7 "Versions"): boot returns before any partition
//! log opens, so no entry under a checksum rule of the current version (flag bit 1 since version
//! 2, bit 2 since version 3: `storage/FORMAT.md` section 3) is written while a binary that reads
//! only an older version could still boot the directory.
//!
//! Boot does not replay the journal: it returns what it recovered ([`Boot`]: the core's
//! [`Recovered`], the [`RecoveryOutcome`], and the open journal and superblock for the driver),
//! and the core applies the prepares above the checkpoint at `Replica::open`.
//!
//! Every refusal names the file and the rule it breaks. It must never boot from a state that
//! differs from what was acknowledged, and never skip, rewrite or delete a damaged file.

use std::path::{Path, PathBuf};

use storage::journal::{
    DamagedRecord, Journal, JournalConfig, JournalError, JournalHeader, JournalRecovery,
    JournalScan, TailDisposition, UncoveredDamage,
};
use storage::snapshot::SnapshotError;
use storage::superblock::{Superblock, SuperblockError, SuperblockState};

use super::{journal_dir, snapshot_path, superblock_path};
use crate::config::ServerConfig;
use crate::metadata::{MetadataState, store};
use crate::vsr::client_table::ClientTable;
use crate::vsr::prepare::PrepareBody;
use crate::vsr::replica::Recovered;
use crate::vsr::snapshot::{SNAPSHOT_PAYLOAD_VERSION, SnapshotPayload};

/// Why boot stopped. Every variant refuses to boot; they differ in what the operator does.
#[derive(Debug, thiserror::Error)]
pub enum BootError {
    /// A file breaks a rule of the format (damage a torn write cannot explain, a broken pairing,
    /// a journal that does not reach the snapshot, a body that does not decode, a broken parent
    /// chain, a lost superblock): the operator must act (restore the file from a backup, or for
    /// a replica of a cluster, reformat it so it rejoins by state transfer). `rule` is a sentence
    /// naming the file (`path`), the byte or op where it applies, and the rule.
    #[error("{rule}; refusing to boot")]
    Refuse { path: PathBuf, rule: String },
    /// The data directory was formatted for another cluster, replica index or replica count
    /// (issue 8 section 3): the server was started on the wrong directory or with the wrong
    /// flags. Names both values and the flag that sets the configured one.
    #[error(
        "{path}: the data directory was formatted for {field} {formatted}, but {flag} gives \
         {configured}; refusing to boot: {}, or give this replica a new data directory",
        identity_fix(field, flag, formatted)
    )]
    Identity {
        path: PathBuf,
        /// `cluster`, `replica index` or `replica count`.
        field: &'static str,
        formatted: String,
        configured: String,
        /// The `serve` flag (and environment variable) that sets the configured value.
        flag: &'static str,
    },
    /// The superblock holds a copy of a version this binary does not read (`source` is
    /// [`SuperblockError::UnsupportedVersion`], naming the path, the copy, the version found and
    /// the versions read): a newer shardline wrote the data directory (the operator starts a
    /// binary that reads version `found`), or, below the first version, no shardline did (the
    /// operator restores the directory). Nothing was written.
    #[error("{source}; refusing to boot")]
    UnsupportedVersion {
        path: PathBuf,
        found: u16,
        source: SuperblockError,
    },
    /// An I/O step failed (`step` on `path`): the files may be fine; retrying the start may
    /// succeed once the cause (permissions, a full disk, descriptors) is fixed.
    #[error("{path}: {step} failed: {source}; refusing to boot")]
    Io {
        path: PathBuf,
        step: &'static str,
        source: std::io::Error,
    },
}

impl BootError {
    fn refuse(path: &Path, rule: impl Into<String>) -> BootError {
        BootError::Refuse {
            path: path.to_path_buf(),
            rule: rule.into(),
        }
    }
}

impl From<JournalError> for BootError {
    fn from(error: JournalError) -> BootError {
        match error {
            JournalError::Io {
                path, op, source, ..
            }
            | JournalError::StorageFull {
                path, op, source, ..
            } => BootError::Io {
                path,
                step: op,
                source,
            },
            JournalError::Corrupt { ref path, .. }
            | JournalError::Poisoned { ref path, .. }
            | JournalError::DamagedTail { ref path, .. } => {
                BootError::refuse(&path.clone(), error.to_string())
            }
            // Boot neither appends nor truncates nor configures: not reached, but typed.
            JournalError::BodyTooLarge { .. }
            | JournalError::InvalidConfig(_)
            | JournalError::TruncateBelowReleased { .. } => BootError::Refuse {
                path: PathBuf::new(),
                rule: error.to_string(),
            },
        }
    }
}

impl From<SuperblockError> for BootError {
    fn from(error: SuperblockError) -> BootError {
        match error {
            SuperblockError::Io { path, op, source } => BootError::Io {
                path,
                step: op,
                source,
            },
            SuperblockError::UnsupportedVersion {
                ref path, found, ..
            } => BootError::UnsupportedVersion {
                path: path.clone(),
                found,
                source: error,
            },
            SuperblockError::NotFound { ref path }
            | SuperblockError::AlreadyExists { ref path }
            | SuperblockError::AllCopiesInvalid { ref path, .. }
            | SuperblockError::Corrupt { ref path, .. }
            | SuperblockError::Poisoned { ref path } => {
                BootError::refuse(&path.clone(), error.to_string())
            }
        }
    }
}

impl From<SnapshotError> for BootError {
    fn from(error: SnapshotError) -> BootError {
        match error {
            SnapshotError::Io { path, op, source } => BootError::Io {
                path,
                step: op,
                source,
            },
            SnapshotError::Corrupt { ref path, .. }
            | SnapshotError::PayloadTooLarge { ref path, .. } => {
                BootError::refuse(&path.clone(), error.to_string())
            }
        }
    }
}

/// What the journal above the checkpoint needs before the replica can serve (issue 8 section 1:
/// the caller must tell "repair from peers" and "needs state transfer" from a clean boot; a
/// refusal is a [`BootError`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecoveryOutcome {
    /// Every record above the checkpoint is valid and chained; `Recovered::prepares` runs up to
    /// `journal_last_op`.
    Clean,
    /// A replica of a cluster whose journal is damaged above the checkpoint where a torn write
    /// cannot explain it (FORMAT.md section 8, open step 5c): `Recovered::prepares` stops at
    /// `damaged_op - 1`, the damaged record (byte `position` of `path`) and what follows it stay
    /// in place, and the journal refuses appends until the core truncates it at or below
    /// `damaged_op - 1` (`Journal::truncate_after`). Ops `damaged_op..=highest_op` (at least)
    /// must come from the peers.
    RepairFromPeers {
        path: PathBuf,
        position: u64,
        damaged_op: u64,
        highest_op: u64,
    },
    /// A replica of a cluster whose journal starts at `journal_first_op`, above
    /// `checkpoint_op + 1`: ops `checkpoint_op + 1 .. journal_first_op` are in neither the
    /// snapshot nor the journal. Peers may still hold them (repair) or may have released them
    /// too (state transfer, the next issue); boot cannot know which, so it reports the local
    /// fact. `Recovered::prepares` is empty (nothing is contiguous from the checkpoint).
    NeedsStateTransfer {
        checkpoint_op: u64,
        journal_first_op: u64,
    },
}

/// What boot recovered: the core's input and the driver's open handles.
#[derive(Debug)]
pub struct Boot {
    /// The input of `Replica::open`: superblock view, log view and commit max, the snapshot's
    /// state at its checkpoint op, and the valid contiguous prepares above it.
    pub recovered: Recovered,
    /// Where each of `recovered.prepares` lies, same order: (first op of its segment, naming the
    /// file via `storage::journal::segment_path`, and its byte position), so a caller that
    /// refuses one can name it.
    pub prepare_positions: Vec<(u64, u64)>,
    pub outcome: RecoveryOutcome,
    /// The journal, open for appends (unless damage awaits repair: see
    /// [`RecoveryOutcome::RepairFromPeers`]).
    pub journal: Journal,
    /// The superblock, open for writes; its `state()` is what boot verified.
    pub superblock: Superblock,
}

/// Opens (or formats) shard 0's durable state under `config.data_dir` and recovers it, without
/// replaying the journal (the core does, at `Replica::open`). A replica of a cluster
/// (`config.replica_count() > 1`) keeps damage above the checkpoint for repair from peers
/// instead of refusing, and reports a journal that starts above the checkpoint as
/// [`RecoveryOutcome::NeedsStateTransfer`]; a single replica refuses both, as before.
///
/// Returns with every superblock copy at [`storage::superblock::SUPERBLOCK_VERSION`]: a file of
/// an older version is upgraded last, after every check passed (a refused boot leaves it as it
/// was), and durably, before the caller opens any partition log (issue 12's downgrade guard,
/// `storage/FORMAT.md` section 7 "Versions").
///
/// # Errors
/// - [`BootError::UnsupportedVersion`]: an intact superblock copy of a version this binary does
///   not read (newer: a newer binary's data directory; below the first: no shardline's); nothing
///   was written.
/// - [`BootError::Identity`]: the directory was formatted for another cluster, replica index or
///   replica count than `config.cluster`, `config.replica`, `config.replica_count()`.
/// - [`BootError::Refuse`]: an unreadable superblock (all copies invalid, or copies
///   contradicting each other); a snapshot whose trailer, envelope or payload is damaged; a
///   pairing broken (snapshot missing, older than the superblock's checkpoint, or the same op
///   with another checksum); journal damage above the checkpoint op that a torn tail does not
///   explain (single replica; damage at or below it is covered by the snapshot and only
///   logged); no journal segment at all; a journal that ends below the snapshot, or (single
///   replica) starts above it; a journaled body that does not decode, or whose parent is not
///   the checksum of the record below it; a journal or snapshot without its superblock.
/// - [`BootError::Io`]: an I/O step failed (the superblock upgrade's write included: the
///   directory then still boots as before, by this binary or an older one).
///
/// # Cancel safety
/// Not cancel safe; runs once at boot.
pub async fn recover(config: &ServerConfig) -> Result<Boot, BootError> {
    let mut boot = recover_state(config).await?;
    upgrade_superblock(&mut boot.superblock).await?;
    Ok(boot)
}

/// Issue 12's downgrade guard: rewrites a superblock of any older version (1 or 2) at
/// `SUPERBLOCK_VERSION` (`Superblock::upgrade`: the existing write path, copy by copy, in one
/// write whatever the version found), which a binary that reads only older versions refuses to
/// boot; then hits the failpoint `boot.after_superblock_upgrade`.
async fn upgrade_superblock(superblock: &mut Superblock) -> Result<(), BootError> {
    if let Some(from) = superblock.upgrade(&mut |_| {}).await? {
        let to = storage::superblock::SUPERBLOCK_VERSION;
        let introduced = storage::superblock::version_introduced(to).unwrap_or("a new format");
        tracing::info!(
            path = %superblock.path().display(),
            from,
            to,
            "superblock upgraded from version {from} to {to}: the partition log entry checksum \
             format changed ({introduced}), so from now on shardline releases that read \
             superblock versions only up to {}, such as the one that last ran this data \
             directory, refuse this data directory; no data was rewritten, only the superblock",
            to - 1
        );
        super::failpoint::hit("boot.after_superblock_upgrade");
    }
    Ok(())
}

/// [`recover`] up to the superblock upgrade: every check, the journal opened (and repaired).
async fn recover_state(config: &ServerConfig) -> Result<Boot, BootError> {
    let data_dir = config.data_dir.as_path();
    let superblock = open_superblock(config).await?;
    let superblock_state = *superblock.state();
    check_identity(&superblock_path(data_dir), &superblock_state, config)?;
    let cluster = config.replica_count() > 1;

    let (metadata, client_table, snapshot_op) = load_snapshot(config, &superblock_state).await?;
    let journal_path = journal_dir(data_dir);
    check_journal_present(&journal_path, &superblock_path(data_dir), &superblock_state).await?;
    // Decide first, write after: the journal is scanned read-only and checked against the
    // snapshot, and only then repaired (a torn tail cut, or a segment started after a damaged
    // record the snapshot covers), so a refusal leaves every file as it was.
    let policy = if cluster {
        UncoveredDamage::RepairFromPeers
    } else {
        UncoveredDamage::Refuse
    };
    let scan = Journal::scan_with(&journal_path, snapshot_op, policy).await?;
    let install_interrupted = install_marker_names(data_dir, snapshot_op, cluster).await?;
    if install_interrupted || (cluster && install_left_journal_behind(&scan, snapshot_op)) {
        return restart_after_install(
            config,
            scan,
            superblock,
            metadata,
            client_table,
            snapshot_op,
        )
        .await;
    }
    let gap = check_journal_span(&scan, &journal_path, &snapshot_path(data_dir), snapshot_op)?;
    if let Some(journal_first_op) = gap
        && !cluster
    {
        return Err(BootError::refuse(
            &journal_path,
            format!(
                "{}: starts at op {journal_first_op} but the snapshot {} covers only ops up to \
                 {snapshot_op}: ops {} to {} are missing",
                journal_path.display(),
                snapshot_path(data_dir).display(),
                snapshot_op + 1,
                journal_first_op - 1
            ),
        ));
    }
    check_prepares(scan.recovery(), &journal_path, snapshot_op)?;
    let (journal, recovery) = Journal::open_scanned(scan, journal_config(config)).await?;
    for damaged in &recovery.damaged_records {
        warn_damaged_record(damaged, snapshot_op);
    }
    let outcome = outcome(&journal, gap, snapshot_op);
    let (prepares, prepare_positions) = if gap.is_some() {
        (Vec::new(), Vec::new())
    } else {
        above_checkpoint(recovery, snapshot_op)
    };
    let journal_last_op = match &outcome {
        RecoveryOutcome::RepairFromPeers { highest_op, .. } => *highest_op,
        _ => journal.last_op(),
    };
    tracing::info!(
        cluster = format_args!("{:#x}", superblock_state.cluster),
        replica = superblock_state.replica_id,
        replica_count = superblock_state.replica_count,
        view = superblock_state.view,
        checkpoint_op = snapshot_op,
        journaled_count = prepares.len(),
        journal_first_op = journal.first_op(),
        journal_last_op,
        sessions = client_table.session_count(),
        ?outcome,
        "metadata recovered"
    );
    let recovered = Recovered {
        view: superblock_state.view,
        log_view: superblock_state.log_view,
        commit_max: superblock_state.commit_max,
        checkpoint_op: snapshot_op,
        metadata,
        client_table,
        prepares,
        journal_last_op,
        journal_first_op: journal.first_op(),
    };
    Ok(Boot {
        recovered,
        prepare_positions,
        outcome,
        journal,
        superblock,
    })
}

/// The journal configuration `config` asks for (`--journal-segment-size`, issue 9 section 0).
fn journal_config(config: &ServerConfig) -> JournalConfig {
    JournalConfig {
        segment_size_max: config.journal_segment_size_max,
    }
}

/// Whether the journal is what a crash during a state-transfer install left (issue 9 section
/// 4: snapshot, superblock pairing, then `Journal::restart_after`): it holds no record above the
/// snapshot's `snapshot_op` and either ends below it, or is empty and does not continue at
/// `snapshot_op + 1`. A checkpoint of this replica's own never leaves that (its journal reaches
/// the checkpoint op before the snapshot is written), so for a replica of a cluster it means the
/// restart did not finish; the snapshot holds every op the journal had up to `snapshot_op`.
fn install_left_journal_behind(scan: &JournalScan, snapshot_op: u64) -> bool {
    let empty = scan.recovery().prepares.is_empty();
    scan.last_op() < snapshot_op || (empty && scan.first_op() != snapshot_op + 1)
}

/// Whether the install marker (`DATA_DIR/install.pending`, `store::install`) names the
/// snapshot's `snapshot_op`: a state-transfer install put this snapshot in place and a crash
/// came before its journal restart was durable, so the journal (whatever it holds, including a
/// suffix above `snapshot_op` from another chain) must be restarted after the snapshot, never
/// replayed on top of it. A marker naming another op is an install whose snapshot never landed:
/// the journal is as it was; the marker is removed.
///
/// # Errors
/// `Refuse` when the marker is damaged (it is written by durable replace, so damage is not a
/// torn write) or not 8 bytes, or present at all for a single replica (`cluster` false: it
/// never installs, and restarting its journal would drop committed ops with no peer to repair
/// them from); `Io` when it cannot be read or removed.
async fn install_marker_names(
    data_dir: &Path,
    snapshot_op: u64,
    cluster: bool,
) -> Result<bool, BootError> {
    let path = super::install_marker_path(data_dir);
    if !cluster && compio::fs::metadata(&path).await.is_ok() {
        // A single replica never installs a transferred checkpoint and has no peer to repair a
        // restarted journal from: acting on the marker would drop committed ops (adversarial
        // test: a hand-made marker lost ops 25..=26).
        return Err(BootError::refuse(
            &path,
            format!(
                "{}: a state-transfer install marker in a single replica's data directory: a \
                 single replica never installs a transferred checkpoint, so this file is not \
                 its own (copied from a cluster replica?); remove it to boot with this \
                 replica's journal",
                path.display()
            ),
        ));
    }
    let bytes = match storage::durable::read_verified(&path).await {
        Ok(None) => return Ok(false),
        Ok(Some(bytes)) => bytes,
        Err(storage::DurableError::Corrupt { path, reason }) => {
            return Err(BootError::refuse(
                &path,
                format!(
                    "{}: install marker is damaged ({reason}): cannot tell whether a state \
                     transfer install finished; reformat this replica's data directory so it \
                     rejoins by state transfer",
                    path.display()
                ),
            ));
        }
        Err(storage::DurableError::Io { path, op, source }) => {
            return Err(BootError::Io {
                path,
                step: op,
                source,
            });
        }
    };
    let Ok(op_bytes) = <[u8; 8]>::try_from(bytes.as_slice()) else {
        return Err(BootError::refuse(
            &path,
            format!(
                "{}: install marker holds {} bytes, not the 8-byte op",
                path.display(),
                bytes.len()
            ),
        ));
    };
    let marker_op = u64::from_le_bytes(op_bytes);
    if marker_op == snapshot_op {
        return Ok(true);
    }
    tracing::info!(
        path = %path.display(),
        marker_op,
        snapshot_op,
        "a state transfer install stopped before its snapshot was written; the journal is as it \
         was"
    );
    remove_marker_at(&path).await?;
    Ok(false)
}

/// Removes the install marker of `config.data_dir` durably.
async fn remove_install_marker(config: &ServerConfig) -> Result<(), BootError> {
    remove_marker_at(&super::install_marker_path(&config.data_dir)).await
}

async fn remove_marker_at(path: &Path) -> Result<(), BootError> {
    storage::durable::durable_remove(path)
        .await
        .map_err(|error| match error {
            storage::DurableError::Io { path, op, source } => BootError::Io {
                path,
                step: op,
                source,
            },
            storage::DurableError::Corrupt { path, reason } => BootError::refuse(&path, reason),
        })
}

/// Finishes the journal restart a crash interrupted after an install (see
/// [`install_left_journal_behind`]): opens the scanned journal, restarts it after
/// `snapshot_op`, and recovers the installed checkpoint with nothing to replay (the tail above
/// it is repaired from peers).
async fn restart_after_install(
    config: &ServerConfig,
    scan: JournalScan,
    superblock: Superblock,
    metadata: MetadataState,
    client_table: ClientTable,
    snapshot_op: u64,
) -> Result<Boot, BootError> {
    let (journal_first_op, journal_last_op) = (scan.first_op(), scan.last_op());
    let (mut journal, _) = Journal::open_scanned(scan, journal_config(config)).await?;
    journal.restart_after(snapshot_op).await?;
    remove_install_marker(config).await?;
    tracing::warn!(
        checkpoint_op = snapshot_op,
        journal_first_op,
        journal_last_op,
        "a crash interrupted a state transfer install after its snapshot was written (install \
         marker, or a journal with no record above the installed checkpoint): restarted the \
         journal after the checkpoint, its old records are never replayed; the ops above it are \
         repaired from peers"
    );
    let superblock_state = *superblock.state();
    let recovered = Recovered {
        view: superblock_state.view,
        log_view: superblock_state.log_view,
        commit_max: superblock_state.commit_max,
        checkpoint_op: snapshot_op,
        metadata,
        client_table,
        prepares: Vec::new(),
        journal_last_op: journal.last_op(),
        journal_first_op: journal.first_op(),
    };
    Ok(Boot {
        recovered,
        prepare_positions: Vec::new(),
        outcome: RecoveryOutcome::Clean,
        journal,
        superblock,
    })
}

/// The superblock of `config.data_dir`, formatting the directory when it has none.
async fn open_superblock(config: &ServerConfig) -> Result<Superblock, BootError> {
    let data_dir = config.data_dir.as_path();
    let superblock_file = superblock_path(data_dir);
    match Superblock::open(&superblock_file).await {
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
            Ok(superblock)
        }
        Err(SuperblockError::NotFound { .. }) => format(config).await,
        Err(error) => Err(error.into()),
    }
}

/// How to start a directory formatted for `field` = `formatted` as what it is.
fn identity_fix(field: &str, flag: &str, formatted: &str) -> String {
    if field == "replica count" {
        format!(
            "start it with {formatted} replica addresses in --addresses (none for a single \
             replica)"
        )
    } else {
        format!("start it with {flag} {formatted}")
    }
}

/// Issue 8 section 3: a data directory is formatted for one (cluster, replica index, replica
/// count) and boots only with the same. A directory from before clusters was formatted as
/// (0, 0, 1), which is what a server without `--cluster`, `--replica` and `--addresses` has, so
/// it keeps booting as a single replica.
///
/// # Errors
/// [`BootError::Identity`] naming the first field that differs, both values and its flag.
pub fn check_identity(
    superblock_file: &Path,
    formatted: &SuperblockState,
    config: &ServerConfig,
) -> Result<(), BootError> {
    let mismatch = |field, formatted: String, configured: String, flag| BootError::Identity {
        path: superblock_file.to_path_buf(),
        field,
        formatted,
        configured,
        flag,
    };
    if formatted.cluster != config.cluster {
        return Err(mismatch(
            "cluster",
            formatted.cluster.to_string(),
            config.cluster.to_string(),
            "--cluster (SHARDLINE_CLUSTER)",
        ));
    }
    if formatted.replica_count != config.replica_count() {
        return Err(mismatch(
            "replica count",
            formatted.replica_count.to_string(),
            config.replica_count().to_string(),
            "the number of --addresses (SHARDLINE_ADDRESSES; 1 without them)",
        ));
    }
    if formatted.replica_id != config.replica {
        return Err(mismatch(
            "replica index",
            formatted.replica_id.to_string(),
            config.replica.to_string(),
            "--replica (SHARDLINE_REPLICA)",
        ));
    }
    Ok(())
}

/// The state at the snapshot's checkpoint op (fresh at op 0 without a snapshot), after the
/// pairing rule against the superblock.
async fn load_snapshot(
    config: &ServerConfig,
    superblock_state: &SuperblockState,
) -> Result<(MetadataState, ClientTable, u64), BootError> {
    let data_dir = config.data_dir.as_path();
    let superblock_file = superblock_path(data_dir);
    let snapshot_file = snapshot_path(data_dir);
    let clients_max = config.clients_table_max;
    let Some(snapshot) = storage::snapshot::read_snapshot(&snapshot_file).await? else {
        if superblock_state.checkpoint_op != 0 || superblock_state.snapshot_checksum != 0 {
            return Err(BootError::refuse(
                &snapshot_file,
                format!(
                    "{}: missing, but {} records a checkpoint at op {} (checksum {:#018x})",
                    snapshot_file.display(),
                    superblock_file.display(),
                    superblock_state.checkpoint_op,
                    superblock_state.snapshot_checksum
                ),
            ));
        }
        return Ok((MetadataState::new(), ClientTable::new(clients_max), 0));
    };
    check_pairing(
        &snapshot_file,
        &superblock_file,
        superblock_state,
        snapshot.checkpoint_op,
        snapshot.checksum,
    )?;
    let restored = SnapshotPayload::decode(&snapshot.payload, snapshot.checkpoint_op, clients_max)
        .map_err(|reason| {
            BootError::refuse(
                &snapshot_file,
                format!(
                    "{}: snapshot payload at op {}: {reason}",
                    snapshot_file.display(),
                    snapshot.checkpoint_op
                ),
            )
        })?;
    if !restored.evicted_clients.is_empty() {
        tracing::warn!(
            evicted_count = restored.evicted_clients.len(),
            clients_table_max = clients_max,
            "the snapshot holds more client sessions than --clients-table-max; the least \
             recently committed were evicted and are told so on their next request"
        );
    }
    Ok((
        restored.metadata,
        restored.client_table,
        snapshot.checkpoint_op,
    ))
}

/// Refuses a superblock without a journal segment. Format creates the journal before the
/// superblock, so it was removed; the superblock cannot say whether ops above the checkpoint
/// were acknowledged since (`commit_max` is written only at a checkpoint), so booting could
/// silently drop them.
async fn check_journal_present(
    journal_path: &Path,
    superblock_file: &Path,
    superblock_state: &SuperblockState,
) -> Result<(), BootError> {
    let journal_present = {
        let journal_path = journal_path.to_path_buf();
        compio::runtime::spawn_blocking(move || !journal_segment_sizes(&journal_path).is_empty())
            .await
    };
    if matches!(journal_present, Ok(true)) {
        return Ok(());
    }
    let checkpoint_op = superblock_state.checkpoint_op;
    Err(BootError::refuse(
        journal_path,
        format!(
            "{}: no journal segment, but {} exists (the journal is created before the \
             superblock, so it was removed): any ops acknowledged since checkpoint op \
             {checkpoint_op} would be lost, and the superblock cannot tell whether there were \
             any (its commit_max {} is written only at checkpoints). Restore the journal; or, if \
             the server's last log lines show a clean stop with \"checkpoint done\" at \
             checkpoint_op {checkpoint_op} (every acknowledged op is then in the snapshot), \
             create the empty segment {}",
            journal_path.display(),
            superblock_file.display(),
            superblock_state.commit_max,
            storage::journal::segment_path(journal_path, checkpoint_op + 1).display()
        ),
    ))
}

/// The journal must reach the snapshot: it may not end below `snapshot_op` (records the snapshot
/// was taken after are missing; refused). A damaged last record the snapshot covers does not end
/// it below: `scan.last_op()` is then `snapshot_op` (the journal continues at `snapshot_op + 1`).
/// Returns the journal's first op when it starts above `snapshot_op + 1` (ops between them are
/// missing: the caller refuses, or reports state transfer).
fn check_journal_span(
    scan: &JournalScan,
    journal_path: &Path,
    snapshot_file: &Path,
    snapshot_op: u64,
) -> Result<Option<u64>, BootError> {
    if scan.last_op() < snapshot_op {
        return Err(BootError::refuse(
            journal_path,
            format!(
                "{}: ends at op {} but the snapshot {} is at op {snapshot_op}: journal records \
                 are missing",
                journal_path.display(),
                scan.last_op(),
                snapshot_file.display()
            ),
        ));
    }
    Ok((scan.first_op() > snapshot_op + 1).then_some(scan.first_op()))
}

/// Checks every journaled prepare above `snapshot_op`: its body decodes (a body this build
/// cannot read stops boot, never skipped: FORMAT.md section 8.1) and its parent is the header
/// checksum of the record at the op below when the journal holds that record (the parent chain,
/// issue 8 section 2; a record with no parent, or parent 0, is unchained and accepted: written
/// before chaining, or by the single-replica commit path), and op 1's parent is 0. A failure is
/// named by file, byte and op.
fn check_prepares(
    recovery: &JournalRecovery,
    journal_path: &Path,
    snapshot_op: u64,
) -> Result<(), BootError> {
    assert_eq!(
        recovery.prepares.len(),
        recovery.record_positions.len(),
        "the journal reports one position per record"
    );
    let mut below: Option<(u64, u128)> = None;
    for (prepare, &(segment_first_op, position)) in
        recovery.prepares.iter().zip(&recovery.record_positions)
    {
        let checksum = JournalHeader::for_prepare(prepare).checksum;
        if prepare.op <= snapshot_op {
            below = Some((prepare.op, checksum));
            continue;
        }
        let path = storage::journal::segment_path(journal_path, segment_first_op);
        let refuse = |rule: String| {
            BootError::refuse(
                &path,
                format!(
                    "{} at byte {position} (op {}): {rule}",
                    path.display(),
                    prepare.op
                ),
            )
        };
        let body = PrepareBody::decode(&prepare.body)
            .map_err(|reason| refuse(format!("the prepare body does not decode: {reason}")))?;
        let parent = body.parent_checksum().map_err(&refuse)?;
        // 0 is "unknown": no parent field (written before chaining), or the single-replica
        // commit path that does not chain yet. A real checksum is 0 with odds 2^-128.
        if parent != 0 {
            match below {
                Some((op, expected)) if op + 1 == prepare.op && parent != expected => {
                    return Err(refuse(format!(
                        "its parent is {parent:#034x} but the record of op {op} below it has \
                         checksum {expected:#034x}: the journal's parent chain is broken (a \
                         record from another log, not one this replica appended)"
                    )));
                }
                None if prepare.op == 1 && parent != 0 => {
                    return Err(refuse(format!(
                        "op 1 names parent {parent:#034x}, but op 1 has no parent (0)"
                    )));
                }
                _ => {}
            }
        }
        below = Some((prepare.op, checksum));
    }
    Ok(())
}

/// What the opened journal needs: repair when damage awaits it, state transfer when it starts
/// above the checkpoint (`gap`), clean otherwise.
fn outcome(journal: &Journal, gap: Option<u64>, snapshot_op: u64) -> RecoveryOutcome {
    if let Some(journal_first_op) = gap {
        return RecoveryOutcome::NeedsStateTransfer {
            checkpoint_op: snapshot_op,
            journal_first_op,
        };
    }
    match journal.damaged_tail() {
        Some(DamagedRecord {
            path,
            position,
            op,
            disposition: TailDisposition::AwaitingRepair { highest_op },
            ..
        }) => RecoveryOutcome::RepairFromPeers {
            path: path.clone(),
            position: *position,
            damaged_op: *op,
            highest_op: *highest_op,
        },
        _ => RecoveryOutcome::Clean,
    }
}

/// The prepares above `snapshot_op` and their positions (a crash during a release can leave
/// records at or below it).
fn above_checkpoint(
    recovery: JournalRecovery,
    snapshot_op: u64,
) -> (Vec<storage::journal::Prepare>, Vec<(u64, u64)>) {
    let (prepares, positions): (Vec<_>, Vec<_>) = recovery
        .prepares
        .into_iter()
        .zip(recovery.record_positions)
        .filter(|(prepare, _)| prepare.op > snapshot_op)
        .unzip();
    debug_assert!(
        prepares
            .iter()
            .enumerate()
            .all(|(index, prepare)| prepare.op == snapshot_op + 1 + index as u64),
        "prepares above the checkpoint are contiguous from it"
    );
    (prepares, positions)
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
        TailDisposition::AwaitingRepair { highest_op } => tracing::warn!(
            path = %damaged.path.display(), position = damaged.position, op = damaged.op,
            highest_op, checkpoint_op = snapshot_op, reason = %damaged.reason,
            "damaged journal record above the checkpoint; left in place, the journal holds the \
             ops below it and this replica repairs the ops from it on from its peers"
        ),
    }
}

/// Logs partition directories the recovered metadata does not name: a deletion whose
/// directory removal a crash interrupted (the delete is committed), or a topic whose creation
/// never committed. They are left in place (never delete data on a guess); creating a topic
/// with the same ids removes them, and an operator may delete them. The driver calls it once the
/// core has applied the journal (the state at `commit_min`).
///
/// # Cancel safety
/// Cancel safe: it only lists directories and logs.
///
/// A replica of a cluster (`in_cluster`) logs them at INFO: right after a restart it has applied
/// only what its checkpoint and superblock say was committed, and it names the directories again
/// once it applies their CreateTopic while catching up (a walkthrough found the WARN after every
/// kill -9 of a backup, telling the operator to delete live data by hand).
pub async fn warn_about_orphan_partitions(
    data_dir: &Path,
    metadata: &MetadataState,
    in_cluster: bool,
) {
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
                let tombstone = topic
                    .file_name()
                    .to_str()
                    .is_some_and(|n| n.ends_with(crate::shard::DELETED_DIR_SUFFIX));
                if !named && !tombstone {
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
        if in_cluster {
            tracing::info!(
                orphan_count = orphans.len(),
                first = %shown.join(", "),
                "partition directories that no topic names yet at this replica's restart point: \
                 left in place with their data; catching up applies their CreateTopic again \
                 (nothing to do)"
            );
        } else {
            tracing::warn!(
                orphan_count = orphans.len(),
                first = %shown.join(", "),
                "partition directories that no topic names: left in place with their data; a \
                 topic whose deletion or creation did not complete (remove them by hand, or \
                 create the topic with these ids again)"
            );
        }
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
) -> Result<(), BootError> {
    let refuse = |rule: String| BootError::refuse(snapshot_file, rule);
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

/// Formats a data directory without a superblock for `config`'s cluster identity (issue 8
/// section 3: `config.cluster`, `config.replica`, `config.replica_count()`): refuses if it holds
/// a journal or snapshot (their superblock was lost), migrates `metadata.json` (the pre-journal
/// format) into a snapshot at op 0, and creates the superblock.
async fn format(config: &ServerConfig) -> Result<Superblock, BootError> {
    let data_dir = config.data_dir.as_path();
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
        return Err(BootError::refuse(
            data_dir,
            format!(
                "{}: the data directory probe task failed",
                data_dir.display()
            ),
        ));
    };
    // Format writes snapshot (migration only) and an empty journal before the superblock, so
    // those alone are what a crash during format leaves: format again. Journal records, or a
    // snapshot without metadata.json to migrate, mean a superblock existed and was lost.
    if journal_has_records || (snapshot_exists && !legacy) {
        return Err(BootError::refuse(
            &superblock_file,
            format!(
                "{}: missing, but {} exists: the superblock that pairs with it was lost. Restore \
             the superblock from a backup; do not start this directory empty, its partition data \
             would be orphaned",
                superblock_file.display(),
                if journal_has_records {
                    journal_path.display()
                } else {
                    snapshot_file.display()
                }
            ),
        ));
    }
    // This replica's identity, everything else at its start.
    let mut state = SuperblockState {
        cluster: config.cluster,
        replica_id: config.replica,
        replica_count: config.replica_count(),
        ..SuperblockState::default()
    };
    let legacy_file = store::metadata_path(data_dir);
    if legacy {
        let mut metadata = store::load(data_dir)
            .await
            .map_err(|error| BootError::refuse(&legacy_file, error.to_string()))?;
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
            BootError::refuse(
                &legacy_file,
                format!("{}: cannot be migrated: {reason}", legacy_file.display()),
            )
        })?;
        state.snapshot_checksum =
            storage::snapshot::write_snapshot(&snapshot_file, 0, payload.encode(), &mut |_| {})
                .await?;
    }
    // The journal before the superblock: a superblock without a journal then always means the
    // journal was lost (boot refuses), never an interrupted format.
    Journal::open(&journal_path).await?;
    let superblock = Superblock::create(&superblock_file, state).await?;
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
        tracing::info!(
            path = %superblock_file.display(),
            cluster = format_args!("{:#x}", state.cluster),
            replica = state.replica_id,
            replica_count = state.replica_count,
            "formatted a new data directory"
        );
    }
    Ok(superblock)
}
