//! The planner applied by the engine: a [`Placement`] that keeps a [`Planner`] of the volume's
//! contexts and carries out its decisions where the engine writes anyway.
//!
//! - **Accesses.** A put or a get of a context's block is an access of the context; the planner
//!   counts accesses within a second of a use's first as that use (`super::reuse`), so the
//!   blocks of a batch, or a lookup and the put after it, are one use. A put under a key
//!   that named no block adds a block to its context (a dropped context starts again from
//!   none). A put whose bytes were already stored (a link) adds nothing. Blocks that reclaim
//!   drops whole with a segment, when cleaning falls behind, stay counted until their context is
//!   dropped.
//! - **Drops.** A context the planner drops (its greedy, or cleaning's drop) is dropped at once.
//!   The store tells placement of every record it writes ([`Placement::located`]: a put's block
//!   or link, a rename's link, cleaning's copy, a tombstone), so the planner knows, for each key
//!   written since the store opened, which context its newest record names and where it is.
//!   The keys a dropped context holds are handed to the store with their records
//!   ([`Placement::take_drops`]) after the write or before the cleaning that dropped it (a drop
//!   at a read waits for the next of these). The store removes each whose index entry is still
//!   that record, pinned keys excepted, so they read as misses and their records are dead space
//!   that cleaning's choice of victims sees, as the simulator assumes; a key written again
//!   since keeps its new record. Left on the log, they would look live to the cleaner until it reached
//!   them: on a trace whose contexts all come back, that kept the volume full and cleaning
//!   copied a segment to free a sliver of one (docs/benchmarks.md). Keys the planner never saw
//!   put (before a restart) are dropped as cleaning reaches them.
//! - **Admission.** A put that names no codec is stored with the codec of its context's option
//!   (for a new or dropped context, the option admission gives it at the current price of a
//!   byte), asked once per batch whose blocks are one context (a batch with a group, or one
//!   block); other batches take the namespace's codec.
//! - **Cleaning.** A cleaner emptying a segment keeps each live block as its context's option
//!   says: as it is, recompressed with that option's codec, or dropped. Placement therefore
//!   never rewrites a block the cleaner would not have read anyway: a context whose option
//!   changes reaches its new form segment by segment, as cleaning comes to its blocks. Before
//!   a block is kept, a context the greedy would drop next (or whose drop is a gain) is dropped
//!   instead ([`Planner::drop_for_cleaning`]), so that cleaning does not copy it.
//! - **Quality.** Each option's quality for a context is the profile a client set for it
//!   ([`Planned::set_profile`]), else the configuration's estimate for the codec.
//! - **Delays.** With a [`LoadModel`], each kept option's delay follows the load speeds the store
//!   measures (the log's reads, the DRAM tier's share, each codec's decoding), checked with the
//!   ratios; see [`super::load_model`].
//!
//! What the planner knows lives in memory (about 150 bytes per context: the context, its
//! profile when one is set, and its place in the heap; and about 60 bytes per key written, for
//! its newest record and its context's list of keys; a key deleted or reclaimed is forgotten,
//! one that expires is not until its context is dropped), at most [`MAX_CONTEXTS`] of them: past
//! that, dropped contexts are forgotten. After a restart it knows no context until one is used
//! again, and counts only the blocks it sees put or read; a cleaner meets blocks of contexts it
//! does not know (or forgot) and keeps them as [`Lru`] does (those read since their write).
//! Victims are chosen by cost-benefit. Where the configuration makes the DRAM tier a choice
//! ([`super::planner::DramChoice`]), a block of a context the planner holds in memory enters the
//! DRAM tier when it is put or read, and one of a context it keeps on the log alone does not; a
//! context moved out of memory leaves the tier as the tier's own LRU order evicts its copies
//! (nothing walks the tier to remove them). Otherwise, and for contexts it does not know, the
//! DRAM tier holds what is put and read, as with [`Lru`].
//!
//! Work: an access costs O(options + log contexts) plus, at a put over budget, the steps the
//! rebalance takes. Every [`RATIO_CHECK_EVERY`] puts, maintenance (ratios, delays, forgetting) may rescore
//! every context, O(contexts): it runs where a put asks for its codec or a cleaner for a
//! block's fate, never under the log lock.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvhoard_kernels::CodecSpec;

use super::load_model::{LoadModel, SPEED_MIN_LOADS};
use super::planner::{Change, ContextUse, Planner, PlannerConfig, CLEANING_DROP_MARGIN};
use super::{BlockInfo, Keep, LiveBlock, Lru, OptionView, Placement, PlacementReport, PlanView, PutPlan, SegmentView};
use crate::clock::Clock;
use crate::error::{Result, StoreError};
use crate::index::KeyId;
use crate::log::Loc;
use crate::tier::{LoadSpeeds, SpeedTotals};

/// A planned volume's options: the planner's configuration and the codec of each option.
#[derive(Debug, Clone, PartialEq)]
pub struct PlannedConfig {
    /// What the planner weighs; its last option is "dropped".
    pub planner: PlannerConfig,
    /// The codec of each option but the last (`None`: the block as it was put).
    pub codecs: Vec<Option<CodecSpec>>,
    /// The quality of each option for a context no profile was set for (1 for lossless ones).
    pub quality: Vec<f64>,
    /// What the options' delays are made of, so that they follow the store's measured speeds
    /// (its default keeps them as given).
    pub loads: LoadModel,
}

