//! Opening a volume: the newest valid checkpoint, then the segments written after it, from
//! their summaries or, for a segment that was never sealed, by scanning it ([`settle`]: a torn
//! tail is cut; damage turns keys into misses, never into older versions). Every segment found
//! unsealed is sealed here, so nothing is ever appended after a cut; damaged segment headers
//! are rebuilt ([`headers`]).

use std::time::Instant;

use kvhoard_format::checkpoint::{Checkpoint, SegmentState};
use kvhoard_format::record::RecordKind;
use kvhoard_format::segment::SegmentHeader;
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::superblock::{FreedAhead, Superblock};
use kvhoard_format::UNIT_BYTES;

use crate::buffer::AlignedBuf;
use crate::checkpoint::CheckpointStore;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::index::{ContentEntry, Index};
use crate::log::probe::look_past;
use crate::log::seal::write_seal;
use crate::log::{Loc, OpenSeg, Pos, SegInfo, SegState};

pub(crate) mod headers;
mod read_ahead;
pub(crate) mod settle;

use headers::{read_header, HeaderRead};
use read_ahead::{EntryFps, ReadUse};

/// What opening the volume found and did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
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
    /// Segment headers found damaged and rebuilt from their segment's records.
    pub headers_rebuilt: u32,
    /// Records recovery could not trust (damaged, or found past damage), replaced in their
    /// segment's summary by a tombstone of their key or a `Lost` entry (fsck reports them).
    pub records_discarded: u64,
    /// Keys made misses because no checkpoint that knows a segment freed ahead of an older one
    /// could be loaded ([`void_freed_ahead`]).
    pub keys_voided: u64,
    /// Time taken, in milliseconds.
    pub elapsed_ms: u64,
}

impl RecoveryReport {
    /// Whether the state came from the checkpoint alone: nothing replayed, repaired or voided.
    /// (A segment the checkpoint lists but found free shows as a difference in the segment
    /// table, not here.)
    pub(crate) fn checkpoint_alone(&self) -> bool {
        self.checkpoint_seq.is_some()
            && self.segments_replayed == 0
            && self.tails_cut.is_empty()
            && self.stale_segments_freed == 0
            && self.headers_rebuilt == 0
            && self.records_discarded == 0
            && self.keys_voided == 0
    }
}

/// The state rebuilt from disk.
#[derive(Debug)]
pub(crate) struct Recovered {
    /// The index.
    pub index: Index,
    /// Every segment's state.
    pub segments: Vec<SegInfo>,
    /// The segment to keep appending to, if one was left open and can safely be continued.
    pub open: Option<OpenSeg>,
    /// The newest sealed segment, if it has room: the first write resumes it instead of starting
    /// a new segment (a clean close seals the open segment).
    pub resumable: Option<OpenSeg>,
    /// The seq the next segment use gets.
    pub next_seq: u64,
    /// The seq the next checkpoint gets.
    pub next_checkpoint_seq: u64,
    /// The segment table of the checkpoint used (empty without one): the newest valid checkpoint
    /// on disk, which a crash before the next one is written would recover from again.
    pub checkpoint_covers: Vec<SegmentState>,
    /// The newest segment use freed ahead of older ones, as both superblock copies now hold it.
    pub freed_ahead: FreedAhead,
    /// What happened.
    pub report: RecoveryReport,
}

