//! The exchange's JSON bodies as the client reads and writes them.
//!
//! These are the client's own structs, not the server's: a client must build without the server,
//! and reading is lenient (unknown fields are ignored) so that a newer exchange that adds a field
//! does not break an older agent. Money is integer wei, written as decimal strings.

use cx_protocol::order::{Address, B256, Eip712Domain, SessionGrant, Signed};
use cx_protocol::price::wei_string;
use serde::{Deserialize, Serialize};

pub use cx_protocol::decision::{Constraint, DecisionRecord, Ranked, Rejection, Terms, Violation};
pub use cx_protocol::order::{InferenceRequest, canonical_json, request_hash};
pub use cx_protocol::wire::{
    Accepted, Assignment, Completed, IntentSubmission, JobEvent, JobRecord, Output, PlacedRun,
    Pull, Pulled, Registered, ResultSubmission, StandingAccepted,
};
pub use cx_protocol::workload::Workload;

/// `GET /healthz`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Health {
    /// `ok`.
    pub status: String,
    /// The server's version.
    pub version: String,
    /// Seconds since it started.
    pub uptime_s: u64,
}

/// One entry of `GET /v1/chains`: a chain the exchange serves and the contract its orders are
/// signed for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainInfo {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The chain's Settlement contract, the EIP-712 domain's verifying contract.
    pub verifying_contract: Address,
}

impl ChainInfo {
    /// The EIP-712 domain orders on this chain are signed under.
    pub fn domain(&self) -> Eip712Domain {
        cx_protocol::order::domain(self.chain_id, self.verifying_contract)
    }
}

/// The answer to `POST /v1/bindings`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bound {
    /// The account.
    pub account: Address,
    /// SHA-256 of the ML-DSA-65 key now bound to it.
    pub mldsa_key_hash: B256,
}

/// Which jobs `GET /v1/jobs` lists.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobsQuery {
    /// Whose jobs (required by the server).
    pub account: Address,
    /// Only jobs in this state.
    pub status: Option<String>,
    /// At most this many (the server's default is 100, its limit 500).
    pub limit: Option<u32>,
}

/// `GET /v1/claims/{chain_id}/{account}`: what settled batches credited an account on one
/// chain, with the Merkle proof `Escrow.claim` takes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Claim {
    /// The chain.
    pub chain_id: u64,
    /// The account credited.
    pub account: Address,
    /// Everything ever credited to it on the chain, wei (decimal).
    pub cumulative_wei: String,
    /// Sibling hashes from its leaf to the chain's balances root.
    pub proof: Vec<B256>,
}

/// `GET /v1/tabs/{chain_id}/{escrow_id}`: a tab as the exchange's books mirror it from chain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Tab {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The escrow id on that chain's Settlement contract.
    pub escrow_id: u64,
    /// Who opened it.
    pub buyer: Address,
    /// What the escrow holds, wei.
    #[serde(with = "wei_string")]
    pub amount_wei: u128,
    /// What jobs hold of it, wei.
    #[serde(with = "wei_string")]
    pub held_wei: u128,
    /// After this (unix seconds) the buyer may reclaim it on chain.
    pub deadline_s: u64,
    /// The escrow's `ref`: the hash of the buyer's signed tab terms.
    pub reference: B256,
    /// `open` or `reclaimed`.
    pub status: String,
}

impl Tab {
    /// What is left to hold, wei.
    pub fn available_wei(&self) -> u128 {
        self.amount_wei.saturating_sub(self.held_wei)
    }
}

/// One market's open quote, as `GET /v1/market` shows it: what the exchange pays providers
/// (bid) and charges buyers (ask) per compute-second with no deadline pressure, the regime the
/// market maker believes it is in, and the reference it opened at (the fleet's median ask).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarketQuote {
    /// The catalog model (the market's class).
    pub model: String,
    /// The verification tier.
    pub tier: cx_protocol::Tier,
    /// Wei per compute-second the exchange pays a provider.
    #[serde(with = "cx_protocol::price::rate_string")]
    pub bid_wei_per_s: u64,
    /// Wei per compute-second a buyer pays; a bundle asking more is not eligible for a market
    /// order.
    #[serde(with = "cx_protocol::price::rate_string")]
    pub ask_wei_per_s: u64,
    /// `calm`, `busy` or `surge`.
    pub regime: String,
    /// The regime belief (calm, busy, surge).
    pub belief: [f64; 3],
    /// Load observations folded in so far (one per sweep).
    pub observations: u64,
    /// The fleet's median ask the market is referenced to, wei per compute-second.
    #[serde(with = "cx_protocol::price::rate_string")]
    pub reference_wei_per_s: u64,
}

