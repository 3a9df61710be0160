//! Spawns one thread per shard (`shard-{id}`), pins it, builds its compio runtime on the chosen
//! driver and runs the shard future; ready barrier, stop signal, panic propagation, join.
//!
//! Never blocks a shard thread once its future runs: the ready barrier and the stop signal are
//! crossfire wakeup lanes awaited inside the runtime. Only the launching thread blocks (in
//! `launch`, `wait_ready`, `join`).

use std::any::Any;
use std::fmt;
use std::future::Future;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use compio::driver::{DriverType, ProactorBuilder};
use compio::runtime::{Runtime, RuntimeBuilder};

use crate::limits::SHARD_RING_ENTRIES;
pub use crate::mesh::StopHandle;
use crate::mesh::{MeshEndpoint, Pump, ShardId, WakeRx, WakeTx, mesh, wake_lane};
use crate::probe::{IoDriver, IoUringUnavailable, memlock_needed_bytes, memlock_unavailable};
use crate::topology::Topology;

/// What `ShardSet::launch` starts: where each shard runs, on which driver, with which inbox size.
#[derive(Debug, Clone)]
pub struct LaunchConfig {
    /// One shard per `shard_cores` entry, pinned where `Some`.
    pub topology: Topology,
    /// Forced on every shard's runtime (no silent fallback; run `probe_io_uring` first).
    pub io_driver: IoDriver,
    /// Frames per inbox and per reply lane, `1..=INBOX_CAPACITY_MAX`.
    pub inbox_capacity: usize,
    /// How long an idle shard keeps polling (ready tasks, io_uring completions, its lanes through
    /// the waker) before it parks in the kernel; zero parks at once. See `block_on_with_idle_poll`.
    pub idle_poll: Duration,
    /// How long `join` waits for the shards once stop fired (`SHUTDOWN_DEADLINE` in servers).
    pub shutdown_deadline: Duration,
}

/// Handed to the shard future inside its thread.
pub struct ShardContext<F: Send + 'static> {
    /// This shard.
    pub shard_id: ShardId,
    /// Shards in the set (ids `0..shard_count`).
    pub shard_count: u16,
    /// The pinned CPU, if pinned.
    pub core: Option<usize>,
    /// Senders to every shard, the mesh stats and the stop signal.
    pub endpoint: MeshEndpoint<F>,
    /// This shard's only event source: stop, tick, inbox, reply lane.
    pub pump: Pump<F>,
    barrier: Arc<ReadyBarrier>,
    /// Filled by the last shard to arrive, or by the stop signal.
    release_lane: WakeRx,
    /// Shared with the thread, which breaks the barrier if the shard exits without arriving.
    arrived: Arc<AtomicBool>,
    events: Sender<ShardEvent>,
}

impl<F: Send + 'static> fmt::Debug for ShardContext<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardContext")
            .field("shard_id", &self.shard_id)
            .field("shard_count", &self.shard_count)
            .field("core", &self.core)
            .finish_non_exhaustive()
    }
}

/// The ready-barrier half of a `ShardContext`, split off by `ShardContext::into_parts` so the
/// endpoint can move into shard state while the shard loop keeps the pump.
pub struct ReadyGate {
    shard_id: ShardId,
    barrier: Arc<ReadyBarrier>,
    release_lane: WakeRx,
    arrived: Arc<AtomicBool>,
    events: Sender<ShardEvent>,
}

impl fmt::Debug for ReadyGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReadyGate")
            .field("shard_id", &self.shard_id)
            .finish_non_exhaustive()
    }
}

impl ReadyGate {
    /// Same contract as `ShardContext::ready_barrier`: reports ready, then waits asynchronously
    /// until every shard did, or the stop signal fired.
    ///
    /// # Cancel safety
    /// Not cancel safe: await it to completion.
    pub async fn wait(self) {
        arrive_and_wait(
            self.shard_id,
            &self.arrived,
            &self.events,
            &self.barrier,
            &self.release_lane,
        )
        .await;
    }
}

