//! Query vectors a client supplies (SnapKV's observation window, or probes for the quality
//! estimate).

use crate::{Error, KvShape};

/// Query vectors `[layers, count, q_heads, head_dim]` in `f32`. `q_heads` is a multiple of the
/// block's KV heads (grouped-query attention); query head `q` reads KV head `q / (q_heads /
/// kv_heads)`, as in every GQA implementation.
#[derive(Clone, Debug, PartialEq)]
pub struct Queries {
    /// Layers.
    pub layers: usize,
    /// Queries per layer and head.
    pub count: usize,
    /// Query heads (a multiple of the block's KV heads).
    pub q_heads: usize,
    /// Channels per head.
    pub head_dim: usize,
    /// The values, `[layers, count, q_heads, head_dim]`.
    pub data: Vec<f32>,
}

impl Queries {
    /// Checks that these queries fit `desc` and returns the GQA group size.
    pub fn check(&self, desc: &KvShape) -> Result<usize, Error> {
        if self.data.len() != self.layers * self.count * self.q_heads * self.head_dim {
            return Err(Error::Invalid(format!(
                "queries hold {} values, but [{}, {}, {}, {}] needs {}",
                self.data.len(),
                self.layers,
                self.count,
                self.q_heads,
                self.head_dim,
                self.layers * self.count * self.q_heads * self.head_dim
            )));
        }
        if self.layers != desc.layers() || self.head_dim != desc.head_dim() {
            return Err(Error::Invalid(format!(
                "queries are for {} layers of head_dim {}, the block has {} layers of head_dim {}",
                self.layers,
                self.head_dim,
                desc.layers(),
                desc.head_dim()
            )));
        }
        if self.count == 0 || self.q_heads == 0 || !self.q_heads.is_multiple_of(desc.heads()) {
            return Err(Error::Invalid(format!(
                "need at least one query, and query heads ({}) a multiple of KV heads ({})",
                self.q_heads,
                desc.heads()
            )));
        }
        Ok(self.q_heads / desc.heads())
    }

    /// Query `index` of head `q_head` in `layer`.
    pub fn get(&self, layer: usize, index: usize, q_head: usize) -> &[f32] {
        let start = ((layer * self.count + index) * self.q_heads + q_head) * self.head_dim;
        &self.data[start..start + self.head_dim]
    }
}
