//! The exchange's JSON bodies as this provider reads and writes them. They are the provider's
//! own structs (it builds without the exchange's crates); reading is lenient — unknown fields are
//! ignored — so an exchange that adds a field does not break a running provider.

use cx_protocol::assignment::SignedAssignment;
use cx_protocol::order::{Address, B256};
use cx_protocol::price::wei_string;
use cx_protocol::receipt::SignedReceipt;
use serde::{Deserialize, Serialize};

/// One job handed out by `POST /v1/providers/jobs`: the exchange's assignment and the request.
#[derive(Clone, Debug, Deserialize)]
pub(crate) struct Assignment {
    /// The job id (the receipt's `job_id`).
    pub(crate) job_id: B256,
    /// The bundle it was cleared onto.
    #[allow(dead_code)] // read for logs only
    pub(crate) bundle_id: String,
    /// The buyer (the receipt's `buyer`).
    pub(crate) buyer: Address,
    /// The tab's chain.
    pub(crate) chain_id: u64,
    /// The tab.
    pub(crate) escrow_id: u64,
    /// The catalog model.
    pub(crate) model: String,
    /// The adapter by content id, if any.
    #[serde(default)]
    pub(crate) adapter: Option<String>,
    /// The request: for inference the prompt (already the whole text) and `max_tokens`; for
    /// `cx/matmul-f32` the shapes and seeds. Its canonical hash is the assignment's input hash.
    pub(crate) request: serde_json::Value,
    /// The most the receipt may claim, wei.
    #[serde(with = "wei_string")]
    pub(crate) price_wei: u128,
    /// When the result must be in, unix seconds.
    pub(crate) deadline_s: u64,
    /// The exchange's signature on the terms for this provider.
    #[serde(default)]
    pub(crate) signed: Option<SignedAssignment>,
}

/// `GET /v1/exchange`: the key the exchange signs assignments with.
#[derive(Debug, Deserialize)]
pub(crate) struct ExchangeInfo {
    /// The encoded ML-DSA-65 verification key (hex).
    pub(crate) mldsa_key: String,
}

/// `POST /v1/providers/jobs`.
#[derive(Serialize)]
pub(crate) struct Pull {
    pub(crate) max_jobs: u32,
    pub(crate) wait_s: u32,
}

/// Its answer.
#[derive(Deserialize)]
pub(crate) struct Pulled {
    pub(crate) jobs: Vec<Assignment>,
}

/// What the model produced.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Output {
    pub(crate) text: String,
    /// `stop` or `length`.
    pub(crate) finish_reason: &'static str,
    pub(crate) prompt_tokens: u32,
    pub(crate) completion_tokens: u32,
    /// A product's `f32` little-endian bytes, base64 (`cx/matmul-f32` jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) product: Option<String>,
    /// A training job's adapter and losses (`cx/train/<base>` jobs only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) trained: Option<cx_protocol::train::Trained>,
}

/// `POST /v1/jobs/{id}/result`.
#[derive(Serialize)]
pub(crate) struct ResultBody<'a> {
    pub(crate) output: &'a Output,
    pub(crate) receipt: &'a SignedReceipt,
}

/// Its answer.
#[derive(Debug, Deserialize)]
pub(crate) struct Completed {
    #[serde(with = "wei_string")]
    pub(crate) charged_wei: u128,
    #[serde(with = "wei_string")]
    pub(crate) released_wei: u128,
}

/// `POST /v1/providers/register`'s answer.
#[derive(Debug, Deserialize)]
pub(crate) struct Registered {
    pub(crate) key_hash: B256,
    pub(crate) bundles: Vec<String>,
}

/// `GET /v1/adapters/{id}`: PEFT's two files.
#[derive(Deserialize)]
pub(crate) struct AdapterFiles {
    pub(crate) adapter_config: String,
    pub(crate) adapter_model_safetensors_base64: String,
}

/// `GET /v1/claims/{chain_id}/{account}`: what settled batches credited an account.
#[derive(Clone, Debug, Deserialize)]
pub struct Claim {
    /// Everything ever credited on the chain, wei (decimal).
    pub cumulative_wei: String,
    /// Sibling hashes from the leaf to the chain's balances root.
    pub proof: Vec<B256>,
}
