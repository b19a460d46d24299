//! Least-recently-used order: which block the DRAM tier evicts next.

use std::collections::BTreeMap;

use hashbrown::HashMap;

use crate::index::ContentFp;

/// Least recently used, by a use counter: `order` maps tick → block, oldest first. One per
/// shard of the tier, called under that shard's lock.
#[derive(Debug, Default)]
pub(crate) struct Lru {
    tick: u64,
    last_use: HashMap<ContentFp, u64>,
    order: BTreeMap<u64, ContentFp>,
}

impl Lru {
    fn stamp(&mut self, fp: ContentFp) {
        self.tick += 1;
        if let Some(old) = self.last_use.insert(fp, self.tick) {
            self.order.remove(&old);
        }
        self.order.insert(self.tick, fp);
    }
}

impl Lru {
    /// A block was inserted: it is the most recently used.
    pub(crate) fn inserted(&mut self, fp: ContentFp) {
        self.stamp(fp);
    }

    /// A resident block was served (or offered again).
    pub(crate) fn touched(&mut self, fp: &ContentFp) {
        if self.last_use.contains_key(fp) {
            self.stamp(*fp);
        }
    }

    /// A block left the tier for a reason other than [`Lru::victim`].
    pub(crate) fn removed(&mut self, fp: &ContentFp) {
        if let Some(tick) = self.last_use.remove(fp) {
            self.order.remove(&tick);
        }
    }

    /// The block to evict next, forgotten; `None` if none is tracked.
    pub(crate) fn victim(&mut self) -> Option<ContentFp> {
        let (_, fp) = self.order.pop_first()?;
        self.last_use.remove(&fp);
        Some(fp)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::VecDeque;

    use proptest::prelude::*;

    use super::*;

    fn fp(n: u8) -> ContentFp {
        [n; 16]
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u8),
        Touch(u8),
        Remove(u8),
        Victim,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u8..12).prop_map(Op::Insert),
            (0u8..12).prop_map(Op::Touch),
            (0u8..12).prop_map(Op::Remove),
            Just(Op::Victim),
        ]
    }

    proptest! {
        /// The LRU agrees with a list kept in use order (front = least recently used).
        #[test]
        fn lru_matches_a_use_ordered_list(ops in proptest::collection::vec(op(), 1..200)) {
            let mut lru = Lru::default();
            let mut model: VecDeque<u8> = VecDeque::new();
            for op in ops {
                match op {
                    Op::Insert(n) | Op::Touch(n) => {
                        let present = model.contains(&n);
                        if matches!(op, Op::Insert(_)) {
                            lru.inserted(fp(n));
                        } else {
                            lru.touched(&fp(n));
                        }
                        if present || matches!(op, Op::Insert(_)) {
                            model.retain(|m| *m != n);
                            model.push_back(n);
                        }
                    }
                    Op::Remove(n) => {
                        lru.removed(&fp(n));
                        model.retain(|m| *m != n);
                    }
                    Op::Victim => prop_assert_eq!(lru.victim(), model.pop_front().map(fp)),
                }
            }
        }
    }
}
