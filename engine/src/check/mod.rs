//! Checking a volume without opening it as a store: what `kvhoard fsck` and `kvhoard inspect`
//! are built on.
//!
//! [`scan::scan_volume`] reads every structure through `format/` and notes what does not check
//! out. [`check`] then rebuilds the index twice, from the log alone and from the checkpoint plus
//! the log after it, compares them, and turns everything into [`Problem`]s that say where the
//! damage is and what it means for the data. [`repair`] fixes the structures; [`crate::fsck`]
//! runs the whole check-repair-check cycle. [`inspect::VolumeView`] is the read-only view of a
//! volume that `kvhoard inspect` reads through.

pub mod inspect;
pub mod repair;
pub mod scan;

use std::collections::{BTreeMap, HashMap, HashSet};

use kvhoard_format::checkpoint::Checkpoint;
use kvhoard_format::record::RecordKind;
use kvhoard_format::UNIT_BYTES;

use crate::checkpoint::CheckpointStore;
use crate::device::BlockDevice;
use crate::index::{key_fp, ContentFp, Index, KeyFp};
use crate::log::Loc;
use crate::recovery::{apply, void_freed_ahead};
use scan::{HeaderState, SegmentScan, SummaryState, VolumeScan};

pub use scan::{scan_volume, ScanError, ScanOptions};

/// How bad a problem is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// Worth knowing; nothing to repair.
    Info,
    /// The volume needs repair (or recovery at the next open) but no stored block is lost.
    Warning,
    /// Data is damaged or lost.
    Error,
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Problem {
    /// How bad.
    pub severity: Severity,
    /// Short machine-readable kind, e.g. `payload_checksum`.
    pub kind: &'static str,
    /// Segment, if it concerns one.
    pub segment: Option<u32>,
    /// Byte offset on the volume.
    pub offset: Option<u64>,
    /// Namespace, when known.
    pub namespace: Option<String>,
    /// Key, when known.
    pub key: Option<String>,
    /// What was found.
    pub detail: String,
    /// What it means for the data, and what repair does.
    pub meaning: String,
}

/// What a check found.
#[derive(Debug, Clone, Default)]
pub struct Report {
    /// Everything found, errors first.
    pub problems: Vec<Problem>,
    /// Segments in use.
    pub segments_in_use: u32,
    /// Records checked.
    pub records: u64,
    /// Live keys (in the index a store would open with).
    pub keys: u64,
    /// Stored blocks they name.
    pub blocks: u64,
    /// Records no key reaches any more (overwritten, deleted): space that reclaim will free.
    pub dead_records: u64,
    /// Their bytes.
    pub dead_bytes: u64,
    /// Bytes read.
    pub bytes_read: u64,
    /// Keys whose block is damaged, per namespace: what repair deletes.
    pub lost_keys: Vec<(String, String)>,
    /// Checkpoint used, if valid.
    pub checkpoint_seq: Option<u64>,
}

impl Report {
    /// Problems at or above `severity`.
    pub fn count(&self, severity: Severity) -> usize {
        self.problems.iter().filter(|p| p.severity >= severity).count()
    }

    /// Whether nothing needs repair.
    pub fn is_clean(&self) -> bool {
        self.count(Severity::Warning) == 0
    }
}

/// Scans and checks a volume whose checkpoints live on its device (a block device, or an
/// in-memory device in tests), without opening it as a store.
pub fn check_device(dev: &dyn BlockDevice, opts: ScanOptions) -> Result<Report, ScanError> {
    let scan = scan_volume(dev, opts, &|_, _| {})?;
    Ok(check(dev, &scan, &CheckpointStore::for_volume(&scan.sb, None)))
}

