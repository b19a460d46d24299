//! The io_uring backend: O_DIRECT reads and writes through a few rings, each request split into
//! chunks that are all in flight at once.
//!
//! A ring is used by one request at a time (it sits behind a mutex); several rings let several
//! threads do I/O in parallel. The file is registered with every ring (fixed file 0), saving the
//! kernel a file-table lookup per request. Every request waits for all the completions of what it
//! submitted before it returns, even when one of them failed, so the kernel never touches a
//! caller's buffer after the call has returned.

use std::fs::{File, OpenOptions};
use std::os::fd::AsRawFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;

use io_uring::{opcode, types, IoUring};
use kvhoard_format::UNIT_BYTES;

use super::file::device_size;
use super::queue::WriteQueue;
use super::uring_queue::UringQueue;
use super::{check_request, BlockDevice, Capabilities, DeviceError};

/// What `read_many_each` is handed back of each read that has completed: its index and buffer,
/// the caller's for `'a`.
type Told<'c, 'a> = &'c mut dyn FnMut(usize, &'a mut [u8]);

/// Tuning of the io_uring backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UringConfig {
    /// Rings, i.e. requests served in parallel.
    pub rings: usize,
    /// Submission queue entries per ring: chunks of one request in flight at once.
    pub queue_depth: u32,
    /// Size of each chunk a request is split into.
    pub chunk_bytes: usize,
}

impl Default for UringConfig {
    fn default() -> Self {
        UringConfig { rings: 8, queue_depth: 32, chunk_bytes: 512 << 10 }
    }
}

/// A volume file or block device accessed through io_uring.
pub struct UringDevice {
    file: File,
    capacity: u64,
    direct_io: bool,
    /// The machine's boot when the device was opened.
    boot: u64,
    rings: Vec<Mutex<IoUring>>,
    next: AtomicUsize,
    config: UringConfig,
    /// The file system refused a buffered write without waiting (`RWF_NOWAIT`, EOPNOTSUPP on
    /// ext4): [`BlockDevice::write_now`] stops asking.
    no_nowait: AtomicBool,
}

impl std::fmt::Debug for UringDevice {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UringDevice").field("capacity", &self.capacity).field("config", &self.config).finish()
    }
}

#[derive(Clone, Copy)]
enum Op {
    Read,
    Write,
}

impl UringDevice {
    /// Opens `path` for io_uring I/O. Fails (so the caller can fall back to pread) when the
    /// kernel does not offer io_uring or refuses it.
    pub fn open(path: &Path, direct_io: bool, config: UringConfig) -> std::io::Result<UringDevice> {
        let open = |flags: i32| OpenOptions::new().read(true).write(true).custom_flags(flags).open(path);
        let (file, direct_io) = match (direct_io, open(libc::O_DIRECT)) {
            (true, Ok(f)) => (f, true),
            (true, Err(e)) if e.raw_os_error() == Some(libc::EINVAL) => (open(0)?, false),
            (true, Err(e)) => return Err(e),
            (false, _) => (open(0)?, false),
        };
        let capacity = device_size(&file)?;
        let config = UringConfig {
            rings: config.rings.max(1),
            queue_depth: config.queue_depth.clamp(1, 4096).next_power_of_two(),
            chunk_bytes: (config.chunk_bytes.max(UNIT_BYTES as usize) / UNIT_BYTES as usize) * UNIT_BYTES as usize,
        };
        let mut rings = Vec::with_capacity(config.rings);
        for _ in 0..config.rings {
            let ring = IoUring::new(config.queue_depth)?;
            ring.submitter().register_files(&[file.as_raw_fd()])?;
            rings.push(Mutex::new(ring));
        }
        Ok(UringDevice {
            file,
            capacity,
            direct_io,
            boot: super::host_boot(),
            rings,
            next: AtomicUsize::new(0),
            config,
            no_nowait: AtomicBool::new(false),
        })
    }

