//! Streams and topics by name or id (issue 11 section 5): every CLI argument that names a stream
//! or topic takes either; a value that parses as a number is an id, anything else a name.

use std::time::{Duration, Instant};

use bus::{Client, Metadata, StreamInfo, TopicInfo};

/// How long a lookup keeps re-reading metadata that a backup answered without the stream or
/// topic: a backup applies a committed change after the primary's next `Commit` reaches it, so
/// a topic created a moment ago through the primary may not be there yet (read-your-writes
/// across replicas). A single server, or a primary, is answered at once.
pub const BACKUP_LAG_WAIT: Duration = Duration::from_secs(3);

/// Pause between two metadata reads while waiting for a backup to catch up.
const BACKUP_LAG_POLL: Duration = Duration::from_millis(50);

/// Reads the server's metadata and applies `find` to it. When `find` fails on a backup's answer
/// (`replica != primary`), re-reads for up to `BACKUP_LAG_WAIT` before returning the error.
///
/// # Errors
/// The metadata request failed, or `find`'s error once the wait is over (or at once from a
/// primary).
async fn lookup<T>(
    client: &mut Client,
    find: impl Fn(&Metadata) -> anyhow::Result<T>,
) -> anyhow::Result<T> {
    let deadline = Instant::now() + BACKUP_LAG_WAIT;
    loop {
        let metadata = client.get_metadata().await?;
        match find(&metadata) {
            Ok(found) => return Ok(found),
            Err(_) if metadata.replica != metadata.primary && Instant::now() < deadline => {
                compio::time::sleep(BACKUP_LAG_POLL).await;
            }
            Err(error) => return Err(error),
        }
    }
}

/// A stream or topic as the user wrote it: an id (digits) or a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NameOrId {
    Id(u32),
    Name(String),
}

impl NameOrId {
    /// Parses a CLI value: digits are an id, anything else a name (never empty).
    ///
    /// # Errors
    /// The value is empty.
    pub fn parse(text: &str) -> Result<NameOrId, String> {
        if text.is_empty() {
            return Err("an empty value names no stream or topic: give an id or a name".into());
        }
        Ok(match text.parse::<u32>() {
            Ok(id) => NameOrId::Id(id),
            Err(_) => NameOrId::Name(text.to_owned()),
        })
    }
}

impl std::fmt::Display for NameOrId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            NameOrId::Id(id) => write!(f, "{id}"),
            NameOrId::Name(name) => write!(f, "{name:?}"),
        }
    }
}

/// A topic found in the server's metadata.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedTopic {
    pub stream_id: u32,
    pub topic_id: u16,
    pub partition_count: u32,
}

/// The stream `stream` names in `metadata`.
///
/// # Errors
/// No stream has that id or name; the message names what was looked for.
pub fn find_stream<'m>(
    metadata: &'m Metadata,
    stream: &NameOrId,
) -> anyhow::Result<&'m StreamInfo> {
    metadata
        .streams
        .iter()
        .find(|s| match stream {
            NameOrId::Id(id) => s.stream_id == *id,
            NameOrId::Name(name) => s.name == *name,
        })
        .ok_or_else(|| {
            anyhow::anyhow!("no stream {stream} on the server (see `shardline stream list`)")
        })
}

/// The topic `topic` names in stream `stream` of `metadata`.
///
/// # Errors
/// No such stream, or no topic with that id or name in it.
pub fn find_topic<'m>(
    metadata: &'m Metadata,
    stream: &NameOrId,
    topic: &NameOrId,
) -> anyhow::Result<(&'m StreamInfo, &'m TopicInfo)> {
    let stream_info = find_stream(metadata, stream)?;
    let topic_info = stream_info
        .topics
        .iter()
        .find(|t| match topic {
            NameOrId::Id(id) => u32::from(t.topic_id) == *id,
            NameOrId::Name(name) => t.name == *name,
        })
        .ok_or_else(|| {
            anyhow::anyhow!(
                "no topic {topic} in stream {} {:?} (see `shardline topic list {}`)",
                stream_info.stream_id,
                stream_info.name,
                stream_info.stream_id
            )
        })?;
    Ok((stream_info, topic_info))
}

/// Resolves `stream` and `topic` against the server's metadata (one `GetMetadata`; more, for up
/// to `BACKUP_LAG_WAIT`, while a backup answers without them).
///
/// # Errors
/// The metadata request failed, or no such stream or topic exists.
pub async fn resolve_topic(
    client: &mut Client,
    stream: &NameOrId,
    topic: &NameOrId,
) -> anyhow::Result<ResolvedTopic> {
    lookup(client, |metadata| {
        let (stream_info, topic_info) = find_topic(metadata, stream, topic)?;
        Ok(ResolvedTopic {
            stream_id: stream_info.stream_id,
            topic_id: topic_info.topic_id,
            partition_count: topic_info.partitions.len() as u32,
        })
    })
    .await
}

/// The id of the stream `stream` names: an id as given (no round trip: the server answers
/// `StreamNotFound` for an unknown one), a name looked up in the server's metadata.
///
/// # Errors
/// The metadata request failed, or no stream has that name.
pub async fn resolve_stream_id(client: &mut Client, stream: &NameOrId) -> anyhow::Result<u32> {
    match stream {
        NameOrId::Id(id) => Ok(*id),
        NameOrId::Name(_) => {
            lookup(client, |metadata| {
                Ok(find_stream(metadata, stream)?.stream_id)
            })
            .await
        }
    }
}

/// The (stream id, topic id) that `stream` and `topic` name: ids as given, without a round trip,
/// when both are ids; otherwise looked up in the server's metadata.
///
/// # Errors
/// The metadata request failed; no such stream or topic; a topic id beyond `u16` (ids are
/// 1..=65535).
pub async fn resolve_topic_ids(
    client: &mut Client,
    stream: &NameOrId,
    topic: &NameOrId,
) -> anyhow::Result<(u32, u16)> {
    if let (NameOrId::Id(stream_id), NameOrId::Id(topic_id)) = (stream, topic) {
        let topic_id = u16::try_from(*topic_id)
            .map_err(|_| anyhow::anyhow!("topic id {topic_id} is beyond the largest, 65535"))?;
        return Ok((*stream_id, topic_id));
    }
    lookup(client, |metadata| {
        let (stream_info, topic_info) = find_topic(metadata, stream, topic)?;
        Ok((stream_info.stream_id, topic_info.topic_id))
    })
    .await
}

/// Refuses a stream or topic name made of digits only: every CLI argument reads digits as an
/// id, so such a name could never be given back (`what` is `stream` or `topic`).
///
/// # Errors
/// `name` is all ASCII digits (and not empty).
pub fn check_name_not_numeric(name: &str, what: &str) -> anyhow::Result<()> {
    if !name.is_empty() && name.bytes().all(|byte| byte.is_ascii_digit()) {
        anyhow::bail!(
            "{what} name {name:?} is all digits, which every command reads as an id: give a name \
             with a letter or a sign in it"
        );
    }
    Ok(())
}
