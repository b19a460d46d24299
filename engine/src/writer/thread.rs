//! The writer thread: takes records from the handoff, joins neighbours into writes, keeps the
//! device queue full, and marks records written as their writes complete.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvhoard_format::record::Pending;

use super::handoff::Handoff;
use super::{WriteJob, WriterConfig, MAX_RECORDS_PER_WRITE, MAX_WRITES_IN_FLIGHT};
use crate::buffer::AlignedBuf;
use crate::device::{DeviceError, Immediate, WriteQueue};
use crate::error::Result;
use crate::log::Log;

/// Starts the writer. `failed` runs (under the log lock) for a record whose write failed,
/// before anyone waiting for it is woken: the store takes its key out of the index there.
pub(crate) fn spawn(
    handoff: Arc<Handoff>,
    log: Arc<Log>,
    config: WriterConfig,
    failed: impl Fn(&WriteJob) + Send + 'static,
) -> Result<JoinHandle<()>> {
    crate::thread::spawn("kvhoard-writer", move || run(&handoff, &log, config, &failed))
}

/// A record being written: its job, the writes it still waits for, and the first error.
struct Slot {
    job: WriteJob,
    /// Writes of the record not yet completed, `head` included.
    remaining: u32,
    error: Option<DeviceError>,
    /// The first unit (header and the header's echo) of a record split over several writes, or
    /// of any record of more than one unit on a device whose writes a process crash can cut
    /// short ([`Flights::cut`]), started only once every other piece has completed: until then
    /// nothing on the device names the record, so a crash in between leaves a record that never
    /// happened, never one that begins and does not check out (which recovery, after a process
    /// crash, must take for damage). Through the page cache the writer thread writes it itself
    /// where that takes no waiting, and queues it otherwise ([`Flights::complete`]).
    head: Option<Request>,
    /// What the record's (first) write carries in place of its first unit, when that unit is
    /// written last (`head`): it tells recovery how far the record it never got reaches.
    pending: Option<AlignedBuf>,
}

/// One write being built: consecutive records of one segment, or a piece of one record.
struct Request {
    offset: u64,
    /// (record id, byte range of its buffer).
    parts: Vec<(u64, std::ops::Range<usize>)>,
    bytes: usize,
    /// A record's first unit written last ([`Slot::head`]) and queued (a split record's, or a
    /// buffered one's the file system would have made wait): not counted in the bytes in flight, so
    /// that a unit waiting behind the next records' writes does not keep a record of the size
    /// left free by its pieces from starting.
    head: bool,
}

/// What the writer keeps between rounds.
struct Flights {
    slots: HashMap<u64, Slot>,
    /// Writes cut from the records taken, not yet started (the queue was full).
    queued: VecDeque<Request>,
    /// Each write in flight: the records it carries and the bytes it counts in `bytes`.
    writes: HashMap<u64, (Vec<u64>, usize)>,
    /// Bytes of the records taken and not yet written, queued or in flight: a first unit written
    /// last ([`Request::head`]) counts once, in the write that carries the pending unit in its
    /// place.
    bytes: u64,
    next_record: u64,
    next_write: u64,
    /// [`crate::device::Capabilities::whole_writes`] of the device.
    whole_writes: bool,
}

/// If the writer thread unwinds, nothing would ever complete the records handed to it: the log
/// is poisoned (waiters fail instead of waiting forever) and the handoff closed (senders too).
struct PanicGuard<'a> {
    handoff: &'a Handoff,
    log: &'a Log,
}

impl Drop for PanicGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.log.poison(&mut self.log.lock(), "the log writer thread panicked".into());
            self.handoff.close();
        }
    }
}

fn run(handoff: &Handoff, log: &Log, config: WriterConfig, failed: &dyn Fn(&WriteJob)) {
    let _guard = PanicGuard { handoff, log };
    let dev = Arc::clone(&log.dev);
    let mut flights = Flights {
        slots: HashMap::new(),
        queued: VecDeque::new(),
        writes: HashMap::new(),
        bytes: 0,
        next_record: 0,
        next_write: 0,
        whole_writes: dev.capabilities().whole_writes,
    };
    // Declared after `flights`, whose buffers the kernel reads, so that it is dropped first:
    // dropping a queue waits for every write in flight.
    let mut queue: Box<dyn WriteQueue + '_> = match dev.write_queue(MAX_WRITES_IN_FLIGHT as u32) {
        Ok(q) => q,
        Err(e) => {
            tracing::warn!(error = %e, "the device's write queue could not be set up; writing one record at a time");
            Box::new(Immediate::new(&*dev))
        }
    };
    let waker = queue.waker();
    let mut done = Vec::new();
    loop {
        let idle = queue.in_flight() == 0 && flights.queued.is_empty();
        let room = config.in_flight_bytes.saturating_sub(flights.bytes);
        let taken = handoff.take(room, idle);
        if taken.finished && idle {
            return;
        }
        let crowded = taken.crowded;
        flights.cut(taken.jobs, config, log);
        // Never more writes in flight than the queue was made for.
        while queue.in_flight() < MAX_WRITES_IN_FLIGHT {
            let Some(request) = flights.queued.pop_front() else { break };
            flights.submit(queue.as_mut(), request, log, failed);
        }
        if queue.in_flight() == 0 {
            continue;
        }
        // Wait for a completion while nothing new is waiting (a sender wakes the wait), or when
        // what waits cannot start until a write completes.
        let wait = crowded || !flights.queued.is_empty() || handoff.park(&waker);
        queue.poll(wait, &mut done);
        handoff.unpark();
        for (token, result) in done.drain(..) {
            flights.complete(token, result, log, failed);
        }
    }
}

