//! Test support: start the real `shardline serve` binary on 127.0.0.1 with a temporary data
//! directory, read its `listening on` line, stop it with SIGTERM or SIGKILL.

#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Output, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

pub const BIN: &str = env!("CARGO_BIN_EXE_shardline");

/// The shared corpus beside the repository (`../shared/data`).
pub fn shared_data(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/data")
        .join(name)
}

pub struct Server {
    pub child: Child,
    pub addr: SocketAddr,
    pub stderr_log: PathBuf,
}

impl Server {
    /// Starts `shardline serve --listen 127.0.0.1:0 --data-dir DIR` plus `extra` args; panics with
    /// the server's stderr if it does not report listening within 60 s.
    pub fn start(data_dir: &Path, extra: &[&str]) -> Server {
        Self::start_with(Command::new(BIN), data_dir, extra)
    }

    pub fn start_with(command: Command, data_dir: &Path, extra: &[&str]) -> Server {
        Self::start_listening(command, "127.0.0.1:0", data_dir, extra)
    }

    /// `start_with` on a chosen `--listen` address (e.g. a port a client already waits for).
    pub fn start_listening(
        command: Command,
        listen: &str,
        data_dir: &Path,
        extra: &[&str],
    ) -> Server {
        Self::try_start_on(command, data_dir, listen, extra).unwrap_or_else(|stderr| {
            panic!("server did not start; stderr:\n{stderr}");
        })
    }

    /// Starts `shardline serve --listen LISTEN --data-dir DIR` plus `extra` args; the server's
    /// stderr if it exits or does not report listening within 60 s (e.g. the port of a server
    /// just killed is not free yet).
    pub fn try_start_on(
        mut command: Command,
        data_dir: &Path,
        listen: &str,
        extra: &[&str],
    ) -> Result<Server, String> {
        let stderr_log = data_dir.with_extension(format!("stderr.{}.log", std::process::id()));
        let stderr_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&stderr_log)
            .unwrap();
        let mut child = command
            .args(["serve", "--listen", listen, "--data-dir"])
            .arg(data_dir)
            .args(extra)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr_file)
            .spawn()
            .expect("spawn shardline serve");
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            let mut lines = BufReader::new(stdout).lines();
            if let Some(Ok(line)) = lines.next() {
                let _ = tx.send(line);
            }
            for _ in lines {}
        });
        let Ok(line) = rx.recv_timeout(Duration::from_mins(1)) else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(std::fs::read_to_string(&stderr_log).unwrap_or_default());
        };
        let addr = line
            .strip_prefix("listening on ")
            .unwrap_or_else(|| panic!("unexpected first stdout line {line:?}"))
            .parse()
            .unwrap();
        Ok(Server {
            child,
            addr,
            stderr_log,
        })
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then waits; returns the exit status code.
    pub fn stop(mut self) -> Option<i32> {
        unsafe_kill(self.child.id(), libc::SIGTERM);
        let status = self.child.wait().unwrap();
        status.code()
    }

    /// SIGKILL (kill -9), then waits.
    pub fn kill9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    /// Waits at most `limit` for the server to exit by itself (a failpoint, a refused boot);
    /// its exit status, or `None` when it still runs then. Never kills: the caller reports what
    /// it waited for and drops (kills) the server.
    pub fn wait_exit_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.stderr_log).unwrap_or_default()
    }
}

