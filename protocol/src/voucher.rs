//! Vouchers: the chain of signatures behind one paid job, which a settlement signer checks on
//! its own before it pays (SPEC §9):
//!
//! buyer-signed order (limit, tab) → exchange-signed assignment (provider, price ≤ limit) →
//! provider-signed receipt (amount ≤ price, output hash).
//!
//! The buyer's order is the intent the job was made from, or the session grant whose bearer
//! made the call (a grant covers many jobs: the sum they are owed must stay within its cap,
//! which only a check over all of a tab's vouchers can see — [`Voucher::check`] returns what it
//! needs for that, [`OrderSpend`]). A verification run ([`Authority::Verification`]) is paid
//! under the order of the job it verifies, so an intent's limit, too, covers several vouchers.
//!
//! Each link is checked against what the one before it signed, so a receipt cannot pay itself:
//! a provider key that is registered (the caller checks that on chain) but was never assigned
//! the job holds no assignment naming it, and an assignment the exchange signed for a job no
//! buyer ordered names no order its buyer signed.
//!
//! What [`Voucher::check`] does not see, and the caller must: that the receipt's key is the one
//! its provider registered on chain, that the escrow is open with this buyer, and that the sum
//! owed from one escrow is within it.

use alloy_primitives::{Address, B256, U256};
use alloy_sol_types::Eip712Domain;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::assignment::SignedAssignment;
use crate::error::{Error, Result};
use crate::order::binding::Binding;
use crate::order::{Intent, Rent, RentTarget, Reserve, Search, SessionGrant, Signed};
use crate::pq::PublicIdentity;
use crate::receipt::SignedReceipt;

/// The buyer's signed word a job was made under.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum Authority {
    /// The intent the job was made from (its EIP-712 digest is the job id).
    Intent(Signed<Intent>),
    /// The session grant whose bearer made the call (the job id is the exchange's).
    Session(Signed<SessionGrant>),
    /// The search the job answered (its EIP-712 digest is the job id) and the witness found:
    /// the receipt's input is that digest, its output the SHA-256 of the witness's 8 bytes
    /// (little-endian), and anyone checks the predicate with one hash.
    Search {
        /// The buyer's signed search.
        order: Signed<Search>,
        /// The nonce that satisfies it.
        witness: u64,
    },
    /// The reserve whose take-or-pay the job is (its EIP-712 digest is the job id and the
    /// receipt's input): the provider that committed the capacity is owed the committed rate ×
    /// the reserved compute whatever was drawn, at most `compute_ms × max_price_wei_per_s`
    /// ([`Reserve::most_wei`]). Intents drawn on the reserve are zero-priced and paid by this.
    Reserve(Signed<Reserve>),
    /// The rent on state whose term the job is (the receipt's input is its EIP-712 digest, the
    /// job id one of its holders' ([`crate::holders`]); for an adapter, the receipt's adapter
    /// is the rented one): each provider that kept the state resident is owed its term less the
    /// rebate of a missed one, and all holders together at most `max_rent_wei` ([`OrderSpend`]).
    Rent(Signed<Rent>),
    /// A verification run (T1, T3) of a job the buyer ordered under `of` (an intent or a
    /// session grant): the same work re-executed by another provider, paid from the same order.
    /// The run's job id is [`crate::replica::run_job_id`] of `original` and `run`, and what all
    /// runs of one order are owed together stays within its limit ([`OrderSpend`]).
    Verification {
        /// The order the verified job was made under.
        of: Box<Authority>,
        /// The verified job's id (run 0).
        original: B256,
        /// Which run this is (1..=[`crate::replica::MAX_RUNS`]).
        run: u8,
    },
}

/// One job's chain of signatures.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Voucher {
    /// The buyer's order.
    pub authority: Authority,
    /// The buyer's binding of its account to the ML-DSA key that co-signed the order (both
    /// halves signed): the post-quantum half of the buyer's word. A signer checks the binding
    /// and the co-signature itself instead of trusting the exchange's word that it did — with
    /// secp256k1 alone, whoever breaks it (or a compromised exchange) could forge orders.
    pub binding: Binding,
    /// The exchange's assignment of the job to the provider.
    pub assignment: SignedAssignment,
    /// The provider's receipt.
    pub receipt: SignedReceipt,
}

/// What a voucher spends of the order that authorised it, which the caller sums per order: a
/// session grant's cap covers all its calls, an intent's limit covers the job and every
/// verification run of it, and a rent's limit covers the terms of all its holders.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OrderSpend {
    /// The order's EIP-712 digest (a session's id, an intent's job id).
    pub order: B256,
    /// What all its jobs together may be owed, wei (the grant's cap, the intent's limit).
    pub cap_wei: u128,
    /// What this job's receipt claims, wei.
    pub owed_wei: u128,
}

fn broken(link: &str, reason: String) -> Error {
    Error::InvalidField {
        field: link.to_owned(),
        reason,
    }
}

impl Voucher {
    /// The job id.
    pub fn job_id(&self) -> [u8; 32] {
        self.receipt.receipt.job_id
    }

    /// Checks the buyer's binding under `binding_domain` (the domain of the chain it names,
    /// `binding.chain_id`, which the caller looks up in its own registry) and that it binds the
    /// receipt's buyer; returns the ML-DSA key the buyer's orders are co-signed with, for
    /// [`Voucher::check`]. A checker of many vouchers checks each distinct binding once.
    pub fn check_binding(&self, binding_domain: &Eip712Domain) -> Result<PublicIdentity> {
        let bound = self
            .binding
            .verify(binding_domain)
            .map_err(|e| e.within("binding"))?;
        let buyer = Address::from(self.receipt.receipt.buyer);
        if bound.account != buyer {
            return Err(broken(
                "binding.account",
                format!("binds {}, not the receipt's buyer {buyer}", bound.account),
            ));
        }
        Ok(bound.key)
    }

