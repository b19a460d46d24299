//! Many threads putting, deleting, pinning and getting at once on a volume far smaller than what
//! they write, placed by the planner with its background cleaner at work, against a reference
//! model: the planner drops contexts while writers put into them, cleaning relocates and
//! recompresses (losslessly) blocks that readers are reading and writers are replacing, and
//! reclaim empties whole segments. A key may read as a miss at any time (the volume cannot hold
//! everything), but a block found is always a whole value of its key, never a version older than
//! the one acknowledged before the read, and never one a delete acknowledged before the read
//! removed. The volume is reopened between rounds and checked again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use kvhoard_engine::check::{check_device, ScanOptions, Severity};
use kvhoard_engine::device::{CrashMode, FaultKind, MemDevice};
use kvhoard_engine::placement::load_model::LoadModel;
use kvhoard_engine::placement::planner::{DramChoice, PlannerConfig, StoreOption};
use kvhoard_engine::placement::{Planned, PlannedConfig};
use kvhoard_engine::{
    AlignedBuf, Clock, CodecSpec, CreateOptions, Durability, IoBackend, PutOptions, ReadOptions, Result, Store,
    StoreOptions, WriterConfig,
};
use kvhoard_tests::{block, Rng};

const WRITERS: u32 = 4;
const READERS: u32 = 2;
/// Contexts per writer, and keys per context.
const CONTEXTS: u32 = 12;
const PER_CONTEXT: u32 = 6;
const KEYS: u32 = CONTEXTS * PER_CONTEXT;
const OPS: u32 = 260;
const ROUNDS: u32 = 3;
const SEG: u64 = 1 << 20;
const SEGMENTS: u64 = 24;
/// Set in an acknowledged state: the key was deleted after the version in the low bits.
const DELETED: u64 = 1 << 63;

/// A writer's key `i` (of `KEYS`): key `i % PER_CONTEXT` of context `i / PER_CONTEXT`.
fn key(t: u32, i: u32) -> String {
    format!("w{t}/c{}/k{}", i / PER_CONTEXT, i % PER_CONTEXT)
}

/// The group a writer's key is put under: its context's, the planner's unit of decision.
fn group(t: u32, i: u32) -> u64 {
    (u64::from(t) << 32) | u64::from(i / PER_CONTEXT)
}

/// What a value is made from: the writer's key it was first put under, and that key's version
/// then. A copy or a rename gives another key the same value (the store links it).
type Origin = (u32, u64);

/// A value naming its writer and origin, the rest derived from them. Half are made of few
/// distinct bytes, so that a lossless codec shrinks them.
fn value(t: u32, (i, version): Origin) -> Vec<u8> {
    let seed = (u64::from(t) << 56) ^ (u64::from(i) << 40) ^ version;
    let spread = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 20;
    let len = 4096 + (spread % (120 << 10)) as usize;
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&t.to_le_bytes());
    v.extend_from_slice(&i.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    let body = block(seed, len - v.len());
    if spread.is_multiple_of(2) {
        v.extend(body.iter().map(|b| b & 0x3));
    } else {
        v.extend_from_slice(&body);
    }
    v
}

/// What the writers did and had acknowledged, per writer and key: the state after the last op
/// acknowledged (a version, or `DELETED` with the version deleted), after the last one
/// acknowledged as written (or synced), and as synced; and what each version of the key holds.
struct Model {
    acked: Vec<Vec<AtomicU64>>,
    written: Vec<Vec<AtomicU64>>,
    synced: Vec<Vec<AtomicU64>>,
    /// `history[t][i][v]`: the origin of version `v` of key `i` (an origin appears at most once
    /// in a key's history, so a value read names its version; version 0 is no value).
    history: Vec<Vec<Mutex<Vec<Origin>>>>,
    /// Renames that found their source.
    renamed: AtomicU64,
}

