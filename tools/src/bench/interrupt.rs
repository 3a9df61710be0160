//! Ctrl-C during `shardline bench`: stop the embedded server, remove the run's directory, say
//! what was removed, and exit 130 (128 + SIGINT, the shell's convention). Without this, SIGINT
//! killed the bench before `EmbeddedServer`'s drop ran, leaving the server running and its data
//! directory (up to the whole run's bytes) on disk.
//!
//! The embedded server runs in a process group of its own (`server.rs`), so a terminal's Ctrl-C
//! reaches only the bench, and this module decides what happens to the server. One run is
//! active at a time; [`ACTIVE_RUN`] names its server and directory. Whoever changes that run's
//! state (starting it, stopping it, removing its directory) holds the lock for the change, so the
//! SIGINT thread never removes a directory the main thread is still creating, nor the other way
//! round; the SIGINT thread keeps the lock until the process exits.
//!
//! The report outputs this bench created (`--json`, `--csv`, `--charts`) and has not yet written
//! are listed in [`CREATED_OUTPUTS`] under a lock of their own, and a stop signal removes them
//! too: the exit skips every drop, and an empty report file would pass for a report.
//!
//! Must never remove anything but the active run's directory and the outputs this bench created,
//! never a non-empty directory of outputs, and never signal any process but the bench's own
//! unreaped child: every reap of it happens under the active-run lock, which then forgets its pid.

use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard, PoisonError};

use anyhow::Context as _;

/// Exit status after SIGINT: 128 + the signal number (bash(1), "EXIT STATUS"); SIGTERM and
/// SIGHUP exit with 128 + theirs ([`exit_code`]).
pub const INTERRUPTED_EXIT_CODE: i32 = 128 + libc::SIGINT;

/// The signals that stop a bench run and clean it up: Ctrl-C, `kill`, and a closed terminal
/// (the embedded server is in its own process group, so none of them reaches it directly).
const STOP_SIGNALS: [i32; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

/// The exit status after stop signal `signal`: 128 + its number.
pub fn exit_code(signal: i32) -> i32 {
    128 + signal
}

/// The run a SIGINT must clean up: the embedded server's pid (once spawned) and its run
/// directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ActiveRun {
    pub server_pid: Option<u32>,
    pub run_dir: PathBuf,
}

/// The active run, if any. See the module comment for who holds the lock and when.
static ACTIVE_RUN: Mutex<Option<ActiveRun>> = Mutex::new(None);

/// Holds the active-run lock; the SIGINT thread waits while one is alive.
#[derive(Debug)]
pub struct RunGuard(MutexGuard<'static, Option<ActiveRun>>);

impl RunGuard {
    /// Records `run` as the active run (replacing any other).
    pub fn set(&mut self, run: ActiveRun) {
        *self.0 = Some(run);
    }

    /// Forgets the active run if its directory is `run_dir` (its owner is cleaning it up).
    pub fn forget(&mut self, run_dir: &Path) {
        if self.0.as_ref().is_some_and(|run| run.run_dir == run_dir) {
            *self.0 = None;
        }
    }

    /// Forgets the active run's server if its pid is `pid`: the owner reaps it while holding this
    /// guard, after which the pid may belong to another process and must never be signalled.
    pub fn reaped(&mut self, pid: u32) {
        if let Some(run) = self.0.as_mut()
            && run.server_pid == Some(pid)
        {
            run.server_pid = None;
        }
    }
}

/// What kind of report output a run created, and so how [`remove_outputs`] removes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputKind {
    /// A `--json` or `--csv` file: removed.
    File,
    /// A `--charts` directory or one of its parents: removed only while empty.
    Dir,
}

/// A report output this bench created and has not yet written, named by its flag (`--csv`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CreatedOutput {
    pub flag: &'static str,
    pub path: PathBuf,
    pub kind: OutputKind,
}

/// The report outputs created by this bench and still waiting for their report, in the order
/// they were created. Taken after [`ACTIVE_RUN`] when both are needed, never before it.
static CREATED_OUTPUTS: Mutex<Vec<CreatedOutput>> = Mutex::new(Vec::new());

