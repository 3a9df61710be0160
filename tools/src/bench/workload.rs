//! The load: producer and consumer threads, and the state they share (topic layout, progress
//! counters, the start line).
//!
//! Each worker is one OS thread with its own compio runtime and its own connection, as in
//! iggy-bench. Workers must never share a connection or a runtime, and a consumer must never judge
//! a message the producers have not been acknowledged for yet.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Condvar, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context as _;
use bus::{BatchBuilder, Client, ClientError, Namespace, PartitionInfo};
use hdrhistogram::Histogram;

use super::ack::{AckLedger, AckRange, acked_end_offset};
use super::limits::{
    BUSY_BACKOFF_INITIAL, BUSY_BACKOFF_MAX, BUSY_RETRY_COUNT_MAX, CONSUMER_IDLE_SLEEP,
    STALLED_POLL_COUNT_MAX, UNREADABLE_POLL_COUNT_MAX,
};
use super::payload::{PayloadSource, message_id};
use super::report::new_latency_histogram;
use super::verify::{
    CheckedMessage, Fault, MessageRecord, Observation, PartitionVerdict, PartitionVerifier,
    checked_messages,
};

/// Indices `worker_index, worker_index + worker_count, ...` below `item_count`: how partitions
/// are dealt to producers and to consumers.
pub fn dealt_indices(worker_index: usize, worker_count: usize, item_count: usize) -> Vec<usize> {
    assert!(worker_count > 0 && worker_index < worker_count);
    (worker_index..item_count).step_by(worker_count).collect()
}

/// Messages producer `producer_index` sends when `total` are split over `producer_count`.
pub fn producer_share(total: u64, producer_count: u32, producer_index: u32) -> u64 {
    let count = u64::from(producer_count);
    total / count + u64::from(u64::from(producer_index) < total % count)
}

/// The bench topic as the server created it: partition ids and owner shards from `GetMetadata`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLayout {
    pub stream_id: u32,
    pub topic_id: u16,
    /// Sorted by partition id; workers address partitions by index into this list.
    pub partitions: Vec<PartitionInfo>,
    pub shard_count: u16,
}

impl TopicLayout {
    pub fn namespace(&self, partition_index: usize) -> Namespace {
        Namespace::new(
            self.stream_id,
            self.topic_id,
            self.partitions[partition_index].partition_id,
        )
    }
}

/// Counters shared by the workers and the orchestrating thread.
#[derive(Debug, Default)]
pub struct SharedProgress {
    pub messages_acked: AtomicU64,
    pub messages_verified: AtomicU64,
    /// Set once every producer has finished: consumers then stop at the acknowledged end.
    pub producers_done: AtomicBool,
    /// Set when any worker failed: the others stop at their next request.
    pub abort: AtomicBool,
}

/// A worker stopped because another one failed; not the error to show.
#[derive(Debug, thiserror::Error)]
#[error("stopped because another worker failed")]
pub struct Aborted;

/// When producers stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProduceStop {
    /// Total messages over all producers.
    MessageCount(u64),
    /// Wall time from the common start.
    Duration(Duration),
}

/// What one worker needs besides the shared state.
#[derive(Debug, Clone)]
pub struct WorkerPlan {
    pub addr: SocketAddr,
    pub worker_index: u32,
    pub worker_count: u32,
    pub batch_message_count: u32,
}

/// The state every worker of a phase shares.
#[derive(Debug, Clone, Copy)]
pub struct Shared<'a> {
    pub layout: &'a TopicLayout,
    pub payload: &'a PayloadSource,
    pub ledger: &'a AckLedger,
    pub progress: &'a SharedProgress,
    /// Released by the orchestrator once every worker is connected (or failed to) and it took
    /// its CPU baseline.
    pub start: &'a StartLine,
}

#[derive(Debug)]
pub struct ProducerOutcome {
    pub latency_us: Histogram<u64>,
    pub busy_retry_count: u64,
    pub finished_at: Instant,
}

/// What a consumer found in one of its partitions.
#[derive(Debug)]
pub struct PartitionReadOutcome {
    pub partition_index: usize,
    pub verdict: PartitionVerdict,
    /// Payload bytes of the verified messages.
    pub verified_payload_bytes: u64,
}

#[derive(Debug)]
pub struct ConsumerOutcome {
    pub latency_us: Histogram<u64>,
    pub partitions: Vec<PartitionReadOutcome>,
    pub busy_retry_count: u64,
    pub finished_at: Instant,
}

/// Where workers wait to start together. Unlike a `Barrier` it does not need the worker count up
/// front, so the orchestrator can release whoever was spawned if spawning the rest fails.
#[derive(Debug, Default)]
pub struct StartLine {
    state: Mutex<StartState>,
    changed: Condvar,
}

