//! Checkpoints: the in-memory index written out, so that opening a volume reads one file and the
//! segments written after it instead of every segment summary.
//!
//! Layout (all little-endian):
//!
//! ```text
//! header   80 bytes  magic "KVHCKPT\0", version u32, reserved u32, volume_id [16],
//!                    checkpoint_seq u64, created_unix_ms u64, next_segment_seq u64,
//!                    segment_count u32, namespace_count u32, content_count u64, key_count u64
//! segments 16 bytes each: seq u64 (0 = free), end_unit u32, state u8, reserved [3]
//! names    per namespace: len u16, UTF-8 bytes
//! contents 36 bytes each: fp [16], segment u32, unit u32, units u32, raw_len u32, ns u16, codec u8, reserved u8
//! keys     36 bytes each: fp [16], content u32, segment u32, unit u32, expires_unix_s u32, ns u16, reserved u16
//! crc32c   u32 over everything before it
//! ```

use crate::bytes::{check_crc, check_magic, check_version, Reader, Writer};
use crate::record::validate_namespace;
use crate::FormatError;

/// Magic of a checkpoint.
pub const MAGIC: [u8; 8] = *b"KVHCKPT\0";
/// Checkpoint version this build writes and the only one it reads. Version 2 changed what a
/// content fingerprint covers (the block's description and codec as well as its bytes), so a
/// version 1 checkpoint's fingerprints mean something else: it is refused as
/// [`FormatError::Outdated`] and the index is rebuilt from the log, which holds everything.
pub const VERSION: u32 = 2;
const HEADER_BYTES: usize = 80;
const SEGMENT_BYTES: usize = 16;
const CONTENT_BYTES: usize = 36;
const KEY_BYTES: usize = 36;
const WHAT: &str = "checkpoint";

/// What a checkpoint knows about one segment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentState {
    /// The seq of the segment's use at checkpoint time; 0 if it was free.
    pub seq: u64,
    /// Records before this unit are reflected in the checkpoint.
    pub end_unit: u32,
    /// Whether the segment was sealed (its summary written).
    pub sealed: bool,
}

/// A stored block in the checkpoint's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentEntry {
    /// Fingerprint of (namespace, content hash).
    pub fp: [u8; 16],
    /// Segment of the block record.
    pub segment: u32,
    /// Unit of the block record in its segment.
    pub unit: u32,
    /// Units the record occupies.
    pub units: u32,
    /// Raw length of the block.
    pub raw_len: u32,
    /// Namespace index into [`Checkpoint::namespaces`].
    pub ns: u16,
    /// What kind of codec stored the block (`kvhoard-kernels`' codec class; 0 raw), for
    /// statistics.
    pub codec: u8,
}

/// A key in the checkpoint's index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    /// Fingerprint of (namespace, key).
    pub fp: [u8; 16],
    /// Index of the key's content in [`Checkpoint::contents`].
    pub content: u32,
    /// Segment of the key's own record (block or link).
    pub segment: u32,
    /// Unit of the key's own record.
    pub unit: u32,
    /// Unix time in seconds after which the key is expired; 0 = never.
    pub expires_unix_s: u32,
    /// Namespace index into [`Checkpoint::namespaces`].
    pub ns: u16,
}

/// A decoded checkpoint.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Checkpoint {
    /// The volume it belongs to.
    pub volume_id: [u8; 16],
    /// Increases with every checkpoint written.
    pub checkpoint_seq: u64,
    /// When it was written.
    pub created_unix_ms: u64,
    /// The seq the next segment use will get.
    pub next_segment_seq: u64,
    /// One state per segment of the volume.
    pub segments: Vec<SegmentState>,
    /// Namespace names; entries refer to them by index.
    pub namespaces: Vec<String>,
    /// Stored blocks.
    pub contents: Vec<ContentEntry>,
    /// Keys.
    pub keys: Vec<KeyEntry>,
}

