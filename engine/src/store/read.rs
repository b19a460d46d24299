//! Reads: get (into an engine buffer or the caller's), contains, get by content hash, list.

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use kvhoard_format::record::{validate_key, validate_namespace, RecordHeader, RecordKind};
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::UNIT_BYTES;
use kvhoard_format::{BlockDesc, CompressionMeta};

use crate::error::{Result, StoreError};
use crate::index::{content_fp, is_expired, key_fp, ContentEntry, ContentFp, KeyFp, Loc};
use crate::log::scan::{check_payload, read_segment};
use crate::log::{Pos, SegState};
use crate::options::ReadOptions;
use crate::pool::PooledBuf;
use crate::tier::Origin;

use super::{Inner, Store};

/// Blocks at least this large are read by `get_into` straight into an aligned caller buffer.
/// Below it, one device read into an engine buffer and a copy cost less than the two or three
/// reads (header, payload, last partial unit) of a direct read.
pub const DIRECT_READ_MIN_BYTES: usize = 128 << 10;

/// The outcome of [`Inner::read_direct`].
enum Direct {
    /// The block is in the caller's buffer: its description and length.
    Read(BlockMeta, usize),
    /// Not read this way; read it through an engine buffer.
    Unsuitable,
}

/// What a stored block is, from its record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// blake3 of the raw bytes.
    pub content_hash: [u8; 32],
    /// Length of the raw bytes.
    pub raw_len: u64,
    /// Length of the stored bytes.
    pub stored_len: u64,
    /// What the raw bytes are.
    pub desc: BlockDesc,
    /// How the stored bytes encode them.
    pub compression: CompressionMeta,
    /// When the block record was written.
    pub created_unix_ms: u64,
    /// TTL of the block record, in seconds (0 = none).
    pub ttl_secs: u32,
    /// Group, if known.
    pub group_id: Option<u64>,
    /// Parent block, if known.
    pub parent_hash: Option<[u8; 32]>,
    /// Where the block record is.
    pub location: Loc,
}

enum Bytes {
    Owned(PooledBuf),
    Shared(Arc<PooledBuf>),
}

/// A block read from the store: its stored bytes (deref to `[u8]`) and its description. The
/// bytes stay in the buffer they were read into; no copy is made.
pub struct Block {
    bytes: Bytes,
    start: usize,
    len: usize,
    /// The block's description.
    pub meta: BlockMeta,
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        let buf: &[u8] = match &self.bytes {
            Bytes::Owned(b) => b,
            Bytes::Shared(b) => b,
        };
        buf.get(self.start..self.start + self.len).unwrap_or_default()
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("len", &self.len).field("meta", &self.meta).finish()
    }
}

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

/// Where a listing continues: after this log position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ListCursor(Pos);

impl ListCursor {
    /// The cursor as one number (for a directory offset): segment use in the high 40 bits,
    /// unit in the low 24. `None` if it does not fit (not before 2^40 segment uses).
    pub fn to_u64(self) -> Option<u64> {
        (self.0.seq < 1 << 40 && self.0.unit < 1 << 24).then_some(self.0.seq << 24 | u64::from(self.0.unit))
    }

    /// The cursor [`ListCursor::to_u64`] made this number from.
    pub fn from_u64(v: u64) -> ListCursor {
        ListCursor(Pos { seq: v >> 24, unit: (v & 0xFF_FFFF) as u32 })
    }
}

impl std::fmt::Display for ListCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0.seq, self.0.unit)
    }
}

impl std::str::FromStr for ListCursor {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        let bad =
            || StoreError::invalid("cursor", format!("{s:?}: expected SEQ.UNIT as printed by a previous listing"));
        let (seq, unit) = s.split_once('.').ok_or_else(bad)?;
        Ok(ListCursor(Pos { seq: seq.parse().map_err(|_| bad())?, unit: unit.parse().map_err(|_| bad())? }))
    }
}

/// One live key in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The key.
    pub key: String,
    /// Its block's content hash.
    pub content_hash: [u8; 32],
    /// Raw length of its block.
    pub raw_len: u64,
    /// When the key was written.
    pub created_unix_ms: u64,
    /// Its TTL in seconds (0 = none).
    pub ttl_secs: u32,
    /// Whether the key shares stored bytes with an earlier key (a link record).
    pub deduplicated: bool,
    /// Where this entry is: a listing from here continues after it.
    pub cursor: ListCursor,
}

/// A page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Keys, oldest first.
    pub entries: Vec<ListEntry>,
    /// Where the next page starts, or `None` at the end.
    pub next: Option<ListCursor>,
}

