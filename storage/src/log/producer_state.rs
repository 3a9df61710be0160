//! The producer state of one partition log (issue 7 item 5, after Kafka's producer-state
//! snapshots): per idempotent producer, its last [`PRODUCER_WINDOW_BATCH_COUNT`] stamped batches,
//! kept as the log acknowledges appends and written at every segment roll as the snapshot file
//! `{base_offset:020}.producers` of the new segment (`storage/FORMAT.md` section 3a). Opening a
//! log loads the active segment's snapshot and adds the stamps of the active segment, so a
//! producer is remembered however many segments ago it last appended.
//!
//! A snapshot is derived from the log: a missing or damaged one must never fail an open, and is
//! never passed over silently either (open logs why and rebuilds the same state from an older
//! snapshot and the segments after it, or, when none is usable, from the stamps at the end of
//! the previous segment). This module keeps and encodes state; it never decides what a resend
//! means (the owner shard does).

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::path::{Path, PathBuf};

use super::Segment;
use super::recovery::{closed_segment_stamps, previous_segment_stamps};
use crate::durable::{DurableError, list_dir_names, read_verified};
use crate::entry::ProducerBatch;
use crate::limits::{
    PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX, PRODUCER_STATE_COUNT_MAX,
    PRODUCER_WINDOW_BATCH_COUNT,
};

/// First 8 bytes of a producer-state snapshot payload.
pub(crate) const PRODUCER_SNAPSHOT_MAGIC: [u8; 8] = *b"SLPRODS\0";
/// Current producer-state snapshot layout version.
pub(crate) const PRODUCER_SNAPSHOT_VERSION: u32 = 1;
/// Bytes before the first producer: magic, version, reserved, segment base offset, producer
/// count, reserved.
pub(crate) const PRODUCER_SNAPSHOT_HEADER_SIZE: usize = 32;
/// Bytes of one producer's header: producer id, batch count, reserved.
pub(crate) const PRODUCER_SNAPSHOT_PRODUCER_SIZE: usize = 16;
/// Bytes of one batch: sequence, base offset, message count, reserved.
pub(crate) const PRODUCER_SNAPSHOT_BATCH_SIZE: usize = 24;
/// Largest snapshot payload: every producer with a full window.
pub(crate) const PRODUCER_SNAPSHOT_PAYLOAD_SIZE_MAX: usize = PRODUCER_SNAPSHOT_HEADER_SIZE
    + PRODUCER_STATE_COUNT_MAX
        * (PRODUCER_SNAPSHOT_PRODUCER_SIZE
            + PRODUCER_WINDOW_BATCH_COUNT * PRODUCER_SNAPSHOT_BATCH_SIZE);

const _: () =
    assert!(PRODUCER_SNAPSHOT_PAYLOAD_SIZE_MAX as u64 + 8 <= crate::limits::DURABLE_FILE_SIZE_MAX);
const _: () = assert!(PRODUCER_STATE_COUNT_MAX <= u32::MAX as usize);
const _: () = assert!(PRODUCER_WINDOW_BATCH_COUNT >= 1 && PRODUCER_WINDOW_BATCH_COUNT <= 255);

/// `{base_offset:020}.producers` in `dir`: the producer state as of the start of that segment.
pub(crate) fn producer_snapshot_path(dir: &Path, base_offset: u64) -> PathBuf {
    dir.join(format!("{base_offset:020}.producers"))
}

/// The base offset of a snapshot file name, or of one of its durable-replace leftovers
/// (`.producers.tmp`, `.producers.prev`), with whether it is a leftover.
fn parse_producer_snapshot_name(name: &str) -> Option<(u64, bool)> {
    let (stem, leftover) = match name.strip_suffix(".tmp").or(name.strip_suffix(".prev")) {
        Some(stem) => (stem, true),
        None => (name, false),
    };
    let digits = stem.strip_suffix(".producers")?;
    if digits.len() != 20 || !digits.bytes().all(|byte| byte.is_ascii_digit()) {
        return None;
    }
    Some((digits.parse().ok()?, leftover))
}

