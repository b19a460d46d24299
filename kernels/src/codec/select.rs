//! Which tokens a dropping codec keeps, and the gather that builds the smaller block.
//!
//! Every method scores tokens per layer and KV head (higher = more worth keeping). The shared
//! selection (the default) averages the scores over layers and heads and keeps one set for the
//! whole block, so that a paged serving engine can load it; the per-head selection keeps the best
//! tokens of each layer and head. Scores that are not numbers rank lowest. Ties go to the earlier
//! token, so a selection is a pure function of the block.

use super::Dense;
use crate::elem::Elements as _;
use crate::{DropMethod, DropSpec, Error, KvShape, Positions, Queries};

/// Chooses the kept tokens. Returns their count and positions (ascending within a selection).
pub(crate) fn select(
    spec: &DropSpec,
    desc: &KvShape,
    data: &[u8],
    queries: Option<&Queries>,
) -> Result<(usize, Positions), Error> {
    let tokens = desc.tokens();
    let (layers, heads) = (desc.layers(), desc.heads());
    let keep = keep_count(spec.keep_fraction, tokens);
    let kept_for = |scores: &[f32]| -> Vec<u32> { top(scores, keep) };
    let scored = |scores: Vec<f32>| -> (usize, Positions) {
        if spec.per_head {
            let mut kept = Vec::with_capacity(layers * heads * keep);
            for head_scores in scores.chunks_exact(tokens) {
                kept.extend(kept_for(head_scores));
            }
            (keep, Positions::PerHead { layers, heads, kept })
        } else {
            (keep, Positions::Shared(kept_for(&mean_over_heads(&scores, tokens))))
        }
    };
    match spec.method {
        DropMethod::KNorm => Ok(scored(score_knorm(desc, data))),
        DropMethod::KeyDiff => Ok(scored(score_keydiff(desc, data))),
        DropMethod::SnapKv { pool } => {
            let queries = queries.ok_or_else(|| {
                Error::Unsupported(
                    "drop-snapkv needs the observation-window query vectors of the request; \
                     supply them, or choose drop-knorm, drop-keydiff, drop-streaming or drop-paged"
                        .into(),
                )
            })?;
            Ok(scored(score_snapkv(desc, data, queries, pool as usize)?))
        }
        DropMethod::Streaming { sink } => {
            let sink = (sink as usize).min(keep);
            let kept: Vec<u32> = (0..sink).chain(tokens - (keep - sink)..tokens).map(|t| t as u32).collect();
            Ok((keep, share(spec, desc, kept)))
        }
        DropMethod::Paged { page } => {
            let page = desc.page_size(page as usize);
            let pages = tokens.div_ceil(page);
            let keep_pages = keep_count(spec.keep_fraction, pages).max(2.min(pages));
            let ratios = score_value_key_ratio(desc, data);
            let pages_of = |token_scores: &[f32]| -> Vec<u32> {
                let mut page_scores: Vec<f32> =
                    token_scores.chunks(page).map(|p| p.iter().sum::<f32>() / p.len() as f32).collect();
                // The first and last pages are always kept.
                page_scores[0] = f32::INFINITY;
                page_scores[pages - 1] = f32::INFINITY;
                let mut kept = Vec::new();
                for p in top(&page_scores, keep_pages) {
                    let start = p as usize * page;
                    kept.extend((start..(start + page).min(tokens)).map(|t| t as u32));
                }
                kept
            };
            if spec.per_head {
                // Whole pages differ in size only at the end, so every selection keeps as many
                // tokens only if the last page is full or always kept, and it always is.
                let mut kept = Vec::new();
                for head_scores in ratios.chunks_exact(tokens) {
                    kept.extend(pages_of(head_scores));
                }
                let count = kept.len() / (layers * heads);
                Ok((count, Positions::PerHead { layers, heads, kept }))
            } else {
                let kept = pages_of(&mean_over_heads(&ratios, tokens));
                Ok((kept.len(), Positions::Shared(kept)))
            }
        }
    }
}

/// Tokens kept for a fraction: rounded, at least one, at most all.
fn keep_count(fraction: f32, tokens: usize) -> usize {
    ((fraction as f64 * tokens as f64).round() as usize).clamp(1, tokens.max(1))
}

