//! Real server on 127.0.0.1 with 2 shards: every record of the Debian corpus, sent across 8
//! partitions, comes back byte-identical and in order, before and after a restart.

mod common;

use bus::{BatchBuilder, Namespace};
use common::{Server, block_on, read_all, shared_data};

const PARTITION_COUNT: u16 = 8;

fn corpus() -> Vec<Vec<u8>> {
    let path = shared_data("debian-packages.jsonl");
    let text = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let lines: Vec<Vec<u8>> = text
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(lines.len(), 20_000, "corpus changed");
    lines
}

/// Record `i` goes to partition `i % 8`; ids are the record index.
fn expected_by_partition(records: &[Vec<u8>]) -> Vec<Vec<(u64, Vec<u8>)>> {
    let mut partitions = vec![Vec::new(); PARTITION_COUNT as usize];
    for (index, record) in records.iter().enumerate() {
        partitions[index % PARTITION_COUNT as usize].push((index as u64, record.clone()));
    }
    partitions
}

fn check_all(addr: std::net::SocketAddr, expected: &[Vec<(u64, Vec<u8>)>]) {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        for (partition_id, records) in expected.iter().enumerate() {
            let namespace = Namespace::new(1, 1, partition_id as u16);
            let got = read_all(&mut client, namespace).await;
            assert_eq!(got.len(), records.len(), "message count of {namespace}");
            for ((offset, id, payload), (index, (expected_id, expected_payload))) in
                got.iter().zip(records.iter().enumerate())
            {
                assert_eq!(*offset, index as u64);
                assert_eq!(id, expected_id, "id at {namespace} offset {offset}");
                assert!(
                    payload == expected_payload,
                    "payload at {namespace} offset {offset} differs"
                );
            }
        }
        let metadata = client.get_metadata().await.unwrap();
        assert_eq!(metadata.shard_count, 2);
        let topic = &metadata.streams[0].topics[0];
        assert_eq!(topic.partitions.len(), PARTITION_COUNT as usize);
        for (partition, records) in topic.partitions.iter().zip(expected) {
            assert_eq!(partition.next_offset, records.len() as u64);
            assert!(partition.owner_shard < 2);
        }
        let owners: std::collections::BTreeSet<u16> =
            topic.partitions.iter().map(|p| p.owner_shard).collect();
        assert_eq!(
            owners.len(),
            2,
            "8 partitions should spread over both shards"
        );
    });
}

#[test]
fn debian_corpus_round_trips_across_partitions_and_restart() {
    let records = corpus();
    let expected = expected_by_partition(&records);
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");

    let server = Server::start(
        &data_dir,
        &["--shards", "2", "--no-pin", "--fsync", "always"],
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "debian").await.unwrap();
        client
            .create_topic(1, 1, "packages", u32::from(PARTITION_COUNT))
            .await
            .unwrap();
        for (partition_id, records) in expected.iter().enumerate() {
            let namespace = Namespace::new(1, 1, partition_id as u16);
            let mut next_offset = 0;
            for chunk in records.chunks(97) {
                let mut builder = BatchBuilder::with_capacity(chunk.len(), 0);
                for (id, payload) in chunk {
                    builder.push(*id, 1_700_000_000_000_000 + id, payload);
                }
                let ack = client
                    .send_messages(namespace, builder.finish())
                    .await
                    .unwrap();
                assert_eq!(ack.base_offset, next_offset);
                assert_eq!(ack.message_count as usize, chunk.len());
                next_offset += chunk.len() as u64;
            }
        }
    });
    check_all(server.addr, &expected);
    assert_eq!(server.stop(), Some(0), "graceful shutdown exits 0");

    let server = Server::start(&data_dir, &["--shards", "2", "--no-pin"]);
    check_all(server.addr, &expected);
    assert_eq!(server.stop(), Some(0));
}
