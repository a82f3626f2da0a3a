//! Provider bids on open reserves (SPEC §3): a provider offers to commit the reserved capacity
//! on one of its bundles at a rate per compute-second, signed by its ML-DSA-65 identity so the
//! exchange can show whose word won and no one can bid in another provider's name.
//!
//! The signature is over the bid's canonical JSON ([`crate::order::canonical_json`]) with the
//! FIPS 204 context `cx-reserve-bid-v1`, so it never verifies as an offer, a receipt or an
//! order. The bytes bind the reserve (its EIP-712 digest), the bundle, the rate and the
//! provider's key hash: a bid copied onto another reserve, bundle or rate fails to verify.
//!
//! ```
//! use cx_protocol::bid::{ReserveBid, SignedBid};
//! use cx_protocol::pq::Identity;
//!
//! let provider = Identity::from_seed([3; 32]);
//! let bid = ReserveBid {
//!     reserve_id: cx_protocol::order::B256::repeat_byte(7),
//!     bundle_id: "gpu-0".into(),
//!     rate_wei_per_s: 900,
//!     provider_key: cx_protocol::order::B256::from(provider.id().0),
//! };
//! let signed = SignedBid::sign(bid, &provider).unwrap();
//! signed.verify(&provider.public()).unwrap();
//! ```

use crate::error::{Error, Result};
use crate::order::{B256, canonical_json};
use crate::pq::{Identity, PublicIdentity};
use crate::receipt::hex_vec;
use serde::{Deserialize, Serialize};

/// FIPS 204 context of reserve-bid signatures.
pub const BID_CONTEXT: &[u8] = b"cx-reserve-bid-v1";

/// What a provider offers for one reserve.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveBid {
    /// The reserve (its EIP-712 digest, the order id).
    pub reserve_id: B256,
    /// The provider's bundle that would serve it.
    pub bundle_id: String,
    /// The rate, wei per compute-second (at most the buyer's `max_price_wei_per_s`, below the
    /// bundle's spot ask).
    #[serde(with = "crate::price::rate_string")]
    pub rate_wei_per_s: u64,
    /// SHA-256 of the provider's ML-DSA-65 verification key.
    pub provider_key: B256,
}

impl ReserveBid {
    /// The bytes signed: the bid's canonical JSON.
    pub fn signing_bytes(&self) -> Result<Vec<u8>> {
        let value = serde_json::to_value(self).map_err(|e| Error::InvalidField {
            field: "bid".into(),
            reason: e.to_string(),
        })?;
        Ok(canonical_json(&value).into_bytes())
    }
}

/// A bid with the provider's signature.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedBid {
    /// The bid.
    pub bid: ReserveBid,
    /// ML-DSA-65 signature over [`ReserveBid::signing_bytes`], context `cx-reserve-bid-v1`.
    #[serde(with = "hex_vec")]
    pub signature: Vec<u8>,
}

impl SignedBid {
    /// Signs `bid` as `provider`; refuses when the bid names another key.
    pub fn sign(bid: ReserveBid, provider: &Identity) -> Result<Self> {
        if bid.provider_key.0 != provider.id().0 {
            return Err(Error::InvalidField {
                field: "bid.provider_key".into(),
                reason: format!("names a key other than the signer's ({})", provider.id()),
            });
        }
        let signature = provider.sign(BID_CONTEXT, &bid.signing_bytes()?)?.to_vec();
        Ok(Self { bid, signature })
    }

    /// Checks the signature under `expected` (the key the caller registered for this provider).
    pub fn verify(&self, expected: &PublicIdentity) -> Result<()> {
        if expected.id().0 != self.bid.provider_key.0 {
            return Err(Error::InvalidField {
                field: "bid.provider_key".into(),
                reason: format!("is not the key {} it is checked against", expected.id()),
            });
        }
        expected
            .verify(BID_CONTEXT, &self.bid.signing_bytes()?, &self.signature)
            .map_err(|e| e.within("bid"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bid_moved_to_another_reserve_rate_or_key_fails_to_verify() {
        let provider = Identity::from_seed([3; 32]);
        let bid = ReserveBid {
            reserve_id: B256::repeat_byte(7),
            bundle_id: "gpu-0".into(),
            rate_wei_per_s: 900,
            provider_key: B256::from(provider.id().0),
        };
        let signed = SignedBid::sign(bid.clone(), &provider).unwrap();
        let text = serde_json::to_string(&signed).unwrap();
        let back: SignedBid = serde_json::from_str(&text).unwrap();
        back.verify(&provider.public()).unwrap();
        for moved in [
            ReserveBid {
                reserve_id: B256::repeat_byte(8),
                ..bid.clone()
            },
            ReserveBid {
                rate_wei_per_s: 800,
                ..bid.clone()
            },
            ReserveBid {
                bundle_id: "gpu-1".into(),
                ..bid.clone()
            },
        ] {
            let forged = SignedBid {
                bid: moved,
                signature: signed.signature.clone(),
            };
            assert!(forged.verify(&provider.public()).is_err());
        }
        let other = Identity::from_seed([4; 32]);
        assert!(signed.verify(&other.public()).is_err());
        assert!(SignedBid::sign(bid, &other).is_err(), "names another key");
    }
}
