//! fsck against controlled damage: each case checks that fsck finds the problem, that --repair
//! leaves a volume the engine opens and a second fsck calls clean, and that every undamaged block
//! is still readable, byte for byte.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kvhoard_engine::check::{scan_volume, ScanOptions, Severity};
use kvhoard_engine::device::FileDevice;
use kvhoard_engine::fsck::{exit, fsck, FsckOptions, FsckOutcome};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_tests::block;

const BLOCKS: u64 = 60;

fn len(i: u64) -> usize {
    20_000 + (i as usize % 7) * 9_000
}

/// A closed volume of BLOCKS blocks (two of them sharing bytes) in 4 MiB segments.
fn volume(dir: &Path) -> PathBuf {
    let vol = dir.join("vol");
    let create = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 4 << 20 };
    let store = Store::create(&vol, &create, StoreOptions::default()).unwrap();
    for i in 0..BLOCKS {
        store.put("default", &format!("k{i}"), &block(i, len(i)), &PutOptions::default()).unwrap();
    }
    store
        .put(
            "default",
            "copy-of-k3",
            &block(3, len(3)),
            &PutOptions { durability: Durability::Synced, ..PutOptions::default() },
        )
        .unwrap();
    store.close().unwrap();
    vol
}

fn data(vol: &Path) -> PathBuf {
    vol.join("volume.kvh")
}

/// Byte offset of a key's block record on the volume, and of its payload.
fn record_of(vol: &Path, key: &str) -> (u64, u64) {
    let store = Store::open(vol, StoreOptions::default()).unwrap();
    let b = store.get("default", key, ReadOptions::default()).unwrap().unwrap();
    let offset = store.superblock().segment_offset(b.meta.location.segment) + u64::from(b.meta.location.unit) * 4096;
    (offset, offset + 4096)
}

fn patch(path: &Path, offset: u64, f: impl FnOnce(&mut [u8])) {
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    let mut buf = vec![0u8; 4096];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut buf).unwrap();
    f(&mut buf);
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&buf).unwrap();
}

fn run(vol: &Path, repair: bool) -> FsckOutcome {
    fsck(vol, &FsckOptions { repair, deep: true, store: StoreOptions::default() }, &|_, _| {}).unwrap()
}

fn found(outcome: &FsckOutcome, kind: &str) -> bool {
    outcome.found.problems.iter().any(|p| p.kind == kind)
}

/// Repairs, checks again, and checks every block except `lost`.
fn repair_and_verify(vol: &Path, lost: &[&str]) {
    let outcome = run(vol, true);
    assert_eq!(
        outcome.exit_code,
        exit::CORRECTED,
        "repair did not correct everything: {:#?}\nrepairs: {:#?}",
        outcome.after,
        outcome.repairs
    );
    assert!(!outcome.repairs.is_empty());
    let again = run(vol, false);
    assert_eq!(again.exit_code, exit::CLEAN, "second fsck: {:#?}", again.found.problems);
    let store = Store::open(vol, StoreOptions::default()).unwrap();
    for i in 0..BLOCKS {
        let key = format!("k{i}");
        let got = store.get("default", &key, ReadOptions { verify_hash: true }).unwrap();
        if lost.contains(&key.as_str()) {
            assert!(got.is_none(), "{key} should have been deleted by repair");
        } else {
            assert_eq!(&*got.unwrap_or_else(|| panic!("{key} lost")), &block(i, len(i))[..], "{key} changed");
        }
    }
    assert_eq!(store.stats().read_errors, 0);
}

#[test]
fn a_healthy_volume_is_clean() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let outcome = run(&vol, false);
    assert_eq!(outcome.exit_code, exit::CLEAN, "{:#?}", outcome.found.problems);
    assert_eq!(outcome.found.keys, BLOCKS + 1);
    assert_eq!(outcome.found.blocks, BLOCKS);
}

#[test]
fn a_flipped_bit_in_a_record_header_is_found_and_its_keys_deleted() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let (record, _) = record_of(&vol, "k10");
    patch(&data(&vol), record, |b| b[50] ^= 0x20);
    let outcome = run(&vol, false);
    assert_eq!(outcome.exit_code, exit::UNCORRECTED);
    let p = outcome.found.problems.iter().find(|p| p.kind == "damaged_record").unwrap();
    assert_eq!((p.severity, p.key.as_deref(), p.offset), (Severity::Error, Some("k10"), Some(record)));
    assert_eq!(outcome.found.lost_keys, vec![("default".to_string(), "k10".to_string())]);
    repair_and_verify(&vol, &["k10"]);
}

