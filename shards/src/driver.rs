//! Shard 0's driver: the only place that performs the consensus core's actions in `serve`
//! (issue 8 section 1: one code path, two drivers; the other is the simulator). It owns the
//! sans-IO [`Replica`] and runs one loop that feeds it one input at a time: a client request from
//! the metadata queue, a peer's message from the replica links, a tick every `config.tick`, an
//! I/O completion. It then performs the returned actions in order:
//!
//! - `Send`: encoded by the wire codec into the peer's bounded link queue (dropped when full).
//! - `WriteJournal`: to the journal writer task, which appends consecutive prepares under one
//!   journal lock and reports `JournalWritten` per op.
//! - `TruncateJournal`, `ReadJournal`: the journal's API.
//! - `WriteSuperblock`: view, log_view, commit_max under the superblock lock.
//! - `Apply`, `Reply`, `Checkpoint`: queued, in order, to the applier task, so the loop keeps
//!   writing the journal and answering peers while a change fans out: the applier performs the
//!   fan-out to every shard's copy ([`Shard::fan_out`]), then sends each reply (converted to a
//!   [`ShardReply`] by [`client_reply`]) only after every apply queued before it, and starts
//!   each checkpoint (with the state the action carries) after the applies before it.
//!
//! - `InstallCheckpoint` (state transfer, issue 9 section 4): queued to the applier too, so it
//!   runs after the applies and checkpoints before it: `ReplicaStore::install_checkpoint`, then
//!   the restore fan-out ([`Shard::restore_metadata`]: every shard's copy replaced, partition
//!   directories created) before `CheckpointInstalled` is reported.
//!
//! State-transfer serving (issue 9 section 3): the driver owns the sans-IO
//! [`OfferServer`]; a peer's `RequestStateTransfer` or `RequestStateChunk` goes to it (with the
//! core's `transfer_availability`, view and the tick count) instead of the core, and its
//! `BuildOffer` reads the persisted snapshot through io_uring and builds the offer off the
//! reactor, the result coming back through the loop like a completion.
//!
//! With no `--addresses` the same loop runs the core with `replica_count = 1` and no links.
//!
//! Fail-stop: a non-retryable journal failure or a failed superblock write stops the server (the
//! journal or superblock is unusable until restart, and the core must not act on a write that
//! did not happen).

use std::cell::RefCell;
use std::rc::Rc;
use std::sync::Arc;

use ahash::AHashMap;
use bus::ErrorCode;
use crossfire::mpsc::Array;
use crossfire::oneshot::TxOneshot;
use crossfire::{AsyncRx, MAsyncTx};
use futures_util::FutureExt;
use storage::journal::{JournalError, JournalHeader, Prepare};

use crate::frame::ShardReply;
use crate::metadata::{MetadataOp, MetadataState};
use crate::replica_bus::{BusConfig, Decoder, Inbound, ReplicaBus};
use crate::shard::{ReplicaStatus, Shard};
use crate::store::ReplicaStore;
use crate::unopened::OpenFailure;
use crate::vsr::client_table::ClientTableSnapshot;
use crate::vsr::message::{
    Action, ClientReply, ClientRequest, ClientToken, Completion, Message, ReplicaIndex,
};
use crate::vsr::prepare::PrepareOperation;
use crate::vsr::replica::{CoreConfig, Recovered, Replica};
use crate::vsr::transfer::UnavailableReason;
use crate::vsr::transfer::server::{self as offer_server, Offer, OfferServer, ServeOutput};

/// Peer messages the links may hold for the driver before they drop (and count) more.
const INBOUND_QUEUE_MAX: usize = 4096;
/// Completions the I/O tasks may hold for the driver (the writer waits when it is full).
const COMPLETION_QUEUE_MAX: usize = 4096;

/// Offer builds the driver may have finished and not yet fed to the [`OfferServer`]: the server
/// runs one build at a time, so one slot would do; a few absorb a build that completes while the
/// loop is busy.
const OFFER_BUILT_QUEUE_MAX: usize = 4;

/// The outcome of one offer build: (checkpoint op, the offer or why not).
type OfferBuilt = (u64, Result<Offer, UnavailableReason>);

/// The serving side's configuration (issue 9 section 3): chunks of at most
/// `offer_server::STATE_CHUNK_SIZE_MAX_DEFAULT` bytes, frames of at most `frame_size_max` (the
/// replica link's limit, which every peer applies to what it receives: `BusConfig::new`), and the
/// receiver's chunk round-trip timeout.
pub fn offer_server_config(frame_size_max: u32) -> offer_server::ServerConfig {
    offer_server::ServerConfig {
        chunk_size_max: offer_server::STATE_CHUNK_SIZE_MAX_DEFAULT,
        frame_size_max,
        chunk_timeout_ticks: crate::vsr::transfer::receiver::CHUNK_TIMEOUT_TICKS,
    }
}

/// One request from the metadata queue: (client, request number, operation, reply, arrival).
pub type RequestItem = crate::shard::MetadataQueueItem;

/// The core's fixed parameters from the server configuration.
pub fn core_config(config: &crate::config::ServerConfig) -> CoreConfig {
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos() as u64)
        ^ u64::from(std::process::id()).rotate_left(32);
    CoreConfig {
        cluster: config.cluster,
        replica: config.replica,
        replica_count: config.replica_count(),
        pipeline_max: crate::limits::PIPELINE_PREPARE_MAX,
        heartbeat_ticks: config.heartbeat_ticks,
        view_change_timeout_ticks: config.view_change_timeout_ticks,
        clients_table_max: config.clients_table_max,
        checkpoint_interval: config.checkpoint_interval,
        seed,
    }
}

/// The core opened from what boot recovered, before any shard has its metadata copy.
#[derive(Debug)]
pub struct OpenedCore {
    pub core: Replica,
    /// What `Replica::open` returned. Its `Apply` actions (the journaled ops the core applied at
    /// open) are already in `core.metadata()`, which every shard starts from.
    pub first_actions: Vec<Action>,
}

