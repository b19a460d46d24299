//! `kvhoard bench --workload cleaning`: get latency with the background cleaner at work against
//! the same workload without it, in one run, alternated.
//!
//! Two volumes in DIR, both cleaned as `--placement lru` cleans (blocks read since their write
//! are kept): a **tight** one of `--total` bytes and a **roomy** one that holds everything the
//! run puts, so its cleaner never has work. Each holds a hot set (40 % of the tight volume) that
//! `--threads` readers read in random order, while one writer puts new, never-read blocks (half
//! the tight volume per phase, at `--put-mbps`). On the tight volume every put past the first phase needs room
//! the cleaner makes, relocating the hot blocks it meets. Phases alternate roomy, tight, roomy,
//! tight, ... (`--rounds`), so drift in the machine falls on both alike. Reports p50/p99/p99.9 of
//! the gets per volume, their ratio, and the tight volume's cleaning (segments, bytes relocated
//! per byte put). A hot block not read between two cleanings of its segment is let go, as LRU
//! cleaning does: its reader counts a miss and puts it again, as a client that recomputed it.
//!
//! With `--copies N` each hot block is also stored under N more keys (links to its bytes), so a
//! cleaner that relocates it writes those links again (or, past a bound, a checkpoint) before
//! it frees the segment; the writer's put latency (p50/p99/max per volume) and the checkpoints
//! counted show what that costs the puts.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;

use anyhow::{ensure, Context};
use kvhoard_engine::placement::Lru;
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_kernels::rng::Rng;
use serde_json::json;

use super::bench_common::{noise, percentile, round3, stamp};

/// Share of the tight volume the hot set takes.
const HOT_SHARE: f64 = 0.4;
/// Share of the tight volume one phase puts.
const PHASE_SHARE: f64 = 0.5;

struct Volume {
    store: Store,
    /// Latencies of every get in its phases, µs.
    lat: Vec<u32>,
    /// Latencies of the writer's puts in its phases, µs.
    put_lat: Vec<u32>,
    /// Blocks put so far (cold ones are numbered from here).
    next: u64,
    /// Reads of the hot set that missed.
    hot_misses: u64,
    /// Time the writer took, over its phases.
    put_s: f64,
}

/// What a cleaning run is asked for (`kvhoard bench --workload cleaning`'s flags).
#[derive(Debug, Clone)]
pub struct CleaningArgs {
    /// Bytes of the tight volume.
    pub total: u64,
    /// Bytes of each block.
    pub block_size: u64,
    /// Reader threads.
    pub threads: usize,
    /// Phases per volume, alternated.
    pub rounds: usize,
    /// MB/s the writer puts at.
    pub put_mbps: f64,
    /// More keys each hot block is stored under (links to the same bytes).
    pub copies: u32,
    /// How the volumes are opened (their placement is set here).
    pub opts: StoreOptions,
}

pub fn run(dir: &Path, a: &CleaningArgs) -> anyhow::Result<serde_json::Value> {
    let rounds = a.rounds;
    let block = a.block_size;
    let record = block.div_ceil(4096) * 4096 + 4096;
    let segment = (record * 4).max(16 << 20).div_ceil(1 << 20) << 20;
    let hot = ((a.total as f64 * HOT_SHARE) as u64 / record).max(1);
    let per_phase = ((a.total as f64 * PHASE_SHARE) as u64 / record).max(1);
    ensure!(
        a.total >= 16 * segment,
        "--total must be at least 16 segments ({} here)",
        crate::size::human(16 * segment)
    );
    let roomy_capacity = (hot + per_phase * rounds as u64 + 2) * record * 5 / 4 + 8 * segment;
    let open = |name: &str, capacity: u64| -> anyhow::Result<Store> {
        let opts = StoreOptions { placement: Arc::new(Lru::default()), ..a.opts.clone() };
        let path = dir.join(name);
        Store::create(&path, &CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: segment }, opts)
            .with_context(|| format!("cannot create the benchmark volume {}", path.display()))
    };
    let mut volumes = [Volume::new(open("roomy", roomy_capacity)?), Volume::new(open("tight", a.total)?)];
    let opts = PutOptions { durability: Durability::Written, ..PutOptions::default() };
    let mut buf = noise(11, block as usize);
    for v in &mut volumes {
        for i in 0..hot {
            stamp(&mut buf, i);
            v.store.put("bench", &format!("hot-{i}"), &buf, &opts)?;
            for c in 0..a.copies {
                v.store.put("bench", &format!("hot-{i}-copy-{c}"), &buf, &opts)?;
            }
            // Read once: a block read since its write is one the cleaner keeps.
            v.store.get("bench", &format!("hot-{i}"), ReadOptions::default())?;
        }
        v.next = hot;
    }
    for round in 0..rounds {
        for v in &mut volumes {
            let p = Phase { threads: a.threads, hot, count: per_phase, put_mbps: a.put_mbps, seed: round as u64 };
            phase(v, &p, &mut buf)?;
        }
    }
    let report = |v: &mut Volume| {
        v.lat.sort_unstable();
        v.put_lat.sort_unstable();
        let s = v.store.stats();
        json!({
            "gets": v.lat.len(),
            "get_p50_us": percentile(&v.lat, 50.0),
            "get_p99_us": percentile(&v.lat, 99.0),
            "get_p999_us": percentile(&v.lat, 99.9),
            "hot_misses": v.hot_misses,
            "put_p50_us": percentile(&v.put_lat, 50.0),
            "put_p99_us": percentile(&v.put_lat, 99.0),
            "put_p999_us": percentile(&v.put_lat, 99.9),
            "put_max_us": v.put_lat.last().copied().unwrap_or(0),
            "checkpoints": s.checkpoints,
            "put_mbps": (v.next.saturating_sub(hot) as f64 * block as f64 / v.put_s.max(1e-9) / 1e6).round(),
            "segments_cleaned": s.segments_cleaned,
            "segments_freed_ahead": s.segments_freed_ahead,
            "write_amplification": round3(s.write_amplification),
            "capacity_bytes": s.capacity_bytes,
        })
    };
    let [roomy, tight] = &mut volumes;
    let (r, t) = (report(roomy), report(tight));
    ensure!(r["segments_cleaned"] == 0, "the roomy volume was cleaned: it is not the run without cleaning");
    let ratio = |k: &str| round3(t[k].as_f64().unwrap_or(0.0) / r[k].as_f64().unwrap_or(1.0).max(1.0));
    Ok(json!({
        "workload": "cleaning",
        "block_size": block,
        "threads": a.threads,
        "rounds": rounds,
        "put_mbps_asked": a.put_mbps,
        "copies": a.copies,
        "hot_blocks": hot,
        "blocks_put_per_phase": per_phase,
        "without_cleaning": r,
        "with_cleaning": t,
        "p50_ratio": ratio("get_p50_us"),
        "p99_ratio": ratio("get_p99_us"),
        "p999_ratio": ratio("get_p999_us"),
        "put_p99_ratio": ratio("put_p99_us"),
    }))
}

