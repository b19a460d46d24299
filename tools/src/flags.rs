//! Parsers of flag values that several commands share (sizes are in `size.rs`).

use kvhoard_engine::{Durability, IoBackend};

/// `buffered`, `written` or `synced`.
pub fn parse_durability(s: &str) -> Result<Durability, String> {
    s.parse()
}

/// `auto`, `io_uring` or `pread`.
pub fn parse_backend(s: &str) -> Result<IoBackend, String> {
    s.parse()
}

/// A codec spec (`lossless`, `quant:bits=4`, `drop-knorm:keep=0.5+quant`, `raw`).
pub fn parse_codec(s: &str) -> Result<kvhoard_engine::CodecSpec, String> {
    kvhoard_engine::CodecSpec::parse(s).map_err(|e| e.to_string())
}

/// A dtype name (`bf16`, `f16`, ...).
pub fn parse_dtype(s: &str) -> Result<kvhoard_engine::format::Dtype, String> {
    kvhoard_engine::format::Dtype::parse(s).map_err(|e| e.to_string())
}

/// A layout name (`kv_2ltd`, `vllm_paged`, ...).
pub fn parse_layout(s: &str) -> Result<kvhoard_engine::format::Layout, String> {
    kvhoard_engine::format::Layout::from_name(s).ok_or_else(|| {
        let names: Vec<&str> = kvhoard_engine::format::Layout::NAMES.iter().map(|(_, n)| *n).collect();
        format!("{s:?} is not a layout; use one of {}", names.join(", "))
    })
}

/// A block's shape from the command line.
#[derive(Debug, Clone)]
pub struct Shape(pub Vec<u64>);

/// A shape: dimensions separated by commas.
pub fn parse_shape(s: &str) -> Result<Shape, String> {
    s.split(',')
        .map(|d| {
            d.trim()
                .parse::<u64>()
                .map_err(|_| format!("{d:?} in {s:?} is not a dimension; give numbers separated by commas"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Shape)
}
