//! The Rust and JSON side of every signed kind: snake case, units in the names, tiers and classes
//! as [`Tier`] and [`DeterminismClass`], money as decimal-string wei. Each converts to its
//! EIP-712 struct in [`super::typed`] (what is hashed and signed) and back, refusing what the
//! other side cannot hold (an `attested` tier, an unknown code, wei above `u128`).
//!
//! Long (~670 lines) because it holds seven kinds, each a struct, its validation and its two
//! conversions (~90 lines a kind): one place to compare them side by side.

use alloy_primitives::{Address, B256, Bytes, U256};
use serde::{Deserialize, Serialize};

use super::{Kind, Order, typed};
use crate::class::{DeterminismClass, Tier};
use crate::error::{Error, Result};
use crate::price::{rate_string, wei_string};

fn invalid(field: &str, reason: impl Into<String>) -> Error {
    Error::InvalidField {
        field: field.to_owned(),
        reason: reason.into(),
    }
}

/// The `uint8` a tier is signed as: T0–T3 are 0–3; `attested` is 4, which no order may carry.
pub fn tier_code(tier: Tier) -> u8 {
    match tier {
        Tier::T0 => 0,
        Tier::T1 => 1,
        Tier::T2 => 2,
        Tier::T3 => 3,
        Tier::Attested => 4,
    }
}

/// The tier a signed `uint8` names; `attested` (4) and unknown codes are refused by name.
pub fn tier_from_code(field: &str, code: u8) -> Result<Tier> {
    match code {
        0 => Ok(Tier::T0),
        1 => Ok(Tier::T1),
        2 => Ok(Tier::T2),
        3 => Ok(Tier::T3),
        4 => Err(Error::AttestedUnavailable {
            field: field.to_owned(),
        }),
        other => Err(invalid(
            field,
            format!("unknown tier code {other}: 0 = T0, 1 = T1, 2 = T2, 3 = T3"),
        )),
    }
}

/// The `uint8` a determinism class is signed as: D 0, D∞ 1, S 2 (as receipts encode it).
pub fn class_code(class: DeterminismClass) -> u8 {
    match class {
        DeterminismClass::D => 0,
        DeterminismClass::DInf => 1,
        DeterminismClass::S => 2,
    }
}

/// The class a signed `uint8` names; unknown codes are refused by name.
pub fn class_from_code(field: &str, code: u8) -> Result<DeterminismClass> {
    match code {
        0 => Ok(DeterminismClass::D),
        1 => Ok(DeterminismClass::DInf),
        2 => Ok(DeterminismClass::S),
        other => Err(invalid(
            field,
            format!("unknown determinism class code {other}: 0 = D, 1 = D_inf, 2 = S"),
        )),
    }
}

fn wei_from(field: &str, value: U256) -> Result<u128> {
    u128::try_from(value).map_err(|_| invalid(field, "must be below 2^128 wei"))
}

fn rate_from(field: &str, value: U256) -> Result<u64> {
    u64::try_from(value).map_err(|_| invalid(field, "must be below 2^64 wei per compute-second"))
}

fn refuse_attested(field: &str, tier: Tier) -> Result<()> {
    if tier == Tier::Attested {
        return Err(Error::AttestedUnavailable {
            field: field.to_owned(),
        });
    }
    Ok(())
}

fn nonzero_wei(field: &str, wei: u128) -> Result<()> {
    if wei == 0 {
        return Err(invalid(field, "must be > 0 wei"));
    }
    Ok(())
}

fn nonzero(field: &str, value: u64) -> Result<()> {
    crate::error::nonzero(field, value)
}

/// An intent: the buyer says what it wants, not what to buy (SPEC §3). The exchange solves §2.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Intent {
    /// A catalog model, or a task the router maps to a model.
    pub want: String,
    /// Content id of the buyer's adapter, if any (signed as the zero word when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "openapi", schema(value_type = Option<String>, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub adapter_id: Option<B256>,
    /// SHA-256 of the request body the job runs on.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub request_hash: B256,
    /// When the result must be ready, unix seconds.
    pub deadline_s: u64,
    /// The most the buyer pays for the job, in wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub max_price_wei: u128,
    /// The buyer leaves its price to the market: the job is cleared only onto bundles asking at
    /// most the market's quote for it (the ask of its model and tier, modulated by its deadline;
    /// recorded in the decision), and `max_price_wei` stays the most it may cost (what the
    /// committee checks every charge against). Signed as `bool marketLimit`; `false` when left
    /// out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub market_limit: bool,
    /// The lowest verification tier accepted.
    pub min_tier: Tier,
    /// The determinism class the job needs.
    pub determinism: DeterminismClass,
    /// The tab (escrow id on the order's chain) the job draws on.
    pub tab_id: u64,
    /// Per-account replay guard.
    pub nonce: u64,
    /// After this (unix seconds) the signed order is no longer accepted.
    pub expiry_s: u64,
}

