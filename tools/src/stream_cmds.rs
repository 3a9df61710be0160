//! `shardline stream create|delete|list` and `shardline topic create|delete|alter|list`: the
//! metadata commands (issue 11 sections 4 and 5). Every stream or topic argument takes an id or
//! a name (`shardline::names`); `create` without an id takes the next free one. Lists are
//! shaped by `shardline::listing`. Never touches partition data: the server does.

use std::fmt::Write as _;

use anyhow::Context as _;
use bus::Client;
use shardline::arg_values::{parse_retention_bytes, parse_retention_ms, whole_number};
use shardline::listing;
use shardline::names::{
    NameOrId, check_name_not_numeric, find_stream, resolve_stream_id, resolve_topic_ids,
};
use shardline::output::{print_line, print_text};

use crate::client_cmds::{AddrArgs, block_on, connect, counted};

#[derive(Debug, clap::Subcommand)]
pub enum StreamCommand {
    /// Create a stream: `shardline stream create orders` takes the next free id and prints it;
    /// `shardline stream create 1 orders` gives the id.
    #[command(allow_missing_positional = true)]
    Create {
        /// Stream id (>= 1); when absent, one more than the largest on the server.
        #[arg(value_name = "ID", value_parser = whole_number("a stream id", 1, u32::MAX), allow_negative_numbers = true)]
        stream_id: Option<u32>,
        /// Stream name (1-255 bytes of UTF-8, unique, not all digits).
        name: String,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Delete a stream with its topics and their data: `shardline stream delete orders`.
    Delete {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// List streams: id, name, topics, partitions and retained messages.
    List {
        /// Print a JSON array (one object per stream: id, name, topics, partitions, messages).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        addr: AddrArgs,
    },
}

/// `topic create` and `topic alter`'s retention flags (issue 11 section 4).
#[derive(Debug, Clone, clap::Args)]
pub struct RetentionArgs {
    /// Retention by size, per partition: once a partition holds more, its oldest sealed segments
    /// are deleted. Bytes or a binary suffix: `1073741824`, `512MiB`, `1GiB`, `2TiB`; `0` keeps
    /// every byte.
    #[arg(long, value_parser = parse_retention_bytes, value_name = "SIZE", allow_hyphen_values = true)]
    pub retention_bytes: Option<u64>,
    /// Retention by age: sealed segments older than this are deleted. Milliseconds, or a whole
    /// number with a unit `ms`, `s`, `m`, `h` or `d`: `3600000`, `90s`, `12h`, `7d`; `0` keeps
    /// messages of any age.
    #[arg(long, value_parser = parse_retention_ms, value_name = "DURATION", allow_hyphen_values = true)]
    pub retention_ms: Option<u64>,
}

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Create a topic: `shardline topic create orders events --partitions 8` takes the next free
    /// topic id of stream `orders` and prints it; `shardline topic create 1 1 events` gives it.
    #[command(allow_missing_positional = true)]
    Create {
        /// The stream the topic belongs to: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// Topic id (>= 1); when absent, one more than the largest in the stream.
        #[arg(value_name = "ID", value_parser = whole_number("a topic id", 1, u16::MAX), allow_negative_numbers = true)]
        topic_id: Option<u16>,
        /// Topic name (unique in the stream, not all digits).
        name: String,
        /// Number of partitions (1..=4096, `bus::limits::PARTITION_COUNT_MAX`); each is owned by
        /// one shard. Checked here, before any request, so the range is the first rule a bad
        /// count meets.
        #[arg(
            long,
            default_value_t = 1,
            value_parser = whole_number("a partition count", 1, bus::limits::PARTITION_COUNT_MAX),
            allow_negative_numbers = true
        )]
        partitions: u32,
        #[command(flatten)]
        retention: RetentionArgs,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Delete a topic and its data: `shardline topic delete orders events`.
    Delete {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// The topic: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "TOPIC")]
        topic: NameOrId,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Change a topic's retention: `shardline topic alter orders events --retention-bytes 1GiB`.
    /// A limit not given is kept; `0` removes one.
    #[command(group(
        clap::ArgGroup::new("change")
            .args(["retention_bytes", "retention_ms"])
            .required(true)
            .multiple(true)
    ))]
    Alter {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// The topic: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "TOPIC")]
        topic: NameOrId,
        #[command(flatten)]
        retention: RetentionArgs,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// List a stream's topics: id, name, partitions, retained messages, retention, groups.
    List {
        /// The stream: its id or its name.
        #[arg(value_parser = NameOrId::parse, value_name = "STREAM")]
        stream: NameOrId,
        /// Print a JSON array (one object per topic: id, name, partitions, messages,
        /// retention_bytes, retention_ms, groups).
        #[arg(long)]
        json: bool,
        #[command(flatten)]
        addr: AddrArgs,
    },
}

