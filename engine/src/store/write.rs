//! Writes: put (single and batched), delete, and the background writer for buffered puts.

use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::Arc;
use std::thread::JoinHandle;

use kvhoard_format::record::{validate_key, validate_namespace, RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;
use kvhoard_format::{BlockDesc, CompressionMeta};

use crate::error::{Result, StoreError};
use crate::index::{content_fp, key_fp, ContentEntry, ContentFp, KeyFp, Loc};
use crate::log::{fits_empty, Pos};
use crate::options::{Durability, PutOptions};
use crate::pool::{BufferPool, PooledBuf};
use crate::recovery::expiry;
use crate::tier::Origin;

use super::{Inner, Store};

/// A reserved record on its way to the device.
/// Records of one batch written at once by `submit`, each by its own thread.
const WRITE_PARALLELISM: usize = 4;

/// Batches smaller than this are prepared and written by the calling thread alone: starting
/// threads would cost more than it saves.
const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// A batch larger than this is prepared in groups of about this size, the next while the last
/// is written.
const PIPELINE_BYTES: usize = 32 << 20;

#[derive(Debug)]
pub(super) struct WriteJob {
    buf: Arc<PooledBuf>,
    loc: Loc,
    seq: u64,
    key: KeyFp,
}

impl WriteJob {
    fn end(&self) -> Pos {
        Pos { seq: self.seq, unit: self.loc.unit + (self.buf.len() as u64 / UNIT_BYTES) as u32 }
    }
}

/// A record ready to be reserved: its header (seq still 0) and, for a block, its bytes.
struct Prepared<'a> {
    header: RecordHeader,
    payload: &'a [u8],
    /// The record buffer with the payload already in place (built outside the log lock).
    buf: Option<PooledBuf>,
    key: KeyFp,
    content: ContentFp,
    /// For a link made by a rename: the key that must still name `content` when the link is
    /// reserved (there are no bytes to store again if it does not).
    source: Option<KeyFp>,
}

/// Why a rename's link could not be reserved.
const SOURCE_CHANGED: &str = "the source key changed while it was being renamed";

pub(super) fn spawn_writer(inner: Arc<Inner>, depth: usize) -> Result<(SyncSender<WriteJob>, JoinHandle<()>)> {
    let (tx, rx) = sync_channel::<WriteJob>(depth);
    let handle = super::spawn_thread("kvhoard-writer", move || {
        for job in rx {
            // Buffered puts were acknowledged already; a failure poisons the store and is
            // reported to every later write.
            let _ = inner.write_record(&job);
        }
    })?;
    Ok((tx, handle))
}

impl Store {
    /// Stores `bytes` under `key` in `namespace` and returns their blake3 content hash.
    /// Identical bytes already stored in the namespace are not written again.
    pub fn put(&self, namespace: &str, key: &str, bytes: &[u8], opts: &PutOptions) -> Result<[u8; 32]> {
        let mut hashes = self.put_batch(namespace, &[(key, bytes)], opts)?;
        hashes.pop().ok_or_else(|| StoreError::invalid("batch", "empty result"))
    }

