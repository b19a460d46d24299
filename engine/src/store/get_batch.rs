//! Reading many keys at once: the records of every key not in memory are read with all their
//! device reads in flight together (a round of at most `ROUND_BYTES`). Each record is checked as
//! soon as its read completes, while the others are still in flight, and one a codec stored is
//! decoded then, on a worker per core: the CPU's work overlaps the device's instead of following
//! it. One thread keeps the device as busy as fio's queue depth does, instead of one read per
//! thread at a time.

use std::sync::atomic::Ordering;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvhoard_format::record::{validate_key, validate_namespace, RecordHeader};
use kvhoard_format::UNIT_BYTES;

use super::decode::Decoding;
use super::direct::{DirectPlan, PayloadSums};
use super::get::verify;
use super::Store;
use crate::block::{Block, BlockMeta, Bytes};
use crate::buffer::PooledBuf;
use crate::error::{Result, StoreError};
use crate::index::{key_fp, ContentEntry};
use crate::options::ReadOptions;
use crate::parts::Parts;

/// Record bytes read in one round at most: a larger batch is read in rounds, so the reads in
/// flight at once stay bounded (the blocks read are all kept until they are returned).
const ROUND_BYTES: usize = 64 << 20;

/// A block a batch found: its stored frame, and the frame's decoding when it was decoded as its
/// read arrived.
struct Found {
    frame: Block,
    decoding: Option<Decoding>,
}

/// What was worked out about one record as soon as its read completed.
struct Arrived {
    /// Its header, checked against the index entry and the payload's crc32c, or why not.
    verdict: std::result::Result<RecordHeader, String>,
    /// Its payload decoded, when a codec stored it.
    decoding: Option<Decoding>,
    /// When its read completed, from the start of the round's reads.
    load_time: Duration,
}

impl Arrived {
    /// Checks `record`, read for `entry`, and decodes its payload if a codec stored it.
    fn of(parts: &Parts, entry: &ContentEntry, record: &[u8], opts: ReadOptions, load_time: Duration) -> Arrived {
        let verdict = verify(record, entry, opts);
        let decoding = match &verdict {
            Ok(h) if !h.compression.is_none() => {
                let start = h.payload_offset() as usize;
                let payload = record.get(start..start + h.stored_len as usize).unwrap_or_default();
                Some(parts.decode_frame(&h.desc, h.raw_len, &h.compression, &h.content_hash, payload, opts))
            }
            _ => None,
        };
        Arrived { verdict, decoding, load_time }
    }
}

/// Where one key's record comes from in a round.
enum Source {
    /// Already known: a miss, or the block from the DRAM tier.
    Done(Option<Block>),
    /// Its record's bytes, to check.
    Record(Record),
}

/// Where the bytes of a key's record are in a round.
enum Record {
    /// Still being written: its pending buffer.
    Pending(Bytes),
    /// The i-th read of the round.
    Read(usize),
}

