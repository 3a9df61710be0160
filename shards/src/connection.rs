//! One client connection on the shard that accepted it: read a frame, route it (locally, to the
//! owner shard, or to shard 0 for metadata), write the reply. A malformed frame closes this
//! connection only, with the reason logged.

use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use bus::{Command, ErrorCode, Frame, Namespace, Operation};
use compio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use compio::net::TcpStream;
use runtime::ShardId;

use crate::frame::{PartitionEnds, ShardReply, ShardRequest};
use crate::limits::{
    FRAME_BODY_TIMEOUT, OVERSIZED_DRAIN_CHUNK_BYTES, OVERSIZED_DRAIN_TIMEOUT,
    RECEIVE_BUDGET_WAIT_MAX, REPLY_WRITE_TIMEOUT, SPLICE_REPLY_BYTES_MIN,
};
use crate::metadata::MetadataOp;
use crate::shard::Shard;
use crate::shard_for;
use crate::vsr::prepare::PrepareOperation;

/// Releases the connection's slot in the shard's budget however the task ends (cancellation at
/// shutdown included).
struct ConnectionSlot(Rc<Shard>);

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.0.connection_closed();
    }
}

/// Serves one connection until the peer closes it, sends a malformed frame, idles past the
/// configured idle timeout, leaves a reply unread past `REPLY_WRITE_TIMEOUT`, or the task is
/// cancelled at shutdown. The caller admitted it with `Shard::try_admit_connection`.
///
/// At shutdown the drain shuts the socket's read side: the request being handled is finished and
/// answered, requests the client had already sent are answered `ShuttingDown` without being
/// applied, and the end of stream ends the task.
pub async fn serve_connection(shard: Rc<Shard>, mut stream: TcpStream, peer: SocketAddr) {
    let _slot = ConnectionSlot(Rc::clone(&shard));
    let max_message_size = shard.config.max_message_size;
    loop {
        let read = bus::read_request_header(&mut stream, max_message_size);
        let idle_timeout = shard.config.connection_idle_timeout;
        let header = match compio::time::timeout(idle_timeout, read).await {
            Ok(Ok(header)) => header,
            Ok(Err(bus::FrameError::Closed)) => {
                tracing::debug!(shard = shard.id.0, %peer, "connection closed by peer");
                return;
            }
            Ok(Err(e)) => {
                log_read_error(&shard, peer, &e);
                match e {
                    bus::FrameError::RequestTooLarge { request, size, max } => {
                        refuse_too_large(&shard, stream, peer, &request, size, max).await;
                    }
                    bus::FrameError::RequestOfOtherVersion { request, .. } => {
                        refuse_other_version(&shard, stream, peer, &request).await;
                    }
                    _ => {}
                }
                return;
            }
            Err(_) => {
                tracing::info!(
                    shard = shard.id.0, %peer, idle_s = idle_timeout.as_secs(),
                    "closing connection: no complete frame within the idle timeout"
                );
                return;
            }
        };
        if header.command != Command::Request as u8 {
            tracing::warn!(
                shard = shard.id.0, %peer, command = header.command,
                "closing connection: clients may only send requests"
            );
            return;
        }
        let reserve = shard.reserve_receive_bytes(header.body_size() as u64);
        let Ok(_body_permit) = compio::time::timeout(RECEIVE_BUDGET_WAIT_MAX, reserve).await else {
            // The body is still in the socket, so there is no way to answer and go on.
            tracing::warn!(
                shard = shard.id.0, %peer, size = header.size, wait_s = RECEIVE_BUDGET_WAIT_MAX.as_secs(),
                "closing connection: the shard's receive budget stayed full (other connections hold request memory)"
            );
            return;
        };
        let read = bus::read_body(&mut stream, &header);
        let body = match compio::time::timeout(FRAME_BODY_TIMEOUT, read).await {
            Ok(Ok(body)) => body,
            Ok(Err(e)) => {
                log_read_error(&shard, peer, &e);
                return;
            }
            Err(_) => {
                tracing::warn!(
                    shard = shard.id.0, %peer, size = header.size, timeout_s = FRAME_BODY_TIMEOUT.as_secs(),
                    "closing connection: body not received within the frame timeout"
                );
                return;
            }
        };
        let frame = Frame { header, body };
        if shard.endpoint_stopped() {
            // Read after the stop signal (the drain answers only what was read before it): not
            // applied, and the client is told so.
            let refusal = bus::reply::error_reply(
                &frame.header,
                ErrorCode::ShuttingDown,
                "the server is stopping; this request was not applied, retry after the restart",
            );
            if !write_reply(&shard, &mut stream, peer, refusal, Vec::new()).await {
                return;
            }
            continue;
        }
        // A poll reply is up to `poll_bytes_max` of memory held until the client reads it: it
        // counts against the same budget, so clients that never read cannot grow memory.
        let mut reply_permit = None;
        if frame.header.operation == Operation::PollMessages as u8 {
            // Wait first, then reserve: a parked poll holds no reply budget (issue 11 section 3).
            if let Some((head, body)) = wait_for_message(&shard, &frame.header).await {
                if !write_reply(&shard, &mut stream, peer, head, body).await {
                    return;
                }
                continue;
            }
            let reserve = shard.reserve_receive_bytes(shard.poll_bytes_max() as u64);
            let Ok(permit) = compio::time::timeout(RECEIVE_BUDGET_WAIT_MAX, reserve).await else {
                let busy = bus::reply::error_reply(
                    &frame.header,
                    ErrorCode::Busy,
                    "the shard's reply memory budget is full (clients are not reading their replies); retry",
                );
                if !write_reply(&shard, &mut stream, peer, busy, Vec::new()).await {
                    return;
                }
                continue;
            };
            reply_permit = Some(permit);
        }
        let written = match handle_request(&shard, frame).await {
            Answer::Encoded((head, body)) => {
                if let Some(permit) = reply_permit.as_mut() {
                    permit.shrink_to(body.len() as u64);
                }
                write_reply(&shard, &mut stream, peer, head, body).await
            }
            Answer::Polled { head, spans } => {
                if let Some(permit) = reply_permit.as_mut() {
                    permit.shrink_to(spans.size_bytes());
                }
                write_polled_reply(&shard, &mut stream, peer, head, spans).await
            }
        };
        if !written {
            return;
        }
    }
}

