//! A block as a codec sees it: a structured view of its description ([`BlockDesc`]).
//!
//! Both tensor layouts kvhoard understands are, to a codec, the same thing: a dense tensor
//! `[2, layers, tokens, channels]` with `channels = kv_heads * head_dim`, K before V. vLLM's
//! per-layer paged layout `[2, blocks, block_size, kv_heads, head_dim]` is that tensor with one
//! layer and `blocks * block_size` tokens; the page size only matters to codecs that drop pages.
//! LMCache's `KV_2LTD` shape `[2, layers, tokens, hidden]` does not say how `hidden` splits into
//! heads: its view has one head of `hidden` channels unless the caller knows better
//! ([`KvShape::with_heads`]). Every other layout, and any dtype that is not a float, is opaque
//! bytes to a codec: only the lossless codecs take it.

use kvhoard_format::{BlockDesc, Dtype, Layout};

use crate::elem::Elements as _;
use crate::Error;

/// Largest block a codec accepts (raw bytes): far above any KV chunk, and small enough that no
/// size computation can overflow.
pub const MAX_RAW_BYTES: u64 = 1 << 40;

/// The layout of a block as a codec sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KvLayout {
    /// LMCache's `KV_2LTD`: `[2, layers, tokens, kv_heads * head_dim]`.
    Kv2ltd {
        /// Layers.
        layers: u32,
        /// Tokens.
        tokens: u32,
    },
    /// vLLM's per-layer paged cache: `[2, blocks, block_size, kv_heads, head_dim]`.
    Paged {
        /// Pages.
        blocks: u32,
        /// Tokens per page.
        block_size: u32,
    },
    /// Bytes without a known tensor structure; only lossless codecs apply.
    Opaque {
        /// Bytes.
        len: u64,
    },
}

/// A block's description as a codec sees it: enough to interpret its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct KvShape {
    /// Element type.
    pub dtype: Dtype,
    /// Layout.
    pub layout: KvLayout,
    /// KV heads per layer (1 for an opaque block).
    pub kv_heads: u32,
    /// Channels per head (1 for an opaque block).
    pub head_dim: u32,
}

impl KvShape {
    /// An LMCache `KV_2LTD` block of `kv_heads` heads of `head_dim` channels.
    pub fn kv_2ltd(dtype: Dtype, layers: u32, tokens: u32, kv_heads: u32, head_dim: u32) -> Self {
        KvShape { dtype, layout: KvLayout::Kv2ltd { layers, tokens }, kv_heads, head_dim }
    }

    /// A vLLM paged block.
    pub fn paged(dtype: Dtype, blocks: u32, block_size: u32, kv_heads: u32, head_dim: u32) -> Self {
        KvShape { dtype, layout: KvLayout::Paged { blocks, block_size }, kv_heads, head_dim }
    }

    /// `len` bytes of `dtype` elements without a tensor structure.
    pub fn opaque(dtype: Dtype, len: u64) -> Self {
        KvShape { dtype, layout: KvLayout::Opaque { len }, kv_heads: 1, head_dim: 1 }
    }

