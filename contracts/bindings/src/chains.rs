//! The chain registry: which EVM chains the market settles on, where their JSON-RPC
//! endpoints are (`anvil/chains.json` on the devnet), and how deep a block must be before the
//! exchange believes what it says (the chain's finality depth, see [`ChainEntry::finality_blocks`]).

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
    /// What kind of chain it is: it sets the finality depth when `finality_blocks` is absent.
    /// Absent means [`ChainKind::Public`], so an entry that says nothing is watched safely.
    #[serde(default)]
    pub kind: ChainKind,
    /// Blocks a log must be under before the exchange believes it, overriding the kind's default.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub finality_blocks: Option<u64>,
}

/// What kind of chain a registry entry is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChainKind {
    /// A local Anvil chain (the devnet's 31337 and 31338): one node that mines each block once,
    /// so a block is final when mined unless someone calls `anvil_reorg` — 0 blocks.
    Anvil,
    /// Any other chain, taken to be L1-like: [`PUBLIC_FINALITY_BLOCKS`] blocks.
    #[default]
    Public,
}

/// The finality depth of a [`ChainKind::Public`] chain: 12 blocks, 2.4 minutes at Ethereum's 12 s
/// slots. Reorgs on Ethereum since the Merge have been one or two blocks deep, the deepest seen
/// seven (the beacon chain, May 2022, before proposer boost); 12 leaves room past that, and is the
/// depth exchanges have long waited for deposits. A chain with a different profile (an L2 whose
/// sequencer may reorganise deeper, a chain whose finality gadget is faster) says so with
/// `finality_blocks` in its entry.
pub const PUBLIC_FINALITY_BLOCKS: u64 = 12;

impl ChainKind {
    /// Blocks a log must be under before it is believed on a chain of this kind.
    pub fn default_finality_blocks(self) -> u64 {
        match self {
            Self::Anvil => 0,
            Self::Public => PUBLIC_FINALITY_BLOCKS,
        }
    }
}

impl ChainEntry {
    /// The registry's finality depth for this chain: `finality_blocks` if given, else its kind's.
    pub fn finality_blocks(&self) -> u64 {
        self.finality_blocks
            .unwrap_or_else(|| self.kind.default_finality_blocks())
    }

    /// The depth a watcher of this chain reads at: the operator's `--confirmations` when given
    /// (it applies to every chain), else the registry's [`Self::finality_blocks`].
    pub fn confirmations(&self, flag: Option<u64>) -> u64 {
        flag.unwrap_or_else(|| self.finality_blocks())
    }
}

/// The chain registry file: `{ "chains": [ { "chain_id": …, "rpc_url": …, "explorer_url"?: …,
/// "kind"?: "anvil" | "public", "finality_blocks"?: … }, … ] }`.
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

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(json: &str) -> ChainEntry {
        serde_json::from_str(json).unwrap()
    }

    // Issue 32 item 10: every chain was watched at one `--confirmations` (0 by default), so a
    // public chain's ordinary one-block reorg under a tab orders drew on stopped its watcher.
    #[test]
    fn a_non_anvil_chain_waits_for_its_finality_depth_by_default() {
        let public = entry(r#"{ "chain_id": 1, "rpc_url": "https://rpc.example" }"#);
        assert_eq!(public.kind, ChainKind::Public);
        assert_eq!(public.confirmations(None), PUBLIC_FINALITY_BLOCKS);
        let anvil =
            entry(r#"{ "chain_id": 31338, "rpc_url": "http://127.0.0.1:8546", "kind": "anvil" }"#);
        assert_eq!(anvil.confirmations(None), 0);
        let own =
            entry(r#"{ "chain_id": 10, "rpc_url": "https://l2.example", "finality_blocks": 64 }"#);
        assert_eq!(own.confirmations(None), 64);
    }

    #[test]
    fn an_explicit_confirmations_flag_overrides_every_chains_default() {
        let public = entry(r#"{ "chain_id": 1, "rpc_url": "https://rpc.example" }"#);
        let anvil = entry(r#"{ "chain_id": 31337, "rpc_url": "http://x", "kind": "anvil" }"#);
        assert_eq!(public.confirmations(Some(0)), 0);
        assert_eq!(anvil.confirmations(Some(5)), 5);
    }

    #[test]
    fn the_devnet_registry_marks_both_chains_anvil() {
        let text = include_str!("../../../anvil/chains.json");
        let registry: ChainRegistry = serde_json::from_str(text).unwrap();
        assert_eq!(registry.chains.len(), 2);
        assert!(
            registry
                .chains
                .iter()
                .all(|c| c.kind == ChainKind::Anvil && c.confirmations(None) == 0)
        );
    }
}