/// Checks a scanned volume against its checkpoint.
pub(crate) fn check(dev: &dyn BlockDevice, scan: &VolumeScan, checkpoints: &CheckpointStore) -> Report {
    let mut r = Report { bytes_read: scan.bytes_read, ..Report::default() };
    superblock_problems(scan, &mut r);
    policy_problems(dev, scan, &mut r);
    let cp = checkpoint_problems(dev, scan, checkpoints, &mut r);
    for seg in &scan.segments {
        segment_problems(scan, seg, &mut r);
    }
    let (log_index, _) = replay_records(scan, None);
    let (index, voided) = match &cp {
        Some(cp) => {
            let (from_cp, after, voided) = replay_voiding(scan, Some(cp));
            if after > 0 {
                r.problems.push(problem(
                    Severity::Warning,
                    "checkpoint_stale",
                    None,
                    None,
                    format!(
                        "checkpoint #{} is older than the log: {after} records were written after it",
                        cp.checkpoint_seq
                    ),
                    "open replays them (the volume was not closed cleanly); repair writes a fresh checkpoint",
                ));
            }
            compare(scan, &log_index, &from_cp, &mut r);
            (from_cp, voided)
        }
        None => {
            let (index, _, voided) = replay_voiding(scan, None);
            (index, voided)
        }
    };
    if voided > 0 {
        let freed = scan.sb.freed_ahead;
        r.problems.push(problem(
            Severity::Warning,
            "keys_voided",
            None,
            None,
            format!(
                "{voided} keys whose newest records lie in segment uses below {} are misses: a use was freed ahead of \
                 older ones, and only checkpoint #{} or a newer one knows which keys it held newer versions or \
                 deletions of, but {}",
                freed.seq,
                freed.checkpoint_seq,
                match &cp {
                    Some(cp) => format!("checkpoint #{} is the newest usable one", cp.checkpoint_seq),
                    None => "no usable checkpoint is left".into(),
                }
            ),
            "open makes them misses rather than give their older versions; repair writes a checkpoint without them",
        ));
    }
    r.checkpoint_seq = cp.map(|c| c.checkpoint_seq);
    r.keys = index.key_count();
    r.blocks = index.block_count();
    reachability(scan, &index, &mut r);
    r.problems
        .sort_by(|a, b| b.severity.cmp(&a.severity).then(a.segment.cmp(&b.segment)).then(a.offset.cmp(&b.offset)));
    r
}

pub(crate) fn problem(
    severity: Severity,
    kind: &'static str,
    segment: Option<u32>,
    offset: Option<u64>,
    detail: String,
    meaning: &str,
) -> Problem {
    Problem { severity, kind, segment, offset, namespace: None, key: None, detail, meaning: meaning.to_string() }
}

/// A copy of the namespace policies that does not decode (the superblock itself is checked
/// above): open uses the other copy; repair writes both again.
fn policy_problems(dev: &dyn BlockDevice, scan: &VolumeScan, r: &mut Report) {
    for (copy, offset) in (0u32..).zip(kvhoard_format::superblock::COPY_OFFSETS) {
        if scan.superblock_damage.iter().any(|(c, _)| *c == copy) {
            continue;
        }
        let mut unit = crate::buffer::AlignedBuf::zeroed(UNIT_BYTES as usize);
        let why = match dev.read_at(&mut unit, offset) {
            Err(e) => e.to_string(),
            Ok(()) => match kvhoard_format::policy::decode(&unit) {
                Ok(_) => continue,
                Err(e) => e.to_string(),
            },
        };
        r.problems.push(problem(
            Severity::Warning,
            "policies_copy",
            None,
            Some(offset),
            format!(
                "the namespace policies in superblock copy {} are damaged: {why}",
                if copy == 0 { "A" } else { "B" }
            ),
            "the volume opens with the other copy's; repair writes both again",
        ));
    }
}

fn superblock_problems(scan: &VolumeScan, r: &mut Report) {
    for (copy, why) in &scan.superblock_damage {
        r.problems.push(problem(
            Severity::Warning,
            "superblock_copy",
            None,
            Some(u64::from(*copy) * UNIT_BYTES),
            format!("superblock copy {} is damaged or stale: {why}", if *copy == 0 { "A" } else { "B" }),
            "the volume opens with the other copy (copy A when both decode); repair rewrites this one from it",
        ));
    }
}

