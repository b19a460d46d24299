//! A stored block in another codec's form: the one definition of what may be recoded and how,
//! for [`Store::recompress`] (a client asks) and for cleaning (placement asks,
//! `reclaim/clean.rs`).

use kvhoard_format::record::RecordHeader;
use kvhoard_kernels::CodecSpec;

use super::append::{Prepared, SOURCE_CHANGED};
use super::decode::Dropped;
use super::put::replacement;
use super::sample::Sampled;
use super::Store;
use crate::block::Block;
use crate::buffer::PooledBuf;
use crate::codec::{spec_of, Skipped};
use crate::error::{Result, StoreError};
use crate::index::key_fp;
use crate::options::{Durability, ReadOptions};
use crate::parts::Parts;

/// What recoding a block gives.
pub(crate) enum Recoded {
    /// It is already stored in that form.
    Same,
    /// Its new record: the header (complete: codec area, lengths, crc) and the stored bytes.
    New { header: Box<RecordHeader>, stored: PooledBuf },
    /// It was damaged or changed while it was read (a miss from here on).
    Gone,
}

impl Parts {
    /// `frame` (the block `key` of `namespace` names, as stored) in the form `codec` gives it:
    /// from its stored bytes when its codec is lossless, or from its decoded form (quant8 →
    /// quant4 starts from the decoded 8-bit block). The new record keeps the block's name (the
    /// blake3 of its original bytes), description, group, parent and the rest of its TTL.
    ///
    /// Refuses what the namespace's policy denies, a codec that cannot take the block, going from
    /// a lossy form back to a lossless one or raw bytes (the original is no longer held, so they
    /// would not decode to the bytes the block is named for), and blocks whose tokens were
    /// dropped.
    ///
    /// With `by_placement` (cleaning carries out placement's plan, so `codec` is the form
    /// placement chose for the block's context), one lossy recoding in [`super::sample::QUALITY_SAMPLE_EVERY`]
    /// also estimates the quality the new form keeps and tells placement.
    pub(crate) fn recode(
        &self,
        namespace: &str,
        key: &str,
        frame: Block,
        codec: CodecSpec,
        by_placement: bool,
    ) -> Result<Recoded> {
        let target = self.policies.get(namespace).codec_for(namespace, Some(codec))?;
        let meta = frame.meta.clone();
        let current = spec_of(&meta.desc, meta.raw_len, &meta.compression).ok_or_else(|| StoreError::Codec {
            key: key.into(),
            reason: "its codec is unknown to this build".into(),
        })?;
        if current.drops_tokens() {
            return Err(StoreError::invalid(
                "recompress",
                format!("{key:?} was stored with tokens dropped; it cannot be recompressed"),
            ));
        }
        if current.is_lossy() && !target.is_some_and(|t| t.is_lossy()) {
            return Err(StoreError::invalid(
                "recompress",
                format!("{key:?} is stored lossy ({current}); its original bytes are gone, so it cannot be stored losslessly again"),
            ));
        }
        if target == Some(current) || (target.is_none() && meta.compression.is_none()) {
            return Ok(Recoded::Same);
        }
        let opts = ReadOptions { verify_hash: true };
        let Some((decoded, _)) = self.decoded(key, frame, opts, Dropped::Refuse)? else { return Ok(Recoded::Gone) };
        let mut header = replacement(namespace, key, &meta, self.clock.now_unix_ms());
        let compressed = match target {
            None => None,
            Some(spec) => match self.codecs.compress(spec, &meta.desc, &decoded, &self.pool) {
                Ok(c) => {
                    if by_placement && spec.is_lossy() && !current.is_lossy() {
                        let block = Sampled { namespace, key, group: meta.group_id, desc: &meta.desc };
                        self.sample_quality(&block, &decoded, &c, &self.metrics.lossy_recodes);
                    }
                    header.compression = c.meta;
                    Some(c.payload)
                }
                Err(Skipped::NoGain) => None,
                Err(Skipped::NotApplicable(why)) => {
                    return Err(StoreError::invalid("recompress", format!("{spec} cannot take {key:?}: {why}")))
                }
            },
        };
        let stored = match compressed {
            Some(c) => c,
            None if current.is_lossy() => {
                return Err(StoreError::invalid(
                    "recompress",
                    format!("{key:?} would have to be stored raw from a lossy form"),
                ))
            }
            None if meta.compression.is_none() => return Ok(Recoded::Same),
            None => {
                let mut raw = self.pool.get(decoded.len());
                raw.copy_from_slice(&decoded);
                raw
            }
        };
        header.stored_len = stored.len() as u64;
        header.payload_crc = crc32c::crc32c(&stored);
        header.validate()?;
        Ok(Recoded::New { header: Box::new(header), stored })
    }
}

impl Store {
    /// Rewrites the live block under `key` with `codec` (what may be recoded, and how: above).
    /// A reader sees the old form or the new one, whole; the old record becomes dead space.
    /// Returns `false` when the key is missing, or was overwritten or deleted meanwhile (the
    /// newer block is left alone).
    pub fn recompress(&self, namespace: &str, key: &str, codec: CodecSpec, durability: Durability) -> Result<bool> {
        let parts = &self.parts;
        parts.policies.get(namespace).codec_for(namespace, Some(codec))?;
        let kfp = key_fp(namespace, key);
        let content_before = {
            let index = parts.index_read();
            index.key(&kfp).and_then(|k| index.content(k.content)).map(|c| c.fp)
        };
        let Some(before) = content_before else { return Ok(false) };
        let Some(frame) = self.get_frame(namespace, key, ReadOptions::default())? else { return Ok(false) };
        let (header, stored) = match parts.recode(namespace, key, frame, codec, false)? {
            Recoded::Same => return Ok(true),
            Recoded::Gone => return Ok(false),
            Recoded::New { header, stored } => (header, stored),
        };
        let item = Prepared::replacing(*header, &stored, &parts.pool, kfp, before);
        match self.append_all(&mut [item], durability) {
            Ok(end) => {
                if durability == Durability::Synced {
                    parts.log.sync_to(end)?;
                }
                Ok(true)
            }
            Err(StoreError::InvalidArgument { what: "rename", detail }) if detail == SOURCE_CHANGED => Ok(false),
            Err(e) => Err(e),
        }
    }
}
