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

/// `--write-in-flight`: at least one unit.
pub fn parse_write_in_flight(s: &str) -> Result<u64, String> {
    let bytes = crate::size::parse_size(s)?;
    let unit = kvhoard_engine::format::UNIT_BYTES;
    if bytes < unit {
        return Err(format!("{s:?} is too small: it must be at least {unit} bytes (one unit); the default is 64MiB"));
    }
    Ok(bytes)
}

/// `--clean-rate`: at least 1 MiB a second (a cleaner slower than that leaves every put that
/// fills the volume waiting for it).
pub fn parse_clean_rate(s: &str) -> Result<u64, String> {
    let bytes = crate::size::parse_size(s)?;
    if bytes < 1 << 20 {
        return Err(format!(
            "{s:?} is too small: the cleaner's rate must be at least 1MiB (a second); the default is 256MiB"
        ));
    }
    Ok(bytes)
}

/// `--write-size`: at least one unit (writes are whole units) and at most what one write can be.
pub fn parse_write_size(s: &str) -> Result<u64, String> {
    let bytes = crate::size::parse_size(s)?;
    let (unit, max) = (kvhoard_engine::format::UNIT_BYTES, kvhoard_engine::WriterConfig::MAX_REQUEST_BYTES as u64);
    if !(unit..=max).contains(&bytes) {
        return Err(format!("{s:?} is out of range: a write is between {unit} bytes (one unit) and {max} bytes (1GiB); the default is 2MiB"));
    }
    Ok(bytes)
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

/// `fifo`, `lru`, `planner` or `planner:alpha=SECS`.
pub fn parse_placement(s: &str) -> Result<crate::replay::planning::PlacementChoice, String> {
    crate::replay::planning::PlacementChoice::parse(s).map_err(|e| e.to_string())
}

/// How a served or mounted volume decides where its blocks live.
#[derive(Debug, Clone, clap::Args)]
pub struct PlacementArgs {
    /// What happens as the volume fills. `fifo`: the oldest segment is reclaimed whole when the
    /// volume is full. `lru`: a cleaner empties segments ahead of need and keeps the blocks read
    /// since their write. `planner[:alpha=SECS]`: per context (a group, or one key), the planner
    /// weighs quality against load delay and access frequency and keeps each context as put,
    /// recompressed (lossless, quant 8/4/2 bits; lossy only where the namespace allows it), or
    /// drops it, within 70 % of the volume; alpha is the seconds of delay a unit of quality is
    /// worth per block (default 0.05). See docs/placement.md.
    #[arg(long, default_value = "fifo", value_parser = parse_placement, value_name = "POLICY")]
    pub placement: crate::replay::planning::PlacementChoice,
    /// Read bandwidth of the volume's disk in GB/s, for the planner's load delays.
    #[arg(long, default_value_t = crate::replay::planning::DEFAULT_SSD_GBPS, value_name = "GBPS")]
    pub planner_ssd_gbps: f64,
}

impl PlacementArgs {
    /// `opts` with this placement, and what to tell it once the volume is open.
    pub fn apply(
        &self,
        opts: kvhoard_engine::StoreOptions,
    ) -> anyhow::Result<(kvhoard_engine::StoreOptions, crate::replay::planning::Placed)> {
        let placed = crate::replay::planning::Placed::build(self.placement, self.planner_ssd_gbps, opts.clock.clone())?;
        let opts = kvhoard_engine::StoreOptions { placement: std::sync::Arc::clone(&placed.placement), ..opts };
        Ok((opts, placed))
    }
}