/// Opens the core from what boot recovered and creates the partition directories of the
/// CreateTopic ops it applied (replayed) that are missing (a crash between the commit and the
/// directory creation; existing ones keep their data), so every shard can start from
/// `core.metadata()` and open its partitions.
///
/// # Errors
/// A directory could not be created (named).
///
/// # Cancel safety
/// Not cancel safe: runs once at boot.
pub async fn open_core(
    config: &crate::config::ServerConfig,
    recovered: Recovered,
) -> Result<OpenedCore, String> {
    let (core, first_actions) = Replica::open(core_config(config), recovered);
    let mut created = Vec::new();
    for action in &first_actions {
        if let Action::Apply {
            operation:
                PrepareOperation::Metadata(MetadataOp::CreateTopic {
                    stream_id,
                    topic_id,
                    partition_count,
                    ..
                }),
            applied: true,
            ..
        } = action
        {
            created.extend(
                (0..*partition_count)
                    .filter_map(|partition| u16::try_from(partition).ok())
                    .map(|partition| bus::Namespace::new(*stream_id, *topic_id, partition))
                    .filter(|namespace| core.metadata().partition_exists(*namespace)),
            );
        }
    }
    let data_dir = config.data_dir.clone();
    let swept =
        compio::runtime::spawn_blocking(move || crate::shard::sweep_deleted_dirs(&data_dir))
            .await
            .map_err(|_| "deleted-directory sweep task failed".to_owned())?
            .map_err(|error| {
                format!("cannot finish removing deleted partition directories: {error}")
            })?;
    if swept > 0 {
        tracing::info!(
            swept,
            "finished removing deleted partition directories a crash left"
        );
    }
    if !created.is_empty() {
        let data_dir = config.data_dir.clone();
        compio::runtime::spawn_blocking(move || {
            crate::shard::prepare_partition_dirs(&data_dir, &created)
        })
        .await
        .map_err(|_| "partition directory task failed".to_owned())?
        .map_err(|error| error.to_string())?;
    }
    crate::store::boot::warn_about_orphan_partitions(
        &config.data_dir,
        core.metadata(),
        config.replica_count() > 1,
    )
    .await;
    Ok(OpenedCore {
        core,
        first_actions,
    })
}

/// What one loop iteration waits for.
enum Input {
    Request(RequestItem),
    Message(Inbound<Message>),
    Completion(Completion),
    /// An offer build the serving side asked for finished.
    OfferBuilt(OfferBuilt),
    Tick,
    /// The metadata queue closed: the shard is going away.
    Closed,
}

/// Shard 0's driver state (see the module docs).
pub struct Driver {
    shard: Rc<Shard>,
    core: Rc<RefCell<Replica>>,
    store: Rc<ReplicaStore>,
    bus: Option<ReplicaBus<Message>>,
    inbound: Option<AsyncRx<Array<Inbound<Message>>>>,
    /// Requests handed to the core: where to answer, and when each arrived on shard 0.
    waiting: AHashMap<ClientToken, (TxOneshot<ShardReply>, std::time::Instant)>,
    token_next: ClientToken,
    journal_writes: MAsyncTx<Array<Prepare>>,
    completions_tx: MAsyncTx<Array<Completion>>,
    completions: AsyncRx<Array<Completion>>,
    _journal_writer: compio::runtime::JoinHandle<()>,
    /// The applier's queue: `Apply`, `Reply` and `Checkpoint` in the core's order.
    applies: MAsyncTx<Array<ApplierStep>>,
    _applier: compio::runtime::JoinHandle<()>,
    /// The status last published to the shards.
    published: Option<ReplicaStatus>,
    /// What `Replica::open` returned, performed when the loop starts (the fan-out of replayed
    /// ops needs shard 0's pump running for the other shards' acks).
    first_actions: Vec<Action>,
    /// The serving side of state transfer (issue 9 section 3).
    offers: OfferServer,
    offers_built_tx: MAsyncTx<Array<OfferBuilt>>,
    offers_built: AsyncRx<Array<OfferBuilt>>,
    /// Ticks since the loop started: the serving side's clock.
    ticks: u64,
}

impl std::fmt::Debug for Driver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Driver").finish_non_exhaustive()
    }
}

impl Driver {
    /// Takes the opened core and starts the replica links when `config.addresses` is non-empty;
    /// [`Driver::run`] performs the core's first actions.
    ///
    /// # Errors
    /// The replica listen address cannot be bound.
    ///
    /// # Cancel safety
    /// Not cancel safe: run once at startup.
    pub async fn start(
        shard: Rc<Shard>,
        store: Rc<ReplicaStore>,
        opened: OpenedCore,
        client_address: String,
    ) -> Result<Driver, String> {
        let config = Arc::clone(&shard.config);
        let OpenedCore {
            core,
            first_actions,
        } = opened;
        let core = Rc::new(RefCell::new(core));
        shard.attach_core(Rc::clone(&core));
        let mut frame_size_max = crate::limits::REPLICA_MESSAGE_SIZE_MAX;
        let (bus, inbound) = if config.addresses.is_empty() {
            (None, None)
        } else {
            let (tx, rx) = crossfire::mpsc::bounded_async::<Inbound<Message>>(INBOUND_QUEUE_MAX);
            let bus_config = BusConfig::new(
                config.cluster,
                config.replica,
                config.addresses.clone(),
                client_address,
            );
            frame_size_max = bus_config.frame_size_max;
            let bus = ReplicaBus::start(bus_config, message_decoder(), tx)
                .await
                .map_err(|e| {
                    format!(
                        "cannot listen on replica address {}: {e}",
                        config.addresses[usize::from(config.replica)]
                    )
                })?;
            (Some(bus), Some(rx))
        };
        let (journal_writes, journal_rx) =
            crossfire::mpsc::bounded_async::<Prepare>(COMPLETION_QUEUE_MAX);
        let (completions_tx, completions) =
            crossfire::mpsc::bounded_async::<Completion>(COMPLETION_QUEUE_MAX);
        let journal_writer = compio::runtime::spawn(journal_writer(
            Rc::clone(&store),
            journal_rx,
            completions_tx.clone(),
        ));
        let (applies, applies_rx) =
            crossfire::mpsc::bounded_async::<ApplierStep>(APPLIER_QUEUE_MAX);
        let applier = compio::runtime::spawn(applier(
            Rc::clone(&shard),
            applies_rx,
            completions_tx.clone(),
        ));
        let (offers_built_tx, offers_built) =
            crossfire::mpsc::bounded_async::<OfferBuilt>(OFFER_BUILT_QUEUE_MAX);
        let offers = OfferServer::new(config.replica, offer_server_config(frame_size_max));
        let mut driver = Driver {
            offers,
            offers_built_tx,
            offers_built,
            ticks: 0,
            first_actions,
            shard,
            core,
            store,
            bus,
            inbound,
            waiting: AHashMap::new(),
            token_next: 1,
            journal_writes,
            completions_tx,
            completions,
            _journal_writer: journal_writer,
            applies,
            _applier: applier,
            published: None,
        };
        driver.publish_status();
        Ok(driver)
    }