/// How long the owner may park a poll whose header asks for `wait_ms`: at most
/// `bus::limits::POLL_WAIT_MAX` (issue 11 section 3); zero means no wait.
pub fn poll_wait(wait_ms: u32) -> Duration {
    Duration::from_millis(u64::from(wait_ms)).min(bus::limits::POLL_WAIT_MAX)
}

/// For a poll with a wait (header `wait_ms` > 0): waits on the owner shard until its partition has
/// a message at the poll's offset, the wait (`poll_wait`) passes or the server stops, holding no
/// reply budget meanwhile. `None` when the poll goes on (no wait asked, or the wait ended; a
/// poll the owner would refuse goes on at once and is refused by `handle_request`), or the
/// refusal to send instead: `ResourceExhausted` when the owner holds `--parked-polls-max`
/// parked polls.
///
/// # Cancel safety
/// Cancel safe: a dropped wait frees its parked slot on the owner (a remote one when its reply
/// arrives or its wait ends).
async fn wait_for_message(shard: &Rc<Shard>, header: &bus::Header) -> Option<EncodedReply> {
    let namespace = Namespace(header.namespace);
    if header.wait_ms == 0
        || header.count == 0
        || shard.check_serves_data().is_err()
        || !shard.partition_exists(namespace)
    {
        return None;
    }
    let request = ShardRequest::AwaitMessage {
        namespace,
        offset: header.offset,
        wait: poll_wait(header.wait_ms),
    };
    match shard
        .call(shard_for(namespace, shard.shard_count), request)
        .await
    {
        ShardReply::Parked(_) => None,
        ShardReply::Error { code, message } => Some(error_reply(header, code, &message)),
        _ => Some(error_reply(header, ErrorCode::Internal, "unexpected reply")),
    }
}

/// Counts the answer `head` (a reply frame's header, or a whole small frame) in the shard's
/// request table, by the operation it answers and its error code.
fn count_answer(shard: &Shard, head: &[u8]) {
    let Some(header_bytes) = head.get(..bus::HEADER_SIZE) else {
        return;
    };
    let header: bus::Header = bytemuck::pod_read_unaligned(header_bytes);
    shard
        .metrics()
        .answered(header.operation, header.error_code);
}

