//! Async client library over compio TCP, used by the bench and the CLI. One request in flight per
//! connection.
//!
//! Every call sends one Request and reads exactly one Reply, which must echo the request number
//! and operation. The client never sends a request while the connection may hold bytes of an
//! earlier one (a call that failed mid-frame or was cancelled marks it broken), and never
//! allocates more than `max_message_size` for a reply.

//! Async client library over compio TCP, used by the bench and the CLI. One request in flight per
//! connection.
//!
//! Every call sends one Request and reads exactly one answer, which must echo the request number
//! and operation: a `Reply`, or an `Eviction` when a session-tracked request finds no session.
//!
//! Sessions: the metadata changes (`Operation::is_session_tracked`) are deduplicated by the server
//! by (client id, request number) through the client's session, so the client registers
//! (`Operation::Register`, request number 0) before its first such request and again after an
//! Eviction. One request counter numbers every request, tracked or not.
//!
//! Retries: within a retry budget, with backoff doubling from `RETRY_BACKOFF_MIN` to
//! `RETRY_BACKOFF_MAX`, a call resends the same bytes (same client id and request number) after
//! `Busy`, and for session-tracked operations, Register and reads also after `ShuttingDown` or a
//! connection failure, reconnecting to the same address first.
//!
//! Clusters (issue 8 section 2): a client may know several server addresses (`connect_any`,
//! `connect_any_with_timeout`). A backup answers `NotPrimary` (nothing applied) with the
//! primary's index in `replica`, the view in `view` and the primary's client address as the
//! body (empty during a view change). The client then reconnects to that address, or, when the
//! body is empty, names the address it is already on, or cannot be reached, to the next address
//! of its list in turn, and resends the same bytes (same client id and request number: sessions
//! are replicated state, so the new primary deduplicates the resend). Every operation follows
//! `NotPrimary`, a plain `SendMessages` too, since nothing was applied. A move to a named new
//! address is immediate once (a second named move in a row waits its backoff, so two confused
//! servers cannot bounce the client in a hot loop); every other retry waits the backoff. At most
//! `NOT_PRIMARY_REDIRECT_MAX` `NotPrimary` answers per call, within the retry budget; then the
//! call fails with `NoPrimary`, naming the addresses and the last error. With several addresses
//! a connection failure also moves to the next address before the retry.
//!
//! Deadlines: every call (`request` and the operations over it) has a deadline,
//! `with_request_timeout` (default `REQUEST_TIMEOUT_DEFAULT`), counted from the call's start over
//! its Register (if one goes first), every attempt, wait and redirect. A replica that cannot reach
//! a majority holds a request without answering; the deadline ends such a call with
//! `RequestTimeout`. The connection the call was waiting on is closed then (dropped, never read
//! again), so a late reply can never be taken as the answer to a later request: the next call
//! reconnects first.
//!
//! Idempotent sends (`send_stamped`, used by `producer::Producer`): a `SendMessages` whose header
//! names a producer (`producer != 0`, the batch carrying the same `ProducerStamp`) is deduplicated
//! by the owner shard, so it is resent like a session-tracked request: after `Busy`,
//! `ShuttingDown` or a connection failure, with the same bytes.
//!
//! This module must never resend a plain `SendMessages` (`producer` 0) whose bytes may have
//! reached the server (those are not deduplicated), never send on a connection that may hold bytes of an
//! earlier exchange (it reconnects first), and never allocate more than `max_message_size` for a
//! reply.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use compio::BufResult;
use compio::io::AsyncWriteExt;
use compio::net::TcpStream;

use crate::batch::{BatchView, ProducerStamp};
use crate::command::{Command, ErrorCode, Operation};
use crate::consumer::Consumer;
use crate::frame::{Frame, FrameError, read_frame};
use crate::group::{GroupAssignment, Heartbeat};
use crate::header::{HEADER_SIZE, Header};
use crate::limits::{
    CONNECT_BACKOFF_MAX, MESSAGE_SIZE_MAX_DEFAULT, NOT_PRIMARY_REDIRECT_MAX,
    REQUEST_TIMEOUT_DEFAULT, RETRY_BACKOFF_MAX, RETRY_BACKOFF_MIN, RETRY_BUDGET_DEFAULT,
};
use crate::namespace::Namespace;
use crate::wire::Metadata;

/// A connection to one server of a cluster, reconnected when it fails (to the same address, or
/// with several addresses to the next one) and moved to the primary when a backup answers
/// `NotPrimary`. Not `Sync`; use one per task.
#[derive(Debug)]
pub struct Client {
    /// The connection to `addr`; `None` once a call that timed out dropped it (the next attempt
    /// reconnects).
    stream: Option<TcpStream>,
    /// Where `stream` goes; reconnects keep the client id.
    addr: SocketAddr,
    /// Every address the client was given, in order (at least one); `addr` is one of them or a
    /// primary address a `NotPrimary` named.
    addrs: Vec<SocketAddr>,
    /// Index in `addrs` of the last address taken from the list: the next one in turn is the one
    /// after it.
    addr_index: usize,
    id: u128,
    /// Number of the last request sent; the next one is this plus 1 (the first is 1). Register
    /// is sent with request number 0 and does not change it.
    request_last: u64,
    /// Session number of the last successful Register (the op that committed it); `None` before
    /// the first Register and after an Eviction.
    session: Option<u64>,
    /// Bounds both the requests this client sends and the replies it accepts.
    max_message_size: u32,
    /// How long one call keeps retrying before it returns its last error.
    retry_budget: Duration,
    /// Deadline of one call, from its start to its reply (see the module doc).
    request_timeout: Duration,
    /// A request was started and its reply not fully read: the stream position is unknown, so the
    /// next attempt reconnects first.
    broken: bool,
}

/// The owner shard acknowledged a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendAck {
    /// Offset of the batch's first message.
    pub base_offset: u64,
    pub message_count: u32,
    /// The partition's next offset when the reply was sent (at least `base_offset +
    /// message_count`; more if other batches were acknowledged since).
    pub next_offset: u64,
    /// The partition's first offset when the reply was sent.
    pub first_offset: u64,
}

impl SendAck {
    fn from_reply(reply: &Header) -> SendAck {
        SendAck {
            base_offset: reply.offset,
            message_count: reply.count,
            next_offset: reply.next_offset,
            first_offset: reply.first_offset,
        }
    }
}

/// The answer to a poll: the stored batches from the one containing the offset asked, and where
/// the partition's data is, so a consumer can tell "caught up" from "beyond the end".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PollResult {
    /// The offset the poll asked for; `messages` skips what the batches hold below it.
    pub offset: u64,
    /// Concatenated batches as stored (parse with `messages` or `BatchView::parse_many`); empty
    /// when `offset` equals `next_offset`. **Unverified past the batch headers:** since protocol
    /// version 2 the frame's `checksum_body` covers only the batch headers (issue 12 item 1), so
    /// a payload damaged in transit is caught only by parsing (`messages` does); never use these
    /// bytes without it.
    pub batches: Vec<u8>,
    /// Messages at or above `offset` in `batches` (reply `count`).
    pub message_count: u32,
    /// The partition's next offset (one past its last acknowledged message) when the reply was
    /// made.
    pub next_offset: u64,
    /// The first offset the partition still holds.
    pub first_offset: u64,
}

