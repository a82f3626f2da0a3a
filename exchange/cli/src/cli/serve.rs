//! `cx serve`: the exchange over HTTPS.
//!
//! Composition only: the books (`Books::open`, which creates and migrates the database), the
//! leases (`books::Lease`), the market (catalog + engine rebuilt from the books), the duties (a
//! chain watcher per served chain, the settlement loop; `cluster::Campaign`), the intake, the
//! router (`api::app`) and the HTTPS edge (`tls`) are the server crate's; this file reads flags,
//! wires them together, prints where to look and stops on Ctrl-C (or SIGTERM).

use anyhow::{Context, anyhow};
use cx_contracts::DeploymentsFile;
use cx_exchange::objective::Weights;
use cx_exchange::routing::catalog::Catalog;
use cx_exchange_server::api::{self, AppState};
use cx_exchange_server::books::redact_password;
use cx_exchange_server::books::{self, Books, Duty, Lease, Seat};
use cx_exchange_server::chain::Watcher;
use cx_exchange_server::cluster::{Campaign, DUTY_PERIOD, DutyTask, Forwarder, Start};
use cx_exchange_server::intake::{DEFAULT_SETTLE_MARGIN_S, Intake};
use cx_exchange_server::market::Market;
use cx_exchange_server::service::{self, Front, Service};
use cx_exchange_server::settlement::{SettlementConfig, Settler};
use cx_exchange_server::stake::Registries;
use cx_exchange_server::tls::{self, DevCa, Identity, Limits};
use cx_protocol::Bundle;
use std::io;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use tokio::net::TcpListener;

