//! Operation counters since the store was opened (the log, the tiers and the checkpoints keep
//! their own): what `Store::stats` reports.

use std::sync::atomic::{AtomicU64, Ordering};

use kvhoard_format::record::{RecordHeader, RecordKind};

use crate::index::Dropped;

/// Counters of what the store did.
/// Each is named for what it counts; [`crate::Stats`] and docs/operations.md explain them.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    pub puts: AtomicU64,
    pub put_bytes: AtomicU64,
    pub dedup_hits: AtomicU64,
    pub gets: AtomicU64,
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub get_bytes: AtomicU64,
    pub read_errors: AtomicU64,
    pub direct_reads: AtomicU64,
    pub deletes: AtomicU64,
    pub evicted_keys: AtomicU64,
    pub evicted_blocks: AtomicU64,
    pub evicted_bytes: AtomicU64,
    pub segments_reclaimed: AtomicU64,
    pub pins_overridden: AtomicU64,
    /// Keys of contexts placement's planner dropped, removed at once (`reclaim/drops.rs`).
    pub planner_dropped_keys: AtomicU64,
    /// Blocks stored compressed by the store's codec.
    pub compressed: AtomicU64,
    /// Blocks a codec was asked for but could not take (no tensor description, no gain): stored
    /// as they are.
    pub codec_skipped: AtomicU64,
    /// Blocks decoded on a read.
    pub decoded: AtomicU64,
    /// Segments a cleaner emptied ahead of need.
    pub segments_cleaned: AtomicU64,
    /// Segments freed while an older one was still in the log, recorded in the superblock.
    pub segments_freed_ahead: AtomicU64,
    /// Records a cleaner wrote again (blocks and links it kept).
    pub relocated_records: AtomicU64,
    /// Bytes of those records: cleaning's writes, for write amplification.
    pub relocated_bytes: AtomicU64,
    /// Blocks the cleaner wrote again in another codec's form.
    pub recompressed_records: AtomicU64,
    /// Bytes those records take less than the ones they replaced.
    pub recompressed_saved_bytes: AtomicU64,
    /// Blocks recoded to a lossy form from their original bytes (the population quality is
    /// sampled from).
    pub lossy_recodes: AtomicU64,
    /// Blocks put in a lossy form placement chose for their context (the other population
    /// quality is sampled from).
    pub lossy_puts: AtomicU64,
    /// Of those, blocks whose quality was estimated and told to placement.
    pub quality_samples: AtomicU64,
    /// Samples after which placement scored the block's context again (below what it assumed by
    /// more than the namespace's drift).
    pub quality_rescored: AtomicU64,
}

impl Metrics {
    /// Counts a reserved record of a put.
    pub(crate) fn count_put(&self, h: &RecordHeader) {
        match h.kind {
            RecordKind::Block => {
                self.puts.fetch_add(1, Ordering::Relaxed);
                self.put_bytes.fetch_add(h.stored_len, Ordering::Relaxed);
            }
            RecordKind::Link => {
                self.puts.fetch_add(1, Ordering::Relaxed);
                self.dedup_hits.fetch_add(1, Ordering::Relaxed);
            }
            RecordKind::Tombstone | RecordKind::Lost => {}
        }
    }

    /// Counts a get that returned `hit_bytes` bytes, or missed.
    pub(crate) fn count_get(&self, hit_bytes: Option<u64>) {
        match hit_bytes {
            Some(n) => {
                self.hits.fetch_add(1, Ordering::Relaxed);
                self.get_bytes.fetch_add(n, Ordering::Relaxed);
            }
            None => {
                self.misses.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Counts a reclaimed segment and what it dropped.
    pub(crate) fn count_eviction(&self, d: &Dropped) {
        self.evicted_keys.fetch_add(d.keys, Ordering::Relaxed);
        self.evicted_blocks.fetch_add(d.blocks, Ordering::Relaxed);
        self.evicted_bytes.fetch_add(d.bytes, Ordering::Relaxed);
        self.segments_reclaimed.fetch_add(1, Ordering::Relaxed);
    }

    /// Reads a counter.
    pub(crate) fn get(counter: &AtomicU64) -> u64 {
        counter.load(Ordering::Relaxed)
    }
}
