//! What a client tells placement and asks of it: the planner's and group TTL's views for people,
//! and the quality a client observed from a context.

use super::Store;
use crate::error::{Result, StoreError};
use crate::placement::group_ttl::NamespaceTtlView;
use crate::placement::{context_of, PlanView};

impl Store {
    /// What placement's planner decides now, for people: its `limit` most used contexts and the
    /// next steps it would take (`None` for a placement without a planner).
    pub fn plan_view(&self, limit: usize) -> Option<PlanView> {
        self.parts.placement.plan_view(limit)
    }

    /// A client observed `observed` quality (0 to 1: 1 is what the uncompressed blocks give)
    /// from the context of `key` in `namespace` (its `group` when the client names one) as it is
    /// stored now. When it falls below what the planner assumed by more than the namespace's
    /// drift threshold, the context is scored again: the planner may then stop compressing it
    /// further, or drop it so that the client recomputes it. Returns whether it was scored again
    /// (always `false` without a planner).
    pub fn report_quality(&self, namespace: &str, group: Option<u64>, key: &str, observed: f64) -> Result<bool> {
        self.parts.ensure_open()?;
        kvhoard_format::record::validate_namespace(namespace)?;
        if !(0.0..=1.0).contains(&observed) {
            return Err(StoreError::invalid("quality", format!("{observed} is not a quality between 0 and 1")));
        }
        let drift = self.parts.policies.get(namespace).settings.drift();
        let context = context_of(group, namespace, key);
        Ok(self.parts.placement.report_quality(context, observed, drift))
    }

    /// What group TTL decides in each namespace that keeps it (`kvhoard ns set --ttl-budget`):
    /// its groups, their TTLs, accesses and hits, and the best single TTL for the same budget.
    pub fn ttl_view(&self) -> Vec<NamespaceTtlView> {
        self.parts.ttls.view()
    }

    /// Plans group TTL now in every namespace whose plan is due (the engine's group-TTL thread
    /// does this every second; this is for tools and tests with a clock of their own).
    pub fn plan_ttls_now(&self) {
        self.parts.ttls.replan(self.parts.clock.now_unix_ms(), &|| false);
    }
}
