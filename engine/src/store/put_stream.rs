//! A large batched put, streamed: a worker per core takes the batch's blocks one at a time and
//! prepares each (hashes, compresses, checksums, copies it into its record buffer), and this
//! thread appends them to the log in the batch's order as soon as each and every block before it
//! are ready. The disk writes the first blocks while the CPUs prepare the next ones, and no
//! worker waits for the others at a group's end (preparing the batch in groups, each group on
//! every core, left a core idle at the end of each group while the slowest block finished).
//!
//! Bounded memory: a worker takes a block only while the blocks prepared but not yet appended
//! hold less than [`AHEAD_BYTES`] (one at least, whatever its size); appended blocks are bounded
//! by the log writer's bytes in flight.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex};

use kvhoard_format::record::RecordHeader;

use super::append::{Coding, Prepared};
use super::Store;
use crate::error::{Result, StoreError};
use crate::log::Pos;
use crate::options::Durability;

/// Bytes of blocks prepared ahead of the log: enough to keep the writer fed while the next
/// blocks are prepared, and two 32 MiB blocks (an 8B model's 256-token chunk) on two cores at
/// once; few enough that a batch of any size holds little memory.
const AHEAD_BYTES: usize = 64 << 20;

/// The blocks taken by workers and not yet appended, in bytes; workers wait on it.
struct Ahead {
    bytes: Mutex<usize>,
    freed: Condvar,
    /// Set when the batch failed: workers take nothing more.
    stop: AtomicBool,
}

impl Ahead {
    fn new() -> Ahead {
        Ahead { bytes: Mutex::new(0), freed: Condvar::new(), stop: AtomicBool::new(false) }
    }

    /// Waits until `len` more bytes fit (or nothing is ahead), then counts them; false once the
    /// batch has stopped.
    fn take(&self, len: usize) -> bool {
        let mut ahead = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        while *ahead > 0 && *ahead + len > AHEAD_BYTES && !self.stop.load(Ordering::Acquire) {
            ahead = self.freed.wait(ahead).unwrap_or_else(|e| e.into_inner());
        }
        *ahead += len;
        !self.stop.load(Ordering::Acquire)
    }

    fn release(&self, len: usize) {
        let mut ahead = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        *ahead = ahead.saturating_sub(len);
        self.freed.notify_all();
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let _guard = self.bytes.lock().unwrap_or_else(|e| e.into_inner());
        self.freed.notify_all();
    }
}

/// Stops the batch when dropped.
struct StopOnDrop<'a>(&'a Ahead);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.stop();
    }
}

impl Store {
    /// Prepares `checked` on `workers` threads and appends each block in order as soon as it and
    /// every one before it are ready; returns the blocks' hashes, in order, and the end of the
    /// last record. Nothing is waited for beyond the hand-over to the log writer.
    pub(super) fn append_streamed(
        &self,
        namespace: &str,
        checked: Vec<(RecordHeader, &[u8])>,
        codec: Coding,
        workers: usize,
    ) -> Result<(Vec<[u8; 32]>, Pos)> {
        let parts = &*self.parts;
        let count = checked.len();
        let sizes: Vec<usize> = checked.iter().map(|(_, b)| b.len()).collect();
        let queue = Mutex::new(checked.into_iter().enumerate().peekable());
        let ahead = Ahead::new();
        let (tx, rx) = std::sync::mpsc::channel::<(usize, Prepared<'_>)>();
        std::thread::scope(|s| {
            for _ in 0..workers.max(1) {
                let tx = tx.clone();
                let (queue, ahead) = (&queue, &ahead);
                s.spawn(move || loop {
                    // Blocks pass the bound in the batch's order (the next one waits for room
                    // with the queue locked), so every block counted ahead follows only blocks
                    // that are counted too: they will all be prepared, and appended, and room
                    // is always made. The lock is released before the block is prepared.
                    let next = {
                        let mut queue = queue.lock().unwrap_or_else(|e| e.into_inner());
                        let Some(len) = queue.peek().map(|(_, (_, bytes))| bytes.len()) else { return };
                        if !ahead.take(len) {
                            return;
                        }
                        queue.next()
                    };
                    let Some((i, (header, bytes))) = next else { return };
                    // A panic here would leave block i missing, and the blocks after it would
                    // wait for room forever: the batch is stopped instead, and fails.
                    let prepare = || parts.prepare(namespace, header, bytes, codec, false);
                    let Ok(prepared) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(prepare)) else {
                        ahead.stop();
                        return;
                    };
                    if tx.send((i, prepared)).is_err() {
                        return;
                    }
                });
            }
            drop(tx);
            // Whatever way the appending ends, an error or a panic included, no worker is left
            // waiting for room.
            let _stop = StopOnDrop(&ahead);
            self.append_in_order(rx, count, &sizes, &ahead)
        })
    }

    /// Receives prepared blocks in any order and appends each run that continues the batch's
    /// order; releases their bytes to the workers.
    fn append_in_order<'a>(
        &self,
        rx: std::sync::mpsc::Receiver<(usize, Prepared<'a>)>,
        count: usize,
        sizes: &[usize],
        ahead: &Ahead,
    ) -> Result<(Vec<[u8; 32]>, Pos)> {
        let mut waiting: BTreeMap<usize, Prepared<'a>> = BTreeMap::new();
        let mut hashes = Vec::with_capacity(count);
        let mut last_end = Pos::default();
        while hashes.len() < count {
            // Every sender gone before the batch is whole: a worker ended without its block.
            let (i, prepared) =
                rx.recv().map_err(|_| StoreError::invalid("put", "a thread preparing the batch stopped"))?;
            waiting.insert(i, prepared);
            let mut run = Vec::new();
            while let Some(p) = waiting.remove(&(hashes.len() + run.len())) {
                run.push(p);
            }
            if run.is_empty() {
                continue;
            }
            let first = hashes.len();
            hashes.extend(run.iter().map(|p| p.header.content_hash));
            last_end = last_end.max(self.append_all(&mut run, Durability::Buffered)?);
            ahead.release(sizes.get(first..hashes.len()).unwrap_or_default().iter().sum());
        }
        Ok((hashes, last_end))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_block_waits_for_room_unless_nothing_is_ahead_and_a_stop_ends_the_wait() {
        let ahead = Ahead::new();
        assert!(ahead.take(2 * AHEAD_BYTES), "a block larger than the bound passes when alone");
        std::thread::scope(|s| {
            let waiter = s.spawn(|| ahead.take(1));
            ahead.release(2 * AHEAD_BYTES);
            assert!(waiter.join().unwrap(), "room made");
        });
        assert_eq!(*ahead.bytes.lock().unwrap(), 1);
        assert!(ahead.take(AHEAD_BYTES - 1), "up to the bound");
        std::thread::scope(|s| {
            let waiter = s.spawn(|| ahead.take(1));
            ahead.stop();
            assert!(!waiter.join().unwrap(), "a stopped batch takes nothing more");
        });
        assert!(!ahead.take(0));
    }
}
