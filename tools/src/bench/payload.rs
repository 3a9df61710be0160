//! Message payloads and ids: what each producer sends as message number `sequence`, so that a
//! consumer can tell whether a payload read back is exactly the one sent.
//!
//! Must never depend on time or randomness: the payload of a message follows from its id alone.

use std::path::{Path, PathBuf};

use super::limits::MESSAGE_SEQUENCE_BITS;

/// Id of message `sequence` of producer `producer_index`: `producer_index << 40 | sequence`.
pub fn message_id(producer_index: u32, sequence: u64) -> u64 {
    assert!(
        sequence < 1 << MESSAGE_SEQUENCE_BITS,
        "sequence {sequence} overflows 40 bits"
    );
    (u64::from(producer_index) << MESSAGE_SEQUENCE_BITS) | sequence
}

/// The per-producer sequence inside a message id.
pub fn sequence_of(id: u64) -> u64 {
    id & ((1 << MESSAGE_SEQUENCE_BITS) - 1)
}

#[derive(Debug, thiserror::Error)]
pub enum PayloadError {
    #[error("--payload-file {path}: cannot read: {source}")]
    Unreadable {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("--payload-file {path}: holds no non-empty line (one message per line)")]
    Empty { path: PathBuf },
}

/// What every message carries: a fixed-size pattern, or the lines of a file, cycled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayloadSource {
    Fixed(Vec<u8>),
    /// Lines without their `\n` (or `\r\n`); empty lines are skipped.
    Lines {
        path: PathBuf,
        lines: Vec<Vec<u8>>,
    },
}

impl PayloadSource {
    /// `size_bytes` bytes of a repeating `a..z` pattern.
    pub fn fixed(size_bytes: usize) -> PayloadSource {
        PayloadSource::Fixed(
            (0..size_bytes)
                .map(|index| b'a' + (index % 26) as u8)
                .collect(),
        )
    }

    /// One message per line of `path` (bytes, not necessarily UTF-8).
    pub fn from_file(path: &Path) -> Result<PayloadSource, PayloadError> {
        let bytes = std::fs::read(path).map_err(|source| PayloadError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        let lines: Vec<Vec<u8>> = bytes
            .split(|byte| *byte == b'\n')
            .map(|line| line.strip_suffix(b"\r").unwrap_or(line))
            .filter(|line| !line.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        if lines.is_empty() {
            return Err(PayloadError::Empty {
                path: path.to_path_buf(),
            });
        }
        Ok(PayloadSource::Lines {
            path: path.to_path_buf(),
            lines,
        })
    }

    /// Payload of a producer's message number `sequence` (the same for every producer).
    pub fn payload_for(&self, sequence: u64) -> &[u8] {
        match self {
            PayloadSource::Fixed(payload) => payload,
            PayloadSource::Lines { lines, .. } => &lines[(sequence % lines.len() as u64) as usize],
        }
    }

    /// Whether `payload` is what the producer sent with message `id`.
    pub fn matches(&self, id: u64, payload: &[u8]) -> bool {
        self.payload_for(sequence_of(id)) == payload
    }

    /// Payload bytes of messages `0..message_count` of one producer (what [`Self::payload_for`]
    /// hands out over them: a file's lines as they cycle), saturating at `u64::MAX`.
    pub fn payload_bytes(&self, message_count: u64) -> u64 {
        match self {
            PayloadSource::Fixed(payload) => message_count.saturating_mul(payload.len() as u64),
            PayloadSource::Lines { lines, .. } => {
                let line_count = lines.len() as u64;
                let cycle_bytes: u64 = lines.iter().map(|line| line.len() as u64).sum();
                let rest_bytes: u64 = lines[..(message_count % line_count) as usize]
                    .iter()
                    .map(|line| line.len() as u64)
                    .sum();
                (message_count / line_count)
                    .saturating_mul(cycle_bytes)
                    .saturating_add(rest_bytes)
            }
        }
    }

    pub fn payload_len_max(&self) -> usize {
        match self {
            PayloadSource::Fixed(payload) => payload.len(),
            PayloadSource::Lines { lines, .. } => lines.iter().map(Vec::len).max().unwrap_or(0),
        }
    }

    /// For the report: `1000 B` or `file.log (5235 lines)`.
    pub fn describe(&self) -> String {
        match self {
            PayloadSource::Fixed(payload) => format!("{} B", payload.len()),
            PayloadSource::Lines { path, lines } => {
                format!("{} ({} lines)", path.display(), lines.len())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_ids_pack_producer_and_sequence() {
        assert_eq!(message_id(0, 0), 0);
        assert_eq!(message_id(3, 7), (3 << 40) | 7);
        assert_eq!(sequence_of(message_id(1023, 123_456)), 123_456);
    }

    #[test]
    fn fixed_payload_has_the_requested_size() {
        let payload = PayloadSource::fixed(30);
        assert_eq!(payload.payload_for(0), b"abcdefghijklmnopqrstuvwxyzabcd");
        assert_eq!(payload.payload_for(99), payload.payload_for(0));
        assert_eq!(payload.payload_len_max(), 30);
        assert_eq!(payload.describe(), "30 B");
    }

    #[test]
    fn payload_file_lines_are_cycled() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("events.log");
        std::fs::write(&path, b"first\r\nsecond line\n\nthird\n").unwrap();
        let payload = PayloadSource::from_file(&path).unwrap();
        let sent: Vec<&[u8]> = (0..5)
            .map(|sequence| payload.payload_for(sequence))
            .collect();
        assert_eq!(
            sent,
            vec![
                &b"first"[..],
                b"second line",
                b"third",
                b"first",
                b"second line"
            ]
        );
        assert_eq!(payload.payload_len_max(), 11);
        assert!(payload.matches(message_id(2, 4), b"second line"));
        assert!(!payload.matches(message_id(2, 4), b"first"));
        assert_eq!(payload.describe(), format!("{} (3 lines)", path.display()));
    }

    /// What `payload_bytes` counts is what `payload_for` hands out, message after message.
    #[test]
    fn payload_bytes_sum_the_lines_as_they_cycle() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("corpus.log");
        std::fs::write(&path, format!("{}\nab\ncd\n", "x".repeat(1000))).unwrap();
        let payload = PayloadSource::from_file(&path).unwrap();
        for message_count in [0, 1, 2, 3, 4, 5, 7, 300] {
            let sent: u64 = (0..message_count)
                .map(|sequence| payload.payload_for(sequence).len() as u64)
                .sum();
            assert_eq!(
                payload.payload_bytes(message_count),
                sent,
                "{message_count}"
            );
        }
        // 3 cycles and one more line: not 10 x the longest line.
        assert_eq!(payload.payload_bytes(10), 3 * 1004 + 1000);
        assert_eq!(PayloadSource::fixed(30).payload_bytes(7), 210);
        assert_eq!(PayloadSource::fixed(30).payload_bytes(u64::MAX), u64::MAX);
    }

    #[test]
    fn empty_or_missing_payload_file_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.log");
        std::fs::write(&empty, b"\n\r\n\n").unwrap();
        let error = PayloadSource::from_file(&empty).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "--payload-file {}: holds no non-empty line (one message per line)",
                empty.display()
            )
        );
        let missing = dir.path().join("missing.log");
        let error = PayloadSource::from_file(&missing).unwrap_err();
        assert!(matches!(error, PayloadError::Unreadable { .. }));
        assert!(error.to_string().starts_with(&format!(
            "--payload-file {}: cannot read",
            missing.display()
        )));
    }
}
