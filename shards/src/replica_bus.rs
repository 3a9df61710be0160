//! The replica links of shard 0 (issue 8 section 2, "Replica links"): every replica listens on
//! its own replica address and connects to every other replica. A connection carries frames one
//! way: the connecting side writes (its outbound queue to that peer), the accepting side reads
//! (the peer's messages to us). Each replica thus holds one outbound and one inbound connection
//! per peer, and a dead connection in one direction never stalls the other.
//!
//! The first frame on every connection is a `Hello` (cluster id, replica index, the sender's
//! client address, the checksum of the sender's `--addresses` list). A connection whose Hello
//! names another cluster, an index outside `0..replica_count`, or our own index, or whose list
//! checksum differs from ours (a replica started with a different `--addresses`), is closed with
//! one log line (rate-limited per reason). Every later frame is a 256-byte checksummed `bus`
//! header plus body, size-limited, decoded by the caller's decoder (the wire codec,
//! `crate::vsr::wire`); a frame that fails any check closes that one link with one log line, and
//! the peer reconnects.
//!
//! Bounded memory against misbehaving or hostile connections: at most
//! `limits::replica_inbound_links_max(replica_count)` inbound links at once (more are closed on
//! accept), at most one established link per peer index (a newer link whose Hello passed every
//! check replaces the older one, which is closed), a body is read in chunks as it arrives (never
//! allocated in full from the header's `size`), and once a header arrived the rest of its frame
//! must arrive within `limits::REPLICA_FRAME_REST_TIMEOUT`.
//!
//! Never blocks shard 0: sends go into a bounded per-peer queue (`try_send`: a full queue drops
//! the frame and counts it; the protocol retries on its own timers); inbound messages go to the
//! driver through a bounded channel (full: dropped and counted). Runs on shard 0's compio
//! runtime; `!Send`.
//!
//! A link that is down drops its frames, as a network would: the queue holds frames only while
//! the outbound link is connected (a live but slow link keeps the bounded-queue rule above).
//! `send` to a peer whose link is not connected drops the frame and counts it, and the frames
//! still queued when a write fails are dropped with it, so a restarted replica never receives a
//! burst of traffic from before its restart and a dead peer pins no memory. VSR tolerates the
//! loss: every message it needs is retransmitted on its own timers (DESIGN section 4: "consensus
//! frames may be dropped because VSR retransmits"; Viewstamped Replication Revisited, Liskov and
//! Cowling 2012, assumes a network that may lose, delay or reorder messages).
//! The drops are counted (`BusCounters::link_down_dropped`) and logged at debug with the peer's
//! address, once per reconnect attempt.
//!
//! A peer's Hello ends the wait before reconnecting to it: when the accept side accepts a Hello
//! from replica `i`, the connect loop to `i` resets its backoff and connects at once instead of
//! sleeping out up to `RECONNECT_BACKOFF_MAX`. A restarted replica is thus reachable as soon as it
//! can reach us, so its first heartbeat from the primary is not held back by our backoff (without
//! this a restarted backup could time out on the primary and start a needless view change).

use std::cell::{Cell, RefCell};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bus::{Command, FrameError, Header};
use compio::io::AsyncWrite;
use compio::net::{TcpListener, TcpStream};
use crossfire::mpsc::Array;
use crossfire::{AsyncRx, MAsyncTx};
use socket2::{Domain, Protocol, Socket, Type};

use compio::BufResult;
use compio::buf::{IntoInner, IoBuf};
use compio::io::AsyncRead;
use futures_util::future::{AbortHandle, Abortable};

use crate::limits::{
    REPLICA_BODY_READ_CHUNK_BYTES, REPLICA_LINK_LOG_INTERVAL, REPLICA_LINK_REFUSED_WINDOW,
};
use crate::vsr::message::ReplicaIndex;
use crate::vsr::wire::{HELLO_ADDRESS_BYTES_MAX, addresses_checksum, addresses_text};

/// Frames a peer's outbound queue holds before further sends to it are dropped.
pub const PEER_QUEUE_FRAMES_MAX: usize = 1024;
/// First wait before reconnecting to a peer; doubles per failed attempt up to
/// [`RECONNECT_BACKOFF_MAX`]. A Hello from that peer ends any wait at once (module docs).
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
/// Longest wait between reconnect attempts to a peer that is down or refuses our Hello.
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long the listener retries binding an address in use (a replica restarted a moment ago).
const BIND_RETRY_MAX: Duration = Duration::from_secs(10);
const BIND_RETRY_SLEEP: Duration = Duration::from_millis(50);
/// Longest a connection may take to send its Hello before it is closed.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The same refusal reason is logged at most once per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Largest first frame accepted (bytes): a Hello is a header plus a client address, so a
/// connection announcing more is refused before any of its body is read.
const HELLO_FRAME_SIZE_MAX: u32 = (bus::HEADER_SIZE + HELLO_ADDRESS_BYTES_MAX) as u32;

