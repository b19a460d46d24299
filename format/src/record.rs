//! Record headers: one per block, link (a second key for stored bytes) or tombstone.
//!
//! A record starts on a unit boundary. Its header is followed by zero padding up to the next unit,
//! then the payload (the stored bytes), then zero padding up to the next unit, so that the payload
//! itself is unit-aligned and can be read by O_DIRECT straight into a caller's buffer.
//!
//! A header of at most [`ECHO_BYTES_MAX`] bytes is written twice in its record's first unit: at
//! the start, and again (the echo) at the end of that unit, followed by its length and
//! [`ECHO_TAG`] ([`write_echo`], [`echo_of`]). When damage makes the first copy unreadable, the
//! echo still names the record's key and length, so recovery can turn that key into a miss
//! instead of letting an older version of it come back (docs/format.md, "Damage").

use crate::bytes::{check_crc, check_magic, check_version, Reader, Writer};
use crate::desc::{BlockDesc, DESC_BYTES_MAX};
use crate::{align_up, FormatError, UNIT_BYTES};

/// Magic of every record header.
pub const MAGIC: [u8; 4] = *b"KVRC";
/// Record header version this build writes and the newest it reads.
pub const VERSION: u16 = 1;
/// Bytes of the fixed part of a header; the variable part follows.
pub const FIXED_BYTES: usize = 136;
/// Longest header, fixed and variable parts together.
pub const HEADER_BYTES_MAX: usize = 64 * 1024;
/// Longest namespace name in bytes.
pub const NAMESPACE_BYTES_MAX: usize = 255;
/// Longest key in bytes.
pub const KEY_BYTES_MAX: usize = 4096;
/// Largest codec parameter area (so that a kept-token map of a long block fits).
pub const CODEC_PARAMS_BYTES_MAX: usize =
    HEADER_BYTES_MAX - FIXED_BYTES - NAMESPACE_BYTES_MAX - KEY_BYTES_MAX - DESC_BYTES_MAX - 4;
const HEADER_CRC_OFFSET: usize = 12;
const FLAG_HAS_PARENT: u8 = 1;
const FLAG_HAS_GROUP: u8 = 2;
const FLAG_RECOVERED: u8 = 4;
/// Tag after the echo's length in the last 4 bytes of a record's first unit.
pub const ECHO_TAG: [u8; 2] = *b"KE";
/// Longest header that is echoed: two copies and the length and tag fit in one unit.
pub const ECHO_BYTES_MAX: usize = (UNIT_BYTES as usize - 4) / 2;
const WHAT: &str = "record header";

const _: () = assert!(FIXED_BYTES + NAMESPACE_BYTES_MAX + KEY_BYTES_MAX + DESC_BYTES_MAX + 4 < HEADER_BYTES_MAX);
const _: () = assert!(HEADER_BYTES_MAX <= u16::MAX as usize + 1);

/// What a record means.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum RecordKind {
    /// A key and the stored bytes of its block.
    Block = 1,
    /// A key for bytes already stored in this namespace by an earlier block record (deduplication).
    Link = 2,
    /// The key was deleted.
    Tombstone = 3,
    /// Written only into a segment summary, by recovery: a record of this segment use at this
    /// unit could not be read, not even its key. Every key whose newest record comes before it
    /// in the log may have been replaced or deleted by it, so replay voids them (they become
    /// misses). No namespace, key or payload.
    Lost = 4,
}

impl RecordKind {
    fn from_u8(v: u8) -> Result<Self, FormatError> {
        match v {
            1 => Ok(RecordKind::Block),
            2 => Ok(RecordKind::Link),
            3 => Ok(RecordKind::Tombstone),
            4 => Ok(RecordKind::Lost),
            _ => Err(FormatError::invalid(
                WHAT,
                "kind",
                format!("{v} is not 1 (block), 2 (link), 3 (tombstone) or 4 (lost)"),
            )),
        }
    }
}

