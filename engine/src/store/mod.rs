//! The store: the public face of the engine. It opens a volume (recovery rebuilds the log state
//! and the index), wires the layers into [`Parts`], and answers the native API:
//!
//! - `put.rs`: `put`, `put_batch`, `delete`, `rename`: check, then append;
//! - `append.rs`: how a record joins the log (hashed and built outside any lock, reserved in log
//!   order, indexed, offered to the DRAM tier), opening or reclaiming segments as it goes;
//! - `submit.rs`: writing reserved records and waiting for the written watermark;
//! - `get.rs`: `get`, `get_into`, `meta`, `contains`, `get_by_hash`; `decode.rs`: what a read
//!   returns of a compressed block (`get_kv`, `get_frame`) and `recompress`; `list.rs`: listings;
//! - `pin.rs`: pins; `stats.rs` and `prometheus.rs`: what the store reports.

pub(crate) mod append;
mod decode;
mod direct;
mod get;
mod get_batch;
mod list;
mod pin;
mod plan;
mod prometheus;
mod put;
mod put_stream;
pub(crate) mod recode;
mod sample;
mod stats;
mod submit;

pub use direct::DIRECT_READ_MIN_BYTES;
pub use get::Resident;
pub use list::{ListCursor, ListEntry, ListPage};
pub use stats::{CodecStats, NamespaceStats, PolicyStats, Stats};

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::thread::JoinHandle;

use kvhoard_format::record::validate_namespace;
use kvhoard_format::superblock::Superblock;

use crate::buffer::BufferPool;
use crate::checkpoint::{self, CheckpointStore, Checkpoints};
use crate::clock::Clock;
use crate::codec::Codecs;
use crate::device::{open_volume, BlockDevice};
use crate::error::{Result, StoreError};
use crate::log::{Log, LogState};
use crate::metrics::Metrics;
use crate::options::{CreateOptions, StoreOptions};
use crate::parts::Parts;
use crate::placement::group_ttl;
use crate::policy::{Policies, Policy};
use crate::reclaim::cleaner;
use crate::reclaim::control::CleanerControl;
use crate::reclaim::pins::Pins;
use crate::recovery::{recover, RecoveryReport};
use crate::thread::Stopper;
use crate::tier::Tiers;
use crate::volume::{self, VolumePaths};

/// A kvhoard volume, open. Cheap to share: all methods take `&self` and are thread-safe.
#[derive(Debug)]
pub struct Store {
    parts: Arc<Parts>,
    /// The log writer's thread.
    writer_thread: Mutex<Option<JoinHandle<()>>>,
    checkpointer: Mutex<Option<JoinHandle<()>>>,
    /// The background cleaner, when placement cleans.
    cleaner: Mutex<Option<(Arc<CleanerControl>, JoinHandle<()>)>>,
    /// Group TTL's planning thread.
    ttl_planner: Mutex<Option<(Arc<Stopper>, JoinHandle<()>)>>,
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
        let dev = Self::open_device(paths, &opts)?;
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
        let dev = Self::open_device(&paths, &opts)?;
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

    fn open_device(paths: &VolumePaths, opts: &StoreOptions) -> Result<Arc<dyn BlockDevice>> {
        open_volume(&paths.data, opts.io_backend, opts.direct_io, opts.uring).map_err(|source| StoreError::File {
            action: "cannot open",
            path: paths.data.clone(),
            source,
        })
    }

    fn format_device(dev: &dyn BlockDevice, create: &CreateOptions, slots: bool, clock: &Clock) -> Result<()> {
        let now = clock.now_unix_ms();
        let id = *blake3::hash(&[&now.to_le_bytes()[..], &std::process::id().to_le_bytes(), &random_bytes()].concat())
            .as_bytes();
        let mut volume_id = [0u8; 16];
        volume_id.copy_from_slice(id.get(..16).unwrap_or(&[0; 16]));
        let sb = volume::plan(dev.capacity_bytes(), create, slots, volume_id, now)?;
        volume::format(dev, &sb)
    }

