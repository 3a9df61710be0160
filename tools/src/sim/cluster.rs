//! The simulated world of one seed: `replica_count` real [`Replica`] cores, each with its own
//! simulated [`Disk`], joined by a simulated [`Network`], driven tick by tick, with simulated
//! clients, a fault scheduler and the [`Checker`]. It performs every action a core returns,
//! exactly as shard 0's driver does, but against simulated I/O.
//!
//! Two phases: the safety phase (`ticks` ticks) injects faults, never leaving more than f
//! replicas faulty at once; the liveness phase stops faults, heals the network, restarts every
//! crashed replica and waits (at most `liveness_ticks`) for every replica to reach the same
//! commit and every client request to be answered.
//!
//! Every random choice draws from the one [`Prng`]; nothing reads a clock or iterates a hash
//! map, so a seed's trace is the same on every run and machine.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use shards::vsr::message::{Action, ClientReply, ClientRequest, Completion, Message};
use shards::vsr::prepare::PrepareBody;
use shards::vsr::replica::{CoreConfig, Replica};
use shards::vsr::transfer::server::{Offer, OfferServer, ServeOutput, ServerConfig};
use shards::vsr::transfer::{TransferTarget, UnavailableReason};
use shards::vsr::wire;
use storage::journal::JournalHeader;

use super::SimConfig;
use super::checker::{Checker, PrepareOrigin, Violation};
use super::disk::{Disk, DiskFaults};
use super::network::{LinkFaults, Network, NodeIndex, PartitionKind, SendOutcome};
use super::prng::Prng;
use super::trace::Trace;
use super::workload::{Client, ReplyEffect, generate_operations};

mod transfer;

pub use self::transfer::TransferStats;
use self::transfer::{Lag, TransferWatch, state_digest};

/// Ticks a crashed replica stays down, at least and at most.
const DOWN_TICKS_MIN: u64 = 20;
const DOWN_TICKS_MAX: u64 = 300;
/// Ticks a partition lasts, at least and at most.
const PARTITION_TICKS_MIN: u64 = 30;
const PARTITION_TICKS_MAX: u64 = 400;

/// What crosses the simulated network.
#[derive(Debug, Clone)]
enum Payload {
    /// One replica frame as `shards::vsr::wire::encode` made it (256-byte bus header + body).
    Replica(Vec<u8>),
    Request(ClientRequest),
    Reply {
        token: u64,
        reply: ClientReply,
    },
}

/// Faults injected in one run, by kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FaultCounts {
    pub crashes: u64,
    pub partitions: u64,
    pub torn_writes: u64,
    pub corruptions: u64,
    pub packets_lost: u64,
    pub packets_duplicated: u64,
}

impl FaultCounts {
    pub fn total(&self) -> u64 {
        self.crashes
            + self.partitions
            + self.torn_writes
            + self.corruptions
            + self.packets_lost
            + self.packets_duplicated
    }
}

impl std::fmt::Display for FaultCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "crash {} partition {} torn {} corrupt {} lost {} dup {}",
            self.crashes,
            self.partitions,
            self.torn_writes,
            self.corruptions,
            self.packets_lost,
            self.packets_duplicated
        )
    }
}

/// One replica: its core (None while crashed) and its disk.
#[derive(Debug)]
struct Node {
    core: Option<Replica>,
    disk: Disk,
    /// The serving side of state transfer (a fresh one at each open: a crash loses it).
    server: OfferServer,
    /// Offers being built from the disk's checkpoint: (due tick, checkpoint op).
    offer_builds: Vec<(u64, u64)>,
    /// The transfer this replica is receiving, if one is under way.
    receiving: Option<TransferWatch>,
    /// The commit_min the checker has seen this replica reach (since its last restart).
    seen_commit_min: u64,
    /// While crashed: the tick it restarts.
    restart_tick: u64,
    /// After a restart: the global commit it must reach before it stops counting as faulty.
    catching_up_to: Option<u64>,
    /// Seeds the core's own PRNG at each open.
    core_seed: Prng,
}

#[derive(Debug, Clone)]
struct ActivePartition {
    isolated: Vec<NodeIndex>,
    heal_tick: u64,
}

