//! Helpers shared by kvhoard's cross-crate tests.

use std::io::Write as _;

/// Deterministic pseudo-random bytes: block `id` of length `len`.
pub fn block(id: u64, len: usize) -> Vec<u8> {
    let mut x = id.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xA076_1D64_78BD_642F;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// Length of block `id` in the crash test: 4 KiB to 160 KiB, not unit-aligned.
pub fn crash_block_len(id: u64) -> usize {
    4096 + (id.wrapping_mul(7919) % 40) as usize * 4001
}

/// A small xorshift generator for reproducible choices from a printed seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator from `seed`.
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x2545_F491_4F6C_DD1D) | 1)
    }

    /// The next value.
    pub fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A value in `0..n`.
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }
}

/// Reports that the calling test cannot run here (it needs `capability`: `fuse`, `loop`,
/// `python`, ...) and returns, so the caller can return too. A skipped test is not a passed
/// one: the skip is written to stderr and appended to the file `KVHOARD_SKIP_LOG` names, which
/// `scripts/test` counts and reports. If `KVHOARD_REQUIRE` lists `capability` (scripts/test sets
/// it on a machine that has root and /dev/fuse), the test must run: the skip panics instead.
pub fn skip(capability: &str, reason: &str) {
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("a test");
    let required = std::env::var("KVHOARD_REQUIRE").unwrap_or_default();
    if required.split(',').any(|c| c.trim() == capability) {
        panic!("{test} must run on this machine ({capability} is required here) but cannot: {reason}");
    }
    eprintln!("SKIPPED {test}: {reason}");
    if let Ok(path) = std::env::var("KVHOARD_SKIP_LOG") {
        let line = format!("{test}\t{capability}\t{reason}\n");
        let file = std::fs::OpenOptions::new().create(true).append(true).open(&path);
        if let Ok(mut file) = file {
            let _ = file.write_all(line.as_bytes());
        }
    }
}
