//! `stream list` and `topic list` (issue 11 section 5): rows built from the server's `Metadata`,
//! printed as an aligned text table for people or as a JSON array for scripts. Pure functions:
//! the commands fetch the metadata, this module only shapes it.
//!
//! The JSON arrays are a stable interface: fields are only ever added, never renamed or removed.

use bus::{Metadata, StreamInfo, TopicInfo};

/// One row of `stream list`; also the objects of `stream list --json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StreamRow {
    pub id: u32,
    pub name: String,
    pub topics: u64,
    /// Partitions over all of the stream's topics.
    pub partitions: u64,
    /// Messages retained over all partitions: the sum of `next_offset - first_offset`.
    pub messages: u64,
}

/// One row of `topic list`; also the objects of `topic list --json`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct TopicRow {
    pub id: u16,
    pub name: String,
    pub partitions: u64,
    /// Messages retained over the topic's partitions: the sum of `next_offset - first_offset`.
    pub messages: u64,
    /// Retention by size, bytes per partition; 0 = unlimited.
    pub retention_bytes: u64,
    /// Retention by age, milliseconds; 0 = unlimited.
    pub retention_ms: u64,
    /// The topic's consumer groups, by name.
    pub groups: Vec<String>,
}

/// Messages a topic retains: over its partitions, `next_offset - first_offset`.
fn topic_message_count(topic: &TopicInfo) -> u64 {
    topic
        .partitions
        .iter()
        .map(|partition| partition.next_offset.saturating_sub(partition.first_offset))
        .sum()
}

/// The rows of `stream list`, in the metadata's order (by stream id).
pub fn stream_rows(metadata: &Metadata) -> Vec<StreamRow> {
    metadata
        .streams
        .iter()
        .map(|stream| StreamRow {
            id: stream.stream_id,
            name: stream.name.clone(),
            topics: stream.topics.len() as u64,
            partitions: stream
                .topics
                .iter()
                .map(|topic| topic.partitions.len() as u64)
                .sum(),
            messages: stream.topics.iter().map(topic_message_count).sum(),
        })
        .collect()
}

/// The rows of `topic list` for `stream`, in the metadata's order (by topic id).
pub fn topic_rows(stream: &StreamInfo) -> Vec<TopicRow> {
    stream
        .topics
        .iter()
        .map(|topic| TopicRow {
            id: topic.topic_id,
            name: topic.name.clone(),
            partitions: topic.partitions.len() as u64,
            messages: topic_message_count(topic),
            retention_bytes: topic.retention_bytes,
            retention_ms: topic.retention_ms,
            groups: topic
                .groups
                .iter()
                .map(|group| group.name.clone())
                .collect(),
        })
        .collect()
}

/// How a column's cells line up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Align {
    Left,
    Right,
}

