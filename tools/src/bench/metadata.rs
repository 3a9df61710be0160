//! `shardline bench --workload metadata`: metadata commit latency against a disk baseline.
//!
//! One run per `--shards` entry, each on a fresh embedded server (or on `--addr`). One client
//! connection, one request in flight: round `i` creates stream `first + i`, creates topic 1 in it
//! with one partition, and deletes the stream, timing each round trip. Right before each round,
//! one 4 KiB write at offset 0 + fdatasync of a scratch file on the server's filesystem is timed
//! (interleaved, so that both see the same disk over the same minutes). The report gives p50, p99
//! and max of each and the p99 ratio against issue 3's target.
//!
//! Must never touch a stream it did not create (ids start above the highest existing one), never
//! leave a stream it created behind when it can delete it, and never fail because a target was
//! missed: that is a figure in the report.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use bus::{Client, Metadata};
use hdrhistogram::Histogram;

use super::disk_baseline::{DiskBaseline, same_filesystem};
use super::json_file::JsonReportFile;
use super::metadata_report::{
    BaselineLocation, MetadataBenchReport, MetadataMeasurement, MetadataRunConfig,
    MetadataRunReport, TOPIC_PARTITION_COUNT, render_metadata_run,
};
use super::phase::progress_bar;
use super::plan::{BenchPlan, ShardRequest};
use super::report::new_latency_histogram;
use super::workload::record_latency;
use super::{RunServer, check_external_shard_count, server_label, start_server};

/// The topic each round creates in its stream.
const TOPIC_ID: u16 = 1;

/// Runs the metadata workload as `plan` says, prints a table per run and writes `--json`.
///
/// # Errors
/// A server that fails to start or stop, a scratch file that cannot be created or synced, a
/// metadata request that fails (naming the round, the op and the stream), or stream ids exhausted
/// on `--addr`. A missed target is not an error.
pub fn run(plan: &BenchPlan, json_file: Option<JsonReportFile>) -> anyhow::Result<()> {
    let mut runs = Vec::new();
    for request in &plan.shard_requests {
        let run = run_one(plan, *request)?;
        crate::output::print_text(&render_metadata_run(&run))?;
        runs.push(run);
    }
    match json_file {
        Some(json_file) => json_file.write(&MetadataBenchReport::new(runs)),
        None => Ok(()),
    }
}

/// Where the baseline's scratch file goes, and the data directory it is compared with.
fn baseline_place(
    plan: &BenchPlan,
    server: &RunServer,
) -> anyhow::Result<(PathBuf, BaselineLocation, Option<PathBuf>)> {
    if let Some(embedded) = &server.embedded {
        let run_dir = embedded
            .run_dir()
            .context("the embedded server has no run directory")?;
        return Ok((
            run_dir.to_path_buf(),
            BaselineLocation::ServerRunDir,
            embedded.data_dir(),
        ));
    }
    Ok(match &plan.baseline_root {
        Some(root) => (root.clone(), BaselineLocation::DataRoot, None),
        None => (std::env::temp_dir(), BaselineLocation::SystemTempDir, None),
    })
}

