//! The replica links of shard 0 (issue 8 section 2, "Replica links"): every replica listens on
//! its own replica address and connects to every other replica. A connection carries frames one
//! way: the connecting side writes (its outbound queue to that peer), the accepting side reads
//! (the peer's messages to us). Each replica thus holds one outbound and one inbound connection
//! per peer, and a dead connection in one direction never stalls the other.
//!
//! The first frame on every connection is a `Hello` (cluster id, replica index, the sender's
//! client address). A connection whose Hello names another cluster, an index outside
//! `0..replica_count`, or our own index is closed with one log line (rate-limited per reason).
//! Every later frame is a 256-byte checksummed `bus` header plus body, size-limited, decoded by
//! the caller's decoder (the wire codec, `crate::vsr::wire`); a frame that fails any check closes
//! that one link with one log line, and the peer reconnects.
//!
//! Never blocks shard 0: sends go into a bounded per-peer queue (`try_send`: a full queue drops
//! the frame and counts it; the protocol retries on its own timers); inbound messages go to the
//! driver through a bounded channel (full: dropped and counted). Runs on shard 0's compio
//! runtime; `!Send`.

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

use crate::vsr::message::ReplicaIndex;

/// Frames a peer's outbound queue holds before further sends to it are dropped.
pub const PEER_QUEUE_FRAMES_MAX: usize = 1024;
/// First wait before reconnecting to a peer; doubles per failed attempt up to
/// [`RECONNECT_BACKOFF_MAX`].
pub const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(50);
pub const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(1);
/// How long the listener retries binding an address in use (a replica restarted a moment ago).
const BIND_RETRY_MAX: Duration = Duration::from_secs(10);
const BIND_RETRY_SLEEP: Duration = Duration::from_millis(50);
/// Longest a connection may take to send its Hello before it is closed.
const HELLO_TIMEOUT: Duration = Duration::from_secs(5);
/// The same refusal reason is logged at most once per this interval.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// The first frame on a replica link: who is speaking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    pub cluster: u128,
    pub replica: ReplicaIndex,
    /// The sender's client listen address (`--listen`), for `NotPrimary` replies.
    pub client_address: String,
}

impl Hello {
    /// The Hello frame (`crate::vsr::wire::encode_hello`): header `command = Hello`,
    /// `cluster`, `replica`; body = the client address as UTF-8.
    ///
    /// # Panics
    /// An address longer than `wire::HELLO_ADDRESS_BYTES_MAX` (a config bug).
    pub fn encode(&self) -> Vec<u8> {
        crate::vsr::wire::encode_hello(self.cluster, self.replica, &self.client_address)
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
        let client_address = crate::vsr::wire::decode_hello_body(header, body)
            .map_err(|error| LinkRefusal::Malformed(error.to_string()))?;
        Ok(Hello {
            cluster: header.cluster,
            replica: header.replica,
            client_address,
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
        }
    }
}

/// Checks a peer's Hello against this replica's identity (issue 8 section 2: a frame from
/// another cluster or an unknown index is dropped with a log line).
///
/// # Errors
/// `WrongCluster`, `UnknownReplica` (index not below `replica_count`), `OwnIndex`.
pub fn check_hello(
    hello: &Hello,
    cluster: u128,
    replica: ReplicaIndex,
    replica_count: u8,
) -> Result<(), LinkRefusal> {
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
}

impl BusConfig {
    fn replica_count(&self) -> u8 {
        u8::try_from(self.addresses.len()).unwrap_or(u8::MAX)
    }
}

/// Counters of what the links dropped or refused (for logs and tests).
#[derive(Debug, Default)]
pub struct BusCounters {
    /// Frames dropped because a peer's outbound queue was full.
    pub send_dropped: Cell<u64>,
    /// Inbound messages dropped because the driver's channel was full.
    pub receive_dropped: Cell<u64>,
    /// Connections closed for a refused Hello or a malformed frame.
    pub links_refused: Cell<u64>,
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
    /// Outbound queue per replica index (`None` for our own index).
    peers: Vec<Option<MAsyncTx<Array<Vec<u8>>>>>,
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
        let shared = Rc::new(Shared {
            decode,
            inbound,
            client_addresses: RefCell::new(vec![None; replica_count]),
            counters: BusCounters::default(),
            refusal_logged: RefCell::default(),
            config,
        });
        let mut tasks = vec![compio::runtime::spawn(accept_loop(
            Rc::clone(&shared),
            listener,
        ))];
        let mut peers = Vec::with_capacity(replica_count);
        for index in 0..replica_count {
            if index == replica {
                peers.push(None);
                continue;
            }
            let (tx, rx) = crossfire::mpsc::bounded_async::<Vec<u8>>(PEER_QUEUE_FRAMES_MAX);
            let address = shared.config.addresses[index];
            tasks.push(compio::runtime::spawn(connect_loop(
                Rc::clone(&shared),
                address,
                rx,
            )));
            peers.push(Some(tx));
        }
        Ok(ReplicaBus {
            shared,
            peers,
            tasks,
            local_addr,
        })
    }