    /// Runs the loop until the metadata queue closes or the task is cancelled at shutdown.
    ///
    /// # Cancel safety
    /// Cancellable at shutdown: an `Apply` cut short leaves the other shards' copies behind
    /// shard 0's, which no one serves from anymore; the final checkpoint takes the core's state.
    pub async fn run(mut self) {
        // The Apply actions of open are in every shard's bootstrap copy already (`open_core`).
        let first_actions: Vec<Action> = std::mem::take(&mut self.first_actions)
            .into_iter()
            .filter(|action| !matches!(action, Action::Apply { .. }))
            .collect();
        self.perform(first_actions).await;
        self.publish_status();
        let mut ticker = compio::time::interval(self.shard.config.tick);
        loop {
            let input = self.next_input(&mut ticker).await;
            let input = match input {
                Input::Message(Inbound { from, message })
                    if message.is_state_transfer_request() =>
                {
                    self.serve_transfer(from, message);
                    continue;
                }
                Input::OfferBuilt((checkpoint_op, result)) => {
                    let view = self.core.borrow().view();
                    let outputs = self
                        .offers
                        .offer_built(checkpoint_op, result, view, self.ticks);
                    self.serve_outputs(outputs);
                    continue;
                }
                Input::Tick => {
                    self.ticks += 1;
                    self.offers.on_tick(self.ticks);
                    Input::Tick
                }
                input => input,
            };
            let actions = {
                let mut core = self.core.borrow_mut();
                match input {
                    Input::Closed => return,
                    Input::Tick => core.on_tick(),
                    Input::Completion(completion) => {
                        if let Completion::JournalFailed {
                            op,
                            retryable: false,
                            reason,
                        } = &completion
                        {
                            drop(core);
                            self.fail_stop(&format!(
                                "the metadata journal failed at op {op}: {reason}"
                            ));
                            return;
                        }
                        core.on_io_done(completion)
                    }
                    Input::Message(Inbound { from, message }) => core.on_message(from, message),
                    Input::OfferBuilt(_) => unreachable!("handled above"),
                    Input::Request((client, request, operation, reply, arrived)) => {
                        if let Some(refusal) = self.budget_refusal(core.metadata(), &operation) {
                            reply.send(refusal);
                            continue;
                        }
                        let token = self.token_next;
                        self.token_next += 1;
                        self.waiting.insert(token, (reply, arrived));
                        core.on_request(ClientRequest {
                            token,
                            client,
                            request,
                            operation,
                            timestamp_us: wall_clock_us(),
                        })
                    }
                }
            };
            self.perform(actions).await;
            self.publish_status();
        }
    }

    /// Waits for the next input; ticks, completions and peer messages before new requests, so a
    /// burst of clients never starves the protocol.
    async fn next_input(&self, ticker: &mut compio::time::Interval) -> Input {
        let requests = self.shard.metadata_requests();
        let message = async {
            match &self.inbound {
                Some(inbound) => inbound.recv().await.ok(),
                None => std::future::pending().await,
            }
        };
        futures_util::select_biased! {
            completion = self.completions.recv().fuse() => match completion {
                Ok(completion) => Input::Completion(completion),
                Err(_) => Input::Closed,
            },
            _ = ticker.tick().fuse() => Input::Tick,
            built = self.offers_built.recv().fuse() => match built {
                Ok(built) => Input::OfferBuilt(built),
                Err(_) => Input::Closed,
            },
            message = message.fuse() => match message {
                Some(message) => Input::Message(message),
                None => Input::Closed,
            },
            request = requests.recv().fuse() => match request {
                Ok(request) => Input::Request(request),
                Err(_) => Input::Closed,
            },
        }
    }

    /// A CreateTopic that would take this replica past its open-file budget is refused before
    /// the core sees it (a local resource, not replicated state). The partition-count range is
    /// checked first (`metadata::check_partition_count`): a count out of range gets that rule,
    /// never descriptor advice, and is never expanded into its partitions here.
    fn budget_refusal(
        &self,
        metadata: &MetadataState,
        operation: &PrepareOperation,
    ) -> Option<ShardReply> {
        let PrepareOperation::Metadata(
            op @ MetadataOp::CreateTopic {
                partition_count, ..
            },
        ) = operation
        else {
            return None;
        };
        if let Err(rejection) = crate::metadata::check_partition_count(*partition_count) {
            return Some(ShardReply::error(rejection.code, rejection.message));
        }
        let after = metadata.namespaces().len() as u64 + metadata.namespaces_of(op).len() as u64;
        self.shard
            .partitions_refusal(after)
            .map(|refusal| ShardReply::error(ErrorCode::ResourceExhausted, refusal))
    }

