//! `kvhoard bench codecs`: size ratio, speed and error of every codec on generated KV blocks.

use std::io::IsTerminal;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use kvhoard_kernels::{quality, synth::Synth, Block, Codec, CodecSpec, CpuCodec, Queries};
use serde_json::{json, Value};

use crate::cli::CodecsArgs;

/// What is measured when no --codec is given: every codec, at settings people use.
const DEFAULT_CODECS: &[&str] = &[
    "lossless:level=1",
    "lossless:level=3",
    "quant:bits=8",
    "quant:bits=4",
    "quant:bits=2",
    "quant:bits=4,residual=32",
    "drop-knorm:keep=0.5",
    "drop-keydiff:keep=0.5",
    "drop-streaming:keep=0.5",
    "drop-paged:keep=0.5",
    "drop-snapkv:keep=0.5",
    "drop-knorm:keep=0.5+quant:bits=4",
    "drop-paged:keep=0.5+lossless:level=1",
];

/// Layers, tokens, KV heads and head_dim of a 1 MiB layer: an 8B Llama-shaped model.
const TOKENS: u32 = 256;
const KV_HEADS: u32 = 8;
const HEAD_DIM: u32 = 128;
const LAYER_BYTES: u64 = 2 * TOKENS as u64 * KV_HEADS as u64 * HEAD_DIM as u64 * 2;
/// SnapKV's observation window and the GQA group of the generated queries.
const WINDOW: usize = 8;
const GROUP: usize = 4;

pub fn run(args: &CodecsArgs) -> anyhow::Result<std::process::ExitCode> {
    let texts: Vec<&str> =
        if args.codecs.is_empty() { DEFAULT_CODECS.to_vec() } else { args.codecs.iter().map(String::as_str).collect() };
    let specs = texts
        .iter()
        .map(|t| CodecSpec::parse(t).with_context(|| format!("--codec {t:?}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    for &size in &args.sizes {
        ensure!(
            size >= LAYER_BYTES && size % LAYER_BYTES == 0,
            "--size {size}: blocks are whole layers of 256 tokens, so the size must be a multiple of 1 MiB"
        );
    }
    ensure!(args.min_time > 0.0 && args.min_time.is_finite(), "--min-time must be a positive number of seconds");
    let show = !args.json && std::io::stderr().is_terminal();
    let bar = ProgressBar::with_draw_target(
        Some((specs.len() * args.sizes.len()) as u64),
        if show { ProgressDrawTarget::stderr() } else { ProgressDrawTarget::hidden() },
    );
    bar.set_style(ProgressStyle::with_template("{bar:30} {pos}/{len} {msg}").expect("static template"));
    let min_time = Duration::from_secs_f64(args.min_time);
    let mut results = Vec::new();
    for &size in &args.sizes {
        let synth = Synth::new((size / LAYER_BYTES) as u32, TOKENS, KV_HEADS, HEAD_DIM, args.seed);
        let data = synth.generate();
        let queries = synth.queries(WINDOW, GROUP);
        // The reference every codec is compared with: copying the block, on the same core.
        let memcpy_gbps = memcpy_gbps(&data, min_time);
        let reference = memcpy_row(data.len(), memcpy_gbps);
        if !args.json {
            print_row(&reference, results.is_empty());
        }
        results.push(reference);
        for spec in &specs {
            bar.set_message(format!("{spec} on {} MiB", size >> 20));
            let mut result = measure(spec, &synth, &data, &queries, min_time)
                .with_context(|| format!("measuring {spec} on a {} MiB block", size >> 20))?;
            if let Value::Object(fields) = &mut result {
                let of_memcpy = |key: &str| round(fields[key].as_f64().unwrap_or(0.0) / memcpy_gbps, 3);
                let (compress, decompress) = (of_memcpy("compress_gbps"), of_memcpy("decompress_gbps"));
                fields.insert("memcpy_gbps".into(), json!(memcpy_gbps));
                fields.insert("compress_of_memcpy".into(), json!(compress));
                fields.insert("decompress_of_memcpy".into(), json!(decompress));
            }
            if !args.json {
                print_row(&result, results.is_empty());
            }
            results.push(result);
            bar.inc(1);
        }
    }
    bar.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&Value::Array(results))?);
    }
    Ok(std::process::ExitCode::SUCCESS)
}

