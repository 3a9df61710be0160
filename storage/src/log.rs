//! A partition's append-only log: segment files `{base_offset:020}.log` plus offset index, append
//! through io_uring, reads by offset, torn tail truncated on open, fsync policy with group commit.

use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FsyncPolicy {
    /// Acknowledge after fsync; concurrent appends share one fsync (group commit). Default.
    Always,
    /// Acknowledge after the write; fsync at most every interval.
    Interval(Duration),
    /// Page cache only.
    Never,
}

impl std::str::FromStr for FsyncPolicy {
    type Err = String;
    /// `always`, `never`, `interval=MS` (MS >= 1).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        todo!("{s}")
    }
}

#[derive(Debug, Clone)]
pub struct LogConfig {
    pub fsync: FsyncPolicy,
    pub segment_size_max: u64,
}

/// What recovery found on open.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    pub segment_count: u32,
    pub entry_count: u64,
    pub next_offset: u64,
    /// Bytes cut from a torn tail of the last segment (0 if clean).
    pub truncated_bytes: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: std::io::Error,
    },
    #[error("{path}: corrupt entry at byte {position}: {reason}")]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    #[error("invalid entry: {0}")]
    InvalidEntry(String),
    #[error("log is closed")]
    Closed,
}

/// One partition's log, owned by one shard (!Send). Methods take `&self`; concurrent appends from
/// tasks on the owner shard are group-committed.
#[derive(Debug)]
pub struct PartitionLog {}

impl PartitionLog {
    /// Opens or creates the log in `dir`, scanning the last segment and truncating a torn tail.
    ///
    /// # Errors
    /// I/O errors and interior corruption (naming file and position).
    pub async fn open(
        dir: &Path,
        config: LogConfig,
    ) -> Result<(PartitionLog, RecoveryReport), LogError> {
        todo!("{dir:?}{config:?}")
    }

    /// Next offset to be assigned.
    pub fn next_offset(&self) -> u64 {
        todo!()
    }

    /// Appends one entry (`EntryHeader` + payload, base_offset is overwritten). Returns the base
    /// offset once the entry is durable per the fsync policy.
    ///
    /// # Cancel safety
    /// The offset is reserved and the write proceeds even if the future is dropped.
    pub async fn append(&self, entry: Vec<u8>) -> Result<u64, LogError> {
        todo!("{}", entry.len())
    }

    /// Whole entries starting with the one containing `offset`, at most `max_count` messages
    /// (at least one entry if any) and about `max_bytes`. Only acknowledged entries are visible.
    pub async fn read(
        &self,
        offset: u64,
        max_count: u32,
        max_bytes: usize,
    ) -> Result<Vec<u8>, LogError> {
        todo!("{offset}{max_count}{max_bytes}")
    }

    /// Fsyncs everything written so far.
    pub async fn sync(&self) -> Result<(), LogError> {
        todo!()
    }

    /// Drains queued appends, fsyncs, stops the writer (graceful shutdown). Errors are logged.
    pub async fn close(&self) {
        todo!()
    }

    /// Called on the shard tick; fsyncs under `Interval` when due.
    pub async fn on_tick(&self) -> Result<(), LogError> {
        todo!()
    }
}