/// The first frame on a replica link: who is speaking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub cluster: u128,
    pub replica: ReplicaIndex,
    /// The sender's client listen address (`--listen`), for `NotPrimary` replies.
    pub client_address: String,
    /// `wire::addresses_checksum` of the sender's `--addresses` list.
    pub addresses_checksum: u64,
}

impl Hello {
    /// The Hello frame (`crate::vsr::wire::encode_hello`): header `command = Hello`,
    /// `cluster`, `replica`, `offset = addresses_checksum`; body = the client address as UTF-8.
    ///
    /// # Panics
    /// An address longer than `wire::HELLO_ADDRESS_BYTES_MAX` (a config bug).
    pub fn encode(&self) -> Vec<u8> {
        crate::vsr::wire::encode_hello(
            self.cluster,
            self.replica,
            &self.client_address,
            self.addresses_checksum,
        )
    }

    /// The Hello a verified frame carries.
    ///
    /// # Errors
    /// The frame is another command, or its body is not a UTF-8 address within the limit.
    pub fn decode(header: &Header, body: &[u8]) -> Result<Hello, LinkRefusal> {
        if header.command != Command::Hello as u8 {
            return Err(LinkRefusal::NotHello {
                command: header.command,
            });
        }
        let fields = crate::vsr::wire::decode_hello_body(header, body)
            .map_err(|error| LinkRefusal::Malformed(error.to_string()))?;
        Ok(Hello {
            cluster: header.cluster,
            replica: header.replica,
            client_address: fields.client_address,
            addresses_checksum: fields.addresses_checksum,
        })
    }
}

/// Why a link was closed; each is logged once (rate-limited) and only that link closes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LinkRefusal {
    #[error("first frame is command {command}, not Hello")]
    NotHello { command: u8 },
    #[error("hello from cluster {theirs:#x}, this replica is in cluster {ours:#x}")]
    WrongCluster { ours: u128, theirs: u128 },
    #[error("hello from replica index {index}, outside 0..{replica_count}")]
    UnknownReplica { index: u8, replica_count: u8 },
    #[error("hello from replica index {index}, which is this replica's own index")]
    OwnIndex { index: u8 },
    #[error("frame from replica {from} names cluster {theirs:#x}, not {ours:#x}")]
    FrameWrongCluster {
        from: ReplicaIndex,
        ours: u128,
        theirs: u128,
    },
    #[error("malformed frame: {0}")]
    Malformed(String),
    #[error("no hello within {0:?}")]
    HelloTimeout(Duration),
    #[error(
        "replica {index}'s --addresses differ from this replica's: every replica must be started \
         with the same --addresses list in the same order (this replica's list: {ours})"
    )]
    AddressesDiffer { index: u8, ours: String },
    #[error(
        "frame stalled: {received} of its {expected} body bytes within {timeout:?} of its header"
    )]
    FrameRestTimeout {
        timeout: Duration,
        received: usize,
        expected: usize,
    },
    #[error("{max} inbound replica links are open already (2 per replica plus a few spare)")]
    TooManyLinks { max: usize },
}

impl LinkRefusal {
    /// A short key for rate-limiting the log line.
    fn kind(&self) -> &'static str {
        match self {
            LinkRefusal::NotHello { .. } => "not_hello",
            LinkRefusal::WrongCluster { .. } | LinkRefusal::FrameWrongCluster { .. } => {
                "wrong_cluster"
            }
            LinkRefusal::UnknownReplica { .. } => "unknown_replica",
            LinkRefusal::OwnIndex { .. } => "own_index",
            LinkRefusal::Malformed(_) => "malformed",
            LinkRefusal::HelloTimeout(_) => "hello_timeout",
            LinkRefusal::AddressesDiffer { .. } => "addresses_differ",
            LinkRefusal::FrameRestTimeout { .. } => "frame_rest_timeout",
            LinkRefusal::TooManyLinks { .. } => "too_many_links",
        }
    }
}

/// Checks a peer's Hello against this replica's identity (issue 8 section 2: a frame from
/// another cluster or an unknown index is dropped with a log line) and its configuration (the
/// same `--addresses` list: `addresses_checksum` is `wire::addresses_checksum(addresses)`).
///
/// # Errors
/// `WrongCluster`, `UnknownReplica` (index not below `addresses.len()`), `OwnIndex`,
/// `AddressesDiffer`, in that order.
pub fn check_hello(
    hello: &Hello,
    cluster: u128,
    replica: ReplicaIndex,
    addresses: &[SocketAddr],
) -> Result<(), LinkRefusal> {
    let replica_count = u8::try_from(addresses.len()).unwrap_or(u8::MAX);
    if hello.cluster != cluster {
        return Err(LinkRefusal::WrongCluster {
            ours: cluster,
            theirs: hello.cluster,
        });
    }
    if hello.replica >= replica_count {
        return Err(LinkRefusal::UnknownReplica {
            index: hello.replica,
            replica_count,
        });
    }
    if hello.replica == replica {
        return Err(LinkRefusal::OwnIndex {
            index: hello.replica,
        });
    }
    if hello.addresses_checksum != addresses_checksum(addresses) {
        return Err(LinkRefusal::AddressesDiffer {
            index: hello.replica,
            ours: addresses_text(addresses),
        });
    }
    Ok(())
}

