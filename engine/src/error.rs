use std::path::PathBuf;

use kvhoard_format::FormatError;
use thiserror::Error;

use crate::device::DeviceError;

/// Everything that can go wrong in the engine. Messages say what is wrong and what to do.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The device failed.
    #[error("device I/O failed: {0}")]
    Device(#[from] DeviceError),
    /// A file beside the volume (lock, checkpoint) could not be used.
    #[error("{action} {path}: {source}")]
    File {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// The path does not hold a kvhoard volume.
    #[error("{path} is not a kvhoard volume: {reason}; create one with `kvhoard init`")]
    NotAVolume {
        /// The path given.
        path: PathBuf,
        /// Why not.
        reason: String,
    },
    /// The volume is damaged in a way opening it cannot settle on its own.
    #[error("{path} is damaged: {reason}; run `kvhoard fsck --repair {path}`")]
    Damaged {
        /// The path given.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// `create` was asked to overwrite an existing volume.
    #[error("{path} already holds a kvhoard volume; open it, or remove it first")]
    AlreadyExists {
        /// The path given.
        path: PathBuf,
    },
    /// Another process has the volume open.
    #[error("{path} is open in another process; stop it first (the lock is released when that process exits)")]
    Locked {
        /// The volume's data file or device.
        path: PathBuf,
    },
    /// Both superblock copies are damaged, or the format is newer than this build.
    #[error("cannot open the volume: {0}")]
    Superblock(FormatError),
    /// A caller-supplied value is out of range.
    #[error("invalid {what}: {detail}")]
    InvalidArgument {
        /// Which argument.
        what: &'static str,
        /// What is wrong with it.
        detail: String,
    },
    /// A block is too large for one segment.
    #[error("a block of {bytes} bytes does not fit in a segment (at most {max_bytes} bytes); create the volume with a larger --segment-size")]
    BlockTooLarge {
        /// The block's size.
        bytes: u64,
        /// The largest block a segment holds.
        max_bytes: u64,
    },
    /// A caller's buffer cannot hold the block.
    #[error("buffer of {got} bytes is too small for a block of {needed} bytes")]
    BufferTooSmall {
        /// Bytes needed.
        needed: u64,
        /// Bytes given.
        got: u64,
    },
    /// The block was stored with tokens (or pages) dropped: it is served only to callers that
    /// take the kept positions with it.
    #[error("{key:?} was stored with tokens dropped ({codec}): read it with get_kv, which returns the kept token positions too")]
    TokensDropped {
        /// The key.
        key: String,
        /// Its codec.
        codec: String,
    },
    /// The block's codec is one this build cannot decode.
    #[error("cannot decode {key:?}: {reason}")]
    Codec {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// An earlier write or sync failed; the store refuses writes until it is reopened, because
    /// it can no longer tell what reached the disk.
    #[error("writes are refused after an earlier I/O error ({reason}); reopen the volume to recover")]
    Poisoned {
        /// The first failure.
        reason: String,
    },
    /// The store was closed.
    #[error("the store is closed")]
    Closed,
}

impl StoreError {
    pub(crate) fn invalid(what: &'static str, detail: impl Into<String>) -> Self {
        StoreError::InvalidArgument { what, detail: detail.into() }
    }
}

impl From<FormatError> for StoreError {
    fn from(e: FormatError) -> Self {
        match e {
            FormatError::InvalidField { what: w @ ("key" | "namespace"), detail, .. } => {
                StoreError::InvalidArgument { what: w, detail }
            }
            FormatError::InvalidField { field, detail, .. } => StoreError::InvalidArgument { what: field, detail },
            other => StoreError::InvalidArgument { what: "block", detail: other.to_string() },
        }
    }
}

/// Result with a [`StoreError`].
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
