//! Who may sell: a provider is admitted only while, on every chain the exchange settles on, its
//! payout account has at least the registry's minimum at stake and has registered the ML-DSA
//! key its offers are signed with (`ProviderRegistry.providers`). Every chain, because a job is
//! paid on its tab's chain, where the committee checks the same registry before it pays; a
//! provider missing from one chain could run jobs no batch there would pay.
//!
//! The check runs when an offer registers and again on the sweeps (a provider that unbonds
//! below the minimum, is slashed or changes its key leaves the engine).

use alloy::primitives::{Address, B256, U256};
use cx_settlement::onchain::ChainView;

use crate::error::{Error, Result};

/// The registries of the chains served.
#[derive(Clone, Debug, Default)]
pub struct Registries {
    chains: Vec<ChainView>,
}

impl Registries {
    /// The registries of `chains`; none: no stake is asked (tests without chains).
    pub fn new(chains: Vec<ChainView>) -> Self {
        Self { chains }
    }

    /// Whether any chain is checked.
    pub fn is_empty(&self) -> bool {
        self.chains.is_empty()
    }

    /// What `payout` has at stake in each chain's registry (for the explorer's provider page);
    /// a chain that does not answer within `timeout` is left out, so a page never hangs on one.
    pub async fn stakes(&self, payout: Address, timeout: std::time::Duration) -> Vec<(u64, U256)> {
        let mut out = Vec::new();
        for chain in &self.chains {
            if let Ok(Ok((staked, _))) =
                tokio::time::timeout(timeout, chain.provider_standing(payout)).await
            {
                out.push((chain.chain_id, staked));
            }
        }
        out
    }

    /// Refuses `payout` unless it has at least the minimum at stake and `key_hash` registered
    /// on every chain, naming the first chain where it falls short and by how much.
    pub async fn check(&self, payout: Address, key_hash: B256) -> Result<()> {
        for chain in &self.chains {
            let chain_err = |e: cx_settlement::Error| Error::Chain(e.to_string());
            let (staked, registered) = chain.provider_standing(payout).await.map_err(chain_err)?;
            let min = chain.min_stake().await.map_err(chain_err)?;
            if staked < min || staked == U256::ZERO {
                return Err(Error::NotStaked {
                    chain_id: chain.chain_id,
                    reason: format!(
                        "{payout} has {staked} wei at stake in ProviderRegistry {}, below the \
                         minimum {min} (cx-provider stake)",
                        chain.deployment.registry
                    ),
                });
            }
            if registered != key_hash {
                return Err(Error::NotStaked {
                    chain_id: chain.chain_id,
                    reason: format!(
                        "{payout} registered ML-DSA key {registered} in ProviderRegistry {}, not \
                         the key {key_hash} that signed this offer (cx-provider stake sets it)",
                        chain.deployment.registry
                    ),
                });
            }
        }
        Ok(())
    }
}
