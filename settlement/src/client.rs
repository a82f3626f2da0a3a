//! The EVM client: typed calls to `Settlement` and `ProviderRegistry`, refusals decoded into
//! their custom errors, and event readers for the explorer.
//!
//! One [`EvmClient`] acts for one account on one chain (the account's key signs locally; the
//! provider fills nonce, gas and chain id). Every state-changing call waits for its receipt and
//! returns a [`TxOutcome`] with the gas used.

use alloy::network::EthereumWallet;
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionReceipt;
use alloy::signers::local::PrivateKeySigner;
use alloy::sol_types::SolEvent;
use serde::{Deserialize, Serialize};

use crate::batch::BatchMessage;
use crate::contracts::{FrostGasProbe, ProviderRegistry, Settlement, TestStablecoin, settlement};
use crate::error::{Error, Result};
use crate::frost::{EvmGroupKey, EvmSignature};

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

/// Parameters of a deployment.
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
    /// Native ETH instead of a freshly deployed test stablecoin.
    pub native: bool,
    /// Also deploy the FROST gas probe.
    pub with_probe: bool,
}

/// The result of a mined transaction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxOutcome {
    /// Transaction hash.
    pub tx_hash: B256,
    /// Gas used by the whole transaction (after refunds).
    pub gas_used: u64,
    /// Block it was mined in.
    pub block_number: u64,
}

/// The group key as `Settlement.groupKey()` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OnChainGroupKey {
    /// The key.
    pub key: EvmGroupKey,
    /// How many rotations happened.
    pub epoch: u32,
}

/// A `BatchSettled` event with where it was logged.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SettledBatch {
    /// Batch nonce.
    pub nonce: u64,
    /// Receipts root.
    pub receipts_root: B256,
    /// Cumulative balances root.
    pub balances_root: B256,
    /// Escrow the batch settled.
    pub settled_amount: U256,
    /// Transaction that carried it.
    pub tx_hash: Option<B256>,
    /// Block.
    pub block_number: Option<u64>,
}

/// Maps a contract error to our error, decoding the custom error when it is one of ours.
fn contract_error(e: alloy::contract::Error) -> Error {
    fn name_of(debug: String) -> (String, String) {
        let name = debug
            .split(['(', ' ', '{'])
            .next()
            .unwrap_or("unknown")
            .to_string();
        (name, format!(": {debug}"))
    }
    if let Some(decoded) = e.as_decoded_interface_error::<Settlement::SettlementErrors>() {
        let (name, detail) = name_of(format!("{decoded:?}"));
        return Error::Reverted { name, detail };
    }
    if let Some(decoded) =
        e.as_decoded_interface_error::<ProviderRegistry::ProviderRegistryErrors>()
    {
        let (name, detail) = name_of(format!("{decoded:?}"));
        return Error::Reverted { name, detail };
    }
    if let Some(data) = e.as_revert_data() {
        return Error::Reverted {
            name: "unknown".into(),
            detail: format!(": revert data {data}"),
        };
    }
    Error::Rpc(e.to_string())
}

fn outcome(receipt: TransactionReceipt) -> Result<TxOutcome> {
    if !receipt.status() {
        return Err(Error::Reverted {
            name: "unknown".into(),
            detail: format!(": tx {} failed", receipt.transaction_hash),
        });
    }
    Ok(TxOutcome {
        tx_hash: receipt.transaction_hash,
        gas_used: receipt.gas_used,
        block_number: receipt.block_number.unwrap_or_default(),
    })
}

macro_rules! send {
    ($call:expr) => {{
        let pending = $call.send().await.map_err(contract_error)?;
        let receipt = pending
            .get_receipt()
            .await
            .map_err(|e| Error::Rpc(e.to_string()))?;
        (outcome(receipt.clone())?, receipt)
    }};
}

fn signature(sig: &EvmSignature) -> settlement::FrostVerifier::Signature {
    settlement::FrostVerifier::Signature {
        rX: sig.r_x,
        rY: sig.r_y,
        z: sig.z,
    }
}

fn registry_signature(sig: &EvmSignature) -> crate::contracts::registry::FrostVerifier::Signature {
    crate::contracts::registry::FrostVerifier::Signature {
        rX: sig.r_x,
        rY: sig.r_y,
        z: sig.z,
    }
}

/// One account's view of one deployment.
#[derive(Clone, Debug)]
pub struct EvmClient {
    provider: DynProvider,
    account: Address,
    deployment: Deployment,
}

