//! The planner applied by the engine: on a volume that cannot hold what is put, contexts read
//! often keep their form while cold ones are recompressed (lossy only where the namespace
//! allows) or dropped, by admission and by cleaning; every read returns the block's own bytes or
//! one of the forms the planner's codecs make of them, never anything else.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvhoard_engine::device::MemDevice;
use kvhoard_engine::placement::load_model::LoadModel;
use kvhoard_engine::placement::planner::{PlannerConfig, StoreOption};
use kvhoard_engine::placement::{Placement, Planned, PlannedConfig};
use kvhoard_engine::{
    Clock, CodecSpec, CreateOptions, Durability, Policy, PutOptions, ReadOptions, Store, StoreOptions,
};
use kvhoard_kernels::synth::Synth;
use kvhoard_kernels::{Codec, CpuCodec, KvShape};
use kvhoard_tests::codec_form;

const SEG: u64 = 1 << 20;
const SEGMENTS: u64 = 16;

fn shape() -> KvShape {
    KvShape::kv_2ltd(kvhoard_engine::format::Dtype::Bf16, 2, 64, 2, 64)
}

fn q(bits: u8) -> CodecSpec {
    CodecSpec::quant(bits, 32, 0)
}

/// What `spec` makes of `bytes`.
fn through(spec: CodecSpec, bytes: &[u8]) -> Vec<u8> {
    codec_form(spec, shape(), bytes)
}

/// Bytes a record of `spec`'s form of a sample block takes on the log ÷ the block's bytes (a
/// header unit, the payload in whole units), as a served volume's planner measures it.
fn ratio(spec: Option<CodecSpec>) -> f64 {
    let raw = Synth::for_desc(shape(), 7).generate();
    let stored = match spec {
        None => raw.len(),
        Some(spec) => {
            let mut codec = CpuCodec::new(spec).unwrap();
            let mut frame = vec![0u8; codec.max_payload_size(&shape())];
            codec.compress(&kvhoard_kernels::Block::new(shape(), &raw), &mut frame).unwrap().len
        }
    };
    (stored.div_ceil(4096) + 1) as f64 * 4096.0 / raw.len() as f64
}

fn planned(clock: Clock, loads: LoadModel) -> Arc<Planned> {
    let option = |spec, delay_s, lossy| StoreOption { ratio: ratio(spec), delay_s, lossy };
    let config = PlannedConfig {
        planner: PlannerConfig {
            alpha: 0.05,
            half_life_ms: 600_000,
            budget_bytes: u64::MAX,
            options: vec![
                option(None, 0.011, false),
                option(Some(CodecSpec::lossless(1)), 0.009, false),
                option(Some(q(8)), 0.006, true),
                option(Some(q(4)), 0.004, true),
                StoreOption { ratio: 0.0, delay_s: 0.017, lossy: false },
            ],
            dram: kvhoard_engine::placement::planner::DramChoice::default(),
        },
        codecs: vec![None, Some(CodecSpec::lossless(1)), Some(q(8)), Some(q(4))],
        quality: vec![1.0, 1.0, 0.99, 0.9, 1.0],
        loads,
    };
    Arc::new(Planned::new(config, clock).unwrap())
}

/// A volume of `SEGMENTS` segments placed by the planner, on a clock the test moves.
fn planned_store() -> (Arc<AtomicU64>, Arc<Planned>, Store) {
    let (now, planner, store, _, _) = planned_volume();
    (now, planner, store)
}

/// [`planned_store`], with its device and options.
fn planned_volume() -> (Arc<AtomicU64>, Arc<Planned>, Store, Arc<MemDevice>, StoreOptions) {
    let now = Arc::new(AtomicU64::new(1_700_000_000_000));
    let clock = Clock::manual(Arc::clone(&now));
    let planner = planned(clock.clone(), LoadModel::default());
    let dev = Arc::new(MemDevice::new(SEG * (SEGMENTS + 3)));
    let opts = StoreOptions { placement: planner.clone(), clock, ..StoreOptions::default() };
    let store =
        Store::create_on(dev.clone(), &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts.clone())
            .unwrap();
    (now, planner, store, dev, opts)
}

