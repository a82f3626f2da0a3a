//! `cx devnet`: the whole market on this machine, each party its own supervised process.
//!
//! Composition only, in the order the money flows: two Anvil chains ([`AnvilInstance`]), a
//! 3-of-5 `cx-signer` committee after a DKG ([`Cluster`]), the contracts on both chains under
//! the group key ([`deploy`]), a fresh PostgreSQL database holding that key, `cx serve
//! --settlement` (the exchange and its coordinator), `cx-provider`s staked on both chains on one
//! generated model, and seeded agents (`traffic`) whose closed tabs the `tally` watches settle.
//! Logs and configs land under [`Config::dir`] (`runtime/devnet/`); the `stop` future given to
//! [`run`] (Ctrl-C or SIGTERM in `cx devnet`) stops every child.
//!
//! The parts: `ports` (every port, checked free first), `agents` (bound, with tabs, before the
//! traffic), `children` (what was started, stopped on
//! drop), `steps` (progress), `tools` (a tool run, the database and folder made afresh),
//! `providers` (the fleet's profiles), `traffic` (the agents), `tally` (what settled) and
//! `watch` (the run after the start, and its summary).

mod agents;
mod children;
mod ports;
mod providers;
mod steps;
mod tally;
mod tools;
mod traffic;
mod watch;

use crate::deploy::{DeployParams, deploy};
use crate::{AnvilInstance, Cluster, Placement, Supervised, provider_binary, signer_binary};
use anyhow::Context;
use children::Children;
use cx_client::Client;
use cx_contracts::{AssetSpec, ChainDeployment, DeploymentsFile};
use cx_exchange_server::books::Books;
use cx_exchange_server::tls::DevCa;
use cx_protocol::order::{Address, B256, U256};
use cx_protocol::pq::Identity;
use cx_settlement::config::CommitteeRule;
use cx_settlement::coordinator::{PgStore, Store};
use cx_settlement::frost::EvmGroupKey;
use cx_settlement::ledger::Fee;
use ports::Ports;
use providers::profile;
use serde_json::json;
use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;
use steps::Steps;
use tools::{arg, dir_bytes, fresh_dir, recreate_database, run_tool, wait_for};

/// The devnet's chains: Anvil on 8545 and 8546.
const CHAIN_IDS: [u64; 2] = [31337, 31338];
/// Signers and their threshold: any 3 of 5, spanning at least 3 operators (each its own).
const SIGNERS: u16 = 5;
const THRESHOLD: u16 = 3;
const MIN_OPERATORS: usize = 3;
/// The catalog model every provider serves unless `--model` names a checkpoint (a generated
/// Llama of 0.13 M parameters).
pub const MODEL: &str = "tiny-llama";
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

/// The bases `cx devnet --bases N` adds after [`MODEL`]: its shape, other weights (their seeds).
pub const EXTRA_BASES: [(&str, &str); 2] = [("tiny-llama-b", "11"), ("tiny-llama-c", "12")];

/// `cx-provider gen-model`'s arguments for [`MODEL`] into folder `out`: the shape [`CATALOG`]
/// describes (hidden 64, 2 layers, vocabulary 512: about 0.13 M parameters in f32), seeded.
pub(crate) fn gen_model_args(out: &str) -> [&str; 9] {
    gen_model_seeded(out, MODEL_SEED)
}

/// The seed of [`MODEL`]'s generated weights.
pub(crate) const MODEL_SEED: &str = "5";

/// [`gen_model_args`] with other weights (`seed`).
pub(crate) fn gen_model_seeded<'a>(out: &'a str, seed: &'a str) -> [&'a str; 9] {
    [
        "gen-model",
        "--out",
        out,
        "--hidden",
        "64",
        "--layers",
        "2",
        "--seed",
        seed,
    ]
}

/// The catalog of the generated model every devnet provider serves, [`MODEL`] (the tests' markets
/// use the same one).
pub const CATALOG: &str = include_str!("../../fixtures/tiny-catalog.toml");