/// Every producer's last batches in one log, bounded: at most [`PRODUCER_STATE_COUNT_MAX`]
/// producers (one more evicts the least recently appended) and [`PRODUCER_WINDOW_BATCH_COUNT`]
/// batches each. Batches must be recorded in log order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct ProducerStates {
    /// Per producer, its last batches, oldest first; never empty.
    windows: HashMap<u64, VecDeque<ProducerBatch>>,
    /// Producer by the base offset of its last batch: least recently appended first, the eviction
    /// order. Base offsets are unique within a log, so the keys are too.
    recency: BTreeMap<u64, u64>,
}

impl ProducerStates {
    /// Producers held.
    #[cfg(test)]
    pub(crate) fn producer_count(&self) -> usize {
        self.windows.len()
    }

    /// Adds `batch` as its producer's latest, evicting the least recently appended producer when
    /// the state is full and the producer is new.
    ///
    /// # Panics
    /// If `batch` is not after every batch recorded before (batches come in log order).
    pub(crate) fn record(&mut self, batch: ProducerBatch) {
        if let Some(window) = self.windows.get_mut(&batch.producer) {
            let last = window.back().expect("a window is never empty").base_offset;
            assert!(
                batch.base_offset > last,
                "producer batches are recorded in log order"
            );
            self.recency.remove(&last);
            if window.len() == PRODUCER_WINDOW_BATCH_COUNT {
                window.pop_front();
            }
            window.push_back(batch);
        } else {
            if self.windows.len() == PRODUCER_STATE_COUNT_MAX
                && let Some((_, evicted)) = self.recency.pop_first()
            {
                self.windows.remove(&evicted);
            }
            self.windows.insert(batch.producer, VecDeque::from([batch]));
        }
        let replaced = self.recency.insert(batch.base_offset, batch.producer);
        assert!(
            replaced.is_none(),
            "two batches of one log share the base offset {}",
            batch.base_offset
        );
    }

    /// Every batch held, in log order (ascending base offset).
    pub(crate) fn batches_in_log_order(&self) -> Vec<ProducerBatch> {
        let mut batches: Vec<ProducerBatch> = self.windows.values().flatten().copied().collect();
        batches.sort_unstable_by_key(|batch| batch.base_offset);
        batches
    }

