//! `shardline inspect` on files written by the real storage code: a clean file exits 0 with its
//! exact figures, a flipped byte or a torn tail exits 1 naming the file and the byte position, and
//! `--json` is one parseable document. The inspected files are never modified.

use std::path::{Path, PathBuf};
use std::process::Command;

use storage::journal::{JournalConfig, Prepare};
use storage::{FsyncPolicy, Journal, LogConfig, PartitionLog, Superblock, SuperblockState};

const BIN: &str = env!("CARGO_BIN_EXE_shardline");

fn block_on<T>(future: impl Future<Output = T>) -> T {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

/// Runs `shardline inspect ARGS`; returns (exit code, stdout, stderr).
fn inspect(args: &[&str]) -> (i32, String, String) {
    let output = Command::new(BIN)
        .arg("inspect")
        .args(args)
        .output()
        .unwrap();
    (
        output.status.code().unwrap(),
        String::from_utf8(output.stdout).unwrap(),
        String::from_utf8(output.stderr).unwrap(),
    )
}

fn inspect_path(kind: &str, path: &Path) -> (i32, String, String) {
    inspect(&[kind, path.to_str().unwrap()])
}

fn inspect_json(kind: &str, path: &Path) -> (i32, serde_json::Value) {
    let (code, stdout, stderr) = inspect(&[kind, path.to_str().unwrap(), "--json"]);
    let value = serde_json::from_str(&stdout).unwrap_or_else(|error| {
        panic!("--json output does not parse: {error}\nstdout: {stdout}\nstderr: {stderr}")
    });
    (code, value)
}

fn flip_byte(path: &Path, position: usize) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[position] ^= 0x40;
    std::fs::write(path, bytes).unwrap();
}

fn truncate_by(path: &Path, bytes_count: u64) {
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    let size = file.metadata().unwrap().len();
    file.set_len(size - bytes_count).unwrap();
}

// ---------------------------------------------------------------- superblock

/// A superblock at sequence 3 (created, then written twice).
fn superblock(dir: &Path) -> PathBuf {
    let path = dir.join("superblock");
    block_on(async {
        let state = SuperblockState {
            sequence: 0,
            cluster: 0xabcd,
            replica_id: 0,
            replica_count: 1,
            view: 0,
            log_view: 0,
            commit_max: 0,
            checkpoint_op: 0,
            snapshot_checksum: 0,
        };
        let mut superblock = Superblock::create(&path, state).await.unwrap();
        for step in 1..=2u32 {
            superblock
                .write(SuperblockState {
                    view: step * 2,
                    log_view: step,
                    commit_max: u64::from(step) * 10,
                    checkpoint_op: u64::from(step) * 5,
                    snapshot_checksum: 0xbeef,
                    ..state
                })
                .await
                .unwrap();
        }
        superblock.close().await.unwrap();
    });
    path
}

#[test]
fn superblock_clean_shows_four_current_copies_and_the_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    // The directory works as well as the file.
    let (code, stdout, stderr) = inspect_path("superblock", dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "state (copy 0): sequence 3 cluster 0x0000000000000000000000000000abcd replica 0/1 \
             view 4 log_view 2 commit_max 20 checkpoint_op 10 snapshot_checksum \
             0x000000000000beef"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 4 current, 0 stale, 0 invalid"),
        "{stdout}"
    );
    assert!(stdout.ends_with("result: clean\n"), "{stdout}");
    assert!(!stdout.contains("note:"), "{stdout}");
    assert!(
        stdout.contains(&format!("file: {} (16384 bytes)", path.display())),
        "{stdout}"
    );
    let (_, json) = inspect_json("superblock", &path);
    assert_eq!(json["upgrade"], serde_json::Value::Null);
    assert_eq!(json["notes"], serde_json::json!([]));
}

#[test]
fn superblock_flipped_byte_names_the_file_copy_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    flip_byte(&path, 4096 + 50);
    let before = std::fs::read(&path).unwrap();
    let (code, stdout, _) = inspect_path("superblock", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 4096: copy 1 is invalid: checksum mismatch",
            path.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("open still boots from copy 0"), "{stdout}");
    assert!(
        stdout.contains("summary: 3 current, 0 stale, 1 invalid"),
        "{stdout}"
    );
    // The version field is intact but the checksum fails: shown, marked unverified.
    assert!(
        stdout.contains("\n1         4096  invalid       3?         -  checksum mismatch: "),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "note: a version shown as N? is the field read from a copy whose checksum fails: \
             unverified, it may be damaged\n"
        ),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect modified the file"
    );
}

#[test]
fn superblock_all_copies_invalid_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    for copy_index in 0..4 {
        flip_byte(&path, copy_index * 4096 + 30);
    }
    let (code, stdout, _) = inspect_path("superblock", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {}: all 4 superblock copies are invalid",
            path.display()
        )),
        "{stdout}"
    );
    assert!(stdout.contains("state: none (no valid copy)"), "{stdout}");
}