impl Store {
    /// The block stored under `key`, or `None` if there is none (never stored, deleted, expired,
    /// evicted, or damaged: a damaged block is logged and counted in `stats().read_errors`).
    pub fn get(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Option<Block>> {
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let inner = &self.inner;
        inner.metrics.gets.fetch_add(1, Ordering::Relaxed);
        let kfp = key_fp(namespace, key);
        let lookup = || inner.live_content(&kfp);
        let block = match lookup() {
            Some(entry) => inner.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry))?,
            None => None,
        };
        inner.metrics.count_get(block.as_ref().map(|b| b.len as u64));
        Ok(block)
    }

    /// A get that never waits for the device, for callers that must not block (an async server
    /// answers these on its network thread and sends only [`Resident::OnDevice`] keys to a
    /// thread that may block on [`Store::get`]).
    pub fn get_resident(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Resident> {
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let inner = &self.inner;
        let Some(entry) = inner.live_content(&key_fp(namespace, key)) else {
            inner.metrics.gets.fetch_add(1, Ordering::Relaxed);
            inner.metrics.count_get(None);
            return Ok(Resident::Absent);
        };
        match inner.dram_hit(&entry, opts) {
            Some(block) => {
                inner.metrics.gets.fetch_add(1, Ordering::Relaxed);
                inner.metrics.count_get(Some(block.len as u64));
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
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let inner = &self.inner;
        let kfp = key_fp(namespace, key);
        let Some(entry) = inner.live_content(&kfp) else { return Ok(None) };
        let loc = entry.record;
        if let Some(cached) = inner.dram.as_ref().and_then(|d| d.peek(&entry.fp, loc)) {
            return Ok(Some(cached.meta.clone()));
        }
        let pending = inner.lock_pending().get(&loc).cloned();
        let header = match pending {
            Some(buf) => RecordHeader::decode(&buf),
            None => {
                let unit = UNIT_BYTES as usize;
                let offset = inner.sb.segment_offset(loc.segment) + u64::from(loc.unit) * UNIT_BYTES;
                let mut buf = inner.pool.get(unit);
                inner.dev.read_at(&mut buf, offset)?;
                match RecordHeader::peek_len(&buf) {
                    Ok(len) if len > unit && len.div_ceil(unit) <= entry.units as usize => {
                        buf = inner.pool.get(len.div_ceil(unit) * unit);
                        inner.dev.read_at(&mut buf, offset)?;
                        RecordHeader::decode(&buf)
                    }
                    _ => RecordHeader::decode(&buf),
                }
            }
        };
        match header {
            Ok(h) if h.kind == RecordKind::Block && content_fp(&h.namespace, &h.content_hash) == entry.fp => {
                Ok(Some(meta_of(h, loc)))
            }
            // Raced with reclaim, or damaged: get() tells which (and counts damage).
            _ => Ok(self.get(namespace, key, ReadOptions::default())?.map(|b| b.meta)),
        }
    }

    /// Whether the block with content hash `hash` in `namespace` is held by the DRAM tier.
    pub fn in_dram(&self, namespace: &str, hash: &[u8; 32]) -> bool {
        let Some(dram) = &self.inner.dram else { return false };
        let cfp = content_fp(namespace, hash);
        let loc = {
            let index = self.inner.index_read();
            index.content_slot(&cfp).and_then(|s| index.content(s)).map(|c| c.record)
        };
        loc.is_some_and(|loc| dram.peek(&cfp, loc).is_some())
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
        self.inner.ensure_open()?;
        let inner = &self.inner;
        let kfp = key_fp(namespace, key);
        let lookup = || inner.live_content(&kfp);
        if let Some(entry) = lookup() {
            if let Direct::Read(meta, len) = inner.read_direct(&entry, buf, opts)? {
                inner.metrics.gets.fetch_add(1, Ordering::Relaxed);
                inner.metrics.direct_reads.fetch_add(1, Ordering::Relaxed);
                inner.metrics.count_get(Some(len as u64));
                return Ok(Some((meta, len)));
            }
        }
        // Small, cached, pending, unaligned, compressed, or not what the index said (a race with
        // reclaim, or damage, which `get` tells apart): through an engine buffer.
        let Some(block) = self.get(namespace, key, opts)? else { return Ok(None) };
        let got = buf.len() as u64;
        let dst = buf.get_mut(..block.len).ok_or(StoreError::BufferTooSmall { needed: block.len as u64, got })?;
        dst.copy_from_slice(&block);
        Ok(Some((block.meta.clone(), block.len)))
    }

    /// Gets many keys; a miss is `None` in its place.
    pub fn get_batch(&self, namespace: &str, keys: &[&str], opts: ReadOptions) -> Result<Vec<Option<Block>>> {
        keys.iter().map(|k| self.get(namespace, k, opts)).collect()
    }

    /// Whether `key` names a stored, unexpired block. Does no I/O.
    pub fn contains(&self, namespace: &str, key: &str) -> Result<bool> {
        Ok(self.contains_batch(namespace, &[key])?.first().copied().unwrap_or(false))
    }

    /// `contains` for many keys under one index lock.
    pub fn contains_batch(&self, namespace: &str, keys: &[&str]) -> Result<Vec<bool>> {
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        keys.iter().try_for_each(|k| validate_key(k))?;
        let now = self.inner.clock.now_unix_s();
        let index = self.inner.index_read();
        Ok(keys.iter().map(|k| index.key(&key_fp(namespace, k)).is_some_and(|e| !is_expired(e, now))).collect())
    }

    /// The block with content hash `hash` in `namespace`, whatever key names it.
    pub fn get_by_hash(&self, namespace: &str, hash: &[u8; 32], opts: ReadOptions) -> Result<Option<Block>> {
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        let inner = &self.inner;
        let cfp = content_fp(namespace, hash);
        let lookup = || {
            let index = inner.index_read();
            index.content_slot(&cfp).and_then(|s| index.content(s).copied())
        };
        match lookup() {
            Some(entry) => inner.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry)),
            None => Ok(None),
        }
    }

    /// One page of the live keys of `namespace`, oldest record first, starting after `cursor`.
    /// Reads segment summaries, not payloads; holds no lock while it reads.
    pub fn list(&self, namespace: &str, cursor: Option<ListCursor>, limit: usize) -> Result<ListPage> {
        self.inner.ensure_open()?;
        validate_namespace(namespace)?;
        let inner = &self.inner;
        let after = cursor.map(|c| c.0);
        let (mut segments, open) = {
            let log = inner.lock_log();
            let segments: Vec<(u64, u32, bool)> = log
                .segments
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state != SegState::Free && after.is_none_or(|a| s.seq >= a.seq))
                .map(|(i, s)| (s.seq, i as u32, matches!(s.state, SegState::Open)))
                .collect();
            let open = log.open.as_ref().map(|o| (o.seq, o.summary.clone(), o.records));
            (segments, open)
        };
        segments.sort_unstable();
        let mut page = ListPage::default();
        for (seq, index, is_open) in segments {
            let entries = match (&open, is_open) {
                (Some((open_seq, bytes, count)), true) if *open_seq == seq => {
                    summary::decode(bytes, *count, crc32c::crc32c(bytes)).unwrap_or_default()
                }
                _ => read_segment(inner.dev.as_ref(), &inner.sb, index, seq, 1)?.entries,
            };
            for e in entries {
                let pos = Pos { seq, unit: e.unit };
                if after.is_some_and(|a| pos <= a) || e.header.namespace != namespace {
                    continue;
                }
                if let Some(entry) = inner.live_entry(index, &e, ListCursor(pos)) {
                    page.entries.push(entry);
                    if page.entries.len() >= limit.max(1) {
                        page.next = Some(ListCursor(pos));
                        return Ok(page);
                    }
                }
            }
        }
        Ok(page)
    }
}

