//! Issue 7 item 5: the producer-state snapshot `{base_offset:020}.producers` written at every
//! segment roll (`storage/FORMAT.md` section 3a). Open loads the active segment's snapshot; a
//! missing or damaged one is rebuilt from the previous segment's snapshot and the stamps after
//! it (or, when none is usable, from the stamps at the end of the previous segment) with a
//! warning naming the file and why, never failing the open; a refused snapshot write rolls back
//! like any write of a roll; at most two snapshots are kept.

use std::fmt::Write as _;
use std::path::Path;
use std::sync::{Arc, Mutex};

use storage::entry::{build_entry_raw, message_section};
use storage::{FaultOp, FsyncPolicy, LogConfig, LogError, PartitionLog, ProducerBatch};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// 100-byte segments: each entry below is 90 bytes, so every entry gets a segment of its own.
const SEGMENT_SIZE_MAX: u64 = 100;

fn config() -> LogConfig {
    LogConfig {
        fsync: FsyncPolicy::Always,
        segment_size_max: SEGMENT_SIZE_MAX,
        write_mode: storage::WriteMode::Buffered,
    }
}

/// A 90-byte entry shaped like a bus batch: one 32-byte message header (bit 0 of bytes 12..16
/// flags a stamp), 10 bytes, then the 16-byte stamp (or 16 more bytes when unstamped).
fn entry(stamp: Option<(u64, u64)>) -> Vec<u8> {
    let mut payload = message_section(1, &[0u8; 10]);
    match stamp {
        Some((producer, sequence)) => {
            payload[12] = 1;
            payload.extend_from_slice(&producer.to_le_bytes());
            payload.extend_from_slice(&sequence.to_le_bytes());
        }
        None => payload = message_section(1, &[0u8; 10 + 16]),
    }
    build_entry_raw(0, 1, &payload)
}

fn batch(producer: u64, sequence: u64, base_offset: u64) -> ProducerBatch {
    ProducerBatch {
        producer,
        sequence,
        message_count: 1,
        base_offset,
    }
}

fn snapshot(dir: &Path, base_offset: u64) -> std::path::PathBuf {
    dir.join(format!("{base_offset:020}.producers"))
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    names.sort();
    names
}

/// Producer 7 in segment 0, producer 8 in segment 1, plain entries in segments 2 and 3, producer
/// 9 in the active segment 4: producers 7 and 8 are known only through the snapshot.
fn write_five_segments(dir: &Path) {
    block_on(async {
        let (log, _) = PartitionLog::open(dir, config()).await.unwrap();
        for stamp in [Some((7, 0)), Some((8, 0)), None, None, Some((9, 5))] {
            log.append(entry(stamp)).await.unwrap();
        }
        log.close().await.unwrap();
    });
}

const ALL_PRODUCERS: [(u64, u64, u64); 3] = [(7, 0, 0), (8, 0, 1), (9, 5, 4)];

fn batches(expected: &[(u64, u64, u64)]) -> Vec<ProducerBatch> {
    expected
        .iter()
        .map(|&(producer, sequence, base_offset)| batch(producer, sequence, base_offset))
        .collect()
}

/// Opens the log with a subscriber that records every warning; returns the reported batches and
/// the warnings, each as its message followed by its fields.
fn reopen_capturing_warnings(dir: &Path) -> (Vec<ProducerBatch>, Vec<String>) {
    let warnings = Arc::new(Mutex::new(Vec::new()));
    let subscriber = WarningRecorder {
        warnings: Arc::clone(&warnings),
    };
    let batches = tracing::subscriber::with_default(subscriber, || {
        block_on(async {
            let (log, report) = PartitionLog::open(dir, config()).await.unwrap();
            log.close().await.unwrap();
            report.producer_batches
        })
    });
    let warnings = warnings.lock().unwrap().clone();
    (batches, warnings)
}

