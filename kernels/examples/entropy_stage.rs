//! Measures entropy coders for the lossless codec's byte planes (docs/decisions/0007).
//!
//! ```sh
//! cargo run --release -p kvhoard-kernels --example entropy_stage [-- MIN_SECONDS]
//! ```
//!
//! For generated bf16 blocks of 2 MiB and 32 MiB (the blocks `kvhoard bench codecs` uses), splits
//! each 1 Mi-value chunk into its high (sign and exponent) and low (mantissa) byte planes and,
//! for each plane and each candidate, prints the compressed size as a fraction of the plane, and
//! compress and decompress GB/s of the plane on one core. Every candidate writes standard zstd
//! frames, so the existing decoder reads them all (a dictionary frame needs its dictionary).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, missing_docs)]

use std::time::Instant;

use kvhoard_kernels::synth::Synth;
use zstd::zstd_safe::{self, zstd_sys, CParameter, ParamSwitch};

const CHUNK: usize = 1 << 20;

/// A named way to compress a plane.
type Candidate = (String, Box<dyn Fn(&[u8]) -> Vec<u8>>);
/// zstd's largest block.
const BLOCK: usize = 128 << 10;

fn main() {
    let min_s: f64 = std::env::args().nth(1).map(|s| s.parse().unwrap()).unwrap_or(0.3);
    println!("zstd {}", zstd_safe::version_string());
    // A dictionary trained on high planes of blocks generated from other seeds.
    let samples: Vec<Vec<u8>> = (100..132)
        .flat_map(|seed| {
            let data = Synth::new(2, 256, 8, 128, seed).generate();
            let (high, _) = split(&data);
            high.chunks(64 << 10).map(<[u8]>::to_vec).collect::<Vec<_>>()
        })
        .collect();
    let dict = zstd::dict::from_samples(&samples, 64 << 10).expect("train");
    for layers in [2u32, 32] {
        let data = Synth::new(layers, 256, 8, 128, 0).generate();
        let chunk = &data[..(2 * CHUNK).min(data.len())];
        let (high, low) = split(chunk);
        println!(
            "\n{} MiB block, first chunk: high plane order-0 entropy {:.3} bits/byte ({:.3} of the plane), low {:.3}",
            data.len() >> 20,
            entropy(&high),
            entropy(&high) / 8.0,
            entropy(&low)
        );
        println!("{:<44} {:>6} {:>8} {:>8}", "candidate", "ratio", "comp", "decomp");
        for (name, plane) in [("high", &high), ("low", &low)] {
            let mut candidates: Vec<Candidate> = Vec::new();
            for level in [-7, -3, -1, 1, 2, 3, 6, 9] {
                candidates.push((format!("{name}: zstd level {level}"), Box::new(move |p| zstd_level(p, level, None))));
            }
            for level in [-7, -3, -1] {
                candidates.push((
                    format!("{name}: zstd level {level}, literals compressed"),
                    Box::new(move |p| zstd_level(p, level, Some(ParamSwitch::Enable))),
                ));
            }
            candidates.push((
                format!("{name}: zstd level 1, literals raw"),
                Box::new(|p| zstd_level(p, 1, Some(ParamSwitch::Disable))),
            ));
            candidates.push((format!("{name}: Huffman only (zstd literals-only frame)"), Box::new(literals_only)));
            let d = dict.clone();
            candidates.push((
                format!("{name}: zstd level 1 + trained 64 KiB dictionary"),
                Box::new(move |p| zstd::bulk::Compressor::with_dictionary(1, &d).unwrap().compress(p).unwrap()),
            ));
            for (label, compress) in &candidates {
                let frame = compress(plane);
                let comp_s = time(min_s, || {
                    std::hint::black_box(compress(plane));
                });
                let with_dict = label.contains("dictionary");
                let mut decompressor = if with_dict {
                    zstd::bulk::Decompressor::with_dictionary(&dict).unwrap()
                } else {
                    zstd::bulk::Decompressor::new().unwrap()
                };
                let mut back = vec![0u8; plane.len()];
                assert_eq!(decompressor.decompress_to_buffer(&frame, &mut back).unwrap(), plane.len());
                assert!(back == *plane, "{label} does not round-trip");
                let dec_s = time(min_s, || {
                    decompressor.decompress_to_buffer(&frame, &mut back).unwrap();
                });
                let n = plane.len() as f64;
                println!(
                    "{:<44} {:>6.3} {:>8.2} {:>8.2}",
                    label,
                    frame.len() as f64 / n,
                    n / comp_s / 1e9,
                    n / dec_s / 1e9
                );
            }
        }
    }
}

