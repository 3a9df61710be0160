//! `inspect segment`: walks the entries of partition log segments and judges each `.index` file
//! with the decision functions `PartitionLog::open` itself uses (`storage::log::verify`), so its
//! verdicts are open's: a closed segment whose index open uses is walked entry by entry along
//! that index (a damaged entry is reported alone, and the entries after it are still checked and
//! counted); any other segment is scanned by the rules of `storage/FORMAT.md` section 3, as open
//! scans it. Reads only; never truncates a torn tail nor rewrites an index.

use std::fmt::Write as _;
use std::io::{BufReader, Read as _, Seek as _, SeekFrom};
use std::path::{Path, PathBuf};

use storage::durable::TRAILER_SIZE;
use storage::entry::MESSAGE_HEADER_SIZE;
use storage::limits::{DURABLE_FILE_SIZE_MAX, SCAN_CHUNK_BYTES};
use storage::log::verify::{
    CandidateStep, ClosedSegmentIndex, IndexedEntry, Resync, ResyncBudget, ResyncCandidate,
    check_entry_header, check_entry_payload, closed_segment_index, damage_verdict,
    direct_write_padding_len, is_direct_write_padding, resync_entry_header,
};
use storage::{ENTRY_HEADER_SIZE, EntryHeader, checksum_covers_timestamp};
use twox_hash::XxHash3_64;

use super::{Damage, Report, open_read_only, read_bounded, segments_for};

#[derive(Debug, serde::Serialize)]
pub(crate) struct SegmentReport {
    segments: Vec<LogSegment>,
    segment_count: usize,
    /// Entries found: every entry of a segment walked along its index (damaged ones included),
    /// the valid entries before the first invalid one of a scanned segment.
    entry_count: u64,
    /// Messages of those entries.
    message_count: u64,
    /// Entries among them whose bytes do not match (the index row, a message checksum or the
    /// entry checksum).
    damaged_entry_count: u64,
    /// Messages of the damaged entries: a poll that reaches them gets an error.
    damaged_message_count: u64,
    /// One past the last entry's last offset (the next offset open would assign if every
    /// segment opens).
    next_offset: Option<u64>,
    size_bytes: u64,
    /// Files holding bytes open cut from the last segment after damage it keeps
    /// (`{base_offset:020}.log.damaged-at-{position}`): kept for the operator, not damage.
    quarantine_files: Vec<QuarantineFile>,
}

/// A quarantine file beside the segments (storage/FORMAT.md section 3, "Open").
#[derive(Debug, serde::Serialize)]
struct QuarantineFile {
    file: String,
    size_bytes: u64,
}

#[derive(Debug, serde::Serialize)]
struct LogSegment {
    file: String,
    base_offset: Option<u64>,
    size_bytes: u64,
    /// The active segment, where a torn tail is possible.
    last: bool,
    /// Zero bytes after the last entry of the last segment that open cuts as the padding of a
    /// direct write (`--write-mode direct`, `storage/FORMAT.md` section 3, "Write modes"): not
    /// damage. 0 when there are none.
    direct_padding_bytes: u64,
    entries: Vec<LogEntry>,
    index: IndexCheck,
}

#[derive(Debug, serde::Serialize)]
struct LogEntry {
    position: u64,
    base_offset: u64,
    message_count: u64,
    length_bytes: u64,
    base_timestamp_us: u64,
    /// The entry flags the timestamp rule (`storage/FORMAT.md` section 3): its checksum covers
    /// `base_timestamp_us`. False for entries written before the rule, whose timestamp retention
    /// by age takes as stored.
    timestamp_covered: bool,
    /// The header agrees with the index (when walked along one) and the payload's XXH3-64 equals
    /// the header's.
    checksum_ok: bool,
    /// Why the entry is damaged (absent when `checksum_ok`).
    #[serde(skip_serializing_if = "Option::is_none")]
    damage: Option<String>,
}

/// What open does with the segment's `.index` file.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum IndexCheck {
    /// No `{base:020}.index` (normal for the last segment; a closed one is then rescanned).
    Absent,
    /// Open uses it as the closed segment's index and does not scan the segment.
    UsedByOpen { row_count: u64 },
    /// Open does not use it: it rescans the closed segment and rewrites the index.
    RejectedByOpen { reason: String },
    /// The last segment is always scanned on open; its index file is not read.
    IgnoredByOpen,
    /// Not judged: the segment has no name to find it by.
    Unknown,
}

