//! Compression in the store: every codec × dtype × layout through put and get, a restart and a
//! crash; the namespace policy that denies lossy codecs; token-dropping codecs served only with
//! their positions; recompression under readers and crashes; damaged frames.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use kvhoard_engine::device::{CrashMode, MemDevice};
use kvhoard_engine::format::{BlockDesc, Dtype};
use kvhoard_engine::{
    CodecSpec, CreateOptions, Durability, Policy, Positions, PutOptions, ReadOptions, Store, StoreError, StoreOptions,
};
use kvhoard_kernels::synth::Synth;
use kvhoard_kernels::{Codec, CpuCodec, KvShape};

const SEG: u64 = 8 << 20;

fn mem_store() -> (Arc<MemDevice>, Store) {
    let dev = Arc::new(MemDevice::new(SEG * 12));
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
    (Arc::clone(&crashed), Store::open_on(crashed, StoreOptions::default()).unwrap())
}

fn synced(codec: Option<CodecSpec>, desc: &BlockDesc) -> PutOptions {
    PutOptions { durability: Durability::Synced, desc: Some(desc.clone()), codec, ..PutOptions::default() }
}

/// Blocks of every layout the codecs take, in every float dtype.
fn blocks() -> Vec<(String, KvShape, Vec<u8>)> {
    let mut out = Vec::new();
    for dtype in [Dtype::Bf16, Dtype::F16, Dtype::F32] {
        let shapes =
            [("kv_2ltd", KvShape::kv_2ltd(dtype, 2, 64, 2, 64)), ("vllm_paged", KvShape::paged(dtype, 4, 16, 2, 64))];
        for (name, shape) in shapes {
            let bytes = Synth::for_desc(shape, 11).generate();
            out.push((format!("{name}-{}", dtype.name()), shape, bytes));
        }
    }
    out
}

/// What the kernels' own codec makes of `bytes` with `spec`: what the store must return.
fn reference(spec: CodecSpec, shape: KvShape, bytes: &[u8]) -> Vec<u8> {
    kvhoard_tests::codec_form(spec, shape, bytes)
}

#[test]
fn every_codec_dtype_and_layout_round_trips_through_restart_and_crash() {
    let specs =
        ["lossless", "lossless:level=3", "quant:bits=8", "quant:bits=4", "quant:bits=2", "quant:bits=4,residual=16"];
    let (dev, store) = mem_store();
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let mut expected = Vec::new();
    for (name, shape, bytes) in blocks() {
        for text in specs {
            let spec = CodecSpec::parse(text).unwrap();
            let key = format!("{name}/{text}");
            let hash = store.put("default", &key, &bytes, &synced(Some(spec), &shape.desc())).unwrap();
            assert_eq!(hash, *blake3::hash(&bytes).as_bytes(), "{key}: the block keeps the name of its bytes");
            let want = if spec.is_lossy() { reference(spec, shape, &bytes) } else { bytes.clone() };
            expected.push((key, want, spec, bytes.len()));
        }
    }
    let check = |store: &Store, when: &str| {
        for (key, want, spec, raw) in &expected {
            let block = store
                .get("default", key, ReadOptions { verify_hash: true })
                .unwrap()
                .unwrap_or_else(|| panic!("{key} {when}"));
            assert_eq!(block.len(), *raw, "{key} {when}: decoded to the full shape");
            assert!(block[..] == want[..], "{key} {when}: not what the codec decodes");
            assert!(block.meta.stored_len < *raw as u64, "{key}: stored compressed");
            assert_eq!(block.meta.codec(), spec.to_string());
            let mut into = vec![0u8; *raw];
            let (_, n) = store.get_into("default", key, &mut into, ReadOptions { verify_hash: true }).unwrap().unwrap();
            assert!(into[..n] == want[..], "{key} {when}: get_into differs");
            let frame = store.get_frame("default", key, ReadOptions::default()).unwrap().unwrap();
            assert_eq!(frame.len() as u64, frame.meta.stored_len, "{key}: the frame is the stored form");
        }
        // The same blocks in one batch (reads in flight together, decoded on every core), with
        // a miss in the middle.
        let mut keys: Vec<&str> = expected.iter().map(|(k, ..)| k.as_str()).collect();
        keys.insert(keys.len() / 2, "no such key");
        let got = store.get_batch("default", &keys, ReadOptions { verify_hash: true }).unwrap();
        let mut want = expected.iter().map(|(_, w, ..)| Some(w));
        for (key, block) in keys.iter().zip(got) {
            if *key == "no such key" {
                assert!(block.is_none(), "{when}: a miss in a batch");
                continue;
            }
            let w = want.next().unwrap().unwrap();
            assert!(block.unwrap()[..] == w[..], "{key} {when}: get_batch differs");
        }
    };
    check(&store, "before a restart");
    store.close().unwrap();
    let (dev2, store) = reopen(&dev, CrashMode::KeepAll);
    check(&store, "after a restart");
    let (_, crashed) = reopen(&dev2, CrashMode::DropAll);
    check(&crashed, "after a crash");
    std::mem::forget(store);
    let stats = crashed.stats();
    assert!(stats.codecs.iter().any(|c| c.codec == "quant" && c.stored_bytes < c.logical_bytes), "{:?}", stats.codecs);
}