    /// Stores many blocks with one reservation pass and one group commit.
    pub fn put_batch(&self, namespace: &str, items: &[(&str, &[u8])], opts: &PutOptions) -> Result<Vec<[u8; 32]>> {
        validate_namespace(namespace)?;
        let inner = &self.inner;
        let now = inner.clock.now_unix_ms();
        // Everything that can refuse a put is checked before any of the batch is written.
        let mut checked = items
            .iter()
            .map(|(key, bytes)| Ok((inner.checked_header(namespace, key, bytes, opts, now)?, *bytes)))
            .collect::<Result<Vec<_>>>()?;
        // A large batch is prepared (hashed, checksummed, copied) in groups, the next group
        // while the last one is written, so that the disk is not idle while the CPUs hash, and
        // only a few groups of record buffers exist at once.
        let mut groups = Vec::new();
        while !checked.is_empty() {
            let mut bytes = 0;
            let take = checked
                .iter()
                .take_while(|(_, b)| {
                    let before = bytes;
                    bytes += b.len();
                    before < PIPELINE_BYTES
                })
                .count();
            let tail = checked.split_off(take.clamp(1, checked.len()));
            groups.push(std::mem::replace(&mut checked, tail));
        }
        let mut hashes = Vec::with_capacity(items.len());
        let mut last_end = Pos::default();
        let mut write = |mut prepared: Vec<Prepared<'_>>| -> Result<()> {
            hashes.extend(prepared.iter().map(|p| p.header.content_hash));
            let mut rest = prepared.as_mut_slice();
            while !rest.is_empty() {
                let (jobs, done) = inner.reserve(rest)?;
                rest = rest.get_mut(done..).unwrap_or_default();
                last_end = jobs.iter().map(WriteJob::end).max().unwrap_or(last_end).max(last_end);
                self.submit(jobs, opts.durability)?;
            }
            Ok(())
        };
        if groups.len() <= 1 {
            for group in groups {
                write(inner.prepare_parallel(namespace, group)?)?;
            }
        } else {
            std::thread::scope(|s| {
                let (tx, rx) = std::sync::mpsc::sync_channel(1);
                s.spawn(move || {
                    for group in groups {
                        let prepared = inner.prepare_parallel(namespace, group);
                        let failed = prepared.is_err();
                        // The receiver stops on the first error, its own or this one.
                        if tx.send(prepared).is_err() || failed {
                            return;
                        }
                    }
                });
                rx.into_iter().try_for_each(|prepared| write(prepared?))
            })?;
        }
        if opts.durability == Durability::Synced {
            inner.sync.sync_to(last_end, inner)?;
        }
        Ok(hashes)
    }

    /// Deletes `key`; returns whether it existed. The deletion is recorded in the log with the
    /// given durability, so the key does not come back after a restart.
    pub fn delete(&self, namespace: &str, key: &str, durability: Durability) -> Result<bool> {
        validate_namespace(namespace)?;
        validate_key(key)?;
        let inner = &self.inner;
        let kfp = key_fp(namespace, key);
        if inner.index_read().key(&kfp).is_none() {
            return Ok(false);
        }
        let header = RecordHeader {
            kind: RecordKind::Tombstone,
            segment_seq: 0,
            payload_crc: 0,
            namespace: namespace.to_string(),
            key: key.to_string(),
            content_hash: [0; 32],
            raw_len: 0,
            stored_len: 0,
            created_unix_ms: inner.clock.now_unix_ms(),
            ttl_secs: 0,
            group_id: None,
            parent_hash: None,
            desc: BlockDesc::opaque(),
            compression: CompressionMeta::none(),
        };
        let mut one = [Prepared { header, payload: &[], buf: None, key: kfp, content: [0; 16], source: None }];
        let (jobs, _) = inner.reserve(&mut one)?;
        let existed = !jobs.is_empty();
        let end = jobs.iter().map(WriteJob::end).max();
        self.submit(jobs, durability)?;
        if let (Durability::Synced, Some(end)) = (durability, end) {
            inner.sync.sync_to(end, inner)?;
        }
        inner.metrics.deletes.fetch_add(u64::from(existed), std::sync::atomic::Ordering::Relaxed);
        Ok(existed)
    }

    /// Renames `from` to `to` within `namespace` without reading or writing the block's bytes:
    /// a link record gives the block its new name (replacing whatever `to` named), then a
    /// tombstone removes the old one. The block keeps its description, group, parent and the
    /// rest of its TTL. Returns whether `from` existed. If `from` is overwritten or deleted while
    /// this runs, the rename applies to what `from` names afterwards, or reports it missing.
    pub fn rename(&self, namespace: &str, from: &str, to: &str, durability: Durability) -> Result<bool> {
        validate_namespace(namespace)?;
        validate_key(from)?;
        validate_key(to)?;
        if from == to {
            return self.contains(namespace, from);
        }
        for _ in 0..8 {
            match self.try_rename(namespace, from, to, durability) {
                Err(StoreError::InvalidArgument { what: "rename", detail }) if detail == SOURCE_CHANGED => continue,
                other => return other,
            }
        }
        Err(StoreError::invalid("rename", format!("{from:?} kept changing while it was being renamed; try again")))
    }

    fn try_rename(&self, namespace: &str, from: &str, to: &str, durability: Durability) -> Result<bool> {
        let inner = &self.inner;
        let Some(meta) = self.meta(namespace, from)? else {
            return Ok(false);
        };
        let now = inner.clock.now_unix_ms();
        let ttl_secs = match meta.ttl_secs {
            0 => 0,
            ttl => {
                let expires_ms = meta.created_unix_ms.saturating_add(u64::from(ttl) * 1000);
                // Expiring within the second still leaves the key one second; never 0 (= never).
                u32::try_from(expires_ms.saturating_sub(now).div_ceil(1000).max(1)).unwrap_or(u32::MAX)
            }
        };
        let link = RecordHeader {
            kind: RecordKind::Link,
            segment_seq: 0,
            payload_crc: 0,
            namespace: namespace.to_string(),
            key: to.to_string(),
            content_hash: meta.content_hash,
            raw_len: meta.raw_len,
            stored_len: 0,
            created_unix_ms: now,
            ttl_secs,
            group_id: meta.group_id,
            parent_hash: meta.parent_hash,
            desc: meta.desc,
            compression: meta.compression,
        };
        link.validate()?;
        let tombstone = RecordHeader {
            kind: RecordKind::Tombstone,
            key: from.to_string(),
            content_hash: [0; 32],
            raw_len: 0,
            ttl_secs: 0,
            group_id: None,
            parent_hash: None,
            desc: BlockDesc::opaque(),
            compression: CompressionMeta::none(),
            ..link.clone()
        };
        let content = content_fp(namespace, &meta.content_hash);
        let from_fp = key_fp(namespace, from);
        let mut items = [
            Prepared {
                header: link,
                payload: &[],
                buf: None,
                key: key_fp(namespace, to),
                content,
                source: Some(from_fp),
            },
            Prepared { header: tombstone, payload: &[], buf: None, key: from_fp, content: [0; 16], source: None },
        ];
        let mut rest = items.as_mut_slice();
        let mut last_end = Pos::default();
        while !rest.is_empty() {
            let (jobs, done) = inner.reserve(rest)?;
            rest = rest.get_mut(done..).unwrap_or_default();
            last_end = jobs.iter().map(WriteJob::end).max().unwrap_or(last_end).max(last_end);
            self.submit(jobs, durability)?;
        }
        if durability == Durability::Synced {
            inner.sync.sync_to(last_end, inner)?;
        }
        Ok(true)
    }

    /// Writes reserved records: hands them to the background writer (buffered), or writes them
    /// here and waits until everything before them is written too.
    fn submit(&self, jobs: Vec<WriteJob>, durability: Durability) -> Result<()> {
        if durability == Durability::Buffered {
            let tx = self.writer.lock().unwrap_or_else(|e| e.into_inner()).as_ref().map(|(tx, _)| tx.clone());
            let tx = tx.ok_or(StoreError::Closed)?;
            for job in jobs {
                tx.send(job).map_err(|_| StoreError::Closed)?;
            }
            return Ok(());
        }
        let inner = &self.inner;
        let bytes: usize = jobs.iter().map(|j| j.buf.len()).sum();
        let workers = jobs.len().min(WRITE_PARALLELISM);
        let first_error = if workers > 1 && bytes >= PARALLEL_MIN_BYTES {
            // One thread writing record after record keeps one record in flight; these keep
            // `workers`. Every record is written (or fails) before this returns.
            std::thread::scope(|s| {
                let writers: Vec<_> = (0..workers)
                    .map(|w| {
                        let jobs = &jobs;
                        s.spawn(move || {
                            let mut first = None;
                            for job in jobs.iter().skip(w).step_by(workers) {
                                if let Err(e) = inner.write_record(job) {
                                    first.get_or_insert(e);
                                }
                            }
                            first
                        })
                    })
                    .collect();
                let mut first = None;
                for writer in writers {
                    let result = writer.join().unwrap_or_else(|_| {
                        // Its records may be neither written nor failed: nothing can be trusted.
                        let reason = "a writer thread panicked".to_string();
                        inner.poison(&mut inner.lock_log(), reason.clone());
                        Some(StoreError::Poisoned { reason })
                    });
                    if let Some(e) = result {
                        first.get_or_insert(e);
                    }
                }
                first
            })
        } else {
            let mut first = None;
            for job in &jobs {
                if let Err(e) = inner.write_record(job) {
                    first.get_or_insert(e);
                }
            }
            first
        };
        if let Some(e) = first_error {
            return Err(e);
        }
        match jobs.iter().map(WriteJob::end).max() {
            Some(end) => self.inner.wait_written(end),
            None => Ok(()),
        }
    }
}