fn record_offset(scan: &VolumeScan, seg: u32, unit: u32) -> u64 {
    scan.sb.unit_offset(seg, unit)
}

fn segment_problems(scan: &VolumeScan, seg: &SegmentScan, r: &mut Report) {
    let base = scan.sb.segment_offset(seg.index);
    match &seg.header {
        HeaderState::Free => return,
        HeaderState::Damaged(why) => {
            r.problems.push(problem(
                Severity::Error,
                "segment_header",
                Some(seg.index),
                Some(base),
                format!("segment header is damaged: {why}"),
                "the segment is treated as free: every block it held is lost; repair marks it free",
            ));
            return;
        }
        HeaderState::InUse { .. } => r.segments_in_use += 1,
    }
    if let Some(why) = &seg.header_rebuilt {
        r.problems.push(problem(
            Severity::Warning,
            "segment_header",
            Some(seg.index),
            Some(base),
            format!("segment header is damaged ({why}); its use is known from the segment's trailer or records"),
            "open (or repair) writes the header again; no block is lost",
        ));
    }
    let marked = seg.records.iter().filter(|r| r.header.recovered).count();
    if marked > 0 {
        let lost = seg.records.iter().filter(|r| r.header.recovered && r.header.kind == RecordKind::Lost).count();
        r.problems.push(problem(
            Severity::Warning,
            "recovered_entries",
            Some(seg.index),
            Some(base),
            format!(
                "opening the volume found {marked} records here damaged or lost and turned keys into misses{}",
                if lost > 0 {
                    format!(" ({lost} named no key: every key written before them became a miss)")
                } else {
                    String::new()
                }
            ),
            "no older version or deleted key came back; repair acknowledges the entries",
        ));
    }
    if let Some(settled) = seg.settled.as_ref().filter(|s| s.discarded > 0) {
        r.problems.push(problem(
            Severity::Warning,
            "damaged_records",
            Some(seg.index),
            Some(base),
            format!("{} records of this segment do not check out and are not a torn tail", settled.discarded),
            "opening the volume (or repair) turns their keys into misses, never into older versions",
        ));
    }
    match &seg.summary {
        SummaryState::Sealed => {}
        SummaryState::Damaged(why) => r.problems.push(problem(
            Severity::Warning,
            "summary",
            Some(seg.index),
            Some(base + u64::from(seg.end_unit) * UNIT_BYTES),
            format!("segment summary is damaged: {why}"),
            "its records were found by scanning the segment; repair writes the summary again",
        )),
        SummaryState::Unsealed if seg.settled.as_ref().is_some_and(|s| s.seal_begun) => {
            let (records, at) = seg
                .settled
                .as_ref()
                .map_or((0, 0), |s| (s.entries.iter().filter(|e| e.unit < s.chain_end).count(), s.chain_end));
            r.problems.push(problem(
                Severity::Warning,
                "seal_cut_short",
                Some(seg.index),
                Some(base + u64::from(at) * UNIT_BYTES),
                format!(
                    "segment's seal was cut short (the volume was not closed cleanly): its summary follows its {records} records at unit {at}, its trailer is missing"
                ),
                "the next open (or repair) writes the seal again; nothing acknowledged is lost",
            ))
        }
        SummaryState::Unsealed => r.problems.push(problem(
            Severity::Warning,
            "unsealed_segment",
            Some(seg.index),
            Some(base),
            format!(
                "segment was not sealed (the volume was not closed cleanly): {} records{}",
                seg.records.len(),
                seg.torn_tail
                    .as_ref()
                    .map_or(String::new(), |(u, why)| format!(", valid log ends at unit {u} ({why})"))
            ),
            "the next open (or repair) seals it after its last intact record; nothing acknowledged is lost",
        )),
    }
    for rec in &seg.records {
        r.records += 1;
        let h = &rec.header;
        let located = |mut p: Problem| {
            p.namespace = Some(h.namespace.clone());
            p.key = Some(h.key.clone());
            p
        };
        if rec.damage.is_none() && rec.salvaged {
            r.problems.push(located(problem(
                Severity::Warning,
                "after_damage",
                Some(seg.index),
                Some(record_offset(scan, seg.index, rec.unit)),
                "intact record after a damaged region of an unsealed segment".into(),
                "nothing shows it was acknowledged: opening the volume (or repair) leaves it out",
            )));
        }
    }
}

