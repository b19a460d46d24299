//! The DRAM tier: a capacity-bounded map from content fingerprint to a cached record, sharded
//! so that gets on different blocks do not contend for one lock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use hashbrown::HashMap;

use super::lru::Lru;
use crate::index::ContentFp;
use crate::log::Loc;

/// Shards hold at least this much, so that large blocks still fit in one.
const MIN_SHARD_BYTES: u64 = 512 << 20;
const MAX_SHARDS: u64 = 16;

/// Counters of a tier, since it was created.
#[derive(Debug, Default)]
#[expect(missing_docs, reason = "named for what they count; TierStats explains them")]
pub struct TierCounters {
    pub hits: AtomicU64,
    pub misses: AtomicU64,
    pub hit_bytes: AtomicU64,
    pub admitted: AtomicU64,
    pub rejected: AtomicU64,
    pub evictions: AtomicU64,
}

#[derive(Debug)]
struct Entry<V> {
    /// The record the value was taken from: a cached copy is served only while the index still
    /// names this record, so a copy can never outlive the block it copies.
    loc: Loc,
    bytes: u64,
    value: V,
}

#[derive(Debug)]
struct Shard<V> {
    entries: HashMap<ContentFp, Entry<V>>,
    lru: Lru,
    bytes: u64,
    capacity: u64,
}

/// A bounded cache of values `V` (shared handles to record bytes) keyed by content fingerprint.
#[derive(Debug)]
pub struct DramTier<V> {
    shards: Vec<Mutex<Shard<V>>>,
    capacity: u64,
    /// What the tier did.
    pub counters: TierCounters,
}

impl<V: Clone> DramTier<V> {
    /// A tier holding at most `capacity` bytes, evicting the least recently used.
    pub fn new(capacity: u64) -> DramTier<V> {
        let n = (capacity / MIN_SHARD_BYTES).clamp(1, MAX_SHARDS);
        let shards = (0..n)
            .map(|i| {
                // Spread the remainder so the shards add up to exactly `capacity`.
                let share = capacity / n + u64::from(i < capacity % n);
                Mutex::new(Shard { entries: HashMap::new(), lru: Lru::default(), bytes: 0, capacity: share })
            })
            .collect();
        DramTier { shards, capacity, counters: TierCounters::default() }
    }

