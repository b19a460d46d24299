//! What a read returns of a compressed block, per client: `get` and `get_into` the decoded block
//! (bit-exact for lossless codecs, the full original shape for quantized ones, never a block
//! with dropped tokens), `get_kv` a decoded block with the positions of the tokens it kept,
//! `get_frame` the stored form untouched, for a client (or a GPU) that decodes itself.
//! (`recompress`, which rewrites a live block under another codec, is in `recode.rs`.)

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use kvhoard_format::record::{validate_key, validate_namespace};
use kvhoard_format::{BlockDesc, CompressionMeta};
use kvhoard_kernels::Positions;

use super::Store;
use crate::block::{Block, BlockMeta, Bytes};
use crate::codec::{spec_of, Codecs, DecodedBlock};
use crate::error::{Result, StoreError};
use crate::index::key_fp;
use crate::options::ReadOptions;
use crate::parts::Parts;

/// A compressed frame decoded ([`Parts::decode_frame`]), not yet judged.
pub(super) struct Decoding {
    /// What the codec gave.
    result: std::result::Result<DecodedBlock, kvhoard_kernels::Error>,
    /// False when `verify_hash` asked and a lossless decoding does not match the block's name.
    name_matches: bool,
}

/// Whether a read may return a block whose tokens were dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dropped {
    /// Refuse it ([`StoreError::TokensDropped`]).
    Refuse,
    /// Return it with its kept positions.
    Allow,
}

impl Store {
    /// The block under `key` decoded, with the positions of the original tokens it holds (all of
    /// them unless its codec dropped tokens), or `None` on a miss.
    pub fn get_kv(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Option<(Block, Positions)>> {
        let Some(frame) = self.get_frame(namespace, key, opts)? else { return Ok(None) };
        self.parts.decoded(key, frame, opts, Dropped::Allow)
    }

    /// The block under `key` as stored: the codec's output and the record's description of it
    /// (`meta.compression` holds the codec and its parameters), for a client that decodes
    /// itself. Checked against its crc32c like every read.
    pub fn get_frame(&self, namespace: &str, key: &str, opts: ReadOptions) -> Result<Option<Block>> {
        self.parts.ensure_open()?;
        validate_namespace(namespace)?;
        validate_key(key)?;
        let parts = &self.parts;
        let kfp = key_fp(namespace, key);
        let lookup = || parts.live_content(&kfp);
        let Some(entry) = lookup() else { return Ok(None) };
        // verify_hash checks the stored bytes of a raw block; a compressed one's name is that of
        // its decoded bytes, checked when it is decoded.
        let frame = parts.read_content(&entry, opts, || lookup().is_some_and(|e| e == entry))?;
        if let Some(frame) = &frame {
            parts.hit(namespace, key, &frame.meta);
        }
        Ok(frame)
    }
}

impl Store {
    /// `get_into` of a compressed block: decoded straight into the caller's buffer.
    pub(super) fn decode_into(
        &self,
        key: &str,
        frame: Block,
        buf: &mut [u8],
        opts: ReadOptions,
    ) -> Result<Option<(BlockMeta, usize)>> {
        let parts = &self.parts;
        parts.metrics.gets.fetch_add(1, Ordering::Relaxed);
        let meta = &frame.meta;
        let needed = match Codecs::decoded_len(&meta.desc, meta.raw_len, &meta.compression) {
            Ok(n) => n,
            Err(_) => {
                // Let decoded() tell an unknown codec from damage, and count it.
                let got = parts.decoded(key, frame, opts, Dropped::Refuse)?;
                debug_assert!(got.is_none());
                parts.metrics.count_get(None);
                return Ok(None);
            }
        };
        let got = buf.len() as u64;
        let out = buf.get_mut(..needed).ok_or(StoreError::BufferTooSmall { needed: needed as u64, got })?;
        let started = Instant::now();
        let decoded = parts.codecs.decode_into(&meta.desc, meta.raw_len, &meta.compression, &frame, out);
        parts.decode_took(&meta.desc, meta.raw_len, &meta.compression, started.elapsed());
        match decoded {
            Ok((len, positions, lossless)) => {
                if !matches!(positions, Positions::All) {
                    let codec = spec_of(&meta.desc, meta.raw_len, &meta.compression)
                        .map_or_else(|| "unknown".into(), |s| s.to_string());
                    return Err(StoreError::TokensDropped { key: key.to_string(), codec });
                }
                let data = out.get(..len).unwrap_or_default();
                if opts.verify_hash && lossless && blake3::hash(data).as_bytes() != &meta.content_hash {
                    parts.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(key, "decoded block does not match its blake3 name; returning a miss");
                    parts.metrics.count_get(None);
                    return Ok(None);
                }
                parts.metrics.decoded.fetch_add(1, Ordering::Relaxed);
                parts.metrics.count_get(Some(len as u64));
                Ok(Some((frame.meta.clone(), len)))
            }
            Err(kvhoard_kernels::Error::Unsupported(reason)) => Err(StoreError::Codec { key: key.to_string(), reason }),
            Err(e) => {
                parts.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(key, error = %e, "stored block does not decode; returning a miss");
                parts.metrics.count_get(None);
                Ok(None)
            }
        }
    }
}

impl Parts {
    /// Decodes a block read in its stored form (a raw block is returned as it is). A frame that
    /// does not decode is damage: logged, counted, and a miss.
    pub(super) fn decoded(
        &self,
        key: &str,
        frame: Block,
        opts: ReadOptions,
        dropped: Dropped,
    ) -> Result<Option<(Block, Positions)>> {
        let meta = &frame.meta;
        if meta.compression.is_none() {
            return Ok(Some((frame, Positions::All)));
        }
        let decoding = self.decode_frame(&meta.desc, meta.raw_len, &meta.compression, &meta.content_hash, &frame, opts);
        self.decoded_as(key, frame, dropped, decoding)
    }

