//! One scrape as OpenMetrics text (the Prometheus exposition format), written by
//! `prometheus-client`'s encoder over a [`Scrape`]: the shards' snapshots as gathered, plus the
//! process figures read at the same moment. Nothing here keeps state between scrapes: every
//! counter is the shard's own total, so a scrape only reads.
//!
//! Names follow the Prometheus conventions: prefix `shardline_`, base units as a suffix
//! (`_seconds`, `_bytes`), `_total` on counters. Shard figures carry a `shard` label; shard 0's
//! replica figures and the process figures carry none. A shard that did not answer has
//! `shardline_shard_up{shard} 0` and no other sample.

use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Registry, Unit};
use shards::metrics::{
    GatherError, HistogramSnapshot, ReplicaMetricsSnapshot, ShardMetricsSnapshot,
};

use crate::bench::cpu::ProcessCpuSnapshot;

/// The HTTP `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Everything one scrape reports.
#[derive(Debug)]
pub struct Scrape {
    /// One entry per shard, in shard order: its snapshot, or why it did not answer.
    pub shards: Vec<Result<ShardMetricsSnapshot, GatherError>>,
    pub process: ProcessFigures,
    /// The I/O driver every shard runs (`io-uring` or `poll`).
    pub io_driver: String,
    /// How long gathering the snapshots and the process figures took.
    pub scrape_duration: Duration,
}

/// Figures of the whole process, read from `/proc/self` at scrape time.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ProcessFigures {
    /// `None` when `/proc` could not be read (the samples are left out, the reason logged).
    pub cpu: Option<ProcessCpuSnapshot>,
    /// Open file descriptors; `None` when `/proc/self/fd` could not be read.
    pub open_fds: Option<u64>,
    /// `RLIMIT_NOFILE` as the server's resource budget read it at startup.
    pub open_fds_limit: u64,
}

/// `scrape` as OpenMetrics text, ending with `# EOF`.
pub fn encode(scrape: Scrape) -> String {
    let mut registry = Registry::with_prefix("shardline");
    registry.register_collector(Box::new(ScrapeCollector(scrape)));
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry)
        .expect("writing to a String cannot fail, and every label and value here is encodable");
    text
}

/// A scrape seen as a `prometheus-client` collector: asked once, by [`encode`].
#[derive(Debug)]
struct ScrapeCollector(Scrape);

/// A sample's labels; empty ones are written without braces (`name 1`, not `name{} 1`, which
/// some parsers refuse).
type Labels = Vec<(&'static str, String)>;

fn shard_label(shard: u16) -> Labels {
    vec![("shard", shard.to_string())]
}

impl Collector for ScrapeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let scrape = &self.0;
        let answered: Vec<&ShardMetricsSnapshot> = scrape
            .shards
            .iter()
            .filter_map(|shard| shard.as_ref().ok())
            .collect();
        encode_shard_up(&mut encoder, scrape)?;
        encode_shard_counters(&mut encoder, &answered)?;
        encode_shard_gauges(&mut encoder, &answered)?;
        encode_shard_histograms(&mut encoder, &answered)?;
        let replica = answered.iter().find_map(|shard| shard.replica.as_ref());
        encode_replica(&mut encoder, replica)?;
        encode_process(&mut encoder, scrape)
    }
}

/// One counter family: `name` (without prefix, unit or `_total`), one sample per entry.
fn counter<V>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), std::fmt::Error>
where
    V: prometheus_client::encoding::EncodeCounterValue,
{
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Counter)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            family.encode_counter::<NoLabelSet, V, f64>(&value, None)?;
        } else {
            family
                .encode_family(&labels)?
                .encode_counter::<NoLabelSet, V, f64>(&value, None)?;
        }
    }
    Ok(())
}

/// One gauge family, as [`counter`].
fn gauge<V>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (Labels, V)>,
) -> Result<(), std::fmt::Error>
where
    V: prometheus_client::encoding::EncodeGaugeValue,
{
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Gauge)?;
    for (labels, value) in samples {
        if labels.is_empty() {
            family.encode_gauge(&value)?;
        } else {
            family.encode_family(&labels)?.encode_gauge(&value)?;
        }
    }
    Ok(())
}

