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

/// The bytes that hex digits (in either case) spell; whitespace between them is ignored, so
/// that a dump written in words reads back. `None` for anything else, or an odd digit count.
pub fn decode(text: &str) -> Option<Vec<u8>> {
    let digits: Vec<u8> = text.bytes().filter(|b| !b.is_ascii_whitespace()).collect();
    if !digits.len().is_multiple_of(2) {
        return None;
    }
    digits.chunks_exact(2).map(|pair| Some((digit(*pair.first()?)? << 4) | digit(*pair.get(1)?)?)).collect()
}

/// A 32-byte hash (a blake3 content hash) from its 64 hex digits, in either case.
pub fn decode_hash(text: &str) -> Option<[u8; 32]> {
    if text.len() != 64 {
        return None;
    }
    decode(text)?.try_into().ok()
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
        assert_eq!(decode("0a ff\n10"), Some(vec![0x0a, 0xff, 0x10]));
        assert_eq!(decode("abc"), None);
    }
}