    fn shard(&self, fp: &ContentFp) -> Option<std::sync::MutexGuard<'_, Shard<V>>> {
        let h = u64::from_le_bytes([fp[8], fp[9], fp[10], fp[11], fp[12], fp[13], fp[14], fp[15]]);
        let shard = self.shards.get((h % self.shards.len().max(1) as u64) as usize)?;
        Some(shard.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// The cached value of the record at `loc` holding `fp`, counting a hit or a miss (the
    /// caller counts the bytes it serves in `hit_bytes`).
    pub fn get(&self, fp: &ContentFp, loc: Loc) -> Option<V> {
        let found = self.shard(fp).and_then(|mut shard| {
            let entry = shard.entries.get(fp)?;
            if entry.loc != loc {
                // A copy of an older record of the same bytes; the next insert replaces it.
                return None;
            }
            let value = entry.value.clone();
            shard.lru.touched(fp);
            Some(value)
        });
        match found {
            Some(value) => {
                self.counters.hits.fetch_add(1, Ordering::Relaxed);
                Some(value)
            }
            None => {
                self.counters.misses.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The cached value of the record at `loc` holding `fp`, without counting or touching it.
    pub fn peek(&self, fp: &ContentFp, loc: Loc) -> Option<V> {
        let shard = self.shard(fp)?;
        shard.entries.get(fp).filter(|e| e.loc == loc).map(|e| e.value.clone())
    }

    /// Puts the record at `loc` holding `fp` in the tier (placement decided it should be here);
    /// returns whether it is now resident. Evicts the least recently used to make room. Values
    /// leaving the tier are dropped after the shard's lock is released (dropping the last handle
    /// to a buffer may free memory).
    pub fn insert(&self, fp: ContentFp, loc: Loc, bytes: u64, value: V) -> bool {
        let mut evicted = Vec::new();
        let resident = match self.shard(&fp) {
            Some(mut shard) => shard.insert(fp, loc, bytes, value, &mut evicted),
            None => false,
        };
        let c = &self.counters;
        c.evictions.fetch_add(evicted.len() as u64, Ordering::Relaxed);
        if resident {
            c.admitted.fetch_add(1, Ordering::Relaxed);
        } else {
            c.rejected.fetch_add(1, Ordering::Relaxed);
        }
        drop(evicted);
        resident
    }

    /// Forgets `fp` (its bytes are no longer stored).
    pub fn remove(&self, fp: &ContentFp) {
        let gone = self.shard(fp).and_then(|mut shard| shard.take(fp));
        drop(gone);
    }

    /// Forgets every copy of a record in `segment` (the segment is being reclaimed).
    pub fn drop_segment(&self, segment: u32) {
        for shard in &self.shards {
            let mut gone = Vec::new();
            {
                let mut shard = shard.lock().unwrap_or_else(|e| e.into_inner());
                let fps: Vec<ContentFp> =
                    shard.entries.iter().filter(|(_, e)| e.loc.segment == segment).map(|(fp, _)| *fp).collect();
                gone.extend(fps.iter().filter_map(|fp| shard.take(fp)));
            }
            drop(gone);
        }
    }

    /// Bytes the tier may hold.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Bytes and blocks held now.
    pub fn resident(&self) -> (u64, u64) {
        self.shards.iter().fold((0, 0), |(bytes, entries), s| {
            let s = s.lock().unwrap_or_else(|e| e.into_inner());
            (bytes + s.bytes, entries + s.entries.len() as u64)
        })
    }
}

impl<V> Shard<V> {
    fn insert(&mut self, fp: ContentFp, loc: Loc, bytes: u64, value: V, evicted: &mut Vec<V>) -> bool {
        if let Some(entry) = self.entries.get_mut(&fp) {
            if entry.loc == loc {
                self.lru.touched(&fp);
                return true;
            }
            // A stale copy (older record of the same bytes): replace it below.
            evicted.extend(self.take(&fp));
        }
        if bytes > self.capacity {
            return false;
        }
        while self.bytes + bytes > self.capacity {
            let Some(victim) = self.lru.victim() else { return false };
            if let Some(e) = self.entries.remove(&victim) {
                self.bytes -= e.bytes;
                evicted.push(e.value);
            }
        }
        self.entries.insert(fp, Entry { loc, bytes, value });
        self.bytes += bytes;
        self.lru.inserted(fp);
        true
    }

    fn take(&mut self, fp: &ContentFp) -> Option<V> {
        let e = self.entries.remove(fp)?;
        self.bytes -= e.bytes;
        self.lru.removed(fp);
        Some(e.value)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashMap as StdMap;

    use proptest::prelude::*;

    use super::*;

    fn fp(n: u8) -> ContentFp {
        [n; 16]
    }

    fn loc(segment: u32, unit: u32) -> Loc {
        Loc { segment, unit }
    }

    #[test]
    fn evicts_least_recently_used_within_capacity() {
        let tier: DramTier<u32> = DramTier::new(300);
        assert!(tier.insert(fp(1), loc(0, 1), 100, 1));
        assert!(tier.insert(fp(2), loc(0, 2), 100, 2));
        assert!(tier.insert(fp(3), loc(0, 3), 100, 3));
        assert_eq!(tier.get(&fp(1), loc(0, 1)), Some(1)); // 2 is now the oldest
        assert!(tier.insert(fp(4), loc(0, 4), 100, 4));
        assert_eq!(tier.get(&fp(2), loc(0, 2)), None);
        assert_eq!(tier.get(&fp(1), loc(0, 1)), Some(1));
        assert_eq!(tier.resident(), (300, 3));
        assert_eq!(tier.counters.evictions.load(Ordering::Relaxed), 1);
        assert!(!tier.insert(fp(5), loc(0, 5), 301, 5), "larger than the tier");
    }

    #[test]
    fn a_copy_of_another_record_is_not_served() {
        let tier: DramTier<u32> = DramTier::new(1000);
        tier.insert(fp(1), loc(3, 1), 100, 1);
        assert_eq!(tier.get(&fp(1), loc(4, 1)), None, "the index now names another record");
        tier.insert(fp(1), loc(4, 1), 100, 2);
        assert_eq!(tier.get(&fp(1), loc(4, 1)), Some(2));
        tier.drop_segment(4);
        assert_eq!(tier.get(&fp(1), loc(4, 1)), None);
        assert_eq!(tier.resident(), (0, 0));
    }

    proptest! {
        /// Against a model: never more than the capacity, a hit returns the value inserted for
        /// that record, and a removed or dropped block is never served.
        #[test]
        fn never_over_capacity_never_stale(ops in proptest::collection::vec((0u8..4, 0u8..10, 1u64..400, 0u32..3), 1..300)) {
            let tier: DramTier<(u8, u32)> = DramTier::new(1000);
            let mut live: StdMap<u8, u32> = StdMap::new(); // what the "index" names: fp → segment
            for (op, n, bytes, seg) in ops {
                match op {
                    0 => {
                        live.insert(n, seg);
                        tier.insert(fp(n), loc(seg, u32::from(n)), bytes, (n, seg));
                    }
                    1 => {
                        let want = live.get(&n).copied().unwrap_or(seg);
                        if let Some(got) = tier.get(&fp(n), loc(want, u32::from(n))) {
                            prop_assert_eq!(got, (n, want));
                        }
                    }
                    2 => {
                        live.remove(&n);
                        tier.remove(&fp(n));
                        prop_assert_eq!(tier.get(&fp(n), loc(seg, u32::from(n))), None);
                    }
                    _ => {
                        live.retain(|_, s| *s != seg);
                        tier.drop_segment(seg);
                        for m in 0..10u8 {
                            prop_assert_eq!(tier.get(&fp(m), loc(seg, u32::from(m))), None);
                        }
                    }
                }
                prop_assert!(tier.resident().0 <= tier.capacity());
            }
        }
    }
}
