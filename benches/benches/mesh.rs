//! Criterion micro-benchmark of one mesh round trip: shard A `try_send`s a frame to shard B's
//! inbox and awaits B's answer on its own reply lane, each shard on its own thread and compio
//! runtime, pinned to two allowed CPUs when there are at least two (else unpinned). Measures the
//! mesh only: it never touches files or sockets, and never asserts on time.

use std::time::{Duration, Instant};

use criterion::{Criterion, criterion_group, criterion_main};
use runtime::limits::INBOX_CAPACITY_DEFAULT;
use runtime::{PumpEvent, ShardId, allowed_cpus, block_on_with_idle_poll, mesh};

const SHARD_A: ShardId = ShardId(0);
const SHARD_B: ShardId = ShardId(1);

fn pin_current_thread(cpu: Option<usize>) {
    if let Some(cpu) = cpu {
        assert!(
            core_affinity::set_for_current(core_affinity::CoreId { id: cpu }),
            "cannot pin to CPU {cpu}"
        );
    }
}

/// Idle poll window of the idle-poll variant: long enough to cover a round trip on a slow VM.
const IDLE_POLL: Duration = Duration::from_micros(200);

fn mesh_round_trip(c: &mut Criterion) {
    // Read once: the first run pins this thread, which narrows its affinity mask.
    let allowed = allowed_cpus().expect("read the affinity mask");
    round_trip(c, &allowed, Duration::ZERO);
    round_trip(c, &allowed, IDLE_POLL);
}

/// One round-trip benchmark; `idle_poll` zero parks idle shards at once (the server default).
fn round_trip(c: &mut Criterion, allowed: &[usize], idle_poll: Duration) {
    let (cpu_a, cpu_b) = if allowed.len() >= 2 {
        (Some(allowed[0]), Some(allowed[1]))
    } else {
        (None, None)
    };
    let mut shards = mesh::<u64>(2, INBOX_CAPACITY_DEFAULT);
    let (endpoint_b, mut pump_b) = shards.pop().expect("shard B");
    let (endpoint_a, mut pump_a) = shards.pop().expect("shard A");
    let stop = endpoint_a.stop_handle();

    // Shard B: echo every inbox frame back on the sender's reply lane until stopped.
    let shard_b = std::thread::Builder::new()
        .name("shard-1".to_owned())
        .spawn(move || {
            pin_current_thread(cpu_b);
            let runtime = compio::runtime::Runtime::new().expect("shard B runtime");
            block_on_with_idle_poll(
                &runtime,
                async move {
                    loop {
                        match pump_b.next().await {
                            PumpEvent::Stop => return,
                            PumpEvent::Inbox(batch) => {
                                for envelope in batch {
                                    // One frame is in flight at a time, so the reply lane has room.
                                    endpoint_b
                                        .try_send_reply(envelope.from, envelope.frame)
                                        .expect("reply lane has room");
                                }
                            }
                            PumpEvent::Tick | PumpEvent::Reply(_) => {}
                        }
                    }
                },
                idle_poll,
            );
        })
        .expect("spawn shard B");

    // Shard A is the benchmark thread itself, so criterion's clock wraps the whole round trip.
    pin_current_thread(cpu_a);
    let runtime = compio::runtime::Runtime::new().expect("shard A runtime");
    let name = format!(
        "mesh/round_trip_{}_idle_poll_{}us",
        if cpu_a.is_some() {
            "pinned"
        } else {
            "unpinned"
        },
        idle_poll.as_micros()
    );
    c.bench_function(&name, |bencher| {
        bencher.iter_custom(|iteration_count| {
            block_on_with_idle_poll(
                &runtime,
                async {
                    let started = Instant::now();
                    for frame in 0..iteration_count {
                        endpoint_a.try_send(SHARD_B, frame).expect("inbox has room");
                        loop {
                            match pump_a.next().await {
                                PumpEvent::Reply(batch) => {
                                    assert_eq!(batch.len(), 1);
                                    assert_eq!((batch[0].from, batch[0].to), (SHARD_B, SHARD_A));
                                    assert_eq!(batch[0].frame, frame);
                                    break;
                                }
                                PumpEvent::Tick => {}
                                other => panic!("shard A got {other:?}"),
                            }
                        }
                    }
                    started.elapsed()
                },
                idle_poll,
            )
        });
    });

    stop.stop();
    shard_b.join().expect("shard B ended cleanly");
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3))
        .sample_size(20);
    targets = mesh_round_trip
}
criterion_main!(benches);
