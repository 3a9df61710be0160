//! The embedded server: `shardline serve` started as a child process on a fresh data directory,
//! one per bench run, and stopped with SIGTERM at the end.
//!
//! Contract with `serve`: it prints exactly one line `listening on 127.0.0.1:PORT` to stdout when
//! every shard is ready (logs go to stderr, captured here in `server.log` beside the data
//! directory), and exits 0 on SIGTERM after fsyncing. This module must never leave the child
//! running, nor its directory behind: a failure or a drop kills it and removes the directory (a
//! failure quotes the log's last lines first), and a SIGINT does the same (`interrupt`): the
//! child runs in a process group of its own so that a terminal's Ctrl-C reaches the bench only,
//! and every change to the run's directory or child happens under `interrupt::lock`. A SIGKILL of
//! the bench, which no handler sees, kills the child too (`PR_SET_PDEATHSIG`); its directory
//! then stays, as any killed program's files do.

use std::ffi::OsString;
use std::io::{BufRead as _, Write as _};
use std::net::SocketAddr;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::interrupt::{self, ActiveRun};
use super::limits::{SERVER_LOG_TAIL_LINES, SERVER_READY_TIMEOUT, SERVER_STOP_TIMEOUT};

/// Server flags passed through from `shardline bench`; `None` leaves the server's default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServerOptions {
    pub fsync: Option<String>,
    pub write_mode: Option<String>,
    pub cpus: Option<String>,
    pub no_pin: bool,
    pub io_driver: Option<String>,
    pub inbox_capacity: Option<u32>,
    pub idle_poll_us: Option<u32>,
}

impl ServerOptions {
    /// The `serve` command line after the program name.
    pub fn serve_args(&self, data_dir: &Path, shards: &str) -> Vec<OsString> {
        let mut args: Vec<OsString> = ["serve", "--listen", "127.0.0.1:0", "--data-dir"]
            .into_iter()
            .map(OsString::from)
            .collect();
        args.push(data_dir.as_os_str().to_owned());
        args.extend(["--shards", shards].map(OsString::from));
        let mut push = |flag: &str, value: Option<String>| {
            if let Some(value) = value {
                args.push(flag.into());
                args.push(value.into());
            }
        };
        push("--fsync", self.fsync.clone());
        push("--write-mode", self.write_mode.clone());
        push("--cpus", self.cpus.clone());
        push("--io-driver", self.io_driver.clone());
        push(
            "--inbox-capacity",
            self.inbox_capacity.map(|value| value.to_string()),
        );
        push(
            "--idle-poll-us",
            self.idle_poll_us.map(|value| value.to_string()),
        );
        if self.no_pin {
            args.push("--no-pin".into());
        }
        args
    }
}

/// The one `SHARDLINE_*` variable the embedded server keeps: its log filter changes what it
/// writes to `server.log`, never what it measures.
const KEPT_SERVER_VARIABLE: &str = "SHARDLINE_LOG";

/// Each variable of `serve` with the bench flag that sets the same thing; the bench passes its
/// settings as flags (or leaves the server's default), so the variable would make the server run
/// with a setting the report does not show.
const SERVER_VARIABLE_FLAGS: [(&str, &str); 8] = [
    ("SHARDLINE_FSYNC", "--fsync"),
    ("SHARDLINE_WRITE_MODE", "--write-mode"),
    ("SHARDLINE_CPUS", "--cpus"),
    ("SHARDLINE_NO_PIN", "--no-pin"),
    ("SHARDLINE_IO_DRIVER", "--io-driver"),
    ("SHARDLINE_INBOX_CAPACITY", "--inbox-capacity"),
    ("SHARDLINE_IDLE_POLL_US", "--idle-poll-us"),
    ("SHARDLINE_SHARDS", "--shards"),
];

/// A `SHARDLINE_*` variable of the bench's environment that the embedded server does not get.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IgnoredVariable {
    /// The variable's name, e.g. `SHARDLINE_FSYNC`.
    pub name: String,
    /// Its value, lossily decoded for the message.
    pub value: String,
}