impl PollResult {
    /// Whether the poll reached the end of the partition: nothing at or after `offset` yet.
    pub fn caught_up(&self) -> bool {
        self.message_count == 0 && self.offset >= self.next_offset
    }

    /// The messages at or above `offset`, in offset order.
    ///
    /// # Errors
    /// The first `BatchError` of `BatchView::parse_many` (the server sent malformed batches).
    pub fn messages(&self) -> Result<Vec<crate::batch::MessageView<'_>>, crate::batch::BatchError> {
        messages_from(&self.batches, self.offset)
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    /// `connect_with_timeout` kept getting a refused (or reset, or timed out) connection until
    /// its timeout ran out: no server listens at `addr`, or it is still starting.
    #[error(
        "cannot connect to {addr} within the connect timeout of {} ms ({} attempt{}): {source}",
        timeout.as_millis(),
        attempt_count,
        if *attempt_count == 1 { "" } else { "s" }
    )]
    ConnectTimeout {
        addr: std::net::SocketAddr,
        timeout: Duration,
        attempt_count: u32,
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("server error {code:?} ({}): {message}", *code as u32)]
    Server { code: ErrorCode, message: String },
    #[error("protocol violation by server: {0}")]
    Protocol(String),
    /// An earlier call failed or was cancelled in the middle of a frame. Calls no longer return
    /// it (they reconnect instead); kept so that callers matching on it still compile.
    #[error("connection unusable after an earlier request failed or was cancelled mid-frame")]
    Broken,
    /// The server answered with an Eviction: this client has no session (never registered, or
    /// evicted from the full client table) and the request was not applied. The client's session
    /// is cleared; its next session-tracked call registers a new one. `reason` is the server's
    /// text.
    #[error("client session evicted: {reason}")]
    Evicted { reason: String },
    /// `connect_any_with_timeout` reached none of `addresses` within `timeout`.
    #[error(
        "cannot connect to any of {addresses} within the connect timeout of {} ms ({} attempt{}): {source}",
        timeout.as_millis(),
        attempt_count,
        if *attempt_count == 1 { "" } else { "s" }
    )]
    ConnectAnyTimeout {
        addresses: String,
        timeout: Duration,
        attempt_count: u32,
        source: std::io::Error,
    },
    /// No server answered as the primary: every attempt of the call met `NotPrimary` or a
    /// connection failure until the retry budget or `NOT_PRIMARY_REDIRECT_MAX` ran out (a view
    /// change that does not complete, or no quorum alive). Nothing was applied by a `NotPrimary`
    /// answer; after a connection failure a session-tracked request may have been, and its
    /// resend later gets the cached reply. `last` is the last attempt's error.
    #[error(
        "no primary answered: {attempt_count} attempts over {addresses} ({redirect_count} NotPrimary answers); last error: {last}"
    )]
    NoPrimary {
        addresses: String,
        attempt_count: u32,
        redirect_count: u32,
        last: Box<ClientError>,
    },
    /// No reply came within the call's deadline (`with_request_timeout`, counted from the call's
    /// start over every attempt, wait and redirect): the server at `addr` holds the request
    /// without answering, as a replica that cannot reach a majority of its cluster does, or
    /// answered nothing usable in time. The request may or may not have been applied: the
    /// client's own retries resend it with the same request number, which the server
    /// deduplicates and answers with the outcome; a new call uses a new number (a change applied
    /// before is then refused, e.g. `StreamAlreadyExists`). The connection was closed; the next
    /// call reconnects. `last` is the error of the last failed attempt before the deadline, if
    /// any.
    #[error(
        "no reply from {addr} within the request timeout of {} ms ({} attempt{} over {addresses}){}: \
         is a majority of the replicas up? (a cluster answers a change only once a majority has it); \
         the request may or may not have been applied: resending it with the same request number \
         (as this client's own retries do) learns its outcome",
        timeout.as_millis(),
        attempt_count,
        if *attempt_count == 1 { "" } else { "s" },
        last.as_ref().map_or_else(String::new, |last| format!("; last error: {last}"))
    )]
    RequestTimeout {
        /// The address the client was waiting on when the deadline passed.
        addr: SocketAddr,
        /// Every address the client knows, comma-separated.
        addresses: String,
        /// The call's deadline, `Client::request_timeout`.
        timeout: Duration,
        /// Attempts started (sends, or reconnects before one), the one cut short included.
        attempt_count: u32,
        last: Option<Box<ClientError>>,
    },
}

/// The message of a `NotPrimary` answer without the primary's address (its body is empty): the
/// replica is in a view change, or does not know where the primary is.
pub const NO_PRIMARY_KNOWN: &str = "no primary known (a view change may be under way)";

/// What one call's attempts reached so far; kept outside the retry loop so that a call cut short
/// by its deadline can still report it.
#[derive(Debug, Default)]
struct Progress {
    attempt_count: u32,
    last: Option<ClientError>,
}

impl ClientError {
    /// Whether the same request may succeed if sent again later (the server applied nothing).
    /// The client has already retried these itself until its retry budget was spent.
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Server { code, .. } if code.is_retryable())
    }

    /// Whether the error says the connection failed (rather than the server answering).
    fn is_connection_failure(&self) -> bool {
        matches!(
            self,
            ClientError::Connect { .. }
                | ClientError::Broken
                | ClientError::Frame(
                    FrameError::Closed | FrameError::Truncated { .. } | FrameError::Io(_)
                )
        )
    }
}

/// Which failures of one call the client retries by itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RetryPolicy {
    /// Safe to apply twice or deduplicated by the session: resend after `Busy`, `ShuttingDown`
    /// or a connection failure.
    Resend,
    /// Not deduplicated (`SendMessages` without a producer): resend after `Busy` (nothing
    /// applied) or a failure before any byte was written, never after a failure once bytes may
    /// have been sent.
    Unsent,
}

impl RetryPolicy {
    /// The policy of `header`'s operation; numbers no `Operation` has get the cautious one. A
    /// `SendMessages` naming a producer is deduplicated by the owner shard, so it is resent.
    fn of(header: &Header) -> RetryPolicy {
        match Operation::from_u8(header.operation) {
            Some(Operation::SendMessages) if header.producer != 0 => RetryPolicy::Resend,
            Some(
                Operation::Ping
                | Operation::CreateStream
                | Operation::DeleteStream
                | Operation::CreateTopic
                | Operation::DeleteTopic
                | Operation::GetMetadata
                | Operation::PollMessages
                | Operation::Register
                | Operation::StoreOffset
                | Operation::GetOffset
                | Operation::CreateGroup
                | Operation::DeleteGroup
                | Operation::JoinGroup
                | Operation::LeaveGroup
                | Operation::GroupHeartbeat
                | Operation::AlterTopic,
            ) => RetryPolicy::Resend,
            Some(Operation::SendMessages) | None => RetryPolicy::Unsent,
        }
    }

