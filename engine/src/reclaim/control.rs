//! The cleaner's controls, shared by the store (which wakes and stops it) and the cleaner thread
//! (which waits on them). Kept apart from the cleaner so that the store's parts can hold them
//! without depending on the cleaning code.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How often the cleaner looks when nothing wakes it.
const IDLE_WAIT: Duration = Duration::from_millis(100);

/// The cleaner's controls, shared with the store.
#[derive(Debug, Default)]
pub(crate) struct CleanerControl {
    stop: AtomicBool,
    wake: Mutex<bool>,
    woken: Condvar,
}

impl CleanerControl {
    /// Asks the cleaner to look now (a put found few free segments).
    pub(crate) fn wake(&self) {
        *self.wake.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.woken.notify_one();
    }

    /// Asks the cleaner to stop after what it is doing.
    pub(crate) fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        self.wake();
    }

    /// Whether the cleaner was asked to stop.
    pub(super) fn stopping(&self) -> bool {
        self.stop.load(Ordering::Acquire)
    }

    /// Waits until woken, or for the idle period.
    pub(super) fn wait(&self) {
        let guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) =
            self.woken.wait_timeout_while(guard, IDLE_WAIT, |w| !*w).unwrap_or_else(|e| e.into_inner());
        *woken = false;
    }
}
