//! State transfer throughput over loopback (issue 9 "Targets"): the checkpoint of `--sessions`
//! client sessions (default 100,000) and `--streams` streams (default 10,000) fetched through
//! the real serving side (`shards::vsr::transfer::server::OfferServer`), the real replica wire
//! codec (`shards::vsr::wire`) and the real framing (`bus::read_frame` / `bus::write_frame` on
//! compio sockets), against a plain TCP copy of the same bytes in the same run.
//!
//! In process, two threads: a serving thread (its own compio runtime, as shard 0 of the primary
//! has) answers `RequestStateTransfer` / `RequestStateChunk` frames with `OfferServer`; the
//! fetching side sends one `RequestStateChunk` at a time (one in flight, as the receiver does),
//! reassembles each artifact and verifies its XXH3-128 against the manifest. Round 0 is cold (the
//! offer is built: encode + checksums); the timed rounds are served from the cached offer with a
//! fresh nonce each. The baselines copy the same total bytes over a std `TcpStream`: chunked with
//! one request in flight (same chunk size, a 12-byte request each), and one streaming copy; the
//! chunked copy again on compio sockets (the runtime's share). A last row runs the same transfer
//! path in memory (no socket) to show what its copies and checksums cost on their own.
//!
//! Not measured here: reading the checkpoint from disk and installing it (the driver's part), and
//! the ping gap of a serving primary (needs the driver; see the note). A figure, never an
//! assertion. Usage: `state_transfer [--sessions N] [--streams N] [--chunk-size BYTES]
//! [--rounds N] [--json]`. MB are 10^6 bytes.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use clap::Parser;
use shards::limits::REPLICA_MESSAGE_SIZE_MAX;
use shards::metadata::{MetadataOp, MetadataState};
use shards::vsr::client_table::{CachedReply, ClientTable, ClientTableSnapshot, SessionSnapshot};
use shards::vsr::message::{Message, ReplicaIndex};
use shards::vsr::transfer::server::{
    Offer, OfferServer, STATE_CHUNK_SIZE_MAX_DEFAULT, ServeOutput, ServerConfig,
};
use shards::vsr::transfer::{
    ArtifactKind, Availability, Manifest, TransferTarget, client_table_wire,
};
use shards::vsr::wire;
use twox_hash::XxHash3_128;

const CLUSTER: u128 = 9;
const REPLICA_COUNT: u8 = 3;
const SERVER: ReplicaIndex = 0;
const FETCHER: ReplicaIndex = 1;
const VIEW: u32 = 1;
/// Bytes of a baseline chunk request: offset `u64`, length `u32`.
const PLAIN_REQUEST_SIZE: usize = 12;

