//! Durable storage: partition segment logs (append through `io_uring`, offset index, torn-tail
//! recovery, fsync policies with group commit) and the durable file replace with a verified
//! trailer used for metadata, the superblock, the metadata journal (WAL) and the checkpoint
//! snapshot; and the consumer offsets file of each partition (issue 11 section 1).
//!
//! `storage` never touches sockets and never depends on `bus`. Byte layouts and crash cases:
//! `storage/FORMAT.md`.

pub mod codec;
pub mod durable;
pub mod entry;
pub mod fault;
pub mod journal;
pub mod limits;
pub mod log;
pub mod offsets;
pub mod snapshot;
pub mod space;
pub mod superblock;

pub use durable::{
    DurableError, ReplaceStep, durable_remove, durable_replace, durable_replace_observed,
    read_verified,
};
pub use entry::{
    ENTRY_HEADER_SIZE, EntryHeader, ProducerBatch, build_entry, build_entry_raw,
    check_message_section, check_payload, checksum_covers_timestamp, checksums_message_headers,
    entry_checksum, message_section, payload_checksum, producer_stamp,
};
pub use fault::{FaultInjector, FaultOp};
pub use journal::{
    JOURNAL_HEADER_SIZE, Journal, JournalConfig, JournalError, JournalHeader, JournalRecovery,
    Prepare,
};
pub use log::{
    AppendFuture, FsyncPolicy, LogConfig, LogError, PartitionLog, Quarantine, RecoveryReport,
    VerifiedSpan, VerifiedSpans, WriteMode,
};
pub use offsets::{
    CONSUMER_OFFSETS_FILE_NAME, ConsumerKey, ConsumerOffsets, OffsetsError, OffsetsRecovery,
    decode_offsets,
};
pub use snapshot::{
    SNAPSHOT_FILE_NAME, Snapshot, SnapshotDefect, SnapshotError, read_snapshot, write_snapshot,
};
pub use superblock::{
    CopyDefect, CopyStatus, OpenReport, SUPERBLOCK_FILE_NAME, Superblock, SuperblockError,
    SuperblockState,
};
