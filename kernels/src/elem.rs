//! Elements of KV tensors and their conversion to and from `f32`.
//!
//! Every codec computes in `f32` and converts at the edges, one row at a time, so that a codec is
//! written once for all dtypes. The conversions are exact where the format allows (every bf16, f16
//! and fp8 value is an `f32`) and round to nearest, ties to even, on the way back.

use kvhoard_format::Dtype;

#[cfg(target_arch = "x86_64")]
use crate::simd::Kind;
use crate::simd::Level;

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2;

/// Element arithmetic on a block's dtype (the one [`Dtype`] of `kvhoard-format`): its size, and
/// decoding to and encoding from `f32`. Integer dtypes convert by value (`u8` 200 is 200.0,
/// encoded back rounded and clamped to 0..=255); `f64` rounds to the nearest `f32`.
pub trait Elements: Copy {
    /// Bytes per element.
    fn size(self) -> usize;
    /// Decodes element `index` of `bytes`.
    fn get(self, bytes: &[u8], index: usize) -> f32;
    /// Decodes `out.len()` consecutive elements from the start of `bytes`.
    fn load(self, bytes: &[u8], out: &mut [f32]);
    /// Encodes `values` into the start of `bytes`, rounding to nearest, ties to even.
    fn store(self, values: &[f32], bytes: &mut [u8]);
}

/// The dtypes codecs are tested on (every float dtype a KV cache is stored in).
pub const FLOAT_DTYPES: [Dtype; 5] = [Dtype::Bf16, Dtype::F16, Dtype::F32, Dtype::F8E4M3, Dtype::F8E5M2];

impl Elements for Dtype {
    fn size(self) -> usize {
        self.size_bytes() as usize
    }

    /// Decodes one element.
    #[inline]
    fn get(self, bytes: &[u8], index: usize) -> f32 {
        match self {
            Dtype::Bf16 => bf16_to_f32(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]])),
            Dtype::F16 => half::f16::from_bits(u16::from_le_bytes([bytes[2 * index], bytes[2 * index + 1]])).to_f32(),
            Dtype::F32 => {
                f32::from_le_bytes([bytes[4 * index], bytes[4 * index + 1], bytes[4 * index + 2], bytes[4 * index + 3]])
            }
            Dtype::F8E4M3 => E4M3_TABLE[bytes[index] as usize],
            Dtype::F8E5M2 => E5M2_TABLE[bytes[index] as usize],
            Dtype::Bytes | Dtype::U8 => f32::from(bytes[index]),
            Dtype::F64 => f64::from_le_bytes(bytes[8 * index..8 * index + 8].try_into().unwrap_or([0; 8])) as f32,
        }
    }

    /// Decodes `out.len()` consecutive elements from the start of `bytes`, with the widest
    /// instruction set this CPU has (every one gives the same values).
    fn load(self, bytes: &[u8], out: &mut [f32]) {
        load_at(Level::best(), self, bytes, out);
    }

    /// Encodes `values` into the start of `bytes`, rounding to nearest, ties to even.
    fn store(self, values: &[f32], bytes: &mut [u8]) {
        store_at(Level::best(), self, values, bytes);
    }
}

/// [`Elements::load`] on instruction set `level`.
pub(crate) fn load_at(level: Level, dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    // Too short an input panics here, as it always has.
    let bytes = &bytes[..out.len() * dtype.size()];
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 && matches!(dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32) {
        // SAFETY: a level of kind Avx2 exists only where AVX2, FMA and F16C were detected
        // (simd.rs), the target features `avx2::load` is compiled for.
        unsafe { avx2::load(dtype, bytes, out) };
        return;
    }
    let _ = level;
    load_scalar(dtype, bytes, out);
}

/// [`Elements::store`] on instruction set `level`.
pub(crate) fn store_at(level: Level, dtype: Dtype, values: &[f32], bytes: &mut [u8]) {
    let bytes = &mut bytes[..values.len() * dtype.size()];
    #[cfg(target_arch = "x86_64")]
    if level.kind() == Kind::Avx2 && matches!(dtype, Dtype::Bf16 | Dtype::F16 | Dtype::F32) {
        // SAFETY: a level of kind Avx2 exists only where AVX2, FMA and F16C were detected
        // (simd.rs), the target features `avx2::store` is compiled for.
        unsafe { avx2::store(dtype, values, bytes) };
        return;
    }
    let _ = level;
    store_scalar(dtype, values, bytes);
}

