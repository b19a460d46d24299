//! Cleaning one segment: the live blocks placement keeps are written again at the head of the
//! log, as they are or recompressed as placement says, then the segment is freed like a
//! reclaimed one (what was not kept is dropped).
//!
//! Crash rules. A relocated record is the same block under the same key, so until the segment is
//! freed either copy serves; the relocations are synced before the segment is freed, so a crash
//! never loses a kept block, and freeing is reclaim's (drops leave the index first, a checkpoint
//! covers a victim that is not the oldest, the header is zeroed and synced), so a drop never comes
//! back. Each relocation is written only if its key still has the record it was made from when it
//! is reserved, so that a key written or deleted meanwhile keeps its newer state, and keeps that
//! record's expiry to the second; a block whose key was put again with the same bytes (a link to
//! it) is still written, with the newer record's expiry, group and parent ([`relocate_block`]); a
//! block whose key names it no more at its turn is written under the first of the next few keys
//! linked to it that still has its link, as an orphan the plan found is ([`relocate_all`]), rather
//! than dropped with every key that names it. When a relocated block is also named by keys whose
//! records lie elsewhere (links, or an older block record of the same bytes), replay would resolve
//! those records only while the block's bytes are stored, and once the victim is freed its one
//! record lies past them: each such key is linked again right after the block's new record, under
//! the same condition (all of them, or none past [`MAX_RELINKS`]). Should any key name the block
//! from a record other than those the cleaning wrote (one past that bound, one that came to name it
//! during the cleaning, an expired one, one whose record could not be read), the victim is freed
//! after a checkpoint, whatever its age (`reclaim::shared`). A recompressed block is the same block
//! (same name, description, group, TTL) in another form, written under the same condition; only a
//! block that one key names is recompressed (the others that name it would lose it with the
//! segment; checked again when its record is reserved), a block stored lossy is never recoded by
//! cleaning (its form is final), and one the namespace's policy does not allow to be recoded
//! (`store/recode.rs`) is relocated as it is.
//!
//! Pins. The victim is chosen among the segments that hold no pinned key's records while there
//! is one (`choose_victim`); when every sealed segment holds one, a pinned key's block is still
//! never dropped nor recoded by cleaning, whatever placement says: it is relocated as it is, so a
//! hit a client was promised stays one, in the form it was found in.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;
use kvhoard_kernels::CodecSpec;

use super::{choose_victim, free_victim, lock_to_free, sealed_views, Moved};
use crate::block::{Block, BlockMeta, Bytes};
use crate::buffer::PooledBuf;
use crate::codec::stored_codec;
use crate::error::{Result, StoreError};
use crate::index::{header_fp, is_expired, key_fp, ContentFp, KeyFp};
use crate::log::scan::{check_payload, read_summary};
use crate::log::{Loc, Pos, SegState};
use crate::parts::Parts;
use crate::placement::{context_of, Keep, LiveBlock};
use crate::policy::Policy;
use crate::recovery::expiry;
use crate::store::append::{Prepared, SOURCE_CHANGED};
use crate::store::recode::Recoded;

/// What cleaning a segment did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Cleaned {
    /// The segment freed.
    pub segment: u32,
    /// Records written again (blocks and links).
    pub relocated: u64,
    /// Bytes those records took.
    pub relocated_bytes: u64,
    /// Of the blocks, those written in another codec's form.
    pub recompressed: u64,
    /// Bytes the recompressed records take less than before.
    pub recompressed_saved_bytes: u64,
}

/// One live record to write again.
struct Relocation {
    namespace: String,
    key: String,
    kfp: KeyFp,
    content: ContentFp,
    /// The block's record in the victim (a block relocation), or `None` for a link.
    block_at: Option<Loc>,
    /// The key's record the new one replaces: written only while the key still has it (or, for
    /// a block, a newer link to it: [`relocate_block`]).
    record: Loc,
    /// The header of the record this one is made from (the block record for a block, the key's
    /// own record for a link).
    header: RecordHeader,
    /// The codec placement asked the block to be written with (`None`: as it is).
    recode: Option<CodecSpec>,
    /// For a block kept under a key that links to it (its writer's key names it no more): that
    /// key's own record, whose TTL, group and parent the new record takes.
    holder: Option<RecordHeader>,
    /// A link written again after its block's new record (see [`relinks`]): only once that
    /// block has been written again.
    after_block: bool,
}