#[test]
fn superblock_json_has_copies_and_state() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    flip_byte(&path, 3 * 4096 + 8);
    let (code, json) = inspect_json("superblock", &path);
    assert_eq!(code, 1);
    assert_eq!(json["kind"], "superblock");
    assert_eq!(json["clean"], false);
    assert_eq!(json["chosen_copy"], 0);
    assert_eq!(json["state"]["sequence"], 3);
    assert_eq!(json["state"]["commit_max"], 20);
    assert_eq!(json["copies"].as_array().unwrap().len(), 4);
    assert_eq!(json["copies"][3]["status"], "invalid");
    // The flip hit the version field: the checksum no longer verifies, so it is damage (only an
    // intact copy of another version is a newer binary's).
    assert!(
        json["copies"][3]["reason"]
            .as_str()
            .unwrap()
            .starts_with("checksum mismatch"),
        "{json}"
    );
    assert_eq!(json["copies"][0]["version"], 3);
    assert_eq!(json["copies"][0]["version_verified"], true);
    // The flip turned version 3 into 3 ^ 0x40 = 67: shown as read, unverified.
    assert_eq!(json["copies"][3]["version"], 67);
    assert_eq!(json["copies"][3]["version_verified"], false);
    assert_eq!(json["notes"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(json["damage"][0]["position"], 12288);
    assert_eq!(json["damage"][0]["torn_tail"], false);
}

/// Sets copy `copy_index` of the superblock at `path` to `version`, resealing its checksum (what
/// a binary of that version writes; versions 1, 2 and 3 share the layout).
fn set_copy_version(path: &Path, copy_index: usize, version: u16) {
    let mut image = std::fs::read(path).unwrap();
    let copy = &mut image[copy_index * 4096..(copy_index + 1) * 4096];
    copy[8..10].copy_from_slice(&version.to_le_bytes());
    let checksum = twox_hash::XxHash3_128::oneshot(&copy[..112]);
    copy[112..128].copy_from_slice(&checksum.to_le_bytes());
    std::fs::write(path, image).unwrap();
}

#[test]
fn issue12_downgrade_inspect_superblock_shows_each_copy_version() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    // A write of a version-1 file torn by a crash after copy 1: copies 2 and 3 still version 1.
    set_copy_version(&path, 2, 1);
    set_copy_version(&path, 3, 1);
    let (code, stdout, stderr) = inspect_path("superblock", &path);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("copy      byte  status   version  sequence  reason\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("0            0  current        3         3\n"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3        12288  current        1         3\n"),
        "{stdout}"
    );
    let (_, json) = inspect_json("superblock", &path);
    let versions: Vec<u64> = json["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|copy| copy["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [3, 3, 1, 1]);
    assert_eq!(json["unsupported_version"], serde_json::Value::Null);
    assert_eq!(json["upgrade"], serde_json::json!({"from": 1, "to": 3}));
    assert_eq!(json["clean"], true);
    assert_eq!(
        json["notes"][0],
        "valid copies at version 1 (copy 2, 3): the next `shardline serve` on this data directory \
         upgrades every copy to version 3 before it opens any partition, and from then on \
         shardline releases that read superblock versions only up to 2 (from before the \
         timestamp entry checksum rule, flag bit 2) refuse it; only a copy of the data \
         directory made before that serve can go back to them"
    );
}

/// The end of `inspect superblock`'s output for a clean file whose four copies are all at
/// `version` (below 3): the summary, the upgrade note, the result.
fn upgrade_note_of_all_copies_at(version: u16) -> String {
    format!(
        "summary: 4 current, 0 stale, 0 invalid\n\
         note: valid copies at version {version} (copy 0, 1, 2, 3): the next `shardline serve` on \
         this data directory upgrades every copy to version 3 before it opens any partition, and \
         from then on shardline releases that read superblock versions only up to 2 (from before \
         the timestamp entry checksum rule, flag bit 2) refuse it; only a copy of the data \
         directory made before that serve can go back to them\n\
         result: clean\n"
    )
}

#[test]
fn issue12_downgrade_inspect_superblock_notes_the_upgrade_of_an_all_version_1_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    for copy_index in 0..4 {
        set_copy_version(&path, copy_index, 1);
    }
    let (code, stdout, stderr) = inspect_path("superblock", &path);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.ends_with(&upgrade_note_of_all_copies_at(1)),
        "{stdout}"
    );
    let (code, json) = inspect_json("superblock", &path);
    assert_eq!(code, 0);
    assert_eq!(json["upgrade"], serde_json::json!({"from": 1, "to": 3}));
    assert_eq!(json["notes"].as_array().unwrap().len(), 1, "{json}");
}

#[test]
fn issue12_timestamp_rule_inspect_superblock_shows_version_2_copies_and_notes_the_upgrade() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    // A directory today's release before the timestamp rule left: every copy at version 2.
    for copy_index in 0..4 {
        set_copy_version(&path, copy_index, 2);
    }
    let before = std::fs::read(&path).unwrap();
    let (code, stdout, stderr) = inspect_path("superblock", &path);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("2         8192  current        2         3\n"),
        "{stdout}"
    );
    assert!(
        stdout.ends_with(&upgrade_note_of_all_copies_at(2)),
        "{stdout}"
    );
    let (code, json) = inspect_json("superblock", &path);
    assert_eq!(code, 0);
    assert_eq!(json["upgrade"], serde_json::json!({"from": 2, "to": 3}));
    assert_eq!(json["unsupported_version"], serde_json::Value::Null);
    assert_eq!(json["chosen_copy"], 0);
    assert_eq!(json["notes"].as_array().unwrap().len(), 1, "{json}");
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect modified the file"
    );

    // The upgrade to 3 torn after copy 1: copies 2 and 3 still version 2, still due.
    set_copy_version(&path, 0, 3);
    set_copy_version(&path, 1, 3);
    let (code, json) = inspect_json("superblock", &path);
    assert_eq!(code, 0);
    let versions: Vec<u64> = json["copies"]
        .as_array()
        .unwrap()
        .iter()
        .map(|copy| copy["version"].as_u64().unwrap())
        .collect();
    assert_eq!(versions, [3, 3, 2, 2]);
    assert_eq!(json["upgrade"], serde_json::json!({"from": 2, "to": 3}));
    assert!(
        json["notes"][0]
            .as_str()
            .unwrap()
            .starts_with("valid copies at version 2 (copy 2, 3): the next `shardline serve`"),
        "{json}"
    );
}

#[test]
fn inspect_superblock_version_0_is_no_shardline_version_and_no_newer_release() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    set_copy_version(&path, 2, 0);
    let (code, stdout, _) = inspect_path("superblock", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {}: copy 2 has version 0, which is not a shardline superblock version \
             (shardline writes versions 1 and up; this binary reads 1 to 3): its checksum \
             verifies, so another program wrote it, or damage rewrote it whole; open refuses this \
             file, and no shardline release reads it: restore the data directory from a backup\n",
            path.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n2         8192  invalid        0         -  version 0, which is not a shardline \
             superblock version (shardline writes versions 1 and up; this binary reads 1 to 3)\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "state: none (a copy has version 0, which is not a shardline superblock version)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("newer"), "{stdout}");
    let (_, json) = inspect_json("superblock", &path);
    assert_eq!(json["unsupported_version"], 0);
    assert_eq!(json["copies"][2]["version"], 0);
    assert_eq!(json["copies"][2]["version_verified"], true);
    assert_eq!(json["upgrade"], serde_json::Value::Null);
}