impl Inner {
    /// The listing entry of a record if it is its key's current record.
    fn live_entry(&self, segment: u32, e: &SummaryEntry, cursor: ListCursor) -> Option<ListEntry> {
        let h = &e.header;
        if !matches!(h.kind, RecordKind::Block | RecordKind::Link) {
            return None;
        }
        let index = self.index_read();
        let k = index.key(&key_fp(&h.namespace, &h.key))?;
        if k.record != (Loc { segment, unit: e.unit }) || is_expired(k, self.clock.now_unix_s()) {
            return None;
        }
        Some(ListEntry {
            key: h.key.clone(),
            content_hash: h.content_hash,
            raw_len: h.raw_len,
            created_unix_ms: h.created_unix_ms,
            ttl_secs: h.ttl_secs,
            deduplicated: h.kind == RecordKind::Link,
            cursor,
        })
    }

    /// The block a live (stored, not expired) key names.
    fn live_content(&self, kfp: &KeyFp) -> Option<ContentEntry> {
        let index = self.index_read();
        let k = index.key(kfp).filter(|k| !is_expired(k, self.clock.now_unix_s()))?;
        index.content(k.content).copied()
    }

    /// Reads a raw block on the log straight into `buf`: its header units and its whole payload
    /// units in one batch of device reads (the payload's last partial unit, if any, through a
    /// one-unit engine buffer). Anything unexpected is [`Direct::Unsuitable`], and the caller
    /// reads the record the ordinary way, which tells a race from damage.
    fn read_direct(&self, entry: &ContentEntry, buf: &mut [u8], opts: ReadOptions) -> Result<Direct> {
        let unit = UNIT_BYTES as usize;
        let raw = entry.raw_len as usize;
        let align = self.dev.capabilities().alignment as usize;
        // The record is header units then payload units; for an uncompressed block the payload
        // is exactly raw_len bytes, so the header's units follow from the entry.
        let header_units = (entry.units as usize).checked_sub(raw.div_ceil(unit)).filter(|&h| h >= 1);
        let Some(header_units) = header_units else { return Ok(Direct::Unsuitable) };
        if self.dram.is_some()
            || raw < DIRECT_READ_MIN_BYTES
            || buf.len() < raw
            || !(buf.as_ptr() as usize).is_multiple_of(align)
            || !unit.is_multiple_of(align)
            || self.lock_pending().contains_key(&entry.record)
        {
            return Ok(Direct::Unsuitable);
        }
        let loc = entry.record;
        let started = Instant::now();
        let offset = self.sb.segment_offset(loc.segment) + u64::from(loc.unit) * UNIT_BYTES;
        let payload_at = offset + (header_units * unit) as u64;
        let (body_len, tail_len) = (raw / unit * unit, raw % unit);
        let mut header_buf = self.pool.get(header_units * unit);
        let mut tail_buf = (tail_len > 0).then(|| self.pool.get(unit));
        {
            let body = buf.get_mut(..body_len).unwrap_or_default();
            let mut reads: Vec<(&mut [u8], u64)> = vec![(&mut header_buf[..], offset), (body, payload_at)];
            if let Some(t) = tail_buf.as_mut() {
                reads.push((&mut t[..], payload_at + body_len as u64));
            }
            self.dev.read_many(&mut reads)?;
        }
        let Ok(header) = RecordHeader::decode(&header_buf) else { return Ok(Direct::Unsuitable) };
        let tail = tail_buf.as_ref().and_then(|t| t.get(..tail_len)).unwrap_or_default();
        let body = buf.get(..body_len).unwrap_or_default();
        if header.kind != RecordKind::Block
            || content_fp(&header.namespace, &header.content_hash) != entry.fp
            || header.compression.codec_id != CompressionMeta::CODEC_NONE
            || header.stored_len != raw as u64
            || header.payload_offset() != (header_units * unit) as u64
            || crc32c::crc32c_append(crc32c::crc32c(body), tail) != header.payload_crc
        {
            return Ok(Direct::Unsuitable);
        }
        if opts.verify_hash {
            let mut hasher = blake3::Hasher::new();
            hasher.update(body).update(tail);
            if hasher.finalize().as_bytes() != &header.content_hash {
                return Ok(Direct::Unsuitable);
            }
        }
        if let Some(dst) = buf.get_mut(body_len..raw) {
            dst.copy_from_slice(tail);
        }
        self.ssd.hits.fetch_add(1, Ordering::Relaxed);
        self.ssd.hit_bytes.fetch_add(raw as u64, Ordering::Relaxed);
        self.ssd_latency.record(u64::from(entry.fp[0]), started.elapsed());
        Ok(Direct::Read(meta_of(header, loc), raw))
    }

