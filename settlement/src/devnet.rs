//! The local devnet: Anvil chains started from the project-local install, the chain registry,
//! and deployment of every contract to every chain.
//!
//! Anvil comes from `.tools/` (installed by `scripts/setup-foundry.sh`; override with
//! `CX_ANVIL`). Accounts are Anvil's deterministic ones (the default test mnemonic); their keys
//! are read from the file Anvil writes with `--config-out`, not hard-coded here.
//! The chain registry (`anvil/chains.json`) lists each chain's id and RPC URL; deployment writes
//! the addresses to a runtime folder git ignores (`runtime/deployments.json` by default).

use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use alloy::primitives::U256;
use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use serde::{Deserialize, Serialize};

use crate::client::{DeployParams, Deployment, EvmClient, signing_provider};
use crate::error::{Error, Result};

/// The workspace root this crate was built in (the default place of `.tools/` and `runtime/`).
pub fn workspace_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The Anvil binary: `CX_ANVIL`, else `.tools/anvil` in the workspace.
pub fn anvil_binary() -> PathBuf {
    std::env::var_os("CX_ANVIL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools/anvil"))
}

/// One chain of the registry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainEntry {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// JSON-RPC URL.
    pub rpc_url: String,
}

/// The chain registry file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainRegistry {
    /// Chains, in order.
    pub chains: Vec<ChainEntry>,
}

impl ChainRegistry {
    /// Reads a registry file.
    pub fn load(path: &Path) -> Result<Self> {
        Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
    }
}

/// One chain's deployment, as written to the runtime folder.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainDeployment {
    /// Chain id and RPC URL.
    #[serde(flatten)]
    pub chain: ChainEntry,
    /// Contract addresses.
    pub deployment: Deployment,
}

/// Writes deployments as JSON, creating the folder.
pub fn write_deployments(path: &Path, deployments: &[ChainDeployment]) -> Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    std::fs::write(
        path,
        serde_json::to_string_pretty(&serde_json::json!({ "chains": deployments }))? + "\n",
    )?;
    Ok(())
}

/// A running Anvil process, killed on drop.
pub struct AnvilInstance {
    child: Child,
    /// Chain id.
    pub chain_id: u64,
    /// Port on 127.0.0.1.
    pub port: u16,
    /// Deterministic funded accounts (Anvil's test mnemonic), in order.
    pub keys: Vec<PrivateKeySigner>,
    _config_dir: TempDir,
}

impl std::fmt::Debug for AnvilInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnvilInstance")
            .field("chain_id", &self.chain_id)
            .field("port", &self.port)
            .finish()
    }
}

