//! Search (Las Vegas work): a predicate, a success probability and a deadline; priced on
//! expected work, settled on the first valid witness, refunded if none arrives in time.
//!
//! The predicate family shipped: `SHA-256(prefix ‖ nonce) < target`, the nonce as 8 bytes
//! little-endian, the digest and the target compared as 256-bit big-endian integers (a hash
//! preimage below a target, as proof-of-work puzzles define it). Checking a witness costs one
//! hash; finding one costs `1/q` hashes on average, `q = target / 2²⁵⁶`.

use crate::error::{Error, Result, invalid};
use serde::Serialize;

/// The target under which a digest must fall for `leading_zero_bits` leading zero bits
/// (`2^(256−bits)`), with `bits` clamped to 1..=255 (the target must fit in 256 bits).
pub fn target_for_zero_bits(leading_zero_bits: u32) -> [u8; 32] {
    let mut target = [0u8; 32];
    let bit = 256 - leading_zero_bits.clamp(1, 255) as usize; // the set bit's index from the right
    target[31 - bit / 8] |= 1 << (bit % 8);
    target
}

/// Probability that one trial succeeds: target / 2²⁵⁶.
pub fn trial_probability(target: &[u8; 32]) -> f64 {
    target
        .iter()
        .fold(0.0, |acc, b| acc * 256.0 + f64::from(*b))
        / 2f64.powi(256)
}

/// Whether `nonce` is a witness: SHA-256(prefix ‖ nonce) < target (the protocol's predicate,
/// which the exchange and every signer check too).
pub fn is_witness(prefix: &[u8], nonce: u64, target: &[u8; 32]) -> bool {
    cx_protocol::order::search_witness(prefix, nonce, target)
}

/// Tries nonces from `start` for at most `max_trials`; the first witness found.
pub fn solve(prefix: &[u8], target: &[u8; 32], start: u64, max_trials: u64) -> Option<u64> {
    (start..start.saturating_add(max_trials)).find(|n| is_witness(prefix, *n, target))
}

/// Trials needed to succeed with probability `success_probability`:
/// `n = ln(1 − P) / ln(1 − q)`, rounded up.
pub fn expected_trials(success_probability: f64, trial_probability: f64) -> Result<u64> {
    if !(success_probability > 0.0 && success_probability < 1.0) {
        return Err(invalid(
            "success_probability",
            format!("must be in (0, 1), got {success_probability}"),
        ));
    }
    if !(trial_probability > 0.0 && trial_probability <= 1.0) {
        return Err(invalid("target", "the target must be above zero"));
    }
    if trial_probability == 1.0 {
        return Ok(1);
    }
    // ln_1p keeps precision when q is tiny (1 − q rounds to 1 in f64).
    let n = (-success_probability).ln_1p() / (-trial_probability).ln_1p();
    Ok(n.ceil().max(1.0) as u64)
}

/// Where a search order is.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum SearchState {
    /// Waiting for a witness.
    Open,
    /// Settled on the first valid witness.
    Solved {
        /// Who found it.
        solver: String,
        /// The witness.
        nonce: u64,
    },
    /// The deadline passed with no witness; the price goes back.
    Refunded,
}

/// A search order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Search {
    /// Order id.
    pub id: String,
    /// The domain: the bytes every candidate is prefixed with.
    pub prefix: Vec<u8>,
    /// The target, 256-bit big-endian.
    pub target: [u8; 32],
    /// Deadline, seconds on the exchange clock.
    pub deadline_at_s: f64,
    /// Price, wei: expected trials × price per trial.
    pub price_wei: u128,
    /// Current state.
    pub state: SearchState,
}

impl Search {
    /// A search priced on expected work: `expected_trials(P, q) × wei_per_trial`.
    pub fn new(
        id: impl Into<String>,
        prefix: Vec<u8>,
        target: [u8; 32],
        success_probability: f64,
        deadline_at_s: f64,
        wei_per_trial: u128,
    ) -> Result<Self> {
        let trials = expected_trials(success_probability, trial_probability(&target))?;
        Ok(Self {
            id: id.into(),
            prefix,
            target,
            deadline_at_s,
            price_wei: u128::from(trials).saturating_mul(wei_per_trial),
            state: SearchState::Open,
        })
    }

    /// A witness from `solver` at `now_s`: the first valid one before the deadline wins.
    pub fn submit(&mut self, now_s: f64, solver: &str, nonce: u64) -> Result<()> {
        if self.state != SearchState::Open || now_s > self.deadline_at_s {
            return Err(Error::IllegalTransition {
                order: "search",
                state: match self.state {
                    SearchState::Open => "open (deadline passed)".to_owned(),
                    SearchState::Solved { .. } => "solved".to_owned(),
                    SearchState::Refunded => "refunded".to_owned(),
                },
                event: "submit",
            });
        }
        if !is_witness(&self.prefix, nonce, &self.target) {
            return Err(Error::InvalidWitness);
        }
        self.state = SearchState::Solved {
            solver: solver.to_owned(),
            nonce,
        };
        Ok(())
    }

    /// After the deadline with no witness: refund the price.
    pub fn expire(&mut self, now_s: f64) -> Result<u128> {
        if self.state != SearchState::Open || now_s <= self.deadline_at_s {
            return Err(Error::IllegalTransition {
                order: "search",
                state: match self.state {
                    SearchState::Open => "open (deadline not passed)".to_owned(),
                    _ => "settled".to_owned(),
                },
                event: "expire",
            });
        }
        self.state = SearchState::Refunded;
        Ok(self.price_wei)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn target_and_probability_agree() {
        assert_eq!(trial_probability(&target_for_zero_bits(8)), 1.0 / 256.0);
        assert_eq!(trial_probability(&target_for_zero_bits(1)), 0.5);
        // P = 1 − (1 − 1/2)^n ≥ 0.75 needs n = 2.
        assert_eq!(expected_trials(0.75, 0.5).unwrap(), 2);
        assert!(expected_trials(1.0, 0.5).is_err());
        assert!(expected_trials(f64::NAN, 0.5).is_err());
    }

    #[test]
    fn first_valid_witness_wins_and_a_bad_one_changes_nothing() {
        let target = target_for_zero_bits(10);
        let mut s = Search::new("s", b"cx-test".to_vec(), target, 0.99, 60.0, 3).unwrap();
        // ln(0.01)/ln(1 − 2⁻¹⁰) ≈ 4713.6 trials.
        assert_eq!(s.price_wei, 4714 * 3);
        let nonce = solve(b"cx-test", &target, 0, 1 << 20).unwrap();
        let bad = (0..)
            .find(|n| !is_witness(b"cx-test", *n, &target))
            .unwrap();
        assert_eq!(s.submit(1.0, "p1", bad), Err(Error::InvalidWitness));
        assert_eq!(s.state, SearchState::Open);
        s.submit(2.0, "p2", nonce).unwrap();
        assert!(
            s.submit(3.0, "p3", nonce).is_err(),
            "second witness too late"
        );
        assert_eq!(
            s.state,
            SearchState::Solved {
                solver: "p2".into(),
                nonce
            }
        );
        assert!(s.expire(100.0).is_err());
    }

    #[test]
    fn no_witness_by_the_deadline_refunds() {
        let mut s = Search::new("s", vec![1], target_for_zero_bits(200), 0.5, 10.0, 1).unwrap();
        assert!(s.expire(5.0).is_err());
        assert_eq!(s.expire(11.0).unwrap(), s.price_wei);
        assert!(s.submit(12.0, "late", 0).is_err());
    }
}
