//! The receiving side of state transfer on shard 0 (DESIGN section 10, issue 9 section 4),
//! owned by the core (`crate::vsr::replica::Replica`) for the replica's lifetime.
//!
//! A [`Receiver`] walks one attempt at a time through the stages `Idle -> AwaitingTarget ->
//! Fetching -> Installing -> Idle` (and back to `Idle` from `AwaitingTarget` or `Fetching` when
//! a round fails); every edge goes through [`Receiver::transition`], which panics on any other
//! edge (a bug, DESIGN section 10). It fetches one chunk at a time, artifacts in manifest order,
//! and verifies each artifact's XXH3-128 checksum once it is complete. It keeps the retry
//! budget: consecutive failed rounds, reset by real progress; when the budget is spent it falls
//! back to journal repair and cools down before it tries again.
//!
//! Pure: no I/O, no clock (the core passes its tick), no randomness (the core passes each
//! attempt's nonce). It never decodes or restores the artifacts: it hands the verified bytes to
//! the core, which checks them restorable before anything is mutated. It must never accept a
//! chunk that is not the one in flight, nor count an empty chunk as progress.

use super::manifest::ManifestCaps;
use super::{ArtifactKind, Manifest, TransferTarget, UnavailableReason};
use crate::vsr::message::{Message, ReplicaIndex};

/// Bytes a `RequestStateChunk` asks for. The server clamps it to its chunk size and to what fits
/// one bus frame under `max_message_size` (issue 9 section 3), so this only bounds the largest
/// chunk one request can bring: 1 MiB keeps a transfer to a few hundred round trips for the
/// largest client table while one chunk pins little memory.
pub const STATE_CHUNK_REQUEST_LEN: u32 = 1024 * 1024;

/// The chunk round-trip timeout (ticks): a `RequestStateChunk` unanswered for this long is
/// counted as a failed round and re-sent. 100 ticks is one second at the default 10 ms tick,
/// far above a loopback or LAN round trip of a 1 MiB chunk. The serving side's offer expiry is
/// expressed in multiples of it (`super::server::ServerConfig::chunk_timeout_ticks`). Once
/// chunks came back, the receiver waits less: [`CHUNK_TIMEOUT_RTT_MULTIPLE`] times the smoothed
/// round trip it observed, at least [`CHUNK_TIMEOUT_TICKS_MIN`], at most this.
pub const CHUNK_TIMEOUT_TICKS: u64 = 100;

/// The shortest chunk timeout (ticks; 100 ms at the default tick), whatever the round trip.
pub const CHUNK_TIMEOUT_TICKS_MIN: u64 = 10;

/// The chunk timeout in smoothed round trips: a lost request or chunk costs a few round trips,
/// not a full [`CHUNK_TIMEOUT_TICKS`] (H5 observation O2: under 10% loss most failed rounds were
/// full 100-tick waits for chunks whose round trip was 2..12 ticks).
pub const CHUNK_TIMEOUT_RTT_MULTIPLE: u64 = 4;

/// Ticks a `RequestStateTransfer` waits for its `StateTransferTarget`: the server may build the
/// offer first (the checkpoint read and checksummed), so a few chunk round trips.
pub const TARGET_TIMEOUT_TICKS: u64 = 5 * CHUNK_TIMEOUT_TICKS;

/// Re-sends of one chunk request before the attempt is abandoned (the serving peer may have
/// crashed or lost the offer: the next attempt asks the primary of the view then, with a fresh
/// nonce).
pub const CHUNK_RESENDS_MAX: u32 = 2;

/// Consecutive failed rounds (unavailable target, timeout, checksum mismatch, refused restore,
/// failed install) before the receiver falls back to journal repair alone and cools down.
pub const TRANSFER_RETRY_BUDGET_ROUNDS: u32 = 8;

/// Ticks after a spent budget before the receiver starts over with a full budget (10 s at the
/// default tick): long enough that a peer that cannot serve is not hammered, short enough that
/// a replica catches up soon after the cause is gone.
pub const TRANSFER_COOLDOWN_TICKS: u64 = 1000;

/// Ticks the receiver waits before asking again after an offer that was not above what the
/// replica applied (not a failure, but asking again at once would get the same offer).
pub const NOT_USEFUL_HOLDOFF_TICKS: u64 = CHUNK_TIMEOUT_TICKS;

const _: () = assert!(
    STATE_CHUNK_REQUEST_LEN > 0,
    "a chunk request asks for at least a byte"
);
const _: () = assert!(CHUNK_TIMEOUT_TICKS <= TARGET_TIMEOUT_TICKS);
const _: () =
    assert!(CHUNK_TIMEOUT_TICKS_MIN >= 1 && CHUNK_TIMEOUT_TICKS_MIN <= CHUNK_TIMEOUT_TICKS);
const _: () = assert!(TRANSFER_RETRY_BUDGET_ROUNDS > CHUNK_RESENDS_MAX);

/// The receiver's stage (DESIGN section 10): `Idle -> AwaitingTarget -> Fetching -> Installing
/// -> Idle`, plus `AwaitingTarget -> Idle` and `Fetching -> Idle` on a failed round; any other
/// edge is a bug.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    Idle,
    AwaitingTarget,
    Fetching,
    Installing,
}

impl Stage {
    /// Whether `self -> to` is one of the legal edges.
    pub fn may_move_to(self, to: Stage) -> bool {
        matches!(
            (self, to),
            (Stage::Idle, Stage::AwaitingTarget)
                | (Stage::AwaitingTarget, Stage::Fetching | Stage::Idle)
                | (Stage::Fetching, Stage::Installing | Stage::Idle)
                | (Stage::Installing, Stage::Idle)
        )
    }
}

