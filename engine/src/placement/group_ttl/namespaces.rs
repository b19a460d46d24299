//! Group TTL kept by the engine: one [`TtlLearner`] per namespace whose settings ask for it
//! (`NsSettings::ttl`, `kvhoard ns set --ttl-budget`), configured from the namespace policies
//! when the volume opens and whenever one is set ([`NamespaceTtls::configure`]).
//!
//! - **Accesses**: every put, and every get that finds a block, of a block (its key) in a group
//!   (its context, `placement::context_of`), of the block's bytes. O(1) amortised, under the
//!   namespace's own lock (a read lock on the map finds it).
//! - **TTL at put**: a put that gives no TTL of its own takes its group's from the plan in
//!   force: whole seconds, rounded up, plus one, since expiry counts whole seconds from the
//!   second the block was put in (a TTL of `n` seconds keeps a block between `n - 1` and `n`).
//!   A group the plan does not keep (TTL 0) gets the shortest TTL, one second (the put is still
//!   stored and acknowledged). Before the first plan, and for groups the plan keeps without a
//!   TTL, blocks are put without one. Expiry and cleaning then apply it: an expired block reads
//!   as a miss, and cleaning drops it.
//! - **Planning** runs on the engine's group-TTL thread ([`spawn`]), once a second at most, from
//!   a copy of each due window taken under the namespace's lock (a copy of up to
//!   `max_accesses` × 32 bytes, every quarter window once the window is full), computed outside
//!   it: the put and get paths never plan.
//!
//! Memory: per namespace, the window's accesses (at most `max_accesses`, 32 bytes each), the
//! plan's curves (`groups × candidates` points), and while planning, a copy of the window and
//! its accesses grouped by block.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock, Weak};
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
    /// The namespaces that keep group TTL, each behind its own lock.
    map: RwLock<HashMap<String, Arc<Mutex<NsTtl>>>>,
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

fn lock(ns: &Mutex<NsTtl>) -> std::sync::MutexGuard<'_, NsTtl> {
    ns.lock().unwrap_or_else(|e| e.into_inner())
}

impl NamespaceTtls {
    /// The namespace's learner, when it keeps group TTL.
    fn get(&self, namespace: &str) -> Option<Arc<Mutex<NsTtl>>> {
        self.map.read().unwrap_or_else(|e| e.into_inner()).get(namespace).cloned()
    }

    /// Makes `namespace` keep group TTL with `settings` (`None`: not at all). A learner whose
    /// settings change starts afresh; unchanged settings keep what it learned.
    pub(crate) fn configure(&self, namespace: &str, settings: Option<TtlSettings>) {
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        match settings {
            None => {
                map.remove(namespace);
            }
            Some(settings) => {
                if map.get(namespace).is_some_and(|n| lock(n).settings == settings) {
                    return;
                }
                let learner = TtlLearner::new(settings.budget_bytes, config_of(&settings));
                map.insert(namespace.to_string(), Arc::new(Mutex::new(NsTtl { settings, learner, ttls_given: 0 })));
            }
        }
    }

    /// A put of a block in `namespace`: records the access, when the namespace keeps group TTL;
    /// with `ttl_given` (the put's own TTL) nothing more, else returns the TTL, seconds, the
    /// block is stored with.
    pub(crate) fn at_put(&self, namespace: &str, access: Access, ttl_given: bool) -> Option<u32> {
        let ns = self.get(namespace)?;
        let mut ns = lock(&ns);
        ns.learner.record(access.at_ms, access.block, access.group, access.bytes);
        if ttl_given {
            return None;
        }
        let ttl_ms = ns.learner.ttl_of(access.group)?;
        ns.ttls_given += 1;
        Some(super::ttl_secs_keeping(ttl_ms))
    }

    /// A get found a block in `namespace`: records the access, when the namespace keeps group TTL.
    pub(crate) fn at_hit(&self, namespace: &str, access: Access) {
        if let Some(ns) = self.get(namespace) {
            lock(&ns).learner.record(access.at_ms, access.block, access.group, access.bytes);
        }
    }

