//! The superblock: the small record of durable VSR state (view, log_view, commit_max, the
//! checkpoint pairing, cluster and replica identity), kept as [`SUPERBLOCK_COPY_COUNT`] redundant
//! checksummed copies in one file and rewritten one copy at a time, TigerBeetle style (DESIGN
//! section 8; TigerBeetle `src/vsr/superblock.zig`).
//!
//! Nothing here may ever leave the file without a valid copy of either the old or the new state:
//! copies are written one at a time with an fsync after each, and a copy is accepted on open only
//! when its magic, version, copy index and XXH3-128 checksum verify. Byte layout and crash cases:
//! `storage/FORMAT.md` section 7. This module never decides what the fields mean for VSR beyond
//! asserting the monotonicity VSR requires of them, and never rewrites a file that holds a copy of
//! a version it does not read (a newer binary's, or below the first version:
//! [`SuperblockError::UnsupportedVersion`]).

use std::fmt;
use std::io;
use std::path::{Path, PathBuf};

use compio::BufResult;
use compio::fs::{File, OpenOptions};
use compio::io::AsyncWriteAtExt;
use twox_hash::XxHash3_128;

use crate::durable::{read_exact_at, sync_dir, tmp_path};
use crate::limits::{SUPERBLOCK_COPY_COUNT, SUPERBLOCK_COPY_SIZE, SUPERBLOCK_FILE_SIZE};

/// Name of the superblock file inside the directory that holds it.
pub const SUPERBLOCK_FILE_NAME: &str = "superblock";
/// `"SLSUPBLK"` read as a little-endian `u64`; the first 8 bytes of every copy.
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"SLSUPBLK");
/// Version this binary writes in every copy (create and write), and the newest it reads.
///
/// The byte layout of versions 1, 2 and 3 is the same; the version marks the data directory's
/// format (`storage/FORMAT.md` section 7, "Versions"), each one adding a partition log entry
/// checksum rule that a binary of an earlier version would misjudge as damage:
/// - 1: before issue 12. Every partition log entry is checked by the whole-payload rule.
/// - 2: entries may carry the message-headers checksum rule (flag bit 1 of the first message's
///   `reserved`, `bus::MESSAGE_FLAG_CHECKSUM_OF_HEADERS`, FORMAT.md section 3), which a binary of
///   version 1 would judge damaged and cut. Such a binary accepts only version-1 copies, so it
///   refuses to boot a version-2 superblock instead (all copies invalid).
/// - 3: entries may carry the timestamp checksum rule (flag bit 2, value 4, of the first
///   message's `reserved`, `bus::MESSAGE_FLAG_CHECKSUM_OF_TIMESTAMP` /
///   `storage::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP`, FORMAT.md section 3): the entry
///   checksum's input starts with the header's `base_timestamp_us` as 8 little-endian bytes, so
///   that a flipped timestamp byte on disk is caught (issue 12: "checksums still catch every
///   flipped byte"; retention by age deletes segments by that timestamp). A binary of version 2
///   ignores bit 2, would find every such entry's checksum wrong and cut the log into a
///   quarantine file; it reads only versions 1 and 2, so it refuses to boot a version-3
///   superblock instead ([`SuperblockError::UnsupportedVersion`] in its build: "superblock copy 0
///   has version 3, but this binary reads only versions 1 to 2"), and changes nothing.
pub const SUPERBLOCK_VERSION: u16 = 3;
/// The oldest version this binary reads. A valid copy of any version from this one up to, but
/// not including, [`SUPERBLOCK_VERSION`] is rewritten at [`SUPERBLOCK_VERSION`] by
/// [`Superblock::upgrade`] (shard 0's boot, before any partition log opens).
pub const SUPERBLOCK_VERSION_MIN: u16 = 1;

/// What data directory format superblock version `version` introduced, as a phrase for messages
/// (the checksum rule of `storage/FORMAT.md` section 3 that a binary of an earlier version would
/// misjudge as damage). `None` for version 1 (the first) and for any version this binary does not
/// read.
pub fn version_introduced(version: u16) -> Option<&'static str> {
    match version {
        2 => Some("the message-headers entry checksum rule, flag bit 1"),
        3 => Some("the timestamp entry checksum rule, flag bit 2"),
        _ => None,
    }
}

/// Bytes of the checksummed header at the start of each copy (checksum included); the rest of the
/// copy, up to [`SUPERBLOCK_COPY_SIZE`], is zero.
pub const SUPERBLOCK_HEADER_SIZE: usize = 128;

/// The durable VSR state of one replica, as recorded in the superblock.
///
/// Terms as in "Viewstamped Replication Revisited" (Liskov, Cowling 2012) and DESIGN section 1.
/// `(checkpoint_op, snapshot_checksum)` is the checkpoint *pairing* (DESIGN section 9).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SuperblockState {
    /// Write counter of the superblock: 1 after create, +1 per [`Superblock::write`]. Set by this
    /// module; the value a caller passes in is ignored.
    pub sequence: u64,
    /// Cluster id; fixed for the life of the file.
    pub cluster: u128,
    /// This replica's index in `0..replica_count`; fixed for the life of the file.
    pub replica_id: u8,
    /// Replicas in the cluster (1, 3 or 5); fixed for the life of the file.
    pub replica_count: u8,
    /// Current view; never decreases.
    pub view: u32,
    /// Latest view in which the replica's status was normal; never decreases, never above `view`.
    pub log_view: u32,
    /// Highest op known to be committed; never decreases.
    pub commit_max: u64,
    /// Op of the latest durable snapshot; never decreases, never above `commit_max`.
    pub checkpoint_op: u64,
    /// Checksum of the snapshot taken at `checkpoint_op` (0 before the first checkpoint).
    pub snapshot_checksum: u64,
}

/// One copy's header as it lies on disk (`storage/FORMAT.md` section 7). The `Pod` cast is in
/// native byte order; the format is little-endian, which the assertion below pins.
#[repr(C)]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
struct CopyHeader {
    magic: u64,
    version: u16,
    copy_index: u8,
    replica_id: u8,
    replica_count: u8,
    reserved_a: [u8; 3],
    view: u32,
    log_view: u32,
    sequence: u64,
    cluster: u128,
    commit_max: u64,
    checkpoint_op: u64,
    snapshot_checksum: u64,
    reserved_b: [u8; 40],
    checksum: u128,
}