/// The entries of one segment, and where they end.
struct Walk {
    entries: Vec<LogEntry>,
    /// One past the last entry's last offset; `None` when unknown (no entry and no base offset).
    end_offset: Option<u64>,
    /// Byte position and reason of the first invalid entry of a scan (a walk along an index
    /// reports damaged entries in `entries` instead).
    invalid: Option<(u64, String)>,
    /// `Some(its last offset)` when that invalid entry is complete: its header passes the rules
    /// and only its payload fails `check_entry_payload` (open then keeps it whatever follows).
    invalid_complete: Option<u64>,
}

fn read_error(file: &Path) -> impl Fn(std::io::Error) -> anyhow::Error + '_ {
    move |error| anyhow::anyhow!("{}: cannot read: {error}", file.display())
}

/// Scans `file` as open scans a segment: entry by entry from byte 0, expecting the first at
/// `base_offset` (`None`: whatever it says), stopping at the first entry that breaks a rule.
fn scan(file: &Path, base_offset: Option<u64>, size_bytes: u64) -> anyhow::Result<Walk> {
    scan_from(file, 0, base_offset, size_bytes)
}

/// [`scan`] starting at byte `start` of `file`.
fn scan_from(
    file: &Path,
    start: u64,
    base_offset: Option<u64>,
    size_bytes: u64,
) -> anyhow::Result<Walk> {
    let mut opened = open_read_only(file)?;
    opened
        .seek(SeekFrom::Start(start))
        .map_err(read_error(file))?;
    let mut reader = BufReader::with_capacity(SCAN_CHUNK_BYTES, opened);
    let mut entries = Vec::new();
    let mut position = start;
    let mut next_offset = base_offset;
    let mut payload = Vec::new();
    let mut invalid_complete = None;
    let invalid = loop {
        if position == size_bytes {
            break None;
        }
        let left = size_bytes - position;
        if left < ENTRY_HEADER_SIZE as u64 {
            break Some(format!(
                "{left} bytes left, less than the {ENTRY_HEADER_SIZE}-byte entry header"
            ));
        }
        let mut header_bytes = [0u8; ENTRY_HEADER_SIZE];
        reader
            .read_exact(&mut header_bytes)
            .map_err(read_error(file))?;
        let Some(header) = EntryHeader::decode(&header_bytes) else {
            unreachable!("32 bytes decode");
        };
        let expected = *next_offset.get_or_insert(header.base_offset);
        let entry_size = match check_entry_header(&header, expected, left) {
            Ok(entry_size) => entry_size,
            Err(reason) => break Some(reason),
        };
        payload.resize(header.length as usize, 0);
        reader.read_exact(&mut payload).map_err(read_error(file))?;
        if let Err(reason) = check_entry_payload(&header, &payload) {
            invalid_complete = Some(expected + u64::from(header.message_count) - 1);
            break Some(reason);
        }
        entries.push(LogEntry {
            position,
            base_offset: header.base_offset,
            message_count: u64::from(header.message_count),
            length_bytes: u64::from(header.length),
            base_timestamp_us: header.base_timestamp_us,
            timestamp_covered: checksum_covers_timestamp(&payload),
            checksum_ok: true,
            damage: None,
        });
        position += entry_size;
        next_offset = Some(expected + u64::from(header.message_count));
    };
    Ok(Walk {
        entries,
        end_offset: next_offset,
        invalid: invalid.map(|reason| (position, reason)),
        invalid_complete,
    })
}

/// Open's resync search after the first invalid entry of the last segment, at `position` where
/// offset `expected_offset` was due: from the byte after it, whether a valid entry starts
/// somewhere (`resync_entry_header` at an offset of at least `expected_offset`, then
/// `check_entry_payload`), whatever the damaged header says, within open's `ResyncBudget`
/// (charged at the same points, so the verdict is open's; see `damage_verdict`).
fn resync_after_damage(
    file: &Path,
    position: u64,
    expected_offset: u64,
    size_bytes: u64,
) -> anyhow::Result<Resync> {
    let mut window = Window {
        file: open_read_only(file)?,
        path: file,
        size_bytes,
        buffer: Vec::new(),
        start: 0,
    };
    let mut budget = ResyncBudget::new(size_bytes - position);
    let mut candidate = position + 1;
    while size_bytes.saturating_sub(candidate) >= ENTRY_HEADER_SIZE as u64 {
        let run = valid_run_at(
            &mut window,
            position,
            candidate,
            expected_offset,
            &mut budget,
        )?;
        if run != Resync::NotFound {
            return Ok(run);
        }
        candidate += 1;
    }
    Ok(Resync::NotFound)
}

