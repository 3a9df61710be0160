//! One bench phase: spawn the workers, release them together, sample the server's CPU and draw
//! progress while they run, join them, and keep the first real error.
//!
//! Must never leave a worker running: every worker is joined before a phase returns, even on error.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::thread::ScopedJoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::ack::AckLedger;
use super::cpu::{CpuSampler, PhaseCpu};
use super::host_cpu::{HostCpu, HostCpuSampler};
use super::limits::CPU_SAMPLE_INTERVAL;
use super::payload::PayloadSource;
use super::plan::BenchPlan;
use super::workload::{
    Aborted, ConsumerOutcome, ProducerOutcome, Shared, SharedProgress, StartLine, TopicLayout,
    WorkerPlan, run_consumer, run_producer,
};
use super::writeback::flush_filesystem;

type Handle<'scope, T> = ScopedJoinHandle<'scope, anyhow::Result<T>>;

/// What a phase's workers returned, and when the phase started.
#[derive(Debug)]
pub struct PhaseOutcome {
    pub producers: Vec<ProducerOutcome>,
    pub consumers: Vec<ConsumerOutcome>,
    pub started_at: Instant,
    pub cpu: Option<PhaseCpu>,
    /// The host's CPU less the bench's own over the phase (`host_cpu`); `None` where a caller
    /// does not measure it (the consume half of a `--concurrent` run).
    pub host_cpu: Option<HostCpu>,
    /// How long the `syncfs(2)` that ended the host window took (`writeback`); `None` when the
    /// phase was not given a data directory to flush.
    pub writeback_flush: Option<Duration>,
}

fn join_message(payload: &(dyn std::any::Any + Send)) -> String {
    payload
        .downcast_ref::<&str>()
        .map(ToString::to_string)
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_string())
}