impl Checkpoint {
    /// Encodes the whole checkpoint.
    pub fn encode(&self) -> Vec<u8> {
        let names: usize = self.namespaces.iter().map(|n| 2 + n.len()).sum();
        let mut w = Writer::with_capacity(
            HEADER_BYTES
                + names
                + self.segments.len() * SEGMENT_BYTES
                + self.contents.len() * CONTENT_BYTES
                + self.keys.len() * KEY_BYTES
                + 4,
        );
        w.bytes(&MAGIC);
        w.u32(VERSION);
        w.u32(0);
        w.bytes(&self.volume_id);
        w.u64(self.checkpoint_seq);
        w.u64(self.created_unix_ms);
        w.u64(self.next_segment_seq);
        w.u32(self.segments.len() as u32);
        w.u32(self.namespaces.len() as u32);
        w.u64(self.contents.len() as u64);
        w.u64(self.keys.len() as u64);
        for s in &self.segments {
            w.u64(s.seq);
            w.u32(s.end_unit);
            w.u8(u8::from(s.sealed));
            w.zeros(3);
        }
        for n in &self.namespaces {
            w.u16(n.len() as u16);
            w.bytes(n.as_bytes());
        }
        for c in &self.contents {
            w.bytes(&c.fp);
            w.u32(c.segment);
            w.u32(c.unit);
            w.u32(c.units);
            w.u32(c.raw_len);
            w.u16(c.ns);
            w.u8(c.codec);
            w.u8(0);
        }
        for k in &self.keys {
            w.bytes(&k.fp);
            w.u32(k.content);
            w.u32(k.segment);
            w.u32(k.unit);
            w.u32(k.expires_unix_s);
            w.u16(k.ns);
            w.u16(0);
        }
        let crc = crate::crc32c_of(&[&w.buf]);
        w.u32(crc);
        w.buf
    }

    /// Decodes and validates a checkpoint: checksum, counts against the bytes present, and every
    /// cross-reference (namespace and content indices, segment numbers).
    pub fn decode(buf: &[u8]) -> Result<Checkpoint, FormatError> {
        let body_len = buf.len().checked_sub(4).ok_or(FormatError::Truncated {
            what: WHAT,
            needed: 4,
            available: buf.len() as u64,
        })?;
        let (body, crc) = buf.split_at(body_len);
        let mut r = Reader::new(WHAT, body);
        check_magic(WHAT, r.take(8)?, &MAGIC)?;
        let version = r.u32()?;
        check_crc(WHAT, u32::from_le_bytes(crc.try_into().unwrap_or_default()), &[body])?;
        check_version(WHAT, version, VERSION)?;
        if version < VERSION {
            return Err(FormatError::Outdated { what: WHAT, found: version, current: VERSION });
        }
        r.u32()?;
        let volume_id = r.array()?;
        let checkpoint_seq = r.u64()?;
        let created_unix_ms = r.u64()?;
        let next_segment_seq = r.u64()?;
        let segment_count = r.u32()? as usize;
        let namespace_count = r.u32()? as usize;
        let content_count = r.u64()?;
        let key_count = r.u64()?;
        let fixed = (segment_count as u64)
            .checked_mul(SEGMENT_BYTES as u64)
            .zip(content_count.checked_mul(CONTENT_BYTES as u64))
            .zip(key_count.checked_mul(KEY_BYTES as u64))
            .and_then(|((a, b), c)| a.checked_add(b)?.checked_add(c)?.checked_add(2 * namespace_count as u64));
        if fixed.is_none_or(|n| n > r.remaining() as u64) {
            return Err(FormatError::invalid(WHAT, "counts", format!(
                "{segment_count} segments, {namespace_count} namespaces, {content_count} blocks, {key_count} keys cannot fit in {} bytes",
                r.remaining()
            )));
        }
        let segments = (0..segment_count).map(|_| decode_segment(&mut r)).collect::<Result<Vec<_>, _>>()?;
        let namespaces = (0..namespace_count).map(|_| decode_name(&mut r)).collect::<Result<Vec<_>, _>>()?;
        let contents = (0..content_count).map(|_| decode_content(&mut r)).collect::<Result<Vec<_>, _>>()?;
        let keys = (0..key_count).map(|_| decode_key(&mut r)).collect::<Result<Vec<_>, _>>()?;
        if r.remaining() != 0 {
            return Err(FormatError::invalid(
                WHAT,
                "length",
                format!("{} unexplained bytes at the end", r.remaining()),
            ));
        }
        let cp = Checkpoint {
            volume_id,
            checkpoint_seq,
            created_unix_ms,
            next_segment_seq,
            segments,
            namespaces,
            contents,
            keys,
        };
        cp.check_references()?;
        Ok(cp)
    }