/// One more than the largest of `ids` (1 when there are none), for `create` without an id.
///
/// # Errors
/// The largest id is already `max` (`what` names the kind of id).
fn next_free_id<T>(ids: impl Iterator<Item = T>, max: T, what: &str) -> anyhow::Result<T>
where
    T: Ord + Copy + std::fmt::Display + From<u8> + std::ops::Add<Output = T>,
{
    match ids.max() {
        None => Ok(T::from(1)),
        Some(largest) if largest < max => Ok(largest + T::from(1)),
        Some(largest) => anyhow::bail!(
            "the largest {what} id is already {largest}: give a free id before the name"
        ),
    }
}

/// The id of a new stream: `stream_id` when given, else the next free one on the server.
///
/// # Errors
/// The metadata request failed; every id is taken.
async fn new_stream_id(client: &mut Client, stream_id: Option<u32>) -> anyhow::Result<u32> {
    if let Some(id) = stream_id {
        return Ok(id);
    }
    let metadata = client.get_metadata().await?;
    next_free_id(
        metadata.streams.iter().map(|s| s.stream_id),
        u32::MAX,
        "stream",
    )
}

/// The (stream id, topic id) of a new topic: the stream by id or name, the topic id when given,
/// else the next free one in that stream. No round trip when both are ids.
///
/// # Errors
/// The metadata request failed; no such stream; every topic id is taken.
async fn new_topic_ids(
    client: &mut Client,
    stream: &NameOrId,
    topic_id: Option<u16>,
) -> anyhow::Result<(u32, u16)> {
    if let (NameOrId::Id(stream_id), Some(topic_id)) = (stream, topic_id) {
        return Ok((*stream_id, topic_id));
    }
    let metadata = client.get_metadata().await?;
    let stream_info = find_stream(&metadata, stream)?;
    let topic_id = if let Some(id) = topic_id {
        id
    } else {
        let ids = stream_info.topics.iter().map(|t| t.topic_id);
        next_free_id(ids, u16::MAX, "topic")?
    };
    Ok((stream_info.stream_id, topic_id))
}

pub fn stream(command: StreamCommand) -> anyhow::Result<()> {
    block_on(async move {
        match command {
            StreamCommand::Create {
                stream_id,
                name,
                addr,
            } => {
                check_name_not_numeric(&name, "stream")?;
                let mut client = connect(&addr).await?;
                let stream_id = new_stream_id(&mut client, stream_id).await?;
                client.create_stream(stream_id, &name).await?;
                print_line(&format!("created stream {stream_id} {name:?}"))
            }
            StreamCommand::Delete { stream, addr } => {
                let mut client = connect(&addr).await?;
                let stream_id = resolve_stream_id(&mut client, &stream).await?;
                client.delete_stream(stream_id).await?;
                print_line(&format!("deleted stream {stream_id}"))
            }
            StreamCommand::List { json, addr } => {
                let metadata = connect(&addr).await?.get_metadata().await?;
                let rows = listing::stream_rows(&metadata);
                if json {
                    print_line(&serde_json::to_string(&rows)?)
                } else {
                    print_text(&listing::render_streams(&rows))
                }
            }
        }
    })
}