    /// The snapshot payload for the segment starting at `segment_base_offset` (FORMAT.md
    /// section 3a): producers least recently appended first, each one's batches oldest first.
    pub(crate) fn encode(&self, segment_base_offset: u64) -> Vec<u8> {
        let batch_count: usize = self.windows.values().map(VecDeque::len).sum();
        let mut bytes = Vec::with_capacity(
            PRODUCER_SNAPSHOT_HEADER_SIZE
                + self.windows.len() * PRODUCER_SNAPSHOT_PRODUCER_SIZE
                + batch_count * PRODUCER_SNAPSHOT_BATCH_SIZE,
        );
        bytes.extend_from_slice(&PRODUCER_SNAPSHOT_MAGIC);
        bytes.extend_from_slice(&PRODUCER_SNAPSHOT_VERSION.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        bytes.extend_from_slice(&segment_base_offset.to_le_bytes());
        let producer_count = u32::try_from(self.windows.len()).expect("bounded by a u32 constant");
        bytes.extend_from_slice(&producer_count.to_le_bytes());
        bytes.extend_from_slice(&0u32.to_le_bytes());
        for producer in self.recency.values() {
            let window = &self.windows[producer];
            bytes.extend_from_slice(&producer.to_le_bytes());
            let window_count = u32::try_from(window.len()).expect("bounded by a small constant");
            bytes.extend_from_slice(&window_count.to_le_bytes());
            bytes.extend_from_slice(&0u32.to_le_bytes());
            for batch in window {
                bytes.extend_from_slice(&batch.sequence.to_le_bytes());
                bytes.extend_from_slice(&batch.base_offset.to_le_bytes());
                bytes.extend_from_slice(&batch.message_count.to_le_bytes());
                bytes.extend_from_slice(&0u32.to_le_bytes());
            }
        }
        debug_assert!(bytes.len() <= PRODUCER_SNAPSHOT_PAYLOAD_SIZE_MAX);
        bytes
    }

    /// Decodes a snapshot payload (trailer already checked) of the segment starting at
    /// `segment_base_offset`, checking every rule of FORMAT.md section 3a.
    ///
    /// # Errors
    /// A reason naming the first rule broken and the byte position.
    pub(crate) fn decode(payload: &[u8], segment_base_offset: u64) -> Result<Self, String> {
        let mut reader = Reader { payload, at: 0 };
        if payload.len() < PRODUCER_SNAPSHOT_HEADER_SIZE {
            return Err(format!(
                "{} bytes is shorter than the {PRODUCER_SNAPSHOT_HEADER_SIZE}-byte header",
                payload.len()
            ));
        }
        if reader.bytes(8)? != PRODUCER_SNAPSHOT_MAGIC {
            return Err("bad magic at byte 0".to_owned());
        }
        let version = reader.u32()?;
        if version != PRODUCER_SNAPSHOT_VERSION {
            return Err(format!(
                "version {version} at byte 8, expected {PRODUCER_SNAPSHOT_VERSION}"
            ));
        }
        reader.reserved()?;
        let base_offset = reader.u64()?;
        if base_offset != segment_base_offset {
            return Err(format!(
                "names segment base offset {base_offset} at byte 16 but belongs to the segment \
                 at {segment_base_offset}"
            ));
        }
        let producer_count = reader.u32()? as usize;
        if producer_count > PRODUCER_STATE_COUNT_MAX {
            return Err(format!(
                "producer count {producer_count} at byte 24 exceeds {PRODUCER_STATE_COUNT_MAX}"
            ));
        }
        reader.reserved()?;
        let mut states = ProducerStates::default();
        for _ in 0..producer_count {
            states.decode_producer(&mut reader, segment_base_offset)?;
        }
        if reader.at != payload.len() {
            return Err(format!(
                "{} bytes after the last producer at byte {}",
                payload.len() - reader.at,
                reader.at
            ));
        }
        Ok(states)
    }

    fn decode_producer(
        &mut self,
        reader: &mut Reader<'_>,
        segment_base_offset: u64,
    ) -> Result<(), String> {
        let producer_at = reader.at;
        let producer = reader.u64()?;
        if producer == 0 {
            return Err(format!("producer 0 at byte {producer_at}"));
        }
        let batch_count = reader.u32()? as usize;
        if !(1..=PRODUCER_WINDOW_BATCH_COUNT).contains(&batch_count) {
            return Err(format!(
                "producer {producer} at byte {producer_at} has {batch_count} batches, expected \
                 1..={PRODUCER_WINDOW_BATCH_COUNT}"
            ));
        }
        reader.reserved()?;
        let mut window = VecDeque::with_capacity(batch_count);
        for _ in 0..batch_count {
            let batch_at = reader.at;
            let sequence = reader.u64()?;
            let base_offset = reader.u64()?;
            let message_count = reader.u32()?;
            reader.reserved()?;
            let previous_end = window.back().map(|batch: &ProducerBatch| batch.base_offset);
            if message_count == 0
                || base_offset >= segment_base_offset
                || previous_end.is_some_and(|previous| base_offset <= previous)
            {
                return Err(format!(
                    "batch at byte {batch_at} (offset {base_offset}, {message_count} messages) \
                     is empty, not below the segment base {segment_base_offset}, or not after \
                     the producer's previous batch"
                ));
            }
            window.push_back(ProducerBatch {
                producer,
                sequence,
                message_count,
                base_offset,
            });
        }
        let last = window.back().expect("batch_count >= 1").base_offset;
        if self
            .recency
            .last_key_value()
            .is_some_and(|(previous_last, _)| last <= *previous_last)
        {
            return Err(format!(
                "producer {producer} at byte {producer_at} is out of order: producers are \
                 sorted by the offset of their last batch"
            ));
        }
        if self.windows.insert(producer, window).is_some() {
            return Err(format!(
                "producer {producer} at byte {producer_at} appears twice"
            ));
        }
        self.recency.insert(last, producer);
        Ok(())
    }
}

impl From<ProducerStates> for Vec<ProducerBatch> {
    fn from(states: ProducerStates) -> Vec<ProducerBatch> {
        states.batches_in_log_order()
    }
}

/// Little-endian fields of a payload, front to back; running out is an error naming the byte.
struct Reader<'a> {
    payload: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn bytes(&mut self, length: usize) -> Result<&[u8], String> {
        let Some(bytes) = self.payload.get(self.at..self.at + length) else {
            return Err(format!(
                "ends at byte {} inside a field of {length} bytes at byte {}",
                self.payload.len(),
                self.at
            ));
        };
        self.at += length;
        Ok(bytes)
    }

