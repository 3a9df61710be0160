//! Durable file replace through `io_uring` (compio fs): write `X.tmp`, fsync it, rename over `X`,
//! fsync the directory. The file ends with an XXH3-64 trailer of everything before it.
//!
//! Also the two I/O helpers the log shares with it: fsync of a directory and an exact positional
//! read. Nothing here may leave `X` in any state but the old or the new complete file.

use std::hash::Hasher;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use compio::BufResult;
use compio::buf::{IntoInner, IoBuf};
use compio::fs::{File, OpenOptions};
use compio::io::{AsyncReadAtExt, AsyncWriteAtExt};
use twox_hash::XxHash3_64;

use crate::limits::{DURABLE_FILE_SIZE_MAX, HASH_INLINE_BYTES_MAX};

/// Bytes of the XXH3-64 trailer (little-endian) that ends every durably replaced file.
pub const TRAILER_SIZE: usize = 8;

/// Why a durable replace or a verified read failed; every variant names the path.
#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    /// An I/O step failed; `op` names the step, `path` the file or directory it acted on.
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    /// The file exists but is not a complete file written by [`durable_replace`].
    #[error("{path}: corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> DurableError {
    let path = path.to_path_buf();
    move |source| DurableError::Io { path, op, source }
}

/// `X.tmp` for `X`: the name gets `.tmp` appended, so `metadata.json` uses `metadata.json.tmp`.
pub fn tmp_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".tmp");
    PathBuf::from(name)
}

/// `X.prev` for `X`: the replaced file, kept (as a second hard link) across the rename so that its
/// blocks are not freed inside the rename and can be overwritten by the next replace.
pub fn prev_path(path: &Path) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(".prev");
    PathBuf::from(name)
}

/// The directory holding `path` (`.` for a bare file name).
fn parent_dir(path: &Path) -> &Path {
    match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    }
}

/// Which step of `create_dir_durable` failed, on which path.
#[derive(Debug)]
pub(crate) struct DirStepError {
    pub path: PathBuf,
    pub step: &'static str,
    pub source: io::Error,
}

/// Creates `dir` and any missing ancestors, fsyncing each directory whose entries changed so the
/// new directories survive a crash (used by the partition log and the journal).
pub(crate) async fn create_dir_durable(dir: &Path) -> Result<(), DirStepError> {
    let mut missing = Vec::new();
    let mut ancestor = Some(dir);
    while let Some(path) = ancestor {
        if path.as_os_str().is_empty() || compio::fs::metadata(path).await.is_ok() {
            break;
        }
        missing.push(path);
        ancestor = path.parent();
    }
    if missing.is_empty() {
        return Ok(());
    }
    compio::fs::create_dir_all(dir)
        .await
        .map_err(|source| DirStepError {
            path: dir.to_path_buf(),
            step: "create directory",
            source,
        })?;
    for created in missing {
        let parent = match created.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => parent,
            _ => Path::new("."),
        };
        sync_dir(parent).await.map_err(|source| DirStepError {
            path: parent.to_path_buf(),
            step: "fsync directory after creating a subdirectory",
            source,
        })?;
    }
    Ok(())
}

/// Names of the entries of `dir`. Listing uses `std::fs::read_dir` on compio's blocking pool:
/// `io_uring` has no getdents operation.
pub(crate) async fn list_dir_names(dir: &Path) -> io::Result<Vec<String>> {
    let listed_dir = dir.to_path_buf();
    compio::runtime::spawn_blocking(move || -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for entry in std::fs::read_dir(&listed_dir)? {
            names.push(entry?.file_name().to_string_lossy().into_owned());
        }
        Ok(names)
    })
    .await
    .map_err(|error| io::Error::other(error.to_string()))?
}

/// Fsyncs directory `dir`, making renames, creations and removals of its entries durable
/// (fsync(2): "Calling `fsync()` does not necessarily ensure that the entry in the directory containing
/// the file has also reached disk. For that an explicit `fsync()` on a file descriptor for the
/// directory is also needed."). The directory is opened read-only through compio and fsynced with
/// `IORING_OP_FSYNC`, like a file.
pub(crate) async fn sync_dir(dir: &Path) -> io::Result<()> {
    let handle = OpenOptions::new().read(true).open(dir).await?;
    handle.sync_all().await?;
    handle.close().await
}

