#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

use std::sync::atomic::AtomicU64;
use std::sync::Arc;

use crate::device::{BlockDevice, CrashMode, FaultKind, MemDevice};
use crate::{Clock, CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreError, StoreOptions};

const SEG: u64 = 1 << 20;

fn mem_store(segments: u64) -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(SEG * (segments + 3)));
    let store = Store::create_on(
        dev.clone(),
        &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG },
        StoreOptions::default(),
    )
    .unwrap();
    (dev, store)
}

fn reopen(dev: &Arc<MemDevice>, mode: CrashMode) -> (Arc<MemDevice>, Store) {
    let crashed = Arc::new(dev.crash(mode));
    let store = Store::open_on(crashed.clone(), StoreOptions::default()).unwrap();
    (crashed, store)
}

fn block(seed: u64, len: usize) -> Vec<u8> {
    kvhoard_kernels::rng::bytes(seed, len)
}

fn synced() -> PutOptions {
    PutOptions { durability: Durability::Synced, ..PutOptions::default() }
}

fn get(s: &Store, key: &str) -> Option<Vec<u8>> {
    s.get("default", key, ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
}

/// A deep fsck of `dev`, asserted to find no error (`what` names the image in the message).
fn fsck_clean(dev: &dyn BlockDevice, what: &str) -> crate::check::Report {
    let report =
        crate::check::check_device(dev, crate::check::ScanOptions { deep: true, summaries_only: false }).unwrap();
    let errors: Vec<_> = report.problems.iter().filter(|p| p.severity >= crate::check::Severity::Error).collect();
    assert!(errors.is_empty(), "fsck of {what}: {errors:?}");
    report
}

/// A store of 8 segments holding keys `k0..k40`, unsynced blocks of 60,000 bytes (seeds 0..40),
/// that filled at least `sealed` segments.
fn store_with_sealed(sealed: u32) -> (Arc<MemDevice>, Store) {
    let (dev, s) = mem_store(8);
    for i in 0..40u64 {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &PutOptions::default()).unwrap();
    }
    assert!(s.stats().segments_sealed >= sealed);
    (dev, s)
}

#[test]
fn put_get_round_trips_at_every_durability() {
    let (_dev, s) = mem_store(8);
    for (i, d) in [Durability::Buffered, Durability::Written, Durability::Synced].into_iter().enumerate() {
        let bytes = block(i as u64, 10_000 + i);
        let hash =
            s.put("default", &format!("k{i}"), &bytes, &PutOptions { durability: d, ..PutOptions::default() }).unwrap();
        assert_eq!(hash, *blake3::hash(&bytes).as_bytes());
        assert_eq!(get(&s, &format!("k{i}")).unwrap(), bytes);
    }
    assert!(get(&s, "missing").is_none());
    let mut buf = vec![0u8; 20_000];
    let (meta, n) = s.get_into("default", "k1", &mut buf, ReadOptions::default()).unwrap().unwrap();
    assert_eq!(&buf[..n], &block(1, 10_001)[..]);
    assert_eq!(meta.raw_len, 10_001);
    let mut small = vec![0u8; 10];
    assert!(matches!(
        s.get_into("default", "k1", &mut small, ReadOptions::default()),
        Err(StoreError::BufferTooSmall { .. })
    ));
}

#[test]
fn identical_bytes_are_stored_once_per_namespace() {
    let (_dev, s) = mem_store(8);
    let bytes = block(7, 50_000);
    s.put("default", "a", &bytes, &synced()).unwrap();
    s.put("default", "b", &bytes, &synced()).unwrap();
    s.put("other", "a", &bytes, &synced()).unwrap();
    let st = s.stats();
    assert_eq!((st.keys, st.blocks, st.dedup_hits), (3, 2, 1));
    assert_eq!(st.dedup_saved_bytes, 50_000);
    s.delete("default", "a", Durability::Synced).unwrap();
    assert_eq!(get(&s, "b").unwrap(), bytes);
    assert_eq!(s.stats().blocks, 2);
    s.delete("default", "b", Durability::Synced).unwrap();
    assert_eq!(s.stats().blocks, 1);
}

#[test]
fn every_key_reads_back_its_own_description_whatever_else_stored_the_same_bytes() {
    use kvhoard_format::{BlockDesc, Dtype, Layout};
    let (dev, s) = mem_store(8);
    let bytes = block(11, 64 * 1024);
    let shaped = |shape: Vec<u64>| PutOptions {
        desc: Some(BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape }),
        ..synced()
    };
    let (a, b) = (shaped(vec![2, 4, 64, 64]), shaped(vec![2, 2, 128, 64]));
    s.put("default", "a", &bytes, &a).unwrap();
    s.put("default", "b", &bytes, &b).unwrap();
    s.put("default", "plain", &bytes, &synced()).unwrap();
    s.put("default", "a-again", &bytes, &a).unwrap();
    let st = s.stats();
    assert_eq!((st.keys, st.blocks), (4, 3), "one block per description, shared by keys that agree");
    let desc_of = |s: &Store, key: &str| s.get("default", key, ReadOptions::default()).unwrap().unwrap().meta.desc;
    let check = |s: &Store| {
        assert_eq!(desc_of(s, "a"), a.desc.clone().unwrap());
        assert_eq!(desc_of(s, "b"), b.desc.clone().unwrap());
        assert_eq!(desc_of(s, "plain"), BlockDesc::opaque());
        assert_eq!(desc_of(s, "a-again"), a.desc.clone().unwrap());
        assert_eq!(s.meta("default", "b").unwrap().unwrap().desc, b.desc.clone().unwrap());
        assert_eq!(
            s.get_by_hash("default", blake3::hash(&bytes).as_bytes(), ReadOptions::default())
                .unwrap()
                .unwrap()
                .to_vec(),
            bytes
        );
    };
    check(&s);
    // The same after a restart from the log alone and from a checkpoint.
    let (dev2, s2) = reopen(&dev, CrashMode::DropAll);
    check(&s2);
    std::mem::forget(s);
    s2.close().unwrap();
    let (_d, s3) = reopen(&dev2, CrashMode::KeepAll);
    assert!(s3.recovery_report().checkpoint_seq.is_some());
    check(&s3);
}

#[test]
fn deleted_keys_do_not_come_back_after_restart() {
    let (dev, s) = mem_store(8);
    s.put("default", "a", &block(1, 5000), &synced()).unwrap();
    s.put("default", "b", &block(2, 5000), &synced()).unwrap();
    assert!(s.delete("default", "a", Durability::Synced).unwrap());
    assert!(!s.delete("default", "a", Durability::Synced).unwrap());
    let (_d, s2) = reopen(&dev, CrashMode::DropAll);
    assert!(get(&s2, "a").is_none());
    assert_eq!(get(&s2, "b").unwrap(), block(2, 5000));
    std::mem::forget(s);
}

#[test]
fn clean_close_reopens_from_the_checkpoint_alone() {
    let (dev, s) = mem_store(8);
    for i in 0..50 {
        s.put("default", &format!("k{i}"), &block(i, 9000), &PutOptions::default()).unwrap();
    }
    s.close().unwrap();
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(s2.recovery_report().records_replayed, 0);
    assert!(s2.recovery_report().checkpoint_seq.is_some());
    for i in 0..50 {
        assert_eq!(get(&s2, &format!("k{i}")).unwrap(), block(i, 9000));
    }
}

#[test]
fn a_full_volume_reclaims_the_oldest_segment_and_keeps_accepting_puts() {
    let (dev, s) = mem_store(4);
    let n = 200u64;
    for i in 0..n {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &PutOptions::default()).unwrap();
    }
    let st = s.stats();
    assert!(st.evicted_keys > 0, "no key was evicted: {st:?}");
    assert!(st.segments_reclaimed > 0, "no segment was reclaimed: {st:?}");
    assert_eq!(st.keys + st.evicted_keys, n);
    // The newest blocks survive; evicted ones are misses, never wrong bytes.
    assert_eq!(get(&s, &format!("k{}", n - 1)).unwrap(), block(n - 1, 60_000));
    let live: Vec<u64> = (0..n).filter(|i| get(&s, &format!("k{i}")).is_some()).collect();
    assert_eq!(live.len() as u64, st.keys);
    s.close().unwrap();
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    let after: Vec<u64> = (0..n).filter(|i| get(&s2, &format!("k{i}")).is_some()).collect();
    assert_eq!(after, live, "dropped blocks must not reappear after restart");
}

#[test]
fn dropped_blocks_do_not_reappear_after_a_crash() {
    let (dev, s) = mem_store(4);
    for i in 0..200u64 {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &synced()).unwrap();
    }
    let live: Vec<u64> = (0..200).filter(|i| get(&s, &format!("k{i}")).is_some()).collect();
    let (_d, s2) = reopen(&dev, CrashMode::DropAll);
    let after: Vec<u64> = (0..200).filter(|i| get(&s2, &format!("k{i}")).is_some()).collect();
    assert_eq!(after, live);
    std::mem::forget(s);
}

#[test]
fn a_block_larger_than_a_segment_is_refused_clearly() {
    let (_dev, s) = mem_store(4);
    let err = s.put("default", "big", &vec![0u8; SEG as usize], &PutOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::BlockTooLarge { .. }), "{err}");
    assert!(err.to_string().contains("--segment-size"));
}

#[test]
fn bad_names_are_refused_and_nothing_is_lost() {
    let (_dev, s) = mem_store(4);
    s.put("default", "ok", b"x", &PutOptions::default()).unwrap();
    assert!(matches!(s.put("", "k", b"x", &PutOptions::default()), Err(StoreError::InvalidArgument { .. })));
    assert!(matches!(
        s.put("default", &"k".repeat(5000), b"x", &PutOptions::default()),
        Err(StoreError::InvalidArgument { .. })
    ));
    assert!(matches!(s.put("default", "", b"x", &PutOptions::default()), Err(StoreError::InvalidArgument { .. })));
    assert!(s.get("a/b", "k", ReadOptions::default()).is_err());
    assert_eq!(get(&s, "ok").unwrap(), b"x");
}

#[test]
fn ttl_expires_keys() {
    let ms = Arc::new(AtomicU64::new(1_700_000_000_000));
    let dev = Arc::new(MemDevice::new(SEG * 6));
    let opts = StoreOptions { clock: Clock::manual(ms.clone()), ..StoreOptions::default() };
    let s =
        Store::create_on(dev.clone(), &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts.clone())
            .unwrap();
    s.put("default", "short", b"abc", &PutOptions { ttl_secs: Some(10), ..PutOptions::default() }).unwrap();
    s.put("default", "forever", b"def", &PutOptions::default()).unwrap();
    assert!(s.contains("default", "short").unwrap());
    ms.fetch_add(11_000, std::sync::atomic::Ordering::Relaxed);
    assert!(!s.contains("default", "short").unwrap());
    assert!(get(&s, "short").is_none());
    assert_eq!(get(&s, "forever").unwrap(), b"def");
}

#[test]
fn a_torn_tail_is_cut_and_new_writes_succeed() {
    let (dev, s) = mem_store(8);
    s.put("default", "durable", &block(1, 30_000), &synced()).unwrap();
    for i in 0..5 {
        s.put("default", &format!("maybe{i}"), &block(10 + i, 30_000), &PutOptions::default()).unwrap();
    }
    for seed in 0..20 {
        let (_d, s2) = reopen(&dev, CrashMode::Random(seed));
        assert_eq!(get(&s2, "durable").unwrap(), block(1, 30_000));
        for i in 0..5 {
            if let Some(b) = get(&s2, &format!("maybe{i}")) {
                assert_eq!(b, block(10 + i, 30_000));
            }
        }
        s2.put("default", "after", b"new", &synced()).unwrap();
        assert_eq!(get(&s2, "after").unwrap(), b"new");
        assert_eq!(s2.stats().read_errors, 0);
    }
    std::mem::forget(s);
}

#[test]
fn a_flipped_payload_bit_is_a_counted_miss_not_garbage() {
    let (dev, s) = mem_store(8);
    s.put("default", "a", &block(1, 8192), &synced()).unwrap();
    s.close().unwrap();
    let mut image = dev.image();
    let meta_unit = {
        let s2 = Store::open_on(Arc::new(MemDevice::from_image(image.clone())), StoreOptions::default()).unwrap();
        let b = s2.get("default", "a", ReadOptions::default()).unwrap().unwrap();
        let sb = s2.superblock().clone();
        sb.unit_offset(b.meta.location.segment, b.meta.location.unit)
    };
    image[(meta_unit + 4096 + 100) as usize] ^= 1;
    let s3 = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap();
    assert!(s3.get("default", "a", ReadOptions::default()).unwrap().is_none());
    assert_eq!(s3.stats().read_errors, 1);
}

#[test]
fn a_failed_write_is_not_acknowledged_and_poisons_writes_until_reopen() {
    let (dev, s) = mem_store(8);
    s.put("default", "before", b"ok", &synced()).unwrap();
    dev.fail_nth(FaultKind::Write, 1);
    assert!(s.put("default", "failed", &block(3, 9000), &synced()).is_err());
    assert!(matches!(s.put("default", "later", b"x", &synced()), Err(StoreError::Poisoned { .. })));
    assert_eq!(get(&s, "before").unwrap(), b"ok");
    assert!(get(&s, "failed").is_none());
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(get(&s2, "before").unwrap(), b"ok");
    s2.put("default", "later", b"x", &synced()).unwrap();
    std::mem::forget(s);
}

