//! State transfer end to end on three real `shardline serve` processes over loopback (issue 9
//! "Targets"): how long a lagging replica takes from its restart to "checkpoint installed" and
//! to converged metadata, the checkpoint's size and MB/s, and how the serving primary's shard 0
//! answers pings meanwhile (largest gap between answers, p99/max latency), against a plain TCP
//! copy of the same bytes in the same run.
//!
//! Setup: three replicas with one shard each (so every client connection, the pinger's
//! included, lands on shard 0, the shard that serves the transfer), `--checkpoint-interval` and
//! `--journal-segment-size` small enough that checkpoints release the journal. A backup is
//! killed at once; then `--streams` CreateStreams and `--sessions` Registers (each a consensus
//! op, sent by `--connections` concurrent blocking clients) are committed by the other two, then
//! more Registers until both survivors released the journal segment holding the op after the
//! victim's commit: the victim can only catch up by state transfer. The checkpoint it gets holds
//! every stream and session.
//!
//! Measured: a pinger thread per survivor pings its client port (one in flight,
//! `--ping-interval-us` apart; 0 = back to back) from `--baseline-ms` before the restart until
//! after convergence; the replica that served the offer is marked (the restart can start a view
//! change that moves the primary, so both survivors are pinged). The
//! victim is restarted; the times come from its own log lines (tracing timestamps, UTC):
//! `asking the primary for its checkpoint`, `every chunk fetched and verified` (the chunks are
//! in; the restore check starts), `checkpoint fetched and checked; installing`,
//! `checkpoint installed and every shard restored`; convergence is polled (every replica
//! answers GetMetadata with the same commit). The primary's `state transfer offer built ...
//! bytes=N` line gives the bytes the chunks move (its snapshot file size is printed too) and
//! when the offer was ready; MB/s and the plain TCP copy use those bytes. MB are 10^6 bytes. A
//! figure, never an assertion.
//!
//! Usage: `transfer_cluster [--bin target/release/shardline] [--streams 10000]
//! [--sessions 100000] [--connections 32] [--ping-interval-us 1000] [--serve-arg=FLAG ...]
//! [--keep-dirs] [--json]`. With the defaults one run takes about 75 s on a 2-core host, most of
//! it registering the sessions (the rate falls as the client table grows).

use std::io::{BufRead as _, BufReader, Read as _, Seek as _, SeekFrom, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, ensure};
use benches::cluster::Cluster;
use bus::{ErrorCode, Header, Namespace, Operation};
use clap::Parser;

/// Longest wait for an agreed primary or for convergence.
const CONVERGE_DEADLINE: Duration = Duration::from_mins(5);
/// Longest a single request may keep being retried (Busy, NotPrimary, reconnects).
const REQUEST_DEADLINE: Duration = Duration::from_mins(1);
/// Sessions beyond `--sessions` the client table has room for: the stream creators and the
/// filler Registers that make the survivors release their journal.
const SESSION_MARGIN: u32 = 16_384;
/// Client ids of the bench: this prefix in the high 64 bits, a counter in the low.
const CLIENT_PREFIX: u128 = 0x7472_616e_7366_6572 << 64;
const LINE_ASKING: &str = "state transfer: asking the primary for its checkpoint";
/// The victim's line once the last chunk arrived and every artifact matched its checksum,
/// before the restore check decodes them.
const LINE_CHUNKS: &str =
    "state transfer: every chunk fetched and verified; checking the checkpoint restorable";
const LINE_FETCHED: &str = "state transfer: checkpoint fetched and checked; installing";
const LINE_INSTALLED: &str = "state transfer: checkpoint installed and every shard restored";
/// The serving primary's line once its offer is built; `bytes=` is what the transfer moves.
const LINE_OFFER: &str = "state transfer offer built";

#[derive(Debug, Parser)]
#[command(about = "State transfer between real serve processes (issue 9 Targets)")]
struct Args {
    /// The `shardline` binary (a release build).
    #[arg(long, default_value = "target/release/shardline")]
    bin: PathBuf,
    /// Streams created before the restart (each in the checkpoint's metadata).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    streams: u32,
    /// Client sessions registered before the restart (each in the checkpoint's client table).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(0..=1_000_000))]
    sessions: u32,
    /// Concurrent blocking clients that create the streams and register the sessions.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// `serve --checkpoint-interval` of every replica (committed ops between checkpoints).
    #[arg(long, default_value_t = 4096)]
    checkpoint_interval: u64,
    /// `serve --journal-segment-size` of every replica.
    #[arg(long, default_value = "1MiB")]
    journal_segment_size: String,
    /// Microseconds the pinger waits after each answer (0: back to back).
    #[arg(long, default_value_t = 1000)]
    ping_interval_us: u64,
    /// Milliseconds of pings before the restart (the baseline window).
    #[arg(long, default_value_t = 3000)]
    baseline_ms: u64,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
    /// One more `serve` flag for every replica (repeatable; e.g. `--serve-arg=--tick-ms=1`).
    #[arg(long = "serve-arg", value_name = "FLAG", allow_hyphen_values = true)]
    serve_extra: Vec<String>,
    /// Keep the data directories and the replicas' stderr logs (their path goes to stderr).
    #[arg(long)]
    keep_dirs: bool,
}

