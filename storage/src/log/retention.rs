//! Retention of a partition log (issue 11 section 4): deleting its oldest sealed segments once
//! the log holds more bytes than a limit or their newest batch is older than a limit, and the
//! retention floor that makes the deletion survive a crash.
//!
//! The floor is the first offset the log keeps, recorded in the small file `retention-floor`
//! beside the segments (layout in `storage/FORMAT.md`, "Retention floor") by a durable replace
//! (DESIGN section 8) *before* any segment is deleted. Open (`recovery.rs`) then tells retention
//! from damage: a segment below the floor is a deletion a crash interrupted (open completes it),
//! while a missing or damaged segment at or above the floor is damage, reported with its path.
//!
//! This module must never delete the active segment, a segment holding an entry that is not yet
//! acknowledged, or anything before the floor is durable; and it never leaves a hole: only a
//! prefix of the segments is deleted, so the log stays one run of offsets from the floor.
//!
//! The functions that touch the segment list are the `State` methods below
//! (`deletable_segments`, `segments_size_bytes`, `drop_segments_below`), so another holding of
//! sealed segments only has to re-point them.

use std::io;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::producer_state::producer_snapshot_path;
use super::recovery::{index_path, io_error};
use super::sealed::SealedSegment;
use super::verify::check_entry_payload;
use super::{LogError, PartitionLog, ReadSpan, State};
use crate::durable::{DurableError, durable_replace, read_exact_at, read_verified, sync_dir};
use crate::entry::{ENTRY_HEADER_SIZE, EntryHeader, newest_message_timestamp_us};
use crate::limits::ENTRY_SIZE_MAX;

/// Name of the retention floor file in a partition directory.
pub const RETENTION_FLOOR_FILE_NAME: &str = "retention-floor";
/// First 8 bytes of the retention floor payload.
pub const RETENTION_FLOOR_MAGIC: [u8; 8] = *b"SLFLOOR\0";
/// Current retention floor layout version.
pub const RETENTION_FLOOR_VERSION: u32 = 1;
/// Bytes of the retention floor payload (before the durable-replace trailer): magic, version,
/// reserved, floor.
pub const RETENTION_FLOOR_PAYLOAD_SIZE: usize = 24;

/// `retention-floor` in `dir`.
pub fn retention_floor_path(dir: &Path) -> PathBuf {
    dir.join(RETENTION_FLOOR_FILE_NAME)
}

/// The retention floor payload for first offset `floor` (the durable replace adds the XXH3-64
/// trailer): magic `SLFLOOR\0`, version u32 LE, 4 reserved zero bytes, floor u64 LE.
pub fn encode_retention_floor(floor: u64) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(RETENTION_FLOOR_PAYLOAD_SIZE);
    bytes.extend_from_slice(&RETENTION_FLOOR_MAGIC);
    bytes.extend_from_slice(&RETENTION_FLOOR_VERSION.to_le_bytes());
    bytes.extend_from_slice(&0u32.to_le_bytes());
    bytes.extend_from_slice(&floor.to_le_bytes());
    bytes
}

/// Decodes a retention floor payload (trailer already checked and removed), returning the floor.
///
/// # Errors
/// A sentence naming the rule the payload breaks: its length, magic, version or reserved bytes.
pub fn decode_retention_floor(payload: &[u8]) -> Result<u64, String> {
    if payload.len() != RETENTION_FLOOR_PAYLOAD_SIZE {
        return Err(format!(
            "{} payload bytes, expected {RETENTION_FLOOR_PAYLOAD_SIZE}",
            payload.len()
        ));
    }
    if payload[0..8] != RETENTION_FLOOR_MAGIC {
        return Err(format!(
            "magic {:02x?} is not {RETENTION_FLOOR_MAGIC:02x?}",
            &payload[0..8]
        ));
    }
    let version = u32::from_le_bytes([payload[8], payload[9], payload[10], payload[11]]);
    if version != RETENTION_FLOOR_VERSION {
        return Err(format!(
            "version {version} is not {RETENTION_FLOOR_VERSION}"
        ));
    }
    if payload[12..16] != [0; 4] {
        return Err("reserved bytes 12..16 are not zero".to_owned());
    }
    let mut floor = [0u8; 8];
    floor.copy_from_slice(&payload[16..24]);
    Ok(u64::from_le_bytes(floor))
}

/// The retention floor of the log in `dir`: 0 when the file is missing (retention never deleted
/// a segment there).
///
/// # Errors
/// `Corrupt` naming the file when it fails its checksum or layout (retention and damage could
/// no longer be told apart, so open refuses rather than guess); `Io` naming it when unreadable.
pub(super) async fn read_retention_floor(dir: &Path) -> Result<u64, LogError> {
    let path = retention_floor_path(dir);
    let corrupt = |reason: String| LogError::Corrupt {
        path: path.clone(),
        position: 0,
        reason: format!(
            "retention floor file is damaged ({reason}): the first offset the log keeps is \
             unknown, so missing segments cannot be told from retention; if the first segment is \
             where retention stopped, write the floor again with its base offset"
        ),
    };
    match read_verified(&path).await {
        Ok(None) => Ok(0),
        Ok(Some(payload)) => decode_retention_floor(&payload).map_err(corrupt),
        Err(DurableError::Corrupt { reason, .. }) => Err(corrupt(reason)),
        Err(DurableError::Io { path, op, source }) => Err(LogError::Io { path, op, source }),
    }
}

/// Records `floor` durably (write `.tmp`, fsync, rename, fsync the directory).
async fn write_retention_floor(dir: &Path, floor: u64) -> Result<(), LogError> {
    durable_replace(&retention_floor_path(dir), encode_retention_floor(floor))
        .await
        .map_err(|error| match error {
            DurableError::Io { path, op, source } => LogError::Io { path, op, source },
            DurableError::Corrupt { path, reason } => LogError::Corrupt {
                path,
                position: 0,
                reason,
            },
        })
}

