//! What a volume holds, read without opening it as a store: `kvhoard inspect`.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::UNIT_BYTES;

use super::scan::{HeaderState, SummaryState, VolumeScan};
use super::{replay, scan_volume, ScanOptions};
use crate::buffer::AlignedBuf;
use crate::checkpoint::CheckpointStore;
use crate::device::{BlockDevice, FileDevice};
use crate::error::{Result, StoreError};
use crate::index::{bytes_prefix, is_expired, key_fp, Index};
use crate::log::Loc;
use crate::volume::VolumePaths;

/// A volume as read from disk: its records and the index a store would open with.
pub struct VolumeView {
    dev: FileDevice,
    /// Every structure found.
    pub scan: VolumeScan,
    /// The index (checkpoint plus the log after it, or the log alone).
    index: Index,
    /// The checkpoint used.
    pub checkpoint_seq: Option<u64>,
    /// Record location → (position of its segment in the scan, position of the record in it).
    headers: HashMap<Loc, (usize, usize)>,
}

impl VolumeView {
    /// Reads the volume at `path`. Takes no lock: a volume in use may change underneath.
    pub fn open(path: &Path) -> Result<VolumeView> {
        let paths = VolumePaths::resolve(path);
        let dev = FileDevice::open(&paths.data, false).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => StoreError::NotAVolume {
                path: path.to_path_buf(),
                reason: format!("{} does not exist", paths.data.display()),
            },
            _ => StoreError::File { action: "cannot open", path: paths.data.clone(), source: e },
        })?;
        let scan =
            scan_volume(&dev, ScanOptions { deep: false, summaries_only: true }, &|_, _| {}).map_err(|e| match e {
                super::ScanError::Device(d) => StoreError::Device(d),
                e => StoreError::NotAVolume { path: path.to_path_buf(), reason: e.to_string() },
            })?;
        let checkpoints = CheckpointStore::for_volume(&scan.sb, paths.meta_dir);
        let cp = checkpoints.load(&dev, scan.sb.volume_id).filter(|c| c.segments.len() == scan.segments.len());
        let (index, _) = replay(&scan, cp.as_ref());
        let mut headers = HashMap::new();
        for (s, seg) in scan.segments.iter().enumerate() {
            for (r, rec) in seg.records.iter().enumerate() {
                headers.insert(Loc { segment: seg.index, unit: rec.unit }, (s, r));
            }
        }
        Ok(VolumeView { dev, checkpoint_seq: cp.map(|c| c.checkpoint_seq), scan, index, headers })
    }

    /// The bytes the volume file holds when it is shorter than its superblock says (cut short:
    /// the segments past its end are missing from this view); `None` when it is whole.
    pub fn cut_short(&self) -> Option<u64> {
        let have = self.dev.capacity_bytes();
        (have < self.scan.sb.capacity_bytes).then_some(have)
    }

    /// Whether the record at `loc` is its key's current record (the one a read of the key uses).
    pub fn is_current(&self, loc: Loc) -> bool {
        let Some(h) = self.header(loc) else { return false };
        self.index.key(&key_fp(&h.namespace, &h.key)).is_some_and(|k| k.record == loc)
    }

    /// How many keys name the block whose record is at `loc`.
    pub fn references(&self, loc: Loc) -> usize {
        self.index.keys().filter(|k| self.index.content(k.content).is_some_and(|c| c.record == loc)).count()
    }

    /// The header of the record at `loc`.
    pub fn header(&self, loc: Loc) -> Option<&RecordHeader> {
        let (s, r) = *self.headers.get(&loc)?;
        self.scan.segments.get(s)?.records.get(r).map(|rec| &rec.header)
    }

    /// Byte offset of a record on the volume.
    pub fn offset(&self, loc: Loc) -> u64 {
        self.scan.sb.unit_offset(loc.segment, loc.unit)
    }

    /// Live bytes (records that a key reaches) per segment.
    pub fn live_units(&self) -> HashMap<u32, u64> {
        let mut live: HashMap<u32, u64> = HashMap::new();
        for c in self.index.blocks() {
            *live.entry(c.record.segment).or_default() += u64::from(c.units);
        }
        for k in self.index.keys() {
            if self.index.content(k.content).is_some_and(|c| c.record != k.record) {
                *live.entry(k.record.segment).or_default() += 1;
            }
        }
        live
    }

    /// The block a key names, or the block with a content hash (64 hex digits), in `namespace`.
    pub fn find(&self, namespace: &str, key_or_hash: &str) -> Option<Found> {
        if let Some(k) = self.index.key(&key_fp(namespace, key_or_hash)) {
            let c = self.index.content(k.content)?;
            return Some(Found {
                block: c.record,
                key_record: Some(k.record),
                key: Some(key_or_hash.to_string()),
                expires_unix_s: k.expires_unix_s,
            });
        }
        let hash = kvhoard_format::hex::decode_hash(key_or_hash)?;
        let slot = self.index.content_slot_by_bytes(&bytes_prefix(namespace, &hash))?;
        let c = self.index.content(slot)?;
        Some(Found { block: c.record, key_record: None, key: None, expires_unix_s: 0 })
    }

    /// Reads a whole record and returns it with its payload's range in it.
    pub fn read_record(&self, loc: Loc) -> Result<(AlignedBuf, std::ops::Range<usize>, u32)> {
        let h = self.header(loc).ok_or_else(|| {
            StoreError::invalid("location", format!("no record at segment {} unit {}", loc.segment, loc.unit))
        })?;
        let mut buf = AlignedBuf::zeroed(h.record_bytes() as usize);
        self.dev.read_at(&mut buf, self.offset(loc))?;
        let start = h.payload_offset() as usize;
        let range = start..start + h.stored_len as usize;
        let crc = buf.get(range.clone()).map_or(0, crc32c::crc32c);
        Ok((buf, range, crc))
    }

    /// The summary numbers.
    pub fn summary(&self, now_unix_s: u32) -> Summary {
        let sb = &self.scan.sb;
        let mut s = Summary {
            capacity_bytes: u64::from(sb.segment_count) * sb.segment_size_bytes,
            segments: sb.segment_count,
            ..Summary::default()
        };
        for seg in &self.scan.segments {
            match (&seg.header, &seg.summary) {
                (HeaderState::InUse { .. }, SummaryState::Sealed) => s.segments_sealed += 1,
                (HeaderState::InUse { .. }, _) => s.segments_open += 1,
                _ => s.segments_free += 1,
            }
            if seg.seq().is_some() {
                s.used_bytes += u64::from(seg.end_unit) * UNIT_BYTES;
            }
        }
        s.free_bytes = s.capacity_bytes.saturating_sub(s.used_bytes);
        s.keys = self.index.key_count();
        s.blocks = self.index.block_count();
        for (id, name) in self.index.namespaces().iter().enumerate() {
            let c = self.index.counters(id as u16);
            s.logical_bytes += c.logical_bytes;
            s.unique_bytes += c.unique_bytes;
            s.namespaces.insert(name.clone(), (c.keys, c.blocks, c.logical_bytes, c.unique_bytes));
        }
        for c in self.index.blocks() {
            let codec = self
                .header(c.record)
                .map_or("unknown".to_string(), |h| kvhoard_format::CompressionMeta::codec_name(h.compression.codec_id));
            *s.codecs.entry(codec).or_default() += 1;
        }
        s.tiers.insert("ssd".into(), s.blocks);
        let live = self.live_units();
        for seg in self.scan.segments.iter().filter(|s| s.seq().is_some()) {
            let ratio = live.get(&seg.index).copied().unwrap_or(0) as f64 / f64::from(sb.segment_units());
            let bucket = ((ratio * 10.0).floor() as usize).min(9);
            if let Some(b) = s.live_ratio_histogram.get_mut(bucket) {
                *b += 1;
            }
        }
        for k in self.index.keys() {
            let ttl = match k.expires_unix_s {
                0 => "none",
                _ if is_expired(k, now_unix_s) => "expired",
                e if e - now_unix_s < 60 => "< 1 min",
                e if e - now_unix_s < 3600 => "< 1 hour",
                e if e - now_unix_s < 86_400 => "< 1 day",
                _ => ">= 1 day",
            };
            *s.ttl.entry(ttl.to_string()).or_default() += 1;
            let age_s =
                self.header(k.record).map_or(0, |h| u64::from(now_unix_s).saturating_sub(h.created_unix_ms / 1000));
            let age = match age_s {
                0..60 => "< 1 min",
                60..3600 => "< 1 hour",
                3600..86_400 => "< 1 day",
                86_400..604_800 => "< 1 week",
                _ => ">= 1 week",
            };
            *s.age.entry(age.to_string()).or_default() += 1;
        }
        s
    }
}