#[derive(Debug, Default)]
struct StartState {
    arrived_count: usize,
    released: bool,
}

impl StartLine {
    fn lock(&self) -> std::sync::MutexGuard<'_, StartState> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A worker is ready; blocks until [`StartLine::release`].
    pub fn arrive_and_wait(&self) {
        let mut state = self.lock();
        state.arrived_count += 1;
        self.changed.notify_all();
        while !state.released {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Blocks until `worker_count` workers arrived.
    pub fn wait_for(&self, worker_count: usize) {
        let mut state = self.lock();
        while state.arrived_count < worker_count {
            state = self
                .changed
                .wait(state)
                .unwrap_or_else(PoisonError::into_inner);
        }
    }

    /// Lets every worker, arrived or not yet, start.
    pub fn release(&self) {
        self.lock().released = true;
        self.changed.notify_all();
    }
}

/// Arrives at the start line exactly once: when passed, or when dropped (an early error or a
/// panic), so the orchestrator is never left waiting for a worker that is gone.
#[derive(Debug)]
struct StartGate<'a> {
    line: &'a StartLine,
    passed: bool,
}

impl<'a> StartGate<'a> {
    fn new(line: &'a StartLine) -> StartGate<'a> {
        StartGate {
            line,
            passed: false,
        }
    }

    fn pass(&mut self) {
        if !self.passed {
            self.passed = true;
            self.line.arrive_and_wait();
        }
    }
}

impl Drop for StartGate<'_> {
    fn drop(&mut self) {
        self.pass();
    }
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |since| since.as_micros() as u64)
}

/// Records `elapsed` in µs, at least 1 (the histogram's lowest value), saturating at its highest.
pub fn record_latency(histogram: &mut Histogram<u64>, elapsed: Duration) {
    histogram.saturating_record((elapsed.as_micros() as u64).max(1));
}

/// Connects, then passes the start gate whatever the outcome.
async fn connect_then_start(
    addr: SocketAddr,
    gate: &mut StartGate<'_>,
    who: &str,
) -> anyhow::Result<Client> {
    // No transparent retry in the client: the bench retries Busy itself and counts it.
    let client = Client::connect(addr)
        .await
        .map(|client| client.with_retry_budget(std::time::Duration::ZERO));
    gate.pass();
    client.with_context(|| format!("{who}: cannot connect to {addr}"))
}

/// Backs off after a retryable error, or fails once the budget is spent.
async fn back_off(
    error: ClientError,
    retry_count: &mut u32,
    what: impl FnOnce() -> String,
) -> anyhow::Result<()> {
    if !error.is_retryable() || *retry_count >= BUSY_RETRY_COUNT_MAX {
        let retries = *retry_count;
        return Err(error).with_context(|| format!("{} (after {retries} retries)", what()));
    }
    let backoff = BUSY_BACKOFF_INITIAL.saturating_mul(1 << (*retry_count).min(16));
    compio::time::sleep(backoff.min(BUSY_BACKOFF_MAX)).await;
    *retry_count += 1;
    Ok(())
}

/// Runs producer `plan.worker_index` to completion on its own compio runtime. It owns partition
/// indices `i, i + P, ...` and sends to them round-robin, one batch in flight, retrying a batch
/// answered `Busy` with backoff; every acknowledgement goes into the ledger.
pub fn run_producer(
    plan: &WorkerPlan,
    stop: ProduceStop,
    shared: Shared<'_>,
) -> anyhow::Result<ProducerOutcome> {
    let mut gate = StartGate::new(shared.start);
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(produce(plan, stop, shared, &mut gate))
}

