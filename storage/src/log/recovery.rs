//! Opening a log directory: list the segments, check they follow each other, load closed segments
//! from their index files (or rescan them), and scan the last segment entry by entry, truncating a
//! torn tail. A damaged closed segment is an error here, never skipped or truncated; in the last
//! segment, a complete damaged entry (whole in the file, failing only its payload checks), or a
//! damaged entry followed by a valid entry anywhere after it (found by resynchronising byte by
//! byte within a work budget, since entry headers carry no checksum; a spent budget counts as
//! found), is never cut before its bytes are kept in a quarantine file beside the segment; when
//! that copy fails, nothing is cut and no partial copy stays.

use std::collections::VecDeque;
use std::io;
use std::path::{Path, PathBuf};

use compio::BufResult;
use compio::fs::{File, OpenOptions};
use compio::io::AsyncWriteAtExt;

use super::index::SegmentIndex;
use super::producer_state::{ProducerStates, RecoveredProducers, recover_producers};
use super::retention::{read_retention_floor, remove_segment_files, retention_floor_path};
use super::sealed::{SealedSegment, SealedSegments};
use super::verify::{
    CandidateStep, Resync, ResyncBudget, ResyncCandidate, check_entry_header, check_entry_payload,
    damage_verdict, direct_write_padding_len, is_direct_write_padding, resync_entry_header,
};
use super::{LogError, Quarantine, RecoveryReport, Segment};
use crate::durable::{
    DurableError, create_dir_durable, durable_replace, list_dir_names, read_exact_append,
    read_exact_at, read_verified, sync_dir,
};
use crate::entry::{
    ENTRY_HEADER_SIZE, EntryHeader, MESSAGE_HEADER_SIZE, ProducerBatch, producer_stamp,
};
use crate::limits::{
    PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX, QUARANTINE_FILE_NAME_ATTEMPT_COUNT_MAX,
    RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES, SCAN_CHUNK_BYTES,
};
use crate::space::{FreeBytes, free_bytes};

/// `{base_offset:020}.log` in `dir`.
pub(super) fn segment_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

/// `{base_offset:020}.index` in `dir`.
pub(super) fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

/// The base offset of a segment file name, if `name` is exactly `{base_offset:020}.log`.
fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".log")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

pub(super) fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> LogError {
    let path = path.to_path_buf();
    move |source| LogError::Io { path, op, source }
}

fn durable_error(error: DurableError) -> LogError {
    match error {
        DurableError::Io { path, op, source } => LogError::Io { path, op, source },
        DurableError::Corrupt { path, reason } => LogError::Corrupt {
            path,
            position: 0,
            reason,
        },
    }
}

/// The state `PartitionLog::open` starts from.
#[derive(Debug)]
pub(super) struct Recovered {
    /// The closed segments, by summary (their indexes were checked and are read again on demand).
    pub(super) sealed: SealedSegments,
    /// The last segment, with its whole index and its file open read-write.
    pub(super) active: Segment,
    pub(super) report: RecoveryReport,
    /// The producer state at the end of the log, and the snapshot files kept.
    pub(super) producers: RecoveredProducers,
}

pub(super) async fn recover(dir: &Path) -> Result<Recovered, LogError> {
    create_log_dir(dir).await?;
    let floor = read_retention_floor(dir).await?;
    let (below_floor, base_offsets) = split_at_floor(dir, list_segments(dir).await?, floor)?;
    let mut report = RecoveryReport::default();
    let mut sealed = SealedSegments::default();

    let Some((&last_base_offset, closed_base_offsets)) = base_offsets.split_last() else {
        if floor > 0 {
            return Err(missing_from_floor(dir, floor));
        }
        let path = segment_path(dir, 0);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(io_error(&path, "create segment"))?;
        sync_dir(dir).await.map_err(io_error(
            dir,
            "fsync log directory after creating a segment",
        ))?;
        report.segment_count = 1;
        return Ok(Recovered {
            sealed,
            active: Segment {
                path,
                file: Some(file),
                index: SegmentIndex::empty(0),
            },
            report,
            producers: RecoveredProducers::default(),
        });
    };

    let mut expected_base_offset = None;
    // Only the last closed segments keep their index past this loop: producer recovery may read
    // them (FORMAT.md section 3, "Open", step 4a). The others are summaries (issue 11 section 4).
    let mut last_closed: VecDeque<Segment> =
        VecDeque::with_capacity(PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX + 1);
    for &base_offset in closed_base_offsets {
        let path = segment_path(dir, base_offset);
        check_follows(&path, base_offset, expected_base_offset)?;
        let (segment, scanned) = open_closed_segment(dir, path, base_offset).await?;
        report.scanned_segment_count += u32::from(scanned);
        report.entry_count += segment.index.rows.len() as u64;
        expected_base_offset = Some(segment.index.end_offset);
        sealed.push_summary(SealedSegment::of(&segment.index));
        last_closed.push_back(segment);
        if last_closed.len() > PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX {
            last_closed.pop_front();
        }
    }

    let path = segment_path(dir, last_base_offset);
    check_follows(&path, last_base_offset, expected_base_offset)?;
    let (segment, cut, last_producer_batches) = open_last_segment(path, last_base_offset).await?;
    report.scanned_segment_count += 1;
    let producers = recover_producers(
        dir,
        last_closed.make_contiguous(),
        last_base_offset,
        last_producer_batches,
    )
    .await?;
    report.producer_batches = producers.states.batches_in_log_order();
    report.truncated_bytes = cut.truncated_bytes;
    report.direct_padding_bytes = cut.direct_padding_bytes;
    report.quarantined = cut.quarantined;
    report.entry_count += segment.index.rows.len() as u64;
    report.next_offset = segment.index.end_offset;
    report.segment_count = sealed.len() as u32 + 1;
    complete_retention(dir, floor, &below_floor).await?;
    Ok(Recovered {
        sealed,
        active: segment,
        report,
        producers,
    })
}

