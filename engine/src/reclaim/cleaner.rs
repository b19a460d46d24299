//! The background cleaner: keeps a few segments free by cleaning (`clean.rs`) before the log runs
//! out, so that puts rarely reclaim a segment whole, within an I/O budget so that gets and puts
//! keep their latency. Runs only when placement cleans ([`crate::placement::Placement::cleans`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::clean::clean_one;
use crate::error::Result;
use crate::log::SegState;
use crate::parts::Parts;

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

    fn wait(&self) {
        let guard = self.wake.lock().unwrap_or_else(|e| e.into_inner());
        let (mut woken, _) =
            self.woken.wait_timeout_while(guard, IDLE_WAIT, |w| !*w).unwrap_or_else(|e| e.into_inner());
        *woken = false;
    }
}

/// Free segments the cleaner keeps: a sixteenth of the volume, at least two.
pub fn free_target(segments: u32) -> u32 {
    (segments / 16).max(2)
}

/// Starts the cleaner. It holds the store's parts weakly: it ends when they go, or when stopped.
pub(crate) fn spawn(parts: Weak<Parts>, control: Arc<CleanerControl>) -> Result<JoinHandle<()>> {
    crate::thread::spawn("kvhoard-cleaner", move || {
        while !control.stop.load(Ordering::Acquire) {
            control.wait();
            let Some(parts) = parts.upgrade() else { return };
            run_while_short(&parts, &control);
        }
    })
}

/// Cleans while free segments are fewer than the target, pacing its writes to the budget.
fn run_while_short(parts: &Parts, control: &CleanerControl) {
    let target = free_target(parts.log.sb.segment_count);
    let budget = parts.opts.clean_bytes_per_sec.max(1);
    while !control.stop.load(Ordering::Acquire) {
        let free = {
            let state = parts.log.lock();
            if state.poisoned.is_some() || state.closed {
                return;
            }
            state.segments.iter().filter(|s| s.state == SegState::Free).count() as u32
        };
        if free >= target {
            return;
        }
        let started = Instant::now();
        match clean_one(parts) {
            Ok(Some(cleaned)) => {
                // Relocations written at the budget's pace at most.
                let due = Duration::from_secs_f64(cleaned.relocated_bytes as f64 / budget as f64);
                if let Some(rest) = due.checked_sub(started.elapsed()) {
                    std::thread::sleep(rest);
                }
            }
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cleaning failed; a full volume will reclaim segments whole");
                return;
            }
        }
    }
}
