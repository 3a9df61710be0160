//! The single writer task of one log (group commit). It takes every queued append at once, writes
//! them with vectored writes at the end of the active segment, rolls segments (writing each new
//! segment's producer-state snapshot), fsyncs once per group under `FsyncPolicy::Always`, then
//! acknowledges the group in offset order and adds its producer stamps to the log's state.
//!
//! It must never acknowledge an entry whose write (or required fsync) has not succeeded, and after
//! a failed fsync or a failed write other than a full filesystem it must not write again: the log
//! is poisoned until reopened. A write refused for lack of space (`ENOSPC`, `EDQUOT`, `EFBIG`),
//! or an open or creation refused for lack of file descriptors (`EMFILE`, `ENFILE`: only
//! descriptor-allocating calls return them, so nothing was written), is rolled back instead:
//! segments created by the failed group are deleted, the active segment is truncated to the
//! acknowledged end and fsynced, the group and the queue behind it fail with `StorageFull` or
//! `DescriptorsExhausted`, and the offsets are reused (storage/FORMAT.md section 3, "Rollback").
//! A rollback that itself meets `EMFILE` (its directory fsync opens the directory) is left
//! pending: nothing is written until a later group (or the close) completes it.

use std::mem;
use std::rc::Rc;
use std::time::Instant;

use compio::BufResult;
use compio::fs::{File, OpenOptions};
use compio::io::AsyncWriteAtExt;

use super::completion::Completion;
use super::direct::{DirectFile, DirectState, OpenRefused};
use super::producer_state::producer_snapshot_path;
use super::recovery::{index_path, segment_path};
use super::{Failure, FsyncPolicy, LogError, PendingAppend, Refusal, Segment, Shared, WriteMode};
use crate::durable::{DurableError, durable_replace, sync_dir};
use crate::entry::{ENTRY_HEADER_SIZE, ProducerBatch, producer_stamp};
use crate::fault::FaultOp;
use crate::limits::{DIRECT_STAGING_BYTES_MAX, WRITE_IOVEC_COUNT_MAX};
use crate::space::{FreeBytes, free_bytes};

use super::index::SegmentIndex;
use super::sealed::load_sealed_index;

/// What the writer does next.
enum Work {
    Group {
        appends: Vec<PendingAppend>,
        syncs: Vec<Completion<Result<(), LogError>>>,
    },
    Exit,
}

/// A rollback stopped by a descriptor refusal, to complete before anything is written again.
#[derive(Debug, Default)]
struct PendingRollback {
    /// Entries of the log directory were deleted (or created) and the directory is not fsynced.
    dir_dirty: bool,
}

/// The writer loop; runs until the log is closed or dropped and its queue is drained.
pub(super) async fn run(shared: Rc<Shared>) {
    let mut pending_rollback = None;
    loop {
        match next_work(&shared).await {
            Work::Group { appends, syncs } => {
                process_group(&shared, &mut pending_rollback, appends, syncs).await;
            }
            Work::Exit => {
                finish(&shared, &mut pending_rollback).await;
                return;
            }
        }
    }
}

async fn next_work(shared: &Shared) -> Work {
    std::future::poll_fn(|context| {
        let mut state = shared.state.borrow_mut();
        if !state.queue.is_empty() || !state.sync_waiters.is_empty() {
            let appends: Vec<PendingAppend> = state.queue.drain(..).collect();
            state.queued_bytes = 0;
            let syncs = mem::take(&mut state.sync_waiters);
            return std::task::Poll::Ready(Work::Group { appends, syncs });
        }
        if state.closing {
            return std::task::Poll::Ready(Work::Exit);
        }
        state.writer_waker = Some(context.waker().clone());
        std::task::Poll::Pending
    })
    .await
}

