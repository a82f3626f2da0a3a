//! `cx devnet`: the whole market on this machine, each party its own supervised process.
//!
//! Composition only, in the order the money flows: two Anvil chains (cx-devnet's
//! `AnvilInstance`), a 3-of-5 `cx-signer` committee after a DKG (`Cluster`), the contracts on
//! both chains under the group key (`deploy`), a fresh PostgreSQL database holding that key,
//! `cx serve --settlement` (the exchange and its coordinator), `cx-provider`s staked on both
//! chains on one generated model, and seeded agents (`traffic`) whose closed tabs the `tally`
//! watches settle. Logs and configs land under `--dir` (`runtime/devnet/`); Ctrl-C or SIGTERM
//! stops every child.

mod ports;
mod tally;
mod traffic;

use anyhow::{Context, anyhow, bail};
use cx_client::Client;
use cx_contracts::{ChainDeployment, DeploymentsFile};
use cx_devnet::deploy::{DeployParams, deploy};
use cx_devnet::{AnvilInstance, Cluster, Placement, Supervised, Usage, signer_binary};
use cx_exchange_server::books::Books;
use cx_exchange_server::tls::DevCa;
use cx_protocol::order::{Address, B256, U256};
use cx_protocol::pq::Identity;
use cx_settlement::config::CommitteeRule;
use cx_settlement::coordinator::{PgStore, Store};
use cx_settlement::frost::EvmGroupKey;
use cx_settlement::ledger::Fee;
use indicatif::{ProgressBar, ProgressStyle};
use ports::Ports;
use serde_json::json;
use sqlx::Connection as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tally::{Summary, Tally};
use traffic::{Agent, Market, Side};

/// The devnet's chains: Anvil on 8545 and 8546.
const CHAIN_IDS: [u64; 2] = [31337, 31338];
/// Signers and their threshold: any 3 of 5, spanning at least 3 operators (each its own).
const SIGNERS: u16 = 5;
const THRESHOLD: u16 = 3;
const MIN_OPERATORS: usize = 3;
/// The catalog model every provider serves unless `--model` names a checkpoint (a generated
/// Llama of 0.13 M parameters).
const MODEL: &str = "tiny-llama";
/// Adapters generated and stored at the exchange, and their ranks (cycled).
const ADAPTERS: usize = 50;
const RANKS: &str = "4,8,16,32";
/// The projections the adapters of a `--model` checkpoint target.
const REAL_MODEL_TARGETS: &str = "q_proj,v_proj";
/// Seconds the coordinator keeps before a tab's deadline; the contracts' grace period exceeds
/// its reclaim margin (900 s) plus this.
const SETTLE_MARGIN_S: u64 = 60;
const GRACE_PERIOD_S: u64 = 1_200;
/// Seconds without a fresh offer after which a provider leaves and its jobs are re-cleared:
/// two and a half of the providers' 30 s re-registrations, so one late offer is not a death.
const PROVIDER_SILENCE_S: u64 = 75;

