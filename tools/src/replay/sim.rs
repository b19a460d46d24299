//! The simulator: the engine's volume as metadata (segments of records, a DRAM tier) driven by
//! the engine's own placement code (`kvhoard_engine::placement`: which segment to reclaim or
//! clean, which live blocks a cleaner keeps, what enters the DRAM tier) and the engine's own DRAM
//! tier (`DramTier`, least recently used out). No bytes are stored: a block is its id and sizes,
//! so a whole trace replays in seconds at real model sizes. Load times come from tier bandwidths
//! and the codec's measured decode speed.

use std::collections::HashMap;
use std::sync::Arc;

use kvhoard_engine::placement::{BlockInfo, Keep, LiveBlock, Placement, SegmentView};
use kvhoard_engine::tier::DramTier;
use kvhoard_engine::Loc;

use super::cache::{Cache, CacheStats, Lookup};
use super::model::CodecFacts;

/// Record overhead: a header unit per record, payload rounded up to a unit (as on disk).
const UNIT: u64 = 4096;

/// What the simulator charges a load: tier bandwidths, and cores decoding in parallel.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Bandwidths {
    /// DRAM tier hits, bytes per second.
    pub dram_bps: f64,
    /// Log reads, bytes per second.
    pub ssd_bps: f64,
    /// Cores decoding a prompt's compressed hits at once (the engine's batched gets decode on
    /// every core).
    pub decode_cores: f64,
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    segment: u32,
    unit: u32,
    record: u64,
    raw: u64,
    reads: u8,
    written_ms: u64,
    expires_ms: u64,
    group: u64,
}

#[derive(Debug, Clone, Default)]
struct Segment {
    seq: u64,
    created_ms: u64,
    used: u64,
    /// Blocks whose record is here (some may be dead: superseded by a relocation).
    blocks: Vec<u64>,
    sealed: bool,
}

/// The simulated volume.
pub struct SimCache {
    placement: Arc<dyn Placement>,
    codec: CodecFacts,
    bandwidths: Bandwidths,
    raw_block: u64,
    segment_bytes: u64,
    segments: Vec<Segment>,
    open: usize,
    next_seq: u64,
    index: HashMap<u64, Entry>,
    dram: DramTier<()>,
    stats: CacheStats,
    /// Byte-ms of blocks already removed (see `CacheStats::byte_seconds`).
    removed_byte_ms: f64,
    /// The latest time seen.
    now_ms: u64,
}

impl SimCache {
    /// A volume of `ssd_bytes` in segments of `segment_bytes`, a DRAM tier of `dram_bytes`,
    /// blocks of `raw_block` bytes stored with `codec`, placed by `placement`.
    pub fn new(
        placement: Arc<dyn Placement>,
        codec: CodecFacts,
        bandwidths: Bandwidths,
        raw_block: u64,
        ssd_bytes: u64,
        segment_bytes: u64,
        dram_bytes: u64,
    ) -> SimCache {
        let count = (ssd_bytes / segment_bytes).max(2) as usize;
        let mut segments = vec![Segment::default(); count];
        if let Some(s) = segments.first_mut() {
            s.seq = 1;
            s.used = UNIT;
        }
        SimCache {
            placement,
            codec,
            bandwidths,
            raw_block,
            segment_bytes,
            segments,
            open: 0,
            next_seq: 2,
            index: HashMap::new(),
            dram: DramTier::new(dram_bytes),
            stats: CacheStats::default(),
            removed_byte_ms: 0.0,
            now_ms: 0,
        }
    }

    fn record_bytes(&self) -> u64 {
        let stored = (self.raw_block as f64 * self.codec.ratio).ceil() as u64;
        UNIT + stored.div_ceil(UNIT) * UNIT
    }

    /// Ms `e` has been kept unexpired by `now_ms`.
    fn kept_ms(e: &Entry, now_ms: u64) -> u64 {
        let until = if e.expires_ms == 0 { now_ms } else { now_ms.min(e.expires_ms) };
        until.saturating_sub(e.written_ms)
    }

