//! The placement planner (EvicPress): for every context, one decision of how its blocks are kept
//! on the log (which codec) or whether they are dropped, and whether the DRAM tier holds them
//! too, chosen jointly across contexts so that each tier's bytes fit its budget at the least loss
//! of utility.
//!
//! **Utility** of keeping a context's blocks with choice `o` (a form, in memory or not), per
//! block: `U(o) = (α · quality(o) − delay(o)) · freq`, where quality is what the context's
//! estimate says the codec keeps (1 for lossless and raw), delay the time to load and decode a
//! block (from the log, or from memory when the DRAM tier holds it; for a dropped context, the
//! prefill that recomputes it, at quality 1), freq the context's chance of being
//! used again (`placement::reuse`: a weight that grows with its uses, halved every half-life
//! since the last, the half-life learned from the gaps between uses), and α (seconds per unit
//! of quality) what quality is worth against time.
//!
//! **Placement** (EvicPress Algorithm 1, the multiple-choice-knapsack greedy, tier by tier):
//! while the DRAM tier's copies exceed its budget, take the step with the smallest utility lost
//! per byte of memory freed (leave memory, compress harder, or drop); then, while the log's
//! bytes exceed its budget, the step with the smallest loss per byte of the log freed (compress
//! harder, or drop). No step takes more bytes in either tier: the DRAM tier holds copies of what
//! is on the log, so a context held in memory counts against both. Time multiplies every
//! context's freq by the same factor, so the order of contexts does not change with time alone:
//! a heap per tier keyed by log(loss per byte) + log(freq at a fixed origin) stays valid, and
//! only a context that is accessed or changes is pushed again. A step costs O(choices + log
//! contexts); a put costs one touch, O(choices + log contexts).
//!
//! **Admission**: a context stored (again) takes the choice worth most at the current prices of
//! bytes, the utility lost per byte by the last step placement took in each tier, so a block the
//! next rebalance would compress is compressed when it is put, not written twice. A kept context
//! used again is held in memory when that is worth more than its price there (as a read brings
//! a block into the DRAM tier); the greedy moves it out again when memory runs short.
//!
//! Decisions that discard information are final for a copy: a context compressed lossily is never
//! decompressed back nor compressed harder (its only steps are out of memory and to be dropped,
//! as cleaning would not recode its lossy form); when it needs more quality it is recomputed by
//! the client (dropped).

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::reuse::{self, GapLearner};
use super::{BlockInfo, Keep, LiveBlock, Lru, Placement, PutPlan, SegmentView};
use crate::clock::Clock;

/// How much more per byte than the greedy's last drop on the log a context may lose dropped and
/// still be dropped by cleaning instead of copied ([`Planner::drop_for_cleaning`]): 2, a context
/// worth up to twice the one the greedy dropped last, which one half-life without a use brings down
/// to it. Wider margins write less but reach contexts in use: at 4 a context read every second
/// went, since uses alone make contexts differ by at most 3×. On the shared trace at SSD 0.1 and
/// 85 % fill (docs/benchmarks.md), cleaning wrote 0.4 bytes per byte put at 2 and 1.0 copying
/// every kept block, at the same or a lower mean TTFT.
pub const CLEANING_DROP_MARGIN: f64 = 2.0;
/// Cleaning drops contexts that lose something ([`Planner::drop_for_cleaning`]) only while the
/// kept bytes are at least this share of the log's budget.
pub const CLEANING_DROP_FILL: f64 = 0.9;

/// One way of keeping a context's blocks on the log (a form: as put, or a codec).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct StoreOption {
    /// Stored bytes ÷ raw bytes (0: dropped).
    pub ratio: f64,
    /// Seconds to load and decode one block from the log (for a dropped context: to recompute
    /// it).
    pub delay_s: f64,
    /// Whether the codec loses information (estimates apply).
    pub lossy: bool,
}

/// The DRAM tier as a choice: a context kept in some form may also be held in memory, where a
/// load costs `delay_s` of its form instead of the log's. The tier holds copies of what is on
/// the log, so a context held there counts its bytes against both budgets.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct DramChoice {
    /// Bytes the copies in memory may take (0: no DRAM choice; the planner decides the log
    /// alone).
    pub budget_bytes: u64,
    /// Per kept form (every option but "dropped"): seconds to load and decode one block held in
    /// memory.
    pub delay_s: Vec<f64>,
}

/// What the planner weighs.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannerConfig {
    /// Seconds of delay one unit of quality is worth, per block.
    pub alpha: f64,
    /// Half-life of a context's chance of reuse at the start, ms; from then on it follows the
    /// median gap between a context's uses (`placement::reuse`).
    pub half_life_ms: u64,
    /// Bytes the kept blocks may take on the log.
    pub budget_bytes: u64,
    /// The options, the first the least compressed (the one a new context starts with); the
    /// last is "dropped" (ratio 0).
    pub options: Vec<StoreOption>,
    /// The DRAM tier as a choice (its default: none).
    pub dram: DramChoice,
}

impl PlannerConfig {
    /// Whether holding contexts in the DRAM tier is one of the choices: it has a budget and a
    /// delay for every kept form.
    pub fn dram_choice(&self) -> bool {
        self.dram.budget_bytes > 0 && self.dram.delay_s.len() + 1 == self.options.len()
    }
}

/// Where a budget is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tier {
    Dram = 0,
    Ssd = 1,
}

/// A way of keeping a context: its form (an index into the options) and whether the DRAM tier
/// holds it too.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Choice {
    option: usize,
    dram: bool,
}

#[derive(Debug, Clone)]
struct Context {
    blocks: u64,
    raw_bytes: u64,
    /// ln of its chance of reuse at time 0: ln weight of its uses + its last use in half-lives
    /// · ln 2 (`placement::reuse`).
    ln_freq: f64,
    /// Its uses (accesses within [`reuse::SAME_USE_MS`] of a use's first are that use).
    uses: u32,
    /// Its last access, ms.
    last_ms: u64,
    /// When its current use began, ms: a use lasts at most [`reuse::SAME_USE_MS`].
    use_ms: u64,
    /// Estimated quality per option (1 for lossless).
    quality: Vec<f64>,
    /// Its α (its namespace's, else the configuration's).
    alpha: f64,
    option: usize,
    /// Whether the DRAM tier holds it.
    dram: bool,
    version: u64,
}