fn measure(
    spec: &CodecSpec,
    synth: &Synth,
    data: &[u8],
    queries: &Queries,
    min_time: Duration,
) -> anyhow::Result<Value> {
    let desc = synth.desc;
    let block = Block { shape: desc, data, queries: Some(queries) };
    let mut codec = CpuCodec::new(*spec)?;
    let mut payload = vec![0u8; codec.max_payload_size(&desc)];
    // Touch the buffers once so that page faults are not timed.
    let compressed = codec.compress(&block, &mut payload)?;
    let compress_s = time(min_time, || codec.compress(&block, &mut payload).map(drop))?;
    let payload = &payload[..compressed.len];
    // What a stored block costs: its payload and the parameters its record header carries.
    let stored = compressed.len + compressed.meta().params.len();
    let (params, shape) = (&compressed.params, &compressed.shape);
    let mut out = vec![0u8; kvhoard_kernels::decoded_size(params, shape)];
    let decoded = codec.decompress(params, shape, payload, &mut out)?;
    let decompress_s = time(min_time, || codec.decompress(params, shape, payload, &mut out).map(drop))?;
    let started = Instant::now();
    let derived = quality::estimate(&desc, data, &decoded, &out, None)?;
    let quality_ms = started.elapsed().as_secs_f64() * 1e3;
    let with_queries = quality::estimate(&desc, data, &decoded, &out, Some(queries))?;
    let raw = data.len() as f64;
    let text = spec.to_string();
    let (names, params): (Vec<&str>, Vec<&str>) =
        text.split('+').map(|stage| stage.split_once(':').unwrap_or((stage, ""))).unzip();
    Ok(json!({
        "codec": names.join("+"),
        "params": params.iter().filter(|p| !p.is_empty()).copied().collect::<Vec<_>>().join(","),
        "block_bytes": data.len(),
        "stored_bytes": stored,
        "size_ratio": round(stored as f64 / raw, 4),
        "compress_gbps": round(raw / compress_s / 1e9, 3),
        "decompress_gbps": round(raw / decompress_s / 1e9, 3),
        "error": round(derived.mean_error() as f64, 5),
        "error_with_queries": round(with_queries.mean_error() as f64, 5),
        "lost_mass": round(with_queries.mean_lost_mass() as f64, 5),
        "quality_ms": round(quality_ms, 1),
        "cpu_kernels": kvhoard_kernels::cpu_kernels(),
    }))
}

/// GB/s of copying `data` into another buffer (touched once first), on one thread.
fn memcpy_gbps(data: &[u8], min_time: Duration) -> f64 {
    let mut copy = vec![0u8; data.len()];
    copy.copy_from_slice(data);
    let seconds = time(min_time, || {
        copy.copy_from_slice(std::hint::black_box(data));
        std::hint::black_box(&mut copy);
        Ok(())
    })
    .unwrap_or(f64::INFINITY);
    round(data.len() as f64 / seconds / 1e9, 3)
}

/// The memcpy reference as a row of the table: ratio 1, both directions a copy.
fn memcpy_row(block_bytes: usize, gbps: f64) -> Value {
    json!({
        "codec": "memcpy",
        "params": "",
        "block_bytes": block_bytes,
        "stored_bytes": block_bytes,
        "size_ratio": 1.0,
        "compress_gbps": gbps,
        "decompress_gbps": gbps,
        "error": 0.0,
        "error_with_queries": 0.0,
        "lost_mass": 0.0,
        "quality_ms": 0.0,
        "memcpy_gbps": gbps,
        "compress_of_memcpy": 1.0,
        "decompress_of_memcpy": 1.0,
        "cpu_kernels": kvhoard_kernels::cpu_kernels(),
    })
}

/// Seconds per call of `f`, over at least `min_time` and three calls.
fn time(min_time: Duration, mut f: impl FnMut() -> Result<(), kvhoard_kernels::Error>) -> anyhow::Result<f64> {
    let started = Instant::now();
    let mut calls = 0u32;
    while calls < 3 || started.elapsed() < min_time {
        f()?;
        calls += 1;
    }
    Ok(started.elapsed().as_secs_f64() / f64::from(calls))
}

fn round(x: f64, digits: i32) -> f64 {
    let scale = 10f64.powi(digits);
    (x * scale).round() / scale
}

fn print_row(r: &Value, header: bool) {
    if header {
        println!(
            "{:<50} {:>6} {:>6} {:>9} {:>11} {:>8} {:>9} {:>9} {:>8} {:>7} {:>9}",
            "codec",
            "MiB",
            "ratio",
            "comp GB/s",
            "decomp GB/s",
            "E",
            "E queries",
            "lost mass",
            "E ms",
            "comp/mc",
            "decomp/mc"
        );
    }
    let name = match r["params"].as_str() {
        Some("") | None => r["codec"].as_str().unwrap_or("").to_string(),
        Some(p) => format!("{} {p}", r["codec"].as_str().unwrap_or("")),
    };
    println!(
        "{:<50} {:>6} {:>6.3} {:>9.2} {:>11.2} {:>8.4} {:>9.4} {:>9.4} {:>8.1} {:>7.3} {:>9.3}",
        name,
        r["block_bytes"].as_u64().unwrap_or(0) >> 20,
        r["size_ratio"].as_f64().unwrap_or(0.0),
        r["compress_gbps"].as_f64().unwrap_or(0.0),
        r["decompress_gbps"].as_f64().unwrap_or(0.0),
        r["error"].as_f64().unwrap_or(0.0),
        r["error_with_queries"].as_f64().unwrap_or(0.0),
        r["lost_mass"].as_f64().unwrap_or(0.0),
        r["quality_ms"].as_f64().unwrap_or(0.0),
        r["compress_of_memcpy"].as_f64().unwrap_or(0.0),
        r["decompress_of_memcpy"].as_f64().unwrap_or(0.0),
    );
}
