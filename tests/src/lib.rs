//! Helpers shared by kvhoard's cross-crate tests.

#![deny(missing_docs)]

use std::io::Write as _;

pub mod mount;

pub use kvhoard_kernels::rng::Rng;

/// Deterministic pseudo-random bytes: block `id` of length `len`.
pub fn block(id: u64, len: usize) -> Vec<u8> {
    kvhoard_kernels::rng::bytes(id, len)
}

/// What the kernels' own codec `spec` makes of `bytes`, a block of `shape`, once decoded: what
/// the store must return for a block it stored or recompressed with `spec`.
pub fn codec_form(spec: kvhoard_kernels::CodecSpec, shape: kvhoard_kernels::KvShape, bytes: &[u8]) -> Vec<u8> {
    use kvhoard_kernels::Codec as _;
    let mut codec = kvhoard_kernels::CpuCodec::new(spec).expect("a codec the kernels know");
    let mut frame = vec![0u8; codec.max_payload_size(&shape)];
    let c = codec.compress(&kvhoard_kernels::Block::new(shape, bytes), &mut frame).expect("the block fits its shape");
    let mut out = vec![0u8; kvhoard_kernels::decoded_size(&c.params, &c.shape)];
    let d = kvhoard_kernels::CpuCodec::decoder()
        .decompress(&c.params, &c.shape, frame.get(..c.len).unwrap_or_default(), &mut out)
        .expect("a frame the codec just made decodes");
    out.truncate(d.len);
    out
}

/// Length of block `id` in the crash test: 4 KiB to 160 KiB, not unit-aligned.
pub fn crash_block_len(id: u64) -> usize {
    4096 + (id.wrapping_mul(7919) % 40) as usize * 4001
}

/// The block the crash test's writer process writes to a hot key after block `id`: longer than
/// the log writer's joined writes (2 MiB), so that it is a write of its own.
pub fn hot_block(id: u64) -> Vec<u8> {
    block(1_000_000 + id, (2 << 20) + 100_000)
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
