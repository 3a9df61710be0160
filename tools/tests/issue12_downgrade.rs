//! Issue 12's downgrade guard, end to end on the real `shardline serve` (`storage/FORMAT.md`
//! section 7, "Versions"): a data directory from before issue 12 (a version-1 superblock, entries
//! under the whole-payload checksum rule) and one from before the timestamp checksum rule (a
//! version-2 superblock, entries under the message-headers rule, flag bit 1) boot, their
//! superblock is rewritten at version 3 before the server listens (so before any produce can
//! append an entry under a rule the older binary would cut as damage), and their old entries
//! still read; a superblock of a version newer than this binary reads refuses to boot, naming the
//! file and both versions, and nothing is written.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

// `MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP` (bit 2) is the timestamp checksum rule that superblock
// version 3 guards (`storage/FORMAT.md` section 3); the helpers that build batches of an older
// format clear it.
use bus::{
    BATCH_HEADER_SIZE, BatchBuilder, MESSAGE_FLAG_CHECKSUM_OF_HEADERS,
    MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP, MESSAGE_HEADER_SIZE, Namespace,
};
use common::{BIN, Server, block_on};

const SHARDS: [&str; 3] = ["--shards", "2", "--no-pin"];
/// Byte of the first message's `reserved` flags word within a message section (after its id,
/// 8 bytes, and its 4-byte offset delta: `bus` message header layout, `storage/FORMAT.md`
/// section 3).
const FIRST_RESERVED_AT: usize = 12;
const UPGRADE_FAILPOINT: &str = "boot.after_superblock_upgrade";
/// Stream 1, topic 1, partition 0.
fn namespace() -> Namespace {
    Namespace::new(1, 1, 0)
}

fn superblock_path(data_dir: &Path) -> PathBuf {
    data_dir.join("superblock")
}

/// Sets every copy of the superblock to `version`, resealing each copy's checksum: what a binary
/// of that version writes (versions 1, 2 and 3 share the layout).
fn set_superblock_version(data_dir: &Path, version: u16) {
    let path = superblock_path(data_dir);
    let mut image = std::fs::read(&path).unwrap();
    for copy in image.chunks_mut(4096) {
        copy[8..10].copy_from_slice(&version.to_le_bytes());
        let checksum = twox_hash::XxHash3_128::oneshot(&copy[..112]);
        copy[112..128].copy_from_slice(&checksum.to_le_bytes());
    }
    std::fs::write(&path, &image).unwrap();
}

/// The version field of each of the 4 superblock copies.
fn superblock_versions(data_dir: &Path) -> Vec<u16> {
    std::fs::read(superblock_path(data_dir))
        .unwrap()
        .chunks(4096)
        .map(|copy| u16::from_le_bytes([copy[8], copy[9]]))
        .collect()
}

/// Every regular file under `dir` (relative path -> bytes).
fn files_under(dir: &Path) -> BTreeMap<PathBuf, Vec<u8>> {
    let mut files = BTreeMap::new();
    let mut pending = vec![dir.to_path_buf()];
    while let Some(current) = pending.pop() {
        for entry in std::fs::read_dir(&current).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                pending.push(path);
            } else {
                let bytes = std::fs::read(&path).unwrap();
                files.insert(path.strip_prefix(dir).unwrap().to_path_buf(), bytes);
            }
        }
    }
    files
}

/// `payloads` as one batch from `BatchBuilder` (ids 0, 1, ...; timestamp 1 us), not stamped.
fn built_batch(payloads: &[&[u8]]) -> Vec<u8> {
    let mut builder = BatchBuilder::default();
    for (id, payload) in payloads.iter().enumerate() {
        builder.push(id as u64, 1, payload);
    }
    builder.finish()
}

/// A batch under the checksum rule from before issue 12: built by `BatchBuilder`, then the
/// message-headers and timestamp flags cleared and the batch checksum recomputed over the whole
/// message section (what every client wrote before issue 12).
fn whole_payload_rule_batch(payloads: &[&[u8]]) -> Vec<u8> {
    let mut batch = built_batch(payloads);
    batch[BATCH_HEADER_SIZE + FIRST_RESERVED_AT] &=
        !(MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8 | (MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8));
    let checksum = twox_hash::XxHash3_64::oneshot(&batch[BATCH_HEADER_SIZE..]);
    batch[24..32].copy_from_slice(&checksum.to_le_bytes());
    batch
}

