//! Block devices: where the log's bytes go.
//!
//! All engine I/O goes through [`BlockDevice`]: unit-aligned reads and writes at absolute byte
//! offsets, and a flush. [`FileDevice`] is the portable pread/pwrite backend (with O_DIRECT where
//! the file system allows it); [`MemDevice`] keeps a written and a durable image and can simulate
//! a crash that drops or tears unsynced writes, and inject I/O errors; [`FaultDevice`] injects
//! I/O errors in front of any backend.

mod fault;
mod file;
mod memory;
mod queue;
mod uring;
mod uring_queue;

pub use fault::{FaultDevice, FaultKind, Faults};
pub use file::{device_size, FileDevice};
pub use memory::{CrashMode, MemDevice};
pub use queue::{Completion, Immediate, Waker, WriteQueue};
pub use uring::{UringConfig, UringDevice};

use thiserror::Error;

/// An I/O failure of a device.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum DeviceError {
    /// The operating system reported an error.
    #[error("{op} of {len} bytes at offset {offset} failed: {source}")]
    Io {
        /// read, write or sync.
        op: &'static str,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The request is not aligned to the device's unit.
    #[error("{op} at offset {offset} of {len} bytes is not aligned to {alignment} bytes")]
    Misaligned {
        /// read or write.
        op: &'static str,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// The alignment the device needs.
        alignment: u64,
    },
    /// The request reaches past the end of the device.
    #[error("{op} of {len} bytes at offset {offset} is past the end of the device ({capacity} bytes)")]
    OutOfRange {
        /// read or write.
        op: &'static str,
        /// Byte offset of the request.
        offset: u64,
        /// Length of the request.
        len: u64,
        /// Device size.
        capacity: u64,
    },
}

/// What a device can do, for `kvhoard stat` and for choosing buffer alignment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Capabilities {
    /// Backend name: `pread`, `memory`, ...
    pub backend: &'static str,
    /// Whether reads and writes bypass the page cache.
    pub direct_io: bool,
    /// Whether a write reaches the device whole even if the process is killed while it is under
    /// way. A direct write does: the kernel pins its buffers (the engine's, just written and
    /// resident) and hands its requests to the device, and completes them whatever becomes of
    /// the process. A buffered write does not: copying into the page cache stops at the next
    /// page once the process has a fatal signal, leaving a prefix. The
    /// log writer relies on this to keep a process crash from leaving a record that begins and
    /// does not check out ([`crate::writer`]).
    pub whole_writes: bool,
    /// Offsets, lengths and buffer addresses must be multiples of this.
    pub alignment: u64,
}

/// A byte-addressed device with aligned I/O.
///
/// Contract: `offset` and `buf.len()` are multiples of [`Capabilities::alignment`], and buffers
/// are aligned likewise (the engine uses [`crate::AlignedBuf`]); a misaligned or out-of-range
/// request fails with a typed error and touches nothing. A completed `write_at` is visible to
/// later `read_at`s; it is durable only after a later `sync` returns.
pub trait BlockDevice: Send + Sync + std::fmt::Debug {
    /// Size of the device in bytes.
    fn capacity_bytes(&self) -> u64;
    /// Reads exactly `buf.len()` bytes at `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError>;
    /// Reads several ranges, each as `read_at` would. A backend may keep them all in flight at
    /// once (io_uring does); on an error, which of the buffers were filled is unspecified.
    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<(), DeviceError> {
        reads.iter_mut().try_for_each(|(buf, offset)| self.read_at(buf, *offset))
    }
    /// `read_many` that hands each read's buffer back to `done(i, buf)` as soon as the read is
    /// complete, once, on this thread, in any order: a backend that keeps reads in flight
    /// (io_uring) does so while later reads are still in flight, so the caller's work on a
    /// finished read (checking it, or sending it to another thread to decode) overlaps the
    /// device's. After an error `done` is not called again. `done` must not do I/O on this
    /// device: a backend may call it holding one of its queues.
    fn read_many_each<'a>(
        &self,
        reads: Vec<(&'a mut [u8], u64)>,
        done: &mut dyn FnMut(usize, &'a mut [u8]),
    ) -> Result<(), DeviceError> {
        let mut reads = reads;
        self.read_many(&mut reads)?;
        reads.into_iter().enumerate().for_each(|(i, (buf, _))| done(i, buf));
        Ok(())
    }
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError>;
    /// Writes all of `buf` at `offset` if that takes no waiting (through the page cache: a copy
    /// that needs no lock another writer holds, no memory reclaim, no dirty-page throttling);
    /// `None` where it would wait, or the device cannot tell, and nothing or part of `buf` was
    /// written: the caller writes it another way. The log writer's thread writes the first unit
    /// of a buffered record so (`writer/thread.rs`), and queues it where it cannot.
    fn write_now(&self, buf: &[u8], offset: u64) -> Option<Result<(), DeviceError>> {
        let _ = (buf, offset);
        None
    }
    /// Makes every completed write durable (fdatasync).
    fn sync(&self) -> Result<(), DeviceError>;
    /// What the device can do.
    fn capabilities(&self) -> Capabilities;
    /// Which power cycle of the machine this device is seen in (0: unknown). Writes that
    /// completed survive a crash of the process: only a power loss or a crash of the system,
    /// which changes this, can drop or tear writes made since the last sync. Recovery uses it to
    /// tell a torn write from damage ([`crate::recovery`]).
    fn boot(&self) -> u64 {
        0
    }
    /// A queue through which one thread keeps up to `depth` writes in flight at once (the log
    /// writer's). A backend that writes synchronously gives [`Immediate`], which writes each one
    /// through `write_at` as it is submitted.
    fn write_queue(&self, depth: u32) -> std::io::Result<Box<dyn WriteQueue + '_>> {
        let _ = depth;
        Ok(Box::new(Immediate::new(self)))
    }
}

