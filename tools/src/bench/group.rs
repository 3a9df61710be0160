//! `bench --consumer-group [--group-churn]` (issue 11 section 2, like iggy-bench's balanced
//! consumer group): the consume phase read by the members of one consumer group instead of
//! pinned consumers. Each of `--consumers` threads runs a `bus::GroupMember`; the coordinator
//! hands out the partitions, members store the group's offsets as they go, and every
//! acknowledged message must be verified exactly once across all members (a partition's reads by
//! successive members feed one verifier, so a message read twice is a `Duplicate` fault). With
//! `--group-churn` every member but the first leaves and joins again (as a new member, with a
//! new client id) every `CHURN_POLL_COUNT` polls, so partitions move all through the phase.
//!
//! Figures are those of the plain consume phase (messages per server-CPU-second): only the
//! server process's CPU is sampled. Must never count a message that was not verified, and never
//! run without an end: the phase ends when every acknowledged message was read, or fails after
//! `STALL_TIMEOUT` without progress.

use std::net::SocketAddr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use bus::{Client, ClientError, ErrorCode, GroupMember};
use hdrhistogram::Histogram;

use super::ack::AckLedger;
use super::cpu::CpuSampler;
use super::host_cpu::HostCpuSampler;
use super::limits::{CONSUMER_IDLE_SLEEP, CPU_SAMPLE_INTERVAL};
use super::payload::PayloadSource;
use super::phase::PhaseOutcome;
use super::plan::BenchPlan;
use super::report::new_latency_histogram;
use super::verify::{
    CheckedMessage, MessageRecord, Observation, PartitionVerifier, checked_messages,
};
use super::workload::{
    ConsumerOutcome, PartitionReadOutcome, SharedProgress, TopicLayout, record_latency,
};

/// The group the bench creates on its topic.
pub const GROUP_NAME: &str = "bench";
/// With `--group-churn`: polls a churning member makes before it leaves and joins again.
pub const CHURN_POLL_COUNT: u32 = 64;
/// Heartbeat interval of the bench's members: short, so a partition released by a leaving
/// member reaches its new member within a few milliseconds (the coordinator hands it over at the
/// new member's next heartbeat).
pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(20);
/// Members store their positions at most this often while they poll (and always when they
/// release a partition or leave): a store per poll would add a round trip (and, under `--fsync
/// always`, an fsync) to every poll, which no pinned consumer pays.
pub const COMMIT_INTERVAL: Duration = Duration::from_millis(100);
/// The phase fails when no message is verified for this long (a partition nobody reads).
pub const STALL_TIMEOUT: Duration = Duration::from_secs(30);

/// `--consumer-group`'s settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GroupMode {
    /// `--group-churn`: members leave and join all through the phase.
    pub churn: bool,
}

/// State every member thread shares.
struct GroupShared<'a> {
    layout: &'a TopicLayout,
    payload: &'a PayloadSource,
    ledger: &'a AckLedger,
    progress: &'a SharedProgress,
    /// One verifier per partition index (behind a lock: successive members of a partition
    /// continue the same one).
    verifiers: Vec<Mutex<(PartitionVerifier, u64)>>,
    /// Messages acknowledged by the produce phase: the phase ends when this many are verified
    /// (or found faulty).
    expected_count: u64,
    /// Messages observed (verified or not), for the end condition.
    observed_count: AtomicU64,
    /// Times members joined (the first joins included).
    join_count: AtomicU64,
}

impl GroupShared<'_> {
    fn done(&self) -> bool {
        self.observed_count.load(Ordering::Relaxed) >= self.expected_count
            || self.progress.abort.load(Ordering::Relaxed)
    }
}

/// Creates the bench's group on its topic.
///
/// # Errors
/// The server refused or could not be reached.
fn create_group(addr: SocketAddr, layout: &TopicLayout) -> anyhow::Result<()> {
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(async {
        let mut client = Client::connect(addr)
            .await
            .context("cannot reach the server")?;
        client
            .create_group(layout.stream_id, layout.topic_id, GROUP_NAME)
            .await
            .with_context(|| {
                format!(
                    "cannot create group {GROUP_NAME:?} on topic {}/{}",
                    layout.stream_id, layout.topic_id
                )
            })
    })
}

