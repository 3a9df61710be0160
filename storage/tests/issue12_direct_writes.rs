//! Issue 12 item 3: the direct write mode of the partition log (`WriteMode::Direct`,
//! `storage/FORMAT.md` section 3, "Write modes"). Entries of odd sizes read back before and
//! after a reopen, a crash image with direct-write padding recovers every acknowledged entry and
//! cuts the padding, fsync `always`, rolls, rollbacks after a refused write, switching modes on
//! one directory, the fallbacks to buffered writes, and reads interleaved with appends. Each test
//! asserts the mode the log actually used (`PartitionLog::write_mode_in_use`), so a silent
//! fallback fails it. The temp directories are under /tmp (ext4 here, which takes `O_DIRECT`).

use std::path::{Path, PathBuf};

use storage::entry::build_entry;
use storage::limits::DIRECT_WRITE_ALIGNMENT_BYTES;
use storage::{FaultOp, FsyncPolicy, LogConfig, LogError, PartitionLog, WriteMode};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

fn config(write_mode: WriteMode, fsync: FsyncPolicy, segment_size_max: u64) -> LogConfig {
    LogConfig {
        fsync,
        segment_size_max,
        write_mode,
    }
}

fn direct(fsync: FsyncPolicy) -> LogConfig {
    config(WriteMode::Direct, fsync, 1 << 30)
}

/// A payload of `size` bytes that differs per `seed`. Bit 0 of byte 12 is kept clear: set, it
/// would mark the entry as carrying a producer stamp (`storage/FORMAT.md` section 3).
fn payload(seed: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|index| (seed as usize * 31 + index * 7 + 1) as u8)
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

fn segment(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

fn file_size(path: &Path) -> u64 {
    std::fs::metadata(path).unwrap().len()
}

/// What open cut from the last segment: (torn-tail bytes, direct-write padding bytes, the
/// quarantine if any).
fn what_open_cut(report: &storage::RecoveryReport) -> (u64, u64, Option<storage::Quarantine>) {
    (
        report.truncated_bytes,
        report.direct_padding_bytes,
        report.quarantined.clone(),
    )
}

/// Checks that `log` reads `expected`, closes it, reopens `dir` with `config`, checks that the
/// reopened log reads `expected` too, and returns what its recovery reported.
async fn close_reopen_and_read(
    log: PartitionLog,
    dir: &Path,
    config: LogConfig,
    expected: &[u8],
) -> storage::RecoveryReport {
    assert_eq!(read_all(&log).await, expected);
    log.close().await.unwrap();
    drop(log);
    let (log, report) = PartitionLog::open(dir, config).await.unwrap();
    assert_eq!(read_all(&log).await, expected, "after reopening");
    report
}

/// Appends one entry per size, each awaited (one direct write each, so every carry case runs);
/// returns the stored bytes of each.
async fn append_each(log: &PartitionLog, first_seed: u64, sizes: &[usize]) -> Vec<Vec<u8>> {
    let mut all = Vec::new();
    for (seed, size) in (first_seed..).zip(sizes) {
        let entry = build_entry(seed, 1, &payload(seed, *size));
        let offset = log.append(entry.clone()).await.unwrap();
        all.push(stored(&entry, offset));
    }
    all
}

/// Appends one entry per size without awaiting between them (one group, one staged write);
/// returns the stored bytes of each.
async fn append_group(log: &PartitionLog, first_seed: u64, sizes: &[usize]) -> Vec<Vec<u8>> {
    let entries: Vec<Vec<u8>> = (first_seed..)
        .zip(sizes)
        .map(|(seed, size)| build_entry(seed, 1, &payload(seed, *size)))
        .collect();
    let futures: Vec<_> = entries
        .iter()
        .map(|entry| log.append(entry.clone()))
        .collect();
    let mut all = Vec::new();
    for (entry, future) in entries.iter().zip(futures) {
        all.push(stored(entry, future.await.unwrap()));
    }
    all
}

async fn read_all(log: &PartitionLog) -> Vec<u8> {
    log.read(0, u32::MAX, usize::MAX).await.unwrap()
}

const ODD_SIZES: [usize; 9] = [1, 4095, 4096, 4097, 100_000, 7, 8191, 3, 12_289];

#[test]
fn issue12_3_direct_writes_of_odd_sizes_read_back_and_close_at_the_logical_end() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, report) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Never))
            .await
            .unwrap();
        assert_eq!(report.direct_padding_bytes, 0);
        let mut expected = append_each(&log, 0, &ODD_SIZES).await;
        expected.extend(append_group(&log, 100, &ODD_SIZES).await);
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        let expected = expected.concat();
        assert_eq!(read_all(&log).await, expected);
        let logical_end = expected.len() as u64;
        assert_ne!(logical_end % DIRECT_WRITE_ALIGNMENT_BYTES as u64, 0);
        let open_size = file_size(&segment(dir.path(), 0));
        assert_eq!(
            open_size,
            logical_end.next_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES as u64),
            "while open, the last direct write's zero padding follows the logical end"
        );
        log.close().await.unwrap();
        assert_eq!(file_size(&segment(dir.path(), 0)), logical_end);
        assert_eq!(read_all(&log).await, expected, "reads work after close");
        drop(log);

        let (log, report) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Never))
            .await
            .unwrap();
        assert_eq!(what_open_cut(&report), (0, 0, None));
        assert_eq!(report.next_offset, 2 * ODD_SIZES.len() as u64);
        assert_eq!(read_all(&log).await, expected);
        // Appends after the reopen continue from a carry loaded from the file.
        let more = append_each(&log, 200, &[5, 4100]).await;
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        log.close().await.unwrap();
        let expected = [expected, more.concat()].concat();
        assert_eq!(read_all(&log).await, expected);
        assert_eq!(file_size(&segment(dir.path(), 0)), expected.len() as u64);
    });
}

