//! Boot of shard 0's durable store (`shards::store::boot`, issue 8 sections 1 and 3): the cluster
//! identity a data directory is formatted for, the legacy single-replica directory, and the
//! typed outcome that tells "refuse to boot" from "repair from peers" from "needs state
//! transfer". Each test runs on its own compio runtime in a temp directory and writes the
//! journal the way the server does (chained prepare bodies), then damages it the way a bad disk
//! would.

use std::net::SocketAddr;
use std::path::Path;

use shards::ServerConfig;
use shards::metadata::MetadataOp;
use shards::store::boot::{BootError, RecoveryOutcome, recover};
use shards::store::{journal_dir, superblock_path};
use shards::vsr::prepare::{PrepareBody, PrepareOperation};
use storage::journal::segment_path;
use storage::{JOURNAL_HEADER_SIZE, Journal, JournalHeader, Prepare};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

const CLIENT: u128 = 0x5eed;

/// A server config for `data_dir`: replica `replica` of `replica_count` in cluster `cluster`
/// (no `--addresses` when `replica_count` is 1).
fn config(data_dir: &Path, cluster: u128, replica: u8, replica_count: u16) -> ServerConfig {
    let mut config = ServerConfig::new(data_dir.to_path_buf());
    config.cluster = cluster;
    config.replica = replica;
    config.addresses = if replica_count == 1 {
        Vec::new()
    } else {
        (0..replica_count)
            .map(|index| SocketAddr::from(([127, 0, 0, 1], 9000 + index)))
            .collect()
    };
    config
}

/// The operation of op `op` in the test journals: a Register, then stream creations.
fn operation(op: u64) -> (u64, PrepareOperation) {
    if op == 1 {
        return (0, PrepareOperation::Register);
    }
    let change = MetadataOp::CreateStream {
        stream_id: op as u32,
        name: format!("s{op}"),
    };
    (op - 1, PrepareOperation::Metadata(change))
}

/// Prepares for ops `1..=count`, each body naming its parent's checksum when `chained` (a
/// legacy journal's bodies name none).
fn prepares(count: u64, chained: bool) -> Vec<Prepare> {
    let mut prepares: Vec<Prepare> = Vec::new();
    for op in 1..=count {
        let parent = prepares
            .last()
            .map_or(0, |below| JournalHeader::for_prepare(below).checksum);
        let (request, operation) = operation(op);
        let mut body = PrepareBody::new(CLIENT, request, operation, 7, parent);
        if !chained {
            body.parent = None;
        }
        prepares.push(Prepare {
            op,
            view: 0,
            commit: op - 1,
            body: body.encode(),
        });
    }
    prepares
}

/// Formats `config`'s data directory (a first boot), then journals `prepares` as the server
/// would have.
fn formatted_with(config: &ServerConfig, prepares: &[Prepare]) {
    block_on(async {
        let boot = recover(config).await.unwrap();
        assert_eq!(boot.outcome, RecoveryOutcome::Clean);
        let mut journal = boot.journal;
        journal.append_batch(prepares).await.unwrap();
    });
}

fn identity_error(error: BootError) -> (&'static str, String, String, String) {
    let message = error.to_string();
    match error {
        BootError::Identity {
            field,
            formatted,
            configured,
            ..
        } => (field, formatted, configured, message),
        other => panic!("expected an identity refusal, got {other}"),
    }
}

#[test]
fn a_directory_refuses_another_cluster_replica_index_or_replica_count() {
    let dir = tempfile::tempdir().unwrap();
    let formatted = config(dir.path(), 7, 1, 3);
    formatted_with(&formatted, &prepares(2, true));
    block_on(async {
        let boot = recover(&formatted).await.unwrap();
        let state = *boot.superblock.state();
        assert_eq!(
            (state.cluster, state.replica_id, state.replica_count),
            (7, 1, 3)
        );
        assert_eq!(boot.recovered.prepares, prepares(2, true));
        assert_eq!(boot.recovered.journal_last_op, 2);
    });
    let (field, was, is, message) =
        identity_error(block_on(recover(&config(dir.path(), 8, 1, 3))).unwrap_err());
    assert_eq!((field, was.as_str(), is.as_str()), ("cluster", "7", "8"));
    assert!(message.contains("--cluster"), "{message}");
    assert!(message.contains("formatted for cluster 7"), "{message}");
    assert!(message.contains("refusing to boot"), "{message}");
    let (field, was, is, message) =
        identity_error(block_on(recover(&config(dir.path(), 7, 2, 3))).unwrap_err());
    assert_eq!(
        (field, was.as_str(), is.as_str()),
        ("replica index", "1", "2")
    );
    assert!(message.contains("--replica"), "{message}");
    let (field, was, is, message) =
        identity_error(block_on(recover(&config(dir.path(), 7, 1, 5))).unwrap_err());
    assert_eq!(
        (field, was.as_str(), is.as_str()),
        ("replica count", "3", "5")
    );
    assert!(message.contains("--addresses"), "{message}");
    // Without --addresses the server is a single replica: the cluster directory refuses it too.
    let (field, ..) = identity_error(block_on(recover(&config(dir.path(), 7, 0, 1))).unwrap_err());
    assert_eq!(field, "replica count");
}

