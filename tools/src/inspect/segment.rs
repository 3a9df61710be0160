//! `inspect segment`: walks the entries of partition log segments by the validity rule of
//! `storage/FORMAT.md` section 3 and checks each `.index` file (section 4) against the entries it
//! describes. Reads only; never truncates a torn tail nor rewrites an index.

use std::fmt::Write as _;
use std::io::{BufReader, Read as _};
use std::path::{Path, PathBuf};

use storage::durable::TRAILER_SIZE;
use storage::limits::{DURABLE_FILE_SIZE_MAX, ENTRY_SIZE_MAX, SCAN_CHUNK_BYTES};
use storage::{ENTRY_HEADER_SIZE, EntryHeader, payload_checksum};
use twox_hash::XxHash3_64;

use super::{Damage, Report, open_read_only, read_bounded, segments_for};

/// Index payload layout (FORMAT.md section 4).
const INDEX_MAGIC: &[u8; 8] = b"SLINDEX\0";
const INDEX_VERSION: u32 = 1;
const INDEX_HEADER_SIZE: usize = 48;
const INDEX_ROW_SIZE: usize = 16;

#[derive(Debug, serde::Serialize)]
pub(crate) struct SegmentReport {
    segments: Vec<LogSegment>,
    segment_count: usize,
    entry_count: u64,
    message_count: u64,
    /// One past the last valid entry's last offset.
    next_offset: Option<u64>,
    size_bytes: u64,
}

#[derive(Debug, serde::Serialize)]
struct LogSegment {
    file: String,
    base_offset: Option<u64>,
    size_bytes: u64,
    /// The active segment, where a torn tail is possible.
    last: bool,
    entries: Vec<LogEntry>,
    index: IndexCheck,
}

#[derive(Debug, serde::Serialize)]
struct LogEntry {
    position: u64,
    base_offset: u64,
    message_count: u32,
    length_bytes: u32,
    base_timestamp_us: u64,
    /// The payload's XXH3-64 equals the header's (only valid entries are listed).
    checksum_ok: bool,
}

/// What the segment's `.index` file says.
#[derive(Debug, serde::Serialize)]
#[serde(tag = "status", rename_all = "snake_case")]
enum IndexCheck {
    /// No `{base:020}.index` (normal for the last segment).
    Absent,
    /// Verifies and describes exactly the entries found.
    Matches { row_count: u64 },
    /// Does not verify or does not match; `ignored_by_open` when the segment is the last one
    /// (open scans it anyway) or damaged.
    Mismatch {
        reason: String,
        ignored_by_open: bool,
    },
    /// Not compared: the segment has no name to find it by.
    Unknown,
}

/// Row `(base_offset, position)` of each valid entry.
type Rows = Vec<(u64, u64)>;

struct Scan {
    entries: Vec<LogEntry>,
    end_offset: u64,
    end_position: u64,
    /// Byte position and reason of the first invalid entry.
    invalid: Option<(u64, String)>,
}

/// Walks the entries of `file` expecting the first at `base_offset` (`None`: whatever it says).
fn scan(file: &Path, base_offset: Option<u64>, size_bytes: u64) -> anyhow::Result<Scan> {
    let mut reader = BufReader::with_capacity(SCAN_CHUNK_BYTES, open_read_only(file)?);
    let read_error =
        |error: std::io::Error| anyhow::anyhow!("{}: cannot read: {error}", file.display());
    let mut entries = Vec::new();
    let mut position = 0u64;
    let mut next_offset = base_offset;
    let mut payload = Vec::new();
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
        reader.read_exact(&mut header_bytes).map_err(read_error)?;
        let Some(header) = EntryHeader::decode(&header_bytes) else {
            unreachable!("32 bytes decode");
        };
        let entry_size = ENTRY_HEADER_SIZE as u64 + u64::from(header.length);
        if entry_size > u64::from(ENTRY_SIZE_MAX) {
            break Some(format!(
                "entry of {entry_size} bytes exceeds the {ENTRY_SIZE_MAX}-byte limit"
            ));
        }
        if header.message_count == 0 {
            break Some("message_count is 0".to_owned());
        }
        let expected = *next_offset.get_or_insert(header.base_offset);
        if header.base_offset != expected {
            break Some(format!(
                "base_offset {} where offset {expected} was expected",
                header.base_offset
            ));
        }
        let Some(end_offset) = expected.checked_add(u64::from(header.message_count)) else {
            break Some("base_offset + message_count overflows".to_owned());
        };
        if entry_size > left {
            break Some(format!(
                "payload of {} bytes but only {} bytes left after the header",
                header.length,
                left - ENTRY_HEADER_SIZE as u64
            ));
        }
        payload.resize(header.length as usize, 0);
        reader.read_exact(&mut payload).map_err(read_error)?;
        let computed = payload_checksum(&payload);
        if computed != header.checksum {
            break Some(format!(
                "payload checksum {computed:#018x} differs from the header's {:#018x}",
                header.checksum
            ));
        }
        entries.push(LogEntry {
            position,
            base_offset: header.base_offset,
            message_count: header.message_count,
            length_bytes: header.length,
            base_timestamp_us: header.base_timestamp_us,
            checksum_ok: true,
        });
        position += entry_size;
        next_offset = Some(end_offset);
    };
    Ok(Scan {
        entries,
        end_offset: next_offset.unwrap_or(0),
        end_position: position,
        invalid: invalid.map(|reason| (position, reason)),
    })
}