/// A crash image (the segment copied while the log runs: what the disk holds after a power
/// loss under `always`) ends in the padding of the last direct write. Open cuts it as padding,
/// not as a torn tail, quarantines nothing, and every acknowledged entry is there; in buffered
/// mode as in direct mode.
#[test]
fn issue12_3_a_crash_image_with_padding_recovers_every_acknowledged_entry() {
    for reopen_mode in [WriteMode::Direct, WriteMode::Buffered] {
        let dir = tempfile::tempdir().unwrap();
        let crashed = tempfile::tempdir().unwrap();
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
                .await
                .unwrap();
            let expected = append_each(&log, 0, &ODD_SIZES).await.concat();
            assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
            std::fs::copy(segment(dir.path(), 0), segment(crashed.path(), 0)).unwrap();
            let crashed_size = file_size(&segment(crashed.path(), 0));
            let padding = crashed_size - expected.len() as u64;
            assert!(
                padding > 0 && crashed_size.is_multiple_of(DIRECT_WRITE_ALIGNMENT_BYTES as u64),
                "{crashed_size} bytes for {} of entries",
                expected.len()
            );
            drop(log);

            let (log, report) = PartitionLog::open(
                crashed.path(),
                config(reopen_mode, FsyncPolicy::Always, 1 << 30),
            )
            .await
            .unwrap();
            assert_eq!(what_open_cut(&report), (0, padding, None), "{reopen_mode}");
            assert_eq!(report.next_offset, ODD_SIZES.len() as u64);
            assert_eq!(
                file_size(&segment(crashed.path(), 0)),
                expected.len() as u64
            );
            assert_eq!(read_all(&log).await, expected);
            let more = append_each(&log, 50, &[10, 5000]).await.concat();
            assert_eq!(log.write_mode_in_use(), reopen_mode);
            log.close().await.unwrap();
            assert_eq!(read_all(&log).await, [expected, more].concat());
        });
    }
}

