//! The chain registry: which EVM chains the market settles on, where their JSON-RPC
//! endpoints are (`anvil/chains.json` on the devnet, or one TOML file per chain for a real
//! network, see [`ChainEntry::load_toml`]), how deep a block must be before the exchange believes
//! what it says (the chain's finality depth, see [`ChainEntry::finality_blocks`]), how its
//! parties pay for gas ([`FeePolicy`]) and what asset settles there ([`AssetSpec`]).

use std::path::Path;

use alloy::primitives::Address;
use serde::{Deserialize, Serialize};

use crate::fees::FeePolicy;
use crate::{Error, Result};

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
    /// JSON-RPC URLs tried after `rpc_url` when it does not answer, in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fallback_rpc_urls: Vec<String>,
    /// How parties pay for gas here (defaults: see [`FeePolicy`]).
    #[serde(default, skip_serializing_if = "is_default")]
    pub fees: FeePolicy,
    /// The settlement asset, as the operator declares it before deployment (absent: the
    /// deployer's choice; a deployment records the address it used).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub asset: Option<AssetSpec>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

/// The asset a chain settles in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AssetSpec {
    /// The chain's own currency (18 decimals).
    Native,
    /// An ERC-20 already on the chain; deployment checks its `decimals()` says the same.
    Erc20 {
        /// The token contract.
        address: Address,
        /// Its decimals.
        decimals: u8,
    },
    /// A fresh `TestStablecoin` (6 decimals, anyone may mint: test networks only).
    TestToken,
}

impl AssetSpec {
    /// Decimals of one whole unit.
    pub fn decimals(self) -> u8 {
        match self {
            Self::Native => 18,
            Self::Erc20 { decimals, .. } => decimals,
            Self::TestToken => 6,
        }
    }
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
    /// The fields an entry may have.
    const FIELDS: &[&str] = &[
        "chain_id",
        "rpc_url",
        "fallback_rpc_urls",
        "explorer_url",
        "kind",
        "finality_blocks",
        "fees",
        "asset",
    ];

    /// The registry's finality depth for this chain: `finality_blocks` if given, else its kind's.
    pub fn finality_blocks(&self) -> u64 {
        self.finality_blocks
            .unwrap_or_else(|| self.kind.default_finality_blocks())
    }

    /// A registry entry for `chain_id` at `rpc_url` with every other field at its default.
    pub fn new(chain_id: u64, rpc_url: impl Into<String>, kind: ChainKind) -> Self {
        Self {
            chain_id,
            rpc_url: rpc_url.into(),
            explorer_url: None,
            kind,
            finality_blocks: None,
            fallback_rpc_urls: Vec::new(),
            fees: FeePolicy::default(),
            asset: None,
        }
    }

    /// Every JSON-RPC URL of the chain, the first to try first.
    pub fn rpc_urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.rpc_url.as_str())
            .chain(self.fallback_rpc_urls.iter().map(String::as_str))
    }

    /// Reads one chain's registry file (TOML, the same fields as a JSON entry):
    ///
    /// ```toml
    /// chain_id = 11155111
    /// rpc_url = "https://rpc.sepolia.example"
    /// fallback_rpc_urls = ["https://backup.example"]
    /// finality_blocks = 3
    /// [asset]
    /// kind = "erc20"
    /// address = "0x1c7D4B196Cb0C7B01d743Fbc6116a902379C7238"
    /// decimals = 6
    /// [fees]
    /// max_fee_per_gas_cap_wei = 50_000_000_000
    /// ```
    pub fn load_toml(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let invalid = |reason: String| Error::Invalid {
            path: path.to_path_buf(),
            reason,
        };
        let at_line = |e: &toml::de::Error| {
            let line = e
                .span()
                .map_or(0, |s| text[..s.start].lines().count().max(1));
            format!("line {line}: {}", e.message())
        };
        // A misspelt field must not fall back to its default silently: the top level is
        // checked here ([fees] and [asset] refuse unknown fields themselves).
        let table: toml::Table = toml::from_str(&text).map_err(|e| invalid(at_line(&e)))?;
        if let Some(key) = table.keys().find(|k| !Self::FIELDS.contains(&k.as_str())) {
            return Err(invalid(format!(
                "unknown field `{key}`, expected one of {}",
                Self::FIELDS.join(", ")
            )));
        }
        let entry: Self = toml::from_str(&text).map_err(|e| invalid(at_line(&e)))?;
        entry.validate().map_err(invalid)?;
        Ok(entry)
    }

    /// Checks what serde cannot: URLs present, the fee policy's ranges.
    pub fn validate(&self) -> std::result::Result<(), String> {
        if let Some(url) = self
            .rpc_urls()
            .find(|u| !(u.starts_with("http://") || u.starts_with("https://")))
        {
            return Err(format!("rpc URL {url:?} is not http(s)://"));
        }
        self.fees.validate().map_err(|e| e.to_string())
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
    fn the_example_chain_file_reads_and_a_misspelt_field_is_refused_by_name() {
        let dir = std::env::temp_dir().join(format!("cx-chain-toml-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("chain.toml");
        let example = include_str!("../../../docs/chains/example.toml");
        std::fs::write(&path, example).unwrap();
        let entry = ChainEntry::load_toml(&path).unwrap();
        assert_eq!(entry.chain_id, 11_155_111);
        assert_eq!(entry.rpc_urls().count(), 2);
        assert_eq!(entry.confirmations(None), 3);
        assert_eq!(entry.fees.max_fee_per_gas_cap_wei, 50_000_000_000);
        assert_eq!(entry.asset.map(AssetSpec::decimals), Some(6));
        for (bad, named) in [
            (
                example.replace("finality_blocks", "finality_block"),
                "finality_block",
            ),
            (
                example.replace("bump_percent = 25", "bump_percent = 5"),
                "bump_percent",
            ),
            (
                example.replace("stuck_after_blocks", "stuck_after"),
                "stuck_after",
            ),
            (
                example.replace("https://sepolia.example.org", "ftp://x"),
                "ftp://x",
            ),
        ] {
            std::fs::write(&path, bad).unwrap();
            let err = ChainEntry::load_toml(&path).unwrap_err().to_string();
            assert!(err.contains(named), "{err}");
            assert_eq!(err.lines().count(), 1, "{err}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
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
