//! One shard: its metadata copy, the partitions it owns, the pending replies of requests it
//! forwarded, and the event loop that pumps the mesh. Shard 0 also orders metadata changes.
//!
//! Never holds a `RefCell` borrow across an `.await`, never blocks the reactor, never drops a
//! client request silently: a full inbox becomes a `Busy` reply.

use std::cell::{Cell, RefCell};
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::Arc;

use ahash::AHashMap;
use bus::{ErrorCode, Namespace};
use crossfire::oneshot::{TxOneshot, oneshot};
use runtime::{Envelope, MeshEndpoint, MeshSendError, ShardId};
use storage::{LogConfig, PartitionLog};

use crate::config::ServerConfig;
use crate::frame::{PartitionEnds, ShardFrame, ShardReply, ShardRequest};
use crate::limits::{
    MESH_RETRY_MAX, MESH_RETRY_SLEEP, METADATA_QUEUE_MAX, PARTITIONS_DIR_NAME, POLL_BYTES_MAX,
    RECEIVE_BYTES_MAX_PER_SHARD,
};
use crate::metadata::{MetadataOp, MetadataState};
use crate::metrics::{ReplicaMetrics, ReplicaMetricsSnapshot, ShardMetrics, ShardMetricsSnapshot};
use crate::parked::{ParkedPolls, Release};
use crate::producers::{ProducerTable, Verdict};
use crate::resources::ResourceBudget;
use crate::shard_for;
use crate::store::ReplicaStore;
use crate::unopened::{Begin, OpenFailure, UnopenedPartitions};
use crate::vsr::prepare::PrepareOperation;
use crate::vsr::replica::Replica;

/// One metadata request waiting on shard 0: (client, request number, operation, reply, when it
/// arrived on shard 0: the start of its commit latency).
pub type MetadataQueueItem = (
    u128,
    u64,
    PrepareOperation,
    TxOneshot<ShardReply>,
    std::time::Instant,
);
type MetadataQueue = (
    crossfire::MAsyncTx<crossfire::mpsc::Array<MetadataQueueItem>>,
    crossfire::AsyncRx<crossfire::mpsc::Array<MetadataQueueItem>>,
);

/// Shard 0's outstanding metadata broadcast: acks still missing before the client is answered.
struct MetadataAck {
    op_number: u64,
    remaining: u16,
    /// Partitions the other shards could not open, with why.
    failures: Vec<OpenFailure>,
    done: TxOneshot<Vec<OpenFailure>>,
}

/// The replica's place in the cluster as shard 0's driver last published it: every shard checks
/// it in the send and poll path (a backup answers `NotPrimary`) and GetMetadata reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaStatus {
    pub view: u32,
    /// This replica's index.
    pub replica: u8,
    /// The primary of `view`; `None` while a view change is under way.
    pub primary: Option<u8>,
    /// This replica is the primary of its view, status normal: it serves sends and polls.
    pub is_primary: bool,
    /// The highest op applied (the commit number reported by GetMetadata).
    pub commit: u64,
    /// The primary's client address (empty when not known yet).
    pub primary_address: String,
    /// Counts shard 0's broadcasts (set by `Shard::set_status`): a shard keeps the newest.
    pub generation: u64,
}

impl ReplicaStatus {
    /// Before the driver publishes: a single replica is its own primary; a cluster replica
    /// serves nothing until its core says it is the primary.
    fn initial(config: &ServerConfig, client_address: std::net::SocketAddr) -> ReplicaStatus {
        let single = config.replica_count() == 1;
        ReplicaStatus {
            view: 0,
            replica: config.replica,
            primary: single.then_some(0),
            is_primary: single,
            commit: 0,
            primary_address: if single {
                client_address.to_string()
            } else {
                String::new()
            },
            generation: 0,
        }
    }
}

/// Per-shard state, shared by the tasks of this shard through `Rc`.
pub struct Shard {
    pub id: ShardId,
    pub shard_count: u16,
    pub config: Arc<ServerConfig>,
    endpoint: MeshEndpoint<ShardFrame>,
    /// Shared with a running checkpoint's encoder (copy on write: an op applied meanwhile
    /// clones it), so taking a snapshot never copies the state on the reactor.
    metadata: RefCell<Arc<MetadataState>>,
    partitions: RefCell<AHashMap<Namespace, Rc<PartitionLog>>>,
    /// Idempotent producers of the partitions this shard owns (`producers.rs`), rebuilt from
    /// each log's tail on open (`RecoveryReport::producer_batches`).
    producers: RefCell<ProducerTable>,
    /// Owned partitions that are committed but whose log failed to open; retried on each send
    /// or poll to them (`Shard::owned_log`).
    unopened: UnopenedPartitions,
    /// Consumer offsets of the partitions this shard owns (issue 11 section 1).
    pub(crate) offsets: crate::offsets::OffsetStores,
    pending: RefCell<AHashMap<u64, TxOneshot<ShardReply>>>,
    request_id_next: Cell<u64>,
    /// Shard 0 only: metadata requests in arrival order, served one at a time.
    metadata_queue: Option<MetadataQueue>,
    metadata_ack: RefCell<Option<MetadataAck>>,
    /// Shard 0 only: the journal, superblock and checkpoint.
    replica: Option<Rc<ReplicaStore>>,
    /// Shard 0 only, once the driver started: the consensus core (its state is what the final
    /// checkpoint writes).
    core: RefCell<Option<Rc<RefCell<Replica>>>>,
    /// The view, primary and commit as shard 0 last published them.
    status: RefCell<ReplicaStatus>,
    /// Shard 0: set when the driver stopped the server because durable state cannot be written.
    fail_stop: RefCell<Option<String>>,
    /// This replica's client listen address (`config.listen`, with the port the server bound).
    client_address: std::net::SocketAddr,
    budget: ResourceBudget,
    connection_count: Cell<u64>,
    receive_budget: ReceiveBudget,
    /// Polls waiting on this shard's partitions for data (issue 11 section 3, `parked.rs`).
    parked: Rc<ParkedPolls>,
    /// This shard's counters (`crate::metrics`); every log it opens reports its fsyncs here.
    metrics: Rc<ShardMetrics>,
    /// Shard 0 only: the metadata counters.
    replica_metrics: Option<ReplicaMetrics>,
    /// Shard 0: consumer-group membership, the primary's soft state (issue 11 section 2);
    /// empty on every other shard.
    groups: RefCell<crate::groups::Coordinator>,
    /// Wakes this shard's retention task after a roll (`crate::retention`, issue 11 section 4).
    retention_signal: Rc<crate::retention::RetentionSignal>,
    /// Pipes for poll replies sent without a copy (`splice.rs`).
    pub(crate) splice_pipes: crate::splice::SplicePipes,
}

/// The bytes of request bodies and poll replies a shard's connections hold at once: a
/// single-threaded byte semaphore. Waiters are woken when bytes are released (no polling).
#[derive(Debug, Clone)]
pub struct ReceiveBudget {
    state: Rc<BudgetState>,
}

#[derive(Debug)]
struct BudgetState {
    in_flight: Cell<u64>,
    bytes_max: u64,
    waiters: RefCell<Vec<std::task::Waker>>,
}

/// Bytes a connection holds against its shard's budget; released (waking waiters) on drop.
#[derive(Debug)]
pub struct ReceivePermit {
    bytes: u64,
    state: Rc<BudgetState>,
}

impl ReceivePermit {
    /// Gives back what the request turned out not to need (a poll reply smaller than its maximum).
    pub fn shrink_to(&mut self, bytes: u64) {
        if bytes < self.bytes {
            self.state.release(self.bytes - bytes);
            self.bytes = bytes;
        }
    }
}

impl Drop for ReceivePermit {
    fn drop(&mut self) {
        self.state.release(self.bytes);
    }
}

impl BudgetState {
    fn release(&self, bytes: u64) {
        self.in_flight.set(self.in_flight.get() - bytes);
        for waker in self.waiters.borrow_mut().drain(..) {
            waker.wake();
        }
    }
}

impl ReceiveBudget {
    pub fn new(bytes_max: u64) -> ReceiveBudget {
        ReceiveBudget {
            state: Rc::new(BudgetState {
                in_flight: Cell::new(0),
                bytes_max,
                waiters: RefCell::default(),
            }),
        }
    }

    /// Bytes held by live permits.
    pub fn in_flight(&self) -> u64 {
        self.state.in_flight.get()
    }

    /// The budget: bytes the permits may hold at once (one request is admitted past it when
    /// none is held).
    pub fn bytes_max(&self) -> u64 {
        self.state.bytes_max
    }

    /// Waits until `bytes` fit the budget, then holds them until the permit drops. One request
    /// is always admitted when none is held, so any frame within `max_message_size` makes
    /// progress. Callers bound the wait with a timeout.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is reserved until it returns.
    pub async fn reserve(&self, bytes: u64) -> ReceivePermit {
        std::future::poll_fn(|context| {
            let in_flight = self.state.in_flight.get();
            if in_flight == 0 || in_flight + bytes <= self.state.bytes_max {
                self.state.in_flight.set(in_flight + bytes);
                std::task::Poll::Ready(ReceivePermit {
                    bytes,
                    state: Rc::clone(&self.state),
                })
            } else {
                self.state
                    .waiters
                    .borrow_mut()
                    .push(context.waker().clone());
                std::task::Poll::Pending
            }
        })
        .await
    }
}

impl std::fmt::Debug for Shard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shard")
            .field("id", &self.id)
            .field("shard_count", &self.shard_count)
            .finish_non_exhaustive()
    }
}

/// Directory of one partition's log.
pub fn partition_dir(data_dir: &std::path::Path, namespace: Namespace) -> PathBuf {
    data_dir
        .join(PARTITIONS_DIR_NAME)
        .join(namespace.stream_id().to_string())
        .join(namespace.topic_id().to_string())
        .join(namespace.partition_id().to_string())
}

