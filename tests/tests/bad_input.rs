//! Bad input gets a clear error and loses nothing: names out of range, blocks larger than a
//! segment, paths that are not volumes, newer formats, damaged superblocks, a volume open in
//! another process. Also: a volume on a raw block device (a loop device).

use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::path::Path;
use std::process::{Command, Stdio};

use kvhoard_engine::{CreateOptions, Durability, IoBackend, PutOptions, ReadOptions, Store, StoreError, StoreOptions};

fn create(dir: &Path) -> Store {
    let opts = CreateOptions { capacity_bytes: Some(64 << 20), segment_size_bytes: 4 << 20 };
    Store::create(&dir.join("vol"), &opts, StoreOptions::default()).unwrap()
}

fn synced() -> PutOptions {
    PutOptions { durability: Durability::Synced, ..PutOptions::default() }
}

#[test]
fn names_and_sizes_out_of_range_are_refused_and_nothing_is_lost() {
    let dir = tempfile::tempdir().unwrap();
    let store = create(dir.path());
    store.put("default", "kept", b"bytes", &synced()).unwrap();
    let cases: Vec<(&str, String, usize)> = vec![
        ("", "k".into(), 1),
        ("a/b", "k".into(), 1),
        ("default", String::new(), 1),
        ("default", "k".repeat(4097), 1),
        ("default", "big".into(), 5 << 20),
    ];
    for (ns, key, len) in cases {
        let err = store.put(ns, &key, &vec![1u8; len], &synced()).unwrap_err();
        assert!(matches!(err, StoreError::InvalidArgument { .. } | StoreError::BlockTooLarge { .. }), "{err:?}");
        assert!(!err.to_string().is_empty());
    }
    assert_eq!(&*store.get("default", "kept", ReadOptions::default()).unwrap().unwrap(), b"bytes");
    store.put("default", "after", b"ok", &synced()).unwrap();
}

#[test]
fn a_path_that_is_not_a_volume_is_refused_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAVolume { .. }), "{err}");
    assert!(err.to_string().contains("kvhoard init"), "{err}");
    std::fs::write(dir.path().join("volume.kvh"), vec![7u8; 1 << 20]).unwrap();
    let err = Store::open(dir.path(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAVolume { .. }), "{err}");
}

#[test]
fn creating_over_an_existing_volume_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = create(dir.path());
    store.put("default", "kept", b"bytes", &synced()).unwrap();
    store.close().unwrap();
    drop(store);
    let err = Store::create(&dir.path().join("vol"), &CreateOptions::default(), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    let store = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap();
    assert!(store.contains("default", "kept").unwrap());
}

fn patch_superblocks(path: &Path, f: impl Fn(&mut [u8])) {
    let mut file = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
    for offset in [0u64, 4096] {
        let mut unit = vec![0u8; 4096];
        file.seek(SeekFrom::Start(offset)).unwrap();
        std::io::Read::read_exact(&mut file, &mut unit).unwrap();
        f(&mut unit);
        file.seek(SeekFrom::Start(offset)).unwrap();
        file.write_all(&unit).unwrap();
    }
}

#[test]
fn a_volume_of_a_newer_format_is_refused_with_an_upgrade_hint() {
    let dir = tempfile::tempdir().unwrap();
    create(dir.path()).close().unwrap();
    patch_superblocks(&dir.path().join("vol/volume.kvh"), |unit| {
        unit[8..12].copy_from_slice(&2u32.to_le_bytes());
        let crc = crc32c(&unit[..120]);
        unit[120..124].copy_from_slice(&crc.to_le_bytes());
    });
    let err = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Superblock(_)), "{err}");
    assert!(err.to_string().contains("upgrade"), "{err}");
}

fn crc32c(bytes: &[u8]) -> u32 {
    // Bitwise crc32c (Castagnoli), so the test does not trust the code it tests.
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}

#[test]
fn one_damaged_superblock_copy_is_survived_and_two_are_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = create(dir.path());
    store.put("default", "kept", b"bytes", &synced()).unwrap();
    store.close().unwrap();
    drop(store);
    let path = dir.path().join("vol/volume.kvh");
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(40)).unwrap();
    file.write_all(&[0xff; 8]).unwrap();
    drop(file);
    let store = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap();
    assert_eq!(&*store.get("default", "kept", ReadOptions::default()).unwrap().unwrap(), b"bytes");
    drop(store);
    let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
    file.seek(SeekFrom::Start(4096 + 40)).unwrap();
    file.write_all(&[0xff; 8]).unwrap();
    drop(file);
    let err = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::NotAVolume { .. }), "{err}");
}

