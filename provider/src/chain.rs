//! The provider's own account on each chain it sells on: its stake and ML-DSA key in
//! `ProviderRegistry` (the exchange admits only providers staked at least the registry's minimum
//! under the key their offers are signed with, and the committee pays only receipts signed by
//! the registered key), and its claims on `Settlement` (what settled batches credited it).
//!
//! Straight on the contracts' bindings: the provider talks to the exchange over HTTPS like any
//! third party and to the chain like any wallet; it imports neither the exchange nor the
//! committee.

use std::path::Path;

use alloy::network::EthereumWallet;
use alloy::primitives::{Address, B256, U256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::signers::local::PrivateKeySigner;
use anyhow::{Context, bail};
use cx_contracts::{ChainDeployment, ProviderRegistry, Settlement, TestStablecoin};

/// One account on one chain's deployment.
#[derive(Clone, Debug)]
pub struct Account {
    /// The chain.
    pub chain_id: u64,
    /// The account (the payout address offers name).
    pub address: Address,
    entry: ChainDeployment,
    provider: DynProvider,
}

/// What the registry holds for an account.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Standing {
    /// At stake.
    pub staked: U256,
    /// Unbonding (withdrawable after `unlock_at_s`).
    pub unbonding: U256,
    /// When the unbonding amount unlocks, unix seconds.
    pub unlock_at_s: U256,
    /// The ML-DSA key hash registered.
    pub key_hash: B256,
    /// The registry's minimum stake.
    pub min_stake: U256,
}

/// The secp256k1 key in `path`: one line of hex (`0x` allowed), readable by its owner only.
pub fn read_evm_key(path: &Path) -> anyhow::Result<PrivateKeySigner> {
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(path)
            .with_context(|| format!("--evm-key {}", path.display()))?
            .permissions()
            .mode();
        if mode & 0o077 != 0 {
            bail!(
                "--evm-key {}: readable by others (mode {:o}); chmod 600 it",
                path.display(),
                mode & 0o777
            );
        }
    }
    let text =
        std::fs::read_to_string(path).with_context(|| format!("--evm-key {}", path.display()))?;
    text.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("--evm-key {}: not a hex secp256k1 key", path.display()))
}

impl Account {
    /// `key`'s account on `entry`'s chain.
    pub fn connect(entry: &ChainDeployment, key: PrivateKeySigner) -> anyhow::Result<Self> {
        let address = key.address();
        let url = entry.chain.rpc_url.parse().with_context(|| {
            format!(
                "chain {}: RPC URL {:?}",
                entry.chain.chain_id, entry.chain.rpc_url
            )
        })?;
        let provider = ProviderBuilder::new()
            .disable_recommended_fillers()
            .with_gas_estimation()
            .with_simple_nonce_management()
            .fetch_chain_id()
            .wallet(EthereumWallet::from(key))
            .connect_http(url)
            .erased();
        Ok(Self {
            chain_id: entry.chain.chain_id,
            address,
            entry: entry.clone(),
            provider,
        })
    }

    fn registry(&self) -> ProviderRegistry::ProviderRegistryInstance<DynProvider> {
        ProviderRegistry::new(self.entry.deployment.registry, self.provider.clone())
    }

    fn settlement(&self) -> Settlement::SettlementInstance<DynProvider> {
        Settlement::new(self.entry.deployment.settlement, self.provider.clone())
    }

    /// What the registry holds for this account.
    pub async fn standing(&self) -> anyhow::Result<Standing> {
        let registry = self.registry();
        let p = registry.providers(self.address).call().await?;
        Ok(Standing {
            staked: p.staked,
            unbonding: p.unbonding,
            unlock_at_s: p.unlockAt,
            key_hash: p.mlDsaKeyHash,
            min_stake: registry.minStake().call().await?,
        })
    }

