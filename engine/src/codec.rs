//! Compression applied by the store: a block is compressed on put with the codec the put or its
//! namespace's policy names, and decoded on get. Codec contexts (zstd's among them) are kept in a
//! pool and reused, and every output goes into a buffer of the engine's pool, so a steady stream
//! of puts and gets allocates nothing per block.
//!
//! A block keeps the name (blake3) of its original bytes whatever its codec; the record stores
//! the codec's output, its crc32c covers those stored bytes, and the codec's parameters sit in
//! the record header (docs/format.md). A block the codec cannot take (no tensor description, a
//! layout it does not know) or would not shrink is stored as it is.

use std::sync::{Arc, Mutex};

use kvhoard_format::{BlockDesc, CompressionMeta};
use kvhoard_kernels::{
    decoded_size, Block as KvBlock, Codec as _, CodecParams, CodecSpec, CpuCodec, KvShape, Positions,
};

use crate::buffer::{BufferPool, PooledBuf};

/// A pool of codec contexts.
#[derive(Default)]
pub(crate) struct Codecs {
    idle: Mutex<Vec<CpuCodec>>,
}

/// A block compressed for storing.
pub(crate) struct Compressed {
    /// The stored bytes.
    pub payload: PooledBuf,
    /// The record header's codec area.
    pub meta: CompressionMeta,
}

/// Why a block is stored as it is instead of compressed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Skipped {
    /// The codec cannot take this block (its description, its size); why.
    NotApplicable(String),
    /// The codec's output is no smaller than the block.
    NoGain,
}

/// A decoded block.
pub(crate) struct DecodedBlock {
    /// The decoded bytes (the original ones for a lossless codec).
    pub bytes: PooledBuf,
    /// Which original tokens they hold (all, unless tokens were dropped).
    pub positions: Positions,
    /// Whether decoding gives back exactly the original bytes.
    pub lossless: bool,
}

impl std::fmt::Debug for Codecs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Codecs").finish_non_exhaustive()
    }
}

impl Codecs {
    fn with<T>(&self, f: impl FnOnce(&mut CpuCodec) -> T) -> T {
        let pooled = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop();
        let mut codec = pooled.unwrap_or_else(CpuCodec::decoder);
        let out = f(&mut codec);
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(codec);
        out
    }

    /// Compresses `bytes`, a block described by `desc`, with `spec`.
    pub(crate) fn compress(
        &self,
        spec: CodecSpec,
        desc: &BlockDesc,
        bytes: &[u8],
        pool: &Arc<BufferPool>,
    ) -> Result<Compressed, Skipped> {
        let shape = KvShape::of(desc, bytes.len() as u64).map_err(|e| Skipped::NotApplicable(e.to_string()))?;
        self.with(|codec| {
            codec.set_spec(spec).map_err(|e| Skipped::NotApplicable(e.to_string()))?;
            let mut out = pool.get(codec.max_payload_size(&shape));
            let done = codec
                .compress(&KvBlock::new(shape, bytes), &mut out)
                .map_err(|e| Skipped::NotApplicable(e.to_string()))?;
            if done.len >= bytes.len() {
                return Err(Skipped::NoGain);
            }
            out.truncate(done.len);
            Ok(Compressed { payload: out, meta: done.meta() })
        })
    }

    /// Decodes the stored `payload` of a block described by `desc` (`raw_len` original bytes)
    /// with codec area `meta`.
    pub(crate) fn decode(
        &self,
        desc: &BlockDesc,
        raw_len: u64,
        meta: &CompressionMeta,
        payload: &[u8],
        pool: &Arc<BufferPool>,
    ) -> Result<DecodedBlock, kvhoard_kernels::Error> {
        let (params, shape) = params_of(desc, raw_len, meta)?;
        let mut bytes = pool.get(decoded_size(&params, &shape));
        let decoded = self.with(|codec| codec.decompress(&params, &shape, payload, &mut bytes))?;
        bytes.truncate(decoded.len);
        Ok(DecodedBlock { bytes, positions: decoded.positions, lossless: !params.spec.is_lossy() })
    }

    /// Decodes into `out` (which must hold [`Codecs::decoded_len`] bytes); returns the decoded
    /// length and whether decoding gives back the original bytes.
    pub(crate) fn decode_into(
        &self,
        desc: &BlockDesc,
        raw_len: u64,
        meta: &CompressionMeta,
        payload: &[u8],
        out: &mut [u8],
    ) -> Result<(usize, Positions, bool), kvhoard_kernels::Error> {
        let (params, shape) = params_of(desc, raw_len, meta)?;
        let decoded = self.with(|codec| codec.decompress(&params, &shape, payload, out))?;
        Ok((decoded.len, decoded.positions, !params.spec.is_lossy()))
    }