// ---------------------------------------------------------------------------------------------
// The cluster: three `serve` processes, stderr appended to a log file per replica.

// ---------------------------------------------------------------------------------------------
// Blocking client requests with chosen client ids and request numbers.

fn request_header(client: u128, request: u64, operation: Operation, namespace: u64) -> Header {
    let mut header = Header::new(bus::Command::Request, operation);
    header.client = client;
    header.request = request;
    header.namespace = namespace;
    header
}

/// One blocking connection; `call` writes a request and reads its reply.
struct Conn {
    stream: TcpStream,
}

impl Conn {
    fn open(addr: SocketAddr) -> anyhow::Result<Conn> {
        let stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
        stream.set_nodelay(true)?;
        stream.set_read_timeout(Some(Duration::from_secs(30)))?;
        Ok(Conn { stream })
    }

    fn call(&mut self, mut header: Header, body: &[u8]) -> anyhow::Result<(Header, Vec<u8>)> {
        self.stream
            .write_all(&bus::encode_frame(&mut header, body))?;
        let mut head = [0u8; bus::HEADER_SIZE];
        self.stream.read_exact(&mut head)?;
        let reply: Header = bytemuck::pod_read_unaligned(&head);
        let mut reply_body = vec![0u8; (reply.size as usize).saturating_sub(bus::HEADER_SIZE)];
        self.stream.read_exact(&mut reply_body)?;
        Ok((reply, reply_body))
    }
}

/// A connection to whichever of `addrs` answers as the primary: NotPrimary moves it to the next
/// address, Busy waits and resends, a broken connection reconnects.
struct Submitter {
    addrs: Vec<SocketAddr>,
    index: usize,
    conn: Option<Conn>,
}

impl Submitter {
    fn new(addrs: Vec<SocketAddr>, index: usize) -> Submitter {
        Submitter {
            addrs,
            index,
            conn: None,
        }
    }