/// Decodes one verified frame's body into the driver's message type (the wire codec).
pub type Decoder<M> = Rc<dyn Fn(&Header, &[u8]) -> Result<M, String>>;

/// One decoded message from peer `from`.
#[derive(Debug)]
pub struct Inbound<M> {
    pub from: ReplicaIndex,
    pub message: M,
}

/// The links' fixed parameters.
#[derive(Debug, Clone)]
pub struct BusConfig {
    pub cluster: u128,
    pub replica: ReplicaIndex,
    /// One replica address per replica, in index order; `addresses[replica]` is ours to listen on.
    pub addresses: Vec<SocketAddr>,
    /// Our client listen address, announced in our Hello.
    pub client_address: String,
    /// Largest frame (header included) accepted from a peer, bytes.
    pub frame_size_max: u32,
    /// Once a frame's header arrived, the rest of it must arrive within this long or the link
    /// closes (`limits::REPLICA_FRAME_REST_TIMEOUT`; tests pass less).
    pub frame_rest_timeout: Duration,
    /// Most inbound links held at once, Hello pending or established
    /// (`limits::replica_inbound_links_max`); one more is closed on accept.
    pub inbound_links_max: usize,
    /// First wait before reconnecting to a peer ([`RECONNECT_BACKOFF_MIN`]; tests pass more).
    pub reconnect_backoff_min: Duration,
    /// Longest wait between reconnect attempts ([`RECONNECT_BACKOFF_MAX`]; tests pass more).
    pub reconnect_backoff_max: Duration,
}

impl BusConfig {
    /// The production configuration: frames up to `limits::REPLICA_MESSAGE_SIZE_MAX`, the
    /// limits' rest-of-frame deadline and inbound link cap for `addresses.len()` replicas.
    pub fn new(
        cluster: u128,
        replica: ReplicaIndex,
        addresses: Vec<SocketAddr>,
        client_address: String,
    ) -> BusConfig {
        let inbound_links_max = crate::limits::replica_inbound_links_max(addresses.len());
        BusConfig {
            cluster,
            replica,
            addresses,
            client_address,
            frame_size_max: crate::limits::REPLICA_MESSAGE_SIZE_MAX,
            frame_rest_timeout: crate::limits::REPLICA_FRAME_REST_TIMEOUT,
            inbound_links_max,
            reconnect_backoff_min: RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: RECONNECT_BACKOFF_MAX,
        }
    }
}

/// Counters of what the links dropped or refused (for logs and tests).
#[derive(Debug, Default)]
pub struct BusCounters {
    /// Frames dropped because a peer's outbound queue was full.
    pub send_dropped: Cell<u64>,
    /// Frames dropped because their peer's outbound link was down: refused by `send` while the
    /// link was not connected, or still queued when a write to it failed.
    pub link_down_dropped: Cell<u64>,
    /// Outbound connect attempts that failed (the peer was unreachable).
    pub connects_failed: Cell<u64>,
    /// Reconnect backoff waits ended early because the peer's Hello arrived on its inbound link.
    pub backoffs_ended_by_hello: Cell<u64>,
    /// Inbound messages dropped because the driver's channel was full.
    pub receive_dropped: Cell<u64>,
    /// Connections closed for a refused Hello, a malformed or stalled frame, or over the cap.
    pub links_refused: Cell<u64>,
    /// Refusals that were logged (the others fell within `REFUSAL_LOG_INTERVAL` of their
    /// reason's last line).
    pub refusals_logged: Cell<u64>,
    /// The last refusal that was logged, as its log line gives the reason.
    pub last_logged_refusal: RefCell<Option<String>>,
    /// Established inbound links closed because a newer link from the same replica index
    /// passed its Hello.
    pub links_replaced: Cell<u64>,
}

/// State shared by the link tasks.
struct Shared<M: 'static> {
    config: BusConfig,
    decode: Decoder<M>,
    inbound: MAsyncTx<Array<Inbound<M>>>,
    /// Each peer's client address, learned from its Hello.
    client_addresses: RefCell<Vec<Option<String>>>,
    counters: BusCounters,
    /// Last time each refusal kind was logged.
    refusal_logged: RefCell<ahash::AHashMap<&'static str, std::time::Instant>>,
    /// Inbound links open now (Hello pending or established).
    inbound_links: Cell<usize>,
    /// Per peer index: the established inbound link's id and the handle that closes it.
    peer_links: RefCell<Vec<Option<(u64, AbortHandle)>>>,
    /// Id of the next established inbound link.
    next_link_id: Cell<u64>,
    /// Per peer index (`None` for our own): the state its connect loop shares with `send` and
    /// the accept side.
    outbound: Vec<Option<Outbound>>,
}

