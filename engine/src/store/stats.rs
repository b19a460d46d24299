//! The `stats()` snapshot: what every layer counts, in one structure.

use crate::placement::PlacementReport;
use crate::tier::SpeedReport;
use std::sync::atomic::{AtomicU64, Ordering};

use kvhoard_format::UNIT_BYTES;

use super::Store;
use crate::log::SegState;
use crate::metrics::Metrics;
use crate::parts::Parts;
use crate::recovery::RecoveryReport;
use crate::tier::{TierCounters, TierStats};

/// One namespace's share of the volume.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NamespaceStats {
    /// Name.
    pub name: String,
    /// Keys.
    pub keys: u64,
    /// Distinct stored blocks.
    pub blocks: u64,
    /// Sum of the sizes of the keys' blocks.
    pub logical_bytes: u64,
    /// Raw bytes of the distinct blocks.
    pub unique_bytes: u64,
    /// Bytes their records occupy.
    pub stored_bytes: u64,
}

/// The blocks stored with one kind of codec.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct CodecStats {
    /// The kind: raw, lossless, quant, drop, drop+lossless, drop+quant, unknown.
    pub codec: String,
    /// Distinct blocks.
    pub blocks: u64,
    /// Their original (decoded) bytes.
    pub logical_bytes: u64,
    /// Bytes their records occupy.
    pub stored_bytes: u64,
}

/// A namespace's policy, as `stat` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct PolicyStats {
    /// Namespace.
    pub namespace: String,
    /// Default codec (`raw`: none).
    pub codec: String,
    /// Whether lossy codecs may be applied.
    pub lossy: bool,
}

/// A snapshot of the store's state and counters.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[expect(missing_docs, reason = "the counters are named for what they count; docs/operations.md explains them")]
pub struct Stats {
    pub capacity_bytes: u64,
    pub segment_size_bytes: u64,
    pub segments: u32,
    pub segments_free: u32,
    pub segments_sealed: u32,
    /// Bytes of the log in use (records and summaries of segments in use).
    pub used_bytes: u64,
    /// Bytes occupied by records still reachable from a key.
    pub live_bytes: u64,
    pub keys: u64,
    pub blocks: u64,
    pub logical_bytes: u64,
    pub unique_bytes: u64,
    /// logical − unique: what deduplication saved.
    pub dedup_saved_bytes: u64,
    pub index_memory_bytes: u64,
    /// The entry vectors kept from the last checkpoint for the next one to fill (36 bytes per
    /// key and per block), so that its snapshot does not fault in fresh memory while puts wait.
    pub checkpoint_memory_bytes: u64,
    pub namespaces: Vec<NamespaceStats>,
    /// Blocks per kind of codec: logical (original) against stored bytes.
    pub codecs: Vec<CodecStats>,
    /// Namespace policies set on the volume.
    pub policies: Vec<PolicyStats>,
    /// Blocks the store compressed on put, since it was opened.
    pub compressed: u64,
    /// Blocks a codec was asked for but could not take, stored as they were.
    pub codec_skipped: u64,
    /// Blocks decoded on reads.
    pub decoded: u64,
    /// Segments the cleaner emptied ahead of need.
    pub segments_cleaned: u64,
    /// Segments freed while an older one was still in the log (each recorded in both superblock
    /// copies, two syncs, unless the record already said as much).
    pub segments_freed_ahead: u64,
    /// Records the cleaner wrote again (what placement kept).
    pub relocated_records: u64,
    /// Bytes the cleaner wrote.
    pub relocated_bytes: u64,
    /// Of those records, blocks the cleaner wrote in another codec's form (placement's plan).
    pub recompressed_records: u64,
    /// Bytes the recompressed records take less than the ones they replaced.
    pub recompressed_saved_bytes: u64,
    /// Blocks stored in a lossy form placement chose (put in it, or recoded to it by cleaning)
    /// whose quality was estimated (one in 16 of each) and told to placement.
    pub quality_samples: u64,
    /// Of those, samples after which placement scored the block's context again.
    pub quality_rescored: u64,
    /// Bytes written by cleaning ÷ bytes put (0 when nothing was put).
    pub write_amplification: f64,
    pub puts: u64,
    pub put_bytes: u64,
    pub dedup_hits: u64,
    pub gets: u64,
    pub hits: u64,
    pub misses: u64,
    pub get_bytes: u64,
    /// Blocks found damaged on read (served as misses).
    pub read_errors: u64,
    /// `get_into` calls the device served straight into the caller's buffer (no engine buffer,
    /// no copy).
    pub direct_reads: u64,
    pub deletes: u64,
    pub evicted_keys: u64,
    pub evicted_blocks: u64,
    pub evicted_bytes: u64,
    pub segments_reclaimed: u64,
    /// Keys pinned now ([`Store::pin`]).
    pub pinned_keys: u64,
    /// Segments reclaimed although they held a pinned key, because every sealed segment did.
    pub pins_overridden: u64,
    /// Keys of contexts placement's planner dropped (its greedy, or cleaning's drops), removed
    /// from the index at once; the rest of what a plan drops is counted by cleaning.
    pub planner_dropped_keys: u64,
    pub checkpoints: u64,
    /// Checkpoints that could not be written (the next open replays more of the log).
    pub checkpoint_errors: u64,
    /// Microseconds the last checkpoint's snapshot of the index took, during which every put
    /// waits (0 before the first since open).
    pub checkpoint_snapshot_us: u64,
    pub syncs: u64,
    pub device_backend: String,
    pub direct_io: bool,
    pub recovery: RecoveryReport,
    /// Per tier, fastest first: `dram` (when configured), then `ssd` (the log).
    pub tiers: Vec<TierStats>,
    /// Why writes are refused, if they are.
    pub poisoned: Option<String>,
    /// What placement says of itself (a planner: its contexts, bytes and budget).
    pub placement: PlacementReport,
    /// How fast gets loaded and decoded blocks since the volume opened (what a planner's delays
    /// follow).
    pub load_speeds: SpeedReport,
}