#[derive(Debug, Parser)]
#[command(about = "State transfer over loopback against a plain TCP copy (issue 9 Targets)")]
struct Args {
    /// Client sessions in the checkpoint's client table (one cached reply each).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    sessions: u32,
    /// Streams in the checkpoint's metadata (one topic of 4 partitions each).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(1..=100_000))]
    streams: u32,
    /// Largest chunk the fetcher asks for and the server sends (bytes).
    #[arg(long, default_value_t = STATE_CHUNK_SIZE_MAX_DEFAULT, value_parser = clap::value_parser!(u32).range(1..=8_000_000))]
    chunk_size: u32,
    /// Timed rounds of each path (the median is reported).
    #[arg(long, default_value_t = 21, value_parser = clap::value_parser!(u32).range(1..=1000))]
    rounds: u32,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// The checkpoint's state, built through the real types.
struct Checkpoint {
    op: u64,
    metadata: MetadataState,
    client_table: ClientTableSnapshot,
}

/// `streams` streams, each with one topic of 4 partitions, applied as the state machine applies
/// committed ops (ops 1..=2 * streams).
fn metadata_of(streams: u32) -> MetadataState {
    let mut state = MetadataState::new();
    let mut op = 0;
    for stream_id in 1..=streams {
        op += 1;
        let name = format!("stream-{stream_id:06}");
        state.apply(op, &MetadataOp::CreateStream { stream_id, name });
        op += 1;
        let create_topic = MetadataOp::CreateTopic {
            stream_id,
            topic_id: 1,
            name: "events".to_owned(),
            partition_count: 4,
            retention: shards::metadata::Retention::default(),
        };
        state.apply(op, &create_topic);
    }
    state
}

/// `sessions` sessions, each registered at an odd op and holding the reply of its first request
/// committed at the next op (the snapshot a table of registered, active clients takes). Built as
/// a snapshot directly: `ClientTable::register` checks op order against every session (O(n)).
fn client_table_of(sessions: u32, first_op: u64) -> ClientTableSnapshot {
    let sessions = (0..u64::from(sessions))
        .map(|index| {
            let session = first_op + 2 * index;
            let client = u128::from(index + 1) << 64 | 0x5eed;
            SessionSnapshot {
                client: format!("{client:#034x}"),
                session,
                request: 1,
                commit_op: session + 1,
                replies: vec![CachedReply {
                    request: 1,
                    operation: bus::Operation::CreateStream as u8,
                    error_code: 0,
                    offset: 0,
                    count: 0,
                    body: Vec::new(),
                    request_checksum: index.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                }],
            }
        })
        .collect();
    ClientTableSnapshot { sessions }
}

fn checkpoint_of(args: &Args) -> Checkpoint {
    let metadata = metadata_of(args.streams);
    let client_table = client_table_of(args.sessions, metadata.op + 1);
    let op = metadata.op + 2 * u64::from(args.sessions);
    Checkpoint {
        op,
        metadata,
        client_table,
    }
}

async fn send(
    stream: &mut compio::net::TcpStream,
    message: &Message,
    from: ReplicaIndex,
) -> anyhow::Result<()> {
    let bytes = wire::encode(CLUSTER, from, message);
    let compio::BufResult(result, _) = bus::write_frame(stream, bytes).await;
    result.context("write frame")
}

/// Reads one replica frame and decodes it with the wire codec's header and body checks.
async fn receive(stream: &mut compio::net::TcpStream) -> anyhow::Result<Option<Message>> {
    let frame = match bus::read_frame(stream, REPLICA_MESSAGE_SIZE_MAX).await {
        Ok(frame) => frame,
        Err(bus::FrameError::Closed) => return Ok(None),
        Err(error) => return Err(error).context("read frame"),
    };
    wire::check_header(&frame.header, CLUSTER, REPLICA_COUNT).context("frame header")?;
    Ok(Some(
        wire::decode_body(&frame.header, &frame.body).context("frame body")?,
    ))
}

/// What the serving thread measured.
#[derive(Debug, Default)]
struct ServeStats {
    offer_build: Duration,
    offers_built: u64,
    chunks_served: u64,
}

/// The serving side: accepts `connections` connections one after the other and answers each
/// until it closes.
fn serve(
    checkpoint: Arc<Checkpoint>,
    config: ServerConfig,
    connections: u32,
    address: mpsc::Sender<SocketAddr>,
) -> anyhow::Result<ServeStats> {
    let runtime = compio::runtime::Runtime::new().context("serving runtime")?;
    runtime.block_on(async move {
        let listener = compio::net::TcpListener::bind("127.0.0.1:0").await?;
        address.send(listener.local_addr()?)?;
        let mut server = OfferServer::new(SERVER, config);
        let mut stats = ServeStats::default();
        for _ in 0..connections {
            let (mut stream, _) = listener.accept().await?;
            stream.set_nodelay(true)?;
            while let Some(message) = receive(&mut stream).await? {
                let outputs = route(&mut server, &checkpoint, message, &mut stats);
                for message in outputs {
                    send(&mut stream, &message, SERVER).await?;
                }
            }
        }
        stats.offers_built = server.offers_built();
        stats.chunks_served = server.chunks_served();
        Ok(stats)
    })
}

/// One request through the server; an offer build it asks for runs inline (timed).
fn route(
    server: &mut OfferServer,
    checkpoint: &Checkpoint,
    message: Message,
    stats: &mut ServeStats,
) -> Vec<Message> {
    let availability = Availability::Available {
        checkpoint_op: checkpoint.op,
    };
    let mut outputs = match message {
        Message::RequestStateTransfer { nonce, .. } => {
            server.on_request_transfer(FETCHER, nonce, availability, VIEW, 0)
        }
        Message::RequestStateChunk {
            nonce,
            artifact,
            offset,
            len,
            ..
        } => server.on_request_chunk(FETCHER, nonce, artifact, offset, len, VIEW, 0),
        other => panic!("the fetcher sends only requests, got {other:?}"),
    };
    let mut messages = Vec::new();
    while let Some(output) = outputs.pop() {
        match output {
            ServeOutput::Send { message, .. } => messages.push(message),
            ServeOutput::BuildOffer { checkpoint_op } => {
                let started = Instant::now();
                let offer = Offer::build(
                    checkpoint_op,
                    &checkpoint.metadata,
                    &checkpoint.client_table,
                )
                .map_err(|error| error.unavailable_reason());
                stats.offer_build += started.elapsed();
                outputs.extend(server.offer_built(checkpoint_op, offer, VIEW, 0));
            }
        }
    }
    messages
}

/// One fetch as the receiver does it: the target, then every artifact chunk by chunk, one in
/// flight, each verified against the manifest. Returns the artifacts.
async fn fetch(
    address: SocketAddr,
    nonce: u64,
    chunk_size: u32,
) -> anyhow::Result<Vec<(ArtifactKind, Vec<u8>)>> {
    let mut stream = compio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    send(
        &mut stream,
        &Message::RequestStateTransfer { view: VIEW, nonce },
        FETCHER,
    )
    .await?;
    let manifest = match receive(&mut stream)
        .await?
        .context("closed before the target")?
    {
        Message::StateTransferTarget {
            target: TransferTarget::Available { manifest, .. },
            ..
        } => manifest,
        other => bail!("expected an offer, got {other:?}"),
    };
    let mut artifacts = Vec::new();
    for entry in &manifest.entries {
        let bytes = fetch_artifact(&mut stream, nonce, &manifest, entry.kind, chunk_size).await?;
        ensure!(
            XxHash3_128::oneshot(&bytes) == entry.checksum,
            "{} checksum mismatch",
            entry.kind.name()
        );
        artifacts.push((entry.kind, bytes));
    }
    Ok(artifacts)
}

async fn fetch_artifact(
    stream: &mut compio::net::TcpStream,
    nonce: u64,
    manifest: &Manifest,
    artifact: ArtifactKind,
    chunk_size: u32,
) -> anyhow::Result<Vec<u8>> {
    let len = manifest.entry(artifact).context("in the manifest")?.len;
    let mut bytes = Vec::with_capacity(len as usize);
    while (bytes.len() as u64) < len {
        let offset = bytes.len() as u64;
        let request = Message::RequestStateChunk {
            view: VIEW,
            nonce,
            artifact,
            offset,
            len: chunk_size,
        };
        send(stream, &request, FETCHER).await?;
        match receive(stream).await?.context("closed before a chunk")? {
            Message::StateChunk {
                nonce: chunk_nonce,
                artifact: chunk_artifact,
                offset: chunk_offset,
                payload,
                ..
            } if chunk_nonce == nonce
                && chunk_artifact == artifact
                && chunk_offset == offset
                && !payload.is_empty() =>
            {
                bytes.extend_from_slice(&payload);
            }
            other => bail!(
                "expected chunk {offset} of {}, got {other:?}",
                artifact.name()
            ),
        }
    }
    ensure!(bytes.len() as u64 == len, "{} overran", artifact.name());
    Ok(bytes)
}

/// Decodes what was fetched as the receiver would before installing, and checks it is the
/// checkpoint that was served.
fn check_fetched(
    checkpoint: &Checkpoint,
    artifacts: &[(ArtifactKind, Vec<u8>)],
) -> anyhow::Result<()> {
    for (kind, bytes) in artifacts {
        match kind {
            ArtifactKind::Metadata => {
                let metadata: MetadataState = serde_json::from_slice(bytes)?;
                ensure!(metadata == checkpoint.metadata, "metadata differs");
            }
            ArtifactKind::ClientTable => {
                let clients_max = checkpoint.client_table.sessions.len();
                let table = client_table_wire::decode(bytes, clients_max)?;
                ensure!(table == checkpoint.client_table, "client table differs");
                ClientTable::from_snapshot(&table, clients_max)
                    .map_err(anyhow::Error::msg)
                    .context("client table restorable")?;
            }
        }
    }
    Ok(())
}

/// The CPU cost of the transfer path without sockets: every chunk of the cached offer through
/// `OfferServer`, `wire::encode`, `wire::decode` and reassembly, then the artifact checksums
/// (median of `rounds`). Tells how much of the loopback time is the path's copies and hashes.
fn measure_in_memory(
    checkpoint: &Checkpoint,
    chunk_size: u32,
    rounds: u32,
) -> anyhow::Result<Vec<Duration>> {
    let config = ServerConfig {
        chunk_size_max: chunk_size,
        frame_size_max: REPLICA_MESSAGE_SIZE_MAX,
        chunk_timeout_ticks: 100,
    };
    let mut server = OfferServer::new(SERVER, config);
    let mut stats = ServeStats::default();
    let mut times = Vec::new();
    for round in 0..=rounds {
        let nonce = u64::from(round) + 1;
        let started = Instant::now();
        let request = Message::RequestStateTransfer { view: VIEW, nonce };
        let manifest = match route(&mut server, checkpoint, request, &mut stats).pop() {
            Some(Message::StateTransferTarget {
                target: TransferTarget::Available { manifest, .. },
                ..
            }) => manifest,
            other => bail!("expected an offer, got {other:?}"),
        };
        for entry in &manifest.entries {
            let mut bytes = Vec::with_capacity(entry.len as usize);
            while (bytes.len() as u64) < entry.len {
                let request = Message::RequestStateChunk {
                    view: VIEW,
                    nonce,
                    artifact: entry.kind,
                    offset: bytes.len() as u64,
                    len: chunk_size,
                };
                let chunk = route(&mut server, checkpoint, request, &mut stats).pop();
                let frame = wire::encode(CLUSTER, SERVER, &chunk.context("a chunk")?);
                match wire::decode(&frame, CLUSTER, REPLICA_COUNT)? {
                    (_, Message::StateChunk { payload, .. }) => bytes.extend_from_slice(&payload),
                    (_, other) => bail!("expected a chunk, got {other:?}"),
                }
            }
            ensure!(XxHash3_128::oneshot(&bytes) == entry.checksum, "checksum");
        }
        if round > 0 {
            times.push(started.elapsed());
        }
    }
    Ok(times)
}

/// Reference costs on this machine: one copy (into a fresh buffer, as the path's `to_vec`s do)
/// and one XXH3-128 of `bytes` (medians of `rounds`): the in-memory path makes five copies of
/// each chunk (server `to_vec`, wire body, sealed frame, decoded payload, reassembly) and three
/// checksums (frame body sealed and verified, artifact), so these bound what it can cost.
fn measure_reference(bytes: &[u8], rounds: u32) -> (Duration, Duration) {
    let mut copies = Vec::new();
    let mut hashes = Vec::new();
    for _ in 0..rounds {
        let started = Instant::now();
        let copy = std::hint::black_box(bytes.to_vec());
        copies.push(started.elapsed());
        drop(copy);
        let started = Instant::now();
        std::hint::black_box(XxHash3_128::oneshot(std::hint::black_box(bytes)));
        hashes.push(started.elapsed());
    }
    (median(&mut copies), median(&mut hashes))
}

/// The median of `samples` (sorted in place).
fn median(samples: &mut [Duration]) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}