fn split(data: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let high = data.chunks_exact(2).map(|v| v[1]).collect();
    let low = data.chunks_exact(2).map(|v| v[0]).collect();
    (high, low)
}

fn entropy(plane: &[u8]) -> f64 {
    let mut counts = [0u64; 256];
    for &b in plane {
        counts[b as usize] += 1;
    }
    let n = plane.len() as f64;
    counts.iter().filter(|&&c| c > 0).map(|&c| -(c as f64 / n) * (c as f64 / n).log2()).sum()
}

fn zstd_level(plane: &[u8], level: i32, literals: Option<ParamSwitch>) -> Vec<u8> {
    let mut cctx = zstd_safe::CCtx::create();
    cctx.set_parameter(CParameter::CompressionLevel(level)).unwrap();
    if let Some(mode) = literals {
        cctx.set_parameter(CParameter::LiteralCompressionMode(mode)).unwrap();
    }
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(plane.len()));
    cctx.compress2(&mut out, plane).unwrap();
    out
}

/// A frame of blocks that are all literals (Huffman-coded by zstd, no matches): sequences given
/// explicitly, one block delimiter per 128 KiB block and nothing else.
fn literals_only(plane: &[u8]) -> Vec<u8> {
    use zstd_sys::ZSTD_cParameter::*;
    let sequences: Vec<zstd_sys::ZSTD_Sequence> = plane
        .chunks(BLOCK)
        .map(|b| zstd_sys::ZSTD_Sequence { offset: 0, litLength: b.len() as u32, matchLength: 0, rep: 0 })
        .collect();
    let mut out = vec![0u8; zstd_safe::compress_bound(plane.len())];
    // SAFETY: a context made and freed here; the buffers are live for the call with the lengths
    // given.
    unsafe {
        let cctx = zstd_sys::ZSTD_createCCtx();
        assert!(!cctx.is_null());
        assert_eq!(zstd_sys::ZSTD_isError(zstd_sys::ZSTD_CCtx_setParameter(cctx, ZSTD_c_compressionLevel, 1)), 0);
        // ZSTD_c_blockDelimiters (ZSTD_c_experimentalParam11): 1 =
        // sequences end each block with a delimiter.
        assert_eq!(zstd_sys::ZSTD_isError(zstd_sys::ZSTD_CCtx_setParameter(cctx, ZSTD_c_experimentalParam11, 1)), 0);
        let written = zstd_sys::ZSTD_compressSequences(
            cctx,
            out.as_mut_ptr().cast(),
            out.len(),
            sequences.as_ptr(),
            sequences.len(),
            plane.as_ptr().cast(),
            plane.len(),
        );
        zstd_sys::ZSTD_freeCCtx(cctx);
        assert_eq!(zstd_sys::ZSTD_isError(written), 0, "compressSequences failed");
        out.truncate(written);
    }
    out
}

fn time(min_s: f64, mut f: impl FnMut()) -> f64 {
    f();
    let started = Instant::now();
    let mut calls = 0u32;
    while calls < 3 || started.elapsed().as_secs_f64() < min_s {
        f();
        calls += 1;
    }
    started.elapsed().as_secs_f64() / f64::from(calls)
}