    /// Checks every link: the receipt's signature under the key it names, the assignment's
    /// under `exchange` (the exchange key the checker pinned), the order's EIP-712 signature
    /// under `domain` (the receipt's chain and Settlement contract) recovering the receipt's
    /// buyer and its ML-DSA co-signature under `buyer_key` (what [`Voucher::check_binding`]
    /// returned), and that each link agrees with the one it answers — for a session call, that
    /// its assignment's deadline is within what the grant allows
    /// ([`SessionGrant::last_deadline_s`]). Returns what the job spends of its order's limit (an
    /// intent's or a session grant's, shared with the verification runs of the same job), which
    /// only a sum over all vouchers can check (a rent's holders share one too); `None` for a
    /// search or a reserve, whose one job is checked against its limit here.
    pub fn check(
        &self,
        exchange: &PublicIdentity,
        domain: &Eip712Domain,
        buyer_key: &PublicIdentity,
    ) -> Result<Option<OrderSpend>> {
        let r = &self.receipt.receipt;
        let a = &self.assignment.assignment;
        self.receipt
            .verify_self_contained()
            .map_err(|e| e.within("receipt"))?;
        self.assignment
            .verify(exchange)
            .map_err(|e| e.within("assignment"))?;
        let same: [(&str, bool); 7] = [
            ("job_id", a.job_id == r.job_id),
            ("chain_id", a.chain_id == r.chain_id),
            ("escrow_id", a.escrow_id == r.escrow_id),
            ("buyer", a.buyer == r.buyer),
            ("provider_key", a.provider_key == r.provider_key),
            ("input_hash", a.input_hash == r.input_hash),
            ("adapter_hash", a.adapter_hash == r.adapter_hash),
        ];
        if let Some((field, _)) = same.iter().find(|(_, ok)| !ok) {
            return Err(broken(
                &format!("receipt.{field}"),
                "differs from the exchange's assignment of the job".into(),
            ));
        }
        if r.amount_owed_wei > a.price_wei {
            return Err(broken(
                "receipt.amount_owed_wei",
                format!(
                    "{} wei is more than the assigned price of {} wei",
                    r.amount_owed_wei, a.price_wei
                ),
            ));
        }
        // A run is checked against the order of the job it verifies, as that job would be; its
        // own id must be derived from that job's.
        let (authority, order_job_id) = match &self.authority {
            Authority::Verification { of, original, run } => {
                if *run == 0 || *run > crate::replica::MAX_RUNS {
                    return Err(broken(
                        "authority.run",
                        format!("must be 1..={}", crate::replica::MAX_RUNS),
                    ));
                }
                if crate::replica::run_job_id(original.0, *run) != r.job_id {
                    return Err(broken(
                        "receipt.job_id",
                        format!("is not verification run {run} of job {original}"),
                    ));
                }
                if !matches!(**of, Authority::Intent(_) | Authority::Session(_)) {
                    return Err(broken(
                        "authority.of",
                        "a verification run verifies an intent's or a session call's job".into(),
                    ));
                }
                (&**of, original.0)
            }
            other => (other, r.job_id),
        };
        let buyer = Address::from(r.buyer);
        // Both halves of the buyer's word: the EIP-712 signature recovers the buyer, and the
        // ML-DSA co-signature over the same digest verifies under the key its binding names.
        fn both<T: crate::order::Order>(
            signed: &Signed<T>,
            domain: &Eip712Domain,
            key: &PublicIdentity,
        ) -> Result<crate::order::signed::Verified> {
            let verified = signed.recover(domain).map_err(|e| e.within("authority"))?;
            signed
                .check_cosignature(&verified, key)
                .map_err(|e| e.within("authority"))?;
            Ok(verified)
        }
        let (recovered, tab_id) = match authority {
            Authority::Intent(signed) => (both(signed, domain, buyer_key)?, signed.order.tab_id),
            Authority::Session(signed) => (both(signed, domain, buyer_key)?, signed.order.tab_id),
            Authority::Search { order, .. } => {
                (both(order, domain, buyer_key)?, order.order.tab_id)
            }
            Authority::Reserve(signed) => (both(signed, domain, buyer_key)?, signed.order.tab_id),
            Authority::Rent(signed) => (both(signed, domain, buyer_key)?, signed.order.tab_id),
            Authority::Verification { .. } => {
                return Err(broken(
                    "authority.of",
                    "a verification run verifies an intent's or a session call's job".into(),
                ));
            }
        };
        if recovered.account != buyer {
            return Err(broken(
                "authority.signature",
                format!(
                    "recovers {}, not the receipt's buyer {buyer}",
                    recovered.account
                ),
            ));
        }
        if tab_id != r.escrow_id {
            return Err(broken(
                "authority.order.tab_id",
                format!("is tab {tab_id}, not the receipt's escrow {}", r.escrow_id),
            ));
        }
        match authority {
            Authority::Intent(signed) => {
                let intent = &signed.order;
                if recovered.digest.0 != order_job_id {
                    return Err(broken(
                        "receipt.job_id",
                        "is not the intent's EIP-712 digest".into(),
                    ));
                }
                if a.price_wei > intent.max_price_wei {
                    return Err(broken(
                        "assignment.price_wei",
                        format!(
                            "{} wei is above the buyer's limit of {} wei",
                            a.price_wei, intent.max_price_wei
                        ),
                    ));
                }
                if intent.request_hash.0 != r.input_hash {
                    return Err(broken(
                        "receipt.input_hash",
                        "is not the request hash the buyer signed".into(),
                    ));
                }
                if intent.adapter_id.unwrap_or(B256::ZERO).0 != r.adapter_hash {
                    return Err(broken(
                        "receipt.adapter_hash",
                        "is not the adapter the buyer signed".into(),
                    ));
                }
                if a.deadline_s > intent.deadline_s {
                    return Err(broken(
                        "assignment.deadline_s",
                        format!(
                            "{} is after the buyer's deadline {}",
                            a.deadline_s, intent.deadline_s
                        ),
                    ));
                }
                Ok(Some(OrderSpend {
                    order: recovered.digest,
                    cap_wei: intent.max_price_wei,
                    owed_wei: r.amount_owed_wei,
                }))
            }
            Authority::Search { order, witness } => {
                let search = &order.order;
                if recovered.digest.0 != r.job_id || recovered.digest.0 != r.input_hash {
                    return Err(broken(
                        "receipt.job_id",
                        "a search's job id and input are its EIP-712 digest".into(),
                    ));
                }
                if a.price_wei > search.max_price_wei {
                    return Err(broken(
                        "assignment.price_wei",
                        format!(
                            "{} wei is above the buyer's limit of {} wei",
                            a.price_wei, search.max_price_wei
                        ),
                    ));
                }
                // Paid for the work a witness implies at no more than the buyer's limit per
                // trial of the work it budgeted: max_price × witness_trials / budget_trials (one
                // wei of rounding allowed: the exchange rounds its price up).
                let budget = U256::from(search.budget_trials().max(1));
                let implied = U256::from(search.max_price_wei)
                    .saturating_mul(U256::from(search.witness_trials()))
                    / budget
                    + U256::from(1u8);
                if U256::from(a.price_wei) > implied {
                    return Err(broken(
                        "assignment.price_wei",
                        format!(
                            "{} wei is above what the witness's work is worth at the buyer's \
                             limit ({} wei for {} trials; a witness implies {} trials)",
                            a.price_wei,
                            search.max_price_wei,
                            search.budget_trials(),
                            search.witness_trials()
                        ),
                    ));
                }
                if !search.is_witness(*witness) {
                    return Err(broken(
                        "authority.witness",
                        format!("{witness} does not satisfy the search"),
                    ));
                }
                let output: [u8; 32] = Sha256::digest(witness.to_le_bytes()).into();
                if output != r.output_hash {
                    return Err(broken(
                        "receipt.output_hash",
                        "is not the SHA-256 of the witness (8 bytes, little-endian)".into(),
                    ));
                }
                if a.deadline_s > search.deadline_s {
                    return Err(broken(
                        "assignment.deadline_s",
                        format!(
                            "{} is after the search's deadline {}",
                            a.deadline_s, search.deadline_s
                        ),
                    ));
                }
                Ok(None)
            }
            Authority::Reserve(signed) => {
                let reserve = &signed.order;
                if recovered.digest.0 != r.job_id || recovered.digest.0 != r.input_hash {
                    return Err(broken(
                        "receipt.job_id",
                        "a reserve's job id and input are its EIP-712 digest".into(),
                    ));
                }
                if a.price_wei > reserve.most_wei() {
                    return Err(broken(
                        "assignment.price_wei",
                        format!(
                            "{} wei is above the buyer's limit of {} wei ({} ms at {} wei/s)",
                            a.price_wei,
                            reserve.most_wei(),
                            reserve.compute_ms,
                            reserve.max_price_wei_per_s
                        ),
                    ));
                }
                if r.compute_ms > reserve.compute_ms {
                    return Err(broken(
                        "receipt.compute_ms",
                        format!(
                            "{} ms is more than the {} ms reserved",
                            r.compute_ms, reserve.compute_ms
                        ),
                    ));
                }
                if a.deadline_s > reserve.window_end_s {
                    return Err(broken(
                        "assignment.deadline_s",
                        format!(
                            "{} is after the reserve's window end {}",
                            a.deadline_s, reserve.window_end_s
                        ),
                    ));
                }
                Ok(None)
            }
            Authority::Rent(signed) => {
                let rent = &signed.order;
                if crate::holders::holder_of(recovered.digest.0, r.job_id).is_none()
                    || recovered.digest.0 != r.input_hash
                {
                    return Err(broken(
                        "receipt.job_id",
                        "a rent's input is its EIP-712 digest and its job id one of its \
                         holders' (crate::holders::holder_job_id)"
                            .into(),
                    ));
                }
                if a.price_wei > rent.max_rent_wei {
                    return Err(broken(
                        "assignment.price_wei",
                        format!(
                            "{} wei is above the buyer's limit of {} wei",
                            a.price_wei, rent.max_rent_wei
                        ),
                    ));
                }
                let kept = if rent.target_kind == RentTarget::Adapter {
                    rent.target.0
                } else {
                    [0; 32]
                };
                if r.adapter_hash != kept {
                    return Err(broken(
                        "receipt.adapter_hash",
                        "is not the adapter the buyer rented (zero for a base or a prefix)".into(),
                    ));
                }
                // Its holders together stay within the one limit the buyer signed.
                Ok(Some(OrderSpend {
                    order: recovered.digest,
                    cap_wei: rent.max_rent_wei,
                    owed_wei: r.amount_owed_wei,
                }))
            }
            Authority::Session(signed) => {
                let grant = &signed.order;
                if a.deadline_s > grant.last_deadline_s() {
                    return Err(broken(
                        "assignment.deadline_s",
                        format!(
                            "{} is past the last deadline a call under this session may have \
                             ({}: its expiry {} + {} s): the call came after the grant expired",
                            a.deadline_s,
                            grant.last_deadline_s(),
                            grant.expiry_s,
                            SessionGrant::MAX_CALL_DEADLINE_S
                        ),
                    ));
                }
                Ok(Some(OrderSpend {
                    order: recovered.digest,
                    cap_wei: grant.spend_cap_wei,
                    owed_wei: r.amount_owed_wei,
                }))
            }
            Authority::Verification { .. } => Err(broken(
                "authority.of",
                "a verification run verifies an intent's or a session call's job".into(),
            )),
        }
    }
}