/// The end state of a run that broke no rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunSummary {
    /// The commit every replica converged to.
    pub commit: u64,
}

/// One seed's world.
#[derive(Debug)]
pub struct World {
    config: SimConfig,
    prng: Prng,
    tick: u64,
    nodes: Vec<Node>,
    network: Network<Payload>,
    clients: Vec<Client>,
    /// Attempt token -> (client index, request number).
    tokens: BTreeMap<u64, (usize, u64)>,
    next_token: u64,
    checker: Checker,
    pub trace: Trace,
    pub faults: FaultCounts,
    transfers: TransferStats,
    partition: Option<ActivePartition>,
    in_liveness_phase: bool,
    lag: Lag,
}

/// The serving side's parameters in the simulator: small chunks (several per transfer), frames
/// up to the replica bus limit, and the offer expiry timeout.
fn server_config(config: &SimConfig) -> ServerConfig {
    ServerConfig {
        chunk_size_max: config.transfer_chunk_size,
        frame_size_max: shards::limits::REPLICA_MESSAGE_SIZE_MAX,
        // The receiver's chunk round-trip timeout: offers expire after 3x (served) or 10x (idle).
        chunk_timeout_ticks: shards::vsr::transfer::receiver::CHUNK_TIMEOUT_TICKS,
    }
}

fn describe(message: &Message) -> String {
    match message {
        Message::Prepare { prepare } => {
            format!(
                "prepare v{} op{} c{}",
                prepare.view, prepare.op, prepare.commit
            )
        }
        Message::PrepareOk { view, op, .. } => format!("prepare_ok v{view} op{op}"),
        Message::Commit { view, commit, .. } => format!("commit v{view} c{commit}"),
        Message::StartViewChange { view } => format!("start_view_change v{view}"),
        Message::DoViewChange {
            view,
            log_view,
            op,
            commit,
            prepares,
        } => format!(
            "do_view_change v{view} lv{log_view} op{op} c{commit} n{}",
            prepares.len()
        ),
        Message::StartView {
            view,
            op,
            commit,
            prepares,
        } => format!("start_view v{view} op{op} c{commit} n{}", prepares.len()),
        Message::RequestPrepare { view, op, .. } => format!("request_prepare v{view} op{op}"),
        Message::RequestHeaders {
            view,
            op_min,
            op_max,
        } => format!("request_headers v{view} op{op_min}..={op_max}"),
        Message::Headers { view, headers } => format!("headers v{view} n{}", headers.len()),
        Message::RequestStateTransfer { view, nonce } => {
            format!("request_state_transfer v{view} nonce{nonce:#x}")
        }
        Message::StateTransferTarget { view, nonce, .. } => {
            format!("state_transfer_target v{view} nonce{nonce:#x}")
        }
        Message::RequestStateChunk {
            view,
            artifact,
            offset,
            len,
            ..
        } => format!(
            "request_state_chunk v{view} {} @{offset}+{len}",
            artifact.name()
        ),
        Message::StateChunk {
            view,
            artifact,
            offset,
            payload,
            ..
        } => format!(
            "state_chunk v{view} {} @{offset}+{}",
            artifact.name(),
            payload.len()
        ),
    }
}

fn describe_reply(reply: &ClientReply) -> String {
    match reply {
        ClientReply::Committed(cached) => {
            format!("committed r{} err{}", cached.request, cached.error_code)
        }
        ClientReply::Registered { session } => format!("registered s{session}"),
        ClientReply::Error { code, .. } => format!("error {code:?}"),
        ClientReply::Evicted { .. } => "evicted".to_owned(),
        ClientReply::NotPrimary { view, primary } => format!("not_primary v{view} p{primary:?}"),
    }
}