/// Timed fetches through the real path: a cold one (offer build), then `rounds` from the cache.
struct TransferTimes {
    cold: Duration,
    rounds: Vec<Duration>,
    decode: Duration,
    stats: ServeStats,
}

fn measure_transfer(checkpoint: &Arc<Checkpoint>, args: &Args) -> anyhow::Result<TransferTimes> {
    let config = ServerConfig {
        chunk_size_max: args.chunk_size,
        frame_size_max: REPLICA_MESSAGE_SIZE_MAX,
        chunk_timeout_ticks: 100,
    };
    let (address_tx, address_rx) = mpsc::channel();
    let serving = Arc::clone(checkpoint);
    let connections = args.rounds + 1;
    let server = std::thread::spawn(move || serve(serving, config, connections, address_tx));
    let address = address_rx
        .recv()
        .context("serving thread failed to listen")?;
    let runtime = compio::runtime::Runtime::new().context("fetching runtime")?;
    let started = Instant::now();
    let artifacts = runtime.block_on(fetch(address, 1, args.chunk_size))?;
    let cold = started.elapsed();
    let started = Instant::now();
    check_fetched(checkpoint, &artifacts)?;
    let decode = started.elapsed();
    let mut rounds = Vec::new();
    for round in 0..args.rounds {
        let started = Instant::now();
        let artifacts = runtime.block_on(fetch(address, u64::from(round) + 2, args.chunk_size))?;
        rounds.push(started.elapsed());
        ensure!(artifacts.iter().map(|(_, b)| b.len()).sum::<usize>() > 0);
    }
    let stats = server
        .join()
        .map_err(|_| anyhow::anyhow!("serving thread panicked"))??;
    Ok(TransferTimes {
        cold,
        rounds,
        decode,
        stats,
    })
}

