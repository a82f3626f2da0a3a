//! A market whose exchange a test kills and restarts, agents whose orders the test signs itself,
//! and raw HTTPS requests for what the client library does not show (headers).

use super::agent::Agent;
use super::market::{
    Chain, Exchange, deploy_chain, exchange_ready, gen_model, registered, spawn_exchange_on,
    start_exchange_on, start_provider,
};
use super::process::{Killed, Serve, cx_json, provider_bin};
use super::{MODEL, group_key, path, scratch, strings};
use crate::ScratchDir;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// One HTTP/1.1 request over TLS to `url` (trusting `ca`), for what the client library does
/// not show (headers such as `Retry-After`): the status, the headers (names in lower case) and
/// the body; `None` when no answer came within `timeout`.
pub async fn https_request(
    url: &str,
    ca: &Path,
    method: &str,
    path_and_query: &str,
    body: Option<&Value>,
    timeout: Duration,
) -> Option<(u16, Vec<(String, String)>, String)> {
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = url.trim_start_matches("https://").to_owned();
    let ca = rustls::pki_types::CertificateDer::from_pem_file(ca).unwrap();
    let body = body.map(Value::to_string).unwrap_or_default();
    let exchange = async move {
        let tcp = tokio::net::TcpStream::connect(&address).await.ok()?;
        let config = cx_exchange_server::tls::client_config([&ca]).unwrap();
        let mut stream = tokio_rustls::TlsConnector::from(config)
            .connect(
                rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap(),
                tcp,
            )
            .await
            .ok()?;
        let request = format!(
            "{method} {path_and_query} HTTP/1.1\r\nhost: {address}\r\nconnection: close\r\n\
             content-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        );
        stream.write_all(request.as_bytes()).await.ok()?;
        let mut response = Vec::new();
        // The server may end without close_notify; what arrived is the answer.
        let _ = stream.read_to_end(&mut response).await;
        let text = String::from_utf8_lossy(&response).into_owned();
        let (head, body) = text.split_once("\r\n\r\n")?;
        let mut lines = head.lines();
        let status = lines.next()?.split(' ').nth(1)?.parse().ok()?;
        let headers = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_ascii_lowercase(), v.trim().to_owned()))
            .collect();
        Some((status, headers, body.to_owned()))
    };
    tokio::time::timeout(timeout, exchange).await.ok().flatten()
}

/// A market on one chain whose exchange can be killed and restarted: Anvil with the contracts
/// (no committee: nothing settles on chain), `cx serve` on a fixed address with a fixed
/// identity (so its providers, who pin its key, find it again after a restart), a real
/// `cx-provider` (bundle `p0`) and `agents` agents, each bound and with a tab of `tab_wei`.
pub struct Restartable {
    /// The running `cx serve`.
    pub exchange: Exchange,
    /// A client of it (30 s timeout).
    pub client: cx_client::Client,
    /// Its books, read by tests directly.
    pub books: cx_exchange_server::books::Books,
    /// The agents, each bound with a tab.
    pub agents: Arc<Vec<SigningAgent>>,
    /// The provider (bundle `p0`).
    pub provider: Killed,
    /// The exchange's database.
    pub database_url: String,
    /// Where the exchange listens, across restarts.
    pub listen: String,
    /// The EIP-712 domain the agents sign under.
    pub domain: cx_protocol::order::Eip712Domain,
    /// The chain and its contracts.
    pub chain: Chain,
    /// The market's folder.
    pub dir: ScratchDir,
    /// `cx serve` arguments beyond the defaults, kept for restarts.
    serve_args: Vec<String>,
    /// The other nodes of a cluster ([`Restartable::start_cluster`]): each forwarding to the
    /// writer, by the address it listens on.
    pub standbys: Vec<(String, Serve)>,
    /// In front of a cluster's nodes, on [`Restartable::listen`].
    balancer: Option<crate::balancer::Balancer>,
    /// The nodes' addresses, the balancer's order.
    nodes: Vec<String>,
}

/// An agent whose orders the test signs itself (to send many at once, and again).
pub struct SigningAgent {
    /// Its keys.
    pub keys: cx_client::AgentKeys,
    /// Its tab's escrow id.
    pub tab: u64,
}

impl Restartable {
    /// Starts the market in a fresh `tag` folder on `database_url` with `agents` agents.
    pub async fn start(tag: &str, database_url: &str, agents: usize, tab_wei: u128) -> Self {
        Self::start_with(tag, database_url, agents, tab_wei, &[]).await
    }

    /// [`Restartable::start`] with `serve_args` added to `cx serve`'s.
    pub async fn start_with(
        tag: &str,
        database_url: &str,
        agents: usize,
        tab_wei: u128,
        serve_args: &[&str],
    ) -> Self {
        Self::start_nodes(tag, database_url, agents, tab_wei, serve_args, 1).await
    }