/// Records reserved after the log writer has stopped (as if its thread had ended) are never
/// written: they fail as a failed write does, and close reports it instead of waiting for them
/// forever. The volume opens with every acknowledged block.
#[test]
fn records_handed_to_a_stopped_writer_fail_and_close_does_not_hang() {
    let (dev, s) = mem_store(8);
    s.put("default", "before", b"ok", &synced()).unwrap();
    s.parts.handoff.close();
    let err = s.put("default", "racing", &block(4, 9000), &synced()).unwrap_err();
    assert!(matches!(err, StoreError::Closed), "{err:?}");
    assert!(get(&s, "racing").is_none());
    assert!(matches!(s.close(), Err(StoreError::Poisoned { .. })));
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(get(&s2, "before").unwrap(), b"ok");
    assert!(get(&s2, "racing").is_none());
}

/// A batch larger than one round of reads, with misses, repeated keys, blocks still being
/// written and a damaged record: every hit is its own block, the damaged one a counted miss.
#[test]
fn get_batch_reads_every_record_in_rounds_and_checks_each() {
    let (dev, s) = mem_store(100);
    // 80 records of about 900 KB, one per 1 MiB segment: 72 MB, more than one round's 64 MiB.
    let big: Vec<Vec<u8>> = (0..80).map(|i| block(100 + i, 900_000 - 1000 * i as usize)).collect();
    for (i, b) in big.iter().enumerate() {
        s.put("default", &format!("big{i}"), b, &synced()).unwrap();
    }
    s.put("default", "damaged", &block(7, 20_000), &synced()).unwrap();
    s.close().unwrap();
    // Flip a payload byte of "damaged" on the device.
    let mut image = dev.image();
    let at = {
        let s2 = Store::open_on(Arc::new(MemDevice::from_image(image.clone())), StoreOptions::default()).unwrap();
        let b = s2.get("default", "damaged", ReadOptions::default()).unwrap().unwrap();
        s2.superblock().unit_offset(b.meta.location.segment, b.meta.location.unit)
    };
    image[(at + 4096 + 10) as usize] ^= 1;
    let s = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap();
    let buffered = PutOptions { durability: Durability::Buffered, ..PutOptions::default() };
    s.put("default", "fresh", &block(9, 5000), &buffered).unwrap();
    let mut keys: Vec<String> = (0..80).map(|i| format!("big{i}")).collect();
    keys.extend(["missing", "big3", "damaged", "fresh"].map(String::from));
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = s.get_batch("default", &names, ReadOptions { verify_hash: true }).unwrap();
    assert_eq!(got.len(), names.len());
    for (i, b) in big.iter().enumerate() {
        assert_eq!(got[i].as_ref().map(|g| g.to_vec()).as_ref(), Some(b), "big{i}");
    }
    assert!(got[80].is_none(), "a missing key");
    assert_eq!(got[81].as_ref().unwrap().to_vec(), big[3], "a repeated key");
    assert!(got[82].is_none(), "a damaged record is a miss");
    assert_eq!(s.stats().read_errors, 1);
    assert_eq!(got[83].as_ref().unwrap().to_vec(), block(9, 5000), "a buffered put, written or not");
}

/// A batch decodes each compressed frame on a worker as its read arrives: every block is what
/// a single get returns, a damaged frame is a counted miss, and raw blocks, misses and repeats
/// keep their places.
#[test]
fn get_batch_decodes_frames_as_they_arrive_and_a_damaged_one_is_a_counted_miss() {
    let (dev, s) = mem_store(16);
    s.set_policy("default", crate::Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let specs = ["lossless", "quant:bits=4", "quant:bits=8"];
    let mut names = Vec::new();
    for i in 0..9u64 {
        let synth = kvhoard_kernels::synth::Synth::new(2, 64, 2, 64, 40 + i);
        let spec = kvhoard_kernels::CodecSpec::parse(specs[i as usize % specs.len()]).unwrap();
        let opts = PutOptions { desc: Some(synth.desc.desc()), codec: Some(spec), ..synced() };
        s.put("default", &format!("kv{i}"), &synth.generate(), &opts).unwrap();
        names.push(format!("kv{i}"));
    }
    s.put("default", "raw", &block(11, 70_000), &synced()).unwrap();
    // A frame that passes its crc32c (the client compressed it, so the store checksums what it
    // is given) but does not decode to its name: kv0's frame with bytes in its middle changed.
    let frame = s.get_frame("default", "kv0", ReadOptions::default()).unwrap().unwrap();
    let mut forged = frame.to_vec();
    let mid = forged.len() / 2;
    forged[mid..mid + 64].iter_mut().for_each(|b| *b = !*b);
    let forged_opts = PutOptions {
        compression: Some(frame.meta.compression.clone()),
        // Another name than kv0's, or the put would only link to kv0's block.
        raw: Some((frame.meta.raw_len, [7; 32])),
        desc: Some(frame.meta.desc.clone()),
        ..synced()
    };
    s.put("default", "forged", &forged, &forged_opts).unwrap();
    s.close().unwrap();
    // Flip a payload byte of the lossless frame kv3 on the device.
    let mut image = dev.image();
    let at = {
        let s2 = Store::open_on(Arc::new(MemDevice::from_image(image.clone())), StoreOptions::default()).unwrap();
        let f = s2.get_frame("default", "kv3", ReadOptions::default()).unwrap().unwrap();
        assert!(f.meta.stored_len < f.meta.raw_len, "kv3 is stored compressed");
        s2.superblock().unit_offset(f.meta.location.segment, f.meta.location.unit)
    };
    image[(at + 4096 + 10) as usize] ^= 1;
    let s = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap();
    let opts = ReadOptions { verify_hash: true };
    let want: Vec<Option<Vec<u8>>> =
        names.iter().map(|k| s.get("default", k, opts).unwrap().map(|b| b.to_vec())).collect();
    assert!(want[3].is_none(), "the damaged frame is a miss for a single get");
    assert!(s.get("default", "forged", opts).unwrap().is_none(), "a frame that does not decode to its name");
    assert_eq!(s.stats().read_errors, 2);
    let mut keys: Vec<&str> = names.iter().map(String::as_str).collect();
    keys.extend(["raw", "missing", "kv1", "forged"]);
    let got = s.get_batch("default", &keys, opts).unwrap();
    assert_eq!(got.len(), keys.len());
    for (i, w) in want.iter().enumerate() {
        assert_eq!(got[i].as_ref().map(|b| b.to_vec()), *w, "kv{i}");
        if let Some(b) = &got[i] {
            assert!(b.meta.stored_len < b.meta.raw_len && b.len() as u64 == b.meta.raw_len, "kv{i} decoded");
        }
    }
    assert_eq!(got[9].as_ref().unwrap().to_vec(), block(11, 70_000), "a raw block in the batch");
    assert!(got[10].is_none(), "a missing key");
    assert_eq!(got[11].as_ref().map(|b| b.to_vec()), want[1], "a repeated key");
    assert!(got[12].is_none(), "the frame that does not decode to its name is a miss in a batch too");
    assert_eq!(s.stats().read_errors, 4, "each bad frame counted once more, by the batch");
}

/// `get_batch_into` reads the compressed blocks of a batch larger than a round in slices, each
/// decoded and copied out before the next is read: every key still gets its own bytes.
#[test]
fn get_batch_into_reads_more_compressed_blocks_than_a_round_holds() {
    let dev = Arc::new(MemDevice::new(10 * (8 << 20)));
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 8 << 20 };
    let s = Store::create_on(dev, &create, StoreOptions::default()).unwrap();
    s.set_policy("default", crate::Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    // Four distinct 4 MiB blocks under 20 keys: 80 MiB decoded, more than a round's 64 MiB.
    let synths: Vec<_> = (0..4u64).map(|i| kvhoard_kernels::synth::Synth::new(4, 256, 8, 128, 90 + i)).collect();
    let blocks: Vec<Vec<u8>> = synths.iter().map(|s| s.generate()).collect();
    let spec = kvhoard_kernels::CodecSpec::parse("quant:bits=4").unwrap();
    let keys: Vec<String> = (0..20).map(|i| format!("q{i}")).collect();
    for (i, key) in keys.iter().enumerate() {
        let opts = PutOptions { desc: Some(synths[i % 4].desc.desc()), codec: Some(spec), ..synced() };
        s.put("default", key, &blocks[i % 4], &opts).unwrap();
    }
    let want: Vec<Vec<u8>> =
        (0..4).map(|i| s.get("default", &keys[i], ReadOptions::default()).unwrap().unwrap().to_vec()).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut storage: Vec<Vec<u8>> = names.iter().map(|_| vec![0u8; 4 << 20]).collect();
    let mut bufs: Vec<&mut [u8]> = storage.iter_mut().map(Vec::as_mut_slice).collect();
    let got = s.get_batch_into("default", &names, &mut bufs, ReadOptions::default()).unwrap();
    for (i, g) in got.iter().enumerate() {
        let (meta, n) = g.as_ref().unwrap_or_else(|| panic!("q{i} found"));
        assert!(meta.stored_len < meta.raw_len, "q{i} stored compressed");
        assert_eq!(n, &want[i % 4].len());
        assert!(storage[i][..*n] == want[i % 4][..], "q{i}: its own block, decoded");
    }
}

#[test]
fn get_batch_asks_each_tier_once_per_key_across_rounds() {
    // 300 KB of DRAM holds none of these 900 KB records: every key is a DRAM miss, read from
    // the log, and the key that opens the second round is asked once, not again.
    let (_dev, s) = dram_store(100, 300_000);
    let big: Vec<Vec<u8>> = (0..80).map(|i| block(300 + i, 900_000)).collect();
    for (i, b) in big.iter().enumerate() {
        s.put("default", &format!("big{i}"), b, &synced()).unwrap();
    }
    let keys: Vec<String> = (0..80).map(|i| format!("big{i}")).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = s.get_batch("default", &names, ReadOptions::default()).unwrap();
    assert!(got.iter().zip(&big).all(|(g, b)| g.as_ref().map(|g| g.to_vec()).as_ref() == Some(b)));
    let (dram, ssd) = (tier(&s, "dram"), tier(&s, "ssd"));
    assert_eq!((dram.hits, dram.misses), (0, 80));
    assert_eq!((ssd.hits, ssd.load_latency.count), (80, 80));
}

/// Puts racing close from other threads: each one completes or fails as closed, close itself
/// succeeds (nothing is poisoned), and every acknowledged put is there after reopening.
#[test]
fn puts_racing_close_complete_or_fail_cleanly() {
    // Room for every put: nothing is reclaimed, so every acknowledged put must be found.
    let (dev, s) = mem_store(24);
    let s = Arc::new(s);
    let writers: Vec<_> = (0..4u64)
        .map(|t| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                let mut acked = Vec::new();
                for i in 0..400u64 {
                    let key = format!("t{t}-{i}");
                    match s.put("default", &key, &block(t * 100_000 + i, 3000), &PutOptions::default()) {
                        Ok(_) => acked.push((key, t * 100_000 + i)),
                        Err(StoreError::Closed) => break,
                        Err(e) => panic!("a put racing close failed with {e:?}"),
                    }
                }
                acked
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(5));
    s.close().unwrap();
    let acked: Vec<_> = writers.into_iter().flat_map(|w| w.join().unwrap()).collect();
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    for (key, seed) in &acked {
        assert_eq!(get(&s2, key).as_deref(), Some(&block(*seed, 3000)[..]), "{key}");
    }
}

#[test]
fn a_failed_sync_is_not_acknowledged() {
    let (dev, s) = mem_store(8);
    dev.fail_nth(FaultKind::Sync, 1);
    assert!(s.put("default", "a", b"x", &synced()).is_err());
    assert!(s.stats().poisoned.is_some());
    std::mem::forget(s);
}

#[test]
fn listing_pages_through_live_keys_only() {
    let (_dev, s) = mem_store(8);
    for i in 0..30 {
        s.put("default", &format!("k{i:02}"), &block(i, 3000), &PutOptions::default()).unwrap();
    }
    s.put("other", "x", b"x", &PutOptions::default()).unwrap();
    s.delete("default", "k05", Durability::Written).unwrap();
    s.put("default", "k07", b"overwritten", &PutOptions::default()).unwrap();
    let mut keys = Vec::new();
    let mut cursor = None;
    loop {
        let page = s.list("default", cursor, 7).unwrap();
        keys.extend(page.entries.iter().map(|e| e.key.clone()));
        match page.next {
            Some(c) => cursor = Some(c.to_string().parse().unwrap()),
            None => break,
        }
    }
    let mut expected: Vec<String> = (0..30).filter(|&i| i != 5 && i != 7).map(|i| format!("k{i:02}")).collect();
    expected.push("k07".into());
    assert_eq!(keys, expected);
}

#[test]
fn a_corrupt_superblock_copy_still_opens() {
    let (dev, s) = mem_store(4);
    s.put("default", "a", b"x", &synced()).unwrap();
    s.close().unwrap();
    let mut image = dev.image();
    image[20] ^= 0xff;
    let s2 = Store::open_on(Arc::new(MemDevice::from_image(image.clone())), StoreOptions::default()).unwrap();
    assert_eq!(get(&s2, "a").unwrap(), b"x");
    drop(s2);
    image[4096 + 20] ^= 0xff;
    let err = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAVolume { .. }), "{err}");
}

