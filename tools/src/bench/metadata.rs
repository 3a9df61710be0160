//! `shardline bench --workload metadata`: metadata commit latency against a disk baseline.
//!
//! One run per `--shards` entry, each on a fresh embedded server (or on `--addr`). One client
//! connection, one request in flight: round `i` creates stream `first + i`, creates topic 1 in it
//! with one partition, and deletes the stream, timing each round trip. Right before each round,
//! one 4 KiB write at offset 0 + fdatasync of a scratch file on the server's filesystem is timed
//! (interleaved, so that both see the same disk over the same minutes). The report gives p50, p99
//! and max of each and the p99 ratio against issue 3's target.
//!
//! With `--clients N` (N >= 2), after the rounds N connections register sessions concurrently
//! (issue 8, "Targets": throughput with 64 concurrent clients registering). The connections are
//! dealt over one OS thread per available CPU (at most N), each thread one compio runtime with one
//! task per connection, as the produce workload's workers each own a runtime. Every task sends a
//! raw Register with a fresh client id, one in flight, so that each reply is one committed
//! metadata op (a repeated id is answered from the client table without a commit); all start
//! together once every connection is open. The report gives committed ops per second and the
//! p50/p99/max of those commits.
//!
//! Before anything is timed one Register checks that the server is the cluster's primary: a
//! backup's `NotPrimary` (issue 8 section 2) becomes an error naming `--addr` and the primary's
//! address from the reply.
//!
//! Must never touch a stream it did not create (ids start above the highest existing one), never
//! leave a stream it created behind when it can delete it, and never fail because a target was
//! missed: that is a figure in the report.

use std::net::SocketAddr;
use std::num::NonZero;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bus::limits::MESSAGE_SIZE_MAX_DEFAULT;
use bus::{
    Client, ClientError, Command, ErrorCode, Frame, Header, Metadata, Operation, encode_frame,
    read_frame, write_frame,
};
use compio::BufResult;
use compio::net::TcpStream;
use hdrhistogram::Histogram;

use super::disk_baseline::{DiskBaseline, same_filesystem};
use super::json_file::JsonReportFile;
use super::limits::{BUSY_BACKOFF_INITIAL, BUSY_BACKOFF_MAX, BUSY_RETRY_COUNT_MAX};
use super::metadata_report::{
    BaselineLocation, ClientsMeasurement, MetadataBenchReport, MetadataMeasurement,
    MetadataRunConfig, MetadataRunReport, TOPIC_PARTITION_COUNT, render_metadata_run,
};
use super::phase::progress_bar;
use super::plan::{BenchPlan, MetadataClients, ShardRequest};
use super::report::new_latency_histogram;
use super::workload::{StartLine, dealt_indices, record_latency};
use super::{RunServer, check_external_shard_count, server_label, start_server};

/// Most `--clients`: each is one connection and one task of the bench, and past a thousand the
/// bench measures its own scheduling rather than the server (as `PRODUCER_COUNT_MAX`).
pub const METADATA_CLIENT_COUNT_MAX: u32 = 1024;

/// The topic each round creates in its stream.
const TOPIC_ID: u16 = 1;

/// Runs the metadata workload as `plan` says, prints a table per run and writes `--json`.
///
/// # Errors
/// A server that fails to start or stop, a scratch file that cannot be created or synced, a
/// metadata request that fails (naming the round, the op and the stream), or stream ids exhausted
/// on `--addr`. A missed target is not an error.
pub fn run(plan: &BenchPlan, json_file: Option<JsonReportFile>) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for request in &plan.shard_requests {
        let run = run_one(plan, *request)?;
        crate::output::print_text(&render_metadata_run(&run))?;
        runs.push(run);
    }
    match json_file {
        Some(json_file) => json_file.write(&MetadataBenchReport::new(runs)),
        None => Ok(()),
    }
}

/// Where the baseline's scratch file goes, and the data directory it is compared with.
fn baseline_place(
    plan: &BenchPlan,
    server: &RunServer,
) -> anyhow::Result<(PathBuf, BaselineLocation, Option<PathBuf>)> {
    if let Some(embedded) = &server.embedded {
        let run_dir = embedded
            .run_dir()
            .context("the embedded server has no run directory")?;
        return Ok((
            run_dir.to_path_buf(),
            BaselineLocation::ServerRunDir,
            embedded.data_dir(),
        ));
    }
    Ok(match &plan.baseline_root {
        Some(root) => (root.clone(), BaselineLocation::DataRoot, None),
        None => (std::env::temp_dir(), BaselineLocation::SystemTempDir, None),
    })
}