/// The catalog of the generated model every devnet provider serves (tests read the same file).
const CATALOG: &str = include_str!("../../fixtures/tiny-catalog.toml");

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Start the market without the agents' traffic (they are bound, with tabs, and idle).
    #[arg(long, conflicts_with = "exit_after_settled")]
    no_traffic: bool,
    /// Providers to start (1 to 20), each its own process, identity and account.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=20))]
    providers: u16,
    /// Seeded agents sending traffic (1 to 50).
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u16).range(1..=50))]
    agents: u16,
    /// Exit 0 once this many jobs are settled on chain and a batch has landed on each chain,
    /// printing a summary (its JSON last).
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    exit_after_settled: Option<u64>,
    /// Fail --exit-after-settled if it takes longer than this, seconds.
    #[arg(long, default_value_t = 600, value_name = "S")]
    timeout_s: u64,
    /// Added to every port (Anvil 8545 and 8546, exchange 8443, providers 9001.., signers
    /// 9101..): a second devnet beside a running one.
    #[arg(long, env = "CX_DEVNET_PORT_OFFSET", default_value_t = 0, value_name = "N",
          value_parser = clap::value_parser!(u16).range(0..=50_000))]
    port_offset: u16,
    /// Where logs, keys and configs go (emptied at start, but for the CA in ca/).
    #[arg(
        long,
        env = "CX_DEVNET_DIR",
        default_value = "runtime/devnet",
        value_name = "DIR"
    )]
    dir: PathBuf,
    /// The exchange's database: dropped and created afresh at every start (its chains are
    /// fresh too) [default: postgres://postgres@127.0.0.1:5432/cx].
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    database_url: Option<String>,
    /// How the exchange ranks feasible bundles (`cx serve --clearing`): `residency_aware` or
    /// `cheapest_capable`.
    #[arg(long, default_value = "residency_aware")]
    clearing: cx_exchange::clearing::Policy,
    /// Serve this checkpoint (a Hugging Face model directory: config.json, safetensors,
    /// tokenizer.json, its chat template) instead of the generated model: the exchange's catalog
    /// learns it from its config.json (`cx catalog add`), every provider serves it, the adapters
    /// are generated for its shape and the agents' chats get its answers.
    #[arg(long, value_name = "DIR")]
    model: Option<PathBuf>,
    /// The name the checkpoint of --model is served and asked for by (as on the Hub, e.g.
    /// `HuggingFaceTB/SmolLM2-135M-Instruct`) [default: its directory's name].
    #[arg(long, value_name = "NAME", requires = "model")]
    model_name: Option<String>,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Every child lives in `children`, outside the future: whichever way it ends (done, failed,
    // Ctrl-C, SIGTERM), dropping `children` kills each of them, newest first.
    let mut children = Children::default();
    let outcome = runtime.block_on(async {
        tokio::select! {
            done = devnet(&args, &mut children) => done,
            () = super::serve::stop_signal() => {
                eprintln!("cx devnet: stopping");
                Ok(())
            }
        }
    });
    let count = children.count();
    drop(children);
    runtime.shutdown_timeout(Duration::from_secs(2));
    if count > 0 {
        eprintln!("cx devnet: stopped {count} processes");
    }
    outcome
}

/// Every process the devnet started.
#[derive(Default)]
struct Children {
    chains: Vec<AnvilInstance>,
    cluster: Option<Cluster>,
    others: Vec<Supervised>,
}

impl Children {
    fn count(&self) -> usize {
        self.chains.len()
            + self.cluster.as_ref().map_or(0, |c| c.processes().count())
            + self.others.len()
    }

    fn usage(&self) -> Vec<Usage> {
        let mut all: Vec<Usage> = self.others.iter().filter_map(Supervised::usage).collect();
        all.extend(self.chains.iter().filter_map(|c| c.process().usage()));
        if let Some(cluster) = &self.cluster {
            all.extend(cluster.processes().filter_map(Supervised::usage));
        }
        all.extend(Usage::of(std::process::id()));
        all
    }

    /// The first child the market cannot go on without that exited, by name. A provider is not
    /// one: when a provider dies the exchange re-clears or refunds its jobs (SPEC §8), as it
    /// would for a third party's; [`Children::lost_providers`] names it once.
    fn exited(&mut self) -> Option<String> {
        let other = self
            .others
            .iter_mut()
            .find_map(|c| (!is_provider(c.name()) && !c.is_running()).then(|| c.name().to_owned()));
        other.or_else(|| {
            self.chains
                .iter_mut()
                .find_map(|c| (!c.is_running()).then(|| format!("anvil (chain {})", c.chain_id)))
        })
    }
}

impl Children {
    /// Providers that exited since the last call, by name (each named once).
    fn lost_providers(&mut self, reported: &mut std::collections::BTreeSet<String>) -> Vec<String> {
        let mut lost = Vec::new();
        for child in &mut self.others {
            if is_provider(child.name()) && !reported.contains(child.name()) && !child.is_running()
            {
                reported.insert(child.name().to_owned());
                lost.push(child.name().to_owned());
            }
        }
        lost
    }
}

/// Whether a supervised child is one of the devnet's providers (named `provider-N`).
fn is_provider(name: &str) -> bool {
    name.starts_with("provider-")
}

impl Drop for Children {
    fn drop(&mut self) {
        // Clients before servers: providers and the exchange, then signers, then chains.
        while let Some(mut child) = self.others.pop() {
            child.kill();
        }
        self.cluster = None;
        self.chains.clear();
    }
}

/// Progress while it starts: a spinner on a terminal, plain lines otherwise.
struct Steps {
    bar: ProgressBar,
    started: Instant,
    current: Option<(String, Instant)>,
}

impl Steps {
    fn new(total: u64) -> Self {
        let bar = ProgressBar::new(total);
        bar.set_style(
            ProgressStyle::with_template("{spinner} [{pos}/{len}] {msg} ({elapsed})")
                .expect("a valid template")
                .tick_chars("|/-\\ "),
        );
        bar.enable_steady_tick(Duration::from_millis(120));
        Self {
            bar,
            started: Instant::now(),
            current: None,
        }
    }

