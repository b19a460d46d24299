//! Group TTL learned online: accesses recorded as they come, the TTLs planned again from the
//! window as time passes. The engine (per namespace, `namespaces.rs`) and `kvhoard replay` use it.
//!
//! Replanning: as often as the span seen so far (at least every second) while little is known,
//! then every quarter window. The budget is bytes kept stored on average, so the plan's
//! byte-seconds are that times the span the window covers. Planning costs O(accesses ×
//! candidates): the engine runs it on a background thread from a copy of the window
//! ([`TtlLearner::due`], [`TtlLearner::install`]); a replay plans inline ([`TtlLearner::ttl_ms`]).

use std::collections::HashMap;

use super::{Access, AccessWindow, Curves, GroupTtlConfig, TtlPlan, FOREVER};

/// Shortest time between two plans, ms.
const MIN_REPLAN_MS: u64 = 1000;

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct TtlLearner {
    window: AccessWindow,
    config: GroupTtlConfig,
    budget_bytes: u64,
    first_ms: Option<u64>,
    next_plan_ms: u64,
    plan: Option<(Curves, TtlPlan)>,
    /// The plan's TTL of each group with one of its own, and the residual group's (the TTL a put
    /// looks up, without walking the groups).
    ttls: (HashMap<u64, u64>, Option<u64>),
    /// Times the TTLs were planned.
    pub recomputed: u64,
    /// Still learning (not planned once and for all).
    learning: bool,
}

/// What planning needs, taken from a learner: its window and the byte-seconds it may spend.
#[derive(Debug, Clone)]
pub struct PlanInput {
    /// The accesses to plan from.
    pub window: AccessWindow,
    /// The budget over the span the window covers, byte-seconds.
    pub budget_byte_s: f64,
}

impl PlanInput {
    /// The curves of the window and the TTLs that fit the budget: the expensive part.
    pub fn plan(&self) -> (Curves, TtlPlan) {
        let curves = self.window.curves();
        let plan = curves.optimise(self.budget_byte_s);
        (curves, plan)
    }
}

impl TtlLearner {
    /// Group TTL within `budget_bytes` of mean stored bytes, learned from accesses.
    pub fn new(budget_bytes: u64, config: GroupTtlConfig) -> TtlLearner {
        TtlLearner {
            window: AccessWindow::new(config),
            config,
            budget_bytes,
            first_ms: None,
            next_plan_ms: 0,
            plan: None,
            ttls: (HashMap::new(), None),
            recomputed: 0,
            learning: true,
        }
    }

    /// Group TTL planned once and for all (from a whole trace): it learns nothing more.
    pub fn planned(budget_bytes: u64, config: GroupTtlConfig, curves: Curves, plan: TtlPlan) -> TtlLearner {
        let mut learner = TtlLearner { learning: false, ..TtlLearner::new(budget_bytes, config) };
        learner.install(curves, plan);
        learner
    }

    /// Its settings and budget.
    pub fn settings(&self) -> (GroupTtlConfig, u64) {
        (self.config, self.budget_bytes)
    }

    /// Records an access of `block` (of `bytes` stored) in `group` at `now_ms`.
    pub fn record(&mut self, now_ms: u64, block: u64, group: u64, bytes: u64) {
        if !self.learning {
            return;
        }
        self.first_ms.get_or_insert(now_ms);
        self.window.record(Access { at_ms: now_ms, block, group, bytes });
    }

    /// When a plan is due at `now_ms`: what planning needs (`None` when not due, or when the
    /// window spans no time yet). Sets the time of the next plan.
    pub fn due(&mut self, now_ms: u64) -> Option<PlanInput> {
        if !self.learning || now_ms < self.next_plan_ms {
            return None;
        }
        let span = now_ms.saturating_sub(self.first_ms.unwrap_or(now_ms));
        // Often while little is known, then every quarter window.
        self.next_plan_ms = now_ms + span.clamp(MIN_REPLAN_MS, (self.config.window_ms / 4).max(MIN_REPLAN_MS));
        let span_s = span.min(self.config.window_ms) as f64 / 1e3;
        (span_s > 0.0)
            .then(|| PlanInput { window: self.window.clone(), budget_byte_s: self.budget_bytes as f64 * span_s })
    }

