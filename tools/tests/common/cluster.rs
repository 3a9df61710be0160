//! A three-replica cluster of real `shardline serve` processes on 127.0.0.1 (issue 8), shared by
//! the cluster tests and the state-transfer test: start, kill -9, restart, wait for an agreed
//! primary or for convergence, the `metadata` CLI, and raw requests with a fixed client id and
//! request number. Waits poll with a deadline (a loaded 2-core host is slow); nothing asserts a
//! time.

use std::io::{Read as _, Write as _};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{BIN, Server};

pub const CLUSTER: &str = "7";
/// Longest wait for a cluster condition (election, catch-up) before the test fails.
pub const CONVERGE_DEADLINE: Duration = Duration::from_mins(1);
/// Longest run of one CLI command (`metadata`, `topic create`) before it is killed: above the
/// CLI's own connect (5 s) and request (30 s) timeouts, so it only stops a CLI that hangs.
pub const CLI_DEADLINE: Duration = Duration::from_mins(1);

pub fn free_port() -> u16 {
    super::unused_port()
}

pub struct Cluster {
    _root: tempfile::TempDir,
    pub dirs: Vec<PathBuf>,
    pub clients: Vec<SocketAddr>,
    pub replicas: Vec<SocketAddr>,
    pub servers: Vec<Option<Server>>,
    /// `serve` flags every replica gets besides the cluster's own.
    pub extra_args: Vec<String>,
}

impl Cluster {
    pub fn start() -> Cluster {
        Cluster::start_with(&[])
    }

    /// Starts three replicas, each with the cluster flags and `extra_args`.
    pub fn start_with(extra_args: &[&str]) -> Cluster {
        let root = tempfile::tempdir().unwrap();
        let dirs: Vec<PathBuf> = (0..3).map(|i| root.path().join(format!("r{i}"))).collect();
        let clients: Vec<SocketAddr> = (0..3)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let replicas: Vec<SocketAddr> = (0..3)
            .map(|_| SocketAddr::from(([127, 0, 0, 1], free_port())))
            .collect();
        let mut cluster = Cluster {
            _root: root,
            dirs,
            clients,
            replicas,
            servers: vec![None, None, None],
            extra_args: extra_args.iter().map(ToString::to_string).collect(),
        };
        for index in 0..3 {
            cluster.start_replica(index);
        }
        cluster
    }