    /// Performs `actions` in order (module docs); each I/O action's completion comes back
    /// through the completion channel.
    async fn perform(&mut self, actions: Vec<Action>) {
        for action in actions {
            match action {
                Action::Send { to, message } => self.send(to, &message),
                Action::WriteJournal { prepare } => {
                    // The writer drains the channel; it only stops when the driver goes away.
                    let _ = self.journal_writes.send(prepare).await;
                }
                Action::TruncateJournal { op } => self.truncate_journal(op).await,
                Action::ReadJournal { op } => self.read_journal(op),
                Action::WriteSuperblock {
                    view,
                    log_view,
                    commit_max,
                } => self.write_superblock(view, log_view, commit_max).await,
                Action::Apply {
                    op,
                    operation,
                    applied,
                } => {
                    self.to_applier(ApplierStep::Apply {
                        op,
                        operation,
                        applied,
                    })
                    .await;
                }
                Action::Reply { token, reply } => self.reply(token, reply).await,
                Action::Checkpoint {
                    op,
                    metadata,
                    client_table,
                } => {
                    self.to_applier(ApplierStep::Checkpoint {
                        op,
                        metadata,
                        client_table,
                    })
                    .await;
                }
                Action::InstallCheckpoint {
                    checkpoint_op,
                    metadata,
                    client_table,
                } => {
                    tracing::info!(
                        checkpoint_op,
                        "state transfer: installing the fetched checkpoint"
                    );
                    self.to_applier(ApplierStep::Install {
                        checkpoint_op,
                        metadata,
                        client_table,
                    })
                    .await;
                }
            }
        }
    }

    /// A peer's `RequestStateTransfer` or `RequestStateChunk`: to the serving side, with the
    /// core's availability and view and the tick count.
    fn serve_transfer(&mut self, from: ReplicaIndex, message: Message) {
        let (availability, view) = {
            let core = self.core.borrow();
            (core.transfer_availability(), core.view())
        };
        let now = self.ticks;
        let outputs = match message {
            Message::RequestStateTransfer { nonce, .. } => {
                self.offers
                    .on_request_transfer(from, nonce, availability, view, now)
            }
            Message::RequestStateChunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } => self
                .offers
                .on_request_chunk(from, nonce, artifact, offset, len, view, now),
            other => unreachable!("not a state-transfer request: {other:?}"),
        };
        self.serve_outputs(outputs);
    }

    /// Performs the serving side's outputs: sends, and offer builds (off the loop; the outcome
    /// comes back as [`Input::OfferBuilt`]).
    fn serve_outputs(&self, outputs: Vec<ServeOutput>) {
        for output in outputs {
            match output {
                ServeOutput::Send { to, message } => self.send(to, &message),
                ServeOutput::BuildOffer { checkpoint_op } => {
                    let store = Rc::clone(&self.store);
                    let clients_max = self.shard.config.clients_table_max;
                    let built = self.offers_built_tx.clone();
                    compio::runtime::spawn(async move {
                        let result = build_offer(&store, checkpoint_op, clients_max).await;
                        let _ = built.send((checkpoint_op, result)).await;
                    })
                    .detach();
                }
            }
        }
    }

    fn send(&self, to: ReplicaIndex, message: &Message) {
        let Some(bus) = &self.bus else {
            tracing::error!(to, "the core sent a message with no replica links; dropped");
            return;
        };
        let config = &self.shard.config;
        bus.send(to, encode_message(config.cluster, config.replica, message));
    }

    async fn truncate_journal(&self, op: u64) {
        let completion = match truncate_journal_after(&self.store, op).await {
            Ok(()) => Completion::JournalTruncated { op },
            Err(error) => {
                tracing::error!(op, %error, "journal truncate failed");
                Completion::JournalFailed {
                    op,
                    retryable: false,
                    reason: error.to_string(),
                }
            }
        };
        self.complete(completion).await;
    }

    /// Reads the prepare at `op` (off the loop); a missing or damaged record reads as `None`.
    fn read_journal(&self, op: u64) {
        let store = Rc::clone(&self.store);
        let completions = self.completions_tx.clone();
        compio::runtime::spawn(async move {
            let prepare = read_journal_at(&store, op).await;
            let _ = completions
                .send(Completion::JournalRead { op, prepare })
                .await;
        })
        .detach();
    }

    async fn write_superblock(&self, view: u32, log_view: u32, commit_max: u64) {
        let result = {
            let mut superblock = self.store.superblock().lock().await;
            let old = *superblock.state();
            let new = storage::superblock::SuperblockState {
                view: view.max(old.view),
                log_view: log_view.max(old.log_view),
                commit_max: commit_max.max(old.commit_max),
                ..old
            };
            superblock.write(new).await
        };
        match result {
            Ok(()) => {
                self.complete(Completion::SuperblockWritten { view, log_view })
                    .await;
            }
            Err(error) => self.fail_stop(&format!(
                "superblock write of view {view} log_view {log_view} failed: {error}"
            )),
        }
    }

    async fn complete(&self, completion: Completion) {
        let _ = self.completions_tx.send(completion).await;
    }

    /// Queues a step for the applier (waits only when its queue is full).
    async fn to_applier(&self, step: ApplierStep) {
        // The applier drains the queue; it only stops when the driver goes away.
        let _ = self.applies.send(step).await;
    }

    /// Converts the core's reply for `token` and queues it behind the applies before it.
    async fn reply(&mut self, token: ClientToken, reply: ClientReply) {
        let Some((waiting, arrived)) = self.waiting.remove(&token) else {
            // The request's connection went away (or the token is not ours): nothing to answer.
            return;
        };
        if matches!(
            reply,
            ClientReply::Committed(_) | ClientReply::Registered { .. }
        ) {
            self.shard
                .replica_metrics()
                .commit_latency(arrived.elapsed());
        }
        let committed = matches!(&reply, ClientReply::Committed(cached) if cached.error_code == 0);
        let reply = client_reply(reply, |primary| self.client_address_of(primary));
        self.to_applier(ApplierStep::Reply {
            waiting,
            reply,
            committed,
        })
        .await;
    }

    /// The client address of replica `replica`: ours, or what its Hello announced.
    fn client_address_of(&self, replica: ReplicaIndex) -> Option<String> {
        if replica == self.shard.config.replica {
            return Some(self.shard.client_address());
        }
        self.bus
            .as_ref()
            .and_then(|bus| bus.client_address(replica))
    }

    /// Publishes (view, primary, commit) to every shard when it changed (`Shard::set_status`).
    fn publish_status(&mut self) {
        let status = {
            let core = self.core.borrow();
            let primary = core.primary();
            ReplicaStatus {
                view: core.view(),
                replica: core.config().replica,
                primary: (core.status() == crate::vsr::message::Status::Normal).then_some(primary),
                is_primary: core.is_primary(),
                commit: core.commit_min(),
                primary_address: self.client_address_of(primary).unwrap_or_default(),
                generation: 0,
            }
        };
        let changed = self.published.as_ref().is_none_or(|published| {
            published.view != status.view
                || published.primary != status.primary
                || published.is_primary != status.is_primary
                || published.primary_address != status.primary_address
        });
        self.shard.set_status(status.clone(), changed);
        self.published = Some(status);
    }

    fn fail_stop(&self, reason: &str) {
        tracing::error!(
            reason,
            "stopping the server: shard 0's durable state cannot be written (fail-stop); restart \
             it once the cause is fixed"
        );
        self.shard.stop_server(reason.to_owned());
    }
}

