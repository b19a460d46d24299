//! `kvhoard demo`: the main job on an embedded default.
//!
//! Generates bf16 KV-cache chunks shaped like LMCache's (`KV_2LTD` = [2, layers, tokens,
//! kv_heads*head_dim]) from a seed, with a quarter of them copies of a few shared prefix chunks
//! (a system prompt reused under different keys), stores them, reads them back, restarts twice
//! (from the checkpoint, then from the log alone) and checks every byte each time.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvhoard_engine::format::{BlockDesc, Dtype, Layout};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};

use crate::size::human;

const LAYERS: u64 = 4;
const TOKENS: u64 = 256;
const HIDDEN: u64 = 512;
const BLOCK_BYTES: u64 = 2 * LAYERS * TOKENS * HIDDEN * 2;
const SHARED_PREFIXES: u64 = 4;

pub fn run(dir: Option<&Path>, blocks: u32, seed: u64, json: bool) -> anyhow::Result<ExitCode> {
    ensure!(blocks > 0, "--blocks must be at least 1");
    let temp;
    let dir: PathBuf = match dir {
        Some(d) => d.to_path_buf(),
        None => {
            // The system's temporary directory (TMPDIR); on tmpfs the volume falls back to the
            // page cache, since tmpfs refuses O_DIRECT.
            temp = tempfile::Builder::new()
                .prefix("kvhoard-demo-")
                .tempdir()
                .context("cannot create a temporary directory; give one as DIR")?;
            temp.path().join("volume")
        }
    };
    let report =
        Demo { dir: &dir, blocks: u64::from(blocks), seed, show_progress: !json && std::io::stderr().is_terminal() }
            .run()?;
    if json {
        println!("{}", report.to_json());
    } else {
        report.print();
    }
    Ok(ExitCode::SUCCESS)
}

struct Demo<'a> {
    dir: &'a Path,
    blocks: u64,
    seed: u64,
    show_progress: bool,
}

#[derive(Default)]
struct Report {
    volume: String,
    capacity: u64,
    segment_size: u64,
    blocks: u64,
    logical_bytes: u64,
    unique_blocks: u64,
    dedup_saved: u64,
    put: Duration,
    get: Duration,
    reopen_checkpoint: Duration,
    reopen_log: Duration,
    replayed_records: u64,
    reread_ok: u64,
    evicted: u64,
}

