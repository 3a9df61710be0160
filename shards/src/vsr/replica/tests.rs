//! A tiny deterministic in-memory harness: replicas, a FIFO network with cut links, a journal
//! and superblock per replica that complete at once, crash and restart, and a state-transfer
//! server per replica (`OfferServer`, offers built from the replica's disk checkpoint). Test
//! names cite the rule they check (VSR Revisited section, or issue 8/9 section); the state
//! transfer tests live in `transfer_tests.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use storage::journal::Prepare;

use super::{CoreConfig, Recovered, Replica};
use crate::metadata::{MetadataOp, MetadataState};
use crate::vsr::client_table::{ClientTable, ClientTableSnapshot};
use crate::vsr::message::{
    Action, ClientReply, ClientRequest, ClientToken, Completion, Message, ReplicaIndex, Status,
};
use crate::vsr::prepare::PrepareOperation;
use crate::vsr::transfer::UnavailableReason;
use crate::vsr::transfer::receiver::CHUNK_TIMEOUT_TICKS;
use crate::vsr::transfer::server::{Offer, OfferServer, ServeOutput, ServerConfig};

#[path = "transfer_tests.rs"]
mod transfer_tests;

#[derive(Debug, Default)]
struct Disk {
    journal: BTreeMap<u64, Prepare>,
    /// The lowest op the journal may hold (records below were released by a checkpoint, or
    /// dropped by an install); 0 reads as 1.
    journal_first_op: u64,
    /// (view, log_view, commit_max).
    superblock: (u32, u32, u64),
    checkpoint: Option<(u64, MetadataState, ClientTableSnapshot)>,
}

impl Disk {
    fn journal_first_op(&self) -> u64 {
        self.journal_first_op.max(1)
    }
}

/// The harness's serving side: small chunks, so one transfer takes many round trips.
const HARNESS_SERVER: ServerConfig = ServerConfig {
    chunk_size_max: 512,
    frame_size_max: 1024 * 1024,
    chunk_timeout_ticks: CHUNK_TIMEOUT_TICKS,
};

struct Cluster {
    replicas: Vec<Option<Replica>>,
    disks: Vec<Disk>,
    network: VecDeque<(ReplicaIndex, ReplicaIndex, Message)>,
    io: VecDeque<(ReplicaIndex, Completion)>,
    replies: Vec<(ReplicaIndex, ClientToken, ClientReply)>,
    applied: Vec<Vec<u64>>,
    /// Links (from, to) that drop every message.
    cut: BTreeSet<(ReplicaIndex, ReplicaIndex)>,
    /// Drops every message it matches.
    drop_if: Option<fn(&Message) -> bool>,
    next_token: ClientToken,
    /// One state-transfer server per replica (a restart starts a fresh one).
    servers: Vec<OfferServer>,
    /// Ticks so far (the servers' clock).
    now: u64,
    /// A checkpoint releases the journal records at or below it (the real journal releases
    /// whole segments: with the default 64 MiB segment and small tests, never, hence off unless
    /// a test turns it on).
    release_journal: bool,
    /// `(replica, checkpoint_op)` of every InstallCheckpoint performed.
    installs: Vec<(ReplicaIndex, u64)>,
    /// The `checkpoint_interval` a restarted replica gets.
    checkpoint_interval: u64,
}

fn config(replica: ReplicaIndex, replica_count: u8) -> CoreConfig {
    CoreConfig {
        cluster: 1,
        replica,
        replica_count,
        pipeline_max: 8,
        heartbeat_ticks: 2,
        view_change_timeout_ticks: 10,
        clients_table_max: 64,
        checkpoint_interval: 1000,
        seed: u64::from(replica) + 1,
    }
}

fn fresh() -> Recovered {
    Recovered {
        view: 0,
        log_view: 0,
        commit_max: 0,
        checkpoint_op: 0,
        metadata: MetadataState::new(),
        client_table: ClientTable::new(64),
        prepares: Vec::new(),
        journal_last_op: 0,
        journal_first_op: 1,
    }
}

fn create_stream(stream_id: u32, name: &str) -> PrepareOperation {
    PrepareOperation::Metadata(MetadataOp::CreateStream {
        stream_id,
        name: name.to_owned(),
    })
}

impl Cluster {
    fn new(replica_count: u8) -> Cluster {
        let mut cluster = Cluster {
            replicas: Vec::new(),
            disks: (0..replica_count).map(|_| Disk::default()).collect(),
            network: VecDeque::new(),
            io: VecDeque::new(),
            replies: Vec::new(),
            applied: vec![Vec::new(); usize::from(replica_count)],
            cut: BTreeSet::new(),
            drop_if: None,
            next_token: 1,
            servers: (0..replica_count)
                .map(|index| OfferServer::new(index, HARNESS_SERVER))
                .collect(),
            now: 0,
            release_journal: false,
            installs: Vec::new(),
            checkpoint_interval: config(0, replica_count).checkpoint_interval,
        };
        for index in 0..replica_count {
            let (replica, actions) = Replica::open(config(index, replica_count), fresh());
            cluster.replicas.push(Some(replica));
            cluster.perform(index, actions);
        }
        // A fresh replica 0 cannot tell a first boot from a restart that lost unsynced
        // prepares, so it moves to view 1 at once (see `Replica::open`).
        cluster.settle();
        cluster
    }

    /// Every replica checkpoints every `interval` committed ops (restarts too).
    fn set_checkpoint_interval(&mut self, interval: u64) {
        self.checkpoint_interval = interval;
        for replica in self.replicas.iter_mut().flatten() {
            replica.config.checkpoint_interval = interval;
        }
    }

    /// Ticks until every live replica is normal in one view with one primary.
    fn settle(&mut self) {
        self.run();
        for _ in 0..200 {
            let live: Vec<&Replica> = self.replicas.iter().flatten().collect();
            let view = live[0].view();
            if self.primaries().len() == 1
                && live
                    .iter()
                    .all(|r| r.status() == Status::Normal && r.view() == view)
            {
                return;
            }
            self.tick(1);
        }
        panic!("the cluster did not settle on a primary");
    }

    fn primary(&self) -> ReplicaIndex {
        let primaries = self.primaries();
        assert_eq!(primaries.len(), 1, "one primary");
        primaries[0]
    }

    fn replica(&self, index: ReplicaIndex) -> &Replica {
        self.replicas[usize::from(index)]
            .as_ref()
            .expect("replica is up")
    }

