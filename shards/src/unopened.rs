//! Committed partitions whose log failed to open on their owner shard (e.g. a topic created while
//! the filesystem had no inode or byte left for the segment file, or at boot while it still has
//! none, or while the process had no file descriptor left). The partition exists in the
//! metadata; its owner retries the open on each send or poll to it, so it becomes usable once
//! the cause is gone, without a restart. Never opens or touches a log itself.

use std::cell::RefCell;

use ahash::AHashMap;
use bus::{ErrorCode, Namespace};

use crate::frame::ShardReply;

/// Why an open of a partition's log failed, as far as retrying it is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenFailureKind {
    /// Refused for lack of space, quota or file size (`ENOSPC`, `EDQUOT`, `EFBIG`): it succeeds
    /// once space is freed.
    StorageFull,
    /// Refused for lack of file descriptors (`EMFILE`, `ENFILE`): it succeeds once descriptors
    /// are freed.
    DescriptorsExhausted,
    /// Anything else (damage, I/O errors): it needs an operator.
    Other,
}

impl OpenFailureKind {
    /// The kind of `error`, returned by `PartitionLog::open`.
    pub fn of(error: &storage::LogError) -> OpenFailureKind {
        match error {
            storage::LogError::StorageFull { .. } => OpenFailureKind::StorageFull,
            storage::LogError::DescriptorsExhausted { .. } => OpenFailureKind::DescriptorsExhausted,
            storage::LogError::Io { source, .. }
            | storage::LogError::QuarantineFailed { source, .. }
                if storage::space::is_storage_full(source) =>
            {
                OpenFailureKind::StorageFull
            }
            storage::LogError::Io { source, .. }
                if storage::space::is_descriptors_exhausted(source) =>
            {
                OpenFailureKind::DescriptorsExhausted
            }
            _ => OpenFailureKind::Other,
        }
    }

    /// Whether the open succeeds once a resource is freed, without an operator's repair.
    pub fn is_transient(self) -> bool {
        self != OpenFailureKind::Other
    }

    /// The error code of a reply refused by such a failure.
    pub fn code(self) -> ErrorCode {
        match self {
            OpenFailureKind::StorageFull => ErrorCode::StorageFull,
            OpenFailureKind::DescriptorsExhausted => ErrorCode::ResourceExhausted,
            OpenFailureKind::Other => ErrorCode::StorageFailure,
        }
    }

    /// What fixes the cause, for the reply text ("" when unknown).
    fn remedy(self) -> &'static str {
        match self {
            OpenFailureKind::StorageFull => ", here once space is freed",
            OpenFailureKind::DescriptorsExhausted => {
                ", here once file descriptors are freed (the open-file limit was reached)"
            }
            OpenFailureKind::Other => "",
        }
    }
}

/// Why the owner could not open a committed partition's log; sent to shard 0 with the
/// `MetadataApplied` ack and joined into the reply to the metadata change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenFailure {
    /// Whether and when a retry succeeds.
    pub kind: OpenFailureKind,
    /// Shard, partition and the storage error.
    pub message: String,
}

impl OpenFailure {
    /// The failure of shard `shard`'s open of `namespace` with `error`.
    pub fn new(shard: u16, namespace: Namespace, error: &storage::LogError) -> OpenFailure {
        OpenFailure {
            kind: OpenFailureKind::of(error),
            message: format!("shard {shard}: partition {namespace}: {error}"),
        }
    }

    /// The reply to a send or poll of the partition whose retried open failed: `StorageFull`
    /// when space is the cause (retry once space is freed), `ResourceExhausted` when file
    /// descriptors are (retry once some are freed), else `StorageFailure`.
    pub fn reply(&self) -> ShardReply {
        let code = self.kind.code();
        ShardReply::error(
            code,
            format!(
                "the partition is committed but its log cannot be opened: {}; nothing was \
                 appended or read, and each send or poll retries the open (it succeeds once the \
                 cause is fixed{})",
                self.message,
                self.kind.remedy()
            ),
        )
    }
}

/// The reply to the metadata change whose partitions `failures` could not be opened (the change
/// itself is committed): `StorageFull` when every failure is for lack of space,
/// `ResourceExhausted` when every one is for lack of file descriptors, else `StorageFailure`.
pub fn commit_reply(failures: &[OpenFailure]) -> ShardReply {
    let code = match failures.first().map(|failure| failure.kind) {
        Some(kind) if failures.iter().all(|failure| failure.kind == kind) => kind.code(),
        _ => ErrorCode::StorageFailure,
    };
    let messages: Vec<&str> = failures
        .iter()
        .map(|failure| failure.message.as_str())
        .collect();
    ShardReply::error(
        code,
        format!(
            "the change is committed, but {} of its partitions could not be opened: {}; each is \
             opened again on its next send or poll, which answers {code:?} until the cause is \
             fixed (free space for StorageFull, file descriptors for ResourceExhausted), then \
             succeeds",
            failures.len(),
            messages.join("; ")
        ),
    )
}