#[test]
fn concurrent_writers_and_readers_see_their_own_bytes() {
    let (_dev, s) = mem_store(16);
    let s = Arc::new(s);
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..40u64 {
                    let key = format!("t{t}-{i}");
                    let bytes = block(t * 1000 + i, 7000);
                    let d = [Durability::Buffered, Durability::Written, Durability::Synced][(i % 3) as usize];
                    s.put("default", &key, &bytes, &PutOptions { durability: d, ..PutOptions::default() }).unwrap();
                    assert_eq!(get(&s, &key).unwrap(), bytes);
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    assert_eq!(s.stats().keys, 160);
    assert_eq!(s.stats().read_errors, 0);
}

#[test]
fn device_capacity_is_reported() {
    let (dev, s) = mem_store(4);
    assert_eq!(s.stats().segments, 4);
    assert!(dev.capacity_bytes() >= s.stats().capacity_bytes);
}

#[test]
fn concurrent_writers_fill_segments_instead_of_sealing_each_others_new_ones() {
    // 6 segments of 1 MiB hold 5 * 12 blocks of 80 KiB; 4 threads write 60 of them. If a
    // thread sealed the segment another thread had just opened, the volume would run out of
    // room and evict.
    let dev = Arc::new(SlowDevice(MemDevice::new(SEG * 9)));
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Arc::new(Store::create_on(dev, &create, StoreOptions::default()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let s = s.clone();
            std::thread::spawn(move || {
                for i in 0..15u64 {
                    s.put("default", &format!("t{t}-{i}"), &block(t * 100 + i, 80_000), &PutOptions::default())
                        .unwrap();
                }
            })
        })
        .collect();
    threads.into_iter().for_each(|t| t.join().unwrap());
    let st = s.stats();
    assert_eq!(st.evicted_keys, 0, "{st:?}");
    assert_eq!(st.keys, 60);
}

/// A device whose writes take a while, so that concurrent writers overlap.
#[derive(Debug)]
struct SlowDevice(MemDevice);

impl BlockDevice for SlowDevice {
    fn capacity_bytes(&self) -> u64 {
        self.0.capacity_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), crate::device::DeviceError> {
        self.0.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), crate::device::DeviceError> {
        std::thread::sleep(std::time::Duration::from_millis(2));
        self.0.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), crate::device::DeviceError> {
        self.0.sync()
    }
    fn capabilities(&self) -> crate::device::Capabilities {
        self.0.capabilities()
    }
}

/// Reclaims a chosen segment when it is sealed, else the oldest: lets a test drop the segment
/// holding a key's newest version while an older segment still holds an older one.
#[derive(Debug)]
struct ChosenVictim(Arc<std::sync::atomic::AtomicU32>);

impl crate::placement::Placement for ChosenVictim {
    fn on_put(&self, block: &crate::placement::BlockInfo<'_>) -> crate::placement::PutPlan {
        crate::placement::Fifo.on_put(block)
    }

    fn on_load(&self, block: &crate::placement::BlockInfo<'_>) -> bool {
        crate::placement::Fifo.on_load(block)
    }

    fn victim(&self, sealed: &[crate::placement::SegmentView]) -> u32 {
        let chosen = self.0.load(std::sync::atomic::Ordering::Relaxed);
        if sealed.iter().any(|s| s.index == chosen) {
            chosen
        } else {
            crate::placement::Fifo.victim(sealed)
        }
    }
}

#[test]
fn reclaiming_a_newer_segment_never_brings_back_an_older_version() {
    let dev = Arc::new(MemDevice::new(SEG * 7));
    let chosen = Arc::new(std::sync::atomic::AtomicU32::new(u32::MAX));
    let opts = StoreOptions { placement: Arc::new(ChosenVictim(chosen.clone())), ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
    let segment_of = |key: &str| s.get("default", key, ReadOptions::default()).unwrap().unwrap().meta.location.segment;
    s.put("default", "k", &block(1, 100_000), &synced()).unwrap();
    let old = segment_of("k");
    let mut i = 0;
    while s.put("default", &format!("filler{i}"), &block(100 + i, 200_000), &synced()).is_ok()
        && segment_of(&format!("filler{i}")) == old
    {
        i += 1;
    }
    s.put("default", "k", &block(2, 100_000), &synced()).unwrap();
    let new = segment_of("k");
    assert_ne!(old, new);
    chosen.store(new, std::sync::atomic::Ordering::Relaxed);
    let mut j = 0;
    while get(&s, "k").is_some() {
        s.put("default", &format!("more{j}"), &block(1000 + j, 200_000), &synced()).unwrap();
        j += 1;
        assert!(j < 100, "the chosen segment was never reclaimed: {:?}", s.stats());
    }
    assert!(
        get(&s, &format!("filler{}", i.saturating_sub(1))).is_some() || i == 0,
        "the old segment was reclaimed too early"
    );
    for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
        let s2 = Store::open_on(Arc::new(dev.crash(mode)), opts.clone()).unwrap();
        assert!(get(&s2, "k").is_none(), "after a crash ({mode:?}) k came back at its old version");
    }
    std::mem::forget(s);
}

#[test]
fn clean_restarts_resume_the_last_segment_instead_of_using_a_new_one() {
    let (dev, s) = mem_store(4);
    s.put("default", "k0", b"first", &synced()).unwrap();
    s.close().unwrap();
    drop(s);
    for i in 1..40 {
        let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
        s.put("default", &format!("k{i}"), b"one small block per open", &synced()).unwrap();
        s.close().unwrap();
    }
    let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
    let st = s.stats();
    assert_eq!((st.keys, st.evicted_keys), (40, 0));
    assert_eq!(st.segments_free, st.segments - 1, "{st:?}");
}

#[test]
fn records_appended_to_a_resumed_segment_survive_a_crash_after_it_is_sealed_again() {
    let (dev, s) = mem_store(8);
    s.put("default", "before", &block(1, 50_000), &synced()).unwrap();
    s.close().unwrap();
    drop(s);
    // Resume the segment, fill it (sealing it again further on) and go on into the next one,
    // with no checkpoint written in between.
    let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
    for i in 0..30u64 {
        s.put("default", &format!("k{i}"), &block(100 + i, 50_000), &synced()).unwrap();
    }
    assert!(s.stats().segments_sealed >= 1);
    for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
        let (_d, s2) = reopen(&dev, mode);
        assert_eq!(get(&s2, "before").unwrap(), block(1, 50_000));
        for i in 0..30u64 {
            assert_eq!(get(&s2, &format!("k{i}")).unwrap(), block(100 + i, 50_000), "k{i} lost after {mode:?}");
        }
    }
    std::mem::forget(s);
}

/// `s` killed (`kill -9`: what it wrote stays, the boot with it), and the payload of the record
/// `key` names damaged by one bit.
fn kill_and_damage(dev: &Arc<MemDevice>, s: Store, key: &str) -> Arc<MemDevice> {
    let meta = s.get("default", key, ReadOptions::default()).unwrap().unwrap().meta;
    let start = s.superblock().unit_offset(meta.location.segment, meta.location.unit);
    std::mem::forget(s);
    let crashed = Arc::new(dev.crash(CrashMode::KeepAll));
    let image = crashed.image();
    let header = kvhoard_format::record::RecordHeader::decode(&image[start as usize..]).unwrap();
    let unit = start + header.payload_offset();
    let mut bytes = image[unit as usize..(unit + kvhoard_format::UNIT_BYTES) as usize].to_vec();
    bytes[10] ^= 1;
    crashed.write_at(&bytes, unit).unwrap();
    crashed
}

#[test]
fn a_segment_is_appended_to_only_in_the_boot_its_use_began_in() {
    // A use's header keeps the boot it began in, and recovery trusts the writer (a crash of the
    // process) only where that boot is the machine's current one. Were a segment begun before a
    // reboot appended to after it (resumed after a clean close, or continued after a power
    // loss), a `kill -9` would be taken for a power loss and a damaged record for a torn tail:
    // `k` would fall back to its older version instead of becoming a miss.
    for clean_close in [true, false] {
        let (dev, s) = mem_store(8);
        s.put("default", "k", &block(1, 50_000), &synced()).unwrap();
        if clean_close {
            s.close().unwrap();
        }
        // A reboot: a clean one after the close (everything was synced, so nothing is lost), or
        // a power loss with the segment open.
        let rebooted = Arc::new(dev.crash(CrashMode::DropAll));
        std::mem::forget(s);
        let s = Store::open_on(rebooted.clone(), StoreOptions::default()).unwrap();
        let free = s.stats().segments_free;
        s.put("default", "k", &block(2, 50_000), &synced()).unwrap();
        assert_eq!(
            s.stats().segments_free,
            free - 1,
            "clean close {clean_close}: the segment of the boot before was appended to"
        );
        s.put("default", "after", &block(3, 50_000), &synced()).unwrap();
        // `kill -9`, and the newest record of `k` damaged in its payload.
        let crashed = kill_and_damage(&rebooted, s, "k");
        let s2 = Store::open_on(crashed, StoreOptions::default()).unwrap();
        assert_eq!(get(&s2, "k"), None, "clean close {clean_close}: k came back at the version before its damaged one");
        assert_eq!(get(&s2, "after").unwrap(), block(3, 50_000));
    }
}

#[test]
fn a_segment_whose_summary_alone_covers_a_damaged_record_is_never_appended_to() {
    // A `kill -9`, and a damaged record in the middle of the open segment: recovery trusts the
    // writer (same boot), makes the key a miss and writes a tombstone in the record's place,
    // which only the segment's summary keeps. Were the segment appended to (continued at once,
    // or resumed after a clean close, also once fsck acknowledged the tombstone), a power loss
    // before its next seal would leave a recovery that trusts no writer the records alone: it
    // would take the damaged record for a torn tail and drop every synced record after it.
    for then in ["continue", "close", "acknowledge"] {
        let (dev, s) = mem_store(8);
        s.put("default", "before", &block(1, 50_000), &synced()).unwrap();
        s.put("default", "mid", &block(2, 50_000), &synced()).unwrap();
        s.put("default", "tail", &block(3, 50_000), &synced()).unwrap();
        let crashed = kill_and_damage(&dev, s, "mid");
        let mut s2 = Store::open_on(crashed.clone(), StoreOptions::default()).unwrap();
        assert_eq!(get(&s2, "mid"), None);
        if then != "continue" {
            s2.close().unwrap();
            drop(s2);
            if then == "acknowledge" {
                let options = crate::check::ScanOptions { deep: false, summaries_only: true };
                let scan = crate::check::scan_volume(crashed.as_ref(), options, &|_, _| {}).unwrap();
                let done = crate::check::repair::acknowledge_recovered(crashed.as_ref(), &scan).unwrap();
                assert_eq!(done.len(), 1, "{done:?}");
            }
            s2 = Store::open_on(crashed.clone(), StoreOptions::default()).unwrap();
        }
        let free = s2.stats().segments_free;
        s2.put("default", "later", &block(4, 50_000), &synced()).unwrap();
        assert_eq!(s2.stats().segments_free, free - 1, "{then}: the segment with the damaged record was appended to");
        std::mem::forget(s2);
        let s3 = Store::open_on(Arc::new(crashed.crash(CrashMode::DropAll)), StoreOptions::default()).unwrap();
        for (key, seed) in [("before", 1), ("tail", 3), ("later", 4)] {
            assert!(get(&s3, key) == Some(block(seed, 50_000)), "{then}: {key} was lost");
        }
        assert_eq!(get(&s3, "mid"), None);
    }
}

#[test]
fn a_close_that_changed_nothing_writes_nothing() {
    let (dev, s) = mem_store(8);
    for i in 0..5u64 {
        s.put("default", &format!("k{i}"), &block(i, 50_000), &synced()).unwrap();
    }
    s.close().unwrap();
    drop(s);
    let image = dev.image();
    // Opened from its checkpoint, read and closed (`kvhoard stat`, `get`): not one byte changes.
    for _ in 0..2 {
        let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
        assert_eq!(get(&s, "k3").unwrap(), block(3, 50_000));
        assert!(s.stats().keys == 5);
        s.close().unwrap();
        assert!(dev.image() == image, "a close after only reads wrote to the volume");
    }
    // A delete changes the index and writes a tombstone: the close writes a checkpoint.
    let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
    assert!(s.delete("default", "k3", Durability::Synced).unwrap());
    s.close().unwrap();
    let after_delete = dev.image();
    assert!(after_delete != image);
    let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
    assert!(s.recovery_report().checkpoint_alone(), "{:?}", s.recovery_report());
    assert_eq!(get(&s, "k3"), None);
    s.close().unwrap();
    assert!(dev.image() == after_delete);
    // An open that had to replay the log writes a checkpoint at close, so the next one need not.
    let s = Store::open_on(dev.clone(), StoreOptions::default()).unwrap();
    s.put("default", "late", &block(9, 50_000), &synced()).unwrap();
    let (crashed, s2) = reopen(&dev, CrashMode::KeepAll);
    std::mem::forget(s);
    assert!(!s2.recovery_report().checkpoint_alone());
    s2.close().unwrap();
    let s3 = Store::open_on(crashed, StoreOptions::default()).unwrap();
    assert!(s3.recovery_report().checkpoint_alone(), "{:?}", s3.recovery_report());
    assert_eq!(get(&s3, "late").unwrap(), block(9, 50_000));
}

