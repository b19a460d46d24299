//! Placement's drops: the keys of contexts a planner dropped leave the index and the DRAM tier
//! at once ([`crate::placement::Placement::take_drops`]), so they read as misses and their
//! records are dead space that the choice of cleaning's victims sees. Pinned keys stay.
//!
//! Nothing is written to the log. After a crash, a key dropped since the last checkpoint may be
//! found again, with the bytes it was dropped with (still right), until cleaning reaches its
//! record or it is written again; a checkpoint written before a segment that is not the oldest is
//! freed (`super::free_victim`) keeps an older version of a dropped key from coming back, as it
//! does for every key that segment held. A client that deletes a dropped key still gets its
//! tombstone written ([`DroppedKeys`]): a crash never brings back a key its client deleted. The
//! same set covers a segment that reclaim or cleaning frees, until its freeing is durable.

use std::collections::HashSet;
use std::sync::atomic::Ordering;
use std::sync::Mutex;

use crate::index::KeyFp;
use crate::parts::Parts;

/// Keys remembered as dropped before a delete of an absent key writes its tombstone whatever the
/// key (about 50 MB).
const MAX_REMEMBERED: usize = 1 << 20;

/// Keys whose records a crash may still bring back although the index no longer names them: a
/// delete of one writes its tombstone, or a crash could bring back a key its client deleted.
///
/// - Keys placement dropped. A key is forgotten once any record of it is written (a put, a link,
///   a tombstone: the newest record wins at recovery). Past [`MAX_REMEMBERED`] keys, every delete
///   of an absent key writes its tombstone until the store is opened again.
/// - Every key, while a reclaimed or cleaned segment is out of the index but its freeing is not
///   yet durable ([`DroppedKeys::open_window`]): a delete does not take the log lock to find its
///   key absent, so it could otherwise return before the segment's header is erased.
///
/// A leaf lock.
#[derive(Debug, Default)]
pub(crate) struct DroppedKeys {
    state: Mutex<Dropped>,
}

#[derive(Debug, Default)]
struct Dropped {
    keys: HashSet<KeyFp>,
    /// Every absent key may come back: too many were remembered, or a freed segment's drop
    /// could not be made durable.
    every: bool,
    /// Open [`DropWindow`]s.
    windows: u32,
}

impl DroppedKeys {
    fn lock(&self) -> std::sync::MutexGuard<'_, Dropped> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn insert(&self, key: KeyFp) {
        let mut state = self.lock();
        if state.keys.len() >= MAX_REMEMBERED {
            state.keys = HashSet::new();
            state.every = true;
        }
        state.keys.insert(key);
    }

    /// A record of `key` was written: it supersedes the dropped one.
    pub(crate) fn forget(&self, key: &KeyFp) {
        let mut state = self.lock();
        if !state.keys.is_empty() {
            state.keys.remove(key);
        }
    }

    /// Whether a crash could bring back a record of `key` that the index no longer names.
    pub(crate) fn may_hold(&self, key: &KeyFp) -> bool {
        let state = self.lock();
        state.every || state.windows > 0 || state.keys.contains(key)
    }

    /// Every key may come back until the window is closed: open it before a segment's keys
    /// leave the index, close it once the segment's freeing is durable.
    pub(crate) fn open_window(&self) -> DropWindow<'_> {
        self.lock().windows += 1;
        DropWindow { keys: self, durable: false }
    }
}

/// See [`DroppedKeys::open_window`]. Dropped without [`DropWindow::close`] (the freeing failed
/// part way), every absent key may come back until the store is opened again.
pub(crate) struct DropWindow<'a> {
    keys: &'a DroppedKeys,
    durable: bool,
}

impl DropWindow<'_> {
    /// The segment's freeing is durable: what it held cannot come back.
    pub(crate) fn close(mut self) {
        self.durable = true;
    }
}

impl Drop for DropWindow<'_> {
    fn drop(&mut self) {
        let mut state = self.keys.lock();
        state.windows = state.windows.saturating_sub(1);
        state.every |= !self.durable;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn key(n: u8) -> KeyFp {
        crate::index::key_fp("ns", &format!("k{n}"))
    }

    #[test]
    fn every_key_may_come_back_while_a_window_is_open_and_none_after_it_closes() {
        let keys = DroppedKeys::default();
        keys.insert(key(1));
        assert!(keys.may_hold(&key(1)) && !keys.may_hold(&key(2)));
        let a = keys.open_window();
        let b = keys.open_window();
        assert!(keys.may_hold(&key(2)));
        a.close();
        assert!(keys.may_hold(&key(2)), "one window is still open");
        b.close();
        assert!(!keys.may_hold(&key(2)));
        keys.forget(&key(1));
        assert!(!keys.may_hold(&key(1)));
    }

    #[test]
    fn a_window_dropped_before_its_freeing_was_durable_leaves_every_key_in_doubt() {
        let keys = DroppedKeys::default();
        drop(keys.open_window());
        assert!(keys.may_hold(&key(3)));
    }
}
