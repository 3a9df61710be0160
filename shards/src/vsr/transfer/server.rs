//! The serving side of state transfer on shard 0 of the primary (DESIGN section 10, issue 9
//! section 3): one offer per checkpoint generation, built once and shared (`Rc`) by every
//! requester of it; transfers keyed by requesting replica (first wins per nonce, a fresh nonce
//! replaces a stale entry); chunks clamped to the chunk size and the receiver's frame limit;
//! expiry of served and idle transfers and release of the cached offer when nobody pulls.
//!
//! Pure like the rest of `crate::vsr`: no I/O and no clock. `now` is the host's tick count
//! (`crate::limits::TICK_DEFAULT` each); reading and checksumming the checkpoint is the host's
//! job ([`ServeOutput::BuildOffer`] -> [`Offer::build`] off the reactor ->
//! [`OfferServer::offer_built`]). It must never panic on a peer's request: a request it cannot
//! serve is refused (nothing sent) and logged, rate-limited.

use std::collections::BTreeMap;
use std::rc::Rc;

use twox_hash::XxHash3_128;

use super::client_table_wire::ClientTableWireError;
use super::{
    ArtifactKind, Availability, Manifest, ManifestEntry, TransferTarget, UnavailableReason,
};
use crate::metadata::MetadataState;
use crate::vsr::client_table::ClientTableSnapshot;
use crate::vsr::message::{Message, ReplicaIndex};

/// Default largest chunk payload (bytes): 1 MiB. With one chunk in flight per transfer, a chunk
/// must be large enough that the request round trip (tens of microseconds on a LAN or loopback)
/// is small against the time to move the chunk (about 100 µs at 10 GB/s), and small enough that
/// a chunk never crowds out replication on the shared replica link for long and that the copies
/// in flight stay cheap (one payload per requesting replica). 1 MiB also fits the production
/// replica frame limit (`crate::limits::REPLICA_MESSAGE_SIZE_MAX`, about 8 MiB) with its header,
/// so in production the frame clamp never binds (checked below).
pub const STATE_CHUNK_SIZE_MAX_DEFAULT: u32 = 1024 * 1024;

/// A fully served transfer (every byte of every artifact sent at least once) is dropped after
/// this many chunk round-trip timeouts without a request: the grace for the receiver to re-ask
/// for a lost last chunk (issue 9 section 3).
pub const SERVED_EXPIRY_CHUNK_TIMEOUTS: u64 = 3;
/// A transfer not fully served is dropped after this many chunk round-trip timeouts without a
/// request: its receiver gave up, rebooted or moved to another primary (issue 9 section 3).
pub const IDLE_EXPIRY_CHUNK_TIMEOUTS: u64 = 10;
/// The cached offer is released once no transfer holds it and nobody pulled from it (asked for
/// a transfer of it or for a chunk of it) for this many chunk round-trip timeouts: the memory of
/// a whole checkpoint is not kept for requesters that stopped coming (DESIGN section 10).
pub const CACHE_RELEASE_CHUNK_TIMEOUTS: u64 = 10;
/// After a failed offer build, requests for the same checkpoint are answered with the failure's
/// reason for this many chunk round-trip timeouts before a new build is tried: a checkpoint that
/// cannot be read is not re-read for every request of every lagging replica.
pub const BUILD_RETRY_CHUNK_TIMEOUTS: u64 = 3;
/// Refused chunk requests are logged at most once per this many ticks (1 s at the default
/// 10 ms tick); the others are counted and the count is logged with the next line.
pub const REFUSAL_LOG_INTERVAL_TICKS: u64 = 100;

const _: () = assert!(
    STATE_CHUNK_SIZE_MAX_DEFAULT as usize + bus::HEADER_SIZE
        <= crate::limits::REPLICA_MESSAGE_SIZE_MAX as usize
);
const _: () = assert!(SERVED_EXPIRY_CHUNK_TIMEOUTS < IDLE_EXPIRY_CHUNK_TIMEOUTS);

/// Fixed parameters of the serving side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest chunk payload the server sends (bytes).
    pub chunk_size_max: u32,
    /// Largest replica-bus frame a receiver accepts (bytes, header included): a chunk's header +
    /// payload never exceeds it.
    pub frame_size_max: u32,
    /// Ticks a receiver waits for one chunk before it retries (the chunk round-trip timeout):
    /// a fully served transfer expires after [`SERVED_EXPIRY_CHUNK_TIMEOUTS`] of them, an idle
    /// one after [`IDLE_EXPIRY_CHUNK_TIMEOUTS`].
    pub chunk_timeout_ticks: u64,
}

/// One checkpoint generation's offer: its manifest and artifact bytes, built once and shared
/// (`Rc`) by every transfer of that generation.
#[derive(Debug)]
pub struct Offer {
    checkpoint_op: u64,
    manifest: Manifest,
    /// Artifact bytes, in the manifest's entry order.
    artifacts: Vec<Vec<u8>>,
}

impl Offer {
    /// Builds the offer of the checkpoint at `checkpoint_op` holding `metadata` and
    /// `client_table` (encodes the artifacts and checksums them: CPU work, the driver runs it off
    /// the reactor). The artifacts: [`ArtifactKind::Metadata`] is `metadata` as JSON,
    /// [`ArtifactKind::ClientTable`] the [`super::client_table_wire`] encoding.
    ///
    /// # Errors
    /// `OfferBuildError::ClientTable` when the client table breaks a wire rule (a damaged
    /// checkpoint): the host answers the waiting requesters with
    /// [`OfferBuildError::unavailable_reason`] through [`OfferServer::offer_built`].
    pub fn build(
        checkpoint_op: u64,
        metadata: &MetadataState,
        client_table: &ClientTableSnapshot,
    ) -> Result<Offer, OfferBuildError> {
        let metadata_json = serde_json::to_vec(metadata).expect("metadata serializes: plain data");
        let client_table = super::client_table_wire::encode(client_table)?;
        Ok(Offer::from_artifacts(
            checkpoint_op,
            vec![
                (ArtifactKind::Metadata, metadata_json),
                (ArtifactKind::ClientTable, client_table),
            ],
        ))
    }

    /// The offer of the checkpoint at `checkpoint_op` holding `artifacts` as given: its manifest
    /// has one entry per artifact, in this order, with `frontier_op = checkpoint_op`, the length
    /// in bytes and the XXH3-128 checksum.
    ///
    /// # Panics
    /// If an artifact is empty or a kind appears twice (the manifest codec refuses both; the
    /// caller built the artifacts, so this is its bug).
    pub fn from_artifacts(checkpoint_op: u64, artifacts: Vec<(ArtifactKind, Vec<u8>)>) -> Offer {
        let mut entries: Vec<ManifestEntry> = Vec::with_capacity(artifacts.len());
        let mut bytes = Vec::with_capacity(artifacts.len());
        for (kind, artifact) in artifacts {
            assert!(!artifact.is_empty(), "empty {} artifact", kind.name());
            assert!(
                entries.iter().all(|entry| entry.kind != kind),
                "duplicate {} artifact",
                kind.name()
            );
            entries.push(ManifestEntry {
                kind,
                frontier_op: checkpoint_op,
                len: artifact.len() as u64,
                checksum: XxHash3_128::oneshot(&artifact),
            });
            bytes.push(artifact);
        }
        Offer {
            checkpoint_op,
            manifest: Manifest { entries },
            artifacts: bytes,
        }
    }

    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The bytes of `kind`, if the offer has it.
    pub fn artifact(&self, kind: ArtifactKind) -> Option<&[u8]> {
        let index = self.artifact_index(kind)?;
        Some(&self.artifacts[index])
    }