/// How the stored bytes were produced from the raw bytes, with everything needed to decode them.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct CompressionMeta {
    /// Codec identifier; [`CompressionMeta::CODEC_NONE`] means the stored bytes are the raw bytes.
    pub codec_id: u16,
    /// Version of the codec's parameter encoding.
    pub codec_version: u16,
    /// The codec's parameters (quantization settings, kept-token map, ...), codec-defined.
    pub params: Vec<u8>,
}

impl CompressionMeta {
    /// Stored bytes are the raw bytes.
    pub const CODEC_NONE: u16 = 0;
    /// Stored bytes are the payload of kvhoard's KV codec stack (an optional token or page
    /// dropping stage, then raw, byte-plane lossless or quantized encoding). `params` holds the
    /// stack's parameters and kept-token map, encoded by `kvhoard-kernels` (docs/codecs.md,
    /// "Codec parameters"); it is the only place a stored block's codec parameters live
    /// (docs/decisions/0003-codec-parameters-live-in-the-record-header.md).
    pub const CODEC_KV: u16 = 1;
    /// Every codec id this build knows, with its name.
    pub const CODECS: [(u16, &'static str); 2] = [(Self::CODEC_NONE, "none"), (Self::CODEC_KV, "kv")];

    /// No compression.
    pub fn none() -> Self {
        CompressionMeta { codec_id: Self::CODEC_NONE, codec_version: 1, params: Vec::new() }
    }

    /// Whether the stored bytes are the raw bytes.
    pub fn is_none(&self) -> bool {
        self.codec_id == Self::CODEC_NONE
    }

    /// The name of codec `id`: `none`, `kv`, or `codec-N` for an id this build does not know.
    pub fn codec_name(id: u16) -> String {
        match Self::CODECS.iter().find(|(c, _)| *c == id) {
            Some((_, name)) => (*name).to_string(),
            None => format!("codec-{id}"),
        }
    }

    fn encoded_len(&self) -> usize {
        4 + self.params.len()
    }
}

/// How a block's stored bytes are to be read: its description and its codec with parameters,
/// encoded exactly as in a record header. Two records hold the same block only if their content
/// hashes and these bytes are equal (the engine deduplicates on both: a key's description is
/// the key's own, never borrowed from another key that stored the same bytes).
pub fn reading_of(desc: &BlockDesc, compression: &CompressionMeta) -> Vec<u8> {
    let mut w = Writer::with_capacity(desc.encoded_len() + compression.encoded_len());
    encode_reading(&mut w, desc, compression);
    w.buf
}

fn encode_reading(w: &mut Writer, desc: &BlockDesc, compression: &CompressionMeta) {
    desc.encode(w);
    w.u16(compression.codec_id);
    w.u16(compression.codec_version);
    w.bytes(&compression.params);
}

/// A decoded record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    /// What the record means.
    pub kind: RecordKind,
    /// The seq of the segment use the record was written in.
    pub segment_seq: u64,
    /// crc32c of the stored bytes.
    pub payload_crc: u32,
    /// Namespace (tenant or model) the key lives in.
    pub namespace: String,
    /// The client's key.
    pub key: String,
    /// blake3 of the raw (uncompressed) bytes; zero for a tombstone.
    pub content_hash: [u8; 32],
    /// Length of the raw bytes.
    pub raw_len: u64,
    /// Length of the stored bytes that follow the header (0 for links and tombstones).
    pub stored_len: u64,
    /// Milliseconds since the Unix epoch at which the record was written.
    pub created_unix_ms: u64,
    /// Seconds after creation at which the key expires; 0 = never.
    pub ttl_secs: u32,
    /// Group (context) the block belongs to, when the client knows it.
    pub group_id: Option<u64>,
    /// Content hash of the parent block, when the client knows it.
    pub parent_hash: Option<[u8; 32]>,
    /// What the raw bytes are.
    pub desc: BlockDesc,
    /// How the stored bytes encode the raw bytes.
    pub compression: CompressionMeta,
    /// Written by recovery into a segment summary in place of a record it could not trust
    /// (damaged, or found past damage): fsck reports such entries until a repair acknowledges
    /// them. Never set on a record in the log itself.
    pub recovered: bool,
}

impl RecordHeader {
    /// Length of the encoded header in bytes.
    pub fn encoded_len(&self) -> usize {
        FIXED_BYTES + self.namespace.len() + self.key.len() + self.desc.encoded_len() + self.compression.encoded_len()
    }

