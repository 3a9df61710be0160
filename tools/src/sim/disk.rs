//! One replica's simulated disk. It holds the real on-disk encodings: journal records as bytes
//! (`JournalHeader::for_prepare(..).encode()` + body, read back with `parse_record`), the
//! superblock's redundant copies (`superblock::encode_copy` / `decode_copy`, the highest valid
//! sequence wins as in `storage::superblock`), and the snapshot file (`snapshot::encode_payload`
//! inside `storage::snapshot::encode` plus its XXH3-64 trailer). So a torn write or a flipped bit
//! is met by the same decoders a real boot uses.
//!
//! I/O is one FIFO queue per disk: each action completes a random number of ticks after it was
//! submitted, never before the one submitted before it. A crash loses everything still queued;
//! with the torn-write probability the write in progress lands partly (a prefix of a journal
//! record; one superblock copy half old, half new; a checkpoint stopped between its steps).
//! Latent corruption flips one bit of a durable journal record, seen at the next read or restart.
//!
//! A checkpoint releases the journal in whole segments of `journal_segment_ops` records (issue 9
//! section 0): every segment whose ops all lie `journal_retain_ops` or more below the checkpoint
//! op. An install of a transferred checkpoint (`Action::InstallCheckpoint`, DESIGN section 10)
//! replaces the snapshot (atomic rename), then writes the superblock pairing, then restarts the
//! journal empty above the checkpoint; its snapshot write may fail (`InstallFailed`, nothing
//! changed) and its pairing write may fail after the snapshot is in place (a degraded install).
//!
//! It never decides anything the consensus core decides; it only reports what the disk holds.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use shards::metadata::MetadataState;
use shards::vsr::client_table::ClientTableSnapshot;
use shards::vsr::message::{Action, Completion};
use shards::vsr::replica::Recovered;
use shards::vsr::snapshot::{SnapshotPayload, encode_payload};
use storage::journal::{JournalHeader, Prepare, parse_record};
use storage::limits::SUPERBLOCK_COPY_COUNT;
use storage::superblock::{SuperblockState, decode_copy, encode_copy, regression};

use super::prng::Prng;

/// Ops a checkpoint keeps in the journal below its op. A real journal releases whole segments, so
/// peers can still repair a replica that lags behind a checkpoint; a replica whose gap is below
/// every peer's journal needs state transfer, which is the next issue's, so the simulator keeps
/// enough for its runs (a few hundred ops) never to need it.
pub const JOURNAL_RETAIN_OPS: u64 = 4096;

/// The disk's fault probabilities, latency and journal retention.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskFaults {
    /// Ops a checkpoint keeps in the journal below its op ([`JOURNAL_RETAIN_OPS`] by default).
    pub journal_retain_ops: u64,
    /// Records per journal segment, at least 1: the journal is released in whole segments
    /// (segment `k` holds ops `k * journal_segment_ops + 1 ..= (k + 1) * journal_segment_ops`).
    pub journal_segment_ops: u64,
    /// Probability that one write of a checkpoint install fails (drawn for the snapshot write,
    /// then for the superblock pairing write).
    pub install_write_fail: f64,
    /// Probability that a crash tears the write in progress instead of losing it whole.
    pub torn_write: f64,
    /// Fewest ticks an I/O takes.
    pub io_delay_ticks_min: u64,
    /// Most ticks an I/O takes.
    pub io_delay_ticks_max: u64,
}

/// An I/O waiting in the disk's queue.
#[derive(Debug, Clone)]
enum Pending {
    Journal {
        op: u64,
        checksum: u128,
        record: Vec<u8>,
    },
    Truncate {
        op: u64,
    },
    Read {
        op: u64,
    },
    Superblock {
        view: u32,
        log_view: u32,
        commit_max: u64,
    },
    Checkpoint {
        op: u64,
        snapshot_file: Vec<u8>,
        snapshot_checksum: u64,
    },
    Install {
        op: u64,
        snapshot_file: Vec<u8>,
        snapshot_checksum: u64,
        /// The snapshot write fails (drawn at submit).
        snapshot_fails: bool,
        /// The superblock pairing write fails after the snapshot is in place (drawn at submit).
        pairing_fails: bool,
    },
}

/// What a crash did to the write in progress (for the trace).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CrashDamage {
    /// Queued I/Os lost.
    pub lost_count: usize,
    /// The torn write, described, if one tore.
    pub torn: Option<String>,
}

/// A rule the core broke in what it asked the disk to do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskViolation {
    pub rule: &'static str,
    pub detail: String,
}

/// One replica's disk.
#[derive(Debug)]
pub struct Disk {
    faults: DiskFaults,
    /// Journal records by op (bytes as written; a torn or corrupt one does not parse).
    journal: BTreeMap<u64, Vec<u8>>,
    /// Records below this op are released.
    journal_first_op: u64,
    superblock_copies: Vec<Vec<u8>>,
    /// The state of the highest valid copy.
    superblock: SuperblockState,
    snapshot_file: Vec<u8>,
    queue: VecDeque<(u64, Pending)>,
    /// Ops whose durable record is torn or corrupt (the replica counts as faulty while any is).
    damaged: BTreeSet<u64>,
}

