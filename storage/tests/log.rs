//! Integration tests of `PartitionLog`: append and read back, group commit, restart, torn tails,
//! corruption, segment rolls and index files. Each test runs on its own compio runtime in a temp
//! directory and damages files with std fs the way a crash or a bad disk would.

use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::time::Duration;

use storage::entry::{ENTRY_HEADER_SIZE, EntryHeader, build_entry};
use storage::{FsyncPolicy, LogConfig, LogError, PartitionLog, Quarantine, RecoveryReport};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

fn config(fsync: FsyncPolicy, segment_size_max: u64) -> LogConfig {
    LogConfig {
        fsync,
        segment_size_max,
        write_mode: storage::WriteMode::Buffered,
    }
}

fn always() -> LogConfig {
    config(FsyncPolicy::Always, 1 << 30)
}

/// A payload of `size` bytes that differs per `seed`. Bit 0 of byte 12 is kept clear: set, it
/// would mark the entry as carrying a producer stamp (`storage/FORMAT.md` section 3).
fn payload(seed: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|index| (seed as usize * 31 + index * 7) as u8)
        .enumerate()
        .map(|(index, byte)| if index == 12 { byte & !1 } else { byte })
        .collect()
}

/// The entry as the log stores it: `entry` with `base_offset` set.
fn stored(entry: &[u8], base_offset: u64) -> Vec<u8> {
    let mut stored = entry.to_vec();
    stored[0..8].copy_from_slice(&base_offset.to_le_bytes());
    stored
}

async fn open(dir: &Path, config: LogConfig) -> (PartitionLog, RecoveryReport) {
    PartitionLog::open(dir, config).await.unwrap()
}

fn segment(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

fn index_file(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

/// Appends `count` entries of `message_count` messages and `payload_size` bytes each; returns the
/// stored bytes of each.
async fn append_entries(
    log: &PartitionLog,
    count: u64,
    message_count: u32,
    payload_size: usize,
) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for seed in 0..count {
        let entry = build_entry(seed, message_count, &payload(seed, payload_size));
        let expected_offset = log.next_offset();
        let offset = log.append(entry.clone()).await.unwrap();
        assert_eq!(offset, expected_offset);
        all.push(stored(&entry, offset));
    }
    all
}

#[test]
fn append_and_read_back_exact_bytes_and_offsets() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: 0,
                next_offset: 0,
                truncated_bytes: 0,
                direct_padding_bytes: 0,
                scanned_segment_count: 0,
                producer_batches: Vec::new(),
                quarantined: None,
            }
        );
        let mut expected = Vec::new();
        for seed in 0..10u64 {
            let entry = build_entry(
                1000 + seed,
                seed as u32 + 1,
                &payload(seed, 100 + seed as usize),
            );
            let offset = log.append(entry.clone()).await.unwrap();
            expected.push((offset, stored(&entry, offset)));
        }
        // Offsets are 0, 1, 3, 6, ...: each entry advances by its message count.
        let offsets: Vec<u64> = expected.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(offsets, vec![0, 1, 3, 6, 10, 15, 21, 28, 36, 45]);
        assert_eq!(log.next_offset(), 55);
        assert_eq!(log.acked_offset(), 55);

        let all: Vec<u8> = expected
            .iter()
            .flat_map(|(_, bytes)| bytes.clone())
            .collect();
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), all);
        // An offset inside entry 3 (offsets 6..10) starts at that entry.
        let from_entry_3: Vec<u8> = expected[3..].iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(
            log.read(8, u32::MAX, usize::MAX).await.unwrap(),
            from_entry_3
        );
        // max_count: entry 3 has 4 messages, entry 4 has 5; 5 messages needs both.
        let two: Vec<u8> = expected[3..5].iter().flat_map(|(_, b)| b.clone()).collect();
        assert_eq!(log.read(6, 5, usize::MAX).await.unwrap(), two);
        assert_eq!(log.read(6, 4, usize::MAX).await.unwrap(), expected[3].1);
        // max_bytes: the first entry is returned whole even when larger.
        assert_eq!(log.read(6, u32::MAX, 1).await.unwrap(), expected[3].1);
        let size_3_4 = expected[3].1.len() + expected[4].1.len();
        assert_eq!(log.read(6, u32::MAX, size_3_4).await.unwrap(), two);
        assert_eq!(
            log.read(6, u32::MAX, size_3_4 - 1).await.unwrap(),
            expected[3].1
        );
        // At the end: nothing (caught up); beyond it: out of range.
        assert!(log.read(55, u32::MAX, usize::MAX).await.unwrap().is_empty());
        assert!(matches!(
            log.read(1000, u32::MAX, usize::MAX).await,
            Err(LogError::OffsetOutOfRange {
                offset: 1000,
                next_offset: 55
            })
        ));
        log.close().await.unwrap();
    });
}

#[test]
fn append_rejects_malformed_entries_without_taking_an_offset() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        let mut wrong_length = build_entry(0, 1, b"abcdef");
        wrong_length.pop();
        assert!(matches!(
            log.append(wrong_length).await,
            Err(LogError::InvalidEntry(_))
        ));
        let no_messages = build_entry(0, 0, b"abcdef");
        assert!(matches!(
            log.append(no_messages).await,
            Err(LogError::InvalidEntry(_))
        ));
        assert!(matches!(
            log.append(vec![0; 10]).await,
            Err(LogError::InvalidEntry(_))
        ));
        assert_eq!(log.next_offset(), 0);
        assert_eq!(log.append(build_entry(0, 1, b"ok")).await.unwrap(), 0);
    });
}

