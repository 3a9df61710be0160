//! The serving side of state transfer on shard 0 (DESIGN section 10, issue 9 section 3).
//! FOUNDATION STUB: the serving helper fills this in.

use std::rc::Rc;

use super::{ArtifactKind, Availability, Manifest, UnavailableReason};
use crate::metadata::MetadataState;
use crate::vsr::client_table::ClientTableSnapshot;
use crate::vsr::message::{Message, ReplicaIndex};

/// Fixed parameters of the serving side.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerConfig {
    /// Largest chunk payload the server sends (bytes).
    pub chunk_size_max: u32,
    /// Largest replica-bus frame a receiver accepts (bytes, header included): a chunk's header +
    /// payload never exceeds it.
    pub frame_size_max: u32,
    /// Ticks a receiver waits for one chunk before it retries (the chunk round-trip timeout):
    /// a fully served offer expires after 3x, an idle one after 10x.
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
    /// the reactor).
    pub fn build(
        checkpoint_op: u64,
        metadata: &MetadataState,
        client_table: &ClientTableSnapshot,
    ) -> Offer {
        let _ = (checkpoint_op, metadata, client_table);
        todo!("serving helper")
    }

    pub fn checkpoint_op(&self) -> u64 {
        self.checkpoint_op
    }

    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// The bytes of `kind`, if the offer has it.
    pub fn artifact(&self, kind: ArtifactKind) -> Option<&[u8]> {
        let index = self.manifest.entries.iter().position(|e| e.kind == kind)?;
        Some(&self.artifacts[index])
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

/// The serving side's state: cached offers by generation and the transfers being served.
#[derive(Debug)]
pub struct OfferServer {
    config: ServerConfig,
    _offer: Option<Rc<Offer>>,
}

impl OfferServer {
    pub fn new(replica: ReplicaIndex, config: ServerConfig) -> OfferServer {
        let _ = replica;
        OfferServer {
            config,
            _offer: None,
        }
    }

    pub fn config(&self) -> &ServerConfig {
        &self.config
    }

    /// `RequestStateTransfer{nonce}` from `from`; `availability` is the core's
    /// (`Replica::transfer_availability`), `view` the view to send answers in, `now` the tick.
    pub fn on_request_transfer(
        &mut self,
        from: ReplicaIndex,
        nonce: u64,
        availability: Availability,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        let _ = (from, nonce, availability, view, now);
        todo!("serving helper")
    }

    /// `RequestStateChunk` from `from`.
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
        let _ = (from, nonce, artifact, offset, len, view, now);
        todo!("serving helper")
    }

    /// The outcome of a [`ServeOutput::BuildOffer`].
    pub fn offer_built(
        &mut self,
        checkpoint_op: u64,
        result: Result<Offer, UnavailableReason>,
        view: u32,
        now: u64,
    ) -> Vec<ServeOutput> {
        let _ = (checkpoint_op, result, view, now);
        todo!("serving helper")
    }

    /// One tick: expiry of served and idle offers.
    pub fn on_tick(&mut self, now: u64) {
        let _ = now;
        todo!("serving helper")
    }
}
