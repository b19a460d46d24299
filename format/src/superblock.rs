//! The superblock: the volume's identity and geometry, kept in two copies (units 0 and 1).
//!
//! It is written when the volume is created; two copies let a volume open when one of them is
//! damaged. Everything that changes lives in the log and the checkpoints, except the namespace
//! policies ([`crate::policy`]), which share the superblock's units, and [`FreedAhead`]; both are
//! rewritten (copy A, sync, copy B, sync) when they change.

use crate::bytes::{check_crc, check_magic, check_version, Reader, Writer};
use crate::{FormatError, UNIT_BYTES};

/// First bytes of every superblock copy.
pub const MAGIC: [u8; 8] = *b"KVHOARD\0";
/// The superblock version this build writes and the newest it reads.
pub const VERSION: u32 = 1;
/// Bytes of the encoded superblock; the rest of its unit is zero.
pub const ENCODED_BYTES: usize = 128;
/// Offset of copy A and copy B on the volume.
pub const COPY_OFFSETS: [u64; 2] = [0, UNIT_BYTES];
/// Smallest segment: large enough that headers and summaries are a small fraction of it.
pub const SEGMENT_BYTES_MIN: u64 = 1 << 20;
/// Largest segment: offsets inside a segment are counted in `u32` units of 4 KiB... and sizes of
/// records in `u32` bytes, so a segment stays below 4 GiB.
pub const SEGMENT_BYTES_MAX: u64 = (1 << 32) - UNIT_BYTES;
/// A volume needs one segment to write into and one to reclaim.
pub const SEGMENT_COUNT_MIN: u32 = 2;

const WHAT: &str = "superblock";
const CRC_OFFSET: usize = 120;

const _: () = assert!(ENCODED_BYTES as u64 <= UNIT_BYTES);
const _: () = assert!(CRC_OFFSET + 4 <= ENCODED_BYTES);
const _: () = assert!(SEGMENT_BYTES_MAX.is_multiple_of(UNIT_BYTES));

/// The decoded superblock.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Superblock {
    /// Which copy this is: 0 (A) or 1 (B).
    pub copy: u32,
    /// Random identity of the volume; every segment header and checkpoint repeats it.
    pub volume_id: [u8; 16],
    /// When the volume was created, in milliseconds since the Unix epoch.
    pub created_unix_ms: u64,
    /// Usable size of the volume file or device, in bytes.
    pub capacity_bytes: u64,
    /// Size of every segment, a multiple of 4 KiB.
    pub segment_size_bytes: u64,
    /// Number of segments.
    pub segment_count: u32,
    /// Byte offset of segment 0.
    pub data_offset: u64,
    /// Byte offset of the first of two checkpoint slots, or 0 when checkpoints are files beside
    /// the volume (a directory volume).
    pub checkpoint_offset: u64,
    /// Size of each checkpoint slot in bytes; 0 when checkpoints are files.
    pub checkpoint_slot_bytes: u64,
    /// The newest segment use reclaimed while older ones were still in the log.
    pub freed_ahead: FreedAhead,
}

/// The newest segment use reclaimed while an older use was still in the log (zeros: none yet).
///
/// Such a use may have held the newest version or the deletion of a key whose older version
/// lies in an older use. Only a checkpoint remembers that it is gone: the log alone would bring
/// that older version back. So recovery that loads no checkpoint, or one older than
/// `checkpoint_seq`, voids every key whose newest record lies in a use below `seq`: damage
/// turns keys into misses, never into older versions (docs/format.md, "Damage").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FreedAhead {
    /// The highest seq of a use reclaimed ahead of an older one; 0: none.
    pub seq: u64,
    /// The checkpoint that knows it is gone: the one reclaim wrote before freeing it, or the
    /// newest on disk then, which covered it.
    pub checkpoint_seq: u64,
}

/// Highest seq a superblock may record for a segment use or checkpoint: far beyond any a volume
/// reaches (a use per microsecond for 140,000 years), and room to count on from it.
pub const SEQ_MAX: u64 = 1 << 62;

