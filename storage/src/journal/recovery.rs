//! Opening a journal directory, in two steps so that a caller can refuse before anything is
//! written: [`scan`] lists the segments, checks that their ops follow each other, reads every
//! record and decides what a damaged last record needs (read only); [`apply`] then does it
//! (truncate a torn tail, or start a segment after a record the snapshot covers, or create the
//! first segment of a new journal). Damage anywhere a torn write cannot explain is an error
//! here, never skipped or truncated.

use std::path::{Path, PathBuf};

use compio::fs::{File, OpenOptions};

use super::record::{JOURNAL_HEADER_SIZE, JournalHeader, Prepare, header_checksum, parse_record};
use super::{
    DamagedRecord, JournalError, JournalRecovery, TailDisposition, UncoveredDamage, io_error,
    segment_path,
};
use crate::durable::{create_dir_durable, list_dir_names, read_exact_at, sync_dir};
use crate::limits::{JOURNAL_BODY_SIZE_MAX, JOURNAL_RECORD_SIZE_MAX, JOURNAL_SEGMENT_SIZE_MAX};

/// The first op of a segment file name, if `name` is exactly `{first_op:020}.wal`.
pub(super) fn parse_segment_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(".wal")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// The one write [`apply`] makes before the journal is usable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Repair {
    /// Nothing to write.
    None,
    /// A new journal: create the directory and the empty segment `{first_op:020}.wal` (op 1, or
    /// the op after the snapshot when the caller found no segment after a checkpoint).
    CreateFirstSegment { first_op: u64 },
    /// Cut the last segment to `size_bytes` (a torn tail above the covered op).
    Truncate { size_bytes: u64 },
    /// Create the empty segment `{first_op:020}.wal` (`covered_op + 1`) after a damaged last
    /// record the snapshot covers; the damaged segment is left as it is, now closed.
    StartSegment { first_op: u64 },
}

/// What [`scan`] found and decided; nothing has been written yet.
#[derive(Debug)]
pub(super) struct Scanned {
    pub(super) dir: PathBuf,
    /// First op of each segment after the repair, ascending; the last is the active segment.
    pub(super) segment_first_ops: Vec<u64>,
    /// Bytes of valid records in the active segment after the repair.
    pub(super) active_size_bytes: u64,
    /// The last op after the repair (`first op of the active segment - 1` when it is empty).
    pub(super) last_op: u64,
    pub(super) repair: Repair,
    pub(super) recovery: JournalRecovery,
    /// Damage above the covered op kept in place for repair ([`UncoveredDamage::RepairFromPeers`]).
    pub(super) damaged_tail: Option<DamagedTail>,
}

/// Where the valid prefix of a journal opened for repair ends: the damaged record stays in place
/// (never appended after, never read) until `Journal::truncate_after` cuts it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct DamagedTail {
    /// The segment holding the damaged record.
    pub(super) segment_first_op: u64,
    /// Byte offset of the damaged record in that segment: where a truncation cuts.
    pub(super) position: u64,
    /// The damaged record's report, as in `JournalRecovery::damaged_records`.
    pub(super) record: DamagedRecord,
}

/// The state `Journal::open` starts from.
#[derive(Debug)]
pub(super) struct Recovered {
    /// First op of each segment, ascending; the last is the active segment.
    pub(super) segment_first_ops: Vec<u64>,
    /// The last segment, open read-write.
    pub(super) active_file: File,
    pub(super) active_size_bytes: u64,
    /// `first_op - 1` when the journal holds no record.
    pub(super) last_op: u64,
    pub(super) recovery: JournalRecovery,
    pub(super) damaged_tail: Option<DamagedTail>,
}

