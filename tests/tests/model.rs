//! The store against a reference model, under random sequences of put, delete, get, list,
//! clean reopen and crashes that keep, drop or tear unsynced writes, on a volume small enough
//! that segments are reclaimed. proptest prints (and saves) the smallest failing sequence.
//!
//! Crashes come between operations and in the middle of one (a put, a batch, a delete, a
//! rename, a cleaning): just before its n-th device write or sync. The image such a crash
//! leaves must pass fsck, and each key the operation touched may read as before or after it.
//!
//! It runs on the memory device (where crashes are simulated), and on a volume file through the
//! io_uring and the pread backends (where a crash is a reopen), each with and without a DRAM
//! tier small enough to evict.
//!
//! Reclaim reports the keys it drops (through the placement's `dropped`); the model marks exactly
//! those gone for good, so a key that reads as missing without having been dropped, deleted or
//! lost to a crash of an unsynced write fails the test, however many evictions came before.
//!
//! With the placement planner, the keys of the contexts it drops leave the index at once but
//! nothing is written for them (`Placement::take_drops`): the model lets each read as missing
//! from then on (a pinned one may stay), and lets a crash bring back the value it was dropped
//! with until the key is written again durably.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};

use kvhoard_engine::device::{CrashMode, MemDevice};
use kvhoard_engine::placement::{BlockInfo, Fifo, Placement, PutPlan, SegmentView};
use kvhoard_engine::{
    CreateOptions, Durability, IoBackend, KeyId, PutOptions, ReadOptions, Store, StoreOptions, WriterConfig,
};
use kvhoard_tests::block;
use proptest::prelude::*;

const SEGMENT: u64 = 1 << 20;
const KEYS: u8 = 12;

/// A value is regenerated from (seed, length).
type Value = (u8, u32);

#[derive(Debug, Clone)]
enum Op {
    Put {
        key: u8,
        value: Value,
        synced: bool,
    },
    PutBatch {
        keys: Vec<u8>,
        value: Value,
    },
    /// A put that names a group: keys of one group are one context to the planner.
    PutGrouped {
        key: u8,
        value: Value,
        group: u8,
    },
    Delete {
        key: u8,
        synced: bool,
    },
    Rename {
        from: u8,
        to: u8,
        synced: bool,
    },
    Get {
        key: u8,
    },
    /// Pins steer reclaim away from the oldest segment: nothing a read sees may change.
    Pin {
        key: u8,
    },
    Unpin {
        key: u8,
    },
    List,
    /// Cleans one segment now (placement keeps what it keeps, the rest is dropped).
    Clean,
    /// Cleans one segment now, with these operations run once the cleaning has planned what to
    /// keep and before it writes any of it: a client's writes racing a background cleaning.
    CleanAround(Vec<Op>),
    Reopen,
    Crash(CrashMode),
    /// A crash (a clean close on a volume file) that also loses checkpoints: on the device, the
    /// slots the mask names (1: slot 0, 2: slot 1, 3: both; open then falls back on the other
    /// one, older or newer), on a volume file the file. The log alone, or an older checkpoint,
    /// must give no key an older version or bring back a deleted one, though any key may become
    /// a miss (a segment reclaimed ahead of an older one voids the keys written before it).
    LoseCheckpoint(CrashMode, u8),
    /// A crash in the middle of an operation (a write, a delete, a rename or a cleaning): just
    /// before the device's `at`-th write or sync after it began (at its end if it made fewer),
    /// losing the checkpoint slots `slots` names as [`Op::LoseCheckpoint`] does (0: none). The
    /// image must pass fsck; each key the operation touched may read as before it or as after
    /// it, any other as a crash between operations allows. On a volume of buffered writes
    /// ([`Setup::buffered`]) the process was killed while that write had copied its first `cut`
    /// units, which stay. On a volume file the operation runs whole.
    CrashDuring {
        op: Box<Op>,
        at: u16,
        mode: CrashMode,
        slots: u8,
        cut: u16,
    },
    /// A crash in `first`, then another in the middle of the open that recovers from it (just
    /// before its `at`-th device write or sync), in `then`: what recovery writes (seals,
    /// rebuilt headers, erased stale headers, checkpoints) must leave a volume that passes fsck
    /// and opens to what the first crash allows. `cut` as for [`Op::CrashDuring`].
    CrashInRecovery {
        first: CrashMode,
        at: u16,
        then: CrashMode,
        cut: u16,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let value = small_value();
    prop_oneof![
        6 => (0..KEYS, value.clone(), any::<bool>()).prop_map(|(key, value, synced)| Op::Put { key, value, synced }),
        1 => (proptest::collection::vec(0..KEYS, 1..5), value.clone()).prop_map(|(keys, value)| Op::PutBatch { keys, value }),
        3 => (0..KEYS, value, 0..3u8).prop_map(|(key, value, group)| Op::PutGrouped { key, value, group }),
        2 => (0..KEYS, any::<bool>()).prop_map(|(key, synced)| Op::Delete { key, synced }),
        2 => (0..KEYS, 0..KEYS, any::<bool>()).prop_map(|(from, to, synced)| Op::Rename { from, to, synced }),
        4 => (0..KEYS).prop_map(|key| Op::Get { key }),
        1 => (0..KEYS).prop_map(|key| Op::Pin { key }),
        1 => (0..KEYS).prop_map(|key| Op::Unpin { key }),
        1 => Just(Op::List),
        1 => Just(Op::Clean),
        1 => proptest::collection::vec(op_racing(small_value()), 1..4).prop_map(Op::CleanAround),
        1 => Just(Op::Reopen),
        1 => crash_mode().prop_map(Op::Crash),
        1 => (crash_mode(), 1..4u8).prop_map(|(mode, slots)| Op::LoseCheckpoint(mode, slots)),
        1 => crash_during(op_racing(small_value())),
        1 => crash_in_recovery(),
    ]
}

/// [`Op::CrashDuring`] of one of `ops` or of a cleaning, at a write or sync early in it or
/// anywhere.
fn crash_during(ops: impl Strategy<Value = Op>) -> impl Strategy<Value = Op> {
    let batch = (proptest::collection::vec(0..KEYS, 1..5), small_value())
        .prop_map(|(keys, value)| Op::PutBatch { keys, value });
    let op = prop_oneof![3 => ops, 1 => batch, 2 => Just(Op::Clean)];
    (op, prop_oneof![0..8u16, 0..160u16], crash_mode(), prop_oneof![2 => Just(0u8), 1 => 1..4u8], cut())
        .prop_map(|(op, at, mode, slots, cut)| Op::CrashDuring { op: Box::new(op), at, mode, slots, cut })
}

fn crash_in_recovery() -> impl Strategy<Value = Op> {
    (crash_mode(), prop_oneof![0..4u16, 0..24u16], crash_mode(), cut())
        .prop_map(|(first, at, then, cut)| Op::CrashInRecovery { first, at, then, cut })
}

/// How much of the write under way a killed process left ([`Op::CrashDuring`]): nothing, its
/// first unit or a few (a header, a header and some payload), or any part of a large record.
fn cut() -> impl Strategy<Value = u16> {
    prop_oneof![Just(0u16), 1..4u16, 0..40u16]
}

fn crash_mode() -> impl Strategy<Value = CrashMode> {
    prop_oneof![Just(CrashMode::KeepAll), Just(CrashMode::DropAll), any::<u64>().prop_map(CrashMode::Random)]
}

/// Values of up to 150 KB. Empty blocks are all alike whatever the seed: give them one seed. A
/// quarter of the values come from a pool of three, so that keys often share their bytes (links).
fn small_value() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![
        3 => (any::<u8>(), prop_oneof![Just(0u32), 1u32..5000, 5000u32..150_000]).prop_map(|(seed, len)| {
            if len == 0 {
                (0, 0)
            } else {
                (seed, len)
            }
        }),
        1 => (0u8..3).prop_map(|seed| (seed, 70_000u32)),
    ]
}

