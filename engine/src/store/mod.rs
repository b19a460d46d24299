//! The store: the native API over the log, the index and the device.
//!
//! Locks, always taken in this order: `log` (segment states, the open segment, reservations),
//! then `index` (read-mostly; gets take only its read lock), then `pending` (records reserved
//! but not yet written, so that gets see them). Device I/O for records runs outside all locks.

mod checkpointer;
mod pins;
mod prometheus;
mod read;
mod stats;
mod sync;
mod write;

use read::CachedBlock;
pub use read::{Block, BlockMeta, ListCursor, ListEntry, ListPage, Resident};
pub use stats::{NamespaceStats, Stats};

use std::collections::HashMap;
use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Sender, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, RwLock};
use std::thread::JoinHandle;

use kvhoard_format::checkpoint::{Checkpoint, SegmentState};
use kvhoard_format::segment::SegmentHeader;
use kvhoard_format::superblock::Superblock;
use kvhoard_format::UNIT_BYTES;

use crate::checkpoint_io::CheckpointStore;
use crate::device::{open_volume, BlockDevice};
use crate::error::{Result, StoreError};
use crate::index::{Index, Loc};
use crate::log::seal::write_seal;
use crate::log::{OpenSeg, Pos, SegInfo, SegState};
use crate::options::{CreateOptions, StoreOptions};
use crate::pool::{BufferPool, PooledBuf};
use crate::reclaim::{OldestFirst, ReclaimPolicy as _, SegmentView};
use crate::recovery::{recover, RecoveryReport};
use crate::tier::{DramTier, LatencyHistogram, TierCounters};
use crate::volume::{self, VolumePaths};
use crate::{AlignedBuf, Clock};

use self::stats::Metrics;
use self::sync::GroupCommit;
use self::write::WriteJob;

/// A kvhoard volume, open. Cheap to share: all methods take `&self` and are thread-safe.
#[derive(Debug)]
pub struct Store {
    inner: Arc<Inner>,
    writer: Mutex<Option<(SyncSender<WriteJob>, JoinHandle<()>)>>,
    checkpointer: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug)]
struct Inner {
    dev: Arc<dyn BlockDevice>,
    sb: Superblock,
    checkpoints: CheckpointStore,
    opts: StoreOptions,
    clock: Clock,
    log: Mutex<LogState>,
    /// Signalled when a reserved record has been written (or a write failed).
    written: Condvar,
    index: RwLock<Index>,
    pending: Mutex<HashMap<Loc, Arc<PooledBuf>>>,
    /// Record buffers for puts and gets, reused without zeroing.
    pool: Arc<BufferPool>,
    /// Seq of the newest checkpoint written; serializes checkpoint writes.
    checkpoint_saved: Mutex<u64>,
    /// The segment table of the newest checkpoint on disk (what recovery would not replay). A
    /// leaf lock.
    checkpoint_covers: Mutex<Vec<SegmentState>>,
    /// Snapshots for the background checkpointer; `None` once it is stopped.
    checkpoint_jobs: Mutex<Option<Sender<checkpointer::Job>>>,
    sync: GroupCommit,
    metrics: Metrics,
    /// Keys kept out of reclaim's way while they are read.
    pins: pins::Pins,
    /// Copies of blocks in memory above the log, if configured.
    dram: Option<DramTier<Arc<CachedBlock>>>,
    /// Load latency of DRAM-tier hits and of reads from the log.
    dram_latency: LatencyHistogram,
    ssd: TierCounters,
    ssd_latency: LatencyHistogram,
    recovery: RecoveryReport,
    /// Set by `close`: later reads fail instead of reading a volume another process may own.
    closed: AtomicBool,
    /// The volume's exclusive lock; released by `close`, so the volume can be opened again by
    /// this or another process while this handle is still alive.
    lock: Mutex<Option<File>>,
}

