//! The server: metadata state machine on shard 0, data-plane partitions on their owner shards, the
//! shard event loop, connection handling and bootstrap. Only this crate knows streams and topics.