/// Builds a signing provider for `signer` at `rpc_url`.
pub fn signing_provider(rpc_url: &str, signer: PrivateKeySigner) -> Result<DynProvider> {
    let url = rpc_url
        .parse()
        .map_err(|e| Error::Rpc(format!("bad RPC URL {rpc_url}: {e}")))?;
    // Simple (not cached) nonces: the cached manager counts a nonce when it fills one, so a call
    // refused at gas estimation would leave a gap and every later transaction pending forever.
    Ok(ProviderBuilder::new()
        .disable_recommended_fillers()
        .with_gas_estimation()
        .with_simple_nonce_management()
        .fetch_chain_id()
        .wallet(EthereumWallet::from(signer))
        .connect_http(url)
        .erased())
}

impl EvmClient {
    /// A client acting as `signer` on the deployment at `rpc_url`.
    pub fn connect(
        rpc_url: &str,
        signer: PrivateKeySigner,
        deployment: Deployment,
    ) -> Result<Self> {
        let account = signer.address();
        Ok(Self {
            provider: signing_provider(rpc_url, signer)?,
            account,
            deployment,
        })
    }

    /// Deploys the asset (unless native), `Settlement`, `ProviderRegistry` and optionally the
    /// gas probe, from `signer`'s account.
    pub async fn deploy(
        rpc_url: &str,
        signer: PrivateKeySigner,
        params: DeployParams,
    ) -> Result<Deployment> {
        let provider = signing_provider(rpc_url, signer)?;
        let chain_id = provider
            .get_chain_id()
            .await
            .map_err(|e| Error::Rpc(e.to_string()))?;
        let asset = if params.native {
            Address::ZERO
        } else {
            *TestStablecoin::deploy(provider.clone())
                .await
                .map_err(contract_error)?
                .address()
        };
        let settlement = *Settlement::deploy(
            provider.clone(),
            asset,
            params.grace_period_s,
            params.group_key.x,
            params.group_key.parity,
        )
        .await
        .map_err(contract_error)?
        .address();
        let registry = *ProviderRegistry::deploy(
            provider.clone(),
            settlement,
            params.min_stake,
            params.unbonding_delay_s,
        )
        .await
        .map_err(contract_error)?
        .address();
        let probe = if params.with_probe {
            Some(
                *FrostGasProbe::deploy(provider.clone())
                    .await
                    .map_err(contract_error)?
                    .address(),
            )
        } else {
            None
        };
        Ok(Deployment {
            chain_id,
            settlement,
            registry,
            asset,
            probe,
        })
    }

    /// The account this client signs for.
    pub fn account(&self) -> Address {
        self.account
    }

    /// The deployment.
    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    /// The underlying provider (for raw RPC such as Anvil's time travel).
    pub fn provider(&self) -> &DynProvider {
        &self.provider
    }

    fn settlement(&self) -> Settlement::SettlementInstance<DynProvider> {
        Settlement::new(self.deployment.settlement, self.provider.clone())
    }

    fn registry(&self) -> ProviderRegistry::ProviderRegistryInstance<DynProvider> {
        ProviderRegistry::new(self.deployment.registry, self.provider.clone())
    }

    fn token(&self) -> TestStablecoin::TestStablecoinInstance<DynProvider> {
        TestStablecoin::new(self.deployment.asset, self.provider.clone())
    }

    fn is_native(&self) -> bool {
        self.deployment.asset == Address::ZERO
    }

    // ---- asset --------------------------------------------------------------------------------

    /// Mints test stablecoin to `to` (devnet asset only).
    pub async fn mint_test_tokens(&self, to: Address, amount: U256) -> Result<TxOutcome> {
        Ok(send!(self.token().mint(to, amount)).0)
    }

    /// Lets `Settlement` and `ProviderRegistry` pull this account's tokens (no-op for native).
    pub async fn approve_all(&self) -> Result<()> {
        if self.is_native() {
            return Ok(());
        }
        send!(self.token().approve(self.deployment.settlement, U256::MAX));
        send!(self.token().approve(self.deployment.registry, U256::MAX));
        Ok(())
    }

    /// The asset balance of `who` (token balance, or ETH balance for native).
    pub async fn asset_balance(&self, who: Address) -> Result<U256> {
        if self.is_native() {
            return self
                .provider
                .get_balance(who)
                .await
                .map_err(|e| Error::Rpc(e.to_string()));
        }
        self.token()
            .balanceOf(who)
            .call()
            .await
            .map_err(contract_error)
    }

    // ---- escrow -------------------------------------------------------------------------------