    /// Offset of the payload from the record's start: the header rounded up to a unit.
    pub fn payload_offset(&self) -> u64 {
        // encoded_len() <= HEADER_BYTES_MAX is checked by validate(); rounding it cannot overflow.
        align_up(self.encoded_len() as u64).unwrap_or(u64::MAX)
    }

    /// Bytes the whole record occupies on disk: header, payload and padding.
    pub fn record_bytes(&self) -> u64 {
        self.payload_offset().saturating_add(self.stored_len).saturating_add(UNIT_BYTES - 1) & !(UNIT_BYTES - 1)
    }

    /// Checks every field against its documented range.
    pub fn validate(&self) -> Result<(), FormatError> {
        if self.kind == RecordKind::Lost {
            if !self.namespace.is_empty() || !self.key.is_empty() || self.stored_len != 0 {
                return Err(FormatError::invalid(WHAT, "kind", "a lost-record entry names no key and holds no bytes"));
            }
            return Ok(());
        }
        validate_namespace(&self.namespace)?;
        validate_key(&self.key)?;
        self.desc.validate(self.raw_len)?;
        if self.compression.params.len() > CODEC_PARAMS_BYTES_MAX {
            return Err(FormatError::invalid(
                WHAT,
                "codec_len",
                format!("{} bytes of codec parameters", self.compression.params.len()),
            ));
        }
        let no_payload = self.kind != RecordKind::Block;
        if no_payload && self.stored_len != 0 {
            return Err(FormatError::invalid(
                WHAT,
                "stored_len",
                format!("{:?} record carries {} payload bytes", self.kind, self.stored_len),
            ));
        }
        if self.kind == RecordKind::Block
            && self.compression.codec_id == CompressionMeta::CODEC_NONE
            && self.stored_len != self.raw_len
        {
            return Err(FormatError::invalid(
                WHAT,
                "stored_len",
                format!("uncompressed block stores {} bytes of {} raw", self.stored_len, self.raw_len),
            ));
        }
        if self.stored_len > u64::from(u32::MAX) || self.raw_len > u64::from(u32::MAX) {
            return Err(FormatError::invalid(WHAT, "raw_len", "blocks are limited to 4 GiB".to_string()));
        }
        Ok(())
    }

    /// Encodes the header (without padding). Call [`RecordHeader::validate`] first; an invalid
    /// header is encoded as-is and will be refused when decoded.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(self.encoded_len());
        let flags = if self.parent_hash.is_some() { FLAG_HAS_PARENT } else { 0 }
            | if self.group_id.is_some() { FLAG_HAS_GROUP } else { 0 }
            | if self.recovered { FLAG_RECOVERED } else { 0 };
        w.bytes(&MAGIC);
        w.u16(VERSION);
        w.u8(self.kind as u8);
        w.u8(flags);
        w.u32(self.encoded_len() as u32);
        w.u32(0); // header crc, filled in below
        w.u64(self.segment_seq);
        w.u32(self.payload_crc);
        w.u16(self.namespace.len() as u16);
        w.u16(self.key.len() as u16);
        w.u64(self.raw_len);
        w.u64(self.stored_len);
        w.u64(self.created_unix_ms);
        w.u32(self.ttl_secs);
        w.u16(self.desc.encoded_len() as u16);
        w.u16(self.compression.encoded_len() as u16);
        w.bytes(&self.content_hash);
        w.bytes(&self.parent_hash.unwrap_or([0; 32]));
        w.u64(self.group_id.unwrap_or(0));
        debug_assert_eq!(w.buf.len(), FIXED_BYTES);
        w.bytes(self.namespace.as_bytes());
        w.bytes(self.key.as_bytes());
        encode_reading(&mut w, &self.desc, &self.compression);
        let crc = header_crc(&w.buf);
        if let Some(slot) = w.buf.get_mut(HEADER_CRC_OFFSET..HEADER_CRC_OFFSET + 4) {
            slot.copy_from_slice(&crc.to_le_bytes());
        }
        w.buf
    }