async fn arrive_and_wait(
    shard_id: ShardId,
    arrived: &AtomicBool,
    events: &Sender<ShardEvent>,
    barrier: &ReadyBarrier,
    release_lane: &WakeRx,
) {
    assert!(
        !arrived.swap(true, Ordering::SeqCst),
        "ready_barrier called twice on shard {}",
        shard_id.0
    );
    let _ = events.send(ShardEvent::Ready { shard: shard_id.0 });
    barrier.arrive();
    // Err means every sender is gone, which cannot happen while `barrier` holds them.
    let _ = release_lane.recv().await;
}

impl<F: Send + 'static> ShardContext<F> {
    /// Splits the context into the endpoint, the pump and the ready gate.
    pub fn into_parts(self) -> (MeshEndpoint<F>, Pump<F>, ReadyGate) {
        let gate = ReadyGate {
            shard_id: self.shard_id,
            barrier: self.barrier,
            release_lane: self.release_lane,
            arrived: self.arrived,
            events: self.events,
        };
        (self.endpoint, self.pump, gate)
    }

    /// Reports this shard ready and waits (asynchronously, without blocking the reactor) until every
    /// shard has reported ready. Listeners open only after this returns.
    ///
    /// Also returns early when the stop signal fires (a shard failed, exited before arriving, or
    /// a signal came): then `pump.next()` yields `Stop` at once, and the shard must not open
    /// listeners. Check `self.endpoint.stop_handle().is_stopped()` to tell the two apart.
    ///
    /// # Cancel safety
    /// Not cancel safe: call once and await it to completion.
    ///
    /// # Panics
    /// If called twice on the same shard.
    pub async fn ready_barrier(&self) {
        arrive_and_wait(
            self.shard_id,
            &self.arrived,
            &self.events,
            &self.barrier,
            &self.release_lane,
        )
        .await;
    }
}

/// Counts arrivals; the last one fills every shard's release lane.
struct ReadyBarrier {
    shard_count: usize,
    arrived_count: AtomicUsize,
    /// Set when a shard exited without arriving: the barrier can never complete.
    broken: AtomicBool,
    release_lanes: Vec<WakeTx>,
    stop: StopHandle,
}

impl ReadyBarrier {
    fn arrive(&self) {
        let arrived_count = self.arrived_count.fetch_add(1, Ordering::SeqCst) + 1;
        assert!(arrived_count <= self.shard_count);
        if self.broken.load(Ordering::SeqCst) {
            tracing::error!("a shard exited before it reported ready: stopping the shards");
            self.stop.stop();
        } else if arrived_count == self.shard_count {
            for lane in &self.release_lanes {
                let _ = lane.try_send(());
            }
        }
    }

    /// Called by a shard thread whose future ended before it arrived. Both sides use `SeqCst`, so
    /// either this sees an earlier arrival or that arrival sees `broken`: a waiter is never left.
    fn exit_without_arriving(&self) {
        self.broken.store(true, Ordering::SeqCst);
        if self.arrived_count.load(Ordering::SeqCst) > 0 {
            tracing::error!("a shard exited before it reported ready: stopping the shards");
            self.stop.stop();
        }
    }
}

/// What a shard thread reports to the launching thread.
enum ShardEvent {
    Started { shard: u16 },
    StartFailed { shard: u16, error: LaunchError },
    Ready { shard: u16 },
    Exited { shard: u16, exit: ShardExit },
}

#[derive(Debug, Clone)]
enum ShardExit {
    Ok,
    Failed(String),
    Panicked(String),
}

impl ShardExit {
    fn to_error(&self, shard: u16) -> Option<LaunchError> {
        match self {
            ShardExit::Ok => None,
            ShardExit::Failed(message) => Some(LaunchError::Shard {
                shard,
                message: message.clone(),
            }),
            ShardExit::Panicked(message) => Some(LaunchError::Panicked {
                shard,
                message: message.clone(),
            }),
        }
    }
}

/// The running shard threads. Dropping it without `join` fires the stop signal and detaches the
/// threads.
pub struct ShardSet {
    threads: Vec<(u16, JoinHandle<()>)>,
    stop: StopHandle,
    tracker: Mutex<Tracker>,
    signal_handles: Mutex<Vec<signal_hook::iterator::Handle>>,
    joined: bool,
    shutdown_deadline: Duration,
}

