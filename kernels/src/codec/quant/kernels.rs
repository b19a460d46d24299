//! The row kernels of quantization, dispatched on a [`Level`]: the scalar reference (here and in
//! `scalar.rs`), the AVX2 versions in `avx2.rs`, which must write the same bytes.

use super::scalar::{dequantize, minmax_one, quantize_scalar, ranges_scalar};
use super::{pack as pack_scalar, store_decoded, unpack};
#[cfg(target_arch = "x86_64")]
use crate::simd::Kind;
use crate::simd::Level;
use crate::Dtype;

/// Widens the per-channel ranges `mins`, `maxs` with one row.
pub(super) fn minmax(level: Level, row: &[f32], mins: &mut [f32], maxs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 {
        // SAFETY: a level of kind Avx2 exists only where AVX2, FMA and F16C were detected
        // (simd.rs), the target features the function is compiled for.
        return unsafe { super::avx2::minmax(row, mins, maxs) };
    }
    let _ = level;
    for ((&x, lo), hi) in row.iter().zip(mins).zip(maxs) {
        minmax_one(x, lo, hi);
    }
}

/// The range of each group of `group` consecutive values of `row`.
pub(super) fn group_minmax(level: Level, row: &[f32], group: usize, mins: &mut [f32], maxs: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 {
        // SAFETY: as in `minmax`.
        return unsafe { super::avx2::group_minmax(row, group, mins, maxs) };
    }
    let _ = level;
    for ((chunk, lo), hi) in row.chunks(group).zip(mins).zip(maxs) {
        let (mut l, mut h) = (f32::INFINITY, f32::NEG_INFINITY);
        for &x in chunk {
            minmax_one(x, &mut l, &mut h);
        }
        *lo = l;
        *hi = h;
    }
}

/// For each range `[mins[i], maxs[i]]`: the stored minimum and scale (bf16, little-endian, into
/// `lo_bytes` and `scale_bytes`), the minimum as `f32` and the inverse of the scale.
#[allow(clippy::too_many_arguments)]
pub(super) fn ranges(
    level: Level,
    mins: &[f32],
    maxs: &[f32],
    levels: f32,
    lo_bytes: &mut [u8],
    scale_bytes: &mut [u8],
    lo: &mut [f32],
    inv: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 {
        // SAFETY: as in `minmax`.
        return unsafe { super::avx2::ranges(mins, maxs, levels, lo_bytes, scale_bytes, lo, inv) };
    }
    let _ = level;
    ranges_scalar(mins, maxs, levels, lo_bytes, scale_bytes, lo, inv);
}

/// The code of every value of `row`, each with its own minimum and inverse scale.
pub(super) fn quantize(level: Level, row: &[f32], lo: &[f32], inv: &[f32], levels: f32, codes: &mut [u8]) {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 {
        // SAFETY: as in `minmax`.
        return unsafe { super::avx2::quantize(row, lo, inv, levels, codes) };
    }
    let _ = level;
    quantize_scalar(row, lo, inv, levels, codes);
}

/// Writes `codes` into the zeroed bit stream from element `first` on.
pub(super) fn pack(level: Level, stream: &mut [u8], first: usize, bits: u32, codes: &[u8]) {
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 && (first * bits as usize).is_multiple_of(8) {
        // Whole 32-code blocks from a byte boundary on; the rest, if any, as the reference does.
        let full = codes.len() / 32 * 32;
        let start = first * bits as usize / 8;
        let (head, tail) = codes.split_at(full);
        let bytes = &mut stream[start..start + full * bits as usize / 8];
        // SAFETY: as in `minmax`.
        unsafe { super::avx2::pack(bits, head, bytes) };
        pack_scalar(stream, first + full, bits, tail);
        return;
    }
    let _ = level;
    pack_scalar(stream, first, bits, codes);
}

/// Decodes rows of a code stream.
pub(super) struct Dequant<'a> {
    pub level: Level,
    pub dtype: Dtype,
    pub bits: u32,
    /// The whole code stream.
    pub codes: &'a [u8],
    /// A row of `f32`.
    pub row: &'a mut [f32],
    /// A row of codes, one a byte.
    pub row_codes: &'a mut [u8],
}