/// The valid entries running back to back from `start` (after the damage at `damage_position`),
/// the first passing `resync_entry_header` with `min_base_offset`: `Found` with the run's last offset, `NotFound` when no valid entry starts
/// there, `BudgetSpent` when a candidate's payload would exceed `budget`.
fn valid_run_at(
    window: &mut Window<'_>,
    damage_position: u64,
    start: u64,
    min_base_offset: u64,
    budget: &mut ResyncBudget,
) -> anyhow::Result<Resync> {
    let mut position = start;
    let mut expected_offset: Option<u64> = None;
    while window.size_bytes - position >= ENTRY_HEADER_SIZE as u64 {
        let Some(header) = EntryHeader::decode(window.bytes(position, ENTRY_HEADER_SIZE)?) else {
            unreachable!("32 bytes decode");
        };
        let left = window.size_bytes - position;
        let entry_size = match expected_offset {
            None => resync_entry_header(&header, min_base_offset, start - damage_position, left),
            Some(expected) => check_entry_header(&header, expected, left).ok(),
        };
        let Some(entry_size) = entry_size else {
            break;
        };
        let payload_position = position + ENTRY_HEADER_SIZE as u64;
        let mut candidate = ResyncCandidate::new(&header, payload_position);
        let step = loop {
            match candidate.next(budget) {
                CandidateStep::Read(at) => candidate.feed(window.bytes(at, MESSAGE_HEADER_SIZE)?),
                step => break step,
            }
        };
        match step {
            CandidateStep::Check => {}
            CandidateStep::BudgetSpent => return Ok(Resync::BudgetSpent),
            CandidateStep::Refused | CandidateStep::Read(_) => break,
        }
        let payload = window.bytes(payload_position, header.length as usize)?;
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

/// Open's verdict on the last segment's first invalid entry when it keeps the bytes: why, and
/// the first and last offsets it reports for the quarantine.
#[derive(Clone, Copy)]
struct Kept {
    resync: Resync,
    first_offset: u64,
    last_offset: u64,
}

/// Positional reads of a file through one buffer of at least [`SCAN_CHUNK_BYTES`].
struct Window<'a> {
    file: std::fs::File,
    path: &'a Path,
    size_bytes: u64,
    buffer: Vec<u8>,
    /// File position of `buffer[0]`.
    start: u64,
}

impl Window<'_> {
    /// Bytes `position..position + length`, which must lie within the file.
    fn bytes(&mut self, position: u64, length: usize) -> anyhow::Result<&[u8]> {
        use std::os::unix::fs::FileExt as _;
        let end = position + length as u64;
        if position < self.start || end > self.start + self.buffer.len() as u64 {
            let read_size = (length.max(SCAN_CHUNK_BYTES) as u64).min(self.size_bytes - position);
            self.buffer.resize(read_size as usize, 0);
            self.start = position;
            if let Err(error) = self.file.read_exact_at(&mut self.buffer, position) {
                self.buffer.clear();
                return Err(read_error(self.path)(error));
            }
        }
        let at = (position - self.start) as usize;
        Ok(&self.buffer[at..at + length])
    }
}

/// `{segment}.damaged-at-{position}` (optionally `.N`): a quarantine file open wrote.
fn is_quarantine_name(name: &str) -> bool {
    let Some((segment, rest)) = name.split_once(".log.damaged-at-") else {
        return false;
    };
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    let position = rest.split_once('.').map_or(
        rest,
        |(position, suffix)| {
            if digits(suffix) { position } else { "" }
        },
    );
    segment.len() == 20 && digits(segment) && digits(position)
}