impl Order for Intent {
    const KIND: Kind = Kind::Intent;
    type Typed = typed::Intent;

    fn to_typed(&self) -> typed::Intent {
        typed::Intent {
            want: self.want.clone(),
            adapterId: self.adapter_id.unwrap_or(B256::ZERO),
            requestHash: self.request_hash,
            deadline: self.deadline_s,
            maxPriceWei: U256::from(self.max_price_wei),
            marketLimit: self.market_limit,
            minTier: tier_code(self.min_tier),
            determinism: class_code(self.determinism),
            tab: self.tab_id,
            nonce: self.nonce,
            expiry: self.expiry_s,
        }
    }

    fn from_typed(t: typed::Intent) -> Result<Self> {
        Ok(Self {
            want: t.want,
            adapter_id: (t.adapterId != B256::ZERO).then_some(t.adapterId),
            request_hash: t.requestHash,
            deadline_s: t.deadline,
            max_price_wei: wei_from("max_price_wei", t.maxPriceWei)?,
            market_limit: t.marketLimit,
            min_tier: tier_from_code("min_tier", t.minTier)?,
            determinism: class_from_code("determinism", t.determinism)?,
            tab_id: t.tab,
            nonce: t.nonce,
            expiry_s: t.expiry,
        })
    }

    fn validate(&self) -> Result<()> {
        if self.want.trim().is_empty() {
            return Err(invalid("want", "name a catalog model or a task"));
        }
        // The zero word is how "no adapter" is signed: an order naming adapter 0x00…00 would be
        // signed exactly as one naming none, so what runs would not be what was signed (found by
        // the `intent_submission` fuzz target's `from_typed(to_typed(x)) == x`).
        if self.adapter_id == Some(B256::ZERO) {
            return Err(invalid(
                "adapter_id",
                "the zero word is how no adapter is signed: leave `adapter_id` out",
            ));
        }
        nonzero_wei("max_price_wei", self.max_price_wei)?;
        refuse_attested("min_tier", self.min_tier)
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        Some(self.tab_id)
    }
    fn expiry_s(&self) -> Option<u64> {
        Some(self.expiry_s)
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        Some(("deadline_s", self.deadline_s))
    }
}

/// Capacity over a time window, priced below spot; take-or-pay (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Reserve {
    /// The catalog model the capacity serves.
    pub model: String,
    /// The verification tier of the reserved work.
    pub tier: Tier,
    /// Start of the window, unix seconds.
    pub window_start_s: u64,
    /// End of the window, unix seconds (after the start).
    pub window_end_s: u64,
    /// Compute reserved over the window, milliseconds.
    pub compute_ms: u64,
    /// The most the buyer pays per compute-second, wei (a decimal string in JSON).
    #[serde(with = "rate_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,19}$"))]
    pub max_price_wei_per_s: u64,
    /// The tab that pays.
    pub tab_id: u64,
    /// Per-account replay guard.
    pub nonce: u64,
    /// After this (unix seconds) the signed order is no longer accepted.
    pub expiry_s: u64,
}

impl Reserve {
    /// The most the reserve can cost, wei: `compute_ms × max_price_wei_per_s`, rounded up to
    /// the wei (what intake holds on the tab and what a take-or-pay voucher may pay at most).
    pub fn most_wei(&self) -> u128 {
        (u128::from(self.compute_ms) * u128::from(self.max_price_wei_per_s)).div_ceil(1000)
    }
}

impl Order for Reserve {
    const KIND: Kind = Kind::Reserve;
    type Typed = typed::Reserve;

    fn to_typed(&self) -> typed::Reserve {
        typed::Reserve {
            model: self.model.clone(),
            tier: tier_code(self.tier),
            windowStart: self.window_start_s,
            windowEnd: self.window_end_s,
            computeMs: self.compute_ms,
            maxPriceWeiPerS: U256::from(self.max_price_wei_per_s),
            tab: self.tab_id,
            nonce: self.nonce,
            expiry: self.expiry_s,
        }
    }