#[test]
fn issue7_5_snapshot_round_trip_through_rolls_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    write_five_segments(dir.path());
    // Only the snapshots of the active segment and the one before it are kept.
    assert_eq!(
        file_names(dir.path())
            .into_iter()
            .filter(|name| name.ends_with(".producers"))
            .collect::<Vec<_>>(),
        [
            "00000000000000000003.producers",
            "00000000000000000004.producers"
        ]
    );
    // Segment 4's snapshot: header (magic, version 1, base offset 4, 2 producers), then
    // producer 7 (one batch at offset 0) and producer 8 (one at offset 1), least recently
    // appended first, then the 8-byte trailer: 32 + 2 x (16 + 24) + 8 bytes.
    let bytes = std::fs::read(snapshot(dir.path(), 4)).unwrap();
    assert_eq!(bytes.len(), 32 + 2 * (16 + 24) + 8);
    assert_eq!(&bytes[0..8], b"SLPRODS\0");
    assert_eq!(&bytes[8..16], &[1, 0, 0, 0, 0, 0, 0, 0]);
    assert_eq!(&bytes[16..24], &4u64.to_le_bytes());
    assert_eq!(&bytes[24..28], &2u32.to_le_bytes());
    assert_eq!(&bytes[32..40], &7u64.to_le_bytes());
    assert_eq!(&bytes[72..80], &8u64.to_le_bytes());
    assert_eq!(
        &bytes[96..104],
        &1u64.to_le_bytes(),
        "producer 8's batch offset"
    );
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&ALL_PRODUCERS));
    assert_eq!(warnings, Vec::<String>::new());
}

#[test]
fn issue7_5_corrupt_snapshot_falls_back_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    write_five_segments(dir.path());
    let path = snapshot(dir.path(), 4);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[40] ^= 0x01;
    std::fs::write(&path, &bytes).unwrap();
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    // Segment 3's snapshot (producers 7 and 8) plus the stamps of segment 3 (a plain entry) and
    // the active segment: the same state as the damaged snapshot held.
    assert_eq!(batches_reported, batches(&ALL_PRODUCERS));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].starts_with(
            "producer-state snapshot not usable; recovering idempotent producers from an older \
             snapshot and the segments after it"
        ),
        "{warnings:?}"
    );
    assert!(
        warnings[0].contains(&format!("snapshot={}", path.display())),
        "{warnings:?}"
    );
    assert!(
        warnings[0].contains("checksum"),
        "the reason names the failed check: {warnings:?}"
    );
}

#[test]
fn issue7_5_crash_between_segment_create_and_snapshot_write_falls_back_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    write_five_segments(dir.path());
    // What a roll that created segment 4 without its snapshot would leave (the writer writes the
    // snapshot first, so this is also a log written before snapshots existed).
    std::fs::remove_file(snapshot(dir.path(), 4)).unwrap();
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&ALL_PRODUCERS));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
    assert!(
        warnings[0].contains(&format!(
            "snapshot={} reason=the file is missing",
            snapshot(dir.path(), 4).display()
        )),
        "{warnings:?}"
    );
    // Open kept the snapshot it recovered from, so a second open without a roll between
    // recovers the same state.
    assert!(snapshot(dir.path(), 3).exists());
    let (batches_reported, _) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&ALL_PRODUCERS));
    // The next roll writes a snapshot again, so the reopen after it has no warning.
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config()).await.unwrap();
        assert_eq!(log.append(entry(Some((9, 6)))).await.unwrap(), 5);
        log.close().await.unwrap();
    });
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(
        batches_reported,
        batches(&[(7, 0, 0), (8, 0, 1), (9, 5, 4), (9, 6, 5)])
    );
    assert_eq!(warnings, Vec::<String>::new());
}

#[test]
fn issue7_adv2_no_usable_snapshot_falls_back_to_the_end_of_the_previous_segment() {
    let dir = tempfile::tempdir().unwrap();
    write_five_segments(dir.path());
    // The active segment's snapshot and the previous one's both gone (segment 2's was deleted
    // by the roll to 4): only the stamps at the end of segment 3 and in segment 4 remain.
    std::fs::remove_file(snapshot(dir.path(), 4)).unwrap();
    std::fs::write(snapshot(dir.path(), 3), b"short").unwrap();
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&[(9, 5, 4)]));
    assert_eq!(warnings.len(), 4, "{warnings:?}");
    assert!(
        warnings[0].contains("reason=the file is missing"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].starts_with("older producer-state snapshot not usable either"),
        "{warnings:?}"
    );
    assert!(
        warnings[1].contains(&format!("snapshot={}", snapshot(dir.path(), 3).display())),
        "{warnings:?}"
    );
    assert!(
        warnings[2].contains(&format!(
            "snapshot={} reason=the file is missing",
            snapshot(dir.path(), 2).display()
        )),
        "{warnings:?}"
    );
    assert!(
        warnings[3].starts_with("no producer-state snapshot usable"),
        "{warnings:?}"
    );
}

#[test]
fn issue7_adv2_missing_snapshot_after_the_first_segment_rescans_it_exactly() {
    let dir = tempfile::tempdir().unwrap();
    // Producer 7 in segment 0, producer 8 in the active segment 1; segment 1's snapshot lost.
    // The first segment starts with no producers, so its stamps give the exact state.
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config()).await.unwrap();
        log.append(entry(Some((7, 0)))).await.unwrap();
        log.append(entry(Some((8, 0)))).await.unwrap();
        log.close().await.unwrap();
    });
    std::fs::remove_file(snapshot(dir.path(), 1)).unwrap();
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&[(7, 0, 0), (8, 0, 1)]));
    assert_eq!(warnings.len(), 1, "{warnings:?}");
}

