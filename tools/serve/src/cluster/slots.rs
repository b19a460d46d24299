//! Which of the 16384 slots a key belongs to, exactly as Redis Cluster computes it: CRC16
//! (XMODEM: polynomial 0x1021, initial value 0, no reflection) of the key, or of its hash tag,
//! modulo 16384. Clients compute the same number to pick a node, so any difference would send
//! every request to the wrong node.

/// Slots in a cluster, as in Redis.
pub const SLOTS: u16 = 16384;

/// CRC16-XMODEM lookup table, built at compile time from the polynomial.
#[expect(clippy::indexing_slicing, reason = "evaluated at compile time: an index out of range fails the build")]
const TABLE: [u16; 256] = {
    let mut table = [0u16; 256];
    let mut byte = 0;
    while byte < 256 {
        let mut crc = (byte as u16) << 8;
        let mut bit = 0;
        while bit < 8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
            bit += 1;
        }
        table[byte] = crc;
        byte += 1;
    }
    table
};

/// CRC16 as Redis computes it (`crc16.c`: XMODEM).
pub fn crc16(bytes: &[u8]) -> u16 {
    bytes.iter().fold(0u16, |crc, &b| {
        let index = usize::from(((crc >> 8) as u8) ^ b);
        // `index` is a u8 widened, so it is always inside the 256-entry table.
        let entry = TABLE.get(index).copied().unwrap_or(0);
        (crc << 8) ^ entry
    })
}

/// The part of `key` that is hashed: what lies between the first `{` and the first `}` after
/// it, if that is not empty; otherwise the whole key. `{user}.a` and `{user}.b` thus share a
/// slot, while `{}x` and `x{` hash whole (Redis's rules, `keyHashSlot` in `cluster.c`).
pub fn hash_tag(key: &[u8]) -> &[u8] {
    let Some(open) = key.iter().position(|&b| b == b'{') else {
        return key;
    };
    let after = key.get(open + 1..).unwrap_or_default();
    match after.iter().position(|&b| b == b'}') {
        Some(close) if close > 0 => after.get(..close).unwrap_or(key),
        _ => key,
    }
}

/// The slot of `key`.
pub fn keyslot(key: &[u8]) -> u16 {
    crc16(hash_tag(key)) & (SLOTS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn crc16_matches_the_xmodem_check_value_redis_documents() {
        // The Redis Cluster specification: "the output of CRC16 for '123456789' is 0x31C3".
        assert_eq!(crc16(b"123456789"), 0x31C3);
        assert_eq!(crc16(b""), 0);
    }

    #[test]
    fn keyslots_match_redis() {
        // Values from CLUSTER KEYSLOT on Redis (and redis-py's key_slot).
        for (key, slot) in [
            (&b"foo"[..], 12182),
            (b"bar", 5061),
            (b"hello", 866),
            (b"somekey", 11058),
            (b"", 0),
            (b"{", 4092),
            (b"}", 12090),
        ] {
            assert_eq!(keyslot(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn hash_tags_follow_redis_rules() {
        assert_eq!(keyslot(b"{user1000}.following"), keyslot(b"user1000"));
        assert_eq!(keyslot(b"{user1000}.followers"), 3443);
        // An empty tag hashes the whole key.
        assert_eq!(hash_tag(b"foo{}{bar}"), b"foo{}{bar}");
        assert_eq!(keyslot(b"foo{}{bar}"), 8363);
        // The tag ends at the first `}` after the first `{`.
        assert_eq!(hash_tag(b"foo{{bar}}zap"), b"{bar");
        assert_eq!(keyslot(b"foo{{bar}}zap"), 4015);
        assert_eq!(hash_tag(b"foo{bar}{zap}"), b"bar");
        assert_eq!(keyslot(b"foo{bar}{zap}"), keyslot(b"bar"));
        // No closing brace: the whole key.
        assert_eq!(hash_tag(b"abc{def"), b"abc{def");
        assert_eq!(hash_tag(b"}{x}"), b"x");
    }

    #[test]
    fn every_slot_is_below_16384() {
        for i in 0..100_000u32 {
            assert!(keyslot(format!("k{i}").as_bytes()) < SLOTS);
        }
    }
}
