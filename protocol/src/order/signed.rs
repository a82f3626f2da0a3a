//! [`Signed<T>`]: an order with its two signatures, and how each is made and checked.
//!
//! - The **EIP-712 signature** is a 65-byte secp256k1 signature `r ‖ s ‖ v` over the order's
//!   EIP-712 signing hash under the chain's domain (what `eth_signTypedData_v4` returns). The
//!   account is *recovered* from it; only low-s signatures (EIP-2) with `v` in {27, 28, 0, 1} are
//!   accepted, so a third party cannot make a second valid encoding of the same signature (a
//!   malleated copy would otherwise pass as a distinct order).
//! - The **ML-DSA-65 co-signature** (FIPS 204) is over the *same* 32-byte EIP-712 digest, with the
//!   FIPS 204 context [`ORDER_CONTEXT`], under the ML-DSA key bound to the recovered account (see
//!   [`super::Binding`]). Signing the digest, not a second encoding, means both signatures commit
//!   to exactly the same bytes — domain, type and every field — and the context keeps an order
//!   co-signature from ever verifying as a receipt, a session transcript or a binding.
//!
//! The envelope also *names* the signer's account and the domain (chain id, verifying
//! contract). These names are not trusted — the signature must recover the named account under
//! the exchange's own domain for the chain — but they turn an honest mistake into a precise
//! error (`wrong_domain`, `signature_wrong`) instead of an unbound stranger.

use alloy_primitives::{Address, B256, Bytes, Signature, U256};
use alloy_sol_types::Eip712Domain;
use k256::ecdsa::SigningKey;
use serde::{Deserialize, Serialize};

use super::Order;
use crate::error::{Error, Result};
use crate::pq::{Identity, PublicIdentity};

/// FIPS 204 context of ML-DSA co-signatures on orders.
pub const ORDER_CONTEXT: &[u8] = b"cx-order-v1";

/// An order with its EIP-712 signature and ML-DSA co-signature, as agents submit it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Signed<T> {
    /// The account that claims to have signed (checked: the signature must recover it).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$"))]
    pub account: Address,
    /// EIP-155 id of the chain whose domain the order is signed under (the tab's chain).
    pub chain_id: u64,
    /// The Settlement contract named as the domain's verifying contract.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$"))]
    pub verifying_contract: Address,
    /// The order itself.
    pub order: T,
    /// 65-byte secp256k1 signature `r ‖ s ‖ v` over the EIP-712 signing hash (0x-hex; empty or
    /// absent when missing).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x([0-9a-fA-F]{2})*$"))]
    pub signature: Bytes,
    /// ML-DSA-65 signature over the same digest, context [`ORDER_CONTEXT`] (0x-hex).
    #[serde(default)]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x([0-9a-fA-F]{2})*$"))]
    pub mldsa_signature: Bytes,
}

/// What a verified order proves: which account signed which digest.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Verified {
    /// The account the EIP-712 signature recovers (and the co-signature's key is bound to).
    pub account: Address,
    /// The EIP-712 signing hash both signatures cover (an order's unique id for replay checks).
    pub digest: B256,
}

/// The account (Ethereum address) of a secp256k1 key.
pub fn account_of(key: &SigningKey) -> Address {
    Address::from_private_key(key)
}

/// Signs an EIP-712 digest with `key`: 65 bytes `r ‖ s ‖ v`, `v` ∈ {27, 28}, low s (RFC 6979
/// deterministic nonces, as k256 does).
pub fn sign_digest(key: &SigningKey, digest: &B256) -> [u8; 65] {
    let (signature, recovery_id) = key
        .sign_prehash_recoverable(digest.as_slice())
        .expect("a 32-byte digest is a valid secp256k1 prehash");
    Signature::from((signature, recovery_id)).as_bytes()
}

