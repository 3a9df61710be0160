//! State transfer (DESIGN section 10, issue 9): a replica whose gap lies below every peer's
//! retained journal fetches the primary's checkpoint (metadata + client table) and installs it,
//! then repairs the tail above it from peers.
//!
//! Pure like the rest of `crate::vsr`: no I/O, no clock. The pieces:
//! - [`manifest`]: the manifest codec (what an offer holds: one entry per artifact).
//! - [`client_table_wire`]: the client table's transfer encoding.
//! - [`server`]: the serving side (shard 0 of the primary): offers per checkpoint generation,
//!   transfers keyed by requester and nonce, chunk clamps, expiry. The driver (and the
//!   simulator) routes `RequestStateTransfer` / `RequestStateChunk` to it, not to the core.
//! - [`receiver`]: the receiving side's stages and retry budget, owned by the core
//!   (`super::replica::Replica`), which routes `StateTransferTarget` / `StateChunk` to it.
//!
//! Flow: `RequestStateTransfer{nonce}` -> `StateTransferTarget{nonce, available, checkpoint_op,
//! manifest}` -> sequential `RequestStateChunk{nonce, artifact, offset, len}` /
//! `StateChunk{nonce, artifact, offset, payload}`, one in flight -> every artifact checksum
//! verified -> `Action::InstallCheckpoint` -> `Completion::CheckpointInstalled` -> the core
//! adopts the state and repairs the tail.

pub mod client_table_wire;
pub mod manifest;
pub mod receiver;
pub mod server;

/// One artifact of a checkpoint offer. Wire values are stable (never renumbered or reused).
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum ArtifactKind {
    /// The metadata state at the checkpoint: `MetadataState` as JSON (the same encoding the
    /// snapshot payload uses for it).
    Metadata = 1,
    /// The client table at the checkpoint, in the [`client_table_wire`] encoding.
    ClientTable = 2,
}

impl ArtifactKind {
    /// Every kind, in wire order.
    pub const ALL: [ArtifactKind; 2] = [ArtifactKind::Metadata, ArtifactKind::ClientTable];

    /// The kind numbered `value`, `None` for an unknown number.
    pub fn from_u8(value: u8) -> Option<ArtifactKind> {
        match value {
            1 => Some(ArtifactKind::Metadata),
            2 => Some(ArtifactKind::ClientTable),
            _ => None,
        }
    }

    /// The name `inspect` and the logs print.
    pub fn name(self) -> &'static str {
        match self {
            ArtifactKind::Metadata => "metadata",
            ArtifactKind::ClientTable => "client_table",
        }
    }
}

/// One artifact as a manifest describes it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ManifestEntry {
    pub kind: ArtifactKind,
    /// The op whose effects are the last the artifact includes (the checkpoint op).
    pub frontier_op: u64,
    /// Bytes of the artifact, at least 1.
    pub len: u64,
    /// XXH3-128 of the artifact's bytes.
    pub checksum: u128,
}

/// What an offer holds: one entry per artifact kind, each kind at most once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Manifest {
    pub entries: Vec<ManifestEntry>,
}

impl Manifest {
    /// The entry of `kind`, if the manifest has one.
    pub fn entry(&self, kind: ArtifactKind) -> Option<&ManifestEntry> {
        self.entries.iter().find(|entry| entry.kind == kind)
    }

    /// Sum of the artifact lengths (bytes).
    pub fn total_len(&self) -> u64 {
        self.entries.iter().map(|entry| entry.len).sum()
    }
}

/// Why a replica does not serve a state transfer now (`available = 0`). Wire values are stable.
#[repr(u8)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, thiserror::Error)]
pub enum UnavailableReason {
    #[error("not the primary")]
    NotPrimary = 1,
    #[error("a view change is under way")]
    ViewChange = 2,
    #[error("not caught up: commits known above what this replica applied")]
    NotCaughtUp = 3,
    #[error("no checkpoint yet")]
    NoCheckpointYet = 4,
    #[error("the checkpoint is unreadable")]
    CheckpointUnreadable = 5,
    #[error("the checkpoint is being replaced")]
    CheckpointBeingReplaced = 6,
    #[error("the sender's reason is unknown to this build")]
    Unknown = 255,
}

impl UnavailableReason {
    /// The reason numbered `value`; a number this build does not know reads as `Unknown`
    /// (a refusal is a refusal whatever its reason).
    pub fn from_u8(value: u8) -> UnavailableReason {
        match value {
            1 => UnavailableReason::NotPrimary,
            2 => UnavailableReason::ViewChange,
            3 => UnavailableReason::NotCaughtUp,
            4 => UnavailableReason::NoCheckpointYet,
            5 => UnavailableReason::CheckpointUnreadable,
            6 => UnavailableReason::CheckpointBeingReplaced,
            _ => UnavailableReason::Unknown,
        }
    }
}

/// The answer of a `StateTransferTarget`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransferTarget {
    /// `available = 0`: a bare refusal (header only on the wire).
    Unavailable { reason: UnavailableReason },
    /// `available = 1`: the offer of the checkpoint at `checkpoint_op` (the issue's `commit_op`:
    /// the state after applying it), described by `manifest` (the body on the wire).
    Available {
        checkpoint_op: u64,
        manifest: Manifest,
    },
}

/// What the core says about serving a transfer now
/// (`super::replica::Replica::transfer_availability`): a caught-up primary in normal status
/// with a checkpoint serves the one at `checkpoint_op`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Availability {
    Available { checkpoint_op: u64 },
    Unavailable(UnavailableReason),
}
