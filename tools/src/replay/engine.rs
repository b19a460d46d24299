//! Replaying through the real engine: every trace block is a generated KV block (deterministic in
//! its id, scaled down by `--scale` to fit the disk), stored and loaded through `Store`, with real
//! reads timed. The engine's clock follows trace time, so TTLs and ages mean what they would.

use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::Context;
use kvhoard_engine::placement::group_ttl::ttl_secs_keeping;
use kvhoard_engine::placement::{context_of, Placement, Planned};
use kvhoard_engine::{Clock, CreateOptions, Durability, Policy, PutOptions, ReadOptions, Store, StoreOptions};

use super::cache::{Cache, CacheStats, Lookup};
use super::model::{block_bytes, block_of, sensitivity, CodecFacts, Profile};
use super::planning::{self, PLANNER_DRAM_FILL, PLANNER_FILL};
use super::sim::Bandwidths;
use super::{planner_for, PolicySpec, Setup, Tiers};

/// Namespace a replay stores its blocks in.
const NAMESPACE: &str = "replay";
/// Trace time 0 on the engine's clock (any fixed instant: records carry real-looking times).
const EPOCH_MS: u64 = 1_700_000_000_000;

/// The engine as a replay's cache.
pub struct EngineCache {
    store: Store,
    clock: Arc<AtomicU64>,
    model: Profile,
    scale: u64,
    put_bytes: u64,
    dram_hits_seen: u64,
    /// The planner the engine applies, and its quality estimates per sensitivity level: each
    /// context's profile, as a client that knows its contexts would set it.
    planned: Option<(Arc<Planned>, Vec<Vec<f64>>)>,
    /// The name of each codec the replay's facts describe, in order.
    codec_names: Vec<String>,
}

impl EngineCache {
    /// A fresh volume in `dir` for `policy`: the tiers at the model's real sizes (divided by
    /// `scale` on disk), blocks stored with the policy's codec, or as its planner decides among
    /// `facts`' codecs, I/O as in the setup's store options.
    pub fn create(
        dir: &Path,
        s: &Setup,
        scale: u64,
        tiers: Tiers,
        policy: &PolicySpec,
        facts: &[CodecFacts],
    ) -> anyhow::Result<EngineCache> {
        let clock = Arc::new(AtomicU64::new(EPOCH_MS));
        let (create, segments) = geometry(&s.model, scale, tiers.ssd);
        let planned = match policy.planner {
            Some(alpha) => {
                let capacity = u64::from(segments) * create.segment_size_bytes;
                let (mut config, estimates) = planner_for(s, alpha, facts, (capacity as f64 * PLANNER_FILL) as u64);
                // The volume's DRAM tier, at the scaled sizes the planner sees blocks at.
                config.dram.budget_bytes = (tiers.dram as f64 / scale as f64 * PLANNER_DRAM_FILL) as u64;
                let costs = super::costs_of(s);
                let planned = planning::planned(config, &estimates, facts, &costs, Clock::manual(Arc::clone(&clock)))?;
                Some((Arc::new(planned), estimates))
            }
            None => None,
        };
        let placement: Arc<dyn Placement> = match &planned {
            Some((p, _)) => Arc::clone(p) as Arc<dyn Placement>,
            None => policy.placement(Clock::manual(Arc::clone(&clock))),
        };
        let opts = StoreOptions {
            clock: Clock::manual(Arc::clone(&clock)),
            placement,
            dram_tier_bytes: tiers.dram / scale,
            ..s.store.clone()
        };
        let store = Store::create(dir, &create, opts)
            .with_context(|| format!("cannot create the replay volume in {}", dir.display()))?;
        store.set_policy(NAMESPACE, Policy { codec: policy.codec, lossy: true, ..Default::default() })?;
        let codec_names = facts.iter().map(|f| f.spec.map_or_else(|| "raw".to_string(), |c| c.to_string())).collect();
        Ok(EngineCache { store, clock, model: s.model, scale, put_bytes: 0, dram_hits_seen: 0, planned, codec_names })
    }

    fn key(id: u64) -> String {
        format!("block-{id}")
    }

    fn set_time(&self, now_ms: u64) {
        self.clock.store(EPOCH_MS + now_ms, Ordering::Relaxed);
    }

