//! What the coordinator needs of the committee, behind the [`ThresholdSigner`] boundary: any t
//! signers (under the diversity rule) produce a FROST signature, and all of them run a DKG.
//!
//! Two implementations: [`Committee`] asks real signer processes over post-quantum sessions
//! (each checks the batch on its own before it signs); [`MemoryCommittee`] holds the shares in
//! this process and signs with whichever members are "up", so the coordinator's tests exercise
//! any-t-of-n and the diversity rule without processes, sockets or a chain.

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::Mutex;

use alloy::primitives::B256;
use cx_protocol::voucher::Voucher;
use frost_secp256k1 as frost;

use super::committee::{Committee, check_rule, choose_signers};
use crate::config::Member;
use crate::dkg;
use crate::error::{Error, Result};
use crate::wire::Request;

/// Any t of n signers, producing one FROST(secp256k1, SHA-256) signature (RFC 9591).
pub trait ThresholdSigner: Send + Sync {
    /// Runs both FROST rounds for `message` under `public` with any t available signers
    /// satisfying the diversity rule, aggregates and verifies. `sign_request` builds each
    /// signer's round-2 request (it carries what the signer checks: the batch, or the rotation).
    fn sign<F>(
        &self,
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: F,
    ) -> impl Future<Output = Result<frost::Signature>> + Send
    where
        F: Fn(B256, frost::SigningPackage) -> Request + Send + Sync;

    /// Hands vouchers the coordinator took in to the signers to check now, ahead of the round
    /// that signs their batch (best effort: a signer that did not checks them in that round).
    /// Signers in this process have nothing to check ahead.
    fn check_ahead(&self, vouchers: &[Voucher]) -> impl Future<Output = ()> + Send {
        let _ = vouchers;
        std::future::ready(())
    }

    /// The signers (by index) whose shares made the last signature, for the record (empty
    /// when unknown).
    fn last_signers(&self) -> Vec<u16> {
        Vec::new()
    }

    /// The members left out of the last signature's signing and why (a refusal, a share that
    /// did not verify, a dropped round), for the record (empty when unknown).
    fn last_left_out(&self) -> Vec<(u16, String)> {
        Vec::new()
    }

    /// Has every member take part in key generation for `epoch`; returns the group's public
    /// key package.
    fn dkg(&self, epoch: u32)
    -> impl Future<Output = Result<frost::keys::PublicKeyPackage>> + Send;
}

impl ThresholdSigner for Committee {
    async fn sign<F>(
        &self,
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: F,
    ) -> Result<frost::Signature>
    where
        F: Fn(B256, frost::SigningPackage) -> Request + Send + Sync,
    {
        Committee::sign(self, message, public, sign_request).await
    }

    async fn check_ahead(&self, vouchers: &[Voucher]) {
        Committee::check_ahead(self, vouchers).await;
    }

    fn last_signers(&self) -> Vec<u16> {
        Committee::last_signers(self)
    }

    fn last_left_out(&self) -> Vec<(u16, String)> {
        Committee::last_left_out(self)
    }

    async fn dkg(&self, epoch: u32) -> Result<frost::keys::PublicKeyPackage> {
        Committee::dkg(self, epoch).await
    }
}

type Shares = BTreeMap<frost::Identifier, frost::keys::KeyPackage>;

#[derive(Default)]
struct Held {
    down: BTreeSet<u16>,
    keys: Vec<(frost::keys::PublicKeyPackage, Shares)>,
    signing_sets: Vec<Vec<u16>>,
    requests: usize,
}

/// A committee whose shares all live in this process (tests only: it is one party).
///
/// Keys come from the crate's trusted dealer rather than a DKG: what the coordinator sees — a
/// public key package per epoch, signatures by any t shares — is the same.
pub struct MemoryCommittee {
    members: Vec<Member>,
    threshold: u16,
    min_operators: usize,
    held: Mutex<Held>,
}

impl std::fmt::Debug for MemoryCommittee {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "MemoryCommittee({} of {}, ≥ {} operators)",
            self.threshold,
            self.members.len(),
            self.min_operators
        )
    }
}

