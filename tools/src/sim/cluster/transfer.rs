//! State transfer in the simulated world (issue 9, DESIGN section 10): each replica's serving
//! side ([`OfferServer`]) fed the `RequestStateTransfer` / `RequestStateChunk` frames addressed
//! to it and the core's [`Replica::transfer_availability`], offers built from the replica's
//! simulated disk checkpoint after a read delay, chunk corruption in flight, the
//! lagging-replica scenario, and the counts of what transfers did and what interrupted them.
//!
//! The receiving side is the core's own (it answers `StateTransferTarget` / `StateChunk` and
//! asks for `Action::InstallCheckpoint`); the world only watches it through the messages it
//! sends and the completions it gets.

use shards::metadata::MetadataState;
use shards::vsr::client_table::ClientTableSnapshot;
use shards::vsr::message::{Completion, Message};
use shards::vsr::transfer::receiver::Stage;

use super::super::SimConfig;
use super::super::prng::Prng;
use super::{
    ActivePartition, Offer, PartitionKind, Payload, Replica, ServeOutput, TransferTarget,
    UnavailableReason, Violation, World, wire,
};

/// Ticks a server takes to read its checkpoint and build an offer, at least and at most.
const OFFER_BUILD_TICKS_MIN: u64 = 1;
const OFFER_BUILD_TICKS_MAX: u64 = 6;
/// `--transfer`'s lagging replica goes down at a tick in this range.
const LAG_START_TICK_MIN: u64 = 10;
const LAG_START_TICK_MAX: u64 = 80;
/// Checkpoint intervals the others commit while the lagging replica is down (plus one journal
/// segment): more than a peer keeps in memory (one to two intervals), so its journal release
/// leaves the lagging replica nothing to repair from.
const LAG_CHECKPOINT_INTERVALS: u64 = 3;

/// What state transfer did in one run (issue 9), counted by the world from what it routes and
/// performs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferStats {
    /// Transfers started: a replica's first `RequestStateTransfer` while none was under way.
    pub started: u64,
    /// Failed rounds, all causes (the receivers' own count, summed over every life of every
    /// replica).
    pub failed_rounds: u64,
    /// Times a receiver's retry budget ran out (it fell back to journal repair).
    pub budget_exhaustions: u64,
    /// `StateTransferTarget` refusals (`available = 0`) sent.
    pub refused: u64,
    /// `Completion::CheckpointInstalled`, degraded or not.
    pub installs: u64,
    pub degraded_installs: u64,
    /// `Completion::InstallFailed`.
    pub failed_installs: u64,
    /// Installs a crash tore (stopped at one of their steps).
    pub torn_installs: u64,
    /// Transfers whose receiver went back to idle without an install.
    pub abandoned: u64,
    pub chunks_corrupted: u64,
    pub offers_unreadable: u64,
    /// The replica serving a transfer crashed during it.
    pub interrupted_by_primary_crash: u64,
    /// The receiving replica crashed during its transfer.
    pub interrupted_by_receiver_crash: u64,
    /// A partition cut the receiver or its serving replica off during the transfer.
    pub interrupted_by_partition: u64,
    /// The receiver's view changed during its transfer.
    pub interrupted_by_view_change: u64,
    /// The serving replica completed a newer checkpoint during the transfer.
    pub interrupted_by_new_checkpoint: u64,
}

impl TransferStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &TransferStats) {
        self.started += other.started;
        self.failed_rounds += other.failed_rounds;
        self.budget_exhaustions += other.budget_exhaustions;
        self.refused += other.refused;
        self.installs += other.installs;
        self.degraded_installs += other.degraded_installs;
        self.failed_installs += other.failed_installs;
        self.torn_installs += other.torn_installs;
        self.abandoned += other.abandoned;
        self.chunks_corrupted += other.chunks_corrupted;
        self.offers_unreadable += other.offers_unreadable;
        self.interrupted_by_primary_crash += other.interrupted_by_primary_crash;
        self.interrupted_by_receiver_crash += other.interrupted_by_receiver_crash;
        self.interrupted_by_partition += other.interrupted_by_partition;
        self.interrupted_by_view_change += other.interrupted_by_view_change;
        self.interrupted_by_new_checkpoint += other.interrupted_by_new_checkpoint;
    }
}

