//! Integration tests of the journal operations a replica of a cluster needs (issue 8 section 2):
//! `truncate_after`, `read` by op, `append_batch` (group commit: one fsync), and opening a journal
//! damaged above the checkpoint for repair from peers instead of refusing.

use std::path::Path;

use storage::journal::{TailDisposition, UncoveredDamage, segment_path};
use storage::{FaultOp, JOURNAL_HEADER_SIZE, Journal, JournalConfig, JournalError, Prepare};

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

fn prepares(ops: std::ops::RangeInclusive<u64>, size: usize) -> Vec<Prepare> {
    ops.map(|op| prepare(op, size)).collect()
}

fn record_size(body_size: usize) -> u64 {
    (JOURNAL_HEADER_SIZE + body_size) as u64
}

fn small_segments(segment_size_max: u64) -> JournalConfig {
    JournalConfig { segment_size_max }
}

async fn open(dir: &Path, config: JournalConfig) -> Journal {
    Journal::open_with_config(dir, config).await.unwrap().0
}

async fn read_all(journal: &Journal, ops: std::ops::RangeInclusive<u64>) -> Vec<Option<Prepare>> {
    let mut read = Vec::new();
    for op in ops {
        read.push(journal.read(op).await.unwrap());
    }
    read
}

#[test]
fn truncate_after_drops_the_ops_above_and_appends_continue_after_it() {
    let dir = tempfile::tempdir().unwrap();
    // 3 records of 100 bytes per 300-byte segment: ops 1-3, 4-6, 7-9, 10.
    let config = small_segments(300);
    block_on(async {
        let mut journal = open(dir.path(), config).await;
        journal.append_batch(&prepares(1..=10, 36)).await.unwrap();
        assert_eq!(journal.segment_count(), 4);
        // Cut in the middle of segment 4-6: op 5 and everything after it go.
        assert_eq!(journal.truncate_after(4).await.unwrap(), 6);
        assert_eq!(journal.last_op(), 4);
        assert_eq!(journal.segment_count(), 2);
        assert_eq!(journal.read(5).await.unwrap(), None);
        assert_eq!(journal.read(4).await.unwrap(), Some(prepare(4, 36)));
        // Nothing above: a no-op.
        assert_eq!(journal.truncate_after(9).await.unwrap(), 0);
        // Appends continue at op 5, in the truncated segment, with a different body (a new view).
        let mut replacement = prepare(5, 20);
        replacement.view = 9;
        journal.append(&replacement).await.unwrap();
        assert_eq!(journal.read(5).await.unwrap(), Some(replacement.clone()));
    });
    assert_eq!(
        std::fs::metadata(segment_path(dir.path(), 4))
            .unwrap()
            .len(),
        record_size(36) + record_size(20)
    );
    assert!(!segment_path(dir.path(), 7).exists());
    assert!(!segment_path(dir.path(), 10).exists());
    // Reopen sees the truncation and the new op 5.
    block_on(async {
        let (journal, recovery) = Journal::open_with_config(dir.path(), config).await.unwrap();
        assert_eq!(journal.last_op(), 5);
        let ops: Vec<u64> = recovery.prepares.iter().map(|p| p.op).collect();
        assert_eq!(ops, vec![1, 2, 3, 4, 5]);
        assert_eq!(recovery.prepares[4].view, 9);
        assert!(recovery.damaged_records.is_empty());
    });
}

#[test]
fn truncate_after_at_a_segment_start_and_below_the_released_part() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    block_on(async {
        let mut journal = open(dir.path(), config).await;
        journal.append_batch(&prepares(1..=9, 36)).await.unwrap();
        // Op 7 is the first record of segment 7: it stays, empty, as the active segment.
        assert_eq!(journal.truncate_after(6).await.unwrap(), 3);
        assert_eq!(
            std::fs::metadata(segment_path(dir.path(), 7))
                .unwrap()
                .len(),
            0
        );
        assert_eq!(journal.segment_count(), 3);
        journal.append(&prepare(7, 36)).await.unwrap();
        assert_eq!(journal.release_below(4).await.unwrap(), 1);
        assert_eq!(journal.first_op(), 4);
        // Ops 1-3 are released: the journal cannot go back below op 3.
        let error = journal.truncate_after(2).await.unwrap_err();
        assert!(
            matches!(
                error,
                JournalError::TruncateBelowReleased { op: 2, first_op: 4 }
            ),
            "{error}"
        );
        assert_eq!(journal.last_op(), 7);
        // Exactly at first_op - 1: everything goes, the journal is empty but keeps its first op.
        assert_eq!(journal.truncate_after(3).await.unwrap(), 4);
        assert_eq!(journal.last_op(), 3);
        assert_eq!(journal.first_op(), 4);
        journal.append(&prepare(4, 10)).await.unwrap();
    });
    block_on(async {
        let (journal, recovery) = Journal::open_with_config(dir.path(), config).await.unwrap();
        assert_eq!((journal.first_op(), journal.last_op()), (4, 4));
        assert_eq!(recovery.prepares, vec![prepare(4, 10)]);
    });
}

