//! Crash tests: a real process killed with SIGKILL at a random moment, and the in-memory device
//! crashed while several threads write. Every acknowledged synced write must survive, byte for
//! byte, and after a kill every acknowledged written one too (a key written again holds its
//! last acknowledged value or the one under way); anything else may be there or not, but never
//! damaged; new writes must succeed.
//!
//! KVHOARD_CRASH_ITERATIONS sets the number of kills (default 50); KVHOARD_CRASH_SEED replays a
//! run (the seed is printed).

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvhoard_engine::check::{check_device, ScanOptions, Severity};
use kvhoard_engine::device::{CrashMode, MemDevice};
use kvhoard_engine::{CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreOptions, WriterConfig};
use kvhoard_tests::{block, crash_block_len, hot_block, Rng};

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

fn seed() -> u64 {
    let seed = env_u64(
        "KVHOARD_CRASH_SEED",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    );
    println!("seed {seed} (set KVHOARD_CRASH_SEED={seed} to replay)");
    seed
}

/// What the killed writers acknowledged, over all iterations.
#[derive(Default)]
struct Acked {
    present: BTreeSet<u64>,
    deleted: BTreeSet<u64>,
    /// Written or deleted without an acknowledgement: either state is fine, if intact.
    uncertain: BTreeSet<u64>,
    /// Per hot key, the block id of its last acknowledged write, and of one that may have been
    /// under way when the writer was killed.
    hot: BTreeMap<u64, (u64, Option<u64>)>,
    next_id: u64,
}

impl Acked {
    fn absorb(&mut self, lines: &[String]) {
        let mut last_put = None;
        let mut last_hot = None;
        for line in lines {
            match line.split_once(' ') {
                Some(("put", id)) => {
                    let id: u64 = id.parse().unwrap();
                    self.present.insert(id);
                    self.deleted.remove(&id);
                    self.uncertain.remove(&id);
                    last_put = Some(id);
                }
                Some(("hot", rest)) => {
                    let (hot, id) = rest.split_once(' ').unwrap();
                    let id: u64 = id.parse().unwrap();
                    self.hot.insert(hot.parse().unwrap(), (id, None));
                    last_hot = Some(id);
                }
                Some(("del", id)) => {
                    let id: u64 = id.parse().unwrap();
                    self.present.remove(&id);
                    self.uncertain.remove(&id);
                    self.deleted.insert(id);
                }
                _ => panic!("unexpected line from the writer: {line:?}"),
            }
        }
        let last = last_put.unwrap_or(self.next_id.saturating_sub(1));
        // The last block's hot write may have been under way.
        if last % 8 == 5 && last_hot != Some(last) && last_put.is_some() {
            let entry = self.hot.entry(last / 8 % 4).or_insert((u64::MAX, None));
            entry.1 = Some(last);
        }
        // The writer may have been writing the next block, or deleting the last one.
        self.uncertain.insert(last + 1);
        if let Some(&l) = self.present.get(&last) {
            if l % 7 == 3 {
                self.uncertain.insert(l - 1);
                self.deleted.remove(&(l - 1));
                self.present.remove(&(l - 1));
            }
        }
        self.next_id = last + 2;
    }

    fn check(&mut self, store: &Store) {
        let get = |id: u64| {
            store.get("default", &format!("k{id}"), ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
        };
        for &id in &self.present {
            let got = get(id).unwrap_or_else(|| panic!("acknowledged block k{id} is missing"));
            assert!(got == block(id, crash_block_len(id)), "acknowledged block k{id} came back different");
        }
        for &id in &self.deleted {
            assert!(get(id).is_none(), "deleted block k{id} came back");
        }
        for &id in &self.uncertain {
            if let Some(got) = get(id) {
                assert!(got == block(id, crash_block_len(id)), "unacknowledged block k{id} came back damaged");
            }
        }
        for (&hot, state) in &mut self.hot {
            let (acked, maybe) = *state;
            let got = store
                .get("default", &format!("hot{hot}"), ReadOptions { verify_hash: true })
                .unwrap()
                .map(|b| b.to_vec());
            let Some(got) = got else {
                assert!(acked == u64::MAX, "hot{hot}: its acknowledged value (block {acked}) was lost");
                continue;
            };
            // What is read is what the key holds from now on.
            let found = [acked].into_iter().chain(maybe).find(|&id| id != u64::MAX && got == hot_block(id));
            let found = found.unwrap_or_else(|| panic!("hot{hot}: neither its acknowledged value nor the next"));
            *state = (found, None);
        }
        assert_eq!(store.stats().read_errors, 0);
    }
}

fn run_and_kill(volume: &Path, first_id: u64, after: Duration, direct_io: bool) -> Vec<String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-writer"))
        .arg(volume)
        .arg(first_id.to_string())
        .arg("hot")
        .arg(if direct_io { "direct" } else { "buffered" })
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start the writer");
    let stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        // Only whole lines count: a line cut by the kill was not an acknowledgement.
        let mut lines = Vec::new();
        let mut r = BufReader::new(stdout);
        let mut line = String::new();
        while r.read_line(&mut line).unwrap_or(0) > 0 {
            if line.ends_with('\n') {
                lines.push(line.trim_end().to_string());
            }
            line.clear();
        }
        lines
    });
    std::thread::sleep(after);
    child.kill().expect("SIGKILL the writer");
    child.wait().unwrap();
    reader.join().unwrap()
}

