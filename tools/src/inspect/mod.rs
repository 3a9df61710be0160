//! `shardline inspect`: offline checks of the files `storage` writes (superblock, metadata journal,
//! checkpoint snapshot, partition log segments with their index files, `metadata.json`) and of the
//! state-transfer artifacts saved to files (manifest, client table), decoded and verified by the
//! rules of `storage/FORMAT.md`, printed as aligned text or one JSON document.
//!
//! It must never modify what it inspects: every file and directory is opened read-only with
//! `std::fs` (no truncation of a torn tail, no index rewrite, no lock taken), so it is safe to run
//! on the data directory of a stopped server or on a copy. It runs no server code and no runtime.

mod metadata;
mod offsets;
mod segment;
mod snapshot;
mod superblock;
mod transfer;
mod usage;
mod wal;

use std::fmt::Write as _;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

/// Exit status when every check passed.
const EXIT_CLEAN: u8 = 0;
/// Exit status when damage was found (or a file could not be read).
const EXIT_DAMAGE: u8 = 1;
/// Exit status of a usage error (clap uses the same for bad arguments).
const EXIT_USAGE: u8 = 2;

const AFTER_HELP: &str = "\
What each KIND checks (all by the rules of storage/FORMAT.md):
  superblock  PATH is the superblock file or its directory. Decodes all 4 copies (magic, version,
              copy index, XXH3-128 checksum, padding, field invariants), says which is current,
              stale or invalid and why, each copy's version (1: before issue 12, upgraded to 2
              at the next boot; 0 or newer than 2: open refuses the file), and prints the state
              open would choose.
  wal         PATH is the data directory (its journal/), a journal directory or one .wal segment. Lists every record (op, view,
              commit, body size, checksums), checks ops follow each other across segments, and
              tells a torn tail of the last segment (open would truncate it) from interior damage
              (open refuses to boot).
  segment     PATH is a partition directory or one .log segment. Walks every entry (offset rule,
              size bounds, XXH3-64 checksums by the entry's rule: each message's checksum over
              its payload and the entry checksum over the message headers and stamp, or for an
              entry from before issue 12 the entry checksum over the whole payload; FORMAT.md
              section 3), reports a torn tail or corruption with file
              and byte position (in the last segment, damage followed by valid entries is what
              open copies to a quarantine file before truncating), checks each .index file
              against the entries it describes, and lists quarantine files
              (NNNNNNNNNNNNNNNNNNNN.log.damaged-at-BYTE).
  snapshot    PATH is the snapshot file or the data directory. Verifies the header (magic,
              version, reserved bytes, payload size) and the XXH3-64 trailer, decodes the JSON
              payload and checks metadata and client table by the server's boot rules, lists
              the client sessions, and checks the checkpoint pairing against the superblock
              beside it (older snapshot, or same op with another checksum: refused at boot).
  metadata    PATH is metadata.json, the format before the journal (migrated at the first
              boot of this version), or its directory. Verifies the XXH3-64 trailer, decodes
              the JSON, checks it by the server's rules, and counts streams, topics, partitions.
  manifest    PATH is a state-transfer manifest saved to a file (the body of an offer). Verifies
              the XXH3-64 trailer, magic, version, entry count and length, zero padding, known
              and unique artifact kinds, non-zero lengths within the caps of a receiver at the
              largest --clients-table-max, and lists the artifacts.
  clients     PATH is a client-table transfer artifact saved to a file. Verifies the XXH3-64
              trailer, magic, the session count against the largest --clients-table-max, unique
              non-zero client ids, reply rings and bodies within their bounds, then the session
              rules install checks, and lists the sessions.
  offsets     PATH is the data directory (every partition's consumer-offsets), a partition
              directory or one consumer-offsets file (issue 11 section 1). Lists each consumer's
              and group's stored offset, and tells a torn last record (open cuts it) from
              damage before it (open refuses to boot), with file and byte position.

Files are opened read-only and never modified: a torn tail is reported, not truncated.

Exit status:
  0  clean: every check passed
  1  damage found (each finding names the file and byte position), or a file could not be read
  2  usage error (bad arguments, PATH does not exist, or is not what KIND takes)";

/// Arguments of `shardline inspect`.
#[derive(Debug, clap::Args)]
#[command(after_help = AFTER_HELP)]
pub struct InspectArgs {
    /// What PATH holds.
    #[arg(value_enum)]
    kind: Kind,
    /// The file or directory to check; opened read-only, never modified.
    path: PathBuf,
    /// Print one JSON document (same information) instead of aligned text.
    #[arg(long)]
    json: bool,
}

/// The kinds of file `inspect` understands.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Kind {
    /// The 4-copy superblock file (or its directory).
    Superblock,
    /// The metadata journal: a directory of `.wal` segments, or one segment.
    Wal,
    /// A partition log: a directory of `.log` segments and `.index` files, or one segment.
    Segment,
    /// The checkpoint snapshot (or the data directory holding it).
    Snapshot,
    /// `metadata.json` of the format before the journal (or the data directory holding it).
    Metadata,
    /// A state-transfer manifest saved to a file (`storage/FORMAT.md` section 11).
    Manifest,
    /// A client-table transfer artifact saved to a file (`storage/FORMAT.md` section 11).
    Clients,
    /// Consumer offsets: the data directory, a partition directory or a `consumer-offsets` file.
    Offsets,
}

