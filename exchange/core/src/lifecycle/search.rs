//! Search (Las Vegas work): a predicate, a success probability and a deadline; priced on
//! expected work, settled on the first valid witness, refunded if none arrives in time.
//!
//! The predicate family shipped: `SHA-256(prefix ‖ nonce) < target`, the nonce as 8 bytes
//! little-endian, the digest and the target compared as 256-bit big-endian integers (a hash
//! preimage below a target, as proof-of-work puzzles define it). Checking a witness costs one
//! hash; finding one costs `1/q` hashes on average, `q = target / 2²⁵⁶`.

use crate::error::{Result, invalid};

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
    cx_protocol::order::search_trial_probability(target)
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
    Ok(cx_protocol::order::search_trials_to_succeed(success_probability, trial_probability) as u64)
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
    fn a_solved_nonce_is_a_witness_and_others_are_not() {
        let target = target_for_zero_bits(10);
        let nonce = solve(b"cx-test", &target, 0, 1 << 20).unwrap();
        assert!(is_witness(b"cx-test", nonce, &target));
        let bad = (0..)
            .find(|n| !is_witness(b"cx-test", *n, &target))
            .unwrap();
        assert!(!is_witness(b"cx-test", bad, &target));
    }
}