/// Why a round failed (each one spends one unit of the retry budget).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RoundFailure {
    /// The peer answered `available = 0`: ask again later (maybe another primary).
    #[error("the peer does not serve a transfer now: {0}")]
    Unavailable(UnavailableReason),
    /// The offer's manifest breaks this receiver's caps or rules: the server is broken or
    /// configured with a larger `--clients-table-max`.
    #[error("manifest refused: {reason}")]
    ManifestRefused { reason: String },
    /// No `StateTransferTarget` within [`TARGET_TIMEOUT_TICKS`].
    #[error("no answer to the transfer request within {TARGET_TIMEOUT_TICKS} ticks")]
    TargetTimeout,
    /// No `StateChunk` within the chunk timeout (`timeout_ticks`, see [`CHUNK_TIMEOUT_TICKS`]).
    #[error("no chunk of {} at byte {offset} within {timeout_ticks} ticks", .artifact.name())]
    ChunkTimeout {
        artifact: ArtifactKind,
        offset: u64,
        timeout_ticks: u64,
    },
    /// A chunk would run past the artifact's length in the manifest.
    #[error("a chunk of {} ends at byte {end}, past the artifact's {len} bytes", .artifact.name())]
    ChunkPastEnd {
        artifact: ArtifactKind,
        end: u64,
        len: u64,
    },
    /// A complete artifact does not hash to its manifest checksum.
    #[error("{} does not match its manifest checksum", .artifact.name())]
    ChecksumMismatch { artifact: ArtifactKind },
    /// The verified artifacts are not restorable (the core's two-phase check refused them).
    #[error("restore refused: {reason}")]
    RestoreRefused { reason: String },
    /// The replica may not install now (it is not a backup in normal status).
    #[error("cannot install now: {reason}")]
    NotInstallable { reason: &'static str },
    /// The driver's install failed; nothing durable changed.
    #[error("install failed: {reason}")]
    InstallFailed { reason: String },
}

impl RoundFailure {
    /// Whether the round failed after every byte of the offer arrived (or a chunk overran its
    /// artifact): the bytes fetched were no progress toward an install, so the round counts
    /// against the budget even though chunks arrived (see `Receiver::refused_rounds`).
    pub fn after_fetch(&self) -> bool {
        matches!(
            self,
            RoundFailure::ChunkPastEnd { .. }
                | RoundFailure::ChecksumMismatch { .. }
                | RoundFailure::RestoreRefused { .. }
                | RoundFailure::NotInstallable { .. }
                | RoundFailure::InstallFailed { .. }
        )
    }
}

/// Every artifact of an offer, fetched and checksum-verified, for the core to check restorable.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedCheckpoint {
    pub checkpoint_op: u64,
    /// The metadata artifact (`MetadataState` as JSON).
    pub metadata: Vec<u8>,
    /// The client-table artifact (`super::client_table_wire`).
    pub client_table: Vec<u8>,
}

/// What the core does after feeding the receiver an input.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReceiverStep {
    /// Nothing (an ignored or awaited input).
    Wait,
    /// Send this chunk request.
    Send(ChunkRequest),
    /// Every artifact arrived and verified (stage still `Fetching`): the core checks them
    /// restorable, then calls [`Receiver::begin_install`] or [`Receiver::restore_refused`].
    Verified(VerifiedCheckpoint),
    /// The target's checkpoint is not above what the replica applied: back to `Idle`, no
    /// failure counted.
    NotUseful { checkpoint_op: u64 },
    /// The round failed; `exhausted`: the budget is spent (stage `Idle`, cooling down). When
    /// not exhausted, `retry` holds the request re-sent at once (a chunk timeout), else the
    /// stage is `Idle`.
    Failed {
        failure: RoundFailure,
        exhausted: bool,
        retry: Option<ChunkRequest>,
    },
}

/// A `RequestStateChunk` to send to `to` (the core names its view).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkRequest {
    pub to: ReplicaIndex,
    pub nonce: u64,
    pub artifact: ArtifactKind,
    pub offset: u64,
    /// Bytes asked for: at least 1, at most [`STATE_CHUNK_REQUEST_LEN`].
    pub len: u32,
}

impl ChunkRequest {
    /// The message, sent in `view`.
    pub fn message(&self, view: u32) -> Message {
        Message::RequestStateChunk {
            view,
            nonce: self.nonce,
            artifact: self.artifact,
            offset: self.offset,
            len: self.len,
        }
    }
}

/// Counters of the receiver's lifetime (metrics and tests).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferCounters {
    /// Attempts started (`RequestStateTransfer` sent).
    pub started: u64,
    /// Checkpoints installed.
    pub installed: u64,
    /// Installs whose superblock pairing write failed (succeeded, degraded).
    pub degraded_installs: u64,
    /// Failed rounds, all causes.
    pub failed_rounds: u64,
    /// Times the retry budget ran out (fallback to repair, cool-down).
    pub budget_exhaustions: u64,
}

/// The attempt in progress (stages `AwaitingTarget`, `Fetching`, `Installing`).
#[derive(Debug, Clone)]
struct Attempt {
    nonce: u64,
    /// The peer asked (the one serving the offer once it answered).
    peer: ReplicaIndex,
    /// Tick of the last request sent.
    sent_at: u64,
    /// Re-sends of the chunk request in flight.
    resends: u32,
    fetch: Option<Fetch>,
}

/// What `Fetching` knows: the offer and the bytes received.
#[derive(Debug, Clone)]
struct Fetch {
    checkpoint_op: u64,
    manifest: Manifest,
    /// Index into `manifest.entries` of the artifact being fetched.
    artifact_index: usize,
    /// The artifacts' bytes, in manifest order; the last one is being fetched.
    received: Vec<Vec<u8>>,
}

impl Fetch {
    fn entry(&self) -> &super::ManifestEntry {
        &self.manifest.entries[self.artifact_index]
    }

    fn offset(&self) -> u64 {
        self.received[self.artifact_index].len() as u64
    }
}