    /// `decoded`, with the frame's decoding when a batch already did it (`decode_frame`).
    pub(super) fn decoded_given(
        &self,
        key: &str,
        frame: Block,
        decoding: Option<Decoding>,
        opts: ReadOptions,
        dropped: Dropped,
    ) -> Result<Option<(Block, Positions)>> {
        match decoding {
            Some(decoding) if !frame.meta.compression.is_none() => self.decoded_as(key, frame, dropped, decoding),
            _ => self.decoded(key, frame, opts, dropped),
        }
    }

    /// Decodes a compressed frame's payload and, with `verify_hash`, checks a lossless one
    /// against its blake3 name: the CPU's work of a get, which needs nothing but the bytes, so
    /// that a batch can do it on another thread as each read arrives.
    pub(super) fn decode_frame(
        &self,
        desc: &BlockDesc,
        raw_len: u64,
        compression: &CompressionMeta,
        content_hash: &[u8; 32],
        payload: &[u8],
        opts: ReadOptions,
    ) -> Decoding {
        let started = Instant::now();
        let result = self.codecs.decode(desc, raw_len, compression, payload, &self.pool);
        self.decode_took(desc, raw_len, compression, started.elapsed());
        let name_matches = match &result {
            Ok(d) if opts.verify_hash && d.lossless => blake3::hash(&d.bytes).as_bytes() == content_hash,
            _ => true,
        };
        Decoding { result, name_matches }
    }

    /// Counts a get's decoding of a block stored as `compression` says, for placement.
    fn decode_took(&self, desc: &BlockDesc, raw_len: u64, compression: &CompressionMeta, took: Duration) {
        if let Some(spec) = spec_of(desc, raw_len, compression) {
            self.tiers.speeds.decoded(spec, raw_len, took);
        }
    }

    /// `decoded` of a compressed frame whose decoding was already done (`decode_frame`).
    pub(super) fn decoded_as(
        &self,
        key: &str,
        frame: Block,
        dropped: Dropped,
        decoding: Decoding,
    ) -> Result<Option<(Block, Positions)>> {
        let meta = &frame.meta;
        let d = match decoding.result {
            Ok(d) => d,
            Err(kvhoard_kernels::Error::Unsupported(reason)) => {
                return Err(StoreError::Codec { key: key.to_string(), reason });
            }
            Err(e) => {
                self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
                tracing::error!(key, error = %e, "stored block does not decode; returning a miss");
                return Ok(None);
            }
        };
        if !matches!(d.positions, Positions::All) && dropped == Dropped::Refuse {
            let codec = spec_of(&meta.desc, meta.raw_len, &meta.compression)
                .map_or_else(|| "unknown".into(), |s| s.to_string());
            return Err(StoreError::TokensDropped { key: key.to_string(), codec });
        }
        if !decoding.name_matches {
            self.metrics.read_errors.fetch_add(1, Ordering::Relaxed);
            tracing::error!(key, "decoded block does not match its blake3 name; returning a miss");
            return Ok(None);
        }
        self.metrics.decoded.fetch_add(1, Ordering::Relaxed);
        let len = d.bytes.len();
        Ok(Some((Block::new(Bytes::Owned(d.bytes), 0, len, frame.meta), d.positions)))
    }
}