impl std::fmt::Display for TransferStats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "started {} failed_rounds {} budget_exhausted {} refused {} installs {} degraded {} \
             install_failed {} install_torn {} abandoned {} chunks_corrupted {} unreadable {} \
             interrupted: primary_crash {} receiver_crash {} partition {} view_change {} \
             new_checkpoint {}",
            self.started,
            self.failed_rounds,
            self.budget_exhaustions,
            self.refused,
            self.installs,
            self.degraded_installs,
            self.failed_installs,
            self.torn_installs,
            self.abandoned,
            self.chunks_corrupted,
            self.offers_unreadable,
            self.interrupted_by_primary_crash,
            self.interrupted_by_receiver_crash,
            self.interrupted_by_partition,
            self.interrupted_by_view_change,
            self.interrupted_by_new_checkpoint
        )
    }
}

/// A transfer under way at a receiving replica, as the world sees it from the messages.
#[derive(Debug, Clone)]
pub(super) struct TransferWatch {
    pub(super) nonce: u64,
    /// The replica its last request went to.
    pub(super) source: usize,
    /// The receiver's view when the transfer started.
    pub(super) view: u32,
    /// The checkpoint the source offered, once a target arrived.
    pub(super) target_op: Option<u64>,
    /// Each interruption kind is counted once per transfer.
    pub(super) primary_crash_seen: bool,
    pub(super) partition_seen: bool,
    pub(super) view_change_seen: bool,
    pub(super) new_checkpoint_seen: bool,
}

/// The lagging-replica scenario's progress (`SimConfig::lagging_replica`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Lag {
    /// Not asked for, or over.
    Off,
    /// `replica` goes down at `tick`: crashed, or (`isolated`) cut off by a symmetric partition
    /// (the primary of that moment, half the time: it keeps taking requests into a stale
    /// journal suffix the cluster never commits).
    Pending {
        replica: usize,
        tick: u64,
        isolated: bool,
    },
    /// `replica` is down until the others committed past `until_commit`.
    Down {
        replica: usize,
        until_commit: u64,
        isolated: bool,
    },
}

impl Lag {
    /// The scenario of `config`: [`Lag::Off`] unless `config.lagging_replica`; else a random
    /// replica, start tick and way of falling behind.
    pub(super) fn new(config: &SimConfig, prng: &mut Prng) -> Lag {
        if !config.lagging_replica {
            return Lag::Off;
        }
        Lag::Pending {
            replica: prng.below(u64::from(config.replica_count)) as usize,
            tick: prng.range_inclusive(LAG_START_TICK_MIN, LAG_START_TICK_MAX),
            isolated: prng.chance(0.5),
        }
    }
}

/// XXH3-64 of the snapshot payload encoding of this state at commit point `op`: what
/// [`Replica::state_digest`] computes for a replica at `commit_min = op`.
pub(super) fn state_digest(
    op: u64,
    metadata: &MetadataState,
    client_table: &ClientTableSnapshot,
) -> u64 {
    let bytes = shards::vsr::snapshot::encode_payload(op, metadata, client_table);
    twox_hash::XxHash3_64::oneshot(&bytes)
}

impl World {
    /// Routes a transfer request from `from` to `replica`'s serving side, with the core's
    /// availability and view.
    pub(super) fn serve(&mut self, replica: usize, from: usize, message: Message) {
        let node = &mut self.nodes[replica];
        let core = node
            .core
            .as_ref()
            .expect("delivered to a replica that is up");
        let (availability, view) = (core.transfer_availability(), core.view());
        let outputs = match message {
            Message::RequestStateTransfer { nonce, .. } => {
                node.server
                    .on_request_transfer(from as u8, nonce, availability, view, self.tick)
            }
            Message::RequestStateChunk {
                nonce,
                artifact,
                offset,
                len,
                ..
            } => node
                .server
                .on_request_chunk(from as u8, nonce, artifact, offset, len, view, self.tick),
            other => unreachable!("not a transfer request: {other:?}"),
        };
        self.perform_serve(replica, outputs);
    }

    /// Performs what `replica`'s serving side asked: sends (a chunk maybe corrupted in flight)
    /// and offer builds (queued behind a simulated checkpoint read).
    fn perform_serve(&mut self, replica: usize, outputs: Vec<ServeOutput>) {
        for output in outputs {
            match output {
                ServeOutput::Send { to, mut message } => {
                    if let Message::StateTransferTarget {
                        target: TransferTarget::Unavailable { .. },
                        ..
                    } = message
                    {
                        self.transfers.refused += 1;
                    }
                    self.maybe_corrupt_chunk(replica, usize::from(to), &mut message);
                    let frame = wire::encode(self.config.cluster, replica as u8, &message);
                    self.send(replica, usize::from(to), Payload::Replica(frame));
                }
                ServeOutput::BuildOffer { checkpoint_op } => {
                    let delay = self
                        .prng
                        .range_inclusive(OFFER_BUILD_TICKS_MIN, OFFER_BUILD_TICKS_MAX);
                    self.trace.event(
                        self.tick,
                        &format!("r{replica} build_offer checkpoint {checkpoint_op}"),
                    );
                    self.nodes[replica]
                        .offer_builds
                        .push((self.tick + delay, checkpoint_op));
                }
            }
        }
    }

