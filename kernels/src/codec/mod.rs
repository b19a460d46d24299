//! The codec interface and its CPU reference implementation.

mod lossless;
mod quant;
mod select;
mod spec;

pub(crate) use select::softmax;
pub use spec::{CodecSpec, DropMethod, DropSpec, Encoding};

use crate::frame::{self, Header};
use crate::{BlockDesc, Dtype, Error, Queries};

/// One block to compress.
#[derive(Clone, Copy, Debug)]
pub struct Block<'a> {
    pub desc: BlockDesc,
    pub data: &'a [u8],
    /// Query vectors for SnapKV, when the client has them.
    pub queries: Option<&'a Queries>,
}

impl<'a> Block<'a> {
    pub fn new(desc: BlockDesc, data: &'a [u8]) -> Block<'a> {
        Block { desc, data, queries: None }
    }
}

/// Which original token each decoded token is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Positions {
    /// Nothing was dropped: decoded token `i` is token `i`.
    All,
    /// One kept set for all layers and heads, ascending.
    Shared(Vec<u32>),
    /// A kept set per layer and KV head, `kept[(layer * heads + head) * kept_tokens + i]`.
    PerHead { layers: usize, heads: usize, kept: Vec<u32> },
}

impl Positions {
    /// The original position of decoded token `index` of `(layer, head)`.
    pub fn position(&self, layer: usize, head: usize, kept_tokens: usize, index: usize) -> usize {
        match self {
            Positions::All => index,
            Positions::Shared(kept) => kept[index] as usize,
            Positions::PerHead { heads, kept, .. } => kept[(layer * heads + head) * kept_tokens + index] as usize,
        }
    }
}

/// What a decoder produced.
#[derive(Clone, Debug, PartialEq)]
pub struct Decoded {
    /// The decoded block's shape: the original with only the kept tokens.
    pub desc: BlockDesc,
    /// Bytes written at the start of the output buffer.
    pub len: usize,
    /// Tokens decoded; in a paged block, the rest of the last page is zeros.
    pub kept_tokens: usize,
    pub positions: Positions,
}

/// A codec backend. Every backend reads every frame (frames describe themselves) and must decode
/// a frame to the same bytes as [`CpuCodec`], the reference.
pub trait Codec: Send {
    /// The configuration this codec compresses with.
    fn spec(&self) -> &CodecSpec;

    /// An upper bound of the frame size for a block; size the output buffer with it.
    fn max_stored_size(&self, desc: &BlockDesc) -> usize;

