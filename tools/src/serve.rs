//! `shardline serve`: flags (with `SHARDLINE_*` environment equivalents, and `--config FILE`
//! under both: `shardline::config_file`) to `ServerConfig`, validate it (naming the file when a
//! refused value came from it, and where each side of a rule between settings came from:
//! `shardline::value_sources`), start, print `listening on ADDR` on stdout once every shard
//! listens, run until SIGINT, SIGTERM or SIGHUP (each drains the connections, fsyncs and
//! checkpoints, then exits 0).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use runtime::{CpuList, IoDriver, ShardCountArg, TopologyConfig};
use shardline::arg_values::AddressList;
use shardline::config_file::ConfigFile;
use shardline::metrics::{BoundListener, ListenerLimits, MetricsListener, ScrapeSource, Scraper};
use shardline::value_sources::ValueSources;
use shards::{RangedKey, RunningServer, ServerConfig};
use storage::{FsyncPolicy, WriteMode};

/// Printed after `shardline serve --help`.
pub const SERVE_AFTER_HELP: &str = "\
A 3-replica cluster on one host (each replica with its own data directory, client address
(--listen) and replica address; the same --cluster and --addresses, in the same order, for all):
  shardline serve --shards 1 --no-pin --cluster 7 --replica 0 --listen 127.0.0.1:8090 \\
      --addresses 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 --data-dir ./replica0
  shardline serve --shards 1 --no-pin --cluster 7 --replica 1 --listen 127.0.0.1:8091 \\
      --addresses 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 --data-dir ./replica1
  shardline serve --shards 1 --no-pin --cluster 7 --replica 2 --listen 127.0.0.1:8092 \\
      --addresses 127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002 --data-dir ./replica2
Clients list the client addresses and follow the primary:
  shardline metadata --addr 127.0.0.1:8090,127.0.0.1:8091,127.0.0.1:8092

