//! io_uring's write queue: the log writer's writes, many in flight on a ring of its own.
//!
//! One thread owns the queue and submits from it alone. A write of several parts is one
//! `writev`. While the writer waits for completions, a poll of an eventfd is in flight beside
//! them, so that a thread handing it new work can wake it by writing to the eventfd instead of
//! waiting for a write to finish. A poll, not a read: a read of an eventfd may be handed to a
//! kernel worker thread (a blocking one) or complete at once with EAGAIN on some kernels (a
//! non-blocking one); a poll does neither, and the counter is then drained with a plain read.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;

use io_uring::{opcode, types, IoUring};

use super::queue::{Completion, Waker, WriteQueue};
use super::DeviceError;

/// The user data of the eventfd read; tokens of writes are below it.
const WAKE: u64 = u64::MAX;

/// A write in flight: what the kernel reads (its iovecs) and what to report.
struct Flight {
    /// Kept until the completion: a `writev` reads its iovec array while it runs.
    _iovecs: Box<[libc::iovec]>,
    offset: u64,
    len: usize,
}

/// io_uring's [`WriteQueue`] on a volume file.
pub(super) struct UringQueue<'a> {
    ring: IoUring,
    /// The file registered with the ring as fixed file 0; borrowed so it outlives the queue.
    _file: &'a File,
    flights: HashMap<u64, Flight>,
    wake: Arc<OwnedFd>,
    /// Where draining the eventfd puts its counter.
    wake_buf: u64,
    wake_armed: bool,
}

// SAFETY: the raw pointers inside `flights` (iovecs) point at caller memory the `submit` contract
// keeps valid until completion, whichever thread holds the queue; nothing in the queue is tied to
// the thread that made it.
unsafe impl Send for UringQueue<'_> {}

impl<'a> UringQueue<'a> {
    /// A ring of `depth` writes (and the wake read) on `file`.
    pub(super) fn new(file: &'a File, depth: u32) -> std::io::Result<UringQueue<'a>> {
        let entries = depth.clamp(1, 4095).saturating_add(1).next_power_of_two();
        let ring = IoUring::new(entries)?;
        ring.submitter().register_files(&[file.as_raw_fd()])?;
        // SAFETY: eventfd has no memory arguments; a non-negative result is a new descriptor
        // that nothing else owns.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: fd was just created and is owned by nothing else.
        let wake = Arc::new(unsafe { OwnedFd::from_raw_fd(fd) });
        Ok(UringQueue { ring, _file: file, flights: HashMap::new(), wake, wake_buf: 0, wake_armed: false })
    }

    /// Puts one entry on the submission queue, flushing it to the kernel first if it is full.
    ///
    /// # Safety
    ///
    /// The memory the entry names must stay valid until its completion is reaped.
    unsafe fn push(&mut self, entry: &io_uring::squeue::Entry) -> std::io::Result<()> {
        // SAFETY: passed on from the caller.
        if unsafe { self.ring.submission().push(entry) }.is_ok() {
            return Ok(());
        }
        self.ring.submit()?;
        // SAFETY: as above.
        unsafe { self.ring.submission().push(entry) }
            .map_err(|_| std::io::Error::other("the io_uring submission queue is full"))
    }

    /// Takes every completion the ring holds.
    fn reap(&mut self, done: &mut Vec<Completion>) {
        let cqes: Vec<(u64, i32)> = self.ring.completion().map(|c| (c.user_data(), c.result())).collect();
        for (token, result) in cqes {
            if token == WAKE {
                self.wake_armed = false;
                // Reset the counter, so that the next poll waits for the next wake.
                // SAFETY: the descriptor is open (the queue owns it); the buffer is the queue's
                // 8 bytes. A read of an empty counter fails with EAGAIN, harmlessly.
                unsafe { libc::read(self.wake.as_raw_fd(), (&raw mut self.wake_buf).cast(), 8) };
                continue;
            }
            let Some(flight) = self.flights.remove(&token) else { continue };
            let fail = |source| DeviceError::Io { op: "write", offset: flight.offset, len: flight.len as u64, source };
            let outcome = if result < 0 {
                Err(fail(std::io::Error::from_raw_os_error(-result)))
            } else if result as usize != flight.len {
                let why = format!("short write: {result} of {} bytes", flight.len);
                Err(fail(std::io::Error::new(std::io::ErrorKind::WriteZero, why)))
            } else {
                Ok(())
            };
            done.push((token, outcome));
        }
    }
}

impl WriteQueue for UringQueue<'_> {
    unsafe fn submit(&mut self, token: u64, parts: &[&[u8]], offset: u64) -> Result<(), DeviceError> {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        let fail = |source| DeviceError::Io { op: "write", offset, len: len as u64, source };
        if token == WAKE || self.flights.contains_key(&token) {
            return Err(fail(std::io::Error::other("write token in use")));
        }
        let iovecs: Box<[libc::iovec]> =
            parts.iter().map(|p| libc::iovec { iov_base: p.as_ptr().cast_mut().cast(), iov_len: p.len() }).collect();
        let entry = match parts {
            [one] => opcode::Write::new(types::Fixed(0), one.as_ptr(), one.len() as u32).offset(offset).build(),
            _ => opcode::Writev::new(types::Fixed(0), iovecs.as_ptr(), iovecs.len() as u32).offset(offset).build(),
        }
        .user_data(token);
        // SAFETY: the parts stay valid until completion (this function's contract); the iovec
        // array lives in `flights` until the completion is reaped (and drop waits for it).
        unsafe { self.push(&entry) }.map_err(fail)?;
        self.flights.insert(token, Flight { _iovecs: iovecs, offset, len });
        Ok(())
    }

    fn poll(&mut self, block: bool, done: &mut Vec<Completion>) {
        let before = done.len();
        self.reap(done);
        if block && done.len() == before && !self.flights.is_empty() {
            if !self.wake_armed {
                let entry =
                    opcode::PollAdd::new(types::Fd(self.wake.as_raw_fd()), libc::POLLIN as u32).build().user_data(WAKE);
                // SAFETY: the poll names no memory; the eventfd lives as long as the queue, and
                // drop waits for the poll to complete.
                self.wake_armed = unsafe { self.push(&entry) }.is_ok();
            }
            // EINTR and other failures of the wait itself: return; the caller polls again.
            let _ = self.ring.submit_and_wait(1);
        } else {
            let _ = self.ring.submit();
        }
        self.reap(done);
    }

    fn in_flight(&self) -> usize {
        self.flights.len()
    }

    fn waker(&self) -> Waker {
        let fd = Arc::clone(&self.wake);
        Arc::new(move || {
            let one: u64 = 1;
            // SAFETY: the descriptor is kept open by the Arc; the buffer is 8 readable bytes.
            unsafe { libc::write(fd.as_raw_fd(), (&raw const one).cast(), 8) };
        })
    }
}

impl Drop for UringQueue<'_> {
    fn drop(&mut self) {
        // The kernel may still read the writes' memory, and the poll names the eventfd: wait
        // for all of it.
        let mut done = Vec::new();
        while !self.flights.is_empty() || self.wake_armed {
            if self.wake_armed {
                (self.waker())();
            }
            if self.ring.submit_and_wait(1).is_err() {
                std::thread::yield_now();
            }
            self.reap(&mut done);
        }
    }
}
