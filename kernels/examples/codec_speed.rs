//! Quick compress and decompress GB/s of a few codecs on a generated bf16 block, one core, for
//! working on the kernels without building the whole tool (`kvhoard bench codecs` is the
//! benchmark of record).
//!
//! ```sh
//! cargo run --release -p kvhoard-kernels --example codec_speed [-- MIB [SPEC...]]
//! KVHOARD_SIMD=scalar cargo run --release -p kvhoard-kernels --example codec_speed   # the scalar reference
//! ```

#![allow(clippy::unwrap_used, clippy::expect_used, missing_docs)]

use std::time::Instant;

use kvhoard_kernels::synth::Synth;
use kvhoard_kernels::{Block, Codec, CodecSpec, CpuCodec};

fn main() {
    let mut args = std::env::args().skip(1);
    let mib: u32 = args.next().map(|s| s.parse().unwrap()).unwrap_or(2);
    let mut specs: Vec<String> = args.collect();
    if specs.is_empty() {
        specs = ["lossless:level=1", "quant:bits=8", "quant:bits=4", "quant:bits=2", "quant:bits=4,residual=32"]
            .map(String::from)
            .to_vec();
    }
    let synth = Synth::new(mib, 256, 8, 128, 0);
    let data = synth.generate();
    let raw = data.len() as f64;
    let mut copy = vec![0u8; data.len()];
    let memcpy = time(|| copy.copy_from_slice(std::hint::black_box(&data)));
    println!("{:<32} {:>6} {:>9} {:>9}", "codec", "ratio", "comp GB/s", "dec GB/s");
    println!("{:<32} {:>6.3} {:>9.2} {:>9.2}", "memcpy", 1.0, raw / memcpy / 1e9, raw / memcpy / 1e9);
    for text in &specs {
        let spec = CodecSpec::parse(text).unwrap();
        let mut codec = CpuCodec::new(spec).unwrap();
        let block = Block::new(synth.desc, &data);
        let mut payload = vec![0u8; codec.max_payload_size(&synth.desc)];
        let compressed = codec.compress(&block, &mut payload).unwrap();
        let compress = time(|| {
            codec.compress(&block, &mut payload).unwrap();
        });
        let payload = &payload[..compressed.len];
        let mut out = vec![0u8; data.len()];
        let decompress = time(|| {
            codec.decompress(&compressed.params, &compressed.shape, payload, &mut out).unwrap();
        });
        println!(
            "{:<32} {:>6.3} {:>9.2} {:>9.2}",
            text,
            compressed.len as f64 / raw,
            raw / compress / 1e9,
            raw / decompress / 1e9
        );
    }
}

fn time(mut f: impl FnMut()) -> f64 {
    f();
    let started = Instant::now();
    let mut calls = 0u32;
    while calls < 3 || started.elapsed().as_secs_f64() < 0.5 {
        f();
        calls += 1;
    }
    started.elapsed().as_secs_f64() / f64::from(calls)
}
