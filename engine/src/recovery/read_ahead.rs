//! Reading the segment uses recovery replays one thread ahead of the one applying them: while
//! a use is applied to the index, the next one's summary is read and decoded (or, without a
//! usable summary, the use is settled from its records) and its entries' fingerprints are
//! computed (three blake3 hashes per block record, the largest cost of a replay after the
//! index's own work). Uses still arrive, and are applied, in log order.

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::summary::SummaryEntry;
use kvhoard_format::superblock::Superblock;

use super::settle::{settle, Settled};
use crate::buffer::AlignedBuf;
use crate::device::BlockDevice;
use crate::error::Result;
use crate::index::{header_fp, key_fp, ContentFp, KeyFp};
use crate::log::scan::{read_summary, sealed_end};

/// The fingerprints replaying a record needs, computed where its header is decoded.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct EntryFps {
    /// The key's (zero for a `Lost` entry, which names none).
    pub key: KeyFp,
    /// That of the block a block record stores or a link names (zero for other kinds).
    pub content: ContentFp,
}

impl EntryFps {
    /// The fingerprints of the record `h`.
    pub(crate) fn of(h: &RecordHeader) -> EntryFps {
        match h.kind {
            RecordKind::Lost => EntryFps::default(),
            RecordKind::Tombstone => EntryFps { key: key_fp(&h.namespace, &h.key), content: ContentFp::default() },
            RecordKind::Block | RecordKind::Link => {
                EntryFps { key: key_fp(&h.namespace, &h.key), content: header_fp(h) }
            }
        }
    }
}

/// One segment use, read and ready to apply.
#[derive(Debug)]
pub(crate) enum ReadUse {
    /// Sealed at the end the checkpoint knows: nothing of it to replay.
    Covered { index: u32, end_unit: u32 },
    /// Sealed: the entries of its summary, with their fingerprints (`fps`, in step with them;
    /// those before `from_unit` are the checkpoint's already), and where its records end.
    Summarized { index: u32, from_unit: u32, entries: Vec<SummaryEntry>, fps: Vec<EntryFps>, end_unit: u32 },
    /// Without a usable summary: settled from its records. `fps` go with `settled.entries`;
    /// those before `from_unit` are the checkpoint's already.
    Settled { index: u32, seq: u64, from_unit: u32, settled: Settled, fps: Vec<EntryFps> },
}

/// What the reading thread needs to know of each use, fixed before replay begins.
pub(crate) struct Plan<'a> {
    pub dev: &'a dyn BlockDevice,
    pub sb: &'a Superblock,
    /// The uses to read, in replay (seq) order.
    pub order: &'a [u32],
    /// Each segment's use seq.
    pub seqs: &'a [u64],
    /// Each segment's boot (0: unknown).
    pub boots: &'a [u64],
    /// For a segment whose use the checkpoint knows: whether it was sealed then, and where its
    /// records ended.
    pub covered: &'a (dyn Fn(u32) -> Option<(bool, u32)> + Sync),
}

/// Reads every use of `plan.order` on a thread of its own, handing each to `apply` in order;
/// stops at the first error, of reading or of `apply`, and returns it.
pub(crate) fn read_ahead(plan: &Plan<'_>, mut apply: impl FnMut(ReadUse) -> Result<()>) -> Result<()> {
    // One use being applied, one waiting, one being read: a few summaries' worth of memory.
    let (tx, rx) = std::sync::mpsc::sync_channel::<Result<ReadUse>>(1);
    std::thread::scope(|scope| {
        crate::thread::spawn_scoped(scope, "kvhoard-recover", move || {
            let mut scratch = AlignedBuf::zeroed(kvhoard_format::UNIT_BYTES as usize);
            for &i in plan.order {
                let read = read_use(plan, i, &mut scratch);
                let failed = read.is_err();
                // A closed channel: the applying side stopped at an error of its own.
                if tx.send(read).is_err() || failed {
                    return;
                }
            }
        })?;
        // Ends when the reader has sent every use (or stopped at an error) and gone.
        for read in rx {
            apply(read?)?;
        }
        Ok(())
    })
}

/// Reads use `i` as replay needs it.
fn read_use(plan: &Plan<'_>, i: u32, scratch: &mut AlignedBuf) -> Result<ReadUse> {
    let (dev, sb) = (plan.dev, plan.sb);
    let seq = plan.seqs.get(i as usize).copied().unwrap_or(0);
    let from_unit = match (plan.covered)(i) {
        // Sealed when the checkpoint was written and still sealed at the same end. A segment
        // resumed for appends after the checkpoint has lost its trailer, or has been sealed
        // again further on: replay what follows the checkpoint's end.
        Some((true, end_unit)) if sealed_end(dev, sb, i, seq, scratch)? == Some(end_unit) => {
            return Ok(ReadUse::Covered { index: i, end_unit });
        }
        Some((_, end_unit)) => end_unit,
        None => 1,
    };
    match read_summary(dev, sb, i, seq)? {
        Ok((entries, end_unit)) => {
            // Entries stay where they were decoded (a header is a few hundred bytes to move).
            let fps = entries.iter().map(|e| fps_from(e, from_unit)).collect();
            Ok(ReadUse::Summarized { index: i, from_unit, entries, fps, end_unit })
        }
        Err(why) => {
            if let Some(why) = why {
                tracing::warn!(segment = i, reason = %why, "segment summary unusable; scanning the segment");
            }
            let boot = plan.boots.get(i as usize).copied().unwrap_or(0);
            let settled = settle(dev, sb, i, seq, boot != 0 && boot == dev.boot())?;
            let fps = settled.entries.iter().map(|e| fps_from(e, from_unit)).collect();
            Ok(ReadUse::Settled { index: i, seq, from_unit, settled, fps })
        }
    }
}

/// The fingerprints of entry `e` if it is replayed (from `from_unit` on); none for an entry the
/// checkpoint holds already.
fn fps_from(e: &SummaryEntry, from_unit: u32) -> EntryFps {
    if e.unit >= from_unit {
        EntryFps::of(&e.header)
    } else {
        EntryFps::default()
    }
}