/// Values of 150-300 KB, a quarter from a pool of three.
fn large_value() -> impl Strategy<Value = Value> + Clone {
    prop_oneof![3 => (any::<u8>(), 150_000u32..300_000), 1 => (0u8..3).prop_map(|seed| (seed, 200_000u32))]
}

/// What a client may do while a cleaning runs ([`Op::CleanAround`]): write the keys whose
/// records it is relocating (again, with bytes other keys share, or deleted), rename them, read.
fn op_racing(value: impl Strategy<Value = Value> + Clone) -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0..KEYS, value.clone(), any::<bool>()).prop_map(|(key, value, synced)| Op::Put { key, value, synced }),
        1 => (0..KEYS, value, 0..3u8).prop_map(|(key, value, group)| Op::PutGrouped { key, value, group }),
        2 => (0..KEYS, any::<bool>()).prop_map(|(key, synced)| Op::Delete { key, synced }),
        1 => (0..KEYS, 0..KEYS, any::<bool>()).prop_map(|(from, to, synced)| Op::Rename { from, to, synced }),
        1 => (0..KEYS).prop_map(|key| Op::Get { key }),
    ]
}

/// Operations that fill a small volume: large puts, many pins.
fn op_filling() -> impl Strategy<Value = Op> {
    let value = large_value();
    prop_oneof![
        4 => (0..KEYS, value.clone(), any::<bool>()).prop_map(|(key, value, synced)| Op::Put { key, value, synced }),
        2 => (0..KEYS, value, 0..3u8).prop_map(|(key, value, group)| Op::PutGrouped { key, value, group }),
        3 => (0..KEYS).prop_map(|key| Op::Pin { key }),
        1 => (0..KEYS).prop_map(|key| Op::Unpin { key }),
        3 => (0..KEYS).prop_map(|key| Op::Get { key }),
        1 => (0..KEYS, any::<bool>()).prop_map(|(key, synced)| Op::Delete { key, synced }),
        1 => Just(Op::List),
        2 => Just(Op::Clean),
        1 => proptest::collection::vec(op_racing(large_value()), 1..4).prop_map(Op::CleanAround),
        1 => Just(Op::Reopen),
        1 => crash_mode().prop_map(Op::Crash),
        1 => (crash_mode(), 1..4u8).prop_map(|(mode, slots)| Op::LoseCheckpoint(mode, slots)),
        1 => crash_during(op_racing(large_value())),
        1 => crash_in_recovery(),
    ]
}

/// A placement (the baseline, LRU or the planner), recording the keys reclaim and cleaning drop,
/// and those the planner drops. Cleaning runs only when the test asks (`Op::Clean`), never in
/// the background, so that drops happen at known points.
#[derive(Debug)]
struct Recording {
    inner: Arc<dyn Placement>,
    /// A codec the blocks `inner` keeps are written again in by cleaning, those of even length:
    /// a lossless one, so that what a read returns stays the same.
    recompress: Option<kvhoard_engine::CodecSpec>,
    dropped: Mutex<Vec<KeyId>>,
    /// Keys the planner handed to the store to remove.
    planned: Mutex<Vec<KeyId>>,
}

impl Recording {
    fn over(inner: Arc<dyn Placement>) -> Recording {
        Recording { inner, recompress: None, dropped: Mutex::default(), planned: Mutex::default() }
    }
}

impl Default for Recording {
    fn default() -> Self {
        Recording::over(Arc::new(Fifo))
    }
}

impl Placement for Recording {
    fn on_put(&self, block: &BlockInfo<'_>) -> PutPlan {
        self.inner.on_put(block)
    }

    fn on_load(&self, block: &BlockInfo<'_>) -> bool {
        self.inner.on_load(block)
    }

    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        self.inner.victim(candidates)
    }

    fn dropped(&self, keys: &[KeyId]) {
        self.dropped.lock().unwrap().extend_from_slice(keys);
        self.inner.dropped(keys);
    }

    fn keep(&self, block: &kvhoard_engine::placement::LiveBlock<'_>) -> kvhoard_engine::placement::Keep {
        use kvhoard_engine::placement::Keep;
        match (self.inner.keep(block), self.recompress) {
            (Keep::Relocate, Some(spec)) if block.raw_bytes.is_multiple_of(2) => Keep::Recompress(spec),
            (keep, _) => keep,
        }
    }

    fn on_hit(&self, block: &BlockInfo<'_>) {
        self.inner.on_hit(block);
    }

    fn codec_at_put(&self, block: &BlockInfo<'_>) -> Option<kvhoard_engine::CodecSpec> {
        self.inner.codec_at_put(block)
    }

    fn located(&self, key: KeyId, context: u64, record: Option<kvhoard_engine::Loc>) {
        self.inner.located(key, context, record);
    }

    fn take_drops(&self) -> Vec<(KeyId, kvhoard_engine::Loc)> {
        let keys = self.inner.take_drops();
        self.planned.lock().unwrap().extend(keys.iter().map(|(k, _)| *k));
        keys
    }
}

impl Recording {
    /// The model keys reclaim and cleaning dropped since the last call.
    fn take(&self) -> Vec<u8> {
        model_keys(self.dropped.lock().unwrap().drain(..))
    }

    /// The model keys the planner had the store remove since the last call.
    fn take_planned(&self) -> Vec<u8> {
        model_keys(self.planned.lock().unwrap().drain(..))
    }
}

/// The model's keys among `ids`, each once.
fn model_keys(ids: impl Iterator<Item = KeyId>) -> Vec<u8> {
    let names: HashMap<KeyId, u8> = (0..KEYS).map(|k| (KeyId::new("default", &format!("key-{k}")), k)).collect();
    let mut keys: Vec<u8> = ids.filter_map(|id| names.get(&id).copied()).collect();
    keys.sort_unstable();
    keys.dedup();
    keys
}

