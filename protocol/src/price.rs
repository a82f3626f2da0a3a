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
//! asset; they convert here, once, and nowhere else ([`to_units`], [`to_wei`], [`wei_per_s_from_units_per_hour`], [`scale_wei`]).
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
/// write) as wei per compute-second; `None` unless finite and not negative.
/// A price per hour in whole units (what people, older inputs and the market maker's model
/// write) as wei per compute-second; `None` unless finite and not negative. Rates beyond `u64`
/// saturate.
pub fn wei_per_s_from_units_per_hour(units_per_hour: f64, rounding: Rounding) -> Option<u64> {
    // Scale before dividing: 3.6 units/h is 3 600 000 wei/h exactly, then 1000 wei/s, where
    // dividing first would leave 1000.000…1 and round up to 1001.
    let wei_per_s = finite_non_negative(units_per_hour)? * WEI_PER_UNIT as f64 / 3600.0;
    // `as` saturates at the integer's range.
    Some(round(wei_per_s, rounding) as u64)
}

/// A rate × `factor`, rounded once the stated way (a tenant's preference applied to a quote);
/// `None` unless `factor` is finite and not negative. Rates beyond `u64` saturate.
pub fn scale_wei(wei: u64, factor: f64, rounding: Rounding) -> Option<u64> {
    let factor = finite_non_negative(factor)?;
    Some(round(wei as f64 * factor, rounding) as u64)
}

/// Whole units as a total in wei, rounded the stated way; `None` unless finite and not negative.
/// Values beyond `u128` saturate.
pub fn to_wei(units: f64, rounding: Rounding) -> Option<u128> {
    let wei = finite_non_negative(units)? * WEI_PER_UNIT as f64;
    Some(round(wei, rounding) as u128)
}

fn round(value: f64, rounding: Rounding) -> f64 {
    match rounding {
        Rounding::Up => value.ceil(),
        Rounding::Down => value.floor(),
    }
}

/// What a job costs at `price_wei_per_s` for `compute_s` seconds: the time rounded up to the
/// microsecond (saturating at `u64`), the product rounded up to the wei — exact in `u128`,
/// since two `u64`s never overflow it. A `compute_s` that is not finite and non-negative costs
/// `u128::MAX`, which no limit admits.
pub fn charge_wei(price_wei_per_s: u64, compute_s: f64) -> u128 {
    let Some(seconds) = finite_non_negative(compute_s) else {
        return u128::MAX;
    };
    let micros = (seconds * MICROS_PER_S as f64).ceil() as u64;
    (u128::from(price_wei_per_s) * u128::from(micros)).div_ceil(u128::from(MICROS_PER_S))
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
    }
}
