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
    /// The index's change count ([`Index::changes`]) at which the newest checkpoint on disk
    /// describes the index exactly, when that is known: an open that took everything from the
    /// checkpoint. Forgotten once another checkpoint is written.
    describes_index: Mutex<Option<u64>>,
    /// Snapshots for the background thread; `None` once it is stopped.
    jobs: Mutex<Option<Sender<Job>>>,
    /// Checkpoints written.
    written: AtomicU64,
    /// Checkpoints that could not be written.
    failed: AtomicU64,
    /// The entry vectors of the last checkpoint saved, kept for the next snapshot to fill
    /// ([`Index::to_checkpoint_into`]): what the snapshot holds every put waiting for is then a
    /// copy, not a copy into fresh memory. A leaf lock.
    spare: Mutex<Entries>,
    /// Microseconds the last snapshot took: every put waits that long (it holds the log lock).
    snapshot_us: AtomicU64,
}

/// A checkpoint's contents and keys.
type Entries = (Vec<kvhoard_format::checkpoint::ContentEntry>, Vec<kvhoard_format::checkpoint::KeyEntry>);

impl Checkpoints {
    /// The checkpoints of a volume whose newest checkpoint on disk, `seq`, covers `covers` (0
    /// and empty without one), and describes the index at change count `describes_index` if
    /// known.
    pub(crate) fn new(
        store: CheckpointStore,
        seq: u64,
        covers: Vec<SegmentState>,
        describes_index: Option<u64>,
    ) -> Checkpoints {
        Checkpoints {
            store,
            saved: Mutex::new(0),
            covers: Mutex::new((seq, covers)),
            describes_index: Mutex::new(describes_index),
            jobs: Mutex::new(None),
            written: AtomicU64::new(0),
            failed: AtomicU64::new(0),
            spare: Mutex::new((Vec::new(), Vec::new())),
            snapshot_us: AtomicU64::new(0),
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
        let started = std::time::Instant::now();
        let segments = state.segment_table();
        let (mut contents, mut keys) = std::mem::take(&mut *self.spare.lock().unwrap_or_else(|e| e.into_inner()));
        let index = index.read().unwrap_or_else(|e| e.into_inner());
        index.to_checkpoint_into(&mut contents, &mut keys);
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
        let took = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        self.snapshot_us.store(took, Ordering::Relaxed);
        cp
    }

    /// Microseconds the last snapshot held the log (0 before the first).
    pub(crate) fn snapshot_us(&self) -> u64 {
        self.snapshot_us.load(Ordering::Relaxed)
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
        let saved = self.save(log, &cp);
        // Under the log lock: kept as they are.
        self.recycle(cp, false);
        saved
    }

    /// Bytes of the entry vectors kept for the next snapshot.
    pub(crate) fn spare_bytes(&self) -> u64 {
        let spare = self.spare.lock().unwrap_or_else(|e| e.into_inner());
        (spare.0.capacity() * std::mem::size_of::<kvhoard_format::checkpoint::ContentEntry>()
            + spare.1.capacity() * std::mem::size_of::<kvhoard_format::checkpoint::KeyEntry>()) as u64
    }

    /// Keeps the entry vectors of a checkpoint written (or given up) for the next snapshot; with
    /// `room` (off the put path), grown first by a quarter where they are smaller, every page
    /// touched, so that an index that grew since is still copied into memory already mapped.
    pub(crate) fn recycle(&self, cp: Checkpoint, room: bool) {
        let (contents, keys) = match room {
            true => (with_room(cp.contents), with_room(cp.keys)),
            false => (cp.contents, cp.keys),
        };
        *self.spare.lock().unwrap_or_else(|e| e.into_inner()) = (contents, keys);
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
            self.describes_index.lock().unwrap_or_else(|e| e.into_inner()).take();
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

    /// Whether the newest checkpoint on disk holds exactly what a checkpoint taken now would:
    /// the same segment table (`segments`, [`LogState::segment_table`]) and the index at
    /// change count `index_changes`. Then writing one would change nothing but its seq.
    pub(crate) fn describes(&self, segments: &[SegmentState], index_changes: u64) -> bool {
        let index_same = *self.describes_index.lock().unwrap_or_else(|e| e.into_inner()) == Some(index_changes);
        index_same && self.covers.lock().unwrap_or_else(|e| e.into_inner()).1 == segments
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

/// `v` emptied, with room for a quarter more entries than it held, all of it written once (so
/// mapped): filling it again faults no page in.
fn with_room<T: Copy>(mut v: Vec<T>) -> Vec<T> {
    let want = v.len() + v.len() / 4;
    if let (Some(&filler), true) = (v.first(), v.capacity() < want) {
        v.reserve_exact(want - v.len());
        v.resize(v.capacity(), filler);
    }
    v.clear();
    v
}

#[cfg(test)]
mod tests {
    use super::with_room;

    #[test]
    fn room_is_a_quarter_more_than_held_and_nothing_is_left_in_it() {
        let v = with_room(vec![7u32; 8]);
        assert!(v.is_empty());
        assert!(v.capacity() >= 10);
        let v = with_room(Vec::<u32>::new());
        assert_eq!(v.capacity(), 0, "nothing held, nothing kept");
    }
}
