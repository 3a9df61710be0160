//! The server: metadata state machine on shard 0, data-plane partitions on their owner shards, the
//! shard event loop, connection handling and bootstrap. Only this crate knows streams and topics.
//!
//! It never performs blocking I/O on a shard thread and never holds a `RefCell` borrow across an
//! `.await`.

pub mod accept;
pub mod config;
pub mod connection;
pub mod driver;
pub mod frame;
pub mod groups;
pub mod limits;
pub mod metadata;
pub mod metrics;
pub mod namespace;
pub mod offsets;
pub mod parked;
pub mod producers;
pub mod replica_bus;
pub mod resources;
pub mod retention;
pub mod server;
pub mod shard;
pub mod splice;
pub mod store;
#[cfg(test)]
mod test_support;
pub mod unopened;
pub mod vsr;

pub use config::{ConfigError, RangedKey, ServerConfig};
pub use namespace::shard_for;
pub use server::{RunningServer, ServerError};
