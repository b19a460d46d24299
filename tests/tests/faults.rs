//! Injected I/O errors on the real I/O paths: EIO on read, write and fsync in front of the
//! io_uring and the pread backends, on a volume file (and through the page cache, where the
//! log writer writes a record's first unit last). A failed write is never acknowledged,
//! errors are typed, reads keep working, and the volume reopens with every acknowledged block.

use std::path::Path;
use std::sync::Arc;

use kvhoard_engine::device::{BlockDevice, FaultDevice, FaultKind, FileDevice, UringConfig, UringDevice};
use kvhoard_engine::{
    CreateOptions, Durability, PutOptions, ReadOptions, Store, StoreError, StoreOptions, WriterConfig,
};
use kvhoard_tests::block;

const SEG: u64 = 4 << 20;

#[derive(Debug, Clone, Copy)]
enum Backend {
    IoUring,
    Pread,
    /// io_uring without O_DIRECT.
    Buffered,
}

fn device(path: &Path, backend: Backend) -> Arc<FaultDevice> {
    let inner: Arc<dyn BlockDevice> = match backend {
        Backend::IoUring => Arc::new(UringDevice::open(path, true, UringConfig::default()).unwrap()),
        Backend::Pread => Arc::new(FileDevice::open(path, true).unwrap()),
        Backend::Buffered => Arc::new(UringDevice::open(path, false, UringConfig::default()).unwrap()),
    };
    Arc::new(FaultDevice::new(inner))
}

fn volume(dir: &Path, backend: Backend) -> (Arc<FaultDevice>, Store) {
    let path = dir.join("volume");
    std::fs::File::create(&path).unwrap().set_len(SEG * 8).unwrap();
    let dev = device(&path, backend);
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let store = Store::create_on(dev.clone(), &create, StoreOptions::default()).unwrap();
    (dev, store)
}

fn reopen(dir: &Path, backend: Backend) -> Store {
    Store::open_on(device(&dir.join("volume"), backend), StoreOptions::default()).unwrap()
}

fn opts(durability: Durability) -> PutOptions {
    PutOptions { durability, ..PutOptions::default() }
}

fn get(store: &Store, key: &str) -> Result<Option<Vec<u8>>, StoreError> {
    Ok(store.get("default", key, ReadOptions { verify_hash: true })?.map(|b| b.to_vec()))
}

fn is_eio(e: &StoreError) -> bool {
    matches!(e, StoreError::Device(kvhoard_engine::device::DeviceError::Io { source, .. }) if source.raw_os_error() == Some(libc::EIO))
        || matches!(e, StoreError::Poisoned { reason } if reason.contains("Input/output error"))
}

fn eio_on_read(backend: Backend) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (dev, store) = volume(dir.path(), backend);
    let a = block(1, 300_000);
    store.put("default", "a", &a, &opts(Durability::Synced)).unwrap();
    dev.fail_nth(FaultKind::Read, 1);
    let err = get(&store, "a").unwrap_err();
    assert!(is_eio(&err), "{backend:?}: a failed read is a typed device error, got {err:?}");
    assert_eq!(get(&store, "a").unwrap().unwrap(), a, "{backend:?}: the next read succeeds");
    store.put("default", "b", &a, &opts(Durability::Written)).unwrap();
}

fn eio_on_write(backend: Backend) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (dev, store) = volume(dir.path(), backend);
    let a = block(1, 300_000);
    let b = block(2, 300_000);
    store.put("default", "a", &a, &opts(Durability::Written)).unwrap();
    dev.fail_nth(FaultKind::Write, 1);
    let err = store.put("default", "b", &b, &opts(Durability::Written)).unwrap_err();
    assert!(is_eio(&err), "{backend:?}: got {err:?}");
    assert_eq!(get(&store, "b").unwrap(), None, "{backend:?}: a failed write is not readable");
    assert_eq!(get(&store, "a").unwrap().unwrap(), a, "{backend:?}: reads keep working");
    let refused = store.put("default", "c", &b, &opts(Durability::Written)).unwrap_err();
    assert!(matches!(refused, StoreError::Poisoned { .. }), "{backend:?}: writes refused until reopen: {refused:?}");
    drop(store);
    let store = reopen(dir.path(), backend);
    assert_eq!(get(&store, "a").unwrap().unwrap(), a, "{backend:?}");
    assert_eq!(get(&store, "b").unwrap(), None, "{backend:?}: the failed put never comes back");
    store.put("default", "c", &b, &opts(Durability::Synced)).unwrap();
    assert_eq!(get(&store, "c").unwrap().unwrap(), b);
}