impl World {
    /// A world for `seed`: formatted disks, replicas opened in view 0, clients with their share
    /// of `config.requests` changes.
    ///
    /// # Panics
    /// If the core panics while opening (reported by the caller as a violation).
    pub fn new(config: &SimConfig, seed: u64) -> World {
        let mut prng = Prng::new(seed);
        let replica_count = usize::from(config.replica_count);
        let disk_faults = DiskFaults {
            journal_retain_ops: config.journal_retain_ops,
            journal_segment_ops: config.journal_segment_ops,
            install_write_fail: config.install_write_fail,
            torn_write: config.torn_write,
            io_delay_ticks_min: 1,
            io_delay_ticks_max: 4,
        };
        let network = Network::new(
            replica_count,
            LinkFaults {
                packet_loss: config.packet_loss,
                packet_duplicate: config.packet_duplicate,
                delay_ticks_min: 1,
                delay_ticks_max: 6,
            },
        );
        let nodes = (0..config.replica_count)
            .map(|replica| Node {
                core: None,
                disk: Disk::format(config.cluster, replica, config.replica_count, disk_faults),
                server: OfferServer::new(replica, server_config(config)),
                offer_builds: Vec::new(),
                receiving: None,
                seen_commit_min: 0,
                restart_tick: 0,
                catching_up_to: None,
                core_seed: prng.fork(),
            })
            .collect();
        let operations = generate_operations(&mut prng, config.requests);
        let client_count = config.clients.max(1);
        let mut shares: Vec<Vec<_>> = vec![Vec::new(); client_count];
        for (index, operation) in operations.into_iter().enumerate() {
            shares[index % client_count].push(operation);
        }
        let clients = shares
            .into_iter()
            .enumerate()
            .map(|(index, share)| {
                let target = prng.below(u64::from(config.replica_count)) as u8;
                let start_tick = prng.range_inclusive(1, 50);
                Client::new(
                    0x1000 + index as u128,
                    share,
                    config.replica_count,
                    target,
                    start_tick,
                )
            })
            .collect();
        let lag = Lag::new(config, &mut prng);
        let mut world = World {
            config: config.clone(),
            prng,
            tick: 0,
            nodes,
            network,
            clients,
            tokens: BTreeMap::new(),
            next_token: 1,
            checker: Checker::new(),
            trace: Trace::new(),
            faults: FaultCounts::default(),
            transfers: TransferStats::default(),
            partition: None,
            in_liveness_phase: false,
            lag,
        };
        if config.echo_trace {
            world.trace.echo_to_stderr();
        }
        world
            .trace
            .event(0, &format!("seed {seed} config {config:?}"));
        world
    }

    /// The f of the replica count: faulty replicas the protocol tolerates.
    fn fault_tolerance(&self) -> usize {
        (usize::from(self.config.replica_count) - 1) / 2
    }

    fn core_config(&mut self, replica: usize) -> CoreConfig {
        CoreConfig {
            cluster: self.config.cluster,
            replica: replica as u8,
            replica_count: self.config.replica_count,
            pipeline_max: shards::limits::PIPELINE_PREPARE_MAX,
            heartbeat_ticks: shards::limits::HEARTBEAT_TICKS_DEFAULT,
            view_change_timeout_ticks: shards::limits::VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT,
            clients_table_max: self.config.clients_table_max,
            checkpoint_interval: self.config.checkpoint_interval,
            seed: self.nodes[replica].core_seed.next_u64(),
        }
    }

    /// Runs both phases.
    ///
    /// # Errors
    /// The first violated rule.
    ///
    /// # Panics
    /// If the core panics (the caller catches it and reports the rule `core-panic`).
    pub fn run(&mut self) -> Result<RunSummary, Violation> {
        for replica in 0..self.nodes.len() {
            self.open(replica)?;
        }
        while self.tick < self.config.ticks {
            self.tick += 1;
            self.inject_faults();
            self.step()?;
        }
        self.begin_liveness_phase()?;
        let deadline = self.tick + self.config.liveness_ticks;
        while self.tick < deadline {
            self.tick += 1;
            self.step()?;
            if let Some(commit) = self.converged() {
                self.checker.check_converged(commit)?;
                self.check_converged_digests()?;
                self.trace
                    .event(self.tick, &format!("converged at commit {commit}"));
                return Ok(RunSummary { commit });
            }
        }
        Err(Violation {
            rule: "liveness",
            detail: format!(
                "{} ticks after the heal: {}",
                self.config.liveness_ticks,
                self.status_line()
            ),
        })
    }

    /// The simulated ticks so far.
    pub fn tick(&self) -> u64 {
        self.tick
    }