/// Reads exactly `length` bytes at `position` into a new `Vec`.
///
/// # Errors
/// `UnexpectedEof` if the file ends first; any read error.
pub(crate) async fn read_exact_at(
    file: &File,
    position: u64,
    length: usize,
) -> io::Result<Vec<u8>> {
    let BufResult(result, buffer) = read_exact_append(file, position, length, Vec::new()).await;
    result.map(|()| buffer)
}

/// Reads exactly `length` bytes at `position`, appending them to `buffer` (no intermediate copy).
/// On error `buffer` comes back with its old contents plus an unspecified part of the read.
pub(crate) async fn read_exact_append(
    file: &File,
    position: u64,
    length: usize,
    mut buffer: Vec<u8>,
) -> BufResult<(), Vec<u8>> {
    let start = buffer.len();
    buffer.reserve_exact(length);
    let BufResult(result, slice) = file
        .read_exact_at(buffer.slice(start..start + length), position)
        .await;
    let buffer = slice.into_inner();
    if result.is_ok() {
        assert_eq!(
            buffer.len(),
            start + length,
            "read_exact_at filled the requested length"
        );
    }
    BufResult(result, buffer)
}

/// A step of a durable replace that has just completed, reported to the observer of
/// [`durable_replace_observed`] in this order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplaceStep {
    /// `X.tmp` holds payload + trailer (written, not yet fsynced).
    TmpWritten,
    /// `X.tmp` is fsynced.
    TmpSynced,
    /// `X.tmp` was renamed over `X` (the rename is not yet durable).
    Renamed,
    /// The directory of `X` is fsynced: the replace is durable.
    DirSynced,
}

/// An I/O step of [`replace_parts`] failed: the path it acted on, the step, the error.
#[derive(Debug)]
pub(crate) struct ReplaceIoError {
    pub path: PathBuf,
    pub op: &'static str,
    pub source: io::Error,
}

impl From<ReplaceIoError> for DurableError {
    fn from(error: ReplaceIoError) -> Self {
        DurableError::Io {
            path: error.path,
            op: error.op,
            source: error.source,
        }
    }
}

fn replace_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> ReplaceIoError {
    let path = path.to_path_buf();
    move |source| ReplaceIoError { path, op, source }
}

/// XXH3-64 of `parts` concatenated.
pub(crate) fn xxh3_of_parts(parts: &[&[u8]]) -> u64 {
    if let [single] = parts {
        return XxHash3_64::oneshot(single);
    }
    let mut hasher = XxHash3_64::new();
    for part in parts {
        hasher.write(part);
    }
    hasher.finish()
}

/// Runs `work` on the calling thread when `size_bytes` is at most [`HASH_INLINE_BYTES_MAX`],
/// otherwise on compio's blocking pool, so a shard's reactor never hashes a big file itself.
///
/// # Errors
/// `Other` if the blocking task could not deliver its result (it panicked).
pub(crate) async fn off_reactor_if_large<T: Send + 'static>(
    size_bytes: usize,
    work: impl FnOnce() -> T + Send + 'static,
) -> io::Result<T> {
    if size_bytes <= HASH_INLINE_BYTES_MAX {
        return Ok(work());
    }
    compio::runtime::spawn_blocking(work)
        .await
        .map_err(|error| io::Error::other(format!("blocking hash task failed: {error:?}")))
}

