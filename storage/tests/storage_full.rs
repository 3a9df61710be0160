//! Issue 7 item 1 through the fault seam: a write refused for lack of space (`ENOSPC`) rolls the
//! partition log or the metadata journal back to its acknowledged end and both keep accepting
//! appends, while a failed fsync (whatever its errno) still poisons them. Each test runs on its own
//! compio runtime in a temp directory; the faults come from `FaultInjector`, the files are real.

use std::path::{Path, PathBuf};

use storage::entry::build_entry;
use storage::journal::segment_path as wal_path;
use storage::{
    FaultOp, FsyncPolicy, Journal, JournalConfig, JournalError, LogConfig, LogError, PartitionLog,
    Prepare,
};

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

/// The entry as the log stores it: `entry` with `base_offset` set.
fn stored(entry: &[u8], base_offset: u64) -> Vec<u8> {
    let mut stored = entry.to_vec();
    stored[0..8].copy_from_slice(&base_offset.to_le_bytes());
    stored
}

fn segment(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

fn file_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

fn assert_storage_full_at(result: &Result<u64, LogError>, path: &Path) {
    assert!(
        matches!(result, Err(LogError::StorageFull { path: failed, op: "write entries", free_bytes, source })
            if failed == path && free_bytes.0.is_some() && source.raw_os_error() == Some(libc::ENOSPC)),
        "{result:?}"
    );
}

#[test]
fn issue7_1_log_enospc_on_a_write_then_space_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let first = build_entry(0, 2, b"first");
    let second = build_entry(0, 1, b"second entry");
    let refused = build_entry(0, 3, b"refused entry, partly written");
    let after = build_entry(0, 1, b"after space returned");
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 1 << 20))
            .await
            .unwrap();
        assert_eq!(log.append(first.clone()).await.unwrap(), 0);
        assert_eq!(log.append(second.clone()).await.unwrap(), 2);
        let acked_size = file_size(&segment(dir.path(), 0));
        log.fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::ENOSPC);
        let result = log.append(refused).await;
        assert_storage_full_at(&result, &segment(dir.path(), 0));
        // The half record the fault wrote is cut; the offsets are reused.
        assert_eq!(file_size(&segment(dir.path(), 0)), acked_size);
        assert_eq!((log.next_offset(), log.acked_offset()), (3, 3));
        assert_eq!(log.append(after.clone()).await.unwrap(), 3);
        let expected = [stored(&first, 0), stored(&second, 2), stored(&after, 3)].concat();
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), expected);
        log.sync().await.unwrap();
        log.close().await.unwrap();
        drop(log);

        let (log, report) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 1 << 20))
            .await
            .unwrap();
        assert_eq!(
            (
                report.next_offset,
                report.entry_count,
                report.truncated_bytes
            ),
            (4, 3, 0)
        );
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), expected);
    });
}

#[test]
fn issue7_1_log_enospc_after_a_roll_deletes_the_new_segment() {
    let dir = tempfile::tempdir().unwrap();
    // 72-byte entries (one 8-byte message), 150-byte segments: two entries per segment.
    let entries: Vec<Vec<u8>> = (0..4u8).map(|seed| build_entry(0, 1, &[seed; 8])).collect();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Never, 150))
            .await
            .unwrap();
        assert_eq!(log.append(entries[0].clone()).await.unwrap(), 0);
        // One group of two: entry 1 fills segment 0, then the roll to segment 2, whose write
        // fails. The group, entry 1 included, is rolled back.
        log.fault_injector()
            .fail(FaultOp::Write, 1, 1, libc::ENOSPC);
        let in_segment_0 = log.append(entries[1].clone());
        let in_segment_2 = log.append(entries[2].clone());
        let results = [in_segment_0.await, in_segment_2.await];
        for result in &results {
            assert_storage_full_at(result, &segment(dir.path(), 2));
        }
        assert_eq!(
            file_names(dir.path()),
            ["00000000000000000000.log"],
            "the rolled segment and the closed segment's index are gone"
        );
        assert_eq!(file_size(&segment(dir.path(), 0)), 72);
        assert_eq!(log.next_offset(), 1);
        for (offset, entry) in entries.iter().enumerate().skip(1) {
            assert_eq!(log.append(entry.clone()).await.unwrap(), offset as u64);
        }
        log.close().await.unwrap();
        drop(log);

        let (log, report) = PartitionLog::open(dir.path(), config(FsyncPolicy::Never, 150))
            .await
            .unwrap();
        assert_eq!(
            (
                report.next_offset,
                report.segment_count,
                report.truncated_bytes
            ),
            (4, 2, 0)
        );
        let expected: Vec<u8> = entries
            .iter()
            .enumerate()
            .flat_map(|(offset, entry)| stored(entry, offset as u64))
            .collect();
        assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), expected);
    });
}