fn run_one(plan: &BenchPlan, request: ShardRequest) -> anyhow::Result<MetadataRunReport> {
    let mut server = start_server(plan, request)?;
    // The embedded server is a single replica; a server at `--addr` does not say.
    let replica_count = server.embedded.as_ref().map(|_| 1);
    let measured = check_external_shard_count(plan, request, server.addr).and_then(|()| {
        let (dir, location, data_dir) = baseline_place(plan, &server)?;
        let same_filesystem_as_server = data_dir
            .map(|data_dir| same_filesystem(&dir, &data_dir))
            .transpose()?;
        let mut baseline = DiskBaseline::create(&dir)?;
        let measured = measure(plan, server.addr, &mut baseline, location)?;
        Ok((measured, same_filesystem_as_server))
    });
    let (shard_count, mut measured, same_filesystem_as_server) =
        match (measured, server.embedded.take()) {
            (Ok(((shard_count, measured), same)), Some(embedded)) => {
                embedded.stop()?;
                (shard_count, measured, same)
            }
            (Ok(((shard_count, measured), same)), None) => (shard_count, measured, same),
            // The server's log usually says why requests failed: keep it.
            (Err(error), Some(embedded)) => return Err(error.context(embedded.abandon())),
            (Err(error), None) => return Err(error),
        };
    measured.same_filesystem_as_server = same_filesystem_as_server;
    let (options, fsync) = plan.server_options_and_fsync();
    let config = MetadataRunConfig {
        server: server_label(plan),
        server_pid: server.pid,
        shards_requested: request.to_string(),
        fsync,
        write_mode: options.write_mode,
        cpus: options.cpus,
        no_pin: options.no_pin,
        io_driver: options.io_driver,
        inbox_capacity: options.inbox_capacity,
        idle_poll_us: options.idle_poll_us,
        first_stream_id: measured.first_stream_id,
        topic_partitions: TOPIC_PARTITION_COUNT,
        clients: plan.metadata_clients.count,
        replica_count,
    };
    Ok(MetadataRunReport::new(shard_count, config, &measured))
}

/// The first of `round_count` consecutive stream ids above every stream in `metadata`.
///
/// # Errors
/// The ids would pass `u32::MAX`.
pub fn first_free_stream_id(metadata: &Metadata, round_count: u32) -> anyhow::Result<u32> {
    assert!(round_count >= 1, "validated: --metadata-ops >= 1");
    let highest = metadata
        .streams
        .iter()
        .map(|stream| stream.stream_id)
        .max()
        .unwrap_or(0);
    highest
        .checked_add(1)
        .filter(|first| first.checked_add(round_count - 1).is_some())
        .with_context(|| {
            format!(
                "the server's highest stream id is {highest}: no room above it for {round_count} \
                 new streams; lower --metadata-ops"
            )
        })
}

/// The histograms of one run, µs.
struct RoundHistograms {
    baseline: Histogram<u64>,
    register: Histogram<u64>,
    create_stream: Histogram<u64>,
    create_topic: Histogram<u64>,
    delete_stream: Histogram<u64>,
}

/// Checks that the server is the primary, runs the rounds on one connection, then the concurrent
/// clients if `--clients` >= 2; returns the server's shard count and the measurement
/// (`same_filesystem_as_server` left `None` for the caller).
fn measure(
    plan: &BenchPlan,
    addr: SocketAddr,
    baseline: &mut DiskBaseline,
    location: BaselineLocation,
) -> anyhow::Result<(u16, MetadataMeasurement)> {
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(check_primary(addr))?;
    let (shard_count, mut measured) = runtime
        .block_on(measure_rounds(plan, addr, baseline, location))
        .map_err(|error| explain_not_primary(error, addr))?;
    let clients = plan.metadata_clients;
    if clients.count >= 2 {
        measured.clients = Some(measure_clients(addr, clients, plan.metadata_op_count)?);
    }
    Ok((shard_count, measured))
}