/// A complete snapshot file: `storage::snapshot::encode` plus the XXH3-64 trailer a durable
/// replace appends; returns the file and its checksum.
fn snapshot_file(
    op: u64,
    metadata: &MetadataState,
    client_table: &ClientTableSnapshot,
) -> (Vec<u8>, u64) {
    let payload = encode_payload(op, metadata, client_table);
    let mut file = storage::snapshot::encode(op, &payload);
    let checksum = twox_hash::XxHash3_64::oneshot(&file);
    file.extend_from_slice(&checksum.to_le_bytes());
    (file, checksum)
}

/// `new` written over `old` up to byte `length` (a torn write).
fn torn(old: &[u8], new: &[u8], length: usize) -> Vec<u8> {
    let mut bytes = new[..length].to_vec();
    if old.len() > length {
        bytes.extend_from_slice(&old[length..]);
    }
    bytes
}

impl Disk {
    /// A freshly formatted disk: superblock at sequence 1 in view 0, an empty snapshot at op 0,
    /// an empty journal.
    pub fn format(cluster: u128, replica: u8, replica_count: u8, faults: DiskFaults) -> Disk {
        let (snapshot_file, snapshot_checksum) = snapshot_file(
            0,
            &MetadataState::new(),
            &ClientTableSnapshot {
                sessions: Vec::new(),
            },
        );
        let superblock = SuperblockState {
            sequence: 1,
            cluster,
            replica_id: replica,
            replica_count,
            view: 0,
            log_view: 0,
            commit_max: 0,
            checkpoint_op: 0,
            snapshot_checksum,
        };
        Disk {
            faults,
            journal: BTreeMap::new(),
            journal_first_op: 1,
            superblock_copies: (0..SUPERBLOCK_COPY_COUNT)
                .map(|copy_index| encode_copy(&superblock, copy_index))
                .collect(),
            superblock,
            snapshot_file,
            queue: VecDeque::new(),
            damaged: BTreeSet::new(),
        }
    }

    pub fn faults(&self) -> DiskFaults {
        self.faults
    }

    pub fn set_faults(&mut self, faults: DiskFaults) {
        self.faults = faults;
    }

    /// Queues the I/O of `action` at tick `now`; returns false for an action that is not I/O.
    pub fn submit(&mut self, prng: &mut Prng, now: u64, action: &Action) -> bool {
        let pending = match action {
            Action::WriteJournal { prepare } => {
                let header = JournalHeader::for_prepare(prepare);
                let mut record = header.encode().to_vec();
                record.extend_from_slice(&prepare.body);
                Pending::Journal {
                    op: prepare.op,
                    checksum: header.checksum,
                    record,
                }
            }
            Action::TruncateJournal { op } => Pending::Truncate { op: *op },
            Action::ReadJournal { op } => Pending::Read { op: *op },
            Action::WriteSuperblock {
                view,
                log_view,
                commit_max,
            } => Pending::Superblock {
                view: *view,
                log_view: *log_view,
                commit_max: *commit_max,
            },
            Action::InstallCheckpoint {
                checkpoint_op,
                metadata,
                client_table,
            } => {
                let (snapshot_file, snapshot_checksum) =
                    snapshot_file(*checkpoint_op, metadata, client_table);
                let snapshot_fails = prng.chance(self.faults.install_write_fail);
                let pairing_fails = !snapshot_fails && prng.chance(self.faults.install_write_fail);
                Pending::Install {
                    op: *checkpoint_op,
                    snapshot_file,
                    snapshot_checksum,
                    snapshot_fails,
                    pairing_fails,
                }
            }
            Action::Checkpoint {
                op,
                metadata,
                client_table,
            } => {
                let (snapshot_file, snapshot_checksum) = snapshot_file(*op, metadata, client_table);
                Pending::Checkpoint {
                    op: *op,
                    snapshot_file,
                    snapshot_checksum,
                }
            }
            Action::Send { .. } | Action::Apply { .. } | Action::Reply { .. } => return false,
        };
        let delay = prng.range_inclusive(
            self.faults.io_delay_ticks_min,
            self.faults.io_delay_ticks_max,
        );
        let after_previous = self.queue.back().map_or(0, |&(tick, _)| tick);
        self.queue
            .push_back(((now + delay).max(after_previous), pending));
        true
    }

    /// Completes every queued I/O due at or before `now`, in order.
    ///
    /// # Errors
    /// A [`DiskViolation`] when the core asked for a superblock or checkpoint that goes back
    /// (VSR Revisited sections 4.2-4.3: never back in view, never below what was promised).
    pub fn complete_due(&mut self, now: u64) -> Result<Vec<Completion>, DiskViolation> {
        let mut completions = Vec::new();
        while self.queue.front().is_some_and(|&(tick, _)| tick <= now) {
            let (_, pending) = self.queue.pop_front().expect("front exists");
            completions.push(self.perform(pending)?);
        }
        Ok(completions)
    }

