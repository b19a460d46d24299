//! Checkpoints never panic or allocate from an unchecked count; whatever decodes round-trips.
#![no_main]

use kvhoard_format::checkpoint::Checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(cp) = Checkpoint::decode(data) {
        assert_eq!(Checkpoint::decode(&cp.encode()).ok(), Some(cp));
    }
});