/// Creates the partition directory durably (see `durable::create_dir_durable`).
async fn create_log_dir(dir: &Path) -> Result<(), LogError> {
    create_dir_durable(dir)
        .await
        .map_err(|failed| io_error(&failed.path, failed.step)(failed.source))
}

/// Base offsets of the segment files in `dir`, ascending. Other files (index files, `.tmp` files
/// of an interrupted index write) are skipped. Listing uses `std::fs::read_dir` on compio's
/// blocking pool: `io_uring` has no getdents operation.
async fn list_segments(dir: &Path) -> Result<Vec<u64>, LogError> {
    let names = list_dir_names(dir)
        .await
        .map_err(io_error(dir, "list log directory"))?;
    let mut base_offsets = Vec::new();
    for name in names {
        if let Some(base_offset) = parse_segment_name(&name) {
            base_offsets.push(base_offset);
        } else if Path::new(&name)
            .extension()
            .is_some_and(|extension| extension == "log")
        {
            tracing::warn!(dir = %dir.display(), file = %name, "ignoring a .log file that is not named {{base_offset:020}}.log");
        }
    }
    base_offsets.sort_unstable();
    Ok(base_offsets)
}

/// Splits `base_offsets` at the retention `floor` (issue 11 section 4) into the segments below
/// it and those kept. A partition log starts at its floor (0 without a floor file), so a first
/// segment kept that starts later means segments at or above the floor were lost: damage
/// (reading on would serve a gap). A retention pass writes the floor durably before it deletes,
/// so segments below the floor are a deletion a crash interrupted, which open completes once
/// the rest of the log checks out (`complete_retention`).
///
/// # Errors
/// `Corrupt` naming the first segment kept when it starts after the floor.
fn split_at_floor(
    dir: &Path,
    mut base_offsets: Vec<u64>,
    floor: u64,
) -> Result<(Vec<u64>, Vec<u64>), LogError> {
    let kept_from = base_offsets.partition_point(|&base_offset| base_offset < floor);
    let kept = base_offsets.split_off(kept_from);
    if let Some(&first_base_offset) = kept.first()
        && first_base_offset != floor
    {
        let starts_at = if floor == 0 {
            "a partition log starts at offset 0".to_owned()
        } else {
            format!(
                "the retention floor ({}) is {floor}",
                retention_floor_path(dir).display()
            )
        };
        return Err(LogError::Corrupt {
            path: segment_path(dir, first_base_offset),
            position: 0,
            reason: format!(
                "the first segment starts at offset {first_base_offset} but {starts_at}: the \
                 segments before it (from {}) are missing",
                segment_path(dir, floor).display()
            ),
        });
    }
    Ok((base_offsets, kept))
}

/// Deletes the files of the segments `below` the retention `floor` (a retention pass a crash
/// interrupted), then fsyncs the directory.
///
/// # Errors
/// `Io` naming a file that could not be deleted, or the directory that could not be fsynced.
async fn complete_retention(dir: &Path, floor: u64, below: &[u64]) -> Result<(), LogError> {
    if below.is_empty() {
        return Ok(());
    }
    tracing::info!(
        dir = %dir.display(),
        floor,
        segment_count = below.len(),
        "completing a retention pass a restart interrupted: deleting the segments below the floor"
    );
    for &base_offset in below {
        remove_segment_files(dir, base_offset).await?;
    }
    sync_dir(dir).await.map_err(io_error(
        dir,
        "fsync log directory after deleting retained segments",
    ))
}

/// The error of a log whose retention floor is above 0 but that has no segment left: retention
/// never deletes the active segment, so the segment at the floor was lost.
fn missing_from_floor(dir: &Path, floor: u64) -> LogError {
    LogError::Corrupt {
        path: segment_path(dir, floor),
        position: 0,
        reason: format!(
            "the retention floor ({}) is {floor} but no segment from it on exists: the segments \
             from {} are missing",
            retention_floor_path(dir).display(),
            segment_path(dir, floor).display()
        ),
    }
}

