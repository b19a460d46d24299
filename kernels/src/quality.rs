//! What a codec costs in attention, estimated without a language model.
//!
//! For each layer and KV head, with probe queries `q_j`:
//!
//! ```text
//! E = sqrt(mean_j ||o_j - ô_j||^2) / RMS_i ||v_i||
//! o_j = softmax(q_j K^T / sqrt(d)) V      on the original block
//! ô_j = the same on the decoded block, over the kept tokens only
//! ```
//!
//! and, for dropping codecs, the attention mass the original block puts on the dropped tokens.
//!
//! Probe queries come from the client when it has them (the queries of the request's last
//! tokens, grouped-query heads mapped to their KV head). Otherwise they are derived from the
//! block's own keys: the block is cut into up to [`DERIVED_PROBES`] runs of consecutive tokens,
//! and each probe is the mean key of a run minus the mean key of the block, scaled to norm
//! `sqrt(head_dim)`. Subtracting the mean removes the component every key shares (which shifts
//! all logits alike and so changes nothing), and what remains points at the run's tokens: the
//! probe asks "is this region of the context still answered the same way?".
//!
//! Limits: derived probes are not the model's queries. They do not know which tokens a real
//! query attends to (sinks, heavy hitters), so they rank configurations of one block against each
//! other; they do not predict task accuracy, and the numbers of two blocks are comparable only
//! roughly. Use client queries where accuracy matters, and calibrate against task results.

use crate::codec::{softmax, Decoded};
use crate::elem::Elements as _;
use crate::{Error, KvShape, Positions, Queries};

/// Probes derived from a block's own keys, at most.
pub const DERIVED_PROBES: usize = 16;

/// Error and lost attention mass per layer and KV head.
#[derive(Clone, Debug, PartialEq)]
pub struct Report {
    /// Layers of the block.
    pub layers: usize,
    /// KV heads per layer.
    pub heads: usize,
    /// `E` per `(layer, head)`, at `layer * heads + head`.
    pub error: Vec<f32>,
    /// Attention mass on dropped tokens per `(layer, head)`; zero without dropping.
    pub lost_mass: Vec<f32>,
}

impl Report {
    /// Mean of `E` over layers and heads.
    pub fn mean_error(&self) -> f32 {
        mean(&self.error)
    }

    /// Largest `E` of any layer and head.
    pub fn max_error(&self) -> f32 {
        self.error.iter().copied().fold(0.0, f32::max)
    }

    /// Mean attention mass on dropped tokens.
    pub fn mean_lost_mass(&self) -> f32 {
        mean(&self.lost_mass)
    }
}

fn mean(x: &[f32]) -> f32 {
    if x.is_empty() {
        0.0
    } else {
        x.iter().sum::<f32>() / x.len() as f32
    }
}

/// Quality in [0, 1] of a block served with attention-output error `e`: `exp(-e / 0.05)`. The
/// scale puts 8-bit quantization near 0.98 and 2-bit near 0.25 on the synthetic generator's
/// blocks; it is a modelling choice, not a measurement of a language model's accuracy. The
/// replay scores served blocks with it, and the engine turns the estimates it samples on stored
/// blocks into the qualities the placement planner weighs (docs/replay.md, docs/placement.md).
pub fn quality_of_error(e: f64) -> f64 {
    (-e / 0.05).exp()
}