/// What [`VolumeView::find`] found.
#[derive(Debug, Clone)]
pub struct Found {
    /// The block record.
    pub block: Loc,
    /// The key's own record (a link, or the block record), when found by key.
    pub key_record: Option<Loc>,
    /// The key, when found by key.
    pub key: Option<String>,
    /// The key's expiry (0 = never).
    pub expires_unix_s: u32,
}

/// The numbers `inspect` shows first.
#[derive(Debug, Clone, Default)]
#[expect(missing_docs, reason = "plain totals named for what they count; the ones that need words have them")]
pub struct Summary {
    pub capacity_bytes: u64,
    pub used_bytes: u64,
    pub free_bytes: u64,
    pub segments: u32,
    pub segments_free: u32,
    pub segments_open: u32,
    pub segments_sealed: u32,
    pub keys: u64,
    pub blocks: u64,
    pub logical_bytes: u64,
    pub unique_bytes: u64,
    /// Per namespace: keys, blocks, logical bytes, unique bytes.
    pub namespaces: BTreeMap<String, (u64, u64, u64, u64)>,
    /// Blocks per codec.
    pub codecs: BTreeMap<String, u64>,
    /// Blocks per tier.
    pub tiers: BTreeMap<String, u64>,
    /// Segments in use by live ratio: [0,10%), [10,20%), ... [90,100%].
    pub live_ratio_histogram: [u64; 10],
    /// Keys by remaining TTL.
    pub ttl: BTreeMap<String, u64>,
    /// Keys by age.
    pub age: BTreeMap<String, u64>,
}

/// A record kind's name.
pub fn kind_name(kind: RecordKind) -> &'static str {
    match kind {
        RecordKind::Block => "block",
        RecordKind::Link => "link",
        RecordKind::Tombstone => "tombstone",
        RecordKind::Lost => "lost",
    }
}
