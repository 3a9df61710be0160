//! State transfer through the core (issue 9 section 4, DESIGN section 10): a lagging replica
//! fetches, checks, installs and adopts a peer's checkpoint, then repairs the tail; a refused
//! restore changes nothing; the install window journals and applies nothing.

use super::*;
use crate::vsr::transfer::client_table_wire;
use crate::vsr::transfer::receiver::Stage;
use crate::vsr::transfer::{ArtifactKind, TransferTarget};

/// What a refused restore must leave exactly as it was.
#[derive(Debug, PartialEq)]
struct Observed {
    state_digest: u64,
    op: u64,
    commit_min: u64,
    commit_max: u64,
    checkpoint_op: u64,
    metadata: MetadataState,
}

fn observe(replica: &Replica) -> Observed {
    Observed {
        state_digest: replica.state_digest(),
        op: replica.op(),
        commit_min: replica.commit_min(),
        commit_max: replica.commit_max(),
        checkpoint_op: replica.checkpoint_op(),
        metadata: (**replica.metadata()).clone(),
    }
}

/// Replica 2 of 3, a backup in view 0 restarted from a checkpoint at op 5 (a stream, a session)
/// with `log_ops` journaled prepares above it, whose primary (replica 0) keeps saying op 50 is
/// committed, with a checksum no peer answers for: repair fails round after round, and it asks
/// the primary for a state transfer. Returns the replica and the attempt's nonce.
fn lagging_backup(log_ops: u64) -> (Replica, u64) {
    lagging_backup_with(log_ops, 5, config(2, 3))
}

/// [`lagging_backup`] whose superblock says `commit_max` (the journaled ops up to it are
/// applied again at open) and whose core runs with `config`.
fn lagging_backup_with(log_ops: u64, commit_max: u64, config: CoreConfig) -> (Replica, u64) {
    let mut metadata = MetadataState::new();
    metadata.apply(
        3,
        &MetadataOp::CreateStream {
            stream_id: 1,
            name: "kept".to_owned(),
        },
    );
    let mut client_table = ClientTable::new(64);
    client_table.register(9, 2);
    let mut prepares: Vec<Prepare> = Vec::new();
    for op in 6..6 + log_ops {
        let parent = prepares.last().map_or(0, checksum_of);
        prepares.push(prepare_at(op, 0, parent, op));
    }
    let recovered = Recovered {
        commit_max,
        checkpoint_op: 5,
        metadata,
        client_table,
        journal_last_op: 5 + log_ops,
        prepares,
        journal_first_op: 6,
        ..fresh()
    };
    let (mut replica, actions) = Replica::open(config, recovered);
    complete_io(&mut replica, actions);
    for _ in 0..500 {
        let mut actions = replica.on_message(
            0,
            Message::Commit {
                view: 0,
                commit: 50,
                commit_checksum: 0xabc,
            },
        );
        actions.extend(replica.on_tick());
        for action in complete_io(&mut replica, actions) {
            if let Action::Send {
                to: 0,
                message: Message::RequestStateTransfer { nonce, .. },
            } = action
            {
                assert_eq!(replica.transfer_stage(), Stage::AwaitingTarget);
                return (replica, nonce);
            }
        }
    }
    panic!("the lagging backup never asked for a state transfer");
}

/// The checkpoint at op 40 the primary offers: two streams, two sessions.
fn checkpoint_40() -> (MetadataState, ClientTableSnapshot) {
    let mut metadata = MetadataState::new();
    for (op, stream_id) in [(3, 1), (31, 2)] {
        metadata.apply(
            op,
            &MetadataOp::CreateStream {
                stream_id,
                name: format!("s{stream_id}"),
            },
        );
    }
    let mut table = ClientTable::new(64);
    table.register(9, 2);
    table.register(11, 30);
    (metadata, table.to_snapshot())
}