/// The rounds of one connection (see the module doc).
async fn measure_rounds(
    plan: &BenchPlan,
    addr: SocketAddr,
    baseline: &mut DiskBaseline,
    location: BaselineLocation,
) -> anyhow::Result<(u16, MetadataMeasurement)> {
    let round_count = plan.metadata_op_count;
    let mut client = Client::connect(addr)
        .await
        .context("cannot reach the server")?;
    let metadata = client
        .get_metadata()
        .await
        .context("cannot read the metadata")?;
    let first_stream_id = first_free_stream_id(&metadata, round_count)?;
    let mut histograms = RoundHistograms {
        baseline: new_latency_histogram(),
        register: new_latency_histogram(),
        create_stream: new_latency_histogram(),
        create_topic: new_latency_histogram(),
        delete_stream: new_latency_histogram(),
    };
    let bar = progress_bar("metadata", Some(round_count.into()));
    let mut result = Ok(());
    for round_index in 0..round_count {
        let stream_id = first_stream_id + round_index;
        result = match baseline.write_and_sync() {
            Ok(elapsed) => {
                record_latency(&mut histograms.baseline, elapsed);
                // A new client per round (connected untimed): a Register commits only for a
                // client without a session; the server answers a repeated one from its table.
                match Client::connect(addr).await {
                    Ok(round_client) => {
                        client = round_client;
                        one_round(&mut client, stream_id, &mut histograms)
                            .await
                            .with_context(|| format!("round {round_index} of {round_count}"))
                    }
                    Err(error) => Err(anyhow::Error::new(error)
                        .context(format!("round {round_index}: cannot connect"))),
                }
            }
            Err(error) => Err(error),
        };
        if result.is_err() {
            break;
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    result?;
    Ok((
        metadata.shard_count,
        MetadataMeasurement {
            round_count,
            first_stream_id,
            baseline_us: histograms.baseline,
            register_us: histograms.register,
            create_stream_us: histograms.create_stream,
            create_topic_us: histograms.create_topic,
            delete_stream_us: histograms.delete_stream,
            baseline_path: baseline.path().to_path_buf(),
            baseline_location: location,
            same_filesystem_as_server: None,
            clients: None,
        },
    ))
}

/// One round on a fresh client: register (a new session: one journaled op, the purest
/// commit), create stream, create its 1-partition topic, delete the stream, each timed. A
/// failure after the stream exists deletes it (best effort) before returning the error.
async fn one_round(
    client: &mut Client,
    stream_id: u32,
    histograms: &mut RoundHistograms,
) -> anyhow::Result<()> {
    let started_at = Instant::now();
    client.register().await.context("cannot register")?;
    record_latency(&mut histograms.register, started_at.elapsed());
    let started_at = Instant::now();
    client
        .create_stream(stream_id, &format!("bench-metadata-{stream_id}"))
        .await
        .with_context(|| format!("cannot create stream {stream_id}"))?;
    record_latency(&mut histograms.create_stream, started_at.elapsed());
    let started_at = Instant::now();
    let created = client
        .create_topic(stream_id, TOPIC_ID, "bench-metadata", TOPIC_PARTITION_COUNT)
        .await;
    if let Err(error) = created {
        let error = anyhow::Error::new(error)
            .context(format!("cannot create topic {stream_id}/{TOPIC_ID}"));
        return Err(clean_up(client, stream_id, error).await);
    }
    record_latency(&mut histograms.create_topic, started_at.elapsed());
    let started_at = Instant::now();
    client.delete_stream(stream_id).await.with_context(|| {
        format!("cannot delete stream {stream_id}; it may be left on the server")
    })?;
    record_latency(&mut histograms.delete_stream, started_at.elapsed());
    Ok(())
}

/// Tries to delete `stream_id` after `error`; says in the error whether it may be left behind.
async fn clean_up(client: &mut Client, stream_id: u32, error: anyhow::Error) -> anyhow::Error {
    match client.delete_stream(stream_id).await {
        Ok(()) => error.context(format!("stream {stream_id} was deleted again")),
        Err(delete_error) => error.context(format!(
            "stream {stream_id} may be left on the server (deleting it failed: {delete_error})"
        )),
    }
}

/// Why a Register was not committed, read from its reply.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegisterRefusal {
    /// `Busy`: nothing was applied; send it again after a backoff.
    #[error("the server at {addr} answered Busy to a Register")]
    Busy { addr: SocketAddr },
    /// The server is a backup (or between views): run the bench against the primary instead.
    /// `view` and `primary_replica` come from the reply's header where the bench read it (`None`
    /// when the error came through `bus::Client`); `primary` is the address in its body.
    #[error("--addr {addr} is not the cluster's primary{}: {}", view_text(*view), advice(*primary_replica, primary.as_deref()))]
    NotPrimary {
        addr: SocketAddr,
        view: Option<u32>,
        primary_replica: Option<u8>,
        primary: Option<String>,
    },
    /// Another error code: the server refused the Register for a reason the bench cannot fix.
    #[error("the server at {addr} refused a Register with error {code} ({name}): {message}")]
    Refused {
        addr: SocketAddr,
        code: u32,
        name: String,
        message: String,
    },
    /// The answer is not a reply to this Register.
    #[error("the server at {addr} answered a Register with {what}")]
    Protocol { addr: SocketAddr, what: String },
}

/// ` (its view is V)`, or nothing when the view is unknown.
fn view_text(view: Option<u32>) -> String {
    view.map_or(String::new(), |view| format!(" (its view is {view})"))
}

/// What to do about a `NotPrimary`: the primary's address from the reply, or how to find it.
fn advice(primary_replica: Option<u8>, primary: Option<&str>) -> String {
    match primary {
        Some(primary) => format!(
            "it names the primary{} at {primary}; run the bench again with --addr {primary}",
            primary_replica.map_or(String::new(), |replica| format!(", replica {replica},"))
        ),
        None => "it names no primary address (a view change may be under way); run the bench \
                 again with --addr naming the primary"
            .to_string(),
    }
}

impl RegisterRefusal {
    /// The `NotPrimary` refusal of `addr` whose reply body was `body` (the primary's client
    /// address as UTF-8, empty when unknown).
    fn not_primary(
        addr: SocketAddr,
        view: Option<u32>,
        primary_replica: Option<u8>,
        body: &[u8],
    ) -> RegisterRefusal {
        let primary = String::from_utf8_lossy(body).trim().to_string();
        RegisterRefusal::NotPrimary {
            addr,
            view,
            primary_replica,
            primary: (!primary.is_empty()).then_some(primary),
        }
    }
}

/// The session a reply to the Register `request` opened (the op that committed it), or why
/// there is none.
///
/// # Errors
/// A [`RegisterRefusal`]: `Busy`, `NotPrimary` (with the view, the primary's index and address
/// from the reply), another error code, or an answer that is no Reply to this request.
pub fn register_reply(
    addr: SocketAddr,
    request: &Header,
    reply: &Frame,
) -> Result<u64, RegisterRefusal> {
    let header = &reply.header;
    if header.command != Command::Reply as u8 {
        return Err(RegisterRefusal::Protocol {
            addr,
            what: format!("command {} instead of a Reply", header.command),
        });
    }
    if header.client != request.client
        || header.request != request.request
        || header.operation != request.operation
    {
        return Err(RegisterRefusal::Protocol {
            addr,
            what: format!(
                "a reply to client {:#x} request {} operation {}",
                header.client, header.request, header.operation
            ),
        });
    }
    match header.error_code {
        0 => Ok(header.offset),
        code if code == ErrorCode::Busy as u32 => Err(RegisterRefusal::Busy { addr }),
        code if code == ErrorCode::NotPrimary as u32 => Err(RegisterRefusal::not_primary(
            addr,
            Some(header.view),
            Some(header.replica),
            &reply.body,
        )),
        code => Err(RegisterRefusal::Refused {
            addr,
            code,
            name: ErrorCode::from_u32(code)
                .map_or_else(|| "unknown".to_string(), |known| format!("{known:?}")),
            message: String::from_utf8_lossy(&reply.body).into_owned(),
        }),
    }
}

/// `error` with the `NotPrimary` advice on top when a `bus::Client` call in it was answered
/// `NotPrimary` (the primary changed during the rounds); otherwise `error` as it is.
fn explain_not_primary(error: anyhow::Error, addr: SocketAddr) -> anyhow::Error {
    let refusal = error.chain().find_map(|cause| match cause.downcast_ref() {
        Some(ClientError::Server {
            code: ErrorCode::NotPrimary,
            message,
        }) => Some(RegisterRefusal::not_primary(
            addr,
            None,
            None,
            message.as_bytes(),
        )),
        _ => None,
    });
    match refusal {
        Some(refusal) => error.context(refusal.to_string()),
        None => error,
    }
}

/// Microseconds since the Unix epoch (0 before it): the `timestamp_us` of a request.
fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// Fresh client ids: a per-run random base plus a counter, so that no two Registers of a run
/// share an id (a repeat would be answered from the client table, not committed) and two runs
/// against one server almost surely do not either. Never 0 (an invalid client id).
#[derive(Debug)]
struct ClientIds {
    base: u128,
    next: AtomicU64,
}

impl ClientIds {
    fn new() -> ClientIds {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |since| since.as_nanos());
        let mut seed = [0u8; 20];
        seed[..16].copy_from_slice(&nanos.to_le_bytes());
        seed[16..].copy_from_slice(&std::process::id().to_le_bytes());
        ClientIds {
            base: twox_hash::XxHash3_128::oneshot(&seed),
            next: AtomicU64::new(0),
        }
    }

    fn next(&self) -> u128 {
        loop {
            let id = self
                .base
                .wrapping_add(u128::from(self.next.fetch_add(1, Ordering::Relaxed)));
            if id != 0 {
                return id;
            }
        }
    }
}

