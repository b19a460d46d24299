//! The log's state machine (the log writer thread, `crate::writer`, only writes records).
//!
//! Segments move `Free → Open → Sealed → Free`: a segment use starts with a header (synced
//! before the first record of a run, see [`Log::start_segment`]), takes reservations in log
//! order until the next record does not fit, is sealed (its summary waits for a sync that covers
//! its records), and is freed by reclaim (its header zeroed and synced before anything it held
//! leaves the index). A segment sealed by a clean close is resumed by the next run's first write
//! instead. Every transition happens under the log lock; the caller orchestrates what needs other
//! layers (reclaim, checkpoints) around them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use kvhoard_format::checkpoint::SegmentState;
use kvhoard_format::policy::NsPolicy;
use kvhoard_format::segment::SegmentHeader;
use kvhoard_format::superblock::{FreedAhead, Superblock};
use kvhoard_format::UNIT_BYTES;

use super::seal::write_seal;
use super::{GroupCommit, Loc, OpenSeg, Pos, SegInfo, SegState};
use crate::buffer::{AlignedBuf, PooledBuf};
use crate::clock::Clock;
use crate::device::{BlockDevice, DeviceError};
use crate::error::{Result, StoreError};

/// The log: its device, its state under one lock, and the records on their way to the device.
#[derive(Debug)]
pub(crate) struct Log {
    /// The volume's device.
    pub(crate) dev: Arc<dyn BlockDevice>,
    /// The volume's geometry (its `freed_ahead` as the volume was opened: the current one is
    /// [`LogState::freed_ahead`]).
    pub(crate) sb: Superblock,
    state: Mutex<LogState>,
    /// Signalled when a reserved record has been written (or a write failed).
    written: Condvar,
    /// Records reserved but not yet written, so that reads find them. A leaf lock.
    pending: Mutex<HashMap<Loc, Arc<PooledBuf>>>,
    /// One fdatasync for every writer waiting for one.
    commit: GroupCommit,
    /// fdatasync calls.
    syncs: AtomicU64,
    clock: Clock,
}

/// Everything the log lock guards.
#[derive(Debug)]
pub(crate) struct LogState {
    /// Every segment's state and current use.
    pub(crate) segments: Vec<SegInfo>,
    /// The segment being appended to.
    pub(crate) open: Option<OpenSeg>,
    /// A sealed segment with room that the first write after open resumes.
    pub(crate) resumable: Option<OpenSeg>,
    /// Segments sealed (full, no more appends) whose summaries wait for the next device sync:
    /// a summary must not become durable before the records it lists, and a put that fills a
    /// segment should not wait for a sync of the whole segment. Until its summary is written,
    /// recovery finds a segment's records by scanning it.
    pub(crate) unsummarized: Vec<OpenSeg>,
    /// The seq the next segment use gets.
    pub(crate) next_seq: u64,
    /// Whether a segment use of this run has a durable header yet (see [`Log::start_segment`]).
    seq_durable: bool,
    /// The seq the next checkpoint gets. Checkpoints are numbered in log order: a snapshot is
    /// taken under this lock.
    pub(crate) next_checkpoint_seq: u64,
    /// Segments sealed since the last checkpoint snapshot.
    pub(crate) seals_since_checkpoint: u32,
    /// Why writes are refused, after a failed write or sync.
    pub(crate) poisoned: Option<String>,
    /// Set by close.
    pub(crate) closed: bool,
    /// The segment a cleaner is emptying: reclaim leaves it alone meanwhile.
    pub(crate) cleaning: Option<u32>,
    /// Threads waiting in [`Log::lock_quiet`]: while any is, new reservations wait.
    quiet_wanted: u32,
    /// The newest segment use reclaimed ahead of an older one, as both superblock copies hold it.
    pub(crate) freed_ahead: FreedAhead,
    /// Per segment, the end of the newest record that superseded one of its records (a newer
    /// record of the same key elsewhere). Its header is erased only once that end is durable
    /// ([`Log::superseded_unsynced`]): were the erasure durable and the newer record not, a
    /// crash would leave the key neither version, though the older one was durable.
    superseded: Vec<Pos>,
}

impl LogState {
    /// Whether no reserved record of the open segment is on its way to the device.
    pub(crate) fn nothing_in_flight(&self) -> bool {
        self.open.as_ref().is_none_or(|o| o.in_flight.is_empty())
    }