/// The plain TCP baselines over std sockets: `chunk_size` > 0 answers 12-byte requests one at a
/// time; 0 streams everything at once. Returns one duration per round.
fn measure_plain(
    bytes: &Arc<Vec<u8>>,
    chunk_size: u32,
    rounds: u32,
) -> anyhow::Result<Vec<Duration>> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    let address = listener.local_addr()?;
    let served = Arc::clone(bytes);
    let connections = rounds + 1;
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        for _ in 0..connections {
            let (mut stream, _) = listener.accept()?;
            stream.set_nodelay(true)?;
            if chunk_size == 0 {
                stream.write_all(&served)?;
            } else {
                serve_plain_chunks(&mut stream, &served)?;
            }
        }
        Ok(())
    });
    let mut times = Vec::new();
    for round in 0..connections {
        let started = Instant::now();
        let copy = fetch_plain(address, bytes.len(), chunk_size)?;
        if round > 0 {
            times.push(started.elapsed());
        }
        ensure!(
            copy.len() == bytes.len() && copy[..] == bytes[..],
            "plain copy differs"
        );
    }
    server
        .join()
        .map_err(|_| anyhow::anyhow!("plain server panicked"))??;
    Ok(times)
}

/// The chunked plain copy on compio sockets (the runtime the transfer path runs on): the same
/// 12-byte requests, one in flight, written from and read into whole buffers without copies.
/// Separates the runtime's share of the transfer's time from the wire path's.
fn measure_plain_compio(
    bytes: &'static [u8],
    chunk_size: u32,
    rounds: u32,
) -> anyhow::Result<Vec<Duration>> {
    let (address_tx, address_rx) = mpsc::channel();
    let connections = rounds + 1;
    let server = std::thread::spawn(move || -> anyhow::Result<()> {
        let runtime = compio::runtime::Runtime::new()?;
        runtime.block_on(async move {
            let listener = compio::net::TcpListener::bind("127.0.0.1:0").await?;
            address_tx.send(listener.local_addr()?)?;
            for _ in 0..connections {
                let (mut stream, _) = listener.accept().await?;
                stream.set_nodelay(true)?;
                serve_plain_chunks_compio(&mut stream, bytes).await?;
            }
            Ok(())
        })
    });
    let address = address_rx
        .recv()
        .context("plain compio server failed to listen")?;
    let runtime = compio::runtime::Runtime::new()?;
    let mut times = Vec::new();
    for round in 0..connections {
        let started = Instant::now();
        let copy = runtime.block_on(fetch_plain_compio(address, bytes.len(), chunk_size))?;
        if round > 0 {
            times.push(started.elapsed());
        }
        ensure!(copy[..] == bytes[..], "plain compio copy differs");
    }
    server
        .join()
        .map_err(|_| anyhow::anyhow!("plain compio server panicked"))??;
    Ok(times)
}

