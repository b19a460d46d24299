//! Group TTL (Kareto §4.3): one TTL per group of contexts, chosen from the observed access history
//! to get the most hits for a storage budget in byte-seconds.
//!
//! A **group** is a prefix subtree, named by the chain's first block or by the client's group id.
//! The `top_k` groups with the most accesses in the window get a TTL of their own; every other
//! access falls into one residual group.
//!
//! **Curves.** For a TTL `t`, a block's accesses in the window are replayed as the store treats a
//! TTL: the first access stores it (a miss), a later access within `t` of the store is a hit, one
//! after it expired is a miss that stores it again. `H_g(t)` is the group's hits, `C_g(t)` the
//! byte-seconds its blocks spend stored (each store costs `bytes × t`; no TTL costs the window's
//! length).
//! Both are evaluated on one grid of candidate TTLs (quantiles of the observed intervals between
//! accesses to the same block, where `H` steps), so the cost of computing the curves is
//! O(accesses × candidates).
//!
//! **Optimiser.** Maximise Σ H_g(t_g) subject to Σ C_g(t_g) ≤ B, each t_g from the grid: a
//! multiple-choice knapsack. Two starts, the better kept (more hits; at equal hits, fewer
//! byte-seconds):
//!
//! 1. the greedy on each group's upper concave hull of (C, H): every group at t = 0, then the hull
//!    step with the most hits per byte-second is taken while it fits, then leftover budget is
//!    spent on the step with the most hits that still fits, per group (the greedy is optimal for
//!    the LP relaxation, so it misses the optimum by at most one step's hits);
//! 2. the best single TTL that fits the budget, applied to every group.
//!
//! Keeping the better of the two makes group TTL never worse than the best single TTL under the
//! model, by construction. Memory: the window keeps at most `max_accesses` accesses (32 bytes
//! each); curves take `top_k × candidates` points.

use std::collections::{BTreeMap, HashMap, VecDeque};

mod learner;
mod namespaces;

pub use learner::{PlanInput, TtlLearner};
pub use namespaces::{config_of, GroupTtlView, NamespaceTtlView};
pub(crate) use namespaces::{spawn, NamespaceTtls};

/// The candidate TTL that never expires: blocks kept until evicted.
pub const FOREVER: u64 = u64::MAX;

/// The TTL, in the whole seconds a put takes, that keeps a block for at least `ms`: a block
/// expires `n` seconds after the second it was put in, so a TTL of `n` keeps it between `n - 1`
/// and `n` seconds, and one more second covers the part of a second already gone.
pub fn ttl_secs_keeping(ms: u64) -> u32 {
    u32::try_from(ms.div_ceil(1000).saturating_add(1)).unwrap_or(u32::MAX)
}

/// Settings of group TTL.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GroupTtlConfig {
    /// Groups with a TTL of their own (the rest share the residual group's).
    pub top_k: usize,
    /// Accesses older than this are forgotten, ms.
    pub window_ms: u64,
    /// Accesses kept at most (the oldest are forgotten first).
    pub max_accesses: usize,
    /// Candidate TTLs on the grid.
    pub candidates: usize,
}

impl Default for GroupTtlConfig {
    fn default() -> Self {
        GroupTtlConfig { top_k: 64, window_ms: 3_600_000, max_accesses: 1 << 20, candidates: 48 }
    }
}

/// One access to a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Access {
    /// When, ms.
    pub at_ms: u64,
    /// The block.
    pub block: u64,
    /// Its group.
    pub group: u64,
    /// Bytes it takes stored.
    pub bytes: u64,
}

/// The sliding window of accesses group TTL learns from.
#[derive(Debug, Clone)]
pub struct AccessWindow {
    config: GroupTtlConfig,
    accesses: VecDeque<Access>,
}

impl AccessWindow {
    /// An empty window.
    pub fn new(config: GroupTtlConfig) -> AccessWindow {
        AccessWindow { config, accesses: VecDeque::new() }
    }

    /// Records an access, forgetting what fell out of the window. Accesses are kept in time
    /// order: one stamped earlier than the last (clocks of two threads read in turn, a wall
    /// clock stepped back) counts at the last one's time.
    pub fn record(&mut self, mut access: Access) {
        access.at_ms = access.at_ms.max(self.accesses.back().map_or(0, |a| a.at_ms));
        self.accesses.push_back(access);
        let horizon = access.at_ms.saturating_sub(self.config.window_ms);
        while self.accesses.front().is_some_and(|a| a.at_ms < horizon) || self.accesses.len() > self.config.max_accesses
        {
            self.accesses.pop_front();
        }
    }

