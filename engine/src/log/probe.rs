//! Probing places where a segment's records do not check out: which record was there, if
//! anything can still say (its header, or the header's echo at the end of its first unit), and
//! whether any trace of the segment use is left past the last intact record.

use kvhoard_format::record::{echo_of, Pending, RecordHeader, MAGIC};
use kvhoard_format::UNIT_BYTES;

use crate::buffer::AlignedBuf;
use crate::device::{BlockDevice, DeviceError};

/// What a unit of a segment holds, as far as use `seq` is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Found {
    /// The start of a record of this use whose header (or its echo) decodes: it takes `units`.
    Record {
        /// The unit.
        unit: u32,
        /// Units it takes.
        units: u32,
    },
    /// Bytes that began a record header of this use (magic and seq) but do not decode, nor does
    /// an echo: a record was here and nothing says which.
    Trace {
        /// The unit.
        unit: u32,
    },
    /// The [`Pending`] unit of a record of this use that never happened ([`pending_of_use`]):
    /// not evidence of a lost record, but bytes of this use that appends must not go in front of.
    Pending {
        /// The unit.
        unit: u32,
        /// Units it and the rest of its record take.
        units: u32,
    },
}

/// Whether a unit starts with a record header that names segment use `seq`, judged by magic and
/// the seq field alone: a header too damaged to decode still counts.
pub(crate) fn record_of_use(unit: &[u8], seq: u64) -> bool {
    let magic = unit.get(..4) == Some(&MAGIC[..]);
    let field = unit.get(16..24).and_then(|b| b.try_into().ok()).map(u64::from_le_bytes);
    magic && field == Some(seq)
}

/// Units to step over if `unit` is the [`Pending`] unit of a record of use `seq` whose rest was
/// being written when the writer stopped (and that fits in `max_units`): that rest is payload
/// of a record that never happened, not headers to read.
pub(crate) fn pending_of_use(unit: &[u8], seq: u64, max_units: u32) -> Option<u32> {
    Pending::decode(unit).filter(|p| p.segment_seq == seq && p.units >= 1 && p.units <= max_units).map(|p| p.units)
}

/// The record that starts with `unit0` (the unit's bytes; a longer header is read from `dev` at
/// `offset`), if its header or its echo decodes, belongs to use `seq` (any use if `None`) and
/// fits in `max_units`.
pub(crate) fn identify(
    dev: &dyn BlockDevice,
    offset: u64,
    unit0: &[u8],
    seq: Option<u64>,
    max_units: u32,
) -> Result<Option<(RecordHeader, u32)>, DeviceError> {
    let fits = |h: RecordHeader| {
        let units = h.record_bytes() / UNIT_BYTES;
        (seq.is_none_or(|s| s == h.segment_seq) && units >= 1 && units <= u64::from(max_units))
            .then_some((h, units as u32))
    };
    let primary = match RecordHeader::peek_len(unit0) {
        Ok(len) if len as u64 > UNIT_BYTES => {
            let mut head = AlignedBuf::zeroed(len);
            dev.read_at(&mut head, offset)?;
            RecordHeader::decode(&head).ok()
        }
        Ok(_) => RecordHeader::decode(unit0).ok(),
        Err(_) => None,
    };
    if let Some(found) = primary.and_then(fits) {
        return Ok(Some(found));
    }
    Ok(echo_of(unit0).and_then(|echo| RecordHeader::decode(echo).ok()).and_then(fits))
}

/// Every record of use `seq` that can still be identified, and every trace of one that cannot,
/// from `from` up to (not including) `last`, walking unit by unit and skipping over the records
/// it identifies and the pending records' rests ([`pending_of_use`]).
pub(crate) fn look_past(
    dev: &dyn BlockDevice,
    base: u64,
    from: u32,
    last: u32,
    seq: u64,
) -> Result<Vec<Found>, DeviceError> {
    const CHUNK_UNITS: u32 = 256;
    let unit_bytes = UNIT_BYTES as usize;
    let mut found = Vec::new();
    let mut unit = from;
    while unit < last {
        let n = CHUNK_UNITS.min(last - unit);
        let mut buf = AlignedBuf::zeroed(n as usize * unit_bytes);
        dev.read_at(&mut buf, base + u64::from(unit) * UNIT_BYTES)?;
        let chunk_start = unit;
        while unit < chunk_start + n {
            let at = (unit - chunk_start) as usize * unit_bytes;
            let bytes = buf.get(at..at + unit_bytes).unwrap_or_default();
            let offset = base + u64::from(unit) * UNIT_BYTES;
            if let Some(units) = pending_of_use(bytes, seq, last - unit) {
                found.push(Found::Pending { unit, units });
                unit += units;
            } else if let Some((_, units)) = identify(dev, offset, bytes, Some(seq), last - unit)? {
                found.push(Found::Record { unit, units });
                unit += units;
            } else {
                let echo_trace = echo_of(bytes).is_some_and(|e| record_of_use(e, seq));
                if record_of_use(bytes, seq) || echo_trace {
                    found.push(Found::Trace { unit });
                }
                unit += 1;
            }
        }
    }
    Ok(found)
}