    /// [`Restartable::start`] with the exchange as a cluster of `nodes` `cx serve` processes on
    /// the database, each on a port of its own behind a balancer on [`Restartable::listen`]:
    /// the first writes, the others (`--standby`, [`Restartable::standbys`]) forward to it, so
    /// the agents' and the provider's connections are spread across all of them.
    pub async fn start_cluster(
        tag: &str,
        database_url: &str,
        agents: usize,
        tab_wei: u128,
        nodes: usize,
    ) -> Self {
        Self::start_nodes(tag, database_url, agents, tab_wei, &[], nodes).await
    }

    async fn start_nodes(
        tag: &str,
        database_url: &str,
        agents: usize,
        tab_wei: u128,
        serve_args: &[&str],
        nodes: usize,
    ) -> Self {
        let bin = provider_bin();
        let dir = scratch(tag);
        let serve_args = strings(serve_args);
        // Keys: 0 deploys, 1 the provider, 2.. the agents, the last one a second provider.
        let chain = deploy_chain(&dir.path, 3 + agents as u32, group_key(), 1_200).await;
        let listen = format!("127.0.0.1:{}", crate::free_port().unwrap());
        let node_addresses: Vec<String> = match nodes {
            0 | 1 => vec![listen.clone()],
            _ => (0..nodes)
                .map(|_| format!("127.0.0.1:{}", crate::free_port().unwrap()))
                .collect(),
        };
        let mut exchange = Self::serve(
            &node_addresses[0],
            &dir.path,
            &chain.deployments,
            database_url,
            &serve_args,
        )
        .await;
        let mut standbys = Vec::new();
        for address in node_addresses.iter().skip(1) {
            let args = Self::exchange_args(&dir.path, &serve_args, true);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let mut serve =
                spawn_exchange_on(address, &dir.path, &chain.deployments, database_url, &args);
            // It listens (and forwards) once it printed its URL.
            let said = tokio::task::block_in_place(|| serve.field("cx serve:"));
            assert!(said.starts_with("a standby node"), "{said}");
            tokio::task::block_in_place(|| serve.field("url"));
            standbys.push((address.clone(), serve));
        }
        let balancer = (nodes > 1).then(|| {
            let listener = std::net::TcpListener::bind(&listen).unwrap();
            listener.set_nonblocking(true).unwrap();
            let listener = tokio::net::TcpListener::from_std(listener).unwrap();
            let addresses = node_addresses.iter().map(|a| a.parse().unwrap()).collect();
            crate::balancer::Balancer::start(listener, addresses)
        });
        exchange.url = format!("https://{listen}");
        let client = cx_client::Client::new(&exchange.url, Some(&exchange.ca))
            .unwrap()
            .with_timeout(Duration::from_secs(30));
        let model = gen_model(&bin, &dir.path);
        let provider = start_provider(
            &bin,
            &dir.path,
            "p0",
            &model,
            &exchange,
            &chain.deployments,
            &chain.anvil.keys[1],
            "1000",
            &[],
        );
        let mut signing = Vec::new();
        for n in 0..agents {
            let home = dir.path.join(format!("agent-{n}"));
            std::fs::create_dir_all(&home).unwrap();
            let secret = alloy::primitives::B256::from(chain.anvil.keys[2 + n].to_bytes());
            let agent = Agent::import(&home, &exchange, secret).await;
            cx_json(agent.args(&["bind", "--json"]), String::new()).await;
            let tab = agent.open_tab(&client, tab_wei, &chain.deployments).await;
            let keys = cx_client::AgentKeys::load(&home.join("agent.json")).unwrap();
            signing.push(SigningAgent { keys, tab });
        }
        registered(&client, "p0").await;
        let books = cx_exchange_server::books::Books::open(database_url)
            .await
            .unwrap();
        let domain = cx_protocol::order::domain(31337, chain.deployment.settlement);
        Self {
            exchange,
            client,
            books,
            agents: Arc::new(signing),
            provider,
            database_url: database_url.to_owned(),
            listen,
            domain,
            chain,
            dir,
            serve_args,
            standbys,
            balancer,
            nodes: node_addresses,
        }
    }

    async fn serve(
        listen: &str,
        dir: &Path,
        deployments: &Path,
        database_url: &str,
        extra: &[String],
    ) -> Exchange {
        let args = Self::exchange_args(dir, extra, false);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        start_exchange_on(listen, dir, deployments, database_url, &args).await
    }

    /// `cx serve`'s flags beyond [`spawn_exchange_on`]'s: the market's identity (kept across
    /// restarts and shared with a standby), no rate limits (the tests send bursts on purpose),
    /// `extra`, and `--standby` when asked.
    fn exchange_args(dir: &Path, extra: &[String], standby: bool) -> Vec<String> {
        let mut args = strings(&[
            "--identity",
            path(&dir.join("exchange.key")),
            "--rate-per-account",
            "0",
            "--rate-per-ip",
            "0",
        ]);
        if standby {
            args.push("--standby".into());
        }
        args.extend(extra.iter().cloned());
        args
    }

    /// A second provider, `name`, on the same model with its own key (the chain's last) and
    /// `ask_wei_per_s`; it is registered when this returns.
    pub async fn second_provider(&self, name: &str, ask_wei_per_s: &str) -> Killed {
        let bin = provider_bin();
        let key = self.chain.anvil.keys.last().expect("funded keys");
        let provider = start_provider(
            &bin,
            &self.dir.path,
            name,
            &self.dir.path.join("model"),
            &self.exchange,
            &self.chain.deployments,
            key,
            ask_wei_per_s,
            &[],
        );
        registered(&self.client, name).await;
        provider
    }

