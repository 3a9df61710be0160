//! Consumer offsets of one partition (issue 11 section 1): the file `consumer-offsets` in the
//! partition's directory, a 16-byte header then append-only checksummed records `(kind, name,
//! offset)`; the last record of a consumer wins. Before an append would make the file larger than
//! [`OFFSETS_COMPACT_BYTES_MIN`] or twice its live records, the file is compacted: written whole
//! (one record per consumer) as `consumer-offsets.tmp`, fsynced, renamed over, the directory
//! fsynced. Byte layout and crash cases: `storage/FORMAT.md` (consumer offsets).
//!
//! It must never skip a damaged record: a torn last record (a crash in the middle of an append)
//! is truncated at open, anything else is [`OffsetsError::Corrupt`] naming the file and the byte
//! position. It never keeps writing after a failed fsync (the dirty pages may be gone, FORMAT.md
//! section 1): the store refuses every later write until the partition is opened again. It keeps
//! no file descriptor open between writes, so a partition's offsets cost no descriptor of the
//! open-file budget (`shards::resources`).
//!
//! The whole-file trailer of `durable_replace` does not fit a file that grows by appends, so the
//! compaction writes `X.tmp` itself with the same steps (and the same `X.tmp` name).

use std::cell::RefCell;
use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::time::Instant;

use compio::BufResult;
use compio::fs::OpenOptions;
use compio::io::AsyncWriteAtExt;
use futures_util::lock::Mutex;
use twox_hash::XxHash3_64;

use crate::durable::{read_exact_at, sync_dir, tmp_path};
use crate::limits::{
    CONSUMER_NAME_LEN_MAX, CONSUMERS_PER_PARTITION_MAX, OFFSET_RECORD_SIZE_MAX,
    OFFSETS_COMPACT_BYTES_MIN, OFFSETS_FILE_SIZE_MAX,
};
use crate::log::FsyncPolicy;

/// Name of the offsets file in a partition's directory.
pub const CONSUMER_OFFSETS_FILE_NAME: &str = "consumer-offsets";
/// First 8 bytes of an offsets file.
pub const OFFSETS_MAGIC: [u8; 8] = *b"SLOFFSET";
/// Format version in the header; open refuses any other.
pub const OFFSETS_VERSION: u32 = 1;
/// Bytes of the file header: magic (8), version u32 LE, reserved u32 (zero).
pub const OFFSETS_FILE_HEADER_SIZE: usize = 16;
/// Bytes of a record before its name: checksum u64, size u32, kind u8, reserved u8, name length
/// u16, offset u64 (all little-endian).
pub const OFFSET_RECORD_HEADER_SIZE: usize = 24;

/// Whose offset a record holds: the consumer kind number (opaque here; `bus::ConsumerKind` on the
/// wire) and the consumer's or group's name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ConsumerKey {
    pub kind: u8,
    pub name: String,
}

/// One valid record of an offsets file and the byte position where it starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetRecord {
    pub position: u64,
    pub key: ConsumerKey,
    pub offset: u64,
}

/// What [`decode_offsets`] found in a whole file: its valid records in file order, where the
/// valid prefix ends, and the bytes of a torn last record after it (0 when none).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DecodedOffsets {
    pub records: Vec<OffsetRecord>,
    pub valid_size_bytes: u64,
    pub torn_tail_bytes: u64,
}

impl DecodedOffsets {
    /// The offset of each consumer: its last record wins.
    pub fn latest(&self) -> BTreeMap<ConsumerKey, u64> {
        self.records
            .iter()
            .map(|record| (record.key.clone(), record.offset))
            .collect()
    }
}

/// Damage a torn append cannot explain: the byte position where it starts and what is wrong.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffsetsDefect {
    pub position: u64,
    pub reason: String,
}

/// Why an offsets operation failed; every variant but `InvalidName` names the file.
#[derive(Debug, thiserror::Error)]
pub enum OffsetsError {
    /// An I/O step failed; `op` names it. A store refused this way changed nothing, unless the
    /// store is now failed (see `Failed`).
    #[error("{path}: {op} failed: {source}")]
    Io {
        path: PathBuf,
        op: &'static str,
        source: io::Error,
    },
    /// The file holds damage a torn append cannot explain (never skipped). The operator decides:
    /// restore the file, or move it aside to forget this partition's stored offsets.
    #[error(
        "{path} at byte {position}: corrupt consumer offsets file: {reason}; offsets are never \
         guessed: restore the file from a copy, or move it aside to forget this partition's \
         stored offsets"
    )]
    Corrupt {
        path: PathBuf,
        position: u64,
        reason: String,
    },
    /// A new consumer's offset, but the partition already keeps
    /// [`CONSUMERS_PER_PARTITION_MAX`]; nothing was stored.
    #[error(
        "{path}: the partition already keeps the offsets of {CONSUMERS_PER_PARTITION_MAX} \
         consumers, the most it keeps; the offset of the new consumer {name:?} was not stored"
    )]
    TooManyConsumers { path: PathBuf, name: String },
    /// The consumer name is empty or longer than [`CONSUMER_NAME_LEN_MAX`] bytes.
    #[error("consumer name must be 1 to {CONSUMER_NAME_LEN_MAX} bytes, got {name_len}")]
    InvalidName { name_len: usize },
    /// An earlier write or fsync failed in a way that may have lost written bytes; nothing more
    /// is written until the partition's offsets are opened again (a restart re-reads the file).
    #[error(
        "{path}: an earlier write failed ({reason}); no more offsets are stored in this \
         partition until the server restarts and re-reads the file"
    )]
    Failed { path: PathBuf, reason: String },
}