/// Writes one reply within `REPLY_WRITE_TIMEOUT` (counted in the shard's request table whether
/// or not the write succeeds); false when the connection must close.
async fn write_reply(
    shard: &Shard,
    stream: &mut TcpStream,
    peer: SocketAddr,
    head: Vec<u8>,
    body: Vec<u8>,
) -> bool {
    count_answer(shard, &head);
    let write = async {
        if body.is_empty() {
            stream.write_all(head).await.0
        } else {
            // Header and body in one vectored write: a poll reply is never copied again.
            stream.write_vectored_all([head, body]).await.0
        }
    };
    let Ok(result) = compio::time::timeout(REPLY_WRITE_TIMEOUT, write).await else {
        tracing::info!(
            shard = shard.id.0, %peer, timeout_s = REPLY_WRITE_TIMEOUT.as_secs(),
            "closing connection: the client did not read its reply"
        );
        return false;
    };
    if let Err(e) = result {
        tracing::debug!(shard = shard.id.0, %peer, error = %e, "closing connection: write failed");
        return false;
    }
    true
}

/// Writes a successful poll reply within `REPLY_WRITE_TIMEOUT`, like `write_reply` (counted,
/// false when the connection must close): the header, then the verified spans without a copy
/// (`splice::send_mapped`) when the reply holds at least `SPLICE_REPLY_BYTES_MIN` bytes, a span
/// is mapped and a splice pipe is free, else the copying path (the spans copied into one body,
/// one vectored write). Issue 12 item 2.
///
/// A reply that fails or times out midway has sent fewer bytes than its header announced: the
/// caller closes the connection (a failure to take the pages, which means a segment shrank
/// under the reply, is logged at error with the file and position).
async fn write_polled_reply(
    shard: &Shard,
    stream: &mut TcpStream,
    peer: SocketAddr,
    head: Vec<u8>,
    spans: storage::VerifiedSpans,
) -> bool {
    let lease = if spans.any_mapped() && spans.size_bytes() >= SPLICE_REPLY_BYTES_MIN {
        shard.splice_pipes.take()
    } else {
        None
    };
    let Some(lease) = lease else {
        return write_reply(shard, stream, peer, head, spans.to_vec()).await;
    };
    count_answer(shard, &head);
    let write = async {
        stream
            .write_all(head)
            .await
            .0
            .map_err(crate::splice::SpliceError::Socket)?;
        for span in spans.into_spans() {
            match span.into_copied() {
                // Read with a copy (not in the page cache when read): its own buffer is sent.
                Ok(bytes) => {
                    stream
                        .write_all(bytes)
                        .await
                        .0
                        .map_err(crate::splice::SpliceError::Socket)?;
                }
                Err(span) => {
                    let (path, position) = (span.path(), span.position());
                    crate::splice::send_mapped(stream, &lease, span.bytes(), path, position)
                        .await?;
                }
            }
        }
        Ok::<(), crate::splice::SpliceError>(())
    };
    let Ok(result) = compio::time::timeout(REPLY_WRITE_TIMEOUT, write).await else {
        tracing::info!(
            shard = shard.id.0, %peer, timeout_s = REPLY_WRITE_TIMEOUT.as_secs(),
            "closing connection: the client did not read its reply"
        );
        return false;
    };
    match result {
        Ok(()) => {
            lease.release();
            true
        }
        Err(e @ crate::splice::SpliceError::Pages { .. }) => {
            tracing::error!(
                shard = shard.id.0, %peer, error = %e,
                "closing connection: a poll reply's verified bytes could not be sent (a segment shrank under the reply?)"
            );
            false
        }
        Err(e) => {
            tracing::debug!(shard = shard.id.0, %peer, error = %e, "closing connection: write failed");
            false
        }
    }
}

/// Answers a request whose frame exceeds `max_message_size` with `MessageTooLarge` (naming the
/// size and the limit), then closes (`answer_then_close`).
async fn refuse_too_large(
    shard: &Shard,
    stream: TcpStream,
    peer: SocketAddr,
    request: &bus::Header,
    size: u32,
    max: u32,
) {
    if request.command != Command::Request as u8 {
        return;
    }
    let message = format!(
        "request of {size} bytes exceeds the server's max_message_size of {max} bytes (a whole \
         frame: the 256-byte header plus the body; serve --max-message-size); the connection \
         is closed"
    );
    let reply = bus::reply::error_reply(request, ErrorCode::MessageTooLarge, &message);
    answer_then_close(shard, stream, peer, reply, size).await;
}