    /// Whether an attempt that failed with `error` may be sent again. `written`: some request
    /// bytes may have reached the server.
    fn allows(self, error: &ClientError, written: bool) -> bool {
        match error {
            // A backup applies nothing: follow it to the primary.
            ClientError::Server {
                code: ErrorCode::Busy | ErrorCode::NotPrimary,
                ..
            } => true,
            // A shutting-down server closes the connection next, so for a send the resend would
            // fail after writing and hide this clearer error.
            ClientError::Server {
                code: ErrorCode::ShuttingDown,
                ..
            } => self == RetryPolicy::Resend,
            error if error.is_connection_failure() => !written || self == RetryPolicy::Resend,
            _ => false,
        }
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// A client id unlikely to collide across processes and connections: XXH3-128 of
/// `unique_seed`. Never 0.
fn client_id_new() -> u128 {
    twox_hash::XxHash3_128::oneshot(&unique_seed()).max(1)
}

/// Bytes that differ between every call in every process: the clock in nanoseconds, the process
/// id and a per-process counter. Hashed into client and producer ids.
pub(crate) fn unique_seed() -> [u8; 28] {
    static CALL_COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let mut seed = [0u8; 28];
    seed[..16].copy_from_slice(&nanos.to_le_bytes());
    seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    seed[20..].copy_from_slice(&CALL_COUNT.fetch_add(1, Ordering::Relaxed).to_le_bytes());
    seed
}

/// Whether a failed connect may succeed if tried again soon: nothing listens yet (refused), the
/// listener went away mid-handshake (reset, aborted), or the attempt timed out.
fn connect_is_transient(error: &std::io::Error) -> bool {
    matches!(
        error.kind(),
        std::io::ErrorKind::ConnectionRefused
            | std::io::ErrorKind::ConnectionReset
            | std::io::ErrorKind::ConnectionAborted
            | std::io::ErrorKind::TimedOut
    )
}

/// `A,B,C` for error messages.
fn address_list(addrs: &[SocketAddr]) -> String {
    addrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

/// Opens a TCP connection to `addr` with `TCP_NODELAY` (requests are small and latency-bound).
async fn open(addr: SocketAddr) -> Result<TcpStream, ClientError> {
    let stream = TcpStream::connect(addr)
        .await
        .map_err(|source| ClientError::Connect { addr, source })?;
    stream
        .set_nodelay(true)
        .map_err(|source| ClientError::Connect { addr, source })?;
    Ok(stream)
}

impl Client {
    /// Connects with `TCP_NODELAY` (requests are small and latency-bound), a reply limit of
    /// `MESSAGE_SIZE_MAX_DEFAULT` and a retry budget of `RETRY_BUDGET_DEFAULT`. Registers
    /// nothing: the session is opened by `register` or by the first session-tracked call.
    ///
    /// # Errors
    /// `Connect` if the connection or setting `TCP_NODELAY` fails (not retried).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing was sent.
    pub async fn connect(addr: std::net::SocketAddr) -> Result<Client, ClientError> {
        let stream = open(addr).await?;
        Ok(Client::on_stream(stream, vec![addr], 0))
    }

    /// A client on `stream`, which goes to `addrs[addr_index]`.
    fn on_stream(stream: TcpStream, addrs: Vec<SocketAddr>, addr_index: usize) -> Client {
        Client {
            stream: Some(stream),
            addr: addrs[addr_index],
            addrs,
            addr_index,
            id: client_id_new(),
            request_last: 0,
            session: None,
            max_message_size: MESSAGE_SIZE_MAX_DEFAULT,
            retry_budget: RETRY_BUDGET_DEFAULT,
            request_timeout: REQUEST_TIMEOUT_DEFAULT,
            broken: false,
        }
    }

    /// Connects to the first of `addrs` that accepts, trying each once in order, and keeps the
    /// list for failover (see the module doc). Otherwise as `connect`.
    ///
    /// # Errors
    /// The last address's `Connect` error when none accepts.
    ///
    /// # Panics
    /// If `addrs` is empty.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing was sent.
    pub async fn connect_any(addrs: &[SocketAddr]) -> Result<Client, ClientError> {
        assert!(!addrs.is_empty(), "connect_any needs at least one address");
        let mut last = None;
        for (index, addr) in addrs.iter().enumerate() {
            match open(*addr).await {
                Ok(stream) => return Ok(Client::on_stream(stream, addrs.to_vec(), index)),
                Err(error) => last = Some(error),
            }
        }
        Err(last.expect("at least one address was tried"))
    }

    /// `connect_any`, going round `addrs` in turn while connects are refused, reset or time out,
    /// with backoff doubling from `RETRY_BACKOFF_MIN` to `CONNECT_BACKOFF_MAX` after each round,
    /// until `timeout` has passed since the call. With one address this is
    /// `connect_with_timeout`.
    ///
    /// # Errors
    /// - `ConnectAnyTimeout` naming the addresses, the timeout, the attempts and the last error
    ///   (`ConnectTimeout` with one address).
    /// - `Connect` for an error retrying cannot fix (e.g. no route, permission denied).
    ///
    /// # Panics
    /// If `addrs` is empty.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing was sent.
    pub async fn connect_any_with_timeout(
        addrs: &[SocketAddr],
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        assert!(!addrs.is_empty(), "connect_any needs at least one address");
        if let [addr] = addrs {
            return Client::connect_with_timeout(*addr, timeout).await;
        }
        let started = Instant::now();
        let mut backoff = RETRY_BACKOFF_MIN;
        let mut attempt_count = 0u32;
        loop {
            let mut source = None;
            for (index, addr) in addrs.iter().enumerate() {
                attempt_count += 1;
                let left = timeout.saturating_sub(started.elapsed());
                let attempt = if left.is_zero() {
                    Ok(open(*addr).await)
                } else {
                    compio::time::timeout(left, open(*addr)).await
                };
                match attempt {
                    Ok(Ok(stream)) => return Ok(Client::on_stream(stream, addrs.to_vec(), index)),
                    Ok(Err(ClientError::Connect { source: error, .. }))
                        if connect_is_transient(&error) =>
                    {
                        source = Some(error);
                    }
                    Ok(Err(error)) => return Err(error),
                    Err(_) => source = Some(std::io::Error::from(std::io::ErrorKind::TimedOut)),
                }
            }
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(ClientError::ConnectAnyTimeout {
                    addresses: address_list(addrs),
                    timeout,
                    attempt_count,
                    source: source.expect("every address was tried"),
                });
            }
            tracing::debug!(attempt_count, "no address accepted a connection; retrying");
            compio::time::sleep(backoff.min(left)).await;
            backoff = backoff.saturating_mul(2).min(CONNECT_BACKOFF_MAX);
        }
    }

    /// `connect`, retrying a connection that is refused, reset or times out (no server listening
    /// yet, e.g. during its start or restart) with backoff doubling from `RETRY_BACKOFF_MIN` to
    /// `CONNECT_BACKOFF_MAX`, until `timeout` has passed since the call. Each attempt is itself
    /// bounded by the time left. Other connect errors are returned at once.
    ///
    /// # Errors
    /// - `ConnectTimeout` naming the address, the timeout, the attempts and the last error, when
    ///   no attempt succeeded within `timeout`.
    /// - `Connect` for an error retrying cannot fix (e.g. no route, permission denied).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing was sent.
    pub async fn connect_with_timeout(
        addr: SocketAddr,
        timeout: Duration,
    ) -> Result<Client, ClientError> {
        let started = Instant::now();
        let mut backoff = RETRY_BACKOFF_MIN;
        let mut attempt_count = 0u32;
        loop {
            attempt_count += 1;
            let left = timeout.saturating_sub(started.elapsed());
            // A zero timeout still makes its one attempt, without a timer.
            let attempt = if left.is_zero() {
                Ok(Client::connect(addr).await)
            } else {
                compio::time::timeout(left, Client::connect(addr)).await
            };
            let source = match attempt {
                Ok(Ok(client)) => return Ok(client),
                Ok(Err(ClientError::Connect { source, .. })) if connect_is_transient(&source) => {
                    source
                }
                Ok(Err(error)) => return Err(error),
                Err(_) => std::io::Error::from(std::io::ErrorKind::TimedOut),
            };
            let left = timeout.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Err(ClientError::ConnectTimeout {
                    addr,
                    timeout,
                    attempt_count,
                    source,
                });
            }
            tracing::debug!(%addr, attempt_count, error = %source, "connect failed; retrying");
            compio::time::sleep(backoff.min(left)).await;
            backoff = backoff.saturating_mul(2).min(CONNECT_BACKOFF_MAX);
        }
    }

    /// Sets the largest message (bytes, header included) this client sends or accepts.
    ///
    /// # Panics
    /// If `max_message_size` < 256 (no message would fit).
    #[must_use]
    pub fn with_max_message_size(mut self, max_message_size: u32) -> Client {
        assert!(
            max_message_size as usize >= HEADER_SIZE,
            "max_message_size {max_message_size} < 256"
        );
        self.max_message_size = max_message_size;
        self
    }

    /// Sets how long one call keeps retrying (waits included) before it returns its last error.
    /// `Duration::ZERO` makes one attempt per call, except that a connection left broken by an
    /// earlier call is still reconnected before sending.
    #[must_use]
    pub fn with_retry_budget(mut self, retry_budget: Duration) -> Client {
        self.retry_budget = retry_budget;
        self
    }

    /// Sets the deadline of each call (`request` and every operation over it): from the call's
    /// start to its reply, across its Register (when one goes first), retries, waits and
    /// `NotPrimary` redirects. When it passes the call returns `RequestTimeout` and the
    /// connection is closed. Default `REQUEST_TIMEOUT_DEFAULT`; `Duration::MAX` (or any
    /// duration past the clock's range) sets none.
    ///
    /// # Panics
    /// If `request_timeout` is zero (no call could be answered).
    #[must_use]
    pub fn with_request_timeout(mut self, request_timeout: Duration) -> Client {
        assert!(!request_timeout.is_zero(), "request timeout of 0");
        self.request_timeout = request_timeout;
        self
    }

    /// The deadline of each call, from its start to its reply.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// When a call started now must be answered; `None` when `request_timeout` reaches past the
    /// clock's range.
    fn deadline(&self) -> Option<Instant> {
        Instant::now().checked_add(self.request_timeout)
    }

    /// The address the client sends to now (the primary it last found, or the address it will
    /// reconnect to).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every address the client was given, in order.
    pub fn addresses(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// This client's id (header `client` of every request, kept across reconnects).
    pub fn client_id(&self) -> u128 {
        self.id
    }

    /// The largest message this client sends or accepts (bytes, header included).
    pub fn max_message_size(&self) -> u32 {
        self.max_message_size
    }

    /// How long one call keeps retrying before it returns its last error.
    pub fn retry_budget(&self) -> Duration {
        self.retry_budget
    }

    /// The session number of the last successful Register (the op number that committed it), or
    /// `None` before the first Register and after an Eviction.
    pub fn session(&self) -> Option<u64> {
        self.session
    }

    /// Opens a new session: sends Register with request number 0 (no number of the request
    /// counter is used), stores the reply's `offset` as the session and returns it. Registering
    /// again replaces the session. Retried like a session-tracked call.
    ///
    /// # Errors
    /// As `request`.
    ///
    /// # Cancel safety
    /// Not cancel safe: if dropped, the server may or may not have opened a session, and
    /// `session()` is unchanged; the next call reconnects if the connection was left mid-frame.
    /// The same holds after `RequestTimeout`.
    pub async fn register(&mut self) -> Result<u64, ClientError> {
        let deadline = self.deadline();
        self.register_until(deadline).await
    }

    /// `register`, answered by `deadline` (`None`: no deadline).
    async fn register_until(&mut self, deadline: Option<Instant>) -> Result<u64, ClientError> {
        let header = Client::request_header(Operation::Register, Namespace(0));
        let frame = self.send(header, Vec::new(), deadline).await?;
        Ok(frame.header.offset)
    }

    /// Sends `header` with `body` and returns the validated reply. Sets the header's `client`,
    /// `request` (next number; 0 for `Register`), `timestamp_us`, `size` and checksums; every
    /// other field is sent as given. The reply must be a `Reply` echoing `request` and
    /// `operation`. A session-tracked `operation` first registers if there is no session; a
    /// `Register` stores the session from the reply's `offset`. Retries as the operation allows
    /// (see the module doc); an operation number no `Operation` has is retried only after `Busy`
    /// or a failure before sending.
    ///
    /// # Errors
    /// - `Frame(SizeTooLarge)` before sending, if the request exceeds `max_message_size`.
    /// - `Frame(_)`: the write or the reply read failed (see `read_frame`) and was not retried
    ///   (or the retry budget ran out).
    /// - `Connect`: a reconnect failed and the retry budget ran out.
    /// - `Protocol`: the answer is no `Reply`/`Eviction`, answers another request or operation,
    ///   or carries an unknown error code.
    /// - `Server { code, message }`: the reply carries `error_code` != 0; `message` is its body.
    ///   `Busy`/`ShuttingDown` only once the retry budget ran out.
    /// - `Evicted { reason }`: the server answered with an Eviction; the session is cleared.
    /// - `NoPrimary`: no server answered as the primary (see the variant).
    /// - `RequestTimeout`: no reply within `request_timeout` of the call's start; the request
    ///   may or may not have been applied.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call may or may not have been applied, and its request number
    /// is used up; the next call reconnects if the connection was left mid-frame. A call ended
    /// by `RequestTimeout` is cancelled the same way, and its connection is closed, so its late
    /// reply is never read.
    pub async fn request(&mut self, header: Header, body: &[u8]) -> Result<Frame, ClientError> {
        self.exchange(header, body.to_vec()).await
    }

    /// `send`, after registering first if `header` is a session-tracked operation and there is
    /// no session.
    async fn exchange(&mut self, header: Header, body: Vec<u8>) -> Result<Frame, ClientError> {
        self.check_size(body.len())?;
        let tracked =
            Operation::from_u8(header.operation).is_some_and(Operation::is_session_tracked);
        let deadline = self.deadline();
        if tracked && self.session.is_none() {
            self.register_until(deadline).await?;
        }
        self.send(header, body, deadline).await
    }

    /// `Frame(SizeTooLarge)` if a request with a body of `body_size` bytes exceeds
    /// `max_message_size`.
    fn check_size(&self, body_size: usize) -> Result<(), ClientError> {
        let size = HEADER_SIZE.saturating_add(body_size);
        if size > self.max_message_size as usize {
            let size = u32::try_from(size).unwrap_or(u32::MAX);
            return Err(FrameError::SizeTooLarge {
                size,
                max: self.max_message_size,
            }
            .into());
        }
        Ok(())
    }

    /// Numbers and seals one request, sends it with retries until `deadline` (`None`: none), and
    /// keeps the session in step with the answer (Register sets it, Eviction clears it).
    async fn send(
        &mut self,
        mut header: Header,
        body: Vec<u8>,
        deadline: Option<Instant>,
    ) -> Result<Frame, ClientError> {
        self.check_size(body.len())?;
        let register = header.operation == Operation::Register as u8;
        header.client = self.id;
        header.request = if register {
            0
        } else {
            self.request_last += 1;
            self.request_last
        };
        header.timestamp_us = now_us();
        header.set_checksums(&body);
        let mut progress = Progress::default();
        let result = match deadline {
            None => self.send_with_retries(&header, body, &mut progress).await,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now());
                // A deadline already spent (by the Register before) sends nothing.
                let answer = if left.is_zero() {
                    None
                } else {
                    let retries = self.send_with_retries(&header, body, &mut progress);
                    compio::time::timeout(left, retries).await.ok()
                };
                match answer {
                    Some(result) => result,
                    None => Err(self.timed_out(progress)),
                }
            }
        };
        match &result {
            Ok(frame) if register => self.session = Some(frame.header.offset),
            Err(ClientError::Evicted { .. }) => self.session = None,
            _ => {}
        }
        result
    }

