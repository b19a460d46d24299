//! The placement planner (EvicPress): for every context, one decision of how its blocks are kept
//! on the log (which codec) or whether they are dropped, chosen jointly across contexts so that
//! the stored bytes fit the budget at the least loss of utility.
//!
//! **Utility** of keeping a context's blocks with option `o`, per block:
//! `U(o) = (α · quality(o) − delay(o)) · freq`, where quality is what the context's estimate says
//! the codec keeps (1 for lossless and raw), delay the time to load and decode a block (log
//! bandwidth and decode speed; for a dropped context, the prefill that recomputes it, at quality
//! 1), freq the context's accesses decayed with a half-life, and α (seconds per unit of quality)
//! what quality is worth against time.
//!
//! **Placement** (EvicPress Algorithm 1, the multiple-choice-knapsack greedy): while the stored
//! bytes exceed the budget, take the step with the smallest utility lost per byte freed over every
//! context's options with fewer bytes than its current one (compress harder, or drop), and apply
//! it. Decay multiplies every context's freq by the same factor, so the order of contexts does not
//! change with time alone: a heap keyed by log(loss per byte) + log(freq at a fixed origin) stays
//! valid, and only a context that is accessed or changes option is pushed again. A step costs
//! O(options + log contexts); a put costs one touch, O(options + log contexts).
//!
//! **Admission**: a context stored (again) takes the option worth most at the current price of a
//! byte, the utility lost per byte by the last step placement took, so a block the next
//! rebalance would compress is compressed when it is put, not written twice.
//!
//! Decisions that discard information are final for a copy: a context compressed lossily is never
//! decompressed back nor compressed harder (its only step is to be dropped, as cleaning would
//! not recode its lossy form); when it needs more quality it is recomputed by the client
//! (dropped).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::{BlockInfo, Keep, LiveBlock, Lru, Placement, PutPlan, SegmentView};
use crate::clock::Clock;

/// One way of keeping a context's blocks.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreOption {
    /// Stored bytes ÷ raw bytes (0: dropped).
    pub ratio: f64,
    /// Seconds to load and decode one block (for a dropped context: to recompute it).
    pub delay_s: f64,
    /// Whether the codec loses information (estimates apply).
    pub lossy: bool,
}

/// What the planner weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerConfig {
    /// Seconds of delay one unit of quality is worth, per block.
    pub alpha: f64,
    /// Half-life of a context's access count, ms.
    pub half_life_ms: u64,
    /// Bytes the kept blocks may take.
    pub budget_bytes: u64,
    /// The options, the first the least compressed (the one a new context starts with); the
    /// last is "dropped" (ratio 0).
    pub options: Vec<StoreOption>,
}

#[derive(Debug, Clone)]
struct Context {
    blocks: u64,
    raw_bytes: u64,
    /// ln of the decayed access count, at time 0.
    ln_freq: f64,
    /// Estimated quality per option (1 for lossless).
    quality: Vec<f64>,
    /// Its α (its namespace's, else the configuration's).
    alpha: f64,
    option: usize,
    version: u64,
}

/// A candidate step in the heap: smallest key first.
#[derive(Debug, Clone, Copy)]
struct Step {
    key: f64,
    context: u64,
    version: u64,
}

impl PartialEq for Step {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Step {}
impl PartialOrd for Step {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Step {
    fn cmp(&self, other: &Self) -> Ordering {
        // BinaryHeap is a max-heap: the smallest key must compare greatest.
        other.key.total_cmp(&self.key).then(other.context.cmp(&self.context))
    }
}

/// A decision the planner made: `context`'s blocks now kept with `option`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The context.
    pub context: u64,
    /// Its new option (index into the config's options).
    pub option: usize,
}

/// A context as a request uses it: what [`Planner::touch`] records and
/// [`Planner::option_for_put`] weighs.
#[derive(Debug, Clone, Copy)]
pub struct ContextUse<'a> {
    /// The context.
    pub context: u64,
    /// When.
    pub now_ms: u64,
    /// Blocks it has kept (or about to be).
    pub blocks: u64,
    /// Bytes of one of its blocks as put.
    pub raw_bytes: u64,
    /// The estimated quality of each option for it.
    pub quality: &'a [f64],
    /// Its α (`None`: the configuration's).
    pub alpha: Option<f64>,
}

