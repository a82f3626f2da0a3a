//! Prices: one unit on the wire, in the books and at every gate.
//!
//! Every price is an integer in the settlement asset's smallest unit, called *wei* whatever the
//! asset's decimals:
//! - a provider's **ask** and the market's **quote**: wei per compute-second (`*_wei_per_s`,
//!   `u64`: 2⁶⁴ wei/s is 18 whole units per second even of an 18-decimal asset, and a rate that
//!   fits in a register keeps the clearing hot path in cache);
//! - a buyer's **limit**: a total in wei for the whole job (`max_price_wei`, `u128`);
//! - a job's **charge** on a bundle: the ask times the job's compute-seconds, rounded up to the
//!   wei ([`charge_wei`], `u128`), so a gate `charge ≤ limit` compares two integers exactly.
//!
//! Floats live only inside the objective and the market maker, which count in whole units of the
//! asset, and in times; they convert here, once, and nowhere else, exactly from the decimal a
//! float was written as (its shortest round-trip form: `0.5076` units an hour is 141 wei/s, not
//! the 142 a double's product rounds up to) ([`to_units`], [`to_wei`], [`wei_per_s_from_units_per_hour`], [`scale_wei`]).
//! Asks and charges round up (a provider is never paid less than it asked); bids round down.
//!
//! ```
//! use cx_protocol::price::{self, Rounding, WEI_PER_UNIT};
//!
//! // 1.2 units per hour, as an ask per compute-second, rounded up to the wei.
//! let ask = price::wei_per_s_from_units_per_hour(1.2, Rounding::Up).unwrap();
//! assert_eq!(ask, 334);
//! // Six compute-seconds at that ask.
//! assert_eq!(price::charge_wei(ask, 6.0), 2004);
//! assert_eq!(price::to_units(WEI_PER_UNIT), 1.0);
//! ```

use serde::{Deserialize, Deserializer, Serializer};

/// Decimals of the settlement asset: the devnet's `TestStablecoin` and the USD stablecoins it
/// stands in for have 6, so one wei is a micro unit.
pub const ASSET_DECIMALS: u32 = 6;

/// Wei in one whole unit of the asset.
pub const WEI_PER_UNIT: u64 = 10u64.pow(ASSET_DECIMALS);

const MICROS_PER_S: u64 = 1_000_000;

/// A rate in wei as whole units of the asset, for the objective and the market maker.
pub fn to_units(wei: u64) -> f64 {
    wei as f64 / WEI_PER_UNIT as f64
}

/// Which way a float price rounds to the wei: asks and charges up (a provider is never paid less
/// than it asked), bids down (rounding never narrows a spread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rounding {
    /// Towards +∞.
    Up,
    /// Towards zero.
    Down,
}

/// A price per hour in whole units (what people, older inputs and the market maker's model
/// write) as wei per compute-second, exactly from the decimal written ([`written`]): 0.5076
/// units an hour is 141 wei/s, not the 142 a double's 141.00000000000003 rounds up to. `None`
/// unless finite and not negative; rates beyond `u64` saturate.
pub fn wei_per_s_from_units_per_hour(units_per_hour: f64, rounding: Rounding) -> Option<u64> {
    let wei = exact(
        written(finite_non_negative(units_per_hour)?),
        u128::from(WEI_PER_UNIT),
        3_600,
        rounding,
    );
    Some(u64::try_from(wei).unwrap_or(u64::MAX))
}

/// A rate × `factor`, rounded once the stated way (a tenant's preference applied to a quote),
/// exactly from the decimal `factor` is; `None` unless `factor` is finite and not negative. Rates
/// beyond `u64` saturate.
pub fn scale_wei(wei: u64, factor: f64, rounding: Rounding) -> Option<u64> {
    let scaled = exact(
        written(finite_non_negative(factor)?),
        u128::from(wei),
        1,
        rounding,
    );
    Some(u64::try_from(scaled).unwrap_or(u64::MAX))
}

/// Whole units as a total in wei, rounded the stated way, exactly from the decimal written;
/// `None` unless finite and not negative. Values beyond `u128` saturate.
pub fn to_wei(units: f64, rounding: Rounding) -> Option<u128> {
    Some(exact(
        written(finite_non_negative(units)?),
        u128::from(WEI_PER_UNIT),
        1,
        rounding,
    ))
}

