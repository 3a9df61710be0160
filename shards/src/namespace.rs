//! Owner shard of a namespace: the partitions of one topic spread evenly over the shards, starting
//! at a per-topic offset. Stable across restarts with the same shard count; never depends on
//! process state, and is never written to disk (a partition's files do not name their shard), so a
//! different shard count simply opens each partition on its new owner.

use bus::Namespace;
use runtime::ShardId;

/// The shard that owns `namespace` among `shard_count` shards (DESIGN section 1):
/// `(topic_offset + partition_id) % shard_count`, where `topic_offset` is XXH3-64 of the
/// little-endian bytes of the topic's namespace with partition 0. Consecutive partitions of a
/// topic go to consecutive shards, so `n` partitions on `s` shards put `n / s` or `n / s + 1` on
/// each; the per-topic offset keeps small topics from all starting on shard 0.
///
/// # Panics
/// If `shard_count` is 0 (configuration rejects that first).
pub fn shard_for(namespace: Namespace, shard_count: u16) -> ShardId {
    assert!(shard_count > 0, "shard_count must be at least 1");
    let topic = Namespace::new(namespace.stream_id(), namespace.topic_id(), 0);
    let topic_offset = twox_hash::XxHash3_64::oneshot(&topic.0.to_le_bytes());
    let shard_count = u64::from(shard_count);
    let owner = (topic_offset % shard_count + u64::from(namespace.partition_id())) % shard_count;
    ShardId(owner as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Partitions of topic `stream_id/topic_id` per shard, for `partition_count` partitions.
    fn per_shard(
        stream_id: u32,
        topic_id: u16,
        partition_count: u16,
        shard_count: u16,
    ) -> Vec<u32> {
        let mut counts = vec![0u32; usize::from(shard_count)];
        for partition_id in 0..partition_count {
            let owner = shard_for(
                Namespace::new(stream_id, topic_id, partition_id),
                shard_count,
            );
            counts[usize::from(owner.0)] += 1;
        }
        counts
    }

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
    fn issue7_6_eight_partitions_on_two_shards_split_four_four() {
        assert_eq!(per_shard(1, 1, 8, 2), vec![4, 4]);
    }

    #[test]
    fn issue7_6_two_bench_partitions_on_two_shards_land_one_each() {
        // The README's `bench --addr ... --stream-id 7` topic, and the default stream 1.
        assert_eq!(per_shard(7, 1, 2, 2), vec![1, 1]);
        assert_eq!(per_shard(1, 1, 2, 2), vec![1, 1]);
    }

    #[test]
    fn issue7_6_every_topic_spreads_within_one_partition() {
        for stream_id in 1..20 {
            for topic_id in 1..5 {
                for shard_count in 1..9 {
                    for partition_count in [1, 2, 3, 7, 8, 64] {
                        let counts = per_shard(stream_id, topic_id, partition_count, shard_count);
                        let max = counts.iter().max().copied().unwrap();
                        let min = counts.iter().min().copied().unwrap();
                        assert!(max - min <= 1, "{stream_id}/{topic_id}: {counts:?}");
                        assert_eq!(counts.iter().sum::<u32>(), u32::from(partition_count));
                    }
                }
            }
        }
    }

    #[test]
    fn topics_start_on_different_shards() {
        let first_owners: std::collections::BTreeSet<u16> = (1..=16)
            .map(|topic_id| shard_for(Namespace::new(1, topic_id, 0), 4).0)
            .collect();
        assert!(first_owners.len() > 1, "{first_owners:?}");
    }
}
