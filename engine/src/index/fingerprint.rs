//! Fingerprints: how the index names keys and blocks without holding their strings.

use kvhoard_format::record::{reading_of, RecordHeader};
use kvhoard_format::{BlockDesc, CompressionMeta};

/// Fingerprint of a (namespace, key) pair.
pub(crate) type KeyFp = [u8; 16];
/// Fingerprint of a stored block: (namespace, content hash, how the bytes are read). Identical
/// bytes with the same description and codec in one namespace share it; see [`content_fp`].
pub(crate) type ContentFp = [u8; 16];

/// A key of a namespace, as the engine names it: 128 bits of the blake3 of the namespace and the
/// key. What reclaim reports when it drops keys ([`crate::placement::Placement::dropped`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct KeyId(pub(crate) KeyFp);

impl KeyId {
    /// The id of `key` in `namespace`.
    pub fn new(namespace: &str, key: &str) -> KeyId {
        KeyId(key_fp(namespace, key))
    }
}

/// Fingerprint of a key in a namespace.
pub(crate) fn key_fp(namespace: &str, key: &str) -> KeyFp {
    fp(&[namespace.as_bytes(), &[0], key.as_bytes()])
}

/// Fingerprint of a group of a namespace (the blocks a client put with one group id).
pub(crate) fn group_fp(namespace: &str, group: u64) -> KeyFp {
    fp(&[namespace.as_bytes(), &[2], &group.to_le_bytes()])
}

/// Fingerprint of a block in a namespace. Namespaces never share a fingerprint, so they never
/// share storage. Nor do blocks whose bytes are equal but whose descriptions or codecs differ
/// ([`kvhoard_format::record::reading_of`]): a key's description is its own, so a put of bytes
/// already stored under another description stores them again.
///
/// The first 8 bytes depend on the namespace and the content hash alone, the last 8 on the
/// description and codec too. The index hashes fingerprints by their first 8 bytes, so every
/// block with given bytes sits in one probe sequence and [`bytes_prefix`] finds them by hash
/// alone (`get_by_hash`), at no memory cost.
pub(crate) fn content_fp(
    namespace: &str,
    hash: &[u8; 32],
    desc: &BlockDesc,
    compression: &CompressionMeta,
) -> ContentFp {
    let reading = reading_of(desc, compression);
    let variant = fp(&[namespace.as_bytes(), &[2], hash, &reading]);
    let mut out = [0u8; 16];
    let (head, tail) = out.split_at_mut(8);
    head.copy_from_slice(&bytes_prefix(namespace, hash));
    tail.copy_from_slice(variant.split_at(8).0);
    out
}

/// Fingerprint of the block a record header describes (a block record, or the block a link
/// names).
pub(crate) fn header_fp(h: &RecordHeader) -> ContentFp {
    content_fp(&h.namespace, &h.content_hash, &h.desc, &h.compression)
}

/// The first 8 bytes of the fingerprint of every block of `namespace` whose content hash is `hash`.
pub(crate) fn bytes_prefix(namespace: &str, hash: &[u8; 32]) -> [u8; 8] {
    let whole = fp(&[namespace.as_bytes(), &[1], hash]);
    let mut out = [0u8; 8];
    out.copy_from_slice(whole.split_at(8).0);
    out
}

fn fp(parts: &[&[u8]]) -> [u8; 16] {
    let mut h = blake3::Hasher::new();
    parts.iter().for_each(|p| {
        h.update(p);
    });
    let mut out = [0u8; 16];
    out.copy_from_slice(h.finalize().as_bytes().get(..16).unwrap_or(&[0; 16]));
    out
}

/// The hash table hash of a fingerprint (its first 8 bytes: it is already uniform).
pub(crate) fn hash_of(fp: &[u8; 16]) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(fp.get(..8).unwrap_or(&[0; 8]));
    u64::from_le_bytes(b)
}