    /// The state recovery rebuilt.
    pub(crate) fn new(
        segments: Vec<SegInfo>,
        open: Option<OpenSeg>,
        resumable: Option<OpenSeg>,
        next_seq: u64,
        next_checkpoint_seq: u64,
        freed_ahead: FreedAhead,
    ) -> LogState {
        let segment_count = segments.len();
        LogState {
            segments,
            open,
            resumable,
            unsummarized: Vec::new(),
            cleaning: None,
            next_seq,
            seq_durable: false,
            next_checkpoint_seq,
            seals_since_checkpoint: 0,
            poisoned: None,
            closed: false,
            quiet_wanted: 0,
            freed_ahead,
            // Recovery synced what it found (`recovery::recover`).
            superseded: vec![Pos::default(); segment_count],
        }
    }

    /// A record ending at `end` superseded one in `segment`.
    pub(crate) fn note_superseded(&mut self, segment: u32, end: Pos) {
        if let Some(s) = self.superseded.get_mut(segment as usize) {
            *s = (*s).max(end);
        }
    }

    /// The first free segment, if any.
    pub(crate) fn free_segment(&self) -> Option<u32> {
        self.segments.iter().position(|s| s.state == SegState::Free).map(|i| i as u32)
    }

    /// Every segment as a checkpoint records it. Called with no record in flight, so the open
    /// segment's tail is a written prefix.
    pub(crate) fn segment_table(&self) -> Vec<SegmentState> {
        self.segments
            .iter()
            .enumerate()
            .map(|(i, s)| match s.state {
                SegState::Free => SegmentState { seq: 0, end_unit: 0, sealed: false },
                SegState::Sealed { end_unit } => SegmentState { seq: s.seq, end_unit, sealed: true },
                SegState::Open => {
                    let tail = self.open.as_ref().filter(|o| o.index == i as u32).map_or(1, |o| o.tail);
                    SegmentState { seq: s.seq, end_unit: tail, sealed: false }
                }
            })
            .collect()
    }

    /// The position through which every reserved record has been written.
    pub(crate) fn written_through(&self) -> Pos {
        match &self.open {
            Some(open) => open.written_through(),
            None => Pos { seq: self.next_seq, unit: 0 },
        }
    }

    /// Refuses writes once closed or poisoned.
    pub(crate) fn writable(&self) -> Result<()> {
        if self.closed {
            return Err(StoreError::Closed);
        }
        self.not_poisoned()
    }

    /// Refuses writes once poisoned.
    pub(crate) fn not_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(StoreError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }
}

/// What sealing the open segment did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Sealed {
    /// Enough segments were sealed since the last checkpoint that one is due now (every record
    /// reserved so far is written, so a snapshot taken now describes a written prefix).
    pub(crate) checkpoint_due: bool,
}

impl Log {
    /// The log of a volume whose state recovery rebuilt.
    pub(crate) fn new(dev: Arc<dyn BlockDevice>, sb: Superblock, state: LogState, clock: Clock) -> Log {
        Log {
            dev,
            sb,
            state: Mutex::new(state),
            written: Condvar::new(),
            pending: Mutex::new(HashMap::new()),
            commit: GroupCommit::default(),
            syncs: AtomicU64::new(0),
            clock,
        }
    }

    /// Takes the log lock.
    pub(crate) fn lock(&self) -> MutexGuard<'_, LogState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn pending(&self) -> MutexGuard<'_, HashMap<Loc, Arc<PooledBuf>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Makes a reserved record's bytes findable until it is written.
    pub(crate) fn add_pending(&self, loc: Loc, buf: Arc<PooledBuf>) {
        self.pending().insert(loc, buf);
    }

    /// The bytes of a record reserved but not yet written.
    pub(crate) fn pending_record(&self, loc: &Loc) -> Option<Arc<PooledBuf>> {
        self.pending().get(loc).cloned()
    }

    /// Whether the record at `loc` is still on its way to the device.
    pub(crate) fn is_pending(&self, loc: &Loc) -> bool {
        self.pending().contains_key(loc)
    }

    /// Forgets a reserved record that will not be written.
    pub(crate) fn drop_pending(&self, loc: &Loc) {
        self.pending().remove(loc);
    }

    /// Returns once every record up to `target` is durable, sharing one fdatasync with every
    /// writer waiting at the same time.
    pub(crate) fn sync_to(&self, target: Pos) -> Result<()> {
        self.commit.sync_to(target, self)
    }

    /// The end of the newest record that superseded one in `segment`, if it is not durable yet:
    /// the segment's header must not be erased before it is ([`Log::make_durable`]).
    pub(crate) fn superseded_unsynced(&self, state: &LogState, segment: u32) -> Option<Pos> {
        let end = state.superseded.get(segment as usize).copied().unwrap_or_default();
        (end > self.commit.synced()).then_some(end)
    }