/// A batch under the message-headers rule alone (flag bit 1, what a binary of superblock version
/// 2 wrote): built by `BatchBuilder`, the timestamp flag cleared, and the batch checksum
/// recomputed as the XXH3-64 of the 32-byte message headers in order (no producer stamp).
fn message_headers_rule_batch(payloads: &[&[u8]]) -> Vec<u8> {
    let mut batch = built_batch(payloads);
    let flags = &mut batch[BATCH_HEADER_SIZE + FIRST_RESERVED_AT];
    *flags &= !(MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8);
    assert_ne!(*flags & MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8, 0);
    let mut headers = Vec::new();
    let mut at = BATCH_HEADER_SIZE;
    for payload in payloads {
        headers.extend_from_slice(&batch[at..at + MESSAGE_HEADER_SIZE]);
        at += MESSAGE_HEADER_SIZE + payload.len();
    }
    assert_eq!(
        at,
        batch.len(),
        "the batch is the headers and payloads, no stamp"
    );
    let checksum = twox_hash::XxHash3_64::oneshot(&headers);
    batch[24..32].copy_from_slice(&checksum.to_le_bytes());
    batch
}

/// Creates stream 1 / topic 1 (one partition) and sends `batch`; returns its base offset.
fn create_and_send(addr: SocketAddr, batch: Vec<u8>) -> u64 {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        client.create_stream(1, "s").await.unwrap();
        client.create_topic(1, 1, "t", 1).await.unwrap();
        client
            .send_messages(namespace(), batch)
            .await
            .unwrap()
            .base_offset
    })
}

/// Every message of the partition (offset, payload), each message checksum verified.
fn stored(addr: SocketAddr) -> Vec<(u64, Vec<u8>)> {
    block_on(async {
        let mut client = bus::Client::connect(addr).await.unwrap();
        let result = client.poll(namespace(), 0, 1000).await.unwrap();
        let messages = result.messages().unwrap();
        assert!(messages.iter().all(bus::MessageView::verify));
        messages
            .iter()
            .map(|message| (message.offset, message.payload.to_vec()))
            .collect()
    })
}

/// The first message's flags byte of the first entry of partition 1/1/0.
fn first_entry_flags(data_dir: &Path) -> u8 {
    let segment =
        std::fs::read(data_dir.join("partitions/1/1/0/00000000000000000000.log")).unwrap();
    segment[BATCH_HEADER_SIZE + FIRST_RESERVED_AT]
}

/// A data directory as a binary of superblock version `version` left it: the superblock at
/// `version` and one entry of 3 messages in partition 1/1/0 under that version's newest rule
/// (1: the whole-payload rule, before issue 12; 2: the message-headers rule, flag bit 1, before
/// the timestamp rule).
fn older_data_dir(data_dir: &Path, version: u16) {
    let payloads: [&[u8]; 3] = [b"alpha", b"beta", b"gamma"];
    let (batch, flags) = match version {
        1 => (whole_payload_rule_batch(&payloads), 0),
        2 => (
            message_headers_rule_batch(&payloads),
            MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8,
        ),
        _ => panic!("no older data directory of version {version}"),
    };
    // This release stores only batches under the timestamp rule (`parse_for_append`), so the
    // older entry is written as this release stores the same messages, then rewritten in place
    // under the older rule: same length and offset, so the index and everything else still hold.
    let server = Server::start(data_dir, &SHARDS);
    assert_eq!(create_and_send(server.addr, built_batch(&payloads)), 0);
    assert_eq!(server.stop(), Some(0));
    let segment = data_dir.join("partitions/1/1/0/00000000000000000000.log");
    let mut stored = std::fs::read(&segment).unwrap();
    assert_eq!(stored.len(), batch.len(), "one entry of the same messages");
    stored.copy_from_slice(&batch);
    std::fs::write(&segment, stored).unwrap();
    set_superblock_version(data_dir, version);
    assert_eq!(
        first_entry_flags(data_dir)
            & (MESSAGE_FLAG_CHECKSUM_OF_HEADERS as u8 | (MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP as u8)),
        flags,
        "the stored entry is under the rule of version {version}"
    );
}