#[derive(Debug)]
struct LogState {
    segments: Vec<SegInfo>,
    open: Option<OpenSeg>,
    /// A sealed segment with room that the first write after open resumes.
    resumable: Option<OpenSeg>,
    /// Segments sealed (full, no more appends) whose summaries wait for the next device sync:
    /// a summary must not become durable before the records it lists, and a put that fills a
    /// segment should not wait for a sync of the whole segment. Until its summary is written,
    /// recovery finds a segment's records by scanning it.
    unsummarized: Vec<OpenSeg>,
    next_seq: u64,
    /// Whether a segment use of this run has a durable header yet (see `open_segment`).
    seq_durable: bool,
    next_checkpoint_seq: u64,
    seals_since_checkpoint: u32,
    poisoned: Option<String>,
    closed: bool,
}

impl Store {
    /// Creates a volume at `path`: a directory (created if missing, holding `volume.kvh`) or a
    /// raw block device. Fails if a volume is already there.
    pub fn create(path: &Path, create: &CreateOptions, opts: StoreOptions) -> Result<Store> {
        let paths = VolumePaths::resolve(path);
        if paths.meta_dir.is_none() {
            return Self::create_in(path, &paths, create, opts);
        }
        let capacity = create
            .capacity_bytes
            .ok_or_else(|| StoreError::invalid("capacity", "a directory volume needs a capacity (--capacity)"))?;
        volume::create_data_file(&paths, capacity)?;
        let created = Self::create_in(path, &paths, create, opts);
        if created.is_err() {
            // Leave nothing half-made behind: a later `init` would refuse to overwrite it.
            let _ = std::fs::remove_file(&paths.data);
        }
        created
    }

    fn create_in(path: &Path, paths: &VolumePaths, create: &CreateOptions, opts: StoreOptions) -> Result<Store> {
        let lock = volume::lock(paths)?;
        let dev = open_volume(&paths.data, &opts).map_err(|source| StoreError::File {
            action: "cannot open",
            path: paths.data.clone(),
            source,
        })?;
        if paths.meta_dir.is_none() && volume::has_superblock(dev.as_ref()) {
            return Err(StoreError::AlreadyExists { path: paths.data.clone() });
        }
        Self::format_device(dev.as_ref(), create, paths.meta_dir.is_none(), &opts.clock)?;
        let sb = Self::read_superblock(dev.as_ref(), path)?;
        let checkpoints = CheckpointStore::for_volume(&sb, paths.meta_dir.clone());
        Self::start(dev, sb, checkpoints, opts, Some(lock))
    }

    /// Opens the volume at `path` (a directory or a block device), taking its exclusive lock
    /// and rebuilding the index.
    pub fn open(path: &Path, opts: StoreOptions) -> Result<Store> {
        let paths = VolumePaths::resolve(path);
        let lock = volume::lock(&paths)?;
        let dev = open_volume(&paths.data, &opts).map_err(|source| StoreError::File {
            action: "cannot open",
            path: paths.data.clone(),
            source,
        })?;
        let sb = Self::read_superblock(dev.as_ref(), path)?;
        let checkpoints = CheckpointStore::for_volume(&sb, paths.meta_dir.clone());
        Self::start(dev, sb, checkpoints, opts, Some(lock))
    }

    /// Creates a volume on `dev` (checkpoints in slots on the device). For tests and embedding.
    pub fn create_on(dev: Arc<dyn BlockDevice>, create: &CreateOptions, opts: StoreOptions) -> Result<Store> {
        Self::format_device(dev.as_ref(), create, true, &opts.clock)?;
        Self::open_on(dev, opts)
    }

    /// Opens the volume on `dev`. The caller is responsible for exclusive access.
    pub fn open_on(dev: Arc<dyn BlockDevice>, opts: StoreOptions) -> Result<Store> {
        let sb = Self::read_superblock(dev.as_ref(), Path::new("<device>"))?;
        let checkpoints = CheckpointStore::for_volume(&sb, None);
        Self::start(dev, sb, checkpoints, opts, None)
    }

    fn format_device(dev: &dyn BlockDevice, create: &CreateOptions, slots: bool, clock: &Clock) -> Result<()> {
        let now = clock.now_unix_ms();
        let id = *blake3::hash(&[&now.to_le_bytes()[..], &std::process::id().to_le_bytes(), &random_bytes()].concat())
            .as_bytes();
        let mut volume_id = [0u8; 16];
        volume_id.copy_from_slice(&id[..16]);
        let sb = volume::plan(dev.capacity_bytes(), create, slots, volume_id, now)?;
        volume::format(dev, &sb)
    }