/// The receiving side's state on one replica (see the module docs).
#[derive(Debug)]
pub struct Receiver {
    caps: ManifestCaps,
    stage: Stage,
    attempt: Option<Attempt>,
    /// Consecutive failed rounds (the retry budget spent so far).
    failed_rounds: u32,
    /// Consecutive rounds that failed after every byte arrived (a checksum mismatch, a refused
    /// restore, a failed install: [`RoundFailure::after_fetch`]). Chunk progress does not reset
    /// it, only an install does: a checkpoint this replica cannot take (say a client table over
    /// its `--clients-table-max`) must spend the budget, not be fetched again forever because
    /// each fetch "progressed" (adversarial test: 159 full downloads in 25 s).
    refused_rounds: u32,
    /// No attempt starts before this tick (after a spent budget).
    cooldown_until: u64,
    /// Smoothed round trip of a chunk request (ticks), from requests answered without a
    /// re-send (Karn's rule: a re-sent request's answer could be for either send).
    round_trip_ticks: Option<u64>,
    counters: TransferCounters,
}

impl Receiver {
    /// An idle receiver with a full budget, whose manifests are bounded by `caps`
    /// (`ManifestCaps::for_receiver(clients_table_max)`).
    pub fn new(caps: ManifestCaps) -> Receiver {
        Receiver {
            caps,
            stage: Stage::Idle,
            attempt: None,
            failed_rounds: 0,
            refused_rounds: 0,
            cooldown_until: 0,
            round_trip_ticks: None,
            counters: TransferCounters::default(),
        }
    }

    pub fn stage(&self) -> Stage {
        self.stage
    }

    pub fn counters(&self) -> TransferCounters {
        self.counters
    }

    /// Consecutive failed rounds so far (0 after progress or a fresh budget).
    pub fn failed_rounds(&self) -> u32 {
        self.failed_rounds
    }

    /// The nonce of the attempt in progress.
    pub fn nonce(&self) -> Option<u64> {
        self.attempt.as_ref().map(|attempt| attempt.nonce)
    }

    /// The offer's checkpoint op once a target was accepted.
    pub fn checkpoint_op(&self) -> Option<u64> {
        self.attempt
            .as_ref()
            .and_then(|attempt| attempt.fetch.as_ref())
            .map(|fetch| fetch.checkpoint_op)
    }

    /// Whether an attempt may start at tick `now`: idle and not cooling down.
    pub fn can_start(&self, now: u64) -> bool {
        self.stage == Stage::Idle && now >= self.cooldown_until
    }

    /// Moves to `to`.
    ///
    /// # Panics
    /// If `self.stage -> to` is not a legal edge (DESIGN section 10: a bug).
    pub fn transition(&mut self, to: Stage) {
        assert!(
            self.stage.may_move_to(to),
            "state transfer receiver: illegal stage edge {:?} -> {to:?}",
            self.stage
        );
        self.stage = to;
        if to == Stage::Idle {
            self.attempt = None;
        }
    }

    /// Starts an attempt: `RequestStateTransfer{nonce}` to `peer` in `view`, at tick `now`.
    ///
    /// # Panics
    /// If not [`Receiver::can_start`] or `nonce` is 0 (the core's bugs).
    pub fn start(&mut self, nonce: u64, peer: ReplicaIndex, view: u32, now: u64) -> Message {
        assert!(self.can_start(now), "a transfer starts only from Idle");
        assert_ne!(nonce, 0, "a transfer nonce is never 0");
        self.transition(Stage::AwaitingTarget);
        self.counters.started += 1;
        self.attempt = Some(Attempt {
            nonce,
            peer,
            sent_at: now,
            resends: 0,
            fetch: None,
        });
        Message::RequestStateTransfer { view, nonce }
    }

    /// A `StateTransferTarget` from `from`. Ignored unless it answers the attempt awaiting its
    /// target (stage, nonce, peer). `commit_min`: the replica's; a checkpoint not above it is
    /// not useful.
    pub fn on_target(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        target: TransferTarget,
        commit_min: u64,
        now: u64,
    ) -> ReceiverStep {
        if self.stage != Stage::AwaitingTarget || !self.is_current(from, nonce) {
            return ReceiverStep::Wait;
        }
        let (checkpoint_op, manifest) = match target {
            TransferTarget::Unavailable { reason } => {
                return self.fail(RoundFailure::Unavailable(reason), now);
            }
            TransferTarget::Available {
                checkpoint_op,
                manifest,
            } => (checkpoint_op, manifest),
        };
        if let Err(reason) = self.check_manifest(checkpoint_op, &manifest) {
            return self.fail(RoundFailure::ManifestRefused { reason }, now);
        }
        if checkpoint_op <= commit_min {
            self.abandon(now);
            return ReceiverStep::NotUseful { checkpoint_op };
        }
        let received = vec![Vec::new()];
        let attempt = self
            .attempt
            .as_mut()
            .expect("AwaitingTarget has an attempt");
        attempt.fetch = Some(Fetch {
            checkpoint_op,
            manifest,
            artifact_index: 0,
            received,
        });
        self.transition(Stage::Fetching);
        self.request_chunk(now)
    }

    /// The rules of a manifest on top of its decoder's (issue 9 section 2): within this
    /// receiver's caps, every artifact kind present, each entry's frontier the checkpoint op.
    fn check_manifest(&self, checkpoint_op: u64, manifest: &Manifest) -> Result<(), String> {
        self.caps
            .check(manifest)
            .map_err(|error| error.to_string())?;
        for kind in ArtifactKind::ALL {
            if manifest.entry(kind).is_none() {
                return Err(format!("no {} artifact", kind.name()));
            }
        }
        if let Some(entry) = manifest
            .entries
            .iter()
            .find(|entry| entry.frontier_op != checkpoint_op)
        {
            return Err(format!(
                "{} has frontier op {}, not the checkpoint op {checkpoint_op}",
                entry.kind.name(),
                entry.frontier_op
            ));
        }
        Ok(())
    }