async fn process_group(
    shared: &Shared,
    pending_rollback: &mut Option<PendingRollback>,
    appends: Vec<PendingAppend>,
    syncs: Vec<Completion<Result<(), LogError>>>,
) {
    let earlier_failure = shared.state.borrow().failure.clone();
    if let Some(failure) = earlier_failure {
        fail_all(&failure, appends, syncs);
        return;
    }
    if let Err(failure) = complete_pending_rollback(shared, pending_rollback).await {
        fail_all(&failure, appends, syncs);
        return;
    }
    let sync_required = shared.config.fsync == FsyncPolicy::Always || !syncs.is_empty();
    let mut completions = Vec::with_capacity(appends.len());
    let mut entries = Vec::with_capacity(appends.len());
    let mut stamps = Vec::new();
    for append in appends {
        if let Some((producer, sequence)) = producer_stamp(&append.entry[ENTRY_HEADER_SIZE..]) {
            stamps.push(ProducerBatch {
                producer,
                sequence,
                message_count: append.message_count,
                base_offset: append.base_offset,
            });
        }
        completions.push((append.base_offset, append.completion));
        entries.push(Entry {
            base_offset: append.base_offset,
            message_count: append.message_count,
            bytes: append.entry,
        });
    }
    let written_end_offset = entries.last().map(Entry::end_offset);
    let active_base_before = shared.state.borrow().active().index.base_offset;
    match write_group(shared, entries, &stamps, sync_required).await {
        Ok(()) => {
            if let Some(end_offset) = written_end_offset {
                let mut state = shared.state.borrow_mut();
                assert!(
                    end_offset > state.acked_offset,
                    "groups are acknowledged in order"
                );
                state.acked_offset = end_offset;
                for stamp in stamps {
                    state.producers.record(stamp);
                }
            }
            // Retention (issue 11 section 4) may only delete acknowledged segments: tell the
            // owner once the group that rolled is acknowledged, not at the roll itself.
            if shared.state.borrow().active().index.base_offset != active_base_before
                && let Some(stats) = &shared.stats
            {
                stats.segments_sealed();
            }
            for (base_offset, completion) in completions {
                completion.complete(Ok(base_offset));
            }
            for sync in syncs {
                sync.complete(Ok(()));
            }
        }
        Err(failure) if failure.is_refusal() => {
            let completions = completions.into_iter().map(|(_, completion)| completion);
            recover_from_refusal(
                shared,
                pending_rollback,
                failure,
                completions.collect(),
                syncs,
            )
            .await;
        }
        Err(failure) => {
            tracing::error!(
                path = %failure.path.display(),
                op = failure.op,
                error = %failure.message,
                "log write failed; the log is poisoned until reopened"
            );
            shared.state.borrow_mut().failure = Some(failure.clone());
            let appends_failed = completions.into_iter().map(|(_, completion)| completion);
            for completion in appends_failed {
                completion.complete(Err(failure.to_error()));
            }
            for sync in syncs {
                sync.complete(Err(failure.to_error()));
            }
        }
    }
}

/// Retries a rollback a descriptor refusal stopped, before anything else is written. On a new
/// descriptor refusal it stays pending, and the offsets handed out since are taken back (the
/// caller fails their appends); any other failure poisons the log.
///
/// # Errors
/// The failure the appends and syncs of this group get.
async fn complete_pending_rollback(
    shared: &Shared,
    pending_rollback: &mut Option<PendingRollback>,
) -> Result<(), Failure> {
    let Some(pending) = pending_rollback.as_mut() else {
        return Ok(());
    };
    match roll_back(shared, &mut pending.dir_dirty).await {
        Ok(()) => {
            *pending_rollback = None;
            tracing::info!(
                dir = %shared.dir.display(),
                "pending log rollback completed; appends continue"
            );
            Ok(())
        }
        Err(failure) if failure.is_refusal() => {
            let queued = discard_queue(shared);
            for append in queued {
                append.completion.complete(Err(failure.to_error()));
            }
            Err(failure)
        }
        Err(failure) => {
            *pending_rollback = None;
            tracing::error!(
                path = %failure.path.display(),
                op = failure.op,
                error = %failure.message,
                "pending log rollback failed; the log is poisoned until reopened"
            );
            shared.state.borrow_mut().failure = Some(failure.clone());
            Err(failure)
        }
    }
}

/// Takes back the offsets of everything queued (they are past the rollback point and are handed
/// out again from the acknowledged end) and returns the queued appends, which must fail.
fn discard_queue(shared: &Shared) -> Vec<PendingAppend> {
    let mut state = shared.state.borrow_mut();
    state.next_offset = state.acked_offset;
    state.queued_bytes = 0;
    state.queue.drain(..).collect()
}