/// Runs `command` (stdin null, stdout and stderr captured) for at most `limit`; its output, or
/// `None` when it ran past `limit` (it is then killed and reaped, so no process is left over).
/// Both pipes are drained while it runs, so a large output cannot stall it.
pub fn output_within(mut command: Command, limit: Duration) -> Option<Output> {
    let mut child = command
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn a CLI command");
    let drain = |pipe: Option<Box<dyn std::io::Read + Send>>| {
        std::thread::spawn(move || {
            let mut bytes = Vec::new();
            if let Some(mut pipe) = pipe {
                let _ = pipe.read_to_end(&mut bytes);
            }
            bytes
        })
    };
    let stdout = drain(child.stdout.take().map(|pipe| Box::new(pipe) as _));
    let stderr = drain(child.stderr.take().map(|pipe| Box::new(pipe) as _));
    let deadline = Instant::now() + limit;
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = stdout.join().unwrap();
    let stderr = stderr.join().unwrap();
    Some(Output {
        status: status?,
        stdout,
        stderr,
    })
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn unsafe_kill(pid: u32, signal: i32) {
    // SAFETY: kill(2) on our own child's pid has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid as i32, signal) };
    assert_eq!(rc, 0, "kill({pid}, {signal}) failed");
}

/// Runs an async block on a fresh compio runtime.
pub fn block_on<T>(future: impl Future<Output = T>) -> T {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// Reads every message of a partition from offset 0: (offset, id, payload).
pub async fn read_all(
    client: &mut bus::Client,
    namespace: bus::Namespace,
) -> Vec<(u64, u64, Vec<u8>)> {
    let mut out = Vec::new();
    let mut offset = 0;
    loop {
        let body = client.poll_messages(namespace, offset, 1000).await.unwrap();
        let messages = bus::client::messages_from(&body, offset).unwrap();
        if messages.is_empty() {
            return out;
        }
        for message in messages {
            assert!(
                message.verify(),
                "checksum of message at offset {} in {namespace}",
                message.offset
            );
            assert_eq!(message.offset, offset, "gap or duplicate in {namespace}");
            out.push((message.offset, message.id, message.payload.to_vec()));
            offset += 1;
        }
    }
}

/// `command` with `resource` set to `limit` (soft and hard) in the child only.
pub fn with_rlimit(
    mut command: Command,
    resource: libc::__rlimit_resource_t,
    limit: u64,
) -> Command {
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        command.pre_exec(move || {
            let value = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(resource, &raw const value) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command
}

/// Sends one SendMessages frame for `namespace` with `batch` as its body and the request
/// header's `producer` and `sequence`, on a fresh connection; returns the reply header and body.
pub fn raw_send(
    addr: SocketAddr,
    namespace: bus::Namespace,
    producer: u64,
    sequence: u64,
    batch: &[u8],
) -> (bus::Header, Vec<u8>) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_mins(1)))
        .unwrap();
    let mut header = bus::Header::new(bus::Command::Request, bus::Operation::SendMessages);
    header.namespace = namespace.0;
    header.producer = producer;
    header.sequence = sequence;
    header.client = 0x7e57;
    header.request = 1;
    stream
        .write_all(&bus::encode_frame(&mut header, batch))
        .unwrap();
    let mut head = [0u8; bus::HEADER_SIZE];
    stream.read_exact(&mut head).unwrap();
    let reply: bus::Header = bytemuck::pod_read_unaligned(&head);
    let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
    stream.read_exact(&mut body).unwrap();
    (reply, body)
}

/// Sets `resource` (soft and hard) of the running process `pid` to `limit` (prlimit(2)), as an
/// operator could with `prlimit --pid`.
pub fn set_process_rlimit(pid: u32, resource: libc::__rlimit_resource_t, limit: u64) {
    let value = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit reads the plain struct passed to it and writes no old value (null).
    let result = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            resource,
            &raw const value,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(result, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// The soft `RLIMIT_NOFILE` of the running process `pid` (prlimit(2)).
pub fn process_soft_nofile(pid: u32) -> u64 {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: prlimit sets no new value (null) and writes the old one into the plain struct.
    let result = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &raw mut old,
        )
    };
    assert_eq!(result, 0, "prlimit: {}", std::io::Error::last_os_error());
    old.rlim_cur
}

/// Sets only the soft `RLIMIT_NOFILE` of the running process `pid` to `limit`, keeping its hard
/// limit, so that raising it back needs no privilege (as `prlimit --pid PID --nofile=N:`).
pub fn set_process_soft_nofile(pid: u32, limit: u64) {
    let mut old = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: as in `process_soft_nofile`.
    let result = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            std::ptr::null(),
            &raw mut old,
        )
    };
    assert_eq!(result, 0, "prlimit: {}", std::io::Error::last_os_error());
    let value = libc::rlimit {
        rlim_cur: limit,
        rlim_max: old.rlim_max,
    };
    // SAFETY: prlimit reads the plain struct passed to it and writes no old value (null).
    let result = unsafe {
        libc::prlimit(
            pid as libc::pid_t,
            libc::RLIMIT_NOFILE,
            &raw const value,
            std::ptr::null_mut(),
        )
    };
    assert_eq!(result, 0, "prlimit: {}", std::io::Error::last_os_error());
}

/// A TCP port on 127.0.0.1 that is free now and below the kernel's ephemeral range (32768 and
/// up by default), so that no `bind(":0")` or outgoing connection of a test running in parallel
/// takes it before the server binds it: pseudo-random in 20000..32000, checked with a bind.
pub fn unused_port() -> u16 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let seed = std::process::id().wrapping_mul(7919) ^ nanos;
    loop {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20_000 + (seed.wrapping_add(n.wrapping_mul(2_654_435_761)) % 12_000) as u16;
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}
pub mod cluster;

/// Runs `shardline bench ARGS` to completion and returns its output.
pub fn bench(args: &[&str]) -> std::process::Output {
    Command::new(BIN)
        .arg("bench")
        .args(args)
        .output()
        .expect("run shardline bench")
}

/// Lossy UTF-8 of a child's stdout or stderr.
pub fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A temp path as a command-line argument.
pub fn path_arg(path: &Path) -> &str {
    path.to_str().expect("temp paths are UTF-8")
}
