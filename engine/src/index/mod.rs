//! The in-memory index: key → stored block → location.
//!
//! Keys and blocks are held by 128-bit fingerprints (truncated blake3 of namespace and key, or of
//! namespace and content hash), never by their strings, so an entry has a fixed small size; key
//! names live on disk in record headers and segment summaries. Two tables:
//!
//! - `keys`: fingerprint → block slot, the key's own record (block or link), expiry, namespace;
//! - `contents`: a slab of stored blocks (fingerprint, location, size, refcount), found by
//!   fingerprint through `content_table`.
//!
//! The index is changed in log order only (under the log's lock), so replaying the log from a
//! checkpoint rebuilds exactly the index that was in memory.

mod fingerprint;

use hashbrown::HashTable;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};

use kvhoard_format::checkpoint as ckpt;

use fingerprint::hash_of;
pub use fingerprint::KeyId;
pub(crate) use fingerprint::{bytes_prefix, content_fp, group_fp, header_fp, key_fp, ContentFp, KeyFp};

use crate::log::Loc;

/// A key's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyEntry {
    /// Fingerprint of (namespace, key).
    pub fp: KeyFp,
    /// Slot of the block in the content slab.
    pub content: u32,
    /// The key's own record (block or link).
    pub record: Loc,
    /// Unix seconds after which the key is expired; 0 = never.
    pub expires_unix_s: u32,
    /// Namespace id.
    pub ns: u16,
}

/// A stored block's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ContentEntry {
    /// Fingerprint of (namespace, content hash).
    pub fp: ContentFp,
    /// The block record.
    pub record: Loc,
    /// Units the record occupies.
    pub units: u32,
    /// Raw bytes of the block.
    pub raw_len: u32,
    /// Keys that refer to it; 0 marks a free slot.
    pub refs: u32,
    /// Namespace id.
    pub ns: u16,
    /// What kind of codec stored it (`kvhoard_kernels::codec_class`: 0 raw), for statistics.
    pub codec: u8,
}

impl ContentEntry {
    /// The entry of block record `h` (content fingerprint `fp`) at `record`, `units` long, in
    /// namespace `ns`; no key refers to it yet.
    pub fn of_record(
        h: &kvhoard_format::record::RecordHeader,
        fp: ContentFp,
        record: Loc,
        units: u32,
        ns: u16,
    ) -> Self {
        ContentEntry {
            fp,
            record,
            units,
            raw_len: h.raw_len as u32,
            refs: 0,
            ns,
            codec: kvhoard_kernels::codec_class(&h.compression),
        }
    }

    /// Bytes its record occupies on the device.
    pub fn record_bytes(&self) -> u64 {
        u64::from(self.units) * kvhoard_format::UNIT_BYTES
    }
}

/// Counters of one namespace.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NsCounters {
    /// Keys.
    pub keys: u64,
    /// Sum of the raw sizes of the keys' blocks (what clients stored).
    pub logical_bytes: u64,
    /// Distinct stored blocks.
    pub blocks: u64,
    /// Raw bytes of the distinct blocks (what dedup left).
    pub unique_bytes: u64,
    /// Bytes their records occupy on disk.
    pub stored_bytes: u64,
}

/// What removing a segment's blocks dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped {
    /// The keys that no longer resolve.
    pub key_ids: Vec<KeyId>,
    /// Keys that no longer resolve.
    pub keys: u64,
    /// Blocks removed.
    pub blocks: u64,
    /// Their raw bytes.
    pub bytes: u64,
}

/// The index. See the module documentation.
#[derive(Debug, Default)]
pub struct Index {
    keys: HashTable<KeyEntry>,
    contents: Vec<ContentEntry>,
    /// Per content slot: reads since its record was last written (saturating), for placement
    /// (a cleaner keeps what was read). Counted under the read lock, hence atomics.
    heat: Vec<AtomicU8>,
    content_table: HashTable<u32>,
    free_slots: Vec<u32>,
    names: Vec<String>,
    ids: HashMap<String, u16>,
    counters: Vec<NsCounters>,
    /// While replaying (see [`Index::replaying`]): blocks no key names stay known.
    replaying: bool,
    /// Changes made so far (see [`Index::changes`]).
    changes: u64,
}