impl fmt::Debug for ShardSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ShardSet")
            .field("shard_count", &self.threads.len())
            .field("stop", &self.stop)
            .finish_non_exhaustive()
    }
}

/// The launching thread's view of the shards, fed by their events.
struct Tracker {
    events: Receiver<ShardEvent>,
    ready: Vec<bool>,
    exits: Vec<Option<ShardExit>>,
    /// The first shard that failed or panicked, in the order the launcher learnt of it.
    first_failure: Option<(u16, ShardExit)>,
}

impl Tracker {
    fn record(&mut self, event: ShardEvent, stop: &StopHandle) {
        match event {
            ShardEvent::Ready { shard } => self.ready[usize::from(shard)] = true,
            ShardEvent::Exited { shard, exit } => {
                if !matches!(exit, ShardExit::Ok) {
                    tracing::error!(shard, ?exit, "shard failed: stopping the other shards");
                    stop.stop();
                    if self.first_failure.is_none() {
                        self.first_failure = Some((shard, exit.clone()));
                    }
                }
                self.exits[usize::from(shard)] = Some(exit);
            }
            ShardEvent::Started { shard } | ShardEvent::StartFailed { shard, .. } => {
                panic!("shard {shard} reported its start after launch returned");
            }
        }
    }

    fn first_error(&self) -> Option<LaunchError> {
        self.first_failure
            .as_ref()
            .and_then(|(shard, exit)| exit.to_error(*shard))
    }
}

/// The shard future's error, shown in the process exit message.
pub type ShardResult = Result<(), String>;

/// Boxed, !Send shard future built inside the shard thread.
pub type ShardFuture = Pin<Box<dyn Future<Output = ShardResult>>>;

impl ShardSet {
    /// Spawns the shard threads; `make_shard` is called inside each thread (after pinning and
    /// runtime creation) and its future is run to completion with `block_on`.
    ///
    /// Returns once every thread pinned itself and built its runtime; no `make_shard` runs
    /// unless all of them did.
    ///
    /// # Errors
    /// `Spawn` (thread creation), `Pin` (the CPU refused), `Runtime` (the driver could not be
    /// built) or `Panicked`, each naming the shard; the other threads are ended first.
    ///
    /// # Panics
    /// If the topology has no shard or `inbox_capacity` is outside `1..=INBOX_CAPACITY_MAX`.
    pub fn launch<F, M>(config: &LaunchConfig, make_shard: M) -> Result<ShardSet, LaunchError>
    where
        F: Send + 'static,
        M: Fn(ShardContext<F>) -> ShardFuture + Send + Sync + 'static,
    {
        let shard_count = config.topology.shard_count();
        assert!(shard_count >= 1, "a topology has at least one shard");
        let shards = mesh::<F>(shard_count, config.inbox_capacity);
        let stop = shards[0].0.stop_handle();
        let (events_tx, events_rx) = std::sync::mpsc::channel();
        let mut release_txs = Vec::with_capacity(usize::from(shard_count));
        let mut release_rxs = Vec::with_capacity(usize::from(shard_count));
        for _ in 0..shard_count {
            let (tx, rx) = wake_lane();
            stop.register(tx.clone());
            release_txs.push(tx);
            release_rxs.push(rx);
        }
        let barrier = Arc::new(ReadyBarrier {
            shard_count: usize::from(shard_count),
            arrived_count: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
            release_lanes: release_txs,
            stop: stop.clone(),
        });
        let make_shard = Arc::new(make_shard);
        let mut threads = Vec::with_capacity(usize::from(shard_count));
        let mut go_lanes: Vec<SyncSender<bool>> = Vec::with_capacity(usize::from(shard_count));
        for (index, ((endpoint, pump), release_lane)) in
            shards.into_iter().zip(release_rxs).enumerate()
        {
            let shard = index as u16;
            let (go_tx, go_rx) = std::sync::mpsc::sync_channel(1);
            let thread = ShardThread {
                shard,
                shard_count,
                core: config.topology.shard_cores[index],
                io_driver: config.io_driver,
                idle_poll: config.idle_poll,
                endpoint,
                pump,
                release_lane,
                barrier: Arc::clone(&barrier),
                events: events_tx.clone(),
                go: go_rx,
                make_shard: Arc::clone(&make_shard),
            };
            match std::thread::Builder::new()
                .name(format!("shard-{shard}"))
                .spawn(move || thread.run())
            {
                Ok(handle) => {
                    threads.push((shard, handle));
                    go_lanes.push(go_tx);
                }
                Err(source) => {
                    // Dropping the go lanes ends the threads already spawned before they run.
                    drop(go_lanes);
                    join_quietly(threads);
                    return Err(LaunchError::Spawn { shard, source });
                }
            }
        }
        drop(events_tx);
        let mut reported = vec![false; threads.len()];
        let mut first_error = None;
        while reported.iter().any(|&done| !done) {
            match events_rx.recv() {
                Ok(ShardEvent::Started { shard }) => reported[usize::from(shard)] = true,
                Ok(ShardEvent::StartFailed { shard, error }) => {
                    reported[usize::from(shard)] = true;
                    first_error.get_or_insert(error);
                }
                Ok(ShardEvent::Ready { shard } | ShardEvent::Exited { shard, .. }) => {
                    panic!("shard {shard} ran before every shard started");
                }
                // Every thread reports before it can end; this is a thread that died silently.
                Err(_) => break,
            }
        }
        if first_error.is_none()
            && let Some(silent) = reported.iter().position(|&done| !done)
        {
            first_error = Some(LaunchError::Shard {
                shard: silent as u16,
                message: "shard thread ended without reporting its start".to_owned(),
            });
        }
        if let Some(error) = first_error {
            drop(go_lanes);
            join_quietly(threads);
            return Err(error);
        }
        for go in &go_lanes {
            // Err: the thread is gone, which its exit event (or join) reports.
            let _ = go.send(true);
        }
        Ok(ShardSet {
            threads,
            shutdown_deadline: config.shutdown_deadline,
            stop,
            tracker: Mutex::new(Tracker {
                events: events_rx,
                ready: vec![false; usize::from(shard_count)],
                exits: vec![None; usize::from(shard_count)],
                first_failure: None,
            }),
            signal_handles: Mutex::new(Vec::new()),
            joined: false,
        })
    }