/// What a job costs at `price_wei_per_s` for `compute_s` seconds: the exact product of the ask
/// and the decimal the time is ([`written`]), rounded up once to the wei — 3538 wei/s × 4.171 s
/// (14 756.998) is 14 757. A `compute_s` that is not finite and non-negative costs `u128::MAX`,
/// which no limit admits; a product beyond `u128` saturates.
pub fn charge_wei(price_wei_per_s: u64, compute_s: f64) -> u128 {
    let Some(seconds) = finite_non_negative(compute_s) else {
        return u128::MAX;
    };
    // The clearing hot path: a time of whole microseconds (what clocks and people write) is
    // charged without formatting it. `micros / 10⁶` is the double nearest that decimal; when it
    // is `seconds`, that decimal reads back as `seconds`, and below 10⁹ s no other decimal of
    // at most six places does (they are 10⁻⁶ apart, the doubles there far closer).
    let micros = (seconds * MICROS_PER_S as f64).round();
    if seconds < 1e9 && micros / MICROS_PER_S as f64 == seconds {
        return (u128::from(price_wei_per_s) * micros as u128).div_ceil(u128::from(MICROS_PER_S));
    }
    exact(
        written(seconds),
        u128::from(price_wei_per_s),
        1,
        Rounding::Up,
    )
}

/// Whether [`charge_wei`]`(price_wei_per_s, compute_s)` is at most `limit_wei` — the clearing
/// gate, decided from the double product where it is clearly on one side (its error is far
/// below the 2 wei margin), exactly where it is near the limit.
pub fn charge_within(price_wei_per_s: u64, compute_s: f64, limit_wei: u128) -> bool {
    let approx = price_wei_per_s as f64 * compute_s;
    let limit = limit_wei as f64;
    let margin = 2.0 + approx.abs() * 1e-12;
    if approx.is_finite() && compute_s >= 0.0 {
        if approx + margin < limit {
            return true;
        }
        if approx - margin > limit {
            return false;
        }
    }
    charge_wei(price_wei_per_s, compute_s) <= limit_wei
}

/// The decimal a non-negative finite double was written as: the shortest decimal that reads
/// back as it (what a person, a JSON writer or `{}` wrote, for any value of at most 15
/// significant digits), as `digits × 10^-scale`. `None` beyond `u128` digits (above ~10³⁸).
fn written(value: f64) -> Option<(u128, u32)> {
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(value);
    let (mantissa, exponent) = match text.split_once('e') {
        Some((m, e)) => (m, e.parse::<i32>().ok()?),
        None => (text, 0),
    };
    let (int, frac) = mantissa.split_once('.').unwrap_or((mantissa, ""));
    let frac = frac.trim_end_matches('0');
    let mut digits: u128 = 0;
    for b in int.bytes().chain(frac.bytes()) {
        digits = digits.checked_mul(10)?.checked_add(u128::from(b - b'0'))?;
    }
    let scale = frac.len() as i32 - exponent;
    if scale >= 0 {
        Some((digits, scale as u32))
    } else {
        Some((
            digits.checked_mul(10u128.checked_pow(scale.unsigned_abs())?)?,
            0,
        ))
    }
}

/// `digits × 10^-scale × num / den` rounded the stated way, exact in `u128`; saturating at
/// `u128::MAX` (a decimal beyond `u128`, [`written`]'s `None`, included).
fn exact(decimal: Option<(u128, u32)>, num: u128, den: u128, rounding: Rounding) -> u128 {
    let Some((digits, scale)) = decimal else {
        return u128::MAX;
    };
    let Some(top) = digits.checked_mul(num) else {
        return u128::MAX;
    };
    let Some(bottom) = 10u128.checked_pow(scale).and_then(|p| p.checked_mul(den)) else {
        // A denominator past u128 over a numerator below it (≤ 17 digits × a u64): a value
        // strictly between 0 and 1.
        return match rounding {
            Rounding::Up => u128::from(top > 0),
            Rounding::Down => 0,
        };
    };
    match rounding {
        Rounding::Up => top.div_ceil(bottom),
        Rounding::Down => top / bottom,
    }
}

fn finite_non_negative(value: f64) -> Option<f64> {
    (value.is_finite() && value >= 0.0).then_some(value)
}

/// Wei amounts in JSON: written as decimal strings, exact in every JSON reader (a double holds 53
/// bits) and accepted inside internally tagged enums, which cannot carry a u128 number; read from
/// a decimal string or a non-negative integer.
pub mod wei_string {
    use super::*;

    /// Serializes as a decimal string.
    pub fn serialize<S: Serializer>(value: &u128, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    /// Parses a decimal string or a non-negative integer.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u128, D::Error> {
        d.deserialize_any(WeiVisitor)
    }
}

/// Rates (`u64` wei per compute-second) in JSON, like [`wei_string`]: written as decimal strings,
/// read from a decimal string or a non-negative integer, refused beyond 64 bits.
pub mod rate_string {
    use super::*;