impl Index {
    /// How many changes were made to what a checkpoint holds of the index (keys, blocks,
    /// namespaces) since it was built: while the count stays the same, so does that. Lets a
    /// close that changed nothing skip writing a checkpoint identical to the one on disk.
    pub fn changes(&self) -> u64 {
        self.changes
    }

    /// The id of a namespace, if any record ever used it.
    pub fn ns_id(&self, name: &str) -> Option<u16> {
        self.ids.get(name).copied()
    }

    /// The id of a namespace, registering it if new; `None` when 65,536 namespaces exist.
    pub fn ns_id_or_insert(&mut self, name: &str) -> Option<u16> {
        if let Some(&id) = self.ids.get(name) {
            return Some(id);
        }
        let id = u16::try_from(self.names.len()).ok()?;
        self.changes += 1;
        self.names.push(name.to_string());
        self.ids.insert(name.to_string(), id);
        self.counters.push(NsCounters::default());
        Some(id)
    }

    /// Namespace names by id.
    pub fn namespaces(&self) -> &[String] {
        &self.names
    }

    /// Counters of namespace `id`.
    pub fn counters(&self, id: u16) -> NsCounters {
        self.counters.get(usize::from(id)).copied().unwrap_or_default()
    }

    /// The entry of a key.
    pub fn key(&self, fp: &KeyFp) -> Option<&KeyEntry> {
        self.keys.find(hash_of(fp), |k| k.fp == *fp)
    }

    /// The slot of a stored block.
    pub fn content_slot(&self, fp: &ContentFp) -> Option<u32> {
        let contents = &self.contents;
        self.content_table.find(hash_of(fp), |&s| contents.get(s as usize).is_some_and(|c| c.fp == *fp)).copied()
    }

    /// The slot of some block of a namespace whose content hash gives `prefix`
    /// ([`fingerprint::bytes_prefix`]), whatever its description and codec.
    pub fn content_slot_by_bytes(&self, prefix: &[u8; 8]) -> Option<u32> {
        let contents = &self.contents;
        let mut whole = [0u8; 16];
        whole.split_at_mut(8).0.copy_from_slice(prefix);
        self.content_table
            .find(hash_of(&whole), |&s| contents.get(s as usize).is_some_and(|c| c.fp.split_at(8).0 == prefix))
            .copied()
    }

    /// Per codec class: blocks, raw bytes and stored bytes (what their records occupy).
    pub fn codec_totals(&self) -> std::collections::BTreeMap<u8, (u64, u64, u64)> {
        let mut totals = std::collections::BTreeMap::new();
        for c in self.contents.iter().filter(|c| c.refs > 0) {
            let t: &mut (u64, u64, u64) = totals.entry(c.codec).or_default();
            t.0 += 1;
            t.1 += u64::from(c.raw_len);
            t.2 += c.record_bytes();
        }
        totals
    }

    /// The entry in a slot.
    pub fn content(&self, slot: u32) -> Option<&ContentEntry> {
        self.contents.get(slot as usize).filter(|c| c.refs > 0)
    }

    /// Number of keys.
    pub fn key_count(&self) -> u64 {
        self.keys.len() as u64
    }

    /// Number of stored blocks.
    pub fn block_count(&self) -> u64 {
        self.content_table.len() as u64
    }

    /// Bytes of memory the tables hold (capacity, not just what is used).
    pub fn memory_bytes(&self) -> u64 {
        let key_bytes = self.keys.capacity() * (std::mem::size_of::<KeyEntry>() + 1);
        let table_bytes = self.content_table.capacity() * (std::mem::size_of::<u32>() + 1);
        let slab_bytes = self.contents.capacity() * (std::mem::size_of::<ContentEntry>() + 1);
        (key_bytes + table_bytes + slab_bytes + self.free_slots.capacity() * 4) as u64
    }