fn share(spec: &DropSpec, desc: &KvShape, kept: Vec<u32>) -> Positions {
    if spec.per_head {
        let copies = desc.layers() * desc.heads();
        Positions::PerHead { layers: desc.layers(), heads: desc.heads(), kept: kept.repeat(copies) }
    } else {
        Positions::Shared(kept)
    }
}

/// The `keep` best tokens by score, in ascending position.
fn top(scores: &[f32], keep: usize) -> Vec<u32> {
    let mut order: Vec<u32> = (0..scores.len() as u32).collect();
    let key = |t: &u32| {
        let s = scores[*t as usize];
        if s.is_nan() {
            f32::NEG_INFINITY
        } else {
            s
        }
    };
    order.sort_by(|a, b| key(b).total_cmp(&key(a)).then(a.cmp(b)));
    order.truncate(keep);
    order.sort_unstable();
    order
}

fn mean_over_heads(scores: &[f32], tokens: usize) -> Vec<f32> {
    let mut mean = vec![0f32; tokens];
    let selections = scores.len() / tokens.max(1);
    for head_scores in scores.chunks_exact(tokens) {
        for (m, &s) in mean.iter_mut().zip(head_scores) {
            *m += s;
        }
    }
    for m in &mut mean {
        *m /= selections as f32;
    }
    mean
}

/// Calls `f(layer, head, token, k, v)` with each head's key and value vectors as `f32`.
fn for_each_head(desc: &KvShape, data: &[u8], mut f: impl FnMut(usize, usize, usize, &[f32], &[f32])) {
    let (c, d, dtype) = (desc.channels(), desc.head_dim(), desc.dtype);
    let mut k = vec![0f32; c];
    let mut v = vec![0f32; c];
    for layer in 0..desc.layers() {
        for t in 0..desc.tokens() {
            dtype.load(&data[desc.row(0, layer, t) * dtype.size()..], &mut k);
            dtype.load(&data[desc.row(1, layer, t) * dtype.size()..], &mut v);
            for h in 0..desc.heads() {
                f(layer, h, t, &k[h * d..(h + 1) * d], &v[h * d..(h + 1) * d]);
            }
        }
    }
}

fn norm(x: &[f32]) -> f32 {
    x.iter().map(|v| v * v).sum::<f32>().sqrt()
}

/// Scores laid out `[layer][head][token]`.
fn scores_buffer(desc: &KvShape) -> Vec<f32> {
    vec![0f32; desc.layers() * desc.heads() * desc.tokens()]
}

fn score_knorm(desc: &KvShape, data: &[u8]) -> Vec<f32> {
    let (heads, tokens) = (desc.heads(), desc.tokens());
    let mut scores = scores_buffer(desc);
    for_each_head(desc, data, |l, h, t, k, _| {
        // Low-norm keys attract attention (kvpress), so the largest norms go first.
        scores[(l * heads + h) * tokens + t] = -norm(k);
    });
    scores
}

fn score_keydiff(desc: &KvShape, data: &[u8]) -> Vec<f32> {
    let (heads, tokens, d) = (desc.heads(), desc.tokens(), desc.head_dim());
    let mut normalized = vec![0f32; desc.layers() * heads * tokens * d];
    for_each_head(desc, data, |l, h, t, k, _| {
        let n = norm(k);
        let at = ((l * heads + h) * tokens + t) * d;
        for (o, &x) in normalized[at..at + d].iter_mut().zip(k) {
            *o = if n > 0.0 { x / n } else { 0.0 };
        }
    });
    let mut scores = scores_buffer(desc);
    for (head_scores, keys) in scores.chunks_exact_mut(tokens).zip(normalized.chunks_exact(tokens * d)) {
        let mut mean = vec![0f32; d];
        for key in keys.chunks_exact(d) {
            for (m, &x) in mean.iter_mut().zip(key) {
                *m += x / tokens as f32;
            }
        }
        let mean_norm = norm(&mean);
        for (s, key) in head_scores.iter_mut().zip(keys.chunks_exact(d)) {
            let dot: f32 = key.iter().zip(&mean).map(|(a, b)| a * b).sum();
            let cosine = if mean_norm > 0.0 { dot / mean_norm } else { 0.0 };
            // Keys that differ most from the mean are kept.
            *s = -cosine;
        }
    }
    scores
}