impl OffsetsError {
    /// True for an I/O step refused with `ENOSPC`, `EDQUOT` or `EFBIG`: nothing was stored,
    /// and a retry once space is freed can succeed.
    pub fn is_storage_full(&self) -> bool {
        matches!(self, OffsetsError::Io { source, .. } if crate::space::is_storage_full(source))
    }
}

fn io_error(path: &Path, op: &'static str) -> impl FnOnce(io::Error) -> OffsetsError {
    let path = path.to_path_buf();
    move |source| OffsetsError::Io { path, op, source }
}

/// The 16-byte file header.
pub fn encode_header() -> [u8; OFFSETS_FILE_HEADER_SIZE] {
    let mut header = [0u8; OFFSETS_FILE_HEADER_SIZE];
    header[..8].copy_from_slice(&OFFSETS_MAGIC);
    header[8..12].copy_from_slice(&OFFSETS_VERSION.to_le_bytes());
    header
}

/// One record: `OFFSET_RECORD_HEADER_SIZE + name length` bytes, the checksum (XXH3-64 of bytes
/// 8.. of the record) first.
///
/// # Panics
/// If the name is empty or longer than [`CONSUMER_NAME_LEN_MAX`] (callers validate it first).
pub fn encode_record(key: &ConsumerKey, offset: u64) -> Vec<u8> {
    let name = key.name.as_bytes();
    assert!(
        !name.is_empty() && name.len() <= CONSUMER_NAME_LEN_MAX,
        "consumer names are validated before encoding"
    );
    let size = OFFSET_RECORD_HEADER_SIZE + name.len();
    let mut record = Vec::with_capacity(size);
    record.extend_from_slice(&[0u8; 8]);
    record.extend_from_slice(&(size as u32).to_le_bytes());
    record.push(key.kind);
    record.push(0);
    record.extend_from_slice(&(name.len() as u16).to_le_bytes());
    record.extend_from_slice(&offset.to_le_bytes());
    record.extend_from_slice(name);
    let checksum = XxHash3_64::oneshot(&record[8..]);
    record[..8].copy_from_slice(&checksum.to_le_bytes());
    record
}

fn u16_at(bytes: &[u8], position: usize) -> u16 {
    u16::from_le_bytes([bytes[position], bytes[position + 1]])
}

fn u32_at(bytes: &[u8], position: usize) -> u32 {
    let mut word = [0u8; 4];
    word.copy_from_slice(&bytes[position..position + 4]);
    u32::from_le_bytes(word)
}

fn u64_at(bytes: &[u8], position: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[position..position + 8]);
    u64::from_le_bytes(word)
}

/// Checks the 16-byte header at the start of `bytes`.
fn check_header(bytes: &[u8]) -> Result<(), OffsetsDefect> {
    let defect = |position: u64, reason: String| OffsetsDefect { position, reason };
    if bytes.len() < OFFSETS_FILE_HEADER_SIZE {
        // The file is created whole by a replace, so a short header is no torn append.
        return Err(defect(
            0,
            format!(
                "the file is {} bytes, shorter than its {OFFSETS_FILE_HEADER_SIZE}-byte header",
                bytes.len()
            ),
        ));
    }
    if bytes[..8] != OFFSETS_MAGIC {
        return Err(defect(0, format!("bad magic {:02x?}", &bytes[..8])));
    }
    let version = u32_at(bytes, 8);
    if version != OFFSETS_VERSION {
        return Err(defect(
            8,
            format!("version {version}, this server reads version {OFFSETS_VERSION}"),
        ));
    }
    let reserved = u32_at(bytes, 12);
    if reserved != 0 {
        return Err(defect(
            12,
            format!("reserved header bytes are {reserved:#x}, not zero"),
        ));
    }
    Ok(())
}