async fn serve_plain_chunks_compio(
    stream: &mut compio::net::TcpStream,
    bytes: &'static [u8],
) -> anyhow::Result<()> {
    use compio::buf::IoBuf as _;
    use compio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut request = [0u8; PLAIN_REQUEST_SIZE];
    loop {
        let compio::BufResult(result, buffer) = stream.read_exact(request).await;
        request = buffer;
        match result {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let offset = u64::from_le_bytes(request[..8].try_into()?) as usize;
        let len = u32::from_le_bytes(request[8..].try_into()?) as usize;
        let end = (offset + len).min(bytes.len());
        stream.write_all(bytes.slice(offset..end)).await.0?;
    }
}

async fn fetch_plain_compio(
    address: SocketAddr,
    total: usize,
    chunk_size: u32,
) -> anyhow::Result<Vec<u8>> {
    use compio::buf::{IntoInner as _, IoBuf as _};
    use compio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = compio::net::TcpStream::connect(address).await?;
    stream.set_nodelay(true)?;
    let mut copy = Vec::with_capacity(total);
    while copy.len() < total {
        let offset = copy.len();
        let len = (total - offset).min(chunk_size as usize);
        let mut request = [0u8; PLAIN_REQUEST_SIZE];
        request[..8].copy_from_slice(&(offset as u64).to_le_bytes());
        request[8..].copy_from_slice(&(len as u32).to_le_bytes());
        stream.write_all(request).await.0?;
        let compio::BufResult(result, slice) =
            stream.read_exact(copy.slice(offset..offset + len)).await;
        copy = slice.into_inner();
        result?;
    }
    Ok(copy)
}

fn serve_plain_chunks(stream: &mut TcpStream, bytes: &[u8]) -> anyhow::Result<()> {
    let mut request = [0u8; PLAIN_REQUEST_SIZE];
    loop {
        match stream.read_exact(&mut request) {
            Ok(()) => {}
            Err(error) if error.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(()),
            Err(error) => return Err(error.into()),
        }
        let offset = u64::from_le_bytes(request[..8].try_into()?) as usize;
        let len = u32::from_le_bytes(request[8..].try_into()?) as usize;
        let end = (offset + len).min(bytes.len());
        stream.write_all(&bytes[offset..end])?;
    }
}

fn fetch_plain(address: SocketAddr, total: usize, chunk_size: u32) -> anyhow::Result<Vec<u8>> {
    let mut stream = TcpStream::connect(address)?;
    stream.set_nodelay(true)?;
    let mut copy = vec![0u8; total];
    if chunk_size == 0 {
        stream.read_exact(&mut copy)?;
        return Ok(copy);
    }
    let mut offset = 0;
    while offset < total {
        let len = (total - offset).min(chunk_size as usize);
        let mut request = [0u8; PLAIN_REQUEST_SIZE];
        request[..8].copy_from_slice(&(offset as u64).to_le_bytes());
        request[8..].copy_from_slice(&(len as u32).to_le_bytes());
        stream.write_all(&request)?;
        stream.read_exact(&mut copy[offset..offset + len])?;
        offset += len;
    }
    Ok(copy)
}

/// One row of the report: the median and the best of its rounds.
struct Row {
    path: &'static str,
    bytes: u64,
    seconds: f64,
    seconds_best: f64,
}

impl Row {
    fn new(path: &'static str, bytes: u64, rounds: &[Duration]) -> Row {
        let mut sorted = rounds.to_vec();
        Row {
            path,
            bytes,
            seconds: median(&mut sorted).as_secs_f64(),
            seconds_best: sorted[0].as_secs_f64(),
        }
    }

    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
    }

    fn mb_per_s_best(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds_best
    }
}

