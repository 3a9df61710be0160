//! Client commands: `send`, `poll`, `metadata` (`stream` and `topic` are in `stream_cmds`). Each
//! runs one compio runtime on the calling thread and talks to a running server with the `bus`
//! client. Output goes through `shardline::output`, so a reader that closes stdout early ends the
//! command quietly.

use std::collections::BTreeMap;
use std::io::{BufRead, Write};
use std::ops::Range;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::{Context, bail};
use bus::{
    BATCH_HEADER_SIZE, BatchBuilder, Client, ClientError, HEADER_SIZE, MESSAGE_HEADER_SIZE,
    Namespace, PRODUCER_STAMP_SIZE, Partitioner, Producer, partition_for_key,
};
use shardline::arg_values::{AddressList, parse_duration, whole_number};
use shardline::names::{NameOrId, ResolvedTopic};
use shardline::output::{print_line, stdout_error};

#[derive(Debug, Clone, clap::Args)]
pub struct AddrArgs {
    /// Server address: `IP:PORT` or `HOST:PORT` (a host name resolves to its first IPv4
    /// address); for a cluster, the client addresses of its replicas, comma-separated
    /// (`127.0.0.1:8090,127.0.0.1:8091,127.0.0.1:8092`): the client connects to the first that
    /// answers and follows the primary (a backup's NotPrimary answer names it; the next address
    /// is tried in turn when it names none).
    #[arg(long, env = "SHARDLINE_ADDR", default_value = "127.0.0.1:8090", value_name = "HOST:PORT", value_parser = shardline::arg_values::parse_address_list)]
    pub addr: AddressList,
    /// How long to keep retrying a refused first connect (a server starting or restarting), e.g.
    /// `5s`, `300ms` or `5` (seconds); `0` tries once.
    #[arg(
        long,
        env = "SHARDLINE_CONNECT_TIMEOUT",
        default_value = "5s",
        value_parser = parse_connect_timeout,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub connect_timeout: Duration,
    /// Deadline of each request, from sending it to its reply, across the client's retries and
    /// its moves to the primary (the connect before is bounded by --connect-timeout), e.g.
    /// `30s`, `500ms` or `30` (seconds). Past it the command fails: no reply came (in a
    /// cluster: is a majority of the replicas up?), and a change may or may not have been
    /// applied.
    #[arg(
        long,
        env = "SHARDLINE_TIMEOUT",
        default_value = "30s",
        value_parser = parse_request_timeout,
        value_name = "DURATION",
        allow_hyphen_values = true
    )]
    pub timeout: Duration,
}

/// Largest `--connect-timeout`: one hour (a longer wait is a supervisor's job).
const CONNECT_TIMEOUT_MAX: Duration = Duration::from_hours(1);
/// Largest `--timeout`: one hour, as `CONNECT_TIMEOUT_MAX` (a request a majority of replicas
/// does not answer within an hour needs an operator, not a longer wait).
const REQUEST_TIMEOUT_MAX: Duration = Duration::from_hours(1);

/// `--connect-timeout`: `N` or `Ns` (seconds) or `Nms` (milliseconds), at most
/// `CONNECT_TIMEOUT_MAX`.
fn parse_connect_timeout(text: &str) -> Result<Duration, String> {
    parse_duration(text, "connect timeout", CONNECT_TIMEOUT_MAX)
}

/// `--timeout`: as `--connect-timeout` (`parse_duration`), at most `REQUEST_TIMEOUT_MAX` and
/// above 0 (a request needs some time to be answered).
fn parse_request_timeout(text: &str) -> Result<Duration, String> {
    let timeout = parse_duration(text, "request timeout", REQUEST_TIMEOUT_MAX)?;
    if timeout.is_zero() {
        return Err(format!(
            "{text:?} leaves a request no time to be answered: use e.g. 30s or 500ms"
        ));
    }
    Ok(timeout)
}

#[derive(Debug, clap::Args)]
pub struct PartitionArgs {
    /// Stream: its id or its name.
    #[arg(long, value_parser = NameOrId::parse, value_name = "ID|NAME")]
    pub stream: NameOrId,
    /// Topic: its id or its name.
    #[arg(long, value_parser = NameOrId::parse, value_name = "ID|NAME")]
    pub topic: NameOrId,
    /// Partition id (0-based).
    #[arg(long, value_parser = whole_number("a partition id", 0, u16::MAX), allow_negative_numbers = true)]
    pub partition: Option<u16>,
    #[command(flatten)]
    pub addr: AddrArgs,
}

impl PartitionArgs {
    /// The topic these arguments name, looked up on the server when given by name.
    async fn resolve(&self, client: &mut Client) -> anyhow::Result<ResolvedTopic> {
        shardline::names::resolve_topic(client, &self.stream, &self.topic).await
    }
}

#[derive(Debug, clap::Args)]
pub struct SendArgs {
    #[command(flatten)]
    pub partition: PartitionArgs,
    /// Send every message to the partition of this key: XXH3-64 of its UTF-8 bytes (seed 0)
    /// modulo the topic's partition count, so the same key always lands on the same partition
    /// while the count stays the same. Without --partition, --key and --key-field, batches go
    /// round-robin over the partitions, from a random one.
    #[arg(long, value_name = "KEY", conflicts_with_all = ["partition", "key_field"])]
    pub key: Option<String>,
    /// Key each message by a field of its line, read as a JSON object: a string value keys by
    /// its UTF-8 bytes, a number or boolean by its JSON text (`42`, `true`), mapped as --key.
    /// Messages keep their input order within each partition. A line that is not a JSON object,
    /// lacks the field, or holds null, an array or an object there is refused before anything
    /// is sent.
    #[arg(long, value_name = "FIELD", conflicts_with = "partition")]
    pub key_field: Option<String>,
    /// File with one message per line (`\n` or `\r\n`); stdin when absent. Empty lines are
    /// skipped, as by `bench --payload-file`.
    #[arg(long)]
    pub file: Option<PathBuf>,
    /// Most messages per batch (one request). Batches are also cut so that each request frame
    /// fits the server's --max-message-size, which the client asks the server for.
    #[arg(long, default_value_t = 100, value_parser = whole_number("a batch size", 1u32, 1_048_576), allow_negative_numbers = true)]
    pub batch: u32,
}