/// A write of the group was refused for lack of space, or an open for lack of descriptors: roll
/// the files back to the acknowledged end, then fail the group and everything queued behind it
/// with `StorageFull` (or `DescriptorsExhausted`) and reuse their offsets. A rollback stopped by
/// a descriptor refusal is left pending (`pending_rollback`), to be completed before the next
/// write; if it fails otherwise, the log is poisoned with that failure instead.
async fn recover_from_refusal(
    shared: &Shared,
    pending_rollback: &mut Option<PendingRollback>,
    mut failure: Failure,
    group: Vec<Completion<Result<u64, LogError>>>,
    syncs: Vec<Completion<Result<(), LogError>>>,
) {
    let mut dir_dirty = false;
    if let Err(rollback_failure) = roll_back(shared, &mut dir_dirty).await {
        if rollback_failure.is_refusal() {
            tracing::warn!(
                path = %rollback_failure.path.display(),
                op = rollback_failure.op,
                error = %rollback_failure.message,
                refused = %failure.message,
                "log rollback after a refused step stopped for lack of file descriptors; it is \
                 completed before the next write, appends are refused until then"
            );
            *pending_rollback = Some(PendingRollback { dir_dirty });
            let queued = discard_queue(shared);
            let appends = group
                .into_iter()
                .chain(queued.into_iter().map(|append| append.completion));
            for completion in appends {
                completion.complete(Err(rollback_failure.to_error()));
            }
            for sync in syncs {
                sync.complete(Err(rollback_failure.to_error()));
            }
            return;
        }
        tracing::error!(
            path = %rollback_failure.path.display(),
            op = rollback_failure.op,
            error = %rollback_failure.message,
            refused_write = %failure.message,
            "log rollback after a refused write failed; the log is poisoned until reopened"
        );
        shared.state.borrow_mut().failure = Some(rollback_failure.clone());
        for completion in group {
            completion.complete(Err(rollback_failure.to_error()));
        }
        for sync in syncs {
            sync.complete(Err(rollback_failure.to_error()));
        }
        return;
    }
    if failure.refusal == Some(Refusal::StorageFull) {
        failure.free_bytes = FreeBytes(free_bytes(&shared.dir));
    }
    // Everything queued has an offset past the rollback point: it fails too.
    let queued = discard_queue(shared);
    let acked_offset = shared.state.borrow().acked_offset;
    let failed_append_count = group.len() + queued.len();
    if failure.refusal == Some(Refusal::StorageFull) {
        tracing::warn!(
            path = %failure.path.display(),
            op = failure.op,
            error = %failure.message,
            free_bytes = %failure.free_bytes,
            next_offset = acked_offset,
            failed_append_count,
            "log write refused for lack of space; rolled back to the acknowledged end, appends \
             continue"
        );
    } else {
        tracing::warn!(
            path = %failure.path.display(),
            op = failure.op,
            error = %failure.message,
            next_offset = acked_offset,
            failed_append_count,
            "log open refused at the open-file limit; rolled back to the acknowledged end, \
             appends continue"
        );
    }
    for completion in group {
        completion.complete(Err(failure.to_error()));
    }
    for append in queued {
        append.completion.complete(Err(failure.to_error()));
    }
    // Everything acknowledged is durable: closed segments were fsynced when they closed, and the
    // rollback fsynced the active one.
    for sync in syncs {
        sync.complete(Ok(()));
    }
}

/// Returns the files and the in-memory index to the acknowledged end: deletes the segments a roll
/// of the failed group created with their index and producer-state snapshot files, and any
/// snapshot a failed roll wrote for a segment it did not create (newest first, then one directory
/// fsync, so a crash can never leave a shortened segment followed by one that starts past its
/// end, or a snapshot holding stamps of the cut entries), truncates the active
/// segment to the acknowledged end and fsyncs it, and deletes the active segment's index file,
/// which a roll of the failed group may have written before it failed (recovery ignores the last
/// segment's index file, but `inspect` should not find a stale one).
///
/// `dir_dirty` says the directory has unsynced deletions; it is kept set when a step fails, so
/// a retry after a descriptor refusal still fsyncs the directory. Every step can be repeated.
async fn roll_back(shared: &Shared, dir_dirty: &mut bool) -> Result<(), Failure> {
    let acked_offset = shared.state.borrow().acked_offset;
    // The truncation below cuts the direct writes' padding and may cut the carry block: the
    // next write opens the direct descriptor again and reloads the carry from the file.
    let direct = {
        let mut state = shared.state.borrow_mut();
        match mem::replace(&mut state.direct, DirectState::Idle) {
            DirectState::Open(direct) => Some(direct),
            other => {
                state.direct = other;
                None
            }
        }
    };
    if let Some(direct) = direct {
        direct.close().await;
    }
    loop {
        let Some(segment) = return_to_newest_sealed(shared, acked_offset).await? else {
            break;
        };
        remove_if_present(&segment.path, "delete a rolled-back segment").await?;
        remove_if_present(
            &index_path(&shared.dir, segment.index.base_offset),
            "delete the index of a rolled-back segment",
        )
        .await?;
        *dir_dirty = true;
    }
    if remove_rolled_back_snapshots(shared).await? {
        *dir_dirty = true;
    }
    if *dir_dirty {
        sync_log_dir(shared).await.map_err(|error| {
            dir_sync_failure(
                &shared.dir,
                [
                    "fsync log directory after deleting rolled-back segments",
                    "open log directory to fsync it after deleting rolled-back segments",
                ],
                &error,
            )
        })?;
        *dir_dirty = false;
    }
    reopen_active(shared).await?;
    let (file, path, base_offset, size_bytes) = {
        let mut state = shared.state.borrow_mut();
        let active = state.active_mut();
        active.index.truncate_to(acked_offset);
        (
            active.active_file().clone(),
            active.path.clone(),
            active.index.base_offset,
            active.index.size_bytes,
        )
    };
    file.set_len(size_bytes)
        .await
        .map_err(|error| Failure::new(&path, "truncate rolled-back entries", &error))?;
    {
        let mut state = shared.state.borrow_mut();
        state.dirty = true;
        // The cut entries were never acknowledged: the rollback's fsync makes none durable (an
        // acknowledged, not yet fsynced entry under `Interval` goes uncounted in that batch).
        state.unsynced_append_count = 0;
    }
    sync_active(shared).await?;
    remove_if_present(
        &index_path(&shared.dir, base_offset),
        "delete the index of the reopened segment",
    )
    .await?;
    Ok(())
}