    /// Each replica's (view, status, commit_min, commit_max, op) and the pending client
    /// requests, for a failure report.
    pub fn status_line(&self) -> String {
        let mut line = String::new();
        for (replica, node) in self.nodes.iter().enumerate() {
            // Err: writing to a String never fails.
            let _ = match &node.core {
                Some(core) => write!(
                    line,
                    "r{replica} v{} {:?} commit_min {} commit_max {} op {}; ",
                    core.view(),
                    core.status(),
                    core.commit_min(),
                    core.commit_max(),
                    core.op()
                ),
                None => write!(line, "r{replica} down; "),
            };
        }
        let pending: Vec<String> = self
            .clients
            .iter()
            .filter_map(|client| {
                client
                    .pending_request()
                    .map(|request| format!("{:#x}/{request}", client.id))
            })
            .collect();
        let _ = write!(
            line,
            "pending requests [{}]; committed ops {}",
            pending.join(" "),
            self.checker.commit_max()
        );
        line
    }

    /// One tick: deliver due packets, complete due I/O, tick every core, let clients send,
    /// heal or restart what is due.
    fn step(&mut self) -> Result<(), Violation> {
        for packet in self.network.deliver_due(self.tick) {
            self.deliver(packet.from, packet.to, packet.payload)?;
        }
        for replica in 0..self.nodes.len() {
            if self.nodes[replica].core.is_none() {
                continue;
            }
            let completions =
                self.nodes[replica]
                    .disk
                    .complete_due(self.tick)
                    .map_err(|violation| Violation {
                        rule: violation.rule,
                        detail: format!("replica {replica}: {}", violation.detail),
                    })?;
            for completion in completions {
                self.trace.event(
                    self.tick,
                    &format!("r{replica} io_done {}", describe_completion(&completion)),
                );
                self.count_completion(replica, &completion);
                let installed = match completion {
                    Completion::CheckpointInstalled { checkpoint_op, .. } => Some(checkpoint_op),
                    _ => None,
                };
                let core = self.nodes[replica].core.as_mut().expect("up");
                let actions = core.on_io_done(completion);
                self.perform(replica, actions)?;
                if let Some(checkpoint_op) = installed {
                    self.check_adopted(replica, checkpoint_op)?;
                }
            }
            self.serve_due_offers(replica);
        }
        for replica in 0..self.nodes.len() {
            if let Some(core) = self.nodes[replica].core.as_mut() {
                let actions = core.on_tick();
                self.perform(replica, actions)?;
                self.nodes[replica].server.on_tick(self.tick);
            }
        }
        self.watch_transfers();
        self.advance_lag();
        self.poll_clients();
        if self
            .partition
            .as_ref()
            .is_some_and(|partition| self.tick >= partition.heal_tick)
        {
            self.heal();
        }
        for replica in 0..self.nodes.len() {
            if self.nodes[replica].core.is_none() && self.tick >= self.nodes[replica].restart_tick {
                self.open(replica)?;
            }
        }
        Ok(())
    }

    fn deliver(
        &mut self,
        from: NodeIndex,
        to: NodeIndex,
        payload: Payload,
    ) -> Result<(), Violation> {
        match payload {
            Payload::Replica(frame) => {
                if self.nodes[to].core.is_none() {
                    return Ok(());
                }
                let (sender, message) =
                    wire::decode(&frame, self.config.cluster, self.config.replica_count).map_err(
                        |error| Violation {
                            rule: "wire",
                            detail: format!(
                                "r{from}->r{to}: a frame replica {from} encoded does not decode: \
                                 {error}"
                            ),
                        },
                    )?;
                if usize::from(sender) != from {
                    return Err(Violation {
                        rule: "wire",
                        detail: format!("r{from}->r{to}: the frame names sender {sender}"),
                    });
                }
                self.trace
                    .event(self.tick, &format!("r{from}->r{to} {}", describe(&message)));
                if message.is_state_transfer_request() {
                    self.serve(to, from, message);
                    return Ok(());
                }
                self.note_target(to, &message);
                let core = self.nodes[to].core.as_mut().expect("up");
                let actions = core.on_message(from as u8, message);
                self.perform(to, actions)
            }
            Payload::Request(request) => {
                let Some(core) = self.nodes[to].core.as_mut() else {
                    return Ok(());
                };
                self.trace.event(
                    self.tick,
                    &format!(
                        "client {:#x} -> r{to} request {} token {}",
                        request.client, request.request, request.token
                    ),
                );
                let actions = core.on_request(request);
                self.perform(to, actions)
            }
            Payload::Reply { token, reply } => self.deliver_reply(from, token, &reply),
        }
    }

