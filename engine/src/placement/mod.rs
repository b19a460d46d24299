//! Placement: the one place that decides where a block lives and in what form.
//!
//! The engine consults a [`Placement`] at each decision point and carries out what it says:
//!
//! - at put: whether the block also goes to the DRAM tier ([`Placement::on_put`]);
//! - at a load from the log: whether the block is kept in the DRAM tier ([`Placement::on_load`]);
//! - when the volume is full: which sealed segment to reclaim ([`Placement::victim`]), and what
//!   reclaim dropped ([`Placement::dropped`]), for a policy that keeps its own accounts;
//! - when a cleaner empties a segment ahead of need ([`Placement::cleans`]): which of its live
//!   blocks are kept, relocated to the head of the log as they are or recompressed
//!   ([`Placement::keep`]);
//! - at every hit, for a policy that counts accesses ([`Placement::on_hit`]), and before a put
//!   that names no codec, which codec it is stored with ([`Placement::codec_at_put`]).
//!
//! The unit decisions are made for is a **context** ([`context_of`]): the blocks a client names
//! with one group id, or else one block (its key). The engine enforces the namespace's policy
//! whatever placement says: a lossy codec where the namespace denies lossy codecs is not applied
//! (the block is kept as it is), and a block stored lossy is never recoded to a lossless form.
//!
//! Decisions are made under the engine's locks (the log lock at put and reclaim), so they must be
//! cheap and must not call back into the store. [`Fifo`], the default, is the behaviour kvhoard
//! has always had: every block in DRAM (least recently used out), the oldest segment reclaimed
//! whole.

mod cost_benefit;
mod fifo;
pub mod group_ttl;
pub mod load_model;
mod lru;
mod planned;
pub mod planner;
pub mod reuse;

pub use cost_benefit::cost_benefit;
pub use fifo::Fifo;
pub use lru::Lru;
pub use planned::{Planned, PlannedConfig};

use std::sync::Arc;

use kvhoard_kernels::CodecSpec;

use crate::index::{group_fp, key_fp, KeyId};
use crate::log::Loc;
use crate::policy::Policy;
use crate::tier::LoadSpeeds;

/// The context a block belongs to: its group in its namespace when the client named one, else
/// the block alone (its key). 64 bits of a fingerprint of either.
pub fn context_of(group: Option<u64>, namespace: &str, key: &str) -> u64 {
    let fp = match group {
        Some(g) => group_fp(namespace, g),
        None => key_fp(namespace, key),
    };
    let mut first = [0u8; 8];
    first.copy_from_slice(fp.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(first)
}

/// A block placement is asked about.
#[derive(Debug, Clone, Copy)]
pub struct BlockInfo<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Bytes of the block as the client sees it.
    pub raw_bytes: u64,
    /// Bytes its record takes on the log (header, stored bytes, padding).
    pub record_bytes: u64,
    /// Its group, when the client named one.
    pub group: Option<u64>,
    /// Its context ([`context_of`]).
    pub context: u64,
    /// At a put: its key named no block before (the put adds a block to its context).
    pub new_key: bool,
    /// Its namespace's policy: whether lossy codecs are allowed, and its settings.
    pub policy: &'a Policy,
    /// The codec its record is stored with (`None`: as it was put). At a put that names no
    /// codec, before it is compressed ([`Placement::codec_at_put`]), always `None`.
    pub codec: Option<CodecSpec>,
}

/// A sealed segment as placement sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SegmentView {
    /// Segment index.
    pub index: u32,
    /// Seq of its current use: lower is older.
    pub seq: u64,
    /// When its current use began.
    pub created_unix_ms: u64,
    /// Units its records occupy.
    pub end_unit: u32,
    /// Units of those records still live (named by a key).
    pub live_units: u32,
}

/// A live block in a segment a cleaner is emptying.
#[derive(Debug, Clone, Copy)]
pub struct LiveBlock<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Bytes of the block as the client sees it.
    pub raw_bytes: u64,
    /// Bytes its record takes on the log.
    pub record_bytes: u64,
    /// Its group, when the client named one.
    pub group: Option<u64>,
    /// Its context ([`context_of`]).
    pub context: u64,
    /// Its namespace's policy: whether lossy codecs are allowed, and its settings.
    pub policy: &'a Policy,
    /// Reads since its record was last written (saturating at 255).
    pub reads: u8,
    /// Milliseconds since its record was last written.
    pub age_ms: u64,
}

/// What a cleaner does with a live block of the segment it empties.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Keep {
    /// Let it go with the segment (a miss from then on).
    Drop,
    /// Write it again at the head of the log.
    Relocate,
    /// Write it again with this codec (as [`crate::Store::recompress`] would; kept as it is when
    /// the namespace's policy or the block's form does not allow it).
    Recompress(CodecSpec),
}

/// What a placement says of itself, in the store's statistics.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct PlacementReport {
    /// Which placement: `fifo`, `lru`, `planner`, or a name of its own.
    pub policy: String,
    /// Contexts a planner knows (0 for others).
    pub contexts: u64,
    /// Bytes a planner counts as kept.
    pub planned_bytes: u64,
    /// The bytes a planner keeps them within.
    pub budget_bytes: u64,
    /// Bytes of the copies a planner has the DRAM tier hold (0 where it decides nothing of it).
    pub dram_planned_bytes: u64,
    /// The bytes it keeps those within (0: the DRAM tier is no choice).
    pub dram_budget_bytes: u64,
    /// CPU seconds spent deciding.
    pub cpu_s: f64,
    /// The half-life a planner weighs a context's chance of reuse with, ms (0 for others).
    pub half_life_ms: u64,
    /// Contexts a planner dropped when cleaning reached one of their blocks, rather than have
    /// it copied (the greedy's other drops are counted by the blocks cleaning drops).
    pub cleaning_drops: u64,
}