    /// Serializes as a decimal string.
    pub fn serialize<S: Serializer>(value: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&value.to_string())
    }

    /// Parses a decimal string or a non-negative integer below 2⁶⁴.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let wei = d.deserialize_any(WeiVisitor)?;
        u64::try_from(wei).map_err(|_| {
            serde::de::Error::custom(format!(
                "a rate in wei per compute-second must be below 2^64, got {wei}"
            ))
        })
    }
}

/// [`wei_string`] for an optional amount (absent or `null` is `None`).
pub mod wei_string_opt {
    use super::*;

    /// Serializes `Some` as a decimal string, `None` as `null`.
    pub fn serialize<S: Serializer>(value: &Option<u128>, s: S) -> Result<S::Ok, S::Error> {
        match value {
            Some(v) => s.serialize_str(&v.to_string()),
            None => s.serialize_none(),
        }
    }

    /// Parses `null`, a decimal string or a non-negative integer.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u128>, D::Error> {
        #[derive(Deserialize)]
        struct Wrapped(#[serde(with = "super::wei_string")] u128);
        Ok(Option::<Wrapped>::deserialize(d)?.map(|w| w.0))
    }
}

struct WeiVisitor;

impl serde::de::Visitor<'_> for WeiVisitor {
    type Value = u128;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("an amount in wei: a non-negative integer or a decimal string of one")
    }

    fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<u128, E> {
        Ok(u128::from(v))
    }

    fn visit_u128<E: serde::de::Error>(self, v: u128) -> Result<u128, E> {
        Ok(v)
    }

    fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<u128, E> {
        u128::try_from(v)
            .map_err(|_| E::custom(format!("a wei amount cannot be negative, got {v}")))
    }

    fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<u128, E> {
        // A JSON integer of 2⁶⁴ or more reaches here as a double: its digits are gone (every
        // double-based JSON reader loses them), so it is refused, not misprinted.
        if v.is_finite() && v >= 0.0 && v.fract() == 0.0 {
            return Err(E::custom(
                "a wei amount of 2^64 or more must be a decimal string: as a JSON number its \
                 digits do not survive a double",
            ));
        }
        Err(E::custom(format!(
            "a wei amount is an integer, got {v} (prices are integers in the asset's smallest unit)"
        )))
    }

    fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<u128, E> {
        if v.is_empty() || !v.bytes().all(|b| b.is_ascii_digit()) {
            return Err(E::custom(format!(
                "a wei amount is a decimal string of digits, got {v:?}"
            )));
        }
        v.parse()
            .map_err(|_| E::custom(format!("a wei amount must fit in 128 bits, got {v}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charge_is_exact_integer_arithmetic_rounded_up() {
        assert_eq!(charge_wei(1000, 1.0), 1000);
        assert_eq!(charge_wei(1000, 0.0), 0);
        // 1 µs at 1 wei/s is a millionth of a wei: still one wei.
        assert_eq!(charge_wei(1, 0.000_001), 1);
        assert_eq!(charge_wei(3, 0.5), 2);
        assert_eq!(
            charge_wei(u64::MAX, 2.0),
            u128::from(u64::MAX) * 2,
            "exact, never saturated"
        );
        assert_eq!(charge_wei(1, f64::NAN), u128::MAX);
        assert_eq!(charge_wei(1, -1.0), u128::MAX);
    }

    #[test]
    fn conversions_round_the_stated_way() {
        assert_eq!(to_wei(0.000_000_1, Rounding::Up), Some(1));
        assert_eq!(to_wei(0.000_000_1, Rounding::Down), Some(0));
        assert_eq!(to_wei(-1.0, Rounding::Up), None);
        assert_eq!(to_wei(f64::INFINITY, Rounding::Up), None);
        assert_eq!(wei_per_s_from_units_per_hour(3.6, Rounding::Up), Some(1000));
        assert_eq!(
            wei_per_s_from_units_per_hour(1.2, Rounding::Down),
            Some(333)
        );
        assert_eq!(scale_wei(333, 1.5, Rounding::Up), Some(500));
        assert_eq!(scale_wei(333, 1.5, Rounding::Down), Some(499));
        assert_eq!(scale_wei(333, f64::NAN, Rounding::Down), None);
        assert_eq!(to_units(1_500_000), 1.5);
    }

    #[test]
    fn money_converts_from_the_decimal_written() {
        // 0.5076 units an hour is 141 wei/s exactly (a double makes it 141.00000000000003).
        assert_eq!(
            wei_per_s_from_units_per_hour(0.5076, Rounding::Up),
            Some(141)
        );
        // 3538 wei/s × 4.171 s = 14 756.998 wei: 14 757, not 14 758 by way of 4 171 001 µs.
        assert_eq!(charge_wei(3538, 4.171), 14_757);
        // Past six places and past the microsecond fast path.
        assert_eq!(charge_wei(1_000_000_000, 0.000_000_123_4), 124);
        assert_eq!(charge_wei(7, 1.234_567_8), 9);
        assert_eq!(charge_wei(1, 2e9), 2_000_000_000);
        assert_eq!(charge_wei(u64::MAX, 1e300), u128::MAX, "saturates");
        assert_eq!(to_wei(1e-300, Rounding::Up), Some(1));
        assert_eq!(to_wei(1e-300, Rounding::Down), Some(0));
        assert_eq!(to_wei(0.1, Rounding::Up), Some(100_000));
        assert_eq!(scale_wei(1000, 0.1, Rounding::Up), Some(100));
        assert_eq!(written(1e-7), Some((1, 7)));
        assert_eq!(written(1.5e20), Some((150_000_000_000_000_000_000, 0)));
        assert_eq!(written(0.0), Some((0, 0)));
        assert_eq!(written(1e300), None);
    }

    #[test]
    fn the_gate_is_the_charge_compared() {
        assert!(charge_within(3538, 4.171, 14_757));
        assert!(!charge_within(3538, 4.171, 14_756));
        assert!(charge_within(1, 1e6, u128::MAX));
        assert!(!charge_within(1, f64::NAN, u128::MAX - 1));
        assert!(!charge_within(u64::MAX, 1e300, u128::MAX - 1));
    }

    proptest::proptest! {
        /// Against exact rational arithmetic on the decimal as written (at most 15 significant
        /// digits: what a double keeps).
        #[test]
        fn conversions_agree_with_exact_arithmetic(
            int in 0u64..1_000_000,
            frac in 0u64..1_000_000_000,
            places in 0u32..=9,
            price in 0u64..10_000_000_000_000,
        ) {
            let pow = 10u128.pow(places);
            let frac = u128::from(frac) % pow;
            let text = if places == 0 {
                int.to_string()
            } else {
                format!("{int}.{frac:0width$}", width = places as usize)
            };
            let value: f64 = text.parse().unwrap();
            let digits = u128::from(int) * pow + frac;
            proptest::prop_assert_eq!(
                charge_wei(price, value),
                (u128::from(price) * digits).div_ceil(pow),
                "{} s at {} wei/s", text, price
            );
            let per_s = (digits * u128::from(WEI_PER_UNIT)).div_ceil(pow * 3_600);
            proptest::prop_assert_eq!(
                wei_per_s_from_units_per_hour(value, Rounding::Up),
                Some(u64::try_from(per_s).unwrap()),
                "{} units an hour", text
            );
            let charge = (u128::from(price) * digits).div_ceil(pow);
            for limit in [charge.saturating_sub(1), charge, charge + 1, charge / 2, charge * 2] {
                proptest::prop_assert_eq!(charge_within(price, value, limit), charge <= limit);
            }
            proptest::prop_assert_eq!(
                to_wei(value, Rounding::Down),
                Some(digits * u128::from(WEI_PER_UNIT) / pow),
                "{} units", text
            );
        }
    }

    #[test]
    fn wei_reads_strings_and_integers_and_refuses_the_rest() {
        #[derive(Deserialize)]
        struct W {
            #[serde(with = "wei_string")]
            v: u128,
            #[serde(default, with = "wei_string_opt")]
            o: Option<u128>,
        }
        let w: W =
            serde_json::from_str(r#"{"v": "340282366920938463463374607431768211455"}"#).unwrap();
        assert_eq!((w.v, w.o), (u128::MAX, None));
        let w: W = serde_json::from_str(r#"{"v": 7, "o": "9"}"#).unwrap();
        assert_eq!((w.v, w.o), (7, Some(9)));
        for bad in [
            r#"{"v": -1}"#,
            r#"{"v": 1.5}"#,
            r#"{"v": "0x10"}"#,
            r#"{"v": ""}"#,
        ] {
            assert!(serde_json::from_str::<W>(bad).is_err(), "{bad}");
        }
        // 2⁶⁴ as a JSON number is refused as such, not misprinted; as a string it is read.
        let err = serde_json::from_str::<W>(r#"{"v": 18446744073709551616}"#)
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("must be a decimal string"), "{err}");
        assert!(!err.contains("18446744073709552000"), "{err}");
        let w: W = serde_json::from_str(r#"{"v": "18446744073709551616"}"#).unwrap();
        assert_eq!(w.v, 1 << 64);
    }
}
