//! The log: where records go, in what order, and when they count as written and durable.
//!
//! - [`Log`] (`state.rs`) is the log's state machine: segment states, the open segment's
//!   reservations and written watermark, sealing, starting and resuming segments, freeing a
//!   reclaimed one, and the summaries that wait for a sync. Every transition happens under its
//!   lock, in log order; the record writes themselves are the log writer thread's
//!   (`crate::writer`), outside it, possibly out of order.
//! - `commit.rs`: group commit, one fdatasync for every writer waiting for one.
//! - `scan.rs` reads records back (one for a get, a whole segment for recovery and listing);
//!   `seal.rs` writes a sealed segment's summary and trailer.
//!
//! A record is acknowledged only when every record before it in the segment has been written,
//! so recovery, which stops at the first invalid record, never loses an acknowledged one.

mod commit;
mod open_seg;
pub(crate) mod probe;
pub(crate) mod scan;
pub(crate) mod seal;
mod state;

pub(crate) use commit::GroupCommit;
pub(crate) use open_seg::OpenSeg;
pub(crate) use state::{Log, LogState};

use kvhoard_format::UNIT_BYTES;

/// Where a record starts: segment and unit within it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Loc {
    /// Segment index.
    pub segment: u32,
    /// Unit from the segment's start.
    pub unit: u32,
}

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

/// Units needed for `bytes`.
pub(crate) fn units_for(bytes: usize) -> u64 {
    (bytes as u64).div_ceil(UNIT_BYTES)
}

/// Whether a record of `units` with a header of `header_len` fits in an empty segment.
#[cfg(test)]
fn fits_empty(units: u32, header_len: usize, segment_units: u32) -> bool {
    OpenSeg::new(0, 1).fits(units, header_len, segment_units)
}

/// The largest payload a record with a header of `header_len` bytes can carry in a segment of
/// `segment_units` units: the segment less its header unit, the record's header units, the
/// record's summary entry and the trailer unit. The one formula behind every size limit.
pub(crate) fn max_payload_bytes(segment_units: u32, header_len: usize) -> u64 {
    let header_units = units_for(header_len);
    let fixed = 1 + header_units + units_for(kvhoard_format::summary::entry_bytes(header_len)) + 1;
    u64::from(segment_units).saturating_sub(fixed) * UNIT_BYTES
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_largest_payload_fits_and_one_unit_more_does_not() {
        for (segment_units, header_len) in [(256u32, 300usize), (256, 4088), (256, 5000), (16384, 60_000)] {
            let max = max_payload_bytes(segment_units, header_len);
            let units = |payload: u64| (units_for(header_len) + payload.div_ceil(UNIT_BYTES)) as u32;
            assert!(fits_empty(units(max), header_len, segment_units), "{segment_units} {header_len}");
            assert!(!fits_empty(units(max + 1), header_len, segment_units), "{segment_units} {header_len}");
        }
    }
}
