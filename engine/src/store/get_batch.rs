//! Reading many keys at once: the records of every key not in memory are read with all their
//! device reads in flight together (a round of at most `ROUND_BYTES`), then checked, and decoded
//! on every core when there is decoding to do. One thread keeps the device as busy as fio's
//! queue depth does, instead of one read per thread at a time.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvhoard_format::record::{validate_key, validate_namespace};
use kvhoard_format::UNIT_BYTES;

use super::Store;
use crate::block::{Block, Bytes};
use crate::buffer::PooledBuf;
use crate::error::{Result, StoreError};
use crate::index::{key_fp, ContentEntry};
use crate::options::ReadOptions;

/// Record bytes read in one round at most: a larger batch is read in rounds, so the reads in
/// flight at once stay bounded (the blocks read are all kept until they are returned).
const ROUND_BYTES: usize = 64 << 20;

/// Where one key's record comes from in a round.
enum Source {
    /// Already known: a miss, or the block from the DRAM tier.
    Done(Option<Block>),
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
        let parts = &self.parts;
        parts.metrics.gets.fetch_add(keys.len() as u64, Ordering::Relaxed);
        let entries: Vec<Option<ContentEntry>> =
            keys.iter().map(|k| parts.live_content(&key_fp(namespace, k))).collect();
        let mut frames: Vec<Option<Block>> = Vec::with_capacity(keys.len());
        // Whether the DRAM tier has already said no to the first key of the next round (the one
        // that did not fit the last round): asked again, its miss would count twice.
        let mut first_not_in_dram = false;
        while frames.len() < keys.len() {
            let first = frames.len();
            let mut sources = Vec::new();
            let mut reads: Vec<(PooledBuf, u64)> = Vec::new();
            let mut round = 0usize;
            let skip_dram = std::mem::take(&mut first_not_in_dram);
            for (i, entry) in entries.get(first..).unwrap_or_default().iter().enumerate() {
                let ask_dram = !(i == 0 && skip_dram);
                let source = match entry {
                    None => Source::Done(None),
                    Some(e) => match ask_dram.then(|| parts.dram_hit(e, opts)).flatten() {
                        Some(block) => Source::Done(Some(block)),
                        None => match parts.log.pending_record(&e.record) {
                            Some(buf) => Source::Pending(Bytes::Shared(buf)),
                            None => {
                                let len = e.units as usize * UNIT_BYTES as usize;
                                if round > 0 && round + len > ROUND_BYTES {
                                    first_not_in_dram = true;
                                    break;
                                }
                                round += len;
                                reads.push((parts.pool.get(len), parts.record_offset(e)));
                                Source::Read(reads.len() - 1)
                            }
                        },
                    },
                };
                sources.push(source);
            }
            // Every record of the round arrives when the round's reads are done: that is the
            // load time of each (a pending record's is the time to find it, none to speak of).
            let started = Instant::now();
            {
                let mut all: Vec<(&mut [u8], u64)> = reads.iter_mut().map(|(b, at)| (&mut b[..], *at)).collect();
                parts.log.dev.read_many(&mut all)?;
            }
            let read_time = started.elapsed();
            let mut bufs: Vec<Option<PooledBuf>> = reads.into_iter().map(|(b, _)| Some(b)).collect();
            for (i, source) in sources.into_iter().enumerate() {
                let (Some(key), Some(entry)) = (keys.get(first + i), entries.get(first + i)) else {
                    return Err(StoreError::invalid("get_batch", "a read without a key"));
                };
                let (bytes, load_time) = match source {
                    Source::Done(block) => {
                        frames.push(block);
                        continue;
                    }
                    Source::Pending(bytes) => (bytes, Duration::ZERO),
                    Source::Read(r) => match bufs.get_mut(r).and_then(Option::take) {
                        Some(buf) => (Bytes::Owned(buf), read_time),
                        None => return Err(StoreError::invalid("get_batch", "a read of the batch went missing")),
                    },
                };
                let Some(entry) = entry else { return Err(StoreError::invalid("get_batch", "a read without a key")) };
                let kfp = key_fp(namespace, key);
                let current = || parts.live_content(&kfp).is_some_and(|e| e == *entry);
                frames.push(parts.checked(entry, bytes, load_time, opts, current)?);
            }
        }
        self.decode_all(namespace, keys, frames, opts)
    }

    /// Tells placement of each block found and decodes the blocks: on every core when a codec
    /// stored any of them.
    fn decode_all(
        &self,
        namespace: &str,
        keys: &[&str],
        frames: Vec<Option<Block>>,
        opts: ReadOptions,
    ) -> Result<Vec<Option<Block>>> {
        let parts = &self.parts;
        let decode = |key: &str, frame: Option<Block>| parts.finish_get(namespace, key, frame, opts);
        let coded = frames.iter().flatten().filter(|f| !f.meta.compression.is_none()).count();
        let workers = parts.cores.min(coded);
        if workers < 2 {
            return keys.iter().zip(frames).map(|(k, f)| decode(k, f)).collect();
        }
        let mut work: Vec<(&str, Option<Block>)> = keys.iter().copied().zip(frames).collect();
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