/// Opens a connection to `addr` with `TCP_NODELAY` (one small request in flight).
async fn open(addr: SocketAddr) -> anyhow::Result<TcpStream> {
    let stream = TcpStream::connect(addr)
        .await
        .with_context(|| format!("cannot connect to {addr}"))?;
    stream
        .set_nodelay(true)
        .with_context(|| format!("cannot set TCP_NODELAY on a connection to {addr}"))?;
    Ok(stream)
}

/// Sends one Register for `client_id` and reads its reply, sending it again after `Busy` (nothing
/// was applied) with a doubling backoff, each counted in `busy_retry_count`; returns the session.
///
/// # Errors
/// The connection failing (naming `addr`), a [`RegisterRefusal`] other than `Busy`, or `Busy`
/// after `BUSY_RETRY_COUNT_MAX` retries.
async fn register(
    stream: &mut TcpStream,
    addr: SocketAddr,
    client_id: u128,
    busy_retry_count: &mut u64,
) -> anyhow::Result<u64> {
    let mut retry_count = 0u32;
    loop {
        let mut header = Header::new(Command::Request, Operation::Register);
        header.client = client_id;
        header.timestamp_us = now_us();
        let frame = encode_frame(&mut header, &[]);
        let BufResult(written, _) = write_frame(stream, frame).await;
        written.with_context(|| format!("cannot send a Register to {addr}"))?;
        let reply = read_frame(stream, MESSAGE_SIZE_MAX_DEFAULT)
            .await
            .with_context(|| format!("cannot read the reply to a Register from {addr}"))?;
        match register_reply(addr, &header, &reply) {
            Ok(session) => return Ok(session),
            Err(RegisterRefusal::Busy { .. }) if retry_count < BUSY_RETRY_COUNT_MAX => {
                let backoff = BUSY_BACKOFF_INITIAL.saturating_mul(1 << retry_count.min(16));
                compio::time::sleep(backoff.min(BUSY_BACKOFF_MAX)).await;
                retry_count += 1;
                *busy_retry_count += 1;
            }
            Err(refusal) if retry_count == 0 => return Err(refusal.into()),
            Err(refusal) => {
                return Err(anyhow::Error::new(refusal))
                    .with_context(|| format!("after {retry_count} Busy retries"));
            }
        }
    }
}

