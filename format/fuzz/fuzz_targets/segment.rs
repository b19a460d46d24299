//! Segment headers, summary trailers, summaries and superblocks never panic on any input.
#![no_main]

use kvhoard_format::segment::{SegmentHeader, SummaryTrailer};
use kvhoard_format::summary;
use kvhoard_format::superblock::Superblock;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = SegmentHeader::decode(data);
    let _ = SummaryTrailer::decode(data, 16384);
    let _ = Superblock::decode(data);
    if data.len() >= 4 {
        let count = u32::from_le_bytes([data[0], data[1], data[2], data[3]]);
        let body = &data[4..];
        let _ = summary::decode(body, count, crc32c(body));
    }
});

fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 { (crc >> 1) ^ 0x82F6_3B78 } else { crc >> 1 };
        }
    }
    !crc
}
