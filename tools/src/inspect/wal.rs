//! `inspect wal`: checks the metadata journal by the open rules of `storage/FORMAT.md` section 8
//! (segment names and op contiguity, every record through `storage::journal::parse_record`, and
//! when the data directory's superblock lies beside the journal directory, damage at or below its
//! checkpoint op judged by open's own `storage::journal::covered_resume` (covered, skipped, or
//! refused when the skip could lose an op above it); damage above it is a torn tail open cuts
//! (last segment) or refuses. A journal directory without segments beside a superblock gets
//! boot's refusal (FORMAT.md section 10). Reads only; never truncates a torn tail. It must never
//! call a record "never acknowledged" unless its op is above the checkpoint.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use storage::journal::{
    CoveredResume, JOURNAL_HEADER_SIZE, JournalHeader, covered_resume, parse_record, segment_path,
};
use storage::limits::{
    JOURNAL_BODY_SIZE_MAX, JOURNAL_RECORD_SIZE_MAX, JOURNAL_SEGMENT_SIZE_MAX,
    SUPERBLOCK_COPY_COUNT, SUPERBLOCK_COPY_SIZE,
};
use storage::superblock::{SUPERBLOCK_FILE_NAME, decode_copy};

use super::{Damage, Report, open_read_only, parent_dir, read_bounded, segments_for};

#[derive(Debug, serde::Serialize)]
pub(crate) struct WalReport {
    segments: Vec<WalSegment>,
    segment_count: usize,
    record_count: u64,
    /// The first segment's first op (from its name).
    first_op: Option<u64>,
    /// The op of the last valid record (`first_op - 1` when there is none), or the checkpoint op
    /// when the last segment ends in damage the snapshot covers (where open continues).
    last_op: Option<u64>,
    size_bytes: u64,
    /// The checkpoint op of the superblock beside the journal directory (its newest valid copy),
    /// when there is one: damaged last records at or below it are covered by the snapshot.
    checkpoint_op: Option<u64>,
}

#[derive(Debug, serde::Serialize)]
struct WalSegment {
    file: String,
    first_op: Option<u64>,
    size_bytes: u64,
    /// The active segment, where a torn tail is possible.
    last: bool,
    records: Vec<WalRecord>,
}

#[derive(Debug, serde::Serialize)]
struct WalRecord {
    position: u64,
    op: u64,
    view: u32,
    commit: u64,
    body_size_bytes: u32,
    /// Header and body checksums verify (only valid records are listed).
    checksums_ok: bool,
    /// The server's prepare body (FORMAT.md section 8.1), summarized: the client, its request
    /// number and the operation; or why the body does not decode (boot would refuse).
    prepare: String,
}

/// One line for a prepare body: `client 0x.. request N: Operation {..}`.
fn describe_prepare(body: &[u8]) -> String {
    match shards::vsr::prepare::PrepareBody::decode(body) {
        Ok(prepare) => format!(
            "client {} request {}: {:?}",
            prepare.client, prepare.request, prepare.operation
        ),
        Err(reason) => format!("not a shardline prepare body: {reason}"),
    }
}

/// Whether the first invalid record of the last segment, at `position`, is interior damage, by the
/// rule of `Journal::open` (FORMAT.md section 8, open step 5): more bytes follow than one append
/// can tear, or a valid record for `next_op` or later starts after it.
fn interior_damage(bytes: &[u8], position: usize, next_op: u64) -> Option<String> {
    let tail_size = bytes.len() - position;
    if tail_size > JOURNAL_RECORD_SIZE_MAX {
        return Some(format!(
            "{tail_size} bytes follow, more than one {JOURNAL_RECORD_SIZE_MAX}-byte append can tear"
        ));
    }
    for candidate in position + 1..bytes.len() {
        let Some(header) = JournalHeader::decode(&bytes[candidate..]) else {
            break;
        };
        if header.reserved != 0 || header.size > JOURNAL_BODY_SIZE_MAX || header.op < next_op {
            continue;
        }
        if let Ok((header, _)) = parse_record(&bytes[candidate..]) {
            return Some(format!(
                "a valid record for op {} follows at byte {candidate}",
                header.op
            ));
        }
    }
    None
}