/// Rebuilds the index and segment table of the volume on `dev`.
pub(crate) fn recover(dev: &dyn BlockDevice, sb: &Superblock, checkpoints: &CheckpointStore) -> Result<Recovered> {
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
    // The boot each segment's use began in (0: unknown).
    let mut boots = vec![0u64; count];
    let mut unknown = Vec::new();
    let mut max_seq = 0;
    let mut freed_ahead = sb.freed_ahead;
    for index in 0..sb.segment_count {
        let (h, rebuilt) = match read_header(dev, sb, index)? {
            HeaderRead::Free => continue,
            HeaderRead::InUse(h) => (h, None),
            HeaderRead::Rebuilt(h, why) => (h, Some(why)),
            HeaderRead::Unknown(why) => {
                tracing::error!(segment = index, reason = %why, "segment header is damaged and nothing tells which use the segment held");
                unknown.push(index);
                continue;
            }
        };
        let known = cp.as_ref().and_then(|c| c.segments.get(index as usize));
        if let (Some(c), Some(k)) = (&cp, known) {
            if h.seq < c.next_segment_seq && k.seq != h.seq {
                // This use was freed before the checkpoint was written; its header survived.
                tracing::warn!(
                    segment = index,
                    seq = h.seq,
                    "segment was reclaimed before the last checkpoint; freeing it"
                );
                // Its reclaim may have stopped before it recorded the use in the superblock
                // (between the checkpoint and the record): recorded now, before the header goes,
                // so that an open without this checkpoint does not trust the log alone.
                freed_ahead = record_freed(dev, sb, freed_ahead, h.seq, c.checkpoint_seq)?;
                dev.write_at(&AlignedBuf::zeroed(UNIT_BYTES as usize), sb.segment_offset(index))?;
                report.stale_segments_freed += 1;
                continue;
            }
        }
        if let Some(why) = rebuilt {
            tracing::error!(segment = index, seq = h.seq, reason = %why, "segment header is damaged; rebuilt it from the segment's records");
            write_header(dev, sb, &h)?;
            report.headers_rebuilt += 1;
        }
        max_seq = max_seq.max(h.seq);
        if let (Some(s), Some(b)) = (segments.get_mut(index as usize), boots.get_mut(index as usize)) {
            *s = SegInfo { state: SegState::Open, seq: h.seq, created_unix_ms: h.created_unix_ms };
            *b = h.boot;
        }
    }
    // A segment use whose header never became durable leaves no trace here, yet some of its
    // records may have: were that segment's next use given the same seq, a scan would take
    // them for its own and bring back writes this recovery has already dropped. Every use begun
    // since the last sync is such a candidate, and there are at most `segment_count` of them
    // (each takes a segment that was free at that sync: reclaiming another one syncs), so the
    // seqs after the highest one known are skipped.
    // A use freed ahead of older ones (recorded in the superblock) may have had a higher seq than
    // any use left: without a checkpoint, only the superblock tells.
    let mut next_seq = cp
        .as_ref()
        .map_or(1, |c| c.next_segment_seq)
        .max(max_seq.saturating_add(1))
        .max(freed_ahead.seq.saturating_add(1))
        .saturating_add(u64::from(sb.segment_count) + 1);
    // A damaged segment of unknown use may have held the newest version or the deletion of any
    // key: each becomes a use after every other, holding only a `Lost` entry, which voids every
    // key written before it.
    let voided_segments = unknown.len();
    for index in unknown {
        let seq = next_seq;
        next_seq += 1;
        void_segment(dev, sb, index, seq)?;
        report.records_discarded += 1;
        if let (Some(s), Some(b)) = (segments.get_mut(index as usize), boots.get_mut(index as usize)) {
            *s = SegInfo { state: SegState::Sealed { end_unit: 1 }, seq, created_unix_ms: 0 };
            *b = dev.boot();
        }
    }
    let seqs: Vec<u64> = segments.iter().map(|s| s.seq).collect();
    let seq_of = |segment: u32| seqs.get(segment as usize).copied().unwrap_or(0);
    let covered = |i: u32| -> Option<(bool, u32)> {
        let c = cp.as_ref()?.segments.get(i as usize)?;
        let now = *seqs.get(i as usize)?;
        (c.seq != 0 && c.seq == now).then_some((c.sealed, c.end_unit))
    };
    let mut index = match &cp {
        Some(cp) => Index::from_checkpoint(cp, |i| covered(i).is_some()),
        None => Index::default(),
    };
    index.replaying(true);
    let mut unsealed = Vec::new();
    let mut order: Vec<u32> =
        (0..sb.segment_count).filter(|&i| segments.get(i as usize).is_some_and(|s| s.seq != 0)).collect();
    order.sort_by_key(|&i| segments.get(i as usize).map_or(0, |s| s.seq));
    let plan = read_ahead::Plan { dev, sb, order: &order, seqs: &seqs, boots: &boots, covered: &covered };
    read_ahead::read_ahead(&plan, |read| {
        match read {
            ReadUse::Covered { index: i, end_unit } => set_sealed(&mut segments, i, end_unit),
            ReadUse::Summarized { index: i, from_unit, entries, fps, end_unit } => {
                report.segments_replayed += 1;
                report.records_replayed += apply_all(&mut index, i, &entries, &fps, from_unit, &seq_of);
                set_sealed(&mut segments, i, end_unit);
            }
            ReadUse::Settled { index: i, seq, from_unit, settled, fps } => {
                report.segments_replayed += 1;
                report.records_replayed += apply_all(&mut index, i, &settled.entries, &fps, from_unit, &seq_of);
                unsealed.push((i, seq, settled));
            }
        }
        Ok(())
    })?;
    index.replaying(false);
    report.keys_voided = void_freed_ahead(&mut index, freed_ahead, report.checkpoint_seq, &seq_of);
    // The newest unsealed segment is appended to again if nothing of its use lies past its
    // valid end and nothing keeps it from being (`kept_from_appends`); every other one is sealed
    // after its last valid record (after the last evidence of damage, when there is some), so
    // that nothing is ever appended in front of stale records of the same use.
    let newest = unsealed.iter().map(|(_, seq, _)| *seq).max();
    let mut open = None;
    for (i, seq, settled) in unsealed {
        report.records_discarded += settled.discarded;
        let boot = boots.get(i as usize).copied().unwrap_or(0);
        let continuable = Some(seq) == newest && settled.clean_end;
        let kept_from = kept_from_appends(boot == dev.boot() && boot != 0, settled.discarded, voided_segments);
        // Every recovered record was reserved with room for its summary entry (an entry written
        // in place of a damaged record is never longer), so the summary still fits whatever is
        // appended next.
        if continuable && kept_from.is_none() {
            let mut seg = OpenSeg::new(i, seq);
            seg.tail = settled.chain_end;
            for e in &settled.entries {
                summary::encode_entry(&mut seg.summary, e.unit, &e.header.encode());
                seg.records += 1;
            }
            if let Some(s) = segments.get_mut(i as usize) {
                s.state = SegState::Open;
            }
            open = Some(seg);
            continue;
        }
        let why = match kept_from.filter(|_| continuable) {
            Some(reason) => format!("{reason}: sealed at its records' end, new writes go to a new segment"),
            None => settled.stop.clone().unwrap_or_else(|| "segment full".into()),
        };
        tracing::warn!(segment = i, end_unit = settled.chain_end, reason = %why, "segment was not sealed; sealing it after its last valid record");
        seal_recovered(dev, sb, i, seq, settled.seal_unit, &settled.entries)?;
        report.tails_cut.push((i, why));
        set_sealed(&mut segments, i, settled.seal_unit);
    }
    // Synced whether or not recovery wrote: a process crash leaves what it found in the
    // device's cache, and reclaim may erase what those records superseded only once they are
    // durable (`LogState::note_superseded`), which it learns from syncs made from now on.
    dev.sync()?;
    let resumable = if open.is_none() { resumable(dev, sb, &segments, &boots)? } else { None };
    report.elapsed_ms = started.elapsed().as_millis() as u64;
    // Checkpoint seqs go on from the newest one a segment freed ahead relied on, even if it was
    // not loaded: a checkpoint numbered below it would be taken for one that does not know.
    let next_checkpoint_seq = cp
        .as_ref()
        .map_or(1, |c: &Checkpoint| c.checkpoint_seq.saturating_add(1))
        .max(freed_ahead.checkpoint_seq.saturating_add(1));
    let checkpoint_covers = cp.map(|c| c.segments).unwrap_or_default();
    Ok(Recovered {
        index,
        segments,
        open,
        resumable,
        next_seq,
        next_checkpoint_seq,
        checkpoint_covers,
        freed_ahead,
        report,
    })
}