    /// Sends until an answer other than NotPrimary/Busy/ShuttingDown comes back; returns it.
    fn submit(&mut self, header: Header, body: &[u8]) -> anyhow::Result<(Header, Vec<u8>)> {
        let deadline = Instant::now() + REQUEST_DEADLINE;
        loop {
            ensure!(
                Instant::now() < deadline,
                "request {} of client {:#x} unanswered for {REQUEST_DEADLINE:?}",
                header.request,
                header.client
            );
            let addr = self.addrs[self.index % self.addrs.len()];
            let answer = match self.conn.as_mut() {
                Some(conn) => conn.call(header, body),
                None => Conn::open(addr).and_then(|conn| self.conn.insert(conn).call(header, body)),
            };
            let Ok((reply, reply_body)) = answer else {
                self.conn = None;
                self.index += 1;
                std::thread::sleep(Duration::from_millis(20));
                continue;
            };
            match ErrorCode::from_u32(reply.error_code) {
                Some(ErrorCode::NotPrimary) => {
                    self.conn = None;
                    self.index += 1;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Some(ErrorCode::Busy | ErrorCode::ShuttingDown) => {
                    std::thread::sleep(Duration::from_millis(2));
                }
                _ => return Ok((reply, reply_body)),
            }
        }
    }

    /// `submit`, failing on any error code but `allowed`.
    fn submit_ok(
        &mut self,
        header: Header,
        body: &[u8],
        allowed: Option<ErrorCode>,
    ) -> anyhow::Result<Header> {
        let (reply, reply_body) = self.submit(header, body)?;
        let code = ErrorCode::from_u32(reply.error_code);
        ensure!(
            reply.error_code == 0 || (allowed.is_some() && code == allowed),
            "{:?} request {} of client {:#x}: error {code:?}: {}",
            Operation::from_u8(header.operation),
            header.request,
            header.client,
            String::from_utf8_lossy(&reply_body)
        );
        Ok(reply)
    }
}

/// GetMetadata of the replica at `addr`, or `None` if it does not answer.
fn metadata(addr: SocketAddr) -> Option<bus::Metadata> {
    let mut conn = Conn::open(addr).ok()?;
    let header = request_header(1, 0, Operation::GetMetadata, 0);
    let (reply, body) = conn.call(header, &[]).ok()?;
    if reply.error_code != 0 {
        return None;
    }
    serde_json::from_slice(&body).ok()
}

/// The primary every running replica agrees on.
fn agreed_primary(cluster: &Cluster) -> anyhow::Result<usize> {
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    loop {
        let seen: Vec<Option<(u32, u8)>> = cluster
            .running_clients()
            .into_iter()
            .map(|addr| metadata(addr).map(|m| (m.view, m.primary)))
            .collect();
        if let Some(Some(first)) = seen.first()
            && seen.iter().all(|s| *s == Some(*first))
            && cluster.replicas[usize::from(first.1)].child.is_some()
        {
            return Ok(usize::from(first.1));
        }
        ensure!(Instant::now() < deadline, "no agreed primary: {seen:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Polls until every replica answers GetMetadata with the same commit, at least `at_least`;
/// returns that commit.
fn wait_converged(cluster: &Cluster, at_least: u64) -> anyhow::Result<u64> {
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    loop {
        let commits: Vec<Option<u64>> = cluster
            .running_clients()
            .into_iter()
            .map(|addr| metadata(addr).map(|m| m.commit))
            .collect();
        if let Some(Some(commit)) = commits.first()
            && *commit >= at_least
            && commits.iter().all(|c| *c == Some(*commit))
        {
            return Ok(*commit);
        }
        ensure!(Instant::now() < deadline, "never converged: {commits:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------------------
// The load: streams and sessions from many concurrent blocking clients.

/// Runs `job(worker, submitter, done)` on `workers` threads, printing progress of `total` units
/// (counted through `done`) to stderr every 10%.
fn run_workers<F>(
    label: &str,
    addrs: &[SocketAddr],
    workers: u32,
    total: u64,
    job: F,
) -> anyhow::Result<Duration>
where
    F: Fn(u32, &mut Submitter, &AtomicU64) -> anyhow::Result<()> + Sync,
{
    let started = Instant::now();
    let done = AtomicU64::new(0);
    let finished = AtomicBool::new(false);
    std::thread::scope(|scope| {
        let progress = scope.spawn(|| {
            let mut next = total / 10;
            while !finished.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(200));
                let now = done.load(Ordering::Relaxed);
                if total >= 10 && now >= next && now < total {
                    eprintln!(
                        "  {label}: {now}/{total} after {:.1} s",
                        started.elapsed().as_secs_f64()
                    );
                    next = now + total / 10;
                }
            }
        });
        let handles: Vec<_> = (0..workers)
            .map(|worker| {
                let (job, done) = (&job, &done);
                let mut submitter = Submitter::new(addrs.to_vec(), 0);
                scope.spawn(move || job(worker, &mut submitter, done))
            })
            .collect();
        let results: Vec<anyhow::Result<()>> = handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("worker panicked")))
            })
            .collect();
        finished.store(true, Ordering::Relaxed);
        let _ = progress.join();
        results.into_iter().collect::<anyhow::Result<()>>()
    })?;
    Ok(started.elapsed())
}

/// The ids `worker` of `workers` takes out of `0..total`: every `workers`-th one.
fn share(worker: u32, workers: u32, total: u32) -> impl Iterator<Item = u32> {
    (worker..total).step_by(workers as usize)
}

/// Creates streams `1..=streams`; each worker registers its own session first.
fn create_streams(addrs: &[SocketAddr], streams: u32, workers: u32) -> anyhow::Result<Duration> {
    let workers = workers.min(streams.max(1));
    run_workers(
        "streams",
        addrs,
        workers,
        streams.into(),
        |worker, submitter, done| {
            let client = CLIENT_PREFIX | (1 << 32) | u128::from(worker);
            let register = request_header(client, 0, Operation::Register, 0);
            submitter.submit_ok(register, &[], None)?;
            for (request, index) in (1u64..).zip(share(worker, workers, streams)) {
                let stream_id = index + 1;
                let namespace = Namespace::new(stream_id, 0, 0).0;
                let header = request_header(client, request, Operation::CreateStream, namespace);
                let name = format!("transfer-bench-stream-{stream_id:08}");
                submitter.submit_ok(
                    header,
                    name.as_bytes(),
                    Some(ErrorCode::StreamAlreadyExists),
                )?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        },
    )
}

/// Registers `count` sessions with client ids `first..first + count` (low 32 bits).
fn register_sessions(
    addrs: &[SocketAddr],
    first: u32,
    count: u32,
    workers: u32,
) -> anyhow::Result<Duration> {
    let workers = workers.min(count.max(1));
    run_workers(
        "sessions",
        addrs,
        workers,
        count.into(),
        |worker, submitter, done| {
            for index in share(worker, workers, count) {
                let client = CLIENT_PREFIX | u128::from(first + index);
                submitter.submit_ok(
                    request_header(client, 0, Operation::Register, 0),
                    &[],
                    None,
                )?;
                done.fetch_add(1, Ordering::Relaxed);
            }
            Ok(())
        },
    )
}

/// First ops of the journal segments under `data_dir/journal`, ascending.
fn segment_first_ops(data_dir: &Path) -> Vec<u64> {
    let Ok(entries) = std::fs::read_dir(data_dir.join("journal")) else {
        return Vec::new();
    };
    let mut ops: Vec<u64> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().to_string_lossy().into_owned();
            name.strip_suffix(".wal")?.parse().ok()
        })
        .collect();
    ops.sort_unstable();
    ops
}

/// Whether every survivor released the journal segment holding op `victim_commit + 1`.
fn released(cluster: &Cluster, survivors: &[usize], victim_commit: u64) -> bool {
    survivors.iter().all(|&index| {
        segment_first_ops(&cluster.replicas[index].dir)
            .first()
            .is_some_and(|&first| first > victim_commit + 1)
    })
}

// ---------------------------------------------------------------------------------------------
// The pinger.

/// One answered ping: when it was sent and when its answer came.
#[derive(Clone, Copy)]
struct Ping {
    sent: Instant,
    answered: Instant,
}

