//! The devnet's deployment (cx-settlement's verified deployment, plus the FROST gas probe for
//! `cx bench gas`) and the devnet-only calls on them (minting the test stablecoin, the probe).

use alloy::primitives::{Address, B256, U256};
use alloy::signers::local::PrivateKeySigner;
use cx_contracts::{
    AssetSpec, ChainDeployment, ChainRegistry, Deployment, FeePolicy, FrostGasProbe, TestStablecoin,
};
use cx_settlement::evm::{self, EvmClient, TxOutcome, signing_provider};
use cx_settlement::frost::{EvmGroupKey, EvmSignature};

use crate::error::{Error, Result};

/// What a deployment is made with: `cx chain deploy`'s parameters (one type for both).
pub use cx_settlement::evm::deploy::DeployParams;

/// Devnet defaults for a deployment (grace 10 minutes, minimum stake 1,000 test USD, unbonding
/// one day, the test stablecoin as asset).
pub fn devnet_params(group_key: EvmGroupKey) -> DeployParams {
    DeployParams {
        group_key,
        grace_period_s: 600,
        min_stake: U256::from(1_000_000_000u64),
        unbonding_delay_s: 86_400,
        asset: AssetSpec::TestToken,
    }
}

fn settlement_error(e: impl Into<cx_settlement::Error>) -> Error {
    Error::Settlement(e.into())
}

/// Deploys and verifies the contracts as `cx chain deploy` does ([`evm::deploy::deploy`]) from
/// `signer`'s account, paying the default fees.
pub async fn deploy(
    rpc_url: &str,
    signer: PrivateKeySigner,
    params: DeployParams,
) -> Result<Deployment> {
    Ok(evm::deploy::deploy(rpc_url, signer, params, FeePolicy::default()).await?)
}

/// [`deploy`], then the FROST gas probe beside the contracts (`cx bench gas`).
pub async fn deploy_with_probe(
    rpc_url: &str,
    signer: PrivateKeySigner,
    params: DeployParams,
) -> Result<Deployment> {
    let mut deployment = deploy(rpc_url, signer.clone(), params).await?;
    let provider = signing_provider(rpc_url, signer)?;
    deployment.probe = Some(
        *FrostGasProbe::deploy(provider)
            .await
            .map_err(settlement_error)?
            .address(),
    );
    Ok(deployment)
}

/// Deploys every contract to every chain of `registry` from `deployer`, returning the addresses.
pub async fn deploy_all(
    registry: &ChainRegistry,
    deployer: &PrivateKeySigner,
    params: DeployParams,
) -> Result<Vec<ChainDeployment>> {
    let mut out = Vec::new();
    for chain in &registry.chains {
        let deployment = deploy(&chain.rpc_url, deployer.clone(), params).await?;
        if deployment.chain_id != chain.chain_id {
            return Err(Error::WrongChain {
                expected: chain.chain_id,
                rpc_url: chain.rpc_url.clone(),
                actual: deployment.chain_id,
            });
        }
        out.push(ChainDeployment {
            chain: chain.clone(),
            deployment,
        });
    }
    Ok(out)
}

async fn mined(
    call: impl std::future::Future<
        Output = Result<
            alloy::providers::PendingTransactionBuilder<alloy::network::Ethereum>,
            alloy::contract::Error,
        >,
    >,
) -> Result<alloy::rpc::types::TransactionReceipt> {
    let receipt = call
        .await
        .map_err(settlement_error)?
        .get_receipt()
        .await
        .map_err(settlement_error)?;
    TxOutcome::try_from(&receipt)?;
    Ok(receipt)
}

/// Mints test stablecoin to `to` from `client`'s account (the devnet asset lets anyone mint).
pub async fn mint_test_tokens(client: &EvmClient, to: Address, amount: U256) -> Result<TxOutcome> {
    let token = TestStablecoin::new(client.deployment().asset, client.provider().clone());
    let receipt = mined(token.mint(to, amount).send()).await?;
    Ok(TxOutcome::try_from(&receipt)?)
}

/// Sends one verification through the gas probe; returns (valid, gas of the verification).
pub async fn measure_frost_verify(
    client: &EvmClient,
    key: EvmGroupKey,
    message: B256,
    sig: &EvmSignature,
) -> Result<(bool, u64)> {
    let probe = client
        .deployment()
        .probe
        .ok_or(Error::Bench("no gas probe deployed (deploy_with_probe)"))?;
    let probe = FrostGasProbe::new(probe, client.provider().clone());
    let sig = cx_contracts::probe::FrostVerifier::Signature {
        rX: sig.r_x,
        rY: sig.r_y,
        z: sig.z,
    };
    let receipt = mined(probe.measure(key.x, key.parity, message, sig).send()).await?;
    let measured = receipt
        .logs()
        .iter()
        .find_map(|log| log.log_decode::<FrostGasProbe::Measured>().ok())
        .ok_or(Error::Bench("the probe's receipt has no Measured event"))?;
    let gas = u64::try_from(measured.inner.data.gasUsed)
        .map_err(|_| Error::Bench("the probe reports more than 2^64 gas"))?;
    Ok((measured.inner.data.valid, gas))
}
