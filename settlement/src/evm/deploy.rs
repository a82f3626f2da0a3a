//! Deploying the contracts to a chain and verifying what is there: `cx chain deploy` on any EVM
//! network, and the devnet's deployment (cx-devnet adds its test-only probe beside it).
//!
//! Every creation goes through the account's [`Sender`] (measured gas, the chain's fee policy,
//! replacement when stuck). Before a [`Deployment`] is returned, [`verify`] reads the code at
//! each address and compares it with the committed artifacts (immutables skipped), then reads
//! each immutable and the group key through the contracts' getters: an entry is written only for
//! contracts that are exactly ours with exactly these parameters.

use alloy::primitives::{Address, U256};
use alloy::providers::{DynProvider, Provider};
use alloy::rpc::types::TransactionRequest;
use alloy::signers::local::PrivateKeySigner;
use cx_contracts::code::Contract;
use cx_contracts::{AssetSpec, FeePolicy, ProviderRegistry, Settlement, TestStablecoin};

use super::sender::Sender;
use super::{Deployment, signing_provider};
use crate::error::{Error, Result};
use crate::frost::EvmGroupKey;

/// What a deployment is made with.
#[derive(Clone, Copy, Debug)]
pub struct DeployParams {
    /// The committee's group key.
    pub group_key: EvmGroupKey,
    /// Seconds after a job's deadline before its buyer may reclaim.
    pub grace_period_s: u64,
    /// Smallest positive provider stake.
    pub min_stake: U256,
    /// Seconds between unbond and withdrawal.
    pub unbonding_delay_s: u64,
    /// The settlement asset.
    pub asset: AssetSpec,
}

fn refused(what: &str, reason: impl std::fmt::Display) -> Error {
    Error::Deployment(format!("{what}: {reason}"))
}

/// Sends a creation and returns the new contract's address.
async fn create(sender: &Sender, tx: TransactionRequest, name: &str) -> Result<Address> {
    let receipt = sender.send(tx).await?;
    super::TxOutcome::try_from(&receipt)?;
    receipt
        .contract_address
        .ok_or_else(|| refused(name, "the creation's receipt names no contract"))
}

/// Deploys the asset (per `params.asset`), `Settlement` and `ProviderRegistry` from `signer` at
/// `rpc_url`, paying gas by `fees`, and verifies them ([`verify`]).
pub async fn deploy(
    rpc_url: &str,
    signer: PrivateKeySigner,
    params: DeployParams,
    fees: FeePolicy,
) -> Result<Deployment> {
    let account = signer.address();
    let provider = signing_provider(rpc_url, signer)?;
    let sender = Sender::new(provider.clone(), rpc_url, account, fees);
    let chain_id = provider.get_chain_id().await?;
    let asset = match params.asset {
        AssetSpec::Native => Address::ZERO,
        AssetSpec::TestToken => {
            let tx = TestStablecoin::deploy_builder(provider.clone()).into_transaction_request();
            create(&sender, tx, "TestStablecoin").await?
        }
        AssetSpec::Erc20 { address, decimals } => {
            let token = TestStablecoin::new(address, provider.clone());
            let said =
                token.decimals().call().await.map_err(|e| {
                    refused("asset", format!("{address} answers no decimals(): {e}"))
                })?;
            if said != decimals {
                return Err(refused(
                    "asset",
                    format!("{address} has {said} decimals, the registry says {decimals}"),
                ));
            }
            address
        }
    };
    let tx = Settlement::deploy_builder(
        provider.clone(),
        asset,
        params.grace_period_s,
        params.group_key.x,
        params.group_key.parity,
    )
    .into_transaction_request();
    let settlement = create(&sender, tx, "Settlement").await?;
    let tx = ProviderRegistry::deploy_builder(
        provider.clone(),
        settlement,
        params.min_stake,
        params.unbonding_delay_s,
    )
    .into_transaction_request();
    let registry = create(&sender, tx, "ProviderRegistry").await?;
    let deployment = Deployment {
        chain_id,
        settlement,
        registry,
        asset,
        probe: None,
    };
    verify(&provider, &deployment, &params).await?;
    Ok(deployment)
}

async fn check_code(provider: &DynProvider, contract: Contract, at: Address) -> Result<()> {
    let code = provider.get_code_at(at).await?;
    contract
        .check_code(&code)
        .map_err(|reason| refused(contract.name(), format!("{at}: {reason}")))
}

/// Checks that `deployment` holds our contracts, made with `params`: the runtime code of each
/// against the artifacts, then every immutable and the group key through the getters.
pub async fn verify(
    provider: &DynProvider,
    deployment: &Deployment,
    params: &DeployParams,
) -> Result<()> {
    if provider.get_chain_id().await? != deployment.chain_id {
        return Err(refused("chain", "the RPC serves another chain id"));
    }
    check_code(provider, Contract::Settlement, deployment.settlement).await?;
    check_code(provider, Contract::ProviderRegistry, deployment.registry).await?;
    if params.asset == AssetSpec::TestToken {
        check_code(provider, Contract::TestStablecoin, deployment.asset).await?;
    }
    let settlement = Settlement::new(deployment.settlement, provider.clone());
    let registry = ProviderRegistry::new(deployment.registry, provider.clone());
    let key = settlement.groupKey().call().await?;
    // Each immutable as the chain reads it beside what was deployed.
    let read = [
        (
            "Settlement.asset",
            settlement.asset().call().await?.to_string(),
            deployment.asset.to_string(),
        ),
        (
            "Settlement.gracePeriod_s",
            settlement.gracePeriod_s().call().await?.to_string(),
            params.grace_period_s.to_string(),
        ),
        (
            "Settlement.groupKey",
            format!("{:#x}/{}", key.x, key.parity),
            format!("{:#x}/{}", params.group_key.x, params.group_key.parity),
        ),
        (
            "ProviderRegistry.settlement",
            registry.settlement().call().await?.to_string(),
            deployment.settlement.to_string(),
        ),
        (
            "ProviderRegistry.asset",
            registry.asset().call().await?.to_string(),
            deployment.asset.to_string(),
        ),
        (
            "ProviderRegistry.minStake",
            registry.minStake().call().await?.to_string(),
            params.min_stake.to_string(),
        ),
        (
            "ProviderRegistry.unbondingDelay_s",
            registry.unbondingDelay_s().call().await?.to_string(),
            params.unbonding_delay_s.to_string(),
        ),
    ];
    if let Some((what, got, want)) = read.into_iter().find(|(_, got, want)| got != want) {
        return Err(refused(
            what,
            format!("reads {got} on chain, {want} was deployed"),
        ));
    }
    Ok(())
}