Config file (--config FILE): TOML whose keys are the long flag names above, e.g.
  cluster = 7
  replica = 0
  listen = \"127.0.0.1:8090\"
  addresses = [\"127.0.0.1:7000\", \"127.0.0.1:7001\", \"127.0.0.1:7002\"]
  data-dir = \"./replica0\"
  no-pin = true
A flag beats its SHARDLINE_* variable, which beats the file, which beats the default.";

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// TOML file of serve settings: keys are the long flag names (`data-dir = "./data"`,
    /// `addresses = ["127.0.0.1:7000", ...]`, `no-pin = true`); a flag or its SHARDLINE_*
    /// variable overrides the file. Unknown keys are refused.
    #[arg(long, env = "SHARDLINE_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Number of shards (one pinned thread each), 1..=1024, or `all` for one per allowed CPU.
    #[arg(
        long,
        env = "SHARDLINE_SHARDS",
        default_value = "all",
        value_name = "N|all",
        allow_hyphen_values = true,
        value_parser = shardline::arg_values::parse_shard_count
    )]
    pub shards: ShardCountArg,
    /// Exact CPUs to pin shards to, e.g. `0-3,8`; each must be in the process affinity mask.
    #[arg(long, env = "SHARDLINE_CPUS", value_name = "LIST", value_parser = shardline::arg_values::parse_cpu_list)]
    pub cpus: Option<CpuList>,
    /// Do not pin shards to cores (allows more shards than cores, for shared hosts).
    /// `SHARDLINE_NO_PIN` takes 1/0, true/false, yes/no, on/off; empty counts as unset.
    #[arg(long, env = "SHARDLINE_NO_PIN", value_parser = shardline::arg_values::parse_no_pin, action = clap::ArgAction::SetTrue)]
    pub no_pin: bool,
    /// Client listen address; every shard accepts on it (SO_REUSEPORT). Port 0 picks a free port.
    /// A host name resolves to its first IPv4 address (e.g. `localhost:8090`).
    #[arg(long, env = "SHARDLINE_LISTEN", default_value = "127.0.0.1:8090", value_name = "HOST:PORT", value_parser = shardline::arg_values::parse_host_port)]
    pub listen: SocketAddr,
    /// Directory for metadata and partition logs (created if missing).
    #[arg(long, env = "SHARDLINE_DATA_DIR", default_value = "./shardline-data")]
    pub data_dir: PathBuf,
    /// When appends are acknowledged: `always` (after fsync, batches share fsyncs), `interval=MS`
    /// (after the write; fsync every MS milliseconds, 1..=3600000), `never` (page cache only).
    #[arg(
        long,
        env = "SHARDLINE_FSYNC",
        default_value = "always",
        value_name = "always|interval=MS|never"
    )]
    pub fsync: FsyncPolicy,
    /// How partition logs write: `buffered` (default: through the page cache; the kernel's
    /// writeback threads copy it to disk) or `direct` (O_DIRECT from an aligned staging buffer,
    /// bypassing the page cache; reads still use it, so polls of freshly written data read the
    /// disk). Measured on a quiet 2-vCPU VM (1 shard, 1000-byte messages): direct cut the host
    /// CPU per produced GB (kernel writeback included) by about 25% once 6 GB outran the
    /// dirty-page limits and by 0-8% below them, but acknowledged 0.34-0.8x the messages per
    /// second (p99 1.8x under --fsync always), and polls of what it wrote cost 3x the CPU. Choose
    /// it for write-mostly logs whose readers lag far behind; measure your host first
    /// (`shardline bench --write-mode direct`). Durability is the same: --fsync decides. A
    /// filesystem that refuses O_DIRECT gets buffered writes for that partition, with a warning
    /// in the server log.
    #[arg(
        long,
        env = "SHARDLINE_WRITE_MODE",
        default_value = "buffered",
        value_name = "buffered|direct"
    )]
    pub write_mode: WriteMode,
    /// Largest request or reply frame, bytes (1024..=67108864, i.e. 1KiB..=64MiB; a KiB, MiB or
    /// GiB suffix is accepted): the 256-byte header plus the body, e.g. a batch of N messages
    /// takes 288 + 32 × N bytes plus its payloads (16 more with an idempotent producer's stamp,
    /// as `shardline send` sends). Clients learn it from a Ping reply; `shardline send` cuts its
    /// batches to fit.
    #[arg(long, env = "SHARDLINE_MAX_MESSAGE_SIZE", default_value_t = bus::limits::MESSAGE_SIZE_MAX_DEFAULT, value_parser = ranged_size::<u32>(RangedKey::MaxMessageSize), value_name = "BYTES", allow_hyphen_values = true)]
    pub max_message_size: u32,
    /// Frames each shard inbox holds before senders get `Busy` (1..=1048576 frames).
    #[arg(long, env = "SHARDLINE_INBOX_CAPACITY", default_value_t = runtime::limits::INBOX_CAPACITY_DEFAULT, value_name = "FRAMES", value_parser = ranged::<usize>(RangedKey::InboxCapacity), allow_hyphen_values = true)]
    pub inbox_capacity: usize,
    /// I/O driver of every shard: `io-uring`, or `poll` where io_uring is blocked (seccomp,
    /// memlock limits, old kernels).
    #[arg(long, env = "SHARDLINE_IO_DRIVER", default_value = "io-uring")]
    pub io_driver: IoDriver,
    /// Segment file size before a partition log rolls to a new segment, bytes
    /// (4096..=1073741824, i.e. 4KiB..=1GiB; a KiB, MiB or GiB suffix is accepted).
    #[arg(long, env = "SHARDLINE_SEGMENT_SIZE", default_value_t = storage::limits::SEGMENT_SIZE_MAX_DEFAULT, value_parser = ranged_size::<u64>(RangedKey::SegmentSize), value_name = "BYTES", allow_hyphen_values = true)]
    pub segment_size: u64,
    /// Microseconds an idle shard keeps polling before it sleeps (0..=10000). Lowers cross-shard
    /// and I/O latency (no wakeup needed) at the cost of CPU burnt while idle; 0 sleeps at once.
    #[arg(long, env = "SHARDLINE_IDLE_POLL_US", default_value_t = 0, value_name = "US", value_parser = ranged::<u64>(RangedKey::IdlePollUs), allow_hyphen_values = true)]
    pub idle_poll_us: u64,
    /// Seconds a client connection may stay without sending a complete frame header before the
    /// server closes it (1..=86400). Also bounds half-sent headers.
    #[arg(long, env = "SHARDLINE_IDLE_TIMEOUT_S", default_value_t = shards::limits::CONNECTION_IDLE_TIMEOUT.as_secs(), value_name = "SECONDS", value_parser = ranged::<u64>(RangedKey::IdleTimeoutS), allow_hyphen_values = true)]
    pub idle_timeout_s: u64,
    /// Client sessions shard 0 keeps (1..=1048576). Registering one more evicts the session
    /// whose latest commit is oldest; that client's next request is answered with an Eviction.
    #[arg(long, env = "SHARDLINE_CLIENTS_TABLE_MAX", default_value_t = shards::limits::CLIENTS_TABLE_MAX_DEFAULT, value_name = "SESSIONS", value_parser = ranged::<usize>(RangedKey::ClientsTableMax), allow_hyphen_values = true)]
    pub clients_table_max: usize,
    /// Polls with a wait (`poll --follow`, `Client::poll_wait`) each shard holds parked at once
    /// while their partition has nothing new (1..=1048576). One parked poll costs a few hundred
    /// bytes and no CPU while it waits; one more is refused with ResourceExhausted.
    #[arg(long, env = "SHARDLINE_PARKED_POLLS_MAX", default_value_t = shards::limits::PARKED_POLLS_MAX_DEFAULT, value_name = "POLLS", value_parser = ranged::<usize>(RangedKey::ParkedPollsMax), allow_hyphen_values = true)]
    pub parked_polls_max: usize,
    /// Committed metadata ops between checkpoints (1..=1048576). A checkpoint writes a snapshot
    /// of metadata and client sessions, records it in the superblock and releases the journal
    /// below it; boot replays at most this many ops. A clean shutdown always checkpoints.
    #[arg(long, env = "SHARDLINE_CHECKPOINT_INTERVAL", default_value_t = shards::limits::CHECKPOINT_INTERVAL_DEFAULT, value_name = "OPS", value_parser = ranged::<u64>(RangedKey::CheckpointInterval), allow_hyphen_values = true)]
    pub checkpoint_interval: u64,
    /// Metadata journal segment size before it rolls to a new segment, bytes (65536..=67108864,
    /// i.e. 64KiB..=64MiB: opening the journal reads a whole segment into memory; a KiB or MiB
    /// suffix is accepted). A checkpoint releases only whole segments, so smaller segments let
    /// the journal shrink sooner (a replica that fell further behind then catches up by state
    /// transfer).
    #[arg(long, env = "SHARDLINE_JOURNAL_SEGMENT_SIZE", default_value_t = storage::limits::JOURNAL_SEGMENT_SIZE_MAX, value_parser = ranged_size::<u64>(RangedKey::JournalSegmentSize), value_name = "BYTES", allow_hyphen_values = true)]
    pub journal_segment_size: u64,
    /// Cluster id (decimal, or 0x-prefixed hex; 0..=2^128-1), the same on every replica of the
    /// cluster. A replica frame from another cluster is dropped, and a data directory formatted
    /// for another cluster refuses to boot.
    #[arg(long, env = "SHARDLINE_CLUSTER", default_value = "0", value_parser = shardline::arg_values::parse_cluster_id, value_name = "ID", help_heading = "Cluster", allow_hyphen_values = true)]
    pub cluster: u128,
    /// This replica's index into --addresses (0-based, 0..=4 and below the replica count; 0
    /// without --addresses).
    #[arg(
        long,
        env = "SHARDLINE_REPLICA",
        default_value_t = 0,
        value_name = "I",
        help_heading = "Cluster",
        allow_hyphen_values = true,
        value_parser = shardline::arg_values::whole_number(
            "a replica index",
            0,
            shards::config::REPLICA_INDEX_MAX
        )
    )]
    pub replica: u8,
    /// Replica-to-replica addresses of every replica, in replica-index order, comma-separated:
    /// 1, 3 or 5 of them (the replica count). Each replica listens for its peers on its own
    /// entry; --listen stays the client address. Without this flag: a single replica.
    #[arg(long, env = "SHARDLINE_ADDRESSES", value_parser = shardline::arg_values::parse_address_list, value_name = "A0,A1,A2", help_heading = "Cluster")]
    pub addresses: Option<AddressList>,
    /// Length of one consensus tick, milliseconds (1..=1000); the two timeouts below count ticks.
    #[arg(long, env = "SHARDLINE_TICK_MS", default_value_t = shards::limits::TICK_DEFAULT.as_millis() as u64, value_name = "MS", help_heading = "Cluster", value_parser = ranged::<u64>(RangedKey::TickMs), allow_hyphen_values = true)]
    pub tick_ms: u64,
    /// Ticks between two heartbeats (Commit messages) of an idle primary (1..=1000000 ticks).
    #[arg(long, env = "SHARDLINE_HEARTBEAT_TICKS", default_value_t = shards::limits::HEARTBEAT_TICKS_DEFAULT, value_name = "TICKS", help_heading = "Cluster", value_parser = ranged::<u64>(RangedKey::HeartbeatTicks), allow_hyphen_values = true)]
    pub heartbeat_ticks: u64,
    /// Ticks a backup waits without hearing from its primary before it starts a view change
    /// (randomized up to twice this); 2..=1000000 ticks, and greater than --heartbeat-ticks.
    #[arg(long, env = "SHARDLINE_VIEW_CHANGE_TIMEOUT_TICKS", default_value_t = shards::limits::VIEW_CHANGE_TIMEOUT_TICKS_DEFAULT, value_name = "TICKS", help_heading = "Cluster", value_parser = ranged::<u64>(RangedKey::ViewChangeTimeoutTicks), allow_hyphen_values = true)]
    pub view_change_timeout_ticks: u64,
    /// Serve Prometheus metrics (OpenMetrics text) at http://HOST:PORT/metrics, from a thread of
    /// its own; off without this flag. Port 0 picks a free port (printed on stdout as
    /// `metrics on http://ADDR/metrics` after the `listening on` line). See the README's Metrics
    /// section for every metric.
    #[arg(long, env = "SHARDLINE_METRICS_LISTEN", value_name = "HOST:PORT", value_parser = shardline::arg_values::parse_host_port, help_heading = "Metrics")]
    pub metrics_listen: Option<SocketAddr>,
    /// A consumer-group member that sends no heartbeat, join or offset store for this long is
    /// removed and its partitions go to the other members (issue 11 section 2): seconds (`10`,
    /// `10s`), milliseconds (`500ms`) or minutes (`2m`), between 100ms and 60m.
    #[arg(long, env = "SHARDLINE_GROUP_SESSION_TIMEOUT", default_value = "10s", value_name = "DURATION", value_parser = parse_group_session_timeout, help_heading = "Consumer groups", allow_hyphen_values = true)]
    pub group_session_timeout: std::time::Duration,
    /// How often each shard deletes the sealed segments of its partitions that are past their
    /// topic's retention (--retention-bytes / --retention-ms of `topic create` and `topic
    /// alter`): seconds (10, 10s), milliseconds (500ms) or minutes (5m), 10ms..=86400s (1440m). A pass
    /// also runs as soon as a segment roll is acknowledged.
    #[arg(long, env = "SHARDLINE_RETENTION_INTERVAL", default_value = "10s", value_parser = shardline::arg_values::parse_retention_interval, value_name = "DURATION", allow_hyphen_values = true)]
    pub retention_interval: std::time::Duration,
}