    /// The quality (`kvhoard_kernels::quality::quality_of_error` of the attention-output error,
    /// probes derived from the block's own keys) a block keeps in the form `compressed` gives
    /// it, against its `original` bytes. `None` for a block the estimate cannot take (no KV
    /// tensor description) or that does not decode.
    pub(crate) fn quality(
        &self,
        desc: &BlockDesc,
        original: &[u8],
        compressed: &Compressed,
        pool: &Arc<BufferPool>,
    ) -> Option<f64> {
        let (params, shape) = params_of(desc, original.len() as u64, &compressed.meta).ok()?;
        let mut bytes = pool.get(decoded_size(&params, &shape));
        let decoded = self.with(|codec| codec.decompress(&params, &shape, &compressed.payload, &mut bytes)).ok()?;
        let report = kvhoard_kernels::quality::estimate(&shape, original, &decoded, &bytes, None).ok()?;
        Some(kvhoard_kernels::quality::quality_of_error(f64::from(report.mean_error())))
    }

    /// Bytes a stored block decodes to.
    pub(crate) fn decoded_len(
        desc: &BlockDesc,
        raw_len: u64,
        meta: &CompressionMeta,
    ) -> Result<usize, kvhoard_kernels::Error> {
        let (params, shape) = params_of(desc, raw_len, meta)?;
        Ok(decoded_size(&params, &shape))
    }
}

/// Decodes a stored frame and checks it (fsck --deep): a lossless one against its blake3 name, a
/// lossy one for decoding whole. Says what is wrong.
pub(crate) fn check_frame(
    desc: &BlockDesc,
    raw_len: u64,
    meta: &CompressionMeta,
    payload: &[u8],
    content_hash: &[u8; 32],
) -> Result<(), String> {
    let (params, shape) = params_of(desc, raw_len, meta).map_err(|e| e.to_string())?;
    let mut out = vec![0u8; decoded_size(&params, &shape)];
    let decoded = CpuCodec::decoder()
        .decompress(&params, &shape, payload, &mut out)
        .map_err(|e| format!("does not decode: {e}"))?;
    let bytes = out.get(..decoded.len).unwrap_or_default();
    if !params.spec.is_lossy() && blake3::hash(bytes).as_bytes() != content_hash {
        return Err("decodes to bytes whose blake3 is not the block's name".into());
    }
    Ok(())
}

/// The codec a stored block's record holds it in, `None` for its bytes as they were put (and
/// for a codec this build does not know).
pub(crate) fn stored_codec(desc: &BlockDesc, raw_len: u64, meta: &CompressionMeta) -> Option<CodecSpec> {
    spec_of(desc, raw_len, meta).filter(|s| !s.is_raw())
}

/// The codec of a stored block, read from its codec area.
pub(crate) fn spec_of(desc: &BlockDesc, raw_len: u64, meta: &CompressionMeta) -> Option<CodecSpec> {
    if meta.is_none() {
        return Some(CodecSpec::RAW);
    }
    params_of(desc, raw_len, meta).ok().map(|(p, _)| p.spec)
}

fn params_of(
    desc: &BlockDesc,
    raw_len: u64,
    meta: &CompressionMeta,
) -> Result<(CodecParams, KvShape), kvhoard_kernels::Error> {
    let view = KvShape::of(desc, raw_len)
        .map_err(|e| kvhoard_kernels::Error::Corrupt(format!("the stored description does not fit the codec: {e}")))?;
    CodecParams::decode(meta, &view)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use kvhoard_format::{Dtype, Layout};

    fn kv_block() -> (BlockDesc, Vec<u8>) {
        let synth = kvhoard_kernels::synth::Synth::new(2, 64, 2, 64, 7);
        (synth.desc.desc(), synth.generate())
    }

    #[test]
    fn lossless_round_trips_and_a_reused_context_serves_any_codec() {
        let (desc, bytes) = kv_block();
        let pool = BufferPool::new(8, 64 << 20);
        let codecs = Codecs::default();
        for spec in [CodecSpec::lossless(1), CodecSpec::quant(4, 32, 0), CodecSpec::lossless(3)] {
            let c = codecs.compress(spec, &desc, &bytes, &pool).expect("compresses");
            assert!(c.payload.len() < bytes.len());
            let d = codecs.decode(&desc, bytes.len() as u64, &c.meta, &c.payload, &pool).expect("decodes");
            assert_eq!(d.bytes.len(), bytes.len());
            assert_eq!(d.lossless, !spec.is_lossy());
            if d.lossless {
                assert!(d.bytes[..] == bytes[..], "{spec}: not bit-exact");
            }
        }
        assert!(codecs.idle.lock().unwrap().len() <= 1, "one context served every call");
    }

    #[test]
    fn opaque_or_incompressible_blocks_are_skipped() {
        let pool = BufferPool::new(8, 64 << 20);
        let codecs = Codecs::default();
        let opaque = BlockDesc::opaque();
        let random = kvhoard_kernels::rng::bytes(3, 1 << 16);
        assert!(matches!(
            codecs.compress(CodecSpec::quant(4, 32, 0), &opaque, &random, &pool),
            Err(Skipped::NotApplicable(_))
        ));
        let desc = BlockDesc { dtype: Dtype::Bf16, layout: Layout::Kv2Ltd, shape: vec![2, 1, 64, 256] };
        assert!(matches!(codecs.compress(CodecSpec::lossless(1), &desc, &random, &pool), Err(Skipped::NoGain)));
    }
}