    /// Blocks the calling (non-shard) thread until every shard passed the ready barrier, or one
    /// failed first.
    ///
    /// # Errors
    /// The first shard that failed (`Shard`) or panicked (`Panicked`), or `Shard` for a shard that
    /// exited before it reported ready; the other shards are stopped first.
    pub fn wait_ready(&self) -> Result<(), LaunchError> {
        let mut tracker = self.tracker.lock().unwrap_or_else(PoisonError::into_inner);
        loop {
            if let Some(error) = tracker.first_error() {
                return Err(error);
            }
            let exited_unready = (0..tracker.ready.len())
                .find(|&index| !tracker.ready[index] && tracker.exits[index].is_some());
            if let Some(index) = exited_unready {
                self.stop.stop();
                return Err(LaunchError::Shard {
                    shard: index as u16,
                    message: "exited before it reported ready".to_owned(),
                });
            }
            if tracker.ready.iter().all(|&ready| ready) {
                return Ok(());
            }
            let Ok(event) = tracker.events.recv() else {
                let index = tracker.ready.iter().position(|&ready| !ready).unwrap_or(0);
                return Err(LaunchError::Shard {
                    shard: index as u16,
                    message: "shard thread ended without reporting ready".to_owned(),
                });
            };
            tracker.record(event, &self.stop);
        }
    }

    /// The stop signal of every shard in the set (the same one `MeshEndpoint::stop_handle` gives).
    pub fn stop_handle(&self) -> StopHandle {
        self.stop.clone()
    }

