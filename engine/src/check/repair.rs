//! Repairing a volume's on-disk structures after [`super::check`], without the engine:
//! superblock copies, segment headers, summaries, checkpoints. Every action is reported; nothing
//! is removed silently, and every intact block is kept. (The keys whose blocks are damaged are
//! deleted afterwards through the engine itself, by [`crate::fsck`].)

use kvhoard_format::summary;
use kvhoard_format::UNIT_BYTES;

use super::scan::{HeaderState, SummaryState, VolumeScan};
use super::Report;
use crate::checkpoint::CheckpointStore;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::log::scan::read_summary;
use crate::log::seal::write_seal;

/// Fixes what can be fixed without the engine. The caller holds the volume's lock.
pub fn repair_structures(
    dev: &dyn BlockDevice,
    scan: &VolumeScan,
    report: &Report,
    checkpoints: &CheckpointStore,
) -> Result<Vec<String>> {
    let sb = &scan.sb;
    let mut done = Vec::new();
    let policies_damaged = report.problems.iter().any(|p| p.kind == "policies_copy");
    if !scan.superblock_damage.is_empty() || policies_damaged {
        // Both copies are written again from the good one, namespace policies included (read
        // from whichever copy still holds them).
        let policies = crate::volume::read_policies(dev);
        crate::volume::write_superblocks(dev, sb, &policies)?;
        if policies_damaged {
            done.push("wrote the namespace policies into both superblock copies again".into());
        }
        for (copy, _) in &scan.superblock_damage {
            done.push(format!(
                "rewrote superblock copy {} from copy {}",
                if *copy == 0 { "A" } else { "B" },
                if *copy == 0 { "B" } else { "A" }
            ));
        }
    }
    for seg in &scan.segments {
        let (HeaderState::InUse { seq, .. }, Some(settled)) = (&seg.header, &seg.settled) else {
            // Sealed segments keep their summaries; a header damaged beyond rebuilding is left to
            // the engine, whose open voids what it may have held (`crate::recovery`).
            continue;
        };
        // Sealed exactly as opening the volume would seal it.
        let mut bytes = Vec::new();
        for e in &settled.entries {
            summary::encode_entry(&mut bytes, e.unit, &e.header.encode());
        }
        let end = u64::from(settled.seal_unit) * UNIT_BYTES + bytes.len() as u64;
        if end > u64::from(sb.segment_units() - 1) * UNIT_BYTES {
            done.push(format!(
                "segment {}: its summary does not fit after unit {}; left for the engine to seal at its next open",
                seg.index, settled.seal_unit
            ));
            continue;
        }
        write_seal(dev, sb, seg.index, *seq, settled.seal_unit, &bytes, settled.entries.len() as u32)?;
        let why = match &seg.summary {
            SummaryState::Damaged(_) => "rewrote its damaged summary",
            _ => "sealed it after its last intact record",
        };
        done.push(format!(
            "segment {}: {why} ({} records{})",
            seg.index,
            settled.entries.len(),
            if settled.discarded > 0 {
                format!(", {} of them entries in place of damaged records (their keys are misses)", settled.discarded)
            } else {
                String::new()
            }
        ));
    }
    // A checkpoint that is only older than the log (a volume not closed cleanly), or that maps
    // keys differently from what the log alone gives, is one a plain open uses, and may hold what
    // the log lacks: a segment freed without a checkpoint of its own because the newest one
    // covered it, so that older versions in older segments stay gone. Kept, the open that
    // repairs the keys starts from it and writes a fresh one; removed, the index would be
    // rebuilt from the log alone and could bring those versions back.
    let kept = ["checkpoint_differs", "checkpoint_stale", "checkpoint_mismatch"];
    let checkpoint_bad = report.problems.iter().any(|p| p.kind.starts_with("checkpoint_") && !kept.contains(&p.kind));
    if checkpoint_bad {
        checkpoints.remove(dev)?;
        done.push("removed the unusable checkpoint; the index is rebuilt from the log".into());
    }
    dev.sync()?;
    Ok(done)
}

/// Clears the `recovered` mark of the entries recovery wrote into summaries in place of
/// records it could not trust: fsck reported them (the keys they name are misses), and once
/// repaired the volume checks clean. The entries themselves stay: they keep those keys misses.
pub fn acknowledge_recovered(dev: &dyn BlockDevice, scan: &VolumeScan) -> Result<Vec<String>> {
    let sb = &scan.sb;
    let mut done = Vec::new();
    for seg in &scan.segments {
        let HeaderState::InUse { seq, .. } = seg.header else { continue };
        if seg.summary != SummaryState::Sealed {
            continue;
        }
        let Ok((mut entries, end_unit)) = read_summary(dev, sb, seg.index, seq)? else { continue };
        let marked = entries.iter().filter(|e| e.header.recovered).count();
        if marked == 0 {
            continue;
        }
        let mut bytes = Vec::new();
        for e in &mut entries {
            e.header.recovered = false;
            summary::encode_entry(&mut bytes, e.unit, &e.header.encode());
        }
        write_seal(dev, sb, seg.index, seq, end_unit, &bytes, entries.len() as u32)?;
        done.push(format!(
            "segment {}: acknowledged {marked} entries recovery wrote in place of damaged or lost records",
            seg.index
        ));
    }
    if !done.is_empty() {
        dev.sync()?;
    }
    Ok(done)
}