impl FreedAhead {
    /// With use `seq` freed ahead too, known gone by checkpoint `checkpoint_seq`: the highest of
    /// each, so that the record covers every use freed so far.
    pub fn and(self, seq: u64, checkpoint_seq: u64) -> FreedAhead {
        FreedAhead { seq: self.seq.max(seq), checkpoint_seq: self.checkpoint_seq.max(checkpoint_seq) }
    }

    /// Whether recovery from the checkpoint `loaded` (none: the log alone) must void the keys
    /// whose newest record lies in a use below [`FreedAhead::seq`].
    pub fn voids_from(&self, loaded: Option<u64>) -> bool {
        self.seq != 0 && loaded.is_none_or(|seq| seq < self.checkpoint_seq)
    }
}

impl Superblock {
    /// Byte offset of segment `index`.
    pub fn segment_offset(&self, index: u32) -> u64 {
        self.data_offset + u64::from(index) * self.segment_size_bytes
    }

    /// Byte offset of unit `unit` of segment `segment`: where a record at that location starts.
    pub fn unit_offset(&self, segment: u32, unit: u32) -> u64 {
        self.segment_offset(segment) + u64::from(unit) * UNIT_BYTES
    }

    /// Units (4 KiB) per segment.
    pub fn segment_units(&self) -> u32 {
        // validate() bounds segment_size_bytes below 2^32, so this cannot truncate.
        (self.segment_size_bytes / UNIT_BYTES) as u32
    }

    /// Encodes copy `copy` into one 4 KiB unit.
    pub fn encode(&self, copy: u32) -> Vec<u8> {
        let mut w = Writer::with_capacity(UNIT_BYTES as usize);
        w.bytes(&MAGIC);
        w.u32(VERSION);
        w.u32(copy);
        w.bytes(&self.volume_id);
        w.u64(self.created_unix_ms);
        w.u64(self.capacity_bytes);
        w.u64(self.segment_size_bytes);
        w.u32(self.segment_count);
        w.u32(0); // flags: none defined in version 1
        w.u64(self.data_offset);
        w.u64(self.checkpoint_offset);
        w.u64(self.checkpoint_slot_bytes);
        w.u64(self.freed_ahead.seq);
        w.u64(self.freed_ahead.checkpoint_seq);
        w.zeros(CRC_OFFSET - w.buf.len());
        let crc = crate::crc32c_of(&[&w.buf]);
        w.u32(crc);
        w.zeros(UNIT_BYTES as usize - w.buf.len());
        w.buf
    }

    /// Decodes and validates one copy.
    pub fn decode(buf: &[u8]) -> Result<Superblock, FormatError> {
        let mut r = Reader::new(WHAT, buf);
        let head = r.take(ENCODED_BYTES)?;
        let mut r = Reader::new(WHAT, head);
        check_magic(WHAT, r.take(8)?, &MAGIC)?;
        let version = r.u32()?;
        let crc_region = head.get(..CRC_OFFSET).unwrap_or_default();
        let stored_crc = u32::from_le_bytes(
            head.get(CRC_OFFSET..CRC_OFFSET + 4).and_then(|s| s.try_into().ok()).unwrap_or_default(),
        );
        check_crc(WHAT, stored_crc, &[crc_region])?;
        check_version(WHAT, version, VERSION)?;
        let copy = r.u32()?;
        let volume_id = r.array()?;
        let created_unix_ms = r.u64()?;
        let capacity_bytes = r.u64()?;
        let segment_size_bytes = r.u64()?;
        let segment_count = r.u32()?;
        let flags = r.u32()?;
        let data_offset = r.u64()?;
        let checkpoint_offset = r.u64()?;
        let checkpoint_slot_bytes = r.u64()?;
        let freed_ahead = FreedAhead { seq: r.u64()?, checkpoint_seq: r.u64()? };
        if flags != 0 {
            return Err(FormatError::invalid(WHAT, "flags", format!("unknown flags {flags:#x}")));
        }
        let sb = Superblock {
            copy,
            volume_id,
            created_unix_ms,
            capacity_bytes,
            segment_size_bytes,
            segment_count,
            data_offset,
            checkpoint_offset,
            checkpoint_slot_bytes,
            freed_ahead,
        };
        sb.validate()?;
        Ok(sb)
    }