/// Returns `Pending` once (waking itself), so other tasks (the log's writer) run.
async fn yield_once() {
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
fn issue7_1_log_enospc_fails_the_appends_queued_behind_and_reuses_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let kept = build_entry(0, 1, b"kept");
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 1 << 20))
            .await
            .unwrap();
        assert_eq!(log.append(kept.clone()).await.unwrap(), 0);
        log.fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::EDQUOT);
        let refused = log.append(build_entry(0, 2, b"refused"));
        // Let the writer take the first group; the next append queues behind it (offset 3).
        yield_once().await;
        let queued = log.append(build_entry(0, 1, b"queued behind"));
        assert_eq!(log.next_offset(), 4);
        for result in [refused.await, queued.await] {
            assert!(
                matches!(&result, Err(LogError::StorageFull { source, .. })
                    if source.raw_os_error() == Some(libc::EDQUOT)),
                "{result:?}"
            );
        }
        assert_eq!((log.next_offset(), log.acked_offset()), (1, 1));
        let after = build_entry(0, 2, b"after");
        assert_eq!(log.append(after.clone()).await.unwrap(), 1);
        assert_eq!(
            log.read(0, u32::MAX, usize::MAX).await.unwrap(),
            [stored(&kept, 0), stored(&after, 1)].concat()
        );
        assert_eq!(
            file_size(&segment(dir.path(), 0)),
            (kept.len() + after.len()) as u64
        );
    });
}

#[test]
fn issue7_1_log_fsync_failure_still_poisons() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 1 << 20))
            .await
            .unwrap();
        assert_eq!(log.append(build_entry(0, 1, b"kept")).await.unwrap(), 0);
        // Even ENOSPC from fsync is fail-stop: the page cache state is unknown after it.
        log.fault_injector()
            .fail(FaultOp::Fsync, 0, 1, libc::ENOSPC);
        let is_fsync_failure = |result: &Result<u64, LogError>| {
            matches!(result, Err(LogError::Io { op: "fsync segment", source, .. })
                if source.raw_os_error() == Some(libc::ENOSPC))
        };
        let failed = log.append(build_entry(0, 1, b"not acked")).await;
        assert!(is_fsync_failure(&failed), "{failed:?}");
        let later = log.append(build_entry(0, 1, b"later")).await;
        assert!(is_fsync_failure(&later), "{later:?}");
        assert!(matches!(
            log.close().await,
            Err(LogError::Io {
                op: "fsync segment",
                ..
            })
        ));
        assert_eq!(log.acked_offset(), 1);
    });
}

/// A prepare for `op` with a body of `size` bytes that differs per op.
fn prepare(op: u64, size: usize) -> Prepare {
    Prepare {
        op,
        view: 0,
        commit: op - 1,
        body: (0..size)
            .map(|index| (op as usize * 31 + index * 7) as u8)
            .collect(),
    }
}

fn assert_journal_full(result: &Result<(), JournalError>, path: &Path, op: &str) {
    assert!(
        matches!(result, Err(JournalError::StorageFull { path: failed, op: failed_op, free_bytes, source })
            if failed == path && *failed_op == op && free_bytes.0.is_some()
                && source.raw_os_error() == Some(libc::ENOSPC)),
        "{result:?}"
    );
}