/// The quarantine files in a partition directory, sorted by name.
fn quarantine_files(dir: &Path) -> anyhow::Result<Vec<QuarantineFile>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if !is_quarantine_name(&name) {
            continue;
        }
        let path = entry.path();
        let size_bytes = entry
            .metadata()
            .map_err(|error| anyhow::anyhow!("{}: cannot stat: {error}", path.display()))?
            .len();
        files.push(QuarantineFile {
            file: path.display().to_string(),
            size_bytes,
        });
    }
    files.sort_by(|a, b| a.file.cmp(&b.file));
    Ok(files)
}

/// Walks a closed segment along the index open uses for it, checking each entry as a read does
/// (header against the index row, payload by its checksum rule: `check_entry_payload`). A damaged entry is
/// listed with its reason and the walk goes on: the index says where the next entry starts.
fn walk_indexed(file: &Path, index: &ClosedSegmentIndex) -> anyhow::Result<Walk> {
    let mut reader = BufReader::with_capacity(SCAN_CHUNK_BYTES, open_read_only(file)?);
    let mut entries = Vec::with_capacity(index.entries.len());
    let mut bytes = Vec::new();
    for indexed in &index.entries {
        // The index decoded against this file's size and checked its rows run back to back
        // from byte 0, so the reader is at `indexed.position` and the entry lies in the file.
        bytes.resize(indexed.size_bytes as usize, 0);
        reader.read_exact(&mut bytes).map_err(read_error(file))?;
        entries.push(check_indexed_entry(indexed, &bytes));
    }
    Ok(Walk {
        entries,
        end_offset: Some(index.end_offset),
        invalid: None,
        invalid_complete: None,
    })
}

/// One entry read along the index: the index's numbers, and why its bytes do not match if they
/// do not.
fn check_indexed_entry(indexed: &IndexedEntry, bytes: &[u8]) -> LogEntry {
    let Some(header) = EntryHeader::decode(bytes) else {
        unreachable!("an indexed entry is at least a header long");
    };
    let header_size_bytes = ENTRY_HEADER_SIZE as u64 + u64::from(header.length);
    let damage = if header.base_offset != indexed.base_offset
        || u64::from(header.message_count) != indexed.message_count
        || header_size_bytes != indexed.size_bytes
    {
        Some(format!(
            "header (offset {}, {} messages, {header_size_bytes} bytes) differs from the index \
             (offset {}, {} messages, {} bytes)",
            header.base_offset,
            header.message_count,
            indexed.base_offset,
            indexed.message_count,
            indexed.size_bytes
        ))
    } else {
        check_entry_payload(&header, &bytes[ENTRY_HEADER_SIZE..]).err()
    };
    LogEntry {
        position: indexed.position,
        base_offset: indexed.base_offset,
        message_count: indexed.message_count,
        length_bytes: indexed.size_bytes - ENTRY_HEADER_SIZE as u64,
        base_timestamp_us: header.base_timestamp_us,
        timestamp_covered: checksum_covers_timestamp(&bytes[ENTRY_HEADER_SIZE..]),
        checksum_ok: damage.is_none(),
        damage,
    }
}

/// The payload of a durable file (`durable_replace`: payload, then its XXH3-64 as a trailer), or
/// why it does not verify.
/// The retention floor of partition directory `dir` (issue 11 section 4): 0 without a
/// `retention-floor` file; `None`, with a damage finding naming the file, when it does not
/// verify or decode (open refuses such a directory).
fn retention_floor(dir: &Path, damage: &mut Vec<Damage>) -> anyhow::Result<Option<u64>> {
    use storage::log::retention::{RETENTION_FLOOR_FILE_NAME, decode_retention_floor};
    let floor_file = dir.join(RETENTION_FLOOR_FILE_NAME);
    if !floor_file.exists() {
        return Ok(Some(0));
    }
    match verified_payload(&floor_file)?.and_then(|payload| decode_retention_floor(&payload)) {
        Ok(floor) => Ok(Some(floor)),
        Err(reason) => {
            damage.push(Damage::new(
                &floor_file,
                Some(0),
                format!(
                    "retention floor file is damaged ({reason}): open refuses the partition, as \
                     missing segments cannot be told from retention"
                ),
            ));
            Ok(None)
        }
    }
}

