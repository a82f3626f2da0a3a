//! A market on one chain, each party its own process: Anvil with the contracts, `cx serve`, and
//! staked `cx-provider`s on a generated model.

use super::process::{Killed, Serve, run};
use super::{CATALOG, MODEL, path, strings};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Anvil (chain 31337, `accounts` funded keys) with the contracts deployed under `group_key`
/// (native asset, minimum stake 1 wei), and `dir/deployments.json` naming it.
pub struct Chain {
    /// The chain.
    pub anvil: crate::AnvilInstance,
    /// Its contracts.
    pub deployment: cx_contracts::Deployment,
    /// The deployments file naming it.
    pub deployments: PathBuf,
}

/// Starts and deploys a [`Chain`] (`grace_period_s`: the contracts' reclaim grace period).
pub async fn deploy_chain(
    dir: &Path,
    accounts: u32,
    group_key: cx_settlement::frost::EvmGroupKey,
    grace_period_s: u64,
) -> Chain {
    try_deploy_chain(dir, accounts, group_key, grace_period_s)
        .await
        .expect("anvil and the contracts (scripts/setup-foundry.sh)")
}

/// [`deploy_chain`] that says what failed instead of panicking (for the benches).
pub async fn try_deploy_chain(
    dir: &Path,
    accounts: u32,
    group_key: cx_settlement::frost::EvmGroupKey,
    grace_period_s: u64,
) -> crate::Result<Chain> {
    let anvil = crate::AnvilInstance::spawn(31337, None, accounts)?;
    let params = crate::deploy::DeployParams {
        group_key,
        grace_period_s,
        min_stake: alloy::primitives::U256::from(1u64),
        unbonding_delay_s: 60,
        asset: cx_contracts::AssetSpec::Native,
    };
    let deployment = crate::deploy::deploy(&anvil.rpc_url(), anvil.keys[0].clone(), params).await?;
    let deployments = dir.join("deployments.json");
    cx_contracts::DeploymentsFile {
        chains: vec![cx_contracts::ChainDeployment {
            chain: anvil.entry(),
            deployment,
        }],
    }
    .write(&deployments)?;
    Ok(Chain {
        anvil,
        deployment,
        deployments,
    })
}

/// A running `cx serve` and what it printed: its URL, its CA and the key hash it signs with.
pub struct Exchange {
    /// `https://127.0.0.1:<port>`.
    pub url: String,
    /// Its CA's certificate (PEM).
    pub ca: PathBuf,
    /// The hash of the ML-DSA key it signs assignments with (hex, no `0x`).
    pub key_hash: String,
    /// The process.
    pub serve: Serve,
}

/// `cx serve` on a free port with the tiny catalog, its CA under `dir/ca`, the chains of
/// `deployments`, a 60 s settle margin, and `extra` flags.
pub async fn start_exchange(
    dir: &Path,
    deployments: &Path,
    database_url: &str,
    extra: &[&str],
) -> Exchange {
    let listen = format!("127.0.0.1:{}", crate::free_port().unwrap());
    start_exchange_on(&listen, dir, deployments, database_url, extra).await
}

/// [`start_exchange`] listening on `listen`: a restart on the same address (and `dir`, so the
/// same CA) is the exchange its providers and agents already know.
pub async fn start_exchange_on(
    listen: &str,
    dir: &Path,
    deployments: &Path,
    database_url: &str,
    extra: &[&str],
) -> Exchange {
    let serve = spawn_exchange_on(listen, dir, deployments, database_url, extra);
    exchange_ready(serve).await
}

/// The `cx serve` of [`start_exchange_on`], not waited for (a standby prints its URL only once
/// it holds the database's writer lease).
pub fn spawn_exchange_on(
    listen: &str,
    dir: &Path,
    deployments: &Path,
    database_url: &str,
    extra: &[&str],
) -> Serve {
    // A test that wrote its own catalog there keeps it (and a restart keeps the first one).
    let catalog = dir.join("catalog.toml");
    if !catalog.exists() {
        std::fs::write(&catalog, CATALOG).unwrap();
    }
    let mut args = strings(&[
        "--listen",
        listen,
        "--ca-dir",
        path(&dir.join("ca")),
        "--deployments",
        path(deployments),
        "--catalog",
        path(&catalog),
        "--settle-margin-s",
        "60",
    ]);
    args.extend(strings(extra));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Serve::start(&args, database_url)
}

/// Waits until `serve` listens, and reads what a test needs of it.
pub async fn exchange_ready(mut serve: Serve) -> Exchange {
    tokio::task::spawn_blocking(move || {
        let url = serve.field("url");
        let ca = PathBuf::from(serve.field("ca"));
        // `identity   <key hash> (<file>; signs assignments)`: the key providers pin.
        let identity = serve.field("identity");
        let key_hash = identity.split_whitespace().next().unwrap().to_owned();
        Exchange {
            url,
            ca,
            key_hash,
            serve,
        }
    })
    .await
    .unwrap()
}