/// What the store may hold for each key.
#[derive(Debug, Default, Clone)]
struct Model {
    /// The value every read must see now.
    current: BTreeMap<u8, Option<Value>>,
    /// The value as of the last point everything was synced.
    durable: BTreeMap<u8, Option<Value>>,
    /// Values written since then: after a crash that drops unsynced writes, any of them.
    since_sync: BTreeMap<u8, Vec<Option<Value>>>,
    /// Keys reclaim dropped during an operation that also wrote them after the drop may have
    /// happened (a batch, a rename): the next read may find the new value or nothing.
    maybe_dropped: BTreeSet<u8>,
    /// Keys the planner dropped since they were last read: the next read may find nothing (or,
    /// pinned, the value).
    planner_dropped: BTreeSet<u8>,
    /// Per key, the values the planner dropped it with since it was last written: a crash may
    /// bring one back (nothing was written for the drop), or find nothing.
    resurrect: BTreeMap<u8, BTreeSet<Value>>,
    /// Per key, values the planner dropped it with before a write of it that is not durable
    /// yet: a crash that loses that write may bring one back.
    resurrect_unsynced: BTreeMap<u8, BTreeSet<Value>>,
    /// Per key, the values reclaim dropped it with since it was last written: without a
    /// checkpoint, the log alone may bring one back (an eviction undone, never an older version).
    evicted: BTreeMap<u8, BTreeSet<Value>>,
    /// Per key, values reclaim dropped it with before a write of it that is not durable yet.
    evicted_unsynced: BTreeMap<u8, BTreeSet<Value>>,
    /// The reads that follow a crash (of any kind) are going on.
    crashed: bool,
    /// The reads that follow an open that lost its checkpoints are going on: a key reclaim
    /// dropped may be found again, and a key whose newest record is a link may be a miss (the
    /// link replayed before its bytes' one record).
    lost_checkpoint: bool,
    /// That open voided keys (`RecoveryReport::keys_voided`): any key may be a miss.
    voided: bool,
    /// Values some key holds through a link: put while another key held the same bytes, or
    /// renamed.
    linked: BTreeSet<Value>,
    /// Per key, what an operation a crash interrupted may have left it with (its new value, or
    /// nothing where it deleted, renamed away or dropped the key), besides what it held before.
    in_flight: BTreeMap<u8, BTreeSet<Option<Value>>>,
    /// Per key, how many times reclaim dropped it.
    drops: BTreeMap<u8, u32>,
}

impl Model {
    /// Reclaim dropped `key`: gone for good, whatever a crash does later (reclaim makes the drop
    /// durable before it returns).
    fn dropped(&mut self, key: u8) {
        *self.drops.entry(key).or_default() += 1;
        if let Some(v) = self.current.get(&key).copied().flatten() {
            self.evicted.entry(key).or_default().insert(v);
        }
        self.current.insert(key, None);
        self.durable.insert(key, None);
        self.since_sync.remove(&key);
    }

    fn write(&mut self, key: u8, v: Option<Value>, synced: bool) {
        if let Some(v) = v {
            if self.current.iter().any(|(k, held)| *k != key && *held == Some(v)) {
                self.linked.insert(v);
            }
        }
        self.current.insert(key, v);
        self.since_sync.entry(key).or_default().push(v);
        // The write supersedes what the planner dropped before it, once it is durable.
        self.planner_dropped.remove(&key);
        if let Some(before) = self.resurrect.remove(&key) {
            self.resurrect_unsynced.entry(key).or_default().extend(before);
        }
        if let Some(before) = self.evicted.remove(&key) {
            self.evicted_unsynced.entry(key).or_default().extend(before);
        }
        if synced {
            self.synced();
        }
    }

    /// The planner had the store remove `key` (after the operation's own writes).
    fn planner_dropped(&mut self, key: u8) {
        self.planner_dropped.insert(key);
        if let Some(v) = self.current.get(&key).copied().flatten() {
            self.resurrect.entry(key).or_default().insert(v);
        }
    }

    /// After the reads that follow a crash in `mode`: what the store holds is durable now. A
    /// write the crash may have lost no longer hides the values a key was dropped with before
    /// it (the read cannot always tell: a lost delete reads as a kept one), so they stay
    /// possible for the next crash or lost checkpoint.
    fn recovered(&mut self, mode: CrashMode) {
        if mode != CrashMode::KeepAll {
            for (key, values) in std::mem::take(&mut self.resurrect_unsynced) {
                self.resurrect.entry(key).or_default().extend(values);
            }
            for (key, values) in std::mem::take(&mut self.evicted_unsynced) {
                self.evicted.entry(key).or_default().extend(values);
            }
        }
        self.synced();
    }

    /// The model as of just before an operation (`self`) that a crash interrupted, `after`
    /// being the model once it ran whole: each key it touched may read as either. What it
    /// dropped stays possible for later crashes and lost checkpoints.
    fn interrupted(mut self, after: &Model) -> Model {
        for key in 0..KEYS {
            let mut left: BTreeSet<Option<Value>> = BTreeSet::new();
            let now = after.current.get(&key).copied().flatten();
            if now != self.current.get(&key).copied().flatten() {
                left.insert(now);
            }
            let before = self.since_sync.get(&key).map_or(0, Vec::len);
            left.extend(after.since_sync.get(&key).into_iter().flat_map(|w| w.iter().skip(before)).copied());
            let planner_dropped = after.planner_dropped.contains(&key) && !self.planner_dropped.contains(&key);
            let reclaimed = after.drops.get(&key) != self.drops.get(&key);
            if after.maybe_dropped.contains(&key) || planner_dropped || reclaimed {
                left.insert(None);
            }
            if !left.is_empty() {
                self.in_flight.insert(key, left);
            }
        }
        for (mine, theirs) in [
            (&mut self.evicted, &after.evicted),
            (&mut self.evicted_unsynced, &after.evicted_unsynced),
            (&mut self.resurrect, &after.resurrect),
            (&mut self.resurrect_unsynced, &after.resurrect_unsynced),
        ] {
            for (key, values) in theirs {
                mine.entry(*key).or_default().extend(values);
            }
        }
        self.linked.extend(&after.linked);
        self.drops.clone_from(&after.drops);
        self
    }

    fn synced(&mut self) {
        self.durable = self.current.clone();
        self.since_sync.clear();
        self.resurrect_unsynced.clear();
        self.evicted_unsynced.clear();
    }

    /// Checks the bytes read against what the model allows and adopts the value they are.
    fn observe(&mut self, key: u8, got: Option<Vec<u8>>, after_crash: bool) -> Result<(), TestCaseError> {
        let now = self.current.get(&key).copied().flatten();
        let mut allowed: BTreeSet<Option<Value>> = BTreeSet::from([now]);
        if after_crash {
            allowed.insert(self.durable.get(&key).copied().flatten());
            allowed.extend(self.since_sync.get(&key).into_iter().flatten().copied());
        }
        if self.maybe_dropped.remove(&key) || self.voided {
            allowed.insert(None);
        }
        let left = self.in_flight.remove(&key).unwrap_or_default();
        allowed.extend(left.iter().copied());
        let planned = self.planner_dropped.remove(&key);
        if planned {
            allowed.insert(None);
        }
        if after_crash || self.crashed {
            // Dropped by the planner with nothing written: a crash may bring back the value it
            // was dropped with, or, when the crash lost the writes after it, one dropped before.
            let mut back: BTreeSet<Value> = self.resurrect.get(&key).cloned().unwrap_or_default();
            if after_crash {
                back.extend(self.resurrect_unsynced.get(&key).into_iter().flatten().copied());
            }
            if self.lost_checkpoint {
                back.extend(self.evicted.get(&key).into_iter().flatten().copied());
                if after_crash {
                    back.extend(self.evicted_unsynced.get(&key).into_iter().flatten().copied());
                }
            }
            if !back.is_empty() {
                allowed.insert(None);
                allowed.extend(back.into_iter().map(Some));
            }
        }
        if self.lost_checkpoint && allowed.iter().flatten().any(|v| self.linked.contains(v)) {
            allowed.insert(None);
        }
        // Compare bytes, not seeds: different seeds can give identical short blocks.
        let matched = allowed.iter().copied().find(|v| match (v, &got) {
            (None, None) => true,
            (Some(v), Some(bytes)) => value_bytes(*v) == *bytes,
            _ => false,
        });
        let Some(value) = matched else {
            if std::env::var_os("KVHOARD_MODEL_TRACE").is_some() {
                eprintln!("FAILED key {key}");
            }
            return Err(TestCaseError::fail(format!(
                "key {key}: read {:?}, allowed {allowed:?}",
                got.map(|b| (b.len(), b.get(..8).map(<[u8]>::to_vec)))
            )));
        };
        if value.is_none() && now.is_some() && !after_crash && !planned && !left.contains(&None) {
            // Dropped by reclaim during the operation that wrote it: gone for good.
            self.dropped(key);
        }
        if after_crash && value.is_some() && self.since_sync.get(&key).is_some_and(|w| w.contains(&value)) {
            // A write of the key since the last sync survived the crash: what it superseded
            // stays superseded. (A surviving delete reads as a lost one: that case stays open.)
            self.resurrect_unsynced.remove(&key);
            self.evicted_unsynced.remove(&key);
        }
        self.current.insert(key, value);
        Ok(())
    }
}

