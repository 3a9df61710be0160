//! Opening a journal directory, in two steps so that a caller can refuse before anything is
//! written: [`scan`] lists the segments, checks that their ops follow each other, reads every
//! record and decides what a damaged last record needs (read only); [`apply`] then does it
//! (truncate a torn tail, or start a segment after a record the snapshot covers, or create the
//! first segment of a new journal). Damage anywhere a torn write cannot explain is an error
//! here, never skipped or truncated.

use std::path::{Path, PathBuf};

use compio::fs::{File, OpenOptions};

use super::record::{JOURNAL_HEADER_SIZE, JournalHeader, Prepare, parse_record};
use super::{
    DamagedRecord, JournalError, JournalRecovery, TailDisposition, io_error, segment_path,
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
    /// A new journal: create the directory and `00000000000000000001.wal`.
    CreateFirstSegment,
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
}

/// Reads the journal in `dir` and decides its repair, writing nothing. `covered_op` is the op up
/// to which the caller's snapshot holds the state: a damaged last record at or below it is left
/// in place and the journal continues at `covered_op + 1` (FORMAT.md section 8, open).
pub(super) async fn scan(dir: &Path, covered_op: u64) -> Result<Scanned, JournalError> {
    let first_ops = list_segments(dir).await?;
    let Some((&last_first_op, closed_first_ops)) = first_ops.split_last() else {
        // A new journal: VSR numbers prepares from op 1 (op 0 is the root prepare).
        return Ok(Scanned {
            dir: dir.to_path_buf(),
            segment_first_ops: vec![1],
            active_size_bytes: 0,
            last_op: 0,
            repair: Repair::CreateFirstSegment,
            recovery: JournalRecovery {
                segment_count: 1,
                ..JournalRecovery::default()
            },
        });
    };

    let mut prepares = Vec::new();
    let mut record_positions = Vec::new();
    let mut damaged_records = Vec::new();
    let mut next_op = None;
    for (index, &first_op) in closed_first_ops.iter().enumerate() {
        let path = segment_path(dir, first_op);
        check_first_op(&path, first_op, next_op)?;
        let file = File::open(&path)
            .await
            .map_err(io_error(&path, "open segment"))?;
        let bytes = read_segment(&file, &path).await?;
        // A close error on a read-only descriptor cannot lose data; the bytes are verified.
        let _ = file.close().await;
        let scan = scan_segment(&bytes, first_op, &mut prepares, &mut record_positions);
        next_op = Some(scan.next_op);
        let Some(invalid) = scan.invalid else {
            continue;
        };
        let following_first_op = first_ops[index + 1];
        let damaged = covered_closed_tail(
            &path,
            &bytes,
            &invalid,
            scan.next_op,
            following_first_op,
            covered_op,
        )?;
        damaged_records.push(damaged);
        // The ops from the damaged one up to the next segment are held by the snapshot.
        next_op = Some(following_first_op);
    }

    let path = segment_path(dir, last_first_op);
    check_first_op(&path, last_first_op, next_op)?;
    let file = File::open(&path)
        .await
        .map_err(io_error(&path, "open segment"))?;
    let bytes = read_segment(&file, &path).await?;
    let _ = file.close().await;
    let scan = scan_segment(&bytes, last_first_op, &mut prepares, &mut record_positions);
    let mut segment_first_ops = first_ops.clone();
    let mut active_size_bytes = scan.end_position as u64;
    let mut last_op = scan.next_op - 1;
    let mut repair = Repair::None;
    let mut truncated_bytes = 0;
    if let Some(invalid) = scan.invalid {
        if let Some(reason) = interior_damage(&bytes, invalid.position, scan.next_op) {
            return Err(JournalError::Corrupt {
                path,
                position: invalid.position as u64,
                reason: format!("{} ({reason})", invalid.reason),
            });
        }
        let size_bytes = (bytes.len() - invalid.position) as u64;
        let disposition = if scan.next_op <= covered_op {
            // The snapshot holds this op: nothing acknowledged is lost by leaving it, and cutting
            // it would leave a journal that ends below the snapshot.
            let resume_op = covered_op + 1;
            repair = Repair::StartSegment {
                first_op: resume_op,
            };
            segment_first_ops.push(resume_op);
            active_size_bytes = 0;
            last_op = covered_op;
            TailDisposition::CoveredBySnapshot { resume_op }
        } else {
            repair = Repair::Truncate {
                size_bytes: invalid.position as u64,
            };
            truncated_bytes = size_bytes;
            TailDisposition::Truncated
        };
        damaged_records.push(DamagedRecord {
            path,
            position: invalid.position as u64,
            op: scan.next_op,
            size_bytes,
            reason: invalid.reason,
            disposition,
        });
    }
    let segment_count = segment_first_ops.len() as u32;
    Ok(Scanned {
        dir: dir.to_path_buf(),
        segment_first_ops,
        active_size_bytes,
        last_op,
        repair,
        recovery: JournalRecovery {
            prepares,
            record_positions,
            truncated_bytes,
            damaged_records,
            segment_count,
        },
    })
}

