//! Integration tests of the metadata journal: append and replay, torn tails, interior damage, op
//! gaps, segment rolls and release. Each test runs on its own compio runtime in a temp directory
//! and damages files with std fs the way a crash or a bad disk would.

use std::path::{Path, PathBuf};

use proptest::prelude::*;
use storage::journal::{RestartStep, segment_path};
use storage::{
    JOURNAL_HEADER_SIZE, Journal, JournalConfig, JournalError, JournalRecovery, Prepare,
};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// A prepare for `op` with a body of `size` bytes that differs per op.
fn prepare(op: u64, size: usize) -> Prepare {
    Prepare {
        op,
        view: (op / 3) as u32,
        commit: op - 1,
        body: (0..size)
            .map(|index| (op as usize * 31 + index * 7) as u8)
            .collect(),
    }
}

fn small_segments(segment_size_max: u64) -> JournalConfig {
    JournalConfig { segment_size_max }
}

async fn open(dir: &Path, config: JournalConfig) -> (Journal, JournalRecovery) {
    Journal::open_with_config(dir, config).await.unwrap()
}

/// Appends ops `last_op + 1 ..= last_op + count` with bodies of `size` bytes; returns them.
async fn append_prepares(journal: &mut Journal, count: u64, size: usize) -> Vec<Prepare> {
    let mut appended = Vec::new();
    for _ in 0..count {
        let prepare = prepare(journal.last_op() + 1, size);
        journal.append(&prepare).await.unwrap();
        appended.push(prepare);
    }
    appended
}

fn wal_files(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn record_size(body_size: usize) -> u64 {
    (JOURNAL_HEADER_SIZE + body_size) as u64
}

fn expect_corrupt(
    result: Result<(Journal, JournalRecovery), JournalError>,
) -> (PathBuf, u64, String) {
    match result {
        Err(JournalError::Corrupt {
            path,
            position,
            reason,
        }) => (path, position, reason),
        Err(error) => panic!("expected Corrupt, got {error}"),
        Ok(_) => panic!("expected Corrupt, the journal opened"),
    }
}

#[test]
fn new_journal_starts_at_op_1_with_one_empty_segment() {
    let dir = tempfile::tempdir().unwrap();
    let journal_dir = dir.path().join("metadata").join("journal");
    block_on(async {
        let (journal, recovery) = Journal::open(&journal_dir).await.unwrap();
        assert_eq!(
            recovery,
            JournalRecovery {
                prepares: Vec::new(),
                record_positions: Vec::new(),
                truncated_bytes: 0,
                damaged_records: Vec::new(),
                segment_count: 1
            }
        );
        assert_eq!((journal.first_op(), journal.last_op()), (1, 0));
        assert_eq!(journal.segment_count(), 1);
    });
    assert_eq!(wal_files(&journal_dir), vec!["00000000000000000001.wal"]);
    assert_eq!(
        std::fs::metadata(segment_path(&journal_dir, 1))
            .unwrap()
            .len(),
        0
    );
}

#[test]
fn append_and_reopen_replays_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let expected: Vec<Prepare> = (1..=20)
        .map(|op| prepare(op, (op as usize * 37) % 300))
        .collect();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        for prepare in &expected {
            journal.append(prepare).await.unwrap();
            assert_eq!(journal.last_op(), prepare.op);
        }
    });
    let total: u64 = expected
        .iter()
        .map(|prepare| record_size(prepare.body.len()))
        .sum();
    assert_eq!(
        std::fs::metadata(segment_path(dir.path(), 1))
            .unwrap()
            .len(),
        total
    );
    block_on(async {
        let (mut journal, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(recovery.prepares, expected);
        // Each record's place: segment 1, at the sum of the sizes of the records before it.
        let mut position = 0;
        let positions: Vec<(u64, u64)> = expected
            .iter()
            .map(|prepare| {
                let at = position;
                position += record_size(prepare.body.len());
                (1, at)
            })
            .collect();
        assert_eq!(recovery.record_positions, positions);
        assert_eq!(recovery.truncated_bytes, 0);
        assert_eq!(recovery.segment_count, 1);
        assert_eq!((journal.first_op(), journal.last_op()), (1, 20));
        journal.append(&prepare(21, 5)).await.unwrap();
        drop(journal);
        let (_, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(recovery.prepares.len(), 21);
        assert_eq!(recovery.prepares[20], prepare(21, 5));
    });
}

#[test]
fn record_bytes_on_disk_match_the_format() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        journal
            .append(&Prepare {
                op: 1,
                view: 7,
                commit: 0,
                body: b"hello".to_vec(),
            })
            .await
            .unwrap();
    });
    let raw = std::fs::read(segment_path(dir.path(), 1)).unwrap();
    assert_eq!(raw.len(), 64 + 5);
    assert_eq!(
        u128::from_le_bytes(raw[0..16].try_into().unwrap()),
        twox_hash::XxHash3_128::oneshot(&raw[16..64])
    );
    assert_eq!(
        u128::from_le_bytes(raw[16..32].try_into().unwrap()),
        twox_hash::XxHash3_128::oneshot(b"hello")
    );
    assert_eq!(&raw[32..40], &1u64.to_le_bytes());
    assert_eq!(&raw[40..44], &7u32.to_le_bytes());
    assert_eq!(&raw[44..48], &5u32.to_le_bytes());
    assert_eq!(&raw[48..56], &0u64.to_le_bytes());
    assert_eq!(&raw[56..64], &[0u8; 8]);
    assert_eq!(&raw[64..], b"hello");
}

