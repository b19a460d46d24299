//! Group commit: one fdatasync serves every writer waiting for one.
//!
//! A writer that needs its record synced asks for the log position after its record. If a sync
//! already covers it, it returns at once; if a sync is running, it waits for it and checks
//! again; otherwise it becomes the leader: it notes how far the log is written, syncs, and
//! publishes that position as synced for everyone.

use std::sync::{Condvar, Mutex};

use super::{Log, Pos};
use crate::error::{Result, StoreError};

/// The group commit of one log.
#[derive(Debug, Default)]
pub(crate) struct GroupCommit {
    state: Mutex<SyncState>,
    done: Condvar,
}

#[derive(Debug, Default)]
struct SyncState {
    synced: Pos,
    leader: bool,
    failed: Option<String>,
}

impl GroupCommit {
    /// The position through which the log is known durable.
    pub(crate) fn synced(&self) -> Pos {
        self.state.lock().unwrap_or_else(|e| e.into_inner()).synced
    }

    /// Returns once everything up to `target` is durable.
    pub(crate) fn sync_to(&self, target: Pos, log: &Log) -> Result<()> {
        let mut state = self.state.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(reason) = &state.failed {
                return Err(StoreError::Poisoned { reason: reason.clone() });
            }
            if state.synced >= target {
                return Ok(());
            }
            if state.leader {
                state = self.done.wait(state).unwrap_or_else(|e| e.into_inner());
                continue;
            }
            state.leader = true;
            drop(state);
            let (through, sealed) = log.sync_point();
            let result = log.sync_device();
            if result.is_ok() {
                // Segments sealed before this sync began are durable now: their summaries may
                // be written (a failure poisons the store, and the next put reports it).
                let _ = log.summarize(&sealed);
            }
            state = self.state.lock().unwrap_or_else(|e| e.into_inner());
            state.leader = false;
            match result {
                Ok(()) => state.synced = state.synced.max(through),
                Err(e) => {
                    // After a failed fdatasync the kernel may have dropped the dirty pages:
                    // nothing written so far can be called durable any more.
                    let reason = e.to_string();
                    state.failed = Some(reason.clone());
                    log.poison(&mut log.lock(), reason);
                }
            }
            self.done.notify_all();
        }
    }
}
