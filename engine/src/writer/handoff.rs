//! Where puts leave records for the log writer, and how the writer is woken.

use std::collections::VecDeque;
use std::sync::{Condvar, Mutex, MutexGuard};

use super::WriteJob;
use crate::device::Waker;
use crate::error::StoreError;

/// Records handed to the writer and not yet taken by it, in the order they were handed over.
#[derive(Debug)]
pub(crate) struct Handoff {
    state: Mutex<State>,
    /// The writer waits here when it has nothing in flight.
    arrived: Condvar,
    /// Senders wait here while the queue is full.
    room: Condvar,
    /// Bytes waiting before a sender waits (a sender with a queue that is empty never does).
    limit: u64,
}

#[derive(Default)]
struct State {
    jobs: VecDeque<WriteJob>,
    bytes: u64,
    closed: bool,
    /// The writer is waiting in its device queue for a completion; a sender wakes it with this.
    parked: Option<Waker>,
}

impl std::fmt::Debug for State {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("State").field("jobs", &self.jobs.len()).field("bytes", &self.bytes).finish()
    }
}

/// What the writer took.
pub(super) struct Taken {
    pub(super) jobs: Vec<WriteJob>,
    /// Closed, and nothing was left to take.
    pub(super) finished: bool,
    /// Jobs are still waiting that did not fit in the room given.
    pub(super) crowded: bool,
}

impl Handoff {
    /// A handoff that makes senders wait while `limit` bytes are waiting.
    pub(crate) fn new(limit: u64) -> Handoff {
        Handoff { state: Mutex::default(), arrived: Condvar::new(), room: Condvar::new(), limit: limit.max(1) }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Hands `jobs` to the writer, waiting first while the queue is full. Once closed, gives
    /// them back with the error: they will not be written, and the caller must release them.
    pub(crate) fn send(&self, jobs: Vec<WriteJob>) -> std::result::Result<(), (StoreError, Vec<WriteJob>)> {
        if jobs.is_empty() {
            return Ok(());
        }
        let mut state = self.lock();
        while !state.closed && state.bytes >= self.limit {
            state = self.room.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        if state.closed {
            return Err((StoreError::Closed, jobs));
        }
        for job in jobs {
            state.bytes += job.buf.len() as u64;
            state.jobs.push_back(job);
        }
        if let Some(wake) = state.parked.take() {
            wake();
        }
        drop(state);
        self.arrived.notify_one();
        Ok(())
    }

    /// Takes waiting jobs in order while fewer than `room` bytes are taken: the last may go past
    /// it by less than one record (a rule that took only whole records within the room kept a
    /// single 32 MiB record in flight under the default 64 MiB, since two come to 8 KiB more).
    /// With `block` (the writer has nothing in flight), takes at least one, waiting for it unless
    /// closed.
    pub(super) fn take(&self, room: u64, block: bool) -> Taken {
        let mut state = self.lock();
        while block && state.jobs.is_empty() && !state.closed {
            state = self.arrived.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        let mut jobs = Vec::new();
        let mut bytes = 0u64;
        while let Some(front) = state.jobs.front() {
            let len = front.buf.len() as u64;
            if bytes >= room && !(block && jobs.is_empty()) {
                break;
            }
            bytes += len;
            jobs.extend(state.jobs.pop_front());
        }
        state.bytes -= bytes;
        let finished = state.closed && state.jobs.is_empty() && jobs.is_empty();
        let crowded = !state.jobs.is_empty();
        drop(state);
        if bytes > 0 {
            self.room.notify_all();
        }
        Taken { jobs, finished, crowded }
    }

    /// Before the writer waits in its device queue: leaves `wake` for the next sender, unless
    /// jobs are waiting already (then returns false and the writer must not wait). Once closed
    /// no sender comes, and the writer waits for its writes alone.
    pub(super) fn park(&self, wake: &Waker) -> bool {
        let mut state = self.lock();
        if !state.jobs.is_empty() {
            return false;
        }
        state.parked = Some(std::sync::Arc::clone(wake));
        true
    }

    /// After the writer's wait: a sender need not wake it any more.
    pub(super) fn unpark(&self) {
        self.lock().parked = None;
    }

    /// Refuses new jobs; the writer writes what is waiting and stops.
    pub(crate) fn close(&self) {
        let mut state = self.lock();
        state.closed = true;
        if let Some(wake) = state.parked.take() {
            wake();
        }
        drop(state);
        self.arrived.notify_all();
        self.room.notify_all();
    }
}