/// The catalog `cx serve` uses without `--catalog`: the example shipped with the market core.
const DEFAULT_CATALOG: &str = include_str!("../../../core/catalog.example.toml");
/// Where the devnet writes the chains and their contracts.
const DEFAULT_DEPLOYMENTS: &str = "runtime/deployments.json";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Address to listen on.
    #[arg(
        long,
        env = "CX_LISTEN",
        value_name = "ADDR",
        default_value = "127.0.0.1:8443"
    )]
    listen: SocketAddr,
    /// Join a cluster: while another `cx serve` writes the database, serve this node's port by
    /// forwarding every request to it, and take over (on the same port) when it stops or dies.
    /// Without it, a held database is refused after --writer-wait-s.
    #[arg(long)]
    standby: bool,
    /// The URL other nodes of the cluster reach this one at when it writes (default: the
    /// scheme and --listen address; needed when --listen is a wildcard address).
    #[arg(long, env = "CX_ADVERTISE", value_name = "URL")]
    advertise: Option<String>,
    /// The certificate authority of the cluster's nodes (PEM), which a --standby node trusts
    /// when it forwards to the writer (default: the development CA of --ca-dir; needed with
    /// --tls-cert).
    #[arg(long, env = "CX_PEER_CA", value_name = "PEM")]
    peer_ca: Option<PathBuf>,
    /// Without --standby, how long to wait for a database another `cx serve` writes before
    /// refusing: long enough for a restart (the old process's connection closing), short of
    /// hiding a second writer.
    #[arg(long, default_value_t = 15, value_name = "S")]
    writer_wait_s: u64,
    /// The duties this node runs while it holds their lease — each runs once per cluster, on
    /// whichever node ready for it takes its lease first, writer or standby: `settlement` (the
    /// settlement loop, with --settlement), `watch` (the chains' watchers); a comma-separated
    /// list, or `none`.
    #[arg(long, env = "CX_DUTIES", value_name = "LIST", default_value = "settlement,watch",
          value_parser = parse_duties)]
    duties: Duties,
    /// Certificate chain to serve (PEM, leaf first); without it a development CA signs one.
    #[arg(long, env = "CX_TLS_CERT", value_name = "PEM", requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// Private key of --tls-cert (PEM).
    #[arg(long, env = "CX_TLS_KEY", value_name = "PEM", requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Where the development CA lives (made on first start, reused after): ca.pem is the file to
    /// trust.
    #[arg(long, env = "CX_CA_DIR", value_name = "DIR", default_value = tls::DEFAULT_CA_DIR)]
    ca_dir: PathBuf,
    /// Serve plain HTTP, unencrypted (behind a TLS-terminating proxy only).
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    insecure_http: bool,
    /// The exchange's PostgreSQL database, created and migrated if missing
    /// [default: postgres://postgres@127.0.0.1:5432/cx].
    #[arg(long, env = "DATABASE_URL", value_name = "URL", hide_env_values = true)]
    database_url: Option<String>,
    /// The model catalog (TOML) [default: the example catalog shipped with cx].
    #[arg(long, env = "CX_CATALOG", value_name = "TOML")]
    catalog: Option<PathBuf>,
    /// The chains served and their contracts (what `anvil/start.sh` writes) [default:
    /// runtime/deployments.json, if present].
    #[arg(long, env = "CX_DEPLOYMENTS", value_name = "JSON")]
    deployments: Option<PathBuf>,
    /// Bundles to register at start (a JSON array of bundles, as `GET /v1/providers` shows
    /// them): a fixture until providers register themselves.
    #[arg(long, env = "CX_BUNDLES", value_name = "JSON")]
    bundles: Option<PathBuf>,
    /// Blocks a chain event must be under before the watcher believes it, on every chain
    /// [default: each chain's finality depth in the deployments file: 0 for `"kind": "anvil"`,
    /// 12 for any other chain, or its own `finality_blocks`].
    #[arg(long, env = "CX_CONFIRMATIONS")]
    confirmations: Option<u64>,
    /// The exchange's ML-DSA-65 identity (a 0600 seed file, made on first start): it signs the
    /// assignments providers and signers check.
    #[arg(
        long,
        env = "CX_IDENTITY",
        value_name = "FILE",
        default_value = "runtime/exchange-identity.key"
    )]
    identity: PathBuf,
    /// Seconds a tab must stay open after a job's deadline, for its settlement.
    #[arg(long, env = "CX_SETTLE_MARGIN_S", default_value_t = DEFAULT_SETTLE_MARGIN_S)]
    settle_margin_s: u64,
    /// The settlement committee, fee and posting key (JSON, `SettlementConfig`): with it, tabs
    /// that close are settled on chain and `GET /v1/claims/…` serves claims; without it, jobs
    /// are only charged in the books.
    #[arg(long, env = "CX_SETTLEMENT", value_name = "JSON")]
    settlement: Option<PathBuf>,
    /// How feasible bundles are ranked: `residency_aware` (the objective, pricing what is not
    /// resident) or `cheapest_capable` (the ask alone: to measure what residency is worth).
    #[arg(long, env = "CX_CLEARING", default_value = "residency_aware")]
    clearing: cx_exchange::clearing::Policy,
    /// How wants naming a task (`task:<name>`, the door's `cx/auto`) pick a model: `efe`
    /// (utility prior minus expected free energy, learned from the meter), `linucb`, or
    /// `fixed:<model>` (to measure regret against one arm).
    #[arg(long, env = "CX_ROUTER", default_value = "efe", value_name = "POLICY")]
    router: cx_exchange_server::task_router::RouterPolicy,
    /// Seconds a provider may go without a fresh offer before it leaves the engine and its
    /// jobs are re-cleared (keep it above the providers' re-registration period, 30 s).
    #[arg(long, env = "CX_PROVIDER_SILENCE_S", default_value_t = cx_exchange_server::intake::PROVIDER_SILENCE_S,
          value_parser = clap::value_parser!(u64).range(1..))]
    provider_silence_s: u64,
    /// Freivalds rounds per returned `cx/matmul-f32` product (tier T2): a wrong product passes
    /// with probability 2^-K, and the check costs about 2K·(mk + kn + mn) FLOPs (1 to 256).
    #[arg(long, env = "CX_FREIVALDS_ROUNDS", value_name = "K",
          default_value_t = cx_exchange_server::orders::matmul::DEFAULT_FREIVALDS_ROUNDS,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new()
              .range(1..=cx_exchange_server::orders::matmul::MAX_FREIVALDS_ROUNDS as u64))]
    freivalds_rounds: usize,
    /// Requests a second one IP address may send (0: no limit); past it, 429 with Retry-After.
    #[arg(long, env = "CX_RATE_PER_IP", value_name = "N",
          default_value_t = cx_exchange_server::limits::RateConfig::default().ip_per_s)]
    rate_per_ip: u32,
    /// Requests one IP address may send at once, above its rate.
    #[arg(long, env = "CX_BURST_PER_IP", value_name = "N",
          default_value_t = cx_exchange_server::limits::RateConfig::default().ip_burst)]
    burst_per_ip: u32,
    /// Signed orders a second one account may send (0: no limit); past it, 429 with
    /// Retry-After.
    #[arg(long, env = "CX_RATE_PER_ACCOUNT", value_name = "N",
          default_value_t = cx_exchange_server::limits::RateConfig::default().account_per_s)]
    rate_per_account: u32,
    /// Signed orders one account may send at once, above its rate.
    #[arg(long, env = "CX_BURST_PER_ACCOUNT", value_name = "N",
          default_value_t = cx_exchange_server::limits::RateConfig::default().account_burst)]
    burst_per_account: u32,
    /// Requests doing work at once (0: no bound); past it, 503 `overloaded` with Retry-After at
    /// once. Long polls, event streams and the OpenAI door's waits are not counted.
    #[arg(long, env = "CX_MAX_IN_FLIGHT", value_name = "N",
          default_value_t = cx_exchange_server::limits::MAX_IN_FLIGHT)]
    max_in_flight: usize,
    /// Bytes of adapters and datasets one account may keep stored (what it stored, each once).
    #[arg(long, env = "CX_STORE_QUOTA_BYTES", value_name = "N",
          default_value_t = cx_exchange_server::books::DEFAULT_STORE_QUOTA_BYTES)]
    store_quota_bytes: u64,
    /// Connections one IP address may hold open at once (0: no limit); past it a new one is
    /// closed at once.
    #[arg(long, env = "CX_MAX_CONNECTIONS_PER_IP", value_name = "N",
          default_value_t = Limits::default().max_connections_per_ip)]
    max_connections_per_ip: usize,
    /// Bytes a second a request body must average after its first 10 s (0: no bound); a
    /// slower one is cut off.
    #[arg(long, env = "CX_MIN_BODY_BYTES_PER_S", value_name = "N",
          default_value_t = Limits::default().body_pace.min_bytes_per_s)]
    min_body_bytes_per_s: u64,
}