    /// Sends the sealed `header` and `body` until an attempt succeeds, fails in a way the
    /// operation's `RetryPolicy` does not retry, or the next wait would overrun the retry budget.
    /// Every attempt sends the same bytes.
    /// `progress` follows the attempts, for `timed_out` when the caller's deadline cuts this short.
    ///
    /// # Cancel safety
    /// Cancellable: a dropped call leaves `broken` set unless the connection is clean (see
    /// `timed_out`).
    async fn send_with_retries(
        &mut self,
        header: &Header,
        body: Vec<u8>,
        progress: &mut Progress,
    ) -> Result<Frame, ClientError> {
        let policy = RetryPolicy::of(header);
        let started = Instant::now();
        let mut backoff = RETRY_BACKOFF_MIN;
        let mut buffers = [bytemuck::bytes_of(header).to_vec(), body];
        let mut attempt_count = 0u32;
        let mut redirect_count = 0u32;
        let mut moved_at_once = false;
        loop {
            attempt_count += 1;
            progress.attempt_count = attempt_count;
            let (result, returned) = self.attempt(header, buffers).await;
            buffers = returned;
            let (error, written) = match result {
                Ok(frame) => return Ok(frame),
                Err(failure) => failure,
            };
            if !policy.allows(&error, written) {
                return Err(self.call_error(error, attempt_count, redirect_count));
            }
            // Where the next attempt goes, and whether it may go without waiting.
            let at_once = match &error {
                ClientError::Server {
                    code: ErrorCode::NotPrimary,
                    message,
                } => {
                    redirect_count += 1;
                    let moved = self.follow_not_primary(message);
                    moved && !std::mem::replace(&mut moved_at_once, moved)
                }
                error if error.is_connection_failure() => {
                    self.next_address();
                    false
                }
                _ => false,
            };
            if !at_once {
                moved_at_once = false;
            }
            let wait = if at_once { Duration::ZERO } else { backoff };
            if redirect_count > NOT_PRIMARY_REDIRECT_MAX
                || started.elapsed().saturating_add(wait) > self.retry_budget
            {
                return Err(self.call_error(error, attempt_count, redirect_count));
            }
            tracing::debug!(
                addr = %self.addr, request = header.request, operation = header.operation,
                wait_ms = wait.as_millis() as u64, %error, "retrying request"
            );
            progress.last = Some(error);
            if !wait.is_zero() {
                compio::time::sleep(wait).await;
                backoff = backoff.saturating_mul(2).min(RETRY_BACKOFF_MAX);
            }
        }
    }

