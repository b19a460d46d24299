//! Opening a volume: the newest valid checkpoint, then the segments written after it, from
//! their summaries or, for a segment that was never sealed, by scanning it and cutting its torn
//! tail. Every segment found unsealed is sealed here, so nothing is ever appended after a cut.

use std::time::Instant;

use kvhoard_format::checkpoint::Checkpoint;
use kvhoard_format::record::RecordKind;
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::superblock::Superblock;
use kvhoard_format::UNIT_BYTES;

use crate::checkpoint_io::CheckpointStore;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::index::{content_fp, key_fp, ContentEntry, Index, Loc};
use crate::log::scan::{read_segment, read_segment_header};
use crate::log::seal::write_seal;
use crate::log::{SegInfo, SegState};
use crate::AlignedBuf;

/// What opening the volume found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RecoveryReport {
    /// The checkpoint used, if any.
    pub checkpoint_seq: Option<u64>,
    /// Segments whose records were replayed.
    pub segments_replayed: u32,
    /// Records replayed.
    pub records_replayed: u64,
    /// Segments found unsealed and sealed now, with why their scan stopped.
    pub tails_cut: Vec<(u32, String)>,
    /// Segments whose header was left from a use freed before the checkpoint.
    pub stale_segments_freed: u32,
    /// Time taken, in milliseconds.
    pub elapsed_ms: u64,
}

/// The state rebuilt from disk.
#[derive(Debug)]
pub struct Recovered {
    /// The index.
    pub index: Index,
    /// Every segment's state.
    pub segments: Vec<SegInfo>,
    /// The seq the next segment use gets.
    pub next_seq: u64,
    /// The seq the next checkpoint gets.
    pub next_checkpoint_seq: u64,
    /// What happened.
    pub report: RecoveryReport,
}

/// Rebuilds the index and segment table of the volume on `dev`.
pub fn recover(dev: &dyn BlockDevice, sb: &Superblock, checkpoints: &CheckpointStore) -> Result<Recovered> {
    let started = Instant::now();
    let mut report = RecoveryReport::default();
    let count = sb.segment_count as usize;
    let cp = checkpoints.load(dev, sb.volume_id).filter(|cp| {
        let fits = cp.segments.len() == count;
        if !fits {
            tracing::warn!(
                segments = cp.segments.len(),
                expected = count,
                "checkpoint describes another geometry; ignoring it"
            );
        }
        fits
    });
    report.checkpoint_seq = cp.as_ref().map(|c| c.checkpoint_seq);
    let mut segments = vec![SegInfo::FREE; count];
    let mut max_seq = 0;
    let mut wrote = false;
    for index in 0..sb.segment_count {
        let Some(h) = read_segment_header(dev, sb, index)? else { continue };
        let known = cp.as_ref().and_then(|c| c.segments.get(index as usize));
        if let (Some(c), Some(k)) = (&cp, known) {
            if h.seq < c.next_segment_seq && k.seq != h.seq {
                // This use was freed before the checkpoint was written; its header survived.
                tracing::warn!(
                    segment = index,
                    seq = h.seq,
                    "segment was reclaimed before the last checkpoint; freeing it"
                );
                dev.write_at(&AlignedBuf::zeroed(UNIT_BYTES as usize), sb.segment_offset(index))?;
                report.stale_segments_freed += 1;
                wrote = true;
                continue;
            }
        }
        max_seq = max_seq.max(h.seq);
        if let Some(s) = segments.get_mut(index as usize) {
            *s = SegInfo { state: SegState::Open, seq: h.seq, created_unix_ms: h.created_unix_ms };
        }
    }
    let seqs: Vec<u64> = segments.iter().map(|s| s.seq).collect();
    let covered = |i: u32| -> Option<(bool, u32)> {
        let c = cp.as_ref()?.segments.get(i as usize)?;
        let now = *seqs.get(i as usize)?;
        (c.seq != 0 && c.seq == now).then_some((c.sealed, c.end_unit))
    };
    let mut index = match &cp {
        Some(cp) => Index::from_checkpoint(cp, |i| covered(i).is_some()),
        None => Index::default(),
    };
    let mut order: Vec<u32> =
        (0..sb.segment_count).filter(|&i| segments.get(i as usize).is_some_and(|s| s.seq != 0)).collect();
    order.sort_by_key(|&i| segments.get(i as usize).map_or(0, |s| s.seq));
    for i in order {
        let seq = segments.get(i as usize).map_or(0, |s| s.seq);
        let from_unit = match covered(i) {
            Some((true, end_unit)) => {
                set_sealed(&mut segments, i, end_unit);
                continue;
            }
            Some((false, end_unit)) => end_unit,
            None => 1,
        };
        let recs = read_segment(dev, sb, i, seq, 1)?;
        report.segments_replayed += 1;
        for e in recs.entries.iter().filter(|e| e.unit >= from_unit) {
            apply(&mut index, i, e);
            report.records_replayed += 1;
        }
        if !recs.sealed {
            let why = recs.stop.clone().unwrap_or_else(|| "segment full".into());
            tracing::warn!(segment = i, end_unit = recs.end_unit, reason = %why, "segment was not sealed; sealing it after its last valid record");
            seal_recovered(dev, sb, i, seq, recs.end_unit, &recs.entries)?;
            report.tails_cut.push((i, why));
            wrote = true;
        }
        set_sealed(&mut segments, i, recs.end_unit);
    }
    if wrote {
        dev.sync()?;
    }
    let next_seq = cp.as_ref().map_or(1, |c| c.next_segment_seq).max(max_seq + 1);
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    let next_checkpoint_seq = cp.as_ref().map_or(1, |c: &Checkpoint| c.checkpoint_seq + 1);
    Ok(Recovered { index, segments, next_seq, next_checkpoint_seq, report })
}