    /// Reads the header length from the first bytes of a record, checking only the magic, so a
    /// reader knows how much to read before decoding.
    pub fn peek_len(buf: &[u8]) -> Result<usize, FormatError> {
        let mut r = Reader::new(WHAT, buf);
        check_magic(WHAT, r.take(4)?, &MAGIC)?;
        r.take(4)?;
        let len = r.u32()? as usize;
        if !(FIXED_BYTES..=HEADER_BYTES_MAX).contains(&len) {
            return Err(FormatError::invalid(
                WHAT,
                "header_len",
                format!("{len} is outside {FIXED_BYTES}..={HEADER_BYTES_MAX}"),
            ));
        }
        Ok(len)
    }

    /// Decodes and validates a header from the start of `buf` (which may hold more than it).
    pub fn decode(buf: &[u8]) -> Result<RecordHeader, FormatError> {
        let len = Self::peek_len(buf)?;
        let bytes = Reader::new(WHAT, buf).take(len)?;
        let mut r = Reader::new(WHAT, bytes);
        r.take(4)?;
        let version = r.u16()?;
        let kind = r.u8()?;
        let flags = r.u8()?;
        r.u32()?;
        let stored_crc = r.u32()?;
        check_crc(
            WHAT,
            stored_crc,
            &[
                bytes.get(..HEADER_CRC_OFFSET).unwrap_or_default(),
                bytes.get(HEADER_CRC_OFFSET + 4..).unwrap_or_default(),
            ],
        )?;
        check_version(WHAT, u32::from(version), u32::from(VERSION))?;
        let kind = RecordKind::from_u8(kind)?;
        if flags & !(FLAG_HAS_PARENT | FLAG_HAS_GROUP | FLAG_RECOVERED) != 0 {
            return Err(FormatError::invalid(WHAT, "flags", format!("unknown flags {flags:#x}")));
        }
        let segment_seq = r.u64()?;
        let payload_crc = r.u32()?;
        let ns_len = usize::from(r.u16()?);
        let key_len = usize::from(r.u16()?);
        let raw_len = r.u64()?;
        let stored_len = r.u64()?;
        let created_unix_ms = r.u64()?;
        let ttl_secs = r.u32()?;
        let desc_len = usize::from(r.u16()?);
        let codec_len = usize::from(r.u16()?);
        let content_hash = r.array()?;
        let parent = r.array::<32>()?;
        let group = r.u64()?;
        let variable = ns_len + key_len + desc_len + codec_len;
        if FIXED_BYTES + variable != len || codec_len < 4 {
            return Err(FormatError::invalid(
                WHAT,
                "header_len",
                format!("{len} does not match its parts ({FIXED_BYTES} + {variable})"),
            ));
        }
        let namespace = utf8(r.take(ns_len)?, "namespace")?;
        let key = utf8(r.take(key_len)?, "key")?;
        let desc = BlockDesc::decode(r.take(desc_len)?)?;
        let codec_id = r.u16()?;
        let codec_version = r.u16()?;
        let params = r.take(codec_len - 4)?.to_vec();
        let header = RecordHeader {
            kind,
            segment_seq,
            payload_crc,
            namespace,
            key,
            content_hash,
            raw_len,
            stored_len,
            created_unix_ms,
            ttl_secs,
            group_id: (flags & FLAG_HAS_GROUP != 0).then_some(group),
            parent_hash: (flags & FLAG_HAS_PARENT != 0).then_some(parent),
            desc,
            compression: CompressionMeta { codec_id, codec_version, params },
            recovered: flags & FLAG_RECOVERED != 0,
        };
        header.validate()?;
        Ok(header)
    }
}