/// Pings `addr` until `stop`, one in flight, `interval` after each answer; every answer goes into
/// `pings`. A failed ping reconnects (the gap shows it); the count of failures is returned.
fn pinger(
    addr: SocketAddr,
    interval: Duration,
    stop: &AtomicBool,
    pings: &Mutex<Vec<Ping>>,
) -> u64 {
    let mut conn: Option<Conn> = None;
    let mut failures = 0;
    let client = CLIENT_PREFIX | (2 << 32);
    while !stop.load(Ordering::Relaxed) {
        let sent = Instant::now();
        let answer = match conn.as_mut() {
            Some(conn) => conn.call(request_header(client, 0, Operation::Ping, 0), &[]),
            None => Conn::open(addr).and_then(|c| {
                conn.insert(c)
                    .call(request_header(client, 0, Operation::Ping, 0), &[])
            }),
        };
        match answer {
            Ok((reply, _)) if reply.error_code == 0 => {
                let answered = Instant::now();
                pings
                    .lock()
                    .expect("pinger lock")
                    .push(Ping { sent, answered });
            }
            _ => {
                failures += 1;
                conn = None;
                std::thread::sleep(Duration::from_millis(10));
            }
        }
        if !interval.is_zero() {
            std::thread::sleep(interval);
        }
    }
    failures
}

