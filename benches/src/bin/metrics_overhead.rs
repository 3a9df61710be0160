//! What serving metrics costs (issue 10 section 1, target: within 3%): alternating rounds of the
//! same produce workload against a fresh `shardline serve` child, once without
//! `--metrics-listen` and once with it and a scraper that GETs `/metrics` every `--scrape-ms`.
//! Each round runs `shardline bench --addr A --server-pid PID --json F`, whose produce figure
//! `msgs_per_server_cpu_second` (messages acknowledged per CPU-second of the whole server
//! process, metrics threads included) is compared: the median of each mode and their ratio.
//!
//! The order flips every round (off/on, then on/off, ...) so that a drift of the host over the
//! run (page cache, other tenants) does not land on one mode only.
//!
//! ```sh
//! cargo build --release -p shardline -p benches
//! target/release/metrics_overhead --rounds 3 --messages 2000000
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use benches::median;
use benches::serve_child::{self, ServeChild};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Produce throughput per server CPU-second with and without /metrics scrapes")]
struct Args {
    /// The `shardline` binary (default: beside this one).
    #[arg(long)]
    bin: Option<PathBuf>,
    /// Rounds; each runs the workload once per mode.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// `serve --shards`.
    #[arg(long, default_value_t = 2)]
    shards: u16,
    /// Messages produced per run (`bench --messages`); pick ~1-2 s of produce.
    #[arg(long, default_value_t = 2_000_000)]
    messages: u64,
    /// `bench --message-size`, bytes.
    #[arg(long, default_value_t = 100)]
    message_size: u32,
    /// `bench --batch`.
    #[arg(long, default_value_t = 1000)]
    batch: u32,
    /// `bench --producers` (and `--partitions`, one per producer).
    #[arg(long, default_value_t = 2)]
    producers: u32,
    /// `serve --fsync` (default `never`: measure the server's CPU, not the disk).
    #[arg(long, default_value = "never")]
    fsync: String,
    /// Milliseconds between two scrapes in the metrics-on runs.
    #[arg(long, default_value_t = 1000)]
    scrape_ms: u64,
    /// Back-to-back scrapes of an idle server for the per-scrape cost (0 skips it).
    #[arg(long, default_value_t = 1000)]
    cost_scrapes: u32,
    /// Where the runs' data directories go (default: the system temp dir).
    #[arg(long)]
    data_root: Option<PathBuf>,
}

/// Starts a `shardline serve` child with the run's shard count and fsync policy, with the
/// metrics listener only when `metrics`.
fn start_serve(
    args: &Args,
    bin: &Path,
    data_dir: &Path,
    metrics: bool,
) -> anyhow::Result<ServeChild> {
    let shards = args.shards.to_string();
    let extra = ["--shards", shards.as_str(), "--fsync", args.fsync.as_str()];
    ServeChild::start_with(bin, data_dir, &extra, metrics)
}

/// GETs `/metrics` every `interval` until stopped; counts the scrapes that answered 200.
struct Scraper {
    stop: Arc<AtomicBool>,
    ok: Arc<AtomicU64>,
    thread: JoinHandle<anyhow::Result<()>>,
}

