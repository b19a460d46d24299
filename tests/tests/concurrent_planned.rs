//! Many threads putting, deleting, pinning and getting at once on a volume far smaller than what
//! they write, placed by the planner with its background cleaner at work, against a reference
//! model: the planner drops contexts while writers put into them, cleaning relocates and
//! recompresses (losslessly) blocks that readers are reading and writers are replacing, and
//! reclaim empties whole segments. A key may read as a miss at any time (the volume cannot hold
//! everything), but a block found is always a whole value of its key, never a version older than
//! the one acknowledged before the read, and never one a delete acknowledged before the read
//! removed. The volume is reopened between rounds and checked again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use kvhoard_engine::check::{check_device, ScanOptions, Severity};
use kvhoard_engine::device::CrashMode;
use kvhoard_engine::placement::load_model::LoadModel;
use kvhoard_engine::placement::planner::{DramChoice, PlannerConfig, StoreOption};
use kvhoard_engine::placement::{Planned, PlannedConfig};
use kvhoard_engine::{
    AlignedBuf, Clock, CodecSpec, CreateOptions, Durability, IoBackend, PutOptions, ReadOptions, Store, StoreOptions,
    WriterConfig,
};
use kvhoard_tests::{block, Rng};

const WRITERS: u32 = 4;
const READERS: u32 = 2;
/// Contexts per writer, and keys per context.
const CONTEXTS: u32 = 12;
const PER_CONTEXT: u32 = 6;
const OPS: u32 = 260;
const ROUNDS: u32 = 3;
const SEG: u64 = 1 << 20;
const SEGMENTS: u64 = 24;
/// Set in an acknowledged state: the key was deleted after the version in the low bits.
const DELETED: u64 = 1 << 63;

fn key(t: u32, c: u32, k: u32) -> String {
    format!("w{t}/c{c}/k{k}")
}

/// The group a writer's context is put under: the planner's unit of decision.
fn group(t: u32, c: u32) -> u64 {
    (u64::from(t) << 32) | u64::from(c)
}

/// A value naming its writer, context, key and version, the rest derived from them. Half are
/// made of few distinct bytes, so that a lossless codec shrinks them.
fn value(t: u32, c: u32, k: u32, version: u64) -> Vec<u8> {
    let seed = (u64::from(t) << 56) ^ (u64::from(c) << 40) ^ (u64::from(k) << 32) ^ version;
    let spread = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
    let len = 4096 + (spread % (120 << 10)) as usize;
    let mut v = Vec::with_capacity(len);
    for word in [t, c, k] {
        v.extend_from_slice(&word.to_le_bytes());
    }
    v.extend_from_slice(&version.to_le_bytes());
    let body = block(seed, len - v.len());
    if spread.is_multiple_of(2) {
        v.extend(body.iter().map(|b| b & 0x3));
    } else {
        v.extend_from_slice(&body);
    }
    v
}

/// The version a value says it is, after checking that every byte is what that version holds.
fn check(t: u32, c: u32, k: u32, bytes: &[u8]) -> u64 {
    let name = key(t, c, k);
    assert!(bytes.len() >= 20, "{name}: a block of {} bytes is too short to be a value", bytes.len());
    let header: Vec<u8> = [t, c, k].iter().flat_map(|w| w.to_le_bytes()).collect();
    assert_eq!(bytes[..12], header[..], "{name}: another key's block");
    let version = u64::from_le_bytes(bytes[12..20].try_into().unwrap());
    assert!(bytes == value(t, c, k, version).as_slice(), "{name}: version {version} has wrong bytes");
    version
}

/// A block read after `floor` was the acknowledged state is new enough: at least the version
/// acknowledged, or later than the version a delete removed.
fn assert_new_enough(name: &str, floor: u64, version: u64) {
    if floor & DELETED != 0 {
        let removed = floor & !DELETED;
        assert!(version > removed, "{name}: read version {version}, deleted after {removed}");
    } else {
        assert!(version >= floor, "{name}: read version {version} after {floor} was acknowledged");
    }
}

/// The planner with lossless options only (the default namespace denies lossy codecs): as the
/// block was put, compressed losslessly, or dropped.
fn planner() -> Arc<Planned> {
    let option = |ratio, delay_s| StoreOption { ratio, delay_s, lossy: false };
    let config = PlannedConfig {
        planner: PlannerConfig {
            alpha: 0.05,
            half_life_ms: 60_000,
            budget_bytes: u64::MAX,
            options: vec![option(1.05, 0.004), option(0.6, 0.005), option(0.0, 0.02)],
            dram: DramChoice::default(),
        },
        codecs: vec![None, Some(CodecSpec::lossless(1))],
        quality: vec![1.0, 1.0, 1.0],
        loads: LoadModel::default(),
    };
    Arc::new(Planned::new(config, Clock::system()).unwrap())
}

