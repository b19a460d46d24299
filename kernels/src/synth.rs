//! Synthetic KV blocks, deterministic from a seed, for tests, the demo and benchmarks.
//!
//! What it imitates, per layer and KV head, from what is published about real models (KIVI,
//! KVQuant, StreamingLLM, H2O, "a simple and effective L2 norm-based strategy"):
//!
//! - keys with a few outlier channels, 5 to 20 times the median magnitude and of stable sign
//!   across tokens, in the low-frequency rotary dimensions, with rotary position embedding
//!   (base 10000, pairs `i` and `i + head_dim / 2`) applied at each token's position;
//! - attention sinks (the first tokens) and heavy hitters (a few scattered tokens) whose keys
//!   point along the direction queries take, with a smaller norm than ordinary keys (low-norm keys
//!   attract attention);
//! - values without outlier channels, the sinks' values small;
//! - [`Synth::queries`]: query vectors for the tokens after the block, which put most of their
//!   attention on the sinks and heavy hitters.
//!
//! What it cannot imitate: the structure of a real model's keys beyond these statistics, how
//! heads differ across layers, and the text. Codec sizes and speeds on generated blocks are
//! representative; eviction rankings and errors on generated blocks are not evidence about real
//! models.

use crate::elem::Elements as _;
use crate::rng::{mix, Rng};
use crate::{Dtype, KvShape, Queries};

/// Shape and statistics of generated blocks.
#[derive(Clone, Copy, Debug)]
pub struct Synth {
    /// The shape of the blocks generated.
    pub desc: KvShape,
    /// The seed every value derives from.
    pub seed: u64,
    /// Attention-sink tokens at the start.
    pub sinks: usize,
    /// Fraction of the other tokens that are heavy hitters.
    pub heavy_hitters: f32,
    /// Outlier key channels per head (rounded up to whole rotary pairs).
    pub outlier_channels: usize,
    /// Position of the block's first token (for the rotary embedding).
    pub first_position: usize,
}

const ROPE_BASE: f64 = 10000.0;
/// Query magnitude along the attention direction.
const QUERY_GAIN: f32 = 8.0;

impl Synth {
    /// An LMCache-shaped chunk: bf16 `KV_2LTD`.
    pub fn new(layers: u32, tokens: u32, kv_heads: u32, head_dim: u32, seed: u64) -> Synth {
        Synth::for_desc(KvShape::kv_2ltd(Dtype::Bf16, layers, tokens, kv_heads, head_dim), seed)
    }

    /// Blocks of any shape.
    pub fn for_desc(desc: KvShape, seed: u64) -> Synth {
        Synth { desc, seed, sinks: 4, heavy_hitters: 0.02, outlier_channels: 4, first_position: 0 }
    }

    /// Generates the block's bytes in its dtype and layout.
    pub fn generate(&self) -> Vec<u8> {
        let desc = self.desc;
        let mut bytes = vec![0u8; desc.raw_size()];
        if !desc.is_tensor() {
            let mut rng = Rng::new(self.seed);
            let values: Vec<f32> = (0..desc.elements()).map(|_| rng.normal()).collect();
            desc.dtype.store(&values, &mut bytes);
            return bytes;
        }
        let (tokens, d, size) = (desc.tokens(), desc.head_dim(), desc.dtype.size());
        let mut k = vec![0f32; d];
        let mut v = vec![0f32; d];
        let rotary = Rope::new(d, self.first_position, tokens);
        for layer in 0..desc.layers() {
            for head in 0..desc.heads() {
                let shape = HeadShape::new(self, layer, head);
                let mut rng = Rng::new(mix(self.seed, layer as u64, head as u64, 1));
                let mut roles = Rng::new(mix(self.seed, layer as u64, 0, 2));
                for t in 0..tokens {
                    // Heavy hitters are chosen per layer, the same for all its heads.
                    let hitter = t >= self.sinks && roles.uniform() < self.heavy_hitters;
                    let sink = t < self.sinks;
                    for c in 0..d {
                        let noise = rng.normal();
                        k[c] = if sink {
                            0.3 * shape.magnitude[c] * noise + shape.sink_key * shape.direction[c]
                        } else if hitter {
                            0.5 * shape.magnitude[c] * (shape.bias[c] + noise) + shape.hitter_key * shape.direction[c]
                        } else {
                            shape.magnitude[c] * (shape.bias[c] + noise)
                        };
                        let value = shape.value_scale[c] * rng.normal();
                        v[c] = if sink { 0.1 * value } else { value };
                    }
                    rotary.apply(&mut k, self.first_position + t);
                    let at = |kv| (desc.row(kv, layer, t) + head * d) * size;
                    desc.dtype.store(&k, &mut bytes[at(0)..at(0) + d * size]);
                    desc.dtype.store(&v, &mut bytes[at(1)..at(1) + d * size]);
                }
            }
        }
        bytes
    }

