//! Injected I/O errors: [`Faults`] arms them, [`FaultDevice`] puts them in front of any device
//! (the io_uring and pread backends included), so error handling is tested on the real I/O path.

use std::sync::{Arc, Mutex};

use super::queue::{Completion, Waker, WriteQueue};
use super::{BlockDevice, Capabilities, DeviceError};

/// Which operation an injected fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FaultKind {
    /// `read_at`.
    Read,
    /// `write_at`.
    Write,
    /// `sync`.
    Sync,
}

/// Armed faults: each fails the n-th next operation of its kind with EIO.
#[derive(Debug, Default)]
pub struct Faults(Mutex<Vec<(FaultKind, u64)>>);

impl Faults {
    /// Makes the `n`-th next operation of `kind` fail (n = 1: the very next one; 0 counts as 1).
    pub fn arm(&self, kind: FaultKind, n: u64) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push((kind, n.max(1)));
    }

    /// Counts one operation of `kind`; whether it must fail.
    pub fn take(&self, kind: FaultKind) -> bool {
        let mut hit = false;
        self.0.lock().unwrap_or_else(|e| e.into_inner()).retain_mut(|(k, n)| {
            if *k != kind {
                return true;
            }
            *n -= 1;
            hit |= *n == 0;
            *n > 0
        });
        hit
    }
}

/// The error an injected fault produces: what a failing disk reports.
pub(crate) fn eio(op: &'static str, offset: u64, len: u64) -> DeviceError {
    DeviceError::Io { op, offset, len, source: std::io::Error::from_raw_os_error(libc::EIO) }
}

/// A device that passes every request to `inner` unless an armed fault fails it first.
#[derive(Debug)]
pub struct FaultDevice {
    inner: Arc<dyn BlockDevice>,
    faults: Faults,
}

impl FaultDevice {
    /// Wraps `inner`, no fault armed.
    pub fn new(inner: Arc<dyn BlockDevice>) -> FaultDevice {
        FaultDevice { inner, faults: Faults::default() }
    }

    /// Makes the `n`-th next operation of `kind` fail with EIO (n = 1: the very next one).
    pub fn fail_nth(&self, kind: FaultKind, n: u64) {
        self.faults.arm(kind, n);
    }
}

impl BlockDevice for FaultDevice {
    fn capacity_bytes(&self) -> u64 {
        self.inner.capacity_bytes()
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        if self.faults.take(FaultKind::Read) {
            return Err(eio("read", offset, buf.len() as u64));
        }
        self.inner.read_at(buf, offset)
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        if self.faults.take(FaultKind::Write) {
            return Err(eio("write", offset, buf.len() as u64));
        }
        self.inner.write_at(buf, offset)
    }

    // `write_now` is not forwarded: the queued path it falls back to is the one whose faults the
    // tests count (one per write), whatever the file system under the device accepts.

    fn sync(&self) -> Result<(), DeviceError> {
        if self.faults.take(FaultKind::Sync) {
            return Err(eio("sync", 0, 0));
        }
        self.inner.sync()
    }

    fn capabilities(&self) -> Capabilities {
        self.inner.capabilities()
    }

    fn boot(&self) -> u64 {
        self.inner.boot()
    }

    fn write_queue(&self, depth: u32) -> std::io::Result<Box<dyn WriteQueue + '_>> {
        Ok(Box::new(FaultQueue { inner: self.inner.write_queue(depth)?, faults: &self.faults, failed: Vec::new() }))
    }
}

/// The inner device's own write queue (io_uring's, say), with faults in front: a write of
/// several parts counts one write per part, and fails whole, unwritten, when one of them hits,
/// as a write a disk rejects part-way through does for whoever waits on it.
struct FaultQueue<'a> {
    inner: Box<dyn WriteQueue + 'a>,
    faults: &'a Faults,
    failed: Vec<Completion>,
}

impl WriteQueue for FaultQueue<'_> {
    unsafe fn submit(&mut self, token: u64, parts: &[&[u8]], offset: u64) -> Result<(), DeviceError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        // Every part is counted, as `write_at` would count them, whether or not one hit before.
        let hit = parts.iter().fold(false, |hit, _| self.faults.take(FaultKind::Write) | hit);
        if hit {
            self.failed.push((token, Err(eio("write", offset, len as u64))));
            return Ok(());
        }
        // SAFETY: the caller's promise is passed on unchanged.
        unsafe { self.inner.submit(token, parts, offset) }
    }

    fn poll(&mut self, block: bool, done: &mut Vec<Completion>) {
        let had = self.failed.len();
        done.append(&mut self.failed);
        // A failed write is a completion: no need to wait for another.
        self.inner.poll(block && had == 0, done);
    }

    fn in_flight(&self) -> usize {
        self.inner.in_flight() + self.failed.len()
    }

    fn waker(&self) -> Waker {
        self.inner.waker()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::buffer::AlignedBuf;
    use crate::device::MemDevice;

    #[test]
    fn faults_fail_the_nth_operation_of_their_kind_once() {
        let dev = FaultDevice::new(Arc::new(MemDevice::new(1 << 20)));
        super::super::conformance::run(&dev);
        let mut buf = AlignedBuf::zeroed(4096);
        dev.fail_nth(FaultKind::Read, 2);
        dev.read_at(&mut buf, 0).unwrap();
        let err = dev.read_at(&mut buf, 0).unwrap_err();
        assert!(matches!(err, DeviceError::Io { ref source, .. } if source.raw_os_error() == Some(libc::EIO)));
        dev.read_at(&mut buf, 0).unwrap();
        dev.fail_nth(FaultKind::Sync, 1);
        assert!(dev.sync().is_err());
        dev.sync().unwrap();
    }

    #[test]
    fn a_fault_in_one_part_fails_the_whole_queued_write_unwritten() {
        let mem = Arc::new(MemDevice::new(1 << 20));
        let dev = FaultDevice::new(Arc::clone(&mem) as Arc<dyn BlockDevice>);
        let mut parts: Vec<AlignedBuf> = (0..3).map(|_| AlignedBuf::zeroed(4096)).collect();
        parts.iter_mut().for_each(|p| p.fill(9));
        let mut q = dev.write_queue(8).unwrap();
        dev.fail_nth(FaultKind::Write, 2);
        let slices: Vec<&[u8]> = parts.iter().map(|p| &p[..]).collect();
        // SAFETY: the parts outlive the queue.
        unsafe { q.submit(1, &slices, 0).unwrap() };
        unsafe { q.submit(2, &slices[..1], 3 * 4096).unwrap() };
        let mut done = Vec::new();
        while q.in_flight() > 0 {
            q.poll(true, &mut done);
        }
        done.sort_by_key(|c| c.0);
        assert!(matches!(done[0], (1, Err(_))) && matches!(done[1], (2, Ok(()))));
        let mut r = AlignedBuf::zeroed(4 * 4096);
        mem.read_at(&mut r, 0).unwrap();
        assert!(r[..3 * 4096].iter().all(|&b| b == 0), "a failed write leaves nothing");
        assert!(r[3 * 4096..].iter().all(|&b| b == 9));
    }
}