/// The parties of one simulated job, for simulations and tests that play every role: each
/// signs its own link exactly as it would in the market.
#[derive(Clone, Copy, Debug)]
pub struct Parties<'a> {
    /// The buyer's account key (EIP-712).
    pub buyer: &'a k256::ecdsa::SigningKey,
    /// The buyer's bound ML-DSA identity (the order's co-signature).
    pub buyer_identity: &'a crate::pq::Identity,
    /// The exchange's identity (signs the assignment).
    pub exchange: &'a crate::pq::Identity,
    /// The provider's identity (signs the receipt).
    pub provider: &'a crate::pq::Identity,
    /// The provider's payout account.
    pub payout: Address,
}

impl Parties<'_> {
    /// The buyer's binding of its account to its ML-DSA identity under `domain`.
    pub fn binding(&self, domain: &Eip712Domain) -> Result<Binding> {
        Binding::sign(self.buyer, self.buyer_identity, domain, 0)
    }

    /// The voucher of one intent-made job on tab `escrow_id` (chain and contract from
    /// `domain`): the buyer's intent (limit `limit_wei`, replay guard `nonce`), the exchange's
    /// assignment at `price_wei`, the provider's receipt claiming `owed_wei` for the output
    /// `"output"`.
    pub fn intent_job(
        &self,
        domain: &Eip712Domain,
        escrow_id: u64,
        nonce: u64,
        limit_wei: u128,
        price_wei: u128,
        owed_wei: u128,
    ) -> Result<Voucher> {
        use crate::assignment::Assignment;
        use crate::order::{InferenceRequest, request_hash};
        use crate::receipt::{JobTerms, Receipt, Work};
        let (chain_id, _) = crate::order::signed::domain_parts(domain)?;
        let request = InferenceRequest {
            prompt: format!("job {nonce}"),
            max_tokens: 8,
            ..Default::default()
        };
        let intent = Intent {
            want: "model".into(),
            adapter_id: None,
            request_hash: request_hash(&request),
            deadline_s: 4_000_000_000,
            max_price_wei: limit_wei,
            market_limit: false,
            min_tier: crate::Tier::T0,
            determinism: crate::DeterminismClass::D,
            tab_id: escrow_id,
            nonce,
            expiry_s: 4_000_000_000,
        };
        let signed = crate::order::sign(intent, domain, self.buyer, self.buyer_identity)?;
        let job_id = signed.digest(domain);
        let buyer = signed.account;
        let assignment = SignedAssignment::sign(
            Assignment {
                job_id: job_id.0,
                chain_id,
                escrow_id,
                buyer: buyer.0.0,
                provider_key: self.provider.id().0,
                price_wei,
                deadline_s: 4_000_000_000,
                input_hash: request_hash(&request).0,
                adapter_hash: [0; 32],
            },
            self.exchange,
        )?;
        let terms = JobTerms {
            job_id,
            chain_id,
            escrow_id,
            buyer,
            request: &request,
            adapter: None,
        };
        let work = Work {
            output_text: "output",
            tokens: 16,
            compute_ms: 5,
            class: crate::DeterminismClass::D,
            amount_owed_wei: owed_wei,
        };
        let receipt = Receipt::for_output(&terms, &work, self.payout, self.provider.id().0)?;
        Ok(Voucher {
            authority: Authority::Intent(signed),
            binding: self.binding(domain)?,
            assignment,
            receipt: SignedReceipt::sign(receipt, self.provider)?,
        })
    }
}

