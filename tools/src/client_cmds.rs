//! Client commands: `stream`, `topic`, `send`, `poll`, `metadata`. Each runs one compio runtime on
//! the calling thread and talks to a running server with the `bus` client.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bus::{BatchBuilder, Client, Namespace};

#[derive(Debug, Clone, clap::Args)]
pub struct AddrArgs {
    /// Server address.
    #[arg(long, env = "SHARDLINE_ADDR", default_value = "127.0.0.1:8090")]
    pub addr: SocketAddr,
    /// How long to keep retrying a refused first connect (a server starting or restarting), e.g.
    /// `5s`, `300ms` or `5` (seconds); `0` tries once.
    #[arg(
        long,
        env = "SHARDLINE_CONNECT_TIMEOUT",
        default_value = "5s",
        value_parser = parse_connect_timeout,
        value_name = "DURATION"
    )]
    pub connect_timeout: Duration,
}

/// Largest `--connect-timeout`: one hour (a longer wait is a supervisor's job).
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_hours(1);

/// `--connect-timeout`: `N` or `Ns` (seconds) or `Nms` (milliseconds), at most
/// `CONNECT_TIMEOUT_MAX`.
fn parse_connect_timeout(text: &str) -> Result<Duration, String> {
    let (digits, unit_ms) = if let Some(digits) = text.strip_suffix("ms") {
        (digits, 1)
    } else {
        (text.strip_suffix('s').unwrap_or(text), 1000)
    };
    let value: u64 = digits.parse().map_err(|_| {
        format!("{text:?} is not a duration: use seconds (5, 5s) or milliseconds (300ms)")
    })?;
    let timeout = Duration::from_millis(value.saturating_mul(unit_ms));
    if timeout > CONNECT_TIMEOUT_MAX {
        return Err(format!(
            "{text:?} exceeds the largest connect timeout, {} s",
            CONNECT_TIMEOUT_MAX.as_secs()
        ));
    }
    Ok(timeout)
}

#[derive(Debug, clap::Subcommand)]
pub enum StreamCommand {
    /// Create a stream: `shardline stream create 1 orders`.
    Create {
        /// Stream id (>= 1).
        stream_id: u32,
        /// Stream name (1-255 bytes of UTF-8, unique).
        name: String,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Delete a stream with its topics and their data.
    Delete {
        stream_id: u32,
        #[command(flatten)]
        addr: AddrArgs,
    },
}

#[derive(Debug, clap::Subcommand)]
pub enum TopicCommand {
    /// Create a topic: `shardline topic create 1 1 events --partitions 8`.
    Create {
        /// Stream id the topic belongs to.
        stream_id: u32,
        /// Topic id (>= 1).
        topic_id: u16,
        /// Topic name (unique in the stream).
        name: String,
        /// Number of partitions (1..=4096); each is owned by one shard.
        #[arg(long, default_value_t = 1)]
        partitions: u32,
        #[command(flatten)]
        addr: AddrArgs,
    },
    /// Delete a topic and its data.
    Delete {
        stream_id: u32,
        topic_id: u16,
        #[command(flatten)]
        addr: AddrArgs,
    },
}

#[derive(Debug, clap::Args)]
pub struct PartitionArgs {
    /// Stream id.
    #[arg(long)]
    pub stream: u32,
    /// Topic id.
    #[arg(long)]
    pub topic: u16,
    /// Partition id (0-based).
    #[arg(long, default_value_t = 0)]
    pub partition: u16,
    #[command(flatten)]
    pub addr: AddrArgs,
}

impl PartitionArgs {
    fn namespace(&self) -> Namespace {
        Namespace::new(self.stream, self.topic, self.partition)
    }
}

#[derive(Debug, clap::Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub partition: PartitionArgs,
    /// File with one message per line; stdin when absent.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Messages per batch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub batch: u32,
}

#[derive(Debug, clap::Args)]
pub struct PollArgs {
    #[command(flatten)]
    pub partition: PartitionArgs,
    /// First offset to read.
    #[arg(long, default_value_t = 0)]
    pub offset: u64,
    /// Largest number of messages to print.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..))]
    pub count: u32,
}

fn block_on<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    compio::runtime::Runtime::new()
        .context("cannot start the I/O runtime")?
        .block_on(future)
}

/// Connects, retrying a refused connect for `--connect-timeout`.
async fn connect(args: &AddrArgs) -> anyhow::Result<Client> {
    let addr = args.addr;
    Client::connect_with_timeout(addr, args.connect_timeout)
        .await
        .with_context(|| {
            format!(
                "is `shardline serve` running at {addr}? pass --addr HOST:PORT or set \
                 SHARDLINE_ADDR, and --connect-timeout to wait longer for it"
            )
        })
}

pub fn stream(command: StreamCommand) -> anyhow::Result<()> {
    block_on(async move {
        match command {
            StreamCommand::Create {
                stream_id,
                name,
                addr,
            } => {
                connect(&addr)
                    .await?
                    .create_stream(stream_id, &name)
                    .await?;
                println!("created stream {stream_id} {name:?}");
            }
            StreamCommand::Delete { stream_id, addr } => {
                connect(&addr).await?.delete_stream(stream_id).await?;
                println!("deleted stream {stream_id}");
            }
        }
        Ok(())
    })
}

