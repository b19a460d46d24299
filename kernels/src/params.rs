//! The parameters of a compressed block, as they are stored: in its record header's codec area
//! (`CompressionMeta { codec_id: CODEC_KV, codec_version: 1, params }`), the one place a stored
//! block's codec parameters live (docs/decisions/0003-codec-parameters-live-in-the-record-header.md).
//! The record header says what the raw block is (its description) and guards these bytes with its
//! checksum; the payload that follows is the bare codec output.
//!
//! ```text
//! offset size  field (little endian)
//!      0    1  encoding: 0 raw, 1 lossless, 2 quant
//!      1    1  drop method: 0 none, 1 knorm, 2 keydiff, 3 streaming, 4 paged, 5 snapkv
//!      2    1  flags: bit 0 per-head selection; other bits zero
//!      3    1  zero
//!      4    4  kv_heads the codec split each token's channels into
//!      8   12  encoding parameters: level (i32) | bits, group, residual (u32 each)
//!     20    4  keep fraction (f32)
//!     24    4  drop parameter (sink, page or pool)
//!     28    4  kept tokens
//!     32    4  selections: 0 without dropping, 1 shared, layers x kv_heads per head
//!     36    .  one bitmap of ceil(tokens / 8) bytes per selection, bit t of byte t / 8 set
//!              when token t is kept
//! ```
//!
//! Decoding checks every field against the block it describes and never panics: these bytes come
//! from disk.

#![deny(clippy::indexing_slicing, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use kvhoard_format::bytes::{Reader, Writer};
use kvhoard_format::{CompressionMeta, FormatError};

use crate::spec::{DropMethod, DropSpec, Encoding};
use crate::{CodecSpec, Error, KvShape, Positions};

/// Version of this encoding, stored as the codec area's `codec_version`.
pub const VERSION: u16 = 1;
/// Bytes before the bitmaps.
pub const FIXED_BYTES: usize = 36;
const WHAT: &str = "codec parameters";

/// Everything needed, besides the block's description, to decode a compressed block.
#[derive(Clone, Debug, PartialEq)]
pub struct CodecParams {
    /// The codec configuration.
    pub spec: CodecSpec,
    /// KV heads the codec split each token's channels into (1 for opaque blocks, and for
    /// `KV_2LTD` blocks whose heads the caller did not give).
    pub kv_heads: u32,
    /// Tokens kept (all of them without a drop stage).
    pub kept_tokens: usize,
    /// Which tokens were kept.
    pub positions: Positions,
}

impl CodecParams {
    /// Bytes of the encoding for a block of `tokens` tokens.
    pub fn encoded_len(&self, tokens: usize) -> usize {
        FIXED_BYTES + self.positions.selections() * bitmap_len(tokens)
    }

    /// The codec area of the record header of a block compressed with these parameters; `shape`
    /// is the block as the codec saw it.
    pub fn to_meta(&self, shape: &KvShape) -> CompressionMeta {
        CompressionMeta { codec_id: CompressionMeta::CODEC_KV, codec_version: VERSION, params: self.encode(shape) }
    }

    /// Encodes the parameters of a block of shape `shape`.
    pub fn encode(&self, shape: &KvShape) -> Vec<u8> {
        let tokens = shape.tokens();
        let mut w = Writer::with_capacity(self.encoded_len(tokens));
        let drop = self.spec.drop;
        w.u8(self.spec.encoding.id());
        w.u8(drop.map_or(0, |d| d.method.id()));
        w.u8(u8::from(drop.is_some_and(|d| d.per_head)));
        w.u8(0);
        w.u32(self.kv_heads);
        let (p0, p1, p2) = match self.spec.encoding {
            Encoding::Raw => (0, 0, 0),
            Encoding::Lossless { level } => (level as u32, 0, 0),
            Encoding::Quant { bits, group, residual } => (u32::from(bits), group, residual),
        };
        w.u32(p0);
        w.u32(p1);
        w.u32(p2);
        w.bytes(&drop.map_or(0f32, |d| d.keep_fraction).to_le_bytes());
        w.u32(drop.map_or(0, |d| d.method.param()));
        w.u32(self.kept_tokens as u32);
        w.u32(self.positions.selections() as u32);
        let stride = bitmap_len(tokens);
        let mut mark = |kept: &[u32]| {
            let mut bitmap = vec![0u8; stride];
            for &t in kept {
                if let Some(byte) = bitmap.get_mut(t as usize / 8) {
                    *byte |= 1 << (t % 8);
                }
            }
            w.bytes(&bitmap);
        };
        match &self.positions {
            Positions::All => {}
            Positions::Shared(kept) => mark(kept),
            Positions::PerHead { kept, .. } => kept.chunks(self.kept_tokens.max(1)).for_each(&mut mark),
        }
        w.buf
    }