/// Deletes the files of the segment at `base_offset` (segment, index, producer-state snapshot);
/// a file already gone is fine. The caller fsyncs the directory once after a run of these.
///
/// # Errors
/// `Io` naming the first file that could not be removed.
pub(super) async fn remove_segment_files(dir: &Path, base_offset: u64) -> Result<(), LogError> {
    for path in [
        super::recovery::segment_path(dir, base_offset),
        index_path(dir, base_offset),
        producer_snapshot_path(dir, base_offset),
    ] {
        match compio::fs::remove_file(&path).await {
            Ok(()) => {}
            Err(error) if error.kind() == io::ErrorKind::NotFound => {}
            Err(error) => return Err(io_error(&path, "delete a retained segment's file")(error)),
        }
    }
    Ok(())
}

/// A topic's retention as the log applies it (issue 11 section 4). `None` is no limit of that
/// kind.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RetentionPolicy {
    /// Segment file bytes the log may hold (sealed and active segments together); past it, the
    /// oldest sealed segments are deleted while the log is still over it.
    pub bytes_max: Option<u64>,
    /// Age past which a sealed segment is deleted, measured from its newest batch's timestamp
    /// (the newest message timestamp of its last entry: `base_timestamp_us` plus the largest
    /// message `timestamp_delta_us`, microseconds since the Unix epoch).
    pub age_max: Option<Duration>,
}

impl RetentionPolicy {
    /// Whether neither limit is set.
    pub fn is_unlimited(&self) -> bool {
        self.bytes_max.is_none() && self.age_max.is_none()
    }
}

/// What one retention pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetentionOutcome {
    /// Sealed segments deleted.
    pub deleted_segment_count: u32,
    /// Segment file bytes deleted.
    pub deleted_bytes: u64,
    /// The log's first offset after the pass (unchanged when nothing was deleted).
    pub first_offset: u64,
    /// The segment the age check stopped at because its last entry did not verify (so its age
    /// is unknown and it was kept, with every segment after it), or `None`. The segments before
    /// it that had expired were still deleted (`storage/FORMAT.md` section 3c).
    pub age_unverified: Option<UnverifiedAge>,
}

/// A sealed segment whose last entry, the one retention by age reads the timestamp of, failed
/// its checks (`storage/FORMAT.md` section 3c): the segment is kept, since a timestamp no
/// checksum vouches for must not expire it (issue 12).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnverifiedAge {
    /// The segment file.
    pub path: PathBuf,
    /// Byte position of its last entry in the file.
    pub position: u64,
    /// Which check the entry fails, a sentence.
    pub reason: String,
}

/// A sealed, wholly acknowledged segment that retention may delete.
#[derive(Debug, Clone)]
pub(super) struct DeletableSegment {
    pub(super) path: PathBuf,
    /// The log's summary of the segment: offsets, bytes, its last entry's position.
    pub(super) summary: SealedSegment,
    /// The `base_timestamp_us` of its last entry when an earlier pass verified it.
    pub(super) last_timestamp_us: Option<u64>,
}

impl State {
    /// The sealed segments of the log in `dir` that retention may delete, oldest first: every
    /// sealed segment whose entries are all acknowledged (a group still being written may have
    /// rolled). The active segment is never among them.
    pub(super) fn deletable_segments(&self, dir: &Path) -> Vec<DeletableSegment> {
        self.sealed
            .iter()
            .take_while(|segment| segment.end_offset <= self.acked_offset)
            .map(|segment| DeletableSegment {
                path: super::recovery::segment_path(dir, segment.base_offset),
                summary: *segment,
                last_timestamp_us: self.sealed.last_timestamp_us(segment),
            })
            .collect()
    }

    /// Segment file bytes of the whole log (sealed and active segments), as the indexes know
    /// them.
    pub(super) fn segments_size_bytes(&self) -> u64 {
        self.sealed.size_bytes() + self.active.index.size_bytes
    }

    /// Forgets every sealed segment that ends at or below `floor` (which is a segment boundary),
    /// with its cached index and the closed files kept open for it; returns their base offsets,
    /// oldest first.
    ///
    /// # Panics
    /// If `floor` is not the base offset of a sealed or the active segment: the floor always
    /// comes from `deletable_segments`, so that is a bug.
    pub(super) fn drop_segments_below(&mut self, floor: u64) -> Vec<u64> {
        let mut dropped = Vec::new();
        while let Some(oldest) = self.sealed.oldest()
            && oldest.end_offset <= floor
        {
            dropped.push(oldest.base_offset);
            self.sealed.pop_oldest();
        }
        let next_base = self
            .sealed
            .oldest()
            .map_or(self.active.index.base_offset, |segment| segment.base_offset);
        assert_eq!(
            next_base, floor,
            "the retention floor is a segment boundary"
        );
        self.closed_files.files.retain(|(base, _)| *base >= floor);
        self.mappings.drop_below(floor);
        dropped
    }
}

/// Clears the log's "retention pass running" flag when the pass ends or is dropped.
struct RunningPass<'a>(&'a std::cell::Cell<bool>);

impl Drop for RunningPass<'_> {
    fn drop(&mut self) {
        self.0.set(false);
    }
}

impl PartitionLog {
    /// `Ok` unless `offset` is below the log's first offset.
    ///
    /// # Errors
    /// `OffsetRetained` naming the first offset when it is.
    pub(super) fn check_not_retained(&self, offset: u64) -> Result<(), LogError> {
        let first_offset = self.first_offset();
        if offset < first_offset {
            return Err(LogError::OffsetRetained {
                offset,
                first_offset,
            });
        }
        Ok(())
    }

