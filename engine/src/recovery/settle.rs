//! What recovery makes of a segment without a usable summary: its records up to where they stop
//! checking out, and what must be done about what lies beyond.
//!
//! The rule (docs/format.md, "Damage"): damage may turn keys into misses, never into an older
//! version or a deleted key brought back. A record that does not check out may have been the
//! newest version or the deletion of its key; if recovery simply stopped there, the key would
//! fall back to whatever came before.
//!
//! How much recovery may trust depends on how the writer stopped. A record whose write a crash
//! of the process could cut short (one split over several writes, and on a device of buffered
//! writes any of more than one unit) gets its first unit (header and echo) only once the rest
//! is on the device (`writer/thread.rs`), and a record is acknowledged only after every record
//! before it was written. So after a crash of the process (the machine's boot unchanged since
//! the segment began, [`crate::device::BlockDevice::boot`]) every record of the segment up to
//! the last one written is whole, a record the crash cut short left no header (a hole), and a
//! record that does not check out is damage. After a power loss, writes since the last sync may be torn or
//! missing, the durability contract lets keys fall back to what was synced, and a record that
//! does not check out is taken for the torn tail (as every log does; telling a torn write from
//! damage there would take a durable mark of the last sync).
//!
//! So, trusting the writer (a process crash), a record whose header or echo still names its key
//! becomes a tombstone for that key, written into the summary in its place (`recovered`), and
//! the scan goes on after it. Where a record of this use was but nothing names it (its header
//! and echo both damaged, their magic and seq still there), a `Lost` entry voids every key whose
//! newest record comes before it. A hole with no trace of this use is a write that never
//! happened (a failed write leaves one, and so does a write the crash cut short, which leaves
//! nothing or a pending unit, [`kvhoard_format::record::Pending`], whose record's rest is
//! stepped over, not read for headers; acknowledgements are in log order, so nothing after it
//! was acknowledged), and what follows it is dropped like a torn tail. A seal whose trailer is
//! missing is recognised by its summary's first entry, so that its entries, which are headers
//! of this use, are not read as traces either: the lost entry it carries past the records, if
//! any, is kept, what lies past it is looked at as past any other end, and the segment is sealed
//! again where it was. A record destroyed so
//! thoroughly that no trace is left cannot be told from such a hole. The segment is sealed after
//! the evidence, so a crash during recovery finds it again.

use kvhoard_format::record::{RecordHeader, RecordKind};
use kvhoard_format::summary::{self, SummaryEntry};
use kvhoard_format::superblock::Superblock;
use kvhoard_format::{BlockDesc, CompressionMeta, UNIT_BYTES};

use crate::device::{BlockDevice, DeviceError};
use crate::log::probe::{identify, look_past, Found};
use crate::log::scan::read_record_at;

/// A segment without a summary, as recovery settles it.
#[derive(Debug, Clone)]
pub(crate) struct Settled {
    /// What to apply and seal the segment with, in unit order: its intact records, and the
    /// entries recovery wrote in place of records it could not trust (marked `recovered`).
    pub entries: Vec<SummaryEntry>,
    /// First unit after the last intact record.
    pub chain_end: u32,
    /// Where the summary goes if the segment is sealed: after the last evidence recovery found
    /// past damage, so that sealing never overwrites it (or at `chain_end` if it would not fit).
    pub seal_unit: u32,
    /// Nothing of this use lies past `chain_end`: appends may continue there.
    pub clean_end: bool,
    /// Why the records stopped before the end of the segment, if they did.
    pub stop: Option<String>,
    /// Entries written in place of records (tombstones and lost markers).
    pub discarded: u64,
    /// A seal had begun at `chain_end` (its summary is there, its trailer is not): the segment
    /// is sealed again there.
    pub seal_begun: bool,
}

/// A seal whose summary reached the device and whose trailer did not (a crash between the two
/// writes, or one that cut the summary's write short), found at the end of the records.
struct BegunSeal {
    /// First unit after the summary's entries that still decode.
    end_unit: u32,
    /// The lost entry it carries past the end of the records, placed by a recovery's seal where
    /// a record nothing names was. Evidence to keep.
    carried: Option<SummaryEntry>,
}