    /// The address the listener bound (the configured one, or the port picked for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Queues one encoded frame for replica `to`; never waits. Returns false (and counts it) if
    /// the frame was dropped: the peer's queue is full, `to` is our own index or out of range.
    pub fn send(&self, to: ReplicaIndex, frame: Vec<u8>) -> bool {
        let Some(Some(queue)) = self.peers.get(usize::from(to)) else {
            return false;
        };
        if queue.try_send(frame).is_ok() {
            return true;
        }
        let counters = &self.shared.counters;
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

    pub fn counters(&self) -> &BusCounters {
        &self.shared.counters
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

/// Accepts inbound links; each is served by its own task until it closes.
async fn accept_loop<M: 'static>(shared: Rc<Shared<M>>, listener: TcpListener) {
    loop {
        match listener.accept().await {
            Ok((stream, peer)) => {
                let _ = stream.set_nodelay(true);
                compio::runtime::spawn(serve_inbound(Rc::clone(&shared), stream, peer)).detach();
            }
            Err(error) => {
                tracing::warn!(%error, "replica listener accept failed");
                compio::time::sleep(RECONNECT_BACKOFF_MIN).await;
            }
        }
    }
}

/// Reads one inbound link: the Hello, then frames until the peer closes or a frame is refused.
async fn serve_inbound<M: 'static>(shared: Rc<Shared<M>>, mut stream: TcpStream, peer: SocketAddr) {
    let frame_size_max = shared.config.frame_size_max;
    let hello =
        match compio::time::timeout(HELLO_TIMEOUT, bus::read_frame(&mut stream, frame_size_max))
            .await
        {
            Err(_) => Err(LinkRefusal::HelloTimeout(HELLO_TIMEOUT)),
            Ok(Err(FrameError::Closed)) => return,
            Ok(Err(error)) => Err(LinkRefusal::Malformed(error.to_string())),
            Ok(Ok(frame)) => Hello::decode(&frame.header, &frame.body).and_then(|hello| {
                check_hello(
                    &hello,
                    shared.config.cluster,
                    shared.config.replica,
                    shared.config.replica_count(),
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
    tracing::info!(%peer, from, client_address = %hello.client_address, "replica link up (inbound)");
    shared.client_addresses.borrow_mut()[usize::from(from)] = Some(hello.client_address);
    loop {
        let frame = match bus::read_frame(&mut stream, frame_size_max).await {
            Ok(frame) => frame,
            Err(FrameError::Closed) => {
                tracing::info!(%peer, from, "replica link closed by peer");
                return;
            }
            Err(error) => {
                shared.refuse(peer, &LinkRefusal::Malformed(error.to_string()));
                return;
            }
        };
        if let Err(refusal) = check_frame(&shared, from, &frame.header) {
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

/// Keeps one outbound link to `address` up: connect (backoff 50 ms doubling to 1 s), send our
/// Hello, then write queued frames until a write fails; then reconnect. Frames queued while the
/// link is down wait in the bounded queue (the oldest are not replaced: the queue drops new
/// ones when full).
async fn connect_loop<M: 'static>(
    shared: Rc<Shared<M>>,
    address: SocketAddr,
    queue: AsyncRx<Array<Vec<u8>>>,
) {
    let hello = Hello {
        cluster: shared.config.cluster,
        replica: shared.config.replica,
        client_address: shared.config.client_address.clone(),
    }
    .encode();
    let mut backoff = RECONNECT_BACKOFF_MIN;
    let mut logged_down = false;
    loop {
        let mut stream = match TcpStream::connect(address).await {
            Ok(stream) => stream,
            Err(error) => {
                if !logged_down {
                    tracing::info!(%address, %error, "replica unreachable; reconnecting with backoff");
                    logged_down = true;
                }
                compio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        if bus::write_frame(&mut stream, hello.clone())
            .await
            .0
            .is_err()
        {
            compio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            continue;
        }
        tracing::info!(%address, "replica link up (outbound)");
        backoff = RECONNECT_BACKOFF_MIN;
        logged_down = false;
        loop {
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
            let written = bus::write_frame(&mut stream, frame).await.0;
            if let Err(error) = written {
                tracing::info!(%address, %error, "replica link down; reconnecting");
                let _ = stream.shutdown().await;
                break;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use compio::io::AsyncWriteExt;

    const CLUSTER: u128 = 7;

    fn hello(cluster: u128, replica: u8) -> Hello {
        Hello {
            cluster,
            replica,
            client_address: "127.0.0.1:9000".to_owned(),
        }
    }

    #[test]
    fn hello_round_trips_and_is_checked() {
        let frame = hello(CLUSTER, 2).encode();
        let header: Header = bytemuck::pod_read_unaligned(&frame[..bus::HEADER_SIZE]);
        assert!(header.validate_prefix(1 << 20).is_ok());
        let decoded = Hello::decode(&header, &frame[bus::HEADER_SIZE..]).unwrap();
        assert_eq!(decoded, hello(CLUSTER, 2));
        assert_eq!(check_hello(&decoded, CLUSTER, 0, 3), Ok(()));
        assert_eq!(
            check_hello(&hello(8, 1), CLUSTER, 0, 3),
            Err(LinkRefusal::WrongCluster {
                ours: CLUSTER,
                theirs: 8
            })
        );
        assert_eq!(
            check_hello(&hello(CLUSTER, 3), CLUSTER, 0, 3),
            Err(LinkRefusal::UnknownReplica {
                index: 3,
                replica_count: 3
            })
        );
        assert_eq!(
            check_hello(&hello(CLUSTER, 0), CLUSTER, 0, 3),
            Err(LinkRefusal::OwnIndex { index: 0 })
        );
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
}