    /// A `StateChunk` from `from`. Accepted only if it is the chunk in flight (stage, nonce,
    /// peer, artifact, offset) and fits within the artifact's manifest length; anything else is
    /// ignored. An empty payload is ignored too: it is never progress.
    pub fn on_chunk(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        artifact: ArtifactKind,
        offset: u64,
        payload: &[u8],
        now: u64,
    ) -> ReceiverStep {
        if self.stage != Stage::Fetching || !self.is_current(from, nonce) {
            return ReceiverStep::Wait;
        }
        let fetch = self.fetch();
        let entry = *fetch.entry();
        if artifact != entry.kind || offset != fetch.offset() || payload.is_empty() {
            return ReceiverStep::Wait;
        }
        let end = offset.saturating_add(payload.len() as u64);
        if end > entry.len {
            return self.fail(
                RoundFailure::ChunkPastEnd {
                    artifact,
                    end,
                    len: entry.len,
                },
                now,
            );
        }
        // Real progress: the artifact grew.
        self.failed_rounds = 0;
        let attempt = self.attempt.as_mut().expect("Fetching has an attempt");
        let sample = (attempt.resends == 0).then(|| now.saturating_sub(attempt.sent_at));
        attempt.resends = 0;
        if let Some(sample) = sample {
            self.observe_round_trip(sample);
        }
        let attempt = self.attempt.as_mut().expect("Fetching has an attempt");
        let fetch = attempt.fetch.as_mut().expect("Fetching has a fetch");
        fetch.received[fetch.artifact_index].extend_from_slice(payload);
        if end < entry.len {
            return self.request_chunk(now);
        }
        let bytes = &fetch.received[fetch.artifact_index];
        if twox_hash::XxHash3_128::oneshot(bytes) != entry.checksum {
            return self.fail(RoundFailure::ChecksumMismatch { artifact }, now);
        }
        if fetch.artifact_index + 1 < fetch.manifest.entries.len() {
            fetch.artifact_index += 1;
            fetch.received.push(Vec::new());
            return self.request_chunk(now);
        }
        ReceiverStep::Verified(self.take_verified())
    }

    /// The verified artifacts by kind, moved out of the fetch (every kind is present: the
    /// manifest was checked); the attempt keeps no copy.
    fn take_verified(&mut self) -> VerifiedCheckpoint {
        let fetch = self
            .attempt
            .as_mut()
            .and_then(|attempt| attempt.fetch.as_mut())
            .expect("Fetching has a fetch");
        let mut take = |kind: ArtifactKind| {
            let index = fetch
                .manifest
                .entries
                .iter()
                .position(|entry| entry.kind == kind)
                .expect("the manifest holds every kind");
            std::mem::take(&mut fetch.received[index])
        };
        let metadata = take(ArtifactKind::Metadata);
        let client_table = take(ArtifactKind::ClientTable);
        VerifiedCheckpoint {
            checkpoint_op: fetch.checkpoint_op,
            metadata,
            client_table,
        }
    }

    /// One tick: a target or chunk unanswered past its timeout fails the round; a chunk request
    /// is re-sent (at most [`CHUNK_RESENDS_MAX`] times) while the budget lasts.
    pub fn on_tick(&mut self, now: u64) -> ReceiverStep {
        let Some(attempt) = self.attempt.as_ref() else {
            return ReceiverStep::Wait;
        };
        match self.stage {
            Stage::AwaitingTarget if now >= attempt.sent_at + TARGET_TIMEOUT_TICKS => {
                self.fail(RoundFailure::TargetTimeout, now)
            }
            Stage::Fetching if now >= attempt.sent_at + self.chunk_timeout_ticks() => {
                let fetch = self.fetch();
                let failure = RoundFailure::ChunkTimeout {
                    artifact: fetch.entry().kind,
                    offset: fetch.offset(),
                    timeout_ticks: self.chunk_timeout_ticks(),
                };
                if attempt.resends >= CHUNK_RESENDS_MAX {
                    return self.fail(failure, now);
                }
                let exhausted = self.spend_budget(false, now);
                if exhausted {
                    self.transition(Stage::Idle);
                    return ReceiverStep::Failed {
                        failure,
                        exhausted,
                        retry: None,
                    };
                }
                let attempt = self.attempt.as_mut().expect("Fetching has an attempt");
                attempt.resends += 1;
                let ReceiverStep::Send(request) = self.request_chunk(now) else {
                    unreachable!("request_chunk sends");
                };
                ReceiverStep::Failed {
                    failure,
                    exhausted,
                    retry: Some(request),
                }
            }
            _ => ReceiverStep::Wait,
        }
    }

    /// Drops the attempt without counting a failure (the offer is not above what the replica
    /// applied): back to `Idle`, and no new attempt for [`NOT_USEFUL_HOLDOFF_TICKS`].
    pub fn abandon(&mut self, now: u64) {
        self.transition(Stage::Idle);
        self.cooldown_until = self.cooldown_until.max(now + NOT_USEFUL_HOLDOFF_TICKS);
    }

    /// The peer the attempt in progress asked.
    pub fn peer(&self) -> Option<ReplicaIndex> {
        self.attempt.as_ref().map(|attempt| attempt.peer)
    }

    /// Drops an attempt still waiting for its target (`AwaitingTarget -> Idle`) without counting
    /// a failure or holding off: a new view began and the peer asked may be gone, so the core
    /// asks the new primary at once instead of waiting out [`TARGET_TIMEOUT_TICKS`]. Returns
    /// whether it dropped one.
    pub fn retarget(&mut self) -> bool {
        if self.stage != Stage::AwaitingTarget {
            return false;
        }
        self.transition(Stage::Idle);
        true
    }

    /// The core checked the verified artifacts restorable and asks the driver to install them:
    /// `Fetching -> Installing`.
    pub fn begin_install(&mut self) {
        self.transition(Stage::Installing);
    }