    fn say(&self, line: &str) {
        if self.bar.is_hidden() {
            eprintln!("{line}");
        } else {
            self.bar.println(line);
        }
    }

    fn step(&mut self, what: &str) {
        self.finish_step();
        self.bar.set_message(what.to_owned());
        self.current = Some((what.to_owned(), Instant::now()));
    }

    fn finish_step(&mut self) {
        if let Some((what, at)) = self.current.take() {
            self.bar.inc(1);
            self.say(&format!(
                "  ok  {what} ({:.1} s)",
                at.elapsed().as_secs_f64()
            ));
        }
    }

    fn done(mut self) -> Duration {
        self.finish_step();
        self.bar.finish_and_clear();
        self.started.elapsed()
    }
}

/// Runs `program args…` to completion; its output goes to `log` and its failure names it.
fn run_tool(program: &Path, args: &[&str], log: &Path) -> anyhow::Result<()> {
    let file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .with_context(|| format!("{}", log.display()))?;
    let status = Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .stdout(file.try_clone()?)
        .stderr(file)
        .status()
        .with_context(|| format!("running {}", program.display()))?;
    if !status.success() {
        bail!(
            "{} {} failed ({status}); see {}",
            program.display(),
            args.join(" "),
            log.display()
        );
    }
    Ok(())
}

/// A binary beside this one (`target/<profile>/`), unless `env` names another.
fn sibling(name: &str, env: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = std::env::var_os(env) {
        return Ok(PathBuf::from(path));
    }
    let exe = std::env::current_exe().context("the running executable")?;
    let path = exe.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} is missing: build it (`cargo build --release -p cx-provider -p cx-settlement`, as \
             scripts/run.sh does) or set {env}",
            path.display()
        );
    }
    Ok(path)
}

/// Drops and creates the database of `url` (its chains are fresh, so its books must be).
async fn recreate_database(url: &str) -> anyhow::Result<()> {
    let base = url.split('?').next().unwrap_or_default();
    let (prefix, name) = base
        .rsplit_once('/')
        .ok_or_else(|| anyhow!("DATABASE_URL {url:?} names no database"))?;
    if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
        bail!("DATABASE_URL: the devnet recreates its database, and {name:?} is not a plain name");
    }
    let mut admin = sqlx::PgConnection::connect(&format!("{prefix}/postgres"))
        .await
        .context("connecting to PostgreSQL (DATABASE_URL; scripts/setup.sh starts one)")?;
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("dropping database {name}"))?;
    sqlx::query(&format!("CREATE DATABASE {name}"))
        .execute(&mut admin)
        .await
        .with_context(|| format!("creating database {name}"))?;
    Ok(())
}

/// Empties `dir` but for the CA (trusted once, kept across starts).
fn fresh_dir(dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("--dir {}", dir.display()))?;
    for entry in std::fs::read_dir(dir)? {
        let entry = entry?;
        if entry.file_name() == "ca" {
            continue;
        }
        let path = entry.path();
        if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else {
            std::fs::remove_file(&path)
        }
        .with_context(|| format!("clearing {}", path.display()))?;
    }
    Ok(())
}

fn arg(path: &Path) -> &str {
    path.to_str().unwrap_or_default()
}

/// Bytes of the files under `dir`, recursively.
fn dir_bytes(dir: &Path) -> anyhow::Result<u64> {
    let mut total = 0;
    for entry in std::fs::read_dir(dir).with_context(|| dir.display().to_string())? {
        let entry = entry?;
        let meta = entry.metadata()?;
        total += if meta.is_dir() {
            dir_bytes(&entry.path())?
        } else {
            meta.len()
        };
    }
    Ok(total)
}

/// What differs between providers: asks, threads, memory and bandwidth.
struct Profile {
    ask_wei_per_s: u64,
    cache_bytes: u64,
    bandwidth_bps: f64,
    max_batch: u32,
    stake_wei: u64,
}

/// Provider `i`'s profile; `adapter_bytes` is what the devnet's adapters take together (their
/// size follows the model's shape), `None` for the generated model's.
fn profile(i: u16, adapter_bytes: Option<u64>) -> Profile {
    let i = u64::from(i);
    // From room for a handful of adapters to room for all of them: the generated model's are
    // ~5 MB together; a real checkpoint's take their share of the same fractions.
    let cache_bytes = match adapter_bytes {
        None => [400_000, 1_500_000, 6_000_000][i as usize % 3],
        Some(total) => [total / 12, total * 3 / 10, total * 6 / 5][i as usize % 3].max(1),
    };
    Profile {
        // Close enough that residency (adapters in cache) decides as often as the ask does.
        ask_wei_per_s: 900_000 + 100_000 * (i % 4),
        cache_bytes,
        bandwidth_bps: [1e9, 2.5e8, 1e10][i as usize % 3],
        max_batch: [16, 32, 64][i as usize % 3],
        stake_wei: 1_000_000 * (i + 1),
    }
}

