//! Issue 12 item 2: reads verify entries in place on a segment mapping and hand them out as
//! `VerifiedSpans` (file ranges a server sends without a copy). These tests hold the spans to
//! the bytes the log stored, across sealed and active segments, a roll and retention, and to the
//! damage rules of `storage/FORMAT.md` section 3 ("Reads").

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use storage::entry::{ENTRY_HEADER_SIZE, build_entry};
use storage::log::RetentionPolicy;
use storage::{FsyncPolicy, LogConfig, LogError, PartitionLog, VerifiedSpans};

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// 4096-byte segments: seven of the 528-byte entries below per segment.
fn small_segments() -> LogConfig {
    LogConfig {
        fsync: FsyncPolicy::Always,
        segment_size_max: 4096,
        write_mode: storage::WriteMode::Buffered,
    }
}

/// A payload of `size` bytes that differs per `seed` (bit 0 of byte 12 clear: no producer stamp).
fn payload(seed: u64, size: usize) -> Vec<u8> {
    (0..size)
        .map(|index| (seed as usize * 31 + index * 7) as u8)
        .enumerate()
        .map(|(index, byte)| if index == 12 { byte & !1 } else { byte })
        .collect()
}

fn segment_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

/// One stored entry: its base offset, message count and bytes as stored.
struct Stored {
    base_offset: u64,
    message_count: u64,
    bytes: Vec<u8>,
}

/// Appends `count` entries of 3 messages (528 bytes each: 32 + 3 x 32 + 400) and returns them as stored.
async fn append_entries(log: &PartitionLog, count: u64) -> Vec<Stored> {
    let mut stored = Vec::new();
    for seed in 0..count {
        let entry = build_entry(seed, 3, &payload(seed, 400));
        let base_offset = log.append(entry.clone()).await.unwrap();
        let mut bytes = entry;
        bytes[0..8].copy_from_slice(&base_offset.to_le_bytes());
        stored.push(Stored {
            base_offset,
            message_count: 3,
            bytes,
        });
    }
    stored
}

/// The spans hold exactly the stored entries `entries[first..]` up to some end, whole, with
/// their headers: returns how many entries.
fn assert_spans_are_stored_entries(
    spans: &VerifiedSpans,
    entries: &[Stored],
    first: usize,
) -> usize {
    let bytes = spans.to_vec();
    assert_eq!(bytes.len() as u64, spans.size_bytes());
    let mut at = 0;
    let mut index = first;
    while at < bytes.len() {
        let entry = &entries[index].bytes;
        assert_eq!(
            &bytes[at..at + entry.len()],
            entry.as_slice(),
            "entry {index}"
        );
        assert_eq!(
            spans.entry_headers()[index - first].as_slice(),
            &entry[..ENTRY_HEADER_SIZE]
        );
        at += entry.len();
        index += 1;
    }
    assert_eq!(spans.entry_headers().len(), index - first);
    index - first
}

#[test]
fn issue12_2_read_spans_are_the_stored_entries_across_sealed_and_active_segments_and_retention() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), small_segments())
            .await
            .unwrap();
        let entries = append_entries(&log, 40).await;
        // Keep about three segments: retention deletes the oldest sealed ones.
        let policy = RetentionPolicy {
            bytes_max: Some(3 * 4096),
            age_max: None,
        };
        let outcome = log
            .apply_retention(policy, SystemTime::now())
            .await
            .unwrap();
        let first_offset = log.first_offset();
        assert!(first_offset > 0, "{outcome:?}");
        let first = entries
            .iter()
            .position(|entry| entry.base_offset == first_offset)
            .unwrap();
        for (index, entry) in entries.iter().enumerate().skip(first) {
            // From an entry's first offset and from inside it, bounded by count and by bytes.
            for offset in [entry.base_offset, entry.base_offset + 2] {
                let spans = log.read_spans(offset, 7, 3000).await.unwrap();
                let count = assert_spans_are_stored_entries(&spans, &entries, index);
                assert!(count >= 1);
                assert!(
                    spans.spans().iter().all(storage::VerifiedSpan::is_mapped),
                    "written pages are in the page cache: every span is mapped"
                );
                assert_eq!(log.read(offset, 7, 3000).await.unwrap(), spans.to_vec());
            }
        }
        // One read of everything crosses every roll, into the active segment.
        let spans = log
            .read_spans(first_offset, u32::MAX, usize::MAX)
            .await
            .unwrap();
        assert_eq!(
            assert_spans_are_stored_entries(&spans, &entries, first),
            40 - first
        );
        assert!(spans.spans().len() >= 3, "{} spans", spans.spans().len());
        assert_eq!(
            spans.spans()[0].path(),
            segment_path(dir.path(), first_offset).as_path()
        );
        assert_eq!(spans.spans()[0].position(), 0);
        // Caught up: no span; below the floor: retained.
        assert!(log.read_spans(120, 7, 3000).await.unwrap().is_empty());
        assert!(matches!(
            log.read_spans(first_offset - 1, 7, 3000).await,
            Err(LogError::OffsetRetained { .. })
        ));
        // Spans outlive the segment they map: retention deletes it, the bytes stay readable.
        let held = log.read_spans(first_offset, 7, 3000).await.unwrap();
        let policy = RetentionPolicy {
            bytes_max: Some(4096),
            age_max: None,
        };
        log.apply_retention(policy, SystemTime::now())
            .await
            .unwrap();
        assert!(!segment_path(dir.path(), first_offset).exists());
        assert_spans_are_stored_entries(&held, &entries, first);
        log.close().await.unwrap();
    });
}