fn value_bytes((seed, len): Value) -> Vec<u8> {
    // Every other 64 bytes the same: half of each value compresses, for cleaning's lossless
    // recompression ([`Setup::recompress`]).
    let mut bytes = block(u64::from(seed), len as usize);
    bytes.chunks_mut(64).step_by(2).for_each(|c| c.fill(seed));
    bytes
}

/// Reads `key` with `get` and with `get_into` (into an aligned buffer, so large values are read
/// straight into it); both must agree.
fn read(store: &Store, key: u8) -> Result<Option<Vec<u8>>, TestCaseError> {
    let name = format!("key-{key}");
    let opts = ReadOptions { verify_hash: true };
    let got = store.get("default", &name, opts).map_err(|e| TestCaseError::fail(e.to_string()))?.map(|b| b.to_vec());
    let mut buf = kvhoard_engine::AlignedBuf::zeroed(320 * 1024);
    let into = store.get_into("default", &name, &mut buf, opts).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let into = into.map(|(_, n)| buf[..n].to_vec());
    if into != got {
        return Err(TestCaseError::fail(format!("key {key}: get_into and get disagree")));
    }
    Ok(got)
}

/// Where the volume lives.
#[derive(Debug, Clone, Copy)]
enum Backend {
    Memory,
    File(IoBackend),
}

/// The volume under test: a memory device, or a directory on the test's file system.
enum Volume {
    Memory(Arc<MemDevice>),
    File(tempfile::TempDir),
}

impl Volume {
    fn open(&self, opts: &StoreOptions) -> kvhoard_engine::Result<Store> {
        match self {
            Volume::Memory(dev) => Store::open_on(dev.clone(), opts.clone()),
            Volume::File(dir) => Store::open(dir.path(), opts.clone()),
        }
    }
}

/// The placement planner over one form (as put) and "dropped", keeping `budget` bytes: each key
/// is a context of its own (no groups), dropped whole when puts go over the budget.
fn planner(budget: u64, now: &Arc<std::sync::atomic::AtomicU64>) -> Arc<dyn Placement> {
    use kvhoard_engine::placement::load_model::LoadModel;
    use kvhoard_engine::placement::planner::{DramChoice, PlannerConfig, StoreOption};
    use kvhoard_engine::placement::{Planned, PlannedConfig};
    let config = PlannedConfig {
        planner: PlannerConfig {
            alpha: 0.05,
            half_life_ms: 60_000,
            budget_bytes: budget,
            options: vec![
                StoreOption { ratio: 1.0, delay_s: 0.01, lossy: false },
                StoreOption { ratio: 0.0, delay_s: 0.02, lossy: false },
            ],
            dram: DramChoice::default(),
        },
        codecs: vec![None],
        quality: vec![1.0, 1.0],
        loads: LoadModel::default(),
    };
    Arc::new(Planned::new(config, kvhoard_engine::Clock::manual(Arc::clone(now))).unwrap())
}

fn run(ops: Vec<Op>) -> Result<(), TestCaseError> {
    run_on(ops, Setup::new(Backend::Memory, 0)).map(drop)
}

/// The volume a case runs on: its backend, DRAM tier, size and checkpoint cadence.
#[derive(Debug, Clone, Copy)]
struct Setup {
    backend: Backend,
    dram_tier_bytes: u64,
    segments: u64,
    checkpoint_every_segments: u32,
    /// LRU placement (cleaning keeps what was read) instead of the baseline.
    lru: bool,
    /// Cleaning writes half the blocks placement keeps again in the lossless codec's form.
    recompress: bool,
    /// The placement planner, with room for this many bytes, instead of the baseline.
    planner_budget: Option<u64>,
    /// Records longer than 16 KiB are split over several writes (their header written last)
    /// instead of written whole, as by default.
    split: bool,
    /// The memory device models buffered I/O: a write under way when the process is killed
    /// may leave a prefix ([`MemDevice::cut_writes`]).
    buffered: bool,
}

impl Setup {
    fn new(backend: Backend, dram_tier_bytes: u64) -> Setup {
        Setup {
            backend,
            dram_tier_bytes,
            segments: 8,
            checkpoint_every_segments: 2,
            lru: false,
            recompress: false,
            planner_budget: None,
            split: true,
            buffered: false,
        }
    }
}

