//! `inspect metadata`: verifies the durable-replace trailer of `metadata.json` (FORMAT.md sections
//! 2 and 5), decodes the payload as `shards::metadata::MetadataState` and checks it with the rules
//! the server applies at boot. Reads only; never rewrites the file.

use std::fmt::Write as _;
use std::path::Path;

use shards::limits::METADATA_FILE_NAME;
use shards::metadata::{METADATA_VERSION, MetadataState};
use storage::durable::TRAILER_SIZE;
use storage::limits::DURABLE_FILE_SIZE_MAX;
use twox_hash::XxHash3_64;

use super::{Damage, Report, file_in, read_bounded};

#[derive(Debug, serde::Serialize)]
pub(crate) struct MetadataReport {
    file: String,
    file_size_bytes: u64,
    trailer_ok: bool,
    version: Option<u32>,
    op: Option<u64>,
    streams: Vec<StreamReport>,
    stream_count: usize,
    topic_count: usize,
    partition_count: u64,
}

#[derive(Debug, serde::Serialize)]
struct StreamReport {
    stream_id: u32,
    name: String,
    topics: Vec<TopicReport>,
}

#[derive(Debug, serde::Serialize)]
struct TopicReport {
    topic_id: u16,
    name: String,
    partition_count: u32,
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(MetadataReport, Vec<Damage>)> {
    let file = file_in(path, METADATA_FILE_NAME);
    let mut report = MetadataReport {
        file: file.display().to_string(),
        file_size_bytes: 0,
        trailer_ok: false,
        version: None,
        op: None,
        streams: Vec::new(),
        stream_count: 0,
        topic_count: 0,
        partition_count: 0,
    };
    let mut damage = Vec::new();
    let bytes = match read_bounded(&file, DURABLE_FILE_SIZE_MAX)? {
        Ok(bytes) => bytes,
        Err(size) => {
            report.file_size_bytes = size;
            damage.push(Damage::new(
                &file,
                None,
                format!("{size} bytes exceeds the {DURABLE_FILE_SIZE_MAX}-byte limit"),
            ));
            return Ok((report, damage));
        }
    };
    report.file_size_bytes = bytes.len() as u64;
    let Some(payload_size) = bytes.len().checked_sub(TRAILER_SIZE) else {
        damage.push(Damage::new(
            &file,
            Some(0),
            format!(
                "{} bytes is shorter than the {TRAILER_SIZE}-byte checksum trailer",
                bytes.len()
            ),
        ));
        return Ok((report, damage));
    };
    let (payload, trailer) = bytes.split_at(payload_size);
    let mut stored = [0u8; TRAILER_SIZE];
    stored.copy_from_slice(trailer);
    let stored = u64::from_le_bytes(stored);
    let computed = XxHash3_64::oneshot(payload);
    if stored != computed {
        damage.push(Damage::new(
            &file,
            Some(payload_size as u64),
            format!(
                "checksum mismatch: the trailer at byte {payload_size} has {stored:#018x}, the \
                 {payload_size} payload bytes hash to {computed:#018x} (the server refuses to boot)"
            ),
        ));
        return Ok((report, damage));
    }
    report.trailer_ok = true;
    let state: MetadataState = match serde_json::from_slice(payload) {
        Ok(state) => state,
        Err(error) => {
            damage.push(Damage::new(
                &file,
                None,
                format!("payload does not decode: {error}"),
            ));
            return Ok((report, damage));
        }
    };
    if state.version != METADATA_VERSION {
        damage.push(Damage::new(
            &file,
            None,
            format!(
                "version {} is not supported (this build reads version {METADATA_VERSION})",
                state.version
            ),
        ));
    }
    if let Err(reason) = state.check() {
        damage.push(Damage::new(
            &file,
            None,
            format!("payload breaks a rule: {reason}"),
        ));
    }
    report.version = Some(state.version);
    report.op = Some(state.op);
    for (&stream_id, stream) in &state.streams {
        let topics: Vec<TopicReport> = stream
            .topics
            .iter()
            .map(|(&topic_id, topic)| TopicReport {
                topic_id,
                name: topic.name.clone(),
                partition_count: topic.partition_count,
            })
            .collect();
        report.topic_count += topics.len();
        report.partition_count += topics
            .iter()
            .map(|topic| u64::from(topic.partition_count))
            .sum::<u64>();
        report.streams.push(StreamReport {
            stream_id,
            name: stream.name.clone(),
            topics,
        });
    }
    report.stream_count = report.streams.len();
    Ok((report, damage))
}

impl Report for MetadataReport {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "file: {} ({} bytes, trailer {})",
            self.file,
            self.file_size_bytes,
            if self.trailer_ok { "ok" } else { "BAD" }
        );
        if let (Some(version), Some(op)) = (self.version, self.op) {
            let _ = writeln!(out, "version {version}, op {op}");
        }
        let _ = writeln!(
            out,
            "  {:>10} {:>8} {:>10}  name",
            "stream_id", "topic_id", "partitions"
        );
        for stream in &self.streams {
            let _ = writeln!(
                out,
                "  {:>10} {:>8} {:>10}  {}",
                stream.stream_id, "-", "-", stream.name
            );
            for topic in &stream.topics {
                let _ = writeln!(
                    out,
                    "  {:>10} {:>8} {:>10}  {}",
                    stream.stream_id, topic.topic_id, topic.partition_count, topic.name
                );
            }
        }
        let _ = writeln!(
            out,
            "summary: {} stream(s), {} topic(s), {} partition(s)",
            self.stream_count, self.topic_count, self.partition_count
        );
    }
}
