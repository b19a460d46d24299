//! Replaying records into an index in log order, as the store applied them when it wrote them:
//! what opening a volume and fsck both do after the newest checkpoint.

use std::collections::HashMap;

use kvhoard_format::record::RecordKind;
use kvhoard_format::summary::SummaryEntry;
use kvhoard_format::UNIT_BYTES;

use super::expiry;
use crate::index::{header_fp, key_fp, ContentEntry, ContentFp, Index, KeyFp};
use crate::log::{Loc, Pos};

/// An index being rebuilt from records, in log order.
///
/// A link names bytes by their hash; at a link, replay may not have met those bytes, or may
/// have lost them with their segment:
/// - cleaning writes a block it relocates after the links to it, and once the segment it left
///   is freed, the block's only record lies past the links;
/// - when the segment holding the bytes was reclaimed, the key went with them.
///
/// Either way the link is the key's newest record so far, so whatever the key named before it
/// is gone (left in place, a crash would bring back the key's older version). The link waits
/// for a block of its bytes later in the log, and names it then, unless a later record of its
/// key came first; if none comes, the key is a miss.
#[derive(Debug)]
pub(crate) struct Replay {
    index: Index,
    /// Links whose bytes replay has not met since, by the bytes they name.
    waiting: HashMap<ContentFp, Vec<WaitingLink>>,
    /// The bytes each waiting link names, by its key.
    waiting_keys: HashMap<KeyFp, ContentFp>,
}

/// A link record whose bytes were not stored when replay met it.
#[derive(Debug, Clone, Copy)]
struct WaitingLink {
    key: KeyFp,
    ns: u16,
    record: Loc,
    expires_unix_s: u32,
}

impl Replay {
    /// Replays onto `index` (the newest checkpoint's, or an empty one).
    pub(crate) fn new(index: Index) -> Replay {
        Replay { index, waiting: HashMap::new(), waiting_keys: HashMap::new() }
    }

    /// The index rebuilt; links still waiting name nothing.
    pub(crate) fn finish(self) -> Index {
        if !self.waiting_keys.is_empty() {
            tracing::debug!(keys = self.waiting_keys.len(), "links to bytes no longer stored: their keys are gone");
        }
        self.index
    }

    /// Applies the record `e` of `segment`. `seq_of` gives the seq of each segment's current
    /// use (a `Lost` entry voids keys by log position).
    pub(crate) fn apply(&mut self, segment: u32, e: &SummaryEntry, seq_of: &dyn Fn(u32) -> u64) {
        let h = &e.header;
        if h.kind == RecordKind::Lost {
            let at = Pos { seq: h.segment_seq, unit: e.unit };
            let voided = self.index.void_keys(|k| Pos { seq: seq_of(k.record.segment), unit: k.record.unit } < at);
            // Every waiting link was met before this entry: the lost record may be newer.
            self.waiting.clear();
            self.waiting_keys.clear();
            tracing::warn!(segment, unit = e.unit, voided, "a lost record voids every key written before it");
            return;
        }
        let Some(ns) = self.index.ns_id_or_insert(&h.namespace) else {
            tracing::error!(namespace = %h.namespace, "more than 65536 namespaces; record skipped");
            return;
        };
        let key = key_fp(&h.namespace, &h.key);
        let record = Loc { segment, unit: e.unit };
        let expires_unix_s = expiry(h.created_unix_ms, h.ttl_secs);
        self.stop_waiting(&key);
        match h.kind {
            RecordKind::Block => {
                let content = header_fp(h);
                let block = ContentEntry {
                    fp: content,
                    record,
                    units: (h.record_bytes() / UNIT_BYTES) as u32,
                    raw_len: h.raw_len as u32,
                    refs: 0,
                    ns,
                    codec: kvhoard_kernels::codec_class(&h.compression),
                };
                self.index.apply_block(key, block, expires_unix_s);
                for w in self.waiting.remove(&content).unwrap_or_default() {
                    self.waiting_keys.remove(&w.key);
                    self.index.apply_link(w.ns, w.key, content, w.record, w.expires_unix_s);
                }
            }
            RecordKind::Link => {
                let content = header_fp(h);
                if !self.index.apply_link(ns, key, content, record, expires_unix_s) {
                    self.index.remove_key(&key);
                    self.waiting.entry(content).or_default().push(WaitingLink { key, ns, record, expires_unix_s });
                    self.waiting_keys.insert(key, content);
                }
            }
            RecordKind::Tombstone => {
                self.index.remove_key(&key);
            }
            RecordKind::Lost => {}
        }
    }