/// How `poll` prints each message on stdout.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum PollOutput {
    /// `OFFSET<TAB>PAYLOAD<LF>`, the payload's bytes as stored.
    Text,
    /// `PAYLOAD<LF>`: the payload's bytes only.
    Raw,
    /// One JSON object per line: `{"offset":N,"timestamp_us":N,"id":N,"payload":"..."}`, with
    /// `payload_hex` (lowercase hex) instead of `payload` when the bytes are not UTF-8. `id` is
    /// the producer's message id (`send` numbers each run's messages from 0, so ids repeat
    /// across runs; `offset` is unique); `timestamp_us` is the producer's clock, µs since the
    /// Unix epoch.
    Json,
}

#[derive(Debug, clap::Args)]
pub struct PollArgs {
    #[command(flatten)]
    pub partition: PartitionArgs,
    /// First offset to read; with --consumer it takes the place of the consumer's stored offset
    /// (with --commit, the next run resumes after what this one printed). Without it: the
    /// consumer's stored offset, else the partition's first retained offset (0 until retention
    /// deleted segments).
    #[arg(long, value_parser = whole_number("an offset", 0, u64::MAX), allow_negative_numbers = true)]
    pub offset: Option<u64>,
    /// Largest number of messages to print: 100 by default, no limit with --follow.
    #[arg(long, value_parser = whole_number("a message count", 1, u32::MAX), allow_negative_numbers = true)]
    pub count: Option<u32>,
    /// Keep printing messages as they are appended, like `tail -f`, until SIGINT or SIGTERM
    /// (then exit 0) or --count messages. Each poll waits on the server (parked, no busy
    /// polling) up to 60 s for new data, then polls again. When the server stops, it retries
    /// for --timeout (30 s by default), so a restart is followed, then exits 1.
    #[arg(long)]
    pub follow: bool,
    /// Read as this named consumer: start from the offset it stored in the partition (the next
    /// offset it reads; moved up to the first retained offset when retention deleted it), unless
    /// --offset is given.
    #[arg(long, value_name = "NAME", value_parser = parse_consumer)]
    pub consumer: Option<bus::Consumer>,
    /// Store --consumer's offset (the next offset to read) once the messages are printed: at the
    /// end, or with --follow after each printed batch, so a restart resumes after the last
    /// message printed.
    #[arg(long, requires = "consumer")]
    pub commit: bool,
    /// Output format: `text` (`OFFSET<TAB>PAYLOAD` per line), `raw` (payload bytes only, one per
    /// line) or `json` (one object per line with offset, timestamp_us, id and payload).
    #[arg(long, value_enum, default_value_t = PollOutput::Text)]
    pub output: PollOutput,
}

pub(crate) fn block_on<T>(future: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    compio::runtime::Runtime::new()
        .context("cannot start the I/O runtime")?
        .block_on(future)
}

/// Connects to the first address of `--addr` that accepts, retrying refused connects (each
/// address in turn) for `--connect-timeout`; each request of the client then has `--timeout`.
pub(crate) async fn connect(args: &AddrArgs) -> anyhow::Result<Client> {
    let addr = &args.addr;
    Client::connect_any_with_timeout(&addr.0, args.connect_timeout)
        .await
        .map(|client| client.with_request_timeout(args.timeout))
        .map_err(connect_error)
        .with_context(|| {
            format!(
                "is `shardline serve` running at {addr}? pass --addr HOST:PORT or set \
                 SHARDLINE_ADDR, and --connect-timeout to wait longer for it"
            )
        })
}

/// `error` of a failed connect, with `ConnectTimeout` told in words: `within the connect timeout
/// of 700 ms (3 attempts)`, or `in one attempt, no retry (--connect-timeout 0)`.
fn connect_error(error: ClientError) -> anyhow::Error {
    match error {
        ClientError::ConnectTimeout {
            addr,
            timeout,
            attempt_count,
            source,
        } => anyhow::anyhow!(
            "cannot connect to {addr} {}: {source}",
            connect_attempts(timeout, attempt_count)
        ),
        ClientError::ConnectAnyTimeout {
            addresses,
            timeout,
            attempt_count,
            source,
        } => anyhow::anyhow!(
            "cannot connect to any of {addresses} {}: {source}",
            connect_attempts(timeout, attempt_count)
        ),
        other => other.into(),
    }
}

/// How long and how often a connect was tried, for `connect_error`.
fn connect_attempts(timeout: Duration, attempt_count: u32) -> String {
    if timeout.is_zero() {
        "in one attempt, no retry (--connect-timeout 0)".to_owned()
    } else {
        format!(
            "within the connect timeout of {} ms ({})",
            timeout.as_millis(),
            counted(u64::from(attempt_count), "attempt")
        )
    }
}

fn now_us() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// Where `send` puts its messages (issue 11 section 5).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Routing {
    /// `--partition N`: every batch to partition N.
    Partition(u16),
    /// Neither `--partition` nor a key: batch after batch over the partitions, from `start`.
    RoundRobin { start: u32 },
    /// `--key K`: every batch to `partition_for_key(K)`.
    Key(Vec<u8>),
    /// `--key-field F`: message `i` to `partition_for_key(keys[i])`.
    KeyPerMessage(Vec<Vec<u8>>),
}

/// One request of `send`: the indices (into the input's messages, ascending) of the messages
/// it carries to `partition`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct PlannedBatch {
    partition: u16,
    message_indices: Vec<usize>,
}

