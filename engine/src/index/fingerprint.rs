//! Fingerprints: how the index names keys and blocks without holding their strings.

/// Fingerprint of a (namespace, key) pair.
pub(crate) type KeyFp = [u8; 16];
/// Fingerprint of a (namespace, content hash) pair: identical bytes in one namespace share it.
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

/// Fingerprint of a content hash in a namespace. Namespaces never share a fingerprint, so they
/// never share storage.
pub(crate) fn content_fp(namespace: &str, hash: &[u8; 32]) -> ContentFp {
    fp(&[namespace.as_bytes(), &[1], hash])
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
