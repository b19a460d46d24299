//! Reading segment headers at open, including damaged ones.
//!
//! A segment whose header does not decode used to be taken for free: whatever its records held
//! was forgotten, and keys it had replaced or deleted came back from older segments. Now a header
//! that is not free (not all zeros, not another volume's) is probed: the seq of its use is read
//! from the segment's trailer, or from the header of its first record, and the header is written
//! again. If nothing names the use, the segment is [`HeaderRead::Unknown`]: it was this
//! volume's, and what it held cannot be known.

use kvhoard_format::segment::{SegmentHeader, SummaryTrailer};
use kvhoard_format::superblock::Superblock;
use kvhoard_format::UNIT_BYTES;

use crate::buffer::AlignedBuf;
use crate::device::{BlockDevice, DeviceError};
use crate::log::probe::identify;

/// A segment header as read at open.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum HeaderRead {
    /// No use of this volume.
    Free,
    /// In use, header intact.
    InUse(SegmentHeader),
    /// In use; the header was damaged and is rebuilt from the trailer or the first record (its
    /// `boot` unknown, its creation time that of the first record if any).
    Rebuilt(SegmentHeader, String),
    /// The header was this volume's and is damaged, and nothing tells which use it was.
    Unknown(String),
}

/// Reads and, if damaged, probes the header of segment `index`.
pub(crate) fn read_header(dev: &dyn BlockDevice, sb: &Superblock, index: u32) -> Result<HeaderRead, DeviceError> {
    let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
    dev.read_at(&mut unit, sb.segment_offset(index))?;
    let why = match SegmentHeader::decode(&unit) {
        Ok(h) if h.volume_id == sb.volume_id && h.segment_index == index => return Ok(HeaderRead::InUse(h)),
        Ok(h) if h.volume_id == sb.volume_id => format!("it names segment {} instead of {index}", h.segment_index),
        Ok(_) => return Ok(HeaderRead::Free),
        Err(_) if unit.iter().all(|&b| b == 0) => return Ok(HeaderRead::Free),
        Err(e) => e.to_string(),
    };
    let ours = unit.get(16..32) == Some(&sb.volume_id[..]);
    if let Some((seq, created_unix_ms)) = probe_use(dev, sb, index)? {
        let h = SegmentHeader { volume_id: sb.volume_id, segment_index: index, seq, created_unix_ms, boot: 0 };
        return Ok(HeaderRead::Rebuilt(h, why));
    }
    Ok(if ours { HeaderRead::Unknown(why) } else { HeaderRead::Free })
}

/// The seq (and creation time, if known) of the use segment `index` holds, from its trailer or
/// from the header of its first record.
fn probe_use(dev: &dyn BlockDevice, sb: &Superblock, index: u32) -> Result<Option<(u64, u64)>, DeviceError> {
    let units = sb.segment_units();
    let base = sb.segment_offset(index);
    let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
    dev.read_at(&mut unit, base + u64::from(units - 1) * UNIT_BYTES)?;
    let trailer = SummaryTrailer::decode(&unit, units).ok().filter(|t| t.segment_index == index && t.seq != 0);
    dev.read_at(&mut unit, base + UNIT_BYTES)?;
    let first = identify(dev, base + UNIT_BYTES, &unit, None, units - 2)?.map(|(h, _)| h);
    // A trailer can be left from an earlier use when the current one is not sealed; the first
    // record is always of the current use. The later of the two is the current use.
    Ok(match (trailer, first) {
        (Some(t), Some(h)) if h.segment_seq >= t.seq => Some((h.segment_seq, h.created_unix_ms)),
        (Some(t), _) => Some((t.seq, 0)),
        (None, Some(h)) => Some((h.segment_seq, h.created_unix_ms)),
        (None, None) => None,
    })
}
