//! The metadata journal (WAL) of shard 0: VSR prepares `(op, view, commit, body)` appended in op
//! order to segment files `{first_op:020}.wal`, each batch fsynced once before `append_batch`
//! returns, read back by op, truncated above an op (a view change), replayed on open, and
//! released below a checkpoint.
//!
//! It must never return from `append` before the record is durable (VSR Revisited, Liskov and
//! Cowling 2012, section 4.1: a replica appends the prepare to its log before it sends
//! PrepareOk, and the primary executes it only after a quorum of PrepareOks; with
//! `replica_count = 1` the local fsync is that quorum), never skip or truncate a record that a
//! torn write cannot explain, and never keep writing after a failed fsync or a failed write other
//! than a full filesystem (a failed fsync may have dropped the dirty pages; see FORMAT.md section
//! 1). A record write refused with `ENOSPC`, `EDQUOT` or `EFBIG` is rolled back (the segment is
//! truncated to its last record and fsynced) and the journal goes on. Byte layout, write order
//! and crash cases: `storage/FORMAT.md` section 8. It never interprets a prepare's body.

mod record;
mod recovery;
mod restart;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

use compio::BufResult;
use compio::fs::{File, OpenOptions};
use compio::io::AsyncWriteAtExt;

use crate::durable::{read_exact_at, sync_dir};
use crate::fault::{FaultInjector, FaultOp};
use crate::limits::{JOURNAL_BODY_SIZE_MAX, JOURNAL_SEGMENT_SIZE_MAX};
use crate::space::{FreeBytes, free_bytes, is_storage_full};
pub use record::{JOURNAL_HEADER_SIZE, JournalHeader, Prepare, header_checksum, parse_record};
pub use recovery::{CoveredResume, covered_resume};
pub use restart::RestartStep;

/// How a [`Journal`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalConfig {
    /// A segment is closed and a new one started when the next record would make it larger than
    /// this (bytes); a record larger than this gets a segment of its own. 1 ..=
    /// [`JOURNAL_SEGMENT_SIZE_MAX`].
    pub segment_size_max: u64,
}

impl Default for JournalConfig {
    fn default() -> Self {
        JournalConfig {
            segment_size_max: JOURNAL_SEGMENT_SIZE_MAX,
        }
    }
}

/// What `Journal::open` found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JournalRecovery {
    /// Every record in the journal, in op order, for replay. It may start at or below the
    /// checkpoint op (a crash during `release_below`); the caller skips ops `<= checkpoint_op`.
    /// Ops are contiguous except where damage the snapshot covers was skipped (see
    /// [`TailDisposition::CoveredBySnapshot`]): ops from the damaged one up to the resume op,
    /// all at or below `covered_op`, are missing.
    /// Bounded by what the journal holds: the ops since the oldest unreleased segment.
    pub prepares: Vec<Prepare>,
    /// Where each of `prepares` lies, same order: (the first op of its segment, which names the
    /// file via [`segment_path`], and the byte position of its record there), so a caller that
    /// refuses a record can name the file and byte.
    pub record_positions: Vec<(u64, u64)>,
    /// Bytes cut from a torn tail of the last segment (0 if clean or if the damaged last record
    /// was covered by the snapshot, which is never cut).
    pub truncated_bytes: u64,
    /// Damaged records, oldest first: the last segment's torn tail (cut), and any damage at or
    /// below `covered_op` in any segment (covered, skipped). Empty when clean.
    pub damaged_records: Vec<DamagedRecord>,
    /// Segment files after open (a new journal has one, empty).
    pub segment_count: u32,
}

/// A damaged record open accepted (FORMAT.md section 8, open): a torn tail above the covered op,
/// or damage anywhere at or below it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRecord {
    /// The segment file.
    pub path: PathBuf,
    /// Byte offset of the damaged record in `path`.
    pub position: u64,
    /// The op the record holds by its place in the chain: one after the last valid record.
    pub op: u64,
    /// Bytes skipped: from `position` to the end of the segment, or to the record the walk
    /// resumed at in the same segment.
    pub size_bytes: u64,
    /// Why the record does not check out.
    pub reason: String,
    /// What open does with it.
    pub disposition: TailDisposition,
}

