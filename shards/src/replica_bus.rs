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
//! loss: every message it needs is retransmitted on its own timers (DESIGN section 10, and
//! Viewstamped Replication Revisited section 4, which assumes a network that may drop messages).
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
mod tests {
    use super::*;
    use compio::io::AsyncWriteExt;

    const CLUSTER: u128 = 7;

    /// A Hello from `replica` of `cluster` whose sender was configured with `addresses`.
    fn hello_with(cluster: u128, replica: u8, addresses: &[SocketAddr]) -> Hello {
        Hello {
            cluster,
            replica,
            client_address: "127.0.0.1:9000".to_owned(),
            addresses_checksum: addresses_checksum(addresses),
        }
    }

    /// Three replica addresses (never listened on).
    fn three() -> Vec<SocketAddr> {
        ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"]
            .iter()
            .map(|a| a.parse().unwrap())
            .collect()
    }

    fn hello(cluster: u128, replica: u8) -> Hello {
        hello_with(cluster, replica, &three())
    }

    #[test]
    fn hello_round_trips_and_is_checked() {
        let frame = hello(CLUSTER, 2).encode();
        let header: Header = bytemuck::pod_read_unaligned(&frame[..bus::HEADER_SIZE]);
        assert!(header.validate_prefix(1 << 20).is_ok());
        let decoded = Hello::decode(&header, &frame[bus::HEADER_SIZE..]).unwrap();
        assert_eq!(decoded, hello(CLUSTER, 2));
        assert_eq!(check_hello(&decoded, CLUSTER, 0, &three()), Ok(()));
        assert_eq!(
            check_hello(&hello(8, 1), CLUSTER, 0, &three()),
            Err(LinkRefusal::WrongCluster {
                ours: CLUSTER,
                theirs: 8
            })
        );
        assert_eq!(
            check_hello(&hello(CLUSTER, 3), CLUSTER, 0, &three()),
            Err(LinkRefusal::UnknownReplica {
                index: 3,
                replica_count: 3
            })
        );
        assert_eq!(
            check_hello(&hello(CLUSTER, 0), CLUSTER, 0, &three()),
            Err(LinkRefusal::OwnIndex { index: 0 })
        );
        // A typo in the sender's list: its 127.0.0.1:7102 is 127.0.0.1:7103.
        let mut typo = three();
        typo[1] = "127.0.0.1:7103".parse().unwrap();
        let refusal = check_hello(&hello_with(CLUSTER, 2, &typo), CLUSTER, 0, &three());
        assert_eq!(
            refusal,
            Err(LinkRefusal::AddressesDiffer {
                index: 2,
                ours: "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103".to_owned()
            })
        );
        assert_eq!(
            refusal.unwrap_err().to_string(),
            "replica 2's --addresses differ from this replica's: every replica must be started \
             with the same --addresses list in the same order (this replica's list: \
             127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103)"
        );
    }

