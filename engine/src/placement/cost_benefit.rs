//! Choosing the segment to clean by cost-benefit, as LFS does (Rosenblum and Ousterhout, 1992):
//! cleaning a segment whose live fraction is `u` reads it whole and writes back `u` of it to free
//! `1 - u`, so its cost is `1 + u`; the space it frees stays free longer the older (colder) its
//! data. The benefit-to-cost ratio `(1 - u) · age / (1 + u)` prefers segments mostly dead, and among
//! those the old ones, over the plain oldest (which may still be full of live data).

use super::SegmentView;

/// The candidate with the best benefit-to-cost ratio at `now_unix_ms`; ties go to the oldest.
pub fn cost_benefit(candidates: &[SegmentView], now_unix_ms: u64) -> Option<u32> {
    let score = |s: &SegmentView| {
        let used = f64::from(s.end_unit.max(1));
        let u = (f64::from(s.live_units) / used).clamp(0.0, 1.0);
        // A millisecond's age at least, so that a fresh segment still ranks by its live fraction.
        let age = now_unix_ms.saturating_sub(s.created_unix_ms).max(1) as f64;
        (1.0 - u) * age / (1.0 + u)
    };
    candidates.iter().max_by(|a, b| score(a).total_cmp(&score(b)).then(b.seq.cmp(&a.seq))).map(|s| s.index)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn seg(index: u32, seq: u64, created: u64, live: u32) -> SegmentView {
        SegmentView { index, seq, created_unix_ms: created, end_unit: 100, live_units: live }
    }

    #[test]
    fn a_mostly_dead_segment_beats_an_older_full_one() {
        let now = 10_000;
        // The oldest is all live; a younger one is nearly empty.
        assert_eq!(cost_benefit(&[seg(0, 1, 0, 100), seg(1, 2, 5_000, 10)], now), Some(1));
        // Equal live fractions: the older one.
        assert_eq!(cost_benefit(&[seg(0, 1, 0, 50), seg(1, 2, 5_000, 50)], now), Some(0));
        assert_eq!(cost_benefit(&[], now), None);
    }
}
