//! Server bootstrap and the shard main loop: validate config, resolve the topology, probe
//! io_uring, reserve the listen port, launch the shards, wait until every shard listens.
//!
//! Startup order (DESIGN section 3): shard 0 recovers metadata, checks its partitions against the
//! open-file budget and hands each shard its copy; every shard opens the partitions it owns;
//! after the ready barrier each shard opens its SO_REUSEPORT listener. Never opens a listener
//! before every shard is ready.
//!
//! Shutdown order: on the stop signal every shard closes its listener and shuts the read side of
//! its connections; connections finish the request they hold, answer what was already sent with
//! `ShuttingDown` and end; all shards keep pumping until every shard's connections are done (or
//! `SHUTDOWN_DRAIN_DEADLINE`); then shard 0 checkpoints and every shard fsyncs its logs. Never
//! drops a request it read without answering it, unless the drain deadline passes.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc as std_mpsc;
use std::time::{Duration, Instant};

use compio::net::TcpListener;
use runtime::{
    IoDriver, LaunchConfig, LaunchError, PumpEvent, ShardContext, ShardId, ShardSet, StopHandle,
    Topology,
};
use socket2::{Domain, Protocol, Socket, Type};

use crate::accept::{Connections, accept_loop};
use crate::config::{ConfigError, ServerConfig};
use crate::frame::ShardFrame;
use crate::limits::{LISTEN_BACKLOG, PARTITIONS_DIR_NAME, SHUTDOWN_DRAIN_DEADLINE};
use crate::metadata::{MetadataState, store};
use crate::resources::{self, ResourceBudget};
use crate::shard::Shard;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Topology(#[from] runtime::TopologyError),
    #[error(transparent)]
    IoUring(#[from] runtime::IoUringUnavailable),
    /// `--data-dir` or a directory inside it could not be created.
    #[error("cannot create data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    /// `--data-dir` names something that exists but is not a directory (a regular file).
    #[error("--data-dir {path} is not a directory; choose a directory (it is created if missing)")]
    DataDirNotDirectory { path: String },
    #[error("cannot listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    DataDirLock(#[from] crate::resources::LockError),
    #[error(
        "{metadata} is missing but {partitions} holds partition data: refusing to boot with empty metadata, which would orphan (and on re-creation delete) that data; restore {metadata}, or move {partitions} away to start empty"
    )]
    MetadataMissing {
        metadata: String,
        partitions: String,
    },
    #[error(transparent)]
    Launch(#[from] LaunchError),
    #[error("startup failed: {0}")]
    Startup(String),
}

/// A started server: every shard is ready and listening on `local_addr`.
#[derive(Debug)]
pub struct RunningServer {
    pub local_addr: SocketAddr,
    pub shard_count: u16,
    pub topology: Topology,
    pub budget: ResourceBudget,
    /// Asks every shard for its metrics snapshot (`shards::metrics`); cloned into the metrics
    /// listener's thread by `serve --metrics-listen`.
    pub metrics: Arc<crate::metrics::MetricsGatherer>,
    shard_set: ShardSet,
    /// The exclusive lock on the data directory, held for the life of the server.
    _data_dir_lock: std::fs::File,
}

/// How long startup (metadata recovery, opening every partition) may take before it is reported
/// as stuck.
const STARTUP_TIMEOUT: Duration = Duration::from_mins(2);

/// What a shard reports to the starting thread once.
type StartupReport = Result<(), String>;

/// Sends a failure report if the shard future is dropped (error or panic) before it reported.
struct StartupGuard {
    shard: u16,
    report: Option<std_mpsc::Sender<StartupReport>>,
}

impl StartupGuard {
    fn report(&mut self, result: StartupReport) {
        if let Some(report) = self.report.take() {
            let _ = report.send(result);
        }
    }
}

impl Drop for StartupGuard {
    fn drop(&mut self) {
        let shard = self.shard;
        self.report(Err(format!("shard {shard} stopped during startup")));
    }
}

fn reuse_port_socket(addr: SocketAddr) -> std::io::Result<Socket> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.bind(&addr.into())?;
    Ok(socket)
}