    fn u64(&mut self) -> Result<u64, String> {
        let mut field = [0u8; 8];
        field.copy_from_slice(self.bytes(8)?);
        Ok(u64::from_le_bytes(field))
    }

    fn u32(&mut self) -> Result<u32, String> {
        let mut field = [0u8; 4];
        field.copy_from_slice(self.bytes(4)?);
        Ok(u32::from_le_bytes(field))
    }

    fn reserved(&mut self) -> Result<(), String> {
        let at = self.at;
        match self.u32()? {
            0 => Ok(()),
            value => Err(format!("reserved field at byte {at} is {value}, not 0")),
        }
    }
}

/// What opening a log knows of its producers.
#[derive(Debug, Default)]
pub(crate) struct RecoveredProducers {
    pub(crate) states: ProducerStates,
    /// Base offsets of the snapshot files left in the directory (the active segment's and the
    /// previous one's, when present).
    pub(crate) snapshot_base_offsets: BTreeSet<u64>,
}

/// The producer state at the end of the log: the active segment's snapshot plus the stamps
/// `active_batches` found in the active segment, in log order. `closed` is the last
/// [`PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX`] closed segments (fewer when the log has
/// fewer), with their indexes: all that any fallback below reads. When that snapshot is missing or
/// damaged (logged), the newest usable snapshot of the last
/// [`PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX`] closed segments (the first segment's state is
/// empty) plus the stamps of every segment from it on, which is the same state; only when none
/// is usable, the stamps at the end of the last closed segment (logged: older producers are
/// forgotten). Deletes the snapshot files of other segments (older ones, and those of a roll a
/// crash cut short) and leftovers of interrupted snapshot writes, but keeps the one it loaded
/// until a roll writes a usable one.
///
/// # Errors
/// `Io` when a closed segment cannot be read for the fallback.
pub(crate) async fn recover_producers(
    dir: &Path,
    closed: &[Segment],
    active_base_offset: u64,
    active_batches: Vec<ProducerBatch>,
) -> Result<RecoveredProducers, super::LogError> {
    let (mut states, loaded) = match closed.last() {
        // The first segment of a log has nothing before it, so no snapshot.
        None if active_base_offset == 0 => (ProducerStates::default(), None),
        // Retention deleted every sealed segment (issue 11 section 4): the active segment's
        // snapshot is the only record of the producers before it.
        None => match load_snapshot(dir, active_base_offset).await {
            Ok(states) => (states, Some(active_base_offset)),
            Err(reason) => {
                tracing::warn!(
                    snapshot = %producer_snapshot_path(dir, active_base_offset).display(),
                    %reason,
                    "producer-state snapshot not usable and retention deleted every segment \
                     before the active one; idempotent producers are recovered from the active \
                     segment only"
                );
                (ProducerStates::default(), None)
            }
        },
        Some(_) => match load_snapshot(dir, active_base_offset).await {
            Ok(states) => (states, Some(active_base_offset)),
            Err(reason) => {
                let path = producer_snapshot_path(dir, active_base_offset);
                tracing::warn!(
                    snapshot = %path.display(),
                    %reason,
                    "producer-state snapshot not usable; recovering idempotent producers from an \
                     older snapshot and the segments after it"
                );
                recover_from_older_snapshot(dir, closed).await?
            }
        },
    };
    for batch in active_batches {
        states.record(batch);
    }
    let keep: Vec<u64> = closed
        .last()
        .map(|previous| previous.index.base_offset)
        .into_iter()
        .chain([active_base_offset])
        .chain(loaded)
        .collect();
    let snapshot_base_offsets = remove_other_snapshots(dir, &keep).await;
    Ok(RecoveredProducers {
        states,
        snapshot_base_offsets,
    })
}

