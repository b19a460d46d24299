//! Placement: the one place that decides where a block lives and in what form.
//!
//! The engine consults a [`Placement`] at each decision point and carries out what it says:
//!
//! - at put: whether the block also goes to the DRAM tier ([`Placement::on_put`]);
//! - at a load from the log: whether the block is kept in the DRAM tier ([`Placement::on_load`]);
//! - when the volume is full: which sealed segment to reclaim ([`Placement::victim`]), and what
//!   reclaim dropped ([`Placement::dropped`]), for a policy that keeps its own accounts.
//!
//! Decisions are made under the engine's locks (the log lock at put and reclaim), so they must be
//! cheap and must not call back into the store. [`Fifo`], the default, is the behaviour kvhoard
//! has always had: every block in DRAM (least recently used out), the oldest segment reclaimed
//! whole.

mod fifo;

pub use fifo::Fifo;

use crate::index::KeyId;

/// A block placement is asked about.
#[derive(Debug, Clone, Copy)]
pub struct BlockInfo<'a> {
    /// Its namespace.
    pub namespace: &'a str,
    /// Bytes of the block as the client sees it.
    pub raw_bytes: u64,
    /// Bytes its record takes on the log (header, stored bytes, padding).
    pub record_bytes: u64,
    /// Its group (context), when the client named one.
    pub group: Option<u64>,
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
}