    /// The error of a call whose deadline passed after `progress`; closes the connection, so
    /// that the reply the server may still send is never read (the next attempt reconnects).
    fn timed_out(&mut self, progress: Progress) -> ClientError {
        self.stream = None;
        self.broken = true;
        tracing::debug!(addr = %self.addr, attempt_count = progress.attempt_count, "request timed out");
        ClientError::RequestTimeout {
            addr: self.addr,
            addresses: address_list(&self.addrs),
            timeout: self.request_timeout,
            attempt_count: progress.attempt_count,
            last: progress.last.map(Box::new),
        }
    }

    /// Moves to the primary a `NotPrimary` answer names (`body`: its client address), or to the
    /// next address of the list when it names none, names the current one, or is not an
    /// address. Returns whether it moved to a named new address (the retry may go at once).
    fn follow_not_primary(&mut self, body: &str) -> bool {
        match body.trim().parse::<SocketAddr>() {
            Ok(primary) if primary != self.addr => {
                tracing::debug!(from = %self.addr, to = %primary, "following NotPrimary");
                self.addr = primary;
                if let Some(index) = self.addrs.iter().position(|addr| *addr == primary) {
                    self.addr_index = index;
                }
                self.broken = true;
                true
            }
            _ => {
                self.next_address();
                false
            }
        }
    }

    /// With several addresses: the next one of the list, reconnected before the next attempt.
    /// With one: back to it from a primary a `NotPrimary` named, else stays (the next attempt
    /// reconnects to it if the connection broke).
    fn next_address(&mut self) {
        if self.addrs.len() > 1 {
            self.addr_index = (self.addr_index + 1) % self.addrs.len();
        }
        let next = self.addrs[self.addr_index];
        if next != self.addr {
            self.addr = next;
            self.broken = true;
        }
    }

