//! A fault-injecting seam for the write paths of the partition log and the metadata journal: a
//! test asks that the Nth write (or fsync) from now fail with a given errno, a number of times,
//! and then stop failing, to drive the recovery paths without a failing disk.
//!
//! It is always compiled in and costs one `RefCell` borrow per write or fsync when unarmed; it
//! must never fail an operation it was not armed for. `!Send`, like the logs it is attached to.

use std::cell::RefCell;
use std::io;
use std::rc::Rc;

/// The kind of operation a fault applies to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultOp {
    /// A data write (a log's vectored entry write, a journal's record write). An injected write
    /// fault first writes half of the first buffer, as a real short write before `ENOSPC` does,
    /// so the partial bytes must be rolled back.
    Write,
    /// An `fdatasync` of a segment.
    Fsync,
    /// An open by a partition log's writer that allocates a descriptor: the creation of a
    /// segment at a roll, and the open of the log directory for its fsync (after a roll, or in a
    /// rollback). An injected fault opens nothing, as an open refused with `EMFILE` does.
    Open,
    /// The `O_DIRECT` open of the active segment by a log in direct write mode
    /// (`WriteMode::Direct`). An injected fault opens nothing; `EINVAL` makes the log fall back
    /// to buffered writes, as a filesystem that refuses `O_DIRECT` does.
    DirectOpen,
    /// The write of a partition log's producer-state snapshot at a segment roll (a derived file;
    /// a separate kind so that arming it does not shift the count of entry writes). An injected
    /// fault writes nothing.
    ProducerSnapshotWrite,
}

#[derive(Debug, Default)]
struct Plan {
    armed: Option<Armed>,
}

#[derive(Debug, Clone, Copy)]
struct Armed {
    op: FaultOp,
    /// Operations of kind `op` still to pass before the first failure.
    skip_count: u32,
    /// Failures still to inject.
    fail_count: u32,
    errno: i32,
}

/// A handle on the faults of one log or journal (`PartitionLog::fault_injector`,
/// `Journal::fault_injector`); clones share the plan.
#[derive(Debug, Clone, Default)]
pub struct FaultInjector {
    plan: Rc<RefCell<Plan>>,
}

impl FaultInjector {
    /// Arms one fault: operations of kind `op` pass `skip_count` times, then the next
    /// `fail_count` fail with `errno` (an `io::Error::from_raw_os_error`), then all pass again.
    /// Replaces any fault armed before.
    pub fn fail(&self, op: FaultOp, skip_count: u32, fail_count: u32, errno: i32) {
        self.plan.borrow_mut().armed = Some(Armed {
            op,
            skip_count,
            fail_count,
            errno,
        });
    }

    /// Disarms any fault.
    pub fn clear(&self) {
        self.plan.borrow_mut().armed = None;
    }

    /// Called by the writers before each operation of kind `op`.
    ///
    /// # Errors
    /// The armed errno when this operation is one the plan fails.
    pub(crate) fn check(&self, op: FaultOp) -> io::Result<()> {
        let mut plan = self.plan.borrow_mut();
        let Some(armed) = plan.armed.as_mut() else {
            return Ok(());
        };
        if armed.op != op {
            return Ok(());
        }
        if armed.skip_count > 0 {
            armed.skip_count -= 1;
            return Ok(());
        }
        let errno = armed.errno;
        armed.fail_count -= 1;
        if armed.fail_count == 0 {
            plan.armed = None;
        }
        Err(io::Error::from_raw_os_error(errno))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fails_the_nth_operation_then_passes() {
        let faults = FaultInjector::default();
        faults.fail(FaultOp::Write, 1, 2, libc::ENOSPC);
        assert!(faults.check(FaultOp::Fsync).is_ok());
        assert!(faults.check(FaultOp::Write).is_ok());
        let errors = [faults.check(FaultOp::Write), faults.check(FaultOp::Write)];
        for error in errors {
            assert_eq!(error.unwrap_err().raw_os_error(), Some(libc::ENOSPC));
        }
        assert!(faults.check(FaultOp::Write).is_ok());
        assert!(faults.check(FaultOp::Write).is_ok());
    }
}