impl IgnoredVariable {
    /// What sets the same thing for a bench: `pass --fsync never`, `pass --no-pin to unpin`,
    /// or, for a variable without a bench flag, that the server's default is used.
    pub fn advice(&self) -> String {
        match SERVER_VARIABLE_FLAGS
            .iter()
            .find(|(name, _)| *name == self.name)
        {
            // A switch: a false value (`0`, `off`) already is the bench's default.
            Some((_, "--no-pin")) => "pass --no-pin to unpin".to_string(),
            Some((_, flag)) => format!("pass {flag} {}", self.value),
            None if self.name == "SHARDLINE_CONFIG" => {
                "the bench reads no config file; pass its settings as bench flags".to_string()
            }
            None if self.name == "SHARDLINE_DATA_DIR" => {
                "each run's data directory is under --data-root".to_string()
            }
            None if self.name == "SHARDLINE_LISTEN" => {
                "the bench's server listens on a free loopback port".to_string()
            }
            None if self.name == "SHARDLINE_ADDR" => {
                "a client setting; pass --addr to bench an existing server".to_string()
            }
            None => "no bench flag sets it; the server's default is used".to_string(),
        }
    }
}

/// The `SHARDLINE_*` variables among `vars` that the embedded server is started without: all
/// but [`KEPT_SERVER_VARIABLE`], sorted by name. `serve` reads its settings from such variables
/// (clap's `env`), so an inherited `SHARDLINE_FSYNC=never` would run the server with `never`
/// while the report says the bench's setting (the server's default unless `--fsync` is given),
/// and a bad value would kill the server instead of being a usage error.
pub fn ignored_server_variables(
    vars: impl IntoIterator<Item = (OsString, OsString)>,
) -> Vec<IgnoredVariable> {
    let mut ignored: Vec<IgnoredVariable> = vars
        .into_iter()
        .filter_map(|(name, value)| {
            let name = name.into_string().ok()?;
            (name.starts_with("SHARDLINE_") && name != KEPT_SERVER_VARIABLE).then(|| {
                IgnoredVariable {
                    name,
                    value: value.to_string_lossy().into_owned(),
                }
            })
        })
        .collect();
    ignored.sort_by(|left, right| left.name.cmp(&right.name));
    ignored
}

/// The one line that tells the user which variables the embedded server ignores and what to
/// pass instead; `None` when `ignored` is empty.
pub fn ignored_variables_line(ignored: &[IgnoredVariable]) -> Option<String> {
    if ignored.is_empty() {
        return None;
    }
    let parts: Vec<String> = ignored
        .iter()
        .map(|variable| {
            format!(
                "{}={} ({})",
                variable.name,
                variable.value,
                variable.advice()
            )
        })
        .collect();
    Some(format!(
        "bench: the embedded server ignores {}; the bench passes its settings as flags, so the \
         report shows what the server runs",
        parts.join(", ")
    ))
}

/// The address in a `listening on HOST:PORT` line, or `None` for any other line.
pub fn parse_listening_line(line: &str) -> Option<SocketAddr> {
    line.trim_end().strip_prefix("listening on ")?.parse().ok()
}

/// The last `count` lines of a log file (empty if it cannot be read).
fn log_tail(path: &Path, count: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(count)..].join("\n")
}