/// Decodes a whole offsets file (header and records), telling a torn last record from damage.
///
/// A torn tail is what one interrupted append leaves (appends are serialized, so only the last
/// record can be incomplete): fewer bytes than a record header, a record whose consistent size
/// fields extend past the end, at most [`OFFSET_RECORD_SIZE_MAX`] zero bytes (an extension the
/// data never reached), or a bad checksum on the record that ends exactly at the end of the
/// file. Size fields that disagree with each other in non-zero bytes are damage wherever they
/// are.
///
/// # Errors
/// A bad header; a record with a bad checksum followed by more bytes; impossible size fields
/// (unless all that follows is zeros, within one record's size); a valid record with a reserved byte set or a
/// name that is not UTF-8; more than [`CONSUMERS_PER_PARTITION_MAX`] consumers. Each names the
/// byte position where the damage starts.
pub fn decode_offsets(bytes: &[u8]) -> Result<DecodedOffsets, OffsetsDefect> {
    check_header(bytes)?;
    let mut records = Vec::new();
    let mut consumers: BTreeSet<ConsumerKey> = BTreeSet::new();
    let mut position = OFFSETS_FILE_HEADER_SIZE;
    let torn = |position: usize, records: Vec<OffsetRecord>| DecodedOffsets {
        records,
        valid_size_bytes: position as u64,
        torn_tail_bytes: (bytes.len() - position) as u64,
    };
    // Each pass consumes one record of at least OFFSET_RECORD_HEADER_SIZE bytes, or stops.
    while position < bytes.len() {
        let remaining = bytes.len() - position;
        if remaining < OFFSET_RECORD_HEADER_SIZE {
            return Ok(torn(position, records));
        }
        let size = u32_at(bytes, position + 8) as usize;
        let name_len = usize::from(u16_at(bytes, position + 14));
        let sizes_possible = (1..=CONSUMER_NAME_LEN_MAX).contains(&name_len)
            && size == OFFSET_RECORD_HEADER_SIZE + name_len;
        if !sizes_possible {
            // An interrupted append leaves a short file, or a zero-filled extension; written
            // header bytes whose fields disagree are damage (adversarial review: a flipped
            // name_len in the middle of a small file was cut as torn, losing later records).
            if remaining <= OFFSET_RECORD_SIZE_MAX && bytes[position..].iter().all(|&b| b == 0) {
                return Ok(torn(position, records));
            }
            return Err(OffsetsDefect {
                position: position as u64,
                reason: format!(
                    "record size {size} with name length {name_len} is impossible, and \
                     {remaining} bytes follow that are not a zero-filled torn append"
                ),
            });
        }
        if size > remaining {
            return Ok(torn(position, records));
        }
        let record = &bytes[position..position + size];
        let checksum = u64_at(record, 0);
        if XxHash3_64::oneshot(&record[8..]) != checksum {
            if size == remaining {
                return Ok(torn(position, records));
            }
            return Err(OffsetsDefect {
                position: position as u64,
                reason: format!(
                    "record checksum mismatch, and {} bytes of later records follow",
                    remaining - size
                ),
            });
        }
        if record[13] != 0 {
            return Err(OffsetsDefect {
                position: position as u64 + 13,
                reason: format!("reserved record byte is {:#x}, not zero", record[13]),
            });
        }
        let Ok(name) = std::str::from_utf8(&record[OFFSET_RECORD_HEADER_SIZE..]) else {
            return Err(OffsetsDefect {
                position: (position + OFFSET_RECORD_HEADER_SIZE) as u64,
                reason: "consumer name is not UTF-8".to_owned(),
            });
        };
        let key = ConsumerKey {
            kind: record[12],
            name: name.to_owned(),
        };
        if consumers.insert(key.clone()) && consumers.len() > CONSUMERS_PER_PARTITION_MAX {
            return Err(OffsetsDefect {
                position: position as u64,
                reason: format!(
                    "more than {CONSUMERS_PER_PARTITION_MAX} consumers, more than this version \
                     ever stores"
                ),
            });
        }
        records.push(OffsetRecord {
            position: position as u64,
            key,
            offset: u64_at(record, 16),
        });
        position += size;
    }
    Ok(DecodedOffsets {
        records,
        valid_size_bytes: position as u64,
        torn_tail_bytes: 0,
    })
}

/// What [`ConsumerOffsets::open`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct OffsetsRecovery {
    /// Consumers with a stored offset.
    pub consumer_count: usize,
    /// Bytes of a torn last record cut from the file (0 when none).
    pub truncated_bytes: u64,
}

#[derive(Debug)]
struct State {
    offsets: BTreeMap<ConsumerKey, u64>,
    /// Bytes of the file; `None` until the first store creates it.
    file_size_bytes: Option<u64>,
    /// Bytes one record per consumer takes: what the file shrinks to when compacted (less the
    /// header).
    live_bytes: u64,
    /// Under `Interval` or `Never`: bytes were written since the last fsync.
    dirty: bool,
    last_sync_at: Instant,
    /// Why the store stopped writing (a failed fsync, or a failed write it could not undo).
    failure: Option<String>,
}