/// Replaces `path` durably with `parts` concatenated + the 8-byte XXH3-64 trailer of them, and
/// returns the trailer value. The parts go to the kernel in one vectored write, never copied into
/// one buffer. Up to [`HASH_INLINE_BYTES_MAX`] bytes are hashed on the calling thread first; above
/// it the hash runs on compio's blocking pool *while* the parts are written (they are shared
/// read-only through `Arc`), and the trailer follows in a second write once both are done, so
/// the reactor does no O(size) work and the hash adds no latency. Either way the file holds
/// parts + trailer before the fsync. `observer` is called right after each step completes (see
/// [`ReplaceStep`]).
pub(crate) async fn replace_parts(
    path: &Path,
    parts: Vec<Vec<u8>>,
    observer: &mut dyn FnMut(ReplaceStep),
) -> Result<u64, ReplaceIoError> {
    let tmp = tmp_path(path);
    let size_bytes: usize = parts.iter().map(Vec::len).sum();
    let inline_checksum = (size_bytes <= HASH_INLINE_BYTES_MAX).then(|| {
        let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
        xxh3_of_parts(&slices)
    });

    // A large file recycles the blocks of the one it replaced (kept as `X.prev` by the previous
    // replace, then renamed to `X.tmp`): overwriting allocated blocks skips block allocation now
    // and block freeing inside the rename, which on ext4 cost as much as the fsync for 64 MiB.
    let recycle = inline_checksum.is_none();
    if recycle {
        // Leftover of a replace that stopped between its rename and the recycling rename: a
        // failure only means this write allocates fresh blocks.
        use std::os::unix::fs::MetadataExt as _;
        let prev = prev_path(path);
        // Only a file with no other name is recycled: `X.prev` still linked to `X` (a stop
        // between 4a and 4 followed by someone deleting `X.tmp`) must never be written into.
        if compio::fs::metadata(&tmp).await.is_err()
            && compio::fs::metadata(&prev)
                .await
                .is_ok_and(|metadata| metadata.nlink() == 1)
        {
            let _ = compio::fs::rename(&prev, &tmp).await;
        }
        if compio::fs::metadata(&tmp)
            .await
            .is_ok_and(|metadata| metadata.nlink() > 1)
        {
            compio::fs::remove_file(&tmp).await.map_err(replace_error(
                &tmp,
                "unlink a temporary file that has other names",
            ))?;
        }
    }
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(!recycle)
        .open(&tmp)
        .await
        .map_err(replace_error(&tmp, "create temporary file"))?;
    let checksum = if let Some(checksum) = inline_checksum {
        let mut parts = parts;
        parts.push(checksum.to_le_bytes().to_vec());
        let BufResult(result, _) = (&file).write_vectored_all_at(parts, 0).await;
        result.map_err(replace_error(&tmp, "write temporary file"))?;
        checksum
    } else {
        let shared: Vec<Arc<Vec<u8>>> = parts.into_iter().map(Arc::new).collect();
        let hashed = shared.clone();
        let hash = compio::runtime::spawn_blocking(move || {
            let slices: Vec<&[u8]> = hashed.iter().map(|part| part.as_slice()).collect();
            xxh3_of_parts(&slices)
        });
        let mut writer = &file;
        let write = writer.write_vectored_all_at(shared, 0);
        let (BufResult(written, _), checksum) = futures_util::future::join(write, hash).await;
        written.map_err(replace_error(&tmp, "write temporary file"))?;
        let checksum = checksum.map_err(|error| ReplaceIoError {
            path: path.to_path_buf(),
            op: "checksum the payload",
            source: io::Error::other(format!("blocking hash task failed: {error:?}")),
        })?;
        let BufResult(result, _) = (&file)
            .write_all_at(checksum.to_le_bytes().to_vec(), size_bytes as u64)
            .await;
        result.map_err(replace_error(&tmp, "write temporary file trailer"))?;
        // A recycled file may be longer than this one: cut it to the trailer's end.
        file.set_len(size_bytes as u64 + TRAILER_SIZE as u64)
            .await
            .map_err(replace_error(&tmp, "truncate temporary file"))?;
        checksum
    };
    observer(ReplaceStep::TmpWritten);
    file.sync_all()
        .await
        .map_err(replace_error(&tmp, "fsync temporary file"))?;
    observer(ReplaceStep::TmpSynced);
    file.close()
        .await
        .map_err(replace_error(&tmp, "close temporary file"))?;
    let prev = prev_path(path);
    // Keep the file being replaced as `X.prev` (a second link), so the rename does not free it.
    let kept = recycle && {
        let _ = compio::fs::remove_file(&prev).await;
        compio::fs::hard_link(path, &prev).await.is_ok()
    };
    compio::fs::rename(&tmp, path)
        .await
        .map_err(replace_error(path, "rename of the .tmp file over it"))?;
    observer(ReplaceStep::Renamed);
    let dir = parent_dir(path);
    sync_dir(dir)
        .await
        .map_err(replace_error(dir, "fsync directory after rename"))?;
    observer(ReplaceStep::DirSynced);
    if kept {
        // The next replace overwrites it. Never read, so neither this rename nor its durability
        // matters to recovery; a failure only means the next write allocates fresh blocks.
        let _ = compio::fs::rename(&prev, &tmp).await;
    }
    Ok(checksum)
}