#[test]
fn a_volume_open_in_another_process_is_refused_until_that_process_dies() {
    let dir = tempfile::tempdir().unwrap();
    create(dir.path()).close().unwrap();
    let volume = dir.path().join("vol");
    let mut child = Command::new(env!("CARGO_BIN_EXE_crash-writer"))
        .arg(&volume)
        .arg("0")
        .arg("hold")
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    assert_eq!(line.trim(), "open");
    let err = Store::open(&volume, StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("another process"), "{err}");
    // A crashed holder leaves no lock behind.
    child.kill().unwrap();
    child.wait().unwrap();
    Store::open(&volume, StoreOptions::default()).unwrap();
}

#[test]
fn a_volume_open_twice_in_one_process_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let _store = create(dir.path());
    let err = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { .. }), "{err}");
}

#[test]
fn close_releases_the_volume_while_the_handle_lives_and_the_handle_then_refuses_work() {
    let dir = tempfile::tempdir().unwrap();
    let first = create(dir.path());
    first.put("default", "k", b"kept", &PutOptions::default()).unwrap();
    first.close().unwrap();
    // Someone else (here: a new handle in this process) takes the volume over.
    let second = Store::open(&dir.path().join("vol"), StoreOptions::default()).unwrap();
    assert_eq!(&*second.get("default", "k", ReadOptions::default()).unwrap().unwrap(), b"kept");
    second.put("default", "k2", b"new owner", &PutOptions::default()).unwrap();
    // The closed handle neither reads nor writes what the new owner may be changing.
    for err in [
        first.get("default", "k", ReadOptions::default()).map(|_| ()).unwrap_err(),
        first.contains("default", "k").map(|_| ()).unwrap_err(),
        first.meta("default", "k").map(|_| ()).unwrap_err(),
        first.put("default", "k3", b"x", &PutOptions::default()).map(|_| ()).unwrap_err(),
    ] {
        assert!(matches!(err, StoreError::Closed), "{err}");
    }
    first.close().unwrap();
    drop(first);
    assert!(second.contains("default", "k2").unwrap());
}

/// A loop device over a file, detached on drop.
struct LoopDevice(String);

impl LoopDevice {
    fn attach(file: &Path) -> Option<LoopDevice> {
        let out = match Command::new("losetup").args(["--find", "--show"]).arg(file).output() {
            Ok(out) => out,
            Err(e) => {
                kvhoard_tests::skip("loop", &format!("cannot run losetup ({e}); install util-linux"));
                return None;
            }
        };
        if !out.status.success() {
            let why = String::from_utf8_lossy(&out.stderr);
            kvhoard_tests::skip(
                "loop",
                &format!("losetup failed ({}); the raw block device test needs root and loop devices", why.trim()),
            );
            return None;
        }
        Some(LoopDevice(String::from_utf8_lossy(&out.stdout).trim().to_string()))
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

fn on_a_loop_device(io_backend: IoBackend) {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing).unwrap().set_len(96 << 20).unwrap();
    let Some(dev) = LoopDevice::attach(&backing) else { return };
    let path = Path::new(&dev.0);
    let create = CreateOptions { capacity_bytes: None, segment_size_bytes: 4 << 20 };
    let store = Store::create(path, &create, StoreOptions { io_backend, ..StoreOptions::default() }).unwrap();
    for i in 0..40u32 {
        store.put("default", &format!("k{i}"), &kvhoard_tests::block(u64::from(i), 100_000), &synced()).unwrap();
    }
    store.close().unwrap();
    drop(store);
    let err = Store::create(path, &create, StoreOptions { io_backend, ..StoreOptions::default() }).unwrap_err();
    assert!(matches!(err, StoreError::AlreadyExists { .. }), "{err}");
    let store = Store::open(path, StoreOptions { io_backend, ..StoreOptions::default() }).unwrap();
    assert!(store.recovery_report().checkpoint_seq.is_some(), "checkpoint slots on the device were not used");
    assert_eq!(store.recovery_report().records_replayed, 0);
    for i in 0..40u32 {
        assert_eq!(
            &*store.get("default", &format!("k{i}"), ReadOptions { verify_hash: true }).unwrap().unwrap(),
            &kvhoard_tests::block(u64::from(i), 100_000)[..]
        );
    }
    assert!(store.stats().direct_io);
    let want = if io_backend == IoBackend::Pread { "pread" } else { "io_uring" };
    assert_eq!(store.stats().device_backend, want);
}

#[test]
fn a_volume_on_a_raw_block_device_works_through_io_uring() {
    on_a_loop_device(IoBackend::IoUring);
}

#[test]
fn a_volume_on_a_raw_block_device_works_through_pread() {
    on_a_loop_device(IoBackend::Pread);
}
