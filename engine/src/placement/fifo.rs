//! The baseline placement: what a cache without a planner does.

use super::{BlockInfo, Placement, PlacementReport, PutPlan, SegmentView};

/// Every block goes to the DRAM tier (which evicts the least recently used), and a full volume
/// reclaims its oldest segment, dropping what it holds. The planner is measured against this.
#[derive(Debug, Default, Clone, Copy)]
pub struct Fifo;

impl Fifo {
    /// The oldest of `segments` (lowest seq).
    pub fn oldest(segments: &[SegmentView]) -> Option<u32> {
        segments.iter().min_by_key(|s| s.seq).map(|s| s.index)
    }
}

impl Placement for Fifo {
    fn on_put(&self, _: &BlockInfo<'_>) -> PutPlan {
        PutPlan { dram: true }
    }

    fn on_load(&self, _: &BlockInfo<'_>) -> bool {
        true
    }

    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        Fifo::oldest(candidates).unwrap_or(0)
    }

    fn report(&self) -> PlacementReport {
        PlacementReport { policy: "fifo".into(), ..PlacementReport::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_oldest_segment_is_the_victim() {
        let v = |index, seq| SegmentView { index, seq, created_unix_ms: 0, end_unit: 1, live_units: 0 };
        assert_eq!(Fifo.victim(&[v(0, 9), v(1, 3), v(2, 5)]), 1);
        assert_eq!(Fifo::oldest(&[]), None);
    }
}