impl Store {
    /// Gets many keys; a miss is `None` in its place. The records not in memory are read with
    /// all their reads in flight at once, and blocks a codec stored are decoded on every core.
    pub fn get_batch(&self, namespace: &str, keys: &[&str], opts: ReadOptions) -> Result<Vec<Option<Block>>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        keys.iter().try_for_each(|k| validate_key(k))?;
        self.parts.metrics.gets.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let entries: Vec<Option<ContentEntry>> =
            keys.iter().map(|k| self.parts.live_content(&key_fp(namespace, k))).collect();
        let found = self.frames(namespace, keys, &entries, opts)?;
        self.decode_all(namespace, keys, found, opts)
    }

    /// Reads many blocks into the caller's buffers, one for each key, as [`Store::get_into`]
    /// does for one: a miss is `None` in its place. Every large raw block on the log is read
    /// straight into its aligned buffer, all their reads in flight at once; the others (small,
    /// compressed, in memory, or not what the index said) are read as `get_batch` reads them,
    /// all at once too, then decoded or copied into their buffers.
    pub fn get_batch_into(
        &self,
        namespace: &str,
        keys: &[&str],
        bufs: &mut [&mut [u8]],
        opts: ReadOptions,
    ) -> Result<Vec<Option<(BlockMeta, usize)>>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        keys.iter().try_for_each(|k| validate_key(k))?;
        if bufs.len() != keys.len() {
            return Err(StoreError::invalid("get_batch_into", "one buffer is needed for each key"));
        }
        let parts = &self.parts;
        let entries: Vec<Option<ContentEntry>> =
            keys.iter().map(|k| parts.live_content(&key_fp(namespace, k))).collect();
        // A buffer too short for its block fails the call before anything is read or counted,
        // as it fails `get_into`.
        for (entry, buf) in entries.iter().zip(bufs.iter()) {
            if let Some(e) = entry.filter(|e| (buf.len() as u64) < u64::from(e.raw_len)) {
                return Err(StoreError::BufferTooSmall { needed: u64::from(e.raw_len), got: buf.len() as u64 });
            }
        }
        let mut plans: Vec<Option<DirectPlan>> = entries
            .iter()
            .zip(bufs.iter())
            .map(|(entry, buf)| entry.as_ref().and_then(|e| parts.plan_direct(e, buf)))
            .collect();
        // The payload's sums of each key, taken as its payload arrives while the other reads
        // are still in flight: the checks overlap the device's work instead of following it.
        let mut sums: Vec<Option<PayloadSums>> = keys.iter().map(|_| None).collect();
        let started = Instant::now();
        // When the last read came back, before the work on it: the device's time, for placement.
        let mut arrived = Duration::ZERO;
        {
            let mut reads = Vec::new();
            // For each read: its key, and whether it carries the payload's whole units.
            let mut owners: Vec<(usize, bool)> = Vec::new();
            for (i, (plan, buf)) in plans.iter_mut().zip(bufs.iter_mut()).enumerate() {
                if let Some(plan) = plan {
                    let first = reads.len();
                    reads.extend(plan.reads(buf));
                    owners.extend((first..reads.len()).map(|r| (i, r - first == DirectPlan::BODY_READ)));
                }
            }
            let verify = opts.verify_hash;
            parts.log.dev.read_many_each(reads, &mut |r, bytes| {
                arrived = started.elapsed();
                if let Some(&(key, true)) = owners.get(r) {
                    if let Some(slot) = sums.get_mut(key) {
                        *slot = Some(PayloadSums::of(bytes, verify));
                    }
                }
            })?;
        }
        let load_time = started.elapsed();
        let direct: Vec<&ContentEntry> =
            plans.iter().zip(&entries).filter_map(|(plan, e)| plan.as_ref().and(e.as_ref())).collect();
        let bytes = direct.iter().map(|e| e.record_bytes()).sum();
        parts.tiers.speeds.log_read(direct.len() as u64, bytes, arrived);
        let mut got: Vec<Option<(BlockMeta, usize)>> = Vec::with_capacity(keys.len());
        // The keys not read straight into their buffers: (position, key).
        let mut rest: Vec<(usize, &str)> = Vec::new();
        let planned = plans.into_iter().zip(sums).zip(entries).zip(bufs.iter_mut());
        for (i, (((plan, sums), entry), buf)) in planned.enumerate() {
            let key = keys.get(i).copied().unwrap_or_default();
            let direct = match (plan, &entry) {
                (Some(plan), Some(e)) => {
                    let sums = sums.unwrap_or_else(|| PayloadSums::of(plan.body(buf), opts.verify_hash));
                    parts.finish_direct(e, plan, buf, sums, opts, load_time)
                }
                _ => None,
            };
            match direct {
                Some((meta, len)) => {
                    parts.direct_hit(namespace, key, &meta, len);
                    got.push(Some((meta, len)));
                }
                None => {
                    rest.push((i, key));
                    got.push(None);
                }
            }
        }
        if rest.is_empty() {
            return Ok(got);
        }
        // Looked up again, as `get_into` does: a direct read that found something else may have
        // raced with reclaim moving the record.
        let rest_keys: Vec<&str> = rest.iter().map(|(_, k)| *k).collect();
        let rest_entries: Vec<Option<ContentEntry>> =
            rest_keys.iter().map(|k| parts.live_content(&key_fp(namespace, k))).collect();
        // A compressed block is decoded on a worker as its read arrives, then copied into its
        // buffer: a copy costs far less than decoding on this thread after every read. The keys
        // go in slices of at most `ROUND_BYTES` of blocks, each copied out before the next is
        // read, so that the decoded copies held at once stay bounded however large the batch.
        let mut start = 0;
        while start < rest.len() {
            let mut bytes = 0usize;
            let take = rest_entries
                .get(start..)
                .unwrap_or_default()
                .iter()
                .take_while(|e| {
                    let before = bytes;
                    bytes += e.map_or(0, |e| e.raw_len as usize);
                    before == 0 || bytes <= ROUND_BYTES
                })
                .count()
                .max(1);
            let end = (start + take).min(rest.len());
            let (Some(keys), Some(entries), Some(slice)) =
                (rest_keys.get(start..end), rest_entries.get(start..end), rest.get(start..end))
            else {
                return Err(StoreError::invalid("get_batch_into", "a slice of the batch out of range"));
            };
            let found = self.frames(namespace, keys, entries, opts)?;
            for (&(i, key), found) in slice.iter().zip(found) {
                let (frame, decoding) = found.map_or((None, None), |f| (Some(f.frame), f.decoding));
                if let Some(frame) = &frame {
                    parts.hit(namespace, key, &frame.meta);
                }
                let (Some(buf), Some(slot)) = (bufs.get_mut(i), got.get_mut(i)) else {
                    return Err(StoreError::invalid("get_batch_into", "a key without its buffer"));
                };
                *slot = self.frame_into(key, frame, decoding, buf, opts)?;
            }
            start = end;
        }
        Ok(got)
    }

    /// The stored frames of `keys` (whose index entries are `entries`), checked: from the DRAM
    /// tier or a pending buffer when there, else read from the log with every read in flight at
    /// once, in rounds of at most `ROUND_BYTES`. Each frame a codec stored that is read from the
    /// log is decoded as soon as its read completes.
    fn frames(
        &self,
        namespace: &str,
        keys: &[&str],
        entries: &[Option<ContentEntry>],
        opts: ReadOptions,
    ) -> Result<Vec<Option<Found>>> {
        let parts = &self.parts;
        let mut frames: Vec<Option<Found>> = Vec::with_capacity(keys.len());
        // Whether the DRAM tier has already said no to the first key of the next round (the one
        // that did not fit the last round): asked again, its miss would count twice.
        let mut first_not_in_dram = false;
        while frames.len() < keys.len() {
            let first = frames.len();
            let mut sources = Vec::new();
            // Each read's buffer and device offset, and the index entry it is read for.
            let mut reads: Vec<(PooledBuf, u64)> = Vec::new();
            let mut entries_read: Vec<ContentEntry> = Vec::new();
            let mut round = 0usize;
            let skip_dram = std::mem::take(&mut first_not_in_dram);
            for (i, entry) in entries.get(first..).unwrap_or_default().iter().enumerate() {
                let ask_dram = !(i == 0 && skip_dram);
                let source = match entry {
                    None => Source::Done(None),
                    Some(e) => match ask_dram.then(|| parts.dram_hit(e, opts)).flatten() {
                        Some(block) => Source::Done(Some(block)),
                        None => match parts.log.pending_record(&e.record) {
                            Some(buf) => Source::Record(Record::Pending(Bytes::Shared(buf))),
                            None => {
                                let len = e.units as usize * UNIT_BYTES as usize;
                                if round > 0 && round + len > ROUND_BYTES {
                                    first_not_in_dram = true;
                                    break;
                                }
                                round += len;
                                reads.push((parts.pool.get(len), parts.record_offset(e)));
                                entries_read.push(*e);
                                Source::Record(Record::Read(reads.len() - 1))
                            }
                        },
                    },
                };
                sources.push(source);
            }
            let mut arrived: Vec<Option<Arrived>> = {
                let all: Vec<(&mut [u8], u64)> = reads.iter_mut().map(|(b, at)| (&mut b[..], *at)).collect();
                parts.read_arriving(all, &entries_read, opts)?
            };
            let mut bufs: Vec<Option<PooledBuf>> = reads.into_iter().map(|(b, _)| Some(b)).collect();
            for (i, source) in sources.into_iter().enumerate() {
                let (Some(key), Some(entry)) = (keys.get(first + i), entries.get(first + i)) else {
                    return Err(StoreError::invalid("get_batch", "a read without a key"));
                };
                let found = |frame: Option<Block>, decoding| frame.map(|frame| Found { frame, decoding });
                let record = match source {
                    Source::Done(block) => {
                        frames.push(found(block, None));
                        continue;
                    }
                    Source::Record(record) => record,
                };
                let Some(entry) = entry else { return Err(StoreError::invalid("get_batch", "a read without a key")) };
                let kfp = key_fp(namespace, key);
                let current = || parts.live_content(&kfp).is_some_and(|e| e == *entry);
                match record {
                    // A pending record's load time is the time to find it, none to speak of.
                    Record::Pending(bytes) => {
                        frames.push(found(parts.checked(entry, bytes, Duration::ZERO, opts, current)?, None));
                    }
                    Record::Read(r) => {
                        let (Some(buf), Some(a)) =
                            (bufs.get_mut(r).and_then(Option::take), arrived.get_mut(r).and_then(Option::take))
                        else {
                            return Err(StoreError::invalid("get_batch", "a read of the batch went missing"));
                        };
                        let frame = parts.checked_as(entry, Bytes::Owned(buf), a.verdict, a.load_time, current)?;
                        frames.push(found(frame, a.decoding));
                    }
                }
            }
        }
        Ok(frames)
    }

    /// Tells placement of each block found and decodes the blocks not decoded yet (from the
    /// DRAM tier or pending): on every core when there are several.
    fn decode_all(
        &self,
        namespace: &str,
        keys: &[&str],
        found: Vec<Option<Found>>,
        opts: ReadOptions,
    ) -> Result<Vec<Option<Block>>> {
        let parts = &self.parts;
        let decode = |key: &str, found: Option<Found>| {
            let (frame, decoding) = found.map_or((None, None), |f| (Some(f.frame), f.decoding));
            parts.finish_get_decoded(namespace, key, frame, decoding, opts)
        };
        let coded =
            found.iter().flatten().filter(|f| f.decoding.is_none() && !f.frame.meta.compression.is_none()).count();
        let workers = parts.cores.min(coded);
        if workers < 2 {
            return keys.iter().zip(found).map(|(k, f)| decode(k, f)).collect();
        }
        let mut work: Vec<(&str, Option<Found>)> = keys.iter().copied().zip(found).collect();
        let per = work.len().div_ceil(workers);
        let mut chunks = Vec::with_capacity(workers);
        while !work.is_empty() {
            let tail = work.split_off(per.min(work.len()));
            chunks.push(std::mem::replace(&mut work, tail));
        }
        let decoded: Vec<Result<Vec<Option<Block>>>> = std::thread::scope(|s| {
            let handles: Vec<_> = chunks
                .into_iter()
                .map(|chunk| s.spawn(move || chunk.into_iter().map(|(k, f)| decode(k, f)).collect()))
                .collect();
            handles
                .into_iter()
                .map(|h| {
                    h.join().unwrap_or_else(|_| Err(StoreError::invalid("get_batch", "a decoding thread panicked")))
                })
                .collect()
        });
        let mut out = Vec::with_capacity(keys.len());
        for chunk in decoded {
            out.extend(chunk?);
        }
        Ok(out)
    }
}

