//! Shard 0's replication core: Viewstamped Replication (VSR Revisited, Liskov & Cowling 2012)
//! over the metadata state machine and the client table (DESIGN sections 7-9, issue 8). Pure:
//! nothing here awaits, reads a clock, touches a file, a socket or compio (issue 8 section 1;
//! `shards/tests/vsr_sans_io.rs` fails the build if it does). The durable side (journal,
//! superblock, checkpoint, boot) is `crate::store`; shard 0's driver performs the actions this
//! core returns.

pub mod apply;
pub mod client_table;
pub mod message;
pub mod prepare;
pub mod replica;
pub mod snapshot;
pub mod transfer;
pub mod wire;