/// One histogram family, as [`counter`].
fn histogram<'a>(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    unit: Option<&Unit>,
    samples: impl IntoIterator<Item = (Labels, &'a HistogramSnapshot)>,
) -> Result<(), std::fmt::Error> {
    let mut family = encoder.encode_descriptor(name, help, unit, MetricType::Histogram)?;
    for (labels, snapshot) in samples {
        let buckets = per_bucket_counts(snapshot);
        if labels.is_empty() {
            family.encode_histogram::<NoLabelSet>(snapshot.sum, snapshot.count, &buckets, None)?;
        } else {
            family
                .encode_family(&labels)?
                .encode_histogram::<NoLabelSet>(snapshot.sum, snapshot.count, &buckets, None)?;
        }
    }
    Ok(())
}

/// The snapshot's cumulative buckets as the per-bucket counts `prometheus-client` sums up again,
/// with the `+Inf` bucket last (upper bound `f64::MAX`, which the encoder writes as `+Inf`).
fn per_bucket_counts(snapshot: &HistogramSnapshot) -> Vec<(f64, u64)> {
    let mut previous = 0;
    let mut buckets: Vec<(f64, u64)> = snapshot
        .buckets
        .iter()
        .map(|&(bound, cumulative)| {
            let count = cumulative.saturating_sub(previous);
            previous = cumulative;
            (bound, count)
        })
        .collect();
    buckets.push((f64::MAX, snapshot.count.saturating_sub(previous)));
    buckets
}

fn encode_shard_up(
    encoder: &mut DescriptorEncoder<'_>,
    scrape: &Scrape,
) -> Result<(), std::fmt::Error> {
    gauge(
        encoder,
        "shard_up",
        "1 when the shard answered this scrape, 0 when it did not (its other samples are missing; \
         the server log says why)",
        None,
        scrape.shards.iter().enumerate().map(|(index, shard)| {
            let shard_index = u16::try_from(index).expect("shard counts fit u16");
            (shard_label(shard_index), u64::from(shard.is_ok()))
        }),
    )
}

/// Per-shard samples of one `u64` field.
fn per_shard<V>(
    shards: &[&ShardMetricsSnapshot],
    field: impl Fn(&ShardMetricsSnapshot) -> V,
) -> Vec<(Labels, V)> {
    shards
        .iter()
        .map(|shard| (shard_label(shard.shard), field(shard)))
        .collect()
}

fn encode_shard_counters(
    encoder: &mut DescriptorEncoder<'_>,
    shards: &[&ShardMetricsSnapshot],
) -> Result<(), std::fmt::Error> {
    counter(
        encoder,
        "messages_appended",
        "Messages appended to the partitions the shard owns",
        None,
        per_shard(shards, |s| s.messages_appended),
    )?;
    counter(
        encoder,
        "appended",
        "Bytes of the batches appended to the partitions the shard owns (as stored, batch headers included)",
        Some(&Unit::Bytes),
        per_shard(shards, |s| s.bytes_appended),
    )?;
    counter(
        encoder,
        "messages_read",
        "Messages returned by polls of the partitions the shard owns",
        None,
        per_shard(shards, |s| s.messages_read),
    )?;
    counter(
        encoder,
        "read",
        "Bytes of the batches polls of the partitions the shard owns returned",
        Some(&Unit::Bytes),
        per_shard(shards, |s| s.bytes_read),
    )?;
    let requests = shards.iter().flat_map(|shard| {
        shard.requests.iter().map(|request| {
            let labels: Labels = vec![
                ("shard", shard.shard.to_string()),
                ("operation", request.operation.to_owned()),
                ("result", request.result.to_owned()),
            ];
            (labels, request.count)
        })
    });
    counter(
        encoder,
        "requests",
        "Client requests the shard's connections answered, by operation \
        and result (ok, or the error code)",
        None,
        requests,
    )?;
    counter(
        encoder,
        "busy_replies",
        "Busy answers the shard sent (a full inbox or queue)",
        None,
        per_shard(shards, |s| s.busy_replies),
    )?;
    counter(
        encoder,
        "mesh_frames_sent",
        "Frames the shard sent to other shards over the mesh",
        None,
        per_shard(shards, |s| s.mesh_frames_sent),
    )?;
    counter(
        encoder,
        "mesh_inbox_full",
        "Mesh sends of the shard refused by a full target inbox",
        None,
        per_shard(shards, |s| s.mesh_inbox_full),
    )?;
    counter(
        encoder,
        "connections_refused",
        "Client connections the shard refused at accept",
        None,
        per_shard(shards, |s| s.connections_refused),
    )?;
    counter(
        encoder,
        "fsyncs",
        "Partition log fsyncs the shard issued",
        None,
        per_shard(shards, |s| s.fsyncs),
    )?;
    counter(
        encoder,
        "shard_cpu",
        "CPU time (user + system) of the shard's thread",
        Some(&Unit::Seconds),
        per_shard(shards, |s| s.cpu_seconds),
    )
}

