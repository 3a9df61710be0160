//! Tests of [`ReplicaStore::install_checkpoint`] and of boot after an install (issue 9 section
//! 4): the lock order, the degraded install, and crashes part way through the journal restart.

use std::net::SocketAddr;
use std::path::Path;
use std::rc::Rc;
use std::sync::Arc;

use storage::journal::{Prepare, segment_path};

use crate::config::ServerConfig;
use crate::metadata::{MetadataOp, MetadataState};
use crate::store::boot::{RecoveryOutcome, recover};
use crate::store::{LockName, ReplicaStore, journal_dir, snapshot_path};
use crate::vsr::client_table::ClientTable;
use crate::vsr::prepare::{PrepareBody, PrepareOperation};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// Replica 1 of a three-replica cluster in `data_dir`, with the smallest journal segments.
fn cluster_config(data_dir: &Path) -> ServerConfig {
    let mut config = ServerConfig::new(data_dir.to_path_buf());
    config.cluster = 9;
    config.replica = 1;
    config.addresses = (0..3)
        .map(|index| SocketAddr::from(([127, 0, 0, 1], 9100 + index)))
        .collect();
    config.journal_segment_size_max = crate::config::JOURNAL_SEGMENT_SIZE_MIN;
    config
}

/// The store the driver would get from booting `config`'s data directory.
async fn booted_store(config: &ServerConfig) -> ReplicaStore {
    let boot = recover(config).await.unwrap();
    let checkpoint_op = boot.recovered.checkpoint_op;
    ReplicaStore::for_driver(config, boot.journal, boot.superblock, checkpoint_op)
}

/// The metadata a peer's checkpoint at op `op` holds: streams 1..=3.
fn installed_metadata(op: u64) -> Arc<MetadataState> {
    let mut metadata = MetadataState::new();
    for stream_id in 1..=3u32 {
        let change = MetadataOp::CreateStream {
            stream_id,
            name: format!("installed-{stream_id}"),
        };
        metadata.apply(op - 3 + u64::from(stream_id), &change);
    }
    Arc::new(metadata)
}

/// Journal prepares for ops `1..=count` (stream creations, chained), large enough that a
/// 64 KiB segment holds a few dozen.
fn old_prepares(count: u64) -> Vec<Prepare> {
    (1..=count)
        .map(|op| {
            let change = MetadataOp::CreateStream {
                stream_id: op as u32,
                name: "x".repeat(2000),
            };
            let body = PrepareBody::new(7, op, PrepareOperation::Metadata(change), 1, 0).encode();
            Prepare {
                op,
                view: 0,
                commit: op - 1,
                body,
            }
        })
        .collect()
}

/// A formatted cluster replica whose journal holds ops `1..=count` in several segments.
async fn replica_with_old_journal(config: &ServerConfig, count: u64) -> ReplicaStore {
    let store = booted_store(config).await;
    store
        .journal()
        .lock()
        .await
        .append_batch(&old_prepares(count))
        .await
        .unwrap();
    store
}

fn wal_files(data_dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(journal_dir(data_dir))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

/// DESIGN section 9, issue 9 section 4: an install waits for `checkpoint_lock` (held here by a
/// checkpoint in progress) before it writes anything, and takes `superblock_lock` only after it.
#[test]
fn issue9_install_takes_checkpoint_then_superblock_lock() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        let store = Rc::new(booted_store(&config).await);
        let mut held = store.lock_session();
        held.lock_checkpoint().await;
        assert_eq!(store.take_lock_trace(), vec![LockName::Checkpoint]);
        let install = {
            let store = Rc::clone(&store);
            compio::runtime::spawn(async move {
                store
                    .install_checkpoint(
                        40,
                        installed_metadata(40),
                        ClientTable::new(8).to_snapshot(),
                    )
                    .await
            })
        };
        compio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(
            !snapshot_path(dir.path()).exists(),
            "the install wrote its snapshot while checkpoint_lock was held elsewhere"
        );
        assert!(store.take_lock_trace().is_empty());
        drop(held);
        let done = install.await.unwrap().unwrap();
        assert_eq!((done.checkpoint_op, done.degraded), (40, false));
        assert_eq!(
            store.take_lock_trace(),
            vec![LockName::Checkpoint, LockName::Superblock]
        );
        // The regular checkpoint takes them through the same session, in the same order.
        store
            .checkpoint_state(
                41,
                installed_metadata(41),
                ClientTable::new(8).to_snapshot(),
            )
            .await
            .unwrap();
        assert_eq!(
            store.take_lock_trace(),
            vec![LockName::Checkpoint, LockName::Superblock]
        );
    });
}

