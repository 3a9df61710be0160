//! A full target inbox answers the client `Busy` (retryable) and applies nothing: with an inbox of
//! one frame and many concurrent senders, some batches are refused, and afterwards the partitions
//! hold exactly the acknowledged batches.

mod common;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use bus::{BatchBuilder, ErrorCode, Namespace};
use common::{Server, block_on, read_all};

const PARTITION_COUNT: u16 = 4;
const SENDER_COUNT: u64 = 16;
const BATCHES_PER_SENDER: u64 = 40;

#[test]
fn full_inbox_answers_busy_and_applies_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(
        &dir.path().join("data"),
        &[
            "--shards",
            "2",
            "--no-pin",
            "--inbox-capacity",
            "1",
            "--fsync",
            "never",
        ],
    );
    let addr = server.addr;
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "busy").await.unwrap();
        client
            .create_topic(1, 1, "t", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
    });

    let acked: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let refused: Arc<Mutex<BTreeSet<u64>>> = Arc::default();
    let senders: Vec<_> = (0..SENDER_COUNT)
        .map(|sender| {
            let (acked, refused) = (Arc::clone(&acked), Arc::clone(&refused));
            std::thread::spawn(move || {
                block_on(async move {
                    let mut client = bus::Client::connect(addr)
                        .await
                        .unwrap()
                        // No transparent retry: this test counts the Busy answers themselves.
                        .with_retry_budget(std::time::Duration::ZERO);
                    for index in 0..BATCHES_PER_SENDER {
                        let batch_id = sender * 1000 + index;
                        let partition_id = (batch_id % u64::from(PARTITION_COUNT)) as u16;
                        let mut builder = BatchBuilder::with_capacity(2, 0);
                        builder.push(batch_id * 2, 0, b"first");
                        builder.push(batch_id * 2 + 1, 0, b"second");
                        let namespace = Namespace::new(1, 1, partition_id);
                        match client.send_messages(namespace, builder.finish()).await {
                            Ok(_) => {
                                acked.lock().unwrap().insert(batch_id);
                            }
                            Err(bus::ClientError::Server {
                                code: ErrorCode::Busy,
                                ..
                            }) => {
                                refused.lock().unwrap().insert(batch_id);
                            }
                            Err(e) => panic!("unexpected error: {e}"),
                        }
                    }
                });
            })
        })
        .collect();
    for sender in senders {
        sender.join().unwrap();
    }

    let acked = acked.lock().unwrap().clone();
    let refused = refused.lock().unwrap().clone();
    assert_eq!(
        acked.len() + refused.len(),
        (SENDER_COUNT * BATCHES_PER_SENDER) as usize
    );
    assert!(
        !refused.is_empty(),
        "an inbox of one frame under 16 senders must refuse some batches"
    );
    assert!(!acked.is_empty());

    let stored: BTreeSet<u64> = block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let mut stored = BTreeSet::new();
        for partition_id in 0..PARTITION_COUNT {
            let messages = read_all(&mut client, Namespace::new(1, 1, partition_id)).await;
            assert_eq!(messages.len() % 2, 0, "a batch was half applied");
            for pair in messages.chunks(2) {
                assert_eq!(pair[0].1 + 1, pair[1].1, "batch messages stay together");
                assert!(stored.insert(pair[0].1 / 2), "batch stored twice");
            }
        }
        stored
    });
    assert_eq!(
        stored, acked,
        "exactly the acknowledged batches are stored; Busy ones are not"
    );
    assert_eq!(server.stop(), Some(0));
}