/// One peer's outbound link as `ReplicaBus::send`, its connect loop and the accept side see it.
struct Outbound {
    /// The frames to write, at most `PEER_QUEUE_FRAMES_MAX`; filled only while `connected`.
    queue: MAsyncTx<Array<Vec<u8>>>,
    /// Set once a connect succeeded (before our Hello is written, so a peer that read our Hello
    /// sees it set), cleared when a write fails.
    connected: Cell<bool>,
    /// Frames dropped while the link was down since the connect loop last logged them.
    dropped_unlogged: Cell<u64>,
    /// Holds one pending signal once the peer's Hello was accepted on its inbound link: the
    /// connect loop's next (or current) backoff wait ends at once.
    peer_hello: MAsyncTx<Array<()>>,
}

impl Outbound {
    /// Counts `count` frames dropped because the link was down.
    fn count_dropped(&self, counters: &BusCounters, count: u64) {
        self.dropped_unlogged
            .set(self.dropped_unlogged.get() + count);
        counters
            .link_down_dropped
            .set(counters.link_down_dropped.get() + count);
    }
}

impl<M: 'static> Shared<M> {
    fn refuse(&self, peer: SocketAddr, refusal: &LinkRefusal) {
        self.counters
            .links_refused
            .set(self.counters.links_refused.get() + 1);
        let now = std::time::Instant::now();
        let mut logged = self.refusal_logged.borrow_mut();
        let due = logged
            .get(refusal.kind())
            .is_none_or(|last| now.duration_since(*last) >= REFUSAL_LOG_INTERVAL);
        if due {
            logged.insert(refusal.kind(), now);
            let counters = &self.counters;
            counters
                .refusals_logged
                .set(counters.refusals_logged.get() + 1);
            *counters.last_logged_refusal.borrow_mut() = Some(refusal.to_string());
            tracing::warn!(
                %peer, replica = self.config.replica, reason = %refusal,
                "replica link closed (repeats of this reason are not logged for 10 s); the replica keeps running"
            );
        }
    }
}

/// Shard 0's replica links. Dropping it stops every link task.
pub struct ReplicaBus<M: 'static> {
    shared: Rc<Shared<M>>,
    tasks: Vec<compio::runtime::JoinHandle<()>>,
    local_addr: SocketAddr,
}

impl<M: 'static> std::fmt::Debug for ReplicaBus<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicaBus")
            .field("replica", &self.shared.config.replica)
            .field("local_addr", &self.local_addr)
            .finish_non_exhaustive()
    }
}

