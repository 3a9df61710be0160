//! The resync search after damage in the active segment, on entries as clients build them
//! (`storage/FORMAT.md` section 4, "Open" step 4; the issue 12 follow-up on the search's
//! budget). Six entries of real dpkg log lines, 1000 per entry (about 100 KB each) as
//! `shardline send --batch 1000` builds them, are appended to a partition log; one payload byte
//! of the third entry is flipped. Open must find the valid entries after it and report the
//! whole cut (offsets 2000..=5234) instead of spending its budget on garbage that passes the
//! bare header rules, and `shardline inspect segment` must reach the same verdict.

use std::path::{Path, PathBuf};
use std::process::Command;

use bus::BatchBuilder;
use storage::entry::ENTRY_HEADER_SIZE;
use storage::{FsyncPolicy, LogConfig, PartitionLog};

const LINES_PER_ENTRY: usize = 1000;
const LINE_COUNT: usize = 5235;
const DAMAGED_ENTRY: usize = 2;

fn block_on<F: Future>(future: F) -> F::Output {
    compio::runtime::Runtime::new().unwrap().block_on(future)
}

fn dpkg_lines() -> Vec<Vec<u8>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../shared/data/dpkg-events.log");
    let text = std::fs::read(&path)
        .unwrap_or_else(|e| panic!("{} is needed by this test: {e}", path.display()));
    let lines: Vec<Vec<u8>> = text
        .split(|&byte| byte == b'\n')
        .filter(|line| !line.is_empty())
        .take(LINE_COUNT)
        .map(<[u8]>::to_vec)
        .collect();
    assert_eq!(lines.len(), LINE_COUNT, "{} is too short", path.display());
    lines
}

/// Appends `lines` in entries of `lines_per_entry` messages (ids = line numbers, timestamps one
/// microsecond apart, as `shardline send` sets them); returns each entry's byte position.
fn write_segment(dir: &Path, lines: &[Vec<u8>], lines_per_entry: usize) -> Vec<u64> {
    block_on(async {
        let (log, _) = PartitionLog::open(dir, config()).await.unwrap();
        let mut positions = Vec::new();
        let mut position = 0u64;
        for (entry_index, chunk) in lines.chunks(lines_per_entry).enumerate() {
            let mut builder =
                BatchBuilder::with_capacity(chunk.len(), chunk.iter().map(Vec::len).sum());
            for (index, line) in chunk.iter().enumerate() {
                let id = (entry_index * lines_per_entry + index) as u64;
                builder.push(id, 1_796_179_505_609_865 + id, line);
            }
            let entry = builder.finish();
            positions.push(position);
            position += entry.len() as u64;
            log.append(entry).await.unwrap();
        }
        log.close().await.unwrap();
        positions
    })
}

/// One 1 GiB segment, fsync always.
fn config() -> LogConfig {
    LogConfig {
        fsync: FsyncPolicy::Always,
        segment_size_max: 1 << 30,
        write_mode: storage::WriteMode::Buffered,
    }
}

fn segment(dir: &Path) -> PathBuf {
    dir.join(format!("{:020}.log", 0))
}

#[test]
fn issue12_resync_finds_the_entries_after_a_flipped_byte_in_a_100_kb_entry_of_text_lines() {
    let dir = tempfile::tempdir().unwrap();
    let positions = write_segment(dir.path(), &dpkg_lines(), LINES_PER_ENTRY);
    let damaged_at = positions[DAMAGED_ENTRY];
    let path = segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let size_bytes = bytes.len() as u64;
    bytes[damaged_at as usize + ENTRY_HEADER_SIZE + 5000] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();

    // The offline checker first: it must not change the file, and must say what open will do.
    let output = Command::new(env!("CARGO_BIN_EXE_shardline"))
        .args(["inspect", "segment"])
        .arg(&path)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&output.stdout).into_owned()
        + &String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{text}");
    assert!(
        text.contains(&format!("at byte {damaged_at}")) && text.contains("offsets 2000-5234"),
        "inspect must report the whole cut, offsets 2000-5234: {text}"
    );
    assert!(
        !text.contains("budget"),
        "the search must not run out of budget: {text}"
    );
    assert_eq!(std::fs::read(&path).unwrap(), bytes, "inspect is read-only");

    block_on(async {
        let (log, report) = PartitionLog::open(dir.path(), config()).await.unwrap();
        let quarantined = report.quarantined.expect("the damaged tail is quarantined");
        assert_eq!(
            (quarantined.position, quarantined.size_bytes),
            (damaged_at, size_bytes - damaged_at)
        );
        assert_eq!(
            (quarantined.first_offset, quarantined.last_offset),
            (2000, 5234)
        );
        // The search hashed about the valid tail once, far below its 3x budget.
        let valid_tail = size_bytes - positions[DAMAGED_ENTRY + 1];
        assert!(
            quarantined.resync_charged_bytes <= valid_tail,
            "charged {} bytes for a valid tail of {valid_tail}",
            quarantined.resync_charged_bytes
        );
        assert_eq!(report.next_offset, 2000);
        assert_eq!(
            std::fs::read(&quarantined.path).unwrap(),
            bytes[damaged_at as usize..]
        );
        log.close().await.unwrap();
    });
}

/// The adversarial review's case: entries of 500 one-byte messages whose ids equal their offsets.
/// Read 16 bytes into a message header, the id looks like a base offset inside the resync's
/// offset bound, and message count and length (from the payload and the next header) pass too:
/// 62 such candidates inside the damaged entry were each charged their whole claimed length and
/// spent the budget. Charged 32 bytes per message header walked instead, they are refused at
/// their first header and the five valid entries after the damage are found.
#[test]
fn issue12_resync_finds_the_entries_after_damage_in_an_entry_of_one_byte_messages() {
    let dir = tempfile::tempdir().unwrap();
    let lines = vec![b"x".to_vec(); 3000];
    let positions = write_segment(dir.path(), &lines, 500);
    assert_eq!(positions.len(), 6);
    let path = segment(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    let size_bytes = bytes.len() as u64;
    bytes[100] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    block_on(async {
        let (_log, report) = PartitionLog::open(dir.path(), config()).await.unwrap();
        let quarantined = report.quarantined.expect("the damaged tail is quarantined");
        assert_eq!(
            (quarantined.position, quarantined.size_bytes),
            (0, size_bytes)
        );
        assert_eq!(
            (quarantined.first_offset, quarantined.last_offset),
            (0, 2999)
        );
        let valid_tail = size_bytes - positions[1];
        assert!(
            quarantined.resync_charged_bytes <= 2 * valid_tail,
            "charged {} bytes for a valid tail of {valid_tail}",
            quarantined.resync_charged_bytes
        );
    });
}