impl Kind {
    fn name(self) -> &'static str {
        match self {
            Kind::Superblock => "superblock",
            Kind::Wal => "wal",
            Kind::Segment => "segment",
            Kind::Snapshot => "snapshot",
            Kind::Metadata => "metadata",
            Kind::Manifest => "manifest",
            Kind::Clients => "clients",
            Kind::Offsets => "offsets",
        }
    }
}

/// One problem found: where (file, byte position when known) and what.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Damage {
    pub(crate) file: String,
    /// Byte position in `file` where the damage starts, when one byte range is to blame.
    pub(crate) position: Option<u64>,
    /// True when this is a torn tail of the last segment that open would truncate.
    pub(crate) torn_tail: bool,
    pub(crate) reason: String,
}

impl Damage {
    pub(crate) fn new(file: &Path, position: Option<u64>, reason: impl Into<String>) -> Damage {
        Damage {
            file: file.display().to_string(),
            position,
            torn_tail: false,
            reason: reason.into(),
        }
    }
}

impl std::fmt::Display for Damage {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(&self.file)?;
        if let Some(position) = self.position {
            write!(formatter, " at byte {position}")?;
        }
        write!(formatter, ": {}", self.reason)
    }
}

/// What one kind found: a serializable report that can also render itself as text.
pub(crate) trait Report: serde::Serialize {
    /// Appends the aligned text lines (one per copy/record/entry, then a summary line).
    fn write_text(&self, out: &mut String);
}

/// The JSON document: common fields, then the kind's report flattened in.
#[derive(serde::Serialize)]
struct Document<'a, R: serde::Serialize> {
    kind: &'static str,
    path: String,
    clean: bool,
    damage: &'a [Damage],
    #[serde(flatten)]
    report: &'a R,
}