/// The acknowledged state of every key: `acked[t][c * PER_CONTEXT + k]`.
type Acked = Vec<Vec<AtomicU64>>;

fn slot(acked: &Acked, t: u32, c: u32, k: u32) -> &AtomicU64 {
    &acked[t as usize][(c * PER_CONTEXT + k) as usize]
}

fn run(io_backend: IoBackend, dram_tier_bytes: u64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let writer = WriterConfig { in_flight_bytes: 1 << 20, request_bytes: 256 << 10 };
    let planner = planner();
    let opts = StoreOptions {
        io_backend,
        dram_tier_bytes,
        writer,
        placement: planner.clone(),
        clean_bytes_per_sec: 1 << 30,
        ..StoreOptions::default()
    };
    let create = CreateOptions { capacity_bytes: Some(SEG * SEGMENTS), segment_size_bytes: SEG };
    let mut store = Store::create(dir.path(), &create, opts.clone()).unwrap();
    planner.set_budget(store.stats().capacity_bytes * 6 / 10);
    let keys = (CONTEXTS * PER_CONTEXT) as usize;
    let acked: Acked = (0..WRITERS).map(|_| (0..keys).map(|_| AtomicU64::new(DELETED)).collect()).collect();
    let mut next_version = vec![vec![0u64; keys]; WRITERS as usize];
    // Over the rounds: bytes put, keys the planner dropped, segments cleaned.
    let mut totals = (0u64, 0u64, 0u64);
    for round in 0..ROUNDS {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut writers = Vec::new();
            for (t, versions) in next_version.iter_mut().enumerate() {
                let (store, acked, done) = (&store, &acked, &done);
                let seed = u64::from(round * 100) + t as u64;
                writers.push(s.spawn(move || {
                    let floors = Floors { acked, written: None, synced: None };
                    write(store, &floors, t as u32, versions, seed, OPS, done)
                }));
            }
            for r in 0..READERS {
                let (store, acked, done) = (&store, &acked, &done);
                s.spawn(move || {
                    let mut rng = Rng::new(u64::from(1000 + round * 10 + r));
                    let mut bufs: Vec<AlignedBuf> = (0..BATCH).map(|_| AlignedBuf::zeroed(128 << 10)).collect();
                    while !done.load(Ordering::SeqCst) {
                        if r == 1 {
                            read_a_batch(store, acked, &mut rng, &mut bufs);
                        } else {
                            read_one(store, acked, &mut rng);
                        }
                    }
                });
            }
            for w in writers {
                if let Err(panic) = w.join() {
                    done.store(true, Ordering::SeqCst);
                    std::panic::resume_unwind(panic);
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        verify(&store, &acked, round);
        let stats = store.stats();
        assert_eq!(stats.read_errors, 0, "round {round}: {stats:?}");
        totals = (totals.0 + stats.put_bytes, totals.1 + stats.planner_dropped_keys, totals.2 + stats.segments_cleaned);
        store.close().unwrap();
        drop(store);
        store = Store::open(dir.path(), opts.clone()).unwrap();
        verify(&store, &acked, round);
        planner.set_budget(store.stats().capacity_bytes * 6 / 10);
    }
    // The regime this test is for: the volume filled many times over, the planner dropped
    // contexts, the cleaner emptied segments.
    let (put_bytes, dropped, cleaned) = totals;
    assert!(put_bytes > 3 * SEG * SEGMENTS, "{put_bytes} bytes put: too few to fill the volume");
    assert!(dropped > 0, "the planner dropped no key");
    assert!(cleaned > 0, "the cleaner emptied no segment");
    store.close().unwrap();
}

/// What a writer records of its acknowledged ops: the state of each key after its last op
/// acknowledged, after its last op acknowledged as written (or synced), and as synced.
struct Floors<'a> {
    acked: &'a Acked,
    written: Option<&'a Acked>,
    synced: Option<&'a Acked>,
}

impl Floors<'_> {
    fn record(&self, t: u32, c: u32, k: u32, state: u64, durability: Durability) {
        slot(self.acked, t, c, k).store(state, Ordering::SeqCst);
        if let (Some(w), true) = (self.written, durability != Durability::Buffered) {
            slot(w, t, c, k).store(state, Ordering::SeqCst);
        }
        if let (Some(s), Durability::Synced) = (self.synced, durability) {
            slot(s, t, c, k).store(state, Ordering::SeqCst);
        }
    }
}