/// The registries providers must be staked in: one read-only view per served chain.
fn registries(chains: &[cx_contracts::ChainDeployment]) -> anyhow::Result<Registries> {
    let views = chains
        .iter()
        .map(|c| {
            cx_settlement::onchain::ChainView::connect(c)
                .with_context(|| format!("chain {}", c.chain.chain_id))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(Registries::new(views))
}

/// How the server will speak, decided before anything binds.
enum Edge {
    Dev(DevCa),
    Files(PathBuf),
    Insecure,
}

/// The duties of `--duties`.
#[derive(Clone, Debug)]
struct Duties(Vec<Duty>);

impl std::fmt::Display for Duties {
    /// What a person reads at start: the duties and how they are shared.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() {
            return write!(f, "none (--duties): the other nodes run them");
        }
        let names: Vec<&str> = self.0.iter().map(|d| d.as_str()).collect();
        write!(
            f,
            "{} when this node holds their lease (one node each, cluster-wide)",
            names.join(", ")
        )
    }
}

fn parse_duties(list: &str) -> Result<Duties, String> {
    if list == "none" {
        return Ok(Duties(Vec::new()));
    }
    let mut duties = Vec::new();
    for name in list.split(',') {
        let duty: Duty = name.trim().parse()?;
        if !duties.contains(&duty) {
            duties.push(duty);
        }
    }
    Ok(Duties(duties))
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(serve(args))
}