#[test]
fn issue12_downgrade_inspect_superblock_names_a_newer_version_that_open_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let path = superblock(dir.path());
    set_copy_version(&path, 1, 4);
    let before = std::fs::read(&path).unwrap();
    let (code, stdout, _) = inspect_path("superblock", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {}: copy 1 has version 4, but this binary reads only versions 1 to 3: a \
             newer shardline wrote this file, and open refuses it",
            path.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("state: none (a copy has version 4, which this binary does not read)"),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "\n1         4096  invalid        4         -  version 4, which this binary does not \
             read (it reads versions 1 to 3; a newer shardline wrote it)\n"
        ),
        "{stdout}"
    );
    let (_, json) = inspect_json("superblock", &path);
    assert_eq!(json["unsupported_version"], 4);
    assert_eq!(json["chosen_copy"], serde_json::Value::Null);
    assert_eq!(json["copies"][1]["version"], 4);
    assert_eq!(json["copies"][1]["version_verified"], true);
    assert_eq!(
        std::fs::read(&path).unwrap(),
        before,
        "inspect modified the file"
    );
}

// ---------------------------------------------------------------- wal

/// A journal of ops 1..=5 with 50-byte bodies (114-byte records) in 256-byte segments: two records
/// per segment, so segments 1, 3 and 5.
fn journal(dir: &Path) {
    block_on(async {
        let (mut journal, _) = Journal::open_with_config(
            dir,
            JournalConfig {
                segment_size_max: 256,
            },
        )
        .await
        .unwrap();
        for op in 1..=5u64 {
            journal
                .append(&Prepare {
                    op,
                    view: 7,
                    commit: op - 1,
                    body: vec![op as u8; 50],
                })
                .await
                .unwrap();
        }
    });
}

fn wal_segment(dir: &Path, first_op: u64) -> PathBuf {
    dir.join(format!("{first_op:020}.wal"))
}

#[test]
fn wal_clean_lists_every_record() {
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path());
    let (code, stdout, stderr) = inspect_path("wal", dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("summary: 3 segment(s), 5 record(s), first_op 1, last_op 5, 570 bytes"),
        "{stdout}"
    );
    // Record of op 2: second in the first segment, at byte 114.
    assert!(
        stdout.contains("         114            2      7            1         50  ok"),
        "{stdout}"
    );
    assert!(stdout.ends_with("result: clean\n"), "{stdout}");
}

#[test]
fn wal_damage_in_a_closed_segment_names_file_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path());
    let closed = wal_segment(dir.path(), 1);
    flip_byte(&closed, 114 + 64 + 3);
    let (code, stdout, _) = inspect_path("wal", dir.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 114: body checksum",
            closed.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("in a closed segment: open refuses to boot"),
        "{stdout}"
    );
}

#[test]
fn wal_torn_tail_is_reported_as_such_and_left_alone() {
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path());
    let last = wal_segment(dir.path(), 5);
    truncate_by(&last, 10);
    let before = std::fs::read(&last).unwrap();
    // One segment file given directly: it is the last, so a torn tail is possible.
    let (code, stdout, _) = inspect_path("wal", &last);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "torn tail: {} at byte 0: body of 50 bytes but only 40 bytes left after the header; \
             a torn tail of 104 bytes in the last segment, which open would truncate",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 1 segment(s), 0 record(s), first_op 5, last_op 4"),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(&last).unwrap(),
        before,
        "inspect modified the file"
    );
}

#[test]
fn wal_json_has_records_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path());
    let (code, json) = inspect_json("wal", dir.path());
    assert_eq!(code, 0);
    assert_eq!(json["clean"], true);
    assert_eq!(json["record_count"], 5);
    assert_eq!(json["first_op"], 1);
    assert_eq!(json["last_op"], 5);
    assert_eq!(json["segment_count"], 3);
    let record = &json["segments"][1]["records"][1];
    assert_eq!(record["op"], 4);
    assert_eq!(record["view"], 7);
    assert_eq!(record["commit"], 3);
    assert_eq!(record["body_size_bytes"], 50);
    assert_eq!(record["position"], 114);
    assert_eq!(record["checksums_ok"], true);
    assert_eq!(json["segments"][2]["last"], true);
    assert_eq!(json["damage"].as_array().unwrap().len(), 0);
}

// ---------------------------------------------------------------- segment

/// A 132-byte entry of 3 messages: a 100-byte payload (3 message headers, the first message's
/// 4 bytes) stamped with timestamp `1_000 + seed`.
/// Entries of even seeds flag the timestamp rule (their checksum covers the timestamp), those of
/// odd seeds are written as before the rule.
fn entry_of_3_messages(seed: u64) -> Vec<u8> {
    let mut section = storage::message_section(3, &[seed as u8; 4]);
    if seed.is_multiple_of(2) {
        section[12] |= storage::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
    }
    storage::build_entry_raw(1_000 + seed, 3, &section)
}

/// A partition log of 5 entries of 3 messages and 100 payload bytes (132-byte entries) in
/// 300-byte segments: segments 0 and 6 closed (with index files), 12 last.
fn partition_log(dir: &Path) {
    block_on(async {
        let (log, _) = PartitionLog::open(
            dir,
            LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 300,
                write_mode: storage::WriteMode::Buffered,
            },
        )
        .await
        .unwrap();
        for seed in 0..5u64 {
            let entry = entry_of_3_messages(seed);
            log.append(entry).await.unwrap();
        }
        log.close().await.unwrap();
    });
}

fn log_segment(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.log"))
}

#[test]
fn segment_clean_walks_entries_and_matches_indexes() {
    let dir = tempfile::tempdir().unwrap();
    partition_log(dir.path());
    let (code, stdout, stderr) = inspect_path("segment", dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains("summary: 3 segment(s), 5 entries, 15 messages, next_offset 15, 660 bytes"),
        "{stdout}"
    );
    assert_eq!(
        stdout.matches("index used by open (2 rows)").count(),
        2,
        "{stdout}"
    );
    assert!(stdout.contains("132 bytes, last; no index)"), "{stdout}");
    // Entry at offset 9: second in segment 6, at byte 132, written as before the timestamp
    // rule; the entry at offset 6 (seed 2) flags it.
    assert!(
        stdout.contains(
            "           132            9        3        100               1003  ok (timestamp \
             not covered: written before the timestamp rule)\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("             0            6        3        100               1002  ok\n"),
        "{stdout}"
    );
}

#[test]
fn segment_damage_in_a_closed_segment_names_file_and_byte() {
    let dir = tempfile::tempdir().unwrap();
    partition_log(dir.path());
    let closed = log_segment(dir.path(), 0);
    flip_byte(&closed, 132 + 40);
    let (code, stdout, _) = inspect_path("segment", dir.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 132: payload checksum",
            closed.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "(offsets 3 to 5; in a closed segment whose index open uses: the server boots, and \
             polls return the messages before this entry, then fail at it)"
        ),
        "{stdout}"
    );
    assert_eq!(stdout.matches("damage: ").count(), 1, "{stdout}");
}

