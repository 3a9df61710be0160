//! Criterion bench of `storage::PartitionLog::append`: one batch entry of 1000 x 1000-byte messages
//! (~1 MB payload, valid header and checksum) per iteration into a temp-dir log on a compio
//! runtime, under `FsyncPolicy::Never` (page cache) and `FsyncPolicy::Always` (fdatasync per
//! append, nothing to group with). Throughput is entry bytes. This measures; it never asserts.
//!
//! Each sample appends into a fresh log that is deleted afterwards, so disk use stays at one
//! sample's worth (a few hundred MB) however long criterion runs.

use std::time::{Duration, Instant};

use anyhow::Context;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use storage::limits::SEGMENT_SIZE_MAX_DEFAULT;
use storage::{FsyncPolicy, LogConfig, PartitionLog, build_entry};

const MESSAGE_COUNT: u32 = 1000;
const MESSAGE_SIZE_BYTES: usize = 1000;

/// One entry of `MESSAGE_COUNT` messages of `MESSAGE_SIZE_BYTES` each. Storage does not look inside
/// the payload, so the messages are plain bytes.
fn batch_entry() -> Vec<u8> {
    let payload: Vec<u8> = (0..MESSAGE_COUNT as usize * MESSAGE_SIZE_BYTES)
        .map(|index| (index % 251) as u8)
        .collect();
    build_entry(0, MESSAGE_COUNT, &payload)
}

/// Opens a fresh log, appends `iterations` copies of `entry` one after another (awaiting each), and
/// returns the time spent in `append` only (the copy of the entry is not timed).
fn append_sample(
    runtime: &compio::runtime::Runtime,
    fsync: FsyncPolicy,
    entry: &[u8],
    iterations: u64,
) -> anyhow::Result<Duration> {
    let dir = tempfile::tempdir().context("create temp dir")?;
    runtime.block_on(async {
        let config = LogConfig {
            fsync,
            segment_size_max: SEGMENT_SIZE_MAX_DEFAULT,
            write_mode: storage::WriteMode::Buffered,
        };
        let (log, _) = PartitionLog::open(dir.path(), config)
            .await
            .context("open log")?;
        let mut elapsed = Duration::ZERO;
        for _ in 0..iterations {
            let entry = entry.to_vec();
            let started_at = Instant::now();
            log.append(entry).await.context("append")?;
            elapsed += started_at.elapsed();
        }
        log.close().await.context("close log")?;
        anyhow::Ok(elapsed)
    })
}

fn append(criterion: &mut Criterion) {
    let runtime = compio::runtime::Runtime::new().expect("create compio runtime");
    let entry = batch_entry();
    let mut group = criterion.benchmark_group("append");
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(3));
    group.sample_size(10);
    group.throughput(Throughput::Bytes(entry.len() as u64));
    for (name, fsync) in [
        ("fsync_never", FsyncPolicy::Never),
        ("fsync_always", FsyncPolicy::Always),
    ] {
        group.bench_function(format!("1000x1000B/{name}"), |bencher| {
            bencher.iter_custom(|iterations| {
                append_sample(&runtime, fsync, &entry, iterations)
                    .unwrap_or_else(|error| panic!("append bench failed: {error:#}"))
            });
        });
    }
    group.finish();
}

criterion_group!(benches, append);
criterion_main!(benches);