#[test]
fn a_flipped_bit_in_a_payload_shared_by_two_keys_loses_both() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let (_, payload) = record_of(&vol, "k3");
    patch(&data(&vol), payload + 4096, |b| b[7] ^= 1);
    let outcome = run(&vol, false);
    assert_eq!(outcome.found.lost_keys.len(), 2, "{:?}", outcome.found.lost_keys);
    repair_and_verify(&vol, &["k3"]);
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    assert!(!store.contains("default", "copy-of-k3").unwrap());
}

#[test]
fn a_flipped_bit_in_a_segment_summary_is_repaired_without_loss() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let dev = FileDevice::open(&data(&vol), false).unwrap();
    let scan = scan_volume(&dev, ScanOptions::default(), &|_, _| {}).unwrap();
    let seg = scan.segments.iter().find(|s| s.records.len() > 3).unwrap();
    let summary = scan.sb.segment_offset(seg.index) + u64::from(seg.end_unit) * 4096;
    drop(dev);
    patch(&data(&vol), summary, |b| b[300] ^= 0x80);
    let outcome = run(&vol, false);
    assert!(found(&outcome, "summary"), "{:#?}", outcome.found.problems);
    assert_eq!(outcome.found.count(Severity::Error), 0);
    repair_and_verify(&vol, &[]);
}

#[test]
fn a_flipped_bit_in_one_superblock_copy_is_repaired_from_the_other() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    for offset in [0u64, 4096] {
        patch(&data(&vol), offset, |b| b[44] ^= 2);
        let outcome = run(&vol, false);
        assert!(found(&outcome, "superblock_copy"));
        repair_and_verify(&vol, &[]);
    }
}

/// A crash between the writes of the two copies (a segment freed ahead records itself in both)
/// leaves copy B older than copy A: fsck finds it and repair writes B again from A.
#[test]
fn superblock_copies_that_differ_are_found_and_b_rewritten_from_a() {
    use kvhoard_engine::format::superblock::{FreedAhead, Superblock};
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    patch(&data(&vol), 0, |b| {
        let mut sb = Superblock::decode(b).unwrap();
        sb.freed_ahead = FreedAhead { seq: 3, checkpoint_seq: 1 };
        b.copy_from_slice(&sb.encode(0));
    });
    let outcome = run(&vol, false);
    let p = outcome.found.problems.iter().find(|p| p.kind == "superblock_copy").unwrap();
    assert!(p.detail.contains("differs from copy A"), "{p:?}");
    repair_and_verify(&vol, &[]);
    let dev = FileDevice::open(&data(&vol), false).unwrap();
    let scan = scan_volume(&dev, ScanOptions::default(), &|_, _| {}).unwrap();
    assert_eq!(scan.sb.freed_ahead, FreedAhead { seq: 3, checkpoint_seq: 1 });
}

#[test]
fn a_zeroed_page_in_the_middle_of_a_segment_loses_only_that_block() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let (_, payload) = record_of(&vol, "k20");
    patch(&data(&vol), payload, |b| b.fill(0));
    let outcome = run(&vol, false);
    assert_eq!(outcome.found.lost_keys, vec![("default".to_string(), "k20".to_string())]);
    repair_and_verify(&vol, &["k20"]);
}

