//! Namespace policies: each namespace's default codec and whether lossy codecs may be applied in
//! it. Kept in the superblock's unit after its fixed part (offset [`OFFSET`]), in both copies, so
//! they live as long as the volume and survive the loss of either copy
//! (docs/decisions/0005-namespace-policies-live-in-the-superblock.md).
//!
//! Layout: magic `KVHPOLCY`, `len: u32` (bytes of entries), `crc32c: u32` (of the entries), then
//! entries: `namespace_len: u8`, namespace, `flags: u8` (bit 0: lossy allowed), `codec_len: u16`,
//! the codec spec as text (kvhoard's codec spec syntax, parsed by `kvhoard-kernels`; empty: none).
//! An area of zeros is no policies.

use crate::bytes::{Reader, Writer};
use crate::record::validate_namespace;
use crate::{FormatError, UNIT_BYTES};

/// Offset of the policy area in a superblock unit.
pub const OFFSET: usize = 128;
/// Magic of the policy area.
pub const MAGIC: [u8; 8] = *b"KVHPOLCY";
/// Bytes the policy area may take.
pub const AREA_BYTES: usize = UNIT_BYTES as usize - OFFSET;
const FLAG_LOSSY: u8 = 1;
const WHAT: &str = "namespace policies";

/// One namespace's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NsPolicy {
    /// The namespace.
    pub namespace: String,
    /// Default codec spec for blocks stored without one (empty: store them as they are).
    pub codec: String,
    /// Whether lossy codecs (quantization, token dropping) may be applied in this namespace.
    pub lossy: bool,
}

/// Encodes `policies` into the area's bytes; fails if they do not fit.
pub fn encode(policies: &[NsPolicy]) -> Result<Vec<u8>, FormatError> {
    let mut entries = Writer::with_capacity(256);
    for p in policies {
        validate_namespace(&p.namespace)?;
        let ns_len = u8::try_from(p.namespace.len())
            .map_err(|_| FormatError::invalid(WHAT, "namespace", "longer than 255 bytes"))?;
        let codec_len =
            u16::try_from(p.codec.len()).map_err(|_| FormatError::invalid(WHAT, "codec", "spec too long"))?;
        entries.u8(ns_len);
        entries.bytes(p.namespace.as_bytes());
        entries.u8(if p.lossy { FLAG_LOSSY } else { 0 });
        entries.u16(codec_len);
        entries.bytes(p.codec.as_bytes());
    }
    let body = entries.buf;
    if 16 + body.len() > AREA_BYTES {
        return Err(FormatError::invalid(
            WHAT,
            "len",
            format!("{} bytes of policies, at most {} fit", body.len(), AREA_BYTES - 16),
        ));
    }
    let mut w = Writer::with_capacity(AREA_BYTES);
    w.bytes(&MAGIC);
    w.u32(body.len() as u32);
    w.u32(crate::crc32c_of(&[&body]));
    w.bytes(&body);
    Ok(w.buf)
}

/// Decodes the policy area of a superblock unit: `Ok(empty)` if it holds none (zeros), an error
/// if it is damaged.
pub fn decode(unit: &[u8]) -> Result<Vec<NsPolicy>, FormatError> {
    let area = unit.get(OFFSET..).unwrap_or_default();
    if area.get(..8).is_none_or(|m| m.iter().all(|&b| b == 0)) {
        return Ok(Vec::new());
    }
    let mut r = Reader::new(WHAT, area);
    crate::bytes::check_magic(WHAT, r.take(8)?, &MAGIC)?;
    let len = r.u32()? as usize;
    let crc = r.u32()?;
    let body = r.take(len)?;
    crate::bytes::check_crc(WHAT, crc, &[body])?;
    let mut r = Reader::new(WHAT, body);
    let mut out = Vec::new();
    while r.remaining() > 0 {
        let ns_len = usize::from(r.u8()?);
        let namespace = String::from_utf8(r.take(ns_len)?.to_vec())
            .map_err(|_| FormatError::invalid(WHAT, "namespace", "not UTF-8"))?;
        validate_namespace(&namespace)?;
        let flags = r.u8()?;
        if flags & !FLAG_LOSSY != 0 {
            return Err(FormatError::invalid(WHAT, "flags", format!("unknown flags {flags:#x}")));
        }
        let codec_len = usize::from(r.u16()?);
        let codec = String::from_utf8(r.take(codec_len)?.to_vec())
            .map_err(|_| FormatError::invalid(WHAT, "codec", "not UTF-8"))?;
        out.push(NsPolicy { namespace, codec, lossy: flags & FLAG_LOSSY != 0 });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::indexing_slicing)]
    use super::*;

    fn unit_with(area: &[u8]) -> Vec<u8> {
        let mut unit = vec![0u8; UNIT_BYTES as usize];
        unit[OFFSET..OFFSET + area.len()].copy_from_slice(area);
        unit
    }

    #[test]
    fn policies_round_trip_and_zeros_are_none() {
        let policies = vec![
            NsPolicy { namespace: "lmcache".into(), codec: "lossless:level=1".into(), lossy: false },
            NsPolicy { namespace: "bulk".into(), codec: "quant:bits=4".into(), lossy: true },
            NsPolicy { namespace: "plain".into(), codec: String::new(), lossy: false },
        ];
        let area = encode(&policies).unwrap();
        assert_eq!(decode(&unit_with(&area)).unwrap(), policies);
        assert!(decode(&vec![0u8; UNIT_BYTES as usize]).unwrap().is_empty());
    }

    #[test]
    fn damage_and_overflow_are_errors() {
        let area = encode(&[NsPolicy { namespace: "a".into(), codec: "quant".into(), lossy: true }]).unwrap();
        for at in 0..area.len() {
            let mut bad = area.clone();
            bad[at] ^= 0x40;
            assert!(decode(&unit_with(&bad)).is_err(), "a flip at {at} went unnoticed");
        }
        // Each entry takes 34 bytes: more than the area holds.
        let many: Vec<NsPolicy> = (0..AREA_BYTES / 34 + 1)
            .map(|i| NsPolicy {
                namespace: format!("namespace-{i:04}"),
                codec: "lossless:level=1".into(),
                lossy: false,
            })
            .collect();
        assert!(encode(&many).is_err());
    }
}
