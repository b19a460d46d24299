//! Repairing a volume's on-disk structures after [`super::check`], without the engine:
//! superblock copies, segment headers, summaries, checkpoints. Every action is reported; nothing
//! is removed silently, and every intact block is kept. (The keys whose blocks are damaged are
//! deleted afterwards through the engine itself, by [`crate::fsck`].)

use kvhoard_format::summary;
use kvhoard_format::superblock::COPY_OFFSETS;
use kvhoard_format::UNIT_BYTES;

use super::scan::{HeaderState, SummaryState, VolumeScan};
use super::Report;
use crate::buffer::AlignedBuf;
use crate::checkpoint::CheckpointStore;
use crate::device::BlockDevice;
use crate::error::Result;
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
    for (copy, _) in &scan.superblock_damage {
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        unit.copy_from_slice(&sb.encode(*copy));
        let offset = COPY_OFFSETS.get(*copy as usize).copied().unwrap_or(0);
        dev.write_at(&unit, offset)?;
        done.push(format!(
            "rewrote superblock copy {} from copy {}",
            if *copy == 0 { "A" } else { "B" },
            if *copy == 0 { "B" } else { "A" }
        ));
    }
    for seg in &scan.segments {
        match (&seg.header, &seg.summary) {
            (HeaderState::Damaged(why), _) => {
                dev.write_at(&AlignedBuf::zeroed(UNIT_BYTES as usize), sb.segment_offset(seg.index))?;
                done.push(format!("segment {}: header damaged ({why}); marked free, its blocks are lost", seg.index));
            }
            (HeaderState::InUse { seq, .. }, summary_state) => {
                let salvaged = seg.records.iter().filter(|r| r.salvaged).count();
                if *summary_state == SummaryState::Sealed && salvaged == 0 {
                    continue;
                }
                // Damaged records of an unsealed segment are the torn writes a crash leaves
                // (fsck reports them as torn_record): the summary leaves them out, as recovery
                // does, so their keys keep what they named before.
                let kept: Vec<_> = seg
                    .records
                    .iter()
                    .filter(|r| *summary_state != SummaryState::Unsealed || r.damage.is_none())
                    .collect();
                let mut bytes = Vec::new();
                for rec in &kept {
                    summary::encode_entry(&mut bytes, rec.unit, &rec.header.encode());
                }
                let end = u64::from(seg.end_unit) * UNIT_BYTES + bytes.len() as u64;
                if end > u64::from(sb.segment_units() - 1) * UNIT_BYTES {
                    done.push(format!(
                        "segment {}: its summary does not fit after unit {}; left unsealed",
                        seg.index, seg.end_unit
                    ));
                    continue;
                }
                write_seal(dev, sb, seg.index, *seq, seg.end_unit, &bytes, kept.len() as u32)?;
                let why = match summary_state {
                    SummaryState::Damaged(_) => "rewrote its damaged summary",
                    SummaryState::Unsealed => "sealed it after its last intact record",
                    SummaryState::Sealed => "rewrote its summary",
                };
                done.push(format!(
                    "segment {}: {why} ({} records{})",
                    seg.index,
                    kept.len(),
                    if salvaged > 0 { format!(", {salvaged} of them found after damage") } else { String::new() }
                ));
            }
            (HeaderState::Free, _) => {}
        }
    }
    let checkpoint_bad =
        report.problems.iter().any(|p| p.kind.starts_with("checkpoint_") && p.kind != "checkpoint_differs");
    if checkpoint_bad {
        checkpoints.remove(dev)?;
        done.push("removed the unusable checkpoint; the index is rebuilt from the log".into());
    }
    dev.sync()?;
    Ok(done)
}
