//! The write API: put (single and batched), delete and rename. Each checks everything that can
//! refuse it before anything is written, then appends records (`append.rs`) and submits them
//! (`submit.rs`) at the durability asked for.

use kvhoard_format::record::{validate_key, validate_namespace, RecordHeader, RecordKind};
use kvhoard_format::{BlockDesc, CompressionMeta};

use super::append::{Coding, Prepared, PARALLEL_MIN_BYTES, SOURCE_CHANGED};
use super::Store;
use crate::block::BlockMeta;
use crate::error::{Result, StoreError};
use crate::index::{header_fp, key_fp};
use crate::log::Pos;
use crate::options::{Durability, PutOptions};
use crate::placement::group_ttl::Access;
use crate::placement::{context_of, BlockInfo};
use crate::policy::Policy;
use crate::writer::WriteJob;

impl Store {
    /// Stores `bytes` under `key` in `namespace` and returns their blake3 content hash.
    /// Identical bytes already stored in the namespace are not written again.
    pub fn put(&self, namespace: &str, key: &str, bytes: &[u8], opts: &PutOptions) -> Result<[u8; 32]> {
        let mut hashes = self.put_batch(namespace, &[(key, bytes)], opts)?;
        hashes.pop().ok_or_else(|| StoreError::invalid("batch", "empty result"))
    }

    /// Stores many blocks with one reservation pass and one group commit.
    pub fn put_batch(&self, namespace: &str, items: &[(&str, &[u8])], opts: &PutOptions) -> Result<Vec<[u8; 32]>> {
        validate_namespace(namespace)?;
        let parts = &self.parts;
        parts.clean_if_short()?;
        let now = parts.clock.now_unix_ms();
        let policy = parts.policies.get(namespace);
        // Everything that can refuse a put is checked before any of the batch is written.
        let checked = items
            .iter()
            .map(|(key, bytes)| Ok((self.checked_header(namespace, key, bytes, opts, &policy, now)?, *bytes)))
            .collect::<Result<Vec<_>>>()?;
        // Bytes the caller compressed are stored as given; others with the codec asked for, or
        // placement's for the batch's context where the namespace allows it, or the namespace's.
        let codec = match &opts.compression {
            Some(meta) => {
                policy.allows_frame(namespace, meta)?;
                Coding { spec: None, placed: false }
            }
            // Placement's codec is for one context: a batch with a group, or a single block.
            None if opts.codec.is_none() && (opts.group.is_some() || checked.len() == 1) => {
                let placed = checked.first().and_then(|(header, bytes)| {
                    parts.placement.codec_at_put(&BlockInfo {
                        namespace,
                        raw_bytes: bytes.len() as u64,
                        record_bytes: header.record_bytes(),
                        group: opts.group,
                        context: context_of(opts.group, namespace, &header.key),
                        new_key: true,
                        policy: &policy,
                        codec: None,
                    })
                });
                match placed.map(|spec| policy.codec_for(namespace, Some(spec))) {
                    Some(Ok(spec)) => Coding { spec, placed: true },
                    _ => Coding { spec: policy.codec_for(namespace, None)?, placed: false },
                }
            }
            None => Coding { spec: policy.codec_for(namespace, opts.codec)?, placed: false },
        };
        // A large batch is streamed: prepared (hashed, compressed, checksummed, copied) on every
        // core and handed to the log writer block by block in order, so the device queue fills
        // while the CPUs work; the batch then waits once.
        // (With one core, one worker: the blocks are still prepared while earlier ones are
        // written, and memory stays bounded.)
        let bytes: usize = checked.iter().map(|(_, b)| b.len()).sum();
        let (hashes, last_end) = if checked.len() < 2 || bytes < PARALLEL_MIN_BYTES {
            let mut prepared = self.prepare_here(namespace, checked, codec);
            let hashes = prepared.iter().map(|p| p.header.content_hash).collect();
            (hashes, self.append_all(&mut prepared, Durability::Buffered)?)
        } else {
            let workers = parts.cores.clamp(1, checked.len());
            self.append_streamed(namespace, checked, codec, workers)?
        };
        if opts.durability != Durability::Buffered {
            parts.log.wait_written(last_end)?;
        }
        if opts.durability == Durability::Synced {
            parts.log.sync_to(last_end)?;
        }
        Ok(hashes)
    }