/// This machine's current boot, from the kernel's boot id (0 if it cannot be read).
pub(crate) fn host_boot() -> u64 {
    match std::fs::read_to_string("/proc/sys/kernel/random/boot_id") {
        Ok(id) => {
            let hash = blake3::hash(id.trim().as_bytes());
            let mut b = [0u8; 8];
            b.copy_from_slice(hash.as_bytes().split_at(8).0);
            u64::from_le_bytes(b).max(1)
        }
        Err(_) => 0,
    }
}

/// Which I/O backend a store uses for its volume.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IoBackend {
    /// io_uring when the kernel offers it, else pread/pwrite.
    #[default]
    Auto,
    /// io_uring, or fail.
    IoUring,
    /// pread/pwrite.
    Pread,
}

impl std::str::FromStr for IoBackend {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(IoBackend::Auto),
            "io_uring" | "io-uring" | "uring" => Ok(IoBackend::IoUring),
            "pread" => Ok(IoBackend::Pread),
            _ => Err(format!("unknown I/O backend {s:?}: use auto, io_uring or pread")),
        }
    }
}

/// Opens a volume's data file or device with `backend`, O_DIRECT if `direct_io` (and the file
/// system allows it).
pub fn open_volume(
    path: &std::path::Path,
    backend: IoBackend,
    direct_io: bool,
    uring: UringConfig,
) -> std::io::Result<std::sync::Arc<dyn BlockDevice>> {
    match backend {
        IoBackend::Pread => Ok(std::sync::Arc::new(FileDevice::open(path, direct_io)?)),
        IoBackend::IoUring => Ok(std::sync::Arc::new(UringDevice::open(path, direct_io, uring)?)),
        IoBackend::Auto => match UringDevice::open(path, direct_io, uring) {
            Ok(dev) => Ok(std::sync::Arc::new(dev)),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Err(e),
            Err(e) => {
                tracing::warn!(error = %e, "io_uring is not available; using pread/pwrite");
                Ok(std::sync::Arc::new(FileDevice::open(path, direct_io)?))
            }
        },
    }
}

impl Capabilities {
    /// A file or block device opened by `backend`, O_DIRECT or through the page cache.
    pub(crate) fn of_file(backend: &'static str, direct_io: bool) -> Capabilities {
        Capabilities { backend, direct_io, whole_writes: direct_io, alignment: kvhoard_format::UNIT_BYTES }
    }
}

/// Checks a request against the device contract.
pub(crate) fn check_request(
    op: &'static str,
    offset: u64,
    len: usize,
    capacity: u64,
    alignment: u64,
) -> Result<(), DeviceError> {
    let len = len as u64;
    if !offset.is_multiple_of(alignment) || !len.is_multiple_of(alignment) {
        return Err(DeviceError::Misaligned { op, offset, len, alignment });
    }
    if offset.checked_add(len).is_none_or(|end| end > capacity) {
        return Err(DeviceError::OutOfRange { op, offset, len, capacity });
    }
    Ok(())
}

pub mod conformance {
    //! The behaviour every [`BlockDevice`] must show. Each backend's tests call [`run`] on a
    //! device of at least 16 KiB whose contents do not matter; so should a backend kept outside
    //! this crate (an SPDK one, say). It panics, as a test does, on the first violation.
    #![allow(clippy::unwrap_used, clippy::indexing_slicing, clippy::panic)]
    use super::*;
    use crate::buffer::AlignedBuf;