    fn from_typed(t: typed::Reserve) -> Result<Self> {
        Ok(Self {
            model: t.model,
            tier: tier_from_code("tier", t.tier)?,
            window_start_s: t.windowStart,
            window_end_s: t.windowEnd,
            compute_ms: t.computeMs,
            max_price_wei_per_s: rate_from("max_price_wei_per_s", t.maxPriceWeiPerS)?,
            tab_id: t.tab,
            nonce: t.nonce,
            expiry_s: t.expiry,
        })
    }

    fn validate(&self) -> Result<()> {
        if self.model.trim().is_empty() {
            return Err(invalid("model", "name a catalog model"));
        }
        refuse_attested("tier", self.tier)?;
        if self.window_end_s <= self.window_start_s {
            return Err(invalid(
                "window_end_s",
                format!("must be after window_start_s ({})", self.window_start_s),
            ));
        }
        nonzero("compute_ms", self.compute_ms)?;
        nonzero("max_price_wei_per_s", self.max_price_wei_per_s)
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        Some(self.tab_id)
    }
    fn expiry_s(&self) -> Option<u64> {
        Some(self.expiry_s)
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        Some(("window_end_s", self.window_end_s))
    }
}

/// What a rent keeps resident.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum RentTarget {
    /// An adapter, by content id (signed as 0).
    Adapter,
    /// A base model, by content id (signed as 1).
    Base,
    /// A conversation prefix (KV cache), by its hash (signed as 2).
    Prefix,
}

impl RentTarget {
    /// Its name, as JSON writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Adapter => "adapter",
            Self::Base => "base",
            Self::Prefix => "prefix",
        }
    }

    /// The `uint8` it is signed as.
    pub fn code(self) -> u8 {
        match self {
            Self::Adapter => 0,
            Self::Base => 1,
            Self::Prefix => 2,
        }
    }

    /// The target a signed `uint8` names.
    pub fn from_code(field: &str, code: u8) -> Result<Self> {
        match code {
            0 => Ok(Self::Adapter),
            1 => Ok(Self::Base),
            2 => Ok(Self::Prefix),
            other => Err(invalid(
                field,
                format!("unknown rent target code {other}: 0 = adapter, 1 = base, 2 = prefix"),
            )),
        }
    }
}

/// Rent on state: `α = 1` with probability ≥ 1 − ε over the term (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Rent {
    /// What kind of state is pinned.
    pub target_kind: RentTarget,
    /// Its content id (adapter, base) or hash (prefix).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub target: B256,
    /// The term, seconds.
    pub term_s: u64,
    /// The most the buyer pays for the whole term, wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub max_rent_wei: u128,
    /// ε: the miss probability the buyer tolerates, parts per million (below 10⁶).
    pub epsilon_ppm: u32,
    /// The tab that pays.
    pub tab_id: u64,
    /// Per-account replay guard.
    pub nonce: u64,
    /// After this (unix seconds) the signed order is no longer accepted.
    pub expiry_s: u64,
}

impl Order for Rent {
    const KIND: Kind = Kind::Rent;
    type Typed = typed::Rent;

    fn to_typed(&self) -> typed::Rent {
        typed::Rent {
            targetKind: self.target_kind.code(),
            target: self.target,
            termSeconds: self.term_s,
            maxRentWei: U256::from(self.max_rent_wei),
            epsilonPpm: self.epsilon_ppm,
            tab: self.tab_id,
            nonce: self.nonce,
            expiry: self.expiry_s,
        }
    }

    fn from_typed(t: typed::Rent) -> Result<Self> {
        Ok(Self {
            target_kind: RentTarget::from_code("target_kind", t.targetKind)?,
            target: t.target,
            term_s: t.termSeconds,
            max_rent_wei: wei_from("max_rent_wei", t.maxRentWei)?,
            epsilon_ppm: t.epsilonPpm,
            tab_id: t.tab,
            nonce: t.nonce,
            expiry_s: t.expiry,
        })
    }

    fn validate(&self) -> Result<()> {
        nonzero("term_s", self.term_s)?;
        nonzero_wei("max_rent_wei", self.max_rent_wei)?;
        if self.epsilon_ppm >= 1_000_000 {
            return Err(invalid(
                "epsilon_ppm",
                "must be below 1000000 (a miss probability below 1)",
            ));
        }
        Ok(())
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        Some(self.tab_id)
    }
    fn expiry_s(&self) -> Option<u64> {
        Some(self.expiry_s)
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        None
    }
}