    /// Stops the shards on SIGINT, SIGTERM or SIGHUP (a watcher thread, ended by `join`): the same
    /// drain, final fsync and checkpoint for each, so a closed terminal or `kill -HUP` never ends
    /// the server uncleanly (there is no configuration to reload). A second signal while stopping
    /// exits the process at once with code 130.
    ///
    /// The watcher acts first and logs after, and a log statement that panics (a subscriber whose
    /// write to a closed stderr pipe fails, e.g. `serve 2>&1 | head`) cannot end it: signals are
    /// never left handled by a thread that is gone.
    ///
    /// # Errors
    /// Registering the signal handlers or spawning the watcher thread failed.
    pub fn stop_on_signals(&self) -> std::io::Result<()> {
        let mut signals = signal_hook::iterator::Signals::new([
            signal_hook::consts::SIGINT,
            signal_hook::consts::SIGTERM,
            signal_hook::consts::SIGHUP,
        ])?;
        let handle = signals.handle();
        let stop = self.stop.clone();
        let watcher = std::thread::Builder::new()
            .name("sl-signals".to_owned())
            .spawn(move || {
                let mut stopping = false;
                for signal in signals.forever() {
                    if stopping {
                        log_without_unwinding(|| {
                            tracing::error!(signal, "second signal while stopping: exiting now");
                        });
                        std::process::exit(130);
                    }
                    stopping = true;
                    stop.stop();
                    log_without_unwinding(|| {
                        tracing::info!(
                            signal,
                            name = signal_name(signal),
                            "signal received: draining connections and stopping the shards"
                        );
                    });
                }
            });
        if let Err(error) = watcher {
            handle.close();
            return Err(error);
        }
        self.signal_handles
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(handle);
        Ok(())
    }

    /// Joins every shard thread. A shard that returned an error or panicked makes this an error
    /// carrying the shard id and message; the other shards are stopped first. A shard that ends
    /// with `Ok` while others run is fine and stops nothing.
    ///
    /// # Errors
    /// The first failure the launcher learnt of: `Shard` (the future's `Err`) or `Panicked`
    /// (the panic payload when it is a string).
    pub fn join(mut self) -> Result<(), LaunchError> {
        self.joined = true;
        let tracker = self
            .tracker
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        // DESIGN section 3: threads are joined with a deadline. Once stop fired, shards that do
        // not exit within SHUTDOWN_DEADLINE are reported and left to die with the process.
        let mut stop_deadline: Option<std::time::Instant> = None;
        let mut stuck: Vec<u16> = Vec::new();
        while tracker.exits.iter().any(Option::is_none) {
            if self.stop.is_stopped() {
                let deadline = *stop_deadline
                    .get_or_insert_with(|| std::time::Instant::now() + self.shutdown_deadline);
                if std::time::Instant::now() >= deadline {
                    stuck = (0..tracker.exits.len())
                        .filter(|index| tracker.exits[*index].is_none())
                        .map(|index| index as u16)
                        .collect();
                    break;
                }
            }
            match tracker.events.recv_timeout(JOIN_POLL_INTERVAL) {
                Ok(event) => tracker.record(event, &self.stop),
                Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
                Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
            }
        }
        if !stuck.is_empty() {
            return Err(LaunchError::ShutdownDeadline {
                shards: stuck,
                deadline_s: self.shutdown_deadline.as_secs(),
            });
        }
        let mut error = tracker.first_error();
        for (shard, handle) in std::mem::take(&mut self.threads) {
            // Every panic of the shard future is caught in the thread; this is one that escaped
            // (e.g. from dropping the runtime).
            if let Err(payload) = handle.join()
                && error.is_none()
            {
                self.stop.stop();
                error = Some(LaunchError::Panicked {
                    shard,
                    message: panic_message(&*payload),
                });
            }
        }
        for handle in self
            .signal_handles
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner)
            .drain(..)
        {
            handle.close();
        }
        error.map_or(Ok(()), Err)
    }
}

impl Drop for ShardSet {
    fn drop(&mut self) {
        if !self.joined {
            self.stop.stop();
        }
    }
}

/// Everything one shard thread owns.
struct ShardThread<F: Send + 'static, M> {
    shard: u16,
    shard_count: u16,
    core: Option<usize>,
    io_driver: IoDriver,
    idle_poll: Duration,
    endpoint: MeshEndpoint<F>,
    pump: Pump<F>,
    release_lane: WakeRx,
    barrier: Arc<ReadyBarrier>,
    events: Sender<ShardEvent>,
    go: Receiver<bool>,
    make_shard: Arc<M>,
}