impl RunningServer {
    /// Starts the server and returns once every shard listens.
    ///
    /// # Errors
    /// Invalid configuration or topology (naming key, value and rule), io_uring unavailable (with
    /// its cause), data directory or listen failures, a shard failing during startup.
    pub fn start(config: ServerConfig) -> Result<RunningServer, ServerError> {
        config.validate()?;
        let topology = Topology::resolve(&config.topology)?;
        if config.io_driver == IoDriver::IoUring {
            runtime::probe_io_uring(topology.shard_count())?;
        }
        // The port first: a start that fails on a busy port leaves nothing on disk.
        let listen = resources::probe_listen_addr_retrying(config.listen).map_err(|source| {
            ServerError::Listen {
                addr: config.listen,
                source,
            }
        })?;
        crate::store::failpoint::check_env().map_err(ServerError::Startup)?;
        // Before anything is written: a limit too small to serve refuses with nothing on disk.
        let budget = ResourceBudget::from_open_file_limit(
            resources::raise_open_file_limit(),
            topology.shard_count(),
        );
        if let Some(refusal) = budget.startup_refusal(topology.shard_count()) {
            return Err(ServerError::Startup(refusal));
        }
        resources::check_file_size_limit(&config).map_err(ServerError::Startup)?;
        tracing::info!(
            open_file_limit = budget.open_file_limit,
            partitions_max = budget.partitions_max,
            connections_per_shard_max = budget.connections_per_shard_max,
            "resource budget"
        );

        // create_dir_all on a regular file fails with a bare EEXIST: name the problem instead.
        if config.data_dir.exists() && !config.data_dir.is_dir() {
            return Err(ServerError::DataDirNotDirectory {
                path: config.data_dir.display().to_string(),
            });
        }
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
        let data_dir_lock = resources::lock_data_dir(&config.data_dir)?;
        let partitions_dir = config.data_dir.join(PARTITIONS_DIR_NAME);
        // A data directory is formatted by writing its superblock (or migrated from the earlier
        // metadata.json format); partition data without either has lost its metadata.
        let superblock_path = crate::store::superblock_path(&config.data_dir);
        let legacy_path = store::metadata_path(&config.data_dir);
        // (A journal or snapshot without a superblock is refused by shard 0's boot, which names it.)
        if !superblock_path.exists()
            && !legacy_path.exists()
            && !crate::store::journal_dir(&config.data_dir).exists()
            && !crate::store::snapshot_path(&config.data_dir).exists()
            && resources::has_entries(&partitions_dir)
        {
            return Err(ServerError::MetadataMissing {
                metadata: superblock_path.display().to_string(),
                partitions: partitions_dir.display().to_string(),
            });
        }
        std::fs::create_dir_all(&partitions_dir).map_err(|source| ServerError::DataDir {
            path: partitions_dir.display().to_string(),
            source,
        })?;
        // Reserve the port (port 0 picks one) so every shard binds the same one with SO_REUSEPORT.
        // The reservation never listens, so it never takes a connection.
        let reservation = reuse_port_socket(listen).map_err(|source| ServerError::Listen {
            addr: listen,
            source,
        })?;
        let local_addr = reservation
            .local_addr()
            .ok()
            .and_then(|a| a.as_socket())
            .ok_or_else(|| ServerError::Startup("reserved listen socket has no address".into()))?;

        let shard_count = topology.shard_count();
        let launch = LaunchConfig {
            topology: topology.clone(),
            io_driver: config.io_driver,
            inbox_capacity: config.inbox_capacity,
            idle_poll: config.idle_poll,
            shutdown_deadline: runtime::launcher::SHUTDOWN_DEADLINE,
        };
        // The address clients reach (a `NotPrimary` reply names it): the port picked for port 0.
        let mut config = config;
        config.listen = local_addr;
        let config = Arc::new(config);
        let drain = Arc::new(DrainState::new(shard_count));
        let (report_tx, report_rx) = std_mpsc::channel::<StartupReport>();
        let report_tx = std::sync::Mutex::new(report_tx);
        let (metrics, metrics_lanes) = crate::metrics::metrics_lanes(shard_count);
        let metrics_lanes: std::sync::Mutex<Vec<Option<crate::metrics::MetricsLaneRx>>> =
            std::sync::Mutex::new(metrics_lanes.into_iter().map(Some).collect());
        let shard_set = ShardSet::launch(&launch, move |ctx: ShardContext<ShardFrame>| {
            let report = report_tx.lock().map(|tx| tx.clone()).ok();
            let metrics_lane = metrics_lanes
                .lock()
                .ok()
                .and_then(|mut lanes| lanes.get_mut(usize::from(ctx.shard_id.0))?.take());
            let guard = StartupGuard {
                shard: ctx.shard_id.0,
                report,
            };
            Box::pin(run_shard(
                ctx,
                Arc::clone(&config),
                budget,
                local_addr,
                guard,
                Arc::clone(&drain),
                metrics_lane,
            ))
        })?;

        let mut listening = 0;
        while listening < shard_count {
            match report_rx.recv_timeout(STARTUP_TIMEOUT) {
                Ok(Ok(())) => listening += 1,
                Ok(Err(message)) => {
                    shard_set.stop_handle().stop();
                    // The join error names the shard and its message; fall back to ours.
                    return Err(match shard_set.join() {
                        Err(e) => ServerError::Launch(e),
                        Ok(()) => ServerError::Startup(message),
                    });
                }
                Err(_) => {
                    shard_set.stop_handle().stop();
                    let _ = shard_set.join();
                    return Err(ServerError::Startup(
                        "shards did not become ready within 120 s".into(),
                    ));
                }
            }
        }
        drop(reservation);
        tracing::info!(%local_addr, shard_count, "listening");
        Ok(RunningServer {
            local_addr,
            shard_count,
            topology,
            budget,
            metrics: Arc::new(metrics),
            shard_set,
            _data_dir_lock: data_dir_lock,
        })
    }