    /// Closes the volume.
    pub fn close(self) -> anyhow::Result<()> {
        self.store.close()?;
        Ok(())
    }
}

/// The replay volume for `ssd_bytes` (at the model's sizes) with blocks divided by `scale`:
/// how it is created on disk, and the segments it holds (at least 3, so that one can be
/// reclaimed while one is open). The simulator lays its volume out the same way, scaled back.
pub fn geometry(model: &Profile, scale: u64, ssd_bytes: u64) -> (CreateOptions, u32) {
    let block = block_bytes(model, scale);
    let record = block.div_ceil(4096) * 4096 + 4096;
    let mut capacity = (ssd_bytes / scale.max(1)).max(record * 16);
    let segment = segment_bytes(capacity, record);
    // The data starts after the superblocks: a few more segments' worth of capacity at most.
    for _ in 0..4 {
        let create = CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment };
        match kvhoard_engine::directory_segment_count(&create) {
            Ok(count) if count >= 3 => return (create, count),
            _ => capacity += segment,
        }
    }
    // Still impossible (a segment size out of range): creating the volume says what is wrong.
    (CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment }, 3)
}

/// Segments for a volume of `capacity` with records of `record` bytes: about 64 of them, each
/// holding at least 4 records, in whole MiB (1 MiB at least).
pub fn segment_bytes(capacity: u64, record: u64) -> u64 {
    // No larger than a segment may be (a huge volume then has more than 64).
    let largest = kvhoard_engine::format::superblock::SEGMENT_BYTES_MAX >> 20 << 20;
    ((capacity / 64).max(record * 4).max(1 << 20).div_ceil(1 << 20) << 20).min(largest)
}

/// Measures what the simulator should charge for loads on the disk under `dir`: batched gets of
/// `model`'s blocks (scaled by `scale`) from the log (no DRAM tier) and from the DRAM tier, as the
/// replay's engine does them, I/O as in `base`. Uses a scratch volume in `dir`, removed afterwards.
pub fn calibrate(dir: &Path, model: Profile, scale: u64, base: &StoreOptions) -> anyhow::Result<Bandwidths> {
    const BLOCKS: u64 = 48;
    const PREFIX: usize = 12;
    const ROUNDS: usize = 5;
    let scratch = dir.join("replay-calibrate");
    // Removed afterwards, whole: never a directory that was there before.
    anyhow::ensure!(
        !scratch.exists(),
        "{} exists; calibrating needs it free (it is removed afterwards)",
        scratch.display()
    );
    let block = block_bytes(&model, scale);
    let record = block.div_ceil(4096) * 4096 + 4096;
    let capacity = record * BLOCKS * 2;
    let create = CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment_bytes(capacity, record) };
    let opts = || StoreOptions { dram_tier_bytes: block * BLOCKS * 2, ..base.clone() };
    let keys: Vec<String> = (0..BLOCKS).map(EngineCache::key).collect();
    let store =
        Store::create(&scratch, &create, opts()).with_context(|| format!("cannot create {}", scratch.display()))?;
    let filled = keys.iter().enumerate().try_for_each(|(i, key)| -> anyhow::Result<()> {
        let synth = block_of(&model, scale, i as u64)?;
        store.put(
            NAMESPACE,
            key,
            &synth.generate(),
            &PutOptions { desc: Some(synth.desc.desc()), ..PutOptions::default() },
        )?;
        Ok(())
    });
    store.close()?;
    // Each round opens the volume again, so its DRAM tier is empty: the first pass reads the log
    // (and fills the tier), the second is served by the tier. The median of the rounds resists
    // whatever else the machine was doing during one of them.
    let round = || -> anyhow::Result<(f64, f64)> {
        let store = Store::open(&scratch, opts()).with_context(|| format!("cannot open {}", scratch.display()))?;
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let pass = |what: &str| -> anyhow::Result<f64> {
            let started = Instant::now();
            for chunk in refs.chunks(PREFIX) {
                let got = store.get_batch(NAMESPACE, chunk, ReadOptions::default())?;
                if got.iter().any(Option::is_none) {
                    anyhow::bail!("calibration lost a block during the {what} pass");
                }
            }
            Ok((block * BLOCKS) as f64 / started.elapsed().as_secs_f64().max(1e-9))
        };
        let measured = pass("log").and_then(|ssd_bps| Ok((ssd_bps, pass("DRAM")?)));
        store.close()?;
        measured
    };
    let measured = filled.and_then(|()| {
        let rounds = (0..ROUNDS).map(|_| round()).collect::<anyhow::Result<Vec<_>>>()?;
        let median = |mut v: Vec<f64>| {
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let cores = std::thread::available_parallelism().map_or(1, std::num::NonZero::get) as f64;
        Ok(Bandwidths {
            ssd_bps: median(rounds.iter().map(|r| r.0).collect()),
            dram_bps: median(rounds.iter().map(|r| r.1).collect()),
            decode_cores: cores,
        })
    });
    let _ = std::fs::remove_dir_all(&scratch);
    measured
}

