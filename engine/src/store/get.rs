//! Reads: get (into an engine buffer or the caller's), contains, the description of a block, and
//! a block by its content hash.
//!
//! A get takes the index's read lock for one lookup and nothing else. The block comes from the
//! DRAM tier when it holds a copy, from the record's pending buffer while it is being written,
//! or from the log (one aligned read of the whole record, or, for large blocks and an aligned
//! caller buffer, straight into that buffer). Every byte read from the log is checked against
//! the record's crc32c (blake3 too with `verify_hash`); a damaged block is a counted miss.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_format::record::{validate_key, validate_namespace, RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;

use super::decode::{Decoding, Dropped};
use super::direct::PayloadSums;
use super::Store;
use crate::block::{Block, BlockMeta, Bytes};
use crate::codec::stored_codec;
use crate::error::{Result, StoreError};
use crate::index::{bytes_prefix, content_fp, header_fp, is_expired, key_fp, ContentEntry, KeyFp};
use crate::log::scan::check_payload;
use crate::options::ReadOptions;
use crate::parts::Parts;
use crate::placement::group_ttl::Access;
use crate::placement::{context_of, BlockInfo};
use crate::tier::DramRead;

/// What [`Store::get_resident`] found.
#[derive(Debug)]
#[expect(clippy::large_enum_variant, reason = "returned once, never stored: boxing would cost an allocation per hit")]
pub enum Resident {
    /// The block, from memory.
    Block(Block),
    /// No such key (or it expired).
    Absent,
    /// The key exists but its block must be read from the device: call [`Store::get`].
    OnDevice,
}