/// Runs `shardline inspect` and returns the process exit status (0 clean, 1 damage, 2 usage).
pub fn run(args: &InspectArgs) -> ExitCode {
    if std::fs::symlink_metadata(&args.path).is_err() {
        let _ = writeln!(
            std::io::stderr(),
            "error: {}: no such file or directory",
            args.path.display()
        );
        return ExitCode::from(EXIT_USAGE);
    }
    let path = match usage::resolve(args.kind, &args.path) {
        Ok(path) => path,
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: {error}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    let result = match args.kind {
        Kind::Superblock => superblock::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Wal => wal::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Segment => segment::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Snapshot => snapshot::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Metadata => metadata::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Manifest => transfer::inspect_manifest(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Clients => transfer::inspect_clients(&path).map(|(r, d)| emit(args, &path, &r, &d)),
        Kind::Offsets => offsets::inspect(&path).map(|(r, d)| emit(args, &path, &r, &d)),
    };
    match result {
        Ok(code) => ExitCode::from(code),
        Err(error) => {
            let _ = writeln!(std::io::stderr(), "error: {error:#}");
            if error.downcast_ref::<usage::UsageError>().is_some() {
                ExitCode::from(EXIT_USAGE)
            } else {
                ExitCode::from(EXIT_DAMAGE)
            }
        }
    }
}

/// Prints the report (text or JSON) to stdout and returns the exit status it implies.
/// `path` is what was inspected (`args.path`, or the journal/ directory in it).
fn emit<R: Report>(args: &InspectArgs, path: &Path, report: &R, damage: &[Damage]) -> u8 {
    let clean = damage.is_empty();
    let mut out = String::new();
    if args.json {
        let document = Document {
            kind: args.kind.name(),
            path: path.display().to_string(),
            clean,
            damage,
            report,
        };
        match serde_json::to_string_pretty(&document) {
            Ok(json) => out.push_str(&json),
            // Err: only a non-string map key could fail, and the reports have none.
            Err(error) => {
                let _ = write!(out, "{{\"error\": \"{error}\"}}");
            }
        }
        out.push('\n');
    } else {
        let _ = writeln!(out, "{} {}", args.kind.name(), path.display());
        report.write_text(&mut out);
        for finding in damage {
            let label = if finding.torn_tail {
                "torn tail"
            } else {
                "damage"
            };
            let _ = writeln!(out, "{label}: {finding}");
        }
        if clean {
            out.push_str("result: clean\n");
        } else {
            let _ = writeln!(out, "result: {} problem(s) found", damage.len());
        }
    }
    // Err: stdout is closed (e.g. `| head`); the exit status still tells the result.
    let _ = std::io::stdout().lock().write_all(out.as_bytes());
    if clean { EXIT_CLEAN } else { EXIT_DAMAGE }
}

/// Opens `path` read-only; the error names the path. Only regular files: opening a FIFO would
/// block until a writer appears, and a device such as /dev/zero is no data file.
pub(crate) fn open_read_only(path: &Path) -> anyhow::Result<std::fs::File> {
    let metadata = std::fs::metadata(path)
        .map_err(|error| anyhow::anyhow!("{}: cannot stat: {error}", path.display()))?;
    if !metadata.is_file() {
        anyhow::bail!(
            "{}: not a regular file (a FIFO, device or socket is no data file)",
            path.display()
        );
    }
    std::fs::File::open(path)
        .map_err(|error| anyhow::anyhow!("{}: cannot open: {error}", path.display()))
}

/// The whole content of `path`, refused before allocating when larger than `size_max_bytes`.
pub(crate) fn read_bounded(
    path: &Path,
    size_max_bytes: u64,
) -> anyhow::Result<Result<Vec<u8>, u64>> {
    use std::io::Read as _;
    let file = open_read_only(path)?;
    let size_bytes = file
        .metadata()
        .map_err(|error| anyhow::anyhow!("{}: cannot stat: {error}", path.display()))?
        .len();
    if size_bytes > size_max_bytes {
        return Ok(Err(size_bytes));
    }
    let mut bytes = Vec::with_capacity(size_bytes as usize);
    file.take(size_max_bytes)
        .read_to_end(&mut bytes)
        .map_err(|error| anyhow::anyhow!("{}: cannot read: {error}", path.display()))?;
    Ok(Ok(bytes))
}

/// `(number, path)` of each file in `dir` named exactly `{number:020}.{extension}`, ascending.
pub(crate) fn numbered_files(dir: &Path, extension: &str) -> anyhow::Result<Vec<(u64, PathBuf)>> {
    let entries = std::fs::read_dir(dir)
        .map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
    let mut files = Vec::new();
    for entry in entries {
        let entry =
            entry.map_err(|error| anyhow::anyhow!("{}: cannot list: {error}", dir.display()))?;
        let name = entry.file_name();
        if let Some(number) = name
            .to_str()
            .and_then(|name| parse_numbered(name, extension))
        {
            files.push((number, entry.path()));
        }
    }
    files.sort_unstable();
    Ok(files)
}

/// The number in a name that is exactly 20 decimal digits, a dot, then `extension`.
pub(crate) fn parse_numbered(name: &str, extension: &str) -> Option<u64> {
    let digits = name.strip_suffix(extension)?.strip_suffix('.')?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// `path/name` when `path` is a directory (the data directory holding the file), else `path`.
pub(crate) fn file_in(path: &Path, name: &str) -> PathBuf {
    if path.is_dir() {
        path.join(name)
    } else {
        path.to_path_buf()
    }
}

/// The directory holding `path` (`.` for a bare file name).
pub(crate) fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Segment files to inspect: the number from each name (when it has one) and the path.
pub(crate) type SegmentFiles = Vec<(Option<u64>, PathBuf)>;

/// The segments to inspect for PATH: every numbered file of a directory, or the one file (its
/// number from its name when it has one) plus whether a higher-numbered sibling exists (then it is
/// a closed segment, not the last).
pub(crate) fn segments_for(path: &Path, extension: &str) -> anyhow::Result<(SegmentFiles, bool)> {
    if path.is_dir() {
        let files = numbered_files(path, extension)?;
        return Ok((
            files
                .into_iter()
                .map(|(number, file)| (Some(number), file))
                .collect(),
            true,
        ));
    }
    if path.extension().and_then(|e| e.to_str()) != Some(extension) {
        return Err(usage::UsageError(format!(
            "{}: expected a .{extension} file or a directory of them; use the inspect kind that \
             matches the file",
            path.display()
        ))
        .into());
    }
    let number = path
        .file_name()
        .and_then(|name| name.to_str())
        .and_then(|name| parse_numbered(name, extension));
    let siblings = numbered_files(parent_dir(path), extension).unwrap_or_default();
    let is_last = match number {
        Some(number) => siblings.iter().all(|(sibling, _)| *sibling <= number),
        None => true,
    };
    Ok((vec![(number, path.to_path_buf())], is_last))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbered_names_are_exact() {
        assert_eq!(parse_numbered("00000000000000000042.wal", "wal"), Some(42));
        assert_eq!(parse_numbered("00000000000000000042.log", "wal"), None);
        assert_eq!(parse_numbered("42.wal", "wal"), None);
        assert_eq!(parse_numbered("99999999999999999999.log", "log"), None);
        assert_eq!(
            parse_numbered("00000000000000000042.index.tmp", "index"),
            None
        );
    }
}
