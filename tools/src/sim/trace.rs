//! The event log of one simulated run: every event as one line, folded into a running XXH3-64
//! digest (the "trace digest" a seed prints), with the last few lines kept for a failure report.
//! Two runs of one seed must produce the same lines in the same order, hence the same digest.
//! It must never hold the whole log (a long soak would grow without bound).

use std::collections::VecDeque;
use std::hash::Hasher as _;

use twox_hash::XxHash3_64;

/// Lines kept for a failure report.
pub const TRACE_TAIL_LEN: usize = 30;

/// The digest and tail of a run's events.
pub struct Trace {
    /// Print every line to stderr as it is recorded (`shardline sim --trace`).
    echo: bool,
    digest: XxHash3_64,
    tail: VecDeque<String>,
    event_count: u64,
}

impl std::fmt::Debug for Trace {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Trace")
            .field("event_count", &self.event_count)
            .field("digest", &self.digest())
            .finish_non_exhaustive()
    }
}

impl Default for Trace {
    fn default() -> Self {
        Trace::new()
    }
}

impl Trace {
    pub fn new() -> Trace {
        Trace {
            echo: false,
            digest: XxHash3_64::new(),
            tail: VecDeque::with_capacity(TRACE_TAIL_LEN + 1),
            event_count: 0,
        }
    }

    /// Prints every later line to stderr as well.
    pub fn echo_to_stderr(&mut self) {
        self.echo = true;
    }

    /// Records one event line (at tick `tick`).
    pub fn event(&mut self, tick: u64, line: &str) {
        let line = format!("t{tick} {line}");
        self.digest.write(line.as_bytes());
        self.digest.write(b"\n");
        self.event_count += 1;
        if self.echo {
            eprintln!("{line}");
        }
        if self.tail.len() == TRACE_TAIL_LEN {
            self.tail.pop_front();
        }
        self.tail.push_back(line);
    }

    /// XXH3-64 of every line so far, each followed by a newline.
    pub fn digest(&self) -> u64 {
        self.digest.finish()
    }

    pub fn event_count(&self) -> u64 {
        self.event_count
    }

    /// The last [`TRACE_TAIL_LEN`] lines, oldest first.
    pub fn tail(&self) -> Vec<String> {
        self.tail.iter().cloned().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn digest_depends_on_every_line_and_its_order() {
        let mut a = Trace::new();
        let mut b = Trace::new();
        for trace in [&mut a, &mut b] {
            trace.event(1, "x");
            trace.event(2, "y");
        }
        assert_eq!(a.digest(), b.digest());
        let mut c = Trace::new();
        c.event(2, "y");
        c.event(1, "x");
        assert_ne!(a.digest(), c.digest());
        for index in 0..100 {
            a.event(3, &format!("e{index}"));
        }
        assert_eq!(a.tail().len(), TRACE_TAIL_LEN);
        assert_eq!(a.tail().last().unwrap(), "t3 e99");
        assert_eq!(a.event_count(), 102);
    }
}