impl State {
    /// Records `key`'s stored `offset` in memory, counting a new consumer's record in the live
    /// bytes.
    fn remember(&mut self, key: &ConsumerKey, offset: u64) {
        if self.offsets.insert(key.clone(), offset).is_none() {
            self.live_bytes += record_size(key);
        }
    }
}

/// The consumer offsets of one partition, in memory and in its `consumer-offsets` file; used on
/// the partition's owner shard only (not `Send`: one reactor thread).
#[derive(Debug)]
pub struct ConsumerOffsets {
    path: PathBuf,
    fsync: FsyncPolicy,
    state: RefCell<State>,
    /// Held by a write (store, fsync) from start to end: one write at a time, so only the last
    /// record can ever be torn.
    writer: Mutex<()>,
}

impl ConsumerOffsets {
    /// Opens the offsets of the partition in `dir`: reads and checks `dir/consumer-offsets` (no
    /// file: no offsets yet; it is created by the first store), cuts a torn last record and
    /// fsyncs the cut. Appends are made durable by `fsync`, as the partition's log.
    ///
    /// # Errors
    /// `Corrupt` (file larger than [`OFFSETS_FILE_SIZE_MAX`], or see [`decode_offsets`]) with the
    /// path and byte position; `Io` for a failed read, truncation or fsync.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped open may have cut the torn tail without its fsync (harmless:
    /// the next open cuts it again).
    pub async fn open(
        dir: &Path,
        fsync: FsyncPolicy,
    ) -> Result<(ConsumerOffsets, OffsetsRecovery), OffsetsError> {
        let path = dir.join(CONSUMER_OFFSETS_FILE_NAME);
        let mut state = State {
            offsets: BTreeMap::new(),
            file_size_bytes: None,
            live_bytes: 0,
            dirty: false,
            last_sync_at: Instant::now(),
            failure: None,
        };
        let mut recovery = OffsetsRecovery::default();
        if let Some(bytes) = read_offsets_file(&path).await? {
            let decoded = decode_offsets(&bytes).map_err(|defect| OffsetsError::Corrupt {
                path: path.clone(),
                position: defect.position,
                reason: defect.reason,
            })?;
            if decoded.torn_tail_bytes > 0 {
                truncate_durably(&path, decoded.valid_size_bytes).await?;
            }
            state.offsets = decoded.latest();
            state.live_bytes = state.offsets.keys().map(record_size).sum();
            state.file_size_bytes = Some(decoded.valid_size_bytes);
            recovery = OffsetsRecovery {
                consumer_count: state.offsets.len(),
                truncated_bytes: decoded.torn_tail_bytes,
            };
        }
        let offsets = ConsumerOffsets {
            path,
            fsync,
            state: RefCell::new(state),
            writer: Mutex::new(()),
        };
        Ok((offsets, recovery))
    }

    /// The offsets file (it may not exist yet).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The offset `key` stored last, or `None` if it never stored one here.
    pub fn get(&self, key: &ConsumerKey) -> Option<u64> {
        self.state.borrow().offsets.get(key).copied()
    }

    /// Every consumer with a stored offset, ordered by kind then name.
    pub fn entries(&self) -> Vec<(ConsumerKey, u64)> {
        let state = self.state.borrow();
        state
            .offsets
            .iter()
            .map(|(key, offset)| (key.clone(), *offset))
            .collect()
    }