#[test]
fn a_legacy_single_replica_directory_keeps_booting_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let single = config(dir.path(), 0, 0, 1);
    // Bodies without parents: the journal of a build before prepares were chained.
    formatted_with(&single, &prepares(3, false));
    block_on(async {
        let boot = recover(&single).await.unwrap();
        assert_eq!(boot.outcome, RecoveryOutcome::Clean);
        let state = *boot.superblock.state();
        assert_eq!(
            (state.cluster, state.replica_id, state.replica_count),
            (0, 0, 1)
        );
        // Boot no longer replays: the state is the snapshot's (none here), the prepares follow.
        assert!(boot.recovered.metadata.streams.is_empty());
        assert_eq!(boot.recovered.prepares.len(), 3);
        assert_eq!(boot.recovered.journal_first_op, 1);
    });
    block_on(async {
        // The core, opened as a single replica, commits and applies them at once.
        let boot = recover(&single).await.unwrap();
        let (core, _actions) = shards::vsr::replica::Replica::open(
            shards::driver::core_config(&single),
            boot.recovered,
        );
        assert_eq!(core.commit_min(), 3);
        assert_eq!(
            core.metadata().streams.keys().copied().collect::<Vec<_>>(),
            [2, 3]
        );
    });
    // Asking it to be a replica of a cluster refuses.
    let (field, ..) = identity_error(block_on(recover(&config(dir.path(), 0, 0, 3))).unwrap_err());
    assert_eq!(field, "replica count");
}

/// Flips a body byte of op 3 (of 5, all in the first segment, 3 is not the tail).
fn damage_op_3(data_dir: &Path) {
    let path = segment_path(&journal_dir(data_dir), 1);
    let mut raw = std::fs::read(&path).unwrap();
    let sizes: Vec<usize> = prepares(5, true)
        .iter()
        .map(|prepare| JOURNAL_HEADER_SIZE + prepare.body.len())
        .collect();
    let op_3 = sizes[0] + sizes[1];
    raw[op_3 + JOURNAL_HEADER_SIZE + 4] ^= 0x01;
    std::fs::write(&path, &raw).unwrap();
}

#[test]
fn middle_damage_refuses_a_single_replica_and_is_repaired_from_peers_in_a_cluster() {
    let single_dir = tempfile::tempdir().unwrap();
    let single = config(single_dir.path(), 0, 0, 1);
    formatted_with(&single, &prepares(5, true));
    damage_op_3(single_dir.path());
    let error = block_on(recover(&single)).unwrap_err();
    let BootError::Refuse { path, rule } = &error else {
        panic!("expected a refusal, got {error}");
    };
    assert_eq!(path, &segment_path(&journal_dir(single_dir.path()), 1));
    assert!(rule.contains("corrupt journal record"), "{rule}");

    let cluster_dir = tempfile::tempdir().unwrap();
    let member = config(cluster_dir.path(), 9, 0, 3);
    formatted_with(&member, &prepares(5, true));
    damage_op_3(cluster_dir.path());
    let journal_file = segment_path(&journal_dir(cluster_dir.path()), 1);
    let before = std::fs::read(&journal_file).unwrap();
    block_on(async {
        let boot = recover(&member).await.unwrap();
        let RecoveryOutcome::RepairFromPeers {
            path,
            damaged_op,
            highest_op,
            ..
        } = &boot.outcome
        else {
            panic!("expected repair from peers, got {:?}", boot.outcome);
        };
        assert_eq!(path, &journal_file);
        assert_eq!((*damaged_op, *highest_op), (3, 5));
        assert_eq!(boot.recovered.prepares, prepares(2, true));
        assert_eq!(boot.recovered.journal_last_op, 5);
        assert_eq!(boot.journal.last_op(), 2);
        // Nothing was cut or rewritten: the damage waits for the core's truncation.
        assert_eq!(std::fs::read(&journal_file).unwrap(), before);
        let mut journal = boot.journal;
        journal.truncate_after(2).await.unwrap();
        journal.append_batch(&prepares(5, true)[2..]).await.unwrap();
    });
    block_on(async {
        let boot = recover(&member).await.unwrap();
        assert_eq!(boot.outcome, RecoveryOutcome::Clean);
        assert_eq!(boot.recovered.prepares, prepares(5, true));
    });
}

