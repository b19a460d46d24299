//! AVX2 versions of the quantization row kernels (`kernels.rs` has the scalar reference and
//! says what each computes). Each gives the same bytes as its reference, operation for operation:
//! no fused multiply-add (the reference rounds the product, then the sum), minimum and maximum as
//! the reference's compare-and-select (`min_ps(a, b)` is `a < b ? a : b`), the same rounding to
//! bf16 in integer arithmetic, and the reference itself for the tail of a row that does not fill
//! a vector.
//!
//! Every function has `#[target_feature(enable = "avx2,fma,f16c")]`; callers must hold a
//! [`crate::simd::Level`] of kind `Avx2`, which exists only where those were detected. Loads and
//! stores go through the helpers below, which take arrays, so that every access is in bounds by
//! its type.

use std::arch::x86_64::*;

use super::scalar::{dequantize, minmax_one, quantize_scalar, ranges_scalar};
use crate::elem::avx2::{round_bf16_finite, store_u16x16};
use crate::elem::f32_to_bf16_finite;
use crate::Dtype;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load8(x: &[f32; 8]) -> __m256 {
    // SAFETY: `x` is 8 readable f32; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(x.as_ptr()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store8(x: &mut [f32; 8], v: __m256) {
    // SAFETY: `x` is 8 writable f32; storeu has no alignment requirement.
    unsafe { _mm256_storeu_ps(x.as_mut_ptr(), v) }
}

/// The values of `x` that count in a range (finite, zero as +0): for the minimum (others +inf)
/// and for the maximum (others -inf).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn finite_or_inf(x: __m256) -> (__m256, __m256) {
    let inf = _mm256_set1_ps(f32::INFINITY);
    // -0.0 + 0.0 is +0.0, as in `minmax_one`.
    let x = _mm256_add_ps(x, _mm256_setzero_ps());
    let magnitude = _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7fff_ffff)));
    // Ordered: false for NaN.
    let finite = _mm256_cmp_ps::<_CMP_LT_OQ>(magnitude, inf);
    (_mm256_blendv_ps(inf, x, finite), _mm256_blendv_ps(_mm256_set1_ps(f32::NEG_INFINITY), x, finite))
}

/// `kernels::minmax`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn minmax(row: &[f32], mins: &mut [f32], maxs: &mut [f32]) {
    let n = row.len().min(mins.len()).min(maxs.len());
    let (row, tail) = row[..n].as_chunks::<8>();
    let (mins, mins_tail) = mins[..n].as_chunks_mut::<8>();
    let (maxs, maxs_tail) = maxs[..n].as_chunks_mut::<8>();
    for ((x, lo), hi) in row.iter().zip(mins.iter_mut()).zip(maxs.iter_mut()) {
        let (x_lo, x_hi) = finite_or_inf(load8(x));
        // min_ps(a, b) is a < b ? a : b, max_ps(a, b) a > b ? a : b: the reference's selects.
        store8(lo, _mm256_min_ps(x_lo, load8(lo)));
        store8(hi, _mm256_max_ps(x_hi, load8(hi)));
    }
    for ((&x, lo), hi) in tail.iter().zip(mins_tail).zip(maxs_tail) {
        minmax_one(x, lo, hi);
    }
}

/// The least of 8 values (no NaN among them, so any order of reduction gives the same).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn horizontal_min(v: __m256) -> f32 {
    let m = _mm_min_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_min_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_min_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

/// The greatest of 8 values (no NaN among them).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn horizontal_max(v: __m256) -> f32 {
    let m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    _mm_cvtss_f32(_mm_max_ss(m, _mm_shuffle_ps::<0b01>(m, m)))
}

