//! Reading a whole volume read-only, record by record, noting everything that does not check out.
//!
//! Unlike recovery, which stops at the first invalid record of an unsealed segment, this scan
//! looks past damage for intact records of the same segment use (salvage), and reads every
//! payload of sealed segments instead of trusting their summaries.

use kvhoard_format::record::{CompressionMeta, RecordHeader, RecordKind};
use kvhoard_format::superblock::{self, Superblock};
use kvhoard_format::UNIT_BYTES;

use crate::buffer::AlignedBuf;
use crate::device::{BlockDevice, DeviceError};
use crate::log::scan::{check_payload, read_record_at, read_summary};
use crate::recovery::headers::{read_header, HeaderRead};
use crate::recovery::settle::settle;

/// The state of a segment's header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HeaderState {
    /// Free: no header of this volume.
    Free,
    /// In use.
    InUse {
        /// Segment use.
        seq: u64,
        /// When the use began.
        created_unix_ms: u64,
    },
    /// Looks like a kvhoard segment header but does not check out; the engine treats the
    /// segment as free, so whatever it held is lost.
    Damaged(String),
}

/// The state of a segment's summary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SummaryState {
    /// Sealed with a valid summary.
    Sealed,
    /// Never sealed (the volume was not closed cleanly, or this is the open segment).
    Unsealed,
    /// The trailer or summary is damaged; the records were found by scanning.
    Damaged(String),
}

/// One record as found on disk.
#[derive(Debug, Clone)]
pub struct ScannedRecord {
    /// Unit from the segment's start.
    pub unit: u32,
    /// Units it occupies.
    pub units: u32,
    /// Its header (from the record, or from the summary copy when the record's own is damaged).
    pub header: RecordHeader,
    /// What is wrong with it, if anything.
    pub damage: Option<String>,
    /// Found past a damaged region of an unsealed segment (recovery would have cut it off).
    pub salvaged: bool,
}

/// One segment as found on disk.
#[derive(Debug, Clone)]
pub struct SegmentScan {
    /// Segment index.
    pub index: u32,
    /// Its header.
    pub header: HeaderState,
    /// Its summary.
    pub summary: SummaryState,
    /// Records in log order.
    pub records: Vec<ScannedRecord>,
    /// First unit after the last record.
    pub end_unit: u32,
    /// For an unsealed segment: where its valid log ends and why, when a record of this use
    /// (torn or damaged) lies past that point. `None` for a clean end, as a clean close leaves.
    pub torn_tail: Option<(u32, String)>,
    /// The header was damaged and the engine rebuilds it from the segment's records (why).
    pub header_rebuilt: Option<String>,
    /// For a segment without a usable summary: what opening the volume applies and seals it
    /// with (recovery's own reading of it, entries written in place of damaged records
    /// included).
    pub(crate) settled: Option<crate::recovery::settle::Settled>,
}

impl SegmentScan {
    /// Seq of the segment's use, if in use.
    pub fn seq(&self) -> Option<u64> {
        match self.header {
            HeaderState::InUse { seq, .. } => Some(seq),
            _ => None,
        }
    }
}

/// The whole volume as found on disk.
#[derive(Debug, Clone)]
pub struct VolumeScan {
    /// The superblock used.
    pub sb: Superblock,
    /// Damaged superblock copies (0 = A, 1 = B) and why.
    pub superblock_damage: Vec<(u32, String)>,
    /// Every segment.
    pub segments: Vec<SegmentScan>,
    /// Bytes read.
    pub bytes_read: u64,
}

/// Options of a scan.
#[derive(Debug, Clone, Copy, Default)]
pub struct ScanOptions {
    /// Also check blake3 of every uncompressed block against its content hash.
    pub deep: bool,
    /// Trust the summaries of sealed segments instead of reading every record (inspect).
    pub summaries_only: bool,
}

