//! The checkpoint snapshot file: a 64-byte header, the payload (opaque bytes: the shards crate
//! defines them) and the XXH3-64 trailer of a durable replace, written with
//! [`durable_replace_observed`](crate::durable::durable_replace_observed)'s steps and verified
//! whole on read. Byte layout and crash cases: `storage/FORMAT.md` section 9.
//!
//! Nothing here may leave `snapshot` in any state but the old or the new complete file, and a
//! shard's reactor must never do O(payload) work: the header is a separate buffer written with the
//! payload in one vectored write (no copy), and hashing above
//! [`HASH_INLINE_BYTES_MAX`](crate::limits::HASH_INLINE_BYTES_MAX) runs on compio's blocking pool.
//! This module never interprets the payload.

use std::io;
use std::path::{Path, PathBuf};

use compio::fs::File;

use crate::codec::{DecodeError, NonZeroByte, Reader, split_verified_trailer};
use crate::durable::{
    ReplaceStep, TRAILER_SIZE, off_reactor_if_large, read_exact_at, replace_parts,
};
use crate::limits::SNAPSHOT_FILE_SIZE_MAX;

/// Name of the snapshot file inside the directory that holds it.
pub const SNAPSHOT_FILE_NAME: &str = "snapshot";
/// `"SLSNAPSH"` read as a little-endian `u64`; the first 8 bytes of the file.
pub const SNAPSHOT_MAGIC: u64 = u64::from_le_bytes(*b"SLSNAPSH");
/// Layout version; a file with another version is corrupt.
pub const SNAPSHOT_VERSION: u16 = 1;
/// Bytes of the header in front of the payload.
pub const SNAPSHOT_HEADER_SIZE: usize = 64;
/// Smallest valid file: header and trailer around an empty payload (bytes).
pub const SNAPSHOT_FILE_SIZE_MIN: usize = SNAPSHOT_HEADER_SIZE + TRAILER_SIZE;

/// Byte position of `version` (u16).
const VERSION_POSITION: usize = 8;
/// Reserved (zero) bytes between `version` and `checkpoint_op`.
const RESERVED_A: std::ops::Range<usize> = 10..16;
/// Byte position of `checkpoint_op` (u64).
const CHECKPOINT_OP_POSITION: usize = 16;
/// Byte position of `payload_size_bytes` (u64).
const PAYLOAD_SIZE_POSITION: usize = 24;
/// Reserved (zero) bytes after `payload_size_bytes`, to the end of the header.
const RESERVED_B: std::ops::Range<usize> = 32..SNAPSHOT_HEADER_SIZE;

const _: () = assert!(SNAPSHOT_FILE_SIZE_MAX >= SNAPSHOT_FILE_SIZE_MIN as u64);

/// A verified snapshot file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// Op of the checkpoint this snapshot holds the state at.
    pub checkpoint_op: u64,
    /// The trailer: XXH3-64 of header + payload. The superblock's checkpoint pairing records it as
    /// `snapshot_checksum`.
    pub checksum: u64,
    /// The payload, without header or trailer.
    pub payload: Vec<u8>,
}

/// The rule a snapshot file breaks, with the byte position where one applies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotDefect {
    /// Shorter than header + trailer.
    #[error(
        "file is {size_bytes} bytes, shorter than the {SNAPSHOT_FILE_SIZE_MIN}-byte minimum \
         ({SNAPSHOT_HEADER_SIZE}-byte header and {TRAILER_SIZE}-byte trailer)"
    )]
    TooShort { size_bytes: u64 },
    /// Larger than [`SNAPSHOT_FILE_SIZE_MAX`]; checked before reading it into memory.
    #[error("file is {size_bytes} bytes, more than the {SNAPSHOT_FILE_SIZE_MAX}-byte limit")]
    TooLarge { size_bytes: u64 },
    /// The trailer at `trailer_position` is not XXH3-64 of the bytes before it (a torn or damaged
    /// file, or an outside writer).
    #[error(
        "checksum mismatch: trailer at byte {trailer_position} holds {stored:#018x}, bytes \
         0..{trailer_position} hash to {computed:#018x}"
    )]
    Checksum {
        trailer_position: u64,
        stored: u64,
        computed: u64,
    },
    /// The first 8 bytes are not [`SNAPSHOT_MAGIC`].
    #[error("bad magic at byte 0: {found:#018x}, expected {SNAPSHOT_MAGIC:#018x} (\"SLSNAPSH\")")]
    Magic { found: u64 },
    /// The version at byte 8 is not [`SNAPSHOT_VERSION`].
    #[error("unsupported version {found} at byte 8, expected {SNAPSHOT_VERSION}")]
    Version { found: u16 },
    /// A reserved header byte is not zero.
    #[error("reserved header byte {position} is {value:#04x}, not zero")]
    Reserved { position: u64, value: u8 },
    /// `payload_size_bytes` at byte 24 differs from the payload the file holds.
    #[error(
        "payload_size_bytes at byte 24 is {recorded}, but the file holds {actual} payload bytes"
    )]
    PayloadSize { recorded: u64, actual: u64 },
}