/// One context as the planner sees it now.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ContextView {
    /// The context.
    pub context: u64,
    /// Blocks it holds.
    pub blocks: u64,
    /// Bytes of one of its blocks as put.
    pub block_bytes: u64,
    /// The option its blocks are kept with.
    pub option: usize,
    /// Its decayed access count now.
    pub freq: f64,
    /// Per option: the quality it keeps for this context.
    pub quality: Vec<f64>,
    /// Its α: seconds of delay its whole quality is worth.
    pub alpha: f64,
    /// Per option: its utility for the whole context now, `(α · quality − delay) · freq · blocks`.
    pub utility: Vec<f64>,
}

/// A step the next rebalance would take if the kept bytes were over budget.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct StepView {
    /// The context it changes.
    pub context: u64,
    /// Its option now.
    pub from: usize,
    /// The option it would move to.
    pub to: usize,
    /// Utility lost per byte freed, now.
    pub loss_per_byte: f64,
    /// Bytes it would free.
    pub bytes_freed: u64,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Planner {
    config: PlannerConfig,
    contexts: HashMap<u64, Context>,
    heap: BinaryHeap<Step>,
    stored_bytes: f64,
    /// The price of a byte: the key of the last step placement took (`None` before any).
    ln_price: Option<f64>,
}

impl Planner {
    /// A planner with no context yet.
    pub fn new(config: PlannerConfig) -> Planner {
        Planner { config, contexts: HashMap::new(), heap: BinaryHeap::new(), stored_bytes: 0.0, ln_price: None }
    }

    /// Bytes the kept blocks take, as the planner counts them.
    pub fn stored_bytes(&self) -> u64 {
        self.stored_bytes as u64
    }

    /// The option a context's blocks are kept with (the first for one never seen).
    pub fn option_of(&self, context: u64) -> usize {
        self.contexts.get(&context).map_or(0, |c| c.option)
    }

    /// Contexts tracked.
    pub fn contexts(&self) -> usize {
        self.contexts.len()
    }

    /// The index of the last option, "dropped".
    pub fn dropped(&self) -> usize {
        self.config.options.len().saturating_sub(1)
    }

    /// ln of an access's weight at `now_ms`: accesses count `2^(t / half-life)`, so that every
    /// context's count decays by the same factor and the heap's order holds.
    fn ln_time(&self, now_ms: u64) -> f64 {
        now_ms as f64 / self.config.half_life_ms.max(1) as f64 * std::f64::consts::LN_2
    }

    /// `context`'s quality per option, as the planner scores it (`None` for one never seen).
    pub fn qualities(&self, context: u64) -> Option<&[f64]> {
        self.contexts.get(&context).map(|c| c.quality.as_slice())
    }

    /// Forgets every dropped context (it holds nothing the planner counts); returns them. For
    /// bounding memory: a forgotten context's blocks still on the log are unknown to the planner.
    pub fn forget_dropped(&mut self) -> Vec<u64> {
        let dropped = self.dropped();
        let gone: Vec<u64> = self.contexts.iter().filter(|(_, c)| c.option == dropped).map(|(id, _)| *id).collect();
        for id in &gone {
            self.contexts.remove(id);
        }
        self.rebuild_heap();
        gone
    }

    fn bytes(&self, c: &Context, option: usize) -> f64 {
        let ratio = self.config.options.get(option).map_or(0.0, |o| o.ratio);
        c.blocks as f64 * c.raw_bytes as f64 * ratio
    }

    /// Utility per block of `option` at unit frequency.
    fn utility(&self, c: &Context, option: usize) -> f64 {
        let Some(o) = self.config.options.get(option) else { return f64::NEG_INFINITY };
        let dropped = o.ratio == 0.0;
        let q = if dropped { 1.0 } else { c.quality.get(option).copied().unwrap_or(1.0) };
        c.alpha * q - o.delay_s
    }

    /// The best step down from `c`'s option: (option, ln(loss per byte freed) + ln freq).
    fn next_step(&self, c: &Context) -> Option<(usize, f64)> {
        let (b0, u0) = (self.bytes(c, c.option), self.utility(c, c.option));
        // A lossy form is final for its copy: recoded again it would lose more than the next
        // option's quality says, so from it the only step is to drop the context.
        let lossy = self.config.options.get(c.option).is_some_and(|o| o.lossy);
        let dropped = self.dropped();
        let mut best: Option<(usize, f64)> = None;
        for k in 0..self.config.options.len() {
            let freed = b0 - self.bytes(c, k);
            // An option the context may not take (its quality is -inf) is never a step.
            if freed <= 0.0 || !self.utility(c, k).is_finite() || (lossy && k != dropped) {
                continue;
            }
            // Loss per byte at unit frequency, times the blocks it is summed over.
            let loss = (u0 - self.utility(c, k)) * c.blocks as f64 / freed;
            let key = if loss <= 0.0 { f64::NEG_INFINITY } else { loss.ln() + c.ln_freq };
            if best.is_none_or(|(_, b)| key < b) {
                best = Some((k, key));
            }
        }
        best
    }

