//! Tiers above and beside the log: the DRAM tier (a bounded cache of blocks in memory, above the
//! log), what every tier reports (hits, misses, bytes, a load-latency histogram), and the load
//! speeds placement weighs (`speed`).
//!
//! The log on the device is the source of truth. The DRAM tier only ever holds copies of records
//! that are on the log (or on their way to it), so evicting from DRAM loses nothing, and a cached
//! copy is served only while the index still points at the record it was read from. Which
//! blocks enter it is placement's decision ([`crate::placement`]); when it is full it evicts the
//! least recently used.

mod cached;
mod dram;
mod latency;
mod lru;
mod speed;

pub(crate) use cached::{DramRead, Tiers};
pub use dram::{DramTier, TierCounters};
pub use latency::{LatencyHistogram, LatencySummary};
pub use speed::{DecodeReport, LoadSpeeds, Rate, SpeedReport, SpeedTotals};

/// What one tier reports in [`crate::Stats`].
#[derive(Debug, Clone, PartialEq, Eq, Default, serde::Serialize)]
pub struct TierStats {
    /// `dram` or `ssd`.
    pub tier: String,
    /// Bytes the tier may hold.
    pub capacity_bytes: u64,
    /// Bytes it holds now.
    pub resident_bytes: u64,
    /// Blocks it holds now.
    pub entries: u64,
    /// Loads served by this tier.
    pub hits: u64,
    /// Loads that reached this tier and were not served by it.
    pub misses: u64,
    /// Bytes served by this tier.
    pub hit_bytes: u64,
    /// Blocks admitted (DRAM: copies taken on put or on a load from the log).
    pub admitted: u64,
    /// Blocks placement turned away, or too large for the tier.
    pub rejected: u64,
    /// Blocks evicted to make room.
    pub evictions: u64,
    /// Latency of the loads this tier served.
    pub load_latency: LatencySummary,
}