    fn perform(&mut self, pending: Pending) -> Result<Completion, DiskViolation> {
        Ok(match pending {
            Pending::Journal {
                op,
                checksum,
                record,
            } => {
                self.journal.insert(op, record);
                self.damaged.remove(&op);
                Completion::JournalWritten { op, checksum }
            }
            Pending::Truncate { op } => {
                self.journal.split_off(&(op + 1));
                self.damaged.split_off(&(op + 1));
                Completion::JournalTruncated { op }
            }
            Pending::Read { op } => Completion::JournalRead {
                op,
                prepare: self.read_prepare(op),
            },
            Pending::Superblock {
                view,
                log_view,
                commit_max,
            } => {
                let next = SuperblockState {
                    view,
                    log_view,
                    commit_max,
                    ..self.superblock
                };
                self.write_superblock(next, "superblock-monotonic")?;
                Completion::SuperblockWritten { view, log_view }
            }
            Pending::Checkpoint {
                op,
                snapshot_file,
                snapshot_checksum,
            } => {
                self.snapshot_file = snapshot_file;
                let next = SuperblockState {
                    commit_max: self.superblock.commit_max.max(op),
                    checkpoint_op: op,
                    snapshot_checksum,
                    ..self.superblock
                };
                self.write_superblock(next, "checkpoint-monotonic")?;
                let journal_first_op = self.journal_first_op.max(self.release_floor(op));
                self.release_below(journal_first_op);
                Completion::CheckpointDone {
                    op,
                    journal_first_op,
                }
            }
            Pending::Install {
                op,
                snapshot_file,
                snapshot_checksum,
                snapshot_fails,
                pairing_fails,
            } => self.install(
                op,
                snapshot_file,
                snapshot_checksum,
                snapshot_fails,
                pairing_fails,
            )?,
        })
    }

    /// The first op a checkpoint at `op` keeps: the start of the segment holding
    /// `op + 1 - journal_retain_ops` (whole segments only are released; issue 9 section 0).
    fn release_floor(&self, op: u64) -> u64 {
        let keep_from = (op + 1)
            .saturating_sub(self.faults.journal_retain_ops)
            .max(1);
        let segment = self.faults.journal_segment_ops.max(1);
        (keep_from - 1) / segment * segment + 1
    }

    /// A checkpoint install (DESIGN section 10): the snapshot by durable replace, then the
    /// superblock pairing (`commit_max` at least `op`), then the journal restarted empty with
    /// its next op `op + 1`. A failed snapshot write changes nothing (`InstallFailed`); a failed
    /// pairing write after it leaves the snapshot newer than its pairing, which boot accepts
    /// (`CheckpointInstalled { degraded: true }`).
    ///
    /// # Errors
    /// `install-monotonic`: the install would put the snapshot below the one on disk.
    fn install(
        &mut self,
        op: u64,
        snapshot_file: Vec<u8>,
        snapshot_checksum: u64,
        snapshot_fails: bool,
        pairing_fails: bool,
    ) -> Result<Completion, DiskViolation> {
        let current = self.snapshot_op();
        if op < current {
            return Err(DiskViolation {
                rule: "install-monotonic",
                detail: format!("install of checkpoint {op} over the snapshot at {current}"),
            });
        }
        if snapshot_fails {
            return Ok(Completion::InstallFailed {
                checkpoint_op: op,
                reason: format!("simulated: the snapshot write of checkpoint {op} failed"),
            });
        }
        self.snapshot_file = snapshot_file;
        if !pairing_fails {
            let next = SuperblockState {
                commit_max: self.superblock.commit_max.max(op),
                checkpoint_op: op,
                snapshot_checksum,
                ..self.superblock
            };
            self.write_superblock(next, "install-monotonic")?;
        }
        self.restart_journal(op);
        Ok(Completion::CheckpointInstalled {
            checkpoint_op: op,
            degraded: pairing_fails,
        })
    }

    /// The journal restarted empty above `op` (every record dropped, the stale suffix too).
    fn restart_journal(&mut self, op: u64) {
        self.journal.clear();
        self.damaged.clear();
        self.journal_first_op = op + 1;
    }

    /// The op of the snapshot file on disk (0 if it does not decode).
    pub fn snapshot_op(&self) -> u64 {
        storage::snapshot::decode(&self.snapshot_file).map_or(0, |snapshot| snapshot.checkpoint_op)
    }

    /// The checkpoint the snapshot file holds, read and verified as a server reads it to build an
    /// offer: `(checkpoint_op, metadata, client table)`.
    ///
    /// # Errors
    /// A sentence naming what does not decode.
    pub fn read_checkpoint(
        &self,
        clients_max: usize,
    ) -> Result<(u64, MetadataState, ClientTableSnapshot), String> {
        let snapshot = storage::snapshot::decode(&self.snapshot_file)
            .map_err(|defect| format!("snapshot: {defect}"))?;
        let restored =
            SnapshotPayload::decode(&snapshot.payload, snapshot.checkpoint_op, clients_max)
                .map_err(|reason| format!("snapshot payload: {reason}"))?;
        Ok((
            snapshot.checkpoint_op,
            restored.metadata,
            restored.client_table.to_snapshot(),
        ))
    }

    fn release_below(&mut self, journal_first_op: u64) {
        self.journal_first_op = journal_first_op;
        self.journal = self.journal.split_off(&journal_first_op);
        self.damaged = self.damaged.split_off(&journal_first_op);
    }

