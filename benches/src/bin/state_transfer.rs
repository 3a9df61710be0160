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
//! one request in flight (same chunk size, a 12-byte request each), and one streaming copy.
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
    #[arg(long, default_value_t = 7, value_parser = clap::value_parser!(u32).range(1..=1000))]
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

/// One row of the report.
struct Row {
    path: &'static str,
    bytes: u64,
    seconds: f64,
}

impl Row {
    fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / 1e6 / self.seconds
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

    let rows = [
        Row {
            path: "state transfer (cached offer)",
            bytes: total,
            seconds: median(&mut transfer.rounds.clone()).as_secs_f64(),
        },
        Row {
            path: "state transfer (cold: + offer build)",
            bytes: total,
            seconds: transfer.cold.as_secs_f64(),
        },
        Row {
            path: "plain TCP, chunked, 1 in flight",
            bytes: total,
            seconds: median(&mut plain_chunked.clone()).as_secs_f64(),
        },
        Row {
            path: "plain TCP, streaming",
            bytes: total,
            seconds: median(&mut plain_streaming.clone()).as_secs_f64(),
        },
    ];
    let ratio_chunked = rows[0].mb_per_s() / rows[2].mb_per_s();
    let ratio_streaming = rows[0].mb_per_s() / rows[3].mb_per_s();
    if args.json {
        print_json(
            &args,
            &rows,
            &transfer,
            &artifact_bytes,
            ratio_chunked,
            ratio_streaming,
        );
    } else {
        print_table(
            &args,
            &rows,
            &transfer,
            &artifact_bytes,
            state_build,
            ratio_chunked,
            ratio_streaming,
        );
    }
    Ok(())
}

fn print_table(
    args: &Args,
    rows: &[Row],
    transfer: &TransferTimes,
    artifact_bytes: &[u64],
    state_build: Duration,
    ratio_chunked: f64,
    ratio_streaming: f64,
) {
    println!(
        "state transfer over loopback: {} sessions, {} streams; artifacts {:?} bytes (metadata, \
         client table); chunk {} B; median of {} rounds",
        args.sessions, args.streams, artifact_bytes, args.chunk_size, args.rounds
    );
    println!(
        "{:<38} {:>12} {:>10} {:>10} {:>8}",
        "path", "bytes", "seconds", "MB/s", "ratio"
    );
    for row in rows {
        println!(
            "{:<38} {:>12} {:>10.5} {:>10.1} {:>8.2}",
            row.path,
            row.bytes,
            row.seconds,
            row.mb_per_s(),
            rows[0].mb_per_s() / row.mb_per_s()
        );
    }
    println!(
        "ratio = state transfer (cached) MB/s over the row's: {ratio_chunked:.2}x of the chunked \
         copy, {ratio_streaming:.2}x of the streaming copy (goal >= 0.8)"
    );
    println!(
        "offer build (encode + XXH3-128): {:.5} s; receiver decode + restore check: {:.5} s; \
         state setup: {:.3} s; offers built {}, chunks served {}",
        transfer.stats.offer_build.as_secs_f64(),
        transfer.decode.as_secs_f64(),
        state_build.as_secs_f64(),
        transfer.stats.offers_built,
        transfer.stats.chunks_served
    );
}

fn print_json(
    args: &Args,
    rows: &[Row],
    transfer: &TransferTimes,
    artifact_bytes: &[u64],
    ratio_chunked: f64,
    ratio_streaming: f64,
) {
    let paths: Vec<serde_json::Value> = rows
        .iter()
        .map(|row| {
            serde_json::json!({
                "path": row.path,
                "bytes": row.bytes,
                "seconds": row.seconds,
                "mb_per_s": row.mb_per_s(),
            })
        })
        .collect();
    let report = serde_json::json!({
        "sessions": args.sessions,
        "streams": args.streams,
        "chunk_size": args.chunk_size,
        "rounds": args.rounds,
        "artifact_bytes": artifact_bytes,
        "paths": paths,
        "ratio_vs_plain_chunked": ratio_chunked,
        "ratio_vs_plain_streaming": ratio_streaming,
        "offer_build_s": transfer.stats.offer_build.as_secs_f64(),
        "receiver_decode_s": transfer.decode.as_secs_f64(),
        "offers_built": transfer.stats.offers_built,
        "chunks_served": transfer.stats.chunks_served,
    });
    println!("{report}");
}