/// Writes the echo of `header` (its encoded bytes) at the end of `unit0`, a record's first unit
/// as it will be written (the header already at its start); returns whether it fitted.
pub fn write_echo(unit0: &mut [u8], header: &[u8]) -> bool {
    let len = header.len();
    let end = UNIT_BYTES as usize - 4;
    if len > ECHO_BYTES_MAX {
        return false;
    }
    let Some(area) = unit0.get_mut(end - len..end + 4) else { return false };
    let (copy, tail) = area.split_at_mut(len);
    copy.copy_from_slice(header);
    let mut t = (len as u16).to_le_bytes().to_vec();
    t.extend_from_slice(&ECHO_TAG);
    tail.copy_from_slice(&t);
    true
}

/// The echoed header bytes in a record's first unit, if it carries an echo (decode them with
/// [`RecordHeader::decode`], which checks their crc).
pub fn echo_of(unit0: &[u8]) -> Option<&[u8]> {
    let end = UNIT_BYTES as usize - 4;
    let tail = unit0.get(end..end + 4)?;
    if tail.get(2..4)? != ECHO_TAG {
        return None;
    }
    let len = usize::from(u16::from_le_bytes([*tail.first()?, *tail.get(1)?]));
    if len > ECHO_BYTES_MAX {
        return None;
    }
    unit0.get(end - len..end)
}

/// First bytes of a [`Pending`] unit.
pub const PENDING_MAGIC: [u8; 4] = *b"KVPD";
const PENDING_BYTES: usize = 20;

/// What stands in a record's first unit while the rest of the record is being written, where a
/// crash could cut that write short (buffered I/O): the header follows only once the rest is on
/// the device. A crash in between leaves this unit, which names no record (the record never
/// happened) and says how many units its rest takes, so that recovery, looking past it for
/// traces of damaged records, skips that payload instead of reading it as headers.
///
/// Layout: magic (4), units (4, the whole record's, this unit included), seq (8, the segment
/// use), crc32c of the 16 bytes before (4); the rest of the unit is zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// The segment use the record belongs to.
    pub segment_seq: u64,
    /// Units the record takes, this one included.
    pub units: u32,
}

impl Pending {
    /// Writes the unit's fields into `unit0` (which must be zeros past them).
    pub fn encode_into(&self, unit0: &mut [u8]) {
        let mut w = Writer::with_capacity(PENDING_BYTES);
        w.bytes(&PENDING_MAGIC);
        w.u32(self.units);
        w.u64(self.segment_seq);
        let crc = crate::crc32c_of(&[&w.buf]);
        w.u32(crc);
        if let Some(dst) = unit0.get_mut(..PENDING_BYTES) {
            dst.copy_from_slice(&w.buf);
        }
    }

    /// The pending unit `unit0` begins with, if it is one (magic and crc check out).
    pub fn decode(unit0: &[u8]) -> Option<Pending> {
        let b = unit0.get(..PENDING_BYTES)?;
        if b.get(..4)? != PENDING_MAGIC {
            return None;
        }
        let crc = u32::from_le_bytes(b.get(16..20)?.try_into().ok()?);
        if crate::crc32c_of(&[b.get(..16)?]) != crc {
            return None;
        }
        let units = u32::from_le_bytes(b.get(4..8)?.try_into().ok()?);
        let segment_seq = u64::from_le_bytes(b.get(8..16)?.try_into().ok()?);
        Some(Pending { segment_seq, units })
    }
}

fn header_crc(bytes: &[u8]) -> u32 {
    crate::crc32c_of(&[
        bytes.get(..HEADER_CRC_OFFSET).unwrap_or_default(),
        bytes.get(HEADER_CRC_OFFSET + 4..).unwrap_or_default(),
    ])
}

fn utf8(bytes: &[u8], field: &'static str) -> Result<String, FormatError> {
    String::from_utf8(bytes.to_vec()).map_err(|_| FormatError::invalid(WHAT, field, "not valid UTF-8"))
}