/// Reads the journal in `dir` and decides its repair, writing nothing. `covered_op` is the op up
/// to which the caller's snapshot holds the state. Damage at an op at or below it is covered:
/// the records from it on are never replayed, so the scan goes on at the next record it can
/// prove (a later valid record in the same segment, or the next segment) as long as no op above
/// `covered_op` can be lost; a last segment holding covered damage is left as it is, now closed,
/// and the journal continues in a new segment. Damage above `covered_op` is a torn tail (cut)
/// or refused; with [`UncoveredDamage::RepairFromPeers`] it is kept in place instead of refused
/// (the journal opens with the valid prefix before it). Rules: FORMAT.md section 8, open.
pub(super) async fn scan(
    dir: &Path,
    covered_op: u64,
    policy: UncoveredDamage,
) -> Result<Scanned, JournalError> {
    let first_ops = list_segments(dir).await?;
    if first_ops.is_empty() {
        // A new journal: VSR numbers prepares from op 1 (op 0 is the root prepare); after a
        // snapshot at `covered_op` (the caller decided no op above it exists) it starts above it.
        let first_op = covered_op + 1;
        return Ok(Scanned {
            dir: dir.to_path_buf(),
            segment_first_ops: vec![first_op],
            active_size_bytes: 0,
            last_op: covered_op,
            repair: Repair::CreateFirstSegment { first_op },
            recovery: JournalRecovery {
                segment_count: 1,
                ..JournalRecovery::default()
            },
            damaged_tail: None,
        });
    }
    let mut found = Found::default();
    let mut next_op = None;
    let mut last_end = SegmentEnd::Clean { end_position: 0 };
    for (index, &first_op) in first_ops.iter().enumerate() {
        let path = segment_path(dir, first_op);
        check_first_op(&path, first_op, next_op)?;
        let file = File::open(&path)
            .await
            .map_err(io_error(&path, "open segment"))?;
        let bytes = read_segment(&file, &path).await?;
        // A close error on a read-only descriptor cannot lose data; the bytes are verified.
        let _ = file.close().await;
        let segment = Segment {
            path: &path,
            bytes: &bytes,
            first_op,
            following_first_op: first_ops.get(index + 1).copied(),
        };
        let (segment_next_op, end) = walk_segment(&segment, covered_op, policy, &mut found)?;
        next_op = Some(segment_next_op);
        last_end = end;
        if let SegmentEnd::AwaitingRepair { position } = end {
            let highest_op = highest_op_after(
                dir,
                &bytes,
                position,
                segment_next_op,
                &first_ops[index + 1..],
            )
            .await?;
            let record = found
                .damaged_records
                .last_mut()
                .expect("the damage was reported");
            record.disposition = TailDisposition::AwaitingRepair { highest_op };
            found.damaged_tail = Some(DamagedTail {
                segment_first_op: first_op,
                position: position as u64,
                record: record.clone(),
            });
            break;
        }
    }
    let next_op = next_op.expect("at least one segment was walked");
    let mut segment_first_ops = first_ops;
    let (repair, active_size_bytes, last_op) = match last_end {
        // Nothing is written: appends wait for the truncation the caller's repair makes.
        SegmentEnd::AwaitingRepair { .. } => (Repair::None, 0, next_op - 1),
        SegmentEnd::Clean { end_position } if !found.last_segment_covered => {
            (Repair::None, end_position as u64, next_op - 1)
        }
        SegmentEnd::Clean { .. } | SegmentEnd::Covered => {
            // The damaged segment is left as it is, closed; nothing in it is ever written again.
            let resume_op = next_op.max(covered_op + 1);
            segment_first_ops.push(resume_op);
            (
                Repair::StartSegment {
                    first_op: resume_op,
                },
                0,
                resume_op - 1,
            )
        }
        SegmentEnd::Torn { position } => (
            Repair::Truncate {
                size_bytes: position as u64,
            },
            position as u64,
            next_op - 1,
        ),
    };
    let segment_count = segment_first_ops.len() as u32;
    Ok(Scanned {
        dir: dir.to_path_buf(),
        segment_first_ops,
        active_size_bytes,
        last_op,
        repair,
        recovery: JournalRecovery {
            prepares: found.prepares,
            record_positions: found.record_positions,
            truncated_bytes: found.truncated_bytes,
            damaged_records: found.damaged_records,
            segment_count,
        },
        damaged_tail: found.damaged_tail,
    })
}

/// The highest op the journal shows after damage at op `damaged_op`, byte `position` of a
/// segment's `bytes`: the ops of the valid records later in that segment and in the
/// `following_first_ops` segments (each walked from its start to its first invalid record), at
/// least `damaged_op`. A record whose own bytes are damaged shows no op, so this is a lower bound.
async fn highest_op_after(
    dir: &Path,
    bytes: &[u8],
    position: usize,
    damaged_op: u64,
    following_first_ops: &[u64],
) -> Result<u64, JournalError> {
    let mut highest_op = damaged_op;
    let mut at = position;
    while let Some((record_position, op)) = next_valid_record(bytes, at, highest_op) {
        highest_op = op;
        at = record_position;
    }
    for &first_op in following_first_ops {
        let path = segment_path(dir, first_op);
        let file = File::open(&path)
            .await
            .map_err(io_error(&path, "open segment"))?;
        let bytes = read_segment(&file, &path).await?;
        let _ = file.close().await;
        let scan = scan_segment(
            &bytes,
            first_op,
            0,
            first_op,
            &mut Vec::new(),
            &mut Vec::new(),
        );
        highest_op = highest_op.max(scan.next_op - 1);
    }
    Ok(highest_op)
}

/// What the walk of every segment collected.
#[derive(Debug, Default)]
struct Found {
    prepares: Vec<Prepare>,
    record_positions: Vec<(u64, u64)>,
    damaged_records: Vec<DamagedRecord>,
    truncated_bytes: u64,
    /// The last segment holds covered damage: it is closed and a new segment started.
    last_segment_covered: bool,
    /// Damage above the covered op kept for repair.
    damaged_tail: Option<DamagedTail>,
}

/// One segment's bytes and place in the journal.
struct Segment<'a> {
    path: &'a Path,
    bytes: &'a [u8],
    first_op: u64,
    /// The next segment's first op; `None` for the last (active) segment.
    following_first_op: Option<u64>,
}

/// How a segment's walk ended.
#[derive(Debug, Clone, Copy)]
enum SegmentEnd {
    /// Valid records up to `end_position`, the end of the file (after any covered damage that
    /// a later record in the same segment resumed from).
    Clean { end_position: usize },
    /// Covered damage up to the end of the file.
    Covered,
    /// A torn tail above the covered op at `position` (last segment only): open cuts it.
    Torn { position: usize },
    /// Damage above the covered op at `position` that no torn append explains, kept in place
    /// for repair ([`UncoveredDamage::RepairFromPeers`]); the walk stops here.
    AwaitingRepair { position: usize },
}

/// Walks one segment's records, resuming after covered damage (FORMAT.md section 8, open):
/// returns the op the next segment must start at and how the segment ended.
fn walk_segment(
    segment: &Segment<'_>,
    covered_op: u64,
    policy: UncoveredDamage,
    found: &mut Found,
) -> Result<(u64, SegmentEnd), JournalError> {
    let mut position = 0;
    let mut next_op = segment.first_op;
    loop {
        let scan = scan_segment(
            segment.bytes,
            segment.first_op,
            position,
            next_op,
            &mut found.prepares,
            &mut found.record_positions,
        );
        let Some(invalid) = scan.invalid else {
            return Ok((
                scan.next_op,
                SegmentEnd::Clean {
                    end_position: scan.end_position,
                },
            ));
        };
        if scan.next_op > covered_op {
            return uncovered_damage(segment, &invalid, scan.next_op, covered_op, policy, found);
        }
        let covered = covered_damage(segment, &invalid, scan.next_op, covered_op)?;
        let resume = covered.resume;
        found.damaged_records.push(covered.record);
        if segment.following_first_op.is_none() {
            found.last_segment_covered = true;
        }
        match resume {
            CoveredResume::InSegment { position: at, op } => {
                position = at;
                next_op = op;
            }
            CoveredResume::NextSegment { op } => return Ok((op, SegmentEnd::Covered)),
        }
    }
}

