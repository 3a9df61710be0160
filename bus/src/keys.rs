//! Keyed partitioning (issue 11 section 5): which partition a message key goes to.

/// The partition of `key` in a topic of `partition_count` partitions: stable for a given count
/// (the same key always maps to the same partition), documented in the README.
///
/// # Panics
/// If `partition_count` is 0.
pub fn partition_for_key(key: &[u8], partition_count: u32) -> u32 {
    let _ = (key, partition_count);
    todo!("H6: keyed partitioning")
}