impl<M: 'static> ReplicaBus<M> {
    /// Binds `addresses[replica]` (retrying up to 10 s while the address is in use) and starts
    /// the listener and one connector per peer. Decoded messages are delivered into `inbound`.
    ///
    /// # Errors
    /// The listen address cannot be bound.
    ///
    /// # Panics
    /// If `replica` is not an index into `addresses`.
    pub async fn start(
        config: BusConfig,
        decode: Decoder<M>,
        inbound: MAsyncTx<Array<Inbound<M>>>,
    ) -> std::io::Result<ReplicaBus<M>> {
        let replica = usize::from(config.replica);
        assert!(replica < config.addresses.len(), "replica index in range");
        let listener = bind_retrying(config.addresses[replica]).await?;
        let local_addr = listener.local_addr()?;
        let replica_count = config.addresses.len();
        let mut outbound = Vec::with_capacity(replica_count);
        let mut connector_ends = Vec::with_capacity(replica_count);
        for index in 0..replica_count {
            if index == replica {
                outbound.push(None);
                continue;
            }
            let (queue, queue_rx) =
                crossfire::mpsc::bounded_async::<Vec<u8>>(PEER_QUEUE_FRAMES_MAX);
            let (peer_hello, peer_hello_rx) = crossfire::mpsc::bounded_async::<()>(1);
            outbound.push(Some(Outbound {
                queue,
                connected: Cell::new(false),
                dropped_unlogged: Cell::new(0),
                peer_hello,
            }));
            connector_ends.push((index, queue_rx, peer_hello_rx));
        }
        let shared = Rc::new(Shared {
            decode,
            inbound,
            client_addresses: RefCell::new(vec![None; replica_count]),
            counters: BusCounters::default(),
            refusal_logged: RefCell::default(),
            inbound_links: Cell::new(0),
            peer_links: RefCell::new((0..replica_count).map(|_| None).collect()),
            next_link_id: Cell::new(0),
            outbound,
            config,
        });
        let mut tasks = vec![compio::runtime::spawn(accept_loop(
            Rc::clone(&shared),
            listener,
        ))];
        for (index, queue, peer_hello) in connector_ends {
            tasks.push(compio::runtime::spawn(connect_loop(
                Rc::clone(&shared),
                index,
                queue,
                peer_hello,
            )));
        }
        Ok(ReplicaBus {
            shared,
            tasks,
            local_addr,
        })
    }

    /// The address the listener bound (the configured one, or the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Queues one encoded frame for replica `to`; never waits. Returns false if the frame was
    /// dropped: the link to `to` is not connected (counted in `link_down_dropped`: a down link
    /// drops, module docs), the peer's queue is full (counted in `send_dropped`), or `to` is our
    /// own index or out of range.
    pub fn send(&self, to: ReplicaIndex, frame: Vec<u8>) -> bool {
        let Some(Some(outbound)) = self.shared.outbound.get(usize::from(to)) else {
            return false;
        };
        let counters = &self.shared.counters;
        if !outbound.connected.get() {
            outbound.count_dropped(counters, 1);
            return false;
        }
        if outbound.queue.try_send(frame).is_ok() {
            return true;
        }
        counters.send_dropped.set(counters.send_dropped.get() + 1);
        false
    }

    /// Peer `replica`'s client address as its Hello announced it, if it has connected.
    pub fn client_address(&self, replica: ReplicaIndex) -> Option<String> {
        self.shared
            .client_addresses
            .borrow()
            .get(usize::from(replica))
            .cloned()
            .flatten()
    }

    /// Whether the outbound link to replica `to` is connected now, i.e. whether `send` to it
    /// queues (false for our own index or one out of range).
    pub fn connected(&self, to: ReplicaIndex) -> bool {
        self.shared
            .outbound
            .get(usize::from(to))
            .and_then(Option::as_ref)
            .is_some_and(|outbound| outbound.connected.get())
    }

    pub fn counters(&self) -> &BusCounters {
        &self.shared.counters
    }

    /// Inbound links open now (Hello pending or established).
    pub fn inbound_links(&self) -> usize {
        self.shared.inbound_links.get()
    }
}

impl<M: 'static> Drop for ReplicaBus<M> {
    fn drop(&mut self) {
        // Dropping a compio task cancels it.
        self.tasks.clear();
    }
}

async fn bind_retrying(address: SocketAddr) -> std::io::Result<TcpListener> {
    let deadline = std::time::Instant::now() + BIND_RETRY_MAX;
    let mut logged = false;
    loop {
        match bind_listener(address) {
            Err(error)
                if error.kind() == std::io::ErrorKind::AddrInUse
                    && std::time::Instant::now() < deadline =>
            {
                if !logged {
                    tracing::info!(%address, "replica address in use; retrying for up to 10 s");
                    logged = true;
                }
                compio::time::sleep(BIND_RETRY_SLEEP).await;
            }
            result => return result,
        }
    }
}

fn bind_listener(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = Socket::new(
        Domain::for_address(address),
        Type::STREAM,
        Some(Protocol::TCP),
    )?;
    socket.set_reuse_address(true)?;
    socket.bind(&address.into())?;
    socket.listen(crate::limits::LISTEN_BACKLOG)?;
    TcpListener::from_std(socket.into())
}

/// Accepts inbound links; each is served by its own task until it closes. A connection beyond
/// `config.inbound_links_max` is closed at once (one rate-limited log line).
async fn accept_loop<M: 'static>(shared: Rc<Shared<M>>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let max = shared.config.inbound_links_max;
                if shared.inbound_links.get() >= max {
                    shared.refuse(peer, &LinkRefusal::TooManyLinks { max });
                    drop(stream);
                    continue;
                }
                let _ = stream.set_nodelay(true);
                let slot = InboundSlot::take(&shared);
                let task = serve_inbound(Rc::clone(&shared), stream, peer);
                compio::runtime::spawn(async move {
                    let _slot = slot;
                    task.await;
                })
                .detach();
            }
            Err(error) => {
                tracing::warn!(%error, "replica listener accept failed");
                compio::time::sleep(RECONNECT_BACKOFF_MIN).await;
            }
        }
    }
}

/// One counted inbound link; dropping it (the link's task ended or was cancelled) frees the slot.
struct InboundSlot<M: 'static> {
    shared: Rc<Shared<M>>,
}

impl<M: 'static> InboundSlot<M> {
    fn take(shared: &Rc<Shared<M>>) -> InboundSlot<M> {
        shared.inbound_links.set(shared.inbound_links.get() + 1);
        InboundSlot {
            shared: Rc::clone(shared),
        }
    }
}

impl<M: 'static> Drop for InboundSlot<M> {
    fn drop(&mut self) {
        let links = &self.shared.inbound_links;
        links.set(links.get().saturating_sub(1));
    }
}