/// `kernels::group_minmax`. The order of reduction differs from the reference's, which is why
/// both count a zero as +0: the least (greatest) of values without NaN or -0 is one bit pattern
/// whatever the order.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn group_minmax(row: &[f32], group: usize, mins: &mut [f32], maxs: &mut [f32]) {
    for ((chunk, lo), hi) in row.chunks(group.max(1)).zip(mins).zip(maxs) {
        let (vectors, tail) = chunk.as_chunks::<8>();
        let mut v_lo = _mm256_set1_ps(f32::INFINITY);
        let mut v_hi = _mm256_set1_ps(f32::NEG_INFINITY);
        for x in vectors {
            let (x_lo, x_hi) = finite_or_inf(load8(x));
            v_lo = _mm256_min_ps(x_lo, v_lo);
            v_hi = _mm256_max_ps(x_hi, v_hi);
        }
        let (mut l, mut h) = (horizontal_min(v_lo), horizontal_max(v_hi));
        for &x in tail {
            minmax_one(x, &mut l, &mut h);
        }
        *lo = l;
        *hi = h;
    }
}

/// bf16 nearest to 8 finite values, ties to even (`half::bf16::from_f32` on finite input).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_nearest(x: __m256) -> __m256i {
    round_bf16_finite(x)
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_value(bits: __m256i) -> __m256 {
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(bits))
}

/// `quant::bf16_down` on 8 finite values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_down(x: __m256) -> __m256i {
    let zero = _mm256_setzero_si256();
    let one = _mm256_set1_epi32(1);
    let bits = bf16_nearest(x);
    let below = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_LE_OQ>(bf16_value(bits), x));
    let positive = _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x8000)), zero);
    let is_zero = _mm256_cmpeq_epi32(bits, zero);
    // bits & 0x8000 == 0 && bits != 0: one step towards zero.
    let step_down = _mm256_andnot_si256(is_zero, positive);
    let down = _mm256_sub_epi32(bits, one);
    // Otherwise (bits | 0x8000) + (bits & 0x7fff != 0 || bits == 0): one step away from zero.
    let magnitude_zero = _mm256_cmpeq_epi32(_mm256_and_si256(bits, _mm256_set1_epi32(0x7fff)), zero);
    let increment =
        _mm256_and_si256(_mm256_or_si256(_mm256_xor_si256(magnitude_zero, _mm256_set1_epi32(-1)), is_zero), one);
    let away = _mm256_and_si256(
        _mm256_add_epi32(_mm256_or_si256(bits, _mm256_set1_epi32(0x8000)), increment),
        _mm256_set1_epi32(0xffff),
    );
    let stepped = _mm256_blendv_epi8(away, down, step_down);
    _mm256_blendv_epi8(stepped, bits, below)
}

/// `quant::bf16_up` on 8 finite values.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn bf16_up(x: __m256) -> __m256i {
    let bits = bf16_nearest(x);
    let above = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GE_OQ>(bf16_value(bits), x));
    let up = _mm256_and_si256(_mm256_add_epi32(bits, _mm256_set1_epi32(1)), _mm256_set1_epi32(0xffff));
    _mm256_blendv_epi8(up, bits, above)
}

/// `quant::range` on 8 groups: their stored minimums and scales, as bf16 bits in 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn range8(lo: __m256, hi: __m256, levels: __m256) -> (__m256i, __m256i) {
    // No finite value in the group: (0, 0).
    let empty = _mm256_castps_si256(_mm256_cmp_ps::<_CMP_GT_OQ>(lo, hi));
    let limit = _mm256_set1_ps(half::bf16::MAX.to_f32());
    let negative_limit = _mm256_set1_ps(-half::bf16::MAX.to_f32());
    // f32::clamp(x, min, max): x < min ? min : x, then x > max ? max : x.
    let clamp = |x| _mm256_min_ps(limit, _mm256_max_ps(negative_limit, x));
    let (lo, hi) = (clamp(lo), clamp(hi));
    let lo_bits = bf16_down(lo);
    let scale = _mm256_min_ps(_mm256_div_ps(_mm256_sub_ps(hi, bf16_value(lo_bits)), levels), limit);
    let scale_bits = bf16_up(scale);
    (_mm256_andnot_si256(empty, lo_bits), _mm256_andnot_si256(empty, scale_bits))
}

