//! The summary of a sealed segment: every record's unit and header, so that opening a volume
//! reads summaries, not payloads.
//!
//! Layout: a sequence of entries `unit: u32, header_len: u32, header bytes`, in log order. The
//! trailer ([`crate::segment::SummaryTrailer`]) holds the summary's length, count and crc32c.

use crate::bytes::{check_crc, Reader, Writer};
use crate::record::{RecordHeader, HEADER_BYTES_MAX};
use crate::FormatError;

const WHAT: &str = "segment summary";

/// One record as the summary lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryEntry {
    /// Unit, from the segment's start, where the record begins.
    pub unit: u32,
    /// The record's header.
    pub header: RecordHeader,
}

/// Appends the summary entry for a record whose encoded header is `header`.
pub fn encode_entry(out: &mut Vec<u8>, unit: u32, header: &[u8]) {
    let mut w = Writer { buf: std::mem::take(out) };
    w.u32(unit);
    w.u32(header.len() as u32);
    w.bytes(header);
    *out = w.buf;
}

/// Bytes one entry takes for a header of `header_len` bytes.
pub fn entry_bytes(header_len: usize) -> usize {
    8 + header_len
}

/// Decodes the entries of what may be a summary whose trailer is missing (so with no count or
/// crc to check it against), as far as they decode in increasing unit order, each with the
/// offset of the byte after it: recovery's reading of a seal that did not complete.
pub fn decode_prefix(bytes: &[u8]) -> Vec<(SummaryEntry, usize)> {
    let mut r = Reader::new(WHAT, bytes);
    let mut out: Vec<(SummaryEntry, usize)> = Vec::new();
    while let Ok(e) = read_entry(&mut r) {
        if out.last().is_some_and(|(prev, _)| e.unit <= prev.unit) {
            break;
        }
        out.push((e, r.position()));
    }
    out
}

fn read_entry(r: &mut Reader<'_>) -> Result<SummaryEntry, FormatError> {
    let unit = r.u32()?;
    let len = r.u32()? as usize;
    if len > HEADER_BYTES_MAX {
        return Err(FormatError::invalid(WHAT, "header_len", format!("{len} bytes")));
    }
    let header = RecordHeader::decode(r.take(len)?)?;
    Ok(SummaryEntry { unit, header })
}

/// Whether `bytes` are a summary whose checksum is `summary_crc` (its trailer's), without
/// decoding its entries.
pub fn check(bytes: &[u8], summary_crc: u32) -> Result<(), FormatError> {
    check_crc(WHAT, summary_crc, &[bytes])
}

/// Decodes a summary of `record_count` entries, checking it against `summary_crc`, and each
/// header against its own crc. Entries must be in increasing unit order.
pub fn decode(bytes: &[u8], record_count: u32, summary_crc: u32) -> Result<Vec<SummaryEntry>, FormatError> {
    check(bytes, summary_crc)?;
    // Every entry takes at least 8 + FIXED_BYTES bytes: bound the count before allocating.
    let max_entries = bytes.len() / entry_bytes(crate::record::FIXED_BYTES);
    if record_count as usize > max_entries {
        return Err(FormatError::invalid(
            WHAT,
            "record_count",
            format!("{record_count} entries cannot fit in {} bytes", bytes.len()),
        ));
    }
    let mut r = Reader::new(WHAT, bytes);
    let mut entries = Vec::with_capacity(record_count as usize);
    let mut next_unit = 1u32;
    for _ in 0..record_count {
        let SummaryEntry { unit, header } = read_entry(&mut r)?;
        if unit < next_unit {
            return Err(FormatError::invalid(
                WHAT,
                "unit",
                format!("record at unit {unit} overlaps the one before (ends at {next_unit})"),
            ));
        }
        let units = u32::try_from(header.record_bytes() / crate::UNIT_BYTES).unwrap_or(u32::MAX);
        next_unit = unit.saturating_add(units);
        entries.push(SummaryEntry { unit, header });
    }
    if r.remaining() != 0 {
        return Err(FormatError::invalid(
            WHAT,
            "summary_bytes",
            format!("{} bytes left after {record_count} entries", r.remaining()),
        ));
    }
    debug_assert!(r.position() == bytes.len());
    Ok(entries)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::desc::BlockDesc;
    use crate::record::{CompressionMeta, RecordKind};

    fn header(key: &str) -> RecordHeader {
        RecordHeader {
            kind: RecordKind::Block,
            segment_seq: 1,
            payload_crc: 0,
            namespace: "default".into(),
            key: key.into(),
            content_hash: [1; 32],
            raw_len: 5000,
            stored_len: 5000,
            created_unix_ms: 0,
            ttl_secs: 0,
            group_id: None,
            parent_hash: None,
            desc: BlockDesc::opaque(),
            compression: CompressionMeta::none(),
            recovered: false,
        }
    }

    fn summary() -> (Vec<u8>, u32) {
        let mut out = Vec::new();
        encode_entry(&mut out, 1, &header("a").encode());
        encode_entry(&mut out, 4, &header("b").encode());
        let crc = crc32c::crc32c(&out);
        (out, crc)
    }

    #[test]
    fn round_trips() {
        let (bytes, crc) = summary();
        let entries = decode(&bytes, 2, crc).unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[1].unit, 4);
        assert_eq!(entries[1].header.key, "b");
    }

    /// A summary is its entries back to back: unit, header length, the header's own bytes.
    #[test]
    fn golden_bytes_match_the_spec() {
        let (a, b) = (header("a").encode(), header("b").encode());
        let mut expected = Vec::new();
        expected.extend_from_slice(&1u32.to_le_bytes());
        expected.extend_from_slice(&(a.len() as u32).to_le_bytes());
        expected.extend_from_slice(&a);
        expected.extend_from_slice(&4u32.to_le_bytes());
        expected.extend_from_slice(&(b.len() as u32).to_le_bytes());
        expected.extend_from_slice(&b);
        let (bytes, crc) = summary();
        assert_eq!(bytes, expected);
        assert_eq!(crc, crc32c::crc32c(&expected));
        assert_eq!(entry_bytes(a.len()), 8 + a.len());
    }

    #[test]
    fn absurd_count_is_rejected_before_allocating() {
        let (bytes, crc) = summary();
        assert!(matches!(decode(&bytes, u32::MAX, crc), Err(FormatError::InvalidField { field: "record_count", .. })));
    }

    #[test]
    fn flipped_bit_is_rejected() {
        let (mut bytes, crc) = summary();
        bytes[20] ^= 1;
        assert!(matches!(decode(&bytes, 2, crc), Err(FormatError::ChecksumMismatch { .. })));
    }

    #[test]
    fn overlapping_records_are_rejected() {
        let mut out = Vec::new();
        encode_entry(&mut out, 1, &header("a").encode());
        encode_entry(&mut out, 2, &header("b").encode());
        let crc = crc32c::crc32c(&out);
        assert!(matches!(decode(&out, 2, crc), Err(FormatError::InvalidField { field: "unit", .. })));
    }

    #[test]
    fn trailing_bytes_are_rejected() {
        let (mut bytes, _) = summary();
        bytes.push(0);
        let crc = crc32c::crc32c(&bytes);
        assert!(decode(&bytes, 2, crc).is_err());
    }
}
