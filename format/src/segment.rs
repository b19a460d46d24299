//! Segment headers (first unit of a segment) and summary trailers (last unit of a sealed segment).
//!
//! A segment is reused many times; each use gets a fresh, volume-wide increasing `seq`. Records
//! and trailers repeat the seq of the segment use they belong to, so bytes left behind by an
//! earlier use are recognised as stale and never read as live data.

use crate::bytes::{check_crc, check_magic, check_version, Reader, Writer};
use crate::{FormatError, UNIT_BYTES};

/// Magic of a segment header.
pub const HEADER_MAGIC: [u8; 8] = *b"KVHSEGM\0";
/// Magic of a summary trailer.
pub const TRAILER_MAGIC: [u8; 8] = *b"KVHSUMM\0";
/// Version of segment headers and trailers.
pub const VERSION: u32 = 1;
/// Bytes of an encoded header or trailer; each occupies a whole unit on disk.
pub const ENCODED_BYTES: usize = 64;
const CRC_OFFSET: usize = 60;

const _: () = assert!(CRC_OFFSET + 4 == ENCODED_BYTES);
const _: () = assert!(ENCODED_BYTES as u64 <= UNIT_BYTES);

/// The header at the start of a segment in use. A segment whose first unit does not decode as a
/// header of this volume is free.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentHeader {
    /// The volume this segment belongs to.
    pub volume_id: [u8; 16],
    /// The segment's index on the volume.
    pub segment_index: u32,
    /// Volume-wide sequence number of this use of the segment; increases with every use.
    pub seq: u64,
    /// When this use began, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// The machine's boot (power cycle) in which this use began; 0 = unknown (written by a
    /// version before it was recorded). Recovery trusts that records written in the boot it
    /// runs in were not torn by a power loss (docs/format.md, "Damage").
    pub boot: u64,
}

impl SegmentHeader {
    const WHAT: &'static str = "segment header";

    /// Encodes into one unit.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(UNIT_BYTES as usize);
        w.bytes(&HEADER_MAGIC);
        w.u32(VERSION);
        w.u32(self.segment_index);
        w.bytes(&self.volume_id);
        w.u64(self.seq);
        w.u64(self.created_unix_ms);
        w.u64(self.boot);
        w.zeros(CRC_OFFSET - w.buf.len());
        let crc = crate::crc32c_of(&[&w.buf]);
        w.u32(crc);
        w.zeros(UNIT_BYTES as usize - w.buf.len());
        w.buf
    }

    /// Decodes and validates a header.
    pub fn decode(buf: &[u8]) -> Result<SegmentHeader, FormatError> {
        let head = fixed(Self::WHAT, buf, &HEADER_MAGIC)?;
        let mut r = Reader::new(Self::WHAT, head);
        r.take(8)?;
        check_version(Self::WHAT, r.u32()?, VERSION)?;
        let segment_index = r.u32()?;
        let volume_id = r.array()?;
        let seq = r.u64()?;
        let created_unix_ms = r.u64()?;
        let boot = r.u64()?;
        if seq == 0 {
            return Err(FormatError::invalid(Self::WHAT, "seq", "0 is reserved for free segments"));
        }
        Ok(SegmentHeader { volume_id, segment_index, seq, created_unix_ms, boot })
    }
}

/// The trailer in the last unit of a sealed segment: where its summary is and what it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SummaryTrailer {
    /// The segment's index on the volume.
    pub segment_index: u32,
    /// The seq of the segment use this summary describes.
    pub seq: u64,
    /// First unit after the last record (records occupy units `1..end_unit`).
    pub end_unit: u32,
    /// Unit at which the summary starts.
    pub summary_unit: u32,
    /// Length of the summary in bytes.
    pub summary_bytes: u32,
    /// Number of records the summary lists.
    pub record_count: u32,
    /// crc32c of the summary's bytes.
    pub summary_crc: u32,
}

impl SummaryTrailer {
    const WHAT: &'static str = "summary trailer";

