//! SIGINT/SIGTERM handling of a `ShardSet`: the first signal stops the shards, a second one while
//! stopping exits the process with code 130 (checked in a child process: this very test binary,
//! re-run with `SHARDLINE_SIGNAL_CHILD=1`).

use std::time::{Duration, Instant};

use runtime::{
    IoDriver, LaunchConfig, PumpEvent, ShardContext, ShardFuture, ShardSet, Topology, allowed_cpus,
};

const CHILD_ENV: &str = "SHARDLINE_SIGNAL_CHILD";
const HANG_GUARD: Duration = Duration::from_mins(1);

fn one_unpinned_shard() -> LaunchConfig {
    LaunchConfig {
        topology: Topology {
            shard_cores: vec![None],
            allowed_cpus: allowed_cpus().unwrap(),
        },
        io_driver: IoDriver::IoUring,
        inbox_capacity: 4,
        idle_poll: Duration::ZERO,
    }
}

fn send_sigterm_to_self() {
    // SAFETY: kill(2) with our own pid and a signal that `stop_on_signals` has a handler for.
    let rc = unsafe { libc::kill(libc::getpid(), libc::SIGTERM) };
    assert_eq!(rc, 0);
}

#[test]
fn first_signal_stops_the_shards() {
    if std::env::var_os(CHILD_ENV).is_some() {
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
    if std::env::var_os(CHILD_ENV).is_some() {
        return;
    }
    let status = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "signal_child", "--test-threads=1", "--nocapture"])
        .env(CHILD_ENV, "1")
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(130), "{status:?}");
}