/// Everything one run measured.
struct Report {
    artifact_bytes: Vec<u64>,
    rows: Vec<Row>,
    transfer: TransferTimes,
    state_build: Duration,
    /// One copy and one XXH3-128 of all the bytes ([`measure_reference`]).
    reference: (Duration, Duration),
}

impl Report {
    /// State transfer (cached) median MB/s over the plain chunked copy's and the streaming one's.
    fn ratios(&self) -> (f64, f64) {
        let transfer = self.rows[0].mb_per_s();
        (
            transfer / self.rows[2].mb_per_s(),
            transfer / self.rows[3].mb_per_s(),
        )
    }

    fn print_table(&self, args: &Args) {
        println!(
            "state transfer over loopback: {} sessions, {} streams; artifacts {:?} bytes \
             (metadata, client table); chunk {} B; median of {} rounds",
            args.sessions, args.streams, self.artifact_bytes, args.chunk_size, args.rounds
        );
        println!(
            "{:<38} {:>10} {:>9} {:>8} {:>9} {:>8} {:>6}",
            "path", "bytes", "median s", "MB/s", "best s", "MB/s", "ratio"
        );
        for row in &self.rows {
            println!(
                "{:<38} {:>10} {:>9.5} {:>8.1} {:>9.5} {:>8.1} {:>6.2}",
                row.path,
                row.bytes,
                row.seconds,
                row.mb_per_s(),
                row.seconds_best,
                row.mb_per_s_best(),
                self.rows[0].mb_per_s() / row.mb_per_s()
            );
        }
        let (chunked, streaming) = self.ratios();
        println!(
            "ratio = state transfer (cached) median MB/s over the row's: {chunked:.2}x of the \
             chunked copy, {streaming:.2}x of the streaming copy (goal >= 0.8)"
        );
        println!(
            "offer build (encode + XXH3-128): {:.5} s; receiver decode + restore check: {:.5} s; \
             state setup: {:.3} s; offers built {}, chunks served {}",
            self.transfer.stats.offer_build.as_secs_f64(),
            self.transfer.decode.as_secs_f64(),
            self.state_build.as_secs_f64(),
            self.transfer.stats.offers_built,
            self.transfer.stats.chunks_served
        );
        println!(
            "reference on this machine, all bytes once: one copy {:.5} s, one XXH3-128 {:.5} s \
             (the in-memory path makes 5 copies and 3 checksums)",
            self.reference.0.as_secs_f64(),
            self.reference.1.as_secs_f64()
        );
    }

