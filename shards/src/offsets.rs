//! Consumer offsets on the owner shard (issue 11 section 1): `StoreOffset` / `GetOffset`. The
//! connection's shard checks the request (and, for a group, asks shard 0 whether the member may
//! store), then forwards it to the partition's owner, which keeps the offsets of each partition it
//! owns in `storage::ConsumerOffsets` (the file `consumer-offsets` beside the partition's log,
//! durable by the same fsync policy; it goes with the partition's directory when the topic is
//! deleted).
//!
//! It must never answer a store before the offset is durable under `--fsync always`, never store
//! an offset beyond the partition's next offset, and never guess an offset from a damaged file.

use std::cell::RefCell;
use std::rc::Rc;

use ahash::AHashMap;
use bus::{ErrorCode, Namespace, Operation};
use storage::{ConsumerKey, ConsumerOffsets, OffsetsError};

use crate::frame::{ShardReply, ShardRequest};
use crate::shard::{Shard, partition_dir};
use crate::shard_for;

// Every name the wire accepts fits a record.
const _: () = assert!(bus::limits::NAME_LEN_MAX <= storage::limits::CONSUMER_NAME_LEN_MAX);

/// The consumer offsets of the partitions a shard owns, opened at boot (so a damaged file
/// refuses the boot, naming it) or on the first request for a partition opened later.
#[derive(Debug, Default)]
pub struct OffsetStores {
    open: RefCell<AHashMap<Namespace, Rc<ConsumerOffsets>>>,
    /// Held while one partition's offsets are opened: two requests must never both read (and
    /// cut the torn tail of) the file while the first already appends to it.
    opening: futures_util::lock::Mutex<()>,
}

impl OffsetStores {
    /// Opens the offsets of the owned partition `namespace` in `dir` at boot, before any request.
    ///
    /// # Errors
    /// The boot refusal: the file is damaged (`OffsetsError::Corrupt`, with path and byte
    /// position) or cannot be read.
    ///
    /// # Cancel safety
    /// As `ConsumerOffsets::open`.
    pub async fn open_at_boot(
        &self,
        shard_id: u16,
        namespace: Namespace,
        dir: &std::path::Path,
        fsync: storage::FsyncPolicy,
    ) -> Result<(), String> {
        let (offsets, recovery) = ConsumerOffsets::open(dir, fsync)
            .await
            .map_err(|error| format!("partition {namespace}: {error}"))?;
        log_recovery(shard_id, namespace, &offsets, recovery);
        self.open.borrow_mut().insert(namespace, Rc::new(offsets));
        Ok(())
    }

    /// Forgets the offsets of `namespace` (its partition was deleted or is no longer owned); the
    /// file goes with the partition's directory.
    pub fn remove(&self, namespace: Namespace) {
        self.open.borrow_mut().remove(&namespace);
    }

    /// Every open partition's offsets (for the interval fsync and the final one).
    pub fn all(&self) -> Vec<Rc<ConsumerOffsets>> {
        self.open.borrow().values().cloned().collect()
    }

    /// The offsets of the owned, open partition `namespace`, opened now if they are not yet.
    async fn get_or_open(
        &self,
        shard: &Shard,
        namespace: Namespace,
    ) -> Result<Rc<ConsumerOffsets>, OffsetsError> {
        if let Some(offsets) = self.open.borrow().get(&namespace).cloned() {
            return Ok(offsets);
        }
        let _opening = self.opening.lock().await;
        if let Some(offsets) = self.open.borrow().get(&namespace).cloned() {
            return Ok(offsets);
        }
        let dir = partition_dir(&shard.config.data_dir, namespace);
        let (offsets, recovery) = ConsumerOffsets::open(&dir, shard.config.fsync).await?;
        log_recovery(shard.id.0, namespace, &offsets, recovery);
        let offsets = Rc::new(offsets);
        self.open
            .borrow_mut()
            .insert(namespace, Rc::clone(&offsets));
        Ok(offsets)
    }
}

