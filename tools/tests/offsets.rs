//! Consumer offsets end to end (issue 11 section 1): stored offsets survive kill -9 under
//! `--fsync always`, a consumer resumes right after its last stored offset, offsets are per
//! consumer and per partition, an offset past the partition's end is refused, a deleted topic's
//! offsets go with it, `inspect offsets` shows them, and a damaged offsets file refuses the boot
//! naming its path.

mod common;

use std::process::Command;

use bus::{BatchBuilder, ClientError, Consumer, ConsumerKind, ErrorCode, Namespace};
use common::{BIN, Server, block_on};

const MESSAGE_COUNT: u64 = 10;

fn consumer(name: &str) -> Consumer {
    Consumer::new(ConsumerKind::Consumer, name).unwrap()
}

/// Sends `MESSAGE_COUNT` messages with ids `base..base + MESSAGE_COUNT` to `namespace`.
async fn send_ten(client: &mut bus::Client, namespace: Namespace, base: u64) {
    let mut builder = BatchBuilder::with_capacity(MESSAGE_COUNT as usize, 0);
    for id in base..base + MESSAGE_COUNT {
        builder.push(id, 0, format!("message {id}").as_bytes());
    }
    client
        .send_messages(namespace, builder.finish())
        .await
        .unwrap();
}

/// The ids of the messages a consumer reads when it resumes from its stored offset (0 when it
/// has none), and that offset.
async fn resume(
    client: &mut bus::Client,
    namespace: Namespace,
    reader: &Consumer,
) -> (u64, Vec<u64>) {
    let offset = client
        .get_offset(namespace, reader)
        .await
        .unwrap()
        .unwrap_or(0);
    let polled = client.poll(namespace, offset, 100).await.unwrap();
    let ids = polled.messages().unwrap().iter().map(|m| m.id).collect();
    (offset, ids)
}

fn inspect_offsets(path: &std::path::Path) -> (Option<i32>, String, String) {
    let output = Command::new(BIN)
        .args(["inspect", "offsets"])
        .arg(path)
        .arg("--json")
        .output()
        .unwrap();
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn issue11_1_offsets_survive_kill_9_and_a_consumer_resumes_after_its_last_stored_offset() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let args = ["--shards", "2", "--no-pin", "--fsync", "always"];
    let server = Server::start(&data_dir, &args);
    let (p0, p1) = (Namespace::new(1, 1, 0), Namespace::new(1, 1, 1));
    let (reader, other) = (consumer("reader"), consumer("other"));
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "orders").await.unwrap();
        client.create_topic(1, 1, "events", 2).await.unwrap();
        send_ten(&mut client, p0, 0).await;
        send_ten(&mut client, p1, 100).await;
        // A consumer that never stored reads from the start.
        assert_eq!(client.get_offset(p0, &reader).await.unwrap(), None);
        let (offset, ids) = resume(&mut client, p0, &reader).await;
        assert_eq!((offset, ids.len()), (0, 10));
        // It processed 4 messages: the next one to read is offset 4.
        client.store_offset(p0, &reader, 0, 4).await.unwrap();
        client.store_offset(p0, &reader, 0, 3).await.unwrap();
        client.store_offset(p0, &reader, 0, 6).await.unwrap();
        client.store_offset(p1, &reader, 0, 10).await.unwrap();
        client.store_offset(p0, &other, 0, 2).await.unwrap();
        // A group of the same name is another consumer.
        let group = Consumer::new(ConsumerKind::Group, "reader").unwrap();
        assert_eq!(client.get_offset(p0, &group).await.unwrap(), None);
    });
    server.kill9();

    let server = Server::start(&data_dir, &args);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        assert_eq!(client.get_offset(p0, &reader).await.unwrap(), Some(6));
        assert_eq!(client.get_offset(p1, &reader).await.unwrap(), Some(10));
        assert_eq!(client.get_offset(p0, &other).await.unwrap(), Some(2));
        assert_eq!(client.get_offset(p1, &other).await.unwrap(), None);
        let (offset, ids) = resume(&mut client, p0, &reader).await;
        assert_eq!(offset, 6);
        assert_eq!(ids, (6..10).collect::<Vec<u64>>(), "resumes right after");
        let (offset, ids) = resume(&mut client, p1, &reader).await;
        assert_eq!((offset, ids), (10, Vec::new()), "caught up");
        let (_, ids) = resume(&mut client, p0, &other).await;
        assert_eq!(ids, (2..10).collect::<Vec<u64>>());
    });
    assert_eq!(server.stop(), Some(0));

    let (code, stdout, stderr) = inspect_offsets(&data_dir);
    assert_eq!(code, Some(0), "stdout:\n{stdout}\nstderr:\n{stderr}");
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["file_count"], 2, "{stdout}");
    assert_eq!(report["consumer_count"], 3, "{stdout}");
    let files = report["files"].as_array().unwrap();
    assert_eq!(files[0]["partition"], "1/1/0");
    assert_eq!(
        files[0]["consumers"],
        serde_json::json!([
            {"kind": "consumer", "name": "other", "offset": 2},
            {"kind": "consumer", "name": "reader", "offset": 6},
        ])
    );
    assert_eq!(files[1]["partition"], "1/1/1");
    assert_eq!(
        files[1]["consumers"],
        serde_json::json!([{"kind": "consumer", "name": "reader", "offset": 10}])
    );
}

