//! The frame a codec writes: a header that describes the codec, its parameters, the block and
//! the kept tokens, then the payload.
//!
//! ```text
//! offset size  field (little endian)
//!      0    4  magic "KVZC"
//!      4    1  version (1)
//!      5    1  encoding: 0 raw, 1 lossless, 2 quant
//!      6    1  drop method: 0 none, 1 knorm, 2 keydiff, 3 streaming, 4 paged, 5 snapkv
//!      7    1  flags: bit 0 per-head selection; other bits zero
//!      8    4  header length, checksum included
//!     12    8  payload length
//!     20    4  payload crc32c
//!     24    1  dtype code
//!     25    1  layout: 1 KV_2LTD, 2 paged, 3 opaque
//!     26    2  zero
//!     28    4  kv_heads
//!     32    4  head_dim
//!     36    8  layers and tokens (KV_2LTD), blocks and block_size (paged) as two u32,
//!              or the length in bytes (opaque) as one u64
//!     44   12  encoding parameters: level (i32) | bits, group, residual (u32 each)
//!     56    4  keep fraction (f32)
//!     60    4  drop parameter (sink, page or pool)
//!     64    4  kept tokens
//!     68    4  selections: 0 without dropping, 1 shared, layers x kv_heads per head
//!     72    .  one bitmap of ceil(tokens / 8) bytes per selection, bit t of byte t / 8 set
//!              when token t is kept
//!      .    4  crc32c of the header bytes before it
//! ```
//!
//! The header describes the block as it was given to the codec; the decoded block is that block
//! with only the kept tokens ([`BlockDesc::with_tokens`]).

use crate::codec::{DropSpec, Positions};
use crate::{BlockDesc, CodecSpec, DropMethod, Dtype, Encoding, Error, Layout};

pub const MAGIC: [u8; 4] = *b"KVZC";
pub const VERSION: u8 = 1;
const FIXED: usize = 72;

/// Everything a frame says about itself.
#[derive(Clone, Debug, PartialEq)]
pub struct Header {
    pub spec: CodecSpec,
    /// The block as it was given to the codec.
    pub desc: BlockDesc,
    /// Tokens kept (all of them without a drop stage).
    pub kept_tokens: usize,
    pub positions: Positions,
    pub payload_len: u64,
    pub payload_crc: u32,
}

impl Header {
    /// The block a decoder produces.
    pub fn decoded_desc(&self) -> BlockDesc {
        if self.spec.drop.is_some() {
            self.desc.with_tokens(self.kept_tokens)
        } else {
            self.desc
        }
    }

    /// Bytes of the encoded header, its checksum included.
    pub fn encoded_len(&self) -> usize {
        FIXED + self.selections() * bitmap_len(self.desc.tokens()) + 4
    }

    fn selections(&self) -> usize {
        match &self.positions {
            Positions::All => 0,
            Positions::Shared(_) => 1,
            Positions::PerHead { layers, heads, .. } => layers * heads,
        }
    }

    /// Writes the header to the start of `out`, which must hold [`Header::encoded_len`] bytes.
    pub fn write(&self, out: &mut [u8]) -> usize {
        let len = self.encoded_len();
        let out = &mut out[..len];
        out.fill(0);
        out[0..4].copy_from_slice(&MAGIC);
        out[4] = VERSION;
        out[5] = self.spec.encoding.id();
        out[6] = self.spec.drop.map_or(0, |d| d.method.id());
        out[7] = u8::from(self.spec.drop.is_some_and(|d| d.per_head));
        put_u32(out, 8, len as u32);
        out[12..20].copy_from_slice(&self.payload_len.to_le_bytes());
        put_u32(out, 20, self.payload_crc);
        out[24] = self.desc.dtype.code();
        let (layout, a, b) = match self.desc.layout {
            Layout::Kv2ltd { layers, tokens } => (1, layers, tokens),
            Layout::Paged { blocks, block_size } => (2, blocks, block_size),
            Layout::Opaque { len } => (3, len as u32, (len >> 32) as u32),
        };
        out[25] = layout;
        put_u32(out, 28, self.desc.kv_heads);
        put_u32(out, 32, self.desc.head_dim);
        put_u32(out, 36, a);
        put_u32(out, 40, b);
        let (p0, p1, p2) = match self.spec.encoding {
            Encoding::Raw => (0, 0, 0),
            Encoding::Lossless { level } => (level as u32, 0, 0),
            Encoding::Quant { bits, group, residual } => (bits as u32, group, residual),
        };
        put_u32(out, 44, p0);
        put_u32(out, 48, p1);
        put_u32(out, 52, p2);
        if let Some(drop) = &self.spec.drop {
            out[56..60].copy_from_slice(&drop.keep_fraction.to_le_bytes());
            put_u32(out, 60, drop.method.param());
        }
        put_u32(out, 64, self.kept_tokens as u32);
        put_u32(out, 68, self.selections() as u32);
        let tokens = self.desc.tokens();
        let stride = bitmap_len(tokens);
        let mut at = FIXED;
        let mut mark = |kept: &[u32]| {
            for &t in kept {
                out[at + t as usize / 8] |= 1 << (t % 8);
            }
            at += stride;
        };
        match &self.positions {
            Positions::All => {}
            Positions::Shared(kept) => mark(kept),
            Positions::PerHead { kept, .. } => {
                for selection in kept.chunks(self.kept_tokens.max(1)) {
                    mark(selection);
                }
            }
        }
        let crc = crc32c::crc32c(&out[..len - 4]);
        put_u32(out, len - 4, crc);
        len
    }

