//! A single-threaded oneshot: the writer task completes it, an awaiting task receives the value.
//! It is `!Send` on purpose (one shard, one thread) and must never be shared across threads.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

#[derive(Debug)]
struct Slot<T> {
    value: Option<T>,
    taken: bool,
    waker: Option<Waker>,
}

/// Both ends of a oneshot: clone it, give one clone to the producer, await the other.
#[derive(Debug)]
pub(crate) struct Completion<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

impl<T> Clone for Completion<T> {
    fn clone(&self) -> Self {
        Completion {
            slot: Rc::clone(&self.slot),
        }
    }
}

impl<T> Completion<T> {
    pub(crate) fn new() -> Self {
        Completion {
            slot: Rc::new(RefCell::new(Slot {
                value: None,
                taken: false,
                waker: None,
            })),
        }
    }

    /// A completion that is already complete with `value`.
    pub(crate) fn ready(value: T) -> Self {
        let completion = Completion::new();
        completion.complete(value);
        completion
    }

    /// Stores `value` and wakes the awaiting task, if any. A value stored when nobody awaits any
    /// more is dropped with the last clone.
    ///
    /// # Panics
    /// If completed twice: each completion has exactly one producer.
    pub(crate) fn complete(&self, value: T) {
        let waker = {
            let mut slot = self.slot.borrow_mut();
            assert!(
                slot.value.is_none() && !slot.taken,
                "completion completed twice"
            );
            slot.value = Some(value);
            slot.waker.take()
        };
        if let Some(waker) = waker {
            waker.wake();
        }
    }
}

impl<T> Future for Completion<T> {
    type Output = T;

    fn poll(self: Pin<&mut Self>, context: &mut Context<'_>) -> Poll<T> {
        let mut slot = self.slot.borrow_mut();
        if let Some(value) = slot.value.take() {
            slot.taken = true;
            return Poll::Ready(value);
        }
        assert!(!slot.taken, "completion polled after it returned its value");
        match &slot.waker {
            Some(waker) if waker.will_wake(context.waker()) => {}
            _ => slot.waker = Some(context.waker().clone()),
        }
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn value_reaches_the_awaiting_task() {
        compio::runtime::Runtime::new().unwrap().block_on(async {
            let completion = Completion::<u32>::new();
            let producer = completion.clone();
            compio::runtime::spawn(async move { producer.complete(7) }).detach();
            assert_eq!(completion.await, 7);
            assert_eq!(Completion::ready(3).await, 3);
        });
    }
}