/// Runs one phase: spawns the workers, takes the CPU baseline, releases them together, then
/// samples CPU and updates the progress bar every [`CPU_SAMPLE_INTERVAL`] until all are joined.
/// Producers finishing sets `producers_done`. The first real error (not [`Aborted`]) wins.
///
/// With `flush_dir`, the host-CPU window ends only after a `syncfs(2)` of that directory's
/// filesystem (taken after every worker is joined, so the acknowledgement window is unchanged,
/// and after the bench's own CPU is read, so the flush counts as host work): the kernel's
/// deferred writeback of what the phase wrote is inside the host figure.
pub fn run_phase(
    plan: &BenchPlan,
    addr: SocketAddr,
    pid: Option<u32>,
    shared_state: (&TopicLayout, &PayloadSource, &AckLedger, &SharedProgress),
    (producer_count, consumer_count): (u32, u32),
    flush_dir: Option<&Path>,
    bar: &indicatif::ProgressBar,
) -> anyhow::Result<PhaseOutcome> {
    let (layout, payload, ledger, progress) = shared_state;
    let start = StartLine::default();
    std::thread::scope(|scope| {
        let shared = Shared {
            layout,
            payload,
            ledger,
            progress,
            start: &start,
        };
        let worker_plan = |worker_index, worker_count| WorkerPlan {
            addr,
            worker_index,
            worker_count,
            batch_message_count: plan.batch_message_count,
        };
        let mut spawn_error = None;
        let mut producers: Vec<(String, Handle<'_, ProducerOutcome>)> = Vec::new();
        for index in 0..producer_count {
            let worker = worker_plan(index, producer_count);
            match std::thread::Builder::new()
                .name(format!("bench-producer-{index}"))
                .spawn_scoped(scope, move || run_producer(&worker, plan.stop, shared))
            {
                Ok(handle) => producers.push((format!("producer {index}"), handle)),
                Err(error) => {
                    spawn_error = Some(error);
                    break;
                }
            }
        }
        let mut consumers: Vec<(String, Handle<'_, ConsumerOutcome>)> = Vec::new();
        for index in 0..consumer_count {
            if spawn_error.is_some() {
                break;
            }
            let worker = worker_plan(index, consumer_count);
            match std::thread::Builder::new()
                .name(format!("bench-consumer-{index}"))
                .spawn_scoped(scope, move || run_consumer(&worker, shared))
            {
                Ok(handle) => consumers.push((format!("consumer {index}"), handle)),
                Err(error) => spawn_error = Some(error),
            }
        }
        if let Some(error) = spawn_error {
            // The workers already spawned stop at their first request; the scope joins them.
            progress.abort.store(true, Ordering::Relaxed);
            start.release();
            return Err(anyhow::Error::new(error).context("cannot spawn a worker thread"));
        }
        start.wait_for(producers.len() + consumers.len());
        let sampler = pid.map(CpuSampler::start).transpose();
        let host_sampler = HostCpuSampler::start();
        start.release();
        let started_at = Instant::now();
        let mut first_error: Option<anyhow::Error> = None;
        let mut sampler = match sampler {
            Ok(sampler) => sampler,
            Err(error) => {
                progress.abort.store(true, Ordering::Relaxed);
                first_error = Some(anyhow::Error::new(error).context("cannot sample server CPU"));
                None
            }
        };
        let host_sampler = match host_sampler {
            Ok(host_sampler) => Some(host_sampler),
            Err(error) => {
                progress.abort.store(true, Ordering::Relaxed);
                first_error
                    .get_or_insert(anyhow::Error::new(error).context("cannot sample host CPU"));
                None
            }
        };
        let mut keep_error = |error: anyhow::Error| {
            progress.abort.store(true, Ordering::Relaxed);
            let is_abort = error.downcast_ref::<Aborted>().is_some();
            if first_error
                .as_ref()
                .is_none_or(|kept| kept.downcast_ref::<Aborted>().is_some() && !is_abort)
            {
                first_error = Some(error);
            }
        };
        let mut producer_outcomes = Vec::new();
        let mut consumer_outcomes = Vec::new();
        while !producers.is_empty() || !consumers.is_empty() {
            std::thread::sleep(CPU_SAMPLE_INTERVAL);
            join_finished(&mut producers, &mut producer_outcomes, &mut keep_error);
            if producers.is_empty() {
                progress.producers_done.store(true, Ordering::Release);
            }
            join_finished(&mut consumers, &mut consumer_outcomes, &mut keep_error);
            if let Some(active) = sampler.as_mut()
                && let Err(error) = active.sample()
            {
                keep_error(anyhow::Error::new(error).context("cannot sample server CPU"));
                sampler = None;
            }
            bar.set_position(if consumer_count > 0 {
                progress.messages_verified.load(Ordering::Relaxed)
            } else {
                progress.messages_acked.load(Ordering::Relaxed)
            });
        }
        if let Some(error) = first_error {
            return Err(error);
        }
        // The server's own window ends with the workers, before any flush.
        let cpu = sampler
            .map(CpuSampler::finish)
            .transpose()
            .context("cannot sample server CPU")?;
        let (host_cpu, writeback_flush) = finish_host_window(host_sampler, flush_dir)?;
        Ok(PhaseOutcome {
            producers: producer_outcomes,
            consumers: consumer_outcomes,
            started_at,
            cpu,
            host_cpu,
            writeback_flush,
        })
    })
}

/// Ends the host-CPU window, after a `syncfs(2)` of `flush_dir` when given: (the host figure,
/// how long the flush took).
fn finish_host_window(
    host_sampler: Option<HostCpuSampler>,
    flush_dir: Option<&Path>,
) -> anyhow::Result<(Option<HostCpu>, Option<Duration>)> {
    let flush = || {
        flush_dir
            .map(|dir| {
                flush_filesystem(dir).with_context(|| {
                    format!(
                        "cannot write back the phase's dirty pages (syncfs of {})",
                        dir.display()
                    )
                })
            })
            .transpose()
    };
    match host_sampler {
        Some(host_sampler) => {
            let (host_cpu, flushed) = host_sampler
                .finish_after(flush)
                .context("cannot sample host CPU")?;
            Ok((Some(host_cpu), flushed?))
        }
        None => Ok((None, flush()?)),
    }
}

fn join_finished<T>(
    handles: &mut Vec<(String, Handle<'_, T>)>,
    outcomes: &mut Vec<T>,
    keep_error: &mut impl FnMut(anyhow::Error),
) {
    let mut index = 0;
    while index < handles.len() {
        if !handles[index].1.is_finished() {
            index += 1;
            continue;
        }
        let (who, handle) = handles.swap_remove(index);
        match handle.join() {
            Ok(Ok(outcome)) => outcomes.push(outcome),
            Ok(Err(error)) => keep_error(error.context(format!("{who} failed"))),
            Err(panic) => keep_error(anyhow::anyhow!("{who} panicked: {}", join_message(&*panic))),
        }
    }
}

pub fn progress_bar(prefix: &'static str, length: Option<u64>) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(length, indicatif::ProgressDrawTarget::stderr());
    let template = if length.is_some() {
        "{prefix:>8} [{elapsed_precise}] {wide_bar} {pos}/{len} ({per_sec})"
    } else {
        "{prefix:>8} [{elapsed_precise}] {pos} ({per_sec})"
    };
    bar.set_style(
        indicatif::ProgressStyle::with_template(template)
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar.set_prefix(prefix);
    bar
}

pub fn latest_finish(finished: impl Iterator<Item = Instant>, started_at: Instant) -> Duration {
    finished.max().map_or(Duration::ZERO, |at| {
        at.saturating_duration_since(started_at)
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bus::PartitionInfo;

    use super::*;
    use crate::bench::plan::{PayloadChoice, ServerTarget, ShardRequest, Workload};
    use crate::bench::workload::ProduceStop;

    #[test]
    fn a_worker_that_cannot_connect_fails_the_phase_without_hanging() {
        let plan = BenchPlan {
            shard_requests: vec![ShardRequest::Count(1)],
            repeat_count: 1,
            efficiency_margin: 0.8,
            server: ServerTarget::External {
                addr: "127.0.0.1:1".to_string(),
                pid: None,
            },
            producer_count: 2,
            consumer_count: 1,
            partition_count: 2,
            batch_message_count: 10,
            stop: ProduceStop::Duration(Duration::from_secs(1)),
            payload: PayloadChoice::Size(10),
            concurrent: true,
            json: None,
            csv: None,
            charts: None,
            compare: None,
            stream_id: 1,
            workload: Workload::ProduceConsume,
            metadata_op_count: 1,
            metadata_clients: crate::bench::plan::MetadataClients::ONE,
            baseline_root: None,
            consumer_group: None,
        };
        let partition = |partition_id| PartitionInfo {
            partition_id,
            owner_shard: 0,
            next_offset: 0,
            first_offset: 0,
        };
        let layout = TopicLayout {
            stream_id: 1,
            topic_id: 1,
            partitions: vec![partition(1), partition(2)],
            shard_count: 1,
        };
        let payload = PayloadSource::fixed(10);
        let ledger = AckLedger::new(2);
        let progress = SharedProgress::default();
        // Port 1 on loopback: nothing listens, so every worker fails at connect.
        let error = run_phase(
            &plan,
            SocketAddr::from(([127, 0, 0, 1], 1)),
            Some(std::process::id()),
            (&layout, &payload, &ledger, &progress),
            (2, 1),
            None,
            &indicatif::ProgressBar::hidden(),
        )
        .unwrap_err();
        let message = format!("{error:#}");
        assert!(
            message.contains("producer ") || message.contains("consumer "),
            "{message}"
        );
        assert!(progress.abort.load(Ordering::Relaxed));
    }
}
