//! LMCache's `lm://` wire format (lmcache 0.5.6, `lmcache/v1/protocol.py`), byte for byte.
//!
//! A request is 186 bytes: nine little-endian int32 (`command, length, fmt, dtype, location,
//! shape[0..4]`) and the key in 150 bytes padded with spaces. A reply is 36 bytes: nine int32 in
//! another order (`code, length, fmt, dtype, shape[0..4], location`). PUT has no reply.
//!
//! LMCache describes a chunk by its memory format, dtype and shape, and allocates the buffer a
//! GET fills from what the reply says, so the server must echo exactly what was put. kvhoard keeps
//! that description in the block's record ([`BlockDesc`]); [`desc_from_wire`] and
//! [`wire_from_desc`] translate, and refuse what they cannot carry both ways.

use kvhoard_engine::format::{BlockDesc, Dtype, Layout};
use thiserror::Error;

/// Bytes of a request header.
pub const REQUEST_BYTES: usize = 186;
/// Bytes of a reply header.
pub const REPLY_BYTES: usize = 36;
/// Bytes of the key field (LMCache's `MAX_KEY_LENGTH`).
pub const KEY_FIELD_BYTES: usize = 150;

/// What a request asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Store the payload that follows; no reply.
    Put,
    /// Return the stored payload and its description.
    Get,
    /// Reply 200 if the key is stored, 400 if not.
    Exist,
    /// Defined by LMCache but never sent by its client; answered with a failure.
    List,
    /// Reply 200.
    Health,
}

/// A chunk's description as LMCache puts it on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct WireMeta {
    /// `MemoryFormat` code.
    pub fmt: i32,
    /// dtype code.
    pub dtype: i32,
    /// Shape, zero-padded to four dimensions.
    pub shape: [i32; 4],
}

/// A parsed request header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// The command.
    pub command: Command,
    /// Bytes of payload that follow (PUT only).
    pub length: u32,
    /// The chunk's description (PUT only; clients send placeholders otherwise).
    pub meta: WireMeta,
    /// The key with its padding stripped, or why it is unusable.
    pub key: Result<String, KeyError>,
}

/// A header the connection cannot continue after: where the next request starts is unknown.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HeaderError {
    /// The command code is not one LMCache defines.
    #[error("unknown command code {0} (LMCache sends 1 PUT, 2 GET, 3 EXIST, 5 HEALTH)")]
    UnknownCommand(i32),
    /// A negative payload length.
    #[error("negative payload length {0}")]
    NegativeLength(i32),
}

/// A key field that names no key; the request fails but the connection goes on.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum KeyError {
    /// The key bytes are not UTF-8.
    #[error("the key is not UTF-8")]
    NotUtf8,
    /// Only padding.
    #[error("the key is empty")]
    Empty,
}

/// A description kvhoard cannot store so that the same one comes back.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DescError {
    /// A memory format LMCache 0.5.6 does not define.
    #[error("unknown memory format code {0}")]
    UnknownFormat(i32),
    /// A dtype code LMCache 0.5.6 does not define.
    #[error("unknown dtype code {0}")]
    UnknownDtype(i32),
    /// The shape has a negative dimension, a zero before a non-zero one, or none at all.
    #[error("shape {0:?} is not a shape (dimensions must be positive, zero only as trailing padding)")]
    BadShape([i32; 4]),
    /// The shape and dtype do not describe the payload's length: no client could read it back.
    #[error("shape {shape:?} of dtype code {dtype} does not describe {length} bytes")]
    LengthMismatch {
        /// The shape sent.
        shape: [i32; 4],
        /// The dtype code sent.
        dtype: i32,
        /// The payload's length.
        length: u64,
    },
}

fn int_at(bytes: &[u8], i: usize) -> i32 {
    let mut word = [0u8; 4];
    if let Some(src) = bytes.get(i * 4..i * 4 + 4) {
        word.copy_from_slice(src);
    }
    i32::from_le_bytes(word)
}