/// Cuts `lines` into the batches `send` sends, in sending order, each within
/// `batch_message_count_max` messages and `frame_size_max` bytes of frame: consecutive batches
/// for one partition or round-robin (each batch to the next partition), or per partition in
/// input order for a key per message (partitions ascending).
///
/// # Errors
/// A line too long for any frame (`batch_ranges`).
fn plan_batches(
    input: &InputLines,
    routing: &Routing,
    partition_count: u32,
    batch_message_count_max: u32,
    frame_size_max: u32,
) -> anyhow::Result<Vec<PlannedBatch>> {
    // Cut over the whole input first: a line too long is refused naming its place in the input.
    let lines = &input.messages;
    let ranges = batch_ranges(
        lines,
        &input.line_numbers,
        batch_message_count_max,
        frame_size_max,
    )?;
    let contiguous = |partition: u16, range: Range<usize>| PlannedBatch {
        partition,
        message_indices: range.collect(),
    };
    Ok(match routing {
        // A partition the topic lacks is the server's to refuse (`PartitionNotFound`), reported
        // with where the batch went.
        Routing::Partition(partition) => ranges
            .into_iter()
            .map(|range| contiguous(*partition, range))
            .collect(),
        Routing::RoundRobin { start } => {
            let mut partitioner = Partitioner::round_robin_from(*start);
            ranges
                .into_iter()
                .map(|range| {
                    let partition = partitioner.next_partition(partition_count);
                    contiguous(partition_id(partition), range)
                })
                .collect()
        }
        Routing::Key(key) => {
            let partition = partition_id(partition_for_key(key, partition_count));
            ranges
                .into_iter()
                .map(|range| contiguous(partition, range))
                .collect()
        }
        Routing::KeyPerMessage(keys) => {
            assert_eq!(keys.len(), lines.len(), "one key per message");
            let mut by_partition: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
            for (index, key) in keys.iter().enumerate() {
                let partition = partition_id(partition_for_key(key, partition_count));
                by_partition.entry(partition).or_default().push(index);
            }
            let mut planned = Vec::new();
            for (partition, indices) in by_partition {
                let group: Vec<&[u8]> = indices.iter().map(|&i| lines[i].as_slice()).collect();
                let group_line_numbers: Vec<u64> =
                    indices.iter().map(|&i| input.line_numbers[i]).collect();
                let group_ranges = batch_ranges(
                    &group,
                    &group_line_numbers,
                    batch_message_count_max,
                    frame_size_max,
                )?;
                for range in group_ranges {
                    planned.push(PlannedBatch {
                        partition,
                        message_indices: indices[range].to_vec(),
                    });
                }
            }
            planned
        }
    })
}

/// A partition index below a topic's partition count (at most `u16::MAX + 1`) as a partition id.
fn partition_id(partition: u32) -> u16 {
    u16::try_from(partition).expect("a topic's partition ids fit in u16")
}

/// The key of each line for `--key-field FIELD` (issue 11 section 5): the line is a JSON object;
/// a string value keys by its UTF-8 bytes, a number or boolean by its JSON text (integers as
/// written; other numbers as `serde_json` prints them back, e.g. `1e3` as `1000.0`).
///
/// # Errors
/// The first line (by its number in the input, `line_numbers[i]`) that is not a JSON object,
/// has no `field`, or holds null, an array or an object in it.
fn line_keys(lines: &[Vec<u8>], line_numbers: &[u64], field: &str) -> anyhow::Result<Vec<Vec<u8>>> {
    lines
        .iter()
        .zip(line_numbers)
        .map(|(line, line_number)| {
            let refuse = |why: String| {
                anyhow::anyhow!(
                    "line {line_number} {why} (--key-field {field:?}); nothing was sent"
                )
            };
            let value: serde_json::Value = serde_json::from_slice(line)
                .map_err(|error| refuse(format!("is not a JSON object: {error}")))?;
            let serde_json::Value::Object(object) = value else {
                return Err(refuse(format!(
                    "is not a JSON object but {}",
                    json_kind(&value)
                )));
            };
            match object.get(field) {
                None => Err(refuse(format!("has no field {field:?}"))),
                Some(serde_json::Value::String(text)) => Ok(text.as_bytes().to_vec()),
                Some(number @ serde_json::Value::Number(_)) => Ok(number.to_string().into_bytes()),
                Some(serde_json::Value::Bool(flag)) => Ok(flag.to_string().into_bytes()),
                Some(other) => Err(refuse(format!(
                    "holds {} in field {field:?}: a key is a string, a number or a boolean",
                    json_kind(other)
                ))),
            }
        })
        .collect()
}