    /// Writes every superblock copy with `next` at the next sequence, refusing a regression.
    fn write_superblock(
        &mut self,
        next: SuperblockState,
        rule: &'static str,
    ) -> Result<(), DiskViolation> {
        let next = SuperblockState {
            sequence: self.superblock.sequence + 1,
            ..next
        };
        if let Some(what) = regression(&self.superblock, &next) {
            return Err(DiskViolation {
                rule,
                detail: format!("{what}: {:?} -> {next:?}", self.superblock),
            });
        }
        if next.log_view > next.view {
            return Err(DiskViolation {
                rule,
                detail: format!("log_view {} above view {}", next.log_view, next.view),
            });
        }
        self.superblock_copies = (0..SUPERBLOCK_COPY_COUNT)
            .map(|copy_index| encode_copy(&next, copy_index))
            .collect();
        self.superblock = next;
        Ok(())
    }

    /// The valid prepare at `op`, `None` if the journal does not hold one (released, never
    /// written, torn or corrupt).
    fn read_prepare(&self, op: u64) -> Option<Prepare> {
        let bytes = self.journal.get(&op)?;
        let (header, body) = parse_record(bytes).ok()?;
        (header.op == op).then(|| Prepare {
            op,
            view: header.view,
            commit: header.commit,
            body: body.to_vec(),
        })
    }

    /// The crash: every queued I/O is lost; with the torn-write probability the first one (the
    /// write in progress) lands in part.
    pub fn crash(&mut self, prng: &mut Prng) -> CrashDamage {
        let lost_count = self.queue.len();
        let in_progress = self.queue.pop_front();
        self.queue.clear();
        let torn = match in_progress {
            Some((_, pending)) if prng.chance(self.faults.torn_write) => self.tear(prng, pending),
            _ => None,
        };
        CrashDamage { lost_count, torn }
    }

    fn tear(&mut self, prng: &mut Prng, pending: Pending) -> Option<String> {
        match pending {
            Pending::Journal { op, record, .. } => {
                let length = prng.range_inclusive(1, record.len() as u64 - 1) as usize;
                let old = self.journal.get(&op).cloned().unwrap_or_default();
                self.journal.insert(op, torn(&old, &record, length));
                self.damaged.insert(op);
                Some(format!("journal record op {op} torn at byte {length}"))
            }
            Pending::Superblock {
                view,
                log_view,
                commit_max,
            } => {
                let next = SuperblockState {
                    sequence: self.superblock.sequence + 1,
                    view,
                    log_view,
                    commit_max,
                    ..self.superblock
                };
                Some(self.tear_superblock(prng, &next))
            }
            Pending::Checkpoint {
                op,
                snapshot_file,
                snapshot_checksum,
            } => {
                // The snapshot is replaced by rename (atomic); the crash stops the checkpoint
                // after it, inside the superblock write.
                self.snapshot_file = snapshot_file;
                let next = SuperblockState {
                    sequence: self.superblock.sequence + 1,
                    commit_max: self.superblock.commit_max.max(op),
                    checkpoint_op: op,
                    snapshot_checksum,
                    ..self.superblock
                };
                let torn = self.tear_superblock(prng, &next);
                Some(format!("checkpoint op {op}: snapshot renamed, {torn}"))
            }
            Pending::Install {
                op,
                snapshot_file,
                snapshot_checksum,
                snapshot_fails,
                ..
            } => (!snapshot_fails)
                .then(|| self.tear_install(prng, op, snapshot_file, snapshot_checksum)),
            Pending::Truncate { .. } | Pending::Read { .. } => None,
        }
    }

    /// A crash inside an install, at one of its steps: before the snapshot rename (nothing
    /// changed), inside the superblock pairing write (snapshot renamed, one copy torn), or
    /// before the journal restart (snapshot and pairing in place). Once the snapshot is renamed
    /// the install marker beside it makes boot restart the journal after `op` (FORMAT.md,
    /// install order). Each boots to the old or the new checkpoint.
    fn tear_install(
        &mut self,
        prng: &mut Prng,
        op: u64,
        snapshot_file: Vec<u8>,
        snapshot_checksum: u64,
    ) -> String {
        let step = prng.below(3);
        if step == 0 || op < self.snapshot_op() {
            return format!("install op {op}: stopped before the snapshot rename");
        }
        self.snapshot_file = snapshot_file;
        // The install marker (`store::install`, written before the snapshot) names this op, so
        // the next boot restarts the journal after it whatever the journal holds (the old
        // suffix above `op` is never replayed): the model does that restart here, at the
        // crash, which nothing can observe before the boot.
        self.restart_journal(op);
        let next = SuperblockState {
            sequence: self.superblock.sequence + 1,
            commit_max: self.superblock.commit_max.max(op),
            checkpoint_op: op,
            snapshot_checksum,
            ..self.superblock
        };
        if step == 1 {
            let torn = self.tear_superblock(prng, &next);
            return format!("install op {op}: snapshot renamed, {torn}");
        }
        self.superblock_copies = (0..SUPERBLOCK_COPY_COUNT)
            .map(|copy_index| encode_copy(&next, copy_index))
            .collect();
        self.superblock = next;
        format!("install op {op}: snapshot and pairing written, journal restarted by boot")
    }