    fn read_superblock(dev: &dyn BlockDevice, path: &Path) -> Result<Superblock> {
        let sb = volume::read_superblock(dev).map_err(|e| match e {
            e @ kvhoard_format::FormatError::UnsupportedVersion { .. } => StoreError::Superblock(e),
            e => StoreError::NotAVolume { path: path.to_path_buf(), reason: e.to_string() },
        })?;
        if sb.capacity_bytes > dev.capacity_bytes() {
            return Err(StoreError::NotAVolume {
                path: path.to_path_buf(),
                reason: format!(
                    "the superblock says {} bytes but the device has {}: the volume file was truncated",
                    sb.capacity_bytes,
                    dev.capacity_bytes()
                ),
            });
        }
        Ok(sb)
    }

    fn start(
        dev: Arc<dyn BlockDevice>,
        sb: Superblock,
        checkpoints: CheckpointStore,
        opts: StoreOptions,
        lock: Option<File>,
    ) -> Result<Store> {
        let recovered = recover(dev.as_ref(), &sb, &checkpoints)?;
        tracing::info!(
            checkpoint = ?recovered.report.checkpoint_seq,
            segments_replayed = recovered.report.segments_replayed,
            records_replayed = recovered.report.records_replayed,
            keys = recovered.index.key_count(),
            elapsed_ms = recovered.report.elapsed_ms,
            "volume opened"
        );
        let queue_depth = opts.write_queue_depth.max(1);
        let pool = BufferPool::new(64, opts.buffer_pool_bytes);
        let dram = (opts.dram_tier_bytes > 0).then(|| DramTier::new(opts.dram_tier_bytes, &opts.dram_policy));
        let inner = Arc::new(Inner {
            dev,
            sb,
            checkpoints,
            clock: opts.clock.clone(),
            opts,
            log: Mutex::new(LogState {
                segments: recovered.segments,
                open: recovered.open,
                resumable: recovered.resumable,
                unsummarized: Vec::new(),
                next_seq: recovered.next_seq,
                seq_durable: false,
                next_checkpoint_seq: recovered.next_checkpoint_seq,
                seals_since_checkpoint: 0,
                poisoned: None,
                closed: false,
            }),
            written: Condvar::new(),
            index: RwLock::new(recovered.index),
            pending: Mutex::new(HashMap::new()),
            pool,
            checkpoint_saved: Mutex::new(0),
            checkpoint_covers: Mutex::new(recovered.checkpoint_covers),
            checkpoint_jobs: Mutex::new(None),
            sync: GroupCommit::default(),
            metrics: Metrics::default(),
            pins: pins::Pins::default(),
            dram,
            dram_latency: LatencyHistogram::default(),
            ssd: TierCounters::default(),
            ssd_latency: LatencyHistogram::default(),
            recovery: recovered.report,
            closed: AtomicBool::new(false),
            lock: Mutex::new(lock),
        });
        let writer = write::spawn_writer(Arc::clone(&inner), queue_depth)?;
        let (jobs, checkpointer) = checkpointer::spawn(Arc::downgrade(&inner))?;
        *inner.checkpoint_jobs.lock().unwrap_or_else(|e| e.into_inner()) = Some(jobs);
        let store = Store { inner, writer: Mutex::new(Some(writer)), checkpointer: Mutex::new(Some(checkpointer)) };
        if store.inner.recovery.records_replayed > 0 || store.inner.recovery.stale_segments_freed > 0 {
            // Save the replay's work for the next open.
            let mut log = store.inner.lock_log();
            store.inner.checkpoint(&mut log)?;
        }
        Ok(store)
    }