/// Serves `offer` to `replica`'s transfer `nonce` as replica 0 would, in chunks of at most 7
/// bytes, until the replica asks for nothing more; returns every action it asked for.
fn fetch(replica: &mut Replica, nonce: u64, offer: &Offer) -> Vec<Action> {
    let mut all = Vec::new();
    let mut actions = replica.on_message(
        0,
        Message::StateTransferTarget {
            view: 0,
            nonce,
            target: TransferTarget::Available {
                checkpoint_op: offer.checkpoint_op(),
                manifest: offer.manifest().clone(),
            },
        },
    );
    loop {
        let request = actions.iter().find_map(|action| match action {
            Action::Send {
                to: 0,
                message:
                    Message::RequestStateChunk {
                        artifact,
                        offset,
                        len,
                        ..
                    },
            } => Some((*artifact, *offset, *len)),
            _ => None,
        });
        all.extend(actions);
        let Some((artifact, offset, len)) = request else {
            return all;
        };
        let bytes = offer.artifact(artifact).expect("requested kind is offered");
        let end = (offset + u64::from(len))
            .min(offset + 7)
            .min(bytes.len() as u64);
        actions = replica.on_message(
            0,
            Message::StateChunk {
                view: 0,
                nonce,
                artifact,
                offset,
                payload: bytes[offset as usize..end as usize].to_vec(),
            },
        );
    }
}

fn install_of(actions: &[Action]) -> Option<u64> {
    actions.iter().find_map(|action| match action {
        Action::InstallCheckpoint { checkpoint_op, .. } => Some(*checkpoint_op),
        _ => None,
    })
}

/// Issue 9 section 4, two-phase restore: fetched artifacts whose checksums hold but whose state
/// is not restorable (metadata past the checkpoint, a session committed past it, metadata that
/// does not decode) are refused as a failed round before anything is mutated.
#[test]
fn issue9_refused_restore_leaves_state_untouched() {
    let (metadata, table) = checkpoint_40();
    let mut metadata_ahead = metadata.clone();
    metadata_ahead.apply(45, &MetadataOp::DeleteStream { stream_id: 2 });
    let mut table_ahead = ClientTable::from_snapshot(&table, 64).unwrap().0;
    table_ahead.register(12, 45);
    let cases = [
        (
            "metadata past the checkpoint",
            Offer::build(40, &metadata_ahead, &table).unwrap(),
        ),
        (
            "session past the checkpoint",
            Offer::build(40, &metadata, &table_ahead.to_snapshot()).unwrap(),
        ),
        (
            "metadata that does not decode",
            Offer::from_artifacts(
                40,
                vec![
                    (ArtifactKind::Metadata, b"{\"streams\":".to_vec()),
                    (
                        ArtifactKind::ClientTable,
                        client_table_wire::encode(&table).unwrap(),
                    ),
                ],
            ),
        ),
    ];
    for (case, offer) in cases {
        let (mut replica, nonce) = lagging_backup(0);
        let before = observe(&replica);
        let actions = fetch(&mut replica, nonce, &offer);
        assert_eq!(install_of(&actions), None, "{case}");
        assert_eq!(observe(&replica), before, "{case}: nothing mutated");
        assert_eq!(replica.transfer_stage(), Stage::Idle, "{case}");
        assert_eq!(replica.transfer_counters().failed_rounds, 1, "{case}");
        assert_eq!(replica.transfer_counters().installed, 0, "{case}");
    }
}

/// Issue 9 section 4: while the driver installs, the core journals, applies and checkpoints
/// nothing (a prepare from the primary is dropped, a commit applies nothing); the install
/// completion adopts the checkpoint: state, commit_min = op = checkpoint_op.
#[test]
fn issue9_installing_journals_nothing_and_applies_nothing() {
    let (metadata, table) = checkpoint_40();
    let offer = Offer::build(40, &metadata, &table).unwrap();
    let (mut replica, nonce) = lagging_backup(3);
    let actions = fetch(&mut replica, nonce, &offer);
    assert_eq!(install_of(&actions), Some(40));
    assert_eq!(replica.transfer_stage(), Stage::Installing);
    let mut during = replica.on_message(
        0,
        Message::Prepare {
            prepare: prepare_at(9, 0, 0, 9),
        },
    );
    during.extend(replica.on_message(
        0,
        Message::Commit {
            view: 0,
            commit: 50,
            commit_checksum: 0xabc,
        },
    ));
    for _ in 0..50 {
        during.extend(replica.on_tick());
    }
    assert!(
        during.iter().all(|action| !matches!(
            action,
            Action::WriteJournal { .. }
                | Action::TruncateJournal { .. }
                | Action::Apply { .. }
                | Action::Checkpoint { .. }
                | Action::WriteSuperblock { .. }
        )),
        "{during:?}"
    );
    assert_eq!(
        replica.status(),
        Status::Normal,
        "no view change while installing"
    );
    assert_eq!(replica.commit_min(), 5);
    let actions = replica.on_io_done(Completion::CheckpointInstalled {
        checkpoint_op: 40,
        degraded: false,
    });
    assert!(
        !actions.iter().any(|a| matches!(a, Action::Apply { .. })),
        "{actions:?}"
    );
    assert_eq!(
        (replica.commit_min(), replica.op(), replica.checkpoint_op()),
        (40, 40, 40)
    );
    assert_eq!(replica.commit_max(), 50);
    assert_eq!(**replica.metadata(), metadata);
    assert_eq!(replica.client_table().to_snapshot(), table);
    let expected = crate::vsr::snapshot::encode_payload(40, &metadata, &table);
    assert_eq!(
        replica.state_digest(),
        twox_hash::XxHash3_64::oneshot(&expected)
    );
    assert_eq!(replica.transfer_stage(), Stage::Idle);
    // The 50 silent ticks of the install are not held against the primary.
    replica.on_tick();
    assert_eq!(
        replica.status(),
        Status::Normal,
        "no view change after the install"
    );
}

