//! Round trips through the stored form (payload plus the record header's codec area), damage and
//! quality, across codecs, dtypes and layouts.

use kvhoard_kernels::elem::FLOAT_DTYPES;
use kvhoard_kernels::{
    decoded_size, quality, synth::Synth, Block, Codec, CodecSpec, Compressed, CpuCodec, Decoded, Dtype, Elements,
    Error, KvShape, Positions,
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

fn descs() -> Vec<KvShape> {
    let mut descs = Vec::new();
    for dtype in FLOAT_DTYPES {
        descs.push(KvShape::kv_2ltd(dtype, 2, 64, 2, 32));
        descs.push(KvShape::paged(dtype, 4, 16, 2, 16));
    }
    descs
}

fn round_trip(spec: &CodecSpec, desc: KvShape, seed: u64) -> (Vec<u8>, Vec<u8>, Decoded, usize) {
    let synth = Synth::for_desc(desc, seed);
    let data = synth.generate();
    let queries = synth.queries(4, 2);
    let mut codec = CpuCodec::new(*spec).unwrap();
    let mut payload = vec![0u8; codec.max_payload_size(&desc)];
    let block = Block { shape: desc, data: &data, queries: Some(&queries) };
    let compressed = codec.compress(&block, &mut payload).unwrap();
    payload.truncate(compressed.len);
    let (out, decoded) = decode_stored(&desc, &compressed, &payload).unwrap();
    assert_eq!(decoded.len, out.len());
    (data, out, decoded, compressed.len)
}

/// Decodes a payload as the engine does: from the stored description of the block and the
/// record header's codec area alone.
fn decode_stored(desc: &KvShape, compressed: &Compressed, payload: &[u8]) -> Result<(Vec<u8>, Decoded), Error> {
    let mut out = vec![0xa5u8; decoded_size(&compressed.params, &compressed.shape)];
    let stored = desc.desc();
    let decoded =
        CpuCodec::decoder().decode_stored(&stored, desc.raw_size() as u64, &compressed.meta(), payload, &mut out)?;
    Ok((out, decoded))
}

/// Compresses `data` with `text` and returns the payload and what the compressor said.
fn compress(text: &str, desc: KvShape, data: &[u8]) -> (Vec<u8>, Compressed) {
    let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
    let mut payload = vec![0; codec.max_payload_size(&desc)];
    let compressed = codec.compress(&Block::new(desc, data), &mut payload).unwrap();
    payload.truncate(compressed.len);
    (payload, compressed)
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
                    assert_eq!(decoded.shape, desc);
                    assert_eq!(decoded.positions, Positions::All);
                }
                Some(_) => {
                    assert!(kept < desc.tokens(), "{text} kept all {kept} tokens");
                    assert!(kept > 0, "{text} kept no token");
                }
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
                                let b = desc.dtype.get(&out, decoded.shape.row(kv, layer, i) + h * d + x);
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
            if decoded.shape.tokens() > kept {
                let start = decoded.shape.row(0, 0, kept) * desc.dtype.size();
                let end = decoded.shape.row(1, 0, 0) * desc.dtype.size();
                assert!(out[start..end].iter().all(|&b| b == 0), "{text}: padding");
            }
        }
    }
}

#[test]
fn lossless_is_bit_exact_and_compresses_bf16() {
    // Three layers: one and a half chunks of planes, so chunk boundaries and a partial chunk are
    // crossed.
    let desc = KvShape::kv_2ltd(Dtype::Bf16, 3, 256, 8, 128);
    let (data, out, _, n) = round_trip(&CodecSpec::lossless(3), desc, 1);
    assert!(data == out, "lossless changed the block");
    let ratio = n as f64 / data.len() as f64;
    assert!(ratio < 0.9, "byte planes should compress generated bf16, ratio {ratio}");
}

#[test]
fn opaque_blocks_are_lossless_only() {
    let desc = KvShape::opaque(Dtype::Bf16, 4096);
    let (data, out, _, _) = round_trip(&CodecSpec::lossless(3), desc, 2);
    assert!(data == out, "lossless changed the block");
    let data = Synth::for_desc(desc, 2).generate();
    for text in ["quant", "drop-knorm:keep=0.5"] {
        let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
        let mut payload = vec![0; codec.max_payload_size(&desc)];
        let error = codec.compress(&Block::new(desc, &data), &mut payload).unwrap_err();
        assert!(matches!(error, Error::Unsupported(_)), "{text}: {error}");
    }
}

#[test]
fn snapkv_without_queries_is_a_clear_error() {
    let desc = KvShape::kv_2ltd(Dtype::Bf16, 1, 32, 2, 16);
    let data = Synth::for_desc(desc, 3).generate();
    let mut codec = CpuCodec::new(CodecSpec::parse("drop-snapkv:keep=0.5").unwrap()).unwrap();
    let mut payload = vec![0; codec.max_payload_size(&desc)];
    let error = codec.compress(&Block::new(desc, &data), &mut payload).unwrap_err();
    assert!(error.to_string().contains("query vectors"), "{error}");
}

