//! `kvhoard demo`: the main job on an embedded default.
//!
//! Generates bf16 KV-cache chunks shaped like LMCache's (`KV_2LTD` = [2, layers, tokens,
//! kv_heads*head_dim]) from a seed with the kernels' synthetic generator (keys with outlier
//! channels and rotary positions, attention sinks: see `kvhoard_kernels::synth`), with a quarter
//! of them copies of a few shared prefix chunks
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
use kvhoard_kernels::synth::Synth;

use crate::size::human;

const LAYERS: u64 = 4;
const TOKENS: u64 = 256;
const KV_HEADS: u64 = 4;
const HEAD_DIM: u64 = 128;
const HIDDEN: u64 = KV_HEADS * HEAD_DIM;
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

/// The blake3 hash of every block generated, by block number: reads are checked against these
/// (generating a block again would cost more than storing it).
type Hashes = Vec<[u8; 32]>;

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
        let create = CreateOptions {
            capacity_bytes: Some(capacity),
            segment_size_bytes: CreateOptions::default_segment_bytes(capacity),
        };
        let store = Store::create(self.dir, &create, StoreOptions::default())
            .with_context(|| format!("cannot create the demo volume in {}", self.dir.display()))?;
        let mut r = Report { volume: self.dir.display().to_string(), blocks: self.blocks, ..Report::default() };
        r.capacity = store.stats().capacity_bytes;
        r.segment_size = store.stats().segment_size_bytes;
        let (put, hashes) = self.store_all(&store)?;
        r.put = put;
        r.get = self.check_all(&store, &hashes, "reloading")?;
        let s = store.stats();
        (r.logical_bytes, r.unique_blocks, r.dedup_saved, r.evicted) =
            (s.logical_bytes, s.blocks, s.dedup_saved_bytes, s.evicted_keys);
        store.close()?;
        drop(store);

        let t = Instant::now();
        let store = Store::open(self.dir, StoreOptions::default())?;
        r.reopen_checkpoint = t.elapsed();
        self.check_all(&store, &hashes, "after restart")?;
        drop(store);

        // Forget the checkpoint: the log alone must rebuild the same index.
        let checkpoint = kvhoard_engine::VolumeFiles::of(self.dir).checkpoint.context("a directory volume")?;
        std::fs::remove_file(&checkpoint).with_context(|| format!("cannot remove {}", checkpoint.display()))?;
        let t = Instant::now();
        let store = Store::open(self.dir, StoreOptions::default())?;
        r.reopen_log = t.elapsed();
        r.replayed_records = store.recovery_report().records_replayed;
        self.check_all(&store, &hashes, "after replaying the log")?;
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

    /// Stores every block; returns the time spent in `put` (not in generating data) and the
    /// blake3 hash of every block's bytes.
    fn store_all(&self, store: &Store) -> anyhow::Result<(Duration, Hashes)> {
        let bar = self.progress("storing");
        let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, LAYERS, TOKENS, HIDDEN] };
        let mut spent = Duration::ZERO;
        let mut parent = None;
        let mut hashes = Vec::with_capacity(self.blocks as usize);
        let mut shared = std::collections::HashMap::new();
        for i in 0..self.blocks {
            let content = content_id(i);
            let bytes = if i % 4 == 3 {
                shared.entry(content).or_insert_with(|| kv_chunk(self.seed, content)).clone()
            } else {
                kv_chunk(self.seed, content)
            };
            hashes.push(*blake3::hash(&bytes).as_bytes());
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
        Ok((spent + t.elapsed(), hashes))
    }

    /// Reads every block back and checks it against the hash of the generated bytes; returns the
    /// time spent in `get` (which checks crc32c, and blake3 against the block's content hash).
    fn check_all(&self, store: &Store, hashes: &Hashes, what: &str) -> anyhow::Result<Duration> {
        let bar = self.progress(what);
        let mut spent = Duration::ZERO;
        for i in 0..self.blocks {
            let t = Instant::now();
            let block = store.get("default", &key(i), ReadOptions { verify_hash: true })?;
            spent += t.elapsed();
            let block = block.with_context(|| format!("block {i} is missing {what}"))?;
            // `get` verified blake3 of the bytes against the block's content hash; that hash must
            // be the generated block's.
            let expected = hashes.get(i as usize).context("a hash per block")?;
            ensure!(block.meta.content_hash == *expected, "block {i} came back with different bytes {what}");
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
        println!("reloaded  all {} blocks in {:.0} ms: {:.0} MB/s, every byte checked (crc32c, and blake3 against the generated block)", self.blocks, ms(self.get), Self::rate(self.logical_bytes, self.get));
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

/// One chunk of bf16 K and V from the kernels' synthetic generator, the same for the same seed
/// and content.
fn kv_chunk(seed: u64, content: u64) -> Vec<u8> {
    let seed = kvhoard_kernels::rng::mix(seed, content, 0, 0);
    Synth::new(LAYERS as u32, TOKENS as u32, KV_HEADS as u32, HEAD_DIM as u32, seed).generate()
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