/// One untimed Register on a fresh connection: fails with the `NotPrimary` advice when `addr` is
/// a backup, before any stream is created or round timed.
///
/// # Errors
/// As [`register`].
async fn check_primary(addr: SocketAddr) -> anyhow::Result<()> {
    let mut stream = open(addr).await?;
    let mut busy_retry_count = 0;
    register(
        &mut stream,
        addr,
        ClientIds::new().next(),
        &mut busy_retry_count,
    )
    .await?;
    Ok(())
}

/// What the concurrent clients share.
#[derive(Debug)]
struct ClientsShared {
    addr: SocketAddr,
    start: StartLine,
    /// Set by the first client that fails (or a thread that cannot start): every client stops
    /// before its next Register.
    stop: AtomicBool,
    /// `Some(n)`: each client sends `n` Registers; `None`: until `deadline`.
    registers_per_client: Option<u32>,
    /// The end of a `--duration` phase; set before the start line is released.
    deadline: OnceLock<Instant>,
    ids: ClientIds,
    bar: indicatif::ProgressBar,
}

impl ClientsShared {
    /// Whether a client that has committed `committed` Registers stops now.
    fn done(&self, committed: u32) -> bool {
        if self.stop.load(Ordering::Relaxed) {
            return true;
        }
        match (self.registers_per_client, self.deadline.get()) {
            (Some(count), _) => committed >= count,
            (None, Some(deadline)) => Instant::now() >= *deadline,
            (None, None) => true,
        }
    }
}