async fn devnet(args: &Args, children: &mut Children) -> anyhow::Result<()> {
    // A checkpoint that cannot be served is refused before anything starts.
    if let Some(model) = &args.model
        && !model.join("config.json").is_file()
    {
        anyhow::bail!(
            "--model {}: no config.json there (a Hugging Face model directory is needed)",
            model.display()
        );
    }
    let ports = Ports::new(args.port_offset, args.providers, SIGNERS);
    ports.check_free()?;
    let dir = std::path::absolute(&args.dir).with_context(|| format!("{}", args.dir.display()))?;
    let cx = std::env::current_exe().context("the running executable")?;
    let provider_bin = sibling("cx-provider", "CX_PROVIDER_BIN")?;
    let signer_bin = signer_binary()?;
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(cx_exchange_server::books::database_url);

    let mut steps = Steps::new(8);
    steps.step("database (dropped and created afresh: the chains are fresh too)");
    fresh_dir(&dir)?;
    recreate_database(&database_url).await?;

    steps.step("two Anvil chains");
    let agents_total = u32::from(args.agents) + 1; // the seeded ones and one to try by hand
    let accounts = 2 + u32::from(args.providers) + agents_total;
    for (i, chain_id) in CHAIN_IDS.iter().enumerate() {
        let chain_dir = dir.join(format!("chain-{chain_id}"));
        let anvil = tokio::task::block_in_place(|| {
            AnvilInstance::spawn_in(*chain_id, Some(ports.chain(i)), accounts, Some(&chain_dir))
        })
        .with_context(|| format!("Anvil for chain {chain_id} (scripts/setup.sh installs it)"))?;
        children.chains.push(anvil);
    }
    let keys = children.chains[0].keys.clone();

    steps.step("5 signers and their DKG (any 3 sign, across at least 3 operators)");
    let exchange = Arc::new(Identity::generate());
    let fee = Fee {
        bps: 500,
        account: Address::repeat_byte(0xfe),
    };
    let operators: Vec<String> = (1..=SIGNERS).map(|i| format!("operator-{i}")).collect();
    let operators: Vec<&str> = operators.iter().map(String::as_str).collect();
    let placement = Placement {
        dir: Some(dir.join("signers")),
        first_port: Some(ports.first_signer()),
    };
    let rule = CommitteeRule {
        threshold: THRESHOLD,
        min_operators: MIN_OPERATORS,
    };
    let cluster = tokio::task::block_in_place(|| {
        Cluster::start_in(
            &signer_bin,
            &placement,
            &operators,
            rule,
            exchange.clone(),
            fee,
        )
    })
    .context("starting the signers")?;
    let package = cluster
        .committee(THRESHOLD, MIN_OPERATORS)?
        .dkg(0)
        .await
        .context("the signers' DKG")?;
    let coordinator = cluster.coordinator.clone();
    let members = cluster.members.clone();
    let signers_deployments = cluster.deployments_file.clone();
    children.cluster = Some(cluster);

    steps.step("contracts on both chains under the group key");
    let group_key = EvmGroupKey::from_verifying_key(package.verifying_key())?;
    let mut chains = Vec::new();
    for anvil in &children.chains {
        let params = DeployParams {
            group_key,
            grace_period_s: GRACE_PERIOD_S,
            min_stake: U256::from(1_000u64),
            unbonding_delay_s: 86_400,
            native: true,
            with_probe: false,
        };
        let deployment = deploy(&anvil.rpc_url(), keys[0].clone(), params)
            .await
            .with_context(|| format!("deploying to chain {}", anvil.chain_id))?;
        chains.push(ChainDeployment {
            chain: anvil.entry(),
            deployment,
        });
    }
    let deployments = dir.join("deployments.json");
    let file = DeploymentsFile { chains };
    file.write(&deployments)?;
    file.write(&signers_deployments)?;

    steps.step("the exchange (HTTPS, its own CA, settlement by the committee)");
    let books = Books::open(&database_url)
        .await
        .context("opening the exchange's books")?;
    PgStore::new(books.pool().clone())
        .save_group_key(0, &package)
        .await?;
    books.pool().close().await;
    let keys_dir = dir.join("keys");
    std::fs::create_dir_all(&keys_dir)?;
    let exchange_key = keys_dir.join("exchange.key");
    let coordinator_key = keys_dir.join("coordinator.key");
    let poster_key = keys_dir.join("poster.key");
    cx_settlement::keyfile::write_identity(&exchange_key, &exchange)?;
    cx_settlement::keyfile::write_identity(&coordinator_key, &coordinator)?;
    cx_settlement::keyfile::write_secret(
        &poster_key,
        B256::from(keys[1].to_bytes()).to_string().as_bytes(),
    )?;
    let settlement = dir.join("settlement.json");
    std::fs::write(
        &settlement,
        serde_json::to_string_pretty(&json!({
            "coordinator_identity": coordinator_key,
            "committee": members,
            "threshold": THRESHOLD,
            "min_operators": MIN_OPERATORS,
            "fee": fee,
            "poster_key_file": poster_key,
            "batching": {"max_age_s": 2, "min_jobs": 1},
        }))?,
    )?;
    let catalog = dir.join("catalog.toml");
    std::fs::write(&catalog, CATALOG)?;
    // The model every provider serves: the generated one, or --model's checkpoint, which the
    // catalog learns from its config.json as `cx catalog add` does.
    let model_name = match &args.model {
        None => MODEL.to_owned(),
        Some(model) => {
            super::catalog::append_model(
                model,
                &catalog,
                args.model_name.clone(),
                &[],
                super::catalog::RETAIL_WEI_PER_MTOK,
            )
            .with_context(|| format!("--model {}", model.display()))?
            .name
        }
    };
    let ca_dir = dir.join("ca");
    let ca = DevCa::open_or_create(&ca_dir).context("the devnet's CA")?;
    let ca_pem = ca.cert_path();
    let url = format!("https://127.0.0.1:{}", ports.exchange());
    let mut serve = Command::new(&cx);
    serve
        .arg("serve")
        .args(["--listen", &format!("127.0.0.1:{}", ports.exchange())])
        .args(["--ca-dir", arg(&ca_dir)])
        .args(["--deployments", arg(&deployments)])
        .args(["--catalog", arg(&catalog)])
        .args(["--identity", arg(&exchange_key)])
        .args(["--settlement", arg(&settlement)])
        .args(["--settle-margin-s", &SETTLE_MARGIN_S.to_string()])
        .args(["--provider-silence-s", &PROVIDER_SILENCE_S.to_string()])
        .args(["--clearing", args.clearing.as_str()])
        .env("DATABASE_URL", &database_url);
    let mut exchange_proc =
        Supervised::spawn_logged("the exchange", serve, &dir.join("exchange.log"), "")?;
    tokio::task::block_in_place(|| {
        exchange_proc.wait_ready(
            ([127, 0, 0, 1], ports.exchange()).into(),
            Duration::from_secs(60),
            Duration::from_millis(100),
            || true,
        )
    })?;
    children.others.push(exchange_proc);
    let client = Client::new(&url, Some(&ca_pem))?.with_timeout(Duration::from_secs(90));
    wait_for(
        Duration::from_secs(30),
        "the exchange's /healthz",
        || async { client.health().await.is_ok() },
    )
    .await?;

    let adapters_dir = dir.join("adapters");
    let tools_log = dir.join("tools.log");
    let model_dir = match &args.model {
        Some(model) => {
            steps.step(&format!(
                "{model_name} and 50 adapters of ranks 4 to 32 for it"
            ));
            model.clone()
        }
        None => {
            steps.step("a generated model and 50 adapters of ranks 4 to 32");
            let model_dir = dir.join("model");
            run_tool(
                &provider_bin,
                &[
                    "gen-model",
                    "--out",
                    arg(&model_dir),
                    "--hidden",
                    "64",
                    "--layers",
                    "2",
                    "--seed",
                    "5",
                ],
                &tools_log,
            )?;
            model_dir
        }
    };
    let count = ADAPTERS.to_string();
    let mut gen_adapters = vec![
        "gen-adapters",
        "--model",
        arg(&model_dir),
        "--out",
        arg(&adapters_dir),
        "--count",
        &count,
        "--ranks",
        RANKS,
        "--seed",
        "7",
    ];
    if args.model.is_some() {
        // A real checkpoint's layers are wide and many: adapters on every projection would be
        // ~1 GB for 50 (past an account's store quota); q and v are PEFT's classic LoRA targets.
        gen_adapters.extend(["--targets", REAL_MODEL_TARGETS]);
    }
    run_tool(&provider_bin, &gen_adapters, &tools_log)?;
    // Name the base as PEFT's save_pretrained does: the exchange maps an adapter to its catalog
    // model by it (a rent is kept by a bundle that serves that base).
    for k in 0..ADAPTERS {
        let path = adapters_dir
            .join(format!("adapter-{k:03}"))
            .join("adapter_config.json");
        let mut config: serde_json::Value = serde_json::from_slice(&std::fs::read(&path)?)
            .with_context(|| format!("{}", path.display()))?;
        config["base_model_name_or_path"] = json!(model_name);
        std::fs::write(&path, serde_json::to_vec_pretty(&config)?)?;
    }
    let adapter_bytes = match args.model {
        Some(_) => Some(dir_bytes(&adapters_dir)?),
        None => None,
    };

    steps.step(&format!(
        "{} providers, staked on both chains",
        args.providers
    ));
    let exchange_hash = format!("0x{}", exchange.id());
    let providers_dir = dir.join("providers");
    std::fs::create_dir_all(&providers_dir)?;
    for i in 0..args.providers {
        let p = profile(i, adapter_bytes);
        let name = format!("provider-{}", i + 1);
        let identity = providers_dir.join(format!("{name}.key"));
        let evm_key = providers_dir.join(format!("{name}-evm.key"));
        let signer = &keys[2 + usize::from(i)];
        cx_settlement::keyfile::write_secret(
            &evm_key,
            B256::from(signer.to_bytes()).to_string().as_bytes(),
        )?;
        let log = providers_dir.join(format!("{name}.log"));
        run_tool(&provider_bin, &["keygen", "--out", arg(&identity)], &log)?;
        run_tool(
            &provider_bin,
            &[
                "stake",
                "--evm-key",
                arg(&evm_key),
                "--deployments",
                arg(&deployments),
                "--amount",
                &p.stake_wei.to_string(),
                "--identity",
                arg(&identity),
            ],
            &log,
        )?;
        let mut command = Command::new(&provider_bin);
        command
            .arg("serve")
            .args(["--model", arg(&model_dir)])
            .args(["--port", &ports.provider(i).to_string()])
            .args([
                "--served-model-name",
                &model_name,
                "--model-name",
                &model_name,
            ])
            .args(["--threads", "1"])
            .args(["--cache-bytes", &p.cache_bytes.to_string()])
            .args(["--max-batch", &p.max_batch.to_string()])
            .args(["--exchange", &url, "--exchange-ca", arg(&ca_pem)])
            .args(["--exchange-key-hash", &exchange_hash])
            .args(["--identity", arg(&identity)])
            .args(["--payout", &signer.address().to_string()])
            .args(["--operator", &format!("operator-{}", i % 3 + 1)])
            .args(["--ask-wei-per-s", &p.ask_wei_per_s.to_string()])
            .args(["--bandwidth-bps", &p.bandwidth_bps.to_string()])
            .args(["--bundle-id", &format!("{name}-cpu")])
            .args(["--fetched-adapters", arg(&providers_dir.join(&name))]);
        children
            .others
            .push(Supervised::spawn_logged(name, command, &log, "")?);
    }
    let wanted = usize::from(args.providers);
    wait_for(
        Duration::from_secs(60),
        "every provider's registration",
        || async {
            client
                .providers()
                .await
                // Each provider offers its inference bundle and `<id>-matmul`: count the former.
                .is_ok_and(|b| {
                    b.iter()
                        .filter(|b| b.id.starts_with("provider-") && !b.id.ends_with("-matmul"))
                        .count()
                        >= wanted
                })
        },
    )
    .await?;

    steps.step(&format!(
        "{} agents: bound, adapters stored, tabs on both chains",
        args.agents
    ));
    let served = client.chains().await?;
    let sides: Vec<Side> = file
        .chains
        .iter()
        .map(|c| {
            let info = served
                .iter()
                .find(|s| s.chain_id == c.chain.chain_id)
                .cloned()
                .ok_or_else(|| anyhow!("the exchange does not serve chain {}", c.chain.chain_id))?;
            Ok(Side {
                info,
                rpc_url: c.chain.rpc_url.clone(),
                deployment: c.deployment,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    // The adapters' ids now; they are stored once the first agent holds a tab (storing needs an
    // account with money at stake).
    let adapters = (0..ADAPTERS)
        .map(|k| traffic::adapter_id(&adapters_dir.join(format!("adapter-{k:03}"))))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let traffic_log = std::fs::File::create(dir.join("traffic.log"))?;
    let market = Arc::new(Market {
        client: client.clone(),
        sides,
        model: model_name.clone(),
        adapters,
        verified_tier: if args.providers >= 2 {
            cx_protocol::Tier::T1
        } else {
            cx_protocol::Tier::T0
        },
        // Operators are assigned round robin over three (`operator-{i % 3 + 1}`).
        t3: args.providers >= 3,
        adapters_stored: Default::default(),
        stats: Default::default(),
        log: std::sync::Mutex::new(traffic_log),
    });
    let agents_dir = dir.join("agents");
    std::fs::create_dir_all(&agents_dir)?;
    let first_agent_key = 2 + usize::from(args.providers);
    let mut agents = Vec::new();
    for a in 0..=args.agents {
        // The last one is left for the commands printed below.
        let name = if a == args.agents {
            "try".to_owned()
        } else {
            format!("agent-{}", a + 1)
        };
        let agent = Agent::new(
            name.clone(),
            &keys[first_agent_key + usize::from(a)],
            &market.sides,
            &agents_dir.join(format!("{name}.json")),
        )?;
        agent.bind(&market).await?;
        let mut tabs = Vec::new();
        for side in 0..market.sides.len() {
            // The first tabs close soon (staggered), so batches land within the first minute.
            let close_after = Duration::from_secs(8 + 3 * u64::from(a) + 2 * side as u64);
            tabs.push(agent.open_tab(&market, side, close_after).await?);
        }
        if a == 0 {
            for k in 0..ADAPTERS {
                let dir = adapters_dir.join(format!("adapter-{k:03}"));
                traffic::put_adapter(agent.own(&market), &dir).await?;
            }
            market
                .adapters_stored
                .store(true, std::sync::atomic::Ordering::Release);
            // Its tabs opened before the adapters were stored: their rents go in now.
            for (side, tab) in tabs.iter().enumerate() {
                let rented = agent.rent(&market, side, tab.escrow_id).await;
                market.count_refused(&agent.name, rented);
            }
        }
        agents.push((agent, tabs));
    }
    // Its tabs stay open: nothing sends on them but the person trying the commands.
    let (_try_agent, try_tabs) = agents.pop().expect("the agent to try");
    let try_session = dir.join("try-session.key");
    cx_settlement::keyfile::write_secret(&try_session, try_tabs[0].session_key.as_bytes())?;
    let ready = steps.done();

    // Where to look.
    println!("cx devnet: the market is up ({:.1} s)", ready.as_secs_f64());
    println!("  explorer   {url}/explorer");
    println!("  api        {url}/v1 (OpenAPI at {url}/openapi.json)");
    println!("  ca         {}", ca_pem.display());
    println!("  ca sha256  {}", ca.fingerprint_sha256());
    println!(
        "  database   {} (created afresh at this start)",
        super::serve::redact_password(&database_url)
    );
    for c in &file.chains {
        println!(
            "  chain      {} at {} (Settlement {})",
            c.chain.chain_id, c.chain.rpc_url, c.deployment.settlement
        );
    }
    println!(
        "  signers    {SIGNERS} on 127.0.0.1:{}.., any {THRESHOLD} sign",
        ports.first_signer()
    );
    println!(
        "  providers  {} on 127.0.0.1:{}..",
        args.providers,
        ports.provider(0)
    );
    println!(
        "  agents     {} {}",
        args.agents,
        if args.no_traffic {
            "(idle: --no-traffic)"
        } else {
            "sending chats, intents (T0, T1, T3), matmuls (T2), train orders, searches, reserves \
             and rents"
        }
    );
    println!("  logs       {}", dir.display());
    let agent_flags = format!(
        "--exchange {url} --ca {} --keys {}",
        ca_pem.display(),
        agents_dir.join("try.json").display()
    );
    println!("Try:");
    println!(
        "  cx agent {agent_flags} --chain {} intent --model {model_name} --prompt 'Say hello.' --max-tokens 8 --max-price-wei {} --tab {}",
        CHAIN_IDS[0],
        traffic::MAX_PRICE_WEI,
        try_tabs[0].escrow_id
    );
    println!(
        "  SSL_CERT_FILE={} .tools/py/bin/python -c 'import openai; c = openai.OpenAI(base_url=\"{url}/v1\", api_key=open(\"{}\").read().strip()); print(c.chat.completions.create(model=\"{model_name}\", messages=[{{\"role\": \"user\", \"content\": \"Say hello.\"}}], max_tokens=8).choices[0].message.content)'",
        ca_pem.display(),
        try_session.display()
    );
    println!(
        "  cx agent --exchange {url} --ca {} --keys {} --chain {} claim --deployments {}   (once one of its tabs settled)",
        ca_pem.display(),
        agents_dir.join("agent-1.json").display(),
        CHAIN_IDS[0],
        deployments.display()
    );
    println!("Ctrl-C stops every process.");

    let started = Instant::now() - ready;
    let (closed_send, mut closed) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = tokio::task::JoinSet::new();
    if !args.no_traffic {
        for (seed, (agent, tabs)) in agents.into_iter().enumerate() {
            tasks.spawn(agent.run(market.clone(), tabs, closed_send.clone(), seed as u64));
        }
    }
    drop(closed_send);
    let mut tally = Tally::new(started);
    let mut reported = 0u64;
    let mut announced = std::collections::BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    let mut lost = std::collections::BTreeSet::new();
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        if let Some(name) = children.exited() {
            bail!(
                "{name} exited; its log is under {} — stopping the devnet",
                dir.display()
            );
        }
        for name in children.lost_providers(&mut lost) {
            eprintln!(
                "cx devnet: {name} exited (its log: {}); the market goes on without it",
                providers_dir.join(format!("{name}.log")).display()
            );
        }
        while let Ok(tab) = closed.try_recv() {
            tally.closed(tab);
        }
        tally.poll(&client).await;
        for chain in CHAIN_IDS {
            if let Some(s) = tally.first_batch_s(chain)
                && announced.insert(chain)
            {
                eprintln!("cx devnet: first batch on chain {chain} settled {s:.1} s after start");
            }
        }
        if tally.jobs > reported {
            reported = tally.jobs;
            eprintln!("cx devnet: {} jobs settled on chain", tally.jobs);
        }
        if let Some(n) = args.exit_after_settled {
            if tally.jobs >= n && CHAIN_IDS.iter().all(|c| tally.first_batch_s(*c).is_some()) {
                break;
            }
            if Instant::now() > deadline {
                bail!(
                    "--exit-after-settled {n}: only {} settled in {} s (--timeout-s); see {}",
                    tally.jobs,
                    args.timeout_s,
                    dir.display()
                );
            }
        }
    }
    tasks.abort_all();
    let usage = children.usage();
    let (batches, batch_parts_per_chain, first_batch_s) = tally.summary_base();
    let stats = &market.stats;
    let load = |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
    let summary = Summary {
        settled_jobs: tally.jobs,
        batches,
        batch_parts_per_chain,
        first_batch_s,
        ready_s: (ready.as_secs_f64() * 10.0).round() / 10.0,
        chats: load(&stats.chats),
        intents: load(&stats.intents),
        searches: load(&stats.searches),
        matmuls: load(&stats.matmuls),
        trains: load(&stats.trains),
        reserves: load(&stats.reserves),
        rents: load(&stats.rents),
        tabs_closed: load(&stats.tabs_closed),
        errors: load(&stats.errors),
        processes: usage.len(),
        peak_rss_bytes_sum: usage.iter().map(|u| u.peak_rss_bytes).sum(),
        cpu_s: usage.iter().map(|u| u.cpu_ticks).sum::<u64>() as f64 / Usage::TICKS_PER_S as f64,
    };
    println!(
        "cx devnet: {} jobs settled on chain in {} batches",
        summary.settled_jobs, summary.batches
    );
    for (chain, s) in &summary.first_batch_s {
        println!("  first batch on chain {chain}: {s:.1} s after start");
    }
    println!(
        "  traffic    {} chats, {} intents, {} searches, {} matmuls, {} train orders, {} reserves, \
         {} rents, {} tabs closed, {} errors (traffic.log)",
        summary.chats,
        summary.intents,
        summary.searches,
        summary.matmuls,
        summary.trains,
        summary.reserves,
        summary.rents,
        summary.tabs_closed,
        summary.errors
    );
    println!(
        "  processes  {}: peak memory {:.0} MiB (sum of each one's peak), {:.1} CPU-s",
        summary.processes,
        summary.peak_rss_bytes_sum as f64 / (1 << 20) as f64,
        summary.cpu_s
    );
    println!("{}", serde_json::to_string(&summary)?);
    Ok(())
}

/// Polls `check` every 250 ms until it holds, or fails after `within` naming `what`.
async fn wait_for<F, Fut>(within: Duration, what: &str, mut check: F) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while !check().await {
        if start.elapsed() > within {
            bail!("{what}: not ready within {} s", within.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}
