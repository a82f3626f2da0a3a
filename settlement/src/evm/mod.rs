//! The EVM client: one account's typed calls to one deployment, by concern:
//! [`escrow`] (the asset, deposits, per-job escrows, batches, claims, the group key),
//! [`registry`] (provider stake and metadata, slashing) and [`events`] (what the explorer and a
//! restarted coordinator read back). [`deploy`] creates and verifies a deployment (`cx chain
//! deploy`, the devnet); every other party only calls a deployment that exists.
//!
//! One [`EvmClient`] acts for one account on one chain (the account's key signs locally). Every
//! state-changing call goes through [`sender::Sender`] (measured gas, the chain's fee policy,
//! replacement when stuck), waits for its receipt and returns a [`TxOutcome`] with the gas
//! used; a refusal comes back as [`Error::Reverted`] with the contract's custom error decoded.

pub mod deploy;
pub mod escrow;
pub mod events;
pub mod failover;
pub mod offers;
pub mod registry;
pub mod sender;

use alloy::network::EthereumWallet;
use alloy::primitives::{Address, B256};
use alloy::providers::{DynProvider, Provider, ProviderBuilder};
use alloy::rpc::types::TransactionReceipt;
use alloy::signers::local::PrivateKeySigner;
pub use cx_contracts::Deployment;

use crate::error::{Error, Result};

pub use escrow::OnChainGroupKey;
pub use events::SettledBatch;

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

impl TryFrom<&TransactionReceipt> for TxOutcome {
    type Error = Error;

    fn try_from(receipt: &TransactionReceipt) -> Result<Self> {
        if !receipt.status() {
            return Err(Error::TxFailed {
                tx_hash: receipt.transaction_hash,
            });
        }
        Ok(Self {
            tx_hash: receipt.transaction_hash,
            gas_used: receipt.gas_used,
            block_number: receipt.block_number.unwrap_or_default(),
        })
    }
}

/// Sends a contract call through `$client`'s [`sender::Sender`], waits for the receipt of the
/// offer mined, and returns `(outcome, receipt)`.
macro_rules! send {
    ($client:expr, $call:expr) => {{
        let receipt = $client
            .sender
            .send($call.into_transaction_request())
            .await?;
        ($crate::evm::TxOutcome::try_from(&receipt)?, receipt)
    }};
}
pub(crate) use send;

/// The FROST signature in the form a binding's `FrostVerifier.Signature` takes (each binding
/// module declares its own copy of the struct).
macro_rules! frost_signature {
    ($module:ident, $sig:expr) => {{
        let sig: &$crate::frost::EvmSignature = $sig;
        cx_contracts::$module::FrostVerifier::Signature {
            rX: sig.r_x,
            rY: sig.r_y,
            z: sig.z,
        }
    }};
}
pub(crate) use frost_signature;

/// Parses an RPC URL.
pub fn rpc_url(url: &str) -> Result<alloy::transports::http::reqwest::Url> {
    url.parse().map_err(|e| Error::RpcUrl {
        url: url.to_string(),
        reason: format!("{e}"),
    })
}

/// How long one JSON-RPC request may take. A node that accepts and never answers (hung,
/// stopped, partitioned) must fail its call, not stall settlement on every other chain.
pub const RPC_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The HTTP client every provider here uses: bounded connect and request times.
fn http_client() -> Result<alloy::transports::http::reqwest::Client> {
    alloy::transports::http::reqwest::Client::builder()
        .connect_timeout(std::time::Duration::from_secs(5))
        .timeout(RPC_TIMEOUT)
        .build()
        .map_err(|e| Error::RpcUrl {
            url: String::new(),
            reason: format!("HTTP client: {e}"),
        })
}

/// The JSON-RPC client of a chain's `urls`: one URL directly; several through
/// [`failover::Failover`] (in order, the next when one fails at the transport).
fn rpc_client(urls: &[&str]) -> Result<alloy::rpc::client::RpcClient> {
    use alloy::transports::http::Http;
    let client = http_client()?;
    let mut transports = urls
        .iter()
        .map(|u| Ok(Http::with_client(client.clone(), rpc_url(u)?)))
        .collect::<Result<Vec<_>>>()?;
    let local = urls.iter().all(alloy::transports::utils::guess_local_url);
    Ok(match transports.len() {
        0 => {
            return Err(Error::RpcUrl {
                url: String::new(),
                reason: "no RPC URL".into(),
            });
        }
        1 => alloy::rpc::client::RpcClient::new(transports.remove(0), local),
        _ => alloy::rpc::client::RpcClient::new(failover::Failover::new(transports), local),
    })
}