#[test]
fn issue7_5_crash_between_snapshot_write_and_segment_create_is_ignored() {
    let dir = tempfile::tempdir().unwrap();
    write_five_segments(dir.path());
    // A roll to offset 5 wrote its snapshot (and a roll to 6 was cut inside its write), then
    // the process died before creating the segments.
    std::fs::copy(snapshot(dir.path(), 4), snapshot(dir.path(), 5)).unwrap();
    std::fs::write(
        dir.path().join("00000000000000000006.producers.tmp"),
        b"partial",
    )
    .unwrap();
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&ALL_PRODUCERS));
    assert_eq!(warnings, Vec::<String>::new());
    assert!(
        !file_names(dir.path())
            .iter()
            .any(|name| name.starts_with("00000000000000000005.producers")
                || name.starts_with("00000000000000000006.producers")),
        "open deletes snapshots of segments that do not exist and leftovers"
    );
}

#[test]
fn issue7_5_enospc_at_the_snapshot_write_rolls_back() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config()).await.unwrap();
        assert_eq!(log.append(entry(Some((7, 0)))).await.unwrap(), 0);
        log.fault_injector()
            .fail(FaultOp::ProducerSnapshotWrite, 0, 1, libc::ENOSPC);
        let refused = log.append(entry(Some((7, 1)))).await;
        match &refused {
            Err(LogError::StorageFull { path, op, .. }) => {
                assert_eq!(path, &snapshot(dir.path(), 1));
                assert_eq!(*op, "write producer-state snapshot");
            }
            other => panic!("expected StorageFull, got {other:?}"),
        }
        assert_eq!(
            file_names(dir.path()),
            ["00000000000000000000.log"],
            "the roll's index file is gone, no snapshot or segment was created"
        );
        assert_eq!(log.next_offset(), 1);
        assert_eq!(log.append(entry(Some((7, 1)))).await.unwrap(), 1);
        log.close().await.unwrap();
    });
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&[(7, 0, 0), (7, 1, 1)]));
    assert_eq!(warnings, Vec::<String>::new());
}

#[test]
fn issue7_5_enospc_after_the_snapshot_write_deletes_it() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config()).await.unwrap();
        assert_eq!(log.append(entry(Some((7, 0)))).await.unwrap(), 0);
        // One group of two: the first rolls to segment 1 (its snapshot holds producer 7's batch
        // at 0), the second rolls to segment 2 (its snapshot also holds the unacknowledged
        // batch at 1), then the entry write into segment 2 is refused.
        log.fault_injector()
            .fail(FaultOp::Write, 1, 1, libc::ENOSPC);
        let first = log.append(entry(Some((7, 1))));
        let second = log.append(entry(Some((7, 2))));
        for result in [first.await, second.await] {
            assert!(
                matches!(result, Err(LogError::StorageFull { .. })),
                "{result:?}"
            );
        }
        // Segment 1 starts at the acknowledged end, so it stays (empty) as the active segment
        // with its snapshot; segment 2 and its snapshot, which held the cut batch, are gone.
        assert_eq!(
            file_names(dir.path()),
            [
                "00000000000000000000.index",
                "00000000000000000000.log",
                "00000000000000000001.log",
                "00000000000000000001.producers"
            ],
        );
        log.close().await.unwrap();
    });
    let (batches_reported, warnings) = reopen_capturing_warnings(dir.path());
    assert_eq!(batches_reported, batches(&[(7, 0, 0)]));
    assert_eq!(warnings, Vec::<String>::new());
}

/// Records each WARN event as "message field=value ..." (fields in the order logged).
struct WarningRecorder {
    warnings: Arc<Mutex<Vec<String>>>,
}

struct LineVisitor(String);

impl tracing::field::Visit for LineVisitor {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            self.0.insert_str(0, &format!("{value:?}"));
        } else {
            write!(self.0, " {}={value:?}", field.name()).unwrap();
        }
    }

    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.record_debug(field, &format_args!("{value}"));
    }
}

impl tracing::Subscriber for WarningRecorder {
    fn enabled(&self, metadata: &tracing::Metadata<'_>) -> bool {
        *metadata.level() <= tracing::Level::WARN
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        let mut visitor = LineVisitor(String::new());
        event.record(&mut visitor);
        self.warnings.lock().unwrap().push(visitor.0);
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}