    /// The core refused the verified artifacts (nothing was mutated), or may not install now:
    /// a failed round, `Fetching -> Idle`.
    pub fn restore_refused(&mut self, failure: RoundFailure, now: u64) -> ReceiverStep {
        self.fail(failure, now)
    }

    /// The driver installed the checkpoint: `Installing -> Idle`, the budget full again.
    pub fn installed(&mut self, degraded: bool) {
        self.transition(Stage::Idle);
        self.failed_rounds = 0;
        self.refused_rounds = 0;
        self.counters.installed += 1;
        if degraded {
            self.counters.degraded_installs += 1;
        }
    }

    /// The driver's install failed (nothing durable changed): a failed round,
    /// `Installing -> Idle`.
    pub fn install_failed(&mut self, reason: String, now: u64) -> ReceiverStep {
        self.fail(RoundFailure::InstallFailed { reason }, now)
    }

    /// The chunk timeout now (ticks): [`CHUNK_TIMEOUT_RTT_MULTIPLE`] smoothed round trips within
    /// `CHUNK_TIMEOUT_TICKS_MIN..=CHUNK_TIMEOUT_TICKS`, or [`CHUNK_TIMEOUT_TICKS`] before any
    /// round trip was observed.
    pub fn chunk_timeout_ticks(&self) -> u64 {
        self.round_trip_ticks
            .map_or(CHUNK_TIMEOUT_TICKS, |round_trip| {
                round_trip
                    .saturating_mul(CHUNK_TIMEOUT_RTT_MULTIPLE)
                    .clamp(CHUNK_TIMEOUT_TICKS_MIN, CHUNK_TIMEOUT_TICKS)
            })
    }

    /// Folds one round trip (ticks) into the smoothed one (RFC 6298's 7/8 weight).
    fn observe_round_trip(&mut self, sample: u64) {
        let sample = sample.min(CHUNK_TIMEOUT_TICKS);
        self.round_trip_ticks = Some(match self.round_trip_ticks {
            None => sample,
            Some(smoothed) => (7 * smoothed + sample).div_ceil(8),
        });
    }

    /// Whether `(from, nonce)` names the attempt in progress.
    fn is_current(&self, from: ReplicaIndex, nonce: u64) -> bool {
        self.attempt
            .as_ref()
            .is_some_and(|attempt| attempt.nonce == nonce && attempt.peer == from)
    }

    fn fetch(&self) -> &Fetch {
        self.attempt
            .as_ref()
            .and_then(|attempt| attempt.fetch.as_ref())
            .expect("Fetching has a fetch")
    }

    /// Asks for the next chunk of the artifact being fetched (at tick `now`).
    fn request_chunk(&mut self, now: u64) -> ReceiverStep {
        let fetch = self.fetch();
        let entry = fetch.entry();
        let remaining = entry.len - fetch.offset();
        let len = u32::try_from(remaining).map_or(STATE_CHUNK_REQUEST_LEN, |remaining| {
            remaining.min(STATE_CHUNK_REQUEST_LEN)
        });
        let (artifact, offset) = (entry.kind, fetch.offset());
        let attempt = self.attempt.as_mut().expect("Fetching has an attempt");
        attempt.sent_at = now;
        ReceiverStep::Send(ChunkRequest {
            to: attempt.peer,
            nonce: attempt.nonce,
            artifact,
            offset,
            len,
        })
    }

    /// A failed round: spends one unit of the budget and abandons the attempt (`Idle`).
    fn fail(&mut self, failure: RoundFailure, now: u64) -> ReceiverStep {
        let exhausted = self.spend_budget(failure.after_fetch(), now);
        self.transition(Stage::Idle);
        ReceiverStep::Failed {
            failure,
            exhausted,
            retry: None,
        }
    }