    /// Accesses held.
    pub fn len(&self) -> usize {
        self.accesses.len()
    }

    /// Whether the window is empty.
    pub fn is_empty(&self) -> bool {
        self.accesses.is_empty()
    }

    /// The groups' curves over the window.
    pub fn curves(&self) -> Curves {
        Curves::from_accesses(self.accesses.iter().copied(), self.config)
    }
}

/// Hits and byte-seconds of each group at each candidate TTL.
#[derive(Debug, Clone, PartialEq)]
pub struct Curves {
    /// Candidate TTLs, ms, ascending, the first 0 (not kept), the last [`FOREVER`].
    pub ttls_ms: Vec<u64>,
    /// Groups with a TTL of their own, most accessed first; `None` is the residual group.
    pub groups: Vec<Option<u64>>,
    /// Per group, per candidate: hits.
    pub hits: Vec<Vec<u64>>,
    /// Per group, per candidate: byte-seconds stored.
    pub cost: Vec<Vec<f64>>,
    /// Per group: accesses in the window.
    pub accesses: Vec<u64>,
}

/// TTLs chosen for a budget.
#[derive(Debug, Clone, PartialEq)]
pub struct TtlPlan {
    /// Per group of the curves: its TTL, ms (0: not kept; [`FOREVER`]: no TTL).
    pub ttls_ms: Vec<u64>,
    /// Hits the model expects.
    pub hits: u64,
    /// Byte-seconds the model expects.
    pub cost: f64,
    /// The best single TTL for the same budget, ms, and its hits.
    pub single_ttl_ms: u64,
    /// Hits of the best single TTL.
    pub single_hits: u64,
}

impl Curves {
    /// Curves from accesses in time order.
    pub fn from_accesses(accesses: impl Iterator<Item = Access>, config: GroupTtlConfig) -> Curves {
        // Per block: its group, bytes and access times.
        let mut blocks: HashMap<u64, (u64, u64, Vec<u64>)> = HashMap::new();
        let mut per_group: HashMap<u64, u64> = HashMap::new();
        let (mut start, mut end) = (u64::MAX, 0);
        for a in accesses {
            start = start.min(a.at_ms);
            end = end.max(a.at_ms);
            blocks.entry(a.block).or_insert((a.group, a.bytes, Vec::new())).2.push(a.at_ms);
            *per_group.entry(a.group).or_default() += 1;
        }
        let mut ranked: Vec<(u64, u64)> = per_group.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut groups: Vec<Option<u64>> = ranked.iter().take(config.top_k).map(|&(g, _)| Some(g)).collect();
        let own: BTreeMap<u64, usize> = groups.iter().enumerate().filter_map(|(i, g)| g.map(|g| (g, i))).collect();
        if ranked.len() > config.top_k {
            groups.push(None);
        }
        let residual = groups.len().saturating_sub(1);
        // Candidates: quantiles of the intervals between accesses to the same block.
        let mut gaps: Vec<u64> = blocks
            .values()
            .flat_map(|(_, _, t)| t.iter().zip(t.iter().skip(1)).map(|(a, b)| b.saturating_sub(*a)))
            .collect();
        gaps.sort_unstable();
        let mut ttls_ms = vec![0];
        let n = config.candidates.max(1);
        for i in 1..=n {
            if let Some(&g) = gaps.get(((gaps.len() * i) / n).min(gaps.len().saturating_sub(1))) {
                // A hit needs the interval within the TTL: the quantile itself, in the whole
                // seconds a stored TTL has, rounded up.
                ttls_ms.push(g.div_ceil(1000).max(1).saturating_mul(1000));
            }
        }
        // And keeping blocks until they are evicted (no TTL), the most a budget can buy.
        ttls_ms.push(FOREVER);
        ttls_ms.sort_unstable();
        ttls_ms.dedup();
        let mut hits = vec![vec![0u64; ttls_ms.len()]; groups.len()];
        let mut cost = vec![vec![0f64; ttls_ms.len()]; groups.len()];
        let mut accesses = vec![0u64; groups.len()];
        // What a store without a TTL costs: the whole window it will stay in, however little of
        // the window has been seen yet (a short history must not make "forever" look cheap).
        let horizon = if config.window_ms == u64::MAX { end.saturating_sub(start).max(1) } else { config.window_ms };
        let mut ordered: Vec<_> = blocks.into_iter().collect();
        ordered.sort_unstable_by_key(|(b, _)| *b);
        for (_, (group, bytes, times)) in ordered {
            let g = own.get(&group).copied().unwrap_or(residual);
            let (Some(h), Some(c), Some(a)) = (hits.get_mut(g), cost.get_mut(g), accesses.get_mut(g)) else { continue };
            *a += times.len() as u64;
            for ((h, c), &ttl) in h.iter_mut().zip(c.iter_mut()).zip(&ttls_ms).skip(1) {
                let (got, stored_ms) = replay_block(&times, ttl, horizon);
                *h += got;
                *c += bytes as f64 * stored_ms as f64 / 1000.0;
            }
        }
        Curves { ttls_ms, groups, hits, cost, accesses }
    }