/// Ping figures of one window, milliseconds.
#[derive(Debug, Default, Clone, Copy)]
struct PingStats {
    count: usize,
    p50_ms: f64,
    p99_ms: f64,
    max_ms: f64,
    max_gap_ms: f64,
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

/// Latencies of the pings answered in `[from, to]`, and the largest gap between consecutive
/// answers whose span overlaps the window (a stall across either edge counts).
fn ping_stats(pings: &[Ping], from: Instant, to: Instant) -> PingStats {
    let mut latencies: Vec<f64> = pings
        .iter()
        .filter(|p| p.answered >= from && p.answered <= to)
        .map(|p| (p.answered - p.sent).as_secs_f64() * 1000.0)
        .collect();
    latencies.sort_by(f64::total_cmp);
    let max_gap_ms = pings
        .windows(2)
        .filter(|pair| pair[1].answered >= from && pair[0].answered <= to)
        .map(|pair| (pair[1].answered - pair[0].answered).as_secs_f64() * 1000.0)
        .fold(0.0, f64::max);
    PingStats {
        count: latencies.len(),
        p50_ms: percentile(&latencies, 50.0),
        p99_ms: percentile(&latencies, 99.0),
        max_ms: latencies.last().copied().unwrap_or(0.0),
        max_gap_ms,
    }
}

// ---------------------------------------------------------------------------------------------
// The victim's log lines.

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let day_of_year = (153 * (month + if month > 2 { -3 } else { 9 }) + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The UTC timestamp a tracing fmt line starts with (`2026-12-01T06:51:06.123456Z`).
fn line_time(line: &str) -> Option<SystemTime> {
    let stamp = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut date = date.split('-').map(|part| part.parse::<i64>().ok());
    let (year, month, day) = (date.next()??, date.next()??, date.next()??);
    let (hms, fraction) = time.split_once('.').unwrap_or((time, "0"));
    let mut hms = hms.split(':').map(|part| part.parse::<i64>().ok());
    let (hour, minute, second) = (hms.next()??, hms.next()??, hms.next()??);
    let seconds = days_from_civil(year, month, day) * 86_400 + hour * 3600 + minute * 60 + second;
    let nanos = format!("{fraction:0<9}").get(..9)?.parse::<u32>().ok()?;
    Some(UNIX_EPOCH + Duration::new(u64::try_from(seconds).ok()?, nanos))
}

/// A wall-clock time mapped onto the monotonic clock through one (`Instant`, `SystemTime`) pair.
#[derive(Clone, Copy)]
struct Anchor {
    instant: Instant,
    wall: SystemTime,
}

impl Anchor {
    fn now() -> Anchor {
        Anchor {
            instant: Instant::now(),
            wall: SystemTime::now(),
        }
    }

    fn instant_of(self, wall: SystemTime) -> Instant {
        match wall.duration_since(self.wall) {
            Ok(after) => self.instant + after,
            // Before the process's clock could be read back that far: the anchor itself.
            Err(before) => self
                .instant
                .checked_sub(before.duration())
                .unwrap_or(self.instant),
        }
    }
}

/// Reads `log` from byte `from` until every line in `wanted` appeared (first occurrence each)
/// or `deadline` passed; returns the lines found, in `wanted`'s order.
fn find_lines(
    log: &Path,
    from: u64,
    wanted: &[&str],
    deadline: Instant,
) -> anyhow::Result<Vec<Option<String>>> {
    let mut found: Vec<Option<String>> = vec![None; wanted.len()];
    let mut file = std::fs::File::open(log)?;
    file.seek(SeekFrom::Start(from))?;
    let mut reader = BufReader::new(file);
    let mut line = String::new();
    while found.iter().any(Option::is_none) {
        line.clear();
        if reader.read_line(&mut line)? == 0 || !line.ends_with('\n') {
            if Instant::now() >= deadline {
                break;
            }
            // A partial line is read again whole once the writer finished it.
            if !line.is_empty() {
                reader.seek_relative(-i64::try_from(line.len())?)?;
            }
            std::thread::sleep(Duration::from_millis(5));
            continue;
        }
        for (text, slot) in wanted.iter().zip(found.iter_mut()) {
            if slot.is_none() && line.contains(text) {
                *slot = Some(line.clone());
            }
        }
    }
    Ok(found)
}

/// `find_lines`, failing unless every line appeared; returns their timestamps.
fn wait_for_lines(
    log: &Path,
    from: u64,
    wanted: &[&str],
    deadline: Instant,
) -> anyhow::Result<Vec<(SystemTime, String)>> {
    let found = find_lines(log, from, wanted, deadline)?;
    wanted
        .iter()
        .zip(found)
        .map(|(text, line)| {
            let line =
                line.with_context(|| format!("{} never logged {text:?} in time", log.display()))?;
            let time = line_time(&line).with_context(|| format!("no timestamp: {line}"))?;
            Ok((time, line))
        })
        .collect()
}

/// The number in a tracing field `key=NUMBER` of `line`.
fn field(line: &str, key: &str) -> Option<u64> {
    line.split_whitespace()
        .find_map(|word| word.strip_prefix(key)?.strip_prefix('='))
        .and_then(|value| value.parse().ok())
}

// ---------------------------------------------------------------------------------------------
// The plain TCP copy.

/// Seconds to copy `bytes` bytes over one loopback connection (1 MiB writes), median of 3.
fn plain_tcp_copy(bytes: u64) -> anyhow::Result<f64> {
    let mut samples = Vec::new();
    for _ in 0..3 {
        let listener = TcpListener::bind("127.0.0.1:0")?;
        let addr = listener.local_addr()?;
        let sender = std::thread::spawn(move || -> std::io::Result<()> {
            let (mut stream, _) = listener.accept()?;
            let chunk = vec![0x5au8; 1 << 20];
            let mut left = bytes;
            while left > 0 {
                let n = left.min(chunk.len() as u64) as usize;
                stream.write_all(&chunk[..n])?;
                left -= n as u64;
            }
            Ok(())
        });
        let started = Instant::now();
        let mut stream = TcpStream::connect(addr)?;
        let mut buffer = vec![0u8; 1 << 20];
        let mut got = 0u64;
        while got < bytes {
            let n = stream.read(&mut buffer)?;
            ensure!(n > 0, "plain copy closed after {got} of {bytes} bytes");
            got += n as u64;
        }
        samples.push(started.elapsed().as_secs_f64());
        sender
            .join()
            .map_err(|_| anyhow::anyhow!("sender panicked"))??;
    }
    samples.sort_by(f64::total_cmp);
    Ok(samples[1])
}

// ---------------------------------------------------------------------------------------------
// The run.

struct Setup {
    streams_s: f64,
    sessions_s: f64,
    filler_sessions: u32,
    victim: usize,
    primary: usize,
    commit_before: u64,
    snapshot_bytes: u64,
}

struct Transfer {
    /// Milliseconds since the restart (`spawn`) of each step.
    listening_ms: f64,
    asking_ms: f64,
    /// The primary's `offer built` line, if it logged one (a cached offer logs none).
    offer_ms: Option<f64>,
    /// The last chunk arrived and every artifact verified (the restore check starts).
    chunks_ms: f64,
    fetched_ms: f64,
    installed_ms: f64,
    converged_ms: f64,
    /// Bytes of the offer's artifacts (what the chunks move), from the primary's line.
    offer_bytes: Option<u64>,
    checkpoint_op: Option<u64>,
    /// The replica that logged the offer (the primary, unless a view change moved it).
    server: Option<usize>,
    /// The primary once converged.
    primary_after: usize,
    commit_after: u64,
    /// The pings of each survivor, in replica order.
    pings: Vec<PingWindows>,
}

/// One survivor's pings in the three windows.
struct PingWindows {
    replica: usize,
    failures: u64,
    baseline: PingStats,
    during: PingStats,
    after_restart: PingStats,
}

impl Transfer {
    /// The bytes the transfer moved: the offer's, else the snapshot file's.
    fn bytes(&self, setup: &Setup) -> u64 {
        self.offer_bytes.unwrap_or(setup.snapshot_bytes)
    }
}

fn serve_flags(args: &Args) -> Vec<String> {
    let clients_max = (u64::from(args.sessions) + u64::from(SESSION_MARGIN)).min(1 << 20);
    let mut flags = vec![
        "--checkpoint-interval".into(),
        args.checkpoint_interval.to_string(),
        "--journal-segment-size".into(),
        args.journal_segment_size.clone(),
        "--clients-table-max".into(),
        clients_max.to_string(),
    ];
    flags.extend(args.serve_extra.iter().cloned());
    flags
}

/// Kills a backup, commits the streams and sessions, then filler Registers until the survivors
/// released the journal the victim would need.
fn set_up(cluster: &mut Cluster, args: &Args) -> anyhow::Result<Setup> {
    let primary = agreed_primary(cluster)?;
    let victim_commit = wait_converged(cluster, 0)?;
    let victim = (primary + 1) % 3;
    cluster.kill9(victim)?;
    let survivors: Vec<usize> = cluster.running();
    let addrs = cluster.running_clients();
    eprintln!("killed replica {victim} at commit {victim_commit}; primary {primary}");
    let streams_s = create_streams(&addrs, args.streams, args.connections)?.as_secs_f64();
    eprintln!("created {} streams in {streams_s:.1} s", args.streams);
    let sessions_s = register_sessions(&addrs, 0, args.sessions, args.connections)?.as_secs_f64();
    eprintln!("registered {} sessions in {sessions_s:.1} s", args.sessions);
    let mut filler_sessions = 0;
    while !released(cluster, &survivors, victim_commit) {
        ensure!(
            filler_sessions + 256 <= SESSION_MARGIN / 2,
            "the survivors never released their first journal segment: {:?}",
            survivors
                .iter()
                .map(|&i| segment_first_ops(&cluster.replicas[i].dir))
                .collect::<Vec<_>>()
        );
        register_sessions(
            &addrs,
            args.sessions + filler_sessions,
            256,
            args.connections,
        )?;
        filler_sessions += 256;
    }
    let commit_before = wait_converged(cluster, 0)?;
    // The checkpoint write runs beside commits; let the last one land before sizing it.
    std::thread::sleep(Duration::from_secs(1));
    let primary = agreed_primary(cluster)?;
    let snapshot = cluster.replicas[primary].dir.join("snapshot");
    let snapshot_bytes = std::fs::metadata(&snapshot)
        .with_context(|| format!("stat {}", snapshot.display()))?
        .len();
    Ok(Setup {
        streams_s,
        sessions_s,
        filler_sessions,
        victim,
        primary,
        commit_before,
        snapshot_bytes,
    })
}

/// The length of each replica's log now: where lines of what follows start.
fn log_ends(cluster: &Cluster) -> anyhow::Result<Vec<u64>> {
    cluster
        .replicas
        .iter()
        .map(|replica| Ok(std::fs::metadata(&replica.log).map_or(0, |m| m.len())))
        .collect()
}

/// The first `offer built` line a replica other than `victim` logged past `ends`, with its index.
fn offer_line(
    cluster: &Cluster,
    victim: usize,
    ends: &[u64],
) -> anyhow::Result<Option<(usize, String)>> {
    for (index, replica) in cluster.replicas.iter().enumerate() {
        if index == victim {
            continue;
        }
        let found = find_lines(&replica.log, ends[index], &[LINE_OFFER], Instant::now())?;
        if let Some(Some(line)) = found.into_iter().next() {
            return Ok(Some((index, line)));
        }
    }
    Ok(None)
}

/// Restarts the victim with the pinger running; times its log lines and convergence.
fn measure(cluster: &mut Cluster, setup: &Setup, args: &Args) -> anyhow::Result<Transfer> {
    let stop = Arc::new(AtomicBool::new(false));
    // Every survivor is pinged: the restart may start a view change that moves the primary.
    let pingers: Vec<_> = cluster
        .running()
        .into_iter()
        .map(|index| {
            let stop = Arc::clone(&stop);
            let pings = Arc::new(Mutex::new(Vec::new()));
            let addr = cluster.replicas[index].client;
            let interval = Duration::from_micros(args.ping_interval_us);
            let thread = {
                let pings = Arc::clone(&pings);
                std::thread::spawn(move || pinger(addr, interval, &stop, &pings))
            };
            (index, pings, thread)
        })
        .collect();
    let baseline_from = Instant::now();
    std::thread::sleep(Duration::from_millis(args.baseline_ms));
    let victim_log = cluster.replicas[setup.victim].log.clone();
    let victim_from = std::fs::metadata(&victim_log)?.len();
    let log_ends = log_ends(cluster)?;
    let anchor = Anchor::now();
    cluster.spawn(setup.victim)?;
    let listening = Instant::now();
    let lines = wait_for_lines(
        &victim_log,
        victim_from,
        &[LINE_ASKING, LINE_CHUNKS, LINE_FETCHED, LINE_INSTALLED],
        anchor.instant + CONVERGE_DEADLINE,
    )?;
    let [asking, chunks, fetched, installed] = [0, 1, 2, 3].map(|i| anchor.instant_of(lines[i].0));
    let commit_after = wait_converged(cluster, setup.commit_before)?;
    let converged = Instant::now();
    std::thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let mut windows = Vec::new();
    for (replica, pings, thread) in pingers {
        let failures = thread
            .join()
            .map_err(|_| anyhow::anyhow!("pinger panicked"))?;
        let pings = pings.lock().expect("pinger lock").clone();
        windows.push(PingWindows {
            replica,
            failures,
            baseline: ping_stats(&pings, baseline_from, anchor.instant),
            during: ping_stats(&pings, asking, installed),
            after_restart: ping_stats(&pings, anchor.instant, converged),
        });
    }
    let (server, offer) = offer_line(cluster, setup.victim, &log_ends)?.unzip();
    let primary_after = agreed_primary(cluster)?;
    let ms = |at: Instant| at.saturating_duration_since(anchor.instant).as_secs_f64() * 1000.0;
    Ok(Transfer {
        listening_ms: ms(listening),
        asking_ms: ms(asking),
        offer_ms: offer
            .as_deref()
            .and_then(line_time)
            .map(|time| ms(anchor.instant_of(time))),
        chunks_ms: ms(chunks),
        fetched_ms: ms(fetched),
        installed_ms: ms(installed),
        converged_ms: ms(converged),
        offer_bytes: offer.as_deref().and_then(|line| field(line, "bytes")),
        checkpoint_op: field(&lines[3].1, "checkpoint_op"),
        server,
        primary_after,
        commit_after,
        pings: windows,
    })
}

fn mb_per_s(bytes: u64, ms: f64) -> f64 {
    if ms <= 0.0 {
        return 0.0;
    }
    bytes as f64 / 1e6 / (ms / 1000.0)
}

/// The figures both outputs print.
struct Figures {
    bytes: u64,
    fetch_ms: f64,
    install_ms: f64,
    tcp_ms: f64,
}

impl Figures {
    fn of(setup: &Setup, transfer: &Transfer, tcp_s: f64) -> Figures {
        Figures {
            bytes: transfer.bytes(setup),
            fetch_ms: transfer.fetched_ms - transfer.asking_ms,
            install_ms: transfer.installed_ms - transfer.asking_ms,
            tcp_ms: tcp_s * 1000.0,
        }
    }

    fn ratio(&self) -> f64 {
        mb_per_s(self.bytes, self.fetch_ms) / mb_per_s(self.bytes, self.tcp_ms)
    }
}

fn print_setup(args: &Args, setup: &Setup, transfer: &Transfer) {
    println!(
        "state transfer on 3 serve processes (1 shard each), loopback: {} streams, {} + {} \
         filler sessions, checkpoint interval {}, journal segments {}",
        args.streams,
        args.sessions,
        setup.filler_sessions,
        args.checkpoint_interval,
        args.journal_segment_size
    );
    println!(
        "setup: streams {:.1} s ({:.0}/s), sessions {:.1} s ({:.0}/s); victim replica {}, \
         primary {}; commit {}, checkpoint_op installed {}, commit after {}",
        setup.streams_s,
        f64::from(args.streams) / setup.streams_s.max(1e-9),
        setup.sessions_s,
        f64::from(args.sessions) / setup.sessions_s.max(1e-9),
        setup.victim,
        setup.primary,
        setup.commit_before,
        transfer
            .checkpoint_op
            .map_or_else(|| "?".to_owned(), |op| op.to_string()),
        transfer.commit_after
    );
    if transfer.server != Some(setup.primary) || transfer.primary_after != setup.primary {
        println!(
            "NOTE: the primary moved (pinged {}, offer from {:?}, primary after {}): a view \
             change during the measurement (see the serving replica's pings below)",
            setup.primary, transfer.server, transfer.primary_after
        );
    }
    println!(
        "checkpoint: primary's snapshot file {} bytes ({:.2} MB); offer artifacts moved {} \
         bytes ({:.2} MB)",
        setup.snapshot_bytes,
        setup.snapshot_bytes as f64 / 1e6,
        transfer.bytes(setup),
        transfer.bytes(setup) as f64 / 1e6
    );
}

fn print_table(args: &Args, setup: &Setup, transfer: &Transfer, tcp_s: f64) {
    let figures = Figures::of(setup, transfer, tcp_s);
    print_setup(args, setup, transfer);
    println!();
    println!(
        "{:<52} {:>10}",
        "since the restart of the lagging replica", "ms"
    );
    let offer = transfer.offer_ms.unwrap_or(f64::NAN);
    for (label, value) in [
        ("listening (process up)", transfer.listening_ms),
        ("asking the primary for its checkpoint", transfer.asking_ms),
        ("primary: offer built (read, decode, encode, hash)", offer),
        ("every chunk fetched and verified", transfer.chunks_ms),
        ("checkpoint fetched and checked", transfer.fetched_ms),
        (
            "checkpoint installed, every shard restored",
            transfer.installed_ms,
        ),
        (
            "metadata converged on all three (polled 20 ms)",
            transfer.converged_ms,
        ),
    ] {
        println!("{label:<52} {value:>10.1}");
    }
    println!();
    println!(
        "{:<52} {:>10} {:>10}",
        "throughput of the moved bytes", "ms", "MB/s"
    );
    for (label, ms) in [
        ("transfer: asking -> fetched", figures.fetch_ms),
        (
            "transfer: offer built -> last chunk (chunks only)",
            transfer.chunks_ms - offer,
        ),
        (
            "restore check (last chunk -> fetched and checked)",
            transfer.fetched_ms - transfer.chunks_ms,
        ),
        ("transfer: asking -> installed", figures.install_ms),
        (
            "plain TCP copy of the same bytes (median of 3)",
            figures.tcp_ms,
        ),
    ] {
        println!(
            "{label:<52} {ms:>10.1} {:>10.1}",
            mb_per_s(figures.bytes, ms)
        );
    }
    println!(
        "ratio transfer (asking -> fetched) / plain TCP: {:.3} (issue 9 goal: at least 0.8)",
        figures.ratio()
    );
    println!();
    println!(
        "pings to each survivor's shard 0, one in flight, {} us apart (* = served the \
         transfer):",
        args.ping_interval_us
    );
    println!(
        "{:<48} {:>7} {:>9} {:>9} {:>9} {:>11}",
        "replica, window", "pings", "p50 ms", "p99 ms", "max ms", "max gap ms"
    );
    for windows in &transfer.pings {
        let mark = if transfer.server == Some(windows.replica) {
            "*"
        } else {
            " "
        };
        for (label, stats) in [
            ("before the restart", windows.baseline),
            ("during the transfer (ask->installed)", windows.during),
            ("restart -> converged", windows.after_restart),
        ] {
            let label = format!("{mark}{} {label}", windows.replica);
            println!(
                "{label:<48} {:>7} {:>9.3} {:>9.3} {:>9.3} {:>11.3}",
                stats.count, stats.p50_ms, stats.p99_ms, stats.max_ms, stats.max_gap_ms
            );
        }
        println!(
            "{:<48} {:>7}",
            format!("{mark}{} failed pings", windows.replica),
            windows.failures
        );
    }
}

fn ping_json(stats: PingStats) -> serde_json::Value {
    serde_json::json!({
        "count": stats.count,
        "p50_ms": stats.p50_ms,
        "p99_ms": stats.p99_ms,
        "max_ms": stats.max_ms,
        "max_gap_ms": stats.max_gap_ms,
    })
}

fn print_json(args: &Args, setup: &Setup, transfer: &Transfer, tcp_s: f64) {
    let figures = Figures::of(setup, transfer, tcp_s);
    let value = serde_json::json!({
        "streams": args.streams,
        "sessions": args.sessions,
        "filler_sessions": setup.filler_sessions,
        "checkpoint_interval": args.checkpoint_interval,
        "journal_segment_size": args.journal_segment_size,
        "setup_streams_s": setup.streams_s,
        "setup_sessions_s": setup.sessions_s,
        "victim": setup.victim,
        "primary": setup.primary,
        "offer_served_by": transfer.server,
        "primary_after": transfer.primary_after,
        "commit_before": setup.commit_before,
        "checkpoint_op": transfer.checkpoint_op,
        "commit_after": transfer.commit_after,
        "snapshot_bytes": setup.snapshot_bytes,
        "offer_bytes": transfer.offer_bytes,
        "since_restart_ms": {
            "listening": transfer.listening_ms,
            "asking": transfer.asking_ms,
            "offer_built": transfer.offer_ms,
            "chunks_verified": transfer.chunks_ms,
            "fetched": transfer.fetched_ms,
            "installed": transfer.installed_ms,
            "converged": transfer.converged_ms,
        },
        "transfer_fetch_ms": figures.fetch_ms,
        "transfer_fetch_mb_per_s": mb_per_s(figures.bytes, figures.fetch_ms),
        "transfer_install_ms": figures.install_ms,
        "transfer_install_mb_per_s": mb_per_s(figures.bytes, figures.install_ms),
        "plain_tcp_ms": figures.tcp_ms,
        "plain_tcp_mb_per_s": mb_per_s(figures.bytes, figures.tcp_ms),
        "ratio_fetch_to_plain_tcp": figures.ratio(),
        "ping_interval_us": args.ping_interval_us,
        "pings": transfer.pings.iter().map(|windows| serde_json::json!({
            "replica": windows.replica,
            "served_the_transfer": transfer.server == Some(windows.replica),
            "failures": windows.failures,
            "before_restart": ping_json(windows.baseline),
            "during_transfer": ping_json(windows.during),
            "restart_to_converged": ping_json(windows.after_restart),
        })).collect::<Vec<_>>(),
    });
    println!("{value:#}");
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.bin.is_file(),
        "{} is not a file; build it with `cargo build --release -p shardline`",
        args.bin.display()
    );
    let root = tempfile::tempdir()?;
    if args.keep_dirs {
        eprintln!("data directories and logs under {}", root.path().display());
    }
    let mut cluster = Cluster::start(&args.bin, root.path(), serve_flags(&args), "info")?;
    let setup = set_up(&mut cluster, &args)?;
    let transfer = measure(&mut cluster, &setup, &args)?;
    drop(cluster);
    let tcp_s = plain_tcp_copy(transfer.bytes(&setup).max(1))?;
    if args.json {
        print_json(&args, &setup, &transfer, tcp_s);
    } else {
        print_table(&args, &setup, &transfer, tcp_s);
    }
    if args.keep_dirs {
        let _ = root.keep();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tracing_timestamp_parses_to_its_unix_time() {
        let line = "2026-12-01T06:51:06.123456Z  INFO shards::vsr: state transfer: asking";
        let time = line_time(line).unwrap();
        // 2026-12-01 is day 20788 since 1970-01-01.
        let expected =
            UNIX_EPOCH + Duration::new(20_788 * 86_400 + 6 * 3600 + 51 * 60 + 6, 123_456_000);
        assert_eq!(time, expected);
    }

    #[test]
    fn tracing_field_is_read_by_its_exact_key() {
        let line = "... state transfer offer built replica=1 checkpoint_op=106496 bytes=5250230";
        assert_eq!(field(line, "bytes"), Some(5_250_230));
        assert_eq!(field(line, "checkpoint_op"), Some(106_496));
        assert_eq!(field(line, "op"), None);
    }

    #[test]
    fn largest_gap_counts_a_stall_across_the_window_edge() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let pings = [
            Ping {
                sent: at(0),
                answered: at(1),
            },
            Ping {
                sent: at(2),
                answered: at(3),
            },
            Ping {
                sent: at(4),
                answered: at(50),
            },
        ];
        let stats = ping_stats(&pings, at(2), at(10));
        assert_eq!(stats.count, 1);
        assert!((stats.max_gap_ms - 47.0).abs() < 1e-6);
    }
}