#[test]
fn wrong_sizes_and_small_buffers_are_errors() {
    let desc = KvShape::kv_2ltd(Dtype::Bf16, 1, 32, 2, 16);
    let data = Synth::for_desc(desc, 3).generate();
    for text in SPECS.iter().filter(|t| !t.contains("snapkv")) {
        let mut codec = CpuCodec::new(CodecSpec::parse(text).unwrap()).unwrap();
        let mut payload = vec![0; codec.max_payload_size(&desc)];
        assert!(codec.compress(&Block::new(desc, &data[1..]), &mut payload).is_err());
        assert!(codec.compress(&Block::new(desc, &data), &mut payload[..10]).is_err());
        let c = codec.compress(&Block::new(desc, &data), &mut payload).unwrap();
        let need = decoded_size(&c.params, &c.shape);
        let mut out = vec![0; need - 1];
        let result = codec.decompress(&c.params, &c.shape, &payload[..c.len], &mut out);
        assert!(matches!(result, Err(Error::BufferTooSmall { .. })), "{text}: {result:?}");
    }
}

#[test]
fn stored_blocks_decode_from_their_record_alone_and_refuse_damage() {
    let desc = KvShape::kv_2ltd(Dtype::Bf16, 2, 64, 2, 32);
    let data = Synth::for_desc(desc, 5).generate();
    for text in SPECS.iter().filter(|t| !t.contains("snapkv")) {
        let spec = CodecSpec::parse(text).unwrap();
        let (payload, compressed) = compress(text, desc, &data);
        assert_eq!(compressed.params.spec, spec);
        assert_eq!(compressed.shape, desc);
        let meta = compressed.meta();
        assert!(meta.params.len() <= kvhoard_format::record::CODEC_PARAMS_BYTES_MAX);
        decode_stored(&desc, &compressed, &payload).unwrap();

        // A payload cut short or run long is refused (flipped payload bits are the record's
        // checksum's to catch: the payload carries none of its own).
        for len in [0, 1, payload.len() / 2, payload.len() - 1] {
            assert!(decode_stored(&desc, &compressed, &payload[..len]).is_err(), "{text} len {len}");
        }
        let mut longer = payload.clone();
        longer.push(0);
        assert!(decode_stored(&desc, &compressed, &longer).is_err(), "{text}: a longer payload was accepted");
        // Parameters of another block shape are refused.
        let other = KvShape::kv_2ltd(Dtype::Bf16, 2, 48, 2, 32);
        let mut out = vec![0u8; desc.raw_size()];
        let refused =
            CpuCodec::decoder().decode_stored(&other.desc(), other.raw_size() as u64, &meta, &payload, &mut out);
        assert!(refused.is_err(), "{text}: parameters for 64 tokens decoded a 48-token block");
    }
}

#[test]
fn batches_equal_one_at_a_time() {
    let desc = KvShape::kv_2ltd(Dtype::Bf16, 1, 64, 2, 32);
    let blocks: Vec<Vec<u8>> = (0..4).map(|s| Synth::for_desc(desc, s).generate()).collect();
    let spec = CodecSpec::parse("drop-knorm:keep=0.5+quant:bits=4").unwrap();
    let mut codec = CpuCodec::new(spec).unwrap();
    let bound = codec.max_payload_size(&desc);
    let inputs: Vec<Block> = blocks.iter().map(|b| Block::new(desc, b)).collect();
    let mut payloads: Vec<Vec<u8>> = vec![vec![0; bound]; 4];
    let mut outs: Vec<&mut [u8]> = payloads.iter_mut().map(|f| f.as_mut_slice()).collect();
    let batch: Vec<Compressed> = codec.compress_batch(&inputs, &mut outs).into_iter().map(Result::unwrap).collect();
    for (i, block) in inputs.iter().enumerate() {
        let mut single = vec![0; bound];
        let c = codec.compress(block, &mut single).unwrap();
        assert_eq!(c, batch[i]);
        assert_eq!(&single[..c.len], &payloads[i][..c.len]);
    }
}

#[test]
fn degenerate_blocks_have_defined_results() {
    // One token, constant values, NaN and infinities: no panic, finite or defined output.
    let one = KvShape::kv_2ltd(Dtype::Bf16, 1, 1, 1, 8);
    let constant = KvShape::kv_2ltd(Dtype::F32, 1, 40, 1, 8);
    let weird = KvShape::kv_2ltd(Dtype::F32, 1, 40, 1, 8);
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
            let (payload, compressed) = compress(text, desc, data);
            let (out, decoded) = decode_stored(&desc, &compressed, &payload).unwrap();
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
        let (payload, compressed) = compress(text, desc, &data);
        let (out, decoded) = decode_stored(&desc, &compressed, &payload).unwrap();
        quality::estimate(&desc, &data, &decoded, &out, None).unwrap()
    };
    let lossless = error_of("lossless");
    assert_eq!(lossless.max_error(), 0.0);
    assert_eq!(lossless.mean_lost_mass(), 0.0);
    let errors: Vec<f32> =
        ["quant:bits=8", "quant:bits=4", "quant:bits=2"].iter().map(|t| error_of(t).mean_error()).collect();
    assert!(errors[0] > 0.0, "8 bits cost nothing: {errors:?}");
    assert!(errors[0] < errors[1], "4 bits no worse than 8: {errors:?}");
    assert!(errors[1] < errors[2], "2 bits no worse than 4: {errors:?}");
}