    /// Hits and cost of group `g` at candidate `j` (nothing for indices out of range).
    fn point(&self, g: usize, j: usize) -> (u64, f64) {
        let hits = self.hits.get(g).and_then(|h| h.get(j)).copied().unwrap_or(0);
        let cost = self.cost.get(g).and_then(|c| c.get(j)).copied().unwrap_or(0.0);
        (hits, cost)
    }

    /// The TTLs that get the most hits within `budget` byte-seconds.
    pub fn optimise(&self, budget: f64) -> TtlPlan {
        let (single_ttl_ms, single_hits, single_cost) = self.best_single(budget);
        let choice = self.greedy(budget);
        let (hits, cost) =
            choice.iter().enumerate().map(|(g, &j)| self.point(g, j)).fold((0, 0.0), |(h, c), p| (h + p.0, c + p.1));
        // The single TTL unless the groups' TTLs get more hits, or as many for fewer byte-seconds.
        if hits < single_hits || (hits == single_hits && cost >= single_cost) {
            return TtlPlan {
                ttls_ms: vec![single_ttl_ms; self.groups.len()],
                hits: single_hits,
                cost: single_cost,
                single_ttl_ms,
                single_hits,
            };
        }
        TtlPlan {
            ttls_ms: choice.iter().map(|&j| self.ttls_ms.get(j).copied().unwrap_or(0)).collect(),
            hits,
            cost,
            single_ttl_ms,
            single_hits,
        }
    }

    /// The single TTL with the most hits within `budget`: (TTL, hits, cost).
    pub fn best_single(&self, budget: f64) -> (u64, u64, f64) {
        let mut best = (0, 0, 0.0);
        for (j, &ttl) in self.ttls_ms.iter().enumerate() {
            let (hits, cost) =
                (0..self.groups.len()).map(|g| self.point(g, j)).fold((0, 0.0), |(h, c), p| (h + p.0, c + p.1));
            if cost <= budget && hits > best.1 {
                best = (ttl, hits, cost);
            }
        }
        best
    }

    /// Candidate index per group, by the hull greedy and then filling what budget is left.
    fn greedy(&self, budget: f64) -> Vec<usize> {
        let hulls: Vec<Vec<usize>> = (0..self.groups.len()).map(|g| self.hull(g)).collect();
        // Each group's place on its hull: (position, candidate).
        let mut at: Vec<(usize, usize)> = hulls.iter().map(|h| (0, h.first().copied().unwrap_or(0))).collect();
        let mut spent = 0.0;
        loop {
            // The next hull step with the most hits per byte-second that fits.
            let mut best: Option<(usize, usize, f64, f64)> = None;
            for (g, (hull, &(pos, from))) in hulls.iter().zip(&at).enumerate() {
                let Some(&to) = hull.get(pos + 1) else { continue };
                let ((h0, c0), (h1, c1)) = (self.point(g, from), self.point(g, to));
                let dc = c1 - c0;
                if spent + dc > budget {
                    continue;
                }
                let ratio = if dc <= 0.0 { f64::INFINITY } else { h1.saturating_sub(h0) as f64 / dc };
                if best.is_none_or(|(_, _, r, _)| ratio > r) {
                    best = Some((g, to, ratio, dc));
                }
            }
            let Some((g, to, _, dc)) = best else { break };
            spent += dc;
            if let Some(a) = at.get_mut(g) {
                *a = (a.0 + 1, to);
            }
        }
        let mut choice: Vec<usize> = at.iter().map(|&(_, j)| j).collect();
        // Fill: any candidate (on the hull or not) that adds hits and fits what is left.
        loop {
            let mut best: Option<(usize, usize, u64, f64)> = None;
            for (g, &j) in choice.iter().enumerate() {
                let (h0, c0) = self.point(g, j);
                for k in 0..self.ttls_ms.len() {
                    let (h1, c1) = self.point(g, k);
                    let gain = h1.saturating_sub(h0);
                    if gain > 0 && spent + c1 - c0 <= budget && best.is_none_or(|(_, _, b, _)| gain > b) {
                        best = Some((g, k, gain, c1 - c0));
                    }
                }
            }
            let Some((g, k, _, dc)) = best else { break };
            spent += dc;
            if let Some(c) = choice.get_mut(g) {
                *c = k;
            }
        }
        choice
    }