/// Stores the low 16 bits of 8 lanes as 8 little-endian u16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store_u16x8(v: __m256i, out: &mut [u8; 16]) {
    let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(v, v));
    // SAFETY: `out` is 16 writable bytes; storeu has no alignment requirement.
    unsafe { _mm_storeu_si128(out.as_mut_ptr().cast(), _mm256_castsi256_si128(packed)) }
}

/// `kernels::ranges`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn ranges(
    mins: &[f32],
    maxs: &[f32],
    levels: f32,
    lo_bytes: &mut [u8],
    scale_bytes: &mut [u8],
    lo: &mut [f32],
    inv: &mut [f32],
) {
    let n = mins.len().min(maxs.len()).min(lo.len()).min(inv.len()).min(lo_bytes.len() / 2).min(scale_bytes.len() / 2);
    let body = n / 8 * 8;
    let levels_v = _mm256_set1_ps(levels);
    let zero = _mm256_setzero_ps();
    let (mins8, _) = mins[..body].as_chunks::<8>();
    let (maxs8, _) = maxs[..body].as_chunks::<8>();
    let (lo_bytes16, _) = lo_bytes[..2 * body].as_chunks_mut::<16>();
    let (scale_bytes16, _) = scale_bytes[..2 * body].as_chunks_mut::<16>();
    let (lo8, _) = lo[..body].as_chunks_mut::<8>();
    let (inv8, _) = inv[..body].as_chunks_mut::<8>();
    let outs = lo_bytes16.iter_mut().zip(scale_bytes16.iter_mut()).zip(lo8.iter_mut().zip(inv8.iter_mut()));
    for ((min, max), ((lo_bytes, scale_bytes), (lo, inv))) in mins8.iter().zip(maxs8).zip(outs) {
        let (lo_bits, scale_bits) = range8(load8(min), load8(max), levels_v);
        store_u16x8(lo_bits, lo_bytes);
        store_u16x8(scale_bits, scale_bytes);
        store8(lo, bf16_value(lo_bits));
        // `quant::inverse`: 1 / scale where the scale is above zero, else 0.
        let scale = bf16_value(scale_bits);
        let positive = _mm256_cmp_ps::<_CMP_GT_OQ>(scale, zero);
        store8(inv, _mm256_and_ps(positive, _mm256_div_ps(_mm256_set1_ps(1.0), scale)));
    }
    ranges_scalar(
        &mins[body..n],
        &maxs[body..n],
        levels,
        &mut lo_bytes[2 * body..2 * n],
        &mut scale_bytes[2 * body..2 * n],
        &mut lo[body..n],
        &mut inv[body..n],
    );
}

/// `quant::quantize` on 8 values: codes in 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn quantize8(x: __m256, lo: __m256, inv: __m256, levels: __m256) -> __m256i {
    let v = _mm256_mul_ps(_mm256_sub_ps(x, lo), inv);
    // f32::clamp(v, 0, levels) keeps a NaN: max_ps(0, NaN) and min_ps(levels, NaN) return NaN.
    let v = _mm256_min_ps(levels, _mm256_max_ps(_mm256_setzero_ps(), v));
    // Rounds in the current rounding mode, as the reference's 2^23 addition does; a NaN becomes
    // i32::MIN, which the unsigned saturating packs below turn into 0, as `as u8` does.
    _mm256_cvtps_epi32(v)
}