/// Messages at or after `offset` in the batches whose headers are `entry_headers` (whole
/// batches are served, so the first may start below `offset`).
fn message_count_from(entry_headers: &[[u8; bus::BATCH_HEADER_SIZE]], offset: u64) -> u32 {
    let mut count = 0u32;
    for header in entry_headers {
        let header: bus::BatchHeader = bytemuck::pod_read_unaligned(header);
        let skipped = offset
            .saturating_sub(header.base_offset)
            .min(u64::from(header.message_count));
        count = count.saturating_add(header.message_count - skipped as u32);
    }
    count
}

/// The offsets a send or poll reply reports for `log`: what a reader can see now.
pub(crate) fn partition_ends(log: &storage::PartitionLog) -> PartitionEnds {
    PartitionEnds {
        first_offset: log.first_offset(),
        next_offset: log.acked_offset(),
    }
}

/// The reply to a stamped batch that is not appended (see `producers.rs` for the rules).
fn verdict_reply(
    namespace: Namespace,
    stamp: bus::ProducerStamp,
    message_count: u32,
    verdict: Verdict,
    ends: PartitionEnds,
) -> ShardReply {
    let bus::ProducerStamp { producer, sequence } = stamp;
    match verdict {
        Verdict::Append => unreachable!("an appended batch has no refusal"),
        Verdict::Duplicate { base_offset } => ShardReply::Sent {
            base_offset,
            message_count,
            ends,
        },
        Verdict::InFlight => ShardReply::error(
            ErrorCode::Busy,
            format!(
                "producer {producer} sequence {sequence} in {namespace} is being written by an \
                 earlier send; nothing was appended, retry for its offsets"
            ),
        ),
        Verdict::Gap { expected } => ShardReply::error(
            ErrorCode::SequenceGap,
            format!(
                "producer {producer} in {namespace}: expected sequence {expected}, received \
                 {sequence}; nothing was appended"
            ),
        ),
        Verdict::TooOld { oldest, expected } => ShardReply::error(
            ErrorCode::SequenceGap,
            format!(
                "producer {producer} in {namespace}: sequence {sequence} is older than the \
                 batches remembered (oldest {oldest}, next expected {expected}), so whether it \
                 was appended cannot be told; nothing was appended"
            ),
        ),
        Verdict::Overlap { expected } => ShardReply::error(
            ErrorCode::InvalidArgument,
            format!(
                "producer {producer} in {namespace}: sequences {sequence}..{} overlap remembered \
                 batches without matching one (next expected {expected}); nothing was appended",
                sequence.saturating_add(u64::from(message_count))
            ),
        ),
    }
    .with_ends(ends)
}

/// For a write refused with `EFBIG`: the file-size limit is the cause, not free space (the
/// storage error's own text says "retry once space is freed", which never helps then). `None`
/// for any other errno.
pub(crate) fn file_size_limit_note(source: &std::io::Error) -> Option<String> {
    if source.raw_os_error() != Some(libc::EFBIG) {
        return None;
    }
    let limit = match crate::resources::file_size_limit() {
        Some(bytes) if bytes == libc::RLIM_INFINITY => "unlimited now".to_owned(),
        Some(bytes) => format!("{bytes} bytes"),
        None => "unknown".to_owned(),
    };
    Some(format!(
        "the file would pass the process's file-size limit (RLIMIT_FSIZE, {limit}); freeing \
         disk space does not help: raise it (`ulimit -f unlimited`, or `LimitFSIZE=infinity` in \
         the systemd unit) and restart the server"
    ))
}

/// The reply to a send whose append failed: `StorageFull` naming the partition when the write
/// was refused for lack of space, `ResourceExhausted` naming it and the open-file limit when an
/// open was refused for lack of file descriptors (both rolled back; later sends succeed once
/// space or descriptors are freed), else `StorageFailure`.
fn append_failure(shard: ShardId, namespace: Namespace, error: &storage::LogError) -> ShardReply {
    if let storage::LogError::DescriptorsExhausted { .. } = error {
        tracing::warn!(shard = shard.0, %namespace, %error, "partition append refused at the open-file limit");
        return ShardReply::error(
            ErrorCode::ResourceExhausted,
            format!(
                "partition {namespace} (stream {}, topic {}, partition {}): the server is at its \
                 open-file limit, nothing was appended: {error}",
                namespace.stream_id(),
                namespace.topic_id(),
                namespace.partition_id()
            ),
        );
    }
    if let storage::LogError::StorageFull {
        path, op, source, ..
    } = error
        && let Some(note) = file_size_limit_note(source)
    {
        tracing::warn!(shard = shard.0, %namespace, %error, "partition write past the file-size limit; append refused");
        return ShardReply::error(
            ErrorCode::StorageFull,
            format!(
                "partition {namespace} (stream {}, topic {}, partition {}) cannot grow, nothing \
                 was appended: {}: {op} failed: {source}: {note}",
                namespace.stream_id(),
                namespace.topic_id(),
                namespace.partition_id(),
                path.display()
            ),
        );
    }
    if let storage::LogError::StorageFull { .. } = error {
        tracing::warn!(shard = shard.0, %namespace, %error, "partition storage full; append refused");
        return ShardReply::error(
            ErrorCode::StorageFull,
            format!(
                "partition {namespace} (stream {}, topic {}, partition {}) is full, nothing was \
                 appended: {error}",
                namespace.stream_id(),
                namespace.topic_id(),
                namespace.partition_id()
            ),
        );
    }
    tracing::error!(shard = shard.0, %namespace, %error, "append failed");
    ShardReply::error(
        ErrorCode::StorageFailure,
        format!("append to {namespace} failed: {error}"),
    )
}

impl Shard {
    pub fn new(
        id: ShardId,
        shard_count: u16,
        config: Arc<ServerConfig>,
        endpoint: MeshEndpoint<ShardFrame>,
        metadata: MetadataState,
        replica: Option<ReplicaStore>,
        budget: ResourceBudget,
    ) -> Shard {
        let client_address = config.listen;
        assert_eq!(
            replica.is_some(),
            id == ShardId(0),
            "exactly shard 0 holds the replica"
        );
        let status = ReplicaStatus::initial(&config, client_address);
        let metadata_queue = (id == ShardId(0))
            .then(|| crossfire::mpsc::bounded_async::<MetadataQueueItem>(METADATA_QUEUE_MAX));
        let parked = ParkedPolls::new(id.0, config.parked_polls_max);
        Shard {
            id,
            shard_count,
            config,
            endpoint,
            metadata: RefCell::new(Arc::new(metadata)),
            partitions: RefCell::new(AHashMap::new()),
            producers: RefCell::new(ProducerTable::default()),
            unopened: UnopenedPartitions::default(),
            offsets: crate::offsets::OffsetStores::default(),
            pending: RefCell::new(AHashMap::new()),
            request_id_next: Cell::new(1),
            metadata_queue,
            metadata_ack: RefCell::new(None),
            replica: replica.map(Rc::new),
            core: RefCell::new(None),
            status: RefCell::new(status),
            fail_stop: RefCell::new(None),
            client_address,
            budget,
            connection_count: Cell::new(0),
            receive_budget: ReceiveBudget::new(RECEIVE_BYTES_MAX_PER_SHARD),
            parked,
            metrics: Rc::new(ShardMetrics::default()),
            replica_metrics: (id == ShardId(0)).then(ReplicaMetrics::default),
            groups: RefCell::new(crate::groups::Coordinator::default()),
            retention_signal: Rc::default(),
            splice_pipes: crate::splice::SplicePipes::new(
                crate::splice::splice_pipe_count_per_shard(shard_count),
            ),
        }
    }

    /// Waits until `bytes` of request body fit the shard's receive budget (`ReceiveBudget`).
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is reserved until it returns.
    pub async fn reserve_receive_bytes(&self, bytes: u64) -> ReceivePermit {
        self.receive_budget.reserve(bytes).await
    }

    /// Largest poll reply body (bytes): `POLL_BYTES_MAX`, clamped so header + body fit
    /// `max_message_size`.
    pub fn poll_bytes_max(&self) -> usize {
        POLL_BYTES_MAX.min(self.config.max_message_size as usize - bus::HEADER_SIZE)
    }

    /// Counts a new connection unless the shard is at its budget; the caller closes it then.
    pub fn try_admit_connection(&self) -> bool {
        let count = self.connection_count.get();
        if count >= self.budget.connections_per_shard_max {
            return false;
        }
        self.connection_count.set(count + 1);
        true
    }

    /// A connection admitted by `try_admit_connection` ended.
    pub fn connection_closed(&self) {
        self.connection_count.set(self.connection_count.get() - 1);
    }

    /// Opens the partition log in `dir` with this shard's log configuration, reporting its
    /// fsyncs to this shard's metrics and its acknowledged rolls to its retention task.
    async fn open_log(
        &self,
        dir: &std::path::Path,
    ) -> Result<(PartitionLog, storage::RecoveryReport), storage::LogError> {
        let stats: Rc<dyn storage::log::LogStats> = Rc::new(crate::retention::RetentionSink::new(
            Rc::clone(&self.metrics),
            Rc::clone(&self.retention_signal),
        ));
        PartitionLog::open_with_stats(dir, self.log_config(), stats).await
    }

    /// This shard's counters, for the code paths that count (connections, the driver).
    pub fn metrics(&self) -> &ShardMetrics {
        &self.metrics
    }

    /// Shard 0's metadata counters.
    ///
    /// # Panics
    /// On a shard other than 0.
    pub fn replica_metrics(&self) -> &ReplicaMetrics {
        self.replica_metrics
            .as_ref()
            .expect("the metadata counters live on shard 0")
    }

    fn log_config(&self) -> LogConfig {
        LogConfig {
            fsync: self.config.fsync,
            segment_size_max: self.config.segment_size_max,
            write_mode: self.config.write_mode,
        }
    }

    /// True once the stop signal fired (a signal, or another shard failed).
    pub fn endpoint_stopped(&self) -> bool {
        self.endpoint.stop_handle().is_stopped()
    }

    pub fn owns(&self, namespace: Namespace) -> bool {
        shard_for(namespace, self.shard_count) == self.id
    }

    /// The error reply for a namespace that names no partition (which level is missing).
    pub fn missing_partition(&self, namespace: Namespace) -> ShardReply {
        let rejection = self.metadata.borrow().missing(namespace);
        ShardReply::Error {
            code: rejection.code,
            message: rejection.message,
        }
    }