/// Reads one frame whose body arrives in chunks of `REPLICA_BODY_READ_CHUNK_BYTES` into a
/// buffer that grows with what was received (never allocated in full from the header's `size`).
/// Waits for the header without a deadline; once it arrived, the body must arrive within
/// `rest_timeout`.
///
/// Returns `None` on a clean close before the first header byte.
///
/// # Errors
/// `Malformed` (the header fails `Header::validate_prefix` with `frame_size_max`, the stream
/// fails or ends inside the frame, the body checksum does not match), `FrameRestTimeout`.
///
/// # Cancel safety
/// Not cancel safe: a dropped read loses partial bytes; the link must then be closed.
async fn read_frame_within(
    stream: &mut TcpStream,
    frame_size_max: u32,
    rest_timeout: Duration,
) -> Result<Option<bus::Frame>, LinkRefusal> {
    let header = match bus::read_header(stream, frame_size_max).await {
        Ok(header) => header,
        Err(FrameError::Closed) => return Ok(None),
        Err(error) => return Err(LinkRefusal::Malformed(error.to_string())),
    };
    let expected = header.body_size();
    let mut body: Vec<u8> = Vec::new();
    // Bytes of the body received so far (the buffer itself is lent to the read in flight).
    let mut received = 0;
    let read = async {
        while received < expected {
            let want = (expected - received).min(REPLICA_BODY_READ_CHUNK_BYTES);
            body.reserve(want);
            let BufResult(result, slice) = stream
                .read(std::mem::take(&mut body).slice(received..received + want))
                .await;
            body = slice.into_inner();
            match result? {
                0 => return Err(std::io::ErrorKind::UnexpectedEof.into()),
                read => received += read,
            }
        }
        Ok::<(), std::io::Error>(())
    };
    match compio::time::timeout(rest_timeout, read).await {
        Err(_) => {
            return Err(LinkRefusal::FrameRestTimeout {
                timeout: rest_timeout,
                received,
                expected,
            });
        }
        Ok(Err(error)) => {
            return Err(LinkRefusal::Malformed(format!(
                "frame body ended after {received} of {expected} bytes: {error}"
            )));
        }
        Ok(Ok(())) => {}
    }
    if !header.valid_checksum_body(&body) {
        return Err(LinkRefusal::Malformed(FrameError::BodyChecksum.to_string()));
    }
    Ok(Some(bus::Frame { header, body }))
}

/// Reads one inbound link: the Hello, then frames until the peer closes, a frame is refused, or
/// a newer link from the same peer index replaces this one.
async fn serve_inbound<M: 'static>(shared: Rc<Shared<M>>, mut stream: TcpStream, peer: SocketAddr) {
    let rest_timeout = shared.config.frame_rest_timeout;
    let hello = match compio::time::timeout(
        HELLO_TIMEOUT,
        read_frame_within(&mut stream, HELLO_FRAME_SIZE_MAX, rest_timeout),
    )
    .await
    {
        Err(_) => Err(LinkRefusal::HelloTimeout(HELLO_TIMEOUT)),
        Ok(Ok(None)) => return,
        Ok(Err(refusal)) => Err(refusal),
        Ok(Ok(Some(frame))) => Hello::decode(&frame.header, &frame.body).and_then(|hello| {
            check_hello(
                &hello,
                shared.config.cluster,
                shared.config.replica,
                &shared.config.addresses,
            )
            .map(|()| hello)
        }),
    };
    let hello = match hello {
        Ok(hello) => hello,
        Err(refusal) => {
            shared.refuse(peer, &refusal);
            return;
        }
    };
    let from = hello.replica;
    let slot = usize::from(from);
    let id = shared.next_link_id.get();
    shared.next_link_id.set(id + 1);
    let (handle, registration) = AbortHandle::new_pair();
    let older = shared.peer_links.borrow_mut()[slot].replace((id, handle));
    if let Some((_, older)) = older {
        older.abort();
        let counters = &shared.counters;
        counters
            .links_replaced
            .set(counters.links_replaced.get() + 1);
        tracing::info!(%peer, from, "replica link replaced: a newer link from the same replica passed its Hello; the older one is closed");
    }
    tracing::info!(%peer, from, client_address = %hello.client_address, "replica link up (inbound)");
    shared.client_addresses.borrow_mut()[slot] = Some(hello.client_address);
    if let Some(Some(outbound)) = shared.outbound.get(slot) {
        // Full: a signal is pending already, which is all the connect loop needs.
        let _ = outbound.peer_hello.try_send(());
    }
    let served = Abortable::new(read_frames(&shared, &mut stream, peer, from), registration).await;
    let mut links = shared.peer_links.borrow_mut();
    if links[slot]
        .as_ref()
        .is_some_and(|(current, _)| *current == id)
    {
        links[slot] = None;
    }
    drop(links);
    if served.is_err() {
        tracing::debug!(%peer, from, "older replica link closed");
    }
}