async fn serve(args: Args) -> anyhow::Result<()> {
    let mut stop = stop_signal_registered();
    // The service's own warnings (a failed watcher pass, a request that failed inside) go to
    // stderr; stdout stays the few lines a person reads.
    let _ = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_writer(std::io::stderr)
        .try_init();
    // Certificates first (cheap, and a bad file should not wait on the database), then the
    // port, then the books: the URL is printed only once all three are ready.
    let (edge, config) = match (&args.tls_cert, &args.tls_key, args.insecure_http) {
        (_, _, true) => (Edge::Insecure, None),
        (Some(cert), Some(key), false) => {
            let identity = Identity::from_pem_files(cert, key).context("--tls-cert/--tls-key")?;
            let config = tls::server_config(identity).context("--tls-cert/--tls-key")?;
            (Edge::Files(cert.clone()), Some(config))
        }
        _ => {
            let ca = DevCa::open_or_create(&args.ca_dir).context("development CA (--ca-dir)")?;
            let config = tls::server_config(ca.server_identity().context("--ca-dir")?)?;
            (Edge::Dev(ca), Some(config))
        }
    };
    let database_url = args
        .database_url
        .clone()
        .unwrap_or_else(books::database_url);
    // Every node binds its port first, so a taken port is said before the database is touched.
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|err| bind_error(args.listen, &err))?;
    let addr = listener.local_addr().context("the listener's address")?;
    let scheme = if matches!(edge, Edge::Insecure) {
        "http"
    } else {
        "https"
    };
    let url = format!("{scheme}://{addr}");
    let advertise = match &args.advertise {
        Some(advertise) => Some(advertise.clone()),
        None if addr.ip().is_unspecified() => None,
        None => Some(url.clone()),
    };
    let unfenced = Books::open(&database_url)
        .await
        .context("opening the books (--database-url or DATABASE_URL)")?;
    let setup = Setup::load(&args, &unfenced)?;
    let limits = edge_limits(&args);
    let service_edge = match &config {
        Some(config) => service::Edge::Https(config.clone()),
        None => service::Edge::InsecureHttp,
    };
    // One writer per database: the lease, then the books tagged with its epoch. A --standby
    // node that finds the lease held serves its port by forwarding to the writer meanwhile.
    let holder = format!("pid {} on {addr}", std::process::id());
    // The duties are campaigned for by every node ready for them, writer or standby, from now on.
    let campaign = Campaign::start(&database_url, &holder, setup.duties(&args));
    let wait = std::time::Duration::from_secs(if args.standby { 0 } else { args.writer_wait_s });
    let taken = tokio::select! {
        taken = Lease::take(&database_url, Seat::Writer, &holder, Some(wait)) => taken,
        () = &mut stop => {
            campaign.stop().await;
            println!("cx serve: stopped");
            return Ok(());
        }
    };
    let lease = match taken {
        Ok(lease) => lease,
        Err(cx_exchange_server::Error::WriterTaken { holder: current }) if args.standby => {
            let forwarder = forwarder(&args, &edge, &unfenced)?;
            // The reads of the books it answers itself, from its own connections; the rest goes
            // to the writer.
            let exchange = setup.identity.public().id().0.into();
            let reads = AppState::reading(unfenced.clone(), rate_config(&args), exchange)
                .with_chain_explorers(chain_explorers(&setup.chains));
            let router = api::reads(reads, std::sync::Arc::new(forwarder).router());
            let front = Front::open(listener, service_edge.clone(), limits, router)
                .context("starting the service")?;
            println!("cx serve: a standby node, forwarding to the writer ({current})");
            println!("  url        {url}");
            println!("  duties     {}", args.duties);
            let lease = tokio::select! {
                lease = Lease::take(&database_url, Seat::Writer, &holder, None) => {
                    lease.context("the database's writer lease")?
                }
                () = &mut stop => {
                    front.close().await;
                    campaign.stop().await;
                    println!("cx serve: stopped");
                    return Ok(());
                }
            };
            println!("cx serve: the writer is gone; this node takes over");
            let front = WriterFront::Taken(front);
            let at = Place {
                front,
                database_url,
                edge,
                url,
                advertise,
            };
            let written = writer(args, setup, lease, at, stop).await;
            campaign.stop().await;
            return written;
        }
        Err(err) => {
            campaign.stop().await;
            return Err(err).context("the database's writer lease");
        }
    };
    unfenced.pool().close().await;
    let at = Place {
        front: WriterFront::Bind(listener, service_edge, limits),
        database_url,
        edge,
        url,
        advertise,
    };
    let written = writer(args, setup, lease, at, stop).await;
    campaign.stop().await;
    written
}

/// What every node reads before it takes a lease: the chains, the exchange's identity and the
/// settlement configuration (a duty may start on a standby).
struct Setup {
    chains: Vec<cx_contracts::ChainDeployment>,
    identity: std::sync::Arc<cx_protocol::pq::Identity>,
    /// `--settlement` and what it holds.
    settlement: Option<(PathBuf, SettlementConfig)>,
}