    pub fn addresses(&self) -> String {
        self.replicas
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    /// `serve` flags of replica `index`: one unpinned shard (unless `extra_args` sets
    /// `--shards`), the cluster's flags, then `extra_args`.
    pub fn serve_args(&self, index: usize) -> Vec<String> {
        let mut args: Vec<String> = if self.extra_args.iter().any(|arg| arg == "--shards") {
            Vec::new()
        } else {
            vec!["--shards".into(), "1".into()]
        };
        args.extend([
            "--no-pin".into(),
            "--cluster".into(),
            CLUSTER.into(),
            "--replica".into(),
            index.to_string(),
            "--addresses".into(),
            self.addresses(),
        ]);
        args.extend(self.extra_args.iter().cloned());
        args
    }

    pub fn start_replica(&mut self, index: usize) {
        self.start_replica_retrying(index, &[], |_| false)
            .expect("a plain start is retried until it listens or panics");
    }

    /// Starts replica `index` with `SHARDLINE_FAILPOINT=failpoint`: `Ok` once it listens (it
    /// may reach the failpoint later; the caller waits for its exit), `Err` with its stderr log
    /// when it reached the failpoint before it listened (it is reaped). A start that failed
    /// otherwise (the port of a replica just killed not free yet) is retried as
    /// [`Cluster::start_replica`] does, but one that reached the failpoint never is: a second
    /// start would boot from what the first left behind (an install finished by boot, say),
    /// need no state transfer, and never reach the failpoint, so a caller waiting for it to
    /// die would wait forever.
    pub fn start_replica_armed(&mut self, index: usize, failpoint: &str) -> Result<(), String> {
        let reached = format!("failpoint {failpoint}: killing the process with SIGKILL");
        self.start_replica_retrying(index, &[("SHARDLINE_FAILPOINT", failpoint)], |stderr| {
            last_start(stderr).contains(&reached)
        })
    }

    /// Starts replica `index` with `env` set, retrying (for up to [`CONVERGE_DEADLINE`]) a start
    /// that failed unless `gives_up` says so of its stderr log, which it then returns; panics
    /// with the stderr log once the deadline passed.
    fn start_replica_retrying(
        &mut self,
        index: usize,
        env: &[(&str, &str)],
        gives_up: impl Fn(&str) -> bool,
    ) -> Result<(), String> {
        let args = self.serve_args(index);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let listen = self.clients[index].to_string();
        let deadline = Instant::now() + CONVERGE_DEADLINE;
        let server = loop {
            let mut command = Command::new(BIN);
            command.envs(env.iter().copied());
            match Server::try_start_on(command, &self.dirs[index], &listen, &args) {
                Ok(server) => break server,
                Err(stderr) if gives_up(&stderr) => return Err(stderr),
                // The port of a replica just killed may not be free yet.
                Err(stderr) if Instant::now() < deadline => {
                    eprintln!("replica {index} did not start yet: {}", last_start(&stderr));
                    std::thread::sleep(Duration::from_millis(200));
                }
                Err(stderr) => panic!("replica {index} did not start:\n{}", last_start(&stderr)),
            }
        };
        self.servers[index] = Some(server);
        Ok(())
    }

    pub fn kill9(&mut self, index: usize) {
        self.servers[index]
            .take()
            .expect("replica is running")
            .kill9();
    }

    /// Every client address, comma-separated: the CLI tries them in turn and follows NotPrimary.
    pub fn all_clients(&self) -> String {
        self.clients
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn stderr(&self, index: usize) -> String {
        self.servers[index]
            .as_ref()
            .map(Server::stderr)
            .unwrap_or_default()
    }

    /// The index of the replica that all running replicas agree is the primary of a view with
    /// status normal, once they do.
    pub fn wait_for_primary(&self, running: &[usize]) -> usize {
        let deadline = Instant::now() + CONVERGE_DEADLINE;
        loop {
            let views: Vec<Option<serde_json::Value>> =
                running.iter().map(|&i| metadata(self.clients[i])).collect();
            let primaries: Vec<Option<u64>> = views
                .iter()
                .map(|m| m.as_ref().and_then(|m| m["primary"].as_u64()))
                .collect();
            if let Some(Some(primary)) = primaries.first()
                && primaries.iter().all(|p| *p == Some(*primary))
                && running.contains(&(*primary as usize))
            {
                return *primary as usize;
            }
            assert!(
                Instant::now() < deadline,
                "no agreed primary among {running:?}: {primaries:?}\n{}",
                self.stderrs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until every replica in `running` shows the same streams and commit number, and
    /// returns that metadata.
    pub fn wait_converged(&self, running: &[usize]) -> serde_json::Value {
        let deadline = Instant::now() + CONVERGE_DEADLINE;
        loop {
            let all: Vec<Option<serde_json::Value>> =
                running.iter().map(|&i| metadata(self.clients[i])).collect();
            if all.iter().all(Option::is_some) {
                let all: Vec<serde_json::Value> = all.into_iter().map(Option::unwrap).collect();
                let first = &all[0];
                if all
                    .iter()
                    .all(|m| shape(m) == shape(first) && m["commit"] == first["commit"])
                {
                    return first.clone();
                }
            }
            assert!(
                Instant::now() < deadline,
                "replicas {running:?} did not converge: {:?}\n{}",
                running
                    .iter()
                    .map(|&i| metadata(self.clients[i]))
                    .collect::<Vec<_>>(),
                self.stderrs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    pub fn stderrs(&self) -> String {
        (0..3)
            .map(|i| format!("--- replica {i} stderr ---\n{}", tail(&self.stderr(i), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// The replicated part of a `metadata` answer: streams, topics and partitions without their
/// `next_offset` (partition messages are not replicated yet, so a backup's offsets differ).
pub fn shape(metadata: &serde_json::Value) -> serde_json::Value {
    let mut streams = metadata["streams"].clone();
    for stream in streams.as_array_mut().into_iter().flatten() {
        for topic in stream["topics"].as_array_mut().into_iter().flatten() {
            for partition in topic["partitions"].as_array_mut().into_iter().flatten() {
                if let Some(partition) = partition.as_object_mut() {
                    partition.remove("next_offset");
                    partition.remove("first_offset");
                }
            }
        }
    }
    streams
}

/// The part of a replica's stderr log written by its latest start (every start of a replica
/// appends to the same file).
pub fn last_start(stderr: &str) -> &str {
    &stderr[stderr.rfind("starting data_dir").unwrap_or(0)..]
}

pub fn tail(text: &str, lines: usize) -> String {
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// `shardline metadata --addr ADDR` as JSON, or `None` if it fails (replica down or busy) or
/// runs past [`CLI_DEADLINE`] (killed).
pub fn metadata(addr: SocketAddr) -> Option<serde_json::Value> {
    let mut command = Command::new(BIN);
    command.args(["metadata", "--addr", &addr.to_string()]);
    let output = super::output_within(command, CLI_DEADLINE)?;
    if !output.status.success() {
        return None;
    }
    serde_json::from_slice(&output.stdout).ok()
}

/// Runs the CLI with `args`; panics with its stderr unless it succeeds within [`CLI_DEADLINE`]
/// (past it, the CLI is killed and the panic says so).
pub fn cli(args: &[&str]) {
    let mut command = Command::new(BIN);
    command.args(args);
    let output = super::output_within(command, CLI_DEADLINE)
        .unwrap_or_else(|| panic!("shardline {args:?} ran past {CLI_DEADLINE:?}; killed it"));
    assert!(
        output.status.success(),
        "shardline {args:?} failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

pub fn stream_names(metadata: &serde_json::Value) -> Vec<String> {
    metadata["streams"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap().to_owned())
        .collect()
}

pub fn others(excluded: usize) -> Vec<usize> {
    (0..3).filter(|&i| i != excluded).collect()
}

/// One metadata request with a fixed client id and request number on a fresh connection.
pub fn raw_request(
    addr: SocketAddr,
    client: u128,
    request: u64,
    operation: bus::Operation,
    namespace: bus::Namespace,
    body: &[u8],
) -> Option<(bus::Header, Vec<u8>)> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .ok()?;
    let mut header = bus::Header::new(bus::Command::Request, operation);
    header.client = client;
    header.request = request;
    header.namespace = namespace.0;
    stream
        .write_all(&bus::encode_frame(&mut header, body))
        .ok()?;
    let mut head = [0u8; bus::HEADER_SIZE];
    stream.read_exact(&mut head).ok()?;
    let reply: bus::Header = bytemuck::pod_read_unaligned(&head);
    let mut reply_body = vec![0u8; (reply.size as usize).saturating_sub(bus::HEADER_SIZE)];
    stream.read_exact(&mut reply_body).ok()?;
    Some((reply, reply_body))
}

/// Sends the request to the primary of the cluster, following NotPrimary by trying each
/// address, until a reply other than NotPrimary/Busy/ShuttingDown comes back.
pub fn request_at_primary(
    cluster: &Cluster,
    client: u128,
    request: u64,
    operation: bus::Operation,
    namespace: bus::Namespace,
    body: &[u8],
) -> (bus::Header, Vec<u8>) {
    let deadline = Instant::now() + CONVERGE_DEADLINE;
    loop {
        for (index, &addr) in cluster.clients.iter().enumerate() {
            if cluster.servers[index].is_none() {
                continue;
            }
            if let Some((header, reply_body)) =
                raw_request(addr, client, request, operation, namespace, body)
            {
                let code = bus::ErrorCode::from_u32(header.error_code);
                if !matches!(
                    code,
                    Some(
                        bus::ErrorCode::NotPrimary
                            | bus::ErrorCode::Busy
                            | bus::ErrorCode::ShuttingDown
                    )
                ) {
                    return (header, reply_body);
                }
            }
        }
        assert!(
            Instant::now() < deadline,
            "no primary answered request {request} of client {client:#x}\n{}",
            cluster.stderrs()
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// While it lives, holds a downed replica's replica-bus address: it accepts every connection and
/// reads and drops all that is sent, a network that loses every message to that replica.
///
/// Why: a peer queues the frames for a replica whose link is down in a bounded queue and writes
/// them once a connection is up (`shards::replica_bus::connect_loop`), so without the sink a
/// restarted replica can receive the prepares sent while it was down and catch up from them,
/// with no repair and no state transfer. With it, the peers' links are up and drain into it;
/// dropping it closes every connection (a peer's next write fails and it reconnects) and frees
/// the port for the replica's next start.
pub struct DropSink {
    stop: Arc<AtomicBool>,
    accept_thread: Option<JoinHandle<()>>,
}

/// How often the sink's threads look at the stop flag.
const SINK_POLL: Duration = Duration::from_millis(20);

impl DropSink {
    /// Binds `addr` (retrying for up to [`CONVERGE_DEADLINE`]: the port of a replica just
    /// killed may not be free yet) and starts draining; panics if it never binds.
    pub fn bind(addr: SocketAddr) -> DropSink {
        let deadline = Instant::now() + CONVERGE_DEADLINE;
        let listener = loop {
            match TcpListener::bind(addr) {
                Ok(listener) => break listener,
                Err(error) => {
                    assert!(
                        Instant::now() < deadline,
                        "cannot bind {addr} to drop what is sent there: {error}"
                    );
                    std::thread::sleep(SINK_POLL);
                }
            }
        };
        listener.set_nonblocking(true).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let accept_stop = Arc::clone(&stop);
        let accept_thread = std::thread::spawn(move || {
            let mut readers = Vec::new();
            while !accept_stop.load(Ordering::Relaxed) {
                match listener.accept() {
                    Ok((stream, _)) => {
                        let stop = Arc::clone(&accept_stop);
                        readers.push(std::thread::spawn(move || drain_until(stream, &stop)));
                    }
                    Err(_) => std::thread::sleep(SINK_POLL),
                }
            }
            drop(listener);
            for reader in readers {
                let _ = reader.join();
            }
        });
        DropSink {
            stop,
            accept_thread: Some(accept_thread),
        }
    }
}

impl Drop for DropSink {
    /// Stops accepting, closes every connection and frees the port (returns once it is free).
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(thread) = self.accept_thread.take() {
            let _ = thread.join();
        }
    }
}

/// Reads and drops what `stream` receives until the peer closes it or `stop` is set (then the
/// stream is dropped, which closes it).
fn drain_until(mut stream: TcpStream, stop: &AtomicBool) {
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_read_timeout(Some(SINK_POLL));
    let mut buffer = vec![0u8; 1 << 16];
    while !stop.load(Ordering::Relaxed) {
        match stream.read(&mut buffer) {
            Ok(0) => return,
            Ok(_) => {}
            Err(error)
                if matches!(
                    error.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            Err(_) => return,
        }
    }
}
