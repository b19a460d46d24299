//! Group TTL kept by the engine: one [`TtlLearner`] per namespace whose settings ask for it
//! (`NsSettings::ttl`, `kvhoard ns set --ttl-budget`).
//!
//! - **Accesses**: every put and every get that finds a block, of a block (its key) in a group
//!   (its context, `placement::context_of`), of the bytes as put. O(1) amortised, under one lock.
//! - **TTL at put**: a put that gives no TTL of its own takes its group's TTL from the plan in
//!   force, rounded up to whole seconds; a group the plan does not keep (TTL 0) gets the shortest
//!   TTL, one second (the put is still stored and acknowledged). Before the first plan, and for
//!   groups the plan keeps without a TTL, blocks are put without one. Expiry and cleaning then
//!   apply it: an expired block reads as a miss, and cleaning drops it.
//! - **Planning** runs on the engine's group-TTL thread ([`spawn`]), once a second at most, from
//!   a copy of each due window, outside the lock: the put and get paths never plan.
//!
//! Memory: per namespace, the window's accesses (at most `max_accesses`, 40 bytes each) and the
//! plan's curves (`groups × candidates` points).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::Duration;

use super::learner::TtlLearner;
use super::{Access, GroupTtlConfig};
use crate::clock::Clock;
use crate::error::Result;
use crate::policy::TtlSettings;
use crate::thread::Stopper;

/// How often the planning thread looks for due plans.
const PLAN_EVERY: Duration = Duration::from_secs(1);

/// The learner of one namespace and the settings it was made for.
#[derive(Debug)]
struct NsTtl {
    settings: TtlSettings,
    learner: TtlLearner,
    /// Puts given a TTL by the plan.
    ttls_given: u64,
}

/// See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct NamespaceTtls {
    state: Mutex<HashMap<String, NsTtl>>,
}

/// The learner's configuration for a namespace's settings (0: the default).
pub fn config_of(settings: &TtlSettings) -> GroupTtlConfig {
    let default = GroupTtlConfig::default();
    GroupTtlConfig {
        top_k: if settings.groups == 0 { default.top_k } else { settings.groups as usize },
        window_ms: if settings.window_s == 0 { default.window_ms } else { u64::from(settings.window_s) * 1000 },
        ..default
    }
}

impl NamespaceTtls {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, NsTtl>> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The namespace's learner, made (again) when its settings are new or changed.
    fn entry<'a>(map: &'a mut HashMap<String, NsTtl>, namespace: &str, settings: &TtlSettings) -> &'a mut NsTtl {
        let fresh = || NsTtl {
            settings: *settings,
            learner: TtlLearner::new(settings.budget_bytes, config_of(settings)),
            ttls_given: 0,
        };
        let ns = map.entry(namespace.to_string()).or_insert_with(fresh);
        if ns.settings != *settings {
            *ns = fresh();
        }
        ns
    }

    /// A put of `block` (a key) of `bytes` in `group` at `now_ms`, in a namespace with these
    /// settings: records the access; returns the TTL, seconds, the block is stored with when it
    /// gives none of its own.
    pub(crate) fn at_put(&self, namespace: &str, settings: &TtlSettings, access: Access) -> Option<u32> {
        let mut map = self.lock();
        let ns = Self::entry(&mut map, namespace, settings);
        ns.learner.record(access.at_ms, access.block, access.group, access.bytes);
        let ttl_ms = ns.learner.ttl_of(access.group)?;
        ns.ttls_given += 1;
        Some(u32::try_from(ttl_ms.div_ceil(1000)).unwrap_or(u32::MAX).max(1))
    }

    /// A get found a block: records the access.
    pub(crate) fn at_hit(&self, namespace: &str, settings: &TtlSettings, access: Access) {
        let mut map = self.lock();
        let ns = Self::entry(&mut map, namespace, settings);
        ns.learner.record(access.at_ms, access.block, access.group, access.bytes);
    }

    /// The namespace's settings changed: what was learned under the old ones is forgotten.
    pub(crate) fn forget(&self, namespace: &str) {
        self.lock().remove(namespace);
    }

    /// Plans every namespace whose plan is due at `now_ms`, each outside the lock.
    pub(crate) fn replan(&self, now_ms: u64) {
        let due: Vec<_> = self
            .lock()
            .iter_mut()
            .filter_map(|(ns, n)| n.learner.due(now_ms).map(|input| (ns.clone(), n.settings, input)))
            .collect();
        for (namespace, settings, input) in due {
            let (curves, plan) = input.plan();
            tracing::debug!(namespace, groups = curves.groups.len(), hits = plan.hits, "group TTL planned");
            // Installed unless the settings changed meanwhile (a new learner starts afresh).
            if let Some(n) = self.lock().get_mut(&namespace).filter(|n| n.settings == settings) {
                n.learner.install(curves, plan);
            }
        }
    }

    /// What group TTL decides in each namespace, for people.
    pub(crate) fn view(&self) -> Vec<NamespaceTtlView> {
        let map = self.lock();
        let mut views: Vec<NamespaceTtlView> = map
            .iter()
            .map(|(namespace, n)| {
                let (config, budget_bytes) = n.learner.settings();
                let groups = n
                    .learner
                    .plan()
                    .map(|(curves, plan)| {
                        curves
                            .groups
                            .iter()
                            .enumerate()
                            .map(|(g, group)| GroupTtlView {
                                group: *group,
                                ttl_ms: plan.ttls_ms.get(g).copied().filter(|&t| t != super::FOREVER),
                                accesses: curves.accesses.get(g).copied().unwrap_or(0),
                                hits: curves.hits.get(g).and_then(|h| {
                                    let j = curves.ttls_ms.iter().position(|&t| Some(&t) == plan.ttls_ms.get(g))?;
                                    h.get(j).copied()
                                }),
                            })
                            .collect()
                    })
                    .unwrap_or_default();
                NamespaceTtlView {
                    namespace: namespace.clone(),
                    budget_bytes,
                    groups_max: config.top_k,
                    window_s: config.window_ms / 1000,
                    accesses: n.learner.accesses(),
                    plans: n.learner.recomputed,
                    ttls_given: n.ttls_given,
                    expected_hits: n.learner.plan().map(|(_, p)| p.hits),
                    single_ttl_ms: n.learner.plan().map(|(_, p)| p.single_ttl_ms).filter(|&t| t != super::FOREVER),
                    single_hits: n.learner.plan().map(|(_, p)| p.single_hits),
                    groups,
                }
            })
            .collect();
        views.sort_by(|a, b| a.namespace.cmp(&b.namespace));
        views
    }
}