#[test]
fn segment_torn_tail_and_damaged_index_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    partition_log(dir.path());
    let last = log_segment(dir.path(), 12);
    truncate_by(&last, 1);
    let index = dir.path().join(format!("{:020}.index", 6));
    flip_byte(&index, 20);
    let before = std::fs::read(&last).unwrap();
    let (code, stdout, _) = inspect_path("segment", dir.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "torn tail: {} at byte 0: entry of 132 bytes but only 131 bytes left; a torn tail of 131 bytes in the last segment, which open would truncate",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "damage: {}: index not used by open: trailer at byte 80",
            index.display()
        )),
        "{stdout}"
    );
    assert_eq!(
        std::fs::read(&last).unwrap(),
        before,
        "inspect modified the file"
    );
    let (_, json) = inspect_json("segment", dir.path());
    assert_eq!(json["segments"][1]["index"]["status"], "rejected_by_open");
    assert_eq!(json["segments"][0]["index"]["status"], "used_by_open");
    assert_eq!(json["damage"][0]["torn_tail"], false);
    assert_eq!(json["damage"][1]["torn_tail"], true);
    assert_eq!(json["damage"][1]["position"], 0);
}

/// Issue 12 item 3: the last segment of a direct-mode log caught while running (or after a
/// crash) ends in the zero padding of its last direct write. Inspect reaches open's verdict: not
/// damage nor a torn tail, but padding that open cuts; the summary counts the file's bytes.
#[test]
fn issue12_3_segment_direct_write_padding_is_named_not_damage() {
    let dir = tempfile::tempdir().unwrap();
    let image = tempfile::tempdir().unwrap();
    block_on(async {
        let (log, _) = PartitionLog::open(
            dir.path(),
            LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: storage::WriteMode::Direct,
            },
        )
        .await
        .unwrap();
        for seed in 0..5u64 {
            log.append(entry_of_3_messages(seed)).await.unwrap();
        }
        assert_eq!(log.write_mode_in_use(), storage::WriteMode::Direct);
        std::fs::copy(log_segment(dir.path(), 0), log_segment(image.path(), 0)).unwrap();
        log.close().await.unwrap();
    });
    let (code, stdout, stderr) = inspect_path("segment", image.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(
            "(4096 bytes, last, the last 3436 of them zero padding of a direct write, which open \
             cuts; no index)"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 1 segment(s), 5 entries, 15 messages, next_offset 15"),
        "{stdout}"
    );
    let (_, json) = inspect_json("segment", image.path());
    assert_eq!(json["segments"][0]["direct_padding_bytes"], 3436);
    // After the close the segment ends at its last entry.
    let (code, stdout, _) = inspect_path("segment", dir.path());
    assert_eq!(code, 0, "{stdout}");
    assert!(stdout.contains("(660 bytes, last; no index)"), "{stdout}");
}

#[test]
fn issue7_4_segment_interior_damage_in_the_last_segment_then_its_quarantine_file() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    block_on(async {
        let (log, _) = PartitionLog::open(
            &log_dir,
            LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: storage::WriteMode::Buffered,
            },
        )
        .await
        .unwrap();
        for seed in 0..3u64 {
            let entry = entry_of_3_messages(seed);
            log.append(entry).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let last = log_segment(&log_dir, 0);
    flip_byte(&last, 40);
    let (code, stdout, _) = inspect_path("segment", &log_dir);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 0: payload checksum",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "valid entries follow it, so this is interior damage, not a torn write: open copies \
             the 396 bytes from here (offsets 0-8, possibly acknowledged) to {}.damaged-at-0, \
             logs an error and truncates the segment here",
            last.display()
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("torn tail:"), "{stdout}");

    // Open quarantines the bytes; inspect then lists the file and finds no damage.
    block_on(async {
        let (_log, report) = PartitionLog::open(
            &log_dir,
            LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: storage::WriteMode::Buffered,
            },
        )
        .await
        .unwrap();
        assert_eq!(report.quarantined.unwrap().size_bytes, 396);
    });
    let (code, stdout, _) = inspect_path("segment", &log_dir);
    assert_eq!(code, 0, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "quarantine file {}.damaged-at-0 (396 bytes): bytes open cut from the last segment \
             after damage that may have been acknowledged, kept for inspection (not read by the \
             server)",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 1 segment(s), 0 entries, 0 messages, next_offset 0, 0 bytes"),
        "{stdout}"
    );
    let (_, json) = inspect_json("segment", &log_dir);
    assert_eq!(json["quarantine_files"][0]["size_bytes"], 396);
    assert_eq!(json["damage"].as_array().unwrap().len(), 0);
}

#[test]
fn segment_json_has_entries_and_summary() {
    let dir = tempfile::tempdir().unwrap();
    partition_log(dir.path());
    let (code, json) = inspect_json("segment", &log_segment(dir.path(), 6));
    assert_eq!(code, 0);
    assert_eq!(json["kind"], "segment");
    assert_eq!(json["entry_count"], 2);
    assert_eq!(json["message_count"], 6);
    assert_eq!(json["next_offset"], 12);
    assert_eq!(json["size_bytes"], 264);
    let entry = &json["segments"][0]["entries"][1];
    assert_eq!(entry["base_offset"], 9);
    assert_eq!(entry["position"], 132);
    assert_eq!(entry["message_count"], 3);
    assert_eq!(entry["length_bytes"], 100);
    assert_eq!(entry["checksum_ok"], true);
    assert_eq!(entry["timestamp_covered"], false);
    assert_eq!(json["segments"][0]["entries"][0]["timestamp_covered"], true);
    assert_eq!(json["segments"][0]["last"], false);
    assert_eq!(json["segments"][0]["index"]["row_count"], 2);
}

// ---------------------------------------------------------------- metadata

const METADATA: &str = r#"{"version":1,"op":3,"streams":{"1":{"name":"orders","topics":{"1":{"name":"events","partition_count":8},"2":{"name":"audit","partition_count":4}}}}}"#;

fn metadata(dir: &Path) -> PathBuf {
    let path = dir.join("metadata.json");
    block_on(storage::durable_replace(
        &path,
        METADATA.as_bytes().to_vec(),
    ))
    .unwrap();
    path
}