    /// What opening the volume found and did.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.inner.recovery
    }

    /// The volume's superblock.
    pub fn superblock(&self) -> &Superblock {
        &self.inner.sb
    }

    /// Writes everything buffered, seals the open segment, syncs and writes a checkpoint. The
    /// next open reads the checkpoint and nothing else; its first write resumes the segment
    /// sealed here if it has room. Releases the volume's lock, so it can be opened again while
    /// this handle lives; every later call on this handle fails with [`StoreError::Closed`].
    pub fn close(&self) -> Result<()> {
        self.stop_writer();
        self.stop_checkpointer();
        let mut log = self.inner.lock_log();
        if log.closed {
            return Ok(());
        }
        log.closed = true;
        self.inner.closed.store(true, Ordering::Release);
        let poisoned = log.poisoned.clone();
        let result = match poisoned {
            Some(reason) => Err(StoreError::Poisoned { reason }),
            None => match log.open.as_ref().map(|o| o.seq) {
                Some(seq) => self.inner.seal_open(log, seq).and_then(|mut log| self.inner.checkpoint(&mut log)),
                None => self.inner.checkpoint(&mut log),
            },
        };
        // Whatever the outcome, this handle writes no more: the next open (replaying the log if
        // the checkpoint failed) may take the volume.
        self.inner.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
        result
    }

    /// Lets the checkpointer finish what it is writing and waits for it: the checkpoint `close`
    /// writes must be the last thing written to the volume.
    fn stop_checkpointer(&self) {
        self.inner.end_checkpoint_jobs();
        let handle = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if handle.is_some_and(|h| h.join().is_err()) {
            tracing::error!("checkpoint thread panicked");
        }
    }

    fn stop_writer(&self) {
        let writer = self.writer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((tx, handle)) = writer {
            drop(tx);
            if handle.join().is_err() {
                tracing::error!("background writer panicked");
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A panicking caller may have left a reservation unwritten; sealing would wait for
            // it forever. The next open recovers from the log. The checkpointer ends after what
            // it is writing (it holds no strong reference to the store).
            self.inner.end_checkpoint_jobs();
            return;
        }
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the store failed; the next open will replay the log");
        }
    }
}

