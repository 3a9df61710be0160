//! One scrape from start to text: ask every shard for its snapshot, read the process figures
//! from `/proc/self`, encode. Runs on a metrics connection's thread, never on a shard. A shard
//! that does not answer is reported (`shardline_shard_up 0`) and logged, at most once per shard
//! per [`MISSING_LOG_INTERVAL`], so a stalled shard scraped every second does not flood the log.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shards::metrics::{GatherError, MetricsGatherer};

use super::encode::{ProcessFigures, Scrape, encode};
use crate::bench::cpu::process_cpu_snapshot;

/// Least time between two log lines about the same missing shard or unreadable process figure.
pub const MISSING_LOG_INTERVAL: Duration = Duration::from_mins(1);

/// What a scrape reads, shared by every metrics connection thread.
#[derive(Debug)]
pub struct ScrapeSource {
    gatherer: Arc<MetricsGatherer>,
    gather_timeout: Duration,
    io_driver: String,
    open_fds_limit: u64,
    log_limiter: LogLimiter,
}

impl ScrapeSource {
    /// A source over `gatherer` that waits up to `gather_timeout` for the shards, reporting
    /// `io_driver` and `open_fds_limit` as they were at startup.
    pub fn new(
        gatherer: Arc<MetricsGatherer>,
        gather_timeout: Duration,
        io_driver: String,
        open_fds_limit: u64,
    ) -> ScrapeSource {
        ScrapeSource {
            gatherer,
            gather_timeout,
            io_driver,
            open_fds_limit,
            log_limiter: LogLimiter::new(MISSING_LOG_INTERVAL),
        }
    }

    /// Gathers and encodes one scrape (OpenMetrics text). Blocks up to the gather timeout.
    pub fn scrape(&self) -> String {
        let started = Instant::now();
        let gathered = self.gatherer.gather(self.gather_timeout);
        for error in gathered
            .shards
            .iter()
            .filter_map(|shard| shard.as_ref().err())
        {
            if self
                .log_limiter
                .allow(&format!("shard {}", missing_shard(error)))
            {
                tracing::warn!(%error, "metrics scrape: a shard did not answer");
            }
        }
        let process = self.process_figures();
        encode(Scrape {
            shards: gathered.shards,
            process,
            io_driver: self.io_driver.clone(),
            scrape_duration: started.elapsed(),
        })
    }

    fn process_figures(&self) -> ProcessFigures {
        let cpu = match process_cpu_snapshot(std::process::id()) {
            Ok(cpu) => Some(cpu),
            Err(error) => {
                if self.log_limiter.allow("process-cpu") {
                    tracing::warn!(%error, "metrics scrape: cannot read the process CPU figures");
                }
                None
            }
        };
        let open_fds = match open_fd_count() {
            Ok(count) => Some(count),
            Err(error) => {
                if self.log_limiter.allow("open-fds") {
                    tracing::warn!(%error, "metrics scrape: cannot count /proc/self/fd");
                }
                None
            }
        };
        ProcessFigures {
            cpu,
            open_fds,
            open_fds_limit: self.open_fds_limit,
        }
    }
}

/// The shard a gather error is about.
fn missing_shard(error: &GatherError) -> u16 {
    match error {
        GatherError::LaneFull { shard }
        | GatherError::Stopped { shard }
        | GatherError::Timeout { shard, .. } => *shard,
    }
}

/// File descriptors this process has open: the entries of `/proc/self/fd`, less the one the
/// listing itself holds open while it reads.
///
/// # Errors
/// `/proc/self/fd` cannot be listed.
pub fn open_fd_count() -> std::io::Result<u64> {
    let mut count: u64 = 0;
    for entry in std::fs::read_dir("/proc/self/fd")? {
        entry?;
        count += 1;
    }
    Ok(count.saturating_sub(1))
}

/// Lets one log line per key through per interval.
#[derive(Debug)]
pub struct LogLimiter {
    interval: Duration,
    last: Mutex<HashMap<String, Instant>>,
}

impl LogLimiter {
    pub fn new(interval: Duration) -> LogLimiter {
        LogLimiter {
            interval,
            last: Mutex::new(HashMap::new()),
        }
    }

    /// Whether a line about `key` may be logged now (and if so, records that it was).
    pub fn allow(&self, key: &str) -> bool {
        let now = Instant::now();
        // A poisoned lock only means another scrape panicked mid-insert; the map is still usable.
        let mut last = self
            .last
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match last.get(key) {
            Some(at) if now.duration_since(*at) < self.interval => false,
            _ => {
                last.insert(key.to_owned(), now);
                true
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_limiter_lets_one_line_per_key_through_per_interval() {
        let limiter = LogLimiter::new(Duration::from_mins(1));
        assert!(limiter.allow("shard 1"));
        assert!(!limiter.allow("shard 1"));
        assert!(limiter.allow("shard 2"));
        let zero = LogLimiter::new(Duration::ZERO);
        assert!(zero.allow("shard 1") && zero.allow("shard 1"));
    }
}