    /// Deposits `amount` into the free balance.
    pub async fn deposit(&self, amount: U256) -> Result<TxOutcome> {
        let contract = self.settlement();
        let call = contract.deposit(amount);
        let call = if self.is_native() {
            call.value(amount)
        } else {
            call
        };
        Ok(send!(call).0)
    }

    /// Withdraws `amount` of the free balance.
    pub async fn withdraw(&self, amount: U256) -> Result<TxOutcome> {
        Ok(send!(self.settlement().withdraw(amount)).0)
    }

    /// Opens a per-job escrow; returns the job's escrow id.
    pub async fn open_job(
        &self,
        amount: u128,
        deadline_s: u64,
        order_ref: B256,
    ) -> Result<(u64, TxOutcome)> {
        let (out, receipt) = send!(self.settlement().openJob(amount, deadline_s, order_ref));
        let job_id = receipt
            .logs()
            .iter()
            .find_map(|log| log.log_decode::<Settlement::JobOpened>().ok())
            .map(|log| log.inner.data.jobId)
            .ok_or_else(|| Error::Rpc("openJob receipt has no JobOpened event".into()))?;
        Ok((job_id, out))
    }

    /// Reclaims an unsettled escrow after its deadline and grace period.
    pub async fn reclaim(&self, job_id: u64) -> Result<TxOutcome> {
        Ok(send!(self.settlement().reclaim(job_id)).0)
    }

    /// Posts a signed batch.
    pub async fn settle_batch(
        &self,
        batch: &BatchMessage,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        let contract = self.settlement();
        Ok(send!(contract.settleBatch(
            batch.nonce,
            batch.receipts_root,
            batch.balances_root,
            batch.packed_ranges(),
            signature(sig),
        ))
        .0)
    }

    /// Withdraws this account's credits up to `cumulative` with its Merkle proof.
    pub async fn claim(&self, cumulative: U256, proof: Vec<B256>) -> Result<TxOutcome> {
        Ok(send!(self.settlement().claim(cumulative, proof)).0)
    }

    /// Rotates the group key with a signature by the current key.
    pub async fn rotate_group_key(
        &self,
        new_key: EvmGroupKey,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        Ok(send!(
            self.settlement()
                .rotateGroupKey(new_key.x, new_key.parity, signature(sig))
        )
        .0)
    }

    /// The free balance of `who`.
    pub async fn escrow_balance(&self, who: Address) -> Result<U256> {
        self.settlement()
            .balanceOf(who)
            .call()
            .await
            .map_err(contract_error)
    }

    /// What `who` has claimed so far.
    pub async fn claimed(&self, who: Address) -> Result<U256> {
        self.settlement()
            .claimed(who)
            .call()
            .await
            .map_err(contract_error)
    }

    /// Whether escrow `job_id` is still open.
    pub async fn is_open(&self, job_id: u64) -> Result<bool> {
        self.settlement()
            .isOpen(job_id)
            .call()
            .await
            .map_err(contract_error)
    }

    /// Last accepted batch nonce and total escrow settled.
    pub async fn batch_state(&self) -> Result<(u64, U256)> {
        let s = self
            .settlement()
            .batchState()
            .call()
            .await
            .map_err(contract_error)?;
        Ok((s.nonce, U256::from(s.totalSettled)))
    }

    /// The current group key.
    pub async fn group_key(&self) -> Result<OnChainGroupKey> {
        let k = self
            .settlement()
            .groupKey()
            .call()
            .await
            .map_err(contract_error)?;
        Ok(OnChainGroupKey {
            key: EvmGroupKey {
                x: k.x,
                parity: k.parity,
            },
            epoch: k.epoch,
        })
    }

    /// The digest the contract computes for `batch` (a signer can check its own encoding
    /// against the contract before signing).
    pub async fn batch_digest_on_chain(&self, batch: &BatchMessage) -> Result<B256> {
        self.settlement()
            .batchDigest(
                batch.nonce,
                batch.receipts_root,
                batch.balances_root,
                batch.packed_ranges(),
            )
            .call()
            .await
            .map_err(contract_error)
    }

    /// The current cumulative balances root.
    pub async fn balances_root(&self) -> Result<B256> {
        self.settlement()
            .balancesRoot()
            .call()
            .await
            .map_err(contract_error)
    }

    // ---- registry -----------------------------------------------------------------------------

    /// Publishes endpoint and ML-DSA key hash.
    pub async fn set_metadata(&self, endpoint: &str, ml_dsa_key_hash: B256) -> Result<TxOutcome> {
        Ok(send!(
            self.registry()
                .setMetadata(endpoint.to_string(), ml_dsa_key_hash)
        )
        .0)
    }