    pub fn stop_handle(&self) -> StopHandle {
        self.shard_set.stop_handle()
    }

    /// Stops the server on SIGINT/SIGTERM.
    pub fn stop_on_signals(&self) -> std::io::Result<()> {
        self.shard_set.stop_on_signals()
    }

    /// Waits until every shard stopped (after a stop signal, or a shard failure).
    pub fn join(self) -> Result<(), ServerError> {
        self.shard_set.join().map_err(ServerError::from)
    }
}

/// Shards still draining at shutdown, shared by every shard: a shard keeps answering other
/// shards' forwarded requests until every shard's connections are done (or the drain deadline).
#[derive(Debug)]
struct DrainState {
    draining_count: AtomicUsize,
}

impl DrainState {
    fn new(shard_count: u16) -> DrainState {
        DrainState {
            draining_count: AtomicUsize::new(usize::from(shard_count)),
        }
    }

    fn all_drained(&self) -> bool {
        self.draining_count.load(Ordering::Acquire) == 0
    }
}

/// One shard's vote in `DrainState`: cast when its connections are done, or when the shard ends
/// however it ends (a shard that failed has no connection left to wait for).
struct DrainVote {
    state: Arc<DrainState>,
    cast: bool,
}

impl DrainVote {
    fn cast(&mut self) {
        if !self.cast {
            self.cast = true;
            self.state.draining_count.fetch_sub(1, Ordering::AcqRel);
        }
    }
}

impl Drop for DrainVote {
    fn drop(&mut self) {
        self.cast();
    }
}