fn check_follows(path: &Path, base_offset: u64, expected: Option<u64>) -> Result<(), LogError> {
    match expected {
        Some(expected) if expected != base_offset => Err(LogError::Corrupt {
            path: path.to_path_buf(),
            position: 0,
            reason: format!(
                "segment starts at offset {base_offset} but the previous segment ends at offset \
                 {expected}"
            ),
        }),
        _ => Ok(()),
    }
}

/// Loads a closed segment, from its index file when that verifies and matches the segment, else
/// by a strict scan (the file is opened read-only for it) after which the index file is
/// rewritten. Returns whether it scanned. The segment keeps no descriptor: reads open it.
async fn open_closed_segment(
    dir: &Path,
    path: PathBuf,
    base_offset: u64,
) -> Result<(Segment, bool), LogError> {
    let (index, scanned) = load_closed_index(dir, &path, base_offset).await?;
    if scanned {
        durable_replace(&index_path(dir, base_offset), index.encode())
            .await
            .map_err(durable_error)?;
    }
    Ok((
        Segment {
            path,
            file: None,
            index,
        },
        scanned,
    ))
}

/// The index of the closed segment at `path`: its index file when that verifies and matches the
/// segment file as it is now, else (logged) a strict scan of the segment. Returns whether it
/// scanned; writes nothing (open rewrites a rebuilt index file, reads of sealed segments leave
/// that to the next open).
///
/// # Errors
/// `Io` naming the file when it cannot be read; `Corrupt { path, position }` when the scan finds
/// an invalid entry (inside a closed segment that is damage, never a torn tail).
pub(super) async fn load_closed_index(
    dir: &Path,
    path: &Path,
    base_offset: u64,
) -> Result<(SegmentIndex, bool), LogError> {
    let size_bytes = compio::fs::metadata(path)
        .await
        .map_err(io_error(path, "stat segment"))?
        .len();
    let index_file = index_path(dir, base_offset);
    let why_scan = match read_verified(&index_file).await {
        Ok(Some(payload)) => match SegmentIndex::decode(&payload, base_offset, size_bytes) {
            Ok(index) => return Ok((index, false)),
            Err(reason) => reason,
        },
        Ok(None) => "index file missing".to_owned(),
        Err(DurableError::Corrupt { reason, .. }) => reason,
        Err(error @ DurableError::Io { .. }) => return Err(durable_error(error)),
    };
    tracing::warn!(
        segment = %path.display(),
        index = %index_file.display(),
        reason = %why_scan,
        "rescanning closed segment: its index file is not usable"
    );
    let file = File::open(path)
        .await
        .map_err(io_error(path, "open segment"))?;
    let scan = scan_segment(&file, path, base_offset, size_bytes).await?;
    drop(file);
    if let Some(torn) = scan.invalid {
        return Err(LogError::Corrupt {
            path: path.to_path_buf(),
            position: torn.position,
            reason: format!("in a closed segment: {}", torn.reason),
        });
    }
    Ok((scan.index, true))
}

/// The producer stamps of the entries in the last `RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES` of a
/// closed segment (the one before the last), found through its index with one read, in log
/// order: the last fallback when no producer-state snapshot is usable. An entry whose bytes do
/// not check out is skipped with a warning: reads report it as damage.
///
/// # Errors
/// `Io` naming the segment when it cannot be opened or read.
pub(super) async fn previous_segment_stamps(
    segment: &Segment,
) -> Result<Vec<ProducerBatch>, LogError> {
    let index = &segment.index;
    let tail_start = index
        .size_bytes
        .saturating_sub(RECOVERY_PREVIOUS_SEGMENT_TAIL_BYTES);
    let Some(first_row) = index
        .rows
        .iter()
        .position(|row| row.position >= tail_start)
        .or_else(|| index.rows.len().checked_sub(1))
    else {
        return Ok(Vec::new());
    };
    let file = File::open(&segment.path)
        .await
        .map_err(io_error(&segment.path, "open segment"))?;
    let mut producer_batches = Vec::new();
    stamps_of_rows(
        &file,
        segment,
        first_row..index.rows.len(),
        &mut producer_batches,
    )
    .await?;
    Ok(producer_batches)
}