/// One writer's ops on its own keys: puts of one key or of a whole context as a batch, deletes,
/// pins and unpins; `ops` of them, or until `stop`.
fn write(store: &Store, floors: &Floors<'_>, t: u32, versions: &mut [u64], seed: u64, ops: u32, stop: &AtomicBool) {
    let mut rng = Rng::new(seed);
    for _ in 0..ops {
        if stop.load(Ordering::Relaxed) {
            return;
        }
        let c = rng.below(u64::from(CONTEXTS)) as u32;
        let k = rng.below(u64::from(PER_CONTEXT)) as u32;
        let durability = [Durability::Buffered, Durability::Written, Durability::Synced][rng.below(3) as usize];
        let opts = PutOptions { durability, group: Some(group(t, c)), ..PutOptions::default() };
        match rng.below(20) {
            0..=1 => {
                store.delete("default", &key(t, c, k), durability).unwrap();
                floors.record(t, c, k, versions[(c * PER_CONTEXT + k) as usize] | DELETED, durability);
            }
            2 => {
                store.pin("default", &key(t, c, k)).unwrap();
            }
            3 => {
                store.unpin("default", &key(t, c, k)).unwrap();
            }
            4..=9 => {
                let blocks: Vec<(String, Vec<u8>, u64)> = (0..PER_CONTEXT)
                    .map(|k| {
                        let v = &mut versions[(c * PER_CONTEXT + k) as usize];
                        *v += 1;
                        (key(t, c, k), value(t, c, k, *v), *v)
                    })
                    .collect();
                let items: Vec<(&str, &[u8])> = blocks.iter().map(|(k, b, _)| (k.as_str(), b.as_slice())).collect();
                store.put_batch("default", &items, &opts).unwrap();
                for (k, (_, _, v)) in blocks.iter().enumerate() {
                    floors.record(t, c, k as u32, *v, durability);
                }
            }
            _ => {
                let v = &mut versions[(c * PER_CONTEXT + k) as usize];
                *v += 1;
                store.put("default", &key(t, c, k), &value(t, c, k, *v), &opts).unwrap();
                floors.record(t, c, k, *v, durability);
            }
        }
    }
}

/// A random key of any writer.
fn pick(rng: &mut Rng) -> (u32, u32, u32) {
    let t = rng.below(u64::from(WRITERS)) as u32;
    let c = rng.below(u64::from(CONTEXTS)) as u32;
    (t, c, rng.below(u64::from(PER_CONTEXT)) as u32)
}

fn read_one(store: &Store, acked: &Acked, rng: &mut Rng) {
    let (t, c, k) = pick(rng);
    let floor = slot(acked, t, c, k).load(Ordering::SeqCst);
    if let Some(b) = store.get("default", &key(t, c, k), ReadOptions { verify_hash: true }).unwrap() {
        assert_new_enough(&key(t, c, k), floor, check(t, c, k, &b));
    }
}

/// Keys in one `get_batch_into` of the batch reader.
const BATCH: usize = 8;

fn read_a_batch(store: &Store, acked: &Acked, rng: &mut Rng, bufs: &mut [AlignedBuf]) {
    let picks: Vec<(u32, u32, u32)> = (0..bufs.len()).map(|_| pick(rng)).collect();
    let floors: Vec<u64> = picks.iter().map(|&(t, c, k)| slot(acked, t, c, k).load(Ordering::SeqCst)).collect();
    let keys: Vec<String> = picks.iter().map(|&(t, c, k)| key(t, c, k)).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = store.get_batch_into("default", &names, &mut outs, ReadOptions::default()).unwrap();
    for (((&(t, c, k), floor), found), out) in picks.iter().zip(floors).zip(got).zip(&outs) {
        if let Some((meta, n)) = found {
            assert_eq!(meta.raw_len, n as u64, "{}", key(t, c, k));
            assert_new_enough(&key(t, c, k), floor, check(t, c, k, &out[..n]));
        }
    }
}

/// Every key holds its last acknowledged version or nothing; a deleted key holds nothing.
fn verify(store: &Store, acked: &Acked, round: u32) {
    let mut present = 0;
    for t in 0..WRITERS {
        for c in 0..CONTEXTS {
            for k in 0..PER_CONTEXT {
                let want = slot(acked, t, c, k).load(Ordering::SeqCst);
                let got = store.get("default", &key(t, c, k), ReadOptions { verify_hash: true }).unwrap();
                let Some(b) = got else { continue };
                present += 1;
                let v = check(t, c, k, &b);
                assert!(want & DELETED == 0, "round {round}: {} was deleted but reads version {v}", key(t, c, k));
                assert_eq!(v, want, "round {round}: {}", key(t, c, k));
            }
        }
    }
    assert!(present > 0, "round {round}: nothing is left to check");
}

