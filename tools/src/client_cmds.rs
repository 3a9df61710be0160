//! Client commands: `stream`, `topic`, `send`, `poll`, `metadata`. Each runs one compio runtime on
//! the calling thread and talks to a running server with the `bus` client.

use std::io::{BufRead, Write};
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::{Context, bail};
use bus::{BatchBuilder, Client, Namespace, Producer};

#[derive(Debug, Clone, clap::Args)]
pub struct AddrArgs {
    /// Server address.
    #[arg(long, env = "SHARDLINE_ADDR", default_value = "127.0.0.1:8090")]
    pub addr: SocketAddr,
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

async fn connect(addr: SocketAddr) -> anyhow::Result<Client> {
    Client::connect(addr).await.with_context(|| {
        format!(
            "is `shardline serve` running at {addr}? pass --addr HOST:PORT or set SHARDLINE_ADDR"
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
                connect(addr.addr)
                    .await?
                    .create_stream(stream_id, &name)
                    .await?;
                println!("created stream {stream_id} {name:?}");
            }
            StreamCommand::Delete { stream_id, addr } => {
                connect(addr.addr).await?.delete_stream(stream_id).await?;
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
                connect(addr.addr)
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
                connect(addr.addr)
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
        // An idempotent producer with a random id per invocation: a batch whose reply is lost
        // (reconnect, server restart) is resent and appended once.
        let mut producer = Producer::new(connect(args.partition.addr.addr).await?);
        let mut sent = 0usize;
        let mut first_offset = None;
        for chunk in lines.chunks(args.batch as usize) {
            let mut builder =
                BatchBuilder::with_capacity(chunk.len(), chunk.iter().map(String::len).sum());
            for (index, line) in chunk.iter().enumerate() {
                builder.push((sent + index) as u64, now_us(), line.as_bytes());
            }
            let ack = producer
                .send(namespace, builder)
                .await
                .with_context(|| format!("{sent} messages were acknowledged before this batch"))?;
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

pub fn poll(args: &PollArgs) -> anyhow::Result<()> {
    let namespace = args.partition.namespace();
    block_on(async move {
        let mut client = connect(args.partition.addr.addr).await?;
        let mut stdout = std::io::stdout().lock();
        let mut offset = args.offset;
        let mut printed = 0u32;
        while printed < args.count {
            let body = client
                .poll_messages(namespace, offset, args.count - printed)
                .await?;
            let messages = bus::client::messages_from(&body, offset)
                .context("server sent a malformed batch")?;
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
            eprintln!(
                "no messages at or after offset {} in {namespace}",
                args.offset
            );
        }
        Ok(())
    })
}

pub fn metadata(args: &AddrArgs) -> anyhow::Result<()> {
    block_on(async move {
        let metadata = connect(args.addr).await?.get_metadata().await?;
        println!("{}", serde_json::to_string_pretty(&metadata)?);
        Ok(())
    })
}
