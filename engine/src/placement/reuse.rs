//! A context's chance of being used again, as the planner's `freq` weighs it.
//!
//! **Weight.** A context used `k` times is used again with a chance that grows with `k` and
//! levels off: `k / (k + 2)` (1/3 after one use, 1/2 after two, 3/5 after three). On the
//! Mooncake conversation trace the measured chances after one to six uses are 0.31, 0.42,
//! 0.51, 0.59, 0.59, 0.67 (docs/benchmarks.md): the shape, not a fit.
//!
//! **Recency.** The weight halves with every half-life since the context's last use: a context
//! whose next use has not come for a long while most likely has none. The half-life follows the
//! median gap between two uses of a context: at the median gap, half of the next uses have come
//! (the survival of a gap is one half there, as `2^(-gap / half-life)` says). A workload whose
//! conversations pause for seconds and one whose pause for hours are both ranked by the chance
//! of their own next use, with no setting to tune.
//!
//! **Uses.** Accesses within [`SAME_USE_MS`] of the first of them are one use (the chunks of one
//! request, a lookup and the put that follows it), so that a request is not counted as many
//! uses; a context read without a pause starts a new use every [`SAME_USE_MS`]. Only a pause of
//! [`SAME_USE_MS`] or more between two accesses is a gap the half-life learns from.
//!
//! The score `ln(weight) + last use / half-life · ln 2` orders contexts as `weight ·
//! 2^(-age / half-life)` does at every instant, so time alone reorders nothing (the planner's
//! heaps stay valid); a new half-life rescores every context, O(contexts), and comes at most
//! once per [`GAP_REFRESH`] gaps, and only when the median moved by more than
//! [`HALF_LIFE_DRIFT`].

/// Accesses of a context closer than this are one use.
pub const SAME_USE_MS: u64 = 1_000;
/// Gaps the median is taken over: the latest ones.
pub const GAP_WINDOW: usize = 1_024;
/// New gaps between two estimates of the median.
pub const GAP_REFRESH: usize = 256;
/// How far (as a factor) the median must move from the half-life in use to replace it.
pub const HALF_LIFE_DRIFT: f64 = 1.25;
/// The half-life learned stays within these bounds, ms: a second, a day.
pub const HALF_LIFE_BOUNDS_MS: (u64, u64) = (1_000, 86_400_000);

/// ln of the weight of a context used `uses` times (`-inf` for none).
pub fn ln_weight(uses: u32) -> f64 {
    let k = f64::from(uses);
    (k / (k + 2.0)).ln()
}

/// The latest gaps between uses of a context, and the half-life they call for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GapLearner {
    /// A ring of the latest [`GAP_WINDOW`] gaps, ms.
    gaps: Vec<u64>,
    /// Where the next gap goes once the ring is full.
    next: usize,
    /// Gaps since the last estimate.
    fresh: usize,
}

impl GapLearner {
    /// Records a gap between two uses; every [`GAP_REFRESH`] gaps, returns their window's median
    /// (within [`HALF_LIFE_BOUNDS_MS`]): O(window log window) then, O(1) otherwise.
    pub fn record(&mut self, gap_ms: u64) -> Option<u64> {
        if self.gaps.len() < GAP_WINDOW {
            self.gaps.push(gap_ms);
        } else if let Some(slot) = self.gaps.get_mut(self.next) {
            *slot = gap_ms;
            self.next = (self.next + 1) % GAP_WINDOW;
        }
        self.fresh += 1;
        if self.fresh < GAP_REFRESH {
            return None;
        }
        self.fresh = 0;
        let mut sorted = self.gaps.clone();
        sorted.sort_unstable();
        let median = sorted.get(sorted.len() / 2).copied()?;
        Some(median.clamp(HALF_LIFE_BOUNDS_MS.0, HALF_LIFE_BOUNDS_MS.1))
    }
}

/// Whether a half-life of `learned` ms should replace `current`: it moved by more than
/// [`HALF_LIFE_DRIFT`] either way.
pub fn drifted(current: u64, learned: u64) -> bool {
    let ratio = learned.max(1) as f64 / current.max(1) as f64;
    !(1.0 / HALF_LIFE_DRIFT..=HALF_LIFE_DRIFT).contains(&ratio)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]

    use super::*;

    #[test]
    fn weight_grows_with_uses_and_levels_off() {
        assert_eq!(ln_weight(0), f64::NEG_INFINITY);
        let w: Vec<f64> = (1..=4).map(|k| ln_weight(k).exp()).collect();
        assert!((w[0] - 1.0 / 3.0).abs() < 1e-12 && (w[1] - 0.5).abs() < 1e-12);
        assert!(w.windows(2).all(|p| p[0] < p[1]) && ln_weight(u32::MAX) < 0.0);
    }

    #[test]
    fn the_median_of_the_latest_gaps_is_estimated_every_refresh() {
        let mut g = GapLearner::default();
        for i in 0..GAP_REFRESH - 1 {
            assert_eq!(g.record(10_000 + i as u64), None);
        }
        // 10,000..10,255 ms: the median is 10,128.
        assert_eq!(g.record(10_255), Some(10_128));
        // The window keeps the latest gaps: once it is all 60 s, so is the median.
        let mut last = None;
        for _ in 0..GAP_WINDOW {
            last = g.record(60_000).or(last);
        }
        assert_eq!(last, Some(60_000));
        // Out of bounds: clamped.
        let mut last = None;
        for _ in 0..GAP_WINDOW {
            last = g.record(0).or(last);
        }
        assert_eq!(last, Some(HALF_LIFE_BOUNDS_MS.0));
    }

    #[test]
    fn only_a_median_that_moved_enough_replaces_the_half_life() {
        assert!(!drifted(100_000, 120_000) && !drifted(100_000, 81_000));
        assert!(drifted(100_000, 126_000) && drifted(100_000, 79_000));
    }
}