    fn push(&mut self, context: u64) {
        let Some(c) = self.contexts.get(&context) else { return };
        if let Some((_, key)) = self.next_step(c) {
            self.heap.push(Step { key, context, version: c.version });
        }
    }

    /// A request used a context ([`ContextUse`]). A context that was dropped starts again from
    /// the first option.
    pub fn touch(&mut self, u: &ContextUse<'_>) {
        let ContextUse { context, now_ms, blocks, raw_bytes, quality, alpha } = *u;
        let alpha = alpha.unwrap_or(self.config.alpha);
        let ln_now = self.ln_time(now_ms);
        let before = self.contexts.get(&context).map(|c| (self.bytes(c, c.option), c.option));
        let dropped = self.dropped();
        let c = self.contexts.entry(context).or_insert(Context {
            blocks: 0,
            raw_bytes,
            ln_freq: f64::NEG_INFINITY,
            quality: Vec::new(),
            alpha,
            option: 0,
            version: 0,
        });
        // ln(e^a + e^b), without overflow.
        let (hi, lo) = if c.ln_freq > ln_now { (c.ln_freq, ln_now) } else { (ln_now, c.ln_freq) };
        c.ln_freq = hi + (lo - hi).exp().ln_1p();
        c.blocks = blocks;
        c.raw_bytes = raw_bytes;
        c.quality = quality.to_vec();
        c.alpha = alpha;
        let admit = c.option == dropped || before.is_none();
        c.version += 1;
        if admit {
            let option = self.contexts.get(&context).map_or(0, |c| self.admission(c));
            if let Some(c) = self.contexts.get_mut(&context) {
                c.option = option;
            }
        }
        let Some(c) = self.contexts.get(&context) else { return };
        let after = self.bytes(c, c.option);
        self.stored_bytes += after - before.map_or(0.0, |b| b.0);
        self.push(context);
    }

    /// Admission: the option worth most for `c` at the current price of a byte (the utility
    /// lost per byte by the last step placement took), so that what the next rebalance would
    /// compress or drop is not written raw first. The first option before any step was taken.
    fn admission(&self, c: &Context) -> usize {
        let Some(ln_price) = self.ln_price else { return 0 };
        let dropped = self.dropped();
        let price = (ln_price - c.ln_freq).exp();
        (0..dropped)
            .map(|k| (k, self.utility(c, k) * c.blocks as f64 - price * self.bytes(c, k)))
            .filter(|(_, worth)| worth.is_finite())
            .fold((0, f64::NEG_INFINITY), |best, x| if x.1 > best.1 { x } else { best })
            .0
    }

    /// The option a put to a context ([`ContextUse`]) would be stored with: the context's own,
    /// or, for a new or dropped one, the one admission gives it (as [`Planner::touch`] would).
    /// Changes nothing.
    pub fn option_for_put(&self, u: &ContextUse<'_>) -> usize {
        let ContextUse { context, now_ms, blocks, raw_bytes, quality, alpha } = *u;
        let dropped = self.dropped();
        if let Some(c) = self.contexts.get(&context).filter(|c| c.option != dropped) {
            return c.option;
        }
        let ln_now = self.ln_time(now_ms);
        let alpha = alpha.unwrap_or(self.config.alpha);
        let c = Context { blocks, raw_bytes, ln_freq: ln_now, quality: quality.to_vec(), alpha, option: 0, version: 0 };
        self.admission(&c)
    }

    /// Blocks `context` holds, as last told (0 for one never seen).
    pub fn blocks_of(&self, context: u64) -> u64 {
        self.contexts.get(&context).map_or(0, |c| c.blocks)
    }

    /// `context` now holds `blocks` blocks (more were put in the same access): its bytes change,
    /// its access count does not. Nothing for a context never touched.
    pub fn resize(&mut self, context: u64, blocks: u64) {
        let Some(c) = self.contexts.get(&context) else { return };
        let before = self.bytes(c, c.option);
        let Some(c) = self.contexts.get_mut(&context) else { return };
        c.blocks = blocks;
        c.version += 1;
        let Some(c) = self.contexts.get(&context) else { return };
        self.stored_bytes += self.bytes(c, c.option) - before;
        self.push(context);
    }