/// Parses a request header.
pub fn parse_request(header: &[u8; REQUEST_BYTES]) -> Result<Request, HeaderError> {
    let command = match int_at(header, 0) {
        1 => Command::Put,
        2 => Command::Get,
        3 => Command::Exist,
        4 => Command::List,
        5 => Command::Health,
        other => return Err(HeaderError::UnknownCommand(other)),
    };
    let raw_length = int_at(header, 1);
    let length = u32::try_from(raw_length).map_err(|_| HeaderError::NegativeLength(raw_length))?;
    let meta = WireMeta {
        fmt: int_at(header, 2),
        dtype: int_at(header, 3),
        // Word 4 is the client's location (its own tier name): informational, not stored.
        shape: [int_at(header, 5), int_at(header, 6), int_at(header, 7), int_at(header, 8)],
    };
    let key_field = header.get(36..).unwrap_or_default();
    // LMCache pads with spaces and strips whitespace on both ends (`str.strip()`).
    let key = match std::str::from_utf8(key_field) {
        Err(_) => Err(KeyError::NotUtf8),
        Ok(s) => match s.trim_matches(|c: char| c.is_ascii_whitespace()) {
            "" => Err(KeyError::Empty),
            k => Ok(k.to_owned()),
        },
    };
    Ok(Request { command, length, meta, key })
}

/// Encodes a request header, as LMCache's client does (for tests and benchmarks).
pub fn encode_request(command: Command, length: u32, meta: &WireMeta, key: &str) -> Option<[u8; REQUEST_BYTES]> {
    if key.len() > KEY_FIELD_BYTES {
        return None;
    }
    let code = match command {
        Command::Put => 1,
        Command::Get => 2,
        Command::Exist => 3,
        Command::List => 4,
        Command::Health => 5,
    };
    let words = [
        code,
        i32::try_from(length).ok()?,
        meta.fmt,
        meta.dtype,
        0,
        meta.shape[0],
        meta.shape[1],
        meta.shape[2],
        meta.shape[3],
    ];
    let mut out = [b' '; REQUEST_BYTES];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    out.get_mut(36..36 + key.len())?.copy_from_slice(key.as_bytes());
    Some(out)
}

/// Reply code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    /// 200.
    Success,
    /// 400.
    Fail,
}