impl Parties<'_> {
    /// The voucher of a search's witness on tab `escrow_id`: the buyer's search for one leading
    /// zero bit (a witness implies 2 trials) with success probability `success_ppm` at most
    /// `max_price_wei` (replay guard `nonce`), the exchange's assignment at `price_wei`, the
    /// provider's receipt claiming it all.
    pub fn search_job(
        &self,
        domain: &Eip712Domain,
        escrow_id: u64,
        nonce: u64,
        (success_ppm, max_price_wei): (u32, u128),
        price_wei: u128,
    ) -> Result<Voucher> {
        use crate::assignment::Assignment;
        use crate::receipt::Receipt;
        let (chain_id, _) = crate::order::signed::domain_parts(domain)?;
        let mut target = B256::ZERO;
        target.0[0] = 0x80;
        let search = Search {
            prefix: b"cx".to_vec().into(),
            target,
            success_ppm,
            deadline_s: 4_000_000_000,
            max_price_wei,
            tab_id: escrow_id,
            nonce,
            expiry_s: 4_000_000_000,
        };
        let witness = (0..)
            .find(|n| search.is_witness(*n))
            .expect("half of all nonces are");
        let signed = crate::order::sign(search, domain, self.buyer, self.buyer_identity)?;
        let id = signed.digest(domain).0;
        let buyer = signed.account.0.0;
        let assignment = SignedAssignment::sign(
            Assignment {
                job_id: id,
                chain_id,
                escrow_id,
                buyer,
                provider_key: self.provider.id().0,
                price_wei,
                deadline_s: 4_000_000_000,
                input_hash: id,
                adapter_hash: [0; 32],
            },
            self.exchange,
        )?;
        let receipt = Receipt {
            job_id: id,
            chain_id,
            escrow_id,
            input_hash: id,
            output_hash: Sha256::digest(witness.to_le_bytes()).into(),
            adapter_hash: [0; 32],
            tokens: 0,
            compute_ms: 0,
            class: crate::DeterminismClass::D,
            provider: self.payout.0.0,
            provider_key: self.provider.id().0,
            amount_owed_wei: price_wei,
            buyer,
        };
        Ok(Voucher {
            authority: Authority::Search {
                order: signed,
                witness,
            },
            binding: self.binding(domain)?,
            assignment,
            receipt: SignedReceipt::sign(receipt, self.provider)?,
        })
    }
}

