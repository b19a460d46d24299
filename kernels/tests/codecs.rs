//! Round trips, frames and quality, across codecs, dtypes and layouts.

use kvhoard_kernels::{
    decoded_size, frame, quality, synth::Synth, Block, BlockDesc, Codec, CodecSpec, CpuCodec, Dtype, Error, Positions,
};
use proptest::prelude::*;

const SPECS: &[&str] = &[
    "raw",
    "lossless:level=1",
    "lossless:level=3",
    "quant:bits=8,group=32,residual=0",
    "quant:bits=4,group=32,residual=16",
    "quant:bits=2,group=16,residual=0",
    "drop-knorm:keep=0.5+raw",
    "drop-keydiff:keep=0.25,per-head+raw",
    "drop-streaming:keep=0.5,sink=4+lossless:level=1",
    "drop-paged:keep=0.5,page=16+quant:bits=4,group=32,residual=0",
    "drop-paged:keep=0.3,page=8,per-head+raw",
    "drop-snapkv:keep=0.5,pool=5+raw",
    "drop-snapkv:keep=0.5,pool=5,per-head+quant:bits=8,group=32,residual=8",
];

fn descs() -> Vec<BlockDesc> {
    let mut descs = Vec::new();
    for dtype in Dtype::ALL {
        descs.push(BlockDesc::kv_2ltd(dtype, 2, 64, 2, 32));
        descs.push(BlockDesc::paged(dtype, 4, 16, 2, 16));
    }
    descs
}

fn round_trip(spec: &CodecSpec, desc: BlockDesc, seed: u64) -> (Vec<u8>, Vec<u8>, kvhoard_kernels::Decoded, usize) {
    let synth = Synth::for_desc(desc, seed);
    let data = synth.generate();
    let queries = synth.queries(4, 2);
    let mut codec = CpuCodec::new(*spec).unwrap();
    let mut frame = vec![0u8; codec.max_stored_size(&desc)];
    let block = Block { desc, data: &data, queries: Some(&queries) };
    let n = codec.compress(&block, &mut frame).unwrap();
    frame.truncate(n);
    let mut out = vec![0xa5u8; decoded_size(&frame).unwrap()];
    let decoded = CpuCodec::decoder().decompress(&frame, &mut out).unwrap();
    assert_eq!(decoded.len, out.len());
    (data, out, decoded, n)
}

#[test]
fn every_codec_round_trips_every_dtype_and_layout() {
    for text in SPECS {
        let spec = CodecSpec::parse(text).unwrap();
        for desc in descs() {
            let (data, out, decoded, _) = round_trip(&spec, desc, 11);
            let kept = decoded.kept_tokens;
            match spec.drop {
                None => {
                    assert_eq!(decoded.desc, desc);
                    assert_eq!(decoded.positions, Positions::All);
                }
                Some(_) => assert!(kept < desc.tokens() && kept > 0, "{text} kept {kept}"),
            }
            // Every decoded value is the original one at its position, exactly for raw and
            // lossless, within the quantization step for quant.
            let levels = match spec.encoding {
                kvhoard_kernels::Encoding::Quant { bits, .. } => Some(((1u32 << bits) - 1) as f32),
                _ => None,
            };
            let (d, c) = (desc.head_dim(), desc.channels());
            for kv in 0..2 {
                for layer in 0..desc.layers() {
                    // A quantized value is within half a step of its group's range, which is at
                    // most the plane's range, plus the rounding to the dtype.
                    let plane_max = (0..desc.tokens() * c)
                        .map(|i| desc.dtype.get(&data, desc.row(kv, layer, 0) + i).abs())
                        .fold(0f32, f32::max);
                    for h in 0..desc.heads() {
                        for i in 0..kept {
                            let t = decoded.positions.position(layer, h, kept, i);
                            for x in 0..d {
                                let a = desc.dtype.get(&data, desc.row(kv, layer, t) + h * d + x);
                                let b = desc.dtype.get(&out, decoded.desc.row(kv, layer, i) + h * d + x);
                                if let Some(levels) = levels {
                                    let bound = plane_max / levels * 1.01 + 0.13 * a.abs() + 1e-3;
                                    assert!((a - b).abs() <= bound, "{text} {desc}: {a} became {b}, bound {bound}");
                                } else {
                                    assert!(
                                        a.to_bits() == b.to_bits() || a.is_nan() && b.is_nan(),
                                        "{text} {}: {a} became {b}",
                                        desc
                                    );
                                }
                            }
                        }
                    }
                }
            }
            // A paged block's padding decodes as zeros.
            if decoded.desc.tokens() > kept {
                let start = decoded.desc.row(0, 0, kept) * desc.dtype.size();
                let end = decoded.desc.row(1, 0, 0) * desc.dtype.size();
                assert!(out[start..end].iter().all(|&b| b == 0), "{text}: padding");
            }
            let _ = c;
        }
    }
}