/// Damage at op `damaged_op`, above `covered_op`: only a torn tail of the last segment is
/// explained (and will be cut); anything else refuses, as a torn append cannot leave it, unless
/// `policy` keeps it for repair from peers.
fn uncovered_damage(
    segment: &Segment<'_>,
    invalid: &Invalid,
    damaged_op: u64,
    covered_op: u64,
    policy: UncoveredDamage,
    found: &mut Found,
) -> Result<(u64, SegmentEnd), JournalError> {
    let corrupt = |reason: String| JournalError::Corrupt {
        path: segment.path.to_path_buf(),
        position: invalid.position as u64,
        reason,
    };
    let unexplained = match interior_damage(segment.bytes, invalid.position, damaged_op) {
        Some(why) => Some(format!("{} ({why})", invalid.reason)),
        None if segment.following_first_op.is_some() => Some(format!(
            "in a closed segment (damage before the tail refuses to boot): {} (op {damaged_op} \
             is above the snapshot's checkpoint op {covered_op}, so the snapshot does not hold \
             it)",
            invalid.reason
        )),
        None => None,
    };
    if let Some(reason) = unexplained {
        if policy == UncoveredDamage::Refuse {
            return Err(corrupt(reason));
        }
        found.damaged_records.push(DamagedRecord {
            path: segment.path.to_path_buf(),
            position: invalid.position as u64,
            op: damaged_op,
            size_bytes: (segment.bytes.len() - invalid.position) as u64,
            reason,
            // The caller sets the highest op once the rest of the journal is read.
            disposition: TailDisposition::AwaitingRepair {
                highest_op: damaged_op,
            },
        });
        return Ok((
            damaged_op,
            SegmentEnd::AwaitingRepair {
                position: invalid.position,
            },
        ));
    }
    if segment.following_first_op.is_some() {
        return Err(corrupt(format!(
            "in a closed segment (damage before the tail refuses to boot): {} (op {damaged_op} \
             is above the snapshot's checkpoint op {covered_op}, so the snapshot does not hold \
             it)",
            invalid.reason
        )));
    }
    let size_bytes = (segment.bytes.len() - invalid.position) as u64;
    found.truncated_bytes = size_bytes;
    found.damaged_records.push(DamagedRecord {
        path: segment.path.to_path_buf(),
        position: invalid.position as u64,
        op: damaged_op,
        size_bytes,
        reason: invalid.reason.clone(),
        disposition: TailDisposition::Truncated,
    });
    Ok((
        damaged_op,
        SegmentEnd::Torn {
            position: invalid.position,
        },
    ))
}

/// Covered damage and where the walk resumes.
struct Covered {
    record: DamagedRecord,
    resume: CoveredResume,
}

/// Damage at op `damaged_op <= covered_op` in `segment`: decided by [`covered_resume`], named
/// by file and byte when refused.
fn covered_damage(
    segment: &Segment<'_>,
    invalid: &Invalid,
    damaged_op: u64,
    covered_op: u64,
) -> Result<Covered, JournalError> {
    let resume = covered_resume(
        segment.bytes,
        invalid.position,
        damaged_op,
        segment.following_first_op,
        covered_op,
    )
    .map_err(|why| JournalError::Corrupt {
        path: segment.path.to_path_buf(),
        position: invalid.position as u64,
        reason: format!("{} {why}", invalid.reason),
    })?;
    let (end, resume_op) = match resume {
        CoveredResume::InSegment { position, op } => (position, op),
        CoveredResume::NextSegment { op } => (segment.bytes.len(), op),
    };
    Ok(Covered {
        record: DamagedRecord {
            path: segment.path.to_path_buf(),
            position: invalid.position as u64,
            op: damaged_op,
            size_bytes: (end - invalid.position) as u64,
            reason: invalid.reason.clone(),
            disposition: TailDisposition::CoveredBySnapshot { resume_op },
        },
        resume,
    })
}

/// Where a journal walk goes on after damage the snapshot covers (see [`covered_resume`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoveredResume {
    /// At the valid record for `op` at byte `position` of the same segment.
    InSegment {
        /// Byte offset of that record in the segment.
        position: usize,
        /// Its op.
        op: u64,
    },
    /// At `op`: the next segment's first op, or for the last segment `covered_op + 1`, where
    /// open starts a new segment.
    NextSegment {
        /// The op the journal continues at.
        op: u64,
    },
}