    /// Copies are written 0, 1, 2, 3 in turn (`Superblock::write`): those before the torn one
    /// hold `next`, the torn one is half new, those after are old.
    fn tear_superblock(&mut self, prng: &mut Prng, next: &SuperblockState) -> String {
        if regression(&self.superblock, next).is_some() || next.log_view > next.view {
            // The violation is reported when such a write completes; a crash before that just
            // loses it.
            return "superblock write lost".to_owned();
        }
        let torn_index = prng.below(SUPERBLOCK_COPY_COUNT as u64) as usize;
        for copy_index in 0..torn_index {
            self.superblock_copies[copy_index] = encode_copy(next, copy_index);
        }
        let new = encode_copy(next, torn_index);
        let length = prng.range_inclusive(1, 127) as usize;
        self.superblock_copies[torn_index] =
            torn(&self.superblock_copies[torn_index], &new, length);
        self.superblock = self
            .read_superblock()
            .expect("an untorn copy remains valid");
        format!("superblock copy {torn_index} torn at byte {length}")
    }

    /// The highest-sequence valid copy, as `Superblock::open` picks it; `None` if none is valid.
    fn read_superblock(&self) -> Option<SuperblockState> {
        self.superblock_copies
            .iter()
            .enumerate()
            .filter_map(|(copy_index, bytes)| decode_copy(bytes, copy_index).ok())
            .max_by_key(|state| state.sequence)
    }

    /// Flips one random bit of a random durable journal record (a latent sector error); returns
    /// its op, or `None` if the journal holds no record.
    pub fn corrupt_record(&mut self, prng: &mut Prng) -> Option<u64> {
        if self.journal.is_empty() {
            return None;
        }
        let index = prng.below(self.journal.len() as u64) as usize;
        let (&op, bytes) = self.journal.iter_mut().nth(index).expect("index in range");
        let bit = prng.below(bytes.len() as u64 * 8) as usize;
        bytes[bit / 8] ^= 1 << (bit % 8);
        self.damaged.insert(op);
        Some(op)
    }

    /// Whether some durable journal record is torn or corrupt.
    pub fn is_damaged(&self) -> bool {
        !self.damaged.is_empty()
    }

    /// I/Os queued and not yet complete.
    pub fn queued_count(&self) -> usize {
        self.queue.len()
    }