/// `--group-session-timeout`: a duration as `parse_duration_between` takes it, from
/// `GROUP_SESSION_TIMEOUT_MIN` to `GROUP_SESSION_TIMEOUT_MAX` (issue 11 section 2), the range
/// `ServerConfig::validate` checks too.
fn parse_group_session_timeout(text: &str) -> Result<std::time::Duration, String> {
    shardline::arg_values::parse_duration_between(
        text,
        "group session timeout",
        shards::limits::GROUP_SESSION_TIMEOUT_MIN,
        shards::limits::GROUP_SESSION_TIMEOUT_MAX,
    )
}

/// The value parser of a whole-number `serve` flag whose rule is `key`'s range
/// ([`RangedKey::range`], worded by [`RangedKey::rule`] as `ServerConfig::validate` words it), as
/// the field's type `T`. A value out of range (`-1`, `0`, too large) is a usage error naming the
/// flag (or the config-file key), the value and the rule (exit 2).
fn ranged<T>(key: RangedKey) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    into_field(
        key,
        shardline::arg_values::whole_number_in(key.range(), key.rule()),
    )
}

/// [`ranged`] for a byte-size flag (`4096`, `64KiB`: `arg_values::parse_byte_size`).
fn ranged_size<T>(
    key: RangedKey,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    into_field(
        key,
        shardline::arg_values::byte_size_in(key.range(), key.rule()),
    )
}