    /// Stores `offset` as `key`'s offset: appends one record (compacting the file first when it
    /// grew past its bound, creating it on the first store), durable when this returns under
    /// `FsyncPolicy::Always` (one fsync per store), within the interval under `Interval` (through
    /// [`ConsumerOffsets::on_tick`]), in the page cache only under `Never`. A compaction or the
    /// creation is always fsynced. `get` returns the new offset once this succeeded.
    ///
    /// # Errors
    /// `InvalidName`; `TooManyConsumers` for a new consumer past
    /// [`CONSUMERS_PER_PARTITION_MAX`]; `Io` naming the step (nothing stored; a write refused
    /// for space is undone, see [`OffsetsError::is_storage_full`]); `Failed` once an fsync (or
    /// the undo of a failed write) failed, for this and every later store.
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped store may or may not be in the file (and is not in memory
    /// until the partition is opened again).
    pub async fn store(&self, key: &ConsumerKey, offset: u64) -> Result<(), OffsetsError> {
        let name_len = key.name.len();
        if name_len == 0 || name_len > CONSUMER_NAME_LEN_MAX {
            return Err(OffsetsError::InvalidName { name_len });
        }
        let _writer = self.writer.lock().await;
        let plan = self.plan_store(key)?;
        let record = encode_record(key, offset);
        let record_len = record.len() as u64;
        match plan {
            Plan::Append { position } => {
                self.append(record, position).await?;
                let mut state = self.state.borrow_mut();
                state.file_size_bytes = Some(position + record_len);
                state.remember(key, offset);
                if self.fsync != FsyncPolicy::Always {
                    state.dirty = true;
                }
            }
            Plan::Rewrite => {
                let mut offsets = self.state.borrow().offsets.clone();
                offsets.insert(key.clone(), offset);
                let size_bytes = self.rewrite(&offsets).await?;
                let mut state = self.state.borrow_mut();
                state.file_size_bytes = Some(size_bytes);
                state.remember(key, offset);
                state.dirty = false;
                state.last_sync_at = Instant::now();
            }
        }
        Ok(())
    }

    /// Under `Interval`: fsyncs the file when something was written and the interval has passed
    /// since the last fsync. Nothing under the other policies. Call it on the shard tick.
    ///
    /// # Errors
    /// As [`ConsumerOffsets::sync`].
    ///
    /// # Cancel safety
    /// As [`ConsumerOffsets::sync`].
    pub async fn on_tick(&self) -> Result<(), OffsetsError> {
        let FsyncPolicy::Interval(interval) = self.fsync else {
            return Ok(());
        };
        let due = {
            let state = self.state.borrow();
            state.dirty && state.last_sync_at.elapsed() >= interval
        };
        if due { self.sync().await } else { Ok(()) }
    }

    /// Fsyncs the file if appends under `Interval` or `Never` are not yet durable (the tick,
    /// and the final fsync at shutdown, as the partition log's `close`).
    ///
    /// # Errors
    /// `Failed` if the store failed before; `Io` naming the step, after which the store is
    /// failed (an fsync error may have dropped the pages).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped sync leaves the appends dirty (the next sync retries).
    pub async fn sync(&self) -> Result<(), OffsetsError> {
        let _writer = self.writer.lock().await;
        self.check_not_failed()?;
        if !self.state.borrow().dirty {
            return Ok(());
        }
        let result = fsync_file(&self.path).await;
        let mut state = self.state.borrow_mut();
        match result {
            Ok(()) => {
                state.dirty = false;
                state.last_sync_at = Instant::now();
                Ok(())
            }
            Err(error) => {
                state.failure = Some(error.to_string());
                Err(error)
            }
        }
    }

    fn check_not_failed(&self) -> Result<(), OffsetsError> {
        match &self.state.borrow().failure {
            Some(reason) => Err(OffsetsError::Failed {
                path: self.path.clone(),
                reason: reason.clone(),
            }),
            None => Ok(()),
        }
    }

    /// How the next store of `key` is written, after the checks that need no I/O.
    fn plan_store(&self, key: &ConsumerKey) -> Result<Plan, OffsetsError> {
        self.check_not_failed()?;
        let state = self.state.borrow();
        let is_new = !state.offsets.contains_key(key);
        if is_new && state.offsets.len() >= CONSUMERS_PER_PARTITION_MAX {
            return Err(OffsetsError::TooManyConsumers {
                path: self.path.clone(),
                name: key.name.clone(),
            });
        }
        let Some(file_size_bytes) = state.file_size_bytes else {
            return Ok(Plan::Rewrite);
        };
        let live_bytes = state.live_bytes + if is_new { record_size(key) } else { 0 };
        let bound = OFFSETS_COMPACT_BYTES_MIN.max(2 * live_bytes);
        if file_size_bytes + record_size(key) > bound {
            Ok(Plan::Rewrite)
        } else {
            Ok(Plan::Append {
                position: file_size_bytes,
            })
        }
    }

    /// Writes `record` at `position` (the end of the valid records) and, under `Always`, fsyncs.
    /// A failed write is cut back off so no partial record stays before the next one.
    async fn append(&self, record: Vec<u8>, position: u64) -> Result<(), OffsetsError> {
        let path = &self.path;
        let file = OpenOptions::new()
            .write(true)
            .open(path)
            .await
            .map_err(io_error(path, "open for append"))?;
        let BufResult(written, _) = (&file).write_all_at(record, position).await;
        if let Err(source) = written {
            if let Err(undo) = file.set_len(position).await {
                self.state.borrow_mut().failure = Some(format!(
                    "a failed append ({source}) could not be cut off: {undo}"
                ));
            }
            let _ = file.close().await;
            return Err(OffsetsError::Io {
                path: path.clone(),
                op: "append a record",
                source,
            });
        }
        if self.fsync == FsyncPolicy::Always
            && let Err(source) = file.sync_data().await
        {
            let error = OffsetsError::Io {
                path: path.clone(),
                op: "fsync after append",
                source,
            };
            self.state.borrow_mut().failure = Some(error.to_string());
            let _ = file.close().await;
            return Err(error);
        }
        // A close error after the data is written (and fsynced when the policy asks) loses nothing.
        let _ = file.close().await;
        Ok(())
    }

    /// Writes the whole file anew with one record per consumer of `offsets` (`X.tmp`, fsync,
    /// rename over `X`, fsync the directory) and returns its size. Before the rename a failure
    /// leaves the old file; after it, the store is failed (the rename may not be durable).
    async fn rewrite(&self, offsets: &BTreeMap<ConsumerKey, u64>) -> Result<u64, OffsetsError> {
        let mut bytes = encode_header().to_vec();
        for (key, offset) in offsets {
            bytes.extend_from_slice(&encode_record(key, *offset));
        }
        let size_bytes = bytes.len() as u64;
        let path = &self.path;
        let tmp = tmp_path(path);
        let file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .await
            .map_err(io_error(&tmp, "create temporary file"))?;
        let BufResult(written, _) = (&file).write_all_at(bytes, 0).await;
        if let Err(source) = written {
            let _ = file.close().await;
            return Err(io_error(&tmp, "write temporary file")(source));
        }
        if let Err(source) = file.sync_all().await {
            let _ = file.close().await;
            return Err(io_error(&tmp, "fsync temporary file")(source));
        }
        file.close()
            .await
            .map_err(io_error(&tmp, "close temporary file"))?;
        compio::fs::rename(&tmp, path)
            .await
            .map_err(io_error(path, "rename of the .tmp file over it"))?;
        let dir = path.parent().unwrap_or(Path::new("."));
        if let Err(source) = sync_dir(dir).await {
            let error = io_error(dir, "fsync directory after rename")(source);
            self.state.borrow_mut().failure = Some(error.to_string());
            return Err(error);
        }
        Ok(size_bytes)
    }
}

/// How one store writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Plan {
    /// Append the record at `position`, the end of the file.
    Append { position: u64 },
    /// Write the file anew (its first store, or a compaction).
    Rewrite,
}

