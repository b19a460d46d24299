//! What a block is: its dtype, its layout and its shape.
//!
//! Both tensor layouts kvhoard understands are, to a codec, the same thing: a dense tensor
//! `[2, layers, tokens, channels]` with `channels = kv_heads * head_dim`, K before V. vLLM's
//! per-layer paged layout `[2, blocks, block_size, kv_heads, head_dim]` is that tensor with one
//! layer and `blocks * block_size` tokens; the page size only matters to codecs that drop pages.

use crate::{Dtype, Error};

/// Largest block a codec accepts (raw bytes): far above any KV chunk, and small enough that no
/// size computation can overflow.
pub const MAX_RAW_BYTES: u64 = 1 << 40;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Layout {
    /// LMCache's `KV_2LTD`: `[2, layers, tokens, kv_heads * head_dim]`.
    Kv2ltd { layers: u32, tokens: u32 },
    /// vLLM's per-layer paged cache: `[2, blocks, block_size, kv_heads, head_dim]`.
    Paged { blocks: u32, block_size: u32 },
    /// Bytes without a known tensor structure; only lossless codecs apply.
    Opaque { len: u64 },
}

/// The description of one block, enough to interpret its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct BlockDesc {
    pub dtype: Dtype,
    pub layout: Layout,
    /// KV heads per layer (1 for an opaque block).
    pub kv_heads: u32,
    /// Channels per head (1 for an opaque block).
    pub head_dim: u32,
}

impl BlockDesc {
    pub fn kv_2ltd(dtype: Dtype, layers: u32, tokens: u32, kv_heads: u32, head_dim: u32) -> Self {
        BlockDesc { dtype, layout: Layout::Kv2ltd { layers, tokens }, kv_heads, head_dim }
    }

    pub fn paged(dtype: Dtype, blocks: u32, block_size: u32, kv_heads: u32, head_dim: u32) -> Self {
        BlockDesc { dtype, layout: Layout::Paged { blocks, block_size }, kv_heads, head_dim }
    }

    pub fn opaque(dtype: Dtype, len: u64) -> Self {
        BlockDesc { dtype, layout: Layout::Opaque { len }, kv_heads: 1, head_dim: 1 }
    }

    /// Checks that the shape is possible: nonzero dimensions, a whole number of elements, and a
    /// size below [`MAX_RAW_BYTES`].
    pub fn validate(&self) -> Result<(), Error> {
        let size = match self.layout {
            Layout::Opaque { len } => {
                if len % self.dtype.size() as u64 != 0 {
                    return Err(Error::Invalid(format!(
                        "an opaque {} block must hold whole elements; {len} bytes do not",
                        self.dtype
                    )));
                }
                len
            }
            Layout::Kv2ltd { layers, tokens } => self.tensor_size(&[layers, tokens], "layers and tokens")?,
            Layout::Paged { blocks, block_size } => self.tensor_size(&[blocks, block_size], "blocks and block_size")?,
        };
        if size > MAX_RAW_BYTES {
            return Err(Error::Invalid(format!(
                "a block of {size} bytes is larger than the {MAX_RAW_BYTES} a codec accepts"
            )));
        }
        Ok(())
    }

    fn tensor_size(&self, dims: &[u32], names: &str) -> Result<u64, Error> {
        if dims.contains(&0) || self.kv_heads == 0 || self.head_dim == 0 {
            return Err(Error::Invalid(format!(
                "{names}, kv_heads and head_dim must all be at least 1 (got {self:?})"
            )));
        }
        let mut size = 2 * self.dtype.size() as u64;
        for &d in dims.iter().chain([&self.kv_heads, &self.head_dim]) {
            size = size.saturating_mul(d as u64);
        }
        Ok(size)
    }

    pub fn is_tensor(&self) -> bool {
        !matches!(self.layout, Layout::Opaque { .. })
    }

    /// Layers in the dense view (1 for a paged layer or an opaque block).
    pub fn layers(&self) -> usize {
        match self.layout {
            Layout::Kv2ltd { layers, .. } => layers as usize,
            Layout::Paged { .. } | Layout::Opaque { .. } => 1,
        }
    }