/// When the active segment starts past `acked_offset` (a roll of the failed group created it),
/// makes the newest sealed segment active again, with its whole index (from the sealed-index
/// cache, or from the index file the roll wrote), and returns the segment it replaces, for the
/// caller to delete; `None` when the active segment holds the acknowledged end.
async fn return_to_newest_sealed(
    shared: &Shared,
    acked_offset: u64,
) -> Result<Option<Segment>, Failure> {
    let (newest, cached) = {
        let mut state = shared.state.borrow_mut();
        if state.active().index.base_offset <= acked_offset {
            return Ok(None);
        }
        let newest = *state
            .sealed
            .newest()
            .expect("a segment past the acknowledged end was started by a roll");
        (newest, state.sealed.cached_index(newest.base_offset))
    };
    let index = match cached {
        Some(index) => index,
        None => Rc::new(
            load_sealed_index(&shared.dir, newest)
                .await
                .map_err(|error| {
                    Failure::new(
                        &segment_path(&shared.dir, newest.base_offset),
                        "load the index of the segment a rollback makes active again",
                        &std::io::Error::other(error.to_string()),
                    )
                })?,
        ),
    };
    let mut state = shared.state.borrow_mut();
    assert_eq!(state.sealed.pop_newest(), Some(newest));
    let index = Rc::try_unwrap(index).unwrap_or_else(|shared_index| (*shared_index).clone());
    Ok(Some(std::mem::replace(
        &mut state.active,
        Segment {
            path: segment_path(&shared.dir, newest.base_offset),
            file: None,
            index,
        },
    )))
}

/// Deletes the producer-state snapshots of segments past the (rolled-back) active one: written by
/// a roll of the failed group, they may hold stamps of the entries being cut. Returns whether it
/// deleted any (the caller fsyncs the directory).
async fn remove_rolled_back_snapshots(shared: &Shared) -> Result<bool, Failure> {
    let rolled_back: Vec<u64> = {
        let state = shared.state.borrow();
        let active_base_offset = state.active().index.base_offset;
        state
            .producer_snapshot_base_offsets
            .range((
                std::ops::Bound::Excluded(active_base_offset),
                std::ops::Bound::Unbounded,
            ))
            .copied()
            .collect()
    };
    for &base_offset in &rolled_back {
        remove_if_present(
            &producer_snapshot_path(&shared.dir, base_offset),
            "delete the producer-state snapshot of a rolled-back segment",
        )
        .await?;
        shared
            .state
            .borrow_mut()
            .producer_snapshot_base_offsets
            .remove(&base_offset);
    }
    Ok(!rolled_back.is_empty())
}

/// Gives the segment that is active again after a rollback deleted the ones after it its file
/// back: a closed segment holds none (roll moved it to the closed-file cache, where it usually
/// still is; else it is reopened read-write).
async fn reopen_active(shared: &Shared) -> Result<(), Failure> {
    let (path, base_offset) = {
        let mut state = shared.state.borrow_mut();
        let base_offset = state.active().index.base_offset;
        if state.active().file.is_some() {
            return Ok(());
        }
        if let Some(file) = state.closed_files.take(base_offset) {
            state.active_mut().file = Some(file);
            return Ok(());
        }
        (state.active().path.clone(), base_offset)
    };
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .open(&path)
        .await
        .map_err(|error| Failure::new(&path, "reopen the segment active again", &error))?;
    let mut state = shared.state.borrow_mut();
    assert_eq!(state.active().index.base_offset, base_offset);
    state.active_mut().file = Some(file);
    Ok(())
}

/// Deletes `path`; a missing file is not an error.
async fn remove_if_present(path: &std::path::Path, op: &'static str) -> Result<(), Failure> {
    match compio::fs::remove_file(path).await {
        Ok(()) => Ok(()),
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(error) => Err(Failure::new(path, op, &error)),
    }
}

fn fail_all(
    failure: &Failure,
    appends: Vec<PendingAppend>,
    syncs: Vec<Completion<Result<(), LogError>>>,
) {
    for append in appends {
        append.completion.complete(Err(failure.to_error()));
    }
    for sync in syncs {
        sync.complete(Err(failure.to_error()));
    }
}