/// A block kept under `holder`, a key that links to it from its own record at `own`, since its
/// writer's key names it no more; the new record takes the holder's TTL, group and parent.
fn held_block(block_at: Loc, header: RecordHeader, holder: RecordHeader, own: Loc) -> Relocation {
    Relocation {
        namespace: holder.namespace.clone(),
        key: holder.key.clone(),
        kfp: key_fp(&holder.namespace, &holder.key),
        content: header_fp(&header),
        block_at: Some(block_at),
        record: own,
        header,
        recode: None,
        holder: Some(holder),
        after_block: false,
    }
}

/// Keys whose links follow a block in the plan a cleaning tries to write that block under, at
/// most, when its own key names it no more at its turn ([`relocate_all`]): each try builds the
/// block's record again (a copy of its bytes) to have it refused if that key changed too, and a
/// block that many keys let go of during one cleaning is rare enough to drop.
const MAX_HOLDER_TRIES: usize = 4;

/// Times a block is offered under its key's newer record when the key is put again with the
/// same bytes while the block is written ([`relocate_block`]); a key put again that often during
/// one block's write loses it, as an eviction.
const REWRITE_TRIES: usize = 8;

/// Keys a cleaning links again, at most: past it, none is, and freeing the victim writes a
/// checkpoint instead (a block a great many keys name costs fewer bytes that way).
pub(crate) const MAX_RELINKS: usize = 1024;

/// Clears the segment's cleaning mark however cleaning ends, unless another cleaning has
/// marked its own segment since this one ended.
struct CleaningMark<'a>(&'a Parts, u32);

impl Drop for CleaningMark<'_> {
    fn drop(&mut self) {
        let mut state = self.0.log.lock();
        if state.cleaning == Some(self.1) {
            state.cleaning = None;
        }
    }
}

/// Cleans one sealed segment, chosen by placement, as fast as the device allows. `None` when
/// there is none worth cleaning (no sealed segment with its summary on disk, or a cleaning
/// already under way).
pub(crate) fn clean_one(parts: &Parts) -> Result<Option<Cleaned>> {
    clean_paced(parts, None)
}

/// [`clean_one`], its relocations written at `budget` bytes per second at most while no put is
/// short of room (more than one segment free); at full speed once one is, so that a put waits
/// for the cleaner as little as it can. The background cleaner's pace: spread over the time it
/// has, its reads and writes disturb the clients' less than in bursts.
pub(crate) fn clean_paced(parts: &Parts, budget: Option<u64>) -> Result<Option<Cleaned>> {
    clean_planned_then(parts, budget, |_| ())
}

/// [`clean_paced`], with `between` called with the victim once the plan is made, before any of
/// it is written: where tests change what the plan was made from, as a put racing the cleaner
/// may.
pub(crate) fn clean_planned_then(
    parts: &Parts,
    budget: Option<u64>,
    between: impl FnOnce(u32),
) -> Result<Option<Cleaned>> {
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
    let _mark = CleaningMark(parts, victim);
    let plan = plan(parts, victim, seq)?;
    between(victim);
    // Contexts placement dropped while it was asked about this segment's blocks go now, here
    // and wherever else their blocks are.
    super::drops::apply(parts);
    let mut cleaned = Cleaned { segment: victim, ..Cleaned::default() };
    let mut handed = Handed { parts, end: None };
    // The blocks written again, as they are or recompressed, and the keys the cleaning's
    // records name them under.
    let moved = relocate_all(parts, victim, &plan, budget, &mut cleaned, &mut handed)?;
    if let Some(end) = handed.wait()? {
        parts.log.sync_to(end)?;
    }
    let (mut state, moved_shared) = lock_to_free(parts, victim, &moved)?;
    state.cleaning = None;
    // A write failed, or the store closed, while this cleaning ran: the log takes no checkpoint
    // and frees nothing more (records may still be on their way to the device).
    state.writable()?;
    let still =
        state.segments.get(victim as usize).is_some_and(|s| s.seq == seq && matches!(s.state, SegState::Sealed { .. }));
    if !still {
        return Ok(None);
    }
    let sealed = sealed_views(parts, &state);
    free_victim(parts, &mut state, &sealed, victim, moved_shared)?;
    parts.metrics.segments_cleaned.fetch_add(1, Ordering::Relaxed);
    tracing::debug!(
        segment = victim,
        relocated = cleaned.relocated,
        bytes = cleaned.relocated_bytes,
        recompressed = cleaned.recompressed,
        "segment cleaned"
    );
    Ok(Some(cleaned))
}

