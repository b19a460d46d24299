//! Decoding a stored block from what a damaged disk could hold: a description, a record header's
//! codec area and a payload, all arbitrary. Never panics; whatever decodes fills exactly the
//! bytes its shape says.
#![no_main]

use kvhoard_format::{BlockDesc, CompressionMeta, Dtype, Layout};
use kvhoard_kernels::CpuCodec;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let [dtype, layout, a, b, c, d, split, rest @ ..] = data else { return };
    let Ok(dtype) = Dtype::from_code(*dtype % 8) else { return };
    let Ok(layout) = Layout::from_code(*layout % 3) else { return };
    // Small dimensions keep the decoded block small.
    let dims = [2u64, u64::from(*a % 5), u64::from(*b % 40), u64::from(*c % 9), u64::from(*d % 17)];
    let shape = match layout {
        Layout::Kv2Ltd => dims[..4].to_vec(),
        Layout::VllmPaged => dims.to_vec(),
        _ => vec![u64::from(*a)],
    };
    let desc = BlockDesc { dtype, layout, shape };
    let Some(raw_len) = desc.shape_bytes() else { return };
    let (params, payload) = rest.split_at(usize::from(*split).min(rest.len()));
    let meta = CompressionMeta { codec_id: CompressionMeta::CODEC_KV, codec_version: 1, params: params.to_vec() };
    let mut out = vec![0u8; raw_len as usize];
    if let Ok(decoded) = CpuCodec::decoder().decode_stored(&desc, raw_len, &meta, payload, &mut out) {
        assert!(decoded.len <= out.len());
        assert_eq!(decoded.len, decoded.shape.raw_size());
    }
});