/// Checks the index file `index_path` against the scanned segment; `Err` says why it does not
/// match.
fn check_index(
    index_path: &Path,
    base_offset: u64,
    size_bytes: u64,
    end_offset: u64,
    rows: &Rows,
) -> anyhow::Result<Result<u64, String>> {
    let bytes = match read_bounded(index_path, DURABLE_FILE_SIZE_MAX)? {
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
    let (payload, trailer) = bytes.split_at(payload_size);
    let mut stored = [0u8; TRAILER_SIZE];
    stored.copy_from_slice(trailer);
    let stored = u64::from_le_bytes(stored);
    let computed = XxHash3_64::oneshot(payload);
    if stored != computed {
        return Ok(Err(format!(
            "trailer at byte {payload_size} has {stored:#018x}, the payload hashes to \
             {computed:#018x}"
        )));
    }
    if payload.len() < INDEX_HEADER_SIZE {
        return Ok(Err(format!(
            "{} payload bytes, shorter than the {INDEX_HEADER_SIZE}-byte index header",
            payload.len()
        )));
    }
    let u64_at = |at: usize| {
        let mut field = [0u8; 8];
        field.copy_from_slice(&payload[at..at + 8]);
        u64::from_le_bytes(field)
    };
    if &payload[0..8] != INDEX_MAGIC {
        return Ok(Err("bad magic".to_owned()));
    }
    let mut version = [0u8; 4];
    version.copy_from_slice(&payload[8..12]);
    let version = u32::from_le_bytes(version);
    if version != INDEX_VERSION {
        return Ok(Err(format!("version {version}, expected {INDEX_VERSION}")));
    }
    let checks = [
        ("segment_base_offset", u64_at(16), base_offset),
        ("segment_end_offset", u64_at(24), end_offset),
        ("segment_size_bytes", u64_at(32), size_bytes),
        ("row_count", u64_at(40), rows.len() as u64),
    ];
    for (field, stored, found) in checks {
        if stored != found {
            return Ok(Err(format!(
                "{field} is {stored}, the segment's entries give {found}"
            )));
        }
    }
    if payload.len() != INDEX_HEADER_SIZE + rows.len() * INDEX_ROW_SIZE {
        return Ok(Err(format!(
            "{} payload bytes do not hold exactly {} rows",
            payload.len(),
            rows.len()
        )));
    }
    for (row_index, &(row_offset, row_position)) in rows.iter().enumerate() {
        let at = INDEX_HEADER_SIZE + row_index * INDEX_ROW_SIZE;
        let stored = (u64_at(at), u64_at(at + 8));
        if stored != (row_offset, row_position) {
            return Ok(Err(format!(
                "row {row_index} is (offset {}, byte {}), the entry is at (offset \
                 {row_offset}, byte {row_position})",
                stored.0, stored.1
            )));
        }
    }
    Ok(Ok(rows.len() as u64))
}

fn index_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.index"))
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(SegmentReport, Vec<Damage>)> {
    let (files, final_is_last) = segments_for(path, "log")?;
    let mut damage = Vec::new();
    if files.is_empty() {
        damage.push(Damage::new(
            path,
            None,
            if path.join("partitions").is_dir() {
                "no log segment (NNNNNNNNNNNNNNNNNNNN.log) here: this looks like a data \
                 directory; inspect a partition directory, partitions/STREAM/TOPIC/PARTITION"
            } else {
                "no log segment (a file named by its base offset in 20 digits, e.g. \
                 00000000000000000000.log) here (open would start an empty log)"
            },
        ));
    }
    let mut segments = Vec::new();
    let (mut entry_count, mut message_count, mut size_bytes) = (0u64, 0u64, 0u64);
    let mut next_offset: Option<u64> = None;
    let file_count = files.len();
    for (segment_index, (base_offset, file)) in files.into_iter().enumerate() {
        let last = final_is_last && segment_index + 1 == file_count;
        // A partition directory starts at offset 0; a lone file is checked from its own name.
        let expected = if path.is_dir() {
            Some(next_offset.unwrap_or(0))
        } else {
            base_offset
        };
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
        let scan = scan(&file, base_offset.or(expected), file_size_bytes)?;
        entry_count += scan.entries.len() as u64;
        message_count += scan
            .entries
            .iter()
            .map(|entry| u64::from(entry.message_count))
            .sum::<u64>();
        if let Some((position, reason)) = &scan.invalid {
            if last {
                damage.push(Damage {
                    torn_tail: true,
                    ..Damage::new(
                        &file,
                        Some(*position),
                        format!(
                            "{reason}; a torn tail of {} bytes in the last segment, which open \
                             would truncate (or interior damage, which FORMAT.md section 3 \
                             cannot tell apart)",
                            file_size_bytes - position
                        ),
                    )
                });
            } else {
                damage.push(Damage::new(
                    &file,
                    Some(*position),
                    format!(
                        "{reason} (in a closed segment: reads of it fail; open refuses it when the \
                         segment must be rescanned, i.e. its index file is missing or stale)"
                    ),
                ));
            }
        }
        let index = match base_offset {
            None => IndexCheck::Unknown,
            Some(base_offset) => {
                let index_file = index_path(super::parent_dir(&file), base_offset);
                if index_file.exists() {
                    let rows: Rows = scan
                        .entries
                        .iter()
                        .map(|entry| (entry.base_offset, entry.position))
                        .collect();
                    match check_index(
                        &index_file,
                        base_offset,
                        file_size_bytes,
                        scan.end_offset.max(base_offset),
                        &rows,
                    )? {
                        Ok(row_count) => IndexCheck::Matches { row_count },
                        Err(reason) => {
                            let ignored_by_open = last || scan.invalid.is_some();
                            if !ignored_by_open {
                                damage.push(Damage::new(
                                    &index_file,
                                    None,
                                    format!(
                                        "index does not match its closed segment: {reason} \
                                         (open would rescan the segment and rewrite the index)"
                                    ),
                                ));
                            }
                            IndexCheck::Mismatch {
                                reason,
                                ignored_by_open,
                            }
                        }
                    }
                } else {
                    IndexCheck::Absent
                }
            }
        };
        next_offset = Some(if scan.entries.is_empty() {
            base_offset.or(expected).unwrap_or(0)
        } else {
            scan.end_offset
        });
        debug_assert!(scan.end_position <= file_size_bytes);
        segments.push(LogSegment {
            file: file.display().to_string(),
            base_offset,
            size_bytes: file_size_bytes,
            last,
            entries: scan.entries,
            index,
        });
    }
    let report = SegmentReport {
        segment_count: segments.len(),
        segments,
        entry_count,
        message_count,
        next_offset,
        size_bytes,
    };
    Ok((report, damage))
}

impl Report for SegmentReport {
    fn write_text(&self, out: &mut String) {
        for segment in &self.segments {
            let index = match &segment.index {
                IndexCheck::Absent => "no index".to_owned(),
                IndexCheck::Matches { row_count } => format!("index matches ({row_count} rows)"),
                IndexCheck::Mismatch {
                    reason,
                    ignored_by_open,
                } => format!(
                    "index does NOT match{}: {reason}",
                    if *ignored_by_open {
                        " (ignored by open)"
                    } else {
                        ""
                    }
                ),
                IndexCheck::Unknown => "index not checked (unnumbered file)".to_owned(),
            };
            let _ = writeln!(
                out,
                "segment {} ({} bytes{}; {index})",
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
                    if entry.checksum_ok { "ok" } else { "BAD" }
                );
            }
        }
        let next_offset = self
            .next_offset
            .map_or_else(|| "-".to_owned(), |offset| offset.to_string());
        let _ = writeln!(
            out,
            "summary: {} segment(s), {} entries, {} messages, next_offset {next_offset}, {} bytes",
            self.segment_count, self.entry_count, self.message_count, self.size_bytes
        );
    }
}