fn checkpoint_problems(
    dev: &dyn BlockDevice,
    scan: &VolumeScan,
    checkpoints: &CheckpointStore,
    r: &mut Report,
) -> Option<Checkpoint> {
    let what = match checkpoints {
        CheckpointStore::None => return None,
        CheckpointStore::Files { dir } => dir.join(crate::checkpoint::CHECKPOINT_FILE).display().to_string(),
        CheckpointStore::Slots { .. } => "the checkpoint slots".to_string(),
    };
    match checkpoints.load_verbose(dev, scan.sb.volume_id) {
        Ok(cp) if cp.segments.len() == scan.segments.len() => Some(cp),
        Ok(cp) => {
            r.problems.push(problem(
                Severity::Warning,
                "checkpoint_geometry",
                None,
                None,
                format!(
                    "checkpoint #{} describes {} segments, the volume has {}",
                    cp.checkpoint_seq,
                    cp.segments.len(),
                    scan.segments.len()
                ),
                "it is ignored and the index is rebuilt from the log; repair writes a new one",
            ));
            None
        }
        Err(why) => {
            let (kind, meaning) = match why {
                crate::checkpoint::LoadError::Missing => {
                    ("checkpoint_missing", "open replays the whole log (slower); repair writes one")
                }
                crate::checkpoint::LoadError::Foreign => {
                    ("checkpoint_foreign", "it belongs to another volume and is ignored; repair replaces it")
                }
                crate::checkpoint::LoadError::Damaged(_) => {
                    ("checkpoint_damaged", "it is ignored and the index is rebuilt from the log; repair replaces it")
                }
                crate::checkpoint::LoadError::Outdated(_) => (
                    "checkpoint_outdated",
                    "open rebuilds the index from the log, as this build reads it, and writes a current checkpoint",
                ),
            };
            // An outdated checkpoint is an upgrade, not damage: nothing needs repair.
            let severity = if matches!(why, crate::checkpoint::LoadError::Outdated(_)) {
                Severity::Info
            } else {
                Severity::Warning
            };
            r.problems.push(problem(severity, kind, None, None, format!("{what}: {why}"), meaning));
            None
        }
    }
}

/// Rebuilds the index from the scanned records (and the checkpoint, if given), as recovery does;
/// also returns how many records were replayed on top of the checkpoint.
pub fn replay(scan: &VolumeScan, cp: Option<&Checkpoint>) -> (Index, u64) {
    let (index, replayed, _) = replay_voiding(scan, cp);
    (index, replayed)
}

/// [`replay`], also returning how many keys it voided because the checkpoint that knows of a
/// segment freed ahead of older ones is not `cp` ([`crate::recovery::void_freed_ahead`]).
fn replay_voiding(scan: &VolumeScan, cp: Option<&Checkpoint>) -> (Index, u64, u64) {
    let (mut index, replayed) = replay_records(scan, cp);
    let seqs: Vec<u64> = scan.segments.iter().map(|s| s.seq().unwrap_or(0)).collect();
    let seq_of = |segment: u32| seqs.get(segment as usize).copied().unwrap_or(0);
    let voided = void_freed_ahead(&mut index, scan.sb.freed_ahead, cp.map(|c| c.checkpoint_seq), &seq_of);
    (index, replayed, voided)
}

