//! Injected I/O errors: [`Faults`] arms them, [`FaultDevice`] puts them in front of any device
//! (the io_uring and pread backends included), so error handling is tested on the real I/O path.

use std::sync::{Arc, Mutex};

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
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
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
}