impl Context {
    fn choice(&self) -> Choice {
        Choice { option: self.option, dram: self.dram }
    }
}

/// A candidate step in a heap: smallest key first.
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

/// A decision the planner made: `context`'s blocks now kept with `option`, and held by the DRAM
/// tier or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Change {
    /// The context.
    pub context: u64,
    /// Its new option (index into the config's options).
    pub option: usize,
    /// Whether the DRAM tier holds it.
    pub dram: bool,
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
    /// Whether the DRAM tier holds it.
    pub dram: bool,
    /// Its chance of reuse now (`placement::reuse`).
    pub freq: f64,
    /// Per option: the quality it keeps for this context.
    pub quality: Vec<f64>,
    /// Its α: seconds of delay its whole quality is worth.
    pub alpha: f64,
    /// Per option, on the log: its utility for the whole context now,
    /// `(α · quality − delay) · freq · blocks`.
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
    /// Whether it would leave the DRAM tier's memory (`false`: a step on the log).
    pub from_dram: bool,
    /// Utility lost per byte freed, now.
    pub loss_per_byte: f64,
    /// Bytes it would free (in memory for a step out of the DRAM tier).
    pub bytes_freed: u64,
}

/// See the module documentation.
#[derive(Debug, Clone)]
pub struct Planner {
    config: PlannerConfig,
    contexts: HashMap<u64, Context>,
    /// Per [`Tier`]: steps that free its bytes.
    heaps: [BinaryHeap<Step>; 2],
    /// Per [`Tier`]: the bytes counted.
    bytes: [f64; 2],
    /// Per [`Tier`]: the price of a byte, the key of the last step placement took there (`None`
    /// before any).
    ln_price: [Option<f64>; 2],
    /// The key of the last drop the greedy took on the log: what dropping is worth at the
    /// margin, which cleaning's drops are weighed against (`None` before any).
    ln_drop_price: Option<f64>,
    /// The half-life in use, ms.
    half_life_ms: u64,
    /// Gaps between uses, which the half-life follows.
    gaps: GapLearner,
    /// Contexts dropped for cleaning ([`Planner::drop_for_cleaning`]).
    cleaning_drops: u64,
}

impl Planner {
    /// A planner with no context yet.
    pub fn new(config: PlannerConfig) -> Planner {
        Planner {
            contexts: HashMap::new(),
            heaps: [BinaryHeap::new(), BinaryHeap::new()],
            bytes: [0.0; 2],
            ln_price: [None; 2],
            ln_drop_price: None,
            half_life_ms: config.half_life_ms.max(1),
            gaps: GapLearner::default(),
            cleaning_drops: 0,
            config,
        }
    }

    /// Bytes the kept blocks take on the log, as the planner counts them.
    pub fn stored_bytes(&self) -> u64 {
        self.counted_in(Tier::Ssd) as u64
    }

    /// Bytes of the copies the planner has the DRAM tier hold.
    pub fn dram_bytes(&self) -> u64 {
        self.counted_in(Tier::Dram) as u64
    }

    /// Bytes counted in `tier`.
    fn counted_in(&self, tier: Tier) -> f64 {
        self.bytes.get(tier as usize).copied().unwrap_or(0.0)
    }

    /// The option a context's blocks are kept with (the first for one never seen).
    pub fn option_of(&self, context: u64) -> usize {
        self.contexts.get(&context).map_or(0, |c| c.option)
    }

    /// Whether the planner has the DRAM tier hold `context` (`None`: it decides nothing of the
    /// DRAM tier, or does not know the context).
    pub fn in_dram(&self, context: u64) -> Option<bool> {
        if !self.dram_choice() {
            return None;
        }
        self.contexts.get(&context).map(|c| c.dram)
    }

    /// Whether the planner would have the DRAM tier hold `context` once it is used now: held
    /// already, or worth holding at the current prices (what [`Planner::touch`] will decide), so
    /// that the read which promotes a context brings its blocks into memory. Changes nothing.
    pub fn holds_when_used(&self, context: u64) -> Option<bool> {
        if !self.dram_choice() {
            return None;
        }
        let dropped = self.dropped();
        let c = self.contexts.get(&context)?;
        Some(c.dram || (c.option != dropped && self.promoted(c).dram))
    }

    /// Whether holding contexts in the DRAM tier is one of the choices.
    pub fn dram_choice(&self) -> bool {
        self.config.dram_choice()
    }

    /// Contexts tracked.
    pub fn contexts(&self) -> usize {
        self.contexts.len()
    }

    /// The index of the last option, "dropped".
    pub fn dropped(&self) -> usize {
        self.config.options.len().saturating_sub(1)
    }

    /// ln of a use's weight at `now_ms`: uses count `2^(t / half-life)`, so that every
    /// context's chance decays by the same factor and the heap's order holds.
    fn ln_time(&self, now_ms: u64) -> f64 {
        ln_time(now_ms, self.half_life_ms)
    }

    /// Contexts dropped so far because cleaning reached one of their blocks.
    pub fn cleaning_drops(&self) -> u64 {
        self.cleaning_drops
    }

    /// The half-life in use, ms (the configured one until enough gaps between uses were seen).
    pub fn half_life_ms(&self) -> u64 {
        self.half_life_ms
    }

    /// Follows a half-life of `half_life_ms` from `now_ms` on: every context and both prices of
    /// a byte are scored again, the prices worth as much now as before, O(contexts).
    fn set_half_life(&mut self, half_life_ms: u64, now_ms: u64) {
        let before = self.ln_time(now_ms);
        self.half_life_ms = half_life_ms.max(1);
        let after = self.ln_time(now_ms);
        for price in self.ln_price.iter_mut().flatten().chain(self.ln_drop_price.as_mut()) {
            *price += after - before;
        }
        let half_life_ms = self.half_life_ms;
        for c in self.contexts.values_mut() {
            c.ln_freq = ln_freq(c.uses, c.last_ms, half_life_ms);
            c.version += 1;
        }
        self.rebuild_heaps();
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
        self.rebuild_heaps();
        gone
    }