/// Bytes the checksum covers: the header up to the checksum field.
const CHECKSUMMED_SIZE: usize = SUPERBLOCK_HEADER_SIZE - 16;

const _: () = assert!(std::mem::size_of::<CopyHeader>() == SUPERBLOCK_HEADER_SIZE);
const _: () = assert!(std::mem::offset_of!(CopyHeader, checksum) == CHECKSUMMED_SIZE);
const _: () = assert!(SUPERBLOCK_HEADER_SIZE <= SUPERBLOCK_COPY_SIZE);
// The copy index is stored in one byte.
const _: () = assert!(SUPERBLOCK_COPY_COUNT <= u8::MAX as usize + 1);
// The header is cast with bytemuck in native order; the on-disk order is little-endian.
const _: () = assert!(cfg!(target_endian = "little"));

/// Why one copy was not accepted on open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum CopyDefect {
    /// The file ends before this copy does (an outside truncation; create never leaves this).
    #[error("missing: the file is only {file_size_bytes} bytes")]
    Missing { file_size_bytes: u64 },
    /// Every byte of the copy is zero (never written, or zeroed by the disk).
    #[error("zeroed")]
    Zeroed,
    /// The first 8 bytes are not [`SUPERBLOCK_MAGIC`].
    #[error("bad magic {found:#018x}")]
    Magic { found: u64 },
    /// The copy is intact (its checksum verifies) but its version is not one this binary reads
    /// ([`SUPERBLOCK_VERSION_MIN`]`..=`[`SUPERBLOCK_VERSION`]): above it, a newer binary wrote it;
    /// below it, no shardline did (another program, or damage the checksum did not catch). (A
    /// version outside that range whose checksum fails is [`CopyDefect::Checksum`]: damage.) Open
    /// refuses the file ([`SuperblockError::UnsupportedVersion`]) while any copy has this defect.
    #[error("{}", describe_version_defect(*found))]
    Version { found: u16 },
    /// The stored XXH3-128 differs from the one computed over the header (a torn write or damage).
    #[error("checksum mismatch: stored {stored:#034x}, computed {computed:#034x}")]
    Checksum { stored: u128, computed: u128 },
    /// A well-formed copy that names another slot (a misdirected write).
    #[error("copy index {found} at the slot of another copy")]
    CopyIndex { found: u8 },
    /// Reserved header bytes are not zero under a valid checksum (written by a newer format).
    #[error("reserved header bytes are not zero")]
    Reserved,
    /// Bytes after the header are not zero.
    #[error("padding after the header is not zero")]
    Padding,
    /// The checksum verifies but the fields break an invariant every written state keeps.
    #[error("inconsistent fields: {reason}")]
    Inconsistent { reason: &'static str },
}

/// What open found in one copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyStatus {
    /// Valid, with the highest sequence: this is the state open returned.
    Current,
    /// Valid, with an older sequence (a crash interrupted a write after this copy's slot was
    /// reached by a newer copy, or before this copy was rewritten).
    Stale { sequence: u64 },
    /// Not accepted, and why.
    Invalid(CopyDefect),
}

/// What [`Superblock::open`] found in each copy, for the caller to log. Any copy that is not
/// `Current` is rewritten by the next [`Superblock::write`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenReport {
    /// Status of copy `i` at `copies[i]`.
    pub copies: [CopyStatus; SUPERBLOCK_COPY_COUNT],
    /// Version of copy `i` at `versions[i]` when it is valid (`Current` or `Stale`); `None` when
    /// it is invalid.
    pub versions: [Option<u16>; SUPERBLOCK_COPY_COUNT],
}

impl OpenReport {
    /// The lowest version among the valid copies: below [`SUPERBLOCK_VERSION`] when a binary
    /// that reads only that version could still boot from one of them, so the file needs
    /// [`Superblock::upgrade`] before this binary writes data in the newer format.
    pub fn oldest_version(&self) -> u16 {
        self.versions
            .iter()
            .flatten()
            .copied()
            .min()
            .unwrap_or(SUPERBLOCK_VERSION)
    }

    /// True when every copy is valid and current.
    pub fn is_clean(&self) -> bool {
        self.copies
            .iter()
            .all(|status| *status == CopyStatus::Current)
    }

    /// `(copy_index, defect)` of each invalid copy, in copy order.
    pub fn invalid_copies(&self) -> impl Iterator<Item = (usize, CopyDefect)> + '_ {
        self.copies
            .iter()
            .enumerate()
            .filter_map(|(copy_index, status)| match status {
                CopyStatus::Invalid(defect) => Some((copy_index, *defect)),
                CopyStatus::Current | CopyStatus::Stale { .. } => None,
            })
    }
}

impl fmt::Display for OpenReport {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (copy_index, status) in self.copies.iter().enumerate() {
            if copy_index > 0 {
                formatter.write_str("; ")?;
            }
            match status {
                CopyStatus::Current => write!(formatter, "copy {copy_index}: current")?,
                CopyStatus::Stale { sequence } => {
                    write!(formatter, "copy {copy_index}: stale (sequence {sequence})")?;
                }
                CopyStatus::Invalid(defect) => {
                    write!(formatter, "copy {copy_index}: invalid ({defect})")?;
                }
            }
        }
        Ok(())
    }
}

