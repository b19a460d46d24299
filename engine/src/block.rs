//! What a read returns: a block's bytes, where they lie, and its description.

use std::ops::Deref;
use std::sync::Arc;

use kvhoard_format::record::RecordHeader;
use kvhoard_format::{BlockDesc, CompressionMeta};

use crate::buffer::PooledBuf;
use crate::log::Loc;

/// What a stored block is, from its record header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMeta {
    /// blake3 of the raw bytes.
    pub content_hash: [u8; 32],
    /// Length of the raw bytes.
    pub raw_len: u64,
    /// Length of the stored bytes.
    pub stored_len: u64,
    /// What the raw bytes are.
    pub desc: BlockDesc,
    /// How the stored bytes encode them.
    pub compression: CompressionMeta,
    /// When the block record was written.
    pub created_unix_ms: u64,
    /// TTL of the block record, in seconds (0 = none).
    pub ttl_secs: u32,
    /// Group, if known.
    pub group_id: Option<u64>,
    /// Parent block, if known.
    pub parent_hash: Option<[u8; 32]>,
    /// Where the block record is.
    pub location: Loc,
}

impl BlockMeta {
    /// The codec the block is stored with, as a codec spec (`raw` when it is stored as it is;
    /// `codec-N` for a codec this build does not know).
    pub fn codec(&self) -> String {
        codec_name(&self.desc, self.raw_len, &self.compression)
    }

    /// The description a block record's header gives, the record being at `location`.
    pub(crate) fn of(h: RecordHeader, location: Loc) -> BlockMeta {
        BlockMeta {
            content_hash: h.content_hash,
            raw_len: h.raw_len,
            stored_len: h.stored_len,
            desc: h.desc,
            compression: h.compression,
            created_unix_ms: h.created_unix_ms,
            ttl_secs: h.ttl_secs,
            group_id: h.group_id,
            parent_hash: h.parent_hash,
            location,
        }
    }
}

/// The codec a block described by `desc` (`raw_len` original bytes) with codec area
/// `compression` is stored with, as a codec spec (`raw` when it is stored as it is; `codec-N`
/// for a codec this build does not know).
pub fn codec_name(desc: &BlockDesc, raw_len: u64, compression: &CompressionMeta) -> String {
    if compression.is_none() {
        return "raw".into();
    }
    match crate::codec::spec_of(desc, raw_len, compression) {
        Some(spec) => spec.to_string(),
        None => CompressionMeta::codec_name(compression.codec_id),
    }
}

/// The buffer a block's bytes lie in: read for this call, or shared (with the DRAM tier, or with
/// the write still in flight).
pub(crate) enum Bytes {
    /// Read into a buffer of its own.
    Owned(PooledBuf),
    /// Shared with the DRAM tier or a pending write.
    Shared(Arc<PooledBuf>),
}

impl Bytes {
    pub(crate) fn as_slice(&self) -> &[u8] {
        match self {
            Bytes::Owned(b) => b,
            Bytes::Shared(b) => b,
        }
    }
}

/// A block read from the store: its stored bytes (deref to `[u8]`) and its description. The
/// bytes stay in the buffer they were read into; no copy is made.
pub struct Block {
    bytes: Bytes,
    start: usize,
    len: usize,
    /// The block's description.
    pub meta: BlockMeta,
}

impl Block {
    /// The `len` bytes at `start` of `bytes`.
    pub(crate) fn new(bytes: Bytes, start: usize, len: usize, meta: BlockMeta) -> Block {
        Block { bytes, start, len, meta }
    }
}

impl Deref for Block {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        self.bytes.as_slice().get(self.start..self.start + self.len).unwrap_or_default()
    }
}

impl std::fmt::Debug for Block {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Block").field("len", &self.len).field("meta", &self.meta).finish()
    }
}
