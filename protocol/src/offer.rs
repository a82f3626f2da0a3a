//! Provider offers: how a provider registers its bundles at an exchange, signed by its ML-DSA-65
//! identity, and the token it then pulls jobs with.
//!
//! The provider chooses a secret dispatch token and signs only its SHA-256 (`token_hash`), so a
//! copy of the signed offer, replayed, registers nothing its replayer could use. The signature is
//! over the offer's canonical JSON ([`crate::order::canonical_json`]) with the FIPS 204 context
//! `cx-offer-v1`, so it never verifies as a receipt, an order or a session transcript.
//!
//! ```
//! use cx_protocol::offer::{Offer, SignedOffer};
//! use cx_protocol::pq::Identity;
//!
//! let provider = Identity::from_seed([3; 32]);
//! let offer = Offer {
//!     operator: "op-a".into(),
//!     payout: cx_protocol::order::Address::repeat_byte(0x11),
//!     bundles: vec![],
//!     token_hash: Offer::token_hash_of(b"secret"),
//!     issued_at_s: 1_000,
//!     residency: None,
//!     search_trials_per_s: None,
//! };
//! let signed = SignedOffer::sign(offer, &provider).unwrap();
//! assert_eq!(signed.verify(1_010).unwrap().id(), provider.id());
//! assert!(signed.verify(1_000 + 3_600).is_err(), "too old");
//! ```

use crate::bundle::Bundle;
use crate::error::{Error, Result};
use crate::order::{Address, B256, canonical_json};
use crate::pq::{Identity, PublicIdentity};
use crate::receipt::hex_vec;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// FIPS 204 context of offer signatures.
pub const OFFER_CONTEXT: &[u8] = b"cx-offer-v1";

/// How old an offer may be when it arrives, seconds (and how far ahead of the exchange's clock).
pub const MAX_OFFER_AGE_S: u64 = 300;

/// Most bundles one offer registers, and so most a provider has on offer at an exchange: each
/// offer replaces the provider's whole set (the bundles it leaves out are withdrawn), so this
/// one bound keeps a provider from growing the exchange's books and matching engine.
pub const MAX_OFFER_BUNDLES: usize = 64;

/// What a provider offers: its bundles, who runs them, where it is paid.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Offer {
    /// The operator (every bundle's `provider` must name it; T3 committees are diverse in it).
    pub operator: String,
    /// The EVM account the provider's receipts are paid to.
    pub payout: Address,
    /// The bundles it serves (at most [`MAX_OFFER_BUNDLES`]).
    pub bundles: Vec<Bundle>,
    /// SHA-256 of the secret the provider pulls jobs and returns results with (`Authorization:
    /// Bearer`).
    pub token_hash: B256,
    /// When it was signed, unix seconds.
    pub issued_at_s: u64,
    /// What its memory holds now (SPEC §4), as its cache reports it; absent from providers
    /// that do not report (and then not part of the signed bytes).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub residency: Option<Residency>,
    /// Searches (SPEC §3) it takes: the trials per second its search worker runs, measured on
    /// its own predicate when it starts. The exchange prices a search's trials at this rate
    /// and the provider's lowest ask. Absent (and unsigned) when it takes no searches.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub search_trials_per_s: Option<u64>,
}

/// A provider's residency report, signed with its offer and re-sent on every change (and at
/// least every half minute): which adapters its cache pins (never evicted), how much of its
/// adapter budget is free, and the shadow price of a residency slot — the expected discounted
/// value given up to make room for one more adapter of `slot_bytes` (SPEC §4), in seconds of
/// loading saved.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Residency {
    /// Adapters (content ids) the cache pins.
    pub pinned_adapters: Vec<String>,
    /// Bytes of the adapter budget held by nothing.
    pub free_bytes: u64,
    /// The slot the price is for, bytes (the median resident adapter's size).
    pub slot_bytes: u64,
    /// The slot's shadow price, seconds of loading saved over the cache's horizon (0 while it
    /// fits in what is free; `None` when no slot of that size can be made).
    pub slot_shadow_price: Option<f64>,
    /// Conversation prefixes whose KV cache it holds ([`crate::prefix`] ids), most valuable
    /// first, at most [`crate::prefix::MAX_REPORTED_PREFIXES`]; absent (and unsigned) when none,
    /// so older offers parse and verify as before.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefixes: Vec<String>,
    /// The bytes each of `prefixes` holds, in the same order (what a rent on one is priced
    /// on); absent (and unsigned) from providers that do not report them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefix_bytes: Vec<u64>,
    /// Base models its memory holds, by content id (absent and unsigned when none is
    /// reported, so older offers parse and verify as before).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bases: Vec<ResidentBase>,
}