#[test]
fn lossless_is_bit_exact_and_compresses_bf16() {
    // Three layers: one and a half chunks of planes, so chunk boundaries and a partial chunk are
    // crossed.
    let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 3, 256, 8, 128);
    let (data, out, _, n) = round_trip(&CodecSpec::lossless(3), desc, 1);
    assert!(data == out, "lossless changed the block");
    let ratio = n as f64 / data.len() as f64;
    assert!(ratio < 0.9, "byte planes should compress generated bf16, ratio {ratio}");
}

#[test]
fn opaque_blocks_are_lossless_only() {
    let desc = BlockDesc::opaque(Dtype::Bf16, 4096);
    let (data, out, _, _) = round_trip(&CodecSpec::lossless(3), desc, 2);
    assert!(data == out, "lossless changed the block");
    let data = Synth::for_desc(desc, 2).generate();
    for text in ["quant", "drop-knorm:keep=0.5"] {
        let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
        let mut frame = vec![0; codec.max_stored_size(&desc)];
        let error = codec.compress(&Block::new(desc, &data), &mut frame).unwrap_err();
        assert!(matches!(error, Error::Unsupported(_)), "{text}: {error}");
    }
}

#[test]
fn snapkv_without_queries_is_a_clear_error() {
    let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 1, 32, 2, 16);
    let data = Synth::for_desc(desc, 3).generate();
    let mut codec = CpuCodec::new(CodecSpec::parse("drop-snapkv:keep=0.5").unwrap()).unwrap();
    let mut frame = vec![0; codec.max_stored_size(&desc)];
    let error = codec.compress(&Block::new(desc, &data), &mut frame).unwrap_err();
    assert!(error.to_string().contains("query vectors"), "{error}");
}

#[test]
fn wrong_sizes_and_small_buffers_are_errors() {
    let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 1, 32, 2, 16);
    let data = Synth::for_desc(desc, 3).generate();
    for text in SPECS.iter().filter(|t| !t.contains("snapkv")) {
        let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
        let mut frame = vec![0; codec.max_stored_size(&desc)];
        assert!(codec.compress(&Block::new(desc, &data[1..]), &mut frame).is_err());
        assert!(codec.compress(&Block::new(desc, &data), &mut frame[..10]).is_err());
        let n = codec.compress(&Block::new(desc, &data), &mut frame).unwrap();
        let need = decoded_size(&frame[..n]).unwrap();
        let mut out = vec![0; need - 1];
        assert!(matches!(codec.decompress(&frame[..n], &mut out), Err(Error::BufferTooSmall { .. })));
    }
}

#[test]
fn frames_describe_themselves_and_reject_damage() {
    let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 2, 64, 2, 32);
    let data = Synth::for_desc(desc, 5).generate();
    for text in SPECS.iter().filter(|t| !t.contains("snapkv")) {
        let spec = CodecSpec::parse(text).unwrap();
        let mut codec = CpuCodec::new(spec).unwrap();
        let mut buf = vec![0; codec.max_stored_size(&desc)];
        let n = codec.compress(&Block::new(desc, &data), &mut buf).unwrap();
        let good = &buf[..n];
        let (header, payload) = frame::parse(good).unwrap();
        assert_eq!(header.spec, spec);
        assert_eq!(header.desc, desc);
        assert_eq!(payload.len() as u64, header.payload_len);

        // Every truncation and every single flipped bit in the header is rejected; a flipped
        // payload bit is caught by the payload checksum.
        let mut out = vec![0; decoded_size(good).unwrap()];
        for len in [0, 1, 10, header.encoded_len() - 1, header.encoded_len(), n - 1] {
            assert!(codec.decompress(&good[..len], &mut out).is_err(), "{text} len {len}");
        }
        let mut damaged = good.to_vec();
        for byte in (0..header.encoded_len()).chain([header.encoded_len(), n - 1]) {
            for bit in [0, 5] {
                damaged[byte] ^= 1 << bit;
                assert!(codec.decompress(&damaged, &mut out).is_err(), "{text}: flip at {byte}.{bit} accepted");
                damaged[byte] ^= 1 << bit;
            }
        }
        let mut longer = good.to_vec();
        longer.push(0);
        assert!(codec.decompress(&longer, &mut out).is_err());
    }
}