#[test]
fn acknowledged_synced_writes_survive_sigkill() {
    survive_sigkill(true);
}

/// Through the page cache, a SIGKILL can stop a write partway (the copy into the page cache
/// stops at the next page), unlike a direct write, which the kernel completes.
#[test]
fn acknowledged_writes_survive_sigkill_with_buffered_io() {
    survive_sigkill(false);
}

fn survive_sigkill(direct_io: bool) {
    let iterations = env_u64("KVHOARD_CRASH_ITERATIONS", 50);
    let mut rng = Rng::new(seed());
    let dir = tempfile::tempdir().unwrap();
    let volume = dir.path().join("vol");
    let create = CreateOptions { capacity_bytes: Some(2 << 30), segment_size_bytes: 4 << 20 };
    let opts = StoreOptions { direct_io, ..StoreOptions::default() };
    Store::create(&volume, &create, opts.clone()).unwrap().close().unwrap();
    let mut acked = Acked::default();
    let (mut total_acks, mut hot_acks, mut fresh) = (0, 0, 0);
    for iteration in 0..iterations {
        let lines = run_and_kill(&volume, acked.next_id, Duration::from_millis(20 + rng.below(180)), direct_io);
        total_acks += lines.len();
        hot_acks += lines.iter().filter(|l| l.starts_with("hot ")).count();
        acked.absorb(&lines);
        let store =
            Store::open(&volume, opts.clone()).unwrap_or_else(|e| panic!("iteration {iteration}: reopen failed: {e}"));
        acked.check(&store);
        store
            .put(
                "default",
                &format!("after-{iteration}"),
                b"new write",
                &PutOptions { durability: Durability::Synced, ..PutOptions::default() },
            )
            .unwrap();
        let stats = store.stats();
        assert!(stats.evicted_keys == 0, "the volume filled up; the test needs a larger one");
        store.close().unwrap();
        // Before a writer could fill it (a full volume drops its oldest blocks, which would read
        // as lost here), start again on a fresh volume, with ids that go on.
        if stats.segments_free < stats.segments / 4 {
            std::fs::remove_dir_all(&volume).unwrap();
            Store::create(&volume, &create, opts.clone()).unwrap().close().unwrap();
            acked = Acked { next_id: acked.next_id, ..Acked::default() };
            fresh += 1;
        }
    }
    println!(
        "{iterations} kills, {total_acks} acknowledgements checked, {hot_acks} hot keys written again, {fresh} fresh volumes"
    );
    assert!(hot_acks > 0, "the writer never wrote a hot key");
    assert!(total_acks > 0, "the writer never acknowledged anything");
}

#[test]
fn acknowledged_writes_survive_a_device_crash_under_concurrent_writers() {
    crash_under_concurrent_writers(StoreOptions::default().checkpoint_every_segments);
}

/// With a checkpoint at every seal, the background checkpointer is syncing and writing
/// checkpoints at almost any instant the device crashes.
#[test]
fn a_crash_while_checkpoints_are_written_loses_no_acknowledged_write() {
    crash_under_concurrent_writers(1);
}

