//! Connections waiting for their next request, so that a server at its connection limit makes
//! room for a new client by closing the one idle the longest, instead of refusing every newcomer
//! while sockets that send nothing hold all the slots.
//!
//! Closed first: connections that never finished a request (oldest first: what a client that
//! opens sockets and sends nothing holds), then those idle the longest between requests. A
//! connection in the middle of a request is never closed for room.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio::sync::Notify;

/// Ordering of idle connections: never served first, then by when they went idle.
type Slot = (bool, Instant, u64);

/// The connections waiting for their next request.
#[derive(Default)]
pub(crate) struct Idle {
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    next_id: u64,
    waiting: BTreeMap<Slot, Arc<Notify>>,
}

/// A connection's place among the idle ones while it waits; leaves it when dropped.
pub(crate) struct Waiting<'a> {
    idle: &'a Idle,
    slot: Slot,
    /// Notified when the connection is to close to make room.
    pub(crate) close: Arc<Notify>,
}

impl Idle {
    /// Registers a connection that starts waiting now; `served`: it has sent a request before.
    pub(crate) fn wait(&self, served: bool) -> Waiting<'_> {
        let close = Arc::new(Notify::new());
        let mut inner = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let slot = (served, Instant::now(), inner.next_id);
        inner.next_id += 1;
        inner.waiting.insert(slot, Arc::clone(&close));
        Waiting { idle: self, slot, close }
    }

    /// How many connections wait.
    pub(crate) fn len(&self) -> usize {
        self.inner.lock().unwrap_or_else(|e| e.into_inner()).waiting.len()
    }

    /// Tells the connection idle the longest to close; false when none is idle.
    pub(crate) fn close_longest(&self) -> bool {
        let first = self.inner.lock().unwrap_or_else(|e| e.into_inner()).waiting.pop_first();
        match first {
            // A permit is stored if the connection is not yet waiting on it: no wake-up is lost.
            Some((_, close)) => {
                close.notify_one();
                true
            }
            None => false,
        }
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.idle.inner.lock().unwrap_or_else(|e| e.into_inner()).waiting.remove(&self.slot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_never_served_go_first_then_the_longest_idle() {
        let idle = Idle::default();
        let served_early = idle.wait(true);
        let fresh = idle.wait(false);
        let served_late = idle.wait(true);
        let order = [&fresh, &served_early, &served_late];
        for w in order {
            assert!(idle.close_longest());
            // The permit is stored: the waiter sees it even though it was not waiting yet.
            let notified = w.close.notified();
            assert_ready(notified);
        }
        assert!(!idle.close_longest());
        drop((served_early, fresh, served_late));
        assert!(idle.inner.lock().unwrap().waiting.is_empty());
    }

    /// Polls `f` once; panics unless it is ready.
    fn assert_ready<F: std::future::Future>(f: F) {
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = std::pin::pin!(f);
        assert!(f.as_mut().poll(&mut cx).is_ready(), "the close was not signalled");
    }
}