#[test]
fn a_summary_never_outlives_the_records_it_lists() {
    // Written (unsynced) puts that fill a segment, so it is sealed; then crashes that keep or drop
    // each unsynced write at random. A kept summary listing a dropped record would make recovery
    // index bytes that are not there: a damaged-block miss on read.
    let (dev, s) = store_with_sealed(1);
    for seed in 0..200 {
        let s2 = Store::open_on(Arc::new(dev.crash(CrashMode::Random(seed))), StoreOptions::default()).unwrap();
        for i in 0..40u64 {
            if let Some(b) = get(&s2, &format!("k{i}")) {
                assert_eq!(b, block(i, 60_000));
            }
        }
        assert_eq!(s2.stats().read_errors, 0, "seed {seed}: recovery indexed a record that was not durable");
    }
    std::mem::forget(s);
}

#[test]
fn a_link_is_written_only_once_the_block_it_names_in_an_earlier_segment_is_durable() {
    // `k` is synced at `old`; then, unsynced, `x` is put with new bytes, the segment is filled so
    // that it seals, and `k` is put with `x`'s bytes: a link in the next segment. Had the link
    // been written while `x`'s record was not durable, a power loss keeping the link and
    // dropping that record would replay `k` as naming evicted bytes: a miss, its synced version
    // lost. So the link put makes `x`'s record durable first.
    let old = block(1, 50_000);
    let new = block(2, 50_000);
    let (dev, s) = mem_store(8);
    s.put("default", "k", &old, &synced()).unwrap();
    s.put("default", "x", &new, &PutOptions::default()).unwrap();
    // A link to bytes in the open segment needs no sync: a scan stops at them if they are lost.
    let syncs = s.stats().syncs;
    s.put("default", "y", &new, &PutOptions::default()).unwrap();
    assert_eq!(s.stats().syncs, syncs, "a link within the open segment synced");
    let sealed = s.stats().segments_sealed;
    let mut i = 0;
    while s.stats().segments_sealed == sealed {
        s.put("default", &format!("fill{i}"), &block(100 + i, 50_000), &PutOptions::default()).unwrap();
        i += 1;
    }
    s.put("default", "k", &new, &PutOptions::default()).unwrap();
    assert!(s.stats().syncs > syncs, "the link across segments did not sync");
    // A rename writes a link too: `w`, put unsynced, renamed to `z` once its segment sealed.
    let moved = block(3, 50_000);
    s.put("default", "w", &moved, &PutOptions::default()).unwrap();
    let (sealed, syncs) = (s.stats().segments_sealed, s.stats().syncs);
    while s.stats().segments_sealed == sealed {
        s.put("default", &format!("fill{i}"), &block(100 + i, 50_000), &PutOptions::default()).unwrap();
        i += 1;
    }
    assert!(s.rename("default", "w", "z", crate::Durability::Written).unwrap());
    assert!(s.stats().syncs > syncs, "the rename's link across segments did not sync");
    // The rename's sync covered everything before `w`'s record, `k`'s link too; the rename
    // itself was not synced.
    let (_d, after) = reopen(&dev, CrashMode::DropAll);
    assert!(get(&after, "x") == Some(new.clone()), "x's record was not made durable before the link");
    assert!(get(&after, "y") == Some(new.clone()), "y was synced with x");
    assert!(get(&after, "k") == Some(new.clone()), "k's link was synced by the rename's sync");
    assert!(get(&after, "w") == Some(moved.clone()), "w's record was not made durable before the rename");
    assert!(get(&after, "z").is_none(), "the rename was not synced");
    for seed in 0..300 {
        let crashed = Arc::new(dev.crash(CrashMode::Random(seed)));
        fsck_clean(&*crashed, &format!("the image crashed with seed {seed}"));
        let s2 = Store::open_on(crashed, StoreOptions::default()).unwrap();
        let k = get(&s2, "k");
        assert!(k.as_ref() == Some(&old) || k.as_ref() == Some(&new), "seed {seed}: k lost its synced version");
        assert!(get(&s2, "x") == Some(new.clone()), "seed {seed}: x");
        assert!(get(&s2, "y") == Some(new.clone()), "seed {seed}: y");
        let (w, z) = (get(&s2, "w"), get(&s2, "z"));
        assert!(w.as_ref() == Some(&moved) || z.as_ref() == Some(&moved), "seed {seed}: the renamed block is lost");
        assert_eq!(s2.stats().read_errors, 0, "seed {seed}");
    }
    std::mem::forget(s);
}

#[test]
fn a_read_failing_anywhere_in_recovery_fails_the_open_cleanly() {
    // Several sealed segments and an open one, no checkpoint since: recovery reads summaries
    // on a thread ahead of the one applying them. A read failing at any point of that must
    // fail the open with the error (or, past recovery, the read it hit), never hang, panic or
    // open a volume missing acknowledged blocks.
    let (dev, s) = store_with_sealed(2);
    let image = dev.crash(CrashMode::KeepAll).image();
    std::mem::forget(s);
    let mut failed_opens = 0;
    for n in 1..80 {
        let dev = Arc::new(MemDevice::from_image(image.clone()));
        dev.fail_nth(FaultKind::Read, n);
        let Ok(s2) = Store::open_on(dev, StoreOptions::default()) else {
            failed_opens += 1;
            continue;
        };
        for i in 0..40u64 {
            match s2.get("default", &format!("k{i}"), ReadOptions { verify_hash: true }) {
                Ok(got) => assert_eq!(got.map(|b| b.to_vec()), Some(block(i, 60_000)), "n {n}: k{i}"),
                Err(e) => assert!(e.to_string().contains("read"), "n {n}: k{i}: {e}"),
            }
        }
    }
    assert!(failed_opens > 0, "no read of recovery was made to fail");
}

#[test]
fn reused_buffers_never_write_stale_bytes_into_record_padding() {
    let (dev, s) = mem_store(8);
    // Fill the pool with buffers full of non-zero bytes, then store a small block whose record
    // reuses one of them.
    for i in 0..4u64 {
        let big = vec![0xAB; 200_000];
        s.put("default", &format!("big{i}"), &big, &synced()).unwrap();
        drop(s.get("default", &format!("big{i}"), ReadOptions::default()).unwrap());
    }
    s.put("default", "small", &[7u8; 100], &synced()).unwrap();
    let meta = s.get("default", "small", ReadOptions::default()).unwrap().unwrap().meta;
    let start = s.superblock().unit_offset(meta.location.segment, meta.location.unit) as usize;
    let image = dev.image();
    let header = kvhoard_format::record::RecordHeader::decode(&image[start..]).unwrap();
    let payload = start + header.payload_offset() as usize;
    // Between the header and its echo at the end of the first unit: zeros.
    let echo = kvhoard_format::record::echo_of(&image[start..start + 4096]).expect("the header is echoed");
    assert_eq!(echo, &image[start..start + header.encoded_len()], "the echo is the header");
    let echo_start = start + 4096 - 4 - header.encoded_len();
    assert!(
        image[start + header.encoded_len()..echo_start].iter().all(|&b| b == 0),
        "header padding holds stale bytes"
    );
    assert!(image[start + 4096..payload].iter().all(|&b| b == 0), "header padding holds stale bytes");
    assert_eq!(&image[payload..payload + 100], &[7u8; 100][..]);
    assert!(
        image[payload + 100..start + header.record_bytes() as usize].iter().all(|&b| b == 0),
        "payload padding holds stale bytes"
    );
}

fn dram_store(segments: u64, dram_tier_bytes: u64) -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(SEG * (segments + 3)));
    let opts = StoreOptions { dram_tier_bytes, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    (dev.clone(), Store::create_on(dev, &create, opts).unwrap())
}

fn tier(s: &Store, name: &str) -> crate::tier::TierStats {
    s.stats().tiers.into_iter().find(|t| t.tier == name).unwrap()
}

#[test]
fn dram_tier_serves_without_reading_the_device() {
    let (dev, s) = dram_store(8, 1 << 20);
    let a = block(1, 100_000);
    s.put("default", "a", &a, &PutOptions::default()).unwrap();
    // Every device read fails from now on: only the DRAM tier can answer.
    dev.fail_nth(FaultKind::Read, 1);
    assert_eq!(get(&s, "a").unwrap(), a);
    let dram = tier(&s, "dram");
    assert_eq!((dram.hits, dram.misses, dram.admitted), (1, 0, 1));
    assert_eq!(dram.hit_bytes, 100_000);
    assert_eq!(dram.load_latency.count, 1);
    assert!(dram.resident_bytes >= 100_000, "{dram:?}");
    assert!(dram.resident_bytes <= dram.capacity_bytes, "{dram:?}");
}

#[test]
fn a_block_evicted_from_dram_is_read_from_the_log_and_admitted_again() {
    // 300 KB of DRAM holds two 100 KB records, not three.
    let (_dev, s) = dram_store(8, 300_000);
    let blocks: Vec<Vec<u8>> = (0..3).map(|i| block(i, 100_000)).collect();
    for (i, b) in blocks.iter().enumerate() {
        s.put("default", &format!("k{i}"), b, &PutOptions::default()).unwrap();
    }
    let dram = tier(&s, "dram");
    assert_eq!((dram.entries, dram.evictions), (2, 1));
    assert_eq!(get(&s, "k0").unwrap(), blocks[0], "evicted from DRAM, still on the log");
    let (dram, ssd) = (tier(&s, "dram"), tier(&s, "ssd"));
    assert_eq!((dram.misses, ssd.hits, ssd.load_latency.count), (1, 1, 1));
    assert_eq!(get(&s, "k0").unwrap(), blocks[0]);
    assert_eq!(tier(&s, "dram").hits, 1, "the load admitted it");
}

#[test]
fn dram_tier_never_serves_an_overwritten_deleted_or_reclaimed_block() {
    let (_dev, s) = dram_store(3, 8 << 20);
    let old = block(1, 50_000);
    let new = block(2, 50_000);
    s.put("default", "k", &old, &PutOptions::default()).unwrap();
    assert_eq!(get(&s, "k").unwrap(), old);
    s.put("default", "k", &new, &PutOptions::default()).unwrap();
    assert_eq!(get(&s, "k").unwrap(), new);
    assert!(s.delete("default", "k", Durability::Written).unwrap());
    assert_eq!(get(&s, "k"), None);
    s.put("default", "k", &old, &PutOptions::default()).unwrap();
    assert_eq!(get(&s, "k").unwrap(), old);
    // Fill the small volume until the segment holding "k" is reclaimed.
    for i in 0..200u64 {
        s.put("default", &format!("fill{i}"), &block(100 + i, 60_000), &PutOptions::default()).unwrap();
    }
    assert!(s.stats().segments_reclaimed > 0);
    assert_eq!(get(&s, "k"), None, "reclaimed from the log, so gone from DRAM too");
    let dram = tier(&s, "dram");
    assert!(dram.resident_bytes <= s.stats().live_bytes + dram.entries * 8192, "{dram:?}");
}

#[test]
fn meta_reads_the_header_only_and_matches_get() {
    let (dev, s) = mem_store(8);
    let bytes = block(3, 200_000);
    s.put("default", "k", &bytes, &PutOptions { ttl_secs: Some(60), ..synced() }).unwrap();
    let meta = s.meta("default", "k").unwrap().unwrap();
    assert_eq!(meta, s.get("default", "k", ReadOptions::default()).unwrap().unwrap().meta);
    assert_eq!((meta.raw_len, meta.ttl_secs), (200_000, 60));
    assert_eq!(s.meta("default", "missing").unwrap(), None);
    // A long key makes the header longer than one unit.
    let long = "x".repeat(4096);
    s.put("default", &long, &bytes, &synced()).unwrap();
    drop(s);
    let s = Store::open_on(dev, StoreOptions::default()).unwrap();
    assert_eq!(s.meta("default", &long).unwrap().unwrap().raw_len, 200_000);
    assert_eq!(s.meta("default", "k").unwrap().unwrap().content_hash, *blake3::hash(&bytes).as_bytes());
}