    fn read_superblock(dev: &dyn BlockDevice, path: &Path) -> Result<Superblock> {
        let sb = volume::read_superblock(dev).map_err(|e| match e {
            e @ kvhoard_format::FormatError::UnsupportedVersion { .. } => StoreError::Superblock(e),
            e => StoreError::NotAVolume { path: path.to_path_buf(), reason: e.to_string() },
        })?;
        if sb.capacity_bytes > dev.capacity_bytes() {
            return Err(StoreError::Damaged {
                path: path.to_path_buf(),
                reason: format!(
                    "the volume file was cut short ({} bytes of {}): the segments past its end are lost",
                    dev.capacity_bytes(),
                    sb.capacity_bytes
                ),
            });
        }
        Ok(sb)
    }

    /// Recovers the volume, wires the layers and starts the engine's threads.
    fn start(
        dev: Arc<dyn BlockDevice>,
        sb: Superblock,
        checkpoint_store: CheckpointStore,
        opts: StoreOptions,
        lock: Option<File>,
    ) -> Result<Store> {
        opts.validate()?;
        let recovered = recover(dev.as_ref(), &sb, &checkpoint_store)?;
        let dev_for_policies = Arc::clone(&dev);
        tracing::info!(
            checkpoint = ?recovered.report.checkpoint_seq,
            segments_replayed = recovered.report.segments_replayed,
            records_replayed = recovered.report.records_replayed,
            keys = recovered.index.key_count(),
            elapsed_ms = recovered.report.elapsed_ms,
            "volume opened"
        );
        let describes_index = recovered.report.checkpoint_alone().then(|| recovered.index.changes());
        let state = LogState::new(
            recovered.segments,
            recovered.open,
            recovered.resumable,
            recovered.next_seq,
            recovered.next_checkpoint_seq,
            recovered.freed_ahead,
        );
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get);
        let parts = Arc::new(Parts {
            log: Arc::new(Log::new(dev, sb, state, opts.clock.clone())),
            index: RwLock::new(recovered.index),
            tiers: Tiers::new(opts.dram_tier_bytes, cores),
            checkpoints: Arc::new(Checkpoints::new(
                checkpoint_store,
                recovered.report.checkpoint_seq.unwrap_or(0),
                recovered.checkpoint_covers,
                describes_index,
            )),
            pins: Pins::default(),
            placement: Arc::clone(&opts.placement),
            pool: BufferPool::new(64, opts.buffer_pool_bytes),
            codecs: Codecs::default(),
            cleaner: Arc::new(CleanerControl::default()),
            policies: Policies::load(volume::read_policies(dev_for_policies.as_ref())),
            ttls: Arc::default(),
            metrics: Metrics::default(),
            clock: opts.clock.clone(),
            cores,
            recovery: recovered.report,
            closed: AtomicBool::new(false),
            handoff: Arc::new(crate::writer::Handoff::new(opts.writer.in_flight_bytes)),
            lock: Mutex::new(lock),
            opts,
        });
        parts.placement.measure_with(Arc::clone(&parts.tiers.speeds));
        let writer = submit::spawn_writer(&parts)?;
        let (jobs, checkpointer) =
            checkpoint::spawn_background(Arc::downgrade(&parts.log), Arc::downgrade(&parts.checkpoints))?;
        parts.checkpoints.start_background(jobs);
        let cleaner = if parts.placement.cleans() {
            let control = Arc::clone(&parts.cleaner);
            let handle = cleaner::spawn(Arc::downgrade(&parts), Arc::clone(&control))?;
            Some((control, handle))
        } else {
            None
        };
        for (namespace, policy) in parts.policies.all() {
            parts.ttls.configure(&namespace, policy.settings.ttl);
        }
        let stopper = Arc::new(Stopper::default());
        let ttl_planner = group_ttl::spawn(Arc::downgrade(&parts.ttls), parts.clock.clone(), Arc::clone(&stopper))?;
        let store = Store {
            parts,
            writer_thread: Mutex::new(Some(writer)),
            checkpointer: Mutex::new(Some(checkpointer)),
            cleaner: Mutex::new(cleaner),
            ttl_planner: Mutex::new(Some((stopper, ttl_planner))),
        };
        let report = &store.parts.recovery;
        if report.records_replayed > 0 || report.stale_segments_freed > 0 || report.keys_voided > 0 {
            // Save the replay's work for the next open.
            let mut state = store.parts.log.lock();
            store.parts.checkpoint_now(&mut state)?;
        }
        Ok(store)
    }

    /// What opening the volume found and did.
    pub fn recovery_report(&self) -> &RecoveryReport {
        &self.parts.recovery
    }

    /// The volume's superblock as it was opened (its `freed_ahead` may have grown since).
    pub fn superblock(&self) -> &Superblock {
        &self.parts.log.sb
    }

    /// The largest block this volume stores when its record header (key, namespace, description,
    /// codec parameters) fits in one 4 KiB unit, as it does for every key under about 3.5 KB: a
    /// little less than a segment. A put of a larger block fails with
    /// [`StoreError::BlockTooLarge`], which gives the exact limit for that record.
    pub fn max_block_bytes(&self) -> u64 {
        crate::log::max_payload_bytes(self.parts.log.sb.segment_units(), kvhoard_format::UNIT_BYTES as usize)
    }

    /// The policy of `namespace`: its default codec and whether lossy codecs may be applied.
    pub fn policy(&self, namespace: &str) -> Policy {
        self.parts.policies.get(namespace)
    }

    /// Every namespace policy set on this volume.
    pub fn policies(&self) -> Vec<(String, Policy)> {
        self.parts.policies.all()
    }

    /// Sets `namespace`'s policy, durably (it is kept with the superblock). Blocks already
    /// stored keep their codec; puts from now on follow the new policy.
    pub fn set_policy(&self, namespace: &str, policy: Policy) -> Result<()> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        policy.validate()?;
        let parts = &self.parts;
        // One writer of the superblock at a time: the log lock, which nothing holds for long.
        let state = parts.log.lock();
        // A close that began meanwhile has let the volume go: its superblock is not this
        // handle's to write.
        if state.closed {
            return Err(StoreError::Closed);
        }
        let stored = parts.policies.with(namespace, policy.clone());
        parts.log.write_superblocks(&state, &stored)?;
        parts.ttls.configure(namespace, policy.settings.ttl);
        parts.policies.set(namespace, policy);
        Ok(())
    }

    /// Frees the store's I/O buffers that have been unused for `idle` or longer (the pool keeps
    /// them to save page faults while traffic lasts); returns the bytes freed. A server calls
    /// this now and then so that memory taken by a burst goes back to the system after it.
    pub fn trim_buffers(&self, idle: std::time::Duration) -> usize {
        self.parts.pool.trim(idle)
    }

    /// Writes everything buffered, seals the open segment, syncs and writes a checkpoint. The
    /// next open reads the checkpoint and nothing else; its first write resumes the segment
    /// sealed here if it has room. Releases the volume's lock, so it can be opened again while
    /// this handle lives; every later call on this handle fails with [`StoreError::Closed`].
    pub fn close(&self) -> Result<()> {
        self.stop_ttl_planner();
        self.stop_cleaner();
        let parts = &self.parts;
        // Refuse new reservations first, and let the records reserved already (a put between
        // its reservation and handing it over, or waiting for room) reach the device before
        // the writer stops: a put racing close either fails before it reserves or completes.
        let already = std::mem::replace(&mut parts.log.lock().closed, true);
        parts.log.wait_idle();
        self.stop_writer();
        self.stop_checkpointer();
        if already {
            return Ok(());
        }
        let mut state = parts.log.lock();
        parts.closed.store(true, Ordering::Release);
        let result = match state.poisoned.clone() {
            Some(reason) => Err(StoreError::Poisoned { reason }),
            None => match state.open.as_ref().map(|o| o.seq) {
                Some(seq) => parts
                    .log
                    .seal_open(state, seq, parts.opts.checkpoint_every_segments)
                    .and_then(|(mut state, _)| parts.checkpoint_now(&mut state)),
                // Nothing written or changed since the checkpoint this open loaded (a `stat`, a
                // run of reads): writing it again would only wear the device.
                None if state.unsummarized.is_empty()
                    && parts.checkpoints.describes(
                        &state.segment_table(),
                        parts.index.read().unwrap_or_else(|e| e.into_inner()).changes(),
                    ) =>
                {
                    Ok(())
                }
                None => parts.checkpoint_now(&mut state),
            },
        };
        // Whatever the outcome, this handle writes no more: the next open (replaying the log if
        // the checkpoint failed) may take the volume.
        parts.lock.lock().unwrap_or_else(|e| e.into_inner()).take();
        result
    }

    /// Stops group TTL's planning thread after the plan it is making, and waits for it.
    fn stop_ttl_planner(&self) {
        let planner = self.ttl_planner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((stopper, handle)) = planner {
            stopper.stop();
            if handle.join().is_err() {
                tracing::error!("group TTL's planning thread panicked; its namespaces kept their last plans");
            }
        }
    }

    /// Stops the cleaner after the segment it is cleaning, and waits for it.
    fn stop_cleaner(&self) {
        let cleaner = self.cleaner.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((control, handle)) = cleaner {
            control.stop();
            let _ = handle.join();
        }
    }

    /// Cleans one segment now, whatever the number of free ones (placement chooses it and what
    /// of it to keep). Returns the segment freed, or `None` when none could be cleaned.
    pub fn clean_now(&self) -> Result<Option<u32>> {
        self.parts.ensure_open()?;
        Ok(crate::reclaim::clean::clean_one(&self.parts)?.map(|c| c.segment))
    }

    /// [`Store::clean_now`], calling `between` with the segment being cleaned once the cleaning
    /// has planned what to keep and before it writes any of it: the window in which a client's
    /// puts and deletes race a background cleaning, opened at a known point so that tests can
    /// put operations in it. Not for serving.
    #[doc(hidden)]
    pub fn clean_now_around(&self, between: impl FnOnce(u32)) -> Result<Option<u32>> {
        self.parts.ensure_open()?;
        Ok(crate::reclaim::clean::clean_planned_then(&self.parts, None, between)?.map(|c| c.segment))
    }

    /// Lets the checkpointer finish what it is writing and waits for it: the checkpoint `close`
    /// writes must be the last thing written to the volume.
    fn stop_checkpointer(&self) {
        self.parts.checkpoints.stop_background();
        let handle = self.checkpointer.lock().unwrap_or_else(|e| e.into_inner()).take();
        if handle.is_some_and(|h| h.join().is_err()) {
            tracing::error!("checkpoint thread panicked");
        }
    }

    fn stop_writer(&self) {
        let writer = self.writer_thread.lock().unwrap_or_else(|e| e.into_inner()).take();
        self.parts.handoff.close();
        if let Some(handle) = writer {
            if handle.join().is_err() {
                tracing::error!("the log writer thread panicked");
            }
        }
    }
}

impl Drop for Store {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // A panicking caller may have left a reservation unwritten; sealing would wait for
            // it forever. The next open recovers from the log. The checkpointer ends after what
            // it is writing (it holds no strong reference to the store); so does the log writer,
            // after what it was handed.
            self.parts.checkpoints.stop_background();
            self.parts.handoff.close();
            return;
        }
        if let Err(e) = self.close() {
            tracing::warn!(error = %e, "closing the store failed; the next open will replay the log");
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