    pub fn partition_exists(&self, namespace: Namespace) -> bool {
        self.metadata.borrow().partition_exists(namespace)
    }

    /// Opens every partition this shard owns according to its metadata copy.
    pub async fn open_owned_partitions(&self) -> Result<(), String> {
        let owned: Vec<Namespace> = self
            .metadata
            .borrow()
            .namespaces()
            .into_iter()
            .filter(|n| self.owns(*n))
            .collect();
        for namespace in owned {
            let dir = partition_dir(&self.config.data_dir, namespace);
            // Partition directories are created (durably) before the metadata that names them,
            // so a missing one was removed outside shardline: recreating it empty would hide
            // the loss and reuse offsets.
            if !dir.is_dir() {
                return Err(format!(
                    "partition {namespace}: directory {} is missing although the metadata lists the \
                     partition; its data was removed outside shardline. Refusing to boot: restore \
                     the directory, or delete the topic's entry deliberately",
                    dir.display()
                ));
            }
            let (log, report) = match self.open_log(&dir).await {
                Ok(opened) => opened,
                Err(e) => {
                    self.leave_unopened_at_boot(namespace, &dir, &e)?;
                    continue;
                }
            };
            if let Some(quarantined) = &report.quarantined {
                tracing::error!(
                    shard = self.id.0, %namespace, segment = %quarantined.segment.display(),
                    position = quarantined.position,
                    offsets = %format_args!("{}-{}", quarantined.first_offset, quarantined.last_offset),
                    quarantine = %quarantined.path.display(),
                    "partition had a damaged entry that may have been acknowledged (it is complete, \
                     or valid entries follow it); the entries from it on were cut from the log and \
                     kept byte for byte in the quarantine file (see storage/FORMAT.md section 4)"
                );
            } else if report.truncated_bytes > 0 {
                tracing::warn!(
                    shard = self.id.0, %namespace, truncated_bytes = report.truncated_bytes,
                    "partition had a torn tail; truncated to the last complete entry"
                );
            }
            tracing::debug!(shard = self.id.0, %namespace, next_offset = report.next_offset, "partition open");
            self.restore_producers(namespace, &report.producer_batches);
            self.partitions.borrow_mut().insert(namespace, Rc::new(log));
            self.offsets
                .open_at_boot(self.id.0, namespace, &dir, self.config.fsync)
                .await?;
        }
        Ok(())
    }

    /// Boot's handling of a partition whose log failed to open with `error`: one refused for lack
    /// of space, inodes or file descriptors is left unopened, with a warning naming it and the
    /// cause, and retried on its next send or poll as at runtime (`Shard::owned_log`), so the
    /// other partitions are served meanwhile.
    ///
    /// # Errors
    /// Any other failure (damage, I/O errors), which refuses the boot.
    fn leave_unopened_at_boot(
        &self,
        namespace: Namespace,
        dir: &std::path::Path,
        error: &storage::LogError,
    ) -> Result<(), String> {
        let kind = crate::unopened::OpenFailureKind::of(error);
        if !kind.is_transient() {
            return Err(format!("partition {namespace}: {error}"));
        }
        let cause = match kind {
            crate::unopened::OpenFailureKind::StorageFull => format!(
                "no space ({})",
                storage::space::FreeBytes(storage::space::free_bytes(dir))
            ),
            _ => "the open-file limit is reached".to_owned(),
        };
        tracing::warn!(
            shard = self.id.0, %namespace, %error,
            "partition log cannot be opened at boot: {cause}; the partition stays unopened, its \
             sends and polls answer {:?} and retry the open until it succeeds",
            kind.code()
        );
        self.unopened.insert(namespace);
        Ok(())
    }

    /// Sends `frame` on the inbox (or reply lane) of `target`, retrying while it is full: for
    /// frames that must not be dropped (metadata broadcast, replies to forwarded requests).
    async fn send_reliably(
        &self,
        target: ShardId,
        mut frame: ShardFrame,
        reply_lane: bool,
    ) -> Result<(), String> {
        for _ in 0..MESH_RETRY_MAX {
            let result = if reply_lane {
                self.endpoint.try_send_reply(target, frame)
            } else {
                self.endpoint.try_send(target, frame)
            };
            self.count_mesh_send(&result);
            match result {
                Ok(()) => return Ok(()),
                Err(MeshSendError::Full(returned)) => {
                    frame = returned;
                    compio::time::sleep(MESH_RETRY_SLEEP).await;
                }
                Err(MeshSendError::Disconnected(_)) => {
                    return Err(format!("shard {} has stopped", target.0));
                }
            }
        }
        Err(format!(
            "shard {} did not drain its inbox within the retry budget",
            target.0
        ))
    }

    /// Counts a mesh send's outcome: delivered, or refused by a full lane (a send to a stopped
    /// shard counts as neither).
    fn count_mesh_send(&self, result: &Result<(), MeshSendError<ShardFrame>>) {
        match result {
            Ok(()) => self.metrics.mesh_send(true),
            Err(MeshSendError::Full(_)) => self.metrics.mesh_send(false),
            Err(MeshSendError::Disconnected(_)) => {}
        }
    }

    /// Runs `request` on `target` (locally when it is this shard) and returns its reply. A full
    /// target inbox answers `Busy` and applies nothing.
    ///
    /// # Cancel safety
    /// Cancel safe for the caller: a reply arriving after cancellation is dropped.
    pub async fn call(self: &Rc<Self>, target: ShardId, request: ShardRequest) -> ShardReply {
        if target == self.id {
            return self.execute(request).await;
        }
        let request_id = self.request_id_next.get();
        self.request_id_next.set(request_id + 1);
        let (reply_tx, reply_rx) = oneshot();
        self.pending.borrow_mut().insert(request_id, reply_tx);
        let sent = self.endpoint.try_send(
            target,
            ShardFrame::Request {
                request_id,
                request,
            },
        );
        self.count_mesh_send(&sent);
        match sent {
            Ok(()) => {}
            Err(MeshSendError::Full(_)) => {
                self.pending.borrow_mut().remove(&request_id);
                return ShardReply::error(
                    ErrorCode::Busy,
                    format!(
                        "inbox of shard {} is full; nothing was applied, retry",
                        target.0
                    ),
                );
            }
            Err(MeshSendError::Disconnected(_)) => {
                self.pending.borrow_mut().remove(&request_id);
                return ShardReply::error(
                    ErrorCode::ShuttingDown,
                    format!("shard {} has stopped", target.0),
                );
            }
        }
        match reply_rx.await {
            Ok(reply) => reply,
            Err(_) => ShardReply::error(
                ErrorCode::ShuttingDown,
                format!("shard {} stopped before answering", target.0),
            ),
        }
    }

    /// Executes a request on this shard (the owner, or shard 0 for metadata).
    pub async fn execute(self: &Rc<Self>, request: ShardRequest) -> ShardReply {
        match request {
            ShardRequest::Send { namespace, batch } => self.send(namespace, batch).await,
            ShardRequest::AwaitMessage {
                namespace,
                offset,
                wait,
            } => self.await_message(namespace, offset, wait).await,
            ShardRequest::Poll {
                namespace,
                offset,
                max_count,
            } => {
                let log = match self.owned_log(namespace).await {
                    Ok(log) => log,
                    Err(reply) => return reply,
                };
                match log
                    .read_spans(offset, max_count, self.poll_bytes_max())
                    .await
                {
                    Ok(spans) => {
                        let message_count = message_count_from(spans.entry_headers(), offset);
                        self.metrics
                            .read(message_count, spans.size_bytes() as usize);
                        ShardReply::Polled {
                            spans,
                            message_count,
                            ends: partition_ends(&log),
                        }
                    }
                    Err(
                        storage::LogError::OffsetOutOfRange { offset, .. }
                        | storage::LogError::OffsetRetained { offset, .. },
                    ) => ShardReply::OffsetOutOfRange {
                        namespace,
                        offset,
                        ends: partition_ends(&log),
                    },
                    Err(e @ storage::LogError::DescriptorsExhausted { .. }) => {
                        tracing::warn!(shard = self.id.0, %namespace, error = %e, "read refused at the open-file limit");
                        ShardReply::error(
                            ErrorCode::ResourceExhausted,
                            format!(
                                "read of {namespace} refused: the server is at its open-file \
                                 limit, nothing was read: {e}"
                            ),
                        )
                    }
                    Err(e) => {
                        tracing::error!(shard = self.id.0, %namespace, error = %e, "read failed");
                        ShardReply::error(
                            ErrorCode::StorageFailure,
                            format!("read of {namespace} failed: {e}"),
                        )
                    }
                }
            }
            ShardRequest::Metadata {
                client,
                request,
                operation,
            } => {
                let Some((queue_tx, _)) = &self.metadata_queue else {
                    return ShardReply::error(
                        ErrorCode::Internal,
                        "metadata request routed to a shard other than 0",
                    );
                };
                let (reply_tx, reply_rx) = oneshot();
                if queue_tx
                    .try_send((
                        client,
                        request,
                        operation,
                        reply_tx,
                        std::time::Instant::now(),
                    ))
                    .is_err()
                {
                    return ShardReply::error(
                        ErrorCode::Busy,
                        "metadata queue on shard 0 is full; retry",
                    );
                }
                reply_rx.await.unwrap_or_else(|_| {
                    ShardReply::error(ErrorCode::ShuttingDown, "shard 0 is stopping")
                })
            }
            ShardRequest::Refuse {
                namespace,
                code,
                message,
            } => {
                let reply = ShardReply::error(code, message);
                match self.partitions.borrow().get(&namespace) {
                    Some(log) => reply.with_ends(partition_ends(log)),
                    None => reply,
                }
            }
            ShardRequest::ReplicaStatus => ShardReply::Status(self.status()),
            ShardRequest::PartitionOffsets => ShardReply::Offsets(
                self.partitions
                    .borrow()
                    .iter()
                    .map(|(namespace, log)| (*namespace, partition_ends(log)))
                    .collect(),
            ),
            ShardRequest::StoreOffset {
                namespace,
                consumer,
                offset,
            } => crate::offsets::store(self, namespace, consumer, offset).await,
            ShardRequest::GetOffset {
                namespace,
                consumer,
            } => crate::offsets::get(self, namespace, consumer).await,
            ShardRequest::Group(request) => crate::groups::execute(self, request).await,
        }
    }