    fn deliver_reply(
        &mut self,
        from: NodeIndex,
        token: u64,
        reply: &ClientReply,
    ) -> Result<(), Violation> {
        let (client_index, request) = self.tokens[&token];
        let client_id = self.clients[client_index].id;
        self.trace.event(
            self.tick,
            &format!(
                "r{from} -> client {client_id:#x} request {request} token {token}: {}",
                describe_reply(reply)
            ),
        );
        if matches!(
            reply,
            ClientReply::Committed(_) | ClientReply::Registered { .. }
        ) {
            self.checker.on_reply(client_id, request, reply)?;
        }
        if let ClientReply::Evicted { reason } = reply {
            return Err(Violation {
                rule: "session-kept",
                detail: format!(
                    "client {client_id:#x} request {request} was answered Evicted ({reason}) with {} clients and a table of {}",
                    self.clients.len(),
                    self.config.clients_table_max
                ),
            });
        }
        let effect = self.clients[client_index].on_reply(&mut self.prng, self.tick, token, reply);
        if let ReplyEffect::Final { request } = effect {
            self.trace.event(
                self.tick,
                &format!("client {client_id:#x} request {request} done"),
            );
        }
        Ok(())
    }

    fn poll_clients(&mut self) {
        let replica_count = self.nodes.len();
        for client_index in 0..self.clients.len() {
            let token = self.next_token;
            let Some((target, request)) = self.clients[client_index].poll_send(self.tick, token)
            else {
                continue;
            };
            self.next_token += 1;
            self.tokens.insert(token, (client_index, request.request));
            self.trace.event(
                self.tick,
                &format!(
                    "client {:#x} sends request {} token {token} to r{target}",
                    request.client, request.request
                ),
            );
            let from = replica_count + client_index;
            self.send(from, usize::from(target), Payload::Request(request));
        }
    }

    fn send(&mut self, from: NodeIndex, to: NodeIndex, payload: Payload) {
        match self
            .network
            .send(&mut self.prng, self.tick, from, to, payload)
        {
            SendOutcome::Lost => self.faults.packets_lost += 1,
            SendOutcome::Queued { copies: 2 } => self.faults.packets_duplicated += 1,
            SendOutcome::Queued { .. } => {}
        }
    }

