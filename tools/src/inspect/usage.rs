//! Which PATH each `inspect` kind takes: a data directory given where a journal or partition
//! directory belongs is either followed (`wal DATA` uses `DATA/journal`, as `superblock` and
//! `snapshot` use the file in `DATA`) or refused as a usage error (exit 2) naming what PATH should
//! be. It must never call a wrong PATH damage: exit 1 means the files are damaged.

use std::path::{Path, PathBuf};

use shards::limits::{JOURNAL_DIR_NAME, METADATA_FILE_NAME};
use storage::snapshot::SNAPSHOT_FILE_NAME;
use storage::superblock::SUPERBLOCK_FILE_NAME;

use super::{Kind, parent_dir, parse_numbered};

/// A mistake on the command line rather than damage: PATH is not what the kind takes. `inspect`
/// prints it as `error: ...` and exits 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub(crate) struct UsageError(pub(crate) String);

/// The name of the partitions directory of a data directory.
const PARTITIONS_DIR_NAME: &str = "partitions";

/// What each kind takes, for usage errors.
fn takes(kind: Kind) -> &'static str {
    match kind {
        Kind::Superblock => "inspect superblock takes the data directory or its superblock file",
        Kind::Wal => {
            "inspect wal takes the data directory, its journal/ directory or one .wal segment"
        }
        Kind::Segment => {
            "inspect segment takes a partition directory \
             (DATA/partitions/STREAM/TOPIC/PARTITION) or one .log segment"
        }
        Kind::Snapshot => "inspect snapshot takes the data directory or its snapshot file",
        Kind::Metadata => {
            "inspect metadata takes a data directory of the format before the journal, or its \
             metadata.json"
        }
        Kind::Manifest => "inspect manifest takes a file holding one state-transfer manifest",
        Kind::Clients => "inspect clients takes a file holding one client-table transfer artifact",
        Kind::Offsets => {
            "inspect offsets takes the data directory, a partition directory or one \
             consumer-offsets file"
        }
    }
}

/// Whether directory `dir` holds a numbered segment `NNNNNNNNNNNNNNNNNNNN.{extension}`.
fn holds_segments(dir: &Path, extension: &str) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries.filter_map(Result::ok).any(|entry| {
            entry
                .file_name()
                .to_str()
                .is_some_and(|name| parse_numbered(name, extension).is_some())
        })
    })
}

/// What a directory given as PATH looks like.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DirLooks {
    /// It holds a superblock or a `partitions/` directory.
    Data,
    /// It holds `.wal` segments.
    Journal,
    /// It holds `.log` segments.
    Partition,
    /// None of the above (e.g. empty).
    Other,
}

impl DirLooks {
    fn of(dir: &Path) -> DirLooks {
        if dir.join(SUPERBLOCK_FILE_NAME).is_file() || dir.join(PARTITIONS_DIR_NAME).is_dir() {
            DirLooks::Data
        } else if holds_segments(dir, "wal") {
            DirLooks::Journal
        } else if holds_segments(dir, "log") {
            DirLooks::Partition
        } else {
            DirLooks::Other
        }
    }

    fn describe(self) -> &'static str {
        match self {
            DirLooks::Data => "a data directory",
            DirLooks::Journal => "a journal directory (.wal segments: use inspect wal)",
            DirLooks::Partition => "a partition directory (.log segments: use inspect segment)",
            DirLooks::Other => "a directory",
        }
    }
}

/// `dir` refused for `kind`: `DIR: a journal directory (...), not what ...; inspect segment
/// takes ...`, with the data directory named when `dir` sits in one.
fn refused(kind: Kind, dir: &Path, missing: &str) -> UsageError {
    let parent = parent_dir(dir);
    let hint = if matches!(kind, Kind::Superblock | Kind::Snapshot | Kind::Wal)
        && parent.join(SUPERBLOCK_FILE_NAME).is_file()
    {
        format!(" (the data directory is {})", parent.display())
    } else {
        String::new()
    };
    UsageError(format!(
        "{}: {} without {missing}; {}{hint}",
        dir.display(),
        DirLooks::of(dir).describe(),
        takes(kind)
    ))
}

/// The path `kind` inspects for the user's `path`: `path` itself, or for `wal` on a data
/// directory its `journal/`.
///
/// # Errors
/// `UsageError` when `path` is a directory that does not hold what `kind` reads: a data or
/// journal directory given to `segment`, a journal directory given to `superblock` or
/// `snapshot`, a journal-format data directory given to `metadata`, any directory given to
/// `manifest` or `clients`.
pub(crate) fn resolve(kind: Kind, path: &Path) -> Result<PathBuf, UsageError> {
    if !path.is_dir() {
        return Ok(path.to_path_buf());
    }
    match kind {
        Kind::Superblock if !path.join(SUPERBLOCK_FILE_NAME).exists() => {
            Err(refused(kind, path, "a superblock file"))
        }
        Kind::Snapshot
            if !path.join(SNAPSHOT_FILE_NAME).exists()
                && !path.join(SUPERBLOCK_FILE_NAME).exists() =>
        {
            Err(refused(kind, path, "a snapshot or superblock file"))
        }
        Kind::Wal if !holds_segments(path, "wal") => {
            let journal = path.join(JOURNAL_DIR_NAME);
            if journal.is_dir() {
                Ok(journal)
            } else if DirLooks::of(path) == DirLooks::Other {
                // An empty journal directory: `wal` says open would start a new journal.
                Ok(path.to_path_buf())
            } else {
                Err(refused(kind, path, ".wal segments"))
            }
        }
        Kind::Segment if !holds_segments(path, "log") && DirLooks::of(path) != DirLooks::Other => {
            Err(refused(kind, path, ".log segments"))
        }
        Kind::Metadata if !path.join(METADATA_FILE_NAME).exists() => Err(UsageError(format!(
            "{}: {} without metadata.json{}; {}",
            path.display(),
            DirLooks::of(path).describe(),
            if path.join(SUPERBLOCK_FILE_NAME).exists() {
                " (it is in the journal format: use inspect snapshot and inspect wal)"
            } else {
                ""
            },
            takes(kind)
        ))),
        Kind::Manifest | Kind::Clients => Err(UsageError(format!(
            "{}: {}, not a file; {}",
            path.display(),
            DirLooks::of(path).describe(),
            takes(kind)
        ))),
        _ => Ok(path.to_path_buf()),
    }
}
