//! The log writer: the one thread that writes records to the device.
//!
//! Puts and the cleaner reserve records in log order (which fixes where each one goes), hand
//! them to the writer through the [`Handoff`], and wait for the written watermark (or, for a
//! buffered put, do not wait). The writer joins records that follow one another on the device
//! into one write of up to [`WriterConfig::request_bytes`], writes a larger record whole (split
//! only past [`WriterConfig::split_bytes`]), keeps up to
//! [`WriterConfig::in_flight_bytes`] in flight through the device's write queue, and marks each
//! record written as its write completes, in whatever order the device finishes them: the log's
//! watermark only moves over a prefix with nothing in flight, so an acknowledged record never
//! depends on an unwritten earlier one. A record split over several writes has its first unit
//! (header and echo) written last, once its other pieces completed: a crash in between leaves
//! no record that begins and does not check out, which recovery would take for damage after a
//! process crash and make its key a miss, losing the value before it. Where the device's writes
//! can be cut short by a process crash (buffered I/O,
//! [`crate::device::Capabilities::whole_writes`]), every record of more than one unit is split so,
//! and the writer thread copies that first unit into the page cache itself where the file system
//! can do it without waiting ([`crate::device::BlockDevice::write_now`]), instead of queueing it
//! behind the writes started since.
//!
//! No client thread does device I/O for a record: the device sees one submitter keeping many
//! writes in flight, as fio does, instead of each client's one write at a time.

mod handoff;
mod thread;

pub(crate) use handoff::Handoff;
pub(crate) use thread::spawn;

use std::sync::Arc;

use kvhoard_format::UNIT_BYTES;

use crate::buffer::PooledBuf;
use crate::index::KeyFp;
use crate::log::{Loc, Pos};

/// How the log writer uses the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriterConfig {
    /// Bytes of records the writer has taken and not yet written: the device's queue is kept
    /// this full (the writer takes another record while fewer are in flight, so by up to one
    /// record more). As many again may wait to be taken before a put waits to hand its records
    /// over; a put that does not wait hands over at once all the records one reservation made
    /// (at most a segment's worth), which bounds what is held for writing beyond the two.
    pub in_flight_bytes: u64,
    /// The largest write of records joined: records that follow one another on the device are
    /// joined into writes of up to this size. A larger record is a write of its own.
    pub request_bytes: usize,
    /// A record longer than this (and its header unit) is split into writes of this size, all
    /// in flight at once, and its first unit written once they completed. The default is
    /// [`WriterConfig::MAX_REQUEST_BYTES`]: a large direct write is split into the device's requests
    /// by the kernel, in flight at once, so splitting it here gains nothing, and waiting for the
    /// pieces before the first unit costs a put's latency (docs/benchmarks.md).
    pub split_bytes: usize,
}

impl WriterConfig {
    /// The largest write, whatever `request_bytes` says: its length must fit the kernel's.
    pub const MAX_REQUEST_BYTES: usize = 1 << 30;
}

impl Default for WriterConfig {
    /// Sized for NVMe: 32 writes of 2 MiB in flight, what fio needs to reach such a disk's
    /// sequential write speed (docs/benchmarks.md).
    fn default() -> Self {
        WriterConfig { in_flight_bytes: 64 << 20, request_bytes: 2 << 20, split_bytes: Self::MAX_REQUEST_BYTES }
    }
}

/// Writes in flight at most, whatever their size (the device queue's depth).
const MAX_WRITES_IN_FLIGHT: usize = 256;

/// Records in one write at most (an iovec each, two for a record whose first unit is written
/// last: its pending unit and the rest).
const MAX_RECORDS_PER_WRITE: usize = 64;

/// A reserved record on its way to the device.
#[derive(Debug)]
pub(crate) struct WriteJob {
    /// The record's bytes, header included, a whole number of units.
    pub(crate) buf: Arc<PooledBuf>,
    /// Where it goes.
    pub(crate) loc: Loc,
    /// The segment use it belongs to.
    pub(crate) seq: u64,
    /// Its key, taken out of the index again if the write fails.
    pub(crate) key: KeyFp,
}

impl WriteJob {
    /// The log position right after this record.
    pub(crate) fn end(&self) -> Pos {
        Pos { seq: self.seq, unit: self.loc.unit + self.units() }
    }

    fn units(&self) -> u32 {
        (self.buf.len() as u64 / UNIT_BYTES) as u32
    }
}