/// The lock order is asserted: taking `checkpoint_lock` while holding `superblock_lock` is a bug.
#[test]
#[should_panic(expected = "lock order violated")]
fn issue9_checkpoint_lock_under_superblock_lock_is_a_bug() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        let store = booted_store(&config).await;
        let mut session = store.lock_session();
        let _superblock = session.lock_superblock().await;
        session.lock_checkpoint().await;
    });
}

/// Issue 9 section 4: a pairing write that fails after the snapshot is in place is a degraded
/// success (not an error), counted; the journal restarts after the checkpoint; and boot
/// recovers at the installed checkpoint (a snapshot newer than its pairing).
#[test]
fn issue9_degraded_install_reported_as_success() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        let store = replica_with_old_journal(&config, 5).await;
        store.fail_next_install_pairing();
        let done = store
            .install_checkpoint(
                40,
                installed_metadata(40),
                ClientTable::new(8).to_snapshot(),
            )
            .await
            .expect("a degraded install is a success");
        assert_eq!((done.checkpoint_op, done.degraded), (40, true));
        assert_eq!(store.degraded_install_count(), 1);
        assert_eq!(store.checkpoint_op(), 40);
        assert_eq!(
            store.superblock().lock().await.state().checkpoint_op,
            0,
            "the pairing was not written"
        );
        {
            let journal = store.journal().lock().await;
            assert_eq!((journal.first_op(), journal.last_op()), (41, 40));
        }
        // The next checkpoint records the pairing.
        store
            .checkpoint_state(
                48,
                installed_metadata(48),
                ClientTable::new(8).to_snapshot(),
            )
            .await
            .unwrap();
        assert_eq!(store.superblock().lock().await.state().checkpoint_op, 48);
    });
    assert_eq!(wal_files(dir.path()), vec!["00000000000000000041.wal"]);
}

/// Issue 9 section 4: boot after a degraded install (the snapshot newer than its pairing, the
/// journal restarted) recovers at the installed checkpoint.
#[test]
fn issue9_boot_after_a_degraded_install_recovers_at_the_installed_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        let store = replica_with_old_journal(&config, 5).await;
        store.fail_next_install_pairing();
        let done = store
            .install_checkpoint(
                40,
                installed_metadata(40),
                ClientTable::new(8).to_snapshot(),
            )
            .await
            .unwrap();
        assert!(done.degraded);
    });
    block_on(async {
        let boot = recover(&config).await.unwrap();
        assert_eq!(
            boot.superblock.state().checkpoint_op,
            0,
            "the pairing is old"
        );
        assert_eq!(boot.outcome, RecoveryOutcome::Clean);
        assert_eq!(boot.recovered.checkpoint_op, 40);
        assert_eq!(boot.recovered.metadata, *installed_metadata(40));
        assert!(boot.recovered.prepares.is_empty());
        assert_eq!(boot.journal.first_op(), 41);
    });
}

/// An install at or below the store's checkpoint is refused before anything is written.
#[test]
fn issue9_install_of_a_stale_checkpoint_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        let store = booted_store(&config).await;
        let install = |op| {
            store.install_checkpoint(
                op,
                installed_metadata(40),
                ClientTable::new(8).to_snapshot(),
            )
        };
        install(40).await.unwrap();
        let error = install(40).await.unwrap_err();
        assert!(
            matches!(
                error,
                super::InstallError::Stale {
                    checkpoint_op: 40,
                    current: 40
                }
            ),
            "{error}"
        );
    });
}

/// Writes the snapshot of an install at `op` and nothing else: what a crash right after the
/// install's snapshot step (or, for the journal, part way through its restart) leaves.
async fn snapshot_only(data_dir: &Path, op: u64) {
    let bytes = crate::vsr::snapshot::encode_payload(
        op,
        &installed_metadata(op),
        &ClientTable::new(8).to_snapshot(),
    );
    storage::snapshot::write_snapshot(&snapshot_path(data_dir), op, bytes, &mut |_| {})
        .await
        .unwrap();
}

/// Turns a data directory into what a crash at some step left.
type CrashState = fn(&Path);