/// What one client (or, merged, one thread or all of them) measured.
#[derive(Debug)]
struct ClientOutcome {
    commit_us: Histogram<u64>,
    busy_retry_count: u64,
    /// The last reply's time; `None` before any client finished.
    finished_at: Option<Instant>,
}

impl ClientOutcome {
    fn empty() -> ClientOutcome {
        ClientOutcome {
            commit_us: new_latency_histogram(),
            busy_retry_count: 0,
            finished_at: None,
        }
    }

    fn merge(&mut self, other: &ClientOutcome) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.commit_us.add(&other.commit_us);
        self.busy_retry_count += other.busy_retry_count;
        self.finished_at = self.finished_at.max(other.finished_at);
    }
}

/// Arrives at the start line exactly once: when passed, or when dropped (an early error or a
/// panic), so that the orchestrator never waits for a thread that is gone.
struct Arrival<'a> {
    line: &'a StartLine,
    arrived: bool,
}

impl Arrival<'_> {
    fn pass(&mut self) {
        if !self.arrived {
            self.arrived = true;
            self.line.arrive_and_wait();
        }
    }
}

impl Drop for Arrival<'_> {
    fn drop(&mut self) {
        self.pass();
    }
}

/// Runs the concurrent clients (see the module doc) and returns what they measured.
///
/// # Errors
/// A thread or runtime that cannot be created, a connection that cannot be opened, or the first
/// client's failing Register (a refusal other than `Busy`, or `Busy` past the retry budget); the
/// other clients stop before their next Register.
fn measure_clients(
    addr: SocketAddr,
    clients: MetadataClients,
    registers_per_client: u32,
) -> anyhow::Result<ClientsMeasurement> {
    let client_count = clients.count as usize;
    let thread_count = std::thread::available_parallelism()
        .map_or(1, NonZero::get)
        .min(client_count);
    let registers_per_client = clients.duration.is_none().then_some(registers_per_client);
    let bar = progress_bar(
        "clients",
        registers_per_client.map(|count| u64::from(count) * u64::from(clients.count)),
    );
    let shared = Arc::new(ClientsShared {
        addr,
        start: StartLine::default(),
        stop: AtomicBool::new(false),
        registers_per_client,
        deadline: OnceLock::new(),
        ids: ClientIds::new(),
        bar: bar.clone(),
    });
    let measured = std::thread::scope(|scope| {
        let mut threads = Vec::with_capacity(thread_count);
        for thread_index in 0..thread_count {
            let connection_count = dealt_indices(thread_index, thread_count, client_count).len();
            let thread_shared = Arc::clone(&shared);
            let spawned = std::thread::Builder::new()
                .name(format!("bench-clients-{thread_index}"))
                .spawn_scoped(scope, move || {
                    run_client_thread(&thread_shared, connection_count)
                });
            match spawned {
                Ok(thread) => threads.push(thread),
                Err(error) => {
                    shared.stop.store(true, Ordering::Relaxed);
                    shared.start.release();
                    let _ = join_client_threads(threads);
                    return Err(anyhow::Error::new(error)
                        .context(format!("cannot start client thread {thread_index}")));
                }
            }
        }
        shared.start.wait_for(thread_count);
        let started_at = Instant::now();
        if let Some(duration) = clients.duration {
            let _ = shared.deadline.set(started_at + duration);
        }
        shared.start.release();
        join_client_threads(threads).map(|outcome| (started_at, outcome))
    });
    bar.finish_and_clear();
    let (started_at, outcome) = measured?;
    let finished_at = outcome.finished_at.unwrap_or(started_at);
    Ok(ClientsMeasurement {
        client_count: clients.count,
        thread_count: thread_count as u32,
        registers_per_client,
        duration: clients.duration,
        commit_us: outcome.commit_us,
        elapsed: finished_at.saturating_duration_since(started_at),
        busy_retry_count: outcome.busy_retry_count,
    })
}

