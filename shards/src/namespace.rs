//! Owner shard of a namespace: XXH3-64 of the namespace's little-endian bytes modulo shard count.
//! Stable across restarts with the same shard count; never depends on process state.

use bus::Namespace;
use runtime::ShardId;

/// The shard that owns `namespace` among `shard_count` shards (DESIGN section 1).
///
/// # Panics
/// If `shard_count` is 0 (configuration rejects that first).
pub fn shard_for(namespace: Namespace, shard_count: u16) -> ShardId {
    assert!(shard_count > 0, "shard_count must be at least 1");
    let hash = twox_hash::XxHash3_64::oneshot(&namespace.0.to_le_bytes());
    ShardId((hash % u64::from(shard_count)) as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owner_is_stable_and_in_range() {
        for partition_id in 0..64 {
            let namespace = Namespace::new(1, 1, partition_id);
            let owner = shard_for(namespace, 4);
            assert!(owner.0 < 4);
            assert_eq!(owner, shard_for(namespace, 4));
            assert_eq!(shard_for(namespace, 1), ShardId(0));
        }
    }

    #[test]
    fn partitions_spread_over_shards() {
        let mut per_shard = [0u32; 2];
        for partition_id in 0..64 {
            per_shard[shard_for(Namespace::new(1, 1, partition_id), 2).0 as usize] += 1;
        }
        assert!(per_shard[0] > 8 && per_shard[1] > 8, "{per_shard:?}");
    }
}