#[test]
fn blocks_a_codec_cannot_take_are_stored_as_they_are() {
    let (_dev, store) = mem_store();
    let bytes = kvhoard_tests::block(5, 70_000);
    store
        .put("default", "opaque", &bytes, &PutOptions { codec: Some(CodecSpec::lossless(1)), ..PutOptions::default() })
        .unwrap();
    let block = store.get("default", "opaque", ReadOptions { verify_hash: true }).unwrap().unwrap();
    assert!(block[..] == bytes[..]);
    assert_eq!(block.meta.codec(), "raw");
    assert_eq!(store.stats().codec_skipped, 1);
}

#[test]
fn a_namespace_that_denies_lossy_codecs_never_stores_one() {
    let (dev, store) = mem_store();
    let (_, shape, bytes) = blocks().remove(0);
    let quant = CodecSpec::quant(4, 32, 0);
    let err = store.put("default", "q", &bytes, &synced(Some(quant), &shape.desc())).unwrap_err();
    assert!(matches!(err, StoreError::InvalidArgument { .. }), "{err}");
    assert!(err.to_string().contains("--lossy allow"), "{err}");
    assert!(store.get("default", "q", ReadOptions::default()).unwrap().is_none());
    // Nor as a frame compressed by the caller.
    let frame_opts = PutOptions {
        compression: Some(
            kvhoard_kernels::CodecParams { spec: quant, kv_heads: 2, kept_tokens: 64, positions: Positions::All }
                .to_meta(&shape),
        ),
        raw: Some((bytes.len() as u64, *blake3::hash(&bytes).as_bytes())),
        desc: Some(shape.desc()),
        ..PutOptions::default()
    };
    assert!(store.put("default", "f", &bytes[..1000], &frame_opts).is_err());
    // A policy's default applies when a put names no codec; lossless is always allowed.
    store
        .set_policy("default", Policy { codec: Some(CodecSpec::lossless(1)), lossy: false, ..Default::default() })
        .unwrap();
    assert!(
        store.set_policy("default", Policy { codec: Some(quant), lossy: false, ..Default::default() }).is_err(),
        "a policy must allow its own codec"
    );
    store.put("default", "l", &bytes, &synced(None, &shape.desc())).unwrap();
    assert!(store.meta("default", "l").unwrap().unwrap().codec().starts_with("lossless"));
    // The policy is kept with the volume.
    store.close().unwrap();
    let (_, store) = reopen(&dev, CrashMode::KeepAll);
    assert_eq!(
        store.policy("default"),
        Policy { codec: Some(CodecSpec::lossless(1)), lossy: false, ..Default::default() }
    );
    assert_eq!(store.policy("other"), Policy::default());
}