/// What `cx devnet` starts and how long it runs: its flags, as plain values (the CLI parses and
/// bounds them; see `cx devnet --help` for each one's default).
#[derive(Clone, Debug)]
pub struct Config {
    /// Start the market without the agents' traffic (they are bound, with tabs, and idle).
    pub no_traffic: bool,
    /// Providers to start (1 to 20), each its own process, identity and account.
    pub providers: u16,
    /// Seeded agents sending traffic (1 to 50).
    pub agents: u16,
    /// Return once this many jobs are settled on chain and a batch has landed on each chain,
    /// printing a summary (its JSON last); `None` runs until stopped.
    pub exit_after_settled: Option<u64>,
    /// Fail `exit_after_settled` if it takes longer than this, seconds.
    pub timeout_s: u64,
    /// Added to every port (Anvil 8545 and 8546, exchange 8443, providers 9001.., signers
    /// 9101..): a second devnet beside a running one.
    pub port_offset: u16,
    /// Where logs, keys and configs go (emptied at start, but for the CA in ca/).
    pub dir: PathBuf,
    /// The exchange's database, dropped and created afresh at every start (its chains are
    /// fresh too); `None`: the exchange's default (`DATABASE_URL`, else the local server).
    pub database_url: Option<String>,
    /// How the exchange ranks feasible bundles (`cx serve --clearing`).
    pub clearing: cx_exchange::clearing::Policy,
    /// Serve this checkpoint (a Hugging Face model directory) instead of the generated model.
    pub model: Option<PathBuf>,
    /// The name the checkpoint of `model` is served and asked for by [default: its directory's
    /// name].
    pub model_name: Option<String>,
    /// Bases on the market (1 to 3, the generated model's only): [`MODEL`] and the [`EXTRA_BASES`]
    /// after it, each provider serving one and storing the others (`--base-store`).
    pub bases: u8,
    /// `cx serve` nodes on the exchange's database: with more than one, each on a port of its
    /// own behind a balancer on the exchange's address ([`crate::balancer`]); one writes, the others
    /// forward to it and the first to take its lease after it dies takes over.
    pub exchanges: u8,
    /// Seconds between blocks on both chains, as on a real network; `None`: a block per
    /// transaction (Anvil's automine).
    pub block_time_s: Option<u64>,
    /// The `cx` binary: its `serve` runs the exchange. (`cx-provider` is found by
    /// [`crate::provider_binary`]: beside the running binary unless `CX_PROVIDER_BIN` names it;
    /// `cx-signer` by [`crate::signer_binary`].)
    pub exchange_bin: PathBuf,
    /// Adds `model`'s checkpoint to the exchange's catalog file, learned from its config.json,
    /// and returns the name it is served by: `(model directory, catalog file, model_name)`.
    /// A function the caller passes, not a dependency, because the catalog's writer is
    /// `cx catalog add`'s, in the `cx` binary this crate cannot depend on.
    pub add_to_catalog: AddToCatalog,
}

/// See [`Config::add_to_catalog`].
pub type AddToCatalog = fn(&Path, &Path, Option<String>) -> anyhow::Result<String>;