/// Issue 9 section 4: an install whose superblock pairing write failed after the snapshot was
/// in place succeeded: it is adopted, counted as degraded, and not retried as a failure.
#[test]
fn issue9_degraded_install_reported_as_success() {
    let (metadata, table) = checkpoint_40();
    let offer = Offer::build(40, &metadata, &table).unwrap();
    let (mut replica, nonce) = lagging_backup(0);
    fetch(&mut replica, nonce, &offer);
    replica.on_io_done(Completion::CheckpointInstalled {
        checkpoint_op: 40,
        degraded: true,
    });
    assert_eq!(replica.commit_min(), 40);
    assert_eq!(replica.transfer_stage(), Stage::Idle);
    let counters = replica.transfer_counters();
    assert_eq!(
        (
            counters.installed,
            counters.degraded_installs,
            counters.failed_rounds
        ),
        (1, 1, 0)
    );
}

/// Issue 9 section 4: an install the driver could not make durable changed nothing: a failed
/// round, and the replica goes on from the state it had.
#[test]
fn issue9_install_failed_is_a_failed_round_and_keeps_the_state() {
    let (metadata, table) = checkpoint_40();
    let offer = Offer::build(40, &metadata, &table).unwrap();
    let (mut replica, nonce) = lagging_backup(3);
    let before = observe(&replica);
    fetch(&mut replica, nonce, &offer);
    replica.on_io_done(Completion::InstallFailed {
        checkpoint_op: 40,
        reason: "snapshot write: no space".to_owned(),
    });
    assert_eq!(observe(&replica), before);
    assert_eq!(replica.transfer_stage(), Stage::Idle);
    let counters = replica.transfer_counters();
    assert_eq!((counters.installed, counters.failed_rounds), (0, 1));
}

/// Issue 9 section 4 with sim finding F10's rule (VSR Revisited 4.2 step 3, 4.3): an install
/// below the old log's top dropped prepares the replica may have acknowledged, so it sends no
/// DoViewChange until its log is back up to that op; an install above the old log sends one.
#[test]
fn issue9_install_below_the_old_log_withholds_do_view_change() {
    let do_view_changes = |log_ops: u64| {
        let (metadata, table) = checkpoint_40();
        let offer = Offer::build(40, &metadata, &table).unwrap();
        let (mut replica, nonce) = lagging_backup(log_ops);
        fetch(&mut replica, nonce, &offer);
        let actions = replica.on_io_done(Completion::CheckpointInstalled {
            checkpoint_op: 40,
            degraded: false,
        });
        complete_io(&mut replica, actions);
        // View 4's primary is replica 1.
        let actions = replica.on_message(0, Message::StartViewChange { view: 4 });
        let all = complete_io(&mut replica, actions);
        assert_eq!(replica.status(), Status::ViewChange);
        all.iter()
            .filter(|a| {
                matches!(
                    a,
                    Action::Send {
                        message: Message::DoViewChange { .. },
                        ..
                    }
                )
            })
            .count()
    };
    // The old log ended at op 30, below the checkpoint: nothing acknowledged was dropped.
    assert_eq!(do_view_changes(25), 1);
    // The old log reached op 45: ops 41..=45 may have been acknowledged.
    assert_eq!(do_view_changes(40), 0);
}

/// Ticks until `replica` applied `commit` (bounded), delivering everything.
fn tick_until_caught_up(cluster: &mut Cluster, replica: ReplicaIndex, commit: u64) {
    for _ in 0..2_000 {
        if cluster
            .replicas
            .get(usize::from(replica))
            .and_then(Option::as_ref)
            .is_some_and(|r| r.commit_min() >= commit)
        {
            return;
        }
        cluster.tick(1);
    }
    let r = cluster.replica(replica);
    panic!(
        "replica {replica} did not catch up to op {commit}: commit_min {}, op {}, stage {:?}, \
         counters {:?}",
        r.commit_min(),
        r.op(),
        r.transfer_stage(),
        r.transfer_counters()
    );
}