#[test]
fn concurrent_appends_get_increasing_offsets_and_share_fsyncs() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        let log = Rc::new(log);
        let mut tasks = Vec::new();
        for seed in 0..50u64 {
            let log = Rc::clone(&log);
            tasks.push(compio::runtime::spawn(async move {
                let entry = build_entry(seed, 2, &payload(seed, 64));
                let offset = log.append(entry.clone()).await.unwrap();
                (offset, stored(&entry, offset))
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        // Tasks run in spawn order, so offsets follow it.
        let offsets: Vec<u64> = results.iter().map(|(offset, _)| *offset).collect();
        assert_eq!(
            offsets,
            (0..50).map(|index| index * 2).collect::<Vec<u64>>()
        );
        let fsync_count = log.fsync_count();
        assert!((1..50).contains(&fsync_count), "fsync_count {fsync_count}");
        let all: Vec<u8> = results
            .iter()
            .flat_map(|(_, bytes)| bytes.clone())
            .collect();
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), all);
        log.close().await.unwrap();
    });
}

#[test]
fn appends_enqueue_in_call_order_even_before_polling() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), config(FsyncPolicy::Never, 1 << 30)).await;
        let first = log.append(build_entry(0, 3, b"first"));
        let second = log.append(build_entry(0, 1, b"second"));
        assert_eq!(log.next_offset(), 4);
        // Awaited in reverse order: the offsets were fixed at call time.
        assert_eq!(second.await.unwrap(), 3);
        assert_eq!(first.await.unwrap(), 0);
        // A dropped append is still written.
        drop(log.append(build_entry(0, 1, b"dropped")));
        log.close().await.unwrap();
        let read = log.read(4, 1, usize::MAX).await.unwrap();
        assert_eq!(&read[ENTRY_HEADER_SIZE + 32..], b"dropped");
    });
}

#[test]
fn queue_bound_answers_queue_full() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), config(FsyncPolicy::Never, 1 << 30)).await;
        let limit = storage::limits::APPEND_QUEUE_ENTRY_COUNT_MAX;
        let pending: Vec<_> = (0..limit)
            .map(|_| log.append(build_entry(0, 1, b"x")))
            .collect();
        match log.append(build_entry(0, 1, b"x")).await {
            Err(LogError::QueueFull {
                queued_count,
                queued_bytes,
            }) => {
                assert_eq!(queued_count, limit);
                assert_eq!(queued_bytes, limit * (ENTRY_HEADER_SIZE + 32 + 1));
            }
            other => panic!("expected QueueFull, got {other:?}"),
        }
        for (index, append) in pending.into_iter().enumerate() {
            assert_eq!(append.await.unwrap(), index as u64);
        }
        assert_eq!(
            log.append(build_entry(0, 1, b"x")).await.unwrap(),
            limit as u64
        );
    });
}

#[test]
fn restart_recovers_next_offset_and_bytes() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        let written = append_entries(&log, 7, 3, 200).await;
        log.close().await.unwrap();
        let (log, report) = open(dir.path(), always()).await;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: 7,
                next_offset: 21,
                truncated_bytes: 0,
                direct_padding_bytes: 0,
                scanned_segment_count: 1,
                producer_batches: Vec::new(),
                quarantined: None,
            }
        );
        assert_eq!(log.next_offset(), 21);
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
        assert_eq!(
            log.append(build_entry(0, 1, b"after restart"))
                .await
                .unwrap(),
            21
        );
        log.close().await.unwrap();
    });
}

#[test]
fn close_then_append_is_closed_and_reads_still_work() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), config(FsyncPolicy::Never, 1 << 30)).await;
        let written = append_entries(&log, 3, 1, 10).await;
        assert_eq!(log.fsync_count(), 0, "Never does not fsync appends");
        log.close().await.unwrap();
        assert_eq!(log.fsync_count(), 1, "close fsyncs what is dirty");
        log.close().await.unwrap();
        assert!(matches!(
            log.append(build_entry(0, 1, b"late")).await,
            Err(LogError::Closed)
        ));
        assert!(matches!(log.sync().await, Err(LogError::Closed)));
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
    });
}

#[test]
fn interval_policy_fsyncs_on_tick_when_due() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let policy = FsyncPolicy::Interval(Duration::from_millis(1));
        let (log, _) = open(dir.path(), config(policy, 1 << 30)).await;
        log.on_tick().await.unwrap();
        assert_eq!(log.fsync_count(), 0, "nothing written, nothing to fsync");
        append_entries(&log, 2, 1, 10).await;
        assert_eq!(
            log.fsync_count(),
            0,
            "Interval acknowledges after the write"
        );
        compio::time::sleep(Duration::from_millis(2)).await;
        log.on_tick().await.unwrap();
        assert_eq!(log.fsync_count(), 1);
        log.on_tick().await.unwrap();
        assert_eq!(log.fsync_count(), 1, "clean after the fsync");
        log.sync().await.unwrap();
        assert_eq!(log.fsync_count(), 1, "sync with nothing dirty is a no-op");
        append_entries(&log, 1, 1, 10).await;
        log.sync().await.unwrap();
        assert_eq!(log.fsync_count(), 2);
    });
}

/// Writes 5 entries with the log, closes it, then lets `damage` change the segment file.
/// Returns the stored entries.
fn log_with_damaged_tail(dir: &Path, damage: impl FnOnce(&Path)) -> Vec<Vec<u8>> {
    let written = block_on(async {
        let (log, _) = open(dir, always()).await;
        let written = append_entries(&log, 5, 2, 100).await;
        log.close().await.unwrap();
        written
    });
    damage(&segment(dir, 0));
    written
}

/// Reopens after tail damage and checks the report, the surviving bytes and the next append.
fn check_recovered(dir: &Path, kept: &[Vec<u8>], truncated_bytes: u64) {
    block_on(async {
        let (log, report) = open(dir, always()).await;
        let next_offset = kept.len() as u64 * 2;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: kept.len() as u64,
                next_offset,
                truncated_bytes,
                direct_padding_bytes: 0,
                scanned_segment_count: 1,
                producer_batches: Vec::new(),
                quarantined: None,
            }
        );
        let kept_bytes = kept.concat();
        assert_eq!(
            std::fs::metadata(segment(dir, 0)).unwrap().len(),
            kept_bytes.len() as u64
        );
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), kept_bytes);
        let entry = build_entry(9, 1, b"next");
        assert_eq!(log.append(entry.clone()).await.unwrap(), next_offset);
        assert_eq!(
            log.read(next_offset, 1, usize::MAX).await.unwrap(),
            stored(&entry, next_offset)
        );
        log.close().await.unwrap();
    });
    assert_eq!(quarantine_files(dir), Vec::<String>::new());
    // And it stays recovered.
    block_on(async {
        let (_log, report) = open(dir, always()).await;
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(report.entry_count, kept.len() as u64 + 1);
    });
}