/// Starts the devnet and runs it until `stop` completes (the CLI passes Ctrl-C or SIGTERM), an
/// essential process exits, or [`Config::exit_after_settled`] is met; every child is stopped
/// before it returns, whichever way it ends. Blocking: it builds its own async runtime.
pub fn run(config: Config, stop: impl Future<Output = ()>) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    // Every child lives in `children`, outside the future: whichever way it ends (done, failed,
    // Ctrl-C, SIGTERM), dropping `children` kills each of them, newest first.
    let mut children = Children::default();
    let outcome = runtime.block_on(async {
        tokio::select! {
            done = devnet(&config, &mut children) => done,
            () = stop => {
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

async fn devnet(config: &Config, children: &mut Children) -> anyhow::Result<()> {
    // A checkpoint that cannot be served is refused before anything starts.
    if let Some(model) = &config.model
        && !model.join("config.json").is_file()
        && !(model.is_file() && model.extension().is_some_and(|e| e == "gguf"))
    {
        anyhow::bail!(
            "--model {}: no config.json there (a Hugging Face model directory or a .gguf file \
             is needed)",
            model.display()
        );
    }
    let ports = Ports::new(
        config.port_offset,
        config.providers,
        SIGNERS,
        u16::from(config.exchanges),
    );
    ports.check_free()?;
    let dir =
        std::path::absolute(&config.dir).with_context(|| format!("{}", config.dir.display()))?;
    let provider_bin = provider_binary()?;
    let signer_bin = signer_binary()?;
    let database_url = config
        .database_url
        .clone()
        .unwrap_or_else(cx_exchange_server::books::database_url);

    let mut steps = Steps::new(8);
    steps.step("database (dropped and created afresh: the chains are fresh too)");
    fresh_dir(&dir)?;
    recreate_database(&database_url).await?;

    steps.step("two Anvil chains");
    let agents_total = u32::from(config.agents) + 1; // the seeded ones and one to try by hand
    let accounts = 2 + u32::from(config.providers) + agents_total;
    for (i, chain_id) in CHAIN_IDS.iter().enumerate() {
        let chain_dir = dir.join(format!("chain-{chain_id}"));
        let anvil = tokio::task::block_in_place(|| {
            AnvilInstance::spawn_in(
                *chain_id,
                Some(ports.chain(i)),
                accounts,
                config.block_time_s,
                Some(&chain_dir),
            )
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
            asset: AssetSpec::Native,
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
    let model_name = match &config.model {
        None => MODEL.to_owned(),
        Some(model) => (config.add_to_catalog)(model, &catalog, config.model_name.clone())
            .with_context(|| format!("--model {}", model.display()))?,
    };
    // The other bases (`--bases`): generated now, so that the catalog the exchange starts with
    // has learned them from their config.json.
    let tools_log = dir.join("tools.log");
    let mut extra_bases = Vec::new();
    for (name, seed) in EXTRA_BASES
        .iter()
        .take(usize::from(config.bases.clamp(1, 3)) - 1)
    {
        let base_dir = dir.join(name);
        run_tool(
            &provider_bin,
            &gen_model_seeded(arg(&base_dir), seed),
            &tools_log,
        )?;
        (config.add_to_catalog)(&base_dir, &catalog, Some((*name).to_owned()))
            .with_context(|| format!("adding {name} to the catalog"))?;
        extra_bases.push(((*name).to_owned(), base_dir));
    }
    let ca_dir = dir.join("ca");
    let ca = DevCa::open_or_create(&ca_dir).context("the devnet's CA")?;
    let ca_pem = ca.cert_path();
    let url = format!("https://127.0.0.1:{}", ports.exchange());
    // One node listens on the exchange's address; several each on their own, behind the
    // balancer there.
    let node_ports: Vec<u16> = if config.exchanges > 1 {
        (0..u16::from(config.exchanges))
            .map(|i| ports.exchange_node(i))
            .collect()
    } else {
        vec![ports.exchange()]
    };
    let serve_command = |port: u16, standby: bool| {
        let mut serve = Command::new(&config.exchange_bin);
        serve.arg("serve");
        if standby {
            serve.arg("--standby");
        }
        serve
            .args(["--listen", &format!("127.0.0.1:{port}")])
            .args(["--ca-dir", arg(&ca_dir)])
            .args(["--deployments", arg(&deployments)])
            .args(["--catalog", arg(&catalog)])
            .args(["--identity", arg(&exchange_key)])
            .args(["--settlement", arg(&settlement)])
            .args(["--settle-margin-s", &SETTLE_MARGIN_S.to_string()])
            .args(["--provider-silence-s", &PROVIDER_SILENCE_S.to_string()])
            .args(["--clearing", config.clearing.as_str()])
            .env("DATABASE_URL", &database_url);
        serve
    };
    // The writer first (it migrates the database and takes the lease), then the others, which
    // find the lease held and forward to it.
    for (i, port) in node_ports.iter().enumerate() {
        let (name, log) = match i {
            0 => ("the exchange".to_owned(), "exchange.log".to_owned()),
            _ => (
                format!("the exchange (node {})", i + 1),
                format!("exchange-node-{}.log", i + 1),
            ),
        };
        let mut node =
            Supervised::spawn_logged(name, serve_command(*port, i > 0), &dir.join(log), "")?;
        tokio::task::block_in_place(|| {
            node.wait_ready(
                ([127, 0, 0, 1], *port).into(),
                Duration::from_secs(60),
                Duration::from_millis(100),
                || true,
            )
        })?;
        children.others.push(node);
    }
    if config.exchanges > 1 {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", ports.exchange()))
            .await
            .with_context(|| format!("the exchange's balancer on port {}", ports.exchange()))?;
        let nodes = node_ports
            .iter()
            .map(|port| ([127, 0, 0, 1], *port).into())
            .collect();
        children.balancer = Some(crate::balancer::Balancer::start(listener, nodes));
    }
    let client = Client::new(&url, Some(&ca_pem))?.with_timeout(Duration::from_secs(90));
    wait_for(
        Duration::from_secs(30),
        "the exchange's /healthz",
        || async { client.health().await.is_ok() },
    )
    .await?;

    let adapters_dir = dir.join("adapters");
    let model_dir = match &config.model {
        Some(model) => {
            steps.step(&format!(
                "{model_name} and 50 adapters of ranks 4 to 32 for it"
            ));
            model.clone()
        }
        None => {
            steps.step("a generated model and 50 adapters of ranks 4 to 32");
            let model_dir = dir.join("model");
            run_tool(&provider_bin, &gen_model_args(arg(&model_dir)), &tools_log)?;
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
    if config.model.is_some() {
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
    let adapter_bytes = match config.model {
        Some(_) => Some(dir_bytes(&adapters_dir)?),
        None => None,
    };
    let mut bases = vec![(model_name.clone(), model_dir.clone())];
    bases.extend(extra_bases);

    steps.step(&format!(
        "{} providers, staked on both chains",
        config.providers
    ));
    let exchange_hash = format!("0x{}", exchange.id());
    let providers_dir = dir.join("providers");
    std::fs::create_dir_all(&providers_dir)?;
    for i in 0..config.providers {
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
        // Provider i serves base i mod N and can load the others from its store.
        let (served, served_dir) = &bases[usize::from(i) % bases.len()];
        let mut command = Command::new(&provider_bin);
        command
            .arg("serve")
            .args(["--model", arg(served_dir)])
            .args(["--port", &ports.provider(i).to_string()])
            .args(["--served-model-name", served, "--model-name", served]);
        for (name, dir) in bases.iter().filter(|(name, _)| name != served) {
            command.args(["--base-store", &format!("{name}={}", dir.display())]);
        }
        command
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
        if p.ask_follow {
            command.arg("--ask-follow");
        }
        children
            .others
            .push(Supervised::spawn_logged(name, command, &log, "")?);
    }
    let wanted = usize::from(config.providers);
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
        config.agents
    ));
    let agents = agents::start(
        config,
        &client,
        &file,
        &keys,
        &dir,
        &adapters_dir,
        &model_name,
    )
    .await?;
    let try_session = dir.join("try-session.key");
    cx_settlement::keyfile::write_secret(&try_session, agents.try_tabs[0].session_key.as_bytes())?;
    // The try agent's tab on the second chain has its own session (`cx bench market` sends its
    // load step there: a tab takes a bounded number of jobs).
    for (i, tab) in agents.try_tabs.iter().enumerate().skip(1) {
        let path = dir.join(format!("try-session-{}.key", i + 1));
        cx_settlement::keyfile::write_secret(&path, tab.session_key.as_bytes())?;
    }
    let ready = steps.done();

    // Where to look.
    println!("cx devnet: the market is up ({:.1} s)", ready.as_secs_f64());
    println!("  explorer   {url}/explorer");
    println!("  api        {url}/v1 (OpenAPI at {url}/openapi.json)");
    println!("  ca         {}", ca_pem.display());
    println!("  ca sha256  {}", ca.fingerprint_sha256());
    println!(
        "  database   {} (created afresh at this start)",
        cx_exchange_server::books::redact_password(&database_url)
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
        config.providers,
        ports.provider(0)
    );
    println!(
        "  agents     {} {}",
        config.agents,
        if config.no_traffic {
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
        agents.dir.join("try.json").display()
    );
    println!("Try:");
    println!(
        "  cx agent {agent_flags} --chain {} intent --model {model_name} --prompt 'Say hello.' --max-tokens 8 --max-price-wei {} --tab {}",
        CHAIN_IDS[0],
        traffic::MAX_PRICE_WEI,
        agents.try_tabs[0].escrow_id
    );
    println!(
        "  SSL_CERT_FILE={} .tools/py/bin/python -c 'import openai; c = openai.OpenAI(base_url=\"{url}/v1\", api_key=open(\"{}\").read().strip()); print(c.chat.completions.create(model=\"{model_name}\", messages=[{{\"role\": \"user\", \"content\": \"Say hello.\"}}], max_tokens=8).choices[0].message.content)'",
        ca_pem.display(),
        try_session.display()
    );
    println!(
        "  cx agent --exchange {url} --ca {} --keys {} --chain {} claim --deployments {}   (once one of its tabs settled)",
        ca_pem.display(),
        agents.dir.join("agent-1.json").display(),
        CHAIN_IDS[0],
        deployments.display()
    );
    println!("Ctrl-C stops every process.");

    watch::watch(
        config,
        children,
        &client,
        agents.market,
        agents.seeded,
        ready,
        &dir,
        &providers_dir,
    )
    .await
}