fn log_recovery(
    shard_id: u16,
    namespace: Namespace,
    offsets: &ConsumerOffsets,
    recovery: storage::OffsetsRecovery,
) {
    if recovery.truncated_bytes > 0 {
        tracing::warn!(
            shard = shard_id, %namespace, path = %offsets.path().display(),
            truncated_bytes = recovery.truncated_bytes,
            "consumer offsets had a torn last record (a store interrupted by a crash, never \
             acknowledged under --fsync always); cut"
        );
    }
}

/// Handles a client's `StoreOffset` or `GetOffset` on the connection's shard: checks the
/// partition and the consumer (header `count` the kind, body the name, as
/// `bus::Client::store_offset` sends them), asks shard 0 whether a group's member may store
/// (`crate::groups::authorize_store`), and forwards the request to the partition's owner.
/// Served by the primary only, like sends and polls.
///
/// Replies: a store answers `Ok` with `offset` the stored offset; a get answers `Ok` with
/// `count` 1 and `offset` the stored offset, or `count` 0 when the consumer never stored one
/// there (what `bus::Client::get_offset` reads as `None`).
///
/// # Errors (as replies)
/// `NotPrimary`; `StreamNotFound` / `TopicNotFound` / `PartitionNotFound`; `InvalidArgument` for
/// an unknown consumer kind or a bad name; a group's refusal from shard 0; the owner's refusals
/// (see [`store`] and [`get`]).
///
/// # Cancel safety
/// A dropped store may or may not be stored (the owner runs it to the end).
pub async fn handle(shard: &Rc<Shard>, header: &bus::Header, body: Vec<u8>) -> ShardReply {
    if let Err(reply) = shard.check_serves_data() {
        return reply;
    }
    let namespace = Namespace(header.namespace);
    if !shard.partition_exists(namespace) {
        return shard.missing_partition(namespace);
    }
    let consumer = match consumer_from(header.count, &body) {
        Ok(consumer) => consumer,
        Err(message) => return ShardReply::error(ErrorCode::InvalidArgument, message),
    };
    let request = if header.operation == Operation::StoreOffset as u8 {
        if consumer.kind == bus::ConsumerKind::Group
            && let Err(refusal) =
                crate::groups::authorize_store(shard, header, &consumer, namespace).await
        {
            return refusal;
        }
        ShardRequest::StoreOffset {
            namespace,
            consumer,
            offset: header.offset,
        }
    } else {
        ShardRequest::GetOffset {
            namespace,
            consumer,
        }
    };
    shard
        .call(shard_for(namespace, shard.shard_count), request)
        .await
}

/// The consumer a request names: kind number `kind` (header `count`), name `body`.
///
/// # Errors
/// A message naming the unknown kind, or the name rule broken.
pub fn consumer_from(kind: u32, body: &[u8]) -> Result<bus::Consumer, String> {
    let Some(kind) = bus::ConsumerKind::from_u32(kind) else {
        return Err(format!(
            "unknown consumer kind {kind} in the request's count (0 a consumer, 1 a group)"
        ));
    };
    let name = std::str::from_utf8(body)
        .map_err(|_| "consumer name (the request body) is not UTF-8".to_owned())?;
    bus::Consumer::new(kind, name)
}

/// The storage key of `consumer`: its kind number and name.
fn key_of(consumer: &bus::Consumer) -> ConsumerKey {
    let kind = match consumer.kind {
        bus::ConsumerKind::Consumer => 0,
        bus::ConsumerKind::Group => 1,
    };
    ConsumerKey {
        kind,
        name: consumer.name.clone(),
    }
}