#[test]
fn torn_tail_of_garbage_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(&[0xAB; 77]);
        std::fs::write(path, bytes).unwrap();
    });
    check_recovered(dir.path(), &written, 77);
}

#[test]
fn torn_tail_of_a_partial_entry_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let bytes = std::fs::read(path).unwrap();
        std::fs::write(path, &bytes[..bytes.len() - 50]).unwrap();
    });
    let last_size = written[4].len() as u64;
    check_recovered(dir.path(), &written[..4], last_size - 50);
}

#[test]
fn torn_tail_of_a_partial_header_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let bytes = std::fs::read(path).unwrap();
        let cut = bytes.len() - 196 + 10; // 10 bytes of the last entry's header remain
        std::fs::write(path, &bytes[..cut]).unwrap();
    });
    assert_eq!(written[4].len(), 196);
    check_recovered(dir.path(), &written[..4], 10);
}

/// Reopens after damage to the complete last entry (of 5, 196 bytes each, at byte 784) and
/// checks that entries 0..4 are kept and the last entry's bytes are quarantined byte for byte
/// (it may have been acknowledged), `last_offset` being what its header claims; then that a
/// second open changes nothing and makes no second copy.
fn check_last_entry_quarantined(dir: &Path, written: &[Vec<u8>], last_offset: u64) {
    let quarantine_path = dir.join("00000000000000000000.log.damaged-at-784");
    let damaged_bytes = std::fs::read(segment(dir, 0)).unwrap()[784..].to_vec();
    block_on(async {
        let (log, report) = open(dir, always()).await;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: 4,
                next_offset: 8,
                truncated_bytes: 196,
                direct_padding_bytes: 0,
                scanned_segment_count: 1,
                producer_batches: Vec::new(),
                quarantined: Some(Quarantine {
                    segment: segment(dir, 0),
                    position: 784,
                    path: quarantine_path.clone(),
                    size_bytes: 196,
                    first_offset: 8,
                    last_offset,
                    // Nothing after the damaged entry passes the resync header rules.
                    resync_charged_bytes: 0,
                }),
            }
        );
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written[..4].concat()
        );
        log.close().await.unwrap();
    });
    assert_eq!(std::fs::read(&quarantine_path).unwrap(), damaged_bytes);
    block_on(async {
        let (_log, report) = open(dir, always()).await;
        assert_eq!((report.truncated_bytes, report.quarantined), (0, None));
    });
    assert_eq!(
        quarantine_files(dir),
        vec!["00000000000000000000.log.damaged-at-784".to_owned()]
    );
}

#[test]
fn issue7_4_flipped_payload_byte_in_the_complete_last_entry_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        std::fs::write(path, bytes).unwrap();
    });
    check_last_entry_quarantined(dir.path(), &written, 9);
}

#[test]
fn wrong_offset_in_the_last_entry_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        let last_start = bytes.len() - 196;
        bytes[last_start] ^= 0x01;
        std::fs::write(path, bytes).unwrap();
    });
    check_recovered(dir.path(), &written[..4], 196);
}

/// Names of the quarantine files in `dir`, sorted.
fn quarantine_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains(".damaged-at-"))
        .collect();
    names.sort();
    names
}

/// A 3-entry active segment (2 messages, 196 bytes each) with one payload byte of entry
/// `damaged` flipped; returns the stored entries and the segment bytes after the damage.
fn three_entries_with_flipped_payload(dir: &Path, damaged: usize) -> (Vec<Vec<u8>>, Vec<u8>) {
    let written = block_on(async {
        let (log, _) = open(dir, always()).await;
        let written = append_entries(&log, 3, 2, 100).await;
        log.close().await.unwrap();
        written
    });
    let path = segment(dir, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[damaged * 196 + ENTRY_HEADER_SIZE + 50] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    (written, bytes)
}

#[test]
fn issue7_4_damaged_first_entry_of_the_active_segment_is_quarantined_not_dropped() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged_bytes) = three_entries_with_flipped_payload(dir.path(), 0);
    let quarantine_path = dir.path().join("00000000000000000000.log.damaged-at-0");
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: 0,
                next_offset: 0,
                truncated_bytes: 588,
                direct_padding_bytes: 0,
                scanned_segment_count: 1,
                producer_batches: Vec::new(),
                quarantined: Some(Quarantine {
                    segment: segment(dir.path(), 0),
                    position: 0,
                    path: quarantine_path.clone(),
                    size_bytes: 588,
                    first_offset: 0,
                    last_offset: 5,
                    // The two valid entries' payloads (164 bytes each), nothing else.
                    resync_charged_bytes: 328,
                }),
            }
        );
        // The cut bytes, byte for byte: the damaged entry and the two valid ones after it.
        assert_eq!(std::fs::read(&quarantine_path).unwrap(), damaged_bytes);
        assert_eq!(damaged_bytes[196..], written[1..].concat());
        assert_eq!(std::fs::metadata(segment(dir.path(), 0)).unwrap().len(), 0);
        assert_eq!(log.append(build_entry(9, 1, b"next")).await.unwrap(), 0);
        log.close().await.unwrap();
    });
    // The quarantine file is not a segment: the next open ignores it and keeps it.
    block_on(async {
        let (_log, report) = open(dir.path(), always()).await;
        assert_eq!(report.quarantined, None);
        assert_eq!(report.truncated_bytes, 0);
        assert_eq!(report.entry_count, 1);
        assert_eq!(report.segment_count, 1);
    });
    assert_eq!(
        quarantine_files(dir.path()),
        vec!["00000000000000000000.log.damaged-at-0".to_owned()]
    );
}