    /// Waits until the owned partition `namespace` has a message at `offset` (issue 11 section 3,
    /// `ShardRequest::AwaitMessage`), for at most `wait`: parks the poll when `offset` is the
    /// partition's end, so it costs no CPU until an append, its timer or the stop signal wakes
    /// it. Any other offset (data there, or one the poll refuses) and a partition whose log is
    /// not open answer `Parked(Appended)` at once, and the poll that follows answers.
    ///
    /// # Cancel safety
    /// Cancel safe: a dropped wait frees its parked slot.
    async fn await_message(
        &self,
        namespace: Namespace,
        offset: u64,
        wait: std::time::Duration,
    ) -> ShardReply {
        // The end is checked and the poll parked with no `.await` between, so an append that
        // acknowledges messages after the check always finds the poll parked.
        let at_end = self
            .partitions
            .borrow()
            .get(&namespace)
            .is_some_and(|log| log.acked_offset() == offset);
        if !at_end {
            return ShardReply::Parked(Release::Appended);
        }
        let parked = match self.parked.park(namespace) {
            Ok(parked) => parked,
            Err(crate::parked::ParkError::Stopped) => return ShardReply::Parked(Release::Stopped),
            Err(e @ crate::parked::ParkError::Full { .. }) => {
                return ShardReply::error(ErrorCode::ResourceExhausted, e.to_string());
            }
        };
        let release = compio::time::timeout(wait, parked)
            .await
            .unwrap_or(Release::TimedOut);
        ShardReply::Parked(release)
    }

    /// Releases every poll parked on this shard (the stop signal fired): each is answered with
    /// what its partition holds, so the drain is not held up by waits; later waits are not
    /// parked. Returns how many were parked.
    pub fn release_parked_polls(&self) -> usize {
        self.parked.release_all()
    }

    /// Polls parked on this shard now.
    pub fn parked_poll_count(&self) -> usize {
        self.parked.parked_count()
    }

    /// Appends a validated batch to the owned partition `namespace`: a stamped batch through the
    /// producer table (`send_idempotent`), a plain one directly.
    async fn send(&self, namespace: Namespace, batch: Vec<u8>) -> ShardReply {
        let log = match self.owned_log(namespace).await {
            Ok(log) => log,
            Err(reply) => return reply,
        };
        let header: bus::BatchHeader =
            bytemuck::pod_read_unaligned(&batch[..bus::BATCH_HEADER_SIZE]);
        if let Some((producer, sequence)) =
            storage::producer_stamp(&batch[bus::BATCH_HEADER_SIZE..])
        {
            let stamp = bus::ProducerStamp { producer, sequence };
            return self
                .send_idempotent(namespace, &log, stamp, header.message_count, batch)
                .await;
        }
        let byte_count = batch.len();
        let result = log.append(batch).await;
        self.sent_reply(namespace, &log, result, header.message_count, byte_count)
    }

    /// The reply to an append of `message_count` messages in `byte_count` bytes to `namespace`;
    /// an acknowledged one is counted in this shard's metrics.
    fn sent_reply(
        &self,
        namespace: Namespace,
        log: &PartitionLog,
        result: Result<u64, storage::LogError>,
        message_count: u32,
        byte_count: usize,
    ) -> ShardReply {
        match result {
            Ok(base_offset) => {
                self.metrics.appended(message_count, byte_count);
                // Acknowledged, so readable: the polls waiting for it read it now.
                self.parked.release_partition(namespace);
                ShardReply::Sent {
                    base_offset,
                    message_count,
                    ends: partition_ends(log),
                }
            }
            Err(e) => append_failure(self.id, namespace, &e).with_ends(partition_ends(log)),
        }
    }

    /// Checks a stamped batch against the producer table and, if it is the next one, enqueues it
    /// in the same step (no `.await` between: two batches of one producer are checked in the
    /// order the log assigns their offsets). A duplicate is answered with its original offset.
    async fn send_idempotent(
        &self,
        namespace: Namespace,
        log: &PartitionLog,
        stamp: bus::ProducerStamp,
        message_count: u32,
        batch: Vec<u8>,
    ) -> ShardReply {
        let verdict = self.producers.borrow_mut().check(
            namespace,
            stamp.producer,
            stamp.sequence,
            message_count,
        );
        if verdict != Verdict::Append {
            return verdict_reply(
                namespace,
                stamp,
                message_count,
                verdict,
                partition_ends(log),
            );
        }
        let base_offset = log.next_offset();
        let byte_count = batch.len();
        let append = log.append(batch);
        let evicted = self.producers.borrow_mut().record(
            namespace,
            storage::ProducerBatch {
                producer: stamp.producer,
                sequence: stamp.sequence,
                message_count,
                base_offset,
            },
            false,
        );
        if let Some((evicted_namespace, evicted_producer)) = evicted {
            tracing::info!(
                shard = self.id.0, namespace = %evicted_namespace, producer = evicted_producer,
                "producer table full: forgot the least recently used producer (its next batch \
                 is taken as a first batch)"
            );
        }
        let result = append.await;
        let mut producers = self.producers.borrow_mut();
        match &result {
            Ok(appended_offset) => {
                assert_eq!(
                    *appended_offset, base_offset,
                    "the log assigns offsets in enqueue order"
                );
                producers.confirm(namespace, stamp.producer, stamp.sequence);
            }
            Err(_) => producers.forget_from(namespace, stamp.producer, stamp.sequence),
        }
        drop(producers);
        self.sent_reply(namespace, log, result, message_count, byte_count)
    }

    /// The open log of the owned partition `namespace`. A committed partition whose open failed
    /// earlier is opened again here, so it becomes usable once the cause (a full disk) is gone.
    ///
    /// # Errors
    /// The reply to send: `PartitionNotFound` when this shard has no such partition, `Busy`
    /// while another request opens it, the failed open's `StorageFull`, `ResourceExhausted` or
    /// `StorageFailure`.
    pub(crate) async fn owned_log(
        &self,
        namespace: Namespace,
    ) -> Result<Rc<PartitionLog>, ShardReply> {
        if let Some(log) = self.partitions.borrow().get(&namespace).cloned() {
            return Ok(log);
        }
        match self.unopened.begin(namespace) {
            Begin::NotUnopened => {
                return Err(ShardReply::error(
                    ErrorCode::PartitionNotFound,
                    format!("partition {namespace} does not exist"),
                ));
            }
            Begin::InProgress => {
                return Err(ShardReply::error(
                    ErrorCode::Busy,
                    format!(
                        "partition {namespace} is being opened by another request; nothing was \
                         applied, retry"
                    ),
                ));
            }
            Begin::Started => {}
        }
        let opened = self
            .open_log(&partition_dir(&self.config.data_dir, namespace))
            .await;
        let still_committed = self.unopened.end(namespace, opened.is_ok());
        match opened {
            Ok((log, report)) => {
                if !still_committed {
                    // Deleted while it was being opened: the log must not be served.
                    let _ = log.close().await;
                    return Err(self.missing_partition(namespace));
                }
                tracing::info!(shard = self.id.0, %namespace, next_offset = report.next_offset, "partition opened on retry");
                Ok(self.insert_opened(namespace, log, &report))
            }
            Err(e) => {
                let failure = OpenFailure::new(self.id.0, namespace, &e);
                tracing::warn!(shard = self.id.0, %namespace, error = %e, "partition still cannot be opened");
                Err(failure.reply())
            }
        }
    }

    /// Makes an opened log serve `namespace`: restores its producers and records it.
    fn insert_opened(
        &self,
        namespace: Namespace,
        log: PartitionLog,
        report: &storage::RecoveryReport,
    ) -> Rc<PartitionLog> {
        self.restore_producers(namespace, &report.producer_batches);
        let log = Rc::new(log);
        self.partitions
            .borrow_mut()
            .insert(namespace, Rc::clone(&log));
        log
    }

    /// Rebuilds the producer table of `namespace` from the stamped batches its log recovered.
    fn restore_producers(&self, namespace: Namespace, batches: &[storage::ProducerBatch]) {
        let evicted_count = self.producers.borrow_mut().restore(namespace, batches);
        if evicted_count > 0 {
            tracing::info!(
                shard = self.id.0, %namespace, evicted_count,
                "producer table full while restoring: forgot the least recently used producers"
            );
        }
        tracing::debug!(shard = self.id.0, %namespace, batch_count = batches.len(), "producer table restored");
    }

    /// Shard 0: the metadata requests in arrival order, for the driver (`crate::driver`).
    ///
    /// # Panics
    /// On a shard other than 0.
    pub fn metadata_requests(
        &self,
    ) -> &crossfire::AsyncRx<crossfire::mpsc::Array<MetadataQueueItem>> {
        &self
            .metadata_queue
            .as_ref()
            .expect("the metadata queue lives on shard 0")
            .1
    }

    /// Shard 0: the replica store (present on shard 0 only).
    ///
    /// # Panics
    /// On a shard other than 0.
    pub fn replica(&self) -> &Rc<ReplicaStore> {
        self.replica
            .as_ref()
            .expect("metadata commits run on shard 0, which holds the replica")
    }

    /// Shard 0: the driver's core, so the final checkpoint takes its state.
    pub fn attach_core(&self, core: Rc<RefCell<Replica>>) {
        *self.core.borrow_mut() = Some(core);
    }

    /// Why `partition_count` partitions would not fit this replica's open-file budget.
    pub fn partitions_refusal(&self, partition_count: u64) -> Option<String> {
        self.budget.partitions_refusal(partition_count)
    }

    /// This replica's client address (what `NotPrimary` names when it is the primary).
    pub fn client_address(&self) -> String {
        self.client_address.to_string()
    }

    /// The replica status this shard knows (view, primary, commit): shard 0 sets it after each
    /// input of its driver and broadcasts it when view, primary or status changed.
    pub fn status(&self) -> ReplicaStatus {
        self.status.borrow().clone()
    }