    fn perform(&mut self, index: ReplicaIndex, actions: Vec<Action>) {
        let disk = &mut self.disks[usize::from(index)];
        for action in actions {
            match action {
                Action::Send { to, message } => {
                    assert_ne!(to, index, "a replica never sends to itself");
                    // `Cluster::send`, field by field (`disk` borrows the disks).
                    if !self.cut.contains(&(index, to))
                        && !self.drop_if.is_some_and(|drop| drop(&message))
                    {
                        self.network.push_back((index, to, message));
                    }
                }
                Action::WriteJournal { prepare } => {
                    let last = disk.journal.keys().next_back().copied();
                    if let Some(last) = last {
                        assert_eq!(prepare.op, last + 1, "journal writes are appends");
                    }
                    let checksum = storage::journal::JournalHeader::for_prepare(&prepare).checksum;
                    let op = prepare.op;
                    disk.journal.insert(op, prepare);
                    self.io
                        .push_back((index, Completion::JournalWritten { op, checksum }));
                }
                Action::TruncateJournal { op } => {
                    disk.journal.split_off(&(op + 1));
                    self.io
                        .push_back((index, Completion::JournalTruncated { op }));
                }
                Action::ReadJournal { op } => {
                    let prepare = disk.journal.get(&op).cloned();
                    self.io
                        .push_back((index, Completion::JournalRead { op, prepare }));
                }
                Action::WriteSuperblock {
                    view,
                    log_view,
                    commit_max,
                } => {
                    assert!(
                        (view, log_view) >= (disk.superblock.0, disk.superblock.1),
                        "the superblock never goes back in view"
                    );
                    assert!(
                        commit_max >= disk.superblock.2,
                        "the superblock's commit_max never decreases"
                    );
                    disk.superblock = (view, log_view, commit_max);
                    self.io
                        .push_back((index, Completion::SuperblockWritten { view, log_view }));
                }
                Action::Apply { op, .. } => {
                    let applied = &mut self.applied[usize::from(index)];
                    assert!(
                        applied.last().is_none_or(|&last| op == last + 1),
                        "replica {index} applies op {op} after {:?}",
                        applied.last()
                    );
                    applied.push(op);
                }
                Action::Reply { token, reply } => self.replies.push((index, token, reply)),
                Action::Checkpoint {
                    op,
                    metadata,
                    client_table,
                } => {
                    // A copy: holding the Arc would make every later apply copy the state.
                    disk.checkpoint = Some((op, (*metadata).clone(), client_table));
                    if self.release_journal {
                        disk.journal = disk.journal.split_off(&(op + 1));
                        disk.journal_first_op = op + 1;
                    }
                    self.io.push_back((
                        index,
                        Completion::CheckpointDone {
                            op,
                            journal_first_op: disk.journal_first_op(),
                        },
                    ));
                }
                Action::InstallCheckpoint {
                    checkpoint_op,
                    metadata,
                    client_table,
                } => {
                    // The driver's contract (`Action::InstallCheckpoint`): the snapshot, the
                    // pairing with commit_max at least checkpoint_op, then the journal restarted
                    // empty so that its next op is checkpoint_op + 1.
                    disk.checkpoint = Some((checkpoint_op, (*metadata).clone(), client_table));
                    disk.superblock.2 = disk.superblock.2.max(checkpoint_op);
                    disk.journal.clear();
                    disk.journal_first_op = checkpoint_op + 1;
                    self.applied[usize::from(index)] = (1..=checkpoint_op).collect();
                    self.installs.push((index, checkpoint_op));
                    self.io.push_back((
                        index,
                        Completion::CheckpointInstalled {
                            checkpoint_op,
                            degraded: false,
                        },
                    ));
                }
            }
        }
    }

    /// Queues `message` unless its link is cut or `drop_if` drops it.
    fn send(&mut self, from: ReplicaIndex, to: ReplicaIndex, message: Message) {
        if !self.cut.contains(&(from, to)) && !self.drop_if.is_some_and(|drop| drop(&message)) {
            self.network.push_back((from, to, message));
        }
    }

    /// Hands `message` to replica `to`: state-transfer requests to its server (as the driver
    /// routes them), everything else to its core.
    fn deliver(&mut self, from: ReplicaIndex, to: ReplicaIndex, message: Message) {
        let Some(replica) = self.replicas[usize::from(to)].as_mut() else {
            return;
        };
        if !message.is_state_transfer_request() {
            let actions = replica.on_message(from, message);
            self.perform(to, actions);
            return;
        }
        let availability = replica.transfer_availability();
        let view = replica.view();
        let server = &mut self.servers[usize::from(to)];
        let outputs = match message {
            Message::RequestStateTransfer { nonce, .. } => {
                server.on_request_transfer(from, nonce, availability, view, self.now)
            }
            Message::RequestStateChunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } => server.on_request_chunk(from, nonce, artifact, offset, len, view, self.now),
            other => unreachable!("not a state transfer request: {other:?}"),
        };
        self.serve(to, view, outputs);
    }

    /// Performs a server's outputs: sends, and offer builds from the disk's checkpoint.
    fn serve(&mut self, index: ReplicaIndex, view: u32, outputs: Vec<ServeOutput>) {
        let mut queue: VecDeque<ServeOutput> = outputs.into();
        while let Some(output) = queue.pop_front() {
            match output {
                ServeOutput::Send { to, message } => self.send(index, to, message),
                ServeOutput::BuildOffer { checkpoint_op } => {
                    let result = match &self.disks[usize::from(index)].checkpoint {
                        Some((op, metadata, table)) if *op == checkpoint_op => {
                            Offer::build(*op, metadata, table)
                                .map_err(|error| error.unavailable_reason())
                        }
                        _ => Err(UnavailableReason::CheckpointBeingReplaced),
                    };
                    let server = &mut self.servers[usize::from(index)];
                    queue.extend(server.offer_built(checkpoint_op, result, view, self.now));
                }
            }
        }
    }

    /// Delivers completions and messages until nothing is left (bounded).
    fn run(&mut self) {
        for _ in 0..100_000 {
            if let Some((index, completion)) = self.io.pop_front() {
                if let Some(replica) = self.replicas[usize::from(index)].as_mut() {
                    let actions = replica.on_io_done(completion);
                    self.perform(index, actions);
                }
                continue;
            }
            let Some((from, to, message)) = self.network.pop_front() else {
                return;
            };
            self.deliver(from, to, message);
        }
        panic!("the cluster did not go quiet");
    }

    /// Advances the servers' clock by one tick.
    fn tick_servers(&mut self) {
        self.now += 1;
        for server in &mut self.servers {
            server.on_tick(self.now);
        }
    }

    fn tick(&mut self, ticks: u64) {
        for _ in 0..ticks {
            self.tick_servers();
            for index in 0..self.replicas.len() as ReplicaIndex {
                if let Some(replica) = self.replicas[usize::from(index)].as_mut() {
                    let actions = replica.on_tick();
                    self.perform(index, actions);
                }
            }
            self.run();
        }
    }

    fn request(
        &mut self,
        at: ReplicaIndex,
        client: u128,
        request: u64,
        operation: PrepareOperation,
    ) -> ClientToken {
        let token = self.next_token;
        self.next_token += 1;
        let actions = self.replicas[usize::from(at)]
            .as_mut()
            .expect("replica is up")
            .on_request(ClientRequest {
                token,
                client,
                request,
                operation,
                timestamp_us: 1_000 * token,
            });
        self.perform(at, actions);
        token
    }

    fn reply_to(&self, token: ClientToken) -> Option<&ClientReply> {
        self.replies
            .iter()
            .find(|(_, t, _)| *t == token)
            .map(|(_, _, reply)| reply)
    }

    fn crash(&mut self, index: ReplicaIndex) {
        self.replicas[usize::from(index)] = None;
        self.io.retain(|(i, _)| *i != index);
        self.network.retain(|(_, to, _)| *to != index);
    }

    fn restart(&mut self, index: ReplicaIndex) -> Vec<Action> {
        let disk = &self.disks[usize::from(index)];
        let (checkpoint_op, metadata, client_table) = match &disk.checkpoint {
            Some((op, metadata, table)) => (
                *op,
                metadata.clone(),
                ClientTable::from_snapshot(table, 64).unwrap().0,
            ),
            None => (0, MetadataState::new(), ClientTable::new(64)),
        };
        let recovered = Recovered {
            view: disk.superblock.0,
            log_view: disk.superblock.1,
            commit_max: disk.superblock.2,
            checkpoint_op,
            metadata,
            client_table,
            prepares: disk
                .journal
                .range(checkpoint_op + 1..)
                .map(|(_, prepare)| prepare.clone())
                .collect(),
            journal_last_op: disk
                .journal
                .keys()
                .next_back()
                .copied()
                .unwrap_or(checkpoint_op),
            journal_first_op: disk.journal_first_op(),
        };
        let count = self.replicas.len() as u8;
        let mut config = config(index, count);
        config.checkpoint_interval = self.checkpoint_interval;
        let (replica, actions) = Replica::open(config, recovered);
        self.replicas[usize::from(index)] = Some(replica);
        self.servers[usize::from(index)] = OfferServer::new(index, HARNESS_SERVER);
        self.applied[usize::from(index)] = (1..=checkpoint_op).collect();
        self.perform(index, actions.clone());
        actions
    }

    fn primaries(&self) -> Vec<ReplicaIndex> {
        (0..self.replicas.len() as ReplicaIndex)
            .filter(|&i| {
                self.replicas[usize::from(i)]
                    .as_ref()
                    .is_some_and(Replica::is_primary)
            })
            .collect()
    }

    /// Every pair of live replicas agrees on the prepares both committed, and on the state at a
    /// common commit point.
    fn check_agreement(&self) {
        let live: Vec<&Replica> = self.replicas.iter().flatten().collect();
        for a in &live {
            for b in &live {
                let common = a.commit_min().min(b.commit_min());
                for op in 1..=common {
                    if let (Some(x), Some(y)) = (a.committed_checksum(op), b.committed_checksum(op))
                    {
                        assert_eq!(x, y, "replicas committed different prepares at op {op}");
                    }
                }
                if a.commit_min() == b.commit_min() {
                    assert_eq!(a.state_digest(), b.state_digest());
                }
            }
        }
    }
}