/// Why a snapshot write or read failed; every variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    /// An I/O step failed; `op` names the step, `path` the file or directory it acted on.
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    /// The file exists but is not a valid snapshot; `reason` is the rule it breaks.
    #[error("{path}: corrupt snapshot: {reason}")]
    Corrupt {
        path: PathBuf,
        reason: SnapshotDefect,
    },
    /// `write_snapshot` was given a payload whose file would exceed [`SNAPSHOT_FILE_SIZE_MAX`]
    /// (and so could never be read back); nothing was written.
    #[error(
        "{path}: snapshot payload of {payload_size_bytes} bytes does not fit the \
         {SNAPSHOT_FILE_SIZE_MAX}-byte snapshot file limit"
    )]
    PayloadTooLarge {
        path: PathBuf,
        payload_size_bytes: u64,
    },
}

fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> SnapshotError {
    let path = path.to_path_buf();
    move |source| SnapshotError::Io { path, op, source }
}

/// The 64-byte header for a payload of `payload_size_bytes` (`storage/FORMAT.md` section 9).
fn encode_header(checkpoint_op: u64, payload_size_bytes: u64) -> Vec<u8> {
    let mut header = vec![0u8; SNAPSHOT_HEADER_SIZE];
    header[..8].copy_from_slice(&SNAPSHOT_MAGIC.to_le_bytes());
    header[VERSION_POSITION..VERSION_POSITION + 2].copy_from_slice(&SNAPSHOT_VERSION.to_le_bytes());
    header[CHECKPOINT_OP_POSITION..CHECKPOINT_OP_POSITION + 8]
        .copy_from_slice(&checkpoint_op.to_le_bytes());
    header[PAYLOAD_SIZE_POSITION..PAYLOAD_SIZE_POSITION + 8]
        .copy_from_slice(&payload_size_bytes.to_le_bytes());
    header
}

/// The file's bytes before the trailer: 64-byte header then `payload`. The trailer is appended by
/// the durable replace (or by a test). Copies `payload`; [`write_snapshot`] does not use this.
pub fn encode(checkpoint_op: u64, payload: &[u8]) -> Vec<u8> {
    let mut bytes = encode_header(checkpoint_op, payload.len() as u64);
    bytes.extend_from_slice(payload);
    bytes
}

/// Verifies a whole file (header, payload, trailer), returning `(checkpoint_op, checksum)`.
/// Checks, in order: size at least [`SNAPSHOT_FILE_SIZE_MIN`], trailer (with the shared
/// [`split_verified_trailer`], before any header byte is parsed), magic, version, reserved bytes,
/// payload size. Any bytes are accepted without panicking.
fn verify(file_bytes: &[u8]) -> Result<(u64, u64), SnapshotDefect> {
    if file_bytes.len() < SNAPSHOT_FILE_SIZE_MIN {
        return Err(SnapshotDefect::TooShort {
            size_bytes: file_bytes.len() as u64,
        });
    }
    let (body, checksum) = split_verified_trailer(file_bytes).map_err(defect_of)?;
    let mut reader = Reader::new(body);
    let magic = reader.u64("magic").map_err(defect_of)?;
    if magic != SNAPSHOT_MAGIC {
        return Err(SnapshotDefect::Magic { found: magic });
    }
    let version = reader.u16("version").map_err(defect_of)?;
    if version != SNAPSHOT_VERSION {
        return Err(SnapshotDefect::Version { found: version });
    }
    check_reserved(&mut reader, RESERVED_A.len())?;
    let checkpoint_op = reader.u64("checkpoint_op").map_err(defect_of)?;
    let recorded = reader.u64("payload_size_bytes").map_err(defect_of)?;
    check_reserved(&mut reader, RESERVED_B.len())?;
    let actual = reader.remaining() as u64;
    if recorded != actual {
        return Err(SnapshotDefect::PayloadSize { recorded, actual });
    }
    Ok((checkpoint_op, checksum))
}