    /// Applies a block record: `block` (its `refs` ignored) is stored at `block.record`, and
    /// `key` now names it. If the same bytes were already stored, the newer record becomes their
    /// location.
    pub fn apply_block(&mut self, key: KeyFp, block: ContentEntry, expires_unix_s: u32) {
        let slot = match self.content_slot(&block.fp) {
            Some(slot) => {
                if let Some(c) = self.contents.get_mut(slot as usize) {
                    // The new record may take other units (a longer key in its header).
                    if let Some(n) = self.counters.get_mut(usize::from(c.ns)) {
                        n.stored_bytes = n.stored_bytes.saturating_sub(c.record_bytes()) + block.record_bytes();
                    }
                    c.record = block.record;
                    c.units = block.units;
                }
                // Written again (relocated by the cleaner): its reads count from here.
                if let Some(h) = self.heat.get(slot as usize) {
                    h.store(0, Ordering::Relaxed);
                }
                slot
            }
            None => self.insert_content(block),
        };
        self.set_key(KeyEntry { fp: key, content: slot, record: block.record, expires_unix_s, ns: block.ns });
    }

    /// Applies a link record: `key` names bytes already stored. Returns false (and changes
    /// nothing) if those bytes are no longer stored.
    pub fn apply_link(&mut self, ns: u16, key: KeyFp, content: ContentFp, record: Loc, expires_unix_s: u32) -> bool {
        match self.content_slot(&content) {
            Some(slot) => {
                self.set_key(KeyEntry { fp: key, content: slot, record, expires_unix_s, ns });
                true
            }
            None => false,
        }
    }

    /// Applies a tombstone or an expiry: the key is gone.
    pub fn remove_key(&mut self, key: &KeyFp) -> bool {
        match self.keys.find_entry(hash_of(key), |k| k.fp == *key) {
            Ok(entry) => {
                let (old, _) = entry.remove();
                self.changes += 1;
                self.release(old);
                true
            }
            Err(_) => false,
        }
    }

    /// Removes every key `void` picks (recovery voiding keys a lost record may have replaced);
    /// returns how many.
    pub fn void_keys(&mut self, void: impl Fn(&KeyEntry) -> bool) -> u64 {
        let doomed: Vec<KeyFp> = self.keys.iter().filter(|k| void(k)).map(|k| k.fp).collect();
        doomed.iter().filter(|fp| self.remove_key(fp)).count() as u64
    }

    /// Removes every block stored in `segment` and every key whose record is there or whose
    /// block was there.
    pub fn drop_segment(&mut self, segment: u32) -> Dropped {
        let mut dropped = Dropped::default();
        let mut unused = Vec::new();
        let Index { keys, contents, counters, .. } = self;
        keys.retain(|k| {
            let content = contents.get_mut(k.content as usize);
            let gone = k.record.segment == segment || content.as_ref().is_none_or(|c| c.record.segment == segment);
            if gone {
                dropped.keys += 1;
                dropped.key_ids.push(KeyId(k.fp));
                if let Some(c) = content {
                    if let Some(n) = counters.get_mut(usize::from(k.ns)) {
                        n.keys -= 1;
                        n.logical_bytes -= u64::from(c.raw_len);
                    }
                    c.refs = c.refs.saturating_sub(1);
                    if c.refs == 0 && c.record.segment != segment {
                        unused.push(k.content);
                    }
                }
            }
            !gone
        });
        self.changes += dropped.keys;
        let contents = &self.contents;
        let in_segment: Vec<u32> = self
            .content_table
            .iter()
            .copied()
            .filter(|&s| contents.get(s as usize).is_some_and(|c| c.record.segment == segment))
            .collect();
        for &s in &in_segment {
            dropped.blocks += 1;
            dropped.bytes += self.contents.get(s as usize).map_or(0, |c| u64::from(c.raw_len));
        }
        for s in in_segment.into_iter().chain(unused) {
            self.free_content(s);
        }
        dropped
    }

