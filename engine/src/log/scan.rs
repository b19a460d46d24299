//! Reading records back: one record for a `get`, all of a segment's records for recovery and
//! listing (from its summary when sealed, by scanning when not).

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::segment::SummaryTrailer;
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::superblock::Superblock;
use kvhoard_format::{FormatError, UNIT_BYTES};

use crate::buffer::AlignedBuf;
use crate::device::{BlockDevice, DeviceError};

/// The records of segment `index` (use `seq`) from unit `from_unit` on: from its summary, or
/// by scanning it up to the first record that does not check out (for a listing; recovery
/// settles such a segment with more care, `crate::recovery::settle`).
pub fn read_segment(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
    from_unit: u32,
) -> Result<Vec<SummaryEntry>, DeviceError> {
    match read_summary(dev, sb, index, seq)? {
        Ok((entries, _)) => Ok(entries.into_iter().filter(|e| e.unit >= from_unit).collect()),
        Err(why) => {
            if let Some(why) = why {
                tracing::warn!(segment = index, reason = %why, "segment summary unusable; scanning the segment");
            }
            scan(dev, sb, index, seq, from_unit.max(1))
        }
    }
}

/// A sealed segment's records and where they end; `Err(None)` when the segment is not sealed (no
/// trailer of this use), `Err(Some(reason))` when its trailer or summary is damaged.
pub type SummaryRead = Result<(Vec<SummaryEntry>, u32), Option<String>>;

/// A record's header, units and bytes; or why the bytes at that place are not a valid record.
pub type RecordRead = Result<(RecordHeader, u32, AlignedBuf), String>;

/// The trailer of segment `index` if it seals use `seq`; `Err(None)` if the segment is not
/// sealed in that use, `Err(Some(why))` if its trailer is damaged.
fn trailer_of_use(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
) -> Result<Result<SummaryTrailer, Option<String>>, DeviceError> {
    let units = sb.segment_units();
    let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
    dev.read_at(&mut unit, sb.unit_offset(index, units - 1))?;
    Ok(match SummaryTrailer::decode(&unit, units) {
        Ok(t) if t.seq == seq && t.segment_index == index => Ok(t),
        Ok(_) | Err(FormatError::BadMagic { .. }) => Err(None),
        Err(e) => Err(Some(e.to_string())),
    })
}

/// The summary of a sealed segment (see [`SummaryRead`]).
pub(crate) fn read_summary(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
) -> Result<SummaryRead, DeviceError> {
    let trailer = match trailer_of_use(dev, sb, index, seq)? {
        Ok(t) => t,
        Err(why) => return Ok(Err(why)),
    };
    let mut buf = AlignedBuf::zeroed(trailer.summary_bytes as usize);
    dev.read_at(&mut buf, sb.unit_offset(index, trailer.summary_unit))?;
    let bytes = buf.get(..trailer.summary_bytes as usize).unwrap_or_default();
    match summary::decode(bytes, trailer.record_count, trailer.summary_crc) {
        Ok(entries) if entries.iter().all(|e| e.header.segment_seq == seq) => Ok(Ok((entries, trailer.end_unit))),
        Ok(_) => Ok(Err(Some("summary lists records of another segment use".into()))),
        Err(e) => Ok(Err(Some(e.to_string()))),
    }
}

/// Where the records of segment `index` end, if a trailer seals it in use `seq` over a summary
/// whose checksum holds. The entries are not decoded: an open from a checkpoint that lists the
/// segment's records needs only where they end, and decoding every summary took most of such an
/// open. The summary is still read and checked: a seal is not synced, so after a power loss its
/// trailer may have reached the device and its summary not, and the segment must then be sealed
/// again from its records. `scratch` is read into (replaced by a larger one where it is too
/// small): one buffer for every segment, not a fresh mapping each.
pub(crate) fn sealed_end(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
    scratch: &mut AlignedBuf,
) -> Result<Option<u32>, DeviceError> {
    let Ok(trailer) = trailer_of_use(dev, sb, index, seq)? else { return Ok(None) };
    let len = (crate::log::units_for(trailer.summary_bytes as usize) * UNIT_BYTES) as usize;
    if scratch.len() < len {
        *scratch = AlignedBuf::zeroed(len);
    }
    let Some(buf) = scratch.get_mut(..len) else { return Ok(None) };
    dev.read_at(buf, sb.unit_offset(index, trailer.summary_unit))?;
    let bytes = buf.get(..trailer.summary_bytes as usize).unwrap_or_default();
    Ok(summary::check(bytes, trailer.summary_crc).is_ok().then_some(trailer.end_unit))
}

/// Walks records from `unit` until one does not decode, belongs to another use of the segment,
/// or fails its payload checksum.
fn scan(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
    mut unit: u32,
) -> Result<Vec<SummaryEntry>, DeviceError> {
    let units = sb.segment_units();
    let base = sb.segment_offset(index);
    let mut entries = Vec::new();
    while unit < units - 1 {
        match read_record_at(dev, base, unit, units - 1 - unit, Some(seq))? {
            Ok((header, record_units, _)) => {
                entries.push(SummaryEntry { unit, header });
                unit += record_units;
            }
            Err(_) => break,
        }
    }
    Ok(entries)
}

/// Reads and checks the record at `unit` of the segment at `base`, which may take at most
/// `max_units`. The inner `Err` says why the bytes there are not a valid record.
pub fn read_record_at(
    dev: &dyn BlockDevice,
    base: u64,
    unit: u32,
    max_units: u32,
    seq: Option<u64>,
) -> Result<RecordRead, DeviceError> {
    let offset = base + u64::from(unit) * UNIT_BYTES;
    let mut first = AlignedBuf::zeroed(UNIT_BYTES as usize);
    dev.read_at(&mut first, offset)?;
    let header_len = match RecordHeader::peek_len(&first) {
        Ok(len) => len,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let mut head = first;
    if header_len as u64 > UNIT_BYTES {
        head = AlignedBuf::zeroed(header_len);
        dev.read_at(&mut head, offset)?;
    }
    let header = match RecordHeader::decode(&head) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e.to_string())),
    };
    if seq.is_some_and(|s| s != header.segment_seq) {
        return Ok(Err(format!(
            "record of segment use {} where use {} was expected",
            header.segment_seq,
            seq.unwrap_or(0)
        )));
    }
    let record_units = header.record_bytes() / UNIT_BYTES;
    if record_units > u64::from(max_units) {
        return Ok(Err(format!("record of {record_units} units runs past the segment ({max_units} left)")));
    }
    let mut buf = AlignedBuf::zeroed(header.record_bytes() as usize);
    dev.read_at(&mut buf, offset)?;
    if let Err(why) = check_payload(&header, &buf) {
        return Ok(Err(why));
    }
    Ok(Ok((header, record_units as u32, buf)))
}

/// Checks the payload of a whole record buffer against the header's crc32c.
pub fn check_payload(header: &RecordHeader, record: &[u8]) -> Result<(), String> {
    if header.kind != RecordKind::Block {
        return Ok(());
    }
    let start = header.payload_offset() as usize;
    let payload = record.get(start..start + header.stored_len as usize).ok_or("record shorter than its payload")?;
    let crc = crc32c::crc32c(payload);
    if crc == header.payload_crc {
        Ok(())
    } else {
        Err(format!("payload checksum mismatch: stored {:#010x}, computed {crc:#010x}", header.payload_crc))
    }
}