    fn fp(id: u64) -> [u8; 16] {
        let mut fp = [0u8; 16];
        fp[..8].copy_from_slice(&id.to_le_bytes());
        fp
    }

    fn free_count(&self) -> usize {
        self.segments.iter().filter(|s| s.seq == 0).count()
    }

    fn live_units(&self, segment: usize) -> u32 {
        let s = &self.segments[segment];
        let live: u64 = s
            .blocks
            .iter()
            .filter_map(|id| self.index.get(id))
            .filter(|e| e.segment as usize == segment)
            .map(|e| e.record / UNIT)
            .sum();
        u32::try_from(live).unwrap_or(u32::MAX)
    }

    fn views(&self) -> Vec<SegmentView> {
        self.segments
            .iter()
            .enumerate()
            .filter(|(_, s)| s.sealed && s.seq != 0)
            .map(|(i, s)| SegmentView {
                index: i as u32,
                seq: s.seq,
                created_unix_ms: s.created_ms,
                end_unit: (s.used / UNIT) as u32,
                live_units: self.live_units(i),
            })
            .collect()
    }

    /// Empties `victim`, relocating what placement keeps when `clean`, dropping the rest.
    fn empty(&mut self, victim: usize, now_ms: u64, clean: bool) {
        let blocks = std::mem::take(&mut self.segments[victim].blocks);
        self.segments[victim] = Segment::default();
        for id in blocks {
            let Some(e) = self.index.get(&id).copied() else { continue };
            if e.segment as usize != victim {
                continue;
            }
            let expired = e.expires_ms != 0 && e.expires_ms <= now_ms;
            let keep = clean
                && !expired
                && self.placement.keep(&LiveBlock {
                    namespace: "replay",
                    raw_bytes: e.raw,
                    record_bytes: e.record,
                    group: Some(e.group),
                    reads: e.reads,
                    age_ms: now_ms.saturating_sub(e.written_ms),
                }) == Keep::Relocate;
            self.index.remove(&id);
            self.dram.remove(&Self::fp(id));
            self.removed_byte_ms += e.record as f64 * Self::kept_ms(&e, now_ms) as f64;
            if keep {
                self.append(id, e.group, now_ms, e.expires_ms);
                self.stats.relocated_bytes += e.record;
            } else {
                self.stats.evictions += 1;
            }
        }
    }

    fn reclaim(&mut self, now_ms: u64) {
        let views = self.views();
        let victim = self.placement.victim(&views) as usize;
        let victim = if views.iter().any(|v| v.index as usize == victim) {
            victim
        } else {
            views.iter().min_by_key(|v| v.seq).map_or(0, |v| v.index as usize)
        };
        self.empty(victim, now_ms, false);
    }

    fn start_segment(&mut self, now_ms: u64) {
        if let Some(s) = self.segments.get_mut(self.open) {
            s.sealed = true;
        }
        let free = match self.segments.iter().position(|s| s.seq == 0) {
            Some(i) => i,
            None => {
                self.reclaim(now_ms);
                self.segments.iter().position(|s| s.seq == 0).unwrap_or(0)
            }
        };
        self.segments[free] =
            Segment { seq: self.next_seq, created_ms: now_ms, used: UNIT, blocks: Vec::new(), sealed: false };
        self.next_seq += 1;
        self.open = free;
    }

    fn append(&mut self, id: u64, group: u64, now_ms: u64, expires_ms: u64) {
        let record = self.record_bytes();
        if self.segments[self.open].used + record > self.segment_bytes - UNIT {
            self.start_segment(now_ms);
        }
        let seg = &mut self.segments[self.open];
        let unit = (seg.used / UNIT) as u32;
        seg.used += record;
        seg.blocks.push(id);
        self.stats.bytes_written += record;
        self.index.insert(
            id,
            Entry {
                segment: self.open as u32,
                unit,
                record,
                raw: self.raw_block,
                reads: 0,
                written_ms: now_ms,
                expires_ms,
                group,
            },
        );
    }