fn set_sealed(segments: &mut [SegInfo], i: u32, end_unit: u32) {
    if let Some(s) = segments.get_mut(i as usize) {
        s.state = SegState::Sealed { end_unit };
    }
}

fn seal_recovered(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    i: u32,
    seq: u64,
    end_unit: u32,
    entries: &[SummaryEntry],
) -> Result<()> {
    let mut bytes = Vec::new();
    for e in entries {
        summary::encode_entry(&mut bytes, e.unit, &e.header.encode());
    }
    write_seal(dev, sb, i, seq, end_unit, &bytes, entries.len() as u32)?;
    Ok(())
}

/// Applies one record to the index, as the store did when it wrote it.
pub fn apply(index: &mut Index, segment: u32, e: &SummaryEntry) {
    let h = &e.header;
    let Some(ns) = index.ns_id_or_insert(&h.namespace) else {
        tracing::error!(namespace = %h.namespace, "more than 65536 namespaces; record skipped");
        return;
    };
    let key = key_fp(&h.namespace, &h.key);
    let loc = Loc { segment, unit: e.unit };
    let expires = expiry(h.created_unix_ms, h.ttl_secs);
    match h.kind {
        RecordKind::Block => {
            let units = (h.record_bytes() / UNIT_BYTES) as u32;
            let block = ContentEntry {
                fp: content_fp(&h.namespace, &h.content_hash),
                record: loc,
                units,
                raw_len: h.raw_len as u32,
                refs: 0,
                ns,
            };
            index.apply_block(key, block, expires);
        }
        RecordKind::Link => {
            index.apply_link(ns, key, content_fp(&h.namespace, &h.content_hash), loc, expires);
        }
        RecordKind::Tombstone => {
            index.remove_key(&key);
        }
    }
}

/// Unix seconds at which a record with this creation time and TTL expires; 0 = never.
pub fn expiry(created_unix_ms: u64, ttl_secs: u32) -> u32 {
    if ttl_secs == 0 {
        return 0;
    }
    u32::try_from(created_unix_ms / 1000 + u64::from(ttl_secs)).unwrap_or(u32::MAX)
}