/// The account that made `signature` over `digest`, refusing what a canonical wallet signature
/// is not: a length other than 65, `v` outside {27, 28, 0, 1} (EIP-155 `v`s belong to
/// transactions), a high `s` (EIP-2: `s` and `n − s` both verify, so only the low one is
/// accepted), or `r`/`s` outside the curve order. `field` names where the signature was.
pub fn recover_signer(field: &str, signature: &[u8], digest: &B256) -> Result<Address> {
    let malformed = |reason: String| Error::SignatureMalformed {
        field: field.to_owned(),
        reason,
    };
    if signature.is_empty() {
        return Err(Error::SignatureMissing {
            field: field.to_owned(),
        });
    }
    let bytes: &[u8; 65] = signature.try_into().map_err(|_| {
        malformed(format!(
            "an EIP-712 signature is 65 bytes (r ‖ s ‖ v), got {}",
            signature.len()
        ))
    })?;
    let v = bytes[64];
    if !matches!(v, 0 | 1 | 27 | 28) {
        return Err(malformed(format!(
            "v must be 27 or 28 (or 0 or 1), got {v}"
        )));
    }
    let parsed = Signature::from_raw_array(bytes).map_err(|e| malformed(e.to_string()))?;
    if parsed.r() == U256::ZERO || parsed.s() == U256::ZERO {
        return Err(malformed("r and s must be nonzero".to_owned()));
    }
    if parsed.normalize_s().is_some() {
        return Err(malformed(
            "s is in the upper half of the curve order (a malleable signature, EIP-2): sign \
             with a wallet that emits low-s signatures"
                .to_owned(),
        ));
    }
    parsed
        .recover_address_from_prehash(digest)
        .map_err(|e| malformed(format!("does not recover a public key: {e}")))
}

/// Signs `order` as an agent: the EIP-712 signature by `account_key` under `domain` and the
/// ML-DSA co-signature by `identity` over the same digest. The identity must be the one bound
/// to the account (see [`super::Binding`]) for the exchange to accept it.
pub fn sign<T: Order>(
    order: T,
    domain: &Eip712Domain,
    account_key: &SigningKey,
    identity: &Identity,
) -> Result<Signed<T>> {
    let digest = order.signing_hash(domain);
    let (chain_id, verifying_contract) = domain_parts(domain)?;
    Ok(Signed {
        account: account_of(account_key),
        chain_id,
        verifying_contract,
        order,
        signature: Bytes::copy_from_slice(&sign_digest(account_key, &digest)),
        mldsa_signature: Bytes::copy_from_slice(&identity.sign(ORDER_CONTEXT, digest.as_slice())?),
    })
}

/// The chain id and verifying contract of one of our domains.
pub(crate) fn domain_parts(domain: &Eip712Domain) -> Result<(u64, Address)> {
    let incomplete = |what: &str| Error::InvalidField {
        field: "domain".to_owned(),
        reason: format!("an order domain names {what}: build it with order::domain"),
    };
    let chain_id = domain
        .chain_id
        .and_then(|id| u64::try_from(id).ok())
        .ok_or_else(|| incomplete("a chain id below 2^64"))?;
    let contract = domain
        .verifying_contract
        .ok_or_else(|| incomplete("a verifying contract"))?;
    Ok((chain_id, contract))
}

/// Checks the chain id and contract an envelope names against the chain's own domain.
pub(crate) fn check_domain(
    domain: &Eip712Domain,
    chain_id: u64,
    verifying_contract: Address,
) -> Result<()> {
    let (expected_chain, expected_contract) = domain_parts(domain)?;
    if chain_id != expected_chain {
        return Err(Error::WrongDomain {
            field: "chain_id".to_owned(),
            expected: format!("chain id {expected_chain}"),
            got: format!("chain id {chain_id}"),
        });
    }
    if verifying_contract != expected_contract {
        return Err(Error::WrongDomain {
            field: "verifying_contract".to_owned(),
            expected: format!("Settlement contract {expected_contract}"),
            got: format!("contract {verifying_contract}"),
        });
    }
    Ok(())
}

impl<T: Order> Signed<T> {
    /// Everything an exchange checks when an order arrives, cheapest first, at `now_s` (unix
    /// seconds; protocol has no clock): the order's fields, the domain it names, that both
    /// signatures are present, expiry and deadline, then the EIP-712 signature recovers
    /// `account`, then the ML-DSA co-signature verifies under `bound_key(account)` (`None`: no
    /// key is bound, refused as unbound).
    ///
    /// Callers whose key lookup is asynchronous use [`Signed::recover`], look up, then
    /// [`Signed::check_cosignature`].
    pub fn verify(
        &self,
        domain: &Eip712Domain,
        now_s: u64,
        bound_key: impl FnOnce(&Address) -> Option<PublicIdentity>,
    ) -> Result<Verified> {
        self.check_shape(domain)?;
        self.order
            .check_times(now_s)
            .map_err(|e| e.within("order"))?;
        self.finish(domain, bound_key)
    }

