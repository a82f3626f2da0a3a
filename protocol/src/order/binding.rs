//! Who an agent is: an Ethereum account and an ML-DSA-65 key, each signing for the other once.
//!
//! A [`Binding`] carries two signatures:
//!
//! 1. the **account's** EIP-712 signature over [`PqBinding`] `{account, mldsaKeyHash, nonce}`
//!    under the chain's domain — "the ML-DSA key whose SHA-256 is `mldsaKeyHash` speaks for me";
//! 2. the **ML-DSA key's** signature (FIPS 204 context [`BINDING_CONTEXT`]) over the fixed
//!    94-byte message [`Binding::key_message`]:
//!
//!    ```text
//!    "CXPQB1" ‖ chain_id u64 BE ‖ verifying_contract 20 ‖ account 20 ‖ mldsa_key_hash 32 ‖ nonce u64 BE
//!    ```
//!
//!    — "I, this key, speak for that account on that chain's exchange".
//!
//! Binding both ways is the point. With only (1), an account could claim someone else's public
//! ML-DSA key: orders that key co-signs would then count for two accounts, and a receipt or
//! session signed by the key could be passed off as the claimant's. With only (2), a key could
//! name any account and borrow its funds' authority. Each half names the other party, the chain
//! and the deployment (chain id and Settlement contract, in the EIP-712 domain for (1) and in the
//! message for (2)), so neither half can be replayed onto another account, key or chain; the
//! nonce orders re-bindings (a key rotation is a binding with a higher nonce).

use alloy_primitives::{Address, B256, Bytes};
use alloy_sol_types::Eip712Domain;
use k256::ecdsa::SigningKey;
use serde::{Deserialize, Serialize};

use super::signed::{account_of, check_domain, domain_parts, recover_signer, sign_digest};
use super::{Order, PqBinding};
use crate::error::{Error, Result};
use crate::pq::{Identity, IdentityId, PublicIdentity};

/// FIPS 204 context of the ML-DSA key's half of a binding.
pub const BINDING_CONTEXT: &[u8] = b"cx-pq-binding-v1";
const MAGIC: &[u8; 6] = b"CXPQB1";
/// Bytes of [`Binding::key_message`].
pub const KEY_MESSAGE_BYTES: usize = 6 + 8 + 20 + 20 + 32 + 8;

/// An account's binding to an ML-DSA-65 key, signed by both (see the module notes).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Binding {
    /// The Ethereum account.
    pub account: Address,
    /// EIP-155 id of the chain whose domain the binding is signed under.
    pub chain_id: u64,
    /// That chain's Settlement contract (the domain's verifying contract).
    pub verifying_contract: Address,
    /// The ML-DSA-65 verification key, 1952 bytes (0x-hex).
    pub mldsa_key: Bytes,
    /// Orders re-bindings: the exchange keeps the binding with the highest nonce.
    pub nonce: u64,
    /// The account's 65-byte EIP-712 signature over [`PqBinding`] (0x-hex).
    #[serde(default)]
    pub signature: Bytes,
    /// The ML-DSA key's signature over [`Binding::key_message`], context [`BINDING_CONTEXT`].
    #[serde(default)]
    pub mldsa_signature: Bytes,
}

/// A verified binding: the account and the key that now co-signs its orders.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BoundKey {
    /// The account.
    pub account: Address,
    /// Its ML-DSA-65 key.
    pub key: PublicIdentity,
    /// SHA-256 of the key (`mldsaKeyHash`).
    pub key_id: IdentityId,
    /// The binding's nonce.
    pub nonce: u64,
}

impl Binding {
    /// Binds `identity` to the account of `account_key` under `domain`.
    pub fn sign(
        account_key: &SigningKey,
        identity: &Identity,
        domain: &Eip712Domain,
        nonce: u64,
    ) -> Result<Self> {
        let (chain_id, verifying_contract) = domain_parts(domain)?;
        let mut binding = Self {
            account: account_of(account_key),
            chain_id,
            verifying_contract,
            mldsa_key: Bytes::copy_from_slice(&identity.public().to_bytes()),
            nonce,
            signature: Bytes::new(),
            mldsa_signature: Bytes::new(),
        };
        let digest = binding.pq_binding()?.signing_hash(domain);
        binding.signature = Bytes::copy_from_slice(&sign_digest(account_key, &digest));
        binding.mldsa_signature =
            Bytes::copy_from_slice(&identity.sign(BINDING_CONTEXT, &binding.key_message()?)?);
        Ok(binding)
    }

    /// The ML-DSA key it binds.
    pub fn public_key(&self) -> Result<PublicIdentity> {
        PublicIdentity::from_bytes(&self.mldsa_key).map_err(|e| match e {
            Error::InvalidField { reason, .. } => Error::InvalidField {
                field: "mldsa_key".to_owned(),
                reason,
            },
            other => other,
        })
    }

    /// The EIP-712 struct the account signs; its key hash is computed from [`Binding::mldsa_key`].
    pub fn pq_binding(&self) -> Result<PqBinding> {
        Ok(PqBinding {
            account: self.account,
            mldsa_key_hash: B256::from(self.public_key()?.id().0),
            nonce: self.nonce,
        })
    }

    /// The bytes the ML-DSA key signs (see the module notes for the layout).
    pub fn key_message(&self) -> Result<[u8; KEY_MESSAGE_BYTES]> {
        let key_hash = self.public_key()?.id().0;
        let mut out = [0u8; KEY_MESSAGE_BYTES];
        let mut at = 0;
        let mut put = |bytes: &[u8]| {
            out[at..at + bytes.len()].copy_from_slice(bytes);
            at += bytes.len();
        };
        put(MAGIC);
        put(&self.chain_id.to_be_bytes());
        put(self.verifying_contract.as_slice());
        put(self.account.as_slice());
        put(&key_hash);
        put(&self.nonce.to_be_bytes());
        Ok(out)
    }

    /// Checks both halves under the chain's `domain`: the names it carries, the account's
    /// EIP-712 signature (which must recover `account`) and the key's signature.
    pub fn verify(&self, domain: &Eip712Domain) -> Result<BoundKey> {
        check_domain(domain, self.chain_id, self.verifying_contract)?;
        if self.signature.is_empty() {
            return Err(Error::SignatureMissing {
                field: "signature".to_owned(),
            });
        }
        if self.mldsa_signature.is_empty() {
            return Err(Error::CosignatureMissing {
                field: "mldsa_signature".to_owned(),
            });
        }
        let key = self.public_key()?;
        let digest = self.pq_binding()?.signing_hash(domain);
        let recovered = recover_signer("signature", &self.signature, &digest)?;
        if recovered != self.account {
            return Err(Error::SignerMismatch {
                field: "signature".to_owned(),
                claimed: self.account.to_string(),
                recovered: recovered.to_string(),
            });
        }
        key.verify(BINDING_CONTEXT, &self.key_message()?, &self.mldsa_signature)
            .map_err(|e| Error::CosignatureInvalid {
                field: "mldsa_signature".to_owned(),
                reason: match e {
                    Error::InvalidField { reason, .. } => format!(
                        "{reason}: the key must sign the binding message naming {} on chain {}",
                        self.account, self.chain_id
                    ),
                    other => other.to_string(),
                },
            })?;
        Ok(BoundKey {
            account: self.account,
            key_id: key.id(),
            key,
            nonce: self.nonce,
        })
    }
}