/// Replaces `path` durably with `payload` + 8-byte XXH3-64 trailer; [`durable_replace_observed`]
/// with an observer that does nothing.
///
/// # Errors
/// As [`durable_replace_observed`].
///
/// # Cancel safety
/// As [`durable_replace_observed`]: not cancel safe.
pub async fn durable_replace(path: &Path, payload: Vec<u8>) -> Result<(), DurableError> {
    durable_replace_observed(path, payload, &mut |_| {}).await
}

/// Replaces `path` durably with `payload` + 8-byte XXH3-64 trailer, calling `observer(step)`
/// synchronously right after each step completes, so a test can kill the process at each step.
///
/// Steps, each only after the previous succeeded: create/truncate `X.tmp`, write payload +
/// trailer then [`ReplaceStep::TmpWritten`] (a payload larger than [`HASH_INLINE_BYTES_MAX`] bytes
/// is hashed on compio's blocking pool while it is being written, and the trailer written after
/// it, so the reactor does no O(payload) work; a smaller one is hashed first and written with its
/// trailer in one write), fsync `X.tmp` then [`ReplaceStep::TmpSynced`], close it, rename
/// `X.tmp` over `X` then [`ReplaceStep::Renamed`], fsync the parent directory then
/// [`ReplaceStep::DirSynced`].
///
/// # Errors
/// `Io` naming the path and the failed step. After a failure `X` is the old or the new file (the
/// new one only if the rename happened; durable only if the directory fsync succeeded).
///
/// # Cancel safety
/// Not cancel safe: a dropped future may leave `X.tmp` behind (ignored and replaced next time);
/// `X` is always either the old or the new file.
pub async fn durable_replace_observed(
    path: &Path,
    payload: Vec<u8>,
    observer: &mut dyn FnMut(ReplaceStep),
) -> Result<(), DurableError> {
    replace_parts(path, vec![payload], observer).await?;
    Ok(())
}