impl Demo<'_> {
    fn run(&self) -> anyhow::Result<Report> {
        let capacity = (self.blocks * BLOCK_BYTES * 3 / 2).max(1 << 30);
        let create = CreateOptions { capacity_bytes: Some(capacity), segment_size_bytes: 64 << 20 };
        let store = Store::create(self.dir, &create, StoreOptions::default())
            .with_context(|| format!("cannot create the demo volume in {}", self.dir.display()))?;
        let mut r = Report { volume: self.dir.display().to_string(), blocks: self.blocks, ..Report::default() };
        r.capacity = store.stats().capacity_bytes;
        r.segment_size = store.stats().segment_size_bytes;
        r.put = self.store_all(&store)?;
        r.get = self.check_all(&store, "reloading")?;
        let s = store.stats();
        (r.logical_bytes, r.unique_blocks, r.dedup_saved, r.evicted) =
            (s.logical_bytes, s.blocks, s.dedup_saved_bytes, s.evicted_keys);
        store.close()?;
        drop(store);

        let t = Instant::now();
        let store = Store::open(self.dir, StoreOptions::default())?;
        r.reopen_checkpoint = t.elapsed();
        self.check_all(&store, "after restart")?;
        drop(store);

        // Forget the checkpoint: the log alone must rebuild the same index.
        let checkpoint = kvhoard_engine::VolumeFiles::of(self.dir).checkpoint.context("a directory volume")?;
        std::fs::remove_file(&checkpoint).with_context(|| format!("cannot remove {}", checkpoint.display()))?;
        let t = Instant::now();
        let store = Store::open(self.dir, StoreOptions::default())?;
        r.reopen_log = t.elapsed();
        r.replayed_records = store.recovery_report().records_replayed;
        self.check_all(&store, "after replaying the log")?;
        r.reread_ok = store.stats().keys;
        Ok(r)
    }

    fn progress(&self, what: &str) -> ProgressBar {
        let bar = ProgressBar::with_draw_target(
            Some(self.blocks),
            if self.show_progress { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
        );
        let style = ProgressStyle::with_template("{msg:>24} [{bar:30}] {pos}/{len} blocks ({eta})")
            .map(|s| s.progress_chars("=> "));
        if let Ok(style) = style {
            bar.set_style(style);
        }
        bar.set_message(what.to_string());
        bar
    }

    /// Stores every block; returns the time spent in `put` (not in generating data).
    fn store_all(&self, store: &Store) -> anyhow::Result<Duration> {
        let bar = self.progress("storing");
        let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, LAYERS, TOKENS, HIDDEN] };
        let mut spent = Duration::ZERO;
        let mut parent = None;
        for i in 0..self.blocks {
            let bytes = kv_chunk(self.seed, content_id(i));
            let opts = PutOptions {
                durability: Durability::Written,
                desc: Some(desc.clone()),
                group: Some(i / 4),
                parent,
                ..PutOptions::default()
            };
            let t = Instant::now();
            let hash = store.put("default", &key(i), &bytes, &opts)?;
            spent += t.elapsed();
            parent = if i % 4 == 3 { None } else { Some(hash) };
            bar.inc(1);
        }
        let t = Instant::now();
        store.put(
            "default",
            "demo-barrier",
            b"sync",
            &PutOptions { durability: Durability::Synced, ..PutOptions::default() },
        )?;
        store.delete("default", "demo-barrier", Durability::Synced)?;
        bar.finish_and_clear();
        Ok(spent + t.elapsed())
    }

    /// Reads every block back and compares it with the generated bytes; returns the time spent
    /// in `get` (which checks crc32c and blake3).
    fn check_all(&self, store: &Store, what: &str) -> anyhow::Result<Duration> {
        let bar = self.progress(what);
        let mut spent = Duration::ZERO;
        for i in 0..self.blocks {
            let t = Instant::now();
            let block = store.get("default", &key(i), ReadOptions { verify_hash: true })?;
            spent += t.elapsed();
            let block = block.with_context(|| format!("block {i} is missing {what}"))?;
            ensure!(
                *block == kv_chunk(self.seed, content_id(i))[..],
                "block {i} came back with different bytes {what}"
            );
            bar.inc(1);
        }
        bar.finish_and_clear();
        Ok(spent)
    }
}

impl Report {
    fn rate(bytes: u64, d: Duration) -> f64 {
        bytes as f64 / d.as_secs_f64().max(1e-9) / 1e6
    }

    fn print(&self) {
        let ms = |d: Duration| d.as_secs_f64() * 1000.0;
        println!(
            "kvhoard demo: a {} volume ({} segments) in {}",
            human(self.capacity),
            human(self.segment_size),
            self.volume
        );
        println!(
            "stored    {} KV chunks of {} (bf16, KV_2LTD [2, {LAYERS}, {TOKENS}, {HIDDEN}]) in {:.0} ms: {:.0} MB/s",
            self.blocks,
            human(BLOCK_BYTES),
            ms(self.put),
            Self::rate(self.logical_bytes, self.put)
        );
        println!(
            "dedup     {} keys share {} distinct blocks: {} not written again",
            self.blocks,
            self.unique_blocks,
            human(self.dedup_saved)
        );
        println!("reloaded  all {} blocks in {:.0} ms: {:.0} MB/s, every byte checked (crc32c, blake3, and against the source)", self.blocks, ms(self.get), Self::rate(self.logical_bytes, self.get));
        println!(
            "restart   reopened from the checkpoint in {:.1} ms; all blocks identical",
            ms(self.reopen_checkpoint)
        );
        println!(
            "recovery  reopened from the log alone in {:.1} ms ({} records replayed); all {} keys identical",
            ms(self.reopen_log),
            self.replayed_records,
            self.reread_ok
        );
        if self.evicted > 0 {
            println!("evicted   {} keys to make room (the volume was full)", self.evicted);
        }
    }

