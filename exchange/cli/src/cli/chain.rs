//! `cx chain deploy`: the contracts onto any EVM chain — a registry file per chain (TOML: RPC
//! URLs, finality, fee policy, asset) or just `--rpc` — from a key in an encrypted JSON keystore
//! (as `cast wallet import` writes it) or in the environment, the code verified on chain, and
//! the chain's entry written into the deployments file every party reads.

use std::path::PathBuf;

use alloy::primitives::U256;
use alloy::signers::local::PrivateKeySigner;
use anyhow::{Context, bail};
use cx_contracts::{AssetSpec, ChainDeployment, ChainEntry, ChainKind, DeploymentsFile};
use cx_settlement::evm::deploy::{DeployParams, deploy};
use cx_settlement::frost::EvmGroupKey;
use serde::Serialize;
use zeroize::Zeroizing;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    /// Deploy Settlement and ProviderRegistry to a chain, verify them, write its entry.
    Deploy(DeployArgs),
}

#[derive(Debug, clap::Args)]
pub(crate) struct DeployArgs {
    /// The chain's registry file (TOML: chain_id, rpc_url, fallback_rpc_urls, kind,
    /// finality_blocks, explorer_url, [asset], [fees]).
    #[arg(
        long,
        value_name = "FILE",
        required_unless_present = "rpc",
        conflicts_with = "rpc"
    )]
    chain: Option<PathBuf>,
    /// The chain's JSON-RPC URL, when there is no registry file (its id is asked of it; the
    /// entry is a public chain with default fees).
    #[arg(long, value_name = "URL")]
    rpc: Option<String>,
    /// Deployer key: an encrypted JSON keystore (`cast wallet import`); its password from
    /// CX_KEYSTORE_PASSWORD or --password-file.
    #[arg(long, value_name = "FILE", conflicts_with = "private_key_env")]
    keystore: Option<PathBuf>,
    /// A file holding the keystore's password (first line).
    #[arg(long, value_name = "FILE", requires = "keystore")]
    password_file: Option<PathBuf>,
    /// Deployer key: the name of an environment variable holding a hex private key.
    #[arg(long, value_name = "VAR")]
    private_key_env: Option<String>,
    /// The committee's group key: its 33-byte compressed point in hex (0x02… or 0x03…).
    #[arg(long, value_name = "HEX")]
    group_key: String,
    /// The settlement asset when the chain file has no [asset]: `native` or `test-token`
    /// (ERC-20s are named in the chain file, with their decimals).
    #[arg(long, value_name = "KIND")]
    asset: Option<AssetArg>,
    /// Seconds after a job's deadline before its buyer may reclaim.
    #[arg(long, default_value_t = 600)]
    grace_period_s: u64,
    /// Smallest positive provider stake, in the asset's smallest unit.
    #[arg(long, default_value = "1000000000")]
    min_stake: U256,
    /// Seconds between a provider's unbond and its withdrawal.
    #[arg(long, default_value_t = 86_400)]
    unbonding_delay_s: u64,
    /// The deployments file to add the chain's entry to (created if missing; an entry of the
    /// same chain id is replaced, the others kept).
    #[arg(long, default_value = "runtime/deployments.json", value_name = "FILE")]
    out: PathBuf,
    /// Print one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Clone, Copy, Debug, clap::ValueEnum)]
enum AssetArg {
    Native,
    TestToken,
}

#[derive(Serialize)]
struct Deployed {
    chain_id: u64,
    rpc_url: String,
    deployer: String,
    settlement: String,
    registry: String,
    asset: String,
    asset_decimals: u8,
    group_key: String,
    out: String,
}

pub(crate) fn run(cmd: Command) -> anyhow::Result<()> {
    match cmd {
        Command::Deploy(args) => deploy_cmd(args),
    }
}