    fn artifact_index(&self, kind: ArtifactKind) -> Option<usize> {
        self.manifest.entries.iter().position(|e| e.kind == kind)
    }
}

/// What the serving side asks its host (driver or simulator) to do.
#[derive(Debug)]
pub enum ServeOutput {
    /// Send `message` to replica `to`.
    Send { to: ReplicaIndex, message: Message },
    /// Build the offer of the checkpoint at `checkpoint_op` from the persisted checkpoint
    /// (read through io_uring, verified, [`Offer::build`] off the reactor) and hand it to
    /// [`OfferServer::offer_built`].
    BuildOffer { checkpoint_op: u64 },
}

/// Why an offer could not be built from a checkpoint that was read and verified.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OfferBuildError {
    /// The checkpoint's client table cannot be encoded for transfer (it breaks a rule the
    /// receiver's decoder enforces): the checkpoint is unusable for transfer until the next one.
    #[error("checkpoint client table: {0}")]
    ClientTable(#[from] ClientTableWireError),
}

impl OfferBuildError {
    /// What requesters are answered: `CheckpointUnreadable`.
    pub fn unavailable_reason(&self) -> UnavailableReason {
        match self {
            OfferBuildError::ClientTable(_) => UnavailableReason::CheckpointUnreadable,
        }
    }
}

/// Why a chunk request was refused (nothing is sent; logged rate-limited).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
enum ChunkRefusal {
    #[error(
        "no transfer with nonce {nonce} for this replica (expired, replaced, or never offered)"
    )]
    UnknownTransfer { nonce: u64 },
    #[error("artifact {} is not in the offer", .artifact.name())]
    ArtifactNotInOffer { artifact: ArtifactKind },
    #[error("a zero-length chunk request")]
    ZeroLength,
}

/// One transfer being served: the offer its nonce was answered with, and how much of it went out.
#[derive(Debug)]
struct Transfer {
    nonce: u64,
    offer: Rc<Offer>,
    /// Tick of the last `RequestStateTransfer` or `RequestStateChunk` of this transfer.
    last_request_tick: u64,
    /// Per artifact (manifest order): bytes `0..prefix` were all sent at least once. Receivers
    /// fetch sequentially, so a contiguous prefix is exact for them and conservative otherwise
    /// (the transfer then only expires later, as idle).
    served_prefix: Vec<u64>,
}

impl Transfer {
    fn new(nonce: u64, offer: Rc<Offer>, now: u64) -> Transfer {
        let served_prefix = vec![0; offer.artifacts.len()];
        Transfer {
            nonce,
            offer,
            last_request_tick: now,
            served_prefix,
        }
    }

    fn fully_served(&self) -> bool {
        self.served_prefix
            .iter()
            .zip(&self.offer.manifest.entries)
            .all(|(prefix, entry)| *prefix == entry.len)
    }

    /// Whether the transfer is dropped at `now` (issue 9 section 3: served after
    /// `SERVED_EXPIRY_CHUNK_TIMEOUTS`, idle after `IDLE_EXPIRY_CHUNK_TIMEOUTS`).
    fn expired(&self, now: u64, chunk_timeout_ticks: u64) -> bool {
        let timeouts = if self.fully_served() {
            SERVED_EXPIRY_CHUNK_TIMEOUTS
        } else {
            IDLE_EXPIRY_CHUNK_TIMEOUTS
        };
        now.saturating_sub(self.last_request_tick) >= timeouts.saturating_mul(chunk_timeout_ticks)
    }
}

/// The offer of the current generation, and when somebody last pulled from it.
#[derive(Debug)]
struct CachedOffer {
    offer: Rc<Offer>,
    last_pull_tick: u64,
}

/// The one offer build in flight: the host is building `building_op`; the requesters waiting
/// want `wanted_op` (newer when a checkpoint landed during the build: then `building_op` is
/// discarded when it completes and `wanted_op` is built next).
#[derive(Debug)]
struct PendingBuild {
    building_op: u64,
    wanted_op: u64,
    /// Requester -> the nonce it waits with.
    waiters: BTreeMap<ReplicaIndex, u64>,
}

/// The last failed build, answered from until `BUILD_RETRY_CHUNK_TIMEOUTS` passed.
#[derive(Debug, Clone, Copy)]
struct FailedBuild {
    checkpoint_op: u64,
    reason: UnavailableReason,
    at_tick: u64,
}

/// Rate limit of the refused-chunk log line.
#[derive(Debug, Default)]
struct RefusalLog {
    last_logged_tick: Option<u64>,
    suppressed_count: u64,
}

/// The serving side's state: cached offers by generation and the transfers being served.
#[derive(Debug)]
pub struct OfferServer {
    replica: ReplicaIndex,
    config: ServerConfig,
    cache: Option<CachedOffer>,
    build: Option<PendingBuild>,
    failed_build: Option<FailedBuild>,
    /// Keyed by requesting replica: at most one transfer each (issue 9 section 3).
    transfers: BTreeMap<ReplicaIndex, Transfer>,
    /// The last unavailable reason logged per requester (logged again only when it changes).
    unavailable_logged: BTreeMap<ReplicaIndex, UnavailableReason>,
    /// Lines logged for unavailable answers since start.
    unavailable_log_count: u64,
    refusal_log: RefusalLog,
    offers_built: u64,
    chunks_served: u64,
    bytes_served: u64,
    chunks_refused: u64,
}