/// The index the records give on top of `cp`, before any voiding: what the log says.
fn replay_records(scan: &VolumeScan, cp: Option<&Checkpoint>) -> (Index, u64) {
    let seqs: Vec<u64> = scan.segments.iter().map(|s| s.seq().unwrap_or(0)).collect();
    let covered = |i: u32| -> Option<(bool, u32)> {
        let c = cp?.segments.get(i as usize)?;
        let now = *seqs.get(i as usize)?;
        (c.seq != 0 && c.seq == now).then_some((c.sealed, c.end_unit))
    };
    let mut index = match cp {
        Some(cp) => Index::from_checkpoint(cp, |i| covered(i).is_some()),
        None => Index::default(),
    };
    index.replaying(true);
    let seq_of = |segment: u32| seqs.get(segment as usize).copied().unwrap_or(0);
    let mut order: Vec<&SegmentScan> = scan.segments.iter().filter(|s| s.seq().is_some()).collect();
    order.sort_by_key(|s| s.seq());
    let mut replayed = 0;
    for seg in order {
        // A use freed before the checkpoint whose header survived is not replayed.
        if let (Some(cp), Some(seq)) = (cp, seg.seq()) {
            if seq < cp.next_segment_seq && cp.segments.get(seg.index as usize).is_some_and(|c| c.seq != seq) {
                continue;
            }
        }
        let from = match covered(seg.index) {
            Some((true, end)) if seg.summary == SummaryState::Sealed && seg.end_unit == end => continue,
            Some((_, end)) => end,
            None => 1,
        };
        // A segment without a usable summary is replayed as opening the volume would settle it.
        let from_summary: Vec<kvhoard_format::summary::SummaryEntry>;
        let entries = match &seg.settled {
            Some(settled) => &settled.entries,
            None => {
                from_summary = seg
                    .records
                    .iter()
                    .map(|r| kvhoard_format::summary::SummaryEntry { unit: r.unit, header: r.header.clone() })
                    .collect();
                &from_summary
            }
        };
        for e in entries.iter().filter(|e| e.unit >= from) {
            apply(&mut index, seg.index, e, &seq_of);
            replayed += 1;
        }
    }
    index.replaying(false);
    (index, replayed)
}

/// Where each key's name is, for reports: fingerprint → (namespace, key).
fn names(scan: &VolumeScan) -> HashMap<KeyFp, (String, String)> {
    let mut names = HashMap::new();
    for rec in scan.segments.iter().flat_map(|s| &s.records) {
        let h = &rec.header;
        names.entry(key_fp(&h.namespace, &h.key)).or_insert_with(|| (h.namespace.clone(), h.key.clone()));
    }
    names
}

/// Compares the checkpoint's view with the log's: every key must name the same block at the same
/// place. Differences mean the checkpoint is wrong (or the log lost something it knew).
fn compare(scan: &VolumeScan, log: &Index, cp: &Index, r: &mut Report) {
    let names = names(scan);
    let view = |ix: &Index| -> BTreeMap<KeyFp, (Loc, ContentFp)> {
        ix.keys().filter_map(|k| ix.content(k.content).map(|c| (k.fp, (c.record, c.fp)))).collect()
    };
    let (a, b) = (view(log), view(cp));
    let mut differing = 0u64;
    for (fp, entry) in &b {
        if a.get(fp) != Some(entry) {
            differing += 1;
            if differing <= 20 {
                let (ns, key) = names.get(fp).cloned().unzip();
                let mut p = problem(
                    Severity::Warning,
                    "checkpoint_mismatch",
                    Some(entry.0.segment),
                    Some(record_offset(scan, entry.0.segment, entry.0.unit)),
                    "the checkpoint maps this key to a block the log does not".into(),
                    "if the checkpoint is right, an older version would come back from the log alone; repair writes a new checkpoint from the open store",
                );
                p.namespace = ns;
                p.key = key;
                r.problems.push(p);
            }
        }
    }
    let missing = a.keys().filter(|fp| !b.contains_key(*fp)).count();
    if missing > 0 || differing > 20 {
        r.problems.push(problem(
            Severity::Info,
            "checkpoint_differs",
            None,
            None,
            format!("{differing} keys differ between checkpoint and log; the log alone would also know {missing} keys the checkpoint dropped"),
            "keys dropped by reclaiming a segment other than the oldest stay dropped because of the checkpoint",
        ));
    }
}