impl Model {
    fn new() -> Model {
        let states = || (0..WRITERS).map(|_| (0..KEYS).map(|_| AtomicU64::new(DELETED)).collect()).collect();
        let history = (0..WRITERS).map(|_| (0..KEYS).map(|_| Mutex::new(vec![(u32::MAX, 0)])).collect()).collect();
        Model { acked: states(), written: states(), synced: states(), history, renamed: AtomicU64::new(0) }
    }

    fn history(&self, t: u32, i: u32) -> std::sync::MutexGuard<'_, Vec<Origin>> {
        self.history[t as usize][i as usize].lock().unwrap()
    }

    /// Records an op on key `i` acknowledged with `durability`, leaving it in `state`.
    fn ack(&self, t: u32, i: u32, state: u64, durability: Durability) {
        let at = |states: &Vec<Vec<AtomicU64>>| states[t as usize][i as usize].store(state, Ordering::SeqCst);
        at(&self.acked);
        if durability != Durability::Buffered {
            at(&self.written);
        }
        if durability == Durability::Synced {
            at(&self.synced);
        }
    }

    fn acked(&self, t: u32, i: u32) -> u64 {
        self.acked[t as usize][i as usize].load(Ordering::SeqCst)
    }

    /// The version of key `i` that `bytes` are, after checking that every byte is what that
    /// version holds.
    fn version_of(&self, t: u32, i: u32, bytes: &[u8]) -> u64 {
        let name = key(t, i);
        assert!(bytes.len() >= 16, "{name}: a block of {} bytes is too short to be a value", bytes.len());
        let word = |r: std::ops::Range<usize>| bytes[r].to_vec();
        assert_eq!(word(0..4), t.to_le_bytes(), "{name}: another writer's block");
        let origin =
            (u32::from_le_bytes(word(4..8).try_into().unwrap()), u64::from_le_bytes(word(8..16).try_into().unwrap()));
        assert!(bytes == value(t, origin).as_slice(), "{name}: the value of {origin:?} has wrong bytes");
        let version = self.history(t, i).iter().rposition(|o| *o == origin);
        version.unwrap_or_else(|| panic!("{name}: holds the value of {origin:?}, which was never put under it")) as u64
    }
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

fn run(io_backend: IoBackend, dram_tier_bytes: u64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let writer = WriterConfig { in_flight_bytes: 1 << 20, request_bytes: 256 << 10, split_bytes: 256 << 10 };
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
    let model = Model::new();
    let mut writers: Vec<Writer> = (0..WRITERS).map(Writer::new).collect();
    // Over the rounds: bytes put, keys the planner dropped, segments cleaned, links put.
    let mut totals = (0u64, 0u64, 0u64, 0u64);
    for round in 0..ROUNDS {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut threads = Vec::new();
            for w in writers.iter_mut() {
                let (store, model, done) = (&store, &model, &done);
                let seed = u64::from(round * 100 + w.t);
                threads.push(s.spawn(move || w.run(store, model, seed, OPS, done).unwrap()));
            }
            for r in 0..READERS {
                let (store, model, done) = (&store, &model, &done);
                s.spawn(move || {
                    let mut rng = Rng::new(u64::from(1000 + round * 10 + r));
                    let mut bufs: Vec<AlignedBuf> = (0..BATCH).map(|_| AlignedBuf::zeroed(128 << 10)).collect();
                    while !done.load(Ordering::SeqCst) {
                        if r == 1 {
                            read_a_batch(store, model, &mut rng, &mut bufs);
                        } else {
                            read_one(store, model, &mut rng);
                        }
                    }
                });
            }
            for w in threads {
                if let Err(panic) = w.join() {
                    done.store(true, Ordering::SeqCst);
                    std::panic::resume_unwind(panic);
                }
            }
            done.store(true, Ordering::SeqCst);
        });
        verify(&store, &model, round);
        let stats = store.stats();
        assert_eq!(stats.read_errors, 0, "round {round}: {stats:?}");
        totals.0 += stats.put_bytes;
        totals.1 += stats.planner_dropped_keys;
        totals.2 += stats.segments_cleaned;
        totals.3 += stats.dedup_hits;
        store.close().unwrap();
        drop(store);
        store = Store::open(dir.path(), opts.clone()).unwrap();
        verify(&store, &model, round);
        planner.set_budget(store.stats().capacity_bytes * 6 / 10);
    }
    // The regime this test is for: the volume filled many times over, the planner dropped
    // contexts, the cleaner emptied segments, puts and renames linked to stored bytes.
    let (put_bytes, dropped, cleaned, links) = totals;
    assert!(put_bytes > 3 * SEG * SEGMENTS, "{put_bytes} bytes put: too few to fill the volume");
    assert!(dropped > 0, "the planner dropped no key");
    assert!(cleaned > 0, "the cleaner emptied no segment");
    assert!(links > 0, "no put was stored as a link");
    assert!(model.renamed.load(Ordering::Relaxed) > 0, "no rename found its source");
    store.close().unwrap();
}

