//! The log: segment states, the open segment's reservations and written watermark, and reading
//! a segment's records back.
//!
//! Space in the open segment is reserved under the store's log lock, in log order; the writes
//! themselves run outside the lock, possibly out of order. A record is acknowledged only when
//! every record before it in the segment has been written, so recovery, which stops at the first
//! invalid record, never loses an acknowledged one.

pub mod scan;
pub mod seal;

use std::collections::BTreeSet;

use kvhoard_format::summary;
use kvhoard_format::UNIT_BYTES;

/// A position in the log: segment use `seq`, unit within it. Later positions compare greater.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct Pos {
    /// Segment use.
    pub seq: u64,
    /// Unit within the segment.
    pub unit: u32,
}

/// What a segment holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SegState {
    /// Unused.
    Free,
    /// Being appended to.
    Open,
    /// Full; its summary is written.
    Sealed {
        /// First unit after its records.
        end_unit: u32,
    },
}

/// One segment's state and the seq of its current use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegInfo {
    /// State.
    pub state: SegState,
    /// Seq of the current use; 0 when free.
    pub seq: u64,
    /// When the current use began.
    pub created_unix_ms: u64,
}

impl SegInfo {
    /// A free segment.
    pub const FREE: SegInfo = SegInfo { state: SegState::Free, seq: 0, created_unix_ms: 0 };
}

/// The segment being appended to.
#[derive(Debug)]
pub struct OpenSeg {
    /// Segment index.
    pub index: u32,
    /// Seq of this use.
    pub seq: u64,
    /// Next free unit.
    pub tail: u32,
    /// Summary entries of the records reserved so far.
    pub summary: Vec<u8>,
    /// Number of records reserved.
    pub records: u32,
    /// Start units of records reserved but not yet written.
    pub in_flight: BTreeSet<u32>,
}

impl OpenSeg {
    /// A fresh segment use; unit 0 holds its header.
    pub fn new(index: u32, seq: u64) -> OpenSeg {
        OpenSeg { index, seq, tail: 1, summary: Vec::new(), records: 0, in_flight: BTreeSet::new() }
    }

    /// Whether a record of `units` with a header of `header_len` bytes still fits, leaving room
    /// for the summary (including its entry) and the trailer.
    pub fn fits(&self, units: u32, header_len: usize, segment_units: u32) -> bool {
        let summary_bytes = self.summary.len() + summary::entry_bytes(header_len);
        let needed = u64::from(self.tail) + u64::from(units) + units_for(summary_bytes) + 1;
        needed <= u64::from(segment_units)
    }

    /// Reserves the next `units` units for a record with the encoded header `header`.
    pub fn reserve(&mut self, units: u32, header: &[u8]) -> u32 {
        let unit = self.tail;
        summary::encode_entry(&mut self.summary, unit, header);
        self.records += 1;
        self.tail += units;
        self.in_flight.insert(unit);
        unit
    }

    /// Every record that starts before `unit` has been written.
    pub fn written_before(&self, unit: u32) -> bool {
        self.in_flight.range(..unit).next().is_none()
    }

    /// The position through which every record has been written.
    pub fn written_through(&self) -> Pos {
        Pos { seq: self.seq, unit: self.in_flight.first().copied().unwrap_or(self.tail) }
    }
}

/// Units needed for `bytes`.
pub fn units_for(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(UNIT_BYTES)
}

/// Whether a record of `units` with a header of `header_len` fits in an empty segment.
pub fn fits_empty(units: u32, header_len: usize, segment_units: u32) -> bool {
    OpenSeg::new(0, 1).fits(units, header_len, segment_units)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_leave_room_for_summary_and_trailer() {
        let mut seg = OpenSeg::new(0, 1);
        let header = vec![0u8; 300];
        let units = 16;
        let mut n = 0;
        while seg.fits(units, header.len(), 256) {
            seg.reserve(units, &header);
            n += 1;
        }
        assert_eq!(n, 15);
        assert!(u64::from(seg.tail) + units_for(seg.summary.len()) < 256);
    }

    #[test]
    fn watermark_waits_for_the_earliest_unwritten_record() {
        let mut seg = OpenSeg::new(0, 7);
        let a = seg.reserve(2, &[0; 200]);
        let b = seg.reserve(2, &[0; 200]);
        seg.in_flight.remove(&b);
        assert!(!seg.written_before(b));
        assert_eq!(seg.written_through(), Pos { seq: 7, unit: a });
        seg.in_flight.remove(&a);
        assert!(seg.written_before(b));
        assert_eq!(seg.written_through(), Pos { seq: 7, unit: 5 });
    }
}