    fn print_json(&self, args: &Args) {
        let paths: Vec<serde_json::Value> = self
            .rows
            .iter()
            .map(|row| {
                serde_json::json!({
                    "path": row.path,
                    "bytes": row.bytes,
                    "seconds_median": row.seconds,
                    "mb_per_s_median": row.mb_per_s(),
                    "seconds_best": row.seconds_best,
                    "mb_per_s_best": row.mb_per_s_best(),
                })
            })
            .collect();
        let (chunked, streaming) = self.ratios();
        let report = serde_json::json!({
            "sessions": args.sessions,
            "streams": args.streams,
            "chunk_size": args.chunk_size,
            "rounds": args.rounds,
            "artifact_bytes": self.artifact_bytes,
            "paths": paths,
            "ratio_vs_plain_chunked": chunked,
            "ratio_vs_plain_streaming": streaming,
            "offer_build_s": self.transfer.stats.offer_build.as_secs_f64(),
            "receiver_decode_s": self.transfer.decode.as_secs_f64(),
            "reference_copy_s": self.reference.0.as_secs_f64(),
            "reference_xxh3_128_s": self.reference.1.as_secs_f64(),
            "offers_built": self.transfer.stats.offers_built,
            "chunks_served": self.transfer.stats.chunks_served,
        });
        println!("{report}");
    }
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let started = Instant::now();
    let checkpoint = Arc::new(checkpoint_of(&args));
    let state_build = started.elapsed();
    let offer = Offer::build(
        checkpoint.op,
        &checkpoint.metadata,
        &checkpoint.client_table,
    )?;
    let artifact_bytes: Vec<u64> = offer.manifest().entries.iter().map(|e| e.len).collect();
    let total: u64 = offer.manifest().total_len();
    let plain_bytes: Arc<Vec<u8>> = Arc::new(
        ArtifactKind::ALL
            .iter()
            .filter_map(|&kind| offer.artifact(kind))
            .flatten()
            .copied()
            .collect(),
    );
    drop(offer);

    let transfer = measure_transfer(&checkpoint, &args)?;
    let plain_chunked = measure_plain(&plain_bytes, args.chunk_size, args.rounds)?;
    let plain_streaming = measure_plain(&plain_bytes, 0, args.rounds)?;
    let static_bytes: &'static [u8] = Box::leak(plain_bytes.to_vec().into_boxed_slice());
    let plain_compio = measure_plain_compio(static_bytes, args.chunk_size, args.rounds)?;
    let in_memory = measure_in_memory(&checkpoint, args.chunk_size, args.rounds)?;
    let reference = measure_reference(&plain_bytes, args.rounds);
    let rows = vec![
        Row::new("state transfer (cached offer)", total, &transfer.rounds),
        Row::new(
            "state transfer (cold: + offer build)",
            total,
            &[transfer.cold],
        ),
        Row::new("plain TCP, chunked, 1 in flight", total, &plain_chunked),
        Row::new("plain TCP, streaming", total, &plain_streaming),
        Row::new("plain TCP, chunked, compio sockets", total, &plain_compio),
        Row::new("transfer path in memory (no socket)", total, &in_memory),
    ];
    let report = Report {
        artifact_bytes,
        rows,
        transfer,
        state_build,
        reference,
    };
    if args.json {
        report.print_json(&args);
    } else {
        report.print_table(&args);
    }
    Ok(())
}
