//! Starting the engine's own threads (the buffered writer, the checkpointer, the cleaner, group
//! TTL's planner, recovery's reader of summaries), and stopping the periodic ones.

use std::thread::JoinHandle;

use crate::error::{Result, StoreError};

/// Starts a named engine thread; failing to start one is an error of the volume being opened.
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(not_started)
}

/// Starts a named engine thread in `scope` (one that borrows from its caller, joined when the
/// scope ends); failing to start one is an error of the volume being opened.
pub(crate) fn spawn_scoped<'scope>(
    scope: &'scope std::thread::Scope<'scope, '_>,
    name: &str,
    f: impl FnOnce() + Send + 'scope,
) -> Result<std::thread::ScopedJoinHandle<'scope, ()>> {
    std::thread::Builder::new().name(name.into()).spawn_scoped(scope, f).map_err(not_started)
}

/// The error of a thread that could not be started.
fn not_started(source: std::io::Error) -> StoreError {
    StoreError::File {
        action: "cannot start a thread (out of threads or memory?) for",
        path: "<volume>".into(),
        source,
    }
}

/// Ends a periodic engine thread: it waits between rounds with [`Stopper::wait`], and
/// [`Stopper::stop`] ends the wait at once.
#[derive(Debug, Default)]
pub(crate) struct Stopper {
    stopped: std::sync::Mutex<bool>,
    woken: std::sync::Condvar,
}

impl Stopper {
    /// Asks the thread to stop.
    pub(crate) fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.woken.notify_all();
    }

    /// Whether the thread was asked to stop.
    pub(crate) fn stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits `period` or until stopped; returns whether the thread is to stop.
    pub(crate) fn wait(&self, period: std::time::Duration) -> bool {
        let guard = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        let (stopped, _) = self.woken.wait_timeout_while(guard, period, |s| !*s).unwrap_or_else(|e| e.into_inner());
        *stopped
    }
}