    /// Checks the geometry: segments fit in the capacity, everything is unit-aligned and in range.
    pub fn validate(&self) -> Result<(), FormatError> {
        let bad = |field, detail: String| Err(FormatError::invalid(WHAT, field, detail));
        if self.copy > 1 {
            return bad("copy", format!("{} is neither 0 nor 1", self.copy));
        }
        if !self.segment_size_bytes.is_multiple_of(UNIT_BYTES)
            || !(SEGMENT_BYTES_MIN..=SEGMENT_BYTES_MAX).contains(&self.segment_size_bytes)
        {
            return bad(
                "segment_size_bytes",
                format!(
                    "{} is not a multiple of 4 KiB between {SEGMENT_BYTES_MIN} and {SEGMENT_BYTES_MAX}",
                    self.segment_size_bytes
                ),
            );
        }
        if self.freed_ahead.seq > SEQ_MAX || self.freed_ahead.checkpoint_seq > SEQ_MAX {
            return bad("freed_ahead", format!("{:?} is beyond any seq a volume reaches", self.freed_ahead));
        }
        if self.segment_count < SEGMENT_COUNT_MIN {
            return bad("segment_count", format!("{} is below the minimum of {SEGMENT_COUNT_MIN}", self.segment_count));
        }
        let checkpoint_end = self.checkpoint_offset.saturating_add(self.checkpoint_slot_bytes.saturating_mul(2));
        if !self.checkpoint_slot_bytes.is_multiple_of(UNIT_BYTES)
            || (self.checkpoint_slot_bytes != 0 && self.checkpoint_offset < 2 * UNIT_BYTES)
        {
            return bad("checkpoint_offset", "checkpoint slots overlap the superblocks or are unaligned".into());
        }
        if !self.data_offset.is_multiple_of(UNIT_BYTES)
            || self.data_offset < 2 * UNIT_BYTES
            || self.data_offset < checkpoint_end
        {
            return bad("data_offset", format!("{} overlaps the superblocks or checkpoints", self.data_offset));
        }
        let end = u64::from(self.segment_count)
            .checked_mul(self.segment_size_bytes)
            .and_then(|v| v.checked_add(self.data_offset));
        match end {
            Some(end) if end <= self.capacity_bytes => Ok(()),
            _ => bad(
                "segment_count",
                format!(
                    "{} segments of {} bytes from offset {} do not fit in {} bytes",
                    self.segment_count, self.segment_size_bytes, self.data_offset, self.capacity_bytes
                ),
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use proptest::prelude::*;

    fn sample() -> Superblock {
        Superblock {
            copy: 0,
            volume_id: [7; 16],
            created_unix_ms: 1_700_000_000_000,
            capacity_bytes: 1 << 30,
            segment_size_bytes: 64 << 20,
            segment_count: 15,
            data_offset: 1 << 20,
            checkpoint_offset: 0,
            checkpoint_slot_bytes: 0,
            freed_ahead: FreedAhead { seq: 41, checkpoint_seq: 9 },
        }
    }

    #[test]
    fn round_trips_both_copies() {
        let sb = sample();
        for copy in 0..2 {
            let decoded = Superblock::decode(&sb.encode(copy)).unwrap();
            assert_eq!(decoded, Superblock { copy, ..sb.clone() });
        }
    }

    #[test]
    fn golden_bytes_match_the_spec() {
        let enc = sample().encode(1);
        assert_eq!(enc.len(), 4096);
        assert_eq!(&enc[0..8], b"KVHOARD\0");
        assert_eq!(&enc[8..12], &1u32.to_le_bytes());
        assert_eq!(&enc[12..16], &1u32.to_le_bytes());
        assert_eq!(&enc[16..32], &[7u8; 16]);
        assert_eq!(&enc[40..48], &(1u64 << 30).to_le_bytes());
        assert_eq!(&enc[48..56], &(64u64 << 20).to_le_bytes());
        assert_eq!(&enc[56..60], &15u32.to_le_bytes());
        assert_eq!(&enc[64..72], &(1u64 << 20).to_le_bytes());
        assert_eq!(&enc[88..96], &41u64.to_le_bytes());
        assert_eq!(&enc[96..104], &9u64.to_le_bytes());
        assert!(enc[104..120].iter().all(|&b| b == 0));
        let crc = crc32c::crc32c(&enc[..120]);
        assert_eq!(&enc[120..124], &crc.to_le_bytes());
        assert!(enc[124..].iter().all(|&b| b == 0));
    }

    /// A volume written before the field has zeros there: nothing was freed ahead.
    #[test]
    fn zeros_mean_nothing_freed_ahead_and_an_older_checkpoint_voids() {
        let mut sb = sample();
        sb.freed_ahead = FreedAhead::default();
        let decoded = Superblock::decode(&sb.encode(0)).unwrap();
        assert_eq!(decoded.freed_ahead, FreedAhead::default());
        assert!(!decoded.freed_ahead.voids_from(None));
        let f = FreedAhead { seq: 41, checkpoint_seq: 9 };
        assert!(f.voids_from(None));
        assert!(f.voids_from(Some(8)));
        assert!(!f.voids_from(Some(9)));
        assert!(!f.voids_from(Some(10)));
        assert_eq!(f.and(7, 12), FreedAhead { seq: 41, checkpoint_seq: 12 });
        assert_eq!(f.and(50, 3), FreedAhead { seq: 50, checkpoint_seq: 9 });
    }

    #[test]
    fn a_freed_ahead_seq_no_volume_reaches_is_rejected() {
        let mut sb = sample();
        sb.freed_ahead.seq = u64::MAX;
        assert!(Superblock::decode(&sb.encode(0)).is_err());
    }

    #[test]
    fn truncated_superblock_is_rejected() {
        let enc = sample().encode(0);
        assert!(matches!(Superblock::decode(&enc[..100]), Err(FormatError::Truncated { .. })));
    }

    #[test]
    fn bad_magic_is_rejected() {
        let mut enc = sample().encode(0);
        enc[0] = b'X';
        assert!(matches!(Superblock::decode(&enc), Err(FormatError::BadMagic { .. })));
    }

    #[test]
    fn flipped_bit_is_a_checksum_mismatch() {
        let mut enc = sample().encode(0);
        enc[45] ^= 0x10;
        assert!(matches!(Superblock::decode(&enc), Err(FormatError::ChecksumMismatch { .. })));
    }

    #[test]
    fn newer_version_is_rejected_with_upgrade_hint() {
        let mut enc = sample().encode(0);
        enc[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c::crc32c(&enc[..120]);
        enc[120..124].copy_from_slice(&crc.to_le_bytes());
        let err = Superblock::decode(&enc).unwrap_err();
        assert!(matches!(err, FormatError::UnsupportedVersion { found: 2, .. }));
        assert!(err.to_string().contains("upgrade"));
    }

    #[test]
    fn geometry_that_does_not_fit_is_rejected() {
        let sb = Superblock { segment_count: 1000, ..sample() };
        assert!(matches!(
            Superblock::decode(&sb.encode(0)),
            Err(FormatError::InvalidField { field: "segment_count", .. })
        ));
        let sb = Superblock { segment_size_bytes: 4097, ..sample() };
        assert!(Superblock::decode(&sb.encode(0)).is_err());
        let sb = Superblock { segment_count: u32::MAX, segment_size_bytes: SEGMENT_BYTES_MAX, ..sample() };
        assert!(Superblock::decode(&sb.encode(0)).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
            let _ = Superblock::decode(&bytes);
        }
    }
}
