//! The on-disk format of a kvhoard volume, as pure code: no I/O, no allocation from an unchecked
//! length, no panics on any input.
//!
//! A volume is one file or one block device:
//!
//! ```text
//! 0        4 KiB      8 KiB            data_offset
//! | super A | super B | checkpoint slots | segment 0 | segment 1 | ... | segment N-1 |
//! ```
//!
//! Each segment is a fixed-size append-only log: a header unit, 4 KiB-aligned records, and, once
//! sealed, a summary of its records ending in a trailer in the segment's last unit. Every
//! persisted structure has a magic, a version and a crc32c; every decoder validates all of them
//! and returns a typed [`FormatError`]. `docs/format.md` specifies every byte; the golden-byte
//! tests beside each module keep that document and these constants in step.

#![deny(missing_docs)]
#![deny(clippy::unwrap_used, clippy::expect_used, clippy::indexing_slicing, clippy::panic)]

pub mod bytes;
pub mod checkpoint;
pub mod desc;
mod error;
pub mod hex;
pub mod policy;
pub mod record;
pub mod segment;
pub mod summary;
pub mod superblock;

pub use desc::{BlockDesc, Dtype, Layout};
pub use error::FormatError;
pub use record::CompressionMeta;

/// The unit of alignment and allocation on disk: every record, header and segment starts on a
/// multiple of this, so the log can be read and written with O_DIRECT.
pub const UNIT_BYTES: u64 = 4096;

/// `text` quoted for a message, cut after 64 characters (with its length in bytes then): a key,
/// namespace or cursor too long to be one is named, not echoed whole.
pub fn quoted_short(text: &str) -> String {
    match text.char_indices().nth(64) {
        Some((at, _)) => format!("{:?}... ({} bytes)", text.get(..at).unwrap_or_default(), text.len()),
        None => format!("{text:?}"),
    }
}

/// Rounds `n` up to the next multiple of [`UNIT_BYTES`]; `None` on overflow.
pub fn align_up(n: u64) -> Option<u64> {
    n.checked_add(UNIT_BYTES - 1).map(|v| v & !(UNIT_BYTES - 1))
}

/// crc32c of `parts` concatenated.
pub(crate) fn crc32c_of(parts: &[&[u8]]) -> u32 {
    parts.iter().fold(0, |crc, part| crc32c::crc32c_append(crc, part))
}

const _: () = assert!(UNIT_BYTES.is_power_of_two());

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn align_up_rounds_to_units() {
        assert_eq!(align_up(0), Some(0));
        assert_eq!(align_up(1), Some(4096));
        assert_eq!(align_up(4096), Some(4096));
        assert_eq!(align_up(4097), Some(8192));
        assert_eq!(align_up(u64::MAX), None);
    }
}