#[test]
fn a_broken_parent_chain_refuses_to_boot() {
    let dir = tempfile::tempdir().unwrap();
    let member = config(dir.path(), 9, 2, 3);
    let mut forked = prepares(3, true);
    // Op 3 names a parent that is not op 2's checksum: a record from another log.
    let (request, operation) = operation(3);
    forked[2].body = PrepareBody::new(CLIENT, request, operation, 7, 0xbad).encode();
    formatted_with(&member, &forked);
    let error = block_on(recover(&member)).unwrap_err();
    let message = error.to_string();
    assert!(matches!(error, BootError::Refuse { .. }), "{message}");
    assert!(message.contains("(op 3)"), "{message}");
    assert!(message.contains("parent chain is broken"), "{message}");
    // A body that does not decode refuses too, naming the record.
    let dir = tempfile::tempdir().unwrap();
    let single = config(dir.path(), 0, 0, 1);
    let mut garbled = prepares(2, true);
    garbled[1].body = b"{\"not\":\"a body\"}".to_vec();
    formatted_with(&single, &garbled);
    let message = block_on(recover(&single)).unwrap_err().to_string();
    assert!(
        message.contains("(op 2): the prepare body does not decode"),
        "{message}"
    );
}

#[test]
fn a_journal_starting_above_the_checkpoint_needs_state_transfer_in_a_cluster() {
    for replica_count in [1, 3] {
        let dir = tempfile::tempdir().unwrap();
        let config = config(dir.path(), 4, 0, replica_count);
        formatted_with(&config, &[]);
        // The journal now starts at op 5: ops 1-4 are in neither the snapshot nor the journal.
        let journal_path = journal_dir(dir.path());
        std::fs::remove_file(segment_path(&journal_path, 1)).unwrap();
        let later: Vec<Prepare> = prepares(6, true).split_off(4);
        block_on(async {
            std::fs::write(segment_path(&journal_path, 5), b"").unwrap();
            let (mut journal, _) = Journal::open(&journal_path).await.unwrap();
            journal.append_batch(&later).await.unwrap();
        });
        let result = block_on(recover(&config));
        if replica_count == 1 {
            let message = result.unwrap_err().to_string();
            assert!(message.contains("ops 1 to 4 are missing"), "{message}");
            continue;
        }
        let boot = result.unwrap();
        assert_eq!(
            boot.outcome,
            RecoveryOutcome::NeedsStateTransfer {
                checkpoint_op: 0,
                journal_first_op: 5
            }
        );
        assert!(boot.recovered.prepares.is_empty());
        assert_eq!(boot.recovered.journal_first_op, 5);
        assert_eq!(boot.recovered.journal_last_op, 6);
    }
}

// ------------------------------------------------ issue 12 downgrade guard (superblock version)

/// Sets every copy of `data_dir`'s superblock to `version`, resealing each copy's checksum:
/// the file a binary of that version would have written (versions 1, 2 and 3 share the layout).
fn set_superblock_version(data_dir: &Path, version: u16) {
    let path = superblock_path(data_dir);
    let mut image = std::fs::read(&path).unwrap();
    for copy in image.chunks_mut(4096) {
        copy[8..10].copy_from_slice(&version.to_le_bytes());
        let checksum = twox_hash::XxHash3_128::oneshot(&copy[..112]);
        copy[112..128].copy_from_slice(&checksum.to_le_bytes());
    }
    std::fs::write(&path, &image).unwrap();
}

/// The version field of each of the 4 superblock copies of `data_dir`, read from the file.
fn superblock_versions(data_dir: &Path) -> Vec<u16> {
    let image = std::fs::read(superblock_path(data_dir)).unwrap();
    image
        .chunks(4096)
        .map(|copy| u16::from_le_bytes([copy[8], copy[9]]))
        .collect()
}

