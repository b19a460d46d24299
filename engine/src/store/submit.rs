//! Writing reserved records: on the caller's threads (written, synced), or by the background
//! writer (buffered). A put is acknowledged only when every earlier record of its segment is
//! written too (the written watermark), so recovery, which stops at the first invalid record,
//! never loses an acknowledged one.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvhoard_format::UNIT_BYTES;

use super::Store;
use crate::buffer::PooledBuf;
use crate::error::{Result, StoreError};
use crate::index::KeyFp;
use crate::log::{Loc, Pos};
use crate::options::Durability;
use crate::parts::Parts;

/// Records of one batch written at once by `submit`, each by its own thread.
const WRITE_PARALLELISM: usize = 4;

/// Batches smaller than this are prepared and written by the calling thread alone: starting
/// threads would cost more than it saves.
pub(super) const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// A reserved record on its way to the device.
#[derive(Debug)]
pub(crate) struct WriteJob {
    pub(super) buf: Arc<PooledBuf>,
    pub(super) loc: Loc,
    pub(super) seq: u64,
    pub(super) key: KeyFp,
}

impl WriteJob {
    /// The log position right after this record.
    pub(super) fn end(&self) -> Pos {
        Pos { seq: self.seq, unit: self.loc.unit + (self.buf.len() as u64 / UNIT_BYTES) as u32 }
    }
}

/// Starts the background writer of buffered puts.
pub(super) fn spawn_writer(parts: Arc<Parts>) -> Result<(SyncSender<WriteJob>, JoinHandle<()>)> {
    let (tx, rx) = sync_channel::<WriteJob>(parts.opts.write_queue_depth.max(1));
    let handle = crate::thread::spawn("kvhoard-writer", move || {
        for job in rx {
            // Buffered puts were acknowledged already; a failure poisons the store and is
            // reported to every later write.
            let _ = parts.write_record(&job);
        }
    })?;
    Ok((tx, handle))
}

impl Store {
    /// Writes reserved records: hands them to the background writer (buffered), or writes them
    /// here and waits until everything before them is written too.
    pub(super) fn submit(&self, jobs: Vec<WriteJob>, durability: Durability) -> Result<()> {
        if durability == Durability::Buffered {
            let tx = self.writer.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(tx, _)| tx.clone());
            let tx = tx.ok_or(StoreError::Closed)?;
            for job in jobs {
                tx.send(job).map_err(|_| StoreError::Closed)?;
            }
            return Ok(());
        }
        self.parts.write_jobs(&jobs)
    }
}

impl Parts {
    /// Writes reserved records on this thread (several at once for a large batch) and waits
    /// until everything before them is written too.
    pub(crate) fn write_jobs(&self, jobs: &[WriteJob]) -> Result<()> {
        let parts = self;
        let bytes: usize = jobs.iter().map(|j| j.buf.len()).sum();
        let workers = jobs.len().min(WRITE_PARALLELISM);
        let first_error = if workers > 1 && bytes >= PARALLEL_MIN_BYTES {
            parts.write_in_parallel(jobs, workers)
        } else {
            let mut first = None;
            for job in jobs {
                if let Err(e) = parts.write_record(job) {
                    first.get_or_insert(e);
                }
            }
            first
        };
        if let Some(e) = first_error {
            return Err(e);
        }
        match jobs.iter().map(WriteJob::end).max() {
            Some(end) => parts.log.wait_written(end),
            None => Ok(()),
        }
    }

    /// Writes `jobs` from `workers` threads: one thread writing record after record keeps one
    /// record in flight; these keep `workers`. Every record is written (or fails) before this
    /// returns; the first error, if any.
    fn write_in_parallel(&self, jobs: &[WriteJob], workers: usize) -> Option<StoreError> {
        std::thread::scope(|s| {
            let writers: Vec<_> = (0..workers)
                .map(|w| {
                    s.spawn(move || {
                        let mut first = None;
                        for job in jobs.iter().skip(w).step_by(workers) {
                            if let Err(e) = self.write_record(job) {
                                first.get_or_insert(e);
                            }
                        }
                        first
                    })
                })
                .collect();
            let mut first = None;
            for writer in writers {
                let result = writer.join().unwrap_or_else(|_| {
                    // Its records may be neither written nor failed: nothing can be trusted.
                    let reason = "a writer thread panicked".to_string();
                    self.log.poison(&mut self.log.lock(), reason.clone());
                    Some(StoreError::Poisoned { reason })
                });
                if let Some(e) = result {
                    first.get_or_insert(e);
                }
            }
            first
        })
    }

    /// Writes one reserved record and marks it written (or poisons the store if it failed, after
    /// taking its key out of the index: its bytes never reached the log).
    pub(super) fn write_record(&self, job: &WriteJob) -> Result<()> {
        let offset = self.log.sb.segment_offset(job.loc.segment) + u64::from(job.loc.unit) * UNIT_BYTES;
        let result = self.log.dev.write_at(&job.buf, offset);
        self.log.record_written(job.loc, job.seq, &result, || {
            let mut index = self.index_write();
            if index.key(&job.key).is_some_and(|k| k.record == job.loc) {
                index.remove_key(&job.key);
            }
        });
        Ok(result?)
    }
}