/// Why the newest unsealed segment may not be appended to again, though its records end
/// cleanly; `None` when it may.
///
/// - Its use began in another boot of the machine (`this_boot` false): its header's boot is what
///   tells the next recovery a crash of the process from a power loss (see [`resumable`]).
/// - Recovery wrote entries in place of records it could not trust (`discarded`): they exist
///   only in the summary, which the segment gets when it is sealed. Appended to, a power loss
///   before that seal leaves a later recovery the records alone, which, not trusting the writer
///   then, takes the damaged one for a torn tail and drops every synced record after it.
/// - Recovery voided segments of unknown use (`voided`): their `Lost` entries void every key
///   written in a use below theirs, and appends here would be such writes.
fn kept_from_appends(this_boot: bool, discarded: u64, voided: usize) -> Option<&'static str> {
    if !this_boot {
        Some("begun before the machine restarted")
    } else if discarded > 0 {
        Some("it holds entries written in place of damaged records, which only its summary keeps")
    } else if voided > 0 {
        Some("segments of unknown use were voided after it")
    } else {
        None
    }
}

/// Voids every key of the volume, for one whose lost parts could have held anything (a volume
/// file cut short: the segments past its end may have held the newest version or the deletion
/// of any key): a free segment becomes a use after every other, holding only a `Lost` entry.
/// Returns the segment used, or `None` if none is free.
pub(crate) fn void_all(dev: &dyn BlockDevice, sb: &Superblock, checkpoints: &CheckpointStore) -> Result<Option<u32>> {
    let mut max_seq = checkpoints.load(dev, sb.volume_id).map_or(0, |c| c.next_segment_seq);
    let mut free = None;
    for i in 0..sb.segment_count {
        match read_header(dev, sb, i)? {
            HeaderRead::Free => {
                free.get_or_insert(i);
            }
            HeaderRead::InUse(h) | HeaderRead::Rebuilt(h, _) => max_seq = max_seq.max(h.seq),
            HeaderRead::Unknown(_) => {}
        }
    }
    let Some(index) = free else { return Ok(None) };
    // As recovery's next seq: past every use a crash may have lost without a trace, and every
    // use freed ahead of older ones.
    let seq = max_seq.max(sb.freed_ahead.seq).saturating_add(u64::from(sb.segment_count) + 2);
    void_segment(dev, sb, index, seq)?;
    dev.sync()?;
    Ok(Some(index))
}