/// The deployer's key, from the keystore or the environment; never printed.
fn deployer(args: &DeployArgs) -> anyhow::Result<PrivateKeySigner> {
    if let Some(path) = &args.keystore {
        let password = match &args.password_file {
            Some(file) => Zeroizing::new(
                std::fs::read_to_string(file)
                    .with_context(|| format!("--password-file {}", file.display()))?
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .to_owned(),
            ),
            None => Zeroizing::new(std::env::var("CX_KEYSTORE_PASSWORD").map_err(|_| {
                anyhow::anyhow!(
                    "--keystore {}: its password is needed in CX_KEYSTORE_PASSWORD or --password-file",
                    path.display()
                )
            })?),
        };
        return PrivateKeySigner::decrypt_keystore(path, password.as_bytes())
            .map_err(|e| anyhow::anyhow!("--keystore {}: cannot decrypt it: {e}", path.display()));
    }
    let Some(var) = &args.private_key_env else {
        bail!("a deployer key is needed: --keystore FILE or --private-key-env VAR");
    };
    let key = Zeroizing::new(
        std::env::var(var)
            .map_err(|_| anyhow::anyhow!("--private-key-env {var}: the variable is not set"))?,
    );
    key.trim()
        .parse()
        .map_err(|_| anyhow::anyhow!("--private-key-env {var}: not a hex private key"))
}

/// The chain's registry entry, from its file or from `--rpc`.
fn entry(args: &DeployArgs) -> anyhow::Result<ChainEntry> {
    match (&args.chain, &args.rpc) {
        (Some(path), _) => Ok(ChainEntry::load_toml(path)?),
        (None, Some(url)) => {
            // Its id is the chain's own answer, read by the deployment (chain_id 0 until then).
            let entry = ChainEntry::new(0, url.clone(), ChainKind::Public);
            entry
                .validate()
                .map_err(|e| anyhow::anyhow!("--rpc: {e}"))?;
            Ok(entry)
        }
        (None, None) => bail!("--chain FILE or --rpc URL is needed"),
    }
}

fn deploy_cmd(args: DeployArgs) -> anyhow::Result<()> {
    let mut chain = entry(&args)?;
    let group_key = EvmGroupKey::from_hex(&args.group_key)
        .map_err(|_| anyhow::anyhow!("--group-key: not a 33-byte compressed secp256k1 point"))?;
    let asset = match (chain.asset, args.asset) {
        (Some(_), Some(_)) => bail!("--asset: the chain file names its [asset] already"),
        (Some(spec), None) => spec,
        (None, Some(AssetArg::Native)) => AssetSpec::Native,
        (None, Some(AssetArg::TestToken)) => AssetSpec::TestToken,
        (None, None) => {
            bail!(
                "the settlement asset: give [asset] in the chain file or --asset native|test-token"
            )
        }
    };
    let signer = deployer(&args)?;
    let deployer = signer.address();
    // An existing file must be one we can add to: read it before spending gas.
    let mut file = if args.out.exists() {
        DeploymentsFile::load(&args.out).with_context(|| format!("--out {}", args.out.display()))?
    } else {
        DeploymentsFile { chains: Vec::new() }
    };
    let params = DeployParams {
        group_key,
        grace_period_s: args.grace_period_s,
        min_stake: args.min_stake,
        unbonding_delay_s: args.unbonding_delay_s,
        asset,
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let deployment = runtime
        .block_on(deploy(&chain.rpc_url, signer, params, chain.fees))
        .with_context(|| format!("deploying to {}", chain.rpc_url))?;
    if chain.chain_id != 0 && chain.chain_id != deployment.chain_id {
        bail!(
            "{} serves chain {}, the chain file says {}",
            chain.rpc_url,
            deployment.chain_id,
            chain.chain_id
        );
    }
    chain.chain_id = deployment.chain_id;
    chain.asset = Some(asset);
    file.chains
        .retain(|c| c.chain.chain_id != deployment.chain_id);
    file.chains.push(ChainDeployment {
        chain: chain.clone(),
        deployment,
    });
    file.write(&args.out)
        .with_context(|| format!("--out {}", args.out.display()))?;
    let report = Deployed {
        chain_id: deployment.chain_id,
        rpc_url: chain.rpc_url.clone(),
        deployer: deployer.to_string(),
        settlement: deployment.settlement.to_string(),
        registry: deployment.registry.to_string(),
        asset: deployment.asset.to_string(),
        asset_decimals: asset.decimals(),
        group_key: group_key.to_hex(),
        out: args.out.display().to_string(),
    };
    let table = format!(
        "chain {} ({}): code verified\n  settlement {}\n  registry   {}\n  asset      {} ({} decimals)\n  deployer   {}\nentry written to {}\n",
        report.chain_id,
        report.rpc_url,
        report.settlement,
        report.registry,
        report.asset,
        report.asset_decimals,
        report.deployer,
        report.out
    );
    super::emit(args.json, &table, &report)
}
