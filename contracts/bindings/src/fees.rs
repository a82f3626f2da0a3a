//! How an account pays for gas on one chain: the `[fees]` of its registry entry, and the pure
//! arithmetic of EIP-1559 fees — the first offer, and the replacement of a transaction that
//! sits unmined (every party's sender uses it; see `cx_settlement::evm::sender`).
//!
//! A replacement must raise both the fee cap and the tip by at least 10 % over the transaction
//! it replaces (geth's and Anvil's pool rule; below it the node answers "replacement transaction
//! underpriced"), and no offer ever passes the cap the operator wrote.

use serde::{Deserialize, Serialize};

/// The least raise, in percent, a pool accepts for a replacement of the same nonce.
pub const MIN_BUMP_PERCENT: u32 = 10;

/// The highest fee cap a policy may name: one ether per gas (the books keep fees as signed
/// 64-bit integers; no chain has priced gas within a factor of 10⁶ of it).
pub const MAX_FEE_CAP_WEI: u64 = 1_000_000_000_000_000_000;

/// One chain's fee policy (`[fees]` in its registry file; every field has a default).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct FeePolicy {
    /// The highest `maxFeePerGas` ever offered, wei: a spike past it waits instead of paying.
    pub max_fee_per_gas_cap_wei: u64,
    /// The tip (`maxPriorityFeePerGas`) offered first, wei; absent: the node's
    /// `eth_maxPriorityFeePerGas`.
    pub priority_fee_wei: Option<u64>,
    /// The fee cap offered is the base fee × this + the tip: 2 rides out six full blocks of
    /// base-fee rises (12.5 % each) before the transaction stops being includable.
    pub base_fee_multiplier: u32,
    /// Percent by which a replacement raises both fees (at least [`MIN_BUMP_PERCENT`]).
    pub bump_percent: u32,
    /// Blocks mined without the transaction before it is replaced.
    pub stuck_after_blocks: u64,
    /// The gas limit is the node's estimate plus this percent (state may move between the
    /// estimate and the block).
    pub gas_margin_percent: u32,
    /// The most gas one transaction may use: an estimate above it is refused, not sent.
    pub max_gas_per_tx: u64,
    /// Seconds one send may wait in all for its receipt before it reports the transaction
    /// pending (it may still land: the next send replaces it at its nonce).
    pub give_up_after_s: u64,
}

impl Default for FeePolicy {
    fn default() -> Self {
        Self {
            max_fee_per_gas_cap_wei: 500_000_000_000, // 500 gwei
            priority_fee_wei: None,
            base_fee_multiplier: 2,
            bump_percent: 25,
            stuck_after_blocks: 3,
            gas_margin_percent: 20,
            max_gas_per_tx: 15_000_000,
            give_up_after_s: 600,
        }
    }
}

/// The two EIP-1559 fees of one offer, wei per gas.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fees {
    /// `maxFeePerGas`.
    pub max_fee_per_gas: u128,
    /// `maxPriorityFeePerGas` (never above the max fee).
    pub max_priority_fee_per_gas: u128,
}

/// Why a policy is not usable.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A field out of its range.
    #[error("fees.{field}: {reason}")]
    Field {
        /// The field.
        field: &'static str,
        /// Why.
        reason: String,
    },
}

impl FeePolicy {
    /// Checks every field's range.
    pub fn validate(&self) -> Result<(), PolicyError> {
        let bad = |field, reason: String| Err(PolicyError::Field { field, reason });
        if !(1..=MAX_FEE_CAP_WEI).contains(&self.max_fee_per_gas_cap_wei) {
            return bad(
                "max_fee_per_gas_cap_wei",
                format!("must be 1 to {MAX_FEE_CAP_WEI} (one ether per gas)"),
            );
        }
        if let Some(tip) = self.priority_fee_wei
            && tip > self.max_fee_per_gas_cap_wei
        {
            return bad(
                "priority_fee_wei",
                format!("{tip} is above the cap {}", self.max_fee_per_gas_cap_wei),
            );
        }
        if !(1..=10).contains(&self.base_fee_multiplier) {
            return bad("base_fee_multiplier", "must be 1 to 10".into());
        }
        if !(MIN_BUMP_PERCENT..=400).contains(&self.bump_percent) {
            return bad(
                "bump_percent",
                format!("must be {MIN_BUMP_PERCENT} to 400 (pools refuse a smaller raise)"),
            );
        }
        if self.stuck_after_blocks == 0 {
            return bad("stuck_after_blocks", "must be at least 1".into());
        }
        if self.gas_margin_percent > 200 {
            return bad("gas_margin_percent", "must be at most 200".into());
        }
        if !(21_000..=100_000_000).contains(&self.max_gas_per_tx) {
            return bad("max_gas_per_tx", "must be 21000 to 100000000".into());
        }
        if self.give_up_after_s == 0 {
            return bad("give_up_after_s", "must be positive".into());
        }
        Ok(())
    }

    /// The first offer at the next block's `base_fee`, the node suggesting `suggested_tip`:
    /// tip = the policy's or the suggestion, cap = base × multiplier + tip, both within the cap.
    pub fn first(&self, base_fee: u128, suggested_tip: u128) -> Fees {
        let cap = u128::from(self.max_fee_per_gas_cap_wei);
        let tip = self
            .priority_fee_wei
            .map_or(suggested_tip, u128::from)
            .min(cap);
        let max_fee = base_fee
            .saturating_mul(u128::from(self.base_fee_multiplier))
            .saturating_add(tip)
            .min(cap);
        Fees {
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
        }
    }

