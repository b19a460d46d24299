//! Cleaning that recompresses: placement asks for a block to be written again in another codec's
//! form, and the cleaner does it where the namespace's policy and the block allow (lossy only
//! where lossy codecs are allowed, never for a block other keys also name), relocating it as it
//! is otherwise. A crash or a write error at any point of such a cleaning leaves every block in
//! one of its two forms, whole.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvhoard_engine::device::{CrashMode, FaultKind, MemDevice};
use kvhoard_engine::placement::{BlockInfo, Keep, LiveBlock, Placement, PutPlan, SegmentView};
use kvhoard_engine::{CodecSpec, CreateOptions, Durability, Policy, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_kernels::synth::Synth;
use kvhoard_kernels::KvShape;
use kvhoard_tests::codec_form;

const SEG: u64 = 1 << 20;

fn q8() -> CodecSpec {
    CodecSpec::quant(8, 32, 0)
}

/// A placement whose cleaning keeps each block as `keep` says (the oldest segment first, no DRAM
/// tier).
#[derive(Debug)]
struct Keeps(fn(&LiveBlock<'_>) -> Keep);

impl Placement for Keeps {
    fn on_put(&self, _: &BlockInfo<'_>) -> PutPlan {
        PutPlan { dram: false }
    }
    fn on_load(&self, _: &BlockInfo<'_>) -> bool {
        false
    }
    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        candidates.iter().min_by_key(|s| s.seq).map_or(0, |s| s.index)
    }
    fn cleans(&self) -> bool {
        true
    }
    fn keep(&self, block: &LiveBlock<'_>) -> Keep {
        (self.0)(block)
    }
}

/// Recompresses groups 0 mod 3 with quant8 and 1 mod 3 losslessly; relocates the rest.
fn by_context(block: &LiveBlock<'_>) -> Keep {
    match block.group.map_or(2, |g| g % 3) {
        0 => Keep::Recompress(q8()),
        1 => Keep::Recompress(CodecSpec::lossless(1)),
        _ => Keep::Relocate,
    }
}

fn shape() -> KvShape {
    KvShape::kv_2ltd(kvhoard_engine::format::Dtype::Bf16, 2, 64, 2, 64)
}

/// What quant8 makes of `bytes`: what the store must return for a block it recompressed so.
fn quantized(bytes: &[u8]) -> Vec<u8> {
    codec_form(q8(), shape(), bytes)
}

struct Expected {
    bytes: Vec<u8>,
    /// The form cleaning may leave instead (`None`: only the original).
    recompressed: Option<Vec<u8>>,
}

fn store() -> (Arc<MemDevice>, Store, StoreOptions) {
    let dev = Arc::new(MemDevice::new(SEG * 16));
    let opts = StoreOptions { placement: Arc::new(Keeps(by_context)), ..StoreOptions::default() };
    let store =
        Store::create_on(dev.clone(), &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts.clone())
            .unwrap();
    store.set_policy("lossy", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    (dev, store, opts)
}

/// Puts 24 blocks in each of "lossy" and "strict" (context = group = i), and in "lossy" one
/// block under two keys (a context cleaning asks to quantize).
fn fill(store: &Store) -> BTreeMap<(String, String), Expected> {
    let mut expected = BTreeMap::new();
    for ns in ["lossy", "strict"] {
        for i in 0..24u64 {
            let bytes = Synth::for_desc(shape(), i + 1).generate();
            let opts = PutOptions {
                durability: Durability::Synced,
                desc: Some(shape().desc()),
                group: Some(i),
                ..PutOptions::default()
            };
            store.put(ns, &format!("k{i}"), &bytes, &opts).unwrap();
            let recompressed = (ns == "lossy" && i % 3 == 0).then(|| quantized(&bytes));
            expected.insert((ns.to_string(), format!("k{i}")), Expected { bytes, recompressed });
        }
    }
    let shared = Synth::for_desc(shape(), 99).generate();
    for key in ["s1", "s2"] {
        let opts = PutOptions {
            durability: Durability::Synced,
            desc: Some(shape().desc()),
            group: Some(3),
            ..PutOptions::default()
        };
        store.put("lossy", key, &shared, &opts).unwrap();
        expected.insert(("lossy".into(), key.into()), Expected { bytes: shared.clone(), recompressed: None });
    }
    expected
}

fn check(store: &Store, expected: &BTreeMap<(String, String), Expected>, what: &str) -> usize {
    let mut recompressed = 0;
    for ((ns, key), e) in expected {
        let got = store.get(ns, key, ReadOptions { verify_hash: true }).unwrap();
        let got = got.unwrap_or_else(|| panic!("{what}: {ns}/{key} lost"));
        if got[..] == e.bytes[..] {
            continue;
        }
        assert!(
            e.recompressed.as_ref().is_some_and(|r| r[..] == got[..]),
            "{what}: {ns}/{key} came back as bytes that are neither its own nor its recompressed form"
        );
        assert_eq!(got.meta.content_hash, *blake3::hash(&e.bytes).as_bytes(), "{what}: {ns}/{key} lost its name");
        recompressed += 1;
    }
    recompressed
}

#[test]
fn cleaning_recompresses_what_placement_asks_where_the_policy_allows() {
    let (_dev, store, _) = store();
    let expected = fill(&store);
    let before = store.stats();
    for _ in 0..4 {
        store.clean_now().unwrap();
    }
    let stats = store.stats();
    let quantized = check(&store, &expected, "after cleaning");
    assert_eq!(quantized, 8, "the eight lossy-namespace blocks of contexts 0 mod 3 are quantized, no other");
    assert!(stats.recompressed_records >= 16, "quant8 and lossless recompressions: {stats:?}");
    assert!(stats.recompressed_saved_bytes > 0, "{stats:?}");
    assert!(stats.quality_samples >= 1, "the first block quantized by cleaning is sampled: {stats:?}");
    assert!(stats.live_bytes < before.live_bytes, "{} >= {}", stats.live_bytes, before.live_bytes);
    // Context 1 mod 3 is stored losslessly now, in both namespaces; the shared block is not.
    for ns in ["lossy", "strict"] {
        let got = store.get(ns, "k1", ReadOptions { verify_hash: true }).unwrap().unwrap();
        assert!(got.meta.codec().starts_with("lossless"), "{ns}/k1: {}", got.meta.codec());
        let got = store.get(ns, "k0", ReadOptions::default()).unwrap().unwrap();
        let want = if ns == "lossy" { "quant:bits=8" } else { "raw" };
        assert!(got.meta.codec().starts_with(want), "{ns}/k0: {}", got.meta.codec());
    }
    let shared = store.get("lossy", "s1", ReadOptions::default()).unwrap().unwrap();
    assert_eq!(shared.meta.codec(), "raw", "a block two keys name is relocated as it is");
}

#[test]
fn a_crash_or_write_error_while_cleaning_recompresses_leaves_one_form_or_the_other() {
    for fail_at in 1..10u64 {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll, CrashMode::Random(fail_at)] {
            let (dev, store, opts) = store();
            let expected = fill(&store);
            dev.fail_nth(FaultKind::Write, fail_at);
            let _ = store.clean_now();
            let crashed = Arc::new(dev.crash(mode));
            std::mem::forget(store);
            let after = Store::open_on(crashed, opts.clone()).unwrap();
            check(&after, &expected, &format!("write {fail_at} failed, {mode:?}"));
            assert_eq!(after.stats().read_errors, 0);
        }
    }
}

#[test]
fn cleaning_keeps_lossy_forms_as_they_are_and_the_rest_of_a_ttl() {
    let (_dev, store, _) = store();
    let q4 = CodecSpec::quant(4, 32, 0);
    let bytes = Synth::for_desc(shape(), 500).generate();
    let put = |key: &str, codec: Option<CodecSpec>, ttl_secs: Option<u32>| {
        let opts = PutOptions {
            durability: Durability::Synced,
            desc: Some(shape().desc()),
            group: Some(0), // placement asks for quant8
            codec,
            ttl_secs,
            ..PutOptions::default()
        };
        store.put("lossy", key, &bytes, &opts).unwrap();
    };
    put("q4", Some(q4), None);
    put("ttl", None, Some(3600));
    // Later blocks, so that the segment holding these two is sealed and cleaned first.
    let expected = fill(&store);
    for _ in 0..2 {
        store.clean_now().unwrap();
    }
    assert!(store.stats().recompressed_records > 0);
    let got = store.get("lossy", "q4", ReadOptions::default()).unwrap().unwrap();
    assert!(got.meta.codec().starts_with("quant:bits=4"), "a lossy form is final: {}", got.meta.codec());
    assert!(got[..] == codec_form(q4, shape(), &bytes)[..], "quant4 of the original, not of anything else");
    let got = store.get("lossy", "ttl", ReadOptions::default()).unwrap().unwrap();
    assert!(got.meta.codec().starts_with("quant:bits=8"), "{}", got.meta.codec());
    assert!((3590..=3600).contains(&got.meta.ttl_secs), "the rest of its TTL: {}", got.meta.ttl_secs);
    check(&store, &expected, "after cleaning");
}

/// Quantizes every block to 2 bits (when cleaning reaches it, and with `at_put` when it is put)
/// and keeps the quality reports it is told.
#[derive(Debug, Default)]
struct QuantizeHard {
    reports: std::sync::Mutex<Vec<(u64, f64, f64)>>,
    at_put: bool,
}

impl Placement for QuantizeHard {
    fn on_put(&self, _: &BlockInfo<'_>) -> PutPlan {
        PutPlan { dram: false }
    }
    fn on_load(&self, _: &BlockInfo<'_>) -> bool {
        false
    }
    fn victim(&self, candidates: &[SegmentView]) -> u32 {
        candidates.iter().min_by_key(|s| s.seq).map_or(0, |s| s.index)
    }
    fn cleans(&self) -> bool {
        true
    }
    fn keep(&self, _: &LiveBlock<'_>) -> Keep {
        Keep::Recompress(CodecSpec::quant(2, 32, 0))
    }
    fn report_quality(&self, context: u64, observed: f64, drift: f64) -> bool {
        self.reports.lock().unwrap().push((context, observed, drift));
        true
    }
    fn codec_at_put(&self, _: &BlockInfo<'_>) -> Option<CodecSpec> {
        self.at_put.then(|| CodecSpec::quant(2, 32, 0))
    }
}

#[test]
fn cleaning_samples_the_quality_of_what_it_quantizes_and_tells_placement() {
    let placement = Arc::new(QuantizeHard::default());
    let dev = Arc::new(MemDevice::new(SEG * 16));
    let opts = StoreOptions { placement: placement.clone(), ..StoreOptions::default() };
    let store = Store::create_on(dev, &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap();
    let settings = kvhoard_engine::NsSettings { drift: Some(0.1), ..Default::default() };
    store.set_policy("lossy", Policy { lossy: true, settings, ..Default::default() }).unwrap();
    let contexts: Vec<u64> = (0..40u64).map(|i| kvhoard_engine::placement::context_of(Some(i), "lossy", "")).collect();
    for i in 0..40u64 {
        let opts = PutOptions { desc: Some(shape().desc()), group: Some(i), ..PutOptions::default() };
        store.put("lossy", &format!("k{i}"), &Synth::for_desc(shape(), i + 1).generate(), &opts).unwrap();
    }
    for _ in 0..8 {
        store.clean_now().unwrap();
    }
    let stats = store.stats();
    let reports = placement.reports.lock().unwrap().clone();
    assert!(stats.recompressed_records >= 17, "{stats:?}");
    // One recoding in sixteen is sampled: the first, the seventeenth, ...
    assert_eq!(stats.quality_samples, reports.len() as u64);
    assert!(!reports.is_empty() && stats.quality_samples <= stats.recompressed_records.div_ceil(16), "{stats:?}");
    assert_eq!(stats.quality_rescored, stats.quality_samples, "this placement scores every report again");
    for (context, quality, drift) in reports {
        assert!(contexts.contains(&context), "a report names the block's context");
        // 2-bit quantization keeps little of the attention output (near 0.25 on such blocks).
        assert!(quality > 0.0 && quality < 0.9, "{quality}");
        assert_eq!(drift, 0.1, "the namespace's drift");
    }
    // A client's recompress is not placement's plan: not sampled.
    let opts = PutOptions { desc: Some(shape().desc()), group: Some(99), ..PutOptions::default() };
    store.put("lossy", "mine", &Synth::for_desc(shape(), 99).generate(), &opts).unwrap();
    let before = store.stats().quality_samples;
    for _ in 0..20 {
        store.recompress("lossy", "mine", q8(), Durability::Written).unwrap();
    }
    assert_eq!(store.stats().quality_samples, before);
}

#[test]
fn a_put_placement_quantizes_is_sampled_for_quality_too() {
    let placement = Arc::new(QuantizeHard { at_put: true, ..QuantizeHard::default() });
    let dev = Arc::new(MemDevice::new(SEG * 16));
    let opts = StoreOptions { placement: placement.clone(), ..StoreOptions::default() };
    let store = Store::create_on(dev, &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap();
    let settings = kvhoard_engine::NsSettings { drift: Some(0.1), ..Default::default() };
    store.set_policy("lossy", Policy { lossy: true, settings, ..Default::default() }).unwrap();
    let put = |ns: &str, i: u64, codec: Option<CodecSpec>| {
        let opts = PutOptions { desc: Some(shape().desc()), group: Some(i), codec, ..PutOptions::default() };
        store.put(ns, &format!("k{i}"), &Synth::for_desc(shape(), i + 1).generate(), &opts).unwrap();
    };
    for i in 0..40u64 {
        put("lossy", i, None);
    }
    let stats = store.stats();
    assert_eq!(stats.compressed, 40, "placement's codec is applied at put: {stats:?}");
    // The first, the seventeenth and the thirty-third.
    assert_eq!(stats.quality_samples, 3, "{stats:?}");
    let reports = placement.reports.lock().unwrap().clone();
    let contexts: Vec<u64> =
        [0u64, 16, 32].iter().map(|i| kvhoard_engine::placement::context_of(Some(*i), "lossy", "")).collect();
    assert_eq!(reports.iter().map(|r| r.0).collect::<Vec<_>>(), contexts, "each report names its block's context");
    assert!(reports.iter().all(|&(_, q, drift)| q > 0.0 && q < 0.9 && drift == 0.1), "{reports:?}");
    // A codec the client names, and a namespace that denies lossy codecs (placement's choice is
    // refused there, the namespace's own is used): not placement's lossy forms, not sampled.
    for i in 40..80u64 {
        put("lossy", i, Some(CodecSpec::quant(2, 32, 0)));
        put("strict", i, None);
    }
    assert_eq!(store.stats().quality_samples, 3);
}

/// Drops the blocks of even groups and quantizes the rest, wherever cleaning reaches them.
fn drop_even(block: &LiveBlock<'_>) -> Keep {
    match block.group.is_some_and(|g| g % 2 == 0) {
        true => Keep::Drop,
        false => Keep::Recompress(q8()),
    }
}

#[test]
fn cleaning_moves_a_pinned_block_as_it_is_whatever_placement_says() {
    let dev = Arc::new(MemDevice::new(SEG * 16));
    let opts = StoreOptions { placement: Arc::new(Keeps(drop_even)), ..StoreOptions::default() };
    let store = Store::create_on(dev, &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap();
    store.set_policy("lossy", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    // 40 blocks of 64 KiB: the first segment is sealed full of them, the next one open.
    let bytes = |i: u64| Synth::for_desc(shape(), i + 1).generate();
    let put = |key: &str, i: u64| {
        let opts = PutOptions { desc: Some(shape().desc()), group: Some(i), ..PutOptions::default() };
        store.put("lossy", key, &bytes(i), &opts).unwrap();
    };
    for i in 0..40u64 {
        put(&format!("k{i}"), i);
    }
    // A key that links to k4's block (same bytes) and no other: its own record is elsewhere.
    put("link", 4);
    // Pins on k1, k2, k5, k6, ... (half to be quantized, half to be dropped) and on the link, so
    // that every sealed segment holds one: cleaning must take a segment with pinned blocks.
    let pinned: Vec<u64> = (0..40u64).filter(|i| i % 4 == 1 || i % 4 == 2).collect();
    for i in &pinned {
        assert!(store.pin("lossy", &format!("k{i}")).unwrap());
    }
    assert!(store.pin("lossy", "link").unwrap());
    assert!(store.clean_now().unwrap().is_some(), "a sealed segment was cleaned");
    assert!(store.stats().pins_overridden > 0, "the cleaned segment held pins");
    let get = |key: &str| store.get("lossy", key, ReadOptions { verify_hash: true }).unwrap();
    // Placement's word held for the blocks no pinned key names...
    let dropped = (0..40u64).filter(|i| i % 4 == 0 && *i != 4).filter(|i| get(&format!("k{i}")).is_none()).count();
    let quantized = (0..40u64)
        .filter(|i| i % 4 == 3)
        .filter(|i| get(&format!("k{i}")).is_some_and(|b| b.meta.codec() != "raw"))
        .count();
    assert!(dropped > 0 && quantized > 0, "dropped {dropped}, quantized {quantized}");
    // ...and not for a pinned one, nor for the block a pinned link names: each is there, in the
    // form it was put in.
    for (key, i) in pinned.iter().map(|i| (format!("k{i}"), *i)).chain([("link".to_string(), 4)]) {
        let got = get(&key).unwrap_or_else(|| panic!("pinned {key} was dropped"));
        assert_eq!(got.meta.codec(), "raw", "pinned {key} was recoded");
        assert_eq!(got[..], bytes(i)[..], "pinned {key}");
    }
}
