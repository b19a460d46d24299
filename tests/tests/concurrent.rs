//! Many threads putting, deleting and getting at once, against a reference model, with the
//! volume reopened between rounds; on the io_uring and the pread backends, with and without a
//! DRAM tier. Every value names its writer, key and version and is derived from them, so a
//! reader can tell a right block from a wrong or mixed one, and an old version from a new one.
//! One reader gets key by key, the other batches of keys straight into aligned buffers
//! (`get_batch_into`: a quarter of the values are large enough to be read directly).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use kvhoard_engine::{
    AlignedBuf, CreateOptions, Durability, IoBackend, PutOptions, ReadOptions, Store, StoreOptions, WriterConfig,
};
use kvhoard_tests::{block, Rng};

const WRITERS: u32 = 4;
const READERS: u32 = 2;
const KEYS: u32 = 24;
const OPS: u32 = 150;
const ROUNDS: u32 = 3;
const DELETED: u64 = u64::MAX;

fn key(t: u32, k: u32) -> String {
    format!("w{t}/k{k}")
}

fn value(t: u32, k: u32, version: u64) -> Vec<u8> {
    let seed = (u64::from(t) << 48) ^ (u64::from(k) << 32) ^ version;
    let spread = seed.wrapping_mul(0x9E37_79B9);
    // A quarter above the size `get_into` reads straight into an aligned buffer.
    let len = if spread.is_multiple_of(4) {
        (128 << 10) + (spread % 100_000) as usize
    } else {
        16 + (spread % 40_000) as usize
    };
    let mut v = Vec::with_capacity(len);
    v.extend_from_slice(&t.to_le_bytes());
    v.extend_from_slice(&k.to_le_bytes());
    v.extend_from_slice(&version.to_le_bytes());
    v.extend_from_slice(&block(seed, len - 16));
    v
}

/// The version a value says it is, after checking that every byte is what that version holds.
fn check(t: u32, k: u32, bytes: &[u8]) -> u64 {
    assert!(bytes.len() >= 16, "{}: a block of {} bytes is too short to be a value", key(t, k), bytes.len());
    let word = |r: std::ops::Range<usize>| bytes.get(r).map(|b| b.to_vec()).unwrap_or_default();
    let version = u64::from_le_bytes(word(8..16).try_into().unwrap());
    assert_eq!(word(0..8), [t.to_le_bytes(), k.to_le_bytes()].concat(), "{}: another key's block", key(t, k));
    assert!(bytes == value(t, k, version).as_slice(), "{}: version {version} has wrong bytes", key(t, k));
    version
}