/// Why a superblock operation failed; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SuperblockError {
    /// An I/O step failed; `op` names the step, `path` the file or directory it acted on.
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    /// `open` found no superblock file: the replica was never formatted (or the file was removed).
    #[error("{path}: superblock file does not exist")]
    NotFound { path: PathBuf },
    /// `create` found a superblock file already there; it was left untouched.
    #[error("{path}: superblock file already exists")]
    AlreadyExists { path: PathBuf },
    /// Copy `copy_index` is intact but of version `found`, which this binary does not read
    /// (`storage/FORMAT.md` section 7, "Versions"). Nothing was written. The message depends on
    /// the case: above [`SUPERBLOCK_VERSION`], a newer shardline wrote this file and the data
    /// directory may hold data this binary would misjudge as damage, so the operator starts a
    /// release that reads version `found`; below [`SUPERBLOCK_VERSION_MIN`], no shardline
    /// release wrote it (another program, or damage the checksum did not catch), so the operator
    /// restores the data directory instead.
    #[error("{}", describe_unsupported_version(path, *copy_index, *found))]
    UnsupportedVersion {
        path: PathBuf,
        copy_index: usize,
        found: u16,
    },
    /// No copy verifies; the replica must not boot from this file. `reasons[i]` is copy `i`'s.
    #[error(
        "{path}: all {SUPERBLOCK_COPY_COUNT} superblock copies are invalid: {}",
        describe_defects(reasons)
    )]
    AllCopiesInvalid {
        path: PathBuf,
        /// Boxed to keep `Result<_, SuperblockError>` small.
        reasons: Box<[CopyDefect; SUPERBLOCK_COPY_COUNT]>,
    },
    /// Valid copies contradict each other (same sequence but different state, different cluster
    /// identity, or an older copy ahead of a newer one): damage or a bug, never a crash.
    #[error("{path}: corrupt superblock: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    /// An earlier `write` failed or was cancelled part way; the copies on disk may hold a state this
    /// handle does not know, so it refuses to write again. Reopen the file to continue.
    #[error("{path}: an earlier superblock write did not complete; reopen the superblock")]
    Poisoned { path: PathBuf },
}

/// [`CopyDefect::Version`]'s message: no shardline version below the minimum, a newer one above.
fn describe_version_defect(found: u16) -> String {
    if found < SUPERBLOCK_VERSION_MIN {
        format!(
            "version {found}, which is not a shardline superblock version (shardline writes \
             versions {SUPERBLOCK_VERSION_MIN} and up; this binary reads \
             {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION})"
        )
    } else {
        format!(
            "version {found}, which this binary does not read (it reads versions \
             {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION}; a newer shardline wrote it)"
        )
    }
}

/// [`SuperblockError::UnsupportedVersion`]'s message, by case: below
/// [`SUPERBLOCK_VERSION_MIN`] the copy is no shardline's (damage or another program), above
/// [`SUPERBLOCK_VERSION`] a newer release's.
fn describe_unsupported_version(path: &Path, copy_index: usize, found: u16) -> String {
    let path = path.display();
    if found < SUPERBLOCK_VERSION_MIN {
        format!(
            "{path}: superblock copy {copy_index} has version {found}, which is not a shardline \
             superblock version: shardline writes versions {SUPERBLOCK_VERSION_MIN} and up, and \
             this binary reads versions {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION}. The \
             copy's checksum verifies, so this is no torn write: another program wrote this \
             file, or damage rewrote the copy whole. Nothing was changed, and no shardline \
             release reads it: restore the data directory from a backup (a replica of a cluster \
             may instead reformat its data directory and rejoin by state transfer)"
        )
    } else {
        format!(
            "{path}: superblock copy {copy_index} has version {found}, but this binary reads only \
             versions {SUPERBLOCK_VERSION_MIN} to {SUPERBLOCK_VERSION}: the data directory was \
             written by a newer shardline, and this one could misread its data as damage. Nothing \
             was changed; start it with a shardline that supports superblock version {found} (a \
             newer release)"
        )
    }
}

fn describe_defects(reasons: &[CopyDefect; SUPERBLOCK_COPY_COUNT]) -> String {
    let described: Vec<String> = reasons
        .iter()
        .enumerate()
        .map(|(copy_index, defect)| format!("copy {copy_index}: {defect}"))
        .collect();
    described.join("; ")
}

fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> SuperblockError {
    let path = path.to_path_buf();
    move |source| SuperblockError::Io { path, op, source }
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// The invariant a single state breaks, if any. Every written state keeps all of them: the
/// replica is one of the cluster's, a view's log is never from a later view (VSR Revisited
/// section 4.2: `log_view` is the latest view in which the status was normal, so `log_view <=
/// view`), and only committed ops are checkpointed (DESIGN section 9).
fn state_violation(state: &SuperblockState) -> Option<&'static str> {
    if state.sequence == 0 {
        Some("sequence is 0")
    } else if state.replica_count == 0 {
        Some("replica_count is 0")
    } else if state.replica_id >= state.replica_count {
        Some("replica_id is not below replica_count")
    } else if state.log_view > state.view {
        Some("log_view is above view")
    } else if state.checkpoint_op > state.commit_max {
        Some("checkpoint_op is above commit_max")
    } else {
        None
    }
}

/// The first way in which `newer` goes back from `older`, if any (VSR Revisited sections 4.2 and
/// 4.3: a replica never goes back in view, and what it recorded as committed or checkpointed stays
/// so), or changes the identity fixed at create. Public so offline tools apply the same rule.
pub fn regression(older: &SuperblockState, newer: &SuperblockState) -> Option<&'static str> {
    if newer.cluster != older.cluster {
        Some("cluster changed")
    } else if newer.replica_id != older.replica_id {
        Some("replica_id changed")
    } else if newer.replica_count != older.replica_count {
        Some("replica_count changed")
    } else if newer.view < older.view {
        Some("view decreased")
    } else if newer.log_view < older.log_view {
        Some("log_view decreased")
    } else if newer.commit_max < older.commit_max {
        Some("commit_max decreased")
    } else if newer.checkpoint_op < older.checkpoint_op {
        Some("checkpoint_op decreased")
    } else {
        None
    }
}