    /// Performs `actions` of replica `replica` in order, then checks what it committed.
    fn perform(&mut self, replica: usize, actions: Vec<Action>) -> Result<(), Violation> {
        for action in actions {
            match action {
                Action::Send { to, message } => {
                    self.note_transfer_request(replica, usize::from(to), &message);
                    let frame = wire::encode(self.config.cluster, replica as u8, &message);
                    self.send(replica, usize::from(to), Payload::Replica(frame));
                }
                Action::Reply { token, reply } => {
                    let Some(&(client_index, _)) = self.tokens.get(&token) else {
                        return Err(Violation {
                            rule: "reply-token",
                            detail: format!("replica {replica} replied to unknown token {token}"),
                        });
                    };
                    let to = self.nodes.len() + client_index;
                    self.send(replica, to, Payload::Reply { token, reply });
                }
                Action::Apply { op, applied, .. } => {
                    self.trace.event(
                        self.tick,
                        &format!("r{replica} apply op{op} applied={applied}"),
                    );
                    self.checker.on_apply(op, applied);
                }
                Action::WriteJournal { ref prepare } => {
                    let checksum = JournalHeader::for_prepare(prepare).checksum;
                    let body = PrepareBody::decode(&prepare.body).map_err(|reason| Violation {
                        rule: "prepare-body",
                        detail: format!("replica {replica} op {}: {reason}", prepare.op),
                    })?;
                    let client = body.client_id().map_err(|reason| Violation {
                        rule: "prepare-body",
                        detail: format!("replica {replica} op {}: {reason}", prepare.op),
                    })?;
                    self.checker.on_prepare(
                        checksum,
                        PrepareOrigin {
                            client,
                            request: body.request,
                        },
                    );
                    self.trace.event(
                        self.tick,
                        &format!(
                            "r{replica} write_journal op{} v{} {checksum:#x}",
                            prepare.op, prepare.view
                        ),
                    );
                    self.nodes[replica]
                        .disk
                        .submit(&mut self.prng, self.tick, &action);
                }
                Action::Checkpoint {
                    op,
                    ref metadata,
                    ref client_table,
                } => {
                    // The checkpoint's state is the replica's at commit point `op`: it must
                    // match every other replica's there (and is what a transfer serves).
                    self.checker
                        .on_digest(replica as u8, op, state_digest(op, metadata, client_table))
                        .map_err(|violation| Violation {
                            detail: format!("checkpoint: {}", violation.detail),
                            ..violation
                        })?;
                    self.trace
                        .event(self.tick, &format!("r{replica} {}", describe_io(&action)));
                    self.nodes[replica]
                        .disk
                        .submit(&mut self.prng, self.tick, &action);
                }
                Action::InstallCheckpoint {
                    checkpoint_op,
                    ref metadata,
                    ref client_table,
                } => {
                    let digest = state_digest(checkpoint_op, metadata, client_table);
                    self.checker
                        .on_install(replica as u8, checkpoint_op, digest)?;
                    self.trace
                        .event(self.tick, &format!("r{replica} {}", describe_io(&action)));
                    self.nodes[replica]
                        .disk
                        .submit(&mut self.prng, self.tick, &action);
                }
                Action::TruncateJournal { .. }
                | Action::ReadJournal { .. }
                | Action::WriteSuperblock { .. } => {
                    self.trace
                        .event(self.tick, &format!("r{replica} {}", describe_io(&action)));
                    self.nodes[replica]
                        .disk
                        .submit(&mut self.prng, self.tick, &action);
                }
            }
        }
        self.observe(replica)
    }

    /// Feeds the checker what replica `replica` committed since it was last observed.
    fn observe(&mut self, replica: usize) -> Result<(), Violation> {
        let node = &mut self.nodes[replica];
        let Some(core) = node.core.as_ref() else {
            return Ok(());
        };
        let commit_min = core.commit_min();
        if commit_min <= node.seen_commit_min {
            return Ok(());
        }
        for op in node.seen_commit_min + 1..=commit_min {
            if let Some(checksum) = core.committed_checksum(op) {
                self.checker.on_commit(replica as u8, op, checksum)?;
            }
        }
        node.seen_commit_min = commit_min;
        if node
            .catching_up_to
            .is_some_and(|target| commit_min >= target)
        {
            node.catching_up_to = None;
        }
        self.checker
            .on_digest(replica as u8, commit_min, core.state_digest())
    }

    /// Rebuilds replica `replica`'s core from its disk and opens it.
    fn open(&mut self, replica: usize) -> Result<(), Violation> {
        let recovered = self.nodes[replica]
            .disk
            .recover(self.config.clients_table_max)
            .map_err(|reason| Violation {
                rule: "recovery",
                detail: format!("replica {replica}: {reason}"),
            })?;
        self.trace.event(
            self.tick,
            &format!(
                "r{replica} open view {} log_view {} commit_max {} checkpoint {} prepares {} \
                 journal {}..={}",
                recovered.view,
                recovered.log_view,
                recovered.commit_max,
                recovered.checkpoint_op,
                recovered.prepares.len(),
                recovered.journal_first_op,
                recovered.journal_last_op
            ),
        );
        let config = self.core_config(replica);
        let checkpoint_op = recovered.checkpoint_op;
        let (core, actions) = Replica::open(config, recovered);
        let server = OfferServer::new(replica as u8, server_config(&self.config));
        let node = &mut self.nodes[replica];
        node.core = Some(core);
        node.server = server;
        node.offer_builds.clear();
        node.receiving = None;
        node.seen_commit_min = checkpoint_op;
        if self.tick > 0 {
            node.catching_up_to = Some(self.checker.commit_max());
        }
        // The state restored from the snapshot (and any journal replay) must match what every
        // other replica had at that commit point.
        let core = node.core.as_ref().expect("just opened");
        let (commit_min, digest) = (core.commit_min(), core.state_digest());
        self.checker
            .on_digest(replica as u8, commit_min, digest)
            .map_err(|violation| Violation {
                detail: format!("after recovery: {}", violation.detail),
                ..violation
            })?;
        self.perform(replica, actions)
    }

