//! How records join the log.
//!
//! A put's records are prepared outside any lock (hashed, checksummed, copied into a record
//! buffer, on every core for a large batch), then reserved under the log lock in log order: each
//! gets its place in the open segment (sealing it and opening the next, reclaiming a segment when
//! none is free), its bytes become findable by readers, the index is updated, and placement
//! decides whether the DRAM tier keeps a copy. Index updates happen in log order, so replaying the
//! log rebuilds exactly this index.

use std::sync::Arc;

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;
use kvhoard_kernels::CodecSpec;
use std::sync::atomic::Ordering;

use super::sample::Sampled;
use super::Store;
use crate::buffer::{BufferPool, PooledBuf};
use crate::codec::stored_codec;
use crate::error::{Result, StoreError};
use crate::index::{header_fp, key_fp, ContentEntry, ContentFp, KeyFp, KeyId};
use crate::log::{Loc, LogState, Pos};
use crate::parts::Parts;
use crate::placement::{context_of, BlockInfo};
use crate::recovery::expiry;
use crate::writer::WriteJob;

/// Batches smaller than this are prepared by the calling thread alone: starting threads would
/// cost more than it saves.
pub(super) const PARALLEL_MIN_BYTES: usize = 1 << 20;

/// Why a rename's link could not be reserved.
pub(crate) const SOURCE_CHANGED: &str = "the key changed while it was being renamed or recompressed";

/// A record ready to be reserved: its header (seq still 0) and, for a block, its bytes.
pub(crate) struct Prepared<'a> {
    pub(crate) header: RecordHeader,
    /// The bytes given by the caller.
    payload: &'a [u8],
    /// The bytes to store when the store compressed them (else `payload`).
    compressed: Option<PooledBuf>,
    /// The record buffer with the payload already in place (built outside the log lock).
    buf: Option<PooledBuf>,
    key: KeyFp,
    content: ContentFp,
    /// A key and the block it must still name when the record is reserved: for a rename's link,
    /// the source key and the block linked (there are no bytes to store again if it changed);
    /// for a recompressed block, the key and its block before (a newer write is left alone).
    condition: Option<(KeyFp, ContentFp)>,
    /// With a condition: the record the key must still have (a record the cleaner writes again
    /// from the one it planned from: a newer write of the same bytes, with another TTL or group,
    /// is not overwritten with the older one's).
    record: Option<Loc>,
    /// With a condition: the block must also be named by no other key (a block the cleaner
    /// recompresses: the other keys would lose it with the segment it is cleaning).
    sole: bool,
    /// A tombstone: whether the index named its key when it was reserved.
    pub(crate) named: bool,
}

impl<'a> Prepared<'a> {
    /// A link or tombstone record.
    pub(crate) fn without_payload(
        header: RecordHeader,
        key: KeyFp,
        content: ContentFp,
        source: Option<KeyFp>,
    ) -> Prepared<'a> {
        let condition = source.map(|s| (s, content));
        Prepared {
            header,
            payload: &[],
            compressed: None,
            buf: None,
            key,
            content,
            condition,
            record: None,
            sole: false,
            named: false,
        }
    }

    /// A block record that replaces `key`'s block, provided the key still names `before` when it
    /// is reserved. `header` is complete (hash, lengths, crc of `stored`).
    pub(crate) fn replacing(
        header: RecordHeader,
        stored: &'a [u8],
        pool: &Arc<BufferPool>,
        key: KeyFp,
        before: ContentFp,
    ) -> Prepared<'a> {
        let content = header_fp(&header);
        let (buf, crc) = record_buffer(pool, &header, stored);
        debug_assert_eq!(crc, header.payload_crc);
        let buf = Some(buf);
        Prepared {
            header,
            payload: stored,
            compressed: None,
            buf,
            key,
            content,
            condition: Some((key, before)),
            record: None,
            sole: false,
            named: false,
        }
    }

    /// This record may be reserved only while its key alone names the block it replaces.
    pub(crate) fn sole(mut self) -> Prepared<'a> {
        self.sole = true;
        self
    }

    /// This record may be reserved only while its condition's key still has its record at
    /// `record`: a record cleaning writes again in place of that one, which metrics count as a
    /// relocation, not a put ([`Prepared::is_relocation`]).
    pub(crate) fn replacing_record(mut self, record: Loc) -> Prepared<'a> {
        self.record = Some(record);
        self
    }

    /// Whether this record is one cleaning writes again ([`Prepared::replacing_record`]).
    fn is_relocation(&self) -> bool {
        self.record.is_some()
    }

    /// The bytes the record stores.
    fn stored(&self) -> &[u8] {
        self.compressed.as_deref().unwrap_or(self.payload)
    }
}