/// `null`, `a boolean`, `a number`, `a string`, `an array` or `an object`, for error messages.
fn json_kind(value: &serde_json::Value) -> &'static str {
    match value {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// Sends the input's messages (issue 11 section 5): to `--partition`, to the partition of
/// `--key` or of each line's `--key-field`, or batch after batch round-robin over the topic's
/// partitions from a random one. Prints one `sent` line per partition, partitions ascending.
/// Everything that can be refused (a bad line, a key field, a line too large) is refused before
/// the first batch is sent.
pub fn send(args: &SendArgs) -> anyhow::Result<()> {
    let input = match &args.file {
        Some(path) => {
            let file = std::fs::File::open(path)
                .with_context(|| format!("cannot open {}", path.display()))?;
            message_lines(std::io::BufReader::new(file))
                .with_context(|| format!("cannot read messages from {}", path.display()))?
        }
        None => message_lines(std::io::stdin().lock())
            .context("cannot read messages from standard input")?,
    };
    let input = &input;
    let lines = &input.messages;
    if lines.is_empty() {
        bail!("no messages to send: the input has no non-empty line");
    }
    let routing = match (&args.key, &args.key_field, args.partition.partition) {
        (Some(key), _, _) => Routing::Key(key.as_bytes().to_vec()),
        (None, Some(field), _) => {
            Routing::KeyPerMessage(line_keys(lines, &input.line_numbers, field)?)
        }
        (None, None, Some(partition)) => Routing::Partition(partition),
        // A random first partition: runs of one batch each spread over the partitions too.
        (None, None, None) => Routing::RoundRobin {
            start: (bus::producer::producer_id_new() % u64::from(u32::MAX)) as u32,
        },
    };
    block_on(async move {
        let mut client = connect(&args.partition.addr).await?;
        let topic = args.partition.resolve(&mut client).await?;
        let client = with_server_message_size(client).await?;
        let planned = plan_batches(
            input,
            &routing,
            topic.partition_count,
            args.batch,
            client.max_message_size(),
        )?;
        // An idempotent producer with a random id per invocation: a batch whose reply is lost
        // (reconnect, server restart) is resent and appended once.
        let mut producer = Producer::new(client);
        let mut acked: BTreeMap<u16, Vec<Range<u64>>> = BTreeMap::new();
        let mut acked_count = 0u64;
        for batch in planned {
            let namespace = Namespace::new(topic.stream_id, topic.topic_id, batch.partition);
            let mut builder = BatchBuilder::with_capacity(
                batch.message_indices.len(),
                batch.message_indices.iter().map(|&i| lines[i].len()).sum(),
            );
            for &index in &batch.message_indices {
                builder.push(index as u64, now_us(), &lines[index]);
            }
            let ack = producer
                .send(namespace, builder)
                .await
                .with_context(|| send_failed_context(namespace, acked_count))?;
            let count = batch.message_indices.len() as u64;
            acked_count += count;
            acked
                .entry(batch.partition)
                .or_default()
                .push(ack.base_offset..ack.base_offset + count);
        }
        let report: Vec<String> = acked
            .iter()
            .map(|(&partition, ranges)| {
                let namespace = Namespace::new(topic.stream_id, topic.topic_id, partition);
                sent_line(namespace, ranges)
            })
            .collect();
        print_line(&report.join("\n"))
    })
}

/// The context of a failed batch: `send to 1/1/0 failed after 1 message was acknowledged`.
fn send_failed_context(namespace: Namespace, acked_count: u64) -> String {
    let verb = if acked_count == 1 { "was" } else { "were" };
    format!(
        "send to {namespace} failed after {} {verb} acknowledged",
        counted(acked_count, "message")
    )
}

/// `send`'s input: its non-empty lines and where each was.
#[derive(Debug, Clone, PartialEq, Eq)]
struct InputLines {
    /// One message per non-empty line, without its `\n` or `\r\n`.
    messages: Vec<Vec<u8>>,
    /// The 1-based line number in the input of each of `messages`.
    line_numbers: Vec<u64>,
}

/// The messages of `send`'s input, as bytes (any bytes, UTF-8 or not): one per line, without its
/// `\n` or `\r\n`; empty lines are skipped (the rule `bench --payload-file` follows too).
///
/// # Errors
/// A read error of `reader`; the caller names the input.
fn message_lines(mut reader: impl BufRead) -> std::io::Result<InputLines> {
    let mut input = InputLines {
        messages: Vec::new(),
        line_numbers: Vec::new(),
    };
    let mut line_number = 0u64;
    loop {
        let mut line = Vec::new();
        if reader.read_until(b'\n', &mut line)? == 0 {
            return Ok(input);
        }
        line_number += 1;
        if line.last() == Some(&b'\n') {
            line.pop();
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        if !line.is_empty() {
            input.messages.push(line);
            input.line_numbers.push(line_number);
        }
    }
}

/// `client` limited to the server's `max_message_size`, so requests are sized to what the server
/// accepts; unchanged if the server does not report it.
async fn with_server_message_size(mut client: Client) -> anyhow::Result<Client> {
    let server_limit = client
        .server_max_message_size()
        .await
        .context("cannot ask the server for its --max-message-size")?;
    Ok(match server_limit {
        Some(limit) => client.with_max_message_size(limit),
        None => client,
    })
}

/// Bytes of a SendMessages request frame carrying `payload_lens`: the 256-byte frame header, the
/// 32-byte batch header, the 16-byte producer stamp and 32 bytes of header per message, plus the
/// payloads.
fn send_frame_size(payload_lens: impl IntoIterator<Item = usize>) -> usize {
    HEADER_SIZE
        + BATCH_HEADER_SIZE
        + PRODUCER_STAMP_SIZE
        + payload_lens
            .into_iter()
            .map(|len| MESSAGE_HEADER_SIZE + len)
            .sum::<usize>()
}

/// Splits `lines` into consecutive batches of at most `batch_message_count_max` messages whose
/// request frame fits in `frame_size_max` bytes; `line_numbers[i]` is where `lines[i]` was in
/// the input (for the error).
///
/// # Errors
/// A line too long to fit in any request frame, naming its line number, its size and the limit.
///
/// # Panics
/// If `line_numbers` has not one number per line (a caller bug).
fn batch_ranges(
    lines: &[impl AsRef<[u8]>],
    line_numbers: &[u64],
    batch_message_count_max: u32,
    frame_size_max: u32,
) -> anyhow::Result<Vec<Range<usize>>> {
    assert_eq!(lines.len(), line_numbers.len(), "one line number per line");
    let frame_size_max = frame_size_max as usize;
    let payload_len_max = frame_size_max.saturating_sub(send_frame_size([0]));
    let mut batches = Vec::new();
    let mut start = 0;
    let mut frame_size = send_frame_size([]);
    for (index, line) in lines.iter().enumerate() {
        let line = line.as_ref();
        if line.len() > payload_len_max {
            bail!(
                "line {} holds {} bytes, more than the {payload_len_max} bytes a message may hold \
                 under the server's --max-message-size {frame_size_max} (the request frame, \
                 {} bytes of headers included)",
                line_numbers[index],
                line.len(),
                send_frame_size([0]),
            );
        }
        let message_size = MESSAGE_HEADER_SIZE + line.len();
        let full = index - start == batch_message_count_max as usize
            || frame_size + message_size > frame_size_max;
        if full {
            batches.push(start..index);
            start = index;
            frame_size = send_frame_size([]);
        }
        frame_size += message_size;
    }
    if start < lines.len() {
        batches.push(start..lines.len());
    }
    Ok(batches)
}

/// `count` and `noun`, plural unless `count` is 1: `1 message`, `2 messages`.
pub(crate) fn counted(count: u64, noun: &str) -> String {
    if count == 1 {
        format!("{count} {noun}")
    } else {
        format!("{count} {noun}s")
    }
}

/// Inclusive offset ranges of half-open `ranges`, neighbours merged: `0-1,5-9`, or `3` alone.
fn offset_ranges(ranges: &[Range<u64>]) -> String {
    let mut merged: Vec<Range<u64>> = Vec::new();
    for range in ranges.iter().filter(|range| !range.is_empty()) {
        match merged.last_mut() {
            Some(last) if last.end == range.start => last.end = range.end,
            _ => merged.push(range.clone()),
        }
    }
    merged
        .iter()
        .map(|range| {
            if range.end - range.start == 1 {
                range.start.to_string()
            } else {
                format!("{}-{}", range.start, range.end - 1)
            }
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// `send`'s report: `sent 1 message to 1/1/0 at offset 4`, `sent 3 messages to 1/1/0 at offsets
/// 0-2`; `acked` holds each batch's half-open offset range.
fn sent_line(namespace: Namespace, acked: &[Range<u64>]) -> String {
    let count: u64 = acked.iter().map(|range| range.end - range.start).sum();
    let at = if count == 1 { "offset" } else { "offsets" };
    format!(
        "sent {} to {namespace} at {at} {}",
        counted(count, "message"),
        offset_ranges(acked)
    )
}

/// `--consumer`: a plain consumer's name (`bus::Consumer` rules: 1..=255 bytes of UTF-8, no
/// control characters).
fn parse_consumer(text: &str) -> Result<bus::Consumer, String> {
    bus::Consumer::new(bus::ConsumerKind::Consumer, text)
}

/// `poll --count` without --follow when not given.
const POLL_COUNT_DEFAULT: u32 = 100;

/// Prints up to `--count` messages from `--offset` (or `--consumer`'s stored offset) in the
/// `--output` format; with `--follow` keeps printing new ones until a signal
/// (`crate::follow`); with `--commit` stores the consumer's offset after printing. Without
/// --follow it stops early, exit 0, when it reaches the end of the partition (saying so on
/// stderr if it printed nothing); an offset beyond the end (`OffsetOutOfRange`) or a damaged
/// entry is an error after the messages before it were printed.
pub fn poll(args: &PollArgs) -> anyhow::Result<()> {
    block_on(async move {
        let mut client = connect(&args.partition.addr).await?;
        let topic = args.partition.resolve(&mut client).await?;
        let namespace = Namespace::new(
            topic.stream_id,
            topic.topic_id,
            args.partition.partition.unwrap_or(0),
        );
        let start = start_offset(&mut client, namespace, args).await?;
        if args.follow {
            return crate::follow::follow(&mut client, namespace, start, args).await;
        }
        let count = args.count.unwrap_or(POLL_COUNT_DEFAULT);
        let mut stdout = std::io::stdout().lock();
        let mut offset = start;
        let mut printed = 0u32;
        let mut next_offset = None;
        while printed < count {
            let result = client
                .poll(namespace, offset, count - printed)
                .await
                .with_context(|| format!("poll of {namespace} at offset {offset} failed"))?;
            next_offset = Some(result.next_offset);
            let messages = result.messages().context("server sent a malformed batch")?;
            if messages.is_empty() {
                break;
            }
            let (written, after) = write_messages(
                &mut stdout,
                args.output,
                &messages,
                (count - printed) as usize,
            )?;
            printed += written as u32;
            offset = after.unwrap_or(offset);
        }
        stdout.flush().map_err(stdout_error)?;
        if printed == 0 {
            let next_offset = next_offset.unwrap_or(start);
            eprintln!(
                "caught up: no messages at or after offset {start} in {namespace} (its next offset \
                 is {next_offset})"
            );
        }
        // Caught up, `--commit` still stores where it started (a `--offset` the user chose is
        // where the next run resumes).
        if args.commit {
            commit_offset(&mut client, namespace, args, offset).await?;
        }
        Ok(())
    })
}

/// Where `poll` starts: `--offset` when given; else `--consumer`'s stored offset in `namespace`,
/// moved up to the partition's first retained offset when retention deleted it (said on stderr);
/// else the partition's first retained offset (issue 11 sections 1 and 4: after retention, a
/// stored offset or offset 0 below the first offset would be `OffsetOutOfRange` at every run).
///
/// # Errors
/// The `GetOffset` or `GetMetadata` request failed.
async fn start_offset(
    client: &mut Client,
    namespace: Namespace,
    args: &PollArgs,
) -> anyhow::Result<u64> {
    if let Some(offset) = args.offset {
        return Ok(offset);
    }
    let first_offset = first_retained_offset(client, namespace).await?;
    let Some(consumer) = &args.consumer else {
        return Ok(first_offset);
    };
    let stored = client
        .get_offset(namespace, consumer)
        .await
        .with_context(|| {
            format!(
                "cannot read the stored offset of consumer {:?} in {namespace}",
                consumer.name
            )
        })?;
    match stored {
        Some(stored) if stored < first_offset => {
            eprintln!(
                "consumer {:?} stored offset {stored} in {namespace}, which retention deleted: \
                 starting at the first offset {first_offset}",
                consumer.name
            );
            Ok(first_offset)
        }
        Some(stored) => Ok(stored),
        None => Ok(first_offset),
    }
}

/// The first offset `namespace` still retains, from the server's metadata (0 for a partition
/// the metadata does not list: the poll then names the real problem).
///
/// # Errors
/// The `GetMetadata` request failed.
async fn first_retained_offset(client: &mut Client, namespace: Namespace) -> anyhow::Result<u64> {
    let metadata = client
        .get_metadata()
        .await
        .context("cannot read the partition's first offset")?;
    Ok(metadata
        .streams
        .iter()
        .filter(|stream| stream.stream_id == namespace.stream_id())
        .flat_map(|stream| &stream.topics)
        .filter(|topic| topic.topic_id == namespace.topic_id())
        .flat_map(|topic| &topic.partitions)
        .find(|partition| partition.partition_id == namespace.partition_id())
        .map_or(0, |partition| partition.first_offset))
}

/// Stores `--consumer`'s offset in `namespace` as `next_offset` (the next offset it reads).
///
/// # Errors
/// The `StoreOffset` request failed (the messages were printed; the next run with this
/// consumer prints them again).
pub(crate) async fn commit_offset(
    client: &mut Client,
    namespace: Namespace,
    args: &PollArgs,
    next_offset: u64,
) -> anyhow::Result<()> {
    let Some(consumer) = &args.consumer else {
        return Ok(());
    };
    client
        .store_offset(namespace, consumer, 0, next_offset)
        .await
        .with_context(|| {
            format!(
                "printed messages up to offset {} but could not store consumer {:?}'s offset in \
                 {namespace}; they are printed again on its next run",
                next_offset.saturating_sub(1),
                consumer.name
            )
        })
}

/// Writes up to `limit` of `messages` to `out` in the `output` format, checking each one's
/// checksum first. Returns how many were written and the offset after the last one (`None`
/// when none was).
///
/// # Errors
/// A message failed its checksum (those before it were written), or stdout failed.
pub(crate) fn write_messages(
    out: &mut impl Write,
    output: PollOutput,
    messages: &[bus::MessageView<'_>],
    limit: usize,
) -> anyhow::Result<(usize, Option<u64>)> {
    let mut written = 0;
    let mut after = None;
    for message in messages.iter().take(limit) {
        if !message.verify() {
            bail!("message at offset {} failed its checksum", message.offset);
        }
        write_message(out, output, message).map_err(stdout_error)?;
        written += 1;
        after = Some(message.offset + 1);
    }
    Ok((written, after))
}

/// One line of `poll --output json`.
#[derive(Debug, serde::Serialize)]
struct JsonMessage<'a> {
    offset: u64,
    /// Microseconds since the Unix epoch, as the producer stamped the message.
    timestamp_us: u64,
    /// The producer's message id: `send` numbers the messages of each run from 0.
    id: u64,
    /// The payload, when it is UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    /// The payload in lowercase hex, when it is not UTF-8.
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_hex: Option<String>,
}

/// Writes one polled message to `out` in the `output` format.
fn write_message(
    out: &mut impl Write,
    output: PollOutput,
    message: &bus::MessageView<'_>,
) -> std::io::Result<()> {
    match output {
        PollOutput::Text => {
            write!(out, "{}\t", message.offset)?;
            out.write_all(message.payload)?;
        }
        PollOutput::Raw => out.write_all(message.payload)?,
        PollOutput::Json => {
            let payload = std::str::from_utf8(message.payload).ok();
            let line = JsonMessage {
                offset: message.offset,
                timestamp_us: message.timestamp_us,
                id: message.id,
                payload,
                payload_hex: payload.is_none().then(|| hex(message.payload)),
            };
            serde_json::to_writer(&mut *out, &line)?;
        }
    }
    out.write_all(b"\n")
}

/// Lowercase hex of `bytes`, two digits a byte.
fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut text, byte| {
            let _ = write!(text, "{byte:02x}");
            text
        })
}

#[derive(Debug, clap::Args)]
pub struct MetadataArgs {
    /// Print the JSON on one line (for scripts); without it, indented.
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub addr: AddrArgs,
}

/// Prints the answering replica's metadata as JSON: `shard_count`, `streams` (topics,
/// partitions, owner shards, next offsets) and where the replica stands in its cluster: `view`,
/// `replica`, `primary`, `commit` (0 from a server that predates them).
pub fn metadata(args: &MetadataArgs) -> anyhow::Result<()> {
    block_on(async move {
        let metadata = connect(&args.addr).await?.get_metadata().await?;
        let text = if args.json {
            serde_json::to_string(&metadata)?
        } else {
            serde_json::to_string_pretty(&metadata)?
        };
        print_line(&text)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(count: usize, len: usize) -> Vec<Vec<u8>> {
        (0..count).map(|_| vec![b'x'; len]).collect()
    }

    /// Line numbers 1..=count: an input without empty lines.
    fn numbered(count: usize) -> Vec<u64> {
        (1..=count as u64).collect()
    }

    fn input_of(messages: Vec<Vec<u8>>) -> InputLines {
        InputLines {
            line_numbers: numbered(messages.len()),
            messages,
        }
    }

    #[test]
    fn issue11_5_a_line_too_long_is_named_by_its_line_in_the_input() {
        let text = format!("a\n\n\n{}\n", "x".repeat(689));
        let input = message_lines(text.as_bytes()).unwrap();
        for routing in [
            Routing::Partition(0),
            Routing::RoundRobin { start: 0 },
            Routing::KeyPerMessage(vec![b"k".to_vec(); 2]),
        ] {
            assert_eq!(
                plan_batches(&input, &routing, 2, 100, 1024)
                    .unwrap_err()
                    .to_string(),
                "line 4 holds 689 bytes, more than the 688 bytes a message may hold under the \
                 server's --max-message-size 1024 (the request frame, 336 bytes of headers \
                 included)",
                "{routing:?}"
            );
        }
    }

    #[test]
    fn issue7_6_batches_are_cut_to_fit_the_frame_limit() {
        // 100 lines of 20 bytes (21 with the newline) under --max-message-size 1024: 304 bytes
        // of frame header, batch header and producer stamp leave 720, 13 messages of 52 bytes.
        let batches = batch_ranges(&lines(100, 20), &numbered(100), 100, 1024).unwrap();
        assert_eq!(batches.len(), 8);
        assert_eq!(batches[0], 0..13);
        assert_eq!(batches[7], 91..100);
        assert_eq!(send_frame_size([20; 13]), 980);
        assert_eq!(send_frame_size([20; 14]), 1032);
        let covered: Vec<usize> = batches.into_iter().flatten().collect();
        assert_eq!(covered, (0..100).collect::<Vec<_>>());
    }

    #[test]
    fn batches_also_respect_the_message_count() {
        assert_eq!(
            batch_ranges(&lines(25, 1), &numbered(25), 10, 1 << 20).unwrap(),
            vec![0..10, 10..20, 20..25]
        );
    }

    #[test]
    fn issue7_6_a_line_too_large_is_refused_with_its_size_and_the_limit() {
        let mut input = lines(3, 5);
        input[1] = vec![b'y'; 689];
        assert_eq!(
            batch_ranges(&input, &numbered(3), 100, 1024)
                .unwrap_err()
                .to_string(),
            "line 2 holds 689 bytes, more than the 688 bytes a message may hold under the \
             server's --max-message-size 1024 (the request frame, 336 bytes of headers included)"
        );
        input[1].pop();
        // 688 bytes fill a frame alone: 336 + 688 = 1024.
        assert_eq!(
            batch_ranges(&input, &numbered(3), 100, 1024).unwrap(),
            vec![0..1, 1..2, 2..3]
        );
    }

    #[test]
    fn issue7_6_sent_line_prints_inclusive_ranges_and_singulars() {
        let namespace = Namespace::new(1, 1, 0);
        assert_eq!(
            sent_line(namespace, std::slice::from_ref(&(4..5))),
            "sent 1 message to 1/1/0 at offset 4"
        );
        assert_eq!(
            sent_line(namespace, std::slice::from_ref(&(0..2))),
            "sent 2 messages to 1/1/0 at offsets 0-1"
        );
        assert_eq!(
            sent_line(namespace, &[0..14, 14..20, 30..31]),
            "sent 21 messages to 1/1/0 at offsets 0-19,30"
        );
        assert_eq!(counted(1, "partition"), "1 partition");
        assert_eq!(counted(8, "partition"), "8 partitions");
    }

    #[test]
    fn issue7_6_send_skips_empty_lines() {
        let input = b"a\n\nb\r\n\r\n\nc";
        assert_eq!(
            message_lines(&input[..]).unwrap(),
            InputLines {
                messages: vec![b"a".to_vec(), b"b".to_vec(), b"c".to_vec()],
                line_numbers: vec![1, 3, 6],
            }
        );
    }

    #[test]
    fn issue7_6_send_reads_lines_as_bytes() {
        let input = b"ok line\nbad \xff\xfe line\r\n\n\xc3\n";
        assert_eq!(
            message_lines(&input[..]).unwrap().messages,
            vec![
                b"ok line".to_vec(),
                b"bad \xff\xfe line".to_vec(),
                b"\xc3".to_vec()
            ]
        );
    }

    #[test]
    fn issue7_6_send_failure_leads_with_the_partition() {
        let namespace = Namespace::new(1, 1, 9);
        assert_eq!(
            send_failed_context(namespace, 0),
            "send to 1/1/9 failed after 0 messages were acknowledged"
        );
        assert_eq!(
            send_failed_context(namespace, 1),
            "send to 1/1/9 failed after 1 message was acknowledged"
        );
        assert_eq!(
            send_failed_context(namespace, 13),
            "send to 1/1/9 failed after 13 messages were acknowledged"
        );
    }

    #[test]
    fn issue7_6_connect_attempts_in_words() {
        assert_eq!(
            connect_attempts(Duration::ZERO, 1),
            "in one attempt, no retry (--connect-timeout 0)"
        );
        assert_eq!(
            connect_attempts(Duration::from_millis(700), 1),
            "within the connect timeout of 700 ms (1 attempt)"
        );
        assert_eq!(
            connect_attempts(Duration::from_secs(5), 12),
            "within the connect timeout of 5000 ms (12 attempts)"
        );
    }

    #[test]
    fn issue7_6_poll_output_modes() {
        let mut builder = BatchBuilder::with_capacity(2, 8);
        builder.push(7, 1_000_000, b"hi\tthere");
        builder.push(8, 1_000_005, &[0xff, 0x00]);
        let mut batch = builder.finish();
        bus::batch::set_base_offset(&mut batch, 40);
        let messages = bus::client::messages_from(&batch, 0).unwrap();
        let render = |output| {
            let mut out = Vec::new();
            for message in &messages {
                write_message(&mut out, output, message).unwrap();
            }
            out
        };
        assert_eq!(render(PollOutput::Text), b"40\thi\tthere\n41\t\xff\x00\n");
        assert_eq!(render(PollOutput::Raw), b"hi\tthere\n\xff\x00\n");
        assert_eq!(
            String::from_utf8(render(PollOutput::Json)).unwrap(),
            "{\"offset\":40,\"timestamp_us\":1000000,\"id\":7,\"payload\":\"hi\\tthere\"}\n\
             {\"offset\":41,\"timestamp_us\":1000005,\"id\":8,\"payload_hex\":\"ff00\"}\n"
        );
    }

    #[test]
    fn request_timeout_parses_like_the_connect_timeout_and_refuses_zero() {
        assert_eq!(
            parse_request_timeout("30s"),
            Ok(bus::limits::REQUEST_TIMEOUT_DEFAULT),
            "--timeout's default is the library's"
        );
        assert_eq!(parse_request_timeout("1"), Ok(Duration::from_secs(1)));
        assert_eq!(
            parse_request_timeout("500ms"),
            Ok(Duration::from_millis(500))
        );
        assert_eq!(
            parse_request_timeout("0ms"),
            Err(
                "\"0ms\" leaves a request no time to be answered: use e.g. 30s or 500ms".to_owned()
            )
        );
        assert_eq!(
            parse_request_timeout("2h"),
            Err(
                "\"2h\" is not a duration: use a whole number of seconds (5, 5s), milliseconds \
                 (300ms) or minutes (2m), no other unit, at most 3600 s (60m) for the request \
                 timeout"
                    .to_owned()
            )
        );
        assert_eq!(
            parse_request_timeout("3601s"),
            Err("\"3601s\" exceeds the largest request timeout, 3600 s (60m)".to_owned())
        );
    }

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
            Err("\"3601\" exceeds the largest connect timeout, 3600 s (60m)".to_owned())
        );
        assert_eq!(
            parse_connect_timeout("1.5s"),
            Err(
                "\"1.5s\" is not a duration: use a whole number of seconds (5, 5s), milliseconds \
                 (300ms) or minutes (2m), no other unit, at most 3600 s (60m) for the connect \
                 timeout"
                    .to_owned()
            )
        );
    }

    fn texts(lines: &[&str]) -> Vec<Vec<u8>> {
        lines.iter().map(|line| line.as_bytes().to_vec()).collect()
    }

    fn planned(partition: u16, message_indices: &[usize]) -> PlannedBatch {
        PlannedBatch {
            partition,
            message_indices: message_indices.to_vec(),
        }
    }

    #[test]
    fn issue11_5_round_robin_sends_batch_after_batch_to_the_next_partition() {
        let routing = Routing::RoundRobin { start: 2 };
        assert_eq!(
            plan_batches(&input_of(lines(7, 1)), &routing, 3, 2, 1 << 20).unwrap(),
            vec![
                planned(2, &[0, 1]),
                planned(0, &[2, 3]),
                planned(1, &[4, 5]),
                planned(2, &[6]),
            ]
        );
    }

    #[test]
    fn issue11_5_a_key_sends_every_batch_to_its_partition() {
        let key = b"user-42".to_vec();
        let partition = partition_for_key(&key, 8) as u16;
        assert_eq!(partition, 5, "the README's example");
        assert_eq!(
            plan_batches(&input_of(lines(5, 1)), &Routing::Key(key), 8, 2, 1 << 20).unwrap(),
            vec![
                planned(partition, &[0, 1]),
                planned(partition, &[2, 3]),
                planned(partition, &[4]),
            ]
        );
    }

    #[test]
    fn issue11_5_keyed_lines_group_by_partition_in_input_order() {
        let keys: Vec<Vec<u8>> = ["a", "b", "a", "c", "b", "a"]
            .iter()
            .map(|key| key.as_bytes().to_vec())
            .collect();
        let partition_of = |key: &str| partition_for_key(key.as_bytes(), 4) as u16;
        let plan = plan_batches(
            &input_of(lines(6, 1)),
            &Routing::KeyPerMessage(keys),
            4,
            2,
            1 << 20,
        )
        .unwrap();
        // Each partition's messages in input order, at most 2 per batch, partitions ascending.
        let mut expected: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for (index, key) in ["a", "b", "a", "c", "b", "a"].iter().enumerate() {
            expected.entry(partition_of(key)).or_default().push(index);
        }
        let mut from_plan: BTreeMap<u16, Vec<usize>> = BTreeMap::new();
        for batch in &plan {
            assert!(batch.message_indices.len() <= 2, "{plan:?}");
            from_plan
                .entry(batch.partition)
                .or_default()
                .extend(&batch.message_indices);
        }
        assert_eq!(from_plan, expected);
        let partitions: Vec<u16> = plan.iter().map(|batch| batch.partition).collect();
        assert!(partitions.is_sorted(), "{partitions:?}");
    }

    #[test]
    fn issue11_5_a_partition_sends_every_batch_there() {
        assert_eq!(
            plan_batches(
                &input_of(lines(3, 1)),
                &Routing::Partition(7),
                8,
                2,
                1 << 20
            )
            .unwrap(),
            vec![planned(7, &[0, 1]), planned(7, &[2])]
        );
    }

    #[test]
    fn issue11_5_key_field_takes_strings_numbers_and_booleans() {
        let input = texts(&[
            r#"{"user":"ann","n":1}"#,
            r#"{"user":42}"#,
            r#"{"user":true,"x":[1]}"#,
            r#"{"user":"\u00e9t\u00e9"}"#,
            r#"{"user":-7}"#,
        ]);
        assert_eq!(
            line_keys(&input, &[1, 2, 3, 4, 5], "user").unwrap(),
            vec![
                b"ann".to_vec(),
                b"42".to_vec(),
                b"true".to_vec(),
                "\u{e9}t\u{e9}".as_bytes().to_vec(),
                b"-7".to_vec(),
            ]
        );
    }

    #[test]
    fn issue11_5_key_field_refuses_a_line_naming_its_number_and_the_field() {
        let refused = |line: &str, line_number: u64| {
            line_keys(
                &texts(&["{\"user\":\"ok\"}", line]),
                &[1, line_number],
                "user",
            )
            .unwrap_err()
            .to_string()
        };
        assert_eq!(
            refused(r#"{"name":"ann"}"#, 3),
            "line 3 has no field \"user\" (--key-field \"user\"); nothing was sent"
        );
        assert_eq!(
            refused("[1,2]", 2),
            "line 2 is not a JSON object but an array (--key-field \"user\"); nothing was sent"
        );
        assert_eq!(
            refused(r#"{"user":null}"#, 9),
            "line 9 holds null in field \"user\": a key is a string, a number or a boolean \
             (--key-field \"user\"); nothing was sent"
        );
        assert!(
            refused("plain text", 4).starts_with("line 4 is not a JSON object: expected value"),
            "{}",
            refused("plain text", 4)
        );
    }
}
