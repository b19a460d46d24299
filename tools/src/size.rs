//! Human sizes on the command line: `4096`, `64KiB`, `64MiB`, `10GiB`, `1.5TB`.
//!
//! K, M, G, T (with or without `iB`) are powers of 1024; `KB`, `MB`, `GB`, `TB` powers of 1000.

/// Parses a size; the error says what is accepted.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size: use a number with an optional unit, like 64MiB or 10GiB"))?;
    let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kib" => 1 << 10,
        "m" | "mib" => 1 << 20,
        "g" | "gib" => 1 << 30,
        "t" | "tib" => 1 << 40,
        "kb" => 1_000,
        "mb" => 1_000_000,
        "gb" => 1_000_000_000,
        "tb" => 1_000_000_000_000,
        other => {
            return Err(format!(
                "unknown unit {other:?} in {s:?}: use B, KiB, MiB, GiB, TiB (or KB, MB, GB, TB for powers of 1000)"
            ))
        }
    };
    let too_large = || format!("{s:?} is too large: a size is at most 16 EiB (2^64 - 1 bytes)");
    // Whole numbers exactly, past what an f64 holds exactly.
    if let Ok(n) = num.parse::<u64>() {
        return n.checked_mul(mult).ok_or_else(too_large);
    }
    let bytes = value * mult as f64;
    // u64::MAX as f64 rounds up to 2^64, so the bound is strict.
    if !bytes.is_finite() || bytes >= u64::MAX as f64 {
        return Err(too_large());
    }
    if bytes.fract() != 0.0 {
        return Err(format!("{s:?} is not a whole number of bytes"));
    }
    Ok(bytes as u64)
}

/// Formats bytes for people: `1.5 GiB`.
pub fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = UNITS[0];
    for u in &UNITS[1..] {
        if v < 1024.0 {
            break;
        }
        v /= 1024.0;
        unit = u;
    }
    if unit == "B" {
        format!("{bytes} B")
    } else {
        format!("{v:.1} {unit}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_binary_and_decimal_units() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64MiB"), Ok(64 << 20));
        assert_eq!(parse_size("64m"), Ok(64 << 20));
        assert_eq!(parse_size("10GiB"), Ok(10 << 30));
        assert_eq!(parse_size("1.5GiB"), Ok(3 << 29));
        assert_eq!(parse_size("2GB"), Ok(2_000_000_000));
        assert!(parse_size("ten").is_err());
        assert!(parse_size("5 parsecs").unwrap_err().contains("unknown unit"));
        assert!(parse_size("0.3B").unwrap_err().contains("whole number"));
        assert_eq!(parse_size("18446744073709551615"), Ok(u64::MAX));
        assert!(parse_size("99999999TiB").unwrap_err().contains("too large"));
        assert!(parse_size("1e300").is_err());
        assert!(parse_size("99999999999999999999.5").unwrap_err().contains("too large"));
    }

    #[test]
    fn formats_for_people() {
        assert_eq!(human(512), "512 B");
        assert_eq!(human(64 << 20), "64.0 MiB");
        assert_eq!(human(3 << 29), "1.5 GiB");
    }
}