/// What of the victim's live records placement keeps, and the links written again for keys
/// elsewhere that name its blocks, each block followed by its links ([`in_order`]).
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
    // Taken before the index's lock: the pins' lock is a leaf.
    let pinned_keys = parts.pins.live(now_ms);
    let index = parts.index_read();
    // The blocks pinned keys name, wherever their own records are: a pinned key that links to
    // a block another key wrote, or no key owns any more, needs that block kept.
    let pinned: HashSet<u32> = pinned_keys.iter().filter_map(|k| index.key(k)).map(|k| k.content).collect();
    let mut blocks = Vec::new();
    let mut links = Vec::new();
    // Blocks here whose writing key no longer names them, but other keys (links elsewhere) do.
    let mut orphans: HashMap<u32, (Loc, RecordHeader)> = HashMap::new();
    // The blocks kept, and the key each is written under.
    let mut kept: HashMap<u32, KeyFp> = HashMap::new();
    fn info<'a>(
        h: &'a RecordHeader,
        raw: u32,
        units: u32,
        reads: u8,
        now_ms: u64,
        policy: &'a Policy,
    ) -> LiveBlock<'a> {
        LiveBlock {
            namespace: &h.namespace,
            raw_bytes: u64::from(raw),
            record_bytes: u64::from(units) * UNIT_BYTES,
            group: h.group_id,
            context: context_of(h.group_id, &h.namespace, &h.key),
            policy,
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
        let policy = parts.policies.get(&h.namespace);
        let keep = match pinned.contains(&k.content) {
            true => Keep::Relocate,
            false => parts.placement.keep(&info(h, c.raw_len, c.units, index.heat(k.content), now_ms, &policy)),
        };
        let recode = match keep {
            Keep::Drop => continue,
            Keep::Relocate => None,
            // Other keys name this block too: a new form under this key would leave them none.
            Keep::Recompress(_) if c.refs > 1 => None,
            Keep::Recompress(spec) => Some(spec),
        };
        let r = |block_at| Relocation {
            namespace: h.namespace.clone(),
            key: h.key.clone(),
            kfp,
            content: c.fp,
            block_at,
            record: loc,
            header: h.clone(),
            recode,
            holder: None,
            after_block: false,
        };
        if c.record == loc {
            kept.insert(k.content, kfp);
            blocks.push(r(Some(loc)));
        } else {
            links.push(r(None));
        }
    }
    // An orphan block is kept under one of the live keys that link to it, if placement keeps it
    // or a pinned key names it.
    orphans.retain(|slot, (_, h)| {
        let c = index.content(*slot).copied();
        !kept.contains_key(slot)
            && (pinned.contains(slot)
                || c.is_some_and(|c| {
                    let policy = parts.policies.get(&h.namespace);
                    let block = info(h, c.raw_len, c.units, index.heat(*slot), now_ms, &policy);
                    parts.placement.keep(&block) != Keep::Drop
                }))
    });
    // The live keys that name a block kept here which other keys name too (or no key wrote: an
    // orphan), with their records, in one pass over the keys.
    let many: HashSet<u32> = kept
        .keys()
        .copied()
        .filter(|s| index.content(*s).is_some_and(|c| c.refs > 1))
        .chain(orphans.keys().copied())
        .collect();
    let mut namers: HashMap<u32, Vec<(KeyFp, Loc)>> = HashMap::new();
    if !many.is_empty() {
        for k in index.keys_naming(many.iter().copied()).filter(|k| !is_expired(k, now_s)) {
            namers.entry(k.content).or_default().push((k.fp, k.record));
        }
    }
    let fps: HashMap<u32, ContentFp> = many.iter().filter_map(|s| index.content(*s).map(|c| (*s, c.fp))).collect();
    drop(index);
    // The seq of each segment's current use, against which the headers read are checked.
    let seqs = if many.is_empty() { Vec::new() } else { segment_seqs(parts) };
    for (slot, (loc, block_header)) in orphans {
        // An orphan is kept under the first key found naming it.
        let Some(&(_, own)) = namers.get(&slot).and_then(|n| n.first()) else { continue };
        // The holder's name is in its own record's header.
        let seq = seqs.get(own.segment as usize).copied().unwrap_or(0);
        let Some(holder) = own_header(parts, own, seq)?.filter(|h| header_fp(h) == header_fp(&block_header)) else {
            continue;
        };
        let block = held_block(loc, block_header, holder, own);
        kept.insert(slot, block.kfp);
        blocks.push(block);
    }
    let mut relinked = Vec::new();
    for (slot, fp) in &fps {
        let Some(writer) = kept.get(slot) else { continue };
        let others = namers.get(slot).into_iter().flatten();
        // Keys whose records lie in the victim are relocated as links after their block anyway.
        relinked.extend(others.filter(|(k, at)| k != writer && at.segment != victim).map(|&(k, at)| (*fp, k, at)));
    }
    let relinked = match relinked.len() <= MAX_RELINKS {
        true => relinks(parts, relinked, &seqs),
        false => Vec::new(),
    };
    Ok(in_order(blocks, relinked.into_iter().chain(links)))
}