    /// Removes keys that expired at or before `now_unix_s`; returns how many.
    pub fn purge_expired(&mut self, now_unix_s: u32) -> u64 {
        let expired: Vec<KeyFp> = self.keys.iter().filter(|k| is_expired(k, now_unix_s)).map(|k| k.fp).collect();
        expired.iter().for_each(|fp| {
            self.remove_key(fp);
        });
        expired.len() as u64
    }

    fn set_key(&mut self, entry: KeyEntry) {
        self.changes += 1;
        if let Some(c) = self.contents.get_mut(entry.content as usize) {
            c.refs += 1;
        }
        self.count_key(&entry, true);
        let hash = hash_of(&entry.fp);
        match self.keys.find_mut(hash, |k| k.fp == entry.fp) {
            Some(slot) => {
                let old = std::mem::replace(slot, entry);
                self.release(old);
            }
            None => {
                self.keys.insert_unique(hash, entry, |k| hash_of(&k.fp));
            }
        }
    }

    fn count_key(&mut self, k: &KeyEntry, add: bool) {
        let raw = self.contents.get(k.content as usize).map_or(0, |c| u64::from(c.raw_len));
        if let Some(n) = self.counters.get_mut(usize::from(k.ns)) {
            if add {
                n.keys += 1;
                n.logical_bytes += raw;
            } else {
                n.keys -= 1;
                n.logical_bytes -= raw;
            }
        }
    }

    /// A key stopped referring to its block.
    /// Starts or ends a replay of records. While replaying, a block no key names any more
    /// stays known until the replay ends: cleaning writes again a link it relocates after the
    /// records that kept its block named in the store's own order (another key's later write
    /// may move that key off the block before the link's new record), so at that point of the
    /// replay the block may be named by nobody though it is stored, and the link must still
    /// find it. Ending the replay forgets every block no key names.
    pub fn replaying(&mut self, on: bool) {
        self.replaying = on;
        if on {
            return;
        }
        let unused: Vec<u32> = self
            .content_table
            .iter()
            .copied()
            .filter(|&s| self.contents.get(s as usize).is_some_and(|c| c.refs == 0))
            .collect();
        unused.into_iter().for_each(|s| self.free_content(s));
    }

    fn release(&mut self, old: KeyEntry) {
        self.count_key(&old, false);
        let now_unused = match self.contents.get_mut(old.content as usize) {
            Some(c) => {
                c.refs = c.refs.saturating_sub(1);
                c.refs == 0
            }
            None => false,
        };
        if now_unused && !self.replaying {
            self.free_content(old.content);
        }
    }

    fn insert_content(&mut self, entry: ContentEntry) -> u32 {
        self.changes += 1;
        if let Some(n) = self.counters.get_mut(usize::from(entry.ns)) {
            n.blocks += 1;
            n.unique_bytes += u64::from(entry.raw_len);
            n.stored_bytes += entry.record_bytes();
        }
        // A new block has no references yet; mark the slot used so content() finds it once a
        // key refers to it.
        let entry = ContentEntry { refs: 0, ..entry };
        let slot = match self.free_slots.pop() {
            Some(s) => {
                if let Some(c) = self.contents.get_mut(s as usize) {
                    *c = entry;
                }
                if let Some(h) = self.heat.get(s as usize) {
                    h.store(0, Ordering::Relaxed);
                }
                s
            }
            None => {
                self.contents.push(entry);
                self.heat.push(AtomicU8::new(0));
                (self.contents.len() - 1) as u32
            }
        };
        let contents = &self.contents;
        self.content_table
            .insert_unique(hash_of(&entry.fp), slot, |&s| contents.get(s as usize).map_or(0, |c| hash_of(&c.fp)));
        slot
    }

