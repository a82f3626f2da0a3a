//! Where the contracts live: one [`Deployment`] per chain, and the deployments file (the chain
//! registry with addresses) that deployment writes and every signer, the exchange and providers
//! read.

use std::path::Path;

use alloy::primitives::Address;
use serde::{Deserialize, Serialize};

use crate::{ChainEntry, Error, Result};

/// Where one deployment lives on one chain.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Deployment {
    /// Chain id.
    pub chain_id: u64,
    /// `Settlement` (escrow + batches).
    pub settlement: Address,
    /// `ProviderRegistry`.
    pub registry: Address,
    /// Payment asset: the test stablecoin, or the zero address for native ETH.
    pub asset: Address,
    /// `FrostGasProbe`, when deployed (bench only).
    pub probe: Option<Address>,
}

impl Deployment {
    /// Whether the asset is the chain's native currency (ETH) rather than an ERC-20.
    pub fn is_native(&self) -> bool {
        self.asset == Address::ZERO
    }
}

/// One chain's deployment, as written to the deployments file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainDeployment {
    /// Chain id and RPC URL.
    #[serde(flatten)]
    pub chain: ChainEntry,
    /// Contract addresses.
    pub deployment: Deployment,
}

/// The deployments file: the chain registry with every chain's contract addresses.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentsFile {
    /// One entry per chain.
    pub chains: Vec<ChainDeployment>,
}

impl DeploymentsFile {
    /// Reads it; every chain's entry is checked as a registry file's is.
    pub fn load(path: &Path) -> Result<Self> {
        let file: Self = crate::read_json(path)?;
        for c in &file.chains {
            c.chain.validate().map_err(|reason| Error::Invalid {
                path: path.to_path_buf(),
                reason: format!("chain {}: {reason}", c.chain.chain_id),
            })?;
        }
        Ok(file)
    }

    /// Writes it as pretty JSON, creating the folder.
    pub fn write(&self, path: &Path) -> Result<()> {
        let failed = |path: &Path| {
            let path = path.to_path_buf();
            move |source| Error::Write { path, source }
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(failed(dir))?;
        }
        let text = serde_json::to_string_pretty(self).expect("plain data serialises") + "\n";
        std::fs::write(path, text).map_err(failed(path))
    }

    /// The entry of `chain_id`.
    pub fn chain(&self, chain_id: u64) -> Option<&ChainDeployment> {
        self.chains.iter().find(|c| c.chain.chain_id == chain_id)
    }
}