/// The next `count` header bytes are zero.
fn check_reserved(reader: &mut Reader<'_>, count: usize) -> Result<(), SnapshotDefect> {
    match reader.zeros("reserved", count).map_err(defect_of)? {
        None => Ok(()),
        Some(NonZeroByte { position, value }) => Err(SnapshotDefect::Reserved {
            position: position as u64,
            value,
        }),
    }
}

/// The snapshot rule a shared-codec error breaks. Only the trailer can fail once the size is
/// at least [`SNAPSHOT_FILE_SIZE_MIN`] (the header is read from a body of at least 64 bytes);
/// a short read maps to `TooShort` all the same.
fn defect_of(error: DecodeError) -> SnapshotDefect {
    match error {
        DecodeError::TrailerMismatch {
            position,
            stored,
            computed,
        } => SnapshotDefect::Checksum {
            trailer_position: position as u64,
            stored,
            computed,
        },
        DecodeError::NoTrailer { len } => SnapshotDefect::TooShort {
            size_bytes: len as u64,
        },
        DecodeError::Truncated { position, .. } | DecodeError::TrailingBytes { position, .. } => {
            SnapshotDefect::TooShort {
                size_bytes: position as u64,
            }
        }
    }
}

/// The payload of a verified file: its bytes without header and trailer (moves the payload to
/// the front of the buffer: O(payload), run where the hashing runs).
fn into_payload(mut file_bytes: Vec<u8>) -> Vec<u8> {
    file_bytes.truncate(file_bytes.len() - TRAILER_SIZE);
    file_bytes.drain(..SNAPSHOT_HEADER_SIZE);
    file_bytes
}

/// Decodes and verifies a whole snapshot file (header, payload, trailer), with no I/O; for offline
/// tools (`shardline inspect snapshot`). Hashes on the calling thread.
///
/// # Errors
/// The first [`SnapshotDefect`] found, checked in this order: size below
/// [`SNAPSHOT_FILE_SIZE_MIN`], trailer checksum, magic, version, reserved bytes, payload size.
/// (Any bytes are accepted without panicking.)
pub fn decode(file_bytes: &[u8]) -> Result<Snapshot, SnapshotDefect> {
    let (checkpoint_op, checksum) = verify(file_bytes)?;
    Ok(Snapshot {
        checkpoint_op,
        checksum,
        payload: file_bytes[SNAPSHOT_HEADER_SIZE..file_bytes.len() - TRAILER_SIZE].to_vec(),
    })
}