/// Encodes `state` as copy `copy_index`: the 128-byte header (checksum last) then zeros up to
/// [`SUPERBLOCK_COPY_SIZE`] bytes.
///
/// # Panics
/// If `copy_index` is not below [`SUPERBLOCK_COPY_COUNT`] or `state` breaks a state invariant
/// (sequence 0, `replica_id >= replica_count`, `log_view > view`, `checkpoint_op > commit_max`).
pub fn encode_copy(state: &SuperblockState, copy_index: usize) -> Vec<u8> {
    assert!(
        copy_index < SUPERBLOCK_COPY_COUNT,
        "copy index {copy_index}"
    );
    if let Some(violation) = state_violation(state) {
        panic!("superblock state to encode is invalid: {violation}: {state:?}");
    }
    let mut header = CopyHeader {
        magic: SUPERBLOCK_MAGIC,
        version: SUPERBLOCK_VERSION,
        copy_index: copy_index as u8,
        replica_id: state.replica_id,
        replica_count: state.replica_count,
        reserved_a: [0; 3],
        view: state.view,
        log_view: state.log_view,
        sequence: state.sequence,
        cluster: state.cluster,
        commit_max: state.commit_max,
        checkpoint_op: state.checkpoint_op,
        snapshot_checksum: state.snapshot_checksum,
        reserved_b: [0; 40],
        checksum: 0,
    };
    header.checksum = XxHash3_128::oneshot(&bytemuck::bytes_of(&header)[..CHECKSUMMED_SIZE]);
    let mut bytes = vec![0u8; SUPERBLOCK_COPY_SIZE];
    bytes[..SUPERBLOCK_HEADER_SIZE].copy_from_slice(bytemuck::bytes_of(&header));
    bytes
}

/// A valid copy: its version and the state it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodedCopy {
    /// In [`SUPERBLOCK_VERSION_MIN`]`..=`[`SUPERBLOCK_VERSION`].
    pub version: u16,
    pub state: SuperblockState,
}

/// Decodes and verifies the copy in slot `copy_index` from `bytes`, which must hold the whole copy
/// ([`SUPERBLOCK_COPY_SIZE`] bytes; fewer is [`CopyDefect::Missing`]; bytes past the copy are not
/// looked at), and returns its state. [`decode_copy_versioned`] also returns its version.
///
/// # Errors
/// As [`decode_copy_versioned`].
pub fn decode_copy(bytes: &[u8], copy_index: usize) -> Result<SuperblockState, CopyDefect> {
    decode_copy_versioned(bytes, copy_index).map(|copy| copy.state)
}

/// Decodes and verifies the copy in slot `copy_index` from `bytes` (as [`decode_copy`]) and
/// returns its version with its state.
///
/// # Errors
/// The first [`CopyDefect`] found, checked in this order: missing, zeroed, magic, checksum,
/// version, copy index, reserved bytes, padding, field invariants. The checksum comes before the
/// version so that a damaged version field is damage (`Checksum`) and only an intact copy of
/// another version is `Version` (a newer binary's, or below version 1 no shardline's; open
/// refuses the file for either).
pub fn decode_copy_versioned(bytes: &[u8], copy_index: usize) -> Result<DecodedCopy, CopyDefect> {
    let Some(bytes) = bytes.get(..SUPERBLOCK_COPY_SIZE) else {
        return Err(CopyDefect::Missing {
            file_size_bytes: bytes.len() as u64,
        });
    };
    if bytes.iter().all(|&byte| byte == 0) {
        return Err(CopyDefect::Zeroed);
    }
    let header: CopyHeader = bytemuck::pod_read_unaligned(&bytes[..SUPERBLOCK_HEADER_SIZE]);
    if header.magic != SUPERBLOCK_MAGIC {
        return Err(CopyDefect::Magic {
            found: header.magic,
        });
    }
    let computed = XxHash3_128::oneshot(&bytes[..CHECKSUMMED_SIZE]);
    if header.checksum != computed {
        return Err(CopyDefect::Checksum {
            stored: header.checksum,
            computed,
        });
    }
    if !(SUPERBLOCK_VERSION_MIN..=SUPERBLOCK_VERSION).contains(&header.version) {
        return Err(CopyDefect::Version {
            found: header.version,
        });
    }
    if usize::from(header.copy_index) != copy_index {
        return Err(CopyDefect::CopyIndex {
            found: header.copy_index,
        });
    }
    if header.reserved_a != [0; 3] || header.reserved_b != [0; 40] {
        return Err(CopyDefect::Reserved);
    }
    if bytes[SUPERBLOCK_HEADER_SIZE..]
        .iter()
        .any(|&byte| byte != 0)
    {
        return Err(CopyDefect::Padding);
    }
    let state = SuperblockState {
        sequence: header.sequence,
        cluster: header.cluster,
        replica_id: header.replica_id,
        replica_count: header.replica_count,
        view: header.view,
        log_view: header.log_view,
        commit_max: header.commit_max,
        checkpoint_op: header.checkpoint_op,
        snapshot_checksum: header.snapshot_checksum,
    };
    match state_violation(&state) {
        Some(reason) => Err(CopyDefect::Inconsistent { reason }),
        None => Ok(DecodedCopy {
            version: header.version,
            state,
        }),
    }
}

/// Encodes copy `copy_index` and checks it decodes back to `state` before it goes to disk.
fn encode_checked(state: &SuperblockState, copy_index: usize) -> Vec<u8> {
    let bytes = encode_copy(state, copy_index);
    assert_eq!(
        decode_copy_versioned(&bytes, copy_index),
        Ok(DecodedCopy {
            version: SUPERBLOCK_VERSION,
            state: *state
        }),
        "an encoded superblock copy decodes to what was encoded, at the version written"
    );
    bytes
}

/// Byte position of copy `copy_index` in the file.
fn copy_position(copy_index: usize) -> u64 {
    (copy_index * SUPERBLOCK_COPY_SIZE) as u64
}

/// An open superblock file and the state of its current copy. One per replica, on shard 0; all
/// writes go through [`Superblock::write`] (callers serialize them with `superblock_lock`, DESIGN
/// section 9).
#[derive(Debug)]
pub struct Superblock {
    path: PathBuf,
    file: File,
    state: SuperblockState,
    /// The lowest version among the valid copies on disk ([`OpenReport::oldest_version`] at
    /// open; [`SUPERBLOCK_VERSION`] after create and after every completed write).
    oldest_version: u16,
    /// Set while a write is in progress and left set if it fails or is cancelled.
    poisoned: bool,
}