/// Zeros past an unaligned end of file, or a whole alignment unit of them, are not direct-write
/// padding: open cuts them as a torn tail, as before.
#[test]
fn issue12_3_zeros_that_cannot_be_padding_stay_a_torn_tail() {
    for (zero_count, aligned_end) in [(100_usize, false), (DIRECT_WRITE_ALIGNMENT_BYTES, true)] {
        let dir = tempfile::tempdir().unwrap();
        let expected = block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
                .await
                .unwrap();
            let expected = append_each(&log, 0, &[1000]).await.concat();
            log.close().await.unwrap();
            expected
        });
        let mut bytes = std::fs::read(segment(dir.path(), 0)).unwrap();
        assert_eq!(bytes, expected);
        let mut zeros = zero_count;
        if aligned_end {
            zeros += DIRECT_WRITE_ALIGNMENT_BYTES - bytes.len();
        }
        bytes.resize(bytes.len() + zeros, 0);
        std::fs::write(segment(dir.path(), 0), &bytes).unwrap();
        block_on(async {
            let (log, report) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
                .await
                .unwrap();
            assert_eq!(what_open_cut(&report), (zeros as u64, 0, None));
            assert_eq!(read_all(&log).await, expected);
        });
    }
}

/// Under `always` every group is fsynced; rolls close each segment at its exact logical end
/// (no padding in a closed segment, checked while the log still runs), and reads cross them.
#[test]
fn issue12_3_fsync_always_and_rolls_in_direct_mode() {
    let dir = tempfile::tempdir().unwrap();
    let segment_size_max = 10_000;
    let sizes: Vec<usize> = (0..24).map(|index| 700 + index * 211).collect();
    block_on(async {
        let (log, _) = PartitionLog::open(
            dir.path(),
            config(WriteMode::Direct, FsyncPolicy::Always, segment_size_max),
        )
        .await
        .unwrap();
        let stored_entries = append_each(&log, 0, &sizes).await;
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        assert!(log.fsync_count() >= sizes.len() as u64);
        // The segments the roll rule makes: (base offset, bytes) of each.
        let mut segments: Vec<(u64, u64)> = vec![(0, 0)];
        for (offset, entry) in (0_u64..).zip(&stored_entries) {
            let last = segments.last_mut().unwrap();
            if last.1 > 0 && last.1 + entry.len() as u64 > segment_size_max {
                segments.push((offset, entry.len() as u64));
            } else {
                last.1 += entry.len() as u64;
            }
        }
        assert!(segments.len() >= 3, "{segments:?}");
        let (active, closed) = segments.split_last().unwrap();
        for (base_offset, size_bytes) in closed {
            assert_eq!(file_size(&segment(dir.path(), *base_offset)), *size_bytes);
        }
        assert!(file_size(&segment(dir.path(), active.0)) >= active.1);
        let expected = stored_entries.concat();
        assert_eq!(read_all(&log).await, expected);
        log.close().await.unwrap();
        assert_eq!(file_size(&segment(dir.path(), active.0)), active.1);
        drop(log);
        let (log, report) = PartitionLog::open(
            dir.path(),
            config(WriteMode::Direct, FsyncPolicy::Always, segment_size_max),
        )
        .await
        .unwrap();
        assert_eq!(report.segment_count as usize, segments.len());
        assert_eq!(read_all(&log).await, expected);
    });
}