impl Setup {
    /// Reads them, and checks that a settlement loop can start from them over `books` (its keys
    /// read, its chains known): a node that could never settle says so now, not each time it
    /// takes the duty.
    fn load(args: &Args, books: &Books) -> anyhow::Result<Self> {
        let chains = match (&args.deployments, Path::new(DEFAULT_DEPLOYMENTS).exists()) {
            (Some(path), _) => {
                DeploymentsFile::load(path)
                    .with_context(|| format!("--deployments {}", path.display()))?
                    .chains
            }
            (None, true) => {
                DeploymentsFile::load(Path::new(DEFAULT_DEPLOYMENTS))
                    .with_context(|| format!("{DEFAULT_DEPLOYMENTS} (or pass --deployments)"))?
                    .chains
            }
            (None, false) => Vec::new(),
        };
        if let Some(dir) = args.identity.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("--identity: cannot create {}", dir.display()))?;
        }
        let identity = std::sync::Arc::new(
            cx_settlement::keyfile::load_or_create_identity(&args.identity)
                .with_context(|| format!("--identity {}", args.identity.display()))?,
        );
        let settlement = match &args.settlement {
            None => None,
            Some(path) => Some((
                path.clone(),
                SettlementConfig::load(path)
                    .with_context(|| format!("--settlement {}", path.display()))?,
            )),
        };
        let setup = Self {
            chains,
            identity,
            settlement,
        };
        setup.settler(books.clone(), args.settle_margin_s)?;
        Ok(setup)
    }

    /// A settler over `books` from `--settlement`, with its configuration (`None` without it).
    fn settler(
        &self,
        books: Books,
        settle_margin_s: u64,
    ) -> anyhow::Result<Option<(Settler, &SettlementConfig)>> {
        let Some((path, config)) = &self.settlement else {
            return Ok(None);
        };
        let settler = Settler::new(
            books,
            config,
            &self.chains,
            self.identity.clone(),
            settle_margin_s,
        )
        .with_context(|| format!("--settlement {}", path.display()))?;
        Ok(Some((settler, config)))
    }

    /// What this node runs of `--duties` while it holds their leases: the watchers where it
    /// serves chains, the settlement loop where it settles.
    fn duties(&self, args: &Args) -> Vec<(Duty, Start)> {
        let mut duties = Vec::new();
        for duty in &args.duties.0 {
            match duty {
                Duty::Watch if !self.chains.is_empty() => {
                    let (chains, confirmations) = (self.chains.clone(), args.confirmations);
                    let start: Start = Box::new(move |books, stopped| {
                        chains
                            .iter()
                            .map(|chain| {
                                let watcher = Watcher::new(
                                    books.clone(),
                                    chain.clone(),
                                    chain.chain.confirmations(confirmations),
                                )?;
                                Ok(Box::pin(watcher.run(DUTY_PERIOD, stopped())) as DutyTask)
                            })
                            .collect()
                    });
                    duties.push((Duty::Watch, start));
                }
                Duty::Settlement => {
                    let Some((_, config)) = self.settlement.clone() else {
                        continue;
                    };
                    let (chains, identity) = (self.chains.clone(), self.identity.clone());
                    let margin = args.settle_margin_s;
                    let start: Start = Box::new(move |books, stopped| {
                        let settler =
                            Settler::new(books, &config, &chains, identity.clone(), margin)?;
                        let stopped = stopped();
                        Ok(vec![Box::pin(async move {
                            settler.run(DUTY_PERIOD, stopped).await;
                        }) as DutyTask])
                    });
                    duties.push((Duty::Settlement, start));
                }
                Duty::Watch => {}
            }
        }
        duties
    }
}

/// Where and how a writer serves.
struct Place {
    front: WriterFront,
    database_url: String,
    edge: Edge,
    url: String,
    /// Where the other nodes reach it, once it serves.
    advertise: Option<String>,
}

/// Where a writer serves: a port of its own, or the front it forwarded through until now.
enum WriterFront {
    Bind(TcpListener, service::Edge, Limits),
    Taken(Front),
}

/// A standby's link to the writer, trusting the nodes' certificate authority (plain HTTP between
/// nodes behind --insecure-http).
fn forwarder(args: &Args, edge: &Edge, books: &Books) -> anyhow::Result<Forwarder> {
    let roots = match (&args.peer_ca, edge) {
        (_, Edge::Insecure) => {
            return Forwarder::new(books, None).context("the link to the writer");
        }
        (Some(path), _) => tls::certificates_from_pem_file(path).context("--peer-ca")?,
        (None, Edge::Dev(ca)) => vec![ca.cert().clone()],
        (None, Edge::Files(_)) => {
            return Err(anyhow!(
                "--standby with --tls-cert needs --peer-ca: the certificate authority that signed the nodes' certificates"
            ));
        }
    };
    let tls = tls::client_config(&roots).context("--peer-ca")?;
    Forwarder::new(books, Some(tls)).context("the link to the writer")
}

