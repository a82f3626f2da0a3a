//! Vouchers a signer has already checked, so that checking them is done once, when they arrive,
//! and not again inside a signing round.
//!
//! Checking a voucher is a handful of ML-DSA-65 verifications and an ECDSA recovery (the
//! buyer's binding and order, the exchange's assignment, the provider's receipt). Done inside
//! round 2 it is most of a round's time: t signers verify at once while they hold their nonces
//! and the coordinator waits for the slowest. The coordinator therefore hands each tab's vouchers
//! to every signer as it takes them in ([`crate::wire::Request::CheckVouchers`]); the signer
//! checks them then and keeps what passed here, and round 2 finds them done.
//!
//! An entry's key is a hash of everything the check reads: the whole voucher (every field and
//! signature, as serialized) and the domains it was checked under (its chain's Settlement and the
//! binding's chain). The exchange key it is checked against is the signer's configuration, fixed
//! for the life of the process that holds this. So a hit is the answer the same computation gave,
//! and a voucher that differs in any byte is checked afresh. Only passes are kept: a refusal is
//! recomputed, so it is always reported with its reason. Sums over an order's jobs are never kept:
//! they depend on the whole part and are redone every time ([`crate::ledger::check_vouchers`]).
//!
//! A signer also holds the vouchers themselves that passed ([`CheckedVouchers::hold`]), by
//! [`voucher_id`], so the sign request can name a part's vouchers by id instead of carrying
//! them (~35 KB of JSON each, decoded by every signer of the round). A voucher it does not hold
//! makes it refuse with [`UNKNOWN_VOUCHERS`], and the coordinator sends the part whole.
//!
//! Bounded: past its capacity the oldest entry goes first (a voucher evicted before its batch is
//! signed is simply sent and checked again in round 2).

use std::collections::{HashMap, VecDeque};

use alloy::primitives::B256;
use cx_protocol::order::Eip712Domain;
use cx_protocol::voucher::{OrderSpend, Voucher};
use sha2::{Digest, Sha256};

/// How many checked vouchers a signer keeps: a part holds at most
/// [`crate::ledger::MAX_RECEIPTS_PER_BATCH`], and several tabs' worth may arrive before a batch
/// is cut. An entry is ~100 bytes.
pub const SIGNER_CAPACITY: usize = 16_384;

/// How many checked vouchers a signer holds whole, for sign requests that name them by id: two
/// full parts' worth ([`crate::ledger::MAX_RECEIPTS_PER_BATCH`]), ~20 KB each in memory.
pub const SIGNER_HELD: usize = 2 * crate::ledger::MAX_RECEIPTS_PER_BATCH;

/// What a signer answers a sign request naming a voucher it does not hold (the coordinator then
/// sends the part with its vouchers).
pub const UNKNOWN_VOUCHERS: &str = "unknown voucher";

/// A voucher's id: the SHA-256 of its JSON, every field and signature. Sign requests name held
/// vouchers by it, and a voucher's check is remembered under it.
pub fn voucher_id(voucher: &Voucher) -> B256 {
    // Serializing a voucher cannot fail (plain fields, string keys); were it ever to, the empty
    // body would make an id no voucher has, and the voucher is checked and sent whole.
    B256::from(<[u8; 32]>::from(Sha256::digest(
        serde_json::to_vec(voucher).unwrap_or_default(),
    )))
}

/// Checked vouchers and what each spends of its order, and the vouchers held whole; oldest first
/// out.
#[derive(Debug)]
pub struct CheckedVouchers {
    checks: Bounded<Option<OrderSpend>>,
    held: Bounded<Voucher>,
}

/// A map of at most `capacity` entries, the oldest evicted first (0: it keeps nothing).
#[derive(Debug)]
struct Bounded<V> {
    capacity: usize,
    entries: HashMap<B256, V>,
    order: VecDeque<B256>,
}

impl<V> Bounded<V> {
    fn new(capacity: usize) -> Self {
        Self {
            capacity,
            entries: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    fn insert(&mut self, key: B256, value: V) {
        if self.capacity == 0 || self.entries.insert(key, value).is_some() {
            return;
        }
        self.order.push_back(key);
        while self.order.len() > self.capacity {
            if let Some(old) = self.order.pop_front() {
                self.entries.remove(&old);
            }
        }
    }
}

impl CheckedVouchers {
    /// An empty memo remembering at most `capacity` checks and holding at most `held_capacity`
    /// vouchers whole (0: it keeps nothing).
    pub fn new(capacity: usize, held_capacity: usize) -> Self {
        Self {
            checks: Bounded::new(capacity),
            held: Bounded::new(held_capacity),
        }
    }

    /// The key of the check of voucher `id` ([`voucher_id`]) under `domain` (its chain's) with
    /// its binding under `binding_domain`.
    pub fn key(id: &B256, domain: &Eip712Domain, binding_domain: &Eip712Domain) -> B256 {
        let mut hash = Sha256::new();
        hash.update(domain.separator());
        hash.update(binding_domain.separator());
        hash.update(id);
        B256::from(<[u8; 32]>::from(hash.finalize()))
    }

    /// Holds `voucher` (its id `id`) whole, evicting the oldest past the held capacity.
    pub fn hold(&mut self, id: B256, voucher: Voucher) {
        self.held.insert(id, voucher);
    }

    /// The voucher of `id`, when held.
    pub fn held(&self, id: &B256) -> Option<Voucher> {
        self.held.entries.get(id).cloned()
    }

    /// What the voucher of `key` spends of its order, when it was checked and passed.
    pub fn get(&self, key: &B256) -> Option<Option<OrderSpend>> {
        self.checks.entries.get(key).copied()
    }

    /// Keeps a voucher that passed, evicting the oldest past the capacity.
    pub fn insert(&mut self, key: B256, spend: Option<OrderSpend>) {
        self.checks.insert(key, spend);
    }

    /// Checks remembered.
    pub fn len(&self) -> usize {
        self.checks.entries.len()
    }

    /// Whether it remembers none.
    pub fn is_empty(&self) -> bool {
        self.checks.entries.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spend(n: u8) -> Option<OrderSpend> {
        Some(OrderSpend {
            order: B256::repeat_byte(n),
            cap_wei: 10,
            owed_wei: 1,
        })
    }

    #[test]
    fn the_oldest_goes_first_and_nothing_is_kept_at_capacity_zero() {
        let mut memo = CheckedVouchers::new(2, 0);
        for n in 1..=3 {
            memo.insert(B256::repeat_byte(n), spend(n));
        }
        assert_eq!(memo.len(), 2);
        assert_eq!(memo.get(&B256::repeat_byte(1)), None);
        assert_eq!(memo.get(&B256::repeat_byte(3)), Some(spend(3)));
        // Inserting a key again neither grows it nor evicts another.
        memo.insert(B256::repeat_byte(2), spend(2));
        assert_eq!(memo.get(&B256::repeat_byte(2)), Some(spend(2)));
        assert_eq!(memo.len(), 2);
        let mut none = CheckedVouchers::new(0, 0);
        none.insert(B256::repeat_byte(1), None);
        assert!(none.is_empty());
    }
}