/// A closed segment whose first invalid record, at `invalid`, is acceptable only as a damaged
/// last record the snapshot covers, left behind by an earlier open (FORMAT.md section 8, open
/// step 4): tail-shaped (nothing valid after it, at most one record's bytes), and every op from
/// it (`damaged_op`) up to the next segment's first op is at or below `covered_op`.
fn covered_closed_tail(
    path: &Path,
    bytes: &[u8],
    invalid: &Invalid,
    damaged_op: u64,
    following_first_op: u64,
    covered_op: u64,
) -> Result<DamagedRecord, JournalError> {
    let refuse = |why: String| JournalError::Corrupt {
        path: path.to_path_buf(),
        position: invalid.position as u64,
        reason: format!(
            "in a closed segment (damage before the tail refuses to boot): {} ({why})",
            invalid.reason
        ),
    };
    if let Some(why) = interior_damage(bytes, invalid.position, damaged_op) {
        return Err(refuse(why));
    }
    if following_first_op <= damaged_op || following_first_op - 1 > covered_op {
        return Err(refuse(format!(
            "the next segment starts at op {following_first_op}, but only a damaged last record \
             at or below the snapshot's checkpoint op {covered_op}, followed by a segment \
             starting at most at op {}, is left in a closed segment",
            covered_op + 1
        )));
    }
    Ok(DamagedRecord {
        path: path.to_path_buf(),
        position: invalid.position as u64,
        op: damaged_op,
        size_bytes: (bytes.len() - invalid.position) as u64,
        reason: invalid.reason.clone(),
        disposition: TailDisposition::CoveredBySnapshot {
            resume_op: following_first_op,
        },
    })
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
    } = scanned;
    let active_first_op = *segment_first_ops
        .last()
        .expect("a scan leaves at least one segment");
    let path = segment_path(&dir, active_first_op);
    let active_file = match repair {
        Repair::CreateFirstSegment | Repair::StartSegment { .. } => {
            if repair == Repair::CreateFirstSegment {
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

/// Checks the records of one segment in order, pushing each valid one to `prepares` and its
/// `(first_op, byte position)` to `record_positions`: each must be valid ([`parse_record`]) and
/// carry the next op (the first one `first_op`). Stops at the first record that fails.
fn scan_segment(
    bytes: &[u8],
    first_op: u64,
    prepares: &mut Vec<Prepare>,
    record_positions: &mut Vec<(u64, u64)>,
) -> Scan {
    let mut position = 0;
    let mut next_op = first_op;
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
        let scan = scan_segment(&bytes, 5, &mut prepares, &mut Vec::new());
        assert_eq!(prepares.len(), 3);
        assert_eq!((scan.next_op, scan.end_position), (8, bytes.len()));
        assert!(scan.invalid.is_none());

        prepares.clear();
        let scan = scan_segment(&bytes, 4, &mut prepares, &mut Vec::new());
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
            let scanned = block_on(scan(dir.path(), covered_op)).unwrap();
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
            let again = block_on(scan(dir.path(), covered_op)).unwrap();
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
        let scanned = block_on(scan(dir.path(), 3)).unwrap();
        assert_eq!(scanned.last_op, 4);
        let ops: Vec<u64> = scanned.recovery.prepares.iter().map(|p| p.op).collect();
        assert_eq!(ops, vec![1, 2, 4]);
        assert_eq!(
            scanned.recovery.damaged_records[0].disposition,
            TailDisposition::CoveredBySnapshot { resume_op: 4 }
        );
        // A snapshot at op 2 does not hold op 3: refused, naming the file and byte.
        let Err(JournalError::Corrupt { path, position, .. }) = block_on(scan(dir.path(), 2))
        else {
            panic!("a damaged closed segment above the covered op was accepted");
        };
        assert_eq!(
            (path, position),
            (segment_path(dir.path(), 1), (length - length / 3) as u64)
        );
    }
}