/// A direct write refused for lack of space (the fault seam writes whole blocks of the staged
/// bytes first, as a short write would) is rolled back to the acknowledged end: the file is cut
/// there, the carry reloaded, and the appends after it succeed and read back.
#[test]
fn issue12_3_enospc_rollback_in_direct_mode_then_appends_continue() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
            .await
            .unwrap();
        let before = append_each(&log, 0, &[100, 5000]).await.concat();
        log.fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::ENOSPC);
        let refused = log.append(build_entry(9, 1, &payload(9, 20_000))).await;
        assert!(
            matches!(&refused, Err(LogError::StorageFull { op: "write entries with O_DIRECT", source, .. })
                if source.raw_os_error() == Some(libc::ENOSPC)),
            "{refused:?}"
        );
        assert_eq!(
            file_size(&segment(dir.path(), 0)),
            before.len() as u64,
            "the rollback cut the partial write and the padding"
        );
        assert_eq!((log.next_offset(), log.acked_offset()), (2, 2));
        let after = append_each(&log, 10, &[3, 4093, 9000]).await.concat();
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        let expected = [before, after].concat();
        let report =
            close_reopen_and_read(log, dir.path(), direct(FsyncPolicy::Always), &expected).await;
        assert_eq!((report.truncated_bytes, report.next_offset), (0, 5));
    });
}

/// A refused roll (the new segment's creation fails for lack of descriptors) in direct mode
/// rolls back into the segment the roll closed: its direct descriptor is opened again and its
/// carry reloaded, and appends go on.
#[test]
fn issue12_3_rollback_of_a_roll_in_direct_mode() {
    let dir = tempfile::tempdir().unwrap();
    let segment_size_max = 8000;
    block_on(async {
        let (log, _) = PartitionLog::open(
            dir.path(),
            config(WriteMode::Direct, FsyncPolicy::Always, segment_size_max),
        )
        .await
        .unwrap();
        let before = append_each(&log, 0, &[3000, 3001]).await.concat();
        log.fault_injector().fail(FaultOp::Open, 0, 1, libc::EMFILE);
        let refused = log.append(build_entry(5, 1, &payload(5, 3000))).await;
        assert!(
            matches!(&refused, Err(LogError::DescriptorsExhausted { .. })),
            "{refused:?}"
        );
        assert_eq!(file_size(&segment(dir.path(), 0)), before.len() as u64);
        let after = append_each(&log, 10, &[100, 3000, 3000]).await.concat();
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        let expected = [before, after].concat();
        assert_eq!(read_all(&log).await, expected);
        log.close().await.unwrap();
    });
}

/// One directory written in buffered mode, then direct, then buffered again: each open reads
/// everything the others wrote and appends after it.
#[test]
fn issue12_3_a_directory_switches_between_buffered_and_direct_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut expected = Vec::new();
    for (round, mode) in (0_u64..).zip([
        WriteMode::Buffered,
        WriteMode::Direct,
        WriteMode::Buffered,
        WriteMode::Direct,
    ]) {
        block_on(async {
            let (log, report) =
                PartitionLog::open(dir.path(), config(mode, FsyncPolicy::Never, 1 << 30))
                    .await
                    .unwrap();
            assert_eq!(
                (report.truncated_bytes, report.direct_padding_bytes),
                (0, 0)
            );
            assert_eq!(read_all(&log).await, expected.concat());
            expected.extend(append_each(&log, round * 100, &[17, 4099, 333]).await);
            assert_eq!(log.write_mode_in_use(), mode);
            log.close().await.unwrap();
            assert_eq!(read_all(&log).await, expected.concat());
            assert_eq!(
                file_size(&segment(dir.path(), 0)),
                expected.concat().len() as u64
            );
        });
    }
}

/// `O_DIRECT` refused at the open (`EINVAL`, as a filesystem without it answers; injected,
/// because tmpfs takes `O_DIRECT` on this kernel): the log writes buffered and says so.
#[test]
fn issue12_3_direct_open_refused_falls_back_to_buffered_writes() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
            .await
            .unwrap();
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        log.fault_injector()
            .fail(FaultOp::DirectOpen, 0, 1, libc::EINVAL);
        let expected = append_each(&log, 0, &[10, 5000, 4096]).await.concat();
        assert_eq!(log.write_mode_in_use(), WriteMode::Buffered);
        assert_eq!(file_size(&segment(dir.path(), 0)), expected.len() as u64);
        assert_eq!(read_all(&log).await, expected);
        log.close().await.unwrap();
    });
}