/// The upgrade is durable before the server listens, so before any produce: booted with the
/// failpoint right after the upgrade, the server dies before it reports listening, with every
/// superblock copy at version 3 (a binary of the older version now refuses the directory) and
/// every partition file as it was (nothing under a newer rule written yet). Were the upgrade done
/// after the partitions opened or at the first append, the server would listen first and this
/// test would fail.
fn the_upgrade_is_on_disk_before_the_server_listens(version: u16) {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    older_data_dir(&data_dir, version);
    assert_eq!(superblock_versions(&data_dir), [version; 4]);
    let partitions_before = files_under(&data_dir.join("partitions"));

    let mut command = Command::new(BIN);
    command.env("SHARDLINE_FAILPOINT", UPGRADE_FAILPOINT);
    let stderr = match Server::try_start_on(command, &data_dir, "127.0.0.1:0", &SHARDS) {
        Err(stderr) => stderr,
        Ok(server) => panic!(
            "the server listened on {} before the superblock upgrade's failpoint; stderr:\n{}",
            server.addr,
            server.stderr()
        ),
    };
    assert!(
        stderr.contains(&format!(
            "failpoint {UPGRADE_FAILPOINT}: killing the process with SIGKILL"
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains(&format!("superblock upgraded from version {version} to 3")),
        "{stderr}"
    );
    assert_eq!(superblock_versions(&data_dir), [3, 3, 3, 3]);
    assert_eq!(
        files_under(&data_dir.join("partitions")),
        partitions_before,
        "a partition file changed before the upgrade was durable"
    );
}

#[test]
fn issue12_downgrade_the_upgrade_is_on_disk_before_the_server_listens() {
    the_upgrade_is_on_disk_before_the_server_listens(1);
}

#[test]
fn issue12_timestamp_rule_the_upgrade_from_version_2_is_on_disk_before_the_server_listens() {
    the_upgrade_is_on_disk_before_the_server_listens(2);
}

/// A directory of an older version boots: its superblock reads back as version 3, the old entry
/// (under the older rule) still reads, and new entries (as `BatchBuilder` flags them) are
/// appended after it.
fn an_older_directory_boots_upgraded_and_its_old_entries_read(version: u16) {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    older_data_dir(&data_dir, version);
    assert_eq!(superblock_versions(&data_dir), [version; 4]);

    let server = Server::start(&data_dir, &SHARDS);
    assert_eq!(superblock_versions(&data_dir), [3, 3, 3, 3]);
    let old = vec![
        (0, b"alpha".to_vec()),
        (1, b"beta".to_vec()),
        (2, b"gamma".to_vec()),
    ];
    assert_eq!(stored(server.addr), old);
    let ack = block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let mut builder = BatchBuilder::default();
        builder.push(10, 1, b"delta");
        client
            .send_messages(namespace(), builder.finish())
            .await
            .unwrap()
    });
    assert_eq!(ack.base_offset, 3);
    assert_eq!(server.stop(), Some(0));

    // Both rules in one segment, both read after another restart; nothing to upgrade again.
    let server = Server::start(&data_dir, &SHARDS);
    let mut expected = old;
    expected.push((3, b"delta".to_vec()));
    assert_eq!(stored(server.addr), expected);
    // The stderr log is shared by every start of this test: one upgrade in all.
    assert_eq!(
        server.stderr().matches("superblock upgraded").count(),
        1,
        "{}",
        server.stderr()
    );
    assert_eq!(server.stop(), Some(0));
    assert_eq!(superblock_versions(&data_dir), [3, 3, 3, 3]);
}

#[test]
fn issue12_downgrade_a_pre_issue12_directory_boots_upgraded_and_its_old_entries_read() {
    an_older_directory_boots_upgraded_and_its_old_entries_read(1);
}