/// Each block followed by the links that name it (written again from the victim or from
/// elsewhere), then the links whose blocks lie elsewhere. A link needs its block in place; kept
/// side by side, the next cleaning finds a block and its links in one segment, and has none to
/// link again (written after all the blocks instead, the links of a shared hot block drifted
/// into other segments than the block, and every cleaning of it linked them again).
fn in_order(blocks: Vec<Relocation>, links: impl Iterator<Item = Relocation>) -> Vec<Relocation> {
    let mut by_content: HashMap<ContentFp, Vec<Relocation>> = HashMap::new();
    for l in links {
        by_content.entry(l.content).or_default().push(l);
    }
    let mut out = Vec::with_capacity(blocks.len() + by_content.values().map(Vec::len).sum::<usize>());
    for b in blocks {
        let content = b.content;
        out.push(b);
        out.extend(by_content.remove(&content).unwrap_or_default());
    }
    // Where the records they replace lie, whatever order the hash table gave.
    let mut rest: Vec<Relocation> = by_content.into_values().flatten().collect();
    rest.sort_by_key(|r| (r.record.segment, r.record.unit));
    out.extend(rest);
    out
}

/// The header of the record at `at`, if it is one of the segment's current use (`seq`): a record
/// still on its way to the device leaves an older use's bytes there.
fn own_header(parts: &Parts, at: Loc, seq: u64) -> Result<Option<RecordHeader>> {
    Ok(parts.header_at(at)?.filter(|h| h.segment_seq == seq))
}

/// The seq of each segment's current use.
fn segment_seqs(parts: &Parts) -> Vec<u64> {
    parts.log.lock().segments.iter().map(|s| s.seq).collect()
}

/// The seq of `segment`'s current use.
fn segment_seq(parts: &Parts, segment: u32) -> Option<u64> {
    parts.log.lock().segments.get(segment as usize).map(|s| s.seq)
}

/// Links written again, each after its block's new record, for the keys that name a block the
/// cleaning writes again from a record outside the victim (`named`: the block, the key, its
/// record; `seqs`: each segment's current use).
///
/// Replay resolves a link only while its block is stored: once the victim is freed, such a
/// key's record would lie before the block's one remaining record, and a crash would lose it.
/// Written again after that record, each key needs no checkpoint to survive the victim's
/// freeing (`reclaim::shared` checks that every key naming the block did). Each key's name is
/// read from its own record, whose TTL, group and parent the link keeps, and the link is written
/// only while the key still has that record; a record that reads as another key's or another
/// use's, or not at all, is left as it is, and freeing writes the checkpoint.
fn relinks(parts: &Parts, mut named: Vec<(ContentFp, KeyFp, Loc)>, seqs: &[u64]) -> Vec<Relocation> {
    let mut out = Vec::with_capacity(named.len());
    named.sort_by_key(|&(_, _, at)| (at.segment, at.unit));
    for (content, kfp, at) in named {
        let seq = seqs.get(at.segment as usize).copied().unwrap_or(0);
        let header = match own_header(parts, at, seq) {
            Ok(h) => h.filter(|h| header_fp(h) == content && key_fp(&h.namespace, &h.key) == kfp),
            Err(e) => {
                tracing::warn!(segment = at.segment, unit = at.unit, error = %e, "cannot read a record to link again");
                None
            }
        };
        let Some(header) = header else { continue };
        out.push(Relocation {
            namespace: header.namespace.clone(),
            key: header.key.clone(),
            kfp,
            content,
            block_at: None,
            record: at,
            header,
            recode: None,
            holder: None,
            after_block: true,
        });
    }
    out
}

