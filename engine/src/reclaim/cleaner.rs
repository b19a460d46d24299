//! The background cleaner: keeps a few segments free by cleaning (`clean.rs`) before the log runs
//! out, so that puts rarely reclaim a segment whole, within an I/O budget so that gets and puts
//! keep their latency. Runs only when placement cleans ([`crate::placement::Placement::cleans`]).

use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::clean::{clean_one, clean_paced};
use super::control::CleanerControl;
use crate::error::Result;
use crate::log::SegState;
use crate::parts::Parts;

/// Free segments the cleaner keeps: a sixteenth of the volume, at least two.
pub fn free_target(segments: u32) -> u32 {
    (segments / 16).max(2)
}

/// Starts the cleaner. It holds the store's parts weakly: it ends when they go, or when stopped.
pub(crate) fn spawn(parts: Weak<Parts>, control: Arc<CleanerControl>) -> Result<JoinHandle<()>> {
    crate::thread::spawn("kvhoard-cleaner", move || {
        while !control.stopping() {
            control.wait();
            let Some(parts) = parts.upgrade() else { return };
            run_while_short(&parts, &control);
        }
    })
}

/// Cleans while free segments are fewer than the target, pacing its writes to the budget.
fn run_while_short(parts: &Parts, control: &CleanerControl) {
    let target = free_target(parts.log.sb.segment_count);
    while !control.stopping() {
        {
            let state = parts.log.lock();
            if state.poisoned.is_some() || state.closed {
                return;
            }
        }
        if parts.free_segments() >= target {
            return;
        }
        match clean_paced(parts, Some(parts.opts.clean_bytes_per_sec)) {
            Ok(Some(_)) => {}
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(error = %e, "cleaning failed; a full volume will reclaim segments whole");
                return;
            }
        }
    }
}

/// Longest a writer waits for the background cleaner's segment before it goes on (and a
/// segment may be reclaimed whole): a cleaning that takes longer is stuck on the device.
const WAIT_FOR_CLEANER: Duration = Duration::from_secs(2);

impl Parts {
    /// Segments free now.
    pub(crate) fn free_segments(&self) -> u32 {
        let state = self.log.lock();
        state.segments.iter().filter(|s| s.state == SegState::Free).count() as u32
    }

    /// Before a write: when placement cleans and free segments run short, wakes the cleaner,
    /// and when only one is left, cleans one right here (the writer waits for the cleaner
    /// rather than have a segment reclaimed whole).
    pub(crate) fn clean_if_short(&self) -> Result<()> {
        if !self.placement.cleans() {
            return Ok(());
        }
        if self.free_segments() < free_target(self.log.sb.segment_count) {
            self.cleaner.wake();
        }
        // With one free segment left, clean one here; when the background cleaner is already
        // cleaning one, wait for it (it frees a segment soon) rather than go on and have a
        // segment reclaimed whole.
        let deadline = Instant::now() + WAIT_FOR_CLEANER;
        while self.free_segments() <= 1 {
            if clean_one(self)?.is_some() || self.log.lock().cleaning.is_none() || Instant::now() >= deadline {
                break;
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }
}