/// One writer, alone on its keys: what it knows of each.
struct Writer {
    t: u32,
    /// Per key: its latest version (0: none yet), and whether the writer deleted it since.
    versions: Vec<u64>,
    deleted: Vec<bool>,
}

impl Writer {
    fn new(t: u32) -> Writer {
        Writer { t, versions: vec![0; KEYS as usize], deleted: vec![true; KEYS as usize] }
    }

    /// The origin key `i` holds now, unless it was deleted (or never put).
    fn holds(&self, model: &Model, i: u32) -> Option<Origin> {
        let i = i as usize;
        (!self.deleted[i]).then(|| model.history(self.t, i as u32)[self.versions[i] as usize])
    }

    /// Makes the next version of key `i` hold `origin` (its own new value when `None`); `None`
    /// when key `i` held `origin` once already (a value read would not tell which version).
    fn next(&mut self, model: &Model, i: u32, origin: Option<Origin>) -> Option<(u64, Vec<u8>)> {
        let mut history = model.history(self.t, i);
        let version = history.len() as u64;
        let origin = origin.unwrap_or((i, version));
        if history.contains(&origin) {
            return None;
        }
        history.push(origin);
        self.versions[i as usize] = version;
        self.deleted[i as usize] = false;
        Some((version, value(self.t, origin)))
    }