/// What writing one relocation did.
struct Written {
    /// Where its record ends.
    end: Pos,
    /// Bytes its record takes.
    bytes: u64,
    /// For a block recompressed, the bytes its record took before.
    recompressed_from: Option<u64>,
    /// The block it names (for a block recompressed, its new form).
    content: ContentFp,
    /// Whether it was written as a block record (a block relocated, or recompressed into a form
    /// no key had stored).
    block: bool,
}

/// Bytes of relocated records a cleaning hands to the writer before it waits for the ones it
/// handed before them: two windows of writes in flight at most (more for a single larger record).
const WINDOW_BYTES: u64 = 1 << 20;

/// The end of the relocations handed to the writer and not yet waited for. However cleaning
/// ends, it waits for them (dropped unwaited, it waits and ignores the outcome): a later
/// cleaning of the same victim that relocates nothing frees it without waiting, and must not
/// free the only written copy of a block whose new record is still in flight.
struct Handed<'a> {
    parts: &'a Parts,
    end: Option<Pos>,
}

impl Handed<'_> {
    fn add(&mut self, end: Pos) {
        self.end = self.end.max(Some(end));
    }

    /// Waits until everything handed so far is written; returns its end.
    fn wait(&mut self) -> Result<Option<Pos>> {
        let end = self.end.take();
        if let Some(end) = end {
            self.parts.log.wait_written(end)?;
        }
        Ok(end)
    }
}

impl Drop for Handed<'_> {
    fn drop(&mut self) {
        // A failed write poisons the log, and the wait then ends at once.
        let _ = self.wait();
    }
}

/// Writes the relocations of `plan` again. Each block's record is read from the victim, then
/// handed to the writer without waiting for it: the writes of one window of [`WINDOW_BYTES`]
/// are in flight while the next window is read. The reads go one at a time, so that a client's
/// get waits behind at most one of them: with 16 or more in flight at once, gets of 16 KiB
/// blocks on a virtio disk took 1.6-2.8× as long at p99 as on a volume without cleaning, against
/// 0.9-1.5× (docs/benchmarks.md). Returns the blocks written again, as they are or
/// recompressed, and the keys whose records it wrote naming them.
///
/// A record is written again only while its key still has the record it was made from, and
/// keeps that one's expiry to the second, its group and parent ([`carried_header`]). A link
/// whose key has another record now, or has expired, is not written: it loses nothing, since
/// its key's newer record lies elsewhere, and freeing checks for it (`reclaim::shared`). A block
/// whose key was written again with the same bytes meanwhile (a link to them) is still that
/// key's only stored copy of them, and every other key's: it is written again with the expiry
/// of the key's newer record ([`relocate_block`]). A block whose key names it no more is written
/// under a key that links to it, if one of the next few in the plan still does.
fn relocate_all(
    parts: &Parts,
    victim: u32,
    plan: &[Relocation],
    budget: Option<u64>,
    cleaned: &mut Cleaned,
    handed: &mut Handed<'_>,
) -> Result<Moved> {
    let mut progress = Progress {
        parts,
        budget,
        cleaned,
        handed,
        moved: Moved::default(),
        previous: None,
        window: 0,
        started: Instant::now(),
    };
    // Each block with the links that follow it in the plan ([`in_order`]), then the links whose
    // blocks lie elsewhere, a group per block.
    for group in plan.chunk_by(|a, b| b.block_at.is_none() && b.content == a.content) {
        let mut links = group.iter();
        if let Some((block, at)) = group.first().and_then(|b| Some((b, b.block_at?))) {
            links.next();
            // Damaged, its links would name nothing once the victim is freed.
            let Some(read) = read_block(parts, victim, block, at)? else { continue };
            let mut written = relocate_read(parts, victim, block, &read)?.map(|w| (w, block.kfp));
            // Its key names it no more (written again with other bytes, or deleted, since the
            // plan): the links that follow it name it too, and it is written under the first of
            // the next few whose key still has its link, as an orphan the plan found is, rather
            // than dropped with every key that names it.
            if written.is_none() {
                for link in links.by_ref().take(MAX_HOLDER_TRIES) {
                    let held = held_block(at, block.header.clone(), link.header.clone(), link.record);
                    written = relocate_read(parts, victim, &held, &read)?.map(|w| (w, held.kfp));
                    if written.is_some() {
                        break;
                    }
                }
            }
            let Some((written, kfp)) = written else { continue };
            progress.handed(written, kfp)?;
        }
        for link in links {
            if link.after_block && !progress.moved.blocks.contains(&link.content) {
                continue;
            }
            if let Some(written) = relink(parts, link)? {
                progress.handed(written, link.kfp)?;
            }
        }
    }
    Ok(progress.moved)
}