    /// Whether the kept bytes exceed the budget (a rebalance would change something).
    pub fn over_budget(&self) -> bool {
        self.stored_bytes > self.config.budget_bytes as f64
    }

    /// The `limit` contexts worth most now (by access count), and the first `limit` steps a
    /// rebalance would take, cheapest first. O(contexts + limit log limit): for people, not for
    /// the put path.
    pub fn view(&self, now_ms: u64, limit: usize) -> (Vec<ContextView>, Vec<StepView>) {
        let ln_now = self.ln_time(now_ms);
        let freq_now = |c: &Context| (c.ln_freq - ln_now).exp();
        let mut contexts: Vec<(&u64, &Context)> = self.contexts.iter().collect();
        let order = |a: &(&u64, &Context), b: &(&u64, &Context)| b.1.ln_freq.total_cmp(&a.1.ln_freq).then(a.0.cmp(b.0));
        if limit < contexts.len() {
            contexts.select_nth_unstable_by(limit, order);
            contexts.truncate(limit);
        }
        contexts.sort_by(order);
        let views = contexts
            .iter()
            .take(limit)
            .map(|(id, c)| ContextView {
                context: **id,
                blocks: c.blocks,
                block_bytes: c.raw_bytes,
                option: c.option,
                freq: freq_now(c),
                quality: c.quality.clone(),
                alpha: c.alpha,
                utility: (0..self.config.options.len())
                    .map(|k| self.utility(c, k) * freq_now(c) * c.blocks as f64)
                    .collect(),
            })
            .collect();
        let mut steps: Vec<StepView> = self
            .contexts
            .iter()
            .filter_map(|(id, c)| {
                let (to, key) = self.next_step(c)?;
                Some(StepView {
                    context: *id,
                    from: c.option,
                    to,
                    loss_per_byte: (key - ln_now).exp(),
                    bytes_freed: (self.bytes(c, c.option) - self.bytes(c, to)).max(0.0) as u64,
                })
            })
            .collect();
        let order =
            |a: &StepView, b: &StepView| a.loss_per_byte.total_cmp(&b.loss_per_byte).then(a.context.cmp(&b.context));
        if limit < steps.len() {
            steps.select_nth_unstable_by(limit, order);
            steps.truncate(limit);
        }
        steps.sort_by(order);
        (views, steps)
    }

    /// Sets `context`'s quality per option (a new profile, or one corrected by what a client
    /// observed): its steps are scored again; its access count is unchanged. Nothing for a
    /// context never touched.
    pub fn set_quality(&mut self, context: u64, quality: &[f64]) {
        let Some(c) = self.contexts.get_mut(&context) else { return };
        c.quality = quality.to_vec();
        c.version += 1;
        self.push(context);
    }

    /// The quality the planner assumes `context`'s current option keeps (1 when dropped or
    /// unknown: recomputing loses nothing).
    pub fn quality_of(&self, context: u64) -> f64 {
        let dropped = self.dropped();
        match self.contexts.get(&context) {
            Some(c) if c.option != dropped => c.quality.get(c.option).copied().unwrap_or(1.0),
            _ => 1.0,
        }
    }

    /// Sets the bytes the kept blocks may take (the next rebalance fits them).
    pub fn set_budget(&mut self, budget_bytes: u64) {
        self.config.budget_bytes = budget_bytes;
    }

    /// What the planner weighs.
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// `context`'s blocks are gone (expired, evicted): forget it.
    pub fn forget(&mut self, context: u64) {
        if let Some(c) = self.contexts.remove(&context) {
            self.stored_bytes -= self.bytes(&c, c.option);
        }
    }

    /// Steps down, cheapest loss per byte first, until the kept bytes fit the budget; returns
    /// what changed (a context may change several times; the last is what holds).
    pub fn rebalance(&mut self) -> Vec<Change> {
        let mut changes = Vec::new();
        while self.stored_bytes > self.config.budget_bytes as f64 {
            let Some(step) = self.heap.pop() else { break };
            let Some(c) = self.contexts.get(&step.context) else { continue };
            if c.version != step.version {
                continue; // stale: the context was pushed again since
            }
            let Some((option, key)) = self.next_step(c) else { continue };
            if key.is_finite() {
                self.ln_price = Some(key);
            }
            let freed = self.bytes(c, c.option) - self.bytes(c, option);
            self.stored_bytes -= freed;
            if let Some(c) = self.contexts.get_mut(&step.context) {
                c.option = option;
                c.version += 1;
            }
            changes.push(Change { context: step.context, option });
            self.push(step.context);
        }
        // Stale entries pile up as contexts are touched: rebuild when they dominate.
        if self.heap.len() > 4 * self.contexts.len() + 1024 {
            self.rebuild_heap();
        }
        changes
    }

