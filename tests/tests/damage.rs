//! Damage never brings back an older version or a deleted key: it may only turn keys into
//! misses (docs/format.md, "Damage"). Each case builds a volume from a random workload of puts,
//! overwrites and deletes with a model of what every key should hold, leaves it as a crash
//! leaves it (the open segment unsealed) or closed cleanly, damages it one way, opens it and
//! checks every key against the model; then checks that fsck does not call a volume clean whose
//! open discarded records, repairs it, and checks every key again.
//!
//! `KVHOARD_DAMAGE_TRIALS` sets the trials per class (default 6); each run uses seed 1 and a
//! random one, printed, for the workloads and the damage.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use kvhoard_engine::check::scan::SummaryState;
use kvhoard_engine::check::{scan_volume, ScanOptions};
use kvhoard_engine::device::FileDevice;
use kvhoard_engine::fsck::{exit, fsck, FsckOptions};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions};
use kvhoard_tests::{block, Rng};

const KEYS: u64 = 60;
const SEGMENT: u64 = 2 << 20;
const UNIT: u64 = 4096;

/// What every key should hold: the seed of its newest version, `None` once deleted, and every
/// seed it ever held.
#[derive(Default, Clone)]
struct Model {
    newest: BTreeMap<String, Option<u64>>,
    ever: BTreeMap<String, Vec<u64>>,
}

fn len_of(seed: u64) -> usize {
    3000 + (seed.wrapping_mul(7919) % 24) as usize * 2500
}

/// A volume after `ops` random operations, as a crash leaves it (`crashed`) or closed.
fn workload(dir: &Path, seed: u64, ops: u64, crashed: bool) -> (PathBuf, Model) {
    let vol = dir.join("vol");
    let create = CreateOptions { capacity_bytes: Some(24 << 20), segment_size_bytes: SEGMENT };
    let store = Store::create(&vol, &create, StoreOptions::default()).unwrap();
    let mut model = Model::default();
    let mut rng = Rng::new(seed);
    for op in 0..ops {
        let key = format!("k{}", rng.below(KEYS));
        let durability = if rng.below(10) == 0 { Durability::Synced } else { Durability::Written };
        if rng.below(5) == 0 {
            store.delete("default", &key, durability).unwrap();
            model.newest.insert(key, None);
        } else {
            let v = seed.wrapping_mul(1_000_003).wrapping_add(op);
            store.put("default", &key, &block(v, len_of(v)), &PutOptions { durability, ..Default::default() }).unwrap();
            model.newest.insert(key.clone(), Some(v));
            model.ever.entry(key).or_default().push(v);
        }
    }
    if !crashed {
        store.close().unwrap();
        return (vol, model);
    }
    // What a SIGKILL leaves: every acknowledged write is in the file, nothing is sealed.
    let image = dir.join("crashed");
    std::fs::create_dir(&image).unwrap();
    for entry in std::fs::read_dir(&vol).unwrap() {
        let entry = entry.unwrap();
        let name = entry.file_name();
        if name != "lock" {
            std::fs::copy(entry.path(), image.join(name)).unwrap();
        }
    }
    drop(store);
    (image, model)
}

/// Every key that breaks the rule: a value other than its newest, or any value once deleted.
fn violations(store: &Store, model: &Model) -> Vec<String> {
    let mut bad = Vec::new();
    for (key, newest) in &model.newest {
        let got = match store.get("default", key, ReadOptions { verify_hash: true }) {
            Ok(Some(b)) => b.to_vec(),
            Ok(None) | Err(_) => continue,
        };
        match newest {
            Some(v) if got == block(*v, len_of(*v)) => {}
            None => bad.push(format!("{key}: deleted, but came back")),
            Some(_) => {
                let older = model.ever.get(key).into_iter().flatten().any(|v| got == block(*v, len_of(*v)));
                bad.push(format!("{key}: {}", if older { "an older version" } else { "bytes never stored" }));
            }
        }
    }
    bad
}

fn data(vol: &Path) -> PathBuf {
    vol.join("volume.kvh")
}