impl Parts {
    /// Reads `reads` (buffer, device offset), the records of `entries`, all in flight at once,
    /// and works out each one's [`Arrived`] as soon as its read completes, while the others are
    /// still in flight: raw records are checked on this thread between refills of the device's
    /// queue; records a codec stored go to a worker per core (at most one
    /// per such record), which checks and decodes them.
    fn read_arriving(
        &self,
        reads: Vec<(&mut [u8], u64)>,
        entries: &[ContentEntry],
        opts: ReadOptions,
    ) -> Result<Vec<Option<Arrived>>> {
        let mut arrived: Vec<Option<Arrived>> = entries.iter().map(|_| None).collect();
        let started = Instant::now();
        let coded = |r: usize| entries.get(r).is_some_and(|e| e.codec != 0);
        let workers = self.cores.min((0..entries.len()).filter(|&r| coded(r)).count());
        let here = |arrived: &mut Vec<Option<Arrived>>, r: usize, bytes: &[u8], t: Duration| {
            if let (Some(slot), Some(entry)) = (arrived.get_mut(r), entries.get(r)) {
                *slot = Some(Arrived::of(self, entry, bytes, opts, t));
            }
        };
        // The reads' time for placement: until the last one came back, before the work on it
        // (checks and hand-overs on this thread are not the device's time).
        let counted = |took: Duration| {
            let bytes = entries.iter().map(ContentEntry::record_bytes).sum();
            self.tiers.speeds.log_read(entries.len() as u64, bytes, took);
        };
        let mut last = Duration::ZERO;
        if workers == 0 {
            self.log.dev.read_many_each(reads, &mut |r, bytes| {
                last = started.elapsed();
                here(&mut arrived, r, bytes, last);
            })?;
            counted(last);
            return Ok(arrived);
        }
        let (tx, rx) = std::sync::mpsc::channel::<(usize, &mut [u8], Duration)>();
        // Each worker takes the next record from the queue; the one waiting holds the lock.
        let rx = Mutex::new(rx);
        std::thread::scope(|s| {
            let handles: Vec<_> = (0..workers)
                .map(|_| {
                    let rx = &rx;
                    s.spawn(move || {
                        let mut done = Vec::new();
                        loop {
                            // A statement of its own, so that the lock is released before the
                            // work (a `while let` would hold it through the loop's body, and the
                            // workers would take turns).
                            let next = rx.lock().unwrap_or_else(|e| e.into_inner()).recv();
                            let Ok((r, bytes, t)) = next else { break };
                            if let Some(entry) = entries.get(r) {
                                done.push((r, Arrived::of(self, entry, bytes, opts, t)));
                            }
                        }
                        done
                    })
                })
                .collect();
            let read = self.log.dev.read_many_each(reads, &mut |r, bytes| {
                let t = started.elapsed();
                last = t;
                if coded(r) {
                    // Cannot fail: the receiver lives until the scope ends. A record that a
                    // worker which panicked never took is reported by the joins below.
                    let _ = tx.send((r, bytes, t));
                } else {
                    here(&mut arrived, r, bytes, t);
                }
            });
            if read.is_ok() {
                counted(last);
            }
            drop(tx);
            // Every worker joined before any error is returned: one left unjoined after a panic
            // would make the scope panic.
            let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
            for done in joined {
                let done = done.map_err(|_| StoreError::invalid("get_batch", "a decoding thread panicked"))?;
                for (r, a) in done {
                    if let Some(slot) = arrived.get_mut(r) {
                        *slot = Some(a);
                    }
                }
            }
            read?;
            Ok(arrived)
        })
    }
}