#[test]
fn issue7_4_damaged_middle_entry_keeps_the_first_and_quarantines_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged_bytes) = three_entries_with_flipped_payload(dir.path(), 1);
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        let quarantined = report.quarantined.unwrap();
        assert_eq!((quarantined.position, quarantined.size_bytes), (196, 392));
        assert_eq!((quarantined.first_offset, quarantined.last_offset), (2, 5));
        assert_eq!(
            quarantined.path,
            dir.path().join("00000000000000000000.log.damaged-at-196")
        );
        assert_eq!(
            std::fs::read(&quarantined.path).unwrap(),
            damaged_bytes[196..]
        );
        assert_eq!((report.entry_count, report.next_offset), (1, 2));
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), written[0]);
    });
}

#[test]
fn issue7_4_damaged_payload_of_the_last_entry_is_quarantined_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged_bytes) = three_entries_with_flipped_payload(dir.path(), 2);
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        let quarantined = report.quarantined.unwrap();
        assert_eq!((quarantined.position, quarantined.size_bytes), (392, 196));
        assert_eq!((quarantined.first_offset, quarantined.last_offset), (4, 5));
        assert_eq!((report.truncated_bytes, report.next_offset), (196, 4));
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written[..2].concat()
        );
    });
    assert_eq!(
        quarantine_files(dir.path()),
        vec!["00000000000000000000.log.damaged-at-392".to_owned()]
    );
    assert_eq!(
        std::fs::read(dir.path().join("00000000000000000000.log.damaged-at-392")).unwrap(),
        damaged_bytes[392..]
    );
}

#[test]
fn issue7_4_an_existing_quarantine_file_is_never_overwritten() {
    let dir = tempfile::tempdir().unwrap();
    let (_, damaged_bytes) = three_entries_with_flipped_payload(dir.path(), 0);
    let earlier = dir.path().join("00000000000000000000.log.damaged-at-0");
    std::fs::write(&earlier, b"kept from an earlier open").unwrap();
    block_on(async {
        let (_log, report) = open(dir.path(), always()).await;
        let quarantined = report.quarantined.unwrap();
        assert_eq!(
            quarantined.path,
            dir.path().join("00000000000000000000.log.damaged-at-0.1")
        );
        assert_eq!(std::fs::read(&quarantined.path).unwrap(), damaged_bytes);
    });
    assert_eq!(
        std::fs::read(&earlier).unwrap(),
        b"kept from an earlier open"
    );
}

/// 4 KiB segments of ~1 KiB entries: 3 entries per segment.
fn small_segments() -> LogConfig {
    config(FsyncPolicy::Always, 4096)
}

/// Writes `count` entries of 2 messages and 1000 payload bytes into 4 KiB segments.
fn rolled_log(dir: &Path, count: u64) -> Vec<Vec<u8>> {
    block_on(async {
        let (log, _) = open(dir, small_segments()).await;
        let written = append_entries(&log, count, 2, 1000).await;
        log.close().await.unwrap();
        written
    })
}

#[test]
fn segments_roll_and_reads_cross_them() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 10);
    // 1096-byte entries: 3 fit in 4096 bytes, so segments start at offsets 0, 6, 12, 18.
    for (base_offset, entries) in [(0u64, 3usize), (6, 3), (12, 3), (18, 1)] {
        let size = std::fs::metadata(segment(dir.path(), base_offset))
            .unwrap()
            .len();
        assert_eq!(size, entries as u64 * 1096, "segment {base_offset}");
    }
    for closed in [0u64, 6, 12] {
        assert!(
            index_file(dir.path(), closed).exists(),
            "index of closed segment {closed}"
        );
    }
    assert!(
        !index_file(dir.path(), 18).exists(),
        "the active segment has no index file"
    );
    block_on(async {
        let (log, report) = open(dir.path(), small_segments()).await;
        assert_eq!(report.segment_count, 4);
        assert_eq!(report.entry_count, 10);
        assert_eq!(report.next_offset, 20);
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
        // From inside entry 2 (offsets 4..6) across two segment boundaries, 5 entries.
        assert_eq!(
            log.read(5, 10, usize::MAX).await.unwrap(),
            written[2..7].concat()
        );
        assert_eq!(
            log.read(5, u32::MAX, 5 * 1096).await.unwrap(),
            written[2..7].concat()
        );
        assert_eq!(log.read(12, 1, 0).await.unwrap(), written[6]);
        // Appending continues in the last segment and rolls again.
        let more = append_entries(&log, 3, 2, 1000).await;
        assert!(segment(dir.path(), 24).exists());
        let all = [written, more].concat();
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            all.concat()
        );
        log.close().await.unwrap();
    });
}

#[test]
fn entry_larger_than_a_segment_gets_its_own() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), config(FsyncPolicy::Always, 4096)).await;
        let small = append_entries(&log, 1, 1, 10).await;
        let big = build_entry(0, 1, &payload(1, 10_000));
        assert_eq!(log.append(big.clone()).await.unwrap(), 1);
        let after = append_entries(&log, 1, 1, 10).await;
        assert_eq!(
            std::fs::metadata(segment(dir.path(), 1)).unwrap().len(),
            10_064
        );
        assert!(segment(dir.path(), 2).exists());
        let all = [small, vec![stored(&big, 1)], after].concat();
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            all.concat()
        );
        log.close().await.unwrap();
    });
}

