//! KIVI-style asymmetric min/max quantization.
//!
//! Keys have a few outlier channels whose magnitude is stable across tokens, so they are
//! quantized per channel over groups of `group` tokens; values have no such channels and are
//! quantized per token over groups of `group` channels (KIVI, Liu et al. 2024). The last
//! `residual` tokens stay in full precision, as KIVI keeps its most recent window.
//!
//! Payload, for a dense block of `L` layers, `T` (logical) tokens, `C` channels, `Tq = T - R`:
//!
//! ```text
//! key params    L x ceil(Tq / G) groups: C minimums, then C scales (bf16 each)
//! value params  L x Tq rows: ceil(C / G) minimums, then as many scales (bf16 each)
//! codes         rows (K then V, layer, token) of C codes, one bit stream, LSB first
//! residual      rows (K then V, layer, token) of the last R tokens, in the block's dtype
//! ```
//!
//! Minimums are rounded down and scales up when they are stored, and codes are computed from the
//! stored values, so the range always covers the group. Defined behaviour for what is not a
//! number: NaN becomes the group's minimum, infinities its ends, and a group with no finite value
//! decodes to zeros. A constant group has scale zero and decodes exactly. A group's range counts
//! -0.0 as +0.0, so that it does not depend on the order its values are seen in; damaged
//! parameters that make a value NaN decode it as `f32::NAN`.
//!
//! Every kernel runs on the instruction set a [`Level`] names (`quant/kernels.rs` dispatches; the
//! scalar code there is the reference, `quant/avx2.rs` the AVX2 version), and every level writes
//! the same bytes (docs/decisions/0006-simd-dispatch.md).

use super::Dense;
use crate::elem::{bf16_to_f32, f32_to_bf16_finite, load_at, store_scalar, Elements as _};
use crate::simd::Level;
use crate::{Dtype, Error};

#[cfg(target_arch = "x86_64")]
mod avx2;
mod kernels;
mod scalar;

#[derive(Clone, Copy, Debug)]
pub(crate) struct Params {
    pub bits: u32,
    pub group: usize,
    pub residual: usize,
}

/// Where each part of the payload lies for a block.
struct Plan {
    layers: usize,
    channels: usize,
    quantized: usize,
    residual: usize,
    key_groups: usize,
    value_groups: usize,
    key_params: usize,
    value_params: usize,
    codes: usize,
    residual_bytes: usize,
}

impl Plan {
    fn new(dense: &Dense, p: Params) -> Plan {
        let (layers, channels) = (dense.layers, dense.channels);
        let residual = p.residual.min(dense.tokens);
        let quantized = dense.tokens - residual;
        let key_groups = quantized.div_ceil(p.group);
        let value_groups = channels.div_ceil(p.group);
        let key_params = 4 * channels * layers * key_groups;
        let value_params = 4 * value_groups * layers * quantized;
        let codes = (2 * layers * quantized * channels * p.bits as usize).div_ceil(8);
        let residual_bytes = 2 * layers * residual * channels * dense.dtype.size();
        Plan {
            layers,
            channels,
            quantized,
            residual,
            key_groups,
            value_groups,
            key_params,
            value_params,
            codes,
            residual_bytes,
        }
    }

    fn size(&self) -> usize {
        self.key_params + self.value_params + self.codes + self.residual_bytes
    }
}

pub(crate) fn payload_size(dense: &Dense, p: Params) -> usize {
    Plan::new(dense, p).size()
}

