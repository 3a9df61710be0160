//! Durable file replace through `io_uring` (compio fs): write `X.tmp`, fsync it, rename over `X`,
//! fsync the directory. The file ends with an XXH3-64 trailer of everything before it.
//!
//! Also the two I/O helpers the log shares with it: fsync of a directory and an exact positional
//! read. Nothing here may leave `X` in any state but the old or the new complete file.

use std::io;
use std::path::{Path, PathBuf};

use compio::BufResult;
use compio::buf::{IntoInner, IoBuf};
use compio::fs::{File, OpenOptions};
use compio::io::{AsyncReadAtExt, AsyncWriteAtExt};
use twox_hash::XxHash3_64;

use crate::limits::DURABLE_FILE_SIZE_MAX;

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

/// Replaces `path` durably with `payload` + 8-byte XXH3-64 trailer.
///
/// Steps, each only after the previous succeeded: create/truncate `X.tmp`, write payload + trailer,
/// fsync `X.tmp`, rename `X.tmp` over `X`, fsync the parent directory.
///
/// # Errors
/// `Io` naming the path and the failed step. After a failure `X` is the old or the new file (the
/// new one only if the rename happened; durable only if the directory fsync succeeded).
///
/// # Cancel safety
/// Not cancel safe: a dropped future may leave `X.tmp` behind (ignored and replaced next time);
/// `X` is always either the old or the new file.
pub async fn durable_replace(path: &Path, payload: Vec<u8>) -> Result<(), DurableError> {
    let tmp = tmp_path(path);
    let checksum = XxHash3_64::oneshot(&payload);
    let mut bytes = payload;
    bytes.extend_from_slice(&checksum.to_le_bytes());

    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .await
        .map_err(io_error(&tmp, "create temporary file"))?;
    let BufResult(result, _) = (&file).write_all_at(bytes, 0).await;
    result.map_err(io_error(&tmp, "write temporary file"))?;
    file.sync_all()
        .await
        .map_err(io_error(&tmp, "fsync temporary file"))?;
    file.close()
        .await
        .map_err(io_error(&tmp, "close temporary file"))?;
    compio::fs::rename(&tmp, path)
        .await
        .map_err(io_error(path, "rename of the .tmp file over it"))?;
    let dir = parent_dir(path);
    sync_dir(dir)
        .await
        .map_err(io_error(dir, "fsync directory after rename"))?;
    Ok(())
}

/// Reads `path` and verifies its trailer; returns the payload without the trailer, or `None` if the
/// file does not exist. A leftover `X.tmp` is never looked at.
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
    let mut bytes = read_exact_at(&file, 0, size_bytes as usize)
        .await
        .map_err(io_error(path, "read"))?;
    // A close error on a read-only descriptor cannot lose data; the bytes are verified below.
    let _ = file.close().await;
    let payload_size = bytes.len() - TRAILER_SIZE;
    let mut trailer = [0u8; TRAILER_SIZE];
    trailer.copy_from_slice(&bytes[payload_size..]);
    let stored = u64::from_le_bytes(trailer);
    let computed = XxHash3_64::oneshot(&bytes[..payload_size]);
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