    /// What boot recovery finds on this disk: the superblock (highest valid sequence), the
    /// snapshot (which may be newer than the superblock's pairing: a crash between the rename
    /// and the superblock write, as `vsr::boot` accepts), and the journal's valid contiguous
    /// prepares above the snapshot.
    ///
    /// # Errors
    /// A sentence naming what does not recover: no valid superblock copy, a snapshot that does
    /// not decode, or one older than the pairing.
    pub fn recover(&self, clients_max: usize) -> Result<Recovered, String> {
        assert!(
            self.queue.is_empty(),
            "recover after a crash, with no I/O queued"
        );
        let superblock = self
            .read_superblock()
            .ok_or("no superblock copy is valid")?;
        let snapshot = storage::snapshot::decode(&self.snapshot_file)
            .map_err(|defect| format!("snapshot: {defect}"))?;
        let pairing_broken = snapshot.checkpoint_op < superblock.checkpoint_op
            || (snapshot.checkpoint_op == superblock.checkpoint_op
                && snapshot.checksum != superblock.snapshot_checksum);
        if pairing_broken {
            return Err(format!(
                "snapshot at op {} (checksum {:#018x}) breaks the pairing ({}, {:#018x})",
                snapshot.checkpoint_op,
                snapshot.checksum,
                superblock.checkpoint_op,
                superblock.snapshot_checksum
            ));
        }
        let checkpoint_op = snapshot.checkpoint_op;
        let restored = SnapshotPayload::decode(&snapshot.payload, checkpoint_op, clients_max)
            .map_err(|reason| format!("snapshot payload: {reason}"))?;
        let prepares: Vec<Prepare> = (checkpoint_op + 1..)
            .map_while(|op| self.read_prepare(op))
            .collect();
        let journal_last_op = self
            .journal
            .last_key_value()
            .map_or(0, |(&op, _)| op)
            .max(self.journal_first_op - 1);
        Ok(Recovered {
            view: superblock.view,
            log_view: superblock.log_view,
            commit_max: superblock.commit_max.max(checkpoint_op),
            checkpoint_op,
            metadata: restored.metadata,
            client_table: restored.client_table,
            prepares,
            journal_last_op,
            journal_first_op: self.journal_first_op,
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use shards::metadata::MetadataOp;
    use shards::vsr::client_table::ClientTable;
    use shards::vsr::prepare::{PrepareBody, PrepareOperation};

    use super::*;

    const FAULTS: DiskFaults = DiskFaults {
        journal_retain_ops: 64,
        journal_segment_ops: 1,
        install_write_fail: 0.0,
        torn_write: 0.0,
        io_delay_ticks_min: 1,
        io_delay_ticks_max: 3,
    };

    /// The checkpoint action a core emits at `op` with this state.
    fn checkpoint_action(op: u64, metadata: MetadataState) -> Action {
        Action::Checkpoint {
            op,
            metadata: Arc::new(metadata),
            client_table: ClientTable::new(4).to_snapshot(),
        }
    }

    fn prepare(op: u64, parent: u128) -> Prepare {
        let body = PrepareBody::new(
            7,
            op,
            PrepareOperation::Metadata(MetadataOp::CreateStream {
                stream_id: op as u32,
                name: format!("s{op}"),
            }),
            op * 10,
            parent,
        );
        Prepare {
            op,
            view: 0,
            commit: op - 1,
            body: body.encode(),
        }
    }

    fn write_chain(disk: &mut Disk, prng: &mut Prng, ops: std::ops::RangeInclusive<u64>) {
        let mut parent = 0;
        for op in ops {
            let prepare = prepare(op, parent);
            parent = JournalHeader::for_prepare(&prepare).checksum;
            assert!(disk.submit(prng, 0, &Action::WriteJournal { prepare }));
        }
    }

    #[test]
    fn writes_complete_in_order_after_a_delay_and_recover() {
        let mut prng = Prng::new(1);
        let mut disk = Disk::format(9, 1, 3, FAULTS);
        write_chain(&mut disk, &mut prng, 1..=3);
        assert!(disk.complete_due(0).unwrap().is_empty());
        let completions: Vec<Completion> = (1..=20)
            .flat_map(|t| disk.complete_due(t).unwrap())
            .collect();
        let ops: Vec<u64> = completions
            .iter()
            .map(|c| match c {
                Completion::JournalWritten { op, checksum } => {
                    assert_eq!(
                        *checksum,
                        JournalHeader::for_prepare(&prepare_at(&disk, *op)).checksum
                    );
                    *op
                }
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(ops, [1, 2, 3]);
        let recovered = disk.recover(16).unwrap();
        assert_eq!(recovered.prepares.len(), 3);
        assert_eq!(
            (recovered.journal_first_op, recovered.journal_last_op),
            (1, 3)
        );
        assert_eq!((recovered.view, recovered.checkpoint_op), (0, 0));
    }

    fn prepare_at(disk: &Disk, op: u64) -> Prepare {
        disk.read_prepare(op).expect("valid record")
    }

    #[test]
    fn a_crash_loses_queued_writes_and_may_tear_the_one_in_progress() {
        let mut prng = Prng::new(2);
        let mut disk = Disk::format(9, 0, 3, FAULTS);
        write_chain(&mut disk, &mut prng, 1..=2);
        disk.complete_due(100).unwrap();
        let third = prepare(
            3,
            JournalHeader::for_prepare(&prepare_at(&disk, 2)).checksum,
        );
        disk.submit(
            &mut prng,
            100,
            &Action::WriteJournal {
                prepare: third.clone(),
            },
        );
        disk.submit(
            &mut prng,
            100,
            &Action::WriteJournal {
                prepare: prepare(4, 0),
            },
        );
        let damage = disk.crash(&mut prng);
        assert_eq!(
            damage,
            CrashDamage {
                lost_count: 2,
                torn: None
            }
        );
        assert_eq!(disk.recover(16).unwrap().journal_last_op, 2);

        disk.set_faults(DiskFaults {
            torn_write: 1.0,
            ..FAULTS
        });
        disk.submit(&mut prng, 100, &Action::WriteJournal { prepare: third });
        let damage = disk.crash(&mut prng);
        assert!(damage.torn.unwrap().starts_with("journal record op 3 torn"));
        assert!(disk.is_damaged());
        let recovered = disk.recover(16).unwrap();
        // The torn record is not a valid prepare, but the journal reaches op 3.
        assert_eq!(recovered.prepares.len(), 2);
        assert_eq!(recovered.journal_last_op, 3);
        // Rewriting it (repair) heals the disk.
        disk.submit(
            &mut prng,
            200,
            &Action::WriteJournal {
                prepare: prepare(3, 0),
            },
        );
        disk.complete_due(300).unwrap();
        assert!(!disk.is_damaged());
        assert_eq!(disk.recover(16).unwrap().prepares.len(), 3);
    }

    #[test]
    fn a_torn_superblock_copy_leaves_the_old_or_new_state() {
        for seed in 0..50 {
            let mut prng = Prng::new(seed);
            let mut disk = Disk::format(
                9,
                2,
                3,
                DiskFaults {
                    torn_write: 1.0,
                    ..FAULTS
                },
            );
            let write = Action::WriteSuperblock {
                view: 4,
                log_view: 3,
                commit_max: 0,
            };
            disk.submit(&mut prng, 0, &write);
            let damage = disk.crash(&mut prng);
            assert!(damage.torn.unwrap().contains("torn at byte"));
            let recovered = disk.recover(16).unwrap();
            assert!(
                (recovered.view, recovered.log_view) == (0, 0)
                    || (recovered.view, recovered.log_view) == (4, 3),
                "seed {seed}: {:?}",
                (recovered.view, recovered.log_view)
            );
        }
    }

    #[test]
    fn a_superblock_that_goes_back_in_view_is_a_violation() {
        let mut prng = Prng::new(3);
        let mut disk = Disk::format(9, 2, 3, FAULTS);
        disk.submit(
            &mut prng,
            0,
            &Action::WriteSuperblock {
                view: 4,
                log_view: 4,
                commit_max: 0,
            },
        );
        disk.submit(
            &mut prng,
            0,
            &Action::WriteSuperblock {
                view: 3,
                log_view: 3,
                commit_max: 0,
            },
        );
        let violation = disk.complete_due(100).unwrap_err();
        assert_eq!(violation.rule, "superblock-monotonic");
        assert!(
            violation.detail.starts_with("view decreased"),
            "{}",
            violation.detail
        );
    }

    #[test]
    fn latent_corruption_reads_as_missing_and_stops_recovery_there() {
        let mut prng = Prng::new(4);
        let mut disk = Disk::format(9, 0, 3, FAULTS);
        write_chain(&mut disk, &mut prng, 1..=1);
        disk.complete_due(100).unwrap();
        assert_eq!(disk.corrupt_record(&mut prng), Some(1));
        disk.submit(&mut prng, 100, &Action::ReadJournal { op: 1 });
        let completions = disk.complete_due(200).unwrap();
        assert_eq!(
            completions,
            [Completion::JournalRead {
                op: 1,
                prepare: None
            }]
        );
        let recovered = disk.recover(16).unwrap();
        assert!(recovered.prepares.is_empty());
        assert_eq!(recovered.journal_last_op, 1);
    }

    #[test]
    fn a_checkpoint_writes_the_snapshot_and_pairing_and_releases_the_journal() {
        let mut prng = Prng::new(5);
        let mut disk = Disk::format(9, 0, 3, FAULTS);
        let ops = 1..=FAULTS.journal_retain_ops + 10;
        write_chain(&mut disk, &mut prng, ops.clone());
        let mut metadata = MetadataState::new();
        let checkpoint_op = FAULTS.journal_retain_ops + 5;
        for op in 1..=checkpoint_op {
            metadata.apply(
                op,
                &MetadataOp::CreateStream {
                    stream_id: op as u32,
                    name: format!("s{op}"),
                },
            );
        }
        disk.submit(
            &mut prng,
            0,
            &checkpoint_action(checkpoint_op, metadata.clone()),
        );
        let completions = disk.complete_due(10_000).unwrap();
        assert_eq!(
            completions.last(),
            Some(&Completion::CheckpointDone {
                op: checkpoint_op,
                journal_first_op: 6
            })
        );
        let recovered = disk.recover(16).unwrap();
        assert_eq!(recovered.checkpoint_op, checkpoint_op);
        assert_eq!(recovered.commit_max, checkpoint_op);
        assert_eq!(recovered.metadata, metadata);
        assert_eq!(recovered.journal_first_op, 6);
        let above: Vec<u64> = recovered.prepares.iter().map(|p| p.op).collect();
        assert_eq!(above, (checkpoint_op + 1..=*ops.end()).collect::<Vec<_>>());

        // A crash inside the next checkpoint's superblock write: the snapshot is newer than the
        // pairing, which recovery accepts.
        disk.set_faults(DiskFaults {
            torn_write: 1.0,
            ..FAULTS
        });
        disk.submit(
            &mut prng,
            0,
            &checkpoint_action(checkpoint_op + 2, metadata),
        );
        assert!(
            disk.crash(&mut prng)
                .torn
                .unwrap()
                .contains("snapshot renamed")
        );
        let recovered = disk.recover(16).unwrap();
        assert_eq!(recovered.checkpoint_op, checkpoint_op + 2);
    }

    /// The state after applying `CreateStream` ops `1..=op` (a stand-in for a peer's checkpoint).
    fn metadata_at(op: u64) -> MetadataState {
        let mut metadata = MetadataState::new();
        for op in 1..=op {
            metadata.apply(
                op,
                &MetadataOp::CreateStream {
                    stream_id: op as u32,
                    name: format!("s{op}"),
                },
            );
        }
        metadata
    }

    fn install_action(op: u64) -> Action {
        Action::InstallCheckpoint {
            checkpoint_op: op,
            metadata: Arc::new(metadata_at(op)),
            client_table: ClientTable::new(4).to_snapshot(),
        }
    }

    #[test]
    fn issue9_journal_released_in_whole_segments_at_checkpoint() {
        let mut prng = Prng::new(6);
        let faults = DiskFaults {
            journal_retain_ops: 0,
            journal_segment_ops: 8,
            ..FAULTS
        };
        let mut disk = Disk::format(9, 0, 3, faults);
        write_chain(&mut disk, &mut prng, 1..=30);
        disk.submit(&mut prng, 0, &checkpoint_action(20, metadata_at(20)));
        let completions = disk.complete_due(10_000).unwrap();
        // Ops 1..=16 (two whole segments) go; 17..=20 stay with their segment.
        assert_eq!(
            completions.last(),
            Some(&Completion::CheckpointDone {
                op: 20,
                journal_first_op: 17
            })
        );
        assert_eq!(disk.read_prepare(16), None);
        assert!(disk.read_prepare(17).is_some());
        disk.submit(&mut prng, 0, &checkpoint_action(24, metadata_at(24)));
        let completions = disk.complete_due(20_000).unwrap();
        assert_eq!(
            completions.last(),
            Some(&Completion::CheckpointDone {
                op: 24,
                journal_first_op: 25
            })
        );
    }

    #[test]
    fn issue9_install_replaces_snapshot_pairing_and_restarts_journal() {
        let mut prng = Prng::new(7);
        let mut disk = Disk::format(9, 1, 3, FAULTS);
        write_chain(&mut disk, &mut prng, 1..=5);
        disk.submit(&mut prng, 0, &install_action(40));
        let completions = disk.complete_due(10_000).unwrap();
        assert_eq!(
            completions.last(),
            Some(&Completion::CheckpointInstalled {
                checkpoint_op: 40,
                degraded: false
            })
        );
        let recovered = disk.recover(16).unwrap();
        assert_eq!(recovered.checkpoint_op, 40);
        assert_eq!(recovered.commit_max, 40);
        assert_eq!(recovered.metadata, metadata_at(40));
        assert!(recovered.prepares.is_empty());
        assert_eq!(
            (recovered.journal_first_op, recovered.journal_last_op),
            (41, 40)
        );
        let (op, metadata, _) = disk.read_checkpoint(16).unwrap();
        assert_eq!((op, metadata), (40, metadata_at(40)));
    }

    #[test]
    fn issue9_install_snapshot_write_failure_changes_nothing() {
        let mut prng = Prng::new(8);
        let mut disk = Disk::format(
            9,
            1,
            3,
            DiskFaults {
                install_write_fail: 1.0,
                ..FAULTS
            },
        );
        write_chain(&mut disk, &mut prng, 1..=5);
        disk.complete_due(100).unwrap();
        disk.submit(&mut prng, 100, &install_action(40));
        let completions = disk.complete_due(10_000).unwrap();
        assert!(
            matches!(
                completions.last(),
                Some(Completion::InstallFailed {
                    checkpoint_op: 40,
                    ..
                })
            ),
            "{completions:?}"
        );
        let recovered = disk.recover(16).unwrap();
        assert_eq!((recovered.checkpoint_op, recovered.prepares.len()), (0, 5));
    }

    #[test]
    fn issue9_install_pairing_failure_is_a_degraded_success_that_boots() {
        // Seeds where the snapshot write succeeds and the pairing write fails.
        let mut seen = 0;
        for seed in 0..64 {
            let mut prng = Prng::new(seed);
            let mut disk = Disk::format(
                9,
                1,
                3,
                DiskFaults {
                    install_write_fail: 0.5,
                    ..FAULTS
                },
            );
            disk.submit(&mut prng, 0, &install_action(40));
            let completions = disk.complete_due(10_000).unwrap();
            if completions.last()
                != Some(&Completion::CheckpointInstalled {
                    checkpoint_op: 40,
                    degraded: true,
                })
            {
                continue;
            }
            seen += 1;
            assert_eq!(disk.read_superblock().unwrap().checkpoint_op, 0);
            let recovered = disk.recover(16).unwrap();
            assert_eq!((recovered.checkpoint_op, recovered.commit_max), (40, 40));
            assert_eq!(recovered.journal_first_op, 41);
        }
        assert!(seen > 0, "no seed of 64 drew a degraded install");
    }

    #[test]
    fn issue9_crash_mid_install_boots_to_the_old_or_the_new_checkpoint() {
        let mut steps = BTreeSet::new();
        for seed in 0..60 {
            let mut prng = Prng::new(seed);
            let mut disk = Disk::format(
                9,
                2,
                3,
                DiskFaults {
                    torn_write: 1.0,
                    ..FAULTS
                },
            );
            write_chain(&mut disk, &mut prng, 1..=3);
            disk.complete_due(100).unwrap();
            disk.submit(&mut prng, 100, &install_action(40));
            let torn = disk.crash(&mut prng).torn.expect("torn_write 1");
            steps.insert(if torn.contains("before the snapshot") {
                0
            } else if torn.contains("journal restarted by boot") {
                2
            } else {
                1
            });
            let recovered = disk.recover(16).unwrap();
            match recovered.checkpoint_op {
                0 => assert_eq!(recovered.prepares.len(), 3, "seed {seed}: {torn}"),
                40 => {
                    assert_eq!(recovered.metadata, metadata_at(40), "seed {seed}: {torn}");
                    assert!(
                        recovered.prepares.is_empty() && recovered.journal_first_op == 41,
                        "seed {seed}: the old journal is never replayed over the installed \
                         checkpoint ({torn})"
                    );
                }
                other => panic!("seed {seed}: booted to checkpoint {other} after {torn}"),
            }
        }
        assert!(steps.len() >= 3, "every install step torn: {steps:?}");
    }

    #[test]
    fn issue9_install_below_the_snapshot_on_disk_is_a_violation() {
        let mut prng = Prng::new(9);
        let mut disk = Disk::format(9, 1, 3, FAULTS);
        disk.submit(&mut prng, 0, &install_action(40));
        disk.submit(&mut prng, 0, &install_action(32));
        assert_eq!(
            disk.complete_due(10_000).unwrap_err().rule,
            "install-monotonic"
        );
    }
}