#[test]
fn issue7_1_journal_enospc_on_a_record_then_space_recovers() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        journal.append(&prepare(1, 100)).await.unwrap();
        let size_after_op_1 = file_size(&wal_path(dir.path(), 1));
        journal
            .fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::ENOSPC);
        assert_journal_full(
            &journal.append(&prepare(2, 300)).await,
            &wal_path(dir.path(), 1),
            "write record",
        );
        assert_eq!(file_size(&wal_path(dir.path(), 1)), size_after_op_1);
        assert_eq!(journal.last_op(), 1);
        // The same op again, once space is back, then the next.
        journal.append(&prepare(2, 300)).await.unwrap();
        journal.append(&prepare(3, 10)).await.unwrap();
        assert_eq!(journal.release_below(1).await.unwrap(), 0);
        drop(journal);

        let (_, recovery) = Journal::open(dir.path()).await.unwrap();
        assert_eq!(
            recovery.prepares,
            [prepare(1, 100), prepare(2, 300), prepare(3, 10)]
        );
        assert_eq!(recovery.truncated_bytes, 0);
    });
}

#[test]
fn issue7_1_journal_enospc_after_a_roll_then_space_recovers() {
    let dir = tempfile::tempdir().unwrap();
    let config = JournalConfig {
        segment_size_max: 200,
    };
    block_on(async {
        let (mut journal, _) = Journal::open_with_config(dir.path(), config).await.unwrap();
        journal.append(&prepare(1, 100)).await.unwrap();
        journal
            .fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::ENOSPC);
        // Op 2 rolls to segment 2, whose first write is refused: the segment stays, empty.
        assert_journal_full(
            &journal.append(&prepare(2, 100)).await,
            &wal_path(dir.path(), 2),
            "write record",
        );
        assert_eq!(file_size(&wal_path(dir.path(), 2)), 0);
        journal.append(&prepare(2, 100)).await.unwrap();
        assert_eq!(journal.segment_count(), 2);
        drop(journal);

        let (_, recovery) = Journal::open_with_config(dir.path(), config).await.unwrap();
        assert_eq!(recovery.prepares, [prepare(1, 100), prepare(2, 100)]);
        assert_eq!(recovery.segment_count, 2);
    });
}

#[test]
fn issue7_1_journal_fsync_failure_still_poisons() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (mut journal, _) = Journal::open(dir.path()).await.unwrap();
        journal.append(&prepare(1, 10)).await.unwrap();
        journal
            .fault_injector()
            .fail(FaultOp::Fsync, 0, 1, libc::ENOSPC);
        let failed = journal.append(&prepare(2, 10)).await;
        assert!(
            matches!(&failed, Err(JournalError::Io { op: "fsync segment", source, .. })
                if source.raw_os_error() == Some(libc::ENOSPC)),
            "{failed:?}"
        );
        let later = journal.append(&prepare(2, 10)).await;
        assert!(
            matches!(
                &later,
                Err(JournalError::Poisoned {
                    op: "fsync segment",
                    ..
                })
            ),
            "{later:?}"
        );
    });
}

/// Appends `entries[0..2]` (one full 150-byte segment of two 72-byte entries), arms `Open` faults
/// (`skip_count` passing opens, then `fail_count` failing with `EMFILE`), and returns the result
/// of the append of `entries[2]`, whose roll meets them.
async fn append_into_a_roll_with_emfile(
    log: &PartitionLog,
    entries: &[Vec<u8>],
    skip_count: u32,
    fail_count: u32,
) -> Result<u64, LogError> {
    assert_eq!(log.append(entries[0].clone()).await.unwrap(), 0);
    assert_eq!(log.append(entries[1].clone()).await.unwrap(), 1);
    log.fault_injector()
        .fail(FaultOp::Open, skip_count, fail_count, libc::EMFILE);
    log.append(entries[2].clone()).await
}

fn assert_descriptors_exhausted(result: &Result<u64, LogError>, path: &Path, op: &str) {
    assert!(
        matches!(result, Err(LogError::DescriptorsExhausted { path: failed, op: failed_op, source })
            if failed == path && *failed_op == op && source.raw_os_error() == Some(libc::EMFILE)),
        "{result:?}"
    );
}

/// The log's files after a rollback of a roll: segment 0 and nothing of the roll.
fn assert_only_segment_0(dir: &Path) {
    assert_eq!(
        file_names(dir)
            .into_iter()
            .filter(|name| !name.ends_with(".producers"))
            .collect::<Vec<_>>(),
        ["00000000000000000000.log"]
    );
}

