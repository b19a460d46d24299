//! What the `bench` workloads share: block bytes, percentiles, rounding.

/// Makes a block's bytes unique by writing its number into its first bytes.
pub fn stamp(buf: &mut [u8], i: u64) {
    let n = buf.len().min(8);
    if let (Some(dst), Some(src)) = (buf.get_mut(..n), i.to_le_bytes().get(..n)) {
        dst.copy_from_slice(src);
    }
}

/// `len` bytes of seeded noise (incompressible, as random data is).
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    kvhoard_kernels::rng::bytes(seed, len)
}

/// The `p`-th percentile of `sorted` (0 when empty).
pub fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    let i = ((p / 100.0) * (sorted.len() - 1) as f64).round() as usize;
    sorted.get(i).copied().unwrap_or(0)
}

/// `v` to three decimals, for JSON people read.
pub fn round3(v: f64) -> f64 {
    (v * 1000.0).round() / 1000.0
}