    /// Runs one request: the ranges `parts` (memory, length, device offset), split into chunks
    /// that are all in flight at once up to the queue depth. `done(i, buf)`, if given, is handed
    /// each part whose chunks have all completed, after the ring has been refilled, so that the
    /// caller's work on it overlaps the reads still in flight.
    ///
    /// If `done` panics, nothing more is queued, everything in flight is waited for, and the
    /// panic then continues: the kernel never writes into memory after the call has ended.
    ///
    /// # Safety
    ///
    /// Every part's pointer must be non-null (as a slice's is, even an empty one) and valid for
    /// reads (Write) or writes (Read) of its length for the whole call, the parts must not
    /// overlap, and nothing else may access that memory during the call. With `done` (reads
    /// only), each part's memory must moreover be valid for writes and not otherwise accessed
    /// for `'a`: it is handed to `done` as a `&'a mut [u8]`.
    unsafe fn run<'a>(
        &self,
        op: Op,
        parts: &[(*mut u8, usize, u64)],
        mut done: Option<Told<'_, 'a>>,
    ) -> Result<(), DeviceError> {
        let name = match op {
            Op::Read => "read",
            Op::Write => "write",
        };
        let first = parts.first().map_or(0, |p| p.2);
        let total: usize = parts.iter().map(|p| p.1).sum();
        let fail = |source: std::io::Error| DeviceError::Io { op: name, offset: first, len: total as u64, source };
        let start = self.next.fetch_add(1, Ordering::Relaxed);
        // Prefer a free ring; wait for one only if all are busy.
        let mut ring = (0..self.rings.len())
            .find_map(|i| self.rings.get((start + i) % self.rings.len()).and_then(|m| m.try_lock().ok()))
            .or_else(|| self.rings.get(start % self.rings.len()).map(|m| m.lock().unwrap_or_else(|e| e.into_inner())))
            .ok_or_else(|| fail(std::io::Error::other("no io_uring ring")))?;
        let chunk = self.config.chunk_bytes;
        // (memory, length, device offset, part) of every chunk of every part.
        let chunks: Vec<(*mut u8, usize, u64, usize)> = parts
            .iter()
            .enumerate()
            .flat_map(|(part, &(ptr, len, offset))| {
                (0..len.div_ceil(chunk)).map(move |i| {
                    let at = i * chunk;
                    // SAFETY: at < len, so the pointer stays inside the part's memory.
                    (unsafe { ptr.add(at) }, chunk.min(len - at), offset + at as u64, part)
                })
            })
            .collect();
        // Chunks of each part not yet completed, and the parts completed but not yet told.
        let mut remaining: Vec<usize> = parts.iter().map(|p| p.1.div_ceil(chunk)).collect();
        // An empty part has no chunk to wait for: it is complete from the start.
        let mut finished: Vec<usize> = match done {
            Some(_) => remaining.iter().enumerate().filter(|(_, &n)| n == 0).map(|(i, _)| i).collect(),
            None => Vec::new(),
        };
        let mut next_chunk = 0usize;
        let mut in_flight = 0usize;
        let mut first_error: Option<DeviceError> = None;
        let mut panicked: Option<Box<dyn std::any::Any + Send>> = None;
        while next_chunk < chunks.len() || in_flight > 0 || !finished.is_empty() {
            // Queue as many chunks as fit, unless something already failed.
            while first_error.is_none() && in_flight < self.config.queue_depth as usize {
                let Some(&(p, n, at, _)) = chunks.get(next_chunk) else { break };
                let entry = match op {
                    Op::Read => opcode::Read::new(types::Fixed(0), p, n as u32).offset(at).build(),
                    Op::Write => opcode::Write::new(types::Fixed(0), p, n as u32).offset(at).build(),
                }
                .user_data(next_chunk as u64);
                // SAFETY: the entry's buffer is the caller's, valid until this function returns,
                // and this function does not return before the entry's completion is reaped.
                if unsafe { ring.submission().push(&entry) }.is_err() {
                    break;
                }
                next_chunk += 1;
                in_flight += 1;
            }
            if !finished.is_empty() {
                // Start what was just queued, then work on the finished parts meanwhile. Only to
                // start it early: the wait below submits it too, and reports what fails.
                if !ring.submission().is_empty() {
                    let _ = ring.submit();
                }
                for part in finished.drain(..) {
                    if let (None, Some(done), Some(&(ptr, len, _))) = (&first_error, done.as_mut(), parts.get(part)) {
                        // SAFETY: every chunk of this part has completed and chunks are never
                        // submitted twice, so the kernel no longer writes to it, and this
                        // function never touches the part again (each part is in `finished`
                        // once: its count of chunks left reaches 0 once); parts do not overlap,
                        // so the chunks still in flight write elsewhere; the pointer is non-null
                        // and, by this function's contract, valid and not otherwise accessed
                        // for `'a`, so the one `&'a mut` made of it is unique.
                        let bytes: &'a mut [u8] = unsafe { std::slice::from_raw_parts_mut(ptr, len) };
                        if let Err(payload) = tell(&mut **done, part, bytes) {
                            // Stop queueing and wait out what is in flight before unwinding.
                            first_error
                                .get_or_insert(fail(std::io::Error::other("the caller's check of a read panicked")));
                            panicked = Some(payload);
                        }
                    }
                }
                continue;
            }
            if in_flight == 0 {
                break;
            }
            if let Err(e) = ring.submit_and_wait(1) {
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                // Submission failed: nothing more can be reaped safely except what completed.
                first_error.get_or_insert(fail(e));
            }
            let mut reaped = 0;
            for cqe in ring.completion() {
                reaped += 1;
                let index = cqe.user_data() as usize;
                let (expected, part) = chunks.get(index).map_or((0, usize::MAX), |c| (c.1, c.3));
                let result = cqe.result();
                if result < 0 {
                    first_error.get_or_insert(fail(std::io::Error::from_raw_os_error(-result)));
                } else if result as usize != expected {
                    let why = format!("short {name}: {result} of {expected} bytes at chunk {index}");
                    first_error.get_or_insert(fail(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, why)));
                } else if let Some(left) = remaining.get_mut(part) {
                    *left -= 1;
                    if *left == 0 && done.is_some() {
                        finished.push(part);
                    }
                }
            }
            in_flight -= reaped;
            if reaped == 0 && first_error.is_some() {
                // The ring itself failed; entries may still be in the kernel. Waiting is the only
                // safe thing to do with the caller's buffer.
                while in_flight > 0 {
                    if ring.submit_and_wait(1).is_err() {
                        std::thread::yield_now();
                    }
                    in_flight -= ring.completion().count();
                }
            }
        }
        if let Some(payload) = panicked {
            std::panic::resume_unwind(payload);
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(()),
        }
    }
}