impl Store {
    /// The block stored under `key`, or `None` if there is none (never stored, deleted, expired,
    /// evicted, or damaged: a damaged block is logged and counted in `stats().read_errors`).
    pub fn get(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Option<Block>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let parts = &self.parts;
        parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
        let kfp = key_fp(namespace, key);
        let lookup = || parts.live_content(&kfp);
        let frame = match lookup() {
            Some(entry) => parts.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry))?,
            None => None,
        };
        parts.finish_get(namespace, key, frame, opts)
    }

    /// A get that never waits for the device, for callers that must not block (an async server
    /// answers these on its network thread and sends only [`Resident::OnDevice`] keys to a
    /// thread that may block on [`Store::get`]).
    pub fn get_resident(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Resident> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let parts = &self.parts;
        let Some(entry) = parts.live_content(&key_fp(namespace, key)) else {
            parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
            parts.metrics.count_get(None);
            return Ok(Resident::Absent);
        };
        // Decoding is work for a thread that may take its time: get() does it, and counts the
        // hit then (not twice).
        if parts.tiers.peek_meta(&entry.fp, entry.record).is_some_and(|m| !m.compression.is_none()) {
            return Ok(Resident::OnDevice);
        }
        match parts.dram_hit(&entry, opts) {
            // Raced with a replacement: as above.
            Some(block) if !block.meta.compression.is_none() => Ok(Resident::OnDevice),
            Some(block) => {
                parts.hit(namespace, key, &block.meta);
                parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
                parts.metrics.count_get(Some(block.len() as u64));
                Ok(Resident::Block(block))
            }
            // Counted by the get that follows.
            None => Ok(Resident::OnDevice),
        }
    }

    /// The description of the block under `key` (size, hash, times, codec), or `None` on a
    /// miss. Reads only the record's header (one 4 KiB unit, usually), never the payload;
    /// served from memory when the block is in the DRAM tier or not yet written.
    pub fn meta(&self, namespace: &str, key: &str) -> Result<Option<BlockMeta>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let parts = &self.parts;
        let Some(entry) = parts.live_content(&key_fp(namespace, key)) else { return Ok(None) };
        let loc = entry.record;
        if let Some(meta) = parts.tiers.peek_meta(&entry.fp, loc) {
            return Ok(Some(meta));
        }
        let header = match parts.log.pending_record(&loc) {
            Some(buf) => RecordHeader::decode(&buf),
            None => parts.read_header(&entry)?,
        };
        match header {
            Ok(h) if h.kind == RecordKind::Block && header_fp(&h) == entry.fp => Ok(Some(BlockMeta::of(h, loc))),
            // Raced with reclaim, or damaged: get() tells which (and counts damage).
            _ => Ok(self.get(namespace, key, ReadOptions::default())?.map(|b| b.meta)),
        }
    }

    /// Whether the block `meta` describes (from [`Store::meta`] or a get) in `namespace` is held
    /// by the DRAM tier.
    pub fn in_dram(&self, namespace: &str, meta: &BlockMeta) -> bool {
        let cfp = content_fp(namespace, &meta.content_hash, &meta.desc, &meta.compression);
        let loc = {
            let index = self.parts.index_read();
            index.content_slot(&cfp).and_then(|s| index.content(s)).map(|c| c.record)
        };
        loc.is_some_and(|loc| self.parts.tiers.holds(&cfp, loc))
    }

    /// Reads the block under `key` into `buf` and returns its description and the number of
    /// bytes written, or `None` on a miss; fails with [`StoreError::BufferTooSmall`] if `buf` is
    /// shorter than the block.
    ///
    /// A block of at least [`DIRECT_READ_MIN_BYTES`] that is on the log (not in the DRAM tier or
    /// still being written) is read by the device straight into `buf` when `buf` is aligned to
    /// the device (4 KiB; page-aligned allocations are): no engine buffer holds it and there is
    /// no copy, and `buf` is checked (crc32c, and blake3 with `verify_hash`) where it lies. On a
    /// miss or an error, `buf`'s contents are unspecified.
    pub fn get_into(
        &self,
        namespace: &str,
        key: &str,
        buf: &mut [u8],
        opts: ReadOptions,
    ) -> Result<Option<(BlockMeta, usize)>> {
        validate_namespace(namespace)?;
        validate_key(key)?;
        self.parts.ensure_open()?;
        let parts = &self.parts;
        if let Some(entry) = parts.live_content(&key_fp(namespace, key)) {
            if let Some(mut plan) = parts.plan_direct(&entry, buf) {
                let started = Instant::now();
                parts.log.dev.read_many(&mut plan.reads(buf))?;
                let load_time = started.elapsed();
                parts.tiers.speeds.log_read(1, entry.record_bytes(), load_time);
                let sums = PayloadSums::of(plan.body(buf), opts.verify_hash);
                if let Some((meta, len)) = parts.finish_direct(&entry, plan, buf, sums, opts, load_time) {
                    parts.direct_hit(namespace, key, &meta, len);
                    return Ok(Some((meta, len)));
                }
            }
        }
        // Small, cached, pending, unaligned, compressed, or not what the index said (a race with
        // reclaim, or damage, which `get` tells apart): through an engine buffer.
        let frame = self.get_frame(namespace, key, opts)?;
        self.frame_into(key, frame, None, buf, opts)
    }

    /// The end of a `get_into` that did not read straight into `buf`: the block found (its hit
    /// already told), or none, decoded or copied into `buf`. A compressed frame is decoded
    /// straight into `buf`, unless its `decoding` was already done (by a batch, on a worker as
    /// its read arrived): then the decoded block is copied.
    pub(super) fn frame_into(
        &self,
        key: &str,
        frame: Option<Block>,
        decoding: Option<Decoding>,
        buf: &mut [u8],
        opts: ReadOptions,
    ) -> Result<Option<(BlockMeta, usize)>> {
        let parts = &self.parts;
        let Some(frame) = frame else {
            parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
            parts.metrics.count_get(None);
            return Ok(None);
        };
        if !frame.meta.compression.is_none() && decoding.is_none() {
            return self.decode_into(key, frame, buf, opts);
        }
        parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
        let block = match parts.decoded_given(key, frame, decoding, opts, Dropped::Refuse)? {
            Some((block, _)) => block,
            None => {
                parts.metrics.count_get(None);
                return Ok(None);
            }
        };
        parts.metrics.count_get(Some(block.len() as u64));
        let got = buf.len() as u64;
        let dst = buf.get_mut(..block.len()).ok_or(StoreError::BufferTooSmall { needed: block.len() as u64, got })?;
        dst.copy_from_slice(&block);
        Ok(Some((block.meta.clone(), block.len())))
    }

    /// Whether `key` names a stored, unexpired block. Does no I/O.
    pub fn contains(&self, namespace: &str, key: &str) -> Result<bool> {
        Ok(self.contains_batch(namespace, &[key])?.first().copied().unwrap_or(false))
    }

    /// `contains` for many keys under one index lock.
    pub fn contains_batch(&self, namespace: &str, keys: &[&str]) -> Result<Vec<bool>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        keys.iter().try_for_each(|k| validate_key(k))?;
        let now = self.parts.clock.now_unix_s();
        let index = self.parts.index_read();
        Ok(keys.iter().map(|k| index.key(&key_fp(namespace, k)).is_some_and(|e| !is_expired(e, now))).collect())
    }

    /// A block with content hash `hash` in `namespace`, whatever key names it. When the same
    /// bytes are stored under several descriptions or codecs, any one of them.
    pub fn get_by_hash(&self, namespace: &str, hash: &[u8; 32], opts: ReadOptions) -> Result<Option<Block>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        let parts = &self.parts;
        let prefix = bytes_prefix(namespace, hash);
        let lookup = || {
            let index = parts.index_read();
            index.content_slot_by_bytes(&prefix).and_then(|s| index.content(s).copied())
        };
        let frame = match lookup() {
            Some(entry) => parts.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry))?,
            None => return Ok(None),
        };
        match frame {
            Some(frame) => Ok(parts.decoded("", frame, opts, Dropped::Refuse)?.map(|(b, _)| b)),
            None => Ok(None),
        }
    }
}

