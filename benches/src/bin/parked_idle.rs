//! What parked polls cost an idle server (issue 11 section 3, "10,000 parked polls on one shard
//! cost no measurable CPU while idle"): one `shardline serve --shards 1` child; its CPU time
//! (`/proc/PID/stat`, every thread) over `--idle-s` seconds with no poll parked, then again with
//! `--polls` polls parked on its one partition (each on its own connection, as `poll --follow`
//! holds one), then how it stops with them outstanding (SIGTERM: exit code, wall time).
//!
//! Each parked poll's wait is the 60 s maximum, so `--idle-s` plus the time to park them must
//! stay under a minute. Both the bench and the server need an open-file limit above `--polls`
//! plus the server's reserve: the server gives half of what is left after 256 descriptors to
//! client connections, so 10,000 parked polls need `ulimit -n` of at least 20,300.
//!
//! ```sh
//! cargo build --release -p shardline -p benches
//! ulimit -n 32768   # if the hard limit allows
//! target/release/parked_idle --bin target/release/shardline --polls 10000 --idle-s 10
//! ```

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use benches::serve_child::{ServeChild, create_topic};
use bus::{Client, Namespace};
use clap::Parser;

#[derive(Debug, Parser)]
#[command(about = "Server CPU while idle, without and with parked polls")]
struct Args {
    /// The `shardline` binary.
    #[arg(long)]
    bin: PathBuf,
    /// Polls to park on the server's one shard.
    #[arg(long, default_value_t = 10_000)]
    polls: u32,
    /// Seconds of each idle measurement (1..=40: the parked polls' waits end after 60 s).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=40))]
    idle_s: u64,
    /// Where the data directory goes (default: the system temp dir).
    #[arg(long)]
    data_root: Option<PathBuf>,
}

/// How long parking every poll may take before the bench gives up.
const PARK_DEADLINE: Duration = Duration::from_secs(15);
/// Pause after the polls are parked before measuring, so the connects' work is over.
const SETTLE: Duration = Duration::from_secs(1);

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let open_file_limit = shards::resources::raise_open_file_limit();
    let root = match &args.data_root {
        Some(root) => tempfile::tempdir_in(root)?,
        None => tempfile::tempdir()?,
    };
    let parked_max = args.polls.max(1).to_string();
    let serve = ServeChild::start(
        &args.bin,
        &root.path().join("data"),
        &[
            "--shards",
            "1",
            "--fsync",
            "never",
            "--parked-polls-max",
            &parked_max,
        ],
    )?;
    let addr = serve.addr;
    compio::runtime::Runtime::new()?.block_on(create_topic(addr, 1))?;
    std::thread::sleep(SETTLE);
    let idle = Duration::from_secs(args.idle_s);

    let none = cpu_over(&serve, idle)?;
    println!(
        "open-file limit {open_file_limit}; idle {} s with 0 parked polls: server CPU {:.3} s ({:.2} ms/s)",
        args.idle_s,
        none,
        none * 1000.0 / idle.as_secs_f64()
    );

    let polls = args.polls;
    let parker = std::thread::spawn(move || park(addr, polls));
    let started = Instant::now();
    loop {
        let parked = serve.parked_polls()?;
        if parked == u64::from(polls) {
            break;
        }
        if started.elapsed() > PARK_DEADLINE || parker.is_finished() {
            bail!("only {parked} of {polls} polls parked (is the open-file limit high enough?)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    println!(
        "parked {polls} polls in {:.2} s",
        started.elapsed().as_secs_f64()
    );
    std::thread::sleep(SETTLE);
    let with = cpu_over(&serve, idle)?;
    let still = serve.parked_polls()?;
    println!(
        "idle {} s with {still} parked polls: server CPU {:.3} s ({:.2} ms/s); difference {:+.3} s \
         ({:+.2} ms/s)",
        args.idle_s,
        with,
        with * 1000.0 / idle.as_secs_f64(),
        with - none,
        (with - none) * 1000.0 / idle.as_secs_f64()
    );

    let stopping = Instant::now();
    let code = serve.stop()?;
    println!(
        "SIGTERM with {still} parked polls: exit code {code:?} after {:.0} ms",
        stopping.elapsed().as_secs_f64() * 1000.0
    );
    let answered = parker
        .join()
        .map_err(|_| anyhow::anyhow!("the parking thread panicked"))??;
    println!("polls answered (empty) at the stop: {answered} of {polls}");
    Ok(())
}

/// Server CPU seconds used over `window`.
fn cpu_over(serve: &ServeChild, window: Duration) -> anyhow::Result<f64> {
    let before = serve.cpu_seconds()?;
    std::thread::sleep(window);
    Ok(serve.cpu_seconds()? - before)
}

/// Parks `polls` polls at the end of partition 0 (each on its own connection, at most 60 s);
/// returns how many were answered without an error.
fn park(addr: std::net::SocketAddr, polls: u32) -> anyhow::Result<u32> {
    compio::runtime::Runtime::new()?.block_on(async move {
        let namespace = Namespace::new(1, 1, 0);
        let mut tasks = Vec::with_capacity(polls as usize);
        for _ in 0..polls {
            // Connect one at a time: a burst of thousands overflows the listen backlog.
            let mut client = Client::connect(addr).await.context("connect")?;
            tasks.push(compio::runtime::spawn(async move {
                client
                    .poll_wait(namespace, 0, 1, bus::limits::POLL_WAIT_MAX)
                    .await
                    .is_ok()
            }));
        }
        let mut answered = 0;
        for task in tasks {
            if task.await.unwrap_or(false) {
                answered += 1;
            }
        }
        Ok(answered)
    })
}
