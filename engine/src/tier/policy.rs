//! Admission and eviction policies of the DRAM tier.

use std::collections::BTreeMap;
use std::sync::Arc;

use hashbrown::HashMap;

use crate::index::ContentFp;

/// Why a block is offered to the tier.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Origin {
    /// It was just put.
    Put,
    /// It was just loaded from the log to serve a get.
    Load,
}

/// Decides what the DRAM tier admits and what it evicts. One instance serves one shard of the
/// tier and is called under that shard's lock, so it needs no synchronisation of its own; its
/// calls must be cheap.
pub trait TierPolicy: Send + std::fmt::Debug {
    /// Whether to admit a block of `bytes` bytes that is not in the tier.
    fn admit(&mut self, fp: &ContentFp, bytes: u64, origin: Origin) -> bool;
    /// A block was inserted.
    fn inserted(&mut self, fp: ContentFp, bytes: u64);
    /// A resident block was served (or offered again).
    fn touched(&mut self, fp: &ContentFp);
    /// A block left the tier for a reason other than [`TierPolicy::victim`].
    fn removed(&mut self, fp: &ContentFp);
    /// The block to evict next, removed from the policy's bookkeeping; `None` if it tracks none.
    fn victim(&mut self) -> Option<ContentFp>;
}

/// Makes one policy per shard.
#[derive(Clone)]
pub struct PolicyFactory(Arc<dyn Fn() -> Box<dyn TierPolicy> + Send + Sync>);

impl PolicyFactory {
    /// A factory calling `make` for every shard.
    pub fn new(make: impl Fn() -> Box<dyn TierPolicy> + Send + Sync + 'static) -> PolicyFactory {
        PolicyFactory(Arc::new(make))
    }

    /// Least recently used: admits everything, evicts the block served longest ago.
    pub fn lru() -> PolicyFactory {
        PolicyFactory::new(|| Box::new(Lru::default()))
    }

    pub(crate) fn make(&self) -> Box<dyn TierPolicy> {
        (self.0)()
    }
}

impl Default for PolicyFactory {
    fn default() -> Self {
        PolicyFactory::lru()
    }
}

impl std::fmt::Debug for PolicyFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PolicyFactory")
    }
}

/// Least recently used, by a use counter: `order` maps tick → block, oldest first.
#[derive(Debug, Default)]
pub struct Lru {
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

impl TierPolicy for Lru {
    fn admit(&mut self, _: &ContentFp, _: u64, _: Origin) -> bool {
        true
    }

    fn inserted(&mut self, fp: ContentFp, _: u64) {
        self.stamp(fp);
    }

    fn touched(&mut self, fp: &ContentFp) {
        if self.last_use.contains_key(fp) {
            self.stamp(*fp);
        }
    }

    fn removed(&mut self, fp: &ContentFp) {
        if let Some(tick) = self.last_use.remove(fp) {
            self.order.remove(&tick);
        }
    }

    fn victim(&mut self) -> Option<ContentFp> {
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
                            lru.inserted(fp(n), 1);
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