    /// One retention pass (issue 11 section 4): deletes the oldest sealed, wholly acknowledged
    /// segments while the log holds more than `policy.bytes_max` segment bytes, or while the
    /// oldest one's newest batch is older than `policy.age_max` at `now`; never the active
    /// segment and never a segment after one that is kept. A segment whose last entry fails its
    /// checks is kept by age (its age is unknown, issue 12) and named in
    /// [`RetentionOutcome::age_unverified`]; the expired segments before it are still deleted,
    /// and a size limit still deletes it by size. Order: the new floor is written
    /// durably (`retention-floor`), then the segments leave the log (a read below the floor now
    /// gets [`LogError::OffsetRetained`]), then their files are deleted and the directory
    /// fsynced. A pass that finds another one running on this log, or the log closing or
    /// poisoned, does nothing.
    ///
    /// # Errors
    /// `Io` or `DescriptorsExhausted` naming the segment whose last entry could not be read for
    /// the age check (nothing deleted); `Io` naming the floor file when it could not be written
    /// (nothing deleted); `Io` naming a file that could not be deleted, or
    /// the directory that could not be fsynced, after the floor moved: the log already starts
    /// at the new floor, and the next open deletes what is left below it.
    ///
    /// # Cancel safety
    /// Not cancel safe, but never unsafe: dropped after the floor write, the log still serves
    /// the segments below the floor until the next pass or open deletes them.
    pub async fn apply_retention(
        &self,
        policy: RetentionPolicy,
        now: SystemTime,
    ) -> Result<RetentionOutcome, LogError> {
        let first_offset = self.first_offset();
        let unchanged = RetentionOutcome {
            deleted_segment_count: 0,
            deleted_bytes: 0,
            first_offset,
            age_unverified: None,
        };
        // A closing log (its partition may be being deleted) or a poisoned one is left alone.
        let idle = {
            let state = self.shared.state.borrow();
            state.closing || state.failure.is_some()
        };
        if policy.is_unlimited() || idle || self.shared.retention_running.replace(true) {
            return Ok(unchanged);
        }
        let _running = RunningPass(&self.shared.retention_running);
        let (candidates, total_bytes) = {
            let state = self.shared.state.borrow();
            (
                state.deletable_segments(&self.shared.dir),
                state.segments_size_bytes(),
            )
        };
        let (chosen, age_unverified) = self
            .segments_past_retention(&candidates, total_bytes, policy, now)
            .await?;
        let Some((last_deleted, deleted_bytes)) = chosen else {
            return Ok(RetentionOutcome {
                age_unverified,
                ..unchanged
            });
        };
        let floor = candidates[last_deleted].summary.end_offset;
        let dir = self.shared.dir.clone();
        write_retention_floor(&dir, floor).await?;
        let dropped = self.shared.state.borrow_mut().drop_segments_below(floor);
        tracing::info!(
            dir = %dir.display(),
            first_offset = floor,
            segment_count = dropped.len(),
            deleted_bytes,
            "retention deleted the oldest sealed segments"
        );
        for &base_offset in &dropped {
            remove_segment_files(&dir, base_offset).await?;
            self.shared
                .state
                .borrow_mut()
                .producer_snapshot_base_offsets
                .remove(&base_offset);
        }
        sync_dir(&dir).await.map_err(io_error(
            &dir,
            "fsync log directory after deleting retained segments",
        ))?;
        Ok(RetentionOutcome {
            deleted_segment_count: u32::try_from(dropped.len()).unwrap_or(u32::MAX),
            deleted_bytes,
            first_offset: floor,
            age_unverified,
        })
    }

    /// The index in `candidates` of the last segment to delete and the bytes deleted, or
    /// `None`, and the segment whose age could not be verified, if the walk stopped at one:
    /// walks them oldest first, deleting while the log is over `bytes_max` (whatever the
    /// timestamps) or the segment's newest batch is older than `age_max`, and stops at the first
    /// one kept. A segment whose last entry fails its checks is kept by age: its age is unknown.
    ///
    /// # Errors
    /// `Io`/`DescriptorsExhausted` when a last entry cannot be read (nothing is deleted; the
    /// next pass retries).
    async fn segments_past_retention(
        &self,
        candidates: &[DeletableSegment],
        total_bytes: u64,
        policy: RetentionPolicy,
        now: SystemTime,
    ) -> Result<(Option<(usize, u64)>, Option<UnverifiedAge>), LogError> {
        let mut remaining_bytes = total_bytes;
        let mut last_deleted = None;
        let mut age_unverified = None;
        for (candidate_index, candidate) in candidates.iter().enumerate() {
            let over_size = policy
                .bytes_max
                .is_some_and(|bytes_max| remaining_bytes > bytes_max);
            let expired = match (over_size, policy.age_max) {
                (false, Some(age_max)) => match self.is_expired(candidate, age_max, now).await {
                    Ok(expired) => expired,
                    Err(LogError::Corrupt {
                        path,
                        position,
                        reason,
                    }) => {
                        age_unverified = Some(UnverifiedAge {
                            path,
                            position,
                            reason,
                        });
                        false
                    }
                    Err(error) => return Err(error),
                },
                _ => false,
            };
            if !over_size && !expired {
                break;
            }
            remaining_bytes -= candidate.summary.size_bytes;
            last_deleted = Some(candidate_index);
        }
        let chosen = last_deleted.map(|index| (index, total_bytes - remaining_bytes));
        Ok((chosen, age_unverified))
    }