/// The rule for damage (the first invalid record, at byte `position` of a segment's `bytes`) at
/// op `damaged_op <= covered_op`, shared by open and `shardline inspect wal` (FORMAT.md section
/// 8, open step 4). The snapshot holds that op, so the bytes from it on are skipped (never
/// replayed) up to the first point from which the walk can go on without losing an op above
/// `covered_op`, in this order: the next segment (`following_first_op`, `None` for the last
/// segment) when it starts at most at `covered_op + 1`; the first valid record for a later op
/// in this segment when it is at most `covered_op + 1`; in the last segment, the end of the
/// file when the skipped bytes cannot hold a record above `covered_op` (at most one record's
/// bytes, the shape a torn append leaves, or fewer headers' worth than the ops above
/// `damaged_op` up to `covered_op`).
///
/// # Errors
/// Why the skip could lose an acknowledged op above the checkpoint (a sentence fragment that
/// follows the record's defect): the caller refuses.
pub fn covered_resume(
    bytes: &[u8],
    position: usize,
    damaged_op: u64,
    following_first_op: Option<u64>,
    covered_op: u64,
) -> Result<CoveredResume, String> {
    let refuse = |why: String| {
        format!(
            "at op {damaged_op}, which the snapshot's checkpoint op {covered_op} covers, but \
             {why}: acknowledged ops above the checkpoint could be lost"
        )
    };
    if let Some(following) = following_first_op {
        if following <= damaged_op {
            return Err(refuse(format!(
                "the next segment starts at op {following}, not after it"
            )));
        }
        if following - 1 <= covered_op {
            return Ok(CoveredResume::NextSegment { op: following });
        }
    }
    if let Some((at, op)) = next_valid_record(bytes, position, damaged_op) {
        if op > covered_op + 1 {
            return Err(refuse(format!(
                "the next valid record, at byte {at}, is op {op}: ops {} to {} are unreadable",
                covered_op + 1,
                op - 1
            )));
        }
        return Ok(CoveredResume::InSegment { position: at, op });
    }
    if let Some(following) = following_first_op {
        return Err(refuse(format!(
            "no valid record follows it in this closed segment and the next segment starts at \
             op {following}: ops {} to {} are unreadable",
            covered_op + 1,
            following - 1
        )));
    }
    let skipped_bytes = bytes.len() - position;
    // Every record is at least a header: the skipped bytes hold at most this many records.
    let record_count_max = skipped_bytes.div_ceil(JOURNAL_HEADER_SIZE) as u64;
    if skipped_bytes > JOURNAL_RECORD_SIZE_MAX && damaged_op + record_count_max - 1 > covered_op {
        return Err(refuse(format!(
            "{skipped_bytes} unreadable bytes follow to the end of the last segment, more than \
             one append can tear and room for records up to op {}",
            damaged_op + record_count_max - 1
        )));
    }
    Ok(CoveredResume::NextSegment { op: covered_op + 1 })
}

/// The first complete valid record after the damaged one at byte `position` whose op is above
/// `damaged_op`, as (byte position, op). A valid record there was written by the journal: a
/// segment is only appended to, and a cut (torn tail, rollback) removes the bytes it cuts. When
/// the damaged record's header is intact (only its body is damaged), the search starts at its
/// end, so a record-shaped sequence inside its body is never taken for a record.
fn next_valid_record(bytes: &[u8], position: usize, damaged_op: u64) -> Option<(usize, u64)> {
    let search_from = intact_header_record_size(&bytes[position..], damaged_op)
        .map_or(position + 1, |record_size| position + record_size);
    for candidate in search_from..bytes.len() {
        let header = JournalHeader::decode(&bytes[candidate..])?;
        // Cheap filters first: a zero-filled or random region fails them without hashing.
        if header.reserved != 0 || header.size > JOURNAL_BODY_SIZE_MAX || header.op <= damaged_op {
            continue;
        }
        if let Ok((header, _)) = parse_record(&bytes[candidate..]) {
            return Some((candidate, header.op));
        }
    }
    None
}

/// Makes the repair [`scan`] decided and opens the active segment read-write.
pub(super) async fn apply(scanned: Scanned) -> Result<Recovered, JournalError> {
    let Scanned {
        dir,
        segment_first_ops,
        active_size_bytes,
        last_op,
        repair,
        recovery,
        damaged_tail,
    } = scanned;
    let active_first_op = *segment_first_ops
        .last()
        .expect("a scan leaves at least one segment");
    let path = segment_path(&dir, active_first_op);
    let active_file = match repair {
        Repair::CreateFirstSegment { .. } | Repair::StartSegment { .. } => {
            if matches!(repair, Repair::CreateFirstSegment { .. }) {
                create_journal_dir(&dir).await?;
            }
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .await
                .map_err(io_error(&path, "create segment"))?;
            sync_dir(&dir).await.map_err(io_error(
                &dir,
                "fsync journal directory after creating a segment",
            ))?;
            file
        }
        Repair::None | Repair::Truncate { .. } => {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .open(&path)
                .await
                .map_err(io_error(&path, "open segment"))?;
            if let Repair::Truncate { size_bytes } = repair {
                file.set_len(size_bytes)
                    .await
                    .map_err(io_error(&path, "truncate torn tail"))?;
                file.sync_all()
                    .await
                    .map_err(io_error(&path, "fsync after truncating torn tail"))?;
            }
            file
        }
    };
    Ok(Recovered {
        segment_first_ops,
        active_file,
        active_size_bytes,
        last_op,
        recovery,
        damaged_tail,
    })
}

/// Creates the journal directory durably (see `durable::create_dir_durable`).
async fn create_journal_dir(dir: &Path) -> Result<(), JournalError> {
    create_dir_durable(dir)
        .await
        .map_err(|failed| io_error(&failed.path, failed.step)(failed.source))
}

/// First ops of the segment files in `dir`, ascending (none when `dir` does not exist); other
/// files are skipped (a `*.wal` file with a malformed name is logged). Listing uses
/// `std::fs::read_dir` on compio's blocking pool: `io_uring` has no getdents operation.
async fn list_segments(dir: &Path) -> Result<Vec<u64>, JournalError> {
    let names = match list_dir_names(dir).await {
        Ok(names) => names,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Vec::new(),
        Err(error) => return Err(io_error(dir, "list journal directory")(error)),
    };
    let mut first_ops = Vec::new();
    for name in names {
        if let Some(first_op) = parse_segment_name(&name) {
            first_ops.push(first_op);
        } else if Path::new(&name)
            .extension()
            .is_some_and(|extension| extension == "wal")
        {
            tracing::warn!(dir = %dir.display(), file = %name, "ignoring a .wal file that is not named {{first_op:020}}.wal");
        }
    }
    first_ops.sort_unstable();
    // A FIFO or device under a segment's name would block or fail every later fsync: refuse it
    // now, naming it, instead of booting a journal that cannot write.
    for &first_op in &first_ops {
        let path = segment_path(dir, first_op);
        let metadata = compio::fs::metadata(&path)
            .await
            .map_err(io_error(&path, "stat segment"))?;
        if !metadata.is_file() {
            return Err(JournalError::Corrupt {
                path,
                position: 0,
                reason: "not a regular file (a FIFO, device, socket or directory is no segment)"
                    .to_owned(),
            });
        }
    }
    Ok(first_ops)
}