    /// Counts a failed round (`after_fetch`: one that failed after every byte arrived); when
    /// either count reaches the budget, starts the cool-down and refills the budget for after
    /// it. Returns whether it was spent.
    fn spend_budget(&mut self, after_fetch: bool, now: u64) -> bool {
        self.counters.failed_rounds += 1;
        self.failed_rounds += 1;
        if after_fetch {
            self.refused_rounds += 1;
        }
        if self.failed_rounds < TRANSFER_RETRY_BUDGET_ROUNDS
            && self.refused_rounds < TRANSFER_RETRY_BUDGET_ROUNDS
        {
            return false;
        }
        self.failed_rounds = 0;
        self.refused_rounds = 0;
        self.cooldown_until = now + TRANSFER_COOLDOWN_TICKS;
        self.counters.budget_exhaustions += 1;
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::vsr::transfer::ManifestEntry;

    const PEER: ReplicaIndex = 1;
    const NONCE: u64 = 0xfeed;
    const CHECKPOINT_OP: u64 = 40;

    fn entry(kind: ArtifactKind, bytes: &[u8]) -> ManifestEntry {
        ManifestEntry {
            kind,
            frontier_op: CHECKPOINT_OP,
            len: bytes.len() as u64,
            checksum: twox_hash::XxHash3_128::oneshot(bytes),
        }
    }

    fn metadata_bytes() -> Vec<u8> {
        b"{\"metadata\":true}".to_vec()
    }

    fn table_bytes() -> Vec<u8> {
        (0u8..30).collect()
    }

    fn manifest() -> Manifest {
        Manifest {
            entries: vec![
                entry(ArtifactKind::Metadata, &metadata_bytes()),
                entry(ArtifactKind::ClientTable, &table_bytes()),
            ],
        }
    }

    fn available(manifest: Manifest) -> TransferTarget {
        TransferTarget::Available {
            checkpoint_op: CHECKPOINT_OP,
            manifest,
        }
    }

    fn receiver() -> Receiver {
        Receiver::new(ManifestCaps::for_receiver(64))
    }

    /// A receiver fetching the first chunk of [`manifest`] at tick `now`.
    fn fetching(now: u64) -> Receiver {
        let mut receiver = receiver();
        receiver.start(NONCE, PEER, 3, now);
        let step = receiver.on_target(PEER, NONCE, available(manifest()), 10, now);
        assert!(matches!(step, ReceiverStep::Send(_)), "{step:?}");
        receiver
    }

    fn chunk(
        receiver: &mut Receiver,
        artifact: ArtifactKind,
        offset: u64,
        payload: &[u8],
    ) -> ReceiverStep {
        receiver.on_chunk(PEER, NONCE, artifact, offset, payload, 0)
    }

    fn request(step: &ReceiverStep) -> ChunkRequest {
        match step {
            ReceiverStep::Send(request) => *request,
            other => panic!("expected a chunk request, got {other:?}"),
        }
    }

    fn fail_rounds(receiver: &mut Receiver, rounds: u32, now: u64) {
        for _ in 0..rounds {
            receiver.start(NONCE, PEER, 3, now);
            let step = receiver.on_target(
                PEER,
                NONCE,
                TransferTarget::Unavailable {
                    reason: UnavailableReason::NotPrimary,
                },
                10,
                now,
            );
            assert!(matches!(step, ReceiverStep::Failed { .. }), "{step:?}");
        }
    }

    #[test]
    fn issue9_receiver_legal_edges() {
        let mut receiver = receiver();
        for path in [
            &[Stage::AwaitingTarget, Stage::Idle][..],
            &[Stage::AwaitingTarget, Stage::Fetching, Stage::Idle],
            &[
                Stage::AwaitingTarget,
                Stage::Fetching,
                Stage::Installing,
                Stage::Idle,
            ],
        ] {
            for &to in path {
                receiver.transition(to);
                assert_eq!(receiver.stage(), to);
            }
        }
        let stages = [
            Stage::Idle,
            Stage::AwaitingTarget,
            Stage::Fetching,
            Stage::Installing,
        ];
        let legal: Vec<(Stage, Stage)> = stages
            .iter()
            .flat_map(|&from| stages.iter().map(move |&to| (from, to)))
            .filter(|&(from, to)| from.may_move_to(to))
            .collect();
        assert_eq!(legal.len(), 6, "{legal:?}");
    }

    #[test]
    #[should_panic(expected = "illegal stage edge Idle -> Installing")]
    fn issue9_receiver_illegal_edge_is_a_bug() {
        receiver().transition(Stage::Installing);
    }

    #[test]
    fn issue9_fetches_artifacts_in_manifest_order_one_chunk_at_a_time() {
        let mut receiver = fetching(0);
        assert_eq!(receiver.stage(), Stage::Fetching);
        let metadata = metadata_bytes();
        let table = table_bytes();
        // The server may send fewer bytes than asked: the next request starts where they end.
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 0, &metadata[..5]);
        let next = request(&step);
        assert_eq!(
            (next.to, next.nonce, next.artifact, next.offset),
            (PEER, NONCE, ArtifactKind::Metadata, 5)
        );
        assert_eq!(u64::from(next.len), metadata.len() as u64 - 5);
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 5, &metadata[5..]);
        let next = request(&step);
        assert_eq!((next.artifact, next.offset), (ArtifactKind::ClientTable, 0));
        let step = chunk(&mut receiver, ArtifactKind::ClientTable, 0, &table);
        assert_eq!(
            step,
            ReceiverStep::Verified(VerifiedCheckpoint {
                checkpoint_op: CHECKPOINT_OP,
                metadata,
                client_table: table,
            })
        );
        receiver.begin_install();
        receiver.installed(true);
        assert_eq!(receiver.stage(), Stage::Idle);
        let counters = receiver.counters();
        assert_eq!((counters.installed, counters.degraded_installs), (1, 1));
    }

    #[test]
    fn issue9_zero_byte_chunk_is_not_progress() {
        let mut receiver = receiver();
        fail_rounds(&mut receiver, 2, 0);
        let mut receiver = {
            receiver.start(NONCE, PEER, 3, 0);
            receiver.on_target(PEER, NONCE, available(manifest()), 10, 0);
            receiver
        };
        assert_eq!(receiver.failed_rounds(), 2);
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 0, &[]);
        assert_eq!(step, ReceiverStep::Wait);
        assert_eq!(receiver.failed_rounds(), 2, "the budget is not refilled");
        // Nothing advanced: the timeout still names offset 0 and counts a failed round.
        let step = receiver.on_tick(CHUNK_TIMEOUT_TICKS);
        let ReceiverStep::Failed { failure, retry, .. } = step else {
            panic!("expected a failed round, got {step:?}");
        };
        assert_eq!(
            failure,
            RoundFailure::ChunkTimeout {
                artifact: ArtifactKind::Metadata,
                offset: 0,
                timeout_ticks: CHUNK_TIMEOUT_TICKS,
            }
        );
        assert_eq!(retry.map(|r| r.offset), Some(0));
        assert_eq!(receiver.failed_rounds(), 3);
    }

    #[test]
    fn issue9_budget_reset_by_progress() {
        let mut receiver = receiver();
        fail_rounds(&mut receiver, TRANSFER_RETRY_BUDGET_ROUNDS - 1, 0);
        assert_eq!(receiver.failed_rounds(), TRANSFER_RETRY_BUDGET_ROUNDS - 1);
        receiver.start(NONCE, PEER, 3, 0);
        receiver.on_target(PEER, NONCE, available(manifest()), 10, 0);
        assert_eq!(receiver.failed_rounds(), TRANSFER_RETRY_BUDGET_ROUNDS - 1);
        chunk(
            &mut receiver,
            ArtifactKind::Metadata,
            0,
            &metadata_bytes()[..1],
        );
        assert_eq!(
            receiver.failed_rounds(),
            0,
            "a chunk that advances refills it"
        );
        // One more failure no longer exhausts the budget.
        let step = receiver.on_tick(CHUNK_TIMEOUT_TICKS);
        assert!(
            matches!(
                step,
                ReceiverStep::Failed {
                    exhausted: false,
                    ..
                }
            ),
            "{step:?}"
        );
        assert_eq!(receiver.stage(), Stage::Fetching);
    }

    /// Adversarial finding: a checkpoint fetched whole and then refused (here its restore)
    /// spends the budget even though every round's chunks "progressed"; the budget runs out
    /// after `TRANSFER_RETRY_BUDGET_ROUNDS` such rounds and the receiver cools down.
    #[test]
    fn issue9_rounds_refused_after_a_complete_fetch_spend_the_budget_despite_progress() {
        let mut receiver = receiver();
        for round in 1..=TRANSFER_RETRY_BUDGET_ROUNDS {
            assert!(receiver.can_start(0), "round {round}");
            receiver.start(NONCE, PEER, 3, 0);
            receiver.on_target(PEER, NONCE, available(manifest()), 10, 0);
            chunk(&mut receiver, ArtifactKind::Metadata, 0, &metadata_bytes());
            let step = chunk(&mut receiver, ArtifactKind::ClientTable, 0, &table_bytes());
            assert!(matches!(step, ReceiverStep::Verified(_)), "{step:?}");
            let step = receiver.restore_refused(
                RoundFailure::RestoreRefused {
                    reason: "client table over --clients-table-max".to_owned(),
                },
                0,
            );
            let ReceiverStep::Failed { exhausted, .. } = step else {
                panic!("round {round}: {step:?}");
            };
            assert_eq!(
                exhausted,
                round == TRANSFER_RETRY_BUDGET_ROUNDS,
                "round {round}"
            );
        }
        assert!(
            !receiver.can_start(1),
            "cooling down after the spent budget"
        );
        assert!(receiver.can_start(TRANSFER_COOLDOWN_TICKS));
    }

    /// Adversarial finding #3: after a view change the core drops a request still waiting for
    /// the old primary's target, with no failure counted and no hold-off, and asks again.
    #[test]
    fn issue9_retarget_drops_only_an_unanswered_request_without_a_failure() {
        let mut receiver = receiver();
        receiver.start(NONCE, PEER, 3, 0);
        assert_eq!(receiver.peer(), Some(PEER));
        assert!(receiver.retarget());
        assert_eq!(receiver.stage(), Stage::Idle);
        assert_eq!(receiver.failed_rounds(), 0);
        assert_eq!(receiver.counters().failed_rounds, 0);
        assert!(receiver.can_start(0), "no hold-off");
        let mut fetching = fetching(0);
        assert!(
            !fetching.retarget(),
            "a transfer already fetching keeps its offer"
        );
        assert_eq!(fetching.stage(), Stage::Fetching);
    }

    #[test]
    fn issue9_budget_exhaustion_falls_back_to_repair() {
        let mut receiver = receiver();
        fail_rounds(&mut receiver, TRANSFER_RETRY_BUDGET_ROUNDS - 1, 100);
        receiver.start(NONCE, PEER, 3, 100);
        let step = receiver.on_tick(100 + TARGET_TIMEOUT_TICKS);
        assert_eq!(
            step,
            ReceiverStep::Failed {
                failure: RoundFailure::TargetTimeout,
                exhausted: true,
                retry: None,
            }
        );
        assert_eq!(receiver.stage(), Stage::Idle);
        assert_eq!(receiver.counters().budget_exhaustions, 1);
        let cooled = 100 + TARGET_TIMEOUT_TICKS + TRANSFER_COOLDOWN_TICKS;
        assert!(!receiver.can_start(cooled - 1), "cooling down: repair only");
        assert!(receiver.can_start(cooled));
        // A full budget again: it takes all its rounds to run out.
        assert_eq!(receiver.failed_rounds(), 0);
        fail_rounds(&mut receiver, TRANSFER_RETRY_BUDGET_ROUNDS - 1, cooled);
        assert!(receiver.can_start(cooled));
        assert_eq!(receiver.counters().budget_exhaustions, 1);
    }

    #[test]
    fn issue9_checksum_mismatch_fails_the_round() {
        let mut receiver = fetching(0);
        let mut damaged = metadata_bytes();
        damaged[3] ^= 1;
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 0, &damaged);
        assert_eq!(
            step,
            ReceiverStep::Failed {
                failure: RoundFailure::ChecksumMismatch {
                    artifact: ArtifactKind::Metadata
                },
                exhausted: false,
                retry: None,
            }
        );
        assert_eq!(receiver.stage(), Stage::Idle);
        assert_eq!(receiver.failed_rounds(), 1);
    }

    #[test]
    fn issue9_nonce_mismatch_ignored() {
        let mut receiver = receiver();
        receiver.start(NONCE, PEER, 3, 0);
        let target = available(manifest());
        assert_eq!(
            receiver.on_target(PEER, NONCE + 1, target.clone(), 10, 0),
            ReceiverStep::Wait
        );
        assert_eq!(
            receiver.on_target(PEER + 1, NONCE, target, 10, 0),
            ReceiverStep::Wait,
            "a target from another peer"
        );
        assert_eq!(receiver.stage(), Stage::AwaitingTarget);
        let mut receiver = fetching(0);
        let step = receiver.on_chunk(
            PEER,
            NONCE + 1,
            ArtifactKind::Metadata,
            0,
            &metadata_bytes(),
            0,
        );
        assert_eq!(step, ReceiverStep::Wait);
        assert_eq!(receiver.failed_rounds(), 0);
        assert_eq!(receiver.stage(), Stage::Fetching);
    }

    #[test]
    fn issue9_stale_chunk_ignored() {
        let mut receiver = fetching(0);
        let metadata = metadata_bytes();
        chunk(&mut receiver, ArtifactKind::Metadata, 0, &metadata[..4]);
        // A duplicate of the chunk already taken, a chunk of another artifact, one ahead.
        for (artifact, offset, payload) in [
            (ArtifactKind::Metadata, 0, &metadata[..4]),
            (ArtifactKind::ClientTable, 4, &metadata[4..8]),
            (ArtifactKind::Metadata, 8, &metadata[8..]),
        ] {
            assert_eq!(
                chunk(&mut receiver, artifact, offset, payload),
                ReceiverStep::Wait
            );
        }
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 4, &metadata[4..]);
        assert_eq!(request(&step).artifact, ArtifactKind::ClientTable);
    }

    #[test]
    fn issue9_chunk_past_the_manifest_length_fails_the_round() {
        let mut receiver = fetching(0);
        let mut long = metadata_bytes();
        long.push(0);
        let step = chunk(&mut receiver, ArtifactKind::Metadata, 0, &long);
        assert!(
            matches!(
                step,
                ReceiverStep::Failed {
                    failure: RoundFailure::ChunkPastEnd { .. },
                    ..
                }
            ),
            "{step:?}"
        );
    }

    #[test]
    fn issue9_target_not_above_commit_min_is_not_a_failure() {
        let mut receiver = receiver();
        receiver.start(NONCE, PEER, 3, 0);
        let step = receiver.on_target(PEER, NONCE, available(manifest()), CHECKPOINT_OP, 0);
        assert_eq!(
            step,
            ReceiverStep::NotUseful {
                checkpoint_op: CHECKPOINT_OP
            }
        );
        assert_eq!(receiver.stage(), Stage::Idle);
        assert_eq!(receiver.failed_rounds(), 0);
        assert_eq!(receiver.counters().failed_rounds, 0);
    }

    #[test]
    fn issue9_manifest_rules_of_the_receiver() {
        let one_kind = Manifest {
            entries: vec![entry(ArtifactKind::Metadata, &metadata_bytes())],
        };
        let mut other_frontier = manifest();
        other_frontier.entries[1].frontier_op = CHECKPOINT_OP - 1;
        let mut over_cap = manifest();
        over_cap.entries[1].len = ManifestCaps::for_receiver(64).client_table_len_max + 1;
        for (manifest, expected) in [
            (one_kind, "no client_table artifact"),
            (other_frontier, "frontier op 39"),
            (over_cap, "client_table"),
        ] {
            let mut receiver = receiver();
            receiver.start(NONCE, PEER, 3, 0);
            let step = receiver.on_target(PEER, NONCE, available(manifest), 10, 0);
            let ReceiverStep::Failed {
                failure: RoundFailure::ManifestRefused { reason },
                ..
            } = step
            else {
                panic!("expected a refused manifest, got {step:?}");
            };
            assert!(reason.contains(expected), "{reason} lacks {expected}");
            assert_eq!(receiver.stage(), Stage::Idle);
        }
    }

    #[test]
    fn issue9_chunk_timeout_resends_then_abandons_the_attempt() {
        let mut receiver = fetching(0);
        let mut now = 0;
        for resend in 1..=CHUNK_RESENDS_MAX {
            assert_eq!(
                receiver.on_tick(now + CHUNK_TIMEOUT_TICKS - 1),
                ReceiverStep::Wait
            );
            now += CHUNK_TIMEOUT_TICKS;
            let step = receiver.on_tick(now);
            let ReceiverStep::Failed { retry, .. } = step else {
                panic!("expected a re-sent chunk request, got {step:?}");
            };
            assert_eq!(retry.map(|r| (r.nonce, r.offset)), Some((NONCE, 0)));
            assert_eq!(receiver.failed_rounds(), resend);
        }
        now += CHUNK_TIMEOUT_TICKS;
        let step = receiver.on_tick(now);
        assert!(
            matches!(step, ReceiverStep::Failed { retry: None, .. }),
            "{step:?}"
        );
        assert_eq!(receiver.stage(), Stage::Idle);
    }

    /// H5 observation O2: once chunks came back, a lost one costs a few observed round trips
    /// (within `CHUNK_TIMEOUT_TICKS_MIN..=CHUNK_TIMEOUT_TICKS`), not the full chunk timeout.
    #[test]
    fn issue9_chunk_timeout_follows_the_observed_round_trip() {
        let mut receiver = fetching(0);
        assert_eq!(receiver.chunk_timeout_ticks(), CHUNK_TIMEOUT_TICKS);
        let metadata = metadata_bytes();
        // Every chunk comes back 5 ticks after its request.
        let mut now = 0;
        for offset in 0..4u64 {
            now += 5;
            let step = receiver.on_chunk(
                PEER,
                NONCE,
                ArtifactKind::Metadata,
                offset,
                std::slice::from_ref(&metadata[offset as usize]),
                now,
            );
            assert_eq!(request(&step).offset, offset + 1);
        }
        assert_eq!(
            receiver.chunk_timeout_ticks(),
            5 * CHUNK_TIMEOUT_RTT_MULTIPLE
        );
        assert_eq!(receiver.on_tick(now + 19), ReceiverStep::Wait);
        let step = receiver.on_tick(now + 20);
        let ReceiverStep::Failed {
            failure: RoundFailure::ChunkTimeout { timeout_ticks, .. },
            retry: Some(retry),
            ..
        } = step
        else {
            panic!("expected a chunk timeout, got {step:?}");
        };
        assert_eq!((timeout_ticks, retry.offset), (20, 4));
        // A fast link never waits less than the floor.
        let mut fast = fetching(0);
        fast.on_chunk(PEER, NONCE, ArtifactKind::Metadata, 0, &metadata[..1], 0);
        assert_eq!(fast.chunk_timeout_ticks(), CHUNK_TIMEOUT_TICKS_MIN);
    }

    #[test]
    fn issue9_unavailable_target_is_a_failed_round() {
        let mut receiver = receiver();
        fail_rounds(&mut receiver, 1, 0);
        assert_eq!(receiver.stage(), Stage::Idle);
        assert_eq!(receiver.counters().failed_rounds, 1);
        assert_eq!(receiver.counters().started, 1);
    }
}