    fn is_faulty(&self, replica: usize) -> bool {
        let node = &self.nodes[replica];
        node.core.is_none()
            || node.catching_up_to.is_some()
            || node.disk.is_damaged()
            || self
                .partition
                .as_ref()
                .is_some_and(|partition| partition.isolated.contains(&replica))
    }

    /// Whether making `extra` faulty keeps at most f replicas faulty.
    fn within_budget(&self, extra: &[usize]) -> bool {
        let faulty = (0..self.nodes.len())
            .filter(|&replica| self.is_faulty(replica) || extra.contains(&replica))
            .count();
        faulty <= self.fault_tolerance()
    }

    /// The safety phase's fault scheduler: each kind with its probability per tick, within the
    /// budget of f faulty replicas.
    fn inject_faults(&mut self) {
        let replica_count = self.nodes.len() as u64;
        if self.prng.chance(self.config.crash) {
            let replica = match self.aimed_at_transfer() {
                Some(source) => source,
                None => self.prng.below(replica_count) as usize,
            };
            if self.nodes[replica].core.is_some() && self.within_budget(&[replica]) {
                self.crash(replica);
            }
        }
        if self.partition.is_none() && self.prng.chance(self.config.partition) {
            self.start_partition();
        }
        if self.prng.chance(self.config.read_corruption) {
            let replica = self.prng.below(replica_count) as usize;
            if self.within_budget(&[replica])
                && let Some(op) = self.nodes[replica].disk.corrupt_record(&mut self.prng)
            {
                self.faults.corruptions += 1;
                self.trace.event(
                    self.tick,
                    &format!("fault: r{replica} journal op{op} bit flip"),
                );
            }
        }
    }

    fn crash(&mut self, replica: usize) {
        self.count_crash_interruptions(replica);
        let damage = self.nodes[replica].disk.crash(&mut self.prng);
        let down_ticks = self.prng.range_inclusive(DOWN_TICKS_MIN, DOWN_TICKS_MAX);
        let node = &mut self.nodes[replica];
        node.core = None;
        node.catching_up_to = None;
        node.restart_tick = self.tick + down_ticks;
        node.offer_builds.clear();
        node.receiving = None;
        self.faults.crashes += 1;
        if damage.torn.is_some() {
            self.faults.torn_writes += 1;
        }
        if damage
            .torn
            .as_deref()
            .is_some_and(|torn| torn.starts_with("install"))
        {
            self.transfers.torn_installs += 1;
        }
        self.trace.event(
            self.tick,
            &format!(
                "fault: r{replica} crash for {down_ticks} ticks, {} I/Os lost, torn: {}",
                damage.lost_count,
                damage.torn.as_deref().unwrap_or("none")
            ),
        );
    }