/// Durably replaces the snapshot file `path` with header + `payload` + trailer and returns the
/// trailer (XXH3-64 of header + payload), the checksum the superblock's checkpoint pairing records
/// and [`read_snapshot`] reports.
///
/// Steps and `observer` calls are those of
/// [`durable_replace_observed`](crate::durable::durable_replace_observed): write `path.tmp`, fsync,
/// rename over `path`, fsync the directory, `observer(step)` right after each. The header is its
/// own 64-byte buffer written with `payload` in one vectored write, so the payload is never copied,
/// and a payload larger than [`HASH_INLINE_BYTES_MAX`](crate::limits::HASH_INLINE_BYTES_MAX) is
/// hashed on compio's blocking pool while it is written: the reactor does no O(payload) work.
///
/// # Errors
/// `PayloadTooLarge` (nothing written) if the file would exceed [`SNAPSHOT_FILE_SIZE_MAX`]; `Io`
/// naming the path and step. After a failure `path` is the old or the new file (the new one only
/// if the rename happened; durable only if the directory fsync succeeded).
///
/// # Cancel safety
/// Not cancel safe: a dropped future may leave `path.tmp` behind (ignored by [`read_snapshot`],
/// truncated by the next write); `path` is always the old or the new complete file.
pub async fn write_snapshot(
    path: &Path,
    checkpoint_op: u64,
    payload: Vec<u8>,
    observer: &mut dyn FnMut(ReplaceStep),
) -> Result<u64, SnapshotError> {
    let payload_size_bytes = payload.len() as u64;
    if payload_size_bytes > SNAPSHOT_FILE_SIZE_MAX - SNAPSHOT_FILE_SIZE_MIN as u64 {
        return Err(SnapshotError::PayloadTooLarge {
            path: path.to_path_buf(),
            payload_size_bytes,
        });
    }
    let header = encode_header(checkpoint_op, payload_size_bytes);
    replace_parts(path, vec![header, payload], observer)
        .await
        .map_err(|error| SnapshotError::Io {
            path: error.path,
            op: error.op,
            source: error.source,
        })
}

