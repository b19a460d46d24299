use std::path::Path;
use std::process::ExitCode;

use kvhoard_engine::tier::TierStats;
use kvhoard_engine::{Stats, StoreOptions};

use super::open;
use crate::size::human;

pub fn run(volume: &Path, json: bool, prometheus: bool, opts: StoreOptions) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let s = store.stats();
    if prometheus {
        print!("{}", s.prometheus());
    } else if json {
        println!("{}", to_json(&s));
    } else {
        print_human(volume, &s);
    }
    Ok(ExitCode::SUCCESS)
}

pub fn to_json(s: &Stats) -> serde_json::Value {
    serde_json::json!({
        "capacity_bytes": s.capacity_bytes,
        "segment_size_bytes": s.segment_size_bytes,
        "segments": s.segments,
        "segments_free": s.segments_free,
        "segments_sealed": s.segments_sealed,
        "used_bytes": s.used_bytes,
        "live_bytes": s.live_bytes,
        "keys": s.keys,
        "blocks": s.blocks,
        "logical_bytes": s.logical_bytes,
        "unique_bytes": s.unique_bytes,
        "dedup_saved_bytes": s.dedup_saved_bytes,
        "index_memory_bytes": s.index_memory_bytes,
        "namespaces": s.namespaces.iter().map(|n| serde_json::json!({
            "name": n.name, "keys": n.keys, "blocks": n.blocks, "logical_bytes": n.logical_bytes,
            "unique_bytes": n.unique_bytes, "stored_bytes": n.stored_bytes,
        })).collect::<Vec<_>>(),
        "device": { "backend": s.device_backend, "direct_io": s.direct_io },
        "recovery": {
            "checkpoint_seq": s.recovery.checkpoint_seq,
            "segments_replayed": s.recovery.segments_replayed,
            "records_replayed": s.recovery.records_replayed,
            "tails_cut": s.recovery.tails_cut.len(),
            "elapsed_ms": s.recovery.elapsed_ms,
        },
        "counters": {
            "evicted_keys": s.evicted_keys, "evicted_blocks": s.evicted_blocks, "evicted_bytes": s.evicted_bytes,
            "segments_reclaimed": s.segments_reclaimed, "read_errors": s.read_errors,
            "pinned_keys": s.pinned_keys, "pins_overridden": s.pins_overridden,
            "direct_reads": s.direct_reads, "checkpoints": s.checkpoints,
            "checkpoint_errors": s.checkpoint_errors, "syncs": s.syncs,
        },
        "tiers": s.tiers.iter().map(tier_json).collect::<Vec<_>>(),
        "writes_refused": s.poisoned,
    })
}

pub fn tier_json(t: &TierStats) -> serde_json::Value {
    let l = &t.load_latency;
    serde_json::json!({
        "tier": t.tier, "capacity_bytes": t.capacity_bytes, "resident_bytes": t.resident_bytes,
        "entries": t.entries, "hits": t.hits, "misses": t.misses, "hit_bytes": t.hit_bytes,
        "admitted": t.admitted, "rejected": t.rejected, "evictions": t.evictions,
        "load_latency_ns": {
            "count": l.count, "mean": l.mean_ns, "p50": l.p50_ns, "p90": l.p90_ns, "p99": l.p99_ns,
            "p999": l.p999_ns, "max": l.max_ns,
        },
    })
}

fn print_human(volume: &Path, s: &Stats) {
    let pct = |a: u64, b: u64| if b == 0 { 0.0 } else { 100.0 * a as f64 / b as f64 };
    println!("volume     {}", volume.display());
    println!("device     {} ({})", s.device_backend, if s.direct_io { "O_DIRECT" } else { "page cache" });
    println!(
        "capacity   {} in {} segments of {} ({} free, {} sealed)",
        human(s.capacity_bytes),
        s.segments,
        human(s.segment_size_bytes),
        s.segments_free,
        s.segments_sealed
    );
    println!(
        "used       {} ({:.1}%), of which live {}",
        human(s.used_bytes),
        pct(s.used_bytes, s.capacity_bytes),
        human(s.live_bytes)
    );
    println!("keys       {} naming {} distinct blocks", s.keys, s.blocks);
    println!(
        "bytes      {} stored by clients, {} after dedup (saved {}, {:.1}%)",
        human(s.logical_bytes),
        human(s.unique_bytes),
        human(s.dedup_saved_bytes),
        pct(s.dedup_saved_bytes, s.logical_bytes)
    );
    println!("index      {} in memory", human(s.index_memory_bytes));
    println!(
        "open       {} ms, checkpoint {}, {} records replayed from {} segments",
        s.recovery.elapsed_ms,
        s.recovery.checkpoint_seq.map_or("none".to_string(), |c| format!("#{c}")),
        s.recovery.records_replayed,
        s.recovery.segments_replayed
    );
    for n in &s.namespaces {
        println!("namespace  {:<24} {:>10} keys {:>10} blocks {:>12}", n.name, n.keys, n.blocks, human(n.unique_bytes));
    }
    for t in &s.tiers {
        let l = &t.load_latency;
        println!(
            "tier       {:<5} {} of {} in {} blocks; {} hits, {} misses; load p50 {} p99 {}",
            t.tier,
            human(t.resident_bytes),
            human(t.capacity_bytes),
            t.entries,
            t.hits,
            t.misses,
            micros(l.p50_ns),
            micros(l.p99_ns)
        );
    }
    if let Some(reason) = &s.poisoned {
        println!("WRITES REFUSED: {reason}");
    }
}

fn micros(ns: u64) -> String {
    format!("{:.1} µs", ns as f64 / 1000.0)
}