fn encode_shard_gauges(
    encoder: &mut DescriptorEncoder<'_>,
    shards: &[&ShardMetricsSnapshot],
) -> Result<(), std::fmt::Error> {
    gauge(
        encoder,
        "inbox_depth",
        "Frames waiting in the shard's inbox",
        None,
        per_shard(shards, |s| s.inbox_depth),
    )?;
    gauge(
        encoder,
        "reply_lane_depth",
        "Frames waiting in the shard's reply lane (replies to requests it forwarded, metadata acks)",
        None,
        per_shard(shards, |s| s.reply_lane_depth),
    )?;
    gauge(
        encoder,
        "connections_max",
        "Client connections the shard admits at once (its share of the open-file budget)",
        None,
        per_shard(shards, |s| s.connections_max),
    )?;
    gauge(
        encoder,
        "connections_open",
        "Client connections open on the shard",
        None,
        per_shard(shards, |s| s.connections_open),
    )?;
    gauge(
        encoder,
        "parked_polls",
        "Polls parked on the shard's partitions waiting for data",
        None,
        per_shard(shards, |s| s.parked_polls),
    )?;
    gauge(
        encoder,
        "receive_budget",
        "Request and reply bytes the shard holds against its \
        receive budget",
        Some(&Unit::Bytes),
        per_shard(shards, |s| s.receive_budget_bytes_in_use),
    )?;
    gauge(
        encoder,
        "receive_budget_max",
        "The shard's receive budget",
        Some(&Unit::Bytes),
        per_shard(shards, |s| s.receive_budget_bytes_max),
    )?;
    gauge(
        encoder,
        "partitions",
        "Partitions the shard owns and has open",
        None,
        per_shard(shards, |s| s.partitions),
    )
}

fn encode_shard_histograms(
    encoder: &mut DescriptorEncoder<'_>,
    shards: &[&ShardMetricsSnapshot],
) -> Result<(), std::fmt::Error> {
    histogram(
        encoder,
        "group_commit_batch_size",
        "Appends one partition log fsync covered \
        (group commit)",
        None,
        shards
            .iter()
            .map(|s| (shard_label(s.shard), &s.group_commit_batch_size)),
    )?;
    histogram(
        encoder,
        "fsync_duration",
        "Latency of one partition log fsync",
        Some(&Unit::Seconds),
        shards
            .iter()
            .map(|s| (shard_label(s.shard), &s.fsync_latency_seconds)),
    )
}