/// A cleaning's writes so far: what they moved, counted, and the pace they keep.
struct Progress<'p, 'h> {
    parts: &'p Parts,
    budget: Option<u64>,
    cleaned: &'p mut Cleaned,
    handed: &'p mut Handed<'h>,
    moved: Moved,
    /// The end of the window before this one, and the bytes handed in this one.
    previous: Option<Pos>,
    window: u64,
    started: Instant,
}

impl Progress<'_, '_> {
    /// `written`, a record naming its block under `kfp`, was handed to the writer: counted at
    /// once (a cleaning that ends early has it written all the same, unless the log fails), and,
    /// once a window is full, the window before is waited for and the pace kept to the budget.
    fn handed(&mut self, written: Written, kfp: KeyFp) -> Result<()> {
        let metrics = &self.parts.metrics;
        if written.block {
            self.moved.blocks.insert(written.content);
        }
        self.moved.namers.entry(written.content).or_default().insert(kfp);
        self.handed.add(written.end);
        self.cleaned.relocated += 1;
        self.cleaned.relocated_bytes += written.bytes;
        metrics.relocated_records.fetch_add(1, Ordering::Relaxed);
        metrics.relocated_bytes.fetch_add(written.bytes, Ordering::Relaxed);
        if let Some(before) = written.recompressed_from {
            let saved = before.saturating_sub(written.bytes);
            self.cleaned.recompressed += 1;
            self.cleaned.recompressed_saved_bytes += saved;
            metrics.recompressed_records.fetch_add(1, Ordering::Relaxed);
            metrics.recompressed_saved_bytes.fetch_add(saved, Ordering::Relaxed);
        }
        self.window += written.bytes;
        if self.window < WINDOW_BYTES {
            return Ok(());
        }
        if let Some(end) = self.previous.replace(written.end) {
            self.parts.log.wait_written(end)?;
        }
        self.window = 0;
        if let Some(budget) = self.budget {
            let due = Duration::from_secs_f64(self.cleaned.relocated_bytes as f64 / budget.max(1) as f64);
            if let Some(rest) = due.checked_sub(self.started.elapsed()) {
                if self.parts.free_segments() > 1 {
                    std::thread::sleep(rest);
                }
            }
        }
        Ok(())
    }
}

/// The header of the record `r` writes, made from the one it replaces (the key's own record
/// for a block kept under a key that links to it), and that record's expiry (a Unix second, 0:
/// never).
fn carried_header(parts: &Parts, r: &Relocation) -> (RecordHeader, u32) {
    let now = parts.clock.now_unix_ms();
    let mut header = r.header.clone();
    header.namespace = r.namespace.clone();
    header.key = r.key.clone();
    let named = r.holder.as_ref().unwrap_or(&r.header);
    let expires = expiry(named.created_unix_ms, named.ttl_secs);
    (header.created_unix_ms, header.ttl_secs) = carry_expiry(expires, now);
    header.group_id = named.group_id;
    header.parent_hash = named.parent_hash;
    header.segment_seq = 0;
    (header, expires)
}

/// Writes a link again ([`relocate_all`]).
fn relink(parts: &Parts, r: &Relocation) -> Result<Option<Written>> {
    let (mut header, expires) = carried_header(parts, r);
    if expires != 0 && expires <= now_s(parts.clock.now_unix_ms()) {
        // Expired since the plan: written again, it would be found again.
        return Ok(None);
    }
    header.kind = RecordKind::Link;
    header.stored_len = 0;
    header.payload_crc = 0;
    let item = Prepared::without_payload(header, r.kfp, r.content, Some(r.kfp)).replacing_record(r.record);
    Ok(append(parts, item)?.map(|(end, bytes, _)| Written {
        end,
        bytes,
        recompressed_from: None,
        content: r.content,
        block: false,
    }))
}

/// A block's record read from the victim and checked.
struct ReadBlock {
    buf: Arc<PooledBuf>,
    /// Where its payload lies in `buf`.
    start: usize,
    len: usize,
}

