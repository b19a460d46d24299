//! Reclaim: emptying a segment, whole when the volume is full, or ahead of need by a cleaner
//! that first relocates the live blocks placement keeps (`clean.rs`, run by `cleaner.rs`).
//!
//! Everything reclaim decides lives here: which sealed segment goes (placement's choice among
//! the segments that hold no pinned key's records, `pins.rs`), dropping what it held from the
//! index and the tiers, whether a checkpoint must be written first, and freeing it durably. A
//! cache drops what the segment holds; a put never fails for lack of space.

pub(crate) mod clean;
pub mod cleaner;
pub(crate) mod control;
pub(crate) mod drops;
pub(crate) mod pins;

use std::collections::{HashMap, HashSet};
use std::sync::atomic::Ordering;

use crate::checkpoint::SealedSegment;
use crate::error::{Result, StoreError};
use crate::index::{ContentFp, KeyFp};
use crate::log::{Loc, LogState, Pos, SegState};
use crate::parts::Parts;
use crate::placement::{Fifo, SegmentView};

/// Empties `victim`, a sealed segment [`victim`] chose, and returns it, ready for a new use.
/// Whoever chose it made the records that superseded its records durable first
/// ([`crate::log::Log::superseded_unsynced`]): the erasure of its header must not outlive them
/// in a crash.
///
/// The victim leaves the index before its header is zeroed, and its header is zeroed and synced
/// before reclaim returns (before anything is written into it), so what it held can never come
/// back after a crash. A victim that is not the oldest could hold the newest version of a key
/// whose older version lives in an older segment; unless the newest checkpoint already covers
/// the victim and every older segment, a checkpoint written first makes sure replay never
/// brings that older version back; and the superblock records the victim before its header
/// goes, so that an open without that checkpoint voids such keys rather than trust the log
/// alone (`free_victim`).
pub(crate) fn reclaim(parts: &Parts, state: &mut LogState, victim: u32) -> Result<u32> {
    // Whether the victim is the oldest is asked of every sealed segment, the one a cleaner is
    // emptying too: until the cleaner frees it, replay would still read it.
    free_victim(parts, state, &every_sealed_view(parts, state), victim, false)?;
    Ok(victim)
}

/// The segment [`reclaim`] would free now.
pub(crate) fn victim(parts: &Parts, state: &LogState) -> Result<u32> {
    let sealed = sealed_views(parts, state);
    if sealed.is_empty() {
        return Err(StoreError::invalid("volume", "no sealed segment to reclaim"));
    }
    Ok(choose_victim(parts, &sealed))
}

/// Every sealed segment as placement sees it (the one a cleaner is emptying left out, unless it
/// is the only one), with the units of its records still live.
pub(crate) fn sealed_views(parts: &Parts, state: &LogState) -> Vec<SegmentView> {
    let views = every_sealed_view(parts, state);
    match state.cleaning {
        Some(c) if views.len() > 1 => views.into_iter().filter(|v| v.index != c).collect(),
        _ => views,
    }
}

/// Every sealed segment as placement sees it, the one a cleaner is emptying included.
fn every_sealed_view(parts: &Parts, state: &LogState) -> Vec<SegmentView> {
    let live = parts.index_read().live_units(state.segments.len());
    state
        .segments
        .iter()
        .enumerate()
        .filter_map(|(i, s)| match s.state {
            SegState::Sealed { end_unit } => Some(SegmentView {
                index: i as u32,
                seq: s.seq,
                created_unix_ms: s.created_unix_ms,
                end_unit,
                live_units: u32::try_from(live.get(i).copied().unwrap_or(0)).unwrap_or(u32::MAX),
            }),
            _ => None,
        })
        .collect()
}

/// Drops what `victim` holds from the index and the tiers and frees it durably (see
/// [`reclaim`] for the order that keeps drops from coming back); after a checkpoint when
/// `checkpoint` says so (a block a cleaner relocated is still named from before it,
/// [`shared`]) or the victim needs one.
pub(crate) fn free_victim(
    parts: &Parts,
    state: &mut LogState,
    sealed: &[SegmentView],
    victim: u32,
    checkpoint: bool,
) -> Result<()> {
    debug_assert!(
        parts.log.superseded_unsynced(state, victim).is_none(),
        "segment {victim} freed before the records that superseded its records are durable"
    );
    let checkpoint_first = checkpoint || needs_checkpoint(parts, sealed, victim);
    let victim_seq = state.segments.get(victim as usize).map_or(0, |s| s.seq);
    // Recorded in the superblock unless it is the oldest use: replay from the log alone would
    // bring back what it held the newest versions of. The newest use is recorded too (the only
    // one left), so that the next use never gets its seq (`recovery`, `next_seq`).
    let ahead = Fifo::oldest(sealed).is_some_and(|oldest| oldest != victim)
        || state.segments.iter().filter(|s| s.state != SegState::Free).all(|s| s.seq <= victim_seq);
    // The checkpoint that knows the victim is gone: the one written first (its seq is known
    // now: snapshots are numbered under this lock; it counts even if it does not fit its slot,
    // since then no checkpoint on disk knows), or the newest on disk, which covers the victim.
    let knows = if checkpoint_first { state.next_checkpoint_seq } else { parts.checkpoints.newest_seq() };
    parts.log.mark_free(state, victim);
    let dropped = parts.index_write().drop_segment(victim);
    parts.tiers.drop_segment(victim);
    if checkpoint_first {
        if let Err(e) = parts.checkpoint_now(state) {
            // The victim is out of the index and free in memory, its header intact: reused
            // without this checkpoint, a crash could bring back older versions of the keys it
            // held the newest of. Nothing more is written until the volume is opened again.
            parts.checkpoints.count_failure();
            parts.log.poison(state, format!("cannot write the checkpoint freeing segment {victim} needs: {e}"));
            return Err(e);
        }
    }
    if ahead {
        // Recorded after that checkpoint, so that a crash before it leaves nothing that voids
        // keys (the victim is still whole then), and before the header's erasure, which makes the
        // victim's loss durable. A crash between the checkpoint and this record leaves the
        // header, which the next open erases as stale, recording it first (`recovery`).
        parts.log.record_freed_ahead(state, victim_seq, knows, &parts.policies.stored())?;
        parts.metrics.segments_freed_ahead.fetch_add(1, Ordering::Relaxed);
    }
    parts.log.erase_segment_header(state, victim)?;
    parts.metrics.count_eviction(&dropped);
    parts.placement.dropped(&dropped.key_ids);
    tracing::debug!(segment = victim, keys = dropped.keys, blocks = dropped.blocks, "segment reclaimed");
    Ok(())
}

