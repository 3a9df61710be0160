//! Criterion bench of `storage::durable_replace` for a 64 MiB snapshot-sized file against the floor
//! it cannot beat: a plain sequential write of the same bytes to a fresh file in the same temp
//! directory, then fsync (all through compio's `io_uring`), with the unlink of the previous plain
//! file untimed and, as a like-for-like floor, timed (a replace frees the old file's blocks in its
//! rename). Throughput is payload bytes; the ratios are the cost of durability (trailer hash,
//! rename, directory fsync). This measures; it never asserts.
//!
//! Only the call under test is timed: cloning the 64 MiB buffer each call needs (compio takes
//! owned buffers) and removing the previous plain file happen outside the timed span. Disk use
//! stays at about two files' worth.

use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;
use compio::BufResult;
use compio::fs::OpenOptions;
use compio::io::AsyncWriteAtExt;
use criterion::{Criterion, SamplingMode, Throughput, criterion_group, criterion_main};
use storage::durable_replace;

/// Bytes of the benchmarked file: a large checkpoint snapshot.
const PAYLOAD_SIZE_BYTES: usize = 64 * 1024 * 1024;

fn payload() -> Vec<u8> {
    (0..PAYLOAD_SIZE_BYTES)
        .map(|index| (index % 251) as u8)
        .collect()
}

/// `iterations` durable replaces of `dir/snapshot`; returns the time spent in `durable_replace`.
fn durable_sample(
    runtime: &compio::runtime::Runtime,
    dir: &Path,
    payload: &[u8],
    iterations: u64,
) -> anyhow::Result<Duration> {
    let path = dir.join("snapshot");
    runtime.block_on(async {
        let mut elapsed = Duration::ZERO;
        for _ in 0..iterations {
            let bytes = payload.to_vec();
            let started_at = Instant::now();
            durable_replace(&path, bytes)
                .await
                .context("durable replace")?;
            elapsed += started_at.elapsed();
        }
        anyhow::Ok(elapsed)
    })
}

/// `iterations` times: remove `dir/plain` (timed only when `time_unlink`), then create it, write
/// `payload` at position 0 and fsync it (timed).
fn plain_sample(
    runtime: &compio::runtime::Runtime,
    dir: &Path,
    payload: &[u8],
    time_unlink: bool,
    iterations: u64,
) -> anyhow::Result<Duration> {
    let path = dir.join("plain");
    runtime.block_on(async {
        let mut elapsed = Duration::ZERO;
        for _ in 0..iterations {
            let bytes = payload.to_vec();
            let unlink_started_at = Instant::now();
            match compio::fs::remove_file(&path).await {
                Ok(()) => {}
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {}
                Err(error) => return Err(error).context("remove the previous plain file"),
            }
            let started_at = if time_unlink {
                unlink_started_at
            } else {
                Instant::now()
            };
            let file = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(true)
                .open(&path)
                .await
                .context("create plain file")?;
            let BufResult(result, _) = (&file).write_all_at(bytes, 0).await;
            result.context("write plain file")?;
            file.sync_all().await.context("fsync plain file")?;
            file.close().await.context("close plain file")?;
            elapsed += started_at.elapsed();
        }
        anyhow::Ok(elapsed)
    })
}

/// Overwrites the same allocated 64 MiB file in place and fsyncs it: no allocation, no freeing.
fn overwrite_sample(
    runtime: &compio::runtime::Runtime,
    dir: &Path,
    payload: &[u8],
    iterations: u64,
) -> anyhow::Result<Duration> {
    let path = dir.join("overwrite");
    runtime.block_on(async {
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .await
            .context("open overwrite file")?;
        let mut elapsed = Duration::ZERO;
        for _ in 0..iterations {
            let bytes = payload.to_vec();
            let started_at = Instant::now();
            let BufResult(result, _) = (&file).write_all_at(bytes, 0).await;
            result.context("write overwrite file")?;
            file.sync_all().await.context("fsync overwrite file")?;
            elapsed += started_at.elapsed();
        }
        file.close().await.context("close overwrite file")?;
        anyhow::Ok(elapsed)
    })
}

fn durable(criterion: &mut Criterion) {
    let runtime = compio::runtime::Runtime::new().expect("create compio runtime");
    let dir = tempfile::tempdir().expect("create temp dir");
    let payload = payload();
    let mut group = criterion.benchmark_group("durable");
    // Each call moves 64 MiB to disk: a few samples of a few calls each, with the same number of
    // calls per sample, keep the whole run under two minutes.
    group.sampling_mode(SamplingMode::Flat);
    group.sample_size(10);
    group.warm_up_time(Duration::from_secs(1));
    group.measurement_time(Duration::from_secs(8));
    group.throughput(Throughput::Bytes(PAYLOAD_SIZE_BYTES as u64));
    // (a) What a checkpoint does: tmp write (over the recycled previous file), fsync, rename over
    // the previous file, directory fsync.
    group.bench_function("64MiB/durable_replace", |bencher| {
        bencher.iter_custom(|iterations| {
            durable_sample(&runtime, dir.path(), &payload, iterations)
                .unwrap_or_else(|error| panic!("durable replace bench failed: {error:#}"))
        });
    });
    // (b) The floor: a fresh file, written and fsynced; freeing the previous one is not timed.
    group.bench_function("64MiB/plain_write_fsync", |bencher| {
        bencher.iter_custom(|iterations| {
            plain_sample(&runtime, dir.path(), &payload, false, iterations)
                .unwrap_or_else(|error| panic!("plain write bench failed: {error:#}"))
        });
    });
    // (c) Like (b) but timing the unlink of the previous file: a replace frees the old file's
    // blocks too (in its rename), so this is the like-for-like floor for (a).
    group.bench_function("64MiB/plain_unlink_write_fsync", |bencher| {
        bencher.iter_custom(|iterations| {
            plain_sample(&runtime, dir.path(), &payload, true, iterations)
                .unwrap_or_else(|error| panic!("plain write bench failed: {error:#}"))
        });
    });
    // (d) The floor for what durable_replace now does with a large file (it overwrites the
    // blocks of the file it replaced): the same bytes over an allocated file, fsynced.
    group.bench_function("64MiB/plain_overwrite_fsync", |bencher| {
        bencher.iter_custom(|iterations| {
            overwrite_sample(&runtime, dir.path(), &payload, iterations)
                .unwrap_or_else(|error| panic!("overwrite bench failed: {error:#}"))
        });
    });
    group.finish();
}

criterion_group!(benches, durable);
criterion_main!(benches);