/// Most bases one residency report names.
pub const MAX_REPORTED_BASES: usize = 16;

/// A base model resident in a provider's memory (SPEC §4).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResidentBase {
    /// Its content id: [`crate::id::content_id`] of the checkpoint's top-level files — its
    /// configuration (`*.json`), chat template (`*.jinja`) and weights (`*.safetensors`) —
    /// lowercase hex. Two providers holding the same files report the same id.
    pub id: String,
    /// The model name its bundles serve it as (`resident_bases`).
    pub name: String,
    /// Bytes it takes in memory.
    pub bytes: u64,
    /// Whether a rent on state pins it (never unloaded while pinned).
    pub pinned: bool,
}

impl Offer {
    /// The `token_hash` of a dispatch token: SHA-256 of its bytes.
    pub fn token_hash_of(token: &[u8]) -> B256 {
        B256::from(<[u8; 32]>::from(Sha256::digest(token)))
    }

    /// The bytes signed: the offer's canonical JSON.
    pub fn signing_bytes(&self) -> Result<Vec<u8>> {
        let value = serde_json::to_value(self).map_err(|e| Error::InvalidField {
            field: "offer".into(),
            reason: e.to_string(),
        })?;
        Ok(canonical_json(&value).into_bytes())
    }

    /// Checks the offer's own fields: an operator, a bounded list of valid bundles all run by it,
    /// no id twice.
    pub fn validate(&self) -> Result<()> {
        let invalid = |field: String, reason: String| Error::InvalidField { field, reason };
        if self.operator.trim().is_empty() {
            return Err(invalid("offer.operator".into(), "is empty".into()));
        }
        if self.search_trials_per_s == Some(0) {
            return Err(invalid(
                "offer.search_trials_per_s".into(),
                "must be above zero (leave it out to take no searches)".into(),
            ));
        }
        if let Some(r) = &self.residency {
            if r.pinned_adapters.len() > 4096 {
                return Err(invalid(
                    "offer.residency.pinned_adapters".into(),
                    "at most 4096".into(),
                ));
            }
            if r.slot_shadow_price
                .is_some_and(|p| !p.is_finite() || p < 0.0)
            {
                return Err(invalid(
                    "offer.residency.slot_shadow_price".into(),
                    "must be finite and not negative".into(),
                ));
            }
            crate::prefix::validate_ids("offer.residency.prefixes", &r.prefixes)?;
            if !r.prefix_bytes.is_empty() && r.prefix_bytes.len() != r.prefixes.len() {
                return Err(invalid(
                    "offer.residency.prefix_bytes".into(),
                    format!(
                        "names {} sizes for {} prefixes (one each, in order, or none)",
                        r.prefix_bytes.len(),
                        r.prefixes.len()
                    ),
                ));
            }
            if r.bases.len() > MAX_REPORTED_BASES {
                return Err(invalid(
                    "offer.residency.bases".into(),
                    format!("at most {MAX_REPORTED_BASES}"),
                ));
            }
            for (i, base) in r.bases.iter().enumerate() {
                if base.id.len() != 64
                    || !base
                        .id
                        .bytes()
                        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
                {
                    return Err(invalid(
                        format!("offer.residency.bases[{i}].id"),
                        "must be a content id: 64 lowercase hex digits".into(),
                    ));
                }
                if base.name.is_empty() || base.name.len() > 256 {
                    return Err(invalid(
                        format!("offer.residency.bases[{i}].name"),
                        "must be 1 to 256 bytes".into(),
                    ));
                }
            }
        }
        if self.bundles.len() > MAX_OFFER_BUNDLES {
            return Err(invalid(
                "offer.bundles".into(),
                format!(
                    "has {} bundles; at most {MAX_OFFER_BUNDLES} per offer (an offer replaces \
                     the provider's whole set)",
                    self.bundles.len()
                ),
            ));
        }
        for (i, bundle) in self.bundles.iter().enumerate() {
            bundle
                .validate()
                .map_err(|e| e.within(&format!("offer.bundles[{i}]")))?;
            if bundle.provider != self.operator {
                return Err(invalid(
                    format!("offer.bundles[{i}].provider"),
                    format!("must be the offer's operator `{}`", self.operator),
                ));
            }
            if self.bundles[..i].iter().any(|b| b.id == bundle.id) {
                return Err(invalid(
                    format!("offer.bundles[{i}].id"),
                    format!("`{}` appears twice", bundle.id),
                ));
            }
        }
        Ok(())
    }
}