/// Joins every client thread: their outcomes merged, or the first error.
fn join_client_threads(
    threads: Vec<std::thread::ScopedJoinHandle<'_, anyhow::Result<ClientOutcome>>>,
) -> anyhow::Result<ClientOutcome> {
    let mut merged = ClientOutcome::empty();
    let mut first_error = None;
    for thread in threads {
        match thread.join() {
            Ok(Ok(outcome)) => merged.merge(&outcome),
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(_) => {
                first_error.get_or_insert_with(|| anyhow::anyhow!("a client thread panicked"));
            }
        }
    }
    first_error.map_or(Ok(merged), Err)
}

/// One client thread: its own compio runtime, `connection_count` connections opened before the
/// start line, then one task per connection registering until `shared` says stop.
fn run_client_thread(
    shared: &Arc<ClientsShared>,
    connection_count: usize,
) -> anyhow::Result<ClientOutcome> {
    let mut arrival = Arrival {
        line: &shared.start,
        arrived: false,
    };
    let runtime = compio::runtime::Runtime::new()
        .context("cannot create a compio runtime")
        .inspect_err(|_| shared.stop.store(true, Ordering::Relaxed))?;
    runtime.block_on(async {
        let mut streams = Vec::with_capacity(connection_count);
        for _ in 0..connection_count {
            match open(shared.addr).await {
                Ok(stream) => streams.push(stream),
                Err(error) => {
                    shared.stop.store(true, Ordering::Relaxed);
                    arrival.pass();
                    return Err(error);
                }
            }
        }
        arrival.pass();
        let tasks: Vec<_> = streams
            .into_iter()
            .map(|stream| compio::runtime::spawn(register_loop(stream, Arc::clone(shared))))
            .collect();
        let mut merged = ClientOutcome::empty();
        let mut first_error = None;
        for task in tasks {
            match task.await {
                Ok(Ok(outcome)) => merged.merge(&outcome),
                Ok(Err(error)) => {
                    first_error.get_or_insert(error);
                }
                Err(_) => {
                    first_error.get_or_insert_with(|| anyhow::anyhow!("a client task panicked"));
                }
            }
        }
        first_error.map_or(Ok(merged), Err)
    })
}

/// One client: a Register with a fresh client id, one in flight, until `shared` says stop; each
/// commit's latency recorded. A failure stops every other client too.
async fn register_loop(
    mut stream: TcpStream,
    shared: Arc<ClientsShared>,
) -> anyhow::Result<ClientOutcome> {
    let mut outcome = ClientOutcome::empty();
    let mut committed = 0u32;
    while !shared.done(committed) {
        let started_at = Instant::now();
        let registered = register(
            &mut stream,
            shared.addr,
            shared.ids.next(),
            &mut outcome.busy_retry_count,
        )
        .await;
        if let Err(error) = registered {
            shared.stop.store(true, Ordering::Relaxed);
            return Err(error.context(format!(
                "a concurrent client failed after {committed} committed Registers"
            )));
        }
        record_latency(&mut outcome.commit_us, started_at.elapsed());
        committed += 1;
        shared.bar.inc(1);
    }
    outcome.finished_at = Some(Instant::now());
    Ok(outcome)
}

#[cfg(test)]
mod tests {
    use bus::{StreamInfo, error_reply, reply_header};

    use super::*;

    const ADDR: &str = "127.0.0.1:9001";

    fn addr() -> SocketAddr {
        ADDR.parse().unwrap()
    }

    fn register_request() -> Header {
        let mut header = Header::new(Command::Request, Operation::Register);
        header.client = 0xabc;
        header
    }

    /// The frame `bytes` encode (header + body).
    fn frame(bytes: &[u8]) -> Frame {
        let header: Header = bytemuck::pod_read_unaligned(&bytes[..bus::HEADER_SIZE]);
        Frame {
            header,
            body: bytes[bus::HEADER_SIZE..].to_vec(),
        }
    }

    fn not_primary_reply(body: &str) -> Frame {
        let mut header = reply_header(&register_request());
        header.error_code = ErrorCode::NotPrimary as u32;
        header.view = 4;
        header.replica = 1;
        frame(&encode_frame(&mut header, body.as_bytes()))
    }

    #[test]
    fn a_committed_register_gives_its_session() {
        let mut header = reply_header(&register_request());
        header.offset = 17;
        let reply = frame(&encode_frame(&mut header, &[]));
        assert_eq!(register_reply(addr(), &register_request(), &reply), Ok(17));
    }

