//! What the server takes from the host: an exclusive data directory, a listen address no other
//! process shares, and an open-file budget that bounds partitions and connections. Also the
//! refusals to boot over data that metadata can no longer account for.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::process::Command;
use std::time::Duration;

use common::{BIN, Server, block_on};

fn serve_output(data_dir: &std::path::Path, listen: &str, extra: &[&str]) -> String {
    let output = Command::new(BIN)
        .args(["serve", "--listen", listen, "--data-dir"])
        .arg(data_dir)
        .args(extra)
        .output()
        .unwrap();
    assert!(
        !output.status.success(),
        "second server should refuse to start"
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// A command whose open-file limit is `limit` (soft and hard), so the budget is small.
fn with_open_file_limit(limit: u64) -> Command {
    let mut command = Command::new(BIN);
    // SAFETY: setrlimit is async-signal-safe and touches only the child's own limits.
    unsafe {
        command.pre_exec(move || {
            let value = libc::rlimit {
                rlim_cur: limit,
                rlim_max: limit,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const value) == 0 {
                Ok(())
            } else {
                Err(std::io::Error::last_os_error())
            }
        });
    }
    command
}

#[test]
fn a_second_server_cannot_share_the_data_dir_or_the_port() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    let server = Server::start(&data_dir, &["--shards", "1"]);

    let message = serve_output(&data_dir, "127.0.0.1:0", &["--shards", "1"]);
    assert!(
        message.contains("is in use by another shardline process"),
        "{message}"
    );

    let other_dir = dir.path().join("other");
    let message = serve_output(&other_dir, &server.addr.to_string(), &["--shards", "1"]);
    assert!(
        message.contains(&format!("cannot listen on {}", server.addr)),
        "{message}"
    );
    assert!(message.contains("Address already in use"), "{message}");

    assert_eq!(server.stop(), Some(0));
    // The lock dies with the process: the data dir is usable again.
    let server = Server::start(&data_dir, &["--shards", "1"]);
    assert_eq!(server.stop(), Some(0));
}

fn data_dir_with_a_topic(dir: &std::path::Path) -> std::path::PathBuf {
    let data_dir = dir.join("data");
    let server = Server::start(&data_dir, &["--shards", "1"]);
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 2).await.unwrap();
    });
    assert_eq!(server.stop(), Some(0));
    data_dir
}

#[test]
fn missing_metadata_over_partition_data_refuses_to_boot() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = data_dir_with_a_topic(dir.path());
    // Only the superblock lost: the journal and snapshot say the state existed.
    std::fs::remove_file(data_dir.join("superblock")).unwrap();
    let message = serve_output(&data_dir, "127.0.0.1:0", &["--shards", "1"]);
    assert!(
        message.contains(&format!(
            "{}: missing, but {} exists",
            data_dir.join("superblock").display(),
            data_dir.join("journal").display()
        )),
        "{message}"
    );
    // All metadata lost: the partition data must not be orphaned by an empty start.
    std::fs::remove_dir_all(data_dir.join("journal")).unwrap();
    std::fs::remove_file(data_dir.join("snapshot")).unwrap();
    let message = serve_output(&data_dir, "127.0.0.1:0", &["--shards", "1"]);
    assert!(message.contains("superblock is missing but"), "{message}");
    assert!(message.contains("holds partition data"), "{message}");
    assert!(
        !data_dir.join("superblock").exists(),
        "nothing was formatted"
    );
}

#[test]
fn a_deleted_partition_directory_refuses_to_boot() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = data_dir_with_a_topic(dir.path());
    let partition = data_dir.join("partitions/1/1/1");
    std::fs::remove_dir_all(&partition).unwrap();
    let message = serve_output(&data_dir, "127.0.0.1:0", &["--shards", "1"]);
    assert!(
        message.contains(&format!("directory {} is missing", partition.display())),
        "{message}"
    );
}

#[test]
fn partitions_beyond_the_open_file_budget_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    // 600 descriptors: 344 after the reserve, half for partitions at three each -> 57 partitions.
    let server = Server::start_with(
        with_open_file_limit(600),
        &dir.path().join("data"),
        &["--shards", "1"],
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "fits", 50).await.unwrap();
        let error = client.create_topic(1, 2, "too-many", 10).await.unwrap_err();
        let message = error.to_string();
        assert!(
            message.contains("would hold 60 partitions, above its limit of 57"),
            "{message}"
        );
        assert!(message.contains("ResourceExhausted (18)"), "{message}");
        // Nothing of the refused topic exists.
        let metadata = client.get_metadata().await.unwrap();
        assert_eq!(metadata.streams[0].topics.len(), 1);
    });
    assert!(!dir.path().join("data/partitions/1/2").exists());
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn connections_beyond_the_budget_are_closed_at_accept() {
    let dir = tempfile::tempdir().unwrap();
    // 600 descriptors: 172 for connections on the one shard.
    let server = Server::start_with(
        with_open_file_limit(600),
        &dir.path().join("data"),
        &["--shards", "1"],
    );
    let mut held = Vec::new();
    for _ in 0..172 {
        let stream = std::net::TcpStream::connect(server.addr).unwrap();
        held.push(stream);
    }
    // A ping answered on the last one proves the shard accepted all of them (accepts are FIFO).
    let mut header = bus::Header::new(bus::Command::Request, bus::Operation::Ping);
    let ping = bus::encode_frame(&mut header, &[]);
    let last = held.last_mut().unwrap();
    std::io::Write::write_all(last, &ping).unwrap();
    let mut reply = [0u8; bus::HEADER_SIZE];
    last.read_exact(&mut reply).unwrap();
    let mut extra = std::net::TcpStream::connect(server.addr).unwrap();
    extra
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    // The connection over the limit reads a ResourceExhausted frame (issue 7), then the close.
    let mut refusal = [0u8; bus::HEADER_SIZE];
    extra.read_exact(&mut refusal).unwrap();
    let refusal: bus::Header = bytemuck::pod_read_unaligned(&refusal);
    assert_eq!(refusal.error_code, bus::ErrorCode::ResourceExhausted as u32);
    let mut rest = Vec::new();
    extra.read_to_end(&mut rest).unwrap();
    assert_eq!(rest.len(), refusal.size as usize - bus::HEADER_SIZE);
    drop(held);
    // Slots are released when connections close.
    std::thread::sleep(Duration::from_millis(200));
    block_on(async {
        bus::Client::connect(server.addr)
            .await
            .unwrap()
            .ping()
            .await
            .unwrap();
    });
    assert!(
        server
            .stderr()
            .contains("refusing connection: the shard is at its connection limit")
    );
    assert_eq!(server.stop(), Some(0));
}

#[test]
fn a_corrupt_metadata_file_is_the_error_reported_whichever_shard_stops_first() {
    let dir = tempfile::tempdir().unwrap();
    let data_dir = dir.path().join("data");
    std::fs::create_dir_all(&data_dir).unwrap();
    std::fs::write(
        data_dir.join("metadata.json"),
        b"garbage that is no metadata",
    )
    .unwrap();
    for _ in 0..5 {
        let message = serve_output(&data_dir, "127.0.0.1:0", &["--shards", "2", "--no-pin"]);
        assert!(message.contains("metadata.json"), "{message}");
        assert!(message.contains("corrupt"), "{message}");
    }
}