/// Reopens the log in `dir` and checks that it holds exactly `entries`, one message each.
async fn assert_reopened_holds(dir: &Path, entries: &[Vec<u8>]) {
    let (log, report) = PartitionLog::open(dir, config(FsyncPolicy::Always, 150))
        .await
        .unwrap();
    assert_eq!(report.next_offset, entries.len() as u64);
    let expected: Vec<u8> = entries
        .iter()
        .enumerate()
        .flat_map(|(offset, entry)| stored(entry, offset as u64))
        .collect();
    assert_eq!(log.read(0, u32::MAX, usize::MAX).await.unwrap(), expected);
    log.close().await.unwrap();
}

#[test]
fn issue7_2_log_emfile_at_a_roll_is_refused_then_the_next_append_succeeds() {
    let entries: Vec<Vec<u8>> = (0..4u8).map(|seed| build_entry(0, 1, &[seed; 8])).collect();
    // Open 0 is the new segment's creation, open 1 the directory's open for its fsync.
    let cases = [
        (0, "create segment"),
        (1, "open log directory to fsync it after creating a segment"),
    ];
    for (skip_count, op) in cases {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 150))
                .await
                .unwrap();
            let result = append_into_a_roll_with_emfile(&log, &entries, skip_count, 1).await;
            let path = if skip_count == 0 {
                segment(dir.path(), 2)
            } else {
                dir.path().to_path_buf()
            };
            assert_descriptors_exhausted(&result, &path, op);
            assert_only_segment_0(dir.path());
            assert_eq!((log.next_offset(), log.acked_offset()), (2, 2));
            assert_eq!(log.append(entries[2].clone()).await.unwrap(), 2);
            assert_eq!(log.append(entries[3].clone()).await.unwrap(), 3);
            log.close().await.unwrap();
            drop(log);
            assert_reopened_holds(dir.path(), &entries).await;
        });
    }
}

#[test]
fn issue7_2_log_rollback_stopped_by_emfile_completes_before_the_next_write() {
    let entries: Vec<Vec<u8>> = (0..4u8).map(|seed| build_entry(0, 1, &[seed; 8])).collect();
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 150))
            .await
            .unwrap();
        // The roll's directory open fails, then the rollback's, then the retry of the rollback
        // at the next append: it is refused too, without writing.
        let result = append_into_a_roll_with_emfile(&log, &entries, 1, 3).await;
        let op = "open log directory to fsync it after deleting rolled-back segments";
        assert_descriptors_exhausted(&result, dir.path(), op);
        let retried = log.append(entries[2].clone()).await;
        assert_descriptors_exhausted(&retried, dir.path(), op);
        assert_eq!((log.next_offset(), log.acked_offset()), (2, 2));
        assert_eq!(file_size(&segment(dir.path(), 0)), 144);
        // Descriptors are back: the rollback completes, then the append is written.
        assert_eq!(log.append(entries[2].clone()).await.unwrap(), 2);
        assert_eq!(
            file_names(dir.path())
                .into_iter()
                .filter(|name| !name.ends_with(".producers"))
                .collect::<Vec<_>>(),
            [
                "00000000000000000000.index",
                "00000000000000000000.log",
                "00000000000000000002.log"
            ]
        );
        assert_eq!(log.append(entries[3].clone()).await.unwrap(), 3);
        log.close().await.unwrap();
        drop(log);
        assert_reopened_holds(dir.path(), &entries).await;
    });
}

#[test]
fn issue7_2_log_rollback_still_pending_at_close_fails_the_close_and_reopen_recovers() {
    let entries: Vec<Vec<u8>> = (0..4u8).map(|seed| build_entry(0, 1, &[seed; 8])).collect();
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), config(FsyncPolicy::Always, 150))
            .await
            .unwrap();
        // The roll's directory open, the rollback's and the close's retry all fail.
        let result = append_into_a_roll_with_emfile(&log, &entries, 1, 3).await;
        let op = "open log directory to fsync it after deleting rolled-back segments";
        assert_descriptors_exhausted(&result, dir.path(), op);
        let closed = log.close().await;
        assert!(
            matches!(&closed, Err(LogError::DescriptorsExhausted { op: failed_op, .. }) if *failed_op == op),
            "{closed:?}"
        );
        drop(log);
        assert_reopened_holds(dir.path(), &entries[..2]).await;
    });
}