/// The producer stamps of every entry of a closed segment, through its index, in log order, read
/// in chunks of at most `SCAN_CHUNK_BYTES` (or one entry, when larger): what the segments after
/// an older producer-state snapshot add to it. An entry whose bytes do not check out is skipped
/// with a warning: reads report it as damage.
///
/// # Errors
/// `Io` naming the segment when it cannot be opened or read.
pub(super) async fn closed_segment_stamps(
    segment: &Segment,
) -> Result<Vec<ProducerBatch>, LogError> {
    let index = &segment.index;
    let mut producer_batches = Vec::new();
    if index.rows.is_empty() {
        return Ok(producer_batches);
    }
    let file = File::open(&segment.path)
        .await
        .map_err(io_error(&segment.path, "open segment"))?;
    let mut first_row = 0;
    while first_row < index.rows.len() {
        let start = index.rows[first_row].position;
        let mut end_row = first_row + 1;
        while end_row < index.rows.len()
            && index.entry_end_position(end_row) - start <= SCAN_CHUNK_BYTES as u64
        {
            end_row += 1;
        }
        stamps_of_rows(&file, segment, first_row..end_row, &mut producer_batches).await?;
        first_row = end_row;
    }
    Ok(producer_batches)
}

/// Reads the entries of index rows `rows` of `segment` (adjacent, so one read) and appends their
/// producer stamps to `producer_batches`, skipping with a warning an entry that does not match
/// its index row or checksum.
async fn stamps_of_rows(
    file: &File,
    segment: &Segment,
    rows: std::ops::Range<usize>,
    producer_batches: &mut Vec<ProducerBatch>,
) -> Result<(), LogError> {
    let index = &segment.index;
    let start = index.rows[rows.start].position;
    let end = index.entry_end_position(rows.end - 1);
    let length = usize::try_from(end - start).unwrap_or(usize::MAX);
    let BufResult(result, bytes) = read_exact_append(file, start, length, Vec::new()).await;
    result.map_err(io_error(
        &segment.path,
        "read segment entries for producer stamps",
    ))?;
    for row_index in rows {
        let row = &index.rows[row_index];
        let entry_start = (row.position - start) as usize;
        let entry_end = (index.entry_end_position(row_index) - start) as usize;
        let entry = &bytes[entry_start..entry_end];
        let Some(header) = EntryHeader::decode(entry) else {
            continue;
        };
        let payload = &entry[ENTRY_HEADER_SIZE..];
        if header.base_offset != row.base_offset
            || header.length as usize != payload.len()
            || check_entry_payload(&header, payload).is_err()
        {
            tracing::warn!(
                segment = %segment.path.display(), position = row.position,
                "entry does not match its index or checksum; its producer stamp is not recovered"
            );
            continue;
        }
        if let Some((producer, sequence)) = producer_stamp(payload) {
            producer_batches.push(ProducerBatch {
                producer,
                sequence,
                message_count: header.message_count,
                base_offset: header.base_offset,
            });
        }
    }
    Ok(())
}

/// What opening the last segment cut from it.
#[derive(Debug, Default)]
struct TailCut {
    /// Bytes cut (0 if the segment was clean), direct-write padding not included.
    truncated_bytes: u64,
    /// Zero padding of a direct write cut (`verify::is_direct_write_padding`).
    direct_padding_bytes: u64,
    /// Set when valid entries followed the damage: where their bytes were kept.
    quarantined: Option<Quarantine>,
}

/// Opens the last segment read-write and scans it; the first invalid entry starts the cut, which
/// is truncated and fsynced. When `damage_verdict` keeps it (a complete entry, valid entries after
/// it, or a resync search out of budget; see `valid_entries_after_damage`), the bytes cut are
/// first kept durably in a quarantine file and an error is logged; if that fails, the segment is left as it is and the
/// error returned (`LogError::QuarantineFailed`). Returns what was cut and the stamped batches
/// kept.
async fn open_last_segment(
    path: PathBuf,
    base_offset: u64,
) -> Result<(Segment, TailCut, Vec<ProducerBatch>), LogError> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .await
        .map_err(io_error(&path, "open segment"))?;
    let size_bytes = file
        .metadata()
        .await
        .map_err(io_error(&path, "stat segment"))?
        .len();
    let scan = scan_segment(&file, &path, base_offset, size_bytes).await?;
    let mut cut = TailCut::default();
    if let Some(invalid) = &scan.invalid
        && is_padding(&file, &path, invalid.position, size_bytes).await?
    {
        cut.direct_padding_bytes = size_bytes - invalid.position;
        tracing::info!(
            segment = %path.display(),
            position = invalid.position,
            padding_bytes = cut.direct_padding_bytes,
            "cutting the zero padding past the last entry (all zeros up to a 4096-byte boundary, \
             as a direct write pads; zeros hold no entry, so nothing acknowledged is lost)"
        );
        file.set_len(invalid.position)
            .await
            .map_err(io_error(&path, "cut direct-write padding"))?;
        file.sync_all()
            .await
            .map_err(io_error(&path, "fsync after cutting direct-write padding"))?;
    } else if let Some(invalid) = scan.invalid {
        cut.truncated_bytes = size_bytes - invalid.position;
        let mut budget = ResyncBudget::new(size_bytes - invalid.position);
        let resync = valid_entries_after_damage(
            &file,
            &path,
            scan.index.end_offset,
            invalid.position,
            size_bytes,
            &mut budget,
        )
        .await?;
        let end_offset = scan.index.end_offset;
        if let Some(last_offset) = damage_verdict(invalid.complete, resync, end_offset) {
            let mut quarantine =
                quarantine_tail(&file, &path, &invalid, size_bytes, end_offset, last_offset)
                    .await?;
            quarantine.resync_charged_bytes = budget.charged();
            tracing::error!(
                segment = %path.display(),
                position = invalid.position,
                offsets = %format_args!("{}-{}", quarantine.first_offset, quarantine.last_offset),
                quarantine = %quarantine.path.display(),
                truncated_bytes = cut.truncated_bytes,
                reason = %invalid.reason,
                resync = ?resync,
                "damaged entry in the last segment that may have been acknowledged (it is \
                 complete, or valid entries follow it, or the search for them ran out of budget), \
                 so it is treated as interior damage, not a torn write: its bytes and everything \
                 after them were copied to the quarantine file, then the segment was truncated at \
                 the damage"
            );
            cut.quarantined = Some(quarantine);
        } else {
            tracing::warn!(
                segment = %path.display(),
                position = invalid.position,
                truncated_bytes = cut.truncated_bytes,
                reason = %invalid.reason,
                "truncating the torn tail of the last segment"
            );
        }
        file.set_len(invalid.position)
            .await
            .map_err(io_error(&path, "truncate torn tail"))?;
        file.sync_all()
            .await
            .map_err(io_error(&path, "fsync after truncating torn tail"))?;
    }
    assert_eq!(
        scan.index.size_bytes,
        size_bytes - cut.truncated_bytes - cut.direct_padding_bytes
    );
    Ok((
        Segment {
            path,
            file: Some(file),
            index: scan.index,
        },
        cut,
        scan.producer_batches.into(),
    ))
}