async fn produce(
    plan: &WorkerPlan,
    stop: ProduceStop,
    shared: Shared<'_>,
    gate: &mut StartGate<'_>,
) -> anyhow::Result<ProducerOutcome> {
    let producer_index = plan.worker_index;
    let who = format!("producer {producer_index}");
    let partition_indices = dealt_indices(
        producer_index as usize,
        plan.worker_count as usize,
        shared.layout.partitions.len(),
    );
    assert!(
        !partition_indices.is_empty(),
        "validation keeps partitions >= producers"
    );
    let mut client = connect_then_start(plan.addr, gate, &who).await?;
    let started_at = Instant::now();
    let mut latency_us = new_latency_histogram();
    let mut busy_retry_count = 0;
    let mut sequence: u64 = 0;
    for batch_index in 0.. {
        if shared.progress.abort.load(Ordering::Relaxed) {
            return Err(Aborted.into());
        }
        let remaining = match stop {
            ProduceStop::MessageCount(total) => {
                producer_share(total, plan.worker_count, producer_index) - sequence
            }
            ProduceStop::Duration(duration) if started_at.elapsed() < duration => u64::MAX,
            ProduceStop::Duration(_) => 0,
        };
        if remaining == 0 {
            break;
        }
        let message_count = remaining.min(u64::from(plan.batch_message_count)) as u32;
        let partition_index = partition_indices[batch_index % partition_indices.len()];
        let namespace = shared.layout.namespace(partition_index);
        let timestamp_us = now_us();
        let sent_at = Instant::now();
        let mut retry_count = 0;
        let (ack, payload_bytes) = loop {
            // Rebuilt on a retry rather than cloned up front: retries are rare, copies are not.
            let mut builder = BatchBuilder::with_capacity(
                message_count as usize,
                message_count as usize * shared.payload.payload_len_max(),
            );
            let mut payload_bytes = 0;
            for offset in 0..u64::from(message_count) {
                let payload = shared.payload.payload_for(sequence + offset);
                builder.push(
                    message_id(producer_index, sequence + offset),
                    timestamp_us,
                    payload,
                );
                payload_bytes += payload.len() as u64;
            }
            match client.send_messages(namespace, builder.finish()).await {
                Ok(ack) => break (ack, payload_bytes),
                Err(error) => {
                    back_off(error, &mut retry_count, || {
                        format!("{who}: sending {message_count} messages to {namespace}")
                    })
                    .await?;
                    busy_retry_count += 1;
                }
            }
        };
        record_latency(&mut latency_us, sent_at.elapsed());
        anyhow::ensure!(
            ack.message_count == message_count,
            "{who}: the server acknowledged {} of the {message_count} messages sent to {namespace} \
             in one batch",
            ack.message_count
        );
        shared.ledger.record(
            partition_index,
            AckRange {
                base_offset: ack.base_offset,
                message_count,
                first_id: message_id(producer_index, sequence),
                payload_bytes,
            },
        );
        shared
            .progress
            .messages_acked
            .fetch_add(u64::from(message_count), Ordering::Relaxed);
        sequence += u64::from(message_count);
    }
    Ok(ProducerOutcome {
        latency_us,
        busy_retry_count,
        finished_at: Instant::now(),
    })
}

/// Read state of one partition of a consumer.
#[derive(Debug)]
struct PartitionRead {
    partition_index: usize,
    namespace: Namespace,
    verifier: PartitionVerifier,
    /// Ranges acknowledged so far, copied from the ledger.
    acks: Vec<AckRange>,
    acked_end_offset: u64,
    stalled_poll_count: u32,
    unreadable_poll_count: u32,
    retry_count: u32,
    verified_payload_bytes: u64,
    done: bool,
}

impl PartitionRead {
    /// Copies new acknowledgements from the ledger; returns the acknowledged end offset.
    fn refresh(&mut self, ledger: &AckLedger) -> u64 {
        let known_count = self.acks.len();
        ledger.copy_new(self.partition_index, &mut self.acks);
        // Incremental, so a long run of small batches stays linear.
        self.acked_end_offset = self
            .acked_end_offset
            .max(acked_end_offset(&self.acks[known_count..]));
        self.acked_end_offset
    }
}

/// Runs consumer `plan.worker_index` to completion on its own compio runtime: it reads partition
/// indices `j, j + C, ...` from offset 0 up to the acknowledged end (waiting for producers in
/// concurrent mode) and verifies every message.
pub fn run_consumer(plan: &WorkerPlan, shared: Shared<'_>) -> anyhow::Result<ConsumerOutcome> {
    let mut gate = StartGate::new(shared.start);
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(consume(plan, shared, &mut gate))
}