/// The scalar reference of [`Elements::load`].
pub(crate) fn load_scalar(dtype: Dtype, bytes: &[u8], out: &mut [f32]) {
    let n = out.len();
    match dtype {
        Dtype::Bf16 => {
            for (o, b) in out.iter_mut().zip(bytes[..2 * n].chunks_exact(2)) {
                *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
            }
        }
        Dtype::F16 => {
            for (o, b) in out.iter_mut().zip(bytes[..2 * n].chunks_exact(2)) {
                *o = half::f16::from_bits(u16::from_le_bytes([b[0], b[1]])).to_f32();
            }
        }
        Dtype::F32 => {
            for (o, b) in out.iter_mut().zip(bytes[..4 * n].chunks_exact(4)) {
                *o = f32::from_le_bytes([b[0], b[1], b[2], b[3]]);
            }
        }
        Dtype::F8E4M3 => {
            for (o, &b) in out.iter_mut().zip(&bytes[..n]) {
                *o = E4M3_TABLE[b as usize];
            }
        }
        Dtype::F8E5M2 => {
            for (o, &b) in out.iter_mut().zip(&bytes[..n]) {
                *o = E5M2_TABLE[b as usize];
            }
        }
        Dtype::Bytes | Dtype::U8 => {
            for (o, &b) in out.iter_mut().zip(&bytes[..n]) {
                *o = f32::from(b);
            }
        }
        Dtype::F64 => {
            for (o, b) in out.iter_mut().zip(bytes[..8 * n].chunks_exact(8)) {
                *o = f64::from_le_bytes(b.try_into().unwrap_or([0; 8])) as f32;
            }
        }
    }
}