/// Runs `ops` against the store and the model; the store's statistics at the end.
fn run_on(ops: Vec<Op>, setup: Setup) -> Result<kvhoard_engine::Stats, TestCaseError> {
    let Setup {
        backend,
        dram_tier_bytes,
        segments,
        checkpoint_every_segments,
        lru,
        recompress,
        planner_budget,
        split,
        buffered,
    } = setup;
    let create = CreateOptions { capacity_bytes: Some(SEGMENT * segments), segment_size_bytes: SEGMENT };
    // The planner's clock: a second per operation, so that a case repeats exactly.
    let now = Arc::new(std::sync::atomic::AtomicU64::new(1_700_000_000_000));
    let mut recording = match (lru, planner_budget) {
        (_, Some(budget)) => Recording::over(planner(budget, &now)),
        (true, None) => Recording::over(Arc::new(kvhoard_engine::placement::Lru::default())),
        (false, None) => Recording::default(),
    };
    recording.recompress = recompress.then(|| kvhoard_engine::CodecSpec::lossless(1));
    let recording = Arc::new(recording);
    let mut opts = StoreOptions {
        checkpoint_every_segments,
        dram_tier_bytes,
        placement: recording.clone(),
        // Little room in flight and small writes: puts wait for room, records are joined into
        // writes and large ones split (unless the case writes them whole).
        writer: WriterConfig {
            in_flight_bytes: 96 << 10,
            request_bytes: 16 << 10,
            split_bytes: if split { 16 << 10 } else { WriterConfig::default().split_bytes },
        },
        ..StoreOptions::default()
    };
    let (mut volume, mut store) = match backend {
        Backend::Memory => {
            let dev = MemDevice::new(SEGMENT * segments);
            let dev = Arc::new(if buffered { dev.cut_writes() } else { dev });
            let create = CreateOptions { capacity_bytes: None, ..create };
            let store = Store::create_on(dev.clone(), &create, opts.clone()).map_err(fail)?;
            (Volume::Memory(dev), store)
        }
        Backend::File(io_backend) => {
            opts.io_backend = io_backend;
            let dir =
                tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let store = Store::create(dir.path(), &create, opts.clone()).map_err(fail)?;
            (Volume::File(dir), store)
        }
    };
    let mut model = Model::default();
    let trace = std::env::var_os("KVHOARD_MODEL_TRACE").is_some();
    if trace {
        eprintln!("RUN");
    }
    for op in ops {
        if trace {
            eprintln!("OP {op:?}");
        }
        now.fetch_add(1_000, std::sync::atomic::Ordering::Relaxed);
        match op {
            Op::Clean => clean(&store, &mut model, &recording, Vec::new())?,
            Op::CleanAround(between) => clean(&store, &mut model, &recording, between)?,
            Op::List => {
                let listed: BTreeSet<String> =
                    store.list("default", None, 1000).map_err(fail)?.entries.into_iter().map(|e| e.key).collect();
                let live: BTreeSet<String> =
                    model.current.iter().filter(|(_, v)| v.is_some()).map(|(k, _)| format!("key-{k}")).collect();
                let unsure: BTreeSet<String> =
                    model.maybe_dropped.iter().chain(&model.planner_dropped).map(|k| format!("key-{k}")).collect();
                prop_assert!(listed.is_subset(&live), "listed {listed:?} but live {live:?}");
                let missing: BTreeSet<&String> = live.difference(&listed).filter(|k| !unsure.contains(*k)).collect();
                prop_assert!(missing.is_empty(), "live keys {missing:?} are not listed");
            }
            Op::LoseCheckpoint(mode, slots) => {
                let (mode, all) = match volume {
                    Volume::Memory(dev) => {
                        let crashed = dev.crash(mode);
                        lose_checkpoints(&crashed, &store, slots)?;
                        drop(store);
                        volume = Volume::Memory(Arc::new(crashed));
                        (mode, slots == 3)
                    }
                    Volume::File(ref dir) => {
                        // A process crash keeps what was written, as a clean close does.
                        store.close().map_err(fail)?;
                        drop(store);
                        std::fs::remove_file(dir.path().join(kvhoard_engine::CHECKPOINT_FILE))
                            .map_err(|e| TestCaseError::fail(e.to_string()))?;
                        (CrashMode::KeepAll, true)
                    }
                };
                store = volume.open(&opts).map_err(fail)?;
                if trace {
                    eprintln!("OPENED {:?} {:?}", store.recovery_report(), store.superblock().freed_ahead);
                }
                if all {
                    prop_assert_eq!(store.recovery_report().checkpoint_seq, None);
                }
                read_after_crash(&store, &mut model, mode, true)?;
            }
            // On a volume file a process crash keeps what was written, as a clean reopen does.
            Op::Reopen | Op::Crash(_) if !matches!((&op, &volume), (Op::Crash(_), Volume::Memory(_))) => {
                store.close().map_err(fail)?;
                drop(store);
                store = volume.open(&opts).map_err(fail)?;
                if trace {
                    eprintln!("OPENED {:?} {:?}", store.recovery_report(), store.superblock().freed_ahead);
                }
                model.synced();
                for key in 0..KEYS {
                    let got = read(&store, key)?;
                    model.observe(key, got, false)?;
                }
            }
            Op::CrashDuring { op, at, mode, slots, cut } => {
                let Volume::Memory(dev) = &volume else {
                    // A volume file's crash is a reopen: nothing can stop in the middle.
                    run_whole(*op, &store, &mut model, &recording)?;
                    continue;
                };
                let before = model.clone();
                dev.mark_after(u64::from(at));
                run_whole(*op, &store, &mut model, &recording)?;
                let crashed = dev.crash_in_marked_write(mode, u64::from(cut));
                lose_checkpoints(&crashed, &store, slots)?;
                drop(store);
                fsck_crashed(&crashed)?;
                model = before.interrupted(&model);
                volume = Volume::Memory(Arc::new(crashed));
                store = volume.open(&opts).map_err(fail)?;
                if trace {
                    eprintln!("OPENED {:?} {:?}", store.recovery_report(), store.superblock().freed_ahead);
                }
                if slots == 3 {
                    prop_assert_eq!(store.recovery_report().checkpoint_seq, None);
                }
                read_after_crash(&store, &mut model, mode, slots != 0)?;
            }
            Op::CrashInRecovery { first, at, then, cut } => {
                let Volume::Memory(dev) = &volume else {
                    // A volume file's crash is a reopen, and its open cannot be stopped halfway.
                    store.close().map_err(fail)?;
                    drop(store);
                    store = volume.open(&opts).map_err(fail)?;
                    model.synced();
                    for key in 0..KEYS {
                        let got = read(&store, key)?;
                        model.observe(key, got, false)?;
                    }
                    continue;
                };
                let crashed = Arc::new(dev.crash(first));
                drop(store);
                crashed.mark_after(u64::from(at));
                let recovering = Store::open_on(crashed.clone(), opts.clone()).map_err(fail)?;
                let image = crashed.crash_in_marked_write(then, u64::from(cut));
                drop(recovering);
                fsck_crashed(&image)?;
                volume = Volume::Memory(Arc::new(image));
                store = volume.open(&opts).map_err(fail)?;
                if trace {
                    eprintln!("OPENED {:?} {:?}", store.recovery_report(), store.superblock().freed_ahead);
                }
                // The second crash may lose what recovery wrote, not more than the first allows.
                let mode = if first == CrashMode::KeepAll { then } else { first };
                read_after_crash(&store, &mut model, mode, false)?;
            }
            Op::Reopen => unreachable!("reopened above"),
            Op::Crash(mode) => {
                let Volume::Memory(dev) = &volume else { unreachable!("file volumes reopen above") };
                let crashed = Arc::new(dev.crash(mode));
                // The old store closes against the old device; the crashed image is unaffected.
                drop(store);
                fsck_crashed(&crashed)?;
                volume = Volume::Memory(crashed);
                store = volume.open(&opts).map_err(fail)?;
                if trace {
                    eprintln!("OPENED {:?} {:?}", store.recovery_report(), store.superblock().freed_ahead);
                }
                read_after_crash(&store, &mut model, mode, false)?;
            }
            op => apply(op, &store, &mut model, &recording)?,
        }
        settle(&mut model, &recording)?;
    }
    let stats = store.stats();
    prop_assert_eq!(stats.read_errors, 0);
    Ok(stats)
}

/// Reads every key after an open that followed a crash in `mode` (that also lost checkpoints,
/// if `lost`), checks each against the model, and takes what the store holds as durable.
fn read_after_crash(store: &Store, model: &mut Model, mode: CrashMode, lost: bool) -> Result<(), TestCaseError> {
    model.crashed = true;
    model.lost_checkpoint = lost;
    model.voided = lost && store.recovery_report().keys_voided > 0;
    for key in 0..KEYS {
        let got = read(store, key)?;
        model.observe(key, got, mode != CrashMode::KeepAll)?;
    }
    model.crashed = false;
    model.lost_checkpoint = false;
    model.voided = false;
    model.recovered(mode);
    prop_assert_eq!(store.stats().read_errors, 0);
    Ok(())
}