impl Flights {
    /// Gives each job an id and slot, and cuts the jobs into writes queued to start: neighbours
    /// on the device joined, large records split.
    ///
    /// A record split over several writes, and, where the device's writes may be cut short by a
    /// process crash (buffered I/O, [`crate::device::Capabilities::whole_writes`]), any record
    /// of more than one unit, goes out with a [`Pending`] unit in place of its first unit (in its
    /// first write, joined with its neighbours as any other), and the first unit follows once
    /// the rest completed: a crash in between leaves a record that never happened, never one
    /// that begins and does not check out. A one-unit record is one page, which the page cache
    /// takes whole.
    fn cut(&mut self, mut jobs: Vec<WriteJob>, config: WriterConfig, log: &Log) {
        // Puts hand their records over in the order they get to it, not in log order: sorted,
        // records that follow one another on the device are next to each other, and join.
        jobs.sort_unstable_by_key(|j| (j.seq, j.loc.unit));
        // Pieces of a split record must stay unit-aligned for O_DIRECT, and a write's length
        // must fit the kernel's (a u32, and at most about 2 GiB at once).
        let unit = kvhoard_format::UNIT_BYTES as usize;
        let aligned = |bytes: usize| (bytes.min(WriterConfig::MAX_REQUEST_BYTES) / unit).max(1) * unit;
        let (max, split) = (aligned(config.request_bytes), aligned(config.split_bytes));
        let out = &mut self.queued;
        let mut tail: Option<(u32, u32)> = None; // (segment, unit) right after the last request
        for job in jobs {
            let id = self.next_record;
            self.next_record += 1;
            let len = job.buf.len();
            let offset = log.sb.unit_offset(job.loc.segment, job.loc.unit);
            let first_unit = || Request { offset, parts: vec![(id, 0..unit)], bytes: unit, head: true };
            // Writes of the record before its first unit (if that is written last).
            let mut writes = 0;
            let mut pending = None;
            let mut pending_unit = || {
                let mut mark = AlignedBuf::zeroed(unit);
                Pending { segment_seq: job.seq, units: job.units() }.encode_into(&mut mark);
                pending = Some(mark);
                first_unit()
            };
            let head = if len > split + unit {
                // Split: the pieces now, the first one with the pending unit in the first unit's
                // place, and the first unit when they are done. The first piece is submitted
                // before the others, and a direct write once submitted completes whole, so no
                // later piece is on the device without the pending unit; through the page cache,
                // io_uring runs writes to one file in the order given. (A record of `split_bytes`
                // of payload is one write with its header unit, not a full write and a lone unit
                // after it.)
                let mut at = 0;
                while at < len {
                    let n = split.min(len - at);
                    out.push_back(Request {
                        offset: offset + at as u64,
                        parts: vec![(id, at..at + n)],
                        bytes: n,
                        head: false,
                    });
                    self.bytes += n as u64;
                    at += n;
                    writes += 1;
                }
                Some(pending_unit())
            } else {
                let follows = tail == Some((job.loc.segment, job.loc.unit));
                match out.back_mut() {
                    Some(last) if follows && last.bytes + len <= max && last.parts.len() < MAX_RECORDS_PER_WRITE => {
                        last.parts.push((id, 0..len));
                        last.bytes += len;
                    }
                    _ => out.push_back(Request { offset, parts: vec![(id, 0..len)], bytes: len, head: false }),
                }
                self.bytes += len as u64;
                writes += 1;
                (!self.whole_writes && len > unit).then(pending_unit)
            };
            tail = Some((job.loc.segment, job.loc.unit + job.units()));
            let remaining = writes + u32::from(head.is_some());
            self.slots.insert(id, Slot { job, remaining, error: None, head, pending });
        }
    }