    /// Candidate indices on group `g`'s upper concave hull of (cost, hits), from t = 0.
    fn hull(&self, g: usize) -> Vec<usize> {
        let mut order: Vec<usize> = (0..self.ttls_ms.len()).collect();
        order.sort_by(|&a, &b| {
            let (pa, pb) = (self.point(g, a), self.point(g, b));
            pa.1.total_cmp(&pb.1).then(pb.0.cmp(&pa.0))
        });
        let mut hull: Vec<usize> = Vec::new();
        for j in order {
            let (h, c) = self.point(g, j);
            let h = h as f64;
            if hull.last().is_some_and(|&l| self.point(g, l).0 as f64 >= h) {
                continue;
            }
            while let [.., a, b] = hull.as_slice() {
                let ((ha, ca), (hb, cb)) = (self.point(g, *a), self.point(g, *b));
                let (ha, hb) = (ha as f64, hb as f64);
                // b is under the chord from a to the new point: not on the hull.
                if (hb - ha) * (c - ca) <= (h - ha) * (cb - ca) {
                    hull.pop();
                } else {
                    break;
                }
            }
            hull.push(j);
        }
        if hull.first() != Some(&0) {
            hull.insert(0, 0);
        }
        hull
    }

    /// The TTL of `group` in `plan`, ms: its own, or the residual group's.
    pub fn ttl_of(&self, plan: &TtlPlan, group: u64) -> u64 {
        let i =
            self.groups.iter().position(|g| *g == Some(group)).or_else(|| self.groups.iter().position(Option::is_none));
        i.and_then(|i| plan.ttls_ms.get(i).copied()).unwrap_or(plan.single_ttl_ms)
    }
}

