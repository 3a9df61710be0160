//! `inspect manifest` and `inspect clients`: decode a state-transfer manifest or a client-table
//! artifact saved to a file (`storage/FORMAT.md` section 11), with the codecs the replicas use
//! (`shards::vsr::transfer::{manifest, client_table_wire}`) and the caps of a receiver at the
//! largest `--clients-table-max` (`CLIENTS_TABLE_MAX_LIMIT`). Reads only.

use std::fmt::Write as _;
use std::path::Path;

use shards::limits::CLIENTS_TABLE_MAX_LIMIT;
use shards::vsr::client_table::ClientTable;
use shards::vsr::transfer::client_table_wire;
use shards::vsr::transfer::manifest::{self, MANIFEST_ENCODED_LEN_MAX, ManifestCaps};

use super::snapshot::{SessionReport, write_sessions};
use super::{Damage, Report, read_bounded};

/// What `inspect manifest` found.
#[derive(Debug, serde::Serialize)]
pub(crate) struct ManifestReport {
    file: String,
    file_size_bytes: u64,
    trailer_ok: bool,
    /// The caps the manifest was checked against (a receiver at `CLIENTS_TABLE_MAX_LIMIT`).
    caps: CapsReport,
    /// Empty unless the manifest decoded and passed every rule.
    entries: Vec<EntryReport>,
    total_len: u64,
}

#[derive(Debug, serde::Serialize)]
/// Longest artifact of each kind and longest sum the receiver accepts (bytes).
struct CapsReport {
    metadata: u64,
    client_table: u64,
    total: u64,
}

#[derive(Debug, serde::Serialize)]
struct EntryReport {
    kind: &'static str,
    frontier_op: u64,
    len: u64,
    /// XXH3-128 of the artifact, `0x`-hex.
    checksum: String,
}

/// What `inspect clients` found.
#[derive(Debug, serde::Serialize)]
pub(crate) struct ClientsReport {
    file: String,
    file_size_bytes: u64,
    trailer_ok: bool,
    /// The receiver's `--clients-table-max` the table was checked against.
    clients_max: usize,
    /// Empty unless the table decoded.
    sessions: Vec<SessionReport>,
}

/// The file's bytes, or the damage of a file above `size_max_bytes` (`Err`).
fn read_capped(
    file: &Path,
    size_max_bytes: u64,
    what: &str,
) -> anyhow::Result<Result<Vec<u8>, Damage>> {
    Ok(read_bounded(file, size_max_bytes)?.map_err(|size| {
        Damage::new(
            file,
            None,
            format!("{size} bytes exceeds the longest {what} ({size_max_bytes} bytes)"),
        )
    }))
}

/// Whether the XXH3-64 trailer verifies (the decoders report why not).
fn trailer_ok(bytes: &[u8]) -> bool {
    storage::codec::split_verified_trailer(bytes).is_ok()
}

pub(crate) fn inspect_manifest(file: &Path) -> anyhow::Result<(ManifestReport, Vec<Damage>)> {
    let caps = ManifestCaps::for_receiver(CLIENTS_TABLE_MAX_LIMIT);
    let mut report = ManifestReport {
        file: file.display().to_string(),
        file_size_bytes: 0,
        trailer_ok: false,
        caps: CapsReport {
            metadata: caps.metadata_len_max,
            client_table: caps.client_table_len_max,
            total: caps.total_len_max,
        },
        entries: Vec::new(),
        total_len: 0,
    };
    // The size first: a file over the cap is reported with its real size, not 0.
    report.file_size_bytes = std::fs::metadata(file).map_or(0, |meta| meta.len());
    let bytes = match read_capped(file, MANIFEST_ENCODED_LEN_MAX as u64, "manifest")? {
        Ok(bytes) => bytes,
        Err(damage) => return Ok((report, vec![damage])),
    };
    report.file_size_bytes = bytes.len() as u64;
    report.trailer_ok = trailer_ok(&bytes);
    let decoded = match manifest::decode(&bytes, &caps) {
        Ok(decoded) => decoded,
        Err(error) => {
            let position = error.position().map(|p| p as u64);
            return Ok((report, vec![Damage::new(file, position, error.to_string())]));
        }
    };
    report.total_len = decoded.entries.iter().map(|entry| entry.len).sum();
    report.entries = decoded
        .entries
        .iter()
        .map(|entry| EntryReport {
            kind: entry.kind.name(),
            frontier_op: entry.frontier_op,
            len: entry.len,
            checksum: format!("{:#034x}", entry.checksum),
        })
        .collect();
    Ok((report, Vec::new()))
}

pub(crate) fn inspect_clients(file: &Path) -> anyhow::Result<(ClientsReport, Vec<Damage>)> {
    let clients_max = CLIENTS_TABLE_MAX_LIMIT;
    let mut report = ClientsReport {
        file: file.display().to_string(),
        file_size_bytes: 0,
        trailer_ok: false,
        clients_max,
        sessions: Vec::new(),
    };
    let size_max = client_table_wire::encoded_len_max(clients_max);
    report.file_size_bytes = std::fs::metadata(file).map_or(0, |meta| meta.len());
    let bytes = match read_capped(file, size_max, "client table")? {
        Ok(bytes) => bytes,
        Err(damage) => return Ok((report, vec![damage])),
    };
    report.file_size_bytes = bytes.len() as u64;
    report.trailer_ok = trailer_ok(&bytes);
    let table = match client_table_wire::decode(&bytes, clients_max) {
        Ok(table) => table,
        Err(error) => {
            let position = error.position().map(|p| p as u64);
            return Ok((report, vec![Damage::new(file, position, error.to_string())]));
        }
    };
    report.sessions = table.sessions.iter().map(SessionReport::of).collect();
    let mut damage = Vec::new();
    if let Err(reason) = ClientTable::from_snapshot(&table, clients_max) {
        damage.push(Damage::new(
            file,
            None,
            format!("client table breaks a session rule: {reason} (install would refuse it)"),
        ));
    }
    Ok((report, damage))
}

/// The `file: ... (N bytes, trailer ok|BAD)` line both kinds start with.
fn write_file_line(out: &mut String, file: &str, size: u64, trailer_ok: bool) {
    let trailer = if trailer_ok { "ok" } else { "BAD" };
    let _ = writeln!(out, "file: {file} ({size} bytes, trailer {trailer})");
}

impl Report for ManifestReport {
    fn write_text(&self, out: &mut String) {
        write_file_line(out, &self.file, self.file_size_bytes, self.trailer_ok);
        let _ = writeln!(
            out,
            "caps: metadata {} bytes, client_table {} bytes, total {} bytes",
            self.caps.metadata, self.caps.client_table, self.caps.total
        );
        let _ = writeln!(
            out,
            "  {:<12} {:>20} {:>12}  checksum",
            "artifact", "frontier_op", "len"
        );
        for entry in &self.entries {
            let _ = writeln!(
                out,
                "  {:<12} {:>20} {:>12}  {}",
                entry.kind, entry.frontier_op, entry.len, entry.checksum
            );
        }
        let _ = writeln!(
            out,
            "summary: {} artifact(s), {} bytes in all",
            self.entries.len(),
            self.total_len
        );
    }
}

impl Report for ClientsReport {
    fn write_text(&self, out: &mut String) {
        write_file_line(out, &self.file, self.file_size_bytes, self.trailer_ok);
        write_sessions(&self.sessions, out);
        let _ = writeln!(
            out,
            "summary: {} client session(s), checked against --clients-table-max {}",
            self.sessions.len(),
            self.clients_max
        );
    }
}