/// Drains nothing (the queue is empty when called), completes a pending rollback, fsyncs what is
/// dirty, and completes `close`. A pending rollback that still cannot complete fails the close
/// (the files then hold unacknowledged bytes past the acknowledged end, as after a crash).
async fn finish(shared: &Shared, pending_rollback: &mut Option<PendingRollback>) {
    if let Err(failure) = complete_pending_rollback(shared, pending_rollback).await {
        tracing::error!(
            path = %failure.path.display(),
            op = failure.op,
            error = %failure.message,
            "log rollback still pending at close"
        );
        shared.state.borrow_mut().failure = Some(failure);
    }
    let healthy = shared.state.borrow().failure.is_none();
    if healthy && let Err(failure) = close_direct_file(shared).await {
        tracing::error!(
            path = %failure.path.display(),
            error = %failure.message,
            "cutting the direct-write padding at close failed"
        );
        shared.state.borrow_mut().failure = Some(failure);
    }
    let needs_sync = {
        let state = shared.state.borrow();
        state.failure.is_none() && state.dirty
    };
    if needs_sync && let Err(failure) = sync_active(shared).await {
        tracing::error!(
            path = %failure.path.display(),
            error = %failure.message,
            "fsync at close failed"
        );
        shared.state.borrow_mut().failure = Some(failure);
    }
    let (failure, close_waiters) = {
        let mut state = shared.state.borrow_mut();
        state.writer_done = true;
        (state.failure.clone(), mem::take(&mut state.close_waiters))
    };
    for waiter in close_waiters {
        waiter.complete(match &failure {
            Some(failure) => Err(failure.to_error()),
            None => Ok(()),
        });
    }
}

#[derive(Debug)]
struct Entry {
    base_offset: u64,
    message_count: u32,
    bytes: Vec<u8>,
}

impl Entry {
    fn end_offset(&self) -> u64 {
        self.base_offset + u64::from(self.message_count)
    }
}

/// Writes `entries` in order, rolling segments as they fill, then fsyncs the active segment if
/// `sync_required` and anything is unsynced. `stamps` are the producer stamps of `entries`, for
/// the snapshots of the segments a roll starts.
async fn write_group(
    shared: &Shared,
    entries: Vec<Entry>,
    stamps: &[ProducerBatch],
    sync_required: bool,
) -> Result<(), Failure> {
    let segment_size_max = shared.config.segment_size_max;
    // A direct write copies its batch into a staging buffer: bound the copy (buffered writes
    // hand the entries' own buffers to the kernel and are cut by iovec count alone).
    let staging_bytes_max = match shared.config.write_mode {
        WriteMode::Buffered => u64::MAX,
        WriteMode::Direct => DIRECT_STAGING_BYTES_MAX as u64,
    };
    let mut batch: Vec<Entry> = Vec::new();
    let mut batch_bytes: u64 = 0;
    for entry in entries {
        let entry_size = entry.bytes.len() as u64;
        let active_size = shared.state.borrow().active().index.size_bytes + batch_bytes;
        if active_size > 0 && active_size + entry_size > segment_size_max {
            write_batch(shared, mem::take(&mut batch)).await?;
            batch_bytes = 0;
            roll(shared, stamps).await?;
        }
        batch_bytes += entry_size;
        batch.push(entry);
        if batch.len() == WRITE_IOVEC_COUNT_MAX || batch_bytes >= staging_bytes_max {
            write_batch(shared, mem::take(&mut batch)).await?;
            batch_bytes = 0;
        }
    }
    write_batch(shared, batch).await?;
    if sync_required && shared.state.borrow().dirty {
        sync_active(shared).await?;
    }
    Ok(())
}

/// One write of `batch` at the end of the active segment (a vectored buffered write, or in
/// direct mode one `O_DIRECT` write from a staging buffer: `direct.rs`), then the entries join
/// its index (still invisible to readers until the group is acknowledged).
async fn write_batch(shared: &Shared, batch: Vec<Entry>) -> Result<(), Failure> {
    if batch.is_empty() {
        return Ok(());
    }
    let (file, path, base_offset, position) = {
        let state = shared.state.borrow();
        let active = state.active();
        (
            active.active_file().clone(),
            active.path.clone(),
            active.index.base_offset,
            active.index.size_bytes,
        )
    };
    let mut rows = Vec::with_capacity(batch.len());
    let mut buffers = Vec::with_capacity(batch.len());
    for entry in batch {
        rows.push((
            entry.base_offset,
            entry.message_count,
            entry.bytes.len() as u64,
        ));
        buffers.push(entry.bytes);
    }
    match take_direct_file(shared, &file, &path, base_offset, position).await? {
        Some(direct) => write_direct(shared, direct, &file, &path, buffers, position).await?,
        None => write_entries(shared, &file, buffers, position)
            .await
            .map_err(|error| Failure::write(&path, "write entries", &error))?,
    }
    let mut state = shared.state.borrow_mut();
    let active = state.active_mut();
    assert_eq!(
        active.index.size_bytes, position,
        "only the writer appends to the active segment"
    );
    let row_count = rows.len() as u64;
    for (base_offset, message_count, size_bytes) in rows {
        active.index.push(base_offset, message_count, size_bytes);
    }
    state.dirty = true;
    state.unsynced_append_count += row_count;
    Ok(())
}