/// The superblock beside the journal at `path` (a journal directory, or one segment in it): the
/// data directory's `superblock`, and the checkpoint op of its newest valid copy, if it is there
/// and readable.
fn checkpoint_beside(path: &Path) -> Option<(String, u64)> {
    let journal_dir = if path.is_dir() {
        path
    } else {
        parent_dir(path)
    };
    let superblock = parent_dir(journal_dir).join(SUPERBLOCK_FILE_NAME);
    let file = open_read_only(&superblock).ok()?;
    let mut bytes = Vec::new();
    file.take((SUPERBLOCK_COPY_COUNT * SUPERBLOCK_COPY_SIZE) as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    let newest = (0..SUPERBLOCK_COPY_COUNT)
        .filter_map(|copy_index| {
            let start = copy_index * SUPERBLOCK_COPY_SIZE;
            decode_copy(bytes.get(start..start + SUPERBLOCK_COPY_SIZE)?, copy_index).ok()
        })
        .max_by_key(|state| state.sequence)?;
    Some((superblock.display().to_string(), newest.checkpoint_op))
}

/// The verdict on a damaged record at the end of the **last** segment (tail-shaped), whose op is
/// `op`, `torn_bytes` from the end: cut as a torn tail when `op` is above the checkpoint, left in
/// place when the snapshot covers it (FORMAT.md section 8, open step 5). Returns (whether open
/// cuts it, the text).
fn last_record_verdict(
    op: u64,
    torn_bytes: usize,
    checkpoint: Option<&(String, u64)>,
) -> (bool, String) {
    match checkpoint {
        Some((_, checkpoint_op)) if op <= *checkpoint_op => (
            false,
            format!(
                "the damaged last record (op {op}, {torn_bytes} bytes) is covered by the snapshot \
                 at checkpoint op {checkpoint_op}: open leaves it in place and continues the \
                 journal in a new segment at op {}; nothing acknowledged is lost",
                checkpoint_op + 1
            ),
        ),
        Some((superblock, checkpoint_op)) => (
            true,
            format!(
                "a torn tail of {torn_bytes} bytes in the last segment, which open would \
                 truncate (op {op} is above the checkpoint op {checkpoint_op} in {superblock}: \
                 if a crash cut the write short, that prepare was never acknowledged)"
            ),
        ),
        None => (
            true,
            format!(
                "a torn tail of {torn_bytes} bytes in the last segment, which open would \
                 truncate if op {op} is above the snapshot's checkpoint op, and leave in place if \
                 the snapshot covers it (no readable superblock beside this journal to tell which)"
            ),
        ),
    }
}

/// The verdict on damage at op `op` that the checkpoint covers (`op <= checkpoint_op`), by
/// open's rule ([`covered_resume`], FORMAT.md section 8, open step 4): where open resumes, as
/// text to append to the record's defect, or why open refuses.
fn covered_verdict(
    bytes: &[u8],
    position: usize,
    op: u64,
    following_first_op: Option<u64>,
    checkpoint_op: u64,
) -> Result<(CoveredResume, String), String> {
    let resume = covered_resume(bytes, position, op, following_first_op, checkpoint_op)
        .map_err(|why| format!(" {why}: open refuses to boot"))?;
    let text = match (resume, following_first_op) {
        (
            CoveredResume::InSegment {
                position,
                op: resume_op,
            },
            _,
        ) => format!(
            "; damage at op {op} covered by the snapshot at checkpoint op {checkpoint_op}: open \
             skips it (never replayed) and resumes at op {resume_op} at byte {position}{}",
            if following_first_op.is_none() {
                ", then continues the journal in a new segment; nothing acknowledged is lost"
            } else {
                "; the next checkpoint releases this segment"
            }
        ),
        (CoveredResume::NextSegment { op: resume_op }, Some(_)) => format!(
            "; damage in a closed segment at op {op} is covered by the snapshot at checkpoint \
             op {checkpoint_op}: open leaves it in place, the journal continues at op \
             {resume_op}, and the next checkpoint releases this segment"
        ),
        (CoveredResume::NextSegment { op: resume_op }, None) => format!(
            "; the damaged last record (op {op}, {} bytes) is covered by the snapshot at \
             checkpoint op {checkpoint_op}: open leaves it in place and continues the journal \
             in a new segment at op {resume_op}; nothing acknowledged is lost",
            bytes.len() - position
        ),
    };
    Ok((resume, text))
}

/// The verdict on a journal directory without a segment: a new journal when no superblock lies
/// beside it; boot's refusal when one does (it cannot tell whether ops above its checkpoint were
/// acknowledged; FORMAT.md section 10).
fn missing_journal_verdict(path: &Path, checkpoint: Option<&(String, u64)>) -> String {
    match checkpoint {
        None => "no journal segment (a file named by its first op in 20 digits, e.g. \
                 00000000000000000001.wal) here (open would start a new, empty journal)"
            .to_owned(),
        Some((superblock, checkpoint_op)) => format!(
            "no journal segment, but {superblock} (checkpoint op {checkpoint_op}) exists: boot \
             refuses, since the superblock cannot tell whether ops above the checkpoint were \
             acknowledged. Restore the journal; or, if the server's last log lines show a clean \
             stop with \"checkpoint done\" at checkpoint_op {checkpoint_op}, create the empty \
             segment {}",
            segment_path(path, checkpoint_op + 1).display()
        ),
    }
}

/// Lists the valid records of `segment` from byte `position`, each carrying the next op (the
/// first sets it when `next_op` is unknown), advancing `position` and `next_op`; returns why the
/// first invalid record is invalid, or `None` at the end of the bytes.
fn walk_records(
    bytes: &[u8],
    position: &mut usize,
    next_op: &mut Option<u64>,
    segment: &mut WalSegment,
) -> Option<String> {
    loop {
        if *position == bytes.len() {
            return None;
        }
        let (header, body) = match parse_record(&bytes[*position..]) {
            Ok(record) => record,
            Err(reason) => return Some(reason),
        };
        let expected = *next_op.get_or_insert(header.op);
        if header.op != expected {
            return Some(format!("op {} where op {expected} was expected", header.op));
        }
        segment.records.push(WalRecord {
            position: *position as u64,
            op: header.op,
            view: header.view,
            commit: header.commit,
            body_size_bytes: header.size,
            checksums_ok: true,
            prepare: describe_prepare(body),
        });
        *position += JOURNAL_HEADER_SIZE + body.len();
        *next_op = Some(expected + 1);
    }
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(WalReport, Vec<Damage>)> {
    let (files, final_is_last) = segments_for(path, "wal")?;
    let mut damage = Vec::new();
    let checkpoint = checkpoint_beside(path);
    if files.is_empty() {
        damage.push(Damage::new(
            path,
            None,
            missing_journal_verdict(path, checkpoint.as_ref()),
        ));
    }
    let following_first_ops: Vec<Option<u64>> = files
        .iter()
        .skip(1)
        .map(|(first_op, _)| *first_op)
        .chain(std::iter::once(None))
        .collect();
    let mut segments = Vec::new();
    let mut size_bytes = 0;
    // The op the next record must carry; `None` until known.
    let mut next_op: Option<u64> = None;
    let file_count = files.len();
    for (segment_index, (first_op, file)) in files.into_iter().enumerate() {
        let last = final_is_last && segment_index + 1 == file_count;
        if first_op == Some(0) {
            damage.push(Damage::new(
                &file,
                Some(0),
                "the segment starts at op 0, but op 0 is VSR's root prepare and is never journaled",
            ));
        }
        if let (Some(first_op), Some(expected)) = (first_op, next_op)
            && first_op != expected
        {
            damage.push(Damage::new(
                &file,
                Some(0),
                format!(
                    "op gap: the segment starts at op {first_op} but the previous segment ends \
                     before op {expected}"
                ),
            ));
        }
        if first_op.is_some() {
            next_op = first_op;
        }
        let mut segment = WalSegment {
            file: file.display().to_string(),
            first_op,
            size_bytes: 0,
            last,
            records: Vec::new(),
        };
        let bytes = match read_bounded(&file, JOURNAL_SEGMENT_SIZE_MAX)? {
            Ok(bytes) => bytes,
            Err(file_size_bytes) => {
                damage.push(Damage::new(
                    &file,
                    Some(0),
                    format!(
                        "{file_size_bytes} bytes exceeds the {JOURNAL_SEGMENT_SIZE_MAX}-byte \
                         segment limit"
                    ),
                ));
                segment.size_bytes = file_size_bytes;
                segments.push(segment);
                continue;
            }
        };
        segment.size_bytes = bytes.len() as u64;
        size_bytes += bytes.len() as u64;
        let mut position = 0;
        loop {
            let invalid = walk_records(&bytes, &mut position, &mut next_op, &mut segment);
            let Some(reason) = invalid else {
                break;
            };
            let op = next_op.unwrap_or(1);
            let position_u64 = Some(position as u64);
            let following_first_op = following_first_ops[segment_index];
            let covered = checkpoint
                .as_ref()
                .filter(|(_, checkpoint_op)| op <= *checkpoint_op)
                .map(|(_, checkpoint_op)| {
                    covered_verdict(&bytes, position, op, following_first_op, *checkpoint_op)
                });
            match covered {
                Some(Ok((resume, verdict))) => {
                    damage.push(Damage::new(
                        &file,
                        position_u64,
                        format!("{reason}{verdict}"),
                    ));
                    match resume {
                        CoveredResume::InSegment { position: at, op } => {
                            position = at;
                            next_op = Some(op);
                            continue;
                        }
                        CoveredResume::NextSegment { op } => {
                            next_op = Some(op);
                            break;
                        }
                    }
                }
                Some(Err(why)) => {
                    damage.push(Damage::new(&file, position_u64, format!("{reason}{why}")));
                }
                None if !last => {
                    let why = interior_damage(&bytes, position, op)
                        .map_or_else(String::new, |why| format!("{why}; "));
                    damage.push(Damage::new(
                        &file,
                        position_u64,
                        format!(
                            "{reason} ({why}in a closed segment: open refuses to boot; only \
                             damage at or below the snapshot's checkpoint op is skipped)"
                        ),
                    ));
                }
                None => {
                    if let Some(why) = interior_damage(&bytes, position, op) {
                        damage.push(Damage::new(
                            &file,
                            position_u64,
                            format!("{reason} ({why}: interior damage, open refuses to boot)"),
                        ));
                    } else {
                        let (torn_tail, verdict) =
                            last_record_verdict(op, bytes.len() - position, checkpoint.as_ref());
                        damage.push(Damage {
                            torn_tail,
                            ..Damage::new(&file, position_u64, format!("{reason}; {verdict}"))
                        });
                    }
                }
            }
            break;
        }
        segments.push(segment);
    }
    let first_op = segments.first().and_then(|segment| segment.first_op);
    let last_op = next_op
        .map(|next_op| next_op - 1)
        .or(first_op.map(|op| op - 1));
    let record_count = segments
        .iter()
        .map(|segment| segment.records.len() as u64)
        .sum();
    let report = WalReport {
        segment_count: segments.len(),
        segments,
        record_count,
        first_op,
        last_op,
        size_bytes,
        checkpoint_op: checkpoint.map(|(_, checkpoint_op)| checkpoint_op),
    };
    Ok((report, damage))
}

impl Report for WalReport {
    fn write_text(&self, out: &mut String) {
        for segment in &self.segments {
            let _ = writeln!(
                out,
                "segment {} ({} bytes{})",
                segment.file,
                segment.size_bytes,
                if segment.last { ", last" } else { "" }
            );
            let _ = writeln!(
                out,
                "  {:>10} {:>12} {:>6} {:>12} {:>10}  checksums  prepare",
                "byte", "op", "view", "commit", "body_bytes"
            );
            for record in &segment.records {
                let _ = writeln!(
                    out,
                    "  {:>10} {:>12} {:>6} {:>12} {:>10}  {:<9}  {}",
                    record.position,
                    record.op,
                    record.view,
                    record.commit,
                    record.body_size_bytes,
                    if record.checksums_ok { "ok" } else { "BAD" },
                    record.prepare
                );
            }
        }
        let show = |op: Option<u64>| op.map_or_else(|| "-".to_owned(), |op| op.to_string());
        let _ = writeln!(
            out,
            "summary: {} segment(s), {} record(s), first_op {}, last_op {}, {} bytes, \
             checkpoint_op {}",
            self.segment_count,
            self.record_count,
            show(self.first_op),
            show(self.last_op),
            self.size_bytes,
            show(self.checkpoint_op)
        );
    }
}

#[cfg(test)]
mod tests {
    use super::describe_prepare;
    use shards::vsr::prepare::{PrepareBody, PrepareOperation};

    #[test]
    fn prepare_bodies_are_summarized_and_foreign_bodies_named() {
        let body = PrepareBody::new(0xab, 0, PrepareOperation::Register, 0, 0).encode();
        assert_eq!(
            describe_prepare(&body),
            format!("client {:#034x} request 0: Register", 0xab)
        );
        assert!(describe_prepare(b"\x00\x01").starts_with("not a shardline prepare body: "));
    }
}