    /// Registers `endpoint` and the ML-DSA key hash `key_hash` (unless already so) and adds
    /// `amount` to the stake; returns the transactions sent.
    pub async fn stake(
        &self,
        amount: U256,
        endpoint: &str,
        key_hash: B256,
    ) -> anyhow::Result<Vec<B256>> {
        let mut sent = Vec::new();
        let before = self.standing().await?;
        let registry = self.registry();
        if before.key_hash != key_hash {
            let receipt = registry
                .setMetadata(endpoint.to_owned(), key_hash)
                .send()
                .await?
                .get_receipt()
                .await?;
            sent.push(checked(
                receipt.status(),
                receipt.transaction_hash,
                "setMetadata",
            )?);
        }
        if amount > U256::ZERO {
            let native = self.entry.deployment.is_native();
            if !native {
                let token = TestStablecoin::new(self.entry.deployment.asset, self.provider.clone());
                let receipt = token
                    .approve(self.entry.deployment.registry, amount)
                    .send()
                    .await?
                    .get_receipt()
                    .await?;
                sent.push(checked(
                    receipt.status(),
                    receipt.transaction_hash,
                    "approve",
                )?);
            }
            let call = registry.stake(amount);
            let call = if native { call.value(amount) } else { call };
            let receipt = call.send().await?.get_receipt().await?;
            sent.push(checked(
                receipt.status(),
                receipt.transaction_hash,
                "stake",
            )?);
        }
        Ok(sent)
    }

    /// Starts unbonding `amount` (withdrawable after the registry's delay).
    pub async fn unbond(&self, amount: U256) -> anyhow::Result<B256> {
        let receipt = self
            .registry()
            .unbond(amount)
            .send()
            .await?
            .get_receipt()
            .await?;
        checked(receipt.status(), receipt.transaction_hash, "unbond")
    }

    /// Withdraws what finished unbonding.
    pub async fn withdraw_unbonded(&self) -> anyhow::Result<B256> {
        let receipt = self
            .registry()
            .withdrawUnbonded()
            .send()
            .await?
            .get_receipt()
            .await?;
        checked(
            receipt.status(),
            receipt.transaction_hash,
            "withdrawUnbonded",
        )
    }

    /// What this account already claimed on `Settlement`.
    pub async fn claimed(&self) -> anyhow::Result<U256> {
        Ok(self.settlement().claimed(self.address).call().await?)
    }

    /// Claims `cumulative` (its leaf in the balances root) with `proof`; returns the
    /// transaction.
    pub async fn claim(&self, cumulative: U256, proof: Vec<B256>) -> anyhow::Result<B256> {
        let receipt = self
            .settlement()
            .claim(cumulative, proof)
            .send()
            .await?
            .get_receipt()
            .await?;
        checked(receipt.status(), receipt.transaction_hash, "claim")
    }

    /// The native balance of this account (gas, and the asset on a native deployment).
    pub async fn native_balance(&self) -> anyhow::Result<U256> {
        Ok(self.provider.get_balance(self.address).await?)
    }
}

fn checked(ok: bool, tx: B256, what: &str) -> anyhow::Result<B256> {
    if !ok {
        bail!("{what} reverted (tx {tx})");
    }
    Ok(tx)
}

/// Where the provider's account lives: its key and the chains.
#[derive(Clone, Debug, clap::Args)]
pub struct ChainOpts {
    /// The account's secp256k1 key (one line of hex, mode 0600): its address is the payout
    /// account offers name.
    #[arg(long, env = "CX_PROVIDER_EVM_KEY", value_name = "FILE")]
    pub evm_key: std::path::PathBuf,
    /// The chains and their contracts.
    #[arg(long, value_name = "FILE", default_value = "runtime/deployments.json")]
    pub deployments: std::path::PathBuf,
    /// Only these chains [default: every chain in --deployments].
    #[arg(long = "chain", value_name = "ID")]
    pub chains: Vec<u64>,
}

