//! The owner shard's idempotent-producer table (issue 7 item 5, after Kafka's producer state,
//! KIP-98): per partition and producer, the last few acknowledged batches (sequence range ->
//! base offset), so a resent batch is answered with its original offsets instead of being
//! appended twice, and a batch that skips sequence numbers is refused.
//!
//! Rules for a batch of producer `p` with sequence `s` and `n` messages in a partition:
//! - `p` unknown here (never seen, or evicted from the full table or from the log's producer
//!   state): appended, whatever `s` (a new session starts at 0; a non-zero `s` is a
//!   producer this shard no longer remembers, and refusing it would block that producer for good).
//! - `s` is the next expected sequence (end of the last remembered batch): appended.
//! - `s`, `n` equal a remembered batch: a duplicate, answered with its base offset (or `Busy`
//!   while the original is not yet durable); nothing is appended.
//! - `s` beyond the next expected: `SequenceGap` naming both; nothing is appended.
//! - `s` before the oldest remembered batch: `SequenceGap` saying it is older than the window
//!   (it may be a duplicate that can no longer be verified); nothing is appended.
//! - `s` inside the window but not a remembered batch's exact range: `InvalidArgument`.
//!
//! The table is bounded (`PRODUCER_STATE_COUNT_MAX` producer-partition pairs per shard); one
//! more evicts the least recently used, with a log line. It lives on the owner shard only and is
//! never touched across an `.await`: the caller checks and enqueues the append in one step.

use std::collections::{BTreeMap, VecDeque};

use ahash::AHashMap;
use bus::Namespace;
use storage::ProducerBatch;

use crate::limits::{PRODUCER_STATE_COUNT_MAX, PRODUCER_WINDOW_BATCH_COUNT};

// After a restart the table is rebuilt from what the log's producer state kept (its snapshot at
// the last roll plus the active segment): a log that kept a smaller window, or fewer producers
// than one partition may have here, would forget across a restart batches the running server
// answered resends of.
const _: () = assert!(PRODUCER_WINDOW_BATCH_COUNT <= storage::limits::PRODUCER_WINDOW_BATCH_COUNT);
const _: () = assert!(PRODUCER_STATE_COUNT_MAX <= storage::limits::PRODUCER_STATE_COUNT_MAX);

/// One remembered batch of a producer in a partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Remembered {
    sequence: u64,
    message_count: u32,
    base_offset: u64,
    /// The append completed (durable per the fsync policy); a duplicate may be acknowledged.
    durable: bool,
}

impl Remembered {
    fn sequence_end(&self) -> u64 {
        self.sequence.saturating_add(u64::from(self.message_count))
    }
}

#[derive(Debug)]
struct ProducerState {
    /// Tick of the last check or record: the key of this state in `ProducerTable::order`.
    used_tick: u64,
    /// Oldest first, at most `PRODUCER_WINDOW_BATCH_COUNT`, never empty.
    batches: VecDeque<Remembered>,
}

/// What to do with a batch; see the module docs for the rules.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Append it, then `record` it.
    Append,
    /// Already appended and durable at `base_offset`: answer that, append nothing.
    Duplicate { base_offset: u64 },
    /// Already appended, not yet durable: answer `Busy`, the client resends.
    InFlight,
    /// Sequence numbers skipped: `SequenceGap`.
    Gap { expected: u64 },
    /// Older than every remembered batch: `SequenceGap` (distinct message).
    TooOld { oldest: u64, expected: u64 },
    /// Overlaps the window without matching a remembered batch: `InvalidArgument`.
    Overlap { expected: u64 },
}

/// The idempotent-producer table of one shard, keyed by (partition, producer).
#[derive(Debug)]
pub struct ProducerTable {
    states: AHashMap<(Namespace, u64), ProducerState>,
    /// Least recently used first.
    order: BTreeMap<u64, (Namespace, u64)>,
    tick_next: u64,
    capacity: usize,
}

impl Default for ProducerTable {
    fn default() -> ProducerTable {
        ProducerTable::with_capacity(PRODUCER_STATE_COUNT_MAX)
    }
}

impl ProducerTable {
    /// An empty table holding at most `capacity` producer-partition states.
    ///
    /// # Panics
    /// If `capacity` is 0.
    pub fn with_capacity(capacity: usize) -> ProducerTable {
        assert!(capacity > 0, "a producer table holds at least one producer");
        ProducerTable {
            states: AHashMap::new(),
            order: BTreeMap::new(),
            tick_next: 0,
            capacity,
        }
    }

    /// Producer-partition states held.
    pub fn len(&self) -> usize {
        self.states.len()
    }

    /// Whether no state is held.
    pub fn is_empty(&self) -> bool {
        self.states.is_empty()
    }

    /// Marks `key` as just used.
    fn touch(&mut self, key: (Namespace, u64)) {
        let tick = self.tick_next;
        self.tick_next += 1;
        if let Some(state) = self.states.get_mut(&key) {
            self.order.remove(&state.used_tick);
            state.used_tick = tick;
            self.order.insert(tick, key);
        }
    }

