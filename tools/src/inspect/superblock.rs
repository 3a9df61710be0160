//! `inspect superblock`: decodes each of the four copies with
//! `storage::superblock::decode_copy_versioned` and applies the open rule of `storage/FORMAT.md`
//! section 7 (an intact copy of a version this binary does not read refuses the file; otherwise
//! the highest valid sequence wins and valid copies must agree). Shows each copy's version field
//! (marked unverified when the copy's checksum fails), and notes that the next `serve` upgrades a
//! file whose valid copies include a version below `SUPERBLOCK_VERSION` (1: before issue 12; 2:
//! before the timestamp checksum rule), which older releases then refuse. Reads the file
//! read-only; never rewrites a copy.

use std::fmt::Write as _;
use std::io::Read as _;
use std::ops::Range;
use std::path::Path;

use storage::SuperblockState;
use storage::limits::{SUPERBLOCK_COPY_COUNT, SUPERBLOCK_COPY_SIZE, SUPERBLOCK_FILE_SIZE};
use storage::superblock::{
    CopyDefect, DecodedCopy, SUPERBLOCK_FILE_NAME, SUPERBLOCK_VERSION, SUPERBLOCK_VERSION_MIN,
    decode_copy_versioned,
};

use super::{Damage, Report, file_in, open_read_only};

/// Bytes of the little-endian `u16` version field in a copy (`storage/FORMAT.md` section 7,
/// "Layout of one copy"), read here to show the field of a copy that does not verify.
const VERSION_FIELD: Range<usize> = 8..10;

#[derive(Debug, serde::Serialize)]
pub(crate) struct SuperblockReport {
    file: String,
    file_size_bytes: u64,
    copies: Vec<CopyReport>,
    /// The copy open would boot from (lowest index among the current ones); `None` when open
    /// refuses the file.
    chosen_copy: Option<usize>,
    /// The version of the first intact copy whose version this binary does not read (above
    /// `SUPERBLOCK_VERSION` a newer shardline's, below `SUPERBLOCK_VERSION_MIN` no shardline's):
    /// open refuses the file.
    unsupported_version: Option<u16>,
    state: Option<StateReport>,
    /// Set when open would boot from this file and a valid copy is of a version below
    /// `SUPERBLOCK_VERSION`: the next `serve` rewrites every copy at `to`.
    upgrade: Option<UpgradeReport>,
    /// Sentences about the file that are not damage (the upgrade above, unverified versions).
    notes: Vec<String>,
}

#[derive(Debug, serde::Serialize)]
struct UpgradeReport {
    /// The lowest version among the valid copies.
    from: u16,
    /// `SUPERBLOCK_VERSION`.
    to: u16,
}

#[derive(Debug, serde::Serialize)]
struct CopyReport {
    copy_index: usize,
    position: u64,
    /// `current`, `stale` or `invalid`.
    status: &'static str,
    /// The copy's version field as read (`None` when the copy is missing, zeroed or has a bad
    /// magic: then there is no version field to speak of).
    version: Option<u16>,
    /// True when the copy's checksum verifies, so `version` is what was written; false when it
    /// fails (the field may be damaged) or there is no version.
    version_verified: bool,
    sequence: Option<u64>,
    reason: Option<String>,
}

#[derive(Debug, serde::Serialize)]
struct StateReport {
    sequence: u64,
    /// Hex, since a u128 does not fit a JSON number.
    cluster: String,
    replica_id: u8,
    replica_count: u8,
    view: u32,
    log_view: u32,
    commit_max: u64,
    checkpoint_op: u64,
    snapshot_checksum: String,
}

impl StateReport {
    fn new(state: &SuperblockState) -> StateReport {
        StateReport {
            sequence: state.sequence,
            cluster: format!("{:#034x}", state.cluster),
            replica_id: state.replica_id,
            replica_count: state.replica_count,
            view: state.view,
            log_view: state.log_view,
            commit_max: state.commit_max,
            checkpoint_op: state.checkpoint_op,
            snapshot_checksum: format!("{:#018x}", state.snapshot_checksum),
        }
    }
}