/// The frames of an established inbound link from replica `from`, delivered to the driver until
/// the peer closes or a frame is refused.
///
/// # Cancel safety
/// Not cancel safe (a partly read frame is lost): cancelling it closes the link.
async fn read_frames<M: 'static>(
    shared: &Shared<M>,
    stream: &mut TcpStream,
    peer: SocketAddr,
    from: ReplicaIndex,
) {
    let frame_size_max = shared.config.frame_size_max;
    let rest_timeout = shared.config.frame_rest_timeout;
    loop {
        let frame = match read_frame_within(stream, frame_size_max, rest_timeout).await {
            Ok(Some(frame)) => frame,
            Ok(None) => {
                tracing::info!(%peer, from, "replica link closed by peer");
                return;
            }
            Err(refusal) => {
                shared.refuse(peer, &refusal);
                return;
            }
        };
        if let Err(refusal) = check_frame(shared, from, &frame.header) {
            shared.refuse(peer, &refusal);
            return;
        }
        let message = match (shared.decode)(&frame.header, &frame.body) {
            Ok(message) => message,
            Err(reason) => {
                shared.refuse(peer, &LinkRefusal::Malformed(reason));
                return;
            }
        };
        if shared.inbound.try_send(Inbound { from, message }).is_err() {
            let counters = &shared.counters;
            counters
                .receive_dropped
                .set(counters.receive_dropped.get() + 1);
        }
    }
}

/// A frame after the Hello: a replica-bus command of our cluster, from the index the Hello named.
fn check_frame<M: 'static>(
    shared: &Shared<M>,
    from: ReplicaIndex,
    header: &Header,
) -> Result<(), LinkRefusal> {
    if header.cluster != shared.config.cluster {
        return Err(LinkRefusal::FrameWrongCluster {
            from,
            ours: shared.config.cluster,
            theirs: header.cluster,
        });
    }
    match Command::from_u8(header.command) {
        Some(Command::Request | Command::Reply | Command::Eviction | Command::Hello) | None => {
            Err(LinkRefusal::Malformed(format!(
                "command {} is not a replica message",
                header.command
            )))
        }
        Some(_) if header.replica != from => Err(LinkRefusal::Malformed(format!(
            "frame names replica {} on the link of replica {from}",
            header.replica
        ))),
        Some(_) => Ok(()),
    }
}

/// A log line printed the first time, then at most once per `REPLICA_LINK_LOG_INTERVAL` with
/// how many were not printed in between.
#[derive(Debug, Default)]
struct LogThrottle {
    last: Option<std::time::Instant>,
    suppressed: u64,
}

impl LogThrottle {
    /// Whether to print the line now; `Some(n)`: print it, `n` were suppressed since the last.
    fn due(&mut self, now: std::time::Instant) -> Option<u64> {
        let due = self
            .last
            .is_none_or(|last| now.duration_since(last) >= REPLICA_LINK_LOG_INTERVAL);
        if due {
            self.last = Some(now);
            Some(std::mem::take(&mut self.suppressed))
        } else {
            self.suppressed += 1;
            None
        }
    }
}

