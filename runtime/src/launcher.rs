//! Spawns one thread per shard (`shard-{id}`), pins it, builds its compio runtime on the chosen
//! driver and runs the shard future; ready barrier, stop signal, panic propagation, join.

use std::future::Future;
use std::pin::Pin;

use crate::mesh::{MeshEndpoint, Pump, ShardId};
use crate::probe::IoDriver;
use crate::topology::Topology;

#[derive(Debug, Clone)]
pub struct LaunchConfig {
    pub topology: Topology,
    pub io_driver: IoDriver,
    pub inbox_capacity: usize,
}

/// Handed to the shard future inside its thread.
#[derive(Debug)]
pub struct ShardContext<F> {
    pub shard_id: ShardId,
    pub shard_count: u16,
    /// The pinned CPU, if pinned.
    pub core: Option<usize>,
    pub endpoint: MeshEndpoint<F>,
    pub pump: Pump<F>,
    // plus private ready-barrier state
}

/// The ready barrier, separable from the context (see `ShardContext::into_parts`).
#[derive(Debug)]
pub struct ReadyBarrier {}

impl ReadyBarrier {
    /// Reports this shard ready and waits (asynchronously) until every shard did.
    pub async fn wait(self) {
        todo!()
    }
}

impl<F: Send + 'static> ShardContext<F> {
    /// Splits the context so the endpoint can move into shard state while the loop keeps the pump.
    pub fn into_parts(self) -> (MeshEndpoint<F>, Pump<F>, ReadyBarrier) {
        todo!()
    }

    /// Reports this shard ready and waits (asynchronously, without blocking the reactor) until every
    /// shard has reported ready. Listeners open only after this returns.
    ///
    /// # Cancel safety
    /// Not cancel safe: call once and await it to completion.
    pub async fn ready_barrier(&self) {
        todo!()
    }
}

/// The running shard threads.
#[derive(Debug)]
pub struct ShardSet {}

/// Clonable, Send: asks every shard to stop (their pumps yield `PumpEvent::Stop`).
#[derive(Debug, Clone)]
pub struct StopHandle {}

impl StopHandle {
    pub fn stop(&self) {
        todo!()
    }
}

/// The shard future's error, shown in the process exit message.
pub type ShardResult = Result<(), String>;

/// Boxed, !Send shard future built inside the shard thread.
pub type ShardFuture = Pin<Box<dyn Future<Output = ShardResult>>>;

impl ShardSet {
    /// Spawns the shard threads; `make_shard` is called inside each thread (after pinning and
    /// runtime creation) and its future is run to completion with `block_on`.
    ///
    /// # Errors
    /// Thread spawn, pinning or runtime creation failure (naming the shard and the cause).
    pub fn launch<F, M>(config: &LaunchConfig, make_shard: M) -> Result<ShardSet, LaunchError>
    where
        F: Send + 'static,
        M: Fn(ShardContext<F>) -> ShardFuture + Send + Sync + 'static,
    {
        todo!("{config:?}{}", std::mem::size_of_val(&make_shard))
    }

    /// Blocks the calling (non-shard) thread until every shard passed the ready barrier, or one
    /// failed first.
    pub fn wait_ready(&self) -> Result<(), LaunchError> {
        todo!()
    }

    pub fn stop_handle(&self) -> StopHandle {
        todo!()
    }

    /// Stops the shards on SIGINT/SIGTERM (a watcher thread).
    pub fn stop_on_signals(&self) -> std::io::Result<()> {
        todo!()
    }

    /// Joins every shard thread. A shard that returned an error or panicked makes this an error
    /// carrying the shard id and message; the other shards are stopped first.
    pub fn join(self) -> Result<(), LaunchError> {
        todo!()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    #[error("shard {shard}: {message}")]
    Shard { shard: u16, message: String },
    #[error("shard {shard} panicked: {message}")]
    Panicked { shard: u16, message: String },
    #[error("failed to start shard {shard}: {source}")]
    Spawn { shard: u16, source: std::io::Error },
}
