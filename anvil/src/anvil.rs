//! Anvil chains started from the project-local install.
//!
//! Anvil comes from `.tools/` (installed by `scripts/setup-foundry.sh`; override with
//! `CX_ANVIL`). Accounts are Anvil's deterministic ones (the default test mnemonic); their keys
//! are read from the file Anvil writes with `--config-out`, not hard-coded here.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use alloy::providers::Provider;
use alloy::signers::local::PrivateKeySigner;
use cx_contracts::{ChainEntry, ChainKind};
use cx_settlement::evm::read_provider;

use crate::error::{Error, Result};
use crate::supervise::{ScratchDir, Supervised, free_port};

/// The workspace root (the default place of `.tools/` and `runtime/`): this crate is `anvil/`,
/// one level below it.
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("anvil/ has a parent")
        .to_path_buf()
}

/// The Anvil binary: `CX_ANVIL`, else `.tools/anvil` in the workspace.
pub fn anvil_binary() -> PathBuf {
    std::env::var_os("CX_ANVIL")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace_root().join(".tools/anvil"))
}

/// A running Anvil process, killed on drop.
pub struct AnvilInstance {
    process: Supervised,
    /// Chain id.
    pub chain_id: u64,
    /// Port on 127.0.0.1.
    pub port: u16,
    accounts: u32,
    /// Seconds between blocks; `None`: a block per transaction (automine).
    pub block_time_s: Option<u64>,
    /// Deterministic funded accounts (Anvil's test mnemonic), in order.
    pub keys: Vec<PrivateKeySigner>,
    _config_dir: ScratchDir,
}

impl std::fmt::Debug for AnvilInstance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AnvilInstance")
            .field("chain_id", &self.chain_id)
            .field("port", &self.port)
            .finish()
    }
}

fn read_keys(config: &Path) -> Result<Option<Vec<PrivateKeySigner>>> {
    // The file appears in pieces: until it parses, it is not written yet.
    let Ok(text) = std::fs::read_to_string(config) else {
        return Ok(None);
    };
    let Ok(value) = serde_json::from_str::<serde_json::Value>(&text) else {
        return Ok(None);
    };
    let bad = |reason: String| Error::AnvilConfig {
        path: config.to_path_buf(),
        reason,
    };
    let keys = value["private_keys"]
        .as_array()
        .ok_or_else(|| bad("no private_keys".into()))?;
    keys.iter()
        .map(|k| {
            k.as_str()
                .unwrap_or_default()
                .parse::<PrivateKeySigner>()
                .map_err(|e| bad(format!("bad key: {e}")))
        })
        .collect::<Result<_>>()
        .map(Some)
}

/// Starts Anvil in `dir` (its config, log and state file there) and waits until it answers;
/// with `load`, from the state a previous run wrote on exit. Every run writes its state on a
/// graceful exit (SIGTERM); a SIGKILL (every drop) writes nothing.
fn launch(
    chain_id: u64,
    port: u16,
    accounts: u32,
    block_time_s: Option<u64>,
    dir: &Path,
    load: bool,
) -> Result<(Supervised, Vec<PrivateKeySigner>)> {
    let config = dir.join("anvil.json");
    let state = dir.join("state.json");
    if load {
        // A fresh config file, so that readiness waits for this run's.
        let _ = std::fs::remove_file(&config);
    }
    let mut command = Command::new(anvil_binary());
    command
        .args(["--host", "127.0.0.1", "--port", &port.to_string()])
        .args(["--chain-id", &chain_id.to_string()])
        .args(["--accounts", &accounts.to_string(), "--balance", "1000000"])
        .arg("--config-out")
        .arg(&config)
        .arg("--dump-state")
        .arg(&state);
    if load {
        command.arg("--load-state").arg(&state);
    }
    if let Some(seconds) = block_time_s {
        // A block every `seconds` whatever arrives, as on a real network: transactions wait
        // in the pool, and a fee under the base fee is not mined.
        command.args(["--block-time", &seconds.to_string()]);
    }
    let mut process = Supervised::spawn(
        format!("anvil (chain {chain_id}, port {port})"),
        command,
        Some(&dir.join("anvil.log")),
        " (run scripts/setup-foundry.sh to install Anvil into .tools/, or set CX_ANVIL)",
    )?;
    let mut keys = None;
    let mut failure = None;
    process.wait_ready(
        SocketAddr::from(([127, 0, 0, 1], port)),
        Duration::from_secs(60),
        Duration::from_millis(50),
        || match read_keys(&config) {
            Ok(Some(k)) => {
                keys = Some(k);
                true
            }
            Ok(None) => false,
            Err(e) => {
                failure = Some(e);
                true
            }
        },
    )?;
    if let Some(e) = failure {
        return Err(e);
    }
    Ok((process, keys.unwrap_or_default()))
}