impl Store {
    /// The store's state and counters now.
    pub fn stats(&self) -> Stats {
        let parts = &self.parts;
        let sb = &parts.log.sb;
        let (free, sealed, used_units, poisoned) = {
            let state = parts.log.lock();
            let mut used = 0u64;
            let (mut free, mut sealed) = (0, 0);
            for s in &state.segments {
                match s.state {
                    SegState::Free => free += 1,
                    SegState::Sealed { end_unit } => {
                        sealed += 1;
                        used += u64::from(end_unit);
                    }
                    SegState::Open => used += state.open.as_ref().map_or(1, |o| u64::from(o.tail)),
                }
            }
            (free, sealed, used, state.poisoned.clone())
        };
        let index = parts.index_read();
        let namespaces: Vec<NamespaceStats> = index
            .namespaces()
            .iter()
            .enumerate()
            .map(|(id, name)| {
                let c = index.counters(id as u16);
                NamespaceStats {
                    name: name.clone(),
                    keys: c.keys,
                    blocks: c.blocks,
                    logical_bytes: c.logical_bytes,
                    unique_bytes: c.unique_bytes,
                    stored_bytes: c.stored_bytes,
                }
            })
            .collect();
        let codecs = index
            .codec_totals()
            .into_iter()
            .map(|(class, (blocks, logical_bytes, stored_bytes))| CodecStats {
                codec: kvhoard_kernels::class_name(class).to_string(),
                blocks,
                logical_bytes,
                stored_bytes,
            })
            .collect();
        let policies = parts
            .policies
            .all()
            .into_iter()
            .map(|(namespace, p)| PolicyStats {
                namespace,
                codec: p.codec.map_or_else(|| "raw".to_string(), |c| c.to_string()),
                lossy: p.lossy,
            })
            .collect();
        let sum = |f: fn(&NamespaceStats) -> u64| namespaces.iter().map(f).sum::<u64>();
        let tiers = parts.tier_stats(sum(|n| n.stored_bytes), index.block_count());
        let m = &parts.metrics;
        let get = Metrics::get;
        let caps = parts.log.dev.capabilities();
        Stats {
            capacity_bytes: u64::from(sb.segment_count) * sb.segment_size_bytes,
            segment_size_bytes: sb.segment_size_bytes,
            segments: sb.segment_count,
            segments_free: free,
            segments_sealed: sealed,
            used_bytes: used_units * UNIT_BYTES,
            live_bytes: sum(|n| n.stored_bytes),
            keys: index.key_count(),
            blocks: index.block_count(),
            logical_bytes: sum(|n| n.logical_bytes),
            unique_bytes: sum(|n| n.unique_bytes),
            dedup_saved_bytes: sum(|n| n.logical_bytes).saturating_sub(sum(|n| n.unique_bytes)),
            index_memory_bytes: index.memory_bytes(),
            checkpoint_memory_bytes: parts.checkpoints.spare_bytes(),
            namespaces,
            codecs,
            policies,
            compressed: get(&m.compressed),
            codec_skipped: get(&m.codec_skipped),
            decoded: get(&m.decoded),
            segments_cleaned: get(&m.segments_cleaned),
            segments_freed_ahead: get(&m.segments_freed_ahead),
            relocated_records: get(&m.relocated_records),
            relocated_bytes: get(&m.relocated_bytes),
            recompressed_records: get(&m.recompressed_records),
            quality_samples: get(&m.quality_samples),
            quality_rescored: get(&m.quality_rescored),
            recompressed_saved_bytes: get(&m.recompressed_saved_bytes),
            write_amplification: get(&m.relocated_bytes) as f64 / get(&m.put_bytes).max(1) as f64,
            puts: get(&m.puts),
            put_bytes: get(&m.put_bytes),
            dedup_hits: get(&m.dedup_hits),
            gets: get(&m.gets),
            hits: get(&m.hits),
            misses: get(&m.misses),
            get_bytes: get(&m.get_bytes),
            read_errors: get(&m.read_errors),
            direct_reads: get(&m.direct_reads),
            deletes: get(&m.deletes),
            evicted_keys: get(&m.evicted_keys),
            evicted_blocks: get(&m.evicted_blocks),
            evicted_bytes: get(&m.evicted_bytes),
            segments_reclaimed: get(&m.segments_reclaimed),
            pinned_keys: parts.pins.count(parts.clock.now_unix_ms()),
            pins_overridden: get(&m.pins_overridden),
            planner_dropped_keys: get(&m.planner_dropped_keys),
            checkpoints: parts.checkpoints.written(),
            checkpoint_errors: parts.checkpoints.failed(),
            checkpoint_snapshot_us: parts.checkpoints.snapshot_us(),
            syncs: parts.log.syncs(),
            device_backend: caps.backend.to_string(),
            direct_io: caps.direct_io,
            recovery: parts.recovery.clone(),
            tiers,
            poisoned,
            placement: parts.placement.report(),
            load_speeds: parts.tiers.speeds.totals().report(),
        }
    }
}