#[test]
fn token_dropping_codecs_are_served_only_with_their_positions() {
    let (_dev, store) = mem_store();
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let (_, shape, bytes) = blocks().remove(0);
    let spec = CodecSpec::parse("drop-knorm:keep=0.5+quant:bits=8").unwrap();
    store.put("default", "d", &bytes, &synced(Some(spec), &shape.desc())).unwrap();
    let err = store.get("default", "d", ReadOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::TokensDropped { .. }), "{err}");
    let mut buf = vec![0u8; bytes.len()];
    assert!(matches!(
        store.get_into("default", "d", &mut buf, ReadOptions::default()),
        Err(StoreError::TokensDropped { .. })
    ));
    let (block, positions) = store.get_kv("default", "d", ReadOptions::default()).unwrap().unwrap();
    let Positions::Shared(kept) = positions else { panic!("one kept set: {positions:?}") };
    assert_eq!(kept.len(), 32);
    assert!(kept.windows(2).all(|w| w[0] < w[1]), "positions ascend");
    assert_eq!(block.len(), bytes.len() / 2, "half the tokens");
    let (plain, all) = {
        store.put("default", "p", &bytes, &synced(Some(CodecSpec::lossless(1)), &shape.desc())).unwrap();
        store.get_kv("default", "p", ReadOptions::default()).unwrap().unwrap()
    };
    assert_eq!(all, Positions::All);
    assert!(plain[..] == bytes[..]);
}