/// Whether freeing `victim` needs a checkpoint first: unless it is the oldest of `sealed`, it
/// could hold the newest version of a key whose older version replay would otherwise bring
/// back from an older segment, unless the newest checkpoint covers it and every older one.
fn needs_checkpoint(parts: &Parts, sealed: &[SegmentView], victim: u32) -> bool {
    if Fifo::oldest(sealed).unwrap_or(victim) == victim {
        return false;
    }
    let views: Vec<SealedSegment> =
        sealed.iter().map(|s| SealedSegment { index: s.index, seq: s.seq, end_unit: s.end_unit }).collect();
    !parts.checkpoints.cover_through(&views, victim)
}

/// What a cleaning wrote again: the blocks (their content as written), and for each content
/// the keys whose new records name it (the key a block was written under, and the links written
/// after it).
#[derive(Debug, Default)]
pub(crate) struct Moved {
    pub blocks: HashSet<ContentFp>,
    pub namers: HashMap<ContentFp, HashSet<KeyFp>>,
}

/// Whether some key names a block a cleaner relocated (`moved`) from a record that lies before
/// the block's new record in the log: a link, or a record of the same bytes, left where it was,
/// or one a checkpoint covers while it places the block in the victim. Freeing the victim then
/// needs a checkpoint, or a crash would leave that key naming nothing (replay resolves a link
/// only while its bytes are stored). A key counts as safe only while it still names the block
/// from a record at or after the block's new one: those the cleaning wrote (the block's own,
/// and the links written again after it); a checkpoint that covers such a record covers the
/// block's too, since it describes a written prefix of the log. Called under the log lock: no
/// key can come to name the block meanwhile.
fn shared(parts: &Parts, state: &LogState, moved: &Moved) -> bool {
    if moved.blocks.is_empty() {
        return false;
    }
    let pos = |at: Loc| Pos { seq: state.segments.get(at.segment as usize).map_or(0, |s| s.seq), unit: at.unit };
    let index = parts.index_read();
    moved.blocks.iter().any(|fp| {
        let Some(slot) = index.content_slot(fp) else { return false };
        let Some(c) = index.content(slot) else { return false };
        let from = pos(c.record);
        let after = moved.namers.get(fp).map_or(0, |keys| {
            keys.iter().filter(|k| index.key(k).is_some_and(|e| e.content == slot && pos(e.record) >= from)).count()
        });
        c.refs as usize > after
    })
}

/// Takes the log lock to free `victim`, a segment a cleaner emptied (its mark still set) after
/// writing again what `moved` says, and says whether those blocks are [`shared`]. When freeing
/// it writes a checkpoint, the lock is taken once no other writer's record is in flight
/// ([`crate::log::Log::lock_quiet`]): a checkpoint describes a written prefix of the log. Records
/// that superseded the victim's are made durable first, without the lock.
pub(crate) fn lock_to_free<'a>(
    parts: &'a Parts,
    victim: u32,
    moved: &Moved,
) -> Result<(std::sync::MutexGuard<'a, LogState>, bool)> {
    loop {
        let mut state = parts.log.lock();
        let moved_shared = shared(parts, &state, moved);
        if !state.nothing_in_flight()
            && (moved_shared || needs_checkpoint(parts, &every_sealed_view(parts, &state), victim))
        {
            drop(state);
            state = parts.log.lock_quiet();
        }
        if let Some(end) = parts.log.superseded_unsynced(&state, victim) {
            drop(state);
            parts.log.make_durable(end)?;
            continue;
        }
        // Asked again: the lock may have been let go meanwhile.
        let moved_shared = shared(parts, &state, moved);
        return Ok((state, moved_shared));
    }
}

/// Placement's choice among the sealed segments that hold no pinned key's records; among all of
/// them when every one does (pins are advice, never a reason to refuse a put).
pub(crate) fn choose_victim(parts: &Parts, sealed: &[SegmentView]) -> u32 {
    let pinned = {
        let keys = parts.pins.live(parts.clock.now_unix_ms());
        if keys.is_empty() {
            Default::default()
        } else {
            pins::segments_of(&parts.index_read(), &keys)
        }
    };
    let unpinned: Vec<SegmentView> = sealed.iter().filter(|s| !pinned.contains(&s.index)).copied().collect();
    let candidates = if unpinned.is_empty() {
        parts.metrics.pins_overridden.fetch_add(1, Ordering::Relaxed);
        tracing::warn!("every sealed segment holds a pinned key: reclaiming the oldest anyway");
        sealed
    } else {
        &unpinned
    };
    let chosen = parts.placement.victim(candidates);
    if candidates.iter().any(|s| s.index == chosen) {
        return chosen;
    }
    tracing::warn!(chosen, "placement chose a segment that cannot be reclaimed; reclaiming the oldest");
    Fifo::oldest(candidates).unwrap_or(chosen)
}
