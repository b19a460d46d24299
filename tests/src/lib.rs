//! Helpers shared by kvhoard's cross-crate tests.

#![deny(missing_docs)]

use std::io::Write as _;

pub mod mount;

pub use kvhoard_kernels::rng::Rng;

/// Deterministic pseudo-random bytes: block `id` of length `len`.
pub fn block(id: u64, len: usize) -> Vec<u8> {
    kvhoard_kernels::rng::bytes(id, len)
}

/// Length of block `id` in the crash test: 4 KiB to 160 KiB, not unit-aligned.
pub fn crash_block_len(id: u64) -> usize {
    4096 + (id.wrapping_mul(7919) % 40) as usize * 4001
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
