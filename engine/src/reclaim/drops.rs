//! Placement's drops: the keys of contexts a planner dropped leave the index and the DRAM tier
//! at once ([`crate::placement::Placement::take_drops`]), so they read as misses and their
//! records are dead space that the choice of cleaning's victims sees. Pinned keys stay.
//!
//! Nothing is written to the log. The same holds as for keys that expire: after a crash, a key
//! dropped since the last checkpoint may be found again, with its own bytes (which are still
//! right), until a later drop or cleaning lets it go; a checkpoint written before a segment that
//! is not the oldest is freed (`super::free_victim`) keeps an older version of a dropped key from
//! coming back, as it does for every key that segment held.

use std::collections::HashSet;
use std::sync::atomic::Ordering;

use crate::index::KeyFp;
use crate::parts::Parts;

/// Removes the keys placement dropped since it was last asked; returns how many were found.
/// Takes the index's write lock: call it with no lock held.
pub(crate) fn apply(parts: &Parts) -> u64 {
    let keys = parts.placement.take_drops();
    if keys.is_empty() {
        return 0;
    }
    // A pinned key stays (a client was promised it); cleaning drops it once it is unpinned, as
    // it drops every block of a dropped context. Taken before the index's lock: a leaf lock.
    let pinned: HashSet<KeyFp> = parts.pins.live(parts.clock.now_unix_ms()).into_iter().collect();
    let mut removed = 0;
    let mut index = parts.index_write();
    for key in keys.into_iter().filter(|k| !pinned.contains(&k.0)) {
        let content = index.key(&key.0).and_then(|k| index.content(k.content)).map(|c| c.fp);
        if !index.remove_key(&key.0) {
            continue; // deleted, expired or reclaimed since
        }
        removed += 1;
        // The block's copy in memory goes with its last key.
        if let Some(fp) = content.filter(|fp| index.content_slot(fp).is_none()) {
            parts.tiers.remove(&fp);
        }
    }
    drop(index);
    parts.metrics.planner_dropped_keys.fetch_add(removed, Ordering::Relaxed);
    removed
}
