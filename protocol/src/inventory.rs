//! State as inventory (SPEC §4), shared by providers (their residency caches) and the exchange
//! (routing continuations, pricing pins, the simulation): one arithmetic on both sides, so what
//! a provider reports as its shadow price is what the exchange would have computed.
//!
//! - The **shadow price** of a residency slot is the expected discounted value of what occupies
//!   it: an occupant hit at rate `λ` per second, each hit saving `s` (the reload it avoids), is
//!   worth `λ·s·(1 − e^{−rH})/r` over a horizon `H` at discount rate `r`.
//! - Making room is a knapsack decision: evict the least value per byte first, never a pinned
//!   occupant; the price of the room is the value given up.
//! - A conversation prefix's KV cache is perishable: keep it one more turn iff `γ·s > h`.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// Something resident in accelerator memory: a base, an adapter, a KV prefix.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Occupant {
    /// Its id.
    pub id: String,
    /// Bytes it holds.
    pub bytes: u64,
    /// Expected hits per second (an estimate from recent arrivals).
    pub hit_rate_per_s: f64,
    /// Saving per hit: the reload cost a hit avoids, in whole units of the asset.
    pub saving_per_hit: f64,
    /// Pinned by a rent-on-state order: never evicted.
    pub pinned: bool,
    /// When it was last used, seconds (what LRU reads).
    pub last_used_s: f64,
}

/// How a cache picks what to evict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EvictionPolicy {
    /// Least expected value per byte first (SPEC §4).
    ValuePerByte,
    /// Least recently used first: the baseline.
    Lru,
}

impl std::str::FromStr for EvictionPolicy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "value-per-byte" | "value_per_byte" | "vpb" => Ok(Self::ValuePerByte),
            "lru" => Ok(Self::Lru),
            other => Err(format!("unknown policy `{other}` (value-per-byte or lru)")),
        }
    }
}

/// Discounting of future hits.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Discount {
    /// r, per second.
    pub rate_per_s: f64,
    /// H, seconds.
    pub horizon_s: f64,
}

impl Default for Discount {
    fn default() -> Self {
        // An hour's horizon, discounted at ~10 % an hour.
        Self {
            rate_per_s: 0.1 / 3600.0,
            horizon_s: 3600.0,
        }
    }
}

/// Expected discounted value of a flow of hits: `λ·s·(1 − e^{−rH})/r` (`λ·s·H` when r = 0).
pub fn discounted_value(hit_rate_per_s: f64, saving_per_hit: f64, discount: Discount) -> f64 {
    let flow = hit_rate_per_s.max(0.0) * saving_per_hit.max(0.0);
    if discount.rate_per_s > 0.0 {
        flow * -(-discount.rate_per_s * discount.horizon_s).exp_m1() / discount.rate_per_s
    } else {
        flow * discount.horizon_s
    }
}

/// Expected discounted value of an occupant (see [`discounted_value`]).
pub fn expected_value(occupant: &Occupant, discount: Discount) -> f64 {
    discounted_value(occupant.hit_rate_per_s, occupant.saving_per_hit, discount)
}

/// Value per byte, the knapsack's density.
pub fn value_per_byte(occupant: &Occupant, discount: Discount) -> f64 {
    expected_value(occupant, discount) / occupant.bytes.max(1) as f64
}

/// Indices of the occupants to evict so that `needed_bytes` more become free, in eviction
/// order; pinned occupants are never chosen. `free_bytes` is what is already free.
pub fn plan_eviction(
    occupants: &[Occupant],
    free_bytes: u64,
    needed_bytes: u64,
    policy: EvictionPolicy,
    discount: Discount,
) -> Result<Vec<usize>> {
    if free_bytes >= needed_bytes {
        return Ok(Vec::new());
    }
    let mut order: Vec<usize> = (0..occupants.len())
        .filter(|i| !occupants[*i].pinned)
        .collect();
    match policy {
        EvictionPolicy::ValuePerByte => order.sort_by(|a, b| {
            value_per_byte(&occupants[*a], discount)
                .total_cmp(&value_per_byte(&occupants[*b], discount))
                .then(a.cmp(b))
        }),
        EvictionPolicy::Lru => order.sort_by(|a, b| {
            occupants[*a]
                .last_used_s
                .total_cmp(&occupants[*b].last_used_s)
                .then(a.cmp(b))
        }),
    }
    let mut freed = free_bytes;
    let mut chosen = Vec::new();
    for i in order {
        if freed >= needed_bytes {
            break;
        }
        freed = freed.saturating_add(occupants[i].bytes);
        chosen.push(i);
    }
    if freed < needed_bytes {
        let evictable = occupants
            .iter()
            .filter(|o| !o.pinned)
            .map(|o| o.bytes)
            .sum::<u64>();
        return Err(Error::NotEnoughEvictable {
            needed_bytes: needed_bytes - free_bytes,
            evictable_bytes: evictable,
        });
    }
    Ok(chosen)
}