#[test]
fn read_by_op_across_segments_after_release_and_with_damage() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    block_on(async {
        let mut journal = open(dir.path(), config).await;
        let appended = prepares(1..=8, 36);
        journal.append_batch(&appended).await.unwrap();
        let read = read_all(&journal, 1..=8).await;
        assert_eq!(read, appended.iter().cloned().map(Some).collect::<Vec<_>>());
        assert_eq!(journal.read(0).await.unwrap(), None);
        assert_eq!(journal.read(9).await.unwrap(), None);
        journal.release_below(7).await.unwrap();
        assert_eq!(journal.first_op(), 7);
        assert_eq!(journal.read(3).await.unwrap(), None);
        assert_eq!(journal.read(7).await.unwrap(), Some(appended[6].clone()));
    });
    // Reopened: the index is rebuilt from the scan.
    block_on(async {
        let journal = open(dir.path(), config).await;
        assert_eq!(journal.read(8).await.unwrap(), Some(prepare(8, 36)));
        // Bit rot in op 8's body after open: the read verifies and answers None.
        let path = segment_path(dir.path(), 7);
        let mut raw = std::fs::read(&path).unwrap();
        raw[record_size(36) as usize + JOURNAL_HEADER_SIZE + 3] ^= 0x40;
        std::fs::write(&path, &raw).unwrap();
        assert_eq!(journal.read(8).await.unwrap(), None);
        assert_eq!(journal.read(7).await.unwrap(), Some(prepare(7, 36)));
        // A record cut short (the file shrank under it) reads as damage too, not an error.
        std::fs::write(&path, &raw[..record_size(36) as usize + 10]).unwrap();
        assert_eq!(journal.read(8).await.unwrap(), None);
    });
}

#[test]
fn append_batch_makes_several_prepares_durable_with_one_fsync() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let mut journal = open(dir.path(), JournalConfig::default()).await;
        let faults = journal.fault_injector();
        // The first fsync passes, the second fails: a batch of five succeeds only if it syncs
        // once.
        faults.fail(FaultOp::Fsync, 1, 1, libc::EIO);
        journal.append_batch(&prepares(1..=5, 50)).await.unwrap();
        assert_eq!(journal.last_op(), 5);
        // The seam is live: the next fsync is the armed failure, which poisons.
        let error = journal.append(&prepare(6, 50)).await.unwrap_err();
        assert!(
            matches!(
                error,
                JournalError::Io {
                    op: "fsync segment",
                    ..
                }
            ),
            "{error}"
        );
        let error = journal.append(&prepare(6, 50)).await.unwrap_err();
        assert!(matches!(error, JournalError::Poisoned { .. }), "{error}");
    });
    block_on(async {
        let (journal, recovery) = Journal::open(dir.path()).await.unwrap();
        // Op 6 reached the page cache before its fsync failed: reopen keeps a complete record.
        assert!(journal.last_op() >= 5);
        assert_eq!(&recovery.prepares[..5], &prepares(1..=5, 50)[..]);
    });
}

#[test]
fn append_batch_refused_for_space_rolls_back_the_whole_batch() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let mut journal = open(dir.path(), JournalConfig::default()).await;
        journal.append_batch(&prepares(1..=2, 40)).await.unwrap();
        journal
            .fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::ENOSPC);
        let error = journal
            .append_batch(&prepares(3..=6, 40))
            .await
            .unwrap_err();
        assert!(matches!(error, JournalError::StorageFull { .. }), "{error}");
        // Rolled back: not poisoned, nothing of the batch is journaled, the same ops go again.
        assert_eq!(journal.last_op(), 2);
        assert_eq!(journal.read(3).await.unwrap(), None);
        assert_eq!(
            std::fs::metadata(segment_path(dir.path(), 1))
                .unwrap()
                .len(),
            2 * record_size(40)
        );
        journal.append_batch(&prepares(3..=6, 40)).await.unwrap();
        assert_eq!(journal.read(6).await.unwrap(), Some(prepare(6, 40)));
    });
}

#[test]
fn append_batch_across_a_roll_keeps_what_the_roll_closed_when_space_runs_out() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    block_on(async {
        let mut journal = open(dir.path(), config).await;
        journal.append(&prepare(1, 36)).await.unwrap();
        // Ops 2-3 fill segment 1 (written, fsynced, closed); the write of 4-5 into segment 4
        // is refused.
        journal
            .fault_injector()
            .fail(FaultOp::Write, 1, 1, libc::ENOSPC);
        let error = journal
            .append_batch(&prepares(2..=5, 36))
            .await
            .unwrap_err();
        assert!(matches!(error, JournalError::StorageFull { .. }), "{error}");
        assert_eq!(journal.last_op(), 3);
        assert_eq!(journal.read(3).await.unwrap(), Some(prepare(3, 36)));
        journal.append_batch(&prepares(4..=5, 36)).await.unwrap();
    });
    block_on(async {
        let (journal, recovery) = Journal::open_with_config(dir.path(), config).await.unwrap();
        assert_eq!(journal.last_op(), 5);
        assert_eq!(recovery.prepares, prepares(1..=5, 36));
    });
}