#[test]
fn index_files_are_used_on_reopen_and_rebuilt_when_bad() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 10);
    let reopen = || {
        block_on(async {
            let (log, report) = open(dir.path(), small_segments()).await;
            assert_eq!(
                log.read(0, u32::MAX, usize::MAX).await.unwrap(),
                written.concat()
            );
            report
        })
    };
    assert_eq!(
        reopen().scanned_segment_count,
        1,
        "only the last segment is scanned"
    );

    let good_index = std::fs::read(index_file(dir.path(), 6)).unwrap();
    std::fs::remove_file(index_file(dir.path(), 6)).unwrap();
    assert_eq!(
        reopen().scanned_segment_count,
        2,
        "a missing index means a rescan"
    );
    assert_eq!(
        std::fs::read(index_file(dir.path(), 6)).unwrap(),
        good_index,
        "and a rewrite"
    );
    assert_eq!(reopen().scanned_segment_count, 1);

    let mut bad_index = good_index.clone();
    bad_index[20] ^= 0x01;
    std::fs::write(index_file(dir.path(), 6), &bad_index).unwrap();
    assert_eq!(
        reopen().scanned_segment_count,
        2,
        "a corrupt index means a rescan"
    );
    assert_eq!(
        std::fs::read(index_file(dir.path(), 6)).unwrap(),
        good_index
    );

    // An index from an earlier close of a shorter segment 0 (same entries, 2 per segment) does
    // not match the segment's size: rescanned and rewritten.
    let other = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(other.path(), config(FsyncPolicy::Always, 2100)).await;
        append_entries(&log, 3, 2, 1000).await;
        log.close().await.unwrap();
    });
    let good_index_0 = std::fs::read(index_file(dir.path(), 0)).unwrap();
    std::fs::copy(index_file(other.path(), 0), index_file(dir.path(), 0)).unwrap();
    assert_ne!(
        std::fs::read(index_file(dir.path(), 0)).unwrap(),
        good_index_0
    );
    assert_eq!(
        reopen().scanned_segment_count,
        2,
        "a stale index means a rescan"
    );
    assert_eq!(
        std::fs::read(index_file(dir.path(), 0)).unwrap(),
        good_index_0
    );
    assert_eq!(reopen().scanned_segment_count, 1);
}

#[test]
fn corruption_in_a_closed_segment_is_an_error_naming_file_and_position() {
    let dir = tempfile::tempdir().unwrap();
    rolled_log(dir.path(), 10);
    let path = segment(dir.path(), 6);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1096 + 500] ^= 0x04; // payload of the second entry of segment 6
    std::fs::write(&path, &bytes).unwrap();

    // With its index file the segment is trusted on open; the read checks the checksum.
    block_on(async {
        let (log, _) = open(dir.path(), small_segments()).await;
        assert_eq!(log.read(6, 2, usize::MAX).await.unwrap().len(), 1096);
        match log.read(8, 2, usize::MAX).await {
            Err(LogError::Corrupt {
                path: named,
                position,
                reason,
            }) => {
                assert_eq!(named, path);
                assert_eq!(position, 1096);
                assert!(reason.contains("checksum"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    });

    // Without it, open scans and refuses.
    std::fs::remove_file(index_file(dir.path(), 6)).unwrap();
    let error = block_on(PartitionLog::open(dir.path(), small_segments())).unwrap_err();
    match &error {
        LogError::Corrupt {
            path: named,
            position,
            reason,
        } => {
            assert_eq!(named, &path);
            assert_eq!(*position, 1096);
            assert!(
                reason.starts_with("in a closed segment: payload checksum"),
                "{reason}"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
    assert!(
        error
            .to_string()
            .contains("00000000000000000006.log: corrupt entry at byte 1096")
    );
    // Nothing was truncated.
    assert_eq!(std::fs::read(&path).unwrap(), bytes);
}

#[test]
fn torn_closed_segment_is_an_error_not_a_truncation() {
    let dir = tempfile::tempdir().unwrap();
    rolled_log(dir.path(), 10);
    let path = segment(dir.path(), 0);
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
    let error = block_on(PartitionLog::open(dir.path(), small_segments())).unwrap_err();
    // The index no longer matches the size, so the segment is scanned and the last entry is short.
    assert!(
        matches!(&error, LogError::Corrupt { path: named, position: 2192, .. } if *named == path),
        "{error}"
    );
}

#[test]
fn missing_segment_is_an_error_naming_the_next_file() {
    let dir = tempfile::tempdir().unwrap();
    rolled_log(dir.path(), 10);
    std::fs::remove_file(segment(dir.path(), 6)).unwrap();
    let error = block_on(PartitionLog::open(dir.path(), small_segments())).unwrap_err();
    match &error {
        LogError::Corrupt {
            path,
            position: 0,
            reason,
        } => {
            assert_eq!(path, &segment(dir.path(), 12));
            assert_eq!(
                reason,
                "segment starts at offset 12 but the previous segment ends at offset 6"
            );
        }
        other => panic!("expected Corrupt, got {other:?}"),
    }
}

#[test]
fn missing_first_segment_is_an_error_naming_the_new_first_file() {
    // 10 entries: segments 0, 6, 12 closed and 18 open; 4 entries: segment 0 closed, 6 open (the
    // first remaining segment is then the last one, which open scans differently).
    for (entry_count, segment_count) in [(10, 4), (4, 2)] {
        let dir = tempfile::tempdir().unwrap();
        rolled_log(dir.path(), entry_count);
        assert!(segment(dir.path(), 6 * (segment_count - 1)).exists());
        std::fs::remove_file(segment(dir.path(), 0)).unwrap();
        let error = block_on(PartitionLog::open(dir.path(), small_segments())).unwrap_err();
        match &error {
            LogError::Corrupt {
                path,
                position: 0,
                reason,
            } => {
                assert_eq!(path, &segment(dir.path(), 6));
                assert_eq!(
                    reason,
                    &format!(
                        "the first segment starts at offset 6 but a partition log starts at \
                         offset 0: the segments before it (from {}) are missing",
                        segment(dir.path(), 0).display()
                    )
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // Refusing changed nothing: no segment 0 was created in its place.
        assert!(!segment(dir.path(), 0).exists());
    }
}

#[test]
fn empty_last_segment_after_a_crashed_roll_is_fine() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 9);
    // 9 entries fill segments 0, 6, 12 exactly; the roll to 18 happens on the next append.
    // A crash right after creating the next segment file leaves it empty.
    std::fs::write(segment(dir.path(), 18), b"").unwrap();
    block_on(async {
        let (log, report) = open(dir.path(), small_segments()).await;
        assert_eq!(report.segment_count, 4);
        assert_eq!(report.next_offset, 18);
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
        assert_eq!(log.append(build_entry(0, 1, b"x")).await.unwrap(), 18);
        log.close().await.unwrap();
    });
}

#[test]
fn stale_files_in_the_directory_are_ignored() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 4);
    std::fs::write(
        dir.path().join("00000000000000000006.index.tmp"),
        b"half written",
    )
    .unwrap();
    std::fs::write(dir.path().join("notes.txt"), b"x").unwrap();
    block_on(async {
        let (log, report) = open(dir.path(), small_segments()).await;
        assert_eq!(report.entry_count, 4);
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
    });
}

#[test]
fn open_creates_nested_directories() {
    let dir = tempfile::tempdir().unwrap();
    let nested = dir.path().join("partitions").join("1").join("2").join("3");
    block_on(async {
        let (log, _) = open(&nested, always()).await;
        assert_eq!(log.append(build_entry(0, 1, b"x")).await.unwrap(), 0);
        log.close().await.unwrap();
    });
    assert!(segment(&nested, 0).exists());
}

#[test]
fn open_rejects_out_of_range_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    for segment_size_max in [0, storage::limits::SEGMENT_SIZE_MAX_LIMIT + 1] {
        let error = block_on(PartitionLog::open(
            dir.path(),
            config(FsyncPolicy::Always, segment_size_max),
        ))
        .unwrap_err();
        assert!(matches!(error, LogError::InvalidConfig(_)), "{error}");
    }
}

#[test]
fn header_fields_are_stored_little_endian() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        append_entries(&log, 1, 1, 3).await;
        let entry = build_entry(0x0102_0304, 7, b"abc");
        assert_eq!(log.append(entry).await.unwrap(), 1);
        log.close().await.unwrap();
    });
    let bytes = std::fs::read(segment(dir.path(), 0)).unwrap();
    let second = &bytes[67..];
    assert_eq!(&second[0..8], &1u64.to_le_bytes());
    let header = EntryHeader::decode(second).unwrap();
    assert_eq!(header.base_timestamp_us, 0x0102_0304);
    assert_eq!(header.message_count, 7);
    assert_eq!(header.length, 7 * 32 + 3);
}

/// Yields to the runtime once, letting the writer task make progress.
async fn yield_now() {
    let mut yielded = false;
    std::future::poll_fn(|context| {
        if yielded {
            std::task::Poll::Ready(())
        } else {
            yielded = true;
            context.waker().wake_by_ref();
            std::task::Poll::Pending
        }
    })
    .await;
}

#[test]
fn reads_never_see_unacknowledged_entries() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        let first = append_entries(&log, 1, 1, 50).await;
        let acked = Rc::new(std::cell::Cell::new(false));
        let second = log.append(build_entry(0, 1, &payload(1, 50)));
        let acked_setter = Rc::clone(&acked);
        compio::runtime::spawn(async move {
            assert_eq!(second.await.unwrap(), 1);
            acked_setter.set(true);
        })
        .detach();
        // Whenever the second entry is visible, it has been fsynced (the first append's fsync is
        // number 1) and acknowledged.
        let mut polls = 0;
        while !acked.get() {
            let visible = !log.read(1, u32::MAX, usize::MAX).await.unwrap().is_empty();
            if visible {
                assert!(log.fsync_count() >= 2, "visible before its fsync");
                assert_eq!(log.acked_offset(), 2);
            }
            assert_eq!(log.read(0, 1, usize::MAX).await.unwrap(), first.concat());
            polls += 1;
            assert!(polls < 100_000, "the append never completed");
            yield_now().await;
        }
        assert_eq!(log.acked_offset(), 2);
        assert_eq!(log.read(1, u32::MAX, usize::MAX).await.unwrap().len(), 114);
    });
}