/// The direct descriptor of the active segment (`base_offset`, logical end `position`) when
/// the log writes direct: the open one, or a new one (opened with its carry loaded after a roll,
/// a rollback or at the first write). `None` for buffered writes, and when `O_DIRECT` is refused
/// at the open (`EINVAL`): the log then falls back to buffered writes, logged once.
///
/// # Errors
/// The open's or the carry read's failure (an `EMFILE`/`ENFILE` open is a refusal: rolled back,
/// the log goes on; anything else poisons it).
async fn take_direct_file(
    shared: &Shared,
    file: &File,
    path: &std::path::Path,
    base_offset: u64,
    position: u64,
) -> Result<Option<DirectFile>, Failure> {
    let current = {
        let mut state = shared.state.borrow_mut();
        if matches!(state.direct, DirectState::Off | DirectState::FellBack) {
            return Ok(None);
        }
        mem::replace(&mut state.direct, DirectState::Idle)
    };
    if let DirectState::Open(direct) = current {
        assert_eq!(
            direct.base_offset, base_offset,
            "a roll and a rollback close the direct descriptor of the segment they leave"
        );
        return Ok(Some(direct));
    }
    match DirectFile::open(&shared.faults, path, base_offset, file, position).await {
        Ok(direct) => Ok(Some(direct)),
        Err(OpenRefused::Unsupported(error)) => {
            fall_back_to_buffered(shared, path, &error, "open");
            Ok(None)
        }
        Err(OpenRefused::Failed(op, error)) => Err(Failure::new(path, op, &error)),
    }
}

/// Records that this log writes buffered from now on, and says so once, at warn.
fn fall_back_to_buffered(
    shared: &Shared,
    path: &std::path::Path,
    error: &std::io::Error,
    step: &str,
) {
    shared.state.borrow_mut().direct = DirectState::FellBack;
    tracing::warn!(
        path = %path.display(),
        error = %error,
        step,
        "O_DIRECT refused by the filesystem; this log falls back to buffered writes \
         (--write-mode buffered) until it is reopened"
    );
}

/// Writes `buffers` at `position` through `direct` and keeps it for the next write. An
/// `EINVAL` (the filesystem refused the alignment) falls back to buffered writes instead of
/// poisoning the log: the padding the direct writes left is cut, the descriptor closed, and the
/// same bytes written buffered at `position`.
///
/// # Errors
/// The write's as a `Failure::write` (a refusal for lack of space), or the cut's.
async fn write_direct(
    shared: &Shared,
    mut direct: DirectFile,
    file: &File,
    path: &std::path::Path,
    buffers: Vec<Vec<u8>>,
    position: u64,
) -> Result<(), Failure> {
    match direct.write(&shared.faults, &buffers, position).await {
        Ok(()) => {
            shared.state.borrow_mut().direct = DirectState::Open(direct);
            Ok(())
        }
        Err(error) if error.raw_os_error() == Some(libc::EINVAL) => {
            fall_back_to_buffered(shared, path, &error, "write");
            // Unconditionally: a write cut short before the refusal may have reached past
            // `file_len`, which only a successful write updates.
            file.set_len(position).await.map_err(|error| {
                Failure::new(path, "cut direct-write padding at the fallback", &error)
            })?;
            direct.close().await;
            write_entries(shared, file, buffers, position)
                .await
                .map_err(|error| Failure::write(path, "write entries", &error))
        }
        Err(error) => {
            shared.state.borrow_mut().direct = DirectState::Open(direct);
            Err(Failure::write(path, "write entries with O_DIRECT", &error))
        }
    }
}

/// Closes the active segment's direct descriptor, if one is open, after cutting the zero
/// padding its writes left past the logical end (a roll and a close: a segment that is not
/// being written holds exactly its entries; storage/FORMAT.md section 3, "Write modes"). The
/// cut marks the segment dirty, so the fsync that follows makes its length durable. In buffered
/// mode, or with no descriptor open, it does nothing.
///
/// # Errors
/// The truncation's (the log is poisoned: its length is unknown).
async fn close_direct_file(shared: &Shared) -> Result<(), Failure> {
    let (direct, file, path, logical_end) = {
        let mut state = shared.state.borrow_mut();
        if !matches!(state.direct, DirectState::Open(_)) {
            return Ok(());
        }
        let DirectState::Open(direct) = mem::replace(&mut state.direct, DirectState::Idle) else {
            unreachable!("matched above");
        };
        let active = state.active();
        (
            direct,
            active.active_file().clone(),
            active.path.clone(),
            active.index.size_bytes,
        )
    };
    if direct.file_len > logical_end {
        file.set_len(logical_end)
            .await
            .map_err(|error| Failure::new(&path, "cut direct-write padding", &error))?;
        shared.state.borrow_mut().dirty = true;
    }
    direct.close().await;
    Ok(())
}

/// One vectored write at `position`, through the fault seam: an injected write fault first
/// writes half of the first buffer, as a real write that runs out of space part way does.
async fn write_entries(
    shared: &Shared,
    file: &File,
    buffers: Vec<Vec<u8>>,
    position: u64,
) -> std::io::Result<()> {
    if let Err(error) = shared.faults.check(FaultOp::Write) {
        let mut partial = buffers.into_iter().next().unwrap_or_default();
        partial.truncate(partial.len() / 2);
        if !partial.is_empty() {
            let mut writer = file;
            let BufResult(_, _) = writer.write_all_at(partial, position).await;
        }
        return Err(error);
    }
    let mut writer = file;
    let BufResult(result, _) = writer.write_vectored_all_at(buffers, position).await;
    result
}

