//! What a block's raw bytes are: element type, tensor layout and shape.
//!
//! This is the one description of a block in kvhoard. Its codes are the ones stored on disk, in
//! every record header (docs/format.md, "Block description"); the codecs in `kvhoard-kernels`
//! take a structured view of it, and the network protocols translate their own codes into it.

use crate::bytes::{Reader, Writer};
use crate::FormatError;

const WHAT: &str = "block description";

/// Most dimensions a block's shape may have.
pub const NDIM_MAX: usize = 8;
/// Longest encoded description: four bytes, then one `u64` per dimension.
pub const DESC_BYTES_MAX: usize = 4 + 8 * NDIM_MAX;

/// `value`'s name in a table of every value with its name.
fn name_in<T: Copy + PartialEq>(table: &[(T, &'static str)], value: T) -> &'static str {
    table.iter().find(|(v, _)| *v == value).map_or("", |(_, n)| n)
}

/// The value called `name` in a table of every value with its name.
fn named_in<T: Copy>(table: &[(T, &'static str)], name: &str) -> Option<T> {
    table.iter().find(|(_, n)| *n == name).map(|(v, _)| *v)
}

/// Element type of a block's tensor. The discriminants are the on-disk codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Dtype {
    /// Unknown or not a tensor.
    Bytes = 0,
    /// IEEE half precision.
    F16 = 1,
    /// bfloat16.
    Bf16 = 2,
    /// IEEE single precision.
    F32 = 3,
    /// OCP FP8 E4M3 ("fn": no infinities, one NaN pattern, largest finite 448), as
    /// `torch.float8_e4m3fn`.
    F8E4M3 = 4,
    /// OCP FP8 E5M2 (IEEE-like, with infinities), as `torch.float8_e5m2`.
    F8E5M2 = 5,
    /// Unsigned bytes.
    U8 = 6,
    /// IEEE double precision.
    F64 = 7,
}

impl Dtype {
    /// Every dtype with its name, in code order. Names are stable: scripts and the Python package
    /// read them.
    pub const NAMES: [(Dtype, &'static str); 8] = [
        (Dtype::Bytes, "bytes"),
        (Dtype::F16, "f16"),
        (Dtype::Bf16, "bf16"),
        (Dtype::F32, "f32"),
        (Dtype::F8E4M3, "f8e4m3"),
        (Dtype::F8E5M2, "f8e5m2"),
        (Dtype::U8, "u8"),
        (Dtype::F64, "f64"),
    ];

    /// Other spellings people and frameworks use (PyTorch's names among them), each with the
    /// dtype it means.
    const ALIASES: [(Dtype, &'static str); 14] = [
        (Dtype::F16, "float16"),
        (Dtype::F16, "half"),
        (Dtype::F16, "fp16"),
        (Dtype::Bf16, "bfloat16"),
        (Dtype::F32, "float32"),
        (Dtype::F32, "float"),
        (Dtype::F32, "fp32"),
        (Dtype::F8E4M3, "float8_e4m3fn"),
        (Dtype::F8E4M3, "fp8e4m3"),
        (Dtype::F8E4M3, "e4m3"),
        (Dtype::F8E5M2, "float8_e5m2"),
        (Dtype::F8E5M2, "fp8e5m2"),
        (Dtype::F8E5M2, "e5m2"),
        (Dtype::U8, "uint8"),
    ];

    /// The dtype's short name (`bf16`, `f8e4m3`, ...).
    pub fn name(self) -> &'static str {
        name_in(&Self::NAMES, self)
    }

    /// The dtype called `name` exactly (see [`Dtype::NAMES`]).
    pub fn from_name(name: &str) -> Option<Dtype> {
        named_in(&Self::NAMES, name)
    }

    /// The dtype a person or a framework means by `name`: a short name, or an alias such as
    /// `bfloat16`, `half` or `float8_e4m3fn`, in any case. The error lists the names accepted.
    pub fn parse(name: &str) -> Result<Dtype, FormatError> {
        let lower = name.trim().to_ascii_lowercase();
        let lower = lower.strip_prefix("torch.").unwrap_or(&lower);
        Self::from_name(lower).or_else(|| named_in(&Self::ALIASES, lower)).ok_or_else(|| {
            let names: Vec<&str> = Self::NAMES.iter().map(|(_, n)| *n).collect();
            FormatError::invalid(WHAT, "dtype", format!("unknown dtype {name:?}; expected one of {}", names.join(", ")))
        })
    }

    /// Bytes per element.
    pub fn size_bytes(self) -> u64 {
        match self {
            Dtype::Bytes | Dtype::F8E4M3 | Dtype::F8E5M2 | Dtype::U8 => 1,
            Dtype::F16 | Dtype::Bf16 => 2,
            Dtype::F32 => 4,
            Dtype::F64 => 8,
        }
    }

    /// Whether elements are floating-point numbers (what lossy codecs compute on).
    pub fn is_float(self) -> bool {
        !matches!(self, Dtype::Bytes | Dtype::U8)
    }

    /// The dtype with on-disk code `code`.
    pub fn from_code(code: u8) -> Result<Self, FormatError> {
        Self::NAMES
            .iter()
            .map(|(d, _)| *d)
            .find(|d| *d as u8 == code)
            .ok_or_else(|| FormatError::invalid(WHAT, "dtype", format!("unknown dtype code {code}")))
    }
}

impl std::fmt::Display for Dtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// How a block's tensor is laid out. The discriminants are the on-disk codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Layout {
    /// Opaque bytes.
    Opaque = 0,
    /// LMCache `KV_2LTD`: `[2, layers, tokens, kv_heads * head_dim]`.
    Kv2Ltd = 1,
    /// vLLM paged: `[2, blocks, block_size, kv_heads, head_dim]`.
    VllmPaged = 2,
    /// LMCache `KV_T2D`: `[tokens, 2, hidden]`.
    KvT2d = 3,
    /// LMCache `KV_2TD`: `[2, tokens, hidden]`.
    Kv2Td = 4,
    /// LMCache `BINARY`: serialized bytes.
    Binary = 5,
    /// LMCache `BINARY_BUFFER`: serialized bytes in a reusable buffer.
    BinaryBuffer = 6,
    /// LMCache `KV_MLA_FMT`: `[layers, tokens, latent]` (one shared latent per token).
    KvMla = 7,
    /// LMCache `EC_TD`: encoder cache, `[tokens, hidden]`.
    EcTd = 8,
    /// LMCache `HS_TD`: hidden states, `[tokens, hidden]`.
    HsTd = 9,
}

impl Layout {
    /// Every layout with its name, in code order. Names are stable: scripts and the Python package
    /// read them.
    pub const NAMES: [(Layout, &'static str); 10] = [
        (Layout::Opaque, "opaque"),
        (Layout::Kv2Ltd, "kv_2ltd"),
        (Layout::VllmPaged, "vllm_paged"),
        (Layout::KvT2d, "kv_t2d"),
        (Layout::Kv2Td, "kv_2td"),
        (Layout::Binary, "binary"),
        (Layout::BinaryBuffer, "binary_buffer"),
        (Layout::KvMla, "kv_mla"),
        (Layout::EcTd, "ec_td"),
        (Layout::HsTd, "hs_td"),
    ];

    /// The layout's short name (`kv_2ltd`, `vllm_paged`, ...).
    pub fn name(self) -> &'static str {
        name_in(&Self::NAMES, self)
    }

    /// The layout called `name` (see [`Layout::NAMES`]), in any case.
    pub fn from_name(name: &str) -> Option<Layout> {
        named_in(&Self::NAMES, &name.trim().to_ascii_lowercase())
    }

    /// The layout with on-disk code `code`.
    pub fn from_code(code: u8) -> Result<Self, FormatError> {
        Self::NAMES
            .iter()
            .map(|(l, _)| *l)
            .find(|l| *l as u8 == code)
            .ok_or_else(|| FormatError::invalid(WHAT, "layout", format!("unknown layout code {code}")))
    }

    /// The number of dimensions this layout requires, if it fixes one.
    pub fn ndim(self) -> Option<usize> {
        match self {
            Layout::Kv2Ltd => Some(4),
            Layout::VllmPaged => Some(5),
            // LMCache's other formats vary in rank between versions; their shape is only checked
            // against the length.
            Layout::Opaque
            | Layout::KvT2d
            | Layout::Kv2Td
            | Layout::Binary
            | Layout::BinaryBuffer
            | Layout::KvMla
            | Layout::EcTd
            | Layout::HsTd => None,
        }
    }
}

impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// What a block's raw bytes are: dtype, layout and shape.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct BlockDesc {
    /// Element type.
    pub dtype: Dtype,
    /// Tensor layout.
    pub layout: Layout,
    /// Shape, outermost first; empty for opaque bytes.
    pub shape: Vec<u64>,
}

impl BlockDesc {
    /// Opaque bytes with no tensor description.
    pub fn opaque() -> Self {
        BlockDesc { dtype: Dtype::Bytes, layout: Layout::Opaque, shape: Vec::new() }
    }

    /// Whether this is the description of bytes with no tensor structure.
    pub fn is_opaque(&self) -> bool {
        *self == Self::opaque()
    }

    /// Bytes the shape describes (elements times element size); `None` for an empty shape or on
    /// overflow.
    pub fn shape_bytes(&self) -> Option<u64> {
        if self.shape.is_empty() {
            return None;
        }
        let elements = self.shape.iter().try_fold(1u64, |acc, &d| acc.checked_mul(d))?;
        elements.checked_mul(self.dtype.size_bytes())
    }

    /// Checks the description against the raw length it describes.
    pub fn validate(&self, raw_len: u64) -> Result<(), FormatError> {
        if self.shape.len() > NDIM_MAX {
            return Err(FormatError::invalid(
                WHAT,
                "ndim",
                format!("{} dimensions, at most {NDIM_MAX}", self.shape.len()),
            ));
        }
        if let Some(ndim) = self.layout.ndim() {
            if self.shape.len() != ndim {
                return Err(FormatError::invalid(
                    WHAT,
                    "shape",
                    format!("layout {} needs {ndim} dimensions, got {}", self.layout.name(), self.shape.len()),
                ));
            }
        }
        if self.shape.is_empty() {
            return Ok(());
        }
        match self.shape_bytes() {
            Some(bytes) if bytes == raw_len => Ok(()),
            _ => Err(FormatError::invalid(
                WHAT,
                "shape",
                format!("shape {:?} of {} does not describe {raw_len} bytes", self.shape, self.dtype.name()),
            )),
        }
    }

    pub(crate) fn encoded_len(&self) -> usize {
        4 + 8 * self.shape.len()
    }

    pub(crate) fn encode(&self, w: &mut Writer) {
        w.u8(self.dtype as u8);
        w.u8(self.layout as u8);
        w.u8(self.shape.len() as u8);
        w.u8(0);
        for d in &self.shape {
            w.u64(*d);
        }
    }

    pub(crate) fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let mut r = Reader::new(WHAT, bytes);
        let dtype = Dtype::from_code(r.u8()?)?;
        let layout = Layout::from_code(r.u8()?)?;
        let ndim = usize::from(r.u8()?);
        r.u8()?;
        if ndim > NDIM_MAX || r.remaining() != 8 * ndim {
            return Err(FormatError::invalid(WHAT, "desc_len", format!("{} bytes for {ndim} dimensions", bytes.len())));
        }
        let shape = (0..ndim).map(|_| r.u64()).collect::<Result<_, _>>()?;
        Ok(BlockDesc { dtype, layout, shape })
    }
}

impl std::fmt::Display for BlockDesc {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_opaque() {
            return f.write_str("opaque bytes");
        }
        write!(f, "{} {} {:?}", self.dtype, self.layout, self.shape)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    #[test]
    fn names_and_codes_cover_every_value_once() {
        for (i, (dtype, name)) in Dtype::NAMES.iter().enumerate() {
            assert_eq!(Dtype::from_code(i as u8).unwrap(), *dtype);
            assert_eq!(*dtype as u8, i as u8);
            assert_eq!(Dtype::from_name(name), Some(*dtype));
            assert_eq!(dtype.name(), *name);
        }
        for (i, (layout, name)) in Layout::NAMES.iter().enumerate() {
            assert_eq!(Layout::from_code(i as u8).unwrap(), *layout);
            assert_eq!(*layout as u8, i as u8);
            assert_eq!(Layout::from_name(name), Some(*layout));
            assert_eq!(layout.name(), *name);
        }
        assert!(Dtype::from_code(Dtype::NAMES.len() as u8).is_err());
        assert!(Layout::from_code(Layout::NAMES.len() as u8).is_err());
    }

    #[test]
    fn on_disk_codes_are_stable() {
        // Stored in every record header: these may never change.
        let codes: Vec<(u8, &str)> = Dtype::NAMES.iter().map(|(d, n)| (*d as u8, *n)).collect();
        assert_eq!(
            codes,
            [(0, "bytes"), (1, "f16"), (2, "bf16"), (3, "f32"), (4, "f8e4m3"), (5, "f8e5m2"), (6, "u8"), (7, "f64")]
        );
        assert_eq!(Layout::Kv2Ltd as u8, 1);
        assert_eq!(Layout::VllmPaged as u8, 2);
        assert_eq!(Layout::HsTd as u8, 9);
    }

    #[test]
    fn parse_takes_names_and_aliases() {
        assert_eq!(Dtype::parse("bf16").unwrap(), Dtype::Bf16);
        assert_eq!(Dtype::parse("bfloat16").unwrap(), Dtype::Bf16);
        assert_eq!(Dtype::parse("torch.float16").unwrap(), Dtype::F16);
        assert_eq!(Dtype::parse("HALF").unwrap(), Dtype::F16);
        assert_eq!(Dtype::parse("float8_e4m3fn").unwrap(), Dtype::F8E4M3);
        let error = Dtype::parse("int4").unwrap_err().to_string();
        assert!(error.contains("int4"), "{error}");
        assert!(error.contains("bf16"), "{error}");
        assert_eq!(Dtype::from_name("bfloat16"), None);
    }

    #[test]
    fn golden_bytes() {
        let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, 4, 256, 512] };
        let mut w = Writer::with_capacity(64);
        desc.encode(&mut w);
        let mut expected = vec![2, 1, 4, 0];
        for d in [2u64, 4, 256, 512] {
            expected.extend_from_slice(&d.to_le_bytes());
        }
        assert_eq!(w.buf, expected);
        assert_eq!(BlockDesc::decode(&w.buf).unwrap(), desc);
    }

    #[test]
    fn validate_checks_rank_and_length() {
        let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, 4, 256, 512] };
        assert!(desc.validate(2 * 4 * 256 * 512 * 2).is_ok());
        assert!(desc.validate(10).is_err());
        let three = BlockDesc { shape: vec![2, 4, 256], ..desc.clone() };
        assert!(three.validate(2 * 4 * 256 * 2).is_err());
        let huge = BlockDesc { shape: vec![u64::MAX, 2, 2, 2], ..desc };
        assert!(huge.validate(0).is_err());
        assert!(BlockDesc::opaque().validate(12345).is_ok());
    }
}