#[test]
fn issue7_4_read_across_a_corrupt_entry_returns_the_entries_before_it() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 10);
    let path = segment(dir.path(), 6);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1096 + 500] ^= 0x04; // payload of the second entry of segment 6 (offsets 8..10)
    std::fs::write(&path, &bytes).unwrap();

    block_on(async {
        let (log, _) = open(dir.path(), small_segments()).await;
        // From offset 2: entries 2, 4 (segment 0) and 6 (segment 6), then the damaged one.
        let read = log.read(2, u32::MAX, usize::MAX).await.unwrap();
        assert_eq!(read, [&written[1][..], &written[2], &written[3]].concat());
        // A read that starts at the damaged entry gets the error, naming file and byte.
        match log.read(8, u32::MAX, usize::MAX).await {
            Err(LogError::Corrupt {
                path: named,
                position: 1096,
                reason,
            }) => {
                assert_eq!(named, path);
                assert!(reason.starts_with("payload checksum"), "{reason}");
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        // Past it, reads work again.
        let after = log.read(10, 2, usize::MAX).await.unwrap();
        assert_eq!(after, written[5]);
    });
}

#[test]
fn issue7_4_read_beyond_the_next_offset_is_out_of_range() {
    let dir = tempfile::tempdir().unwrap();
    rolled_log(dir.path(), 10);
    block_on(async {
        let (log, _) = open(dir.path(), small_segments()).await;
        assert_eq!(log.next_offset(), 20);
        assert_eq!(log.first_offset(), 0);
        assert!(log.read(20, 1, usize::MAX).await.unwrap().is_empty());
        for offset in [21, u64::MAX] {
            match log.read(offset, 1, usize::MAX).await {
                Err(error @ LogError::OffsetOutOfRange { .. }) => assert_eq!(
                    error.to_string(),
                    format!("offset {offset} is beyond the next offset 20")
                ),
                other => panic!("expected OffsetOutOfRange, got {other:?}"),
            }
        }
    });
}

/// Ten 1-message entries of 37 bytes of payload (101-byte entries) in the active segment, with
/// `damage` applied to the bytes of entry 3 (at byte 303); returns the stored entries and the
/// segment bytes after the damage.
fn ten_entries_with_damaged_entry_3(
    dir: &Path,
    damage: impl FnOnce(&mut [u8]),
) -> (Vec<Vec<u8>>, Vec<u8>) {
    let written = block_on(async {
        let (log, _) = open(dir, always()).await;
        let written = append_entries(&log, 10, 1, 37).await;
        log.close().await.unwrap();
        written
    });
    assert!(written.iter().all(|entry| entry.len() == 101));
    let path = segment(dir, 0);
    let mut bytes = std::fs::read(&path).unwrap();
    damage(&mut bytes[303..404]);
    std::fs::write(&path, &bytes).unwrap();
    (written, bytes)
}

/// Opens after damage to entry 3 of ten and checks that entries 0..3 are kept and the bytes
/// from entry 3 on (offsets 3..=9, acknowledged under fsync always) are quarantined byte for
/// byte, then that a second open changes nothing.
fn check_entry_3_quarantined(dir: &Path, written: &[Vec<u8>], damaged_bytes: &[u8]) {
    let quarantine_path = dir.join("00000000000000000000.log.damaged-at-303");
    block_on(async {
        let (log, report) = open(dir, always()).await;
        assert_eq!(
            report,
            RecoveryReport {
                segment_count: 1,
                entry_count: 3,
                next_offset: 3,
                truncated_bytes: 707,
                direct_padding_bytes: 0,
                scanned_segment_count: 1,
                producer_batches: Vec::new(),
                quarantined: Some(Quarantine {
                    segment: segment(dir, 0),
                    position: 303,
                    path: quarantine_path.clone(),
                    size_bytes: 707,
                    first_offset: 3,
                    last_offset: 9,
                    // Entries 4..=9's payloads (69 bytes each), nothing else.
                    resync_charged_bytes: 414,
                }),
            }
        );
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written[..3].concat()
        );
        log.close().await.unwrap();
    });
    assert_eq!(
        std::fs::read(&quarantine_path).unwrap(),
        damaged_bytes[303..]
    );
    block_on(async {
        let (_log, report) = open(dir, always()).await;
        assert_eq!((report.entry_count, report.next_offset), (3, 3));
        assert_eq!((report.truncated_bytes, report.quarantined), (0, None));
    });
    assert_eq!(
        quarantine_files(dir),
        vec!["00000000000000000000.log.damaged-at-303".to_owned()]
    );
}