    /// The offer that replaces `previous` (stuck, or underpriced as a replacement) when the
    /// next block's base fee is `base_fee`: each fee raised by `bump_percent` (rounded up) or
    /// re-priced at today's base fee, whichever is higher, within the cap. `None` when the
    /// result would not be a valid replacement (it is at the cap already): wait instead.
    pub fn replace(&self, previous: Fees, base_fee: u128, suggested_tip: u128) -> Option<Fees> {
        let cap = u128::from(self.max_fee_per_gas_cap_wei);
        let raise = |x: u128| {
            let pct = u128::from(self.bump_percent);
            // ⌈x · (100 + pct) / 100⌉ without overflow for any fee a chain can have.
            x.saturating_mul(100 + pct)
                .div_ceil(100)
                .max(x.saturating_add(1))
        };
        let fresh = self.first(base_fee, suggested_tip);
        let tip = raise(previous.max_priority_fee_per_gas)
            .max(fresh.max_priority_fee_per_gas)
            .min(cap);
        let max_fee = raise(previous.max_fee_per_gas)
            .max(fresh.max_fee_per_gas)
            .min(cap)
            .max(tip);
        let enough = |new: u128, old: u128| {
            new.saturating_mul(100) >= old.saturating_mul(100 + u128::from(MIN_BUMP_PERCENT))
        };
        (enough(max_fee, previous.max_fee_per_gas)
            && enough(tip, previous.max_priority_fee_per_gas))
        .then_some(Fees {
            max_fee_per_gas: max_fee,
            max_priority_fee_per_gas: tip,
        })
    }

    /// The gas limit for a transaction the node estimates at `estimate`, or why it is refused.
    pub fn gas_limit(&self, estimate: u64) -> Result<u64, PolicyError> {
        let limit = estimate
            .saturating_mul(100 + u64::from(self.gas_margin_percent))
            .div_ceil(100);
        if estimate > self.max_gas_per_tx {
            return Err(PolicyError::Field {
                field: "max_gas_per_tx",
                reason: format!(
                    "the transaction is estimated at {estimate} gas, above the limit {}",
                    self.max_gas_per_tx
                ),
            });
        }
        Ok(limit.min(self.max_gas_per_tx))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn the_first_offer_covers_two_base_fees_and_the_tip_within_the_cap() {
        let p = FeePolicy::default();
        let f = p.first(1_000_000_000, 1_000);
        assert_eq!(f.max_fee_per_gas, 2_000_001_000);
        assert_eq!(f.max_priority_fee_per_gas, 1_000);
        let spike = p.first(10_000_000_000_000, 1_000);
        assert_eq!(spike.max_fee_per_gas, u128::from(p.max_fee_per_gas_cap_wei));
    }

    #[test]
    fn a_stuck_offer_is_repriced_at_the_new_base_fee() {
        let p = FeePolicy::default();
        let old = p.first(1_000_000_000, 1);
        let new = p.replace(old, 100_000_000_000, 1).unwrap();
        assert_eq!(new.max_fee_per_gas, 200_000_000_000 + 1);
        assert!(new.max_priority_fee_per_gas >= 2);
    }

    #[test]
    fn an_offer_at_the_cap_is_not_replaced() {
        let p = FeePolicy::default();
        let at_cap = Fees {
            max_fee_per_gas: u128::from(p.max_fee_per_gas_cap_wei),
            max_priority_fee_per_gas: 1,
        };
        assert_eq!(p.replace(at_cap, 1, 1), None);
    }

    #[test]
    fn ranges_are_checked_by_name() {
        let p = FeePolicy {
            bump_percent: 5,
            ..FeePolicy::default()
        };
        assert!(
            p.validate()
                .unwrap_err()
                .to_string()
                .contains("bump_percent")
        );
        assert!(FeePolicy::default().validate().is_ok());
        assert!(
            FeePolicy::default()
                .gas_limit(20_000_000)
                .unwrap_err()
                .to_string()
                .contains("max_gas_per_tx")
        );
        assert_eq!(FeePolicy::default().gas_limit(100_000).unwrap(), 120_000);
    }

    proptest! {
        // Every replacement the policy makes is one a pool accepts (both fees ≥ +10 %), never
        // passes the cap, and keeps the tip within the fee cap.
        #[test]
        fn replacements_are_accepted_by_pools_and_capped(
            base in 0u128..1_000_000_000_000_000,
            tip in 0u128..1_000_000_000_000,
            cap in 1u64..10_000_000_000_000_000,
            bump in MIN_BUMP_PERCENT..=400,
            later_base in 0u128..1_000_000_000_000_000,
        ) {
            let p = FeePolicy {
                max_fee_per_gas_cap_wei: cap,
                bump_percent: bump,
                ..FeePolicy::default()
            };
            let cap = u128::from(cap);
            let first = p.first(base, tip);
            prop_assert!(first.max_fee_per_gas <= cap);
            prop_assert!(first.max_priority_fee_per_gas <= first.max_fee_per_gas);
            let mut offer = first;
            for _ in 0..8 {
                match p.replace(offer, later_base, tip) {
                    Some(next) => {
                        prop_assert!(next.max_fee_per_gas * 100 >= offer.max_fee_per_gas * 110);
                        prop_assert!(
                            next.max_priority_fee_per_gas * 100
                                >= offer.max_priority_fee_per_gas * 110
                        );
                        prop_assert!(next.max_fee_per_gas <= cap);
                        prop_assert!(next.max_priority_fee_per_gas <= next.max_fee_per_gas);
                        offer = next;
                    }
                    None => break,
                }
            }
        }
    }
}
