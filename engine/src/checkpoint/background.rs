//! The background checkpointer: writes the checkpoints that seals snapshot, off the put path.
//!
//! A checkpoint may only describe records that are durable. A seal snapshots the index when
//! every record reserved so far has been written (a seal waits for the records of its segment,
//! and every older segment is sealed), so one device sync that begins after the snapshot makes
//! everything it describes durable. That sync and the checkpoint's own write cost two flushes of
//! the device (50-250 ms each on a virtio disk); done by the putting thread, they stopped every
//! writer for that long once per `checkpoint_every_segments` segments. Here one thread does
//! them while the log goes on: it syncs through the group commit (so a `synced` put waiting at
//! the same time shares the flush, and the summaries of sealed segments are written after it),
//! then writes the checkpoint.
//!
//! The thread holds only weak references to the log and the checkpoints, so a store dropped
//! without `close` (a panicking caller) still goes away; `close` stops it and waits for it
//! before writing the last checkpoint, so nothing is written to a volume after its lock is
//! released.

use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;

use kvhoard_format::checkpoint::Checkpoint;

use super::Checkpoints;
use crate::error::Result;
use crate::log::{Log, Pos};

/// A snapshot and the log position through which it describes records.
#[derive(Debug)]
pub(crate) struct Job {
    pub(crate) cp: Checkpoint,
    pub(crate) through: Pos,
}

/// Starts the thread; snapshots sent on the returned channel are written in order, a newer one
/// superseding any that has not been started yet.
pub(crate) fn spawn(log: Weak<Log>, checkpoints: Weak<Checkpoints>) -> Result<(Sender<Job>, JoinHandle<()>)> {
    let (tx, rx) = channel::<Job>();
    let handle = crate::thread::spawn("kvhoard-checkpoint", move || run(&log, &checkpoints, &rx))?;
    Ok((tx, handle))
}

fn run(log: &Weak<Log>, checkpoints: &Weak<Checkpoints>, rx: &Receiver<Job>) {
    while let Ok(mut job) = rx.recv() {
        // Only the newest snapshot matters: it describes everything an older one does.
        while let Ok(newer) = rx.try_recv() {
            job = newer;
        }
        let (Some(log), Some(checkpoints)) = (log.upgrade(), checkpoints.upgrade()) else { return };
        write(&log, &checkpoints, &job);
        checkpoints.recycle(job.cp, true);
    }
}

fn write(log: &Arc<Log>, checkpoints: &Arc<Checkpoints>, job: &Job) {
    if let Err(e) = log.sync_to(job.through) {
        // The store is poisoned (a failed sync); every later write reports it.
        tracing::error!(error = %e, "sync before a checkpoint failed; checkpoint not written");
        return;
    }
    if let Err(e) = checkpoints.save(log, &job.cp) {
        // The log is the source of truth: without this checkpoint the next open replays more.
        checkpoints.count_failure();
        tracing::error!(error = %e, "cannot write a checkpoint; the next open will replay more of the log");
    }
}