fn eio_on_fsync(backend: Backend) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (dev, store) = volume(dir.path(), backend);
    let a = block(1, 100_000);
    store.put("default", "a", &a, &opts(Durability::Synced)).unwrap();
    dev.fail_nth(FaultKind::Sync, 1);
    let err = store.put("default", "b", &block(2, 100_000), &opts(Durability::Synced)).unwrap_err();
    assert!(is_eio(&err), "{backend:?}: got {err:?}");
    assert_eq!(get(&store, "a").unwrap().unwrap(), a);
    assert!(matches!(store.put("default", "c", &a, &opts(Durability::Synced)), Err(StoreError::Poisoned { .. })));
    drop(store);
    let store = reopen(dir.path(), backend);
    assert_eq!(get(&store, "a").unwrap().unwrap(), a, "{backend:?}: the acknowledged block survives");
    store.put("default", "c", &a, &opts(Durability::Synced)).unwrap();
}

/// A volume whose log writer joins records into writes of up to 64 KiB and splits larger ones.
fn volume_with_small_writes(backend: Backend) -> (tempfile::TempDir, Arc<FaultDevice>, Store) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("volume");
    std::fs::File::create(&path).unwrap().set_len(SEG * 8).unwrap();
    let dev = device(&path, backend);
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
    let writer = WriterConfig { in_flight_bytes: 64 << 20, request_bytes: 64 << 10, split_bytes: 64 << 10 };
    let store = Store::create_on(dev.clone(), &create, StoreOptions { writer, ..StoreOptions::default() }).unwrap();
    (dir, dev, store)
}

/// A batch of small records handed to the log writer is joined into writes of up to four
/// records (16 KiB each, 64 KiB writes). The sixth part written fails, and with it the whole
/// write it is in: its records are never readable, the batch is not acknowledged, the records
/// of the writes that succeeded are read back intact (this run) or are gone (after reopening,
/// which stops at the hole), never garbage, and everything acknowledged before survives.
fn eio_in_a_joined_write(backend: Backend) {
    let (dir, dev, store) = volume_with_small_writes(backend);
    let early = block(99, 100_000);
    store.put("default", "early", &early, &opts(Durability::Synced)).unwrap();
    let blocks: Vec<Vec<u8>> = (0..20).map(|i| block(i, 12 << 10)).collect();
    let keys: Vec<String> = (0..20).map(|i| format!("k{i}")).collect();
    let items: Vec<(&str, &[u8])> = keys.iter().map(String::as_str).zip(blocks.iter().map(Vec::as_slice)).collect();
    dev.fail_nth(FaultKind::Write, 6);
    let err = store.put_batch("default", &items, &opts(Durability::Written)).unwrap_err();
    assert!(is_eio(&err), "{backend:?}: the batch fails with the write's error, got {err:?}");
    let mut missing = Vec::new();
    for (i, (key, bytes)) in keys.iter().zip(&blocks).enumerate() {
        match get(&store, key).unwrap() {
            None => missing.push(i),
            Some(got) => assert!(got == *bytes, "{backend:?}: record {i} is not its bytes"),
        }
    }
    // Which records share a write depends on how the writer took them; what must hold: the
    // failed write's records are gone, one run of at most four neighbours, and beside them at
    // most the batch's last records: those the batch had not yet reserved when the failure
    // poisoned the log (under load the writer can get that far ahead), never written at all.
    // The failed write may end where that unwritten end begins, or lie in it.
    let unreserved = missing.iter().rev().zip((0..keys.len()).rev()).take_while(|(m, i)| **m == *i).count();
    let failed = &missing[..missing.len() - unreserved];
    assert!(
        !missing.is_empty() && failed.len() <= 4 && failed.windows(2).all(|w| w[1] == w[0] + 1),
        "{backend:?}: the records of one failed write are gone, and besides at most the batch's unwritten end: {missing:?}"
    );
    drop(store);
    let store = reopen(dir.path(), backend);
    assert_eq!(get(&store, "early").unwrap().unwrap(), early, "{backend:?}: acknowledged before");
    // Records written before the hole were never acknowledged: found or not, both are right,
    // but what is found is whole. Nothing from the hole on comes back.
    for (i, (key, bytes)) in keys.iter().zip(&blocks).enumerate() {
        if let Some(got) = get(&store, key).unwrap() {
            assert!(i < missing[0] && got == *bytes, "{backend:?}: record {i} after reopening");
        }
    }
    store.put("default", "after", &early, &opts(Durability::Synced)).unwrap();
}