    /// Encodes into one unit.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::with_capacity(UNIT_BYTES as usize);
        w.bytes(&TRAILER_MAGIC);
        w.u32(VERSION);
        w.u32(self.segment_index);
        w.u64(self.seq);
        w.u32(self.end_unit);
        w.u32(self.summary_unit);
        w.u32(self.summary_bytes);
        w.u32(self.record_count);
        w.u32(self.summary_crc);
        w.zeros(CRC_OFFSET - w.buf.len());
        let crc = crate::crc32c_of(&[&w.buf]);
        w.u32(crc);
        w.zeros(UNIT_BYTES as usize - w.buf.len());
        w.buf
    }

    /// Decodes and validates a trailer of a segment with `segment_units` units.
    pub fn decode(buf: &[u8], segment_units: u32) -> Result<SummaryTrailer, FormatError> {
        let head = fixed(Self::WHAT, buf, &TRAILER_MAGIC)?;
        let mut r = Reader::new(Self::WHAT, head);
        r.take(8)?;
        check_version(Self::WHAT, r.u32()?, VERSION)?;
        let t = SummaryTrailer {
            segment_index: r.u32()?,
            seq: r.u64()?,
            end_unit: r.u32()?,
            summary_unit: r.u32()?,
            summary_bytes: r.u32()?,
            record_count: r.u32()?,
            summary_crc: r.u32()?,
        };
        let trailer_unit = segment_units.saturating_sub(1);
        let summary_end = u64::from(t.summary_unit) * UNIT_BYTES + u64::from(t.summary_bytes);
        if t.end_unit < 1 || t.end_unit > t.summary_unit || summary_end > u64::from(trailer_unit) * UNIT_BYTES {
            return Err(FormatError::invalid(
                Self::WHAT,
                "summary_unit",
                format!(
                    "records end at unit {}, summary at unit {} for {} bytes, trailer at unit {trailer_unit}: out of order",
                    t.end_unit, t.summary_unit, t.summary_bytes
                ),
            ));
        }
        Ok(t)
    }
}

/// Checks magic and crc of a 64-byte fixed structure and returns its bytes.
fn fixed<'a>(what: &'static str, buf: &'a [u8], magic: &[u8; 8]) -> Result<&'a [u8], FormatError> {
    let mut r = Reader::new(what, buf);
    let head = r.take(ENCODED_BYTES)?;
    let mut r = Reader::new(what, head);
    check_magic(what, r.take(8)?, magic)?;
    let mut r = Reader::new(what, head.get(CRC_OFFSET..).unwrap_or_default());
    let stored = r.u32()?;
    check_crc(what, stored, &[head.get(..CRC_OFFSET).unwrap_or_default()])?;
    Ok(head)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    fn header() -> SegmentHeader {
        SegmentHeader { volume_id: [3; 16], segment_index: 9, seq: 42, created_unix_ms: 5, boot: 0 }
    }

    fn trailer() -> SummaryTrailer {
        SummaryTrailer {
            segment_index: 9,
            seq: 42,
            end_unit: 100,
            summary_unit: 100,
            summary_bytes: 5000,
            record_count: 12,
            summary_crc: 0xdead_beef,
        }
    }

    #[test]
    fn header_round_trips() {
        assert_eq!(SegmentHeader::decode(&header().encode()).unwrap(), header());
    }

    #[test]
    fn header_golden_bytes() {
        let enc = header().encode();
        assert_eq!(&enc[0..8], b"KVHSEGM\0");
        assert_eq!(&enc[12..16], &9u32.to_le_bytes());
        assert_eq!(&enc[32..40], &42u64.to_le_bytes());
        assert_eq!(&enc[60..64], &crc32c::crc32c(&enc[..60]).to_le_bytes());
    }

    #[test]
    fn zeroed_header_is_bad_magic() {
        assert!(matches!(SegmentHeader::decode(&[0u8; 4096]), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn flipped_header_bit_is_rejected() {
        let mut enc = header().encode();
        enc[33] ^= 1;
        assert!(matches!(SegmentHeader::decode(&enc), Err(FormatError::ChecksumMismatch { .. })));
    }

    #[test]
    fn trailer_round_trips() {
        assert_eq!(SummaryTrailer::decode(&trailer().encode(), 256).unwrap(), trailer());
    }

    #[test]
    fn trailer_pointing_past_the_segment_is_rejected() {
        let t = SummaryTrailer { summary_unit: 255, ..trailer() };
        assert!(matches!(SummaryTrailer::decode(&t.encode(), 256), Err(FormatError::InvalidField { .. })));
        let t = SummaryTrailer { end_unit: 101, ..trailer() };
        assert!(SummaryTrailer::decode(&t.encode(), 256).is_err());
    }

    #[test]
    fn truncated_trailer_is_rejected() {
        assert!(matches!(SummaryTrailer::decode(&trailer().encode()[..63], 256), Err(FormatError::Truncated { .. })));
    }

    proptest! {
        #[test]
        fn decoders_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128), units in any::<u32>()) {
            let _ = SegmentHeader::decode(&bytes);
            let _ = SummaryTrailer::decode(&bytes, units);
        }
    }
}
