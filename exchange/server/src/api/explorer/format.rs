//! Values as text, before any markup: times as UTC calendar dates, cost terms as short decimals,
//! ids safe in an `id` attribute and a CSS selector, and values percent-encoded for a URL's
//! query. Escaping for HTML is not here: the templates (maud) do it wherever a value is spliced.

use std::fmt::Write as _;

/// Percent-encodes a value for a URL's query string (RFC 3986 unreserved characters kept).
pub(crate) fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// A token safe in an `id` attribute and a CSS selector: ASCII letters, digits and `-`, every
/// other character as `-`, lowercased.
pub(crate) fn id_token(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Unix seconds as [`time_ms`] does.
pub(crate) fn time_s(s: u64) -> String {
    time_ms(
        i64::try_from(s)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000),
    )
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, exact for every `i64` day this page will see).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A float for a cost term: four significant decimals, no exponent for ordinary magnitudes.
pub(crate) fn num(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x.abs() >= 1e-4 && x.abs() < 1e15 {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_owned()
    } else {
        format!("{x:.4e}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_values_and_ids_keep_only_safe_characters() {
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(id_token("Llama-3.1 8B"), "llama-3-1-8b");
    }

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(time_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(time_s(1_798_761_599), "2026-12-31 23:59:59 UTC");
    }
}
