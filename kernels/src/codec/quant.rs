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
//! decodes to zeros. A constant group has scale zero and decodes exactly.

use super::Dense;
use crate::elem::{bf16_to_f32, f32_to_bf16_finite, Elements as _};
use crate::{Dtype, Error};

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
    let dtype = dense.dtype;
    let levels = ((1u32 << p.bits) - 1) as f32;
    scratch.clear();
    scratch.resize(p.group * c + 2 * c, 0.0);
    let (rows, rest) = scratch.split_at_mut(p.group * c);
    let (mins, scales) = rest.split_at_mut(c);
    let mut row_codes_u8 = vec![0u8; c];

    // Keys: per channel over groups of tokens.
    for layer in 0..plan.layers {
        for g in 0..plan.key_groups {
            let t0 = g * p.group;
            let n = p.group.min(plan.quantized - t0);
            for i in 0..n {
                let start = dense.row(0, layer, t0 + i) * dtype.size();
                dtype.load(&data[start..], &mut rows[i * c..(i + 1) * c]);
            }
            mins.fill(f32::INFINITY);
            scales.fill(f32::NEG_INFINITY);
            for row in rows[..n * c].chunks_exact(c) {
                for ((lo, hi), &x) in mins.iter_mut().zip(scales.iter_mut()).zip(row) {
                    let finite = x.is_finite();
                    *lo = if finite { lo.min(x) } else { *lo };
                    *hi = if finite { hi.max(x) } else { *hi };
                }
            }
            let params_at = (layer * plan.key_groups + g) * 4 * c;
            let params = &mut key_params[params_at..params_at + 4 * c];
            for ch in 0..c {
                let (lo, scale) = range(mins[ch], scales[ch], levels);
                params[2 * ch..2 * ch + 2].copy_from_slice(&lo.to_le_bytes());
                params[2 * (c + ch)..2 * (c + ch) + 2].copy_from_slice(&scale.to_le_bytes());
                mins[ch] = bf16_to_f32(lo);
                scales[ch] = bf16_to_f32(scale);
            }
            for i in 0..n {
                let row = &rows[i * c..(i + 1) * c];
                for (((code, &x), &lo), &scale) in row_codes_u8.iter_mut().zip(row).zip(&*mins).zip(&*scales) {
                    *code = quantize(x, lo, inverse(scale), levels);
                }
                let element = code_row(&plan, 0, layer, t0 + i) * c;
                pack(codes, element, p.bits, &row_codes_u8);
            }
        }
    }

    // Values: per token over groups of channels.
    let row = &mut rows[..c];
    let groups = plan.value_groups;
    for layer in 0..plan.layers {
        for t in 0..plan.quantized {
            let start = dense.row(1, layer, t) * dtype.size();
            dtype.load(&data[start..], row);
            let params_at = (layer * plan.quantized + t) * 4 * groups;
            let params = &mut value_params[params_at..params_at + 4 * groups];
            for (gi, (chunk, codes_chunk)) in row.chunks(p.group).zip(row_codes_u8.chunks_mut(p.group)).enumerate() {
                let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
                for &x in chunk {
                    let finite = x.is_finite();
                    lo = if finite { lo.min(x) } else { lo };
                    hi = if finite { hi.max(x) } else { hi };
                }
                let (lo_bits, scale_bits) = range(lo, hi, levels);
                params[2 * gi..2 * gi + 2].copy_from_slice(&lo_bits.to_le_bytes());
                params[2 * (groups + gi)..2 * (groups + gi) + 2].copy_from_slice(&scale_bits.to_le_bytes());
                let (lo, scale) = (bf16_to_f32(lo_bits), bf16_to_f32(scale_bits));
                let inv = inverse(scale);
                for (code, &x) in codes_chunk.iter_mut().zip(chunk) {
                    *code = quantize(x, lo, inv, levels);
                }
            }
            let element = code_row(&plan, 1, layer, t) * c;
            pack(codes, element, p.bits, &row_codes_u8);
        }
    }

    // The residual window, as it is.
    let row_bytes = c * dtype.size();
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
    scratch.clear();
    scratch.resize(4 * c, 0.0);
    let (mins, rest) = scratch.split_at_mut(c);
    let (scales, row) = rest.split_at_mut(c);
    let row = &mut row[..c];
    let mut row_codes = vec![0u8; c];

    for layer in 0..plan.layers {
        for g in 0..plan.key_groups {
            let params_at = (layer * plan.key_groups + g) * 4 * c;
            let params = &key_params[params_at..params_at + 4 * c];
            load_bf16(&params[..2 * c], mins);
            load_bf16(&params[2 * c..], scales);
            let t0 = g * p.group;
            for t in t0..(t0 + p.group).min(plan.quantized) {
                unpack(codes, code_row(&plan, 0, layer, t) * c, p.bits, &mut row_codes);
                for (((x, &code), &lo), &scale) in row.iter_mut().zip(&row_codes).zip(&*mins).zip(&*scales) {
                    *x = lo + code as f32 * scale;
                }
                let start = dense.row(0, layer, t) * dtype.size();
                store_decoded(dtype, row, &mut out[start..start + row_bytes]);
            }
        }
    }

    let groups = plan.value_groups;
    for layer in 0..plan.layers {
        for t in 0..plan.quantized {
            let params_at = (layer * plan.quantized + t) * 4 * groups;
            let params = &value_params[params_at..params_at + 4 * groups];
            unpack(codes, code_row(&plan, 1, layer, t) * c, p.bits, &mut row_codes);
            for (gi, (chunk, codes_chunk)) in row.chunks_mut(p.group).zip(row_codes.chunks(p.group)).enumerate() {
                let lo = bf16_to_f32(u16::from_le_bytes([params[2 * gi], params[2 * gi + 1]]));
                let s = 2 * (groups + gi);
                let scale = bf16_to_f32(u16::from_le_bytes([params[s], params[s + 1]]));
                for (x, &code) in chunk.iter_mut().zip(codes_chunk) {
                    *x = lo + code as f32 * scale;
                }
            }
            let start = dense.row(1, layer, t) * dtype.size();
            store_decoded(dtype, row, &mut out[start..start + row_bytes]);
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

fn load_bf16(bytes: &[u8], out: &mut [f32]) {
    for (o, b) in out.iter_mut().zip(bytes.chunks_exact(2)) {
        *o = bf16_to_f32(u16::from_le_bytes([b[0], b[1]]));
    }
}

/// Stores a decoded row; bf16, the common case, without a NaN check so the loop vectorizes
/// (decoded values are finite or overflowed to infinity, never NaN).
fn store_decoded(dtype: Dtype, row: &[f32], out: &mut [u8]) {
    if dtype == Dtype::Bf16 {
        for (o, &x) in out.chunks_exact_mut(2).zip(row) {
            o.copy_from_slice(&f32_to_bf16_finite(x).to_le_bytes());
        }
    } else {
        dtype.store(row, out);
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
mod tests {
    use super::*;

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