/// `kernels::quantize`.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn quantize(row: &[f32], lo: &[f32], inv: &[f32], levels: f32, codes: &mut [u8]) {
    let n = codes.len().min(row.len()).min(lo.len()).min(inv.len());
    let body = n / 32 * 32;
    let levels_v = _mm256_set1_ps(levels);
    let (row32, _) = row[..body].as_chunks::<32>();
    let (lo32, _) = lo[..body].as_chunks::<32>();
    let (inv32, _) = inv[..body].as_chunks::<32>();
    let (codes32, _) = codes[..body].as_chunks_mut::<32>();
    for (((x, lo), inv), out) in row32.iter().zip(lo32).zip(inv32).zip(codes32.iter_mut()) {
        let (x, lo, inv) = (x.as_chunks::<8>().0, lo.as_chunks::<8>().0, inv.as_chunks::<8>().0);
        let (Some(x), Some(lo), Some(inv)) = (x.first_chunk::<4>(), lo.first_chunk::<4>(), inv.first_chunk::<4>())
        else {
            continue;
        };
        let q = |k: usize| quantize8(load8(&x[k]), load8(&lo[k]), load8(&inv[k]), levels_v);
        let (a, b, c, d) = (q(0), q(1), q(2), q(3));
        // Saturating packs within 128-bit lanes give dwords a0-3 b0-3 c0-3 d0-3 | a4-7 b4-7 c4-7
        // d4-7; the permutation puts them in order.
        let bytes = _mm256_packus_epi16(_mm256_packus_epi32(a, b), _mm256_packus_epi32(c, d));
        let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), bytes) }
    }
    quantize_scalar(&row[body..n], &lo[body..n], &inv[body..n], levels, &mut codes[body..n]);
}

/// Packs codes (each below 2^bits, a multiple of 32 of them) into `out`, which starts on a byte
/// of the stream and holds exactly their bits.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn pack(bits: u32, codes: &[u8], out: &mut [u8]) {
    match bits {
        8 => {
            let n = codes.len().min(out.len());
            out[..n].copy_from_slice(&codes[..n]);
        }
        4 => {
            let (codes, _) = codes.as_chunks::<32>();
            let (out, _) = out.as_chunks_mut::<16>();
            for (c, o) in codes.iter().zip(out.iter_mut()) {
                // SAFETY: `c` is 32 readable bytes; loadu has no alignment requirement.
                let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
                // Byte pairs (low, high) become low + 16 * high, in 16-bit lanes.
                let pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x1001));
                let packed = _mm256_permute4x64_epi64::<0b00_00_10_00>(_mm256_packus_epi16(pairs, pairs));
                // SAFETY: `o` is 16 writable bytes; storeu has no alignment requirement.
                unsafe { _mm_storeu_si128(o.as_mut_ptr().cast(), _mm256_castsi256_si128(packed)) }
            }
        }
        _ => {
            let (codes, _) = codes.as_chunks::<32>();
            let (out, _) = out.as_chunks_mut::<8>();
            for (c, o) in codes.iter().zip(out.iter_mut()) {
                // SAFETY: `c` is 32 readable bytes; loadu has no alignment requirement.
                let v = unsafe { _mm256_loadu_si256(c.as_ptr().cast()) };
                // c0 + 4 c1 in 16-bit lanes, then (c0 + 4 c1) + 16 (c2 + 4 c3) in 32-bit lanes.
                let pairs = _mm256_maddubs_epi16(v, _mm256_set1_epi16(0x0401));
                let quads = _mm256_madd_epi16(pairs, _mm256_set1_epi32(0x0010_0001));
                let words = _mm256_packus_epi32(quads, quads);
                let bytes = _mm256_packus_epi16(words, words);
                // Dword 0 of each 128-bit lane holds 4 bytes of the result.
                let bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 0, 0, 0, 0, 0, 0));
                // SAFETY: `o` is 8 writable bytes; storel writes 8 bytes, unaligned.
                unsafe { _mm_storel_epi64(o.as_mut_ptr().cast(), _mm256_castsi256_si128(bytes)) }
            }
        }
    }
}

/// The output dtypes of the decoder, as const parameters.
const BF16: u8 = 0;
const F16: u8 = 1;
const F32: u8 = 2;