/// Writes a segment header (a rebuilt one, or a void segment's).
fn write_header(dev: &dyn BlockDevice, sb: &Superblock, h: &SegmentHeader) -> Result<()> {
    let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
    unit.copy_from_slice(&h.encode());
    dev.write_at(&unit, sb.segment_offset(h.segment_index))?;
    Ok(())
}

/// Makes segment `index` a sealed use `seq` holding one `Lost` entry: every key whose newest
/// record comes before it is void. Not synced: the caller syncs.
pub(crate) fn void_segment(dev: &dyn BlockDevice, sb: &Superblock, index: u32, seq: u64) -> Result<()> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let h =
        SegmentHeader { volume_id: sb.volume_id, segment_index: index, seq, created_unix_ms: now, boot: dev.boot() };
    write_header(dev, sb, &h)?;
    seal_recovered(dev, sb, index, seq, 1, &[SummaryEntry { unit: 1, header: settle::lost(seq) }])
}

/// The newest sealed segment if at least an eighth of it is still free and its use began in this
/// boot of the machine, with its records as the summary to extend.
///
/// A resumed use keeps its header, and with it the boot it began in, which is what tells
/// recovery whether a crash since was the process's or the machine's (`settle.rs`). Resumed in
/// a later boot, a `kill -9` would be taken for a power loss, and a damaged record of it for a
/// torn tail: its key would fall back to an older version instead of becoming a miss.
/// Rewriting the header's boot instead would open a window where a torn header loses the whole
/// segment, so after a reboot the first write starts a new segment.
fn resumable(dev: &dyn BlockDevice, sb: &Superblock, segments: &[SegInfo], boots: &[u64]) -> Result<Option<OpenSeg>> {
    let newest = segments
        .iter()
        .enumerate()
        .filter(|(_, s)| matches!(s.state, SegState::Sealed { .. }))
        .max_by_key(|(_, s)| s.seq);
    let Some((i, info)) = newest else { return Ok(None) };
    let boot = boots.get(i).copied().unwrap_or(0);
    if boot == 0 || boot != dev.boot() {
        return Ok(None);
    }
    let i = i as u32;
    let Ok((entries, end_unit)) = crate::log::scan::read_summary(dev, sb, i, info.seq)? else { return Ok(None) };
    let mut seg = OpenSeg::new(i, info.seq);
    seg.tail = end_unit;
    for e in &entries {
        summary::encode_entry(&mut seg.summary, e.unit, &e.header.encode());
        seg.records += 1;
    }
    let summary_end = u64::from(end_unit) + crate::log::units_for(seg.summary.len());
    if summary_end + 1 + u64::from(sb.segment_units()) / 8 > u64::from(sb.segment_units()) {
        return Ok(None);
    }
    // After the room check, which costs nothing: this one reads the tombstones' records.
    if !only_records(dev, sb, i, info.seq, &entries) {
        return Ok(None);
    }
    // Resuming erases the summary and appends after the last record; that is only safe if no
    // record of this use lies past the summary (recovery may have sealed this segment at a cut
    // with intact records of its use beyond it), or a later scan could run into one.
    let after_summary = u32::try_from(summary_end).unwrap_or(u32::MAX);
    Ok(nothing_after(dev, sb, i, info.seq, after_summary)?.then_some(seg))
}