impl Parties<'_> {
    /// The voucher of a reserve's take-or-pay on tab `escrow_id`: the buyer's reserve of
    /// `compute_ms` at most `max_rate_wei_per_s` (replay guard `nonce`), the exchange's
    /// assignment at `price_wei` on `escrow_id` (another tab than the reserve's, to test that it
    /// is refused, with `assigned_tab`), the provider's receipt claiming `owed_wei`.
    #[allow(clippy::too_many_arguments)]
    pub fn reserve_job(
        &self,
        domain: &Eip712Domain,
        (escrow_id, assigned_tab): (u64, u64),
        nonce: u64,
        compute_ms: u64,
        max_rate_wei_per_s: u64,
        price_wei: u128,
        owed_wei: u128,
    ) -> Result<Voucher> {
        use crate::assignment::Assignment;
        use crate::receipt::Receipt;
        let (chain_id, _) = crate::order::signed::domain_parts(domain)?;
        let reserve = Reserve {
            model: "model".into(),
            tier: crate::Tier::T0,
            window_start_s: 1_000,
            window_end_s: 2_000,
            compute_ms,
            max_price_wei_per_s: max_rate_wei_per_s,
            tab_id: escrow_id,
            nonce,
            expiry_s: 4_000_000_000,
        };
        let signed = crate::order::sign(reserve, domain, self.buyer, self.buyer_identity)?;
        let id = signed.digest(domain).0;
        let buyer = signed.account.0.0;
        let assignment = SignedAssignment::sign(
            Assignment {
                job_id: id,
                chain_id,
                escrow_id: assigned_tab,
                buyer,
                provider_key: self.provider.id().0,
                price_wei,
                deadline_s: 2_000,
                input_hash: id,
                adapter_hash: [0; 32],
            },
            self.exchange,
        )?;
        let receipt = Receipt {
            job_id: id,
            chain_id,
            escrow_id: assigned_tab,
            input_hash: id,
            output_hash: [0; 32],
            adapter_hash: [0; 32],
            tokens: 0,
            compute_ms,
            class: crate::DeterminismClass::D,
            provider: self.payout.0.0,
            provider_key: self.provider.id().0,
            amount_owed_wei: owed_wei,
            buyer,
        };
        Ok(Voucher {
            authority: Authority::Reserve(signed),
            binding: self.binding(domain)?,
            assignment,
            receipt: SignedReceipt::sign(receipt, self.provider)?,
        })
    }
}

impl Parties<'_> {
    /// The voucher of a rent's term on tab `escrow_id`, paid from `assigned_tab`: the buyer's
    /// rent of adapter `adapter` at most `max_rent_wei` (replay guard `nonce`), the exchange's
    /// assignment at `price_wei`, the provider's receipt claiming `owed_wei`.
    #[allow(clippy::too_many_arguments)]
    pub fn rent_job(
        &self,
        domain: &Eip712Domain,
        (escrow_id, assigned_tab): (u64, u64),
        nonce: u64,
        adapter: B256,
        max_rent_wei: u128,
        price_wei: u128,
        owed_wei: u128,
    ) -> Result<Voucher> {
        use crate::assignment::Assignment;
        use crate::receipt::Receipt;
        let (chain_id, _) = crate::order::signed::domain_parts(domain)?;
        let rent = Rent {
            target_kind: RentTarget::Adapter,
            target: adapter,
            term_s: 600,
            max_rent_wei,
            epsilon_ppm: 10_000,
            tab_id: escrow_id,
            nonce,
            expiry_s: 4_000_000_000,
        };
        let signed = crate::order::sign(rent, domain, self.buyer, self.buyer_identity)?;
        let id = signed.digest(domain).0;
        let buyer = signed.account.0.0;
        let assignment = SignedAssignment::sign(
            Assignment {
                job_id: id,
                chain_id,
                escrow_id: assigned_tab,
                buyer,
                provider_key: self.provider.id().0,
                price_wei,
                deadline_s: 4_000_000_000,
                input_hash: id,
                adapter_hash: adapter.0,
            },
            self.exchange,
        )?;
        let receipt = Receipt {
            job_id: id,
            chain_id,
            escrow_id: assigned_tab,
            input_hash: id,
            output_hash: [0; 32],
            adapter_hash: adapter.0,
            tokens: 0,
            compute_ms: 0,
            class: crate::DeterminismClass::D,
            provider: self.payout.0.0,
            provider_key: self.provider.id().0,
            amount_owed_wei: owed_wei,
            buyer,
        };
        Ok(Voucher {
            authority: Authority::Rent(signed),
            binding: self.binding(domain)?,
            assignment,
            receipt: SignedReceipt::sign(receipt, self.provider)?,
        })
    }
}