/// Starts a named engine thread; failing to start one is an error of the volume being opened.
fn spawn_thread(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>> {
    std::thread::Builder::new().name(name.into()).spawn(f).map_err(|source| StoreError::File {
        action: "cannot start a thread (out of threads or memory?) for",
        path: "<volume>".into(),
        source,
    })
}

impl Inner {
    /// Closes the checkpointer's channel: it ends after the checkpoint it is writing, if any.
    fn end_checkpoint_jobs(&self) {
        self.checkpoint_jobs.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    fn lock_log(&self) -> MutexGuard<'_, LogState> {
        // The log state is only mutated by code that cannot panic midway (no I/O in those
        // sections unwinds); a poisoned mutex still holds a consistent state.
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn index_read(&self) -> std::sync::RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    fn index_write(&self) -> std::sync::RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    fn lock_pending(&self) -> MutexGuard<'_, HashMap<Loc, Arc<PooledBuf>>> {
        self.pending.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn writable(&self, log: &LogState) -> Result<()> {
        if log.closed {
            return Err(StoreError::Closed);
        }
        Self::not_poisoned(log)
    }

    fn not_poisoned(log: &LogState) -> Result<()> {
        match &log.poisoned {
            Some(reason) => Err(StoreError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn poison(&self, log: &mut LogState, reason: String) {
        if log.poisoned.is_none() {
            tracing::error!(%reason, "write failed; refusing writes until the volume is reopened");
            log.poisoned = Some(reason);
        }
        self.written.notify_all();
    }

    /// Waits until no record of segment use `seq` is in flight, then seals it. If another
    /// thread sealed it meanwhile, does nothing: the segment open now is not the full one.
    /// Fails once the store is closed.
    fn ensure_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    fn seal_open<'a>(&'a self, mut log: MutexGuard<'a, LogState>, seq: u64) -> Result<MutexGuard<'a, LogState>> {
        while log.open.as_ref().is_some_and(|o| o.seq == seq && !o.in_flight.is_empty()) && log.poisoned.is_none() {
            log = self.written.wait(log).unwrap_or_else(|e| e.into_inner());
        }
        Self::not_poisoned(&log)?;
        if log.open.as_ref().is_none_or(|o| o.seq != seq) {
            return Ok(log);
        }
        let Some(open) = log.open.take() else { return Ok(log) };
        if let Some(s) = log.segments.get_mut(open.index as usize) {
            s.state = SegState::Sealed { end_unit: open.tail };
        }
        log.unsummarized.push(open);
        log.seals_since_checkpoint += 1;
        if log.seals_since_checkpoint >= self.opts.checkpoint_every_segments {
            // Every record reserved so far is written (this seal waited for the last ones), so
            // the snapshot describes a written prefix of the log; the checkpointer syncs it
            // before writing the checkpoint, while the log goes on.
            let through = Self::written_through_locked(&log);
            let cp = self.snapshot(&mut log);
            if let Some(jobs) = self.checkpoint_jobs.lock().unwrap_or_else(|e| e.into_inner()).as_ref() {
                // A send fails only when the thread is gone; `close` writes a checkpoint anyway.
                let _ = jobs.send(checkpointer::Job { cp, through });
            }
        }
        Ok(log)
    }

    /// Syncs the device, then writes the summaries of the segments sealed since the last sync.
    /// Called with no record in flight in those segments (a seal waits for them).
    fn sync_and_summarize(&self, log: &mut LogState) -> Result<()> {
        if let Err(e) = self.dev.sync() {
            self.poison(log, e.to_string());
            return Err(e.into());
        }
        self.write_summaries(log, |_| true)
    }

    /// Starts appending to a segment: the one sealed by the last clean close if it has room,
    /// else a new segment use, reclaiming a segment first when none is free.
    fn open_segment(&self, log: &mut LogState) -> Result<()> {
        if let Some(seg) = log.resumable.take() {
            let still = log
                .segments
                .get(seg.index as usize)
                .is_some_and(|s| s.seq == seg.seq && matches!(s.state, SegState::Sealed { .. }));
            if still {
                return self.resume(log, seg);
            }
        }
        let free = log.segments.iter().position(|s| s.state == SegState::Free);
        let index = match free {
            Some(i) => i as u32,
            None => self.reclaim(log)?,
        };
        let seq = log.next_seq;
        let now = self.clock.now_unix_ms();
        let header = SegmentHeader { volume_id: self.sb.volume_id, segment_index: index, seq, created_unix_ms: now };
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        unit.copy_from_slice(&header.encode());
        // The first use of a run is synced before any record goes into it. Recovery skips a gap of
        // seqs past the highest it finds, for uses a crash lost without a trace; that is only
        // enough if the run's first seq is on disk (docs/format.md, "Opening a volume").
        let written = self.dev.write_at(&unit, self.sb.segment_offset(index)).and_then(|()| {
            if log.seq_durable {
                return Ok(());
            }
            self.metrics.syncs.fetch_add(1, Ordering::Relaxed);
            self.dev.sync()
        });
        if let Err(e) = written {
            self.poison(log, e.to_string());
            return Err(e.into());
        }
        log.seq_durable = true;
        log.next_seq += 1;
        if let Some(s) = log.segments.get_mut(index as usize) {
            *s = SegInfo { state: SegState::Open, seq, created_unix_ms: now };
        }
        log.open = Some(OpenSeg::new(index, seq));
        Ok(())
    }

    /// Unseals `seg` for appends: erases its summary and trailer (so no copy of a header can be
    /// taken for a record later, and recovery scans it), syncs, and makes it the open segment.
    fn resume(&self, log: &mut LogState, seg: OpenSeg) -> Result<()> {
        let base = self.sb.segment_offset(seg.index);
        let summary = AlignedBuf::zeroed(seg.summary.len());
        let trailer = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let erased = self
            .dev
            .write_at(&summary, base + u64::from(seg.tail) * UNIT_BYTES)
            .and_then(|()| self.dev.write_at(&trailer, base + u64::from(self.sb.segment_units() - 1) * UNIT_BYTES))
            .and_then(|()| self.dev.sync());
        if let Err(e) = erased {
            self.poison(log, e.to_string());
            return Err(e.into());
        }
        if let Some(s) = log.segments.get_mut(seg.index as usize) {
            s.state = SegState::Open;
        }
        log.open = Some(seg);
        Ok(())
    }

    /// Empties one sealed segment chosen by the policy and returns its index.
    ///
    /// The segment's header is zeroed and synced before its blocks leave the index, so they can
    /// never come back after a crash. A victim that is not the oldest could hold the newest
    /// version of a key whose older version lives in an older segment; a checkpoint written
    /// first makes sure replay never brings that older version back.
    fn reclaim(&self, log: &mut LogState) -> Result<u32> {
        let sealed: Vec<SegmentView> = log
            .segments
            .iter()
            .enumerate()
            .filter_map(|(i, s)| match s.state {
                SegState::Sealed { end_unit } => {
                    Some(SegmentView { index: i as u32, seq: s.seq, created_unix_ms: s.created_unix_ms, end_unit })
                }
                _ => None,
            })
            .collect();
        let oldest = OldestFirst
            .choose_victim(&sealed)
            .ok_or_else(|| StoreError::invalid("volume", "no sealed segment to reclaim"))?;
        // Segments holding pinned keys are passed over while any other is left.
        let pinned = {
            let keys = self.pins.live(self.clock.now_unix_ms());
            if keys.is_empty() {
                Default::default()
            } else {
                pins::segments_of(&self.index_read(), &keys)
            }
        };
        let unpinned: Vec<SegmentView> = sealed.iter().filter(|s| !pinned.contains(&s.index)).copied().collect();
        let candidates = if unpinned.is_empty() {
            self.metrics.pins_overridden.fetch_add(1, Ordering::Relaxed);
            tracing::warn!("every sealed segment holds a pinned key: reclaiming the oldest anyway");
            &sealed
        } else {
            &unpinned
        };
        let victim = self
            .opts
            .reclaim_policy
            .choose_victim(candidates)
            .filter(|v| candidates.iter().any(|s| s.index == *v))
            .or_else(|| OldestFirst.choose_victim(candidates))
            .unwrap_or(oldest);
        // Its summary, if still waiting, would describe bytes that are about to be reused.
        log.unsummarized.retain(|s| s.index != victim);
        let dropped = self.index_write().drop_segment(victim);
        if let Some(dram) = &self.dram {
            dram.drop_segment(victim);
        }
        if let Some(s) = log.segments.get_mut(victim as usize) {
            *s = SegInfo::FREE;
        }
        if victim != oldest && !self.covered_through(&sealed, victim) {
            self.checkpoint(log)?;
        }
        let zero = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let freed = self.dev.write_at(&zero, self.sb.segment_offset(victim)).and_then(|()| self.dev.sync());
        if let Err(e) = freed {
            self.poison(log, e.to_string());
            return Err(e.into());
        }
        self.metrics.add_eviction(dropped);
        tracing::debug!(segment = victim, keys = dropped.keys, blocks = dropped.blocks, "segment reclaimed");
        Ok(victim)
    }

    /// Whether the newest checkpoint written covers `victim` and every sealed segment older than
    /// it, each at its current use and end. Then reclaiming `victim` needs no new checkpoint even
    /// though it is not the oldest: recovery loads that checkpoint, drops what it says was in
    /// `victim` (its use is gone), and replays nothing older, so no older version of a key whose
    /// newest version was in `victim` can come back.
    fn covered_through(&self, sealed: &[SegmentView], victim: u32) -> bool {
        let Some(limit) = sealed.iter().find(|s| s.index == victim).map(|s| s.seq) else { return false };
        let covers = self.checkpoint_covers.lock().unwrap_or_else(|e| e.into_inner());
        sealed.iter().filter(|s| s.seq <= limit).all(|s| {
            covers.get(s.index as usize).is_some_and(|c| c.sealed && c.seq == s.seq && c.end_unit == s.end_unit)
        })
    }

    /// Syncs the device and writes a checkpoint of the index. Called with no record in flight.
    fn checkpoint(&self, log: &mut LogState) -> Result<()> {
        self.sync_and_summarize(log)?;
        let cp = self.snapshot(log);
        self.save_checkpoint(&cp)
    }

    /// The index as a checkpoint. Called with no record in flight and every record durable, so
    /// that the snapshot describes exactly a durable prefix of the log.
    fn snapshot(&self, log: &mut LogState) -> Checkpoint {
        debug_assert!(log.open.as_ref().is_none_or(|o| o.in_flight.is_empty()));
        let segments = log
            .segments
            .iter()
            .enumerate()
            .map(|(i, s)| match s.state {
                SegState::Free => SegmentState { seq: 0, end_unit: 0, sealed: false },
                SegState::Sealed { end_unit } => SegmentState { seq: s.seq, end_unit, sealed: true },
                SegState::Open => {
                    let tail = log.open.as_ref().filter(|o| o.index == i as u32).map_or(1, |o| o.tail);
                    SegmentState { seq: s.seq, end_unit: tail, sealed: false }
                }
            })
            .collect();
        let index = self.index_read();
        let (contents, keys) = index.to_checkpoint();
        let cp = Checkpoint {
            volume_id: self.sb.volume_id,
            checkpoint_seq: log.next_checkpoint_seq,
            created_unix_ms: self.clock.now_unix_ms(),
            next_segment_seq: log.next_seq,
            segments,
            namespaces: index.namespaces().to_vec(),
            contents,
            keys,
        };
        log.next_checkpoint_seq += 1;
        log.seals_since_checkpoint = 0;
        cp
    }

    /// Writes a checkpoint unless a newer one was written already (snapshots taken under the log
    /// lock are written after it is released, possibly out of order).
    fn save_checkpoint(&self, cp: &Checkpoint) -> Result<()> {
        let mut last = self.checkpoint_saved.lock().unwrap_or_else(|e| e.into_inner());
        if cp.checkpoint_seq <= *last {
            return Ok(());
        }
        if self.checkpoints.save(self.dev.as_ref(), cp)? {
            *last = cp.checkpoint_seq;
            *self.checkpoint_covers.lock().unwrap_or_else(|e| e.into_inner()) = cp.segments.clone();
            self.metrics.checkpoints.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// What a sync about to start will cover: the position through which every reserved record
    /// has been written, and the sealed segments whose summaries wait for a sync (their records
    /// are all written).
    fn sync_point(&self) -> (Pos, Vec<(u32, u64)>) {
        let sealed = self.lock_log().unsummarized.iter().map(|s| (s.index, s.seq)).collect();
        (self.written_through(), sealed)
    }

    /// Writes the summaries of `sealed` segments (index, seq) still waiting, after a sync that
    /// began when they were sealed.
    fn summarize(&self, sealed: &[(u32, u64)]) -> Result<()> {
        if sealed.is_empty() {
            return Ok(());
        }
        self.write_summaries(&mut self.lock_log(), |s| sealed.contains(&(s.index, s.seq)))
    }

    /// Writes the waiting summaries of the sealed segments `which` selects, and forgets them.
    /// A failed write poisons the store.
    fn write_summaries(&self, log: &mut LogState, which: impl Fn(&OpenSeg) -> bool) -> Result<()> {
        let (ready, waiting): (Vec<OpenSeg>, _) = std::mem::take(&mut log.unsummarized).into_iter().partition(which);
        log.unsummarized = waiting;
        for seg in &ready {
            if let Err(e) =
                write_seal(self.dev.as_ref(), &self.sb, seg.index, seg.seq, seg.tail, &seg.summary, seg.records)
            {
                self.poison(log, e.to_string());
                return Err(e.into());
            }
        }
        Ok(())
    }

    /// The position through which every reserved record has been written.
    fn written_through(&self) -> Pos {
        Self::written_through_locked(&self.lock_log())
    }

    fn written_through_locked(log: &LogState) -> Pos {
        match &log.open {
            Some(open) => open.written_through(),
            None => Pos { seq: log.next_seq, unit: 0 },
        }
    }
}

fn random_bytes() -> [u8; 16] {
    let mut out = [0u8; 16];
    if let Ok(mut f) = File::open("/dev/urandom") {
        use std::io::Read;
        let _ = f.read_exact(&mut out);
    }
    out
}

#[cfg(test)]
mod tests;