#[test]
fn rename_moves_a_key_without_rewriting_its_bytes_and_survives_a_crash() {
    use kvhoard_format::{BlockDesc, Dtype, Layout};
    let (dev, s) = mem_store(8);
    let bytes = block(7, 300_000);
    let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Td, shape: vec![2, 75_000] };
    let opts = PutOptions { ttl_secs: Some(3600), group: Some(9), desc: Some(desc.clone()), ..synced() };
    s.put("default", "a.tmp", &bytes, &opts).unwrap();
    s.put("default", "b", &block(8, 1000), &synced()).unwrap();
    let written_before = s.stats().put_bytes;
    assert!(s.rename("default", "a.tmp", "b", Durability::Synced).unwrap());
    // Only a link and a tombstone were written: no payload.
    assert!(s.stats().put_bytes - written_before < 64 << 10, "rename rewrote the payload");
    assert_eq!(get(&s, "a.tmp"), None);
    assert_eq!(get(&s, "b").as_deref(), Some(&bytes[..]));
    let meta = s.meta("default", "b").unwrap().unwrap();
    assert_eq!((meta.desc, meta.group_id), (desc, Some(9)));
    assert!(meta.ttl_secs > 3590, "ttl {}", meta.ttl_secs);
    assert!(meta.ttl_secs <= 3600, "ttl {}", meta.ttl_secs);
    // Missing source, and a rename onto itself.
    assert!(!s.rename("default", "nope", "c", Durability::Synced).unwrap());
    assert!(s.rename("default", "b", "b", Durability::Synced).unwrap());
    assert!(s.rename("default", "b", "", Durability::Synced).is_err());
    drop(s);
    let (_, s) = reopen(&dev, CrashMode::DropAll);
    assert_eq!(get(&s, "a.tmp"), None);
    assert_eq!(get(&s, "b").as_deref(), Some(&bytes[..]));
}

#[test]
fn get_into_reads_large_blocks_straight_into_an_aligned_buffer() {
    let (dev, s) = mem_store(8);
    let unit = 4096;
    // Whole units, a partial last unit, and the smallest size read this way.
    let sizes = [256 * 1024, 256 * 1024 + 100, super::DIRECT_READ_MIN_BYTES, 300_001];
    for (i, &len) in sizes.iter().enumerate() {
        s.put("default", &format!("k{i}"), &block(i as u64, len), &synced()).unwrap();
    }
    let check = |s: &Store, direct_before: u64| {
        let mut direct = direct_before;
        for (i, &len) in sizes.iter().enumerate() {
            let mut buf = crate::AlignedBuf::zeroed(len + unit);
            buf.iter_mut().for_each(|b| *b = 0xee);
            let opts = ReadOptions { verify_hash: i % 2 == 0 };
            let (meta, n) = s.get_into("default", &format!("k{i}"), &mut buf, opts).unwrap().unwrap();
            assert_eq!((n, meta.raw_len), (len, len as u64));
            assert!(buf[..len] == block(i as u64, len)[..], "block {i} differs");
            direct += 1;
            assert_eq!(s.stats().direct_reads, direct, "block {i} was not read directly");
        }
        direct
    };
    let direct = check(&s, 0);
    // An unaligned buffer, a small block and a too-small buffer take the copying path.
    let mut bytes = vec![0u8; 256 * 1024 + unit + 1];
    let unaligned = if (bytes.as_ptr() as usize).is_multiple_of(unit) { &mut bytes[1..] } else { &mut bytes[..] };
    let (_, n) = s.get_into("default", "k0", unaligned, ReadOptions::default()).unwrap().unwrap();
    assert!(unaligned[..n] == block(0, 256 * 1024)[..]);
    s.put("default", "small", &block(9, 5000), &synced()).unwrap();
    let mut buf = crate::AlignedBuf::zeroed(8192);
    assert_eq!(s.get_into("default", "small", &mut buf, ReadOptions::default()).unwrap().unwrap().1, 5000);
    let mut short = crate::AlignedBuf::zeroed(128 * 1024);
    assert!(matches!(
        s.get_into("default", "k0", &mut short, ReadOptions::default()),
        Err(StoreError::BufferTooSmall { .. })
    ));
    assert_eq!(s.stats().direct_reads, direct);
    assert!(s.get_into("default", "missing", &mut buf, ReadOptions::default()).unwrap().is_none());
    // After a restart the header units are found from the index alone, as before.
    s.close().unwrap();
    let (_dev, s) = reopen(&dev, CrashMode::DropAll);
    check(&s, 0);
}

#[test]
fn get_batch_into_reads_each_key_as_get_into_would() {
    let (dev, s) = mem_store(16);
    let unit = 4096;
    let large: Vec<Vec<u8>> = (0..6).map(|i| block(40 + i, 200_000 + 1000 * i as usize)).collect();
    for (i, b) in large.iter().enumerate() {
        s.put("default", &format!("large{i}"), b, &synced()).unwrap();
    }
    s.put("default", "small", &block(50, 5000), &synced()).unwrap();
    s.put("default", "damaged", &block(51, 300_000), &synced()).unwrap();
    let synth = kvhoard_kernels::synth::Synth::new(2, 64, 2, 64, 5);
    let kv = synth.generate();
    let packed =
        PutOptions { desc: Some(synth.desc.desc()), codec: Some(kvhoard_kernels::CodecSpec::lossless(1)), ..synced() };
    s.put("default", "packed", &kv, &packed).unwrap();
    let at = {
        let b = s.get("default", "damaged", ReadOptions::default()).unwrap().unwrap();
        s.superblock().unit_offset(b.meta.location.segment, b.meta.location.unit)
    };
    s.close().unwrap();
    let mut image = dev.image();
    image[(at + 4096 + 50_000) as usize] ^= 0x10;
    let s = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap();
    let buffered = PutOptions { durability: Durability::Buffered, ..PutOptions::default() };
    s.put("default", "pending", &block(52, 250_000), &buffered).unwrap();

    let keys = ["large0", "small", "missing", "large1", "damaged", "packed", "pending", "large2", "large3", "large0"];
    let mut bufs: Vec<crate::AlignedBuf> = keys.iter().map(|_| crate::AlignedBuf::zeroed(300_000 + unit)).collect();
    // One buffer not aligned to the device: read through an engine buffer and copied.
    let mut unaligned = vec![0u8; 300_000 + unit + 1];
    let skew = usize::from((unaligned.as_ptr() as usize).is_multiple_of(unit));
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    outs[8] = &mut unaligned[skew..];
    let got = s.get_batch_into("default", &keys, &mut outs, ReadOptions { verify_hash: true }).unwrap();
    let want = |key: &str| -> Option<Vec<u8>> {
        match key {
            "small" => Some(block(50, 5000)),
            "packed" => Some(kv.clone()),
            "pending" => Some(block(52, 250_000)),
            "missing" | "damaged" => None,
            k => Some(large[k.trim_start_matches("large").parse::<usize>().unwrap()].clone()),
        }
    };
    for (i, key) in keys.iter().enumerate() {
        let expect = want(key);
        let read = got[i].as_ref().map(|(meta, n)| {
            assert_eq!(meta.raw_len, *n as u64, "{key}");
            outs[i][..*n].to_vec()
        });
        assert_eq!(read.as_ref().map(Vec::len), expect.as_ref().map(Vec::len), "{key}");
        assert!(read == expect, "{key} read back other bytes");
    }
    let stats = s.stats();
    // Straight into their buffers: large0 twice, large1, large2 (large3's buffer is unaligned),
    // and the buffered put once the writer has written it.
    assert!((4..=5).contains(&stats.direct_reads), "{}", stats.direct_reads);
    assert_eq!((stats.read_errors, stats.misses), (1, 2), "the damaged block is a counted miss, as is the missing key");
    assert_eq!((stats.gets, stats.hits), (10, 8), "each key counted once");
    // A buffer too short for its block is refused clearly, as by get_into.
    let mut short = crate::AlignedBuf::zeroed(4096);
    let mut outs: Vec<&mut [u8]> = vec![&mut short[..]];
    assert!(matches!(
        s.get_batch_into("default", &["large0"], &mut outs, ReadOptions::default()),
        Err(StoreError::BufferTooSmall { .. })
    ));
    assert_eq!(s.stats().gets, 10, "a refused batch counts nothing");
    assert!(s.get_batch_into("default", &["large0", "large1"], &mut outs, ReadOptions::default()).is_err());
}

#[test]
fn a_damaged_block_read_directly_is_a_counted_miss_not_garbage() {
    for (what, at) in [("payload", 4096 + 70_000), ("last partial unit", 4096 + 256 * 1024 + 10), ("header", 20)] {
        let (dev, s) = mem_store(8);
        let len = 256 * 1024 + 100;
        s.put("default", "a", &block(1, len), &synced()).unwrap();
        let record = {
            let b = s.get("default", "a", ReadOptions::default()).unwrap().unwrap();
            s.superblock().unit_offset(b.meta.location.segment, b.meta.location.unit)
        };
        s.close().unwrap();
        let mut image = dev.image();
        image[(record + at) as usize] ^= 0x10;
        let s = Store::open_on(Arc::new(MemDevice::from_image(image)), StoreOptions::default()).unwrap();
        let mut buf = crate::AlignedBuf::zeroed(len);
        assert!(s.get_into("default", "a", &mut buf, ReadOptions::default()).unwrap().is_none(), "{what}");
        let stats = s.stats();
        assert_eq!((stats.read_errors, stats.direct_reads, stats.misses), (1, 0, 1), "{what}");
    }
}

#[test]
fn get_into_decodes_compressed_blocks_and_reads_cached_ones() {
    let (_dev, s) = dram_store(8, 4 << 20);
    let raw = block(3, 300_000);
    s.put("default", "cached", &raw, &synced()).unwrap();
    let mut buf = crate::AlignedBuf::zeroed(300_000);
    assert_eq!(s.get_into("default", "cached", &mut buf, ReadOptions::default()).unwrap().unwrap().1, 300_000);
    assert!(buf[..300_000] == raw[..]);
    // A block compressed by the store is decoded into the caller's buffer.
    let (_dev, s) = mem_store(8);
    let synth = kvhoard_kernels::synth::Synth::new(2, 64, 2, 64, 5);
    let kv = synth.generate();
    let opts =
        PutOptions { desc: Some(synth.desc.desc()), codec: Some(kvhoard_kernels::CodecSpec::lossless(1)), ..synced() };
    s.put("default", "packed", &kv, &opts).unwrap();
    let mut buf = crate::AlignedBuf::zeroed(kv.len());
    let (meta, n) = s.get_into("default", "packed", &mut buf, ReadOptions { verify_hash: true }).unwrap().unwrap();
    assert_eq!((n as u64, meta.raw_len), (kv.len() as u64, kv.len() as u64));
    assert!(meta.stored_len < meta.raw_len);
    assert!(buf[..n] == kv[..]);
    assert_eq!(s.stats().direct_reads, 0);
    // A codec this build does not know: a clear error for a decoded read, the frame as stored.
    s.set_policy("default", crate::Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let stored = block(4, 200_000);
    let opts = PutOptions {
        compression: Some(kvhoard_format::record::CompressionMeta { codec_id: 7, codec_version: 1, params: vec![1] }),
        raw: Some((raw.len() as u64, *blake3::hash(&raw).as_bytes())),
        ..synced()
    };
    s.put("default", "foreign", &stored, &opts).unwrap();
    assert!(matches!(
        s.get_into("default", "foreign", &mut buf, ReadOptions::default()),
        Err(StoreError::Codec { .. })
    ));
    let frame = s.get_frame("default", "foreign", ReadOptions::default()).unwrap().unwrap();
    assert!(frame[..] == stored[..]);
}

#[test]
fn filling_a_segment_does_not_wait_for_a_sync_and_a_sync_makes_all_before_it_durable() {
    let (dev, s) = mem_store(8);
    for i in 0..12 {
        s.put("default", &format!("k{i}"), &block(i, 300_000), &PutOptions::default()).unwrap();
    }
    assert!(s.stats().segments_sealed >= 3);
    // `written` puts only: nothing was synced, not even by the seals, so a power loss now may
    // drop all of it; the volume still opens, and holds nothing it cannot prove.
    let (_d, lost) = reopen(&dev, CrashMode::DropAll);
    assert_eq!(lost.stats().keys, 0);
    drop(lost);
    // One synced put makes everything before it durable, the sealed segments included, and
    // their summaries are written after that sync.
    s.put("default", "last", b"x", &synced()).unwrap();
    for mode in [CrashMode::DropAll, CrashMode::KeepAll] {
        let (_d, after) = reopen(&dev, mode);
        for i in 0..12 {
            assert_eq!(get(&after, &format!("k{i}")).unwrap(), block(i, 300_000), "k{i} after {mode:?}");
        }
        if matches!(mode, CrashMode::KeepAll) {
            // The summaries were written (not yet synced: without them, recovery scans).
            assert_eq!(after.recovery_report().tails_cut.len(), 0, "{:?}", after.recovery_report());
        }
    }
}

/// A store with 4 MiB segments: room for batches large enough to be prepared and written by
/// several threads.
fn big_segment_store() -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(11 * (4 << 20)));
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 4 << 20 };
    let store = Store::create_on(dev.clone(), &create, StoreOptions::default()).unwrap();
    (dev, store)
}

