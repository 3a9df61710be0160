//! The stats sink of a partition log: what the log reports to its owner about its fsyncs (count,
//! latency, group-commit batch size), for the server's metrics, and when a roll was
//! acknowledged (for retention). The log only reports; the owner
//! decides how to count (the shards crate keeps per-shard `Cell` counters and histograms, one
//! sink shared by every log of a shard so counts survive a deleted partition).
//!
//! A sink is called on the log's own thread, from its writer task, after an fsync returned: it
//! must never block, await or call back into the log.

use std::time::Duration;

/// Receives a log's fsync reports. Implemented by the owner of the logs (one per shard).
pub trait LogStats: std::fmt::Debug {
    /// One segment `fdatasync` succeeded: it took `elapsed` (wall time of the call) and made
    /// `append_count` appends durable (the entries written since the previous fsync of this log:
    /// a whole group under `FsyncPolicy::Always`, 0 for an fsync that covered no new entry, e.g.
    /// the final one at close after an interval fsync).
    fn fsync_done(&self, append_count: u64, elapsed: Duration);

    /// A group of appends that rolled the log was acknowledged: the segments it sealed are now
    /// whole and acknowledged, so retention may delete them (issue 11 section 4: retention runs
    /// "after a roll"). The owner only notes it here; it runs retention from its own task.
    fn segments_sealed(&self) {}
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;

    use super::*;

    /// A sink that records every report, for tests.
    #[derive(Debug, Default)]
    pub(crate) struct RecordingStats {
        pub(crate) fsyncs: RefCell<Vec<(u64, Duration)>>,
        pub(crate) sealed: std::cell::Cell<u32>,
    }

    impl LogStats for RecordingStats {
        fn fsync_done(&self, append_count: u64, elapsed: Duration) {
            self.fsyncs.borrow_mut().push((append_count, elapsed));
        }

        fn segments_sealed(&self) {
            self.sealed.set(self.sealed.get() + 1);
        }
    }
}