    /// `ops` ops on the writer's own keys, or until `stop`: puts of one key or of a whole
    /// context as a batch (some with a TTL of seconds), copies of another key's value (the
    /// store links them), renames, deletes, pins and unpins. Stops at the first op that fails (a version it was writing
    /// may be there or not).
    fn run(&mut self, store: &Store, model: &Model, seed: u64, ops: u32, stop: &AtomicBool) -> Result<()> {
        let t = self.t;
        let mut rng = Rng::new(seed);
        for _ in 0..ops {
            if stop.load(Ordering::Relaxed) {
                return Ok(());
            }
            let i = rng.below(u64::from(KEYS)) as u32;
            let other = rng.below(u64::from(KEYS)) as u32;
            let durability = [Durability::Buffered, Durability::Written, Durability::Synced][rng.below(3) as usize];
            // A quarter of the puts expire within seconds.
            let ttl_secs = (rng.below(4) == 0).then(|| 1 + rng.below(3) as u32);
            let opts = PutOptions { durability, ttl_secs, group: Some(group(t, i)), ..PutOptions::default() };
            let put = |w: &mut Writer, i: u32, origin: Option<Origin>| -> Result<()> {
                let Some((version, bytes)) = w.next(model, i, origin) else { return Ok(()) };
                store.put("default", &key(t, i), &bytes, &opts)?;
                model.ack(t, i, version, durability);
                Ok(())
            };
            match rng.below(20) {
                0..=1 => {
                    store.delete("default", &key(t, i), durability)?;
                    self.deleted[i as usize] = true;
                    model.ack(t, i, self.versions[i as usize] | DELETED, durability);
                }
                2 => {
                    store.pin("default", &key(t, i))?;
                }
                3 => {
                    store.unpin("default", &key(t, i))?;
                }
                4..=8 => {
                    let first = i - i % PER_CONTEXT;
                    let blocks: Vec<(u32, u64, Vec<u8>)> = (first..first + PER_CONTEXT)
                        .filter_map(|i| self.next(model, i, None).map(|(v, bytes)| (i, v, bytes)))
                        .collect();
                    let names: Vec<String> = blocks.iter().map(|(i, _, _)| key(t, *i)).collect();
                    let items: Vec<(&str, &[u8])> =
                        names.iter().zip(&blocks).map(|(k, (_, _, b))| (k.as_str(), b.as_slice())).collect();
                    store.put_batch("default", &items, &opts)?;
                    for (i, v, _) in &blocks {
                        model.ack(t, *i, *v, durability);
                    }
                }
                9..=11 => match self.holds(model, other) {
                    Some(origin) if other != i => put(self, i, Some(origin))?,
                    _ => put(self, i, None)?,
                },
                12..=13 => {
                    let Some(origin) = self.holds(model, other).filter(|_| other != i) else { continue };
                    let before = (self.versions[i as usize], self.deleted[i as usize]);
                    let Some((version, _)) = self.next(model, i, Some(origin)) else { continue };
                    if store.rename("default", &key(t, other), &key(t, i), durability)? {
                        model.ack(t, i, version, durability);
                        model.renamed.fetch_add(1, Ordering::Relaxed);
                        self.deleted[other as usize] = true;
                        model.ack(t, other, self.versions[other as usize] | DELETED, durability);
                    } else {
                        // The planner dropped `other`: nothing was renamed, and no reader can
                        // have seen the version it would have made.
                        model.history(t, i).pop();
                        (self.versions[i as usize], self.deleted[i as usize]) = before;
                    }
                }
                _ => put(self, i, None)?,
            }
        }
        Ok(())
    }
}

/// A random key of any writer.
fn pick(rng: &mut Rng) -> (u32, u32) {
    (rng.below(u64::from(WRITERS)) as u32, rng.below(u64::from(KEYS)) as u32)
}

fn read_one(store: &Store, model: &Model, rng: &mut Rng) {
    let (t, i) = pick(rng);
    let floor = model.acked(t, i);
    if let Some(b) = store.get("default", &key(t, i), ReadOptions { verify_hash: true }).unwrap() {
        assert_new_enough(&key(t, i), floor, model.version_of(t, i, &b));
    }
}

/// Keys in one `get_batch_into` of the batch reader.
const BATCH: usize = 8;

fn read_a_batch(store: &Store, model: &Model, rng: &mut Rng, bufs: &mut [AlignedBuf]) {
    let picks: Vec<(u32, u32)> = (0..bufs.len()).map(|_| pick(rng)).collect();
    let floors: Vec<u64> = picks.iter().map(|&(t, i)| model.acked(t, i)).collect();
    let keys: Vec<String> = picks.iter().map(|&(t, i)| key(t, i)).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = store.get_batch_into("default", &names, &mut outs, ReadOptions::default()).unwrap();
    for (((&(t, i), floor), found), out) in picks.iter().zip(floors).zip(got).zip(&outs) {
        if let Some((meta, n)) = found {
            assert_eq!(meta.raw_len, n as u64, "{}", key(t, i));
            assert_new_enough(&key(t, i), floor, model.version_of(t, i, &out[..n]));
        }
    }
}