/// Bytes of summary read beyond what the records' entries take: the lost entry a recovery's
/// seal carries past them, with room to spare (entries of bytes that are not its own are read
/// and ignored).
const CARRIED_SLACK_BYTES: usize = 64 << 10;

/// The seal begun at `chain_end`, if the bytes there are a summary of use `seq` whose first
/// entry is the segment's first record (`entries[0]`: the same unit, use, namespace and key; its
/// kind may differ, where recovery wrote a tombstone in its place). Record bytes cannot pass for
/// one: a record starts with its header's magic, an entry with a unit number.
fn begun_seal(
    dev: &dyn BlockDevice,
    base: u64,
    chain_end: u32,
    last: u32,
    seq: u64,
    entries: &[SummaryEntry],
) -> Result<Option<BegunSeal>, DeviceError> {
    let Some(first) = entries.first() else { return Ok(None) };
    let expected: usize = entries.iter().map(|e| summary::entry_bytes(e.header.encoded_len())).sum();
    let units = crate::log::units_for(expected + CARRIED_SLACK_BYTES).min(u64::from(last - chain_end));
    let mut buf = crate::AlignedBuf::zeroed((units * UNIT_BYTES) as usize);
    dev.read_at(&mut buf, base + u64::from(chain_end) * UNIT_BYTES)?;
    let mut decoded = summary::decode_prefix(&buf).into_iter().take_while(|(e, _)| e.header.segment_seq == seq);
    let Some((head, mut end)) = decoded.next() else { return Ok(None) };
    let same = |a: &RecordHeader, b: &RecordHeader| a.namespace == b.namespace && a.key == b.key;
    if head.unit != first.unit || !same(&head.header, &first.header) {
        return Ok(None);
    }
    // Recovery places only lost entries past the records: anything else there is not its own
    // (bytes that happen to decode, or were made to) and is not replayed. One lost entry voids
    // what any later one would, so the first is kept.
    let mut carried = None;
    for (e, at) in decoded {
        end = at;
        if (chain_end..last).contains(&e.unit) && e.header.kind == RecordKind::Lost && carried.is_none() {
            carried = Some(SummaryEntry { unit: e.unit, header: lost(seq) });
        }
    }
    let end_unit = chain_end + crate::log::units_for(end) as u32;
    Ok(Some(BegunSeal { end_unit, carried }))
}