#[test]
fn metadata_clean_counts_streams_topics_partitions() {
    let dir = tempfile::tempdir().unwrap();
    metadata(dir.path());
    let (code, stdout, stderr) = inspect_path("metadata", dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("version 1, op 3"), "{stdout}");
    assert!(
        stdout.contains("           1        2          4  audit"),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 1 stream(s), 2 topic(s), 12 partition(s)"),
        "{stdout}"
    );
    let (code, json) = inspect_json("metadata", &dir.path().join("metadata.json"));
    assert_eq!(code, 0);
    assert_eq!(json["trailer_ok"], true);
    assert_eq!(json["partition_count"], 12);
    assert_eq!(json["streams"][0]["topics"][0]["name"], "events");
}

#[test]
fn metadata_flipped_byte_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = metadata(dir.path());
    flip_byte(&path, 20);
    let (code, stdout, _) = inspect_path("metadata", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte {}: checksum mismatch",
            path.display(),
            METADATA.len()
        )),
        "{stdout}"
    );
    let (code, json) = inspect_json("metadata", &path);
    assert_eq!(code, 1);
    assert_eq!(json["trailer_ok"], false);
    assert_eq!(json["damage"][0]["file"], path.display().to_string());
}

// ---------------------------------------------------------------- snapshot

/// A snapshot at op 5 (one stream with two topics, one client session) and, when `pairing` is
/// given, a superblock recording (checkpoint_op, checksum) beside it.
fn snapshot(dir: &Path, pairing: Option<(u64, Option<u64>)>) -> (PathBuf, u64) {
    use shards::metadata::{MetadataOp, MetadataState};
    use shards::vsr::client_table::ClientTable;
    use shards::vsr::snapshot::{SNAPSHOT_PAYLOAD_VERSION, SnapshotPayload};
    let mut metadata = MetadataState::new();
    metadata.apply(
        2,
        &MetadataOp::CreateStream {
            stream_id: 1,
            name: "orders".to_owned(),
        },
    );
    for (op, topic_id, partition_count) in [(3, 1, 8), (4, 2, 4)] {
        metadata.apply(
            op,
            &MetadataOp::CreateTopic {
                stream_id: 1,
                topic_id,
                name: format!("t{topic_id}"),
                partition_count,
                retention: shards::metadata::Retention::default(),
            },
        );
    }
    let mut client_table = ClientTable::new(4);
    client_table.register(0xabc, 1);
    client_table.register(0xdef, 5);
    let payload = SnapshotPayload {
        version: SNAPSHOT_PAYLOAD_VERSION,
        checkpoint_op: 5,
        metadata,
        client_table: client_table.to_snapshot(),
    };
    let path = dir.join("snapshot");
    let checksum = block_on(storage::snapshot::write_snapshot(
        &path,
        5,
        payload.encode(),
        &mut |_| {},
    ))
    .unwrap();
    if let Some((checkpoint_op, recorded)) = pairing {
        block_on(Superblock::create(
            &dir.join("superblock"),
            SuperblockState {
                replica_count: 1,
                commit_max: 9,
                checkpoint_op,
                snapshot_checksum: recorded.unwrap_or(checksum),
                ..SuperblockState::default()
            },
        ))
        .unwrap();
    }
    (path, checksum)
}

#[test]
fn snapshot_clean_shows_op_checksum_pairing_and_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let (path, checksum) = snapshot(dir.path(), Some((5, None)));
    let (code, stdout, stderr) = inspect_path("snapshot", dir.path());
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(
        stdout.contains(&format!("checkpoint_op 5, checksum {checksum:#018x}")),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "{:#034x}          1          0          1       0",
            0xabc
        )),
        "{stdout}"
    );
    assert!(stdout.contains(": ok"), "{stdout}");
    assert!(
        stdout.contains("summary: 1 stream(s), 2 topic(s), 12 partition(s), 2 client session(s)"),
        "{stdout}"
    );
    let (code, json) = inspect_json("snapshot", &path);
    assert_eq!(code, 0);
    assert_eq!(json["present"], true);
    assert_eq!(json["snapshot"]["checkpoint_op"], 5);
    assert_eq!(json["snapshot"]["trailer_ok"], true);
    assert_eq!(
        json["snapshot"]["sessions"][1]["client"],
        format!("{:#034x}", 0xdef)
    );
}

#[test]
fn snapshot_flipped_payload_byte_names_the_file_and_trailer() {
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = snapshot(dir.path(), None);
    flip_byte(&path, 100);
    let (code, stdout, _) = inspect_path("snapshot", &path);
    assert_eq!(code, 1, "{stdout}");
    let size = std::fs::metadata(&path).unwrap().len();
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte {}: checksum mismatch",
            path.display(),
            size - 8
        )),
        "{stdout}"
    );
}

#[test]
fn snapshot_breaking_the_pairing_rule_is_damage() {
    let dir = tempfile::tempdir().unwrap();
    // The superblock says the checkpoint is at op 7: this snapshot (op 5) is older.
    let (path, _) = snapshot(dir.path(), Some((7, Some(1))));
    let (code, stdout, _) = inspect_path("snapshot", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("pairing rule: the snapshot is at op 5, older"),
        "{stdout}"
    );
    // Same op, another checksum.
    let dir = tempfile::tempdir().unwrap();
    let (path, _) = snapshot(dir.path(), Some((5, Some(1))));
    let (code, stdout, _) = inspect_path("snapshot", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("pairing rule: same op, different checksum"),
        "{stdout}"
    );
}

// ---------------------------------------------------------------- usage

#[test]
fn help_teaches_kinds_and_exit_codes_and_usage_errors_exit_2() {
    let (code, stdout, _) = inspect(&["--help"]);
    assert_eq!(code, 0);
    for needle in [
        "superblock",
        "wal",
        "segment",
        "metadata",
        "Exit status",
        "read-only",
    ] {
        assert!(stdout.contains(needle), "{needle} missing from:\n{stdout}");
    }
    let (code, _, stderr) = inspect(&["bogus", "x"]);
    assert_eq!(code, 2, "{stderr}");
    let (code, _, stderr) = inspect(&["wal", "/nonexistent/shardline-inspect"]);
    assert_eq!(code, 2);
    assert!(
        stderr.contains("/nonexistent/shardline-inspect: no such file"),
        "{stderr}"
    );
}

