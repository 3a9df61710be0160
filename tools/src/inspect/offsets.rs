//! `inspect offsets`: decodes the consumer offsets files (`consumer-offsets`, issue 11 section 1,
//! `storage/FORMAT.md` consumer offsets) of a data directory's partitions, of one partition
//! directory or one file, by the rules `storage::ConsumerOffsets::open` applies: prints each
//! consumer's stored offset, and reports a torn last record (open cuts it) or damage (open refuses
//! the boot) with the file and byte position. Reads only; never cuts a torn tail.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use storage::CONSUMER_OFFSETS_FILE_NAME;
use storage::limits::OFFSETS_FILE_SIZE_MAX;

use super::{Damage, Report, read_bounded};

/// The name of the partitions directory of a data directory.
const PARTITIONS_DIR_NAME: &str = "partitions";

#[derive(Debug, serde::Serialize)]
pub(crate) struct OffsetsReport {
    files: Vec<FileReport>,
    file_count: usize,
    consumer_count: usize,
}

#[derive(Debug, serde::Serialize)]
struct FileReport {
    file: String,
    /// `STREAM/TOPIC/PARTITION` from the directory names, when the file sits in a data directory.
    partition: Option<String>,
    file_size_bytes: u64,
    record_count: usize,
    torn_tail_bytes: u64,
    consumers: Vec<ConsumerReport>,
}

#[derive(Debug, serde::Serialize)]
struct ConsumerReport {
    /// `consumer` or `group` (or `kind N` for a number this version does not know).
    kind: String,
    name: String,
    offset: u64,
}

/// The offsets files under `path`: every partition's of a data directory, one partition
/// directory's, or `path` itself.
fn files_for(path: &Path) -> anyhow::Result<Vec<PathBuf>> {
    if !path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    let partitions = path.join(PARTITIONS_DIR_NAME);
    if !partitions.is_dir() {
        let file = path.join(CONSUMER_OFFSETS_FILE_NAME);
        return Ok(if file.exists() {
            vec![file]
        } else {
            Vec::new()
        });
    }
    let mut files = Vec::new();
    // partitions/STREAM/TOPIC/PARTITION/consumer-offsets: three directory levels.
    let mut dirs = vec![partitions];
    for _level in 0..3 {
        let mut next = Vec::new();
        for dir in dirs {
            let entries = std::fs::read_dir(&dir)
                .map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
            for entry in entries {
                let entry = entry
                    .map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
                let is_number = entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| name.parse::<u64>().is_ok());
                if is_number && entry.path().is_dir() {
                    next.push(entry.path());
                }
            }
        }
        dirs = next;
    }
    for dir in dirs {
        let file = dir.join(CONSUMER_OFFSETS_FILE_NAME);
        if file.exists() {
            files.push(file);
        }
    }
    files.sort();
    Ok(files)
}

/// `STREAM/TOPIC/PARTITION` from the three directories above `file` when they are numbers.
fn partition_of(file: &Path) -> Option<String> {
    let mut names = file
        .ancestors()
        .skip(1)
        .take(3)
        .map(|dir| dir.file_name()?.to_str()?.parse::<u64>().ok());
    let partition = names.next()??;
    let topic = names.next()??;
    let stream = names.next()??;
    Some(format!("{stream}/{topic}/{partition}"))
}

fn kind_name(kind: u8) -> String {
    match kind {
        0 => "consumer".to_owned(),
        1 => "group".to_owned(),
        other => format!("kind {other}"),
    }
}

/// Decodes one offsets file into its report and findings.
fn inspect_file(file: &Path, damage: &mut Vec<Damage>) -> anyhow::Result<FileReport> {
    let mut report = FileReport {
        file: file.display().to_string(),
        partition: partition_of(file),
        file_size_bytes: 0,
        record_count: 0,
        torn_tail_bytes: 0,
        consumers: Vec::new(),
    };
    let bytes = match read_bounded(file, OFFSETS_FILE_SIZE_MAX)? {
        Ok(bytes) => bytes,
        Err(size) => {
            report.file_size_bytes = size;
            damage.push(Damage::new(
                file,
                Some(OFFSETS_FILE_SIZE_MAX),
                format!(
                    "{size} bytes exceeds the {OFFSETS_FILE_SIZE_MAX}-byte limit (open refuses \
                     to boot)"
                ),
            ));
            return Ok(report);
        }
    };
    report.file_size_bytes = bytes.len() as u64;
    match storage::decode_offsets(&bytes) {
        Ok(decoded) => {
            report.record_count = decoded.records.len();
            report.torn_tail_bytes = decoded.torn_tail_bytes;
            report.consumers = decoded
                .latest()
                .into_iter()
                .map(|(key, offset)| ConsumerReport {
                    kind: kind_name(key.kind),
                    name: key.name,
                    offset,
                })
                .collect();
            if decoded.torn_tail_bytes > 0 {
                let mut finding = Damage::new(
                    file,
                    Some(decoded.valid_size_bytes),
                    format!(
                        "{} bytes of a torn last record (a store interrupted by a crash); open \
                         cuts them",
                        decoded.torn_tail_bytes
                    ),
                );
                finding.torn_tail = true;
                damage.push(finding);
            }
        }
        Err(defect) => damage.push(Damage::new(
            file,
            Some(defect.position),
            format!(
                "corrupt consumer offsets: {} (open refuses to boot)",
                defect.reason
            ),
        )),
    }
    Ok(report)
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(OffsetsReport, Vec<Damage>)> {
    let mut damage = Vec::new();
    let mut files = Vec::new();
    for file in files_for(path)? {
        files.push(inspect_file(&file, &mut damage)?);
    }
    let consumer_count = files.iter().map(|file| file.consumers.len()).sum();
    Ok((
        OffsetsReport {
            file_count: files.len(),
            consumer_count,
            files,
        },
        damage,
    ))
}

impl Report for OffsetsReport {
    fn write_text(&self, out: &mut String) {
        for file in &self.files {
            let _ = writeln!(
                out,
                "file {} partition {} size {} records {} consumers {}",
                file.file,
                file.partition.as_deref().unwrap_or("?"),
                file.file_size_bytes,
                file.record_count,
                file.consumers.len()
            );
            for consumer in &file.consumers {
                let _ = writeln!(
                    out,
                    "  {:<8} {:<32} offset {}",
                    consumer.kind, consumer.name, consumer.offset
                );
            }
        }
        let _ = writeln!(
            out,
            "summary: {} offsets file(s), {} consumer offset(s)",
            self.file_count, self.consumer_count
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_1_partition_of_reads_the_three_directory_numbers() {
        assert_eq!(
            partition_of(Path::new("/d/partitions/1/2/3/consumer-offsets")).as_deref(),
            Some("1/2/3")
        );
        assert_eq!(partition_of(Path::new("consumer-offsets")), None);
    }
}
