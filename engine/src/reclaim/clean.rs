//! Cleaning one segment: the live blocks placement keeps are written again at the head of the
//! log, then the segment is freed like a reclaimed one (what was not kept is dropped).
//!
//! Crash rules. A relocated record is the same block under the same key, so until the segment is
//! freed either copy serves; the relocations are synced before the segment is freed, so a crash
//! never loses a kept block, and freeing is reclaim's (drops leave the index first, a checkpoint
//! covers a victim that is not the oldest, the header is zeroed and synced), so a drop never comes
//! back. Each relocation is written only if its key still names the same block when it is
//! reserved: a key written or deleted meanwhile keeps its newer state.

use std::collections::HashMap;
use std::sync::atomic::Ordering;

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;

use super::{choose_victim, free_victim, sealed_views};
use crate::error::{Result, StoreError};
use crate::index::{header_fp, is_expired, key_fp, remaining_ttl, ContentFp, KeyFp};
use crate::log::scan::{check_payload, read_summary};
use crate::log::{Loc, Pos, SegState};
use crate::parts::Parts;
use crate::placement::{Keep, LiveBlock};
use crate::store::append::{Prepared, SOURCE_CHANGED};

/// What cleaning a segment did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cleaned {
    /// The segment freed.
    pub segment: u32,
    /// Records written again (blocks and links).
    pub relocated: u64,
    /// Bytes those records took.
    pub relocated_bytes: u64,
}

/// One live record to write again.
struct Relocation {
    namespace: String,
    key: String,
    kfp: KeyFp,
    content: ContentFp,
    /// The block's record in the victim (a block relocation), or `None` for a link.
    block_at: Option<Loc>,
    /// The header of the record in the victim this one is made from (the block record for a
    /// block, the key's own record for a link).
    header: RecordHeader,
}

/// Clears the segment's cleaning mark however cleaning ends.
struct CleaningMark<'a>(&'a Parts);

impl Drop for CleaningMark<'_> {
    fn drop(&mut self) {
        self.0.log.lock().cleaning = None;
    }
}

/// Cleans one sealed segment, chosen by placement. `None` when there is none worth cleaning (no
/// sealed segment with its summary on disk, or a cleaning already under way).
pub(crate) fn clean_one(parts: &Parts) -> Result<Option<Cleaned>> {
    let (victim, seq) = {
        let mut state = parts.log.lock();
        state.writable()?;
        if state.cleaning.is_some() {
            return Ok(None);
        }
        // Cleaning reads a segment's summary: write the ones still waiting for a sync (their
        // records are all written; a seal waits for that).
        if !state.unsummarized.is_empty() {
            parts.log.sync_and_summarize(&mut state)?;
        }
        let sealed = sealed_views(parts, &state);
        if sealed.len() < 2 {
            return Ok(None);
        }
        let victim = choose_victim(parts, &sealed);
        let seq = sealed.iter().find(|s| s.index == victim).map_or(0, |s| s.seq);
        state.cleaning = Some(victim);
        (victim, seq)
    };
    let _mark = CleaningMark(parts);
    let plan = plan(parts, victim, seq)?;
    let mut cleaned = Cleaned { segment: victim, ..Cleaned::default() };
    let mut last_end = Pos::default();
    for r in plan {
        let Some((item_end, bytes)) = relocate(parts, victim, &r)? else { continue };
        last_end = last_end.max(item_end);
        cleaned.relocated += 1;
        cleaned.relocated_bytes += bytes;
    }
    if cleaned.relocated > 0 {
        parts.log.sync_to(last_end)?;
    }
    let mut state = parts.log.lock();
    state.cleaning = None;
    let still =
        state.segments.get(victim as usize).is_some_and(|s| s.seq == seq && matches!(s.state, SegState::Sealed { .. }));
    if !still {
        return Ok(None);
    }
    let sealed = sealed_views(parts, &state);
    free_victim(parts, &mut state, &sealed, victim)?;
    parts.metrics.segments_cleaned.fetch_add(1, Ordering::Relaxed);
    parts.metrics.relocated_records.fetch_add(cleaned.relocated, Ordering::Relaxed);
    parts.metrics.relocated_bytes.fetch_add(cleaned.relocated_bytes, Ordering::Relaxed);
    tracing::debug!(
        segment = victim,
        relocated = cleaned.relocated,
        bytes = cleaned.relocated_bytes,
        "segment cleaned"
    );
    Ok(Some(cleaned))
}