    /// Reads and checks the header at the start of `frame`. The payload is not checked; see
    /// [`parse`].
    pub fn read(frame: &[u8]) -> Result<Header, Error> {
        if frame.len() < FIXED + 4 {
            return Err(Error::Corrupt("shorter than a header"));
        }
        if frame[0..4] != MAGIC {
            return Err(Error::Corrupt("bad magic (not a kvhoard codec frame)"));
        }
        if frame[4] != VERSION {
            return Err(Error::Corrupt("unknown frame version"));
        }
        let len = get_u32(frame, 8) as usize;
        if len < FIXED + 4 || len > frame.len() {
            return Err(Error::Corrupt("header length out of range"));
        }
        if crc32c::crc32c(&frame[..len - 4]) != get_u32(frame, len - 4) {
            return Err(Error::Corrupt("header checksum mismatch"));
        }
        if frame[7] & !1 != 0 || frame[26] != 0 || frame[27] != 0 {
            return Err(Error::Corrupt("reserved bits set"));
        }
        let dtype = Dtype::from_code(frame[24])?;
        let (a, b) = (get_u32(frame, 36), get_u32(frame, 40));
        let layout = match frame[25] {
            1 => Layout::Kv2ltd { layers: a, tokens: b },
            2 => Layout::Paged { blocks: a, block_size: b },
            3 => Layout::Opaque { len: a as u64 | (b as u64) << 32 },
            _ => return Err(Error::Corrupt("unknown layout")),
        };
        let desc = BlockDesc { dtype, layout, kv_heads: get_u32(frame, 28), head_dim: get_u32(frame, 32) };
        desc.validate().map_err(|_| Error::Corrupt("impossible block shape"))?;
        let (p0, p1, p2) = (get_u32(frame, 44), get_u32(frame, 48), get_u32(frame, 52));
        let encoding = match frame[5] {
            0 => Encoding::Raw,
            1 => Encoding::Lossless { level: p0 as i32 },
            2 => Encoding::Quant {
                bits: u8::try_from(p0).map_err(|_| Error::Corrupt("quant bits out of range"))?,
                group: p1,
                residual: p2,
            },
            _ => return Err(Error::Corrupt("unknown encoding")),
        };
        let drop = match frame[6] {
            0 => None,
            id => Some(DropSpec {
                method: DropMethod::from_id(id, get_u32(frame, 60)).ok_or(Error::Corrupt("unknown drop method"))?,
                keep_fraction: f32::from_le_bytes(frame[56..60].try_into().unwrap_or([0; 4])),
                per_head: frame[7] & 1 != 0,
            }),
        };
        let spec = CodecSpec { drop, encoding };
        spec.validate().map_err(|_| Error::Corrupt("invalid codec parameters"))?;
        if drop.is_some() && !desc.is_tensor() {
            return Err(Error::Corrupt("a drop stage on an opaque block"));
        }

        let tokens = desc.tokens();
        let kept_tokens = get_u32(frame, 64) as usize;
        let selections = get_u32(frame, 68) as usize;
        let expected = match drop {
            None => 0,
            Some(d) if d.per_head => desc.layers() * desc.heads(),
            Some(_) => 1,
        };
        if selections != expected {
            return Err(Error::Corrupt("selection count does not match the codec"));
        }
        if drop.is_none() && kept_tokens != tokens {
            return Err(Error::Corrupt("kept tokens without a drop stage"));
        }
        if drop.is_some() && (kept_tokens == 0 || kept_tokens > tokens) {
            return Err(Error::Corrupt("kept tokens out of range"));
        }
        let stride = bitmap_len(tokens);
        if len != FIXED + selections * stride + 4 {
            return Err(Error::Corrupt("header length does not match its selections"));
        }
        let mut all_kept = Vec::with_capacity(selections * kept_tokens);
        for s in 0..selections {
            let bitmap = &frame[FIXED + s * stride..FIXED + (s + 1) * stride];
            let before = all_kept.len();
            for (byte_index, &byte) in bitmap.iter().enumerate() {
                let mut bits = byte;
                while bits != 0 {
                    let t = byte_index * 8 + bits.trailing_zeros() as usize;
                    bits &= bits - 1;
                    if t >= tokens {
                        return Err(Error::Corrupt("kept token beyond the block"));
                    }
                    all_kept.push(t as u32);
                }
            }
            if all_kept.len() - before != kept_tokens {
                return Err(Error::Corrupt("a selection keeps the wrong number of tokens"));
            }
        }
        let positions = match drop {
            None => Positions::All,
            Some(d) if d.per_head => Positions::PerHead { layers: desc.layers(), heads: desc.heads(), kept: all_kept },
            Some(_) => Positions::Shared(all_kept),
        };
        Ok(Header {
            spec,
            desc,
            kept_tokens,
            positions,
            payload_len: u64::from_le_bytes(frame[12..20].try_into().unwrap_or([0; 8])),
            payload_crc: get_u32(frame, 20),
        })
    }
}

/// Reads the header and checks the payload's length and checksum; returns both.
pub fn parse(frame: &[u8]) -> Result<(Header, &[u8]), Error> {
    let header = Header::read(frame)?;
    let payload = &frame[header.encoded_len()..];
    if payload.len() as u64 != header.payload_len {
        return Err(Error::Corrupt("payload length does not match the header"));
    }
    if crc32c::crc32c(payload) != header.payload_crc {
        return Err(Error::Corrupt("payload checksum mismatch"));
    }
    Ok((header, payload))
}

pub(crate) fn bitmap_len(tokens: usize) -> usize {
    tokens.div_ceil(8)
}

fn put_u32(out: &mut [u8], at: usize, value: u32) {
    out[at..at + 4].copy_from_slice(&value.to_le_bytes());
}

fn get_u32(bytes: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
}