    /// Bytes `c` takes in `tier` kept as `choice`.
    fn bytes_in(&self, c: &Context, choice: Choice, tier: Tier) -> f64 {
        if tier == Tier::Dram && !choice.dram {
            return 0.0;
        }
        let ratio = self.config.options.get(choice.option).map_or(0.0, |o| o.ratio);
        c.blocks as f64 * c.raw_bytes as f64 * ratio
    }

    /// Bytes `c` takes on the log kept with `option`.
    #[cfg(test)]
    fn bytes(&self, c: &Context, option: usize) -> f64 {
        self.bytes_in(c, Choice { option, dram: false }, Tier::Ssd)
    }

    /// Utility per block of `choice` at unit frequency.
    fn utility_of(&self, c: &Context, choice: Choice) -> f64 {
        let Some(o) = self.config.options.get(choice.option) else { return f64::NEG_INFINITY };
        let dropped = o.ratio == 0.0;
        let q = if dropped { 1.0 } else { c.quality.get(choice.option).copied().unwrap_or(1.0) };
        let delay = match choice.dram {
            true => self.config.dram.delay_s.get(choice.option).copied().unwrap_or(f64::INFINITY),
            false => o.delay_s,
        };
        c.alpha * q - delay
    }

    /// Utility per block of `option` on the log at unit frequency.
    fn utility(&self, c: &Context, option: usize) -> f64 {
        self.utility_of(c, Choice { option, dram: false })
    }

