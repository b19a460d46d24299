//! The open segment: reservations in log order and the written watermark.

use std::collections::BTreeSet;

use kvhoard_format::summary;

use super::{units_for, Pos};

/// The segment being appended to.
#[derive(Debug)]
pub(crate) struct OpenSeg {
    /// Segment index.
    pub(crate) index: u32,
    /// Seq of this use.
    pub(crate) seq: u64,
    /// Next free unit.
    pub(crate) tail: u32,
    /// Summary entries of the records reserved so far.
    pub(crate) summary: Vec<u8>,
    /// Number of records reserved.
    pub(crate) records: u32,
    /// Start units of records reserved but not yet written.
    pub(crate) in_flight: BTreeSet<u32>,
}

impl OpenSeg {
    /// A fresh segment use; unit 0 holds its header.
    pub(crate) fn new(index: u32, seq: u64) -> OpenSeg {
        OpenSeg { index, seq, tail: 1, summary: Vec::new(), records: 0, in_flight: BTreeSet::new() }
    }

    /// Whether a record of `units` with a header of `header_len` bytes still fits, leaving room
    /// for the summary (including its entry) and the trailer.
    pub(crate) fn fits(&self, units: u32, header_len: usize, segment_units: u32) -> bool {
        let summary_bytes = self.summary.len() + summary::entry_bytes(header_len);
        let needed = u64::from(self.tail) + u64::from(units) + units_for(summary_bytes) + 1;
        needed <= u64::from(segment_units)
    }

    /// Reserves the next `units` units for a record with the encoded header `header`.
    pub(crate) fn reserve(&mut self, units: u32, header: &[u8]) -> u32 {
        let unit = self.tail;
        summary::encode_entry(&mut self.summary, unit, header);
        self.records += 1;
        self.tail += units;
        self.in_flight.insert(unit);
        unit
    }

    /// Every record that starts before `unit` has been written.
    pub(crate) fn written_before(&self, unit: u32) -> bool {
        self.in_flight.range(..unit).next().is_none()
    }

    /// The position through which every record has been written.
    pub(crate) fn written_through(&self) -> Pos {
        Pos { seq: self.seq, unit: self.in_flight.first().copied().unwrap_or(self.tail) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::log::units_for;

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