impl<F, M> ShardThread<F, M>
where
    F: Send + 'static,
    M: Fn(ShardContext<F>) -> ShardFuture + Send + Sync + 'static,
{
    fn run(self) {
        let ShardThread {
            shard,
            shard_count,
            core,
            io_driver,
            ..
        } = self;
        let started = catch_unwind(|| start_runtime(shard, shard_count, core, io_driver));
        let runtime = match started {
            Ok(Ok(runtime)) => runtime,
            Ok(Err(error)) => {
                let _ = self.events.send(ShardEvent::StartFailed { shard, error });
                return;
            }
            Err(payload) => {
                let message = panic_message(&*payload);
                let error = LaunchError::Panicked { shard, message };
                let _ = self.events.send(ShardEvent::StartFailed { shard, error });
                return;
            }
        };
        let _ = self.events.send(ShardEvent::Started { shard });
        // Err: the launcher gave up (another shard failed to start) and dropped the lane.
        if self.go.recv() != Ok(true) {
            return;
        }
        let arrived = Arc::new(AtomicBool::new(false));
        let context = ShardContext {
            shard_id: ShardId(shard),
            shard_count: self.shard_count,
            core,
            endpoint: self.endpoint,
            pump: self.pump,
            barrier: Arc::clone(&self.barrier),
            release_lane: self.release_lane,
            arrived: Arc::clone(&arrived),
            events: self.events.clone(),
        };
        let make_shard = self.make_shard;
        let idle_poll = self.idle_poll;
        let outcome = catch_unwind(AssertUnwindSafe(|| {
            let result = block_on_with_idle_poll(
                &runtime,
                async move { make_shard(context).await },
                idle_poll,
            );
            // Dropped here so that the shard's files and sockets are closed before `join` returns.
            drop(runtime);
            result
        }));
        let exit = match outcome {
            Ok(Ok(())) => ShardExit::Ok,
            Ok(Err(message)) => ShardExit::Failed(message),
            Err(payload) => ShardExit::Panicked(panic_message(&*payload)),
        };
        if !arrived.load(Ordering::SeqCst) {
            self.barrier.exit_without_arriving();
        }
        let _ = self.events.send(ShardEvent::Exited { shard, exit });
    }
}

/// How long `join` waits for shards to finish once stop fired (DESIGN section 3: "threads are
/// joined with a deadline"). Generous: a shard flushes and fsyncs every partition log first.
pub const SHUTDOWN_DEADLINE: Duration = Duration::from_secs(30);
/// How often `join` checks the stop signal while waiting for shard exits.
const JOIN_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// Idle spins between two non-blocking kernel entries that reap io_uring completions.
const IDLE_POLL_KERNEL_EVERY: u32 = 32;

/// Runs `future` to completion on `runtime`, like `Runtime::block_on`, except that when nothing is
/// ready the thread keeps polling (non-blocking: run ready tasks, reap io_uring completions, poll
/// `future`, whose pump sees mesh frames as soon as they land) for up to `idle_poll` before it
/// parks in the kernel. This is the idle poll of Seastar-style reactors: a cross-shard frame that
/// arrives within the window is seen without a wakeup (a futex/eventfd wake plus a scheduler hop,
/// tens of microseconds on virtual machines), at the price of CPU burnt while idle. Zero
/// (the default) parks at once, which is what the bench's per-CPU-second figure rewards.
///
/// # Panics
/// Propagates a panic of `future` or of a task, as `block_on` does.
pub fn block_on_with_idle_poll<F: Future>(
    runtime: &Runtime,
    future: F,
    idle_poll: Duration,
) -> F::Output {
    if idle_poll.is_zero() {
        return runtime.block_on(future);
    }
    runtime.enter(|| {
        let waker = runtime.waker();
        let mut context = std::task::Context::from_waker(&waker);
        let mut future = std::pin::pin!(future);
        let mut idle_since: Option<std::time::Instant> = None;
        let mut spin_count: u32 = 0;
        loop {
            if let std::task::Poll::Ready(output) = future.as_mut().poll(&mut context) {
                runtime.run();
                return output;
            }
            if runtime.run() {
                idle_since = None;
                runtime.poll_with(Some(Duration::ZERO));
                continue;
            }
            let now = std::time::Instant::now();
            if now.duration_since(*idle_since.get_or_insert(now)) < idle_poll {
                // Entering the kernel costs microseconds; mesh frames need none (the pump polls
                // the lanes in user space), so reap completions only every few spins.
                spin_count = spin_count.wrapping_add(1);
                if spin_count.is_multiple_of(IDLE_POLL_KERNEL_EVERY) {
                    runtime.poll_with(Some(Duration::ZERO));
                } else {
                    std::hint::spin_loop();
                }
            } else {
                idle_since = None;
                runtime.poll();
            }
        }
    })
}