/// Checks a namespace name: 1 to 255 bytes, usable as a directory name.
pub fn validate_namespace(ns: &str) -> Result<(), FormatError> {
    let shown = crate::quoted_short(ns);
    let bad = |detail: &str| Err(FormatError::invalid("namespace", "namespace", format!("{shown}: {detail}")));
    if ns.is_empty() {
        return bad("is empty");
    }
    if ns.len() > NAMESPACE_BYTES_MAX {
        return bad(&format!("is {} bytes, at most {NAMESPACE_BYTES_MAX}", ns.len()));
    }
    if ns == "." || ns == ".." || ns.starts_with(".") {
        return bad("may not start with '.'");
    }
    if ns.chars().any(|c| c == '/' || c.is_control()) {
        return bad("may not contain '/' or control characters");
    }
    Ok(())
}

/// Checks a key: 1 to 4096 bytes of UTF-8 (any characters, `/` included).
pub fn validate_key(key: &str) -> Result<(), FormatError> {
    if key.is_empty() {
        return Err(FormatError::invalid("key", "key", "is empty"));
    }
    if key.len() > KEY_BYTES_MAX {
        return Err(FormatError::invalid("key", "key", format!("is {} bytes, at most {KEY_BYTES_MAX}", key.len())));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::desc::{Dtype, Layout};
    use proptest::prelude::*;

    #[test]
    fn a_pending_unit_round_trips_and_a_damaged_one_is_none() {
        let p = Pending { segment_seq: 41, units: 17 };
        let mut unit = vec![0u8; UNIT_BYTES as usize];
        p.encode_into(&mut unit);
        assert_eq!(&unit[..4], b"KVPD");
        assert_eq!(Pending::decode(&unit), Some(p));
        assert!(RecordHeader::peek_len(&unit).is_err() || RecordHeader::decode(&unit).is_err(), "not a record");
        unit[9] ^= 1;
        assert_eq!(Pending::decode(&unit), None);
        assert_eq!(Pending::decode(&[0u8; 4096]), None);
    }

    pub(crate) fn sample() -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Block,
            segment_seq: 77,
            payload_crc: 0x1234_5678,
            namespace: "default".into(),
            key: "org/test-model@1@0@1234abcd5678ef01@bfloat16".into(),
            content_hash: [0xab; 32],
            raw_len: 2 * 4 * 256 * 512 * 2,
            stored_len: 2 * 4 * 256 * 512 * 2,
            created_unix_ms: 1_700_000_000_123,
            ttl_secs: 3600,
            group_id: Some(99),
            parent_hash: Some([0xcd; 32]),
            desc: BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, 4, 256, 512] },
            compression: CompressionMeta::none(),
            recovered: false,
        }
    }

    #[test]
    fn round_trips() {
        let h = sample();
        h.validate().unwrap();
        let enc = h.encode();
        assert_eq!(enc.len(), h.encoded_len());
        assert_eq!(RecordHeader::decode(&enc).unwrap(), h);
    }

    #[test]
    fn golden_fixed_part() {
        let enc = sample().encode();
        assert_eq!(&enc[0..4], b"KVRC");
        assert_eq!(&enc[4..6], &1u16.to_le_bytes());
        assert_eq!(enc[6], 1);
        assert_eq!(enc[7], 3);
        assert_eq!(&enc[8..12], &(enc.len() as u32).to_le_bytes());
        assert_eq!(&enc[16..24], &77u64.to_le_bytes());
        assert_eq!(&enc[28..30], &7u16.to_le_bytes());
        assert_eq!(&enc[56..60], &3600u32.to_le_bytes());
        assert_eq!(&enc[64..96], &[0xab; 32]);
        assert_eq!(&enc[128..136], &99u64.to_le_bytes());
        assert_eq!(&enc[136..143], b"default");
        let crc = crc32c::crc32c_append(crc32c::crc32c(&enc[..12]), &enc[16..]);
        assert_eq!(&enc[12..16], &crc.to_le_bytes());
    }

    #[test]
    fn payload_is_unit_aligned_and_record_padded() {
        let h = sample();
        assert_eq!(h.payload_offset(), 4096);
        assert_eq!(h.record_bytes(), 4096 + h.stored_len);
        let small = RecordHeader { stored_len: 1, raw_len: 1, desc: BlockDesc::opaque(), ..sample() };
        assert_eq!(small.record_bytes(), 8192);
    }

    #[test]
    fn every_truncation_is_rejected() {
        let enc = sample().encode();
        for cut in 0..enc.len() {
            assert!(RecordHeader::decode(&enc[..cut]).is_err(), "cut at {cut}");
        }
    }

    #[test]
    fn bad_magic_is_rejected() {
        let mut enc = sample().encode();
        enc[1] = 0;
        assert!(matches!(RecordHeader::decode(&enc), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn every_flipped_bit_is_rejected() {
        let enc = sample().encode();
        for byte in 0..enc.len() {
            let mut bad = enc.clone();
            bad[byte] ^= 0x04;
            assert!(RecordHeader::decode(&bad).is_err(), "flip in byte {byte}");
        }
    }

    #[test]
    fn absurd_header_length_is_rejected() {
        let mut enc = sample().encode();
        enc[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(RecordHeader::decode(&enc), Err(FormatError::InvalidField { field: "header_len", .. })));
    }

    #[test]
    fn newer_version_is_rejected() {
        let mut enc = sample().encode();
        enc[4..6].copy_from_slice(&9u16.to_le_bytes());
        let crc = header_crc(&enc);
        enc[12..16].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(RecordHeader::decode(&enc), Err(FormatError::UnsupportedVersion { found: 9, .. })));
    }

    #[test]
    fn shape_that_does_not_match_the_length_is_rejected() {
        let h = RecordHeader { raw_len: 10, stored_len: 10, ..sample() };
        assert!(h.validate().is_err());
        assert!(RecordHeader::decode(&h.encode()).is_err());
    }

    #[test]
    fn namespace_and_key_limits() {
        assert!(validate_namespace("").is_err());
        assert!(validate_namespace("a/b").is_err());
        assert!(validate_namespace(".hidden").is_err());
        assert!(validate_namespace(&"n".repeat(256)).is_err());
        assert!(validate_namespace("llama-3.1-8b").is_ok());
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(4097)).is_err());
        assert!(validate_key("m@2@1@-1234@half/with%odd@chars").is_ok());
    }

    fn arb_header() -> impl Strategy<Value = RecordHeader> {
        (
            prop_oneof![Just(RecordKind::Block), Just(RecordKind::Link), Just(RecordKind::Tombstone)],
            any::<u64>(),
            "[a-z][a-z0-9_-]{0,20}",
            ".{1,60}",
            0u64..1_000_000,
            any::<Option<u64>>(),
            any::<Option<[u8; 32]>>(),
            proptest::collection::vec(any::<u8>(), 0..300),
            any::<u32>(),
        )
            .prop_map(|(kind, seq, namespace, key, raw_len, group_id, parent_hash, params, ttl_secs)| {
                let stored_len = if kind == RecordKind::Block { raw_len } else { 0 };
                RecordHeader {
                    kind,
                    segment_seq: seq,
                    payload_crc: seq as u32,
                    namespace,
                    key,
                    content_hash: [seq as u8; 32],
                    raw_len,
                    stored_len,
                    created_unix_ms: seq / 3,
                    ttl_secs,
                    group_id,
                    parent_hash,
                    desc: BlockDesc { dtype: Dtype::U8, layout: Layout::Opaque, shape: vec![raw_len] },
                    compression: CompressionMeta { codec_id: 0, codec_version: 1, params },
                    recovered: false,
                }
            })
    }

    proptest! {
        #[test]
        fn encode_decode_round_trips(h in arb_header()) {
            prop_assert_eq!(RecordHeader::decode(&h.encode()).unwrap(), h);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = RecordHeader::decode(&bytes);
        }

        #[test]
        fn decode_of_mutated_header_never_panics(h in arb_header(), at in any::<prop::sample::Index>(), v in any::<u8>()) {
            let mut enc = h.encode();
            let i = at.index(enc.len());
            enc[i] = v;
            let _ = RecordHeader::decode(&enc);
        }
    }
}