fn verified_payload(path: &Path) -> anyhow::Result<Result<Vec<u8>, String>> {
    let mut bytes = match read_bounded(path, DURABLE_FILE_SIZE_MAX)? {
        Ok(bytes) => bytes,
        Err(size) => {
            return Ok(Err(format!(
                "{size} bytes exceeds the {DURABLE_FILE_SIZE_MAX}-byte limit"
            )));
        }
    };
    let Some(payload_size) = bytes.len().checked_sub(TRAILER_SIZE) else {
        return Ok(Err(format!(
            "{} bytes is shorter than the {TRAILER_SIZE}-byte checksum trailer",
            bytes.len()
        )));
    };
    let mut stored = [0u8; TRAILER_SIZE];
    stored.copy_from_slice(&bytes[payload_size..]);
    let stored = u64::from_le_bytes(stored);
    let computed = XxHash3_64::oneshot(&bytes[..payload_size]);
    if stored != computed {
        return Ok(Err(format!(
            "trailer at byte {payload_size} has {stored:#018x}, the payload hashes to \
             {computed:#018x}"
        )));
    }
    bytes.truncate(payload_size);
    Ok(Ok(bytes))
}

fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

/// Open's verdict on the index of a segment: `Ok` with the index when open uses it.
fn judge_index(
    file: &Path,
    base_offset: Option<u64>,
    last: bool,
    size_bytes: u64,
) -> anyhow::Result<(IndexCheck, Option<ClosedSegmentIndex>)> {
    let Some(base_offset) = base_offset else {
        return Ok((IndexCheck::Unknown, None));
    };
    let index_file = index_path(super::parent_dir(file), base_offset);
    if !index_file.exists() {
        return Ok((IndexCheck::Absent, None));
    }
    if last {
        return Ok((IndexCheck::IgnoredByOpen, None));
    }
    let decided = verified_payload(&index_file)?
        .and_then(|payload| closed_segment_index(&payload, base_offset, size_bytes));
    Ok(match decided {
        Ok(index) => (
            IndexCheck::UsedByOpen {
                row_count: index.entries.len() as u64,
            },
            Some(index),
        ),
        Err(reason) => (IndexCheck::RejectedByOpen { reason }, None),
    })
}

/// Whether the bytes of `file` from `position` to its end (`size_bytes`) are the zero padding of
/// a direct write, by open's rule (`verify::is_direct_write_padding`); reads them only when the
/// sizes allow it (less than one alignment unit).
fn is_padding(file: &Path, position: u64, size_bytes: u64) -> anyhow::Result<bool> {
    let Some(len) = direct_write_padding_len(position, size_bytes) else {
        return Ok(false);
    };
    let mut reader = open_read_only(file)?;
    reader
        .seek(SeekFrom::Start(position))
        .map_err(read_error(file))?;
    let mut tail = vec![0_u8; len];
    reader.read_exact(&mut tail).map_err(read_error(file))?;
    Ok(is_direct_write_padding(position, size_bytes, &tail))
}

/// The name open gives the quarantine file of damage at `position` in `file` (before any `.N`).
fn quarantine_display(file: &Path, position: u64) -> String {
    format!("{}.damaged-at-{position}", file.display())
}

