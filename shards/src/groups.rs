//! Consumer groups (issue 11 section 2): membership, heartbeats and partition assignment, the
//! primary's soft state on shard 0; the groups themselves are metadata (`MetadataOp::CreateGroup`).

#![allow(clippy::unused_async)] // stubs until the helpers land: remove with the last todo!

use std::rc::Rc;

use bus::Namespace;

use crate::frame::ShardReply;
use crate::shard::Shard;

/// A consumer-group request sent to shard 0.
#[derive(Debug)]
pub enum GroupRequest {}

/// Shard 0's answer to a `GroupRequest`.
#[derive(Debug)]
pub enum GroupReply {}

/// Handles a client's `JoinGroup`, `LeaveGroup` or `GroupHeartbeat` on the connection's shard.
pub async fn handle(shard: &Rc<Shard>, header: &bus::Header, body: Vec<u8>) -> ShardReply {
    let _ = (shard, header, body);
    todo!("H2: group requests")
}

/// Executes a `GroupRequest` on shard 0.
pub async fn execute(shard: &Rc<Shard>, request: GroupRequest) -> ShardReply {
    let _ = shard;
    match request {}
}

/// Whether the client of `header` may store group `consumer`'s offset in `namespace`: a member
/// assigned that partition in the generation `header.generation`.
///
/// # Errors
/// The refusal to send the client (`NotGroupMember`, `PartitionNotAssigned`, `GroupNotFound`).
pub async fn authorize_store(
    shard: &Rc<Shard>,
    header: &bus::Header,
    consumer: &bus::Consumer,
    namespace: Namespace,
) -> Result<(), ShardReply> {
    let _ = (shard, header, consumer, namespace);
    todo!("H2: group store authorization")
}