    /// Runs the suite on `dev`: aligned reads and writes round trip, misaligned and out-of-range
    /// requests fail with their typed errors and touch nothing, `read_many` fills each buffer
    /// from its own offset, `write_now` writes all of a unit or leaves it to the caller.
    pub fn run(dev: &dyn BlockDevice) {
        let unit = dev.capabilities().alignment;
        let mut w = AlignedBuf::zeroed(2 * unit as usize);
        w.iter_mut().enumerate().for_each(|(i, b)| *b = (i % 251) as u8);
        dev.write_at(&w, unit).unwrap();
        let mut r = AlignedBuf::zeroed(2 * unit as usize);
        dev.read_at(&mut r, unit).unwrap();
        assert_eq!(&r[..], &w[..]);
        dev.sync().unwrap();
        assert!(matches!(dev.write_at(&w, 1), Err(DeviceError::Misaligned { .. })));
        assert!(matches!(dev.read_at(&mut r[..100], 0), Err(DeviceError::Misaligned { .. })));
        let end = dev.capacity_bytes() / unit * unit;
        assert!(matches!(dev.read_at(&mut r, end), Err(DeviceError::OutOfRange { .. })));
        assert!(matches!(
            dev.write_at(&w, u64::MAX - unit + 1),
            Err(DeviceError::OutOfRange { .. }) | Err(DeviceError::Misaligned { .. })
        ));
        // Several ranges in one call, in any order, land in their own buffers.
        let (mut a, mut b, mut c) =
            (AlignedBuf::zeroed(unit as usize), AlignedBuf::zeroed(unit as usize), AlignedBuf::zeroed(unit as usize));
        dev.read_many(&mut [(&mut a, 2 * unit), (&mut b, unit), (&mut c, 0)]).unwrap();
        assert_eq!(&a[..], &w[unit as usize..]);
        assert_eq!(&b[..], &w[..unit as usize]);
        let mut z = AlignedBuf::zeroed(unit as usize);
        dev.read_at(&mut z, 0).unwrap();
        assert_eq!(&c[..], &z[..]);
        assert!(matches!(
            dev.read_many(&mut [(&mut a, unit), (&mut b[..100], 0)]),
            Err(DeviceError::Misaligned { .. })
        ));
        assert!(matches!(dev.read_many(&mut [(&mut a, end)]), Err(DeviceError::OutOfRange { .. })));
        dev.read_many(&mut []).unwrap();
        // Writes through the write queue, several in flight and some of several parts, land
        // where they were asked to and complete once each.
        let parts: Vec<AlignedBuf> = (0..4u8)
            .map(|i| {
                let mut b = AlignedBuf::zeroed(unit as usize);
                b.fill(0x40 + i);
                b
            })
            .collect();
        let mut q = dev.write_queue(4).unwrap();
        // SAFETY: the parts outlive the queue.
        unsafe {
            q.submit(1, &[&parts[0], &parts[1]], 0).unwrap();
            q.submit(2, &[&parts[2]], 2 * unit).unwrap();
            q.submit(3, &[&parts[3]], 3 * unit).unwrap();
        }
        let mut done = Vec::new();
        while q.in_flight() > 0 {
            q.poll(true, &mut done);
        }
        (q.waker())();
        drop(q);
        let mut tokens: Vec<u64> = done.iter().map(|(t, r)| if r.is_ok() { *t } else { 0 }).collect();
        tokens.sort_unstable();
        assert_eq!(tokens, [1, 2, 3]);
        let mut all = AlignedBuf::zeroed(4 * unit as usize);
        dev.read_at(&mut all, 0).unwrap();
        for (i, chunk) in all.chunks(unit as usize).enumerate() {
            assert!(chunk.iter().all(|&b| b == 0x40 + i as u8), "unit {i} of the queued writes");
        }
        // read_many_each tells each read once, with the bytes its buffer then holds.
        let (mut a, mut b) = (AlignedBuf::zeroed(3 * unit as usize), AlignedBuf::zeroed(unit as usize));
        let mut c = AlignedBuf::zeroed(unit as usize);
        let mut told = Vec::new();
        dev.read_many_each(vec![(&mut a, unit), (&mut b, 0), (&mut c[..0], 0)], &mut |i, bytes| {
            told.push((i, bytes.to_vec()))
        })
        .unwrap();
        told.sort();
        assert_eq!(told.iter().map(|t| t.0).collect::<Vec<_>>(), [0, 1, 2], "every read told once, an empty one too");
        assert!(told[2].1.is_empty());
        assert!(told[0].1 == all[unit as usize..] && told[0].1 == a[..]);
        assert!(told[1].1 == all[..unit as usize] && told[1].1 == b[..]);
        assert!(matches!(
            dev.read_many_each(vec![(&mut a, end)], &mut |_, _| panic!("told of a failed read")),
            Err(DeviceError::OutOfRange { .. })
        ));
        // write_now writes all of a unit or leaves it to the caller; out of range it never
        // writes.
        let mut n = AlignedBuf::zeroed(unit as usize);
        n.fill(0x5a);
        if let Some(written) = dev.write_now(&n, unit) {
            written.unwrap();
            let mut back = AlignedBuf::zeroed(unit as usize);
            dev.read_at(&mut back, unit).unwrap();
            assert_eq!(&back[..], &n[..], "write_now wrote the unit");
        }
        assert!(!matches!(dev.write_now(&n, end), Some(Ok(()))), "write_now past the end");
    }
}