/// What the cut-off segments of a truncated volume held cannot be known (any key may have had
/// a newer version or a deletion there), so repair extends the file and every key becomes a
/// miss: the volume works again, and nothing comes back older (docs/format.md, "Damage").
#[test]
fn a_truncated_volume_file_is_extended_and_every_key_becomes_a_miss() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let full = std::fs::metadata(data(&vol)).unwrap().len();
    std::fs::OpenOptions::new().write(true).open(data(&vol)).unwrap().set_len(full - (6 << 20)).unwrap();
    let err = Store::open(&vol, StoreOptions::default()).unwrap_err().to_string();
    assert!(err.contains("is damaged") && err.contains("kvhoard fsck --repair"), "{err}");
    let outcome = run(&vol, false);
    assert!(found(&outcome, "truncated"), "{:#?}", outcome.found.problems);
    let all: Vec<String> = (0..BLOCKS).map(|i| format!("k{i}")).collect();
    repair_and_verify(&vol, &all.iter().map(String::as_str).collect::<Vec<_>>());
    assert_eq!(std::fs::metadata(data(&vol)).unwrap().len(), full);
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    store.put("default", "after", b"works", &PutOptions::default()).unwrap();
    assert_eq!(&*store.get("default", "after", ReadOptions::default()).unwrap().unwrap(), b"works");
}

#[test]
fn a_missing_checkpoint_is_found_and_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    std::fs::remove_file(vol.join("checkpoint")).unwrap();
    assert!(found(&run(&vol, false), "checkpoint_missing"));
    repair_and_verify(&vol, &[]);
    assert!(vol.join("checkpoint").exists());
}

#[test]
fn a_stale_checkpoint_is_found_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let old = std::fs::read(vol.join("checkpoint")).unwrap();
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    store.put("default", "later", b"written after the checkpoint", &PutOptions::default()).unwrap();
    store.delete("default", "k5", Durability::Synced).unwrap();
    store.close().unwrap();
    drop(store);
    std::fs::write(vol.join("checkpoint"), old).unwrap();
    let outcome = run(&vol, false);
    assert!(found(&outcome, "checkpoint_stale"), "{:#?}", outcome.found.problems);
    assert_eq!(outcome.found.count(Severity::Error), 0);
    repair_and_verify(&vol, &["k5"]);
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    assert!(store.contains("default", "later").unwrap());
}

/// A closed volume whose second segment, holding "k"'s second version, was reclaimed ahead of the
/// oldest (which holds "k"'s first version and a pinned key, so reclaim passes it over), without
/// a checkpoint of its own when the newest one covered it. Returns its options and the newest
/// key written, with its bytes.
fn freed_ahead_volume(vol: &Path) -> (StoreOptions, String, Vec<u8>) {
    let create = CreateOptions { capacity_bytes: Some(16 << 20), segment_size_bytes: 4 << 20 };
    let opts = StoreOptions { checkpoint_every_segments: 1, ..StoreOptions::default() };
    let store = Store::create(vol, &create, opts.clone()).unwrap();
    let segment_of =
        |key: &str| store.get("default", key, ReadOptions::default()).unwrap().map(|b| b.meta.location.segment);
    let put = |key: &str, bytes: &[u8]| store.put("default", key, bytes, &PutOptions::default()).unwrap();
    put("k", b"version 1");
    put("pinned", &block(7, 100_000));
    assert!(store.pin("default", "pinned").unwrap());
    let first = segment_of("k").unwrap();
    let mut n = 0u64;
    let mut fill = || {
        let key = format!("fill{n}");
        put(&key, &block(1_000 + n, 600_000));
        n += 1;
        assert!(n < 500, "the volume never got there");
        segment_of(&key).unwrap()
    };
    while fill() == first {}
    put("k", b"version 2");
    assert_ne!(segment_of("k"), Some(first));
    while segment_of("k").is_some() {
        fill();
    }
    assert_eq!(segment_of("pinned"), Some(first), "the oldest segment was reclaimed");
    assert!(store.stats().segments_freed_ahead >= 1, "{:?}", store.stats());
    store.put("default", "newest", b"written last", &PutOptions::default()).unwrap();
    store.close().unwrap();
    (opts, "newest".into(), b"written last".to_vec())
}