#[derive(Debug)]
struct State {
    planner: Planner,
    /// Quality profiles clients set, per context.
    profiles: HashMap<u64, Vec<f64>>,
    /// Per key written since the store opened: the context its latest record names, and where
    /// that record is (a key put again, linked, renamed to or relocated moves; one deleted or
    /// reclaimed goes).
    records: HashMap<KeyId, (u64, Loc)>,
    /// Per context: the keys it holds.
    members: HashMap<u64, Members>,
    /// Keys of contexts dropped, with the record each was dropped at, for the store to remove
    /// ([`Placement::take_drops`]).
    doomed: Vec<(KeyId, Loc)>,
    /// Time spent deciding.
    cpu: Duration,
    /// Per option, since its ratio was last set: (record bytes, raw bytes, blocks) of the puts
    /// stored in its form.
    observed: Vec<(u64, u64, u64)>,
    /// Puts since the ratios were last compared with what was stored.
    puts_since_check: u64,
    /// The load speeds of the store open over this placement, and their totals when the delays
    /// last followed them.
    speeds: Option<(Arc<LoadSpeeds>, SpeedTotals)>,
    /// Per kept option: seconds to decode a block, as last measured (at first, as configured).
    decode_s: Vec<f64>,
}

/// Puts between two comparisons of the options' ratios with the records stored.
const RATIO_CHECK_EVERY: u64 = 1024;
/// Blocks of an option's form a comparison needs.
const RATIO_MIN_BLOCKS: u64 = 32;
/// Relative difference from which an option's ratio is replaced by the one measured.
const RATIO_TOLERANCE: f64 = 0.05;
/// Contexts kept before dropped ones are forgotten (about 150 MB of planner state).
pub const MAX_CONTEXTS: usize = 1 << 20;

/// See the module documentation.
#[derive(Debug)]
pub struct Planned {
    state: Mutex<State>,
    codecs: Vec<Option<CodecSpec>>,
    quality: Vec<f64>,
    loads: LoadModel,
    /// Per kept option: seconds to copy a block held in memory (its DRAM delay but decoding).
    copy_s: Vec<f64>,
    lru: Lru,
    clock: Clock,
}