/// Keeps one outbound link to replica `index` up: connect (backoff from
/// `config.reconnect_backoff_min` doubling to `config.reconnect_backoff_max`, ended early by the
/// peer's Hello on its inbound link), send our Hello, then write queued frames until a write
/// fails; then reconnect. While the link is not connected its frames are dropped and counted
/// (module docs: a down link drops, as a network would); a live but slow link keeps up to
/// `PEER_QUEUE_FRAMES_MAX` queued. A link that goes down within `REPLICA_LINK_REFUSED_WINDOW`
/// of its Hello was most likely refused by the peer: it keeps the backoff growing and is logged
/// as such. The up/down lines are rate-limited per peer (`LogThrottle`).
async fn connect_loop<M: 'static>(
    shared: Rc<Shared<M>>,
    index: usize,
    queue: AsyncRx<Array<Vec<u8>>>,
    peer_hello: AsyncRx<Array<()>>,
) {
    let address = shared.config.addresses[index];
    let Some(outbound) = shared.outbound[index].as_ref() else {
        unreachable!("no connect loop runs for our own index");
    };
    let hello = Hello {
        cluster: shared.config.cluster,
        replica: shared.config.replica,
        client_address: shared.config.client_address.clone(),
        addresses_checksum: addresses_checksum(&shared.config.addresses),
    }
    .encode();
    let mut backoff = Backoff::new(&shared.config);
    let mut logged_down = false;
    let mut up_log = LogThrottle::default();
    let mut down_log = LogThrottle::default();
    let mut refused_log = LogThrottle::default();
    loop {
        log_dropped_while_down(outbound, address);
        let mut stream = match TcpStream::connect(address).await {
            Ok(stream) => stream,
            Err(error) => {
                let counters = &shared.counters;
                counters
                    .connects_failed
                    .set(counters.connects_failed.get() + 1);
                if !logged_down {
                    tracing::info!(%address, %error, "replica unreachable; reconnecting with backoff");
                    logged_down = true;
                }
                backoff.wait(&peer_hello, counters).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        // Connected before the Hello goes out: a peer that read our Hello may send to us and
        // rely on our replies being queued, not dropped.
        outbound.connected.set(true);
        if bus::write_frame(&mut stream, hello.clone())
            .await
            .0
            .is_err()
        {
            link_down(outbound, &queue, &shared.counters);
            backoff.wait(&peer_hello, &shared.counters).await;
            continue;
        }
        // A Hello accepted before our link came up has done its job.
        while peer_hello.try_recv().is_ok() {}
        let up_at = std::time::Instant::now();
        if let Some(suppressed) = up_log.due(up_at) {
            tracing::info!(%address, not_logged_since_last = suppressed, "replica link up (outbound)");
        }
        logged_down = false;
        let error = loop {
            let Ok(mut frame) = queue.recv().await else {
                return; // The bus was dropped.
            };
            // Coalesce what is already queued into one write.
            while frame.len() < 1 << 20 {
                match queue.try_recv() {
                    Ok(next) => frame.extend_from_slice(&next),
                    Err(_) => break,
                }
            }
            if let Err(error) = bus::write_frame(&mut stream, frame).await.0 {
                break error;
            }
        };
        link_down(outbound, &queue, &shared.counters);
        let _ = stream.shutdown().await;
        let now = std::time::Instant::now();
        if now.duration_since(up_at) < REPLICA_LINK_REFUSED_WINDOW {
            if let Some(suppressed) = refused_log.due(now) {
                tracing::warn!(
                    %address, %error, not_logged_since_last = suppressed,
                    "replica closed our link right after our Hello: it most likely refused it \
                     (a different cluster id or --addresses list; that replica's log names the \
                     reason); retrying"
                );
            }
            backoff.wait(&peer_hello, &shared.counters).await;
        } else {
            if let Some(suppressed) = down_log.due(now) {
                tracing::info!(%address, %error, not_logged_since_last = suppressed, "replica link down; reconnecting");
            }
            backoff.reset();
        }
    }
}

/// Marks the link down and drops (counting them) the frames still queued for it: they were
/// meant for a connection that is gone (module docs: a down link drops).
fn link_down(outbound: &Outbound, queue: &AsyncRx<Array<Vec<u8>>>, counters: &BusCounters) {
    outbound.connected.set(false);
    let mut dropped = 0;
    while queue.try_recv().is_ok() {
        dropped += 1;
    }
    outbound.count_dropped(counters, dropped);
}

/// Logs, at debug, the frames dropped since the last line because the link to `address` was
/// down; nothing when there were none.
fn log_dropped_while_down(outbound: &Outbound, address: SocketAddr) {
    let dropped = outbound.dropped_unlogged.replace(0);
    if dropped > 0 {
        tracing::debug!(%address, dropped, "frames for a replica whose link was down were dropped");
    }
}

/// The wait before the next connect attempt to one peer.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    min: Duration,
    max: Duration,
}

impl Backoff {
    fn new(config: &BusConfig) -> Backoff {
        Backoff {
            next: config.reconnect_backoff_min,
            min: config.reconnect_backoff_min,
            max: config.reconnect_backoff_max,
        }
    }

    /// Back to the shortest wait (the link was up long enough to count as working).
    fn reset(&mut self) {
        self.next = self.min;
    }

    /// Sleeps the current wait, then doubles it up to the maximum; a Hello from the peer
    /// (`peer_hello` signalled by the accept side) ends the sleep at once and resets the wait,
    /// since the peer is evidently up again (counted in `backoffs_ended_by_hello`).
    ///
    /// # Cancel safety
    /// Cancel safe: a signal is consumed only when it ends the wait.
    async fn wait(&mut self, peer_hello: &AsyncRx<Array<()>>, counters: &BusCounters) {
        let hello = std::pin::pin!(async {
            if peer_hello.recv().await.is_err() {
                // The bus holds the sender as long as this loop runs; never end the wait on it.
                std::future::pending::<()>().await;
            }
        });
        let sleep = std::pin::pin!(compio::time::sleep(self.next));
        match futures_util::future::select(hello, sleep).await {
            futures_util::future::Either::Left(((), _)) => {
                counters
                    .backoffs_ended_by_hello
                    .set(counters.backoffs_ended_by_hello.get() + 1);
                self.reset();
            }
            futures_util::future::Either::Right(((), _)) => {
                self.next = (self.next * 2).min(self.max);
            }
        }
    }
}

#[cfg(test)]
mod tests;