impl ChainOpts {
    /// The account on each chain chosen.
    pub fn accounts(&self) -> anyhow::Result<Vec<Account>> {
        let key = read_evm_key(&self.evm_key)?;
        let file = cx_contracts::DeploymentsFile::load(&self.deployments)
            .with_context(|| format!("--deployments {}", self.deployments.display()))?;
        for id in &self.chains {
            if file.chain(*id).is_none() {
                bail!("--chain {id}: not in {}", self.deployments.display());
            }
        }
        let chosen: Vec<&ChainDeployment> = file
            .chains
            .iter()
            .filter(|c| self.chains.is_empty() || self.chains.contains(&c.chain.chain_id))
            .collect();
        if chosen.is_empty() {
            bail!("{}: no chain deployed", self.deployments.display());
        }
        chosen
            .into_iter()
            .map(|c| Account::connect(c, key.clone()))
            .collect()
    }
}

/// Parses an amount of wei (a decimal integer).
pub fn parse_wei(text: &str) -> Result<U256, String> {
    text.parse::<U256>()
        .map_err(|_| "an amount of wei: a decimal integer".to_owned())
}

/// `cx-provider stake`: registers the key and stakes `amount` on every chain chosen.
pub async fn run_stake(
    opts: &ChainOpts,
    amount: U256,
    key_hash: B256,
    endpoint: &str,
) -> anyhow::Result<()> {
    for account in opts.accounts()? {
        let at = format!("chain {} as {}", account.chain_id, account.address);
        let sent = account
            .stake(amount, endpoint, key_hash)
            .await
            .with_context(|| format!("staking on {at}"))?;
        let s = account.standing().await?;
        println!(
            "{at}: staked {} wei (minimum {}), key {}, {} transactions",
            s.staked,
            s.min_stake,
            s.key_hash,
            sent.len()
        );
    }
    Ok(())
}

/// `cx-provider unbond`: starts unbonding `amount` on every chain chosen.
pub async fn run_unbond(opts: &ChainOpts, amount: U256) -> anyhow::Result<()> {
    for account in opts.accounts()? {
        let at = format!("chain {} as {}", account.chain_id, account.address);
        let tx = account
            .unbond(amount)
            .await
            .with_context(|| format!("unbonding on {at}"))?;
        let s = account.standing().await?;
        println!(
            "{at}: unbonding {} wei, withdrawable at {} (tx {tx}); {} wei still staked",
            s.unbonding, s.unlock_at_s, s.staked
        );
    }
    Ok(())
}

/// `cx-provider withdraw`: withdraws what finished unbonding on every chain chosen.
pub async fn run_withdraw(opts: &ChainOpts) -> anyhow::Result<()> {
    for account in opts.accounts()? {
        let at = format!("chain {} as {}", account.chain_id, account.address);
        let s = account.standing().await?;
        let tx = account
            .withdraw_unbonded()
            .await
            .with_context(|| format!("withdrawing on {at}"))?;
        println!("{at}: withdrew {} wei (tx {tx})", s.unbonding);
    }
    Ok(())
}

/// `cx-provider claim`: withdraws, on every chain chosen, what settled batches credited the
/// account, with the exchange's Merkle proof.
pub async fn run_claim(opts: &ChainOpts, exchange: &str, ca: Option<&Path>) -> anyhow::Result<()> {
    let mut claimed_any = false;
    for account in opts.accounts()? {
        let at = format!("chain {} as {}", account.chain_id, account.address);
        let Some(claim) =
            crate::exchange_link::fetch_claim(exchange, ca, account.chain_id, account.address)
                .await
                .with_context(|| format!("asking {exchange} for the claim on {at}"))?
        else {
            println!("{at}: nothing credited yet");
            continue;
        };
        let cumulative: U256 = claim
            .cumulative_wei
            .parse()
            .with_context(|| format!("the exchange's cumulative_wei {:?}", claim.cumulative_wei))?;
        let already = account.claimed().await?;
        if cumulative <= already {
            println!("{at}: nothing to claim (credited {cumulative} wei, claimed {already})");
            continue;
        }
        let tx = account
            .claim(cumulative, claim.proof)
            .await
            .with_context(|| format!("claiming on {at}"))?;
        println!("{at}: claimed {} wei (tx {tx})", cumulative - already);
        claimed_any = true;
    }
    if !claimed_any {
        bail!("nothing to claim on any chain");
    }
    Ok(())
}
