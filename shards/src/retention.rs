//! The owner shard's retention task (issue 11 section 4): every shard applies, to each partition
//! it owns, its topic's retention (`metadata::Retention`, set by CreateTopic and AlterTopic
//! through the metadata commit path) by calling `PartitionLog::apply_retention`, which deletes
//! the oldest sealed segments past either limit and moves the partition's first offset.
//!
//! A pass runs every `--retention-interval` (`ServerConfig::retention_interval`, default 10 s)
//! and as soon as a group of appends that rolled a segment is acknowledged (the logs report it
//! through [`RetentionSink`]). Between passes the task sleeps: no polling. It must never block
//! the reactor, never hold a `RefCell` borrow across an `.await`, and never touch a partition
//! another shard owns (it only sees the logs of its own shard).

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::path::PathBuf;
use std::rc::Rc;
use std::task::{Poll, Waker};
use std::time::{Duration, Instant, SystemTime};

use futures_util::future::{Either, select};
use storage::log::{LogStats, RetentionPolicy, UnverifiedAge};

use crate::limits::UNVERIFIED_AGE_WARN_INTERVAL;
use crate::metadata::Retention;
use crate::metrics::ShardMetrics;
use crate::shard::Shard;

/// Wakes a shard's retention task early: set when a log of the shard reports an acknowledged
/// roll, cleared when the task starts a pass.
#[derive(Debug, Default)]
pub struct RetentionSignal {
    due: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl RetentionSignal {
    /// Marks a pass due and wakes the task if it sleeps.
    pub fn notify(&self) {
        self.due.set(true);
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }

    /// Resolves once `notify` was called since the last time this resolved.
    ///
    /// # Cancel safety
    /// Cancel safe: a notification that comes while nobody waits stays due.
    async fn notified(&self) {
        std::future::poll_fn(|context| {
            if self.due.replace(false) {
                return Poll::Ready(());
            }
            *self.waker.borrow_mut() = Some(context.waker().clone());
            Poll::Pending
        })
        .await;
    }
}

/// The stats sink of every log a shard opens: fsyncs go to the shard's metrics as before, and an
/// acknowledged roll wakes the shard's retention task.
#[derive(Debug)]
pub struct RetentionSink {
    metrics: Rc<ShardMetrics>,
    signal: Rc<RetentionSignal>,
}

impl RetentionSink {
    pub fn new(metrics: Rc<ShardMetrics>, signal: Rc<RetentionSignal>) -> RetentionSink {
        RetentionSink { metrics, signal }
    }
}

impl LogStats for RetentionSink {
    fn fsync_done(&self, append_count: u64, elapsed: Duration) {
        self.metrics.fsync_done(append_count, elapsed);
    }

    fn segments_sealed(&self) {
        self.signal.notify();
    }
}

/// A topic's retention as the storage log applies it: 0 (no limit) becomes `None`.
pub fn policy_of(retention: Retention) -> RetentionPolicy {
    RetentionPolicy {
        bytes_max: (retention.bytes != 0).then_some(retention.bytes),
        age_max: (retention.ms != 0).then(|| Duration::from_millis(retention.ms)),
    }
}

/// Runs the shard's retention passes until dropped (at shutdown, before the logs close): waits
/// for the interval or an acknowledged roll, then applies each owned partition's retention in
/// turn. A pass that fails on one partition is logged and the others go on; the next pass
/// retries it.
///
/// # Cancel safety
/// Cancel safe in effect: a pass dropped midway leaves each log valid (see
/// `PartitionLog::apply_retention`).
pub async fn run(shard: Rc<Shard>) {
    let interval = shard.config.retention_interval;
    let signal = shard.retention_signal();
    let mut warnings = UnverifiedAgeWarnings::default();
    loop {
        let sleep = std::pin::pin!(compio::time::sleep(interval));
        let notified = std::pin::pin!(signal.notified());
        if let Either::Right(((), _)) = select(sleep, notified).await {
            tracing::debug!(shard = shard.id.0, "retention pass after a segment roll");
        }
        apply_once(&shard, &mut warnings).await;
    }
}

/// When each damaged segment retention met was last warned about, so that one is warned about
/// at most every [`UNVERIFIED_AGE_WARN_INTERVAL`]. Holds only the segments the last pass met (at
/// most one per partition the shard owns).
#[derive(Debug, Default)]
struct UnverifiedAgeWarnings {
    /// (segment path, entry position) -> when it was last warned about.
    warned_at: HashMap<(PathBuf, u64), Instant>,
    /// The segments met by the pass running now.
    met: HashMap<(PathBuf, u64), Instant>,
}

impl UnverifiedAgeWarnings {
    /// Records that the pass running at `now` met `unverified`; whether to warn about it (the
    /// first time, or once [`UNVERIFIED_AGE_WARN_INTERVAL`] has passed since the last warning).
    fn met(&mut self, unverified: &UnverifiedAge, now: Instant) -> bool {
        let key = (unverified.path.clone(), unverified.position);
        let last = self.warned_at.get(&key).copied();
        let warn = last.is_none_or(|last| now.duration_since(last) >= UNVERIFIED_AGE_WARN_INTERVAL);
        self.met
            .insert(key, if warn { now } else { last.unwrap_or(now) });
        warn
    }