/// A directory of superblock version `version` (below the current one) boots, and every copy is
/// at version 3 on disk when `recover` returns; the next boot writes nothing to the superblock.
fn an_older_directory_boots_and_is_version_3_on_disk_when_recover_returns(version: u16) {
    let dir = tempfile::tempdir().unwrap();
    let single = config(dir.path(), 0, 0, 1);
    formatted_with(&single, &prepares(3, true));
    assert_eq!(superblock_versions(dir.path()), [3, 3, 3, 3]);
    // A directory a binary of `version` left (1: before issue 12; 2: before the timestamp rule).
    set_superblock_version(dir.path(), version);
    block_on(async {
        let boot = recover(&single).await.unwrap();
        // `recover` returns before the server opens any partition log (shard 0 bootstraps the
        // other shards, and they open their partitions, only after it): the upgrade is already
        // on disk, in every copy, so no entry under a newer checksum rule can be written before
        // it.
        assert_eq!(superblock_versions(dir.path()), [3, 3, 3, 3]);
        assert_eq!(boot.superblock.oldest_version(), 3);
        assert_eq!(boot.outcome, RecoveryOutcome::Clean);
        assert_eq!(boot.recovered.prepares, prepares(3, true));
        // The upgrade is one write of the same state: only the sequence moved.
        let state = *boot.superblock.state();
        assert_eq!((state.sequence, state.view, state.commit_max), (2, 0, 0));
    });
    // The next boot has nothing to upgrade and writes nothing to the superblock.
    let before = std::fs::read(superblock_path(dir.path())).unwrap();
    block_on(async {
        let boot = recover(&single).await.unwrap();
        assert_eq!(boot.superblock.state().sequence, 2);
    });
    assert_eq!(std::fs::read(superblock_path(dir.path())).unwrap(), before);
}

#[test]
fn issue12_downgrade_a_version_1_directory_boots_and_is_version_3_on_disk_when_recover_returns() {
    an_older_directory_boots_and_is_version_3_on_disk_when_recover_returns(1);
}

#[test]
fn issue12_timestamp_rule_a_version_2_directory_boots_and_is_version_3_on_disk_after_recover() {
    an_older_directory_boots_and_is_version_3_on_disk_when_recover_returns(2);
}

#[test]
fn issue12_downgrade_a_refused_boot_leaves_an_older_superblock_as_it_was() {
    for version in [1, 2] {
        let dir = tempfile::tempdir().unwrap();
        formatted_with(&config(dir.path(), 7, 0, 1), &prepares(2, true));
        set_superblock_version(dir.path(), version);
        let before = std::fs::read(superblock_path(dir.path())).unwrap();
        // Started with the wrong cluster: refused before the upgrade, so the file stays at
        // `version` (the binary it came from still boots it).
        let (field, ..) =
            identity_error(block_on(recover(&config(dir.path(), 8, 0, 1))).unwrap_err());
        assert_eq!(field, "cluster", "version {version}");
        assert_eq!(
            std::fs::read(superblock_path(dir.path())).unwrap(),
            before,
            "version {version}"
        );
    }
}

#[test]
fn issue12_downgrade_a_version_4_superblock_refuses_to_boot_naming_the_path_and_versions() {
    let dir = tempfile::tempdir().unwrap();
    let single = config(dir.path(), 0, 0, 1);
    formatted_with(&single, &prepares(2, true));
    set_superblock_version(dir.path(), 4);
    let superblock_before = std::fs::read(superblock_path(dir.path())).unwrap();
    let journal_before = std::fs::read(segment_path(&journal_dir(dir.path()), 1)).unwrap();
    let error = block_on(recover(&single)).unwrap_err();
    let message = error.to_string();
    let BootError::UnsupportedVersion { path, found, .. } = &error else {
        panic!("expected UnsupportedVersion, got {error:?}");
    };
    assert_eq!(
        (path.as_path(), *found),
        (superblock_path(dir.path()).as_path(), 4)
    );
    assert!(
        message.starts_with(&format!(
            "{}: superblock copy 0 has version 4, but this binary reads only versions 1 to 3",
            superblock_path(dir.path()).display()
        )),
        "{message}"
    );
    assert!(
        message.contains("supports superblock version 4 (a newer release)"),
        "{message}"
    );
    assert!(message.ends_with("; refusing to boot"), "{message}");
    // Nothing was written: not the superblock (never rewritten in an older version), not the
    // journal.
    assert_eq!(
        std::fs::read(superblock_path(dir.path())).unwrap(),
        superblock_before
    );
    assert_eq!(
        std::fs::read(segment_path(&journal_dir(dir.path()), 1)).unwrap(),
        journal_before
    );
}