/// Bytes of `key`'s record.
fn record_size(key: &ConsumerKey) -> u64 {
    (OFFSET_RECORD_HEADER_SIZE + key.name.len()) as u64
}

/// The whole offsets file at `path`, or `None` when there is none.
async fn read_offsets_file(path: &Path) -> Result<Option<Vec<u8>>, OffsetsError> {
    let file = match OpenOptions::new().read(true).open(path).await {
        Ok(file) => file,
        Err(error) if error.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(io_error(path, "open")(error)),
    };
    let size_bytes = file.metadata().await.map_err(io_error(path, "stat"))?.len();
    if size_bytes > OFFSETS_FILE_SIZE_MAX {
        let _ = file.close().await;
        return Err(OffsetsError::Corrupt {
            path: path.to_path_buf(),
            position: OFFSETS_FILE_SIZE_MAX,
            reason: format!(
                "the file is {size_bytes} bytes, larger than any this version writes \
                 ({OFFSETS_FILE_SIZE_MAX})"
            ),
        });
    }
    let bytes = read_exact_at(&file, 0, size_bytes as usize)
        .await
        .map_err(io_error(path, "read"))?;
    // A close error on a read-only descriptor cannot lose data.
    let _ = file.close().await;
    Ok(Some(bytes))
}

/// Cuts `path` to `size_bytes` and fsyncs it.
async fn truncate_durably(path: &Path, size_bytes: u64) -> Result<(), OffsetsError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .await
        .map_err(io_error(path, "open to cut a torn record"))?;
    file.set_len(size_bytes)
        .await
        .map_err(io_error(path, "cut a torn record"))?;
    file.sync_all()
        .await
        .map_err(io_error(path, "fsync after cutting a torn record"))?;
    file.close().await.map_err(io_error(path, "close"))
}