/// Makes `target` the primary by crashing primaries in turn (each restarted once the next view
/// settled): `view % 3` walks through every index.
fn make_primary(cluster: &mut Cluster, target: ReplicaIndex) {
    for _ in 0..3 {
        let primary = cluster.primary();
        if primary == target {
            return;
        }
        cluster.crash(primary);
        cluster.settle();
        cluster.restart(primary);
        cluster.settle();
        cluster.tick(10);
    }
    assert_eq!(cluster.primary(), target);
}

/// Issue 9 section 4 end to end in the core: replica b2 is cut off while the others commit
/// several checkpoint intervals and release their journals below the checkpoint; reconnected,
/// no peer supplies the ops it needs, so it transfers the primary's checkpoint, installs it,
/// repairs the tail, and agrees with the others. A client's retry of a request committed below
/// the checkpoint is answered from the installed client table once b2 is primary.
#[test]
fn issue9_lagging_replica_transfers_installs_and_repairs_tail() {
    let mut cluster = Cluster::new(3);
    cluster.release_journal = true;
    cluster.set_checkpoint_interval(4);
    let (p, _, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    let first = cluster.request(p, 7, 1, create_stream(1, "first"));
    cluster.run();
    let first_reply = match cluster.reply_to(first) {
        Some(ClientReply::Committed(cached)) if cached.error_code == 0 => cached.clone(),
        other => panic!("expected a committed create, got {other:?}"),
    };
    cluster.tick(4);
    assert_eq!(cluster.replica(b2).commit_min(), 2);
    for other in (0..3).filter(|&i| i != b2) {
        cluster.cut.insert((other, b2));
        cluster.cut.insert((b2, other));
    }
    // No ticks while b2 is cut off (it would start view changes of its own).
    cluster.request(p, 8, 0, PrepareOperation::Register);
    cluster.run();
    for request in 1..=20 {
        let stream = 100 + request as u32;
        cluster.request(p, 8, request, create_stream(stream, &format!("s{stream}")));
        cluster.run();
    }
    let commit = cluster.replica(p).commit_min();
    assert_eq!(commit, 23);
    let checkpoint_op = cluster.replica(p).checkpoint_op();
    assert!(checkpoint_op >= 16, "checkpoint at {checkpoint_op}");
    assert!(
        cluster.disks[usize::from(p)]
            .journal
            .keys()
            .all(|&op| op > checkpoint_op),
        "the primary released its journal at or below the checkpoint"
    );
    cluster.cut.clear();
    tick_until_caught_up(&mut cluster, b2, commit);
    let lagging = cluster.replica(b2);
    let counters = lagging.transfer_counters();
    assert_eq!(counters.installed, 1, "{counters:?}");
    assert_eq!(counters.degraded_installs, 0);
    assert_eq!(lagging.transfer_stage(), Stage::Idle);
    assert_eq!(cluster.installs, vec![(b2, checkpoint_op)]);
    assert_eq!(
        cluster.applied[usize::from(b2)],
        (1..=commit).collect::<Vec<u64>>(),
        "applied up to the install, then the tail"
    );
    // The journal holds the repaired tail only: nothing at or below the checkpoint.
    let journal: Vec<u64> = cluster.disks[usize::from(b2)]
        .journal
        .keys()
        .copied()
        .collect();
    assert_eq!(journal, (checkpoint_op + 1..=commit).collect::<Vec<u64>>());
    cluster.tick(4);
    cluster.check_agreement();
    for index in 0..3 {
        assert_eq!(
            cluster.replica(index).state_digest(),
            cluster.replica(p).state_digest()
        );
    }
    // The retry of client 7's request 1 (committed at op 2, below the checkpoint) is answered
    // from the installed client table, not applied again.
    make_primary(&mut cluster, b2);
    let retry = cluster.request(b2, 7, 1, create_stream(1, "first"));
    cluster.run();
    assert_eq!(
        cluster.reply_to(retry),
        Some(&ClientReply::Committed(first_reply))
    );
    assert_eq!(cluster.replica(b2).commit_min(), commit, "nothing applied");
}

/// The transfer path in the sim's fault list, deterministic: the serving primary crashes while
/// b2 fetches. The chunks in flight go unanswered (its restarted server holds no offer), the
/// attempt is abandoned after its re-sends, and a later one at the new view's primary
/// completes: b2 installs and catches up, and everyone agrees.
#[test]
fn issue9_primary_crash_mid_transfer_retries_at_the_new_primary() {
    let mut cluster = Cluster::new(3);
    cluster.release_journal = true;
    cluster.set_checkpoint_interval(4);
    let (p, _, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.tick(4);
    for other in (0..3).filter(|&i| i != b2) {
        cluster.cut.insert((other, b2));
        cluster.cut.insert((b2, other));
    }
    for request in 1..=20 {
        cluster.request(
            p,
            7,
            request,
            create_stream(request as u32, &format!("s{request}")),
        );
        cluster.run();
    }
    let commit = cluster.replica(p).commit_min();
    cluster.cut.clear();
    // Chunks are lost until the primary crashes: b2 stays in the middle of its fetch.
    cluster.drop_if = Some(|message| matches!(message, Message::StateChunk { .. }));
    for _ in 0..1_000 {
        if cluster.replica(b2).transfer_stage() == Stage::Fetching {
            break;
        }
        cluster.tick(1);
    }
    assert_eq!(cluster.replica(b2).transfer_stage(), Stage::Fetching);
    cluster.drop_if = None;
    cluster.crash(p);
    cluster.settle();
    let primary = cluster.primary();
    assert_ne!(primary, p);
    cluster.restart(p);
    tick_until_caught_up(&mut cluster, b2, commit);
    let counters = cluster.replica(b2).transfer_counters();
    assert_eq!(counters.installed, 1, "{counters:?}");
    assert!(counters.started >= 2, "{counters:?}");
    cluster.tick(10);
    cluster.check_agreement();
    for index in 0..3 {
        assert_eq!(
            cluster.replica(index).state_digest(),
            cluster.replica(primary).state_digest()
        );
    }
}

/// Issue 9 section 4: a stale WAL suffix above the transfer floor that conflicts with the
/// cluster is truncated, never replayed. b2 journals ops 2..=9 from a primary that then loses
/// them (crash before its own writes were durable); the cluster commits other ops 2..=10 and
/// checkpoints at 8, releasing ops 2..=3 everywhere. b2's forked op 9 is above the checkpoint it
/// installs: the install drops it, repair writes the committed op 9, and a restart of b2 finds
/// only committed prepares.
#[test]
fn issue9_stale_wal_suffix_truncated_after_install() {
    let mut cluster = Cluster::new(3);
    cluster.release_journal = true;
    cluster.set_checkpoint_interval(4);
    let (p, b1, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.tick(4);
    // Only b2 gets ops 2..=9; the primary hears no PrepareOk.
    cluster.cut.insert((p, b1));
    cluster.cut.insert((b2, p));
    for request in 1..=8 {
        cluster.request(p, 7, request, create_stream(request as u32, "forked"));
        cluster.run();
    }
    assert_eq!(cluster.replica(b2).op(), 9);
    let forked = cluster.disks[usize::from(b2)].journal[&9].clone();
    cluster.crash(b2);
    cluster.crash(p);
    // The primary's writes of ops 2..=9 were not durable.
    cluster.disks[usize::from(p)].journal.split_off(&2);
    cluster.cut.clear();
    cluster.restart(p);
    cluster.settle();
    let primary = cluster.primary();
    cluster.request(primary, 8, 0, PrepareOperation::Register);
    cluster.run();
    for request in 1..=8 {
        let stream = 100 + request as u32;
        cluster.request(
            primary,
            8,
            request,
            create_stream(stream, &format!("s{stream}")),
        );
        cluster.run();
    }
    cluster.tick(4);
    assert_eq!(cluster.replica(primary).commit_min(), 10);
    assert_eq!(cluster.replica(primary).checkpoint_op(), 8);
    let committed_9 = cluster.disks[usize::from(primary)].journal[&9].clone();
    assert_ne!(checksum_of(&committed_9), checksum_of(&forked));
    cluster.restart(b2);
    assert_eq!(
        cluster.replica(b2).op(),
        9,
        "b2 recovered its forked suffix"
    );
    tick_until_caught_up(&mut cluster, b2, 10);
    assert_eq!(cluster.installs, vec![(b2, 8)]);
    assert_eq!(
        cluster.disks[usize::from(b2)].journal.get(&9),
        Some(&committed_9),
        "the forked op 9 was truncated and the committed one written"
    );
    cluster.tick(4);
    cluster.check_agreement();
    assert_eq!(
        cluster.replica(b2).state_digest(),
        cluster.replica(primary).state_digest()
    );
    assert!(
        !cluster
            .replica(b2)
            .metadata()
            .streams
            .values()
            .any(|stream| stream.name == "forked"),
        "no forked op was applied"
    );
    // A restart replays the installed checkpoint and the committed tail only.
    cluster.crash(b2);
    cluster.restart(b2);
    cluster.tick(10);
    assert_eq!(cluster.replica(b2).commit_min(), 10);
    assert_eq!(
        cluster.replica(b2).state_digest(),
        cluster.replica(primary).state_digest()
    );
}

/// Issue 9 section 4 with DESIGN section 9's checkpoint lock: an install verified while the
/// replica's own checkpoint is being written waits for it (an older snapshot must not land
/// over the installed one), then goes ahead.
#[test]
fn issue9_install_waits_for_the_checkpoint_in_progress() {
    let mut config = config(2, 3);
    config.checkpoint_interval = 2;
    // Ops 6..=8 are applied at open; the checkpoint at op 7 is never completed until below.
    let (mut replica, nonce) = lagging_backup_with(3, 8, config);
    assert_eq!(replica.commit_min(), 8);
    let (metadata, table) = checkpoint_40();
    let offer = Offer::build(40, &metadata, &table).unwrap();
    let actions = fetch(&mut replica, nonce, &offer);
    assert_eq!(
        install_of(&actions),
        None,
        "waits for the checkpoint at op 7"
    );
    assert_eq!(replica.transfer_stage(), Stage::Installing);
    let actions = replica.on_io_done(Completion::CheckpointDone {
        op: 7,
        journal_first_op: 6,
    });
    assert_eq!(install_of(&actions), Some(40));
    assert!(
        !actions
            .iter()
            .any(|a| matches!(a, Action::Checkpoint { .. })),
        "no new checkpoint while installing: {actions:?}"
    );
    replica.on_io_done(Completion::CheckpointInstalled {
        checkpoint_op: 40,
        degraded: false,
    });
    assert_eq!((replica.commit_min(), replica.checkpoint_op()), (40, 40));
}

/// H5 finding O1 (sim seed 1, plain config): repair answered by every peer must not count as
/// failing. A backup walks down a chain of 50 missing ops, one round trip per op (each prepare
/// names the op below it), with a round trip longer than the repair retry interval; it re-asked
/// for the ops it already held waiting to connect, those re-asks counted as failed rounds, and a
/// transfer no one needed started (issue 9 section 4: only a gap below every peer's retained
/// journal needs one).
#[test]
fn issue9_answered_repairs_never_start_a_transfer() {
    const ROUND_TRIP_TICKS: u64 = 3;
    let mut chain: Vec<Prepare> = Vec::new();
    for op in 1..=50 {
        let parent = chain.last().map_or(0, checksum_of);
        chain.push(prepare_at(op, 0, parent, op));
    }
    let top = checksum_of(&chain[49]);
    let (mut replica, actions) = Replica::open(config(2, 3), fresh());
    complete_io(&mut replica, actions);
    // (tick the answer arrives, op)
    let mut in_flight: VecDeque<(u64, u64)> = VecDeque::new();
    for tick in 0..1_000 {
        let mut actions = Vec::new();
        while let Some(&(due, op)) = in_flight.front()
            && due <= tick
        {
            in_flight.pop_front();
            let prepare = chain[usize::try_from(op).unwrap() - 1].clone();
            actions.extend(replica.on_message(0, Message::Prepare { prepare }));
        }
        actions.extend(replica.on_message(
            0,
            Message::Commit {
                view: 0,
                commit: 50,
                commit_checksum: top,
            },
        ));
        actions.extend(replica.on_tick());
        for action in complete_io(&mut replica, actions) {
            match action {
                Action::Send {
                    message: Message::RequestPrepare { op, .. },
                    ..
                } => in_flight.push_back((tick + ROUND_TRIP_TICKS, op)),
                Action::Send {
                    message: Message::RequestStateTransfer { .. },
                    ..
                } => panic!(
                    "a transfer started at tick {tick} although every repair was answered \
                     (op {}, commit_min {})",
                    replica.op(),
                    replica.commit_min()
                ),
                _ => {}
            }
        }
        if replica.commit_min() == 50 {
            break;
        }
    }
    assert_eq!(replica.commit_min(), 50);
    assert_eq!(replica.transfer_counters().started, 0);
}