/// An offer with the provider's ML-DSA-65 verification key and signature.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SignedOffer {
    /// The offer.
    pub offer: Offer,
    /// The provider's encoded ML-DSA-65 verification key.
    #[serde(with = "hex_vec")]
    pub verification_key: Vec<u8>,
    /// ML-DSA-65 signature over [`Offer::signing_bytes`], context `cx-offer-v1`.
    #[serde(with = "hex_vec")]
    pub signature: Vec<u8>,
}

impl SignedOffer {
    /// Signs `offer` as `provider`.
    pub fn sign(offer: Offer, provider: &Identity) -> Result<Self> {
        let signature = provider
            .sign(OFFER_CONTEXT, &offer.signing_bytes()?)?
            .to_vec();
        Ok(Self {
            offer,
            verification_key: provider.public().to_bytes().to_vec(),
            signature,
        })
    }

    /// Checks the offer's fields, its age at `now_s` and its signature under the key it carries;
    /// returns that key (whoever calls this decides whether the key may serve: stake, pins).
    pub fn verify(&self, now_s: u64) -> Result<PublicIdentity> {
        self.offer.validate()?;
        let issued = self.offer.issued_at_s;
        if issued.saturating_add(MAX_OFFER_AGE_S) < now_s
            || issued > now_s.saturating_add(MAX_OFFER_AGE_S)
        {
            return Err(Error::InvalidField {
                field: "offer.issued_at_s".into(),
                reason: format!(
                    "{issued} is more than {MAX_OFFER_AGE_S} s from the exchange's clock ({now_s}); sign a fresh offer"
                ),
            });
        }
        let key = PublicIdentity::from_bytes(&self.verification_key)
            .map_err(|e| e.within("verification_key"))?;
        key.verify(OFFER_CONTEXT, &self.offer.signing_bytes()?, &self.signature)
            .map_err(|e| Error::SignatureMalformed {
                field: "signature".into(),
                reason: match e {
                    Error::InvalidField { reason, .. } => reason,
                    other => other.to_string(),
                },
            })?;
        Ok(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An offer travels as JSON text and is verified after parsing it back: floats with all 17
    /// digits must come back to the same bits, or the canonical bytes (and the signature) differ.
    #[test]
    fn an_offer_with_measured_floats_verifies_after_a_trip_through_json_text() {
        let provider = Identity::from_seed([3; 32]);
        let mut bundle: Bundle = serde_json::from_value(serde_json::json!({
            "id": "b", "provider": "op", "price_wei_per_s": "7", "memory_bytes": 1,
            "bandwidth_bps": 1.0, "rtt_s": 0.005, "flops_per_s": 1.0, "context_max": 8,
            "determinism": ["D"], "tiers": ["T0"],
        }))
        .unwrap();
        for (i, flops) in [
            378_612_345.678_912_3_f64,
            1.234_567_890_123_456_7e9,
            0.1 + 0.2,
        ]
        .into_iter()
        .enumerate()
        {
            bundle.flops_per_s = flops;
            bundle.bandwidth_bps = flops * 3.0 + 0.1;
            let offer = Offer {
                operator: "op".into(),
                payout: Address::repeat_byte(1),
                bundles: vec![bundle.clone()],
                token_hash: Offer::token_hash_of(b"t"),
                issued_at_s: 1_000 + i as u64,
                residency: None,
                search_trials_per_s: None,
            };
            let text =
                serde_json::to_string(&SignedOffer::sign(offer, &provider).unwrap()).unwrap();
            let back: SignedOffer = serde_json::from_str(&text).unwrap();
            back.verify(1_000).unwrap();
        }
    }
}
