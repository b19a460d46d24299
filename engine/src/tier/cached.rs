//! The tiers a store has, and the DRAM tier's copies of block records: taken when placement
//! admits a block (at put or at a load from the log), served while the index still names the
//! record they copy.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvhoard_format::record::RecordHeader;

use super::{DramTier, LatencyHistogram, LoadSpeeds, TierCounters};
use crate::block::{Block, BlockMeta, Bytes};
use crate::buffer::PooledBuf;
use crate::index::{ContentEntry, ContentFp};
use crate::log::Loc;

/// A block held by the DRAM tier: the record buffer it was written from or read into, shared
/// with the gets that return it (never copied).
#[derive(Debug)]
pub(crate) struct CachedBlock {
    buf: Arc<PooledBuf>,
    start: usize,
    len: usize,
    meta: BlockMeta,
}

impl CachedBlock {
    fn block(&self) -> Block {
        Block::new(Bytes::Shared(Arc::clone(&self.buf)), self.start, self.len, self.meta.clone())
    }
}

/// What the DRAM tier had for a block.
#[expect(
    clippy::large_enum_variant,
    reason = "returned once per get, never stored: boxing would cost an allocation per hit"
)]
pub(crate) enum DramRead {
    /// A copy, intact.
    Hit(Block),
    /// No copy (or no DRAM tier).
    Miss,
    /// A copy that failed its hash: dropped; read the log.
    Damaged,
}

/// The tiers of a store, with their counters.
#[derive(Debug)]
pub(crate) struct Tiers {
    /// Copies of blocks in memory above the log, if configured.
    pub(crate) dram: Option<DramTier<Arc<CachedBlock>>>,
    /// Load latency of DRAM-tier hits.
    pub(crate) dram_latency: LatencyHistogram,
    /// What reads from the log did.
    pub(crate) ssd: TierCounters,
    /// Load latency of reads from the log.
    pub(crate) ssd_latency: LatencyHistogram,
    /// Load speeds, for placement.
    pub(crate) speeds: Arc<LoadSpeeds>,
}

impl Tiers {
    /// The tiers of a store with a DRAM tier of `dram_bytes` (none if 0), whose batches decode
    /// on `cores` cores.
    pub(crate) fn new(dram_bytes: u64, cores: usize) -> Tiers {
        Tiers {
            dram: (dram_bytes > 0).then(|| DramTier::new(dram_bytes)),
            dram_latency: LatencyHistogram::default(),
            ssd: TierCounters::default(),
            ssd_latency: LatencyHistogram::default(),
            speeds: Arc::new(LoadSpeeds::new(cores)),
        }
    }

    /// Keeps a copy of a block record, held in `buf`, in the DRAM tier (if there is one).
    pub(crate) fn admit(&self, buf: &Arc<PooledBuf>, header: &RecordHeader, fp: ContentFp, loc: Loc) {
        if let Some(dram) = &self.dram {
            let cached = CachedBlock {
                buf: Arc::clone(buf),
                start: header.payload_offset() as usize,
                len: header.stored_len as usize,
                meta: BlockMeta::of(header.clone(), loc),
            };
            dram.insert(fp, loc, buf.len() as u64, Arc::new(cached));
        }
    }

    /// Counts a block placement kept out of the DRAM tier.
    pub(crate) fn turned_away(&self) {
        if let Some(dram) = &self.dram {
            dram.counters.rejected.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// The block from the DRAM tier, if it is there (and, with `verify_hash`, intact).
    pub(crate) fn dram_hit(&self, entry: &ContentEntry, verify_hash: bool) -> DramRead {
        let loc = entry.record;
        let started = Instant::now();
        let Some(dram) = &self.dram else { return DramRead::Miss };
        let Some(cached) = dram.get(&entry.fp, loc) else { return DramRead::Miss };
        let block = cached.block();
        if verify_hash && !hash_matches(&block) {
            // Memory corruption, not a disk problem: drop the copy; the caller reads the log.
            tracing::error!(segment = loc.segment, unit = loc.unit, "cached block fails its hash; reading the log");
            dram.remove(&entry.fp);
            return DramRead::Damaged;
        }
        dram.counters.hit_bytes.fetch_add(block.len() as u64, Ordering::Relaxed);
        self.dram_latency.record(u64::from(entry.fp[0]), started.elapsed());
        self.speeds.dram_hit();
        DramRead::Hit(block)
    }

    /// The description of the block the DRAM tier holds for the record at `loc`, without
    /// counting a hit.
    pub(crate) fn peek_meta(&self, fp: &ContentFp, loc: Loc) -> Option<BlockMeta> {
        self.dram.as_ref()?.peek(fp, loc).map(|c| c.meta.clone())
    }

    /// Whether the DRAM tier holds the record at `loc`.
    pub(crate) fn holds(&self, fp: &ContentFp, loc: Loc) -> bool {
        self.dram.as_ref().is_some_and(|d| d.peek(fp, loc).is_some())
    }

    /// Forgets a block whose bytes are no longer stored.
    pub(crate) fn remove(&self, fp: &ContentFp) {
        if let Some(dram) = &self.dram {
            dram.remove(fp);
        }
    }

    /// Forgets every copy of a record in `segment` (it is being reclaimed).
    pub(crate) fn drop_segment(&self, segment: u32) {
        if let Some(dram) = &self.dram {
            dram.drop_segment(segment);
        }
    }
}

/// Whether an uncompressed block's bytes still hash to its content hash.
fn hash_matches(block: &Block) -> bool {
    !block.meta.compression.is_none() || blake3::hash(block).as_bytes() == &block.meta.content_hash
}
