//! Placement's drops: the keys of contexts a planner dropped leave the index and the DRAM tier
//! at once ([`crate::placement::Placement::take_drops`]), so they read as misses and their
//! records are dead space that the choice of cleaning's victims sees. Pinned keys stay.
//!
//! Nothing is written to the log. After a crash, a key dropped since the last checkpoint may be
//! found again, with the bytes it was dropped with (still right), until cleaning reaches its
//! record or it is written again; a checkpoint written before a segment that is not the oldest is
//! freed (`super::free_victim`) keeps an older version of a dropped key from coming back, as it
//! does for every key that segment held. A client that deletes a dropped key still gets its
//! tombstone written ([`DroppedKeys`]): a crash never brings back a key its client deleted.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::index::KeyFp;
use crate::parts::Parts;

/// Keys remembered as dropped before a delete of an absent key writes its tombstone whatever the
/// key (about 50 MB).
const MAX_REMEMBERED: usize = 1 << 20;

/// Keys placement dropped whose records a crash may still bring back: a delete of one writes its
/// tombstone although the index no longer names it, or a crash could bring back a key its client
/// deleted. A key is forgotten once any record of it is written (a put, a link, a tombstone: the
/// newest record wins at recovery). Past [`MAX_REMEMBERED`] keys, every delete of an absent key
/// writes its tombstone until the store is opened again. A leaf lock.
#[derive(Debug, Default)]
pub(crate) struct DroppedKeys {
    state: Mutex<(HashSet<KeyFp>, bool)>,
}

impl DroppedKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, (HashSet<KeyFp>, bool)> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, key: KeyFp) {
        let mut state = self.lock();
        if state.0.len() >= MAX_REMEMBERED {
            state.0 = HashSet::new();
            state.1 = true;
        }
        state.0.insert(key);
    }

    /// A record of `key` was written: it supersedes the dropped one.
    pub(crate) fn forget(&self, key: &KeyFp) {
        let mut state = self.lock();
        if !state.0.is_empty() {
            state.0.remove(key);
        }
    }

    /// Whether a crash could bring back a record of `key` that the index no longer names.
    pub(crate) fn may_hold(&self, key: &KeyFp) -> bool {
        let state = self.lock();
        state.1 || state.0.contains(key)
    }
}

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
            parts.dropped_keys.insert(key.0);
        }
    }
    drop(index);
    drop(log);
    parts.metrics.planner_dropped_keys.fetch_add(removed, Ordering::Relaxed);
}