impl Parts {
    fn tier_stats(&self, live_bytes: u64, blocks: u64) -> Vec<TierStats> {
        let counted = |tier: &str, c: &TierCounters| {
            let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
            TierStats {
                tier: tier.to_string(),
                hits: get(&c.hits),
                misses: get(&c.misses),
                hit_bytes: get(&c.hit_bytes),
                admitted: get(&c.admitted),
                rejected: get(&c.rejected),
                evictions: get(&c.evictions),
                ..TierStats::default()
            }
        };
        let mut tiers = Vec::with_capacity(2);
        if let Some(dram) = &self.tiers.dram {
            let (resident_bytes, entries) = dram.resident();
            tiers.push(TierStats {
                capacity_bytes: dram.capacity(),
                resident_bytes,
                entries,
                load_latency: self.tiers.dram_latency.summary(),
                ..counted("dram", &dram.counters)
            });
        }
        let mut ssd = TierStats {
            capacity_bytes: u64::from(self.log.sb.segment_count) * self.log.sb.segment_size_bytes,
            resident_bytes: live_bytes,
            entries: blocks,
            load_latency: self.tiers.ssd_latency.summary(),
            ..counted("ssd", &self.tiers.ssd)
        };
        // Every block put is on the log; evictions from the log are reclaimed segments' blocks.
        ssd.admitted =
            self.metrics.puts.load(Ordering::Relaxed).saturating_sub(self.metrics.dedup_hits.load(Ordering::Relaxed));
        ssd.evictions = self.metrics.evicted_blocks.load(Ordering::Relaxed);
        tiers.push(ssd);
        tiers
    }
}
