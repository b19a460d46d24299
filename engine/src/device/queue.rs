//! Write queues: how the log writer keeps many writes in flight on one device from one thread.
//!
//! The log writer submits a write, goes on submitting more, and learns later which completed.
//! A backend that can keep writes in flight (io_uring) gives its own queue; every other backend
//! gets [`Immediate`], which writes at submission through [`BlockDevice::write_at`], so the fault
//! injection and crash simulation of the test devices apply to the log writer unchanged.

use std::sync::Arc;

use super::{BlockDevice, DeviceError};

/// A write's completion: the token it was submitted with, and how it ended.
pub type Completion = (u64, Result<(), DeviceError>);

/// Ends a blocking [`WriteQueue::poll`] early; callable from any thread, any number of times.
pub type Waker = Arc<dyn Fn() + Send + Sync>;

/// Writes kept in flight by one thread.
///
/// Dropping a queue waits for every write still in flight, so the kernel never reads memory
/// after its owner may have freed it.
pub trait WriteQueue: Send {
    /// Starts writing `parts`, one after another on the device from `offset`, as one write
    /// known by `token`. An error means the write was not started (and no completion comes).
    ///
    /// # Safety
    ///
    /// The memory of every part must stay valid and unchanged until `poll` has returned this
    /// token's completion or the queue has been dropped.
    unsafe fn submit(&mut self, token: u64, parts: &[&[u8]], offset: u64) -> Result<(), DeviceError>;

    /// Hands what was submitted to the device and appends the writes that completed to `done`.
    /// With `block`, waits until at least one completes or the waker is called, if any is in
    /// flight.
    fn poll(&mut self, block: bool, done: &mut Vec<Completion>);

    /// Writes submitted whose completion `poll` has not returned yet.
    fn in_flight(&self) -> usize;

    /// What another thread calls to end a blocking `poll` early.
    fn waker(&self) -> Waker;
}

/// The queue of a backend that writes synchronously: each write is done by `submit`.
pub struct Immediate<'a, D: ?Sized> {
    dev: &'a D,
    done: Vec<Completion>,
}

impl<'a, D: BlockDevice + ?Sized> Immediate<'a, D> {
    /// A queue writing through `dev.write_at`.
    pub fn new(dev: &'a D) -> Immediate<'a, D> {
        Immediate { dev, done: Vec::new() }
    }
}

impl<D: BlockDevice + ?Sized> WriteQueue for Immediate<'_, D> {
    unsafe fn submit(&mut self, token: u64, parts: &[&[u8]], offset: u64) -> Result<(), DeviceError> {
        let mut at = offset;
        let mut result = Ok(());
        for part in parts {
            // The first failure fails the whole write: the parts after it are not attempted.
            result = self.dev.write_at(part, at);
            if result.is_err() {
                break;
            }
            at += part.len() as u64;
        }
        self.done.push((token, result));
        Ok(())
    }

    fn poll(&mut self, _block: bool, done: &mut Vec<Completion>) {
        done.append(&mut self.done);
    }

    fn in_flight(&self) -> usize {
        self.done.len()
    }

    fn waker(&self) -> Waker {
        // Nothing ever waits in `poll`.
        Arc::new(|| {})
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use crate::buffer::AlignedBuf;
    use crate::device::{FaultDevice, FaultKind, MemDevice};

    #[test]
    fn immediate_writes_parts_in_order_and_reports_failures() {
        let mem = Arc::new(MemDevice::new(1 << 20));
        let faults = FaultDevice::new(Arc::clone(&mem) as Arc<dyn BlockDevice>);
        let mut a = AlignedBuf::zeroed(4096);
        a.fill(1);
        let mut b = AlignedBuf::zeroed(8192);
        b.fill(2);
        let mut q = Immediate::new(&faults);
        // SAFETY: a and b outlive the queue.
        unsafe { q.submit(7, &[&a, &b], 4096).unwrap() };
        let mut done = Vec::new();
        q.poll(true, &mut done);
        assert_eq!(done.len(), 1);
        assert!(matches!(done[0], (7, Ok(()))));
        let mut r = AlignedBuf::zeroed(12288);
        mem.read_at(&mut r, 4096).unwrap();
        assert!(r[..4096].iter().all(|&x| x == 1) && r[4096..].iter().all(|&x| x == 2));
        faults.fail_nth(FaultKind::Write, 1);
        // SAFETY: as above.
        unsafe { q.submit(8, &[&a, &b], 0).unwrap() };
        done.clear();
        q.poll(false, &mut done);
        assert!(matches!(done[0], (8, Err(_))));
        assert_eq!(q.in_flight(), 0);
    }
}