#[test]
fn issue7_1_flipped_base_offset_of_an_interior_entry_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged) = ten_entries_with_damaged_entry_3(dir.path(), |entry| entry[0] ^= 0x40);
    check_entry_3_quarantined(dir.path(), &written, &damaged);
}

#[test]
fn issue7_1_flipped_length_of_an_interior_entry_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged) =
        ten_entries_with_damaged_entry_3(dir.path(), |entry| entry[20] ^= 0x01);
    check_entry_3_quarantined(dir.path(), &written, &damaged);
}

#[test]
fn issue7_1_flipped_message_count_of_an_interior_entry_is_quarantined_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    // message_count 1 -> 3: the payload checksum still matches, the message section does not.
    let (written, damaged) =
        ten_entries_with_damaged_entry_3(dir.path(), |entry| entry[16] ^= 0x02);
    check_entry_3_quarantined(dir.path(), &written, &damaged);
}

/// The header still passes the rules (6 messages fit the offset space and the entry lies whole
/// in the file), so the entry is complete and only its message section fails: kept, with the
/// offsets its damaged header claims (8..=13).
#[test]
fn issue7_1_flipped_message_count_of_the_complete_last_entry_is_quarantined() {
    let dir = tempfile::tempdir().unwrap();
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        let last_start = bytes.len() - 196;
        bytes[last_start + 16] ^= 0x04; // 2 -> 6 messages
        std::fs::write(path, bytes).unwrap();
    });
    check_last_entry_quarantined(dir.path(), &written, 13);
}

#[test]
fn issue7_1_a_read_refuses_an_entry_whose_messages_differ_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    let written = rolled_log(dir.path(), 10);
    // The second entry of closed segment 6 (offsets 8..10), whose index open uses: 2 -> 3
    // messages in its header, which no checksum covers.
    let path = segment(dir.path(), 6);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[1096 + 16] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    block_on(async {
        let (log, _) = open(dir.path(), small_segments()).await;
        assert_eq!(log.read(6, 2, usize::MAX).await.unwrap(), written[3]);
        match log.read(8, u32::MAX, usize::MAX).await {
            Err(LogError::Corrupt {
                path: named,
                position: 1096,
                reason,
            }) => {
                assert_eq!(named, path);
                assert_eq!(
                    reason,
                    "header (offset 8, 3 messages, 1096 bytes) differs from the index (offset 8, \
                     2 messages, 1096 bytes) (the index puts offsets 8-9 in this entry; a poll \
                     from offset 10 reads past it)"
                );
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
    });
    // Without the index, open rescans the closed segment and refuses at that entry.
    std::fs::remove_file(index_file(dir.path(), 6)).unwrap();
    let error = block_on(PartitionLog::open(dir.path(), small_segments())).unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "{}: corrupt entry at byte 1096: in a closed segment: header declares 3 messages but \
             the payload holds 2",
            path.display()
        )
    );
}

#[test]
fn issue7_2_an_identical_quarantine_copy_from_an_interrupted_open_is_reused() {
    let dir = tempfile::tempdir().unwrap();
    let (written, damaged) =
        ten_entries_with_damaged_entry_3(dir.path(), |entry| entry[40] ^= 0x08);
    // An earlier open copied the tail, then crashed before truncating the segment.
    let earlier = dir.path().join("00000000000000000000.log.damaged-at-303");
    std::fs::write(&earlier, &damaged[303..]).unwrap();
    check_entry_3_quarantined(dir.path(), &written, &damaged);
}

#[test]
fn issue7_2_a_different_file_under_the_quarantine_name_is_kept_and_the_copy_goes_beside_it() {
    let dir = tempfile::tempdir().unwrap();
    let (_written, damaged) =
        ten_entries_with_damaged_entry_3(dir.path(), |entry| entry[40] ^= 0x08);
    // Same size, one byte different: not a copy of this tail.
    let mut other = damaged[303..].to_vec();
    other[500] ^= 0x01;
    let earlier = dir.path().join("00000000000000000000.log.damaged-at-303");
    std::fs::write(&earlier, &other).unwrap();
    block_on(async {
        let (_log, report) = open(dir.path(), always()).await;
        assert_eq!(
            report.quarantined.unwrap().path,
            dir.path().join("00000000000000000000.log.damaged-at-303.1")
        );
    });
    assert_eq!(std::fs::read(&earlier).unwrap(), other);
    assert_eq!(
        std::fs::read(dir.path().join("00000000000000000000.log.damaged-at-303.1")).unwrap(),
        damaged[303..]
    );
}

