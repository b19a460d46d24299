//! Pins: keys a client has found and is about to read, kept out of reclaim's way.
//!
//! LMCache pins the chunks a lookup found and unpins them once it has loaded them; a cache that
//! evicts a pinned chunk in between turns a hit it already promised into a miss. A full volume
//! reclaims a whole segment at a time, so reclaim passes over segments holding a pinned key's
//! records (its own record and its block's) while any other sealed segment is left. Pins are
//! advice, never a reason to refuse a put: when every sealed segment holds a pin, the oldest is
//! reclaimed anyway. A pin lapses `ttl` after it was last taken, so a client that dies holding
//! pins cannot keep segments forever.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;

use crate::index::{Index, KeyFp};

#[derive(Debug, Clone, Copy)]
struct Pin {
    /// Pins taken and not yet released.
    count: u32,
    /// Unix milliseconds after which the pin no longer counts.
    lapses_unix_ms: u64,
}

/// The pins of a store. A leaf lock: never held while another of the store's locks is taken.
#[derive(Debug, Default)]
pub(crate) struct Pins {
    table: Mutex<HashMap<KeyFp, Pin>>,
}

impl Pins {
    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<KeyFp, Pin>> {
        self.table.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Takes one more pin on `key`, lapsing at `lapses_unix_ms` (a later pin extends it).
    pub(crate) fn pin(&self, key: KeyFp, lapses_unix_ms: u64) {
        let mut table = self.table();
        let pin = table.entry(key).or_insert(Pin { count: 0, lapses_unix_ms });
        pin.count = pin.count.saturating_add(1);
        pin.lapses_unix_ms = pin.lapses_unix_ms.max(lapses_unix_ms);
    }

    /// Releases one pin on `key`; whether it held one.
    pub(crate) fn unpin(&self, key: &KeyFp) -> bool {
        let mut table = self.table();
        let Some(pin) = table.get_mut(key) else { return false };
        pin.count -= 1;
        if pin.count == 0 {
            table.remove(key);
        }
        true
    }

    /// Keys pinned at `now_unix_ms`; lapsed pins are forgotten on the way.
    pub(crate) fn live(&self, now_unix_ms: u64) -> Vec<KeyFp> {
        let mut table = self.table();
        table.retain(|_, p| p.lapses_unix_ms > now_unix_ms);
        table.keys().copied().collect()
    }

    /// Keys pinned at `now_unix_ms`, counted.
    pub(crate) fn count(&self, now_unix_ms: u64) -> u64 {
        self.table().values().filter(|p| p.lapses_unix_ms > now_unix_ms).count() as u64
    }
}

/// Segments holding the records that `keys` need: each key's own record and its block's.
pub(crate) fn segments_of(index: &Index, keys: &[KeyFp]) -> HashSet<u32> {
    let mut segments = HashSet::new();
    for entry in keys.iter().filter_map(|k| index.key(k)) {
        segments.insert(entry.record.segment);
        if let Some(block) = index.content(entry.content) {
            segments.insert(block.record.segment);
        }
    }
    segments
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pins_count_release_and_lapse() {
        let pins = Pins::default();
        let (a, b) = ([1u8; 16], [2u8; 16]);
        pins.pin(a, 1_000);
        pins.pin(a, 500);
        pins.pin(b, 2_000);
        assert_eq!(pins.count(0), 2);
        // A second pin never shortens the first.
        assert_eq!(pins.live(999).len(), 2);
        assert!(pins.unpin(&a));
        assert_eq!(pins.count(0), 2, "a is pinned once more");
        assert!(pins.unpin(&a));
        assert!(!pins.unpin(&a), "no pin left to release");
        assert_eq!(pins.live(0), vec![b]);
        assert!(pins.live(2_000).is_empty(), "b lapsed");
        assert!(!pins.unpin(&b), "a lapsed pin is forgotten");
    }
}