/// `parse`, its value converted to the field's type `T`; `key`'s range fits `T` (a value that
/// would not is refused with the rule).
fn into_field<T>(
    key: RangedKey,
    parse: impl Fn(&str) -> Result<u64, String> + Clone + Send + Sync + 'static,
) -> impl Fn(&str) -> Result<T, String> + Clone + Send + Sync + 'static
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
{
    move |text: &str| parse(text).and_then(|value| T::try_from(value).map_err(|_| key.rule()))
}

impl ServeArgs {
    pub fn to_config(&self) -> ServerConfig {
        let mut config = ServerConfig::new(self.data_dir.clone());
        config.topology = TopologyConfig {
            shards: self.shards,
            cpus: self.cpus.clone(),
            pin: !self.no_pin,
        };
        config.io_driver = self.io_driver;
        config.inbox_capacity = self.inbox_capacity;
        config.listen = self.listen;
        config.fsync = self.fsync;
        config.write_mode = self.write_mode;
        config.max_message_size = self.max_message_size;
        config.segment_size_max = self.segment_size;
        config.idle_poll = std::time::Duration::from_micros(self.idle_poll_us);
        config.connection_idle_timeout = std::time::Duration::from_secs(self.idle_timeout_s);
        config.clients_table_max = self.clients_table_max;
        config.parked_polls_max = self.parked_polls_max;
        config.checkpoint_interval = self.checkpoint_interval;
        config.journal_segment_size_max = self.journal_segment_size;
        config.cluster = self.cluster;
        config.replica = self.replica;
        config.addresses = self
            .addresses
            .as_ref()
            .map_or_else(Vec::new, |list| list.0.clone());
        config.tick = std::time::Duration::from_millis(self.tick_ms);
        config.heartbeat_ticks = self.heartbeat_ticks;
        config.view_change_timeout_ticks = self.view_change_timeout_ticks;
        config.group_session_timeout = self.group_session_timeout;
        config.retention_interval = self.retention_interval;
        config
    }
}