impl AnvilInstance {
    /// Starts Anvil with `chain_id` on `port` (a free one when `None`) and `accounts` funded
    /// accounts, and waits until it answers.
    pub fn spawn(chain_id: u64, port: Option<u16>, accounts: u32) -> Result<Self> {
        Self::spawn_in(chain_id, port, accounts, None, None)
    }

    /// [`AnvilInstance::spawn`] mining a block every `block_time_s` seconds instead of one per
    /// transaction.
    pub fn spawn_with_block_time(chain_id: u64, accounts: u32, block_time_s: u64) -> Result<Self> {
        Self::spawn_in(chain_id, None, accounts, Some(block_time_s), None)
    }

    /// [`AnvilInstance::spawn`] with its config and log (`anvil.json`, `anvil.log`) in `dir`,
    /// kept after it stops (the devnet's `runtime/devnet/chain-<id>/`); a scratch folder when
    /// `None`; a block every `block_time_s` seconds when given (automine when `None`).
    pub fn spawn_in(
        chain_id: u64,
        port: Option<u16>,
        accounts: u32,
        block_time_s: Option<u64>,
        dir: Option<&Path>,
    ) -> Result<Self> {
        let port = match port {
            Some(p) => p,
            None => free_port()?,
        };
        let dir = match dir {
            Some(path) => ScratchDir::kept(path)?,
            None => ScratchDir::new("cx-anvil")?,
        };
        let (process, keys) = launch(chain_id, port, accounts, block_time_s, &dir.path, false)?;
        Ok(Self {
            process,
            chain_id,
            port,
            accounts,
            block_time_s,
            keys,
            _config_dir: dir,
        })
    }

    /// Stops the node the way an operator does (SIGTERM): it writes its state (accounts,
    /// contracts, every block and transaction) to its folder and exits. Until
    /// [`AnvilInstance::start_again`], calls to its URL are refused.
    pub fn shut_down(&mut self) -> Result<()> {
        self.process.terminate(Duration::from_secs(30))
    }

    /// Starts the node again on the same port from the state [`AnvilInstance::shut_down`]
    /// wrote: the same chain, blocks and hashes, as a restarted node that kept its database.
    pub fn start_again(&mut self) -> Result<()> {
        let (process, _) = launch(
            self.chain_id,
            self.port,
            self.accounts,
            self.block_time_s,
            &self._config_dir.path,
            true,
        )?;
        self.process = process;
        Ok(())
    }

    /// JSON-RPC URL.
    pub fn rpc_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The registry entry of this chain.
    pub fn entry(&self) -> ChainEntry {
        ChainEntry::new(self.chain_id, self.rpc_url(), ChainKind::Anvil)
    }

    /// Whether the process still runs.
    pub fn is_running(&mut self) -> bool {
        self.process.is_running()
    }

    /// The supervised process (its pid, its resource use).
    pub fn process(&self) -> &Supervised {
        &self.process
    }

    /// Moves the chain's clock forward by `seconds` and mines a block.
    pub async fn advance_time(&self, seconds: u64) -> Result<()> {
        let provider = read_provider(&self.rpc_url())?;
        let _: serde_json::Value = provider
            .raw_request("evm_increaseTime".into(), (seconds,))
            .await?;
        let _: serde_json::Value = provider.raw_request("evm_mine".into(), ()).await?;
        Ok(())
    }

    /// Replaces the newest `depth` blocks with as many empty ones (`anvil_reorg`): the
    /// transactions they held are gone, as after a real reorg that did not re-include them.
    pub async fn reorg(&self, depth: u64) -> Result<()> {
        let provider = read_provider(&self.rpc_url())?;
        let none: Vec<serde_json::Value> = Vec::new();
        let _: serde_json::Value = provider
            .raw_request("anvil_reorg".into(), (depth, none))
            .await?;
        Ok(())
    }

    /// The number of the latest block.
    pub async fn block_number(&self) -> Result<u64> {
        Ok(read_provider(&self.rpc_url())?.get_block_number().await?)
    }

    /// The timestamp of the latest block.
    pub async fn now_s(&self) -> Result<u64> {
        let provider = read_provider(&self.rpc_url())?;
        let block = provider
            .get_block_by_number(alloy::eips::BlockNumberOrTag::Latest)
            .await?
            .ok_or_else(|| Error::Bench("the chain has no latest block"))?;
        Ok(block.header.timestamp)
    }
}