    /// Tokens in the dense view.
    pub fn tokens(&self) -> usize {
        match self.layout {
            Layout::Kv2ltd { tokens, .. } => tokens as usize,
            Layout::Paged { blocks, block_size } => blocks as usize * block_size as usize,
            Layout::Opaque { .. } => 0,
        }
    }

    pub fn heads(&self) -> usize {
        self.kv_heads as usize
    }

    pub fn head_dim(&self) -> usize {
        self.head_dim as usize
    }

    /// Channels per token row: `kv_heads * head_dim`.
    pub fn channels(&self) -> usize {
        self.kv_heads as usize * self.head_dim as usize
    }

    pub fn elements(&self) -> usize {
        match self.layout {
            Layout::Opaque { len } => len as usize / self.dtype.size(),
            _ => 2 * self.layers() * self.tokens() * self.channels(),
        }
    }

    pub fn raw_size(&self) -> usize {
        self.elements() * self.dtype.size()
    }

    /// Element index of the first channel of row `(kv, layer, token)`; `kv` 0 is K, 1 is V.
    #[inline]
    pub fn row(&self, kv: usize, layer: usize, token: usize) -> usize {
        ((kv * self.layers() + layer) * self.tokens() + token) * self.channels()
    }

    /// The description of the same block holding only `tokens` tokens: what a dropping codec
    /// decodes to. A paged block keeps whole pages, so its last page may be partly padding.
    pub fn with_tokens(&self, tokens: usize) -> BlockDesc {
        let layout = match self.layout {
            Layout::Kv2ltd { layers, .. } => Layout::Kv2ltd { layers, tokens: tokens as u32 },
            Layout::Paged { block_size, .. } => {
                Layout::Paged { blocks: tokens.div_ceil(block_size as usize) as u32, block_size }
            }
            opaque @ Layout::Opaque { .. } => opaque,
        };
        BlockDesc { layout, ..*self }
    }

    /// Page size for page-dropping codecs: the paged layout's block size, else `default`.
    pub fn page_size(&self, default: usize) -> usize {
        match self.layout {
            Layout::Paged { block_size, .. } => block_size as usize,
            _ => default,
        }
    }
}

impl std::fmt::Display for BlockDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.layout {
            Layout::Kv2ltd { layers, tokens } => {
                write!(f, "{} KV_2LTD [2, {layers}, {tokens}, {}x{}]", self.dtype, self.kv_heads, self.head_dim)
            }
            Layout::Paged { blocks, block_size } => {
                write!(f, "{} paged [2, {blocks}, {block_size}, {}, {}]", self.dtype, self.kv_heads, self.head_dim)
            }
            Layout::Opaque { len } => write!(f, "{} opaque, {len} bytes", self.dtype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paged_is_one_layer_of_blocks_times_block_size_tokens() {
        let desc = BlockDesc::paged(Dtype::Bf16, 4, 16, 8, 128);
        desc.validate().unwrap();
        assert_eq!(desc.layers(), 1);
        assert_eq!(desc.tokens(), 64);
        assert_eq!(desc.raw_size(), 2 * 64 * 8 * 128 * 2);
        assert_eq!(desc.row(1, 0, 3), (64 + 3) * 1024);
        assert_eq!(desc.with_tokens(17).tokens(), 32);
    }

    #[test]
    fn kv_2ltd_rows_are_k_then_v_then_layers_then_tokens() {
        let desc = BlockDesc::kv_2ltd(Dtype::F16, 2, 3, 2, 4);
        assert_eq!(desc.row(0, 0, 0), 0);
        assert_eq!(desc.row(0, 0, 1), 8);
        assert_eq!(desc.row(0, 1, 0), 24);
        assert_eq!(desc.row(1, 0, 0), 48);
        assert_eq!(desc.elements(), 96);
    }

    #[test]
    fn impossible_shapes_are_rejected() {
        assert!(BlockDesc::kv_2ltd(Dtype::Bf16, 0, 3, 2, 4).validate().is_err());
        assert!(BlockDesc::kv_2ltd(Dtype::Bf16, 1, 3, 0, 4).validate().is_err());
        assert!(BlockDesc::opaque(Dtype::F32, 6).validate().is_err());
        assert!(BlockDesc::kv_2ltd(Dtype::F32, u32::MAX, u32::MAX, u32::MAX, u32::MAX).validate().is_err());
    }
}