/// Removes `path` durably: deletes it (a missing file is not an error) and fsyncs its parent
/// directory, so after `Ok` a crash never brings it back.
///
/// # Errors
/// `Io` naming the path (or its directory) and the failed step.
///
/// # Cancel safety
/// Not cancel safe: a dropped call may leave the file deleted but the deletion not yet durable.
pub async fn durable_remove(path: &Path) -> Result<(), DurableError> {
    match compio::fs::remove_file(path).await {
        Ok(()) => {}
        Err(error) if error.kind() == io::ErrorKind::NotFound => {}
        Err(error) => return Err(io_error(path, "remove")(error)),
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    sync_dir(dir)
        .await
        .map_err(io_error(dir, "fsync directory"))
}

/// Reads `path` and verifies its trailer; returns the payload without the trailer, or `None` if the
/// file does not exist. A leftover `X.tmp` is never looked at. A payload larger than
/// [`HASH_INLINE_BYTES_MAX`] is hashed on compio's blocking pool, not on the reactor.
///
/// # Errors
/// `Corrupt` (naming the path) when shorter than the trailer, larger than
/// [`DURABLE_FILE_SIZE_MAX`], or the checksum differs; `Io` naming the path and step otherwise.
///
/// # Cancel safety
/// Cancel safe: it only reads.
pub async fn read_verified(path: &Path) -> Result<Option<Vec<u8>>, DurableError> {
    let file = match File::open(path).await {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error(path, "open")(error)),
    };
    let size_bytes = file.metadata().await.map_err(io_error(path, "stat"))?.len();
    let corrupt = |reason: String| DurableError::Corrupt {
        path: path.to_path_buf(),
        reason,
    };
    if size_bytes < TRAILER_SIZE as u64 {
        return Err(corrupt(format!(
            "{size_bytes} bytes is shorter than the {TRAILER_SIZE}-byte checksum trailer"
        )));
    }
    if size_bytes > DURABLE_FILE_SIZE_MAX {
        return Err(corrupt(format!(
            "{size_bytes} bytes exceeds the {DURABLE_FILE_SIZE_MAX}-byte limit"
        )));
    }
    let bytes = read_exact_at(&file, 0, size_bytes as usize)
        .await
        .map_err(io_error(path, "read"))?;
    // A close error on a read-only descriptor cannot lose data; the bytes are verified below.
    let _ = file.close().await;
    let payload_size = bytes.len() - TRAILER_SIZE;
    let mut trailer = [0u8; TRAILER_SIZE];
    trailer.copy_from_slice(&bytes[payload_size..]);
    let stored = u64::from_le_bytes(trailer);
    let (mut bytes, computed) = off_reactor_if_large(payload_size, move || {
        let computed = XxHash3_64::oneshot(&bytes[..payload_size]);
        (bytes, computed)
    })
    .await
    .map_err(io_error(path, "checksum"))?;
    if stored != computed {
        return Err(corrupt(format!(
            "checksum mismatch: trailer has {stored:#018x}, the {payload_size} payload bytes hash to \
             {computed:#018x}"
        )));
    }
    bytes.truncate(payload_size);
    Ok(Some(bytes))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<F: Future>(future: F) -> F::Output {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    #[test]
    fn round_trip_appends_a_trailer() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        block_on(async {
            durable_replace(&path, b"{\"a\":1}".to_vec()).await.unwrap();
            assert_eq!(
                read_verified(&path).await.unwrap(),
                Some(b"{\"a\":1}".to_vec())
            );
            durable_replace(&path, b"second".to_vec()).await.unwrap();
            assert_eq!(
                read_verified(&path).await.unwrap(),
                Some(b"second".to_vec())
            );
        });
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), 6 + TRAILER_SIZE);
        assert_eq!(&raw[6..], &XxHash3_64::oneshot(b"second").to_le_bytes());
        assert!(!tmp_path(&path).exists(), "the .tmp file was renamed away");
    }

    #[test]
    fn observer_sees_the_four_steps_in_order_with_the_file_state_of_each() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        block_on(durable_replace(&path, b"old".to_vec())).unwrap();
        let mut seen = Vec::new();
        block_on(durable_replace_observed(
            &path,
            b"new".to_vec(),
            &mut |step| {
                // Synchronously after each step: what the step did is already visible.
                let tmp_exists = tmp_path(&path).exists();
                let current = std::fs::read(&path).unwrap();
                seen.push((step, tmp_exists, current[..3].to_vec()));
            },
        ))
        .unwrap();
        assert_eq!(
            seen,
            vec![
                (ReplaceStep::TmpWritten, true, b"old".to_vec()),
                (ReplaceStep::TmpSynced, true, b"old".to_vec()),
                (ReplaceStep::Renamed, false, b"new".to_vec()),
                (ReplaceStep::DirSynced, false, b"new".to_vec()),
            ]
        );
    }

    #[test]
    fn observer_is_not_called_past_a_failed_step() {
        let dir = tempfile::tempdir().unwrap();
        // The target is an existing non-empty directory: the rename fails after the tmp steps.
        let path = dir.path().join("occupied");
        std::fs::create_dir(&path).unwrap();
        std::fs::write(path.join("inside"), b"x").unwrap();
        let mut seen = Vec::new();
        let error = block_on(durable_replace_observed(
            &path,
            b"new".to_vec(),
            &mut |step| seen.push(step),
        ))
        .unwrap_err();
        assert!(
            matches!(
                &error,
                DurableError::Io {
                    op: "rename of the .tmp file over it",
                    ..
                }
            ),
            "{error}"
        );
        assert_eq!(seen, vec![ReplaceStep::TmpWritten, ReplaceStep::TmpSynced]);
    }

    #[test]
    fn large_replace_recycles_the_replaced_file_and_never_reads_it() {
        use std::os::unix::fs::MetadataExt;
        let big = |seed: u8, extra: usize| -> Vec<u8> {
            (0..HASH_INLINE_BYTES_MAX + extra)
                .map(|index| (index as u8).wrapping_mul(seed))
                .collect()
        };
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("snapshot");
        let (first, second, third) = (big(3, 8192), big(5, 100), big(7, 4096));
        block_on(durable_replace(&path, first.clone())).unwrap();
        let first_inode = std::fs::metadata(&path).unwrap().ino();
        block_on(durable_replace(&path, second.clone())).unwrap();
        // The first file now waits as X.tmp for the next replace; X.prev is gone.
        assert_eq!(
            std::fs::metadata(tmp_path(&path)).unwrap().ino(),
            first_inode
        );
        assert!(!prev_path(&path).exists());
        assert_eq!(
            block_on(read_verified(&path)).unwrap(),
            Some(second.clone())
        );
        // The third replace overwrites that recycled (longer) file and cuts it to size.
        block_on(durable_replace(&path, third.clone())).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().ino(), first_inode);
        assert_eq!(
            std::fs::metadata(&path).unwrap().len(),
            (third.len() + TRAILER_SIZE) as u64
        );
        assert_eq!(block_on(read_verified(&path)).unwrap(), Some(third.clone()));
        // X.prev still linked to X (a stop between the link and the rename) with X.tmp deleted
        // by hand: never written into; the replace allocates a fresh file.
        std::fs::remove_file(tmp_path(&path)).unwrap();
        std::fs::hard_link(&path, prev_path(&path)).unwrap();
        let live_inode = std::fs::metadata(&path).unwrap().ino();
        block_on(durable_replace(&path, second.clone())).unwrap();
        assert_ne!(std::fs::metadata(&path).unwrap().ino(), live_inode);
        assert_eq!(
            block_on(read_verified(&path)).unwrap(),
            Some(second.clone())
        );
        // The same with X.tmp itself a second name of X.
        std::fs::remove_file(tmp_path(&path)).unwrap();
        std::fs::hard_link(&path, tmp_path(&path)).unwrap();
        block_on(durable_replace(&path, third.clone())).unwrap();
        assert_eq!(block_on(read_verified(&path)).unwrap(), Some(third.clone()));
        // A leftover X.prev (a stop between rename and recycling) is picked up, not piled up.
        std::fs::rename(tmp_path(&path), prev_path(&path)).unwrap();
        block_on(durable_replace(&path, first.clone())).unwrap();
        assert!(!prev_path(&path).exists());
        assert_eq!(block_on(read_verified(&path)).unwrap(), Some(first));
    }

    #[test]
    fn payload_above_the_inline_hash_bound_round_trips() {
        // Hashed on the blocking pool; the trailer must be the same XXH3-64 as inline.
        let payload: Vec<u8> = (0..HASH_INLINE_BYTES_MAX + 4097)
            .map(|index| (index % 253) as u8)
            .collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        block_on(async {
            durable_replace(&path, payload.clone()).await.unwrap();
            assert_eq!(read_verified(&path).await.unwrap(), Some(payload.clone()));
        });
        let raw = std::fs::read(&path).unwrap();
        assert_eq!(raw.len(), payload.len() + TRAILER_SIZE);
        assert_eq!(
            &raw[payload.len()..],
            &XxHash3_64::oneshot(&payload).to_le_bytes()
        );
        // A flipped byte of a big file is still found (verification on the blocking pool).
        let mut damaged = raw;
        damaged[HASH_INLINE_BYTES_MAX + 5] ^= 0x80;
        std::fs::write(&path, &damaged).unwrap();
        assert!(matches!(
            block_on(read_verified(&path)),
            Err(DurableError::Corrupt { reason, .. }) if reason.starts_with("checksum mismatch")
        ));
    }

    proptest::proptest! {
        #[test]
        fn hash_of_parts_equals_hash_of_their_concatenation(
            parts in proptest::collection::vec(proptest::collection::vec(0u8.., 0..300), 0..5)
        ) {
            let slices: Vec<&[u8]> = parts.iter().map(Vec::as_slice).collect();
            proptest::prop_assert_eq!(xxh3_of_parts(&slices), XxHash3_64::oneshot(&parts.concat()));
        }
    }

    #[test]
    fn empty_payload_round_trips() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("empty");
        block_on(async {
            durable_replace(&path, Vec::new()).await.unwrap();
            assert_eq!(read_verified(&path).await.unwrap(), Some(Vec::new()));
        });
    }

    #[test]
    fn missing_file_is_none() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("absent");
        assert_eq!(block_on(read_verified(&path)).unwrap(), None);
    }

    #[test]
    fn flipped_byte_is_corrupt_naming_the_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        block_on(durable_replace(&path, b"payload bytes".to_vec())).unwrap();
        let mut raw = std::fs::read(&path).unwrap();
        raw[3] ^= 0x01;
        std::fs::write(&path, &raw).unwrap();
        let error = block_on(read_verified(&path)).unwrap_err();
        match &error {
            DurableError::Corrupt {
                path: named,
                reason,
            } => {
                assert_eq!(named, &path);
                assert!(reason.starts_with("checksum mismatch"), "{reason}");
            }
            DurableError::Io { .. } => panic!("expected Corrupt, got {error}"),
        }
        assert!(error.to_string().contains("metadata.json"), "{error}");
    }

    #[test]
    fn truncated_file_is_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        block_on(durable_replace(&path, b"payload bytes".to_vec())).unwrap();
        let raw = std::fs::read(&path).unwrap();
        // Shorter than the payload: the trailer is now read from payload bytes.
        std::fs::write(&path, &raw[..raw.len() - 1]).unwrap();
        assert!(matches!(
            block_on(read_verified(&path)),
            Err(DurableError::Corrupt { reason, .. }) if reason.starts_with("checksum mismatch")
        ));
        // Shorter than the trailer itself.
        std::fs::write(&path, &raw[..5]).unwrap();
        let error = block_on(read_verified(&path)).unwrap_err();
        assert_eq!(
            error.to_string(),
            format!(
                "{}: corrupt: 5 bytes is shorter than the 8-byte checksum trailer",
                path.display()
            )
        );
    }

    #[test]
    fn stale_tmp_is_ignored_and_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("metadata.json");
        block_on(durable_replace(&path, b"old".to_vec())).unwrap();
        // A crash between creating X.tmp and the rename leaves garbage there.
        std::fs::write(
            tmp_path(&path),
            b"garbage from a crashed write that is longer",
        )
        .unwrap();
        block_on(async {
            assert_eq!(read_verified(&path).await.unwrap(), Some(b"old".to_vec()));
            durable_replace(&path, b"new".to_vec()).await.unwrap();
            assert_eq!(read_verified(&path).await.unwrap(), Some(b"new".to_vec()));
        });
        assert!(!tmp_path(&path).exists());
    }

    #[test]
    fn errors_name_path_and_step() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("no-such-dir").join("metadata.json");
        let error = block_on(durable_replace(&path, b"x".to_vec())).unwrap_err();
        assert!(
            matches!(&error, DurableError::Io { op: "create temporary file", path: named, .. }
                if *named == tmp_path(&path)),
            "{error}"
        );
        assert!(
            error
                .to_string()
                .contains("metadata.json.tmp: create temporary file failed")
        );
    }

    #[test]
    fn sync_dir_fsyncs_a_directory_through_compio() {
        let dir = tempfile::tempdir().unwrap();
        block_on(sync_dir(dir.path())).unwrap();
    }
}
