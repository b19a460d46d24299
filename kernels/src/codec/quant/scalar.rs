//! The scalar pieces both kernel paths share: the reference loops the dispatch in `kernels.rs`
//! falls back to, and the AVX2 kernels in `avx2.rs` use for their tails. Neither path depends on
//! the other.

use super::{inverse, quantize as quantize_one, range};
use crate::elem::bf16_to_f32;

/// Takes `x` into a group's range `[lo, hi]`: only finite values count, and a zero counts as +0
/// (so that the minimum and maximum of a group are the same whatever order its values are seen
/// in: the vector kernels reduce in another order than this loop).
#[inline]
pub(super) fn minmax_one(x: f32, lo: &mut f32, hi: &mut f32) {
    // -0.0 + 0.0 is +0.0; every other value is unchanged.
    let x = x + 0.0;
    if x.is_finite() {
        if x < *lo {
            *lo = x;
        }
        if x > *hi {
            *hi = x;
        }
    }
}

/// The scalar `kernels::ranges` (also the vector kernels' tail).
pub(super) fn ranges_scalar(
    mins: &[f32],
    maxs: &[f32],
    levels: f32,
    lo_bytes: &mut [u8],
    scale_bytes: &mut [u8],
    lo: &mut [f32],
    inv: &mut [f32],
) {
    let outs = lo_bytes.chunks_exact_mut(2).zip(scale_bytes.chunks_exact_mut(2)).zip(lo.iter_mut().zip(inv));
    for ((&min, &max), ((lo_bytes, scale_bytes), (lo, inv))) in mins.iter().zip(maxs).zip(outs) {
        let (lo_bits, scale_bits) = range(min, max, levels);
        lo_bytes.copy_from_slice(&lo_bits.to_le_bytes());
        scale_bytes.copy_from_slice(&scale_bits.to_le_bytes());
        *lo = bf16_to_f32(lo_bits);
        *inv = inverse(bf16_to_f32(scale_bits));
    }
}

/// The scalar `kernels::quantize` (also the vector kernel's tail).
pub(super) fn quantize_scalar(row: &[f32], lo: &[f32], inv: &[f32], levels: f32, codes: &mut [u8]) {
    for (((code, &x), &lo), &inv) in codes.iter_mut().zip(row).zip(lo).zip(inv) {
        *code = quantize_one(x, lo, inv, levels);
    }
}

/// The value of `code` in a group starting at `lo` with steps of `scale`. Parameters an encoder
/// wrote never give NaN (minimum and scale are finite); damaged ones can, and a NaN decodes as
/// `f32::NAN`, whatever NaN the arithmetic made (which one depends on the order of the operands,
/// which the compiler may change).
#[inline]
pub(super) fn dequantize(code: u8, lo: f32, scale: f32) -> f32 {
    let x = lo + code as f32 * scale;
    if x.is_nan() {
        f32::NAN
    } else {
        x
    }
}
