//! `shardline serve`: flags (with `SHARDLINE_*` environment equivalents) to `ServerConfig`, start,
//! print `listening on ADDR` on stdout once every shard listens, run until SIGINT, SIGTERM or
//! SIGHUP (each drains the connections, fsyncs and checkpoints, then exits 0).

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context;
use runtime::{CpuList, IoDriver, ShardCountArg, TopologyConfig};
use shards::{RunningServer, ServerConfig};
use storage::FsyncPolicy;

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Number of shards (one pinned thread each), or `all` for one per allowed CPU.
    #[arg(
        long,
        env = "SHARDLINE_SHARDS",
        default_value = "all",
        value_name = "N|all"
    )]
    pub shards: ShardCountArg,
    /// Exact CPUs to pin shards to, e.g. `0-3,8`; each must be in the process affinity mask.
    #[arg(long, env = "SHARDLINE_CPUS", value_name = "LIST")]
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
    /// (after the write; fsync every MS), `never` (page cache only).
    #[arg(
        long,
        env = "SHARDLINE_FSYNC",
        default_value = "always",
        value_name = "always|interval=MS|never"
    )]
    pub fsync: FsyncPolicy,
    /// Largest request or reply frame, bytes (1024..=67108864, i.e. 1KiB..=64MiB; a KiB, MiB or
    /// GiB suffix is accepted): the 256-byte header plus the body, e.g. a batch of N messages
    /// takes 288 + 32 × N bytes plus its payloads (16 more with an idempotent producer's stamp,
    /// as `shardline send` sends). Clients learn it from a Ping reply; `shardline send` cuts its
    /// batches to fit.
    #[arg(long, env = "SHARDLINE_MAX_MESSAGE_SIZE", default_value_t = bus::limits::MESSAGE_SIZE_MAX_DEFAULT, value_parser = shardline::arg_values::parse_byte_size_u32, value_name = "BYTES")]
    pub max_message_size: u32,
    /// Frames each shard inbox holds before senders get `Busy` (1..=1048576).
    #[arg(long, env = "SHARDLINE_INBOX_CAPACITY", default_value_t = runtime::limits::INBOX_CAPACITY_DEFAULT)]
    pub inbox_capacity: usize,
    /// I/O driver of every shard: `io-uring`, or `poll` where io_uring is blocked (seccomp,
    /// memlock limits, old kernels).
    #[arg(long, env = "SHARDLINE_IO_DRIVER", default_value = "io-uring")]
    pub io_driver: IoDriver,
    /// Segment file size before a partition log rolls to a new segment, bytes
    /// (4096..=1073741824, i.e. 4KiB..=1GiB; a KiB, MiB or GiB suffix is accepted).
    #[arg(long, env = "SHARDLINE_SEGMENT_SIZE", default_value_t = storage::limits::SEGMENT_SIZE_MAX_DEFAULT, value_parser = shardline::arg_values::parse_byte_size, value_name = "BYTES")]
    pub segment_size: u64,
    /// Microseconds an idle shard keeps polling before it sleeps (0..=10000). Lowers cross-shard
    /// and I/O latency (no wakeup needed) at the cost of CPU burnt while idle; 0 sleeps at once.
    #[arg(long, env = "SHARDLINE_IDLE_POLL_US", default_value_t = 0)]
    pub idle_poll_us: u64,
    /// Seconds a client connection may stay without sending a complete frame header before the
    /// server closes it (1..=86400). Also bounds half-sent headers.
    #[arg(long, env = "SHARDLINE_IDLE_TIMEOUT_S", default_value_t = shards::limits::CONNECTION_IDLE_TIMEOUT.as_secs())]
    pub idle_timeout_s: u64,
    /// Client sessions shard 0 keeps (1..=1048576). Registering one more evicts the session
    /// whose latest commit is oldest; that client's next request is answered with an Eviction.
    #[arg(long, env = "SHARDLINE_CLIENTS_TABLE_MAX", default_value_t = shards::limits::CLIENTS_TABLE_MAX_DEFAULT)]
    pub clients_table_max: usize,
    /// Committed metadata ops between checkpoints (1..=1048576). A checkpoint writes a snapshot
    /// of metadata and client sessions, records it in the superblock and releases the journal
    /// below it; boot replays at most this many ops. A clean shutdown always checkpoints.
    #[arg(long, env = "SHARDLINE_CHECKPOINT_INTERVAL", default_value_t = shards::limits::CHECKPOINT_INTERVAL_DEFAULT)]
    pub checkpoint_interval: u64,
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
        config.max_message_size = self.max_message_size;
        config.segment_size_max = self.segment_size;
        config.idle_poll = std::time::Duration::from_micros(self.idle_poll_us);
        config.connection_idle_timeout = std::time::Duration::from_secs(self.idle_timeout_s);
        config.clients_table_max = self.clients_table_max;
        config.checkpoint_interval = self.checkpoint_interval;
        config
    }
}

pub fn run(args: &ServeArgs) -> anyhow::Result<()> {
    shards::resources::tune_allocator();
    shards::resources::ignore_file_size_signal()
        .context("cannot ignore SIGXFSZ (a file-size limit would kill the server mid-write)")?;
    let config = args.to_config();
    tracing::info!(
        data_dir = %config.data_dir.display(), fsync = ?config.fsync, io_driver = ?config.io_driver,
        "starting"
    );
    let server = RunningServer::start(config)?;
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
    drop(stdout);
    server.join()?;
    tracing::info!("shut down cleanly");
    Ok(())
}