/// Decodes 16 values from their codes (in 32-bit lanes, `a` then `b`), minimums and scales
/// into `out`: 16 values of dtype `D`. With `NAN`, a NaN becomes `f32::NAN` as in
/// `kernels::dequantize`; without, the caller knows every minimum and scale is finite, so no
/// value is NaN.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn emit16<const D: u8, const NAN: bool>(
    a: __m256i,
    b: __m256i,
    m0: __m256,
    m1: __m256,
    s0: __m256,
    s1: __m256,
    out: &mut [u8],
) {
    // lo + code * scale: the product rounded, then the sum (no fused multiply-add).
    let mut x0 = _mm256_add_ps(m0, _mm256_mul_ps(_mm256_cvtepi32_ps(a), s0));
    let mut x1 = _mm256_add_ps(m1, _mm256_mul_ps(_mm256_cvtepi32_ps(b), s1));
    if NAN {
        let nan = _mm256_set1_ps(f32::NAN);
        x0 = _mm256_blendv_ps(x0, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x0, x0));
        x1 = _mm256_blendv_ps(x1, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x1, x1));
    }
    match D {
        BF16 => {
            if let Ok(out) = <&mut [u8; 32]>::try_from(out) {
                store_u16x16(round_bf16_finite(x0), round_bf16_finite(x1), out);
            }
        }
        F16 => {
            if let Ok(out) = <&mut [u8; 32]>::try_from(out) {
                let h0 = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x0);
                let h1 = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(x1);
                // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
                unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), _mm256_set_m128i(h1, h0)) }
            }
        }
        _ => {
            if let Ok(out) = <&mut [u8; 64]>::try_from(out) {
                // SAFETY: `out` is 64 writable bytes; storeu has no alignment requirement.
                unsafe {
                    _mm256_storeu_ps(out.as_mut_ptr().cast(), x0);
                    _mm256_storeu_ps(out.as_mut_ptr().add(32).cast(), x1);
                }
            }
        }
    }
}

/// The codes of 16 values, `BITS` each, from `2 * BITS` bytes: 8 in each vector's 32-bit lanes.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn codes16<const BITS: u32>(packed: &[u8]) -> (__m256i, __m256i) {
    match BITS {
        4 => {
            let Some(bytes) = packed.first_chunk::<8>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            let shifts = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
            let mask = _mm256_set1_epi32(0xf);
            let lo = u32::from_le_bytes([bytes[0], bytes[1], bytes[2], bytes[3]]);
            let hi = u32::from_le_bytes([bytes[4], bytes[5], bytes[6], bytes[7]]);
            (
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(lo as i32), shifts), mask),
                _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(hi as i32), shifts), mask),
            )
        }
        2 => {
            let Some(bytes) = packed.first_chunk::<4>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            let all = _mm256_set1_epi32(u32::from_le_bytes(*bytes) as i32);
            let mask = _mm256_set1_epi32(3);
            (
                _mm256_and_si256(_mm256_srlv_epi32(all, _mm256_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14)), mask),
                _mm256_and_si256(_mm256_srlv_epi32(all, _mm256_setr_epi32(16, 18, 20, 22, 24, 26, 28, 30)), mask),
            )
        }
        _ => {
            let Some(bytes) = packed.first_chunk::<16>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            // SAFETY: `bytes` is 16 readable bytes; loadu has no alignment requirement.
            let v = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
            (_mm256_cvtepu8_epi32(v), _mm256_cvtepu8_epi32(_mm_srli_si128::<8>(v)))
        }
    }
}

/// The codes of 16 values, `BITS` each, from `2 * BITS` bytes: those of the even values (0, 2,
/// .., 14) in the first vector's 32-bit lanes, of the odd ones in the second's.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn codes16_even_odd<const BITS: u32>(packed: &[u8]) -> (__m256i, __m256i) {
    match BITS {
        4 => {
            let Some(bytes) = packed.first_chunk::<8>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            // Byte k holds codes 2k (low nibble) and 2k + 1.
            let v = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(i64::from_le_bytes(*bytes)));
            (_mm256_and_si256(v, _mm256_set1_epi32(0xf)), _mm256_srli_epi32::<4>(v))
        }
        2 => {
            let Some(bytes) = packed.first_chunk::<4>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            // Nibble k holds codes 2k (low 2 bits) and 2k + 1.
            let nibbles = _mm256_srlv_epi32(
                _mm256_set1_epi32(u32::from_le_bytes(*bytes) as i32),
                _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28),
            );
            let mask = _mm256_set1_epi32(3);
            (_mm256_and_si256(nibbles, mask), _mm256_and_si256(_mm256_srli_epi32::<2>(nibbles), mask))
        }
        _ => {
            let Some(bytes) = packed.first_chunk::<16>() else {
                return (_mm256_setzero_si256(), _mm256_setzero_si256());
            };
            // SAFETY: `bytes` is 16 readable bytes; loadu has no alignment requirement.
            let v = _mm256_cvtepu16_epi32(unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) });
            // 16-bit word k holds codes 2k (low byte) and 2k + 1.
            (_mm256_and_si256(v, _mm256_set1_epi32(0xff)), _mm256_srli_epi32::<8>(v))
        }
    }
}

