//! Signed orders: what agents sign, how the exchange and the signers check it (SPEC §3, §9).
//!
//! Every order, tab, session grant and key binding is **EIP-712 typed data** signed by the
//! buyer's Ethereum account (secp256k1, what every wallet's `eth_signTypedData_v4` makes), and
//! orders carry an **ML-DSA-65 co-signature** (FIPS 204) over the same EIP-712 digest by the key
//! bound to that account — a post-quantum retrofit, not a fork: an EVM wallet signs as it always
//! does, and an order is accepted only if both signatures hold.
//!
//! - [`typed`]: the EIP-712 structs (camelCase, Solidity types) declared with alloy's `sol!`;
//!   alloy's `SolStruct` computes `encodeType`, `hashStruct` and the signing hash.
//! - [`kinds`]: the same kinds on the Rust/JSON side (snake case, units in names, typed tiers and
//!   classes), each an [`Order`]: `Intent`, `Reserve`, `Rent`, `Search`, `TabTerms`,
//!   `SessionGrant`, `PqBinding`.
//! - [`signed`]: [`Signed<T>`], an order with both signatures, its [`Signed::verify`] and the
//!   agent's [`sign`].
//! - [`binding`]: [`Binding`], who an agent is — its account and its ML-DSA key, each signing for
//!   the other.
//! - [`request`]: the inference request an intent's `request_hash` commits to, and that hash
//!   (SHA-256 of the request's canonical JSON).
//! - [`wallet`]: [`wallet_typed_data`], the exact `{types, primaryType, domain, message}` JSON a
//!   wallet takes, generated from the `sol!` types.
//!
//! The domain is `{name: "compute-exchange", version: "1", chainId, verifyingContract}` with the
//! chain's **Settlement** contract as the verifying contract ([`domain`]): a signature made for
//! one chain or one deployment recovers another account anywhere else.
//!
//! ```
//! use cx_protocol::order::{self, Intent, Order, SigningKey};
//! use cx_protocol::pq::Identity;
//! use cx_protocol::{DeterminismClass, Tier};
//!
//! let domain = order::domain(31337, order::Address::repeat_byte(0x5e));
//! let account_key = SigningKey::from_slice(&[7; 32]).unwrap();
//! let pq = Identity::from_seed([9; 32]);
//! let intent = Intent {
//!     want: "llama-8b".into(), adapter_id: None, request_hash: order::B256::repeat_byte(1),
//!     deadline_s: 2_000, max_price_wei: 5_000_000, market_limit: false, min_tier: Tier::T1,
//!     determinism: DeterminismClass::D, tab_id: 3, nonce: 1, expiry_s: 1_500,
//! };
//! let signed = order::sign(intent, &domain, &account_key, &pq).unwrap();
//! // The exchange: recover the account, co-check with the key bound to it, at `now_s`.
//! let verified = signed.verify(&domain, 1_000, |_account| Some(pq.public())).unwrap();
//! assert_eq!(verified.account, order::account_of(&account_key));
//! // Too late: the order expired at 1 500.
//! assert!(signed.verify(&domain, 1_600, |_| Some(pq.public())).is_err());
//! ```

pub mod binding;
pub mod kinds;
pub mod request;
pub mod signed;
pub mod typed;
pub mod wallet;

use std::borrow::Cow;
use std::fmt;
use std::str::FromStr;

pub use alloy_primitives::{Address, B256, Bytes, U256};
pub use alloy_sol_types::{Eip712Domain, SolStruct};
pub use k256::ecdsa::SigningKey;

pub use binding::{BINDING_CONTEXT, Binding, BoundKey};
pub use kinds::{
    Intent, PqBinding, Rent, RentTarget, Reserve, Search, SessionGrant, TabTerms,
    search_trial_probability, search_trials_to_succeed, search_witness,
};
pub use request::{
    ChatMessage, InferenceRequest, SamplingParams, canonical_json, chat_prompt, request_hash,
    request_value_hash,
};
pub use signed::{ORDER_CONTEXT, Signed, Verified, account_of, recover_signer, sign, sign_digest};
pub use wallet::{eip712_message, wallet_typed_data};

use crate::error::{Error, Result};

/// The EIP-712 domain `name` of every compute-exchange signature.
pub const DOMAIN_NAME: &str = "compute-exchange";
/// The EIP-712 domain `version`.
pub const DOMAIN_VERSION: &str = "1";

/// The EIP-712 domain of a chain: `{name, version, chainId, verifyingContract}`, the verifying
/// contract being that chain's Settlement contract (which releases what orders pay for).
pub fn domain(chain_id: u64, settlement: Address) -> Eip712Domain {
    Eip712Domain::new(
        Some(Cow::Borrowed(DOMAIN_NAME)),
        Some(Cow::Borrowed(DOMAIN_VERSION)),
        Some(U256::from(chain_id)),
        Some(settlement),
        None,
    )
}

