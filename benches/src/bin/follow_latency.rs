//! End-to-end latency of following a partition (issue 11 section 3, "Targets"): from a
//! producer's send to a follower's delivery, on loopback, for each `--fsync` policy. One
//! `shardline serve` child per policy; a producer thread sends one message every
//! `--interval-us`, stamped with its clock just before the send; a follower thread polls with a
//! wait (`Client::poll_wait`, the loop `shardline poll --follow` runs), so each message wakes a
//! parked poll, and records now - stamp per message in an HDR histogram (µs). Producer and
//! follower share the host clock, so the figure needs no clock sync.
//!
//! ```sh
//! cargo build --release -p shardline -p benches
//! target/release/follow_latency --bin target/release/shardline --messages 5000 --interval-us 1000
//! ```

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{Context as _, bail};
use benches::serve_child::{ServeChild, create_topic};
use bus::{BatchBuilder, Client, Namespace};
use clap::Parser;
use hdrhistogram::Histogram;

#[derive(Debug, Parser)]
#[command(about = "Append-to-delivery latency of a follower, per fsync policy")]
struct Args {
    /// The `shardline` binary.
    #[arg(long)]
    bin: PathBuf,
    /// Messages per policy.
    #[arg(long, default_value_t = 5_000)]
    messages: u32,
    /// Pause between two sends, microseconds (the follower is parked again before the next).
    #[arg(long, default_value_t = 1_000)]
    interval_us: u64,
    /// Payload bytes per message.
    #[arg(long, default_value_t = 100)]
    message_size: usize,
    /// `serve --fsync` policies to measure, comma-separated.
    #[arg(long, default_value = "always,never", value_delimiter = ',')]
    fsync: Vec<String>,
    /// `serve --shards`: with 2 the partition's owner is often not the shard a connection
    /// landed on, so the mesh hop is in the figure as in a real deployment.
    #[arg(long, default_value_t = 2)]
    shards: u16,
    /// Where the data directories go (default: the system temp dir).
    #[arg(long)]
    data_root: Option<PathBuf>,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let root = match &args.data_root {
        Some(root) => tempfile::tempdir_in(root)?,
        None => tempfile::tempdir()?,
    };
    for fsync in &args.fsync {
        let histogram = measure(&args, &root.path().join(fsync), fsync)?;
        println!(
            "fsync {fsync}: {} messages, append->delivery p50 {} us, p90 {} us, p99 {} us, \
             p99.9 {} us, max {} us",
            histogram.len(),
            histogram.value_at_quantile(0.50),
            histogram.value_at_quantile(0.90),
            histogram.value_at_quantile(0.99),
            histogram.value_at_quantile(0.999),
            histogram.max()
        );
    }
    Ok(())
}

/// One policy: a fresh server, the follower, the producer; the follower's histogram.
fn measure(args: &Args, data_dir: &std::path::Path, fsync: &str) -> anyhow::Result<Histogram<u64>> {
    let shards = args.shards.to_string();
    let serve = ServeChild::start(
        &args.bin,
        data_dir,
        &["--shards", &shards, "--fsync", fsync],
    )?;
    let addr = serve.addr;
    compio::runtime::Runtime::new()?.block_on(create_topic(addr, 1))?;
    let messages = args.messages;
    let follower = std::thread::spawn(move || follow(addr, messages));
    // The first send waits until the follower's poll is parked, so it measures a wake too.
    while serve.parked_polls()? == 0 {
        if follower.is_finished() {
            bail!("the follower ended before parking");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    produce(
        addr,
        messages,
        args.message_size,
        Duration::from_micros(args.interval_us),
    )?;
    let histogram = follower
        .join()
        .map_err(|_| anyhow::anyhow!("the follower panicked"))??;
    serve.stop()?;
    Ok(histogram)
}

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| elapsed.as_micros() as u64)
}

/// Sends `messages` one-message batches, each stamped with the clock just before its send.
fn produce(
    addr: SocketAddr,
    messages: u32,
    message_size: usize,
    interval: Duration,
) -> anyhow::Result<()> {
    compio::runtime::Runtime::new()?.block_on(async move {
        let mut client = Client::connect(addr).await?;
        let payload = vec![b'x'; message_size];
        let namespace = Namespace::new(1, 1, 0);
        for id in 0..u64::from(messages) {
            let mut builder = BatchBuilder::with_capacity(1, message_size);
            builder.push(id, now_us(), &payload);
            client
                .send_messages(namespace, builder.finish())
                .await
                .context("send")?;
            compio::time::sleep(interval).await;
        }
        Ok(())
    })
}

/// Follows partition 0 from offset 0 until `messages` arrived; each one's latency in µs.
fn follow(addr: SocketAddr, messages: u32) -> anyhow::Result<Histogram<u64>> {
    compio::runtime::Runtime::new()?.block_on(async move {
        let mut client = Client::connect(addr).await?;
        let namespace = Namespace::new(1, 1, 0);
        let mut histogram = Histogram::<u64>::new(3)?;
        let mut offset = 0;
        while offset < u64::from(messages) {
            let result = client
                .poll_wait(namespace, offset, 1000, bus::limits::POLL_WAIT_MAX)
                .await
                .context("poll")?;
            let delivered = now_us();
            for message in result.messages()? {
                histogram.record(delivered.saturating_sub(message.timestamp_us))?;
                offset = message.offset + 1;
            }
        }
        Ok(histogram)
    })
}
