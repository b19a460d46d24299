//! What a replay needs of a cache, whether the real engine or the simulator: look up a prompt's
//! longest stored prefix and load it, store the blocks a request computed.

/// The outcome of a lookup.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Lookup {
    /// Leading blocks found (and loaded).
    pub hits: usize,
    /// Of those, served by the DRAM tier.
    pub dram_hits: usize,
    /// Seconds the loads took, at the model's real block size.
    pub load_s: f64,
    /// Per hit, the index of the codec it was stored with in the replay's codec list (0: raw).
    pub hit_codec: Vec<usize>,
}

/// What the cache wrote and dropped, at the model's real block size.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct CacheStats {
    /// Bytes of blocks stored by requests (original sizes).
    pub put_bytes: u64,
    /// Bytes written to the log (records: puts and relocations).
    pub bytes_written: u64,
    /// Bytes the cleaner wrote relocating kept blocks.
    pub relocated_bytes: u64,
    /// Blocks dropped.
    pub evictions: u64,
    /// Bytes of records live now.
    pub stored_bytes: u64,
    /// Byte-seconds blocks were kept and not yet expired (what a TTL budget counts); the
    /// simulator only.
    pub byte_seconds: f64,
    /// Seconds the placement planner spent deciding (with `planner`).
    pub planner_cpu_s: f64,
    /// Blocks the planner had written again with another codec.
    pub recompressed: u64,
    /// Blocks the planner dropped (counted in `evictions` too).
    pub planner_drops: u64,
    /// Segments freed while an older one was still in the log, each recorded in the superblock
    /// (docs/format.md, "Damage"); the engine only.
    pub segments_freed_ahead: u64,
}

impl CacheStats {
    /// Bytes written by cleaning ÷ bytes put.
    pub fn write_amplification(&self) -> f64 {
        self.relocated_bytes as f64 / self.put_bytes.max(1) as f64
    }
}

/// A cache a trace is replayed through.
pub trait Cache {
    /// Finds the longest stored prefix of `blocks` at trace time `now_ms` and loads it.
    fn lookup(&mut self, now_ms: u64, blocks: &[u64]) -> anyhow::Result<Lookup>;
    /// Stores `blocks` (computed by a request of context `group`) at `now_ms`, to expire after
    /// `ttl_ms` (`None`: kept until evicted).
    fn store(&mut self, now_ms: u64, blocks: &[u64], group: u64, ttl_ms: Option<u64>) -> anyhow::Result<()>;
    /// What it wrote and dropped so far.
    fn stats(&self) -> CacheStats;
}

/// The bounds any cache lies between, for a capacity search's reference point.
pub mod bounds {
    use std::collections::HashSet;

    use super::{Cache, CacheStats, Lookup};

    /// Stores nothing: every request prefills its whole prompt.
    #[derive(Debug, Default)]
    pub struct NoCache;

    impl Cache for NoCache {
        fn lookup(&mut self, _: u64, _: &[u64]) -> anyhow::Result<Lookup> {
            Ok(Lookup::default())
        }
        fn store(&mut self, _: u64, _: &[u64], _: u64, _: Option<u64>) -> anyhow::Result<()> {
            Ok(())
        }
        fn stats(&self) -> CacheStats {
            CacheStats::default()
        }
    }

    /// Stores everything forever and loads it in no time: the most any cache can give.
    #[derive(Debug, Default)]
    pub struct Unbounded(HashSet<u64>);

    impl Cache for Unbounded {
        fn lookup(&mut self, _: u64, blocks: &[u64]) -> anyhow::Result<Lookup> {
            let hits = blocks.iter().take_while(|b| self.0.contains(b)).count();
            Ok(Lookup { hits, dram_hits: 0, load_s: 0.0, hit_codec: vec![0; hits] })
        }
        fn store(&mut self, _: u64, blocks: &[u64], _: u64, _: Option<u64>) -> anyhow::Result<()> {
            self.0.extend(blocks);
            Ok(())
        }
        fn stats(&self) -> CacheStats {
            CacheStats::default()
        }
    }
}
