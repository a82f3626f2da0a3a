//! What became of a standing order, as `GET /v1/orders/{id}` shows it: a reserve's bids and
//! commitment, a rent's commitment and measured residency. The standing order's record holds
//! these; the reserve and rent books fill them in.

use alloy::primitives::B256;
use serde::Serialize;

/// A bid as the books keep it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StoredBid {
    /// The bidding provider's key hash.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub provider_key_hash: B256,
    /// Its bundle.
    pub bundle_id: String,
    /// Its rate, wei per compute-second.
    pub rate_wei_per_s: u64,
    /// `open` until the window starts, then `won` or `lost`.
    pub status: String,
    /// Why it lost (the binding reason), once awarded.
    #[schema(value_type = Option<Object>)]
    pub refusal: Option<serde_json::Value>,
}

/// What became of a reserve: its bids, the winner's commitment, the draws on it and what its
/// take-or-pay charged.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct ReserveFill {
    /// Every bid, lowest rate first.
    pub bids: Vec<StoredBid>,
    /// The provider it is committed to, once awarded.
    #[schema(value_type = Option<String>, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub provider_key_hash: Option<B256>,
    /// The committed bundle.
    pub bundle_id: Option<String>,
    /// The committed rate, wei per compute-second.
    pub rate_wei_per_s: Option<u64>,
    /// Compute drawn by the buyer's intents, milliseconds.
    pub used_ms: u64,
    /// How many intents drew on it.
    pub draws: u64,
    /// What the take-or-pay charged the tab, wei, once the provider claimed it.
    #[serde(with = "cx_protocol::price::wei_string_opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,38}$")]
    pub charged_wei: Option<u128>,
    /// The take-or-pay job's state: `done` once claimed, `settled` once its batch landed.
    pub settlement: Option<String>,
}

/// A rent's holders and what they share, as `GET /v1/orders/{id}` shows them.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RentFill {
    /// |a|: the rented state's bytes, once committed.
    pub size_bytes: Option<u64>,
    /// When the term started, unix seconds (it ends at the order's `ends_s`).
    pub starts_s: Option<u64>,
    /// Each provider keeping it resident, holder 0 first: as many as the buyer's ε needs.
    pub holders: Vec<RentHolding>,
}

/// One holder of a rent: its commitment, its measured residency and its claim.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct RentHolding {
    /// Which holder (0 first).
    pub holder: u8,
    /// The job its claim becomes ([`cx_protocol::holders::holder_job_id`]).
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub job_id: B256,
    /// The provider holding it.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub provider_key_hash: B256,
    /// The bundle that keeps it resident.
    pub bundle_id: String,
    /// ρ: its price, wei per gigabyte-hour of the state's bytes (its shadow price of them).
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub rho_wei_per_gb_hour: u128,
    /// Its share of the buyer's ε, parts per million: its SLA's bound on absent observations.
    pub epsilon_ppm: u32,
    /// Sweeps whose fresh report found the state resident on the bundle.
    pub resident_reports: u64,
    /// Sweeps that found it absent (or the bundle's report missing or stale).
    pub absent_reports: u64,
    /// Jobs of the adapter on the bundle that missed their deadline in the term (absent too).
    pub missed_deadlines: u64,
    /// Whether its SLA holds so far: the absent share of all observations ≤ its ε.
    pub sla_met: bool,
    /// ρ·|a|·term: its whole term's rent, wei (its part of the order's hold).
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub rent_wei: u128,
    /// What a missed SLA rebates of it at the observations so far, wei.
    #[serde(with = "cx_protocol::price::wei_string_opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,38}$")]
    pub rebate_wei: Option<u128>,
    /// Whether it claimed its term.
    pub claimed: bool,
    /// What its claim charged the tab, wei.
    #[serde(with = "cx_protocol::price::wei_string_opt")]
    #[schema(value_type = Option<String>, pattern = "^[0-9]{1,38}$")]
    pub charged_wei: Option<u128>,
    /// Its claim's job state: `done` once claimed, `settled` once its batch landed.
    pub settlement: Option<String>,
}