/// Las Vegas work: find `nonce` with SHA-256(prefix ‖ nonce as 8 bytes little-endian) < target
/// (256-bit big-endian), the predicate `cx_exchange::lifecycle::search` checks (SPEC §3).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Search {
    /// The bytes every candidate is prefixed with (0x-hex in JSON).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x([0-9a-fA-F]{2})*$"))]
    pub prefix: Bytes,
    /// The target, 256-bit big-endian; above zero.
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub target: B256,
    /// P: the probability, parts per million, that the work the buyer pays for finds a witness
    /// (0 < P < 10⁶). The search is priced on the trials `n = ln(1 − P) / ln(1 − q)` that
    /// reach it, `q = target / 2²⁵⁶` ([`Search::budget_trials`]).
    pub success_ppm: u32,
    /// When a witness must be found, unix seconds (refunded if none by then).
    pub deadline_s: u64,
    /// The most the buyer pays, wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub max_price_wei: u128,
    /// The tab that pays.
    pub tab_id: u64,
    /// Per-account replay guard.
    pub nonce: u64,
    /// After this (unix seconds) the signed order is no longer accepted.
    pub expiry_s: u64,
}

impl Search {
    /// Whether `nonce` is a witness: SHA-256(prefix ‖ nonce as 8 bytes little-endian) < target
    /// (256-bit big-endian). One hash: every party checks a claimed witness itself.
    pub fn is_witness(&self, nonce: u64) -> bool {
        search_witness(&self.prefix, nonce, &self.target.0)
    }

    /// q: the probability that one trial is a witness, `target / 2²⁵⁶`.
    pub fn trial_probability(&self) -> f64 {
        search_trial_probability(&self.target.0)
    }

    /// The work a witness implies: `⌈2²⁵⁶ / target⌉` trials, the mean of the geometric number of
    /// trials to the first witness (saturating at `u128::MAX`; 0 for a zero target, which
    /// [`Order::validate`] refuses). Whoever finds a witness did this much work in expectation,
    /// wherever in the nonce space it looked — so it is what a witness is paid for.
    pub fn witness_trials(&self) -> u128 {
        let target = U256::from_be_bytes(self.target.0);
        if target.is_zero() {
            return 0;
        }
        // 2²⁵⁶ = MAX + 1 and 0 < r + 1 ≤ target, so ⌈2²⁵⁶ / target⌉ = ⌊MAX / target⌋ + 1.
        let trials = U256::MAX / target + U256::from(1u8);
        u128::try_from(trials).unwrap_or(u128::MAX)
    }

    /// The work the buyer pays for: the trials that find a witness with probability P,
    /// `n = ⌈ln(1 − P) / ln(1 − q)⌉` (at least 1; saturating at `u128::MAX`).
    pub fn budget_trials(&self) -> u128 {
        let p = f64::from(self.success_ppm) / 1e6;
        let q = self.trial_probability();
        if !(p > 0.0 && p < 1.0 && q > 0.0) {
            return 0;
        }
        // `as` saturates: a budget past u128 is refused on price anyway.
        search_trials_to_succeed(p, q) as u128
    }
}

/// q for a search target: `target / 2²⁵⁶` (256-bit big-endian).
pub fn search_trial_probability(target: &[u8; 32]) -> f64 {
    target
        .iter()
        .fold(0.0, |acc, b| acc * 256.0 + f64::from(*b))
        / 2f64.powi(256)
}

/// Trials that find a witness with probability `p` when each succeeds with probability `q`
/// (both in (0, 1]): `⌈ln(1 − p) / ln(1 − q)⌉`, at least 1.
pub fn search_trials_to_succeed(p: f64, q: f64) -> f64 {
    if q >= 1.0 {
        return 1.0;
    }
    // ln_1p keeps precision when q is tiny (1 − q rounds to 1 in f64).
    ((-p).ln_1p() / (-q).ln_1p()).ceil().max(1.0)
}

/// The search predicate: SHA-256(prefix ‖ nonce as 8 bytes little-endian) < target, digest and
/// target compared as 256-bit big-endian integers.
pub fn search_witness(prefix: &[u8], nonce: u64, target: &[u8; 32]) -> bool {
    use sha2::{Digest, Sha256};
    let digest: [u8; 32] = Sha256::new()
        .chain_update(prefix)
        .chain_update(nonce.to_le_bytes())
        .finalize()
        .into();
    digest < *target
}

impl Order for Search {
    const KIND: Kind = Kind::Search;
    type Typed = typed::Search;