/// `config.validate()`, naming the config file in the error when the refused value came from
/// it, and, for a rule between settings (one that names another flag, such as
/// `--view-change-timeout-ticks` above `--heartbeat-ticks`), where each side came from:
/// `... (--view-change-timeout-ticks from the command line; --heartbeat-ticks from config file
/// r0.toml, key heartbeat-ticks)`.
///
/// # Errors
/// The first rule `config` breaks: `ConfigError::Invalid` (flag, value, rule), or
/// `ConfigFileError::BadValue` (key, value, file, rule) when the file set that key; either inside
/// a [`RuleBetweenSettings`] when the rule names another flag.
pub fn validate(config: &ServerConfig, sources: &ValueSources) -> anyhow::Result<()> {
    let Err(shards::ConfigError::Invalid {
        flag,
        key,
        value,
        rule,
    }) = config.validate()
    else {
        return Ok(());
    };
    let sides = sources.sides(flag, &rule);
    let refusal: anyhow::Error = match &sources.file {
        Some(file) if file.sets(flag) => file.invalid(flag, &value, &rule).into(),
        _ => shards::ConfigError::Invalid {
            flag,
            key,
            value,
            rule,
        }
        .into(),
    };
    Err(match sides {
        Some(sides) => RuleBetweenSettings {
            refusal: refusal.to_string(),
            sides,
        }
        .into(),
        None => refusal,
    })
}

/// `error` of `RunningServer::start`; a host rule of the shard settings (`--shards` above the
/// allowed cores without `--no-pin`, `--cpus` outside the affinity mask or with `--no-pin`)
/// as a [`RuleBetweenSettings`] naming where each setting it names came from, so that a value
/// from the config file or the environment is looked for there.
///
/// Too many shards for a `--cpus` list names the sources of `--shards` and `--cpus` only: its
/// refusal mentions `--no-pin` just to say it is refused with `--cpus`, so `--no-pin`'s source
/// would send the operator to a setting that cannot help.
fn start_error(error: shards::ServerError, sources: &ValueSources) -> anyhow::Error {
    let (flag, settings_named) = match &error {
        shards::ServerError::Topology(runtime::TopologyError::TooManyShards {
            from_cpus: true,
            ..
        }) => ("--shards", Some("--cpus")),
        shards::ServerError::Topology(runtime::TopologyError::TooManyShards { .. }) => {
            ("--shards", None)
        }
        shards::ServerError::Topology(
            runtime::TopologyError::CpuNotAllowed { .. }
            | runtime::TopologyError::CpusWithoutPin { .. },
        ) => ("--cpus", None),
        _ => return error.into(),
    };
    let refusal = error.to_string();
    let sides = sources.sides_of(flag, settings_named.unwrap_or(&refusal));
    RuleBetweenSettings { refusal, sides }.into()
}

/// A rule between settings (or between settings and the host) refused their values: the
/// refusal (flag or file key, value, rule), then where each setting the rule names came from.
#[derive(Debug, thiserror::Error)]
#[error("{refusal} ({sides})")]
pub struct RuleBetweenSettings {
    pub refusal: String,
    pub sides: String,
}

