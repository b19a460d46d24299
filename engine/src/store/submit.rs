//! Handing reserved records to the log writer ([`crate::writer`]), and waiting for them. A put
//! is acknowledged only when every earlier record of its segment is written too (the written
//! watermark), so recovery, which stops at the first invalid record, never loses an
//! acknowledged one.

use std::sync::Arc;

use super::Store;
use crate::device::DeviceError;
use crate::error::Result;
use crate::options::Durability;
use crate::parts::Parts;
use crate::writer::WriteJob;

/// Starts the log writer of a store's parts.
pub(super) fn spawn_writer(parts: &Arc<Parts>) -> Result<std::thread::JoinHandle<()>> {
    let handoff = Arc::clone(&parts.handoff);
    let log = Arc::clone(&parts.log);
    // A failed write's key leaves the index. Weak: the writer must not keep the parts (and the
    // volume's lock) alive; dropping them closes the handoff, which ends the writer.
    let owner = Arc::downgrade(parts);
    crate::writer::spawn(handoff, log, parts.opts.writer, move |job| {
        if let Some(parts) = owner.upgrade() {
            parts.unindex_failed(job);
        }
    })
}

impl Store {
    /// Hands reserved records to the writer and, unless `durability` is buffered, waits until
    /// they and everything before them are written.
    pub(super) fn submit(&self, jobs: Vec<WriteJob>, durability: Durability) -> Result<()> {
        let end = jobs.iter().map(WriteJob::end).max();
        self.parts.hand_over(jobs)?;
        // What placement dropped while these were reserved, while the device writes them.
        crate::reclaim::drops::apply(&self.parts);
        match (durability, end) {
            (Durability::Buffered, _) | (_, None) => Ok(()),
            (_, Some(end)) => self.parts.log.wait_written(end),
        }
    }
}

impl Parts {
    /// Hands reserved records to the writer. If it has stopped (a put racing `close`), they will
    /// never be written: they fail as a failed write does (out of the index, the log poisoned,
    /// no longer in flight), so that nothing waits for them forever and close reports it.
    pub(crate) fn hand_over(&self, jobs: Vec<WriteJob>) -> Result<()> {
        let Err((error, jobs)) = self.handoff.send(jobs) else { return Ok(()) };
        for job in &jobs {
            let never = DeviceError::Io {
                op: "write",
                offset: 0,
                len: job.buf.len() as u64,
                source: std::io::Error::other("the store was closed before the record was written"),
            };
            self.log.record_written(job.loc, job.seq, &Err(never), || self.unindex_failed(job));
        }
        Err(error)
    }

    /// A record's write failed: its bytes never reached the log, so its key must not lead to
    /// them. Runs under the log lock, before anyone waiting for the record is woken.
    fn unindex_failed(&self, job: &WriteJob) {
        let mut index = self.index_write();
        if index.key(&job.key).is_some_and(|k| k.record == job.loc) {
            index.remove_key(&job.key);
        }
    }
}