fn get_bytes(store: &Store, key: &str) -> Option<Vec<u8>> {
    store.get("default", key, ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
}

/// A checkpoint a crash left stale can hold what the log alone lacks: a segment reclaimed ahead
/// of the oldest. Repair keeps such a checkpoint, as a plain open uses it; removed, the index
/// rebuilt from the log alone would bring "k"'s older version back.
#[test]
fn repair_keeps_a_stale_checkpoint_without_which_an_older_version_comes_back() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let (opts, _, _) = freed_ahead_volume(&vol);
    // The checkpoint of a clean close knows "k" is gone; the crash leaves it stale.
    let stale = std::fs::read(vol.join("checkpoint")).unwrap();
    let store = Store::open(&vol, opts.clone()).unwrap();
    store.put("default", "later", b"written after the checkpoint", &PutOptions::default()).unwrap();
    store.close().unwrap();
    drop(store);
    std::fs::write(vol.join("checkpoint"), stale).unwrap();
    let outcome = run(&vol, false);
    assert!(found(&outcome, "checkpoint_stale"), "{:#?}", outcome.found.problems);
    assert!(!found(&outcome, "keys_voided"), "{:#?}", outcome.found.problems);
    let repaired = run(&vol, true);
    assert_eq!(repaired.exit_code, exit::CORRECTED, "{:#?}\n{:#?}", repaired.after, repaired.repairs);
    let store = Store::open(&vol, opts).unwrap();
    assert_eq!(get_bytes(&store, "k"), None, "an older version came back");
    assert!(store.contains("default", "later").unwrap());
    assert_eq!(get_bytes(&store, "pinned"), Some(block(7, 100_000)));
}

/// Without a checkpoint that knows a segment was reclaimed ahead of the oldest (the newest is
/// damaged), the log alone would give "k" its older version: open makes every key whose newest
/// record is older than that segment a miss instead, fsck says so, and repair leaves a volume
/// that checks clean. Keys written after it stay.
#[test]
fn without_the_checkpoint_keys_older_than_a_segment_freed_ahead_are_misses() {
    let dir = tempfile::tempdir().unwrap();
    let vol = dir.path().join("vol");
    let (opts, newest, bytes) = freed_ahead_volume(&vol);
    let damage = || {
        let mut cp = std::fs::read(vol.join("checkpoint")).unwrap();
        let at = cp.len() / 2;
        cp[at] ^= 0x10;
        std::fs::write(vol.join("checkpoint"), cp).unwrap();
    };
    damage();
    let store = Store::open(&vol, opts.clone()).unwrap();
    assert_eq!(store.recovery_report().checkpoint_seq, None);
    assert!(store.recovery_report().keys_voided >= 2, "{:?}", store.recovery_report());
    assert_eq!(get_bytes(&store, "k"), None, "an older version came back");
    assert_eq!(get_bytes(&store, "pinned"), None);
    assert_eq!(get_bytes(&store, &newest), Some(bytes.clone()));
    store.close().unwrap();
    drop(store);
    assert_eq!(run(&vol, false).exit_code, exit::CLEAN, "{:#?}", run(&vol, false).found.problems);
    // The checkpoint written since knows what the damaged one knew: damaged in turn, the same
    // keys are voided again.
    damage();
    let outcome = run(&vol, false);
    assert!(found(&outcome, "checkpoint_damaged"), "{:#?}", outcome.found.problems);
    assert!(found(&outcome, "keys_voided"), "{:#?}", outcome.found.problems);
    let repaired = run(&vol, true);
    assert_eq!(repaired.exit_code, exit::CORRECTED, "{:#?}\n{:#?}", repaired.after, repaired.repairs);
    let again = run(&vol, false);
    assert_eq!(again.exit_code, exit::CLEAN, "{:#?}", again.found.problems);
    let store = Store::open(&vol, opts).unwrap();
    assert_eq!(get_bytes(&store, "k"), None, "an older version came back");
    assert_eq!(get_bytes(&store, &newest), Some(bytes));
}

#[test]
fn a_checkpoint_of_another_volume_is_found_and_replaced() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    let other = tempfile::tempdir().unwrap();
    let other_vol = volume(other.path());
    std::fs::copy(other_vol.join("checkpoint"), vol.join("checkpoint")).unwrap();
    assert!(found(&run(&vol, false), "checkpoint_foreign"));
    repair_and_verify(&vol, &[]);
}

/// Runs the crash test's writer for a moment and kills it: a volume that was never closed.
fn kill_writer(vol: &Path, first: u64) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-writer"))
        .arg(vol)
        .arg(first.to_string())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(150));
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn a_volume_that_was_never_closed_is_sealed_and_checkpointed() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    kill_writer(&vol, 1000);
    let outcome = run(&vol, false);
    assert!(found(&outcome, "unsealed_segment"), "{:#?}", outcome.found.problems);
    assert_eq!(outcome.found.count(Severity::Error), 0, "{:#?}", outcome.found.problems);
    repair_and_verify(&vol, &[]);
}

