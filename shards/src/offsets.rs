//! Consumer offsets on the owner shard (issue 11 section 1): `StoreOffset` / `GetOffset`.

#![allow(clippy::unused_async)] // stubs until the helpers land: remove with the last todo!

use std::rc::Rc;

use bus::Namespace;

use crate::frame::ShardReply;
use crate::shard::Shard;

/// Handles a client's `StoreOffset` or `GetOffset` on the connection's shard: validates it,
/// authorizes a group's store on shard 0, and forwards it to the partition's owner.
pub async fn handle(shard: &Rc<Shard>, header: &bus::Header, body: Vec<u8>) -> ShardReply {
    let _ = (shard, header, body);
    todo!("H1: offset requests")
}

/// Stores `consumer`'s offset in the owned partition `namespace`, durably by its fsync policy.
pub async fn store(
    shard: &Rc<Shard>,
    namespace: Namespace,
    consumer: bus::Consumer,
    offset: u64,
) -> ShardReply {
    let _ = (shard, namespace, consumer, offset);
    todo!("H1: store offset")
}

/// `consumer`'s stored offset in the owned partition `namespace`.
pub async fn get(shard: &Rc<Shard>, namespace: Namespace, consumer: bus::Consumer) -> ShardReply {
    let _ = (shard, namespace, consumer);
    todo!("H1: get offset")
}
