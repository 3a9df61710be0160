//! Durable file replace through io_uring (compio fs): write `X.tmp`, fsync it, rename over `X`,
//! fsync the directory. The file ends with an XXH3-64 trailer of everything before it.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum DurableError {
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
}

/// Replaces `path` durably with `payload` + 8-byte XXH3-64 trailer.
///
/// # Cancel safety
/// Not cancel safe: a dropped future may leave `X.tmp` behind (ignored and replaced next time);
/// `X` is always either the old or the new file.
pub async fn durable_replace(path: &Path, payload: Vec<u8>) -> Result<(), DurableError> {
    todo!("{path:?}{}", payload.len())
}

/// Reads `path` and verifies its trailer; returns the payload without the trailer, or `None` if the
/// file does not exist.
///
/// # Errors
/// `Corrupt` (naming the path) when shorter than the trailer or the checksum differs.
pub async fn read_verified(path: &Path) -> Result<Option<Vec<u8>>, DurableError> {
    todo!("{path:?}")
}
