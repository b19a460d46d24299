//! Which original token each decoded token is, after a dropping codec kept some of them.

/// Which original token each decoded token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Nothing was dropped: decoded token `i` is token `i`.
    All,
    /// One kept set for all layers and heads, ascending.
    Shared(Vec<u32>),
    /// A kept set per layer and KV head, `kept[(layer * heads + head) * kept_tokens + i]`.
    PerHead {
        /// Layers of the block.
        layers: usize,
        /// KV heads per layer.
        heads: usize,
        /// The kept positions, ascending within each `(layer, head)`.
        kept: Vec<u32>,
    },
}

impl Positions {
    /// The original position of decoded token `index` of `(layer, head)`. Positions come from
    /// [`crate::CodecParams::decode`], which checks that every selection holds `kept_tokens`
    /// tokens, so the lookups are in range for `index < kept_tokens`.
    pub fn position(&self, layer: usize, head: usize, kept_tokens: usize, index: usize) -> usize {
        let at = match self {
            Positions::All => return index,
            Positions::Shared(kept) => kept.get(index),
            Positions::PerHead { heads, kept, .. } => kept.get((layer * heads + head) * kept_tokens + index),
        };
        at.map_or(usize::MAX, |&t| t as usize)
    }

    /// Number of kept sets: 0 without dropping, 1 shared, one per layer and head.
    pub fn selections(&self) -> usize {
        match self {
            Positions::All => 0,
            Positions::Shared(_) => 1,
            Positions::PerHead { layers, heads, .. } => layers * heads,
        }
    }
}