pub fn run(args: &ServeArgs, sources: &ValueSources) -> anyhow::Result<()> {
    shards::resources::tune_allocator();
    shards::resources::ignore_file_size_signal()
        .context("cannot ignore SIGXFSZ (a file-size limit would kill the server mid-write)")?;
    let config = args.to_config();
    validate(&config, sources)?;
    let file = sources.file.as_ref();
    let addresses = args
        .addresses
        .as_ref()
        .map_or_else(|| "none (single replica)".to_owned(), ToString::to_string);
    tracing::info!(
        data_dir = %config.data_dir.display(), fsync = ?config.fsync,
        write_mode = %config.write_mode, io_driver = ?config.io_driver,
        listen = %config.listen, cluster = %format_args!("{:#x}", config.cluster),
        replica = config.replica, replica_count = config.replica_count(), %addresses,
        journal_segment_size = config.journal_segment_size_max,
        tick_ms = config.tick.as_millis() as u64, heartbeat_ticks = config.heartbeat_ticks,
        view_change_timeout_ticks = config.view_change_timeout_ticks,
        retention_interval_ms = config.retention_interval.as_millis() as u64,
        metrics_listen = %args.metrics_listen.map_or_else(|| "off".to_owned(), |addr| addr.to_string()),
        config_file = %file.map_or_else(|| "none".to_owned(), |file| file.path.display().to_string()),
        "starting"
    );
    // Bound before the server starts: a taken metrics port refuses startup with nothing done.
    let metrics_socket = args
        .metrics_listen
        .map(|addr| BoundListener::bind(addr, &metrics_setting(file)))
        .transpose()?;
    let server = RunningServer::start(config).map_err(|error| start_error(error, sources))?;
    server
        .stop_on_signals()
        .context("cannot install SIGINT/SIGTERM/SIGHUP handlers")?;
    let cores: Vec<String> = server
        .topology
        .shard_cores
        .iter()
        .map(|core| core.map_or_else(|| "unpinned".to_owned(), |c| c.to_string()))
        .collect();
    tracing::info!(shards = server.shard_count, cores = %cores.join(","), "ready");
    // A closed stdout (`serve | head -1`) must not take the server down: the line is a
    // convenience for scripts, the server keeps serving.
    let mut stdout = std::io::stdout().lock();
    if let Err(e) =
        writeln!(stdout, "listening on {}", server.local_addr).and_then(|()| stdout.flush())
    {
        tracing::warn!(error = %e, "cannot print the listening line on stdout; serving anyway");
    }
    let metrics = match metrics_socket {
        Some(socket) => Some(serve_metrics(socket, &server, args.io_driver, &mut stdout)?),
        None => None,
    };
    drop(stdout);
    let joined = server.join();
    if let Some(metrics) = metrics {
        metrics.stop();
    }
    joined?;
    tracing::info!("shut down cleanly");
    Ok(())
}

/// How the operator set the metrics address, for a bind error: the file key when the value came
/// from the config file, else the flag (or its environment variable).
fn metrics_setting(file: Option<&ConfigFile>) -> String {
    match file {
        Some(file) if file.sets("metrics-listen") => {
            format!("metrics-listen in config file {}", file.path.display())
        }
        _ => "--metrics-listen".to_owned(),
    }
}

/// Starts the metrics listener on `socket` over `server`'s shards, prints
/// `metrics on http://ADDR/metrics` on `stdout` and logs it.
fn serve_metrics(
    socket: BoundListener,
    server: &RunningServer,
    io_driver: IoDriver,
    stdout: &mut impl Write,
) -> anyhow::Result<MetricsListener> {
    let source = Arc::new(ScrapeSource::new(
        Arc::clone(&server.metrics),
        shards::metrics::GATHER_TIMEOUT_DEFAULT,
        io_driver.to_string(),
        server.budget.open_file_limit,
    ));
    let scraper: Scraper = Arc::new(move || source.scrape());
    let listener = socket.serve(scraper, ListenerLimits::default())?;
    let url = format!("http://{}/metrics", listener.local_addr());
    tracing::info!(%url, "serving metrics");
    if let Err(e) = writeln!(stdout, "metrics on {url}").and_then(|()| stdout.flush()) {
        tracing::warn!(error = %e, "cannot print the metrics line on stdout; serving anyway");
    }
    Ok(listener)
}
