//! Starting the engine's own threads (the buffered writer, the checkpointer).

use std::thread::JoinHandle;

use crate::error::{Result, StoreError};

/// Starts a named engine thread; failing to start one is an error of the volume being opened.
pub(crate) fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|source| StoreError::File {
        action: "cannot start a thread (out of threads or memory?) for",
        path: "<volume>".into(),
        source,
    })
}