    /// The verdict for a batch of `producer` in `namespace` starting at `sequence` with
    /// `message_count` messages. Counts as a use for the eviction order.
    pub fn check(
        &mut self,
        namespace: Namespace,
        producer: u64,
        sequence: u64,
        message_count: u32,
    ) -> Verdict {
        let key = (namespace, producer);
        self.touch(key);
        let Some(state) = self.states.get(&key) else {
            return Verdict::Append;
        };
        let (Some(oldest), Some(last)) = (state.batches.front(), state.batches.back()) else {
            return Verdict::Append;
        };
        let expected = last.sequence_end();
        if sequence == expected {
            return Verdict::Append;
        }
        if sequence > expected {
            return Verdict::Gap { expected };
        }
        if let Some(remembered) = state
            .batches
            .iter()
            .find(|remembered| remembered.sequence == sequence)
            && remembered.message_count == message_count
        {
            return if remembered.durable {
                Verdict::Duplicate {
                    base_offset: remembered.base_offset,
                }
            } else {
                Verdict::InFlight
            };
        }
        if sequence < oldest.sequence {
            return Verdict::TooOld {
                oldest: oldest.sequence,
                expected,
            };
        }
        Verdict::Overlap { expected }
    }

    /// Remembers a batch just enqueued at `base_offset` (`durable` false until `confirm`), or
    /// recovered from the log (`durable` true). Returns the key evicted to make room, if any.
    pub fn record(
        &mut self,
        namespace: Namespace,
        batch: ProducerBatch,
        durable: bool,
    ) -> Option<(Namespace, u64)> {
        let key = (namespace, batch.producer);
        let remembered = Remembered {
            sequence: batch.sequence,
            message_count: batch.message_count,
            base_offset: batch.base_offset,
            durable,
        };
        if let Some(state) = self.states.get_mut(&key) {
            if state.batches.len() == PRODUCER_WINDOW_BATCH_COUNT {
                state.batches.pop_front();
            }
            state.batches.push_back(remembered);
            self.touch(key);
            return None;
        }
        let evicted = if self.states.len() >= self.capacity {
            self.evict_least_recently_used()
        } else {
            None
        };
        let tick = self.tick_next;
        self.tick_next += 1;
        self.order.insert(tick, key);
        self.states.insert(
            key,
            ProducerState {
                used_tick: tick,
                batches: VecDeque::from([remembered]),
            },
        );
        evicted
    }

    fn evict_least_recently_used(&mut self) -> Option<(Namespace, u64)> {
        let (_, key) = self.order.pop_first()?;
        self.states.remove(&key);
        Some(key)
    }

    /// The append of the batch `sequence` of `producer` completed: duplicates of it may now be
    /// acknowledged. A batch no longer remembered is ignored.
    pub fn confirm(&mut self, namespace: Namespace, producer: u64, sequence: u64) {
        if let Some(state) = self.states.get_mut(&(namespace, producer))
            && let Some(remembered) = state
                .batches
                .iter_mut()
                .find(|remembered| remembered.sequence == sequence)
        {
            remembered.durable = true;
        }
    }

    /// The append of the batch `sequence` of `producer` failed: forgets it and every later batch
    /// of that producer in `namespace` (appended after it, they fail with it), and the producer
    /// if nothing is left.
    pub fn forget_from(&mut self, namespace: Namespace, producer: u64, sequence: u64) {
        let key = (namespace, producer);
        let Some(state) = self.states.get_mut(&key) else {
            return;
        };
        if let Some(index) = state
            .batches
            .iter()
            .position(|remembered| remembered.sequence == sequence)
        {
            state.batches.truncate(index);
        }
        if state.batches.is_empty() {
            let used_tick = state.used_tick;
            self.states.remove(&key);
            self.order.remove(&used_tick);
        }
    }

    /// Forgets every producer of `namespace` (the partition was deleted).
    pub fn remove_partition(&mut self, namespace: Namespace) {
        let order = &mut self.order;
        self.states.retain(|(state_namespace, _), state| {
            let keep = *state_namespace != namespace;
            if !keep {
                order.remove(&state.used_tick);
            }
            keep
        });
    }

