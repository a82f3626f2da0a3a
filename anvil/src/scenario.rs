//! A market on one Anvil chain for the bench and the tests: contracts deployed under the
//! committee's key, a buyer with escrows, a provider registered with its ML-DSA key, and the
//! receipts that provider signs.

use alloy::primitives::{B256, U256};
use cx_protocol::pq::Identity;
use cx_protocol::voucher::{Parties, Voucher};
use sha2::{Digest, Sha256};

use cx_contracts::{ChainDeployment, Deployment};
use cx_settlement::evm::EvmClient;
use cx_settlement::frost::EvmGroupKey;
use cx_settlement::onchain::ChainView;

use crate::anvil::AnvilInstance;
use crate::deploy::{deploy, devnet_params, mint_test_tokens};
use crate::error::Result;

/// One chain with a deployment and three parties.
pub struct ScenarioChain {
    /// The chain.
    pub anvil: AnvilInstance,
    /// Contract addresses.
    pub deployment: Deployment,
    /// Deployer (mints test tokens; also posts batches in the tests).
    pub operator: EvmClient,
    /// The buyer, with escrows.
    pub buyer: EvmClient,
    /// The provider's payout account.
    pub provider: EvmClient,
    /// The provider's ML-DSA identity (signs receipts; its hash is registered on chain).
    pub provider_identity: Identity,
    /// The buyer's ML-DSA identity (co-signs its orders).
    pub buyer_identity: Identity,
}

impl std::fmt::Debug for ScenarioChain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ScenarioChain({})", self.anvil.chain_id)
    }
}

impl ScenarioChain {
    /// Starts Anvil with `chain_id`, deploys under `group_key`, funds the buyer (deposit of
    /// 10^12) and registers the provider's ML-DSA key.
    pub async fn start(chain_id: u64, group_key: EvmGroupKey) -> Result<Self> {
        let anvil = AnvilInstance::spawn(chain_id, None, 4)?;
        let url = anvil.rpc_url();
        let deployment = deploy(&url, anvil.keys[0].clone(), devnet_params(group_key)).await?;
        let client = |i: usize| EvmClient::connect(&url, anvil.keys[i].clone(), deployment);
        let (operator, buyer, provider) = (client(0)?, client(1)?, client(2)?);
        let funds = U256::from(1_000_000_000_000u64);
        mint_test_tokens(&operator, buyer.account(), funds).await?;
        buyer.approve_all().await?;
        buyer.deposit(funds).await?;
        let provider_identity = Identity::generate();
        provider
            .set_metadata(
                "http://127.0.0.1:9001",
                B256::from(provider_identity.id().0),
            )
            .await?;
        Ok(Self {
            anvil,
            deployment,
            operator,
            buyer,
            provider,
            provider_identity,
            buyer_identity: Identity::generate(),
        })
    }

    /// The registry entry with addresses.
    pub fn entry(&self) -> ChainDeployment {
        ChainDeployment {
            chain: self.anvil.entry(),
            deployment: self.deployment,
        }
    }

    /// A read-only view.
    pub fn view(&self) -> Result<ChainView> {
        Ok(ChainView::connect(&self.entry())?)
    }

    /// Opens `count` escrows of `amount` each, due in an hour; returns their ids.
    pub async fn open_jobs(&self, count: usize, amount: u128) -> Result<Vec<u64>> {
        let deadline = self.anvil.now_s().await? + 3_600;
        let mut ids = Vec::with_capacity(count);
        for i in 0..count {
            let reference = B256::from(<[u8; 32]>::from(Sha256::digest(i.to_be_bytes())));
            ids.push(self.buyer.open_job(amount, deadline, reference).await?.0);
        }
        Ok(ids)
    }

    /// One job on each of `escrow_ids`, each owing `owed` wei, with its voucher: the buyer's
    /// intent, the assignment signed by `exchange` (the key the committee pins) and the
    /// provider's receipt.
    pub fn vouchers(
        &self,
        escrow_ids: &[u64],
        owed: u128,
        exchange: &Identity,
    ) -> Result<Vec<Voucher>> {
        self.vouchers_by(&self.provider_identity, escrow_ids, owed, exchange)
    }

    /// [`ScenarioChain::vouchers`] for jobs the exchange assigned to `provider` (its receipts
    /// signed by that key, paid to this chain's provider account).
    pub fn vouchers_by(
        &self,
        provider: &Identity,
        escrow_ids: &[u64],
        owed: u128,
        exchange: &Identity,
    ) -> Result<Vec<Voucher>> {
        let parties = Parties {
            buyer: self.anvil.keys[1].credential(),
            buyer_identity: &self.buyer_identity,
            exchange,
            provider,
            payout: self.provider.account(),
        };
        let domain = cx_protocol::order::domain(self.anvil.chain_id, self.deployment.settlement);
        escrow_ids
            .iter()
            .map(|&escrow_id| {
                parties
                    .intent_job(&domain, escrow_id, escrow_id, owed, owed, owed)
                    .map_err(|e| cx_settlement::Error::from(e).into())
            })
            .collect()
    }
}