impl Superblock {
    /// Creates the superblock file `path` holding `state` at sequence 1 in every copy, atomically:
    /// after a crash `path` is either absent or complete.
    ///
    /// Steps: create/truncate `path.tmp`, write all copies, fsync it, hard-link it as `path` (fails
    /// if `path` exists), unlink `path.tmp`, fsync the directory.
    ///
    /// # Errors
    /// `AlreadyExists` if `path` exists (it is not touched); `Io` naming the path and step.
    ///
    /// # Panics
    /// If `state` breaks a state invariant (`replica_count` 0, `replica_id >= replica_count`,
    /// `log_view > view`, `checkpoint_op > commit_max`): the caller passed a state VSR cannot have.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped future may leave `path.tmp` (ignored, truncated by the next
    /// create) and may or may not have linked `path`; a linked `path` is always complete.
    pub async fn create(
        path: &Path,
        state: SuperblockState,
    ) -> Result<Superblock, SuperblockError> {
        let state = SuperblockState {
            sequence: 1,
            ..state
        };
        let mut bytes = Vec::with_capacity(SUPERBLOCK_FILE_SIZE);
        for copy_index in 0..SUPERBLOCK_COPY_COUNT {
            bytes.extend_from_slice(&encode_checked(&state, copy_index));
        }
        let tmp = tmp_path(path);
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .await
            .map_err(io_error(&tmp, "create temporary superblock"))?;
        let BufResult(result, _) = (&file).write_all_at(bytes, 0).await;
        result.map_err(io_error(&tmp, "write temporary superblock"))?;
        file.sync_all()
            .await
            .map_err(io_error(&tmp, "fsync temporary superblock"))?;
        // link(2) fails with EEXIST instead of replacing, so an existing superblock is never lost.
        if let Err(error) = compio::fs::hard_link(&tmp, path).await {
            // The temporary file is garbage either way; a leftover one is truncated next time.
            let _ = compio::fs::remove_file(&tmp).await;
            if error.kind() == io::ErrorKind::AlreadyExists {
                return Err(SuperblockError::AlreadyExists {
                    path: path.to_path_buf(),
                });
            }
            return Err(io_error(path, "link temporary superblock")(error));
        }
        compio::fs::remove_file(&tmp)
            .await
            .map_err(io_error(&tmp, "unlink temporary superblock"))?;
        let dir = parent_dir(path);
        sync_dir(dir).await.map_err(io_error(
            dir,
            "fsync directory after creating the superblock",
        ))?;
        Ok(Superblock {
            path: path.to_path_buf(),
            file,
            state,
            oldest_version: SUPERBLOCK_VERSION,
            poisoned: false,
        })
    }

    /// Opens the superblock file `path`: reads every copy, verifies each, and returns the state of
    /// the valid copy with the highest sequence, with a report of what each copy held.
    ///
    /// Bytes past [`SUPERBLOCK_FILE_SIZE`] are ignored. A torn or damaged copy is survived as long
    /// as one copy verifies; invalid and stale copies are rewritten by the next `write`.
    ///
    /// # Errors
    /// `NotFound` if `path` does not exist; `UnsupportedVersion` if any copy is intact but of a
    /// version this binary does not read (a newer binary's file, or below version 1 no
    /// shardline's: refused whatever the other copies hold, so it is never rewritten at this
    /// binary's version); `AllCopiesInvalid` (with each copy's
    /// defect) if no copy verifies; `Corrupt` if valid copies contradict each other (same highest
    /// sequence with different states, different cluster identity, or an older copy ahead of the
    /// newest in a monotonic field); `Io` naming the path and step.
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn open(path: &Path) -> Result<(Superblock, OpenReport), SuperblockError> {
        let file = match OpenOptions::new().read(true).write(true).open(path).await {
            Ok(file) => file,
            Err(error) if error.kind() == io::ErrorKind::NotFound => {
                return Err(SuperblockError::NotFound {
                    path: path.to_path_buf(),
                });
            }
            Err(error) => return Err(io_error(path, "open superblock")(error)),
        };
        let file_size_bytes = file
            .metadata()
            .await
            .map_err(io_error(path, "stat superblock"))?
            .len();
        let read_size = file_size_bytes.min(SUPERBLOCK_FILE_SIZE as u64) as usize;
        let bytes = read_exact_at(&file, 0, read_size)
            .await
            .map_err(io_error(path, "read superblock"))?;
        let decoded: Vec<Result<DecodedCopy, CopyDefect>> = (0..SUPERBLOCK_COPY_COUNT)
            .map(|copy_index| {
                let range =
                    copy_index * SUPERBLOCK_COPY_SIZE..(copy_index + 1) * SUPERBLOCK_COPY_SIZE;
                match bytes.get(range) {
                    Some(copy) => decode_copy_versioned(copy, copy_index),
                    None => Err(CopyDefect::Missing { file_size_bytes }),
                }
            })
            .collect();
        let (state, report) = choose(path, &decoded, file_size_bytes)?;
        Ok((
            Superblock {
                path: path.to_path_buf(),
                file,
                state,
                oldest_version: report.oldest_version(),
                poisoned: false,
            },
            report,
        ))
    }

    /// Durably records `new_state` with sequence `state().sequence + 1` (the `sequence` passed in
    /// is ignored), writing the copies one at a time in order 0, 1, 2, 3 with an fsync
    /// (`fdatasync`: the file size never changes) after each. A crash therefore tears at most the
    /// one copy being written, and the file always holds a valid copy of the old or the new state.
    ///
    /// # Errors
    /// `Poisoned` if an earlier write failed or was cancelled; `Io` naming the file and the step.
    /// Any `Io` error poisons the handle: the disk may hold the new state in some copies, and a
    /// retried write would reuse its sequence for a different state, so only a reopen (which
    /// picks the highest valid sequence on disk) may write again.
    ///
    /// # Panics
    /// If `new_state` changes `cluster`, `replica_id` or `replica_count`, decreases `view`,
    /// `log_view`, `commit_max` or `checkpoint_op` (VSR Revisited sections 4.2-4.3: a replica never
    /// goes back in view, and a restarted replica must recover at least what it promised), or
    /// breaks a state invariant (`log_view > view`, `checkpoint_op > commit_max`). Each is a bug in
    /// the caller.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped future poisons the handle (as a failure does). The file still
    /// holds a valid copy of the old or the new state.
    pub async fn write(&mut self, new_state: SuperblockState) -> Result<(), SuperblockError> {
        self.write_observed(new_state, &mut |_| {}).await
    }