    /// Starts one write; a write the queue refuses completes at once, failed.
    fn submit(&mut self, queue: &mut dyn WriteQueue, request: Request, log: &Log, failed: &dyn Fn(&WriteJob)) {
        let token = self.next_write;
        self.next_write += 1;
        let ids: Vec<u64> = request.parts.iter().map(|(id, _)| *id).collect();
        let unit = kvhoard_format::UNIT_BYTES as usize;
        let mut parts: Option<Vec<&[u8]>> = Some(Vec::with_capacity(request.parts.len() * 2));
        for (id, range) in &request.parts {
            let Some(list) = parts.as_mut() else { break };
            let Some(slot) = self.slots.get(id) else {
                parts = None;
                break;
            };
            // A record whose first unit waits for this write ([`Flights::cut`]): its pending
            // unit in that unit's place.
            let from = match &slot.pending {
                Some(mark) if range.start == 0 && !request.head => {
                    list.push(mark);
                    unit
                }
                _ => range.start,
            };
            match slot.job.buf.get(from..range.end) {
                Some(bytes) => list.push(bytes),
                None => parts = None,
            }
        }
        self.writes.insert(token, (ids, if request.head { 0 } else { request.bytes }));
        let Some(parts) = parts else {
            // Cannot happen (every part was cut from a slot's buffer); a write missing a part
            // would put the rest at the wrong offsets, so it fails instead.
            let why = std::io::Error::other("a record of the write went missing");
            let e = DeviceError::Io { op: "write", offset: request.offset, len: request.bytes as u64, source: why };
            return self.complete(token, Err(e), log, failed);
        };
        // SAFETY: every part is a range of a record buffer held (by an Arc in its slot) or the
        // slot's pending unit, both kept until the record's last write has completed and not
        // changed after `cut`; the queue is dropped before the slots (see `run`).
        let started = unsafe { queue.submit(token, &parts, request.offset) };
        if let Err(e) = started {
            self.complete(token, Err(e), log, failed);
        }
    }

    /// A write completed: the records it carried that wait for nothing more are done.
    fn complete(&mut self, token: u64, result: Result<(), DeviceError>, log: &Log, failed: &dyn Fn(&WriteJob)) {
        let Some((ids, bytes)) = self.writes.remove(&token) else { return };
        self.bytes = self.bytes.saturating_sub(bytes as u64);
        let error = result.err();
        for id in ids {
            let Some(slot) = self.slots.get_mut(&id) else { continue };
            slot.remaining = slot.remaining.saturating_sub(1);
            if slot.error.is_none() {
                // Every record of a failed write fails with it.
                slot.error = error.as_ref().map(same_error);
            }
            if slot.remaining == 1 {
                if let Some(head) = slot.head.take() {
                    match (&slot.error, self.whole_writes) {
                        (None, true) => {
                            // Every other piece is on the device: the header may go now, first.
                            self.queued.push_front(head);
                            continue;
                        }
                        (None, false) => {
                            // Through the page cache, written here and now if that takes no
                            // waiting: queued, the unit would wait behind the writes started
                            // since (io_uring's workers may run buffered writes to one file one
                            // at a time), and the put with it. Where it would wait (the file's
                            // lock, dirty-page throttling), it is queued: this thread must not
                            // stop reaping completions.
                            let written = match slot.job.buf.get(..head.bytes) {
                                Some(unit) => log.dev.write_now(unit, head.offset),
                                None => Some(Err(DeviceError::Io {
                                    op: "write",
                                    offset: head.offset,
                                    len: head.bytes as u64,
                                    source: std::io::Error::other("a record's first unit went missing"),
                                })),
                            };
                            let Some(written) = written else {
                                self.queued.push_front(head);
                                continue;
                            };
                            slot.error = written.err();
                        }
                        // A piece failed: the header is never written, and the record fails.
                        (Some(_), _) => {}
                    }
                    slot.remaining = 0;
                }
            }
            if slot.remaining > 0 {
                continue;
            }
            let Some(slot) = self.slots.remove(&id) else { continue };
            let outcome = match slot.error {
                Some(e) => Err(e),
                None => Ok(()),
            };
            log.record_written(slot.job.loc, slot.job.seq, &outcome, || failed(&slot.job));
        }
    }
}

/// The same device error again, for another record of the same failed write.
fn same_error(e: &DeviceError) -> DeviceError {
    match e {
        DeviceError::Io { op, offset, len, source } => DeviceError::Io {
            op,
            offset: *offset,
            len: *len,
            source: match source.raw_os_error() {
                Some(code) => std::io::Error::from_raw_os_error(code),
                None => std::io::Error::new(source.kind(), source.to_string()),
            },
        },
        other => DeviceError::Io { op: "write", offset: 0, len: 0, source: std::io::Error::other(other.to_string()) },
    }
}