/// Whether the bytes of the last segment from `position` (after its last valid entry) to its end
/// (`size_bytes`) are the zero padding of a direct write (`verify::is_direct_write_padding`);
/// reads them (less than one alignment unit) only when the sizes allow it.
async fn is_padding(
    file: &File,
    path: &Path,
    position: u64,
    size_bytes: u64,
) -> Result<bool, LogError> {
    let Some(len) = direct_write_padding_len(position, size_bytes) else {
        return Ok(false);
    };
    let tail = read_exact_at(file, position, len)
        .await
        .map_err(io_error(path, "read the tail of the last segment"))?;
    Ok(is_direct_write_padding(position, size_bytes, &tail))
}

/// Whether valid entries follow the first invalid entry of the last segment, by resynchronising:
/// from the byte after the damage, the first position where a valid entry starts
/// (`resync_entry_header` with a base offset at least `end_offset`, the end of the valid entries
/// before the damage, and a payload passing `check_entry_payload`). Entry headers carry no
/// checksum, so a damaged header (offset, count or length) cannot say where the next entry
/// starts: searching byte by byte finds it anyway. Returns the last offset of the valid entries
/// that run back to back from there (`Resync::Found`), `Resync::NotFound`, or
/// `Resync::BudgetSpent` when the candidates' payloads charged to `budget` would exceed it (a
/// crafted payload of fake headers could otherwise make the search quadratic in the bytes after
/// the damage). The search reads each byte after the damage once plus the payloads of candidate
/// headers, bounded by `budget`, and runs only on the damage path. A torn group write can leave
/// valid-looking entries after an invalid one too (pages reach the disk in any order), but none
/// of those was acknowledged; interior damage may hit acknowledged entries, so the caller keeps
/// the bytes either way.
async fn valid_entries_after_damage(
    file: &File,
    path: &Path,
    end_offset: u64,
    damage_position: u64,
    size_bytes: u64,
    budget: &mut ResyncBudget,
) -> Result<Resync, LogError> {
    let mut reader = ChunkReader {
        file,
        size_bytes,
        buffer: Vec::new(),
        buffer_position: 0,
    };
    let mut position = damage_position + 1;
    while size_bytes.saturating_sub(position) >= ENTRY_HEADER_SIZE as u64 {
        let run = valid_run_at(
            &mut reader,
            path,
            damage_position,
            position,
            end_offset,
            budget,
        )
        .await?;
        if run != Resync::NotFound {
            return Ok(run);
        }
        position += 1;
    }
    Ok(Resync::NotFound)
}

