//! Record headers: decoding arbitrary bytes never panics, and whatever decodes re-encodes to the
//! same bytes.
#![no_main]

use kvhoard_format::record::RecordHeader;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(h) = RecordHeader::decode(data) {
        let enc = h.encode();
        assert_eq!(&data[..enc.len()], &enc[..]);
        assert_eq!(RecordHeader::decode(&enc).ok(), Some(h));
    }
});