    /// With `chunk_corruption`, flips one byte of a `StateChunk` payload before it is encoded:
    /// the frame is valid, the artifact checksum is not.
    fn maybe_corrupt_chunk(&mut self, replica: usize, to: usize, message: &mut Message) {
        let Message::StateChunk {
            payload, offset, ..
        } = message
        else {
            return;
        };
        if payload.is_empty()
            || self.in_liveness_phase
            || !self.prng.chance(self.config.chunk_corruption)
        {
            return;
        }
        let index = self.prng.below(payload.len() as u64) as usize;
        payload[index] ^= 1 << self.prng.below(8);
        self.transfers.chunks_corrupted += 1;
        self.trace.event(
            self.tick,
            &format!("fault: r{replica}->r{to} state chunk @{offset} byte {index} flipped"),
        );
    }

    /// Hands every offer build of `replica` due now to its server: the checkpoint read from
    /// the simulated disk (unreadable with `offer_unreadable`, replaced if the disk holds
    /// another checkpoint by now) and built into an [`Offer`].
    pub(super) fn serve_due_offers(&mut self, replica: usize) {
        let now = self.tick;
        let (due, later): (Vec<_>, Vec<_>) = std::mem::take(&mut self.nodes[replica].offer_builds)
            .into_iter()
            .partition(|&(tick, _)| tick <= now);
        self.nodes[replica].offer_builds = later;
        for (_, checkpoint_op) in due {
            let result = self.read_offer(replica, checkpoint_op);
            self.trace.event(
                now,
                &format!(
                    "r{replica} offer_built checkpoint {checkpoint_op}: {}",
                    match &result {
                        Ok(_) => "ok".to_owned(),
                        Err(reason) => format!("unavailable ({reason})"),
                    }
                ),
            );
            let node = &mut self.nodes[replica];
            let view = node.core.as_ref().expect("up").view();
            let outputs = node.server.offer_built(checkpoint_op, result, view, now);
            self.perform_serve(replica, outputs);
        }
    }

    fn read_offer(
        &mut self,
        replica: usize,
        checkpoint_op: u64,
    ) -> Result<Offer, UnavailableReason> {
        if !self.in_liveness_phase && self.prng.chance(self.config.offer_unreadable) {
            self.transfers.offers_unreadable += 1;
            return Err(UnavailableReason::CheckpointUnreadable);
        }
        let (op, metadata, client_table) = self.nodes[replica]
            .disk
            .read_checkpoint(self.config.clients_table_max)
            .map_err(|_| UnavailableReason::CheckpointUnreadable)?;
        if op != checkpoint_op {
            return Err(UnavailableReason::CheckpointBeingReplaced);
        }
        Offer::build(op, &metadata, &client_table).map_err(|error| error.unavailable_reason())
    }

    /// `replica` sends `message` to `to`: a transfer request starts its watch (if none is under
    /// way) or moves it to the nonce and peer it names.
    pub(super) fn note_transfer_request(&mut self, replica: usize, to: usize, message: &Message) {
        let nonce = match message {
            Message::RequestStateTransfer { nonce, .. }
            | Message::RequestStateChunk { nonce, .. } => *nonce,
            _ => return,
        };
        let view = self.nodes[replica].core.as_ref().map_or(0, Replica::view);
        let tick = self.tick;
        match &mut self.nodes[replica].receiving {
            Some(watch) => {
                if watch.nonce != nonce {
                    watch.nonce = nonce;
                    watch.target_op = None;
                }
                watch.source = to;
            }
            slot @ None => {
                self.transfers.started += 1;
                self.trace
                    .event(tick, &format!("r{replica} transfer starts from r{to}"));
                *slot = Some(TransferWatch {
                    nonce,
                    source: to,
                    view,
                    target_op: None,
                    primary_crash_seen: false,
                    partition_seen: false,
                    view_change_seen: false,
                    new_checkpoint_seen: false,
                });
            }
        }
    }