/// The producer state at the start of the active segment when its snapshot is not usable: the
/// newest usable snapshot among the last [`PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX`] closed
/// segments (the first segment, base 0, starts with an empty state) plus the stamps of every
/// closed segment from it on, with the base offset of the snapshot used (`None` for the empty
/// state of the first segment). When none is usable, the stamps at the end of the last closed
/// segment, with a warning that older producers are forgotten.
///
/// # Errors
/// `Io` when a closed segment cannot be read.
async fn recover_from_older_snapshot(
    dir: &Path,
    closed: &[Segment],
) -> Result<(ProducerStates, Option<u64>), super::LogError> {
    let first_tried = closed
        .len()
        .saturating_sub(PRODUCER_SNAPSHOT_FALLBACK_SEGMENT_COUNT_MAX);
    for from in (first_tried..closed.len()).rev() {
        let base_offset = closed[from].index.base_offset;
        let loaded = if base_offset == 0 {
            Ok((ProducerStates::default(), None))
        } else {
            load_snapshot(dir, base_offset)
                .await
                .map(|states| (states, Some(base_offset)))
        };
        match loaded {
            Ok((mut states, loaded)) => {
                for segment in &closed[from..] {
                    for batch in closed_segment_stamps(segment).await? {
                        states.record(batch);
                    }
                }
                tracing::info!(
                    from_segment = base_offset,
                    scanned_segment_count = closed.len() - from,
                    "idempotent producers recovered from an older producer-state snapshot and \
                     the stamps of the segments after it"
                );
                return Ok((states, loaded));
            }
            Err(reason) => {
                tracing::warn!(
                    snapshot = %producer_snapshot_path(dir, base_offset).display(),
                    %reason,
                    "older producer-state snapshot not usable either"
                );
            }
        }
    }
    let previous = closed
        .last()
        .expect("called with at least one closed segment");
    tracing::warn!(
        segment = %previous.path.display(),
        "no producer-state snapshot usable; idempotent producers are recovered from the active \
         segment and the end of the previous one only, so a producer whose last batch is older is \
         forgotten"
    );
    let mut states = ProducerStates::default();
    for batch in previous_segment_stamps(previous).await? {
        states.record(batch);
    }
    Ok((states, None))
}

/// Loads and checks the snapshot of the segment at `base_offset`.
///
/// # Errors
/// Why it cannot be used: missing, unreadable, failing its checksum or a rule of its layout.
async fn load_snapshot(dir: &Path, base_offset: u64) -> Result<ProducerStates, String> {
    let path = producer_snapshot_path(dir, base_offset);
    match read_verified(&path).await {
        Ok(Some(payload)) => ProducerStates::decode(&payload, base_offset),
        Ok(None) => Err("the file is missing".to_owned()),
        Err(DurableError::Corrupt { reason, .. }) => Err(reason),
        Err(DurableError::Io { op, source, .. }) => Err(format!("{op} failed: {source}")),
    }
}