/// How a put's blocks are compressed.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Coding {
    /// The codec (`None`: stored as put).
    pub(super) spec: Option<CodecSpec>,
    /// Whether placement chose it for the blocks' context: one lossy block in
    /// [`super::sample::QUALITY_SAMPLE_EVERY`] so stored is then sampled for the quality it
    /// keeps.
    pub(super) placed: bool,
}

impl Store {
    /// `prepare` for each checked item, in order, on this thread (a batch worth more threads is
    /// streamed: `put_stream.rs`).
    pub(super) fn prepare_here<'a>(
        &self,
        namespace: &str,
        items: Vec<(RecordHeader, &'a [u8])>,
        codec: Coding,
    ) -> Vec<Prepared<'a>> {
        let parts = &*self.parts;
        let bytes: usize = items.iter().map(|(_, b)| b.len()).sum();
        // One large block to compress: hashing it runs beside the codec.
        let alongside = parts.cores > 1 && codec.spec.is_some() && bytes >= PARALLEL_MIN_BYTES;
        items.into_iter().map(|(header, bytes)| parts.prepare(namespace, header, bytes, codec, alongside)).collect()
    }
}

impl Parts {
    /// Hashes one block whose header the put checked, compresses it as `codec` says
    /// (`alongside`: hashing on a thread of its own meanwhile, for a large block put alone),
    /// and decides between a block and a link record.
    pub(super) fn prepare<'a>(
        &self,
        namespace: &str,
        mut header: RecordHeader,
        bytes: &'a [u8],
        codec: Coding,
        alongside: bool,
    ) -> Prepared<'a> {
        let mut compressed = None;
        if header.compression.is_none() {
            let compress = |desc: &kvhoard_format::BlockDesc| {
                codec.spec.map(|spec| (spec, self.codecs.compress(spec, desc, bytes, &self.pool)))
            };
            let (hash, result) = if alongside {
                std::thread::scope(|s| {
                    let hashing = std::thread::Builder::new().spawn_scoped(s, || blake3::hash(bytes));
                    let result = compress(&header.desc);
                    // A hashing thread that could not start or finish leaves the hash to this one.
                    let hash = hashing.ok().and_then(|h| h.join().ok()).unwrap_or_else(|| blake3::hash(bytes));
                    (hash, result)
                })
            } else {
                (blake3::hash(bytes), compress(&header.desc))
            };
            header.content_hash = *hash.as_bytes();
            if let Some((spec, result)) = result {
                match result {
                    Ok(c) => {
                        if codec.placed && spec.is_lossy() {
                            let block =
                                Sampled { namespace, key: &header.key, group: header.group_id, desc: &header.desc };
                            self.sample_quality(&block, bytes, &c, &self.metrics.lossy_puts);
                        }
                        header.compression = c.meta;
                        header.stored_len = c.payload.len() as u64;
                        compressed = Some(c.payload);
                        self.metrics.compressed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(why) => {
                        if self.metrics.codec_skipped.fetch_add(1, Ordering::Relaxed) == 0 {
                            tracing::info!(codec = %spec, reason = ?why, "a block the codec cannot take is stored as it is (counted in codec_skipped; logged once)");
                        }
                    }
                }
            }
        }
        let content = header_fp(&header);
        let stored = compressed.as_deref().unwrap_or(bytes);
        let buf = if self.index_read().content_slot(&content).is_some() {
            // The bytes are stored already: a link record names them.
            header.kind = RecordKind::Link;
            header.stored_len = 0;
            None
        } else {
            let (buf, crc) = record_buffer(&self.pool, &header, stored);
            header.payload_crc = crc;
            Some(buf)
        };
        let key = key_fp(namespace, &header.key);
        Prepared {
            header,
            payload: bytes,
            compressed,
            buf,
            key,
            content,
            condition: None,
            record: None,
            sole: false,
            named: false,
        }
    }

    /// Reserves `items` (several reservations when they span segments) and hands them to the
    /// log writer without waiting; returns the end of the last record, `None` when nothing was
    /// reserved. The caller waits for that end
    /// ([`crate::log::Log::wait_written`]) before it counts on them: cleaning keeps its
    /// relocations in flight this way.
    pub(crate) fn append_handed(&self, items: &mut [Prepared<'_>]) -> Result<Option<Pos>> {
        let mut last_end = None;
        let mut rest = items;
        while !rest.is_empty() {
            let (jobs, done) = self.reserve(rest)?;
            rest = rest.get_mut(done..).unwrap_or_default();
            last_end = jobs.iter().map(WriteJob::end).max().max(last_end);
            self.hand_over(jobs)?;
        }
        Ok(last_end)
    }

    /// The header of the record at `loc` (one unit read), if it decodes.
    pub(crate) fn header_at(&self, loc: Loc) -> Result<Option<RecordHeader>> {
        let mut buf = self.pool.get(UNIT_BYTES as usize);
        let offset = self.log.sb.unit_offset(loc.segment, loc.unit);
        self.log.dev.read_at(&mut buf, offset)?;
        Ok(RecordHeader::decode(&buf).ok())
    }

    /// Reserves space for a prefix of `items` in log order, updates the index and returns the
    /// write jobs and how many items were reserved. Stops early rather than seal a segment that
    /// holds this call's own records not yet handed to the writer.
    pub(crate) fn reserve(&self, items: &mut [Prepared<'_>]) -> Result<(Vec<WriteJob>, usize)> {
        let mut state = self.log.let_quiet(self.log.lock());
        state.writable()?;
        let mut jobs = Vec::with_capacity(items.len());
        for (done, item) in items.iter_mut().enumerate() {
            loop {
                let units = (item.header.record_bytes() / UNIT_BYTES) as u32;
                let header_len = item.header.encoded_len();
                match &state.open {
                    Some(open) if open.fits(units, header_len, self.log.sb.segment_units()) => {}
                    Some(_) if !jobs.is_empty() => return Ok((jobs, done)),
                    Some(open) => {
                        let seq = open.seq;
                        let (sealed, outcome) = self.log.seal_open(state, seq, self.opts.checkpoint_every_segments)?;
                        state = sealed;
                        // The seal waited without the log lock: close may have begun meanwhile,
                        // and it waits only for records reserved before it.
                        state.writable()?;
                        if outcome.checkpoint_due {
                            self.checkpoints.snapshot_in_background(&mut state, &self.index, &self.log, &self.clock);
                        }
                        // (This call holds no record unwritten: `jobs` is empty.)
                        state = self.log.let_quiet(state);
                        state.writable()?;
                        continue;
                    }
                    None => {
                        // The segment the last clean close sealed with room, if it still can be.
                        if self.log.resume_if_resumable(&mut state)? {
                            continue;
                        }
                        let victim = self.victim_to_reclaim(&state)?;
                        if let Some(end) = victim.and_then(|v| self.log.superseded_unsynced(&state, v)) {
                            // The segment reclaim would free holds records superseded by ones
                            // not durable yet: they are made durable first, without the lock
                            // (and with this call's own records handed over).
                            if !jobs.is_empty() {
                                return Ok((jobs, done));
                            }
                            state = self.log.make_durable_unlocked(state, end)?;
                            continue;
                        }
                        // May reclaim a segment, and with it the bytes a link points at.
                        self.open_segment(&mut state, victim)?;
                        continue;
                    }
                }
                if let Some((key, content)) = item.condition {
                    let index = self.index_read();
                    let sole = item.sole;
                    let named = index.key(&key).filter(|k| item.record.is_none_or(|at| k.record == at));
                    let still = named
                        .and_then(|k| index.content(k.content))
                        .is_some_and(|c| c.fp == content && (!sole || c.refs == 1));
                    if !still {
                        // Records reserved already must still be handed over (see below).
                        if !jobs.is_empty() {
                            return Ok((jobs, done));
                        }
                        return Err(StoreError::invalid("rename", SOURCE_CHANGED));
                    }
                }
                let stored = self.index_read().content_slot(&item.content).is_some();
                let new_bytes = item.condition.is_none_or(|(_, before)| before != item.content);
                if item.header.kind == RecordKind::Block && new_bytes && stored {
                    // A put of bytes stored since prepare() (another put of them got here first),
                    // or a block recompressed into a form some key stored already: a link names
                    // them. A block's record then moves forward in the log only when cleaning
                    // writes it again, which checks that every key naming it does so from a
                    // record after it (`reclaim::shared`, `clean::relinks`); a second copy would
                    // leave the links between the two naming bytes whose first record may be
                    // freed, and replay would lose them.
                    item.header.kind = RecordKind::Link;
                    item.header.stored_len = 0;
                    item.header.payload_crc = 0;
                    item.buf = None;
                }
                if item.header.kind == RecordKind::Link && !stored {
                    // The bytes were reclaimed since prepare(): store them again.
                    item.header.kind = RecordKind::Block;
                    item.header.stored_len = item.stored().len() as u64;
                    let (buf, crc) = record_buffer(&self.pool, &item.header, item.stored());
                    item.header.payload_crc = crc;
                    item.buf = Some(buf);
                    continue;
                }
                if item.header.kind == RecordKind::Link {
                    let target = {
                        let index = self.index_read();
                        index.content_slot(&item.content).and_then(|s| index.content(s)).map(|c| (c.record, c.units))
                    };
                    if let Some(end) = target.and_then(|(loc, units)| self.log.unsynced_elsewhere(&state, loc, units)) {
                        // The bytes' record is in an earlier segment and not durable: a link
                        // written before it is could outlive it in a power loss. It is made
                        // durable first, without the lock (and with this call's own records
                        // handed over). One sync, only where a link names bytes put since the
                        // last sync in an earlier segment.
                        if !jobs.is_empty() {
                            return Ok((jobs, done));
                        }
                        state = self.log.make_durable_unlocked(state, end)?;
                        continue;
                    }
                }
                break;
            }
            // A tombstone is written whether or not the index names its key (`Store::delete`);
            // whether it did, under the lock that every change of the index takes, is the
            // delete's answer.
            item.named = item.header.kind == RecordKind::Tombstone && self.index_read().key(&item.key).is_some();
            match self.reserve_one(&mut state, item) {
                Ok(job) => jobs.push(job),
                // The records reserved before it are in flight and must be handed over, or a
                // seal would wait for them forever: they go, and the next call fails.
                Err(_) if !jobs.is_empty() => return Ok((jobs, done)),
                Err(e) => return Err(e),
            }
        }
        Ok((jobs, items.len()))
    }

    /// Reserves the next units of the open segment (which has room) for `item`.
    fn reserve_one(&self, state: &mut LogState, item: &mut Prepared<'_>) -> Result<WriteJob> {
        let units = (item.header.record_bytes() / UNIT_BYTES) as u32;
        let Some(open) = state.open.as_mut() else { return Err(StoreError::Closed) };
        item.header.segment_seq = open.seq;
        let encoded = item.header.encode();
        let (loc, seq) = (Loc { segment: open.index, unit: open.tail }, open.seq);
        let mut buf = item.buf.take().unwrap_or_else(|| record_buffer(&self.pool, &item.header, &[]).0);
        if let Some(dst) = buf.get_mut(..encoded.len()) {
            dst.copy_from_slice(&encoded);
        }
        // A second copy at the end of the first unit names the record if the first is damaged.
        kvhoard_format::record::write_echo(&mut buf, &encoded);
        // Readers find the record through the index, so the bytes must be findable (pending)
        // before the index points at them.
        let buf = Arc::new(buf);
        if item.header.kind == RecordKind::Block {
            self.log.add_pending(loc, Arc::clone(&buf));
            // A block written again (relocated, recompressed) is not a put placement counts.
            let fresh = item.condition.is_none();
            let new_key = fresh && self.index_read().key(&item.key).is_none();
            self.place_in_tiers(&buf, &item.header, item.content, loc, fresh, new_key);
        }
        // What the key named before: its record, and the record of its bytes (elsewhere, when
        // the record was a link). Both segments hold its older version.
        let before: [Option<Loc>; 2] = {
            let index = self.index_read();
            index.key(&item.key).map_or([None, None], |k| [Some(k.record), index.content(k.content).map(|c| c.record)])
        };
        if let Err(e) = self.apply(&item.header, item.key, item.content, loc, units) {
            self.log.drop_pending(&loc);
            return Err(e);
        }
        let h = &item.header;
        let record = match h.kind {
            RecordKind::Block | RecordKind::Link => Some(Some(loc)),
            RecordKind::Tombstone => Some(None),
            RecordKind::Lost => None,
        };
        if let Some(record) = record {
            self.placement.located(KeyId(item.key), context_of(h.group_id, &h.namespace, &h.key), record);
        }
        let unit = open.reserve(units, &encoded);
        debug_assert_eq!(unit, loc.unit);
        for old in before.iter().flatten().filter(|old| old.segment != loc.segment) {
            state.note_superseded(old.segment, Pos { seq, unit: loc.unit + units });
        }
        // A record cleaning writes again is a relocation (counted by cleaning), not a put:
        // write amplification divides the one by the other.
        if !item.is_relocation() {
            self.metrics.count_put(&item.header);
        }
        Ok(WriteJob { buf, loc, seq, key: item.key })
    }

    /// Tells placement of a put block (`fresh`: not one written again), and puts it in the DRAM
    /// tier if placement says so. A block written again (relocated, recompressed) is not an
    /// access: it goes to the DRAM tier where placement keeps its context there
    /// ([`crate::placement::Placement::holds`]), and where placement has no opinion, without
    /// asking (it was kept because it is wanted).
    fn place_in_tiers(
        &self,
        buf: &Arc<PooledBuf>,
        header: &RecordHeader,
        content: ContentFp,
        loc: Loc,
        fresh: bool,
        new_key: bool,
    ) {
        let policy = self.policies.get(&header.namespace);
        let info = BlockInfo {
            namespace: &header.namespace,
            raw_bytes: header.raw_len,
            record_bytes: buf.len() as u64,
            group: header.group_id,
            context: context_of(header.group_id, &header.namespace, &header.key),
            new_key,
            policy: &policy,
            codec: stored_codec(&header.desc, header.raw_len, &header.compression),
        };
        let dram =
            if fresh { self.placement.on_put(&info).dram } else { self.placement.holds(info.context).unwrap_or(true) };
        if self.tiers.dram.is_none() {
            return;
        }
        if dram {
            self.tiers.admit(buf, header, content, loc);
        } else {
            self.tiers.turned_away();
        }
    }

    /// The segment opening one would reclaim: none while one is free.
    fn victim_to_reclaim(&self, state: &LogState) -> Result<Option<u32>> {
        if state.free_segment().is_some() {
            return Ok(None);
        }
        crate::reclaim::victim(self, state).map(Some)
    }

    /// Starts appending to a segment: the one sealed by the last clean close if it has room,
    /// else a new segment use, reclaiming `victim` (chosen under the same hold of the log lock,
    /// [`Store::victim_to_reclaim`]) when none is free.
    fn open_segment(&self, state: &mut LogState, victim: Option<u32>) -> Result<()> {
        if self.log.resume_if_resumable(state)? {
            return Ok(());
        }
        let index = match (state.free_segment(), victim) {
            (Some(i), _) => i,
            (None, Some(victim)) => crate::reclaim::reclaim(self, state, victim)?,
            (None, None) => return Err(StoreError::invalid("volume", "no free segment and no victim chosen")),
        };
        self.log.start_segment(state, index)
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
                index.apply_block(key, ContentEntry::of_record(h, content, loc, units, ns), expires);
            }
            RecordKind::Link => {
                // Reserved under the log lock right after its bytes were found stored, and
                // nothing takes a key out of the index without that lock.
                let linked = index.apply_link(ns, key, content, loc, expires);
                debug_assert!(linked, "link reserved for bytes that are not stored");
                if !linked {
                    // As recovery replays it: the key's newest record names bytes not stored.
                    self.unindex_key(&mut index, &key);
                }
            }
            RecordKind::Tombstone => {
                self.unindex_key(&mut index, &key);
            }
            // Only recovery writes these, into summaries; a put never appends one.
            RecordKind::Lost => {}
        }
        Ok(())
    }
}