#[test]
fn a_large_batch_is_written_by_several_threads_and_reads_back_in_order() {
    let (dev, s) = big_segment_store();
    let blocks: Vec<Vec<u8>> = (0..22).map(|i| block(100 + i, 250_000 + i as usize * 1000)).collect();
    let keys: Vec<String> = (0..22).map(|i| format!("b{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys.iter().map(String::as_str).zip(blocks.iter().map(Vec::as_slice)).collect();
    // Over a segment: the batch is reserved in parts, each written by several threads.
    let hashes = s.put_batch("default", &items, &synced()).unwrap();
    for (i, (key, bytes)) in items.iter().enumerate() {
        assert_eq!(hashes[i], *blake3::hash(bytes).as_bytes());
        assert_eq!(get(&s, key).unwrap(), *bytes, "{key}");
    }
    let (_d, after) = reopen(&dev, CrashMode::DropAll);
    for (key, bytes) in &items {
        assert_eq!(get(&after, key).unwrap(), *bytes, "{key} after a crash");
    }
}

#[test]
fn a_failed_write_in_a_parallel_batch_fails_the_batch_and_poisons_writes() {
    let (dev, s) = big_segment_store();
    s.put("default", "before", b"ok", &synced()).unwrap();
    let blocks: Vec<Vec<u8>> = (0..6).map(|i| block(200 + i, 300_000)).collect();
    let keys: Vec<String> = (0..6).map(|i| format!("b{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys.iter().map(String::as_str).zip(blocks.iter().map(Vec::as_slice)).collect();
    dev.fail_nth(FaultKind::Write, 2);
    assert!(s.put_batch("default", &items, &synced()).is_err());
    assert!(matches!(s.put("default", "later", b"x", &synced()), Err(StoreError::Poisoned { .. })));
    assert_eq!(get(&s, "before").unwrap(), b"ok");
    // Whatever was written is intact or absent, never garbage; the volume reopens.
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(get(&s2, "before").unwrap(), b"ok");
    for (key, bytes) in &items {
        if let Some(got) = get(&s2, key) {
            assert_eq!(got, *bytes, "{key}");
        }
    }
    s2.put("default", "later", b"x", &synced()).unwrap();
    std::mem::forget(s);
}

#[test]
fn a_batch_larger_than_the_bytes_prepared_ahead_is_streamed_and_refused_whole() {
    let dev = Arc::new(MemDevice::new(14 * (8 << 20)));
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 8 << 20 };
    let s = Store::create_on(dev.clone(), &create, StoreOptions::default()).unwrap();
    // 40 MiB: more than is prepared ahead of the log at once, over several segments.
    let blocks: Vec<Vec<u8>> = (0..20).map(|i| block(300 + i, 2 << 20)).collect();
    let mut keys: Vec<String> = (0..20).map(|i| format!("p{i}")).collect();
    // A bad key at the very end refuses the whole batch before anything is written.
    keys[19] = String::new();
    let items =
        |keys: &[String]| -> Vec<(String, Vec<u8>)> { keys.iter().cloned().zip(blocks.iter().cloned()).collect() };
    let bad = items(&keys);
    let bad: Vec<(&str, &[u8])> = bad.iter().map(|(k, b)| (k.as_str(), b.as_slice())).collect();
    assert!(s.put_batch("default", &bad, &synced()).is_err());
    assert_eq!(s.stats().keys, 0);
    assert_eq!(s.stats().puts, 0);
    keys[19] = "p19".into();
    let good = items(&keys);
    let good: Vec<(&str, &[u8])> = good.iter().map(|(k, b)| (k.as_str(), b.as_slice())).collect();
    let hashes = s.put_batch("default", &good, &synced()).unwrap();
    assert_eq!(hashes.len(), 20);
    let (_d, after) = reopen(&dev, CrashMode::DropAll);
    for (i, (key, bytes)) in good.iter().enumerate() {
        assert_eq!(hashes[i], *blake3::hash(bytes).as_bytes());
        assert_eq!(get(&after, key).unwrap(), *bytes, "{key} after a crash");
    }
}

/// A device whose syncs wait until the test opens the gate.
#[derive(Debug)]
struct GatedSync {
    dev: MemDevice,
    open: std::sync::Mutex<bool>,
    opened: std::sync::Condvar,
    waiting: AtomicU64,
}

impl BlockDevice for GatedSync {
    fn capacity_bytes(&self) -> u64 {
        self.dev.capacity_bytes()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), crate::device::DeviceError> {
        self.dev.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), crate::device::DeviceError> {
        self.dev.write_at(buf, offset)
    }
    fn sync(&self) -> Result<(), crate::device::DeviceError> {
        self.waiting.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let mut open = self.open.lock().unwrap();
        while !*open {
            open = self.opened.wait(open).unwrap();
        }
        self.waiting.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        self.dev.sync()
    }
    fn capabilities(&self) -> crate::device::Capabilities {
        self.dev.capabilities()
    }
}

#[test]
fn puts_go_on_while_the_checkpointer_waits_for_a_sync() {
    let dev = Arc::new(GatedSync {
        dev: MemDevice::new(SEG * 16),
        open: std::sync::Mutex::new(true),
        opened: std::sync::Condvar::new(),
        waiting: AtomicU64::new(0),
    });
    let opts = StoreOptions { checkpoint_every_segments: 1, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, opts).unwrap();
    let written = PutOptions { durability: Durability::Written, ..PutOptions::default() };
    // The first segment of a run syncs its header once, before the gate closes.
    s.put("default", "first", b"x", &written).unwrap();
    *dev.open.lock().unwrap() = false;
    // Fill several segments: every seal asks for a checkpoint, whose sync cannot finish.
    for i in 0..12u64 {
        s.put("default", &format!("k{i}"), &block(i, 300_000), &written).unwrap();
    }
    assert_eq!(s.stats().checkpoints, 0, "a checkpoint was written before its sync");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while dev.waiting.load(std::sync::atomic::Ordering::SeqCst) == 0 {
        assert!(std::time::Instant::now() < deadline, "the checkpointer never asked for a sync");
        std::thread::yield_now();
    }
    *dev.open.lock().unwrap() = true;
    dev.opened.notify_all();
    while s.stats().checkpoints == 0 {
        assert!(std::time::Instant::now() < deadline, "no checkpoint after the sync finished");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    s.close().unwrap();
    let crashed = Arc::new(dev.dev.crash(CrashMode::DropAll));
    let s = Store::open_on(crashed, StoreOptions::default()).unwrap();
    assert!(s.recovery_report().checkpoint_seq.is_some());
    for i in 0..12u64 {
        assert_eq!(get(&s, &format!("k{i}")).as_deref(), Some(&block(i, 300_000)[..]), "k{i}");
    }
}

#[test]
fn a_pinned_key_survives_reclaim_while_other_segments_can_go() {
    let (dev, s) = mem_store(4);
    s.put("default", "pinned", &block(1000, 60_000), &PutOptions::default()).unwrap();
    assert!(s.pin("default", "pinned").unwrap());
    assert!(!s.pin("default", "missing").unwrap(), "nothing to pin");
    assert_eq!(s.stats().pinned_keys, 1);
    // Several times the volume's capacity: every other early key is reclaimed.
    for i in 0..200u64 {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &PutOptions::default()).unwrap();
    }
    let st = s.stats();
    assert!(st.segments_reclaimed >= 8, "{st:?}");
    assert_eq!(st.pins_overridden, 0);
    assert_eq!(get(&s, "pinned").unwrap(), block(1000, 60_000));
    // k0.. share the pinned key's segment and stay with it; the next segment's keys went.
    assert!(get(&s, "k20").is_none(), "the segment after the pinned one was reclaimed");
    // Reclaim passed over a segment that is not the oldest: a restart must not bring back
    // what it dropped, and must keep the pinned key.
    let live: Vec<u64> = (0..200).filter(|i| get(&s, &format!("k{i}")).is_some()).collect();
    s.close().unwrap();
    let (_d, s2) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(get(&s2, "pinned").unwrap(), block(1000, 60_000));
    let after: Vec<u64> = (0..200).filter(|i| get(&s2, &format!("k{i}")).is_some()).collect();
    assert_eq!(after, live);
    assert_eq!(s2.stats().pinned_keys, 0, "pins are not kept across opens");
}

#[test]
fn an_unpinned_key_is_reclaimed_again() {
    let (_dev, s) = mem_store(4);
    s.put("default", "pinned", &block(1000, 60_000), &PutOptions::default()).unwrap();
    assert!(s.pin("default", "pinned").unwrap());
    assert!(s.pin("default", "pinned").unwrap());
    assert!(s.unpin("default", "pinned").unwrap());
    assert!(s.unpin("default", "pinned").unwrap(), "each pin has its own unpin");
    assert!(!s.unpin("default", "pinned").unwrap());
    for i in 0..200u64 {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &PutOptions::default()).unwrap();
    }
    assert!(get(&s, "pinned").is_none());
    assert_eq!(s.stats().pinned_keys, 0);
}

#[test]
fn pins_never_stop_puts_and_lapse_after_their_ttl() {
    let ms = Arc::new(AtomicU64::new(1_700_000_000_000));
    let dev = Arc::new(MemDevice::new(SEG * 7));
    let opts = StoreOptions { clock: Clock::manual(ms.clone()), pin_ttl_secs: 60, ..StoreOptions::default() };
    let s = Store::create_on(dev, &CreateOptions { capacity_bytes: None, segment_size_bytes: SEG }, opts).unwrap();
    // Pin everything written: every sealed segment holds a pin, and puts still go on.
    for i in 0..100u64 {
        let key = format!("k{i}");
        s.put("default", &key, &block(i, 60_000), &PutOptions::default()).unwrap();
        assert!(s.pin("default", &key).unwrap());
    }
    let st = s.stats();
    assert!(st.pins_overridden > 0, "no pin was overridden: {st:?}");
    assert!(st.segments_reclaimed > 0, "no segment was reclaimed: {st:?}");
    assert!(get(&s, "k0").is_none(), "the oldest went first when nothing else could");
    assert_eq!(get(&s, "k99").unwrap(), block(99, 60_000));
    // A pin taken before the last minute lapses: the next reclaim ignores it.
    assert!(s.stats().pinned_keys > 0);
    ms.fetch_add(61_000, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(s.stats().pinned_keys, 0);
    let overridden = s.stats().pins_overridden;
    for i in 100..130u64 {
        s.put("default", &format!("k{i}"), &block(i, 60_000), &PutOptions::default()).unwrap();
    }
    assert_eq!(s.stats().pins_overridden, overridden, "lapsed pins are not honoured");
}

#[test]
fn pins_check_their_arguments() {
    let (_dev, s) = mem_store(4);
    assert!(matches!(s.pin("", "k"), Err(StoreError::InvalidArgument { .. })));
    assert!(matches!(s.unpin("default", ""), Err(StoreError::InvalidArgument { .. })));
    s.close().unwrap();
    assert!(matches!(s.pin("default", "k"), Err(StoreError::Closed)));
}

#[test]
fn a_delete_whose_segment_is_reclaimed_to_make_room_for_its_tombstone_deletes_nothing() {
    // Found by the model test: the tombstone did not fit in the open segment, opening the next
    // reclaimed the oldest, which held the key, and the delete still wrote a tombstone and said
    // the key existed. One 252-unit block fills a segment (header unit, payload, summary, trailer).
    let (_dev, s) = mem_store(4);
    assert_eq!(s.stats().segments, 4);
    let fill = |key: &str, seed: u64| s.put("default", key, &block(seed, 252 * 4096), &synced()).unwrap();
    fill("k", 1);
    for (i, key) in ["f1", "f2", "f3"].into_iter().enumerate() {
        fill(key, 2 + i as u64);
    }
    assert_eq!(s.stats().segments_free, 0);
    assert_eq!(s.stats().segments_reclaimed, 0);
    assert!(!s.delete("default", "k", Durability::Synced).unwrap(), "k was reclaimed before its tombstone was written");
    assert_eq!(s.stats().segments_reclaimed, 1);
    assert_eq!(s.stats().deletes, 0);
    assert!(get(&s, "k").is_none());
    assert_eq!(get(&s, "f3").unwrap(), block(4, 252 * 4096));
}

/// A key put again with bytes another key had stored is a link to them. When the segment
/// holding those bytes is reclaimed, the key goes with them; a crash must not bring back the
/// key's older version from before the link, which replay meets before a link it cannot
/// resolve. (Found by the concurrent crash test of a planned volume.)
#[test]
fn a_link_to_reclaimed_bytes_does_not_bring_back_the_version_before_it_after_a_crash() {
    let dev = Arc::new(MemDevice::new(SEG * 7));
    // No periodic checkpoint: replay goes back to the volume's creation.
    let opts = StoreOptions { checkpoint_every_segments: 1000, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
    let shared = block(1, 300_000);
    // The oldest segment: the shared bytes, under "x".
    s.put("default", "x", &shared, &synced()).unwrap();
    fill(&s, 0..4);
    // The next: "k"'s first version.
    s.put("default", "k", &block(2, 300_000), &synced()).unwrap();
    fill(&s, 4..8);
    // Then "k" names the shared bytes (a link), and "x" moves on.
    s.put("default", "k", &shared, &synced()).unwrap();
    s.put("default", "x", &block(3, 1000), &synced()).unwrap();
    assert_eq!(get(&s, "k").as_deref(), Some(&shared[..]));
    // Fill until the oldest segment is reclaimed, and "k" with its bytes.
    let mut i = 8;
    while get(&s, "k").is_some() {
        fill(&s, i..i + 1);
        i += 1;
        assert!(i < 40, "the oldest segment was never reclaimed");
    }
    // The shared bytes stored again under another key: "k" stays gone (a replay cannot tell
    // them from bytes relocated by cleaning, and "k" went with its bytes).
    s.put("default", "z", &shared, &synced()).unwrap();
    for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
        let crashed = Arc::new(dev.crash(mode));
        let s2 = Store::open_on(crashed, opts.clone()).unwrap();
        assert!(get(&s2, "k").is_none(), "{mode:?}: a crash brought back a key reclaim dropped");
        assert_eq!(get(&s2, "z").as_deref(), Some(&shared[..]), "{mode:?}");
    }
    std::mem::forget(s);
}

/// A volume of 7 segments cleaned as LRU cleans (blocks read since their write are kept),
/// writing a checkpoint every `checkpoint_every_segments` sealed segments.
fn lru_volume(checkpoint_every_segments: u32) -> (Arc<MemDevice>, Store, StoreOptions) {
    lru_volume_of(10, checkpoint_every_segments, Clock::system())
}

/// [`lru_volume`] on a device of `device_segments` segments, reading time from `clock`.
fn lru_volume_of(
    device_segments: u64,
    checkpoint_every_segments: u32,
    clock: Clock,
) -> (Arc<MemDevice>, Store, StoreOptions) {
    let dev = Arc::new(MemDevice::new(SEG * device_segments));
    let opts = StoreOptions {
        checkpoint_every_segments,
        placement: Arc::new(crate::placement::Lru::new(clock.clone())),
        clock,
        ..StoreOptions::default()
    };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
    (dev, s, opts)
}

/// Blocks of 200 KB that nobody reads, `fill{i}` for each i.
fn fill(s: &Store, ids: std::ops::Range<u64>) {
    for i in ids {
        s.put("default", &format!("fill{i}"), &block(1000 + i, 200_000), &synced()).unwrap();
    }
}

/// Cleans segments, as placement chooses them, until segment 0 is one.
fn clean_until_segment_0_is_cleaned(s: &Store) {
    let mut cleaned = Vec::new();
    while !cleaned.contains(&0) {
        cleaned.push(s.clean_now().unwrap().expect("a segment to clean"));
        assert!(cleaned.len() < 8, "segment 0 was never cleaned: {cleaned:?}");
    }
}

/// A key linked to a block that cleaning relocates keeps it after a crash: replay would meet
/// the link before the block's one record, so cleaning links the key again after it, and frees
/// the victim without a checkpoint. With a checkpoint written between the link and the cleaning
/// (it places the block in the victim) too.
#[test]
fn a_key_linked_to_a_relocated_block_keeps_it_after_a_crash() {
    for checkpoint_every_segments in [1000, 1] {
        let (dev, s, opts) = lru_volume(checkpoint_every_segments);
        let shared = block(1, 300_000);
        // The oldest segment holds the block "x" wrote; the next one, "k"'s link to it.
        s.put("default", "x", &shared, &synced()).unwrap();
        fill(&s, 0..4);
        s.put("default", "k", &shared, &synced()).unwrap();
        fill(&s, 4..9);
        // Read: cleaning keeps it.
        assert_eq!(get(&s, "x").as_deref(), Some(&shared[..]));
        let before = s.stats();
        clean_until_segment_0_is_cleaned(&s);
        let after = s.stats();
        if checkpoint_every_segments == 1000 {
            assert_eq!(after.checkpoints, before.checkpoints, "freed after a checkpoint");
        }
        // What cleaning wrote again counts as relocated, not put: write amplification divides
        // the one by the other.
        assert!(after.relocated_records > before.relocated_records, "{after:?}");
        assert_eq!(
            (after.puts, after.put_bytes, after.dedup_hits),
            (before.puts, before.put_bytes, before.dedup_hits),
            "cleaning counted as puts"
        );
        let wa = after.relocated_bytes as f64 / after.put_bytes as f64;
        assert!((after.write_amplification - wa).abs() < 1e-9, "{after:?}");
        assert_eq!(get(&s, "k").as_deref(), Some(&shared[..]));
        for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
            let crashed = Arc::new(dev.crash(mode));
            let s2 = Store::open_on(crashed, opts.clone()).unwrap();
            let why = format!("{mode:?}, a checkpoint every {checkpoint_every_segments} segments");
            assert_eq!(get(&s2, "x").as_deref(), Some(&shared[..]), "{why}");
            assert_eq!(get(&s2, "k").as_deref(), Some(&shared[..]), "{why}: the link lost its block");
        }
        std::mem::forget(s);
    }
}

/// A block whose key is put again with other bytes, or deleted, after the cleaning planned to
/// write it again, and before it did, is still the block two other keys link to: it is written
/// under the first of them that still links to it (the other linked again after it), the victim
/// is freed without a checkpoint, and both keep it through a crash, while the changed keys keep
/// their change. The first key's link lies in the victim or in the next segment.
#[test]
fn a_block_whose_key_changes_while_it_is_cleaned_is_kept_for_the_keys_linked_to_it() {
    // What changes: x put again or deleted; k deleted too (k2 then holds the block) or not.
    for (delete, k_too, k_in_victim) in (0..8).map(|i| (i & 1 == 1, i & 2 == 2, i & 4 == 4)) {
        let (dev, s, opts) = lru_volume(1000);
        let shared = block(1, 300_000);
        let other = block(2, 300_000);
        s.put("default", "x", &shared, &synced()).unwrap();
        if k_in_victim {
            s.put("default", "k", &shared, &synced()).unwrap();
        }
        fill(&s, 0..4);
        if !k_in_victim {
            s.put("default", "k", &shared, &synced()).unwrap();
        }
        s.put("default", "k2", &shared, &synced()).unwrap();
        fill(&s, 4..9);
        assert_eq!(get(&s, "x").as_deref(), Some(&shared[..]));
        let checkpoints = s.stats().checkpoints;
        let mut cleaned = Vec::new();
        while !cleaned.contains(&0) {
            let change = |victim| {
                if victim != 0 {
                    return;
                }
                match delete {
                    true => assert!(s.delete("default", "x", Durability::Synced).unwrap()),
                    false => {
                        s.put("default", "x", &other, &synced()).unwrap();
                    }
                }
                if k_too {
                    assert!(s.delete("default", "k", Durability::Synced).unwrap());
                }
            };
            cleaned.push(s.clean_now_around(change).unwrap().expect("a segment to clean"));
            assert!(cleaned.len() < 8, "segment 0 was never cleaned: {cleaned:?}");
        }
        let changed = (!delete).then_some(&other[..]);
        let why = format!(
            "x {}, k deleted: {k_too}, k in the victim: {k_in_victim}",
            ["put again", "deleted"][usize::from(delete)]
        );
        assert_eq!(s.stats().checkpoints, checkpoints, "{why}: freed after a checkpoint");
        for mode in [None, Some(CrashMode::KeepAll), Some(CrashMode::DropAll)] {
            let reopened;
            let s = match mode {
                None => &s,
                Some(mode) => {
                    reopened = Store::open_on(Arc::new(dev.crash(mode)), opts.clone()).unwrap();
                    &reopened
                }
            };
            // Compared, not printed: 300 KB each.
            let k = (!k_too).then_some(&shared[..]);
            assert!(get(s, "k").as_deref() == k, "{why}, {mode:?}: k is not what it was");
            assert!(get(s, "k2").as_deref() == Some(&shared[..]), "{why}, {mode:?}: k2 lost the block");
            assert!(get(s, "x").as_deref() == changed, "{why}, {mode:?}: x is not what it was changed to");
        }
        std::mem::forget(s);
    }
}

/// A key put again with its own bytes and another group while the cleaning that writes its
/// block again runs: the block written again takes the newer record's group, through a crash.
#[test]
fn a_key_put_again_with_its_bytes_during_its_cleaning_keeps_the_newer_group() {
    let (dev, s, opts) = lru_volume(1000);
    let bytes = block(1, 300_000);
    s.put("default", "x", &bytes, &PutOptions { group: Some(1), ..synced() }).unwrap();
    fill(&s, 0..9);
    assert_eq!(get(&s, "x").as_deref(), Some(&bytes[..]));
    let mut cleaned = Vec::new();
    while !cleaned.contains(&0) {
        let again = |victim| {
            if victim == 0 {
                s.put("default", "x", &bytes, &PutOptions { group: Some(7), ..synced() }).unwrap();
            }
        };
        cleaned.push(s.clean_now_around(again).unwrap().expect("a segment to clean"));
        assert!(cleaned.len() < 8, "segment 0 was never cleaned: {cleaned:?}");
    }
    let group_of = |s: &Store| {
        let at = s.parts.index_read().key(&crate::index::key_fp("default", "x")).expect("x is stored").record;
        assert_ne!(at.segment, 0, "x's record is still in the victim");
        s.parts.header_at(at).unwrap().expect("x's record reads").group_id
    };
    assert_eq!(group_of(&s), Some(7));
    for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
        let s2 = Store::open_on(Arc::new(dev.crash(mode)), opts.clone()).unwrap();
        assert!(get(&s2, "x").as_deref() == Some(&bytes[..]), "{mode:?}: x lost its bytes");
        assert_eq!(group_of(&s2), Some(7), "{mode:?}");
    }
    std::mem::forget(s);
}

/// A key linked again by cleaning keeps its expiry to the second, through a crash: neither a
/// second later nor never.
#[test]
fn a_key_linked_again_by_cleaning_expires_when_it_would_have() {
    let now = Arc::new(AtomicU64::new(1_700_000_000_750));
    let (dev, s, opts) = lru_volume_of(10, 1000, Clock::manual(now.clone()));
    let shared = block(1, 300_000);
    s.put("default", "x", &shared, &synced()).unwrap();
    fill(&s, 0..4);
    s.put("default", "k", &shared, &PutOptions { ttl_secs: Some(100), ..synced() }).unwrap();
    fill(&s, 4..9);
    assert_eq!(get(&s, "x").as_deref(), Some(&shared[..]));
    // Cleaned 40.5 s later, in another second than the one "k" was written in.
    now.fetch_add(40_500, std::sync::atomic::Ordering::Relaxed);
    let checkpoints = s.stats().checkpoints;
    clean_until_segment_0_is_cleaned(&s);
    assert_eq!(s.stats().checkpoints, checkpoints, "k was not linked again");
    let crashed = Arc::new(dev.crash(CrashMode::KeepAll));
    std::mem::forget(s);
    let s2 = Store::open_on(crashed, opts).unwrap();
    // "k" expires 100 s after the second it was written in.
    now.store(1_700_000_099_999, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(get(&s2, "k").as_deref(), Some(&shared[..]), "expired early");
    now.store(1_700_000_100_000, std::sync::atomic::Ordering::Relaxed);
    assert!(get(&s2, "k").is_none(), "expired late");
    assert_eq!(get(&s2, "x").as_deref(), Some(&shared[..]));
}

/// A block more keys name than cleaning links again (`MAX_RELINKS`): none is linked again, the
/// victim is freed after a checkpoint, and every key keeps the block after a crash. A write
/// that fails anywhere in that cleaning (the checkpoint's own included), then more puts, then a
/// crash: every key still reads the block (a victim freed without its checkpoint and reused
/// would lose the links).
#[test]
fn a_block_named_by_more_keys_than_cleaning_links_again_is_freed_after_a_checkpoint() {
    let links = crate::reclaim::clean::MAX_RELINKS + 1;
    let mut failed = 0;
    for fail_at in 0..12u64 {
        for mode in [CrashMode::KeepAll, CrashMode::DropAll] {
            let (dev, s, opts) = lru_volume_of(16, 1000, Clock::system());
            let shared = block(1, 300_000);
            s.put("default", "x", &shared, &synced()).unwrap();
            fill(&s, 0..4);
            for i in 0..links {
                s.put("default", &format!("k{i}"), &shared, &PutOptions::default()).unwrap();
            }
            fill(&s, 4..6);
            assert_eq!(get(&s, "x").as_deref(), Some(&shared[..]));
            let checkpoints = s.stats().checkpoints;
            if fail_at > 0 {
                dev.fail_nth(FaultKind::Write, fail_at);
            }
            // The oldest segment: freeing it needs no checkpoint for its age.
            match s.clean_now() {
                Ok(cleaned) => {
                    assert_eq!(cleaned, Some(0));
                    let stats = s.stats();
                    assert!(stats.checkpoints > checkpoints, "freed without a checkpoint");
                    assert!(stats.relocated_records < 10, "{} records written again", stats.relocated_records);
                }
                Err(_) => failed += 1,
            }
            // Whatever the cleaning did, more puts follow (refused if the store stopped writing).
            for i in 0..12u64 {
                if s.put("default", &format!("after{i}"), &block(500 + i, 200_000), &synced()).is_err() {
                    break;
                }
            }
            let crashed = Arc::new(dev.crash(mode));
            std::mem::forget(s);
            let s2 = Store::open_on(crashed, opts.clone()).unwrap();
            let why = format!("write {fail_at} failed, {mode:?}");
            assert_eq!(get(&s2, "x").as_deref(), Some(&shared[..]), "{why}");
            for i in 0..links {
                assert_eq!(get(&s2, &format!("k{i}")).as_deref(), Some(&shared[..]), "k{i}, {why}");
            }
        }
    }
    assert!(failed > 0, "no injected write hit the cleaning");
}

/// A block whose writer's key names it no more, kept by cleaning for a key that links to it, is
/// written under that key with that key's TTL and group, not its writer's.
#[test]
fn a_block_kept_for_a_key_linked_to_it_keeps_that_keys_ttl_and_group() {
    let (_dev, s, _) = lru_volume(StoreOptions::default().checkpoint_every_segments);
    let shared = block(1, 300_000);
    s.put("default", "x", &shared, &PutOptions { group: Some(1), ..synced() }).unwrap();
    fill(&s, 0..4);
    let linked = PutOptions { ttl_secs: Some(3600), group: Some(2), ..synced() };
    s.put("default", "k", &shared, &linked).unwrap();
    // "x" moves on: the block in segment 0 is named only by "k"'s link.
    s.put("default", "x", &block(2, 1000), &synced()).unwrap();
    fill(&s, 4..9);
    assert_eq!(get(&s, "k").as_deref(), Some(&shared[..]));
    clean_until_segment_0_is_cleaned(&s);
    let meta = s.meta("default", "k").unwrap().expect("k kept");
    assert_ne!(meta.location.segment, 0, "relocated");
    assert_eq!(meta.group_id, Some(2));
    assert!((3500..=3600).contains(&meta.ttl_secs), "ttl {}", meta.ttl_secs);
    assert_eq!(get(&s, "k").as_deref(), Some(&shared[..]));
}

/// Two puts of the same new bytes at once, under two keys: whichever reserves second finds the
/// bytes stored and writes a link, so the bytes have one record (a second one, later in the
/// log, would leave the links between them naming a record that reclaim may free first).
#[test]
fn two_puts_of_the_same_new_bytes_at_once_store_them_once() {
    let (_dev, s) = mem_store(64);
    let rounds = 40u64;
    for round in 0..rounds {
        let bytes = block(10_000 + round, 400_000);
        let barrier = std::sync::Barrier::new(2);
        std::thread::scope(|scope| {
            for side in ["a", "b"] {
                let (s, bytes, barrier) = (&s, &bytes, &barrier);
                scope.spawn(move || {
                    barrier.wait();
                    s.put("default", &format!("{side}{round}"), bytes, &PutOptions::default()).unwrap();
                });
            }
        });
    }
    let stats = s.stats();
    assert_eq!(stats.dedup_hits, rounds, "{stats:?}");
    assert_eq!(stats.put_bytes, rounds * 400_000, "each round's bytes stored once");
    for round in 0..rounds {
        assert_eq!(get(&s, &format!("a{round}")), get(&s, &format!("b{round}")));
    }
}

/// A seal writes the segment's summary, then its trailer. A crash between the two leaves the
/// summary after the records and no trailer, so recovery scans the segment and walks past its
/// records into the summary, whose entries are record headers of this use. Where an entry's
/// header began a unit and named a record longer than what is left of the segment, recovery
/// took it for a damaged record nothing names and voided every key written before it.
#[test]
fn a_seal_without_its_trailer_loses_no_key() {
    let (dev, s) = mem_store(4);
    // A first record tells how long a header is besides its key.
    s.put("default", "f0", &block(0, 100), &synced()).unwrap();
    let at = s.get("default", "f0", ReadOptions::default()).unwrap().unwrap().meta.location;
    let mut unit = crate::AlignedBuf::zeroed(4096);
    dev.read_at(&mut unit, s.superblock().unit_offset(at.segment, at.unit)).unwrap();
    let rest = kvhoard_format::record::RecordHeader::decode(&unit).unwrap().encoded_len() - 2;
    // An entry: unit and length (8 bytes), and the record's header.
    let summary_entry = |key_len: usize| kvhoard_format::summary::entry_bytes(rest + key_len);
    // Fill the summary's first unit with entries so that the next entry's header starts the
    // second unit: they end 8 bytes before the boundary.
    let target = kvhoard_format::UNIT_BYTES as usize - 8;
    let mut keys = vec!["f0".to_string()];
    let mut used = summary_entry(2);
    while used < target {
        let left = target - used;
        let len = if left >= 2 * summary_entry(200) { 200 } else { left - summary_entry(0) };
        let key: String = format!("f{}-", keys.len()).chars().chain(std::iter::repeat('x')).take(len).collect();
        used += summary_entry(key.len());
        s.put("default", &key, &block(keys.len() as u64, 100), &synced()).unwrap();
        keys.push(key);
    }
    assert_eq!(used, target, "the entries end 8 bytes before the unit boundary");
    // The record that entry names spans more units than the segment has left after the summary.
    let big = block(99, 600_000);
    s.put("default", "t", &big, &synced()).unwrap();
    let segment = s.get("default", "t", ReadOptions::default()).unwrap().unwrap().meta.location.segment;
    // Filling the segment seals it; the next segment takes the rest.
    s.put("default", "next", &block(100, 500_000), &synced()).unwrap();
    assert_ne!(s.get("default", "next", ReadOptions::default()).unwrap().unwrap().meta.location.segment, segment);
    let sb = s.superblock().clone();
    drop(s);
    // The trailer never written: the last unit as it was before the seal (zeros).
    let crashed = Arc::new(dev.crash(CrashMode::KeepAll));
    crashed.write_at(&crate::AlignedBuf::zeroed(4096), sb.unit_offset(segment, sb.segment_units() - 1)).unwrap();
    crashed.sync().unwrap();
    let report = fsck_clean(&*crashed, "the crashed image");
    let named: Vec<_> = report.problems.iter().filter(|p| p.kind == "seal_cut_short").collect();
    assert_eq!(named.len(), 1, "fsck names the seal cut short: {:?}", report.problems);
    let s = Store::open_on(crashed, StoreOptions::default()).unwrap();
    assert_eq!(s.recovery_report().keys_voided, 0);
    assert_eq!(s.recovery_report().records_discarded, 0);
    for (i, key) in keys.iter().enumerate() {
        assert_eq!(get(&s, key), Some(block(i as u64, 100)), "{key}");
    }
    assert_eq!(get(&s, "t"), Some(big));
}

/// Through the page cache, a record's rest is written behind a pending unit and its header
/// after. A process killed in between leaves the pending unit and the rest: recovery steps over
/// that rest as a record that never happened. Read for headers instead, a payload unit that
/// begins like a header of this segment use (magic and seq) and does not decode would count as
/// a record nothing names, and every key written before it would become a miss.
#[test]
fn a_record_killed_before_its_header_is_stepped_over_whatever_its_payload_holds() {
    let dev = Arc::new(MemDevice::new(SEG * 6).cut_writes());
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, StoreOptions::default()).unwrap();
    let early = block(1, 50_000);
    s.put("default", "early", &early, &synced()).unwrap();
    // The segment use's seq, from the record just written.
    let at = s.get("default", "early", ReadOptions::default()).unwrap().unwrap().meta.location;
    let mut unit = crate::AlignedBuf::zeroed(4096);
    dev.read_at(&mut unit, s.superblock().unit_offset(at.segment, at.unit)).unwrap();
    let seq = kvhoard_format::record::RecordHeader::decode(&unit).unwrap().segment_seq;
    // A payload whose units each begin like a damaged header of this use.
    let mut hostile = block(2, 5 * 4096);
    for chunk in hostile.chunks_mut(4096) {
        chunk[..4].copy_from_slice(&kvhoard_format::record::MAGIC);
        chunk[16..24].copy_from_slice(&seq.to_le_bytes());
    }
    // Writes of the put: its pending unit and its rest (one write, two parts), then its header.
    dev.mark_after(2);
    let written = PutOptions { durability: Durability::Written, ..PutOptions::default() };
    s.put("default", "hostile", &hostile, &written).unwrap();
    let crashed = Arc::new(dev.crash_at_mark(CrashMode::KeepAll));
    drop(s);
    fsck_clean(&*crashed, "the crashed image");
    let s = Store::open_on(crashed, StoreOptions::default()).unwrap();
    assert_eq!(s.recovery_report().records_discarded, 0, "nothing taken for a lost record");
    assert_eq!(get(&s, "early"), Some(early));
    assert_eq!(get(&s, "hostile"), None, "its header was never written");
}

/// Recovery that finds a record nothing names writes a lost entry in its place, in the summary it
/// seals the segment with; where that summary does not fit after the evidence, it goes at the
/// end of the intact records, over the evidence, and carries it. A crash before that seal's
/// trailer leaves the summary and no trailer: the next recovery must keep the lost entry it
/// carries, or the key the lost record may have written again would fall back to its older
/// version.
#[test]
fn a_begun_seal_keeps_the_lost_entry_it_carries() {
    let dev = Arc::new(MemDevice::new(SEG * 6));
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, StoreOptions::default()).unwrap();
    s.put("default", "a", &block(1, 9_000), &synced()).unwrap();
    let first = s.get("default", "a", ReadOptions::default()).unwrap().unwrap().meta.location;
    assert_eq!(first.unit, 1, "the segment's first record");
    s.put("default", "a", &block(2, 9_000), &synced()).unwrap();
    let second = s.get("default", "a", ReadOptions::default()).unwrap().unwrap().meta.location;
    assert_eq!(second.segment, first.segment);
    let sb = s.superblock().clone();
    drop(s);
    let crashed = Arc::new(dev.crash(CrashMode::KeepAll));
    let mut unit = crate::AlignedBuf::zeroed(4096);
    crashed.read_at(&mut unit, sb.unit_offset(first.segment, first.unit)).unwrap();
    let h1 = kvhoard_format::record::RecordHeader::decode(&unit).unwrap();
    let seq = h1.segment_seq;
    // Recovery's seal at the end of the intact records, carrying a lost entry where the second
    // record was (its summary written over it), and its trailer lost.
    let mut summary = Vec::new();
    kvhoard_format::summary::encode_entry(&mut summary, first.unit, &h1.encode());
    kvhoard_format::summary::encode_entry(&mut summary, second.unit, &crate::recovery::settle::lost(seq).encode());
    crate::log::seal::write_seal(&*crashed, &sb, first.segment, seq, second.unit, &summary, 2).unwrap();
    crashed.write_at(&crate::AlignedBuf::zeroed(4096), sb.unit_offset(first.segment, sb.segment_units() - 1)).unwrap();
    // No checkpoint (nothing was freed ahead, so none is needed): what "a" is comes from the
    // segment alone.
    let slots = crate::AlignedBuf::zeroed(2 * sb.checkpoint_slot_bytes as usize);
    crashed.write_at(&slots, sb.checkpoint_offset).unwrap();
    crashed.sync().unwrap();
    let s = Store::open_on(crashed, StoreOptions::default()).unwrap();
    assert_eq!(get(&s, "a"), None, "a lost record may have written \"a\" again: never its older version");
    drop(s);
}