/// Hits and ms stored of a block accessed at `times` under TTL `ttl`: stored at a miss, for `ttl`
/// each time. The last store is charged its whole TTL, not cut at the window's end (the block
/// will live that long), but at most `span`, the window's length: a block kept without a TTL
/// costs a whole window per window.
fn replay_block(times: &[u64], ttl: u64, span: u64) -> (u64, u64) {
    let Some(&first) = times.first() else { return (0, 0) };
    let mut stored_at = first;
    let mut hits = 0;
    let mut stored_ms = 0;
    for &t in times.iter().skip(1) {
        if t.saturating_sub(stored_at) <= ttl {
            hits += 1;
        } else {
            stored_ms += ttl;
            stored_at = t;
        }
    }
    stored_ms += ttl.min(span);
    (hits, stored_ms)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing)]

    use super::*;

    fn access(at_ms: u64, block: u64, group: u64) -> Access {
        Access { at_ms, block, group, bytes: 100 }
    }

    #[test]
    fn a_block_replayed_by_hand() {
        // Stored at 0; 5 is a hit (TTL 10); 30 is past 10: stored again; 35 a hit.
        assert_eq!(replay_block(&[0, 5, 30, 35], 10, 100), (2, 20));
        assert_eq!(replay_block(&[0, 5, 30, 35], 100, 100), (3, 100));
        assert_eq!(replay_block(&[0, 5, 30, 35], FOREVER, 100), (3, 100), "no TTL: a whole window");
        assert_eq!(replay_block(&[7], 10, 100), (0, 10));
    }

    /// Curves with hand-made points: (hits, cost) per group per candidate.
    fn curves(points: &[&[(u64, f64)]]) -> Curves {
        let n = points[0].len();
        Curves {
            ttls_ms: (0..n as u64).map(|i| i * 1000).collect(),
            groups: (0..points.len() as u64).map(Some).collect(),
            hits: points.iter().map(|p| p.iter().map(|x| x.0).collect()).collect(),
            cost: points.iter().map(|p| p.iter().map(|x| x.1).collect()).collect(),
            accesses: vec![1; points.len()],
        }
    }

    fn brute_force(c: &Curves, budget: f64) -> u64 {
        let n = c.ttls_ms.len();
        let groups = c.groups.len();
        let mut best = 0;
        for code in 0..n.pow(groups as u32) {
            let mut rest = code;
            let (mut h, mut cost) = (0, 0.0);
            for g in 0..groups {
                let j = rest % n;
                rest /= n;
                h += c.hits[g][j];
                cost += c.cost[g][j];
            }
            if cost <= budget {
                best = best.max(h);
            }
        }
        best
    }

    #[test]
    fn the_optimiser_against_brute_force() {
        let mut rng = kvhoard_kernels::rng::Rng::new(5);
        for case in 0..300 {
            let groups = 1 + (case % 4);
            let n = 2 + (case % 3);
            let mut points: Vec<Vec<(u64, f64)>> = Vec::new();
            for _ in 0..groups {
                // Hits and cost grow with the TTL, as the curves of a real group do.
                let (mut h, mut c) = (0u64, 0f64);
                let mut p = vec![(0, 0.0)];
                for _ in 1..n {
                    h += rng.below(20);
                    c += 1.0 + f64::from(rng.uniform()) * 50.0;
                    p.push((h, c));
                }
                points.push(p);
            }
            let refs: Vec<&[(u64, f64)]> = points.iter().map(Vec::as_slice).collect();
            let c = curves(&refs);
            let budget = f64::from(rng.uniform()) * 40.0 * groups as f64;
            let plan = c.optimise(budget);
            let best = brute_force(&c, budget);
            assert!(plan.cost <= budget + 1e-9, "case {case}: over budget");
            assert!(plan.hits >= plan.single_hits, "case {case}: never worse than one TTL");
            // The greedy misses the optimum by at most one step's hits.
            let step = points.iter().flat_map(|p| p.windows(2).map(|w| w[1].0 - w[0].0)).max().unwrap_or(0);
            assert!(plan.hits + step >= best, "case {case}: {} vs optimum {best} (largest step {step})", plan.hits);
            assert!(plan.hits <= best);
        }
    }

    #[test]
    fn groups_with_different_reuse_get_different_ttls() {
        // Group 1: blocks read again after 10 s; group 2: after 1000 s. A budget that keeps group
        // 1's blocks for 10 s but not group 2's for 1000 s: group TTL keeps 1 only, and beats any
        // single TTL.
        let mut window =
            AccessWindow::new(GroupTtlConfig { top_k: 8, window_ms: u64::MAX, max_accesses: 1 << 20, candidates: 16 });
        let mut events = Vec::new();
        for b in 0..20u64 {
            events.push(access(b * 100_000, b, 1));
            events.push(access(b * 100_000 + 10_000, b, 1));
            events.push(access(b * 100_000 + 50, 1000 + b, 2));
            events.push(access(b * 100_000 + 1_000_050, 1000 + b, 2));
        }
        events.sort_by_key(|a| a.at_ms);
        for e in events {
            window.record(e);
        }
        let c = window.curves();
        // Group 1 at 10 s: 20 hits for 20 blocks × 100 bytes × 10 s. A single TTL of 10 s also
        // stores group 2's blocks twice for 10 s each, for no hit: over this budget.
        let plan = c.optimise(30_000.0);
        assert_eq!((c.ttl_of(&plan, 1), c.ttl_of(&plan, 2)), (10_000, 0));
        assert_eq!(plan.hits, 20);
        assert_eq!(plan.single_hits, 0, "no single TTL that keeps anything fits");
        // Enough to keep everything for 1000 s: one TTL does as well as two.
        let plan = c.optimise(4.1e6);
        assert_eq!((plan.hits, plan.single_hits), (40, 40));
    }

    #[test]
    fn the_window_forgets_and_is_bounded() {
        let mut w = AccessWindow::new(GroupTtlConfig { top_k: 2, window_ms: 100, max_accesses: 5, candidates: 4 });
        for i in 0..10 {
            w.record(access(i * 10, i, i % 3));
        }
        assert_eq!(w.len(), 5);
        w.record(access(1000, 99, 0));
        assert_eq!(w.len(), 1, "everything older than 100 ms is forgotten");
        let c = w.curves();
        assert!(c.groups.len() <= 3, "top 2 and the residual group");
    }
}