/// Compares a decoded block with its original. `queries`, when given, are the probes.
pub fn estimate(
    desc: &KvShape,
    original: &[u8],
    decoded: &Decoded,
    decoded_bytes: &[u8],
    queries: Option<&Queries>,
) -> Result<Report, Error> {
    if !desc.is_tensor() {
        return Err(Error::Unsupported("the quality estimate needs a KV tensor layout, not opaque bytes".into()));
    }
    if original.len() != desc.raw_size() || decoded_bytes.len() < decoded.shape.raw_size() {
        return Err(Error::Invalid("original or decoded bytes do not match their shapes".into()));
    }
    let group = match queries {
        Some(q) => q.check(desc)?,
        None => 1,
    };
    let (layers, heads, tokens, d, c) = (desc.layers(), desc.heads(), desc.tokens(), desc.head_dim(), desc.channels());
    let kept = decoded.kept_tokens;
    let out_desc = decoded.shape;
    let scale = 1.0 / (d as f32).sqrt();
    let load = |desc: &KvShape, bytes: &[u8], kv: usize, layer: usize, rows: usize| {
        let mut m = vec![0f32; rows * c];
        for t in 0..rows {
            desc.dtype.load(&bytes[desc.row(kv, layer, t) * desc.dtype.size()..], &mut m[t * c..(t + 1) * c]);
        }
        m
    };
    let mut report = Report { layers, heads, error: vec![0.0; layers * heads], lost_mass: vec![0.0; layers * heads] };
    let mut weights = vec![0f32; tokens];
    let mut weights_hat = vec![0f32; kept];
    let mut o = vec![0f32; d];
    let mut o_hat = vec![0f32; d];
    for layer in 0..layers {
        let k = load(desc, original, 0, layer, tokens);
        let v = load(desc, original, 1, layer, tokens);
        let k_hat = load(&out_desc, decoded_bytes, 0, layer, kept);
        let v_hat = load(&out_desc, decoded_bytes, 1, layer, kept);
        for h in 0..heads {
            let value = |t: usize| &v[t * c + h * d..t * c + (h + 1) * d];
            let mut kept_mask = vec![false; tokens];
            for i in 0..kept {
                let t = decoded.positions.position(layer, h, kept, i);
                if t < tokens {
                    kept_mask[t] = true;
                }
            }
            let probes: Vec<Vec<f32>> = match queries {
                Some(q) => (h * group..(h + 1) * group)
                    .flat_map(|qh| (0..q.count).map(move |w| (qh, w)))
                    .map(|(qh, w)| q.get(layer, w, qh).to_vec())
                    .collect(),
                None => derived_probes(&k, tokens, c, h, d),
            };
            let mut squared = 0f64;
            let mut lost = 0f64;
            for q in &probes {
                for (t, w) in weights.iter_mut().enumerate() {
                    *w = dot(q, &k[t * c + h * d..t * c + (h + 1) * d]) * scale;
                }
                softmax(&mut weights);
                for (i, w) in weights_hat.iter_mut().enumerate() {
                    *w = dot(q, &k_hat[i * c + h * d..i * c + (h + 1) * d]) * scale;
                }
                softmax(&mut weights_hat);
                o.fill(0.0);
                o_hat.fill(0.0);
                for (t, &w) in weights.iter().enumerate() {
                    axpy(w, &v[t * c + h * d..t * c + (h + 1) * d], &mut o);
                    if !kept_mask[t] {
                        lost += w as f64;
                    }
                }
                for (i, &w) in weights_hat.iter().enumerate() {
                    axpy(w, &v_hat[i * c + h * d..i * c + (h + 1) * d], &mut o_hat);
                }
                squared += o.iter().zip(&o_hat).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>();
            }
            let n = probes.len().max(1) as f64;
            let rms_v = ((0..tokens)
                .map(|t| {
                    let row = value(t);
                    dot(row, row) as f64
                })
                .sum::<f64>()
                / tokens as f64)
                .sqrt();
            let numerator = (squared / n).sqrt();
            let at = layer * heads + h;
            report.error[at] = if rms_v > 0.0 {
                (numerator / rms_v) as f32
            } else if numerator == 0.0 {
                0.0
            } else {
                f32::INFINITY
            };
            report.lost_mass[at] = (lost / n) as f32;
        }
    }
    if matches!(decoded.positions, Positions::All) {
        report.lost_mass.fill(0.0);
    }
    Ok(report)
}

/// Probes from the block's own keys; see the module documentation.
fn derived_probes(k: &[f32], tokens: usize, c: usize, h: usize, d: usize) -> Vec<Vec<f32>> {
    let key = |t: usize| &k[t * c + h * d..t * c + (h + 1) * d];
    let mut mean = vec![0f32; d];
    for t in 0..tokens {
        axpy(1.0 / tokens as f32, key(t), &mut mean);
    }
    let runs = DERIVED_PROBES.min(tokens);
    let mut probes = Vec::with_capacity(runs);
    for r in 0..runs {
        let (start, end) = (r * tokens / runs, (r + 1) * tokens / runs);
        let mut q = vec![0f32; d];
        for t in start..end {
            axpy(1.0 / (end - start) as f32, key(t), &mut q);
        }
        for (x, m) in q.iter_mut().zip(&mean) {
            *x -= m;
        }
        let norm = dot(&q, &q).sqrt();
        if norm > 0.0 && norm.is_finite() {
            let gain = (d as f32).sqrt() / norm;
            q.iter_mut().for_each(|x| *x *= gain);
        } else {
            q.fill(0.0);
        }
        probes.push(q);
    }
    probes
}

/// Eight partial sums, so that the loop vectorizes (a single running sum must be added in
/// order, which forbids it).
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let mut partial = [0f32; 8];
    let (a8, b8) = (a.chunks_exact(8), b.chunks_exact(8));
    let tail: f32 = a8.remainder().iter().zip(b8.remainder()).map(|(x, y)| x * y).sum();
    for (x, y) in a8.zip(b8) {
        for i in 0..8 {
            partial[i] += x[i] * y[i];
        }
    }
    partial.iter().sum::<f32>() + tail
}

fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    for (y, &x) in y.iter_mut().zip(x) {
        *y += a * x;
    }
}