/// Pins the calling thread (when `core` is set) and builds its compio runtime with the driver
/// forced to `io_driver` (no silent fallback).
fn start_runtime(
    shard: u16,
    shard_count: u16,
    core: Option<usize>,
    io_driver: IoDriver,
) -> Result<Runtime, LaunchError> {
    if let Some(cpu) = core {
        // `core_affinity` indexes a fixed `cpu_set_t`; a larger id would panic inside it.
        let representable = cpu < libc::CPU_SETSIZE as usize;
        if !representable || !core_affinity::set_for_current(core_affinity::CoreId { id: cpu }) {
            return Err(LaunchError::Pin { shard, cpu });
        }
    }
    let mut proactor = ProactorBuilder::new();
    match io_driver {
        // COOP_TASKRUN (checked by the probe): completions are reaped when the shard enters the
        // kernel anyway, so the interrupt-driven task work it saves is pure overhead.
        IoDriver::IoUring => proactor
            .driver_type(DriverType::IoUring)
            .coop_taskrun(true)
            .capacity(SHARD_RING_ENTRIES),
        IoDriver::Poll => proactor.driver_type(DriverType::Poll),
    };
    let runtime = RuntimeBuilder::new()
        .with_proactor(proactor)
        .build()
        .map_err(|source| runtime_error(shard, shard_count, io_driver, source))?;
    tracing::info!(shard, driver = ?runtime.driver_type(), core = ?core, "shard runtime started");
    Ok(runtime)
}

/// Why a shard's runtime could not be built. ENOMEM from `io_uring_setup` is the locked-memory
/// limit (the probe checked it, but the limit counts every process of the user, e.g. a server
/// killed a moment ago whose rings the kernel is still tearing down): named like the probe names it.
fn runtime_error(
    shard: u16,
    shard_count: u16,
    io_driver: IoDriver,
    source: std::io::Error,
) -> LaunchError {
    // SAFETY: sysconf has no memory-safety preconditions.
    let page_size = u64::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    runtime_error_under_limit(
        shard,
        shard_count,
        io_driver,
        source,
        crate::probe::raise_memlock_limit(),
        page_size,
    )
}

/// `runtime_error` with the locked-memory limit (`None`: unlimited) and page size given.
fn runtime_error_under_limit(
    shard: u16,
    shard_count: u16,
    io_driver: IoDriver,
    source: std::io::Error,
    memlock_limit_bytes: Option<u64>,
    page_size: u64,
) -> LaunchError {
    if io_driver == IoDriver::IoUring
        && source.raw_os_error() == Some(libc::ENOMEM)
        && let Some(limit_bytes) = memlock_limit_bytes
    {
        return LaunchError::IoUring {
            shard,
            source: memlock_unavailable(
                limit_bytes,
                memlock_needed_bytes(shard_count, page_size),
                shard_count,
            ),
        };
    }
    LaunchError::Runtime {
        shard,
        driver: io_driver,
        source,
    }
}

/// Runs one log statement on a thread that must outlive it (the signal watcher). The subscriber
/// is the application's: it may panic when its write fails (tracing-subscriber's fmt layer reports
/// a failed write with `eprintln!`, which panics when stderr is a closed pipe), and that panic must
/// not end the thread that still owns the process's signal handlers.
fn log_without_unwinding(log: impl FnOnce()) {
    // Err: the subscriber panicked; the panic hook already reported it wherever it still could.
    let _ = catch_unwind(AssertUnwindSafe(log));
}

/// The name of a signal the watcher handles, for the log line.
fn signal_name(signal: i32) -> &'static str {
    match signal {
        signal_hook::consts::SIGINT => "SIGINT",
        signal_hook::consts::SIGTERM => "SIGTERM",
        signal_hook::consts::SIGHUP => "SIGHUP",
        _ => "other",
    }
}