#[test]
fn issue7_1_resync_ignores_an_entry_whose_messages_differ_from_its_header() {
    let dir = tempfile::tempdir().unwrap();
    // After the 5 entries (offsets 0..10): one junk byte, then an entry at offset 10 whose
    // checksum matches but whose payload holds 1 message where its header declares 2. The
    // resync finds no valid entry, so this is a torn tail, not interior damage.
    let mut tail = vec![0xEEu8];
    let mut fake =
        storage::entry::build_entry_raw(0, 2, &storage::entry::message_section(1, b"one message"));
    fake[0..8].copy_from_slice(&10u64.to_le_bytes());
    tail.extend_from_slice(&fake);
    let tail_size = tail.len() as u64;
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(&tail);
        std::fs::write(path, bytes).unwrap();
    });
    check_recovered(dir.path(), &written, tail_size);
}

#[test]
fn issue7_1_resync_finds_a_valid_entry_after_junk_as_interior_damage() {
    let dir = tempfile::tempdir().unwrap();
    // The same junk byte, then a valid entry at offset 10: interior damage, quarantined.
    let mut tail = vec![0xEEu8];
    let mut real = build_entry(0, 2, b"two messages");
    real[0..8].copy_from_slice(&10u64.to_le_bytes());
    tail.extend_from_slice(&real);
    let written = log_with_damaged_tail(dir.path(), |path| {
        let mut bytes = std::fs::read(path).unwrap();
        bytes.extend_from_slice(&tail);
        std::fs::write(path, bytes).unwrap();
    });
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        assert_eq!(
            report.quarantined,
            Some(Quarantine {
                segment: segment(dir.path(), 0),
                position: 5 * 196,
                path: dir.path().join("00000000000000000000.log.damaged-at-980"),
                size_bytes: tail.len() as u64,
                first_offset: 10,
                last_offset: 11,
                resync_charged_bytes: 76,
            })
        );
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            written.concat()
        );
    });
}

/// A message content of `blocks` 64-byte blocks, each a fake entry header (offset 32: at least
/// the offset the resync asks for, 3, and inside its bound `3 + (bytes after the damage) / 32`
/// from about 1 KiB after the damage on; `blocks - k` messages) whose length steps exactly to
/// the end of the content, with message headers that frame it: every block passes the header
/// rules and the framing, so an unbounded resync would checksum `(blocks - k) * 64` bytes at
/// block `k`, quadratic in the content.
fn crafted_fake_header_chain(blocks: u64) -> Vec<u8> {
    let mut content = vec![0u8; (blocks * 64) as usize];
    for k in 0..blocks {
        let at = (k * 64) as usize;
        content[at..at + 8].copy_from_slice(&32u64.to_le_bytes());
        content[at + 16..at + 20].copy_from_slice(&((blocks - k) as u32).to_le_bytes());
        content[at + 20..at + 24].copy_from_slice(&(((blocks - k) * 64 - 32) as u32).to_le_bytes());
        content[at + 24..at + 32].copy_from_slice(&0x5555_5555_5555_5554u64.to_le_bytes());
    }
    content
}

/// Entries 0..3 (101 bytes each), entry 3 holding a 1 MiB crafted chain of fake headers, and
/// entries 4 and 5 after it; entry 3's `length` then gets its top bit (beyond `ENTRY_SIZE_MAX`,
/// so its header breaks the rules and the entry is not complete). The resync must stop within
/// its budget (3 bytes charged per byte after the damage) and, having no verdict, keep the bytes:
/// a quarantine reporting only the damaged entry's first offset.
#[test]
fn issue7_1_resync_after_damage_is_bounded_on_a_crafted_fake_header_chain() {
    let dir = tempfile::tempdir().unwrap();
    let blocks = 16_384; // 1 MiB
    block_on(async {
        let (log, _) = open(dir.path(), always()).await;
        append_entries(&log, 3, 1, 37).await;
        let crafted = build_entry(3, 1, &crafted_fake_header_chain(blocks));
        assert_eq!(log.append(crafted).await.unwrap(), 3);
        append_entries(&log, 2, 1, 37).await;
        log.close().await.unwrap();
    });
    let path = segment(dir.path(), 0);
    let mut bytes = std::fs::read(&path).unwrap();
    let tail_bytes = bytes.len() as u64 - 303;
    assert_eq!(tail_bytes, 32 + 32 + blocks * 64 + 2 * 101);
    bytes[303 + 23] ^= 0x80; // length += 2^31
    std::fs::write(&path, &bytes).unwrap();
    block_on(async {
        let (log, report) = open(dir.path(), always()).await;
        let quarantined = report.quarantined.unwrap();
        assert_eq!(
            (quarantined.position, quarantined.size_bytes),
            (303, tail_bytes)
        );
        assert_eq!((quarantined.first_offset, quarantined.last_offset), (3, 3));
        // The search stopped on its budget: at most 3x the tail charged, and more than 2x (the
        // candidate refused fits in the tail, so it would have passed 3x) instead of
        // checksumming ~16 Ki fake candidates (8 GiB). `last_offset` 3: nothing after the damage
        // was verified (entries 4 and 5 would have made it 5).
        let charged = quarantined.resync_charged_bytes;
        assert!(
            charged <= 3 * tail_bytes && charged > 2 * tail_bytes,
            "{charged} bytes charged for a tail of {tail_bytes}"
        );
        assert_eq!(
            (report.truncated_bytes, report.next_offset),
            (tail_bytes, 3)
        );
        assert_eq!(log.next_offset(), 3);
    });
    assert_eq!(
        std::fs::read(dir.path().join("00000000000000000000.log.damaged-at-303")).unwrap(),
        bytes[303..]
    );
}