    /// `count` query vectors per query head for the tokens right after the block, with
    /// `group` query heads per KV head.
    pub fn queries(&self, count: usize, group: usize) -> Queries {
        let desc = self.desc;
        let (layers, heads, d) = (desc.layers(), desc.heads(), desc.head_dim());
        let q_heads = heads * group;
        let mut data = vec![0f32; layers * count * q_heads * d];
        let mut q = vec![0f32; d];
        for layer in 0..layers {
            for head in 0..heads {
                let shape = HeadShape::new(self, layer, head);
                let mut rng = Rng::new(mix(self.seed, layer as u64, head as u64, 3));
                for w in 0..count {
                    for g in 0..group {
                        for (x, &direction) in q.iter_mut().zip(&shape.direction) {
                            *x = QUERY_GAIN * direction + 0.5 * rng.normal();
                        }
                        rope(&mut q, self.first_position + desc.tokens() + w);
                        let at = ((layer * count + w) * q_heads + head * group + g) * d;
                        data[at..at + d].copy_from_slice(&q);
                    }
                }
            }
        }
        Queries { layers, count, q_heads, head_dim: d, data }
    }
}

impl Default for Synth {
    /// A 256-token chunk of a Llama-3-8B-shaped model's first two layers (8 KV heads of 128):
    /// 2 MiB in bf16.
    fn default() -> Synth {
        Synth::new(2, 256, 8, 128, 0)
    }
}

/// The fixed statistics of one layer and head.
struct HeadShape {
    magnitude: Vec<f32>,
    bias: Vec<f32>,
    direction: Vec<f32>,
    value_scale: Vec<f32>,
    sink_key: f32,
    hitter_key: f32,
}

impl HeadShape {
    fn new(synth: &Synth, layer: usize, head: usize) -> HeadShape {
        let d = synth.desc.head_dim();
        let half = d / 2;
        let mut rng = Rng::new(mix(synth.seed, layer as u64, head as u64, 0));
        let mut magnitude: Vec<f32> = (0..d).map(|_| 0.6 + 0.8 * rng.uniform()).collect();
        let mut bias = vec![0f32; d];
        let value_scale = (0..d).map(|_| 0.4 + 0.2 * rng.uniform()).collect();
        // Low-frequency rotary pairs are the last quarter of the pair indices: they turn by
        // less than a radian over thousands of tokens, so what lives there is stable.
        let low = (half * 3 / 4).min(half.saturating_sub(1));
        let pairs = synth.outlier_channels.div_ceil(2).min(half - low.min(half));
        let mut outliers = Vec::new();
        while outliers.len() < pairs {
            let pair = low + (rng.next_u64() % (half - low) as u64) as usize;
            if !outliers.contains(&pair) {
                outliers.push(pair);
            }
        }
        for &pair in &outliers {
            let gain = 5.0 + 15.0 * rng.uniform();
            for c in [pair, pair + half] {
                magnitude[c] *= gain;
                bias[c] = if rng.uniform() < 0.5 { -1.0 } else { 1.0 };
            }
        }
        // The attention direction: the other low-frequency channels, unit length.
        let mut direction = vec![0f32; d];
        for pair in low..half {
            if !outliers.contains(&pair) {
                direction[pair] = rng.normal();
                direction[pair + half] = rng.normal();
            }
        }
        let n = direction.iter().map(|x| x * x).sum::<f32>().sqrt();
        if n > 0.0 {
            direction.iter_mut().for_each(|x| *x /= n);
        }
        // Logit excess of a sink over an ordinary token is about 6, of a heavy hitter 4.
        let root_d = (d as f32).sqrt();
        HeadShape {
            magnitude,
            bias,
            direction,
            value_scale,
            sink_key: 6.0 * root_d / QUERY_GAIN,
            hitter_key: 4.0 * root_d / QUERY_GAIN,
        }
    }
}