#[test]
fn issue11_1_bad_offsets_are_refused_and_a_deleted_topic_takes_its_offsets() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &["--shards", "2", "--no-pin"]);
    let p0 = Namespace::new(1, 1, 0);
    let reader = consumer("reader");
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "orders").await.unwrap();
        client.create_topic(1, 1, "events", 1).await.unwrap();
        send_ten(&mut client, p0, 0).await;
        match client.store_offset(p0, &reader, 0, 11).await {
            Err(ClientError::Server { code, message }) => {
                assert_eq!(code, ErrorCode::OffsetOutOfRange, "{message}");
                assert!(message.contains("next offset 10"), "{message}");
            }
            other => panic!("expected OffsetOutOfRange, got {other:?}"),
        }
        assert_eq!(client.get_offset(p0, &reader).await.unwrap(), None);
        // The next offset itself is a valid offset: everything was read.
        client.store_offset(p0, &reader, 0, 10).await.unwrap();
        match client
            .store_offset(Namespace::new(1, 1, 5), &reader, 0, 0)
            .await
        {
            Err(ClientError::Server { code, .. }) => assert_eq!(code, ErrorCode::PartitionNotFound),
            other => panic!("expected PartitionNotFound, got {other:?}"),
        }

        client.delete_topic(1, 1).await.unwrap();
        client.create_topic(1, 1, "events", 1).await.unwrap();
        assert_eq!(client.get_offset(p0, &reader).await.unwrap(), None);
    });
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn issue11_1_a_damaged_offsets_file_refuses_the_boot_naming_its_path() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &["--no-pin"]);
    let p0 = Namespace::new(1, 1, 0);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "orders").await.unwrap();
        client.create_topic(1, 1, "events", 1).await.unwrap();
        send_ten(&mut client, p0, 0).await;
        for offset in 1..=3 {
            client
                .store_offset(p0, &consumer("reader"), 0, offset)
                .await
                .unwrap();
        }
    });
    assert_eq!(server.stop(), Some(0));

    let file = data_dir.join("partitions/1/1/0/consumer-offsets");
    let mut bytes = std::fs::read(&file).unwrap();
    // The first record starts after the 16-byte header; its offset field is at byte 16 + 16.
    bytes[32] ^= 0xff;
    std::fs::write(&file, &bytes).unwrap();

    let (code, stdout, _) = inspect_offsets(&data_dir);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(stdout.contains(&file.display().to_string()), "{stdout}");
    assert!(stdout.contains("\"position\": 16"), "{stdout}");

    let refused = Server::try_start_on(Command::new(BIN), &data_dir, "127.0.0.1:0", &["--no-pin"])
        .err()
        .expect("the boot is refused");
    assert!(
        refused.contains(&format!("{} at byte 16", file.display())),
        "{refused}"
    );
    assert!(refused.contains("corrupt consumer offsets"), "{refused}");
}