/// The record of the block `r` relocates, at `loc` in the victim; `None` when it fails its
/// checks (said at warn level: the block is dropped, and with it the keys that name it).
fn read_block(parts: &Parts, victim: u32, r: &Relocation, loc: Loc) -> Result<Option<ReadBlock>> {
    let mut read = parts.pool.get(r.header.record_bytes() as usize);
    parts.log.dev.read_at(&mut read, parts.log.sb.unit_offset(victim, loc.unit))?;
    let on_disk = RecordHeader::decode(&read);
    if !on_disk.as_ref().is_ok_and(|h| header_fp(h) == r.content) || check_payload(&r.header, &read).is_err() {
        tracing::warn!(segment = victim, unit = loc.unit, "a block to relocate is damaged; dropping it");
        return Ok(None);
    }
    let (start, len) = (r.header.payload_offset() as usize, r.header.stored_len as usize);
    Ok(Some(ReadBlock { buf: Arc::new(read), start, len }))
}

/// Writes the block `r` relocates again from its record `read`, recompressed if placement asked
/// and it may be ([`relocate_all`]).
fn relocate_read(parts: &Parts, victim: u32, r: &Relocation, read: &ReadBlock) -> Result<Option<Written>> {
    let (mut header, _) = carried_header(parts, r);
    let ReadBlock { buf, start, len } = read;
    if let (Some(spec), Some(loc)) = (r.recode, r.block_at) {
        let frame = Block::new(Bytes::Shared(Arc::clone(buf)), *start, *len, BlockMeta::of(r.header.clone(), loc));
        if let Some((mut new_header, stored)) = recoded_form(parts, r, frame, spec) {
            (new_header.created_unix_ms, new_header.ttl_secs) = (header.created_unix_ms, header.ttl_secs);
            // Only while this key alone names the block, from the same record: a key that came
            // to share it since the plan would lose it with the segment. Then it is relocated as
            // it is, below. A form some key stored already is linked to, unless its record lies
            // in the victim (it would go with it).
            let content = header_fp(&new_header);
            let in_victim = {
                let index = parts.index_read();
                index.content_slot(&content).and_then(|s| index.content(s)).is_some_and(|c| c.record.segment == victim)
            };
            if !in_victim {
                let item = Prepared::replacing(new_header, &stored, &parts.pool, r.kfp, r.content)
                    .sole()
                    .replacing_record(r.record);
                if let Some((end, bytes, block)) = append(parts, item)? {
                    let recompressed_from = Some(r.header.record_bytes());
                    return Ok(Some(Written { end, bytes, recompressed_from, content, block }));
                }
            }
        }
    }
    header.kind = RecordKind::Block;
    let stored = buf.get(*start..*start + *len).unwrap_or_default();
    relocate_block(parts, r, header, stored)
}

/// Writes a block again under its key, from the record the key has: the one the cleaning planned
/// from or, when the key was written again with the same bytes since (a link to the block in
/// the victim, written before the block's new record), that newer record, whose expiry it then
/// takes, and its group and parent, read from its header once it is written (the index does not
/// hold them; should the header not read as that record's, the older record's stay). Asked again
/// each time the key's record changes, [`REWRITE_TRIES`] times at most; `None` once the key
/// names other bytes or none, or the bytes are stored outside the victim.
fn relocate_block(parts: &Parts, r: &Relocation, mut header: RecordHeader, stored: &[u8]) -> Result<Option<Written>> {
    let mut record = r.record;
    for _ in 0..REWRITE_TRIES {
        let item = Prepared::replacing(header.clone(), stored, &parts.pool, r.kfp, r.content).replacing_record(record);
        if let Some((end, bytes, block)) = append(parts, item)? {
            return Ok(Some(Written { end, bytes, recompressed_from: None, content: r.content, block }));
        }
        let newer = {
            let index = parts.index_read();
            // Only while the bytes' one record is still the one in the victim: stored again
            // elsewhere (the key deleted and put again), they are safe without this copy.
            let named = |k: &&crate::index::KeyEntry| {
                index.content(k.content).is_some_and(|c| c.fp == r.content && Some(c.record) == r.block_at)
            };
            index.key(&r.kfp).filter(named).map(|k| (k.record, k.expires_unix_s))
        };
        let Some((newer, expires)) = newer else { return Ok(None) };
        record = newer;
        (header.created_unix_ms, header.ttl_secs) = carry_expiry(expires, parts.clock.now_unix_ms());
        if let Some(h) = newer_header(parts, r, newer) {
            (header.group_id, header.parent_hash) = (h.group_id, h.parent_hash);
        }
    }
    Ok(None)
}