/// `rows` under `headers` as a text table: columns two spaces apart, each as wide as its widest
/// cell (in characters), no trailing spaces, every line ending in `\n`.
///
/// # Panics
/// If a row or `aligns` has not one cell per header (a caller bug).
pub fn render_table(headers: &[&str], aligns: &[Align], rows: &[Vec<String>]) -> String {
    assert_eq!(aligns.len(), headers.len(), "one alignment per column");
    let mut widths: Vec<usize> = headers.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        assert_eq!(row.len(), headers.len(), "one cell per column");
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let header_row: Vec<String> = headers.iter().map(|h| (*h).to_owned()).collect();
    let mut text = String::new();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (index, cell) in row.iter().enumerate() {
            if index > 0 {
                line.push_str("  ");
            }
            let pad = widths[index] - cell.chars().count();
            match aligns[index] {
                Align::Left => {
                    line.push_str(cell);
                    line.extend(std::iter::repeat_n(' ', pad));
                }
                Align::Right => {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line.push_str(cell);
                }
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// `stream list`'s table: `ID NAME TOPICS PARTITIONS MESSAGES`.
pub fn render_streams(rows: &[StreamRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.id.to_string(),
                row.name.clone(),
                row.topics.to_string(),
                row.partitions.to_string(),
                row.messages.to_string(),
            ]
        })
        .collect();
    render_table(
        &["ID", "NAME", "TOPICS", "PARTITIONS", "MESSAGES"],
        &[
            Align::Right,
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
        ],
        &cells,
    )
}

/// `topic list`'s table: `ID NAME PARTITIONS MESSAGES RETENTION_BYTES RETENTION_AGE GROUPS`,
/// retention in binary units and days/hours/... (`unlimited` for 0), groups comma-separated
/// (`-` for none).
pub fn render_topics(rows: &[TopicRow]) -> String {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            vec![
                row.id.to_string(),
                row.name.clone(),
                row.partitions.to_string(),
                row.messages.to_string(),
                byte_size_text(row.retention_bytes),
                age_text(row.retention_ms),
                if row.groups.is_empty() {
                    "-".to_owned()
                } else {
                    row.groups.join(",")
                },
            ]
        })
        .collect();
    render_table(
        &[
            "ID",
            "NAME",
            "PARTITIONS",
            "MESSAGES",
            "RETENTION_BYTES",
            "RETENTION_AGE",
            "GROUPS",
        ],
        &[
            Align::Right,
            Align::Left,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Right,
            Align::Left,
        ],
        &cells,
    )
}

/// A retention size for people: `unlimited` for 0, else the largest binary unit that divides it
/// exactly (`1GiB`, `1536KiB`, `1000B`), in the form `--retention-bytes` accepts.
pub fn byte_size_text(bytes: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("TiB", 1 << 40),
        ("GiB", 1 << 30),
        ("MiB", 1 << 20),
        ("KiB", 1 << 10),
    ];
    if bytes == 0 {
        return "unlimited".to_owned();
    }
    UNITS
        .iter()
        .find(|(_, size)| bytes.is_multiple_of(*size))
        .map_or_else(
            || format!("{bytes}B"),
            |(unit, size)| format!("{}{unit}", bytes / size),
        )
}

/// A retention age for people: `unlimited` for 0, else the largest unit that divides it exactly
/// (`7d`, `36h`, `90s`, `1500ms`), in the form `--retention-ms` accepts.
pub fn age_text(ms: u64) -> String {
    const UNITS: [(&str, u64); 4] = [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ];
    if ms == 0 {
        return "unlimited".to_owned();
    }
    UNITS
        .iter()
        .find(|(_, unit_ms)| ms.is_multiple_of(*unit_ms))
        .map_or_else(
            || format!("{ms}ms"),
            |(unit, unit_ms)| format!("{}{unit}", ms / unit_ms),
        )
}

#[cfg(test)]
mod tests {
    use bus::{GroupInfo, PartitionInfo};

    use super::*;

    fn topic(id: u16, name: &str, offsets: &[(u64, u64)]) -> TopicInfo {
        TopicInfo {
            topic_id: id,
            name: name.to_owned(),
            partitions: offsets
                .iter()
                .enumerate()
                .map(|(index, &(first_offset, next_offset))| PartitionInfo {
                    partition_id: index as u16,
                    owner_shard: 0,
                    next_offset,
                    first_offset,
                })
                .collect(),
            retention_bytes: 0,
            retention_ms: 0,
            groups: Vec::new(),
        }
    }

    fn metadata() -> Metadata {
        let mut events = topic(1, "events", &[(0, 10), (4, 6)]);
        events.retention_bytes = 1 << 30;
        events.retention_ms = 7 * 86_400_000;
        events.groups = vec![
            GroupInfo {
                name: "billing".to_owned(),
                generation: 0,
                members: Vec::new(),
            },
            GroupInfo {
                name: "audit".to_owned(),
                generation: 3,
                members: Vec::new(),
            },
        ];
        Metadata {
            shard_count: 1,
            streams: vec![
                StreamInfo {
                    stream_id: 1,
                    name: "orders".to_owned(),
                    topics: vec![events, topic(12, "refunds-eu-west", &[(0, 1234)])],
                },
                StreamInfo {
                    stream_id: 700,
                    name: "x".to_owned(),
                    topics: Vec::new(),
                },
            ],
            ..Metadata::default()
        }
    }

