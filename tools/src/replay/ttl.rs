//! How long a replay keeps what it stores: no TTL, one TTL, or group TTL learned online from the
//! requests seen so far (`kvhoard_engine::placement::group_ttl`, the same code the engine's
//! policy uses), recomputed as trace time passes.

use kvhoard_engine::placement::group_ttl::{Access, AccessWindow, Curves, GroupTtlConfig, TtlPlan, FOREVER};

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

/// Group TTL as a replay runs it: accesses recorded, TTLs recomputed as often as the span seen so
/// far (1 s at least), then every quarter window.
pub struct GroupTtl {
    window: AccessWindow,
    config: GroupTtlConfig,
    budget_bytes: u64,
    first_ms: Option<u64>,
    next_plan_ms: u64,
    plan: Option<(Curves, TtlPlan)>,
    /// Times the TTLs were recomputed.
    pub recomputed: u64,
    /// Still learning (not planned once and for all).
    learning: bool,
}

impl GroupTtl {
    /// Group TTL within `budget_bytes` of mean stored bytes.
    pub fn new(budget_bytes: u64, config: GroupTtlConfig) -> GroupTtl {
        GroupTtl {
            window: AccessWindow::new(config),
            config,
            budget_bytes,
            first_ms: None,
            next_plan_ms: 0,
            plan: None,
            recomputed: 0,
            learning: true,
        }
    }

    /// Group TTL planned once from all of `trace` (arrivals sped up by `time_scale`, blocks of
    /// `bytes` stored): a budget of `budget_bytes` over the trace's duration.
    pub fn known(trace: &Trace, time_scale: f64, bytes: u64, budget_bytes: u64, config: GroupTtlConfig) -> GroupTtl {
        let whole = GroupTtlConfig { window_ms: u64::MAX, max_accesses: usize::MAX, ..config };
        let curves = Curves::from_accesses(trace_accesses(trace, time_scale, bytes), whole);
        let plan = curves.optimise(budget_bytes as f64 * trace.duration_s() / time_scale);
        let mut g = GroupTtl::new(budget_bytes, config);
        g.plan = Some((curves, plan));
        g.recomputed = 1;
        g.learning = false;
        g
    }

    /// Records a request's blocks (each `bytes` stored) of context `group` at `now_ms`.
    pub fn observe(&mut self, now_ms: u64, blocks: &[u64], group: u64, bytes: u64) {
        if !self.learning {
            return;
        }
        self.first_ms.get_or_insert(now_ms);
        for &block in blocks {
            self.window.record(Access { at_ms: now_ms, block, group, bytes });
        }
    }

    /// The TTL for a block of `group` stored at `now_ms`, ms; `None` (kept until evicted) until
    /// the first plan, or where the plan keeps the group without a TTL.
    pub fn ttl_ms(&mut self, now_ms: u64, group: u64) -> Option<u64> {
        if self.learning && now_ms >= self.next_plan_ms {
            // The budget in byte-seconds over the span the window covers.
            let span_s = now_ms.saturating_sub(self.first_ms.unwrap_or(now_ms)).min(self.config.window_ms) as f64 / 1e3;
            if span_s > 0.0 {
                let curves = self.window.curves();
                let plan = curves.optimise(self.budget_bytes as f64 * span_s);
                self.plan = Some((curves, plan));
                self.recomputed += 1;
            }
            // Often while little is known, then every quarter window.
            let span = now_ms.saturating_sub(self.first_ms.unwrap_or(now_ms));
            self.next_plan_ms = now_ms + span.clamp(1000, (self.config.window_ms / 4).max(1000));
        }
        self.plan.as_ref().map(|(curves, plan)| curves.ttl_of(plan, group)).filter(|&t| t != FOREVER)
    }
}
