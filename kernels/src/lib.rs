//! kvhoard's KV-cache codecs.
//!
//! A KV block ([`BlockDesc`]: dtype, layout, shape) is compressed by a [`CodecSpec`]: an optional
//! dropping stage that keeps a fraction of the tokens (or pages), then an encoding (raw bytes,
//! byte-plane lossless, or KIVI-style quantization). The result is a self-describing frame
//! ([`frame`]): it carries the codec, its parameters, the kept-token map, sizes and checksums, so
//! it can be decoded with nothing else at hand.
//!
//! [`CpuCodec`] is the reference implementation; every other backend must give the same result.
//! [`quality`] estimates what a configuration costs in attention-output error without a language
//! model, and [`synth`] generates deterministic KV blocks that look enough like a real model's for
//! tests, the demo and benchmarks.

mod block;
mod codec;
mod dtype;
pub mod frame;
pub mod quality;
mod queries;
pub mod synth;

pub use block::{BlockDesc, Layout, MAX_RAW_BYTES};
pub use codec::{decoded_size, Block, Codec, CodecSpec, CpuCodec, Decoded, DropMethod, DropSpec, Encoding, Positions};
pub use dtype::Dtype;
pub use queries::Queries;

/// What can go wrong in a codec. Nothing here is a panic: frames come from disk and the network,
/// parameters from users.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Parameters or inputs a user supplied are impossible; the message says which and why.
    #[error("{0}")]
    Invalid(String),
    /// The codec cannot do this for this block (for example quantizing opaque bytes, or SnapKV
    /// without query vectors).
    #[error("{0}")]
    Unsupported(String),
    /// A frame is damaged, truncated or from an unknown version.
    #[error("corrupt codec frame: {0}")]
    Corrupt(&'static str),
    #[error("output buffer too small: {need} bytes needed, {have} given")]
    BufferTooSmall { need: usize, have: usize },
    #[error("zstd: {0}")]
    Zstd(std::io::Error),
}