/// Rotary position embedding, pairs `(i, i + d/2)` (the "rotate half" convention of Llama).
fn rope(x: &mut [f32], position: usize) {
    Rope::new(x.len(), position, 1).apply(x, position);
}

/// The rotary angles of a run of positions, computed once for every layer and head that uses
/// them (`sin_cos` per pair and position dominated generation when done per head).
struct Rope {
    first: usize,
    half: usize,
    /// `(sin, cos)` per position, then per pair.
    table: Vec<(f32, f32)>,
}

impl Rope {
    fn new(d: usize, first: usize, positions: usize) -> Rope {
        let half = d / 2;
        let inverse: Vec<f64> = (0..half).map(|i| ROPE_BASE.powf(-2.0 * i as f64 / d as f64)).collect();
        let mut table = Vec::with_capacity(positions * half);
        for position in first..first + positions {
            for &f in &inverse {
                let (sin, cos) = (position as f64 * f).sin_cos();
                table.push((sin as f32, cos as f32));
            }
        }
        Rope { first, half, table }
    }

    fn apply(&self, x: &mut [f32], position: usize) {
        let at = (position - self.first) * self.half;
        let (lo, hi) = x.split_at_mut(self.half);
        for ((a, b), &(sin, cos)) in lo.iter_mut().zip(hi.iter_mut()).zip(&self.table[at..at + self.half]) {
            let (x0, x1) = (*a, *b);
            *a = x0 * cos - x1 * sin;
            *b = x0 * sin + x1 * cos;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_block() {
        let synth = Synth::new(2, 32, 2, 64, 7);
        assert_eq!(synth.generate(), synth.generate());
        assert_ne!(synth.generate(), Synth::new(2, 32, 2, 64, 8).generate());
    }

    #[test]
    fn keys_have_outlier_channels_and_sinks_take_the_attention() {
        let synth = Synth::new(1, 256, 1, 128, 3);
        let desc = synth.desc;
        let bytes = synth.generate();
        let mut key = vec![0f32; 128];
        let mut mean_abs = vec![0f32; 128];
        let mut norms = Vec::new();
        for t in 0..256 {
            desc.dtype.load(&bytes[desc.row(0, 0, t) * 2..], &mut key);
            for (m, &x) in mean_abs.iter_mut().zip(&key) {
                *m += x.abs() / 256.0;
            }
            norms.push(key.iter().map(|x| x * x).sum::<f32>().sqrt());
        }
        let mut sorted = mean_abs.clone();
        sorted.sort_by(f32::total_cmp);
        let median = sorted[64];
        assert!(sorted[127] > 4.0 * median, "largest channel {} median {median}", sorted[127]);
        // Sinks have lower norms than the typical key.
        let mut sorted_norms = norms.clone();
        sorted_norms.sort_by(f32::total_cmp);
        assert!(norms[0] < sorted_norms[128]);

        // Queries put most of their attention on the first four tokens and the heavy hitters.
        let queries = synth.queries(4, 1);
        let mut logits = vec![0f32; 256];
        for (t, logit) in logits.iter_mut().enumerate() {
            desc.dtype.load(&bytes[desc.row(0, 0, t) * 2..], &mut key);
            let q = queries.get(0, 0, 0);
            *logit = q.iter().zip(&key).map(|(a, b)| a * b).sum::<f32>() / 128f32.sqrt();
        }
        crate::codec::softmax(&mut logits);
        let sink_mass: f32 = logits[..4].iter().sum();
        assert!(sink_mass > 0.3, "sink mass {sink_mass}");
    }
}