/// The damage findings of one segment's walk; `kept` is open's verdict on the first invalid
/// entry of the last segment when it quarantines it (see [`resync_after_damage`]).
fn segment_damage(
    file: &Path,
    base_offset: Option<u64>,
    last: bool,
    size_bytes: u64,
    walk: &Walk,
    index: &IndexCheck,
    kept: Option<Kept>,
) -> Vec<Damage> {
    let mut damage = Vec::new();
    for entry in &walk.entries {
        if let Some(reason) = &entry.damage {
            damage.push(Damage::new(
                file,
                Some(entry.position),
                format!(
                    "{reason} (offsets {} to {}; in a closed segment whose index open uses: the \
                     server boots, and polls return the messages before this entry, then fail at \
                     it)",
                    entry.base_offset,
                    entry.base_offset + entry.message_count - 1
                ),
            ));
        }
    }
    if let Some((position, reason)) = &walk.invalid {
        if let (true, Some(kept)) = (last, kept) {
            let why = match kept.resync {
                Resync::Found { .. } => {
                    "valid entries follow it, so this is interior damage, not a torn write"
                }
                Resync::NotFound => {
                    "the entry is complete (its header passes and it lies whole in the file), so \
                     it may have been acknowledged: bit rot, not only a torn write"
                }
                Resync::BudgetSpent => {
                    "the search for valid entries after it spent its budget, so it is kept as if \
                     they followed"
                }
            };
            damage.push(Damage::new(
                file,
                Some(*position),
                format!(
                    "{reason}; {why}: open copies the {} bytes from here (offsets {}-{}, possibly \
                     acknowledged) to {}, logs an error and truncates the segment here",
                    size_bytes - position,
                    kept.first_offset,
                    kept.last_offset,
                    quarantine_display(file, *position)
                ),
            ));
        } else if last {
            damage.push(Damage {
                torn_tail: true,
                ..Damage::new(
                    file,
                    Some(*position),
                    format!(
                        "{reason}; a torn tail of {} bytes in the last segment, which open would \
                         truncate (nothing valid follows it)",
                        size_bytes - position
                    ),
                )
            });
        } else {
            damage.push(Damage::new(
                file,
                Some(*position),
                format!(
                    "{reason} (in a closed segment without an index open can use: open rescans \
                     it and refuses to boot)"
                ),
            ));
        }
    } else if let IndexCheck::RejectedByOpen { reason } = index
        && let Some(base_offset) = base_offset
    {
        let index_file = index_path(super::parent_dir(file), base_offset);
        damage.push(Damage::new(
            &index_file,
            None,
            format!(
                "index not used by open: {reason} (open rescans the segment, which is intact, \
                 and rewrites the index)"
            ),
        ));
    }
    damage
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(SegmentReport, Vec<Damage>)> {
    let (files, final_is_last) = segments_for(path, "log")?;
    let mut damage = Vec::new();
    if files.is_empty() {
        damage.push(Damage::new(
            path,
            None,
            "no log segment (a file named by its base offset in 20 digits, e.g. \
             00000000000000000000.log) here (open would start an empty log)",
        ));
    }
    let mut segments = Vec::new();
    let mut size_bytes = 0u64;
    // A partition directory starts at its retention floor (0 without one); a lone file is checked
    // from its own name. `None` once a segment ends where open cannot follow (it refuses to boot
    // there already), or when the floor file is damaged (reported).
    let floor = if path.is_dir() {
        retention_floor(path, &mut damage)?
    } else {
        None
    };
    let mut expected: Option<u64> = floor;
    let mut next_offset = None;
    let file_count = files.len();
    for (segment_index, (base_offset, file)) in files.into_iter().enumerate() {
        let last = final_is_last && segment_index + 1 == file_count;
        if let (Some(base_offset), Some(floor)) = (base_offset, floor)
            && base_offset < floor
        {
            // Below the retention floor: a deletion a restart interrupted, which open completes
            // (issue 11 section 4). Not part of the log.
            continue;
        }
        if let (Some(base_offset), Some(expected)) = (base_offset, expected)
            && base_offset != expected
        {
            damage.push(Damage::new(
                &file,
                Some(0),
                format!(
                    "the segment starts at offset {base_offset} but offset {expected} was \
                     expected (segments are missing or overlap)"
                ),
            ));
        }
        let file_size_bytes = open_read_only(&file)?
            .metadata()
            .map_err(|error| anyhow::anyhow!("{}: cannot stat: {error}", file.display()))?
            .len();
        size_bytes += file_size_bytes;
        let (index, used_index) = judge_index(&file, base_offset, last, file_size_bytes)?;
        let mut walk = match &used_index {
            Some(used_index) => walk_indexed(&file, used_index)?,
            None => scan(&file, base_offset.or(expected), file_size_bytes)?,
        };
        let mut direct_padding_bytes = 0;
        if let Some((position, _)) = &walk.invalid
            && last
            && is_padding(&file, *position, file_size_bytes)?
        {
            direct_padding_bytes = file_size_bytes - position;
            walk.invalid = None;
        }
        let kept = match (&walk.invalid, walk.end_offset.or(expected)) {
            (Some((position, _)), Some(first_offset)) if last => {
                let resync = resync_after_damage(&file, *position, first_offset, file_size_bytes)?;
                damage_verdict(walk.invalid_complete, resync, first_offset).map(|last_offset| {
                    Kept {
                        resync,
                        first_offset,
                        last_offset,
                    }
                })
            }
            _ => None,
        };
        damage.extend(segment_damage(
            &file,
            base_offset,
            last,
            file_size_bytes,
            &walk,
            &index,
            kept,
        ));
        let end_offset = walk.end_offset.or(base_offset);
        next_offset = end_offset.or(next_offset);
        expected = if walk.invalid.is_some() && !last {
            None
        } else {
            end_offset
        };
        segments.push(LogSegment {
            file: file.display().to_string(),
            base_offset,
            size_bytes: file_size_bytes,
            last,
            direct_padding_bytes,
            entries: walk.entries,
            index,
        });
    }
    let quarantine_files = if path.is_dir() {
        quarantine_files(path)?
    } else {
        Vec::new()
    };
    let entries = || segments.iter().flat_map(|segment| &segment.entries);
    let damaged = || entries().filter(|entry| !entry.checksum_ok);
    let report = SegmentReport {
        segment_count: segments.len(),
        entry_count: entries().count() as u64,
        message_count: entries().map(|entry| entry.message_count).sum(),
        damaged_entry_count: damaged().count() as u64,
        damaged_message_count: damaged().map(|entry| entry.message_count).sum(),
        next_offset,
        size_bytes,
        segments,
        quarantine_files,
    };
    Ok((report, damage))
}

impl Report for SegmentReport {
    fn write_text(&self, out: &mut String) {
        for segment in &self.segments {
            let index = match &segment.index {
                IndexCheck::Absent => "no index".to_owned(),
                IndexCheck::UsedByOpen { row_count } => {
                    format!("index used by open ({row_count} rows)")
                }
                IndexCheck::RejectedByOpen { reason } => {
                    format!("index NOT used by open (it rescans the segment): {reason}")
                }
                IndexCheck::IgnoredByOpen => {
                    "index ignored by open (the last segment is scanned)".to_owned()
                }
                IndexCheck::Unknown => "index not checked (unnumbered file)".to_owned(),
            };
            let padding = if segment.direct_padding_bytes > 0 {
                format!(
                    ", the last {} of them zero padding of a direct write, which open cuts",
                    segment.direct_padding_bytes
                )
            } else {
                String::new()
            };
            let _ = writeln!(
                out,
                "segment {} ({} bytes{}{padding}; {index})",
                segment.file,
                segment.size_bytes,
                if segment.last { ", last" } else { "" }
            );
            let _ = writeln!(
                out,
                "  {:>12} {:>12} {:>8} {:>10} {:>18}  checksum",
                "byte", "base_offset", "messages", "length", "timestamp_us"
            );
            for entry in &segment.entries {
                let _ = writeln!(
                    out,
                    "  {:>12} {:>12} {:>8} {:>10} {:>18}  {}",
                    entry.position,
                    entry.base_offset,
                    entry.message_count,
                    entry.length_bytes,
                    entry.base_timestamp_us,
                    match (entry.checksum_ok, entry.timestamp_covered) {
                        (false, _) => "BAD",
                        (true, true) => "ok",
                        (true, false) =>
                            "ok (timestamp not covered: written before the timestamp rule)",
                    }
                );
            }
        }
        for quarantine in &self.quarantine_files {
            let _ = writeln!(
                out,
                "quarantine file {} ({} bytes): bytes open cut from the last segment after \
                 damage that may have been acknowledged, kept for inspection (not read by the \
                 server)",
                quarantine.file, quarantine.size_bytes
            );
        }
        let next_offset = self
            .next_offset
            .map_or_else(|| "-".to_owned(), |offset| offset.to_string());
        let damaged = if self.damaged_entry_count == 0 {
            String::new()
        } else {
            format!(
                " ({} damaged entries holding {} messages)",
                self.damaged_entry_count, self.damaged_message_count
            )
        };
        let _ = writeln!(
            out,
            "summary: {} segment(s), {} entries, {} messages{damaged}, next_offset {next_offset}, \
             {} bytes",
            self.segment_count, self.entry_count, self.message_count, self.size_bytes
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quarantine_names_are_exact() {
        assert!(is_quarantine_name("00000000000000000000.log.damaged-at-0"));
        assert!(is_quarantine_name(
            "00000000000000000042.log.damaged-at-132.1"
        ));
        assert!(!is_quarantine_name("00000000000000000042.log"));
        assert!(!is_quarantine_name("42.log.damaged-at-0"));
        assert!(!is_quarantine_name("00000000000000000042.log.damaged-at-"));
        assert!(!is_quarantine_name(
            "00000000000000000042.log.damaged-at-1.tmp"
        ));
    }
}
