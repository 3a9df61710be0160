//! Mesh behaviour across real threads and compio runtimes: delivery, reply lane, full inboxes,
//! disconnected shards. Never asserts on timing.

use std::sync::atomic::Ordering;

use runtime::{MeshSendError, PumpEvent, ShardId, mesh};

const FRAME_COUNT: u64 = 2000;
const WINDOW: u64 = 32;

/// Shard 0 sends `FRAME_COUNT` frames to shard 1 (at most `WINDOW` outstanding, so neither lane
/// can overflow), shard 1 answers each on shard 0's reply lane with `frame * 2`; both shards run
/// their own compio runtime on their own thread, woken across threads by crossfire.
#[test]
fn two_shards_exchange_frames_and_replies_under_compio() {
    let mut shards = mesh::<u64>(2, WINDOW as usize);
    let (endpoint_1, mut pump_1) = shards.pop().unwrap();
    let (endpoint_0, mut pump_0) = shards.pop().unwrap();
    let stop = endpoint_0.stop_handle();

    let shard_1 = std::thread::spawn(move || {
        compio::runtime::Runtime::new()
            .unwrap()
            .block_on(async move {
                let mut served = 0_u64;
                loop {
                    match pump_1.next().await {
                        PumpEvent::Stop => return served,
                        PumpEvent::Tick => {}
                        PumpEvent::Inbox(batch) => {
                            for envelope in batch {
                                assert_eq!((envelope.from, envelope.to), (ShardId(0), ShardId(1)));
                                endpoint_1
                                    .try_send_reply(envelope.from, envelope.frame * 2)
                                    .unwrap();
                                served += 1;
                            }
                        }
                        PumpEvent::Reply(batch) => panic!("shard 1 got replies: {batch:?}"),
                    }
                }
            })
    });

    let (reply_count, reply_sum) = compio::runtime::Runtime::new().unwrap().block_on(async {
        let mut next_frame = 0_u64;
        let mut reply_count = 0_u64;
        let mut reply_sum = 0_u64;
        while reply_count < FRAME_COUNT {
            while next_frame < FRAME_COUNT && next_frame - reply_count < WINDOW {
                endpoint_0.try_send(ShardId(1), next_frame).unwrap();
                next_frame += 1;
            }
            match pump_0.next().await {
                PumpEvent::Reply(batch) => {
                    for envelope in batch {
                        assert_eq!((envelope.from, envelope.to), (ShardId(1), ShardId(0)));
                        reply_count += 1;
                        reply_sum += envelope.frame;
                    }
                }
                PumpEvent::Tick => {}
                other => panic!("shard 0 got {other:?}"),
            }
        }
        (reply_count, reply_sum)
    });
    stop.stop();
    let served = shard_1.join().unwrap();

    assert_eq!(served, FRAME_COUNT);
    assert_eq!(reply_count, FRAME_COUNT);
    assert_eq!(reply_sum, FRAME_COUNT * (FRAME_COUNT - 1));
    let stats = endpoint_0.stats();
    assert_eq!(stats.inbox_full_count[0].load(Ordering::Relaxed), 0);
    assert_eq!(stats.inbox_full_count[1].load(Ordering::Relaxed), 0);
    assert_eq!(stats.misrouted_count.load(Ordering::Relaxed), 0);
}

#[test]
fn full_inbox_hands_the_frame_back_and_is_counted() {
    let mut shards = mesh::<String>(2, 2);
    let (_endpoint_1, _pump_1) = shards.pop().unwrap();
    let (endpoint_0, _pump_0) = shards.pop().unwrap();
    endpoint_0.try_send(ShardId(1), "a".to_owned()).unwrap();
    endpoint_0.try_send(ShardId(1), "b".to_owned()).unwrap();
    let error = endpoint_0.try_send(ShardId(1), "c".to_owned()).unwrap_err();
    assert_eq!(error.to_string(), "inbox of the target shard is full");
    let MeshSendError::Full(frame) = error else {
        panic!("expected Full, got {error:?}")
    };
    assert_eq!(frame, "c");
    let stats = endpoint_0.stats();
    assert_eq!(stats.inbox_full_count[1].load(Ordering::Relaxed), 1);
    assert_eq!(stats.inbox_full_count[0].load(Ordering::Relaxed), 0);

    // The reply lane is separate: a full inbox leaves it open.
    endpoint_0
        .try_send_reply(ShardId(1), "r1".to_owned())
        .unwrap();
    endpoint_0
        .try_send_reply(ShardId(1), "r2".to_owned())
        .unwrap();
    let error = endpoint_0
        .try_send_reply(ShardId(1), "r3".to_owned())
        .unwrap_err();
    assert_eq!(error.into_inner(), "r3");
    assert_eq!(stats.inbox_full_count[1].load(Ordering::Relaxed), 2);
}

#[test]
fn clone_sender_shares_lanes_and_stats() {
    let mut shards = mesh::<u8>(2, 1);
    let (_endpoint_1, _pump_1) = shards.pop().unwrap();
    let (endpoint_0, _pump_0) = shards.pop().unwrap();
    let task_sender = endpoint_0.clone_sender();
    assert_eq!(task_sender.shard_id(), ShardId(0));
    assert_eq!(task_sender.shard_count(), 2);
    task_sender.try_send(ShardId(1), 1).unwrap();
    assert!(matches!(
        endpoint_0.try_send(ShardId(1), 2),
        Err(MeshSendError::Full(2))
    ));
    assert_eq!(
        task_sender.stats().inbox_full_count[1].load(Ordering::Relaxed),
        1
    );
}

#[test]
fn stopped_shard_is_disconnected() {
    let mut shards = mesh::<u8>(2, 4);
    let (endpoint_1, pump_1) = shards.pop().unwrap();
    let (endpoint_0, _pump_0) = shards.pop().unwrap();
    drop(pump_1);
    drop(endpoint_1);
    let error = endpoint_0.try_send(ShardId(1), 5).unwrap_err();
    assert_eq!(error.to_string(), "target shard has stopped");
    assert!(matches!(error, MeshSendError::Disconnected(5)));
    assert_eq!(
        endpoint_0.stats().inbox_full_count[1].load(Ordering::Relaxed),
        0
    );
}

#[test]
#[should_panic(expected = "ShardId(2) is outside a mesh of 2 shards")]
fn sending_outside_the_mesh_is_a_bug() {
    let shards = mesh::<u8>(2, 4);
    let _ = shards[0].0.try_send(ShardId(2), 1);
}
