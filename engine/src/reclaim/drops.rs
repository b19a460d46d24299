//! Placement's drops: the keys of contexts a planner dropped leave the index and the DRAM tier
//! at once ([`crate::placement::Placement::take_drops`]), so they read as misses and their
//! records are dead space that the choice of cleaning's victims sees. Pinned keys stay.
//!
//! Nothing is written to the log. After a crash, a key dropped since the last checkpoint may be
//! found again, with the bytes it was dropped with (still right), until cleaning reaches its
//! record or it is written again; without a checkpoint, one dropped earlier may too. A
//! checkpoint written before a segment that is not the oldest is freed (`super::free_victim`)
//! keeps an older version of a dropped key from coming back, as it does for every key that
//! segment held (and the superblock's `FreedAhead` when that checkpoint is lost). A delete
//! writes its tombstone whether or not the index names the key (`Store::delete`): a crash never
//! brings back a key its client deleted.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use crate::index::KeyFp;
use crate::parts::Parts;

/// Removes the keys placement dropped since it was last asked.
/// Takes the log lock and the index's write lock: call it with no lock held.
pub(crate) fn apply(parts: &Parts) {
    let keys = parts.placement.take_drops();
    if keys.is_empty() {
        return;
    }
    // A pinned key stays (a client was promised it); cleaning drops it once it is unpinned, as
    // it drops every block of a dropped context. Taken before the index's lock: a leaf lock.
    let pinned: HashSet<KeyFp> = parts.pins.live(parts.clock.now_unix_ms()).into_iter().collect();
    let mut removed = 0;
    // Under the log lock, as every change a record makes: a put that found the bytes it links
    // to stored, and reserved its link, applies it before this can take the bytes' last key.
    let log = parts.log.lock();
    let mut index = parts.index_write();
    for (key, record) in keys.into_iter().filter(|(k, _)| !pinned.contains(&k.0)) {
        // Only the record it was dropped at: a key written again since (put, linked, renamed
        // to), or deleted, expired or reclaimed, keeps what it is now.
        if index.key(&key.0).is_some_and(|e| e.record == record) && parts.unindex_key(&mut index, &key.0) {
            removed += 1;
        }
    }
    drop(index);
    drop(log);
    parts.metrics.planner_dropped_keys.fetch_add(removed, Ordering::Relaxed);
}