/// The header of `r`'s key's record at `at`, if it reads as that record: of the segment's
/// current use, the key's, naming the block. A link a put has reserved but not yet written
/// leaves an older use's bytes there: it is read again once its first unit is written. A read
/// that fails, or a log that fails meanwhile, is said at debug level: none.
fn newer_header(parts: &Parts, r: &Relocation, at: Loc) -> Option<RecordHeader> {
    let seq = segment_seq(parts, at.segment)?;
    let read = || match own_header(parts, at, seq) {
        Ok(h) => h.filter(|h| key_fp(&h.namespace, &h.key) == r.kfp && header_fp(h) == r.content),
        Err(e) => {
            tracing::debug!(segment = at.segment, unit = at.unit, error = %e, "cannot read a key's newer record");
            None
        }
    };
    read().or_else(|| {
        parts.log.wait_written(Pos { seq, unit: at.unit + 1 }).ok()?;
        read()
    })
}

/// Seconds since the Unix epoch at `now_ms`, as expiry times count them.
fn now_s(now_ms: u64) -> u32 {
    u32::try_from(now_ms / 1000).unwrap_or(u32::MAX)
}

/// The creation time and TTL a record written at `now_ms` carries to expire at `expires`
/// (`recovery::expiry`'s Unix second; 0: never), expired already or not: a block kept for the
/// other keys that name it must not bring back its own expired key.
fn carry_expiry(expires: u32, now_ms: u64) -> (u64, u32) {
    match expires {
        0 => (now_ms, 0),
        e if e > now_s(now_ms) => (now_ms, e - now_s(now_ms)),
        e => (u64::from(e - 1) * 1000, 1),
    }
}

/// Appends one record written again; `None` when its key no longer names what it replaces (or,
/// for a recompressed block, another key names it too). With where it ends, the bytes it takes,
/// and whether it was written as a block (a recompressed form some key stored already is
/// written as a link to it).
fn append(parts: &Parts, mut item: Prepared<'_>) -> Result<Option<(Pos, u64, bool)>> {
    match parts.append_handed(std::slice::from_mut(&mut item)) {
        Ok(Some(end)) => Ok(Some((end, item.header.record_bytes(), item.header.kind == RecordKind::Block))),
        Ok(None) => Ok(None),
        Err(StoreError::InvalidArgument { what: "rename", detail }) if detail == SOURCE_CHANGED => Ok(None),
        Err(e) => Err(e),
    }
}

/// The relocated block `frame` in `spec`'s form, or `None` to relocate it as it is (already in
/// that form, or one its namespace's policy or its own form does not allow; said at debug
/// level: placement asking for what the engine will not do is not a fault).
fn recoded_form(parts: &Parts, r: &Relocation, frame: Block, spec: CodecSpec) -> Option<(RecordHeader, PooledBuf)> {
    // A lossy form is final for cleaning: recoded again it would carry the name of that codec's
    // form of the original bytes with other bytes (quant4 of quant8 is not quant4), and other
    // keys' copies share that name.
    let m = &frame.meta;
    if stored_codec(&m.desc, m.raw_len, &m.compression).is_some_and(|c| c.is_lossy()) {
        return None;
    }
    match parts.recode(&r.namespace, &r.key, frame, spec, true) {
        Ok(Recoded::New { header, stored }) => Some((*header, stored)),
        Ok(Recoded::Same | Recoded::Gone) => None,
        Err(e) => {
            tracing::debug!(key = %r.key, codec = %spec, reason = %e, "kept as it is instead of recompressed");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_carried_expiry_falls_in_the_same_second_expired_or_not() {
        let now = 1_700_000_040_250;
        assert_eq!(carry_expiry(0, now), (now, 0), "never stays never");
        for expires in [1_699_999_000, 1_700_000_040, 1_700_000_041, 1_700_000_100, u32::MAX] {
            let (created, ttl) = carry_expiry(expires, now);
            assert!(ttl > 0, "{expires}: a TTL of 0 would never expire");
            assert_eq!(expiry(created, ttl), expires, "{expires}");
        }
    }
}
