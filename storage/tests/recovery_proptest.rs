//! Property test of torn-tail recovery: a valid log cut at any byte, optionally followed by
//! garbage or zeros (a torn write), always reopens to exactly the prefix of complete entries, and
//! appends continue at the right offset. Proptest prints the failing input and persists its seed.

use proptest::prelude::*;
use storage::entry::build_entry;
use storage::{FsyncPolicy, LogConfig, PartitionLog};

/// Entries with offsets assigned from 0, as the log stores them.
fn stored_entries(shapes: &[(u32, usize)]) -> Vec<(u64, Vec<u8>)> {
    let mut offset = 0u64;
    shapes
        .iter()
        .enumerate()
        .map(|(seed, &(message_count, payload_size))| {
            let payload: Vec<u8> = (0..payload_size)
                .map(|index| (seed * 13 + index) as u8)
                .collect();
            let mut entry = build_entry(seed as u64, message_count, &payload);
            entry[0..8].copy_from_slice(&offset.to_le_bytes());
            let base_offset = offset;
            offset += u64::from(message_count);
            (base_offset, entry)
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Tail {
    Nothing,
    Zeros(usize),
    Garbage(Vec<u8>),
}

fn tail() -> impl Strategy<Value = Tail> {
    prop_oneof![
        Just(Tail::Nothing),
        (1usize..600).prop_map(Tail::Zeros),
        proptest::collection::vec(any::<u8>(), 1..600).prop_map(Tail::Garbage),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn any_truncation_recovers_the_prefix_of_complete_entries(
        shapes in proptest::collection::vec((1u32..5, 0usize..300), 1..12),
        cut_fraction in 0.0f64..=1.0,
        tail in tail(),
    ) {
        let entries = stored_entries(&shapes);
        let full: Vec<u8> = entries.iter().flat_map(|(_, entry)| entry.clone()).collect();
        let cut = ((full.len() as f64) * cut_fraction) as usize;
        let mut on_disk = full[..cut].to_vec();
        match &tail {
            Tail::Nothing => {}
            Tail::Zeros(count) => on_disk.extend(std::iter::repeat_n(0u8, *count)),
            Tail::Garbage(bytes) => on_disk.extend_from_slice(bytes),
        }

        // The complete entries that lie within the cut.
        let mut kept_bytes = 0usize;
        let mut kept_count = 0usize;
        let mut next_offset = 0u64;
        for (base_offset, entry) in &entries {
            if kept_bytes + entry.len() > cut {
                break;
            }
            kept_bytes += entry.len();
            kept_count += 1;
            next_offset = base_offset + u64::from(shapes[kept_count - 1].0);
        }

        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(format!("{:020}.log", 0)), &on_disk).unwrap();
        let config = LogConfig { fsync: FsyncPolicy::Always, segment_size_max: 1 << 20, write_mode: storage::WriteMode::Buffered };
        let (read, report, appended_offset) = compio::runtime::Runtime::new().unwrap().block_on(async {
            let (log, report) = PartitionLog::open(dir.path(), config).await.unwrap();
            let read = log.read(0, u32::MAX, usize::MAX).await.unwrap();
            let appended_offset = log.append(build_entry(0, 1, b"after")).await.unwrap();
            log.close().await.unwrap();
            (read, report, appended_offset)
        });
        prop_assert_eq!(report.entry_count, kept_count as u64);
        prop_assert_eq!(report.next_offset, next_offset);
        prop_assert_eq!(report.truncated_bytes, (on_disk.len() - kept_bytes) as u64);
        prop_assert_eq!(read, full[..kept_bytes].to_vec());
        prop_assert_eq!(appended_offset, next_offset);
    }
}