/// Fsyncs the active segment's data (`fdatasync`, which also persists the size a read needs).
async fn sync_active(shared: &Shared) -> Result<(), Failure> {
    let (file, path) = {
        let state = shared.state.borrow();
        (
            state.active().active_file().clone(),
            state.active().path.clone(),
        )
    };
    let started = Instant::now();
    let synced = match shared.faults.check(FaultOp::Fsync) {
        Ok(()) => file.sync_data().await,
        Err(error) => Err(error),
    };
    synced.map_err(|error| Failure::new(&path, "fsync segment", &error))?;
    let now = Instant::now();
    let append_count = {
        let mut state = shared.state.borrow_mut();
        state.dirty = false;
        state.last_sync_at = now;
        state.fsync_count += 1;
        std::mem::take(&mut state.unsynced_append_count)
    };
    if let Some(stats) = &shared.stats {
        stats.fsync_done(append_count, now.duration_since(started));
    }
    Ok(())
}

/// Closes the active segment and starts the next one. Order (see FORMAT.md): fsync the closed
/// segment whatever the policy (so a crash can never leave a torn closed segment), write its index
/// file durably, write the new segment's producer-state snapshot durably (the acknowledged state
/// plus `group_stamps` of the entries written before the roll), create the new segment file,
/// fsync the directory, then delete the snapshots no longer needed.
async fn roll(shared: &Shared, group_stamps: &[ProducerBatch]) -> Result<(), Failure> {
    close_direct_file(shared).await?;
    sync_active(shared).await?;
    let (closed_path, index) = {
        let state = shared.state.borrow();
        (state.active().path.clone(), state.active().index.clone())
    };
    let index_file = index_path(&shared.dir, index.base_offset);
    durable_replace(&index_file, index.encode())
        .await
        .map_err(|error| durable_failure(error, "write index file"))?;
    let base_offset = index.end_offset;
    write_producer_snapshot(shared, base_offset, group_stamps).await?;
    let path = segment_path(&shared.dir, base_offset);
    let created = match shared.faults.check(FaultOp::Open) {
        Ok(()) => {
            OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .open(&path)
                .await
        }
        Err(error) => Err(error),
    };
    let file = created.map_err(|error| Failure::write(&path, "create segment", &error))?;
    if let Err(error) = sync_log_dir(shared).await {
        // The new segment is not one of the log's yet: delete it, so that a rollback (whose
        // directory fsync also covers this deletion: it deletes the snapshot written above)
        // returns to the files before the roll, and the next roll can create it again.
        drop(file);
        remove_if_present(
            &path,
            "delete a segment whose creation was not made durable",
        )
        .await?;
        return Err(dir_sync_failure(
            &shared.dir,
            [
                "fsync log directory after creating a segment",
                "open log directory to fsync it after creating a segment",
            ],
            &error,
        ));
    }
    tracing::debug!(
        closed = %closed_path.display(),
        next = %path.display(),
        closed_size_bytes = index.size_bytes,
        "rolled segment"
    );
    shared.state.borrow_mut().start_segment(Segment {
        path,
        file: Some(file),
        index: SegmentIndex::empty(base_offset),
    });
    remove_old_producer_snapshots(shared).await;
    Ok(())
}

/// Fsyncs the log directory (`sync_dir`), through the fault seam (`FaultOp::Open`: the
/// directory's open).
async fn sync_log_dir(shared: &Shared) -> std::io::Result<()> {
    shared.faults.check(FaultOp::Open)?;
    sync_dir(&shared.dir).await
}