/// What a planner decides, for people (`kvhoard plan live`, `GET /plan`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PlanView {
    /// Its options, in order: the codec's name (`as put` for the first, `dropped` for the last),
    /// stored bytes ÷ raw bytes, seconds to load and decode a block (to recompute one, dropped).
    pub options: Vec<OptionView>,
    /// Its totals.
    pub report: PlacementReport,
    /// The contexts accessed most, with each option's utility; what the next cleaning does with
    /// a context's blocks is its option: keep as put, recompress, or drop.
    pub contexts: Vec<planner::ContextView>,
    /// The steps the next rebalance takes, cheapest first, if the bytes go over budget.
    pub next_steps: Vec<planner::StepView>,
}

/// One option of a planner.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OptionView {
    /// `as put`, a codec spec, or `dropped`.
    pub name: String,
    /// Stored bytes ÷ raw bytes.
    pub ratio: f64,
    /// Seconds to load and decode a block (for `dropped`: to recompute it).
    pub delay_s: f64,
    /// Seconds to load and decode a block the DRAM tier holds (`None`: no such choice).
    pub dram_delay_s: Option<f64>,
}

/// Where a put block goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PutPlan {
    /// Keep a copy in the DRAM tier (when the store has one).
    pub dram: bool,
}

/// Decides where blocks live. See the module documentation.
pub trait Placement: Send + Sync + std::fmt::Debug {
    /// A block is being put (called under the log lock).
    fn on_put(&self, block: &BlockInfo<'_>) -> PutPlan;

    /// A block was read from the log to serve a get: whether to keep a copy in the DRAM tier.
    fn on_load(&self, block: &BlockInfo<'_>) -> bool;

    /// The volume is full: the index of the sealed segment to reclaim, one of `candidates` (never
    /// empty; segments holding pinned keys are already left out while others remain). Anything
    /// else makes the engine take the oldest.
    fn victim(&self, candidates: &[SegmentView]) -> u32;

    /// Reclaim dropped these keys: they read as misses from now on, and never come back.
    fn dropped(&self, keys: &[KeyId]) {
        let _ = keys;
    }

    /// A record naming `key`, of `context`, was written at `record`: a put's block or link, a
    /// rename's link, cleaning's copy; `None`: a tombstone, the key is deleted. Told under the
    /// log's lock, in log order, after the index names it. For a placement that drops keys
    /// itself ([`Placement::take_drops`]): which record each key's drop is for.
    fn located(&self, key: KeyId, context: u64, record: Option<Loc>) {
        let _ = (key, context, record);
    }

    /// Keys whose blocks placement dropped since it was last asked (a planner dropping a
    /// context), each with the record it was dropped at: the store removes each from its index
    /// and the DRAM tier if the index still names that record (a key written again since
    /// stays) and no client has it pinned, so they read as misses and their records are dead
    /// space to cleaning. Not written to the log: after a crash, a key dropped since the last
    /// checkpoint may be found again with the bytes it was dropped with (still right), until
    /// cleaning reaches them. Asked after every write a client makes and before each cleaning
    /// copies what it keeps, never under the log's lock.
    fn take_drops(&self) -> Vec<(KeyId, Loc)> {
        Vec::new()
    }

    /// Whether a background cleaner empties segments before the volume is full, keeping the live
    /// blocks [`Placement::keep`] says to keep. Without it, a full volume reclaims a segment whole.
    fn cleans(&self) -> bool {
        false
    }

    /// A cleaner is emptying a segment: what becomes of one of its live blocks.
    fn keep(&self, block: &LiveBlock<'_>) -> Keep {
        let _ = block;
        Keep::Drop
    }

    /// What it says of itself in the store's statistics.
    fn report(&self) -> PlacementReport {
        PlacementReport { policy: "custom".into(), ..PlacementReport::default() }
    }

    /// What it decides, for people: its `limit` most used contexts and next steps (`None` for a
    /// placement without a planner).
    fn plan_view(&self, limit: usize) -> Option<PlanView> {
        let _ = limit;
        None
    }

    /// A get found the block (in the DRAM tier or on the log).
    fn on_hit(&self, block: &BlockInfo<'_>) {
        let _ = block;
    }

    /// A client observed `observed` quality (0 to 1) from `context`'s blocks as they are kept
    /// now; `drift` is its namespace's threshold. Returns whether the context was scored again
    /// (always `false` for a placement without a planner).
    fn report_quality(&self, context: u64, observed: f64, drift: f64) -> bool {
        let _ = (context, observed, drift);
        false
    }

    /// A put that names no codec and brings no compressed bytes: the codec to store the block
    /// with (`None`: the namespace's default). Asked once per batch, for its first block.
    fn codec_at_put(&self, block: &BlockInfo<'_>) -> Option<CodecSpec> {
        let _ = block;
        None
    }

    /// Whether blocks of `context` belong in the DRAM tier, for a block cleaning writes again
    /// (relocated or recompressed), asked without counting as an access. `None`: no opinion (the
    /// rewritten block takes its old copy's place in the tier, as before).
    fn holds(&self, context: u64) -> Option<bool> {
        let _ = context;
        None
    }

    /// The store opening over this placement counts its loads in `speeds` (the log's reads, the
    /// DRAM tier's hits, each codec's decoding), for a placement that weighs what loads cost.
    /// Told at every open; the last one told is the store in use.
    fn measure_with(&self, speeds: Arc<LoadSpeeds>) {
        let _ = speeds;
    }
}
