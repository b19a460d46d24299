//! Choosing which segment to empty when the volume is full.
//!
//! Space comes back a whole segment at a time. The baseline drops what the oldest segment holds
//! (a cache evicts its oldest entries); better policies, which copy valuable blocks forward,
//! plug in here.

/// A sealed segment as a policy sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentView {
    /// Segment index.
    pub index: u32,
    /// Seq of its current use: lower is older.
    pub seq: u64,
    /// When its current use began.
    pub created_unix_ms: u64,
    /// Units its records occupy.
    pub end_unit: u32,
}

/// Chooses the segment to reclaim.
pub trait ReclaimPolicy: Send + Sync + std::fmt::Debug {
    /// Returns the index of one of `sealed` (never empty), or `None` to refuse, in which case
    /// the engine falls back to the oldest.
    fn choose_victim(&self, sealed: &[SegmentView]) -> Option<u32>;
}

/// Reclaims the oldest sealed segment and drops its blocks.
#[derive(Debug, Default, Clone, Copy)]
pub struct OldestFirst;

impl ReclaimPolicy for OldestFirst {
    fn choose_victim(&self, sealed: &[SegmentView]) -> Option<u32> {
        sealed.iter().min_by_key(|s| s.seq).map(|s| s.index)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn oldest_first_picks_the_lowest_seq() {
        let v = |index, seq| SegmentView { index, seq, created_unix_ms: 0, end_unit: 1 };
        assert_eq!(OldestFirst.choose_victim(&[v(0, 9), v(1, 3), v(2, 5)]), Some(1));
        assert_eq!(OldestFirst.choose_victim(&[]), None);
    }
}
