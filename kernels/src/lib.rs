//! kvhoard's KV-cache codecs.
//!
//! A block is described once, by `kvhoard-format`'s [`BlockDesc`] (dtype, layout, shape, with
//! the codes stored on disk); codecs take a structured view of it, [`KvShape`]. A [`CodecSpec`]
//! compresses it: an optional dropping stage that keeps a fraction of the tokens (or pages), then
//! an encoding (raw bytes, byte-plane lossless, or KIVI-style quantization). The output is a bare
//! payload plus [`CodecParams`] (the codec, its parameters and the kept-token map), which the
//! engine stores in the record header's codec area, so that the block can be decoded with its
//! record and nothing else (docs/decisions/0003-codec-parameters-live-in-the-record-header.md).
//!
//! [`CpuCodec`] is the reference implementation; every other backend must give the same result.
//! [`quality`] estimates what a configuration costs in attention-output error without a language
//! model, and [`synth`] generates deterministic KV blocks that look enough like a real model's for
//! tests, the demo and benchmarks.

#![deny(missing_docs)]

mod codec;
pub mod elem;
pub mod params;
mod positions;
pub mod quality;
mod queries;
pub mod rng;
mod shape;
mod simd;
mod spec;
pub mod synth;

pub use codec::{decoded_size, Block, Codec, Compressed, CpuCodec, Decoded};
pub use elem::Elements;
pub use kvhoard_format::{BlockDesc, Dtype, Layout};
pub use params::{class_name, codec_class, CodecParams};
pub use positions::Positions;
pub use queries::Queries;
pub use shape::{KvLayout, KvShape, MAX_RAW_BYTES};
pub use spec::{CodecSpec, DropMethod, DropSpec, Encoding};

/// The instruction set the CPU codecs run on here: `"avx2"` (AVX2, FMA and F16C were detected)
/// or `"scalar"` (the portable reference; also with `KVHOARD_SIMD=scalar` in the environment).
/// Every one gives the same bytes (docs/decisions/0006-simd-dispatch.md).
pub fn cpu_kernels() -> &'static str {
    simd::Level::best().name()
}

/// What can go wrong in a codec. Nothing here is a panic: codec parameters and payloads come from
/// disk and the network, specs from users.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Parameters or inputs a user supplied are impossible; the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// The codec cannot do this for this block (for example quantizing opaque bytes, or SnapKV
    /// without query vectors).
    #[error("{0}")]
    Unsupported(String),
    /// Stored codec parameters or a payload are damaged or inconsistent with the block.
    #[error("corrupt compressed block: {0}")]
    Corrupt(String),
    /// The caller's output buffer cannot hold the result.
    #[error("output buffer too small: {need} bytes needed, {have} given")]
    BufferTooSmall {
        /// Bytes needed.
        need: usize,
        /// Bytes given.
        have: usize,
    },
    /// zstd failed (out of memory, or a bug).
    #[error("zstd: {0}")]
    Zstd(std::io::Error),
}

impl Error {
    pub(crate) fn corrupt(why: &str) -> Error {
        Error::Corrupt(why.to_string())
    }
}