/// Deletes every snapshot file of `dir` whose base offset is not in `keep`, and every leftover of
/// an interrupted snapshot write; returns the base offsets of the snapshot files kept. A file that
/// cannot be listed or deleted is logged and left (it is never read).
async fn remove_other_snapshots(dir: &Path, keep: &[u64]) -> BTreeSet<u64> {
    let mut kept = BTreeSet::new();
    let names = match list_dir_names(dir).await {
        Ok(names) => names,
        Err(error) => {
            tracing::warn!(dir = %dir.display(), %error, "cannot list old producer-state snapshots; left in place");
            return keep.iter().copied().collect();
        }
    };
    for name in names {
        let Some((base_offset, leftover)) = parse_producer_snapshot_name(&name) else {
            continue;
        };
        if !leftover && keep.contains(&base_offset) {
            kept.insert(base_offset);
            continue;
        }
        let path = dir.join(&name);
        match compio::fs::remove_file(&path).await {
            Ok(()) => {
                tracing::debug!(file = %path.display(), "deleted an old producer-state snapshot");
            }
            Err(error) => {
                tracing::warn!(
                    file = %path.display(),
                    %error,
                    "cannot delete an old producer-state snapshot; left in place"
                );
            }
        }
    }
    kept
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn batch(producer: u64, sequence: u64, message_count: u32, base_offset: u64) -> ProducerBatch {
        ProducerBatch {
            producer,
            sequence,
            message_count,
            base_offset,
        }
    }

    #[test]
    fn issue7_5_snapshot_round_trips_byte_by_byte() {
        let mut states = ProducerStates::default();
        states.record(batch(7, 0, 2, 0));
        states.record(batch(9, 100, 1, 2));
        states.record(batch(7, 2, 3, 3));
        let bytes = states.encode(6);
        let mut expected = Vec::new();
        expected.extend_from_slice(b"SLPRODS\0");
        expected.extend_from_slice(&[1, 0, 0, 0, 0, 0, 0, 0]);
        expected.extend_from_slice(&6u64.to_le_bytes());
        expected.extend_from_slice(&[2, 0, 0, 0, 0, 0, 0, 0]);
        // Producer 9 (last batch at offset 2) before producer 7 (last batch at offset 3).
        for (producer, batches) in [
            (9u64, vec![(100u64, 2u64, 1u32)]),
            (7, vec![(0, 0, 2), (2, 3, 3)]),
        ] {
            expected.extend_from_slice(&producer.to_le_bytes());
            expected.extend_from_slice(&(batches.len() as u32).to_le_bytes());
            expected.extend_from_slice(&0u32.to_le_bytes());
            for (sequence, base_offset, message_count) in batches {
                expected.extend_from_slice(&sequence.to_le_bytes());
                expected.extend_from_slice(&base_offset.to_le_bytes());
                expected.extend_from_slice(&message_count.to_le_bytes());
                expected.extend_from_slice(&0u32.to_le_bytes());
            }
        }
        assert_eq!(bytes, expected);
        assert_eq!(bytes.len(), 32 + 2 * 16 + 3 * 24);
        let decoded = ProducerStates::decode(&bytes, 6).unwrap();
        assert_eq!(decoded, states);
        assert_eq!(
            decoded.batches_in_log_order(),
            vec![batch(7, 0, 2, 0), batch(9, 100, 1, 2), batch(7, 2, 3, 3)]
        );
        assert_eq!(
            ProducerStates::decode(&ProducerStates::default().encode(0), 0).unwrap(),
            ProducerStates::default()
        );
    }

    #[test]
    fn issue7_5_snapshot_decode_names_the_broken_rule() {
        let mut states = ProducerStates::default();
        states.record(batch(7, 0, 2, 0));
        let bytes = states.encode(6);
        let error = |bytes: &[u8], base: u64| ProducerStates::decode(bytes, base).unwrap_err();
        assert_eq!(
            error(&bytes, 7),
            "names segment base offset 6 at byte 16 but belongs to the segment at 7"
        );
        assert_eq!(
            error(&bytes[..60], 6),
            "ends at byte 60 inside a field of 8 bytes at byte 56"
        );
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert_eq!(error(&bad, 6), "bad magic at byte 0");
        let mut bad = bytes.clone();
        bad[8] = 2;
        assert_eq!(error(&bad, 6), "version 2 at byte 8, expected 1");
        let mut bad = bytes.clone();
        bad[32..40].copy_from_slice(&0u64.to_le_bytes());
        assert_eq!(error(&bad, 6), "producer 0 at byte 32");
        let mut bad = bytes.clone();
        bad.push(0);
        assert_eq!(error(&bad, 6), "1 bytes after the last producer at byte 72");
        // A batch at or past the segment's base offset cannot be in a segment before it.
        let mut late = ProducerStates::default();
        late.record(batch(7, 0, 2, 6));
        assert!(error(&late.encode(6), 6).starts_with("batch at byte 48 (offset 6, 2 messages)"));
    }

    #[test]
    fn issue7_5_state_keeps_the_last_window_and_evicts_the_least_recently_appended() {
        let mut states = ProducerStates::default();
        for offset in 0..7u64 {
            states.record(batch(7, offset, 1, offset));
        }
        assert_eq!(
            states.batches_in_log_order(),
            (2..7u64)
                .map(|offset| batch(7, offset, 1, offset))
                .collect::<Vec<_>>()
        );
        let mut full = ProducerStates::default();
        for producer in 1..=PRODUCER_STATE_COUNT_MAX as u64 {
            full.record(batch(producer, 0, 1, producer));
        }
        // Producer 1 appends again, so producer 2 is the least recently appended.
        full.record(batch(1, 1, 1, 1_000_000));
        full.record(batch(u64::MAX, 0, 1, 1_000_001));
        assert_eq!(full.producer_count(), PRODUCER_STATE_COUNT_MAX);
        assert!(!full.windows.contains_key(&2));
        assert!(full.windows.contains_key(&1));
    }

    #[test]
    fn snapshot_names_are_exact() {
        assert_eq!(
            parse_producer_snapshot_name("00000000000000000042.producers"),
            Some((42, false))
        );
        assert_eq!(
            parse_producer_snapshot_name("00000000000000000042.producers.tmp"),
            Some((42, true))
        );
        assert_eq!(
            parse_producer_snapshot_name("00000000000000000042.producers.prev"),
            Some((42, true))
        );
        assert_eq!(
            parse_producer_snapshot_name("00000000000000000042.log"),
            None
        );
        assert_eq!(parse_producer_snapshot_name("42.producers"), None);
        assert_eq!(
            producer_snapshot_path(Path::new("/d"), 42),
            PathBuf::from("/d/00000000000000000042.producers")
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, ..ProptestConfig::default() })]

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512),
                               base in any::<u64>()) {
            let _ = ProducerStates::decode(&bytes, base);
        }

        #[test]
        fn decode_never_panics_on_a_damaged_snapshot(
            producers in proptest::collection::vec(1u64..6, 1..40),
            position in any::<usize>(), value in any::<u8>()) {
            let mut states = ProducerStates::default();
            for (offset, producer) in producers.iter().enumerate() {
                states.record(batch(*producer, offset as u64, 1, offset as u64));
            }
            let base = producers.len() as u64;
            let mut bytes = states.encode(base);
            let position = position % bytes.len();
            bytes[position] = value;
            let _ = ProducerStates::decode(&bytes, base);
            bytes.truncate(position);
            let _ = ProducerStates::decode(&bytes, base);
        }

        #[test]
        fn encode_decode_round_trips_and_keeps_each_producers_last_window(
            appends in proptest::collection::vec((1u64..12, 1u32..4), 0..200)) {
            let mut states = ProducerStates::default();
            let mut all: Vec<ProducerBatch> = Vec::new();
            let mut offset = 0u64;
            for (producer, message_count) in appends {
                let sequence = all.iter().filter(|b| b.producer == producer).count() as u64;
                let recorded = batch(producer, sequence, message_count, offset);
                states.record(recorded);
                all.push(recorded);
                offset += u64::from(message_count);
            }
            let expected: Vec<ProducerBatch> = all
                .iter()
                .enumerate()
                .filter(|(index, recorded)| {
                    all[index + 1..].iter().filter(|later| later.producer == recorded.producer).count()
                        < PRODUCER_WINDOW_BATCH_COUNT
                })
                .map(|(_, recorded)| *recorded)
                .collect();
            prop_assert_eq!(states.batches_in_log_order(), expected);
            prop_assert_eq!(ProducerStates::decode(&states.encode(offset), offset), Ok(states));
        }
    }
}