/// Runs the consume phase with `plan.consumer_count` group members (after the produce phase:
/// `--concurrent` is refused with `--consumer-group`). Returns one `ConsumerOutcome` holding
/// every partition's verdict and every member's poll latencies.
///
/// # Errors
/// The group cannot be created; a member fails beyond its client's retries; no progress for
/// `STALL_TIMEOUT`; the server's CPU cannot be sampled.
pub fn run_group_consume(
    plan: &BenchPlan,
    mode: GroupMode,
    addr: SocketAddr,
    pid: Option<u32>,
    shared_state: (&TopicLayout, &PayloadSource, &AckLedger, &SharedProgress),
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<PhaseOutcome> {
    let (layout, payload, ledger, progress) = shared_state;
    create_group(addr, layout)?;
    let expected_count = (0..layout.partitions.len())
        .flat_map(|index| ledger.ranges(index))
        .map(|range| u64::from(range.message_count))
        .sum();
    let shared = GroupShared {
        layout,
        payload,
        ledger,
        progress,
        verifiers: layout
            .partitions
            .iter()
            .map(|p| Mutex::new((PartitionVerifier::new(p.partition_id), 0)))
            .collect(),
        expected_count,
        observed_count: AtomicU64::new(0),
        join_count: AtomicU64::new(0),
    };
    let mut sampler = pid
        .map(CpuSampler::start)
        .transpose()
        .context("cannot sample server CPU")?;
    let host_sampler = HostCpuSampler::start().context("cannot sample host CPU")?;
    let started_at = Instant::now();
    let member_results: Vec<anyhow::Result<(Histogram<u64>, Instant)>> =
        std::thread::scope(|scope| {
            let shared = &shared;
            let handles: Vec<_> = (0..plan.consumer_count)
                .map(|index| {
                    let churn = mode.churn && index > 0;
                    scope.spawn(move || {
                        let result = member_thread(plan, addr, shared, churn, index);
                        if result.is_err() {
                            shared.progress.abort.store(true, Ordering::Relaxed);
                        }
                        result
                    })
                })
                .collect();
            let mut sample_error = None;
            while handles.iter().any(|handle| !handle.is_finished()) {
                std::thread::sleep(CPU_SAMPLE_INTERVAL);
                if let Some(active) = sampler.as_mut()
                    && let Err(error) = active.sample()
                {
                    sample_error = Some(error);
                    sampler = None;
                    progress.abort.store(true, Ordering::Relaxed);
                }
                bar.set_position(progress.messages_verified.load(Ordering::Relaxed));
            }
            let mut results: Vec<_> = handles
                .into_iter()
                .enumerate()
                .map(|(index, handle)| {
                    handle
                        .join()
                        .unwrap_or_else(|_| Err(anyhow::anyhow!("group member {index} panicked")))
                })
                .collect();
            if let Some(error) = sample_error {
                results.push(Err(
                    anyhow::Error::new(error).context("cannot sample server CPU")
                ));
            }
            results
        });
    let mut latency_us = new_latency_histogram();
    let mut finished_at = started_at;
    for result in member_results {
        let (histogram, finished) = result?;
        latency_us
            .add(&histogram)
            .context("cannot merge latency histograms")?;
        finished_at = finished_at.max(finished);
    }
    let cpu = sampler
        .map(CpuSampler::finish)
        .transpose()
        .context("cannot sample server CPU")?;
    let host_cpu = host_sampler.finish().context("cannot sample host CPU")?;
    tracing::info!(
        joins = shared.join_count.load(Ordering::Relaxed),
        members = plan.consumer_count,
        churn = mode.churn,
        "consumer-group phase finished"
    );
    let partitions = shared
        .verifiers
        .into_iter()
        .enumerate()
        .map(|(partition_index, verifier)| {
            let (verifier, verified_payload_bytes) = verifier
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            PartitionReadOutcome {
                partition_index,
                verdict: verifier.finish(&ledger.ranges(partition_index)),
                verified_payload_bytes,
            }
        })
        .collect();
    Ok(PhaseOutcome {
        producers: Vec::new(),
        consumers: vec![ConsumerOutcome {
            latency_us,
            partitions,
            busy_retry_count: 0,
            finished_at,
        }],
        started_at,
        cpu,
        host_cpu: Some(host_cpu),
        writeback_flush: None,
    })
}

/// One member thread: a compio runtime running `member_loop`.
fn member_thread(
    plan: &BenchPlan,
    addr: SocketAddr,
    shared: &GroupShared<'_>,
    churn: bool,
    index: u32,
) -> anyhow::Result<(Histogram<u64>, Instant)> {
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime
        .block_on(member_loop(plan, addr, shared, churn))
        .with_context(|| format!("group member {index}"))
}

/// Joins, polls and verifies until every acknowledged message was observed; a churning member
/// closes and joins again (a new client, so a new member) every `CHURN_POLL_COUNT` polls.
async fn member_loop(
    plan: &BenchPlan,
    addr: SocketAddr,
    shared: &GroupShared<'_>,
    churn: bool,
) -> anyhow::Result<(Histogram<u64>, Instant)> {
    let mut latency_us = new_latency_histogram();
    let mut last_progress = Instant::now();
    while !shared.done() {
        let client = Client::connect(addr)
            .await
            .context("cannot reach the server")?;
        let mut member = GroupMember::join(
            client,
            shared.layout.stream_id,
            shared.layout.topic_id,
            GROUP_NAME,
        )
        .await
        .context("cannot join the group")?
        .with_poll_count(plan.batch_message_count)
        .with_heartbeat_interval(HEARTBEAT_INTERVAL)
        .with_commit_interval(COMMIT_INTERVAL);
        shared.join_count.fetch_add(1, Ordering::Relaxed);
        let mut poll_count = 0;
        let churn_due = |poll_count: u32| churn && poll_count >= CHURN_POLL_COUNT;
        while !shared.done() && !churn_due(poll_count) {
            poll_count += 1;
            let sent_at = Instant::now();
            let poll = match member.poll().await {
                Ok(poll) => poll,
                Err(bus::GroupMemberError::Client(error)) if retryable(&error) => {
                    compio::time::sleep(CONSUMER_IDLE_SLEEP).await;
                    continue;
                }
                Err(error) => return Err(error).context("poll failed"),
            };
            let observed = match (poll.partition, poll.result) {
                (Some(partition), Some(result)) => {
                    let observed = verify(shared, partition, &result)?;
                    if observed > 0 {
                        record_latency(&mut latency_us, sent_at.elapsed());
                    }
                    observed
                }
                _ => 0,
            };
            if observed > 0 {
                last_progress = Instant::now();
            } else {
                if last_progress.elapsed() > STALL_TIMEOUT {
                    bail!(
                        "no message verified for {STALL_TIMEOUT:?}: {} of {} observed; this \
                         member reads partitions {:?}",
                        shared.observed_count.load(Ordering::Relaxed),
                        shared.expected_count,
                        member.partitions()
                    );
                }
                compio::time::sleep(CONSUMER_IDLE_SLEEP).await;
            }
        }
        member.close().await.context("cannot leave the group")?;
    }
    Ok((latency_us, Instant::now()))
}

/// Errors a member outlives: the server was busy, or this member's session ended (it rejoins on
/// its next poll).
fn retryable(error: &ClientError) -> bool {
    error.is_retryable()
        || matches!(
            error,
            ClientError::Server {
                code: ErrorCode::NotGroupMember | ErrorCode::PartitionNotAssigned,
                ..
            }
        )
}

/// Feeds the messages of one poll of `partition` to its verifier; returns how many it observed.
///
/// # Errors
/// The poll's batches do not parse.
fn verify(
    shared: &GroupShared<'_>,
    partition: u16,
    result: &bus::PollResult,
) -> anyhow::Result<u64> {
    let Some(partition_index) = shared
        .layout
        .partitions
        .iter()
        .position(|p| p.partition_id == partition)
    else {
        bail!("the group handed out partition {partition}, which the topic does not have");
    };
    let messages = checked_messages(&result.batches, result.offset)
        .with_context(|| format!("unreadable batches from partition {partition}"))?;
    let acks = shared.ledger.ranges(partition_index);
    let mut guard = shared.verifiers[partition_index]
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let (verifier, verified_bytes) = &mut *guard;
    let mut observed = 0;
    let mut verified = 0;
    for CheckedMessage {
        message,
        checksum_ok,
    } in &messages
    {
        let record = MessageRecord {
            offset: message.offset,
            id: message.id,
            checksum_ok: *checksum_ok,
            payload_ok: shared.payload.matches(message.id, message.payload),
        };
        observed += 1;
        if verifier.observe(&record, &acks) == Observation::Verified {
            verified += 1;
            *verified_bytes += message.payload.len() as u64;
        }
    }
    drop(guard);
    shared.observed_count.fetch_add(observed, Ordering::Relaxed);
    shared
        .progress
        .messages_verified
        .fetch_add(verified, Ordering::Relaxed);
    Ok(observed)
}