/// The scalar reference of [`Elements::store`].
pub(crate) fn store_scalar(dtype: Dtype, values: &[f32], bytes: &mut [u8]) {
    let n = values.len();
    match dtype {
        Dtype::Bf16 => {
            for (v, b) in values.iter().zip(bytes[..2 * n].chunks_exact_mut(2)) {
                b.copy_from_slice(&half::bf16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        Dtype::F16 => {
            for (v, b) in values.iter().zip(bytes[..2 * n].chunks_exact_mut(2)) {
                b.copy_from_slice(&half::f16::from_f32(*v).to_bits().to_le_bytes());
            }
        }
        Dtype::F32 => {
            for (v, b) in values.iter().zip(bytes[..4 * n].chunks_exact_mut(4)) {
                b.copy_from_slice(&v.to_le_bytes());
            }
        }
        Dtype::F8E4M3 => {
            for (v, b) in values.iter().zip(&mut bytes[..n]) {
                *b = f32_to_fp8(*v, &E4M3);
            }
        }
        Dtype::F8E5M2 => {
            for (v, b) in values.iter().zip(&mut bytes[..n]) {
                *b = f32_to_fp8(*v, &E5M2);
            }
        }
        Dtype::Bytes | Dtype::U8 => {
            for (v, b) in values.iter().zip(&mut bytes[..n]) {
                // `as` saturates and maps NaN to 0.
                *b = v.round_ties_even() as u8;
            }
        }
        Dtype::F64 => {
            for (v, b) in values.iter().zip(bytes[..8 * n].chunks_exact_mut(8)) {
                b.copy_from_slice(&f64::from(*v).to_le_bytes());
            }
        }
    }
}

#[inline]
pub(crate) fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// Rounds a finite `f32` to bf16, nearest, ties to even. Branch-free so that decode loops
/// vectorize; callers guarantee the input is not NaN (a NaN may come out as another NaN or as an
/// infinity, which decode loops never produce because their inputs are finite).
#[inline]
pub(crate) fn f32_to_bf16_finite(value: f32) -> u16 {
    let bits = value.to_bits();
    (bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16) as u16
}

/// The shape of an 8-bit float format.
struct Fp8 {
    mantissa_bits: u32,
    bias: i32,
    /// Largest finite code (positive).
    max_finite: u8,
    /// The code for NaN (positive).
    nan: u8,
    /// The code for +infinity, if the format has one.
    infinity: Option<u8>,
}

const E4M3: Fp8 = Fp8 { mantissa_bits: 3, bias: 7, max_finite: 0x7e, nan: 0x7f, infinity: None };

const E5M2: Fp8 = Fp8 { mantissa_bits: 2, bias: 15, max_finite: 0x7b, nan: 0x7e, infinity: Some(0x7c) };

static E4M3_TABLE: [f32; 256] = fp8_table(&E4M3);
static E5M2_TABLE: [f32; 256] = fp8_table(&E5M2);

const fn fp8_decode(code: u8, format: &Fp8) -> f32 {
    let m = format.mantissa_bits;
    let sign = ((code >> 7) as u32) << 31;
    let magnitude = code & 0x7f;
    if magnitude == format.nan {
        return f32::from_bits(sign | 0x7fc0_0000);
    }
    if let Some(inf) = format.infinity {
        if magnitude > inf {
            return f32::from_bits(sign | 0x7fc0_0000);
        }
        if magnitude == inf {
            return f32::from_bits(sign | 0x7f80_0000);
        }
    }
    let exponent = (magnitude >> m) as i32;
    let mut mantissa = (magnitude & ((1 << m) - 1)) as u32;
    if exponent == 0 {
        if mantissa == 0 {
            return f32::from_bits(sign);
        }
        // Subnormal: value = mantissa * 2^(1 - bias - m); normalise it for f32.
        let mut e = 1 - format.bias;
        while mantissa & (1 << m) == 0 {
            mantissa <<= 1;
            e -= 1;
        }
        mantissa &= (1 << m) - 1;
        return f32::from_bits(sign | (((e + 127) as u32) << 23) | (mantissa << (23 - m)));
    }
    let e = exponent - format.bias + 127;
    f32::from_bits(sign | ((e as u32) << 23) | (mantissa << (23 - m)))
}

const fn fp8_table(format: &Fp8) -> [f32; 256] {
    let mut table = [0.0f32; 256];
    let mut code = 0;
    while code < 256 {
        table[code] = fp8_decode(code as u8, format);
        code += 1;
    }
    table
}

/// Rounds to nearest, ties to even. Finite values beyond the largest finite value saturate to it
/// (as `satfinite` conversions on GPUs do); infinities become infinities where the format has
/// them, otherwise the largest finite value; NaN stays NaN.
fn f32_to_fp8(value: f32, format: &Fp8) -> u8 {
    let sign = if value.is_sign_negative() { 0x80 } else { 0 };
    if value.is_nan() {
        return sign | format.nan;
    }
    let magnitude = value.abs();
    if magnitude.is_infinite() {
        return sign | format.infinity.unwrap_or(format.max_finite);
    }
    let m = format.mantissa_bits;
    let min_normal = f32::from_bits(((1 - format.bias + 127) as u32) << 23);
    let code = if magnitude < min_normal {
        // Subnormal codes are multiples of 2^(1 - bias - m); a result of 2^m is the smallest
        // normal, whose code is exactly 2^m, so no special case is needed.
        let scale = f32::from_bits(((format.bias - 1 + m as i32 + 127) as u32) << 23);
        (magnitude * scale).round_ties_even() as u32
    } else {
        let bits = magnitude.to_bits();
        let shift = 23 - m;
        let rounded = (bits + ((1 << (shift - 1)) - 1) + ((bits >> shift) & 1)) >> shift;
        rounded - (((127 - format.bias) as u32) << m)
    };
    sign | code.min(format.max_finite as u32) as u8
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;
    use crate::simd::testing;

    /// f32 values that exercise every conversion: every bf16 and f16 value widened, ties and
    /// near-ties of both, subnormals, overflow, NaNs with payloads and random bit patterns.
    fn hard_f32s() -> Vec<f32> {
        let mut values: Vec<f32> = Vec::new();
        for bits in 0..=u16::MAX {
            let wide = (bits as u32) << 16;
            values.extend([wide, wide | 0x8000, wide | 0x7fff, wide | 0x8001, wide | 0x1].map(f32::from_bits));
            let h = half::f16::from_bits(bits).to_f32_const().to_bits();
            values.extend([h, h + 0x1000, h.wrapping_sub(0x1000), h + 0xfff, h + 0x1001].map(f32::from_bits));
        }
        let mut rng = Rng::new(0x5eed_0201);
        values.extend((0..100_000).map(|_| f32::from_bits(rng.next_u64() as u32)));
        values.extend([65504.0, 65519.99, 65520.0, 1e10, -1e10, 6e-8, 3e-8, 2.9e-8, f32::MIN_POSITIVE, -0.0]);
        values
    }

    #[test]
    fn every_level_loads_and_stores_like_the_scalar_reference() {
        let levels = testing::levels("element load and store (bf16, f16, f32, fp8) against the scalar reference");
        let values = hard_f32s();
        for dtype in FLOAT_DTYPES.into_iter().chain([Dtype::F64, Dtype::U8]) {
            // Odd lengths leave a tail for the scalar code.
            for len in [values.len(), 1, 15, 17, 33] {
                let values = &values[..len];
                let mut reference = vec![0u8; len * dtype.size()];
                store_scalar(dtype, values, &mut reference);
                let mut reference_back = vec![0f32; len];
                load_scalar(dtype, &reference, &mut reference_back);
                let reference_back: Vec<u32> = reference_back.iter().map(|x| x.to_bits()).collect();
                for &level in &levels {
                    let mut bytes = vec![0u8; len * dtype.size()];
                    store_at(level, dtype, values, &mut bytes);
                    assert!(bytes == reference, "{dtype} store differs on {}", level.name());
                    let mut back = vec![0f32; len];
                    load_at(level, dtype, &bytes, &mut back);
                    assert!(
                        back.iter().map(|x| x.to_bits()).eq(reference_back.iter().copied()),
                        "{dtype} load differs on {}",
                        level.name()
                    );
                }
            }
        }
    }

    #[test]
    fn f16_conversions_match_half_in_software() {
        // The scalar reference uses `half`, which uses F16C where the CPU has it; both must be
        // the software conversion.
        let values = hard_f32s();
        for &level in &testing::levels("f16 conversions against half's software conversion") {
            let mut bytes = vec![0u8; values.len() * 2];
            store_at(level, Dtype::F16, &values, &mut bytes);
            for (x, b) in values.iter().zip(bytes.chunks_exact(2)) {
                let want = half::f16::from_f32_const(*x).to_bits();
                let got = u16::from_le_bytes([b[0], b[1]]);
                assert!(got == want, "{x:e} ({:#x}) on {}: {got:#x}, not {want:#x}", x.to_bits(), level.name());
            }
            let every: Vec<u8> = (0..=u16::MAX).flat_map(u16::to_le_bytes).collect();
            let mut wide = vec![0f32; 1 << 16];
            load_at(level, Dtype::F16, &every, &mut wide);
            for (bits, x) in (0..=u16::MAX).zip(&wide) {
                let want = half::f16::from_bits(bits).to_f32_const();
                assert!(x.to_bits() == want.to_bits(), "{bits:#x} on {}", level.name());
            }
        }
    }

    #[test]
    fn fp8_tables_match_known_values() {
        assert_eq!(E4M3_TABLE[0x7e], 448.0);
        assert_eq!(E4M3_TABLE[0x01], 2f32.powi(-9));
        assert_eq!(E4M3_TABLE[0x08], 2f32.powi(-6));
        assert_eq!(E4M3_TABLE[0x38], 1.0);
        assert!(E4M3_TABLE[0x7f].is_nan());
        assert!(E4M3_TABLE[0xff].is_nan());
        assert_eq!(E4M3_TABLE[0xb8], -1.0);
        assert_eq!(E5M2_TABLE[0x7b], 57344.0);
        assert_eq!(E5M2_TABLE[0x01], 2f32.powi(-16));
        assert_eq!(E5M2_TABLE[0x3c], 1.0);
        assert_eq!(E5M2_TABLE[0x7c], f32::INFINITY);
        assert!(E5M2_TABLE[0x7d].is_nan());
    }

    #[test]
    fn fp8_round_trips_every_code() {
        for (format, table) in [(&E4M3, &E4M3_TABLE), (&E5M2, &E5M2_TABLE)] {
            for code in 0..=255u8 {
                let value = table[code as usize];
                let back = f32_to_fp8(value, format);
                if value.is_nan() {
                    assert!(table[back as usize].is_nan());
                } else {
                    assert_eq!(back, code, "code {code:#x} value {value}");
                }
            }
        }
    }

    #[test]
    fn fp8_rounds_to_nearest_even_and_saturates() {
        // Halfway between 1.0 (0x38) and 1.125 (0x39): ties to the even code 0x38.
        assert_eq!(f32_to_fp8(1.0625, &E4M3), 0x38);
        // Halfway between 1.125 and 1.25: ties to 0x3a.
        assert_eq!(f32_to_fp8(1.1875, &E4M3), 0x3a);
        assert_eq!(f32_to_fp8(1e6, &E4M3), 0x7e);
        assert_eq!(f32_to_fp8(-1e6, &E4M3), 0xfe);
        assert_eq!(f32_to_fp8(f32::INFINITY, &E4M3), 0x7e);
        assert_eq!(f32_to_fp8(f32::INFINITY, &E5M2), 0x7c);
        assert_eq!(f32_to_fp8(1e-12, &E4M3), 0);
        // Half of the smallest subnormal ties to zero; a bit more rounds up.
        assert_eq!(f32_to_fp8(2f32.powi(-10), &E4M3), 0);
        assert_eq!(f32_to_fp8(2f32.powi(-10) * 1.01, &E4M3), 1);
        // The largest subnormal rounds up into the smallest normal.
        assert_eq!(f32_to_fp8(2f32.powi(-6) * 0.99, &E4M3), 0x08);
    }

    #[test]
    fn bf16_finite_rounding_matches_half() {
        let mut x = 1.0e-30f32;
        while x < 1.0e30 {
            for v in [x, -x, x * (1.0 + 2f32.powi(-8)), x * (1.0 + 2f32.powi(-9))] {
                assert_eq!(f32_to_bf16_finite(v), half::bf16::from_f32(v).to_bits(), "{v}");
            }
            x *= 1.37;
        }
    }

    #[test]
    fn load_and_store_agree_for_every_dtype() {
        let values: Vec<f32> = (0..64).map(|i| (i as f32 - 31.5) * 0.37).collect();
        for dtype in FLOAT_DTYPES.into_iter().chain([Dtype::F64]) {
            let mut bytes = vec![0u8; values.len() * dtype.size()];
            dtype.store(&values, &mut bytes);
            let mut back = vec![0f32; values.len()];
            dtype.load(&bytes, &mut back);
            for (i, (&a, &b)) in values.iter().zip(&back).enumerate() {
                assert_eq!(b, dtype.get(&bytes, i));
                let tolerance = match dtype {
                    Dtype::F32 | Dtype::F64 | Dtype::U8 | Dtype::Bytes => 0.0,
                    Dtype::F16 => 0.002 * a.abs(),
                    Dtype::Bf16 => 0.008 * a.abs(),
                    Dtype::F8E4M3 => 0.07 * a.abs() + 0.002,
                    Dtype::F8E5M2 => 0.13 * a.abs() + 0.0001,
                };
                assert!((a - b).abs() <= tolerance, "{dtype}: {a} became {b}");
            }
        }
    }

    #[test]
    fn integer_dtypes_convert_by_value_and_saturate() {
        let mut bytes = [0u8; 5];
        Dtype::U8.store(&[0.4, 2.5, 3.5, 300.0, f32::NAN], &mut bytes);
        assert_eq!(bytes, [0, 2, 4, 255, 0]);
        let mut back = [0f32; 5];
        Dtype::U8.load(&bytes, &mut back);
        assert_eq!(back, [0.0, 2.0, 4.0, 255.0, 0.0]);
        assert_eq!(Dtype::Bytes.get(&bytes, 3), 255.0);
    }
}