/// Every dropping method keeps nested sets as the keep fraction shrinks, so the attention mass on
/// dropped tokens can only grow; the output error is not monotone in general (renormalised
/// attention over fewer tokens can land closer), but dropping 80% costs more than dropping 20%.
#[test]
fn lost_mass_grows_and_error_appears_as_keep_fraction_shrinks() {
    let synth = Synth::new(2, 128, 2, 64, 22);
    let desc = synth.desc;
    let data = synth.generate();
    let queries = synth.queries(8, 2);
    for method in ["drop-knorm", "drop-keydiff", "drop-streaming", "drop-paged", "drop-snapkv"] {
        for probes in [None, Some(&queries)] {
            let mut seen: Vec<(f32, f32)> = Vec::new();
            for keep in [1.0, 0.8, 0.6, 0.4, 0.2] {
                let spec = CodecSpec::parse(&format!("{method}:keep={keep}")).unwrap();
                let mut codec = CpuCodec::new(spec).unwrap();
                let mut payload = vec![0; codec.max_payload_size(&desc)];
                let block = Block { shape: desc, data: &data, queries: Some(&queries) };
                let compressed = codec.compress(&block, &mut payload).unwrap();
                payload.truncate(compressed.len);
                let (out, decoded) = decode_stored(&desc, &compressed, &payload).unwrap();
                let report = quality::estimate(&desc, &data, &decoded, &out, probes).unwrap();
                seen.push((report.mean_error(), report.mean_lost_mass()));
            }
            let with = if probes.is_some() { "client queries" } else { "derived probes" };
            for pair in seen.windows(2) {
                assert!(pair[1].1 >= pair[0].1 - 1e-6, "{method}, {with}: lost mass shrank: {seen:?}");
            }
            assert_eq!(seen[0], (0.0, 0.0), "{method}, {with}: keeping everything cost something");
            assert!(seen[4].0 > seen[1].0, "{method}, {with}: dropping 80% cost no more than 20%: {seen:?}");
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
    let (payload, compressed) = compress("drop-knorm:keep=0.5", desc, &data);
    let (out, decoded) = decode_stored(&desc, &compressed, &payload).unwrap();
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
        dtype in prop::sample::select(FLOAT_DTYPES.to_vec()),
        spec in prop::sample::select(SPECS.to_vec()),
        seed in any::<u64>(),
    ) {
        let desc = KvShape::kv_2ltd(dtype, layers, tokens, heads, head_dim);
        let spec = CodecSpec::parse(spec).unwrap();
        let (data, out, decoded, _) = round_trip(&spec, desc, seed);
        if spec.drop.is_none() && !matches!(spec.encoding, kvhoard_kernels::Encoding::Quant { .. }) {
            prop_assert!(data == out, "bit-exact codec changed the block");
        }
        prop_assert!(decoded.kept_tokens >= 1, "no token kept");
        prop_assert!(decoded.kept_tokens <= tokens as usize, "more tokens kept than given");
    }

    /// Arbitrary codec parameters and payloads, as a damaged disk could hand them over, on a
    /// stored description: an error or a decoded block, never a panic.
    #[test]
    fn random_bytes_never_panic_the_decoder(
        params in prop::collection::vec(any::<u8>(), 0..120),
        payload in prop::collection::vec(any::<u8>(), 0..400),
    ) {
        let desc = KvShape::kv_2ltd(Dtype::Bf16, 1, 16, 1, 16);
        let meta = kvhoard_format::CompressionMeta { codec_id: 1, codec_version: 1, params };
        let mut out = vec![0u8; desc.raw_size()];
        let _ = CpuCodec::decoder().decode_stored(&desc.desc(), desc.raw_size() as u64, &meta, &payload, &mut out);
    }

    #[test]
    fn damaged_real_blocks_never_panic(in_params in any::<bool>(), index in any::<prop::sample::Index>(), value in any::<u8>()) {
        let desc = KvShape::kv_2ltd(Dtype::Bf16, 1, 16, 1, 16);
        let data = Synth::for_desc(desc, 1).generate();
        let (mut payload, compressed) = compress("drop-paged:keep=0.5,page=4,per-head+quant", desc, &data);
        let mut meta = compressed.meta();
        let target = if in_params { &mut meta.params } else { &mut payload };
        let i = index.index(target.len());
        target[i] = value;
        let mut out = vec![0u8; desc.raw_size()];
        let _ = CpuCodec::decoder().decode_stored(&desc.desc(), desc.raw_size() as u64, &meta, &payload, &mut out);
    }
}