/// Answers a request of an older protocol version in its own version
/// (`bus::reply::older_protocol_error_reply`: the client shows "this server speaks protocol
/// version 3 ..." rather than a closed connection), then closes as `answer_then_close` does. A
/// header of any other version gets no answer: the connection just closes.
async fn refuse_other_version(
    shard: &Shard,
    stream: TcpStream,
    peer: SocketAddr,
    request: &bus::Header,
) {
    if let Some(reply) = bus::reply::older_protocol_error_reply(request) {
        answer_then_close(shard, stream, peer, reply, request.size).await;
    }
}

/// Writes `reply`, then closes: half-close first and discard what the client still sends, for
/// at most `OVERSIZED_DRAIN_TIMEOUT` and the rest of the request's announced `size`, so that
/// closing with unread bytes (which makes the kernel send a reset) cannot destroy the reply
/// before the client reads it (the "lingering close" of HTTP servers).
async fn answer_then_close(
    shard: &Shard,
    mut stream: TcpStream,
    peer: SocketAddr,
    reply: Vec<u8>,
    size: u32,
) {
    if !write_reply(shard, &mut stream, peer, reply, Vec::new()).await {
        return;
    }
    let drain = async {
        if stream.shutdown().await.is_err() {
            return;
        }
        let mut left = u64::from(size).saturating_sub(bus::HEADER_SIZE as u64);
        let mut buffer = Vec::with_capacity(OVERSIZED_DRAIN_CHUNK_BYTES);
        while left > 0 {
            let compio::BufResult(result, returned) = stream.read(buffer).await;
            buffer = returned;
            match result {
                Ok(0) | Err(_) => return,
                Ok(read) => left = left.saturating_sub(read as u64),
            }
            buffer.clear();
        }
    };
    let _ = compio::time::timeout(OVERSIZED_DRAIN_TIMEOUT, drain).await;
}

/// Logs why a read ended the connection: a transport error at debug, a malformed frame (the
/// peer's fault, worth an operator's look) at warn with the reason.
fn log_read_error(shard: &Shard, peer: SocketAddr, error: &bus::FrameError) {
    if let bus::FrameError::Io(e) = error {
        tracing::debug!(shard = shard.id.0, %peer, error = %e, "closing connection: read failed");
    } else {
        tracing::warn!(shard = shard.id.0, %peer, reason = %error, "closing connection: malformed frame");
    }
}

fn name_from(body: &[u8]) -> Result<String, ShardReply> {
    String::from_utf8(body.to_vec())
        .map_err(|_| ShardReply::error(ErrorCode::InvalidArgument, "name is not valid UTF-8"))
}

/// An encoded reply: header bytes (or a whole small frame) and a body written after it.
type EncodedReply = (Vec<u8>, Vec<u8>);

/// What `handle_request` answers: an encoded reply, or a successful poll's header (sealed with
/// the body's size and the checksum of its batch headers) and its verified spans, sent after it
/// without a copy when possible (`write_polled_reply`).
enum Answer {
    Encoded(EncodedReply),
    Polled {
        head: Vec<u8>,
        spans: storage::VerifiedSpans,
    },
}

fn error_reply(request: &bus::Header, code: ErrorCode, message: &str) -> EncodedReply {
    (bus::reply::error_reply(request, code, message), Vec::new())
}