#[test]
fn issue12_2_a_span_not_in_the_page_cache_is_read_with_a_copy_then_mapped() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), small_segments())
            .await
            .unwrap();
        let entries = append_entries(&log, 10).await;
        // Segment 0 is sealed and fsynced (clean): drop its pages before any read maps it.
        let sealed = std::fs::File::open(segment_path(dir.path(), 0)).unwrap();
        // SAFETY: posix_fadvise on a descriptor we own; advice only.
        let advised =
            unsafe { libc::posix_fadvise(sealed.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(advised, 0);
        let spans = log.read_spans(0, 3, 4096).await.unwrap();
        assert_eq!(assert_spans_are_stored_entries(&spans, &entries, 0), 1);
        assert!(
            !spans.spans()[0].is_mapped(),
            "not in the page cache: read through io_uring with a copy"
        );
        // That read brought the pages in: the next one is served from the mapping.
        let spans = log.read_spans(0, 3, 4096).await.unwrap();
        assert_eq!(assert_spans_are_stored_entries(&spans, &entries, 0), 1);
        assert!(spans.spans()[0].is_mapped());
        log.close().await.unwrap();
    });
}

/// Flips one payload byte in place (no truncation: the file keeps its size, as bit rot would).
fn flip_byte(path: &Path, position: u64) {
    use std::os::unix::fs::FileExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
        .unwrap();
    let mut byte = [0u8];
    file.read_exact_at(&mut byte, position).unwrap();
    file.write_all_at(&[byte[0] ^ 0x20], position).unwrap();
    file.sync_all().unwrap();
}

#[test]
fn issue12_2_damage_in_a_sealed_and_in_the_active_segment_fails_the_read_that_starts_at_it() {
    let dir = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(dir.path(), small_segments())
            .await
            .unwrap();
        let entries = append_entries(&log, 10).await;
        // Entries 0..7 fill segment 0 (sealed); 7..10 are the active segment at offset 21.
        let entry_size = entries[0].bytes.len() as u64;
        let active_base = entries[7].base_offset;
        assert_eq!(active_base, 21);
        // Read both first, so the damage lands under mappings already made.
        assert!(
            !log.read_spans(0, u32::MAX, usize::MAX)
                .await
                .unwrap()
                .is_empty()
        );
        for (segment, entry_index, position) in [
            (segment_path(dir.path(), 0), 2usize, 2 * entry_size),
            (segment_path(dir.path(), active_base), 8, entry_size),
        ] {
            flip_byte(&segment, position + ENTRY_HEADER_SIZE as u64 + 100);
            let damaged = &entries[entry_index];
            match log
                .read_spans(damaged.base_offset, u32::MAX, usize::MAX)
                .await
            {
                Err(LogError::Corrupt {
                    path,
                    position: at,
                    reason,
                }) => {
                    assert_eq!((path, at), (segment.clone(), position), "{reason}");
                    assert!(reason.contains("payload checksum"), "{reason}");
                }
                other => panic!("expected Corrupt, got {other:?}"),
            }
            // A read from before the damage returns the intact entries before it.
            let before = entries[entry_index - 1].base_offset;
            let spans = log.read_spans(before, u32::MAX, usize::MAX).await.unwrap();
            assert_eq!(
                assert_spans_are_stored_entries(&spans, &entries, entry_index - 1),
                1
            );
            // Past it the log reads again.
            let after = damaged.base_offset + damaged.message_count;
            let spans = log.read_spans(after, 3, 4096).await.unwrap();
            assert_eq!(
                assert_spans_are_stored_entries(&spans, &entries, entry_index + 1),
                1
            );
        }
        log.close().await.unwrap();
    });
}