impl Parts {
    /// The end of a get of `key`: placement told of the block found, the block decoded, the get
    /// counted.
    pub(super) fn finish_get(
        &self,
        namespace: &str,
        key: &str,
        frame: Option<Block>,
        opts: ReadOptions,
    ) -> Result<Option<Block>> {
        self.finish_get_decoded(namespace, key, frame, None, opts)
    }

    /// `finish_get`, with the frame's decoding when it was already done (`decode_frame`).
    pub(super) fn finish_get_decoded(
        &self,
        namespace: &str,
        key: &str,
        frame: Option<Block>,
        decoding: Option<Decoding>,
        opts: ReadOptions,
    ) -> Result<Option<Block>> {
        let block = match frame {
            Some(frame) => {
                self.hit(namespace, key, &frame.meta);
                self.decoded_given(key, frame, decoding, opts, Dropped::Refuse)?.map(|(b, _)| b)
            }
            None => None,
        };
        self.metrics.count_get(block.as_ref().map(|b| b.len() as u64));
        Ok(block)
    }

    /// Tells placement a get found `key`'s block.
    pub(super) fn hit(&self, namespace: &str, key: &str, meta: &BlockMeta) {
        let policy = self.policies.get(namespace);
        if policy.settings.ttl.is_some() {
            let access = Access {
                at_ms: self.clock.now_unix_ms(),
                block: context_of(None, namespace, key),
                group: context_of(meta.group_id, namespace, key),
                bytes: meta.raw_len,
            };
            self.ttls.at_hit(namespace, access);
        }
        self.placement.on_hit(&BlockInfo {
            namespace,
            raw_bytes: meta.raw_len,
            record_bytes: meta.stored_len,
            group: meta.group_id,
            context: context_of(meta.group_id, namespace, key),
            new_key: false,
            policy: &policy,
            codec: stored_codec(&meta.desc, meta.raw_len, &meta.compression),
        });
    }

    /// The block a live (stored, not expired) key names.
    pub(super) fn live_content(&self, kfp: &KeyFp) -> Option<ContentEntry> {
        let index = self.index_read();
        let k = index.key(kfp).filter(|k| !is_expired(k, self.clock.now_unix_s()))?;
        // A read: placement (a cleaner keeping what is read) counts it.
        index.touch(k.content);
        index.content(k.content).copied()
    }

    /// The block from the DRAM tier, if it is there and intact; a damaged copy is counted.
    pub(super) fn dram_hit(&self, entry: &ContentEntry, opts: ReadOptions) -> Option<Block> {
        match self.tiers.dram_hit(entry, opts.verify_hash) {
            DramRead::Hit(block) => Some(block),
            DramRead::Miss => None,
            DramRead::Damaged => {
                self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                None
            }
        }
    }

    /// The header of the block record `entry` names: one unit, or as many as a long header
    /// takes. The inner result is the header's decoding.
    fn read_header(
        &self,
        entry: &ContentEntry,
    ) -> Result<std::result::Result<RecordHeader, kvhoard_format::FormatError>> {
        let unit = UNIT_BYTES as usize;
        let loc = entry.record;
        let offset = self.log.sb.unit_offset(loc.segment, loc.unit);
        let mut buf = self.pool.get(unit);
        self.log.dev.read_at(&mut buf, offset)?;
        Ok(match RecordHeader::peek_len(&buf) {
            Ok(len) if len > unit && len.div_ceil(unit) <= entry.units as usize => {
                buf = self.pool.get(len.div_ceil(unit) * unit);
                self.log.dev.read_at(&mut buf, offset)?;
                RecordHeader::decode(&buf)
            }
            _ => RecordHeader::decode(&buf),
        })
    }