    /// Every way `c` may be kept: each option on the log, and each kept one in the DRAM tier
    /// too when that is a choice.
    fn choices(&self) -> impl Iterator<Item = Choice> + '_ {
        let dram = self.dram_choice();
        let dropped = self.dropped();
        (0..self.config.options.len()).flat_map(move |option| {
            let held = dram && option != dropped;
            [Choice { option, dram: false }, Choice { option, dram: true }].into_iter().filter(move |c| !c.dram || held)
        })
    }

    /// The best step from `c`'s choice that frees bytes in `tier` without taking more in either:
    /// (choice, ln(loss per byte freed) + ln freq).
    fn next_step(&self, c: &Context, tier: Tier) -> Option<(Choice, f64)> {
        let now = c.choice();
        let (b0, u0) = (self.bytes_in(c, now, tier), self.utility_of(c, now));
        let (d0, s0) = (self.bytes_in(c, now, Tier::Dram), self.bytes_in(c, now, Tier::Ssd));
        // A lossy form is final for its copy: recoded again it would lose more than the next
        // option's quality says, so from it the only steps are out of memory and to drop.
        let lossy = self.config.options.get(c.option).is_some_and(|o| o.lossy);
        let dropped = self.dropped();
        let mut best: Option<(Choice, f64)> = None;
        for k in self.choices() {
            let freed = b0 - self.bytes_in(c, k, tier);
            let grows = self.bytes_in(c, k, Tier::Dram) > d0 || self.bytes_in(c, k, Tier::Ssd) > s0;
            // An option the context may not take (its quality is -inf) is never a step.
            let closed = !self.utility_of(c, k).is_finite() || (lossy && k.option != dropped && k.option != c.option);
            if freed <= 0.0 || grows || closed {
                continue;
            }
            // Loss per byte at unit frequency, times the blocks it is summed over.
            let loss = (u0 - self.utility_of(c, k)) * c.blocks as f64 / freed;
            let key = if loss <= 0.0 { f64::NEG_INFINITY } else { loss.ln() + c.ln_freq };
            if best.is_none_or(|(_, b)| key < b) {
                best = Some((k, key));
            }
        }
        best
    }

    fn push(&mut self, context: u64) {
        let Some(c) = self.contexts.get(&context) else { return };
        for tier in [Tier::Dram, Tier::Ssd] {
            if tier == Tier::Dram && !c.dram {
                continue;
            }
            if let Some((_, key)) = self.next_step(c, tier) {
                let step = Step { key, context, version: c.version };
                if let Some(heap) = self.heaps.get_mut(tier as usize) {
                    heap.push(step);
                }
            }
        }
    }

    /// Changes `context` by `change`, keeping the byte counts (a context never seen is created
    /// by `new`), and pushes its next steps.
    fn account(&mut self, context: u64, new: impl FnOnce() -> Context, change: impl FnOnce(&mut Context)) {
        let before = self.contexts.get(&context).map_or([0.0; 2], |c| self.counted(c));
        let c = self.contexts.entry(context).or_insert_with(new);
        change(c);
        c.version += 1;
        let after = self.contexts.get(&context).map_or([0.0; 2], |c| self.counted(c));
        for (total, (a, b)) in self.bytes.iter_mut().zip(after.iter().zip(before)) {
            *total += a - b;
        }
        self.push(context);
    }

    /// Bytes `c` takes per [`Tier`] as it is kept now.
    fn counted(&self, c: &Context) -> [f64; 2] {
        [self.bytes_in(c, c.choice(), Tier::Dram), self.bytes_in(c, c.choice(), Tier::Ssd)]
    }

    /// A request used a context ([`ContextUse`]). A context that was dropped starts again from
    /// the choice admission gives it; one kept on the log alone is held in memory too when that
    /// is worth more at the current prices of bytes (as a read would bring it there). Accesses
    /// within [`reuse::SAME_USE_MS`] of a use's first are that use ([`used_at`]).
    pub fn touch(&mut self, u: &ContextUse<'_>) {
        let ContextUse { context, now_ms, blocks, raw_bytes, quality, alpha } = *u;
        let alpha = alpha.unwrap_or(self.config.alpha);
        let dropped = self.dropped();
        let known = self.contexts.get(&context).map(|c| c.option != dropped);
        let mut updated = self.contexts.get(&context).cloned().unwrap_or(Context {
            blocks: 0,
            raw_bytes,
            ln_freq: f64::NEG_INFINITY,
            uses: 0,
            last_ms: now_ms,
            use_ms: now_ms,
            quality: Vec::new(),
            alpha,
            option: 0,
            dram: false,
            version: 0,
        });
        let pause = used_at(&mut updated, now_ms);
        let learned = pause.and_then(|gap| self.gaps.record(gap)).filter(|&h| reuse::drifted(self.half_life_ms, h));
        updated.ln_freq = ln_freq(updated.uses, updated.last_ms, self.half_life_ms);
        updated.blocks = blocks;
        updated.raw_bytes = raw_bytes;
        updated.quality = quality.to_vec();
        updated.alpha = alpha;
        let choice = match known {
            Some(true) => self.promoted(&updated),
            _ => self.admission(&updated),
        };
        let fresh = updated.clone();
        self.account(
            context,
            || fresh,
            |c| {
                *c = Context { option: choice.option, dram: choice.dram, version: c.version, ..updated };
            },
        );
        if let Some(half_life_ms) = learned {
            self.set_half_life(half_life_ms, now_ms);
        }
    }

    /// What `c` is worth kept as `choice` at the current prices of bytes.
    fn worth(&self, c: &Context, choice: Choice) -> f64 {
        // What `choice` takes in `tier` at its price there: nothing for no bytes, however dear
        // (a context idle for a thousand half-lives would price a byte at infinity, times 0).
        let cost = |tier: Tier| match self.bytes_in(c, choice, tier) {
            b if b > 0.0 => {
                self.ln_price.get(tier as usize).copied().flatten().map_or(0.0, |p| (p - c.ln_freq).exp()) * b
            }
            _ => 0.0,
        };
        self.utility_of(c, choice) * c.blocks as f64 - cost(Tier::Ssd) - cost(Tier::Dram)
    }

    /// Admission: the choice worth most for `c` at the current prices of bytes (the utility lost
    /// per byte by the last step placement took in each tier), so that what the next rebalance
    /// would compress or drop is not written raw first. Before any step a byte costs nothing,
    /// and the choice is the one of highest utility: a codec whose faster load is worth more than
    /// the quality it loses is chosen even while there is room (EvicPress starts every context at
    /// its best configuration).
    ///
    /// A put is stored whatever the plan, so a context worth less kept in every form than
    /// recomputed (a log slower than the prefill) is stored as put, on the log alone: compressing
    /// it would cost CPU and serve lower quality to the reads before it goes, and it goes first
    /// (dropping it is a gain, so it is the greedy's first step and cleaning drops it rather
    /// than copy it).
    fn admission(&self, c: &Context) -> Choice {
        let dropped = self.dropped();
        let recompute = self.utility_of(c, Choice { option: dropped, dram: false });
        self.choices()
            .filter(|k| k.option != dropped && self.utility_of(c, *k) >= recompute)
            .map(|k| (k, self.worth(c, k)))
            .filter(|(_, worth)| worth.is_finite())
            .fold(None, |best: Option<(Choice, f64)>, x| if best.is_none_or(|b| x.1 > b.1) { Some(x) } else { best })
            .map_or(Choice { option: 0, dram: false }, |(k, _)| k)
    }

    /// A kept context used again: held in memory too when that is worth more than the log alone
    /// at the current prices (its form does not change: that is cleaning's work).
    fn promoted(&self, c: &Context) -> Choice {
        let now = c.choice();
        let held = Choice { dram: true, ..now };
        if now.dram || !self.dram_choice() || self.worth(c, held) <= self.worth(c, now) {
            return now;
        }
        held
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
        let alpha = alpha.unwrap_or(self.config.alpha);
        // As `touch` would count this use (a dropped context keeps its uses).
        let (uses, last_ms, use_ms) =
            self.contexts.get(&context).map_or((0, now_ms, now_ms), |c| (c.uses, c.last_ms, c.use_ms));
        let mut c = Context {
            blocks,
            raw_bytes,
            ln_freq: f64::NEG_INFINITY,
            uses,
            last_ms,
            use_ms,
            quality: quality.to_vec(),
            alpha,
            option: 0,
            dram: false,
            version: 0,
        };
        used_at(&mut c, now_ms);
        c.ln_freq = ln_freq(c.uses, c.last_ms, self.half_life_ms);
        self.admission(&c).option
    }

    /// Blocks `context` holds, as last told (0 for one never seen).
    pub fn blocks_of(&self, context: u64) -> u64 {
        self.contexts.get(&context).map_or(0, |c| c.blocks)
    }

    /// Cleaning is about to copy a block of `context`: when dropping the whole context loses
    /// less per byte of the log than `margin` times what the last drop the greedy took there
    /// lost (it is among the next the greedy would drop as the log fills), it is dropped now, so
    /// the copy is not made. Weighed against drops, not against every step: a step that
    /// compresses loses far less per byte than any drop, and would make no drop look cheap.
    /// Returns whether it was dropped.
    pub fn drop_for_cleaning(&mut self, context: u64, margin: f64) -> bool {
        let dropped = self.dropped();
        let Some(c) = self.contexts.get(&context).filter(|c| c.option != dropped) else { return false };
        let now = c.choice();
        let to = Choice { option: dropped, dram: false };
        let freed = self.bytes_in(c, now, Tier::Ssd);
        if freed <= 0.0 {
            return false;
        }
        // A context whose recompute is worth as much as its copy (a disk slower than the
        // prefill) goes whatever the price; the others when near it.
        let loss = (self.utility_of(c, now) - self.utility_of(c, to)) * c.blocks as f64 / freed;
        if loss > 0.0 {
            // Only near the budget: a price from a fuller log says nothing of a log with room.
            if self.counted_in(Tier::Ssd) < CLEANING_DROP_FILL * self.config.budget_bytes as f64 {
                return false;
            }
            let Some(price) = self.ln_drop_price else { return false };
            if loss.ln() + c.ln_freq > price + margin.ln() {
                return false;
            }
        }
        self.account(
            context,
            || unreachable_context(context),
            |c| {
                c.option = to.option;
                c.dram = false;
            },
        );
        self.cleaning_drops += 1;
        true
    }

    /// Whether the kept bytes exceed a budget (a rebalance would change something).
    pub fn over_budget(&self) -> bool {
        self.over(Tier::Ssd) || self.over(Tier::Dram)
    }

    fn over(&self, tier: Tier) -> bool {
        let budget = match tier {
            Tier::Dram if !self.dram_choice() => return false,
            Tier::Dram => self.config.dram.budget_bytes,
            Tier::Ssd => self.config.budget_bytes,
        };
        self.counted_in(tier) > budget as f64
    }

    /// The `limit` contexts worth most now (by chance of reuse), and the first `limit` steps a
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
                dram: c.dram,
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
            .flat_map(|(id, c)| {
                [Tier::Dram, Tier::Ssd].into_iter().filter(|t| *t == Tier::Ssd || c.dram).filter_map(move |tier| {
                    let (to, key) = self.next_step(c, tier)?;
                    Some(StepView {
                        context: *id,
                        from: c.option,
                        to: to.option,
                        from_dram: tier == Tier::Dram,
                        loss_per_byte: (key - ln_now).exp(),
                        bytes_freed: (self.bytes_in(c, c.choice(), tier) - self.bytes_in(c, to, tier)).max(0.0) as u64,
                    })
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
    /// observed): its steps are scored again; its uses are unchanged. Nothing for a
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

    /// Sets the bytes the kept blocks may take on the log (the next rebalance fits them).
    pub fn set_budget(&mut self, budget_bytes: u64) {
        self.config.budget_bytes = budget_bytes;
    }

    /// Sets the bytes the DRAM tier's copies may take (0: the DRAM tier is no choice; contexts
    /// held there stay counted until they change).
    pub fn set_dram_budget(&mut self, budget_bytes: u64) {
        self.config.dram.budget_bytes = budget_bytes;
        self.rebuild_heaps();
    }

    /// What the planner weighs.
    pub fn config(&self) -> &PlannerConfig {
        &self.config
    }

    /// `context`'s blocks are gone (expired, evicted): forget it.
    pub fn forget(&mut self, context: u64) {
        if let Some(c) = self.contexts.remove(&context) {
            let counted = self.counted(&c);
            for (total, b) in self.bytes.iter_mut().zip(counted) {
                *total -= b;
            }
        }
    }

    /// Steps down, cheapest loss per byte first, until the DRAM tier's copies fit its budget,
    /// then until the log's bytes fit theirs (EvicPress Algorithm 1, tier by tier); returns what
    /// changed (a context may change several times; the last is what holds).
    pub fn rebalance(&mut self) -> Vec<Change> {
        self.rebalance_tiers(&[Tier::Dram, Tier::Ssd])
    }

    /// [`Planner::rebalance`] of the DRAM tier alone: what a read that brought a context into
    /// memory needs (a step or a few, each O(choices + log contexts)), leaving the log's steps,
    /// which cleaning carries out, to puts and cleaning.
    pub fn rebalance_memory(&mut self) -> Vec<Change> {
        self.rebalance_tiers(&[Tier::Dram])
    }

    fn rebalance_tiers(&mut self, tiers: &[Tier]) -> Vec<Change> {
        let mut changes = Vec::new();
        for &tier in tiers {
            while self.over(tier) {
                let Some(step) = self.heaps.get_mut(tier as usize).and_then(BinaryHeap::pop) else { break };
                let Some(c) = self.contexts.get(&step.context) else { continue };
                if c.version != step.version {
                    continue; // stale: the context was pushed again since
                }
                let Some((to, key)) = self.next_step(c, tier) else { continue };
                if key.is_finite() {
                    if let Some(price) = self.ln_price.get_mut(tier as usize) {
                        *price = Some(key);
                    }
                    if tier == Tier::Ssd && to.option == self.dropped() {
                        self.ln_drop_price = Some(key);
                    }
                }
                self.account(
                    step.context,
                    || unreachable_context(step.context),
                    |c| {
                        c.option = to.option;
                        c.dram = to.dram;
                    },
                );
                changes.push(Change { context: step.context, option: to.option, dram: to.dram });
            }
        }
        // Stale entries pile up as contexts are touched: rebuild when they dominate.
        if self.heaps.iter().map(BinaryHeap::len).sum::<usize>() > 8 * self.contexts.len() + 1024 {
            self.rebuild_heaps();
        }
        changes
    }

    fn rebuild_heaps(&mut self) {
        let ids: Vec<u64> = self.contexts.keys().copied().collect();
        self.heaps.iter_mut().for_each(BinaryHeap::clear);
        for id in ids {
            self.push(id);
        }
    }

    /// Loading a block kept with each listed option takes the delays given (on the log, then
    /// held in memory; measured as the store serves): every step is scored again, O(contexts).
    /// "Dropped" and nonsense delays are not taken.
    pub fn set_delays(&mut self, delays: &[(usize, f64, f64)]) {
        let dropped = self.dropped();
        let fine = |d: f64| d.is_finite() && d >= 0.0;
        for &(option, log, dram) in delays {
            if option == dropped {
                continue;
            }
            if let Some(o) = self.config.options.get_mut(option).filter(|_| fine(log)) {
                o.delay_s = log;
            }
            if let Some(d) = self.config.dram.delay_s.get_mut(option).filter(|_| fine(dram)) {
                *d = dram;
            }
        }
        self.rebuild_heaps();
    }

    /// Stored bytes ÷ raw bytes of `option` is `ratio` (measured on what was stored): every
    /// context's bytes are counted again and every step scored again, O(contexts).
    pub fn set_ratio(&mut self, option: usize, ratio: f64) {
        let Some(o) = self.config.options.get_mut(option) else { return };
        if o.ratio == 0.0 || !(ratio.is_finite() && ratio > 0.0) {
            return; // "dropped" stays dropped; a nonsense ratio is not taken
        }
        o.ratio = ratio;
        let mut bytes = [0.0; 2];
        for c in self.contexts.values() {
            for (total, b) in bytes.iter_mut().zip(self.counted(c)) {
                *total += b;
            }
        }
        self.bytes = bytes;
        self.rebuild_heaps();
    }
}

/// ln of a use's weight at `at_ms` under a half-life of `half_life_ms`.
fn ln_time(at_ms: u64, half_life_ms: u64) -> f64 {
    at_ms as f64 / half_life_ms.max(1) as f64 * std::f64::consts::LN_2
}

/// The score of a context used `uses` times, last at `last_ms`: ln of its chance of reuse at
/// time 0.
fn ln_freq(uses: u32, last_ms: u64, half_life_ms: u64) -> f64 {
    reuse::ln_weight(uses) + ln_time(last_ms, half_life_ms)
}

/// Counts an access of `c` at `now_ms`: a new use when its current one began
/// [`reuse::SAME_USE_MS`] or more ago (or it has none); returns the pause since its last access
/// when that pause alone is a use's length or more, the gap the half-life learns from. A clock
/// that stepped back starts nothing and moves nothing back.
fn used_at(c: &mut Context, now_ms: u64) -> Option<u64> {
    let pause = now_ms.saturating_sub(c.last_ms);
    let mut gap = None;
    if c.uses == 0 || now_ms.saturating_sub(c.use_ms) >= reuse::SAME_USE_MS {
        if c.uses > 0 && pause >= reuse::SAME_USE_MS {
            gap = Some(pause);
        }
        c.uses = c.uses.saturating_add(1);
        c.use_ms = now_ms;
    }
    c.last_ms = c.last_ms.max(now_ms);
    gap
}

/// A context `account` is asked to change is always there (its callers check): this is never
/// called, and would only make a context of nothing.
fn unreachable_context(_: u64) -> Context {
    Context {
        blocks: 0,
        raw_bytes: 0,
        ln_freq: f64::NEG_INFINITY,
        uses: 0,
        last_ms: 0,
        use_ms: 0,
        quality: Vec::new(),
        alpha: 0.0,
        option: 0,
        dram: false,
        version: 0,
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
        Planner::new(PlannerConfig {
            alpha: 0.5,
            half_life_ms: 600_000,
            budget_bytes: budget,
            options: options(),
            dram: DramChoice::default(),
        })
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

    /// Contexts 0..`contexts` of 1-8 blocks of 100 bytes, random qualities, each used 1-6 times;
    /// returns their raw bytes.
    fn random_contexts(p: &mut Planner, rng: &mut kvhoard_kernels::rng::Rng, contexts: u64) -> u64 {
        let mut raw_total = 0;
        for id in 0..contexts {
            let blocks = 1 + rng.below(8);
            let quality = vec![1.0, 0.99 - f64::from(rng.uniform()) * 0.05, 0.9 - f64::from(rng.uniform()) * 0.3, 1.0];
            for t in 0..=rng.below(5) {
                p.touch(&at(id, t * 1000, blocks, &quality));
            }
            raw_total += blocks * 100;
        }
        raw_total
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
            let raw_total = random_contexts(&mut p, &mut rng, contexts as u64);
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
        // A recompute slower than an 8-bit load, so that quantizing is worth more than dropping.
        p.config.options[3].delay_s = 0.02;
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
        // With no room at all, the last step drops the hot context: bytes are as dear as its
        // loss. A new context, with a third of its chance of reuse and a bit more, is stored in
        // the form worth most at that price: compressed.
        p.config.budget_bytes = 0;
        p.rebalance();
        assert_eq!(p.stored_bytes(), 0);
        p.touch(&at(3, 11_000, 1, &q));
        assert!((1..3).contains(&p.option_of(3)), "{}", p.option_of(3));
    }

    #[test]
    fn a_lossy_context_is_only_dropped_further() {
        // Recomputing is slow here: quantizing comes first.
        let mut options = options();
        options[3].delay_s = 0.1;
        let mut p = Planner::new(PlannerConfig {
            alpha: 0.5,
            half_life_ms: 600_000,
            budget_bytes: 1200,
            options,
            dram: DramChoice::default(),
        });
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
        p.touch(&at(1, 1_000, 1, &q));
        p.touch(&at(2, 3_600_000, 1, &q));
        // Context 1 was used twice an hour ago (six half-lives): less than context 2's once now.
        assert!(p.contexts[&1].ln_freq < p.contexts[&2].ln_freq);
    }

    #[test]
    fn accesses_closer_than_a_second_are_one_use() {
        let mut p = planner(u64::MAX);
        let q = [1.0, 0.98, 0.8, 1.0];
        for t in [0, 300, 900] {
            p.touch(&at(1, t, 1, &q));
        }
        // 0, 300 and 900 ms: within the second the use began, one use.
        assert_eq!(p.contexts[&1].uses, 1);
        // A use lasts at most a second: a context read without a pause is used again and again.
        p.touch(&at(1, 1_700, 1, &q));
        assert_eq!((p.contexts[&1].uses, p.contexts[&1].last_ms), (2, 1_700));
        // Only a pause of a second or more is a gap the half-life learns from.
        assert_eq!(p.gaps, GapLearner::default());
        p.touch(&at(1, 2_700, 1, &q));
        assert_eq!((p.contexts[&1].uses, p.contexts[&1].last_ms), (3, 2_700));
        assert_ne!(p.gaps, GapLearner::default());
        // A clock that steps back is the same use, and never moves the last use back.
        p.touch(&at(1, 100, 1, &q));
        assert_eq!((p.contexts[&1].uses, p.contexts[&1].last_ms), (3, 2_700));
        // Used more, worth more at the same recency.
        p.touch(&at(2, 2_700, 1, &q));
        assert!(p.contexts[&2].ln_freq < p.contexts[&1].ln_freq);
    }

    #[test]
    fn the_half_life_follows_the_gaps_between_uses_and_the_order_holds() {
        // Room for 30 contexts of one 100-byte block, kept raw or dropped; 300 used twice,
        // 30 s apart.
        let mut p = planner(3_000);
        let q = [1.0, f64::NEG_INFINITY, f64::NEG_INFINITY, 1.0];
        assert_eq!(p.half_life_ms(), 600_000);
        for c in 0..300u64 {
            p.touch(&at(c, c * 100, 1, &q));
            p.touch(&at(c, c * 100 + 30_000, 1, &q));
            p.rebalance();
        }
        assert_eq!(p.half_life_ms(), 30_000, "the median gap");
        assert!(p.stored_bytes() <= 3_000);
        // Scored again with the new half-life, the greedy still keeps the contexts used last.
        let kept: Vec<u64> = (0..300).filter(|&c| p.option_of(c) != p.dropped()).collect();
        assert_eq!(kept, (270..300).collect::<Vec<u64>>());
        // Less room: the least recently used of them goes first.
        p.set_budget(2_900);
        p.rebalance();
        assert_eq!(p.option_of(270), p.dropped());
        assert!((271..300).all(|c| p.option_of(c) == 0));
    }

    #[test]
    fn a_context_worth_less_kept_than_recomputed_is_stored_as_put_and_goes_first() {
        // A log slower than the prefill: every kept form loads slower than a recompute, and
        // quality is worth little.
        let mut options = options();
        for o in options.iter_mut().take(3) {
            o.delay_s = 0.1;
        }
        let mut p = Planner::new(PlannerConfig {
            alpha: 0.01,
            half_life_ms: 600_000,
            budget_bytes: 10_000,
            options,
            dram: DramChoice::default(),
        });
        let q = [1.0, 0.98, 0.8, 1.0];
        p.touch(&at(1, 0, 4, &q));
        assert_eq!(p.option_of(1), 0, "as put: not compressed for reads it should not serve");
        // Before any drop there is no price, but dropping it is a gain: cleaning drops it.
        assert!(p.drop_for_cleaning(1, CLEANING_DROP_MARGIN));
        assert_eq!((p.cleaning_drops(), p.stored_bytes()), (1, 0));
    }

    #[test]
    fn a_new_half_life_reorders_contexts_used_more_against_used_later() {
        // Room for one of two one-block contexts, kept raw or dropped: one used ten times, one
        // used once a minute after it.
        let mut p = planner(u64::MAX);
        let q = [1.0, f64::NEG_INFINITY, f64::NEG_INFINITY, 1.0];
        for t in 0..10 {
            p.touch(&at(1, t * 1_000, 1, &q));
        }
        p.touch(&at(2, 69_000, 1, &q));
        let fit = |mut p: Planner| {
            p.set_budget(100);
            p.rebalance();
            (0..3).filter(|&c| p.option_of(c) == 0 && p.contexts.contains_key(&c)).collect::<Vec<u64>>()
        };
        // A minute is a tenth of a 10-minute half-life: the context used ten times stays.
        assert_eq!(fit(p.clone()), vec![1]);
        // Two half-lives of 30 s: the one used a minute later is worth more.
        p.set_half_life(30_000, 69_000);
        assert_eq!(fit(p), vec![2]);
    }

    #[test]
    fn cleaning_drops_only_contexts_near_the_price_of_a_byte() {
        let mut p = planner(800);
        let q = [1.0, 0.98, 0.8, 1.0];
        // Before the greedy dropped anything there is no price to weigh a drop against.
        p.touch(&at(1, 0, 4, &q));
        assert!(!p.drop_for_cleaning(1, CLEANING_DROP_MARGIN));
        assert_eq!(p.ln_drop_price, None);
        // Ten contexts of 4 blocks used at one-minute steps, into room for two raw.
        for c in 2..12u64 {
            p.touch(&at(c, c * 60_000, 4, &q));
            p.rebalance();
        }
        // The newest kept context is far above the price; one just above it goes; a dropped
        // one, or one never seen, is not dropped again.
        let kept: Vec<u64> = (1..12).filter(|&c| p.option_of(c) != p.dropped()).collect();
        let (&newest, &oldest) = (kept.last().unwrap(), kept.first().unwrap());
        assert!(!p.drop_for_cleaning(newest, 1.0));
        assert!(p.ln_drop_price.is_some(), "the greedy dropped contexts");
        let before = p.stored_bytes();
        assert!(p.drop_for_cleaning(oldest, 1e9));
        assert_eq!(p.option_of(oldest), p.dropped());
        assert!(p.stored_bytes() < before);
        assert!(!p.drop_for_cleaning(oldest, 1e9) && !p.drop_for_cleaning(99, 1e9));
    }

    /// A planner whose options may also be held in memory, where loads take a tenth of the
    /// log's delay.
    fn tiered(budget: u64, dram_budget: u64) -> Planner {
        let options = options();
        let held = options.iter().take(options.len() - 1).map(|o| o.delay_s / 10.0).collect();
        Planner::new(PlannerConfig {
            alpha: 0.5,
            half_life_ms: 600_000,
            budget_bytes: budget,
            options,
            dram: DramChoice { budget_bytes: dram_budget, delay_s: held },
        })
    }

    /// The bytes per tier recounted from every context, as the planner should hold them.
    fn recount(p: &Planner) -> [f64; 2] {
        let mut bytes = [0.0; 2];
        for c in p.contexts.values() {
            bytes[0] += p.bytes_in(c, c.choice(), Tier::Dram);
            bytes[1] += p.bytes_in(c, c.choice(), Tier::Ssd);
        }
        bytes
    }

    #[test]
    fn memory_holds_the_hot_contexts_and_both_budgets_hold() {
        // Room in memory for one context of 8 blocks of 100 bytes; on the log for two.
        let mut p = tiered(1600, 800);
        let q = [1.0, 0.98, 0.8, 1.0];
        for t in 0..10 {
            p.touch(&at(1, t * 1000, 8, &q));
        }
        p.touch(&at(2, 10_000, 8, &q));
        assert_eq!(p.dram_bytes(), 1600, "both admitted into memory while it had no price");
        let changes = p.rebalance();
        assert!(p.dram_bytes() <= 800 && p.stored_bytes() <= 1600, "{changes:?}");
        assert_eq!(p.in_dram(1), Some(true), "the hot context stays in memory");
        assert_eq!(p.in_dram(2), Some(false), "the cold one leaves it: {changes:?}");
        assert_eq!((p.option_of(1), p.option_of(2)), (0, 0), "and both keep their form on the log");
        // Read again and again, the cold context becomes the hot one: it is held in memory
        // again (a read brings it there), and the next rebalance moves the other out.
        for t in 0..30 {
            p.touch(&at(2, 20_000 + t * 1000, 8, &q));
        }
        assert_eq!(p.in_dram(2), Some(true));
        p.rebalance();
        assert!(p.dram_bytes() <= 800);
        assert_eq!((p.in_dram(1), p.in_dram(2)), (Some(false), Some(true)));
        // Without a DRAM budget the planner decides nothing of memory.
        let mut flat = planner(1600);
        flat.touch(&at(1, 0, 8, &q));
        assert_eq!((flat.in_dram(1), flat.dram_bytes()), (None, 0));
    }

    #[test]
    fn every_sequence_keeps_the_counts_the_budgets_and_lossy_forms_final() {
        let mut rng = kvhoard_kernels::rng::Rng::new(11);
        for case in 0..100 {
            let mut p = tiered(2000 + rng.below(4000), rng.below(2000));
            for step in 0..200u64 {
                let id = rng.below(12);
                let quality = [1.0, 0.95 + f64::from(rng.uniform()) * 0.04, 0.7 + f64::from(rng.uniform()) * 0.2, 1.0];
                match rng.below(12) {
                    0 => p.touch(&at(id, step * 500, p.blocks_of(id) + 1 + rng.below(4), &quality)),
                    1 => p.forget(id),
                    2 => p.set_ratio(1 + rng.below(2) as usize, 0.2 + f64::from(rng.uniform()) * 0.5),
                    3 => p.set_quality(id, &quality),
                    4 => {
                        let dropped = p.drop_for_cleaning(id, [1.0, CLEANING_DROP_MARGIN, 1e9][rng.below(3) as usize]);
                        assert!(!dropped || p.option_of(id) == p.dropped(), "case {case}: dropped but kept");
                    }
                    5 => p.set_half_life(1_000 + rng.below(600_000), step * 500),
                    _ => p.touch(&at(id, step * 500, 1 + rng.below(10), &quality)),
                }
                let before: HashMap<u64, (usize, bool)> =
                    p.contexts.iter().map(|(id, c)| (*id, (c.option, c.dram))).collect();
                for change in p.rebalance() {
                    let (was, _) = before[&change.context];
                    let lossy = p.config.options[was].lossy;
                    assert!(
                        !lossy || change.option == was || change.option == p.dropped(),
                        "case {case}: a lossy form {was} became {}",
                        change.option
                    );
                }
                let [dram, ssd] = recount(&p);
                assert!(
                    (dram - p.bytes[0]).abs() < 1e-6 && (ssd - p.bytes[1]).abs() < 1e-6,
                    "case {case}: counts drift"
                );
                assert!(p.stored_bytes() <= p.config.budget_bytes, "case {case} step {step}: over the log's budget");
                assert!(p.dram_bytes() <= p.config.dram.budget_bytes, "case {case} step {step}: over memory's budget");
                assert!(p.contexts.values().all(|c| !c.dram || c.option != p.dropped()), "a dropped context in memory");
            }
        }
    }

    /// Total utility (at current frequencies) of the best choice per context within both
    /// budgets, by brute force.
    fn brute_force_tiered(p: &Planner, ids: &[u64]) -> f64 {
        let choices: Vec<Choice> = p.choices().collect();
        let n = choices.len();
        let mut best = f64::NEG_INFINITY;
        for code in 0..n.pow(ids.len() as u32) {
            let mut rest = code;
            let (mut u, mut dram, mut ssd) = (0.0, 0.0, 0.0);
            for id in ids {
                let c = &p.contexts[id];
                let k = choices[rest % n];
                rest /= n;
                u += p.utility_of(c, k) * c.blocks as f64 * c.ln_freq.exp();
                dram += p.bytes_in(c, k, Tier::Dram);
                ssd += p.bytes_in(c, k, Tier::Ssd);
            }
            if ssd <= p.config.budget_bytes as f64 && dram <= p.config.dram.budget_bytes as f64 {
                best = best.max(u);
            }
        }
        best
    }

    #[test]
    fn the_tiered_greedy_lands_near_the_optimum() {
        let mut rng = kvhoard_kernels::rng::Rng::new(5);
        for case in 0..200 {
            let contexts = 2 + case % 3;
            // Memory is a choice from the start: contexts are admitted into it.
            let mut p = tiered(0, u64::MAX);
            let raw_total = random_contexts(&mut p, &mut rng, contexts as u64);
            p.config.budget_bytes = rng.below(raw_total + 1);
            p.set_dram_budget(1 + rng.below(raw_total / 2 + 1));
            let ids: Vec<u64> = (0..contexts as u64).collect();
            let optimum = brute_force_tiered(&p, &ids);
            assert!(p.dram_bytes() > 0, "case {case}: nothing was admitted into memory");
            p.rebalance();
            assert!(p.stored_bytes() <= p.config.budget_bytes && p.dram_bytes() <= p.config.dram.budget_bytes);
            let got: f64 =
                p.contexts.values().map(|c| p.utility_of(c, c.choice()) * c.blocks as f64 * c.ln_freq.exp()).sum();
            // Within the utility of the largest single change of any context, as with one tier.
            let step = p
                .contexts
                .values()
                .map(|c| {
                    let best = p.choices().map(|k| p.utility_of(c, k)).fold(f64::NEG_INFINITY, f64::max);
                    let worst = p.choices().map(|k| p.utility_of(c, k)).fold(f64::INFINITY, f64::min);
                    (best - worst) * c.blocks as f64 * c.ln_freq.exp()
                })
                .fold(0.0, f64::max);
            assert!(got + step + 1e-9 >= optimum, "case {case}: {got} vs optimum {optimum} (step {step})");
        }
    }
}