/// Writes ops 1..=5 (bodies of 100 bytes), applies `damage` to the single segment, reopens, and
/// checks that ops 1..=4 survive, `truncated_bytes` is what `damage` left after record 4, and the
/// next append is op 5 and survives a further reopen.
fn check_torn_last_record(damage: impl FnOnce(&mut Vec<u8>)) {
    let dir = tempfile::tempdir().unwrap();
    let expected = block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        append_prepares(&mut journal, 5, 100).await
    });
    let path = segment_path(dir.path(), 1);
    let mut raw = std::fs::read(&path).unwrap();
    damage(&mut raw);
    std::fs::write(&path, &raw).unwrap();
    let kept_bytes = 4 * record_size(100);
    block_on(async {
        let (mut journal, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(recovery.prepares, expected[..4]);
        assert_eq!(recovery.truncated_bytes, raw.len() as u64 - kept_bytes);
        assert_eq!(journal.last_op(), 4);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), kept_bytes);
        let replacement = prepare(5, 42);
        journal.append(&replacement).await.unwrap();
        drop(journal);
        let (journal, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(recovery.truncated_bytes, 0);
        assert_eq!(recovery.prepares[..4], expected[..4]);
        assert_eq!(recovery.prepares[4], replacement);
        assert_eq!(journal.last_op(), 5);
    });
}

#[test]
fn torn_tail_partial_header_is_truncated() {
    let record_4_end = 4 * record_size(100) as usize;
    check_torn_last_record(|raw| raw.truncate(record_4_end + 30));
}

#[test]
fn torn_tail_partial_body_is_truncated() {
    let record_4_end = 4 * record_size(100) as usize;
    check_torn_last_record(|raw| raw.truncate(record_4_end + 64 + 99));
}

#[test]
fn flipped_body_byte_in_the_last_record_is_a_torn_tail() {
    check_torn_last_record(|raw| {
        let last = raw.len() - 1;
        raw[last] ^= 0x40;
    });
}

#[test]
fn flipped_header_byte_in_the_last_record_is_a_torn_tail() {
    let record_4_end = 4 * record_size(100) as usize;
    check_torn_last_record(|raw| raw[record_4_end + 33] ^= 0x01);
}

#[test]
fn zeros_after_the_last_complete_record_are_a_torn_tail() {
    let record_4_end = 4 * record_size(100) as usize;
    check_torn_last_record(|raw| {
        raw.truncate(record_4_end);
        raw.extend_from_slice(&[0u8; 500]);
    });
}

