//! Parked polls (issue 11 section 3): the polls with a wait that found no message at their offset,
//! held on the owner shard until the partition grows, their wait ends, or the server stops.
//!
//! A parked poll is a future holding a slot in this shard's bounded set; an append to its
//! partition wakes it through the slot's waker, its timeout is a runtime timer, and the stop
//! signal releases every slot at once. It must never spin: nothing here polls, sleeps in a loop
//! or wakes a poll that has nothing new.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

use ahash::AHashMap;
use bus::Namespace;

/// Why a parked poll stopped waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Its partition was appended to (or had data when the poll arrived).
    Appended,
    /// Its wait passed with nothing new.
    TimedOut,
    /// The server is stopping (SIGINT/SIGTERM, or a shard failed).
    Stopped,
}

/// Why a poll could not be parked.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParkError {
    /// The shard already holds `parked_max` parked polls (`serve --parked-polls-max`): the
    /// client retries later, or polls without a wait.
    #[error(
        "shard {shard} already holds {parked_max} parked polls (serve --parked-polls-max); \
         poll again later, or without a wait"
    )]
    Full { shard: u16, parked_max: usize },
    /// The server is stopping: nothing parks any more.
    #[error("the server is stopping; polls are no longer parked")]
    Stopped,
}

/// One parked poll's slot: the waker of its task and, once released, why.
#[derive(Debug, Default)]
struct Slot {
    release: Cell<Option<Release>>,
    waker: RefCell<Option<Waker>>,
}

impl Slot {
    fn release(&self, release: Release) {
        self.release.set(Some(release));
        if let Some(waker) = self.waker.borrow_mut().take() {
            waker.wake();
        }
    }
}

/// The parked polls of one shard, by partition. Single-threaded (`Rc`), like the shard.
///
/// Invariant: `parked_count` is the number of slots in `by_namespace`, never above `parked_max`.
#[derive(Debug)]
pub struct ParkedPolls {
    shard: u16,
    parked_max: usize,
    by_namespace: RefCell<AHashMap<Namespace, AHashMap<u64, Rc<Slot>>>>,
    parked_count: Cell<usize>,
    slot_id_next: Cell<u64>,
    stopped: Cell<bool>,
}

impl ParkedPolls {
    /// An empty set for shard `shard` holding at most `parked_max` polls.
    pub fn new(shard: u16, parked_max: usize) -> Rc<ParkedPolls> {
        Rc::new(ParkedPolls {
            shard,
            parked_max,
            by_namespace: RefCell::default(),
            parked_count: Cell::new(0),
            slot_id_next: Cell::new(0),
            stopped: Cell::new(false),
        })
    }

    /// Polls parked now.
    pub fn parked_count(&self) -> usize {
        self.parked_count.get()
    }

    /// Parks a poll of `namespace`: the returned future resolves to `Release::Appended` at the
    /// next `release_partition(namespace)`, or `Release::Stopped` at `release_all`. The caller
    /// bounds it with a timeout (a runtime timer) and checks, in the same synchronous step as this
    /// call, that the partition has nothing at its offset, so no append can be missed.
    ///
    /// # Errors
    /// - `ParkError::Full` when `parked_max` polls are parked already.
    /// - `ParkError::Stopped` after `release_all` (the server is stopping).
    pub fn park(self: &Rc<Self>, namespace: Namespace) -> Result<ParkedPoll, ParkError> {
        if self.stopped.get() {
            return Err(ParkError::Stopped);
        }
        if self.parked_count.get() >= self.parked_max {
            return Err(ParkError::Full {
                shard: self.shard,
                parked_max: self.parked_max,
            });
        }
        let id = self.slot_id_next.get();
        self.slot_id_next.set(id + 1);
        let slot = Rc::new(Slot::default());
        self.by_namespace
            .borrow_mut()
            .entry(namespace)
            .or_default()
            .insert(id, Rc::clone(&slot));
        self.parked_count.set(self.parked_count.get() + 1);
        Ok(ParkedPoll {
            set: Rc::clone(self),
            namespace,
            id,
            slot,
        })
    }

    /// Releases every poll parked on `namespace` with `Release::Appended` (its log acknowledged
    /// new messages, or the partition went away: the woken polls read and answer what is there).
    /// Returns how many were released.
    pub fn release_partition(&self, namespace: Namespace) -> usize {
        let Some(slots) = self.by_namespace.borrow_mut().remove(&namespace) else {
            return 0;
        };
        self.parked_count.set(self.parked_count.get() - slots.len());
        for slot in slots.values() {
            slot.release(Release::Appended);
        }
        slots.len()
    }