    #[test]
    fn log_throttle_logs_the_first_then_once_per_interval_with_a_count() {
        let mut throttle = LogThrottle::default();
        let now = std::time::Instant::now();
        assert_eq!(throttle.due(now), Some(0));
        assert_eq!(throttle.due(now), None);
        assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL / 2), None);
        assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL), Some(2));
        assert_eq!(throttle.due(now + REPLICA_LINK_LOG_INTERVAL), None);
    }

    /// A test message: the frame's `view` field, decoded only for command Commit.
    fn test_decoder() -> Decoder<u32> {
        Rc::new(|header: &Header, _body: &[u8]| {
            if header.command == Command::Commit as u8 {
                Ok(header.view)
            } else {
                Err(format!("command {} does not decode", header.command))
            }
        })
    }

    fn message_frame(cluster: u128, replica: u8, command: Command, view: u32) -> Vec<u8> {
        let mut header = Header::new(command, bus::Operation::Ping);
        header.operation = 0;
        header.cluster = cluster;
        header.replica = replica;
        header.view = view;
        bus::encode_frame(&mut header, b"")
    }

    fn config(replica: u8, addresses: Vec<SocketAddr>) -> BusConfig {
        BusConfig {
            cluster: CLUSTER,
            replica,
            addresses,
            client_address: format!("client-of-{replica}"),
            frame_size_max: 1 << 20,
            frame_rest_timeout: crate::limits::REPLICA_FRAME_REST_TIMEOUT,
            inbound_links_max: crate::limits::replica_inbound_links_max(3),
            reconnect_backoff_min: RECONNECT_BACKOFF_MIN,
            reconnect_backoff_max: RECONNECT_BACKOFF_MAX,
        }
    }

    /// A bus of replica 0 of three whose peers are never listened on (their connectors retry
    /// in the background, which must not disturb anything), with `edit` applied to its config.
    /// Returns the bus, its inbound channel, and the address list its peers must announce.
    async fn lone_bus(
        edit: impl FnOnce(&mut BusConfig),
    ) -> (
        ReplicaBus<u32>,
        AsyncRx<Array<Inbound<u32>>>,
        Vec<SocketAddr>,
    ) {
        let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
        let closed_port: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let addresses = vec![any, closed_port, closed_port];
        let (inbound_tx, inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
        let mut config = config(0, addresses.clone());
        edit(&mut config);
        let bus = ReplicaBus::start(config, test_decoder(), inbound_tx)
            .await
            .unwrap();
        (bus, inbound_rx, addresses)
    }

    /// Yields to the bus's tasks until `done` holds (no deadline: a hang is the failure).
    async fn until(mut done: impl FnMut() -> bool) {
        while !done() {
            compio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    /// Connects to `address`, writes `frames` and waits until the server closes the link (a
    /// refused link) or, with `expect_open`, returns the still-open stream.
    async fn write_raw(address: SocketAddr, frames: &[Vec<u8>]) -> TcpStream {
        let mut stream = TcpStream::connect(address).await.unwrap();
        for frame in frames {
            stream.write_all(frame.clone()).await.0.unwrap();
        }
        stream
    }

    /// Reads until the peer closes the connection.
    async fn wait_closed(stream: &mut TcpStream) {
        use compio::io::AsyncRead;
        loop {
            let compio::BufResult(result, _) = stream.read(Vec::with_capacity(64)).await;
            match result {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    }

    #[test]
    fn refused_hellos_and_a_malformed_frame_close_only_their_link() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let (inbound_tx, inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
            // Replica 0 of 3; the peers' addresses are never listened on (their connectors
            // retry in the background, which must not disturb anything).
            let closed_port: SocketAddr = "127.0.0.1:9".parse().unwrap();
            let bus = ReplicaBus::start(
                config(0, vec![any, closed_port, closed_port]),
                test_decoder(),
                inbound_tx,
            )
            .await
            .unwrap();
            let address = bus.local_addr();

            let addresses = vec![any, closed_port, closed_port];
            let hello = |cluster, replica| hello_with(cluster, replica, &addresses);
            // Wrong cluster, unknown index, own index: each closed.
            for bad in [hello(8, 1), hello(CLUSTER, 3), hello(CLUSTER, 0)] {
                let mut stream = write_raw(address, &[bad.encode()]).await;
                wait_closed(&mut stream).await;
            }
            assert_eq!(bus.counters().links_refused.get(), 3);
            assert_eq!(bus.client_address(1), None);

            // A good link from replica 1 stays up across another link's malformed frame.
            let mut good = write_raw(
                address,
                &[
                    hello(CLUSTER, 1).encode(),
                    message_frame(CLUSTER, 1, Command::Commit, 11),
                ],
            )
            .await;
            let first = inbound_rx.recv().await.unwrap();
            assert_eq!((first.from, first.message), (1, 11));
            assert_eq!(bus.client_address(1).as_deref(), Some("127.0.0.1:9000"));

            let mut corrupt = message_frame(CLUSTER, 2, Command::Commit, 12);
            corrupt[bus::HEADER_SIZE - 1] ^= 1; // header checksum no longer matches
            let malformed_frames = [
                corrupt,
                message_frame(CLUSTER, 2, Command::Prepare, 13), // does not decode
                message_frame(9, 2, Command::Commit, 14),        // wrong cluster
                message_frame(CLUSTER, 2, Command::Request, 15), // not a replica command
            ];
            for (index, frame) in malformed_frames.into_iter().enumerate() {
                let mut bad = write_raw(address, &[hello(CLUSTER, 2).encode(), frame]).await;
                wait_closed(&mut bad).await;
                assert_eq!(bus.counters().links_refused.get(), 4 + index as u64);
            }

            good.write_all(message_frame(CLUSTER, 1, Command::Commit, 21))
                .await
                .0
                .unwrap();
            let next = inbound_rx.recv().await.unwrap();
            assert_eq!((next.from, next.message), (1, 21));
            assert!(inbound_rx.try_recv().is_err(), "nothing from refused links");
        });
    }

    #[test]
    fn two_buses_exchange_frames_and_learn_client_addresses() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            // Reserve two ports, then free them for the buses.
            let ports: Vec<SocketAddr> =
                (0..2).map(|_| crate::test_support::unused_addr()).collect();
            let (tx0, rx0) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
            let (tx1, rx1) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
            let bus0 = ReplicaBus::start(config(0, ports.clone()), test_decoder(), tx0)
                .await
                .unwrap();
            let bus1 = ReplicaBus::start(config(1, ports.clone()), test_decoder(), tx1)
                .await
                .unwrap();
            until(|| bus0.connected(1) && bus1.connected(0)).await;
            assert!(bus0.send(1, message_frame(CLUSTER, 0, Command::Commit, 5)));
            assert!(bus1.send(0, message_frame(CLUSTER, 1, Command::Commit, 6)));
            assert!(!bus0.send(0, Vec::new()), "no link to itself");
            let at1 = rx1.recv().await.unwrap();
            let at0 = rx0.recv().await.unwrap();
            assert_eq!((at1.from, at1.message), (0, 5));
            assert_eq!((at0.from, at0.message), (1, 6));
            assert_eq!(bus1.client_address(0).as_deref(), Some("client-of-0"));
            assert_eq!(bus0.client_address(1).as_deref(), Some("client-of-1"));
        });
    }

    #[test]
    fn a_stalled_body_closes_the_link_after_the_deadline() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (bus, inbound_rx, addresses) = lone_bus(|config| {
                config.frame_rest_timeout = Duration::from_millis(50);
            })
            .await;
            // A valid header announcing a 100 KiB body, then 10 bytes of it, then nothing.
            let mut header = Header::new(Command::Commit, bus::Operation::Ping);
            header.operation = 0;
            header.cluster = CLUSTER;
            header.replica = 1;
            let frame = bus::encode_frame(&mut header, &vec![0u8; 100 * 1024]);
            let mut stream = write_raw(
                bus.local_addr(),
                &[
                    hello_with(CLUSTER, 1, &addresses).encode(),
                    frame[..bus::HEADER_SIZE + 10].to_vec(),
                ],
            )
            .await;
            wait_closed(&mut stream).await;
            assert_eq!(bus.counters().links_refused.get(), 1);
            let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
            assert!(
                logged.starts_with("frame stalled: ")
                    && logged.contains("of its 102400 body bytes"),
                "{logged}"
            );
            assert!(inbound_rx.try_recv().is_err());
            until(|| bus.inbound_links() == 0).await;
        });
    }

    #[test]
    fn links_beyond_the_cap_are_refused_on_accept() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (bus, inbound_rx, addresses) = lone_bus(|config| {
                config.inbound_links_max = 2;
            })
            .await;
            let address = bus.local_addr();
            let mut from_1 =
                write_raw(address, &[hello_with(CLUSTER, 1, &addresses).encode()]).await;
            let _from_2 = write_raw(address, &[hello_with(CLUSTER, 2, &addresses).encode()]).await;
            until(|| bus.inbound_links() == 2).await;

            let mut third = write_raw(address, &[]).await;
            wait_closed(&mut third).await;
            assert_eq!(bus.counters().links_refused.get(), 1);
            let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
            assert!(
                logged.contains("2 inbound replica links are open"),
                "{logged}"
            );
            assert_eq!(bus.inbound_links(), 2);

            // The links held stay up.
            from_1
                .write_all(message_frame(CLUSTER, 1, Command::Commit, 3))
                .await
                .0
                .unwrap();
            let got = inbound_rx.recv().await.unwrap();
            assert_eq!((got.from, got.message), (1, 3));

            // One closes; its slot is free again for a new link.
            drop(from_1);
            until(|| bus.inbound_links() == 1).await;
            let _again = write_raw(
                address,
                &[
                    hello_with(CLUSTER, 1, &addresses).encode(),
                    message_frame(CLUSTER, 1, Command::Commit, 4),
                ],
            )
            .await;
            let got = inbound_rx.recv().await.unwrap();
            assert_eq!((got.from, got.message), (1, 4));
        });
    }

    #[test]
    fn a_second_hello_from_the_same_index_replaces_the_first_link() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (bus, inbound_rx, addresses) = lone_bus(|_| {}).await;
            let address = bus.local_addr();
            let mut first = write_raw(
                address,
                &[
                    hello_with(CLUSTER, 1, &addresses).encode(),
                    message_frame(CLUSTER, 1, Command::Commit, 1),
                ],
            )
            .await;
            let got = inbound_rx.recv().await.unwrap();
            assert_eq!((got.from, got.message), (1, 1));

            let mut second = write_raw(
                address,
                &[
                    hello_with(CLUSTER, 1, &addresses).encode(),
                    message_frame(CLUSTER, 1, Command::Commit, 2),
                ],
            )
            .await;
            let got = inbound_rx.recv().await.unwrap();
            assert_eq!((got.from, got.message), (1, 2));
            wait_closed(&mut first).await;
            assert_eq!(bus.counters().links_replaced.get(), 1);
            assert_eq!(bus.counters().links_refused.get(), 0);
            until(|| bus.inbound_links() == 1).await;

            second
                .write_all(message_frame(CLUSTER, 1, Command::Commit, 3))
                .await
                .0
                .unwrap();
            let got = inbound_rx.recv().await.unwrap();
            assert_eq!((got.from, got.message), (1, 3));

            // A link from another index does not replace it.
            let _other = write_raw(address, &[hello_with(CLUSTER, 2, &addresses).encode()]).await;
            until(|| bus.inbound_links() == 2).await;
            assert_eq!(bus.counters().links_replaced.get(), 1);
        });
    }

    #[test]
    fn a_hello_with_another_address_list_is_refused_and_logged_once() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let (bus, inbound_rx, addresses) = lone_bus(|_| {}).await;
            let address = bus.local_addr();
            // Replica 2 started with a typo in its list.
            let mut typo = addresses.clone();
            typo[2] = "127.0.0.1:10".parse().unwrap();
            for attempt in 1..=2u64 {
                let mut stream = write_raw(
                    address,
                    &[
                        hello_with(CLUSTER, 2, &typo).encode(),
                        message_frame(CLUSTER, 2, Command::Commit, 9),
                    ],
                )
                .await;
                wait_closed(&mut stream).await;
                assert_eq!(bus.counters().links_refused.get(), attempt);
            }
            assert_eq!(bus.counters().refusals_logged.get(), 1, "rate-limited");
            let logged = bus.counters().last_logged_refusal.borrow().clone().unwrap();
            assert_eq!(
                logged,
                format!(
                    "replica 2's --addresses differ from this replica's: every replica must be \
                     started with the same --addresses list in the same order (this replica's \
                     list: {})",
                    addresses_text(&addresses)
                )
            );
            assert!(
                inbound_rx.try_recv().is_err(),
                "nothing from the refused links"
            );
            assert_eq!(bus.client_address(2), None);
        });
    }

    /// Accepts the bus's next outbound connection on `listener` and reads its Hello, which must
    /// come from replica 0.
    async fn accept_link_from_0(listener: &TcpListener) -> TcpStream {
        let (mut stream, _) = listener.accept().await.unwrap();
        let frame = read_frame_within(
            &mut stream,
            HELLO_FRAME_SIZE_MAX,
            crate::limits::REPLICA_FRAME_REST_TIMEOUT,
        )
        .await
        .unwrap()
        .unwrap();
        let hello = Hello::decode(&frame.header, &frame.body).unwrap();
        assert_eq!(hello.replica, 0);
        stream
    }

    /// The `view` of the next frame the bus wrote on `stream`.
    async fn next_view(stream: &mut TcpStream) -> u32 {
        let frame = read_frame_within(stream, 1 << 20, crate::limits::REPLICA_FRAME_REST_TIMEOUT)
            .await
            .unwrap()
            .unwrap();
        frame.header.view
    }

    #[test]
    fn frames_sent_while_the_peer_is_down_are_dropped_not_replayed() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let peer = crate::test_support::unused_addr();
            let (inbound_tx, _inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
            let bus = ReplicaBus::start(config(0, vec![any, peer]), test_decoder(), inbound_tx)
                .await
                .unwrap();
            let frame = |view| message_frame(CLUSTER, 0, Command::Commit, view);

            // Replica 1 is not up yet: its frames are dropped, not queued for later.
            until(|| bus.counters().connects_failed.get() >= 1).await;
            for view in 1..=3 {
                assert!(!bus.send(1, frame(view)), "dropped while the link is down");
            }
            assert_eq!(bus.counters().link_down_dropped.get(), 3);
            assert_eq!(bus.counters().send_dropped.get(), 0);

            let listener = bind_listener(peer).unwrap();
            let mut stream = accept_link_from_0(&listener).await;
            assert!(
                bus.connected(1),
                "connected is set before the Hello is written"
            );
            assert!(bus.send(1, frame(10)));
            assert_eq!(
                next_view(&mut stream).await,
                10,
                "nothing from before it was up"
            );

            // Replica 1 restarts: what is sent once the link is seen down is not replayed
            // either (frames written into the dead connection are lost with it).
            drop(stream);
            drop(listener);
            let dropped_before = bus.counters().link_down_dropped.get();
            until(|| {
                bus.send(1, frame(20));
                bus.counters().link_down_dropped.get() > dropped_before
            })
            .await;
            assert!(!bus.connected(1));
            assert!(!bus.send(1, frame(30)));
            let listener = bind_listener(peer).unwrap();
            let mut stream = accept_link_from_0(&listener).await;
            assert!(bus.send(1, frame(40)));
            assert_eq!(
                next_view(&mut stream).await,
                40,
                "nothing from before the restart"
            );
        });
    }

    #[test]
    fn a_peer_hello_ends_the_reconnect_backoff_at_once() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let any: SocketAddr = "127.0.0.1:0".parse().unwrap();
            let peer = crate::test_support::unused_addr();
            let addresses = vec![any, peer];
            let (inbound_tx, _inbound_rx) = crossfire::mpsc::bounded_async::<Inbound<u32>>(16);
            let mut config = config(0, addresses.clone());
            // A backoff no test outlives: any reconnect below comes from the peer's Hello.
            config.reconnect_backoff_min = Duration::from_hours(24);
            config.reconnect_backoff_max = config.reconnect_backoff_min;
            let bus = ReplicaBus::start(config, test_decoder(), inbound_tx)
                .await
                .unwrap();
            // The first attempt failed; the connect loop now waits out its backoff.
            until(|| bus.counters().connects_failed.get() == 1).await;
            let listener = bind_listener(peer).unwrap();

            // Replica 1 (restarted) connects to us and says Hello: our link to it comes up now
            // (a hang in the accept below is the failure).
            let _from_1 = write_raw(
                bus.local_addr(),
                &[hello_with(CLUSTER, 1, &addresses).encode()],
            )
            .await;
            let mut stream = accept_link_from_0(&listener).await;
            assert_eq!(bus.counters().backoffs_ended_by_hello.get(), 1);
            assert_eq!(bus.counters().connects_failed.get(), 1);
            assert!(bus.send(1, message_frame(CLUSTER, 0, Command::Commit, 5)));
            assert_eq!(next_view(&mut stream).await, 5);
        });
    }
}