    /// Reserves and submits `items` in log order (several reservations when they span segments),
    /// each reservation waited for as `durability` says; returns the end of the last record.
    pub(super) fn append_all(&self, items: &mut [Prepared<'_>], durability: Durability) -> Result<Pos> {
        let mut last_end = Pos::default();
        let mut rest = items;
        while !rest.is_empty() {
            let (jobs, done) = self.parts.reserve(rest)?;
            rest = rest.get_mut(done..).unwrap_or_default();
            last_end = jobs.iter().map(WriteJob::end).max().unwrap_or(last_end).max(last_end);
            self.submit(jobs, durability)?;
        }
        Ok(last_end)
    }

    /// Deletes `key`; returns whether it existed. The deletion is recorded in the log with the
    /// given durability, so the key does not come back after a restart.
    pub fn delete(&self, namespace: &str, key: &str, durability: Durability) -> Result<bool> {
        validate_namespace(namespace)?;
        validate_key(key)?;
        let parts = &self.parts;
        let kfp = key_fp(namespace, key);
        // The tombstone is written even when the index does not name the key, as log-structured
        // stores do: a record of it may still lie in the log (a key placement or reclaim
        // dropped, in a segment whose freeing is not durable yet, say), and a crash or an open
        // without the checkpoint would bring it back. Only the checkpoint knows which keys have
        // no record left, and a delete must not rest on it.
        let header = tombstone(namespace, key, parts.clock.now_unix_ms());
        let mut one = [Prepared::without_payload(header, kfp, [0; 16], None)];
        let (jobs, _) = parts.reserve(&mut one)?;
        let existed = one.iter().any(|p| p.named);
        let end = jobs.iter().map(WriteJob::end).max();
        self.submit(jobs, durability)?;
        if let (Durability::Synced, Some(end)) = (durability, end) {
            parts.log.sync_to(end)?;
        }
        parts.metrics.deletes.fetch_add(u64::from(existed), std::sync::atomic::Ordering::Relaxed);
        Ok(existed)
    }

    /// Renames `from` to `to` within `namespace` without reading or writing the block's bytes:
    /// a link record gives the block its new name (replacing whatever `to` named), then a
    /// tombstone removes the old one. The block keeps its description, group, parent and the
    /// rest of its TTL. Returns whether `from` existed. If `from` is overwritten or deleted while
    /// this runs, the rename applies to what `from` names afterwards, or reports it missing.
    pub fn rename(&self, namespace: &str, from: &str, to: &str, durability: Durability) -> Result<bool> {
        validate_namespace(namespace)?;
        validate_key(from)?;
        validate_key(to)?;
        if from == to {
            return self.contains(namespace, from);
        }
        for _ in 0..8 {
            match self.try_rename(namespace, from, to, durability) {
                Err(StoreError::InvalidArgument { what: "rename", detail }) if detail == SOURCE_CHANGED => continue,
                other => return other,
            }
        }
        Err(StoreError::invalid("rename", format!("{from:?} kept changing while it was being renamed; try again")))
    }

    fn try_rename(&self, namespace: &str, from: &str, to: &str, durability: Durability) -> Result<bool> {
        let parts = &self.parts;
        let Some(meta) = self.meta(namespace, from)? else {
            return Ok(false);
        };
        let now = parts.clock.now_unix_ms();
        let ttl_secs = remaining_ttl(&meta, now);
        let link = RecordHeader {
            kind: RecordKind::Link,
            segment_seq: 0,
            payload_crc: 0,
            namespace: namespace.to_string(),
            key: to.to_string(),
            content_hash: meta.content_hash,
            raw_len: meta.raw_len,
            stored_len: 0,
            created_unix_ms: now,
            ttl_secs,
            group_id: meta.group_id,
            parent_hash: meta.parent_hash,
            desc: meta.desc,
            compression: meta.compression,
            recovered: false,
        };
        link.validate()?;
        let content = header_fp(&link);
        let from_fp = key_fp(namespace, from);
        let mut items = [
            Prepared::without_payload(link, key_fp(namespace, to), content, Some(from_fp)),
            Prepared::without_payload(tombstone(namespace, from, now), from_fp, [0; 16], None),
        ];
        let last_end = self.append_all(&mut items, durability)?;
        if durability == Durability::Synced {
            parts.log.sync_to(last_end)?;
        }
        Ok(true)
    }

    /// The record header a put of `bytes` under `key` writes (as a block, its content hash not
    /// yet computed), after every check that can refuse the put: key, compression arguments,
    /// description, size.
    fn checked_header(
        &self,
        namespace: &str,
        key: &str,
        bytes: &[u8],
        opts: &PutOptions,
        policy: &Policy,
        now: u64,
    ) -> Result<RecordHeader> {
        validate_key(key)?;
        let compression = opts.compression.clone().unwrap_or_else(CompressionMeta::none);
        let (raw_len, content_hash) = match (&opts.raw, compression.is_none()) {
            (Some(raw), false) => *raw,
            (Some(_), true) => {
                return Err(StoreError::invalid("raw", "raw length and hash are only given for compressed bytes"))
            }
            (None, false) => return Err(StoreError::invalid("raw", "compressed bytes need the raw length and hash")),
            (None, true) => (bytes.len() as u64, [0; 32]),
        };
        let mut header = RecordHeader {
            kind: RecordKind::Block,
            segment_seq: 0,
            payload_crc: 0,
            namespace: namespace.to_string(),
            key: key.to_string(),
            content_hash,
            raw_len,
            stored_len: bytes.len() as u64,
            created_unix_ms: now,
            ttl_secs: opts.ttl_secs.unwrap_or(0),
            group_id: opts.group,
            parent_hash: opts.parent,
            desc: opts.desc.clone().unwrap_or_else(BlockDesc::opaque),
            compression,
            recovered: false,
        };
        header.validate()?;
        let segment_units = self.parts.log.sb.segment_units();
        let max_bytes = crate::log::max_payload_bytes(segment_units, header.encoded_len());
        if header.stored_len > max_bytes {
            return Err(StoreError::BlockTooLarge { bytes: bytes.len() as u64, max_bytes });
        }
        // Where the namespace keeps group TTL, the put is an access, and a put that gives no
        // TTL takes its group's.
        if policy.settings.ttl.is_some() {
            let access = Access {
                at_ms: now,
                block: context_of(None, namespace, key),
                group: context_of(opts.group, namespace, key),
                bytes: raw_len,
            };
            if let Some(ttl) = self.parts.ttls.at_put(namespace, access, opts.ttl_secs.is_some()) {
                header.ttl_secs = ttl;
            }
        }
        Ok(header)
    }
}

/// The TTL a record written at `now` gives a block that keeps `meta`'s expiry: 0 (none) for a
/// block without one; never 0 otherwise (expiring within the second still leaves it a second).
pub(super) fn remaining_ttl(meta: &BlockMeta, now: u64) -> u32 {
    crate::index::remaining_ttl(meta.created_unix_ms, meta.ttl_secs, now)
}

/// The block record that replaces `meta`'s block under `key` with the same name, description,
/// group, parent and expiry; its payload fields (lengths, crc, codec) are the caller's to fill.
pub(super) fn replacement(namespace: &str, key: &str, meta: &BlockMeta, now: u64) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Block,
        segment_seq: 0,
        payload_crc: 0,
        namespace: namespace.to_string(),
        key: key.to_string(),
        content_hash: meta.content_hash,
        raw_len: meta.raw_len,
        stored_len: 0,
        created_unix_ms: now,
        ttl_secs: remaining_ttl(meta, now),
        group_id: meta.group_id,
        parent_hash: meta.parent_hash,
        desc: meta.desc.clone(),
        compression: CompressionMeta::none(),
        recovered: false,
    }
}

/// The tombstone of `key`.
fn tombstone(namespace: &str, key: &str, now: u64) -> RecordHeader {
    RecordHeader {
        kind: RecordKind::Tombstone,
        segment_seq: 0,
        payload_crc: 0,
        namespace: namespace.to_string(),
        key: key.to_string(),
        content_hash: [0; 32],
        raw_len: 0,
        stored_len: 0,
        created_unix_ms: now,
        ttl_secs: 0,
        group_id: None,
        parent_hash: None,
        desc: BlockDesc::opaque(),
        compression: CompressionMeta::none(),
        recovered: false,
    }
}