impl AnvilInstance {
    /// Starts Anvil with `chain_id` on `port` (a free one when `None`) and `accounts` funded
    /// accounts, and waits until it answers.
    pub fn spawn(chain_id: u64, port: Option<u16>, accounts: u32) -> Result<Self> {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let dir = TempDir::new("cx-anvil")?;
        let config = dir.path.join("anvil.json");
        let bin = anvil_binary();
        let child = Command::new(&bin)
            .args([
                "--host",
                "127.0.0.1",
                "--port",
                &port.to_string(),
                "--chain-id",
                &chain_id.to_string(),
            ])
            .args(["--accounts", &accounts.to_string(), "--balance", "1000000"])
            .arg("--config-out")
            .arg(&config)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| Error::Devnet(format!("cannot start {}: {e}", bin.display())))?;
        let mut instance = Self {
            child,
            chain_id,
            port,
            keys: Vec::new(),
            _config_dir: dir,
        };
        instance.wait_ready(&config)?;
        Ok(instance)
    }

    fn wait_ready(&mut self, config: &Path) -> Result<()> {
        // Readiness, not timing: poll until the port accepts and the config file is complete;
        // give up after a generous bound so a broken install fails instead of hanging.
        let start = Instant::now();
        let addr = SocketAddr::from(([127, 0, 0, 1], self.port));
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Err(Error::Devnet(format!(
                    "anvil exited early ({status}); is port {} in use?",
                    self.port
                )));
            }
            if TcpStream::connect_timeout(&addr, Duration::from_millis(100)).is_ok()
                && let Ok(text) = std::fs::read_to_string(config)
                && let Ok(value) = serde_json::from_str::<serde_json::Value>(&text)
            {
                let keys = value["private_keys"]
                    .as_array()
                    .ok_or_else(|| Error::Devnet("anvil config has no private_keys".into()))?;
                self.keys = keys
                    .iter()
                    .map(|k| {
                        k.as_str()
                            .unwrap_or_default()
                            .parse::<PrivateKeySigner>()
                            .map_err(|e| Error::Devnet(format!("bad key in anvil config: {e}")))
                    })
                    .collect::<Result<_>>()?;
                return Ok(());
            }
            if start.elapsed() > Duration::from_secs(60) {
                return Err(Error::Devnet(
                    "anvil did not become ready within 60 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// JSON-RPC URL.
    pub fn rpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The registry entry of this chain.
    pub fn entry(&self) -> ChainEntry {
        ChainEntry {
            chain_id: self.chain_id,
            rpc_url: self.rpc_url(),
        }
    }

    /// Moves the chain's clock forward by `seconds` and mines a block.
    pub async fn advance_time(&self, seconds: u64) -> Result<()> {
        let provider = signing_provider(&self.rpc_url(), self.keys[0].clone())?;
        let _: serde_json::Value = provider
            .raw_request("evm_increaseTime".into(), (seconds,))
            .await
            .map_err(|e| Error::Rpc(e.to_string()))?;
        let _: serde_json::Value = provider
            .raw_request("evm_mine".into(), ())
            .await
            .map_err(|e| Error::Rpc(e.to_string()))?;
        Ok(())
    }

    /// The timestamp of the latest block.
    pub async fn now_s(&self) -> Result<u64> {
        let provider = signing_provider(&self.rpc_url(), self.keys[0].clone())?;
        let block = provider
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await
            .map_err(|e| Error::Rpc(e.to_string()))?
            .ok_or_else(|| Error::Rpc("no latest block".into()))?;
        Ok(block.header.timestamp)
    }
}

impl Drop for AnvilInstance {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A free TCP port on 127.0.0.1 (bound then released; Anvil binds it right after).
pub fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

/// A temporary folder removed on drop.
struct TempDir {
    path: PathBuf,
}

impl TempDir {
    fn new(prefix: &str) -> Result<Self> {
        let unique = format!(
            "{prefix}-{}-{}",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0)
        );
        let path = std::env::temp_dir().join(unique);
        std::fs::create_dir_all(&path)?;
        Ok(Self { path })
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}

/// Devnet defaults for a deployment (grace 10 minutes, minimum stake 1,000 test USD, unbonding
/// one day, the test stablecoin as asset).
pub fn devnet_params(group_key: crate::frost::EvmGroupKey) -> DeployParams {
    DeployParams {
        group_key,
        grace_period_s: 600,
        min_stake: U256::from(1_000_000_000u64),
        unbonding_delay_s: 86_400,
        native: false,
        with_probe: false,
    }
}

/// Deploys every contract to every chain of `registry` from `deployer`, returning the addresses.
pub async fn deploy_all(
    registry: &ChainRegistry,
    deployer: &PrivateKeySigner,
    params: DeployParams,
) -> Result<Vec<ChainDeployment>> {
    let mut out = Vec::new();
    for chain in &registry.chains {
        let deployment = EvmClient::deploy(&chain.rpc_url, deployer.clone(), params).await?;
        if deployment.chain_id != chain.chain_id {
            return Err(Error::Devnet(format!(
                "registry says chain {} at {} but it reports {}",
                chain.chain_id, chain.rpc_url, deployment.chain_id
            )));
        }
        out.push(ChainDeployment {
            chain: chain.clone(),
            deployment,
        });
    }
    Ok(out)
}