/// Which typed-data kind: names the `/v1/eip712/{kind}` path segment and the EIP-712 primary type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// [`Intent`].
    Intent,
    /// [`Reserve`].
    Reserve,
    /// [`Rent`].
    Rent,
    /// [`Search`].
    Search,
    /// [`TabTerms`].
    TabTerms,
    /// [`SessionGrant`].
    SessionGrant,
    /// [`PqBinding`].
    PqBinding,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 7] = [
        Self::Intent,
        Self::Reserve,
        Self::Rent,
        Self::Search,
        Self::TabTerms,
        Self::SessionGrant,
        Self::PqBinding,
    ];

    /// The snake-case name (`intent`, `tab_terms`, …), as in URLs and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Intent => "intent",
            Self::Reserve => "reserve",
            Self::Rent => "rent",
            Self::Search => "search",
            Self::TabTerms => "tab_terms",
            Self::SessionGrant => "session_grant",
            Self::PqBinding => "pq_binding",
        }
    }

    /// The EIP-712 primary type (`Intent`, `TabTerms`, …).
    pub fn primary_type(self) -> &'static str {
        match self {
            Self::Intent => <typed::Intent as SolStruct>::NAME,
            Self::Reserve => <typed::Reserve as SolStruct>::NAME,
            Self::Rent => <typed::Rent as SolStruct>::NAME,
            Self::Search => <typed::Search as SolStruct>::NAME,
            Self::TabTerms => <typed::TabTerms as SolStruct>::NAME,
            Self::SessionGrant => <typed::SessionGrant as SolStruct>::NAME,
            Self::PqBinding => <typed::PqBinding as SolStruct>::NAME,
        }
    }

    /// The EIP-712 `encodeType` string, e.g. `Intent(string want,bytes32 adapterId,…)`.
    pub fn encode_type(self) -> Cow<'static, str> {
        match self {
            Self::Intent => typed::Intent::eip712_encode_type(),
            Self::Reserve => typed::Reserve::eip712_encode_type(),
            Self::Rent => typed::Rent::eip712_encode_type(),
            Self::Search => typed::Search::eip712_encode_type(),
            Self::TabTerms => typed::TabTerms::eip712_encode_type(),
            Self::SessionGrant => typed::SessionGrant::eip712_encode_type(),
            Self::PqBinding => typed::PqBinding::eip712_encode_type(),
        }
    }
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Kind {
    type Err = Error;

    /// Accepts the snake-case name (`tab_terms`) or the EIP-712 type name (`TabTerms`).
    fn from_str(s: &str) -> Result<Self> {
        Self::ALL
            .into_iter()
            .find(|k| k.as_str() == s || k.primary_type() == s)
            .ok_or_else(|| Error::InvalidField {
                field: "kind".to_owned(),
                reason: format!(
                    "unknown typed-data kind `{s}`: one of {}",
                    Self::ALL.map(Kind::as_str).join(", ")
                ),
            })
    }
}

/// Anything an agent signs as EIP-712 typed data: a Rust/JSON kind and its `sol!` struct.
pub trait Order:
    Clone + fmt::Debug + PartialEq + serde::Serialize + serde::de::DeserializeOwned
{
    /// Which kind it is.
    const KIND: Kind;
    /// Its EIP-712 struct.
    type Typed: SolStruct + alloy_sol_types::SolValue;

    /// The EIP-712 struct that is hashed and signed.
    fn to_typed(&self) -> Self::Typed;
    /// Back from the EIP-712 struct; refuses an `attested` tier, unknown codes, wei above `u128`.
    fn from_typed(typed: Self::Typed) -> Result<Self>;
    /// Checks each field's own domain (a price above zero, a tier someone can offer, …); field
    /// paths are relative to the order.
    fn validate(&self) -> Result<()>;
    /// The per-account replay guard.
    fn nonce(&self) -> u64;
    /// The tab it draws on, if it draws on one.
    fn tab_id(&self) -> Option<u64>;
    /// After this (unix seconds) the signed order is refused, if it expires.
    fn expiry_s(&self) -> Option<u64>;
    /// The field and unix-seconds value that must lie in the future when the order arrives.
    fn deadline(&self) -> Option<(&'static str, u64)>;
    /// The field and account the order itself names as its signer, if it names one (a tab's
    /// `buyer`, a binding's `account`): the signature must recover exactly that account.
    fn named_signer(&self) -> Option<(&'static str, Address)> {
        None
    }

    /// The EIP-712 signing hash `keccak256(0x19 ‖ 0x01 ‖ domainSeparator ‖ hashStruct(order))`.
    fn signing_hash(&self, domain: &Eip712Domain) -> B256 {
        self.to_typed().eip712_signing_hash(domain)
    }

    /// The `eth_signTypedData_v4` JSON for this order under `domain`.
    fn typed_data(&self, domain: &Eip712Domain) -> serde_json::Value {
        wallet_typed_data(Self::KIND, domain, Some(eip712_message(&self.to_typed())))
    }

    /// Refuses an order whose expiry is not after `now_s` or whose deadline is not after `now_s`.
    /// Protocol has no clock: the caller passes the time it checks against.
    fn check_times(&self, now_s: u64) -> Result<()> {
        if let Some(expiry_s) = self.expiry_s()
            && expiry_s <= now_s
        {
            return Err(Error::Expired {
                field: "expiry_s".to_owned(),
                expiry_s,
                now_s,
            });
        }
        if let Some((field, deadline_s)) = self.deadline()
            && deadline_s <= now_s
        {
            return Err(Error::DeadlinePassed {
                field: field.to_owned(),
                deadline_s,
                now_s,
            });
        }
        Ok(())
    }
}