impl Inner {
    /// `prepare` for each checked item, in order; a group of at least `PARALLEL_MIN_BYTES` on
    /// every core.
    fn prepare_parallel<'a>(
        &self,
        namespace: &str,
        mut items: Vec<(RecordHeader, &'a [u8])>,
    ) -> Result<Vec<Prepared<'a>>> {
        let prepare = |chunk: Vec<(RecordHeader, &'a [u8])>| -> Vec<Prepared<'a>> {
            chunk.into_iter().map(|(header, bytes)| self.prepare(namespace, header, bytes)).collect()
        };
        let bytes: usize = items.iter().map(|(_, b)| b.len()).sum();
        let workers = std::thread::available_parallelism().map_or(1, std::num::NonZero::get).min(items.len());
        if workers < 2 || bytes < PARALLEL_MIN_BYTES {
            return Ok(prepare(items));
        }
        let per = items.len().div_ceil(workers);
        let mut chunks = Vec::with_capacity(workers);
        while !items.is_empty() {
            let tail = items.split_off(per.min(items.len()));
            chunks.push(std::mem::replace(&mut items, tail));
        }
        std::thread::scope(|s| {
            let parts: Vec<_> = chunks.into_iter().map(|chunk| s.spawn(move || prepare(chunk))).collect();
            let mut all = Vec::with_capacity(per * workers);
            for part in parts {
                all.extend(part.join().map_err(|_| StoreError::invalid("put", "a hashing thread panicked"))?);
            }
            Ok(all)
        })
    }