/// What an attempt to start reopening a partition found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Begin {
    /// The partition is not waiting for a reopen (it is open, or it does not exist).
    NotUnopened,
    /// Another request is opening it now.
    InProgress,
    /// This caller opens it; it must call `UnopenedPartitions::end` when done.
    Started,
}

/// The owned partitions of one shard that are committed but not open, and whether an open of
/// each is in progress. Bounded by the partitions of the metadata (the open-file budget).
#[derive(Debug, Default)]
pub struct UnopenedPartitions {
    opening: RefCell<AHashMap<Namespace, bool>>,
}

impl UnopenedPartitions {
    /// Records that `namespace`'s log failed to open.
    pub fn insert(&self, namespace: Namespace) {
        self.opening.borrow_mut().insert(namespace, false);
    }

    /// Forgets `namespace` (deleted, or opened); whether it was recorded.
    pub fn remove(&self, namespace: Namespace) -> bool {
        self.opening.borrow_mut().remove(&namespace).is_some()
    }

    /// Starts an open of `namespace` unless it is not recorded or already being opened.
    pub fn begin(&self, namespace: Namespace) -> Begin {
        match self.opening.borrow_mut().get_mut(&namespace) {
            None => Begin::NotUnopened,
            Some(true) => Begin::InProgress,
            Some(opening) => {
                *opening = true;
                Begin::Started
            }
        }
    }

    /// Ends an open started by `begin`: `opened` forgets the partition; a failure keeps it for
    /// the next retry. Returns false when the partition was deleted during the open (its log,
    /// if opened, must be closed and not used).
    pub fn end(&self, namespace: Namespace, opened: bool) -> bool {
        let mut opening = self.opening.borrow_mut();
        let Some(in_progress) = opening.get_mut(&namespace) else {
            return false;
        };
        if opened {
            opening.remove(&namespace);
        } else {
            *in_progress = false;
        }
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_open_at_a_time_and_a_delete_during_the_open_wins() {
        let unopened = UnopenedPartitions::default();
        let namespace = Namespace::new(1, 2, 3);
        assert_eq!(unopened.begin(namespace), Begin::NotUnopened);
        unopened.insert(namespace);
        assert_eq!(unopened.begin(namespace), Begin::Started);
        assert_eq!(unopened.begin(namespace), Begin::InProgress);
        assert!(unopened.end(namespace, false));
        assert_eq!(unopened.begin(namespace), Begin::Started);
        assert!(unopened.end(namespace, true));
        assert_eq!(unopened.begin(namespace), Begin::NotUnopened);
        unopened.insert(namespace);
        assert_eq!(unopened.begin(namespace), Begin::Started);
        assert!(unopened.remove(namespace));
        assert!(!unopened.end(namespace, true));
    }

    #[test]
    fn issue7_2_an_open_refused_for_descriptors_is_resource_exhausted() {
        let namespace = Namespace::new(1, 2, 0);
        let error = storage::LogError::Io {
            path: "p/00000000000000000000.log".into(),
            op: "create segment",
            source: std::io::Error::from_raw_os_error(libc::EMFILE),
        };
        let failure = OpenFailure::new(1, namespace, &error);
        assert_eq!(failure.kind, OpenFailureKind::DescriptorsExhausted);
        assert!(failure.kind.is_transient());
        let ShardReply::Error { code, message } = failure.reply() else {
            panic!("an error reply");
        };
        assert_eq!(code, ErrorCode::ResourceExhausted);
        assert_eq!(
            message,
            format!(
                "the partition is committed but its log cannot be opened: shard 1: partition \
                 {namespace}: p/00000000000000000000.log: create segment failed: Too many open \
                 files (os error 24); nothing was appended or read, and each send or poll \
                 retries the open (it succeeds once the cause is fixed, here once file \
                 descriptors are freed (the open-file limit was reached))"
            )
        );
        let corrupt = storage::LogError::Corrupt {
            path: "p/00000000000000000000.log".into(),
            position: 0,
            reason: "bad".into(),
        };
        assert_eq!(OpenFailureKind::of(&corrupt), OpenFailureKind::Other);
        assert!(!OpenFailureKind::of(&corrupt).is_transient());
    }

    #[test]
    fn an_open_refused_for_space_is_storage_full() {
        let namespace = Namespace::new(1, 2, 0);
        let error = storage::LogError::Io {
            path: "p/00000000000000000000.log".into(),
            op: "create segment",
            source: std::io::Error::from_raw_os_error(libc::ENOSPC),
        };
        let failure = OpenFailure::new(1, namespace, &error);
        assert_eq!(failure.kind, OpenFailureKind::StorageFull);
        let ShardReply::Error { code, message } = commit_reply(&[failure]) else {
            panic!("an error reply");
        };
        assert_eq!(code, ErrorCode::StorageFull);
        assert_eq!(
            message,
            format!(
                "the change is committed, but 1 of its partitions could not be opened: shard 1: \
                 partition {namespace}: p/00000000000000000000.log: create segment failed: No \
                 space left on device (os error 28); each is opened again on its next send or \
                 poll, which answers StorageFull until the cause is fixed (free space for \
                 StorageFull, file descriptors for ResourceExhausted), then succeeds"
            )
        );
    }
}