    /// The error a call returns after its last attempt failed with `error`: `NoPrimary` when the
    /// call was looking for the primary (it met `NotPrimary`, or failed to reach any of several
    /// addresses), else `error` itself.
    fn call_error(
        &self,
        error: ClientError,
        attempt_count: u32,
        redirect_count: u32,
    ) -> ClientError {
        let searching = matches!(
            error,
            ClientError::Server {
                code: ErrorCode::NotPrimary,
                ..
            }
        ) || (error.is_connection_failure()
            && (redirect_count > 0 || self.addrs.len() > 1));
        if searching {
            ClientError::NoPrimary {
                addresses: address_list(&self.addrs),
                attempt_count,
                redirect_count,
                last: Box::new(error),
            }
        } else {
            error
        }
    }

    /// One attempt: reconnects if the connection is broken, writes `buffers` (sealed header and
    /// body) and reads and validates the answer. Returns the buffers for a resend; an error comes
    /// with whether request bytes may have reached the server.
    async fn attempt(
        &mut self,
        header: &Header,
        buffers: [Vec<u8>; 2],
    ) -> (Result<Frame, (ClientError, bool)>, [Vec<u8>; 2]) {
        if self.broken || self.stream.is_none() {
            // The old connection (if any) is dropped here, unread.
            self.stream = None;
            match open(self.addr).await {
                Ok(stream) => {
                    self.stream = Some(stream);
                    self.broken = false;
                }
                Err(error) => return (Err((error, false)), buffers),
            }
        }
        self.broken = true;
        let Some(stream) = self.stream.as_mut() else {
            unreachable!("connected above");
        };
        // One vectored write: the body (a batch, possibly megabytes) is never copied.
        let BufResult(result, buffers) = stream.write_vectored_all(buffers).await;
        if let Err(error) = result {
            // The server may have answered before it closed (a `MessageTooLarge` refusal stops
            // reading the request): that answer says more than the failed write. The connection
            // is dead, so this read ends at once.
            if let Ok(frame) = read_frame(stream, self.max_message_size).await
                && frame.header.error_code != 0
                && let Err(answer) = self.validate(header, frame)
            {
                self.broken = true;
                return (Err((answer, true)), buffers);
            }
            return (Err((FrameError::Io(error).into(), true)), buffers);
        }
        let result = match read_frame(stream, self.max_message_size).await {
            Ok(frame) => self.validate(header, frame),
            Err(error) => Err(error.into()),
        };
        (result.map_err(|error| (error, true)), buffers)
    }

    /// Checks that `frame` answers `header` and maps it to the call's result; marks the
    /// connection usable again when it does.
    fn validate(&mut self, header: &Header, frame: Frame) -> Result<Frame, ClientError> {
        let reply = &frame.header;
        let evicted = reply.command == Command::Eviction as u8;
        if reply.command != Command::Reply as u8 && !evicted {
            return Err(ClientError::Protocol(format!(
                "expected a Reply to request {}, got command {}",
                header.request, reply.command
            )));
        }
        if reply.error_code == ErrorCode::ResourceExhausted as u32 && reply.request == 0 {
            // A refusal at accept (connection budget or no descriptor left) answers no request
            // of ours: the server sent it before reading any, then closed the connection.
            self.broken = true;
            let message = String::from_utf8_lossy(&frame.body).into_owned();
            return Err(ClientError::Server {
                code: ErrorCode::ResourceExhausted,
                message,
            });
        }
        if reply.request != header.request || reply.operation != header.operation {
            return Err(ClientError::Protocol(format!(
                "reply to request {} operation {} while waiting for request {} operation {}",
                reply.request, reply.operation, header.request, header.operation
            )));
        }
        self.broken = false;
        if evicted {
            let reason = String::from_utf8_lossy(&frame.body).into_owned();
            return Err(ClientError::Evicted { reason });
        }
        if reply.error_code != 0 {
            let Some(code) = ErrorCode::from_u32(reply.error_code) else {
                return Err(ClientError::Protocol(format!(
                    "unknown error code {}",
                    reply.error_code
                )));
            };
            if code == ErrorCode::MessageTooLarge {
                // The server closes the connection after it: reconnect before the next call.
                // (A `ResourceExhausted` answering a request, unlike the refusal at accept
                // above, leaves the connection open: a reconnect would need a descriptor the
                // server may not have.)
                self.broken = true;
            }
            let message = if code == ErrorCode::NotPrimary && frame.body.is_empty() {
                NO_PRIMARY_KNOWN.to_owned()
            } else {
                String::from_utf8_lossy(&frame.body).into_owned()
            };
            return Err(ClientError::Server { code, message });
        }
        Ok(frame)
    }

    fn request_header(operation: Operation, namespace: Namespace) -> Header {
        let mut header = Header::new(Command::Request, operation);
        header.namespace = namespace.0;
        header
    }