impl Cache for EngineCache {
    fn lookup(&mut self, now_ms: u64, blocks: &[u64]) -> anyhow::Result<Lookup> {
        self.set_time(now_ms);
        let keys: Vec<String> = blocks.iter().map(|&id| Self::key(id)).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let found = self.store.contains_batch(NAMESPACE, &refs)?;
        let prefix = found.iter().take_while(|f| **f).count();
        let mut lookup = Lookup::default();
        let started = Instant::now();
        // One batched get, as a connector retrieving a prefix does: reads and decodes on every core.
        let blocks = self.store.get_batch(NAMESPACE, refs.get(..prefix).unwrap_or_default(), ReadOptions::default())?;
        lookup.load_s = started.elapsed().as_secs_f64() * self.scale as f64;
        // Reclaim may have dropped one since contains(): the prefix ends there.
        for block in blocks.iter().map_while(Option::as_ref) {
            lookup.hits += 1;
            let codec = block.meta.codec();
            lookup.hit_codec.push(self.codec_names.iter().position(|n| *n == codec).unwrap_or(0));
        }
        let dram = self.store.stats().tiers.iter().find(|t| t.tier == "dram").map_or(0, |t| t.hits);
        lookup.dram_hits = usize::try_from(dram - self.dram_hits_seen.min(dram)).unwrap_or(0);
        self.dram_hits_seen = dram;
        Ok(lookup)
    }

    fn store(&mut self, now_ms: u64, blocks: &[u64], group: u64, ttl_ms: Option<u64>) -> anyhow::Result<()> {
        self.set_time(now_ms);
        if blocks.is_empty() || ttl_ms == Some(0) {
            return Ok(());
        }
        let generated = blocks
            .iter()
            .map(|&id| Ok((Self::key(id), block_of(&self.model, self.scale, id)?)))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let datas: Vec<Vec<u8>> = generated.iter().map(|(_, s)| s.generate()).collect();
        let desc = generated.first().map(|(_, s)| s.desc.desc());
        let items: Vec<(&str, &[u8])> =
            generated.iter().map(|(k, _)| k.as_str()).zip(datas.iter().map(Vec::as_slice)).collect();
        if let Some((planned, estimates)) = &self.planned {
            if let Some(quality) = estimates.get(sensitivity(group)) {
                planned.set_profile(context_of(Some(group), NAMESPACE, ""), quality.clone());
            }
        }
        let opts = PutOptions {
            durability: Durability::Written,
            desc,
            group: Some(group),
            // The engine keeps TTLs in whole seconds.
            ttl_secs: ttl_ms.map(ttl_secs_keeping),
            ..PutOptions::default()
        };
        self.store.put_batch(NAMESPACE, &items, &opts)?;
        self.put_bytes += datas.iter().map(|d| d.len() as u64).sum::<u64>() * self.scale;
        Ok(())
    }

    fn stats(&self) -> CacheStats {
        let s = self.store.stats();
        CacheStats {
            put_bytes: self.put_bytes,
            bytes_written: (s.put_bytes + s.relocated_bytes) * self.scale,
            relocated_bytes: s.relocated_bytes * self.scale,
            evictions: s.evicted_keys + s.planner_dropped_keys,
            stored_bytes: s.live_bytes * self.scale,
            // The engine does not account how long blocks lived.
            byte_seconds: 0.0,
            planner_cpu_s: s.placement.cpu_s,
            recompressed: s.recompressed_records,
            // Drops by cleaning's decisions are among the evictions, not counted apart.
            planner_drops: s.planner_dropped_keys,
            segments_freed_ahead: s.segments_freed_ahead,
        }
    }
}