/// `created topic 1/2 "events" with 8 partitions`, and `, retention 1GiB and 7d` when the topic
/// has a limit.
fn created_topic_line(
    stream_id: u32,
    topic_id: u16,
    name: &str,
    partition_count: u32,
    retention_bytes: u64,
    retention_ms: u64,
) -> String {
    let mut line = format!(
        "created topic {stream_id}/{topic_id} {name:?} with {}",
        counted(u64::from(partition_count), "partition")
    );
    if retention_bytes != 0 || retention_ms != 0 {
        let _ = write!(
            line,
            ", retention {} by size and {} by age",
            listing::byte_size_text(retention_bytes),
            listing::age_text(retention_ms)
        );
    }
    line
}

/// `altered topic 1/2: retention 1GiB by size, unchanged by age`.
fn altered_topic_line(stream_id: u32, topic_id: u16, retention: &RetentionArgs) -> String {
    let bytes = retention
        .retention_bytes
        .map_or_else(|| "unchanged".to_owned(), listing::byte_size_text);
    let age = retention
        .retention_ms
        .map_or_else(|| "unchanged".to_owned(), listing::age_text);
    format!("altered topic {stream_id}/{topic_id}: retention {bytes} by size, {age} by age")
}

pub fn topic(command: TopicCommand) -> anyhow::Result<()> {
    block_on(async move {
        match command {
            TopicCommand::Create {
                stream,
                topic_id,
                name,
                partitions,
                retention,
                addr,
            } => {
                check_name_not_numeric(&name, "topic")?;
                let mut client = connect(&addr).await?;
                let (stream_id, topic_id) = new_topic_ids(&mut client, &stream, topic_id).await?;
                let retention_bytes = retention.retention_bytes.unwrap_or(0);
                let retention_ms = retention.retention_ms.unwrap_or(0);
                client
                    .create_topic_with_retention(
                        stream_id,
                        topic_id,
                        &name,
                        partitions,
                        retention_bytes,
                        retention_ms,
                    )
                    .await?;
                print_line(&created_topic_line(
                    stream_id,
                    topic_id,
                    &name,
                    partitions,
                    retention_bytes,
                    retention_ms,
                ))
            }
            TopicCommand::Delete {
                stream,
                topic,
                addr,
            } => {
                let mut client = connect(&addr).await?;
                let (stream_id, topic_id) = resolve_topic_ids(&mut client, &stream, &topic).await?;
                client.delete_topic(stream_id, topic_id).await?;
                print_line(&format!("deleted topic {stream_id}/{topic_id}"))
            }
            TopicCommand::Alter {
                stream,
                topic,
                retention,
                addr,
            } => {
                let mut client = connect(&addr).await?;
                let (stream_id, topic_id) = resolve_topic_ids(&mut client, &stream, &topic).await?;
                client
                    .alter_topic(
                        stream_id,
                        topic_id,
                        retention.retention_bytes,
                        retention.retention_ms,
                    )
                    .await
                    .with_context(|| format!("cannot alter topic {stream_id}/{topic_id}"))?;
                print_line(&altered_topic_line(stream_id, topic_id, &retention))
            }
            TopicCommand::List { stream, json, addr } => {
                let metadata = connect(&addr).await?.get_metadata().await?;
                let rows = listing::topic_rows(find_stream(&metadata, &stream)?);
                if json {
                    print_line(&serde_json::to_string(&rows)?)
                } else {
                    print_text(&listing::render_topics(&rows))
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    #[derive(Debug, clap::Parser)]
    struct Cli {
        #[command(subcommand)]
        command: Commands,
    }

    #[derive(Debug, clap::Subcommand)]
    enum Commands {
        #[command(subcommand)]
        Stream(StreamCommand),
        #[command(subcommand)]
        Topic(TopicCommand),
    }

    fn parse(args: &[&str]) -> Result<Commands, String> {
        Cli::try_parse_from(std::iter::once("shardline").chain(args.iter().copied()))
            .map(|cli| cli.command)
            .map_err(|error| error.to_string())
    }

    #[test]
    fn issue11_5_stream_create_takes_an_optional_id_before_the_name() {
        let Ok(Commands::Stream(StreamCommand::Create {
            stream_id, name, ..
        })) = parse(&["stream", "create", "orders"])
        else {
            panic!("stream create NAME parses");
        };
        assert_eq!((stream_id, name.as_str()), (None, "orders"));
        let Ok(Commands::Stream(StreamCommand::Create {
            stream_id, name, ..
        })) = parse(&["stream", "create", "7", "orders"])
        else {
            panic!("stream create ID NAME parses");
        };
        assert_eq!((stream_id, name.as_str()), (Some(7), "orders"));
        assert!(
            parse(&["stream", "create", "0", "orders"]).is_err(),
            "ids start at 1"
        );
    }

    #[test]
    fn issue11_5_topic_create_takes_stream_by_name_and_an_optional_id() {
        let Ok(Commands::Topic(TopicCommand::Create {
            stream,
            topic_id,
            name,
            partitions,
            retention,
            ..
        })) = parse(&[
            "topic",
            "create",
            "orders",
            "events",
            "--partitions",
            "4",
            "--retention-bytes",
            "1GiB",
            "--retention-ms",
            "7d",
        ])
        else {
            panic!("topic create STREAM NAME parses");
        };
        assert_eq!(stream, NameOrId::Name("orders".into()));
        assert_eq!((topic_id, name.as_str(), partitions), (None, "events", 4));
        assert_eq!(
            (retention.retention_bytes, retention.retention_ms),
            (Some(1 << 30), Some(604_800_000))
        );
        let Ok(Commands::Topic(TopicCommand::Create {
            stream,
            topic_id,
            name,
            ..
        })) = parse(&["topic", "create", "orders", "2", "events"])
        else {
            panic!("topic create STREAM ID NAME parses");
        };
        assert_eq!(stream, NameOrId::Name("orders".into()));
        assert_eq!((topic_id, name.as_str()), (Some(2), "events"));
    }

    #[test]
    fn issue11_4_topic_alter_needs_a_retention_flag() {
        let error = parse(&["topic", "alter", "orders", "events"]).unwrap_err();
        assert!(
            error.contains("the following required arguments were not provided")
                && error.contains("--retention-bytes <SIZE>"),
            "{error}"
        );
        let Ok(Commands::Topic(TopicCommand::Alter {
            stream,
            topic,
            retention,
            ..
        })) = parse(&["topic", "alter", "1", "events", "--retention-ms", "0"])
        else {
            panic!("topic alter with one flag parses");
        };
        assert_eq!(
            (stream, topic),
            (NameOrId::Id(1), NameOrId::Name("events".into()))
        );
        assert_eq!(
            (retention.retention_bytes, retention.retention_ms),
            (None, Some(0))
        );
        let error = parse(&["topic", "alter", "1", "1", "--retention-bytes", "1GB"]).unwrap_err();
        assert!(error.contains("is not a retention size"), "{error}");
    }

    #[test]
    fn issue11_5_next_free_id_is_one_past_the_largest() {
        assert_eq!(next_free_id([].into_iter(), u32::MAX, "stream").unwrap(), 1);
        assert_eq!(
            next_free_id([3, 9, 1].into_iter(), u32::MAX, "stream").unwrap(),
            10
        );
        assert_eq!(
            next_free_id([u16::MAX].into_iter(), u16::MAX, "topic")
                .unwrap_err()
                .to_string(),
            "the largest topic id is already 65535: give a free id before the name"
        );
    }

    #[test]
    fn issue11_4_create_and_alter_lines_say_the_retention() {
        assert_eq!(
            created_topic_line(1, 2, "events", 8, 0, 0),
            "created topic 1/2 \"events\" with 8 partitions"
        );
        assert_eq!(
            created_topic_line(1, 2, "events", 1, 1 << 30, 0),
            "created topic 1/2 \"events\" with 1 partition, retention 1GiB by size and unlimited \
             by age"
        );
        let retention = RetentionArgs {
            retention_bytes: None,
            retention_ms: Some(43_200_000),
        };
        assert_eq!(
            altered_topic_line(1, 2, &retention),
            "altered topic 1/2: retention unchanged by size, 12h by age"
        );
    }
}
