//! The launcher end to end: real shard threads, compio runtimes, the ready barrier, the stop
//! signal, failure and panic propagation. Blocking receives carry a generous hang guard, never a
//! timing assertion.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::time::Duration;

use compio::driver::DriverType;
use runtime::{
    IoDriver, LaunchConfig, LaunchError, MeshSendError, PumpEvent, ShardContext, ShardFuture,
    ShardId, ShardSet, Topology, allowed_cpus,
};

const HANG_GUARD: Duration = Duration::from_mins(1);

fn unpinned(shard_count: usize, io_driver: IoDriver) -> LaunchConfig {
    LaunchConfig {
        topology: Topology {
            shard_cores: vec![None; shard_count],
            allowed_cpus: allowed_cpus().unwrap(),
        },
        io_driver,
        inbox_capacity: 16,
        idle_poll: Duration::ZERO,
        shutdown_deadline: Duration::from_secs(30),
    }
}

/// Runs the pump until `Stop`, ignoring everything else.
async fn until_stop(context: &mut ShardContext<u32>) {
    loop {
        if let PumpEvent::Stop = context.pump.next().await {
            return;
        }
    }
}

#[test]
fn unpinned_shards_pass_the_barrier_exchange_frames_and_stop() {
    let (report_tx, report_rx) = mpsc::channel::<(u16, &'static str, u32)>();
    let set = ShardSet::launch(
        &unpinned(2, IoDriver::IoUring),
        move |mut context| -> ShardFuture {
            let report = report_tx.clone();
            Box::pin(async move {
                assert_eq!(context.shard_count, 2);
                assert_eq!(context.core, None);
                context.ready_barrier().await;
                let me = context.shard_id.0;
                let peer = ShardId(1 - me);
                context
                    .endpoint
                    .try_send(peer, u32::from(me) + 100)
                    .map_err(|e| e.to_string())?;
                loop {
                    match context.pump.next().await {
                        PumpEvent::Stop => {
                            report.send((me, "stop", 0)).unwrap();
                            return Ok(());
                        }
                        PumpEvent::Inbox(batch) => {
                            for envelope in batch {
                                assert_eq!(envelope.from, peer);
                                report.send((me, "frame", envelope.frame)).unwrap();
                            }
                        }
                        PumpEvent::Tick | PumpEvent::Reply(_) => {}
                    }
                }
            })
        },
    )
    .unwrap();
    set.wait_ready().unwrap();
    let mut frames = vec![
        report_rx.recv_timeout(HANG_GUARD).unwrap(),
        report_rx.recv_timeout(HANG_GUARD).unwrap(),
    ];
    frames.sort_unstable();
    assert_eq!(frames, vec![(0, "frame", 101), (1, "frame", 100)]);
    set.stop_handle().stop();
    let mut stops = vec![
        report_rx.recv_timeout(HANG_GUARD).unwrap(),
        report_rx.recv_timeout(HANG_GUARD).unwrap(),
    ];
    stops.sort_unstable();
    assert_eq!(stops, vec![(0, "stop", 0), (1, "stop", 0)]);
    set.join().unwrap();
}

#[test]
fn a_panicking_shard_stops_the_others_and_join_names_it() {
    let set = ShardSet::launch(
        &unpinned(3, IoDriver::IoUring),
        |mut context| -> ShardFuture {
            Box::pin(async move {
                context.ready_barrier().await;
                // The panic under test: shard 1 fails this assertion.
                assert!(context.shard_id != ShardId(1), "shard one broke");
                until_stop(&mut context).await;
                Ok(())
            })
        },
    )
    .unwrap();
    let error = set.join().unwrap_err();
    assert!(
        matches!(&error, LaunchError::Panicked { shard: 1, message } if message == "shard one broke"),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "shard 1 panicked: shard one broke");
}

#[test]
fn a_panic_before_the_barrier_releases_the_waiters() {
    let set = ShardSet::launch(
        &unpinned(2, IoDriver::IoUring),
        |mut context| -> ShardFuture {
            Box::pin(async move {
                // The panic under test, with a formatted (`String`) payload.
                assert!(
                    context.shard_id != ShardId(0),
                    "recovery failed: {}",
                    "bad superblock"
                );
                context.ready_barrier().await;
                assert!(context.endpoint.stop_handle().is_stopped());
                until_stop(&mut context).await;
                Ok(())
            })
        },
    )
    .unwrap();
    let error = set.wait_ready().unwrap_err();
    assert_eq!(
        error.to_string(),
        "shard 0 panicked: recovery failed: bad superblock"
    );
    let error = set.join().unwrap_err();
    assert_eq!(
        error.to_string(),
        "shard 0 panicked: recovery failed: bad superblock"
    );
}

#[test]
fn a_failing_shard_is_an_error_naming_it() {
    let set = ShardSet::launch(
        &unpinned(2, IoDriver::IoUring),
        |mut context| -> ShardFuture {
            Box::pin(async move {
                context.ready_barrier().await;
                if context.shard_id == ShardId(1) {
                    return Err("disk full".to_owned());
                }
                until_stop(&mut context).await;
                Ok(())
            })
        },
    )
    .unwrap();
    let error = set.join().unwrap_err();
    assert!(
        matches!(error, LaunchError::Shard { shard: 1, .. }),
        "{error:?}"
    );
    assert_eq!(error.to_string(), "shard 1: disk full");
}

#[test]
fn a_shard_exiting_before_the_barrier_fails_wait_ready_only() {
    let set = ShardSet::launch(
        &unpinned(2, IoDriver::IoUring),
        |mut context| -> ShardFuture {
            Box::pin(async move {
                if context.shard_id == ShardId(1) {
                    return Ok(());
                }
                context.ready_barrier().await;
                until_stop(&mut context).await;
                Ok(())
            })
        },
    )
    .unwrap();
    let error = set.wait_ready().unwrap_err();
    assert_eq!(
        error.to_string(),
        "shard 1: exited before it reported ready"
    );
    set.join().unwrap();
}

#[test]
fn a_shard_ending_ok_after_the_barrier_leaves_the_others_running() {
    let (report_tx, report_rx) = mpsc::channel::<bool>();
    let set = ShardSet::launch(
        &unpinned(2, IoDriver::IoUring),
        move |mut context| -> ShardFuture {
            let report = report_tx.clone();
            Box::pin(async move {
                context.ready_barrier().await;
                if context.shard_id == ShardId(1) {
                    return Ok(());
                }
                // Shard 1 is gone once its inbox refuses with Disconnected.
                loop {
                    match context.pump.next().await {
                        PumpEvent::Stop => return Ok(()),
                        PumpEvent::Tick => match context.endpoint.try_send(ShardId(1), 1) {
                            Err(MeshSendError::Disconnected(_)) => {
                                report
                                    .send(context.endpoint.stop_handle().is_stopped())
                                    .unwrap();
                            }
                            Ok(()) | Err(MeshSendError::Full(_)) => {}
                        },
                        PumpEvent::Inbox(_) | PumpEvent::Reply(_) => {}
                    }
                }
            })
        },
    )
    .unwrap();
    set.wait_ready().unwrap();
    assert!(
        !report_rx.recv_timeout(HANG_GUARD).unwrap(),
        "shard 1 ending Ok fired stop"
    );
    set.stop_handle().stop();
    set.join().unwrap();
}

fn driver_of(io_driver: IoDriver) -> DriverType {
    let (report_tx, report_rx) = mpsc::channel::<DriverType>();
    let set = ShardSet::launch(
        &unpinned(1, io_driver),
        move |context: ShardContext<u32>| -> ShardFuture {
            let report = report_tx.clone();
            Box::pin(async move {
                context.ready_barrier().await;
                let driver =
                    compio::runtime::Runtime::with_current(compio::runtime::Runtime::driver_type);
                report.send(driver).unwrap();
                Ok(())
            })
        },
    )
    .unwrap();
    set.wait_ready().unwrap();
    set.join().unwrap();
    report_rx.recv_timeout(HANG_GUARD).unwrap()
}

#[test]
fn poll_driver_is_forced() {
    assert_eq!(driver_of(IoDriver::Poll), DriverType::Poll);
}

#[test]
fn io_uring_driver_is_forced() {
    assert_eq!(driver_of(IoDriver::IoUring), DriverType::IoUring);
}

#[test]
fn a_pinned_shard_runs_on_its_cpu() {
    let allowed = allowed_cpus().unwrap();
    let cpu = *allowed.last().unwrap();
    let config = LaunchConfig {
        topology: Topology {
            shard_cores: vec![Some(cpu)],
            allowed_cpus: allowed,
        },
        io_driver: IoDriver::IoUring,
        inbox_capacity: 4,
        idle_poll: Duration::ZERO,
        shutdown_deadline: Duration::from_secs(30),
    };
    let (report_tx, report_rx) = mpsc::channel();
    let set = ShardSet::launch(&config, move |context: ShardContext<u32>| -> ShardFuture {
        let report = report_tx.clone();
        Box::pin(async move {
            report
                .send((
                    context.core,
                    allowed_cpus().unwrap(),
                    std::thread::current().name().map(str::to_owned),
                ))
                .unwrap();
            Ok(())
        })
    })
    .unwrap();
    set.join().unwrap();
    let (core, mask, name) = report_rx.recv_timeout(HANG_GUARD).unwrap();
    assert_eq!(core, Some(cpu));
    assert_eq!(mask, vec![cpu]);
    assert_eq!(name.as_deref(), Some("shard-0"));
}

#[test]
fn an_unusable_cpu_fails_the_launch_before_any_shard_runs() {
    let allowed = allowed_cpus().unwrap();
    let cpu = (0..=4095).rev().find(|cpu| !allowed.contains(cpu)).unwrap();
    let config = LaunchConfig {
        topology: Topology {
            shard_cores: vec![None, Some(cpu)],
            allowed_cpus: allowed,
        },
        io_driver: IoDriver::IoUring,
        inbox_capacity: 4,
        idle_poll: Duration::ZERO,
        shutdown_deadline: Duration::from_secs(30),
    };
    let ran = Arc::new(AtomicBool::new(false));
    let ran_in_shard = Arc::clone(&ran);
    let error = ShardSet::launch::<u32, _>(&config, move |_context| -> ShardFuture {
        ran_in_shard.store(true, Ordering::SeqCst);
        Box::pin(async { Ok(()) })
    })
    .unwrap_err();
    assert!(
        matches!(error, LaunchError::Pin { shard: 1, cpu: c } if c == cpu),
        "{error:?}"
    );
    assert_eq!(
        error.to_string(),
        format!("failed to start shard 1: cannot pin its thread to CPU {cpu}")
    );
    assert!(!ran.load(Ordering::SeqCst));
}

#[test]
fn a_shard_that_ignores_stop_is_reported_after_the_shutdown_deadline() {
    let mut config = unpinned(2, IoDriver::IoUring);
    config.shutdown_deadline = Duration::from_millis(300);
    let set = ShardSet::launch(&config, |mut context| -> ShardFuture {
        Box::pin(async move {
            context.ready_barrier().await;
            if context.shard_id == ShardId(1) {
                // Never looks at its pump again: a shard stuck in a flush.
                loop {
                    compio::time::sleep(Duration::from_millis(20)).await;
                }
            }
            until_stop(&mut context).await;
            Ok(())
        })
    })
    .unwrap();
    set.wait_ready().unwrap();
    set.stop_handle().stop();
    match set.join() {
        Err(LaunchError::ShutdownDeadline { shards, .. }) => assert_eq!(shards, vec![1]),
        other => panic!("expected ShutdownDeadline for shard 1, got {other:?}"),
    }
}