impl Parties<'_> {
    /// The voucher of verification run `run` of `original` (an intent's job, say from
    /// [`Parties::intent_job`]): the same order, an assignment of the run's derived id to this
    /// provider at `price_wei`, and this provider's receipt claiming `owed_wei` for `output`.
    pub fn run_job(
        &self,
        original: &Voucher,
        run: u8,
        price_wei: u128,
        owed_wei: u128,
        output: &str,
    ) -> Result<Voucher> {
        let job_id = crate::replica::run_job_id(original.job_id(), run);
        let mut assignment = original.assignment.assignment.clone();
        assignment.job_id = job_id;
        assignment.provider_key = self.provider.id().0;
        assignment.price_wei = price_wei;
        let mut receipt = original.receipt.receipt.clone();
        receipt.job_id = job_id;
        receipt.output_hash = Sha256::digest(output.as_bytes()).into();
        receipt.provider = self.payout.0.0;
        receipt.provider_key = self.provider.id().0;
        receipt.amount_owed_wei = owed_wei;
        Ok(Voucher {
            authority: Authority::Verification {
                of: Box::new(original.authority.clone()),
                original: B256::from(original.job_id()),
                run,
            },
            binding: original.binding.clone(),
            assignment: SignedAssignment::sign(assignment, self.exchange)?,
            receipt: SignedReceipt::sign(receipt, self.provider)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pq::Identity;
    use crate::receipt::Receipt;
    use k256::ecdsa::SigningKey;

    struct World {
        buyer: SigningKey,
        buyer_identity: Identity,
        exchange: Identity,
        provider: Identity,
    }

    fn world() -> World {
        World {
            buyer: SigningKey::from_slice(&[7; 32]).unwrap(),
            buyer_identity: Identity::from_seed([1; 32]),
            exchange: Identity::from_seed([2; 32]),
            provider: Identity::from_seed([3; 32]),
        }
    }

    fn parties(w: &World) -> Parties<'_> {
        Parties {
            buyer: &w.buyer,
            buyer_identity: &w.buyer_identity,
            exchange: &w.exchange,
            provider: &w.provider,
            payout: Address::repeat_byte(0x11),
        }
    }

    fn domain() -> Eip712Domain {
        crate::order::domain(31337, Address::repeat_byte(0xcc))
    }

    #[test]
    fn an_honest_chain_passes_and_each_broken_link_is_named() {
        let w = world();
        let v = parties(&w)
            .intent_job(&domain(), 4, 1, 1_000, 900, 800)
            .unwrap();
        let spend = v
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap()
            .unwrap();
        assert_eq!(
            (spend.order.0, spend.cap_wei, spend.owed_wei),
            (v.job_id(), 1_000, 800),
            "an intent's job spends of the intent's limit"
        );
        let json = serde_json::to_string(&v).unwrap();
        let back: Voucher = serde_json::from_str(&json).unwrap();
        assert_eq!(back, v);

        // Under another exchange key, or another chain's domain.
        let other = Identity::from_seed([9; 32]);
        let err = v
            .check(&other.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("assignment"), "{err}");
        let elsewhere = crate::order::domain(31338, Address::repeat_byte(0xcc));
        let err = v
            .check(&w.exchange.public(), &elsewhere, &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("chain"), "{err}");

        // A price above the buyer's limit, signed by the exchange itself.
        let dear = parties(&w)
            .intent_job(&domain(), 4, 2, 1_000, 1_001, 800)
            .unwrap();
        let err = dear
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");

        // A receipt claiming more than the assignment, re-signed by the provider.
        let greedy = parties(&w)
            .intent_job(&domain(), 4, 3, 1_000, 900, 901)
            .unwrap();
        let err = greedy
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("assigned price"), "{err}");
    }

    #[test]
    fn a_search_pays_the_work_its_witness_implies_at_the_buyers_limit_per_trial() {
        let w = world();
        let check =
            |v: Voucher| v.check(&w.exchange.public(), &domain(), &w.buyer_identity.public());
        // 99.9 %: 10 trials budgeted at most 1 000 wei, 100 a trial; a witness implies 2.
        let fair = parties(&w)
            .search_job(&domain(), 4, 1, (999_000, 1_000), 200)
            .unwrap();
        assert_eq!(check(fair).unwrap(), None);
        // The whole limit for two trials' work, signed by the exchange itself: refused.
        let greedy = parties(&w)
            .search_job(&domain(), 4, 2, (999_000, 1_000), 1_000)
            .unwrap();
        let err = check(greedy).unwrap_err();
        assert!(err.to_string().contains("witness's work"), "{err}");
        // 50 %: one trial budgeted, below the two a witness implies: the limit is the price.
        let small = parties(&w)
            .search_job(&domain(), 4, 3, (500_000, 1_000), 1_000)
            .unwrap();
        assert_eq!(check(small).unwrap(), None);
    }

    /// A `cx/matmul-f32` job settles as any intent: the request hash the buyer signed is the
    /// matmul request's, the receipt hashes the product's bytes, and the chain checks as usual.
    #[test]
    fn a_matmul_intent_settles_through_the_same_chain_of_signatures() {
        use crate::matmul::{MATMUL_MODEL, MatmulRequest, product_hash};
        let w = world();
        let request = MatmulRequest {
            m: 2,
            k: 3,
            n: 4,
            seed_a: 1,
            seed_b: 2,
        };
        let intent = Intent {
            want: MATMUL_MODEL.into(),
            adapter_id: None,
            request_hash: request.hash(),
            deadline_s: 4_000_000_000,
            max_price_wei: 1_000,
            market_limit: false,
            min_tier: crate::Tier::T2,
            determinism: crate::DeterminismClass::DInf,
            tab_id: 4,
            nonce: 1,
            expiry_s: 4_000_000_000,
        };
        let signed = crate::order::sign(intent, &domain(), &w.buyer, &w.buyer_identity).unwrap();
        let job_id = signed.digest(&domain());
        let assignment = crate::assignment::Assignment {
            job_id: job_id.0,
            chain_id: 31337,
            escrow_id: 4,
            buyer: signed.account.0.0,
            provider_key: w.provider.id().0,
            price_wei: 900,
            deadline_s: 4_000_000_000,
            input_hash: request.hash().0,
            adapter_hash: [0; 32],
        };
        let receipt = Receipt {
            job_id: job_id.0,
            chain_id: 31337,
            escrow_id: 4,
            input_hash: request.hash().0,
            output_hash: product_hash(&[0u8; 32]),
            adapter_hash: [0; 32],
            tokens: 0,
            compute_ms: 1,
            class: crate::DeterminismClass::DInf,
            provider: [0x11; 20],
            provider_key: w.provider.id().0,
            amount_owed_wei: 900,
            buyer: signed.account.0.0,
        };
        let voucher = |receipt: Receipt| Voucher {
            authority: Authority::Intent(signed.clone()),
            binding: parties(&w).binding(&domain()).unwrap(),
            assignment: SignedAssignment::sign(assignment.clone(), &w.exchange).unwrap(),
            receipt: SignedReceipt::sign(receipt, &w.provider).unwrap(),
        };
        let v = voucher(receipt.clone());
        let spend = v
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap()
            .unwrap();
        assert_eq!(
            (spend.cap_wei, spend.owed_wei),
            (signed.order.max_price_wei, 900)
        );
        // A receipt for other operands than the buyer signed for is refused by its field.
        let other = MatmulRequest {
            seed_b: 3,
            ..request
        };
        let v = voucher(Receipt {
            input_hash: other.hash().0,
            ..receipt
        });
        let err = v
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("input_hash"), "{err}");
    }

    #[test]
    fn a_registered_key_cannot_pay_itself_from_an_escrow_it_was_not_assigned() {
        let w = world();
        let honest = parties(&w)
            .intent_job(&domain(), 4, 1, 1_000, 900, 900)
            .unwrap();
        // Mallory is a registered provider with a key of her own: she signs a receipt for the
        // same job (or any open escrow) naming herself, and carries the real assignment.
        let mallory = Identity::from_seed([66; 32]);
        let mut receipt: Receipt = honest.receipt.receipt.clone();
        receipt.provider = [0x66; 20];
        receipt.provider_key = mallory.id().0;
        let forged = Voucher {
            receipt: SignedReceipt::sign(receipt.clone(), &mallory).unwrap(),
            ..honest.clone()
        };
        let err = forged
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("provider_key"), "{err}");

        // Nor with an assignment she signed herself as "the exchange".
        let mut own = forged.clone();
        own.assignment = SignedAssignment::sign(
            crate::assignment::Assignment {
                provider_key: mallory.id().0,
                ..honest.assignment.assignment.clone()
            },
            &mallory,
        )
        .unwrap();
        let err = own
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("assignment"), "{err}");

        // Nor on another escrow of the same buyer: the order names its tab.
        let mut moved = honest.clone();
        moved.receipt.receipt.escrow_id = 5;
        moved.receipt = SignedReceipt::sign(moved.receipt.receipt.clone(), &w.provider).unwrap();
        let err = moved
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("escrow_id"), "{err}");
    }

    #[test]
    fn a_reserve_pays_its_take_or_pay_within_its_limit_on_its_own_tab() {
        let w = world();
        let p = parties(&w);
        // 2.5 s reserved at most 1 000 wei/s: at most 2 500 wei; committed at 800 wei/s.
        let honest = p
            .reserve_job(&domain(), (4, 4), 1, 2_500, 1_000, 2_000, 2_000)
            .unwrap();
        assert_eq!(
            honest
                .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
                .unwrap(),
            None
        );
        let json = serde_json::to_string(&honest).unwrap();
        assert_eq!(serde_json::from_str::<Voucher>(&json).unwrap(), honest);

        // Over the buyer's limit, though the exchange signed it and the provider claims it.
        let dear = p
            .reserve_job(&domain(), (4, 4), 2, 2_500, 1_000, 2_501, 2_501)
            .unwrap();
        let err = dear
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");

        // Paid from another tab of the same buyer than the one the reserve names.
        let moved = p
            .reserve_job(&domain(), (4, 5), 3, 2_500, 1_000, 2_000, 2_000)
            .unwrap();
        let err = moved
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("tab"), "{err}");

        // The job id must be the reserve's digest: another reserve's voucher cannot be reused.
        let other = p
            .reserve_job(&domain(), (4, 4), 4, 2_500, 1_000, 2_000, 2_000)
            .unwrap();
        let swapped = Voucher {
            authority: other.authority,
            ..honest
        };
        let err = swapped
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("digest"), "{err}");
    }

    #[test]
    fn a_rent_pays_its_term_within_its_limit_on_its_own_tab() {
        let w = world();
        let p = parties(&w);
        let adapter = B256::repeat_byte(0xad);
        let honest = p
            .rent_job(&domain(), (4, 4), 1, adapter, 5_000, 4_000, 4_000)
            .unwrap();
        assert_eq!(
            honest
                .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
                .unwrap()
                .map(|s| (s.cap_wei, s.owed_wei)),
            Some((5_000, 4_000)),
            "each holder's term spends of the rent's one limit"
        );

        let dear = p
            .rent_job(&domain(), (4, 4), 2, adapter, 5_000, 5_001, 5_001)
            .unwrap();
        let err = dear
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("limit"), "{err}");

        let moved = p
            .rent_job(&domain(), (4, 5), 3, adapter, 5_000, 4_000, 4_000)
            .unwrap();
        let err = moved
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("tab"), "{err}");

        // A receipt for another adapter than the one rented (the exchange signed it too).
        let mut other = honest.clone();
        other.receipt.receipt.adapter_hash = [0xee; 32];
        other.receipt = SignedReceipt::sign(other.receipt.receipt.clone(), &w.provider).unwrap();
        other.assignment = SignedAssignment::sign(
            crate::assignment::Assignment {
                adapter_hash: [0xee; 32],
                ..honest.assignment.assignment.clone()
            },
            &w.exchange,
        )
        .unwrap();
        let err = other
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("adapter"), "{err}");
    }

    #[test]
    fn a_verification_run_is_paid_under_the_verified_jobs_order_and_only_under_its_own_id() {
        let w = world();
        let original = parties(&w)
            .intent_job(&domain(), 4, 1, 1_000, 400, 400)
            .unwrap();
        let second = Identity::from_seed([5; 32]);
        let replica = Parties {
            provider: &second,
            payout: Address::repeat_byte(0x22),
            ..parties(&w)
        };
        let run = replica.run_job(&original, 1, 400, 350, "output").unwrap();
        let spend = run
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap()
            .unwrap();
        assert_eq!(
            spend.order.0,
            original.job_id(),
            "the intent's limit, shared"
        );
        assert_eq!((spend.cap_wei, spend.owed_wei), (1_000, 350));
        let json = serde_json::to_string(&run).unwrap();
        assert_eq!(serde_json::from_str::<Voucher>(&json).unwrap(), run);

        // A run whose id is not derived from the verified job: an unrelated job, another run
        // index, or the verified job's own id.
        for (original_id, index) in [
            (B256::repeat_byte(0x42), 1),
            (B256::from(original.job_id()), 2),
        ] {
            let mut unrelated = run.clone();
            unrelated.authority = Authority::Verification {
                of: Box::new(original.authority.clone()),
                original: original_id,
                run: index,
            };
            let err = unrelated
                .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
                .unwrap_err();
            assert!(err.to_string().contains("receipt.job_id"), "{err}");
        }
        let mut zero = run.clone();
        zero.authority = Authority::Verification {
            of: Box::new(original.authority.clone()),
            original: B256::from(original.job_id()),
            run: 0,
        };
        let err = zero
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("authority.run"), "{err}");

        // A run of another intent's job (the order's digest is not the verified job).
        let other = parties(&w)
            .intent_job(&domain(), 4, 2, 1_000, 400, 400)
            .unwrap();
        let foreign = replica.run_job(&other, 1, 400, 350, "output").unwrap();
        let mut swapped = foreign.clone();
        swapped.authority = Authority::Verification {
            of: Box::new(original.authority.clone()),
            original: B256::from(other.job_id()),
            run: 1,
        };
        let err = swapped
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("EIP-712 digest"), "{err}");

        // A run of a run is not a thing.
        let mut nested = run.clone();
        nested.authority = Authority::Verification {
            of: Box::new(run.authority.clone()),
            original: B256::from(original.job_id()),
            run: 1,
        };
        let err = nested
            .check(&w.exchange.public(), &domain(), &w.buyer_identity.public())
            .unwrap_err();
        assert!(err.to_string().contains("authority.of"), "{err}");
    }

    /// Issue 32, item 11: the committee trusted the exchange for the post-quantum half. An
    /// order whose EIP-712 signature is good but whose ML-DSA co-signature is not the bound
    /// key's (forged by whoever breaks secp256k1, or a compromised exchange) is refused, as is a
    /// binding that is not the buyer's or whose halves do not verify.
    #[test]
    fn the_buyers_co_signature_and_binding_are_checked_not_taken_on_trust() {
        let w = world();
        let p = parties(&w);
        let v = p.intent_job(&domain(), 4, 1, 1_000, 900, 800).unwrap();
        let key = v.check_binding(&domain()).unwrap();
        assert_eq!(key, w.buyer_identity.public());
        v.check(&w.exchange.public(), &domain(), &key).unwrap();

        // The co-signature by another ML-DSA key than the bound one.
        let mallory = Identity::from_seed([66; 32]);
        let mut forged = v.clone();
        if let Authority::Intent(signed) = &mut forged.authority {
            let digest = signed.digest(&domain());
            signed.mldsa_signature = alloy_primitives::Bytes::copy_from_slice(
                &mallory
                    .sign(crate::order::signed::ORDER_CONTEXT, digest.as_slice())
                    .unwrap(),
            );
        }
        let err = forged
            .check(&w.exchange.public(), &domain(), &key)
            .unwrap_err();
        assert!(err.to_string().contains("mldsa_signature"), "{err}");
        // Or none at all.
        if let Authority::Intent(signed) = &mut forged.authority {
            signed.mldsa_signature = Default::default();
        }
        assert!(forged.check(&w.exchange.public(), &domain(), &key).is_err());

        // A binding of Mallory's key to Mallory's own account, passed off as the buyer's.
        let mallory_account = SigningKey::from_slice(&[0x66; 32]).unwrap();
        let mut borrowed = v.clone();
        borrowed.binding = Binding::sign(&mallory_account, &mallory, &domain(), 0).unwrap();
        let err = borrowed.check_binding(&domain()).unwrap_err();
        assert!(err.to_string().contains("binding.account"), "{err}");
        // The buyer's binding with Mallory's key swapped in: the account never signed for it.
        let mut swapped = v.clone();
        swapped.binding.mldsa_key =
            alloy_primitives::Bytes::copy_from_slice(&mallory.public().to_bytes());
        assert!(swapped.check_binding(&domain()).is_err());
        // The binding under another deployment's domain than the one it names.
        let elsewhere = crate::order::domain(31338, Address::repeat_byte(0xcc));
        assert!(v.check_binding(&elsewhere).is_err());
    }

    /// Issue 32, item 11: a call under a session grant is paid only if it was assigned before
    /// the grant expired, which its assignment's deadline bounds: at most the grant's expiry plus
    /// the longest deadline a call may ask for.
    #[test]
    fn a_session_call_assigned_after_the_grant_expired_is_refused() {
        use crate::order::SessionGrant;
        let w = world();
        let p = parties(&w);
        let intent_made = p.intent_job(&domain(), 4, 1, 1_000, 900, 800).unwrap();
        let grant = SessionGrant {
            tab_id: 4,
            spend_cap_wei: 10_000,
            expiry_s: 1_000_000,
            default_deadline_s: 60,
            default_tier: crate::Tier::T0,
            default_determinism: crate::DeterminismClass::D,
            default_max_price_wei: 1_000,
            bearer_hash: SessionGrant::bearer_hash_of(b"secret"),
            nonce: 7,
        };
        let signed =
            crate::order::sign(grant.clone(), &domain(), &w.buyer, &w.buyer_identity).unwrap();
        let call = |deadline_s: u64| {
            let mut v = intent_made.clone();
            v.authority = Authority::Session(signed.clone());
            v.assignment = SignedAssignment::sign(
                crate::assignment::Assignment {
                    deadline_s,
                    ..intent_made.assignment.assignment.clone()
                },
                &w.exchange,
            )
            .unwrap();
            v
        };
        let key = w.buyer_identity.public();
        let last = grant.last_deadline_s();
        assert_eq!(last, 1_000_000 + 86_400);
        let spend = call(last)
            .check(&w.exchange.public(), &domain(), &key)
            .unwrap()
            .unwrap();
        assert_eq!(spend.cap_wei, 10_000);
        let err = call(last + 1)
            .check(&w.exchange.public(), &domain(), &key)
            .unwrap_err();
        assert!(err.to_string().contains("after the grant expired"), "{err}");
    }
}