/// A read-only provider for `url` (reads need no account).
pub fn read_provider(url: &str) -> Result<DynProvider> {
    read_provider_at(&[url])
}

/// A read-only provider for a chain's URLs, failing over in order ([`rpc_client`]).
pub fn read_provider_at(urls: &[&str]) -> Result<DynProvider> {
    Ok(ProviderBuilder::new()
        .connect_client(rpc_client(urls)?)
        .erased())
}

/// Builds a signing provider for `signer` at `url`.
pub fn signing_provider(url: &str, signer: PrivateKeySigner) -> Result<DynProvider> {
    signing_provider_at(&[url], signer)
}

/// A signing provider for `signer` over a chain's URLs, failing over in order.
pub fn signing_provider_at(urls: &[&str], signer: PrivateKeySigner) -> Result<DynProvider> {
    // Simple (not cached) nonces: the cached manager counts a nonce when it fills one, so a call
    // refused at gas estimation would leave a gap and every later transaction pending forever.
    // (Transactions of an [`EvmClient`] set their nonce and fees in [`sender::Sender`]; the
    // fillers serve calls made on the provider directly.)
    Ok(ProviderBuilder::new()
        .disable_recommended_fillers()
        .with_gas_estimation()
        .with_simple_nonce_management()
        .fetch_chain_id()
        .wallet(EthereumWallet::from(signer))
        .connect_client(rpc_client(urls)?)
        .erased())
}

/// One account's view of one deployment.
#[derive(Clone, Debug)]
pub struct EvmClient {
    provider: DynProvider,
    account: Address,
    deployment: Deployment,
    sender: sender::Sender,
}

impl EvmClient {
    /// A client acting as `signer` on the deployment at `rpc_url`.
    pub fn connect(
        rpc_url: &str,
        signer: PrivateKeySigner,
        deployment: Deployment,
    ) -> Result<Self> {
        Self::connect_at(&[rpc_url], signer, deployment)
    }

    /// A client acting as `signer` on the deployment of a chain with several RPC URLs, the
    /// first tried first.
    pub fn connect_at(
        urls: &[&str],
        signer: PrivateKeySigner,
        deployment: Deployment,
    ) -> Result<Self> {
        let account = signer.address();
        let provider = signing_provider_at(urls, signer)?;
        Ok(Self {
            sender: sender::Sender::new(
                provider.clone(),
                urls.first().copied().unwrap_or_default(),
                account,
                cx_contracts::FeePolicy::default(),
            ),
            provider,
            account,
            deployment,
        })
    }

    /// The client of `entry`'s chain: its RPC URLs in order, gas paid by its fee policy.
    pub fn for_chain(
        entry: &cx_contracts::ChainDeployment,
        signer: PrivateKeySigner,
    ) -> Result<Self> {
        let urls: Vec<&str> = entry.chain.rpc_urls().collect();
        Ok(Self::connect_at(&urls, signer, entry.deployment)?.with_fees(entry.chain.fees))
    }

    /// This client paying gas by `policy` (default: [`cx_contracts::FeePolicy::default`]).
    pub fn with_fees(mut self, policy: cx_contracts::FeePolicy) -> Self {
        self.sender = self.sender.with_policy(policy);
        self
    }

    /// This client keeping its transaction offers in `book` (the exchange's posting account:
    /// its nonces survive a restart).
    pub fn with_book(mut self, book: offers::OfferBook) -> Self {
        self.sender = self.sender.with_book(book);
        self
    }

    /// The account this client signs for.
    pub fn account(&self) -> Address {
        self.account
    }

    /// The deployment.
    pub fn deployment(&self) -> Deployment {
        self.deployment
    }

    /// The underlying provider (for raw RPC such as Anvil's time travel, or contracts outside
    /// this client such as the devnet's test stablecoin and gas probe).
    pub fn provider(&self) -> &DynProvider {
        &self.provider
    }

    fn settlement(&self) -> cx_contracts::Settlement::SettlementInstance<DynProvider> {
        cx_contracts::Settlement::new(self.deployment.settlement, self.provider.clone())
    }

    fn registry(&self) -> cx_contracts::ProviderRegistry::ProviderRegistryInstance<DynProvider> {
        cx_contracts::ProviderRegistry::new(self.deployment.registry, self.provider.clone())
    }

    /// Current block number.
    pub async fn block_number(&self) -> Result<u64> {
        Ok(self.provider.get_block_number().await?)
    }
}
