//! Namespace policies: each namespace's default codec and whether lossy codecs may be applied in
//! it. Kept in the superblock's unit after its fixed part (offset [`OFFSET`]), in both copies, so
//! they live as long as the volume and survive the loss of either copy
//! (docs/decisions/0005-namespace-policies-live-in-the-superblock.md).
//!
//! Layout: magic `KVHPOLCY`, `len: u32` (bytes of entries), `crc32c: u32` (of the entries), then
//! entries: `namespace_len: u8`, namespace, `flags: u8` (bit 0: lossy allowed; bit 1: settings
//! follow the codec), `codec_len: u16`, the codec spec as text (kvhoard's codec spec syntax,
//! parsed by `kvhoard-kernels`; empty: none), and with bit 1 the namespace's placement settings
//! ([`NsSettings`], docs/decisions/0008-namespace-placement-settings.md): `alpha_us: u64`,
//! `drift_ppm: u64` (each `u64::MAX`: unset), `ttl_budget_bytes: u64` (0: no group TTL),
//! `ttl_groups: u32`, `ttl_window_s: u32` (each 0: the default), `codecs_len: u16` and the allowed
//! codec specs as text, separated by spaces (empty: every codec the planner has).
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
const FLAG_SETTINGS: u8 = 2;
/// A setting of [`NsSettings`] stored as `u64` that is not set.
const UNSET: u64 = u64::MAX;
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
    /// How the placement planner and group TTL treat the namespace (`None`: their defaults).
    pub settings: Option<NsSettings>,
}

/// A namespace's placement settings, as stored (the engine gives them their meaning).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct NsSettings {
    /// The planner's α (seconds of delay a block's whole quality is worth), in microseconds.
    pub alpha_us: Option<u64>,
    /// Quality drift that re-scores a context, in parts per million of its assumed quality.
    pub drift_ppm: Option<u64>,
    /// Group TTL's budget: bytes its TTLs keep stored on average (0: no group TTL).
    pub ttl_budget_bytes: u64,
    /// Group TTL's groups with a TTL of their own (0: the default).
    pub ttl_groups: u32,
    /// Group TTL's window of access history, seconds (0: the default).
    pub ttl_window_s: u32,
    /// The codecs the planner may store the namespace's blocks with, as codec specs separated by
    /// spaces (empty: all of the planner's).
    pub codecs: String,
}

fn opt_u64(v: Option<u64>) -> u64 {
    v.unwrap_or(UNSET)
}

fn u64_opt(v: u64) -> Option<u64> {
    (v != UNSET).then_some(v)
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
        let flags = if p.lossy { FLAG_LOSSY } else { 0 } | if p.settings.is_some() { FLAG_SETTINGS } else { 0 };
        entries.u8(flags);
        entries.u16(codec_len);
        entries.bytes(p.codec.as_bytes());
        if let Some(s) = &p.settings {
            let codecs_len = u16::try_from(s.codecs.len())
                .map_err(|_| FormatError::invalid(WHAT, "codecs", "codec specs too long"))?;
            entries.u64(opt_u64(s.alpha_us));
            entries.u64(opt_u64(s.drift_ppm));
            entries.u64(s.ttl_budget_bytes);
            entries.u32(s.ttl_groups);
            entries.u32(s.ttl_window_s);
            entries.u16(codecs_len);
            entries.bytes(s.codecs.as_bytes());
        }
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
        if flags & !(FLAG_LOSSY | FLAG_SETTINGS) != 0 {
            return Err(FormatError::invalid(WHAT, "flags", format!("unknown flags {flags:#x}")));
        }
        let codec_len = usize::from(r.u16()?);
        let codec = String::from_utf8(r.take(codec_len)?.to_vec())
            .map_err(|_| FormatError::invalid(WHAT, "codec", "not UTF-8"))?;
        let settings = if flags & FLAG_SETTINGS != 0 { Some(settings(&mut r)?) } else { None };
        out.push(NsPolicy { namespace, codec, lossy: flags & FLAG_LOSSY != 0, settings });
    }
    Ok(out)
}

fn settings(r: &mut Reader<'_>) -> Result<NsSettings, FormatError> {
    let alpha_us = u64_opt(r.u64()?);
    let drift_ppm = u64_opt(r.u64()?);
    let ttl_budget_bytes = r.u64()?;
    let ttl_groups = r.u32()?;
    let ttl_window_s = r.u32()?;
    let codecs_len = usize::from(r.u16()?);
    let codecs = String::from_utf8(r.take(codecs_len)?.to_vec())
        .map_err(|_| FormatError::invalid(WHAT, "codecs", "not UTF-8"))?;
    Ok(NsSettings { alpha_us, drift_ppm, ttl_budget_bytes, ttl_groups, ttl_window_s, codecs })
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
            NsPolicy { namespace: "lmcache".into(), codec: "lossless:level=1".into(), lossy: false, settings: None },
            NsPolicy { namespace: "bulk".into(), codec: "quant:bits=4".into(), lossy: true, settings: None },
            NsPolicy { namespace: "plain".into(), codec: String::new(), lossy: false, settings: None },
            NsPolicy {
                namespace: "planned".into(),
                codec: String::new(),
                lossy: true,
                settings: Some(NsSettings {
                    alpha_us: Some(100_000),
                    drift_ppm: None,
                    ttl_budget_bytes: 1 << 30,
                    ttl_groups: 16,
                    ttl_window_s: 0,
                    codecs: "lossless quant:bits=8".into(),
                }),
            },
        ];
        let area = encode(&policies).unwrap();
        assert_eq!(decode(&unit_with(&area)).unwrap(), policies);
        assert!(decode(&vec![0u8; UNIT_BYTES as usize]).unwrap().is_empty());
    }

    #[test]
    fn golden_bytes_of_an_entry_with_settings() {
        let settings = NsSettings {
            alpha_us: Some(50_000),
            drift_ppm: None,
            ttl_budget_bytes: 1 << 30,
            ttl_groups: 16,
            ttl_window_s: 0,
            codecs: "quant".into(),
        };
        let area =
            encode(&[NsPolicy { namespace: "kv".into(), codec: String::new(), lossy: true, settings: Some(settings) }])
                .unwrap();
        let mut entry = vec![2, b'k', b'v', 0b11, 0, 0];
        entry.extend_from_slice(&50_000u64.to_le_bytes());
        entry.extend_from_slice(&u64::MAX.to_le_bytes());
        entry.extend_from_slice(&(1u64 << 30).to_le_bytes());
        entry.extend_from_slice(&16u32.to_le_bytes());
        entry.extend_from_slice(&0u32.to_le_bytes());
        entry.extend_from_slice(&5u16.to_le_bytes());
        entry.extend_from_slice(b"quant");
        assert_eq!(&area[8..12], &(entry.len() as u32).to_le_bytes());
        assert_eq!(&area[16..], &entry[..]);
    }

    #[test]
    fn damage_and_overflow_are_errors() {
        let settings = NsSettings { alpha_us: Some(1), codecs: "quant".into(), ..NsSettings::default() };
        let area =
            encode(&[NsPolicy { namespace: "a".into(), codec: "quant".into(), lossy: true, settings: Some(settings) }])
                .unwrap();
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
                settings: None,
            })
            .collect();
        assert!(encode(&many).is_err());
    }
}
