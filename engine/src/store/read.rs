//! Reads: get (into an engine buffer or the caller's), contains, get by content hash, list.

use std::ops::Deref;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use kvhoard_format::record::{validate_key, validate_namespace, BlockDesc, CompressionMeta, RecordHeader, RecordKind};
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::UNIT_BYTES;

use crate::error::{Result, StoreError};
use crate::index::{content_fp, is_expired, key_fp, ContentEntry, Loc};
use crate::log::scan::{check_payload, read_segment};
use crate::log::{Pos, SegState};
use crate::options::ReadOptions;
use crate::pool::PooledBuf;

use super::{Inner, Store};

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

/// Where a listing continues: after this log position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ListCursor(Pos);

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
        validate_namespace(namespace)?;
        validate_key(key)?;
        let inner = &self.inner;
        inner.metrics.gets.fetch_add(1, Ordering::Relaxed);
        let kfp = key_fp(namespace, key);
        let lookup = || {
            let index = inner.index_read();
            let k = index.key(&kfp).filter(|k| !is_expired(k, inner.clock.now_unix_s()))?;
            index.content(k.content).copied()
        };
        let block = match lookup() {
            Some(entry) => inner.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry))?,
            None => None,
        };
        inner.metrics.count_get(block.as_ref().map(|b| b.len as u64));
        Ok(block)
    }

    /// Reads the block under `key` into `buf` and returns its description and the number of
    /// bytes written, or `None` on a miss.
    pub fn get_into(
        &self,
        namespace: &str,
        key: &str,
        buf: &mut [u8],
        opts: ReadOptions,
    ) -> Result<Option<(BlockMeta, usize)>> {
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
        validate_namespace(namespace)?;
        keys.iter().try_for_each(|k| validate_key(k))?;
        let now = self.inner.clock.now_unix_s();
        let index = self.inner.index_read();
        Ok(keys.iter().map(|k| index.key(&key_fp(namespace, k)).is_some_and(|e| !is_expired(e, now))).collect())
    }

    /// The block with content hash `hash` in `namespace`, whatever key names it.
    pub fn get_by_hash(&self, namespace: &str, hash: &[u8; 32], opts: ReadOptions) -> Result<Option<Block>> {
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
                if let Some(entry) = inner.live_entry(index, &e) {
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
    fn live_entry(&self, segment: u32, e: &SummaryEntry) -> Option<ListEntry> {
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
        })
    }

    /// Reads and checks a block record. `still_current` tells whether the index still points
    /// at it: if not, a mismatch is a race with reclaim (a plain miss), otherwise damage.
    fn read_content(
        &self,
        entry: &ContentEntry,
        opts: ReadOptions,
        still_current: impl Fn() -> bool,
    ) -> Result<Option<Block>> {
        let loc = entry.record;
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
                let start = header.payload_offset() as usize;
                let len = header.stored_len as usize;
                let meta = meta_of(header, loc);
                Ok(Some(Block { bytes, start, len, meta }))
            }
            Err(_) if !still_current() => Ok(None),
            Err(why) => {
                self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(segment = loc.segment, unit = loc.unit, reason = %why, "stored block is damaged; returning a miss");
                Ok(None)
            }
        }
    }
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