#[test]
fn the_engine_keeps_hot_contexts_and_compresses_or_drops_cold_ones() {
    let (now, planner, store) = planned_store();
    planner.set_budget(store.stats().capacity_bytes * 7 / 10);
    store.set_policy("lossy", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();

    let bytes_of = |group: u64, i: u64| Synth::for_desc(shape(), group * 16 + i + 1).generate();
    let key = |group: u64, i: u64| format!("g{group}-{i}");
    let put = |ns: &str, group: u64| {
        let blocks: Vec<(String, Vec<u8>)> = (0..4).map(|i| (key(group, i), bytes_of(group, i))).collect();
        let items: Vec<(&str, &[u8])> = blocks.iter().map(|(k, b)| (k.as_str(), b.as_slice())).collect();
        let opts = PutOptions {
            durability: Durability::Written,
            desc: Some(shape().desc()),
            group: Some(group),
            ..PutOptions::default()
        };
        store.put_batch(ns, &items, &opts).unwrap();
    };
    // Every read: the block's own bytes or a form the planner's codecs make of them.
    let check = |ns: &str, group: u64, i: u64| -> Option<bool> {
        let got = store.get(ns, &key(group, i), ReadOptions { verify_hash: true }).unwrap()?;
        let original = bytes_of(group, i);
        if got[..] == original[..] {
            return Some(true);
        }
        assert_eq!(ns, "lossy", "{ns}/{}: a lossy form where the namespace denies lossy codecs", key(group, i));
        let q8 = through(q(8), &original);
        let forms = [through(q(8), &original), through(q(4), &original), through(q(4), &q8)];
        assert!(forms.iter().any(|f| f[..] == got[..]), "{}: bytes of no form of the block", key(group, i));
        Some(false)
    };
    let hot: Vec<u64> = (0..4).collect();
    let mut next = 100;
    for round in 0..12u64 {
        for ns in ["lossy", "strict"] {
            for &g in &hot {
                if round == 0 {
                    put(ns, g);
                }
                for i in 0..4 {
                    check(ns, g, i);
                }
            }
            for _ in 0..6 {
                put(ns, next);
                next += 1;
            }
        }
        now.fetch_add(1_000, Ordering::Relaxed);
        for _ in 0..2 {
            store.clean_now().unwrap();
        }
    }
    let stats = store.stats();
    assert!(stats.recompressed_records + stats.compressed > 0, "nothing compressed: {stats:?}");
    assert_eq!(stats.read_errors, 0);
    // The hot contexts, read every round, are all still there.
    for ns in ["lossy", "strict"] {
        for &g in &hot {
            for i in 0..4 {
                assert!(
                    check(ns, g, i).is_some(),
                    "{ns}/{} was read every round but is gone: {stats:?} {:?}",
                    key(g, i),
                    stats.placement
                );
            }
        }
    }
    // Cold contexts gave way: some dropped, the rest within the volume.
    let cold_left = (100..next).filter(|&g| check("lossy", g, 0).is_some() || check("strict", g, 0).is_some()).count();
    assert!(cold_left < (next - 100) as usize, "no cold context was dropped");
    // Hits do not rebalance (they may be answered on a network thread); a put does.
    put("lossy", next);
    let after = store.stats().placement;
    assert_eq!(after.policy, "planner");
    assert!(after.contexts > 0 && after.planned_bytes <= after.budget_bytes, "{after:?}");
}

#[test]
fn a_quality_report_reaches_the_planner_with_the_namespaces_drift() {
    let (now, _planner, store) = planned_store();
    let settings = kvhoard_engine::NsSettings { drift: Some(0.2), ..Default::default() };
    store.set_policy("lossy", Policy { lossy: true, settings, ..Default::default() }).unwrap();
    let bytes = Synth::for_desc(shape(), 1).generate();
    let opts = PutOptions { group: Some(9), desc: Some(shape().desc()), ..PutOptions::default() };
    store.put("lossy", "k", &bytes, &opts).unwrap();
    now.fetch_add(1000, Ordering::Relaxed);
    // Within the namespace's 20 %: nothing changes; below it, the context is scored again.
    assert!(!store.report_quality("lossy", Some(9), "any key of the group", 0.85).unwrap());
    assert!(store.report_quality("lossy", Some(9), "k", 0.5).unwrap());
    assert!(!store.report_quality("lossy", Some(10), "k", 0.5).unwrap(), "a context the planner never saw");
    assert!(store.report_quality("lossy", Some(9), "k", 1.5).is_err(), "a quality out of range is refused");
}

#[test]
fn the_planners_delays_follow_what_the_stores_loads_take() {
    // Delays for blocks of 1 GiB, decoded in 1 ms: far from the configured ones at any speed a
    // machine reads memory, so a change is the store's measurement, not a coincidence.
    let loads = LoadModel { block_bytes: 1 << 30, decode_s: vec![0.0, 0.001, 0.001, 0.001] };
    let planner = planned(Clock::default(), loads);
    let dev = Arc::new(MemDevice::new(SEG * 64));
    // No DRAM tier: every load is the log's.
    let opts = StoreOptions { placement: planner.clone(), dram_tier_bytes: 0, ..StoreOptions::default() };
    let store = Store::create_on(dev, &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap();
    // Blocks kept as put (the planner would otherwise store them lossless, whose delay is lower):
    // no get decodes, so each codec's decoding stays as configured.
    let raw_only = kvhoard_engine::NsSettings {
        codecs: Some(Arc::from(vec![CodecSpec::parse("raw").unwrap()])),
        ..Default::default()
    };
    store.set_policy("n", Policy { settings: raw_only, ..Default::default() }).unwrap();
    let delays = || planner.plan_view(0).unwrap().options.iter().map(|o| o.delay_s).collect::<Vec<_>>();
    let configured = delays();
    let key = |i: u32| format!("k{i}");
    let block = |i: u32| i.to_le_bytes().repeat(256);
    let put = |i: u32| store.put("n", &key(i), &block(i), &PutOptions::default()).unwrap();
    // Maintenance runs every 1024 puts, where a put asks for its codec.
    for i in 0..1024 {
        put(i);
    }
    // Loads from the log: one at a time, and a batch (whose reads count as one call).
    for i in 0..16 {
        assert_eq!(store.get("n", &key(i), ReadOptions::default()).unwrap().unwrap()[..], block(i)[..]);
    }
    let keys: Vec<String> = (16..64).map(key).collect();
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = store.get_batch("n", &keys, ReadOptions::default()).unwrap();
    assert!(got.iter().all(Option::is_some));
    assert_eq!(delays(), configured, "nothing follows before maintenance");
    put(5000);
    let followed = delays();
    let ratios: Vec<f64> = planner.plan_view(0).unwrap().options.iter().map(|o| o.ratio).collect();
    assert_ne!(followed[0], configured[0], "{followed:?}");
    assert!(followed[0].is_finite() && followed[0] > 0.0, "{followed:?}");
    // One log speed for every form: each option's read is its ratio of the raw one's, plus its
    // decoding (no block of a codec was read, so as configured).
    for k in 1..4 {
        let read = followed[k] - 0.001;
        assert!((read / followed[0] - ratios[k] / ratios[0]).abs() < 1e-6, "option {k}: {followed:?} {ratios:?}");
    }
    assert_eq!(followed[4], configured[4], "recomputing stays as configured");
}

#[test]
fn a_dropped_context_reads_as_misses_at_once_and_a_crash_leaves_a_sound_volume() {
    let (now, planner, store, dev, opts) = planned_volume();
    // Room for a quarter of the volume: the planner drops contexts long before the volume is
    // full, so no cleaning or reclaim takes part.
    planner.set_budget(store.stats().capacity_bytes / 4);
    let bytes_of = |group: u64, i: u64| Synth::for_desc(shape(), group * 16 + i + 1).generate();
    let key = |group: u64, i: u64| format!("g{group}-{i}");
    let context = |group: u64| kvhoard_engine::placement::context_of(Some(group), "strict", &key(group, 0));
    let groups = 24u64;
    // g1-3 is put again by group 2, with other bytes: that group's now; group 2 is read all
    // along, so it stays. g0-0 is pinned.
    let (moved, owner, moved_bytes) = ((1, 3), 2, bytes_of(2, 9));
    let put = |group: u64, blocks: &[(String, Vec<u8>)]| {
        let items: Vec<(&str, &[u8])> = blocks.iter().map(|(k, b)| (k.as_str(), b.as_slice())).collect();
        let opts = PutOptions {
            durability: Durability::Synced,
            desc: Some(shape().desc()),
            group: Some(group),
            ..PutOptions::default()
        };
        store.put_batch("strict", &items, &opts).unwrap();
    };
    for group in 0..groups {
        now.fetch_add(1_000, Ordering::Relaxed);
        let mut blocks: Vec<(String, Vec<u8>)> = (0..4).map(|i| (key(group, i), bytes_of(group, i))).collect();
        if group == owner {
            blocks.push((key(moved.0, moved.1), moved_bytes.clone()));
        }
        put(group, &blocks);
        if group > owner {
            store.get("strict", &key(owner, 0), ReadOptions::default()).unwrap().unwrap();
        }
        if group == 0 {
            assert!(store.pin("strict", &key(0, 0)).unwrap());
        }
    }
    let stats = store.stats();
    assert!(stats.planner_dropped_keys > 0, "nothing dropped: {stats:?}");
    assert_eq!((stats.segments_cleaned, stats.segments_reclaimed), (0, 0), "the drops needed no cleaning");
    let get = |store: &Store, group: u64, i: u64| {
        store.get("strict", &key(group, i), ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
    };
    // Each key's bytes and the group that put it last.
    let last = |group: u64, i: u64| match (group, i) == moved {
        true => (owner, moved_bytes.clone()),
        false => (group, bytes_of(group, i)),
    };
    // Which contexts are dropped, before reads use any again.
    let dropped_option = 4;
    let was_dropped: Vec<bool> = (0..groups).map(|g| planner.option_of(context(g)) == dropped_option).collect();
    let dropped = |group: u64| was_dropped[group as usize];
    assert!(dropped(0) && dropped(moved.0), "the oldest contexts were dropped");
    assert!(!dropped(groups - 1) && !dropped(owner), "the newest and the one read all along were kept");
    // A dropped context's blocks are gone, all of them but a pinned one and one another context
    // put again; a kept one's are all there.
    let mut gone = 0;
    for group in 0..groups {
        for i in 0..4 {
            let (owner, want) = last(group, i);
            let goes = dropped(owner) && (group, i) != (0, 0);
            gone += u64::from(goes);
            match get(&store, group, i) {
                Some(b) => assert!(!goes && b == want, "{}: dropped, or other bytes", key(group, i)),
                None => assert!(goes, "{} is missing", key(group, i)),
            }
        }
    }
    assert_eq!(stats.planner_dropped_keys, gone);
    assert_eq!(stats.keys, groups * 4 - gone, "their keys left the index");
    // A client deletes a key the planner dropped: it did not exist, but its tombstone is
    // written, so no crash brings it back.
    assert!(!store.delete("strict", &key(0, 1), Durability::Synced).unwrap());
    // A crash, whatever it keeps of what was not synced: the volume opens and passes fsck; a
    // dropped key may come back (nothing was written for it), with the bytes it was last put
    // with, and every kept one (all were put synced) is there.
    use kvhoard_engine::device::CrashMode;
    for mode in [CrashMode::KeepAll, CrashMode::DropAll, CrashMode::Random(7)] {
        let image = Arc::new(dev.crash(mode));
        let report = kvhoard_engine::check::check_device(image.as_ref(), Default::default()).unwrap();
        assert_eq!(report.count(kvhoard_engine::check::Severity::Error), 0, "{mode:?}: {:#?}", report.problems);
        let reopened = Store::open_on(image, opts.clone()).unwrap();
        for group in 0..groups {
            for i in 0..4 {
                let (owner, want) = last(group, i);
                match get(&reopened, group, i) {
                    Some(_) if (group, i) == (0, 1) => panic!("{mode:?}: the deleted g0-1 came back"),
                    Some(b) => assert!(b == want, "{mode:?}: {} came back as other bytes", key(group, i)),
                    None => assert!(dropped(owner), "{mode:?}: {} of a kept context was lost", key(group, i)),
                }
            }
        }
    }
    std::mem::forget(store);
}