    /// [`Superblock::write`], calling `observer(copy_index)` synchronously right after copy
    /// `copy_index` is written and fsynced (0, 1, 2, 3 in order), so a test can kill the process
    /// between copies. Not called for a copy whose write or fsync failed, nor after it.
    ///
    /// # Errors
    /// As [`Superblock::write`].
    ///
    /// # Panics
    /// As [`Superblock::write`].
    ///
    /// # Cancel safety
    /// As [`Superblock::write`]: not cancel safe; a dropped future poisons the handle.
    pub async fn write_observed(
        &mut self,
        new_state: SuperblockState,
        observer: &mut dyn FnMut(usize),
    ) -> Result<(), SuperblockError> {
        if self.poisoned {
            return Err(SuperblockError::Poisoned {
                path: self.path.clone(),
            });
        }
        let sequence = self.state.sequence.checked_add(1);
        let Some(sequence) = sequence else {
            panic!("superblock sequence overflow at {}", self.state.sequence);
        };
        let new_state = SuperblockState {
            sequence,
            ..new_state
        };
        if let Some(regression) = regression(&self.state, &new_state) {
            panic!(
                "superblock write would break VSR monotonicity: {regression}: {:?} -> {new_state:?}",
                self.state
            );
        }
        self.poisoned = true;
        for copy_index in 0..SUPERBLOCK_COPY_COUNT {
            let bytes = encode_checked(&new_state, copy_index);
            let BufResult(result, _) = (&self.file)
                .write_all_at(bytes, copy_position(copy_index))
                .await;
            result.map_err(io_error(&self.path, "write superblock copy"))?;
            self.file
                .sync_data()
                .await
                .map_err(io_error(&self.path, "fsync superblock copy"))?;
            observer(copy_index);
        }
        self.state = new_state;
        self.oldest_version = SUPERBLOCK_VERSION;
        self.poisoned = false;
        Ok(())
    }

    /// Brings every copy to [`SUPERBLOCK_VERSION`] when open found a valid copy of an older
    /// version (`storage/FORMAT.md` section 7, "Versions"): rewrites the current state unchanged
    /// through [`Superblock::write_observed`] (sequence + 1, copies 0 to 3 each fsynced, so the
    /// same torn-write rules hold), calling `observer` as it does. Does nothing when every valid
    /// copy is already at [`SUPERBLOCK_VERSION`].
    ///
    /// Returns the version upgraded from (the lowest valid copy's: `Some(1)` or `Some(2)`), or
    /// `None` when nothing was written. Any version below [`SUPERBLOCK_VERSION`] goes straight to
    /// it in this one write (there is no step through the versions between: they share the
    /// layout, and only the version field changes). A caller that will write data only this
    /// version's readers understand must call it, and have it return `Ok`, first: until it
    /// returns, a binary of the older version may still boot from a copy of the older version.
    ///
    /// # Errors
    /// As [`Superblock::write`] (`Poisoned`, `Io`; a failure poisons the handle, and the file
    /// still holds every copy open found, or some at the new version).
    ///
    /// # Panics
    /// If the handle's oldest version is outside the versions open accepts (a bug: open refuses
    /// any other).
    ///
    /// # Cancel safety
    /// As [`Superblock::write`]: not cancel safe; a dropped future poisons the handle.
    pub async fn upgrade(
        &mut self,
        observer: &mut dyn FnMut(usize),
    ) -> Result<Option<u16>, SuperblockError> {
        let from = self.oldest_version;
        if from == SUPERBLOCK_VERSION {
            return Ok(None);
        }
        assert!(
            (SUPERBLOCK_VERSION_MIN..SUPERBLOCK_VERSION).contains(&from),
            "superblock oldest version {from} outside the versions open accepts"
        );
        self.write_observed(self.state, observer).await?;
        Ok(Some(from))
    }

    /// The lowest version among the valid copies on disk: what open found, or
    /// [`SUPERBLOCK_VERSION`] after create, a write or an upgrade.
    pub fn oldest_version(&self) -> u16 {
        self.oldest_version
    }

    /// The state of the newest durable write (or of the copy open chose).
    pub fn state(&self) -> &SuperblockState {
        &self.state
    }

    /// The superblock file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Closes the file. Every completed `write` is already durable.
    ///
    /// # Errors
    /// `Io` if close(2) fails.
    ///
    /// # Cancel safety
    /// Cancel safe: nothing is written.
    pub async fn close(self) -> Result<(), SuperblockError> {
        self.file
            .close()
            .await
            .map_err(io_error(&self.path, "close superblock"))
    }
}