fn crash_under_concurrent_writers(checkpoint_every_segments: u32) {
    let iterations = env_u64("KVHOARD_CRASH_ITERATIONS", 50).min(1000);
    let mut rng = Rng::new(seed());
    // A log writer with little room in flight and small writes: four writers keep it full, so
    // puts wait for room and records are joined into writes and split across them.
    let writer = WriterConfig { in_flight_bytes: 256 << 10, request_bytes: 64 << 10, split_bytes: 64 << 10 };
    let opts = || StoreOptions { checkpoint_every_segments, writer, ..StoreOptions::default() };
    for iteration in 0..iterations {
        let dev = Arc::new(MemDevice::new(64 << 20));
        let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 2 << 20 };
        let store = Arc::new(Store::create_on(dev.clone(), &create, opts()).unwrap());
        let acks = Arc::new(Mutex::new(Vec::<(u64, bool)>::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let writers: Vec<_> = (0..4u64)
            .map(|t| {
                let (store, acks, stop) = (store.clone(), acks.clone(), stop.clone());
                std::thread::spawn(move || {
                    for i in 0..200u64 {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let id = t * 1_000_000 + i;
                        let synced = i % 2 == 0;
                        let durability = if synced { Durability::Synced } else { Durability::Written };
                        if store
                            .put(
                                "default",
                                &format!("k{id}"),
                                &block(id, crash_block_len(id)),
                                &PutOptions { durability, ..PutOptions::default() },
                            )
                            .is_err()
                        {
                            break;
                        }
                        acks.lock().unwrap().push((id, synced));
                    }
                })
            })
            .collect();
        std::thread::sleep(Duration::from_micros(rng.below(30_000)));
        let acked: Vec<(u64, bool)> = acks.lock().unwrap().clone();
        let mode = match rng.below(3) {
            0 => CrashMode::DropAll,
            1 => CrashMode::KeepAll,
            _ => CrashMode::Random(rng.next_u64()),
        };
        let image = Arc::new(dev.crash(mode));
        stop.store(true, Ordering::Relaxed);
        writers.into_iter().for_each(|w| w.join().unwrap());
        // fsck finds nothing worse than what a crash leaves (a stale checkpoint, unsealed
        // segments): no error.
        let report = check_device(image.as_ref(), ScanOptions::default()).unwrap();
        assert_eq!(report.count(Severity::Error), 0, "iteration {iteration} ({mode:?}): {:#?}", report.problems);
        let reopened = Store::open_on(image, opts()).unwrap_or_else(|e| panic!("iteration {iteration}: {e}"));
        let get = |id: u64| {
            reopened.get("default", &format!("k{id}"), ReadOptions { verify_hash: true }).unwrap().map(|b| b.to_vec())
        };
        for &(id, synced) in &acked {
            let must_survive = synced || mode == CrashMode::KeepAll;
            match get(id) {
                Some(b) => assert!(b == block(id, crash_block_len(id)), "iteration {iteration}: k{id} damaged"),
                None => assert!(!must_survive, "iteration {iteration} ({mode:?}): acknowledged k{id} lost"),
            }
        }
        for t in 0..3u64 {
            for i in 0..200u64 {
                let id = t * 1_000_000 + i;
                if let Some(b) = get(id) {
                    assert!(b == block(id, crash_block_len(id)), "iteration {iteration}: unacknowledged k{id} damaged");
                }
            }
        }
        assert_eq!(reopened.stats().read_errors, 0);
        reopened
            .put("default", "after", b"x", &PutOptions { durability: Durability::Synced, ..PutOptions::default() })
            .unwrap();
    }
}

/// A crash can keep a record of a segment use whose header it drops: the use leaves no trace,
/// and recovery drops the write. The next use of that segment must not get the same seq, or a
/// second crash, dropping that use's own writes, lets a scan take the old record for its own and
/// bring back the write the first recovery had dropped. (Found by the model test; these are its
/// operations and crash seeds.)
#[test]
fn a_write_dropped_by_one_crash_stays_dropped_after_the_next() {
    let opts = StoreOptions { checkpoint_every_segments: 2, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 1 << 20 };
    let dev = Arc::new(MemDevice::new(7 << 20));
    let mut store = Store::create_on(dev.clone(), &create, opts.clone()).unwrap();
    let put = |s: &Store, key: u8, (seed, len): (u8, usize), synced: bool| {
        let durability = if synced { Durability::Synced } else { Durability::Written };
        let opts = PutOptions { durability, ..PutOptions::default() };
        s.put("default", &format!("key-{key}"), &block(u64::from(seed), len), &opts).unwrap();
    };
    let get = |s: &Store, key: u8| s.get("default", &format!("key-{key}"), ReadOptions::default()).unwrap();
    let history = [
        (0, (0, 150_000), false),
        (0, (36, 188_095), true),
        (0, (149, 277_649), false),
        (10, (207, 204_850), true),
        (7, (159, 255_440), true),
        (5, (227, 205_296), false),
        (9, (153, 231_877), false),
        (10, (134, 168_836), false),
        (9, (27, 245_559), false),
        (10, (26, 179_524), true),
        (3, (235, 167_715), false),
        (6, (253, 295_027), true),
        (8, (213, 243_291), true),
        (2, (227, 284_234), false),
        (5, (175, 262_293), true),
        (4, (161, 200_173), false),
    ];
    for (key, value, synced) in history {
        put(&store, key, value, synced);
    }
    store.close().unwrap();
    store = Store::open_on(dev.clone(), opts.clone()).unwrap();
    // Fills the volume: the oldest segment is reclaimed and a new use of it takes this write.
    put(&store, 4, (193, 178_313), false);
    let first = Arc::new(dev.crash(CrashMode::Random(2_558_885_817_408_597_024)));
    drop(store);
    store = Store::open_on(first.clone(), opts.clone()).unwrap();
    let after_first = get(&store, 4).map(|b| b.to_vec());
    assert_eq!(after_first.as_deref(), Some(&block(161, 200_173)[..]), "the first crash dropped the write");
    put(&store, 10, (2, 240_321), false);
    let second = Arc::new(first.crash(CrashMode::Random(10_351_127_372_781_310_357)));
    drop(store);
    let store = Store::open_on(second, opts).unwrap();
    assert_eq!(get(&store, 4).map(|b| b.to_vec()), after_first, "a dropped write came back");
    assert_eq!(get(&store, 10).map(|b| b.to_vec()).as_deref(), Some(&block(26, 179_524)[..]));
}