    /// Whether `segment`'s newest batch (its last entry, judged by its newest message) is older
    /// than `age_max` at `now`. An
    /// empty segment has no batch to keep it and counts as expired; a timestamp after `now` is
    /// never expired. The timestamp is the one an earlier pass verified and the log remembers,
    /// else the last entry is read and verified now and its timestamp remembered.
    ///
    /// # Errors
    /// As [`Self::last_entry_newest_timestamp_us`].
    async fn is_expired(
        &self,
        segment: &DeletableSegment,
        age_max: Duration,
        now: SystemTime,
    ) -> Result<bool, LogError> {
        let Some(position) = segment.summary.last_entry_position else {
            return Ok(true);
        };
        let timestamp_us = match segment.last_timestamp_us {
            Some(timestamp_us) => timestamp_us,
            None => self.verify_last_timestamp_us(segment, position).await?,
        };
        let now_us = now
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |since| {
                u64::try_from(since.as_micros()).unwrap_or(u64::MAX)
            });
        let age_us = now_us.saturating_sub(timestamp_us);
        Ok(u128::from(age_us) > age_max.as_micros())
    }

    /// The newest message timestamp of `segment`'s last entry, at `position`
    /// (`entry::newest_message_timestamp_us`: its base timestamp plus its largest message delta),
    /// read and verified ([`Self::last_entry_newest_timestamp_us`]) and remembered with the segment's summary,
    /// so later passes do not read it again.
    ///
    /// # Errors
    /// As [`Self::last_entry_newest_timestamp_us`] (nothing is remembered).
    async fn verify_last_timestamp_us(
        &self,
        segment: &DeletableSegment,
        position: u64,
    ) -> Result<u64, LogError> {
        let newest_us = self
            .last_entry_newest_timestamp_us(segment, position)
            .await?;
        self.shared
            .state
            .borrow_mut()
            .sealed
            .remember_last_timestamp_us(&segment.summary, newest_us);
        Ok(newest_us)
    }

    /// The newest message timestamp (`entry::newest_message_timestamp_us`) of the entry at
    /// `position` of `segment` (its last), read whole through the log's closed-file slots and
    /// verified before its timestamps are trusted: it must
    /// fill the segment from `position` to its end, name an offset inside the segment, and pass
    /// its checksum rules (`verify::check_entry_payload`; under the timestamp rule the checksum
    /// covers the timestamp, `storage/FORMAT.md` section 3). Retention never deletes on the
    /// word of bytes no checksum vouches for (issue 12: a flipped timestamp bit must not expire
    /// a segment early); an entry written before the timestamp rule has its payload verified
    /// but its timestamp is covered by nothing.
    ///
    /// # Errors
    /// `Io`/`DescriptorsExhausted` when the entry cannot be read; `Corrupt` naming the segment
    /// and the position when the entry is not as above (the pass then keeps the segment and
    /// reports it in [`RetentionOutcome::age_unverified`]).
    async fn last_entry_newest_timestamp_us(
        &self,
        segment: &DeletableSegment,
        position: u64,
    ) -> Result<u64, LogError> {
        let summary = &segment.summary;
        let corrupt = |reason: String| LogError::Corrupt {
            path: segment.path.clone(),
            position,
            reason,
        };
        let entry_size = summary.size_bytes.saturating_sub(position);
        if entry_size < ENTRY_HEADER_SIZE as u64 || entry_size > u64::from(ENTRY_SIZE_MAX) {
            return Err(corrupt(format!(
                "the last entry would span {entry_size} bytes to the segment's end ({} bytes), \
                 outside {ENTRY_HEADER_SIZE}..={ENTRY_SIZE_MAX}",
                summary.size_bytes
            )));
        }
        let span = ReadSpan {
            path: segment.path.clone(),
            segment_base_offset: summary.base_offset,
            file: None,
            position,
            size_bytes: entry_size,
            rows: Vec::new(),
        };
        let file = self.closed_segment_file(&span).await?;
        let bytes = read_exact_at(file.file(), position, entry_size as usize)
            .await
            .map_err(io_error(
                &segment.path,
                "read the last entry for retention's age check",
            ))?;
        let (header_bytes, payload) = bytes.split_at(ENTRY_HEADER_SIZE);
        let header = EntryHeader::decode(header_bytes).expect("read_exact_at returned the entry");
        if header.base_offset < summary.base_offset || header.base_offset >= summary.end_offset {
            return Err(corrupt(format!(
                "the last entry's header names offset {} outside the segment's offsets {}..{}",
                header.base_offset, summary.base_offset, summary.end_offset
            )));
        }
        if u64::from(header.length) != entry_size - ENTRY_HEADER_SIZE as u64 {
            return Err(corrupt(format!(
                "the last entry's header says {} payload bytes but {} bytes follow it to the \
                 segment's end",
                header.length,
                entry_size - ENTRY_HEADER_SIZE as u64
            )));
        }
        check_entry_payload(&header, payload).map_err(|reason| {
            corrupt(format!(
                "the last entry, whose timestamp retention by age reads, fails: {reason}"
            ))
        })?;
        Ok(newest_message_timestamp_us(&header, payload))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::durable::tmp_path;
    use crate::entry::build_entry;
    use crate::log::recovery::segment_path;
    use crate::log::{FsyncPolicy, LogConfig, RecoveryReport};
    use std::rc::Rc;

    /// Every entry of these tests gets a segment of its own: the next one never fits.
    fn one_entry_segments() -> LogConfig {
        LogConfig {
            fsync: FsyncPolicy::Always,
            segment_size_max: 40,
            write_mode: crate::log::WriteMode::Buffered,
        }
    }

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    /// One-message entries with `timestamps_us[i]` as entry `i`'s timestamp; returns the bytes
    /// of each as stored (offset filled in) and the size of one.
    async fn append_all(log: &PartitionLog, timestamps_us: &[u64]) -> (Vec<Vec<u8>>, u64) {
        let mut stored = Vec::new();
        for (seed, &timestamp_us) in timestamps_us.iter().enumerate() {
            let mut entry = build_entry(timestamp_us, 1, &[seed as u8; 5]);
            let offset = log.append(entry.clone()).await.unwrap();
            entry[0..8].copy_from_slice(&offset.to_le_bytes());
            stored.push(entry);
        }
        let size = stored[0].len() as u64;
        (stored, size)
    }

    fn now_us() -> u64 {
        SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap()
            .as_micros() as u64
    }

    fn segment_bases(dir: &Path) -> Vec<u64> {
        let mut bases: Vec<u64> = std::fs::read_dir(dir)
            .unwrap()
            .filter_map(|entry| {
                let name = entry.unwrap().file_name().into_string().unwrap();
                name.strip_suffix(".log")?.parse().ok()
            })
            .collect();
        bases.sort_unstable();
        bases
    }

    fn floor_on_disk(dir: &Path) -> u64 {
        let bytes = std::fs::read(retention_floor_path(dir)).unwrap();
        decode_retention_floor(&bytes[..bytes.len() - crate::durable::TRAILER_SIZE]).unwrap()
    }

    /// A log of `count` one-entry segments (offsets 0..count, the last one active), closed.
    fn rolled_log(dir: &Path, timestamps_us: &[u64]) -> Vec<Vec<u8>> {
        block_on(async {
            let (log, _) = PartitionLog::open(dir, one_entry_segments()).await.unwrap();
            let (stored, _) = append_all(&log, timestamps_us).await;
            log.close().await.unwrap();
            stored
        })
    }

    fn open(dir: &Path) -> Result<(PartitionLog, RecoveryReport), LogError> {
        block_on(PartitionLog::open(dir, one_entry_segments()))
    }

    #[test]
    fn issue11_4_floor_round_trips_and_names_a_broken_rule() {
        let encoded = encode_retention_floor(0x0102_0304_0506_0708);
        assert_eq!(encoded.len(), RETENTION_FLOOR_PAYLOAD_SIZE);
        assert_eq!(&encoded[..8], b"SLFLOOR\0");
        assert_eq!(&encoded[8..12], &[1, 0, 0, 0]);
        assert_eq!(&encoded[12..16], &[0; 4]);
        assert_eq!(&encoded[16..], &[8, 7, 6, 5, 4, 3, 2, 1]);
        assert_eq!(decode_retention_floor(&encoded), Ok(0x0102_0304_0506_0708));
        assert_eq!(
            decode_retention_floor(&encoded[..23]),
            Err("23 payload bytes, expected 24".to_owned())
        );
        let mut bad_version = encoded.clone();
        bad_version[8] = 2;
        assert_eq!(
            decode_retention_floor(&bad_version),
            Err("version 2 is not 1".to_owned())
        );
        let mut bad_reserved = encoded.clone();
        bad_reserved[13] = 1;
        assert_eq!(
            decode_retention_floor(&bad_reserved),
            Err("reserved bytes 12..16 are not zero".to_owned())
        );
        let mut bad_magic = encoded;
        bad_magic[0] = b'X';
        assert!(
            decode_retention_floor(&bad_magic)
                .unwrap_err()
                .starts_with("magic ")
        );
    }

    #[test]
    fn issue11_4_retention_by_size_deletes_the_oldest_sealed_segments_while_over() {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            let (stored, size) = append_all(&log, &[now_us(); 10]).await;
            assert_eq!(log.shared.state.borrow().sealed.len() + 1, 10);
            // 10 segments of `size` bytes; at most 3.5 segments' worth may stay: 3 do.
            let policy = RetentionPolicy {
                bytes_max: Some(size * 7 / 2),
                age_max: None,
            };
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(
                outcome,
                RetentionOutcome {
                    deleted_segment_count: 7,
                    deleted_bytes: 7 * size,
                    first_offset: 7,
                    age_unverified: None,
                }
            );
            assert_eq!(log.first_offset(), 7);
            assert_eq!(segment_bases(dir.path()), vec![7, 8, 9]);
            for base in 0..7 {
                assert!(!index_path(dir.path(), base).exists(), "index {base} kept");
            }
            assert_eq!(floor_on_disk(dir.path()), 7);
            assert!(matches!(
                log.read(6, 1, usize::MAX).await,
                Err(LogError::OffsetRetained {
                    offset: 6,
                    first_offset: 7
                })
            ));
            assert_eq!(log.read(7, 1, usize::MAX).await.unwrap(), stored[7]);
            // Within the limit now: a second pass deletes nothing.
            let again = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(again.deleted_segment_count, 0);
            assert_eq!(again.first_offset, 7);
            // Appends go on after the retained prefix.
            assert_eq!(
                log.append(build_entry(now_us(), 1, b"after"))
                    .await
                    .unwrap(),
                10
            );
        });
    }

    #[test]
    fn issue11_4_retention_by_age_deletes_expired_segments_up_to_the_first_kept() {
        let dir = tempfile::tempdir().unwrap();
        let hour_us = 3_600_000_000;
        let old = now_us() - 2 * hour_us;
        let recent = now_us();
        // Offsets 0..3 are old, 3 is recent, 4 old again (kept: it follows a kept segment),
        // 5 recent, 6 old in the active segment (never deleted).
        let timestamps = [old, old, old, recent, old, recent, old];
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_all(&log, &timestamps).await;
            let policy = RetentionPolicy {
                bytes_max: None,
                age_max: Some(Duration::from_hours(1)),
            };
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.deleted_segment_count, 3);
            assert_eq!(outcome.first_offset, 3);
            assert_eq!(segment_bases(dir.path()), vec![3, 4, 5, 6]);
            // Three hours on, everything sealed is expired; the active segment stays.
            let later = SystemTime::now() + Duration::from_hours(3);
            let outcome = log.apply_retention(policy, later).await.unwrap();
            assert_eq!(outcome.first_offset, 6);
            assert_eq!(segment_bases(dir.path()), vec![6]);
        });
    }

    /// Issue 12 ("checksums still catch every flipped byte ... in a batch header ... on disk"):
    /// a flipped bit that makes a sealed segment's newest timestamp look 30 years old is caught
    /// by the timestamp rule's checksum, so the age check keeps the segment (and those after
    /// it) and names it and the position; the same flip in an entry written before the rule (timestamp covered by
    /// nothing) still expires its segment, which is what the rule is for.
    /// Review finding: a message's timestamp is its batch's base plus its own delta (up to about
    /// 71 minutes), and retention judged a segment by the base alone, so a batch whose base was
    /// past the limit but whose last message was not got deleted early. The age check now takes
    /// the last entry's newest message timestamp.
    #[test]
    fn issue12_retention_by_age_judges_the_newest_message_of_the_last_entry() {
        let dir = tempfile::tempdir().unwrap();
        let minute_us = 60_000_000;
        let base = now_us() - 70 * minute_us;
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            for _ in 0..2 {
                // Two messages: deltas 0 and 20 minutes (message 1's header at 32 + 5).
                let mut section = crate::entry::message_section(2, &[7; 5]);
                section[12] |= crate::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
                let delta = u32::try_from(20 * minute_us).unwrap();
                section[37 + 8..37 + 12].copy_from_slice(&delta.to_le_bytes());
                let entry = crate::entry::build_entry_raw(base, 2, &section);
                let header = EntryHeader::decode(&entry).unwrap();
                assert_eq!(
                    newest_message_timestamp_us(&header, &entry[ENTRY_HEADER_SIZE..]),
                    base + 20 * minute_us
                );
                log.append(entry).await.unwrap();
            }
            // The batch's base is 70 minutes old, its newest message 50: kept under 1 hour,
            // deleted under 40 minutes.
            let policy = |minutes| RetentionPolicy {
                bytes_max: None,
                age_max: Some(Duration::from_mins(minutes)),
            };
            let outcome = log
                .apply_retention(policy(60), SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.first_offset, 0);
            let outcome = log
                .apply_retention(policy(40), SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.first_offset, 2);
            log.close().await.unwrap();
        });
    }

    #[test]
    fn issue12_retention_by_age_trusts_only_a_verified_timestamp() {
        let recent = now_us();
        assert!(recent & (1 << 50) != 0, "a 2026 timestamp has bit 50 set");
        for timestamp_rule in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            block_on(async {
                let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                    .await
                    .unwrap();
                for seed in 0..3u8 {
                    let mut section = crate::entry::message_section(1, &[seed; 5]);
                    if timestamp_rule {
                        section[12] |= crate::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
                    }
                    let entry = crate::entry::build_entry_raw(recent, 1, &section);
                    log.append(entry).await.unwrap();
                }
                log.close().await.unwrap();
            });
            let segment = segment_path(dir.path(), 0);
            let mut bytes = std::fs::read(&segment).unwrap();
            bytes[8 + 6] ^= 1 << 2; // bit 50 of base_timestamp_us: 2026 becomes 1991
            std::fs::write(&segment, &bytes).unwrap();
            let policy = RetentionPolicy {
                bytes_max: None,
                age_max: Some(Duration::from_hours(1)),
            };
            let (result, first_offset) = block_on(async {
                let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                    .await
                    .unwrap();
                let result = log.apply_retention(policy, SystemTime::now()).await;
                let first_offset = log.first_offset();
                log.close().await.unwrap();
                (result, first_offset)
            });
            if timestamp_rule {
                let outcome = result.unwrap();
                assert_eq!(
                    (outcome.deleted_segment_count, outcome.first_offset),
                    (0, 0)
                );
                let UnverifiedAge {
                    path,
                    position,
                    reason,
                } = outcome.age_unverified.expect("the damage is reported");
                assert_eq!((&path, position), (&segment, 0));
                assert!(
                    reason.starts_with("the last entry, whose timestamp retention by age reads")
                        && reason.contains("base timestamp"),
                    "{reason}"
                );
                assert_eq!(segment_bases(dir.path()), vec![0, 1, 2]);
                assert_eq!(first_offset, 0);
            } else {
                let outcome = result.unwrap();
                assert_eq!((outcome.first_offset, outcome.age_unverified), (1, None));
                assert_eq!(segment_bases(dir.path()), vec![1, 2]);
                assert_eq!(first_offset, 1);
            }
        }
    }

    /// Appends one-message entries under the timestamp rule (the entry checksum covers
    /// `base_timestamp_us`), one per timestamp.
    async fn append_under_timestamp_rule(log: &PartitionLog, timestamps_us: &[u64]) {
        for (seed, &timestamp_us) in timestamps_us.iter().enumerate() {
            let mut section = crate::entry::message_section(1, &[seed as u8; 5]);
            section[12] |= crate::entry::PAYLOAD_FLAG_CHECKSUM_OF_TIMESTAMP as u8;
            log.append(crate::entry::build_entry_raw(timestamp_us, 1, &section))
                .await
                .unwrap();
        }
    }

    /// Flips bit 50 of the `base_timestamp_us` of the entry at byte 0 of `path` in place (the
    /// file keeps its inode, so a descriptor the log holds sees the change).
    fn flip_first_timestamp_bit(path: &Path) {
        use std::os::unix::fs::FileExt;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .unwrap();
        let mut byte = [0u8; 1];
        file.read_exact_at(&mut byte, 8 + 6).unwrap();
        byte[0] ^= 1 << 2;
        file.write_all_at(&byte, 8 + 6).unwrap();
        file.sync_all().unwrap();
    }

    /// Review of issue 12's fix, finding 2: a segment whose last entry fails its checks is kept
    /// by age (with every one after it) and reported, but the expired segments before it are
    /// still deleted, and a size limit still deletes it.
    #[test]
    fn issue12_unverified_age_keeps_that_segment_but_not_the_expired_ones_before_it() {
        let dir = tempfile::tempdir().unwrap();
        let old = now_us() - 2 * 3_600_000_000;
        let damaged = segment_path(dir.path(), 1);
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_under_timestamp_rule(&log, &[old; 4]).await;
            flip_first_timestamp_bit(&damaged);
            let by_age = RetentionPolicy {
                bytes_max: None,
                age_max: Some(Duration::from_hours(1)),
            };
            let outcome = log
                .apply_retention(by_age, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(
                (outcome.deleted_segment_count, outcome.first_offset),
                (1, 1)
            );
            let unverified = outcome.age_unverified.expect("the damage is reported");
            assert_eq!((&unverified.path, unverified.position), (&damaged, 0));
            assert!(
                unverified.reason.contains("base timestamp"),
                "{}",
                unverified.reason
            );
            assert_eq!(segment_bases(dir.path()), vec![1, 2, 3]);
            assert_eq!(floor_on_disk(dir.path()), 1);
            // Every later pass stops there again, and reports it again.
            let again = log
                .apply_retention(by_age, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(again.deleted_segment_count, 0);
            assert_eq!(again.age_unverified, Some(unverified));
            // Size does not depend on the timestamp: a size limit deletes the damaged segment.
            let by_size = RetentionPolicy {
                bytes_max: Some(1),
                age_max: Some(Duration::from_hours(1)),
            };
            let outcome = log
                .apply_retention(by_size, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(
                outcome,
                RetentionOutcome {
                    deleted_segment_count: 2,
                    deleted_bytes: outcome.deleted_bytes,
                    first_offset: 3,
                    age_unverified: None,
                }
            );
            assert_eq!(segment_bases(dir.path()), vec![3]);
        });
    }

    /// Review of issue 12's fix, finding 1: the age check verifies a sealed segment's last entry
    /// once and remembers its timestamp, instead of rereading and rehashing it (up to 64 MiB)
    /// every pass until it expires. Observable: once verified, damage to the timestamp on disk
    /// is never read again, so a later pass expires the segment by the remembered, verified
    /// value; a log opened afresh has nothing remembered and finds the damage.
    #[test]
    fn issue12_age_check_remembers_a_verified_timestamp() {
        let dir = tempfile::tempdir().unwrap();
        let recent = now_us();
        let segment = segment_path(dir.path(), 0);
        let policy = RetentionPolicy {
            bytes_max: None,
            age_max: Some(Duration::from_hours(1)),
        };
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_under_timestamp_rule(&log, &[recent; 3]).await;
            // Not expired: kept, its timestamp verified and remembered.
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(
                (outcome.deleted_segment_count, outcome.age_unverified),
                (0, None)
            );
            flip_first_timestamp_bit(&segment);
            // Three hours on: expired by the remembered timestamp, without rereading the entry.
            let later = SystemTime::now() + Duration::from_hours(3);
            let outcome = log.apply_retention(policy, later).await.unwrap();
            assert_eq!(
                (outcome.first_offset, outcome.age_unverified),
                (2, None),
                "segment 1 was verified now, segment 0 by its remembered timestamp"
            );
            assert_eq!(segment_bases(dir.path()), vec![2]);
            log.close().await.unwrap();
        });
        // The same damage in a log that never verified the segment: found, segment kept.
        let dir = tempfile::tempdir().unwrap();
        let segment = segment_path(dir.path(), 0);
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_under_timestamp_rule(&log, &[recent; 3]).await;
            flip_first_timestamp_bit(&segment);
            let later = SystemTime::now() + Duration::from_hours(3);
            let outcome = log.apply_retention(policy, later).await.unwrap();
            assert_eq!(outcome.first_offset, 0);
            assert_eq!(
                outcome
                    .age_unverified
                    .map(|unverified| (unverified.path, unverified.position)),
                Some((segment, 0))
            );
            log.close().await.unwrap();
        });
    }

    #[test]
    fn issue11_4_retention_never_deletes_the_active_segment() {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_all(&log, &[0; 4]).await;
            let policy = RetentionPolicy {
                bytes_max: Some(1),
                age_max: Some(Duration::from_millis(1)),
            };
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.deleted_segment_count, 3);
            assert_eq!(segment_bases(dir.path()), vec![3]);
            // Only the active segment is left, over both limits: it stays.
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.deleted_segment_count, 0);
            assert_eq!((log.first_offset(), log.acked_offset()), (3, 4));
            // No limit: nothing is even looked at.
            let outcome = log
                .apply_retention(RetentionPolicy::default(), SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.first_offset, 3);
        });
    }

    #[test]
    fn issue11_4_retention_keeps_a_segment_with_unacknowledged_entries() {
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            append_all(&log, &[0; 4]).await;
            // Pretend the entries of segments 2 and 3 are still in flight.
            log.shared.state.borrow_mut().acked_offset = 2;
            let policy = RetentionPolicy {
                bytes_max: Some(1),
                age_max: None,
            };
            let outcome = log
                .apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            assert_eq!(outcome.first_offset, 2);
            assert_eq!(segment_bases(dir.path()), vec![2, 3]);
        });
    }

    #[test]
    fn issue11_4_floor_survives_restart() {
        let dir = tempfile::tempdir().unwrap();
        // One runtime throughout: a log's writer task runs on the runtime that opened it.
        block_on(async {
            let (log, _) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            let (stored, _) = append_all(&log, &[0; 6]).await;
            let policy = RetentionPolicy {
                bytes_max: Some(1),
                age_max: None,
            };
            log.apply_retention(policy, SystemTime::now())
                .await
                .unwrap();
            log.close().await.unwrap();
            drop(log);

            let (log, report) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            assert_eq!((report.segment_count, report.next_offset), (1, 6));
            assert_eq!(log.first_offset(), 5);
            assert_eq!(log.read(5, 1, usize::MAX).await.unwrap(), stored[5]);
            assert!(matches!(
                log.read(0, 1, usize::MAX).await,
                Err(LogError::OffsetRetained {
                    offset: 0,
                    first_offset: 5
                })
            ));
            assert_eq!(log.append(build_entry(0, 1, b"next")).await.unwrap(), 6);
            log.close().await.unwrap();
            drop(log);

            let (log, report) = PartitionLog::open(dir.path(), one_entry_segments())
                .await
                .unwrap();
            assert_eq!((report.segment_count, report.next_offset), (2, 7));
            assert_eq!(log.first_offset(), 5);
        });
    }

    #[test]
    fn issue11_4_open_completes_a_deletion_a_crash_interrupted() {
        let dir = tempfile::tempdir().unwrap();
        let stored = rolled_log(dir.path(), &[0; 6]);
        // A crash after the floor write, before any segment was deleted.
        block_on(write_retention_floor(dir.path(), 4)).unwrap();
        let (log, report) = open(dir.path()).unwrap();
        assert_eq!((report.segment_count, report.next_offset), (2, 6));
        assert_eq!(log.first_offset(), 4);
        assert_eq!(segment_bases(dir.path()), vec![4, 5]);
        for base in 0..4 {
            assert!(!index_path(dir.path(), base).exists(), "index {base} kept");
        }
        let read = block_on(log.read(4, 2, usize::MAX)).unwrap();
        assert_eq!(read, [stored[4].clone(), stored[5].clone()].concat());
    }

    #[test]
    fn issue11_4_missing_segment_above_the_floor_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        rolled_log(dir.path(), &[0; 8]);
        block_on(write_retention_floor(dir.path(), 3)).unwrap();
        // A hole above the floor: segment 5 is gone.
        std::fs::remove_file(segment_path(dir.path(), 5)).unwrap();
        let error = open(dir.path()).unwrap_err();
        assert!(
            matches!(&error, LogError::Corrupt { path, position: 0, reason }
                if *path == segment_path(dir.path(), 6)
                    && reason == "segment starts at offset 6 but the previous segment ends at offset 5"),
            "{error}"
        );
        // The segment at the floor itself is gone: named, with the floor file.
        std::fs::remove_file(segment_path(dir.path(), 3)).unwrap();
        let error = open(dir.path()).unwrap_err();
        let expected = format!(
            "the first segment starts at offset 4 but the retention floor ({}) is 3: the \
             segments before it (from {}) are missing",
            retention_floor_path(dir.path()).display(),
            segment_path(dir.path(), 3).display()
        );
        assert!(
            matches!(&error, LogError::Corrupt { path, position: 0, reason }
                if *path == segment_path(dir.path(), 4) && *reason == expected),
            "{error}"
        );
        // Refusing deleted nothing, not even the segments below the floor.
        assert_eq!(segment_bases(dir.path()), vec![0, 1, 2, 4, 6, 7]);
        // Every segment from the floor on is gone: named too.
        for base in [4, 6, 7] {
            std::fs::remove_file(segment_path(dir.path(), base)).unwrap();
        }
        std::fs::remove_file(segment_path(dir.path(), 0)).unwrap();
        std::fs::remove_file(segment_path(dir.path(), 1)).unwrap();
        std::fs::remove_file(segment_path(dir.path(), 2)).unwrap();
        let error = open(dir.path()).unwrap_err();
        assert!(
            matches!(&error, LogError::Corrupt { path, .. } if *path == segment_path(dir.path(), 3)),
            "{error}"
        );
        assert!(
            segment_bases(dir.path()).is_empty(),
            "no segment was created"
        );
    }

    #[test]
    fn issue11_4_damaged_segment_above_the_floor_is_damage() {
        let dir = tempfile::tempdir().unwrap();
        rolled_log(dir.path(), &[0; 5]);
        block_on(write_retention_floor(dir.path(), 2)).unwrap();
        // A closed segment above the floor loses its index and a byte: open rescans it and
        // refuses, naming it.
        std::fs::remove_file(index_path(dir.path(), 3)).unwrap();
        let path = segment_path(dir.path(), 3);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 1]).unwrap();
        let error = open(dir.path()).unwrap_err();
        assert!(
            matches!(&error, LogError::Corrupt { path: named, .. } if *named == path),
            "{error}"
        );
    }

    #[test]
    fn issue11_4_torn_floor_file() {
        let dir = tempfile::tempdir().unwrap();
        rolled_log(dir.path(), &[0; 5]);
        block_on(write_retention_floor(dir.path(), 2)).unwrap();
        // A crash inside the next floor write leaves a torn `.tmp`: never read, the floor stays.
        let floor_path = retention_floor_path(dir.path());
        std::fs::write(tmp_path(&floor_path), &encode_retention_floor(4)[..10]).unwrap();
        let (log, _) = open(dir.path()).unwrap();
        assert_eq!(log.first_offset(), 2);
        drop(log);
        // The floor file itself torn (a disk that lied about the rename): refused, named.
        let bytes = std::fs::read(&floor_path).unwrap();
        std::fs::write(&floor_path, &bytes[..bytes.len() - 3]).unwrap();
        let error = open(dir.path()).unwrap_err();
        assert!(
            matches!(&error, LogError::Corrupt { path, reason, .. }
                if *path == floor_path && reason.starts_with("retention floor file is damaged")),
            "{error}"
        );
        assert_eq!(segment_bases(dir.path()), vec![2, 3, 4]);
    }

    #[test]
    fn issue11_4_a_roll_is_reported_once_its_group_is_acknowledged() {
        use crate::log::stats::tests::RecordingStats;
        let dir = tempfile::tempdir().unwrap();
        block_on(async {
            let stats = Rc::new(RecordingStats::default());
            let sink: Rc<dyn crate::log::LogStats> = stats.clone();
            let (log, _) = PartitionLog::open_with_stats(dir.path(), one_entry_segments(), sink)
                .await
                .unwrap();
            log.append(build_entry(0, 1, b"a")).await.unwrap();
            assert_eq!(
                stats.sealed.get(),
                0,
                "the first entry fills the empty segment"
            );
            log.append(build_entry(0, 1, b"b")).await.unwrap();
            log.append(build_entry(0, 1, b"c")).await.unwrap();
            assert_eq!(stats.sealed.get(), 2);
        });
    }
}