/// A reply header: code, payload length and description, location 0.
pub fn encode_reply(code: Code, length: u32, meta: &WireMeta) -> [u8; REPLY_BYTES] {
    let code = match code {
        Code::Success => 200,
        Code::Fail => 400,
    };
    let words = [
        code,
        i32::try_from(length).unwrap_or(i32::MAX),
        meta.fmt,
        meta.dtype,
        meta.shape[0],
        meta.shape[1],
        meta.shape[2],
        meta.shape[3],
        0,
    ];
    let mut out = [0u8; REPLY_BYTES];
    for (chunk, w) in out.chunks_exact_mut(4).zip(words) {
        chunk.copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// What LMCache's server sends with a reply that carries no chunk (KV_2LTD, float16, no shape).
pub const NO_CHUNK: WireMeta = WireMeta { fmt: 1, dtype: 2, shape: [0; 4] };

/// Parses a reply header (for clients: tests and benchmarks).
pub fn parse_reply(bytes: &[u8; REPLY_BYTES]) -> (i32, i32, WireMeta) {
    let meta = WireMeta {
        fmt: int_at(bytes, 2),
        dtype: int_at(bytes, 3),
        shape: [int_at(bytes, 4), int_at(bytes, 5), int_at(bytes, 6), int_at(bytes, 7)],
    };
    (int_at(bytes, 0), int_at(bytes, 1), meta)
}

const FORMATS: [(i32, Layout); 9] = [
    (0, Layout::Opaque),
    (1, Layout::Kv2Ltd),
    (2, Layout::KvT2d),
    (3, Layout::Kv2Td),
    (4, Layout::Binary),
    (5, Layout::BinaryBuffer),
    (6, Layout::KvMla),
    (7, Layout::EcTd),
    (8, Layout::HsTd),
];

// LMCache's client sends 2 for float16 (`torch.half` and `torch.float16` are one object, and
// the later dict entry wins), so 2 is what comes back for a block put with either code.
const DTYPES: [(i32, Dtype); 9] = [
    (0, Dtype::Bytes),
    (2, Dtype::F16),
    (1, Dtype::F16),
    (3, Dtype::Bf16),
    (4, Dtype::F32),
    (5, Dtype::F64),
    (6, Dtype::U8),
    (7, Dtype::F8E4M3),
    (8, Dtype::F8E5M2),
];

/// The block description for a chunk put with `meta` and `length` payload bytes.
pub fn desc_from_wire(meta: &WireMeta, length: u64) -> Result<BlockDesc, DescError> {
    let layout =
        FORMATS.iter().find(|(c, _)| *c == meta.fmt).map(|(_, l)| *l).ok_or(DescError::UnknownFormat(meta.fmt))?;
    let dtype =
        DTYPES.iter().find(|(c, _)| *c == meta.dtype).map(|(_, d)| *d).ok_or(DescError::UnknownDtype(meta.dtype))?;
    let ndim = meta.shape.iter().rposition(|&d| d != 0).map_or(0, |i| i + 1);
    let dims = meta.shape.get(..ndim).unwrap_or_default();
    if ndim == 0 || dims.iter().any(|&d| d <= 0) {
        return Err(DescError::BadShape(meta.shape));
    }
    let desc = BlockDesc { dtype, layout, shape: dims.iter().map(|&d| d as u64).collect() };
    desc.validate(length).map_err(|_| DescError::LengthMismatch { shape: meta.shape, dtype: meta.dtype, length })?;
    Ok(desc)
}

/// The wire description of a stored block, or `None` if it has none LMCache could use (a block
/// stored by another interface without an LMCache description).
pub fn wire_from_desc(desc: &BlockDesc) -> Option<WireMeta> {
    let fmt = FORMATS.iter().find(|(_, l)| *l == desc.layout)?.0;
    let dtype = DTYPES.iter().find(|(_, d)| *d == desc.dtype)?.0;
    if desc.shape.is_empty() || desc.shape.len() > 4 {
        return None;
    }
    let mut shape = [0i32; 4];
    for (out, &d) in shape.iter_mut().zip(&desc.shape) {
        *out = i32::try_from(d).ok()?;
    }
    Some(WireMeta { fmt, dtype, shape })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const KEY: &str = "org/test-model@1@0@1234abcd5678ef01@bfloat16";
    const CHUNK: WireMeta = WireMeta { fmt: 1, dtype: 3, shape: [2, 4, 256, 512] };

    fn hex(words: &str) -> Vec<u8> {
        kvhoard_engine::format::hex::decode(words).expect("hex words")
    }

    #[test]
    fn put_header_golden_bytes() {
        let h = encode_request(Command::Put, 2 << 20, &CHUNK, KEY).expect("fits");
        let words = hex("01000000 00002000 01000000 03000000 00000000 02000000 04000000 00010000 00020000");
        assert_eq!(&h[..36], &words[..]);
        assert_eq!(&h[36..36 + KEY.len()], KEY.as_bytes());
        assert!(h[36 + KEY.len()..].iter().all(|&b| b == b' '));
        assert_eq!(h[36 + KEY.len()..].len(), 106);
        let req = parse_request(&h).expect("parses");
        assert_eq!(req, Request { command: Command::Put, length: 2 << 20, meta: CHUNK, key: Ok(KEY.into()) });
    }

    #[test]
    fn reply_golden_bytes() {
        let ok = encode_reply(Code::Success, 2 << 20, &CHUNK);
        assert_eq!(
            ok.to_vec(),
            hex("c8000000 00002000 01000000 03000000 02000000 04000000 00010000 00020000 00000000")
        );
        let fail = encode_reply(Code::Fail, 0, &NO_CHUNK);
        assert_eq!(
            fail.to_vec(),
            hex("90010000 00000000 01000000 02000000 00000000 00000000 00000000 00000000 00000000")
        );
        assert_eq!(parse_reply(&ok), (200, 2 << 20, CHUNK));
    }

    #[test]
    fn chunk_description_round_trips() {
        let desc = desc_from_wire(&CHUNK, 2 << 20).expect("valid");
        assert_eq!(desc.layout, Layout::Kv2Ltd);
        assert_eq!(desc.dtype, Dtype::Bf16);
        assert_eq!(wire_from_desc(&desc), Some(CHUNK));
        // BINARY objects are [length, 0, 0, 0].
        let bin = WireMeta { fmt: 4, dtype: 6, shape: [1000, 0, 0, 0] };
        assert_eq!(wire_from_desc(&desc_from_wire(&bin, 1000).expect("valid")), Some(bin));
        // float16 put as code 1 comes back as 2, as from LMCache's own server.
        let half = WireMeta { fmt: 1, dtype: 1, shape: [2, 1, 2, 8] };
        let back = wire_from_desc(&desc_from_wire(&half, 64).expect("valid")).expect("maps");
        assert_eq!(back, WireMeta { dtype: 2, ..half });
    }

    #[test]
    fn descriptions_that_cannot_come_back_are_refused() {
        assert_eq!(desc_from_wire(&WireMeta { fmt: 9, ..CHUNK }, 2 << 20), Err(DescError::UnknownFormat(9)));
        assert_eq!(desc_from_wire(&WireMeta { dtype: 9, ..CHUNK }, 2 << 20), Err(DescError::UnknownDtype(9)));
        for shape in [[0, 0, 0, 0], [2, 0, 3, 4], [-2, 4, 256, 512]] {
            assert_eq!(desc_from_wire(&WireMeta { shape, ..CHUNK }, 2 << 20), Err(DescError::BadShape(shape)));
        }
        assert!(matches!(desc_from_wire(&CHUNK, 1 << 20), Err(DescError::LengthMismatch { .. })));
        // KV_2LTD needs its four dimensions.
        assert!(desc_from_wire(&WireMeta { fmt: 1, dtype: 6, shape: [16, 0, 0, 0] }, 16).is_err());
    }

    #[test]
    fn blocks_without_an_lmcache_description_are_not_offered() {
        assert_eq!(wire_from_desc(&BlockDesc::opaque()), None);
        let paged = BlockDesc { dtype: Dtype::Bf16, layout: Layout::VllmPaged, shape: vec![2, 1, 16, 8, 128] };
        assert_eq!(wire_from_desc(&paged), None);
        let huge = BlockDesc { dtype: Dtype::U8, layout: Layout::Binary, shape: vec![1 << 32] };
        assert_eq!(wire_from_desc(&huge), None);
    }

    #[test]
    fn bad_headers() {
        let mut h = encode_request(Command::Get, 0, &NO_CHUNK, KEY).expect("fits");
        h[0] = 9;
        assert_eq!(parse_request(&h), Err(HeaderError::UnknownCommand(9)));
        let mut h = encode_request(Command::Put, 0, &NO_CHUNK, KEY).expect("fits");
        h[4..8].copy_from_slice(&(-5i32).to_le_bytes());
        assert_eq!(parse_request(&h), Err(HeaderError::NegativeLength(-5)));
        let mut h = encode_request(Command::Get, 0, &NO_CHUNK, "k").expect("fits");
        h[36] = 0xff;
        assert_eq!(parse_request(&h).map(|r| r.key), Ok(Err(KeyError::NotUtf8)));
        let h = encode_request(Command::Get, 0, &NO_CHUNK, "").expect("fits");
        assert_eq!(parse_request(&h).map(|r| r.key), Ok(Err(KeyError::Empty)));
        // A key filling the whole field has no padding at all.
        let full = "k".repeat(KEY_FIELD_BYTES);
        let h = encode_request(Command::Exist, 0, &NO_CHUNK, &full).expect("fits");
        assert_eq!(parse_request(&h).map(|r| r.key), Ok(Ok(full)));
        assert!(encode_request(Command::Exist, 0, &NO_CHUNK, &"k".repeat(151)).is_none());
    }

    proptest! {
        #[test]
        fn any_header_parses_or_errors(bytes in proptest::collection::vec(any::<u8>(), REQUEST_BYTES)) {
            let mut h = [0u8; REQUEST_BYTES];
            h.copy_from_slice(&bytes);
            let _ = parse_request(&h);
        }

        #[test]
        fn every_accepted_description_comes_back(fmt in 0..9i32, dtype in 0..9i32,
                                                 shape in proptest::array::uniform4(0..70i32)) {
            let meta = WireMeta { fmt, dtype, shape };
            let elements: i64 = shape.iter().take_while(|&&d| d != 0).map(|&d| i64::from(d)).product();
            let size = match dtype { 1..=3 => 2, 4 => 4, 5 => 8, _ => 1 };
            if let Ok(desc) = desc_from_wire(&meta, (elements * size) as u64) {
                let back = wire_from_desc(&desc).expect("an accepted description maps back");
                prop_assert_eq!(back, WireMeta { dtype: if dtype == 1 { 2 } else { dtype }, ..meta });
            }
        }
    }
}
