//! A store's parts, one per layer, wired together: what every operation shares.
//!
//! Locks, always taken in this order: the log lock ([`Log::lock`]: segment states, the open
//! segment, reservations), then the index lock (read-mostly; gets take only its read lock), then
//! the leaf locks (the log's pending records, the pins, the checkpoints' bookkeeping, the DRAM
//! tier's shards, placement's own state). Device I/O for records runs outside all of them.

use std::fs::File;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard, RwLockWriteGuard};

use crate::buffer::BufferPool;
use crate::checkpoint::Checkpoints;
use crate::clock::Clock;
use crate::codec::Codecs;
use crate::error::{Result, StoreError};
use crate::index::{Index, KeyFp};
use crate::log::{Log, LogState};
use crate::metrics::Metrics;
use crate::options::StoreOptions;
use crate::placement::group_ttl::NamespaceTtls;
use crate::placement::Placement;
use crate::policy::Policies;
use crate::reclaim::pins::Pins;
use crate::recovery::RecoveryReport;
use crate::tier::Tiers;

/// The parts of an open store.
#[derive(Debug)]
pub(crate) struct Parts {
    /// The log: device, segment states, reservations, group commit.
    pub(crate) log: Arc<Log>,
    /// Key → block → location.
    pub(crate) index: RwLock<Index>,
    /// The DRAM tier and what every tier counts.
    pub(crate) tiers: Tiers,
    /// Checkpoints of the index.
    pub(crate) checkpoints: Arc<Checkpoints>,
    /// Keys kept out of reclaim's way while they are read.
    pub(crate) pins: Pins,
    /// Where blocks live and in what form.
    pub(crate) placement: Arc<dyn Placement>,
    /// Record buffers for puts and gets, reused without zeroing.
    pub(crate) pool: Arc<BufferPool>,
    /// Codec contexts for compressing on put and decoding on get.
    pub(crate) codecs: Codecs,
    /// Each namespace's codec policy.
    pub(crate) policies: Policies,
    /// Group TTL of the namespaces whose settings ask for it.
    pub(crate) ttls: Arc<NamespaceTtls>,
    /// The background cleaner's controls (it runs when placement cleans).
    pub(crate) cleaner: Arc<crate::reclaim::control::CleanerControl>,
    /// What the store did.
    pub(crate) metrics: Metrics,
    /// How the store was opened.
    pub(crate) opts: StoreOptions,
    /// Source of the current time.
    pub(crate) clock: Clock,
    /// The cores this process may use, asked once at open: the standard library reads the
    /// cgroup's files each time it is asked, seven reads that a put would otherwise pay.
    pub(crate) cores: usize,
    /// What opening the volume found and did.
    pub(crate) recovery: RecoveryReport,
    /// Set by `close`: later reads fail instead of reading a volume another process may own.
    pub(crate) closed: AtomicBool,
    /// Where reserved records wait for the log writer.
    pub(crate) handoff: Arc<crate::writer::Handoff>,
    /// The volume's exclusive lock; released by `close`, so the volume can be opened again by
    /// this or another process while this handle is still alive.
    pub(crate) lock: Mutex<Option<File>>,
}

impl Drop for Parts {
    /// Ends the log writer (after what it was handed) however the parts go: a store closed, a
    /// panicking drop, or an open that failed after the writer started.
    fn drop(&mut self) {
        self.handoff.close();
    }
}

impl Parts {
    /// Fails once the store is closed.
    pub(crate) fn ensure_open(&self) -> Result<()> {
        if self.closed.load(Ordering::Acquire) {
            return Err(StoreError::Closed);
        }
        Ok(())
    }

    /// The index, for reading.
    pub(crate) fn index_read(&self) -> RwLockReadGuard<'_, Index> {
        self.index.read().unwrap_or_else(|e| e.into_inner())
    }

    /// The index, for changing (in log order, under the log lock).
    pub(crate) fn index_write(&self) -> RwLockWriteGuard<'_, Index> {
        self.index.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Removes `key` from `index` (this store's, write-locked) and, with its block's last key,
    /// the block's copy in the DRAM tier; whether the key was there.
    pub(crate) fn unindex_key(&self, index: &mut Index, key: &KeyFp) -> bool {
        let content = index.key(key).and_then(|k| index.content(k.content)).map(|c| c.fp);
        if !index.remove_key(key) {
            return false;
        }
        if let Some(fp) = content.filter(|fp| index.content_slot(fp).is_none()) {
            self.tiers.remove(&fp);
        }
        true
    }

    /// Syncs the device and writes a checkpoint now. Called under the log lock with no record in
    /// flight.
    pub(crate) fn checkpoint_now(&self, state: &mut LogState) -> Result<()> {
        self.checkpoints.write_now(state, &self.index, &self.log, &self.clock)
    }
}
