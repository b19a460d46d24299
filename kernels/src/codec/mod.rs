//! The codec interface and its CPU reference implementation.

mod lossless;
mod quant;
mod select;

pub(crate) use select::softmax;

use kvhoard_format::{BlockDesc, CompressionMeta};

use crate::elem::Elements as _;
use crate::{CodecParams, CodecSpec, Dtype, Encoding, Error, KvShape, Positions, Queries};

/// One block to compress.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    /// What the bytes are.
    pub shape: KvShape,
    /// The raw bytes.
    pub data: &'a [u8],
    /// Query vectors for SnapKV, when the client has them.
    pub queries: Option<&'a Queries>,
}

impl<'a> Block<'a> {
    /// A block without queries.
    pub fn new(shape: KvShape, data: &'a [u8]) -> Block<'a> {
        Block { shape, data, queries: None }
    }
}

/// What a compressor produced: the payload's length (written at the start of the output buffer)
/// and the parameters needed to decode it.
#[derive(Clone, Debug, PartialEq)]
pub struct Compressed {
    /// Payload bytes written.
    pub len: usize,
    /// The codec's parameters and kept-token map.
    pub params: CodecParams,
    /// The block as the codec saw it.
    pub shape: KvShape,
}

impl Compressed {
    /// The record header's codec area for this payload.
    pub fn meta(&self) -> CompressionMeta {
        self.params.to_meta(&self.shape)
    }
}

/// What a decoder produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The decoded block's shape: the original with only the kept tokens.
    pub shape: KvShape,
    /// Bytes written at the start of the output buffer.
    pub len: usize,
    /// Tokens decoded; in a paged block, the rest of the last page is zeros.
    pub kept_tokens: usize,
    /// Which original token each decoded token is.
    pub positions: Positions,
}

impl Decoded {
    /// The stored description of the decoded bytes, for a block stored as `original`: the same
    /// unless tokens were dropped.
    pub fn desc(&self, original: &BlockDesc) -> BlockDesc {
        if matches!(self.positions, Positions::All) {
            original.clone()
        } else {
            self.shape.desc()
        }
    }
}

/// A codec backend. Every backend decodes every payload its parameters describe and must decode
/// it to the same bytes as [`CpuCodec`], the reference.
pub trait Codec: Send {
    /// The configuration this codec compresses with.
    fn spec(&self) -> &CodecSpec;

    /// An upper bound of the payload size for a block; size the output buffer with it.
    fn max_payload_size(&self, shape: &KvShape) -> usize;