/// A segment must start at op >= 1 and, after the first, exactly where the previous one ends.
fn check_first_op(path: &Path, first_op: u64, expected: Option<u64>) -> Result<(), JournalError> {
    let corrupt = |reason: String| {
        Err(JournalError::Corrupt {
            path: path.to_path_buf(),
            position: 0,
            reason,
        })
    };
    if first_op == 0 {
        return corrupt(
            "the segment starts at op 0, but op 0 is VSR's root prepare and is never journaled"
                .to_owned(),
        );
    }
    match expected {
        Some(expected) if expected != first_op => corrupt(format!(
            "op gap: the segment starts at op {first_op} but the previous segment ends before op \
             {expected}"
        )),
        _ => Ok(()),
    }
}

/// Reads a whole segment. Its size comes from the disk, so it is checked against
/// [`JOURNAL_SEGMENT_SIZE_MAX`] before allocating.
async fn read_segment(file: &File, path: &Path) -> Result<Vec<u8>, JournalError> {
    let size_bytes = file
        .metadata()
        .await
        .map_err(io_error(path, "stat segment"))?
        .len();
    if size_bytes > JOURNAL_SEGMENT_SIZE_MAX {
        return Err(JournalError::Corrupt {
            path: path.to_path_buf(),
            position: 0,
            reason: format!(
                "{size_bytes} bytes exceeds the {JOURNAL_SEGMENT_SIZE_MAX}-byte segment limit"
            ),
        });
    }
    read_exact_at(file, 0, size_bytes as usize)
        .await
        .map_err(io_error(path, "read segment"))
}

/// The first record that does not check out, and why.
#[derive(Debug)]
struct Invalid {
    position: usize,
    reason: String,
}

#[derive(Debug)]
struct Scan {
    /// One past the last valid record's op.
    next_op: u64,
    /// Byte position just after the last valid record.
    end_position: usize,
    invalid: Option<Invalid>,
}

/// Checks the records of segment `first_op` in order from byte `position`, pushing each valid
/// one to `prepares` and its `(first_op, byte position)` to `record_positions`: each must be
/// valid ([`parse_record`]) and carry the next op (the first one `start_op`). Stops at the first
/// record that fails.
fn scan_segment(
    bytes: &[u8],
    first_op: u64,
    mut position: usize,
    start_op: u64,
    prepares: &mut Vec<Prepare>,
    record_positions: &mut Vec<(u64, u64)>,
) -> Scan {
    let mut next_op = start_op;
    let invalid = loop {
        if position == bytes.len() {
            break None;
        }
        let (header, body) = match parse_record(&bytes[position..]) {
            Ok(record) => record,
            Err(reason) => break Some(Invalid { position, reason }),
        };
        if header.op != next_op {
            break Some(Invalid {
                position,
                reason: format!("op {} where op {next_op} was expected", header.op),
            });
        }
        record_positions.push((first_op, position as u64));
        prepares.push(Prepare {
            op: header.op,
            view: header.view,
            commit: header.commit,
            body: body.to_vec(),
        });
        position += JOURNAL_HEADER_SIZE + body.len();
        next_op += 1;
    };
    Scan {
        next_op,
        end_position: position,
        invalid,
    }
}

/// The size of the record at the start of `bytes` if its header checks out (checksum, reserved,
/// size bound) and carries `op`, whether or not its body does.
fn intact_header_record_size(bytes: &[u8], op: u64) -> Option<usize> {
    let header_bytes = bytes.first_chunk::<JOURNAL_HEADER_SIZE>()?;
    let header = JournalHeader::decode(header_bytes)?;
    let intact = header_checksum(header_bytes) == header.checksum
        && header.reserved == 0
        && header.size <= JOURNAL_BODY_SIZE_MAX
        && header.op == op;
    intact.then_some(JOURNAL_HEADER_SIZE + header.size as usize)
}