/// Hands a completed read's buffer to `done`, catching a panic so that the caller can wait out
/// the reads still in flight before it unwinds.
fn tell<'a>(done: &mut dyn FnMut(usize, &'a mut [u8]), part: usize, bytes: &'a mut [u8]) -> std::thread::Result<()> {
    let mut bytes = Some(bytes);
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| bytes.take().map_or((), |b| done(part, b))))
}

impl BlockDevice for UringDevice {
    fn boot(&self) -> u64 {
        self.boot
    }

    fn capacity_bytes(&self) -> u64 {
        self.capacity
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> Result<(), DeviceError> {
        check_request("read", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        // SAFETY: buf is an exclusive borrow for the whole call.
        unsafe { self.run(Op::Read, &[(buf.as_mut_ptr(), buf.len(), offset)], None) }
    }

    fn read_many(&self, reads: &mut [(&mut [u8], u64)]) -> Result<(), DeviceError> {
        for (buf, offset) in reads.iter() {
            check_request("read", *offset, buf.len(), self.capacity, UNIT_BYTES)?;
        }
        let parts: Vec<(*mut u8, usize, u64)> =
            reads.iter_mut().map(|(buf, offset)| (buf.as_mut_ptr(), buf.len(), *offset)).collect();
        // SAFETY: each buffer is a distinct exclusive borrow (so they do not overlap), held for
        // the whole call.
        unsafe { self.run(Op::Read, &parts, None) }
    }

    fn read_many_each<'a>(
        &self,
        reads: Vec<(&'a mut [u8], u64)>,
        done: &mut dyn FnMut(usize, &'a mut [u8]),
    ) -> Result<(), DeviceError> {
        for (buf, offset) in reads.iter() {
            check_request("read", *offset, buf.len(), self.capacity, UNIT_BYTES)?;
        }
        // The borrows are consumed here: for `'a` their memory is reached only through these
        // pointers, by the kernel and then by `done`.
        let parts: Vec<(*mut u8, usize, u64)> =
            reads.into_iter().map(|(buf, offset)| (buf.as_mut_ptr(), buf.len(), offset)).collect();
        // SAFETY: each buffer is a distinct exclusive borrow for `'a` (so they do not overlap,
        // and nothing else accesses them until `'a` ends), which outlives the call.
        unsafe { self.run(Op::Read, &parts, Some(done)) }
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> Result<(), DeviceError> {
        check_request("write", offset, buf.len(), self.capacity, UNIT_BYTES)?;
        if !self.direct_io {
            // Through the page cache a write is the copy into it, done by whoever runs it. A
            // ring punts a buffered write that would block to its kernel workers, which run the
            // writes to one file one at a time, so a small write waits behind every large one
            // the log writer's queue has started; a plain pwrite waits for the file's lock only.
            use std::os::unix::fs::FileExt;
            return self.file.write_all_at(buf, offset).map_err(|source| DeviceError::Io {
                op: "write",
                offset,
                len: buf.len() as u64,
                source,
            });
        }
        // SAFETY: the kernel only reads through the pointer of a Write; buf is borrowed for the
        // whole call.
        unsafe { self.run(Op::Write, &[(buf.as_ptr().cast_mut(), buf.len(), offset)], None) }
    }

    fn write_now(&self, buf: &[u8], offset: u64) -> Option<Result<(), DeviceError>> {
        if self.direct_io || self.no_nowait.load(Ordering::Relaxed) {
            return None;
        }
        if let Err(e) = check_request("write", offset, buf.len(), self.capacity, UNIT_BYTES) {
            return Some(Err(e));
        }
        let iov = libc::iovec { iov_base: buf.as_ptr().cast_mut().cast(), iov_len: buf.len() };
        let at = libc::off_t::try_from(offset).ok()?;
        // SAFETY: `iov` describes `buf`, borrowed for the whole call, which the kernel only reads
        // (a write); the count is 1, matching the one iovec.
        let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, at, libc::RWF_NOWAIT) };
        if usize::try_from(n).is_ok_and(|n| n == buf.len()) {
            return Some(Ok(()));
        }
        let io = |source| DeviceError::Io { op: "write", offset, len: buf.len() as u64, source };
        if let Some(rest) = usize::try_from(n).ok().and_then(|n| buf.get(n..).map(|rest| (n, rest))) {
            // Part copied without waiting: the rest at once, so that no torn unit stays in the
            // page cache (a process killed then would leave a record that begins and does not
            // check out). Its pages are the same unit's, already cached.
            let (n, rest) = rest;
            use std::os::unix::fs::FileExt;
            return Some(self.file.write_all_at(rest, offset + n as u64).map_err(io));
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            // This kernel or file system cannot say (EOPNOTSUPP, ENOSYS, EINVAL) or a sandbox
            // forbids it (EPERM): never again, written another way.
            Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL | libc::EPERM) => {
                self.no_nowait.store(true, Ordering::Relaxed);
                None
            }
            // It would wait, or a signal came first: written another way this time.
            Some(libc::EAGAIN | libc::EINTR) => None,
            _ => Some(Err(io(e))),
        }
    }

    fn sync(&self) -> Result<(), DeviceError> {
        self.file.sync_data().map_err(|source| DeviceError::Io { op: "sync", offset: 0, len: 0, source })
    }

    fn write_queue(&self, depth: u32) -> std::io::Result<Box<dyn WriteQueue + '_>> {
        Ok(Box::new(UringQueue::new(&self.file, depth)?))
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities::of_file("io_uring", self.direct_io)
    }
}
