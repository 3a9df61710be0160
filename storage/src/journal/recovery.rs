//! Opening a journal directory: list the segments, check that their ops follow each other, read
//! every record, and truncate a torn tail of the last segment. Damage anywhere a torn write
//! cannot explain is an error here, never skipped or truncated.

use std::path::Path;

use compio::fs::{File, OpenOptions};

use super::record::{JOURNAL_HEADER_SIZE, JournalHeader, Prepare, parse_record};
use super::{JournalError, JournalRecovery, io_error, segment_path};
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

pub(super) async fn recover(dir: &Path) -> Result<Recovered, JournalError> {
    create_journal_dir(dir).await?;
    let first_ops = list_segments(dir).await?;
    let Some((&last_first_op, closed_first_ops)) = first_ops.split_last() else {
        // A new journal: VSR numbers prepares from op 1 (op 0 is the root prepare).
        let path = segment_path(dir, 1);
        let active_file = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
            .map_err(io_error(&path, "create segment"))?;
        sync_dir(dir).await.map_err(io_error(
            dir,
            "fsync journal directory after creating a segment",
        ))?;
        return Ok(Recovered {
            segment_first_ops: vec![1],
            active_file,
            active_size_bytes: 0,
            last_op: 0,
            recovery: JournalRecovery {
                segment_count: 1,
                ..JournalRecovery::default()
            },
        });
    };

    let mut prepares = Vec::new();
    let mut record_positions = Vec::new();
    let mut next_op = None;
    for &first_op in closed_first_ops {
        let path = segment_path(dir, first_op);
        check_first_op(&path, first_op, next_op)?;
        let file = File::open(&path)
            .await
            .map_err(io_error(&path, "open segment"))?;
        let bytes = read_segment(&file, &path).await?;
        // A close error on a read-only descriptor cannot lose data; the bytes are verified.
        let _ = file.close().await;
        let scan = scan_segment(&bytes, first_op, &mut prepares, &mut record_positions);
        if let Some(invalid) = scan.invalid {
            return Err(JournalError::Corrupt {
                path,
                position: invalid.position as u64,
                reason: format!(
                    "in a closed segment (damage before the tail refuses to boot): {}",
                    invalid.reason
                ),
            });
        }
        next_op = Some(scan.next_op);
    }

    let path = segment_path(dir, last_first_op);
    check_first_op(&path, last_first_op, next_op)?;
    let active_file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .await
        .map_err(io_error(&path, "open segment"))?;
    let bytes = read_segment(&active_file, &path).await?;
    let scan = scan_segment(&bytes, last_first_op, &mut prepares, &mut record_positions);
    let mut truncated_bytes = 0;
    if let Some(invalid) = scan.invalid {
        if let Some(reason) = interior_damage(&bytes, invalid.position, scan.next_op) {
            return Err(JournalError::Corrupt {
                path,
                position: invalid.position as u64,
                reason: format!("{} ({reason})", invalid.reason),
            });
        }
        truncated_bytes = (bytes.len() - invalid.position) as u64;
        tracing::warn!(
            segment = %path.display(),
            position = invalid.position,
            truncated_bytes,
            reason = %invalid.reason,
            "truncating the torn tail of the journal"
        );
        active_file
            .set_len(invalid.position as u64)
            .await
            .map_err(io_error(&path, "truncate torn tail"))?;
        active_file
            .sync_all()
            .await
            .map_err(io_error(&path, "fsync after truncating torn tail"))?;
    }
    Ok(Recovered {
        segment_first_ops: first_ops.clone(),
        active_file,
        active_size_bytes: scan.end_position as u64,
        last_op: scan.next_op - 1,
        recovery: JournalRecovery {
            prepares,
            record_positions,
            truncated_bytes,
            segment_count: first_ops.len() as u32,
        },
    })
}

/// Creates the journal directory durably (see `durable::create_dir_durable`).
async fn create_journal_dir(dir: &Path) -> Result<(), JournalError> {
    create_dir_durable(dir)
        .await
        .map_err(|failed| io_error(&failed.path, failed.step)(failed.source))
}

/// First ops of the segment files in `dir`, ascending; other files are skipped (a `*.wal` file
/// with a malformed name is logged). Listing uses `std::fs::read_dir` on compio's blocking pool:
/// `io_uring` has no getdents operation.
async fn list_segments(dir: &Path) -> Result<Vec<u64>, JournalError> {
    let names = list_dir_names(dir)
        .await
        .map_err(io_error(dir, "list journal directory"))?;
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
}