    /// [`Signed::verify`] without the clock: for parties that re-check an order after it was
    /// accepted (the settlement committee checks the buyer's order long after its expiry).
    pub fn verify_signatures(
        &self,
        domain: &Eip712Domain,
        bound_key: impl FnOnce(&Address) -> Option<PublicIdentity>,
    ) -> Result<Verified> {
        self.check_shape(domain)?;
        self.finish(domain, bound_key)
    }

    /// Checks the fields, the domain and the EIP-712 signature only, returning the recovered
    /// account and digest. The ML-DSA co-signature is *not* checked: follow with
    /// [`Signed::check_cosignature`].
    pub fn recover(&self, domain: &Eip712Domain) -> Result<Verified> {
        self.check_shape(domain)?;
        self.recover_checked(domain)
    }

    /// Checks the ML-DSA co-signature over `verified.digest` under `key`, the key bound to
    /// `verified.account`.
    pub fn check_cosignature(&self, verified: &Verified, key: &PublicIdentity) -> Result<()> {
        if self.mldsa_signature.is_empty() {
            return Err(Error::CosignatureMissing {
                field: "mldsa_signature".to_owned(),
            });
        }
        key.verify(
            ORDER_CONTEXT,
            verified.digest.as_slice(),
            &self.mldsa_signature,
        )
        .map_err(|e| Error::CosignatureInvalid {
            field: "mldsa_signature".to_owned(),
            reason: match e {
                Error::InvalidField { reason, .. } => format!(
                    "{reason} (the key bound to {}; co-sign the EIP-712 digest with context `cx-order-v1`)",
                    verified.account
                ),
                other => other.to_string(),
            },
        })
    }

    /// The EIP-712 signing hash of the order under `domain`.
    pub fn digest(&self, domain: &Eip712Domain) -> B256 {
        self.order.signing_hash(domain)
    }

    fn check_shape(&self, domain: &Eip712Domain) -> Result<()> {
        self.order.validate().map_err(|e| e.within("order"))?;
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
        Ok(())
    }

    fn recover_checked(&self, domain: &Eip712Domain) -> Result<Verified> {
        let digest = self.order.signing_hash(domain);
        let recovered = recover_signer("signature", &self.signature, &digest)?;
        if recovered != self.account {
            return Err(Error::SignerMismatch {
                field: "signature".to_owned(),
                claimed: self.account.to_string(),
                recovered: recovered.to_string(),
            });
        }
        if let Some((field, named)) = self.order.named_signer()
            && named != recovered
        {
            return Err(Error::SignerMismatch {
                field: format!("order.{field}"),
                claimed: named.to_string(),
                recovered: recovered.to_string(),
            });
        }
        Ok(Verified {
            account: recovered,
            digest,
        })
    }

    fn finish(
        &self,
        domain: &Eip712Domain,
        bound_key: impl FnOnce(&Address) -> Option<PublicIdentity>,
    ) -> Result<Verified> {
        let verified = self.recover_checked(domain)?;
        let key = bound_key(&verified.account).ok_or_else(|| Error::Unbound {
            account: verified.account.to_string(),
        })?;
        self.check_cosignature(&verified, &key)?;
        Ok(verified)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Recovery runs on libsecp256k1 (alloy's `secp256k1` feature), signing on k256: the two
        /// implementations agree on the account, with `v` written either way, and a signature
        /// over another digest recovers another account.
        #[test]
        fn libsecp256k1_recovers_what_k256_signed(secret in proptest::array::uniform32(1u8..), digest in proptest::array::uniform32(0u8..)) {
            let key = SigningKey::from_slice(&secret).unwrap();
            let digest = B256::from(digest);
            let mut signature = sign_digest(&key, &digest);
            let account = account_of(&key);
            let by_k256 = Signature::from_raw_array(&signature)
                .unwrap()
                .recover_from_prehash(&digest)
                .map(|k| Address::from_public_key(&k))
                .unwrap();
            proptest::prop_assert_eq!(by_k256, account);
            proptest::prop_assert_eq!(recover_signer("signature", &signature, &digest).unwrap(), account);
            signature[64] -= 27;
            proptest::prop_assert_eq!(recover_signer("signature", &signature, &digest).unwrap(), account);
            let mut other = digest;
            other.0[0] ^= 1;
            proptest::prop_assert_ne!(recover_signer("signature", &signature, &other).ok(), Some(account));
        }
    }
}
