//! The simulator: the engine's volume as metadata (segments of records, a DRAM tier) driven by
//! the engine's own placement code (`kvhoard_engine::placement`: which segment to reclaim or
//! clean, which live blocks a cleaner keeps, what enters the DRAM tier) and the engine's own DRAM
//! tier (`DramTier`, least recently used out). No bytes are stored: a block is its id and sizes,
//! so a whole trace replays in seconds at real model sizes. Load times come from tier bandwidths
//! and the codec's measured decode speed.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use std::time::{Duration, Instant};

use kvhoard_engine::placement::planner::{ContextUse, Planner, PlannerConfig, CLEANING_DROP_MARGIN};
use kvhoard_engine::placement::{BlockInfo, Keep, LiveBlock, Placement, SegmentView};
use kvhoard_engine::tier::DramTier;
use kvhoard_engine::Loc;

use super::cache::{Cache, CacheStats, Lookup};
use super::model::{sensitivity, CodecFacts};

/// Record overhead: a header unit per record, payload rounded up to a unit (as on disk).
const UNIT: u64 = 4096;

/// The replay's namespace: lossy codecs allowed, placement's own settings.
static REPLAY_POLICY: kvhoard_engine::Policy = kvhoard_engine::Policy {
    codec: None,
    lossy: true,
    settings: kvhoard_engine::NsSettings { alpha: None, codecs: None, drift: None, ttl: None },
};

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
    /// Index of its codec in the cache's list.
    codec: u8,
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

/// The simulated volume's sizes, at the model's block sizes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Layout {
    /// The log.
    pub ssd_bytes: u64,
    /// One segment of it.
    pub segment_bytes: u64,
    /// The DRAM tier.
    pub dram_bytes: u64,
}