#[test]
fn flipped_byte_before_the_tail_of_the_last_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        append_prepares(&mut journal, 5, 100).await;
    });
    let path = segment_path(dir.path(), 1);
    let mut raw = std::fs::read(&path).unwrap();
    let record_3_start = 2 * record_size(100);
    // A body byte of op 3: its header still names the right size, but the body checksum fails
    // and op 4 follows intact.
    raw[record_3_start as usize + 64 + 10] ^= 0x01;
    std::fs::write(&path, &raw).unwrap();
    let (named, position, reason) = expect_corrupt(block_on(Journal::open(dir.path())));
    assert_eq!(named, path);
    assert_eq!(position, record_3_start);
    assert!(reason.starts_with("body checksum"), "{reason}");
    assert!(
        reason.contains(&format!(
            "a valid record for op 4 follows at byte {}",
            3 * record_size(100)
        )),
        "{reason}"
    );
    // Nothing was truncated: the damage is left for an operator or a repair.
    assert_eq!(std::fs::read(&path).unwrap(), raw);

    // A damaged header (size unknown) is found the same way, by searching for a later record.
    raw[record_3_start as usize + 64 + 10] ^= 0x01;
    raw[record_3_start as usize + 45] ^= 0x80;
    std::fs::write(&path, &raw).unwrap();
    let (_, position, reason) = expect_corrupt(block_on(Journal::open(dir.path())));
    assert_eq!(position, record_3_start);
    assert!(reason.starts_with("header checksum"), "{reason}");
    assert!(
        reason.contains("a valid record for op 4 follows"),
        "{reason}"
    );
}

#[test]
fn segment_roll_with_a_small_segment_size() {
    let dir = tempfile::tempdir().unwrap();
    // 3 records of 64 + 36 = 100 bytes fit in 300; the 4th rolls.
    let config = small_segments(300);
    let expected = block_on(async {
        let (mut journal, _) = open(dir.path(), config).await;
        let mut expected = append_prepares(&mut journal, 7, 36).await;
        // A record larger than the segment size gets a segment of its own.
        expected.extend(append_prepares(&mut journal, 1, 500).await);
        expected.extend(append_prepares(&mut journal, 1, 36).await);
        assert_eq!(journal.segment_count(), 5);
        assert_eq!((journal.first_op(), journal.last_op()), (1, 9));
        expected
    });
    assert_eq!(
        wal_files(dir.path()),
        vec![
            "00000000000000000001.wal",
            "00000000000000000004.wal",
            "00000000000000000007.wal",
            "00000000000000000008.wal",
            "00000000000000000009.wal",
        ]
    );
    let sizes: Vec<u64> = [1, 4, 7, 8, 9]
        .iter()
        .map(|&first_op| {
            std::fs::metadata(segment_path(dir.path(), first_op))
                .unwrap()
                .len()
        })
        .collect();
    assert_eq!(sizes, vec![300, 300, 100, 564, 100]);
    block_on(async {
        let (journal, recovery) = open(dir.path(), config).await;
        assert_eq!(recovery.prepares, expected);
        assert_eq!(recovery.segment_count, 5);
        assert_eq!(journal.segment_count(), 5);
        assert_eq!(journal.last_op(), 9);
    });
}

#[test]
fn empty_last_segment_left_by_a_crashed_roll_is_used() {
    let dir = tempfile::tempdir().unwrap();
    let expected = block_on(async {
        let (mut journal, _) = open(dir.path(), small_segments(300)).await;
        append_prepares(&mut journal, 3, 36).await
    });
    // The roll for op 4 created its segment, then the process died before writing the record.
    std::fs::write(segment_path(dir.path(), 4), b"").unwrap();
    block_on(async {
        let (mut journal, recovery) = open(dir.path(), small_segments(300)).await;
        assert_eq!(recovery.prepares, expected);
        assert_eq!(recovery.segment_count, 2);
        assert_eq!(journal.last_op(), 3);
        journal.append(&prepare(4, 36)).await.unwrap();
    });
    assert_eq!(
        std::fs::metadata(segment_path(dir.path(), 4))
            .unwrap()
            .len(),
        100
    );
}