/// Issue 9 section 4: boot after a crash part way through the journal restart (the snapshot
/// at op 400 in place, the journal still the old one, or only its newest segments, or one
/// emptied segment under its old name) finishes the restart: the installed checkpoint with
/// nothing replayed, the journal continuing at op 401.
#[test]
fn issue9_boot_after_a_crash_mid_journal_restart_finishes_it() {
    let crash_states: [(&str, CrashState); 3] = [
        ("before the restart", |_| {}),
        ("after deleting the oldest segment", |data_dir| {
            let oldest = wal_files(data_dir).remove(0);
            std::fs::remove_file(journal_dir(data_dir).join(oldest)).unwrap();
        }),
        ("after emptying the last segment", |data_dir| {
            let files = wal_files(data_dir);
            let (last, older) = files.split_last().unwrap();
            for name in older {
                std::fs::remove_file(journal_dir(data_dir).join(name)).unwrap();
            }
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(journal_dir(data_dir).join(last))
                .unwrap();
            file.set_len(0).unwrap();
        }),
    ];
    for (what, crash) in crash_states {
        let dir = tempfile::tempdir().unwrap();
        let config = cluster_config(dir.path());
        block_on(async {
            drop(replica_with_old_journal(&config, 100).await);
            snapshot_only(dir.path(), 400).await;
        });
        assert!(wal_files(dir.path()).len() > 2, "{what}: segments rolled");
        crash(dir.path());
        block_on(async {
            let boot = recover(&config)
                .await
                .unwrap_or_else(|error| panic!("{what}: boot refused: {error}"));
            assert_eq!(boot.outcome, RecoveryOutcome::Clean, "{what}");
            assert_eq!(boot.recovered.checkpoint_op, 400, "{what}");
            assert!(boot.recovered.prepares.is_empty(), "{what}");
            assert_eq!(
                (boot.journal.first_op(), boot.journal.last_op()),
                (401, 400),
                "{what}"
            );
        });
        assert_eq!(
            wal_files(dir.path()),
            vec![
                segment_path(Path::new(""), 401)
                    .to_string_lossy()
                    .into_owned()
            ],
            "{what}"
        );
    }
}

/// Issue 9 section 4 ("a stale WAL suffix above the transfer floor ... is truncated, never
/// replayed"): a crash after the install's snapshot at op 40 landed but before its journal
/// restart, with the old journal reaching op 100 (a suffix of another chain above the installed
/// op): the install marker beside the snapshot makes boot restart the journal after op 40
/// instead of replaying ops 41..=100 on top of the installed state; the marker is removed.
#[test]
fn issue9_stale_suffix_above_installed_snapshot_never_replayed_after_a_crash() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        drop(replica_with_old_journal(&config, 100).await);
        storage::durable::durable_replace(
            &crate::store::install_marker_path(dir.path()),
            40u64.to_le_bytes().to_vec(),
        )
        .await
        .unwrap();
        snapshot_only(dir.path(), 40).await;
        let boot = recover(&config).await.unwrap();
        assert_eq!(boot.recovered.checkpoint_op, 40);
        assert!(
            boot.recovered.prepares.is_empty(),
            "the old suffix is never replayed"
        );
        assert_eq!((boot.journal.first_op(), boot.journal.last_op()), (41, 40));
    });
    assert!(!crate::store::install_marker_path(dir.path()).exists());
}

/// The install marker names op 500 but the snapshot never landed (the crash came before the
/// durable replace): the journal is this replica's own and boots as it was; the marker goes.
#[test]
fn issue9_install_marker_without_its_snapshot_leaves_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        drop(replica_with_old_journal(&config, 30).await);
        storage::durable::durable_replace(
            &crate::store::install_marker_path(dir.path()),
            500u64.to_le_bytes().to_vec(),
        )
        .await
        .unwrap();
        let boot = recover(&config).await.unwrap();
        assert_eq!(boot.recovered.checkpoint_op, 0);
        assert_eq!(boot.recovered.prepares.len(), 30);
    });
    assert!(!crate::store::install_marker_path(dir.path()).exists());
}

/// A damaged install marker refuses boot naming the file (never guessed either way).
#[test]
fn issue9_damaged_install_marker_refuses_boot_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let config = cluster_config(dir.path());
    block_on(async {
        drop(replica_with_old_journal(&config, 3).await);
    });
    std::fs::write(
        crate::store::install_marker_path(dir.path()),
        [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16],
    )
    .unwrap();
    let Err(error) = block_on(recover(&config)) else {
        panic!("a damaged install marker must refuse boot");
    };
    let message = error.to_string();
    assert!(message.contains("install.pending"), "{message}");
    assert!(message.contains("install marker is damaged"), "{message}");
}

/// Adversarial finding: an install marker in a single replica's data directory refuses boot
/// naming it, instead of restarting the journal (a single replica has no peer to repair the
/// dropped committed ops from).
#[test]
fn issue9_install_marker_refuses_a_single_replica_boot() {
    let dir = tempfile::tempdir().unwrap();
    let config = ServerConfig::new(dir.path().to_path_buf());
    block_on(async {
        drop(booted_store(&config).await);
        storage::durable::durable_replace(
            &crate::store::install_marker_path(dir.path()),
            0u64.to_le_bytes().to_vec(),
        )
        .await
        .unwrap();
    });
    let Err(error) = block_on(recover(&config)) else {
        panic!("a single replica with an install marker must refuse boot");
    };
    let message = error.to_string();
    assert!(message.contains("install.pending"), "{message}");
    assert!(message.contains("single replica"), "{message}");
}
