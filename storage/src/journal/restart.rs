//! [`Journal::restart_after`]: after a state-transfer install (issue 9 section 4) the journal
//! holds no record and continues at the installed checkpoint's next op. It must never leave,
//! after a crash at any step, a directory that open refuses or that reads as holding ops it
//! does not: deletions go oldest first with a directory fsync after each (a contiguous run of
//! the newest segments survives), then the last segment is emptied and fsynced, then renamed to
//! `{op + 1:020}.wal` and the directory fsynced. Crash cases: `storage/FORMAT.md` section 8.

use std::path::PathBuf;

use super::{Failure, Journal, JournalError, segment_path};
use crate::durable::sync_dir;

/// A step of [`Journal::restart_after`] that just completed (durably), for tests that copy the
/// directory at each step to see what a crash there leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartStep {
    /// The segment starting at this op was deleted and the directory fsynced.
    SegmentDeleted { first_op: u64 },
    /// The last segment (starting at this op) was cut to zero bytes and fsynced.
    LastSegmentEmptied { first_op: u64 },
    /// The emptied segment was renamed to start at the new first op and the directory fsynced.
    Renamed { first_op: u64 },
}

impl Journal {
    /// Durably drops every record and continues the journal at `op + 1`: afterwards
    /// `first_op() == op + 1`, `last_op() == op` and the journal is one empty segment
    /// `{op + 1:020}.wal`. Any damage awaiting repair is dropped with the rest. What a state
    /// transfer install does once the snapshot at checkpoint op `op` is durable (issue 9
    /// section 4: the journal's ops at or below the new checkpoint, and any stale suffix above
    /// it, are never replayed). Steps, each durable before the next: delete every segment but
    /// the last, oldest first, fsyncing the directory after each; cut the last segment to zero
    /// bytes and fsync it; rename it to `{op + 1:020}.wal` (unless it has that name) and fsync
    /// the directory. A crash leaves a contiguous run of the newest old segments, or one empty
    /// segment under its old or its new name: open accepts each, and boot restarts the journal
    /// again when it ends below the snapshot (`shards::store::boot`).
    ///
    /// # Errors
    /// - `Io`: a deletion, the truncation, the rename or an fsync failed (path + step); the
    ///   journal is poisoned.
    /// - `Poisoned`: an earlier append, truncation, release or restart failed or was cancelled.
    ///
    /// # Panics
    /// If `op` is `u64::MAX` (no next op).
    ///
    /// # Cancel safety
    /// Not cancel safe: a dropped restart poisons the journal; reopen it (the files are one of
    /// the crash states above).
    pub async fn restart_after(&mut self, op: u64) -> Result<(), JournalError> {
        self.restart_after_observed(op, &mut |_| {}).await
    }

    /// [`Journal::restart_after`], calling `observer(step)` right after each durable step.
    ///
    /// # Errors
    /// As [`Journal::restart_after`].
    ///
    /// # Panics
    /// As [`Journal::restart_after`].
    ///
    /// # Cancel safety
    /// As [`Journal::restart_after`].
    pub async fn restart_after_observed(
        &mut self,
        op: u64,
        observer: &mut dyn FnMut(RestartStep),
    ) -> Result<(), JournalError> {
        self.check_not_poisoned()?;
        let first_op = op
            .checked_add(1)
            .expect("restart_after(u64::MAX): no next op");
        self.failure = Some(Failure {
            path: self.active_path.clone(),
            op: "restart",
            reason: "the restart was cancelled before it completed".to_owned(),
        });
        self.delete_all_but_active(observer).await?;
        self.empty_active(observer).await?;
        self.rename_active(first_op, observer).await?;
        self.index.clear();
        self.held_bytes = 0;
        self.damaged_tail = None;
        self.segment_first_ops = vec![first_op];
        self.active_size_bytes = 0;
        self.last_op = op;
        self.failure = None;
        tracing::info!(
            path = %self.active_path.display(), first_op,
            "journal restarted after an installed checkpoint: it holds no record"
        );
        Ok(())
    }

    /// Deletes every segment but the active one, oldest first, the directory fsynced after each.
    async fn delete_all_but_active(
        &mut self,
        observer: &mut dyn FnMut(RestartStep),
    ) -> Result<(), JournalError> {
        while self.segment_first_ops.len() > 1 {
            let oldest = self.segment_first_ops[0];
            let path = segment_path(&self.dir, oldest);
            if let Err(error) = compio::fs::remove_file(&path).await {
                return Err(self.poison(path, "delete a segment at restart", error));
            }
            self.segment_first_ops.remove(0);
            self.sync_dir_or_poison("fsync journal directory after deleting a segment")
                .await?;
            observer(RestartStep::SegmentDeleted { first_op: oldest });
        }
        Ok(())
    }

    /// Cuts the active segment to zero bytes and fsyncs it.
    async fn empty_active(
        &mut self,
        observer: &mut dyn FnMut(RestartStep),
    ) -> Result<(), JournalError> {
        let path = self.active_path.clone();
        if let Err(error) = self.active_file.set_len(0).await {
            return Err(self.poison(path, "empty the last segment at restart", error));
        }
        if let Err(error) = self.active_file.sync_all().await {
            return Err(self.poison(path, "fsync the emptied segment at restart", error));
        }
        observer(RestartStep::LastSegmentEmptied {
            first_op: self.segment_first_ops[0],
        });
        Ok(())
    }

    /// Renames the (empty) active segment to `{first_op:020}.wal` and fsyncs the directory.
    async fn rename_active(
        &mut self,
        first_op: u64,
        observer: &mut dyn FnMut(RestartStep),
    ) -> Result<(), JournalError> {
        let renamed: PathBuf = segment_path(&self.dir, first_op);
        if renamed != self.active_path {
            if let Err(error) = compio::fs::rename(&self.active_path, &renamed).await {
                return Err(self.poison(
                    self.active_path.clone(),
                    "rename the emptied segment at restart",
                    error,
                ));
            }
            self.active_path = renamed;
            self.sync_dir_or_poison("fsync journal directory after renaming a segment")
                .await?;
        }
        observer(RestartStep::Renamed { first_op });
        Ok(())
    }

    /// Fsyncs the journal directory; on failure poisons the journal with `step`.
    async fn sync_dir_or_poison(&mut self, step: &'static str) -> Result<(), JournalError> {
        match sync_dir(&self.dir).await {
            Ok(()) => Ok(()),
            Err(error) => Err(self.poison(self.dir.clone(), step, error)),
        }
    }
}