fn patch(vol: &Path, offset: u64, f: impl FnOnce(&mut [u8])) {
    use std::io::{Read, Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(data(vol)).unwrap();
    let mut buf = vec![0u8; 4096];
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.read_exact(&mut buf).unwrap();
    f(&mut buf);
    file.seek(SeekFrom::Start(offset)).unwrap();
    file.write_all(&buf).unwrap();
}

fn flip(vol: &Path, offset: u64, bit: u8) {
    patch(vol, offset & !(UNIT - 1), |b| b[(offset % UNIT) as usize] ^= 1 << (bit % 8));
}

/// The records of the volume's unsealed segments (or of any segment with `sealed`): offsets of
/// their first byte and lengths.
fn records(vol: &Path, sealed: bool) -> Vec<(u64, u64)> {
    let dev = FileDevice::open(&data(vol), false).unwrap();
    let scan = scan_volume(&dev, ScanOptions::default(), &|_, _| {}).unwrap();
    let mut out = Vec::new();
    for seg in &scan.segments {
        if !sealed && seg.summary != SummaryState::Unsealed || seg.seq().is_none() {
            continue;
        }
        let base = scan.sb.segment_offset(seg.index);
        out.extend(seg.records.iter().map(|r| (base + u64::from(r.unit) * UNIT, u64::from(r.units) * UNIT)));
    }
    out
}

fn segment_headers(vol: &Path) -> Vec<u64> {
    let dev = FileDevice::open(&data(vol), false).unwrap();
    let scan = scan_volume(&dev, ScanOptions::default(), &|_, _| {}).unwrap();
    scan.segments.iter().filter(|s| s.seq().is_some()).map(|s| scan.sb.segment_offset(s.index)).collect()
}

fn damage_checkpoint(vol: &Path, rng: &mut Rng) {
    let path = vol.join("checkpoint");
    let mut bytes = std::fs::read(&path).unwrap();
    let at = rng.below(bytes.len() as u64) as usize;
    bytes[at] ^= 0x10;
    std::fs::write(&path, bytes).unwrap();
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    /// A byte anywhere in a record of the open segment.
    OpenRecordByte,
    /// A byte of a record header of the open segment.
    OpenHeaderByte,
    /// Both copies of a record header of the open segment (the header past its magic and seq,
    /// and its echo at the end of the first unit).
    OpenHeaderCopies,
    /// A sealed segment's header, and the checkpoint.
    SegmentHeaderAndCheckpoint,
    /// A byte of a sealed segment's summary or trailer, and the checkpoint.
    SummaryAndCheckpoint,
}

/// Damages the volume; `false` if it has nothing of the kind to damage.
fn damage(vol: &Path, kind: Damage, rng: &mut Rng) -> bool {
    let pick = |list: &[(u64, u64)], rng: &mut Rng| list.get(rng.below(list.len().max(1) as u64) as usize).copied();
    match kind {
        Damage::OpenRecordByte | Damage::OpenHeaderByte | Damage::OpenHeaderCopies => {
            let Some((at, len)) = pick(&records(vol, false), rng) else { return false };
            match kind {
                Damage::OpenRecordByte => flip(vol, at + rng.below(len), rng.below(8) as u8),
                Damage::OpenHeaderByte => flip(vol, at + rng.below(160), rng.below(8) as u8),
                _ => patch(vol, at, |b| {
                    b[24..40].iter_mut().for_each(|x| *x ^= 0x5a);
                    b[4096 - 40..4096 - 8].iter_mut().for_each(|x| *x ^= 0x5a);
                }),
            }
        }
        Damage::SegmentHeaderAndCheckpoint => {
            let headers = segment_headers(vol);
            let Some(&at) = headers.get(rng.below(headers.len().max(1) as u64) as usize) else { return false };
            flip(vol, at + rng.below(64), rng.below(8) as u8);
            damage_checkpoint(vol, rng);
        }
        Damage::SummaryAndCheckpoint => {
            let headers = segment_headers(vol);
            let Some(&base) = headers.get(rng.below(headers.len().max(1) as u64) as usize) else { return false };
            // The trailer is the segment's last unit.
            flip(vol, base + SEGMENT - UNIT + rng.below(64), rng.below(8) as u8);
            damage_checkpoint(vol, rng);
        }
    }
    true
}

fn trials() -> u64 {
    std::env::var("KVHOARD_DAMAGE_TRIALS").ok().and_then(|v| v.parse().ok()).unwrap_or(6)
}

fn seeds() -> [u64; 2] {
    let random = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64;
    eprintln!("damage: seeds 1 and {random}");
    [1, random]
}

/// Opens the damaged volume, checks every key, checks fsck, repairs, checks again.
fn check_case(vol: &Path, model: &Model, what: &str) -> Vec<String> {
    let mut bad = Vec::new();
    let discarded = match Store::open(vol, StoreOptions::default()) {
        Ok(store) => {
            bad.extend(violations(&store, model).into_iter().map(|v| format!("{what}, after open: {v}")));
            let report = store.recovery_report().clone();
            store.close().unwrap();
            report.records_discarded > 0
        }
        Err(e) => {
            let msg = e.to_string();
            if !msg.contains("fsck --repair") {
                bad.push(format!("{what}: open failed without saying to repair: {msg}"));
            }
            true
        }
    };
    let checked = fsck(vol, &FsckOptions::default(), &|_, _| {}).unwrap();
    if discarded && checked.exit_code == exit::CLEAN {
        bad.push(format!("{what}: fsck calls the volume clean after open discarded records"));
    }
    let opts = FsckOptions { repair: true, ..FsckOptions::default() };
    let repaired = fsck(vol, &opts, &|_, _| {}).unwrap();
    if repaired.exit_code != exit::CLEAN && repaired.exit_code != exit::CORRECTED {
        bad.push(format!("{what}: repair left the volume uncorrected: {:?}", repaired.after.map(|r| r.problems)));
    }
    match Store::open(vol, StoreOptions::default()) {
        Ok(store) => {
            bad.extend(violations(&store, model).into_iter().map(|v| format!("{what}, after repair: {v}")));
            store.close().unwrap();
        }
        Err(e) => bad.push(format!("{what}: does not open after repair: {e}")),
    }
    bad
}

fn run_class(kind: Damage, crashed: bool) {
    let mut bad = Vec::new();
    let mut done = 0;
    for seed in seeds() {
        let mut rng = Rng::new(seed ^ 0x5eed);
        for trial in 0..trials() {
            let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
            let (vol, model) = workload(dir.path(), seed.wrapping_add(trial), 500, crashed);
            if !damage(&vol, kind, &mut rng) {
                continue;
            }
            done += 1;
            bad.extend(check_case(&vol, &model, &format!("{kind:?} seed {seed} trial {trial}")));
        }
    }
    assert!(done > 0, "{kind:?}: nothing to damage in any trial");
    assert!(bad.is_empty(), "{} violations in {done} damaged volumes:\n{}", bad.len(), bad.join("\n"));
}

#[test]
fn a_damaged_byte_in_the_open_segment_turns_keys_into_misses_only() {
    run_class(Damage::OpenRecordByte, true);
}

#[test]
fn a_damaged_record_header_in_the_open_segment_turns_keys_into_misses_only() {
    run_class(Damage::OpenHeaderByte, true);
}

#[test]
fn a_record_whose_every_header_copy_is_damaged_turns_keys_into_misses_only() {
    run_class(Damage::OpenHeaderCopies, true);
}

#[test]
fn a_damaged_segment_header_and_checkpoint_turn_keys_into_misses_only() {
    run_class(Damage::SegmentHeaderAndCheckpoint, false);
}

#[test]
fn a_damaged_summary_and_checkpoint_turn_keys_into_misses_only() {
    run_class(Damage::SummaryAndCheckpoint, false);
}

#[test]
fn a_truncated_volume_asks_for_repair_and_repair_brings_nothing_back() {
    let mut bad = Vec::new();
    for seed in seeds() {
        let mut rng = Rng::new(seed ^ 0x7a11);
        for trial in 0..trials() {
            for crashed in [false, true] {
                let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
                let (vol, model) = workload(dir.path(), seed.wrapping_add(trial), 500, crashed);
                let len = std::fs::metadata(data(&vol)).unwrap().len();
                let cut = (1 << 20) + rng.below(len - (1 << 20));
                std::fs::OpenOptions::new().write(true).open(data(&vol)).unwrap().set_len(cut).unwrap();
                bad.extend(check_case(&vol, &model, &format!("truncated at {cut}, seed {seed} trial {trial}")));
            }
        }
    }
    assert!(bad.is_empty(), "{} violations:\n{}", bad.len(), bad.join("\n"));
}
