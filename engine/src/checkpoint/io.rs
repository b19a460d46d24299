//! Where checkpoints are kept: files beside a directory volume (written to a temporary file,
//! fsynced, renamed, and the directory fsynced), or two alternating slots on a raw device.

use std::io::Write;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvhoard_format::checkpoint::Checkpoint;
use kvhoard_format::superblock::Superblock;
use kvhoard_format::{align_up, UNIT_BYTES};

use crate::buffer::AlignedBuf;
use crate::device::BlockDevice;
use crate::error::{Result, StoreError};

/// Name of the checkpoint file in a directory volume.
pub const CHECKPOINT_FILE: &str = "checkpoint";

/// Why no checkpoint could be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// There is none.
    #[error("no checkpoint")]
    Missing,
    /// The only one belongs to another volume.
    #[error("the checkpoint belongs to another volume")]
    Foreign,
    /// It does not decode.
    #[error("the checkpoint is damaged: {0}")]
    Damaged(String),
    /// An older kvhoard wrote it in a format this build no longer reads.
    #[error("the checkpoint was written by an older kvhoard (checkpoint format {0})")]
    Outdated(u32),
}

/// Where this volume's checkpoints live.
#[derive(Debug, Clone)]
pub enum CheckpointStore {
    /// A file in the volume directory.
    Files {
        /// The volume directory.
        dir: PathBuf,
    },
    /// Two slots on the device; the newer valid one wins.
    Slots {
        /// Offset of slot 0.
        offset: u64,
        /// Bytes per slot.
        slot_bytes: u64,
        /// The slot of the newest checkpoint this store read or wrote, plus one (0: none
        /// known). The next one is written to the other slot, so that a write a crash tears
        /// leaves the newest readable; the parity of seqs would not do, since seqs are skipped
        /// (a snapshot superseded before it was written, one that did not fit its slot).
        newest: Arc<AtomicU64>,
    },
    /// Nowhere: every open replays the summaries.
    None,
}

impl CheckpointStore {
    /// The store a volume uses.
    pub fn for_volume(sb: &Superblock, meta_dir: Option<PathBuf>) -> CheckpointStore {
        match (sb.checkpoint_slot_bytes, meta_dir) {
            (0, Some(dir)) => CheckpointStore::Files { dir },
            (0, None) => CheckpointStore::None,
            (slot_bytes, _) => {
                CheckpointStore::Slots { offset: sb.checkpoint_offset, slot_bytes, newest: Arc::new(AtomicU64::new(0)) }
            }
        }
    }

    /// The newest checkpoint that decodes and belongs to `volume_id`. Damaged or foreign ones
    /// are logged and ignored, and open rebuilds the index from the log; a usable one is never
    /// thrown away (`fsck --repair` keeps a stale one), since reclaim frees a segment other than
    /// the oldest without a checkpoint of its own when the newest one covers it.
    pub fn load(&self, dev: &dyn BlockDevice, volume_id: [u8; 16]) -> Option<Checkpoint> {
        match self.load_verbose(dev, volume_id) {
            Ok(cp) => Some(cp),
            Err(LoadError::Missing) => None,
            Err(e @ LoadError::Outdated(_)) => {
                tracing::info!("{e}: rebuilding the index from the log (once; the next checkpoint is current)");
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "checkpoint unusable; replaying the log");
                None
            }
        }
    }

    /// Like [`CheckpointStore::load`], saying why there is no usable checkpoint.
    pub fn load_verbose(&self, dev: &dyn BlockDevice, volume_id: [u8; 16]) -> Result<Checkpoint, LoadError> {
        // Each with its slot (0 for the file).
        let candidates: Vec<(u64, Vec<u8>)> = match self {
            CheckpointStore::Files { dir } => match std::fs::read(dir.join(CHECKPOINT_FILE)) {
                Ok(bytes) => vec![(0, bytes)],
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => vec![],
                Err(e) => return Err(LoadError::Damaged(format!("cannot read it: {e}"))),
            },
            CheckpointStore::Slots { offset, slot_bytes, .. } => {
                (0..2u64).filter_map(|i| Some((i, read_slot(dev, offset + i * slot_bytes, *slot_bytes)?))).collect()
            }
            CheckpointStore::None => vec![],
        };
        let mut error = LoadError::Missing;
        let mut best: Option<(u64, Checkpoint)> = None;
        for (slot, bytes) in candidates {
            match Checkpoint::decode(&bytes) {
                Ok(cp) if cp.volume_id == volume_id => {
                    if best.as_ref().is_none_or(|(_, b)| b.checkpoint_seq < cp.checkpoint_seq) {
                        best = Some((slot, cp));
                    }
                }
                Ok(_) => error = LoadError::Foreign,
                Err(kvhoard_format::FormatError::Outdated { found, .. }) => error = LoadError::Outdated(found),
                Err(e) => {
                    if !matches!(error, LoadError::Foreign) {
                        error = LoadError::Damaged(e.to_string());
                    }
                }
            }
        }
        let (slot, best) = best.ok_or(error)?;
        if let CheckpointStore::Slots { newest, .. } = self {
            newest.store(slot + 1, Ordering::Release);
        }
        Ok(best)
    }

    /// Removes every checkpoint, so that the next open rebuilds the index from the log.
    pub fn remove(&self, dev: &dyn BlockDevice) -> Result<()> {
        match self {
            CheckpointStore::Files { dir } => match std::fs::remove_file(dir.join(CHECKPOINT_FILE)) {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                Err(source) => {
                    Err(StoreError::File { action: "cannot remove", path: dir.join(CHECKPOINT_FILE), source })
                }
            },
            CheckpointStore::Slots { offset, slot_bytes, newest } => {
                let zero = AlignedBuf::zeroed(UNIT_BYTES as usize);
                newest.store(0, Ordering::Release);
                dev.write_at(&zero, *offset)?;
                dev.write_at(&zero, offset + slot_bytes)?;
                dev.sync()?;
                Ok(())
            }
            CheckpointStore::None => Ok(()),
        }
    }

    /// Writes `cp` so that a crash at any point leaves either it or the previous one readable.
    pub fn save(&self, dev: &dyn BlockDevice, cp: &Checkpoint) -> Result<bool> {
        let bytes = cp.encode();
        match self {
            CheckpointStore::Files { dir } => {
                let tmp = dir.join(format!("{CHECKPOINT_FILE}.tmp"));
                let dst = dir.join(CHECKPOINT_FILE);
                let io = |action, path: &PathBuf| {
                    let path = path.clone();
                    move |source| StoreError::File { action, path, source }
                };
                let mut f = std::fs::File::create(&tmp).map_err(io("cannot create", &tmp))?;
                f.write_all(&bytes).map_err(io("cannot write", &tmp))?;
                f.sync_all().map_err(io("cannot sync", &tmp))?;
                std::fs::rename(&tmp, &dst).map_err(io("cannot rename", &tmp))?;
                std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io("cannot sync", dir))?;
                Ok(true)
            }
            CheckpointStore::Slots { offset, slot_bytes, newest } => {
                let needed = align_up(8 + bytes.len() as u64).unwrap_or(u64::MAX);
                if needed > *slot_bytes {
                    tracing::warn!(
                        needed,
                        slot_bytes,
                        "checkpoint does not fit its slot; open will use the older one, or the log alone"
                    );
                    return Ok(false);
                }
                let mut buf = AlignedBuf::zeroed(needed as usize);
                if let Some(s) = buf.get_mut(..8) {
                    s.copy_from_slice(&(bytes.len() as u64).to_le_bytes())
                }
                if let Some(s) = buf.get_mut(8..8 + bytes.len()) {
                    s.copy_from_slice(&bytes)
                }
                // The slot the newest checkpoint known is not in; by parity when none is known
                // (nothing readable to keep).
                let slot = match newest.load(Ordering::Acquire) {
                    1 => 1,
                    2 => 0,
                    _ => cp.checkpoint_seq % 2,
                };
                dev.write_at(&buf, offset + slot * slot_bytes)?;
                dev.sync()?;
                newest.store(slot + 1, Ordering::Release);
                Ok(true)
            }
            CheckpointStore::None => Ok(false),
        }
    }
}