    fn to_typed(&self) -> typed::Search {
        typed::Search {
            prefix: self.prefix.clone(),
            target: self.target,
            successPpm: self.success_ppm,
            deadline: self.deadline_s,
            maxPriceWei: U256::from(self.max_price_wei),
            tab: self.tab_id,
            nonce: self.nonce,
            expiry: self.expiry_s,
        }
    }

    fn from_typed(t: typed::Search) -> Result<Self> {
        Ok(Self {
            prefix: t.prefix,
            target: t.target,
            success_ppm: t.successPpm,
            deadline_s: t.deadline,
            max_price_wei: wei_from("max_price_wei", t.maxPriceWei)?,
            tab_id: t.tab,
            nonce: t.nonce,
            expiry_s: t.expiry,
        })
    }

    fn validate(&self) -> Result<()> {
        if self.target == B256::ZERO {
            return Err(invalid(
                "target",
                "must be above zero (no digest is below zero)",
            ));
        }
        if self.success_ppm == 0 || self.success_ppm >= 1_000_000 {
            return Err(invalid(
                "success_ppm",
                "must be within 1..=999999 (a success probability strictly between 0 and 1)",
            ));
        }
        nonzero_wei("max_price_wei", self.max_price_wei)
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        Some(self.tab_id)
    }
    fn expiry_s(&self) -> Option<u64> {
        Some(self.expiry_s)
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        Some(("deadline_s", self.deadline_s))
    }
}

/// The terms a tab's on-chain `ref` commits to: `ref = eip712_signing_hash(TabTerms)` under the
/// chain's domain, so the escrow's `ref` binds the buyer, amount, deadline and nonce to one chain
/// and one Settlement contract (see [`TabTerms::tab_ref`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TabTerms {
    /// The buyer whose escrow it is.
    pub buyer: Address,
    /// What the escrow holds, wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    pub amount_wei: u128,
    /// After this (unix seconds) the buyer alone can reclaim the escrow.
    pub deadline_s: u64,
    /// Per-buyer replay guard (two tabs with equal terms get distinct refs).
    pub nonce: u64,
}

impl TabTerms {
    /// The `ref` the escrow is opened with: the terms' EIP-712 signing hash under `domain`.
    pub fn tab_ref(&self, domain: &alloy_sol_types::Eip712Domain) -> B256 {
        self.signing_hash(domain)
    }
}

impl Order for TabTerms {
    const KIND: Kind = Kind::TabTerms;
    type Typed = typed::TabTerms;

    fn to_typed(&self) -> typed::TabTerms {
        typed::TabTerms {
            buyer: self.buyer,
            amountWei: U256::from(self.amount_wei),
            deadline: self.deadline_s,
            nonce: self.nonce,
        }
    }

    fn from_typed(t: typed::TabTerms) -> Result<Self> {
        Ok(Self {
            buyer: t.buyer,
            amount_wei: wei_from("amount_wei", t.amountWei)?,
            deadline_s: t.deadline,
            nonce: t.nonce,
        })
    }

    fn validate(&self) -> Result<()> {
        nonzero_wei("amount_wei", self.amount_wei)
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        None
    }
    fn expiry_s(&self) -> Option<u64> {
        None
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        Some(("deadline_s", self.deadline_s))
    }
    fn named_signer(&self) -> Option<(&'static str, Address)> {
        Some(("buyer", self.buyer))
    }
}

/// A session key (SPEC §3): lets a bearer of the secret whose SHA-256 is `bearer_hash` spend
/// from a tab, within a cap, until an expiry; each call is an intent with these defaults.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct SessionGrant {
    /// The tab it spends from.
    pub tab_id: u64,
    /// The most all its calls together may spend, wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub spend_cap_wei: u128,
    /// After this (unix seconds) the bearer token is refused.
    pub expiry_s: u64,
    /// A call's deadline, seconds after it arrives, unless the call says otherwise.
    pub default_deadline_s: u64,
    /// A call's tier unless it says otherwise.
    pub default_tier: Tier,
    /// A call's determinism class unless it says otherwise.
    pub default_determinism: DeterminismClass,
    /// A call's price limit unless it says otherwise, wei (a decimal string in JSON).
    #[serde(with = "wei_string")]
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^[0-9]{1,38}$"))]
    pub default_max_price_wei: u128,
    /// SHA-256 of the bearer secret (the secret itself is never signed or stored).
    #[cfg_attr(feature = "openapi", schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$"))]
    pub bearer_hash: B256,
    /// Per-account replay guard.
    pub nonce: u64,
}