    /// Compresses one block into `out`.
    fn compress(&mut self, block: &Block<'_>, out: &mut [u8]) -> Result<Compressed, Error>;

    /// Decodes the payload of a block compressed with `params` (`shape` is the block as the codec
    /// saw it, as [`CodecParams::decode`] returns it) into `out`, which must hold
    /// [`decoded_size`] bytes.
    fn decompress(
        &mut self,
        params: &CodecParams,
        shape: &KvShape,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<Decoded, Error>;

    /// Compresses many blocks in one call (one pass over the batch, one launch on a GPU). Each
    /// block succeeds or fails on its own.
    fn compress_batch(&mut self, blocks: &[Block<'_>], outs: &mut [&mut [u8]]) -> Vec<Result<Compressed, Error>> {
        blocks.iter().zip(outs.iter_mut()).map(|(block, out)| self.compress(block, out)).collect()
    }
}

/// Bytes a block compressed with `params` decodes to.
pub fn decoded_size(params: &CodecParams, shape: &KvShape) -> usize {
    decoded_shape(params, shape).raw_size()
}

fn decoded_shape(params: &CodecParams, shape: &KvShape) -> KvShape {
    if params.spec.drop.is_some() {
        shape.with_tokens(params.kept_tokens)
    } else {
        *shape
    }
}

/// A dense `[2, layers, tokens, channels]` view of a buffer whose token dimension holds
/// `stride_tokens` rows, of which the first `tokens` carry data (a paged block's last page may be
/// partly padding).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dense {
    pub dtype: Dtype,
    pub layers: usize,
    pub tokens: usize,
    pub stride_tokens: usize,
    pub channels: usize,
}

impl Dense {
    fn new(shape: &KvShape, tokens: usize) -> Dense {
        Dense {
            dtype: shape.dtype,
            layers: shape.layers(),
            tokens,
            stride_tokens: shape.tokens(),
            channels: shape.channels(),
        }
    }

    #[inline]
    pub fn row(&self, kv: usize, layer: usize, token: usize) -> usize {
        ((kv * self.layers + layer) * self.stride_tokens + token) * self.channels
    }
}

/// The CPU reference implementation of every codec.
pub struct CpuCodec {
    spec: CodecSpec,
    contexts: lossless::Contexts,
    gathered: Vec<u8>,
    floats: Vec<f32>,
}

impl CpuCodec {
    /// A codec compressing with `spec` (and decoding anything).
    pub fn new(spec: CodecSpec) -> Result<CpuCodec, Error> {
        spec.validate()?;
        Ok(CpuCodec { spec, contexts: lossless::Contexts::new(), gathered: Vec::new(), floats: Vec::new() })
    }

    /// Compresses with `spec` from now on, keeping the codec's contexts (a pool of codecs serves
    /// blocks of any configuration without making new contexts).
    pub fn set_spec(&mut self, spec: CodecSpec) -> Result<(), Error> {
        spec.validate()?;
        self.spec = spec;
        Ok(())
    }

    /// A codec for decoding only (any payload decodes, whatever the spec).
    pub fn decoder() -> CpuCodec {
        CpuCodec { spec: CodecSpec::RAW, contexts: lossless::Contexts::new(), gathered: Vec::new(), floats: Vec::new() }
    }

    /// Decodes a stored block: its description `desc` of `raw_len` raw bytes, its record's codec
    /// area `meta` and its `payload`, into `out`. Returns what was decoded; the stored
    /// description of the decoded bytes is [`Decoded::desc`].
    pub fn decode_stored(
        &mut self,
        desc: &BlockDesc,
        raw_len: u64,
        meta: &CompressionMeta,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<Decoded, Error> {
        let view = KvShape::of(desc, raw_len).map_err(|e| Error::Corrupt(format!("stored description: {e}")))?;
        let (params, shape) = CodecParams::decode(meta, &view)?;
        self.decompress(&params, &shape, payload, out)
    }

    fn payload_bound(spec: &CodecSpec, shape: &KvShape) -> usize {
        match spec.encoding {
            Encoding::Raw => shape.raw_size(),
            Encoding::Lossless { .. } => lossless::max_payload(shape.raw_size(), shape.dtype.size()),
            Encoding::Quant { bits, group, residual } => {
                quant::payload_size(&Dense::new(shape, shape.tokens()), quant_params(bits, group, residual))
            }
        }
    }

    /// Checks a block against this codec's spec before any work.
    fn check(&self, block: &Block<'_>) -> Result<(), Error> {
        let shape = block.shape;
        shape.validate()?;
        if block.data.len() != shape.raw_size() {
            return Err(Error::Invalid(format!(
                "a {shape} block is {} bytes, but {} were given",
                shape.raw_size(),
                block.data.len()
            )));
        }
        let spec = self.spec;
        let lossy = spec.drop.is_some() || matches!(spec.encoding, Encoding::Quant { .. });
        if lossy && !shape.is_tensor() {
            return Err(Error::Unsupported(format!(
                "{spec} needs a KV tensor of a float dtype; a {shape} block can only be stored raw or lossless"
            )));
        }
        Ok(())
    }
}

fn quant_params(bits: u8, group: u32, residual: u32) -> quant::Params {
    quant::Params { bits: bits as u32, group: group as usize, residual: residual as usize }
}

impl Codec for CpuCodec {
    fn spec(&self) -> &CodecSpec {
        &self.spec
    }

    fn max_payload_size(&self, shape: &KvShape) -> usize {
        Self::payload_bound(&self.spec, shape)
    }

    fn compress(&mut self, block: &Block<'_>, out: &mut [u8]) -> Result<Compressed, Error> {
        self.check(block)?;
        let (shape, spec) = (block.shape, self.spec);
        let mut gathered = std::mem::take(&mut self.gathered);
        let result = (|| {
            let (kept_tokens, positions, encoded_shape, input): (_, _, _, &[u8]) = match &spec.drop {
                None => (shape.tokens(), Positions::All, shape, block.data),
                Some(drop) => {
                    let (kept, positions) = select::select(drop, &shape, block.data, block.queries)?;
                    let out_shape = shape.with_tokens(kept);
                    gathered.resize(out_shape.raw_size(), 0);
                    select::gather(&shape, block.data, &positions, &Dense::new(&out_shape, kept), &mut gathered);
                    (kept, positions, out_shape, &gathered[..])
                }
            };
            let params = CodecParams { spec, kv_heads: shape.kv_heads, kept_tokens, positions };
            if params.encoded_len(shape.tokens()) > kvhoard_format::record::CODEC_PARAMS_BYTES_MAX {
                return Err(Error::Unsupported(format!(
                    "the kept-token map of {spec} on a {shape} block does not fit in a record header; \
                     use a shared selection or a smaller block"
                )));
            }
            let dense = Dense::new(&encoded_shape, kept_tokens);
            let len = match spec.encoding {
                Encoding::Raw => {
                    let have = out.len();
                    let dst = out.get_mut(..input.len()).ok_or(Error::BufferTooSmall { need: input.len(), have })?;
                    dst.copy_from_slice(input);
                    input.len()
                }
                Encoding::Lossless { level } => {
                    lossless::encode(input, shape.dtype.size(), level, out, &mut self.contexts)?
                }
                Encoding::Quant { bits, group, residual } => {
                    quant::encode(&dense, input, quant_params(bits, group, residual), out, &mut self.floats)?
                }
            };
            Ok(Compressed { len, params, shape })
        })();
        self.gathered = gathered;
        result
    }

    fn decompress(
        &mut self,
        params: &CodecParams,
        shape: &KvShape,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<Decoded, Error> {
        let decoded = decoded_shape(params, shape);
        let len = decoded.raw_size();
        let have = out.len();
        let out = out.get_mut(..len).ok_or(Error::BufferTooSmall { need: len, have })?;
        match params.spec.encoding {
            Encoding::Raw => {
                if payload.len() != len {
                    return Err(Error::corrupt("raw payload size does not match its shape"));
                }
                out.copy_from_slice(payload);
            }
            Encoding::Lossless { .. } => lossless::decode(payload, decoded.dtype.size(), out, &mut self.contexts)?,
            Encoding::Quant { bits, group, residual } => {
                let dense = Dense::new(&decoded, params.kept_tokens);
                // Padding rows of a partial last page are not in the payload.
                if dense.tokens < dense.stride_tokens {
                    out.fill(0);
                }
                quant::decode(&dense, payload, quant_params(bits, group, residual), out, &mut self.floats)?
            }
        }
        Ok(Decoded { shape: decoded, len, kept_tokens: params.kept_tokens, positions: params.positions.clone() })
    }
}
