//! Checkpoints: the index written out so that opening a volume reads one structure and the
//! segments written after it, not every summary.
//!
//! - `io.rs`: where they are kept (a file beside a directory volume, or two slots on a device).
//! - `background.rs`: the thread that syncs and writes the periodic ones, off the put path.
//! - [`Checkpoints`]: taking a snapshot (under the log lock, with no record in flight, so that
//!   it describes a written prefix of the log), saving it unless a newer one was saved, and
//!   knowing what the newest one on disk covers, which decides whether reclaiming a segment
//!   other than the oldest needs a checkpoint first.

mod background;
mod io;

pub(crate) use background::{spawn as spawn_background, Job};
pub use io::CHECKPOINT_FILE;
pub(crate) use io::{CheckpointStore, LoadError};

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Mutex, RwLock};

use kvhoard_format::checkpoint::{Checkpoint, SegmentState};

use crate::clock::Clock;
use crate::error::Result;
use crate::index::Index;
use crate::log::{Log, LogState, Pos};

/// A segment as reclaim's checkpoint decision sees it: its current use and where it ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SealedSegment {
    /// Segment index.
    pub(crate) index: u32,
    /// Seq of its current use.
    pub(crate) seq: u64,
    /// First unit after its records.
    pub(crate) end_unit: u32,
}

/// The volume's checkpoints.
#[derive(Debug)]
pub(crate) struct Checkpoints {
    /// Where they are kept.
    pub(crate) store: CheckpointStore,
    /// Seq of the newest checkpoint written; serializes checkpoint writes.
    saved: Mutex<u64>,
    /// The seq and segment table of the newest checkpoint on disk (what recovery would not
    /// replay). A leaf lock.
    covers: Mutex<(u64, Vec<SegmentState>)>,
    /// Snapshots for the background thread; `None` once it is stopped.
    jobs: Mutex<Option<Sender<Job>>>,
    /// Checkpoints written.
    written: AtomicU64,
    /// Checkpoints that could not be written.
    failed: AtomicU64,
}

impl Checkpoints {
    /// The checkpoints of a volume whose newest checkpoint on disk, `seq`, covers `covers` (0
    /// and empty without one).
    pub(crate) fn new(store: CheckpointStore, seq: u64, covers: Vec<SegmentState>) -> Checkpoints {
        Checkpoints {
            store,
            saved: Mutex::new(0),
            covers: Mutex::new((seq, covers)),
            jobs: Mutex::new(None),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
        }
    }

    /// Checkpoints written since open.
    pub(crate) fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Checkpoints that could not be written since open.
    pub(crate) fn failed(&self) -> u64 {
        self.failed.load(Ordering::Relaxed)
    }

    /// Hands periodic snapshots to the background thread from now on.
    pub(crate) fn start_background(&self, jobs: Sender<Job>) {
        *self.jobs.lock().unwrap_or_else(|e| e.into_inner()) = Some(jobs);
    }

    /// Stops handing snapshots to the background thread (which then finishes).
    pub(crate) fn stop_background(&self) {
        self.jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// The index as a checkpoint. Called under the log lock with no record in flight, so that the
    /// snapshot describes exactly a written prefix of the log.
    pub(crate) fn snapshot(&self, state: &mut LogState, index: &RwLock<Index>, log: &Log, clock: &Clock) -> Checkpoint {
        debug_assert!(state.nothing_in_flight());
        let segments = state.segment_table();
        let index = index.read().unwrap_or_else(|e| e.into_inner());
        let (contents, keys) = index.to_checkpoint();
        let cp = Checkpoint {
            volume_id: log.sb.volume_id,
            checkpoint_seq: state.next_checkpoint_seq,
            created_unix_ms: clock.now_unix_ms(),
            next_segment_seq: state.next_seq,
            segments,
            namespaces: index.namespaces().to_vec(),
            contents,
            keys,
        };
        state.next_checkpoint_seq += 1;
        state.seals_since_checkpoint = 0;
        cp
    }

    /// Snapshots the index and hands it to the background thread, which makes the log durable
    /// through the snapshot and then writes it. Called right after a seal, when every record
    /// reserved so far is written.
    pub(crate) fn snapshot_in_background(&self, state: &mut LogState, index: &RwLock<Index>, log: &Log, clock: &Clock) {
        let through: Pos = state.written_through();
        let cp = self.snapshot(state, index, log, clock);
        if let Some(jobs) = self.jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
            // A send fails only when the thread is gone; `close` writes a checkpoint anyway.
            let _ = jobs.send(Job { cp, through });
        }
    }

    /// Syncs the device and writes a checkpoint now. Called under the log lock with no record in
    /// flight.
    pub(crate) fn write_now(
        &self,
        state: &mut LogState,
        index: &RwLock<Index>,
        log: &Log,
        clock: &Clock,
    ) -> Result<()> {
        log.sync_and_summarize(state)?;
        let cp = self.snapshot(state, index, log, clock);
        self.save(log, &cp)
    }

    /// Writes a checkpoint unless a newer one was written already (snapshots taken under the log
    /// lock are written after it is released, possibly out of order).
    pub(crate) fn save(&self, log: &Log, cp: &Checkpoint) -> Result<()> {
        let mut last = self.saved.lock().unwrap_or_else(|e| e.into_inner());
        if cp.checkpoint_seq <= *last {
            return Ok(());
        }
        if self.store.save(log.dev.as_ref(), cp)? {
            *last = cp.checkpoint_seq;
            *self.covers.lock().unwrap_or_else(|e| e.into_inner()) = (cp.checkpoint_seq, cp.segments.clone());
            self.written.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counts a checkpoint that could not be written.
    pub(crate) fn count_failure(&self) {
        self.failed.fetch_add(1, Ordering::Relaxed);
    }

    /// The seq of the newest checkpoint on disk (the one open loaded, or the newest written
    /// since); 0 without one.
    pub(crate) fn newest_seq(&self) -> u64 {
        self.covers.lock().unwrap_or_else(|e| e.into_inner()).0
    }

    /// Whether the newest checkpoint written covers `victim` and every sealed segment older than
    /// it, each at its current use and end. Then reclaiming `victim` needs no new checkpoint even
    /// though it is not the oldest: recovery loads that checkpoint, drops what it says was in
    /// `victim` (its use is gone), and replays nothing older, so no older version of a key whose
    /// newest version was in `victim` can come back.
    pub(crate) fn cover_through(&self, sealed: &[SealedSegment], victim: u32) -> bool {
        let Some(limit) = sealed.iter().find(|s| s.index == victim).map(|s| s.seq) else { return false };
        let covers = &self.covers.lock().unwrap_or_else(|e| e.into_inner()).1;
        sealed.iter().filter(|s| s.seq <= limit).all(|s| {
            covers.get(s.index as usize).is_some_and(|c| c.sealed && c.seq == s.seq && c.end_unit == s.end_unit)
        })
    }
}