fn run(io_backend: IoBackend, dram_tier_bytes: u64) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    // A log writer with little room: the writers wait for it, and records are joined and split.
    let writer = WriterConfig { in_flight_bytes: 512 << 10, request_bytes: 128 << 10, split_bytes: 128 << 10 };
    let opts = StoreOptions { io_backend, dram_tier_bytes, writer, ..StoreOptions::default() };
    let create = CreateOptions { capacity_bytes: Some(256 << 20), segment_size_bytes: 4 << 20 };
    let mut store = Store::create(dir.path(), &create, opts.clone()).unwrap();
    // acked[t][k]: the last version whose put (or delete) returned, DELETED after a delete.
    let acked: Vec<Vec<AtomicU64>> =
        (0..WRITERS).map(|_| (0..KEYS).map(|_| AtomicU64::new(DELETED)).collect()).collect();
    let mut next_version = vec![vec![0u64; KEYS as usize]; WRITERS as usize];
    for round in 0..ROUNDS {
        let done = AtomicBool::new(false);
        std::thread::scope(|s| {
            let mut writers = Vec::new();
            for (t, versions) in next_version.iter_mut().enumerate() {
                let (store, acked) = (&store, &acked);
                let t = t as u32;
                writers.push(s.spawn(move || {
                    let mut rng = Rng::new(u64::from(round * 100 + t));
                    for _ in 0..OPS {
                        let k = rng.below(u64::from(KEYS)) as u32;
                        let slot = &acked[t as usize][k as usize];
                        let durability =
                            [Durability::Buffered, Durability::Written, Durability::Synced][rng.below(3) as usize];
                        if rng.below(10) == 0 {
                            store.delete("default", &key(t, k), durability).unwrap();
                            slot.store(DELETED, Ordering::SeqCst);
                        } else {
                            let v = &mut versions[k as usize];
                            *v += 1;
                            let opts = PutOptions { durability, ..PutOptions::default() };
                            store.put("default", &key(t, k), &value(t, k, *v), &opts).unwrap();
                            slot.store(*v, Ordering::SeqCst);
                        }
                    }
                }));
            }
            for r in 0..READERS {
                let (store, acked, done) = (&store, &acked, &done);
                s.spawn(move || {
                    let mut rng = Rng::new(u64::from(1000 + round * 10 + r));
                    let mut bufs: Vec<AlignedBuf> = (0..BATCH).map(|_| AlignedBuf::zeroed(256 << 10)).collect();
                    while !done.load(Ordering::SeqCst) {
                        if r == 1 {
                            read_a_batch(store, acked, &mut rng, &mut bufs);
                            continue;
                        }
                        let (t, k) = (rng.below(u64::from(WRITERS)) as u32, rng.below(u64::from(KEYS)) as u32);
                        let floor = acked[t as usize][k as usize].load(Ordering::SeqCst);
                        // A miss is allowed: only a delete (acknowledged or in flight) makes one.
                        if let Some(b) = store.get("default", &key(t, k), ReadOptions::default()).unwrap() {
                            let v = check(t, k, &b);
                            assert!(
                                floor == DELETED || v >= floor,
                                "{}: read version {v} after {floor} was acknowledged",
                                key(t, k)
                            );
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
        if dram_tier_bytes == 0 {
            // (With a DRAM tier no read goes straight into a caller's buffer.)
            assert!(store.stats().direct_reads > 0, "round {round}: the batch reader read nothing directly");
        }
        verify(&store, &acked, round);
        store.close().unwrap();
        drop(store);
        store = Store::open(dir.path(), opts.clone()).unwrap();
        verify(&store, &acked, round);
        assert_eq!(store.stats().evicted_keys, 0, "the volume is large enough never to evict");
    }
}

/// Keys in one `get_batch_into` of the batch reader.
const BATCH: usize = 6;

/// One `get_batch_into` of random keys (a key may repeat): each block found is a whole value of
/// its key, never older than what was acknowledged before the call.
fn read_a_batch(store: &Store, acked: &[Vec<AtomicU64>], rng: &mut Rng, bufs: &mut [AlignedBuf]) {
    let picks: Vec<(u32, u32)> =
        (0..bufs.len()).map(|_| (rng.below(u64::from(WRITERS)) as u32, rng.below(u64::from(KEYS)) as u32)).collect();
    let floors: Vec<u64> = picks.iter().map(|&(t, k)| acked[t as usize][k as usize].load(Ordering::SeqCst)).collect();
    let keys: Vec<String> = picks.iter().map(|&(t, k)| key(t, k)).collect();
    let names: Vec<&str> = keys.iter().map(String::as_str).collect();
    let mut outs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
    let got = store.get_batch_into("default", &names, &mut outs, ReadOptions::default()).unwrap();
    for (((&(t, k), floor), found), out) in picks.iter().zip(floors).zip(got).zip(&outs) {
        if let Some((meta, n)) = found {
            assert_eq!(meta.raw_len, n as u64, "{}", key(t, k));
            let v = check(t, k, &out[..n]);
            assert!(
                floor == DELETED || v >= floor,
                "{}: batch read version {v} after {floor} was acknowledged",
                key(t, k)
            );
        }
    }
}

/// Every key holds exactly its last acknowledged version.
fn verify(store: &Store, acked: &[Vec<AtomicU64>], round: u32) {
    for t in 0..WRITERS {
        for k in 0..KEYS {
            let want = acked[t as usize][k as usize].load(Ordering::SeqCst);
            let got = store.get("default", &key(t, k), ReadOptions { verify_hash: true }).unwrap();
            match (want, got) {
                (DELETED, None) => {}
                (DELETED, Some(_)) => panic!("round {round}: {} was deleted but is back", key(t, k)),
                (v, Some(b)) => assert_eq!(check(t, k, &b), v, "round {round}: {}", key(t, k)),
                (v, None) => panic!("round {round}: {} version {v} is missing", key(t, k)),
            }
        }
    }
    assert_eq!(store.stats().read_errors, 0);
}

#[test]
fn threads_on_io_uring_agree_with_the_model() {
    run(IoBackend::IoUring, 0);
}

#[test]
fn threads_on_io_uring_with_a_dram_tier_agree_with_the_model() {
    run(IoBackend::IoUring, 1 << 20);
}

#[test]
fn threads_on_pread_agree_with_the_model() {
    run(IoBackend::Pread, 0);
}

#[test]
fn threads_on_pread_with_a_dram_tier_agree_with_the_model() {
    run(IoBackend::Pread, 1 << 20);
}

/// Thousands of one-unit records handed over at once, each its own write (writes of one unit,
/// so none join): the log writer starts at most as many as its queue holds and queues the rest,
/// on io_uring and on pread. Every block is found, whole, in this run, through `get_batch`, and
/// after reopening.
#[test]
fn many_small_buffered_puts_are_all_written_whatever_the_queue_holds() {
    for io_backend in [IoBackend::IoUring, IoBackend::Pread] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let writer = WriterConfig { in_flight_bytes: 64 << 20, request_bytes: 4096, split_bytes: 4096 };
        let opts = StoreOptions { io_backend, writer, ..StoreOptions::default() };
        let create = CreateOptions { capacity_bytes: Some(128 << 20), segment_size_bytes: 8 << 20 };
        let store = Store::create(dir.path(), &create, opts.clone()).unwrap();
        let buffered = PutOptions { durability: Durability::Buffered, ..PutOptions::default() };
        std::thread::scope(|s| {
            for t in 0..4u64 {
                let store = &store;
                let buffered = &buffered;
                s.spawn(move || {
                    for i in 0..1500u64 {
                        store.put("default", &format!("{t}-{i}"), &block(t * 10_000 + i, 100), buffered).unwrap();
                    }
                });
            }
        });
        let check = |store: &Store, when: &str| {
            for t in 0..4u64 {
                let keys: Vec<String> = (0..1500u64).map(|i| format!("{t}-{i}")).collect();
                let names: Vec<&str> = keys.iter().map(String::as_str).collect();
                let got = store.get_batch("default", &names, ReadOptions { verify_hash: true }).unwrap();
                for (i, b) in got.iter().enumerate() {
                    let want = block(t * 10_000 + i as u64, 100);
                    assert_eq!(b.as_deref(), Some(&want[..]), "{io_backend:?} {t}-{i} {when}");
                }
            }
        };
        check(&store, "before closing");
        store.close().unwrap();
        let store = Store::open(dir.path(), opts).unwrap();
        check(&store, "after reopening");
    }
}
