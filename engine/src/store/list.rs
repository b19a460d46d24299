//! Listing the live keys of a namespace, oldest record first, from segment summaries (and the
//! open segment's summary in memory), never from payloads.

use kvhoard_format::record::{validate_namespace, RecordKind};
use kvhoard_format::summary::{self, SummaryEntry};

use super::Store;
use crate::error::{Result, StoreError};
use crate::index::{is_expired, key_fp};
use crate::log::scan::read_segment;
use crate::log::{Loc, Pos, SegState};
use crate::parts::Parts;

/// Where a listing continues: after this log position.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Default)]
pub struct ListCursor(Pos);

impl ListCursor {
    /// The cursor as one number (for a directory offset): segment use in the high 40 bits,
    /// unit in the low 24. `None` if it does not fit (not before 2^40 segment uses).
    pub fn to_u64(self) -> Option<u64> {
        (self.0.seq < 1 << 40 && self.0.unit < 1 << 24).then_some(self.0.seq << 24 | u64::from(self.0.unit))
    }

    /// The cursor [`ListCursor::to_u64`] made this number from.
    pub fn from_u64(v: u64) -> ListCursor {
        ListCursor(Pos { seq: v >> 24, unit: (v & 0xFF_FFFF) as u32 })
    }
}

impl std::fmt::Display for ListCursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}", self.0.seq, self.0.unit)
    }
}

impl std::str::FromStr for ListCursor {
    type Err = StoreError;
    fn from_str(s: &str) -> Result<Self> {
        let shown = kvhoard_format::quoted_short(s);
        let bad =
            || StoreError::invalid("cursor", format!("{shown}: expected SEQ.UNIT as printed by a previous listing"));
        let (seq, unit) = s.split_once('.').ok_or_else(bad)?;
        Ok(ListCursor(Pos { seq: seq.parse().map_err(|_| bad())?, unit: unit.parse().map_err(|_| bad())? }))
    }
}

/// One live key in a listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListEntry {
    /// The key.
    pub key: String,
    /// Its block's content hash.
    pub content_hash: [u8; 32],
    /// Raw length of its block.
    pub raw_len: u64,
    /// When the key was written.
    pub created_unix_ms: u64,
    /// Its TTL in seconds (0 = none).
    pub ttl_secs: u32,
    /// Whether the key shares stored bytes with an earlier key (a link record).
    pub deduplicated: bool,
    /// The kind of codec its block is stored with (raw, lossless, quant, drop...).
    pub codec: &'static str,
    /// Where this entry is: a listing from here continues after it.
    pub cursor: ListCursor,
}

/// A page of a listing.
#[derive(Debug, Clone, Default)]
pub struct ListPage {
    /// Keys, oldest first.
    pub entries: Vec<ListEntry>,
    /// Where the next page starts, or `None` at the end.
    pub next: Option<ListCursor>,
}

impl Store {
    /// One page of the live keys of `namespace`, oldest record first, starting after `cursor`.
    /// Reads segment summaries, not payloads; holds no lock while it reads.
    pub fn list(&self, namespace: &str, cursor: Option<ListCursor>, limit: usize) -> Result<ListPage> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        let parts = &self.parts;
        let after = cursor.map(|c| c.0);
        let (mut segments, open) = {
            let state = parts.log.lock();
            let segments: Vec<(u64, u32, bool)> = state
                .segments
                .iter()
                .enumerate()
                .filter(|(_, s)| s.state != SegState::Free && after.is_none_or(|a| s.seq >= a.seq))
                .map(|(i, s)| (s.seq, i as u32, matches!(s.state, SegState::Open)))
                .collect();
            let open = state.open.as_ref().map(|o| (o.seq, o.summary.clone(), o.records));
            (segments, open)
        };
        segments.sort_unstable();
        let mut page = ListPage::default();
        for (seq, index, is_open) in segments {
            let entries = match (&open, is_open) {
                (Some((open_seq, bytes, count)), true) if *open_seq == seq => {
                    summary::decode(bytes, *count, crc32c::crc32c(bytes)).unwrap_or_default()
                }
                _ => read_segment(parts.log.dev.as_ref(), &parts.log.sb, index, seq, 1)?,
            };
            for e in entries {
                let pos = Pos { seq, unit: e.unit };
                if after.is_some_and(|a| pos <= a) || e.header.namespace != namespace {
                    continue;
                }
                if let Some(entry) = parts.live_entry(index, &e, ListCursor(pos)) {
                    page.entries.push(entry);
                    if page.entries.len() >= limit.max(1) {
                        page.next = Some(ListCursor(pos));
                        return Ok(page);
                    }
                }
            }
        }
        Ok(page)
    }
}

impl Parts {
    /// The listing entry of a record if it is its key's current record.
    fn live_entry(&self, segment: u32, e: &SummaryEntry, cursor: ListCursor) -> Option<ListEntry> {
        let h = &e.header;
        if !matches!(h.kind, RecordKind::Block | RecordKind::Link) {
            return None;
        }
        let index = self.index_read();
        let k = index.key(&key_fp(&h.namespace, &h.key))?;
        if k.record != (Loc { segment, unit: e.unit }) || is_expired(k, self.clock.now_unix_s()) {
            return None;
        }
        Some(ListEntry {
            key: h.key.clone(),
            content_hash: h.content_hash,
            raw_len: h.raw_len,
            created_unix_ms: h.created_unix_ms,
            ttl_secs: h.ttl_secs,
            codec: kvhoard_kernels::class_name(kvhoard_kernels::codec_class(&h.compression)),
            deduplicated: h.kind == RecordKind::Link,
            cursor,
        })
    }
}