    fn rebuild_heap(&mut self) {
        let ids: Vec<u64> = self.contexts.keys().copied().collect();
        self.heap.clear();
        for id in ids {
            self.push(id);
        }
    }

    /// Loading a block kept with each listed option takes the delay given (measured as the
    /// store serves): every step is scored again, O(contexts). "Dropped" and nonsense delays are
    /// not taken.
    pub fn set_delays(&mut self, delays: &[(usize, f64)]) {
        let dropped = self.dropped();
        for &(option, delay) in delays {
            match self.config.options.get_mut(option) {
                Some(o) if option != dropped && delay.is_finite() && delay >= 0.0 => o.delay_s = delay,
                _ => {}
            }
        }
        self.rebuild_heap();
    }

    /// Stored bytes ÷ raw bytes of `option` is `ratio` (measured on what was stored): every
    /// context's bytes are counted again and every step scored again, O(contexts).
    pub fn set_ratio(&mut self, option: usize, ratio: f64) {
        let Some(o) = self.config.options.get_mut(option) else { return };
        if o.ratio == 0.0 || !(ratio.is_finite() && ratio > 0.0) {
            return; // "dropped" stays dropped; a nonsense ratio is not taken
        }
        o.ratio = ratio;
        self.stored_bytes = self.contexts.values().map(|c| self.bytes(c, c.option)).sum();
        self.rebuild_heap();
    }
}

/// The cleaning side of a planned volume: the planner decides what is dropped and how the rest
/// is compressed, so a cleaner keeps every live block, relocating it. Otherwise as [`Lru`]:
/// victims by cost-benefit (they hold the most dead space the planner's decisions left), the
/// DRAM tier holding what is put and read.
#[derive(Debug, Clone, Default)]
pub struct PlannedCleaning(Lru);

impl PlannedCleaning {
    /// Reading time from `clock` (the store's).
    pub fn new(clock: Clock) -> PlannedCleaning {
        PlannedCleaning(Lru::new(clock))
    }
}

impl Placement for PlannedCleaning {
    fn on_put(&self, block: &BlockInfo<'_>) -> PutPlan {
        self.0.on_put(block)
    }

