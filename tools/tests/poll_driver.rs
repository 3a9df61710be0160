//! The `--io-driver poll` fallback serves the same protocol over the same files: the dpkg event log
//! written under the polling driver reads back byte-identical under io_uring after a restart.

mod common;

use bus::{BatchBuilder, Namespace};
use common::{Server, block_on, read_all, shared_data};

#[test]
fn poll_driver_writes_what_io_uring_reads_back() {
    let path = shared_data("dpkg-events.log");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let events: Vec<&[u8]> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(events.len(), 5_235, "corpus changed");

    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(
        &data_dir,
        &["--shards", "2", "--no-pin", "--io-driver", "poll"],
    );
    assert!(
        server.stderr().contains("driver=Poll"),
        "{}",
        server.stderr()
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "dpkg").await.unwrap();
        client.create_topic(1, 1, "events", 3).await.unwrap();
        for (chunk_index, chunk) in events.chunks(500).enumerate() {
            let mut builder = BatchBuilder::with_capacity(chunk.len(), 0);
            for (index, event) in chunk.iter().enumerate() {
                builder.push((chunk_index * 500 + index) as u64, 0, event);
            }
            let namespace = Namespace::new(1, 1, (chunk_index % 3) as u16);
            client
                .send_messages(namespace, builder.finish())
                .await
                .unwrap();
        }
    });
    assert_eq!(server.stop(), Some(0));

    let server = Server::start(
        &data_dir,
        &["--shards", "2", "--no-pin", "--io-driver", "io-uring"],
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let mut read_back = vec![None; events.len()];
        for partition_id in 0..3 {
            for (_, id, payload) in read_all(&mut client, Namespace::new(1, 1, partition_id)).await
            {
                read_back[id as usize] = Some(payload);
            }
        }
        for (index, event) in events.iter().enumerate() {
            assert_eq!(read_back[index].as_deref(), Some(*event), "event {index}");
        }
    });
    assert_eq!(server.stop(), Some(0));
}