/// `cx-provider gen-model` of the tiny catalog's shape (hidden 64, 2 layers) into `dir/model`.
pub fn gen_model(bin: &Path, dir: &Path) -> PathBuf {
    let model = dir.join("model");
    gen_model_at(bin, &model, crate::devnet::MODEL_SEED);
    model
}

/// [`gen_model`]'s shape with other weights (`seed`) into `out`: another base of the same shape,
/// as `cx devnet --bases` makes them.
pub fn gen_model_at(bin: &Path, out: &Path, seed: &str) {
    let run = run(bin, &crate::devnet::gen_model_seeded(path(out), seed), "");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
}

/// Writes `key` (an Anvil account's) to a 0600 file, as `cx-provider --evm-key` reads it.
pub fn write_evm_key(path: &Path, key: &alloy::signers::local::PrivateKeySigner) {
    use std::os::unix::fs::PermissionsExt;
    let hex = alloy::primitives::B256::from(key.to_bytes()).to_string();
    std::fs::write(path, format!("{hex}\n")).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// `cx-provider stake`: registers `identity`'s key for the account in `evm_key` and stakes
/// 1,000 wei on every chain of `deployments`.
pub fn stake_provider(bin: &Path, evm_key: &Path, deployments: &Path, identity: &Path) {
    let out = run(
        bin,
        &[
            "stake",
            "--evm-key",
            path(evm_key),
            "--deployments",
            path(deployments),
            "--amount",
            "1000",
            "--identity",
            path(identity),
        ],
        "",
    );
    assert!(
        out.status.success(),
        "cx-provider stake: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// `cx-provider serve --exchange …` staked under a fresh identity paid to `evm_key`'s account.
#[allow(clippy::too_many_arguments)]
pub fn start_provider(
    bin: &Path,
    dir: &Path,
    name: &str,
    model_dir: &Path,
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Killed {
    Killed(
        provider_command(
            bin,
            dir,
            name,
            model_dir,
            exchange,
            deployments,
            key,
            ask_wei_per_s,
            extra,
        )
        .spawn()
        .expect("cx-provider runs"),
    )
}

/// [`start_provider`]'s command, staked and ready to spawn (for a test that sets its
/// environment).
#[allow(clippy::too_many_arguments)]
pub fn provider_command(
    bin: &Path,
    dir: &Path,
    name: &str,
    model_dir: &Path,
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Command {
    serving_command(
        bin,
        dir,
        name,
        (model_dir, MODEL),
        exchange,
        deployments,
        key,
        ask_wei_per_s,
        extra,
    )
}

/// [`provider_command`] for the catalog model `model.1` served from the directory `model.0`.
#[allow(clippy::too_many_arguments)]
pub fn serving_command(
    bin: &Path,
    dir: &Path,
    name: &str,
    model: (&Path, &str),
    exchange: &Exchange,
    deployments: &Path,
    key: &alloy::signers::local::PrivateKeySigner,
    ask_wei_per_s: &str,
    extra: &[&str],
) -> Command {
    let (model_dir, model_name) = model;
    let identity = dir.join(format!("{name}.key"));
    let out = run(bin, &["keygen", "--out", path(&identity)], "");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let evm_key = dir.join(format!("{name}-evm.key"));
    write_evm_key(&evm_key, key);
    stake_provider(bin, &evm_key, deployments, &identity);
    let mut command = Command::new(bin);
    command
        .args(["serve", "--model", path(model_dir)])
        .args(["--port", &crate::free_port().unwrap().to_string()])
        .args(["--served-model-name", model_name, "--threads", "1"])
        .args([
            "--exchange",
            &exchange.url,
            "--exchange-ca",
            path(&exchange.ca),
        ])
        .args(["--exchange-key-hash", &format!("0x{}", exchange.key_hash)])
        .args(["--identity", path(&identity)])
        .args(["--payout", &key.address().to_string(), "--operator", name])
        .args(["--ask-wei-per-s", ask_wei_per_s, "--bundle-id", name])
        .args(["--model-name", model_name])
        .args([
            "--fetched-adapters",
            path(&dir.join(format!("{name}-fetched"))),
        ])
        .args(extra)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit());
    command
}

/// Waits until the exchange lists bundle `id`.
pub async fn registered(client: &cx_client::Client, id: &str) {
    let waited = Instant::now();
    loop {
        if let Ok(bundles) = client.providers().await
            && bundles.iter().any(|b| b.id == id)
        {
            return;
        }
        assert!(
            waited.elapsed() < Duration::from_secs(90),
            "bundle {id} never registered"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