/// Fsyncs the data of `path` through a new descriptor (fsync(2) flushes the file, whichever
/// descriptor wrote it).
async fn fsync_file(path: &Path) -> Result<(), OffsetsError> {
    let file = OpenOptions::new()
        .write(true)
        .open(path)
        .await
        .map_err(io_error(path, "open to fsync"))?;
    let synced = file.sync_data().await.map_err(io_error(path, "fsync"));
    let _ = file.close().await;
    synced
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block_on<T>(future: impl std::future::Future<Output = T>) -> T {
        compio::runtime::Runtime::new().unwrap().block_on(future)
    }

    fn key(kind: u8, name: &str) -> ConsumerKey {
        ConsumerKey {
            kind,
            name: name.to_owned(),
        }
    }

    fn open(dir: &Path) -> Result<(ConsumerOffsets, OffsetsRecovery), OffsetsError> {
        block_on(ConsumerOffsets::open(dir, FsyncPolicy::Always))
    }

    #[test]
    fn issue11_1_offsets_round_trip_through_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, recovery) = open(dir.path()).unwrap();
        assert_eq!(recovery, OffsetsRecovery::default());
        assert!(!offsets.path().exists(), "no file before the first store");
        block_on(async {
            offsets.store(&key(0, "billing"), 10).await.unwrap();
            offsets.store(&key(1, "billing"), 3).await.unwrap();
            offsets.store(&key(0, "billing"), 42).await.unwrap();
        });
        assert_eq!(offsets.get(&key(0, "billing")), Some(42));
        assert_eq!(offsets.get(&key(0, "audit")), None);
        drop(offsets);
        let (reopened, recovery) = open(dir.path()).unwrap();
        assert_eq!(recovery.consumer_count, 2);
        assert_eq!(recovery.truncated_bytes, 0);
        assert_eq!(
            reopened.entries(),
            vec![(key(0, "billing"), 42), (key(1, "billing"), 3)]
        );
        let bytes = std::fs::read(reopened.path()).unwrap();
        let decoded = decode_offsets(&bytes).unwrap();
        assert_eq!(
            decoded.records.len(),
            3,
            "two appends after the creating write"
        );
        assert_eq!(decoded.records[0].position, OFFSETS_FILE_HEADER_SIZE as u64);
    }

    #[test]
    fn issue11_1_a_torn_last_record_is_cut_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, _) = open(dir.path()).unwrap();
        block_on(async {
            offsets.store(&key(0, "a"), 1).await.unwrap();
            offsets.store(&key(0, "a"), 2).await.unwrap();
        });
        let path = offsets.path().to_path_buf();
        drop(offsets);
        let whole = std::fs::read(&path).unwrap();
        let last_len = OFFSET_RECORD_HEADER_SIZE + 1;
        for kept in 1..last_len {
            let cut = whole.len() - last_len + kept;
            std::fs::write(&path, &whole[..cut]).unwrap();
            let (reopened, recovery) = open(dir.path()).unwrap();
            assert_eq!(recovery.truncated_bytes, kept as u64, "kept {kept}");
            assert_eq!(reopened.get(&key(0, "a")), Some(1));
            assert_eq!(
                std::fs::metadata(&path).unwrap().len(),
                (whole.len() - last_len) as u64
            );
        }
        // The whole last record with a flipped bit in its name: torn (it ends the file).
        let mut flipped = whole.clone();
        *flipped.last_mut().unwrap() ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        let (reopened, recovery) = open(dir.path()).unwrap();
        assert_eq!(recovery.truncated_bytes, last_len as u64);
        assert_eq!(reopened.get(&key(0, "a")), Some(1));
        // And appends go on after the cut.
        block_on(reopened.store(&key(0, "a"), 7)).unwrap();
        drop(reopened);
        assert_eq!(open(dir.path()).unwrap().0.get(&key(0, "a")), Some(7));
    }

    /// Adversarial review: a flipped byte in the size fields of a record in the middle of a small
    /// file (less than one maximal record after it) is damage, not a torn tail: cutting it lost
    /// every later, acknowledged record. A zero-filled tail is still torn.
    #[test]
    fn issue11_1_impossible_size_fields_mid_file_are_damage_and_a_zero_tail_is_torn() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, _) = open(dir.path()).unwrap();
        block_on(async {
            offsets.store(&key(0, "a"), 1).await.unwrap();
            offsets.store(&key(0, "b"), 2).await.unwrap();
            offsets.store(&key(0, "c"), 3).await.unwrap();
        });
        let path = offsets.path().to_path_buf();
        drop(offsets);
        let intact = std::fs::read(&path).unwrap();
        let second = OFFSETS_FILE_HEADER_SIZE + OFFSET_RECORD_HEADER_SIZE + 1;
        for field_byte in [8, 9, 14, 15] {
            let mut bytes = intact.clone();
            bytes[second + field_byte] ^= 0x07;
            std::fs::write(&path, &bytes).unwrap();
            match open(dir.path()).unwrap_err() {
                OffsetsError::Corrupt { position, .. } => {
                    assert_eq!(position, second as u64, "byte {field_byte}");
                }
                other => panic!("byte {field_byte}: expected Corrupt, got {other:?}"),
            }
            assert_eq!(std::fs::read(&path).unwrap(), bytes, "never modified");
        }
        let mut zero_tail = intact.clone();
        zero_tail.extend_from_slice(&[0; 40]);
        std::fs::write(&path, &zero_tail).unwrap();
        let (offsets, _) = open(dir.path()).unwrap();
        drop(offsets);
        assert_eq!(
            std::fs::read(&path).unwrap(),
            intact,
            "the zero tail is cut"
        );
    }

    #[test]
    fn issue11_1_damage_before_the_last_record_is_reported_with_path_and_position() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, _) = open(dir.path()).unwrap();
        block_on(async {
            offsets.store(&key(0, "a"), 1).await.unwrap();
            offsets.store(&key(0, "a"), 2).await.unwrap();
            offsets.store(&key(0, "a"), 3).await.unwrap();
        });
        let path = offsets.path().to_path_buf();
        drop(offsets);
        let mut bytes = std::fs::read(&path).unwrap();
        let second = OFFSETS_FILE_HEADER_SIZE + OFFSET_RECORD_HEADER_SIZE + 1;
        bytes[second + 16] ^= 0xff; // the offset of the second record
        std::fs::write(&path, &bytes).unwrap();
        let error = open(dir.path()).unwrap_err();
        match &error {
            OffsetsError::Corrupt {
                path: reported,
                position,
                ..
            } => {
                assert_eq!(reported, &path);
                assert_eq!(*position, second as u64);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        let message = error.to_string();
        assert!(message.contains(&path.display().to_string()), "{message}");
        assert!(message.contains(&format!("at byte {second}")), "{message}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "never modified");

        // A bad header is damage too, never an empty file.
        bytes[0] = b'X';
        std::fs::write(&path, &bytes).unwrap();
        assert!(matches!(
            open(dir.path()).unwrap_err(),
            OffsetsError::Corrupt { position: 0, .. }
        ));
    }

    #[test]
    fn issue11_1_the_file_is_compacted_past_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, _) = block_on(ConsumerOffsets::open(dir.path(), FsyncPolicy::Never)).unwrap();
        let record_len = (OFFSET_RECORD_HEADER_SIZE + "reader".len()) as u64;
        let store_count = 3 * OFFSETS_COMPACT_BYTES_MIN / record_len;
        block_on(async {
            offsets.store(&key(1, "group"), 5).await.unwrap();
            for offset in 0..store_count {
                offsets.store(&key(0, "reader"), offset).await.unwrap();
                let size = std::fs::metadata(offsets.path()).unwrap().len();
                assert!(
                    size <= OFFSETS_COMPACT_BYTES_MIN,
                    "file grew to {size} at store {offset}"
                );
            }
        });
        let path = offsets.path().to_path_buf();
        drop(offsets);
        assert!(!tmp_path(&path).exists(), "the .tmp was renamed over");
        let (reopened, _) = open(dir.path()).unwrap();
        assert_eq!(
            reopened.entries(),
            vec![(key(0, "reader"), store_count - 1), (key(1, "group"), 5)]
        );
    }

    #[test]
    fn issue11_1_a_partition_keeps_a_bounded_number_of_consumers() {
        let dir = tempfile::tempdir().unwrap();
        let (offsets, _) = block_on(ConsumerOffsets::open(dir.path(), FsyncPolicy::Never)).unwrap();
        block_on(async {
            for index in 0..CONSUMERS_PER_PARTITION_MAX {
                offsets
                    .store(&key(0, &format!("c{index}")), 1)
                    .await
                    .unwrap();
            }
            let error = offsets.store(&key(0, "one-more"), 1).await.unwrap_err();
            assert!(
                matches!(&error, OffsetsError::TooManyConsumers { name, .. } if name == "one-more"),
                "{error:?}"
            );
            // A known consumer still stores.
            offsets.store(&key(0, "c7"), 9).await.unwrap();
            let long = "x".repeat(CONSUMER_NAME_LEN_MAX + 1);
            assert!(matches!(
                offsets.store(&key(0, &long), 1).await.unwrap_err(),
                OffsetsError::InvalidName { name_len } if name_len == CONSUMER_NAME_LEN_MAX + 1
            ));
        });
        drop(offsets);
        let (reopened, recovery) = open(dir.path()).unwrap();
        assert_eq!(recovery.consumer_count, CONSUMERS_PER_PARTITION_MAX);
        assert_eq!(reopened.get(&key(0, "c7")), Some(9));
        assert_eq!(reopened.get(&key(0, "one-more")), None);
    }

    #[test]
    fn issue11_1_interval_appends_are_fsynced_by_the_tick() {
        let dir = tempfile::tempdir().unwrap();
        let policy = FsyncPolicy::Interval(std::time::Duration::from_millis(1));
        let (offsets, _) = block_on(ConsumerOffsets::open(dir.path(), policy)).unwrap();
        block_on(async {
            offsets.store(&key(0, "a"), 1).await.unwrap();
            offsets.store(&key(0, "a"), 2).await.unwrap();
            assert!(offsets.state.borrow().dirty);
            offsets.sync().await.unwrap();
            assert!(!offsets.state.borrow().dirty);
        });
    }
}