    /// Ends a pass: forgets the segments it did not meet (deleted by size, or repaired), so a
    /// segment damaged again later is warned about at once.
    fn end_pass(&mut self) {
        self.warned_at = std::mem::take(&mut self.met);
    }
}

/// One pass over every partition the shard owns whose topic has a retention limit.
async fn apply_once(shard: &Shard, warnings: &mut UnverifiedAgeWarnings) {
    for (namespace, log, retention) in shard.logs_with_retention() {
        let policy = policy_of(retention);
        if policy.is_unlimited() {
            continue;
        }
        match log.apply_retention(policy, SystemTime::now()).await {
            Ok(outcome) => {
                if outcome.deleted_segment_count > 0 {
                    tracing::info!(
                        shard = shard.id.0,
                        %namespace,
                        first_offset = outcome.first_offset,
                        segment_count = outcome.deleted_segment_count,
                        deleted_bytes = outcome.deleted_bytes,
                        "retention moved the partition's first offset"
                    );
                }
                if let Some(unverified) = &outcome.age_unverified {
                    log_unverified_age(shard, namespace, unverified, warnings);
                }
            }
            Err(error) => tracing::warn!(
                shard = shard.id.0,
                %namespace,
                %error,
                "retention pass failed; retried at the next pass"
            ),
        }
    }
    warnings.end_pass();
}

/// Logs that retention by age kept `unverified`'s segment (and those after it) because its last
/// entry is damaged: at warn when `warnings` says so, else at debug.
fn log_unverified_age(
    shard: &Shard,
    namespace: bus::Namespace,
    unverified: &UnverifiedAge,
    warnings: &mut UnverifiedAgeWarnings,
) {
    let message = "retention by age keeps this segment and every later one: the timestamp of its \
                   last entry cannot be verified (see `shardline inspect segment`); a size limit \
                   still applies";
    if warnings.met(unverified, Instant::now()) {
        tracing::warn!(
            shard = shard.id.0,
            %namespace,
            path = %unverified.path.display(),
            position = unverified.position,
            reason = %unverified.reason,
            "{message}"
        );
    } else {
        tracing::debug!(
            shard = shard.id.0,
            %namespace,
            path = %unverified.path.display(),
            position = unverified.position,
            "{message}"
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn issue11_4_retention_interval_is_checked_naming_the_flag() {
        let mut config = crate::ServerConfig::new("data".into());
        assert_eq!(config.retention_interval, Duration::from_secs(10));
        config.retention_interval = Duration::from_millis(5);
        assert_eq!(
            config.validate().unwrap_err().to_string(),
            "invalid --retention-interval value \"5ms\": must be between 10 ms and 86400 s"
        );
        config.retention_interval = Duration::from_millis(10);
        assert!(config.validate().is_ok());
    }

    #[test]
    fn issue12_unverified_age_is_warned_about_once_per_interval() {
        let unverified = |position| UnverifiedAge {
            path: PathBuf::from("/data/partitions/1/1/0/00000000000000000000.log"),
            position,
            reason: "payload checksum differs".to_owned(),
        };
        let mut warnings = UnverifiedAgeWarnings::default();
        let start = Instant::now();
        assert!(warnings.met(&unverified(0), start));
        warnings.end_pass();
        let pass = start + Duration::from_secs(10);
        assert!(
            !warnings.met(&unverified(0), pass),
            "repeated within the interval"
        );
        assert!(warnings.met(&unverified(64), pass), "another entry is new");
        warnings.end_pass();
        let pass = start + UNVERIFIED_AGE_WARN_INTERVAL;
        assert!(warnings.met(&unverified(0), pass), "the interval passed");
        warnings.end_pass();
        // A pass that did not meet it (deleted by size, or repaired) forgets it.
        warnings.end_pass();
        assert!(warnings.met(&unverified(0), pass + Duration::from_secs(10)));
    }

    #[test]
    fn issue11_4_zero_is_no_limit() {
        assert!(policy_of(Retention { bytes: 0, ms: 0 }).is_unlimited());
        assert_eq!(
            policy_of(Retention { bytes: 4096, ms: 0 }),
            RetentionPolicy {
                bytes_max: Some(4096),
                age_max: None
            }
        );
        assert_eq!(
            policy_of(Retention { bytes: 0, ms: 1500 }),
            RetentionPolicy {
                bytes_max: None,
                age_max: Some(Duration::from_millis(1500))
            }
        );
    }
}
