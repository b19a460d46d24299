//! How long a replay keeps what it stores: no TTL, one TTL, or group TTL learned online from the
//! requests seen so far (`kvhoard_engine::placement::group_ttl::TtlLearner`, the learner the
//! engine keeps per namespace), planned again as trace time passes.

use kvhoard_engine::placement::group_ttl::{Access, Curves, GroupTtlConfig, TtlLearner};

use super::trace::Trace;

/// The TTL rule of a replay.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum TtlSpec {
    /// Kept until evicted.
    None,
    /// Every block for this many seconds.
    Single(u32),
    /// Per group, within a budget of this many bytes stored on average over the window.
    Group {
        /// Mean bytes the TTLs may keep stored.
        budget_bytes: u64,
        /// Groups, window, candidates.
        config: GroupTtlConfig,
        /// Plan once from the whole trace (what an operator planning from yesterday's traffic
        /// does, and how the best single TTL is chosen) instead of learning online.
        known: bool,
    },
}

/// Every block reference of `trace` as an access at its arrival (sped up by `time_scale`), each
/// `bytes` stored, grouped by context.
pub fn trace_accesses(trace: &Trace, time_scale: f64, bytes: u64) -> impl Iterator<Item = Access> + '_ {
    trace.requests.iter().flat_map(move |r| {
        let (group, at_ms) = (trace.context(r), (r.timestamp_ms as f64 / time_scale) as u64);
        r.blocks.iter().map(move |&block| Access { at_ms, block, group, bytes })
    })
}

/// Group TTL planned once from all of `trace` (arrivals sped up by `time_scale`, blocks of `bytes`
/// stored): a budget of `budget_bytes` over the trace's duration. What an operator planning from
/// yesterday's traffic does, and how the best single TTL is chosen.
pub fn known(trace: &Trace, time_scale: f64, bytes: u64, budget_bytes: u64, config: GroupTtlConfig) -> TtlLearner {
    let whole = GroupTtlConfig { window_ms: u64::MAX, max_accesses: usize::MAX, ..config };
    let curves = Curves::from_accesses(trace_accesses(trace, time_scale, bytes), whole);
    let plan = curves.optimise(budget_bytes as f64 * trace.duration_s() / time_scale);
    TtlLearner::planned(budget_bytes, config, curves, plan)
}