/// Shard 0's replica figures; the families are written without samples when shard 0 did not
/// answer, so the set of families never changes between scrapes.
fn encode_replica(
    encoder: &mut DescriptorEncoder<'_>,
    replica: Option<&ReplicaMetricsSnapshot>,
) -> Result<(), std::fmt::Error> {
    let field = |get: fn(&ReplicaMetricsSnapshot) -> u64| replica.map(|r| (Labels::new(), get(r)));
    counter(
        encoder,
        "metadata_ops_committed",
        "Metadata ops this replica committed",
        None,
        field(|r| r.ops_committed),
    )?;
    histogram(
        encoder,
        "metadata_commit_duration",
        "From a metadata request's arrival at shard 0 \
        to its commit (primary only)",
        Some(&Unit::Seconds),
        replica.map(|r| (Labels::new(), &r.commit_latency_seconds)),
    )?;
    counter(
        encoder,
        "checkpoints",
        "Metadata checkpoints written",
        None,
        field(|r| r.checkpoints),
    )?;
    histogram(
        encoder,
        "checkpoint_duration",
        "Time to write one metadata checkpoint",
        Some(&Unit::Seconds),
        replica.map(|r| (Labels::new(), &r.checkpoint_duration_seconds)),
    )?;
    gauge(
        encoder,
        "checkpoint_op",
        "Op of the newest durable metadata checkpoint",
        None,
        field(|r| r.checkpoint_op),
    )?;
    gauge(
        encoder,
        "journal",
        "Metadata journal segment files on disk",
        Some(&Unit::Bytes),
        field(|r| r.journal_bytes),
    )?;
    gauge(
        encoder,
        "sessions",
        "Client sessions in the client table",
        None,
        field(|r| r.sessions),
    )?;
    gauge(
        encoder,
        "view",
        "This replica's view",
        None,
        field(|r| u64::from(r.view)),
    )?;
    gauge(
        encoder,
        "replica",
        "This replica's index in --addresses (0 for a single replica)",
        None,
        field(|r| u64::from(r.replica)),
    )?;
    gauge(
        encoder,
        "primary",
        "Index of the primary of the current view (no sample during a view \
        change)",
        None,
        replica
            .and_then(|r| r.primary)
            .map(|primary| (Labels::new(), u64::from(primary))),
    )?;
    gauge(
        encoder,
        "is_primary",
        "1 when this replica is the primary of its view",
        None,
        field(|r| u64::from(r.is_primary)),
    )?;
    gauge(
        encoder,
        "commit_min",
        "Highest metadata op this replica has applied",
        None,
        field(|r| r.commit_min),
    )?;
    gauge(
        encoder,
        "commit_max",
        "Highest metadata op this replica knows is committed",
        None,
        field(|r| r.commit_max),
    )?;
    counter(
        encoder,
        "state_transfers_started",
        "State transfers this replica started as a \
        receiver",
        None,
        field(|r| r.state_transfers_started),
    )?;
    let results = replica.into_iter().flat_map(|r| {
        [
            ("completed", r.state_transfers_completed),
            ("failed", r.state_transfers_failed),
        ]
        .map(|(result, count)| (vec![("result", result.to_owned())], count))
    });
    counter(
        encoder,
        "state_transfers",
        "State transfers this replica finished as a receiver, by \
        result (completed, failed)",
        None,
        results,
    )
}