/// Whether every entry of a sealed segment's summary stands for an intact record of it. Not so
/// for the entries recovery wrote in place of records it could not trust (a tombstone where a
/// damaged block was, a `Lost` marker), marked `recovered` until fsck acknowledges them: they
/// exist only in the summary, which resuming erases, and a later recovery that does not trust
/// the writer would take the damaged record for a torn tail and drop the records after it.
/// Tombstones are checked against the record at their unit (they are rare, and a real one takes
/// one unit to read).
fn only_records(dev: &dyn BlockDevice, sb: &Superblock, i: u32, seq: u64, entries: &[SummaryEntry]) -> bool {
    if entries.iter().any(|e| e.header.recovered || e.header.kind == RecordKind::Lost) {
        return false;
    }
    let base = sb.segment_offset(i);
    let units = sb.segment_units();
    for e in entries.iter().filter(|e| e.header.kind == RecordKind::Tombstone) {
        // Records end before the segment's last unit (its trailer), as every scan bounds them.
        let left = units.saturating_sub(1).saturating_sub(e.unit);
        // A unit that cannot be read is no proof either: the segment is not resumed, and the
        // open goes on (the error is the next reader's to meet).
        match crate::log::scan::read_record_at(dev, base, e.unit, left, Some(seq)) {
            Ok(Ok((header, ..)))
                if header.kind == RecordKind::Tombstone
                    && header.key == e.header.key
                    && header.namespace == e.header.namespace => {}
            _ => return false,
        }
    }
    true
}