/// One shard's whole life: bootstrap, open partitions, ready barrier, listen, pump, drain,
/// shutdown.
async fn run_shard(
    ctx: ShardContext<ShardFrame>,
    config: Arc<ServerConfig>,
    budget: ResourceBudget,
    listen_addr: SocketAddr,
    mut startup: StartupGuard,
    drain: Arc<DrainState>,
    metrics_lane: Option<crate::metrics::MetricsLaneRx>,
) -> Result<(), String> {
    let mut drain_vote = DrainVote {
        state: drain,
        cast: false,
    };
    let (shard_id, shard_count) = (ctx.shard_id, ctx.shard_count);
    let (endpoint, mut pump, ready_barrier) = ctx.into_parts();
    let (metadata, replica, opened_core) = if shard_id == ShardId(0) {
        let boot = crate::store::boot::recover(&config)
            .await
            .map_err(|error| error.to_string())?;
        log_recovery_outcome(&boot.outcome);
        let replica = crate::store::ReplicaStore::for_driver(
            &config,
            boot.journal,
            boot.superblock,
            boot.recovered.checkpoint_op,
        );
        // The core applies the journaled ops above the checkpoint when it opens; every shard
        // starts from that state (as before issue 8, when boot replayed the journal).
        let opened = crate::driver::open_core(&config, boot.recovered).await?;
        let metadata = MetadataState::clone(opened.core.metadata());
        // Before any partition opens: past the budget, opening them would end in EMFILE.
        if let Some(refusal) = budget.partitions_refusal(metadata.namespaces().len() as u64) {
            return Err(format!(
                "cannot open the partitions of {}: {refusal}",
                config.data_dir.display()
            ));
        }
        for target in 1..shard_count {
            endpoint
                .try_send(
                    ShardId(target),
                    ShardFrame::Bootstrap(Box::new(metadata.clone())),
                )
                .map_err(|e| format!("bootstrap of shard {target}: {e}"))?;
        }
        (metadata, Some(replica), Some(opened))
    } else {
        // None: stopped before shard 0 sent the metadata (it failed, or a signal came). Not this
        // shard's failure: returning Ok lets the shard that failed name the cause.
        let Some(metadata) = wait_for_bootstrap(&mut pump).await? else {
            return Ok(());
        };
        (metadata, None, None)
    };
    tracing::debug!(
        shard = shard_id.0,
        op = metadata.op,
        "metadata copy received"
    );
    let shard = Rc::new(Shard::new(
        shard_id,
        shard_count,
        Arc::clone(&config),
        endpoint,
        metadata,
        replica,
        budget,
    ));
    shard.open_owned_partitions().await?;
    ready_barrier.wait().await;
    if shard.endpoint_stopped() {
        // Another shard failed (it reports why) or a signal came: not this shard's failure.
        return Ok(());
    }
    let listener =
        bind_listener(listen_addr).map_err(|e| format!("listen on {listen_addr}: {e}"))?;
    let metadata_task = match opened_core {
        Some(opened) => {
            log_cluster(&config, opened.core.view(), listen_addr);
            let store = Rc::clone(shard.replica());
            let driver = crate::driver::Driver::start(
                Rc::clone(&shard),
                store,
                opened,
                listen_addr.to_string(),
            )
            .await?;
            Some(compio::runtime::spawn(driver.run()))
        }
        None => None,
    };
    let connections = Rc::new(Connections::default());
    let accept_task = compio::runtime::spawn(accept_loop(
        Rc::clone(&shard),
        budget,
        listener,
        Rc::clone(&connections),
    ));
    let metrics_task = metrics_lane
        .map(|lane| compio::runtime::spawn(answer_metrics_requests(Rc::clone(&shard), lane)));
    let retention_task = compio::runtime::spawn(crate::retention::run(Rc::clone(&shard)));
    startup.report(Ok(()));

    loop {
        match pump.next().await {
            PumpEvent::Stop => break,
            event => on_event(&shard, &config, event).await,
        }
    }
    // Parked polls answer now, with what their partitions hold, so they do not hold the drain
    // up until their waits pass (issue 11 section 3).
    let parked_count = shard.release_parked_polls();
    if parked_count > 0 {
        tracing::info!(
            shard = shard_id.0,
            parked_polls = parked_count,
            "stopping: released parked polls"
        );
    }

    // Drain: no new connection, each connection finishes the request it holds and answers what
    // its client already sent with `ShuttingDown`, while every shard keeps pumping so that
    // forwarded requests and their replies still flow.
    drop(accept_task);
    let live_count = connections.shut_reads();
    tracing::info!(
        shard = shard_id.0,
        connections = live_count,
        deadline_s = SHUTDOWN_DRAIN_DEADLINE.as_secs(),
        "stopping: listener closed, draining connections"
    );
    let drain_deadline = Instant::now() + SHUTDOWN_DRAIN_DEADLINE;
    loop {
        if connections.all_finished() {
            drain_vote.cast();
        }
        if drain_vote.state.all_drained() {
            break;
        }
        if Instant::now() >= drain_deadline {
            tracing::warn!(
                shard = shard_id.0,
                deadline_s = SHUTDOWN_DRAIN_DEADLINE.as_secs(),
                "drain deadline passed: closing the connections still busy (their requests may be unanswered)"
            );
            break;
        }
        // Ticks come every 10 ms, so the checks above run at least that often.
        let event = pump.next_draining().await;
        on_event(&shard, &config, event).await;
    }
    drain_vote.cast();

    tracing::info!(shard = shard_id.0, "stopping: fsyncing logs");
    drop(metadata_task);
    drop(metrics_task);
    drop(retention_task);
    connections.cancel_all();
    let mut close_failed = false;
    let fail_stop = shard.fail_stop_reason();
    if let Some(reason) = &fail_stop {
        tracing::error!(%reason, "no final checkpoint after a fail-stop; the next boot recovers from the journal");
    } else if shard_id == ShardId(0) {
        // The final checkpoint: the next boot starts from this snapshot and replays nothing. A
        // failure loses nothing (the journal holds every committed op) but is reported; one
        // refused for lack of space or descriptors (a full disk, or the open-file limit, at
        // shutdown) is only warned about (in `Shard::checkpoint`) and the exit stays clean.
        if let Err(e) = shard.checkpoint().await
            && e.resource_refused().is_none()
        {
            tracing::error!(error = %e, "final checkpoint failed; the journal keeps every op");
            close_failed = true;
        }
    }
    for log in shard.logs() {
        if let Err(e) = log.close().await {
            tracing::error!(shard = shard_id.0, path = %log.dir().display(), error = %e, "final fsync failed");
            close_failed = true;
        }
    }
    for offsets in shard.offsets.all() {
        if let Err(e) = offsets.sync().await {
            tracing::error!(shard = shard_id.0, error = %e, "final fsync of consumer offsets failed");
            close_failed = true;
        }
    }
    if let Some(reason) = fail_stop {
        return Err(format!("stopped: {reason}"));
    }
    if close_failed {
        return Err(
            "a partition log failed its final fsync or the final checkpoint failed; see the log above"
                .into(),
        );
    }
    tracing::info!(shard = shard_id.0, "stopped");
    Ok(())
}

