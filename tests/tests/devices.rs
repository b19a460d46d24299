//! The io_uring backend on a real file: the device conformance suite, request splitting, and
//! rings shared by threads. Skips (counted) where the kernel has no io_uring.

use std::fs::File;

use kvhoard_engine::device::{conformance, BlockDevice, DeviceError, UringConfig, UringDevice};
use kvhoard_engine::AlignedBuf;

fn device(len: u64, config: UringConfig) -> Option<(tempfile::TempDir, UringDevice)> {
    device_with(len, config, true)
}

fn device_with(len: u64, config: UringConfig, direct_io: bool) -> Option<(tempfile::TempDir, UringDevice)> {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let path = dir.path().join("dev");
    File::create(&path).unwrap().set_len(len).unwrap();
    match UringDevice::open(&path, direct_io, config) {
        Ok(dev) => Some((dir, dev)),
        Err(e) => {
            kvhoard_tests::skip("io_uring", &format!("io_uring is not available here: {e}"));
            None
        }
    }
}

#[test]
fn passes_the_conformance_suite() {
    let Some((_dir, dev)) = device(1 << 20, UringConfig::default()) else { return };
    conformance::run(&dev);
    assert_eq!(dev.capabilities().backend, "io_uring");
}

#[test]
fn passes_the_conformance_suite_through_the_page_cache() {
    let Some((_dir, dev)) = device_with(1 << 20, UringConfig::default(), false) else { return };
    assert!(!dev.capabilities().direct_io);
    conformance::run(&dev);
}

#[test]
fn large_requests_are_split_and_reassembled_in_order() {
    let config = UringConfig { rings: 2, queue_depth: 4, chunk_bytes: 8192 };
    let Some((_dir, dev)) = device(4 << 20, config) else { return };
    // 100 chunks through a queue of 4: many refills of the ring.
    let mut w = AlignedBuf::zeroed(800 * 1024);
    w.iter_mut().enumerate().for_each(|(i, b)| *b = (i * 7 % 251) as u8);
    dev.write_at(&w, 4096).unwrap();
    let mut r = AlignedBuf::zeroed(800 * 1024);
    dev.read_at(&mut r, 4096).unwrap();
    assert!(r[..] == w[..]);
    // The same bytes as three reads of many chunks each, in flight together.
    let mut r = AlignedBuf::zeroed(800 * 1024);
    let (head, rest) = r.split_at_mut(4096);
    let (middle, tail) = rest.split_at_mut(500 * 1024);
    dev.read_many(&mut [(tail, 4096 + 4096 + 500 * 1024), (head, 4096), (middle, 8192)]).unwrap();
    assert!(r[..] == w[..]);
    // The same, each read told as soon as all its chunks are in, with exactly its bytes.
    let mut r = AlignedBuf::zeroed(800 * 1024);
    let (head, rest) = r.split_at_mut(4096);
    let (middle, tail) = rest.split_at_mut(500 * 1024);
    let mut told = Vec::new();
    dev.read_many_each(vec![(tail, 4096 + 4096 + 500 * 1024), (head, 4096), (middle, 8192)], &mut |i, bytes| {
        told.push((i, bytes.len(), blake3::hash(bytes)))
    })
    .unwrap();
    told.sort_by_key(|t| t.0);
    let expect = [&w[4096 + 500 * 1024..], &w[..4096], &w[4096..4096 + 500 * 1024]];
    assert_eq!(told.len(), 3);
    for ((i, len, hash), want) in told.into_iter().zip(expect) {
        assert_eq!((len, hash), (want.len(), blake3::hash(want)), "read {i}");
    }
    assert!(r[..] == w[..]);
}

#[test]
fn each_read_is_told_as_soon_as_it_completes_not_after_the_batch() {
    // One ring with one chunk in flight: the first read completes, and is told, before the
    // second is read at all. Told only after the batch, it would never be: the second fails.
    let config = UringConfig { rings: 1, queue_depth: 1, chunk_bytes: 4096 };
    let Some((dir, dev)) = device(1 << 20, config) else { return };
    let mut w = AlignedBuf::zeroed(8192);
    w.fill(0x5a);
    dev.write_at(&w, 0).unwrap();
    // The file shrinks under the device: a read past its new end comes back short.
    File::options().write(true).open(dir.path().join("dev")).unwrap().set_len(8192).unwrap();
    let (mut a, mut b) = (AlignedBuf::zeroed(4096), AlignedBuf::zeroed(64 << 10));
    let mut told = Vec::new();
    let got = dev.read_many_each(vec![(&mut a, 0), (&mut b, 512 << 10)], &mut |i, bytes| {
        told.push((i, bytes.len(), bytes.iter().all(|&x| x == 0x5a)))
    });
    assert!(matches!(got, Err(DeviceError::Io { .. })), "{got:?}");
    assert_eq!(told, [(0, 4096, true)]);
}

#[test]
fn a_check_that_panics_leaves_nothing_in_flight() {
    // The first read is told while the second is still being read; the check panics. The
    // panic reaches the caller only after the second read has completed, and the ring serves
    // the next request with nothing left over from this one.
    let config = UringConfig { rings: 1, queue_depth: 1, chunk_bytes: 4096 };
    let Some((_dir, dev)) = device(1 << 20, config) else { return };
    let mut w = AlignedBuf::zeroed(256 << 10);
    w.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 253) as u8);
    dev.write_at(&w, 0).unwrap();
    let (mut a, mut b) = (AlignedBuf::zeroed(4096), AlignedBuf::zeroed(128 << 10));
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let _ = dev.read_many_each(vec![(&mut a, 0), (&mut b, 4096)], &mut |_, _| panic!("a check failed"));
    }));
    assert!(caught.is_err(), "the panic reaches the caller");
    let mut r = AlignedBuf::zeroed(256 << 10);
    dev.read_many(&mut [(&mut r[..], 0)]).unwrap();
    assert!(r[..] == w[..]);
}

#[test]
fn reading_past_the_end_of_the_file_is_an_error() {
    let Some((dir, dev)) = device(1 << 20, UringConfig::default()) else { return };
    File::options().write(true).open(dir.path().join("dev")).unwrap().set_len(8192).unwrap();
    let mut buf = AlignedBuf::zeroed(64 << 10);
    assert!(matches!(dev.read_at(&mut buf, 0), Err(DeviceError::Io { .. })));
}

#[test]
fn many_threads_share_the_rings() {
    let Some((_dir, dev)) = device(16 << 20, UringConfig { rings: 2, queue_depth: 8, chunk_bytes: 64 << 10 }) else {
        return;
    };
    std::thread::scope(|s| {
        for t in 0..6u64 {
            let dev = &dev;
            s.spawn(move || {
                let mut w = AlignedBuf::zeroed(1 << 20);
                w.fill(t as u8 + 1);
                for round in 0..5u64 {
                    let off = (t * 2 + round % 2) << 20;
                    dev.write_at(&w, off).unwrap();
                    let mut r = AlignedBuf::zeroed(1 << 20);
                    dev.read_at(&mut r, off).unwrap();
                    assert!(r.iter().all(|&b| b == t as u8 + 1));
                }
            });
        }
    });
}
