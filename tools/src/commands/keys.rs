//! put, get and rm of single keys.

use std::io::{Read, Write};
use std::path::Path;
use std::process::ExitCode;

use anyhow::Context;
use kvhoard_engine::format::{BlockDesc, Dtype, Layout};
use kvhoard_engine::{CodecSpec, Durability, PutOptions, ReadOptions, StoreOptions};

use super::{hex, open};
use crate::flags::Shape;
use crate::EXIT_NOT_FOUND;

/// The options of `put`.
#[derive(Debug, Clone, clap::Args)]
pub struct PutFlags {
    /// Seconds until the key expires.
    #[arg(long, value_name = "SECS")]
    pub ttl: Option<u32>,
    /// Group (context) id the block belongs to.
    #[arg(long, value_name = "G")]
    pub group: Option<u64>,
    /// When to acknowledge: buffered (in memory), written (write completed), synced (after
    /// fdatasync; survives power loss).
    #[arg(long, default_value = "synced", value_parser = crate::flags::parse_durability, value_name = "LEVEL")]
    pub durability: Durability,
    /// Codec to store the block with (the syntax of `kvhoard bench codecs`, e.g. `lossless`,
    /// `quant:bits=4`, `raw`); the namespace's default when not given. A codec needs the block's
    /// dtype, layout and shape; a block it cannot take is stored as it is.
    #[arg(long, value_parser = crate::flags::parse_codec, value_name = "SPEC")]
    pub codec: Option<CodecSpec>,
    /// Element type of the block: bytes, f16, bf16, f32, f64, u8, f8e4m3, f8e5m2.
    #[arg(long, value_parser = crate::flags::parse_dtype, value_name = "DTYPE", requires_all = ["layout", "shape"])]
    pub dtype: Option<Dtype>,
    /// Layout of the block: opaque, kv_2ltd, vllm_paged, kv_t2d, kv_2td, binary, binary_buffer,
    /// kv_mla, ec_td, hs_td.
    #[arg(long, value_parser = crate::flags::parse_layout, value_name = "LAYOUT", requires_all = ["dtype", "shape"])]
    pub layout: Option<Layout>,
    /// Shape of the block, outermost first, comma separated (e.g. 2,4,256,512).
    #[arg(long, value_parser = crate::flags::parse_shape, value_name = "DIMS", requires_all = ["dtype", "layout"])]
    pub shape: Option<Shape>,
    /// Print the result as JSON.
    #[arg(long)]
    pub json: bool,
}

/// Reads the block to put from `file` (stdin for `-` or none), refusing one past `max` bytes
/// as soon as it is: `/dev/zero` or an endless pipe fails at once instead of filling memory.
fn read_block(file: Option<&Path>, max: u64) -> anyhow::Result<Vec<u8>> {
    let mut buf = Vec::new();
    let (what, read) = match file {
        Some(p) if p != Path::new("-") => {
            let f = std::fs::File::open(p).with_context(|| format!("cannot read {}", p.display()))?;
            (p.display().to_string(), f.take(max + 1).read_to_end(&mut buf))
        }
        _ => ("stdin".to_string(), std::io::stdin().lock().take(max + 1).read_to_end(&mut buf)),
    };
    read.with_context(|| format!("cannot read the block from {what}"))?;
    if buf.len() as u64 > max {
        anyhow::bail!(
            "the block from {what} is larger than this volume's largest block ({max} bytes, a little less than a segment); split it, or create the volume with larger segments (init --segment-size)"
        );
    }
    Ok(buf)
}

pub fn put(
    volume: &Path,
    namespace: &str,
    key: &str,
    file: Option<&Path>,
    flags: &PutFlags,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let bytes = read_block(file, store.max_block_bytes())?;
    let desc = match (flags.dtype, flags.layout, &flags.shape) {
        (Some(dtype), Some(layout), Some(Shape(shape))) => {
            let desc = BlockDesc { dtype, layout, shape: shape.clone() };
            desc.validate(bytes.len() as u64).with_context(|| {
                let dims: Vec<String> = shape.iter().map(u64::to_string).collect();
                format!(
                    "--dtype {dtype} --layout {layout} --shape {} does not describe the {} bytes given",
                    dims.join(","),
                    bytes.len()
                )
            })?;
            Some(desc)
        }
        _ => None,
    };
    let put = PutOptions {
        ttl_secs: flags.ttl,
        group: flags.group,
        durability: flags.durability,
        desc,
        codec: flags.codec,
        ..PutOptions::default()
    };
    let hash = store
        .put(namespace, key, &bytes, &put)
        .with_context(|| format!("cannot store {}", kvhoard_engine::format::quoted_short(key)))?;
    let meta = store.meta(namespace, key)?;
    store.close()?;
    if flags.json {
        let (codec, stored) = meta.map_or(("raw".to_string(), bytes.len() as u64), |m| (m.codec(), m.stored_len));
        println!(
            "{}",
            serde_json::json!({ "namespace": namespace, "key": key, "bytes": bytes.len(), "content_hash": hex(&hash),
                                "codec": codec, "stored_bytes": stored })
        );
    } else {
        println!("{}", hex(&hash));
    }
    Ok(ExitCode::SUCCESS)
}

pub fn get(
    volume: &Path,
    namespace: &str,
    key: &str,
    output: Option<&Path>,
    verify: bool,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    if let Some(p) = output.filter(|p| *p != Path::new("-")) {
        crate::output::refuse_volume_file(p)?;
    }
    let store = open(volume, opts)?;
    let damaged_before = store.stats().read_errors;
    let Some(block) = store.get(namespace, key, ReadOptions { verify_hash: verify })? else {
        if store.stats().read_errors > damaged_before {
            // A damaged block reads as a miss (a cache recomputes it), but a person asking for
            // it should learn why, and what repairs it.
            eprintln!(
                "kvhoard: {key:?} in namespace {namespace:?} is stored but its block is damaged (the error above says where), so it reads as a miss; `kvhoard fsck --repair {}` deletes keys whose blocks are damaged",
                volume.display()
            );
        } else {
            eprintln!("kvhoard: {key:?} not found in namespace {namespace:?}");
        }
        return Ok(ExitCode::from(EXIT_NOT_FOUND));
    };
    match output {
        Some(p) if p != Path::new("-") => crate::output::write_file(p, &block)?,
        _ => {
            let mut out = std::io::stdout().lock();
            out.write_all(&block).and_then(|()| out.flush()).context("cannot write to stdout")?;
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub fn rm(
    volume: &Path,
    namespace: &str,
    key: &str,
    durability: Durability,
    opts: StoreOptions,
) -> anyhow::Result<ExitCode> {
    let store = open(volume, opts)?;
    let existed = store
        .delete(namespace, key, durability)
        .with_context(|| format!("cannot delete {}", kvhoard_engine::format::quoted_short(key)))?;
    store.close()?;
    if existed {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("kvhoard: {key:?} not found in namespace {namespace:?}");
        Ok(ExitCode::from(EXIT_NOT_FOUND))
    }
}