/// [`emit16`] for bf16 from the even and odd values' codes (`codes16_even_odd`), minimums and
/// scales: the two roundings interleave into one vector by a blend, without packing.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
fn emit16_bf16_even_odd<const NAN: bool>(
    even: __m256i,
    odd: __m256i,
    m_even: __m256,
    m_odd: __m256,
    s_even: __m256,
    s_odd: __m256,
    out: &mut [u8],
) {
    let mut x_even = _mm256_add_ps(m_even, _mm256_mul_ps(_mm256_cvtepi32_ps(even), s_even));
    let mut x_odd = _mm256_add_ps(m_odd, _mm256_mul_ps(_mm256_cvtepi32_ps(odd), s_odd));
    if NAN {
        let nan = _mm256_set1_ps(f32::NAN);
        x_even = _mm256_blendv_ps(x_even, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x_even, x_even));
        x_odd = _mm256_blendv_ps(x_odd, nan, _mm256_cmp_ps::<_CMP_UNORD_Q>(x_odd, x_odd));
    }
    // `round_bf16_finite` without its last shift: the bf16 is in the high 16 bits.
    let round = |x: __m256| {
        let bits = _mm256_castps_si256(x);
        let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
        _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb)
    };
    // 32-bit lane k: value 2k's bf16 in its low half, value 2k + 1's in its high half.
    let both = _mm256_blend_epi16::<0b1010_1010>(_mm256_srli_epi32::<16>(round(x_even)), round(x_odd));
    if let Ok(out) = <&mut [u8; 32]>::try_from(out) {
        // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
        unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), both) }
    }
}

/// Puts the values of every whole block of 16 in the order the bf16 decoder reads them: the 8
/// even ones, then the 8 odd ones (the rest stays as it is).
pub(super) fn even_odd_order(values: &mut [f32]) {
    for block in values.as_chunks_mut::<16>().0 {
        let copy = *block;
        for (k, pair) in copy.chunks_exact(2).enumerate() {
            block[k] = pair[0];
            block[8 + k] = pair[1];
        }
    }
}

/// The vector part of a row's decoding: the first `blocks` blocks of 16 values. With `group`
/// zero, value `i` has its own minimum and scale (`mins[i]`, `scales[i]`, for bf16 in
/// [`even_odd_order`]); otherwise groups of `group` values (a multiple of 16) share `mins[g]`
/// and `scales[g]`.
#[target_feature(enable = "avx2,fma,f16c")]
fn dequant_blocks<const BITS: u32, const D: u8, const NAN: bool>(
    packed: &[u8],
    mins: &[f32],
    scales: &[f32],
    group: usize,
    blocks: usize,
    out: &mut [u8],
) {
    let size = if D == F32 { 4 } else { 2 };
    let codes = packed.chunks_exact(2 * BITS as usize);
    let outs = out.chunks_exact_mut(16 * size);
    if group == 0 {
        // bf16: `mins` and `scales` are in `even_odd_order`.
        let params = mins.as_chunks::<16>().0.iter().zip(scales.as_chunks::<16>().0);
        for ((packed, out), (mins, scales)) in codes.zip(outs).zip(params).take(blocks) {
            let (m, s) = (mins.as_chunks::<8>().0, scales.as_chunks::<8>().0);
            let (Some([m0, m1]), Some([s0, s1])) = (m.first_chunk::<2>(), s.first_chunk::<2>()) else { return };
            if D == BF16 {
                let (even, odd) = codes16_even_odd::<BITS>(packed);
                emit16_bf16_even_odd::<NAN>(even, odd, load8(m0), load8(m1), load8(s0), load8(s1), out);
            } else {
                let (a, b) = codes16::<BITS>(packed);
                emit16::<D, NAN>(a, b, load8(m0), load8(m1), load8(s0), load8(s1), out);
            }
        }
    } else {
        let per_group = (group / 16).max(1);
        let params = mins.iter().zip(scales).flat_map(|p| std::iter::repeat_n(p, per_group));
        for ((packed, out), (&min, &scale)) in codes.zip(outs).zip(params).take(blocks) {
            let (m, s) = (_mm256_set1_ps(min), _mm256_set1_ps(scale));
            if D == BF16 {
                let (even, odd) = codes16_even_odd::<BITS>(packed);
                emit16_bf16_even_odd::<NAN>(even, odd, m, m, s, s, out);
            } else {
                let (a, b) = codes16::<BITS>(packed);
                emit16::<D, NAN>(a, b, m, m, s, s, out);
            }
        }
    }
}