/// Every key holds its last acknowledged version or nothing; a deleted key holds nothing.
fn verify(store: &Store, model: &Model, round: u32) {
    let mut present = 0;
    for t in 0..WRITERS {
        for i in 0..KEYS {
            let want = model.acked(t, i);
            let Some(b) = store.get("default", &key(t, i), ReadOptions { verify_hash: true }).unwrap() else {
                continue;
            };
            present += 1;
            let v = model.version_of(t, i, &b);
            assert!(want & DELETED == 0, "round {round}: {} was deleted but reads version {v}", key(t, i));
            assert_eq!(v, want, "round {round}: {}", key(t, i));
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
/// segments, checkpoints written as it frees them), in half the runs after a write failed
/// (the store refuses writes from then on; the writers stop): the image opens, fsck finds no
/// error, and
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
    let (mut cleaned, failed) = (0, AtomicU64::new(0));
    for iteration in 0..iterations {
        let planner = planner();
        let writer = WriterConfig { in_flight_bytes: 1 << 20, request_bytes: 256 << 10, split_bytes: 256 << 10 };
        let opts = StoreOptions { writer, placement: planner.clone(), ..StoreOptions::default() };
        let dev = Arc::new(MemDevice::new(SEG * (SEGMENTS / 2 + 3)));
        let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
        let store = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
        planner.set_budget(store.stats().capacity_bytes * 6 / 10);
        let fault = rng.below(2) == 0;
        if fault {
            dev.fail_nth(FaultKind::Write, 200 + rng.below(3000));
        }
        let model = Model::new();
        let stop = AtomicBool::new(false);
        let (mode, image, floors) = std::thread::scope(|s| {
            for t in 0..WRITERS {
                let (store, model, stop, failed) = (&store, &model, &stop, &failed);
                let seed = rng.next_u64();
                s.spawn(move || {
                    let ran = Writer::new(t).run(store, model, seed, u32::MAX, stop);
                    assert!(fault || ran.is_ok(), "{ran:?}");
                    failed.fetch_add(u64::from(ran.is_err()), Ordering::Relaxed);
                });
            }
            std::thread::sleep(std::time::Duration::from_millis(300 + rng.below(900)));
            let mode = match rng.below(3) {
                0 => CrashMode::DropAll,
                1 => CrashMode::KeepAll,
                _ => CrashMode::Random(rng.next_u64()),
            };
            // What was acknowledged before the crash, read first so that all of it is in the
            // image: what was written, in a crash that keeps every write; else what was synced.
            let states = if mode == CrashMode::KeepAll { &model.written } else { &model.synced };
            let floors: Vec<Vec<u64>> =
                states.iter().map(|w| w.iter().map(|s| s.load(Ordering::SeqCst)).collect()).collect();
            let image = dev.crash(mode);
            stop.store(true, Ordering::SeqCst);
            (mode, image, floors)
        });
        cleaned += store.stats().segments_cleaned;
        let closed = store.close();
        assert!(fault || closed.is_ok(), "{closed:?}");
        let image = Arc::new(image);
        let report = check_device(image.as_ref(), ScanOptions::default()).unwrap();
        assert_eq!(
            report.count(Severity::Error),
            0,
            "iteration {iteration} ({mode:?}, fault {fault}): {:#?}",
            report.problems
        );
        let reopened = Store::open_on(image, opts)
            .unwrap_or_else(|e| panic!("iteration {iteration} ({mode:?}, fault {fault}): {e}"));
        for t in 0..WRITERS {
            for i in 0..KEYS {
                let Some(b) = reopened.get("default", &key(t, i), ReadOptions { verify_hash: true }).unwrap() else {
                    continue;
                };
                let name = format!(
                    "iteration {iteration} ({mode:?}, fault {fault}): {} (its history {:?}; acked {:x}, written {:x})",
                    key(t, i),
                    model.history(t, i),
                    model.acked(t, i),
                    model.written[t as usize][i as usize].load(Ordering::SeqCst)
                );
                assert_new_enough(&name, floors[t as usize][i as usize], model.version_of(t, i, &b));
            }
        }
        assert_eq!(reopened.stats().read_errors, 0, "iteration {iteration}");
        let synced = PutOptions { durability: Durability::Synced, ..PutOptions::default() };
        reopened.put("default", "after", b"x", &synced).unwrap();
    }
    assert!(cleaned > 0, "no crash came after the cleaner had emptied a segment");
    assert!(iterations < 8 || failed.into_inner() > 0, "no write failed");
}
