//! One `shardline serve` child on loopback for the measurement binaries (follow latency and
//! parked polls, issue 11 section 3; metrics overhead, issue 10): its client address, its
//! metrics address when it serves metrics, the parked-poll gauge it reports, and the CPU time the
//! whole process (every thread, io_uring workers included) has used.
//!
//! Never asserts on what it measures: the binaries print figures.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};

use anyhow::{Context as _, bail};

/// A running `shardline serve`; killed on drop if still running.
#[derive(Debug)]
pub struct ServeChild {
    pub child: Child,
    pub addr: SocketAddr,
    /// The metrics listener (`--metrics-listen 127.0.0.1:0`), when started with one.
    pub metrics: Option<SocketAddr>,
}

impl ServeChild {
    /// Starts `bin serve --no-pin --listen 127.0.0.1:0 --metrics-listen 127.0.0.1:0 --data-dir
    /// DIR` plus `extra`, and reads its two address lines.
    ///
    /// # Errors
    /// The binary cannot be spawned, or it exits (or prints something else) before both lines.
    pub fn start(bin: &Path, data_dir: &Path, extra: &[&str]) -> anyhow::Result<ServeChild> {
        ServeChild::start_with(bin, data_dir, extra, true)
    }

    /// As [`ServeChild::start`], with the metrics listener only when `metrics` (then it reads
    /// the `metrics on` line too).
    ///
    /// # Errors
    /// The binary cannot be spawned, or it exits (or prints something else) before its address
    /// lines.
    pub fn start_with(
        bin: &Path,
        data_dir: &Path,
        extra: &[&str],
        metrics: bool,
    ) -> anyhow::Result<ServeChild> {
        let mut command = Command::new(bin);
        command
            .args(["serve", "--no-pin", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if metrics {
            command.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        let mut child = command
            .spawn()
            .with_context(|| format!("spawn {} serve", bin.display()))?;
        let stdout = child.stdout.take().context("serve stdout")?;
        let mut lines = BufReader::new(stdout).lines();
        let mut next = |prefix: &str| -> anyhow::Result<String> {
            let line = lines
                .next()
                .context("serve exited before printing its addresses")??;
            line.strip_prefix(prefix)
                .map(str::to_owned)
                .with_context(|| format!("unexpected serve line {line:?}"))
        };
        let addr = next("listening on ")?.parse()?;
        let metrics = if metrics {
            let url = next("metrics on http://")?;
            Some(url.trim_end_matches("/metrics").parse()?)
        } else {
            None
        };
        // Keep reading stdout so the server never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        Ok(ServeChild {
            child,
            addr,
            metrics,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The Prometheus text of one `GET /metrics`.
    ///
    /// # Errors
    /// Started without metrics, or the metrics listener did not answer 200.
    pub fn scrape(&self) -> anyhow::Result<String> {
        scrape(
            self.metrics
                .context("serve was started without --metrics-listen")?,
        )
    }

    /// Polls parked on every shard now (the `shardline_parked_polls` gauges summed).
    ///
    /// # Errors
    /// As [`ServeChild::scrape`].
    pub fn parked_polls(&self) -> anyhow::Result<u64> {
        let text = self.scrape()?;
        Ok(text
            .lines()
            .filter(|line| line.starts_with("shardline_parked_polls{"))
            .filter_map(|line| line.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>() as u64)
    }

    /// CPU time (user + system) the server process used so far, seconds: `/proc/PID/stat`
    /// `utime + stime` of every thread, live ones and exited ones (proc(5)), in clock ticks.
    ///
    /// # Errors
    /// The process is gone or `/proc` cannot be read.
    pub fn cpu_seconds(&self) -> anyhow::Result<f64> {
        let pid = i32::try_from(self.pid()).context("pid out of range")?;
        let stat = procfs::process::Process::new(pid)?.stat()?;
        Ok((stat.utime + stat.stime) as f64 / procfs::ticks_per_second() as f64)
    }

    /// SIGTERM, then waits; the exit code (`None`: killed by a signal).
    ///
    /// # Errors
    /// The signal or the wait failed.
    pub fn stop(mut self) -> anyhow::Result<Option<i32>> {
        let pid = i32::try_from(self.pid()).context("pid out of range")?;
        // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            bail!("kill: {}", std::io::Error::last_os_error());
        }
        Ok(self.child.wait()?.code())
    }
}

impl Drop for ServeChild {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The Prometheus text of one `GET /metrics` from the listener at `metrics`.
///
/// # Errors
/// The connection failed, or the listener did not answer 200.
pub fn scrape(metrics: SocketAddr) -> anyhow::Result<String> {
    let mut stream = TcpStream::connect(metrics)?;
    stream.write_all(b"GET /metrics HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    if !text.starts_with("HTTP/1.1 200 ") {
        bail!("scrape answered {:?}", text.lines().next());
    }
    Ok(text)
}

/// Creates stream 1 `bench` and its topic 1 `follow` with `partition_count` partitions.
///
/// # Errors
/// A request failed.
pub async fn create_topic(addr: SocketAddr, partition_count: u32) -> anyhow::Result<()> {
    let mut client = bus::Client::connect(addr).await?;
    client.create_stream(1, "bench").await?;
    client.create_topic(1, 1, "follow", partition_count).await?;
    Ok(())
}
