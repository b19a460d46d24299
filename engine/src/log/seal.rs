//! Sealing a segment: its summary after the last record, the trailer in its last unit.

use kvhoard_format::segment::SummaryTrailer;
use kvhoard_format::superblock::Superblock;
use kvhoard_format::UNIT_BYTES;

use crate::buffer::AlignedBuf;
use crate::device::{BlockDevice, DeviceError};

/// Writes the summary of segment `index` (use `seq`, records ending at `end_unit`) and then its
/// trailer. Not synced: a summary that does not survive a crash is rebuilt by scanning.
pub fn write_seal(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
    end_unit: u32,
    summary: &[u8],
    record_count: u32,
) -> Result<(), DeviceError> {
    if !summary.is_empty() {
        let mut buf = AlignedBuf::zeroed(summary.len());
        if let Some(dst) = buf.get_mut(..summary.len()) {
            dst.copy_from_slice(summary);
        }
        dev.write_at(&buf, sb.unit_offset(index, end_unit))?;
    }
    let trailer = SummaryTrailer {
        segment_index: index,
        seq,
        end_unit,
        summary_unit: end_unit,
        summary_bytes: summary.len() as u32,
        record_count,
        summary_crc: crc32c::crc32c(summary),
    };
    let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
    unit.copy_from_slice(&trailer.encode());
    dev.write_at(&unit, sb.unit_offset(index, sb.segment_units() - 1))
}