/// Each chain's block explorer (`chain id → base URL`), where its entry names one.
fn chain_explorers(chains: &[cx_contracts::ChainDeployment]) -> Vec<(u64, String)> {
    chains
        .iter()
        .filter_map(|c| Some((c.chain.chain_id, c.chain.explorer_url.clone()?)))
        .collect()
}

/// The per-address and per-account request limits from the flags.
fn rate_config(args: &Args) -> cx_exchange_server::limits::RateConfig {
    cx_exchange_server::limits::RateConfig {
        ip_per_s: args.rate_per_ip,
        ip_burst: args.burst_per_ip,
        account_per_s: args.rate_per_account,
        account_burst: args.burst_per_account,
    }
}

/// The edge's connection limits from the flags.
fn edge_limits(args: &Args) -> Limits {
    let defaults = Limits::default();
    Limits {
        max_connections_per_ip: args.max_connections_per_ip,
        body_pace: cx_exchange_server::min_rate::Pace {
            min_bytes_per_s: args.min_body_bytes_per_s,
            ..defaults.body_pace
        },
        ..defaults
    }
}

/// The node as the database's writer: the books under its lease, the engine rebuilt from them,
/// the chains, the intake and the duties, served until a stop or the lease's loss; once it
/// serves, it is advertised to the other nodes at `advertise`.
async fn writer(
    args: Args,
    setup: Setup,
    mut lease: Lease,
    at: Place,
    stop: std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>,
) -> anyhow::Result<()> {
    let Place {
        front,
        database_url,
        edge,
        url,
        advertise,
    } = at;
    let books = Books::open_fenced(&database_url, &lease)
        .await
        .context("opening the books (--database-url or DATABASE_URL)")?;
    let catalog = match &args.catalog {
        Some(path) => Catalog::from_toml_str(
            &std::fs::read_to_string(path)
                .with_context(|| format!("cannot read --catalog {}", path.display()))?,
        )
        .with_context(|| format!("--catalog {}", path.display()))?,
        None => Catalog::from_toml_str(DEFAULT_CATALOG).context("the built-in catalog")?,
    };
    let market = Market::new(catalog, Weights::default())?.with_policy(args.clearing);
    let rebuilt = market.load(&books).await.context("rebuilding the engine")?;
    if let Some(path) = &args.bundles {
        for bundle in read_bundles(path)? {
            let id = bundle.id.clone();
            market
                .register(&books, bundle)
                .await
                .with_context(|| format!("--bundles {}: bundle {id}", path.display()))?;
        }
    }
    // The API's settler (claims, tabs' closing); its loop is the settlement duty's.
    let settler = setup
        .settler(books.clone(), args.settle_margin_s)?
        .map(|(settler, config)| (std::sync::Arc::new(settler), config.clone()));
    let Setup {
        chains, identity, ..
    } = setup;
    let identity_hash = identity.id();
    let bundles = market.bundles().len();
    let intake = Intake::new(
        books.clone(),
        market,
        chains
            .iter()
            .map(|c| (c.chain.chain_id, c.deployment.settlement)),
        args.settle_margin_s,
    )
    .with_identity(identity.clone())
    .with_registries(registries(&chains)?)
    .with_provider_silence_s(args.provider_silence_s)
    .with_freivalds_rounds(args.freivalds_rounds)
    .with_router_policy(args.router.clone())
    .with_rate_limits(rate_config(&args))
    .with_max_in_flight(args.max_in_flight)
    .with_store_quota_bytes(args.store_quota_bytes);

    println!("cx serve: the exchange is listening");
    println!("  url        {url}");
    match &edge {
        Edge::Dev(ca) => {
            println!("  ca         {}", ca.cert_path().display());
            println!("  ca sha256  {}", ca.fingerprint_sha256());
            println!(
                "  try        curl --cacert {} {url}/healthz",
                ca.cert_path().display()
            );
        }
        Edge::Files(cert) => println!("  cert       {}", cert.display()),
        Edge::Insecure => {
            eprintln!(
                "warning: --insecure-http: plain HTTP, nothing is encrypted or authenticated"
            );
        }
    }
    println!(
        "  database   {} (migrated; writer epoch {})",
        redact_password(&database_url),
        lease.epoch()
    );
    println!("  bundles    {bundles} ({rebuilt} from the books)");
    println!("  clearing   {}", args.clearing.as_str());
    println!("  router     {}", args.router);
    println!(
        "  identity   {identity_hash} ({}; signs assignments)",
        args.identity.display()
    );
    if chains.is_empty() {
        println!(
            "  chains     none: intents are refused until --deployments names some (anvil/start.sh writes {DEFAULT_DEPLOYMENTS})"
        );
    }
    for chain in &chains {
        println!(
            "  chain      {} at {} (Settlement {}), watched at {} confirmations",
            chain.chain.chain_id,
            chain.chain.rpc_url,
            chain.deployment.settlement,
            chain.chain.confirmations(args.confirmations)
        );
    }
    match &settler {
        Some((_, config)) => println!(
            "  settlement {} of {} signers (≥ {} operators), fee {} bps to {}",
            config.threshold,
            config.committee.len(),
            config.min_operators,
            config.fee.bps,
            config.fee.account
        ),
        None => println!("  settlement none: jobs are charged in the books only (--settlement)"),
    }
    println!("  duties     {}", args.duties);
    println!("  explorer   {url}/explorer");
    println!("Ctrl-C stops it.");

    let explorers = chain_explorers(&chains);
    let mut service = Service::new(intake)
        .with_chain_explorers(explorers)
        .with_forward_token(Some(lease.forward_token().to_owned()));
    if let Some((settler, _)) = settler {
        service = service.with_settler(settler);
    }
    let running = match front {
        WriterFront::Bind(listener, edge, limits) => service
            .with_limits(limits)
            .launch(listener, edge)
            .context("starting the service")?,
        WriterFront::Taken(front) => service.launch_behind(front),
    };
    if let Some(advertise) = &advertise {
        lease
            .advertise(books.pool(), advertise)
            .await
            .context("advertising this node to the cluster")?;
    }
    let lost = tokio::select! {
        () = stop => None,
        lost = lease.lost() => Some(lost),
    };
    running.stop().await;
    books.pool().close().await;
    if let Some(lost) = lost {
        // Another node may be writing now: stop, loudly (a service manager restarts it, as a
        // standby behind the new writer).
        return Err(anyhow::Error::new(lost));
    }
    println!("cx serve: stopped");
    Ok(())
}