    /// Cuts off a random minority: symmetric, asymmetric either way, or the primary alone.
    fn start_partition(&mut self) {
        let replica_count = self.nodes.len() as u64;
        let kind = match self.prng.below(4) {
            0 | 1 => PartitionKind::Symmetric,
            2 => PartitionKind::OutgoingCut,
            _ => PartitionKind::IncomingCut,
        };
        let isolated: Vec<usize> = if self.prng.chance(0.5) {
            // "Primary isolated": the primary of the highest view that is up.
            let primary = self
                .nodes
                .iter()
                .enumerate()
                .filter_map(|(index, node)| node.core.as_ref().map(|core| (core.view(), index)))
                .filter(|&(_, index)| {
                    self.nodes[index]
                        .core
                        .as_ref()
                        .is_some_and(Replica::is_primary)
                })
                .max()
                .map(|(_, index)| index);
            match primary {
                Some(primary) => vec![primary],
                None => return,
            }
        } else {
            let size = self.prng.range_inclusive(1, self.fault_tolerance() as u64) as usize;
            let mut isolated = Vec::new();
            while isolated.len() < size {
                let replica = self.prng.below(replica_count) as usize;
                if !isolated.contains(&replica) {
                    isolated.push(replica);
                }
            }
            isolated.sort_unstable();
            isolated
        };
        if !self.within_budget(&isolated) {
            return;
        }
        let heal_tick = self.tick
            + self
                .prng
                .range_inclusive(PARTITION_TICKS_MIN, PARTITION_TICKS_MAX);
        self.network.partition(&isolated, kind);
        self.faults.partitions += 1;
        self.count_partition_interruptions(&isolated);
        self.trace.event(
            self.tick,
            &format!("fault: partition {kind:?} isolating {isolated:?} until t{heal_tick}"),
        );
        self.partition = Some(ActivePartition {
            isolated,
            heal_tick,
        });
    }

    fn heal(&mut self) {
        self.network.heal();
        self.partition = None;
        self.trace.event(self.tick, "network healed");
    }

    /// Faults stop: the network heals and loses nothing, every crashed replica restarts now.
    fn begin_liveness_phase(&mut self) -> Result<(), Violation> {
        self.in_liveness_phase = true;
        self.heal();
        let faults = self.network.faults();
        self.network.set_faults(LinkFaults {
            packet_loss: 0.0,
            packet_duplicate: 0.0,
            ..faults
        });
        // The transfer faults stop too (chunk corruption and unreadable offers are checked
        // against `in_liveness_phase` where they are drawn).
        for node in &mut self.nodes {
            let faults = node.disk.faults();
            node.disk.set_faults(DiskFaults {
                install_write_fail: 0.0,
                ..faults
            });
        }
        self.trace.event(self.tick, "liveness phase: faults stop");
        for replica in 0..self.nodes.len() {
            if self.nodes[replica].core.is_none() {
                self.open(replica)?;
            }
        }
        Ok(())
    }

    /// The common commit, once every replica is up at the same commit_min (with nothing
    /// prepared above it) and every client request is answered.
    fn converged(&self) -> Option<u64> {
        if self.clients.iter().any(|client| !client.is_done()) {
            return None;
        }
        let mut commit = None;
        for node in &self.nodes {
            let core = node.core.as_ref()?;
            if core.commit_min() != core.op() || core.commit_max() != core.commit_min() {
                return None;
            }
            match commit {
                None => commit = Some(core.commit_min()),
                Some(common) if common != core.commit_min() => return None,
                Some(_) => {}
            }
        }
        commit
    }

    /// The highest op any replica committed.
    pub fn committed_op_max(&self) -> u64 {
        self.checker.commit_max()
    }

    /// Requests committed so far (for the report).
    pub fn committed_request_count(&self) -> usize {
        self.checker.committed_request_count()
    }

    /// Test hook: whether the world is past the safety phase.
    pub fn in_liveness_phase(&self) -> bool {
        self.in_liveness_phase
    }

    /// Test hook: the checker, so a test can feed it what a broken core would do (a forged
    /// commit, a reply nobody committed) and see the run fail.
    pub fn checker_mut(&mut self) -> &mut Checker {
        &mut self.checker
    }
}

fn describe_completion(completion: &Completion) -> String {
    match completion {
        Completion::JournalRead { op, prepare } => {
            format!("journal_read op{op} found={}", prepare.is_some())
        }
        other => format!("{other:?}"),
    }
}

fn describe_io(action: &Action) -> String {
    match action {
        Action::TruncateJournal { op } => format!("truncate_journal above op{op}"),
        Action::ReadJournal { op } => format!("read_journal op{op}"),
        Action::WriteSuperblock {
            view,
            log_view,
            commit_max,
        } => format!("write_superblock v{view} lv{log_view} commit_max {commit_max}"),
        Action::Checkpoint { op, .. } => format!("checkpoint op{op}"),
        Action::InstallCheckpoint { checkpoint_op, .. } => {
            format!("install_checkpoint op{checkpoint_op}")
        }
        other => format!("{other:?}"),
    }
}