/// What of the victim's live records placement keeps, blocks before links (a link needs its
/// block in place).
fn plan(parts: &Parts, victim: u32, seq: u64) -> Result<Vec<Relocation>> {
    let entries = match read_summary(parts.log.dev.as_ref(), &parts.log.sb, victim, seq)? {
        Ok((entries, _)) => entries,
        Err(why) => {
            return Err(StoreError::invalid(
                "clean",
                format!("segment {victim}'s summary is unreadable ({why:?}); left for reclaim"),
            ))
        }
    };
    let now_ms = parts.clock.now_unix_ms();
    let now_s = parts.clock.now_unix_s();
    let index = parts.index_read();
    let mut blocks = Vec::new();
    let mut links = Vec::new();
    // Blocks here whose writing key no longer names them, but other keys (links elsewhere) do.
    let mut orphans: HashMap<u32, (Loc, RecordHeader)> = HashMap::new();
    let mut kept_slots = Vec::new();
    fn info(h: &RecordHeader, raw: u32, units: u32, reads: u8, now_ms: u64) -> LiveBlock<'_> {
        LiveBlock {
            namespace: &h.namespace,
            raw_bytes: u64::from(raw),
            record_bytes: u64::from(units) * UNIT_BYTES,
            group: h.group_id,
            reads,
            age_ms: now_ms.saturating_sub(h.created_unix_ms),
        }
    }
    for e in &entries {
        let h = &e.header;
        let loc = Loc { segment: victim, unit: e.unit };
        if !matches!(h.kind, RecordKind::Block | RecordKind::Link) {
            continue;
        }
        let kfp = key_fp(&h.namespace, &h.key);
        let current = index.key(&kfp).filter(|k| k.record == loc && !is_expired(k, now_s)).copied();
        let Some(k) = current else {
            if h.kind == RecordKind::Block {
                if let Some(slot) = index.slot_of(&header_fp(h)) {
                    if index.content(slot).is_some_and(|c| c.record == loc) {
                        orphans.insert(slot, (loc, h.clone()));
                    }
                }
            }
            continue;
        };
        let Some(c) = index.content(k.content).copied() else { continue };
        if parts.placement.keep(&info(h, c.raw_len, c.units, index.heat(k.content), now_ms)) != Keep::Relocate {
            continue;
        }
        let r = |block_at| Relocation {
            namespace: h.namespace.clone(),
            key: h.key.clone(),
            kfp,
            content: c.fp,
            block_at,
            header: h.clone(),
        };
        if c.record == loc {
            kept_slots.push(k.content);
            blocks.push(r(Some(loc)));
        } else {
            links.push(r(None));
        }
    }
    // An orphan block is kept under one of the live keys that link to it, if placement keeps it.
    orphans.retain(|slot, (_, h)| {
        let c = index.content(*slot).copied();
        !kept_slots.contains(slot)
            && c.is_some_and(|c| {
                parts.placement.keep(&info(h, c.raw_len, c.units, index.heat(*slot), now_ms)) == Keep::Relocate
            })
    });
    if !orphans.is_empty() {
        let mut holders: HashMap<u32, Loc> = HashMap::new();
        for k in index.keys().filter(|k| orphans.contains_key(&k.content) && !is_expired(k, now_s)) {
            holders.entry(k.content).or_insert(k.record);
        }
        drop(index);
        for (slot, (loc, block_header)) in orphans {
            let Some(own) = holders.get(&slot) else { continue };
            // The holder's name is in its own record's header.
            let Some(holder) = parts.header_at(*own)? else { continue };
            blocks.push(Relocation {
                namespace: holder.namespace.clone(),
                key: holder.key.clone(),
                kfp: key_fp(&holder.namespace, &holder.key),
                content: header_fp(&block_header),
                block_at: Some(loc),
                header: block_header,
            });
        }
    }
    blocks.extend(links);
    Ok(blocks)
}

/// Writes one relocation, if its key still names the same block; returns where it ends and the
/// bytes it took.
fn relocate(parts: &Parts, victim: u32, r: &Relocation) -> Result<Option<(Pos, u64)>> {
    let now = parts.clock.now_unix_ms();
    let mut header = r.header.clone();
    header.namespace = r.namespace.clone();
    header.key = r.key.clone();
    header.ttl_secs = remaining_ttl(r.header.created_unix_ms, r.header.ttl_secs, now);
    header.created_unix_ms = now;
    header.segment_seq = 0;
    let stored;
    let mut item = match r.block_at {
        Some(loc) => {
            let units = (r.header.record_bytes() / UNIT_BYTES) as usize;
            let mut buf = parts.pool.get(units * UNIT_BYTES as usize);
            let offset = parts.log.sb.segment_offset(victim) + u64::from(loc.unit) * UNIT_BYTES;
            parts.log.dev.read_at(&mut buf, offset)?;
            let on_disk = RecordHeader::decode(&buf);
            if !on_disk.as_ref().is_ok_and(|h| header_fp(h) == r.content) || check_payload(&r.header, &buf).is_err() {
                tracing::warn!(segment = victim, unit = loc.unit, "a block to relocate is damaged; dropping it");
                return Ok(None);
            }
            header.kind = RecordKind::Block;
            let start = r.header.payload_offset() as usize;
            stored = buf.get(start..start + r.header.stored_len as usize).unwrap_or_default().to_vec();
            Prepared::replacing(header, &stored, &parts.pool, r.kfp, r.content)
        }
        None => {
            header.kind = RecordKind::Link;
            header.stored_len = 0;
            header.payload_crc = 0;
            Prepared::without_payload(header, r.kfp, r.content, Some(r.kfp))
        }
    };
    match parts.append_written(std::slice::from_mut(&mut item)) {
        Ok(Some(end)) => Ok(Some((end, item.header.record_bytes()))),
        Ok(None) => Ok(None),
        Err(StoreError::InvalidArgument { what: "rename", detail }) if detail == SOURCE_CHANGED => Ok(None),
        Err(e) => Err(e),
    }
}
