//! Server bootstrap and the shard main loop: validate config, resolve the topology, probe
//! io_uring, reserve the listen port, launch the shards, wait until every shard listens.
//!
//! Startup order (DESIGN section 3): shard 0 recovers metadata and hands each shard its copy;
//! every shard opens the partitions it owns; after the ready barrier each shard opens its
//! SO_REUSEPORT listener. Never opens a listener before every shard is ready.

use std::net::SocketAddr;
use std::rc::Rc;
use std::sync::Arc;
use std::sync::mpsc as std_mpsc;
use std::time::Duration;

use compio::net::TcpListener;
use runtime::{
    IoDriver, LaunchConfig, LaunchError, PumpEvent, ShardContext, ShardId, ShardSet, StopHandle,
    Topology,
};
use socket2::{Domain, Protocol, Socket, Type};

use crate::config::{ConfigError, ServerConfig};
use crate::connection::serve_connection;
use crate::frame::ShardFrame;
use crate::limits::{LISTEN_BACKLOG, PARTITIONS_DIR_NAME};
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
    #[error("data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
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
            runtime::probe_io_uring()?;
        }
        // The port first: a start that fails on a busy port leaves nothing on disk.
        let listen =
            resources::probe_listen_addr(config.listen).map_err(|source| ServerError::Listen {
                addr: config.listen,
                source,
            })?;
        crate::vsr::failpoint::check_env().map_err(ServerError::Startup)?;
        std::fs::create_dir_all(&config.data_dir).map_err(|source| ServerError::DataDir {
            path: config.data_dir.display().to_string(),
            source,
        })?;
        let data_dir_lock = resources::lock_data_dir(&config.data_dir)?;
        let partitions_dir = config.data_dir.join(PARTITIONS_DIR_NAME);
        // A data directory is formatted by writing its superblock (or migrated from the earlier
        // metadata.json format); partition data without either has lost its metadata.
        let superblock_path = crate::vsr::superblock_path(&config.data_dir);
        let legacy_path = store::metadata_path(&config.data_dir);
        // (A journal or snapshot without a superblock is refused by shard 0's boot, which names it.)
        if !superblock_path.exists()
            && !legacy_path.exists()
            && !crate::vsr::journal_dir(&config.data_dir).exists()
            && !crate::vsr::snapshot_path(&config.data_dir).exists()
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
        let budget = ResourceBudget::from_open_file_limit(
            resources::raise_open_file_limit(),
            topology.shard_count(),
        );
        tracing::info!(
            open_file_limit = budget.open_file_limit,
            partitions_max = budget.partitions_max,
            connections_per_shard_max = budget.connections_per_shard_max,
            "resource budget"
        );

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
        let config = Arc::new(config);
        let (report_tx, report_rx) = std_mpsc::channel::<StartupReport>();
        let report_tx = std::sync::Mutex::new(report_tx);
        let shard_set = ShardSet::launch(&launch, move |ctx: ShardContext<ShardFrame>| {
            let report = report_tx.lock().map(|tx| tx.clone()).ok();
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

/// One shard's whole life: bootstrap, open partitions, ready barrier, listen, pump, shutdown.
async fn run_shard(
    ctx: ShardContext<ShardFrame>,
    config: Arc<ServerConfig>,
    budget: ResourceBudget,
    listen_addr: SocketAddr,
    mut startup: StartupGuard,
) -> Result<(), String> {
    let (shard_id, shard_count) = (ctx.shard_id, ctx.shard_count);
    let (endpoint, mut pump, ready_barrier) = ctx.into_parts();
    let (metadata, replica) = if shard_id == ShardId(0) {
        let (replica, metadata) = crate::vsr::boot::open(&config).await?;
        for target in 1..shard_count {
            endpoint
                .try_send(
                    ShardId(target),
                    ShardFrame::Bootstrap(Box::new(metadata.clone())),
                )
                .map_err(|e| format!("bootstrap of shard {target}: {e}"))?;
        }
        (metadata, Some(replica))
    } else {
        // None: stopped before shard 0 sent the metadata (it failed, or a signal came). Not this
        // shard's failure: returning Ok lets the shard that failed name the cause.
        let Some(metadata) = wait_for_bootstrap(&mut pump).await? else {
            return Ok(());
        };
        (metadata, None)
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
    let metadata_task =
        (shard_id == ShardId(0)).then(|| compio::runtime::spawn(Rc::clone(&shard).metadata_task()));
    let connections: Rc<std::cell::RefCell<Vec<compio::runtime::JoinHandle<()>>>> = Rc::default();
    let accept_task = compio::runtime::spawn(accept_loop(
        Rc::clone(&shard),
        listener,
        Rc::clone(&connections),
    ));
    startup.report(Ok(()));

    loop {
        match pump.next().await {
            PumpEvent::Stop => break,
            PumpEvent::Tick => {
                if matches!(config.fsync, storage::FsyncPolicy::Interval(_)) {
                    let logs = shard.logs();
                    compio::runtime::spawn(async move {
                        for log in logs {
                            if let Err(e) = log.on_tick().await {
                                tracing::error!(error = %e, "interval fsync failed");
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

    tracing::info!(
        shard = shard_id.0,
        "stopping: closing listener and connections, fsyncing logs"
    );
    drop(accept_task);
    drop(metadata_task);
    connections.borrow_mut().clear();
    let mut close_failed = false;
    if shard_id == ShardId(0) {
        // The final checkpoint: the next boot starts from this snapshot and replays nothing. A
        // failure loses nothing (the journal holds every committed op) but is reported.
        if let Err(e) = shard.checkpoint().await {
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
    if close_failed {
        return Err(
            "a partition log failed its final fsync or the final checkpoint failed; see the log above"
                .into(),
        );
    }
    tracing::info!(shard = shard_id.0, "stopped");
    Ok(())
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

/// Accepts connections and spawns one task each; finished tasks are pruned on every accept.
async fn accept_loop(
    shard: Rc<Shard>,
    listener: TcpListener,
    connections: Rc<std::cell::RefCell<Vec<compio::runtime::JoinHandle<()>>>>,
) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(%peer, error = %e, "cannot set TCP_NODELAY");
                }
                if !shard.try_admit_connection() {
                    tracing::warn!(
                        shard = shard.id.0, %peer,
                        "refusing connection: the shard is at its connection limit (open-file budget)"
                    );
                    drop(stream);
                    continue;
                }
                tracing::debug!(shard = shard.id.0, %peer, "connection accepted");
                let task =
                    compio::runtime::spawn(serve_connection(Rc::clone(&shard), stream, peer));
                let mut connections = connections.borrow_mut();
                connections.retain(|task| !task.is_finished());
                connections.push(task);
            }
            Err(e) => {
                // EMFILE/ENFILE and friends: log, back off, keep serving existing connections.
                tracing::warn!(shard = shard.id.0, error = %e, "accept failed; retrying in 10 ms");
                compio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
}