    /// Makes a plan computed from [`TtlLearner::due`]'s input the one in force.
    pub fn install(&mut self, curves: Curves, plan: TtlPlan) {
        let mut own = HashMap::with_capacity(curves.groups.len());
        let mut residual = None;
        for (group, &ttl) in curves.groups.iter().zip(&plan.ttls_ms) {
            match group {
                Some(g) => {
                    own.insert(*g, ttl);
                }
                None => residual = Some(ttl),
            }
        }
        self.ttls = (own, residual.or(Some(plan.single_ttl_ms)));
        self.plan = Some((curves, plan));
        self.recomputed += 1;
    }

    /// The TTL of a block of `group` stored now, ms, by the plan in force: `None` (kept until
    /// evicted) before the first plan, or where the plan keeps the group without a TTL; 0 where
    /// the plan does not keep it.
    pub fn ttl_of(&self, group: u64) -> Option<u64> {
        let (own, residual) = &self.ttls;
        own.get(&group).copied().or(*residual).filter(|&t| t != FOREVER)
    }

    /// As [`TtlLearner::ttl_of`], planning first, here, when a plan is due at `now_ms`.
    pub fn ttl_ms(&mut self, now_ms: u64, group: u64) -> Option<u64> {
        if let Some(input) = self.due(now_ms) {
            let (curves, plan) = input.plan();
            self.install(curves, plan);
        }
        self.ttl_of(group)
    }

    /// The plan in force and the curves it was chosen on.
    pub fn plan(&self) -> Option<&(Curves, TtlPlan)> {
        self.plan.as_ref()
    }

    /// Accesses in the window.
    pub fn accesses(&self) -> usize {
        self.window.len()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn plans_are_due_often_then_every_quarter_window() {
        let config = GroupTtlConfig { window_ms: 60_000, ..GroupTtlConfig::default() };
        let mut l = TtlLearner::new(1 << 20, config);
        assert!(l.due(0).is_none(), "nothing seen yet: no span");
        // A hot group read every 2 s, a cold one once.
        for t in 0..30u64 {
            l.record(t * 2000, 1, 7, 1000);
        }
        l.record(500, 2, 8, 1000);
        let input = l.due(60_000).unwrap();
        let (curves, plan) = input.plan();
        l.install(curves, plan);
        assert_eq!(l.recomputed, 1);
        assert!(l.ttl_of(7).is_none_or(|t| t >= 2000), "the hot group lives from one access to the next");
        // The next plan is a quarter window away.
        assert!(l.due(60_000 + 14_999).is_none());
        assert!(l.due(60_000 + 15_000).is_some());
    }

    #[test]
    fn a_learner_gives_the_plans_ttl_of_every_group() {
        // Five groups read at different paces, two of them in the residual group.
        let config = GroupTtlConfig { top_k: 3, ..GroupTtlConfig::default() };
        let accesses = (0..400u64).map(|i| Access { at_ms: i * 500, block: i % 17, group: i % 5, bytes: 100 });
        let curves = Curves::from_accesses(accesses, config);
        let plan = curves.optimise(5e6);
        let expected: Vec<Option<u64>> =
            (0..8).map(|g| Some(curves.ttl_of(&plan, g)).filter(|&t| t != FOREVER)).collect();
        let mut online = TtlLearner::new(1, config);
        online.install(curves.clone(), plan.clone());
        let planned = TtlLearner::planned(1, config, curves, plan);
        for learner in [&online, &planned] {
            let got: Vec<Option<u64>> = (0..8).map(|g| learner.ttl_of(g)).collect();
            assert_eq!(got, expected);
        }
    }

    #[test]
    fn a_planned_learner_learns_nothing_more() {
        let curves = Curves::from_accesses(std::iter::empty(), GroupTtlConfig::default());
        let plan = curves.optimise(1.0);
        let mut l = TtlLearner::planned(1, GroupTtlConfig::default(), curves, plan);
        l.record(0, 1, 1, 1);
        assert_eq!(l.accesses(), 0);
        assert!(l.due(u64::MAX).is_none());
    }
}