    /// Round trip with an empty body. Retried after `Busy`, `ShuttingDown` and connection
    /// failures.
    ///
    /// # Errors
    /// As `request`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn ping(&mut self) -> Result<(), ClientError> {
        let header = Client::request_header(Operation::Ping, Namespace(0));
        self.exchange(header, Vec::new()).await.map(drop)
    }

    /// Asks the server for its `max_message_size` (bytes, header included: the largest request
    /// frame it accepts), which a Ping reply carries in `count`. `None` when the reply's `count`
    /// is below the 256-byte header, as from a server that predates this field (it answers 0).
    /// Pass the answer to `with_max_message_size` so that oversized requests are refused here,
    /// with their size and the limit, rather than by the server closing the connection.
    ///
    /// # Errors
    /// As `ping`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn server_max_message_size(&mut self) -> Result<Option<u32>, ClientError> {
        let header = Client::request_header(Operation::Ping, Namespace(0));
        let reply = self.exchange(header, Vec::new()).await?;
        Ok(Some(reply.header.count).filter(|size| *size as usize >= HEADER_SIZE))
    }

    /// Creates stream `stream_id` named `name` (body: the UTF-8 name).
    ///
    /// Session-tracked: registers first if there is no session, and is retried (same request
    /// number) after `Busy`, `ShuttingDown` and connection failures; the server's deduplication
    /// makes the resend apply at most once.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: StreamAlreadyExists, .. }`, `Evicted`, or
    /// `Server { code: RequestStale, .. }` when the reply to a resend is no longer cached.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn create_stream(&mut self, stream_id: u32, name: &str) -> Result<(), ClientError> {
        let header =
            Client::request_header(Operation::CreateStream, Namespace::new(stream_id, 0, 0));
        self.exchange(header, name.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// Deletes stream `stream_id` and its topics.
    ///
    /// Session-tracked: registers first if there is no session, and is retried (same request
    /// number) after `Busy`, `ShuttingDown` and connection failures; the server's deduplication
    /// makes the resend apply at most once.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: StreamNotFound, .. }`, `Evicted`, or
    /// `Server { code: RequestStale, .. }` when the reply to a resend is no longer cached.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn delete_stream(&mut self, stream_id: u32) -> Result<(), ClientError> {
        let header =
            Client::request_header(Operation::DeleteStream, Namespace::new(stream_id, 0, 0));
        self.exchange(header, Vec::new()).await.map(drop)
    }

    /// Creates topic `topic_id` named `name` in stream `stream_id` with `partition_count`
    /// partitions (header `count`).
    ///
    /// Session-tracked: registers first if there is no session, and is retried (same request
    /// number) after `Busy`, `ShuttingDown` and connection failures; the server's deduplication
    /// makes the resend apply at most once.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: TopicAlreadyExists | StreamNotFound, .. }`, `Evicted`, or
    /// `Server { code: RequestStale, .. }` when the reply to a resend is no longer cached.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn create_topic(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        name: &str,
        partition_count: u32,
    ) -> Result<(), ClientError> {
        self.create_topic_with_retention(stream_id, topic_id, name, partition_count, 0, 0)
            .await
    }

    /// `create_topic` with retention (issue 11 section 4): the owner shard deletes a
    /// partition's oldest sealed segments once it holds more than `retention_bytes` bytes or
    /// they are older than `retention_ms` milliseconds; 0 means no limit of that kind.
    ///
    /// # Errors
    /// As `create_topic`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn create_topic_with_retention(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        name: &str,
        partition_count: u32,
        retention_bytes: u64,
        retention_ms: u64,
    ) -> Result<(), ClientError> {
        let mut header = Client::request_header(
            Operation::CreateTopic,
            Namespace::new(stream_id, topic_id, 0),
        );
        header.count = partition_count;
        header.retention_bytes = retention_bytes;
        header.retention_ms = retention_ms;
        self.exchange(header, name.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// Changes a topic's retention (issue 11 section 4): `None` keeps a limit as it is,
    /// `Some(0)` removes it. Session-tracked like `create_topic`.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: TopicNotFound | InvalidArgument, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn alter_topic(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        retention_bytes: Option<u64>,
        retention_ms: Option<u64>,
    ) -> Result<(), ClientError> {
        let mut header = Client::request_header(
            Operation::AlterTopic,
            Namespace::new(stream_id, topic_id, 0),
        );
        header.retention_bytes = retention_bytes.unwrap_or(u64::MAX);
        header.retention_ms = retention_ms.unwrap_or(u64::MAX);
        self.exchange(header, Vec::new()).await.map(drop)
    }

    /// Deletes topic `topic_id` of stream `stream_id`.
    ///
    /// Session-tracked: registers first if there is no session, and is retried (same request
    /// number) after `Busy`, `ShuttingDown` and connection failures; the server's deduplication
    /// makes the resend apply at most once.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: TopicNotFound, .. }`, `Evicted`, or
    /// `Server { code: RequestStale, .. }` when the reply to a resend is no longer cached.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn delete_topic(&mut self, stream_id: u32, topic_id: u16) -> Result<(), ClientError> {
        let header = Client::request_header(
            Operation::DeleteTopic,
            Namespace::new(stream_id, topic_id, 0),
        );
        self.exchange(header, Vec::new()).await.map(drop)
    }

    /// Streams, topics, partitions and owner shards (reply body: JSON of `Metadata`). Retried
    /// after `Busy`, `ShuttingDown` and connection failures.
    ///
    /// # Errors
    /// As `request`; `Protocol` if the body is not `Metadata` JSON.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn get_metadata(&mut self) -> Result<Metadata, ClientError> {
        let header = Client::request_header(Operation::GetMetadata, Namespace(0));
        let frame = self.exchange(header, Vec::new()).await?;
        serde_json::from_slice(&frame.body)
            .map_err(|error| ClientError::Protocol(format!("bad metadata body: {error}")))
    }

    /// Sends one batch built with `BatchBuilder`; the ack carries the base offset the owner
    /// shard assigned (reply `offset`) and the message count it appended (reply `count`).
    ///
    /// Data-plane sends are not deduplicated by the server, so the batch is resent only when
    /// nothing was applied: after a `Busy` reply, or when reconnecting a connection an earlier
    /// call left broken fails before any byte was written. A connection failure after the request
    /// was (partly) written is returned: the batch may or may not have been appended, and only
    /// the caller can decide whether a duplicate is acceptable.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: Busy | ShuttingDown | InvalidBatch | PartitionNotFound,
    /// .. }` (`Busy` once the retry budget ran out), or `Frame(Closed | Truncated | Io)` when the
    /// connection failed with the batch possibly appended.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`): the batch may or may not have been appended.
    pub async fn send_messages(
        &mut self,
        namespace: Namespace,
        batch: Vec<u8>,
    ) -> Result<SendAck, ClientError> {
        let header = Client::request_header(Operation::SendMessages, namespace);
        let frame = self.exchange(header, batch).await?;
        Ok(SendAck::from_reply(&frame.header))
    }

    /// Sends one batch of an idempotent producer: `batch` was finished with
    /// `BatchBuilder::finish_stamped(stamp)`, and the request header carries the same producer and
    /// sequence. The owner shard answers a resend of an appended batch with its original offsets,
    /// so this call resends the same bytes after `Busy`, `ShuttingDown`, a lost reply or a
    /// failed reconnect, until the retry budget runs out. Most callers want `Producer`, which
    /// numbers the sequences.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: SequenceGap, .. }` (the sequence is not the next one
    /// the owner shard expects, or is older than what it remembers), `Server { code:
    /// InvalidBatch, .. }` (the stamp disagrees with `stamp`), or a connection error once the
    /// retry budget ran out (the batch may or may not have been appended).
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`); sending the same bytes again is safe.
    pub async fn send_stamped(
        &mut self,
        namespace: Namespace,
        batch: Vec<u8>,
        stamp: ProducerStamp,
    ) -> Result<SendAck, ClientError> {
        let mut header = Client::request_header(Operation::SendMessages, namespace);
        header.producer = stamp.producer;
        header.sequence = stamp.sequence;
        let frame = self.exchange(header, batch).await?;
        Ok(SendAck::from_reply(&frame.header))
    }

    /// Reads up to `max_count` messages from `offset`: the batches from the one containing
    /// `offset`, with the partition's next and first offsets. A poll at exactly the next offset
    /// is an empty success (`PollResult::caught_up`). The intact batches before a damaged entry
    /// are returned; a poll that starts at the damaged entry gets the error. Retried after
    /// `Busy`, `ShuttingDown` and connection failures.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: PartitionNotFound, .. }`, `Server { code:
    /// OffsetOutOfRange, .. }` when `offset` is beyond the partition's next offset (the message
    /// names both), `Server { code: StorageFailure, .. }` naming the file and byte position of a
    /// damaged entry at `offset`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn poll(
        &mut self,
        namespace: Namespace,
        offset: u64,
        max_count: u32,
    ) -> Result<PollResult, ClientError> {
        let mut header = Client::request_header(Operation::PollMessages, namespace);
        header.offset = offset;
        header.count = max_count;
        let frame = self.exchange(header, Vec::new()).await?;
        Ok(PollResult {
            offset,
            message_count: frame.header.count,
            next_offset: frame.header.next_offset,
            first_offset: frame.header.first_offset,
            batches: frame.body,
        })
    }

    /// `poll`, returning only the reply body: concatenated batches starting at the batch
    /// containing `offset` (callers skip messages below `offset`); empty when the poll is caught
    /// up.
    ///
    /// The bytes are checked only up to the batch headers (the frame's `checksum_body`, issue 12
    /// item 1): parse them (`BatchView::parse_many`) before trusting any message.
    ///
    /// # Errors
    /// As `poll`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn poll_messages(
        &mut self,
        namespace: Namespace,
        offset: u64,
        max_count: u32,
    ) -> Result<Vec<u8>, ClientError> {
        Ok(self.poll(namespace, offset, max_count).await?.batches)
    }
}

