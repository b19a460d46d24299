//! Least recently used, as a log-structured cache approximates it: a background cleaner empties
//! segments (chosen by cost-benefit) before the volume fills, and relocates to the head of the
//! log the blocks read since they were last written; the rest go. A block in steady use is never
//! dropped with the cold ones around it; one never read again ages out. (CacheLib's flash cache
//! calls this reinsertion.) The DRAM tier holds what is put and read, least recently used out.

use super::{cost_benefit, BlockInfo, Keep, LiveBlock, Placement, PlacementReport, PutPlan, SegmentView};
use crate::clock::Clock;

/// See the module documentation.
#[derive(Debug, Clone, Default)]
pub struct Lru {
    clock: Clock,
}

impl Lru {
    /// An LRU placement reading time from `clock` (the store's, so tests can control it).
    pub fn new(clock: Clock) -> Lru {
        Lru { clock }
    }
}

impl Placement for Lru {
    fn on_put(&self, _: &BlockInfo<'_>) -> PutPlan {
        PutPlan { dram: true }
    }

    fn on_load(&self, _: &BlockInfo<'_>) -> bool {
        true
    }

    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        cost_benefit(candidates, self.clock.now_unix_ms()).unwrap_or(0)
    }

    fn cleans(&self) -> bool {
        true
    }

    fn keep(&self, block: &LiveBlock<'_>) -> Keep {
        if block.reads > 0 {
            Keep::Relocate
        } else {
            Keep::Drop
        }
    }

    fn report(&self) -> PlacementReport {
        PlacementReport { policy: "lru".into(), ..PlacementReport::default() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_read_since_their_write_are_kept() {
        let lru = Lru::default();
        let policy = crate::Policy::default();
        let block = |reads| LiveBlock {
            namespace: "n",
            raw_bytes: 1,
            record_bytes: 4096,
            group: None,
            context: 0,
            policy: &policy,
            reads,
            age_ms: 5,
        };
        assert_eq!(lru.keep(&block(0)), Keep::Drop);
        assert_eq!(lru.keep(&block(3)), Keep::Relocate);
        assert!(lru.cleans());
    }
}
