//! AVX2 and F16C conversions between bf16, f16, f32 and `f32`, equal bit for bit to the scalar
//! ones in `elem.rs` (tested there against them on every value and on random ones).
//!
//! Every function here has `#[target_feature(enable = "avx2,fma,f16c")]`: callers outside this
//! module must hold a [`crate::simd::Level`] of kind `Avx2` (which exists only after detection).

use std::arch::x86_64::*;

/// Converts 8 bf16 values (16 bytes) to `f32`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn bf16x8(bytes: &[u8; 16]) -> __m256 {
    // SAFETY: `bytes` is 16 readable bytes; loadu has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    _mm256_castsi256_ps(_mm256_slli_epi32::<16>(_mm256_cvtepu16_epi32(h)))
}

/// Converts 8 f16 values (16 bytes) to `f32` (exact).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f16x8(bytes: &[u8; 16]) -> __m256 {
    // SAFETY: `bytes` is 16 readable bytes; loadu has no alignment requirement.
    let h = unsafe { _mm_loadu_si128(bytes.as_ptr().cast()) };
    _mm256_cvtph_ps(h)
}

/// Loads 8 `f32` (32 little-endian bytes).
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn f32x8(bytes: &[u8; 32]) -> __m256 {
    // SAFETY: `bytes` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_ps(bytes.as_ptr().cast()) }
}

/// Rounds 8 `f32` that are not NaN to bf16 (nearest, ties to even), in the low 16 bits of each
/// 32-bit lane: `elem::f32_to_bf16_finite`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn round_bf16_finite(x: __m256) -> __m256i {
    let bits = _mm256_castps_si256(x);
    let lsb = _mm256_and_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(1));
    let rounded = _mm256_add_epi32(_mm256_add_epi32(bits, _mm256_set1_epi32(0x7fff)), lsb);
    _mm256_srli_epi32::<16>(rounded)
}

/// Rounds 8 `f32` to bf16 as `half::bf16::from_f32` does: nearest, ties to even, and a NaN keeps
/// its high bits with the quiet bit set.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn round_bf16(x: __m256) -> __m256i {
    let bits = _mm256_castps_si256(x);
    let magnitude = _mm256_and_si256(bits, _mm256_set1_epi32(0x7fff_ffff));
    let nan = _mm256_cmpgt_epi32(magnitude, _mm256_set1_epi32(0x7f80_0000));
    let quiet = _mm256_or_si256(_mm256_srli_epi32::<16>(bits), _mm256_set1_epi32(0x40));
    _mm256_blendv_epi8(round_bf16_finite(x), quiet, nan)
}

/// Packs the low 16 bits of the 32-bit lanes of `a` then `b` into 16 little-endian u16 values,
/// stored in `out`. Every lane must be below 2^16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn store_u16x16(a: __m256i, b: __m256i, out: &mut [u8; 32]) {
    // packus works within 128-bit lanes: [a0-3 b0-3 | a4-7 b4-7]; the permute puts a before b.
    let packed = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_packus_epi32(a, b));
    // SAFETY: `out` is 32 writable bytes; storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(out.as_mut_ptr().cast(), packed) }
}

/// Decodes `out.len()` values of `dtype` (bf16, f16 or f32) from `bytes`, which holds exactly
/// that many.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn load(dtype: kvhoard_format::Dtype, bytes: &[u8], out: &mut [f32]) {
    use kvhoard_format::Dtype;
    let done = match dtype {
        Dtype::Bf16 | Dtype::F16 => {
            let pairs = bytes.chunks_exact(16).zip(out.chunks_exact_mut(8));
            for (v, o) in pairs {
                let (Ok(v), Ok(o)) = (<&[u8; 16]>::try_from(v), <&mut [f32; 8]>::try_from(o)) else { break };
                let x = if dtype == Dtype::Bf16 { bf16x8(v) } else { f16x8(v) };
                // SAFETY: `o` is 8 writable f32; storeu has no alignment requirement.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), x) }
            }
            (bytes.len() / 16).min(out.len() / 8) * 8
        }
        _ => {
            let pairs = bytes.chunks_exact(32).zip(out.chunks_exact_mut(8));
            for (v, o) in pairs {
                let (Ok(v), Ok(o)) = (<&[u8; 32]>::try_from(v), <&mut [f32; 8]>::try_from(o)) else { break };
                // SAFETY: `o` is 8 writable f32; storeu has no alignment requirement.
                unsafe { _mm256_storeu_ps(o.as_mut_ptr(), f32x8(v)) }
            }
            (bytes.len() / 32).min(out.len() / 8) * 8
        }
    };
    let size = if matches!(dtype, Dtype::Bf16 | Dtype::F16) { 2 } else { 4 };
    if let (Some(bytes), Some(out)) = (bytes.get(done * size..), out.get_mut(done..)) {
        super::load_scalar(dtype, bytes, out);
    }
}

/// Encodes `values` as `dtype` (bf16, f16 or f32) into `bytes`, which holds exactly that many.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) fn store(dtype: kvhoard_format::Dtype, values: &[f32], bytes: &mut [u8]) {
    use kvhoard_format::Dtype;
    let size = match dtype {
        Dtype::Bf16 | Dtype::F16 => 2,
        _ => 4,
    };
    let mut ins = values.chunks_exact(16);
    let mut outs = bytes.chunks_exact_mut(16 * size);
    for (v, o) in (&mut ins).zip(&mut outs) {
        // SAFETY: `v` is 16 readable f32 (chunks_exact); loadu has no alignment requirement.
        let (a, b) = unsafe { (_mm256_loadu_ps(v.as_ptr()), _mm256_loadu_ps(v.as_ptr().add(8))) };
        match dtype {
            Dtype::Bf16 => {
                if let Ok(o) = <&mut [u8; 32]>::try_from(o) {
                    store_u16x16(round_bf16(a), round_bf16(b), o);
                }
            }
            Dtype::F16 => {
                let (ha, hb) =
                    (_mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(a), _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(b));
                if let Ok(o) = <&mut [u8; 32]>::try_from(o) {
                    // SAFETY: `o` is 32 writable bytes; storeu has no alignment requirement.
                    unsafe { _mm256_storeu_si256(o.as_mut_ptr().cast(), _mm256_set_m128i(hb, ha)) }
                }
            }
            _ => {
                if o.len() == 64 {
                    // SAFETY: `o` is 64 writable bytes; storeu has no alignment requirement.
                    unsafe {
                        _mm256_storeu_ps(o.as_mut_ptr().cast(), a);
                        _mm256_storeu_ps(o.as_mut_ptr().add(32).cast(), b);
                    }
                }
            }
        }
    }
    super::store_scalar(dtype, ins.remainder(), outs.into_remainder());
}