/// Why a volume cannot be scanned at all.
#[derive(Debug, thiserror::Error)]
pub enum ScanError {
    /// Neither superblock copy is valid.
    #[error("no valid superblock: copy A: {a}; copy B: {b}")]
    NoSuperblock {
        /// Why copy A failed.
        a: String,
        /// Why copy B failed.
        b: String,
    },
    /// The device failed outside a record (superblock, segment header).
    #[error(transparent)]
    Device(#[from] DeviceError),
}

/// Reads both superblock copies; returns the first valid one and the damaged ones.
pub fn read_superblocks(dev: &dyn BlockDevice) -> Result<(Superblock, Vec<(u32, String)>), ScanError> {
    let mut valid = Vec::new();
    let mut damaged = Vec::new();
    for (copy, offset) in (0u32..).zip(superblock::COPY_OFFSETS) {
        let mut unit = AlignedBuf::zeroed(UNIT_BYTES as usize);
        let decoded = dev
            .read_at(&mut unit, offset)
            .map_err(|e| e.to_string())
            .and_then(|()| Superblock::decode(&unit).map_err(|e| e.to_string()));
        match decoded {
            Ok(sb) if sb.copy == copy => valid.push(sb),
            Ok(sb) => damaged.push((copy, format!("copy {} found in the place of copy {copy}", sb.copy))),
            Err(e) => damaged.push((copy, e)),
        }
    }
    // Both decode but say different things: a crash between the writes of copy A and copy B
    // (A is written first), so A is the newer.
    if let [a, b] = valid.as_slice() {
        if (Superblock { copy: a.copy, ..b.clone() }) != *a {
            damaged.push((1, "differs from copy A (a crash between their writes): copy A is the newer".into()));
        }
    }
    match valid.into_iter().next() {
        Some(sb) => Ok((sb, damaged)),
        None => {
            let why = |c: u32| damaged.iter().find(|(d, _)| *d == c).map_or_else(String::new, |(_, w)| w.clone());
            Err(ScanError::NoSuperblock { a: why(0), b: why(1) })
        }
    }
}

/// Scans every segment; `progress(done, total)` is called after each segment.
pub fn scan_volume(
    dev: &dyn BlockDevice,
    opts: ScanOptions,
    progress: &dyn Fn(u64, u64),
) -> Result<VolumeScan, ScanError> {
    let (sb, superblock_damage) = read_superblocks(dev)?;
    let mut scan = VolumeScan {
        sb: sb.clone(),
        superblock_damage,
        segments: Vec::with_capacity(sb.segment_count as usize),
        bytes_read: 0,
    };
    for index in 0..sb.segment_count {
        let (segment, bytes) = scan_segment(dev, &sb, index, opts)?;
        scan.segments.push(segment);
        scan.bytes_read += bytes;
        progress(u64::from(index) + 1, u64::from(sb.segment_count));
    }
    Ok(scan)
}

fn scan_segment(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    index: u32,
    opts: ScanOptions,
) -> Result<(SegmentScan, u64), ScanError> {
    let mut seg = SegmentScan {
        index,
        header: HeaderState::Free,
        summary: SummaryState::Unsealed,
        records: Vec::new(),
        end_unit: 1,
        torn_tail: None,
        header_rebuilt: None,
        settled: None,
    };
    if sb.segment_offset(index) + sb.segment_size_bytes > dev.capacity_bytes() {
        seg.header =
            HeaderState::Damaged("the segment lies past the end of the device (the volume file was truncated)".into());
        return Ok((seg, 0));
    }
    let (seq, boot) = match read_header(dev, sb, index)? {
        HeaderRead::Free => return Ok((seg, UNIT_BYTES)),
        HeaderRead::InUse(h) => {
            seg.header = HeaderState::InUse { seq: h.seq, created_unix_ms: h.created_unix_ms };
            (h.seq, h.boot)
        }
        HeaderRead::Rebuilt(h, why) => {
            seg.header = HeaderState::InUse { seq: h.seq, created_unix_ms: h.created_unix_ms };
            seg.header_rebuilt = Some(why);
            (h.seq, h.boot)
        }
        HeaderRead::Unknown(why) => {
            seg.header = HeaderState::Damaged(why);
            return Ok((seg, UNIT_BYTES));
        }
    };
    let mut bytes = UNIT_BYTES;
    match read_summary(dev, sb, index, seq)? {
        Ok((entries, end_unit)) => {
            seg.summary = SummaryState::Sealed;
            seg.end_unit = end_unit;
            let mut window = Window::new(sb.segment_offset(index), sb.segment_units() - 1);
            for e in entries {
                let units = (e.header.record_bytes() / UNIT_BYTES) as u32;
                if opts.summaries_only {
                    seg.records.push(ScannedRecord {
                        unit: e.unit,
                        units,
                        header: e.header,
                        damage: None,
                        salvaged: false,
                    });
                    continue;
                }
                if e.header.recovered || e.header.kind == RecordKind::Lost {
                    // Written by recovery in place of a record it could not trust: the bytes
                    // on disk there are that record, not this entry.
                    seg.records.push(ScannedRecord {
                        unit: e.unit,
                        units,
                        header: e.header,
                        damage: None,
                        salvaged: false,
                    });
                    continue;
                }
                let damage = match window.record(dev, e.unit, units) {
                    Err(err) => Some(format!("unreadable: {err}")),
                    Ok(buf) => match RecordHeader::decode(buf) {
                        Err(err) => Some(format!("record header damaged: {err}")),
                        Ok(h) if h != e.header => Some("record header differs from its copy in the summary".into()),
                        Ok(h) => check_payload(&h, buf).err().or_else(|| deep_check(&h, buf, opts)),
                    },
                };
                seg.records.push(ScannedRecord { unit: e.unit, units, header: e.header, damage, salvaged: false });
            }
            bytes += window.bytes_read;
        }
        Err(why) => {
            if let Some(why) = why {
                seg.summary = SummaryState::Damaged(why);
            }
            bytes += scan_unsealed(dev, sb, &mut seg, seq, opts)?;
            seg.settled = Some(settle(dev, sb, index, seq, boot != 0 && boot == dev.boot())?);
        }
    }
    Ok((seg, bytes))
}

/// Walks an unsealed (or summary-less) segment unit by unit: intact records of this use are
/// kept; a record whose header is intact but whose payload is not is kept as damaged; anything
/// else is a gap. Damage followed by intact records is damage; what follows the last intact
/// record is the torn tail a crash leaves, which recovery cuts off.
fn scan_unsealed(
    dev: &dyn BlockDevice,
    sb: &Superblock,
    seg: &mut SegmentScan,
    seq: u64,
    opts: ScanOptions,
) -> Result<u64, ScanError> {
    let units = sb.segment_units();
    let base = sb.segment_offset(seg.index);
    let mut unit = 1u32;
    let mut bytes = 0;
    // First invalid unit since the last intact record, and why.
    let mut gap: Option<(u32, String)> = None;
    let mut seen_gap = false;
    while unit < units - 1 {
        bytes += UNIT_BYTES;
        match read_record_at(dev, base, unit, units - 1 - unit, Some(seq))? {
            Ok((header, record_units, buf)) => {
                bytes += buf.len() as u64;
                let damage = deep_check(&header, &buf, opts);
                seg.records.push(ScannedRecord { unit, units: record_units, header, damage, salvaged: seen_gap });
                unit += record_units;
                gap = None;
            }
            Err(why) => {
                seen_gap = true;
                gap.get_or_insert((unit, why.clone()));
                let mut first = AlignedBuf::zeroed(UNIT_BYTES as usize);
                dev.read_at(&mut first, base + u64::from(unit) * UNIT_BYTES)?;
                if let Some(rest) = crate::log::probe::pending_of_use(&first, seq, units - 1 - unit) {
                    // A record that never happened: its payload is not read for headers.
                    unit += rest;
                    continue;
                }
                match header_only(dev, base, unit, first, seq)? {
                    Some(h) if unit + ((h.record_bytes() / UNIT_BYTES) as u32).max(1) < units => {
                        let record_units = ((h.record_bytes() / UNIT_BYTES) as u32).max(1);
                        seg.records.push(ScannedRecord {
                            unit,
                            units: record_units,
                            header: h,
                            damage: Some(why),
                            salvaged: true,
                        });
                        unit += record_units;
                    }
                    _ => unit += 1,
                }
            }
        }
    }
    let end = seg.records.iter().rev().find(|r| r.damage.is_none()).map_or(1, |r| r.unit + r.units);
    let torn = seg.records.iter().any(|r| r.unit >= end);
    seg.records.retain(|r| r.unit < end);
    seg.end_unit = end;
    seg.torn_tail = gap.filter(|_| torn).map(|(at, why)| (at.max(end), why));
    Ok(bytes)
}

/// The header of the record at `unit` whose first unit is `first`, if it decodes and names use
/// `seq` (its payload is not read).
fn header_only(
    dev: &dyn BlockDevice,
    base: u64,
    unit: u32,
    first: AlignedBuf,
    seq: u64,
) -> Result<Option<RecordHeader>, ScanError> {
    let Ok(len) = RecordHeader::peek_len(&first) else { return Ok(None) };
    let mut head = first;
    if len as u64 > UNIT_BYTES {
        head = AlignedBuf::zeroed(len);
        dev.read_at(&mut head, base + u64::from(unit) * UNIT_BYTES)?;
    }
    Ok(RecordHeader::decode(&head).ok().filter(|h| h.segment_seq == seq))
}

fn deep_check(h: &RecordHeader, record: &[u8], opts: ScanOptions) -> Option<String> {
    if !opts.deep || h.kind != RecordKind::Block {
        return None;
    }
    let start = h.payload_offset() as usize;
    let payload = record.get(start..start + h.stored_len as usize)?;
    if h.compression.codec_id != CompressionMeta::CODEC_NONE {
        return crate::codec::check_frame(&h.desc, h.raw_len, &h.compression, payload, &h.content_hash).err();
    }
    (blake3::hash(payload).as_bytes() != &h.content_hash)
        .then(|| "blake3 of the bytes does not match the content hash".to_string())
}

/// Reads a segment's records in large sequential windows rather than one request per record.
struct Window {
    base: u64,
    limit_unit: u32,
    start_unit: u32,
    buf: AlignedBuf,
    bytes_read: u64,
}

impl Window {
    const UNITS: u32 = 2048;

    fn new(base: u64, limit_unit: u32) -> Window {
        Window { base, limit_unit, start_unit: 0, buf: AlignedBuf::zeroed(0), bytes_read: 0 }
    }

    /// The bytes of the record at `unit` spanning `units` units.
    fn record(&mut self, dev: &dyn BlockDevice, unit: u32, units: u32) -> Result<&[u8], DeviceError> {
        let loaded_end = self.start_unit as usize + self.buf.len() / UNIT_BYTES as usize;
        if unit < self.start_unit || unit as usize + units as usize > loaded_end {
            let len = units.max(Self::UNITS).min(self.limit_unit.saturating_sub(unit)).max(units);
            self.buf = AlignedBuf::zeroed(len as usize * UNIT_BYTES as usize);
            self.start_unit = unit;
            dev.read_at(&mut self.buf, self.base + u64::from(unit) * UNIT_BYTES)?;
            self.bytes_read += self.buf.len() as u64;
        }
        let from = (unit - self.start_unit) as usize * UNIT_BYTES as usize;
        Ok(self.buf.get(from..from + units as usize * UNIT_BYTES as usize).unwrap_or_default())
    }
}