/// The simulated volume.
pub struct SimCache {
    placement: Arc<dyn Placement>,
    /// The placement's clock: trace time, ms.
    clock: Arc<AtomicU64>,
    /// Codecs blocks may be stored with, raw first.
    codecs: Vec<CodecFacts>,
    /// The codec a put uses without a planner.
    default_codec: u8,
    /// What an unknown codec index means: raw.
    raw: CodecFacts,
    planner: Option<Planned>,
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
    /// A volume laid out as `layout`, blocks of `raw_block` bytes stored with the last of
    /// `codecs` (raw first), placed by `placement` (whose clock, `clock`, the cache keeps at
    /// trace time).
    pub fn new(
        placement: Arc<dyn Placement>,
        clock: Arc<AtomicU64>,
        codecs: Vec<CodecFacts>,
        bandwidths: Bandwidths,
        raw_block: u64,
        layout: Layout,
    ) -> SimCache {
        let Layout { ssd_bytes, segment_bytes, dram_bytes } = layout;
        let count = (ssd_bytes / segment_bytes.max(1)).max(2) as usize;
        let mut segments = vec![Segment::default(); count];
        if let Some(s) = segments.first_mut() {
            s.seq = 1;
            s.used = UNIT;
        }
        let default_codec = u8::try_from(codecs.len().saturating_sub(1)).unwrap_or(0);
        SimCache {
            placement,
            clock,
            codecs,
            default_codec,
            raw: CodecFacts::raw(),
            planner: None,
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

    fn facts(&self, codec: u8) -> &CodecFacts {
        self.codecs.get(usize::from(codec)).unwrap_or(&self.raw)
    }

    fn record_bytes(&self, codec: u8) -> u64 {
        let stored = (self.raw_block as f64 * self.facts(codec).ratio).ceil() as u64;
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
                    context: e.group,
                    policy: &REPLAY_POLICY,
                    reads: e.reads,
                    age_ms: now_ms.saturating_sub(e.written_ms),
                }) != Keep::Drop;
            if keep && self.dropped_by_cleaning(e.group) {
                // The whole context goes, as with a drop in `rebalance`: this block and its others.
                let ids = self.planner.as_mut().and_then(|p| p.blocks.remove(&e.group)).unwrap_or_default();
                let n = self.drop_blocks(e.group, ids.into_iter().chain([id]), now_ms);
                if let Some(p) = self.planner.as_mut() {
                    p.dropped += n;
                }
                continue;
            }
            self.index.remove(&id);
            self.dram.remove(&Self::fp(id));
            self.removed_byte_ms += e.record as f64 * Self::kept_ms(&e, now_ms) as f64;
            if keep {
                let codec = self.recode_for(&e);
                self.append(id, e.group, now_ms, e.expires_ms, codec);
                self.stats.relocated_bytes += self.record_bytes(codec);
            } else {
                self.stats.evictions += 1;
            }
        }
    }

    /// The codec cleaning writes a copy of `e` with: its context's option where the planner keeps
    /// the context in another form (counted as a recompression), else its own.
    fn recode_for(&mut self, e: &Entry) -> u8 {
        let dropped = self.codecs.len();
        let Some(p) = self.planner.as_mut() else { return e.codec };
        let option = p.planner.option_of(e.group);
        if p.planner.qualities(e.group).is_none() || option >= dropped || option == usize::from(e.codec) {
            return e.codec;
        }
        p.recompressed += 1;
        u8::try_from(option).unwrap_or(e.codec)
    }

    /// Whether the planner drops `context` rather than have cleaning copy one of its blocks (a
    /// context the greedy would drop soon, as the engine's planned cleaning asks).
    fn dropped_by_cleaning(&mut self, context: u64) -> bool {
        self.planner.as_mut().is_some_and(|p| p.planner.drop_for_cleaning(context, CLEANING_DROP_MARGIN))
    }

    /// Removes the blocks `ids` still stored for `context` (evictions); returns how many, the
    /// planner's drops.
    fn drop_blocks(&mut self, context: u64, ids: impl Iterator<Item = u64>, now_ms: u64) -> u64 {
        let mut dropped = 0;
        for id in ids {
            let Some(e) = self.index.get(&id).copied().filter(|e| e.group == context) else { continue };
            self.index.remove(&id);
            self.dram.remove(&Self::fp(id));
            self.removed_byte_ms += e.record as f64 * Self::kept_ms(&e, now_ms) as f64;
            self.stats.evictions += 1;
            dropped += 1;
        }
        dropped
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

    fn append(&mut self, id: u64, group: u64, now_ms: u64, expires_ms: u64, codec: u8) {
        let record = self.record_bytes(codec);
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
                codec,
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

/// The placement planner driving a simulated volume: the codec each context's blocks are kept
/// with, or whether they are dropped (`kvhoard_engine::placement::planner`). Its options are the
/// cache's codecs in order, then "dropped".
pub struct Planned {
    planner: Planner,
    /// Blocks stored per context (some may have gone since: checked against the index).
    blocks: HashMap<u64, Vec<u64>>,
    /// Per sensitivity level, per option: the quality the planner estimates (from derived probes,
    /// never the replay's own queries).
    estimates: Vec<Vec<f64>>,
    /// Time spent deciding.
    pub cpu: Duration,
    /// Blocks written again with another codec.
    pub recompressed: u64,
    /// Blocks dropped by a decision.
    pub dropped: u64,
}

impl Planned {
    /// A planner over `config`, seeing `estimates[level][option]`.
    pub fn new(config: PlannerConfig, estimates: Vec<Vec<f64>>) -> Planned {
        Planned {
            planner: Planner::new(config),
            blocks: HashMap::new(),
            estimates,
            cpu: Duration::ZERO,
            recompressed: 0,
            dropped: 0,
        }
    }

    fn codec_of(&self, context: u64) -> u8 {
        u8::try_from(self.planner.option_of(context)).unwrap_or(0)
    }
}

impl SimCache {
    /// Whether a block of `context` put now enters the DRAM tier: the planner's decision where it
    /// makes one, else placement's `placed`.
    fn held(&self, context: u64, placed: bool) -> bool {
        self.planner.as_ref().and_then(|p| p.planner.in_dram(context)).unwrap_or(placed)
    }

    /// Whether a block of `context` read now stays in the DRAM tier: as for a put, counting the
    /// use this read is (the planner is told of it after the lookup), as the engine's `on_load`.
    fn held_when_read(&self, context: u64, placed: bool) -> bool {
        self.planner.as_ref().and_then(|p| p.planner.holds_when_used(context)).unwrap_or(placed)
    }
}

impl SimCache {
    /// This cache with its codecs chosen per context by `planned`.
    pub fn with_planner(mut self, planned: Planned) -> SimCache {
        self.planner = Some(planned);
        self
    }

    /// What the planner did: (CPU seconds, blocks recompressed, blocks dropped).
    pub fn planner_work(&self) -> Option<(f64, u64, u64)> {
        self.planner.as_ref().map(|p| (p.cpu.as_secs_f64(), p.recompressed, p.dropped))
    }

    /// Tells the planner a request of `context` is storing `new` blocks.
    fn plan_put(&mut self, now_ms: u64, context: u64, new: usize) {
        let Some(mut p) = self.planner.take() else { return };
        let started = Instant::now();
        let index = &self.index;
        let kept = p.blocks.get_mut(&context).map_or(0, |ids| {
            ids.retain(|id| index.get(id).is_some_and(|e| e.group == context));
            ids.len()
        });
        let level = sensitivity(context);
        let quality = p.estimates.get(level).cloned().unwrap_or_default();
        p.planner.touch(&ContextUse {
            context,
            now_ms,
            blocks: (kept + new) as u64,
            raw_bytes: self.raw_block,
            quality: &quality,
            alpha: None,
        });
        p.cpu += started.elapsed();
        self.planner = Some(p);
    }

    /// Applies the planner's decisions until the kept bytes fit its budget.
    fn rebalance(&mut self, now_ms: u64) {
        let Some(mut p) = self.planner.take() else { return };
        let started = Instant::now();
        let changes = p.planner.rebalance();
        p.cpu += started.elapsed();
        let dropped = u8::try_from(self.codecs.len()).unwrap_or(u8::MAX);
        let mut last: HashMap<u64, (usize, bool)> = HashMap::new();
        for c in changes {
            last.insert(c.context, (c.option, c.dram));
        }
        let mut contexts: Vec<(u64, (usize, bool))> = last.into_iter().collect();
        contexts.sort_unstable_by_key(|(context, _)| *context);
        for (context, (option, held)) in contexts {
            let option = u8::try_from(option).unwrap_or(dropped);
            let ids = p.blocks.get(&context).cloned().unwrap_or_default();
            if !held {
                // Out of memory: its copies leave the DRAM tier.
                for id in &ids {
                    self.dram.remove(&Self::fp(*id));
                }
            }
            // A block whose context is to be kept in another form is recoded when cleaning
            // copies it, as the engine's cleaner does (`recode_for`), never rewritten for the
            // plan alone: until then it is read, and takes its bytes, as it is.
            if option >= dropped {
                p.blocks.remove(&context);
                p.dropped += self.drop_blocks(context, ids.into_iter(), now_ms);
            }
        }
        self.planner = Some(p);
    }
}

impl Cache for SimCache {
    fn lookup(&mut self, now_ms: u64, blocks: &[u64]) -> anyhow::Result<Lookup> {
        self.now_ms = self.now_ms.max(now_ms);
        self.clock.store(self.now_ms, Ordering::Relaxed);
        let mut lookup = Lookup::default();
        for &id in blocks {
            let Some(e) = self.index.get_mut(&id) else { break };
            if e.expires_ms != 0 && e.expires_ms <= now_ms {
                break;
            }
            e.reads = e.reads.saturating_add(1);
            let e = *e;
            let loc = Loc { segment: e.segment, unit: e.unit };
            let stored = e.record - UNIT;
            let decode = e.raw as f64 / (self.facts(e.codec).decode_bps * self.bandwidths.decode_cores.max(1.0));
            let info = BlockInfo {
                namespace: "replay",
                raw_bytes: e.raw,
                record_bytes: e.record,
                group: Some(e.group),
                context: e.group,
                new_key: false,
                policy: &REPLAY_POLICY,
                codec: self.facts(e.codec).spec,
            };
            let in_dram = self.dram.get(&Self::fp(id), loc).is_some();
            lookup.load_s += decode
                + if in_dram {
                    lookup.dram_hits += 1;
                    stored as f64 / self.bandwidths.dram_bps
                } else {
                    let placed = self.placement.on_load(&info);
                    if self.held_when_read(e.group, placed) {
                        self.dram.insert(Self::fp(id), loc, stored, ());
                    }
                    stored as f64 / self.bandwidths.ssd_bps
                };
            lookup.hits += 1;
            lookup.hit_codec.push(usize::from(e.codec));
        }
        Ok(lookup)
    }

    fn store(&mut self, now_ms: u64, blocks: &[u64], group: u64, ttl_ms: Option<u64>) -> anyhow::Result<()> {
        self.now_ms = self.now_ms.max(now_ms);
        self.clock.store(self.now_ms, Ordering::Relaxed);
        if ttl_ms == Some(0) {
            return Ok(()); // a TTL of 0 keeps nothing
        }
        self.plan_put(now_ms, group, blocks.len());
        let codec_of = |c: &SimCache| c.planner.as_ref().map_or(c.default_codec, |p| p.codec_of(group));
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
            let codec = codec_of(self);
            self.append(id, group, now_ms, expires, codec);
            self.stats.put_bytes += self.raw_block;
            if let Some(p) = self.planner.as_mut() {
                p.blocks.entry(group).or_default().push(id);
            }
            let e = self.index.get(&id).copied();
            let info = BlockInfo {
                namespace: "replay",
                raw_bytes: self.raw_block,
                record_bytes: self.record_bytes(codec),
                group: Some(group),
                context: group,
                new_key: true,
                policy: &REPLAY_POLICY,
                codec: self.facts(codec).spec,
            };
            let placed = self.placement.on_put(&info).dram;
            if let (Some(e), true) = (e, self.held(group, placed)) {
                self.dram.insert(Self::fp(id), Loc { segment: e.segment, unit: e.unit }, e.record - UNIT, ());
            }
        }
        self.rebalance(now_ms);
        Ok(())
    }

    fn stats(&self) -> CacheStats {
        let mut s = self.stats.clone();
        s.stored_bytes = self.index.values().map(|e| e.record).sum();
        let live: f64 = self.index.values().map(|e| e.record as f64 * Self::kept_ms(e, self.now_ms) as f64).sum();
        s.byte_seconds = (self.removed_byte_ms + live) / 1e3;
        if let Some((cpu, recompressed, dropped)) = self.planner_work() {
            (s.planner_cpu_s, s.recompressed, s.planner_drops) = (cpu, recompressed, dropped);
        }
        s
    }
}