#[test]
fn batches_equal_one_at_a_time() {
    let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 1, 64, 2, 32);
    let blocks: Vec<Vec<u8>> = (0..4).map(|s| Synth::for_desc(desc, s).generate()).collect();
    let spec = CodecSpec::parse("drop-knorm:keep=0.5+quant:bits=4").unwrap();
    let mut codec = CpuCodec::new(spec).unwrap();
    let bound = codec.max_stored_size(&desc);
    let inputs: Vec<Block> = blocks.iter().map(|b| Block::new(desc, b)).collect();
    let mut frames: Vec<Vec<u8>> = vec![vec![0; bound]; 4];
    let mut outs: Vec<&mut [u8]> = frames.iter_mut().map(|f| f.as_mut_slice()).collect();
    let sizes: Vec<usize> = codec.compress_batch(&inputs, &mut outs).into_iter().map(Result::unwrap).collect();
    for (i, block) in inputs.iter().enumerate() {
        let mut single = vec![0; bound];
        let n = codec.compress(block, &mut single).unwrap();
        assert_eq!(&single[..n], &frames[i][..sizes[i]]);
    }
}

#[test]
fn degenerate_blocks_have_defined_results() {
    // One token, constant values, NaN and infinities: no panic, finite or defined output.
    let one = BlockDesc::kv_2ltd(Dtype::Bf16, 1, 1, 1, 8);
    let constant = BlockDesc::kv_2ltd(Dtype::F32, 1, 40, 1, 8);
    let weird = BlockDesc::kv_2ltd(Dtype::F32, 1, 40, 1, 8);
    let mut weird_data = vec![0u8; weird.raw_size()];
    let values: Vec<f32> = (0..weird.elements())
        .map(|i| match i % 7 {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => f32::MAX,
            _ => i as f32,
        })
        .collect();
    Dtype::F32.store(&values, &mut weird_data);
    let mut constant_data = vec![0u8; constant.raw_size()];
    Dtype::F32.store(&vec![1.5; constant.elements()], &mut constant_data);
    let one_data = Synth::for_desc(one, 9).generate();
    for text in SPECS.iter().filter(|t| !t.contains("snapkv")) {
        for (desc, data, is_constant) in
            [(one, &one_data, false), (constant, &constant_data, true), (weird, &weird_data, false)]
        {
            let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
            let mut frame = vec![0; codec.max_stored_size(&desc)];
            let n = codec.compress(&Block::new(desc, data), &mut frame).unwrap();
            let mut out = vec![0; decoded_size(&frame[..n]).unwrap()];
            let decoded = codec.decompress(&frame[..n], &mut out).unwrap();
            if is_constant && decoded.positions == Positions::All {
                // A constant group decodes exactly.
                assert!(out == constant_data, "{text}: a constant block changed");
            }
        }
    }
}

#[test]
fn error_is_zero_for_lossless_and_grows_as_quant_bits_shrink() {
    let synth = Synth::new(2, 128, 2, 64, 21);
    let desc = synth.desc;
    let data = synth.generate();
    let error_of = |text: &str| {
        let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
        let mut frame = vec![0; codec.max_stored_size(&desc)];
        let n = codec.compress(&Block::new(desc, &data), &mut frame).unwrap();
        let mut out = vec![0; decoded_size(&frame[..n]).unwrap()];
        let decoded = codec.decompress(&frame[..n], &mut out).unwrap();
        quality::estimate(&desc, &data, &decoded, &out, None).unwrap()
    };
    let lossless = error_of("lossless");
    assert_eq!(lossless.max_error(), 0.0);
    assert_eq!(lossless.mean_lost_mass(), 0.0);
    let errors: Vec<f32> =
        ["quant:bits=8", "quant:bits=4", "quant:bits=2"].iter().map(|t| error_of(t).mean_error()).collect();
    assert!(errors[0] > 0.0 && errors[0] < errors[1] && errors[1] < errors[2], "{errors:?}");
}