impl Planned {
    /// A planned placement reading time from `clock` (the store's). Refuses a configuration
    /// whose codecs and qualities do not match its options, or whose last option is not
    /// "dropped" (ratio 0).
    pub fn new(config: PlannedConfig, clock: Clock) -> Result<Planned> {
        let options = &config.planner.options;
        let last_dropped = options.last().is_some_and(|o| o.ratio == 0.0);
        let kept_fit =
            options.iter().rev().skip(1).all(|o| o.ratio.is_finite() && o.ratio > 0.0 && o.delay_s.is_finite());
        if options.len() < 2 || !last_dropped || !kept_fit {
            return Err(StoreError::invalid(
                "planner",
                "its options must be ways of keeping blocks (ratio above 0, finite delays), then \"dropped\" (ratio 0)",
            ));
        }
        if config.codecs.len() + 1 != options.len() || config.quality.len() != options.len() {
            return Err(StoreError::invalid(
                "planner",
                format!(
                    "{} options need {} codecs and {} qualities; got {} and {}",
                    options.len(),
                    options.len() - 1,
                    options.len(),
                    config.codecs.len(),
                    config.quality.len()
                ),
            ));
        }
        if let Some(why) = config.loads.misfit(config.codecs.len()) {
            return Err(StoreError::invalid("planner", why));
        }
        let decode_s = match config.loads.block_bytes {
            0 => vec![0.0; config.codecs.len()],
            _ => config.loads.decode_s.clone(),
        };
        let dram = &config.planner.dram;
        let dram_fits = dram.delay_s.iter().all(|d| d.is_finite() && *d >= 0.0)
            && (dram.delay_s.is_empty() || dram.delay_s.len() == config.codecs.len());
        if !dram_fits {
            return Err(StoreError::invalid(
                "planner",
                format!(
                    "the DRAM tier's delays must be {} seconds, 0 or more, one per kept option",
                    config.codecs.len()
                ),
            ));
        }
        // Loading a block held in memory: copying it (configured), then decoding it (measured).
        let copy_s = dram.delay_s.iter().zip(&decode_s).map(|(d, decode)| (d - decode).max(0.0)).collect();
        let state = State {
            planner: Planner::new(config.planner),
            profiles: HashMap::new(),
            records: HashMap::new(),
            members: HashMap::new(),
            doomed: Vec::new(),
            cpu: Duration::ZERO,
            observed: vec![(0, 0, 0); config.codecs.len()],
            puts_since_check: 0,
            speeds: None,
            decode_s,
        };
        Ok(Planned {
            state: Mutex::new(state),
            codecs: config.codecs,
            quality: config.quality,
            loads: config.loads,
            copy_s,
            lru: Lru::new(clock.clone()),
            clock,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Sets the quality each option keeps for `context` (one per option, the last, "dropped",
    /// included): what the client measured, or knows of the context's sensitivity.
    pub fn set_profile(&self, context: u64, quality: Vec<f64>) {
        self.lock().profiles.insert(context, quality);
    }

    /// A client observed `observed` quality (0 to 1) from `context`'s blocks as they are kept now.
    /// When it is more than `drift` (a fraction, e.g. 0.05) below what the planner assumed for
    /// that form, the context's quality for that form and every harder one is lowered by the same
    /// factor and its steps are scored again: the next rebalance may drop it, or stop compressing
    /// it further. A lossy copy is never made better: a context that needs more quality than its
    /// stored form has is recomputed by the client (it is treated as dropped). Returns whether the
    /// context was scored again.
    fn rescore(&self, context: u64, observed: f64, drift: f64) -> bool {
        let mut state = self.lock();
        let assumed = state.planner.quality_of(context);
        if !(observed.is_finite() && observed < assumed * (1.0 - drift.clamp(0.0, 1.0))) {
            return false;
        }
        let option = state.planner.option_of(context);
        let factor = (observed / assumed).clamp(0.0, 1.0);
        let dropped = state.planner.dropped();
        // From what the planner scores now: options closed to the context stay closed.
        let mut quality = match state.planner.qualities(context) {
            Some(q) => q.to_vec(),
            None => return false,
        };
        for (k, q) in quality.iter_mut().enumerate() {
            if k >= option && k < dropped {
                *q *= factor;
            }
        }
        state.planner.set_quality(context, &quality);
        state.profiles.insert(context, quality);
        true
    }

    /// The option `context`'s blocks are kept with (index into the configuration's options).
    pub fn option_of(&self, context: u64) -> usize {
        self.lock().planner.option_of(context)
    }

    /// The quality of each option for `block`'s context: its profile, or the configuration's
    /// estimates; -inf (never chosen) for a lossy option where its namespace denies lossy codecs,
    /// and for a codec its namespace does not list among its allowed ones.
    fn quality_of(&self, state: &State, block: &BlockInfo<'_>) -> Vec<f64> {
        let quality = state.profiles.get(&block.context).unwrap_or(&self.quality);
        let options = &state.planner.config().options;
        let policy = block.policy;
        let codec = |k: usize| self.codecs.get(k).copied().flatten();
        quality
            .iter()
            .zip(options)
            .enumerate()
            .map(|(k, (q, o))| {
                let denied = o.lossy && !policy.lossy;
                let unlisted = k < self.codecs.len() && !policy.settings.allows(codec(k).as_ref());
                if denied || unlisted {
                    f64::NEG_INFINITY
                } else {
                    *q
                }
            })
            .collect()
    }

    /// Sets the bytes the kept blocks may take: most of the volume (the rest is the cleaner's
    /// room), known once the volume is open.
    pub fn set_budget(&self, budget_bytes: u64) {
        self.lock().planner.set_budget(budget_bytes);
    }

    /// Sets the bytes the DRAM tier's copies may take, for a planner whose configuration makes
    /// the DRAM tier a choice (the tier's size, known once the volume is open).
    pub fn set_dram_budget(&self, budget_bytes: u64) {
        self.lock().planner.set_dram_budget(budget_bytes);
    }

    /// Records an access of `block`'s context (`added` blocks put by it) and, for a `put`, the
    /// form its record takes, and rebalances when the kept bytes exceed the budget.
    fn access(&self, block: &BlockInfo<'_>, added: u64, put: bool) {
        let started = Instant::now();
        let now = self.clock.now_unix_ms();
        let mut state = self.lock();
        let state = &mut *state;
        // A dropped context's blocks are gone: it starts again from what is put now. Every
        // block of a batch is an access; the planner counts those within a second of a use's
        // first as that use.
        let dropped = state.planner.dropped();
        let kept =
            if state.planner.option_of(block.context) == dropped { 0 } else { state.planner.blocks_of(block.context) };
        let blocks = kept + added;
        let quality = self.quality_of(state, block);
        state.planner.touch(&ContextUse {
            context: block.context,
            now_ms: now,
            blocks: blocks.max(1),
            raw_bytes: block.raw_bytes,
            quality: &quality,
            alpha: block.policy.settings.alpha,
        });
        if put {
            self.observe(state, block);
            if state.planner.over_budget() {
                let changes = state.planner.rebalance();
                state.doom(&changes);
            }
        }
        state.cpu += started.elapsed();
    }
}

impl State {
    /// Hands the keys of every context `changes` left dropped to the store (`take_drops`).
    fn doom(&mut self, changes: &[Change]) {
        let dropped = self.planner.dropped();
        for change in changes.iter().filter(|c| c.option == dropped) {
            self.doom_context(change.context);
        }
    }

    /// Hands the keys `context` holds, with their records, to the store if the planner has it
    /// dropped.
    fn doom_context(&mut self, context: u64) {
        if self.planner.option_of(context) != self.planner.dropped() {
            return;
        }
        for key in self.members.remove(&context).map(|m| m.keys).unwrap_or_default() {
            if let Some(&(_, record)) = self.records.get(&key).filter(|(owner, _)| *owner == context) {
                self.records.remove(&key);
                self.doomed.push((key, record));
            }
        }
    }

    /// A record naming `key` for `context` is at `record` (`None`: the key was deleted).
    fn locate(&mut self, key: KeyId, context: u64, record: Option<Loc>) {
        let Some(record) = record else {
            self.records.remove(&key);
            return;
        };
        if self.records.insert(key, (context, record)).is_some_and(|(owner, _)| owner == context) {
            return;
        }
        let members = self.members.entry(context).or_default();
        members.keys.push(key);
        // Keys that moved to other contexts or went stay listed until the list has doubled since
        // it was last compacted: compacting then keeps each key it holds once, so a list stays
        // within twice what its context holds, at O(1) a put amortized.
        if members.keys.len() > 2 * members.compacted + 64 {
            let records = &self.records;
            members.keys.sort_unstable();
            members.keys.dedup();
            members.keys.retain(|k| records.get(k).is_some_and(|(owner, _)| *owner == context));
            members.compacted = members.keys.len();
        }
    }
}

/// The keys a context holds, as placement was told of them ([`State::locate`]).
#[derive(Debug, Default)]
struct Members {
    /// Its keys; some may have moved to another context or gone since (checked against
    /// `State::records`), some be listed twice.
    keys: Vec<KeyId>,
    /// How many it held when it was last compacted.
    compacted: usize,
}

impl Planned {
    /// Counts what a put's record takes in its form.
    fn observe(&self, state: &mut State, block: &BlockInfo<'_>) {
        let Some(option) = self.codecs.iter().position(|c| *c == block.codec) else { return };
        if let Some(o) = state.observed.get_mut(option) {
            *o = (o.0 + block.record_bytes, o.1 + block.raw_bytes, o.2 + 1);
        }
        state.puts_since_check += 1;
    }

    /// Every [`RATIO_CHECK_EVERY`] puts: replaces an option's ratio that is off by more than
    /// [`RATIO_TOLERANCE`] by the one measured, so that the planner's byte count follows what the
    /// volume holds, lets the delays follow the store's load speeds, and past [`MAX_CONTEXTS`]
    /// forgets the dropped contexts. Each rescores every context, O(contexts).
    fn maintain(&self) {
        let started = Instant::now();
        let mut state = self.lock();
        let state = &mut *state;
        if state.puts_since_check < RATIO_CHECK_EVERY {
            return;
        }
        state.puts_since_check = 0;
        if state.planner.contexts() > MAX_CONTEXTS {
            for context in state.planner.forget_dropped() {
                state.profiles.remove(&context);
                state.members.remove(&context);
            }
        }
        for (k, o) in state.observed.iter_mut().enumerate() {
            let (record, raw, blocks) = *o;
            if blocks < RATIO_MIN_BLOCKS || raw == 0 {
                continue;
            }
            let measured = record as f64 / raw as f64;
            let assumed = state.planner.config().options.get(k).map_or(0.0, |o| o.ratio);
            if assumed > 0.0 && (measured / assumed - 1.0).abs() > RATIO_TOLERANCE {
                tracing::debug!(option = k, assumed, measured, "planner: an option's ratio follows what was stored");
                state.planner.set_ratio(k, measured);
            }
            *o = (0, 0, 0);
        }
        self.follow_speeds(state);
        state.cpu += started.elapsed();
    }

    /// The options' delays follow the store's load speeds since they last did
    /// ([`LoadModel::follow`]); a window with too few loads is left to grow.
    fn follow_speeds(&self, state: &mut State) {
        let Some((speeds, seen)) = &state.speeds else { return };
        let now = speeds.totals();
        let window = now.since(seen);
        if window.log.blocks < SPEED_MIN_LOADS {
            return;
        }
        let changed =
            self.loads.follow(&window, state.planner.config(), &self.codecs, &mut state.decode_s, &self.copy_s);
        if !changed.is_empty() {
            tracing::debug!(?changed, "planner: load delays follow the speeds measured");
            state.planner.set_delays(&changed);
        }
        if let Some((_, seen)) = state.speeds.as_mut() {
            *seen = now;
        }
    }
}

impl Placement for Planned {
    fn on_put(&self, block: &BlockInfo<'_>) -> PutPlan {
        self.access(block, u64::from(block.new_key), true);
        match self.lock().planner.in_dram(block.context) {
            Some(dram) => PutPlan { dram },
            None => self.lru.on_put(block),
        }
    }

    fn on_load(&self, block: &BlockInfo<'_>) -> bool {
        // Asked before the hit is told (`on_hit`): a read that will bring the context into memory
        // keeps the block it read.
        let planned = self.lock().planner.holds_when_used(block.context);
        planned.unwrap_or_else(|| self.lru.on_load(block))
    }

    fn on_hit(&self, block: &BlockInfo<'_>) {
        self.access(block, 0, false);
        // A hit may be answered on a network thread: only the DRAM tier's steps, which a read
        // that brought a context into memory may need (a few, O(log contexts) each); the log's
        // are left to puts and cleaning.
        let started = Instant::now();
        let mut state = self.lock();
        if state.planner.over_budget() {
            let changes = state.planner.rebalance_memory();
            state.doom(&changes);
        }
        state.cpu += started.elapsed();
    }

    fn holds(&self, context: u64) -> Option<bool> {
        self.lock().planner.in_dram(context)
    }

    fn located(&self, key: KeyId, context: u64, record: Option<Loc>) {
        self.lock().locate(key, context, record);
    }

    fn take_drops(&self) -> Vec<(KeyId, Loc)> {
        std::mem::take(&mut self.lock().doomed)
    }

    fn dropped(&self, keys: &[KeyId]) {
        let mut state = self.lock();
        for key in keys {
            state.records.remove(key);
        }
        // A drop still waiting for the store is of a record in the segment just freed: a later
        // record of the key could take the same place, and must not go for it.
        if !state.doomed.is_empty() {
            let gone: std::collections::HashSet<&KeyId> = keys.iter().collect();
            state.doomed.retain(|(key, _)| !gone.contains(key));
        }
    }

    fn report_quality(&self, context: u64, observed: f64, drift: f64) -> bool {
        self.rescore(context, observed, drift)
    }

    fn codec_at_put(&self, block: &BlockInfo<'_>) -> Option<CodecSpec> {
        self.maintain();
        let now = self.clock.now_unix_ms();
        let state = self.lock();
        let quality = self.quality_of(&state, block);
        let blocks = state.planner.blocks_of(block.context).max(1);
        let option = state.planner.option_for_put(&ContextUse {
            context: block.context,
            now_ms: now,
            blocks,
            raw_bytes: block.raw_bytes,
            quality: &quality,
            alpha: block.policy.settings.alpha,
        });
        self.codecs.get(option).copied().flatten()
    }

    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        self.lru.victim(candidates)
    }

    fn plan_view(&self, limit: usize) -> Option<PlanView> {
        let now = self.clock.now_unix_ms();
        let state = self.lock();
        let config = state.planner.config();
        let dropped = state.planner.dropped();
        let options = config
            .options
            .iter()
            .enumerate()
            .map(|(k, o)| OptionView {
                name: match self.codecs.get(k) {
                    _ if k == dropped => "dropped".into(),
                    Some(Some(spec)) => spec.to_string(),
                    _ => "as put".into(),
                },
                ratio: o.ratio,
                delay_s: o.delay_s,
                dram_delay_s: config.dram.delay_s.get(k).copied().filter(|_| state.planner.dram_choice()),
            })
            .collect();
        let (contexts, next_steps) = state.planner.view(now, limit);
        drop(state);
        Some(PlanView { options, report: self.report(), contexts, next_steps })
    }

    fn report(&self) -> PlacementReport {
        let state = self.lock();
        PlacementReport {
            policy: "planner".into(),
            contexts: state.planner.contexts() as u64,
            planned_bytes: state.planner.stored_bytes(),
            budget_bytes: state.planner.config().budget_bytes,
            dram_planned_bytes: state.planner.dram_bytes(),
            dram_budget_bytes: if state.planner.dram_choice() { state.planner.config().dram.budget_bytes } else { 0 },
            cpu_s: state.cpu.as_secs_f64(),
            half_life_ms: state.planner.half_life_ms(),
            cleaning_drops: state.planner.cleaning_drops(),
        }
    }

    fn cleans(&self) -> bool {
        true
    }

    fn measure_with(&self, speeds: Arc<LoadSpeeds>) {
        let seen = speeds.totals();
        self.lock().speeds = Some((speeds, seen));
    }

    fn keep(&self, block: &LiveBlock<'_>) -> Keep {
        self.maintain();
        let started = Instant::now();
        let mut guard = self.lock();
        let state = &mut *guard;
        if state.planner.over_budget() {
            let changes = state.planner.rebalance();
            state.doom(&changes);
        }
        let known = state.planner.qualities(block.context).is_some();
        // A context the greedy would drop soon is dropped now rather than copied.
        if known && state.planner.drop_for_cleaning(block.context, CLEANING_DROP_MARGIN) {
            state.doom_context(block.context);
        }
        let option = state.planner.option_of(block.context);
        state.cpu += started.elapsed();
        drop(guard);
        if !known {
            return self.lru.keep(block);
        }
        match self.codecs.get(option) {
            None => Keep::Drop,
            Some(None) => Keep::Relocate,
            Some(Some(spec)) => Keep::Recompress(*spec),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use super::*;
    use crate::placement::planner::{DramChoice, StoreOption};
    use crate::policy::{NsSettings, Policy};

    const NO_SETTINGS: NsSettings = NsSettings { alpha: None, codecs: None, drift: None, ttl: None };
    static LOSSY: Policy = Policy { codec: None, lossy: true, settings: NO_SETTINGS };
    static STRICT: Policy = Policy { codec: None, lossy: false, settings: NO_SETTINGS };

    fn planned(budget: u64) -> (Planned, Arc<AtomicU64>) {
        let q8 = CodecSpec::quant(8, 32, 0);
        let config = PlannedConfig {
            planner: PlannerConfig {
                alpha: 0.5,
                half_life_ms: 600_000,
                budget_bytes: budget,
                options: vec![
                    StoreOption { ratio: 1.0, delay_s: 0.011, lossy: false },
                    StoreOption { ratio: 0.5, delay_s: 0.008, lossy: true },
                    StoreOption { ratio: 0.0, delay_s: 0.1, lossy: false },
                ],
                dram: DramChoice::default(),
            },
            codecs: vec![None, Some(q8)],
            quality: vec![1.0, 0.98, 1.0],
            loads: LoadModel { block_bytes: 100, decode_s: vec![0.0, 0.001] },
        };
        let now = Arc::new(AtomicU64::new(1_000));
        (Planned::new(config, Clock::manual(Arc::clone(&now))).unwrap(), now)
    }

    fn info(context: u64) -> BlockInfo<'static> {
        BlockInfo {
            namespace: "n",
            raw_bytes: 100,
            record_bytes: 4096,
            group: Some(context),
            context,
            new_key: true,
            policy: &LOSSY,
            codec: None,
        }
    }

    fn live(context: u64, reads: u8) -> LiveBlock<'static> {
        LiveBlock {
            namespace: "n",
            raw_bytes: 100,
            record_bytes: 4096,
            group: Some(context),
            context,
            policy: &LOSSY,
            reads,
            age_ms: 0,
        }
    }

    #[test]
    fn a_batch_is_one_access_and_cold_contexts_give_way_first() {
        let (p, now) = planned(1_200);
        // Context 1: 8 blocks put in one batch, then read at ten other times; context 2: 8 blocks.
        for _ in 0..8 {
            p.on_put(&info(1));
        }
        for t in 1..=10 {
            now.store(1_000 + t * 1_000, Ordering::Relaxed);
            p.on_hit(&info(1));
        }
        now.store(20_000, Ordering::Relaxed);
        for _ in 0..8 {
            p.on_put(&info(2));
        }
        let stats = p.report();
        assert_eq!(stats.contexts, 2);
        assert!(stats.planned_bytes <= 1_200, "rebalanced at the put that went over: {stats:?}");
        assert_eq!(p.keep(&live(1, 0)), Keep::Relocate, "the hot context stays as it is");
        assert_ne!(p.keep(&live(2, 0)), Keep::Relocate, "the cold one is compressed or dropped");
        // A context it never saw (a restart) is kept as LRU keeps it.
        assert_eq!(p.keep(&live(9, 0)), Keep::Drop);
        assert_eq!(p.keep(&live(9, 2)), Keep::Relocate);
    }

    fn at(unit: u32) -> Loc {
        Loc { segment: 1, unit }
    }

    /// A put of block `i` of `context`, told as the store tells it: the put, then its record.
    fn put(p: &Planned, context: u64, i: u32, new_key: bool) {
        p.on_put(&BlockInfo { new_key, ..info(context) });
        p.located(key(context, i), context, Some(at(context as u32 * 100 + i)));
    }

    /// A newer, hotter context of 8 blocks (2), put once and twice again a second apart: it takes
    /// the room of what was there.
    fn crowd_out(p: &Planned, now: &AtomicU64) {
        for t in 1..=3 {
            now.store(1_000 + t * 1_000, Ordering::Relaxed);
            for i in 0..8 {
                put(p, 2, i, t == 1);
            }
        }
    }

    fn key(context: u64, i: u32) -> KeyId {
        KeyId::new("n", &format!("{context}-{i}"))
    }

    #[test]
    fn a_dropped_context_hands_its_keys_and_their_records_to_the_store_once() {
        // Room for one context of 8 blocks quantized.
        let (p, now) = planned(400);
        for i in 0..8 {
            put(&p, 1, i, true);
        }
        assert_eq!(p.option_of(1), 1, "quantized to fit");
        assert!(p.take_drops().is_empty(), "nothing dropped yet");
        // A newer, hotter context of 8 blocks takes the room: context 1 is dropped, and every
        // key it holds goes to the store with its record, once.
        crowd_out(&p, &now);
        assert_eq!(p.option_of(1), 2, "dropped");
        let mut dropped = p.take_drops();
        dropped.sort();
        let mut want: Vec<(KeyId, Loc)> = (0..8).map(|i| (key(1, i), at(100 + i))).collect();
        want.sort();
        assert_eq!(dropped, want);
        assert!(p.take_drops().is_empty(), "handed over once");
        assert_eq!(p.option_of(2), 1, "the hot context is kept");
    }

    #[test]
    fn a_waiting_drop_of_a_key_reclaim_dropped_is_forgotten() {
        let (p, now) = planned(400);
        for i in 0..8 {
            put(&p, 1, i, true);
        }
        crowd_out(&p, &now);
        assert_eq!(p.option_of(1), 2, "dropped");
        // Reclaim frees the segment of 1-0 and 1-1 before the store takes the drops: a later
        // record of either at the same place must not go for them.
        p.dropped(&[key(1, 0), key(1, 1)]);
        let dropped = p.take_drops();
        assert_eq!(dropped.len(), 6);
        assert!(!dropped.iter().any(|(k, _)| *k == key(1, 0) || *k == key(1, 1)));
    }

    #[test]
    fn a_drop_is_of_the_records_the_context_holds_now() {
        let (p, now) = planned(400);
        for i in 0..8 {
            put(&p, 1, i, true);
        }
        // 1-0 is put again for context 3 (a link, or other bytes); 1-1 is relocated by cleaning;
        // 1-2 is deleted.
        p.located(key(1, 0), 3, Some(at(900)));
        p.located(key(1, 1), 1, Some(at(901)));
        p.located(key(1, 2), 1, None);
        crowd_out(&p, &now);
        assert_eq!(p.option_of(1), 2, "dropped");
        let mut dropped = p.take_drops();
        dropped.sort();
        let mut want: Vec<(KeyId, Loc)> =
            [(key(1, 1), at(901))].into_iter().chain((3..8).map(|i| (key(1, i), at(100 + i)))).collect();
        want.sort();
        assert_eq!(dropped, want, "not 1-0 (context 3's now), 1-1 where it is now, not 1-2 (gone)");
        // A key that moves back and forth between two contexts a thousand times is listed a
        // bounded number of times in either: twice what they hold (one key), plus 64.
        for n in 0..1_000u32 {
            p.located(key(7, 0), 7 + u64::from(n % 2), Some(at(n)));
        }
        let state = p.lock();
        for context in [7, 8] {
            let listed = state.members.get(&context).map_or(0, |m| m.keys.len());
            assert!(listed <= 2 + 64 + 1, "context {context} lists its one key {listed} times");
        }
    }

    #[test]
    fn the_planner_counts_bytes_as_the_records_take_them() {
        // Raw records take 1.25 their blocks' bytes (a header unit on small blocks): after
        // enough puts the planner counts them so, and fits its budget by what is really stored.
        let (p, now) = planned(u64::MAX);
        for c in 0..(RATIO_CHECK_EVERY / 4) {
            now.store(1_000 + c, Ordering::Relaxed);
            for _ in 0..4 {
                p.on_put(&BlockInfo { record_bytes: 125, ..info(c) });
            }
        }
        // Maintenance runs where a put asks for its codec (or a cleaner for a block's fate).
        assert_eq!(p.report().planned_bytes, RATIO_CHECK_EVERY * 100);
        p.codec_at_put(&info(0));
        let r = p.report();
        assert_eq!(r.planned_bytes, RATIO_CHECK_EVERY * 125, "{r:?}");
        let view = p.plan_view(3).unwrap();
        assert_eq!(
            view.options.iter().map(|o| o.name.as_str()).collect::<Vec<_>>(),
            ["as put", "quant:bits=8,group=32,residual=0", "dropped"]
        );
        assert_eq!(view.contexts.len(), 3);
        assert!(view.contexts.windows(2).all(|w| w[0].freq >= w[1].freq), "most used first");
        assert!(view.next_steps.windows(2).all(|w| w[0].loss_per_byte <= w[1].loss_per_byte), "cheapest first");
    }

    #[test]
    fn a_configuration_that_does_not_fit_its_options_is_refused() {
        let base = || PlannedConfig {
            planner: PlannerConfig {
                alpha: 0.5,
                half_life_ms: 1,
                budget_bytes: 1,
                options: vec![
                    StoreOption { ratio: 1.0, delay_s: 0.01, lossy: false },
                    StoreOption { ratio: 0.0, delay_s: 0.1, lossy: false },
                ],
                dram: DramChoice::default(),
            },
            codecs: vec![None],
            quality: vec![1.0, 1.0],
            loads: LoadModel::default(),
        };
        assert!(Planned::new(base(), Clock::default()).is_ok());
        let mut c = base();
        c.codecs.push(None);
        assert!(Planned::new(c, Clock::default()).is_err(), "a codec too many");
        let mut c = base();
        c.quality.pop();
        assert!(Planned::new(c, Clock::default()).is_err(), "a quality missing");
        let mut c = base();
        c.planner.options.pop();
        assert!(Planned::new(c, Clock::default()).is_err(), "no dropped option");
        let mut c = base();
        c.planner.options[0].ratio = f64::NAN;
        assert!(Planned::new(c, Clock::default()).is_err(), "a ratio that is not a number");
        let mut c = base();
        c.loads = LoadModel { block_bytes: 1 << 20, decode_s: vec![0.0, 0.0] };
        assert!(Planned::new(c, Clock::default()).is_err(), "a decoding time too many");
    }

    #[test]
    fn the_dram_tier_takes_the_contexts_the_planner_holds_in_memory() {
        let (lru_like, _) = planned(u64::MAX);
        assert!(lru_like.on_load(&info(1)), "no DRAM choice: the tier holds what is read, as with lru");
        // Memory for one context of 8 blocks of 100 bytes.
        let mut config = lru_like.lock().planner.config().clone();
        config.dram = DramChoice { budget_bytes: 1000, delay_s: vec![0.001, 0.0008] };
        let now = Arc::new(AtomicU64::new(1_000));
        let p = Planned::new(
            PlannedConfig {
                planner: config,
                codecs: vec![None, Some(CodecSpec::quant(8, 32, 0))],
                quality: vec![1.0, 0.98, 1.0],
                loads: LoadModel::default(),
            },
            Clock::manual(Arc::clone(&now)),
        )
        .unwrap();
        let put = |c: u64| p.on_put(&BlockInfo { record_bytes: 100, ..info(c) });
        // A hot context, put over eight uses (a second or more apart); a cold one, in one.
        for t in 0..8 {
            now.store(1_000 + t * 1_000, Ordering::Relaxed);
            assert!(put(1).dram, "memory has no price yet");
        }
        now.store(10_000, Ordering::Relaxed);
        for _ in 0..8 {
            put(2);
        }
        let report = p.report();
        assert!(report.dram_planned_bytes <= 1000 && report.dram_budget_bytes == 1000, "{report:?}");
        assert!(p.on_load(&info(1)), "the hot context is read into the DRAM tier");
        assert!(!p.on_load(&info(2)), "the cold one is left on the log");
        assert!(!put(2).dram);
        assert!(p.on_load(&info(77)) == p.lru.on_load(&info(77)), "a context it does not know: as lru");
        assert_eq!((p.holds(1), p.holds(2)), (Some(true), Some(false)), "what cleaning's rewrites follow");
        // Read often, as a get does (the load, then the hit): the read that makes the cold
        // context worth memory keeps the block it read, and memory stays within its budget.
        let mut kept = false;
        for t in 0..40 {
            now.store(3_000 + t * 1_000, Ordering::Relaxed);
            kept |= p.on_load(&info(2));
            p.on_hit(&info(2));
            assert!(p.report().dram_planned_bytes <= 1000, "{:?}", p.report());
        }
        assert!(kept && p.holds(2) == Some(true), "the context read most is held in memory now");
        assert_eq!(p.holds(1), Some(false), "and the other gave way");
        let view = p.plan_view(4).unwrap();
        assert_eq!(view.options[1].dram_delay_s, Some(0.0008));
        assert!(view.contexts.iter().any(|c| c.context == 2 && c.dram));
    }

    #[test]
    fn delays_follow_the_speeds_the_store_measures() {
        let (p, now) = planned(u64::MAX);
        let delays = |p: &Planned| p.lock().planner.config().options.iter().map(|o| o.delay_s).collect::<Vec<_>>();
        let speeds = Arc::new(LoadSpeeds::new(1));
        // Loads before the store told its speeds are not this window's.
        speeds.log_read(1000, 1, Duration::from_secs(1));
        p.measure_with(Arc::clone(&speeds));
        // 64 loads of 100-byte records at 1 MB/s (100 µs each); quant decoded at 1 MB/s.
        for _ in 0..64 {
            speeds.log_read(1, 100, Duration::from_micros(100));
        }
        for _ in 0..SPEED_MIN_LOADS {
            speeds.decoded(CodecSpec::quant(8, 32, 0), 100, Duration::from_micros(100));
        }
        assert_eq!(delays(&p), vec![0.011, 0.008, 0.1], "until maintenance runs, as configured");
        for c in 0..RATIO_CHECK_EVERY {
            now.store(1_000 + c, Ordering::Relaxed);
            p.on_put(&BlockInfo { record_bytes: 100, ..info(c) });
        }
        p.codec_at_put(&info(0));
        let got = delays(&p);
        assert!((got[0] - 100e-6).abs() < 1e-9, "{got:?}");
        // Half the bytes to read, then 100 µs of decoding.
        assert!((got[1] - 150e-6).abs() < 1e-9, "{got:?}");
        assert_eq!(got[2], 0.1, "recomputing is the client's cost: as configured");
        assert!(p.plan_view(1).unwrap().options[1].delay_s < 0.001, "kvhoard plan shows what is weighed");
    }

    #[test]
    fn a_namespaces_settings_close_codecs_and_weigh_quality() {
        // Bytes are dear: the second context is compressed where its namespace allows quant8.
        let raw_only = |p: &Planned, policy: &Policy| {
            for _ in 0..8 {
                p.on_put(&BlockInfo { policy, ..info(1) });
            }
            for _ in 0..8 {
                p.on_put(&BlockInfo { policy, ..info(2) });
            }
            (p.option_of(1), p.option_of(2))
        };
        let (p, _) = planned(1_200);
        let (a, b) = raw_only(&p, &LOSSY);
        assert!(a == 1 || b == 1, "quant8 where it is allowed: {a}, {b}");
        // Only the form as put is listed: the planner drops rather than quantizes.
        let listed = Policy {
            settings: NsSettings { codecs: Some(Arc::from(vec![CodecSpec::RAW])), ..NO_SETTINGS },
            ..LOSSY.clone()
        };
        let (p, _) = planned(1_200);
        let (a, b) = raw_only(&p, &listed);
        assert!(a != 1 && b != 1, "quant8 is not among the namespace's codecs: {a}, {b}");
        assert!(p.report().planned_bytes <= 1_200);
        // A namespace's α is its contexts' (the planner weighs their quality with it).
        let cheap = Policy { settings: NsSettings { alpha: Some(1e-6), ..NO_SETTINGS }, ..LOSSY.clone() };
        let (p, _) = planned(1_200);
        p.on_put(&BlockInfo { policy: &cheap, ..info(7) });
        let view = p.plan_view(10).unwrap();
        let c = view.contexts.iter().find(|c| c.context == 7).unwrap();
        assert_eq!(c.alpha, 1e-6, "the context carries its namespace's α");
    }

    #[test]
    fn a_quality_report_keeps_lossy_forms_closed_to_a_strict_namespace() {
        let (p, now) = planned(u64::MAX);
        let strict = BlockInfo { policy: &STRICT, ..info(5) };
        p.on_put(&strict);
        now.store(2_000, Ordering::Relaxed);
        assert!(p.report_quality(5, 0.5, 0.05), "below what raw was assumed to keep");
        let state = p.lock();
        let q = state.planner.qualities(5).unwrap();
        assert_eq!(q[1], f64::NEG_INFINITY, "quant8 stays closed: {q:?}");
    }

    #[test]
    fn a_quality_report_below_the_profile_rescores_the_context() {
        let (p, now) = planned(1_200);
        // Context 1 (8 blocks) is compressed to fit; a client then reports its hits are poor.
        for _ in 0..8 {
            p.on_put(&info(1));
        }
        now.store(2_000, Ordering::Relaxed);
        for _ in 0..8 {
            p.on_put(&info(2));
        }
        let option = p.option_of(1);
        assert_eq!(option, 1, "the colder context is quantized to fit");
        assert!(!p.report_quality(1, 0.975, 0.05), "within the drift: nothing changes");
        assert!(p.report_quality(1, 0.5, 0.05), "far below: scored again");
        // Quantized at half the quality it was assumed to keep, it is worth less than its
        // recompute: the next rebalance drops it rather than keep it so.
        now.store(20_000, Ordering::Relaxed);
        p.on_put(&info(2));
        p.on_put(&info(3));
        assert_eq!(p.option_of(1), 2, "{:?}", p.report());
    }

    #[test]
    fn admission_compresses_when_bytes_are_dear_and_profiles_count() {
        let (p, now) = planned(1_200);
        // Four contexts of four blocks, each read twice: more than the budget holds raw.
        for c in 0..4 {
            now.store(1_000 + c * 10_000, Ordering::Relaxed);
            for _ in 0..4 {
                p.on_put(&info(c));
            }
            for t in 1..=2 {
                now.store(1_000 + c * 10_000 + t * 1_000, Ordering::Relaxed);
                p.on_hit(&info(c));
            }
        }
        assert!(p.report().planned_bytes <= 1_200);
        // Bytes are dear now: a new context, used once, is admitted compressed.
        now.store(50_000, Ordering::Relaxed);
        assert_eq!(p.codec_at_put(&info(7)), Some(CodecSpec::quant(8, 32, 0)));
        // A context whose profile says quantization ruins it is kept raw or dropped, never
        // quantized.
        p.set_profile(8, vec![1.0, 0.0, 1.0]);
        assert_eq!(p.codec_at_put(&info(8)), None);
        // Nor is one whose namespace denies lossy codecs; and when bytes are short, its
        // contexts are dropped, never quantized.
        let strict = |context| BlockInfo { policy: &STRICT, ..info(context) };
        assert_eq!(p.codec_at_put(&strict(9)), None);
        for c in 20..40 {
            now.store(6_000 + c, Ordering::Relaxed);
            for _ in 0..4 {
                p.on_put(&strict(c));
            }
        }
        assert!(p.report().planned_bytes <= 1_200);
        for c in 20..40 {
            let keep = p.keep(&LiveBlock { policy: &STRICT, ..live(c, 0) });
            assert!(matches!(keep, Keep::Relocate | Keep::Drop), "context {c}: {keep:?}");
        }
    }
}