    /// Shard 0: records `status` and, when `broadcast`, sends it to every other shard (retried
    /// while an inbox is full; a shard keeps only the newest generation it received, so
    /// deliveries that overtake each other never roll it back).
    pub fn set_status(self: &Rc<Self>, mut status: ReplicaStatus, broadcast: bool) {
        let generation = self.status.borrow().generation;
        status.generation = if broadcast {
            generation + 1
        } else {
            generation
        };
        if broadcast {
            tracing::info!(
                view = status.view, replica = status.replica, primary = ?status.primary,
                is_primary = status.is_primary, primary_address = %status.primary_address,
                "replica status"
            );
            for target in 1..self.shard_count {
                let shard = Rc::clone(self);
                let frame = ShardFrame::Status(status.clone());
                compio::runtime::spawn(async move {
                    if let Err(e) = shard.send_reliably(ShardId(target), frame, false).await {
                        tracing::warn!(target, error = %e, "replica status not delivered to a shard");
                    }
                })
                .detach();
            }
        }
        *self.status.borrow_mut() = status;
    }

    /// Another shard: keeps `status` if it is newer than what this shard knows.
    fn receive_status(&self, status: ReplicaStatus) {
        let mut current = self.status.borrow_mut();
        if status.generation > current.generation {
            *current = status;
        }
    }

    /// `Ok` when this replica serves sends and polls (it is the primary of its view, status
    /// normal); else the `NotPrimary` reply (issue 8 section 2: the primary serves the log).
    pub fn check_serves_data(&self) -> Result<(), ShardReply> {
        let status = self.status.borrow();
        if status.is_primary {
            return Ok(());
        }
        Err(ShardReply::NotPrimary {
            view: status.view,
            primary: status.primary,
            address: status.primary_address.clone(),
        })
    }

    /// Stops the whole server (fail-stop) for `reason`; the server then exits with it as its
    /// error and skips the final checkpoint (`Shard::fail_stop_reason`).
    pub fn stop_server(&self, reason: String) {
        self.fail_stop.borrow_mut().get_or_insert(reason);
        self.endpoint.stop_handle().stop();
    }

    /// Why the server was fail-stopped, if it was.
    pub fn fail_stop_reason(&self) -> Option<String> {
        self.fail_stop.borrow().clone()
    }

    /// Shard 0: applies committed change `op_number` on every shard's copy (DESIGN section 4:
    /// the reply comes after every shard applied it): creates the directories of new partitions
    /// (each replica creates them when it applies, issue 8 section 1), applies locally, sends
    /// `MetadataApply` to every other shard and waits for each ack, then removes the directories
    /// of a deleted stream or topic. Returns the partitions that could not be opened. Existing
    /// directories of a created topic keep their data: an op applied again after a restart or
    /// a repair is the same committed op, and a deleted topic's data never keeps its live name
    /// (see [`remove_deleted_dir`]).
    ///
    /// # Cancel safety
    /// Not cancel safe: a cut-short fan-out leaves other shards' copies behind (only at
    /// shutdown).
    pub async fn fan_out(self: &Rc<Self>, op_number: u64, op: &MetadataOp) -> Vec<OpenFailure> {
        if let MetadataOp::CreateTopic { .. } = op {
            let created = self.metadata.borrow().namespaces_of(op);
            let data_dir = self.config.data_dir.clone();
            let prepared = compio::runtime::spawn_blocking(move || {
                prepare_partition_dirs(&data_dir, &created)
            })
            .await;
            match prepared {
                Ok(Ok(())) => {}
                // The change is committed: the logs' opens below fail and are retried on the
                // next send or poll (`Shard::owned_log`).
                Ok(Err(e)) => {
                    tracing::error!(code = ?e.code, error = %e.message, ?op, "cannot create partition directories of a committed topic");
                }
                Err(_) => tracing::error!(?op, "partition directory task failed"),
            }
        }
        let mut failures = self
            .apply_metadata(op_number, op, || {})
            .await
            .err()
            .unwrap_or_default();
        if self.shard_count > 1 {
            let (done_tx, done_rx) = oneshot();
            *self.metadata_ack.borrow_mut() = Some(MetadataAck {
                op_number,
                remaining: self.shard_count - 1,
                failures: Vec::new(),
                done: done_tx,
            });
            for target in 1..self.shard_count {
                let frame = ShardFrame::MetadataApply {
                    op_number,
                    op: op.clone(),
                };
                if let Err(e) = self.send_reliably(ShardId(target), frame, false).await {
                    tracing::error!(op_number, error = %e, "metadata broadcast failed");
                    return failures;
                }
            }
            if let Ok(remote_failures) = done_rx.await {
                failures.extend(remote_failures);
            } else {
                tracing::warn!(op_number, "shard 0 stopped during metadata broadcast");
            }
        }
        if let MetadataOp::DeleteStream { stream_id } | MetadataOp::DeleteTopic { stream_id, .. } =
            op
        {
            let mut dir = self
                .config
                .data_dir
                .join(PARTITIONS_DIR_NAME)
                .join(stream_id.to_string());
            if let MetadataOp::DeleteTopic { topic_id, .. } = op {
                dir = dir.join(topic_id.to_string());
            }
            remove_deleted_dir(dir).await;
        }
        failures
    }