fn read_slot(dev: &dyn BlockDevice, offset: u64, slot_bytes: u64) -> Option<Vec<u8>> {
    let mut first = AlignedBuf::zeroed(UNIT_BYTES as usize);
    dev.read_at(&mut first, offset).ok()?;
    let len = u64::from_le_bytes(first.get(..8)?.try_into().ok()?);
    if len == 0 || len > slot_bytes.saturating_sub(8) {
        return None;
    }
    let total = align_up(8 + len)?;
    let mut buf = AlignedBuf::zeroed(total as usize);
    dev.read_at(&mut buf, offset).ok()?;
    buf.get(8..8 + len as usize).map(<[u8]>::to_vec)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::device::MemDevice;

    fn checkpoint(seq: u64) -> Checkpoint {
        Checkpoint { volume_id: [7; 16], checkpoint_seq: seq, ..Checkpoint::default() }
    }

    fn readable(dev: &MemDevice, slot_bytes: u64) -> Vec<u64> {
        (0..2u64)
            .filter_map(|i| read_slot(dev, i * slot_bytes, slot_bytes))
            .filter_map(|b| Checkpoint::decode(&b).ok())
            .map(|cp| cp.checkpoint_seq)
            .collect()
    }

    /// Seqs are skipped (a snapshot superseded before it was written): checkpoints 1 and 3,
    /// both odd, still go to two slots, so that a torn write of the next leaves 3 readable. An
    /// open that finds 3 writes the next one beside it too.
    #[test]
    fn a_checkpoint_never_overwrites_the_newest_whatever_the_seqs() {
        let slot_bytes = 64 << 10;
        let dev = MemDevice::new(2 * slot_bytes);
        let store = CheckpointStore::Slots { offset: 0, slot_bytes, newest: Arc::default() };
        assert!(store.save(&dev, &checkpoint(1)).unwrap());
        assert!(store.save(&dev, &checkpoint(3)).unwrap());
        let mut seqs = readable(&dev, slot_bytes);
        seqs.sort_unstable();
        assert_eq!(seqs, [1, 3], "3 overwrote 1's slot");
        let reopened = CheckpointStore::Slots { offset: 0, slot_bytes, newest: Arc::default() };
        assert_eq!(reopened.load_verbose(&dev, [7; 16]).unwrap().checkpoint_seq, 3);
        assert!(reopened.save(&dev, &checkpoint(5)).unwrap());
        let mut seqs = readable(&dev, slot_bytes);
        seqs.sort_unstable();
        assert_eq!(seqs, [3, 5], "5 overwrote 3, the newest");
    }
}
