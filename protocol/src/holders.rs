//! A rent's holders (SPEC §3): a rent on state that tolerates a miss probability ε is placed on
//! as many capable providers as 1 − ε needs, each keeping the state resident for the term and
//! paid for its own share as a job of its own.
//!
//! Holder 0's job id is the rent's EIP-712 digest; holder k's is
//! `SHA-256("cx-rent-holder-v1" ‖ digest ‖ k)`: domain-separated from every other id the
//! exchange makes, and derived so that a signer holding the rent can tell which holder a receipt
//! pays — and sum what all of them are owed against the buyer's one `max_rent_wei`.

use sha2::{Digest, Sha256};

/// The most holders one rent is placed on.
pub const MAX_RENT_HOLDERS: u8 = 4;

/// Domain tag of holder job ids.
const HOLDER_TAG: &[u8] = b"cx-rent-holder-v1";

/// The job id of holder `holder` (0..[`MAX_RENT_HOLDERS`]) of rent `rent` (its digest).
pub fn holder_job_id(rent: [u8; 32], holder: u8) -> [u8; 32] {
    if holder == 0 {
        return rent;
    }
    Sha256::new()
        .chain_update(HOLDER_TAG)
        .chain_update(rent)
        .chain_update([holder])
        .finalize()
        .into()
}

/// Which holder of rent `rent` the job `job_id` pays; `None` when it is no holder's.
pub fn holder_of(rent: [u8; 32], job_id: [u8; 32]) -> Option<u8> {
    (0..MAX_RENT_HOLDERS).find(|k| holder_job_id(rent, *k) == job_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn holder_ids_are_derived_distinct_and_recognised() {
        let rent = [7u8; 32];
        assert_eq!(holder_job_id(rent, 0), rent);
        let ids: Vec<_> = (0..MAX_RENT_HOLDERS)
            .map(|k| holder_job_id(rent, k))
            .collect();
        for (k, id) in ids.iter().enumerate() {
            assert_eq!(holder_of(rent, *id), Some(k as u8));
            assert_eq!(ids.iter().filter(|other| *other == id).count(), 1);
        }
        assert_eq!(holder_of(rent, [8u8; 32]), None);
        assert_eq!(holder_of([8u8; 32], ids[1]), None, "another rent's holder");
    }
}
