//! Opening a volume whose checkpoint an older kvhoard wrote (checkpoint format 1, whose block
//! fingerprints covered the bytes alone): open rebuilds the index from the log and writes a
//! current checkpoint, fsck calls the old checkpoint an upgrade rather than damage, and every
//! key reads back its own bytes and description.

use std::path::Path;

use kvhoard_engine::format::{BlockDesc, Dtype, Layout};
use kvhoard_engine::fsck::{exit, fsck, FsckOptions};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_tests::block;

fn shaped(shape: Vec<u64>) -> PutOptions {
    PutOptions {
        desc: Some(BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape }),
        durability: Durability::Synced,
        ..PutOptions::default()
    }
}

/// Rewrites the checkpoint file as format version 1 (same layout, older meaning), with a
/// valid crc, as the previous release wrote it.
fn make_checkpoint_version_1(vol: &Path) {
    let path = vol.join("checkpoint");
    let mut bytes = std::fs::read(&path).unwrap();
    assert_eq!(&bytes[8..12], &2u32.to_le_bytes(), "this build writes checkpoint format 2");
    bytes[8..12].copy_from_slice(&1u32.to_le_bytes());
    let body = bytes.len() - 4;
    let crc = crc32c::crc32c(&bytes[..body]);
    bytes[body..].copy_from_slice(&crc.to_le_bytes());
    std::fs::write(&path, bytes).unwrap();
}

#[test]
fn a_volume_with_an_older_checkpoint_opens_from_its_log_and_loses_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let vol = dir.path().join("vol");
    let create = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 4 << 20 };
    let store = Store::create(&vol, &create, StoreOptions::default()).unwrap();
    let (a, b) = (shaped(vec![2, 4, 16, 64]), shaped(vec![2, 2, 32, 64]));
    let same = block(1, 16 * 1024);
    store.put("default", "a", &same, &a).unwrap();
    store.put("default", "a-too", &same, &a).unwrap();
    store.put("default", "b", &same, &b).unwrap();
    for i in 0..20u64 {
        store.put("default", &format!("k{i}"), &block(100 + i, 9000), &PutOptions::default()).unwrap();
    }
    store.delete("default", "k3", Durability::Synced).unwrap();
    store.close().unwrap();
    drop(store);
    make_checkpoint_version_1(&vol);

    let checked = fsck(&vol, &FsckOptions::default(), &|_, _| {}).unwrap();
    assert_eq!(checked.exit_code, exit::CLEAN, "an outdated checkpoint is not damage: {:?}", checked.found.problems);
    assert!(checked.found.problems.iter().any(|p| p.kind == "checkpoint_outdated"), "{:?}", checked.found.problems);

    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    assert_eq!(store.recovery_report().checkpoint_seq, None, "the old checkpoint was not used");
    assert!(store.recovery_report().records_replayed > 0, "the index was rebuilt from the log");
    let read = |key: &str| store.get("default", key, ReadOptions { verify_hash: true }).unwrap();
    for (key, desc) in [("a", &a.desc), ("a-too", &a.desc), ("b", &b.desc)] {
        let got = read(key).unwrap_or_else(|| panic!("{key} is missing"));
        assert!(got[..] == same[..], "{key}: other bytes");
        assert_eq!(Some(&got.meta.desc), desc.as_ref(), "{key}: another description");
    }
    for i in 0..20u64 {
        let got = read(&format!("k{i}"));
        if i == 3 {
            assert!(got.is_none(), "a deleted key came back");
        } else {
            assert!(got.unwrap()[..] == block(100 + i, 9000)[..], "k{i}: other bytes");
        }
    }
    store.close().unwrap();
    drop(store);
    // The next open reads the current checkpoint the last one wrote.
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    assert!(store.recovery_report().checkpoint_seq.is_some());
    assert_eq!(store.recovery_report().records_replayed, 0);
    store.close().unwrap();
    drop(store);
    let checked = fsck(&vol, &FsckOptions::default(), &|_, _| {}).unwrap();
    assert_eq!(checked.exit_code, exit::CLEAN);
    assert!(checked.found.problems.is_empty(), "{:?}", checked.found.problems);
}