/// Decodes a row: value `i` is `mins[i] + code_i * scales[i]` (with `group` zero; for bf16,
/// `mins` and `scales` in [`even_odd_order`]) or
/// `mins[i / group] + code_i * scales[i / group]` (`group` a multiple of 16), code `i` at bit
/// `i * bits` of `packed`, into `out` as `dtype` (bf16, f16 or f32). `finite` says that every
/// minimum and scale is finite (so that no value is NaN).
#[target_feature(enable = "avx2,fma,f16c")]
#[allow(clippy::too_many_arguments)]
pub(super) fn dequant(
    bits: u32,
    packed: &[u8],
    mins: &[f32],
    scales: &[f32],
    group: usize,
    finite: bool,
    dtype: Dtype,
    out: &mut [u8],
) {
    let size = if dtype == Dtype::F32 { 4 } else { 2 };
    let params = if group == 0 { mins.len().min(scales.len()) } else { mins.len().min(scales.len()) * group };
    let n = params.min(out.len() / size).min(packed.len() * 8 / bits.max(1) as usize);
    let blocks = n / 16;
    macro_rules! run {
        ($bits:literal) => {
            match (dtype, finite) {
                (Dtype::Bf16, true) => dequant_blocks::<$bits, BF16, false>(packed, mins, scales, group, blocks, out),
                (Dtype::Bf16, false) => dequant_blocks::<$bits, BF16, true>(packed, mins, scales, group, blocks, out),
                (Dtype::F16, true) => dequant_blocks::<$bits, F16, false>(packed, mins, scales, group, blocks, out),
                (Dtype::F16, false) => dequant_blocks::<$bits, F16, true>(packed, mins, scales, group, blocks, out),
                (_, true) => dequant_blocks::<$bits, F32, false>(packed, mins, scales, group, blocks, out),
                (_, false) => dequant_blocks::<$bits, F32, true>(packed, mins, scales, group, blocks, out),
            }
        };
    }
    match bits {
        2 => run!(2),
        4 => run!(4),
        _ => run!(8),
    }
    // The tail, as the reference computes it.
    let bits = bits as usize;
    let mask = ((1u32 << bits) - 1) as u8;
    for i in blocks * 16..n {
        let code = (packed[i * bits / 8] >> (i * bits % 8)) & mask;
        let p = i.checked_div(group).unwrap_or(i);
        let x = dequantize(code, mins[p], scales[p]);
        let at = i * size;
        match dtype {
            Dtype::Bf16 => out[at..at + 2].copy_from_slice(&f32_to_bf16_finite(x).to_le_bytes()),
            Dtype::F16 => out[at..at + 2].copy_from_slice(&half::f16::from_f32(x).to_bits().to_le_bytes()),
            _ => out[at..at + 4].copy_from_slice(&x.to_le_bytes()),
        }
    }
}