impl MemoryCommittee {
    /// `members` (their addresses and keys are not used), any `threshold` of whom sign, with at
    /// least `min_operators` distinct operators per set; the same rule checks as [`Committee`].
    pub fn new(members: Vec<Member>, threshold: u16, min_operators: usize) -> Result<Self> {
        check_rule(&members, threshold, min_operators)?;
        Ok(Self {
            members,
            threshold,
            min_operators,
            held: Mutex::new(Held::default()),
        })
    }

    fn with<T>(&self, f: impl FnOnce(&mut Held) -> T) -> T {
        f(&mut self.held.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Takes member `index` down (it answers nothing) or brings it back.
    pub fn set_up(&self, index: u16, up: bool) {
        self.with(|h| {
            if up {
                h.down.remove(&index);
            } else {
                h.down.insert(index);
            }
        });
    }

    /// The signing sets used so far, in order.
    pub fn signing_sets(&self) -> Vec<Vec<u16>> {
        self.with(|h| h.signing_sets.clone())
    }

    /// Round-2 requests built so far (one per chosen signer per round).
    pub fn requests(&self) -> usize {
        self.with(|h| h.requests)
    }
}

impl ThresholdSigner for MemoryCommittee {
    fn last_signers(&self) -> Vec<u16> {
        self.signing_sets().last().cloned().unwrap_or_default()
    }

    async fn sign<F>(
        &self,
        message: &[u8],
        public: &frost::keys::PublicKeyPackage,
        sign_request: F,
    ) -> Result<frost::Signature>
    where
        F: Fn(B256, frost::SigningPackage) -> Request + Send + Sync,
    {
        self.with(|h| {
            let available: Vec<Member> = self
                .members
                .iter()
                .filter(|m| !h.down.contains(&m.index))
                .cloned()
                .collect();
            let Some(chosen) = choose_signers(&available, self.threshold, self.min_operators)
            else {
                let operators: BTreeSet<&str> =
                    available.iter().map(|m| m.operator.as_str()).collect();
                return Err(Error::WaitingForSigners {
                    reachable: available.len(),
                    members: self.members.len(),
                    operators: operators.len(),
                    threshold: self.threshold,
                    min_operators: self.min_operators,
                });
            };
            let shares = h
                .keys
                .iter()
                .find(|(p, _)| p == public)
                .map(|(_, s)| s.clone())
                .ok_or_else(|| Error::Dkg("no member holds a share of that key".into()))?;
            let mut rng = dkg::os_rng();
            let mut nonces = BTreeMap::new();
            let mut commitments = BTreeMap::new();
            for index in &chosen {
                let id = dkg::identifier(*index)?;
                let (n, c) = frost::round1::commit(shares[&id].signing_share(), &mut rng);
                nonces.insert(id, n);
                commitments.insert(id, c);
            }
            let package = frost::SigningPackage::new(commitments, message);
            let round_id = B256::from(dkg::random_bytes());
            let mut signature_shares = BTreeMap::new();
            for (id, nonce) in &nonces {
                let _ = sign_request(round_id, package.clone());
                h.requests += 1;
                signature_shares.insert(*id, frost::round2::sign(&package, nonce, &shares[id])?);
            }
            let signature = frost::aggregate(&package, &signature_shares, public)?;
            public.verifying_key().verify(message, &signature)?;
            h.signing_sets.push(chosen);
            Ok(signature)
        })
    }

    async fn dkg(&self, _epoch: u32) -> Result<frost::keys::PublicKeyPackage> {
        self.with(|h| {
            if !h.down.is_empty() {
                return Err(Error::Dkg(format!(
                    "a DKG needs every member: only {} of {} answer",
                    self.members.len() - h.down.len(),
                    self.members.len()
                )));
            }
            let ids = self
                .members
                .iter()
                .map(|m| dkg::identifier(m.index))
                .collect::<Result<Vec<_>>>()?;
            let (shares, public) = frost::keys::generate_with_dealer(
                self.members.len() as u16,
                self.threshold,
                frost::keys::IdentifierList::Custom(&ids),
                dkg::os_rng(),
            )?;
            let mut packages = Shares::new();
            for (id, share) in shares {
                packages.insert(id, frost::keys::KeyPackage::try_from(share)?);
            }
            h.keys.push((public.clone(), packages));
            Ok(public)
        })
    }
}