/// The valid entries running back to back from `start` (after the damage at `damage_position`),
/// the first of which passes `resync_entry_header` with `min_base_offset`: `Resync::Found` with
/// the last offset of the run, `NotFound`
/// when no valid entry starts there, `BudgetSpent` when a candidate's payload would exceed
/// `budget` (charged after its header passes, before its payload is framed or hashed).
async fn valid_run_at(
    reader: &mut ChunkReader<'_>,
    path: &Path,
    damage_position: u64,
    start: u64,
    min_base_offset: u64,
    budget: &mut ResyncBudget,
) -> Result<Resync, LogError> {
    let size_bytes = reader.size_bytes;
    let mut position = start;
    let mut expected_offset: Option<u64> = None;
    while size_bytes - position >= ENTRY_HEADER_SIZE as u64 {
        let header_bytes = reader
            .bytes(position, ENTRY_HEADER_SIZE)
            .await
            .map_err(io_error(path, "read segment"))?;
        let header = EntryHeader::decode(header_bytes).expect("ChunkReader returned 32 bytes");
        let bytes_left = size_bytes - position;
        let entry_size = match expected_offset {
            None => resync_entry_header(
                &header,
                min_base_offset,
                start - damage_position,
                bytes_left,
            ),
            Some(expected) => check_entry_header(&header, expected, bytes_left).ok(),
        };
        let Some(entry_size) = entry_size else {
            break;
        };
        let payload_position = position + ENTRY_HEADER_SIZE as u64;
        match walk_candidate(reader, path, payload_position, &header, budget).await? {
            CandidateStep::Check => {}
            CandidateStep::BudgetSpent => return Ok(Resync::BudgetSpent),
            CandidateStep::Refused | CandidateStep::Read(_) => break,
        }
        let payload = reader
            .bytes(payload_position, header.length as usize)
            .await
            .map_err(io_error(path, "read segment"))?;
        if check_entry_payload(&header, payload).is_err() {
            break;
        }
        expected_offset = Some(header.base_offset + u64::from(header.message_count));
        position += entry_size;
    }
    Ok(match expected_offset {
        Some(end) => Resync::Found {
            last_offset: end - 1,
        },
        None => Resync::NotFound,
    })
}

/// Drives a resync candidate's framing walk (`verify::ResyncCandidate`, which charges `budget`)
/// over the file: `Check` when its framing fits and its whole payload is charged, `Refused` or
/// `BudgetSpent` otherwise. Reads message headers only, never the payload.
async fn walk_candidate(
    reader: &mut ChunkReader<'_>,
    path: &Path,
    payload_position: u64,
    header: &EntryHeader,
    budget: &mut ResyncBudget,
) -> Result<CandidateStep, LogError> {
    let mut candidate = ResyncCandidate::new(header, payload_position);
    loop {
        match candidate.next(budget) {
            CandidateStep::Read(at) => {
                let message_header = reader
                    .bytes(at, MESSAGE_HEADER_SIZE)
                    .await
                    .map_err(io_error(path, "read segment"))?;
                candidate.feed(message_header);
            }
            step => return Ok(step),
        }
    }
}

/// Keeps the bytes of the last segment from the damaged entry to its end in a quarantine file
/// beside it, durably: reuses a quarantine file of this damage that already holds exactly these
/// bytes (a crash between an earlier copy and its truncation), else copies them to a new one.
async fn quarantine_tail(
    file: &File,
    path: &Path,
    invalid: &Invalid,
    size_bytes: u64,
    first_offset: u64,
    last_offset: u64,
) -> Result<Quarantine, LogError> {
    let tail = Tail {
        file,
        segment: path,
        position: invalid.position,
        size_bytes,
    };
    let quarantine_path = match tail.existing_copy().await? {
        Some(existing) => {
            tracing::warn!(
                segment = %path.display(),
                position = invalid.position,
                quarantine = %existing.display(),
                "an earlier open already copied the damaged tail to this quarantine file (same \
                 size and bytes); reusing it"
            );
            existing
        }
        None => tail.copy_to_new_file().await?,
    };
    Ok(Quarantine {
        segment: path.to_path_buf(),
        position: invalid.position,
        path: quarantine_path,
        size_bytes: size_bytes - invalid.position,
        first_offset,
        last_offset,
        resync_charged_bytes: 0,
    })
}

/// The bytes of the last segment from a damaged entry (`position`) to its end (`size_bytes`).
struct Tail<'a> {
    file: &'a File,
    segment: &'a Path,
    position: u64,
    size_bytes: u64,
}