#[test]
fn wal_damage_before_a_valid_record_in_the_last_segment_is_interior() {
    let dir = tempfile::tempdir().unwrap();
    journal(dir.path());
    let last = wal_segment(dir.path(), 3);
    // Ops 3 and 4 in segment 3; with segment 5 removed, segment 3 is the last one.
    std::fs::remove_file(wal_segment(dir.path(), 5)).unwrap();
    flip_byte(&last, 64 + 10);
    let (code, stdout, _) = inspect_path("wal", dir.path());
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 0: body checksum",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(
            "(a valid record for op 4 follows at byte 114: interior damage, open refuses to boot)"
        ),
        "{stdout}"
    );
    assert!(!stdout.contains("torn tail:"), "{stdout}");
}

#[test]
fn fifos_and_devices_are_refused_not_read() {
    let dir = tempfile::tempdir().unwrap();
    let fifo = dir.path().join("metadata.json");
    let name = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path we own.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    for (kind, expected) in [
        ("metadata", "not a regular file"),
        ("superblock", "not a regular file"),
        ("wal", "expected a .wal file"),
        ("segment", "expected a .log file"),
    ] {
        let (code, stdout, stderr) = inspect_path(kind, &fifo);
        assert_ne!(code, 0, "{kind}: {stdout}");
        assert!(
            format!("{stdout}{stderr}").contains(expected),
            "{kind}: {stdout}{stderr}"
        );
    }
    let log_fifo = dir.path().join("00000000000000000000.log");
    let name = std::ffi::CString::new(log_fifo.to_str().unwrap()).unwrap();
    // SAFETY: as above.
    assert_eq!(unsafe { libc::mkfifo(name.as_ptr(), 0o600) }, 0);
    let (code, stdout, stderr) = inspect_path("segment", &log_fifo);
    assert_ne!(code, 0);
    assert!(
        format!("{stdout}{stderr}").contains("not a regular file"),
        "{stdout}{stderr}"
    );
    let (code, stdout, stderr) = inspect_path("metadata", Path::new("/dev/zero"));
    assert_ne!(code, 0);
    assert!(
        format!("{stdout}{stderr}").contains("not a regular file"),
        "{stdout}{stderr}"
    );
}

// ---------------------------------------------------------------- issue 7 section 6: PATH kinds

/// A data directory as the server lays it out: a superblock recording `checkpoint_op` (and no
/// snapshot file), `journal/` with the journal of `journal`, and partition 1/1/0 with the log of
/// `partition_log`.
fn data_dir(dir: &Path, checkpoint_op: u64) -> PathBuf {
    let data = dir.join("data");
    let journal_dir = data.join("journal");
    let partition = data.join("partitions/1/1/0");
    std::fs::create_dir_all(&journal_dir).unwrap();
    std::fs::create_dir_all(&partition).unwrap();
    block_on(Superblock::create(
        &data.join("superblock"),
        SuperblockState {
            replica_count: 1,
            commit_max: checkpoint_op,
            checkpoint_op,
            snapshot_checksum: if checkpoint_op == 0 { 0 } else { 0xbeef },
            ..SuperblockState::default()
        },
    ))
    .unwrap();
    journal(&journal_dir);
    partition_log(&partition);
    data
}

#[test]
fn issue7_6_inspect_wal_takes_a_data_directory() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path(), 0);
    let journal_dir = data.join("journal");
    let (code, stdout, stderr) = inspect_path("wal", &data);
    assert_eq!(code, 0, "{stdout}{stderr}");
    let (_, direct, _) = inspect_path("wal", &journal_dir);
    assert_eq!(stdout, direct, "the data directory is read as its journal/");
    assert!(
        stdout.starts_with(&format!("wal {}\n", journal_dir.display())),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 3 segment(s), 5 record(s), first_op 1, last_op 5"),
        "{stdout}"
    );
}

#[test]
fn issue7_6_inspect_a_path_of_another_kind_is_a_usage_error() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path(), 0);
    let journal_dir = data.join("journal");
    let d = data.display();
    let j = journal_dir.display();
    let segment_takes = "inspect segment takes a partition directory \
                         (DATA/partitions/STREAM/TOPIC/PARTITION) or one .log segment";
    let journal_looks = "a journal directory (.wal segments: use inspect wal)";
    for (kind, path, expected) in [
        (
            "segment",
            &journal_dir,
            format!("{j}: {journal_looks} without .log segments; {segment_takes}"),
        ),
        (
            "segment",
            &data,
            format!("{d}: a data directory without .log segments; {segment_takes}"),
        ),
        (
            "superblock",
            &journal_dir,
            format!(
                "{j}: {journal_looks} without a superblock file; inspect superblock takes the \
                 data directory or its superblock file (the data directory is {d})"
            ),
        ),
        (
            "snapshot",
            &journal_dir,
            format!(
                "{j}: {journal_looks} without a snapshot or superblock file; inspect snapshot \
                 takes the data directory or its snapshot file (the data directory is {d})"
            ),
        ),
        (
            "metadata",
            &data,
            format!(
                "{d}: a data directory without metadata.json (it is in the journal format: use \
                 inspect snapshot and inspect wal); inspect metadata takes a data directory of \
                 the format before the journal, or its metadata.json"
            ),
        ),
        (
            "wal",
            &log_segment(&data.join("partitions/1/1/0"), 0),
            format!(
                "{}: expected a .wal file or a directory of them; use the inspect kind that \
                 matches the file",
                log_segment(&data.join("partitions/1/1/0"), 0).display()
            ),
        ),
    ] {
        let (code, stdout, stderr) = inspect_path(kind, path);
        assert_eq!(code, 2, "{kind} {}: {stdout}{stderr}", path.display());
        assert_eq!(stderr, format!("error: {expected}\n"), "{kind}");
        assert_eq!(stdout, "", "{kind}");
    }
    // The right kinds on the same directory are clean, and damage still exits 1.
    assert_eq!(inspect_path("segment", &data.join("partitions/1/1/0")).0, 0);
    assert_eq!(inspect_path("superblock", &data).0, 0);
    flip_byte(&wal_segment(&journal_dir, 1), 64 + 10);
    assert_eq!(inspect_path("wal", &data).0, 1);
}