/// Converts the core's reply to the connection's (`NotPrimary`: the view, the primary's index,
/// and its client address from `address_of`, empty when unknown or during a view change).
pub fn client_reply(
    reply: ClientReply,
    address_of: impl Fn(ReplicaIndex) -> Option<String>,
) -> ShardReply {
    match reply {
        ClientReply::Committed(cached) => ShardReply::Cached(cached),
        ClientReply::Registered { session } => ShardReply::Registered { session },
        ClientReply::Error { code, message } => ShardReply::Error { code, message },
        ClientReply::Evicted { reason } => ShardReply::Evicted { reason },
        ClientReply::NotPrimary { view, primary } => ShardReply::NotPrimary {
            view,
            primary,
            address: primary.and_then(address_of).unwrap_or_default(),
        },
    }
}

/// Appends the prepares the driver queues, consecutive ones under one journal lock, and reports
/// each. A failure that rolled back (space refused) is retryable; any other leaves the journal
/// poisoned until restart.
async fn journal_writer(
    store: Rc<ReplicaStore>,
    prepares: AsyncRx<Array<Prepare>>,
    completions: MAsyncTx<Array<Completion>>,
) {
    // A refused write is retried by the core on every tick: log the first refusal and the
    // recovery, not each attempt.
    let mut refusing = false;
    while let Ok(first) = prepares.recv().await {
        let mut batch = vec![first];
        while let Ok(next) = prepares.try_recv() {
            batch.push(next);
        }
        let result = store.journal().lock().await.append_batch(&batch).await;
        let reason = result
            .as_ref()
            .err()
            .map(journal_failure_reason)
            .unwrap_or_default();
        let retryable = match &result {
            Ok(()) => {
                if refusing {
                    tracing::info!(op = batch[0].op, "metadata journal writes succeed again");
                    refusing = false;
                }
                false
            }
            // The whole batch shares one outcome: a refused write rolled every record back;
            // any other failure poisoned the journal.
            Err(error @ JournalError::StorageFull { .. }) => {
                if !refusing {
                    tracing::warn!(
                        op = batch[0].op, %error,
                        "metadata journal write refused for lack of space; retried until space \
                         is freed (logged again once it succeeds)"
                    );
                    refusing = true;
                }
                true
            }
            Err(error) => {
                tracing::error!(op = batch[0].op, %error, "metadata journal write failed");
                false
            }
        };
        for prepare in &batch {
            let op = prepare.op;
            let completion = if result.is_ok() {
                Completion::JournalWritten {
                    op,
                    checksum: JournalHeader::for_prepare(prepare).checksum,
                }
            } else {
                Completion::JournalFailed {
                    op,
                    retryable,
                    reason: reason.clone(),
                }
            };
            let _ = completions.send(completion).await;
        }
    }
}

/// What a failed journal write tells the clients it refuses: the error (the journal file, the
/// failed step, the free bytes), and for a write past the file-size limit how to raise it.
fn journal_failure_reason(error: &JournalError) -> String {
    if let JournalError::StorageFull { source, .. } = error
        && let Some(note) = crate::shard::file_size_limit_note(source)
    {
        return format!("{error}: {note}");
    }
    error.to_string()
}