    fn to_json(&self) -> serde_json::Value {
        serde_json::json!({
            "volume": self.volume,
            "capacity_bytes": self.capacity,
            "blocks": self.blocks,
            "block_bytes": BLOCK_BYTES,
            "logical_bytes": self.logical_bytes,
            "unique_blocks": self.unique_blocks,
            "dedup_saved_bytes": self.dedup_saved,
            "put_mbps": Self::rate(self.logical_bytes, self.put),
            "get_mbps": Self::rate(self.logical_bytes, self.get),
            "reopen_checkpoint_ms": self.reopen_checkpoint.as_secs_f64() * 1000.0,
            "reopen_log_ms": self.reopen_log.as_secs_f64() * 1000.0,
            "records_replayed": self.replayed_records,
            "keys_after_restart": self.reread_ok,
            "evicted_keys": self.evicted,
        })
    }
}

/// A quarter of the blocks are copies of a few shared prefix chunks.
fn content_id(i: u64) -> u64 {
    if i % 4 == 3 {
        u64::MAX - (i / 4) % SHARED_PREFIXES
    } else {
        i
    }
}

/// An LMCache-style key: model, world size, worker, chunk hash (signed hex), dtype.
fn key(i: u64) -> String {
    let h = blake3::hash(&i.to_le_bytes());
    let mut b = [0u8; 8];
    b.copy_from_slice(&h.as_bytes()[..8]);
    let hash = i64::from_le_bytes(b);
    let sign = if hash < 0 { "-" } else { "" };
    format!("demo/llama-tiny@1@0@{sign}{:x}@bfloat16", hash.unsigned_abs())
}

/// One chunk of bf16 K and V, like a transformer's: roughly normal values, keys with a few
/// large-magnitude channels (as real keys have), values with per-token scale.
fn kv_chunk(seed: u64, content: u64) -> Vec<u8> {
    let mut rng = seed ^ content.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut out = Vec::with_capacity(BLOCK_BYTES as usize);
    for kv in 0..2u64 {
        for _layer in 0..LAYERS {
            for _token in 0..TOKENS {
                let token_scale = 0.5 + (next() % 1000) as f32 / 1000.0;
                for channel in 0..HIDDEN {
                    let r = next();
                    // Sum of four uniforms: close enough to a normal distribution for a demo.
                    let normal =
                        [0u32, 16, 32, 48].iter().map(|s| ((r >> s) & 0xffff) as f32 / 65535.0).sum::<f32>() - 2.0;
                    let scale = if kv == 0 {
                        if channel % 64 == 7 {
                            8.0
                        } else {
                            1.0
                        }
                    } else {
                        token_scale
                    };
                    let bits = (normal * scale).to_bits();
                    let bf16 = ((bits + 0x7fff + ((bits >> 16) & 1)) >> 16) as u16;
                    out.extend_from_slice(&bf16.to_le_bytes());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_deterministic_and_sized() {
        let a = kv_chunk(1, 5);
        assert_eq!(a.len() as u64, BLOCK_BYTES);
        assert_eq!(a, kv_chunk(1, 5));
        assert_ne!(a, kv_chunk(1, 6));
    }

    #[test]
    fn keys_look_like_lmcache_keys_and_are_distinct() {
        let keys: std::collections::HashSet<String> = (0..1000).map(key).collect();
        assert_eq!(keys.len(), 1000);
        assert!(key(0).starts_with("demo/llama-tiny@1@0@"));
    }
}