    /// SIGKILLs `cx serve`.
    pub fn kill_exchange(&mut self) {
        self.exchange.serve.kill();
    }

    /// After [`Restartable::kill_exchange`] in a cluster: waits until a standby holds the lease
    /// the dead writer held (the epoch raised), which is the exchange from then on (still
    /// reached through the balancer); returns its address.
    pub async fn take_over(&mut self) -> String {
        let before: i64 = sqlx::query_scalar("SELECT epoch FROM exchange_writer")
            .fetch_one(self.books.pool())
            .await
            .unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let holder = loop {
            let (epoch, holder): (i64, String) =
                sqlx::query_as("SELECT epoch, holder FROM exchange_writer")
                    .fetch_one(self.books.pool())
                    .await
                    .unwrap();
            if epoch > before {
                break holder;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no standby took the lease"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let at = self
            .standbys
            .iter()
            .position(|(address, _)| holder.ends_with(&format!(" on {address}")))
            .unwrap_or_else(|| panic!("the new writer ({holder}) is one of the standbys"));
        let (address, serve) = self.standbys.remove(at);
        let url = format!("https://{}", self.listen);
        self.exchange = exchange_ready(serve).await;
        self.exchange.url = url;
        address
    }

    /// The nodes' addresses (one: the exchange's own; a cluster's: behind the balancer).
    pub fn nodes(&self) -> &[String] {
        &self.nodes
    }

    /// Whether the exchange runs as a cluster behind a balancer.
    pub fn is_cluster(&self) -> bool {
        self.balancer.is_some()
    }

    /// Starts `cx serve` again on the same address, books, CA and identity.
    pub async fn restart_exchange(&mut self) {
        self.exchange.serve.kill();
        self.exchange = Self::serve(
            &self.listen,
            &self.dir.path,
            &self.chain.deployments,
            &self.database_url,
            &self.serve_args,
        )
        .await;
    }

    /// Agent `agent`'s intent with `nonce` (see [`Signer::intent`]).
    pub fn intent(
        &self,
        agent: usize,
        nonce: u64,
        max_price_wei: u128,
        deadline_in_s: u64,
    ) -> Value {
        self.signer()
            .intent(agent, nonce, max_price_wei, deadline_in_s)
    }

    /// What signs the agents' intents, for tasks of their own.
    pub fn signer(&self) -> Signer {
        Signer {
            agents: self.agents.clone(),
            domain: self.domain.clone(),
            url: self.exchange.url.clone(),
            ca: self.exchange.ca.clone(),
        }
    }

    /// `POST /v1/intents` with `body` (see [`Signer::post_intent`]).
    pub async fn post_intent(&self, body: &Value) -> Option<Answer> {
        self.signer().post_intent(body).await
    }
}

/// An answer: its status, its headers (names in lower case) and its JSON body (a string when
/// the body is not JSON).
pub type Answer = (u16, Vec<(String, String)>, Value);

/// The agents of a [`Restartable`] market and where its exchange listens (the same address
/// across restarts).
#[derive(Clone)]
pub struct Signer {
    agents: Arc<Vec<SigningAgent>>,
    domain: cx_protocol::order::Eip712Domain,
    url: String,
    ca: PathBuf,
}

impl Signer {
    /// Agent `agent`'s intent with `nonce` on its tab for a short completion, due in
    /// `deadline_in_s`, within `max_price_wei`; the body `POST /v1/intents` takes.
    pub fn intent(
        &self,
        agent: usize,
        nonce: u64,
        max_price_wei: u128,
        deadline_in_s: u64,
    ) -> Value {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs();
        let request = cx_protocol::order::InferenceRequest {
            prompt: format!("Say hello to agent {agent}, order {nonce}."),
            max_tokens: 4,
            ..Default::default()
        };
        let intent = cx_protocol::order::Intent {
            want: MODEL.into(),
            adapter_id: None,
            request_hash: cx_protocol::order::request_hash(&request),
            deadline_s: now + deadline_in_s,
            max_price_wei,
            market_limit: false,
            min_tier: cx_protocol::Tier::T0,
            determinism: cx_protocol::DeterminismClass::D,
            tab_id: self.agents[agent].tab,
            nonce,
            expiry_s: now + 120,
        };
        let signed = self.agents[agent].keys.sign(intent, &self.domain).unwrap();
        serde_json::json!({ "intent": signed, "request": request })
    }

    /// `POST /v1/intents` with `body`: the status, the headers and the answer; `None` when no
    /// answer came (the exchange is down, or died before it answered).
    pub async fn post_intent(&self, body: &Value) -> Option<Answer> {
        let (status, headers, text) = https_request(
            &self.url,
            &self.ca,
            "POST",
            "/v1/intents",
            Some(body),
            Duration::from_secs(30),
        )
        .await?;
        let value = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Some((status, headers, value))
    }
}