fn encode_process(
    encoder: &mut DescriptorEncoder<'_>,
    scrape: &Scrape,
) -> Result<(), std::fmt::Error> {
    let cpu = scrape.process.cpu.as_ref();
    counter(
        encoder,
        "io_worker_cpu",
        "CPU time of io_uring worker threads: the live ones plus \
        every thread that exited (io_uring workers come and go with the load)",
        Some(&Unit::Seconds),
        cpu.map(|c| (Labels::new(), c.io_worker_live_seconds + c.exited_seconds)),
    )?;
    counter(
        encoder,
        "process_cpu",
        "CPU time (user + system) of the whole server process",
        Some(&Unit::Seconds),
        cpu.map(|c| (Labels::new(), c.process_seconds)),
    )?;
    let mut driver = encoder.encode_descriptor(
        "io_driver",
        "The I/O driver every shard runs",
        None,
        MetricType::Info,
    )?;
    driver.encode_info(&vec![("driver", scrape.io_driver.clone())])?;
    gauge(
        encoder,
        "open_fds",
        "File descriptors the process has open",
        None,
        scrape.process.open_fds.map(|count| (Labels::new(), count)),
    )?;
    gauge(
        encoder,
        "open_fds_limit",
        "The open-file limit (RLIMIT_NOFILE) the server budgeted at \
        startup",
        None,
        [(Labels::new(), scrape.process.open_fds_limit)],
    )?;
    gauge(
        encoder,
        "scrape_duration",
        "How long this scrape took to gather the shards' snapshots \
        and the process figures",
        Some(&Unit::Seconds),
        [(Labels::new(), scrape.scrape_duration.as_secs_f64())],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use shards::metrics::RequestCount;
    use std::collections::{BTreeMap, BTreeSet};

    fn histogram(buckets: &[(f64, u64)], count: u64, sum: f64) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: buckets.to_vec(),
            sum,
            count,
        }
    }

    fn shard(index: u16) -> ShardMetricsSnapshot {
        let base = u64::from(index) * 1000;
        ShardMetricsSnapshot {
            shard: index,
            messages_appended: base + 1,
            bytes_appended: base + 2,
            messages_read: base + 3,
            bytes_read: base + 4,
            requests: vec![
                RequestCount {
                    operation: "send_messages",
                    result: "ok",
                    count: base + 5,
                },
                RequestCount {
                    operation: "send_messages",
                    result: "busy",
                    count: base + 6,
                },
            ],
            busy_replies: base + 7,
            mesh_frames_sent: base + 8,
            mesh_inbox_full: base + 9,
            inbox_depth: base + 10,
            connections_open: base + 11,
            connections_refused: base + 12,
            receive_budget_bytes_in_use: base + 13,
            receive_budget_bytes_max: base + 14,
            fsyncs: base + 15,
            group_commit_batch_size: histogram(&[(1.0, 2), (2.0, 5), (4.0, 5)], 7, 20.0),
            fsync_latency_seconds: histogram(&[(0.001, 1), (0.01, 3)], 3, 0.012),
            cpu_seconds: 1.5,
            partitions: base + 16,
            reply_lane_depth: base + 17,
            connections_max: base + 18,
            parked_polls: base + 19,
            replica: (index == 0).then(|| ReplicaMetricsSnapshot {
                ops_committed: 21,
                commit_latency_seconds: histogram(&[(0.001, 4)], 4, 0.002),
                checkpoints: 22,
                checkpoint_duration_seconds: histogram(&[(0.1, 1)], 2, 0.5),
                checkpoint_op: 23,
                journal_bytes: 24,
                sessions: 25,
                view: 26,
                replica: 1,
                primary: Some(2),
                is_primary: false,
                commit_min: 27,
                commit_max: 28,
                state_transfers_started: 29,
                state_transfers_completed: 30,
                state_transfers_failed: 31,
            }),
        }
    }

    fn scrape(shards: Vec<Result<ShardMetricsSnapshot, GatherError>>) -> Scrape {
        Scrape {
            shards,
            process: ProcessFigures {
                cpu: Some(ProcessCpuSnapshot {
                    process_seconds: 9.5,
                    shard_seconds: BTreeMap::from([(0, 3.0), (1, 2.0)]),
                    io_worker_live_seconds: 0.25,
                    other_live_seconds: 0.5,
                    exited_seconds: 1.0,
                }),
                open_fds: Some(40),
                open_fds_limit: 1024,
            },
            io_driver: "io-uring".to_owned(),
            scrape_duration: Duration::from_millis(3),
        }
    }

    /// Every sample line as (name, sorted labels, value).
    fn samples(text: &str) -> BTreeMap<(String, String), String> {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => {
                        let mut pairs: Vec<&str> =
                            labels.trim_end_matches('}').split(',').collect();
                        pairs.sort_unstable();
                        (name, pairs.join(","))
                    }
                    None => (series, String::new()),
                };
                ((name.to_owned(), labels), value.to_owned())
            })
            .collect()
    }

    fn value(samples: &BTreeMap<(String, String), String>, name: &str, labels: &str) -> String {
        samples
            .get(&(name.to_owned(), labels.to_owned()))
            .unwrap_or_else(|| panic!("no sample {name}{{{labels}}}"))
            .clone()
    }

    const FAMILIES: &[(&str, &str)] = &[
        ("shardline_shard_up", "gauge"),
        ("shardline_messages_appended", "counter"),
        ("shardline_appended_bytes", "counter"),
        ("shardline_messages_read", "counter"),
        ("shardline_read_bytes", "counter"),
        ("shardline_requests", "counter"),
        ("shardline_busy_replies", "counter"),
        ("shardline_mesh_frames_sent", "counter"),
        ("shardline_mesh_inbox_full", "counter"),
        ("shardline_connections_refused", "counter"),
        ("shardline_fsyncs", "counter"),
        ("shardline_shard_cpu_seconds", "counter"),
        ("shardline_inbox_depth", "gauge"),
        ("shardline_reply_lane_depth", "gauge"),
        ("shardline_connections_max", "gauge"),
        ("shardline_connections_open", "gauge"),
        ("shardline_parked_polls", "gauge"),
        ("shardline_receive_budget_bytes", "gauge"),
        ("shardline_receive_budget_max_bytes", "gauge"),
        ("shardline_partitions", "gauge"),
        ("shardline_group_commit_batch_size", "histogram"),
        ("shardline_fsync_duration_seconds", "histogram"),
        ("shardline_metadata_ops_committed", "counter"),
        ("shardline_metadata_commit_duration_seconds", "histogram"),
        ("shardline_checkpoints", "counter"),
        ("shardline_checkpoint_duration_seconds", "histogram"),
        ("shardline_checkpoint_op", "gauge"),
        ("shardline_journal_bytes", "gauge"),
        ("shardline_sessions", "gauge"),
        ("shardline_view", "gauge"),
        ("shardline_replica", "gauge"),
        ("shardline_primary", "gauge"),
        ("shardline_is_primary", "gauge"),
        ("shardline_commit_min", "gauge"),
        ("shardline_commit_max", "gauge"),
        ("shardline_state_transfers_started", "counter"),
        ("shardline_state_transfers", "counter"),
        ("shardline_io_worker_cpu_seconds", "counter"),
        ("shardline_process_cpu_seconds", "counter"),
        ("shardline_io_driver", "info"),
        ("shardline_open_fds", "gauge"),
        ("shardline_open_fds_limit", "gauge"),
        ("shardline_scrape_duration_seconds", "gauge"),
    ];

    #[test]
    fn every_family_is_present_once_with_its_type() {
        let text = encode(scrape(vec![Ok(shard(0)), Ok(shard(1))]));
        let types: Vec<(&str, &str)> = text
            .lines()
            .filter_map(|line| line.strip_prefix("# TYPE "))
            .map(|rest| rest.split_once(' ').unwrap())
            .collect();
        assert_eq!(types, FAMILIES, "{text}");
        assert!(text.ends_with("# EOF\n"));
        let names: BTreeSet<&str> = types.iter().map(|(name, _)| *name).collect();
        assert_eq!(names.len(), FAMILIES.len(), "a family is written twice");
    }

    #[test]
    fn shard_figures_carry_their_shard_and_process_figures_none() {
        let samples = samples(&encode(scrape(vec![Ok(shard(0)), Ok(shard(1))])));
        let expect = |name: &str, labels: &str, expected: &str| {
            assert_eq!(
                value(&samples, name, labels),
                expected,
                "{name}{{{labels}}}"
            );
        };
        expect("shardline_messages_appended_total", "shard=\"1\"", "1001");
        expect("shardline_appended_bytes_total", "shard=\"1\"", "1002");
        expect("shardline_messages_read_total", "shard=\"0\"", "3");
        expect("shardline_read_bytes_total", "shard=\"1\"", "1004");
        expect(
            "shardline_requests_total",
            "operation=\"send_messages\",result=\"busy\",shard=\"1\"",
            "1006",
        );
        expect("shardline_busy_replies_total", "shard=\"1\"", "1007");
        expect("shardline_mesh_frames_sent_total", "shard=\"1\"", "1008");
        expect("shardline_mesh_inbox_full_total", "shard=\"1\"", "1009");
        expect("shardline_inbox_depth", "shard=\"1\"", "1010");
        expect("shardline_connections_open", "shard=\"1\"", "1011");
        expect("shardline_connections_refused_total", "shard=\"1\"", "1012");
        expect("shardline_receive_budget_bytes", "shard=\"1\"", "1013");
        expect("shardline_receive_budget_max_bytes", "shard=\"1\"", "1014");
        expect("shardline_fsyncs_total", "shard=\"1\"", "1015");
        expect("shardline_shard_cpu_seconds_total", "shard=\"0\"", "1.5");
        expect("shardline_partitions", "shard=\"1\"", "1016");
        expect("shardline_reply_lane_depth", "shard=\"1\"", "1017");
        expect("shardline_connections_max", "shard=\"1\"", "1018");
        expect("shardline_parked_polls", "shard=\"1\"", "1019");
        expect("shardline_shard_up", "shard=\"0\"", "1");
        expect("shardline_metadata_ops_committed_total", "", "21");
        expect("shardline_checkpoints_total", "", "22");
        expect("shardline_checkpoint_op", "", "23");
        expect("shardline_journal_bytes", "", "24");
        expect("shardline_sessions", "", "25");
        expect("shardline_view", "", "26");
        expect("shardline_replica", "", "1");
        expect("shardline_primary", "", "2");
        expect("shardline_is_primary", "", "0");
        expect("shardline_commit_min", "", "27");
        expect("shardline_commit_max", "", "28");
        expect("shardline_state_transfers_started_total", "", "29");
        expect(
            "shardline_state_transfers_total",
            "result=\"completed\"",
            "30",
        );
        expect("shardline_state_transfers_total", "result=\"failed\"", "31");
        expect("shardline_io_worker_cpu_seconds_total", "", "1.25");
        expect("shardline_process_cpu_seconds_total", "", "9.5");
        expect("shardline_io_driver_info", "driver=\"io-uring\"", "1");
        expect("shardline_open_fds", "", "40");
        expect("shardline_open_fds_limit", "", "1024");
        expect("shardline_scrape_duration_seconds", "", "0.003");
    }

    #[test]
    fn histogram_buckets_are_cumulative_and_end_with_inf() {
        let samples = samples(&encode(scrape(vec![Ok(shard(0))])));
        let bucket = |le: &str| {
            value(
                &samples,
                "shardline_group_commit_batch_size_bucket",
                &format!("le=\"{le}\",shard=\"0\""),
            )
        };
        assert_eq!(
            ["1.0", "2.0", "4.0", "+Inf"].map(bucket),
            ["2", "5", "5", "7"].map(str::to_owned)
        );
        let name = "shardline_group_commit_batch_size";
        assert_eq!(
            value(&samples, &format!("{name}_count"), "shard=\"0\""),
            "7"
        );
        assert_eq!(
            value(&samples, &format!("{name}_sum"), "shard=\"0\""),
            "20.0"
        );
        let latency = "shardline_fsync_duration_seconds_bucket";
        assert_eq!(value(&samples, latency, "le=\"0.001\",shard=\"0\""), "1");
        assert_eq!(value(&samples, latency, "le=\"+Inf\",shard=\"0\""), "3");
    }

    #[test]
    fn a_missing_shard_is_down_with_no_other_sample() {
        let text = encode(scrape(vec![
            Err(GatherError::Timeout {
                shard: 0,
                timeout_ms: 2000,
            }),
            Ok(shard(1)),
        ]));
        let samples = samples(&text);
        assert_eq!(value(&samples, "shardline_shard_up", "shard=\"0\""), "0");
        assert_eq!(value(&samples, "shardline_shard_up", "shard=\"1\""), "1");
        let about_shard_0: Vec<_> = samples
            .keys()
            .filter(|(name, labels)| labels.contains("shard=\"0\"") && name != "shardline_shard_up")
            .collect();
        assert_eq!(about_shard_0, Vec::<&(String, String)>::new());
        // Shard 0 carries the replica figures: their families stay, without samples.
        assert!(text.contains("# TYPE shardline_view gauge\n"));
        assert!(!samples.keys().any(|(name, _)| name == "shardline_view"));
    }

    #[test]
    fn no_primary_during_a_view_change_leaves_out_the_sample() {
        let mut shard0 = shard(0);
        shard0.replica.as_mut().unwrap().primary = None;
        let samples = samples(&encode(scrape(vec![Ok(shard0)])));
        assert!(!samples.keys().any(|(name, _)| name == "shardline_primary"));
        assert_eq!(value(&samples, "shardline_view", ""), "26");
    }

    #[test]
    fn the_text_parses_as_prometheus_exposition() {
        let text = encode(scrape(vec![Ok(shard(0)), Ok(shard(1))]));
        let scrape =
            prometheus_parse::Scrape::parse(text.lines().map(|line| Ok(line.to_owned()))).unwrap();
        let appended: Vec<f64> = scrape
            .samples
            .iter()
            .filter(|sample| sample.metric == "shardline_messages_appended_total")
            .map(|sample| match sample.value {
                prometheus_parse::Value::Counter(value)
                | prometheus_parse::Value::Untyped(value) => value,
                ref other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(appended, [1.0, 1001.0]);
        let histogram = scrape
            .samples
            .iter()
            .find(|sample| {
                sample.metric == "shardline_fsync_duration_seconds"
                    && sample.labels.get("shard") == Some("1")
            })
            .expect("the fsync histogram of shard 1");
        let prometheus_parse::Value::Histogram(buckets) = &histogram.value else {
            panic!("{histogram:?}");
        };
        let bounds: Vec<f64> = buckets.iter().map(|bucket| bucket.less_than).collect();
        assert_eq!(bounds, [0.001, 0.01, f64::INFINITY]);
        let counts: Vec<f64> = buckets.iter().map(|bucket| bucket.count).collect();
        assert_eq!(counts, [1.0, 3.0, 3.0]);
        // Each sample line is NAME{LABELS} VALUE with a numeric value, never with empty braces.
        assert!(!text.contains("{}"), "{text}");
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let value = line.rsplit_once(' ').unwrap().1;
            assert!(value == "+Inf" || value.parse::<f64>().is_ok(), "{line}");
        }
    }
}