/// fsck of the image a crash left: nothing worse than what a crash leaves (a stale checkpoint,
/// unsealed segments), no error.
fn fsck_crashed(image: &MemDevice) -> Result<(), TestCaseError> {
    use kvhoard_engine::check::{check_device, ScanOptions, Severity};
    let report = check_device(image, ScanOptions { deep: true, summaries_only: false })
        .map_err(|e| TestCaseError::fail(format!("fsck of the crashed image: {e}")))?;
    let errors: Vec<String> = report
        .problems
        .iter()
        .filter(|p| p.severity >= Severity::Error)
        .map(|p| format!("{}: {}", p.kind, p.detail))
        .collect();
    prop_assert!(errors.is_empty(), "fsck of the image a crash left found {:?}", errors);
    Ok(())
}

/// Zeroes the checkpoint slots `slots` names (1: slot 0, 2: slot 1, 3: both) on `crashed`, a
/// crashed image of `store`'s device.
fn lose_checkpoints(crashed: &MemDevice, store: &Store, slots: u8) -> Result<(), TestCaseError> {
    use kvhoard_engine::device::BlockDevice;
    let sb = store.superblock();
    let zeros = kvhoard_engine::AlignedBuf::zeroed(sb.checkpoint_slot_bytes as usize);
    for slot in (0..2u64).filter(|s| slots & (1 << s) != 0) {
        crashed
            .write_at(&zeros, sb.checkpoint_offset + slot * sb.checkpoint_slot_bytes)
            .and_then(|()| crashed.sync())
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
    }
    Ok(())
}

/// Runs a write, a read or a cleaning whole, and settles the model after it.
fn run_whole(op: Op, store: &Store, model: &mut Model, recording: &Recording) -> Result<(), TestCaseError> {
    match op {
        Op::Clean => clean(store, model, recording, Vec::new()),
        op => apply(op, store, model, recording),
    }?;
    settle(model, recording)
}

/// After an operation: the keys the planner had the store remove during it, after its writes;
/// and nothing but reclaim drops keys, and reclaim only runs while a write reserves space.
fn settle(model: &mut Model, recording: &Recording) -> Result<(), TestCaseError> {
    recording.take_planned().into_iter().for_each(|k| model.planner_dropped(k));
    prop_assert!(recording.take().is_empty(), "keys dropped outside a write");
    Ok(())
}

/// Cleans one segment now, running `between` once the cleaning has planned what to keep and
/// before it writes any of it.
fn clean(store: &Store, model: &mut Model, recording: &Recording, between: Vec<Op>) -> Result<(), TestCaseError> {
    let mut between = Some(between);
    let mut raced = Ok(());
    let cleaned = store.clean_now_around(|_| {
        raced = between.take().into_iter().flatten().try_for_each(|op| {
            apply(op, store, model, recording)?;
            settle(model, recording)
        });
    });
    raced?;
    let cleaned = cleaned.map_err(fail)?;
    // Relocating rewrites kept blocks unchanged; freeing the segment syncs, so everything
    // written before is durable (the operations in between too). What it did not keep is gone
    // for good.
    recording.take().into_iter().for_each(|k| model.dropped(k));
    if cleaned.is_some() {
        model.synced();
    }
    // No cleaning to run them in (too few sealed segments): they run after, all the same.
    for op in between.into_iter().flatten() {
        apply(op, store, model, recording)?;
        settle(model, recording)?;
    }
    Ok(())
}

fn fail(e: kvhoard_engine::StoreError) -> TestCaseError {
    TestCaseError::fail(e.to_string())
}