    /// A `StateTransferTarget` offering a checkpoint reaches `replica`: its watch learns the op.
    pub(super) fn note_target(&mut self, replica: usize, message: &Message) {
        if let Message::StateTransferTarget {
            nonce,
            target: TransferTarget::Available { checkpoint_op, .. },
            ..
        } = message
            && let Some(watch) = self.nodes[replica].receiving.as_mut()
            && watch.nonce == *nonce
        {
            watch.target_op = Some(*checkpoint_op);
        }
    }

    /// Counts install outcomes, and a new checkpoint of a replica serving a transfer.
    pub(super) fn count_completion(&mut self, replica: usize, completion: &Completion) {
        match completion {
            Completion::CheckpointInstalled { degraded, .. } => {
                self.transfers.installs += 1;
                self.transfers.degraded_installs += u64::from(*degraded);
                self.nodes[replica].receiving = None;
            }
            Completion::InstallFailed { .. } => {
                self.transfers.failed_installs += 1;
                self.nodes[replica].receiving = None;
            }
            Completion::CheckpointDone { op, .. } => {
                for node in &mut self.nodes {
                    if let Some(watch) = node.receiving.as_mut()
                        && watch.source == replica
                        && watch.target_op.is_some_and(|target| *op > target)
                        && !watch.new_checkpoint_seen
                    {
                        watch.new_checkpoint_seen = true;
                        self.transfers.interrupted_by_new_checkpoint += 1;
                    }
                }
            }
            _ => {}
        }
    }

    /// After `CheckpointInstalled { checkpoint_op }` the core must have adopted the state: its
    /// commit_min is at least `checkpoint_op` (rule `install-adopted`).
    pub(super) fn check_adopted(
        &mut self,
        replica: usize,
        checkpoint_op: u64,
    ) -> Result<(), Violation> {
        let Some(core) = self.nodes[replica].core.as_ref() else {
            return Ok(());
        };
        if core.commit_min() < checkpoint_op {
            return Err(Violation {
                rule: "install-adopted",
                detail: format!(
                    "replica {replica} installed checkpoint {checkpoint_op} but its commit_min \
                     is {}",
                    core.commit_min()
                ),
            });
        }
        Ok(())
    }

    /// In the transfer scenario, half of the crashes while a transfer is under way are aimed at
    /// it: at a receiver that is installing (a crash mid-install), else at the replica serving
    /// the transfer (a crash of the serving primary mid-transfer); both are otherwise rare.
    /// `None`: pick at random as usual.
    pub(super) fn aimed_at_transfer(&mut self) -> Option<usize> {
        if !self.config.lagging_replica {
            return None;
        }
        let installing = self.nodes.iter().position(|node| {
            node.core
                .as_ref()
                .is_some_and(|core| core.transfer_stage() == Stage::Installing)
        });
        let target = installing.or_else(|| {
            self.nodes
                .iter()
                .find_map(|node| node.receiving.as_ref().map(|watch| watch.source))
        })?;
        self.prng.chance(0.5).then_some(target)
    }

    /// `replica` is about to crash: a transfer it serves or receives is interrupted.
    pub(super) fn count_crash_interruptions(&mut self, replica: usize) {
        self.retire_counters(replica);
        if self.nodes[replica].receiving.is_some() {
            self.transfers.interrupted_by_receiver_crash += 1;
        }
        for node in &mut self.nodes {
            if let Some(watch) = node.receiving.as_mut()
                && watch.source == replica
                && !watch.primary_crash_seen
            {
                watch.primary_crash_seen = true;
                self.transfers.interrupted_by_primary_crash += 1;
            }
        }
    }

    /// A partition isolating `isolated` starts: a transfer whose receiver or serving replica is
    /// on one side and the other on the other is interrupted.
    pub(super) fn count_partition_interruptions(&mut self, isolated: &[usize]) {
        for (replica, node) in self.nodes.iter_mut().enumerate() {
            if let Some(watch) = node.receiving.as_mut()
                && isolated.contains(&replica) != isolated.contains(&watch.source)
                && !watch.partition_seen
            {
                watch.partition_seen = true;
                self.transfers.interrupted_by_partition += 1;
            }
        }
    }