    /// Reads and checks a block record. `still_current` tells whether the index still points
    /// at it: if not, a mismatch is a race with reclaim (a plain miss), otherwise damage.
    fn read_content(
        &self,
        entry: &ContentEntry,
        opts: ReadOptions,
        still_current: impl Fn() -> bool,
    ) -> Result<Option<Block>> {
        if let Some(block) = self.dram_hit(entry, opts) {
            return Ok(Some(block));
        }
        let loc = entry.record;
        let started = Instant::now();
        let hint = u64::from(entry.fp[0]);
        let pending = self.lock_pending().get(&loc).cloned();
        let bytes = match pending {
            Some(buf) => Bytes::Shared(buf),
            None => {
                let mut buf = self.pool.get(entry.units as usize * UNIT_BYTES as usize);
                let offset = self.sb.segment_offset(loc.segment) + u64::from(loc.unit) * UNIT_BYTES;
                self.dev.read_at(&mut buf, offset)?;
                Bytes::Owned(buf)
            }
        };
        let record: &[u8] = match &bytes {
            Bytes::Owned(b) => b,
            Bytes::Shared(b) => b,
        };
        match verify(record, entry, opts) {
            Ok(header) => {
                let bytes = match bytes {
                    Bytes::Owned(buf) if self.dram.is_some() => {
                        let buf = Arc::new(buf);
                        self.admit(&buf, &header, entry.fp, loc, Origin::Load);
                        Bytes::Shared(buf)
                    }
                    other => other,
                };
                let start = header.payload_offset() as usize;
                let len = header.stored_len as usize;
                self.ssd.hits.fetch_add(1, Ordering::Relaxed);
                self.ssd.hit_bytes.fetch_add(len as u64, Ordering::Relaxed);
                self.ssd_latency.record(hint, started.elapsed());
                let meta = meta_of(header, loc);
                Ok(Some(Block { bytes, start, len, meta }))
            }
            Err(_) if !still_current() => {
                self.ssd.misses.fetch_add(1, Ordering::Relaxed);
                Ok(None)
            }
            Err(why) => {
                self.ssd.misses.fetch_add(1, Ordering::Relaxed);
                self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(segment = loc.segment, unit = loc.unit, reason = %why, "stored block is damaged; returning a miss");
                Ok(None)
            }
        }
    }

