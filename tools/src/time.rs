//! Times for people: a Unix time in milliseconds as a UTC date and time.

/// `ms` after the Unix epoch as `YYYY-MM-DD HH:MM:SS` in UTC.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let days = secs / 86_400;
    let rem = secs % 86_400;
    let (y, m, d) = civil(days);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// The proleptic Gregorian date `days` after 1970-01-01 (the inverse of counting days from the
/// civil date: shift to eras of 400 years starting in March, where leap days fall last).
fn civil(days: u64) -> (u64, u64, u64) {
    let z = days + 719_468;
    let era = z / 146_097;
    let doe = z % 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + u64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_match_known_instants() {
        assert_eq!(utc(0), "1970-01-01 00:00:00");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00");
        assert_eq!(utc(1_795_913_434_739), "2026-11-29 00:50:34");
        assert_eq!(utc(4_107_542_399_000), "2100-02-28 23:59:59");
        assert_eq!(utc(4_107_542_400_000), "2100-03-01 00:00:00");
    }
}