    /// Decodes the codec area `meta` of a block whose description is viewed as `shape`, checking
    /// every field against it. Returns the parameters and the shape the codec saw (`shape` with
    /// the channels split into the stored number of heads).
    pub fn decode(meta: &CompressionMeta, shape: &KvShape) -> Result<(CodecParams, KvShape), Error> {
        if meta.codec_id != CompressionMeta::CODEC_KV {
            return Err(Error::Unsupported(format!(
                "codec {} is not kvhoard's KV codec; this build cannot decode it",
                CompressionMeta::codec_name(meta.codec_id)
            )));
        }
        if meta.codec_version != VERSION {
            return Err(Error::Unsupported(format!(
                "KV codec parameters of version {} (this build reads {VERSION}); upgrade kvhoard",
                meta.codec_version
            )));
        }
        decode_fields(&meta.params, shape).map_err(|e| match e {
            Decode::Format(e) => Error::Corrupt(format!("{e}")),
            Decode::Field(why) => Error::Corrupt(why.to_string()),
        })
    }
}

/// What kind of codec stored a block, for statistics: read from the first bytes of its codec
/// area alone, without its description. One byte: 0 raw (no codec), 1 lossless, 2 quant, 3
/// dropping then raw, 4 dropping then lossless, 5 dropping then quant, 255 unknown.
pub fn codec_class(meta: &CompressionMeta) -> u8 {
    if meta.codec_id == CompressionMeta::CODEC_NONE {
        return 0;
    }
    if meta.codec_id != CompressionMeta::CODEC_KV || meta.codec_version != VERSION {
        return CLASS_UNKNOWN;
    }
    let (Some(&encoding), Some(&drop)) = (meta.params.first(), meta.params.get(1)) else { return CLASS_UNKNOWN };
    match (encoding, drop != 0) {
        (0..=2, false) => encoding,
        (0..=2, true) => 3 + encoding,
        _ => CLASS_UNKNOWN,
    }
}

/// [`codec_class`] of a block whose codec this build does not know.
pub const CLASS_UNKNOWN: u8 = 255;

/// The name of a [`codec_class`].
pub fn class_name(class: u8) -> &'static str {
    match class {
        0 => "raw",
        1 => "lossless",
        2 => "quant",
        3 => "drop",
        4 => "drop+lossless",
        5 => "drop+quant",
        _ => "unknown",
    }
}