/// Stores `consumer`'s offset in the owned partition `namespace`, durably by its fsync policy
/// (`--fsync always`: on disk before the reply). `offset` is the next offset the consumer reads,
/// so it may equal the partition's next offset but not exceed it.
///
/// # Errors (as replies)
/// `PartitionNotFound` (and the other refusals of an unopened log); `OffsetOutOfRange` with the
/// partition's ends when `offset` is beyond its next offset; `ResourceExhausted` for a new
/// consumer past `storage::limits::CONSUMERS_PER_PARTITION_MAX`; `StorageFull` (nothing stored,
/// retry once space is freed); `StorageFailure` for a damaged offsets file (named) or a failed
/// write.
///
/// # Cancel safety
/// Not cancel safe: a dropped store may or may not be stored.
pub async fn store(
    shard: &Rc<Shard>,
    namespace: Namespace,
    consumer: bus::Consumer,
    offset: u64,
) -> ShardReply {
    let log = match shard.owned_log(namespace).await {
        Ok(log) => log,
        Err(reply) => return reply,
    };
    let ends = crate::shard::partition_ends(&log);
    if offset > ends.next_offset {
        return ShardReply::error(
            ErrorCode::OffsetOutOfRange,
            format!(
                "offset {offset} of consumer {:?} in {namespace} is beyond the partition's next \
                 offset {}; a stored offset is the next one to read, at most the next offset; \
                 nothing was stored",
                consumer.name, ends.next_offset
            ),
        )
        .with_ends(ends);
    }
    let offsets = match shard.offsets.get_or_open(shard, namespace).await {
        Ok(offsets) => offsets,
        Err(error) => return failure_reply(shard, namespace, "store", &error),
    };
    match offsets.store(&key_of(&consumer), offset).await {
        Ok(()) => ShardReply::Ok {
            offset,
            count: 0,
            generation: 0,
            body: Vec::new(),
        },
        Err(error) => failure_reply(shard, namespace, "store", &error),
    }
}

/// `consumer`'s stored offset in the owned partition `namespace`: `Ok` with `count` 1 and the
/// offset, or `count` 0 when it never stored one here.
///
/// # Errors (as replies)
/// As [`store`], less the offset checks.
///
/// # Cancel safety
/// Cancel safe in effect: it changes nothing (the offsets may be opened).
pub async fn get(shard: &Rc<Shard>, namespace: Namespace, consumer: bus::Consumer) -> ShardReply {
    if let Err(reply) = shard.owned_log(namespace).await {
        return reply;
    }
    let offsets = match shard.offsets.get_or_open(shard, namespace).await {
        Ok(offsets) => offsets,
        Err(error) => return failure_reply(shard, namespace, "read", &error),
    };
    let stored = offsets.get(&key_of(&consumer));
    ShardReply::Ok {
        offset: stored.unwrap_or(0),
        count: u32::from(stored.is_some()),
        generation: 0,
        body: Vec::new(),
    }
}

/// The reply to an offsets `action` on `namespace` that failed with `error`.
fn failure_reply(
    shard: &Shard,
    namespace: Namespace,
    action: &str,
    error: &OffsetsError,
) -> ShardReply {
    let code = match error {
        OffsetsError::InvalidName { .. } => ErrorCode::InvalidArgument,
        OffsetsError::TooManyConsumers { .. } => ErrorCode::ResourceExhausted,
        OffsetsError::Io { source, .. } if storage::space::is_descriptors_exhausted(source) => {
            ErrorCode::ResourceExhausted
        }
        _ if error.is_storage_full() => ErrorCode::StorageFull,
        OffsetsError::Io { .. } | OffsetsError::Corrupt { .. } | OffsetsError::Failed { .. } => {
            tracing::error!(shard = shard.id.0, %namespace, %error, "consumer offset {action} failed");
            ErrorCode::StorageFailure
        }
    };
    ShardReply::error(
        code,
        format!("consumer offset {action} in {namespace} failed: {error}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_1_a_request_names_its_consumer_by_kind_and_body() {
        let reader = consumer_from(0, b"reader").unwrap();
        assert_eq!(reader.kind, bus::ConsumerKind::Consumer);
        assert_eq!(
            key_of(&reader),
            ConsumerKey {
                kind: 0,
                name: "reader".to_owned()
            }
        );
        assert_eq!(key_of(&consumer_from(1, b"g").unwrap()).kind, 1);
        let unknown = consumer_from(2, b"reader").unwrap_err();
        assert!(unknown.contains("unknown consumer kind 2"), "{unknown}");
        assert!(consumer_from(0, b"").is_err());
        assert!(
            consumer_from(0, &[0xff, 0xfe])
                .unwrap_err()
                .contains("not UTF-8")
        );
    }
}
