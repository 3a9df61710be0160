//! `inspect snapshot`: verifies the checkpoint snapshot (`storage/FORMAT.md` section 9: header,
//! XXH3-64 trailer; section 9.1: the JSON payload of metadata and client table) by the rules the
//! server applies at boot, and, when a superblock lies beside it, the checkpoint pairing rule.
//! Reads only; never rewrites the file.

use std::fmt::Write as _;
use std::io::Read as _;
use std::path::Path;

use shards::limits::CLIENTS_TABLE_MAX_LIMIT;
use shards::vsr::client_table::SessionSnapshot;
use shards::vsr::snapshot::SnapshotPayload;
use storage::limits::{SNAPSHOT_FILE_SIZE_MAX, SUPERBLOCK_COPY_COUNT, SUPERBLOCK_COPY_SIZE};
use storage::snapshot::{SNAPSHOT_FILE_NAME, SnapshotDefect};
use storage::superblock::{SUPERBLOCK_FILE_NAME, SuperblockState, decode_copy};

use super::{Damage, Report, file_in, open_read_only, parent_dir, read_bounded};

/// What `inspect snapshot` found. In JSON: `present` (whether the snapshot file exists), `file`,
/// `no_snapshot_yet` (only on a healthy directory without one) and `snapshot`: the file's
/// details, or `null` when there is no file.
#[derive(Debug, serde::Serialize)]
pub(crate) struct SnapshotReport {
    file: String,
    present: bool,
    /// Set when a data directory has no snapshot file and its superblock records no checkpoint
    /// yet: a healthy new directory, not damage.
    #[serde(skip_serializing_if = "Option::is_none")]
    no_snapshot_yet: Option<String>,
    snapshot: Option<SnapshotDetails>,
}

/// What the snapshot file holds, as far as it decodes.
#[derive(Debug, Default, serde::Serialize)]
struct SnapshotDetails {
    file_size_bytes: u64,
    trailer_ok: bool,
    checkpoint_op: Option<u64>,
    /// The trailer, `0x`-hex: what the superblock's pairing records.
    checksum: Option<String>,
    payload_size_bytes: Option<u64>,
    /// The payload decoded and passed the boot rules (the counts below are meaningful).
    payload_decoded: bool,
    stream_count: usize,
    topic_count: usize,
    partition_count: u64,
    sessions: Vec<SessionReport>,
    /// The pairing with the superblock beside the snapshot, when there is one.
    pairing: Option<String>,
}

/// One client session as `inspect snapshot` and `inspect clients` list it.
#[derive(Debug, serde::Serialize)]
pub(crate) struct SessionReport {
    client: String,
    session: u64,
    request: u64,
    commit_op: u64,
    cached_reply_count: usize,
}

impl SessionReport {
    pub(crate) fn of(entry: &SessionSnapshot) -> SessionReport {
        SessionReport {
            client: entry.client.clone(),
            session: entry.session,
            request: entry.request,
            commit_op: entry.commit_op,
            cached_reply_count: entry.replies.len(),
        }
    }
}

/// The aligned session table: a header line, then one row per session.
pub(crate) fn write_sessions(sessions: &[SessionReport], out: &mut String) {
    let _ = writeln!(
        out,
        "  {:>36} {:>10} {:>10} {:>10} {:>7}",
        "client", "session", "request", "commit_op", "replies"
    );
    for session in sessions {
        let _ = writeln!(
            out,
            "  {:>36} {:>10} {:>10} {:>10} {:>7}",
            session.client,
            session.session,
            session.request,
            session.commit_op,
            session.cached_reply_count
        );
    }
}

/// Byte position a defect points at, when one applies.
fn defect_position(defect: &SnapshotDefect) -> Option<u64> {
    match defect {
        SnapshotDefect::TooShort { .. } | SnapshotDefect::TooLarge { .. } => None,
        SnapshotDefect::Checksum {
            trailer_position, ..
        } => Some(*trailer_position),
        SnapshotDefect::Magic { .. } => Some(0),
        SnapshotDefect::Version { .. } => Some(8),
        SnapshotDefect::Reserved { position, .. } => Some(*position),
        SnapshotDefect::PayloadSize { .. } => Some(24),
    }
}

/// The state of the superblock's newest valid copy in `dir`, if a readable one is there.
fn superblock_beside(dir: &Path) -> Option<(String, SuperblockState)> {
    let path = dir.join(SUPERBLOCK_FILE_NAME);
    let file = open_read_only(&path).ok()?;
    let mut bytes = Vec::new();
    file.take((SUPERBLOCK_COPY_COUNT * SUPERBLOCK_COPY_SIZE) as u64)
        .read_to_end(&mut bytes)
        .ok()?;
    let newest = (0..SUPERBLOCK_COPY_COUNT)
        .filter_map(|copy_index| {
            let start = copy_index * SUPERBLOCK_COPY_SIZE;
            let copy = bytes.get(start..start + SUPERBLOCK_COPY_SIZE)?;
            decode_copy(copy, copy_index).ok()
        })
        .max_by_key(|state| state.sequence)?;
    Some((path.display().to_string(), newest))
}