#[test]
fn recompression_is_atomic_for_readers_and_across_crashes() {
    let (dev, store) = mem_store();
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let (_, shape, bytes) = blocks().remove(0);
    store.put("default", "k", &bytes, &synced(Some(CodecSpec::lossless(1)), &shape.desc())).unwrap();
    let q8 = CodecSpec::quant(8, 32, 0);
    let q4 = CodecSpec::quant(4, 32, 0);
    let q8_bytes = reference(q8, shape, &bytes);
    let q4_from_q8 = reference(q4, shape, &q8_bytes);
    let allowed = [bytes.clone(), q8_bytes.clone(), q4_from_q8.clone()];
    let store = Arc::new(store);
    let stop = Arc::new(AtomicBool::new(false));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (store, stop, allowed) = (Arc::clone(&store), Arc::clone(&stop), allowed.clone());
            std::thread::spawn(move || {
                let mut reads = 0;
                while !stop.load(Ordering::Relaxed) || reads < 20 {
                    let got = store.get("default", "k", ReadOptions::default()).unwrap().unwrap();
                    assert!(allowed.iter().any(|a| a[..] == got[..]), "a reader saw a mix of two forms");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    for _ in 0..5 {
        assert!(store.recompress("default", "k", q8, Durability::Written).unwrap());
        assert!(
            store.recompress("default", "k", CodecSpec::lossless(1), Durability::Written).is_err(),
            "lossy to lossless would claim bytes it no longer has"
        );
    }
    assert!(store.recompress("default", "k", q4, Durability::Synced).unwrap());
    stop.store(true, Ordering::Relaxed);
    for r in readers {
        assert!(r.join().unwrap() > 0);
    }
    let got = store.get("default", "k", ReadOptions::default()).unwrap().unwrap();
    assert!(got[..] == q4_from_q8[..]);
    assert!(got.meta.codec().starts_with("quant:bits=4"));
    assert_eq!(got.meta.content_hash, *blake3::hash(&bytes).as_bytes(), "the block keeps its name");
    // A crash mid-recompression leaves one of the two forms.
    store.put("default", "c", &bytes, &synced(Some(CodecSpec::lossless(1)), &shape.desc())).unwrap();
    assert!(store.recompress("default", "c", q8, Durability::Written).unwrap());
    for seed in 0..8 {
        let (_, after) = reopen(&dev, CrashMode::Random(seed));
        let got = after.get("default", "c", ReadOptions::default()).unwrap().unwrap();
        assert!(got[..] == bytes[..] || got[..] == q8_bytes[..], "seed {seed}: neither form");
        std::mem::forget(after);
    }
    // A key overwritten meanwhile is left alone.
    assert!(!store.recompress("default", "missing", q8, Durability::Written).unwrap());
}

/// A key recompressed into a form another key stored already links to that form's record. A
/// second record of the form, at the head of the log, would become its place: the links to it
/// written in between would then lie before its one record once the first was freed, and a
/// crash would lose them.
#[test]
fn a_key_recompressed_into_a_form_stored_already_links_to_it() {
    let (dev, store) = mem_store();
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let (_, shape, bytes) = blocks().remove(0);
    let q8 = CodecSpec::quant(8, 32, 0);
    store.put("default", "z", &bytes, &synced(Some(q8), &shape.desc())).unwrap();
    store.put("default", "z-copy", &bytes, &synced(Some(q8), &shape.desc())).unwrap();
    store.put("default", "y", &bytes, &synced(Some(CodecSpec::lossless(1)), &shape.desc())).unwrap();
    let at = store.meta("default", "z").unwrap().unwrap().location;
    assert!(store.recompress("default", "y", q8, Durability::Synced).unwrap());
    for key in ["z", "z-copy", "y"] {
        let meta = store.meta("default", key).unwrap().unwrap();
        assert_eq!((meta.location.segment, meta.location.unit), (at.segment, at.unit), "{key}: the form moved");
    }
    let q8_bytes = reference(q8, shape, &bytes);
    let (_, after) = reopen(&dev, CrashMode::DropAll);
    for key in ["z", "z-copy", "y"] {
        let got = after.get("default", key, ReadOptions::default()).unwrap().unwrap();
        assert!(got[..] == q8_bytes[..], "{key}");
    }
}

#[test]
fn damaged_frames_are_misses_never_garbage() {
    let (_dev, store) = mem_store();
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let (_, shape, bytes) = blocks().remove(0);
    let mut codec = CpuCodec::new(CodecSpec::quant(4, 32, 0)).unwrap();
    let mut frame = vec![0u8; codec.max_payload_size(&shape)];
    let c = codec.compress(&kvhoard_kernels::Block::new(shape, &bytes), &mut frame).unwrap();
    frame.truncate(c.len);
    let mut rng = kvhoard_tests::Rng::new(9);
    for i in 0..200 {
        // A frame damaged before it was stored (its crc then matches): decoding must refuse
        // it or decode something whole, never panic.
        let mut bad = frame.clone();
        let cut = rng.below(bad.len() as u64 + 1) as usize;
        if i % 2 == 0 {
            bad.truncate(cut);
        } else if let Some(b) = bad.get_mut(cut) {
            *b ^= 1 << rng.below(8);
        }
        let mut meta = c.meta();
        if i % 7 == 0 && !meta.params.is_empty() {
            let at = rng.below(meta.params.len() as u64) as usize;
            meta.params[at] ^= 0xff;
        }
        let opts = PutOptions {
            compression: Some(meta),
            raw: Some((bytes.len() as u64, *blake3::hash(&bytes).as_bytes())),
            desc: Some(shape.desc()),
            ..PutOptions::default()
        };
        let key = format!("bad{i}");
        store.put("default", &key, &bad, &opts).unwrap();
        match store.get("default", &key, ReadOptions::default()) {
            Ok(Some(b)) => assert_eq!(b.len(), bytes.len(), "a damaged frame decoded to a block of another size"),
            Ok(None) | Err(StoreError::Codec { .. }) => {}
            Err(e) => panic!("{key}: {e}"),
        }
    }
}

#[test]
fn namespace_policies_survive_a_damaged_superblock_copy_and_its_repair() {
    use std::io::{Seek, SeekFrom, Write};
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let vol = dir.path().join("vol");
    let create = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 8 << 20 };
    let store = Store::create(&vol, &create, StoreOptions::default()).unwrap();
    let policy = Policy { codec: Some(CodecSpec::quant(8, 32, 0)), lossy: true, ..Default::default() };
    store.set_policy("lmcache", policy.clone()).unwrap();
    store.close().unwrap();
    drop(store);
    for (offset, what) in
        [(20u64, "copy A's superblock"), (4096 + 150, "copy B's policies"), (150, "copy A's policies")]
    {
        let mut f = std::fs::OpenOptions::new().write(true).open(vol.join("volume.kvh")).unwrap();
        f.seek(SeekFrom::Start(offset)).unwrap();
        f.write_all(&[0xA5; 8]).unwrap();
        drop(f);
        let store = Store::open(&vol, StoreOptions::default()).unwrap();
        assert_eq!(store.policy("lmcache"), policy, "after damaging {what}");
        store.close().unwrap();
        drop(store);
        let found = kvhoard_engine::fsck::fsck(&vol, &Default::default(), &|_, _| {}).unwrap();
        assert_ne!(found.exit_code, 0, "fsck calls the volume clean with {what} damaged");
        let repaired = kvhoard_engine::fsck::fsck(
            &vol,
            &kvhoard_engine::fsck::FsckOptions { repair: true, ..Default::default() },
            &|_, _| {},
        )
        .unwrap();
        assert_eq!(repaired.exit_code, 1, "{what}: {:?}", repaired.after.map(|r| r.problems));
        let store = Store::open(&vol, StoreOptions::default()).unwrap();
        assert_eq!(store.policy("lmcache"), policy, "after repairing {what}");
        store.close().unwrap();
    }
}

/// On io_uring each read is handed back while later ones are still in flight, and a worker
/// decodes each compressed record then: a batch returns exactly what single gets return, for
/// every codec, with raw blocks and misses in their places, before and after a restart.
#[test]
fn a_batch_on_io_uring_decodes_each_block_as_its_read_arrives() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let opts = StoreOptions { io_backend: kvhoard_engine::IoBackend::IoUring, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 16 << 20 };
    let store = Store::create(dir.path(), &create, opts.clone()).unwrap();
    if store.stats().device_backend != "io_uring" {
        kvhoard_tests::skip("io_uring", "the store fell back to pread: io_uring is not available here");
        return;
    }
    store.set_policy("default", Policy { codec: None, lossy: true, ..Default::default() }).unwrap();
    let specs = ["lossless", "quant:bits=4", "quant:bits=8", "lossless:level=3"];
    let mut keys = Vec::new();
    for i in 0..24u64 {
        // 1 MiB blocks: each record is read in several chunks.
        let synth = Synth::new(4, 256, 4, 64, 70 + i);
        let key = format!("kv{i}");
        if i % 5 == 4 {
            store.put("default", &key, &synth.generate(), &synced(None, &synth.desc.desc())).unwrap();
        } else {
            let spec = CodecSpec::parse(specs[i as usize % specs.len()]).unwrap();
            store.put("default", &key, &synth.generate(), &synced(Some(spec), &synth.desc.desc())).unwrap();
        }
        keys.push(key);
    }
    let check = |store: &Store, when: &str| {
        let read = ReadOptions { verify_hash: true };
        let mut names: Vec<&str> = keys.iter().map(String::as_str).collect();
        names.insert(7, "no such key");
        names.push("kv3");
        let got = store.get_batch("default", &names, read).unwrap();
        assert_eq!(got.len(), names.len());
        for (name, block) in names.iter().zip(&got) {
            let want = store.get("default", name, read).unwrap();
            assert_eq!(block.as_ref().map(|b| b.to_vec()), want.map(|b| b.to_vec()), "{name} {when}");
        }
        assert!(got[7].is_none(), "a miss in its place {when}");
        assert!(got.iter().filter(|b| b.is_some()).count() == 25, "every stored key found {when}");
        assert_eq!(store.stats().read_errors, 0);
    };
    check(&store, "before a restart");
    store.close().unwrap();
    let store = Store::open(dir.path(), opts).unwrap();
    check(&store, "after a restart");
}