fn run_one(plan: &BenchPlan, request: ShardRequest) -> anyhow::Result<MetadataRunReport> {
    let mut server = start_server(plan, request)?;
    let measured = check_external_shard_count(plan, request, server.addr).and_then(|()| {
        let (dir, location, data_dir) = baseline_place(plan, &server)?;
        let same_filesystem_as_server = data_dir
            .map(|data_dir| same_filesystem(&dir, &data_dir))
            .transpose()?;
        let mut baseline = DiskBaseline::create(&dir)?;
        let measured = measure(plan, server.addr, &mut baseline, location)?;
        Ok((measured, same_filesystem_as_server))
    });
    let (shard_count, mut measured, same_filesystem_as_server) =
        match (measured, server.embedded.take()) {
            (Ok(((shard_count, measured), same)), Some(embedded)) => {
                embedded.stop()?;
                (shard_count, measured, same)
            }
            (Ok(((shard_count, measured), same)), None) => (shard_count, measured, same),
            // The server's log usually says why requests failed: keep it.
            (Err(error), Some(embedded)) => return Err(error.context(embedded.abandon())),
            (Err(error), None) => return Err(error),
        };
    measured.same_filesystem_as_server = same_filesystem_as_server;
    let (options, fsync) = plan.server_options_and_fsync();
    let config = MetadataRunConfig {
        server: server_label(plan),
        server_pid: server.pid,
        shards_requested: request.to_string(),
        fsync,
        cpus: options.cpus,
        no_pin: options.no_pin,
        io_driver: options.io_driver,
        inbox_capacity: options.inbox_capacity,
        idle_poll_us: options.idle_poll_us,
        first_stream_id: measured.first_stream_id,
        topic_partitions: TOPIC_PARTITION_COUNT,
    };
    Ok(MetadataRunReport::new(shard_count, config, &measured))
}

/// The first of `round_count` consecutive stream ids above every stream in `metadata`.
///
/// # Errors
/// The ids would pass `u32::MAX`.
pub fn first_free_stream_id(metadata: &Metadata, round_count: u32) -> anyhow::Result<u32> {
    assert!(round_count >= 1, "validated: --metadata-ops >= 1");
    let highest = metadata
        .streams
        .iter()
        .map(|stream| stream.stream_id)
        .max()
        .unwrap_or(0);
    highest
        .checked_add(1)
        .filter(|first| first.checked_add(round_count - 1).is_some())
        .with_context(|| {
            format!(
                "the server's highest stream id is {highest}: no room above it for {round_count} \
                 new streams; lower --metadata-ops"
            )
        })
}

/// The histograms of one run, µs.
struct RoundHistograms {
    baseline: Histogram<u64>,
    register: Histogram<u64>,
    create_stream: Histogram<u64>,
    create_topic: Histogram<u64>,
    delete_stream: Histogram<u64>,
}

/// Runs the rounds on one connection; returns the server's shard count and the measurement
/// (`same_filesystem_as_server` left `None` for the caller).
fn measure(
    plan: &BenchPlan,
    addr: SocketAddr,
    baseline: &mut DiskBaseline,
    location: BaselineLocation,
) -> anyhow::Result<(u16, MetadataMeasurement)> {
    let round_count = plan.metadata_op_count;
    let runtime = compio::runtime::Runtime::new().context("cannot create a compio runtime")?;
    runtime.block_on(async {
        let mut client = Client::connect(addr)
            .await
            .context("cannot reach the server")?;
        let metadata = client
            .get_metadata()
            .await
            .context("cannot read the metadata")?;
        let first_stream_id = first_free_stream_id(&metadata, round_count)?;
        let mut histograms = RoundHistograms {
            baseline: new_latency_histogram(),
            register: new_latency_histogram(),
            create_stream: new_latency_histogram(),
            create_topic: new_latency_histogram(),
            delete_stream: new_latency_histogram(),
        };
        let bar = progress_bar("metadata", Some(round_count.into()));
        let mut result = Ok(());
        for round_index in 0..round_count {
            let stream_id = first_stream_id + round_index;
            result = match baseline.write_and_sync() {
                Ok(elapsed) => {
                    record_latency(&mut histograms.baseline, elapsed);
                    // A new client per round (connected untimed): a Register commits only for a
                    // client without a session; the server answers a repeated one from its table.
                    match Client::connect(addr).await {
                        Ok(round_client) => {
                            client = round_client;
                            one_round(&mut client, stream_id, &mut histograms)
                                .await
                                .with_context(|| format!("round {round_index} of {round_count}"))
                        }
                        Err(error) => Err(anyhow::Error::new(error)
                            .context(format!("round {round_index}: cannot connect"))),
                    }
                }
                Err(error) => Err(error),
            };
            if result.is_err() {
                break;
            }
            bar.inc(1);
        }
        bar.finish_and_clear();
        result?;
        Ok((
            metadata.shard_count,
            MetadataMeasurement {
                round_count,
                first_stream_id,
                baseline_us: histograms.baseline,
                register_us: histograms.register,
                create_stream_us: histograms.create_stream,
                create_topic_us: histograms.create_topic,
                delete_stream_us: histograms.delete_stream,
                baseline_path: baseline.path().to_path_buf(),
                baseline_location: location,
                same_filesystem_as_server: None,
            },
        ))
    })
}

