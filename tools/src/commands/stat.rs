use std::path::Path;
use std::process::ExitCode;

use kvhoard_engine::{Stats, StoreOptions};

use super::open;
use crate::size::human;

pub fn run(volume: &Path, json: bool, prometheus: bool, opts: StoreOptions) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let s = store.stats();
    if prometheus {
        print!("{}", s.prometheus());
    } else if json {
        // The one JSON form of the statistics (the mount's /.stats is the same).
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        print_human(volume, &s);
    }
    Ok(ExitCode::SUCCESS)
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
    println!(
        "index      {} in memory, {} kept for the next checkpoint",
        human(s.index_memory_bytes),
        human(s.checkpoint_memory_bytes)
    );
    println!(
        "open       {} ms, checkpoint {}, {} records replayed from {} segments",
        s.recovery.elapsed_ms,
        s.recovery.checkpoint_seq.map_or("none".to_string(), |c| format!("#{c}")),
        s.recovery.records_replayed,
        s.recovery.segments_replayed
    );
    for n in &s.namespaces {
        println!(
            "namespace  {:<24} {:>10} keys {:>10} blocks {:>12} logical {:>12} stored",
            n.name,
            n.keys,
            n.blocks,
            human(n.unique_bytes),
            human(n.stored_bytes)
        );
    }
    for c in &s.codecs {
        println!(
            "codec      {:<24} {:>10} blocks {:>12} logical {:>12} stored ({:.2} of logical)",
            c.codec,
            c.blocks,
            human(c.logical_bytes),
            human(c.stored_bytes),
            c.stored_bytes as f64 / c.logical_bytes.max(1) as f64
        );
    }
    for p in &s.policies {
        println!(
            "policy     {:<24} codec {}, lossy codecs {}",
            p.namespace,
            p.codec,
            if p.lossy { "allowed" } else { "denied" }
        );
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