/// Builds the offer of the checkpoint at `checkpoint_op` from the persisted snapshot (issue 9
/// section 3): read and verified through io_uring (`storage::snapshot::read_snapshot`, trailer
/// checked), its op checked, then the payload decoded and the offer built off the reactor.
/// A snapshot newer than `checkpoint_op` is a checkpoint being replaced; any other failure is
/// an unreadable checkpoint, logged with the path.
async fn build_offer(
    store: &ReplicaStore,
    checkpoint_op: u64,
    clients_max: usize,
) -> Result<Offer, UnavailableReason> {
    let path = store.snapshot_path();
    let unreadable = |reason: String| {
        tracing::error!(
            path = %path.display(), checkpoint_op, %reason,
            "state transfer: cannot build an offer from the checkpoint; answering \
             CheckpointUnreadable"
        );
        UnavailableReason::CheckpointUnreadable
    };
    let snapshot = match storage::snapshot::read_snapshot(&path).await {
        Ok(Some(snapshot)) => snapshot,
        Ok(None) => return Err(unreadable("the snapshot file is missing".to_owned())),
        Err(error) => return Err(unreadable(error.to_string())),
    };
    if snapshot.checkpoint_op > checkpoint_op {
        return Err(UnavailableReason::CheckpointBeingReplaced);
    }
    if snapshot.checkpoint_op != checkpoint_op {
        return Err(unreadable(format!(
            "the snapshot is at op {}, not the checkpoint op",
            snapshot.checkpoint_op
        )));
    }
    let built = compio::runtime::spawn_blocking(move || {
        let restored = crate::vsr::snapshot::SnapshotPayload::decode(
            &snapshot.payload,
            checkpoint_op,
            clients_max,
        )?;
        Offer::build(
            checkpoint_op,
            &restored.metadata,
            &restored.client_table.to_snapshot(),
        )
        .map_err(|error| error.to_string())
    })
    .await;
    match built {
        Ok(Ok(offer)) => {
            tracing::info!(
                checkpoint_op,
                path = %path.display(),
                "state transfer: offer built from the checkpoint"
            );
            Ok(offer)
        }
        Ok(Err(reason)) => Err(unreadable(reason)),
        Err(_) => Err(unreadable("the offer build task failed".to_owned())),
    }
}

/// Durably drops every journal record above `op`.
async fn truncate_journal_after(store: &ReplicaStore, op: u64) -> Result<(), JournalError> {
    store
        .journal()
        .lock()
        .await
        .truncate_after(op)
        .await
        .map(|_| ())
}

/// The prepare at `op`, if the journal holds it intact (a read error reads as missing: the core
/// repairs it from peers).
async fn read_journal_at(store: &ReplicaStore, op: u64) -> Option<Prepare> {
    match store.journal().lock().await.read(op).await {
        Ok(prepare) => prepare,
        Err(error) => {
            tracing::warn!(op, %error, "journal read failed; the op reads as missing");
            None
        }
    }
}

/// Encodes a replica message as one bus frame (the wire codec).
fn encode_message(cluster: u128, from: ReplicaIndex, message: &Message) -> Vec<u8> {
    crate::vsr::wire::encode(cluster, from, message)
}

/// Decodes a verified frame's body (the wire codec).
fn message_decoder() -> Decoder<Message> {
    Rc::new(|header: &bus::Header, body: &[u8]| {
        crate::vsr::wire::decode_body(header, body).map_err(|error| error.to_string())
    })
}

/// The wall clock in microseconds since the Unix epoch (0 before 1970): the primary stamps it
/// into a prepare (the core never reads a clock).
fn wall_clock_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX)
        })
}

/// Applier queue capacity: the core emits at most one `Apply` and a few `Reply`s per committed op
/// and commits at most a pipeline's worth per input, so this many steps mean the fan-out is far
/// behind; the driver then waits (back-pressure) instead of growing memory.
const APPLIER_QUEUE_MAX: usize = 4096;

/// What the applier does, in the core's order.
enum ApplierStep {
    /// Apply committed op `op` on every shard (`Action::Apply`).
    Apply {
        op: u64,
        operation: PrepareOperation,
        applied: bool,
    },
    /// Answer a client, after the applies queued before it.
    Reply {
        waiting: TxOneshot<ShardReply>,
        reply: ShardReply,
        /// A successful committed change: partitions the apply before it could not open turn it
        /// into the "committed, not every partition opened" reply.
        committed: bool,
    },
    /// Take a checkpoint of this state once the applies before it are done (so its partition
    /// directories exist), off the applier too.
    Checkpoint {
        op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    },
    /// Install a checkpoint fetched by state transfer once the steps before it are done, then
    /// restore every shard's copy from it (issue 9 section 4).
    Install {
        checkpoint_op: u64,
        metadata: Arc<MetadataState>,
        client_table: ClientTableSnapshot,
    },
}

/// Performs `Apply`, `Reply` and `Checkpoint` in order, apart from the driver's loop: the
/// fan-out to every shard (partition opens, directory creation and removal with their fsyncs)
/// takes milliseconds, and the loop must keep writing the journal and answering peers meanwhile
/// (a backup applying a DeleteStream delayed its PrepareOk for the next op by the whole removal;
/// heartbeats paused). A reply still leaves only after every apply before it (DESIGN section 4).
async fn applier(
    shard: Rc<Shard>,
    steps: AsyncRx<Array<ApplierStep>>,
    completions: MAsyncTx<Array<Completion>>,
) {
    let mut failures: Vec<OpenFailure> = Vec::new();
    while let Ok(step) = steps.recv().await {
        match step {
            ApplierStep::Apply {
                op,
                operation,
                applied,
            } => {
                shard.replica_metrics().committed();
                failures.clear();
                let PrepareOperation::Metadata(change) = operation else {
                    // Register touches only the client table, which lives in the core.
                    continue;
                };
                if !applied {
                    continue;
                }
                failures = shard.fan_out(op, &change).await;
                if failures.is_empty() {
                    tracing::info!(op, ?change, "metadata committed");
                } else {
                    tracing::error!(
                        op,
                        ?change,
                        ?failures,
                        "metadata committed, but not every partition could be opened; each is \
                         retried on its next send or poll"
                    );
                }
            }
            ApplierStep::Reply {
                waiting,
                reply,
                committed,
            } => {
                let failed = std::mem::take(&mut failures);
                let reply = if committed && !failed.is_empty() {
                    crate::unopened::commit_reply(&failed)
                } else {
                    reply
                };
                waiting.send(reply);
            }
            ApplierStep::Checkpoint {
                op,
                metadata,
                client_table,
            } => {
                // Off the applier too: the snapshot write takes a while, and applies go on.
                let shard = Rc::clone(&shard);
                let completions = completions.clone();
                compio::runtime::spawn(async move {
                    let completion = match shard.checkpoint_state(op, metadata, client_table).await
                    {
                        Ok(journal_first_op) => Completion::CheckpointDone {
                            op,
                            journal_first_op,
                        },
                        Err(_) => Completion::CheckpointFailed { op },
                    };
                    let _ = completions.send(completion).await;
                })
                .detach();
            }
            ApplierStep::Install {
                checkpoint_op,
                metadata,
                client_table,
            } => {
                if let Some(completion) =
                    install(&shard, checkpoint_op, metadata, client_table).await
                {
                    let _ = completions.send(completion).await;
                }
            }
        }
    }
}