/// Decides whether the first invalid record of the last segment, at `position`, is a torn tail
/// (`None`) or interior damage (`Some(why)`).
///
/// Every append is fsynced before the next one starts, so a crash can tear at most the one
/// record being appended: its bytes are the last in the file, at most
/// [`JOURNAL_RECORD_SIZE_MAX`] of them. Damage is therefore interior when more bytes than one
/// record follow `position`, or when a complete valid record for op `next_op` or later starts
/// at any byte after `position` (a torn append cannot write a record after itself).
fn interior_damage(bytes: &[u8], position: usize, next_op: u64) -> Option<String> {
    let tail_size = bytes.len() - position;
    if tail_size > JOURNAL_RECORD_SIZE_MAX {
        return Some(format!(
            "{tail_size} bytes from here to the end of the last segment, more than one \
             {JOURNAL_RECORD_SIZE_MAX}-byte append can leave torn: damage before the tail \
             refuses to boot"
        ));
    }
    for candidate in position + 1..bytes.len() {
        let Some(header) = JournalHeader::decode(&bytes[candidate..]) else {
            break;
        };
        // Cheap filters first: a zero-filled or random region fails them without hashing.
        if header.reserved != 0 || header.size > JOURNAL_BODY_SIZE_MAX || header.op < next_op {
            continue;
        }
        if let Ok((header, _)) = parse_record(&bytes[candidate..]) {
            return Some(format!(
                "a valid record for op {} follows at byte {candidate}: damage before the tail \
                 refuses to boot",
                header.op
            ));
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::super::record::encode_record;
    use super::*;

    fn records(ops: std::ops::RangeInclusive<u64>) -> Vec<u8> {
        let mut bytes = Vec::new();
        for op in ops {
            let prepare = Prepare {
                op,
                view: 1,
                commit: op - 1,
                body: vec![op as u8; 10],
            };
            encode_record(&prepare, &mut bytes);
        }
        bytes
    }

    #[test]
    fn segment_names_are_exact() {
        assert_eq!(parse_segment_name("00000000000000000042.wal"), Some(42));
        assert_eq!(
            parse_segment_name("18446744073709551615.wal"),
            Some(u64::MAX)
        );
        assert_eq!(parse_segment_name("99999999999999999999.wal"), None);
        assert_eq!(parse_segment_name("42.wal"), None);
        assert_eq!(parse_segment_name("0000000000000000004x.wal"), None);
        assert_eq!(parse_segment_name("00000000000000000042.log"), None);
        assert_eq!(parse_segment_name("00000000000000000042.wal.tmp"), None);
    }

    #[test]
    fn scan_stops_at_the_first_wrong_op() {
        let bytes = records(5..=7);
        let mut prepares = Vec::new();
        let scan = scan_segment(&bytes, 5, 0, 5, &mut prepares, &mut Vec::new());
        assert_eq!(prepares.len(), 3);
        assert_eq!((scan.next_op, scan.end_position), (8, bytes.len()));
        assert!(scan.invalid.is_none());

        prepares.clear();
        let scan = scan_segment(&bytes, 4, 0, 4, &mut prepares, &mut Vec::new());
        assert!(prepares.is_empty());
        let invalid = scan.invalid.unwrap();
        assert_eq!(invalid.position, 0);
        assert_eq!(invalid.reason, "op 5 where op 4 was expected");
    }

    #[test]
    fn tail_rule_separates_torn_from_interior() {
        let bytes = records(1..=3);
        let record_size = bytes.len() / 3;
        // Garbage after two records: torn.
        let mut torn = bytes[..2 * record_size].to_vec();
        torn.extend_from_slice(&[0xAB; 30]);
        assert_eq!(interior_damage(&torn, 2 * record_size, 3), None);
        // Record 2 damaged, record 3 valid after it: interior.
        let mut damaged = bytes.clone();
        damaged[record_size + 70] ^= 1;
        assert_eq!(
            interior_damage(&damaged, record_size, 2),
            Some(format!(
                "a valid record for op 3 follows at byte {}: damage before the tail refuses to \
                 boot",
                2 * record_size
            ))
        );
        // A valid record for an older op after the damage does not count.
        assert_eq!(interior_damage(&damaged, record_size, 4), None);
        // More than one record's worth of bytes after the damage: interior.
        let long = vec![0u8; JOURNAL_RECORD_SIZE_MAX + 1];
        assert!(
            interior_damage(&long, 0, 1)
                .unwrap()
                .contains("more than one")
        );
        let long = vec![0u8; JOURNAL_RECORD_SIZE_MAX];
        assert_eq!(interior_damage(&long, 0, 1), None);
    }

    /// Writes `bytes` as segment `first_op` in `dir`.
    fn write_segment(dir: &Path, first_op: u64, bytes: &[u8]) {
        std::fs::write(segment_path(dir, first_op), bytes).unwrap();
    }

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    /// Ops 1..=3 with record 3 damaged: cut when op 3 is above the covered op, left in place with
    /// a new segment at `covered_op + 1` when it is at or below; the scan itself writes nothing.
    #[test]
    fn damaged_last_record_is_cut_above_the_covered_op_and_kept_at_or_below() {
        let bytes = records(1..=3);
        let record_size = bytes.len() / 3;
        let mut damaged = bytes.clone();
        damaged[bytes.len() - 10] ^= 0xFF;
        for (covered_op, expected_last_op) in [(2, 2), (3, 3), (5, 5)] {
            let dir = tempfile::tempdir().unwrap();
            write_segment(dir.path(), 1, &damaged);
            let scanned = block_on(scan(dir.path(), covered_op, UncoveredDamage::Refuse)).unwrap();
            let record = &scanned.recovery.damaged_records[0];
            assert_eq!(
                (record.position, record.op, record.size_bytes),
                (2 * record_size as u64, 3, record_size as u64)
            );
            assert_eq!(scanned.last_op, expected_last_op);
            assert_eq!(scanned.recovery.prepares.len(), 2);
            if covered_op < 3 {
                assert_eq!(record.disposition, TailDisposition::Truncated);
                assert_eq!(
                    scanned.repair,
                    Repair::Truncate {
                        size_bytes: 2 * record_size as u64
                    }
                );
                assert_eq!(scanned.recovery.truncated_bytes, record_size as u64);
            } else {
                let resume_op = covered_op + 1;
                assert_eq!(
                    record.disposition,
                    TailDisposition::CoveredBySnapshot { resume_op }
                );
                assert_eq!(
                    scanned.repair,
                    Repair::StartSegment {
                        first_op: resume_op
                    }
                );
                assert_eq!(scanned.segment_first_ops, vec![1, resume_op]);
                assert_eq!(scanned.recovery.truncated_bytes, 0);
            }
            // Deciding wrote nothing.
            assert_eq!(std::fs::read(segment_path(dir.path(), 1)).unwrap(), damaged);
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);

            // After the repair, a second scan accepts the result and decides nothing more.
            let recovered = block_on(apply(scanned)).unwrap();
            drop(recovered);
            let again = block_on(scan(dir.path(), covered_op, UncoveredDamage::Refuse)).unwrap();
            assert_eq!(again.repair, Repair::None);
            assert_eq!(again.last_op, expected_last_op);
            assert_eq!(
                again.recovery.damaged_records.len(),
                usize::from(covered_op >= 3)
            );
        }
    }

    /// A closed segment ending in a damaged record is accepted only when the snapshot covers
    /// every op from it to the next segment's first op.
    #[test]
    fn a_closed_segment_ends_in_damage_only_when_the_snapshot_covers_the_gap() {
        let mut damaged = records(1..=3);
        let length = damaged.len();
        damaged[length - 10] ^= 0xFF;
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &damaged);
        write_segment(dir.path(), 4, &records(4..=4));
        let scanned = block_on(scan(dir.path(), 3, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(scanned.last_op, 4);
        let ops: Vec<u64> = scanned.recovery.prepares.iter().map(|p| p.op).collect();
        assert_eq!(ops, vec![1, 2, 4]);
        assert_eq!(
            scanned.recovery.damaged_records[0].disposition,
            TailDisposition::CoveredBySnapshot { resume_op: 4 }
        );
        // A snapshot at op 2 does not hold op 3: refused, naming the file and byte.
        let Err(JournalError::Corrupt { path, position, .. }) =
            block_on(scan(dir.path(), 2, UncoveredDamage::Refuse))
        else {
            panic!("a damaged closed segment above the covered op was accepted");
        };
        assert_eq!(
            (path, position),
            (segment_path(dir.path(), 1), (length - length / 3) as u64)
        );
    }

    /// Snapshot of every file in `dir` (name, bytes), sorted: what a refusal must leave as it is.
    fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|entry| {
                let entry = entry.unwrap();
                (
                    entry.file_name().to_string_lossy().into_owned(),
                    std::fs::read(entry.path()).unwrap(),
                )
            })
            .collect();
        files.sort();
        files
    }

    fn ops(scanned: &Scanned) -> Vec<u64> {
        scanned.recovery.prepares.iter().map(|p| p.op).collect()
    }

    /// Issue 7 (adv2): a body byte flipped in record 2 of 4 (not the last). With the snapshot at
    /// op 4 it is covered: ops 1, 3, 4 are read, the segment is closed and the journal goes on
    /// at op 5; a second open accepts the result. With the snapshot at op 1 it refuses, naming
    /// file and byte, writing nothing.
    #[test]
    fn issue7_interior_damage_at_or_below_the_covered_op_is_covered() {
        let mut bytes = records(1..=4);
        let record_size = bytes.len() / 4;
        bytes[record_size + JOURNAL_HEADER_SIZE + 5] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &bytes);
        let before = files(dir.path());

        let Err(JournalError::Corrupt { path, position, .. }) =
            block_on(scan(dir.path(), 1, UncoveredDamage::Refuse))
        else {
            panic!("damage above the covered op was accepted");
        };
        assert_eq!(
            (path, position),
            (segment_path(dir.path(), 1), record_size as u64)
        );
        assert_eq!(files(dir.path()), before);

        let scanned = block_on(scan(dir.path(), 4, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(ops(&scanned), vec![1, 3, 4]);
        assert_eq!(
            scanned.recovery.damaged_records,
            vec![DamagedRecord {
                path: segment_path(dir.path(), 1),
                position: record_size as u64,
                op: 2,
                size_bytes: record_size as u64,
                reason: scanned.recovery.damaged_records[0].reason.clone(),
                disposition: TailDisposition::CoveredBySnapshot { resume_op: 3 },
            }]
        );
        assert_eq!(scanned.repair, Repair::StartSegment { first_op: 5 });
        assert_eq!((scanned.last_op, scanned.active_size_bytes), (4, 0));
        assert_eq!(files(dir.path()), before);

        drop(block_on(apply(scanned)).unwrap());
        let again = block_on(scan(dir.path(), 4, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(again.repair, Repair::None);
        assert_eq!(again.segment_first_ops, vec![1, 5]);
        // Now closed, its damage is covered up to the next segment: nothing after it is read.
        assert_eq!((again.last_op, ops(&again)), (4, vec![1]));
        assert_eq!(std::fs::read(segment_path(dir.path(), 1)).unwrap(), bytes);
    }

    /// Damage at op 2 in a segment that goes on above the covered op: the walk resumes at the
    /// next valid record when it is at most `covered_op + 1`, and refuses when the unreadable
    /// bytes would hide an op above the checkpoint.
    #[test]
    fn issue7_covered_damage_resumes_only_without_losing_an_op_above_the_checkpoint() {
        let clean = records(1..=6);
        let record_size = clean.len() / 6;
        let mut body_damage = clean.clone();
        body_damage[record_size + JOURNAL_HEADER_SIZE + 1] ^= 1;
        for covered_op in [2, 3] {
            let dir = tempfile::tempdir().unwrap();
            write_segment(dir.path(), 1, &body_damage);
            let scanned = block_on(scan(dir.path(), covered_op, UncoveredDamage::Refuse)).unwrap();
            assert_eq!(ops(&scanned), vec![1, 3, 4, 5, 6]);
            assert_eq!(scanned.repair, Repair::StartSegment { first_op: 7 });
            assert_eq!(scanned.last_op, 6);
        }
        // Headers of records 2 and 3 damaged: the next valid record is op 4, but op 3 is above
        // a checkpoint at op 2.
        let mut header_damage = clean.clone();
        header_damage[record_size + 20] ^= 1;
        header_damage[2 * record_size + 20] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &header_damage);
        let before = files(dir.path());
        let Err(JournalError::Corrupt {
            path,
            position,
            reason,
        }) = block_on(scan(dir.path(), 2, UncoveredDamage::Refuse))
        else {
            panic!("damage hiding op 3 above the checkpoint was accepted");
        };
        assert_eq!(
            (path, position),
            (segment_path(dir.path(), 1), record_size as u64)
        );
        assert!(
            reason.ends_with(&format!(
                "at op 2, which the snapshot's checkpoint op 2 covers, but the next valid \
                 record, at byte {}, is op 4: ops 3 to 3 are unreadable: acknowledged ops above \
                 the checkpoint could be lost",
                3 * record_size
            )),
            "{reason}"
        );
        assert_eq!(files(dir.path()), before);
        // A checkpoint at op 3 covers both.
        let scanned = block_on(scan(dir.path(), 3, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(ops(&scanned), vec![1, 4, 5, 6]);
    }

    /// A closed segment with damage before its tail: covered when the next segment starts at
    /// most at `covered_op + 1` (no repair: the active segment is clean), refused otherwise.
    #[test]
    fn issue7_closed_segment_damage_is_covered_up_to_the_next_segment() {
        let mut closed = records(1..=3);
        let record_size = closed.len() / 3;
        closed[JOURNAL_HEADER_SIZE + 3] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &closed);
        write_segment(dir.path(), 4, &records(4..=5));
        let before = files(dir.path());
        let scanned = block_on(scan(dir.path(), 3, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(ops(&scanned), vec![4, 5]);
        assert_eq!(
            scanned.recovery.damaged_records[0].disposition,
            TailDisposition::CoveredBySnapshot { resume_op: 4 }
        );
        assert_eq!((scanned.repair, scanned.last_op), (Repair::None, 5));
        // The same damage with a checkpoint at op 0 is above it: refused in a closed segment.
        let Err(JournalError::Corrupt { position, .. }) =
            block_on(scan(dir.path(), 0, UncoveredDamage::Refuse))
        else {
            panic!("damage above the covered op in a closed segment was accepted");
        };
        assert_eq!(position, 0);
        assert_eq!(files(dir.path()), before);
        // Next segment at op 6 while the checkpoint is op 4: the walk resumes in the segment.
        let dir = tempfile::tempdir().unwrap();
        let mut closed = records(1..=5);
        closed[record_size + JOURNAL_HEADER_SIZE + 3] ^= 1;
        write_segment(dir.path(), 1, &closed);
        write_segment(dir.path(), 6, &records(6..=6));
        let scanned = block_on(scan(dir.path(), 4, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(ops(&scanned), vec![1, 3, 4, 5, 6]);
        assert_eq!((scanned.repair, scanned.last_op), (Repair::None, 6));
    }

    /// Unreadable bytes to the end of the last segment are covered when they are a torn tail,
    /// or too few to hold a record above the covered op; otherwise refused.
    #[test]
    fn issue7_an_unreadable_end_is_covered_only_when_it_cannot_hold_an_op_above_the_checkpoint() {
        let mut bytes = records(1..=2);
        bytes.resize(bytes.len() + JOURNAL_RECORD_SIZE_MAX + 1, 0);
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &bytes);
        let record_count_max = (JOURNAL_RECORD_SIZE_MAX + 1).div_ceil(JOURNAL_HEADER_SIZE) as u64;
        let highest_op = 3 + record_count_max - 1;
        assert!(block_on(scan(dir.path(), highest_op - 1, UncoveredDamage::Refuse)).is_err());
        let scanned = block_on(scan(dir.path(), highest_op, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(
            scanned.repair,
            Repair::StartSegment {
                first_op: highest_op + 1
            }
        );
    }

    /// No segment at all: a new journal at `covered_op + 1` (the caller decided no op above the
    /// snapshot exists).
    #[test]
    fn issue7_an_empty_journal_directory_starts_after_the_covered_op() {
        let dir = tempfile::tempdir().unwrap();
        let journal = dir.path().join("journal");
        let scanned = block_on(scan(&journal, 10, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(scanned.repair, Repair::CreateFirstSegment { first_op: 11 });
        assert_eq!(
            (scanned.last_op, scanned.segment_first_ops.clone()),
            (10, vec![11])
        );
        drop(block_on(apply(scanned)).unwrap());
        assert_eq!(
            files(&journal),
            vec![("00000000000000000011.wal".to_owned(), Vec::new())]
        );
    }

    /// A body-damaged record whose body holds a record-shaped sequence (a valid record for the
    /// next op, as a client-chosen name could carry): the walk resumes at the end of the damaged
    /// record, where its intact header says it ends, not inside its body.
    #[test]
    fn issue7_covered_damage_resumes_after_an_intact_header_not_inside_the_body() {
        let mut fake = Vec::new();
        encode_record(
            &Prepare {
                op: 3,
                view: 1,
                commit: 2,
                body: b"forged".to_vec(),
            },
            &mut fake,
        );
        let mut host_body = fake.clone();
        host_body.push(0);
        let mut bytes = records(1..=1);
        let host_position = bytes.len();
        encode_record(
            &Prepare {
                op: 2,
                view: 1,
                commit: 1,
                body: host_body,
            },
            &mut bytes,
        );
        let op3_position = bytes.len();
        let tail = records(3..=4);
        bytes.extend_from_slice(&tail);
        // The byte after the embedded record: the host's body checksum fails.
        bytes[op3_position - 1] ^= 1;
        let dir = tempfile::tempdir().unwrap();
        write_segment(dir.path(), 1, &bytes);
        let scanned = block_on(scan(dir.path(), 4, UncoveredDamage::Refuse)).unwrap();
        assert_eq!(ops(&scanned), vec![1, 3, 4]);
        assert_eq!(scanned.recovery.prepares[1].body, vec![3u8; 10]);
        let record = &scanned.recovery.damaged_records[0];
        assert_eq!(
            (record.position, record.size_bytes),
            (host_position as u64, (op3_position - host_position) as u64)
        );
    }
}