/// Group TTL in one namespace, for people (`kvhoard ttl`, `GET /ttl`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct NamespaceTtlView {
    /// The namespace.
    pub namespace: String,
    /// Bytes its TTLs may keep stored on average.
    pub budget_bytes: u64,
    /// Groups with a TTL of their own, at most.
    pub groups_max: usize,
    /// Seconds of access history.
    pub window_s: u64,
    /// Accesses in the window.
    pub accesses: usize,
    /// Plans made.
    pub plans: u64,
    /// Puts given a TTL by the plan.
    pub ttls_given: u64,
    /// Hits the plan in force expects over the window (`None` before the first plan).
    pub expected_hits: Option<u64>,
    /// The best single TTL for the same budget, ms (`None`: none, or no TTL).
    pub single_ttl_ms: Option<u64>,
    /// Hits the best single TTL would get over the window.
    pub single_hits: Option<u64>,
    /// Its groups, most accessed first; the residual group last.
    pub groups: Vec<GroupTtlView>,
}

/// One group's TTL.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct GroupTtlView {
    /// The group (a context); `None`: the residual group, every other context.
    pub group: Option<u64>,
    /// Its TTL, ms (`None`: kept without one; 0: not kept, stored for one second).
    pub ttl_ms: Option<u64>,
    /// Its accesses in the window.
    pub accesses: u64,
    /// Hits its TTL gets over the window.
    pub hits: Option<u64>,
}

/// Starts the group-TTL planning thread. It holds the learners weakly: it ends when they go,
/// or when stopped.
pub(crate) fn spawn(ttls: Weak<NamespaceTtls>, clock: Clock, stopper: Arc<Stopper>) -> Result<JoinHandle<()>> {
    crate::thread::spawn("kvhoard-ttl", move || {
        while !stopper.wait(PLAN_EVERY) {
            let Some(ttls) = ttls.upgrade() else { return };
            ttls.replan(clock.now_unix_ms());
        }
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    const SETTINGS: TtlSettings = TtlSettings { budget_bytes: 10_000, groups: 4, window_s: 3600 };

    #[test]
    fn ttls_follow_the_plan_and_the_settings() {
        let t = NamespaceTtls::default();
        let at = |block, group, at_ms| Access { at_ms, block, group, bytes: 1000 };
        // Before any plan: no TTL.
        assert_eq!(t.at_put("a", &SETTINGS, at(1, 7, 0)), None);
        // Group 7 read every 10 s; group 8's blocks never again.
        for i in 1..=60u64 {
            t.at_hit("a", &SETTINGS, at(1, 7, i * 10_000));
            t.at_put("a", &SETTINGS, at(100 + i, 8, i * 10_000));
        }
        t.replan(600_000);
        let view = t.view();
        assert_eq!(view.len(), 1);
        assert_eq!(view[0].plans, 1);
        let ttl_hot = t.at_put("a", &SETTINGS, at(1, 7, 600_001)).unwrap_or(u32::MAX);
        let ttl_cold = t.at_put("a", &SETTINGS, at(999, 8, 600_001)).unwrap_or(u32::MAX);
        assert!(ttl_hot >= 10, "the hot group lives from one read to the next: {ttl_hot} s");
        assert!(ttl_cold < ttl_hot, "the cold group's blocks are never read again: {ttl_cold} s");
        // Settings changed: learned afresh; forgotten: gone.
        let other = TtlSettings { budget_bytes: 5_000, ..SETTINGS };
        assert_eq!(t.at_put("a", &other, at(1, 7, 600_002)), None);
        t.forget("a");
        assert!(t.view().is_empty());
    }
}
