//! Issue 7 item 5: opening a log reports every producer's last stamped batches (from the active
//! segment's producer-state snapshot and the active segment's entries), so the owner shard can
//! rebuild its idempotent-producer table after a restart (`storage/FORMAT.md` section 3,
//! "Producer stamp"). The snapshot files themselves are tested in `producer_snapshots.rs`.

use std::path::Path;

use storage::entry::{build_entry_raw, message_section};
use storage::{FsyncPolicy, LogConfig, PartitionLog, ProducerBatch};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

fn config(segment_size_max: u64) -> LogConfig {
    LogConfig {
        fsync: FsyncPolicy::Always,
        segment_size_max,
        write_mode: storage::WriteMode::Buffered,
    }
}

/// A payload shaped like a bus batch section of `message_count` messages (the first holds
/// `filler` bytes; bit 0 of bytes 12..16 flags a stamp), then the 16-byte stamp when `stamp` is
/// given.
fn payload(stamp: Option<(u64, u64)>, message_count: u32, filler: usize) -> Vec<u8> {
    let mut payload = message_section(message_count, &vec![0u8; filler]);
    if let Some((producer, sequence)) = stamp {
        payload[12] = 1;
        payload.extend_from_slice(&producer.to_le_bytes());
        payload.extend_from_slice(&sequence.to_le_bytes());
    }
    payload
}

async fn append(log: &PartitionLog, stamp: Option<(u64, u64)>, message_count: u32) -> u64 {
    log.append(build_entry_raw(
        0,
        message_count,
        &payload(stamp, message_count, 10),
    ))
    .await
    .unwrap()
}

fn batch(producer: u64, sequence: u64, message_count: u32, base_offset: u64) -> ProducerBatch {
    ProducerBatch {
        producer,
        sequence,
        message_count,
        base_offset,
    }
}

async fn reopen(dir: &Path, segment_size_max: u64) -> Vec<ProducerBatch> {
    let (log, report) = PartitionLog::open(dir, config(segment_size_max))
        .await
        .unwrap();
    log.close().await.unwrap();
    report.producer_batches
}

#[test]
fn issue7_5_recovery_reports_stamped_batches_in_log_order() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, report) = PartitionLog::open(dir.path(), config(1 << 30))
            .await
            .unwrap();
        assert!(report.producer_batches.is_empty());
        assert_eq!(append(&log, Some((7, 0)), 3).await, 0);
        assert_eq!(append(&log, None, 2).await, 3);
        assert_eq!(append(&log, Some((9, 100)), 1).await, 5);
        assert_eq!(append(&log, Some((7, 3)), 4).await, 6);
        log.close().await.unwrap();
        assert_eq!(
            reopen(dir.path(), 1 << 30).await,
            vec![batch(7, 0, 3, 0), batch(9, 100, 1, 5), batch(7, 3, 4, 6)]
        );
    });
}

#[test]
fn issue7_5_a_torn_stamped_entry_is_not_reported() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(1 << 30))
            .await
            .unwrap();
        append(&log, Some((7, 0)), 1).await;
        append(&log, Some((7, 1)), 1).await;
        log.close().await.unwrap();
    });
    let segment = dir.path().join(format!("{:020}.log", 0));
    let size = std::fs::metadata(&segment).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&segment)
        .unwrap();
    file.set_len(size - 3).unwrap();
    block_on(async {
        assert_eq!(reopen(dir.path(), 1 << 30).await, vec![batch(7, 0, 1, 0)]);
    });
}

#[test]
fn issue7_5_producers_of_every_earlier_segment_are_recovered() {
    let dir = tempfile::tempdir().unwrap();
    // Each entry is 32 + 32 + 10 + 16 = 90 bytes: a 100-byte segment holds one.
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(100)).await.unwrap();
        append(&log, Some((7, 0)), 1).await;
        append(&log, Some((8, 0)), 2).await;
        append(&log, None, 1).await;
        append(&log, None, 1).await;
        append(&log, Some((9, 5)), 1).await;
        log.close().await.unwrap();
        // Segments 0, 1, 3, 4 and 5: producer 7 is three segments before the active one.
        assert_eq!(
            reopen(dir.path(), 100).await,
            vec![batch(7, 0, 1, 0), batch(8, 0, 2, 1), batch(9, 5, 1, 5)]
        );
    });
}