/// Logs what boot found that needs the peers (one line; the core repairs or keeps asking).
fn log_recovery_outcome(outcome: &crate::store::boot::RecoveryOutcome) {
    use crate::store::boot::RecoveryOutcome;
    match outcome {
        RecoveryOutcome::Clean => {}
        RecoveryOutcome::RepairFromPeers {
            path,
            position,
            damaged_op,
            highest_op,
        } => tracing::warn!(
            path = %path.display(), position, damaged_op, highest_op,
            "journal damaged above the checkpoint; the ops from damaged_op on are repaired from \
             the peers"
        ),
        RecoveryOutcome::NeedsStateTransfer {
            checkpoint_op,
            journal_first_op,
        } => tracing::warn!(
            checkpoint_op,
            journal_first_op,
            "the journal starts above the checkpoint; the missing ops are asked from the peers \
             (if they released them too, this replica needs state transfer, not in this version)"
        ),
    }
}

/// The startup line of a replica: cluster, replica index, replica count, view, peer addresses.
fn log_cluster(config: &ServerConfig, view: u32, client_address: SocketAddr) {
    let peers: Vec<String> = config
        .addresses
        .iter()
        .enumerate()
        .map(|(index, address)| format!("{index}={address}"))
        .collect();
    tracing::info!(
        cluster = format_args!("{:#x}", config.cluster),
        replica = config.replica,
        replica_count = config.replica_count(),
        view,
        %client_address,
        addresses = %peers.join(","),
        "replica starting"
    );
}

/// Handles one pump event other than `Stop`, while serving and while draining.
async fn on_event(shard: &Rc<Shard>, config: &ServerConfig, event: PumpEvent<ShardFrame>) {
    match event {
        PumpEvent::Stop => {}
        PumpEvent::Tick => {
            if matches!(config.fsync, storage::FsyncPolicy::Interval(_)) {
                let logs = shard.logs();
                let offsets = shard.offsets.all();
                compio::runtime::spawn(async move {
                    for log in logs {
                        if let Err(e) = log.on_tick().await {
                            tracing::error!(error = %e, "interval fsync failed");
                        }
                    }
                    for offsets in offsets {
                        if let Err(e) = offsets.on_tick().await {
                            tracing::error!(error = %e, "interval fsync of consumer offsets failed");
                        }
                    }
                })
                .detach();
            }
        }
        PumpEvent::Inbox(envelopes) => {
            for envelope in envelopes {
                shard.on_inbox(envelope).await;
            }
        }
        PumpEvent::Reply(envelopes) => {
            for envelope in envelopes {
                shard.on_reply(envelope);
            }
        }
    }
}

/// Answers this shard's metrics lane until the lane closes or the task is dropped (shutdown):
/// each request gets a snapshot built here, on the shard's own thread (`shards::metrics`).
async fn answer_metrics_requests(shard: Rc<Shard>, lane: crate::metrics::MetricsLaneRx) {
    while let Ok(request) = lane.recv().await {
        // Err: the scrape gave up waiting (timeout); nothing to do.
        let _ = request.reply.try_send(shard.metrics_snapshot());
    }
}

/// Waits for shard 0's metadata copy; any other frame before it is a bug in the startup order.
async fn wait_for_bootstrap(
    pump: &mut runtime::Pump<ShardFrame>,
) -> Result<Option<MetadataState>, String> {
    loop {
        match pump.next().await {
            PumpEvent::Stop => return Ok(None),
            PumpEvent::Tick => {}
            PumpEvent::Inbox(envelopes) | PumpEvent::Reply(envelopes) => {
                // Shard 0 sends nothing before the bootstrap, so it is the first frame.
                if let Some(envelope) = envelopes.into_iter().next() {
                    return match envelope.frame {
                        ShardFrame::Bootstrap(metadata) => Ok(Some(*metadata)),
                        other => Err(format!(
                            "frame before bootstrap from shard {}: {other:?}",
                            envelope.from.0
                        )),
                    };
                }
            }
        }
    }
}

fn bind_listener(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = reuse_port_socket(addr)?;
    socket.listen(LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}