    /// Cleans as the engine's cleaner does: while free segments are short of its target.
    fn clean_if_short(&mut self, now_ms: u64) {
        if !self.placement.cleans() {
            return;
        }
        let target = kvhoard_engine::cleaner_free_target(self.segments.len() as u32) as usize;
        let mut rounds = 0;
        while self.free_count() < target && rounds < self.segments.len() {
            let views = self.views();
            if views.len() < 2 {
                return;
            }
            let victim = self.placement.victim(&views) as usize;
            self.empty(victim, now_ms, true);
            rounds += 1;
        }
    }
}

impl Cache for SimCache {
    fn lookup(&mut self, now_ms: u64, blocks: &[u64]) -> anyhow::Result<Lookup> {
        self.now_ms = self.now_ms.max(now_ms);
        let mut lookup = Lookup::default();
        for &id in blocks {
            let Some(e) = self.index.get_mut(&id) else { break };
            if e.expires_ms != 0 && e.expires_ms <= now_ms {
                break;
            }
            e.reads = e.reads.saturating_add(1);
            let loc = Loc { segment: e.segment, unit: e.unit };
            let stored = e.record - UNIT;
            let decode = e.raw as f64 / (self.codec.decode_bps * self.bandwidths.decode_cores.max(1.0));
            let info =
                BlockInfo { namespace: "replay", raw_bytes: e.raw, record_bytes: e.record, group: Some(e.group) };
            let in_dram = self.dram.get(&Self::fp(id), loc).is_some();
            lookup.load_s += decode
                + if in_dram {
                    lookup.dram_hits += 1;
                    stored as f64 / self.bandwidths.dram_bps
                } else {
                    if self.placement.on_load(&info) {
                        self.dram.insert(Self::fp(id), loc, stored, ());
                    }
                    stored as f64 / self.bandwidths.ssd_bps
                };
            lookup.hits += 1;
            lookup.hit_codec.push(usize::from(self.codec.spec.is_some()));
        }
        Ok(lookup)
    }

    fn store(&mut self, now_ms: u64, blocks: &[u64], group: u64, ttl_ms: Option<u64>) -> anyhow::Result<()> {
        self.now_ms = self.now_ms.max(now_ms);
        if ttl_ms == Some(0) {
            return Ok(()); // a TTL of 0 keeps nothing
        }
        for &id in blocks {
            if let Some(e) = self.index.get(&id).copied() {
                if e.expires_ms == 0 || e.expires_ms > now_ms {
                    continue;
                }
                // Expired: the put replaces it, as the engine's does.
                self.index.remove(&id);
                self.dram.remove(&Self::fp(id));
                self.removed_byte_ms += e.record as f64 * Self::kept_ms(&e, now_ms) as f64;
            }
            self.clean_if_short(now_ms);
            let expires = ttl_ms.map_or(0, |t| now_ms + t);
            self.append(id, group, now_ms, expires);
            self.stats.put_bytes += self.raw_block;
            let e = self.index.get(&id).copied();
            let info = BlockInfo {
                namespace: "replay",
                raw_bytes: self.raw_block,
                record_bytes: self.record_bytes(),
                group: Some(group),
            };
            if let (Some(e), true) = (e, self.placement.on_put(&info).dram) {
                self.dram.insert(Self::fp(id), Loc { segment: e.segment, unit: e.unit }, e.record - UNIT, ());
            }
        }
        Ok(())
    }

    fn stats(&self) -> CacheStats {
        let mut s = self.stats.clone();
        s.stored_bytes = self.index.values().map(|e| e.record).sum();
        let live: f64 = self.index.values().map(|e| e.record as f64 * Self::kept_ms(e, self.now_ms) as f64).sum();
        s.byte_seconds = (self.removed_byte_ms + live) / 1e3;
        s
    }
}
