//! Async client library over compio TCP, used by the bench and the CLI. One request in flight per
//! connection.
//!
//! Every call sends one Request and reads exactly one Reply, which must echo the request number
//! and operation. The client never sends a request while the connection may hold bytes of an
//! earlier one (a call that failed mid-frame or was cancelled marks it broken), and never
//! allocates more than `max_message_size` for a reply.

use std::sync::atomic::{AtomicU64, Ordering};

use compio::BufResult;
use compio::io::AsyncWriteExt;
use compio::net::TcpStream;

use crate::batch::BatchView;
use crate::command::{Command, ErrorCode, Operation};
use crate::frame::{Frame, FrameError, read_frame};
use crate::header::{HEADER_SIZE, Header};
use crate::limits::MESSAGE_SIZE_MAX_DEFAULT;
use crate::namespace::Namespace;
use crate::wire::Metadata;

/// A connection to one server. Not `Sync`; use one per task.
#[derive(Debug)]
pub struct Client {
    stream: TcpStream,
    id: u128,
    /// Number of the last request sent; the next one is this plus 1 (the first is 1).
    request_last: u64,
    /// Bounds both the requests this client sends and the replies it accepts.
    max_message_size: u32,
    /// A request was started and its reply not fully read: the stream position is unknown.
    broken: bool,
}

/// The owner shard acknowledged a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendAck {
    pub base_offset: u64,
    pub message_count: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {addr}: {source}")]
    Connect {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Frame(#[from] FrameError),
    #[error("server error {code:?} ({}): {message}", *code as u32)]
    Server { code: ErrorCode, message: String },
    #[error("protocol violation by server: {0}")]
    Protocol(String),
    /// An earlier call failed or was cancelled in the middle of a frame; reconnect.
    #[error("connection unusable after an earlier request failed or was cancelled mid-frame")]
    Broken,
}

impl ClientError {
    /// Whether the same request may succeed if sent again (on this connection).
    pub fn is_retryable(&self) -> bool {
        matches!(self, ClientError::Server { code, .. } if code.is_retryable())
    }
}

/// Microseconds since the Unix epoch (0 if the clock is before it).
fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// A client id unlikely to collide across processes and connections: XXH3-128 of the clock in
/// nanoseconds, the process id and a per-process counter. Never 0.
fn client_id_new() -> u128 {
    static CONNECTION_COUNT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_nanos());
    let mut seed = [0u8; 28];
    seed[..16].copy_from_slice(&nanos.to_le_bytes());
    seed[16..20].copy_from_slice(&std::process::id().to_le_bytes());
    seed[20..].copy_from_slice(
        &CONNECTION_COUNT
            .fetch_add(1, Ordering::Relaxed)
            .to_le_bytes(),
    );
    twox_hash::XxHash3_128::oneshot(&seed).max(1)
}