impl OfferServer {
    /// The serving side of replica `replica` (named in its logs).
    ///
    /// # Panics
    /// If `config` cannot carry a one-byte chunk (`chunk_size_max` 0, or `frame_size_max` not
    /// above `bus::HEADER_SIZE`) or `chunk_timeout_ticks` is 0: startup validation refuses such a
    /// configuration (issue 9 section 5), so reaching here is a bug.
    pub fn new(replica: ReplicaIndex, config: ServerConfig) -> OfferServer {
        assert!(config.chunk_size_max > 0, "chunk_size_max 0");
        assert!(
            config.frame_size_max as usize > bus::HEADER_SIZE,
            "frame_size_max {} cannot carry a chunk byte",
            config.frame_size_max
        );
        assert!(config.chunk_timeout_ticks > 0, "chunk_timeout_ticks 0");
        OfferServer {
            replica,
            config,
            cache: None,
            build: None,
            failed_build: None,
            transfers: BTreeMap::new(),
            unavailable_logged: BTreeMap::new(),
            unavailable_log_count: 0,
            refusal_log: RefusalLog::default(),
            offers_built: 0,
            chunks_served: 0,
            bytes_served: 0,
            chunks_refused: 0,
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// `RequestStateTransfer{nonce}` from `from`; `availability` is the core's
    /// (`Replica::transfer_availability`), `view` the view to send answers in, `now` the tick.
    ///
    /// Rules (issue 9 section 3, DESIGN section 10), in order:
    /// - a nonce other than the one `from` holds replaces its stale transfer or wait;
    /// - unavailable: answer `Unavailable{reason}`, logged once per requester and reason (a
    ///   transfer `from` already holds keeps being served chunks: its offer is committed state);
    /// - first wins: the nonce of a transfer `from` holds gets that transfer's offer again, even
    ///   when a newer generation exists;
    /// - otherwise the offer of the core's checkpoint: the cached one, or (not yet built) a
    ///   [`ServeOutput::BuildOffer`] and the answer when built.
    pub fn on_request_transfer(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        availability: Availability,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        self.forget_stale_nonce(from, nonce);
        let checkpoint_op = match availability {
            Availability::Unavailable(reason) => {
                if let Some(build) = &mut self.build {
                    build.waiters.remove(&from);
                }
                return vec![self.refuse_transfer(from, nonce, reason, view)];
            }
            Availability::Available { checkpoint_op } => checkpoint_op,
        };
        if let Some(transfer) = self.transfers.get_mut(&from) {
            transfer.last_request_tick = now;
            let offer = Rc::clone(&transfer.offer);
            self.note_pull(&offer, now);
            return vec![self.answer_offer(from, nonce, &offer, view)];
        }
        self.serve_generation(from, nonce, checkpoint_op, view, now)
    }

    /// `RequestStateChunk` from `from`: at most `len` bytes of `artifact` from `offset`, of the
    /// offer of `from`'s transfer `nonce`. Sends one `StateChunk` whose payload length is
    /// [`OfferServer::chunk_len`] (never zero), or nothing: at or past the artifact's end, or
    /// refused (no such transfer, an artifact not in the offer, `len` 0; logged rate-limited).
    #[allow(clippy::too_many_arguments)]
    pub fn on_request_chunk(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        artifact: ArtifactKind,
        offset: u64,
        len: u32,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        let (offer, index) = match self.transfer_artifact(from, nonce, artifact, len) {
            Ok(found) => found,
            Err(refusal) => {
                self.refuse_chunk(from, refusal, now);
                return Vec::new();
            }
        };
        self.note_pull(&offer, now);
        let bytes = &offer.artifacts[index];
        let chunk_len = self.chunk_len(bytes.len() as u64, offset, len);
        let transfer = self
            .transfers
            .get_mut(&from)
            .expect("transfer_artifact found it");
        transfer.last_request_tick = now;
        if chunk_len == 0 {
            return Vec::new();
        }
        let start = offset as usize;
        let end = start + chunk_len as usize;
        if start <= transfer.served_prefix[index] as usize {
            transfer.served_prefix[index] = transfer.served_prefix[index].max(end as u64);
        }
        self.chunks_served += 1;
        self.bytes_served += u64::from(chunk_len);
        vec![ServeOutput::Send {
            to: from,
            message: Message::StateChunk {
                view,
                nonce,
                artifact,
                offset,
                payload: bytes[start..end].to_vec(),
            },
        }]
    }

    /// The payload length of a chunk of an artifact of `artifact_len` bytes requested at
    /// `offset` for at most `requested_len` bytes: `min(requested_len, chunk_size_max,
    /// frame_size_max - bus::HEADER_SIZE, artifact_len - offset)`, 0 (serve nothing) at or past
    /// the end (issue 9 section 3).
    ///
    /// Why the frame clamp matters: a frame over the receiver's `max_message_size` makes the
    /// receiving side refuse it and tear down the whole replica connection, so an unclamped chunk
    /// would not just fail the transfer, it would stall replication with that replica too.
    pub fn chunk_len(&self, artifact_len: u64, offset: u64, requested_len: u32) -> u32 {
        let frame_payload_max = self.config.frame_size_max as usize - bus::HEADER_SIZE;
        let left = artifact_len.saturating_sub(offset);
        u64::from(requested_len)
            .min(u64::from(self.config.chunk_size_max))
            .min(frame_payload_max as u64)
            .min(left) as u32
    }

    /// The outcome of a [`ServeOutput::BuildOffer`]: answers the requesters waiting for it, with
    /// the offer (cached as the generation's one `Rc`) or with `Unavailable{reason}` (logged;
    /// requests for that checkpoint are answered so for `BUILD_RETRY_CHUNK_TIMEOUTS`). The
    /// outcome of a build the server no longer waits for is ignored; one superseded by a newer
    /// checkpoint starts the build of the newer one.
    ///
    /// # Panics
    /// If an `Ok` offer is not of `checkpoint_op` (the host's bug).
    pub fn offer_built(
        &mut self,
        checkpoint_op: u64,
        result: Result<Offer, UnavailableReason>,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        let Some(mut build) = self
            .build
            .take_if(|build| build.building_op == checkpoint_op)
        else {
            tracing::debug!(
                replica = self.replica,
                checkpoint_op,
                "ignoring the outcome of an offer build nobody waits for"
            );
            return Vec::new();
        };
        if build.wanted_op != checkpoint_op {
            build.building_op = build.wanted_op;
            let wanted_op = build.wanted_op;
            self.build = Some(build);
            return vec![ServeOutput::BuildOffer {
                checkpoint_op: wanted_op,
            }];
        }
        match result {
            Ok(offer) => self.cache_built(offer, build.waiters, view, now),
            Err(reason) => self.fail_build(checkpoint_op, reason, build.waiters, view, now),
        }
    }

    /// One tick: expiry of served and idle transfers, release of the cached offer when nobody
    /// pulls (issue 9 section 3).
    pub fn on_tick(&mut self, now: u64) {
        let chunk_timeout_ticks = self.config.chunk_timeout_ticks;
        let replica = self.replica;
        self.transfers.retain(|from, transfer| {
            let expired = transfer.expired(now, chunk_timeout_ticks);
            if expired {
                tracing::debug!(
                    replica,
                    from,
                    nonce = transfer.nonce,
                    checkpoint_op = transfer.offer.checkpoint_op,
                    fully_served = transfer.fully_served(),
                    "state transfer expired"
                );
            }
            !expired
        });
        let release_ticks = CACHE_RELEASE_CHUNK_TIMEOUTS.saturating_mul(chunk_timeout_ticks);
        self.cache.take_if(|cache| {
            Rc::strong_count(&cache.offer) == 1
                && now.saturating_sub(cache.last_pull_tick) >= release_ticks
        });
        let retry_ticks = BUILD_RETRY_CHUNK_TIMEOUTS.saturating_mul(chunk_timeout_ticks);
        self.failed_build
            .take_if(|failed| now.saturating_sub(failed.at_tick) >= retry_ticks);
    }

    /// Transfers being served (at most one per requesting replica).
    pub fn transfer_count(&self) -> usize {
        self.transfers.len()
    }

    /// The offer `from`'s transfer serves, if it has one.
    pub fn transfer_offer(&self, from: ReplicaIndex) -> Option<&Rc<Offer>> {
        self.transfers.get(&from).map(|transfer| &transfer.offer)
    }

    /// The cached offer of the current generation, if one is cached.
    pub fn cached_offer(&self) -> Option<&Rc<Offer>> {
        self.cache.as_ref().map(|cache| &cache.offer)
    }

    /// The checkpoint op of the cached offer, if one is cached.
    pub fn cached_offer_op(&self) -> Option<u64> {
        self.cached_offer().map(|offer| offer.checkpoint_op)
    }

    /// The checkpoint op of the offer build in flight, if any.
    pub fn building_op(&self) -> Option<u64> {
        self.build.as_ref().map(|build| build.building_op)
    }

    /// Offers built and cached since start (one per generation served).
    pub fn offers_built(&self) -> u64 {
        self.offers_built
    }

    /// `StateChunk`s sent since start.
    pub fn chunks_served(&self) -> u64 {
        self.chunks_served
    }

    /// Payload bytes of the `StateChunk`s sent since start.
    pub fn bytes_served(&self) -> u64 {
        self.bytes_served
    }

    /// Chunk requests refused since start (no such transfer, artifact not in the offer, `len` 0).
    pub fn chunks_refused(&self) -> u64 {
        self.chunks_refused
    }

    /// Drops `from`'s transfer or wait under a nonce other than `nonce`: the requester moved on
    /// (rebooted, or gave up that attempt), so the stale entry is replaced.
    fn forget_stale_nonce(&mut self, from: ReplicaIndex, nonce: u64) {
        if self.transfers.get(&from).is_some_and(|t| t.nonce != nonce) {
            self.transfers.remove(&from);
        }
        if let Some(build) = &mut self.build
            && build
                .waiters
                .get(&from)
                .is_some_and(|waiting| *waiting != nonce)
        {
            build.waiters.remove(&from);
        }
    }

    /// Answers `from` with the offer of the checkpoint at `checkpoint_op`, or waits for its build.
    fn serve_generation(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        checkpoint_op: u64,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        if let Some(cache) = self
            .cache
            .as_ref()
            .filter(|c| c.offer.checkpoint_op == checkpoint_op)
        {
            let offer = Rc::clone(&cache.offer);
            return vec![self.start_transfer(from, nonce, offer, view, now)];
        }
        if let Some(failed) = self
            .failed_build
            .filter(|f| f.checkpoint_op == checkpoint_op)
        {
            return vec![self.refuse_transfer(from, nonce, failed.reason, view)];
        }
        // The cached offer (if any) is of an older generation: not served to new nonces; the
        // transfers holding it keep their `Rc`, the cache lets go of it.
        self.cache = None;
        match &mut self.build {
            Some(build) if build.wanted_op > checkpoint_op => {
                let reason = UnavailableReason::CheckpointBeingReplaced;
                vec![self.refuse_transfer(from, nonce, reason, view)]
            }
            Some(build) => {
                build.wanted_op = checkpoint_op;
                build.waiters.insert(from, nonce);
                Vec::new()
            }
            None => {
                self.build = Some(PendingBuild {
                    building_op: checkpoint_op,
                    wanted_op: checkpoint_op,
                    waiters: BTreeMap::from([(from, nonce)]),
                });
                vec![ServeOutput::BuildOffer { checkpoint_op }]
            }
        }
    }

    fn cache_built(
        &mut self,
        offer: Offer,
        waiters: BTreeMap<ReplicaIndex, u64>,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        let offer = Rc::new(offer);
        self.offers_built += 1;
        self.failed_build = None;
        tracing::info!(
            replica = self.replica,
            checkpoint_op = offer.checkpoint_op,
            bytes = offer.manifest.total_len(),
            requesters = waiters.len(),
            "state transfer offer built"
        );
        self.cache = Some(CachedOffer {
            offer: Rc::clone(&offer),
            last_pull_tick: now,
        });
        waiters
            .into_iter()
            .map(|(from, nonce)| self.start_transfer(from, nonce, Rc::clone(&offer), view, now))
            .collect()
    }

    fn fail_build(
        &mut self,
        checkpoint_op: u64,
        reason: UnavailableReason,
        waiters: BTreeMap<ReplicaIndex, u64>,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        tracing::warn!(
            replica = self.replica,
            checkpoint_op,
            %reason,
            requesters = waiters.len(),
            "state transfer offer build failed; refusing its requesters"
        );
        self.failed_build = Some(FailedBuild {
            checkpoint_op,
            reason,
            at_tick: now,
        });
        waiters
            .into_iter()
            .map(|(from, nonce)| self.refuse_transfer(from, nonce, reason, view))
            .collect()
    }

    /// Records `from`'s transfer `nonce` of `offer` and answers it.
    fn start_transfer(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        offer: Rc<Offer>,
        view: u32,
        now: u64,
    ) -> ServeOutput {
        self.note_pull(&offer, now);
        let answer = self.answer_offer(from, nonce, &offer, view);
        self.transfers
            .insert(from, Transfer::new(nonce, offer, now));
        answer
    }

    fn answer_offer(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        offer: &Offer,
        view: u32,
    ) -> ServeOutput {
        self.unavailable_logged.remove(&from);
        let target = TransferTarget::Available {
            checkpoint_op: offer.checkpoint_op,
            manifest: offer.manifest.clone(),
        };
        ServeOutput::Send {
            to: from,
            message: Message::StateTransferTarget {
                view,
                nonce,
                target,
            },
        }
    }

    /// `Unavailable{reason}` for `from`, logged once per requester and reason.
    fn refuse_transfer(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        reason: UnavailableReason,
        view: u32,
    ) -> ServeOutput {
        if self.unavailable_logged.insert(from, reason) != Some(reason) {
            self.unavailable_log_count += 1;
            tracing::info!(
                replica = self.replica,
                from,
                nonce,
                %reason,
                "not serving a state transfer"
            );
        }
        ServeOutput::Send {
            to: from,
            message: Message::StateTransferTarget {
                view,
                nonce,
                target: TransferTarget::Unavailable { reason },
            },
        }
    }

    /// The offer and artifact index a chunk request names, or why it is refused.
    fn transfer_artifact(
        &self,
        from: ReplicaIndex,
        nonce: u64,
        artifact: ArtifactKind,
        len: u32,
    ) -> Result<(Rc<Offer>, usize), ChunkRefusal> {
        let transfer = self
            .transfers
            .get(&from)
            .filter(|transfer| transfer.nonce == nonce)
            .ok_or(ChunkRefusal::UnknownTransfer { nonce })?;
        let index = transfer
            .offer
            .artifact_index(artifact)
            .ok_or(ChunkRefusal::ArtifactNotInOffer { artifact })?;
        if len == 0 {
            return Err(ChunkRefusal::ZeroLength);
        }
        Ok((Rc::clone(&transfer.offer), index))
    }

    fn refuse_chunk(&mut self, from: ReplicaIndex, refusal: ChunkRefusal, now: u64) {
        self.chunks_refused += 1;
        let log = &mut self.refusal_log;
        let due = log
            .last_logged_tick
            .is_none_or(|last| now.saturating_sub(last) >= REFUSAL_LOG_INTERVAL_TICKS);
        if !due {
            log.suppressed_count += 1;
            return;
        }
        tracing::warn!(
            replica = self.replica,
            from,
            %refusal,
            suppressed_since_last = log.suppressed_count,
            "refusing a state chunk request"
        );
        log.last_logged_tick = Some(now);
        log.suppressed_count = 0;
    }

    /// Somebody pulled from `offer` at `now`: the cache of its generation is not released yet.
    fn note_pull(&mut self, offer: &Rc<Offer>, now: u64) {
        if let Some(cache) = self
            .cache
            .as_mut()
            .filter(|cache| Rc::ptr_eq(&cache.offer, offer))
        {
            cache.last_pull_tick = now;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::rc::{Rc, Weak};

    use super::*;

    const TIMEOUT_TICKS: u64 = 10;
    const VIEW: u32 = 3;

    fn config() -> ServerConfig {
        ServerConfig {
            chunk_size_max: 8,
            frame_size_max: (bus::HEADER_SIZE + 1024) as u32,
            chunk_timeout_ticks: TIMEOUT_TICKS,
        }
    }

    /// Artifact bytes that differ per checkpoint op and kind.
    fn artifact_bytes(checkpoint_op: u64, kind: ArtifactKind, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u64 + checkpoint_op * 7 + kind as u64 * 13) as u8)
            .collect()
    }

    /// An offer of a 20-byte metadata artifact and a 5-byte client-table artifact.
    fn offer(checkpoint_op: u64) -> Offer {
        Offer::from_artifacts(
            checkpoint_op,
            vec![
                (
                    ArtifactKind::Metadata,
                    artifact_bytes(checkpoint_op, ArtifactKind::Metadata, 20),
                ),
                (
                    ArtifactKind::ClientTable,
                    artifact_bytes(checkpoint_op, ArtifactKind::ClientTable, 5),
                ),
            ],
        )
    }

    fn available(checkpoint_op: u64) -> Availability {
        Availability::Available { checkpoint_op }
    }

    /// The `(to, nonce, target)` of every `StateTransferTarget` in `outputs`.
    fn targets(outputs: &[ServeOutput]) -> Vec<(ReplicaIndex, u64, TransferTarget)> {
        outputs
            .iter()
            .filter_map(|output| match output {
                ServeOutput::Send {
                    to,
                    message:
                        Message::StateTransferTarget {
                            view,
                            nonce,
                            target,
                        },
                } => {
                    assert_eq!(*view, VIEW);
                    Some((*to, *nonce, target.clone()))
                }
                _ => None,
            })
            .collect()
    }

    fn builds(outputs: &[ServeOutput]) -> Vec<u64> {
        outputs
            .iter()
            .filter_map(|output| match output {
                ServeOutput::BuildOffer { checkpoint_op } => Some(*checkpoint_op),
                ServeOutput::Send { .. } => None,
            })
            .collect()
    }

    /// The `(offset, payload)` of the one `StateChunk` in `outputs`, `None` if nothing was sent.
    fn chunk(outputs: &[ServeOutput]) -> Option<(u64, Vec<u8>)> {
        assert!(outputs.len() <= 1, "{outputs:?}");
        outputs.first().map(|output| match output {
            ServeOutput::Send {
                message:
                    Message::StateChunk {
                        offset, payload, ..
                    },
                ..
            } => (*offset, payload.clone()),
            other => panic!("not a chunk: {other:?}"),
        })
    }

    fn checkpoint_of(target: &TransferTarget) -> u64 {
        match target {
            TransferTarget::Available { checkpoint_op, .. } => *checkpoint_op,
            TransferTarget::Unavailable { reason } => panic!("unavailable: {reason}"),
        }
    }

    /// A server whose cache holds the built offer of `checkpoint_op`, with `from`'s transfer
    /// `nonce` of it started at tick 0.
    fn serving(from: ReplicaIndex, nonce: u64, checkpoint_op: u64) -> OfferServer {
        let mut server = OfferServer::new(0, config());
        let out = server.on_request_transfer(from, nonce, available(checkpoint_op), VIEW, 0);
        assert_eq!(builds(&out), vec![checkpoint_op]);
        let out = server.offer_built(checkpoint_op, Ok(offer(checkpoint_op)), VIEW, 0);
        assert_eq!(targets(&out).len(), 1);
        server
    }

    /// Fetches every artifact of `from`'s transfer `nonce` sequentially, `len` at a time.
    fn fetch_all(
        server: &mut OfferServer,
        from: ReplicaIndex,
        nonce: u64,
        len: u32,
        now: u64,
    ) -> Vec<(ArtifactKind, Vec<u8>)> {
        ArtifactKind::ALL
            .iter()
            .map(|&kind| {
                let mut bytes = Vec::new();
                while let Some((offset, payload)) = chunk(&server.on_request_chunk(
                    from,
                    nonce,
                    kind,
                    bytes.len() as u64,
                    len,
                    VIEW,
                    now,
                )) {
                    assert_eq!(offset, bytes.len() as u64);
                    assert!(!payload.is_empty());
                    bytes.extend_from_slice(&payload);
                }
                (kind, bytes)
            })
            .collect()
    }

    #[test]
    fn issue9_offer_manifest_lists_each_artifact_with_len_and_xxh3_128() {
        let offer = offer(16);
        assert_eq!(offer.checkpoint_op(), 16);
        let metadata = artifact_bytes(16, ArtifactKind::Metadata, 20);
        let clients = artifact_bytes(16, ArtifactKind::ClientTable, 5);
        let expected = Manifest {
            entries: vec![
                ManifestEntry {
                    kind: ArtifactKind::Metadata,
                    frontier_op: 16,
                    len: 20,
                    checksum: XxHash3_128::oneshot(&metadata),
                },
                ManifestEntry {
                    kind: ArtifactKind::ClientTable,
                    frontier_op: 16,
                    len: 5,
                    checksum: XxHash3_128::oneshot(&clients),
                },
            ],
        };
        assert_eq!(offer.manifest(), &expected);
        assert_eq!(offer.artifact(ArtifactKind::Metadata), Some(&metadata[..]));
        assert_eq!(
            offer.artifact(ArtifactKind::ClientTable),
            Some(&clients[..])
        );
    }

    #[test]
    fn issue9_offer_build_encodes_metadata_json_and_client_table_wire() {
        let mut metadata = MetadataState::new();
        metadata.op = 8;
        let mut table = crate::vsr::client_table::ClientTable::new(4);
        table.register(0xabc, 3);
        let client_table = table.to_snapshot();
        let offer = Offer::build(8, &metadata, &client_table).expect("builds");
        assert_eq!(offer.checkpoint_op(), 8);
        let kinds: Vec<ArtifactKind> = offer.manifest().entries.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, ArtifactKind::ALL);
        let metadata_bytes = offer.artifact(ArtifactKind::Metadata).unwrap();
        let decoded: MetadataState = serde_json::from_slice(metadata_bytes).unwrap();
        assert_eq!(decoded, metadata);
        let clients_bytes = offer.artifact(ArtifactKind::ClientTable).unwrap();
        assert_eq!(
            super::super::client_table_wire::decode(clients_bytes, 4),
            Ok(client_table)
        );
        for entry in &offer.manifest().entries {
            let bytes = offer.artifact(entry.kind).unwrap();
            assert_eq!(entry.checksum, XxHash3_128::oneshot(bytes));
        }
    }

    #[test]
    fn issue9_offer_build_of_a_damaged_client_table_is_checkpoint_unreadable() {
        let mut client_table = crate::vsr::client_table::ClientTable::new(4).to_snapshot();
        client_table
            .sessions
            .push(crate::vsr::client_table::SessionSnapshot {
                client: "not hex".into(),
                session: 1,
                request: 0,
                commit_op: 1,
                replies: Vec::new(),
            });
        let error = Offer::build(8, &MetadataState::new(), &client_table).unwrap_err();
        assert!(matches!(error, OfferBuildError::ClientTable(_)), "{error}");
        assert_eq!(
            error.unavailable_reason(),
            UnavailableReason::CheckpointUnreadable
        );
    }

    #[test]
    fn issue9_unavailable_answered_with_reason_and_logged_once_per_requester() {
        let mut server = OfferServer::new(0, config());
        let reason = UnavailableReason::NoCheckpointYet;
        for nonce in [1, 2] {
            let out =
                server.on_request_transfer(1, nonce, Availability::Unavailable(reason), VIEW, 0);
            assert_eq!(
                targets(&out),
                vec![(1, nonce, TransferTarget::Unavailable { reason })]
            );
            assert_eq!(out.len(), 1);
        }
        assert_eq!(server.unavailable_logged.get(&1), Some(&reason));
        assert_eq!(
            server.unavailable_log_count, 1,
            "logged once for two requests"
        );
        // Another requester is logged on its own; a changed reason is logged again.
        let other = UnavailableReason::NotPrimary;
        let out = server.on_request_transfer(2, 1, Availability::Unavailable(reason), VIEW, 0);
        assert_eq!(targets(&out)[0].2, TransferTarget::Unavailable { reason });
        server.on_request_transfer(1, 3, Availability::Unavailable(other), VIEW, 0);
        assert_eq!(server.unavailable_logged.get(&1), Some(&other));
        assert_eq!(server.unavailable_logged.get(&2), Some(&reason));
        assert_eq!(server.unavailable_log_count, 3);
        assert_eq!(server.transfer_count(), 0);
        assert_eq!(server.building_op(), None);
    }

    #[test]
    fn issue9_failed_offer_build_answers_waiters_checkpoint_unreadable() {
        let mut server = OfferServer::new(0, config());
        assert_eq!(
            builds(&server.on_request_transfer(1, 11, available(8), VIEW, 0)),
            vec![8]
        );
        assert!(
            server
                .on_request_transfer(2, 22, available(8), VIEW, 1)
                .is_empty()
        );
        let reason = UnavailableReason::CheckpointUnreadable;
        let out = server.offer_built(8, Err(reason), VIEW, 2);
        assert_eq!(
            targets(&out),
            vec![
                (1, 11, TransferTarget::Unavailable { reason }),
                (2, 22, TransferTarget::Unavailable { reason }),
            ]
        );
        assert_eq!(server.offers_built(), 0);
        assert_eq!(server.cached_offer_op(), None);
        assert_eq!(server.transfer_count(), 0);
        // Not rebuilt for every request: the failure answers until the retry backoff passed.
        let out = server.on_request_transfer(1, 12, available(8), VIEW, 3);
        assert_eq!(
            targets(&out),
            vec![(1, 12, TransferTarget::Unavailable { reason })]
        );
        assert!(builds(&out).is_empty());
        server.on_tick(2 + BUILD_RETRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS);
        let out = server.on_request_transfer(1, 13, available(8), VIEW, 40);
        assert_eq!(builds(&out), vec![8]);
    }

    #[test]
    fn issue9_new_checkpoint_during_build_builds_the_newest_generation_once() {
        let mut server = OfferServer::new(0, config());
        assert_eq!(
            builds(&server.on_request_transfer(1, 11, available(8), VIEW, 0)),
            vec![8]
        );
        // The core checkpointed at 16 while 8 was being built: no second build in flight.
        assert!(
            server
                .on_request_transfer(2, 22, available(16), VIEW, 1)
                .is_empty()
        );
        assert_eq!(server.building_op(), Some(8));
        // 8 completes: discarded, 16 is built next, and every waiter gets 16.
        let out = server.offer_built(8, Ok(offer(8)), VIEW, 2);
        assert_eq!(builds(&out), vec![16]);
        assert!(targets(&out).is_empty());
        assert_eq!(server.cached_offer_op(), None);
        let out = server.offer_built(16, Ok(offer(16)), VIEW, 3);
        let answered: Vec<(ReplicaIndex, u64, u64)> = targets(&out)
            .iter()
            .map(|(to, nonce, target)| (*to, *nonce, checkpoint_of(target)))
            .collect();
        assert_eq!(answered, vec![(1, 11, 16), (2, 22, 16)]);
        assert_eq!(server.offers_built(), 1);
        // A late duplicate outcome of a build nobody waits for changes nothing.
        assert!(server.offer_built(8, Ok(offer(8)), VIEW, 4).is_empty());
        assert_eq!(server.cached_offer_op(), Some(16));
    }

    #[test]
    fn issue9_request_older_than_pending_build_answered_checkpoint_being_replaced() {
        let mut server = OfferServer::new(0, config());
        server.on_request_transfer(1, 11, available(16), VIEW, 0);
        let out = server.on_request_transfer(2, 22, available(8), VIEW, 1);
        let reason = UnavailableReason::CheckpointBeingReplaced;
        assert_eq!(
            targets(&out),
            vec![(2, 22, TransferTarget::Unavailable { reason })]
        );
        assert!(builds(&out).is_empty());
    }

    #[test]
    fn issue9_one_offer_per_generation_shared_by_requesters() {
        let mut server = OfferServer::new(0, config());
        let mut build_count = 0;
        for from in 1..=3 {
            build_count +=
                builds(&server.on_request_transfer(from, 100, available(8), VIEW, 0)).len();
        }
        assert_eq!(build_count, 1, "one BuildOffer while pending");
        let out = server.offer_built(8, Ok(offer(8)), VIEW, 1);
        assert_eq!(targets(&out).len(), 3);
        // A requester after the build is served from the cache, without a build.
        assert!(builds(&server.on_request_transfer(4, 100, available(8), VIEW, 2)).is_empty());
        assert_eq!(server.offers_built(), 1);
        let cached = server.cached_offer().expect("cached").clone();
        for from in 1..=4 {
            assert!(Rc::ptr_eq(server.transfer_offer(from).unwrap(), &cached));
        }
        assert_eq!(
            Rc::strong_count(&cached),
            6,
            "cache + 4 transfers + this test"
        );
    }

    #[test]
    fn issue9_new_generation_drops_old_offer_when_no_transfer_holds_it() {
        let mut server = serving(1, 11, 8);
        let old: Weak<Offer> = Rc::downgrade(server.cached_offer().unwrap());
        // A new checkpoint: a new requester gets the new generation, not the cached old offer.
        let out = server.on_request_transfer(2, 22, available(16), VIEW, 1);
        assert_eq!(builds(&out), vec![16]);
        assert!(targets(&out).is_empty());
        let out = server.offer_built(16, Ok(offer(16)), VIEW, 1);
        assert_eq!(checkpoint_of(&targets(&out)[0].2), 16);
        assert_eq!(server.cached_offer_op(), Some(16));
        // Replica 1's transfer still holds generation 8 ...
        assert!(old.upgrade().is_some());
        // ... until it expires (idle: it fetched nothing).
        server.on_tick(IDLE_EXPIRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS);
        assert!(server.transfer_offer(1).is_none());
        assert!(old.upgrade().is_none(), "generation 8 dropped");
        assert_eq!(server.offers_built(), 2);
    }

    #[test]
    fn issue9_first_wins_per_nonce() {
        let mut server = serving(1, 11, 8);
        let first = Rc::clone(server.transfer_offer(1).unwrap());
        // A newer generation exists and is cached.
        server.on_request_transfer(2, 22, available(16), VIEW, 1);
        server.offer_built(16, Ok(offer(16)), VIEW, 1);
        // The repeated request with the same nonce gets the same (older) offer, no build.
        let out = server.on_request_transfer(1, 11, available(16), VIEW, 2);
        assert_eq!(out.len(), 1);
        let (to, nonce, target) = targets(&out).remove(0);
        assert_eq!((to, nonce), (1, 11));
        assert_eq!(
            target,
            TransferTarget::Available {
                checkpoint_op: 8,
                manifest: first.manifest().clone(),
            }
        );
        assert!(Rc::ptr_eq(server.transfer_offer(1).unwrap(), &first));
        assert_eq!(server.transfer_count(), 2);
    }

    #[test]
    fn issue9_fresh_nonce_replaces_stale_transfer() {
        let mut server = serving(1, 11, 8);
        // The requester rebooted: its fresh nonce replaces the stale transfer.
        let out = server.on_request_transfer(1, 12, available(8), VIEW, 1);
        assert_eq!(targets(&out)[0].1, 12);
        assert_eq!(server.transfer_count(), 1);
        assert!(
            chunk(&server.on_request_chunk(1, 11, ArtifactKind::Metadata, 0, 4, VIEW, 2)).is_none()
        );
        assert!(
            chunk(&server.on_request_chunk(1, 12, ArtifactKind::Metadata, 0, 4, VIEW, 2)).is_some()
        );
        // A fresh nonce that gets a refusal also drops the stale entry.
        let reason = UnavailableReason::ViewChange;
        server.on_request_transfer(1, 13, Availability::Unavailable(reason), VIEW, 3);
        assert_eq!(server.transfer_count(), 0);
    }

    #[test]
    fn issue9_every_chunk_comes_from_the_transfers_offer() {
        let mut server = serving(1, 11, 8);
        server.on_request_transfer(2, 22, available(16), VIEW, 1);
        server.offer_built(16, Ok(offer(16)), VIEW, 1);
        for (from, nonce, checkpoint_op) in [(1, 11, 8), (2, 22, 16)] {
            let fetched = fetch_all(&mut server, from, nonce, 3, 2);
            let manifest = offer(checkpoint_op).manifest().clone();
            for (kind, bytes) in fetched {
                let entry = manifest.entry(kind).unwrap();
                assert_eq!(bytes.len() as u64, entry.len);
                assert_eq!(XxHash3_128::oneshot(&bytes), entry.checksum, "{kind:?}");
            }
        }
        assert_eq!(server.bytes_served(), 2 * 25);
        assert_eq!(server.chunks_served(), 2 * (7 + 2));
    }

    #[test]
    fn issue9_chunk_clamped_to_bus_limit() {
        let frame_size_max = (bus::HEADER_SIZE + 6) as u32;
        let mut server = OfferServer::new(
            0,
            ServerConfig {
                chunk_size_max: 1 << 20,
                frame_size_max,
                chunk_timeout_ticks: TIMEOUT_TICKS,
            },
        );
        server.on_request_transfer(1, 11, available(8), VIEW, 0);
        server.offer_built(8, Ok(offer(8)), VIEW, 0);
        let (offset, payload) =
            chunk(&server.on_request_chunk(1, 11, ArtifactKind::Metadata, 0, u32::MAX, VIEW, 1))
                .unwrap();
        assert_eq!(offset, 0);
        assert_eq!(payload, artifact_bytes(8, ArtifactKind::Metadata, 20)[..6]);
        assert!(bus::HEADER_SIZE + payload.len() <= frame_size_max as usize);
    }

    #[test]
    fn issue9_chunk_clamped_to_chunk_size_request_and_bytes_left() {
        let mut server = serving(1, 11, 8);
        let metadata = artifact_bytes(8, ArtifactKind::Metadata, 20);
        let request = |server: &mut OfferServer, offset, len| {
            chunk(&server.on_request_chunk(1, 11, ArtifactKind::Metadata, offset, len, VIEW, 1))
                .unwrap()
                .1
        };
        // chunk_size_max (8) binds.
        assert_eq!(request(&mut server, 0, 100), metadata[0..8]);
        // The requested length binds.
        assert_eq!(request(&mut server, 8, 3), metadata[8..11]);
        // The bytes left bind.
        assert_eq!(request(&mut server, 17, 100), metadata[17..20]);
        assert_eq!(server.chunk_len(20, 19, 100), 1);
    }

    #[test]
    fn issue9_no_zero_byte_chunk_at_or_past_end() {
        let mut server = serving(1, 11, 8);
        for offset in [20, 21, u64::MAX] {
            let out = server.on_request_chunk(1, 11, ArtifactKind::Metadata, offset, 8, VIEW, 1);
            assert!(out.is_empty(), "offset {offset}: {out:?}");
        }
        assert_eq!(server.chunks_served(), 0);
        assert_eq!(server.chunks_refused(), 0, "past the end is not a refusal");
    }

    #[test]
    fn issue9_chunk_request_outside_a_transfer_refused() {
        let mut server = OfferServer::new(0, config());
        server.on_request_transfer(1, 11, available(8), VIEW, 0);
        server.offer_built(
            8,
            Ok(Offer::from_artifacts(
                8,
                vec![(ArtifactKind::Metadata, vec![1; 4])],
            )),
            VIEW,
            0,
        );
        let refused = [
            (1, 99, ArtifactKind::Metadata, 4),    // unknown nonce
            (2, 11, ArtifactKind::Metadata, 4),    // requester without a transfer
            (1, 11, ArtifactKind::ClientTable, 4), // artifact not in the offer
            (1, 11, ArtifactKind::Metadata, 0),    // zero length
        ];
        for (from, nonce, artifact, len) in refused {
            let out = server.on_request_chunk(from, nonce, artifact, 0, len, VIEW, 1);
            assert!(out.is_empty(), "{out:?}");
        }
        assert_eq!(server.chunks_refused(), 4);
        // Logged once, the rest counted until the interval passed.
        assert_eq!(server.refusal_log.last_logged_tick, Some(1));
        assert_eq!(server.refusal_log.suppressed_count, 3);
        server.on_request_chunk(
            2,
            11,
            ArtifactKind::Metadata,
            0,
            4,
            VIEW,
            1 + REFUSAL_LOG_INTERVAL_TICKS,
        );
        assert_eq!(server.refusal_log.suppressed_count, 0);
        assert_eq!(server.chunks_served(), 0);
    }

    #[test]
    fn issue9_served_transfer_expires_after_short_grace() {
        let mut server = serving(1, 11, 8);
        fetch_all(&mut server, 1, 11, 8, 5);
        let grace = SERVED_EXPIRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS;
        server.on_tick(5 + grace - 1);
        assert_eq!(server.transfer_count(), 1);
        server.on_tick(5 + grace);
        assert_eq!(server.transfer_count(), 0);
    }

    #[test]
    fn issue9_idle_transfer_expires_after_long_grace() {
        let mut server = serving(1, 11, 8);
        // Part of the metadata fetched, then the requester stops.
        chunk(&server.on_request_chunk(1, 11, ArtifactKind::Metadata, 0, 8, VIEW, 5)).unwrap();
        server.on_tick(5 + SERVED_EXPIRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS);
        assert_eq!(
            server.transfer_count(),
            1,
            "not fully served: no short grace"
        );
        let idle = IDLE_EXPIRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS;
        server.on_tick(5 + idle - 1);
        assert_eq!(server.transfer_count(), 1);
        server.on_tick(5 + idle);
        assert_eq!(server.transfer_count(), 0);
    }

    #[test]
    fn issue9_cache_released_when_nobody_pulls() {
        let mut server = serving(1, 11, 8);
        let weak = Rc::downgrade(server.cached_offer().unwrap());
        fetch_all(&mut server, 1, 11, 8, 5);
        let release = CACHE_RELEASE_CHUNK_TIMEOUTS * TIMEOUT_TICKS;
        // The transfer expired (served) but the cache stays while pulls are recent.
        server.on_tick(5 + SERVED_EXPIRY_CHUNK_TIMEOUTS * TIMEOUT_TICKS);
        assert_eq!(server.transfer_count(), 0);
        assert_eq!(server.cached_offer_op(), Some(8));
        server.on_tick(5 + release - 1);
        assert_eq!(server.cached_offer_op(), Some(8));
        server.on_tick(5 + release);
        assert_eq!(server.cached_offer_op(), None);
        assert!(weak.upgrade().is_none());
        // The next requester makes the host build it again.
        let out = server.on_request_transfer(2, 22, available(8), VIEW, 200);
        assert_eq!(builds(&out), vec![8]);
    }

    #[test]
    fn issue9_cache_held_while_a_transfer_holds_it() {
        let mut server = serving(1, 11, 8);
        // The transfer pulls one chunk per short while; the cache stays past the release time.
        for now in
            (0..=2 * CACHE_RELEASE_CHUNK_TIMEOUTS * TIMEOUT_TICKS).step_by(TIMEOUT_TICKS as usize)
        {
            server.on_request_chunk(1, 11, ArtifactKind::Metadata, 0, 1, VIEW, now);
            server.on_tick(now);
        }
        assert_eq!(server.cached_offer_op(), Some(8));
        assert_eq!(server.transfer_count(), 1);
    }

    #[test]
    fn issue9_fresh_nonce_while_waiting_for_a_build_is_answered_once_with_it() {
        let mut server = OfferServer::new(0, config());
        server.on_request_transfer(1, 11, available(8), VIEW, 0);
        assert!(
            server
                .on_request_transfer(1, 12, available(8), VIEW, 1)
                .is_empty()
        );
        // A refused request drops the wait of its requester.
        let reason = UnavailableReason::ViewChange;
        server.on_request_transfer(2, 21, Availability::Unavailable(reason), VIEW, 1);
        let out = server.offer_built(8, Ok(offer(8)), VIEW, 2);
        let answered: Vec<(ReplicaIndex, u64)> = targets(&out)
            .iter()
            .map(|(to, nonce, _)| (*to, *nonce))
            .collect();
        assert_eq!(answered, vec![(1, 12)]);
        assert_eq!(server.transfer_count(), 1);
    }

    mod properties {
        use std::collections::BTreeMap;

        use proptest::prelude::*;

        use super::*;

        /// A fixed seed unless `PROPTEST_RNG_SEED` overrides it: a failure reproduces.
        fn proptest_config() -> ProptestConfig {
            let mut config = ProptestConfig::with_cases(256);
            if matches!(config.rng_seed, proptest::test_runner::RngSeed::Random) {
                config.rng_seed = proptest::test_runner::RngSeed::Fixed(0x0009_5e7e);
            }
            config.failure_persistence = None;
            config
        }

        #[derive(Debug, Clone)]
        enum Event {
            Transfer {
                from: ReplicaIndex,
                nonce: u64,
                checkpoint_op: Option<u64>,
            },
            Chunk {
                from: ReplicaIndex,
                nonce: u64,
                artifact: ArtifactKind,
                offset: u64,
                len: u32,
            },
            /// The host completes the pending build (`stale`: an outcome for another op).
            Built {
                ok: bool,
                stale: bool,
            },
            Tick {
                ticks: u64,
            },
        }

        fn event() -> impl Strategy<Value = Event> {
            let from = 1u8..4;
            let nonce = 0u64..3;
            let op = prop::option::weighted(0.8, prop::sample::select(vec![8u64, 16, 24]));
            let artifact = prop::sample::select(ArtifactKind::ALL.to_vec());
            let offset = prop_oneof![0u64..30, Just(u64::MAX)];
            let len = prop_oneof![0u32..12, Just(u32::MAX)];
            prop_oneof![
                1 => (from.clone(), nonce.clone(), op).prop_map(|(from, nonce, checkpoint_op)| {
                    Event::Transfer {
                        from,
                        nonce,
                        checkpoint_op,
                    }
                }),
                3 => (from, nonce, artifact, offset, len).prop_map(
                    |(from, nonce, artifact, offset, len)| Event::Chunk {
                        from,
                        nonce,
                        artifact,
                        offset,
                        len,
                    }
                ),
                1 => (any::<bool>(), prop::bool::weighted(0.1))
                    .prop_map(|(ok, stale)| Event::Built { ok, stale }),
                1 => (0u64..40).prop_map(|ticks| Event::Tick { ticks }),
            ]
        }

        /// What the host saw: the op each (requester, nonce) was last offered, the build in
        /// flight.
        #[derive(Default)]
        struct Host {
            offered: BTreeMap<(ReplicaIndex, u64), u64>,
            building: Option<u64>,
        }

        impl Host {
            /// Checks every output of one call against the rules.
            fn check(&mut self, outputs: &[ServeOutput], request_len: Option<u32>) {
                for output in outputs {
                    match output {
                        ServeOutput::BuildOffer { checkpoint_op } => {
                            assert_eq!(self.building, None, "a second build in flight");
                            self.building = Some(*checkpoint_op);
                        }
                        ServeOutput::Send { to, message } => {
                            self.check_send(*to, message, request_len);
                        }
                    }
                }
            }

            fn check_send(
                &mut self,
                to: ReplicaIndex,
                message: &Message,
                request_len: Option<u32>,
            ) {
                match message {
                    Message::StateTransferTarget {
                        nonce,
                        target:
                            TransferTarget::Available {
                                checkpoint_op,
                                manifest,
                            },
                        ..
                    } => {
                        assert_eq!(manifest, offer(*checkpoint_op).manifest());
                        self.offered.insert((to, *nonce), *checkpoint_op);
                    }
                    Message::StateTransferTarget { .. } => {}
                    Message::StateChunk {
                        nonce,
                        artifact,
                        offset,
                        payload,
                        ..
                    } => {
                        let op = self.offered[&(to, *nonce)];
                        let bytes = offer(op).artifact(*artifact).unwrap().to_vec();
                        assert!(!payload.is_empty(), "zero-byte chunk");
                        assert!(payload.len() as u64 <= u64::from(request_len.unwrap()));
                        assert!(payload.len() <= config().chunk_size_max as usize);
                        let start = *offset as usize;
                        assert_eq!(payload[..], bytes[start..start + payload.len()]);
                    }
                    other => panic!("the server sent {other:?}"),
                }
            }
        }

        proptest! {
            #![proptest_config(proptest_config())]

            /// Any sequence of requests, build outcomes and ticks: no panic, one build in flight
            /// at most, every chunk non-empty, clamped, and the bytes of the offer its nonce was
            /// answered with.
            #[test]
            fn issue9_any_request_sequence_serves_only_offered_bytes(
                events in prop::collection::vec(event(), 1..80),
            ) {
                let mut server = OfferServer::new(0, config());
                let mut host = Host::default();
                let mut now = 0;
                for event in events {
                    match event {
                        Event::Transfer { from, nonce, checkpoint_op } => {
                            let availability = checkpoint_op.map_or(
                                Availability::Unavailable(UnavailableReason::NotCaughtUp),
                                available,
                            );
                            let out = server.on_request_transfer(from, nonce, availability, VIEW, now);
                            host.check(&out, None);
                        }
                        Event::Chunk { from, nonce, artifact, offset, len } => {
                            let out = server.on_request_chunk(from, nonce, artifact, offset, len, VIEW, now);
                            prop_assert!(out.len() <= 1);
                            host.check(&out, Some(len));
                        }
                        Event::Built { ok, stale } => {
                            let Some(op) = host.building else { continue };
                            let op = if stale { op + 1 } else { op };
                            if !stale {
                                host.building = None;
                            }
                            let result = if ok {
                                Ok(offer(op))
                            } else {
                                Err(UnavailableReason::CheckpointUnreadable)
                            };
                            let out = server.offer_built(op, result, VIEW, now);
                            host.check(&out, None);
                        }
                        Event::Tick { ticks } => {
                            now += ticks;
                            server.on_tick(now);
                        }
                    }
                    prop_assert!(server.transfer_count() <= 3);
                    prop_assert_eq!(server.building_op(), host.building);
                }
            }
        }
    }
}