#[test]
fn damage_in_a_closed_segment_is_corrupt_naming_file_and_offset() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = open(dir.path(), small_segments(300)).await;
        append_prepares(&mut journal, 8, 36).await;
    });
    // The last record of closed segment 4 (ops 4..=6): a torn write cannot reach a closed
    // segment, so even its final record is damage.
    let path = segment_path(dir.path(), 4);
    let mut raw = std::fs::read(&path).unwrap();
    raw[299] ^= 0x02;
    std::fs::write(&path, &raw).unwrap();
    let error = block_on(Journal::open_with_config(dir.path(), small_segments(300))).unwrap_err();
    let message = error.to_string();
    let JournalError::Corrupt {
        path: named,
        position,
        reason,
    } = error
    else {
        panic!("expected Corrupt, got {message}");
    };
    assert_eq!(named, path);
    assert_eq!(position, 200);
    assert!(reason.starts_with("in a closed segment"), "{reason}");
    assert!(
        message.contains("00000000000000000004.wal: corrupt journal record at byte 200"),
        "{message}"
    );
    // A truncated closed segment is corrupt too (its last record is partial).
    std::fs::write(&path, &raw[..250]).unwrap();
    let (named, position, _) = expect_corrupt(block_on(Journal::open_with_config(
        dir.path(),
        small_segments(300),
    )));
    assert_eq!((named, position), (path, 200));
}

#[test]
fn op_gap_between_segments_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = open(dir.path(), small_segments(300)).await;
        append_prepares(&mut journal, 8, 36).await;
    });
    std::fs::remove_file(segment_path(dir.path(), 4)).unwrap();
    let (named, position, reason) = expect_corrupt(block_on(Journal::open_with_config(
        dir.path(),
        small_segments(300),
    )));
    assert_eq!(named, segment_path(dir.path(), 7));
    assert_eq!(position, 0);
    assert_eq!(
        reason,
        "op gap: the segment starts at op 7 but the previous segment ends before op 4"
    );
}

#[test]
fn wrong_op_inside_a_segment_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = open(dir.path(), small_segments(300)).await;
        append_prepares(&mut journal, 5, 36).await;
    });
    // Segment 4 renamed to 5: its first record carries op 4 where op 5 is expected, and it also
    // leaves a gap after segment 1.
    std::fs::rename(segment_path(dir.path(), 4), segment_path(dir.path(), 5)).unwrap();
    let (named, _, reason) = expect_corrupt(block_on(Journal::open_with_config(
        dir.path(),
        small_segments(300),
    )));
    assert_eq!(named, segment_path(dir.path(), 5));
    assert!(reason.starts_with("op gap"), "{reason}");
    // Only the renamed segment left: its first record carries op 4 where op 5 is expected, and
    // a valid record for op 5 follows it, so this is damage, not a torn tail.
    std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
    let (named, position, reason) = expect_corrupt(block_on(Journal::open_with_config(
        dir.path(),
        small_segments(300),
    )));
    assert_eq!((named, position), (segment_path(dir.path(), 5), 0));
    assert_eq!(
        reason,
        "op 4 where op 5 was expected (a valid record for op 5 follows at byte 100: damage \
         before the tail refuses to boot)"
    );
}

#[test]
fn segment_named_op_0_is_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(segment_path(dir.path(), 0), b"").unwrap();
    let (named, position, reason) = expect_corrupt(block_on(Journal::open(dir.path())));
    assert_eq!((named, position), (segment_path(dir.path(), 0), 0));
    assert!(reason.contains("root prepare"), "{reason}");
}

#[test]
fn release_below_deletes_whole_segments_and_reopen_replays_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    let expected = block_on(async {
        let (mut journal, _) = open(dir.path(), config).await;
        let expected = append_prepares(&mut journal, 11, 36).await;
        // Segments: 1 (1..=3), 4 (4..=6), 7 (7..=9), 10 (10..=11).
        assert_eq!(journal.release_below(1).await.unwrap(), 0);
        assert_eq!(journal.release_below(3).await.unwrap(), 0);
        // Ops 1..=3 are all below 4; segment 4 holds op 4 and stays.
        assert_eq!(journal.release_below(4).await.unwrap(), 1);
        assert_eq!(journal.first_op(), 4);
        // Op 8 lies in segment 7, which stays.
        assert_eq!(journal.release_below(8).await.unwrap(), 1);
        assert_eq!(journal.first_op(), 7);
        assert_eq!(journal.segment_count(), 2);
        expected
    });
    assert_eq!(
        wal_files(dir.path()),
        vec!["00000000000000000007.wal", "00000000000000000010.wal"]
    );
    block_on(async {
        let (mut journal, recovery) = open(dir.path(), config).await;
        assert_eq!(recovery.prepares, expected[6..]);
        assert_eq!((journal.first_op(), journal.last_op()), (7, 11));
        // The active segment is never released, even past the last op.
        assert_eq!(journal.release_below(1000).await.unwrap(), 1);
        assert_eq!(wal_files(dir.path()), vec!["00000000000000000010.wal"]);
        assert_eq!((journal.first_op(), journal.last_op()), (10, 11));
        journal.append(&prepare(12, 36)).await.unwrap();
        drop(journal);
        let (_, recovery) = open(dir.path(), config).await;
        let ops: Vec<u64> = recovery.prepares.iter().map(|prepare| prepare.op).collect();
        assert_eq!(ops, vec![10, 11, 12]);
    });
}

