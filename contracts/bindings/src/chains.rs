//! The chain registry: which EVM chains the market settles on and where their JSON-RPC
//! endpoints are (`anvil/chains.json` on the devnet).

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::Result;

/// One chain of the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainEntry {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// JSON-RPC URL.
    pub rpc_url: String,
    /// The chain's block explorer, if it has one: transactions are at `{explorer_url}/tx/{hash}`
    /// (EIP-3091), where the exchange's explorer links them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explorer_url: Option<String>,
}

/// The chain registry file: `{ "chains": [ { "chain_id": …, "rpc_url": …, "explorer_url"?: … }, … ] }`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRegistry {
    /// Chains, in order.
    pub chains: Vec<ChainEntry>,
}

impl ChainRegistry {
    /// Reads a registry file.
    pub fn load(path: &Path) -> Result<Self> {
        crate::read_json(path)
    }
}