    fn check_references(&self) -> Result<(), FormatError> {
        let nss = self.namespaces.len();
        let segs = self.segments.len();
        for c in &self.contents {
            if usize::from(c.ns) >= nss || c.segment as usize >= segs {
                return Err(FormatError::invalid(
                    WHAT,
                    "contents",
                    format!("entry refers to namespace {} or segment {} that does not exist", c.ns, c.segment),
                ));
            }
        }
        for k in &self.keys {
            if usize::from(k.ns) >= nss || k.segment as usize >= segs || k.content as usize >= self.contents.len() {
                return Err(FormatError::invalid(
                    WHAT,
                    "keys",
                    format!(
                        "entry refers to namespace {}, segment {} or block {} that does not exist",
                        k.ns, k.segment, k.content
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn decode_segment(r: &mut Reader<'_>) -> Result<SegmentState, FormatError> {
    let seq = r.u64()?;
    let end_unit = r.u32()?;
    let state = r.u8()?;
    r.take(3)?;
    if state > 1 {
        return Err(FormatError::invalid(WHAT, "segment state", format!("{state}")));
    }
    Ok(SegmentState { seq, end_unit, sealed: state == 1 })
}

fn decode_name(r: &mut Reader<'_>) -> Result<String, FormatError> {
    let len = usize::from(r.u16()?);
    let name =
        String::from_utf8(r.take(len)?.to_vec()).map_err(|_| FormatError::invalid(WHAT, "namespace", "not UTF-8"))?;
    validate_namespace(&name)?;
    Ok(name)
}

fn decode_content(r: &mut Reader<'_>) -> Result<ContentEntry, FormatError> {
    let c = ContentEntry {
        fp: r.array()?,
        segment: r.u32()?,
        unit: r.u32()?,
        units: r.u32()?,
        raw_len: r.u32()?,
        ns: r.u16()?,
        codec: r.u8()?,
    };
    r.u8()?;
    Ok(c)
}

fn decode_key(r: &mut Reader<'_>) -> Result<KeyEntry, FormatError> {
    let k = KeyEntry {
        fp: r.array()?,
        content: r.u32()?,
        segment: r.u32()?,
        unit: r.u32()?,
        expires_unix_s: r.u32()?,
        ns: r.u16()?,
    };
    r.u16()?;
    Ok(k)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            volume_id: [1; 16],
            checkpoint_seq: 3,
            created_unix_ms: 4,
            next_segment_seq: 10,
            segments: vec![
                SegmentState { seq: 9, end_unit: 12, sealed: false },
                SegmentState { seq: 0, end_unit: 0, sealed: false },
            ],
            namespaces: vec!["default".into(), "tenant-b".into()],
            contents: vec![ContentEntry { fp: [5; 16], segment: 0, unit: 1, units: 3, raw_len: 9000, ns: 1, codec: 0 }],
            keys: vec![KeyEntry { fp: [2; 16], content: 0, segment: 0, unit: 1, expires_unix_s: 0, ns: 1 }],
        }
    }

    #[test]
    fn round_trips() {
        assert_eq!(Checkpoint::decode(&sample().encode()).unwrap(), sample());
    }

    /// Every byte of a checkpoint, written out field by field from the layout in the module
    /// documentation (and docs/format.md): the encoder must produce exactly this.
    #[test]
    fn golden_bytes_match_the_spec() {
        let mut expected: Vec<u8> = Vec::new();
        expected.extend_from_slice(b"KVHCKPT\0");
        expected.extend_from_slice(&2u32.to_le_bytes()); // version
        expected.extend_from_slice(&0u32.to_le_bytes()); // reserved
        expected.extend_from_slice(&[1; 16]); // volume_id
        expected.extend_from_slice(&3u64.to_le_bytes()); // checkpoint_seq
        expected.extend_from_slice(&4u64.to_le_bytes()); // created_unix_ms
        expected.extend_from_slice(&10u64.to_le_bytes()); // next_segment_seq
        expected.extend_from_slice(&2u32.to_le_bytes()); // segment_count
        expected.extend_from_slice(&2u32.to_le_bytes()); // namespace_count
        expected.extend_from_slice(&1u64.to_le_bytes()); // content_count
        expected.extend_from_slice(&1u64.to_le_bytes()); // key_count
        assert_eq!(expected.len(), HEADER_BYTES);
        // segments: seq, end_unit, state, reserved
        expected.extend_from_slice(&9u64.to_le_bytes());
        expected.extend_from_slice(&12u32.to_le_bytes());
        expected.extend_from_slice(&[0, 0, 0, 0]);
        expected.extend_from_slice(&[0; 16]);
        // names
        expected.extend_from_slice(&7u16.to_le_bytes());
        expected.extend_from_slice(b"default");
        expected.extend_from_slice(&8u16.to_le_bytes());
        expected.extend_from_slice(b"tenant-b");
        // contents: fp, segment, unit, units, raw_len, ns, reserved
        expected.extend_from_slice(&[5; 16]);
        for v in [0u32, 1, 3, 9000] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        expected.extend_from_slice(&[1, 0, 0, 0]);
        // keys: fp, content, segment, unit, expires_unix_s, ns, reserved
        expected.extend_from_slice(&[2; 16]);
        for v in [0u32, 0, 1, 0] {
            expected.extend_from_slice(&v.to_le_bytes());
        }
        expected.extend_from_slice(&[1, 0, 0, 0]);
        let crc = crc32c::crc32c(&expected);
        expected.extend_from_slice(&crc.to_le_bytes());
        assert_eq!(sample().encode(), expected);
    }

    #[test]
    fn a_checkpoint_of_an_older_version_is_refused_as_outdated() {
        let mut enc = sample().encode();
        enc[8..12].copy_from_slice(&1u32.to_le_bytes());
        let body = enc.len() - 4;
        let crc = crc32c::crc32c(&enc[..body]);
        enc[body..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(Checkpoint::decode(&enc), Err(FormatError::Outdated { found: 1, current: 2, .. })));
    }

    #[test]
    fn every_truncation_is_rejected() {
        let enc = sample().encode();
        for cut in 0..enc.len() {
            assert!(Checkpoint::decode(&enc[..cut]).is_err());
        }
    }

    #[test]
    fn flipped_bit_is_rejected() {
        let mut enc = sample().encode();
        enc[100] ^= 1;
        assert!(matches!(Checkpoint::decode(&enc), Err(FormatError::ChecksumMismatch { .. })));
    }

    #[test]
    fn absurd_counts_are_rejected_before_allocating() {
        let mut enc = sample().encode();
        enc[64..72].copy_from_slice(&u64::MAX.to_le_bytes());
        let n = enc.len() - 4;
        let crc = crc32c::crc32c(&enc[..n]);
        enc[n..].copy_from_slice(&crc.to_le_bytes());
        assert!(matches!(Checkpoint::decode(&enc), Err(FormatError::InvalidField { field: "counts", .. })));
    }

    #[test]
    fn dangling_reference_is_rejected() {
        let mut cp = sample();
        cp.keys[0].content = 7;
        assert!(matches!(Checkpoint::decode(&cp.encode()), Err(FormatError::InvalidField { field: "keys", .. })));
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Checkpoint::decode(&bytes);
        }
    }
}
