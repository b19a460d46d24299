use thiserror::Error;

/// Why a byte sequence is not a valid kvhoard structure.
///
/// Every variant names the structure (`what`) so that a message read by an operator says which
/// part of the volume is damaged.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum FormatError {
    /// The input ends before the structure does.
    #[error("{what}: truncated: need {needed} bytes, have {available}")]
    Truncated {
        /// The structure being decoded.
        what: &'static str,
        /// Bytes the structure needs.
        needed: u64,
        /// Bytes that were available.
        available: u64,
    },
    /// The magic number is wrong: this is not the structure it was expected to be.
    #[error("{what}: bad magic {found:02x?}: not a kvhoard {what}")]
    BadMagic {
        /// The structure being decoded.
        what: &'static str,
        /// The bytes found where the magic belongs.
        found: Vec<u8>,
    },
    /// The structure was written by an older version this build no longer uses (it is rebuilt
    /// from what it summarises).
    #[error("{what}: written in format version {found}, which this build no longer uses (it writes {current})")]
    Outdated {
        /// The structure being decoded.
        what: &'static str,
        /// The version found on disk.
        found: u32,
        /// The version this build writes.
        current: u32,
    },
    /// The structure was written by a format version this build does not understand.
    #[error("{what}: format version {found} is not supported (this build reads up to {supported}); upgrade kvhoard")]
    UnsupportedVersion {
        /// The structure being decoded.
        what: &'static str,
        /// The version found on disk.
        found: u32,
        /// The newest version this build reads.
        supported: u32,
    },
    /// A checksum does not match the bytes it guards.
    #[error("{what}: checksum mismatch: stored {stored:#010x}, computed {computed:#010x}")]
    ChecksumMismatch {
        /// The structure being decoded.
        what: &'static str,
        /// The checksum stored on disk.
        stored: u32,
        /// The checksum computed over the bytes read.
        computed: u32,
    },
    /// A field holds a value outside its documented range.
    #[error("{what}: invalid {field}: {detail}")]
    InvalidField {
        /// The structure being decoded.
        what: &'static str,
        /// The field name, as in docs/format.md.
        field: &'static str,
        /// What is wrong with it.
        detail: String,
    },
}

impl FormatError {
    pub(crate) fn invalid(what: &'static str, field: &'static str, detail: impl Into<String>) -> Self {
        FormatError::InvalidField { what, field, detail: detail.into() }
    }
}