/// Routes one validated request and returns the encoded reply.
async fn handle_request(shard: &Rc<Shard>, frame: Frame) -> Answer {
    let Frame { header, body } = frame;
    let header = &header;
    let Some(operation) = Operation::from_u8(header.operation) else {
        // read_frame rejects unknown operations; reaching this is a bus bug.
        return Answer::Encoded(error_reply(
            header,
            ErrorCode::Internal,
            "unknown operation",
        ));
    };
    let namespace = Namespace(header.namespace);
    let reply = match operation {
        // `count` carries this server's max_message_size, so clients can size their batches.
        Operation::Ping => {
            return Answer::Encoded(encode_ok(
                header,
                Vec::new(),
                0,
                shard.config.max_message_size,
            ));
        }
        Operation::CreateStream => match name_from(&body) {
            Ok(name) => {
                metadata(
                    shard,
                    header,
                    MetadataOp::CreateStream {
                        stream_id: namespace.stream_id(),
                        name,
                    },
                )
                .await
            }
            Err(reply) => reply,
        },
        Operation::DeleteStream => {
            metadata(
                shard,
                header,
                MetadataOp::DeleteStream {
                    stream_id: namespace.stream_id(),
                },
            )
            .await
        }
        Operation::CreateTopic => match name_from(&body) {
            Ok(name) => {
                let op = MetadataOp::CreateTopic {
                    stream_id: namespace.stream_id(),
                    topic_id: namespace.topic_id(),
                    name,
                    partition_count: header.count,
                    retention: crate::metadata::Retention {
                        bytes: header.retention_bytes,
                        ms: header.retention_ms,
                    },
                };
                metadata(shard, header, op).await
            }
            Err(reply) => reply,
        },
        Operation::DeleteTopic => {
            let op = MetadataOp::DeleteTopic {
                stream_id: namespace.stream_id(),
                topic_id: namespace.topic_id(),
            };
            metadata(shard, header, op).await
        }
        Operation::AlterTopic => {
            let keep_or = |value: u64| (value != u64::MAX).then_some(value);
            let op = MetadataOp::AlterTopic {
                stream_id: namespace.stream_id(),
                topic_id: namespace.topic_id(),
                retention_bytes: keep_or(header.retention_bytes),
                retention_ms: keep_or(header.retention_ms),
            };
            metadata(shard, header, op).await
        }
        Operation::CreateGroup | Operation::DeleteGroup => match name_from(&body) {
            Ok(name) => {
                let (stream_id, topic_id) = (namespace.stream_id(), namespace.topic_id());
                let op = if operation == Operation::CreateGroup {
                    MetadataOp::CreateGroup {
                        stream_id,
                        topic_id,
                        name,
                    }
                } else {
                    MetadataOp::DeleteGroup {
                        stream_id,
                        topic_id,
                        name,
                    }
                };
                metadata(shard, header, op).await
            }
            Err(reply) => reply,
        },
        Operation::JoinGroup | Operation::LeaveGroup | Operation::GroupHeartbeat => {
            crate::groups::handle(shard, header, body).await
        }
        Operation::StoreOffset | Operation::GetOffset => {
            crate::offsets::handle(shard, header, body).await
        }
        Operation::GetMetadata => return Answer::Encoded(get_metadata(shard, header).await),
        Operation::Register => {
            let request = ShardRequest::Metadata {
                client: header.client,
                request: header.request,
                operation: PrepareOperation::Register,
            };
            shard.call(ShardId(0), request).await
        }
        Operation::SendMessages | Operation::PollMessages
            if let Err(reply) = shard.check_serves_data() =>
        {
            reply
        }
        Operation::SendMessages => {
            // `parse_for_append` checks the batch and every message checksum (issue 12 item 1: one
            // pass over the payloads under the message-headers rule, two for a batch of the
            // older section rule; the frame's checksum_body covered only the batch header), and
            // that the checksum covers the timestamp, with no unknown flag (the timestamp rule).
            if !shard.partition_exists(namespace) {
                shard.missing_partition(namespace)
            } else if let Err(e) = bus::BatchView::parse_for_append(&body)
                .and_then(|batch| batch.check_producer(header.producer, header.sequence))
            {
                // The owner answers, so the refusal carries the partition's ends.
                let request = ShardRequest::Refuse {
                    namespace,
                    code: ErrorCode::InvalidBatch,
                    message: e.to_string(),
                };
                shard
                    .call(shard_for(namespace, shard.shard_count), request)
                    .await
            } else {
                let owner = shard_for(namespace, shard.shard_count);
                shard
                    .call(
                        owner,
                        ShardRequest::Send {
                            namespace,
                            batch: body,
                        },
                    )
                    .await
            }
        }
        Operation::PollMessages => {
            if !shard.partition_exists(namespace) {
                shard.missing_partition(namespace)
            } else if header.count == 0 {
                ShardReply::error(
                    ErrorCode::InvalidArgument,
                    "poll max count must be at least 1",
                )
            } else {
                let owner = shard_for(namespace, shard.shard_count);
                let request = ShardRequest::Poll {
                    namespace,
                    offset: header.offset,
                    max_count: header.count,
                };
                shard.call(owner, request).await
            }
        }
    };
    let encoded = match reply {
        ShardReply::Sent {
            base_offset,
            message_count,
            ends,
        } => encode_partition_reply(header, Vec::new(), base_offset, message_count, ends),
        ShardReply::Polled {
            spans,
            message_count,
            ends,
        } => {
            return Answer::Polled {
                head: encode_polled_header(header, &spans, message_count, ends),
                spans,
            };
        }
        ShardReply::OffsetOutOfRange {
            namespace,
            offset,
            ends,
        } => offset_out_of_range(header, namespace, offset, ends),
        ShardReply::MetadataDone => encode_ok(header, Vec::new(), 0, 0),
        ShardReply::Ok {
            offset,
            count,
            generation,
            body,
        } => {
            let mut reply = bus::reply::reply_header(header);
            reply.offset = offset;
            reply.count = count;
            reply.generation = generation;
            reply.set_checksums(&body);
            (bytemuck::bytes_of(&reply).to_vec(), body)
        }
        ShardReply::Registered { session } => encode_ok(header, Vec::new(), session, 0),
        ShardReply::Cached(cached) => {
            if cached.operation != header.operation {
                // Same (client, request) with another operation: the client reused a request
                // number, which its library never does. Refuse rather than answer wrongly.
                return Answer::Encoded(error_reply(
                    header,
                    ErrorCode::InvalidArgument,
                    &format!(
                        "request {} was committed as operation {}, not {}; request numbers must not be reused",
                        header.request, cached.operation, header.operation
                    ),
                ));
            }
            let mut reply = bus::reply::reply_header(header);
            reply.error_code = cached.error_code;
            reply.offset = cached.offset;
            reply.count = cached.count;
            reply.set_checksums(&cached.body);
            (bytemuck::bytes_of(&reply).to_vec(), cached.body)
        }
        ShardReply::Evicted { reason } => (bus::reply::eviction(header, &reason), Vec::new()),
        ShardReply::NotPrimary {
            view,
            primary,
            address,
        } => not_primary_reply(header, view, primary, &address),
        ShardReply::Error { code, message } => error_reply(header, code, &message),
        ShardReply::PartitionError {
            code,
            message,
            ends,
        } => (
            bus::reply::partition_error_reply(
                header,
                code,
                &message,
                ends.next_offset,
                ends.first_offset,
            ),
            Vec::new(),
        ),
        ShardReply::Offsets(_)
        | ShardReply::Status(_)
        | ShardReply::Group(_)
        | ShardReply::Parked(_) => error_reply(header, ErrorCode::Internal, "unexpected reply"),
    };
    Answer::Encoded(encoded)
}