    /// The record header a put of `bytes` under `key` writes (as a block, its content hash not
    /// yet computed), after every check that can refuse the put: key, compression arguments,
    /// description, size.
    fn checked_header(
        &self,
        namespace: &str,
        key: &str,
        bytes: &[u8],
        opts: &PutOptions,
        now: u64,
    ) -> Result<RecordHeader> {
        validate_key(key)?;
        let compression = opts.compression.clone().unwrap_or_else(CompressionMeta::none);
        let (raw_len, content_hash) = match (&opts.raw, compression.codec_id) {
            (Some(raw), c) if c != CompressionMeta::CODEC_NONE => *raw,
            (Some(_), _) => {
                return Err(StoreError::invalid("raw", "raw length and hash are only given for compressed bytes"))
            }
            (None, c) if c != CompressionMeta::CODEC_NONE => {
                return Err(StoreError::invalid("raw", "compressed bytes need the raw length and hash"))
            }
            (None, _) => (bytes.len() as u64, [0; 32]),
        };
        let header = RecordHeader {
            kind: RecordKind::Block,
            segment_seq: 0,
            payload_crc: 0,
            namespace: namespace.to_string(),
            key: key.to_string(),
            content_hash,
            raw_len,
            stored_len: bytes.len() as u64,
            created_unix_ms: now,
            ttl_secs: opts.ttl_secs.unwrap_or(0),
            group_id: opts.group,
            parent_hash: opts.parent,
            desc: opts.desc.clone().unwrap_or_else(BlockDesc::opaque),
            compression,
        };
        header.validate()?;
        let units = header.record_bytes() / UNIT_BYTES;
        if units > u64::from(u32::MAX) || !fits_empty(units as u32, header.encoded_len(), self.sb.segment_units()) {
            let max_bytes = (u64::from(self.sb.segment_units()) - 3) * UNIT_BYTES - header.payload_offset();
            return Err(StoreError::BlockTooLarge { bytes: bytes.len() as u64, max_bytes });
        }
        Ok(header)
    }