    /// The end of the record at `loc` (`units` long) if it lies in a segment other than the open
    /// one and is not durable yet. A link to its block waits for that (`store/append.rs`): a power
    /// loss may keep any subset of unsynced writes, and a link kept without its block in an
    /// earlier segment would replay as naming bytes evicted, its key a miss where the version
    /// before may have been synced. In the open segment no wait is needed: a scan after a power
    /// loss stops at the lost block, before the link.
    pub(crate) fn unsynced_elsewhere(&self, state: &LogState, loc: Loc, units: u32) -> Option<Pos> {
        if state.open.as_ref().is_some_and(|o| o.index == loc.segment) {
            return None;
        }
        debug_assert!((loc.segment as usize) < state.segments.len(), "a block's record outside the volume");
        let seq = state.segments.get(loc.segment as usize)?.seq;
        let end = Pos { seq, unit: loc.unit.saturating_add(units) };
        (end > self.commit.synced()).then_some(end)
    }

    /// [`Log::make_durable`] for a caller holding the log lock (`state`) and no record of its own
    /// reserved and not yet handed over: the lock is let go for the wait, and taken again once
    /// writes are not held back ([`Log::let_quiet`]); refuses if the log was closed or poisoned
    /// meanwhile.
    pub(crate) fn make_durable_unlocked<'a>(
        &'a self,
        state: MutexGuard<'a, LogState>,
        end: Pos,
    ) -> Result<MutexGuard<'a, LogState>> {
        drop(state);
        self.make_durable(end)?;
        let state = self.let_quiet(self.lock());
        state.writable()?;
        Ok(state)
    }

    /// Waits until every record before `end` is written, and syncs. Called without the log
    /// lock, holding no record of the caller's own reserved and not yet handed to the writer.
    pub(crate) fn make_durable(&self, end: Pos) -> Result<()> {
        self.wait_written(end)?;
        self.sync_to(end)
    }

    /// fdatasync calls so far.
    pub(crate) fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Syncs the device, counted.
    pub(crate) fn sync_device(&self) -> std::result::Result<(), DeviceError> {
        self.syncs.fetch_add(1, Ordering::Relaxed);
        self.dev.sync()
    }

    /// Refuses writes from now on: after a failed write or sync the store can no longer tell
    /// what reached the disk.
    pub(crate) fn poison(&self, state: &mut LogState, reason: String) {
        if state.poisoned.is_none() {
            tracing::error!(%reason, "write failed; refusing writes until the volume is reopened");
            state.poisoned = Some(reason);
        }
        self.written.notify_all();
    }

    /// Poisons the log if `result` failed, and passes it on.
    fn or_poison<T>(&self, state: &mut LogState, result: std::result::Result<T, DeviceError>) -> Result<T> {
        result.map_err(|e| {
            self.poison(state, e.to_string());
            e.into()
        })
    }

    /// Waits until no record of segment use `seq` is in flight, then seals it. If another
    /// thread sealed it meanwhile, does nothing: the segment open now is not the full one.
    pub(crate) fn seal_open<'a>(
        &'a self,
        mut state: MutexGuard<'a, LogState>,
        seq: u64,
        checkpoint_every_segments: u32,
    ) -> Result<(MutexGuard<'a, LogState>, Sealed)> {
        let nothing = Sealed { checkpoint_due: false };
        while state.open.as_ref().is_some_and(|o| o.seq == seq && !o.in_flight.is_empty()) && state.poisoned.is_none() {
            state = self.written.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.not_poisoned()?;
        if state.open.as_ref().is_none_or(|o| o.seq != seq) {
            return Ok((state, nothing));
        }
        let Some(open) = state.open.take() else { return Ok((state, nothing)) };
        if let Some(s) = state.segments.get_mut(open.index as usize) {
            s.state = SegState::Sealed { end_unit: open.tail };
        }
        state.unsummarized.push(open);
        state.seals_since_checkpoint += 1;
        let checkpoint_due = state.seals_since_checkpoint >= checkpoint_every_segments;
        Ok((state, Sealed { checkpoint_due }))
    }

    /// Syncs the device, then writes the summaries of the segments sealed since the last sync.
    /// Called with no record in flight in those segments (a seal waits for them).
    pub(crate) fn sync_and_summarize(&self, state: &mut LogState) -> Result<()> {
        let synced = self.sync_device();
        self.or_poison(state, synced)?;
        self.write_summaries(state, |_| true)
    }

    /// Resumes the segment the last clean close sealed, if it is still as it was. Returns whether
    /// a segment is open now.
    pub(crate) fn resume_if_resumable(&self, state: &mut LogState) -> Result<bool> {
        let Some(seg) = state.resumable.take() else { return Ok(false) };
        let still = state
            .segments
            .get(seg.index as usize)
            .is_some_and(|s| s.seq == seg.seq && matches!(s.state, SegState::Sealed { .. }));
        if !still {
            return Ok(false);
        }
        self.resume(state, seg)?;
        Ok(true)
    }

    /// Unseals `seg` for appends: erases its summary and trailer (so no copy of a header can be
    /// taken for a record later, and recovery scans it), syncs, and makes it the open segment.
    fn resume(&self, state: &mut LogState, seg: OpenSeg) -> Result<()> {
        let base = self.sb.segment_offset(seg.index);
        let summary = AlignedBuf::zeroed(seg.summary.len());
        let trailer = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let erased = self
            .dev
            .write_at(&summary, base + u64::from(seg.tail) * UNIT_BYTES)
            .and_then(|()| self.dev.write_at(&trailer, base + u64::from(self.sb.segment_units() - 1) * UNIT_BYTES))
            .and_then(|()| self.sync_device());
        self.or_poison(state, erased)?;
        if let Some(s) = state.segments.get_mut(seg.index as usize) {
            s.state = SegState::Open;
        }
        state.open = Some(seg);
        Ok(())
    }

    /// Starts a new use of the free segment `index` and makes it the open segment.
    pub(crate) fn start_segment(&self, state: &mut LogState, index: u32) -> Result<()> {
        let seq = state.next_seq;
        let now = self.clock.now_unix_ms();
        let header = SegmentHeader {
            volume_id: self.sb.volume_id,
            segment_index: index,
            seq,
            created_unix_ms: now,
            boot: self.dev.boot(),
        };
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        unit.copy_from_slice(&header.encode());
        // The first use of a run is synced before any record goes into it. Recovery skips a gap of
        // seqs past the highest it finds, for uses a crash lost without a trace; that is only
        // enough if the run's first seq is on disk (docs/format.md, "Opening a volume").
        let written = self.dev.write_at(&unit, self.sb.segment_offset(index)).and_then(|()| {
            if state.seq_durable {
                return Ok(());
            }
            self.sync_device()
        });
        self.or_poison(state, written)?;
        state.seq_durable = true;
        state.next_seq += 1;
        if let Some(s) = state.superseded.get_mut(index as usize) {
            *s = Pos::default();
        }
        if let Some(s) = state.segments.get_mut(index as usize) {
            *s = SegInfo { state: SegState::Open, seq, created_unix_ms: now };
        }
        state.open = Some(OpenSeg::new(index, seq));
        Ok(())
    }

    /// Marks sealed segment `index` free in memory and forgets its waiting summary (it would
    /// describe bytes about to be reused). Nothing is written: see [`Log::erase_segment_header`].
    pub(crate) fn mark_free(&self, state: &mut LogState, index: u32) {
        state.unsummarized.retain(|s| s.index != index);
        if let Some(s) = state.segments.get_mut(index as usize) {
            *s = SegInfo::FREE;
        }
    }

    /// Writes both superblock copies (copy A, sync, copy B, sync): the geometry, what was freed
    /// ahead, and `policies`. Called under the log lock, which makes it the superblock's one
    /// writer: a policy set and a segment freed ahead never write over each other's change.
    pub(crate) fn write_superblocks(&self, state: &LogState, policies: &[NsPolicy]) -> Result<()> {
        let sb = Superblock { freed_ahead: state.freed_ahead, ..self.sb.clone() };
        crate::volume::write_superblocks(self.dev.as_ref(), &sb, policies)
    }

    /// Records in both superblock copies that segment use `seq` is reclaimed while an older use
    /// is still in the log, and that checkpoint `checkpoint_seq` knows it is gone
    /// ([`FreedAhead`]): the one about to be written, or the newest on disk. Called before either
    /// that checkpoint is written or the segment's header erased: from then on the log alone
    /// would bring back older versions of the keys whose newest records it held, and recovery
    /// without that checkpoint must void them instead. A failure poisons the log.
    pub(crate) fn record_freed_ahead(
        &self,
        state: &mut LogState,
        seq: u64,
        checkpoint_seq: u64,
        policies: &[NsPolicy],
    ) -> Result<()> {
        let before = state.freed_ahead;
        let freed = before.and(seq, checkpoint_seq);
        if freed == before {
            return Ok(());
        }
        state.freed_ahead = freed;
        if let Err(e) = self.write_superblocks(state, policies) {
            state.freed_ahead = before;
            self.poison(state, format!("cannot record a segment freed ahead of an older one in the superblock: {e}"));
            return Err(e);
        }
        Ok(())
    }

    /// Zeroes segment `index`'s header and syncs, so that nothing it held can come back after a
    /// crash.
    pub(crate) fn erase_segment_header(&self, state: &mut LogState, index: u32) -> Result<()> {
        let zero = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let freed = self.dev.write_at(&zero, self.sb.segment_offset(index)).and_then(|()| self.sync_device());
        self.or_poison(state, freed)
    }

    /// What a sync about to start will cover: the position through which every reserved record
    /// has been written, and the sealed segments whose summaries wait for a sync (their records
    /// are all written).
    pub(crate) fn sync_point(&self) -> (Pos, Vec<(u32, u64)>) {
        let state = self.lock();
        let sealed = state.unsummarized.iter().map(|s| (s.index, s.seq)).collect();
        (state.written_through(), sealed)
    }

    /// Writes the summaries of `sealed` segments (index, seq) still waiting, after a sync that
    /// began when they were sealed.
    pub(crate) fn summarize(&self, sealed: &[(u32, u64)]) -> Result<()> {
        if sealed.is_empty() {
            return Ok(());
        }
        self.write_summaries(&mut self.lock(), |s| sealed.contains(&(s.index, s.seq)))
    }

    /// Writes the waiting summaries of the sealed segments `which` selects, and forgets them.
    /// A failed write poisons the log.
    pub(crate) fn write_summaries(&self, state: &mut LogState, which: impl Fn(&OpenSeg) -> bool) -> Result<()> {
        let (ready, waiting): (Vec<OpenSeg>, _) = std::mem::take(&mut state.unsummarized).into_iter().partition(which);
        state.unsummarized = waiting;
        for seg in &ready {
            let sealed =
                write_seal(self.dev.as_ref(), &self.sb, seg.index, seg.seq, seg.tail, &seg.summary, seg.records);
            self.or_poison(state, sealed)?;
        }
        Ok(())
    }

    /// Records that the write of the record at `loc` (segment use `seq`) finished, poisoning the
    /// log if it failed; `fix_index` runs under the log lock before anyone is woken.
    pub(crate) fn record_written(
        &self,
        loc: Loc,
        seq: u64,
        result: &std::result::Result<(), DeviceError>,
        fix_index: impl FnOnce(),
    ) {
        let mut state = self.lock();
        if let Some(open) = state.open.as_mut().filter(|o| o.seq == seq) {
            open.in_flight.remove(&loc.unit);
        }
        if let Err(e) = result {
            fix_index();
            self.poison(&mut state, e.to_string());
        }
        self.drop_pending(&loc);
        self.written.notify_all();
    }

    /// The log lock, taken once no reserved record is on its way to the device, or once the log
    /// is poisoned (the caller must check: records may still be on their way then, and nothing
    /// may be checkpointed or freed): what a checkpoint needs, so that it
    /// describes exactly a written prefix of the log. Reservations wait meanwhile
    /// ([`Log::let_quiet`]), so a stream of puts cannot keep the caller waiting.
    pub(crate) fn lock_quiet(&self) -> MutexGuard<'_, LogState> {
        let mut state = self.lock();
        state.quiet_wanted += 1;
        while !state.nothing_in_flight() && state.poisoned.is_none() {
            state = self.written.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state.quiet_wanted -= 1;
        // Reservations waiting in `let_quiet` go on once the caller releases the lock.
        self.written.notify_all();
        state
    }

    /// Before a reservation: waits while a [`Log::lock_quiet`] waits for the records in flight
    /// to be written. Called holding none of the caller's own records reserved and not yet handed
    /// to the writer (records handed over are written without the caller), or the wait would
    /// never end.
    pub(crate) fn let_quiet<'a>(&'a self, mut state: MutexGuard<'a, LogState>) -> MutexGuard<'a, LogState> {
        while state.quiet_wanted > 0 && state.poisoned.is_none() {
            state = self.written.wait(state).unwrap_or_else(|e| e.into_inner());
        }
        state
    }

    /// Waits until no reserved record is on its way to the device any more, or the log is
    /// poisoned ([`Log::lock_quiet`], the lock released at once).
    pub(crate) fn wait_idle(&self) {
        drop(self.lock_quiet());
    }

    /// Waits until every record up to `end` has been written.
    pub(crate) fn wait_written(&self, end: Pos) -> Result<()> {
        let mut state = self.lock();
        loop {
            state.not_poisoned()?;
            let done = match &state.open {
                Some(open) if open.seq == end.seq => open.written_before(end.unit),
                _ => true,
            };
            if done {
                return Ok(());
            }
            state = self.written.wait(state).unwrap_or_else(|e| e.into_inner());
        }
    }
}