/// Makes the child `command` spawns receive SIGKILL when the bench dies, however it dies: a
/// SIGKILL of the bench runs neither `interrupt`'s clean-up nor any drop, and the child's own
/// process group keeps a terminal's signals from it, so without this it would run forever.
///
/// In the child, between fork and exec: `prctl(PR_SET_PDEATHSIG, SIGKILL)` (prctl(2)), then
/// `getppid()` is checked against the bench's pid, because a bench that died before the prctl
/// already reparented the child and no death signal will come; such a child fails its spawn
/// instead of running. The death signal follows the *thread* that forked the child (prctl(2)),
/// so the child must be spawned from a thread that lives as long as the bench: the main one.
fn die_with_parent(command: &mut Command) {
    let parent_pid = libc::pid_t::try_from(std::process::id()).unwrap_or(libc::pid_t::MAX);
    // SAFETY: the closure runs in the forked child before exec and calls only prctl(2) and
    // getppid(2), both async-signal-safe system calls; it allocates nothing (`from_raw_os_error`
    // and `last_os_error` build an `io::Error` without allocating).
    unsafe {
        command.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if libc::getppid() != parent_pid {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// A running embedded server.
#[derive(Debug)]
pub struct EmbeddedServer {
    child: Child,
    addr: SocketAddr,
    /// Removed on a stop, clean or not, and on a failure (after quoting the log).
    dir: Option<tempfile::TempDir>,
    log_path: PathBuf,
}

impl EmbeddedServer {
    /// Starts `exe serve ...` with `--shards shards` on a fresh directory under `data_root` (the
    /// system temp dir when `None`) and waits for its `listening on` line.
    ///
    /// # Errors
    /// The directory or log cannot be created, the child cannot be spawned, it exits or closes
    /// stdout before listening (the error quotes its status and last stderr lines), or it stays
    /// silent for [`SERVER_READY_TIMEOUT`].
    pub fn start(
        exe: &Path,
        shards: &str,
        options: &ServerOptions,
        data_root: Option<&Path>,
    ) -> anyhow::Result<EmbeddedServer> {
        // Held until the child and its directory are recorded as the active run: a SIGINT in
        // between waits, then finds both.
        let mut run_guard = interrupt::lock();
        let dir = match data_root {
            Some(root) => tempfile::Builder::new()
                .prefix("shardline-bench-")
                .tempdir_in(root),
            None => tempfile::Builder::new()
                .prefix("shardline-bench-")
                .tempdir(),
        }
        .context("cannot create the embedded server's data directory")?;
        let data_dir = dir.path().join("data");
        std::fs::create_dir(&data_dir)
            .with_context(|| format!("cannot create {}", data_dir.display()))?;
        let log_path = dir.path().join("server.log");
        let log = std::fs::File::create(&log_path)
            .with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut command = Command::new(exe);
        // `ignored_server_variables`: the server gets its settings from these flags only.
        for variable in ignored_server_variables(std::env::vars_os()) {
            command.env_remove(&variable.name);
        }
        command
            .args(options.serve_args(&data_dir, shards))
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .process_group(0);
        die_with_parent(&mut command);
        let mut child = command
            .spawn()
            .with_context(|| format!("cannot start {} serve", exe.display()))?;
        run_guard.set(ActiveRun {
            server_pid: Some(child.id()),
            run_dir: dir.path().to_path_buf(),
        });
        drop(run_guard);
        let stdout = child.stdout.take().context("child stdout was not piped")?;
        let (addr_sender, addr_receiver) = mpsc::channel();
        // Reads the line, then keeps draining stdout so the server never blocks on a full pipe.
        std::thread::Builder::new()
            .name("bench-server-stdout".to_string())
            .spawn(move || {
                for line in std::io::BufReader::new(stdout).lines() {
                    let Ok(line) = line else { break };
                    match parse_listening_line(&line) {
                        Some(addr) => {
                            let _ = addr_sender.send(addr);
                        }
                        // Err: stderr is gone (a closed pipe); the line is only informative.
                        None => {
                            let _ = writeln!(std::io::stderr(), "server stdout: {line}");
                        }
                    }
                }
            })
            .context("cannot spawn the server stdout reader")?;
        let mut server = EmbeddedServer {
            child,
            addr: SocketAddr::from(([0, 0, 0, 0], 0)),
            dir: Some(dir),
            log_path,
        };
        let deadline = Instant::now() + SERVER_READY_TIMEOUT;
        loop {
            match addr_receiver.recv_timeout(Duration::from_millis(100)) {
                Ok(addr) => {
                    server.addr = addr;
                    return Ok(server);
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if let Some(status) = server.try_reap().context("cannot wait for the server")? {
                        return Err(server.fail(&format!("exited with {status} before listening")));
                    }
                    if Instant::now() >= deadline {
                        return Err(server.fail(&format!(
                            "printed no `listening on` line within {} s",
                            SERVER_READY_TIMEOUT.as_secs()
                        )));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    let status = server.wait_for_exit(Duration::from_secs(1));
                    let how = status.map_or("is still running".to_string(), |status| {
                        format!("exited with {status}")
                    });
                    return Err(server.fail(&format!(
                        "closed stdout without a `listening on` line and {how}"
                    )));
                }
            }
        }
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The run directory: the server's data directory is its `data/`, its log `server.log`.
    /// Scratch files put here are on the server's filesystem and go away with a clean stop.
    pub fn run_dir(&self) -> Option<&Path> {
        self.dir.as_ref().map(tempfile::TempDir::path)
    }

    /// The data directory given to `serve --data-dir`.
    pub fn data_dir(&self) -> Option<PathBuf> {
        self.run_dir().map(|dir| dir.join("data"))
    }

    /// The child's exit status if it has exited, reaping it under the active-run lock and
    /// forgetting its pid there (`RunGuard::reaped`), so that a stop signal never kills a reaped
    /// pid, which may be another process's by then.
    ///
    /// # Errors
    /// waitpid(2) fails.
    fn try_reap(&mut self) -> std::io::Result<Option<ExitStatus>> {
        let mut run_guard = interrupt::lock();
        let status = self.child.try_wait()?;
        if status.is_some() {
            run_guard.reaped(self.child.id());
        }
        Ok(status)
    }

    /// Polls [`EmbeddedServer::try_reap`] until the child exits or `timeout` passes (`None`).
    fn wait_for_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            match self.try_reap() {
                Ok(Some(status)) => return Some(status),
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(20));
                }
                _ => return None,
            }
        }
    }

    /// Kills the child if needed, removes its run directory (a failed bench leaves nothing
    /// behind), and builds an error quoting the last lines of its log.
    fn fail(&mut self, what: &str) -> anyhow::Error {
        let mut run_guard = interrupt::lock();
        if let Some(dir) = &self.dir {
            run_guard.forget(dir.path());
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        let tail = log_tail(&self.log_path, SERVER_LOG_TAIL_LINES);
        let removal = self.dir.take().map(|dir| {
            let path = dir.path().display().to_string();
            match dir.close() {
                Ok(()) => format!("; its directory {path} was removed"),
                Err(error) => format!("; its directory {path} could not be removed: {error}"),
            }
        });
        anyhow::anyhow!(
            "embedded server (pid {}) {what}{}; last lines of its stderr:\n{tail}",
            self.child.id(),
            removal.unwrap_or_default(),
        )
    }

    /// Gives up on the server after a failed run: kills it, removes its directory, and returns
    /// a line with the last lines of its log, to add to the run's error.
    pub fn abandon(mut self) -> String {
        self.fail("was killed after the run failed").to_string()
    }

    /// Sends SIGTERM and waits for a clean exit; the data directory is removed after one.
    ///
    /// # Errors
    /// The signal cannot be sent, the server exits non-zero, or it is still running after
    /// [`SERVER_STOP_TIMEOUT`] (it is then killed).
    pub fn stop(mut self) -> anyhow::Result<()> {
        let pid = libc::pid_t::try_from(self.child.id()).context("server pid out of range")?;
        // SAFETY: kill(2) only sends a signal; the pid is our own child, which we have not reaped.
        if unsafe { libc::kill(pid, libc::SIGTERM) } != 0 {
            let error = std::io::Error::last_os_error();
            return Err(self.fail(&format!("could not be sent SIGTERM: {error}")));
        }
        match self.wait_for_exit(SERVER_STOP_TIMEOUT) {
            Some(status) if status.success() => Ok(()),
            Some(status) => Err(self.fail(&format!("exited with {status} after SIGTERM"))),
            None => Err(self.fail(&format!(
                "was still running {} s after SIGTERM and was killed",
                SERVER_STOP_TIMEOUT.as_secs()
            ))),
        }
    }
}

impl Drop for EmbeddedServer {
    /// Kills the child if it still runs and removes the run directory, under the active-run
    /// lock (after a clean stop this is only the directory).
    fn drop(&mut self) {
        let mut run_guard = interrupt::lock();
        if let Some(dir) = &self.dir {
            run_guard.forget(dir.path());
        }
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
        // TempDir's drop removes the directory; an error there is ignored as before.
        drop(self.dir.take());
        drop(run_guard);
    }
}

/// Whether `path` lies on tmpfs (statfs(2) `f_type` is `TMPFS_MAGIC`): memory, where fsync
/// costs nothing, so a bench there does not measure a disk.
///
/// # Errors
/// statfs fails (the path is gone, or holds a NUL byte).
pub fn is_on_tmpfs(path: &Path) -> std::io::Result<bool> {
    let path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut stats = std::mem::MaybeUninit::<libc::statfs>::uninit();
    // SAFETY: `path` is NUL-terminated and outlives the call; `stats` is writable and sized for
    // the struct statfs(2) fills.
    let rc = unsafe { libc::statfs(path.as_ptr(), stats.as_mut_ptr()) };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: statfs returned 0, so it initialized `stats`.
    let stats = unsafe { stats.assume_init() };
    Ok(stats.f_type == libc::TMPFS_MAGIC)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_listening_line() {
        assert_eq!(
            parse_listening_line("listening on 127.0.0.1:40123\n"),
            Some(SocketAddr::from(([127, 0, 0, 1], 40123)))
        );
        assert_eq!(parse_listening_line("listening on nowhere"), None);
        assert_eq!(parse_listening_line("INFO shard 0 ready"), None);
    }

    #[test]
    fn serve_args_pass_only_given_flags() {
        let plain = ServerOptions::default().serve_args(Path::new("/d"), "all");
        assert_eq!(
            plain,
            [
                "serve",
                "--listen",
                "127.0.0.1:0",
                "--data-dir",
                "/d",
                "--shards",
                "all"
            ]
            .map(OsString::from)
        );
        let options = ServerOptions {
            fsync: Some("never".to_string()),
            write_mode: Some("direct".to_string()),
            cpus: Some("0-3".to_string()),
            no_pin: true,
            io_driver: Some("poll".to_string()),
            inbox_capacity: Some(64),
            idle_poll_us: Some(50),
        };
        let args: Vec<String> = options
            .serve_args(Path::new("/d"), "2")
            .into_iter()
            .map(|arg| arg.into_string().unwrap())
            .collect();
        assert_eq!(
            args.join(" "),
            "serve --listen 127.0.0.1:0 --data-dir /d --shards 2 --fsync never \
             --write-mode direct --cpus 0-3 --io-driver poll --inbox-capacity 64 \
             --idle-poll-us 50 --no-pin"
        );
    }

    fn vars(pairs: &[(&str, &str)]) -> Vec<(OsString, OsString)> {
        pairs
            .iter()
            .map(|(name, value)| (OsString::from(name), OsString::from(value)))
            .collect()
    }

    #[test]
    fn every_shardline_variable_but_the_log_filter_is_ignored() {
        let ignored = ignored_server_variables(vars(&[
            ("SHARDLINE_WRITE_MODE", "direct"),
            ("PATH", "/bin"),
            ("SHARDLINE_LOG", "debug"),
            ("SHARDLINE_FSYNC", "never"),
            ("RUST_LOG", "info"),
            ("SHARDLINE_CONFIG", "/etc/shardline.toml"),
            ("SHARDLINE_SEGMENT_SIZE", "1048576"),
            ("SHARDLINE_NO_PIN", "true"),
        ]));
        let names: Vec<&str> = ignored.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "SHARDLINE_CONFIG",
                "SHARDLINE_FSYNC",
                "SHARDLINE_NO_PIN",
                "SHARDLINE_SEGMENT_SIZE",
                "SHARDLINE_WRITE_MODE"
            ]
        );
        assert_eq!(
            ignored_variables_line(&ignored).unwrap(),
            "bench: the embedded server ignores \
             SHARDLINE_CONFIG=/etc/shardline.toml (the bench reads no config file; pass its \
             settings as bench flags), SHARDLINE_FSYNC=never (pass --fsync never), \
             SHARDLINE_NO_PIN=true (pass --no-pin to unpin), SHARDLINE_SEGMENT_SIZE=1048576 (no bench \
             flag sets it; the server's default is used), SHARDLINE_WRITE_MODE=direct (pass \
             --write-mode direct); the bench passes its settings as flags, so the report shows \
             what the server runs"
        );
        assert_eq!(ignored_variables_line(&[]), None);
        // Settings the bench itself decides (review finding: these were told "no bench flag
        // sets it; the server's default is used", which is false).
        let owned = ignored_server_variables(vars(&[
            ("SHARDLINE_DATA_DIR", "/srv/d"),
            ("SHARDLINE_LISTEN", "0.0.0.0:8090"),
            ("SHARDLINE_ADDR", "10.0.0.1:8090"),
        ]));
        let advice: Vec<String> = owned.iter().map(IgnoredVariable::advice).collect();
        assert_eq!(
            advice,
            [
                "a client setting; pass --addr to bench an existing server",
                "each run's data directory is under --data-root",
                "the bench's server listens on a free loopback port",
            ]
        );
    }

    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt as _;
        let path = dir.join("fake-shardline");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[test]
    fn a_child_that_exits_early_is_reported_with_its_status_and_stderr() {
        let root = tempfile::tempdir().unwrap();
        let exe = script(root.path(), "echo \"cannot bind: $*\" >&2; exit 3");
        let error = EmbeddedServer::start(&exe, "1", &ServerOptions::default(), Some(root.path()))
            .unwrap_err()
            .to_string();
        // Depending on which the bench notices first: the exit, or stdout closing.
        assert!(error.contains("exited with exit status: 3"), "{error}");
        assert!(
            error.contains("before listening") || error.contains("closed stdout"),
            "{error}"
        );
        assert!(
            error.contains("cannot bind: serve --listen 127.0.0.1:0 --data-dir"),
            "{error}"
        );
        assert!(
            error.contains("was removed; last lines of its stderr:"),
            "{error}"
        );
        let left: Vec<_> = std::fs::read_dir(root.path())
            .unwrap()
            .map(|entry| entry.unwrap().file_name())
            .filter(|name| name.to_string_lossy().starts_with("shardline-bench-"))
            .collect();
        assert_eq!(
            left,
            Vec::<std::ffi::OsString>::new(),
            "the run directory is removed"
        );
    }

    #[test]
    fn a_child_that_listens_is_stopped_with_sigterm() {
        let root = tempfile::tempdir().unwrap();
        // Prints the line, then exits 0 on SIGTERM like the real server.
        let exe = script(
            root.path(),
            "trap 'exit 0' TERM; echo 'listening on 127.0.0.1:4567'; while :; do sleep 0.05; done",
        );
        let server =
            EmbeddedServer::start(&exe, "2", &ServerOptions::default(), Some(root.path())).unwrap();
        assert_eq!(server.addr(), SocketAddr::from(([127, 0, 0, 1], 4567)));
        assert!(server.pid() > 0);
        let run_dir = server.run_dir().unwrap().to_path_buf();
        assert!(run_dir.starts_with(root.path()), "{}", run_dir.display());
        assert_eq!(server.data_dir().unwrap(), run_dir.join("data"));
        assert!(run_dir.join("data").is_dir());
        server.stop().unwrap();
    }
}