/// One round on a fresh client: register (a new session: one journaled op, the purest
/// commit), create stream, create its 1-partition topic, delete the stream, each timed. A
/// failure after the stream exists deletes it (best effort) before returning the error.
async fn one_round(
    client: &mut Client,
    stream_id: u32,
    histograms: &mut RoundHistograms,
) -> anyhow::Result<()> {
    let started_at = Instant::now();
    client.register().await.context("cannot register")?;
    record_latency(&mut histograms.register, started_at.elapsed());
    let started_at = Instant::now();
    client
        .create_stream(stream_id, &format!("bench-metadata-{stream_id}"))
        .await
        .with_context(|| format!("cannot create stream {stream_id}"))?;
    record_latency(&mut histograms.create_stream, started_at.elapsed());
    let started_at = Instant::now();
    let created = client
        .create_topic(stream_id, TOPIC_ID, "bench-metadata", TOPIC_PARTITION_COUNT)
        .await;
    if let Err(error) = created {
        let error = anyhow::Error::new(error)
            .context(format!("cannot create topic {stream_id}/{TOPIC_ID}"));
        return Err(clean_up(client, stream_id, error).await);
    }
    record_latency(&mut histograms.create_topic, started_at.elapsed());
    let started_at = Instant::now();
    client.delete_stream(stream_id).await.with_context(|| {
        format!("cannot delete stream {stream_id}; it may be left on the server")
    })?;
    record_latency(&mut histograms.delete_stream, started_at.elapsed());
    Ok(())
}

/// Tries to delete `stream_id` after `error`; says in the error whether it may be left behind.
async fn clean_up(client: &mut Client, stream_id: u32, error: anyhow::Error) -> anyhow::Error {
    match client.delete_stream(stream_id).await {
        Ok(()) => error.context(format!("stream {stream_id} was deleted again")),
        Err(delete_error) => error.context(format!(
            "stream {stream_id} may be left on the server (deleting it failed: {delete_error})"
        )),
    }
}

#[cfg(test)]
mod tests {
    use bus::StreamInfo;

    use super::*;

    fn metadata(stream_ids: &[u32]) -> Metadata {
        Metadata {
            shard_count: 1,
            streams: stream_ids
                .iter()
                .map(|stream_id| StreamInfo {
                    stream_id: *stream_id,
                    name: format!("s{stream_id}"),
                    topics: Vec::new(),
                })
                .collect(),
            ..Metadata::default()
        }
    }

    #[test]
    fn stream_ids_start_above_the_highest_existing_one() {
        assert_eq!(first_free_stream_id(&metadata(&[]), 200).unwrap(), 1);
        assert_eq!(first_free_stream_id(&metadata(&[7, 3]), 200).unwrap(), 8);
        assert_eq!(
            first_free_stream_id(&metadata(&[u32::MAX - 10]), 10).unwrap(),
            u32::MAX - 9
        );
        assert_eq!(
            first_free_stream_id(&metadata(&[u32::MAX - 10]), 11)
                .unwrap_err()
                .to_string(),
            format!(
                "the server's highest stream id is {}: no room above it for 11 new streams; \
                 lower --metadata-ops",
                u32::MAX - 10
            )
        );
        assert!(first_free_stream_id(&metadata(&[u32::MAX]), 1).is_err());
    }
}