    /// Shard 0: the restore fan-out of a state-transfer install (issue 9 section 4): every
    /// shard's metadata copy becomes the installed `metadata` (the state at `checkpoint_op`)
    /// before the replica serves. Creates the partition directories of the installed metadata
    /// (existing ones keep their data), replaces shard 0's copy and sends `MetadataRestore` to
    /// every other shard, waits for each ack, then removes (through the rename-to-`.deleted`
    /// path) the directories of streams and topics the installed metadata no longer has. Each
    /// shard opens the partitions it owns that it did not have open and closes those that are
    /// gone. Returns the partitions that could not be opened (retried on their next send or
    /// poll).
    ///
    /// # Cancel safety
    /// Not cancel safe: a cut-short restore leaves other shards' copies behind (only at
    /// shutdown).
    pub async fn restore_metadata(
        self: &Rc<Self>,
        checkpoint_op: u64,
        metadata: Arc<MetadataState>,
    ) -> Vec<OpenFailure> {
        let gone = gone_topic_dirs(&self.metadata.borrow(), &metadata, &self.config.data_dir);
        let created = metadata.namespaces();
        let data_dir = self.config.data_dir.clone();
        let prepared =
            compio::runtime::spawn_blocking(move || prepare_partition_dirs(&data_dir, &created))
                .await;
        match prepared {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(code = ?e.code, error = %e.message, checkpoint_op, "cannot create partition directories of an installed checkpoint");
            }
            Err(_) => tracing::error!(checkpoint_op, "partition directory task failed"),
        }
        let mut failures = self.restore_local(Arc::clone(&metadata)).await;
        if self.shard_count > 1 {
            failures.extend(self.restore_remote(checkpoint_op, &metadata).await);
        }
        for dir in gone {
            remove_deleted_dir(dir).await;
        }
        failures
    }

    /// Sends `MetadataRestore` to every other shard and waits for their acks (the same ack
    /// slot as [`Shard::fan_out`]: the driver's applier runs one at a time).
    async fn restore_remote(
        self: &Rc<Self>,
        checkpoint_op: u64,
        metadata: &Arc<MetadataState>,
    ) -> Vec<OpenFailure> {
        let (done_tx, done_rx) = oneshot();
        *self.metadata_ack.borrow_mut() = Some(MetadataAck {
            op_number: checkpoint_op,
            remaining: self.shard_count - 1,
            failures: Vec::new(),
            done: done_tx,
        });
        for target in 1..self.shard_count {
            let frame = ShardFrame::MetadataRestore {
                checkpoint_op,
                metadata: Arc::clone(metadata),
            };
            if let Err(e) = self.send_reliably(ShardId(target), frame, false).await {
                tracing::error!(checkpoint_op, error = %e, "metadata restore broadcast failed");
                return Vec::new();
            }
        }
        done_rx.await.unwrap_or_else(|_| {
            tracing::warn!(checkpoint_op, "shard 0 stopped during metadata restore");
            Vec::new()
        })
    }

    /// Replaces this shard's metadata copy with `metadata`, closes the owned partitions it no
    /// longer has and opens the owned ones it has that are not open. Returns the partitions
    /// that could not be opened.
    async fn restore_local(&self, metadata: Arc<MetadataState>) -> Vec<OpenFailure> {
        let owned: Vec<Namespace> = metadata
            .namespaces()
            .into_iter()
            .filter(|namespace| self.owns(*namespace))
            .collect();
        *self.metadata.borrow_mut() = metadata;
        let gone: Vec<Namespace> = self
            .partitions
            .borrow()
            .keys()
            .copied()
            .filter(|namespace| !owned.contains(namespace))
            .collect();
        for namespace in gone {
            let log = self.partitions.borrow_mut().remove(&namespace);
            self.unopened.remove(namespace);
            self.producers.borrow_mut().remove_partition(namespace);
            self.offsets.remove(namespace);
            self.parked.release_partition(namespace);
            if let Some(log) = log
                && let Err(e) = log.close().await
            {
                tracing::warn!(shard = self.id.0, %namespace, error = %e, "closing a partition the installed checkpoint no longer has failed");
            }
        }
        let mut failures = Vec::new();
        for namespace in owned {
            if self.partitions.borrow().contains_key(&namespace) {
                continue;
            }
            let dir = partition_dir(&self.config.data_dir, namespace);
            match self.open_log(&dir).await {
                Ok((log, report)) => {
                    self.unopened.remove(namespace);
                    self.insert_opened(namespace, log, &report);
                }
                Err(e) => {
                    tracing::error!(shard = self.id.0, %namespace, error = %e, "cannot open partition log of an installed checkpoint; retried on its next send or poll");
                    self.unopened.insert(namespace);
                    failures.push(OpenFailure::new(self.id.0, namespace, &e));
                }
            }
        }
        failures
    }

    /// Shard 0: checkpoints `metadata` and `client_table`, the state after `op` (the core's
    /// `Checkpoint` action, or the final checkpoint), logged like [`Shard::checkpoint`]. Returns
    /// the journal's first op afterwards.
    ///
    /// # Errors
    /// As [`Shard::checkpoint`].
    pub async fn checkpoint_state(
        &self,
        op: u64,
        metadata: Arc<MetadataState>,
        client_table: crate::vsr::client_table::ClientTableSnapshot,
    ) -> Result<u64, crate::store::CheckpointError> {
        let replica = self.replica();
        let started = std::time::Instant::now();
        let result = replica.checkpoint_state(op, metadata, client_table).await;
        if let Err(error) = &result {
            log_checkpoint_failure(error, replica.checkpoint_op());
        }
        result?;
        self.replica_metrics().checkpointed(started.elapsed());
        Ok(replica.journal().lock().await.first_op())
    }

    /// Shard 0: runs the final checkpoint of the core's state now (logged; a failure leaves the
    /// previous one valid). A checkpoint refused for lack of space or file descriptors is logged
    /// as a warning: the journal keeps every op. Nothing to do before the driver started.
    ///
    /// # Errors
    /// The failed step, already logged; `CheckpointError::resource_refused` tells a refusal for
    /// lack of a resource from other failures.
    pub async fn checkpoint(&self) -> Result<(), crate::store::CheckpointError> {
        let core = self.core.borrow().clone();
        let Some(core) = core else {
            return Ok(());
        };
        let (op, metadata, client_table) = {
            let core = core.borrow();
            (
                core.commit_min(),
                Arc::clone(core.metadata()),
                core.client_table().to_snapshot(),
            )
        };
        self.checkpoint_state(op, metadata, client_table)
            .await
            .map(|_| ())
    }

    /// Applies a committed op to this shard's copy, calls `on_applied` right after (before any
    /// await, so nothing can observe or cancel in between), then opens or closes the partitions
    /// it owns.
    ///
    /// # Errors
    /// Partitions that could not be opened, each named with its cause; the op stays applied and
    /// each is opened again on its next send or poll (`Shard::owned_log`).
    pub async fn apply_metadata(
        &self,
        op_number: u64,
        op: &MetadataOp,
        on_applied: impl FnOnce(),
    ) -> Result<(), Vec<OpenFailure>> {
        let namespaces: Vec<Namespace> = {
            let mut shared = self.metadata.borrow_mut();
            let metadata = Arc::make_mut(&mut shared);
            let namespaces = metadata.namespaces_of(op);
            metadata.apply(op_number, op);
            namespaces.into_iter().filter(|n| self.owns(*n)).collect()
        };
        on_applied();
        let mut failures = Vec::new();
        match op {
            MetadataOp::CreateTopic { .. } => {
                for namespace in namespaces {
                    let dir = partition_dir(&self.config.data_dir, namespace);
                    match self.open_log(&dir).await {
                        Ok((log, report)) => {
                            self.insert_opened(namespace, log, &report);
                        }
                        Err(e) => {
                            tracing::error!(shard = self.id.0, %namespace, error = %e, "cannot open partition log; retried on its next send or poll");
                            self.unopened.insert(namespace);
                            failures.push(OpenFailure::new(self.id.0, namespace, &e));
                        }
                    }
                }
            }
            MetadataOp::DeleteTopic { .. } | MetadataOp::DeleteStream { .. } => {
                for namespace in namespaces {
                    let log = self.partitions.borrow_mut().remove(&namespace);
                    self.unopened.remove(namespace);
                    self.producers.borrow_mut().remove_partition(namespace);
                    self.offsets.remove(namespace);
                    // Its waiting polls answer now (the partition is gone) instead of at their
                    // timeout.
                    self.parked.release_partition(namespace);
                    if let Some(log) = log
                        && let Err(e) = log.close().await
                    {
                        tracing::warn!(shard = self.id.0, %namespace, error = %e, "closing a deleted partition failed");
                    }
                    remove_deleted_dir(partition_dir(&self.config.data_dir, namespace)).await;
                }
            }
            // Retention and groups change only the metadata copy: the owner reads the retention
            // from it, shard 0's group coordinator the groups.
            MetadataOp::CreateStream { .. }
            | MetadataOp::AlterTopic { .. }
            | MetadataOp::CreateGroup { .. }
            | MetadataOp::DeleteGroup { .. } => {}
        }
        if failures.is_empty() {
            Ok(())
        } else {
            Err(failures)
        }
    }

    /// Handles one envelope from the inbox. Requests run as tasks; metadata applies run inline so
    /// they stay in op order.
    pub async fn on_inbox(self: &Rc<Self>, envelope: Envelope<ShardFrame>) {
        let from = envelope.from;
        match envelope.frame {
            ShardFrame::Request {
                request_id,
                request,
            } => {
                let shard = Rc::clone(self);
                compio::runtime::spawn(async move {
                    let reply = shard.execute(request).await;
                    if let Err(e) = shard.send_reliably(from, ShardFrame::Reply { request_id, reply }, true).await {
                        tracing::warn!(shard = shard.id.0, to = from.0, error = %e, "reply to a forwarded request dropped");
                    }
                })
                .detach();
            }
            ShardFrame::MetadataApply { op_number, op } => {
                let failures = self
                    .apply_metadata(op_number, &op, || {})
                    .await
                    .err()
                    .unwrap_or_default();
                if let Err(e) = self
                    .send_reliably(
                        from,
                        ShardFrame::MetadataApplied {
                            op_number,
                            failures,
                        },
                        true,
                    )
                    .await
                {
                    tracing::warn!(shard = self.id.0, error = %e, "metadata ack to shard 0 dropped");
                }
            }
            ShardFrame::MetadataRestore {
                checkpoint_op,
                metadata,
            } => {
                let failures = self.restore_local(metadata).await;
                let ack = ShardFrame::MetadataApplied {
                    op_number: checkpoint_op,
                    failures,
                };
                if let Err(e) = self.send_reliably(from, ack, true).await {
                    tracing::warn!(shard = self.id.0, error = %e, "metadata restore ack to shard 0 dropped");
                }
            }
            ShardFrame::Status(status) => self.receive_status(status),
            other => {
                tracing::error!(shard = self.id.0, from = from.0, frame = ?other, "unexpected frame on the inbox; dropped");
            }
        }
    }

    /// Handles one envelope from the reply lane.
    pub fn on_reply(&self, envelope: Envelope<ShardFrame>) {
        match envelope.frame {
            ShardFrame::Reply { request_id, reply } => {
                // A missing entry means the requesting connection went away: drop the reply.
                if let Some(reply_tx) = self.pending.borrow_mut().remove(&request_id) {
                    reply_tx.send(reply);
                }
            }
            ShardFrame::MetadataApplied {
                op_number,
                failures,
            } => {
                let mut ack = self.metadata_ack.borrow_mut();
                let finished = match ack.as_mut() {
                    Some(pending) if pending.op_number == op_number => {
                        pending.failures.extend(failures);
                        pending.remaining -= 1;
                        pending.remaining == 0
                    }
                    _ => {
                        tracing::error!(
                            op_number,
                            "metadata ack for an op that is not outstanding"
                        );
                        false
                    }
                };
                if finished && let Some(done) = ack.take() {
                    done.done.send(done.failures);
                }
            }
            other => {
                tracing::error!(shard = self.id.0, frame = ?other, "unexpected frame on the reply lane; dropped");
            }
        }
    }

    /// Shard 0: the consumer-group coordinator (`crate::groups`). Never borrow it across an
    /// `.await`.
    pub fn group_coordinator(&self) -> &RefCell<crate::groups::Coordinator> {
        &self.groups
    }

    /// `read` applied to this shard's metadata copy, without copying it. `read` must not call
    /// back into the shard's metadata.
    pub fn with_metadata<R>(&self, read: impl FnOnce(&MetadataState) -> R) -> R {
        read(&self.metadata.borrow())
    }

    /// A copy of this shard's metadata (shard 0 hands it to its core at startup).
    pub fn metadata_copy(&self) -> MetadataState {
        MetadataState::clone(&self.metadata.borrow())
    }

    /// The GetMetadata view of this shard's metadata copy.
    /// `status` (shard 0's, current) fills the cluster fields: view, replica, primary (the view's
    /// primary, `view % replica_count`, also during a view change) and commit.
    pub fn metadata_wire(
        &self,
        status: &ReplicaStatus,
        ends: impl Fn(Namespace) -> (u64, u64),
        groups: impl Fn(u32, u16, &str) -> Option<bus::GroupInfo>,
    ) -> bus::Metadata {
        let replica_count = self.config.replica_count().max(1);
        bus::Metadata {
            view: status.view,
            replica: status.replica,
            primary: status
                .primary
                .unwrap_or((status.view % u32::from(replica_count)) as u8),
            commit: status.commit,
            ..self
                .metadata
                .borrow()
                .to_wire(self.shard_count, ends, groups)
        }
    }

    /// Every partition log of this shard (for ticks and shutdown).
    pub fn logs(&self) -> Vec<Rc<PartitionLog>> {
        self.partitions.borrow().values().cloned().collect()
    }

    /// The open logs of the partitions this shard owns, each with its topic's retention as of
    /// this shard's metadata copy (issue 11 section 4; `crate::retention`).
    pub fn logs_with_retention(
        &self,
    ) -> Vec<(Namespace, Rc<PartitionLog>, crate::metadata::Retention)> {
        let metadata = self.metadata.borrow();
        self.partitions
            .borrow()
            .iter()
            .filter_map(|(namespace, log)| {
                let retention = metadata.retention(*namespace)?;
                Some((*namespace, Rc::clone(log), retention))
            })
            .collect()
    }

    /// The signal that wakes this shard's retention task (`crate::retention::run`).
    pub fn retention_signal(&self) -> Rc<crate::retention::RetentionSignal> {
        Rc::clone(&self.retention_signal)
    }

    /// This shard's metrics as of now (`crate::metrics`): its counters, the gauges read now
    /// (connections, receive budget, inbox, partitions) and this thread's CPU time. Call it on
    /// the shard's own thread (the metrics lane task does): the CPU time is the caller's.
    pub fn metrics_snapshot(&self) -> ShardMetricsSnapshot {
        let (inbox_depth, reply_lane_depth) = self.endpoint.own_lane_depths();
        let mut snapshot = ShardMetricsSnapshot {
            shard: self.id.0,
            inbox_depth: inbox_depth as u64,
            reply_lane_depth: reply_lane_depth as u64,
            connections_open: self.connection_count.get(),
            connections_max: self.budget.connections_per_shard_max,
            receive_budget_bytes_in_use: self.receive_budget.in_flight(),
            receive_budget_bytes_max: self.receive_budget.bytes_max(),
            cpu_seconds: crate::metrics::thread_cpu_seconds(),
            partitions: self.partitions.borrow().len() as u64,
            parked_polls: self.parked.parked_count() as u64,
            replica: self.replica_metrics_snapshot(),
            ..ShardMetricsSnapshot::default()
        };
        self.metrics.fill(&mut snapshot);
        snapshot
    }

    /// Shard 0's metadata figures; `None` on other shards. Before the driver attached its core
    /// (startup), the consensus fields read as the published status has them.
    fn replica_metrics_snapshot(&self) -> Option<ReplicaMetricsSnapshot> {
        let counters = self.replica_metrics.as_ref()?;
        let store = self.replica.as_ref()?;
        let journal_bytes = store
            .journal()
            .try_lock()
            .map(|journal| journal.size_bytes());
        let status = self.status.borrow();
        let mut snapshot = ReplicaMetricsSnapshot {
            checkpoint_op: store.checkpoint_op(),
            journal_bytes: counters.journal_bytes(journal_bytes),
            view: status.view,
            replica: status.replica,
            primary: status.primary,
            is_primary: status.is_primary,
            commit_min: status.commit,
            commit_max: status.commit,
            ..ReplicaMetricsSnapshot::default()
        };
        drop(status);
        counters.fill(&mut snapshot);
        // The driver borrows the core only between awaits, never across one: free here.
        if let Some(core) = self.core.borrow().as_ref()
            && let Ok(core) = core.try_borrow()
        {
            let transfers = core.transfer_counters();
            snapshot.sessions = core.client_table().session_count() as u64;
            snapshot.view = core.view();
            snapshot.primary =
                (core.status() == crate::vsr::message::Status::Normal).then_some(core.primary());
            snapshot.is_primary = core.is_primary();
            snapshot.commit_min = core.commit_min();
            snapshot.commit_max = core.commit_max();
            snapshot.state_transfers_started = transfers.started;
            snapshot.state_transfers_completed = transfers.installed;
            snapshot.state_transfers_failed = transfers.failed_rounds;
        }
        Some(snapshot)
    }
}