impl Client {
    /// Stores `consumer`'s offset in partition `namespace` (issue 11 section 1): `offset` is
    /// the next offset it will read, so everything below it counts as consumed. For a group
    /// (`ConsumerKind::Group`) `generation` is the member's generation from `join_group` or
    /// `heartbeat`; it is ignored for a plain consumer. Durable by the partition's fsync policy
    /// when this returns. Retried after `Busy`, `ShuttingDown` and connection failures (storing
    /// the same offset twice is harmless).
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: PartitionNotFound | InvalidArgument, .. }`, or for a
    /// group `Server { code: NotGroupMember | PartitionNotAssigned, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`): the offset may or may not be stored.
    pub async fn store_offset(
        &mut self,
        namespace: Namespace,
        consumer: &Consumer,
        generation: u32,
        offset: u64,
    ) -> Result<(), ClientError> {
        let mut header = Client::request_header(Operation::StoreOffset, namespace);
        header.count = consumer.kind as u32;
        header.generation = generation;
        header.offset = offset;
        self.exchange(header, consumer.name.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// The offset `consumer` last stored in partition `namespace`, or `None` if it never stored
    /// one there.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: PartitionNotFound, .. }`.
    ///
    /// # Cancel safety
    /// Cancel safe in effect: it changes nothing (see `request` for the connection).
    pub async fn get_offset(
        &mut self,
        namespace: Namespace,
        consumer: &Consumer,
    ) -> Result<Option<u64>, ClientError> {
        let mut header = Client::request_header(Operation::GetOffset, namespace);
        header.count = consumer.kind as u32;
        let frame = self
            .exchange(header, consumer.name.as_bytes().to_vec())
            .await?;
        Ok((frame.header.count == 1).then_some(frame.header.offset))
    }

    /// Creates consumer group `group` on topic `topic_id` of stream `stream_id`.
    /// Session-tracked like `create_topic`.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: GroupAlreadyExists | TopicNotFound, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn create_group(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        group: &str,
    ) -> Result<(), ClientError> {
        let header = Client::request_header(
            Operation::CreateGroup,
            Namespace::new(stream_id, topic_id, 0),
        );
        self.exchange(header, group.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// Deletes consumer group `group` of a topic. Session-tracked like `create_topic`.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: GroupNotFound, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn delete_group(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        group: &str,
    ) -> Result<(), ClientError> {
        let header = Client::request_header(
            Operation::DeleteGroup,
            Namespace::new(stream_id, topic_id, 0),
        );
        self.exchange(header, group.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// Joins consumer group `group` as a member (this client's id) and returns the first
    /// assignment. Keep the membership alive with `heartbeat` within the server's session
    /// timeout.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: GroupNotFound | NotPrimary, .. }`, `Protocol` if the
    /// body is not `GroupAssignment` JSON.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn join_group(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        group: &str,
    ) -> Result<GroupAssignment, ClientError> {
        let header =
            Client::request_header(Operation::JoinGroup, Namespace::new(stream_id, topic_id, 0));
        let frame = self.exchange(header, group.as_bytes().to_vec()).await?;
        group_assignment(&frame.body)
    }

    /// Leaves consumer group `group`; its partitions go to the other members.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: GroupNotFound | NotGroupMember, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn leave_group(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        group: &str,
    ) -> Result<(), ClientError> {
        let header = Client::request_header(
            Operation::LeaveGroup,
            Namespace::new(stream_id, topic_id, 0),
        );
        self.exchange(header, group.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// A member's heartbeat: reports the partitions it still holds and returns its current
    /// assignment (a new generation after a rebalance).
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: NotGroupMember, .. }` (join again).
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn heartbeat(
        &mut self,
        stream_id: u32,
        topic_id: u16,
        heartbeat: &Heartbeat,
    ) -> Result<GroupAssignment, ClientError> {
        let header = Client::request_header(
            Operation::GroupHeartbeat,
            Namespace::new(stream_id, topic_id, 0),
        );
        let body = serde_json::to_vec(heartbeat).expect("a heartbeat serializes: plain data");
        let frame = self.exchange(header, body).await?;
        group_assignment(&frame.body)
    }

    /// `poll` that the owner shard may hold up to `wait` for a message at `offset` to arrive
    /// (issue 11 section 3): returns as soon as one is appended, or empty (caught up) when
    /// `wait` passes or the server stops. `wait` is clamped to `limits::POLL_WAIT_MAX` (the
    /// server clamps it too), and the request deadline is extended by the clamped wait.
    ///
    /// # Errors
    /// As `poll`; `Server { code: ResourceExhausted, .. }` when the owner shard already holds
    /// its maximum of parked polls.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn poll_wait(
        &mut self,
        namespace: Namespace,
        offset: u64,
        max_count: u32,
        wait: Duration,
    ) -> Result<PollResult, ClientError> {
        let wait = wait.min(crate::limits::POLL_WAIT_MAX);
        let saved = self.request_timeout;
        self.request_timeout = saved.saturating_add(wait);
        let mut header = Client::request_header(Operation::PollMessages, namespace);
        header.offset = offset;
        header.count = max_count;
        header.wait_ms = u32::try_from(wait.as_millis()).unwrap_or(u32::MAX);
        let result = self.exchange(header, Vec::new()).await;
        self.request_timeout = saved;
        let frame = result?;
        Ok(PollResult {
            offset,
            message_count: frame.header.count,
            next_offset: frame.header.next_offset,
            first_offset: frame.header.first_offset,
            batches: frame.body,
        })
    }
}

fn group_assignment(body: &[u8]) -> Result<GroupAssignment, ClientError> {
    serde_json::from_slice(body)
        .map_err(|error| ClientError::Protocol(format!("bad group assignment body: {error}")))
}

/// Helper for callers: the messages at or above `offset` in a poll reply body.
///
/// # Errors
/// The first `BatchError` of `BatchView::parse_many`.
pub fn messages_from(
    body: &[u8],
    offset: u64,
) -> Result<Vec<crate::batch::MessageView<'_>>, crate::batch::BatchError> {
    let batches = BatchView::parse_many(body)?;
    Ok(batches
        .into_iter()
        .flat_map(|b| b.messages())
        .filter(|m| m.offset >= offset)
        .collect())
}