    /// Releases every parked poll with `Release::Stopped` and refuses later parks: the stop
    /// signal fired, and the drain waits for every connection's request to be answered. Returns
    /// how many were released.
    pub fn release_all(&self) -> usize {
        self.stopped.set(true);
        let all = std::mem::take(&mut *self.by_namespace.borrow_mut());
        self.parked_count.set(0);
        let mut released = 0;
        for slot in all.values().flat_map(|slots| slots.values()) {
            slot.release(Release::Stopped);
            released += 1;
        }
        released
    }

    /// Removes slot `id` of `namespace` if it is still parked (its future was dropped: timed out
    /// or cancelled).
    fn forget(&self, namespace: Namespace, id: u64) {
        let mut by_namespace = self.by_namespace.borrow_mut();
        let Some(slots) = by_namespace.get_mut(&namespace) else {
            return;
        };
        if slots.remove(&id).is_some() {
            self.parked_count.set(self.parked_count.get() - 1);
        }
        if slots.is_empty() {
            by_namespace.remove(&namespace);
        }
    }
}

/// A parked poll: resolves when released (`ParkedPolls::park`). Dropping it unparks it.
///
/// # Cancel safety
/// Cancel safe: dropping it (a timeout, a cancelled task) frees its slot and loses nothing.
#[derive(Debug)]
pub struct ParkedPoll {
    set: Rc<ParkedPolls>,
    namespace: Namespace,
    id: u64,
    slot: Rc<Slot>,
}

impl Future for ParkedPoll {
    type Output = Release;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<Release> {
        if let Some(release) = self.slot.release.get() {
            return Poll::Ready(release);
        }
        let mut waker = self.slot.waker.borrow_mut();
        match waker.as_mut() {
            Some(stored) => stored.clone_from(context.waker()),
            None => *waker = Some(context.waker().clone()),
        }
        Poll::Pending
    }
}

impl Drop for ParkedPoll {
    fn drop(&mut self) {
        if self.slot.release.get().is_none() {
            self.set.forget(self.namespace, self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn namespace(partition: u16) -> Namespace {
        Namespace::new(1, 1, partition)
    }

    fn poll_once(parked: &mut ParkedPoll) -> Poll<Release> {
        let mut context = Context::from_waker(Waker::noop());
        Pin::new(parked).poll(&mut context)
    }

    #[test]
    fn issue11_3_an_append_releases_only_its_partition() {
        let set = ParkedPolls::new(0, 8);
        let mut first = set.park(namespace(0)).unwrap();
        let mut other = set.park(namespace(1)).unwrap();
        assert_eq!(poll_once(&mut first), Poll::Pending);
        assert_eq!(set.parked_count(), 2);
        assert_eq!(set.release_partition(namespace(0)), 1);
        assert_eq!(poll_once(&mut first), Poll::Ready(Release::Appended));
        assert_eq!(poll_once(&mut other), Poll::Pending);
        assert_eq!(set.parked_count(), 1);
        drop(first);
        assert_eq!(set.parked_count(), 1);
    }

    #[test]
    fn issue11_3_the_bound_refuses_and_a_dropped_poll_frees_its_slot() {
        let set = ParkedPolls::new(3, 2);
        let first = set.park(namespace(0)).unwrap();
        let _second = set.park(namespace(0)).unwrap();
        assert_eq!(
            set.park(namespace(0)).unwrap_err(),
            ParkError::Full {
                shard: 3,
                parked_max: 2
            }
        );
        drop(first);
        assert_eq!(set.parked_count(), 1);
        let _third = set.park(namespace(0)).unwrap();
        assert_eq!(set.parked_count(), 2);
    }

    #[test]
    fn issue11_3_stop_releases_everything_and_refuses_later_parks() {
        let set = ParkedPolls::new(0, 8);
        let mut first = set.park(namespace(0)).unwrap();
        let mut second = set.park(namespace(5)).unwrap();
        assert_eq!(set.release_all(), 2);
        assert_eq!(poll_once(&mut first), Poll::Ready(Release::Stopped));
        assert_eq!(poll_once(&mut second), Poll::Ready(Release::Stopped));
        assert_eq!(set.parked_count(), 0);
        assert_eq!(set.park(namespace(0)).unwrap_err(), ParkError::Stopped);
    }
}