fn score_value_key_ratio(desc: &KvShape, data: &[u8]) -> Vec<f32> {
    let (heads, tokens) = (desc.heads(), desc.tokens());
    let mut scores = scores_buffer(desc);
    for_each_head(desc, data, |l, h, t, k, v| {
        scores[(l * heads + h) * tokens + t] = norm(v) / norm(k).max(f32::MIN_POSITIVE);
    });
    scores
}

fn score_snapkv(desc: &KvShape, data: &[u8], queries: &Queries, pool: usize) -> Result<Vec<f32>, Error> {
    let group = queries.check(desc)?;
    let (heads, tokens, d, c) = (desc.heads(), desc.tokens(), desc.head_dim(), desc.channels());
    let scale = 1.0 / (d as f32).sqrt();
    let mut scores = scores_buffer(desc);
    let mut keys = vec![0f32; tokens * c];
    let mut weights = vec![0f32; tokens];
    let mut summed = vec![0f32; tokens];
    for layer in 0..desc.layers() {
        for t in 0..tokens {
            desc.dtype.load(&data[desc.row(0, layer, t) * desc.dtype.size()..], &mut keys[t * c..(t + 1) * c]);
        }
        for h in 0..heads {
            summed.fill(0.0);
            for q_head in h * group..(h + 1) * group {
                for w in 0..queries.count {
                    let q = queries.get(layer, w, q_head);
                    for (t, weight) in weights.iter_mut().enumerate() {
                        let k = &keys[t * c + h * d..t * c + (h + 1) * d];
                        *weight = q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * scale;
                    }
                    softmax(&mut weights);
                    for (s, &weight) in summed.iter_mut().zip(&weights) {
                        *s += weight;
                    }
                }
            }
            let at = (layer * heads + h) * tokens;
            let denominator = (queries.count * group) as f32;
            // Average pool of width `pool`, zero-padded at the ends (as avg_pool1d with padding).
            let half = pool / 2;
            for t in 0..tokens {
                let window = &summed[t.saturating_sub(half)..(t + half + 1).min(tokens)];
                scores[at + t] = window.iter().sum::<f32>() / (pool as f32 * denominator);
            }
        }
    }
    Ok(scores)
}

/// In-place softmax; a row with no finite logit becomes uniform.
pub(crate) fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().filter(|v| !v.is_nan()).fold(f32::NEG_INFINITY, f32::max);
    if !max.is_finite() {
        let uniform = 1.0 / x.len() as f32;
        x.fill(uniform);
        return;
    }
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = if v.is_nan() { 0.0 } else { (*v - max).exp() };
        sum += *v;
    }
    for v in x.iter_mut() {
        *v /= sum;
    }
}

/// Copies the kept rows of `data` (shape `desc`) into `out` (shape `dense`, zero elsewhere).
pub(crate) fn gather(desc: &KvShape, data: &[u8], positions: &Positions, dense: &Dense, out: &mut [u8]) {
    let size = desc.dtype.size();
    let (c, d) = (desc.channels(), desc.head_dim());
    out.fill(0);
    for kv in 0..2 {
        for layer in 0..desc.layers() {
            match positions {
                Positions::All => unreachable!("gather is only called after a selection"),
                Positions::Shared(kept) => {
                    for (i, &t) in kept.iter().enumerate() {
                        let from = desc.row(kv, layer, t as usize) * size;
                        let to = dense.row(kv, layer, i) * size;
                        out[to..to + c * size].copy_from_slice(&data[from..from + c * size]);
                    }
                }
                Positions::PerHead { heads, kept, .. } => {
                    for h in 0..*heads {
                        let at = (layer * heads + h) * dense.tokens;
                        for (i, &t) in kept[at..at + dense.tokens].iter().enumerate() {
                            let from = (desc.row(kv, layer, t as usize) + h * d) * size;
                            let to = (dense.row(kv, layer, i) + h * d) * size;
                            out[to..to + d * size].copy_from_slice(&data[from..from + d * size]);
                        }
                    }
                }
            }
        }
    }
}