/// Holds the created-outputs lock; the SIGINT thread waits while one is alive, so an output is
/// never removed while it is being created or written.
#[derive(Debug)]
pub struct OutputsGuard(MutexGuard<'static, Vec<CreatedOutput>>);

impl OutputsGuard {
    /// Records `output`, just created by this bench: a stop signal removes it.
    pub fn created(&mut self, output: CreatedOutput) {
        self.0.push(output);
    }

    /// Forgets the output at `path`: its report is in it, or its owner removed it.
    pub fn forget(&mut self, path: &Path) {
        self.0.retain(|output| output.path != path);
    }
}

/// Takes the created-outputs lock (a poisoned lock still holds a valid `Vec`).
pub fn outputs_lock() -> OutputsGuard {
    OutputsGuard(
        CREATED_OUTPUTS
            .lock()
            .unwrap_or_else(PoisonError::into_inner),
    )
}

/// Takes the active-run lock (a poisoned lock still holds a valid `Option`).
pub fn lock() -> RunGuard {
    RunGuard(ACTIVE_RUN.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Whether [`install`] already started the SIGINT thread in this process.
static INSTALLED: std::sync::OnceLock<()> = std::sync::OnceLock::new();

/// Starts the thread that handles SIGINT, SIGTERM and SIGHUP for the rest of the process (once;
/// later calls do nothing): it waits for the lock, then [`clean_up`]s the active run, prints what
/// it did on stderr and exits with [`exit_code`] of the signal (130 for SIGINT).
///
/// # Errors
/// The signal handler cannot be registered, or the thread cannot be spawned.
pub fn install() -> anyhow::Result<()> {
    if INSTALLED.get().is_some() {
        return Ok(());
    }
    let mut signals = signal_hook::iterator::Signals::new(STOP_SIGNALS)
        .context("cannot register the SIGINT, SIGTERM and SIGHUP handlers")?;
    std::thread::Builder::new()
        .name("bench-sigint".to_string())
        .spawn(move || {
            if let Some(signal) = signals.forever().next() {
                let mut guard = lock();
                let mut outputs = outputs_lock();
                let mut line = clean_up(guard.0.take());
                for removed in remove_outputs(std::mem::take(&mut *outputs.0)) {
                    line.push_str("; ");
                    line.push_str(&removed);
                }
                // Err: stderr is gone; the exit status still says what happened.
                let _ = std::io::Write::write_all(
                    &mut std::io::stderr(),
                    format!("\ninterrupted: {line}\n").as_bytes(),
                );
                std::process::exit(exit_code(signal));
            }
        })
        .context("cannot spawn the SIGINT thread")?;
    let _ = INSTALLED.set(());
    Ok(())
}

/// Kills the run's server (SIGKILL: its data is about to be removed, a clean stop would only
/// delay the exit), reaps it, removes the run directory, and says what was done.
pub fn clean_up(run: Option<ActiveRun>) -> String {
    let Some(run) = run else {
        return "no embedded server was running and no run directory was left to remove"
            .to_string();
    };
    let stopped = run.server_pid.map(kill_and_reap);
    let removed = match std::fs::remove_dir_all(&run.run_dir) {
        Ok(()) => format!("removed the run directory {}", run.run_dir.display()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
            format!(
                "the run directory {} was already gone",
                run.run_dir.display()
            )
        }
        Err(error) => format!(
            "could not remove the run directory {}: {error}; remove it by hand",
            run.run_dir.display()
        ),
    };
    match stopped {
        Some(stopped) => format!("{stopped}; {removed}"),
        None => removed,
    }
}

/// Removes `outputs` (this bench's unwritten report files and the `--charts` directories it
/// created), the last created first, so a directory goes after what it held; a directory is
/// removed only while empty, so nothing else in it is ever lost. One line per output says what
/// was done.
pub fn remove_outputs(outputs: Vec<CreatedOutput>) -> Vec<String> {
    outputs
        .into_iter()
        .rev()
        .map(|output| {
            let (result, what) = match output.kind {
                OutputKind::File => (std::fs::remove_file(&output.path), "unwritten"),
                OutputKind::Dir => (std::fs::remove_dir(&output.path), "empty"),
            };
            let path = output.path.display();
            let flag = output.flag;
            match result {
                Ok(()) => format!("removed the {what} {flag} {path}"),
                Err(error) if error.kind() == std::io::ErrorKind::NotFound => {
                    format!("the {what} {flag} {path} was already gone")
                }
                Err(error) => format!("could not remove the {what} {flag} {path}: {error}"),
            }
        })
        .collect()
}

/// SIGKILLs `pid` (the bench's own child) and waits for it, so nothing writes into the run
/// directory while it is removed.
fn kill_and_reap(pid: u32) -> String {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return format!("the server pid {pid} is out of range and was not signalled");
    };
    // SAFETY: kill(2) only sends a signal; `pid` is the bench's own unreaped child: its owner
    // reaps it only while holding the active-run lock, and forgets the pid ([`RunGuard::reaped`])
    // before releasing it, so a pid still recorded here was not reaped.
    if unsafe { libc::kill(pid, libc::SIGKILL) } != 0 {
        let error = std::io::Error::last_os_error();
        // A clean stop reaps the child before its owner takes the lock to remove the directory.
        if error.raw_os_error() == Some(libc::ESRCH) {
            return format!("the embedded server (pid {pid}) had already exited");
        }
        return format!("could not stop the embedded server (pid {pid}): {error}");
    }
    let mut status = 0;
    // SAFETY: waitpid(2) on our own child; `status` is a writable int.
    if unsafe { libc::waitpid(pid, &raw mut status, 0) } < 0 {
        let error = std::io::Error::last_os_error();
        return format!("killed the embedded server (pid {pid}) but could not reap it: {error}");
    }
    format!("stopped the embedded server (pid {pid})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn with_no_active_run_nothing_is_removed() {
        assert_eq!(
            clean_up(None),
            "no embedded server was running and no run directory was left to remove"
        );
    }

    #[test]
    fn the_active_runs_child_is_stopped_and_its_directory_removed() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("shardline-bench-x");
        std::fs::create_dir_all(run_dir.join("data")).unwrap();
        std::fs::write(run_dir.join("server.log"), "log").unwrap();
        let child = std::process::Command::new("sleep")
            .arg("600")
            .spawn()
            .unwrap();
        let pid = child.id();
        let line = clean_up(Some(ActiveRun {
            server_pid: Some(pid),
            run_dir: run_dir.clone(),
        }));
        assert_eq!(
            line,
            format!(
                "stopped the embedded server (pid {pid}); removed the run directory {}",
                run_dir.display()
            )
        );
        assert!(!run_dir.exists());
        // Reaped: the pid is no longer our child.
        let mut status = 0;
        // SAFETY: a non-blocking waitpid on a pid we spawned; `status` is a writable int.
        let rc = unsafe {
            libc::waitpid(
                libc::pid_t::try_from(pid).unwrap(),
                &raw mut status,
                libc::WNOHANG,
            )
        };
        assert_eq!(rc, -1);
        std::mem::forget(child);
        assert_eq!(
            clean_up(Some(ActiveRun {
                server_pid: None,
                run_dir: run_dir.clone(),
            })),
            format!("the run directory {} was already gone", run_dir.display())
        );
    }

    #[test]
    fn a_server_that_already_exited_is_reported_as_such() {
        let root = tempfile::tempdir().unwrap();
        let run_dir = root.path().join("shardline-bench-y");
        std::fs::create_dir(&run_dir).unwrap();
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let pid = child.id();
        child.wait().unwrap();
        assert_eq!(
            clean_up(Some(ActiveRun {
                server_pid: Some(pid),
                run_dir: run_dir.clone(),
            })),
            format!(
                "the embedded server (pid {pid}) had already exited; removed the run directory {}",
                run_dir.display()
            )
        );
    }

    #[test]
    fn reaped_forgets_only_the_named_pid() {
        let mut guard = lock();
        let run = ActiveRun {
            server_pid: Some(7),
            run_dir: PathBuf::from("/tmp/r"),
        };
        guard.set(run.clone());
        guard.reaped(8);
        assert_eq!(guard.0.as_ref(), Some(&run));
        guard.reaped(7);
        assert_eq!(
            guard.0.as_ref(),
            Some(&ActiveRun {
                server_pid: None,
                run_dir: PathBuf::from("/tmp/r"),
            })
        );
        *guard.0 = None;
    }

    #[test]
    fn created_outputs_are_removed_last_first_and_a_non_empty_directory_stays() {
        let root = tempfile::tempdir().unwrap();
        let charts = root.path().join("out");
        let inner = charts.join("charts");
        std::fs::create_dir_all(&inner).unwrap();
        let json = inner.join("b.json");
        std::fs::write(&json, "").unwrap();
        let kept = root.path().join("kept");
        std::fs::create_dir(&kept).unwrap();
        std::fs::write(kept.join("user.txt"), "mine").unwrap();
        let output = |flag, path: &Path, kind| CreatedOutput {
            flag,
            path: path.to_path_buf(),
            kind,
        };
        let lines = remove_outputs(vec![
            output("--charts", &kept, OutputKind::Dir),
            output("--charts", &charts, OutputKind::Dir),
            output("--charts", &inner, OutputKind::Dir),
            output("--json", &json, OutputKind::File),
            output("--csv", &root.path().join("gone.csv"), OutputKind::File),
        ]);
        let shown = |path: &Path| path.display().to_string();
        assert_eq!(
            lines[0],
            format!(
                "the unwritten --csv {} was already gone",
                shown(&root.path().join("gone.csv"))
            )
        );
        assert_eq!(
            lines[1],
            format!("removed the unwritten --json {}", shown(&json))
        );
        assert_eq!(
            lines[2],
            format!("removed the empty --charts {}", shown(&inner))
        );
        assert_eq!(
            lines[3],
            format!("removed the empty --charts {}", shown(&charts))
        );
        assert!(
            lines[4].starts_with(&format!(
                "could not remove the empty --charts {}: ",
                shown(&kept)
            )),
            "{}",
            lines[4]
        );
        assert_eq!(lines.len(), 5);
        assert!(!charts.exists());
        assert_eq!(
            std::fs::read_to_string(kept.join("user.txt")).unwrap(),
            "mine"
        );
    }

    #[test]
    fn forget_clears_only_the_named_run() {
        let mut guard = lock();
        let run = ActiveRun {
            server_pid: None,
            run_dir: PathBuf::from("/tmp/a"),
        };
        guard.set(run.clone());
        guard.forget(Path::new("/tmp/b"));
        assert_eq!(guard.0.as_ref(), Some(&run));
        guard.forget(Path::new("/tmp/a"));
        assert_eq!(*guard.0, None);
    }
}
