//! AVX2 byte-plane split and merge for 2- and 4-byte values, equal to the scalar ones in
//! `lossless.rs` (the vectors move bytes only). Every function has
//! `#[target_feature(enable = "avx2,fma,f16c")]`: callers must hold a [`crate::simd::Level`] of
//! kind `Avx2`, which exists only where those were detected.

use std::arch::x86_64::*;

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn load32(bytes: &[u8; 32]) -> __m256i {
    // SAFETY: `bytes` is 32 readable bytes; loadu has no alignment requirement.
    unsafe { _mm256_loadu_si256(bytes.as_ptr().cast()) }
}

#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn store32(bytes: &mut [u8; 32], v: __m256i) {
    // SAFETY: `bytes` is 32 writable bytes; storeu has no alignment requirement.
    unsafe { _mm256_storeu_si256(bytes.as_mut_ptr().cast(), v) }
}

/// Splits 2-byte values: `high` gets every value's second byte, `low` its first. Returns how many
/// values it did (a multiple of 32); the caller does the rest.
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn split2(data: &[u8], high: &mut [u8], low: &mut [u8]) -> usize {
    // Within each 128-bit lane: the 8 first bytes, then the 8 second bytes.
    let gather = _mm256_setr_epi8(
        0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15,
    );
    let (data, _) = data.as_chunks::<64>();
    let (high, _) = high.as_chunks_mut::<32>();
    let (low, _) = low.as_chunks_mut::<32>();
    let mut done = 0;
    for ((values, h), l) in data.iter().zip(high.iter_mut()).zip(low.iter_mut()) {
        let (a, b) = values.split_at(32);
        let (Ok(a), Ok(b)) = (<&[u8; 32]>::try_from(a), <&[u8; 32]>::try_from(b)) else { break };
        // Quadwords: low(a0-7) high(a0-7) low(a8-15) high(a8-15) -> low(a0-15) high(a0-15).
        let a = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(load32(a), gather));
        let b = _mm256_permute4x64_epi64::<0b11_01_10_00>(_mm256_shuffle_epi8(load32(b), gather));
        store32(l, _mm256_permute2x128_si256::<0x20>(a, b));
        store32(h, _mm256_permute2x128_si256::<0x31>(a, b));
        done += 32;
    }
    done
}

/// Interleaves planes of 2-byte values back (the inverse of [`split2`]). Returns how many values
/// it did (a multiple of 32).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn merge2(high: &[u8], low: &[u8], out: &mut [u8]) -> usize {
    let (high, _) = high.as_chunks::<32>();
    let (low, _) = low.as_chunks::<32>();
    let (out, _) = out.as_chunks_mut::<64>();
    let mut done = 0;
    for ((h, l), values) in high.iter().zip(low).zip(out.iter_mut()) {
        let (h, l) = (load32(h), load32(l));
        // Per 128-bit lane: values 0-7 (unpacklo) and 8-15 (unpackhi) of that lane's 16.
        let first = _mm256_unpacklo_epi8(l, h);
        let second = _mm256_unpackhi_epi8(l, h);
        let (a, b) = values.split_at_mut(32);
        let (Ok(a), Ok(b)) = (<&mut [u8; 32]>::try_from(a), <&mut [u8; 32]>::try_from(b)) else { break };
        store32(a, _mm256_permute2x128_si256::<0x20>(first, second));
        store32(b, _mm256_permute2x128_si256::<0x31>(first, second));
        done += 32;
    }
    done
}

/// Splits 4-byte values into 4 planes of `n` bytes each in `planes` (plane 0 the most
/// significant byte). Returns how many values it did (a multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn split4(data: &[u8], n: usize, planes: &mut [u8]) -> usize {
    // Within each 128-bit lane: byte 0 of its 4 values, then byte 1, 2, 3.
    let gather = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
    );
    // Dwords (byte k of values 0-3, of values 4-7) -> quadword k: byte k of values 0-7.
    let order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    let (data, _) = data[..4 * n].as_chunks::<32>();
    let (p0, rest) = planes[..4 * n].split_at_mut(n);
    let (p1, rest) = rest.split_at_mut(n);
    let (p2, p3) = rest.split_at_mut(n);
    let planes = [p3, p2, p1, p0].map(|p| p.as_chunks_mut::<8>().0);
    let [b0, b1, b2, b3] = planes;
    let mut done = 0;
    for ((values, (o0, o1)), (o2, o3)) in
        data.iter().zip(b0.iter_mut().zip(b1.iter_mut())).zip(b2.iter_mut().zip(b3.iter_mut()))
    {
        let v = _mm256_permutevar8x32_epi32(_mm256_shuffle_epi8(load32(values), gather), order);
        let mut bytes = [0u8; 32];
        store32(&mut bytes, v);
        for (k, o) in [o0, o1, o2, o3].into_iter().enumerate() {
            o.copy_from_slice(&bytes[8 * k..8 * k + 8]);
        }
        done += 8;
    }
    done
}

/// Interleaves 4 planes of `n` bytes back into 4-byte values (the inverse of [`split4`]).
/// Returns how many values it did (a multiple of 8).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) fn merge4(planes: &[u8], n: usize, out: &mut [u8]) -> usize {
    let scatter = _mm256_setr_epi8(
        0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15, 0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15,
    );
    // Quadword k (byte k of values 0-7) -> dwords: byte k of values 0-3 in the low lane, of
    // values 4-7 in the high lane.
    let order = _mm256_setr_epi32(0, 2, 4, 6, 1, 3, 5, 7);
    let (p0, rest) = planes[..4 * n].split_at(n);
    let (p1, rest) = rest.split_at(n);
    let (p2, p3) = rest.split_at(n);
    let [b0, b1, b2, b3] = [p3, p2, p1, p0].map(|p| p.as_chunks::<8>().0);
    let (out, _) = out[..4 * n].as_chunks_mut::<32>();
    let mut done = 0;
    for ((values, (i0, i1)), (i2, i3)) in out.iter_mut().zip(b0.iter().zip(b1)).zip(b2.iter().zip(b3)) {
        let mut bytes = [0u8; 32];
        for (k, i) in [i0, i1, i2, i3].into_iter().enumerate() {
            bytes[8 * k..8 * k + 8].copy_from_slice(i);
        }
        // The shuffle is its own inverse within a lane (a 4x4 transpose).
        let v = _mm256_shuffle_epi8(_mm256_permutevar8x32_epi32(load32(&bytes), order), scatter);
        store32(values, v);
        done += 8;
    }
    done
}