/// Installs the checkpoint at `checkpoint_op` (`ReplicaStore::install_checkpoint`), then the
/// restore fan-out (`Shard::restore_metadata`), and returns the completion to report: installed
/// (degraded or not), or failed (nothing durable changed; the reason names the file). A journal
/// restart that failed after the snapshot was installed stops the server (`None`): the next
/// boot finishes the restart.
async fn install(
    shard: &Rc<Shard>,
    checkpoint_op: u64,
    metadata: Arc<MetadataState>,
    client_table: ClientTableSnapshot,
) -> Option<Completion> {
    let installed = shard
        .replica()
        .install_checkpoint(checkpoint_op, Arc::clone(&metadata), client_table)
        .await;
    let done = match installed {
        Ok(done) => done,
        Err(
            error @ (crate::store::InstallError::Journal(_)
            | crate::store::InstallError::MarkerRemove(_)),
        ) => {
            let reason = format!("state transfer install at op {checkpoint_op}: {error}");
            tracing::error!(%reason, "stopping the server: restart it to finish the install");
            shard.stop_server(reason);
            return None;
        }
        Err(error) => {
            tracing::warn!(
                checkpoint_op, %error,
                "state transfer install failed; the previous checkpoint and journal are unchanged"
            );
            return Some(Completion::InstallFailed {
                checkpoint_op,
                reason: error.to_string(),
            });
        }
    };
    let failures = shard.restore_metadata(checkpoint_op, metadata).await;
    if !failures.is_empty() {
        tracing::error!(
            checkpoint_op,
            ?failures,
            "installed checkpoint restored, but not every partition could be opened; each is \
             retried on its next send or poll"
        );
    }
    tracing::info!(
        checkpoint_op,
        degraded = done.degraded,
        "state transfer: checkpoint installed and every shard restored; repairing the tail \
         above it from peers"
    );
    Some(Completion::CheckpointInstalled {
        checkpoint_op,
        degraded: done.degraded,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_primary_carries_view_primary_and_its_address() {
        let reply = client_reply(
            ClientReply::NotPrimary {
                view: 4,
                primary: Some(1),
            },
            |replica| (replica == 1).then(|| "10.0.0.2:7000".to_owned()),
        );
        assert!(matches!(
            reply,
            ShardReply::NotPrimary { view: 4, primary: Some(1), ref address } if address == "10.0.0.2:7000"
        ));
        let unknown = client_reply(
            ClientReply::NotPrimary {
                view: 5,
                primary: None,
            },
            |_| Some("never asked".to_owned()),
        );
        assert!(matches!(
            unknown,
            ShardReply::NotPrimary { view: 5, primary: None, ref address } if address.is_empty()
        ));
    }

    /// Issue 9 section 3: the offer is built from the persisted, verified snapshot at the
    /// checkpoint op; a missing or damaged snapshot answers `CheckpointUnreadable`, one newer
    /// than the checkpoint op `CheckpointBeingReplaced`.
    #[test]
    fn issue9_offer_built_from_the_persisted_snapshot_or_refused_with_a_reason() {
        let dir = tempfile::tempdir().unwrap();
        let config = single_replica_config(dir.path());
        let runtime = compio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let boot = crate::store::boot::recover(&config).await.unwrap();
            let store = ReplicaStore::for_driver(&config, boot.journal, boot.superblock, 0);
            let refused = build_offer(&store, 8, 16).await.unwrap_err();
            assert_eq!(
                refused,
                UnavailableReason::CheckpointUnreadable,
                "no snapshot"
            );
            let mut metadata = MetadataState::new();
            metadata.apply(
                8,
                &MetadataOp::CreateStream {
                    stream_id: 1,
                    name: "orders".to_owned(),
                },
            );
            let table = crate::vsr::client_table::ClientTable::new(16).to_snapshot();
            store
                .checkpoint_state(8, Arc::new(metadata.clone()), table)
                .await
                .unwrap();
            let offer = build_offer(&store, 8, 16).await.unwrap();
            assert_eq!(offer.checkpoint_op(), 8);
            assert_eq!(
                offer.artifact(crate::vsr::transfer::ArtifactKind::Metadata),
                Some(serde_json::to_vec(&metadata).unwrap().as_slice())
            );
            assert_eq!(
                build_offer(&store, 7, 16).await.unwrap_err(),
                UnavailableReason::CheckpointBeingReplaced
            );
            assert_eq!(
                build_offer(&store, 9, 16).await.unwrap_err(),
                UnavailableReason::CheckpointUnreadable
            );
            let mut bytes = std::fs::read(store.snapshot_path()).unwrap();
            let middle = bytes.len() / 2;
            bytes[middle] ^= 0xFF;
            std::fs::write(store.snapshot_path(), bytes).unwrap();
            assert_eq!(
                build_offer(&store, 8, 16).await.unwrap_err(),
                UnavailableReason::CheckpointUnreadable,
                "a snapshot whose trailer does not verify"
            );
        });
    }

    fn single_replica_config(data_dir: &std::path::Path) -> crate::config::ServerConfig {
        let mut config = crate::config::ServerConfig::new(data_dir.to_path_buf());
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.topology.shards = runtime::ShardCountArg::Count(2);
        config.topology.pin = false;
        config
    }

    /// Today's behaviour through the driver and the core with `replica_count = 1`: Register and
    /// CreateStream/CreateTopic commit, a retried request gets its cached reply (applied once),
    /// and a restart keeps every change.
    #[test]
    fn one_replica_commits_and_a_restart_keeps_the_changes() {
        let dir = tempfile::tempdir().unwrap();
        let server = crate::RunningServer::start(single_replica_config(dir.path())).unwrap();
        let addr = server.local_addr;
        let runtime = compio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let mut client = bus::Client::connect(addr).await.unwrap();
            let session = client.register().await.unwrap();
            assert!(session > 0);
            client.create_stream(1, "orders").await.unwrap();
            client.create_topic(1, 1, "eu", 2).await.unwrap();
            let refused = client.create_stream(1, "orders").await.unwrap_err();
            assert!(
                refused.to_string().contains("already exists"),
                "a second CreateStream of id 1 is refused: {refused}"
            );
        });
        server.stop_handle().stop();
        server.join().unwrap();

        let server = crate::RunningServer::start(single_replica_config(dir.path())).unwrap();
        let addr = server.local_addr;
        let metadata = runtime.block_on(async {
            let mut client = bus::Client::connect(addr).await.unwrap();
            client.register().await.unwrap();
            client.get_metadata().await.unwrap()
        });
        server.stop_handle().stop();
        server.join().unwrap();
        assert_eq!(
            (metadata.view, metadata.replica, metadata.primary),
            (0, 0, 0),
            "a single replica is the primary of view 0"
        );
        // Register, CreateStream, CreateTopic before the restart, a second Register after it.
        assert!(metadata.commit >= 4, "commit {}", metadata.commit);
        assert_eq!(metadata.streams.len(), 1);
        assert_eq!(metadata.streams[0].name, "orders");
        assert_eq!(metadata.streams[0].topics.len(), 1);
        assert_eq!(metadata.streams[0].topics[0].partitions.len(), 2);
    }

    fn cluster_config(
        data_dir: &std::path::Path,
        replica: u8,
        addresses: &[std::net::SocketAddr],
    ) -> crate::config::ServerConfig {
        let mut config = single_replica_config(data_dir);
        config.cluster = 7;
        config.replica = replica;
        config.addresses = addresses.to_vec();
        config
    }

    /// Asks every running replica for its metadata until `done` holds for the answers; panics
    /// naming what they last showed after `attempts` rounds 20 ms apart (a liveness bound, not
    /// a timing assertion: the cluster has seconds to converge).
    fn wait_for_all(
        runtime: &compio::runtime::Runtime,
        addresses: &[std::net::SocketAddr],
        done: impl Fn(&[bus::Metadata]) -> bool,
        what: &str,
    ) -> Vec<bus::Metadata> {
        let mut last = Vec::new();
        for _ in 0..500 {
            last = runtime.block_on(async {
                let mut all = Vec::new();
                for address in addresses {
                    let Ok(mut client) = bus::Client::connect(*address).await else {
                        continue;
                    };
                    if let Ok(metadata) = client.get_metadata().await {
                        all.push(metadata);
                    }
                }
                all
            });
            if last.len() == addresses.len() && done(&last) {
                return last;
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        panic!("{what}: the replicas did not converge; last seen: {last:#?}");
    }

    /// Three replicas in one process: they elect a primary, a change made through any replica's
    /// address (the client follows NotPrimary) is applied on all three, and after the primary
    /// stops the other two elect a new one and keep committing.
    #[test]
    fn three_replicas_elect_commit_and_fail_over() {
        let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
        let addresses: Vec<std::net::SocketAddr> =
            (0..3).map(|_| crate::test_support::unused_addr()).collect();
        let mut servers: Vec<Option<crate::RunningServer>> = (0..3u8)
            .map(|replica| {
                let config = cluster_config(dirs[usize::from(replica)].path(), replica, &addresses);
                Some(crate::RunningServer::start(config).unwrap())
            })
            .collect();
        let clients: Vec<std::net::SocketAddr> = servers
            .iter()
            .map(|server| server.as_ref().unwrap().local_addr)
            .collect();
        let runtime = compio::runtime::Runtime::new().unwrap();
        // Every replica in one view, its primary's, with the status normal (a replica in a view
        // change reports no primary: `primary` is then the view's, which the others disagree
        // with only while they are in another view).
        let elected = wait_for_all(
            &runtime,
            &clients,
            |all| {
                all.windows(2)
                    .all(|pair| (pair[0].view, pair[0].primary) == (pair[1].view, pair[1].primary))
            },
            "election",
        );
        runtime.block_on(async {
            // Through a backup's address: the client follows NotPrimary to the primary.
            let backup = (elected[0].primary + 1) % 3;
            let mut client = bus::Client::connect_any(&[clients[usize::from(backup)]])
                .await
                .unwrap();
            client.register().await.unwrap();
            client.create_stream(1, "orders").await.unwrap();
        });
        let committed = wait_for_all(
            &runtime,
            &clients,
            |all| all.iter().all(|metadata| metadata.streams.len() == 1),
            "the first change on every replica",
        );
        let old_primary = committed[0].primary;

        let stopped = servers[usize::from(old_primary)].take().unwrap();
        stopped.stop_handle().stop();
        stopped.join().unwrap();
        let survivors: Vec<std::net::SocketAddr> = (0..3u8)
            .filter(|replica| *replica != old_primary)
            .map(|replica| clients[usize::from(replica)])
            .collect();
        wait_for_all(
            &runtime,
            &survivors,
            |all| {
                all.iter().all(|metadata| {
                    metadata.primary != old_primary && metadata.view > committed[0].view
                })
            },
            "a new primary",
        );
        runtime.block_on(async {
            let mut client = bus::Client::connect_any(&survivors).await.unwrap();
            client.register().await.unwrap();
            client.create_stream(2, "after").await.unwrap();
        });
        wait_for_all(
            &runtime,
            &survivors,
            |all| all.iter().all(|metadata| metadata.streams.len() == 2),
            "a change in the new view on both survivors",
        );
        for server in servers.into_iter().flatten() {
            server.stop_handle().stop();
            server.join().unwrap();
        }
    }
}