pub(crate) fn inspect(path: &Path) -> anyhow::Result<(SuperblockReport, Vec<Damage>)> {
    let file_path = file_in(path, SUPERBLOCK_FILE_NAME);
    let file = open_read_only(&file_path)?;
    let file_size_bytes = file
        .metadata()
        .map_err(|error| anyhow::anyhow!("{}: cannot stat: {error}", file_path.display()))?
        .len();
    // Open reads only the first SUPERBLOCK_FILE_SIZE bytes; so does this.
    let mut bytes = Vec::with_capacity(SUPERBLOCK_FILE_SIZE);
    file.take(SUPERBLOCK_FILE_SIZE as u64)
        .read_to_end(&mut bytes)
        .map_err(|error| anyhow::anyhow!("{}: cannot read: {error}", file_path.display()))?;

    let versioned: Vec<Result<DecodedCopy, CopyDefect>> = (0..SUPERBLOCK_COPY_COUNT)
        .map(|copy_index| {
            let start = copy_index * SUPERBLOCK_COPY_SIZE;
            match bytes.get(start..) {
                Some(copy) if copy.len() >= SUPERBLOCK_COPY_SIZE => {
                    decode_copy_versioned(copy, copy_index)
                }
                _ => Err(CopyDefect::Missing { file_size_bytes }),
            }
        })
        .collect();
    // Open refuses the whole file when any copy is an intact copy of a version it does not read
    // (`SuperblockError::UnsupportedVersion`), whatever the other copies hold.
    let unsupported = versioned
        .iter()
        .enumerate()
        .find_map(|(copy_index, copy)| match copy {
            Err(CopyDefect::Version { found }) => Some((copy_index, *found)),
            _ => None,
        });
    let decoded: Vec<Result<SuperblockState, String>> = versioned
        .iter()
        .map(|copy| {
            copy.map(|copy| copy.state)
                .map_err(|defect| defect.to_string())
        })
        .collect();
    let newest = decoded
        .iter()
        .enumerate()
        .filter_map(|(copy_index, copy)| copy.as_ref().ok().map(|state| (copy_index, state)))
        // `max_by_key` keeps the last of equal maxima; reversed, that is the lowest copy index.
        .rev()
        .max_by_key(|(_, state)| state.sequence);

    let mut damage = Vec::new();
    let mut copies = Vec::new();
    // Set when valid copies contradict each other (`SuperblockError::Corrupt`: open refuses).
    let mut contradiction = false;
    for (copy_index, copy) in decoded.iter().enumerate() {
        let position = (copy_index * SUPERBLOCK_COPY_SIZE) as u64;
        let (status, sequence, reason) = match (copy, newest) {
            (Err(reason), _) => {
                let consequence = match newest {
                    _ if unsupported.is_some() => "; open refuses this file".to_owned(),
                    Some((chosen, _)) => format!(
                        "; open still boots from copy {chosen} and the next write rewrites this copy"
                    ),
                    None => String::new(),
                };
                damage.push(Damage::new(
                    &file_path,
                    Some(position),
                    format!("copy {copy_index} is invalid: {reason}{consequence}"),
                ));
                ("invalid", None, Some(reason.clone()))
            }
            (Ok(state), Some((chosen, newest))) if state.sequence == newest.sequence => {
                if state != newest {
                    contradiction = true;
                    damage.push(Damage::new(
                        &file_path,
                        Some(position),
                        format!(
                            "copies {chosen} and {copy_index} both have sequence {} but differ: \
                             open refuses this file",
                            state.sequence
                        ),
                    ));
                }
                ("current", Some(state.sequence), None)
            }
            (Ok(state), Some((chosen, newest))) => {
                if let Some(regression) = storage::superblock::regression(state, newest) {
                    contradiction = true;
                    damage.push(Damage::new(
                        &file_path,
                        Some(position),
                        format!(
                            "copy {chosen} (sequence {}) contradicts older copy {copy_index} \
                             (sequence {}): {regression}: open refuses this file",
                            newest.sequence, state.sequence
                        ),
                    ));
                }
                ("stale", Some(state.sequence), None)
            }
            (Ok(_), None) => unreachable!("a valid copy makes `newest` Some"),
        };
        let (version, version_verified) = version_field(&bytes, copy_index, &versioned[copy_index]);
        copies.push(CopyReport {
            copy_index,
            position,
            status,
            version,
            version_verified,
            sequence,
            reason,
        });
    }
    if let Some((copy_index, found)) = unsupported {
        damage.push(Damage::new(
            &file_path,
            None,
            unsupported_version_finding(copy_index, found),
        ));
    } else if newest.is_none() {
        damage.push(Damage::new(
            &file_path,
            None,
            format!(
                "all {SUPERBLOCK_COPY_COUNT} superblock copies are invalid: the replica cannot \
                 boot from this file"
            ),
        ));
    }
    // Open boots from this file only when no copy has an unsupported version, one is valid, and
    // the valid copies agree.
    let open_boots = unsupported.is_none() && newest.is_some() && !contradiction;
    let upgrade = upgrade(&versioned).filter(|_| open_boots);
    let mut notes = Vec::new();
    if let Some(upgrade) = &upgrade {
        notes.push(upgrade_note(upgrade, &copies));
    }
    if copies
        .iter()
        .any(|copy| copy.version.is_some() && !copy.version_verified)
    {
        notes.push(
            "a version shown as N? is the field read from a copy whose checksum fails: \
             unverified, it may be damaged"
                .to_owned(),
        );
    }
    let report = SuperblockReport {
        file: file_path.display().to_string(),
        file_size_bytes,
        copies,
        unsupported_version: unsupported.map(|(_, found)| found),
        chosen_copy: newest
            .filter(|_| unsupported.is_none())
            .map(|(copy_index, _)| copy_index),
        state: newest
            .filter(|_| unsupported.is_none())
            .map(|(_, state)| StateReport::new(state)),
        upgrade,
        notes,
    };
    Ok((report, damage))
}