/// One model of `GET /v1/models` (the catalog): its names and, if it can be cleared, its shape.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelInfo {
    /// Canonical name.
    pub name: String,
    /// Other names that resolve to it.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Its size and work, when the exchange can clear it.
    #[serde(default)]
    pub shape: Option<ModelShape>,
    /// The router's profile and rungs, as the server sends them.
    #[serde(flatten)]
    pub other: serde_json::Map<String, serde_json::Value>,
}

/// A model's size and work.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModelShape {
    /// |w_m|: bytes of the base weights.
    pub base_bytes: u64,
    /// Parameters.
    pub parameters: u64,
    /// KV cache bytes per token of context.
    pub kv_bytes_per_token: u64,
}

/// The error body every refusal carries.
#[derive(Debug, Deserialize)]
pub(crate) struct ErrorBody {
    pub(crate) error: ErrorDetail,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ErrorDetail {
    pub(crate) code: String,
    #[serde(default)]
    pub(crate) message: String,
    #[serde(default)]
    pub(crate) field: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_with_fields_the_client_does_not_know_still_parse() {
        let tab: Tab = serde_json::from_value(serde_json::json!({
            "chain_id": 31337, "escrow_id": 3, "buyer": Address::repeat_byte(1),
            "amount_wei": "3000", "held_wei": "1000", "deadline_s": 10,
            "reference": B256::repeat_byte(2), "status": "open", "added_later": true,
        }))
        .unwrap();
        assert_eq!(tab.available_wei(), 2_000);
    }
}

/// `POST /v1/sessions`.
#[derive(Clone, Debug, Serialize)]
pub struct OpenSession<'a> {
    /// The grant with both signatures.
    pub grant: &'a Signed<SessionGrant>,
}

/// A stored session grant: `POST /v1/sessions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionOpened {
    /// The session's id (the grant's EIP-712 digest).
    pub session_id: B256,
    /// The account that signed it.
    pub account: Address,
    /// The chain of its tab.
    pub chain_id: u64,
    /// The tab it spends from.
    pub tab_id: u64,
    /// What all its calls together may spend, wei.
    #[serde(with = "wei_string")]
    pub spend_cap_wei: u128,
    /// When the bearer token stops working, unix seconds.
    pub expiry_s: u64,
}

/// A session as its bearer sees it: `GET /v1/sessions/{id}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SessionInfo {
    /// The session's id.
    pub id: B256,
    /// The account that signed its grant.
    pub account: Address,
    /// The chain of its tab.
    pub chain_id: u64,
    /// The signed grant's terms.
    pub grant: SessionGrant,
    /// What its calls hold or were charged, wei.
    #[serde(with = "wei_string")]
    pub spent_wei: u128,
    /// What is left under the cap, wei.
    #[serde(with = "wei_string")]
    pub left_wei: u128,
    /// Whether it was revoked.
    pub revoked: bool,
}

/// `PUT /v1/adapters`: an adapter's two PEFT files.
#[derive(Clone, Debug, Serialize)]
pub struct AdapterFiles<'a> {
    /// The content id the sender expects (the exchange checks it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<&'a str>,
    /// `adapter_config.json`, as text.
    pub adapter_config: &'a str,
    /// `adapter_model.safetensors`, base64 (standard alphabet, padded).
    pub adapter_model_safetensors_base64: String,
}

/// What the exchange's store says of a dataset.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredDataset {
    /// Its content id: what a train order's `data` names.
    pub id: String,
    /// Bytes of the file.
    pub bytes: u64,
    /// Sequences in it.
    pub sequences: u32,
    /// Tokens over all sequences.
    pub tokens: u64,
    /// Whether this call stored it (false: it was there already).
    pub created: bool,
}

/// What the adapter store says of an adapter.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StoredAdapter {
    /// Its content id.
    pub id: String,
    /// |a|: its size, bytes.
    pub bytes: u64,
    /// Whether this call stored it (false: it was there already).
    pub created: bool,
}
