//! SIGINT/SIGTERM handling of a `ShardSet`: the first signal stops the shards, a second one while
//! stopping exits the process with code 130 (checked in a child process: this very test binary,
//! re-run with `SHARDLINE_SIGNAL_CHILD=1`), also when every log write fails (stderr a closed pipe,
//! as under `serve 2>&1 | head`; child re-run with `SHARDLINE_BROKEN_LOG_CHILD`).

use std::time::{Duration, Instant};

use runtime::{
    IoDriver, LaunchConfig, PumpEvent, ShardContext, ShardFuture, ShardSet, Topology, allowed_cpus,
};

const CHILD_ENV: &str = "SHARDLINE_SIGNAL_CHILD";
const HANG_GUARD: Duration = Duration::from_mins(1);
const BROKEN_LOG_CHILD_ENV: &str = "SHARDLINE_BROKEN_LOG_CHILD";
/// Exit code of a broken-log child that was still running after `HANG_GUARD`.
const HUNG_EXIT_CODE: i32 = 3;

fn in_any_child() -> bool {
    std::env::var_os(CHILD_ENV).is_some() || std::env::var_os(BROKEN_LOG_CHILD_ENV).is_some()
}

fn one_unpinned_shard() -> LaunchConfig {
    LaunchConfig {
        topology: Topology {
            shard_cores: vec![None],
            allowed_cpus: allowed_cpus().unwrap(),
        },
        io_driver: IoDriver::IoUring,
        inbox_capacity: 4,
        idle_poll: Duration::ZERO,
        shutdown_deadline: Duration::from_secs(30),
    }
}

fn send_sigterm_to_self() {
    // SAFETY: kill(2) with our own pid and a signal that `stop_on_signals` has a handler for.
    let rc = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    assert_eq!(rc, 0);
}

#[test]
fn first_signal_stops_the_shards() {
    if in_any_child() {
        return;
    }
    let set = ShardSet::launch(
        &one_unpinned_shard(),
        |mut context: ShardContext<u8>| -> ShardFuture {
            Box::pin(async move {
                context.ready_barrier().await;
                loop {
                    if let PumpEvent::Stop = context.pump.next().await {
                        return Ok(());
                    }
                }
            })
        },
    )
    .unwrap();
    set.stop_on_signals().unwrap();
    set.wait_ready().unwrap();
    send_sigterm_to_self();
    set.join().unwrap();
}

/// Only does something in the child process that `second_signal_exits_with_130` starts.
#[test]
fn signal_child() {
    if std::env::var_os(CHILD_ENV).is_none() {
        return;
    }
    // The shard ignores the stop signal, so the set is still "stopping" at the second signal.
    let set = ShardSet::launch(
        &one_unpinned_shard(),
        |context: ShardContext<u8>| -> ShardFuture {
            Box::pin(async move {
                context.ready_barrier().await;
                compio::time::sleep(HANG_GUARD).await;
                Ok(())
            })
        },
    )
    .unwrap();
    set.stop_on_signals().unwrap();
    set.wait_ready().unwrap();
    let stop = set.stop_handle();
    send_sigterm_to_self();
    let started = Instant::now();
    while !stop.is_stopped() {
        assert!(
            started.elapsed() < HANG_GUARD,
            "the first signal never fired stop"
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    send_sigterm_to_self();
    std::thread::sleep(HANG_GUARD);
    panic!("the second signal did not end the process");
}

#[test]
fn second_signal_exits_with_130() {
    if in_any_child() {
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "signal_child", "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, "1")
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
}

/// Writes every event to stderr with `eprintln!`, as tracing-subscriber's fmt layer does to report
/// a failed write: it panics ("failed printing to stderr") once stderr is a closed pipe.
struct EprintlnSubscriber;

impl tracing::Subscriber for EprintlnSubscriber {
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, event: &tracing::Event<'_>) {
        eprintln!("{} {}", event.metadata().level(), event.metadata().name());
    }
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// Points fd 2 at a fresh pipe and returns the pipe's read end: closing it makes every later write
/// to stderr fail with EPIPE (Rust programs ignore SIGPIPE), as when `head` has exited.
fn stderr_into_pipe() -> libc::c_int {
    let mut fds = [0; 2];
    // SAFETY: pipe(2) fills the two-element array we own.
    assert_eq!(unsafe { libc::pipe(fds.as_mut_ptr()) }, 0);
    // SAFETY: dup2(2)/close(2) on fds this process owns; the old stderr is not needed.
    unsafe {
        assert_eq!(libc::dup2(fds[1], 2), 2);
        assert_eq!(libc::close(fds[1]), 0);
    }
    fds[0]
}

/// The child of the broken-log tests: stderr breaks after the shards are ready, then SIGTERM.
/// `shard_obeys_stop`: the first signal must end `join`; otherwise the set is still stopping at
/// the second signal, which must exit with 130.
fn broken_log_child(shard_obeys_stop: bool) {
    std::thread::spawn(|| {
        std::thread::sleep(HANG_GUARD);
        std::process::exit(HUNG_EXIT_CODE);
    });
    tracing::subscriber::set_global_default(EprintlnSubscriber).unwrap();
    let stderr_read_end = stderr_into_pipe();
    let set = ShardSet::launch(
        &one_unpinned_shard(),
        move |mut context: ShardContext<u8>| -> ShardFuture {
            Box::pin(async move {
                context.ready_barrier().await;
                if !shard_obeys_stop {
                    compio::time::sleep(HANG_GUARD).await;
                    return Ok(());
                }
                loop {
                    if let PumpEvent::Stop = context.pump.next().await {
                        return Ok(());
                    }
                }
            })
        },
    )
    .unwrap();
    set.stop_on_signals().unwrap();
    set.wait_ready().unwrap();
    // SAFETY: closes the read end this process owns; from here on every log write fails.
    assert_eq!(unsafe { libc::close(stderr_read_end) }, 0);
    send_sigterm_to_self();
    if shard_obeys_stop {
        set.join().unwrap();
        return;
    }
    let stop = set.stop_handle();
    while !stop.is_stopped() {
        std::thread::sleep(Duration::from_millis(1));
    }
    send_sigterm_to_self();
    std::thread::sleep(HANG_GUARD);
}

/// Only does something in the child process of `first_signal_stops_the_shards_when_logging_fails`.
#[test]
fn broken_log_child_obeying_shard() {
    if std::env::var_os(BROKEN_LOG_CHILD_ENV).is_some_and(|value| value == "obeying") {
        broken_log_child(true);
    }
}

/// Only does something in the child process of `second_signal_exits_with_130_when_logging_fails`.
#[test]
fn broken_log_child_ignoring_shard() {
    if std::env::var_os(BROKEN_LOG_CHILD_ENV).is_some_and(|value| value == "ignoring") {
        broken_log_child(false);
    }
}

fn run_broken_log_child(kind: &str) -> std::process::ExitStatus {
    std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            &format!("broken_log_child_{kind}_shard"),
            "--test-threads=1",
            "--nocapture",
        ])
        .env(BROKEN_LOG_CHILD_ENV, kind)
        .stdout(std::process::Stdio::null())
        .status()
        .unwrap()
}

#[test]
fn first_signal_stops_the_shards_when_logging_fails() {
    if in_any_child() {
        return;
    }
    let status = run_broken_log_child("obeying");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[test]
fn second_signal_exits_with_130_when_logging_fails() {
    if in_any_child() {
        return;
    }
    let status = run_broken_log_child("ignoring");
    assert_eq!(status.code(), Some(130), "{status:?}");
}
