//! The mesh: one bounded crossfire MPSC inbox per shard plus a reply lane, and the pump that every
//! shard loop polls. Sends never block (`try_send`); a full inbox is counted and handed back.

use std::sync::Arc;

/// Identifies a shard; shard 0 owns metadata.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ShardId(pub u16);

/// A frame with its route; the receiver rejects (counts and logs) a misrouted envelope.
#[derive(Debug)]
pub struct Envelope<F> {
    pub from: ShardId,
    pub to: ShardId,
    pub frame: F,
}

/// A failed send hands the frame back.
#[derive(Debug, thiserror::Error)]
pub enum MeshSendError<F> {
    #[error("inbox of the target shard is full")]
    Full(F),
    #[error("target shard has stopped")]
    Disconnected(F),
}

impl<F> MeshSendError<F> {
    pub fn into_inner(self) -> F {
        match self {
            Self::Full(f) | Self::Disconnected(f) => f,
        }
    }
}

/// Counters shared by all shards (atomics; read by tools and tests).
#[derive(Debug, Default)]
pub struct MeshStats {
    /// Per target shard: sends refused because its inbox (or reply lane) was full.
    pub inbox_full_count: Vec<std::sync::atomic::AtomicU64>,
    /// Envelopes delivered to the wrong shard and rejected.
    pub misrouted_count: std::sync::atomic::AtomicU64,
}

/// One shard's view of the mesh: senders to every shard's inbox and reply lane, and its own
/// receivers (taken by `pump`).
#[derive(Debug)]
pub struct MeshEndpoint<F> {
    _marker: std::marker::PhantomData<F>,
}

impl<F: Send + 'static> MeshEndpoint<F> {
    pub fn shard_id(&self) -> ShardId {
        todo!()
    }
    pub fn shard_count(&self) -> u16 {
        todo!()
    }
    pub fn stats(&self) -> &Arc<MeshStats> {
        todo!()
    }
    /// Sends a request frame to `target`'s inbox (sending to self is allowed). Never blocks.
    ///
    /// # Errors
    /// `Full` (counted in `MeshStats`) or `Disconnected`, each returning the frame.
    pub fn try_send(&self, target: ShardId, frame: F) -> Result<(), MeshSendError<F>> {
        todo!("{target:?}{}", std::mem::size_of_val(&frame))
    }
    /// Same, on `target`'s reply lane, which request bursts cannot fill.
    pub fn try_send_reply(&self, target: ShardId, frame: F) -> Result<(), MeshSendError<F>> {
        todo!("{target:?}{}", std::mem::size_of_val(&frame))
    }
    /// A cheap clonable sender handle for tasks spawned on this shard.
    pub fn clone_sender(&self) -> MeshEndpoint<F> {
        todo!()
    }
}

/// What the pump yields, polled in this fixed (biased) order.
#[derive(Debug)]
pub enum PumpEvent<F> {
    /// The stop signal fired: shut the shard down.
    Stop,
    /// The 10 ms tick.
    Tick,
    /// Up to `PUMP_BATCH_MAX` envelopes drained from the inbox.
    Inbox(Vec<Envelope<F>>),
    /// Up to `PUMP_BATCH_MAX` envelopes drained from the reply lane.
    Reply(Vec<Envelope<F>>),
}

/// The single pump of a shard loop: stop, tick, inbox, reply lane, biased in that order.
#[derive(Debug)]
pub struct Pump<F> {
    _marker: std::marker::PhantomData<F>,
}

impl<F: Send + 'static> Pump<F> {
    /// # Cancel safety
    /// Cancel safe: no frame is lost if the future is dropped.
    pub async fn next(&mut self) -> PumpEvent<F> {
        todo!()
    }
}

/// Builds the mesh for `shard_count` shards: one endpoint and one pump per shard, in id order.
///
/// # Panics
/// If `inbox_capacity` is 0 or above `INBOX_CAPACITY_MAX` (config validation rejects that first).
pub fn mesh<F: Send + 'static>(
    shard_count: u16,
    inbox_capacity: usize,
) -> Vec<(MeshEndpoint<F>, Pump<F>)> {
    todo!("{shard_count}{inbox_capacity}")
}