    /// Every namespace's learner, taken from the map so that none is locked while the map is.
    fn learners(&self) -> Vec<(String, Arc<Mutex<NsTtl>>)> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        map.iter().map(|(k, v)| (k.clone(), Arc::clone(v))).collect()
    }

    /// Plans every namespace whose plan is due at `now_ms`, each outside its lock, unless
    /// `stopping` says to stop.
    pub(crate) fn replan(&self, now_ms: u64, stopping: &dyn Fn() -> bool) {
        let namespaces = self.learners();
        for (namespace, ns) in namespaces {
            if stopping() {
                return;
            }
            let Some(input) = lock(&ns).learner.due(now_ms) else { continue };
            let (curves, plan) = input.plan();
            tracing::debug!(namespace, groups = curves.groups.len(), hits = plan.hits, "group TTL planned");
            // A learner replaced meanwhile (new settings) is not this one: the plan goes with it.
            lock(&ns).learner.install(curves, plan);
        }
    }

    /// What group TTL decides in each namespace that keeps it, for people.
    pub(crate) fn view(&self) -> Vec<NamespaceTtlView> {
        let namespaces = self.learners();
        let mut views: Vec<NamespaceTtlView> = namespaces
            .into_iter()
            .map(|(namespace, n)| {
                let n = lock(&n);
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
                    namespace,
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
            ttls.replan(clock.now_unix_ms(), &|| stopper.stopped());
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
        let never = || false;
        // A namespace not configured keeps no group TTL.
        assert_eq!(t.at_put("a", at(1, 7, 0), false), None);
        assert!(t.view().is_empty());
        t.configure("a", Some(SETTINGS));
        assert_eq!(t.view().len(), 1, "configured, before any traffic");
        // Before any plan: no TTL.
        assert_eq!(t.at_put("a", at(1, 7, 0), false), None);
        // Group 7 read every 10 s; group 8's blocks never again; a put with its own TTL counts.
        for i in 1..=60u64 {
            t.at_hit("a", at(1, 7, i * 10_000));
            t.at_put("a", at(100 + i, 8, i * 10_000), false);
        }
        assert_eq!(t.at_put("a", at(1, 7, 600_000), true), None, "a put's own TTL is its own");
        t.replan(600_000, &never);
        let view = t.view();
        assert_eq!(view[0].plans, 1);
        assert_eq!(view[0].accesses, 122);
        let ttl_hot = t.at_put("a", at(1, 7, 600_001), false).unwrap_or(u32::MAX);
        let ttl_cold = t.at_put("a", at(999, 8, 600_001), false).unwrap_or(u32::MAX);
        // Expiry counts whole seconds: a block read every 10 s needs a TTL of 11 to be there.
        assert!(ttl_hot >= 11, "the hot group lives from one read to the next: {ttl_hot} s");
        assert!(ttl_cold < ttl_hot, "the cold group's blocks are never read again: {ttl_cold} s");
        // The same settings keep what was learned; new ones start afresh; none: gone.
        t.configure("a", Some(SETTINGS));
        assert_eq!(t.view()[0].plans, 1);
        t.configure("a", Some(TtlSettings { budget_bytes: 5_000, ..SETTINGS }));
        assert_eq!(t.at_put("a", at(1, 7, 600_002), false), None);
        t.configure("a", None);
        assert!(t.view().is_empty());
        assert_eq!(t.at_put("a", at(1, 7, 600_003), false), None);
    }

    #[test]
    fn accesses_out_of_order_do_not_break_planning() {
        let t = NamespaceTtls::default();
        t.configure("a", Some(SETTINGS));
        // Two threads' clocks read in turn: a later access stamped earlier.
        for i in 0..50u64 {
            let at_ms = if i % 2 == 0 { i * 1000 + 5000 } else { i * 1000 };
            t.at_hit("a", Access { at_ms, block: i % 3, group: 1, bytes: 100 });
        }
        t.replan(100_000, &|| false);
        assert_eq!(t.view()[0].plans, 1);
    }
}