    /// The block from the DRAM tier, if it is there (and, with `verify_hash`, intact).
    fn dram_hit(&self, entry: &ContentEntry, opts: ReadOptions) -> Option<Block> {
        let loc = entry.record;
        let started = Instant::now();
        let dram = self.dram.as_ref()?;
        let block = dram.get(&entry.fp, loc)?.block();
        if opts.verify_hash && !hash_matches(&block) {
            // Memory corruption, not a disk problem: drop the copy; the caller reads the log.
            self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(segment = loc.segment, unit = loc.unit, "cached block fails its hash; reading the log");
            dram.remove(&entry.fp);
            return None;
        }
        dram.counters.hit_bytes.fetch_add(block.len() as u64, Ordering::Relaxed);
        self.dram_latency.record(u64::from(entry.fp[0]), started.elapsed());
        Some(block)
    }

    /// Offers a block record, held in `buf`, to the DRAM tier.
    pub(super) fn admit(&self, buf: &Arc<PooledBuf>, header: &RecordHeader, fp: ContentFp, loc: Loc, origin: Origin) {
        if let Some(dram) = &self.dram {
            let cached = CachedBlock {
                buf: Arc::clone(buf),
                start: header.payload_offset() as usize,
                len: header.stored_len as usize,
                meta: meta_of(header.clone(), loc),
            };
            dram.insert(fp, loc, buf.len() as u64, Arc::new(cached), origin);
        }
    }
}

/// A block held by the DRAM tier: the record buffer it was written from or read into, shared
/// with the gets that return it (never copied).
#[derive(Debug)]
pub(super) struct CachedBlock {
    buf: Arc<PooledBuf>,
    start: usize,
    len: usize,
    meta: BlockMeta,
}

impl CachedBlock {
    fn block(&self) -> Block {
        Block { bytes: Bytes::Shared(Arc::clone(&self.buf)), start: self.start, len: self.len, meta: self.meta.clone() }
    }
}

/// Whether an uncompressed block's bytes still hash to its content hash.
fn hash_matches(block: &Block) -> bool {
    block.meta.compression.codec_id != CompressionMeta::CODEC_NONE
        || blake3::hash(block).as_bytes() == &block.meta.content_hash
}

/// Checks a record read for `entry`: a block record of the expected bytes, payload intact.
fn verify(record: &[u8], entry: &ContentEntry, opts: ReadOptions) -> std::result::Result<RecordHeader, String> {
    let header = RecordHeader::decode(record).map_err(|e| e.to_string())?;
    if header.kind != RecordKind::Block || content_fp(&header.namespace, &header.content_hash) != entry.fp {
        return Err("record holds other bytes than the index expects".into());
    }
    check_payload(&header, record)?;
    if opts.verify_hash && header.compression.codec_id == CompressionMeta::CODEC_NONE {
        let start = header.payload_offset() as usize;
        let payload = record.get(start..start + header.stored_len as usize).unwrap_or_default();
        if blake3::hash(payload).as_bytes() != &header.content_hash {
            return Err("blake3 of the bytes does not match the content hash".into());
        }
    }
    Ok(header)
}

fn meta_of(h: RecordHeader, location: Loc) -> BlockMeta {
    BlockMeta {
        content_hash: h.content_hash,
        raw_len: h.raw_len,
        stored_len: h.stored_len,
        desc: h.desc,
        compression: h.compression,
        created_unix_ms: h.created_unix_ms,
        ttl_secs: h.ttl_secs,
        group_id: h.group_id,
        parent_hash: h.parent_hash,
        location,
    }
}