async fn consume(
    plan: &WorkerPlan,
    shared: Shared<'_>,
    gate: &mut StartGate<'_>,
) -> anyhow::Result<ConsumerOutcome> {
    let who = format!("consumer {}", plan.worker_index);
    let mut reads: Vec<PartitionRead> = dealt_indices(
        plan.worker_index as usize,
        plan.worker_count as usize,
        shared.layout.partitions.len(),
    )
    .into_iter()
    .map(|partition_index| PartitionRead {
        partition_index,
        namespace: shared.layout.namespace(partition_index),
        verifier: PartitionVerifier::new(shared.layout.partitions[partition_index].partition_id),
        acks: Vec::new(),
        acked_end_offset: 0,
        stalled_poll_count: 0,
        unreadable_poll_count: 0,
        retry_count: 0,
        verified_payload_bytes: 0,
        done: false,
    })
    .collect();
    let mut client = connect_then_start(plan.addr, gate, &who).await?;
    let mut latency_us = new_latency_histogram();
    let mut busy_retry_count = 0;
    while reads.iter().any(|read| !read.done) {
        let mut progressed = false;
        for read in reads.iter_mut().filter(|read| !read.done) {
            if shared.progress.abort.load(Ordering::Relaxed) {
                return Err(Aborted.into());
            }
            // Read the flag before the ledger: once it is set, the ledger is complete.
            let producers_done = shared.progress.producers_done.load(Ordering::Acquire);
            let next_offset = read.verifier.next_offset();
            if next_offset >= read.refresh(shared.ledger) {
                read.done = producers_done;
                continue;
            }
            let sent_at = Instant::now();
            let body = match client
                .poll_messages(read.namespace, next_offset, plan.batch_message_count)
                .await
            {
                Ok(body) => body,
                Err(error) => {
                    let namespace = read.namespace;
                    back_off(error, &mut read.retry_count, || {
                        format!("{who}: polling {namespace} at offset {next_offset}")
                    })
                    .await?;
                    busy_retry_count += 1;
                    continue;
                }
            };
            let elapsed = sent_at.elapsed();
            read.retry_count = 0;
            // Acks that arrived while the poll was in flight cover messages it may have returned.
            let acked_end = read.refresh(shared.ledger);
            let messages = match checked_messages(&body, next_offset) {
                Ok(messages) => messages,
                Err(error) => {
                    read.unreadable_poll_count += 1;
                    if read.unreadable_poll_count > UNREADABLE_POLL_COUNT_MAX {
                        read.verifier.record_fault(Fault::UnreadableBatch {
                            offset: next_offset,
                            error: error.to_string(),
                        });
                        read.done = true;
                    }
                    continue;
                }
            };
            read.unreadable_poll_count = 0;
            let mut verified_count = 0;
            for CheckedMessage {
                message,
                checksum_ok,
            } in messages
                .iter()
                .take_while(|checked| checked.message.offset < acked_end)
            {
                let record = MessageRecord {
                    offset: message.offset,
                    id: message.id,
                    checksum_ok: *checksum_ok,
                    payload_ok: shared.payload.matches(message.id, message.payload),
                };
                if read.verifier.observe(&record, &read.acks) == Observation::Verified {
                    verified_count += 1;
                    read.verified_payload_bytes += message.payload.len() as u64;
                }
            }
            if read.verifier.next_offset() > next_offset {
                // Idle polls (nothing new yet) are left out: the histogram describes reads.
                record_latency(&mut latency_us, elapsed);
                read.stalled_poll_count = 0;
                progressed = true;
            } else if producers_done {
                read.stalled_poll_count += 1;
                // The rest of the partition is counted missing by `finish`.
                read.done = read.stalled_poll_count > STALLED_POLL_COUNT_MAX;
            }
            shared
                .progress
                .messages_verified
                .fetch_add(verified_count, Ordering::Relaxed);
        }
        if !progressed {
            compio::time::sleep(CONSUMER_IDLE_SLEEP).await;
        }
    }
    let partitions = reads
        .into_iter()
        .map(|read| PartitionReadOutcome {
            partition_index: read.partition_index,
            verdict: read
                .verifier
                .finish(&shared.ledger.ranges(read.partition_index)),
            verified_payload_bytes: read.verified_payload_bytes,
        })
        .collect();
    Ok(ConsumerOutcome {
        latency_us,
        partitions,
        busy_retry_count,
        finished_at: Instant::now(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_line_holds_workers_until_released() {
        let line = StartLine::default();
        let started = std::sync::atomic::AtomicU64::new(0);
        std::thread::scope(|scope| {
            for _ in 0..3 {
                scope.spawn(|| {
                    let _gate = StartGate::new(&line);
                    // Dropping the gate arrives, as a worker that failed to connect does.
                });
                scope.spawn(|| {
                    let mut gate = StartGate::new(&line);
                    gate.pass();
                    started.fetch_add(1, Ordering::SeqCst);
                });
            }
            line.wait_for(6);
            assert_eq!(started.load(Ordering::SeqCst), 0);
            line.release();
        });
        assert_eq!(started.load(Ordering::SeqCst), 3);
    }

    #[test]
    fn partitions_are_dealt_round_robin() {
        assert_eq!(dealt_indices(0, 2, 5), vec![0, 2, 4]);
        assert_eq!(dealt_indices(1, 2, 5), vec![1, 3]);
        assert_eq!(dealt_indices(3, 4, 3), Vec::<usize>::new());
    }

    #[test]
    fn messages_are_split_evenly_over_producers() {
        let shares: Vec<u64> = (0..3).map(|index| producer_share(10, 3, index)).collect();
        assert_eq!(shares, vec![4, 3, 3]);
        assert_eq!(producer_share(1_000_000, 2, 1), 500_000);
    }
}