    /// Rebuilds the states of `namespace` from the stamped batches recovery found in its log
    /// (`RecoveryReport::producer_batches`: each producer's last batches, from the active
    /// segment's producer-state snapshot and the active segment), in log order. Returns how many
    /// states were evicted to make room.
    pub fn restore(&mut self, namespace: Namespace, batches: &[ProducerBatch]) -> usize {
        batches
            .iter()
            .filter(|batch| self.record(namespace, **batch, true).is_some())
            .count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PARTITION: Namespace = Namespace(0x0001_0001_0000_0000);

    fn batch(producer: u64, sequence: u64, message_count: u32, base_offset: u64) -> ProducerBatch {
        ProducerBatch {
            producer,
            sequence,
            message_count,
            base_offset,
        }
    }

    #[test]
    fn issue7_5_duplicate_gets_original_offset() {
        let mut table = ProducerTable::default();
        assert_eq!(table.check(PARTITION, 7, 0, 3), Verdict::Append);
        table.record(PARTITION, batch(7, 0, 3, 100), false);
        assert_eq!(table.check(PARTITION, 7, 0, 3), Verdict::InFlight);
        table.confirm(PARTITION, 7, 0);
        assert_eq!(
            table.check(PARTITION, 7, 0, 3),
            Verdict::Duplicate { base_offset: 100 }
        );
        assert_eq!(table.check(PARTITION, 7, 3, 2), Verdict::Append);
        // Another partition, another producer: independent.
        assert_eq!(
            table.check(Namespace(PARTITION.0 + 1), 7, 0, 3),
            Verdict::Append
        );
        assert_eq!(table.check(PARTITION, 8, 0, 3), Verdict::Append);
    }

    #[test]
    fn issue7_5_gap_too_old_and_overlap_are_refused() {
        let mut table = ProducerTable::default();
        for index in 0..7u64 {
            table.record(PARTITION, batch(7, index * 2, 2, 50 + index * 2), true);
        }
        // Window: sequences 4, 6, 8, 10, 12 (two messages each); next expected 14.
        assert_eq!(
            table.check(PARTITION, 7, 15, 1),
            Verdict::Gap { expected: 14 }
        );
        assert_eq!(
            table.check(PARTITION, 7, 2, 2),
            Verdict::TooOld {
                oldest: 4,
                expected: 14
            }
        );
        assert_eq!(
            table.check(PARTITION, 7, 4, 2),
            Verdict::Duplicate { base_offset: 54 }
        );
        assert_eq!(
            table.check(PARTITION, 7, 5, 2),
            Verdict::Overlap { expected: 14 }
        );
        assert_eq!(
            table.check(PARTITION, 7, 4, 1),
            Verdict::Overlap { expected: 14 }
        );
        assert_eq!(table.check(PARTITION, 7, 14, 1), Verdict::Append);
    }

    #[test]
    fn issue7_5_unknown_producer_with_any_sequence_starts_a_session() {
        let mut table = ProducerTable::default();
        assert_eq!(table.check(PARTITION, 9, 1_000, 1), Verdict::Append);
        table.record(PARTITION, batch(9, 1_000, 1, 0), true);
        assert_eq!(
            table.check(PARTITION, 9, 0, 1),
            Verdict::TooOld {
                oldest: 1_000,
                expected: 1_001
            }
        );
    }

    #[test]
    fn issue7_5_failed_append_forgets_it_and_later_batches() {
        let mut table = ProducerTable::default();
        table.record(PARTITION, batch(7, 0, 1, 0), true);
        table.record(PARTITION, batch(7, 1, 1, 1), false);
        table.record(PARTITION, batch(7, 2, 1, 2), false);
        table.forget_from(PARTITION, 7, 1);
        assert_eq!(table.check(PARTITION, 7, 1, 1), Verdict::Append);
        table.forget_from(PARTITION, 7, 0);
        assert!(table.is_empty());
        assert_eq!(table.check(PARTITION, 7, 5, 1), Verdict::Append);
    }

    #[test]
    fn issue7_5_full_table_evicts_the_least_recently_used() {
        let mut table = ProducerTable::with_capacity(2);
        assert_eq!(table.record(PARTITION, batch(1, 0, 1, 0), true), None);
        assert_eq!(table.record(PARTITION, batch(2, 0, 1, 1), true), None);
        // Producer 1 is used again, so producer 2 is the least recently used.
        assert_eq!(
            table.check(PARTITION, 1, 0, 1),
            Verdict::Duplicate { base_offset: 0 }
        );
        assert_eq!(
            table.record(PARTITION, batch(3, 0, 1, 2), true),
            Some((PARTITION, 2))
        );
        assert_eq!(table.len(), 2);
        // Evicted: its next batch is taken as a first batch.
        assert_eq!(table.check(PARTITION, 2, 0, 1), Verdict::Append);
        table.remove_partition(PARTITION);
        assert!(table.is_empty());
    }

    #[test]
    fn issue7_5_restore_keeps_the_last_window_per_producer() {
        let mut table = ProducerTable::default();
        let batches: Vec<ProducerBatch> =
            (0..8u64).map(|index| batch(7, index, 1, index)).collect();
        assert_eq!(table.restore(PARTITION, &batches), 0);
        assert_eq!(
            table.check(PARTITION, 7, 7, 1),
            Verdict::Duplicate { base_offset: 7 }
        );
        assert_eq!(
            table.check(PARTITION, 7, 3, 1),
            Verdict::Duplicate { base_offset: 3 }
        );
        assert_eq!(
            table.check(PARTITION, 7, 2, 1),
            Verdict::TooOld {
                oldest: 3,
                expected: 8
            }
        );
    }
}