impl Tail<'_> {
    fn length(&self) -> u64 {
        self.size_bytes - self.position
    }

    /// `{segment}.damaged-at-{position}`, then its `.N` names, in order.
    fn candidate_names(&self) -> impl Iterator<Item = PathBuf> + use<> {
        let base_name = quarantine_name(self.segment, self.position);
        (0..QUARANTINE_FILE_NAME_ATTEMPT_COUNT_MAX).map(move |attempt| {
            if attempt == 0 {
                base_name.clone()
            } else {
                PathBuf::from(format!("{}.{attempt}", base_name.display()))
            }
        })
    }

    /// The error of a failed quarantine step `op` on `path`, with the free space now.
    fn failed(&self, path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> LogError {
        let dir = self.segment.parent().unwrap_or(Path::new("."));
        let free_bytes = FreeBytes(free_bytes(dir));
        let segment = self.segment.to_path_buf();
        let path = path.to_path_buf();
        let (position, size_bytes) = (self.position, self.length());
        move |source| LogError::QuarantineFailed {
            segment,
            position,
            size_bytes,
            path,
            op,
            free_bytes,
            source,
        }
    }

    /// A quarantine file of this damage whose size and bytes equal the tail's, if any.
    async fn existing_copy(&self) -> Result<Option<PathBuf>, LogError> {
        for candidate in self.candidate_names() {
            let Ok(metadata) = compio::fs::metadata(&candidate).await else {
                continue;
            };
            if metadata.len() == self.length() && self.equals_file(&candidate).await? {
                return Ok(Some(candidate));
            }
        }
        Ok(None)
    }

    /// Whether `candidate` (of the tail's length) holds the tail's bytes, compared chunk by chunk.
    async fn equals_file(&self, candidate: &Path) -> Result<bool, LogError> {
        let other = File::open(candidate)
            .await
            .map_err(io_error(candidate, "open quarantine file to compare"))?;
        let mut position = self.position;
        let (mut ours, mut theirs) = (Vec::new(), Vec::new());
        while position < self.size_bytes {
            let length = (self.size_bytes - position).min(SCAN_CHUNK_BYTES as u64) as usize;
            ours.clear();
            theirs.clear();
            let BufResult(result, filled) =
                read_exact_append(self.file, position, length, ours).await;
            result.map_err(io_error(self.segment, "read the damaged tail to compare"))?;
            ours = filled;
            let BufResult(result, filled) =
                read_exact_append(&other, position - self.position, length, theirs).await;
            result.map_err(io_error(candidate, "read quarantine file to compare"))?;
            theirs = filled;
            if ours != theirs {
                return Ok(false);
            }
            position += length as u64;
        }
        Ok(true)
    }

    /// Copies the tail to a new quarantine file, durably (write, fsync the file, fsync the
    /// directory). When a step fails the partial file is removed (best effort, logged) before
    /// the error returns, so a failed open leaves no file behind.
    async fn copy_to_new_file(&self) -> Result<PathBuf, LogError> {
        let (quarantine_path, quarantine_file) = self.create_file().await?;
        let copied = self.copy_to(&quarantine_path, &quarantine_file).await;
        drop(quarantine_file);
        if let Err(error) = copied {
            if let Err(remove_error) = compio::fs::remove_file(&quarantine_path).await {
                tracing::warn!(
                    quarantine = %quarantine_path.display(),
                    error = %remove_error,
                    "cannot remove the partial quarantine file; remove it by hand"
                );
            }
            return Err(error);
        }
        Ok(quarantine_path)
    }

    async fn copy_to(
        &self,
        quarantine_path: &Path,
        quarantine_file: &File,
    ) -> Result<(), LogError> {
        let mut writer = quarantine_file;
        let mut position = self.position;
        let mut buffer = Vec::new();
        while position < self.size_bytes {
            let length = (self.size_bytes - position).min(SCAN_CHUNK_BYTES as u64) as usize;
            buffer.clear();
            let BufResult(result, filled) =
                read_exact_append(self.file, position, length, buffer).await;
            result.map_err(io_error(
                self.segment,
                "read the damaged tail to quarantine",
            ))?;
            let BufResult(result, written) =
                writer.write_all_at(filled, position - self.position).await;
            result.map_err(self.failed(quarantine_path, "write"))?;
            buffer = written;
            position += length as u64;
        }
        quarantine_file
            .sync_all()
            .await
            .map_err(self.failed(quarantine_path, "fsync"))?;
        let dir = self.segment.parent().unwrap_or(Path::new("."));
        sync_dir(dir)
            .await
            .map_err(self.failed(dir, "fsync of the directory after creating"))
    }

    /// Creates the first free name of [`Tail::candidate_names`] with `O_EXCL`.
    async fn create_file(&self) -> Result<(PathBuf, File), LogError> {
        for candidate in self.candidate_names() {
            match OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(&candidate)
                .await
            {
                Ok(file) => return Ok((candidate, file)),
                Err(error) if error.kind() == io::ErrorKind::AlreadyExists => {}
                Err(error) => return Err(self.failed(&candidate, "create")(error)),
            }
        }
        Err(LogError::Io {
            path: quarantine_name(self.segment, self.position),
            op: "create quarantine file (every numbered name is taken; move the old ones away)",
            source: io::Error::from(io::ErrorKind::AlreadyExists),
        })
    }
}

/// `{segment file name}.damaged-at-{position}` beside the segment.
pub(super) fn quarantine_name(segment: &Path, position: u64) -> PathBuf {
    let mut name = segment.as_os_str().to_owned();
    name.push(format!(".damaged-at-{position}"));
    PathBuf::from(name)
}