/// Reads and verifies the snapshot file `path`; `None` if it does not exist. A leftover
/// `path.tmp` is never looked at.
///
/// The file is read through `io_uring` into one buffer and verified exactly as [`decode`] does
/// (the shared trailer check of `crate::codec`, then the header through its `Reader`); for a
/// file larger than [`HASH_INLINE_BYTES_MAX`](crate::limits::HASH_INLINE_BYTES_MAX) the
/// verification and the move of the payload to the buffer's front run on compio's blocking
/// pool, so the reactor does no O(payload) work.
///
/// # Errors
/// `Corrupt` naming the path and the [`SnapshotDefect`] (size checked against
/// [`SNAPSHOT_FILE_SIZE_MAX`] before reading, then as [`decode`]); `Io` naming the path and step.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn read_snapshot(path: &Path) -> Result<Option<Snapshot>, SnapshotError> {
    // Stat first: opening a FIFO would wait for a writer, and a device is no snapshot.
    match compio::fs::metadata(path).await {
        Ok(metadata) if !metadata.is_file() => {
            return Err(io_error(path, "open snapshot")(io::Error::other(
                "not a regular file (a FIFO, device, socket or directory is no snapshot)",
            )));
        }
        Ok(_) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error(path, "stat snapshot")(error)),
    }
    let file = match File::open(path).await {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error(path, "open snapshot")(error)),
    };
    let corrupt = |reason| SnapshotError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    let size_bytes = file
        .metadata()
        .await
        .map_err(io_error(path, "stat snapshot"))?
        .len();
    if size_bytes < SNAPSHOT_FILE_SIZE_MIN as u64 {
        return Err(corrupt(SnapshotDefect::TooShort { size_bytes }));
    }
    if size_bytes > SNAPSHOT_FILE_SIZE_MAX {
        return Err(corrupt(SnapshotDefect::TooLarge { size_bytes }));
    }
    // Bounded by SNAPSHOT_FILE_SIZE_MAX (1 GiB) above, so it fits usize.
    let size = size_bytes as usize;
    let file_bytes = read_exact_at(&file, 0, size)
        .await
        .map_err(io_error(path, "read snapshot"))?;
    // A close error on a read-only descriptor cannot lose data; the bytes are verified below.
    let _ = file.close().await;
    let (checkpoint_op, checksum, payload) = off_reactor_if_large(size, move || {
        let (checkpoint_op, checksum) = verify(&file_bytes)?;
        Ok((checkpoint_op, checksum, into_payload(file_bytes)))
    })
    .await
    .map_err(io_error(path, "verify snapshot"))?
    .map_err(corrupt)?;
    Ok(Some(Snapshot {
        checkpoint_op,
        checksum,
        payload,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::HASH_INLINE_BYTES_MAX;
    use twox_hash::XxHash3_64;

    fn block_on<F: Future>(future: F) -> F::Output {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    /// A whole file as `write_snapshot` writes it: `encode` + trailer.
    fn file_of(checkpoint_op: u64, payload: &[u8]) -> Vec<u8> {
        with_trailer(encode(checkpoint_op, payload))
    }

    fn read_u64(bytes: &[u8], position: usize) -> u64 {
        u64::from_le_bytes(bytes[position..position + 8].try_into().unwrap())
    }

    fn with_trailer(mut bytes: Vec<u8>) -> Vec<u8> {
        let checksum = XxHash3_64::oneshot(&bytes);
        bytes.extend_from_slice(&checksum.to_le_bytes());
        bytes
    }

    /// Edits the header of a valid file and re-seals the trailer, so a rule after the checksum is
    /// the one broken.
    fn resealed(edit: impl FnOnce(&mut Vec<u8>)) -> Vec<u8> {
        let mut bytes = encode(9, b"payload");
        edit(&mut bytes);
        with_trailer(bytes)
    }

    #[test]
    fn header_fields_lie_at_the_documented_offsets() {
        let bytes = encode(0x0102_0304_0506_0708, b"abc");
        assert_eq!(bytes.len(), 64 + 3);
        assert_eq!(&bytes[0..8], b"SLSNAPSH");
        assert_eq!(&bytes[8..10], &[1, 0]);
        assert_eq!(&bytes[10..16], &[0; 6]);
        assert_eq!(&bytes[16..24], &0x0102_0304_0506_0708u64.to_le_bytes());
        assert_eq!(&bytes[24..32], &3u64.to_le_bytes());
        assert_eq!(&bytes[32..64], &[0; 32]);
        assert_eq!(&bytes[64..], b"abc");
    }

    #[test]
    fn write_then_read_round_trips_with_the_returned_checksum() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let payload = b"{\"metadata\":{},\"clients\":[]}".to_vec();
        let checksum = block_on(async {
            let checksum = write_snapshot(&path, 42, payload.clone(), &mut |_| {})
                .await
                .unwrap();
            let read = read_snapshot(&path).await.unwrap().unwrap();
            assert_eq!(
                read,
                Snapshot {
                    checkpoint_op: 42,
                    checksum,
                    payload: payload.clone(),
                }
            );
            checksum
        });
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw, file_of(42, &payload));
        assert_eq!(&raw[raw.len() - 8..], &checksum.to_le_bytes());
        assert_eq!(decode(&raw).unwrap().checksum, checksum);
        assert!(!crate::durable::tmp_path(&path).exists());
    }

    #[test]
    fn empty_payload_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        block_on(async {
            let checksum = write_snapshot(&path, 0, Vec::new(), &mut |_| {})
                .await
                .unwrap();
            let read = read_snapshot(&path).await.unwrap().unwrap();
            assert_eq!(read.payload, Vec::<u8>::new());
            assert_eq!(read.checksum, checksum);
        });
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 72);
    }

    #[test]
    fn payload_above_the_inline_hash_bound_round_trips() {
        // Hashed and verified on the blocking pool; same checksum as the inline path.
        let payload: Vec<u8> = (0..3 * HASH_INLINE_BYTES_MAX + 11)
            .map(|index| (index % 241) as u8)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        block_on(async {
            let checksum = write_snapshot(&path, 7, payload.clone(), &mut |_| {})
                .await
                .unwrap();
            let read = read_snapshot(&path).await.unwrap().unwrap();
            assert_eq!(read.checkpoint_op, 7);
            assert_eq!(read.checksum, checksum);
            assert!(read.payload == payload, "payload differs");
        });
        let mut raw = std::fs::read(&path).unwrap();
        assert!(raw == file_of(7, &payload), "file bytes differ");
        raw[64 + 2 * HASH_INLINE_BYTES_MAX] ^= 0x01;
        std::fs::write(&path, &raw).unwrap();
        assert!(matches!(
            block_on(read_snapshot(&path)),
            Err(SnapshotError::Corrupt {
                reason: SnapshotDefect::Checksum { .. },
                ..
            })
        ));
    }

    #[test]
    fn missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        assert_eq!(block_on(read_snapshot(&path)).unwrap(), None);
    }

    #[test]
    fn observer_sees_the_four_steps_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let mut steps = Vec::new();
        block_on(write_snapshot(&path, 1, b"x".to_vec(), &mut |step| {
            steps.push(step);
        }))
        .unwrap();
        assert_eq!(
            steps,
            vec![
                ReplaceStep::TmpWritten,
                ReplaceStep::TmpSynced,
                ReplaceStep::Renamed,
                ReplaceStep::DirSynced,
            ]
        );
    }

    #[test]
    fn a_crash_before_the_rename_leaves_the_old_snapshot_and_the_tmp_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let tmp = crate::durable::tmp_path(&path);
        let old_checksum =
            block_on(write_snapshot(&path, 5, b"old".to_vec(), &mut |_| {})).unwrap();
        // What a crash after TmpWritten/TmpSynced leaves: a complete new file in tmp, never renamed.
        std::fs::write(&tmp, file_of(9, b"new")).unwrap();
        let read = block_on(read_snapshot(&path)).unwrap().unwrap();
        assert_eq!((read.checkpoint_op, read.checksum), (5, old_checksum));
        assert_eq!(read.payload, b"old");
        // And a torn tmp (partial write) is equally ignored, then truncated by the next write.
        std::fs::write(&tmp, b"SLSNAPSH torn").unwrap();
        block_on(async {
            assert_eq!(read_snapshot(&path).await.unwrap().unwrap().payload, b"old");
            write_snapshot(&path, 9, b"new".to_vec(), &mut |_| {})
                .await
                .unwrap();
            assert_eq!(read_snapshot(&path).await.unwrap().unwrap().payload, b"new");
        });
        assert!(!tmp.exists());
    }

    #[test]
    fn observer_sees_the_old_file_until_the_rename() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        block_on(write_snapshot(&path, 5, b"old".to_vec(), &mut |_| {})).unwrap();
        let mut seen = Vec::new();
        block_on(write_snapshot(&path, 9, b"new".to_vec(), &mut |step| {
            let on_disk = decode(&std::fs::read(&path).unwrap()).unwrap();
            seen.push((step, on_disk.checkpoint_op));
        }))
        .unwrap();
        assert_eq!(
            seen,
            vec![
                (ReplaceStep::TmpWritten, 5),
                (ReplaceStep::TmpSynced, 5),
                (ReplaceStep::Renamed, 9),
                (ReplaceStep::DirSynced, 9),
            ]
        );
    }

    #[test]
    fn a_flipped_byte_anywhere_is_a_checksum_mismatch() {
        let good = file_of(3, b"some payload bytes");
        let trailer_position = (good.len() - 8) as u64;
        // Header (magic, checkpoint_op, reserved), payload, trailer.
        for position in [0, 17, 40, 64, 70, good.len() - 8, good.len() - 1] {
            let mut bad = good.clone();
            bad[position] ^= 0x10;
            match decode(&bad) {
                Err(SnapshotDefect::Checksum {
                    trailer_position: reported,
                    ..
                }) => assert_eq!(reported, trailer_position),
                other => panic!("byte {position}: expected a checksum mismatch, got {other:?}"),
            }
        }
    }

    #[test]
    fn each_rule_after_the_checksum_is_named() {
        assert_eq!(
            decode(&resealed(|bytes| bytes[3] = b'X')),
            Err(SnapshotDefect::Magic {
                found: u64::from_le_bytes(*b"SLSXAPSH")
            })
        );
        assert_eq!(
            decode(&resealed(|bytes| bytes[8] = 2)),
            Err(SnapshotDefect::Version { found: 2 })
        );
        assert_eq!(
            decode(&resealed(|bytes| bytes[13] = 0xaa)),
            Err(SnapshotDefect::Reserved {
                position: 13,
                value: 0xaa
            })
        );
        assert_eq!(
            decode(&resealed(|bytes| bytes[63] = 1)),
            Err(SnapshotDefect::Reserved {
                position: 63,
                value: 1
            })
        );
        assert_eq!(
            decode(&resealed(|bytes| bytes[24] = 8)),
            Err(SnapshotDefect::PayloadSize {
                recorded: 8,
                actual: 7
            })
        );
        // A truncated payload with a re-sealed trailer: the size field no longer matches.
        assert_eq!(
            decode(&resealed(|bytes| bytes.truncate(bytes.len() - 2))),
            Err(SnapshotDefect::PayloadSize {
                recorded: 7,
                actual: 5
            })
        );
    }

    #[test]
    fn truncated_files_are_corrupt() {
        let good = file_of(3, b"payload");
        assert_eq!(
            decode(&good[..71]),
            Err(SnapshotDefect::TooShort { size_bytes: 71 })
        );
        assert_eq!(decode(&[]), Err(SnapshotDefect::TooShort { size_bytes: 0 }));
        // Cut inside the payload: the trailer is read from other bytes.
        assert!(matches!(
            decode(&good[..good.len() - 1]),
            Err(SnapshotDefect::Checksum { .. })
        ));
    }

    #[test]
    fn read_reports_the_path_and_the_rule() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        let mut bytes = file_of(3, b"payload");
        let stored = read_u64(&bytes, bytes.len() - 8);
        bytes[70] ^= 0x01;
        let computed = XxHash3_64::oneshot(&bytes[..bytes.len() - 8]);
        std::fs::write(&path, &bytes).unwrap();
        let error = block_on(read_snapshot(&path)).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{}: corrupt snapshot: checksum mismatch: trailer at byte 71 holds {stored:#018x}, \
                 bytes 0..71 hash to {computed:#018x}",
                path.display()
            )
        );
        std::fs::write(&path, &bytes[..10]).unwrap();
        let error = block_on(read_snapshot(&path)).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{}: corrupt snapshot: file is 10 bytes, shorter than the 72-byte minimum \
                 (64-byte header and 8-byte trailer)",
                path.display()
            )
        );
        std::fs::write(&path, resealed(|bytes| bytes[8] = 7)).unwrap();
        assert!(matches!(
            block_on(read_snapshot(&path)),
            Err(SnapshotError::Corrupt { reason: SnapshotDefect::Version { found: 7 }, path: named })
                if named == path
        ));
    }

    #[test]
    fn a_file_above_the_size_limit_is_refused_before_reading() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(SNAPSHOT_FILE_NAME);
        // Sparse: no disk blocks, and read_snapshot must not allocate or read it.
        let file = std::fs::File::create(&path).unwrap();
        file.set_len(SNAPSHOT_FILE_SIZE_MAX + 1).unwrap();
        drop(file);
        assert!(matches!(
            block_on(read_snapshot(&path)),
            Err(SnapshotError::Corrupt { reason: SnapshotDefect::TooLarge { size_bytes }, .. })
                if size_bytes == SNAPSHOT_FILE_SIZE_MAX + 1
        ));
    }

    #[test]
    fn write_errors_name_the_path_and_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent-dir").join(SNAPSHOT_FILE_NAME);
        let error = block_on(write_snapshot(&path, 1, b"x".to_vec(), &mut |_| {})).unwrap_err();
        assert!(
            matches!(
                &error,
                SnapshotError::Io {
                    op: "create temporary file",
                    ..
                }
            ),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("snapshot.tmp: create temporary file failed"),
            "{error}"
        );
    }

    proptest::proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(0u8.., 0..200)) {
            let _ = decode(&bytes);
        }

        #[test]
        fn decode_never_panics_on_damaged_valid_files(
            payload in proptest::collection::vec(0u8.., 0..100),
            checkpoint_op in 0u64..,
            edits in proptest::collection::vec((0usize..300, 0u8..), 0..4),
            cut in 0usize..300,
        ) {
            let mut bytes = file_of(checkpoint_op, &payload);
            for (position, value) in edits {
                let length = bytes.len();
                bytes[position % length] = value;
            }
            bytes.truncate(bytes.len().saturating_sub(cut % 80));
            let _ = decode(&bytes);
        }

        #[test]
        fn encode_then_decode_round_trips(
            payload in proptest::collection::vec(0u8.., 0..300),
            checkpoint_op in 0u64..,
        ) {
            let bytes = file_of(checkpoint_op, &payload);
            let snapshot = decode(&bytes).unwrap();
            proptest::prop_assert_eq!(snapshot.checkpoint_op, checkpoint_op);
            proptest::prop_assert_eq!(&snapshot.payload, &payload);
            proptest::prop_assert_eq!(snapshot.checksum, read_u64(&bytes, bytes.len() - 8));
        }
    }
}
