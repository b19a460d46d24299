//! Segment cleaning: a cleaner keeps the blocks placement keeps (LRU: those read since their
//! write) by relocating them, and drops the rest with the segment; crashes and write errors at
//! any point during cleaning lose nothing kept and bring back nothing dropped; the background
//! cleaner keeps a hot set alive through a stream of puts many times the volume's size.

use std::collections::BTreeMap;
use std::sync::Arc;

use kvhoard_engine::device::{CrashMode, FaultKind, MemDevice};
use kvhoard_engine::placement::Lru;
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_tests::block;

const SEG: u64 = 1 << 20;

fn lru_store(segments: u64) -> (Arc<MemDevice>, Store, StoreOptions) {
    let dev = Arc::new(MemDevice::new(SEG * (segments + 3)));
    let opts = StoreOptions { placement: Arc::new(Lru::default()), ..StoreOptions::default() };
    let store =
        Store::create_on(dev.clone(), &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts.clone())
            .unwrap();
    (dev, store, opts)
}

fn synced() -> PutOptions {
    PutOptions { durability: Durability::Synced, ..PutOptions::default() }
}

fn get(store: &Store, key: &str) -> Option<Vec<u8>> {
    store.get("default", key, ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
}

/// Fills the first segments with 40 keys of 100 KB and reads every third one.
fn fill(store: &Store) -> BTreeMap<String, (Vec<u8>, bool)> {
    let mut keys = BTreeMap::new();
    for i in 0..40u64 {
        let key = format!("k{i}");
        let bytes = block(i, 100_000);
        store.put("default", &key, &bytes, &synced()).unwrap();
        keys.insert(key, (bytes, i % 3 == 0));
    }
    for (key, (bytes, read)) in &keys {
        if *read {
            assert!(get(store, key).as_ref() == Some(bytes), "{key}");
        }
    }
    keys
}

#[test]
fn cleaning_keeps_what_was_read_and_drops_the_rest() {
    let (_dev, store, _) = lru_store(12);
    let keys = fill(&store);
    let mut cleaned = 0;
    while store.clean_now().unwrap().is_some() {
        cleaned += 1;
        assert!(cleaned < 20, "cleaning does not converge");
    }
    assert!(cleaned >= 2, "cleaned {cleaned} segments");
    let stats = store.stats();
    assert!(stats.relocated_records > 0 && stats.write_amplification > 0.0, "{stats:?}");
    let mut dropped_cold = 0;
    for (key, (bytes, read)) in &keys {
        match get(&store, key) {
            Some(got) => assert!(got == *bytes, "{key}: other bytes after relocation"),
            None => {
                assert!(!read, "{key} was read but cleaning dropped it");
                dropped_cold += 1;
            }
        }
    }
    assert!(dropped_cold > 0, "cleaning dropped nothing cold");
}

#[test]
fn a_crash_or_write_error_at_any_point_of_cleaning_loses_nothing_kept() {
    for fail_at in 1..12u64 {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll, CrashMode::Random(fail_at)] {
            let (dev, store, opts) = lru_store(12);
            let keys = fill(&store);
            // Make the fail_at-th write of cleaning fail: everything kept must survive, in place
            // or relocated.
            dev.fail_nth(FaultKind::Write, fail_at);
            let outcome = store.clean_now();
            let crashed = Arc::new(dev.crash(mode));
            std::mem::forget(store);
            let after = Store::open_on(crashed, opts.clone()).unwrap();
            for (key, (bytes, read)) in &keys {
                match get(&after, key) {
                    Some(got) => assert!(got == *bytes, "{key}: other bytes (write {fail_at} failed, {mode:?})"),
                    None => assert!(
                        outcome.as_ref().is_ok_and(Option::is_some) && !read,
                        "{key} lost although cleaning {} (write {fail_at} failed, {mode:?})",
                        if outcome.is_ok() { "finished" } else { "failed" }
                    ),
                }
            }
            assert_eq!(after.stats().read_errors, 0);
        }
    }
}