fn session_of(reply: Option<&ClientReply>) -> u64 {
    match reply {
        Some(ClientReply::Registered { session }) => *session,
        other => panic!("expected Registered, got {other:?}"),
    }
}

fn is_success(reply: Option<&ClientReply>) -> bool {
    matches!(reply, Some(ClientReply::Committed(cached)) if cached.error_code == 0)
}

/// The primary and the two backups of a settled 3-replica cluster.
fn roles(cluster: &Cluster) -> (ReplicaIndex, ReplicaIndex, ReplicaIndex) {
    let p = cluster.primary();
    let mut backups = (0..3).filter(|&i| i != p);
    (p, backups.next().unwrap(), backups.next().unwrap())
}

#[test]
fn vsr_4_1_normal_case_commits_register_and_create_stream_on_all_replicas() {
    let mut cluster = Cluster::new(3);
    let (p, _, _) = roles(&cluster);
    let register = cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    assert_eq!(session_of(cluster.reply_to(register)), 1);
    let create = cluster.request(p, 7, 1, create_stream(1, "orders"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
    // The backups learn the commit from the heartbeat.
    cluster.tick(4);
    for index in 0..3 {
        let replica = cluster.replica(index);
        assert_eq!(replica.commit_min(), 2, "replica {index}");
        assert!(replica.metadata().streams.contains_key(&1));
        assert_eq!(cluster.applied[usize::from(index)], vec![1, 2]);
    }
    cluster.check_agreement();
}

#[test]
fn vsr_4_1_pipeline_prepares_eight_concurrent_requests_before_any_commit() {
    let mut cluster = Cluster::new(3);
    let (p, _, _) = roles(&cluster);
    let tokens: Vec<ClientToken> = (1..=8u128)
        .map(|client| cluster.request(p, client, 0, PrepareOperation::Register))
        .collect();
    // All eight are prepared before a single PrepareOk came back.
    assert_eq!(cluster.replica(p).op(), 8);
    assert_eq!(cluster.replica(p).commit_max(), 0);
    // A ninth waits in the queue until the pipeline has room.
    let ninth = cluster.request(p, 9, 0, PrepareOperation::Register);
    assert_eq!(cluster.replica(p).op(), 8);
    cluster.run();
    for (index, token) in tokens.iter().enumerate() {
        assert_eq!(session_of(cluster.reply_to(*token)), index as u64 + 1);
    }
    assert_eq!(session_of(cluster.reply_to(ninth)), 9);
    cluster.tick(4);
    for index in 0..3 {
        assert_eq!(cluster.replica(index).commit_min(), 9);
    }
    cluster.check_agreement();
}

#[test]
fn vsr_4_1_client_table_answers_a_duplicate_with_the_cached_reply() {
    let mut cluster = Cluster::new(3);
    let (p, _, _) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    // A retry while the request is in the pipeline attaches to it: one prepare, two replies.
    let first = cluster.request(p, 7, 1, create_stream(1, "a"));
    let retry = cluster.request(p, 7, 1, create_stream(1, "a"));
    assert_eq!(cluster.replica(p).op(), 2);
    cluster.run();
    assert!(is_success(cluster.reply_to(first)));
    assert_eq!(cluster.reply_to(first), cluster.reply_to(retry));
    // After the commit: the cached reply, nothing prepared.
    let late = cluster.request(p, 7, 1, create_stream(1, "a"));
    assert_eq!(cluster.reply_to(late), cluster.reply_to(first));
    assert_eq!(cluster.replica(p).op(), 2);
    // Same number, other arguments: refused.
    let other = cluster.request(p, 7, 1, create_stream(2, "b"));
    assert!(matches!(
        cluster.reply_to(other),
        Some(ClientReply::Error {
            code: bus::ErrorCode::InvalidArgument,
            ..
        })
    ));
    // Register again: the same session.
    let again = cluster.request(p, 7, 0, PrepareOperation::Register);
    assert_eq!(session_of(cluster.reply_to(again)), 1);
    // No session: evicted.
    let stranger = cluster.request(p, 8, 1, create_stream(3, "c"));
    assert!(matches!(
        cluster.reply_to(stranger),
        Some(ClientReply::Evicted { .. })
    ));
    // Client id 0: refused.
    let zero = cluster.request(p, 0, 0, PrepareOperation::Register);
    assert!(matches!(
        cluster.reply_to(zero),
        Some(ClientReply::Error {
            code: bus::ErrorCode::InvalidArgument,
            ..
        })
    ));
}

#[test]
fn vsr_4_1_a_conflicting_pipelined_change_commits_as_a_rejection_on_every_replica() {
    let mut cluster = Cluster::new(3);
    let (p, _, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.request(p, 8, 0, PrepareOperation::Register);
    cluster.run();
    let first = cluster.request(p, 7, 1, create_stream(1, "same"));
    let second = cluster.request(p, 8, 1, create_stream(2, "same"));
    cluster.run();
    assert!(is_success(cluster.reply_to(first)));
    match cluster.reply_to(second) {
        Some(ClientReply::Committed(cached)) => {
            assert_eq!(
                cached.error_code,
                bus::ErrorCode::StreamAlreadyExists as u32
            );
        }
        other => panic!("expected a committed rejection, got {other:?}"),
    }
    cluster.tick(4);
    cluster.check_agreement();
    assert_eq!(cluster.replica(b2).metadata().streams.len(), 1);
    assert_eq!(cluster.replica(b2).commit_min(), 4);
}

#[test]
fn vsr_issue8_2_backup_answers_not_primary_with_the_primary() {
    let mut cluster = Cluster::new(3);
    let (p, b1, _) = roles(&cluster);
    let view = cluster.replica(b1).view();
    let token = cluster.request(b1, 7, 0, PrepareOperation::Register);
    assert_eq!(
        cluster.reply_to(token),
        Some(&ClientReply::NotPrimary {
            view,
            primary: Some(p)
        })
    );
    assert_eq!(cluster.replica(b1).op(), 0);
}

#[test]
fn vsr_4_1_single_replica_commits_at_its_own_fsync() {
    let mut cluster = Cluster::new(1);
    assert!(cluster.replica(0).is_primary());
    assert_eq!(cluster.replica(0).view(), 0);
    let register = cluster.request(0, 7, 0, PrepareOperation::Register);
    cluster.run();
    assert_eq!(session_of(cluster.reply_to(register)), 1);
    let create = cluster.request(0, 7, 1, create_stream(1, "a"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
    // Restart: every journaled prepare is committed (its fsync was the commit).
    cluster.crash(0);
    cluster.applied[0].clear();
    cluster.restart(0);
    assert_eq!(cluster.replica(0).commit_min(), 2);
    assert!(cluster.replica(0).is_primary());
    assert!(cluster.replica(0).metadata().streams.contains_key(&1));
}

#[test]
fn vsr_4_2_primary_crash_leads_to_a_view_change_and_the_new_primary_commits() {
    let mut cluster = Cluster::new(3);
    let (p, b1, b2) = roles(&cluster);
    let view = cluster.replica(p).view();
    let register = cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    assert_eq!(session_of(cluster.reply_to(register)), 1);
    cluster.crash(p);
    cluster.tick(60);
    let primary = cluster.primary();
    assert_ne!(primary, p);
    assert!(cluster.replica(primary).view() > view);
    let create = cluster.request(primary, 7, 1, create_stream(1, "a"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
    cluster.tick(4);
    cluster.check_agreement();
    for index in [b1, b2] {
        assert_eq!(cluster.replica(index).commit_min(), 2);
    }
}

#[test]
fn vsr_4_2_an_op_acknowledged_to_the_client_survives_the_view_change() {
    let mut cluster = Cluster::new(3);
    let (p, b1, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.tick(4);
    // b2 hears nothing from the primary; b1 journals and acknowledges.
    cluster.cut.insert((p, b2));
    let create = cluster.request(p, 7, 1, create_stream(1, "kept"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
    assert_eq!(cluster.replica(b2).op(), 1);
    // The primary dies before any backup learns the commit.
    cluster.crash(p);
    cluster.cut.clear();
    cluster.tick(60);
    for index in [b1, b2] {
        let replica = cluster.replica(index);
        assert_eq!(replica.status(), Status::Normal);
        assert_eq!(replica.commit_min(), 2, "replica {index}");
        assert!(replica.metadata().streams.contains_key(&1));
    }
    cluster.check_agreement();
    // A retry of the committed request at the new primary gets its original reply.
    let primary = cluster.primary();
    let retry = cluster.request(primary, 7, 1, create_stream(1, "kept"));
    assert_eq!(cluster.reply_to(retry), cluster.reply_to(create));
    assert_eq!(cluster.replica(primary).op(), 2);
}

#[test]
fn vsr_issue8_2_a_lagging_backup_repairs_a_gap() {
    let mut cluster = Cluster::new(3);
    let (p, _, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.cut.insert((p, b2));
    for request in 1..=5 {
        cluster.request(
            p,
            7,
            request,
            create_stream(request as u32, &format!("s{request}")),
        );
        cluster.run();
    }
    assert_eq!(cluster.replica(p).commit_min(), 6);
    assert_eq!(cluster.replica(b2).op(), 1);
    cluster.cut.clear();
    // The next prepare is ahead of b2's log: it repairs ops 2..=6 from peers.
    cluster.request(p, 7, 6, create_stream(6, "s6"));
    cluster.run();
    cluster.tick(6);
    assert_eq!(cluster.replica(b2).op(), 7);
    assert_eq!(cluster.replica(b2).commit_min(), 7);
    assert_eq!(
        cluster.applied[usize::from(b2)],
        (1..=7).collect::<Vec<u64>>()
    );
    cluster.check_agreement();
}

#[test]
fn vsr_issue8_2_restart_of_a_former_primary_moves_to_the_next_view() {
    let mut cluster = Cluster::new(3);
    let (p, _, _) = roles(&cluster);
    let view = cluster.replica(p).view();
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.tick(4);
    cluster.crash(p);
    let actions = cluster.restart(p);
    let replica = cluster.replica(p);
    assert_eq!(replica.view(), view + 1);
    assert_eq!(replica.status(), Status::ViewChange);
    // The superblock's commit_max was 0 (no checkpoint or view change wrote it since): op 1 is
    // kept as an uncommitted log until the new view's primary confirms it.
    assert_eq!(replica.op(), 1);
    assert!(matches!(
        actions.first(),
        Some(Action::WriteSuperblock { view: v, log_view: lv, .. }) if *v == view + 1 && *lv == view
    ));
    // Nothing is sent before the superblock holds the new view.
    assert!(!actions.iter().any(|a| matches!(a, Action::Send { .. })));
    cluster.settle();
    cluster.tick(4);
    assert_eq!(cluster.replica(p).commit_min(), 1);
    cluster.check_agreement();
    let primary = cluster.primary();
    let create = cluster.request(primary, 7, 1, create_stream(1, "a"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
}

#[test]
fn vsr_issue8_2_restart_truncates_a_damaged_journal_tail_and_repairs_it() {
    let mut cluster = Cluster::new(3);
    let (p, b1, _) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    for request in 1..=3 {
        cluster.request(
            p,
            7,
            request,
            create_stream(request as u32, &format!("s{request}")),
        );
        cluster.run();
    }
    cluster.tick(4);
    assert_eq!(cluster.replica(b1).commit_min(), 4);
    // b1 restarts with its record at op 3 damaged: recovery hands over ops 1..=2 only.
    cluster.crash(b1);
    let damaged = cluster.disks[usize::from(b1)].journal.remove(&3).unwrap();
    let last_op = *cluster.disks[usize::from(b1)]
        .journal
        .keys()
        .next_back()
        .unwrap();
    cluster.disks[usize::from(b1)].journal.split_off(&3);
    let mut recovered = fresh();
    let superblock = cluster.disks[usize::from(b1)].superblock;
    recovered.view = superblock.0;
    recovered.log_view = superblock.1;
    recovered.commit_max = superblock.2;
    recovered.prepares = cluster.disks[usize::from(b1)]
        .journal
        .values()
        .cloned()
        .collect();
    recovered.journal_last_op = last_op;
    let (replica, actions) = Replica::open(config(b1, 3), recovered);
    assert!(actions.contains(&Action::TruncateJournal { op: 2 }));
    assert_eq!(replica.op(), 2);
    cluster.replicas[usize::from(b1)] = Some(replica);
    cluster.applied[usize::from(b1)] = Vec::new();
    cluster.perform(b1, actions);
    cluster.settle();
    cluster.tick(10);
    let replica = cluster.replica(b1);
    assert_eq!(replica.op(), 4);
    assert_eq!(replica.commit_min(), 4);
    assert_eq!(
        cluster.disks[usize::from(b1)].journal.get(&3),
        Some(&damaged),
        "the repaired prepare is the committed one"
    );
    cluster.check_agreement();
}

/// A backup holding an uncommitted prepare from an old view that the new view does not keep
/// truncates it (section 4.2 step 5: the new primary's log wins above the commit point).
#[test]
fn vsr_4_2_start_view_truncates_a_backups_divergent_uncommitted_suffix() {
    let mut cluster = Cluster::new(3);
    let (p, b1, b2) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.tick(4);
    // Only b1 gets op 2; the primary never commits it (b2 and the primary's acks are cut).
    cluster.cut.insert((p, b2));
    cluster.cut.insert((b1, p));
    let lost = cluster.request(p, 7, 1, create_stream(1, "lost"));
    cluster.run();
    assert!(cluster.reply_to(lost).is_none());
    assert_eq!(cluster.replica(b1).op(), 2);
    // The primary dies and its write of op 2 is lost with it (a crash before the fsync: it
    // never counted itself for op 2); b1 is cut off while p and b2 form a new view.
    cluster.crash(p);
    cluster.disks[usize::from(p)].journal.remove(&2);
    cluster.cut.clear();
    for other in [p, b2] {
        cluster.cut.insert((b1, other));
        cluster.cut.insert((other, b1));
    }
    cluster.restart(p);
    cluster.tick(80);
    let primary = cluster.primaries()[0];
    assert_ne!(primary, b1);
    let kept = cluster.request(primary, 7, 1, create_stream(2, "kept"));
    cluster.run();
    assert!(
        is_success(cluster.reply_to(kept)),
        "{:?} primary {primary} view {} p {p} b1 {b1} b2 {b2}",
        cluster.reply_to(kept),
        cluster.replica(primary).view()
    );
    // b1 rejoins: its op 2 is replaced by the new view's op 2.
    cluster.cut.clear();
    cluster.tick(80);
    let replica = cluster.replica(b1);
    assert_eq!(replica.status(), Status::Normal);
    assert_eq!(replica.commit_min(), 2);
    assert!(replica.metadata().streams.contains_key(&2));
    assert!(!replica.metadata().streams.contains_key(&1));
    cluster.check_agreement();
}

/// A client of the soak test: one request outstanding, retried on `NotPrimary`, `Busy` or a
/// silence, at the replica it last heard is primary.
#[derive(Debug)]
struct SoakClient {
    id: u128,
    /// The request outstanding: its number (0 = Register) and when it was last sent.
    request: u64,
    sent_tick: Option<u64>,
    token: ClientToken,
    guess: ReplicaIndex,
    registered: bool,
}

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        self.0 >> 33
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

/// Message loss, reordering and crashes of one replica at a time, then a healed network:
/// replicas never commit different prepares at an op, every acknowledged create is applied
/// exactly once, and everyone converges (issue 8 section 4's checks, in miniature).
#[test]
fn vsr_4_safety_and_liveness_under_loss_reorder_and_crashes() {
    let seeds: u64 = std::env::var("VSR_SOAK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    for seed in 0..seeds {
        soak(seed, None);
    }
}

/// The same with checkpoints every 4 ops that release the journal below them (issue 9): a
/// replica that was down, or lost messages, while its peers released the ops it needs catches
/// up by state transfer, under the same loss and crashes, and the same checks hold.
#[test]
fn issue9_safety_and_liveness_with_journal_release_under_loss_and_crashes() {
    let seeds: u64 = std::env::var("VSR_SOAK_SEEDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(16);
    let first: u64 = std::env::var("VSR_SOAK_FIRST")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let installs: usize = (first..first + seeds).map(|seed| soak(seed, Some(4))).sum();
    eprintln!("state-transfer installs over {seeds} seeds: {installs}");
    assert!(installs > 0, "no seed exercised a state transfer");
}

/// One soak run; `release_interval`: checkpoint every that many ops and release the journal
/// at or below each checkpoint. Returns the state-transfer installs performed.
fn soak(seed: u64, release_interval: Option<u64>) -> usize {
    let env = |name: &str, default: u64| {
        std::env::var(name)
            .ok()
            .and_then(|value| value.parse().ok())
            .unwrap_or(default)
    };
    let count = env("VSR_SOAK_REPLICAS", 3) as u8;
    let drop_percent = env("VSR_SOAK_DROP", 10);
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9) + 1);
    let mut cluster = Cluster::new(count);
    if let Some(interval) = release_interval {
        cluster.set_checkpoint_interval(interval);
        cluster.release_journal = true;
    }
    let mut clients: Vec<SoakClient> = (1..=4u128)
        .map(|id| SoakClient {
            id,
            request: 0,
            sent_tick: None,
            token: 0,
            guess: 0,
            registered: false,
        })
        .collect();
    // Streams whose create was acknowledged and whose delete was not.
    let mut acknowledged: BTreeSet<u32> = BTreeSet::new();
    let mut acknowledged_count = 0u64;
    let mut down: Option<(ReplicaIndex, u64)> = None;
    let fault_ticks = 1_500u64;
    for tick in 0..fault_ticks + 600 {
        let faults = tick < fault_ticks;
        if let Some((victim, at)) = down
            && (tick >= at || !faults)
        {
            cluster.restart(victim);
            down = None;
        }
        // Clients (quiet for the last ticks, so the commit point can settle).
        for client in clients.iter_mut().filter(|_| tick < fault_ticks + 400) {
            let due = client.sent_tick.is_none_or(|sent| tick >= sent + 40);
            if !due {
                continue;
            }
            if cluster.replicas[usize::from(client.guess)].is_none() {
                client.guess = (client.guess + 1) % count;
                continue;
            }
            // Odd requests create a stream, even ones delete it again (the state stays small).
            let stream_id = (client.id as u32) * 10_000 + (client.request as u32).div_ceil(2);
            let operation = if !client.registered {
                PrepareOperation::Register
            } else if client.request % 2 == 1 {
                create_stream(stream_id, &format!("s{stream_id}"))
            } else {
                PrepareOperation::Metadata(MetadataOp::DeleteStream { stream_id })
            };
            let request = if client.registered { client.request } else { 0 };
            client.token = cluster.request(client.guess, client.id, request, operation);
            client.sent_tick = Some(tick);
        }
        // Network: deliver in random order, dropping some.
        let mut messages: Vec<_> = cluster.network.drain(..).collect();
        while !messages.is_empty() {
            let (from, to, message) = messages.swap_remove((rng.next() as usize) % messages.len());
            if faults && rng.chance(drop_percent) {
                continue;
            }
            cluster.deliver(from, to, message);
            // Completions lag behind sometimes: a crash then loses the writes not yet durable.
            while rng.chance(70)
                && let Some((index, completion)) = cluster.io.pop_front()
            {
                if let Some(replica) = cluster.replicas[usize::from(index)].as_mut() {
                    let actions = replica.on_io_done(completion);
                    cluster.perform(index, actions);
                }
            }
        }
        // Crash and restart one replica at a time.
        if faults && down.is_none() && rng.chance(1) {
            let victim = (rng.next() % u64::from(count)) as ReplicaIndex;
            let unsynced = cluster
                .io
                .iter()
                .filter_map(|(index, completion)| match completion {
                    Completion::JournalWritten { op, .. } if *index == victim => Some(*op),
                    _ => None,
                })
                .min();
            if let Some(op) = unsynced {
                cluster.disks[usize::from(victim)].journal.split_off(&op);
            }
            cluster.crash(victim);
            down = Some((victim, tick + 20 + rng.next() % 60));
        }
        cluster.tick_servers();
        for index in 0..count {
            if let Some(replica) = cluster.replicas[usize::from(index)].as_mut() {
                let actions = replica.on_tick();
                cluster.perform(index, actions);
            }
        }
        while let Some((index, completion)) = cluster.io.pop_front() {
            if let Some(replica) = cluster.replicas[usize::from(index)].as_mut() {
                let actions = replica.on_io_done(completion);
                cluster.perform(index, actions);
            }
        }
        // Replies.
        for (_, token, reply) in std::mem::take(&mut cluster.replies) {
            let Some(client) = clients.iter_mut().find(|c| c.token == token) else {
                continue;
            };
            match reply {
                ClientReply::Registered { .. } => {
                    client.registered = true;
                    client.request = 1;
                    client.sent_tick = Some(tick.saturating_sub(35));
                }
                ClientReply::Committed(cached) => {
                    assert_eq!(
                        cached.error_code,
                        0,
                        "seed {seed}: client {} request {} applied twice or rejected: {:?}",
                        client.id,
                        client.request,
                        String::from_utf8_lossy(&cached.body)
                    );
                    let stream_id =
                        (client.id as u32) * 10_000 + (client.request as u32).div_ceil(2);
                    if client.request % 2 == 1 {
                        acknowledged.insert(stream_id);
                    } else {
                        acknowledged.remove(&stream_id);
                    }
                    acknowledged_count += 1;
                    client.request += 1;
                    // Paced (the state machine's name check is linear in the stream count).
                    client.sent_tick = Some(tick.saturating_sub(35));
                }
                ClientReply::NotPrimary { primary, .. } => {
                    client.guess = primary.unwrap_or((client.guess + 1) % count);
                    client.sent_tick = Some(tick.saturating_sub(35));
                }
                ClientReply::Error {
                    code: bus::ErrorCode::Busy,
                    ..
                } => {}
                other => panic!("seed {seed}: unexpected reply {other:?}"),
            }
        }
        if tick % 100 == 0 {
            cluster.check_agreement();
        }
    }
    cluster.check_agreement();
    // Liveness: healed, everyone converges.
    let live: Vec<&Replica> = cluster.replicas.iter().flatten().collect();
    assert_eq!(live.len(), usize::from(count), "seed {seed}");
    let commit = live[0].commit_min();
    for replica in &live {
        assert_eq!(
            replica.commit_min(),
            commit,
            "seed {seed}: replicas converge"
        );
        assert_eq!(
            replica.state_digest(),
            live[0].state_digest(),
            "seed {seed}"
        );
        assert_eq!(replica.status(), Status::Normal, "seed {seed}");
    }
    let streams: BTreeSet<u32> = live[0].metadata().streams.keys().copied().collect();
    // A delete in flight at the end may have committed unacknowledged; a create in flight may
    // have too: compare only what the clients know.
    for client in &clients {
        let current = (client.id as u32) * 10_000 + (client.request as u32).div_ceil(2);
        let known: BTreeSet<u32> = acknowledged
            .iter()
            .copied()
            .filter(|&id| id / 10_000 == client.id as u32 && id != current)
            .collect();
        let present: BTreeSet<u32> = streams
            .iter()
            .copied()
            .filter(|&id| id / 10_000 == client.id as u32 && id != current)
            .collect();
        assert_eq!(known, present, "seed {seed}: client {} state", client.id);
    }
    assert!(
        acknowledged_count > 100,
        "seed {seed}: progress {acknowledged_count}"
    );
    cluster.installs.len()
}

/// sim finding F1: a new primary inherits a client's Register uncommitted; the client's next
/// request must be prepared after it, not answered `Evicted` from the applied table.
#[test]
fn vsr_4_2_new_primary_prepares_a_request_behind_an_inherited_uncommitted_register() {
    let mut cluster = Cluster::new(3);
    let (p, _, _) = roles(&cluster);
    cluster.tick(4);
    let register = cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    assert_eq!(session_of(cluster.reply_to(register)), 1);
    // The primary dies before a heartbeat carries commit 1; the new view cannot re-commit
    // op 1 while PrepareOks are lost.
    cluster.crash(p);
    cluster.drop_if = Some(|message| matches!(message, Message::PrepareOk { .. }));
    for _ in 0..100 {
        if !cluster.primaries().is_empty() {
            break;
        }
        cluster.tick(1);
    }
    let primary = cluster.primary();
    assert_eq!(cluster.replica(primary).commit_min(), 0);
    assert_eq!(cluster.replica(primary).op(), 1);
    let create = cluster.request(primary, 7, 1, create_stream(1, "a"));
    assert!(
        cluster.reply_to(create).is_none(),
        "{:?}",
        cluster.reply_to(create)
    );
    assert_eq!(cluster.replica(primary).op(), 2);
    cluster.drop_if = None;
    cluster.tick(6);
    let backup = (0..3).find(|&i| i != primary && i != p).unwrap();
    assert!(
        is_success(cluster.reply_to(create)),
        "{:?} primary op {} commit {} status {:?}; backup op {} commit {} verified {} status {:?} view {}",
        cluster.reply_to(create),
        cluster.replica(primary).op(),
        cluster.replica(primary).commit_max(),
        cluster.replica(primary).status(),
        cluster.replica(backup).op(),
        cluster.replica(backup).commit_max(),
        cluster.replica(backup).verified_op,
        cluster.replica(backup).status(),
        cluster.replica(backup).view(),
    );
    cluster.check_agreement();
}

/// A prepare of client 7's request `request` (a create) at `op`, committing nothing.
fn prepare_at(op: u64, view: u32, parent: u128, request: u64) -> Prepare {
    Prepare {
        op,
        view,
        commit: 0,
        body: crate::vsr::prepare::PrepareBody::new(
            7,
            request,
            create_stream(request as u32, &format!("s{request}")),
            0,
            parent,
        )
        .encode(),
    }
}

fn checksum_of(prepare: &Prepare) -> u128 {
    storage::journal::JournalHeader::for_prepare(prepare).checksum
}

/// sim finding F3: a backup adopting a StartView whose prepares do not connect to its log keeps
/// its old log_view (its log is not yet the view's log: a DoViewChange must not claim it is)
/// and acknowledges nothing until repair connects the chain.
#[test]
fn vsr_4_2_start_view_with_a_gap_keeps_log_view_until_the_chain_connects() {
    let (mut replica, actions) = Replica::open(config(1, 3), fresh());
    assert!(actions.is_empty());
    assert_eq!(replica.status(), Status::Normal);
    // Op 1 of view 0 from primary 0, journaled.
    let first = prepare_at(1, 0, 0, 1);
    let actions = replica.on_message(
        0,
        Message::Prepare {
            prepare: first.clone(),
        },
    );
    assert!(matches!(actions.as_slice(), [Action::WriteJournal { .. }]));
    replica.on_io_done(Completion::JournalWritten {
        op: 1,
        checksum: checksum_of(&first),
    });
    // View 3's primary (0) starts the view with ops up to 4; it sends only op 4, whose parent
    // the backup does not hold.
    let second = prepare_at(2, 3, checksum_of(&first), 2);
    let third = prepare_at(3, 3, checksum_of(&second), 3);
    let fourth = prepare_at(4, 3, checksum_of(&third), 4);
    let actions = replica.on_message(
        0,
        Message::StartView {
            view: 3,
            op: 4,
            commit: 1,
            prepares: vec![fourth.clone()],
        },
    );
    assert_eq!(replica.view(), 3);
    assert_eq!(replica.log_view(), 0, "the log is not view 3's yet");
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::Send {
            to: 0,
            message: Message::RequestPrepare { op: 3, .. }
        }
    )));
    assert!(!actions.iter().any(|a| matches!(
        a,
        Action::Send {
            message: Message::PrepareOk { .. },
            ..
        }
    )));
    replica.on_io_done(Completion::SuperblockWritten {
        view: 3,
        log_view: 0,
    });
    // Repair answers arrive (a prepare of any view is accepted when its checksum is wanted).
    replica.on_message(0, Message::Prepare { prepare: third });
    replica.on_message(2, Message::Prepare { prepare: second });
    assert_eq!(replica.op(), 4);
    assert_eq!(
        replica.log_view(),
        0,
        "the rewritten prepares are not durable yet"
    );
    let mut actions = Vec::new();
    for op in 2..=4 {
        let checksum = replica.log.get(&op).unwrap().checksum;
        actions.extend(replica.on_io_done(Completion::JournalWritten { op, checksum }));
    }
    assert_eq!(replica.log_view(), 3);
    assert!(actions.iter().any(|a| matches!(
        a,
        Action::WriteSuperblock {
            view: 3,
            log_view: 3,
            ..
        }
    )));
    let actions = replica.on_io_done(Completion::SuperblockWritten {
        view: 3,
        log_view: 3,
    });
    let acknowledged: Vec<u64> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Send {
                to: 0,
                message: Message::PrepareOk { op, .. },
            } => Some(*op),
            _ => None,
        })
        .collect();
    assert_eq!(acknowledged, vec![2, 3, 4]);
    assert_eq!(replica.commit_min(), 1);
}

/// Checkpoints every few ops release memory below the previous checkpoint, and a restarted
/// replica rebuilt from its checkpoint and journal catches up through repair.
#[test]
fn vsr_checkpoint_releases_memory_and_a_restarted_backup_catches_up() {
    let mut cluster = Cluster::new(3);
    for replica in cluster.replicas.iter_mut().flatten() {
        replica.config.checkpoint_interval = 4;
    }
    let (p, b1, _) = roles(&cluster);
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    cluster.crash(b1);
    for request in 1..=20 {
        cluster.request(
            p,
            7,
            request,
            create_stream(request as u32, &format!("s{request}")),
        );
        cluster.run();
    }
    cluster.tick(4);
    let primary = cluster.replica(p);
    assert_eq!(primary.commit_min(), 21);
    assert!(primary.checkpoint_op() >= 16);
    assert!(
        primary.committed_checksum(2).is_none(),
        "released from memory"
    );
    assert!(primary.committed_checksum(21).is_some());
    cluster.restart(b1);
    cluster.tick(40);
    assert_eq!(cluster.replica(b1).commit_min(), 21);
    cluster.check_agreement();
}

/// Performs `actions` on a lone replica: journal writes and superblock writes complete at
/// once; returns everything it asked for along the way.
fn complete_io(replica: &mut Replica, actions: Vec<Action>) -> Vec<Action> {
    let mut all = Vec::new();
    let mut queue: VecDeque<Action> = actions.into();
    while let Some(action) = queue.pop_front() {
        let completion = match &action {
            Action::WriteJournal { prepare } => Some(Completion::JournalWritten {
                op: prepare.op,
                checksum: checksum_of(prepare),
            }),
            Action::WriteSuperblock { view, log_view, .. } => Some(Completion::SuperblockWritten {
                view: *view,
                log_view: *log_view,
            }),
            _ => None,
        };
        all.push(action);
        if let Some(completion) = completion {
            queue.extend(replica.on_io_done(completion));
        }
    }
    all
}

/// Section 4.2 step 3: the new primary takes the log with the highest log_view, and among
/// those the highest op, even when its own log is longer.
#[test]
fn vsr_4_2_do_view_change_picks_highest_log_view_then_op() {
    // Replica 1 holds ops 1..=3 of view 0 (log_view 0).
    let (mut replica, _) = Replica::open(config(1, 3), fresh());
    let mut parent = 0;
    let mut own = Vec::new();
    for op in 1..=3 {
        let prepare = prepare_at(op, 0, parent, op);
        parent = checksum_of(&prepare);
        own.push(prepare.clone());
        let actions = replica.on_message(0, Message::Prepare { prepare });
        complete_io(&mut replica, actions);
    }
    assert_eq!(replica.op(), 3);
    // View 4 (primary 4 % 3 = 1): replica 0 starts the view change.
    let actions = replica.on_message(0, Message::StartViewChange { view: 4 });
    complete_io(&mut replica, actions);
    assert_eq!(replica.view(), 4);
    assert_eq!(replica.status(), Status::ViewChange);
    // Replica 2's log: log_view 2, only two ops, the first differing from replica 1's.
    let other_first = prepare_at(1, 2, 0, 11);
    let other_second = prepare_at(2, 2, checksum_of(&other_first), 12);
    let actions = replica.on_message(
        2,
        Message::DoViewChange {
            view: 4,
            log_view: 2,
            op: 2,
            commit: 0,
            prepares: vec![other_first.clone(), other_second.clone()],
        },
    );
    let all = complete_io(&mut replica, actions);
    assert!(all.contains(&Action::TruncateJournal { op: 0 }));
    assert!(replica.is_primary());
    assert_eq!(replica.log_view(), 4);
    assert_eq!(replica.op(), 2);
    assert_eq!(
        replica.log.get(&2).map(|e| e.checksum),
        Some(checksum_of(&other_second))
    );
    assert!(all.iter().any(|a| matches!(
        a,
        Action::Send {
            message: Message::StartView { view: 4, op: 2, .. },
            ..
        }
    )));

    // Same log_view: the highest op wins over the new primary's own shorter log.
    let (mut replica, _) = Replica::open(config(1, 3), fresh());
    let actions = replica.on_message(
        0,
        Message::Prepare {
            prepare: own[0].clone(),
        },
    );
    complete_io(&mut replica, actions);
    let actions = replica.on_message(0, Message::StartViewChange { view: 4 });
    complete_io(&mut replica, actions);
    let actions = replica.on_message(
        2,
        Message::DoViewChange {
            view: 4,
            log_view: 0,
            op: 3,
            commit: 0,
            prepares: own.clone(),
        },
    );
    complete_io(&mut replica, actions);
    assert!(replica.is_primary());
    assert_eq!(replica.op(), 3);
    assert_eq!(
        replica.log.get(&3).map(|e| e.checksum),
        Some(checksum_of(&own[2]))
    );
}

/// sim finding (session-kept, seed 433 under heavy loss): a primary cut off from its backups
/// may be deposed while a client registers in the new view; it must not answer that client
/// `Evicted` from its stale table. It holds the answer until a quorum confirms it, and
/// answers `NotPrimary` once it learns the newer view.
#[test]
fn vsr_4_1_a_deposed_primary_does_not_answer_no_session_from_a_stale_table() {
    let mut cluster = Cluster::new(3);
    let (p, b1, b2) = roles(&cluster);
    cluster.tick(4);
    for other in [b1, b2] {
        cluster.cut.insert((p, other));
        cluster.cut.insert((other, p));
    }
    cluster.tick(80);
    let primary = cluster
        .primaries()
        .into_iter()
        .find(|&i| i != p)
        .expect("the backups elect a new primary");
    let register = cluster.request(primary, 9, 0, PrepareOperation::Register);
    cluster.run();
    assert_eq!(session_of(cluster.reply_to(register)), 1);
    assert!(
        cluster.replica(p).is_primary(),
        "the old primary does not know yet"
    );
    let stale = cluster.request(p, 9, 1, create_stream(1, "a"));
    cluster.tick(2);
    assert_eq!(cluster.reply_to(stale), None);
    cluster.cut.clear();
    cluster.tick(20);
    assert!(matches!(
        cluster.reply_to(stale),
        Some(ClientReply::NotPrimary { .. })
    ));
    cluster.check_agreement();
}

/// Integrator I1: a single replica whose journal refuses a write for lack of space answers
/// `StorageFull` at once, applies nothing, and reuses the op once space returns.
#[test]
fn vsr_4_1_single_replica_journal_full_answers_storage_full_and_reuses_the_op() {
    let (mut replica, _) = Replica::open(config(0, 1), fresh());
    let request = |token, client, operation| ClientRequest {
        token,
        client,
        request: 0,
        operation,
        timestamp_us: 0,
    };
    let actions = replica.on_request(request(1, 7, PrepareOperation::Register));
    assert!(matches!(actions.as_slice(), [Action::WriteJournal { .. }]));
    let queued = replica.on_request(request(2, 8, PrepareOperation::Register));
    assert!(matches!(queued.as_slice(), [Action::WriteJournal { .. }]));
    let actions = replica.on_io_done(Completion::JournalFailed {
        op: 1,
        retryable: true,
        reason: "journal/00000000000000000001.wal: 0 bytes free".to_owned(),
    });
    let full: Vec<ClientToken> = actions
        .iter()
        .filter_map(|a| match a {
            Action::Reply {
                token,
                reply:
                    ClientReply::Error {
                        code: bus::ErrorCode::StorageFull,
                        message,
                    },
            } => {
                // The client learns which file and how much space: the driver's reason.
                assert!(
                    message.ends_with("00000000000000000001.wal: 0 bytes free"),
                    "{message}"
                );
                Some(*token)
            }
            _ => None,
        })
        .collect();
    assert_eq!(full, vec![1, 2]);
    assert!(actions.contains(&Action::TruncateJournal { op: 0 }));
    assert_eq!(replica.op(), 0);
    assert_eq!(replica.commit_min(), 0);
    // The second write's failure (it could not follow the first) changes nothing more.
    assert!(
        replica
            .on_io_done(Completion::JournalFailed {
                op: 2,
                retryable: true,
                reason: String::new(),
            })
            .is_empty()
    );
    // Space is back: op 1 is reused and commits.
    let actions = replica.on_request(request(3, 7, PrepareOperation::Register));
    let Some(Action::WriteJournal { prepare }) = actions.first() else {
        panic!("expected a journal write, got {actions:?}");
    };
    assert_eq!(prepare.op, 1);
    let actions = replica.on_io_done(Completion::JournalWritten {
        op: 1,
        checksum: checksum_of(prepare),
    });
    assert!(actions.contains(&Action::Reply {
        token: 3,
        reply: ClientReply::Registered { session: 1 }
    }));
}

/// A view never decreases (VSR Revisited section 4.2): a message naming a view above
/// `VIEW_MAX` (a forged or broken peer) is ignored, so `view + 1` can never wrap to 0.
#[test]
fn vsr_4_2_a_message_above_view_max_is_ignored_and_the_view_never_wraps() {
    let mut cluster = Cluster::new(3);
    let (p, b1, _) = roles(&cluster);
    let view = cluster.replica(b1).view();
    for message in [
        Message::StartViewChange { view: u32::MAX },
        Message::StartView {
            view: u32::MAX,
            op: 0,
            commit: 0,
            prepares: Vec::new(),
        },
        Message::Commit {
            view: u32::MAX,
            commit: 0,
            commit_checksum: 0,
        },
    ] {
        let actions = cluster.replicas[usize::from(b1)]
            .as_mut()
            .unwrap()
            .on_message(p, message);
        assert!(actions.is_empty(), "{actions:?}");
        assert_eq!(cluster.replica(b1).view(), view);
    }
    // The cluster keeps committing in its view.
    let token = cluster.request(p, 9, 0, PrepareOperation::Register);
    cluster.run();
    assert!(session_of(cluster.reply_to(token)) > 0);
    assert_eq!(cluster.replica(b1).view(), view);
}

/// sim finding F10 (seed 1547): a replica whose recovery cut its journal at a damaged record
/// may have acknowledged prepares above the cut; its DoViewChange would claim a log without
/// them, and a quorum counting it could drop a committed op (section 4.2 step 3; 4.3: a
/// recovering replica takes no part in a view change). It sends no DoViewChange until its log
/// reaches the lost op again or it installs a newer view.
#[test]
fn vsr_4_3_a_replica_that_lost_journal_records_sends_no_do_view_change() {
    let first = prepare_at(1, 0, 0, 1);
    let do_view_changes = |journal_last_op: u64| {
        let mut recovered = fresh();
        recovered.prepares = vec![first.clone()];
        recovered.journal_last_op = journal_last_op;
        // Replica 2: a backup in view 0; view 4's primary is replica 1.
        let (mut replica, actions) = Replica::open(config(2, 3), recovered);
        complete_io(&mut replica, actions);
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
    // Intact journal: the DoViewChange goes to the new primary.
    assert_eq!(do_view_changes(1), 1);
    // Records 2..=3 were damaged (maybe acknowledged): no DoViewChange.
    assert_eq!(do_view_changes(3), 0);
}

/// Found by the journal-release soak (seed 58): every replica restarted from a checkpoint at
/// its top op holds no prepare in memory, so no primary-to-be could learn its top prepare's
/// checksum and every view change waited for it forever. The top is committed, so after
/// asking for a while the new primary prepares naming no parent (VSR Revisited section 4.2;
/// `Replica::ask_top_checksum`), and the cluster commits again.
#[test]
fn vsr_4_2_a_cluster_restarted_at_its_checkpoint_elects_a_primary() {
    let mut cluster = Cluster::new(3);
    cluster.set_checkpoint_interval(4);
    let p = cluster.primary();
    cluster.request(p, 7, 0, PrepareOperation::Register);
    cluster.run();
    for request in 1..=3 {
        cluster.request(p, 7, request, create_stream(request as u32, "s"));
        cluster.run();
    }
    cluster.tick(4);
    for index in 0..3 {
        assert_eq!(cluster.replica(index).checkpoint_op(), 4);
    }
    for index in 0..3 {
        cluster.crash(index);
    }
    for index in 0..3 {
        cluster.restart(index);
    }
    cluster.settle();
    let primary = cluster.primary();
    let create = cluster.request(primary, 7, 4, create_stream(4, "after"));
    cluster.run();
    assert!(is_success(cluster.reply_to(create)));
    cluster.tick(4);
    for index in 0..3 {
        assert_eq!(cluster.replica(index).commit_min(), 5);
    }
    cluster.check_agreement();
}