#[test]
fn intact_records_after_damage_in_an_unsealed_segment_are_kept() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    // Kill the writer until it leaves an unsealed segment with a few records (where the kill
    // lands depends on how fast this machine is right now; each attempt writes new keys).
    let unsealed_with_records = |scan: &kvhoard_engine::check::scan::VolumeScan| {
        scan.segments
            .iter()
            .position(|s| s.summary == kvhoard_engine::check::scan::SummaryState::Unsealed && s.records.len() >= 6)
    };
    let (scan, at) = (0..20u64)
        .find_map(|attempt| {
            kill_writer(&vol, 2000 + attempt * 10_000);
            let dev = FileDevice::open(&data(&vol), false).unwrap();
            let scan = scan_volume(&dev, ScanOptions::default(), &|_, _| {}).unwrap();
            unsealed_with_records(&scan).map(|at| (scan, at))
        })
        .expect("an unsealed segment with records after 20 kills");
    // Zero the payload of an early block record of the unsealed segment (a tombstone has none):
    // recovery would stop there.
    let seg = &scan.segments[at];
    let once = |r: &kvhoard_engine::check::scan::ScannedRecord| {
        r.header.kind == kvhoard_engine::format::record::RecordKind::Block
    };
    let nth =
        (2..seg.records.len() - 1).find(|&i| once(&seg.records[i])).expect("a block record with records after it");
    let victim = &seg.records[nth];
    let after: Vec<(String, usize)> = seg.records[nth + 1..]
        .iter()
        .filter(|r| once(r))
        .map(|r| (r.header.key.clone(), r.header.stored_len as usize))
        .collect();
    patch(&data(&vol), scan.sb.segment_offset(seg.index) + u64::from(victim.unit + 1) * 4096, |b| b.fill(0));
    let outcome = run(&vol, false);
    assert!(found(&outcome, "after_damage"), "{:#?}", outcome.found.problems);
    // An unsealed segment is where a crash tears writes that were never synced: the damaged
    // record is crash debris, not a lost key, and nothing is an error.
    assert!(found(&outcome, "torn_record"), "{:#?}", outcome.found.problems);
    assert_eq!(outcome.found.count(Severity::Error), 0, "{:#?}", outcome.found.problems);
    assert!(outcome.found.lost_keys.is_empty(), "{:?}", outcome.found.lost_keys);
    let repaired = run(&vol, true);
    assert_eq!(repaired.exit_code, exit::CORRECTED, "{:#?}", repaired.after);
    let store = Store::open(&vol, StoreOptions::default()).unwrap();
    for (key, len) in after {
        let id: u64 = key.trim_start_matches('k').parse().unwrap();
        let got = store.get("default", &key, ReadOptions { verify_hash: true }).unwrap();
        // Later keys may have been deleted by the writer itself; those that exist are intact.
        if let Some(got) = got {
            assert_eq!(&*got, &block(id, len)[..]);
        }
    }
    assert!(!store.contains("default", &victim.header.key).unwrap());
}

#[test]
fn a_volume_that_is_not_a_volume_is_an_operational_error() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("volume.kvh"), vec![1u8; 1 << 20]).unwrap();
    assert!(fsck(dir.path(), &FsckOptions::default(), &|_, _| {}).is_err());
}

#[test]
fn a_checkpoint_that_points_at_nothing_is_found_and_the_index_rebuilt_from_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let vol = volume(dir.path());
    // A checkpoint that is well-formed (its crc is recomputed) but points a block one unit off,
    // where no record starts.
    let bytes = std::fs::read(vol.join("checkpoint")).unwrap();
    let mut cp = kvhoard_engine::format::checkpoint::Checkpoint::decode(&bytes).unwrap();
    cp.contents[0].unit += 1;
    std::fs::write(vol.join("checkpoint"), cp.encode()).unwrap();
    let outcome = run(&vol, false);
    assert!(found(&outcome, "checkpoint_dangling"), "{:#?}", outcome.found.problems);
    repair_and_verify(&vol, &[]);
}
