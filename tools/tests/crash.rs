//! kill -9 of the server during sends with `--fsync always`: after restart every acknowledged
//! message is present and intact, and no batch is half-present.

mod common;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bus::{BatchBuilder, Namespace};
use common::{Server, block_on, read_all};

const PARTITION_COUNT: u16 = 4;
const BATCH_MESSAGE_COUNT: u64 = 10;

/// Per partition: acknowledged batches as (base_offset, batch number).
type AckedBatches = BTreeMap<u16, Vec<(u64, u64)>>;

/// Message id = batch number << 16 | index in batch; payload derived from the id.
fn payload(id: u64) -> Vec<u8> {
    format!("message {id:016x} ")
        .repeat(1 + (id % 7) as usize)
        .into_bytes()
}

#[test]
fn kill_9_during_sends_loses_no_acknowledged_message() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(
        &data_dir,
        &["--shards", "2", "--no-pin", "--fsync", "always"],
    );
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "crash").await.unwrap();
        client
            .create_topic(1, 1, "t", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
    });

    // Per partition: acknowledged batches as (base_offset, batch number).
    let acked: Arc<Mutex<AckedBatches>> = Arc::default();
    let acked_count = Arc::new(AtomicU64::new(0));
    let producers: Vec<_> = (0..PARTITION_COUNT)
        .map(|partition_id| {
            let acked = Arc::clone(&acked);
            let acked_count = Arc::clone(&acked_count);
            std::thread::spawn(move || {
                block_on(async move {
                    let Ok(mut client) = bus::Client::connect(addr).await else {
                        return;
                    };
                    let namespace = Namespace::new(1, 1, partition_id);
                    for batch_number in 0u64.. {
                        let mut builder =
                            BatchBuilder::with_capacity(BATCH_MESSAGE_COUNT as usize, 0);
                        for index in 0..BATCH_MESSAGE_COUNT {
                            let id = (batch_number << 16) | index;
                            builder.push(id, 0, &payload(id));
                        }
                        match client.send_messages(namespace, builder.finish()).await {
                            Ok(ack) => {
                                acked
                                    .lock()
                                    .unwrap()
                                    .entry(partition_id)
                                    .or_default()
                                    .push((ack.base_offset, batch_number));
                                acked_count.fetch_add(1, Ordering::Relaxed);
                            }
                            Err(_) => return,
                        }
                    }
                });
            })
        })
        .collect();

    let deadline = Instant::now() + Duration::from_mins(1);
    while acked_count.load(Ordering::Relaxed) < 200 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(
        acked_count.load(Ordering::Relaxed) >= 200,
        "producers made no progress"
    );
    server.kill9();
    for producer in producers {
        producer.join().unwrap();
    }

    let server = Server::start(
        &data_dir,
        &["--shards", "2", "--no-pin", "--fsync", "always"],
    );
    let acked = acked.lock().unwrap().clone();
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        for partition_id in 0..PARTITION_COUNT {
            let namespace = Namespace::new(1, 1, partition_id);
            let stored = read_all(&mut client, namespace).await;
            // Whole batches only, in send order: batch b occupies offsets [10b, 10b + 10).
            assert_eq!(
                stored.len() as u64 % BATCH_MESSAGE_COUNT,
                0,
                "{namespace}: a batch is half-present"
            );
            for (offset, id, bytes) in &stored {
                let batch_number = offset / BATCH_MESSAGE_COUNT;
                assert_eq!(
                    *id,
                    (batch_number << 16) | (offset % BATCH_MESSAGE_COUNT),
                    "{namespace} offset {offset}"
                );
                assert_eq!(
                    *bytes,
                    payload(*id),
                    "{namespace} offset {offset}: payload damaged"
                );
            }
            for (base_offset, batch_number) in acked.get(&partition_id).into_iter().flatten() {
                assert_eq!(*base_offset, batch_number * BATCH_MESSAGE_COUNT);
                assert!(
                    base_offset + BATCH_MESSAGE_COUNT <= stored.len() as u64,
                    "{namespace}: acknowledged batch {batch_number} at {base_offset} lost after kill -9"
                );
            }
        }
    });
    assert_eq!(server.stop(), Some(0));
}