/// Joins threads that are about to end (their go lane was dropped), ignoring their results.
fn join_quietly(threads: Vec<(u16, JoinHandle<()>)>) {
    for (_, handle) in threads {
        let _ = handle.join();
    }
}

/// The text of a panic payload (`&str` or `String`, what `panic!` produces).
fn panic_message(payload: &(dyn Any + Send)) -> String {
    if let Some(text) = payload.downcast_ref::<&str>() {
        (*text).to_owned()
    } else if let Some(text) = payload.downcast_ref::<String>() {
        text.clone()
    } else {
        "panic payload is not a string".to_owned()
    }
}

/// Why the shard set failed to start or ended badly; the process exits with this message.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// The shard future returned `Err(message)`, or exited before it reported ready.
    #[error("shard {shard}: {message}")]
    Shard { shard: u16, message: String },
    /// The shard thread panicked; `message` is the payload when it is a string.
    #[error("shard {shard} panicked: {message}")]
    Panicked { shard: u16, message: String },
    /// The OS refused to create the shard thread.
    #[error("failed to start shard {shard}: {source}")]
    Spawn { shard: u16, source: std::io::Error },
    /// `sched_setaffinity` refused the CPU (offline, or outside the cpuset): fix `--cpus`.
    #[error("failed to start shard {shard}: cannot pin its thread to CPU {cpu}")]
    Pin { shard: u16, cpu: usize },
    /// The compio runtime could not be built on the forced driver (`--io-driver poll` helps
    /// where `io_uring` is blocked).
    #[error(
        "failed to start shard {shard}: cannot build its compio runtime on the {driver} driver: {source}"
    )]
    Runtime {
        shard: u16,
        driver: IoDriver,
        source: std::io::Error,
    },
    /// `io_uring_setup` refused the shard's ring for want of locked memory (`RLIMIT_MEMLOCK`).
    #[error("failed to start shard {shard}: {source}")]
    IoUring {
        shard: u16,
        source: IoUringUnavailable,
    },
    /// Stop fired but these shards did not finish (flush and fsync) within the deadline.
    #[error(
        "shards {shards:?} did not stop within {deadline_s} s of the stop signal; exiting without them (their last writes may not be fsynced)"
    )]
    ShutdownDeadline { shards: Vec<u16>, deadline_s: u64 },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue7_2_a_ring_refused_for_memory_names_the_memlock_limit() {
        let enomem = || std::io::Error::from_raw_os_error(libc::ENOMEM);
        let error =
            runtime_error_under_limit(1, 2, IoDriver::IoUring, enomem(), Some(200 * 1024), 4096);
        assert_eq!(
            error.to_string(),
            "failed to start shard 1: io_uring is unavailable: RLIMIT_MEMLOCK is 200 KiB but 2 \
             shards need 232 KiB of locked memory for io_uring rings (ENOMEM; the limit counts \
             every process of the same user); raise it to at least 232 KiB with `ulimit -l 232` \
             in the shell that starts shardline, or `LimitMEMLOCK=232K` in its systemd unit; \
             start with --io-driver poll to use the polling driver"
        );
        // Unlimited (real memory shortage), another errno, or the poll driver: the plain error.
        for (driver, source, limit) in [
            (IoDriver::IoUring, enomem(), None),
            (
                IoDriver::IoUring,
                std::io::Error::from_raw_os_error(libc::EPERM),
                Some(0),
            ),
            (IoDriver::Poll, enomem(), Some(0)),
        ] {
            assert!(matches!(
                runtime_error_under_limit(0, 1, driver, source, limit, 4096),
                LaunchError::Runtime { .. }
            ));
        }
    }

    #[test]
    fn panic_payloads_become_messages() {
        let payload = catch_unwind(|| panic!("plain")).unwrap_err();
        assert_eq!(panic_message(&*payload), "plain");
        let value = 3;
        let payload = catch_unwind(|| panic!("formatted {value}")).unwrap_err();
        assert_eq!(panic_message(&*payload), "formatted 3");
        let payload = catch_unwind(|| std::panic::panic_any(7_u8)).unwrap_err();
        assert_eq!(panic_message(&*payload), "panic payload is not a string");
    }
}