#[test]
fn body_too_large_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        let too_large = prepare(1, storage::limits::JOURNAL_BODY_SIZE_MAX as usize + 1);
        let error = journal.append(&too_large).await.unwrap_err();
        assert!(
            matches!(error, JournalError::BodyTooLarge { size_bytes } if size_bytes == (1 << 20) + 1),
            "{error}"
        );
        assert_eq!(journal.last_op(), 0);
        // Not poisoned: the largest body is accepted.
        let largest = prepare(1, storage::limits::JOURNAL_BODY_SIZE_MAX as usize);
        journal.append(&largest).await.unwrap();
        drop(journal);
        let (_, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(recovery.prepares, vec![largest]);
    });
}

#[test]
#[should_panic(expected = "journal append of op 3 but the last op is 1")]
fn append_out_of_op_order_is_a_bug() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        journal.append(&prepare(1, 1)).await.unwrap();
        let _ = journal.append(&prepare(3, 1)).await;
    });
}

#[test]
fn invalid_config_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    for segment_size_max in [0, storage::limits::JOURNAL_SEGMENT_SIZE_MAX + 1] {
        let error = block_on(Journal::open_with_config(
            dir.path(),
            small_segments(segment_size_max),
        ))
        .unwrap_err();
        assert!(matches!(error, JournalError::InvalidConfig(_)), "{error}");
    }
    assert!(wal_files(dir.path()).is_empty(), "nothing created");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    /// Cutting the last segment at any byte recovers exactly the complete records before the
    /// cut, in earlier segments and in the last one, and the next append carries the next op.
    #[test]
    fn truncation_at_any_byte_recovers_the_complete_records_before_the_cut(
        body_sizes in proptest::collection::vec(0usize..200, 1..16),
        segment_size_max in prop_oneof![Just(1u64 << 20), 100u64..600],
        cut_fraction in 0.0f64..=1.0,
    ) {
        let dir = tempfile::tempdir().unwrap();
        let config = small_segments(segment_size_max);
        let (expected, last_first_op) = block_on(async {
            let (mut journal, _) = open(dir.path(), config).await;
            let mut expected = Vec::new();
            for &size in &body_sizes {
                expected.extend(append_prepares(&mut journal, 1, size).await);
            }
            let first_ops: Vec<String> = wal_files(dir.path());
            let last: u64 = first_ops.last().unwrap()[..20].parse().unwrap();
            (expected, last)
        });
        let path = segment_path(dir.path(), last_first_op);
        let raw = std::fs::read(&path).unwrap();
        let cut = ((raw.len() as f64) * cut_fraction) as usize;
        std::fs::write(&path, &raw[..cut]).unwrap();

        // Records of the last segment that end within the cut survive.
        let mut kept = expected
            .iter()
            .filter(|prepare| prepare.op < last_first_op)
            .count();
        let mut position = 0u64;
        for prepare in &expected[kept..] {
            position += record_size(prepare.body.len());
            if position > cut as u64 {
                break;
            }
            kept += 1;
        }
        let kept_bytes: u64 = expected[..kept]
            .iter()
            .filter(|prepare| prepare.op >= last_first_op)
            .map(|prepare| record_size(prepare.body.len()))
            .sum();

        let (recovery, last_op, reopened) = block_on(async {
            let (mut journal, recovery) = open(dir.path(), config).await;
            let last_op = journal.last_op();
            let next = prepare(last_op + 1, 17);
            journal.append(&next).await.unwrap();
            drop(journal);
            let (_, reopened) = open(dir.path(), config).await;
            (recovery, last_op, reopened)
        });
        prop_assert_eq!(&recovery.prepares[..], &expected[..kept]);
        prop_assert_eq!(recovery.truncated_bytes, cut as u64 - kept_bytes);
        prop_assert_eq!(last_op, kept as u64);
        prop_assert_eq!(reopened.prepares.len(), kept + 1);
        prop_assert_eq!(reopened.truncated_bytes, 0);
    }
}