#[test]
fn issue7_6_inspect_snapshot_json_without_a_snapshot_says_not_present() {
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path(), 0);
    let (code, json) = inspect_json("snapshot", &data);
    assert_eq!(code, 0);
    assert_eq!(
        json,
        serde_json::json!({
            "kind": "snapshot",
            "path": data.display().to_string(),
            "clean": true,
            "damage": [],
            "file": data.join("snapshot").display().to_string(),
            "present": false,
            "no_snapshot_yet": "no snapshot yet: no checkpoint has been written (the first \
                comes after --checkpoint-interval committed metadata ops, or at a clean shutdown \
                after one)",
            "snapshot": null,
        })
    );
    // A superblock that records a checkpoint makes the missing file damage, still not present.
    let dir = tempfile::tempdir().unwrap();
    let data = data_dir(dir.path(), 10);
    let (code, json) = inspect_json("snapshot", &data);
    assert_eq!(code, 1);
    assert_eq!(json["present"], false);
    assert_eq!(json["snapshot"], serde_json::Value::Null);
    assert_eq!(json.get("no_snapshot_yet"), None);
    assert_eq!(
        json["damage"][0]["reason"],
        format!(
            "missing: {} records checkpoint_op 10 with checksum 0x000000000000beef (the server \
             refuses to boot)",
            data.join("superblock").display()
        )
    );
}

#[test]
fn issue7_1_segment_damaged_message_count_in_the_last_segment_is_interior_damage() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    block_on(async {
        let (log, _) = PartitionLog::open(
            &log_dir,
            LogConfig {
                fsync: FsyncPolicy::Always,
                segment_size_max: 1 << 20,
                write_mode: storage::WriteMode::Buffered,
            },
        )
        .await
        .unwrap();
        for seed in 0..3u64 {
            log.append(entry_of_3_messages(seed)).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let last = log_segment(&log_dir, 0);
    // Entry 1's message_count 3 -> 67 (bit 6): its payload checksum still matches.
    flip_byte(&last, 132 + 16);
    let (code, stdout, _) = inspect_path("segment", &log_dir);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 132: header declares 67 messages but the payload holds 3",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "valid entries follow it, so this is interior damage, not a torn write: open copies \
             the 264 bytes from here (offsets 3-8, possibly acknowledged) to {}.damaged-at-132, \
             logs an error and truncates the segment here",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 1 segment(s), 1 entries, 3 messages, next_offset 3, 396 bytes"),
        "{stdout}"
    );
}

/// A flipped payload byte in the complete last entry of the last segment: inspect gives open's
/// verdict (kept in a quarantine file, not a torn tail), and open then does exactly that.
#[test]
fn issue7_4_segment_damaged_complete_last_entry_is_kept_not_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let log_dir = dir.path().join("log");
    let config = LogConfig {
        fsync: FsyncPolicy::Always,
        segment_size_max: 1 << 20,
        write_mode: storage::WriteMode::Buffered,
    };
    block_on(async {
        let (log, _) = PartitionLog::open(&log_dir, config.clone()).await.unwrap();
        for seed in 0..3u64 {
            log.append(entry_of_3_messages(seed)).await.unwrap();
        }
        log.close().await.unwrap();
    });
    let last = log_segment(&log_dir, 0);
    flip_byte(&last, 264 + 40);
    let (code, stdout, _) = inspect_path("segment", &log_dir);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 264: payload checksum",
            last.display()
        )),
        "{stdout}"
    );
    assert!(
        stdout.contains(&format!(
            "the entry is complete (its header passes and it lies whole in the file), so it may \
             have been acknowledged: bit rot, not only a torn write: open copies the 132 bytes \
             from here (offsets 6-8, possibly acknowledged) to {}.damaged-at-264, logs an error \
             and truncates the segment here",
            last.display()
        )),
        "{stdout}"
    );
    assert!(!stdout.contains("torn tail:"), "{stdout}");
    let (_, json) = inspect_json("segment", &log_dir);
    assert_eq!(json["damage"][0]["torn_tail"], false);

    block_on(async {
        let (_log, report) = PartitionLog::open(&log_dir, config).await.unwrap();
        let quarantined = report.quarantined.unwrap();
        assert_eq!((quarantined.position, quarantined.size_bytes), (264, 132));
        assert_eq!((quarantined.first_offset, quarantined.last_offset), (6, 8));
    });
    let (code, stdout, _) = inspect_path("segment", &log_dir);
    assert_eq!(code, 0, "{stdout}");
}

// ---------------------------------------------------------------- manifest, clients (issue 9)

/// Writes `body` sealed with its XXH3-64 trailer to `dir/name`: a file whose trailer verifies, so
/// the rule under test (not the checksum) is what refuses it.
fn sealed_file(dir: &Path, name: &str, mut body: Vec<u8>) -> PathBuf {
    storage::codec::seal(&mut body);
    let path = dir.join(name);
    std::fs::write(&path, body).unwrap();
    path
}

/// The body of a valid encoding (without its trailer).
fn body_of(encoded: &[u8]) -> Vec<u8> {
    encoded[..encoded.len() - storage::codec::TRAILER_SIZE].to_vec()
}

fn manifest_bytes(client_table_len: u64) -> Vec<u8> {
    use shards::vsr::transfer::{ArtifactKind, Manifest, ManifestEntry, manifest};
    manifest::encode(&Manifest {
        entries: vec![
            ManifestEntry {
                kind: ArtifactKind::Metadata,
                frontier_op: 64,
                len: 1234,
                checksum: 0xabcd,
            },
            ManifestEntry {
                kind: ArtifactKind::ClientTable,
                frontier_op: 64,
                len: client_table_len,
                checksum: u128::MAX,
            },
        ],
    })
}

/// A client table of two sessions, one with a cached rejection, in the transfer encoding.
fn clients_bytes() -> Vec<u8> {
    use shards::vsr::client_table::{CachedReply, ClientTable};
    let mut table = ClientTable::new(4);
    table.register(0xabc, 1);
    table.register(0xdef, 2);
    table.commit(
        0xabc,
        3,
        CachedReply {
            request: 1,
            operation: 2,
            error_code: 3,
            offset: 0,
            count: 0,
            body: b"stream 1 already exists".to_vec(),
            request_checksum: 9,
        },
    );
    shards::vsr::transfer::client_table_wire::encode(&table.to_snapshot()).unwrap()
}

