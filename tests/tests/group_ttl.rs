//! Group TTL kept by the engine: a namespace set with a TTL budget learns from its puts and
//! reads; once planned, blocks put without a TTL take their group's, a hot group's outlives a
//! cold one's, expired blocks read as misses, explicit TTLs are kept, and the settings live with
//! the volume.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvhoard_engine::device::MemDevice;
use kvhoard_engine::{
    Clock, CreateOptions, Durability, NsSettings, Policy, PutOptions, ReadOptions, Store, StoreOptions, TtlSettings,
};

const SEG: u64 = 1 << 20;
const BLOCK: usize = 4096;

fn open(dev: &Arc<MemDevice>, clock: &Clock, create: bool) -> Store {
    let opts = StoreOptions { clock: clock.clone(), ..StoreOptions::default() };
    if create {
        Store::create_on(dev.clone(), &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap()
    } else {
        Store::open_on(dev.clone(), opts).unwrap()
    }
}

#[test]
fn blocks_take_their_groups_ttl_once_planned() {
    let now = Arc::new(AtomicU64::new(1_700_000_000_000));
    let clock = Clock::manual(Arc::clone(&now));
    let dev = Arc::new(MemDevice::new(SEG * 40));
    let store = open(&dev, &clock, true);
    // A budget that keeps a few blocks: the hot group's, not every cold one.
    let ttl = TtlSettings { budget_bytes: 8 * BLOCK as u64, groups: 4, window_s: 3600 };
    let settings = NsSettings { ttl: Some(ttl), ..NsSettings::default() };
    store.set_policy("kv", Policy { settings, ..Policy::default() }).unwrap();
    let put = |key: &str, group: u64, ttl_secs: Option<u32>| {
        let opts =
            PutOptions { durability: Durability::Written, group: Some(group), ttl_secs, ..PutOptions::default() };
        // Bytes of its own per key: `meta` then describes this put's record.
        let mut bytes = vec![group as u8; BLOCK];
        bytes[..key.len()].copy_from_slice(key.as_bytes());
        store.put("kv", key, &bytes, &opts).unwrap();
    };
    let get = |key: &str| store.get("kv", key, ReadOptions::default()).unwrap().is_some();
    let advance = |ms: u64| now.fetch_add(ms, Ordering::Relaxed);

    // Before any plan, puts take no TTL.
    put("hot-0", 1, None);
    assert_eq!(store.meta("kv", "hot-0").unwrap().unwrap().ttl_secs, 0);
    // Ten minutes: the hot group's blocks read every 20 s; a new cold block every 20 s, never read.
    for i in 0..30u64 {
        advance(20_000);
        for b in 0..4 {
            let key = format!("hot-{b}");
            if !get(&key) {
                put(&key, 1, None);
            }
        }
        put(&format!("cold-{i}"), 1000 + i, None);
    }
    store.plan_ttls_now();
    let view = store.ttl_view();
    assert_eq!(view.len(), 1);
    assert_eq!(view[0].namespace, "kv");
    assert!(view[0].plans >= 1 && view[0].expected_hits.is_some(), "{view:?}");

    advance(1_000);
    put("hot-new", 1, None);
    put("cold-new", 5000, None);
    let hot_ttl = store.meta("kv", "hot-new").unwrap().unwrap().ttl_secs;
    let cold_ttl = store.meta("kv", "cold-new").unwrap().unwrap().ttl_secs;
    // Expiry counts whole seconds: a block read every 20 s is there at the next read with 21.
    assert!(hot_ttl >= 21, "the hot group outlives the time between its reads: {hot_ttl} s");
    assert!(cold_ttl > 0 && cold_ttl + 1 < hot_ttl, "cold {cold_ttl} s, hot {hot_ttl} s");
    // An explicit TTL is the put's own.
    put("explicit", 5001, Some(7777));
    assert_eq!(store.meta("kv", "explicit").unwrap().unwrap().ttl_secs, 7777);
    // Expiry applies the group's TTL: the cold block reads as a miss once it is past.
    advance(u64::from(cold_ttl) * 1000 + 1000);
    assert!(!get("cold-new"), "expired at its group's TTL");
    assert!(get("explicit"));
    assert!(get("hot-new"), "the hot block outlives the cold one: hot {hot_ttl} s, cold {cold_ttl} s, {view:?}");
    // Another namespace is untouched.
    store.put("other", "k", &[1; BLOCK], &PutOptions::default()).unwrap();
    assert_eq!(store.meta("other", "k").unwrap().unwrap().ttl_secs, 0);
    store.close().unwrap();
    drop(store);

    // The settings live with the volume; what was learned lives in the process.
    let store = open(&dev, &clock, false);
    assert_eq!(store.policy("kv").settings.ttl, Some(ttl));
    let view = store.ttl_view();
    assert_eq!((view.len(), view[0].accesses, view[0].plans), (1, 0, 0), "nothing learned yet: {view:?}");
    put_once(&store);
    assert_eq!(store.ttl_view()[0].accesses, 1);
    // Unset: forgotten.
    store.set_policy("kv", Policy::default()).unwrap();
    assert!(store.ttl_view().is_empty());
}

fn put_once(store: &Store) {
    store.put("kv", "again", &[9; BLOCK], &PutOptions { group: Some(1), ..PutOptions::default() }).unwrap();
}

#[test]
fn placement_settings_are_checked_and_kept() {
    let clock = Clock::system();
    let dev = Arc::new(MemDevice::new(SEG * 8));
    let store = open(&dev, &clock, true);
    let bad = |settings: NsSettings| store.set_policy("ns", Policy { settings, ..Policy::default() }).unwrap_err();
    assert!(bad(NsSettings { alpha: Some(-1.0), ..NsSettings::default() }).to_string().contains("alpha"));
    assert!(bad(NsSettings { drift: Some(1.5), ..NsSettings::default() }).to_string().contains("drift"));
    let zero = TtlSettings { budget_bytes: 0, groups: 0, window_s: 0 };
    assert!(bad(NsSettings { ttl: Some(zero), ..NsSettings::default() }).to_string().contains("budget"));
    let q8 = kvhoard_engine::CodecSpec::quant(8, 32, 0);
    let lossy_codecs = NsSettings { codecs: Some(Arc::from(vec![q8])), ..NsSettings::default() };
    let err = bad(lossy_codecs.clone());
    assert!(err.to_string().contains("--lossy allow"), "{err}");

    let none = NsSettings { codecs: Some(Arc::from(Vec::new())), ..NsSettings::default() };
    assert!(bad(none).to_string().contains("`raw`"), "an empty list is refused, saying how to list none");
    let too_many = TtlSettings { budget_bytes: 1, groups: kvhoard_engine::MAX_TTL_GROUPS + 1, window_s: 0 };
    assert!(bad(NsSettings { ttl: Some(too_many), ..NsSettings::default() }).to_string().contains("groups"));
    // `raw` alone: only the form as put; it survives a reopen as such.
    let raw_only =
        NsSettings { codecs: Some(Arc::from(vec![kvhoard_engine::CodecSpec::RAW])), ..NsSettings::default() };
    store.set_policy("raw-only", Policy { settings: raw_only.clone(), ..Policy::default() }).unwrap();
    let settings = NsSettings { alpha: Some(0.125), drift: Some(0.1), ..lossy_codecs };
    let policy = Policy { lossy: true, settings, ..Policy::default() };
    store.set_policy("ns", policy.clone()).unwrap();
    store.close().unwrap();
    drop(store);
    let store = open(&dev, &clock, false);
    assert_eq!(store.policy("ns"), policy);
    assert_eq!(store.policy("raw-only").settings, raw_only);
}