pub fn topic(command: TopicCommand) -> anyhow::Result<()> {
    block_on(async move {
        match command {
            TopicCommand::Create {
                stream_id,
                topic_id,
                name,
                partitions,
                addr,
            } => {
                connect(&addr)
                    .await?
                    .create_topic(stream_id, topic_id, &name, partitions)
                    .await?;
                let plural = if partitions == 1 { "" } else { "s" };
                println!(
                    "created topic {stream_id}/{topic_id} {name:?} with {partitions} partition{plural}"
                );
            }
            TopicCommand::Delete {
                stream_id,
                topic_id,
                addr,
            } => {
                connect(&addr)
                    .await?
                    .delete_topic(stream_id, topic_id)
                    .await?;
                println!("deleted topic {stream_id}/{topic_id}");
            }
        }
        Ok(())
    })
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

pub fn send(args: &SendArgs) -> anyhow::Result<()> {
    let reader: Box<dyn BufRead> = match &args.file {
        Some(path) => Box::new(std::io::BufReader::new(
            std::fs::File::open(path).with_context(|| format!("cannot open {}", path.display()))?,
        )),
        None => Box::new(std::io::stdin().lock()),
    };
    let lines: Vec<String> = reader
        .lines()
        .collect::<Result<_, _>>()
        .context("cannot read messages")?;
    if lines.is_empty() {
        bail!("no messages to send: the input has no lines");
    }
    let namespace = args.partition.namespace();
    block_on(async move {
        let mut client = connect(&args.partition.addr).await?;
        let mut sent = 0usize;
        let mut first_offset = None;
        for chunk in lines.chunks(args.batch as usize) {
            let mut builder =
                BatchBuilder::with_capacity(chunk.len(), chunk.iter().map(String::len).sum());
            for (index, line) in chunk.iter().enumerate() {
                builder.push((sent + index) as u64, now_us(), line.as_bytes());
            }
            let ack = client.send_messages(namespace, builder.finish()).await?;
            first_offset.get_or_insert(ack.base_offset);
            sent += chunk.len();
        }
        println!(
            "sent {sent} messages to {namespace} at offsets {}..{}",
            first_offset.unwrap_or(0),
            first_offset.unwrap_or(0) + sent as u64
        );
        Ok(())
    })
}

/// Prints up to `--count` messages from `--offset` as `OFFSET<TAB>payload` lines. Stops early,
/// exit 0, when it reaches the end of the partition (saying so on stderr if it printed nothing);
/// an offset beyond the end (`OffsetOutOfRange`) or a damaged entry is an error after the
/// messages before it were printed.
pub fn poll(args: &PollArgs) -> anyhow::Result<()> {
    let namespace = args.partition.namespace();
    block_on(async move {
        let mut client = connect(&args.partition.addr).await?;
        let mut stdout = std::io::stdout().lock();
        let mut offset = args.offset;
        let mut printed = 0u32;
        let mut next_offset = None;
        while printed < args.count {
            let result = client
                .poll(namespace, offset, args.count - printed)
                .await
                .with_context(|| format!("poll of {namespace} at offset {offset} failed"))?;
            next_offset = Some(result.next_offset);
            let messages = result.messages().context("server sent a malformed batch")?;
            if messages.is_empty() {
                break;
            }
            for message in messages.iter().take((args.count - printed) as usize) {
                if !message.verify() {
                    bail!("message at offset {} failed its checksum", message.offset);
                }
                write!(stdout, "{}\t", message.offset)?;
                stdout.write_all(message.payload)?;
                stdout.write_all(b"\n")?;
                printed += 1;
                offset = message.offset + 1;
            }
        }
        if printed == 0 {
            let next_offset = next_offset.unwrap_or(args.offset);
            eprintln!(
                "caught up: no messages at or after offset {} in {namespace} (its next offset is \
                 {next_offset})",
                args.offset
            );
        }
        Ok(())
    })
}

pub fn metadata(args: &AddrArgs) -> anyhow::Result<()> {
    block_on(async move {
        let metadata = connect(args).await?.get_metadata().await?;
        println!("{}", serde_json::to_string_pretty(&metadata)?);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue7_4_connect_timeout_parses_seconds_and_milliseconds() {
        assert_eq!(parse_connect_timeout("5"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_connect_timeout("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(
            parse_connect_timeout("300ms"),
            Ok(Duration::from_millis(300))
        );
        assert_eq!(parse_connect_timeout("0"), Ok(Duration::ZERO));
        assert_eq!(parse_connect_timeout("3600s"), Ok(Duration::from_hours(1)));
        assert_eq!(
            parse_connect_timeout("3601"),
            Err("\"3601\" exceeds the largest connect timeout, 3600 s".to_owned())
        );
        assert_eq!(
            parse_connect_timeout("1.5s"),
            Err(
                "\"1.5s\" is not a duration: use seconds (5, 5s) or milliseconds (300ms)"
                    .to_owned()
            )
        );
    }
}