#[test]
fn issue9_inspect_manifest_clean_lists_artifacts() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest");
    std::fs::write(&path, manifest_bytes(20)).unwrap();
    let (code, stdout, stderr) = inspect_path("manifest", &path);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("(104 bytes, trailer ok)"), "{stdout}");
    assert!(
        stdout.contains(
            "metadata                       64         1234  0x0000000000000000000000000000abcd"
        ),
        "{stdout}"
    );
    assert!(stdout.contains("client_table"), "{stdout}");
    assert!(
        stdout.contains("summary: 2 artifact(s), 1254 bytes in all"),
        "{stdout}"
    );
    let (code, json) = inspect_json("manifest", &path);
    assert_eq!(code, 0);
    assert_eq!(json["kind"], "manifest");
    assert_eq!(json["clean"], true);
    assert_eq!(json["entries"][1]["kind"], "client_table");
    assert_eq!(json["entries"][1]["len"], 20);
    assert_eq!(json["total_len"], 1254);
    assert!(json["caps"]["client_table"].as_u64().unwrap() > 0);
}

#[test]
fn issue9_inspect_manifest_flipped_byte_names_the_trailer_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest");
    std::fs::write(&path, manifest_bytes(20)).unwrap();
    flip_byte(&path, 30);
    let (code, stdout, _) = inspect_path("manifest", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("trailer BAD"), "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 96: manifest: checksum mismatch: trailer at byte 96",
            path.display()
        )),
        "{stdout}"
    );
    let (code, json) = inspect_json("manifest", &path);
    assert_eq!(code, 1);
    assert_eq!(json["clean"], false);
    assert_eq!(json["damage"][0]["position"], 96);
}

#[test]
fn issue9_inspect_manifest_truncated_is_named() {
    let dir = tempfile::tempdir().unwrap();
    // Cut bytes: the trailer no longer matches.
    let path = dir.path().join("manifest");
    std::fs::write(&path, manifest_bytes(20)).unwrap();
    truncate_by(&path, 3);
    let (code, stdout, _) = inspect_path("manifest", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("checksum mismatch"), "{stdout}");
    // A file shorter than its trailer.
    truncate_by(&path, 96);
    let (code, stdout, _) = inspect_path("manifest", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("5 bytes is shorter than the 8-byte trailer"),
        "{stdout}"
    );
    // A cut body under a valid trailer: the field that runs out is named.
    let mut body = body_of(&manifest_bytes(20));
    body.truncate(body.len() - 1);
    let path = sealed_file(dir.path(), "cut", body);
    let (code, stdout, _) = inspect_path("manifest", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte 80: manifest: checksum: needs 16 bytes at byte 80, 15 left",
            path.display()
        )),
        "{stdout}"
    );
}

#[test]
fn issue9_inspect_manifest_names_the_broken_rule() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("manifest");
    std::fs::write(&path, manifest_bytes(0)).unwrap();
    let (code, stdout, _) = inspect_path("manifest", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(stdout.contains("trailer ok"), "{stdout}");
    assert!(
        stdout.contains("manifest: artifact client_table has length 0"),
        "{stdout}"
    );
}

#[test]
fn issue9_inspect_clients_clean_lists_sessions() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients");
    std::fs::write(&path, clients_bytes()).unwrap();
    let (code, stdout, stderr) = inspect_path("clients", &path);
    assert_eq!(code, 0, "{stdout}{stderr}");
    assert!(stdout.contains("trailer ok"), "{stdout}");
    assert!(
        stdout.contains(
            "  0x00000000000000000000000000000abc          1          1          3       1\n"
        ),
        "{stdout}"
    );
    assert!(
        stdout.contains("summary: 2 client session(s), checked against --clients-table-max"),
        "{stdout}"
    );
    let (code, json) = inspect_json("clients", &path);
    assert_eq!(code, 0);
    assert_eq!(json["kind"], "clients");
    assert_eq!(
        json["sessions"][1]["client"],
        "0x00000000000000000000000000000def"
    );
    assert_eq!(json["sessions"][0]["cached_reply_count"], 1);
}

#[test]
fn issue9_inspect_clients_flipped_byte_names_the_trailer_mismatch() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients");
    let bytes = clients_bytes();
    let trailer_at = bytes.len() - 8;
    std::fs::write(&path, bytes).unwrap();
    flip_byte(&path, 13);
    let (code, stdout, _) = inspect_path("clients", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains(&format!(
            "damage: {} at byte {trailer_at}: client table: checksum mismatch",
            path.display()
        )),
        "{stdout}"
    );
}

#[test]
fn issue9_inspect_clients_truncated_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("clients");
    std::fs::write(&path, clients_bytes()).unwrap();
    truncate_by(&path, 1);
    let (code, stdout, _) = inspect_path("clients", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("client table: checksum mismatch"),
        "{stdout}"
    );
    let mut body = body_of(&clients_bytes());
    body.truncate(body.len() - 1);
    let path = sealed_file(dir.path(), "cut", body);
    let (code, stdout, _) = inspect_path("clients", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("client table: session padding: needs 7 bytes"),
        "{stdout}"
    );
}

#[test]
fn issue9_inspect_clients_names_the_broken_rule() {
    let dir = tempfile::tempdir().unwrap();
    // Both sessions carry client id 0xabc.
    let mut body = body_of(&clients_bytes());
    let second = body.len() - 48;
    body[second..second + 16].copy_from_slice(&0xabc_u128.to_le_bytes());
    let path = sealed_file(dir.path(), "duplicate", body);
    let (code, stdout, _) = inspect_path("clients", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("client table: client 0x00000000000000000000000000000abc appears twice"),
        "{stdout}"
    );
    // Decodes, but a session rule install checks is broken: both commit ops are 3.
    let mut body = body_of(&clients_bytes());
    let commit_op = body.len() - 48 + 32;
    body[commit_op..commit_op + 8].copy_from_slice(&3_u64.to_le_bytes());
    let path = sealed_file(dir.path(), "shared-commit-op", body);
    let (code, stdout, _) = inspect_path("clients", &path);
    assert_eq!(code, 1, "{stdout}");
    assert!(
        stdout.contains("client table breaks a session rule"),
        "{stdout}"
    );
}

#[test]
fn issue9_inspect_manifest_and_clients_take_a_file_not_a_directory() {
    let dir = tempfile::tempdir().unwrap();
    for kind in ["manifest", "clients"] {
        let (code, _, stderr) = inspect_path(kind, dir.path());
        assert_eq!(code, 2, "{stderr}");
        assert!(
            stderr.contains(&format!("inspect {kind} takes a file")),
            "{stderr}"
        );
    }
    let (_, stdout, _) = inspect(&["--help"]);
    assert!(stdout.contains("manifest"), "{stdout}");
    assert!(stdout.contains("clients"), "{stdout}");
}