    /// Each tick: a receiver whose view moved during its transfer counts a view change; one
    /// whose receiver is back to idle without an install ends its transfer (abandoned).
    pub(super) fn watch_transfers(&mut self) {
        for replica in 0..self.nodes.len() {
            let node = &mut self.nodes[replica];
            let (Some(core), Some(watch)) = (node.core.as_ref(), node.receiving.as_mut()) else {
                continue;
            };
            if core.view() > watch.view && !watch.view_change_seen {
                watch.view_change_seen = true;
                self.transfers.interrupted_by_view_change += 1;
            }
            if core.transfer_stage() == Stage::Idle {
                node.receiving = None;
                self.transfers.abandoned += 1;
                self.trace
                    .event(self.tick, &format!("r{replica} transfer back to idle"));
            }
        }
    }

    /// Adds the receiver counters of `replica`'s core (about to be lost to a crash) to the
    /// run's totals.
    pub(super) fn retire_counters(&mut self, replica: usize) {
        if let Some(core) = self.nodes[replica].core.as_ref() {
            let counters = core.transfer_counters();
            self.transfers.failed_rounds += counters.failed_rounds;
            self.transfers.budget_exhaustions += counters.budget_exhaustions;
        }
    }

    /// What state transfer did in the run so far: the world's counts plus every live
    /// receiver's failed rounds and spent budgets.
    pub fn transfer_stats(&self) -> TransferStats {
        let mut stats = self.transfers;
        for core in self.nodes.iter().filter_map(|node| node.core.as_ref()) {
            let counters = core.transfer_counters();
            stats.failed_rounds += counters.failed_rounds;
            stats.budget_exhaustions += counters.budget_exhaustions;
        }
        stats
    }

    /// The lagging-replica scenario: at its tick the chosen replica crashes or is cut off
    /// (within the fault budget, else a tick later) and stays so until the others committed
    /// [`LAG_CHECKPOINT_INTERVALS`] checkpoint intervals and a journal segment more.
    pub(super) fn advance_lag(&mut self) {
        match self.lag {
            Lag::Off => {}
            Lag::Pending {
                replica,
                tick,
                isolated,
            } => self.start_lag(replica, tick, isolated),
            Lag::Down {
                replica,
                until_commit,
                isolated,
            } => {
                if self.checker.commit_max() < until_commit && !self.in_liveness_phase {
                    return;
                }
                self.trace
                    .event(self.tick, &format!("lagging replica r{replica}: back"));
                if isolated {
                    if let Some(partition) = self.partition.as_mut() {
                        partition.heal_tick = self.tick;
                    }
                } else if self.nodes[replica].core.is_none() {
                    self.nodes[replica].restart_tick = self.tick;
                }
                self.lag = Lag::Off;
            }
        }
    }

    fn start_lag(&mut self, replica: usize, tick: u64, isolated: bool) {
        let replica = if isolated && self.prng.chance(0.5) {
            self.nodes
                .iter()
                .position(|node| node.core.as_ref().is_some_and(Replica::is_primary))
                .unwrap_or(replica)
        } else {
            replica
        };
        if self.tick < tick
            || self.in_liveness_phase
            || self.nodes[replica].core.is_none()
            || (isolated && self.partition.is_some())
            || !self.within_budget(&[replica])
        {
            return;
        }
        let until_commit = self.checker.commit_max()
            + LAG_CHECKPOINT_INTERVALS * self.config.checkpoint_interval
            + self.config.journal_segment_ops;
        let how = if isolated { "cut off" } else { "down" };
        self.trace.event(
            self.tick,
            &format!("lagging replica r{replica}: {how} until commit {until_commit}"),
        );
        if isolated {
            self.network.partition(&[replica], PartitionKind::Symmetric);
            self.faults.partitions += 1;
            self.count_partition_interruptions(&[replica]);
            self.partition = Some(ActivePartition {
                isolated: vec![replica],
                heal_tick: u64::MAX,
            });
        } else {
            self.crash(replica);
            self.nodes[replica].restart_tick = u64::MAX;
        }
        self.lag = Lag::Down {
            replica,
            until_commit,
            isolated,
        };
    }

    /// At convergence: every replica's state digest is the same (rule `converged-digest`).
    pub(super) fn check_converged_digests(&self) -> Result<(), Violation> {
        let digests: Vec<(usize, u64)> = self
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(replica, node)| {
                node.core
                    .as_ref()
                    .map(|core| (replica, core.state_digest()))
            })
            .collect();
        if let Some(&(first_replica, first)) = digests.first()
            && let Some(&(replica, digest)) = digests.iter().find(|&&(_, digest)| digest != first)
        {
            return Err(Violation {
                rule: "converged-digest",
                detail: format!(
                    "at the common commit replica {replica} has state digest {digest:#018x}, \
                     replica {first_replica} {first:#018x}"
                ),
            });
        }
        Ok(())
    }
}