/// Why a data directory `dir` without a snapshot file is healthy (`Ok`: the superblock, if any,
/// records no checkpoint yet), or the damage it is (`Err`: the superblock records one, which boot
/// cannot restore without the file).
fn no_snapshot_verdict(dir: &Path) -> Result<String, String> {
    match superblock_beside(dir) {
        Some((superblock, state)) if state.checkpoint_op > 0 || state.snapshot_checksum != 0 => {
            Err(format!(
                "missing: {superblock} records checkpoint_op {} with checksum {:#018x} (the \
                 server refuses to boot)",
                state.checkpoint_op, state.snapshot_checksum
            ))
        }
        _ => Ok(
            "no snapshot yet: no checkpoint has been written (the first comes after \
                 --checkpoint-interval committed metadata ops, or at a clean shutdown after one)"
                .to_owned(),
        ),
    }
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(SnapshotReport, Vec<Damage>)> {
    let file = file_in(path, SNAPSHOT_FILE_NAME);
    let mut report = SnapshotReport {
        file: file.display().to_string(),
        present: false,
        no_snapshot_yet: None,
        snapshot: None,
    };
    let mut damage = Vec::new();
    if path.is_dir() && !file.exists() {
        match no_snapshot_verdict(path) {
            Ok(note) => report.no_snapshot_yet = Some(note),
            Err(reason) => damage.push(Damage::new(&file, None, reason)),
        }
        return Ok((report, damage));
    }
    report.present = true;
    report.snapshot = Some(inspect_file(&file, &mut damage)?);
    Ok((report, damage))
}

/// Decodes and checks the snapshot `file`, pushing what is wrong onto `damage`.
fn inspect_file(file: &Path, damage: &mut Vec<Damage>) -> anyhow::Result<SnapshotDetails> {
    let mut report = SnapshotDetails::default();
    let bytes = match read_bounded(file, SNAPSHOT_FILE_SIZE_MAX)? {
        Ok(bytes) => bytes,
        Err(size_bytes) => {
            report.file_size_bytes = size_bytes;
            damage.push(Damage::new(
                file,
                None,
                SnapshotDefect::TooLarge { size_bytes }.to_string(),
            ));
            return Ok(report);
        }
    };
    report.file_size_bytes = bytes.len() as u64;
    let snapshot = match storage::snapshot::decode(&bytes) {
        Ok(snapshot) => snapshot,
        Err(defect) => {
            damage.push(Damage::new(
                file,
                defect_position(&defect),
                format!("{defect} (the server refuses to boot)"),
            ));
            return Ok(report);
        }
    };
    report.trailer_ok = true;
    report.checkpoint_op = Some(snapshot.checkpoint_op);
    report.checksum = Some(format!("{:#018x}", snapshot.checksum));
    report.payload_size_bytes = Some(snapshot.payload.len() as u64);
    match SnapshotPayload::decode(
        &snapshot.payload,
        snapshot.checkpoint_op,
        CLIENTS_TABLE_MAX_LIMIT,
    ) {
        Ok(restored) => {
            report.payload_decoded = true;
            for stream in restored.metadata.streams.values() {
                report.topic_count += stream.topics.len();
                report.partition_count += stream
                    .topics
                    .values()
                    .map(|topic| u64::from(topic.partition_count))
                    .sum::<u64>();
            }
            report.stream_count = restored.metadata.streams.len();
            let sessions = restored.client_table.to_snapshot().sessions;
            report.sessions = sessions.iter().map(SessionReport::of).collect();
        }
        Err(reason) => damage.push(Damage::new(
            file,
            Some(storage::snapshot::SNAPSHOT_HEADER_SIZE as u64),
            format!("payload: {reason} (the server refuses to boot)"),
        )),
    }
    if let Some((superblock, state)) = superblock_beside(parent_dir(file)) {
        let pairing = format!(
            "{superblock} records checkpoint_op {} with checksum {:#018x}",
            state.checkpoint_op, state.snapshot_checksum
        );
        if snapshot.checkpoint_op < state.checkpoint_op {
            damage.push(Damage::new(
                file,
                None,
                format!(
                    "pairing rule: the snapshot is at op {}, older than the checkpoint: {pairing}",
                    snapshot.checkpoint_op
                ),
            ));
        } else if snapshot.checkpoint_op == state.checkpoint_op
            && snapshot.checksum != state.snapshot_checksum
        {
            damage.push(Damage::new(
                file,
                None,
                format!(
                    "pairing rule: same op, different checksum {:#018x}: {pairing}",
                    snapshot.checksum
                ),
            ));
        }
        let verdict = if snapshot.checkpoint_op > state.checkpoint_op {
            "newer than the superblock's checkpoint (a crash before the superblock write; boot uses it)"
        } else if damage.iter().any(|d| d.reason.starts_with("pairing rule")) {
            "BROKEN"
        } else {
            "ok"
        };
        report.pairing = Some(format!("{pairing}: {verdict}"));
    }
    Ok(report)
}

impl Report for SnapshotReport {
    fn write_text(&self, out: &mut String) {
        if let Some(note) = &self.no_snapshot_yet {
            let _ = writeln!(out, "{note}");
        }
        if let Some(details) = &self.snapshot {
            details.write_text(&self.file, out);
        }
    }
}

impl SnapshotDetails {
    fn write_text(&self, file: &str, out: &mut String) {
        let _ = writeln!(
            out,
            "file: {} ({} bytes, trailer {})",
            file,
            self.file_size_bytes,
            if self.trailer_ok { "ok" } else { "BAD" }
        );
        if let (Some(op), Some(checksum), Some(payload)) =
            (self.checkpoint_op, &self.checksum, self.payload_size_bytes)
        {
            let _ = writeln!(
                out,
                "checkpoint_op {op}, checksum {checksum}, payload {payload} bytes"
            );
        }
        if let Some(pairing) = &self.pairing {
            let _ = writeln!(out, "pairing: {pairing}");
        }
        write_sessions(&self.sessions, out);
        if !self.payload_decoded {
            out.push_str("summary: payload not decoded (see the damage below)\n");
            return;
        }
        let _ = writeln!(
            out,
            "summary: {} stream(s), {} topic(s), {} partition(s), {} client session(s)",
            self.stream_count,
            self.topic_count,
            self.partition_count,
            self.sessions.len()
        );
    }
}