/// The record as written, header bytes still to be filled in: header space, padding to a unit,
/// payload, padding to a unit.
///
/// The buffer comes from the pool with stale contents: everything but the header bytes is
/// written here (the padding as zeros), and the header bytes are written at reservation.
/// Returns the buffer and the crc32c of the payload as copied (of nothing for a link).
fn record_buffer(pool: &Arc<BufferPool>, header: &RecordHeader, payload: &[u8]) -> (PooledBuf, u32) {
    /// Copied and checksummed a piece at a time, so that the checksum reads each piece while it
    /// is still in the core's cache rather than the whole payload again from memory.
    const PIECE: usize = 256 << 10;
    let mut buf = pool.get(header.record_bytes() as usize);
    let start = header.payload_offset() as usize;
    let payload = if header.kind == RecordKind::Block { payload } else { &[] };
    let end = start + payload.len();
    if let Some(head) = buf.get_mut(..start) {
        head.fill(0);
    }
    let mut crc = 0;
    if let Some(dst) = buf.get_mut(start..end) {
        for (to, from) in dst.chunks_mut(PIECE).zip(payload.chunks(PIECE)) {
            to.copy_from_slice(from);
            crc = crc32c::crc32c_append(crc, to);
        }
    }
    if let Some(tail) = buf.get_mut(end..) {
        tail.fill(0);
    }
    (buf, crc)
}