impl Volume {
    fn new(store: Store) -> Volume {
        Volume { store, lat: Vec::new(), put_lat: Vec::new(), next: 0, hot_misses: 0, put_s: 0.0 }
    }
}

/// One phase's work: the writer puts `count` new blocks at `put_mbps` while `threads` readers
/// read the `hot` set.
struct Phase {
    threads: usize,
    hot: u64,
    count: u64,
    put_mbps: f64,
    seed: u64,
}

/// One phase on `v`.
fn phase(v: &mut Volume, p: &Phase, buf: &mut [u8]) -> anyhow::Result<()> {
    let Phase { threads, hot, count, put_mbps, seed } = *p;
    let writing = AtomicBool::new(true);
    let store = &v.store;
    let first = v.next;
    let block_len = buf.len();
    let mut put_lat = Vec::with_capacity(count as usize);
    let (wrote, lats) = std::thread::scope(|s| {
        let readers: Vec<_> = (0..threads as u64)
            .map(|t| {
                let writing = &writing;
                s.spawn(move || -> anyhow::Result<(Vec<u32>, u64)> {
                    let mut rng = Rng::new(seed * 1000 + t + 1);
                    let mut lat = Vec::new();
                    let mut misses = 0;
                    let opts = PutOptions { durability: Durability::Written, ..PutOptions::default() };
                    while writing.load(Ordering::Relaxed) {
                        let key = format!("hot-{}", rng.below(hot));
                        let t0 = Instant::now();
                        let found = store.get("bench", &key, ReadOptions::default())?;
                        lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
                        if found.is_none() {
                            // Not read between two cleanings of its segment, so let go: a
                            // client recomputes it and stores it again.
                            misses += 1;
                            store.put("bench", &key, &noise(t, block_len), &opts)?;
                        }
                    }
                    Ok((lat, misses))
                })
            })
            .collect();
        let opts = PutOptions { durability: Durability::Written, ..PutOptions::default() };
        let started = Instant::now();
        // Paced, so that both volumes see the same writes while their gets are timed.
        let due = |n: u64| std::time::Duration::from_secs_f64(n as f64 * block_len as f64 / (put_mbps * 1e6));
        let wrote = (first..first + count).try_for_each(|i| {
            stamp(buf, i);
            let t0 = Instant::now();
            store.put("bench", &format!("cold-{i}"), buf, &opts)?;
            put_lat.push(t0.elapsed().as_micros().min(u128::from(u32::MAX)) as u32);
            if let Some(rest) = due(i - first + 1).checked_sub(started.elapsed()) {
                std::thread::sleep(rest);
            }
            Ok::<_, kvhoard_engine::StoreError>(())
        });
        writing.store(false, Ordering::Relaxed);
        let wrote = wrote.map(|()| started.elapsed().as_secs_f64());
        let lats: anyhow::Result<Vec<(Vec<u32>, u64)>> = readers
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(anyhow::anyhow!("a reader panicked"))))
            .collect();
        (wrote, lats)
    });
    v.put_s += wrote?;
    v.put_lat.extend(put_lat);
    for (l, misses) in lats? {
        v.lat.extend(l);
        v.hot_misses += misses;
    }
    v.next = first + count;
    Ok(())
}