#[test]
fn eio_in_the_middle_of_a_joined_write_fails_exactly_its_records() {
    eio_in_a_joined_write(Backend::IoUring);
    eio_in_a_joined_write(Backend::Pread);
    eio_in_a_joined_write(Backend::Buffered);
}

/// A record larger than one write is split over several; one of its pieces fails. The put fails,
/// and the record's header, which the writer starts only once every other piece is on the
/// device, is never written: the next open finds a hole, not a record that begins and does not
/// check out (which it would have to take for damage and make the key a miss), and the key's
/// earlier acknowledged value is there.
fn eio_in_a_piece_of_a_split_record(backend: Backend) {
    let (dir, dev, store) = volume_with_small_writes(backend);
    let first = block(1, 100_000);
    store.put("default", "k", &first, &opts(Durability::Synced)).unwrap();
    dev.fail_nth(FaultKind::Write, 2);
    let err = store.put("default", "k", &block(2, 300_000), &opts(Durability::Written)).unwrap_err();
    assert!(is_eio(&err), "{backend:?}: the put fails with the write's error, got {err:?}");
    drop(store);
    let store = reopen(dir.path(), backend);
    assert_eq!(store.recovery_report().records_discarded, 0, "{backend:?}: nothing taken for damage");
    assert!(get(&store, "k").unwrap() == Some(first), "{backend:?}: the acknowledged value of k");
    store.put("default", "after", &block(3, 1000), &opts(Durability::Synced)).unwrap();
}

#[test]
fn eio_in_a_piece_of_a_split_record_leaves_the_value_before_it() {
    eio_in_a_piece_of_a_split_record(Backend::IoUring);
    eio_in_a_piece_of_a_split_record(Backend::Pread);
    eio_in_a_piece_of_a_split_record(Backend::Buffered);
}

/// Through the page cache, a record of more than one unit is written with a pending unit in
/// place of its first unit, and the first unit after: a failure of either write (the fault
/// device counts the first write's two parts, pending unit and rest, as two) fails the put,
/// and the next open finds a record that never happened, never one that begins and does not
/// check out, so the key keeps its earlier acknowledged value.
#[test]
fn eio_in_either_write_of_a_buffered_record_leaves_the_value_before_it() {
    for nth in [1, 2, 3] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let (dev, store) = volume(dir.path(), Backend::Buffered);
        let first = block(1, 100_000);
        store.put("default", "k", &first, &opts(Durability::Synced)).unwrap();
        dev.fail_nth(FaultKind::Write, nth);
        let err = store.put("default", "k", &block(2, 300_000), &opts(Durability::Written)).unwrap_err();
        assert!(is_eio(&err), "write {nth}: the put fails with the write's error, got {err:?}");
        drop(store);
        let store = reopen(dir.path(), Backend::Buffered);
        assert_eq!(store.recovery_report().records_discarded, 0, "write {nth}: nothing taken for damage");
        assert!(get(&store, "k").unwrap() == Some(first), "write {nth}: the acknowledged value of k");
    }
}

#[test]
fn eio_on_read_is_a_typed_error_and_the_store_keeps_serving() {
    eio_on_read(Backend::IoUring);
    eio_on_read(Backend::Pread);
    eio_on_read(Backend::Buffered);
}

#[test]
fn eio_on_write_is_never_acknowledged() {
    eio_on_write(Backend::IoUring);
    eio_on_write(Backend::Pread);
    eio_on_write(Backend::Buffered);
}

#[test]
fn eio_on_fsync_fails_the_synced_put_and_keeps_what_was_acknowledged() {
    eio_on_fsync(Backend::IoUring);
    eio_on_fsync(Backend::Pread);
    eio_on_fsync(Backend::Buffered);
}