/// The directories of the streams and topics `old` has and `installed` does not (a stream's
/// whole directory when the stream is gone, else each gone topic's), under `data_dir`.
fn gone_topic_dirs(
    old: &MetadataState,
    installed: &MetadataState,
    data_dir: &std::path::Path,
) -> Vec<PathBuf> {
    let partitions = data_dir.join(PARTITIONS_DIR_NAME);
    let mut gone = Vec::new();
    for (stream_id, stream) in &old.streams {
        let stream_dir = partitions.join(stream_id.to_string());
        let Some(installed_stream) = installed.streams.get(stream_id) else {
            gone.push(stream_dir);
            continue;
        };
        for topic_id in stream.topics.keys() {
            if !installed_stream.topics.contains_key(topic_id) {
                gone.push(stream_dir.join(topic_id.to_string()));
            }
        }
    }
    gone
}

/// Logs a failed checkpoint: a refusal for lack of space or file descriptors as a warning (the
/// journal keeps every op), anything else as an error.
fn log_checkpoint_failure(error: &crate::store::CheckpointError, checkpoint_op: u64) {
    if let Some(path) = error.resource_refused() {
        tracing::warn!(
            %error, path = %path.display(), checkpoint_op,
            "checkpoint refused for lack of space or file descriptors; the previous checkpoint \
             stays valid and the journal keeps every op above it (boot replays them)"
        );
    } else {
        tracing::error!(
            %error,
            checkpoint_op,
            "checkpoint failed; the previous checkpoint stays valid and the journal keeps every \
             op above it"
        );
    }
}

/// Creates the directory of every partition of a committed CreateTopic as this replica applies
/// it (issue 8 section 1), and fsyncs the parents so the directories are durable before the
/// partitions open. A directory that exists keeps its data: it can only be this same topic's,
/// written when this replica applied the op before a restart (a committed op is applied again
/// after a restart or a repair), because a deleted topic's directory loses its live name before
/// its removal starts ([`remove_deleted_dir`]). Blocking: run on the blocking pool.
pub fn prepare_partition_dirs(
    data_dir: &std::path::Path,
    namespaces: &[Namespace],
) -> Result<(), PartitionDirError> {
    let mut parents = std::collections::BTreeSet::new();
    for namespace in namespaces {
        let dir = partition_dir(data_dir, *namespace);
        std::fs::create_dir_all(&dir).map_err(|e| PartitionDirError::new("create", &dir, &e))?;
        let mut parent = dir.parent();
        while let Some(path) = parent {
            parents.insert(path.to_path_buf());
            if path == data_dir {
                break;
            }
            parent = path.parent();
        }
    }
    // Deepest first: each directory's entry is durable in its parent before the parent's own.
    for parent in parents.iter().rev() {
        std::fs::File::open(parent)
            .and_then(|dir| dir.sync_all())
            .map_err(|e| PartitionDirError::new("fsync directory", parent, &e))?;
    }
    Ok(())
}

/// Why the directories of a new topic's partitions could not be prepared (before its prepare is
/// journaled, so nothing was applied).
#[derive(Debug)]
pub struct PartitionDirError {
    /// `StorageFull` when the filesystem refused for lack of space or quota (retry once space is
    /// freed), else `StorageFailure`.
    code: ErrorCode,
    message: String,
}

impl std::fmt::Display for PartitionDirError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl PartitionDirError {
    fn new(step: &str, path: &std::path::Path, error: &std::io::Error) -> PartitionDirError {
        if storage::space::is_storage_full(error) {
            let free =
                storage::space::FreeBytes(path.ancestors().find_map(storage::space::free_bytes));
            return PartitionDirError {
                code: ErrorCode::StorageFull,
                message: format!(
                    "cannot {step} {}: {error} ({free}); nothing was applied, retry once space is \
                     freed",
                    path.display()
                ),
            };
        }
        PartitionDirError {
            code: ErrorCode::StorageFailure,
            message: format!("cannot {step} {}: {error}", path.display()),
        }
    }
}

/// The suffix a deleted stream's, topic's or partition's directory gets before its removal.
pub const DELETED_DIR_SUFFIX: &str = ".deleted";

/// Removes the directory of a deleted stream, topic or partition: first renames it to
/// `NAME.deleted` and fsyncs its parent, so a crash during the removal never leaves the data
/// under its live name (a later topic with the same ids would otherwise find it), then removes
/// it. [`sweep_deleted_dirs`] finishes a removal a crash cut short. A missing directory is fine.
/// Failures are logged: the change is committed either way.
async fn remove_deleted_dir(dir: PathBuf) {
    let shown = dir.display().to_string();
    let result = compio::runtime::spawn_blocking(move || remove_deleted_dir_blocking(&dir)).await;
    match result {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::warn!(path = %shown, error = %e, "cannot remove directory"),
        Err(_) => tracing::warn!(path = %shown, "directory removal task failed"),
    }
}

fn remove_deleted_dir_blocking(dir: &std::path::Path) -> std::io::Result<()> {
    let Some(name) = dir.file_name() else {
        return Ok(());
    };
    let mut tombstone_name = name.to_os_string();
    tombstone_name.push(DELETED_DIR_SUFFIX);
    let tombstone = dir.with_file_name(tombstone_name);
    match std::fs::rename(dir, &tombstone) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        // An earlier removal of the same name was cut short: finish it, then rename.
        Err(_) if tombstone.exists() => {
            std::fs::remove_dir_all(&tombstone)?;
            std::fs::rename(dir, &tombstone)?;
        }
        Err(e) => return Err(e),
    }
    if let Some(parent) = dir.parent() {
        std::fs::File::open(parent)?.sync_all()?;
    }
    match std::fs::remove_dir_all(&tombstone) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