/// `(version, verified)` for copy `copy_index` of `bytes` as decoded into `decoded`: the version
/// of a valid copy or of an intact one of another version (verified), the raw field of a copy
/// whose checksum fails (unverified), the version of a copy refused after its checksum and
/// version passed (copy index, reserved bytes, padding, fields: verified), and none where the copy
/// is missing, zeroed or has a bad magic.
fn version_field(
    bytes: &[u8],
    copy_index: usize,
    decoded: &Result<DecodedCopy, CopyDefect>,
) -> (Option<u16>, bool) {
    let start = copy_index * SUPERBLOCK_COPY_SIZE;
    let raw = || {
        let field = bytes.get(start + VERSION_FIELD.start..start + VERSION_FIELD.end)?;
        Some(u16::from_le_bytes([field[0], field[1]]))
    };
    match decoded {
        Ok(copy) => (Some(copy.version), true),
        Err(CopyDefect::Version { found }) => (Some(*found), true),
        Err(CopyDefect::Checksum { .. }) => (raw(), false),
        Err(
            CopyDefect::CopyIndex { .. }
            | CopyDefect::Reserved
            | CopyDefect::Padding
            | CopyDefect::Inconsistent { .. },
        ) => (raw(), true),
        Err(CopyDefect::Missing { .. } | CopyDefect::Zeroed | CopyDefect::Magic { .. }) => {
            (None, false)
        }
    }
}

/// The upgrade the next `serve` makes: from the lowest version among the valid copies, when it
/// is below `SUPERBLOCK_VERSION` (`storage::superblock::OpenReport::oldest_version`).
fn upgrade(versioned: &[Result<DecodedCopy, CopyDefect>]) -> Option<UpgradeReport> {
    let from = versioned
        .iter()
        .filter_map(|copy| copy.as_ref().ok().map(|copy| copy.version))
        .min()?;
    (from < SUPERBLOCK_VERSION).then_some(UpgradeReport {
        from,
        to: SUPERBLOCK_VERSION,
    })
}

