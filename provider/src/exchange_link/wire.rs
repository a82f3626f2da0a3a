//! The exchange's JSON bodies this provider alone reads; the provider door's (assignments,
//! results, registrations) are `cx_protocol::wire`'s, declared once for every party. Reading is
//! lenient — unknown fields are ignored — so an exchange that adds a field does not break a
//! running provider.

use cx_protocol::order::B256;
use serde::Deserialize;

/// `GET /v1/exchange`: the key the exchange signs assignments with.
#[derive(Debug, Deserialize)]
pub(crate) struct ExchangeInfo {
    /// The encoded ML-DSA-65 verification key (hex).
    pub(crate) mldsa_key: String,
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