    fn free_content(&mut self, slot: u32) {
        let Some(entry) = self.contents.get(slot as usize).copied() else { return };
        self.changes += 1;
        if let Ok(e) = self.content_table.find_entry(hash_of(&entry.fp), |&s| s == slot) {
            e.remove();
        }
        if let Some(n) = self.counters.get_mut(usize::from(entry.ns)) {
            n.blocks -= 1;
            n.unique_bytes -= u64::from(entry.raw_len);
            n.stored_bytes -= entry.record_bytes();
        }
        if let Some(c) = self.contents.get_mut(slot as usize) {
            c.refs = 0;
            c.fp = [0; 16];
        }
        self.free_slots.push(slot);
    }

    /// Counts a read of the block in `slot` (under the read lock).
    pub fn touch(&self, slot: u32) {
        if let Some(h) = self.heat.get(slot as usize) {
            let _ = h.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1));
        }
    }

    /// Reads of the block in `slot` since its record was last written (saturating at 255).
    pub fn heat(&self, slot: u32) -> u8 {
        self.heat.get(slot as usize).map_or(0, |h| h.load(Ordering::Relaxed))
    }

    /// Units of live records per segment (`segments` entries): each stored block's record, and
    /// each key's own record when it is a link elsewhere.
    pub fn live_units(&self, segments: usize) -> Vec<u64> {
        let mut live = vec![0u64; segments];
        for c in self.contents.iter().filter(|c| c.refs > 0) {
            if let Some(l) = live.get_mut(c.record.segment as usize) {
                *l += u64::from(c.units);
            }
        }
        for k in self.keys.iter() {
            let own_block = self.contents.get(k.content as usize).is_some_and(|c| c.record == k.record);
            if !own_block {
                if let Some(l) = live.get_mut(k.record.segment as usize) {
                    *l += 1;
                }
            }
        }
        live
    }

    /// The content slot of a stored block's entry (by its fingerprint).
    pub fn slot_of(&self, fp: &ContentFp) -> Option<u32> {
        self.content_slot(fp)
    }

    /// Stored blocks, for a scan that needs them all (inspect).
    pub fn blocks(&self) -> impl Iterator<Item = &ContentEntry> {
        self.content_table.iter().filter_map(|&s| self.contents.get(s as usize))
    }

    /// Keys, for a scan that needs them all (checkpoint, fsck).
    pub fn keys(&self) -> impl Iterator<Item = &KeyEntry> {
        self.keys.iter()
    }

    /// The keys that name one of the blocks in content slots `slots`, in one pass over all keys
    /// (cleaning, for the keys it links again). Slots are looked up in a bitmap the size of the
    /// slab: at 10^6 keys the pass took 8 ms against 13 ms with a hash set (release build, this
    /// project's 2-core VM), and cleaning makes it under the index's read lock.
    pub fn keys_naming(&self, slots: impl IntoIterator<Item = u32>) -> impl Iterator<Item = &KeyEntry> {
        let mut wanted = vec![false; self.contents.len()];
        for s in slots {
            if let Some(w) = wanted.get_mut(s as usize) {
                *w = true;
            }
        }
        self.keys.iter().filter(move |k| wanted.get(k.content as usize).copied().unwrap_or(false))
    }

    /// Rebuilds the index from a checkpoint, keeping only entries whose segments `keep` accepts
    /// (segments reused or freed since the checkpoint are left out). Keys whose block is left out
    /// are left out too. The index is left replaying ([`Index::replaying`]): the caller replays
    /// the records after the checkpoint, then ends the replay.
    pub fn from_checkpoint(cp: &ckpt::Checkpoint, keep: impl Fn(u32) -> bool) -> Index {
        let mut ix = Index::default();
        // Sized once: grown entry by entry, the tables rehashed about twenty times on the way
        // to 10^6 keys.
        ix.keys.reserve(cp.keys.len(), |k| hash_of(&k.fp));
        ix.contents.reserve(cp.contents.len());
        ix.heat.reserve(cp.contents.len());
        let contents = &ix.contents;
        ix.content_table.reserve(cp.contents.len(), |&s| contents.get(s as usize).map_or(0, |c| hash_of(&c.fp)));
        for name in &cp.namespaces {
            ix.ns_id_or_insert(name);
        }
        let slots: Vec<Option<u32>> = cp
            .contents
            .iter()
            .map(|c| {
                keep(c.segment).then(|| {
                    let record = Loc { segment: c.segment, unit: c.unit };
                    ix.insert_content(ContentEntry {
                        fp: c.fp,
                        record,
                        units: c.units,
                        raw_len: c.raw_len,
                        refs: 0,
                        ns: c.ns,
                        codec: c.codec,
                    })
                })
            })
            .collect();
        for k in &cp.keys {
            let Some(&Some(slot)) = slots.get(k.content as usize) else { continue };
            if keep(k.segment) {
                let record = Loc { segment: k.segment, unit: k.unit };
                ix.set_key(KeyEntry { fp: k.fp, content: slot, record, expires_unix_s: k.expires_unix_s, ns: k.ns });
            }
        }
        // Blocks whose keys were left out stay known until the replay that follows ends
        // (`replaying`): a link after the checkpoint may name one.
        ix.replaying = true;
        ix
    }

    /// The index as checkpoint entries (contents renumbered densely).
    pub fn to_checkpoint(&self) -> (Vec<ckpt::ContentEntry>, Vec<ckpt::KeyEntry>) {
        let (mut contents, mut keys) = (Vec::new(), Vec::new());
        self.to_checkpoint_into(&mut contents, &mut keys);
        (contents, keys)
    }

    /// [`Index::to_checkpoint`] into `contents` and `keys`, cleared first: vectors kept from an
    /// earlier checkpoint are filled without the page faults of fresh memory, which took three
    /// quarters of the time at 10^6 keys (80 against 20 ms, release build, this project's
    /// 2-core VM), time a snapshot holds every put waiting ([`crate::checkpoint`]).
    pub fn to_checkpoint_into(&self, contents: &mut Vec<ckpt::ContentEntry>, keys: &mut Vec<ckpt::KeyEntry>) {
        contents.clear();
        keys.clear();
        // Exact: grown by doubling, kept vectors would hold up to twice the index for good.
        contents.reserve_exact(self.content_table.len());
        keys.reserve_exact(self.keys.len());
        let mut dense = vec![u32::MAX; self.contents.len()];
        for (slot, c) in self.contents.iter().enumerate() {
            if c.refs > 0 {
                if let Some(d) = dense.get_mut(slot) {
                    *d = contents.len() as u32;
                }
                contents.push(ckpt::ContentEntry {
                    fp: c.fp,
                    segment: c.record.segment,
                    unit: c.record.unit,
                    units: c.units,
                    raw_len: c.raw_len,
                    ns: c.ns,
                    codec: c.codec,
                });
            }
        }
        keys.extend(self.keys.iter().map(|k| ckpt::KeyEntry {
            fp: k.fp,
            content: dense.get(k.content as usize).copied().unwrap_or(u32::MAX),
            segment: k.record.segment,
            unit: k.record.unit,
            expires_unix_s: k.expires_unix_s,
            ns: k.ns,
        }));
    }
}