    /// Hashes one block whose header `checked_header` made, and decides between a block and
    /// a link record.
    fn prepare<'a>(&self, namespace: &str, mut header: RecordHeader, bytes: &'a [u8]) -> Prepared<'a> {
        if header.compression.codec_id == CompressionMeta::CODEC_NONE {
            header.content_hash = *blake3::hash(bytes).as_bytes();
        }
        let content = content_fp(namespace, &header.content_hash);
        if self.index_read().content_slot(&content).is_some() {
            // The bytes are stored already: a link record names them.
            header.kind = RecordKind::Link;
            header.stored_len = 0;
        } else {
            header.payload_crc = crc32c::crc32c(bytes);
        }
        let buf = (header.kind == RecordKind::Block).then(|| record_buffer(&self.pool, &header, bytes));
        let key = key_fp(namespace, &header.key);
        Prepared { header, payload: bytes, buf, key, content, source: None }
    }

    /// Reserves space for a prefix of `items` in log order, updates the index and returns the
    /// write jobs and how many items were reserved. Stops early rather than seal a segment that
    /// holds this call's own unwritten records.
    fn reserve(&self, items: &mut [Prepared<'_>]) -> Result<(Vec<WriteJob>, usize)> {
        let mut log = self.lock_log();
        self.writable(&log)?;
        let mut jobs = Vec::with_capacity(items.len());
        for (done, item) in items.iter_mut().enumerate() {
            if item.header.kind == RecordKind::Tombstone && self.index_read().key(&item.key).is_none() {
                continue;
            }
            loop {
                let units = (item.header.record_bytes() / UNIT_BYTES) as u32;
                let header_len = item.header.encoded_len();
                match &log.open {
                    Some(open) if open.fits(units, header_len, self.sb.segment_units()) => {}
                    Some(_) if !jobs.is_empty() => return Ok((jobs, done)),
                    Some(open) => {
                        let seq = open.seq;
                        log = self.seal_open(log, seq)?;
                        continue;
                    }
                    None => {
                        // May reclaim a segment, and with it the bytes a link points at.
                        self.open_segment(&mut log)?;
                        continue;
                    }
                }
                if let Some(source) = item.source {
                    let index = self.index_read();
                    let still =
                        index.key(&source).and_then(|k| index.content(k.content)).is_some_and(|c| c.fp == item.content);
                    if !still {
                        return Err(StoreError::invalid("rename", SOURCE_CHANGED));
                    }
                }
                if item.header.kind == RecordKind::Link && self.index_read().content_slot(&item.content).is_none() {
                    // The bytes were reclaimed since prepare(): store them again.
                    item.header.kind = RecordKind::Block;
                    item.header.stored_len = item.payload.len() as u64;
                    item.header.payload_crc = crc32c::crc32c(item.payload);
                    item.buf = Some(record_buffer(&self.pool, &item.header, item.payload));
                    continue;
                }
                break;
            }
            let units = (item.header.record_bytes() / UNIT_BYTES) as u32;
            let Some(open) = log.open.as_mut() else { return Err(StoreError::Closed) };
            item.header.segment_seq = open.seq;
            let encoded = item.header.encode();
            let (loc, seq) = (Loc { segment: open.index, unit: open.tail }, open.seq);
            let mut buf = item.buf.take().unwrap_or_else(|| record_buffer(&self.pool, &item.header, &[]));
            if let Some(dst) = buf.get_mut(..encoded.len()) {
                dst.copy_from_slice(&encoded);
            }
            // Readers find the record through the index, so the bytes must be findable (in
            // `pending`) before the index points at them.
            let buf = Arc::new(buf);
            if item.header.kind == RecordKind::Block {
                self.lock_pending().insert(loc, Arc::clone(&buf));
                self.admit(&buf, &item.header, item.content, loc, Origin::Put);
            }
            if let Err(e) = self.apply(&item.header, item.key, item.content, loc, units) {
                self.lock_pending().remove(&loc);
                return Err(e);
            }
            if let Some(open) = log.open.as_mut() {
                let unit = open.reserve(units, &encoded);
                debug_assert_eq!(unit, loc.unit);
            }
            self.metrics.count_put(&item.header);
            jobs.push(WriteJob { buf, loc, seq, key: item.key });
        }
        Ok((jobs, items.len()))
    }

    /// Updates the index for a reserved record, in log order.
    fn apply(&self, h: &RecordHeader, key: KeyFp, content: ContentFp, loc: Loc, units: u32) -> Result<()> {
        let mut index = self.index_write();
        let ns = index
            .ns_id_or_insert(&h.namespace)
            .ok_or_else(|| StoreError::invalid("namespace", "a volume holds at most 65536 namespaces"))?;
        let expires = expiry(h.created_unix_ms, h.ttl_secs);
        match h.kind {
            RecordKind::Block => {
                let block = ContentEntry { fp: content, record: loc, units, raw_len: h.raw_len as u32, refs: 0, ns };
                index.apply_block(key, block, expires);
            }
            RecordKind::Link => {
                let linked = index.apply_link(ns, key, content, loc, expires);
                debug_assert!(linked, "link reserved for bytes that are not stored");
            }
            RecordKind::Tombstone => {
                let content = index.key(&key).and_then(|k| index.content(k.content)).map(|c| c.fp);
                index.remove_key(&key);
                if let (Some(fp), Some(dram)) = (content, &self.dram) {
                    if index.content_slot(&fp).is_none() {
                        dram.remove(&fp);
                    }
                }
            }
        }
        Ok(())
    }

    /// Writes one reserved record and marks it written (or poisons the store if it failed).
    fn write_record(&self, job: &WriteJob) -> Result<()> {
        let offset = self.sb.segment_offset(job.loc.segment) + u64::from(job.loc.unit) * UNIT_BYTES;
        let result = self.dev.write_at(&job.buf, offset);
        let mut log = self.lock_log();
        if let Some(open) = log.open.as_mut().filter(|o| o.seq == job.seq) {
            open.in_flight.remove(&job.loc.unit);
        }
        if let Err(e) = &result {
            let mut index = self.index_write();
            if index.key(&job.key).is_some_and(|k| k.record == job.loc) {
                index.remove_key(&job.key);
            }
            drop(index);
            self.poison(&mut log, e.to_string());
        }
        self.lock_pending().remove(&job.loc);
        self.written.notify_all();
        Ok(result?)
    }

    /// Waits until every record up to `end` has been written.
    fn wait_written(&self, end: Pos) -> Result<()> {
        let mut log = self.lock_log();
        loop {
            if let Some(reason) = &log.poisoned {
                return Err(StoreError::Poisoned { reason: reason.clone() });
            }
            let done = match &log.open {
                Some(open) if open.seq == end.seq => open.written_before(end.unit),
                _ => true,
            };
            if done {
                return Ok(());
            }
            log = self.written.wait(log).unwrap_or_else(|e| e.into_inner());
        }
    }
}

/// The record as written, header bytes still to be filled in: header space, padding to a unit,
/// payload, padding to a unit.
///
/// The buffer comes from the pool with stale contents: everything but the header bytes is
/// written here (the padding as zeros), and the header bytes are written at reservation.
fn record_buffer(pool: &Arc<BufferPool>, header: &RecordHeader, payload: &[u8]) -> PooledBuf {
    let mut buf = pool.get(header.record_bytes() as usize);
    let start = header.payload_offset() as usize;
    let payload = if header.kind == RecordKind::Block { payload } else { &[] };
    let end = start + payload.len();
    if let Some(head) = buf.get_mut(..start) {
        head.fill(0);
    }
    if let Some(dst) = buf.get_mut(start..end) {
        dst.copy_from_slice(payload);
    }
    if let Some(tail) = buf.get_mut(end..) {
        tail.fill(0);
    }
    buf
}