impl Dequant<'_> {
    /// Puts per-value minimums or scales in the order [`Dequant::row`] reads them at this level
    /// (the same values, permuted for the vector bf16 decoder).
    pub fn kernel_order(&self, values: &mut [f32]) {
        #[cfg(target_arch = "x86_64")]
        if self.level.kind() == Kind::Avx2 && self.dtype == Dtype::Bf16 {
            super::avx2::even_odd_order(values);
        }
        let _ = values;
    }

    /// Decodes the row whose first code is element `first` of the stream, value `i` being
    /// `mins[i] + code * scales[i]`, into `out` in the block's dtype, `mins` and `scales` in
    /// [`Dequant::kernel_order`]. `finite` says whether every minimum and scale is finite
    /// ([`all_finite`]), so that no value can be NaN.
    pub fn row(&mut self, first: usize, mins: &[f32], scales: &[f32], finite: bool, out: &mut [u8]) {
        #[cfg(target_arch = "x86_64")]
        if self.level.kind() == Kind::Avx2 && matches!(self.dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32) {
            self.avx2(first, mins, scales, 0, finite, out);
            return;
        }
        unpack(self.codes, first, self.bits, self.row_codes);
        let values = self.row.iter_mut().zip(&*self.row_codes).zip(mins.iter().zip(scales));
        if finite {
            // No value can be NaN: the plain loop, which vectorizes.
            for ((x, &code), (&lo, &scale)) in values {
                *x = lo + code as f32 * scale;
            }
        } else {
            for ((x, &code), (&lo, &scale)) in values {
                *x = dequantize(code, lo, scale);
            }
        }
        store_decoded(self.dtype, self.row, out);
    }

    /// [`Dequant::row`] where groups of `group` values share a minimum and a scale
    /// (`group_mins`, `group_scales`); `mins` and `scales` are room for one a value.
    #[allow(clippy::too_many_arguments)]
    pub fn grouped_row(
        &mut self,
        first: usize,
        group: usize,
        group_mins: &[f32],
        group_scales: &[f32],
        mins: &mut [f32],
        scales: &mut [f32],
        out: &mut [u8],
    ) {
        #[cfg(target_arch = "x86_64")]
        if self.level.kind() == Kind::Avx2
            && matches!(self.dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32)
            && group.is_multiple_of(16)
        {
            let finite = all_finite(group_mins) && all_finite(group_scales);
            self.avx2(first, group_mins, group_scales, group, finite, out);
            return;
        }
        let finite = all_finite(group_mins) && all_finite(group_scales);
        #[cfg(target_arch = "x86_64")]
        if self.level.kind() == Kind::Avx2 && matches!(self.dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32) {
            // Groups the vector decoder does not take whole: one minimum and scale a value.
            for ((mins, scales), (&lo, &scale)) in
                mins.chunks_mut(group).zip(scales.chunks_mut(group)).zip(group_mins.iter().zip(group_scales))
            {
                mins.fill(lo);
                scales.fill(scale);
            }
            self.kernel_order(mins);
            self.kernel_order(scales);
            self.avx2(first, mins, scales, 0, finite, out);
            return;
        }
        let _ = (mins, scales);
        unpack(self.codes, first, self.bits, self.row_codes);
        let groups = self.row.chunks_mut(group).zip(self.row_codes.chunks(group));
        for ((row, codes), (&lo, &scale)) in groups.zip(group_mins.iter().zip(group_scales)) {
            if finite {
                for (x, &code) in row.iter_mut().zip(codes) {
                    *x = lo + code as f32 * scale;
                }
            } else {
                for (x, &code) in row.iter_mut().zip(codes) {
                    *x = dequantize(code, lo, scale);
                }
            }
        }
        store_decoded(self.dtype, self.row, out);
    }

    #[cfg(target_arch = "x86_64")]
    fn avx2(&mut self, first: usize, mins: &[f32], scales: &[f32], group: usize, finite: bool, out: &mut [u8]) {
        let bits = self.bits as usize;
        let c = self.row_codes.len();
        if (first * bits).is_multiple_of(8) {
            let start = first * bits / 8;
            let packed = &self.codes[start..start + (c * bits).div_ceil(8)];
            // SAFETY: a level of kind Avx2 exists only where AVX2, FMA and F16C were detected
            // (simd.rs), the target features the function is compiled for.
            unsafe { super::avx2::dequant(self.bits, packed, mins, scales, group, finite, self.dtype, out) };
        } else {
            // A row that starts inside a byte (an odd number of channels): unpacked first.
            unpack(self.codes, first, self.bits, self.row_codes);
            // SAFETY: as above.
            unsafe { super::avx2::dequant(8, self.row_codes, mins, scales, group, finite, self.dtype, out) };
        }
    }
}

/// Whether every value is finite (no NaN, no infinity).
pub(super) fn all_finite(values: &[f32]) -> bool {
    // The greatest magnitude's bits, in a loop that vectorizes.
    values.iter().map(|x| x.to_bits() & 0x7fff_ffff).max().unwrap_or(0) < 0x7f80_0000
}