    #[test]
    fn not_primary_names_the_address_and_the_primary_from_the_reply() {
        let refusal = register_reply(
            addr(),
            &register_request(),
            &not_primary_reply("127.0.0.1:9000"),
        )
        .unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "--addr 127.0.0.1:9001 is not the cluster's primary (its view is 4): it names the \
             primary, replica 1, at 127.0.0.1:9000; run the bench again with --addr 127.0.0.1:9000"
        );
        let refusal =
            register_reply(addr(), &register_request(), &not_primary_reply("")).unwrap_err();
        assert_eq!(
            refusal.to_string(),
            "--addr 127.0.0.1:9001 is not the cluster's primary (its view is 4): it names no \
             primary address (a view change may be under way); run the bench again with --addr \
             naming the primary"
        );
    }

    #[test]
    fn other_answers_are_refusals_naming_what_came() {
        let busy = frame(&error_reply(&register_request(), ErrorCode::Busy, ""));
        assert_eq!(
            register_reply(addr(), &register_request(), &busy),
            Err(RegisterRefusal::Busy { addr: addr() })
        );
        let full = frame(&error_reply(
            &register_request(),
            ErrorCode::StorageFull,
            "journal full",
        ));
        assert_eq!(
            register_reply(addr(), &register_request(), &full)
                .unwrap_err()
                .to_string(),
            "the server at 127.0.0.1:9001 refused a Register with error 14 (StorageFull): \
             journal full"
        );
        let mut other = register_request();
        other.client = 0xdef;
        let stray = frame(&encode_frame(&mut reply_header(&other), &[]));
        assert_eq!(
            register_reply(addr(), &register_request(), &stray)
                .unwrap_err()
                .to_string(),
            "the server at 127.0.0.1:9001 answered a Register with a reply to client 0xdef \
             request 0 operation 9"
        );
    }

    #[test]
    fn a_not_primary_through_the_client_gets_the_advice_on_top() {
        let error = anyhow::Error::new(ClientError::Server {
            code: ErrorCode::NotPrimary,
            message: "127.0.0.1:9000".to_string(),
        })
        .context("round 3 of 200: cannot register");
        let explained = explain_not_primary(error, addr());
        assert_eq!(
            explained.to_string(),
            "--addr 127.0.0.1:9001 is not the cluster's primary: it names the primary at \
             127.0.0.1:9000; run the bench again with --addr 127.0.0.1:9000"
        );
        assert!(format!("{explained:#}").contains("round 3 of 200"));
        let other = explain_not_primary(anyhow::anyhow!("cannot reach the server"), addr());
        assert_eq!(other.to_string(), "cannot reach the server");
    }

    #[test]
    fn client_ids_are_fresh_and_never_zero() {
        let ids = ClientIds {
            base: u128::MAX - 1,
            next: AtomicU64::new(0),
        };
        assert_eq!(ids.next(), u128::MAX - 1);
        assert_eq!(ids.next(), u128::MAX);
        assert_eq!(ids.next(), 1);
        let ids = ClientIds::new();
        assert_ne!(ids.next(), ids.next());
    }

    fn metadata(stream_ids: &[u32]) -> Metadata {
        Metadata {
            shard_count: 1,
            streams: stream_ids
                .iter()
                .map(|stream_id| StreamInfo {
                    stream_id: *stream_id,
                    name: format!("s{stream_id}"),
                    topics: Vec::new(),
                })
                .collect(),
            ..Metadata::default()
        }
    }

    #[test]
    fn stream_ids_start_above_the_highest_existing_one() {
        assert_eq!(first_free_stream_id(&metadata(&[]), 200).unwrap(), 1);
        assert_eq!(first_free_stream_id(&metadata(&[7, 3]), 200).unwrap(), 8);
        assert_eq!(
            first_free_stream_id(&metadata(&[u32::MAX - 10]), 10).unwrap(),
            u32::MAX - 9
        );
        assert_eq!(
            first_free_stream_id(&metadata(&[u32::MAX - 10]), 11)
                .unwrap_err()
                .to_string(),
            format!(
                "the server's highest stream id is {}: no room above it for 11 new streams; \
                 lower --metadata-ops",
                u32::MAX - 10
            )
        );
        assert!(first_free_stream_id(&metadata(&[u32::MAX]), 1).is_err());
    }
}