/// The open rule (`storage/FORMAT.md` section 7): the valid copy with the highest sequence wins;
/// valid copies must agree on identity, copies at that sequence must be identical, and older
/// copies must not be ahead of it.
fn choose(
    path: &Path,
    decoded: &[Result<DecodedCopy, CopyDefect>],
    file_size_bytes: u64,
) -> Result<(SuperblockState, OpenReport), SuperblockError> {
    let corrupt = |reason: String| SuperblockError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    // Any intact copy of a version this binary does not read refuses the file, even when other
    // copies are readable: a newer binary wrote it, and its data may be in a newer format.
    if let Some((copy_index, found)) =
        decoded
            .iter()
            .enumerate()
            .find_map(|(copy_index, copy)| match copy {
                Err(CopyDefect::Version { found }) => Some((copy_index, *found)),
                _ => None,
            })
    {
        return Err(SuperblockError::UnsupportedVersion {
            path: path.to_path_buf(),
            copy_index,
            found,
        });
    }
    let mut versions = [None; SUPERBLOCK_COPY_COUNT];
    for (version, copy) in versions.iter_mut().zip(decoded) {
        *version = copy.as_ref().ok().map(|copy| copy.version);
    }
    let decoded: Vec<Result<SuperblockState, CopyDefect>> = decoded
        .iter()
        .map(|copy| copy.map(|copy| copy.state))
        .collect();
    let newest = decoded
        .iter()
        .enumerate()
        .filter_map(|(copy_index, copy)| copy.as_ref().ok().map(|state| (copy_index, state)))
        // `max_by_key` keeps the last of equal maxima; reversed, that is the lowest copy index.
        .rev()
        .max_by_key(|(_, state)| state.sequence);
    let Some((newest_index, newest)) = newest else {
        let mut reasons =
            Box::new([CopyDefect::Missing { file_size_bytes }; SUPERBLOCK_COPY_COUNT]);
        for (reason, copy) in reasons.iter_mut().zip(&decoded) {
            if let Err(defect) = copy {
                *reason = *defect;
            }
        }
        return Err(SuperblockError::AllCopiesInvalid {
            path: path.to_path_buf(),
            reasons,
        });
    };
    let mut copies = [CopyStatus::Current; SUPERBLOCK_COPY_COUNT];
    for (copy_index, copy) in decoded.iter().enumerate() {
        copies[copy_index] = match copy {
            Err(defect) => CopyStatus::Invalid(*defect),
            Ok(state) if state.sequence == newest.sequence => {
                if state != newest {
                    return Err(corrupt(format!(
                        "copies {newest_index} and {copy_index} both have sequence {} but differ: \
                         {newest:?} vs {state:?}",
                        newest.sequence
                    )));
                }
                CopyStatus::Current
            }
            Ok(state) => {
                if let Some(regression) = regression(state, newest) {
                    return Err(corrupt(format!(
                        "copy {newest_index} (sequence {}) contradicts older copy {copy_index} \
                         (sequence {}): {regression}",
                        newest.sequence, state.sequence
                    )));
                }
                CopyStatus::Stale {
                    sequence: state.sequence,
                }
            }
        };
    }
    Ok((*newest, OpenReport { copies, versions }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> SuperblockState {
        SuperblockState {
            sequence: 7,
            cluster: 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210,
            replica_id: 2,
            replica_count: 3,
            view: 9,
            log_view: 8,
            commit_max: 100,
            checkpoint_op: 64,
            snapshot_checksum: 0xdead_beef,
        }
    }

    #[test]
    fn write_observed_reports_each_copy_after_it_is_on_disk() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SUPERBLOCK_FILE_NAME);
        let runtime = compio::runtime::Runtime::new().unwrap();
        let initial = SuperblockState {
            commit_max: 10,
            checkpoint_op: 0,
            snapshot_checksum: 0,
            ..state()
        };
        let advanced = SuperblockState {
            commit_max: 20,
            checkpoint_op: 16,
            snapshot_checksum: 0x1234,
            ..state()
        };
        let mut seen = Vec::new();
        runtime.block_on(async {
            let mut superblock = Superblock::create(&path, initial).await.unwrap();
            superblock
                .write_observed(advanced, &mut |copy_index| {
                    // Copies up to this one hold sequence 2, the rest still sequence 1.
                    let bytes = std::fs::read(&path).unwrap();
                    let sequences: Vec<u64> = (0..SUPERBLOCK_COPY_COUNT)
                        .map(|index| {
                            let range =
                                index * SUPERBLOCK_COPY_SIZE..(index + 1) * SUPERBLOCK_COPY_SIZE;
                            decode_copy(&bytes[range], index).unwrap().sequence
                        })
                        .collect();
                    seen.push((copy_index, sequences));
                })
                .await
                .unwrap();
            assert_eq!(superblock.state().sequence, 2);
            // `write` is the same with a no-op observer.
            superblock.write(advanced).await.unwrap();
            assert_eq!(superblock.state().sequence, 3);
            superblock.close().await.unwrap();
        });
        assert_eq!(
            seen,
            vec![
                (0, vec![2, 1, 1, 1]),
                (1, vec![2, 2, 1, 1]),
                (2, vec![2, 2, 2, 1]),
                (3, vec![2, 2, 2, 2]),
            ]
        );
    }

    #[test]
    fn header_fields_lie_at_the_documented_offsets() {
        let bytes = encode_copy(&state(), 3);
        assert_eq!(bytes.len(), SUPERBLOCK_COPY_SIZE);
        assert_eq!(&bytes[0..8], b"SLSUPBLK");
        assert_eq!(&bytes[8..10], &3u16.to_le_bytes());
        assert_eq!(bytes[10], 3);
        assert_eq!(bytes[11], 2);
        assert_eq!(bytes[12], 3);
        assert_eq!(&bytes[13..16], &[0, 0, 0]);
        assert_eq!(&bytes[16..20], &9u32.to_le_bytes());
        assert_eq!(&bytes[20..24], &8u32.to_le_bytes());
        assert_eq!(&bytes[24..32], &7u64.to_le_bytes());
        assert_eq!(&bytes[32..48], &state().cluster.to_le_bytes());
        assert_eq!(&bytes[48..56], &100u64.to_le_bytes());
        assert_eq!(&bytes[56..64], &64u64.to_le_bytes());
        assert_eq!(&bytes[64..72], &0xdead_beefu64.to_le_bytes());
        assert!(bytes[72..112].iter().all(|&byte| byte == 0));
        assert_eq!(
            &bytes[112..128],
            &XxHash3_128::oneshot(&bytes[..112]).to_le_bytes()
        );
        assert!(bytes[128..].iter().all(|&byte| byte == 0));
        assert_eq!(decode_copy(&bytes, 3), Ok(state()));
    }

    /// Copy 2 of `state()`, resealed at `version`: what a binary writing `version` left.
    fn copy_at_version(version: u16) -> Vec<u8> {
        let mut bytes = encode_copy(&state(), 2);
        bytes[8..10].copy_from_slice(&version.to_le_bytes());
        let checksum = XxHash3_128::oneshot(&bytes[..CHECKSUMMED_SIZE]);
        bytes[CHECKSUMMED_SIZE..SUPERBLOCK_HEADER_SIZE].copy_from_slice(&checksum.to_le_bytes());
        bytes
    }

    #[test]
    fn issue12_downgrade_a_version_1_copy_decodes_with_its_version() {
        let bytes = copy_at_version(1);
        assert_eq!(
            decode_copy_versioned(&bytes, 2),
            Ok(DecodedCopy {
                version: 1,
                state: state()
            })
        );
        assert_eq!(decode_copy(&bytes, 2), Ok(state()));
        assert_eq!(
            decode_copy_versioned(&encode_copy(&state(), 2), 2).map(|copy| copy.version),
            Ok(SUPERBLOCK_VERSION)
        );
    }

    #[test]
    fn issue12_timestamp_rule_a_version_2_copy_decodes_with_its_version_and_3_is_written() {
        assert_eq!(SUPERBLOCK_VERSION, 3);
        assert_eq!(SUPERBLOCK_VERSION_MIN, 1);
        let bytes = copy_at_version(2);
        assert_eq!(
            decode_copy_versioned(&bytes, 2),
            Ok(DecodedCopy {
                version: 2,
                state: state()
            })
        );
        assert_eq!(decode_copy(&bytes, 2), Ok(state()));
        assert_eq!(&encode_copy(&state(), 2)[8..10], &3u16.to_le_bytes());
    }

    #[test]
    fn every_version_after_the_first_names_what_it_introduced() {
        assert_eq!(version_introduced(SUPERBLOCK_VERSION_MIN), None);
        for version in SUPERBLOCK_VERSION_MIN + 1..=SUPERBLOCK_VERSION {
            assert!(version_introduced(version).is_some(), "version {version}");
        }
        assert_eq!(
            version_introduced(3),
            Some("the timestamp entry checksum rule, flag bit 2")
        );
        assert_eq!(version_introduced(0), None);
        assert_eq!(version_introduced(SUPERBLOCK_VERSION + 1), None);
    }

    #[test]
    fn unsupported_version_messages_tell_no_shardline_version_from_a_newer_one() {
        let path = PathBuf::from("/data/superblock");
        let below = SuperblockError::UnsupportedVersion {
            path: path.clone(),
            copy_index: 2,
            found: 0,
        };
        assert_eq!(
            below.to_string(),
            "/data/superblock: superblock copy 2 has version 0, which is not a shardline \
             superblock version: shardline writes versions 1 and up, and this binary reads \
             versions 1 to 3. The copy's checksum verifies, so this is no torn write: another \
             program wrote this file, or damage rewrote the copy whole. Nothing was changed, and \
             no shardline release reads it: restore the data directory from a backup (a replica \
             of a cluster may instead reformat its data directory and rejoin by state transfer)"
        );
        let above = SuperblockError::UnsupportedVersion {
            path,
            copy_index: 1,
            found: 4,
        };
        assert_eq!(
            above.to_string(),
            "/data/superblock: superblock copy 1 has version 4, but this binary reads only \
             versions 1 to 3: the data directory was written by a newer shardline, and this one \
             could misread its data as damage. Nothing was changed; start it with a shardline \
             that supports superblock version 4 (a newer release)"
        );
        assert_eq!(
            CopyDefect::Version { found: 0 }.to_string(),
            "version 0, which is not a shardline superblock version (shardline writes versions 1 \
             and up; this binary reads 1 to 3)"
        );
        assert_eq!(
            CopyDefect::Version { found: 4 }.to_string(),
            "version 4, which this binary does not read (it reads versions 1 to 3; a newer \
             shardline wrote it)"
        );
    }

    #[test]
    fn decode_names_each_defect() {
        let good = encode_copy(&state(), 1);
        assert_eq!(
            decode_copy(&good[..4095], 1),
            Err(CopyDefect::Missing {
                file_size_bytes: 4095
            })
        );
        assert_eq!(
            decode_copy(&vec![0u8; SUPERBLOCK_COPY_SIZE], 1),
            Err(CopyDefect::Zeroed)
        );
        let mut bytes = good.clone();
        bytes[0] = b'X';
        assert!(matches!(
            decode_copy(&bytes, 1),
            Err(CopyDefect::Magic { .. })
        ));
        // A version byte changed by damage fails the checksum: damage, not a newer format.
        let mut bytes = good.clone();
        bytes[8] = 4;
        assert!(matches!(
            decode_copy(&bytes, 1),
            Err(CopyDefect::Checksum { .. })
        ));
        let mut bytes = good.clone();
        bytes[50] ^= 0x10;
        assert!(matches!(
            decode_copy(&bytes, 1),
            Err(CopyDefect::Checksum { .. })
        ));
        assert_eq!(
            decode_copy(&good, 2),
            Err(CopyDefect::CopyIndex { found: 1 })
        );
        let mut bytes = good.clone();
        bytes[4000] = 1;
        assert_eq!(decode_copy(&bytes, 1), Err(CopyDefect::Padding));
        // Reserved bytes and field invariants need a valid checksum over a hand-made header.
        let reseal = |bytes: &mut Vec<u8>| {
            let checksum = XxHash3_128::oneshot(&bytes[..112]);
            bytes[112..128].copy_from_slice(&checksum.to_le_bytes());
        };
        // An intact copy of a version outside 1..=3 (a newer binary's, or 0) is `Version`.
        for version in [0u16, 4, u16::MAX] {
            let mut bytes = good.clone();
            bytes[8..10].copy_from_slice(&version.to_le_bytes());
            reseal(&mut bytes);
            assert_eq!(
                decode_copy(&bytes, 1),
                Err(CopyDefect::Version { found: version })
            );
        }
        let mut bytes = good.clone();
        bytes[80] = 1;
        reseal(&mut bytes);
        assert_eq!(decode_copy(&bytes, 1), Err(CopyDefect::Reserved));
        let mut bytes = good.clone();
        bytes[20..24].copy_from_slice(&10u32.to_le_bytes());
        reseal(&mut bytes);
        assert_eq!(
            decode_copy(&bytes, 1),
            Err(CopyDefect::Inconsistent {
                reason: "log_view is above view"
            })
        );
    }
}