/// The TTL a record written at `now_ms` must carry to keep the expiry of one created at
/// `created_ms` with `ttl_secs`: 0 (none) for none; never 0 otherwise (expiring within the second
/// still leaves it a second). Reckoned in whole seconds of the creation time, as
/// `recovery::expiry` reckons an expiry, so that a record written again, however often, expires
/// in the same second as the one it replaces.
pub fn remaining_ttl(created_ms: u64, ttl_secs: u32, now_ms: u64) -> u32 {
    match ttl_secs {
        0 => 0,
        ttl => {
            let expires_s = created_ms / 1000 + u64::from(ttl);
            u32::try_from(expires_s.saturating_sub(now_ms / 1000).max(1)).unwrap_or(u32::MAX)
        }
    }
}

/// Whether a key has expired at `now_unix_s`.
pub fn is_expired(k: &KeyEntry, now_unix_s: u32) -> bool {
    k.expires_unix_s != 0 && k.expires_unix_s <= now_unix_s
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;
    use kvhoard_format::{BlockDesc, CompressionMeta};

    fn opaque() -> BlockDesc {
        BlockDesc::opaque()
    }

    fn loc(segment: u32, unit: u32) -> Loc {
        Loc { segment, unit }
    }

    fn block(ns: u16, fp: ContentFp, record: Loc, units: u32, raw_len: u32) -> ContentEntry {
        ContentEntry { fp, record, units, raw_len, refs: 0, ns, codec: 0 }
    }

    #[test]
    fn dedup_shares_one_block_and_refcounts_it() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let c = content_fp("default", &[9; 32], &opaque(), &CompressionMeta::none());
        ix.apply_block(key_fp("default", "a"), block(ns, c, loc(0, 1), 3, 8000), 0);
        assert!(ix.apply_link(ns, key_fp("default", "b"), c, loc(0, 4), 0));
        assert_eq!(ix.block_count(), 1);
        assert_eq!(ix.key_count(), 2);
        let n = ix.counters(ns);
        assert_eq!((n.logical_bytes, n.unique_bytes), (16000, 8000));
        ix.remove_key(&key_fp("default", "a"));
        assert_eq!(ix.block_count(), 1);
        ix.remove_key(&key_fp("default", "b"));
        assert_eq!(ix.block_count(), 0);
        assert_eq!(ix.counters(ns), NsCounters::default());
    }

    #[test]
    fn checkpoint_entries_filled_into_used_vectors_are_the_index_alone() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let mut used = (Vec::new(), Vec::new());
        for i in 0..3u8 {
            let c = content_fp("default", &[i; 32], &opaque(), &CompressionMeta::none());
            ix.apply_block(key_fp("default", &format!("k{i}")), block(ns, c, loc(0, 1 + u32::from(i)), 1, 10), 0);
        }
        ix.to_checkpoint_into(&mut used.0, &mut used.1);
        assert_eq!((used.0.len(), used.1.len()), (3, 3));
        assert!(ix.remove_key(&key_fp("default", "k0")));
        assert!(ix.remove_key(&key_fp("default", "k2")));
        ix.to_checkpoint_into(&mut used.0, &mut used.1);
        assert_eq!(used, ix.to_checkpoint(), "nothing of the vectors' earlier entries is left");
        assert_eq!((used.0.len(), used.1.len()), (1, 1));
    }

    #[test]
    fn keys_naming_finds_exactly_the_keys_of_the_slots_asked() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let c1 = content_fp("default", &[1; 32], &opaque(), &CompressionMeta::none());
        let c2 = content_fp("default", &[2; 32], &opaque(), &CompressionMeta::none());
        ix.apply_block(key_fp("default", "a"), block(ns, c1, loc(0, 1), 3, 8000), 0);
        assert!(ix.apply_link(ns, key_fp("default", "b"), c1, loc(0, 4), 0));
        ix.apply_block(key_fp("default", "c"), block(ns, c2, loc(0, 5), 3, 8000), 0);
        let s1 = ix.content_slot(&c1).unwrap();
        let mut named: Vec<KeyFp> = ix.keys_naming([s1, 9_999]).map(|k| k.fp).collect();
        named.sort();
        let mut expected = vec![key_fp("default", "a"), key_fp("default", "b")];
        expected.sort();
        assert_eq!(named, expected, "a slot past the slab names nothing");
        assert_eq!(ix.keys_naming([]).count(), 0);
    }

    #[test]
    fn a_replay_keeps_blocks_no_key_names_until_it_ends() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let c = content_fp("default", &[9; 32], &opaque(), &CompressionMeta::none());
        ix.replaying(true);
        ix.apply_block(key_fp("default", "a"), block(ns, c, loc(0, 1), 3, 8000), 0);
        // "a" moves on; a link written later (a relocated one) still finds the bytes.
        ix.remove_key(&key_fp("default", "a"));
        assert_eq!(ix.block_count(), 1);
        assert!(ix.apply_link(ns, key_fp("default", "b"), c, loc(1, 4), 0));
        ix.remove_key(&key_fp("default", "b"));
        // Written again with a longer header (more units): the counters follow the record.
        ix.apply_block(key_fp("default", "c"), block(ns, c, loc(2, 1), 4, 8000), 0);
        assert_eq!(ix.counters(ns).stored_bytes, 4 * kvhoard_format::UNIT_BYTES);
        ix.remove_key(&key_fp("default", "c"));
        ix.replaying(false);
        assert_eq!(ix.block_count(), 0);
        assert_eq!(ix.counters(ns), NsCounters::default());
        // Out of a replay, a block no key names is forgotten at once.
        ix.apply_block(key_fp("default", "a"), block(ns, c, loc(0, 1), 3, 8000), 0);
        ix.remove_key(&key_fp("default", "a"));
        assert!(!ix.apply_link(ns, key_fp("default", "b"), c, loc(1, 4), 0));
    }

    #[test]
    fn namespaces_never_share_blocks() {
        assert_ne!(
            content_fp("a", &[1; 32], &opaque(), &CompressionMeta::none()),
            content_fp("b", &[1; 32], &opaque(), &CompressionMeta::none())
        );
        assert_ne!(key_fp("a", "k"), key_fp("b", "k"));
    }

    #[test]
    fn dropping_a_segment_drops_its_blocks_and_the_keys_that_reach_them() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let c1 = content_fp("default", &[1; 32], &opaque(), &CompressionMeta::none());
        let c2 = content_fp("default", &[2; 32], &opaque(), &CompressionMeta::none());
        ix.apply_block(key_fp("default", "a"), block(ns, c1, loc(0, 1), 2, 10), 0);
        ix.apply_block(key_fp("default", "b"), block(ns, c2, loc(1, 1), 2, 10), 0);
        assert!(ix.apply_link(ns, key_fp("default", "c"), c1, loc(1, 3), 0));
        assert!(ix.apply_link(ns, key_fp("default", "d"), c2, loc(0, 3), 0));
        let mut d = ix.drop_segment(0);
        d.key_ids.sort();
        let mut gone: Vec<KeyId> = ["a", "c", "d"].iter().map(|k| KeyId::new("default", k)).collect();
        gone.sort();
        assert_eq!(d, Dropped { key_ids: gone, keys: 3, blocks: 1, bytes: 10 });
        assert!(ix.key(&key_fp("default", "b")).is_some());
        assert_eq!(ix.block_count(), 1);
        assert_eq!(ix.counters(ns).keys, 1);
        assert!(!ix.apply_link(ns, key_fp("default", "e"), c1, loc(1, 5), 0));
    }

    #[test]
    fn overwrite_releases_the_old_block() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        let k = key_fp("default", "a");
        ix.apply_block(
            k,
            block(ns, content_fp("default", &[1; 32], &opaque(), &CompressionMeta::none()), loc(0, 1), 2, 10),
            0,
        );
        ix.apply_block(
            k,
            block(ns, content_fp("default", &[2; 32], &opaque(), &CompressionMeta::none()), loc(0, 3), 2, 20),
            0,
        );
        assert_eq!(ix.block_count(), 1);
        assert_eq!(ix.counters(ns).logical_bytes, 20);
        let (contents, keys) = ix.to_checkpoint();
        assert_eq!((contents.len(), keys.len()), (1, 1));
        assert_eq!(keys[0].content, 0);
    }

    #[test]
    fn expired_keys_are_purged() {
        let mut ix = Index::default();
        let ns = ix.ns_id_or_insert("default").unwrap();
        ix.apply_block(
            key_fp("default", "a"),
            block(ns, content_fp("default", &[1; 32], &opaque(), &CompressionMeta::none()), loc(0, 1), 2, 10),
            100,
        );
        ix.apply_block(
            key_fp("default", "b"),
            block(ns, content_fp("default", &[2; 32], &opaque(), &CompressionMeta::none()), loc(0, 3), 2, 10),
            0,
        );
        assert_eq!(ix.purge_expired(99), 0);
        assert_eq!(ix.purge_expired(100), 1);
        assert_eq!(ix.key_count(), 1);
    }
}