/// What open does with a [`DamagedRecord`]; decided by its op against the `covered_op` the caller
/// passes to [`Journal::scan`] (the snapshot's checkpoint op).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailDisposition {
    /// `op > covered_op`: a torn tail, cut from the segment. Every append is fsynced before it is
    /// acknowledged, so if a crash cut the write short the prepare was never acknowledged.
    Truncated,
    /// `op <= covered_op`: the snapshot already holds the op (it was acknowledged), so the bytes
    /// are left in place, never cut nor replayed, and the walk resumes at `resume_op`. A last
    /// segment holding such damage is closed and the journal continues in a new segment. The
    /// next checkpoint releases the damaged segment.
    CoveredBySnapshot {
        /// The op the walk resumed at: a later record in the same segment, the next segment's
        /// first op, or the new segment's (`covered_op + 1`).
        resume_op: u64,
    },
    /// `op > covered_op`, damage no torn append explains, opened with
    /// [`UncoveredDamage::RepairFromPeers`] (a replica of a cluster): the record and everything
    /// after it stay in place, unread and never appended after, until the caller's
    /// [`Journal::truncate_after`] cuts them; the journal holds the valid prefix below `op`
    /// (issue 8 section 2, repair). The other replicas hold the ops from `op` on.
    AwaitingRepair {
        /// The highest op a valid record after the damage (in this or a later segment) shows,
        /// at least `op`: the ops `op..=highest_op` must come from peers.
        highest_op: u64,
    },
}

/// What [`Journal::scan_with`] does with damage above `covered_op` that a torn append does not
/// explain (FORMAT.md section 8, open step 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UncoveredDamage {
    /// Refuse (`Corrupt`): a single replica has nowhere to get the op from, and it may have been
    /// acknowledged.
    Refuse,
    /// Open with the valid contiguous prefix below the damage and report it
    /// ([`TailDisposition::AwaitingRepair`]); the damaged bytes stay in place until
    /// [`Journal::truncate_after`] cuts them. A replica of a cluster (`replica_count > 1`)
    /// repairs the ops from its peers (issue 8 section 2).
    RepairFromPeers,
}

/// A journal read and checked by [`Journal::scan`], with its repair decided but not yet made:
/// the caller may still refuse (nothing has been written) or hand it to [`Journal::open_scanned`].
#[derive(Debug)]
pub struct JournalScan {
    scanned: recovery::Scanned,
}

impl JournalScan {
    /// The records found and the damaged records, as `open_scanned` will return them.
    pub fn recovery(&self) -> &JournalRecovery {
        &self.scanned.recovery
    }

    /// The journal's [`Journal::first_op`] once opened.
    pub fn first_op(&self) -> u64 {
        self.scanned.segment_first_ops[0]
    }

    /// The journal's [`Journal::last_op`] once opened (after the repair).
    pub fn last_op(&self) -> u64 {
        self.scanned.last_op
    }

    /// Whether opening writes nothing (no torn tail to cut, no segment to create).
    /// Covered damage in the last segment makes open create a new segment.
    pub fn is_read_only(&self) -> bool {
        self.scanned.repair == recovery::Repair::None
    }

    /// The damage kept for repair ([`TailDisposition::AwaitingRepair`]), if any.
    pub fn damaged_tail(&self) -> Option<&DamagedRecord> {
        self.scanned.damaged_tail.as_ref().map(|tail| &tail.record)
    }
}

/// Why a journal operation failed; the variants say how the caller recovers.
#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    /// An I/O step failed; `op` names the step, `path` the file or directory. After a failed
    /// append or release the journal is poisoned (every later append and release fails with
    /// [`JournalError::Poisoned`]) and must be reopened.
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    /// The record write (or the creation of a new segment for it) was refused for lack of space
    /// (`ENOSPC`, `EDQUOT` or `EFBIG`) at `op` on `path`. The partial record was cut and the
    /// segment fsynced: the journal is as before the append (`last_op` unchanged), not
    /// poisoned, and the same op may be appended again once space is freed. `free_bytes` is
    /// what the journal's filesystem had free after the rollback.
    #[error(
        "{path}: {op} failed: {source} ({free_bytes}); nothing was journaled, retry once space is freed"
    )]
    StorageFull {
        path: PathBuf,
        op: &'static str,
        free_bytes: FreeBytes,
        source: io::Error,
    },
    /// Stored bytes are damaged where a torn append cannot explain them (a closed segment, a
    /// record followed by a valid later record, an op gap between segments). Refuses to boot;
    /// never skipped. `position` is the byte offset in `path`.
    #[error("{path}: corrupt journal record at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// The prepare's body is larger than [`JOURNAL_BODY_SIZE_MAX`]; nothing was written and the
    /// journal is unchanged.
    #[error("journal body of {size_bytes} bytes exceeds the {JOURNAL_BODY_SIZE_MAX}-byte limit")]
    BodyTooLarge { size_bytes: usize },
    /// An earlier append or release failed (or was cancelled) at `op` on `path`; the state of
    /// the files is unknown until the journal is reopened, which rescans them.
    #[error("journal poisoned by an earlier failure: {path}: {op} failed: {reason}")]
    Poisoned {
        path: PathBuf,
        op: &'static str,
        reason: String,
    },
    /// The `JournalConfig` passed to `open_with_config` is out of bounds.
    #[error("invalid journal config: {0}")]
    InvalidConfig(String),
    /// An append while damage kept for repair sits at op `op` (byte `position` of `path`):
    /// the journal never writes after a damaged record. Call [`Journal::truncate_after`] with an
    /// op below `op` first; nothing was written.
    #[error(
        "{path}: damaged journal record at byte {position} (op {op}) awaits repair: truncate the \
         journal below op {op} before appending"
    )]
    DamagedTail {
        path: PathBuf,
        position: u64,
        op: u64,
    },
    /// `truncate_after(op)` below the released part of the journal: ops up to `first_op - 1`
    /// were released by a checkpoint (the snapshot holds them), so the journal cannot go back to
    /// `op`. Nothing was written. A replica needing that is behind every checkpoint: state
    /// transfer.
    #[error(
        "cannot truncate the journal after op {op}: it starts at op {first_op}, the ops below were \
         released by a checkpoint"
    )]
    TruncateBelowReleased { op: u64, first_op: u64 },
}

fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> JournalError {
    let path = path.to_path_buf();
    move |source| JournalError::Io { path, op, source }
}

/// `{first_op:020}.wal` in `dir`: 20 digits, the width of `u64::MAX`, so names sort by op.
pub fn segment_path(dir: &Path, first_op: u64) -> PathBuf {
    dir.join(format!("{first_op:020}.wal"))
}

/// Where one record lies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RecordLocation {
    /// The first op of its segment (names the file).
    segment_first_op: u64,
    /// Byte offset of the record in the segment.
    position: u64,
    /// Header + body bytes.
    size_bytes: u64,
}

/// The failure that poisoned the journal.
#[derive(Debug, Clone)]
struct Failure {
    path: PathBuf,
    op: &'static str,
    reason: String,
}

/// The metadata journal of one replica, owned by shard 0 (`!Send`: its file belongs to the
/// runtime that opened it). Holds ops `first_op()..=last_op()`, less those skipped as damage
/// the snapshot covers (see [`TailDisposition::CoveredBySnapshot`]); empty when
/// `last_op() == first_op() - 1`.
#[derive(Debug)]
pub struct Journal {
    dir: PathBuf,
    /// Where each record the journal holds lies, by op: built at open, kept by append, truncate
    /// and release. Ops skipped as covered damage are absent.
    index: BTreeMap<u64, RecordLocation>,
    /// Damage kept for repair: no append until a truncation cuts it.
    damaged_tail: Option<recovery::DamagedTail>,
    config: JournalConfig,
    /// First op of each segment file, ascending; the last one is the active segment.
    segment_first_ops: Vec<u64>,
    active_path: PathBuf,
    active_file: File,
    /// Bytes of valid records in the active segment; the next record is written here.
    active_size_bytes: u64,
    last_op: u64,
    /// Reused for every append's record bytes (handed to the kernel and back).
    write_buffer: Vec<u8>,
    failure: Option<Failure>,
    /// Test seam: consulted before every record write and segment fsync.
    faults: FaultInjector,
}

impl Journal {
    /// Opens (or creates) the journal in `dir` with the default [`JournalConfig`]; see
    /// [`Journal::open_with_config`].
    ///
    /// # Errors
    /// As [`Journal::open_with_config`].
    ///
    /// # Cancel safety
    /// As [`Journal::open_with_config`].
    pub async fn open(dir: &Path) -> Result<(Journal, JournalRecovery), JournalError> {
        Journal::open_with_config(dir, JournalConfig::default()).await
    }

    /// Opens the journal in `dir` as [`Journal::scan`] with `covered_op` 0 (no snapshot: every
    /// damaged last record is a torn tail) followed by [`Journal::open_scanned`].
    ///
    /// # Errors
    /// As [`Journal::scan`] and [`Journal::open_scanned`].
    ///
    /// # Cancel safety
    /// As [`Journal::open_scanned`].
    pub async fn open_with_config(
        dir: &Path,
        config: JournalConfig,
    ) -> Result<(Journal, JournalRecovery), JournalError> {
        let scan = Journal::scan(dir, 0).await?;
        Journal::open_scanned(scan, config).await
    }

    /// [`Journal::scan`] with damage above `covered_op` that no torn append explains refused;
    /// what a single replica does.
    ///
    /// # Errors
    /// As [`Journal::scan_with`].
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn scan(dir: &Path, covered_op: u64) -> Result<JournalScan, JournalError> {
        Journal::scan_with(dir, covered_op, UncoveredDamage::Refuse).await
    }

