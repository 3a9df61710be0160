//! Three real `shardline serve` replicas on this host for the cluster benchmarks (`failover`,
//! `transfer_cluster`): one shard each, unpinned, each with its own data directory under a
//! root, a free client port and replica address, its stderr appended to `r{index}.stderr.log`
//! beside its directory. Killed (SIGKILL) when dropped.

use std::io::{BufRead as _, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// The `--cluster` id the benchmarks use.
pub const CLUSTER: &str = "9";
/// How long a replica may take to print `listening on` (a port freed by a kill may take a
/// moment).
pub const STARTUP_DEADLINE: Duration = Duration::from_mins(1);

/// One replica: its data directory, stderr log, client address and process while running.
#[derive(Debug)]
pub struct Replica {
    pub dir: PathBuf,
    pub log: PathBuf,
    pub client: SocketAddr,
    pub child: Option<Child>,
}

/// The three replicas.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    addresses: String,
    flags: Vec<String>,
    rust_log: String,
    pub replicas: Vec<Replica>,
}

/// A free loopback address (bound and released at once).
///
/// # Errors
/// The bind failed.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

impl Cluster {
    /// Starts three replicas of `bin` under `root`, each with `flags` added to its `serve`
    /// command line and `RUST_LOG=rust_log`.
    ///
    /// # Errors
    /// A replica did not start within [`STARTUP_DEADLINE`].
    pub fn start(
        bin: &Path,
        root: &Path,
        flags: Vec<String>,
        rust_log: &str,
    ) -> anyhow::Result<Cluster> {
        let mut replica_addrs = Vec::new();
        let mut replicas = Vec::new();
        for index in 0..3 {
            replica_addrs.push(free_addr()?.to_string());
            replicas.push(Replica {
                dir: root.join(format!("r{index}")),
                log: root.join(format!("r{index}.stderr.log")),
                client: free_addr()?,
                child: None,
            });
        }
        let mut cluster = Cluster {
            bin: bin.to_owned(),
            addresses: replica_addrs.join(","),
            flags,
            rust_log: rust_log.to_owned(),
            replicas,
        };
        for index in 0..3 {
            cluster.spawn(index)?;
        }
        Ok(cluster)
    }

    /// Starts replica `index` (again), retrying while its port is not free yet.
    ///
    /// # Errors
    /// The spawn failed, or the replica did not start within [`STARTUP_DEADLINE`].
    pub fn spawn(&mut self, index: usize) -> anyhow::Result<()> {
        let deadline = Instant::now() + STARTUP_DEADLINE;
        loop {
            let replica = &self.replicas[index];
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&replica.log)?;
            let mut child = Command::new(&self.bin)
                .args(["serve", "--shards", "1", "--no-pin", "--cluster", CLUSTER])
                .args(["--replica", &index.to_string()])
                .args(["--addresses", &self.addresses])
                .args(["--listen", &replica.client.to_string(), "--data-dir"])
                .arg(&replica.dir)
                .args(&self.flags)
                .env("RUST_LOG", &self.rust_log)
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .with_context(|| format!("spawn {}", self.bin.display()))?;
            let stdout = child.stdout.take().context("stdout")?;
            let mut first = String::new();
            BufReader::new(stdout).read_line(&mut first)?;
            if first.starts_with("listening on") {
                self.replicas[index].child = Some(child);
                return Ok(());
            }
            let _ = child.kill();
            let _ = child.wait();
            if Instant::now() > deadline {
                bail!(
                    "replica {index} did not start; see {}",
                    replica.log.display()
                );
            }
            // The port of a replica just killed may not be free yet.
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// SIGKILLs replica `index`.
    ///
    /// # Errors
    /// It is not running, or the kill failed.
    pub fn kill9(&mut self, index: usize) -> anyhow::Result<()> {
        let mut child = self.replicas[index].child.take().context("not running")?;
        child.kill()?;
        child.wait()?;
        Ok(())
    }

    /// Every replica's client address, by index.
    pub fn clients(&self) -> Vec<SocketAddr> {
        self.replicas.iter().map(|replica| replica.client).collect()
    }

    /// The indexes of the running replicas.
    pub fn running(&self) -> Vec<usize> {
        (0..self.replicas.len())
            .filter(|&index| self.replicas[index].child.is_some())
            .collect()
    }

    /// The client addresses of the running replicas.
    pub fn running_clients(&self) -> Vec<SocketAddr> {
        self.running()
            .into_iter()
            .map(|index| self.replicas[index].client)
            .collect()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        for replica in &mut self.replicas {
            if let Some(mut child) = replica.child.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
        }
    }
}