/// A freeing ahead of the oldest segment that stopped after the checkpoint it writes first and
/// before its superblock record (here a failed write of that record; a crash there leaves the
/// same): nothing was freed, so the next open voids nothing, finds the victim's header stale,
/// and records its use before it erases it. An open that then finds no checkpoint voids the
/// keys written before it rather than give "k" its older version.
#[test]
fn a_freeing_ahead_stopped_before_its_record_is_recorded_by_the_next_open() {
    let store_opts = StoreOptions { checkpoint_every_segments: 1000, ..StoreOptions::default() };
    let segment_of = |store: &Store, key: &str| {
        store.get("default", key, ReadOptions::default()).unwrap().map(|b| b.meta.location.segment)
    };
    let fill = |store: &Store, n: u64| {
        store.put("default", &format!("fill{n}"), &block(1_000 + n, 600_000), &opts(Durability::Written))
    };
    // The oldest segment holds "k" at its first version and a pinned key; the next one "k" at
    // its second. Fills until reclaim passes the pinned oldest segment over, and `until` more.
    let build = |dir: &Path, fills: Option<u64>| -> (Arc<FaultDevice>, Store, u64) {
        let path = dir.join("volume");
        std::fs::File::create(&path).unwrap().set_len(SEG * 8).unwrap();
        let dev = device(&path, Backend::Pread);
        let create = CreateOptions { capacity_bytes: None, segment_size_bytes: SEG };
        let store = Store::create_on(dev.clone(), &create, store_opts.clone()).unwrap();
        store.put("default", "k", b"version 1", &opts(Durability::Written)).unwrap();
        store.put("default", "pinned", &block(7, 100_000), &opts(Durability::Written)).unwrap();
        assert!(store.pin("default", "pinned").unwrap());
        let first = segment_of(&store, "k").unwrap();
        let mut n = 0;
        loop {
            fill(&store, n).unwrap();
            n += 1;
            if segment_of(&store, &format!("fill{}", n - 1)) != Some(first) {
                break;
            }
        }
        store.put("default", "k", b"version 2", &opts(Durability::Written)).unwrap();
        match fills {
            Some(total) => {
                while n < total {
                    fill(&store, n).unwrap();
                    n += 1;
                }
            }
            None => {
                while segment_of(&store, "k").is_some() {
                    fill(&store, n).unwrap();
                    n += 1;
                    assert!(n < 200, "the second segment was never reclaimed");
                }
            }
        }
        (dev, store, n)
    };
    let probe = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let (_, store, fills) = build(probe.path(), None);
    assert!(store.stats().segments_freed_ahead >= 1, "{:?}", store.stats());
    drop(store);
    // The write that fails: the first one of the record, after the checkpoint.
    let mut found = None;
    for nth in 1..64 {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let (dev, store, n) = build(dir.path(), Some(fills - 1));
        dev.fail_nth(FaultKind::Write, nth);
        if fill(&store, n).is_err() {
            // Why the log refuses writes now.
            let why = store.put("default", "after", b"x", &opts(Durability::Written)).unwrap_err().to_string();
            if why.contains("freed ahead") {
                drop(store);
                found = Some(dir);
                break;
            }
        }
    }
    let dir = found.expect("no write of the superblock record failed");
    let reopen = || Store::open_on(device(&dir.path().join("volume"), Backend::Pread), store_opts.clone()).unwrap();
    let store = reopen();
    let report = store.recovery_report().clone();
    assert_eq!(report.keys_voided, 0, "{report:?}");
    assert!(report.stale_segments_freed >= 1, "{report:?}");
    assert_eq!(get(&store, "pinned").unwrap(), Some(block(7, 100_000)));
    assert_eq!(get(&store, "k").unwrap(), None);
    store.close().unwrap();
    drop(store);
    let store = reopen();
    assert_ne!(store.superblock().freed_ahead.seq, 0, "the open did not record the use it freed");
    let sb = store.superblock().clone();
    store.close().unwrap();
    drop(store);
    // Both checkpoint slots lost.
    let file = std::fs::OpenOptions::new().write(true).open(dir.path().join("volume")).unwrap();
    let zeros = vec![0u8; 2 * sb.checkpoint_slot_bytes as usize];
    std::os::unix::fs::FileExt::write_all_at(&file, &zeros, sb.checkpoint_offset).unwrap();
    drop(file);
    let store = reopen();
    assert_eq!(store.recovery_report().checkpoint_seq, None);
    assert!(store.recovery_report().keys_voided >= 1, "{:?}", store.recovery_report());
    assert_eq!(get(&store, "k").unwrap(), None, "an older version came back");
}