/// The `--bundles` fixture: a JSON array of bundles, every field checked, unknown ones refused.
fn read_bundles(path: &Path) -> anyhow::Result<Vec<Bundle>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read --bundles {}", path.display()))?;
    let de = &mut serde_json::Deserializer::from_str(&text);
    serde_path_to_error::deserialize(de)
        .map_err(|e| anyhow!("--bundles {}: {}: {}", path.display(), e.path(), e.inner()))
}

/// A port in use names the flag that changes it; any other failure says which address.
fn bind_error(addr: SocketAddr, err: &io::Error) -> anyhow::Error {
    match err.kind() {
        io::ErrorKind::AddrInUse => anyhow!(
            "{addr} is already in use (another cx serve?); choose another address with --listen or CX_LISTEN"
        ),
        io::ErrorKind::PermissionDenied => anyhow!(
            "may not listen on {addr} ({err}); ports below 1024 need privileges, choose another with --listen"
        ),
        _ => anyhow!("cannot listen on {addr} (--listen): {err}"),
    }
}

/// Ctrl-C, or SIGTERM where there is one (how service managers and containers stop a process).
/// The handlers are registered on the first poll.
pub(super) async fn stop_signal() {
    stop_signal_registered().await;
}

/// [`stop_signal`] with its handlers registered now (inside the runtime), not at the first
/// poll: `cx serve` takes them from its start, so a Ctrl-C while it builds its engine,
/// advertises itself or forwards is a clean stop, not the default kill.
fn stop_signal_registered() -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>> {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) {
            return Box::pin(async move {
                tokio::select! {
                    _ = interrupt.recv() => {}
                    _ = terminate.recv() => {}
                }
            });
        }
    }
    Box::pin(async {
        let _ = tokio::signal::ctrl_c().await;
    })
}
