//! Direct reads: a raw block on the log read by the device straight into the caller's aligned
//! buffer, its header units and whole payload units in one batch of reads (the payload's last
//! partial unit, if any, through a one-unit engine buffer). No engine buffer holds the block and
//! there is no copy; the block is checked (crc32c, and blake3 with `verify_hash`) where it lies.
//!
//! A read is planned ([`Parts::plan_direct`]), its reads issued with others' by the caller
//! ([`DirectPlan::reads`], one `read_many` for one key or a whole batch), the payload's sums
//! taken as soon as it has arrived ([`PayloadSums`], while a batch's other reads are still in
//! flight), then checked ([`Parts::finish_direct`]). Anything unexpected makes the block unsuitable, and the caller
//! reads the record the ordinary way, which tells a race with reclaim from damage.

use std::sync::atomic::Ordering;
use std::time::Duration;

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;

use crate::block::BlockMeta;
use crate::buffer::PooledBuf;
use crate::index::{header_fp, ContentEntry};
use crate::options::ReadOptions;
use crate::parts::Parts;

/// Blocks at least this large are read by `get_into` straight into an aligned caller buffer.
/// Below it, one device read into an engine buffer and a copy cost less than the two or three
/// reads (header, payload, last partial unit) of a direct read.
pub const DIRECT_READ_MIN_BYTES: usize = 128 << 10;

/// The reads of one direct read, planned: where its parts lie and the engine buffers for the
/// header and the payload's last partial unit.
pub(super) struct DirectPlan {
    /// Where the record starts on the device.
    offset: u64,
    header_units: usize,
    /// The payload's whole units, read into the caller's buffer, and the bytes after them.
    body_len: usize,
    tail_len: usize,
    header: PooledBuf,
    tail: Option<PooledBuf>,
}

/// What is computed over a direct read's payload units (the bulk of its bytes) as soon as they
/// have arrived: their crc32c, and their blake3 state when the read verifies the hash.
pub(super) struct PayloadSums {
    crc: u32,
    hash: Option<blake3::Hasher>,
}

impl PayloadSums {
    /// The sums of `body`, the payload's whole units.
    pub(super) fn of(body: &[u8], verify_hash: bool) -> PayloadSums {
        let hash = verify_hash.then(|| {
            let mut hasher = blake3::Hasher::new();
            hasher.update(body);
            hasher
        });
        PayloadSums { crc: crc32c::crc32c(body), hash }
    }
}

impl DirectPlan {
    /// Which of [`DirectPlan::reads`] carries the payload's whole units.
    pub(super) const BODY_READ: usize = 1;

    /// The payload's whole units in `buf`, once read.
    pub(super) fn body<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        buf.get(..self.body_len).unwrap_or_default()
    }

    /// The device reads: the header into its buffer, the payload's whole units into `buf`
    /// (the buffer the plan was made for), and the last partial unit into its buffer.
    pub(super) fn reads<'a>(&'a mut self, buf: &'a mut [u8]) -> Vec<(&'a mut [u8], u64)> {
        let payload_at = self.offset + (self.header_units as u64) * UNIT_BYTES;
        let body = buf.get_mut(..self.body_len).unwrap_or_default();
        let mut reads: Vec<(&mut [u8], u64)> = vec![(&mut self.header[..], self.offset), (body, payload_at)];
        if let Some(t) = self.tail.as_mut() {
            reads.push((&mut t[..], payload_at + self.body_len as u64));
        }
        reads
    }
}

impl Parts {
    /// Plans a direct read of `entry`'s block into `buf`, or `None` when it cannot be read that
    /// way: a DRAM tier (which a read would fill), a small block, a buffer too short or not
    /// aligned to the device, or a record still being written.
    pub(super) fn plan_direct(&self, entry: &ContentEntry, buf: &[u8]) -> Option<DirectPlan> {
        let unit = UNIT_BYTES as usize;
        let raw = entry.raw_len as usize;
        let align = self.log.dev.capabilities().alignment as usize;
        // The record is header units then payload units; for an uncompressed block the payload
        // is exactly raw_len bytes, so the header's units follow from the entry.
        let header_units = (entry.units as usize).checked_sub(raw.div_ceil(unit)).filter(|&h| h >= 1)?;
        if self.tiers.dram.is_some()
            || raw < DIRECT_READ_MIN_BYTES
            || buf.len() < raw
            || !(buf.as_ptr() as usize).is_multiple_of(align)
            || !unit.is_multiple_of(align)
            || self.log.is_pending(&entry.record)
        {
            return None;
        }
        let (body_len, tail_len) = (raw / unit * unit, raw % unit);
        Some(DirectPlan {
            offset: self.log.sb.unit_offset(entry.record.segment, entry.record.unit),
            header_units,
            body_len,
            tail_len,
            header: self.pool.get(header_units * unit),
            tail: (tail_len > 0).then(|| self.pool.get(unit)),
        })
    }

    /// Checks a direct read whose reads are done: the block's description and length, or
    /// `None` if what was read is not the raw block `entry` names (read it the ordinary way).
    /// `buf` is the buffer the plan was made for, `sums` those of its payload units, and
    /// `load_time` how long its reads took.
    pub(super) fn finish_direct(
        &self,
        entry: &ContentEntry,
        plan: DirectPlan,
        buf: &mut [u8],
        sums: PayloadSums,
        opts: ReadOptions,
        load_time: Duration,
    ) -> Option<(BlockMeta, usize)> {
        let unit = UNIT_BYTES as usize;
        let raw = entry.raw_len as usize;
        let header = RecordHeader::decode(&plan.header).ok()?;
        let tail = plan.tail.as_ref().and_then(|t| t.get(..plan.tail_len)).unwrap_or_default();
        if header.kind != RecordKind::Block
            || header_fp(&header) != entry.fp
            || !header.compression.is_none()
            || header.stored_len != raw as u64
            || header.payload_offset() != (plan.header_units * unit) as u64
            || crc32c::crc32c_append(sums.crc, tail) != header.payload_crc
        {
            return None;
        }
        if opts.verify_hash {
            // (Sums taken without the hash, by a caller whose options differed: hash the body now.)
            let mut hasher = sums.hash.unwrap_or_else(|| {
                let mut hasher = blake3::Hasher::new();
                hasher.update(plan.body(buf));
                hasher
            });
            hasher.update(tail);
            if hasher.finalize().as_bytes() != &header.content_hash {
                return None;
            }
        }
        if let Some(dst) = buf.get_mut(plan.body_len..raw) {
            dst.copy_from_slice(tail);
        }
        self.tiers.ssd.hits.fetch_add(1, Ordering::Relaxed);
        self.tiers.ssd.hit_bytes.fetch_add(raw as u64, Ordering::Relaxed);
        self.tiers.ssd_latency.record(u64::from(entry.fp[0]), load_time);
        Some((BlockMeta::of(header, entry.record), raw))
    }

    /// Counts a get answered by a direct read and tells placement of the hit.
    pub(super) fn direct_hit(&self, namespace: &str, key: &str, meta: &BlockMeta, len: usize) {
        self.hit(namespace, key, meta);
        self.metrics.gets.fetch_add(1, Ordering::Relaxed);
        self.metrics.direct_reads.fetch_add(1, Ordering::Relaxed);
        self.metrics.count_get(Some(len as u64));
    }
}