/// Settles segment `index` (use `seq`) from its records. `trust_writes`: the writer stopped
/// with the machine running (see the module comment).
pub(crate) fn settle(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    seq: u64,
    trust_writes: bool,
) -> Result<Settled, DeviceError> {
    let last = sb.segment_units() - 1;
    let base = sb.segment_offset(index);
    let mut entries = Vec::new();
    let mut discarded = 0;
    let mut unit = 1;
    let mut stop = None;
    while unit < last {
        match read_record_at(dev, base, unit, last - unit, Some(seq))? {
            Ok((header, units, _)) => {
                entries.push(SummaryEntry { unit, header });
                unit += units;
            }
            Err(why) => {
                if trust_writes {
                    let mut first = crate::AlignedBuf::zeroed(UNIT_BYTES as usize);
                    let offset = base + u64::from(unit) * UNIT_BYTES;
                    dev.read_at(&mut first, offset)?;
                    if let Some((header, units)) = identify(dev, offset, &first, Some(seq), last - unit)? {
                        tracing::error!(segment = index, unit, key = %header.key, reason = %why, "record is damaged; its key becomes a miss");
                        entries.push(SummaryEntry { unit, header: in_place_of(&header) });
                        discarded += 1;
                        unit += units;
                        continue;
                    }
                }
                stop = Some(why);
                break;
            }
        }
    }
    let chain_end = unit;
    let mut settled =
        Settled { entries, chain_end, seal_unit: chain_end, clean_end: true, stop, discarded, seal_begun: false };
    if settled.stop.is_none() {
        return Ok(settled);
    }
    // A seal begun at the end of the records: its entries are record headers of this use, and
    // walked as units one that begins a unit and names a record longer than what is left would
    // read as a trace of a record nothing names. What it carried past the records is kept, and
    // what lies past it is looked at as past any other end. It is sealed again where it was.
    let begun = begun_seal(dev, base, chain_end, last, seq, &settled.entries)?;
    let past = look_past(dev, base, begun.as_ref().map_or(chain_end, |b| b.end_unit), last, seq)?;
    if past.is_empty() && begun.is_none() {
        // A clean end: what follows was never written in this use.
        return Ok(settled);
    }
    settled.clean_end = false;
    if let Some(begun) = &begun {
        settled.stop = Some("sealed, but the seal's trailer is missing".into());
        settled.seal_begun = true;
        // Every entry so far is a record's, before `chain_end`; the carried one is past it.
        if let Some(e) = &begun.carried {
            settled.entries.push(e.clone());
            settled.discarded += 1;
        }
    }
    if !trust_writes {
        // A torn tail after a power loss: the records past it were never acknowledged as synced.
        return Ok(settled);
    }
    // A trace of a record nothing names (every copy of its header damaged): it may have been
    // the newest version or the deletion of any key written before it.
    let Some(lost_at) = past.iter().find_map(|f| match f {
        Found::Trace { unit } => Some(*unit),
        Found::Record { .. } | Found::Pending { .. } => None,
    }) else {
        // Only intact records and records that never happened past a hole: the hole is a
        // write that never happened (a failed write leaves one, and a write the crash cut
        // short a pending unit or nothing), so nothing after it was acknowledged; they are
        // dropped as a torn tail is.
        return Ok(settled);
    };
    tracing::error!(
        segment = index,
        unit = lost_at,
        "a damaged record names no key; every key written before it becomes a miss"
    );
    if settled.entries.iter().all(|x| x.unit != lost_at) {
        settled.entries.push(SummaryEntry { unit: lost_at, header: lost(seq) });
        settled.discarded += 1;
    }
    let evidence_end = lost_at + 1;
    settled.entries.sort_by_key(|e| e.unit);
    // Seal after the evidence if the summary fits there, so that a crash while sealing finds it
    // again; otherwise at the end of the intact records (the summary then carries the evidence,
    // and a crash before its trailer leaves a begun seal that carries it).
    let summary_bytes: usize = settled.entries.iter().map(|e| summary::entry_bytes(e.header.encoded_len())).sum();
    if begun.is_none() && u64::from(evidence_end) + crate::log::units_for(summary_bytes) < u64::from(last) {
        settled.seal_unit = evidence_end;
    }
    Ok(settled)
}

/// The tombstone recovery writes into a summary in place of the record `h`, which it could not
/// trust: its key becomes a miss.
pub(crate) fn in_place_of(h: &RecordHeader) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Tombstone,
        segment_seq: h.segment_seq,
        payload_crc: 0,
        namespace: h.namespace.clone(),
        key: h.key.clone(),
        content_hash: [0; 32],
        raw_len: 0,
        stored_len: 0,
        created_unix_ms: h.created_unix_ms,
        ttl_secs: 0,
        group_id: None,
        parent_hash: None,
        desc: BlockDesc::opaque(),
        compression: CompressionMeta::none(),
        recovered: true,
    }
}

/// The entry recovery writes where a record of use `seq` was lost without a trace of its key.
pub(crate) fn lost(seq: u64) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Lost,
        segment_seq: seq,
        payload_crc: 0,
        namespace: String::new(),
        key: String::new(),
        content_hash: [0; 32],
        raw_len: 0,
        stored_len: 0,
        created_unix_ms: 0,
        ttl_secs: 0,
        group_id: None,
        parent_hash: None,
        desc: BlockDesc::opaque(),
        compression: CompressionMeta::none(),
        recovered: true,
    }
}