/// Sends a session-tracked metadata change of the request's client to shard 0.
async fn metadata(shard: &Rc<Shard>, header: &bus::Header, op: MetadataOp) -> ShardReply {
    let request = ShardRequest::Metadata {
        client: header.client,
        request: header.request,
        operation: PrepareOperation::Metadata(op),
    };
    shard.call(ShardId(0), request).await
}

async fn get_metadata(shard: &Rc<Shard>, header: &bus::Header) -> EncodedReply {
    let mut offsets = ahash::AHashMap::new();
    for target in 0..shard.shard_count {
        match shard
            .call(ShardId(target), ShardRequest::PartitionOffsets)
            .await
        {
            ShardReply::Offsets(list) => offsets.extend(list),
            ShardReply::Error { code, message } => return error_reply(header, code, &message),
            _ => return error_reply(header, ErrorCode::Internal, "unexpected reply"),
        }
    }
    let status = match shard.call(ShardId(0), ShardRequest::ReplicaStatus).await {
        ShardReply::Status(status) => status,
        ShardReply::Error { code, message } => return error_reply(header, code, &message),
        _ => return error_reply(header, ErrorCode::Internal, "unexpected reply"),
    };
    let groups = match crate::groups::snapshot(shard).await {
        Ok(groups) => groups,
        Err(ShardReply::Error { code, message }) => return error_reply(header, code, &message),
        Err(_) => return error_reply(header, ErrorCode::Internal, "unexpected reply"),
    };
    let metadata = shard.metadata_wire(
        &status,
        |namespace| {
            offsets
                .get(&namespace)
                .map_or((0, 0), |ends| (ends.first_offset, ends.next_offset))
        },
        |stream_id, topic_id, name| {
            groups
                .iter()
                .find(|(key, _)| {
                    key.stream_id == stream_id && key.topic_id == topic_id && key.name == name
                })
                .map(|(_, info)| info.clone())
        },
    );
    let body = serde_json::to_vec(&metadata).expect("metadata serializes: plain data");
    encode_ok(header, body, 0, 0)
}