/// `O_DIRECT` refused at a write (`EINVAL`: the alignment): the log falls back, cuts the padding
/// the direct writes left, writes the same entries buffered, and is not poisoned.
#[test]
fn issue12_3_direct_write_refused_falls_back_without_poisoning() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Always))
            .await
            .unwrap();
        let mut expected = append_each(&log, 0, &[10, 5000]).await;
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        log.fault_injector()
            .fail(FaultOp::Write, 0, 1, libc::EINVAL);
        expected.extend(append_each(&log, 10, &[9000, 1, 4097]).await);
        assert_eq!(log.write_mode_in_use(), WriteMode::Buffered);
        let expected = expected.concat();
        assert_eq!(file_size(&segment(dir.path(), 0)), expected.len() as u64);
        let report =
            close_reopen_and_read(log, dir.path(), direct(FsyncPolicy::Always), &expected).await;
        assert_eq!((report.truncated_bytes, report.next_offset), (0, 5));
    });
}

/// On tmpfs (/dev/shm), whichever mode the kernel allows: this kernel's tmpfs takes `O_DIRECT`
/// (Linux 6.6 and later), an older one refuses it and the log falls back. Either way everything
/// reads back and the file ends at the logical end after close.
#[test]
fn issue12_3_direct_mode_on_tmpfs_reads_back_in_the_mode_it_got() {
    let shm = Path::new("/dev/shm");
    assert!(
        shm.is_dir(),
        "/dev/shm exists on every Linux host this runs on"
    );
    let dir = tempfile::tempdir_in(shm).unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Never))
            .await
            .unwrap();
        let expected = append_each(&log, 0, &ODD_SIZES).await.concat();
        let mode = log.write_mode_in_use();
        eprintln!("tmpfs write mode in use: {mode}");
        assert_eq!(read_all(&log).await, expected);
        log.close().await.unwrap();
        assert_eq!(file_size(&segment(dir.path(), 0)), expected.len() as u64);
    });
}

/// Page-cache coherence: reads (mapped or copied) interleaved with direct appends in flight
/// always verify and return the acknowledged entries, and a mapped span handed out before later
/// appends rewrote its carry block still holds the same bytes.
#[test]
fn issue12_3_reads_interleaved_with_direct_appends_always_verify() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), direct(FsyncPolicy::Never))
            .await
            .unwrap();
        let mut expected: Vec<Vec<u8>> = Vec::new();
        let mut held = Vec::new();
        let mut mapped_read_count = 0;
        for seed in 0_u64..200 {
            let size = (seed as usize * 373) % 6000 + 1;
            let entry = build_entry(seed, 1, &payload(seed, size));
            // Queued, not awaited: the writer's direct write runs while the reads below wait.
            let append = log.append(entry.clone());
            // Its offset is `seed`: a read may see it acknowledged before this await ends.
            expected.push(stored(&entry, seed));
            let from = seed / 2;
            let acked_before = log.acked_offset();
            let spans = log.read_spans(from, u32::MAX, usize::MAX).await.unwrap();
            // Each entry holds one message: the read ends where its entries end.
            let acked = from + spans.entry_headers().len() as u64;
            assert!((acked_before..=log.acked_offset()).contains(&acked));
            assert_eq!(
                spans.to_vec(),
                expected[from as usize..acked as usize].concat()
            );
            if spans.any_mapped() {
                mapped_read_count += 1;
                if held.len() < 8 {
                    held.push((from, acked, spans));
                }
            }
            assert_eq!(append.await.unwrap(), seed);
        }
        assert_eq!(log.write_mode_in_use(), WriteMode::Direct);
        assert!(mapped_read_count > 0, "some reads were served mapped");
        for (from, acked, spans) in held {
            assert_eq!(
                spans.to_vec(),
                expected[from as usize..acked as usize].concat()
            );
        }
        assert_eq!(read_all(&log).await, expected.concat());
        log.close().await.unwrap();
    });
}
