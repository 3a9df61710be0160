//! Producer-side partition choice (issue 11 section 5): which partition of a topic a batch or a
//! keyed message goes to. Pure functions of their input: no I/O, no clock, no shared state.
//!
//! The key mapping is part of the public contract (README "Keyed sends"): changing
//! `partition_for_key` moves every key of every existing topic to another partition and breaks
//! per-key ordering for data already written, so a change must fail `keys::tests`.

/// The partition of `key` in a topic of `partition_count` partitions: XXH3-64 of the key's
/// bytes with seed 0, modulo `partition_count` (issue 11 section 5, "the same key always lands on
/// the same partition for a given partition count").
///
/// Stable across processes, hosts and releases (the hash is fixed, never `std`'s randomized
/// `Hasher`); a different partition count maps most keys elsewhere (plain modulo, no consistent
/// hashing). The empty key is a key like any other.
///
/// # Panics
/// If `partition_count` is 0 (a topic has at least one partition; the caller's bug).
pub fn partition_for_key(key: &[u8], partition_count: u32) -> u32 {
    assert!(
        partition_count > 0,
        "a topic has at least one partition: partition_for_key needs a partition count above 0"
    );
    let hash = twox_hash::XxHash3_64::oneshot(key);
    // The remainder is below `partition_count`, a u32.
    (hash % u64::from(partition_count)) as u32
}

/// How a producer picks the partition of its next batch or message (issue 11 section 5).
///
/// ```
/// use bus::keys::Partitioner;
/// let mut spread = Partitioner::round_robin_from(3);
/// assert_eq!([spread.next_partition(4), spread.next_partition(4)], [3, 0]);
/// let mut keyed = Partitioner::key(b"user-42".to_vec());
/// assert_eq!(keyed.next_partition(8), bus::partition_for_key(b"user-42", 8));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Partitioner {
    /// One partition after the other: `next` (modulo the partition count) is the next one
    /// taken, then `next + 1`, wrapping at `u32::MAX`.
    RoundRobin { next: u32 },
    /// Every message to `partition_for_key(key, partition_count)`.
    Key(Vec<u8>),
}

impl Partitioner {
    /// Round-robin from partition 0.
    pub fn round_robin() -> Partitioner {
        Partitioner::RoundRobin { next: 0 }
    }

    /// Round-robin from partition `start` (modulo the partition count): a producer that sends
    /// one batch per run spreads its runs when it starts at a random partition.
    pub fn round_robin_from(start: u32) -> Partitioner {
        Partitioner::RoundRobin { next: start }
    }

    /// Every message to the partition of `key` (`partition_for_key`).
    pub fn key(key: Vec<u8>) -> Partitioner {
        Partitioner::Key(key)
    }

    /// The partition (below `partition_count`) of the next batch; round-robin moves on by one.
    ///
    /// # Panics
    /// If `partition_count` is 0.
    pub fn next_partition(&mut self, partition_count: u32) -> u32 {
        assert!(
            partition_count > 0,
            "a topic has at least one partition: next_partition needs a partition count above 0"
        );
        match self {
            Partitioner::RoundRobin { next } => {
                let partition = *next % partition_count;
                *next = next.wrapping_add(1);
                partition
            }
            Partitioner::Key(key) => partition_for_key(key, partition_count),
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn issue11_5_key_hash_is_xxh3_64_seed_0() {
        // The XXH3-64 of the empty input with seed 0 is the reference implementation's
        // published test value (xxhash sanity check, `XXH3_64bits("", 0)`).
        assert_eq!(
            twox_hash::XxHash3_64::oneshot(b""),
            0x2D06_8005_38D3_94C2,
            "the key hash must stay XXH3-64, seed 0"
        );
    }

    /// Fixed vectors: the README documents the mapping, so a change of hash, seed or reduction
    /// must fail here.
    #[test]
    fn issue11_5_key_mapping_is_stable() {
        let vectors: [(&[u8], u32, u32); 12] = [
            (b"", 1, 0),
            (b"", 8, 2),
            (b"", 7, 4),
            (b"user-42", 8, 5),
            (b"user-42", 3, 2),
            (b"user-42", 4096, 2509),
            (b"orders", 8, 3),
            (b"orders", 16, 11),
            (b"eu-west", 8, 5),
            (b"eu-west", 5, 4),
            (b"\xff\x00", 8, 7),
            (b"a", 2, 1),
        ];
        let actual: Vec<(&[u8], u32, u32)> = vectors
            .iter()
            .map(|&(key, count, _)| (key, count, partition_for_key(key, count)))
            .collect();
        assert_eq!(actual, vectors);
    }

    #[test]
    fn issue11_5_one_partition_takes_every_key() {
        for key in [&b""[..], b"x", b"user-42", &[0xff; 64]] {
            assert_eq!(partition_for_key(key, 1), 0);
        }
    }

    #[test]
    #[should_panic(expected = "partition count above 0")]
    fn zero_partitions_is_a_caller_bug() {
        partition_for_key(b"k", 0);
    }

    #[test]
    fn issue11_5_sequential_keys_spread_evenly() {
        // 16,000 keys `user-N` over 8 partitions: 2,000 expected each, binomial standard
        // deviation about 42; 1,800..2,200 is more than four deviations either side.
        let mut counts = [0u32; 8];
        for index in 0..16_000 {
            let key = format!("user-{index}");
            counts[partition_for_key(key.as_bytes(), 8) as usize] += 1;
        }
        for (partition, count) in counts.iter().enumerate() {
            assert!(
                (1_800..=2_200).contains(count),
                "partition {partition} got {count} of 16000 keys: {counts:?}"
            );
        }
    }

    #[test]
    fn issue11_5_round_robin_cycles_and_key_sticks() {
        let mut spread = Partitioner::round_robin();
        let taken: Vec<u32> = (0..7).map(|_| spread.next_partition(3)).collect();
        assert_eq!(taken, [0, 1, 2, 0, 1, 2, 0]);
        let mut wrapping = Partitioner::round_robin_from(u32::MAX);
        assert_eq!(wrapping.next_partition(5), u32::MAX % 5);
        assert_eq!(wrapping.next_partition(5), 0, "wraps to 0 after u32::MAX");
        let mut keyed = Partitioner::key(b"user-42".to_vec());
        assert_eq!(
            [keyed.next_partition(8), keyed.next_partition(8)],
            [5, 5],
            "a key always takes its partition"
        );
    }

    proptest! {
        #![proptest_config(crate::test_support::proptest_config())]

        #[test]
        fn issue11_5_random_keys_stay_in_range_and_spread(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 1..32), 2048),
            partition_count in 1u32..=8,
        ) {
            // 2,048 random keys over at most 8 partitions: at least 256 expected per partition,
            // standard deviation at most 15; fewer than half the expected count is more than eight
            // deviations off (a hash that ignores its input or a bad reduction lands there).
            let mut counts = vec![0u32; partition_count as usize];
            for key in &keys {
                let partition = partition_for_key(key, partition_count);
                prop_assert!(partition < partition_count);
                prop_assert_eq!(partition, partition_for_key(key, partition_count));
                counts[partition as usize] += 1;
            }
            let expected = keys.len() as u32 / partition_count;
            for count in &counts {
                prop_assert!(*count * 2 >= expected, "counts {:?}", counts);
            }
        }
    }
}