/// A failed `sync_dir` of `dir` as a writer failure named `ops[0]` (the fsync), or `ops[1]` when
/// the error is of the descriptor class: then the open of the directory failed, not the fsync
/// (fsync(2) never returns `EMFILE`/`ENFILE`), and the failure is a recoverable refusal.
fn dir_sync_failure(
    dir: &std::path::Path,
    ops: [&'static str; 2],
    error: &std::io::Error,
) -> Failure {
    let op = if crate::space::is_descriptors_exhausted(error) {
        ops[1]
    } else {
        ops[0]
    };
    Failure::new(dir, op, error)
}

/// A failed durable replace at a roll as a writer failure: a refused write of the `.tmp` file is
/// recoverable (the old files are intact), anything else poisons.
fn durable_failure(error: DurableError, what: &'static str) -> Failure {
    match error {
        DurableError::Io { path, op, source }
            if op.starts_with("write") || op == "create temporary file" =>
        {
            Failure::write(&path, op, &source)
        }
        DurableError::Io { path, op, source } => Failure::new(&path, op, &source),
        DurableError::Corrupt { path, reason } => Failure::new(
            &path,
            what,
            &std::io::Error::new(std::io::ErrorKind::InvalidData, reason),
        ),
    }
}

/// Writes `{base_offset:020}.producers` durably, before the segment it belongs to exists: the
/// acknowledged producer state plus the stamps of this group's entries below `base_offset`
/// (written and fsynced by the roll, acknowledged with the group or rolled back with it, and
/// then this file with them). Goes through the fault seam (`ProducerSnapshotWrite`).
async fn write_producer_snapshot(
    shared: &Shared,
    base_offset: u64,
    group_stamps: &[ProducerBatch],
) -> Result<(), Failure> {
    let path = producer_snapshot_path(&shared.dir, base_offset);
    let payload = {
        let state = shared.state.borrow();
        let written_before_roll = group_stamps
            .iter()
            .take_while(|stamp| stamp.base_offset < base_offset);
        if group_stamps
            .first()
            .is_some_and(|stamp| stamp.base_offset < base_offset)
        {
            let mut producers = state.producers.clone();
            for stamp in written_before_roll {
                producers.record(*stamp);
            }
            producers.encode(base_offset)
        } else {
            state.producers.encode(base_offset)
        }
    };
    shared
        .faults
        .check(FaultOp::ProducerSnapshotWrite)
        .map_err(|error| Failure::write(&path, "write producer-state snapshot", &error))?;
    // Tracked before the write: a rollback deletes it whether or not the write got far.
    shared
        .state
        .borrow_mut()
        .producer_snapshot_base_offsets
        .insert(base_offset);
    durable_replace(&path, payload)
        .await
        .map_err(|error| durable_failure(error, "write producer-state snapshot"))
}

/// Deletes the producer-state snapshots of segments before the previous one, keeping also the
/// snapshot of the segment a rollback of this group would return to. A failed delete is logged
/// and retried at the next roll: a stale snapshot is never read (open deletes it too).
async fn remove_old_producer_snapshots(shared: &Shared) {
    let stale: Vec<u64> = {
        let state = shared.state.borrow();
        let previous_base_offset = state
            .sealed
            .newest()
            .expect("called after a roll sealed a segment")
            .base_offset;
        let acknowledged_base_offset = std::iter::once(state.active().index.base_offset)
            .chain(state.sealed.iter().rev().map(|segment| segment.base_offset))
            .find(|base_offset| *base_offset <= state.acked_offset)
            .unwrap_or(0);
        let keep_from = previous_base_offset.min(acknowledged_base_offset);
        state
            .producer_snapshot_base_offsets
            .range(..keep_from)
            .copied()
            .collect()
    };
    for base_offset in stale {
        let path = producer_snapshot_path(&shared.dir, base_offset);
        match remove_if_present(&path, "delete an old producer-state snapshot").await {
            Ok(()) => {
                shared
                    .state
                    .borrow_mut()
                    .producer_snapshot_base_offsets
                    .remove(&base_offset);
            }
            Err(failure) => tracing::warn!(
                file = %path.display(),
                error = %failure.message,
                "cannot delete an old producer-state snapshot; retried at the next roll"
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::{LogConfig, PartitionLog};

    /// Issue 11 section 4: a rollback that returns to the newest sealed segment when its index
    /// is no longer cached reads it back, whole, from the index file the roll wrote.
    #[test]
    fn issue11_4_rollback_reloads_an_uncached_sealed_index() {
        let dir = tempfile::tempdir().unwrap();
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let config = LogConfig {
                fsync: FsyncPolicy::Never,
                segment_size_max: 150,
                write_mode: crate::log::WriteMode::Buffered,
            };
            let (log, _) = PartitionLog::open(dir.path(), config).await.unwrap();
            // 72-byte entries, 150-byte segments: segment 0 (offsets 0 and 1), segment 2.
            for seed in 0..3u8 {
                log.append(crate::entry::build_entry(0, 1, &[seed; 8]))
                    .await
                    .unwrap();
            }
            // The writer is stopped: the state below is this test's alone.
            log.close().await.unwrap();
            let shared = &log.shared;
            let sealed_index = {
                let mut state = shared.state.borrow_mut();
                let index = (*state.sealed.cached_index(0).unwrap()).clone();
                state.sealed.clear_cache();
                index
            };
            assert_eq!((sealed_index.end_offset, sealed_index.rows.len()), (2, 2));
            assert!(
                return_to_newest_sealed(shared, 2).await.unwrap().is_none(),
                "the active segment holds the acknowledged end"
            );
            let replaced = return_to_newest_sealed(shared, 1).await.unwrap().unwrap();
            assert_eq!(replaced.index.base_offset, 2);
            let state = shared.state.borrow();
            assert_eq!(state.active.index, sealed_index);
            assert_eq!(state.active.path, segment_path(dir.path(), 0));
            assert!(
                state.active.file.is_none(),
                "reopen_active gives it its file"
            );
            assert!(state.sealed.is_empty());
        });
    }
}