/// Which keys name damaged blocks, and which records no key reaches. A damaged record that a key
/// still needs is an error; one that nothing reaches any more (its keys were deleted or
/// overwritten) is quarantined garbage that reclaim will free.
fn reachability(scan: &VolumeScan, index: &Index, r: &mut Report) {
    let names = names(scan);
    let mut content_of: HashMap<Loc, Vec<KeyFp>> = HashMap::new();
    let mut own_record: HashSet<Loc> = HashSet::new();
    for k in index.keys() {
        own_record.insert(k.record);
        if let Some(c) = index.content(k.content) {
            content_of.entry(c.record).or_default().push(k.fp);
        }
    }
    for seg in &scan.segments {
        for rec in &seg.records {
            let loc = Loc { segment: seg.index, unit: rec.unit };
            let h = &rec.header;
            let keys = content_of.get(&loc);
            let reached = keys.is_some() || own_record.contains(&loc);
            if !reached && h.kind != RecordKind::Tombstone {
                r.dead_records += 1;
                r.dead_bytes += u64::from(rec.units) * UNIT_BYTES;
            }
            let Some(why) = &rec.damage else { continue };
            let unsealed = seg.summary == SummaryState::Unsealed;
            let (severity, kind, meaning) = match (keys, reached, unsealed) {
                (Some(_), _, _) => (Severity::Error, "damaged_record", "its bytes cannot be returned: reads of the keys that name them are misses; repair deletes those keys"),
                (None, true, _) => (Severity::Warning, "damaged_record", "the key still resolves through the summary's copy of this header; its bytes are elsewhere and intact"),
                (None, false, true) => (Severity::Warning, "torn_record", "a write that was not yet synced when the volume stopped (or damage to one): it was never acknowledged as durable, so nothing acknowledged is lost; the key keeps what it named before, if anything, and repair leaves the record out when it seals the segment"),
                (None, false, false) => (Severity::Info, "damaged_record", "no key reaches it any more; its space is freed when its segment is reclaimed"),
            };
            let mut p = problem(
                severity,
                kind,
                Some(seg.index),
                Some(record_offset(scan, seg.index, rec.unit)),
                format!("{:?} record is damaged: {why}", h.kind),
                meaning,
            );
            p.namespace = Some(h.namespace.clone());
            p.key = Some(h.key.clone());
            r.problems.push(p);
            for fp in keys.into_iter().flatten() {
                if let Some((ns, key)) = names.get(fp) {
                    r.lost_keys.push((ns.clone(), key.clone()));
                }
            }
        }
    }
    let on_disk: HashSet<Loc> = scan
        .segments
        .iter()
        .flat_map(|s| s.records.iter().map(move |rec| Loc { segment: s.index, unit: rec.unit }))
        .collect();
    let mut dangling = 0u64;
    for k in index.keys() {
        let block = index.content(k.content).map(|c| c.record);
        for loc in [Some(k.record), block].into_iter().flatten() {
            if !on_disk.contains(&loc) {
                dangling += 1;
                if dangling <= 20 {
                    let (ns, key) = names.get(&k.fp).cloned().unzip();
                    let mut p = problem(
                        Severity::Error,
                        "checkpoint_dangling",
                        Some(loc.segment),
                        Some(record_offset(scan, loc.segment, loc.unit)),
                        "the checkpoint points this key at a record that is not there".into(),
                        "reads of the key would fail; repair rebuilds the index from the log",
                    );
                    p.namespace = ns;
                    p.key = key;
                    r.problems.push(p);
                }
            }
        }
    }
    r.lost_keys.sort();
    r.lost_keys.dedup();
    if !r.lost_keys.is_empty() {
        r.problems.push(problem(
            Severity::Error,
            "lost_keys",
            None,
            None,
            format!("{} keys name damaged blocks", r.lost_keys.len()),
            "reads of these keys are misses; repair deletes them so that they are not reported again",
        ));
    }
}