/// Issue 9 section 4: after `restart_after(op)` the journal holds no record, is one empty
/// segment `{op + 1}.wal`, and its next append is `op + 1`, above or below its old last op (a
/// stale suffix above the installed checkpoint is dropped too); a reopen agrees.
#[test]
fn issue9_restart_after_drops_every_record_and_continues_at_op_plus_one() {
    let config = small_segments(300);
    for (installed_op, expected_name) in [
        (20, "00000000000000000021.wal"),
        (5, "00000000000000000006.wal"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let (mut journal, _) = open(dir.path(), config).await;
            append_prepares(&mut journal, 11, 36).await;
            assert_eq!(journal.segment_count(), 4);
            journal.restart_after(installed_op).await.unwrap();
            assert_eq!(
                (
                    journal.first_op(),
                    journal.last_op(),
                    journal.segment_count()
                ),
                (installed_op + 1, installed_op, 1)
            );
            assert_eq!(journal.read(3).await.unwrap(), None);
            assert_eq!(wal_files(dir.path()), vec![expected_name]);
            journal
                .append(&prepare(installed_op + 1, 36))
                .await
                .unwrap();
        });
        block_on(async {
            let (journal, recovery) = open(dir.path(), config).await;
            let ops: Vec<u64> = recovery.prepares.iter().map(|prepare| prepare.op).collect();
            assert_eq!(ops, vec![installed_op + 1]);
            assert_eq!(
                (journal.first_op(), journal.last_op()),
                (installed_op + 1, installed_op + 1)
            );
        });
    }
}

/// Copies every file of `from` into a new temporary directory: what a crash right now leaves
/// on disk (each restart step is durable before the observer runs).
fn crash_copy(from: &Path) -> tempfile::TempDir {
    let copy = tempfile::tempdir().unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), copy.path().join(entry.file_name())).unwrap();
    }
    copy
}

/// Issue 9 section 4, crash safety of the journal restart: a crash after any step leaves a
/// directory open accepts: a contiguous run of the newest old segments (ops replayed only above
/// the snapshot by boot), then one empty segment under its old name, then under the new one.
#[test]
fn issue9_restart_after_a_crash_at_every_step_leaves_an_openable_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    let mut crashes: Vec<(RestartStep, tempfile::TempDir)> = Vec::new();
    block_on(async {
        let (mut journal, _) = open(dir.path(), config).await;
        append_prepares(&mut journal, 11, 36).await;
        // Segments: 1 (1..=3), 4 (4..=6), 7 (7..=9), 10 (10..=11).
        journal
            .restart_after_observed(40, &mut |step| crashes.push((step, crash_copy(dir.path()))))
            .await
            .unwrap();
    });
    let steps: Vec<RestartStep> = crashes.iter().map(|(step, _)| *step).collect();
    assert_eq!(
        steps,
        vec![
            RestartStep::SegmentDeleted { first_op: 1 },
            RestartStep::SegmentDeleted { first_op: 4 },
            RestartStep::SegmentDeleted { first_op: 7 },
            RestartStep::LastSegmentEmptied { first_op: 10 },
            RestartStep::Renamed { first_op: 41 },
        ]
    );
    // (first op, last op, ops replayed) each crash copy opens with.
    let expected: [(u64, u64, Vec<u64>); 5] = [
        (4, 11, (4..=11).collect()),
        (7, 11, (7..=11).collect()),
        (10, 11, vec![10, 11]),
        (10, 9, Vec::new()),
        (41, 40, Vec::new()),
    ];
    for ((step, copy), (first_op, last_op, ops)) in crashes.iter().zip(expected) {
        block_on(async {
            let (journal, recovery) = Journal::open_with_config(copy.path(), config)
                .await
                .unwrap_or_else(|error| panic!("crash after {step:?}: open refused: {error}"));
            let replayed: Vec<u64> = recovery.prepares.iter().map(|prepare| prepare.op).collect();
            assert_eq!(
                (journal.first_op(), journal.last_op(), replayed),
                (first_op, last_op, ops),
                "crash after {step:?}"
            );
        });
    }
}