pub(crate) fn encode(
    dense: &Dense,
    data: &[u8],
    p: Params,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Result<usize, Error> {
    encode_at(Level::best(), dense, data, p, out, scratch)
}

/// [`encode`] on instruction set `level`; every level writes the same bytes.
pub(crate) fn encode_at(
    level: Level,
    dense: &Dense,
    data: &[u8],
    p: Params,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Result<usize, Error> {
    let plan = Plan::new(dense, p);
    let size = plan.size();
    if out.len() < size {
        return Err(Error::BufferTooSmall { need: size, have: out.len() });
    }
    let out = &mut out[..size];
    let (key_params, rest) = out.split_at_mut(plan.key_params);
    let (value_params, rest) = rest.split_at_mut(plan.value_params);
    let (codes, residual_out) = rest.split_at_mut(plan.codes);
    codes.fill(0);
    let c = plan.channels;
    let groups = plan.value_groups;
    let dtype = dense.dtype;
    let row_bytes = c * dtype.size();
    let levels = ((1u32 << p.bits) - 1) as f32;
    scratch.clear();
    scratch.resize(5 * c + 4 * groups, 0.0);
    let (row, rest) = scratch.split_at_mut(c);
    let (mins, rest) = rest.split_at_mut(c);
    let (maxs, rest) = rest.split_at_mut(c);
    let (lo, rest) = rest.split_at_mut(c);
    let (inv, rest) = rest.split_at_mut(c);
    let (group_mins, rest) = rest.split_at_mut(groups);
    let (group_maxs, rest) = rest.split_at_mut(groups);
    let (group_lo, group_inv) = rest.split_at_mut(groups);
    let mut row_codes = vec![0u8; c];
    let load_row = |kv: usize, layer: usize, t: usize, row: &mut [f32]| {
        let start = dense.row(kv, layer, t) * dtype.size();
        load_at(level, dtype, &data[start..start + row_bytes], row);
    };

    // Keys: per channel over groups of tokens.
    for layer in 0..plan.layers {
        for g in 0..plan.key_groups {
            let t0 = g * p.group;
            let n = p.group.min(plan.quantized - t0);
            mins.fill(f32::INFINITY);
            maxs.fill(f32::NEG_INFINITY);
            for t in t0..t0 + n {
                load_row(0, layer, t, row);
                kernels::minmax(level, row, mins, maxs);
            }
            let params_at = (layer * plan.key_groups + g) * 4 * c;
            let (lo_bytes, scale_bytes) = key_params[params_at..params_at + 4 * c].split_at_mut(2 * c);
            kernels::ranges(level, mins, maxs, levels, lo_bytes, scale_bytes, lo, inv);
            for t in t0..t0 + n {
                load_row(0, layer, t, row);
                kernels::quantize(level, row, lo, inv, levels, &mut row_codes);
                kernels::pack(level, codes, code_row(&plan, 0, layer, t) * c, p.bits, &row_codes);
            }
        }
    }

    // Values: per token over groups of channels.
    for layer in 0..plan.layers {
        for t in 0..plan.quantized {
            load_row(1, layer, t, row);
            kernels::group_minmax(level, row, p.group, group_mins, group_maxs);
            let params_at = (layer * plan.quantized + t) * 4 * groups;
            let (lo_bytes, scale_bytes) = value_params[params_at..params_at + 4 * groups].split_at_mut(2 * groups);
            kernels::ranges(level, group_mins, group_maxs, levels, lo_bytes, scale_bytes, group_lo, group_inv);
            for ((lo, inv), (&group_lo, &group_inv)) in
                lo.chunks_mut(p.group).zip(inv.chunks_mut(p.group)).zip(group_lo.iter().zip(&*group_inv))
            {
                lo.fill(group_lo);
                inv.fill(group_inv);
            }
            kernels::quantize(level, row, lo, inv, levels, &mut row_codes);
            kernels::pack(level, codes, code_row(&plan, 1, layer, t) * c, p.bits, &row_codes);
        }
    }

    // The residual window, as it is.
    let mut at = 0;
    for kv in 0..2 {
        for layer in 0..plan.layers {
            for t in plan.quantized..plan.quantized + plan.residual {
                let start = dense.row(kv, layer, t) * dtype.size();
                residual_out[at..at + row_bytes].copy_from_slice(&data[start..start + row_bytes]);
                at += row_bytes;
            }
        }
    }
    Ok(size)
}

pub(crate) fn decode(
    dense: &Dense,
    payload: &[u8],
    p: Params,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Result<(), Error> {
    decode_at(Level::best(), dense, payload, p, out, scratch)
}

/// [`decode`] on instruction set `level`; every level writes the same bytes.
pub(crate) fn decode_at(
    level: Level,
    dense: &Dense,
    payload: &[u8],
    p: Params,
    out: &mut [u8],
    scratch: &mut Vec<f32>,
) -> Result<(), Error> {
    let plan = Plan::new(dense, p);
    if payload.len() != plan.size() {
        return Err(Error::corrupt("quant payload size does not match its shape"));
    }
    let (key_params, rest) = payload.split_at(plan.key_params);
    let (value_params, rest) = rest.split_at(plan.value_params);
    let (codes, residual_in) = rest.split_at(plan.codes);
    let c = plan.channels;
    let dtype = dense.dtype;
    let row_bytes = c * dtype.size();
    let groups = plan.value_groups;
    scratch.clear();
    scratch.resize(3 * c + 2 * groups, 0.0);
    let (mins, rest) = scratch.split_at_mut(c);
    let (scales, rest) = rest.split_at_mut(c);
    let (row, rest) = rest.split_at_mut(c);
    let (group_mins, group_scales) = rest.split_at_mut(groups);
    let mut row_codes = vec![0u8; c];
    let mut rows = kernels::Dequant { level, dtype, bits: p.bits, codes, row, row_codes: &mut row_codes };

    for layer in 0..plan.layers {
        for g in 0..plan.key_groups {
            let params_at = (layer * plan.key_groups + g) * 4 * c;
            let params = &key_params[params_at..params_at + 4 * c];
            load_at(level, Dtype::Bf16, &params[..2 * c], mins);
            load_at(level, Dtype::Bf16, &params[2 * c..], scales);
            let finite = kernels::all_finite(mins) && kernels::all_finite(scales);
            rows.kernel_order(mins);
            rows.kernel_order(scales);
            let t0 = g * p.group;
            for t in t0..(t0 + p.group).min(plan.quantized) {
                let start = dense.row(0, layer, t) * dtype.size();
                rows.row(code_row(&plan, 0, layer, t) * c, mins, scales, finite, &mut out[start..start + row_bytes]);
            }
        }
    }

    for layer in 0..plan.layers {
        for t in 0..plan.quantized {
            let params_at = (layer * plan.quantized + t) * 4 * groups;
            let params = &value_params[params_at..params_at + 4 * groups];
            load_at(level, Dtype::Bf16, &params[..2 * groups], group_mins);
            load_at(level, Dtype::Bf16, &params[2 * groups..], group_scales);
            let start = dense.row(1, layer, t) * dtype.size();
            let first = code_row(&plan, 1, layer, t) * c;
            rows.grouped_row(
                first,
                p.group,
                group_mins,
                group_scales,
                mins,
                scales,
                &mut out[start..start + row_bytes],
            );
        }
    }

    let mut at = 0;
    for kv in 0..2 {
        for layer in 0..plan.layers {
            for t in plan.quantized..plan.quantized + plan.residual {
                let start = dense.row(kv, layer, t) * dtype.size();
                out[start..start + row_bytes].copy_from_slice(&residual_in[at..at + row_bytes]);
                at += row_bytes;
            }
        }
    }
    Ok(())
}

/// Index of a quantized row in the code stream: K rows, then V rows, each layer by layer.
fn code_row(plan: &Plan, kv: usize, layer: usize, token: usize) -> usize {
    (kv * plan.layers + layer) * plan.quantized + token
}

/// The stored (bf16) minimum and scale of a group spanning `[lo, hi]`, minimum rounded down and
/// scale up so that `[min, min + levels * scale]` covers the group.
fn range(lo: f32, hi: f32, levels: f32) -> (u16, u16) {
    if lo > hi {
        // No finite value in the group.
        return (0, 0);
    }
    let limit = half::bf16::MAX.to_f32();
    let lo = lo.clamp(-limit, limit);
    let hi = hi.clamp(-limit, limit);
    let lo_bits = bf16_down(lo);
    let scale = ((hi - bf16_to_f32(lo_bits)) / levels).min(limit);
    (lo_bits, bf16_up(scale))
}

fn bf16_down(x: f32) -> u16 {
    let bits = half::bf16::from_f32(x).to_bits();
    if bf16_to_f32(bits) <= x {
        bits
    } else if bits & 0x8000 == 0 && bits != 0 {
        bits - 1
    } else {
        // Negative (or +0 above a tiny negative x): one step further from zero.
        (bits | 0x8000) + u16::from(bits & 0x7fff != 0 || bits == 0)
    }
}

fn bf16_up(x: f32) -> u16 {
    let bits = half::bf16::from_f32(x).to_bits();
    if bf16_to_f32(bits) >= x {
        bits
    } else {
        // x is positive here (scales are never negative): one step up.
        bits + 1
    }
}

#[inline]
fn inverse(scale: f32) -> f32 {
    if scale > 0.0 {
        1.0 / scale
    } else {
        0.0
    }
}

/// The code of `x`, rounded to nearest, ties to even; NaN becomes 0 (a NaN survives `clamp` and
/// the additions, and `as` maps it to 0).
#[inline]
fn quantize(x: f32, lo: f32, inv: f32, levels: f32) -> u8 {
    // Adding and subtracting 2^23 rounds a value in [0, 2^23) to an integer in the current
    // rounding mode (to nearest, ties to even): `round_ties_even` without a libm call, so the
    // loop vectorizes, and the same result a GPU's `rintf` gives.
    const MAGIC: f32 = 8_388_608.0;
    let v = ((x - lo) * inv).clamp(0.0, levels);
    ((v + MAGIC) - MAGIC) as u8
}

/// Stores a decoded row; bf16, the common case, without a NaN check so the loop vectorizes
/// (decoded values are finite or overflowed to infinity, never NaN).
fn store_decoded(dtype: Dtype, row: &[f32], out: &mut [u8]) {
    if dtype == Dtype::Bf16 {
        for (o, &x) in out.chunks_exact_mut(2).zip(row) {
            o.copy_from_slice(&f32_to_bf16_finite(x).to_le_bytes());
        }
    } else {
        store_scalar(dtype, row, out);
    }
}

/// Writes `codes` (each below 2^bits) into the bit stream from element `first` on; the stream
/// must be zero there.
fn pack(stream: &mut [u8], first: usize, bits: u32, codes: &[u8]) {
    let bits = bits as usize;
    let per_byte = 8 / bits;
    if first.is_multiple_of(per_byte) && codes.len().is_multiple_of(per_byte) {
        let bytes = &mut stream[first / per_byte..(first + codes.len()) / per_byte];
        match bits {
            8 => bytes.copy_from_slice(codes),
            4 => {
                for (b, pair) in bytes.iter_mut().zip(codes.chunks_exact(2)) {
                    *b = pair[0] | pair[1] << 4;
                }
            }
            _ => {
                for (b, quad) in bytes.iter_mut().zip(codes.chunks_exact(4)) {
                    *b = quad[0] | quad[1] << 2 | quad[2] << 4 | quad[3] << 6;
                }
            }
        }
        return;
    }
    for (i, &code) in codes.iter().enumerate() {
        let bit = (first + i) * bits;
        stream[bit / 8] |= code << (bit % 8);
    }
}

fn unpack(stream: &[u8], first: usize, bits: u32, codes: &mut [u8]) {
    let bits = bits as usize;
    let per_byte = 8 / bits;
    if first.is_multiple_of(per_byte) && codes.len().is_multiple_of(per_byte) {
        let bytes = &stream[first / per_byte..(first + codes.len()) / per_byte];
        match bits {
            8 => codes.copy_from_slice(bytes),
            4 => {
                for (&b, pair) in bytes.iter().zip(codes.chunks_exact_mut(2)) {
                    pair[0] = b & 0x0f;
                    pair[1] = b >> 4;
                }
            }
            _ => {
                for (&b, quad) in bytes.iter().zip(codes.chunks_exact_mut(4)) {
                    quad[0] = b & 3;
                    quad[1] = (b >> 2) & 3;
                    quad[2] = (b >> 4) & 3;
                    quad[3] = b >> 6;
                }
            }
        }
        return;
    }
    let mask = ((1u32 << bits) - 1) as u8;
    for (i, code) in codes.iter_mut().enumerate() {
        let bit = (first + i) * bits;
        *code = (stream[bit / 8] >> (bit % 8)) & mask;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    use crate::rng::Rng;
    use crate::simd::testing;

    /// A value for a test block: mostly normal values of a random magnitude, with the special
    /// values a group can hold (NaN, infinities, both zeros, subnormals, values near bf16's
    /// largest, constant runs) when `special`.
    fn value(rng: &mut Rng, scale: f32, special: bool) -> f32 {
        if special && rng.below(8) == 0 {
            return match rng.below(12) {
                0 => f32::NAN,
                1 => f32::INFINITY,
                2 => f32::NEG_INFINITY,
                3 => 0.0,
                4 => -0.0,
                5 => 1e-40,
                6 => -1e-40,
                7 => 3.3e38,
                8 => -3.3e38,
                9 => f32::from_bits(rng.next_u64() as u32),
                10 => 65504.0 * 2.0,
                _ => 1.0,
            };
        }
        rng.normal() * scale
    }

    struct Case {
        dense: Dense,
        data: Vec<u8>,
        p: Params,
    }

    fn random_case(rng: &mut Rng, dtype: Dtype) -> Case {
        const CHANNELS: [usize; 14] = [1, 2, 3, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 256];
        const GROUPS: [usize; 9] = [1, 2, 3, 8, 16, 31, 32, 64, 128];
        let channels = CHANNELS[rng.below(CHANNELS.len() as u64) as usize];
        let tokens = rng.below(70) as usize;
        let stride_tokens = tokens + if rng.below(3) == 0 { rng.below(5) as usize } else { 0 };
        let layers = 1 + rng.below(3) as usize;
        let dense = Dense { dtype, layers, tokens, stride_tokens, channels };
        let bits = [2u32, 4, 8][rng.below(3) as usize];
        let group = GROUPS[rng.below(GROUPS.len() as u64) as usize];
        let residual = [0usize, 0, 1, 5, 32][rng.below(5) as usize];
        let special = rng.below(2) == 0;
        let scale = [1e-3f32, 1.0, 100.0, 1e30][rng.below(4) as usize];
        let n = 2 * layers * stride_tokens * channels;
        let mut values: Vec<f32> = (0..n).map(|_| value(rng, scale, special)).collect();
        if rng.below(4) == 0 {
            // Constant runs: groups with scale zero.
            let run = 1 + rng.below(64) as usize;
            for chunk in values.chunks_mut(run).step_by(2) {
                let v = chunk[0];
                chunk.fill(v);
            }
        }
        let mut data = vec![0u8; n * dtype.size()];
        store_scalar(dtype, &values, &mut data);
        Case { dense, data, p: Params { bits, group, residual } }
    }

    #[test]
    fn every_level_encodes_and_decodes_like_the_scalar_reference() {
        let levels = testing::levels("quant encode and decode against the scalar reference");
        let mut rng = Rng::new(0x5eed_0001);
        let mut scratch = Vec::new();
        let dtypes = [Dtype::Bf16, Dtype::F16, Dtype::F32, Dtype::F8E4M3];
        for case_no in 0..600 {
            let dtype = dtypes[case_no % dtypes.len()];
            let Case { dense, data, p } = random_case(&mut rng, dtype);
            let size = payload_size(&dense, p);
            let mut reference = vec![0u8; size];
            let written = encode_at(Level::SCALAR, &dense, &data, p, &mut reference, &mut scratch).unwrap();
            assert_eq!(written, size);
            let mut decoded = vec![0u8; data.len()];
            decode_at(Level::SCALAR, &dense, &reference, p, &mut decoded, &mut scratch).unwrap();
            // A payload of random bytes: parameters that are NaN, infinite or huge.
            let mut noise = vec![0u8; size];
            rng.fill(&mut noise);
            let mut noise_decoded = vec![0u8; data.len()];
            decode_at(Level::SCALAR, &dense, &noise, p, &mut noise_decoded, &mut scratch).unwrap();
            for &level in &levels[1..] {
                let what = format!("case {case_no} on {}: {dtype} {dense:?} {p:?}", level.name());
                let mut payload = vec![0xa5u8; size];
                encode_at(level, &dense, &data, p, &mut payload, &mut scratch).unwrap();
                assert!(payload == reference, "encode differs, {what}");
                let mut out = vec![0u8; data.len()];
                decode_at(level, &dense, &reference, p, &mut out, &mut scratch).unwrap();
                assert!(out == decoded, "decode differs, {what}");
                let mut out = vec![0u8; data.len()];
                decode_at(level, &dense, &noise, p, &mut out, &mut scratch).unwrap();
                if let Some(i) = out.iter().zip(&noise_decoded).position(|(a, b)| a != b) {
                    panic!(
                        "decode of random bytes differs at byte {i}: {:02x?} vs reference {:02x?}, {what}",
                        &out[i & !1..(i & !1) + 2],
                        &noise_decoded[i & !1..(i & !1) + 2]
                    );
                }
            }
        }
    }

    #[test]
    fn every_level_computes_ranges_like_the_scalar_reference() {
        let levels = testing::levels("quant ranges (directed bf16 rounding) against the scalar reference");
        let mut rng = Rng::new(0x5eed_0002);
        let n = 4099;
        for bits in [2u32, 4, 8] {
            let steps = ((1u32 << bits) - 1) as f32;
            for round in 0..40 {
                let mut mins = vec![0f32; n];
                let mut maxs = vec![0f32; n];
                for (lo, hi) in mins.iter_mut().zip(maxs.iter_mut()) {
                    let mut pick = || match round % 4 {
                        // Any finite bit pattern.
                        0 => loop {
                            let x = f32::from_bits(rng.next_u64() as u32);
                            if x.is_finite() {
                                break x;
                            }
                        },
                        // Values around zero and the smallest bf16 steps.
                        1 => [0.0, -0.0, 1e-40, -1e-40, 1e-45, -1e-45, 9.2e-41, -9.2e-41][rng.below(8) as usize],
                        2 => rng.normal() * 1e-38,
                        _ => [3.3895314e38, -3.3895314e38, 3.4e38, -3.4e38, 1.0, -1.0][rng.below(6) as usize],
                    };
                    let (a, b) = (pick(), pick());
                    (*lo, *hi) = if a <= b { (a, b) } else { (b, a) };
                    match rng.below(16) {
                        0 => (*lo, *hi) = (f32::INFINITY, f32::NEG_INFINITY),
                        1 => *hi = *lo,
                        _ => {}
                    }
                }
                let run = |level| {
                    let (mut lo_bytes, mut scale_bytes) = (vec![0u8; 2 * n], vec![0u8; 2 * n]);
                    let (mut lo, mut inv) = (vec![0f32; n], vec![0f32; n]);
                    kernels::ranges(level, &mins, &maxs, steps, &mut lo_bytes, &mut scale_bytes, &mut lo, &mut inv);
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    (lo_bytes, scale_bytes, bits(&lo), bits(&inv))
                };
                let reference = run(Level::SCALAR);
                for &level in &levels[1..] {
                    assert!(run(level) == reference, "ranges differ on {} (bits {bits}, round {round})", level.name());
                }
            }
        }
    }

    #[test]
    fn every_level_packs_and_quantizes_like_the_scalar_reference() {
        let levels = testing::levels("quant pack and quantize against the scalar reference");
        let mut rng = Rng::new(0x5eed_0003);
        for bits in [2u32, 4, 8] {
            for len in [0usize, 1, 31, 32, 33, 64, 95, 1000] {
                let codes: Vec<u8> = (0..len).map(|_| rng.below(1 << bits) as u8).collect();
                let row: Vec<f32> = (0..len).map(|_| value(&mut rng, 10.0, true)).collect();
                let lo: Vec<f32> = (0..len).map(|_| value(&mut rng, 10.0, true)).collect();
                let inv: Vec<f32> = (0..len).map(|_| value(&mut rng, 1.0, true)).collect();
                let steps = ((1u32 << bits) - 1) as f32;
                for first in [0usize, 1, 2, 3, 4, 8, 64] {
                    let pack_at = |level| {
                        let mut stream = vec![0u8; 2048];
                        kernels::pack(level, &mut stream, first, bits, &codes);
                        stream
                    };
                    let reference = pack_at(Level::SCALAR);
                    for &level in &levels[1..] {
                        assert!(pack_at(level) == reference, "pack differs on {}", level.name());
                    }
                }
                let quantize_at = |level| {
                    let mut codes = vec![0u8; len];
                    kernels::quantize(level, &row, &lo, &inv, steps, &mut codes);
                    codes
                };
                let reference = quantize_at(Level::SCALAR);
                for &level in &levels[1..] {
                    assert!(quantize_at(level) == reference, "quantize differs on {}", level.name());
                }
            }
        }
    }

    #[test]
    fn empty_blocks_encode_and_decode_on_every_level() {
        let levels = testing::levels("quant on empty blocks");
        for &level in &levels {
            for tokens in [0usize, 1] {
                let dense = Dense { dtype: Dtype::Bf16, layers: 1, tokens, stride_tokens: tokens, channels: 8 };
                let p = Params { bits: 4, group: 32, residual: 4 };
                let data = vec![7u8; 2 * tokens * 8 * 2];
                let mut payload = vec![0u8; payload_size(&dense, p)];
                let mut scratch = Vec::new();
                encode_at(level, &dense, &data, p, &mut payload, &mut scratch).unwrap();
                let mut out = vec![0u8; data.len()];
                decode_at(level, &dense, &payload, p, &mut out, &mut scratch).unwrap();
                assert_eq!(out, data, "the residual window is kept as it is");
            }
        }
    }

    #[test]
    fn directed_bf16_rounding_brackets_the_value() {
        for x in [0.0f32, -0.0, 1e-40, -1e-40, 1.0, -1.0, 1.0 + 2f32.powi(-8), 3.3e38, -3.3e38, 0.1, -0.1] {
            assert!(bf16_to_f32(bf16_down(x)) <= x, "down {x}");
            if x >= 0.0 {
                assert!(bf16_to_f32(bf16_up(x)) >= x, "up {x}");
            }
        }
    }

    #[test]
    fn packing_round_trips_at_any_offset() {
        for bits in [2u32, 4, 8] {
            let codes: Vec<u8> = (0..37).map(|i| (i * 7 % (1 << bits)) as u8).collect();
            for first in [0usize, 1, 3, 4, 8] {
                let mut stream = vec![0u8; 64];
                pack(&mut stream, first, bits, &codes);
                let mut back = vec![0u8; codes.len()];
                unpack(&stream, first, bits, &mut back);
                assert_eq!(back, codes, "bits {bits} first {first}");
            }
        }
    }

    #[test]
    fn constant_and_empty_groups_are_defined() {
        assert_eq!(range(2.0, 2.0, 15.0).1, 0);
        assert_eq!(quantize(2.0, 2.0, inverse(0.0), 15.0), 0);
        assert_eq!(range(f32::INFINITY, f32::NEG_INFINITY, 15.0), (0, 0));
        assert_eq!(quantize(f32::NAN, 0.0, 1.0, 15.0), 0);
        assert_eq!(quantize(f32::INFINITY, 0.0, 1.0, 15.0), 15);
    }
}