/// A checkpoint is filled into the vectors of the one before (kept so that the snapshot, which
/// holds every put waiting, faults no fresh memory in): it must hold the index as it is, not
/// what the one before held.
#[test]
fn a_checkpoint_filled_into_the_last_ones_vectors_holds_only_the_index_now() {
    let dev = Arc::new(MemDevice::new(SEG * 24));
    let opts = StoreOptions { checkpoint_every_segments: 1, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let s = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
    let written = PutOptions { durability: Durability::Written, ..PutOptions::default() };
    let keys: Vec<String> = (0..40).map(|i| format!("k{i}")).collect();
    for (i, k) in keys.iter().enumerate() {
        s.put("default", k, &block(i as u64, 100), &written).unwrap();
    }
    // A periodic checkpoint, whose vectors (every key above in them) are kept.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut filler = 0u64;
    while s.stats().checkpoints == 0 || s.stats().checkpoint_memory_bytes == 0 {
        assert!(std::time::Instant::now() < deadline, "no periodic checkpoint kept its vectors");
        if s.stats().checkpoints == 0 {
            s.put("default", &format!("fill{filler}"), &block(1000 + filler, 300_000), &written).unwrap();
            filler += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    for k in keys.iter().step_by(2) {
        assert!(s.delete("default", k, Durability::Written).unwrap());
    }
    // The next periodic checkpoint, its snapshot filled into those vectors: each filler put
    // waits for the vectors to be back, so that the seal it may make finds them.
    let before = s.stats().checkpoints;
    while s.stats().checkpoints == before {
        assert!(std::time::Instant::now() < deadline, "no checkpoint after the deletes");
        if s.stats().checkpoint_memory_bytes > 0 {
            s.put("default", &format!("fill{filler}"), &block(1000 + filler, 300_000), &written).unwrap();
            filler += 1;
        }
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    // Opened from that checkpoint and the log after it: a deleted key it still named would come
    // back, its tombstone lying before it.
    let (_, s) = reopen(&dev, CrashMode::KeepAll);
    assert!(s.recovery_report().checkpoint_seq >= Some(before + 1), "opened from the checkpoint after the deletes");
    assert_eq!(s.stats().keys, keys.len() as u64 / 2 + filler, "the live keys and no other");
    for (i, k) in keys.iter().enumerate() {
        let expected = (i % 2 == 1).then(|| block(i as u64, 100));
        assert_eq!(get(&s, k), expected, "{k}");
    }
}