    /// A newer record of `key` replaces a link of it still waiting for its bytes.
    fn stop_waiting(&mut self, key: &KeyFp) {
        let Some(content) = self.waiting_keys.remove(key) else { return };
        if let Some(links) = self.waiting.get_mut(&content) {
            links.retain(|w| w.key != *key);
            if links.is_empty() {
                self.waiting.remove(&content);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]

    use kvhoard_format::record::RecordHeader;

    use super::super::settle::lost;
    use super::*;

    /// A record of `kind` naming `key` and bytes hashed `content`, at unit `unit` of segment use
    /// `seq` (segment `seq` holds use `seq` here).
    fn entry(kind: RecordKind, key: &str, content: u8, seq: u64, unit: u32) -> (u32, SummaryEntry) {
        let header = RecordHeader {
            kind,
            namespace: "default".into(),
            key: key.into(),
            content_hash: [content; 32],
            raw_len: 100,
            stored_len: if kind == RecordKind::Block { 100 } else { 0 },
            recovered: false,
            ..lost(seq)
        };
        (seq as u32, SummaryEntry { unit, header })
    }

    fn replay(records: &[(u32, SummaryEntry)]) -> Index {
        let mut replay = Replay::new(Index::default());
        for (segment, e) in records {
            replay.apply(*segment, e, &|s| u64::from(s));
        }
        replay.finish()
    }

    /// The content the index gives `key`: `n` for the bytes whose hash is `[n; 32]`.
    fn names(index: &Index, key: &str) -> Option<u8> {
        let k = index.key(&key_fp("default", key))?;
        let fp = index.content(k.content)?.fp;
        (0..=u8::MAX).find(|&n| header_fp(&entry(Block, key, n, 1, 1).1.header) == fp)
    }

    use RecordKind::{Block, Link, Tombstone};

    #[test]
    fn a_link_to_bytes_not_stored_leaves_its_key_a_miss_not_its_older_version() {
        let index = replay(&[entry(Block, "k", 1, 1, 1), entry(Link, "k", 2, 2, 1)]);
        assert_eq!(names(&index, "k"), None);
    }

    #[test]
    fn a_link_names_its_bytes_when_a_later_record_stores_them() {
        // Cleaning relocated the bytes after the link to them, and freed the segment they left.
        let index = replay(&[entry(Block, "k", 1, 1, 1), entry(Link, "k", 2, 2, 1), entry(Block, "x", 2, 3, 1)]);
        assert_eq!(names(&index, "k"), Some(2));
        assert_eq!(index.key(&key_fp("default", "k")).unwrap().record, Loc { segment: 2, unit: 1 });
        assert_eq!(names(&index, "x"), Some(2));
    }

    #[test]
    fn a_later_record_of_the_key_replaces_a_waiting_link() {
        let put_again = replay(&[entry(Link, "k", 2, 1, 1), entry(Block, "k", 3, 1, 5), entry(Block, "x", 2, 2, 1)]);
        assert_eq!(names(&put_again, "k"), Some(3));
        let deleted = replay(&[entry(Link, "k", 2, 1, 1), entry(Tombstone, "k", 0, 1, 5), entry(Block, "x", 2, 2, 1)]);
        assert_eq!(names(&deleted, "k"), None);
        let linked = replay(&[entry(Link, "k", 2, 1, 1), entry(Block, "y", 4, 1, 3), entry(Link, "k", 4, 1, 5)]);
        assert_eq!(names(&linked, "k"), Some(4));
        let relinked = replay(&[entry(Link, "k", 2, 1, 1), entry(Link, "k", 5, 1, 3), entry(Block, "x", 2, 2, 1)]);
        assert_eq!(names(&relinked, "k"), None, "the link to 2 was replaced by one to 5, never stored");
    }

    #[test]
    fn a_lost_record_voids_waiting_links() {
        let mut records = vec![entry(Link, "k", 2, 1, 1)];
        records.push((2, SummaryEntry { unit: 1, header: lost(2) }));
        records.push(entry(Block, "x", 2, 3, 1));
        assert_eq!(names(&replay(&records), "k"), None);
    }
}