/// The first entry that does not check out, and why.
#[derive(Debug)]
struct Invalid {
    position: u64,
    reason: String,
    /// `Some(its last offset)` when the entry is complete: its header passes the rules (so it
    /// lies whole in the file) and only its payload fails `check_entry_payload`.
    complete: Option<u64>,
}

#[derive(Debug)]
struct Scan {
    /// Every valid entry before the first invalid one.
    index: SegmentIndex,
    invalid: Option<Invalid>,
    /// The producer state of the valid entries' stamps (bounded per producer and in producers).
    producer_batches: ProducerStates,
}

/// Reads a segment entry by entry, checking each: the header fits, the entry is at most
/// `ENTRY_SIZE_MAX`, `message_count >= 1`, `base_offset` is the next expected offset, the payload
/// fits, its XXH3-64 equals the header's checksum, and its messages match the header
/// (`check_entry_payload`). Stops at the first entry that fails.
/// Folds the producer stamps of the valid entries into a bounded producer state.
async fn scan_segment(
    file: &File,
    path: &Path,
    base_offset: u64,
    size_bytes: u64,
) -> Result<Scan, LogError> {
    let mut index = SegmentIndex::empty(base_offset);
    let mut producer_batches = ProducerStates::default();
    let mut reader = ChunkReader {
        file,
        size_bytes,
        buffer: Vec::new(),
        buffer_position: 0,
    };
    let invalid = loop {
        let position = index.size_bytes;
        if position == size_bytes {
            break None;
        }
        let remaining = size_bytes - position;
        let invalid = |reason: String| {
            Some(Invalid {
                position,
                reason,
                complete: None,
            })
        };
        if remaining < ENTRY_HEADER_SIZE as u64 {
            break invalid(format!(
                "{remaining} bytes left, less than the {ENTRY_HEADER_SIZE}-byte entry header"
            ));
        }
        let header_bytes = reader
            .bytes(position, ENTRY_HEADER_SIZE)
            .await
            .map_err(io_error(path, "read segment"))?;
        let header = EntryHeader::decode(header_bytes).expect("ChunkReader returned 32 bytes");
        let entry_size = match check_entry_header(&header, index.end_offset, remaining) {
            Ok(entry_size) => entry_size,
            Err(reason) => break invalid(reason),
        };
        let payload = reader
            .bytes(position + ENTRY_HEADER_SIZE as u64, header.length as usize)
            .await
            .map_err(io_error(path, "read segment"))?;
        if let Err(reason) = check_entry_payload(&header, payload) {
            break Some(Invalid {
                position,
                reason,
                complete: Some(header.base_offset + u64::from(header.message_count) - 1),
            });
        }
        if let Some((producer, sequence)) = producer_stamp(payload) {
            producer_batches.record(ProducerBatch {
                producer,
                sequence,
                message_count: header.message_count,
                base_offset: header.base_offset,
            });
        }
        index.push(header.base_offset, header.message_count, entry_size);
    };
    Ok(Scan {
        index,
        invalid,
        producer_batches,
    })
}

/// Sequential reads of a file in [`SCAN_CHUNK_BYTES`] chunks, reusing one buffer.
struct ChunkReader<'a> {
    file: &'a File,
    size_bytes: u64,
    buffer: Vec<u8>,
    /// File position of `buffer[0]`.
    buffer_position: u64,
}

impl ChunkReader<'_> {
    /// Bytes `position..position + length`, which must lie within the file.
    async fn bytes(&mut self, position: u64, length: usize) -> io::Result<&[u8]> {
        let end = position + length as u64;
        assert!(end <= self.size_bytes, "ChunkReader reads within the file");
        let buffered_end = self.buffer_position + self.buffer.len() as u64;
        if position < self.buffer_position || end > buffered_end {
            let read_size = (length.max(SCAN_CHUNK_BYTES) as u64).min(self.size_bytes - position);
            let mut buffer = std::mem::take(&mut self.buffer);
            buffer.clear();
            let BufResult(result, buffer) =
                read_exact_append(self.file, position, read_size as usize, buffer).await;
            self.buffer = buffer;
            self.buffer_position = position;
            if let Err(error) = result {
                self.buffer.clear();
                return Err(error);
            }
        }
        let start = (position - self.buffer_position) as usize;
        Ok(&self.buffer[start..start + length])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn segment_names_are_exact() {
        assert_eq!(parse_segment_name("00000000000000000042.log"), Some(42));
        assert_eq!(
            parse_segment_name("18446744073709551615.log"),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_name("99999999999999999999.log"), None);
        assert_eq!(parse_segment_name("42.log"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.log"), None);
        assert_eq!(parse_segment_name("00000000000000000042.index"), None);
        assert_eq!(parse_segment_name("00000000000000000042.log.tmp"), None);
        assert_eq!(
            segment_path(Path::new("/d"), 42),
            PathBuf::from("/d/00000000000000000042.log")
        );
    }
}
