//! Determinism classes and verification tiers (SPEC §7), and the sets of them a bundle offers.

use serde::{Deserialize, Serialize};
use std::fmt;

/// How reproducible a job's output is, which decides how it can be checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum DeterminismClass {
    /// Bit-reproducible: byte equality of output hashes.
    #[serde(rename = "D")]
    D,
    /// Equal up to float rounding: agreement within a stated tolerance.
    #[serde(rename = "D_inf", alias = "D∞", alias = "Dinf")]
    DInf,
    /// Sampled or nondeterministic: checked by the tier the buyer chose.
    #[serde(rename = "S")]
    S,
}

impl DeterminismClass {
    /// Every class, in order.
    pub const ALL: [DeterminismClass; 3] = [Self::D, Self::DInf, Self::S];

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for DeterminismClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::D => "D",
            Self::DInf => "D_inf",
            Self::S => "S",
        })
    }
}

/// Verification tier a buyer requires and a bundle offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Tier {
    /// Stake only.
    T0,
    /// Byte equality by re-execution on a second provider.
    T1,
    /// Freivalds spot checks for linear-algebra work.
    T2,
    /// Three-fold replication with majority over a diverse committee.
    T3,
    /// Attested execution (TEE): named in the registry, offered by no provider here.
    #[serde(rename = "attested")]
    Attested,
}

impl Tier {
    /// Every tier, in order.
    pub const ALL: [Tier; 5] = [Self::T0, Self::T1, Self::T2, Self::T3, Self::Attested];

    /// Extra executions (in units of the job's own compute) the tier costs: v(τ) in SPEC §2.
    ///
    /// T1 re-executes once on a second provider; T2 runs Freivalds rounds whose cost is a small
    /// fraction of the product it checks (we budget 5 %); T3 runs two more replicas.
    pub fn verification_work(self) -> f64 {
        match self {
            Self::T0 | Self::Attested => 0.0,
            Self::T1 => 1.0,
            Self::T2 => 0.05,
            Self::T3 => 2.0,
        }
    }

    fn bit(self) -> u8 {
        1 << (self as u8)
    }
}

impl fmt::Display for Tier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::T0 => "T0",
            Self::T1 => "T1",
            Self::T2 => "T2",
            Self::T3 => "T3",
            Self::Attested => "attested",
        })
    }
}

macro_rules! bitset {
    ($(#[$doc:meta])* $name:ident, $item:ty) => {
        $(#[$doc])*
        ///
        /// Serialised as a JSON array of names; held as a bit mask so that capability checks on
        /// the clearing hot path are one AND.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
        pub struct $name(u8);

        impl $name {
            /// The empty set.
            pub const EMPTY: Self = Self(0);

            /// Whether `item` is in the set.
            pub fn contains(self, item: $item) -> bool {
                self.0 & item.bit() != 0
            }

            /// Adds `item`.
            pub fn insert(&mut self, item: $item) {
                self.0 |= item.bit();
            }

            /// Whether every item of `other` is in `self`.
            pub fn is_superset(self, other: Self) -> bool {
                self.0 & other.0 == other.0
            }

            /// The raw mask (one bit per item, in declaration order).
            pub fn bits(self) -> u8 {
                self.0
            }

            /// The items, in declaration order.
            pub fn iter(self) -> impl Iterator<Item = $item> {
                <$item>::ALL.into_iter().filter(move |i| self.contains(*i))
            }
        }

        impl FromIterator<$item> for $name {
            fn from_iter<I: IntoIterator<Item = $item>>(iter: I) -> Self {
                let mut set = Self::EMPTY;
                for item in iter {
                    set.insert(item);
                }
                set
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.collect_seq(self.iter())
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
                Ok(Vec::<$item>::deserialize(d)?.into_iter().collect())
            }
        }
    };
}

bitset!(
    /// The determinism classes a device honours: K(d) in SPEC §2.
    ClassSet,
    DeterminismClass
);
bitset!(
    /// The verification tiers a bundle offers: T(b) in SPEC §2.
    TierSet,
    Tier
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sets_round_trip_through_json_and_check_membership() {
        let tiers: TierSet = serde_json::from_str(r#"["T0","T2"]"#).unwrap();
        assert!(tiers.contains(Tier::T0) && tiers.contains(Tier::T2));
        assert!(!tiers.contains(Tier::T1));
        assert_eq!(serde_json::to_string(&tiers).unwrap(), r#"["T0","T2"]"#);
        let classes: ClassSet = serde_json::from_str(r#"["D∞","S"]"#).unwrap();
        assert!(classes.contains(DeterminismClass::DInf));
        assert_eq!(serde_json::to_string(&classes).unwrap(), r#"["D_inf","S"]"#);
    }

    #[test]
    fn unknown_tier_is_a_parse_error() {
        let err = serde_json::from_str::<TierSet>(r#"["T9"]"#).unwrap_err();
        assert!(err.to_string().contains("unknown variant `T9`"), "{err}");
    }
}