fn start_scraper(addr: SocketAddr, interval: Duration) -> Scraper {
    let stop = Arc::new(AtomicBool::new(false));
    let ok = Arc::new(AtomicU64::new(0));
    let (thread_stop, thread_ok) = (Arc::clone(&stop), Arc::clone(&ok));
    let thread = std::thread::spawn(move || {
        let mut next = Instant::now();
        while !thread_stop.load(Ordering::Acquire) {
            if Instant::now() >= next {
                scrape_once(addr)?;
                thread_ok.fetch_add(1, Ordering::Relaxed);
                next += interval;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(())
    });
    Scraper { stop, ok, thread }
}

fn scrape_once(addr: SocketAddr) -> anyhow::Result<()> {
    serve_child::scrape(addr).map(drop)
}

/// One run's produce figures.
#[derive(Debug, Clone, Copy)]
struct Figures {
    msgs_per_server_cpu_second: f64,
    msgs_per_sec: f64,
    server_cpu_seconds: f64,
    scrapes: u64,
}

fn run_once(
    args: &Args,
    bin: &Path,
    root: &Path,
    label: &str,
    metrics: bool,
) -> anyhow::Result<Figures> {
    let data_dir = root.join(label);
    let serve = start_serve(args, bin, &data_dir, metrics)?;
    let scraper = serve
        .metrics
        .map(|addr| start_scraper(addr, Duration::from_millis(args.scrape_ms)));
    let json = root.join(format!("{label}.json"));
    let status = Command::new(bin)
        .args(["bench", "--addr", &serve.addr.to_string()])
        .args(["--server-pid", &serve.child.id().to_string()])
        .args(["--messages", &args.messages.to_string()])
        .args(["--message-size", &args.message_size.to_string()])
        .args(["--batch", &args.batch.to_string()])
        .args(["--producers", &args.producers.to_string()])
        .args(["--partitions", &args.producers.to_string()])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .status()
        .context("run shardline bench")?;
    let scrapes = match scraper {
        Some(scraper) => {
            scraper.stop.store(true, Ordering::Release);
            scraper
                .thread
                .join()
                .map_err(|_| anyhow::anyhow!("the scraper panicked"))?
                .context("a scrape failed")?;
            scraper.ok.load(Ordering::Relaxed)
        }
        None => 0,
    };
    drop(serve);
    if !status.success() {
        bail!("shardline bench failed: {status}");
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&json)?)?;
    let run = &report["runs"][0];
    let number = |key: &str| {
        run[key]
            .as_f64()
            .with_context(|| format!("no {key} in {}", json.display()))
    };
    let figures = Figures {
        msgs_per_server_cpu_second: number("msgs_per_server_cpu_second")?,
        msgs_per_sec: number("msgs_per_sec")?,
        server_cpu_seconds: number("server_cpu_seconds")?,
        scrapes,
    };
    std::fs::remove_dir_all(&data_dir).ok();
    Ok(figures)
}

/// Server CPU seconds one scrape costs: `count` scrapes back to back against an idle server
/// with metrics on, the server's process CPU before and after.
fn scrape_cost(args: &Args, bin: &Path, root: &Path, count: u32) -> anyhow::Result<f64> {
    let serve = start_serve(args, bin, &root.join("cost"), true)?;
    let addr = serve.metrics.context("metrics address")?;
    scrape_once(addr)?;
    let before = serve.cpu_seconds()?;
    for _ in 0..count {
        scrape_once(addr)?;
    }
    let after = serve.cpu_seconds()?;
    Ok((after - before) / f64::from(count))
}

fn default_bin() -> anyhow::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let bin = exe.with_file_name("shardline");
    if !bin.exists() {
        bail!(
            "{} not found: build it (cargo build --release -p shardline) or pass --bin",
            bin.display()
        );
    }
    Ok(bin)
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let bin = match &args.bin {
        Some(bin) => bin.clone(),
        None => default_bin()?,
    };
    let root = match &args.data_root {
        Some(dir) => tempfile::Builder::new()
            .prefix("metrics-overhead-")
            .tempdir_in(dir)?,
        None => tempfile::Builder::new()
            .prefix("metrics-overhead-")
            .tempdir()?,
    };
    println!(
        "shards={} messages={} message-size={} batch={} producers={} fsync={} scrape every {} ms",
        args.shards,
        args.messages,
        args.message_size,
        args.batch,
        args.producers,
        args.fsync,
        args.scrape_ms
    );
    println!("round  metrics  msgs/srv-cpu-s      msgs/s  server-cpu-s  scrapes");
    let (mut off, mut on) = (Vec::new(), Vec::new());
    let mut off_runs: Vec<Figures> = Vec::new();
    for round in 0..args.rounds {
        let order = if round % 2 == 0 {
            [false, true]
        } else {
            [true, false]
        };
        for metrics in order {
            let mode = if metrics { "on" } else { "off" };
            let figures = run_once(
                &args,
                &bin,
                root.path(),
                &format!("r{round}-{mode}"),
                metrics,
            )?;
            println!(
                "{round:>5}  {mode:>7}  {:>14.0}  {:>10.0}  {:>12.2}  {:>7}",
                figures.msgs_per_server_cpu_second,
                figures.msgs_per_sec,
                figures.server_cpu_seconds,
                figures.scrapes
            );
            if metrics {
                on.push(figures.msgs_per_server_cpu_second);
            } else {
                off.push(figures.msgs_per_server_cpu_second);
                off_runs.push(figures);
            }
        }
    }
    let (off_median, on_median) = (median(&mut off), median(&mut on));
    println!(
        "median msgs per server-CPU-second: metrics off {off_median:.0}, on {on_median:.0}; \
         on/off = {:.3} (target >= 0.97)",
        on_median / off_median
    );
    if args.cost_scrapes > 0 {
        // The rounds above compare whole runs, which a shared host makes noisy; the cost of one
        // scrape measured alone bounds the overhead independently of that noise.
        let cost = scrape_cost(&args, &bin, root.path(), args.cost_scrapes)?;
        // Cores the server kept busy during the metrics-off produce phases (median).
        let mut busy: Vec<f64> = off_runs
            .iter()
            .map(|figures| figures.server_cpu_seconds * figures.msgs_per_sec / args.messages as f64)
            .collect();
        let busy_cores = median(&mut busy);
        let scrape_cpu_per_second = cost * 1000.0 / args.scrape_ms as f64;
        println!(
            "one scrape costs {:.3} ms of server CPU ({} back-to-back scrapes of an idle \
             {}-shard server); one scrape per {} ms adds {:.3} ms of CPU per second, {:.3}% of \
             the {:.2} cores the produce runs kept busy (metrics off, median)",
            cost * 1000.0,
            args.cost_scrapes,
            args.shards,
            args.scrape_ms,
            scrape_cpu_per_second * 1000.0,
            100.0 * scrape_cpu_per_second / busy_cores,
            busy_cores
        );
    }
    Ok(())
}