    /// Reads every segment of the journal in `dir` in op order, checks every record, and decides
    /// the repair; **writes nothing**, so the caller can still refuse with the files untouched.
    /// `covered_op` is the op up to which the caller's snapshot holds the state. Damage (the
    /// first invalid record of a segment) at an op above it is a torn tail only in the last
    /// segment, with no valid later record after it and at most one append's bytes (it will be
    /// cut); anything else above it refuses. Damage at or below it, in any segment, is covered:
    /// the walk skips it (see [`covered_resume`] for where it resumes, and when the skip could
    /// lose an op above `covered_op`, which refuses); a last segment holding covered damage is
    /// left as it is and the journal continues in a new segment `{max(covered_op, last
    /// op) + 1:020}.wal`. A missing or empty `dir` is a new journal starting at `covered_op + 1`
    /// (the caller decides whether ops above the snapshot could have existed). Rules:
    /// `storage/FORMAT.md` section 8. With [`UncoveredDamage::RepairFromPeers`], damage above
    /// `covered_op` that no torn append explains is reported as
    /// [`TailDisposition::AwaitingRepair`] instead of refused: the scan stops there, the journal
    /// holds the valid prefix below it, and the bytes stay in place.
    ///
    /// # Errors
    /// - `Corrupt { path, position, reason }`: damage above `covered_op` other than a torn tail
    ///   of the last segment (with [`UncoveredDamage::Refuse`]), covered damage whose skip could lose an op above `covered_op`, a
    ///   segment whose first op is not where the previous one ends (op gap) or is 0, or a
    ///   segment larger than [`JOURNAL_SEGMENT_SIZE_MAX`]. The server must refuse to boot.
    /// - `Io`: listing, opening or reading failed (path + step).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn scan_with(
        dir: &Path,
        covered_op: u64,
        policy: UncoveredDamage,
    ) -> Result<JournalScan, JournalError> {
        let scanned = recovery::scan(dir, covered_op, policy).await?;
        Ok(JournalScan { scanned })
    }

    /// Makes the repair `scan` decided and opens the journal for appends: creates the directory
    /// (missing ancestors fsynced) and its first segment for a new journal; cuts a torn tail and
    /// fsyncs the segment (`truncated_bytes`); or creates the segment after covered damage in the
    /// last segment and fsyncs the directory. The files must not have changed since the scan.
    ///
    /// # Errors
    /// - `Io`: creating, opening, truncating or fsyncing failed (path + step).
    /// - `InvalidConfig`: `segment_size_max` is 0 or above [`JOURNAL_SEGMENT_SIZE_MAX`]; nothing
    ///   was written.
    ///
    /// # Cancel safety
    /// Not cancel safe, but safe to retry from a new scan: a dropped open leaves the files as
    /// they were, or with the repair made (possibly not yet fsynced); the next scan finds either.
    pub async fn open_scanned(
        scan: JournalScan,
        config: JournalConfig,
    ) -> Result<(Journal, JournalRecovery), JournalError> {
        if config.segment_size_max == 0 || config.segment_size_max > JOURNAL_SEGMENT_SIZE_MAX {
            return Err(JournalError::InvalidConfig(format!(
                "segment_size_max {} is not in 1..={JOURNAL_SEGMENT_SIZE_MAX}",
                config.segment_size_max
            )));
        }
        let dir = scan.scanned.dir.clone();
        let recovered = recovery::apply(scan.scanned).await?;
        let active_first_op = *recovered
            .segment_first_ops
            .last()
            .expect("recovery leaves at least one segment");
        let index = recovered
            .recovery
            .prepares
            .iter()
            .zip(&recovered.recovery.record_positions)
            .map(|(prepare, &(segment_first_op, position))| {
                let location = RecordLocation {
                    segment_first_op,
                    position,
                    size_bytes: (record::JOURNAL_HEADER_SIZE + prepare.body.len()) as u64,
                };
                (prepare.op, location)
            })
            .collect();
        let journal = Journal {
            active_path: segment_path(&dir, active_first_op),
            dir,
            index,
            damaged_tail: recovered.damaged_tail,
            config,
            segment_first_ops: recovered.segment_first_ops,
            active_file: recovered.active_file,
            active_size_bytes: recovered.active_size_bytes,
            last_op: recovered.last_op,
            write_buffer: Vec::new(),
            failure: None,
            faults: FaultInjector::default(),
        };
        Ok((journal, recovered.recovery))
    }

    /// The lowest op the journal holds (the first segment's first op); when the journal is
    /// empty, the op the next append must carry.
    pub fn first_op(&self) -> u64 {
        self.segment_first_ops[0]
    }

    /// The highest op appended (durable); `first_op() - 1` when the journal is empty. With
    /// damage awaiting repair, the op below the damaged record.
    pub fn last_op(&self) -> u64 {
        self.last_op
    }

    /// The damage kept for repair ([`TailDisposition::AwaitingRepair`]); `None` once
    /// [`Journal::truncate_after`] cut it, or when the journal opened clean.
    pub fn damaged_tail(&self) -> Option<&DamagedRecord> {
        self.damaged_tail.as_ref().map(|tail| &tail.record)
    }

    /// Bytes of the records the journal holds (header + body each), across its segments: what
    /// its segment files hold less any damage kept for repair. Walks the record index (one
    /// entry per op held: at most a checkpoint interval's worth), so call it per scrape, not per
    /// op.
    pub fn size_bytes(&self) -> u64 {
        self.index
            .values()
            .map(|location| location.size_bytes)
            .sum()
    }

    /// Segment files the journal has now.
    pub fn segment_count(&self) -> usize {
        self.segment_first_ops.len()
    }

    /// The journal's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The fault-injecting seam of this journal (record writes and segment fsyncs), for tests of
    /// the failure paths; unarmed unless a caller arms it.
    pub fn fault_injector(&self) -> FaultInjector {
        self.faults.clone()
    }

    /// Appends `prepare` as one record and makes it durable: [`Journal::append_batch`] of one.
    ///
    /// # Errors
    /// As [`Journal::append_batch`].
    ///
    /// # Panics
    /// As [`Journal::append_batch`].
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped append poisons the journal (the record may be partly written);
    /// reopen it.
    pub async fn append(&mut self, prepare: &Prepare) -> Result<(), JournalError> {
        self.append_batch(std::slice::from_ref(prepare)).await
    }

    /// Appends `prepares` (consecutive ops, the first `last_op() + 1`) as records back to back,
    /// written with one write at the end of the active segment, then made durable with **one**
    /// `fdatasync` (group commit: the driver batches the prepares of concurrent clients); returns
    /// only once every record is durable, so the caller may then send PrepareOk / apply them (VSR
    /// Revisited section 4.1). If the active segment is non-empty and a record would make it
    /// exceed `segment_size_max`, the records before it are written and fsynced, then the journal
    /// rolls: fsync the active segment, create `{op:020}.wal` (`O_CREAT|O_EXCL`), fsync the
    /// directory (so a batch that crosses a segment costs one more fsync per roll). An empty
    /// batch does nothing.
    ///
    /// # Errors
    /// - `BodyTooLarge`: a body exceeds [`JOURNAL_BODY_SIZE_MAX`]; nothing written.
    /// - `DamagedTail`: damage awaiting repair; call [`Journal::truncate_after`] first; nothing
    ///   written.
    /// - `StorageFull`: a record write or a new segment's creation was refused for lack of space;
    ///   the partial write was cut and fsynced, the journal is not poisoned, and the ops up to
    ///   `last_op()` are durable (those a roll closed before the refusal; none without a roll):
    ///   append again from `last_op() + 1` once space is freed.
    /// - `Io`: any other write failure, an fsync, or a directory fsync failed (or the rollback
    ///   after a refused write did). The records may or may not be on disk; the journal is
    ///   poisoned and must be reopened (which keeps a record only if it is complete and valid).
    /// - `Poisoned`: an earlier append, truncation or release failed or was cancelled.
    ///
    /// # Panics
    /// If the ops are not `last_op() + 1, last_op() + 2, ...` or a prepare's `commit >= op`
    /// (bugs of the caller).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped append poisons the journal (records may be partly written);
    /// reopen it.
    pub async fn append_batch(&mut self, prepares: &[Prepare]) -> Result<(), JournalError> {
        self.check_not_poisoned()?;
        if let Some(tail) = &self.damaged_tail {
            return Err(JournalError::DamagedTail {
                path: tail.record.path.clone(),
                position: tail.position,
                op: tail.record.op,
            });
        }
        for (index, prepare) in prepares.iter().enumerate() {
            if prepare.body.len() > JOURNAL_BODY_SIZE_MAX as usize {
                return Err(JournalError::BodyTooLarge {
                    size_bytes: prepare.body.len(),
                });
            }
            let expected = self.last_op + 1 + index as u64;
            assert_eq!(
                prepare.op,
                expected,
                "journal append of op {} but the last op is {} (the batch's ops must follow it)",
                prepare.op,
                expected - 1
            );
            assert!(
                prepare.commit < prepare.op,
                "prepare op {} carries commit {}, but a prepare's commit number is below its op",
                prepare.op,
                prepare.commit
            );
        }
        if prepares.is_empty() {
            return Ok(());
        }
        // Poisoned until this append completes, so a dropped future leaves it poisoned.
        self.failure = Some(Failure {
            path: self.active_path.clone(),
            op: "append",
            reason: "the append was cancelled before it completed".to_owned(),
        });
        let mut buffer = std::mem::take(&mut self.write_buffer);
        buffer.clear();
        // (op, record size) of the records in `buffer`, in order.
        let mut staged: Vec<(u64, u64)> = Vec::with_capacity(prepares.len());
        for prepare in prepares {
            let record_size = (record::JOURNAL_HEADER_SIZE + prepare.body.len()) as u64;
            let segment_size = self.active_size_bytes + buffer.len() as u64;
            if segment_size > 0 && segment_size + record_size > self.config.segment_size_max {
                if !staged.is_empty() {
                    buffer = self.write_staged(buffer, &staged).await?;
                    staged.clear();
                }
                self.roll(prepare.op).await?;
            }
            record::encode_record(prepare, &mut buffer);
            staged.push((prepare.op, record_size));
        }
        self.write_buffer = self.write_staged(buffer, &staged).await?;
        self.failure = None;
        Ok(())
    }

    /// Writes the records in `buffer` (`staged`: their ops and sizes) at the end of the active
    /// segment, fdatasyncs it, and records them as journaled; returns the emptied buffer.
    async fn write_staged(
        &mut self,
        buffer: Vec<u8>,
        staged: &[(u64, u64)],
    ) -> Result<Vec<u8>, JournalError> {
        let (result, mut buffer) = self.write_record(buffer).await;
        if let Err(error) = result {
            self.write_buffer = buffer;
            if is_storage_full(&error) {
                return Err(self
                    .roll_back(self.active_path.clone(), "write record", error)
                    .await);
            }
            return Err(self.poison(self.active_path.clone(), "write record", error));
        }
        if let Err(error) = self.sync_active().await {
            return Err(self.poison(self.active_path.clone(), "fsync segment", error));
        }
        let segment_first_op = *self
            .segment_first_ops
            .last()
            .expect("the journal has an active segment");
        for &(op, size_bytes) in staged {
            self.index.insert(
                op,
                RecordLocation {
                    segment_first_op,
                    position: self.active_size_bytes,
                    size_bytes,
                },
            );
            self.active_size_bytes += size_bytes;
            self.last_op = op;
        }
        buffer.clear();
        Ok(buffer)
    }

    /// The prepare at `op`, read from its segment and verified (header and body checksums, and
    /// the op): `None` when the journal does not hold `op` (never appended, released below a
    /// checkpoint, truncated, skipped as covered damage, or at or above damage awaiting repair),
    /// and `None` with a warning naming file, byte and defect when the stored record no longer
    /// verifies (bit rot since it was written: the caller repairs the op from its peers, issue 8
    /// section 2). Opens the segment file for each read; the driver reads only to answer a
    /// peer's `RequestPrepare` or to repair, not on the commit path.
    ///
    /// # Errors
    /// `Io`: opening or reading the segment failed (other than a file shorter than the record,
    /// which reads as damage).
    ///
    /// # Cancel safety
    /// Cancel safe: it only reads.
    pub async fn read(&self, op: u64) -> Result<Option<Prepare>, JournalError> {
        let Some(&location) = self.index.get(&op) else {
            return Ok(None);
        };
        let path = segment_path(&self.dir, location.segment_first_op);
        let file = File::open(&path)
            .await
            .map_err(io_error(&path, "open segment to read a record"))?;
        let read = read_exact_at(&file, location.position, location.size_bytes as usize).await;
        // A close error on a read-only descriptor cannot lose data; the bytes are verified.
        let _ = file.close().await;
        let bytes = match read {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == io::ErrorKind::UnexpectedEof => {
                warn_unreadable(&path, location.position, op, "the segment ends inside it");
                return Ok(None);
            }
            Err(error) => return Err(io_error(&path, "read record")(error)),
        };
        let (header, body) = match parse_record(&bytes) {
            Ok(record) => record,
            Err(reason) => {
                warn_unreadable(&path, location.position, op, &reason);
                return Ok(None);
            }
        };
        if header.op != op {
            let reason = format!("it holds op {}", header.op);
            warn_unreadable(&path, location.position, op, &reason);
            return Ok(None);
        }
        Ok(Some(Prepare {
            op,
            view: header.view,
            commit: header.commit,
            body: body.to_vec(),
        }))
    }

    /// Durably drops every record above `op` (VSR Revisited section 4.2: a replica adopting the
    /// new view's log discards the ops above it), and any damage awaiting repair: deletes the
    /// segments after the one holding the first dropped record (newest first, the directory
    /// fsynced after each), then truncates that segment at the record and fsyncs it and the
    /// directory. Afterwards `last_op()` is `min(op, last_op())` and the next append carries
    /// `last_op() + 1`. Nothing above `op` and no damage: does nothing. A crash part way leaves a
    /// contiguous run of segments whose tail (the records still above `op`) the caller truncates
    /// again after reopening. Returns how many ops were dropped (not counting damaged ones).
    ///
    /// # Errors
    /// - `TruncateBelowReleased`: `op < first_op() - 1`; nothing written.
    /// - `Io`: a deletion, the truncation or an fsync failed; the journal is poisoned.
    /// - `Poisoned`: an earlier append, truncation or release failed or was cancelled.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped truncation poisons the journal; reopen it.
    pub async fn truncate_after(&mut self, op: u64) -> Result<u64, JournalError> {
        self.check_not_poisoned()?;
        if op.saturating_add(1) < self.first_op() {
            return Err(JournalError::TruncateBelowReleased {
                op,
                first_op: self.first_op(),
            });
        }
        let cut = match self.index.range(op.saturating_add(1)..).next() {
            Some((_, location)) => (location.segment_first_op, location.position),
            None => match &self.damaged_tail {
                Some(tail) => (tail.segment_first_op, tail.position),
                None => return Ok(0),
            },
        };
        let (cut_segment, cut_position) = cut;
        let new_last_op = op.min(self.last_op);
        let dropped_count = self.last_op - new_last_op;
        self.failure = Some(Failure {
            path: segment_path(&self.dir, cut_segment),
            op: "truncate",
            reason: "the truncation was cancelled before it completed".to_owned(),
        });
        while let Some(&newest) = self.segment_first_ops.last()
            && newest > cut_segment
        {
            let path = segment_path(&self.dir, newest);
            if let Err(error) = compio::fs::remove_file(&path).await {
                return Err(self.poison(path, "delete a segment above the truncation", error));
            }
            self.segment_first_ops.pop();
            if let Err(error) = sync_dir(&self.dir).await {
                return Err(self.poison(
                    self.dir.clone(),
                    "fsync journal directory after deleting a segment",
                    error,
                ));
            }
        }
        let path = segment_path(&self.dir, cut_segment);
        if path != self.active_path {
            let file = match OpenOptions::new().read(true).write(true).open(&path).await {
                Ok(file) => file,
                Err(error) => return Err(self.poison(path, "open segment to truncate", error)),
            };
            // The old active segment was deleted above; nothing of it is kept.
            let old = std::mem::replace(&mut self.active_file, file);
            let _ = old.close().await;
            self.active_path.clone_from(&path);
        }
        if let Err(error) = self.active_file.set_len(cut_position).await {
            return Err(self.poison(path, "truncate segment", error));
        }
        if let Err(error) = self.active_file.sync_all().await {
            return Err(self.poison(path, "fsync segment after truncating", error));
        }
        if let Err(error) = sync_dir(&self.dir).await {
            return Err(self.poison(
                self.dir.clone(),
                "fsync journal directory after truncating",
                error,
            ));
        }
        self.active_size_bytes = cut_position;
        self.index.split_off(&(new_last_op.saturating_add(1)));
        self.last_op = new_last_op;
        self.damaged_tail = None;
        self.failure = None;
        tracing::info!(
            path = %path.display(), position = cut_position, last_op = new_last_op, dropped_count,
            "journal truncated"
        );
        Ok(dropped_count)
    }

    /// `Poisoned` if an earlier write step failed or was cancelled.
    fn check_not_poisoned(&self) -> Result<(), JournalError> {
        match &self.failure {
            Some(failure) => Err(JournalError::Poisoned {
                path: failure.path.clone(),
                op: failure.op,
                reason: failure.reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// Writes `buffer` at the end of the active segment, through the fault seam: an injected
    /// write fault first writes half the record, as a write that runs out of space part way does.
    async fn write_record(&self, buffer: Vec<u8>) -> (io::Result<()>, Vec<u8>) {
        let position = self.active_size_bytes;
        if let Err(error) = self.faults.check(FaultOp::Write) {
            let half = buffer[..buffer.len() / 2].to_vec();
            let BufResult(_, _) = (&self.active_file).write_all_at(half, position).await;
            return (Err(error), buffer);
        }
        let BufResult(result, buffer) = (&self.active_file).write_all_at(buffer, position).await;
        (result, buffer)
    }

    /// `fdatasync` of the active segment, through the fault seam.
    async fn sync_active(&self) -> io::Result<()> {
        self.faults.check(FaultOp::Fsync)?;
        self.active_file.sync_data().await
    }

    /// After a write refused for lack of space at `op` on `path`: cuts whatever part of the record
    /// reached the active segment, fsyncs it, clears the poison and returns `StorageFull`; if the
    /// cut or the fsync fails, the journal is poisoned with that failure instead.
    async fn roll_back(
        &mut self,
        path: PathBuf,
        op: &'static str,
        error: io::Error,
    ) -> JournalError {
        if let Err(cut_error) = self.active_file.set_len(self.active_size_bytes).await {
            return self.poison(
                self.active_path.clone(),
                "truncate a refused record",
                cut_error,
            );
        }
        if let Err(sync_error) = self.sync_active().await {
            return self.poison(
                self.active_path.clone(),
                "fsync after truncating a refused record",
                sync_error,
            );
        }
        self.failure = None;
        let free_bytes = FreeBytes(free_bytes(&self.dir));
        tracing::warn!(
            path = %path.display(), op, %error, %free_bytes, last_op = self.last_op,
            "journal write refused for lack of space; rolled back, the journal accepts appends again"
        );
        JournalError::StorageFull {
            path,
            op,
            free_bytes,
            source: error,
        }
    }

    /// Closes the active segment and makes `{first_op:020}.wal` the new one.
    async fn roll(&mut self, first_op: u64) -> Result<(), JournalError> {
        if let Err(error) = self.sync_active().await {
            return Err(self.poison(self.active_path.clone(), "fsync segment before roll", error));
        }
        let path = segment_path(&self.dir, first_op);
        let file = match OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .await
        {
            Ok(file) => file,
            // Nothing was created: the active segment is as it was, and it was just fsynced.
            Err(error) if is_storage_full(&error) => {
                return Err(self.roll_back(path, "create segment", error).await);
            }
            Err(error) => return Err(self.poison(path, "create segment", error)),
        };
        if let Err(error) = sync_dir(&self.dir).await {
            return Err(self.poison(
                self.dir.clone(),
                "fsync journal directory after creating a segment",
                error,
            ));
        }
        let closed = std::mem::replace(&mut self.active_file, file);
        // The closed segment was fsynced above; a close error cannot lose its data.
        let _ = closed.close().await;
        tracing::debug!(
            closed = %self.active_path.display(),
            next = %path.display(),
            closed_size_bytes = self.active_size_bytes,
            "rolled journal segment"
        );
        self.active_path = path;
        self.active_size_bytes = 0;
        self.segment_first_ops.push(first_op);
        Ok(())
    }

    /// Deletes, oldest first, every segment whose ops are all below `op` (the checkpoint op),
    /// fsyncing the directory after each deletion; returns how many were deleted. Never deletes
    /// the active (last) segment, nor any segment holding `op` or a later op. Deleting oldest
    /// first with a directory fsync after each means a crash leaves a contiguous run of
    /// segments: some old segments may survive, which open accepts (their ops are contiguous)
    /// and the caller's replay skips (ops `<= checkpoint_op`).
    ///
    /// # Errors
    /// - `Io`: a deletion or directory fsync failed; the journal is poisoned (a later release
    ///   could otherwise make a later deletion durable while an earlier one is not, leaving an
    ///   op gap after a crash).
    /// - `Poisoned`: an earlier append or release failed or was cancelled.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped release poisons the journal; the files stay a contiguous run.
    pub async fn release_below(&mut self, op: u64) -> Result<usize, JournalError> {
        self.check_not_poisoned()?;
        let mut deleted_count = 0;
        // Segment 0 holds ops segment_first_ops[0] .. segment_first_ops[1] - 1.
        while self.segment_first_ops.len() > 1 && self.segment_first_ops[1] <= op {
            let path = segment_path(&self.dir, self.segment_first_ops[0]);
            self.failure = Some(Failure {
                path: path.clone(),
                op: "release",
                reason: "the release was cancelled before it completed".to_owned(),
            });
            if let Err(error) = compio::fs::remove_file(&path).await {
                return Err(self.poison(path, "delete released segment", error));
            }
            self.segment_first_ops.remove(0);
            self.index = self.index.split_off(&self.segment_first_ops[0]);
            if let Err(error) = sync_dir(&self.dir).await {
                return Err(self.poison(
                    self.dir.clone(),
                    "fsync journal directory after deleting a segment",
                    error,
                ));
            }
            self.failure = None;
            deleted_count += 1;
        }
        Ok(deleted_count)
    }

    /// Records `error` as the failure that poisons the journal and returns it as `Io`.
    fn poison(&mut self, path: PathBuf, op: &'static str, error: io::Error) -> JournalError {
        self.failure = Some(Failure {
            path: path.clone(),
            op,
            reason: error.to_string(),
        });
        JournalError::Io {
            path,
            op,
            source: error,
        }
    }
}

/// Logs a journal record that no longer verifies when read by op.
fn warn_unreadable(path: &Path, position: u64, op: u64, reason: &str) {
    tracing::warn!(
        path = %path.display(), position, op, %reason,
        "journal record does not verify on read; reading it as missing (repair it from peers)"
    );
}