/// The note for a file the next `serve` upgrades, naming the copies below `upgrade.to`.
fn upgrade_note(upgrade: &UpgradeReport, copies: &[CopyReport]) -> String {
    let older: Vec<String> = copies
        .iter()
        .filter(|copy| copy.status != "invalid")
        .filter(|copy| copy.version.is_some_and(|version| version < upgrade.to))
        .map(|copy| copy.copy_index.to_string())
        .collect();
    let introduced = storage::superblock::version_introduced(upgrade.to).unwrap_or("a new format");
    format!(
        "valid copies at version {} (copy {}): the next `shardline serve` on this data directory \
         upgrades every copy to version {} before it opens any partition, and from then on \
         shardline releases that read superblock versions only up to {} (from before \
         {introduced}) refuse it; only a copy of the data directory made before that serve can \
         go back to them",
        upgrade.from,
        older.join(", "),
        upgrade.to,
        upgrade.to - 1
    )
}

/// The finding for an intact copy of a version this binary does not read, by case: below
/// `SUPERBLOCK_VERSION_MIN` no shardline wrote it, above `SUPERBLOCK_VERSION` a newer one did.
fn unsupported_version_finding(copy_index: usize, found: u16) -> String {
    if found < SUPERBLOCK_VERSION_MIN {
        format!(
            "copy {copy_index} has version {found}, which is not a shardline superblock version \
             (shardline writes versions {SUPERBLOCK_VERSION_MIN} and up; this binary reads \
             {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION}): its checksum verifies, so another \
             program wrote it, or damage rewrote it whole; open refuses this file, and no \
             shardline release reads it: restore the data directory from a backup"
        )
    } else {
        format!(
            "copy {copy_index} has version {found}, but this binary reads only versions \
             {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION}: a newer shardline wrote this \
             file, and open refuses it; inspect it with a shardline that supports version \
             {found}"
        )
    }
}

impl Report for SuperblockReport {
    fn write_text(&self, out: &mut String) {
        let _ = writeln!(out, "file: {} ({} bytes)", self.file, self.file_size_bytes);
        let _ = writeln!(
            out,
            "{:<5} {:>8}  {:<8} {:>7} {:>9}  reason",
            "copy", "byte", "status", "version", "sequence"
        );
        for copy in &self.copies {
            let sequence = copy
                .sequence
                .map_or_else(|| "-".to_owned(), |sequence| sequence.to_string());
            let version = match (copy.version, copy.version_verified) {
                (None, _) => "-".to_owned(),
                (Some(version), true) => version.to_string(),
                (Some(version), false) => format!("{version}?"),
            };
            let line = format!(
                "{:<5} {:>8}  {:<8} {:>7} {:>9}  {}",
                copy.copy_index,
                copy.position,
                copy.status,
                version,
                sequence,
                copy.reason.as_deref().unwrap_or("")
            );
            let _ = writeln!(out, "{}", line.trim_end());
        }
        match (&self.state, self.chosen_copy) {
            (Some(state), Some(chosen)) => {
                let _ = writeln!(
                    out,
                    "state (copy {chosen}): sequence {} cluster {} replica {}/{} view {} log_view {} \
                     commit_max {} checkpoint_op {} snapshot_checksum {}",
                    state.sequence,
                    state.cluster,
                    state.replica_id,
                    state.replica_count,
                    state.view,
                    state.log_view,
                    state.commit_max,
                    state.checkpoint_op,
                    state.snapshot_checksum
                );
            }
            _ => match self.unsupported_version {
                Some(found) if found < SUPERBLOCK_VERSION_MIN => {
                    let _ = writeln!(
                        out,
                        "state: none (a copy has version {found}, which is not a shardline \
                         superblock version)"
                    );
                }
                Some(found) => {
                    let _ = writeln!(
                        out,
                        "state: none (a copy has version {found}, which this binary does not read)"
                    );
                }
                None => out.push_str("state: none (no valid copy)\n"),
            },
        }
        let count = |status: &str| {
            self.copies
                .iter()
                .filter(|copy| copy.status == status)
                .count()
        };
        let _ = writeln!(
            out,
            "summary: {} current, {} stale, {} invalid",
            count("current"),
            count("stale"),
            count("invalid")
        );
        for note in &self.notes {
            let _ = writeln!(out, "note: {note}");
        }
    }
}
