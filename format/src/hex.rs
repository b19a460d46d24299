//! Hexadecimal text for hashes and bytes, as every tool prints and parses them.

/// Lower-case hex digits of `bytes`.
pub fn encode(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(out, "{b:02x}");
    }
    out
}

/// A 32-byte hash (a blake3 content hash) from its 64 hex digits, in either case.
pub fn decode_hash(text: &str) -> Option<[u8; 32]> {
    let digits = text.as_bytes();
    if digits.len() != 64 {
        return None;
    }
    let mut out = [0u8; 32];
    for (o, pair) in out.iter_mut().zip(digits.chunks_exact(2)) {
        let [hi, lo] = pair else { return None };
        *o = (digit(*hi)? << 4) | digit(*lo)?;
    }
    Some(out)
}

fn digit(c: u8) -> Option<u8> {
    char::from(c).to_digit(16).and_then(|d| u8::try_from(d).ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hashes_round_trip() {
        let hash: [u8; 32] = std::array::from_fn(|i| (i * 37) as u8);
        let text = encode(&hash);
        assert_eq!(text.len(), 64);
        assert_eq!(decode_hash(&text), Some(hash));
        assert_eq!(decode_hash(&text.to_uppercase()), Some(hash));
        assert_eq!(encode(&[0x0f, 0xa0]), "0fa0");
    }

    #[test]
    fn malformed_hashes_are_refused() {
        assert_eq!(decode_hash(""), None);
        assert_eq!(decode_hash(&"0".repeat(63)), None);
        assert_eq!(decode_hash(&"g".repeat(64)), None);
        assert_eq!(decode_hash(&"é".repeat(32)), None);
    }
}