    /// Checks that the shape is possible: nonzero dimensions, a whole number of elements, and a
    /// size below [`MAX_RAW_BYTES`].
    pub fn validate(&self) -> Result<(), Error> {
        let size = match self.layout {
            KvLayout::Opaque { len } => {
                if !len.is_multiple_of(self.dtype.size() as u64) {
                    return Err(Error::Invalid(format!(
                        "an opaque {} block must hold whole elements; {len} bytes do not",
                        self.dtype
                    )));
                }
                len
            }
            KvLayout::Kv2ltd { layers, tokens } => self.tensor_size(&[layers, tokens], "layers and tokens")?,
            KvLayout::Paged { blocks, block_size } => {
                self.tensor_size(&[blocks, block_size], "blocks and block_size")?
            }
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

    /// Whether the block is a KV tensor (codecs other than lossless need one).
    pub fn is_tensor(&self) -> bool {
        !matches!(self.layout, KvLayout::Opaque { .. })
    }

    /// Layers in the dense view (1 for a paged layer or an opaque block).
    pub fn layers(&self) -> usize {
        match self.layout {
            KvLayout::Kv2ltd { layers, .. } => layers as usize,
            KvLayout::Paged { .. } | KvLayout::Opaque { .. } => 1,
        }
    }

    /// Tokens in the dense view.
    pub fn tokens(&self) -> usize {
        match self.layout {
            KvLayout::Kv2ltd { tokens, .. } => tokens as usize,
            KvLayout::Paged { blocks, block_size } => blocks as usize * block_size as usize,
            KvLayout::Opaque { .. } => 0,
        }
    }

    /// KV heads per layer.
    pub fn heads(&self) -> usize {
        self.kv_heads as usize
    }

    /// Channels per head.
    pub fn head_dim(&self) -> usize {
        self.head_dim as usize
    }

    /// Channels per token row: `kv_heads * head_dim`.
    pub fn channels(&self) -> usize {
        self.kv_heads as usize * self.head_dim as usize
    }

    /// Elements of the whole block.
    pub fn elements(&self) -> usize {
        match self.layout {
            KvLayout::Opaque { len } => len as usize / self.dtype.size(),
            _ => 2 * self.layers() * self.tokens() * self.channels(),
        }
    }

    /// Bytes of the whole block.
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
    pub fn with_tokens(&self, tokens: usize) -> KvShape {
        let layout = match self.layout {
            KvLayout::Kv2ltd { layers, .. } => KvLayout::Kv2ltd { layers, tokens: tokens as u32 },
            KvLayout::Paged { block_size, .. } => {
                KvLayout::Paged { blocks: tokens.div_ceil(block_size as usize) as u32, block_size }
            }
            opaque @ KvLayout::Opaque { .. } => opaque,
        };
        KvShape { layout, ..*self }
    }

    /// The same `KV_2LTD` block with its channels split into `kv_heads` heads (LMCache's shape
    /// does not say how many there are). Paged blocks say it themselves, and opaque blocks have
    /// none: both are returned unchanged when `kv_heads` is what they have.
    pub fn with_heads(&self, kv_heads: u32) -> Result<KvShape, Error> {
        let channels = self.kv_heads.saturating_mul(self.head_dim);
        match self.layout {
            KvLayout::Kv2ltd { .. } if kv_heads > 0 && channels.is_multiple_of(kv_heads) => {
                Ok(KvShape { kv_heads, head_dim: channels / kv_heads, ..*self })
            }
            _ if kv_heads == self.kv_heads => Ok(*self),
            _ => Err(Error::Invalid(format!("{self} cannot be split into {kv_heads} heads"))),
        }
    }

    /// The view of a stored block's description whose raw bytes are `raw_len` long. Tensor
    /// layouts of a float dtype become tensors; everything else is opaque bytes of its dtype.
    /// Fails if the description does not describe `raw_len` bytes.
    pub fn of(desc: &BlockDesc, raw_len: u64) -> Result<KvShape, Error> {
        desc.validate(raw_len).map_err(|e| Error::Invalid(e.to_string()))?;
        let dim = |i: usize| -> Result<u32, Error> {
            let d = desc.shape.get(i).copied().unwrap_or(0);
            u32::try_from(d).map_err(|_| Error::Invalid(format!("dimension {i} of {desc} is too large")))
        };
        let shape = match desc.layout {
            Layout::Kv2Ltd if desc.dtype.is_float() && dim(0)? == 2 => {
                KvShape::kv_2ltd(desc.dtype, dim(1)?, dim(2)?, 1, dim(3)?)
            }
            Layout::VllmPaged if desc.dtype.is_float() && dim(0)? == 2 => {
                KvShape::paged(desc.dtype, dim(1)?, dim(2)?, dim(3)?, dim(4)?)
            }
            _ => KvShape::opaque(desc.dtype, raw_len),
        };
        shape.validate()?;
        Ok(shape)
    }

    /// The description of this view as it is stored: `KV_2LTD` and paged tensors as such, opaque
    /// bytes as `[elements]` of their dtype.
    pub fn desc(&self) -> BlockDesc {
        let shape = match self.layout {
            KvLayout::Kv2ltd { layers, tokens } => {
                vec![2, u64::from(layers), u64::from(tokens), u64::from(self.kv_heads) * u64::from(self.head_dim)]
            }
            KvLayout::Paged { blocks, block_size } => {
                vec![2, u64::from(blocks), u64::from(block_size), u64::from(self.kv_heads), u64::from(self.head_dim)]
            }
            KvLayout::Opaque { len } => vec![len / self.dtype.size_bytes()],
        };
        let layout = match self.layout {
            KvLayout::Kv2ltd { .. } => Layout::Kv2Ltd,
            KvLayout::Paged { .. } => Layout::VllmPaged,
            KvLayout::Opaque { .. } => Layout::Opaque,
        };
        BlockDesc { dtype: self.dtype, layout, shape }
    }

    /// Page size for page-dropping codecs: the paged layout's block size, else `default`.
    pub fn page_size(&self, default: usize) -> usize {
        match self.layout {
            KvLayout::Paged { block_size, .. } => block_size as usize,
            _ => default,
        }
    }
}

impl TryFrom<&BlockDesc> for KvShape {
    type Error = Error;

    /// The view of a description that has a shape (so that its length is known); an opaque
    /// description without one needs [`KvShape::of`] and the length.
    fn try_from(desc: &BlockDesc) -> Result<KvShape, Error> {
        let len = desc.shape_bytes().ok_or_else(|| {
            Error::Invalid(format!("{desc} has no shape to take its length from; give the length (KvShape::of)"))
        })?;
        KvShape::of(desc, len)
    }
}

impl std::fmt::Display for KvShape {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.layout {
            KvLayout::Kv2ltd { layers, tokens } => {
                write!(f, "{} KV_2LTD [2, {layers}, {tokens}, {}x{}]", self.dtype, self.kv_heads, self.head_dim)
            }
            KvLayout::Paged { blocks, block_size } => {
                write!(f, "{} paged [2, {blocks}, {block_size}, {}, {}]", self.dtype, self.kv_heads, self.head_dim)
            }
            KvLayout::Opaque { len } => write!(f, "{} opaque, {len} bytes", self.dtype),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvhoard_format::{BlockDesc, Dtype, Layout};

    #[test]
    fn paged_is_one_layer_of_blocks_times_block_size_tokens() {
        let desc = KvShape::paged(Dtype::Bf16, 4, 16, 8, 128);
        desc.validate().unwrap();
        assert_eq!(desc.layers(), 1);
        assert_eq!(desc.tokens(), 64);
        assert_eq!(desc.raw_size(), 2 * 64 * 8 * 128 * 2);
        assert_eq!(desc.row(1, 0, 3), (64 + 3) * 1024);
        assert_eq!(desc.with_tokens(17).tokens(), 32);
    }

    #[test]
    fn kv_2ltd_rows_are_k_then_v_then_layers_then_tokens() {
        let desc = KvShape::kv_2ltd(Dtype::F16, 2, 3, 2, 4);
        assert_eq!(desc.row(0, 0, 0), 0);
        assert_eq!(desc.row(0, 0, 1), 8);
        assert_eq!(desc.row(0, 1, 0), 24);
        assert_eq!(desc.row(1, 0, 0), 48);
        assert_eq!(desc.elements(), 96);
    }

    #[test]
    fn stored_descriptions_convert_both_ways() {
        let lmcache = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, 4, 256, 1024] };
        let shape = KvShape::of(&lmcache, 2 * 4 * 256 * 1024 * 2).unwrap();
        assert_eq!(shape, KvShape::kv_2ltd(Dtype::Bf16, 4, 256, 1, 1024));
        assert_eq!(shape.desc(), lmcache);
        let split = shape.with_heads(8).unwrap();
        assert_eq!((split.heads(), split.head_dim()), (8, 128));
        assert_eq!(split.desc(), lmcache);
        assert!(shape.with_heads(3).is_err());
        let paged = BlockDesc { dtype: Dtype::F16, layout: Layout::VllmPaged, shape: vec![2, 4, 16, 8, 128] };
        let view = KvShape::of(&paged, 2 * 4 * 16 * 8 * 128 * 2).unwrap();
        assert_eq!(view, KvShape::paged(Dtype::F16, 4, 16, 8, 128));
        assert_eq!(view.desc(), paged);
        // Not a float, or not a KV layout: opaque bytes.
        let ints = BlockDesc { dtype: Dtype::U8, ..lmcache.clone() };
        assert!(!KvShape::of(&ints, 2 * 4 * 256 * 1024).unwrap().is_tensor());
        assert_eq!(KvShape::of(&BlockDesc::opaque(), 77).unwrap(), KvShape::opaque(Dtype::Bytes, 77));
        assert!(KvShape::of(&lmcache, 5).is_err());
    }

    #[test]
    fn impossible_shapes_are_rejected() {
        assert!(KvShape::kv_2ltd(Dtype::Bf16, 0, 3, 2, 4).validate().is_err());
        assert!(KvShape::kv_2ltd(Dtype::Bf16, 1, 3, 0, 4).validate().is_err());
        assert!(KvShape::opaque(Dtype::F32, 6).validate().is_err());
        assert!(KvShape::kv_2ltd(Dtype::F32, u32::MAX, u32::MAX, u32::MAX, u32::MAX).validate().is_err());
    }
}