    #[test]
    fn issue11_5_stream_rows_sum_topics_partitions_and_retained_messages() {
        assert_eq!(
            stream_rows(&metadata()),
            vec![
                StreamRow {
                    id: 1,
                    name: "orders".to_owned(),
                    topics: 2,
                    partitions: 3,
                    messages: 10 + 2 + 1234,
                },
                StreamRow {
                    id: 700,
                    name: "x".to_owned(),
                    topics: 0,
                    partitions: 0,
                    messages: 0,
                },
            ]
        );
    }

    #[test]
    fn issue11_5_stream_table_is_aligned() {
        assert_eq!(
            render_streams(&stream_rows(&metadata())),
            " ID  NAME    TOPICS  PARTITIONS  MESSAGES\n  \
             1  orders       2           3      1246\n\
             700  x            0           0         0\n"
        );
        assert_eq!(
            render_streams(&[]),
            "ID  NAME  TOPICS  PARTITIONS  MESSAGES\n",
            "no streams: the header alone"
        );
    }

    #[test]
    fn issue11_5_topic_table_shows_retention_and_groups() {
        let metadata = metadata();
        assert_eq!(
            render_topics(&topic_rows(&metadata.streams[0])),
            "ID  NAME             PARTITIONS  MESSAGES  RETENTION_BYTES  RETENTION_AGE  GROUPS\n \
             1  events                    2        12             1GiB             7d  \
             billing,audit\n\
             12  refunds-eu-west           1      1234        unlimited      unlimited  -\n"
        );
    }

    #[test]
    fn issue11_5_list_json_is_a_stable_array() {
        let metadata = metadata();
        assert_eq!(
            serde_json::to_string(&stream_rows(&metadata)).unwrap(),
            r#"[{"id":1,"name":"orders","topics":2,"partitions":3,"messages":1246},{"id":700,"name":"x","topics":0,"partitions":0,"messages":0}]"#
        );
        assert_eq!(
            serde_json::to_string(&topic_rows(&metadata.streams[0])[..1]).unwrap(),
            r#"[{"id":1,"name":"events","partitions":2,"messages":12,"retention_bytes":1073741824,"retention_ms":604800000,"groups":["billing","audit"]}]"#
        );
    }

    #[test]
    fn issue11_5_retention_reads_back_in_the_units_the_flags_take() {
        assert_eq!(byte_size_text(0), "unlimited");
        assert_eq!(byte_size_text(1000), "1000B");
        assert_eq!(byte_size_text(1536 << 10), "1536KiB");
        assert_eq!(byte_size_text(512 << 20), "512MiB");
        assert_eq!(byte_size_text(3 << 40), "3TiB");
        assert_eq!(age_text(0), "unlimited");
        assert_eq!(age_text(1500), "1500ms");
        assert_eq!(age_text(90_000), "90s");
        assert_eq!(age_text(36 * 3_600_000), "36h");
        assert_eq!(age_text(2 * 86_400_000), "2d");
        for (text, bytes) in [("1536KiB", 1536 << 10), ("3TiB", 3 << 40), ("1000B", 1000)] {
            assert_eq!(
                crate::arg_values::parse_retention_bytes(text),
                Ok(bytes),
                "{text} parses back"
            );
        }
        for (text, ms) in [
            ("1500ms", 1500),
            ("36h", 36 * 3_600_000),
            ("2d", 172_800_000),
        ] {
            assert_eq!(crate::arg_values::parse_retention_ms(text), Ok(ms));
        }
    }

    #[test]
    #[should_panic(expected = "one cell per column")]
    fn a_short_row_is_a_caller_bug() {
        render_table(
            &["A", "B"],
            &[Align::Left, Align::Left],
            &[vec!["x".into()]],
        );
    }
}