/// One operation that writes or reads through `store` (not one that cleans, reopens or
/// crashes), checked against and applied to `model`.
fn apply(op: Op, store: &Store, model: &mut Model, recording: &Recording) -> Result<(), TestCaseError> {
    // Keys reclaim dropped during the operation. A single put or delete reclaims before it
    // writes anything, so its own key's drop is of the old value; a batch or a rename may
    // reclaim between its records, so the keys it wrote may have lost their new value.
    let dropped_first = |model: &mut Model| recording.take().into_iter().for_each(|k| model.dropped(k));
    match op {
        Op::Put { key, value, synced } => {
            let durability = if synced { Durability::Synced } else { Durability::Written };
            store
                .put(
                    "default",
                    &format!("key-{key}"),
                    &value_bytes(value),
                    &PutOptions { durability, ..PutOptions::default() },
                )
                .map_err(fail)?;
            dropped_first(model);
            model.write(key, Some(value), synced);
        }
        Op::PutGrouped { key, value, group } => {
            let opts = PutOptions { group: Some(u64::from(group)), ..PutOptions::default() };
            store.put("default", &format!("key-{key}"), &value_bytes(value), &opts).map_err(fail)?;
            dropped_first(model);
            model.write(key, Some(value), false);
        }
        Op::PutBatch { keys, value } => {
            let names: Vec<String> = keys.iter().map(|k| format!("key-{k}")).collect();
            let bytes = value_bytes(value);
            let items: Vec<(&str, &[u8])> = names.iter().map(|n| (n.as_str(), bytes.as_slice())).collect();
            store
                .put_batch("default", &items, &PutOptions { durability: Durability::Synced, ..PutOptions::default() })
                .map_err(fail)?;
            // Drops first, then the writes; a key dropped late reads as the value or nothing.
            let keys_dropped = recording.take();
            keys_dropped.iter().for_each(|&k| model.dropped(k));
            keys.iter().for_each(|&k| model.write(k, Some(value), false));
            model.synced();
            model.maybe_dropped.extend(keys_dropped.iter().filter(|k| keys.contains(k)));
        }
        Op::Delete { key, synced } => {
            let durability = if synced { Durability::Synced } else { Durability::Written };
            let existed = store.delete("default", &format!("key-{key}"), durability).map_err(fail)?;
            dropped_first(model);
            let expected = model.current.get(&key).copied().flatten().is_some();
            // A key the planner dropped may be gone (or, pinned, still there).
            let unsure = model.planner_dropped.remove(&key);
            prop_assert!(
                existed == expected || (unsure && expected && !existed),
                "delete of key-{} said it existed: {}",
                key,
                existed
            );
            // Every delete writes its tombstone, a missing key's too: synced, it is durable.
            model.write(key, None, synced);
        }
        Op::Rename { from, to, synced } => {
            let durability = if synced { Durability::Synced } else { Durability::Written };
            let existed =
                store.rename("default", &format!("key-{from}"), &format!("key-{to}"), durability).map_err(fail)?;
            // What `from` named before the rename (a drop reported now may be of that value,
            // or of the new link to `to` if reclaim ran between the two records).
            let value = model.current.get(&from).copied().flatten();
            let keys_dropped = recording.take();
            let from_dropped_first = keys_dropped.contains(&from) && !existed;
            keys_dropped.iter().for_each(|&k| model.dropped(k));
            // A key the planner dropped may be gone (or, pinned, still there).
            let planner_dropped = model.planner_dropped.remove(&from);
            prop_assert!(
                existed == value.is_some() || from_dropped_first || (planner_dropped && !existed),
                "rename of key-{from}: existed {existed}, model {value:?}"
            );
            if !existed && planner_dropped {
                model.current.insert(from, None);
            }
            if existed && from != to {
                model.write(to, value, false);
                model.write(from, None, synced);
                if keys_dropped.contains(&to) {
                    model.maybe_dropped.insert(to);
                }
            }
        }
        Op::Get { key } => {
            let got = read(store, key)?;
            model.observe(key, got, false)?;
        }
        Op::Pin { key } => {
            let got = read(store, key)?;
            let readable = got.is_some();
            model.observe(key, got, false)?;
            // A pin succeeds exactly when the key can be read.
            let pinned = store.pin("default", &format!("key-{key}")).map_err(fail)?;
            prop_assert_eq!(pinned, readable, "pin of key-{} said {} but a read found {}", key, pinned, readable);
        }
        Op::Unpin { key } => {
            store.unpin("default", &format!("key-{key}")).map_err(fail)?;
        }
        other => unreachable!("not a write or a read: {other:?}"),
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn store_matches_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        split in any::<bool>(),
        buffered in any::<bool>(),
    ) {
        run_on(ops, Setup { split, buffered, ..Setup::new(Backend::Memory, 0) })?;
    }

    /// On a volume of 7 segments filled by large values, with many pins: segments are reclaimed
    /// all the time and pins steer reclaim off the oldest segment, across reopens and crashes.
    /// With a checkpoint at every seal, the newest checkpoint often covers the victim and all
    /// older segments, and reclaim writes none of its own; every second seal, it rarely does.
    #[test]
    fn store_under_reclaim_with_pins_matches_the_model(
        ops in proptest::collection::vec(op_filling(), 1..200),
        checkpoint_every_segments in 1u32..3,
    ) {
        run_on(ops, Setup { segments: 7, checkpoint_every_segments, ..Setup::new(Backend::Memory, 0) })?;
    }

    /// With LRU placement: segments cleaned on demand keep the blocks read since their write
    /// and drop the rest, across reopens and crashes; large values keep the volume full.
    #[test]
    fn store_cleaned_by_lru_matches_the_model(ops in proptest::collection::vec(op_filling(), 1..150), small in any::<bool>()) {
        let ops: Vec<Op> = if small { ops.into_iter().chain([Op::Clean]).collect() } else { ops };
        run_on(ops, Setup { segments: 7, lru: true, ..Setup::new(Backend::Memory, 0) })?;
    }

    /// The same, cleaning writing half the blocks it keeps again in the lossless codec's form:
    /// the bytes read stay the same through recompressions, racing writes and crashes.
    #[test]
    fn store_cleaned_and_recompressed_matches_the_model(ops in proptest::collection::vec(op_filling(), 1..150), small in any::<bool>()) {
        let ops: Vec<Op> = if small { ops.into_iter().chain([Op::Clean]).collect() } else { ops };
        run_on(ops, Setup { segments: 7, lru: true, recompress: true, ..Setup::new(Backend::Memory, 0) })?;
    }

    /// With the placement planner keeping 512 KiB: it drops contexts (keys) at once as puts go
    /// over its budget, across renames, batches, pins, cleaning, reopens and crashes.
    #[test]
    fn store_placed_by_the_planner_matches_the_model(ops in proptest::collection::vec(op(), 1..80)) {
        run_on(ops, Setup { planner_budget: Some(512 << 10), ..Setup::new(Backend::Memory, 0) })?;
    }

    /// The same with large values on a small volume: the planner's drops and reclaim's together.
    #[test]
    fn a_full_volume_placed_by_the_planner_matches_the_model(ops in proptest::collection::vec(op_filling(), 1..150)) {
        run_on(ops, Setup { segments: 7, planner_budget: Some(2 * SEGMENT), ..Setup::new(Backend::Memory, 0) })?;
    }

    /// With a DRAM tier of 256 KiB (evicting) or 8 MiB (holding everything).
    #[test]
    fn store_with_a_dram_tier_matches_the_model(ops in proptest::collection::vec(op(), 1..60), big in any::<bool>()) {
        run_on(ops, Setup::new(Backend::Memory, if big { 8 << 20 } else { 256 << 10 }))?;
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 12, ..ProptestConfig::default() })]

    #[test]
    fn store_on_io_uring_matches_the_model(ops in proptest::collection::vec(op(), 1..40), dram in any::<bool>()) {
        run_on(ops, Setup::new(Backend::File(IoBackend::IoUring), if dram { 256 << 10 } else { 0 }))?;
    }

    #[test]
    fn store_on_pread_matches_the_model(ops in proptest::collection::vec(op(), 1..40), dram in any::<bool>()) {
        run_on(ops, Setup::new(Backend::File(IoBackend::Pread), if dram { 256 << 10 } else { 0 }))?;
    }
}

#[test]
fn overwrite_then_crash_never_returns_a_mix() {
    run(vec![
        Op::Put { key: 1, value: (1, 100_000), synced: true },
        Op::Put { key: 1, value: (2, 100_000), synced: false },
        Op::Crash(CrashMode::Random(7)),
        Op::Get { key: 1 },
    ])
    .unwrap();
}

#[test]
fn a_segment_sealed_at_a_cut_is_not_resumed_in_front_of_stale_records() {
    // Found by the model: a crash left intact records past a torn one; recovery sealed the
    // segment at the cut; resuming it later put new records right in front of the stale ones,
    // and the next crash brought an old version back.
    run(vec![
        Op::Put { key: 0, value: (0, 0), synced: false },
        Op::Reopen,
        Op::Put { key: 0, value: (0, 0), synced: false },
        Op::Put { key: 0, value: (0, 0), synced: false },
        Op::Put { key: 0, value: (0, 4097), synced: false },
        Op::Put { key: 0, value: (0, 1), synced: false },
        Op::Crash(CrashMode::Random(12576434822612919958)),
        Op::Put { key: 0, value: (0, 2), synced: false },
        Op::Put { key: 0, value: (0, 0), synced: true },
        Op::Crash(CrashMode::KeepAll),
    ])
    .unwrap();
}

/// The recompressing setup does recompress: a value read (so LRU keeps it) of even length, in the
/// oldest segment, cleaned (the statistics are the last store's: no crash or reopen here).
#[test]
fn the_recompressing_setup_writes_blocks_in_the_lossless_form() {
    let mut ops = vec![Op::Put { key: 0, value: (5, 200_000), synced: true }, Op::Get { key: 0 }];
    ops.extend((1..KEYS).map(|key| Op::Put { key, value: (key, 250_001), synced: false }));
    ops.extend([Op::Clean, Op::Get { key: 0 }, Op::Clean, Op::Get { key: 0 }, Op::Clean, Op::Get { key: 0 }]);
    let stats = run_on(ops, Setup { segments: 7, lru: true, recompress: true, ..Setup::new(Backend::Memory, 0) })
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(stats.recompressed_records > 0, "{stats:?}");
}