    /// Adds stake.
    pub async fn stake(&self, amount: U256) -> Result<TxOutcome> {
        let contract = self.registry();
        let call = contract.stake(amount);
        let call = if self.is_native() {
            call.value(amount)
        } else {
            call
        };
        Ok(send!(call).0)
    }

    /// Starts unbonding `amount`.
    pub async fn unbond(&self, amount: U256) -> Result<TxOutcome> {
        Ok(send!(self.registry().unbond(amount)).0)
    }

    /// Withdraws stake whose unbonding delay has passed.
    pub async fn withdraw_unbonded(&self) -> Result<TxOutcome> {
        Ok(send!(self.registry().withdrawUnbonded()).0)
    }

    /// Submits a committee-signed slash.
    pub async fn slash(
        &self,
        provider: Address,
        amount: U256,
        recipient: Address,
        evidence_hash: B256,
        sig: &EvmSignature,
    ) -> Result<TxOutcome> {
        let contract = self.registry();
        Ok(send!(contract.slash(
            provider,
            amount,
            recipient,
            evidence_hash,
            registry_signature(sig)
        ))
        .0)
    }

    /// (staked, unbonding, unlock time) of `provider`.
    pub async fn provider_stake(&self, provider: Address) -> Result<(U256, U256, U256)> {
        let p = self
            .registry()
            .providers(provider)
            .call()
            .await
            .map_err(contract_error)?;
        Ok((p.staked, p.unbonding, p.unlockAt))
    }

    // ---- probe --------------------------------------------------------------------------------

    /// Sends one verification through the gas probe; returns (valid, gas of the verification).
    pub async fn measure_frost_verify(
        &self,
        key: EvmGroupKey,
        message: B256,
        sig: &EvmSignature,
    ) -> Result<(bool, u64)> {
        let probe = self
            .deployment
            .probe
            .ok_or_else(|| Error::Rpc("no gas probe deployed".into()))?;
        let probe = FrostGasProbe::new(probe, self.provider.clone());
        let sig = crate::contracts::probe::FrostVerifier::Signature {
            rX: sig.r_x,
            rY: sig.r_y,
            z: sig.z,
        };
        let (_, receipt) = send!(probe.measure(key.x, key.parity, message, sig));
        let measured = receipt
            .logs()
            .iter()
            .find_map(|log| log.log_decode::<FrostGasProbe::Measured>().ok())
            .ok_or_else(|| Error::Rpc("probe receipt has no Measured event".into()))?;
        let gas =
            u64::try_from(measured.inner.data.gasUsed).map_err(|e| Error::Rpc(e.to_string()))?;
        Ok((measured.inner.data.valid, gas))
    }

    // ---- events -------------------------------------------------------------------------------

    /// Every `BatchSettled` from `from_block` on.
    pub async fn settled_batches(&self, from_block: u64) -> Result<Vec<SettledBatch>> {
        let logs = self
            .settlement()
            .BatchSettled_filter()
            .from_block(from_block)
            .query()
            .await
            .map_err(contract_error)?;
        Ok(logs
            .into_iter()
            .map(|(e, log)| SettledBatch {
                nonce: e.nonce,
                receipts_root: e.receiptsRoot,
                balances_root: e.balancesRoot,
                settled_amount: e.settledAmount,
                tx_hash: log.transaction_hash,
                block_number: log.block_number,
            })
            .collect())
    }

    /// Every `JobOpened` from `from_block` on: (job id, buyer, amount, deadline, order ref).
    pub async fn opened_jobs(&self, from_block: u64) -> Result<Vec<Settlement::JobOpened>> {
        let logs = self
            .settlement()
            .JobOpened_filter()
            .from_block(from_block)
            .query()
            .await
            .map_err(contract_error)?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }

    /// Every `Claimed` from `from_block` on.
    pub async fn claims(&self, from_block: u64) -> Result<Vec<Settlement::Claimed>> {
        let logs = self
            .settlement()
            .Claimed_filter()
            .from_block(from_block)
            .query()
            .await
            .map_err(contract_error)?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }

    /// Every `Slashed` from `from_block` on.
    pub async fn slashes(&self, from_block: u64) -> Result<Vec<ProviderRegistry::Slashed>> {
        let logs = self
            .registry()
            .Slashed_filter()
            .from_block(from_block)
            .query()
            .await
            .map_err(contract_error)?;
        Ok(logs.into_iter().map(|(e, _)| e).collect())
    }

    /// Topic of `BatchSettled` (for log subscriptions elsewhere).
    pub fn batch_settled_topic() -> B256 {
        Settlement::BatchSettled::SIGNATURE_HASH
    }
}