/// Shadow price of room for `slot_bytes`: the expected value given up by evicting least value
/// per byte first (0 while it fits in what is free). What a provider reports and what a
/// newcomer must be worth to be admitted.
pub fn shadow_price(
    occupants: &[Occupant],
    free_bytes: u64,
    slot_bytes: u64,
    discount: Discount,
) -> Result<f64> {
    let evict = plan_eviction(
        occupants,
        free_bytes,
        slot_bytes,
        EvictionPolicy::ValuePerByte,
        discount,
    )?;
    // A fold from +0: an empty float `sum` is −0, which would print as a negative price.
    Ok(evict.iter().fold(0.0, |total, i| {
        total + expected_value(&occupants[*i], discount)
    }))
}

/// The KV keep rule: keep a conversation prefix one more turn iff `γ·s > h`, with `γ` the
/// probability the conversation continues, `s` the saving of a hit (the prefill it avoids) and
/// `h` the holding cost (the shadow price of the memory it occupies for that turn).
pub fn keep_prefix(continuation_probability: f64, saving: f64, holding_cost: f64) -> bool {
    continuation_probability * saving > holding_cost
}

#[cfg(test)]
mod tests {
    use super::*;

    fn occ(id: &str, bytes: u64, rate: f64, last: f64, pinned: bool) -> Occupant {
        Occupant {
            id: id.into(),
            bytes,
            hit_rate_per_s: rate,
            saving_per_hit: 1.0,
            pinned,
            last_used_s: last,
        }
    }

    #[test]
    fn value_is_a_discounted_perpetuity() {
        let d = Discount {
            rate_per_s: 0.0,
            horizon_s: 100.0,
        };
        assert_eq!(expected_value(&occ("a", 1, 0.5, 0.0, false), d), 50.0);
        let d = Discount {
            rate_per_s: 0.01,
            horizon_s: 100.0,
        };
        let v = expected_value(&occ("a", 1, 0.5, 0.0, false), d);
        assert!((v - 0.5 * (1.0 - (-1f64).exp()) / 0.01).abs() < 1e-9);
    }

    #[test]
    fn evicts_least_value_per_byte_and_never_a_pin() {
        let d = Discount::default();
        let occupants = [
            occ("hot-big", 100, 1.0, 0.0, false),    // 0.01 per byte
            occ("cold-small", 10, 0.01, 9.0, false), // 0.001 per byte
            occ("pinned", 100, 0.0, 0.0, true),
            occ("warm", 50, 0.2, 5.0, false), // 0.004 per byte
        ];
        let plan = plan_eviction(&occupants, 0, 55, EvictionPolicy::ValuePerByte, d).unwrap();
        assert_eq!(plan, vec![1, 3]);
        let lru = plan_eviction(&occupants, 0, 55, EvictionPolicy::Lru, d).unwrap();
        assert_eq!(lru, vec![0], "LRU throws out the oldest, however hot");
        let err = plan_eviction(&occupants, 0, 200, EvictionPolicy::ValuePerByte, d).unwrap_err();
        assert_eq!(
            err,
            Error::NotEnoughEvictable {
                needed_bytes: 200,
                evictable_bytes: 160
            }
        );
    }

    #[test]
    fn shadow_price_is_the_value_given_up() {
        let d = Discount {
            rate_per_s: 0.0,
            horizon_s: 10.0,
        };
        let occupants = [occ("a", 10, 1.0, 0.0, false), occ("b", 10, 3.0, 0.0, false)];
        let free = shadow_price(&occupants, 5, 5, d).unwrap();
        assert!(free == 0.0 && free.is_sign_positive(), "{free}");
        assert_eq!(shadow_price(&occupants, 5, 10, d).unwrap(), 10.0);
        assert_eq!(shadow_price(&occupants, 0, 20, d).unwrap(), 40.0);
    }

    #[test]
    fn keep_prefix_iff_expected_saving_beats_holding() {
        assert!(keep_prefix(0.8, 10.0, 7.9));
        assert!(!keep_prefix(0.8, 10.0, 8.0));
        assert!(!keep_prefix(0.0, 10.0, 0.0));
    }
}