/// Whether nothing of use `seq` (no record, not even a damaged header) lies from `end_unit` to
/// the segment's end: only then may appends start at `end_unit`.
fn nothing_after(dev: &dyn BlockDevice, sb: &Superblock, i: u32, seq: u64, end_unit: u32) -> Result<bool> {
    let last = sb.segment_units() - 1;
    Ok(look_past(dev, sb.segment_offset(i), end_unit, last, seq)?.is_empty())
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

/// Records in both superblock copies (each synced) that use `seq` is freed and checkpoint
/// `checkpoint_seq` knows it, unless `freed` says as much already; returns what they hold.
fn record_freed(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    freed: FreedAhead,
    seq: u64,
    checkpoint_seq: u64,
) -> Result<FreedAhead> {
    let want = freed.and(seq, checkpoint_seq);
    if want != freed {
        let sb = Superblock { freed_ahead: want, ..sb.clone() };
        crate::volume::write_superblocks(dev, &sb, &crate::volume::read_policies(dev))?;
    }
    Ok(want)
}

/// Voids the keys that a segment use freed ahead of an older one may have held newer versions or
/// deletions of, when the checkpoint that knows it is gone was not loaded (`loaded`: the seq of
/// the one that was): every key whose newest record lies in a use below it. Without the
/// checkpoint nothing tells which keys the freed use held, and the log alone would give them
/// their older versions (docs/format.md, "Damage"). Returns how many keys were voided.
pub(crate) fn void_freed_ahead(
    index: &mut Index,
    freed: FreedAhead,
    loaded: Option<u64>,
    seq_of: &dyn Fn(u32) -> u64,
) -> u64 {
    if !freed.voids_from(loaded) {
        return 0;
    }
    let voided = index.void_keys(|k| seq_of(k.record.segment) < freed.seq);
    tracing::warn!(
        voided,
        below_seq = freed.seq,
        checkpoint_seq = freed.checkpoint_seq,
        loaded = ?loaded,
        "the checkpoint that knows of a segment freed ahead of older ones is missing or damaged: keys written before it are misses"
    );
    voided
}

/// Applies one record to the index, as the store did when it wrote it. `seq_of` gives the seq of
/// each segment's current use (a `Lost` entry voids keys by log position).
pub(crate) fn apply(index: &mut Index, segment: u32, e: &SummaryEntry, seq_of: &dyn Fn(u32) -> u64) {
    apply_with(index, segment, e, EntryFps::of(&e.header), seq_of);
}

/// Applies the entries of segment `segment` from unit `from_unit` on, with their fingerprints
/// (`fps`, in step with `entries`); returns how many.
fn apply_all(
    index: &mut Index,
    segment: u32,
    entries: &[SummaryEntry],
    fps: &[EntryFps],
    from_unit: u32,
    seq_of: &dyn Fn(u32) -> u64,
) -> u64 {
    let mut applied = 0;
    for (e, fps) in entries.iter().zip(fps).filter(|(e, _)| e.unit >= from_unit) {
        apply_with(index, segment, e, *fps, seq_of);
        applied += 1;
    }
    applied
}

/// [`apply`], with the record's fingerprints computed already (`fps`).
fn apply_with(index: &mut Index, segment: u32, e: &SummaryEntry, fps: EntryFps, seq_of: &dyn Fn(u32) -> u64) {
    let h = &e.header;
    if h.kind == RecordKind::Lost {
        let at = Pos { seq: h.segment_seq, unit: e.unit };
        let voided = index.void_keys(|k| Pos { seq: seq_of(k.record.segment), unit: k.record.unit } < at);
        tracing::warn!(segment, unit = e.unit, voided, "a lost record voids every key written before it");
        return;
    }
    let Some(ns) = index.ns_id_or_insert(&h.namespace) else {
        tracing::error!(namespace = %h.namespace, "more than 65536 namespaces; record skipped");
        return;
    };
    let key = fps.key;
    let loc = Loc { segment, unit: e.unit };
    let expires = expiry(h.created_unix_ms, h.ttl_secs);
    match h.kind {
        RecordKind::Block => {
            let units = (h.record_bytes() / UNIT_BYTES) as u32;
            index.apply_block(key, ContentEntry::of_record(h, fps.content, loc, units, ns), expires);
        }
        RecordKind::Link => {
            // The link is the key's newest record so far: if its bytes are not stored (their
            // segment was reclaimed), the key is a miss, never the version it named before.
            if !index.apply_link(ns, key, fps.content, loc, expires) {
                index.remove_key(&key);
            }
        }
        RecordKind::Tombstone => {
            index.remove_key(&key);
        }
        RecordKind::Lost => {}
    }
}

/// Unix seconds at which a record with this creation time and TTL expires; 0 = never.
pub(crate) fn expiry(created_unix_ms: u64, ttl_secs: u32) -> u32 {
    if ttl_secs == 0 {
        return 0;
    }
    u32::try_from(created_unix_ms / 1000 + u64::from(ttl_secs)).unwrap_or(u32::MAX)
}