/// The `NotPrimary` reply (bus `ErrorCode::NotPrimary`): header `view` is this replica's view,
/// `replica` the primary's index (this replica's view's `view % replica_count`; 0 with
/// `primary = None`), body the primary's client address as UTF-8, empty when unknown or during
/// a view change. Nothing was applied.
fn not_primary_reply(
    request: &bus::Header,
    view: u32,
    primary: Option<u8>,
    address: &str,
) -> EncodedReply {
    let mut header = bus::reply::reply_header(request);
    header.error_code = ErrorCode::NotPrimary as u32;
    header.view = view;
    header.replica = primary.unwrap_or(0);
    (
        bus::encode_frame(&mut header, address.as_bytes()),
        Vec::new(),
    )
}

/// A successful send or poll reply: `encode_ok` plus where the partition's data is.
fn encode_partition_reply(
    request: &bus::Header,
    body: Vec<u8>,
    offset: u64,
    count: u32,
    ends: PartitionEnds,
) -> EncodedReply {
    let mut header = bus::reply::reply_header(request);
    header.offset = offset;
    header.count = count;
    header.next_offset = ends.next_offset;
    header.first_offset = ends.first_offset;
    header.set_checksums(&body);
    (bytemuck::bytes_of(&header).to_vec(), body)
}

/// The header of a successful poll reply whose body is `spans`: `encode_partition_reply`'s
/// fields, sealed (`Header::seal`) with the body's size and its `checksum_body`, the XXH3-128 of
/// the batch headers in order (`bus::BatchesChecksum`), so the body never has to be in user
/// memory to be announced (issue 12 items 1 and 2).
fn encode_polled_header(
    request: &bus::Header,
    spans: &storage::VerifiedSpans,
    count: u32,
    ends: PartitionEnds,
) -> Vec<u8> {
    let mut header = bus::reply::reply_header(request);
    header.offset = request.offset;
    header.count = count;
    header.next_offset = ends.next_offset;
    header.first_offset = ends.first_offset;
    let mut checksum = bus::BatchesChecksum::new();
    for entry_header in spans.entry_headers() {
        checksum.push_header(entry_header);
    }
    header.seal(spans.size_bytes() as usize, checksum.finish());
    bytemuck::bytes_of(&header).to_vec()
}

// Stored entry headers are the wire's batch headers, byte for byte (storage/FORMAT.md section 3).
const _: () = assert!(storage::ENTRY_HEADER_SIZE == bus::BATCH_HEADER_SIZE);

/// The `OffsetOutOfRange` reply to a poll beyond the partition's end, or below its first offset
/// (retention deleted it, issue 11 section 4): the message names the offset asked and the
/// partition's next and first offsets, which the header also carries so a consumer can resume
/// without parsing text.
fn offset_out_of_range(
    request: &bus::Header,
    namespace: Namespace,
    offset: u64,
    ends: PartitionEnds,
) -> EncodedReply {
    let mut header = bus::reply::reply_header(request);
    header.error_code = ErrorCode::OffsetOutOfRange as u32;
    header.offset = offset;
    header.next_offset = ends.next_offset;
    header.first_offset = ends.first_offset;
    let message = if offset < ends.first_offset {
        format!(
            "offset {offset} is below the first offset {} of partition {namespace}: retention \
             deleted the messages before it (next offset {}); poll at or above the first offset",
            ends.first_offset, ends.next_offset
        )
    } else {
        format!(
            "offset {offset} is beyond the end of partition {namespace}: its next offset is {} \
             (first offset {}); poll at or below the next offset",
            ends.next_offset, ends.first_offset
        )
    };
    (
        bus::encode_frame(&mut header, message.as_bytes()),
        Vec::new(),
    )
}

fn encode_ok(request: &bus::Header, body: Vec<u8>, offset: u64, count: u32) -> EncodedReply {
    let mut header = bus::reply::reply_header(request);
    header.offset = offset;
    header.count = count;
    header.set_checksums(&body);
    (bytemuck::bytes_of(&header).to_vec(), body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_3_a_poll_wait_is_clamped_to_poll_wait_max() {
        assert_eq!(poll_wait(0), Duration::ZERO);
        assert_eq!(poll_wait(250), Duration::from_millis(250));
        assert_eq!(poll_wait(60_000), bus::limits::POLL_WAIT_MAX);
        assert_eq!(poll_wait(60_001), bus::limits::POLL_WAIT_MAX);
        assert_eq!(poll_wait(u32::MAX), bus::limits::POLL_WAIT_MAX);
    }
}
