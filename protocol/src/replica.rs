//! Verification runs (SPEC §7, tiers T1 and T3): the same class-D work placed again on other
//! providers, each a job of its own whose id is derived from the job it verifies.
//!
//! A run's id is `SHA-256("cx-verification-run-v1" ‖ original job id ‖ run)`: domain-separated
//! so it can collide with no other id the exchange makes (an intent's EIP-712 digest, a session
//! call's random id), and derived so that anyone holding the original id (a signer checking a
//! voucher, a signer checking slashing evidence) can tell that a receipt answers run `run` of
//! that job and of no other. Run 0 is the original itself.

use sha2::{Digest, Sha256};

/// The most runs one job has besides itself: T1's replica and referee, T3's two replicas.
pub const MAX_RUNS: u8 = 2;

/// Domain tag of run ids.
const RUN_TAG: &[u8] = b"cx-verification-run-v1";

/// The id of verification run `run` (1..=[`MAX_RUNS`]) of job `original`.
pub fn run_job_id(original: [u8; 32], run: u8) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(RUN_TAG);
    h.update(original);
    h.update([run]);
    h.finalize().into()
}

/// Which run of `original` the job `job_id` is: `Some(0)` for the original itself, `Some(k)`
/// for run k (1..=[`MAX_RUNS`]), `None` when it is no run of that job.
pub fn run_of(original: [u8; 32], job_id: [u8; 32]) -> Option<u8> {
    if job_id == original {
        return Some(0);
    }
    (1..=MAX_RUNS).find(|k| run_job_id(original, *k) == job_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_ids_are_derived_distinct_and_recognised_only_for_their_own_job() {
        let original = [7u8; 32];
        let one = run_job_id(original, 1);
        let two = run_job_id(original, 2);
        assert_ne!(one, original);
        assert_ne!(one, two);
        assert_eq!(one, run_job_id(original, 1), "deterministic");
        assert_eq!(run_of(original, original), Some(0));
        assert_eq!(run_of(original, one), Some(1));
        assert_eq!(run_of(original, two), Some(2));
        // Another job's runs, or a run beyond the limit, are not runs of this one.
        assert_eq!(run_of([8u8; 32], one), None);
        assert_eq!(run_of(original, run_job_id(original, MAX_RUNS + 1)), None);
        // Domain separation: not the bare hash of the id and index.
        let bare: [u8; 32] = Sha256::digest([&original[..], &[1u8]].concat()).into();
        assert_ne!(one, bare);
    }
}