/// A cleaning whose victim holds a block another key links to from elsewhere writes that link
/// again after the block's new record. A write that fails anywhere in it (the link's own
/// included), then more puts, then a crash: both keys still read the block. A victim freed
/// with the link left before the block's one record, and reused, would lose the link's key.
/// (The engine's unit tests inject the same errors into a cleaning that checkpoints instead.)
#[test]
fn a_write_error_anywhere_in_a_cleaning_keeps_both_keys_of_a_shared_block() {
    let mut failed = 0;
    for fail_at in 1..16u64 {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
            let (dev, store, opts) = lru_store(12);
            let shared = block(99, 100_000);
            store.put("default", "x", &shared, &synced()).unwrap();
            fill(&store);
            store.put("default", "copy", &shared, &synced()).unwrap();
            assert_eq!(get(&store, "x").as_ref(), Some(&shared), "read: cleaning keeps it");
            dev.fail_nth(FaultKind::Write, fail_at);
            let outcome = store.clean_now();
            failed += u32::from(outcome.is_err());
            // Whatever the cleaning did, more puts follow (refused if the store stopped writing).
            for i in 0..30u64 {
                if store.put("default", &format!("after{i}"), &block(500 + i, 100_000), &synced()).is_err() {
                    break;
                }
            }
            let crashed = Arc::new(dev.crash(mode));
            std::mem::forget(store);
            let after = Store::open_on(crashed, opts.clone()).unwrap();
            for key in ["x", "copy"] {
                let got = get(&after, key);
                assert!(
                    got.as_ref() == Some(&shared),
                    "{key}: {} (write {fail_at} failed, {mode:?})",
                    if got.is_some() { "other bytes" } else { "lost" }
                );
            }
        }
    }
    assert!(failed > 0, "no injected write hit the cleaning");
}

/// Cleaning hands its relocations to the writer without waiting, one window's writes in flight
/// while the next window is read. A read that fails anywhere ends the cleaning with some
/// relocations handed to the writer; another cleaning of what is left, then a crash: every
/// block kept is there, in place or relocated. (A cleaning that ended without waiting for its
/// relocations would let the next one free the segment while they were in flight; with this
/// in-memory device they are written before the next cleaning begins, so that race itself is
/// not reproduced here.)
#[test]
fn a_read_error_anywhere_in_a_cleaning_then_another_cleaning_and_a_crash_keep_what_was_read() {
    let mut failed = 0;
    for fail_at in [2u64, 3, 8, 19, 20, 21, 36, 45] {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
            let (dev, store, opts) = lru_store(12);
            // About 50 records a segment: several windows each.
            let keys: Vec<(String, Vec<u8>)> = (0..150u64).map(|i| (format!("small{i}"), block(i, 16_000))).collect();
            for (key, bytes) in &keys {
                store.put("default", key, bytes, &synced()).unwrap();
            }
            for (key, bytes) in &keys {
                assert!(get(&store, key).as_ref() == Some(bytes), "{key}");
            }
            dev.fail_nth(FaultKind::Read, fail_at);
            failed += u32::from(store.clean_now().is_err());
            let _ = store.clean_now();
            let crashed = Arc::new(dev.crash(mode));
            std::mem::forget(store);
            let after = Store::open_on(crashed, opts.clone()).unwrap();
            for (key, bytes) in &keys {
                let got = get(&after, key);
                assert!(
                    got.as_ref() == Some(bytes),
                    "{key}: {} (read {fail_at} failed, {mode:?})",
                    if got.is_some() { "other bytes" } else { "lost" }
                );
            }
        }
    }
    assert!(failed > 0, "no injected read hit a cleaning");
}

#[test]
fn the_background_cleaner_keeps_a_hot_set_through_many_volumes_of_puts() {
    let (_dev, store, _) = lru_store(10);
    let hot: Vec<(String, Vec<u8>)> = (0..5u64).map(|i| (format!("hot{i}"), block(1000 + i, 60_000))).collect();
    for (k, b) in &hot {
        store.put("default", k, b, &synced()).unwrap();
    }
    // 30 volumes' worth of cold puts, the hot set read between them.
    for i in 0..3000u64 {
        store.put("default", &format!("cold{i}"), &block(i, 100_000), &PutOptions::default()).unwrap();
        if i % 20 == 0 {
            for (k, b) in &hot {
                let got = get(&store, k);
                assert!(
                    got.as_ref() == Some(b),
                    "{k} lost or changed after {i} cold puts ({:?} bytes)",
                    got.map(|g| g.len())
                );
            }
        }
    }
    let stats = store.stats();
    assert!(stats.segments_cleaned > 0, "the background cleaner never ran: {stats:?}");
    assert!(stats.write_amplification < 1.0, "write amplification {}", stats.write_amplification);
}