#[test]
fn threads_on_a_full_planned_volume_on_io_uring_agree_with_the_model() {
    run(IoBackend::IoUring, 0);
}

#[test]
fn threads_on_a_full_planned_volume_with_a_dram_tier_agree_with_the_model() {
    run(IoBackend::IoUring, 2 << 20);
}

#[test]
fn threads_on_a_full_planned_volume_on_pread_agree_with_the_model() {
    run(IoBackend::Pread, 0);
}

/// The in-memory device crashed at a random moment while four writers fill a planned volume
/// whose cleaner is at work (the planner dropping contexts, the cleaner relocating and freeing
/// segments, checkpoints written as it frees them): the image opens, fsck finds no error, and
/// every key reads as a miss or an intact value no older than its last acknowledged durable
/// state (every acknowledged state, in a crash that keeps all written bytes); a key whose
/// delete was acknowledged as durable does not come back unless a later put does.
#[test]
fn a_crash_of_a_full_planned_volume_under_concurrent_writers_keeps_every_rule() {
    let iterations = std::env::var("KVHOARD_CRASH_ITERATIONS").ok().and_then(|v| v.parse().ok()).unwrap_or(12u64);
    let seed = std::env::var("KVHOARD_CRASH_SEED").ok().and_then(|v| v.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("seed {seed} (set KVHOARD_CRASH_SEED={seed} to replay)");
    let mut rng = Rng::new(seed);
    let keys = (CONTEXTS * PER_CONTEXT) as usize;
    let fresh = || -> Acked { (0..WRITERS).map(|_| (0..keys).map(|_| AtomicU64::new(DELETED)).collect()).collect() };
    let mut cleaned = 0;
    for iteration in 0..iterations {
        let planner = planner();
        let writer = WriterConfig { in_flight_bytes: 1 << 20, request_bytes: 256 << 10 };
        let opts = StoreOptions { writer, placement: planner.clone(), ..StoreOptions::default() };
        let dev = Arc::new(kvhoard_engine::device::MemDevice::new(SEG * (SEGMENTS / 2 + 3)));
        let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
        let store = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
        planner.set_budget(store.stats().capacity_bytes * 6 / 10);
        let (acked, written, synced) = (fresh(), fresh(), fresh());
        let stop = AtomicBool::new(false);
        let (mode, floors) = std::thread::scope(|s| {
            for t in 0..WRITERS {
                let (store, stop) = (&store, &stop);
                let floors = Floors { acked: &acked, written: Some(&written), synced: Some(&synced) };
                let seed = rng.next_u64();
                s.spawn(move || write(store, &floors, t, &mut vec![0; keys], seed, u32::MAX, stop));
            }
            std::thread::sleep(std::time::Duration::from_millis(300 + rng.below(900)));
            // What was acknowledged before the crash: read first, so each is in the image.
            let copy = |a: &Acked| -> Vec<Vec<u64>> {
                a.iter().map(|w| w.iter().map(|s| s.load(Ordering::SeqCst)).collect()).collect()
            };
            let mode = match rng.below(3) {
                0 => CrashMode::DropAll,
                1 => CrashMode::KeepAll,
                _ => CrashMode::Random(rng.next_u64()),
            };
            let floors = copy(if mode == CrashMode::KeepAll { &written } else { &synced });
            let image = dev.crash(mode);
            stop.store(true, Ordering::SeqCst);
            ((mode, image), floors)
        });
        let (mode, image) = mode;
        cleaned += store.stats().segments_cleaned;
        store.close().unwrap();
        let image = Arc::new(image);
        let report = check_device(image.as_ref(), ScanOptions::default()).unwrap();
        assert_eq!(report.count(Severity::Error), 0, "iteration {iteration} ({mode:?}): {:#?}", report.problems);
        let reopened = Store::open_on(image, opts).unwrap_or_else(|e| panic!("iteration {iteration} ({mode:?}): {e}"));
        for t in 0..WRITERS {
            for c in 0..CONTEXTS {
                for k in 0..PER_CONTEXT {
                    let got = reopened.get("default", &key(t, c, k), ReadOptions { verify_hash: true }).unwrap();
                    if let Some(b) = got {
                        let floor = floors[t as usize][(c * PER_CONTEXT + k) as usize];
                        let name = format!("iteration {iteration} ({mode:?}): {}", key(t, c, k));
                        assert_new_enough(&name, floor, check(t, c, k, &b));
                    }
                }
            }
        }
        assert_eq!(reopened.stats().read_errors, 0, "iteration {iteration}");
        reopened
            .put("default", "after", b"x", &PutOptions { durability: Durability::Synced, ..PutOptions::default() })
            .unwrap();
    }
    assert!(cleaned > 0, "no crash came after the cleaner had emptied a segment");
}