impl SessionGrant {
    /// The longest deadline a call under a session may ask for, seconds after it arrives.
    pub const MAX_CALL_DEADLINE_S: u64 = 24 * 3600;

    /// The latest deadline any call under this grant can have: one arriving just before its
    /// expiry with the longest deadline. A settlement signer refuses a call assigned a later
    /// one — it was made after the grant expired.
    pub fn last_deadline_s(&self) -> u64 {
        self.expiry_s.saturating_add(Self::MAX_CALL_DEADLINE_S)
    }

    /// The `bearer_hash` of a bearer secret: SHA-256 of its bytes.
    pub fn bearer_hash_of(secret: &[u8]) -> B256 {
        use sha2::{Digest, Sha256};
        B256::from(<[u8; 32]>::from(Sha256::digest(secret)))
    }

    /// Whether `secret` is this grant's bearer secret (its SHA-256 is `bearer_hash`).
    pub fn bearer_matches(&self, secret: &[u8]) -> bool {
        Self::bearer_hash_of(secret) == self.bearer_hash
    }
}

impl Order for SessionGrant {
    const KIND: Kind = Kind::SessionGrant;
    type Typed = typed::SessionGrant;

    fn to_typed(&self) -> typed::SessionGrant {
        typed::SessionGrant {
            tab: self.tab_id,
            spendCapWei: U256::from(self.spend_cap_wei),
            expiry: self.expiry_s,
            defaultDeadlineS: self.default_deadline_s,
            defaultTier: tier_code(self.default_tier),
            defaultDeterminism: class_code(self.default_determinism),
            defaultMaxPriceWei: U256::from(self.default_max_price_wei),
            bearerHash: self.bearer_hash,
            nonce: self.nonce,
        }
    }

    fn from_typed(t: typed::SessionGrant) -> Result<Self> {
        Ok(Self {
            tab_id: t.tab,
            spend_cap_wei: wei_from("spend_cap_wei", t.spendCapWei)?,
            expiry_s: t.expiry,
            default_deadline_s: t.defaultDeadlineS,
            default_tier: tier_from_code("default_tier", t.defaultTier)?,
            default_determinism: class_from_code("default_determinism", t.defaultDeterminism)?,
            default_max_price_wei: wei_from("default_max_price_wei", t.defaultMaxPriceWei)?,
            bearer_hash: t.bearerHash,
            nonce: t.nonce,
        })
    }

    fn validate(&self) -> Result<()> {
        nonzero_wei("spend_cap_wei", self.spend_cap_wei)?;
        nonzero("default_deadline_s", self.default_deadline_s)?;
        refuse_attested("default_tier", self.default_tier)?;
        nonzero_wei("default_max_price_wei", self.default_max_price_wei)
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        Some(self.tab_id)
    }
    fn expiry_s(&self) -> Option<u64> {
        Some(self.expiry_s)
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        None
    }
}

/// The account's half of a key binding: "my ML-DSA key is the one whose SHA-256 is
/// `mldsa_key_hash`". See [`super::Binding`] for the key's half.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PqBinding {
    /// The Ethereum account.
    pub account: Address,
    /// SHA-256 of the ML-DSA-65 verification key (its `IdentityId`).
    pub mldsa_key_hash: B256,
    /// Per-account counter: a later binding replaces an earlier one.
    pub nonce: u64,
}

impl Order for PqBinding {
    const KIND: Kind = Kind::PqBinding;
    type Typed = typed::PqBinding;

    fn to_typed(&self) -> typed::PqBinding {
        typed::PqBinding {
            account: self.account,
            mldsaKeyHash: self.mldsa_key_hash,
            nonce: self.nonce,
        }
    }

    fn from_typed(t: typed::PqBinding) -> Result<Self> {
        Ok(Self {
            account: t.account,
            mldsa_key_hash: t.mldsaKeyHash,
            nonce: t.nonce,
        })
    }

    fn validate(&self) -> Result<()> {
        Ok(())
    }

    fn nonce(&self) -> u64 {
        self.nonce
    }
    fn tab_id(&self) -> Option<u64> {
        None
    }
    fn expiry_s(&self) -> Option<u64> {
        None
    }
    fn deadline(&self) -> Option<(&'static str, u64)> {
        None
    }
    fn named_signer(&self) -> Option<(&'static str, Address)> {
        Some(("account", self.account))
    }
}