/// Found by the model: a clean close sealed the newest segment use and a cleaning freed it ahead
/// of older ones; with the checkpoint lost, the next use of that segment got the same seq, and
/// its scan took the freed use's records for its own, bringing back a value the planner had
/// dropped and a later put replaced. The superblock's record of that use keeps seqs above it.
#[test]
fn a_lost_checkpoint_never_lets_a_new_use_take_the_seq_of_one_freed_ahead() {
    run_on(
        vec![
            Op::Put { key: 2, value: (0, 150000), synced: false },
            Op::Put { key: 6, value: (0, 150000), synced: false },
            Op::Put { key: 2, value: (0, 150001), synced: false },
            Op::Put { key: 10, value: (0, 212993), synced: false },
            Op::Put { key: 6, value: (1, 200000), synced: false },
            Op::CleanAround(vec![Op::Put { key: 5, value: (0, 290817), synced: false }]),
            Op::Pin { key: 0 },
            Op::PutGrouped { key: 8, value: (0, 237569), group: 1 },
            Op::PutGrouped { key: 5, value: (0, 299009), group: 1 },
            Op::Put { key: 7, value: (0, 180225), synced: true },
            Op::Reopen,
            Op::Put { key: 2, value: (0, 150000), synced: false },
            Op::Pin { key: 0 },
            Op::Crash(CrashMode::DropAll),
            Op::CleanAround(vec![
                Op::Put { key: 5, value: (0, 192553), synced: false },
                Op::PutGrouped { key: 3, value: (0, 256305), group: 1 },
            ]),
            Op::Put { key: 2, value: (0, 238862), synced: false },
            Op::Pin { key: 0 },
            Op::Put { key: 0, value: (0, 217089), synced: false },
            Op::Reopen,
            Op::Clean,
            Op::Put { key: 5, value: (0, 175464), synced: false },
            Op::LoseCheckpoint(CrashMode::KeepAll, 3),
            Op::Clean,
            Op::Put { key: 4, value: (0, 155649), synced: false },
            Op::PutGrouped { key: 0, value: (0, 150001), group: 2 },
            Op::PutGrouped { key: 6, value: (0, 150002), group: 0 },
            Op::PutGrouped { key: 4, value: (0, 200000), group: 2 },
            Op::Reopen,
            Op::Clean,
            Op::LoseCheckpoint(CrashMode::KeepAll, 3),
            Op::Put { key: 0, value: (0, 155649), synced: false },
            Op::Crash(CrashMode::KeepAll),
        ],
        Setup { segments: 7, planner_budget: Some(2 * SEGMENT), ..Setup::new(Backend::Memory, 0) },
    )
    .unwrap();
}

/// Found by the model: a cleaning dropped a key whose newest record was a link in a newer
/// segment, its bytes still stored in an older one; with the checkpoint lost, the log alone
/// gives the key back its newest bytes: an eviction undone, never an older version.
#[test]
fn a_lost_checkpoint_may_undo_an_eviction() {
    run_on(
        vec![
            Op::CleanAround(vec![
                Op::Put { key: 0, value: (0, 188417), synced: false },
                Op::Put { key: 9, value: (1, 200000), synced: false },
            ]),
            Op::Pin { key: 9 },
            Op::Put { key: 9, value: (0, 151553), synced: false },
            Op::PutGrouped { key: 0, value: (0, 282625), group: 0 },
            Op::Put { key: 0, value: (0, 180225), synced: false },
            Op::Put { key: 0, value: (0, 217089), synced: false },
            Op::Put { key: 0, value: (0, 204801), synced: false },
            Op::CleanAround(vec![Op::Put { key: 0, value: (1, 200000), synced: false }]),
            Op::CleanAround(vec![Op::Put { key: 1, value: (0, 196609), synced: false }]),
            Op::Put { key: 0, value: (1, 200000), synced: false },
            Op::Clean,
            Op::LoseCheckpoint(CrashMode::KeepAll, 3),
        ],
        Setup { segments: 7, checkpoint_every_segments: 1, ..Setup::new(Backend::Memory, 0) },
    )
    .unwrap();
}

/// A process crash while a record split over several writes was half written (its first piece,
/// with the header, on the device, the rest not): recovery took the record for damage and made
/// the key a miss, losing the value an earlier put had acknowledged. The header now goes last.
#[test]
fn a_process_crash_inside_a_split_record_keeps_the_value_before_it() {
    run(vec![
        Op::Put { key: 7, value: (0, 0), synced: false },
        Op::CrashDuring {
            op: Box::new(Op::Put { key: 7, value: (0, 30000), synced: false }),
            at: 1,
            mode: CrashMode::KeepAll,
            slots: 0,
            cut: 0,
        },
    ])
    .unwrap();
}

/// A process killed while a buffered write of a record was copying it into the page cache:
/// the record's header and the start of its payload were there, the rest not, and recovery took
/// it for damage and made the key a miss, losing the value before it. On a device whose writes
/// can be cut short, a record's first unit is now written last, once the rest is there (behind
/// a pending unit).
#[test]
fn a_process_killed_in_a_buffered_write_keeps_the_value_before_it() {
    // The put's writes, one part at a time: its pending unit, the rest, then its header.
    for (at, cut) in [(0, 1), (1, 1), (1, 2), (1, 5), (2, 0)] {
        let ops = vec![
            Op::Put { key: 7, value: (0, 0), synced: true },
            Op::CrashDuring {
                op: Box::new(Op::Put { key: 7, value: (1, 30000), synced: false }),
                at,
                mode: CrashMode::KeepAll,
                slots: 0,
                cut,
            },
            Op::Get { key: 7 },
        ];
        run_on(ops, Setup { buffered: true, split: false, ..Setup::new(Backend::Memory, 0) }).unwrap();
    }
}

/// Reclaim freed a segment whose record of a key a newer, unsynced record had superseded: a
/// power loss kept the erasure of its header and lost the newer record, and the key had
/// neither version, though the older one was durable. A segment is now freed only once the
/// records that superseded its records are durable. (Found by the model test; the crash point
/// depends on the background checkpointer, so the case runs a few times.)
#[test]
fn a_segment_is_freed_only_once_what_superseded_its_records_is_durable() {
    let ops = vec![
        Op::Put { key: 3, value: (232, 299420), synced: false },
        Op::PutGrouped { key: 9, value: (139, 201115), group: 2 },
        Op::Put { key: 7, value: (130, 189023), synced: false },
        Op::Put { key: 3, value: (174, 175808), synced: true },
        Op::PutGrouped { key: 9, value: (241, 167589), group: 0 },
        Op::CrashInRecovery {
            first: CrashMode::Random(10901203128529637279),
            at: 0,
            then: CrashMode::Random(11023905837903951795),
            cut: 0,
        },
        Op::PutGrouped { key: 1, value: (54, 245578), group: 2 },
        Op::PutGrouped { key: 9, value: (110, 211410), group: 0 },
        Op::CrashDuring {
            op: Box::new(Op::Clean),
            at: 1,
            mode: CrashMode::Random(18433969436085278447),
            slots: 0,
            cut: 0,
        },
    ];
    let setup = Setup { segments: 7, checkpoint_every_segments: 1, ..Setup::new(Backend::Memory, 0) };
    for _ in 0..8 {
        run_on(ops.clone(), setup).unwrap();
    }
}