    /// Compresses one block into `out`, returning the frame's length.
    fn compress(&mut self, block: &Block<'_>, out: &mut [u8]) -> Result<usize, Error>;

    /// Decodes a frame into `out`, which must hold [`decoded_size`] bytes.
    fn decompress(&mut self, frame: &[u8], out: &mut [u8]) -> Result<Decoded, Error>;

    /// Compresses many blocks in one call (one pass over the batch, one launch on a GPU). Each
    /// block succeeds or fails on its own.
    fn compress_batch(&mut self, blocks: &[Block<'_>], outs: &mut [&mut [u8]]) -> Vec<Result<usize, Error>> {
        blocks.iter().zip(outs.iter_mut()).map(|(block, out)| self.compress(block, out)).collect()
    }

    /// Decodes many frames in one call.
    fn decompress_batch(&mut self, frames: &[&[u8]], outs: &mut [&mut [u8]]) -> Vec<Result<Decoded, Error>> {
        frames.iter().zip(outs.iter_mut()).map(|(frame, out)| self.decompress(frame, out)).collect()
    }
}

/// Bytes a frame decodes to.
pub fn decoded_size(frame: &[u8]) -> Result<usize, Error> {
    Ok(Header::read(frame)?.decoded_desc().raw_size())
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
    fn new(desc: &BlockDesc, tokens: usize) -> Dense {
        Dense {
            dtype: desc.dtype,
            layers: desc.layers(),
            tokens,
            stride_tokens: desc.tokens(),
            channels: desc.channels(),
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
    pub fn new(spec: CodecSpec) -> Result<CpuCodec, Error> {
        spec.validate()?;
        Ok(CpuCodec { spec, contexts: lossless::Contexts::new(), gathered: Vec::new(), floats: Vec::new() })
    }

    /// A codec for reading frames only (any frame decodes, whatever the spec).
    pub fn decoder() -> CpuCodec {
        CpuCodec { spec: CodecSpec::RAW, contexts: lossless::Contexts::new(), gathered: Vec::new(), floats: Vec::new() }
    }

    fn header_bound(&self, desc: &BlockDesc) -> usize {
        let selections = match self.spec.drop {
            None => 0,
            Some(d) if d.per_head => desc.layers() * desc.heads(),
            Some(_) => 1,
        };
        72 + selections * frame::bitmap_len(desc.tokens()) + 4
    }

    fn payload_bound(spec: &CodecSpec, desc: &BlockDesc) -> usize {
        match spec.encoding {
            Encoding::Raw => desc.raw_size(),
            Encoding::Lossless { .. } => lossless::max_payload(desc.raw_size(), desc.dtype.size()),
            Encoding::Quant { bits, group, residual } => {
                quant::payload_size(&Dense::new(desc, desc.tokens()), quant_params(bits, group, residual))
            }
        }
    }
}

fn quant_params(bits: u8, group: u32, residual: u32) -> quant::Params {
    quant::Params { bits: bits as u32, group: group as usize, residual: residual as usize }
}

impl Codec for CpuCodec {
    fn spec(&self) -> &CodecSpec {
        &self.spec
    }

    fn max_stored_size(&self, desc: &BlockDesc) -> usize {
        self.header_bound(desc) + Self::payload_bound(&self.spec, desc)
    }

    fn compress(&mut self, block: &Block<'_>, out: &mut [u8]) -> Result<usize, Error> {
        let desc = block.desc;
        desc.validate()?;
        if block.data.len() != desc.raw_size() {
            return Err(Error::Invalid(format!(
                "a {desc} block is {} bytes, but {} were given",
                desc.raw_size(),
                block.data.len()
            )));
        }
        let spec = self.spec;
        if !desc.is_tensor() && (spec.drop.is_some() || matches!(spec.encoding, Encoding::Quant { .. })) {
            return Err(Error::Unsupported(format!(
                "{spec} needs a KV tensor layout; an opaque block can only be stored raw or lossless"
            )));
        }
        let mut gathered = std::mem::take(&mut self.gathered);
        let result = (|| {
            let (kept_tokens, positions, encoded_desc, input): (_, _, _, &[u8]) = match &spec.drop {
                None => (desc.tokens(), Positions::All, desc, block.data),
                Some(drop) => {
                    let (kept, positions) = select::select(drop, &desc, block.data, block.queries)?;
                    let out_desc = desc.with_tokens(kept);
                    gathered.resize(out_desc.raw_size(), 0);
                    select::gather(&desc, block.data, &positions, &Dense::new(&out_desc, kept), &mut gathered);
                    (kept, positions, out_desc, &gathered[..])
                }
            };
            let mut header = Header { spec, desc, kept_tokens, positions, payload_len: 0, payload_crc: 0 };
            let header_len = header.encoded_len();
            if out.len() < header_len {
                return Err(Error::BufferTooSmall { need: self.max_stored_size(&desc), have: out.len() });
            }
            let payload_out = &mut out[header_len..];
            let dense = Dense::new(&encoded_desc, kept_tokens);
            let payload_len = match spec.encoding {
                Encoding::Raw => {
                    if payload_out.len() < input.len() {
                        return Err(Error::BufferTooSmall { need: header_len + input.len(), have: out.len() });
                    }
                    payload_out[..input.len()].copy_from_slice(input);
                    input.len()
                }
                Encoding::Lossless { level } => {
                    lossless::encode(input, desc.dtype.size(), level, payload_out, &mut self.contexts)?
                }
                Encoding::Quant { bits, group, residual } => {
                    quant::encode(&dense, input, quant_params(bits, group, residual), payload_out, &mut self.floats)?
                }
            };
            header.payload_len = payload_len as u64;
            header.payload_crc = crc32c::crc32c(&out[header_len..header_len + payload_len]);
            header.write(out);
            Ok(header_len + payload_len)
        })();
        self.gathered = gathered;
        result
    }

    fn decompress(&mut self, frame: &[u8], out: &mut [u8]) -> Result<Decoded, Error> {
        let (header, payload) = frame::parse(frame)?;
        let desc = header.decoded_desc();
        let len = desc.raw_size();
        if out.len() < len {
            return Err(Error::BufferTooSmall { need: len, have: out.len() });
        }
        let out = &mut out[..len];
        match header.spec.encoding {
            Encoding::Raw => {
                if payload.len() != len {
                    return Err(Error::Corrupt("raw payload size does not match its shape"));
                }
                out.copy_from_slice(payload);
            }
            Encoding::Lossless { .. } => lossless::decode(payload, desc.dtype.size(), out, &mut self.contexts)?,
            Encoding::Quant { bits, group, residual } => {
                let dense = Dense::new(&desc, header.kept_tokens);
                // Padding rows of a partial last page are not in the payload.
                if dense.tokens < dense.stride_tokens {
                    out.fill(0);
                }
                quant::decode(&dense, payload, quant_params(bits, group, residual), out, &mut self.floats)?
            }
        }
        Ok(Decoded { desc, len, kept_tokens: header.kept_tokens, positions: header.positions })
    }
}