/// Why the bytes are not valid parameters: the reader ran out, or a field is out of range.
enum Decode {
    Format(FormatError),
    Field(&'static str),
}

impl From<FormatError> for Decode {
    fn from(e: FormatError) -> Self {
        Decode::Format(e)
    }
}

fn decode_fields(bytes: &[u8], shape: &KvShape) -> Result<(CodecParams, KvShape), Decode> {
    let mut r = Reader::new(WHAT, bytes);
    let encoding_id = r.u8()?;
    let drop_id = r.u8()?;
    let flags = r.u8()?;
    if flags & !1 != 0 || r.u8()? != 0 {
        return Err(Decode::Field("reserved bits set"));
    }
    let kv_heads = r.u32()?;
    let shape = shape.with_heads(kv_heads).map_err(|_| Decode::Field("kv_heads do not divide the block"))?;
    let (p0, p1, p2) = (r.u32()?, r.u32()?, r.u32()?);
    let encoding = match encoding_id {
        0 => Encoding::Raw,
        1 => Encoding::Lossless { level: p0 as i32 },
        2 => Encoding::Quant {
            bits: u8::try_from(p0).map_err(|_| Decode::Field("quant bits out of range"))?,
            group: p1,
            residual: p2,
        },
        _ => return Err(Decode::Field("unknown encoding")),
    };
    let keep_fraction = f32::from_le_bytes(r.array()?);
    let drop_param = r.u32()?;
    let drop = match drop_id {
        0 => None,
        id => Some(DropSpec {
            method: DropMethod::from_id(id, drop_param).ok_or(Decode::Field("unknown drop method"))?,
            keep_fraction,
            per_head: flags & 1 != 0,
        }),
    };
    let spec = CodecSpec { drop, encoding };
    spec.validate().map_err(|_| Decode::Field("invalid codec parameters"))?;
    if drop.is_some() && !shape.is_tensor() {
        return Err(Decode::Field("a drop stage on an opaque block"));
    }
    if matches!(encoding, Encoding::Quant { .. }) && !shape.is_tensor() {
        return Err(Decode::Field("quantization of an opaque block"));
    }
    let tokens = shape.tokens();
    let kept_tokens = r.u32()? as usize;
    let selections = r.u32()? as usize;
    let expected = match drop {
        None => 0,
        Some(d) if d.per_head => shape.layers() * shape.heads(),
        Some(_) => 1,
    };
    if selections != expected {
        return Err(Decode::Field("selection count does not match the codec"));
    }
    if drop.is_none() && kept_tokens != tokens {
        return Err(Decode::Field("kept tokens without a drop stage"));
    }
    if drop.is_some() && (kept_tokens == 0 || kept_tokens > tokens) {
        return Err(Decode::Field("kept tokens out of range"));
    }
    let stride = bitmap_len(tokens);
    if r.remaining() != selections.saturating_mul(stride) {
        return Err(Decode::Field("length does not match its selections"));
    }
    let mut kept = Vec::with_capacity(selections.saturating_mul(kept_tokens));
    for _ in 0..selections {
        let before = kept.len();
        for (byte_index, &byte) in r.take(stride)?.iter().enumerate() {
            let mut bits = byte;
            while bits != 0 {
                let t = byte_index * 8 + bits.trailing_zeros() as usize;
                bits &= bits - 1;
                if t >= tokens {
                    return Err(Decode::Field("kept token beyond the block"));
                }
                kept.push(t as u32);
            }
        }
        if kept.len() - before != kept_tokens {
            return Err(Decode::Field("a selection keeps the wrong number of tokens"));
        }
    }
    let positions = match drop {
        None => Positions::All,
        Some(d) if d.per_head => Positions::PerHead { layers: shape.layers(), heads: shape.heads(), kept },
        Some(_) => Positions::Shared(kept),
    };
    Ok((CodecParams { spec, kv_heads, kept_tokens, positions }, shape))
}

/// Bytes of one kept-token bitmap.
pub(crate) fn bitmap_len(tokens: usize) -> usize {
    tokens.div_ceil(8)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use kvhoard_format::Dtype;

    fn shape() -> KvShape {
        KvShape::kv_2ltd(Dtype::Bf16, 2, 12, 2, 4)
    }

    fn dropping() -> CodecParams {
        CodecParams {
            spec: CodecSpec::parse("drop-paged:keep=0.5,page=4+quant:bits=4,group=32,residual=2").unwrap(),
            kv_heads: 2,
            kept_tokens: 8,
            positions: Positions::Shared(vec![0, 1, 2, 3, 8, 9, 10, 11]),
        }
    }

    /// Every byte of the codec area, from the layout in the module documentation.
    #[test]
    fn golden_bytes_match_the_spec() {
        let mut expected = vec![2, 4, 0, 0];
        for v in [2u32, 4, 32, 2] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        expected.extend_from_slice(&0.5f32.to_le_bytes());
        for v in [4u32, 8, 1] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        expected.extend_from_slice(&[0b0000_1111, 0b0000_1111]);
        let params = dropping();
        assert_eq!(params.encode(&shape()), expected);
        assert_eq!(params.encoded_len(12), expected.len());
        let meta = params.to_meta(&shape());
        assert_eq!((meta.codec_id, meta.codec_version), (1, 1));
        // The stored description says nothing of heads; the parameters bring them back.
        let stored = KvShape::kv_2ltd(Dtype::Bf16, 2, 12, 1, 8);
        assert_eq!(CodecParams::decode(&meta, &stored).unwrap(), (params, shape()));
    }

    #[test]
    fn parameters_without_dropping_have_no_bitmap() {
        let params =
            CodecParams { spec: CodecSpec::lossless(3), kv_heads: 1, kept_tokens: 12, positions: Positions::All };
        let bytes = params.encode(&shape());
        assert_eq!(bytes.len(), FIXED_BYTES);
        assert_eq!(&bytes[..4], &[1, 0, 0, 0]);
        assert_eq!(&bytes[8..12], &3u32.to_le_bytes());
        let stored = KvShape::kv_2ltd(Dtype::Bf16, 2, 12, 1, 8);
        assert_eq!(CodecParams::decode(&params.to_meta(&stored), &stored).unwrap().0, params);
    }

    #[test]
    fn every_truncation_and_flipped_bit_is_refused_or_decodes_consistently() {
        let meta = dropping().to_meta(&shape());
        for cut in 0..meta.params.len() {
            let cut_meta = CompressionMeta { params: meta.params[..cut].to_vec(), ..meta.clone() };
            assert!(CodecParams::decode(&cut_meta, &shape()).is_err(), "cut at {cut}");
        }
        for byte in 0..meta.params.len() {
            for bit in 0..8 {
                let mut bad = meta.clone();
                bad.params[byte] ^= 1 << bit;
                // A flip may give other valid parameters (a keep fraction, a group size); then
                // they must describe the block consistently. The record's checksum catches the
                // flip on disk; this only asks that nothing panics or lies about the shape.
                if let Ok((p, s)) = CodecParams::decode(&bad, &shape()) {
                    assert_eq!(s.layers(), 2);
                    assert!(p.kept_tokens <= 12);
                }
            }
        }
    }

    #[test]
    fn other_codecs_and_versions_are_refused_with_a_reason() {
        let meta = dropping().to_meta(&shape());
        let other = CompressionMeta { codec_id: 9, ..meta.clone() };
        assert!(CodecParams::decode(&other, &shape()).unwrap_err().to_string().contains("codec-9"));
        let newer = CompressionMeta { codec_version: 2, ..meta };
        assert!(CodecParams::decode(&newer, &shape()).unwrap_err().to_string().contains("upgrade"));
    }
}
