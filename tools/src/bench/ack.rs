//! Acknowledgements: the offset ranges the server assigned to acknowledged batches, the arithmetic
//! over them, and the ledger where producers record them for the consumers.
//!
//! Must never decide what is lost: that is `verify.rs`; this only records and counts.

use std::sync::{Mutex, PoisonError};

/// One acknowledged batch: the server stored `message_count` messages at
/// `base_offset..base_offset + message_count`, with ids `first_id..first_id + message_count`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct AckRange {
    pub base_offset: u64,
    pub message_count: u32,
    /// Id of the message at `base_offset`; ids are consecutive within a batch.
    pub first_id: u64,
    /// Payload bytes of the batch (without headers), for MB/s.
    pub payload_bytes: u64,
}

impl AckRange {
    /// One past the last offset of the range.
    pub fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count)
    }

    pub fn contains(&self, offset: u64) -> bool {
        self.base_offset <= offset && offset < self.end_offset()
    }

    /// Id acknowledged at `offset`. Panics (a caller bug) if `offset` is outside the range.
    pub fn id_at(&self, offset: u64) -> u64 {
        assert!(
            self.contains(offset),
            "offset {offset} outside ack range {self:?}"
        );
        self.first_id + (offset - self.base_offset)
    }
}

/// End of the acknowledged part of a partition: the highest `end_offset` of its ranges.
pub fn acked_end_offset(acks: &[AckRange]) -> u64 {
    acks.iter().map(AckRange::end_offset).max().unwrap_or(0)
}

/// Acknowledged messages in `from_offset..to_offset`.
pub fn acked_count_in(acks: &[AckRange], from_offset: u64, to_offset: u64) -> u64 {
    acks.iter()
        .map(|range| {
            let start = range.base_offset.max(from_offset);
            let end = range.end_offset().min(to_offset);
            end.saturating_sub(start)
        })
        .sum()
}

/// Messages acknowledged twice: offsets covered by more than one range. The server can hold only
/// one message per offset, so each such offset lost one acknowledged message.
pub fn overlapping_ack_count(acks: &[AckRange]) -> u64 {
    let mut sorted = acks.to_vec();
    sorted.sort_by_key(|range| range.base_offset);
    let mut covered_end = 0;
    let mut overlap_count = 0;
    for range in &sorted {
        overlap_count += covered_end
            .min(range.end_offset())
            .saturating_sub(range.base_offset);
        covered_end = covered_end.max(range.end_offset());
    }
    overlap_count
}

/// Every acknowledgement of the run, per partition index, in the order the acks arrived.
#[derive(Debug)]
pub struct AckLedger {
    partitions: Vec<Mutex<Vec<AckRange>>>,
}

impl AckLedger {
    pub fn new(partition_count: usize) -> AckLedger {
        AckLedger {
            partitions: (0..partition_count)
                .map(|_| Mutex::new(Vec::new()))
                .collect(),
        }
    }

    pub fn record(&self, partition_index: usize, range: AckRange) {
        self.partitions[partition_index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(range);
    }

    /// Appends to `known` the ranges recorded since `known` was last brought up to date.
    pub fn copy_new(&self, partition_index: usize, known: &mut Vec<AckRange>) {
        let ranges = self.partitions[partition_index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        known.extend_from_slice(&ranges[known.len()..]);
    }

    pub fn ranges(&self, partition_index: usize) -> Vec<AckRange> {
        self.partitions[partition_index]
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn range(base_offset: u64, message_count: u32) -> AckRange {
        AckRange {
            base_offset,
            message_count,
            first_id: 100,
            payload_bytes: 0,
        }
    }

    #[test]
    fn range_arithmetic() {
        let acks = [range(0, 3), range(3, 2)];
        assert_eq!(acks[1].id_at(4), 101);
        assert!(!acks[1].contains(5));
        assert_eq!(acked_end_offset(&acks), 5);
        assert_eq!(acked_end_offset(&[]), 0);
        assert_eq!(acked_count_in(&acks, 2, 4), 2);
        assert_eq!(acked_count_in(&acks, 5, 9), 0);
        assert_eq!(overlapping_ack_count(&acks), 0);
        assert_eq!(
            overlapping_ack_count(&[range(0, 3), range(2, 2), range(1, 1)]),
            2
        );
    }

    #[test]
    fn ledger_hands_out_only_new_ranges() {
        let ledger = AckLedger::new(2);
        let range = |base_offset| AckRange {
            base_offset,
            message_count: 10,
            first_id: 0,
            payload_bytes: 0,
        };
        ledger.record(1, range(0));
        let mut known = Vec::new();
        ledger.copy_new(1, &mut known);
        ledger.record(1, range(10));
        ledger.copy_new(1, &mut known);
        assert_eq!(known, vec![range(0), range(10)]);
        assert_eq!(ledger.ranges(1), known);
        assert!(ledger.ranges(0).is_empty());
    }
}