    /// Reads and checks a block record. `still_current` tells whether the index still points
    /// at it: if not, a mismatch is a race with reclaim (a plain miss), otherwise damage.
    pub(super) fn read_content(
        &self,
        entry: &ContentEntry,
        opts: ReadOptions,
        still_current: impl Fn() -> bool,
    ) -> Result<Option<Block>> {
        if let Some(block) = self.dram_hit(entry, opts) {
            return Ok(Some(block));
        }
        let started = Instant::now();
        let bytes = match self.log.pending_record(&entry.record) {
            Some(buf) => Bytes::Shared(buf),
            None => {
                let mut buf = self.pool.get(entry.units as usize * UNIT_BYTES as usize);
                self.log.dev.read_at(&mut buf, self.record_offset(entry))?;
                self.tiers.speeds.log_read(1, entry.record_bytes(), started.elapsed());
                Bytes::Owned(buf)
            }
        };
        self.checked(entry, bytes, started.elapsed(), opts, still_current)
    }

    /// Where `entry`'s record starts on the device.
    pub(super) fn record_offset(&self, entry: &ContentEntry) -> u64 {
        self.log.sb.unit_offset(entry.record.segment, entry.record.unit)
    }

    /// Checks the bytes of `entry`'s record, read since `started` (or still pending), and makes
    /// the block of them; a mismatch is a miss, counted as damage if `still_current`.
    pub(super) fn checked(
        &self,
        entry: &ContentEntry,
        bytes: Bytes,
        load_time: Duration,
        opts: ReadOptions,
        still_current: impl Fn() -> bool,
    ) -> Result<Option<Block>> {
        let verdict = verify(bytes.as_slice(), entry, opts);
        self.checked_as(entry, bytes, verdict, load_time, still_current)
    }

    /// `checked` of bytes whose check (`verify`) was already done.
    pub(super) fn checked_as(
        &self,
        entry: &ContentEntry,
        bytes: Bytes,
        verdict: std::result::Result<RecordHeader, String>,
        load_time: Duration,
        still_current: impl Fn() -> bool,
    ) -> Result<Option<Block>> {
        let loc = entry.record;
        let hint = u64::from(entry.fp[0]);
        match verdict {
            Ok(header) => {
                let bytes = match bytes {
                    Bytes::Owned(buf) if self.tiers.dram.is_some() => {
                        let buf = Arc::new(buf);
                        self.place_loaded(&buf, &header, entry);
                        Bytes::Shared(buf)
                    }
                    other => other,
                };
                let start = header.payload_offset() as usize;
                let len = header.stored_len as usize;
                self.tiers.ssd.hits.fetch_add(1, Ordering::Relaxed);
                self.tiers.ssd.hit_bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.tiers.ssd_latency.record(hint, load_time);
                Ok(Some(Block::new(bytes, start, len, BlockMeta::of(header, loc))))
            }
            Err(_) if !still_current() => {
                self.tiers.ssd.misses.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(why) => {
                self.tiers.ssd.misses.fetch_add(1, Ordering::Relaxed);
                self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(segment = loc.segment, unit = loc.unit, reason = %why, "stored block is damaged; returning a miss");
                Ok(None)
            }
        }
    }

    /// Asks placement whether a block just read from the log stays in the DRAM tier.
    fn place_loaded(&self, buf: &Arc<crate::buffer::PooledBuf>, header: &RecordHeader, entry: &ContentEntry) {
        let policy = self.policies.get(&header.namespace);
        let info = BlockInfo {
            namespace: &header.namespace,
            raw_bytes: header.raw_len,
            record_bytes: buf.len() as u64,
            group: header.group_id,
            context: context_of(header.group_id, &header.namespace, &header.key),
            new_key: false,
            policy: &policy,
            codec: stored_codec(&header.desc, header.raw_len, &header.compression),
        };
        if self.placement.on_load(&info) {
            self.tiers.admit(buf, header, entry.fp, entry.record);
        } else {
            self.tiers.turned_away();
        }
    }
}

/// Checks a record read for `entry`: a block record of the expected bytes, payload intact.
pub(super) fn verify(
    record: &[u8],
    entry: &ContentEntry,
    opts: ReadOptions,
) -> std::result::Result<RecordHeader, String> {
    let header = RecordHeader::decode(record).map_err(|e| e.to_string())?;
    if header.kind != RecordKind::Block || header_fp(&header) != entry.fp {
        return Err("record holds other bytes than the index expects".into());
    }
    check_payload(&header, record)?;
    if opts.verify_hash && header.compression.is_none() {
        let start = header.payload_offset() as usize;
        let payload = record.get(start..start + header.stored_len as usize).unwrap_or_default();
        if blake3::hash(payload).as_bytes() != &header.content_hash {
            return Err("blake3 of the bytes does not match the content hash".into());
        }
    }
    Ok(header)
}