    fn on_load(&self, block: &BlockInfo<'_>) -> bool {
        self.0.on_load(block)
    }

    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        self.0.victim(candidates)
    }

    fn cleans(&self) -> bool {
        true
    }

    fn keep(&self, _: &LiveBlock<'_>) -> Keep {
        Keep::Relocate
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::indexing_slicing, clippy::unwrap_used)]

    use super::*;

    fn options() -> Vec<StoreOption> {
        vec![
            StoreOption { ratio: 1.0, delay_s: 0.011, lossy: false },
            StoreOption { ratio: 0.5, delay_s: 0.008, lossy: true },
            StoreOption { ratio: 0.25, delay_s: 0.007, lossy: true },
            StoreOption { ratio: 0.0, delay_s: 0.017, lossy: false },
        ]
    }

    /// A use of `context` by a request of blocks of 100 bytes, at the configuration's α.
    fn at(context: u64, now_ms: u64, blocks: u64, quality: &[f64]) -> ContextUse<'_> {
        ContextUse { context, now_ms, blocks, raw_bytes: 100, quality, alpha: None }
    }

    fn planner(budget: u64) -> Planner {
        Planner::new(PlannerConfig { alpha: 0.5, half_life_ms: 600_000, budget_bytes: budget, options: options() })
    }

    /// Total utility (at current frequencies) of a choice per context, by brute force.
    fn brute_force(p: &Planner, ids: &[u64]) -> f64 {
        let n = p.config.options.len();
        let mut best = f64::NEG_INFINITY;
        for code in 0..n.pow(ids.len() as u32) {
            let mut rest = code;
            let (mut u, mut bytes) = (0.0, 0.0);
            for id in ids {
                let c = &p.contexts[id];
                let k = rest % n;
                rest /= n;
                // A lossy copy is final: only options at or below the current one may be chosen.
                u += p.utility(c, k) * c.blocks as f64 * c.ln_freq.exp();
                bytes += p.bytes(c, k);
            }
            if bytes <= p.config.budget_bytes as f64 {
                best = best.max(u);
            }
        }
        best
    }

    fn total(p: &Planner) -> f64 {
        p.contexts.values().map(|c| p.utility(c, c.option) * c.blocks as f64 * c.ln_freq.exp()).sum()
    }

    #[test]
    fn the_greedy_fits_the_budget_near_the_optimum() {
        let mut rng = kvhoard_kernels::rng::Rng::new(3);
        for case in 0..200 {
            let contexts = 2 + case % 4;
            let mut p = planner(0);
            let mut raw_total = 0;
            for id in 0..contexts as u64 {
                let blocks = 1 + rng.below(8);
                let quality =
                    vec![1.0, 0.99 - f64::from(rng.uniform()) * 0.05, 0.9 - f64::from(rng.uniform()) * 0.3, 1.0];
                for t in 0..=rng.below(5) {
                    p.touch(&at(id, t * 1000, blocks, &quality));
                }
                raw_total += blocks * 100;
            }
            p.config.budget_bytes = rng.below(raw_total + 1);
            let ids: Vec<u64> = (0..contexts as u64).collect();
            let optimum = brute_force(&p, &ids);
            p.rebalance();
            assert!(p.stored_bytes() <= p.config.budget_bytes, "case {case}: over budget");
            let got = total(&p);
            // The greedy's bound: within the utility of the largest single step of any context.
            let step = p
                .contexts
                .values()
                .map(|c| {
                    (0..4)
                        .map(|k| (p.utility(c, 0) - p.utility(c, k)).abs() * c.blocks as f64 * c.ln_freq.exp())
                        .fold(0.0, f64::max)
                })
                .fold(0.0, f64::max);
            assert!(got + step + 1e-9 >= optimum, "case {case}: {got} vs optimum {optimum} (step {step})");
        }
    }

    #[test]
    fn cold_contexts_go_first_and_hot_ones_keep_their_quality() {
        let mut p = planner(1000);
        let q = [1.0, 0.98, 0.8, 1.0];
        // A hot context, read ten times; a cold one, once; both of 8 blocks of 100 bytes.
        for t in 0..10 {
            p.touch(&at(1, t * 1000, 8, &q));
        }
        p.touch(&at(2, 10_000, 8, &q));
        assert_eq!(p.stored_bytes(), 1600);
        let changes = p.rebalance();
        assert!(p.stored_bytes() <= 1000);
        assert_eq!(p.option_of(1), 0, "the hot context stays raw");
        assert_ne!(p.option_of(2), 0, "the cold one gives way: {changes:?}");
        // Read again, a dropped context is stored again, in the form worth most at the price
        // bytes have now: compressed, since they are dear.
        p.touch(&at(3, 11_000, 1, &q));
        p.config.budget_bytes = 0;
        p.rebalance();
        assert_eq!(p.stored_bytes(), 0);
        p.touch(&at(3, 12_000, 1, &q));
        assert!((1..3).contains(&p.option_of(3)), "{}", p.option_of(3));
    }

    #[test]
    fn a_lossy_context_is_only_dropped_further() {
        // Recomputing is slow here: quantizing comes first.
        let mut options = options();
        options[3].delay_s = 0.1;
        let mut p = Planner::new(PlannerConfig { alpha: 0.5, half_life_ms: 600_000, budget_bytes: 1200, options });
        let q = [1.0, 0.98, 0.97, 1.0];
        for t in 0..10 {
            p.touch(&at(1, t * 1000, 8, &q));
        }
        p.touch(&at(2, 10_000, 8, &q));
        p.rebalance();
        assert_eq!((p.option_of(1), p.option_of(2)), (0, 1), "the cold context is quantized");
        // Tighter: its lossy copy is never quantized harder (cleaning would not recode it).
        p.config.budget_bytes = 600;
        p.rebalance();
        assert_ne!(p.option_of(2), 2, "from a lossy form the only step is to drop");
    }

    #[test]
    fn decay_does_not_reorder_untouched_contexts() {
        let mut p = planner(u64::MAX);
        let q = [1.0, 0.98, 0.8, 1.0];
        p.touch(&at(1, 0, 1, &q));
        p.touch(&at(1, 1, 1, &q));
        p.touch(&at(2, 3_600_000, 1, &q));
        // Context 1 was read twice an hour ago (six half-lives): less than context 2's once now.
        assert!(p.contexts[&1].ln_freq < p.contexts[&2].ln_freq);
    }
}