#[test]
fn error_and_lost_mass_grow_as_keep_fraction_shrinks() {
    let synth = Synth::new(2, 128, 2, 64, 22);
    let desc = synth.desc;
    let data = synth.generate();
    let queries = synth.queries(8, 2);
    for method in ["drop-knorm", "drop-keydiff", "drop-streaming", "drop-paged", "drop-snapkv"] {
        for probes in [None, Some(&queries)] {
            let mut last = (0.0f32, 0.0f32);
            for keep in [1.0, 0.8, 0.6, 0.4, 0.2] {
                let spec = CodecSpec::parse(&format!("{method}:keep={keep}")).unwrap();
                let mut codec = CpuCodec::new(spec).unwrap();
                let mut frame = vec![0; codec.max_stored_size(&desc)];
                let block = Block { desc, data: &data, queries: Some(&queries) };
                let n = codec.compress(&block, &mut frame).unwrap();
                let mut out = vec![0; decoded_size(&frame[..n]).unwrap()];
                let decoded = codec.decompress(&frame[..n], &mut out).unwrap();
                let report = quality::estimate(&desc, &data, &decoded, &out, probes).unwrap();
                let now = (report.mean_error(), report.mean_lost_mass());
                assert!(
                    now.0 >= last.0 - 1e-6 && now.1 >= last.1 - 1e-6,
                    "{method} keep {keep} probes {}: {now:?} after {last:?}",
                    probes.is_some()
                );
                last = now;
            }
            assert!(last.0 > 0.0, "{method}: dropping 80% must cost something");
        }
    }
}

#[test]
fn client_queries_find_the_sinks_that_knorm_keeps() {
    // On generated data, the tokens the queries attend to have low key norms, so knorm at half
    // keeps nearly all the attention mass.
    let synth = Synth::new(2, 128, 2, 64, 23);
    let desc = synth.desc;
    let data = synth.generate();
    let queries = synth.queries(8, 1);
    let mut codec = CpuCodec::new(CodecSpec::parse("drop-knorm:keep=0.5").unwrap()).unwrap();
    let mut frame = vec![0; codec.max_stored_size(&desc)];
    let n = codec.compress(&Block::new(desc, &data), &mut frame).unwrap();
    let mut out = vec![0; decoded_size(&frame[..n]).unwrap()];
    let decoded = codec.decompress(&frame[..n], &mut out).unwrap();
    let report = quality::estimate(&desc, &data, &decoded, &out, Some(&queries)).unwrap();
    assert!(report.mean_lost_mass() < 0.2, "lost {}", report.mean_lost_mass());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn random_shapes_round_trip(
        layers in 1u32..3,
        tokens in 1u32..40,
        heads in 1u32..3,
        head_dim in 1u32..20,
        dtype in prop::sample::select(Dtype::ALL.to_vec()),
        spec in prop::sample::select(SPECS.to_vec()),
        seed in any::<u64>(),
    ) {
        let desc = BlockDesc::kv_2ltd(dtype, layers, tokens, heads, head_dim);
        let spec = CodecSpec::parse(spec).unwrap();
        let (data, out, decoded, _) = round_trip(&spec, desc, seed);
        if spec.drop.is_none() && !matches!(spec.encoding, kvhoard_kernels::Encoding::Quant { .. }) {
            prop_assert!(data == out, "bit-exact codec changed the block");
        }
        prop_assert!(decoded.kept_tokens >= 1 && decoded.kept_tokens <= tokens as usize);
    }

    #[test]
    fn random_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..400)) {
        let mut out = vec![0u8; 1 << 16];
        let _ = CpuCodec::decoder().decompress(&bytes, &mut out);
    }

    #[test]
    fn damaged_real_frames_never_panic(index in any::<prop::sample::Index>(), value in any::<u8>()) {
        let desc = BlockDesc::kv_2ltd(Dtype::Bf16, 1, 16, 1, 16);
        let data = Synth::for_desc(desc, 1).generate();
        let mut codec = CpuCodec::new(CodecSpec::parse("drop-paged:keep=0.5,page=4,per-head+quant").unwrap()).unwrap();
        let mut frame = vec![0; codec.max_stored_size(&desc)];
        let n = codec.compress(&Block::new(desc, &data), &mut frame).unwrap();
        frame.truncate(n);
        let i = index.index(n);
        frame[i] = value;
        let mut out = vec![0u8; desc.raw_size()];
        let _ = codec.decompress(&frame, &mut out);
    }
}