/// A journal of ops 1-9 in 300-byte segments (1-3, 4-6, 7-9) with a body byte of op 5 flipped.
fn middle_damaged_journal(dir: &Path) -> Vec<u8> {
    block_on(async {
        let mut journal = open(dir, small_segments(300)).await;
        journal.append_batch(&prepares(1..=9, 36)).await.unwrap();
    });
    let path = segment_path(dir, 4);
    let mut raw = std::fs::read(&path).unwrap();
    raw[record_size(36) as usize + JOURNAL_HEADER_SIZE + 5] ^= 0x01;
    std::fs::write(&path, &raw).unwrap();
    raw
}

#[test]
fn cluster_recovery_opens_the_valid_prefix_of_a_middle_damaged_journal() {
    let dir = tempfile::tempdir().unwrap();
    let config = small_segments(300);
    let raw = middle_damaged_journal(dir.path());
    // A single replica refuses, as before.
    let error = block_on(Journal::scan(dir.path(), 0)).unwrap_err();
    assert!(matches!(error, JournalError::Corrupt { .. }), "{error}");
    block_on(async {
        let scan = Journal::scan_with(dir.path(), 0, UncoveredDamage::RepairFromPeers)
            .await
            .unwrap();
        assert!(scan.is_read_only());
        let (mut journal, recovery) = Journal::open_scanned(scan, config).await.unwrap();
        let ops: Vec<u64> = recovery.prepares.iter().map(|p| p.op).collect();
        assert_eq!(ops, vec![1, 2, 3, 4]);
        assert_eq!(journal.last_op(), 4);
        let [damaged] = &recovery.damaged_records[..] else {
            panic!("one damaged record: {:?}", recovery.damaged_records);
        };
        assert_eq!(damaged.op, 5);
        assert_eq!(damaged.path, segment_path(dir.path(), 4));
        assert_eq!(damaged.position, record_size(36));
        assert_eq!(
            damaged.disposition,
            TailDisposition::AwaitingRepair { highest_op: 9 }
        );
        assert_eq!(journal.damaged_tail(), Some(damaged));
        // Left in place: nothing was written, and nothing is appended after the damage.
        assert_eq!(std::fs::read(segment_path(dir.path(), 4)).unwrap(), raw);
        assert!(segment_path(dir.path(), 7).exists());
        assert_eq!(journal.read(5).await.unwrap(), None);
        assert_eq!(journal.read(6).await.unwrap(), None);
        let error = journal.append(&prepare(5, 36)).await.unwrap_err();
        assert!(
            matches!(error, JournalError::DamagedTail { op: 5, .. }),
            "{error}"
        );
        // Until told: the core's TruncateJournal at op 4 cuts the damage and the segments after.
        assert_eq!(journal.truncate_after(4).await.unwrap(), 0);
        assert_eq!(journal.damaged_tail(), None);
        assert!(!segment_path(dir.path(), 7).exists());
        journal.append(&prepare(5, 36)).await.unwrap();
    });
    block_on(async {
        let (journal, recovery) = Journal::open_with_config(dir.path(), config).await.unwrap();
        assert_eq!(journal.last_op(), 5);
        assert!(recovery.damaged_records.is_empty());
        assert_eq!(recovery.prepares, prepares(1..=5, 36));
    });
}

#[test]
fn cluster_recovery_truncation_below_the_damage_cuts_it_too() {
    let dir = tempfile::tempdir().unwrap();
    middle_damaged_journal(dir.path());
    block_on(async {
        let scan = Journal::scan_with(dir.path(), 0, UncoveredDamage::RepairFromPeers)
            .await
            .unwrap();
        let (mut journal, _) = Journal::open_scanned(scan, small_segments(300))
            .await
            .unwrap();
        assert_eq!(journal.truncate_after(2).await.unwrap(), 2);
        assert_eq!(journal.last_op(), 2);
        assert_eq!(journal.damaged_tail(), None);
        assert_eq!(journal.segment_count(), 1);
    });
    block_on(async {
        let (journal, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(journal.last_op(), 2);
        assert!(recovery.damaged_records.is_empty());
    });
}

#[test]
fn cluster_recovery_still_cuts_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let mut journal = open(dir.path(), JournalConfig::default()).await;
        journal.append_batch(&prepares(1..=3, 36)).await.unwrap();
    });
    let path = segment_path(dir.path(), 1);
    let raw = std::fs::read(&path).unwrap();
    std::fs::write(&path, &raw[..raw.len() - 10]).unwrap();
    block_on(async {
        let scan = Journal::scan_with(dir.path(), 0, UncoveredDamage::RepairFromPeers)
            .await
            .unwrap();
        assert!(scan.damaged_tail().is_none());
        let (journal, recovery) = Journal::open_scanned(scan, JournalConfig::default())
            .await
            .unwrap();
        assert_eq!(journal.last_op(), 2);
        assert_eq!(
            recovery.damaged_records[0].disposition,
            TailDisposition::Truncated
        );
    });
}