impl Client {
    /// Connects with `TCP_NODELAY` (requests are small and latency-bound) and a reply limit of
    /// `MESSAGE_SIZE_MAX_DEFAULT`.
    ///
    /// # Errors
    /// `Connect` if the connection or setting `TCP_NODELAY` fails.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing was sent.
    pub async fn connect(addr: std::net::SocketAddr) -> Result<Client, ClientError> {
        let stream = TcpStream::connect(addr)
            .await
            .map_err(|source| ClientError::Connect { addr, source })?;
        stream
            .set_nodelay(true)
            .map_err(|source| ClientError::Connect { addr, source })?;
        Ok(Client {
            stream,
            id: client_id_new(),
            request_last: 0,
            max_message_size: MESSAGE_SIZE_MAX_DEFAULT,
            broken: false,
        })
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

    /// This connection's client id (header `client` of every request).
    pub fn client_id(&self) -> u128 {
        self.id
    }

    /// The largest message this client sends or accepts (bytes, header included).
    pub fn max_message_size(&self) -> u32 {
        self.max_message_size
    }

    /// Sends `header` with `body` and returns the validated reply. Sets the header's `client`,
    /// `request` (next number), `timestamp_us`, `size` and checksums; every other field is sent
    /// as given. The reply must be a `Reply` echoing `request` and `operation`.
    ///
    /// # Errors
    /// - `Frame(SizeTooLarge)` before sending, if the request exceeds `max_message_size`.
    /// - `Frame(_)`: the write or the reply read failed (see `read_frame`); the connection is
    ///   then broken.
    /// - `Protocol`: the reply is no `Reply`, answers another request or operation (connection
    ///   then broken), or carries an unknown error code.
    /// - `Server { code, message }`: the reply carries `error_code` != 0; `message` is its body.
    /// - `Broken`: an earlier call left the connection mid-frame.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped call marks the connection broken; later calls fail `Broken`.
    pub async fn request(&mut self, header: Header, body: &[u8]) -> Result<Frame, ClientError> {
        self.exchange(header, body.to_vec()).await
    }

    async fn exchange(&mut self, mut header: Header, body: Vec<u8>) -> Result<Frame, ClientError> {
        if self.broken {
            return Err(ClientError::Broken);
        }
        let size = HEADER_SIZE.saturating_add(body.len());
        if size > self.max_message_size as usize {
            let size = u32::try_from(size).unwrap_or(u32::MAX);
            return Err(FrameError::SizeTooLarge {
                size,
                max: self.max_message_size,
            }
            .into());
        }
        self.request_last += 1;
        header.client = self.id;
        header.request = self.request_last;
        header.timestamp_us = now_us();
        header.set_checksums(&body);
        let operation = header.operation;

        self.broken = true;
        let header_bytes = bytemuck::bytes_of(&header).to_vec();
        // One vectored write: the body (a batch, possibly megabytes) is never copied.
        let BufResult(result, _) = self.stream.write_vectored_all([header_bytes, body]).await;
        result.map_err(FrameError::Io)?;
        let frame = read_frame(&mut self.stream, self.max_message_size).await?;

        let reply = &frame.header;
        if reply.command != Command::Reply as u8 {
            return Err(ClientError::Protocol(format!(
                "expected a Reply to request {}, got command {}",
                header.request, reply.command
            )));
        }
        if reply.request != header.request || reply.operation != operation {
            return Err(ClientError::Protocol(format!(
                "reply to request {} operation {} while waiting for request {} operation {}",
                reply.request, reply.operation, header.request, operation
            )));
        }
        self.broken = false;
        if reply.error_code != 0 {
            let Some(code) = ErrorCode::from_u32(reply.error_code) else {
                return Err(ClientError::Protocol(format!(
                    "unknown error code {}",
                    reply.error_code
                )));
            };
            let message = String::from_utf8_lossy(&frame.body).into_owned();
            return Err(ClientError::Server { code, message });
        }
        Ok(frame)
    }

    fn request_header(operation: Operation, namespace: Namespace) -> Header {
        let mut header = Header::new(Command::Request, operation);
        header.namespace = namespace.0;
        header
    }

    /// Round trip with an empty body.
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

    /// Creates stream `stream_id` named `name` (body: the UTF-8 name).
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: StreamAlreadyExists, .. }`.
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
    /// # Errors
    /// As `request`; e.g. `Server { code: StreamNotFound, .. }`.
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
    /// # Errors
    /// As `request`; e.g. `Server { code: TopicAlreadyExists | StreamNotFound, .. }`.
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
        let mut header = Client::request_header(
            Operation::CreateTopic,
            Namespace::new(stream_id, topic_id, 0),
        );
        header.count = partition_count;
        self.exchange(header, name.as_bytes().to_vec())
            .await
            .map(drop)
    }

    /// Deletes topic `topic_id` of stream `stream_id`.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: TopicNotFound, .. }`.
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

    /// Streams, topics, partitions and owner shards (reply body: JSON of `Metadata`).
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
    /// # Errors
    /// As `request`; e.g. `Server { code: Busy | InvalidBatch | PartitionNotFound, .. }`.
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
        Ok(SendAck {
            base_offset: frame.header.offset,
            message_count: frame.header.count,
        })
    }

    /// Returns the reply body: concatenated batches starting at the batch containing `offset`
    /// (callers skip messages below `offset`); empty when nothing is there yet.
    ///
    /// # Errors
    /// As `request`; e.g. `Server { code: PartitionNotFound, .. }`.
    ///
    /// # Cancel safety
    /// Not cancel safe (see `request`).
    pub async fn poll_messages(
        &mut self,
        namespace: Namespace,
        offset: u64,
        max_count: u32,
    ) -> Result<Vec<u8>, ClientError> {
        let mut header = Client::request_header(Operation::PollMessages, namespace);
        header.offset = offset;
        header.count = max_count;
        Ok(self.exchange(header, Vec::new()).await?.body)
    }
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