/// Finishes the removals a crash cut short: removes every `*.deleted` directory under
/// `DATA_DIR/partitions` (stream, topic and partition levels). Blocking: run on the blocking
/// pool at boot, before any partition opens.
///
/// # Errors
/// The first directory that could not be read or removed.
pub fn sweep_deleted_dirs(data_dir: &std::path::Path) -> std::io::Result<usize> {
    fn sweep(dir: &std::path::Path, depth: usize, removed: &mut usize) -> std::io::Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(e),
        };
        for entry in entries {
            let entry = entry?;
            if !entry.file_type()?.is_dir() {
                continue;
            }
            let path = entry.path();
            if entry
                .file_name()
                .to_str()
                .is_some_and(|name| name.ends_with(DELETED_DIR_SUFFIX))
            {
                tracing::info!(path = %path.display(), "finishing the removal of a deleted directory");
                std::fs::remove_dir_all(&path)?;
                *removed += 1;
            } else if depth < 2 {
                sweep(&path, depth + 1, removed)?;
            }
        }
        Ok(())
    }
    let mut removed = 0;
    sweep(&data_dir.join(PARTITIONS_DIR_NAME), 0, &mut removed)?;
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deleted directory loses its live name before its removal, a created one keeps what it
    /// holds, and the boot sweep finishes a removal a crash cut short (the adversarial review
    /// found a rejoining replica emptying its own partition when it applied its CreateTopic
    /// again).
    #[test]
    fn issue8_a_deleted_dir_is_tombstoned_and_a_created_one_keeps_its_data() {
        let data = tempfile::tempdir().unwrap();
        let namespace = Namespace::new(1, 1, 0);
        let dir = partition_dir(data.path(), namespace);
        prepare_partition_dirs(data.path(), &[namespace]).unwrap();
        std::fs::write(dir.join("00000000000000000000.log"), b"kept").unwrap();
        // Applied again (restart, repair): the data stays.
        prepare_partition_dirs(data.path(), &[namespace]).unwrap();
        assert_eq!(
            std::fs::read(dir.join("00000000000000000000.log")).unwrap(),
            b"kept"
        );
        // A crash after the rename of a delete: the live name is gone, the sweep removes it.
        let tombstone = dir.with_file_name(format!("0{DELETED_DIR_SUFFIX}"));
        std::fs::rename(&dir, &tombstone).unwrap();
        prepare_partition_dirs(data.path(), &[namespace]).unwrap();
        assert!(!dir.join("00000000000000000000.log").exists());
        assert_eq!(sweep_deleted_dirs(data.path()).unwrap(), 1);
        assert!(!tombstone.exists());
        // A whole delete: gone under both names.
        std::fs::write(dir.join("x"), b"x").unwrap();
        remove_deleted_dir_blocking(dir.parent().unwrap()).unwrap();
        assert!(!dir.exists() && !tombstone.exists());
        assert!(!data.path().join("partitions/1/1.deleted").exists());
        assert_eq!(sweep_deleted_dirs(data.path()).unwrap(), 0);
    }

    /// A stored entry is served to pollers as a wire batch: the two headers must be one layout.
    #[test]
    fn storage_entry_header_is_the_wire_batch_header() {
        assert_eq!(storage::ENTRY_HEADER_SIZE, bus::BATCH_HEADER_SIZE);
        let entry = storage::EntryHeader {
            base_offset: 1,
            base_timestamp_us: 2,
            message_count: 3,
            length: 4,
            checksum: 5,
        };
        let batch: bus::BatchHeader = bytemuck::pod_read_unaligned(bytemuck::bytes_of(&entry));
        assert_eq!(
            (
                batch.base_offset,
                batch.base_timestamp_us,
                batch.message_count,
                batch.length,
                batch.checksum
            ),
            (1, 2, 3, 4, 5)
        );
    }

    #[test]
    fn issue7_5_storage_reads_the_producer_stamp_bus_writes() {
        assert_eq!(
            storage::entry::PRODUCER_STAMP_SIZE,
            bus::PRODUCER_STAMP_SIZE
        );
        assert_eq!(
            storage::entry::PAYLOAD_FLAG_PRODUCER_STAMP,
            bus::MESSAGE_FLAG_PRODUCER_STAMP
        );
        let mut builder = bus::BatchBuilder::default();
        builder.push(1, 2, b"payload");
        builder.push(3, 4, b"");
        let stamp = bus::ProducerStamp {
            producer: 0x0102_0304_0506_0708,
            sequence: 99,
        };
        let batch = builder.finish_stamped(stamp);
        let view = bus::BatchView::parse(&batch).unwrap();
        assert_eq!(view.producer_stamp(), Some(stamp));
        assert_eq!(
            storage::producer_stamp(&batch[bus::BATCH_HEADER_SIZE..]),
            Some((stamp.producer, stamp.sequence))
        );
        let mut plain = bus::BatchBuilder::default();
        plain.push(1, 2, b"0123456789abcdef0123456789");
        assert_eq!(
            storage::producer_stamp(&plain.finish()[bus::BATCH_HEADER_SIZE..]),
            None
        );
    }

    /// Issue 12 item 1 and the timestamp rule: storage mirrors bus's checksum rules. Batches
    /// bus builds (the message-headers and timestamp rules, stamped or not), the whole-section
    /// rule with the timestamp, and batches of the rule before issue 12 (whole section, no
    /// timestamp) verify in storage with the checksum bus wrote, and a byte flipped anywhere the
    /// batch checksum rules cover (from byte 8 under the timestamp rule, else from byte 16:
    /// timestamp, count, length, checksum, message section) fails both bus's `parse_verified`
    /// and storage's entry rules.
    #[test]
    fn issue12_1_storage_verifies_the_checksum_rules_bus_writes() {
        assert_eq!(
            storage::entry::PAYLOAD_FLAG_CHECKSUM_OF_HEADERS,
            bus::MESSAGE_FLAG_CHECKSUM_OF_HEADERS
        );
        assert_eq!(
            storage::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP,
            bus::MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP
        );
        assert_eq!(
            storage::entry::MESSAGE_HEADER_SIZE,
            bus::MESSAGE_HEADER_SIZE
        );
        // Past storage's and bus's 1 KiB header stage: 100 messages.
        let mut builder = bus::BatchBuilder::default();
        for index in 0..100u64 {
            builder.push(index, index, &vec![index as u8; index as usize % 9]);
        }
        let batch = builder.finish();
        let header = storage::EntryHeader::decode(&batch).unwrap();
        assert_eq!(
            storage::entry_checksum(header.base_timestamp_us, &batch[32..]),
            header.checksum
        );
        assert_eq!(storage::check_payload(&header, &batch[32..]), Ok(()));
        let storage_verdict = |batch: &[u8]| {
            let header = storage::EntryHeader::decode(batch).unwrap();
            let payload = &batch[storage::ENTRY_HEADER_SIZE..];
            if header.length as usize != payload.len() {
                return Err("length".to_owned());
            }
            storage::check_payload(&header, payload)
        };
        for stamped in [false, true] {
            for (section_rule, timestamp_rule) in [(false, true), (true, true), (true, false)] {
                let mut builder = bus::BatchBuilder::default();
                builder.push(1, 10, b"first payload");
                builder.push(2, 11, b"");
                builder.push(3, 12, &[0xa5; 40]);
                let mut batch = if stamped {
                    builder.finish_stamped(bus::ProducerStamp {
                        producer: 5,
                        sequence: 9,
                    })
                } else {
                    builder.finish()
                };
                if section_rule {
                    batch[bus::BATCH_HEADER_SIZE + 12] &=
                        !(bus::MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8);
                    if !timestamp_rule {
                        batch[bus::BATCH_HEADER_SIZE + 12] &=
                            !(bus::MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8);
                    }
                    let hashed_first: &[u8] = if timestamp_rule { &batch[8..16] } else { &[] };
                    let checksum =
                        twox_hash::XxHash3_64::oneshot(&[hashed_first, &batch[32..]].concat());
                    batch[24..32].copy_from_slice(&checksum.to_le_bytes());
                }
                let case = format!(
                    "stamped {stamped}, section rule {section_rule}, timestamp rule \
                     {timestamp_rule}"
                );
                let view = bus::BatchView::parse_verified(&batch).unwrap();
                let expected_rule = if section_rule {
                    bus::ChecksumRule::Section
                } else {
                    bus::ChecksumRule::MessageHeaders
                };
                assert_eq!(view.checksum_rule(), expected_rule, "{case}");
                assert_eq!(
                    storage::checksums_message_headers(&batch[32..]),
                    !section_rule,
                    "{case}"
                );
                assert_eq!(
                    storage::checksum_covers_timestamp(&batch[32..]),
                    timestamp_rule,
                    "{case}"
                );
                assert_eq!(
                    storage::entry_checksum(view.header.base_timestamp_us, &batch[32..]),
                    view.header.checksum,
                    "{case}"
                );
                assert_eq!(storage_verdict(&batch), Ok(()), "{case}");
                let covered_from = if timestamp_rule { 8 } else { 16 };
                for at in covered_from..batch.len() {
                    let mut flipped = batch.clone();
                    flipped[at] ^= 0x5a;
                    assert!(
                        bus::BatchView::parse_verified(&flipped).is_err(),
                        "{case}: bus accepted a flip at byte {at}"
                    );
                    assert!(
                        storage_verdict(&flipped).is_err(),
                        "{case}: storage accepted a flip at byte {at}"
                    );
                }
            }
        }
    }

    #[test]
    fn receive_budget_makes_a_body_wait_until_others_release_bytes() {
        use futures_util::FutureExt;
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let budget = ReceiveBudget::new(100);
            let first = budget
                .reserve(70)
                .now_or_never()
                .expect("fits an empty budget");
            assert!(
                budget.reserve(40).now_or_never().is_none(),
                "70 + 40 exceeds 100: must wait"
            );
            let second = budget.reserve(30).now_or_never().expect("70 + 30 fits");
            assert_eq!(budget.in_flight(), 100);
            drop(first);
            drop(second);
            assert_eq!(budget.in_flight(), 0);
            let huge = budget
                .reserve(1_000)
                .now_or_never()
                .expect("one body always fits when none is held");
            assert!(budget.reserve(1).now_or_never().is_none());
            drop(huge);
            let mut small = budget.reserve(40).await;
            assert_eq!(budget.in_flight(), 40);
            small.shrink_to(10);
            assert_eq!(budget.in_flight(), 10);
        });
    }

    #[test]
    fn message_count_from_walks_headers_and_skips_below_offset() {
        let headers: Vec<[u8; bus::BATCH_HEADER_SIZE]> = [(10u64, 2u32), (12, 5)]
            .into_iter()
            .map(|(base_offset, count)| {
                let header = bus::BatchHeader {
                    base_offset,
                    base_timestamp_us: 0,
                    message_count: count,
                    length: 3,
                    checksum: 0,
                };
                bytemuck::cast(header)
            })
            .collect();
        assert_eq!(message_count_from(&headers, 10), 7);
        assert_eq!(message_count_from(&headers, 11), 6);
        assert_eq!(message_count_from(&headers, 13), 4);
        assert_eq!(message_count_from(&[], 10), 0);
    }

    #[test]
    fn issue7_1_a_partition_directory_refused_for_space_is_storage_full() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("partitions/1/1/0");
        let full = PartitionDirError::new(
            "create",
            &path,
            &std::io::Error::from_raw_os_error(libc::ENOSPC),
        );
        assert_eq!(full.code, ErrorCode::StorageFull);
        assert!(
            full.message.starts_with(&format!(
                "cannot create {}: No space left on device (os error 28) (",
                path.display()
            )),
            "{}",
            full.message
        );
        assert!(
            full.message
                .ends_with(" bytes free); nothing was applied, retry once space is freed"),
            "{}",
            full.message
        );
        let failed = PartitionDirError::new(
            "create",
            &path,
            &std::io::Error::from_raw_os_error(libc::EIO),
        );
        assert_eq!(failed.code, ErrorCode::StorageFailure);
        assert_eq!(
            failed.message,
            format!(
                "cannot create {}: Input/output error (os error 5)",
                path.display()
            )
        );
    }
}