#[test]
fn issue12_timestamp_rule_a_version_2_directory_boots_upgraded_and_its_old_entries_read() {
    an_older_directory_boots_upgraded_and_its_old_entries_read(2);
}

/// A superblock of a version this binary does not read refuses to boot, naming the file and
/// both versions, and nothing in the directory is written.
#[test]
fn issue12_downgrade_serve_refuses_a_version_4_superblock_naming_the_file_and_versions() {
    let root = tempfile::tempdir().unwrap();
    let data_dir = root.path().join("data");
    older_data_dir(&data_dir, 1);
    set_superblock_version(&data_dir, 4);
    let before = files_under(&data_dir);

    let stderr = match Server::try_start_on(Command::new(BIN), &data_dir, "127.0.0.1:0", &SHARDS) {
        Err(stderr) => stderr,
        Ok(server) => panic!(
            "the server booted a version-4 superblock on {}",
            server.addr
        ),
    };
    assert!(
        stderr.contains(&format!(
            "{}: superblock copy 0 has version 4, but this binary reads only versions 1 to 3",
            superblock_path(&data_dir).display()
        )),
        "{stderr}"
    );
    assert!(
        stderr.contains("a shardline that supports superblock version 4 (a newer release)"),
        "{stderr}"
    );
    assert!(stderr.contains("refusing to boot"), "{stderr}");
    let mut after = files_under(&data_dir);
    // The lock file is the server's own (flock); it holds no data.
    after.retain(|path, _| before.contains_key(path));
    assert_eq!(after, before, "a refused boot wrote to the data directory");
}

/// Review finding (a client of the previous release against this server retried for about 30 s,
/// then printed only "connection closed"): a request of an older protocol version is answered
/// in that version with `InvalidArgument` naming both versions, which such a client shows, and
/// the connection is closed; nothing is applied, and a request of this version on a new
/// connection is served as usual.
#[test]
fn issue12_timestamp_rule_a_client_of_an_older_protocol_is_told_which_versions_differ() {
    use std::io::{Read, Write};
    let dir = tempfile::tempdir().unwrap();
    let server = Server::start(&dir.path().join("data"), &SHARDS);
    let older = bus::PROTOCOL_VERSION - 1;
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    stream
        .set_read_timeout(Some(std::time::Duration::from_mins(1)))
        .unwrap();
    let mut header = bus::Header::new(bus::Command::Request, bus::Operation::CreateStream);
    header.protocol_version = older;
    header.client = 0x01d;
    header.request = 1;
    stream
        .write_all(&bus::encode_frame(&mut header, b"old"))
        .unwrap();
    let mut head = [0u8; bus::HEADER_SIZE];
    stream.read_exact(&mut head).unwrap();
    let reply: bus::Header = bytemuck::pod_read_unaligned(&head);
    assert_eq!(reply.protocol_version, older);
    assert!(reply.valid_checksum());
    assert_eq!(reply.error_code, bus::ErrorCode::InvalidArgument as u32);
    let mut body = vec![0u8; reply.size as usize - bus::HEADER_SIZE];
    stream.read_exact(&mut body).unwrap();
    assert!(reply.valid_checksum_body(&body));
    assert_eq!(
        String::from_utf8(body).unwrap(),
        format!(
            "this server speaks protocol version {} and this client speaks version {older}: \
             upgrade the client to the server's release (README, \"Upgrading and downgrading\"); \
             nothing was applied and the server closes the connection",
            bus::PROTOCOL_VERSION
        )
    );
    let mut rest = Vec::new();
    assert_eq!(
        stream.read_to_end(&mut rest).unwrap(),
        0,
        "the server closed"
    );
    block_on(async {
        let mut client = bus::Client::connect(server.addr).await.unwrap();
        let metadata = client.get_metadata().await.unwrap();
        assert!(
            metadata.streams.is_empty(),
            "nothing was applied: {:?}",
            metadata.streams
        );
    });
    assert_eq!(server.stop(), Some(0));
}
