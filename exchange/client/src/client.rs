//! [`Client`]: one typed method per exchange endpoint, over one keep-alive connection pool.

use crate::error::{Error, Result};
use crate::tls::{self, Connector, TlsInfo};
use crate::types::{
    Accepted, Bound, ChainInfo, ErrorBody, Health, InferenceRequest, JobRecord, JobsQuery,
    MarketQuote, ModelInfo, OpenSession, Output, Pull, Pulled, Registered, ResultSubmission,
    SessionInfo, SessionOpened, Tab,
};
use crate::types::{
    AdapterFiles, Assignment, Claim, Completed, IntentSubmission, StandingAccepted, StoredAdapter,
    StoredDataset, Workload,
};
use bytes::Bytes;
use cx_protocol::Bundle;
use cx_protocol::access::{AccessGrant, Scope};
use cx_protocol::offer::SignedOffer;
use cx_protocol::order::{B256, Binding, Intent, Kind, SessionGrant, Signed, SigningKey};
use cx_protocol::receipt::SignedReceipt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::{Method, Request, Uri, header};
use hyper_util::client::legacy;
use hyper_util::rt::TokioExecutor;
use rustls::ClientConfig;
use serde::Serialize;
use serde::de::DeserializeOwned;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// How long a request may take, connect and answer together, unless [`Client::with_timeout`]
/// says otherwise.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer body read, bytes (a job list of 500 decisions fits many times over).
const MAX_BODY_BYTES: usize = 32 << 20;

/// A client of one exchange. Cheap to clone: clones share the connection pool, so many tasks can
/// submit over the same few keep-alive connections.
#[derive(Clone)]
pub struct Client {
    base: String,
    http: legacy::Client<Connector, Full<Bytes>>,
    timeout: Duration,
    account: Option<Account>,
}

/// How a client proves which account it acts for ([`Client::with_credential`]): job reads are
/// the buyer's, and storing adapters and datasets counts against an account's quota.
#[derive(Clone)]
pub enum Credential {
    /// The account's own key: each request carries a fresh signed access credential
    /// ([`cx_protocol::access`]) for this exchange, scoped to what it does.
    Account(SigningKey),
    /// One of the account's session keys (`Authorization: Bearer`).
    Session(String),
}

/// A [`Credential`] with the exchange's key hash, learnt once (`GET /v1/exchange`).
#[derive(Clone)]
struct Account {
    how: Credential,
    exchange: Arc<tokio::sync::OnceCell<B256>>,
}

/// How long each signed access credential is good for: a minute is plenty for one request and
/// bounds what a copied header can do.
const CREDENTIAL_S: u64 = 60;

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client")
            .field("base", &self.base)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl Client {
    /// A client of the exchange at `base_url` (`https://host:port`, optionally with a path
    /// prefix). With `ca_pem_path`, exactly the CA certificates in that PEM file are trusted (the
    /// devnet's `runtime/ca/ca.pem`); without it, Mozilla's public roots. Plain `http://` is used
    /// only when the URL says so.
    pub fn new(base_url: &str, ca_pem_path: Option<&Path>) -> Result<Self> {
        let (base, https) = parse_base(base_url)?;
        let config = match (https, ca_pem_path) {
            (false, _) => None,
            (true, Some(path)) => Some(tls::client_config(tls::roots_from_pem_file(path)?)?),
            (true, None) => Some(tls::client_config(tls::public_roots())?),
        };
        Ok(Self::build(base, config))
    }

    /// A client with a TLS configuration of the caller's (its own roots, a client certificate);
    /// use [`tls::client_config`] to keep the post-quantum key exchange first.
    pub fn with_tls_config(base_url: &str, config: Arc<ClientConfig>) -> Result<Self> {
        let (base, _) = parse_base(base_url)?;
        Ok(Self::build(base, Some(config)))
    }

    fn build(base: String, config: Option<Arc<ClientConfig>>) -> Self {
        let http = legacy::Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(60))
            .pool_max_idle_per_host(64)
            .build(Connector::new(config, Duration::from_secs(10)));
        Self {
            base,
            http,
            timeout: DEFAULT_TIMEOUT,
            account: None,
        }
    }

    /// The same client acting for `how`'s account: reading its jobs (`GET /v1/jobs…` refuses a
    /// caller without the buyer's credential) and storing adapters and datasets under its quota.
    pub fn with_credential(mut self, how: Credential) -> Self {
        self.account = Some(Account {
            how,
            exchange: Arc::new(tokio::sync::OnceCell::new()),
        });
        self
    }

    /// The same client with another per-request timeout.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The exchange's base URL, without a trailing slash.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    // ---- identity and orders ------------------------------------------------------------------

    /// `POST /v1/bindings`: binds the account to its ML-DSA-65 key (both halves signed; see
    /// [`Binding::sign`] or [`crate::AgentKeys::binding`]). Binding the same key again is a no-op.
    pub async fn bind(&self, binding: &Binding) -> Result<Bound> {
        self.send(Method::POST, "/v1/bindings", Some(binding)).await
    }

    /// `POST /v1/intents`: submits a signed intent and the request its `request_hash` commits
    /// to; the exchange verifies, clears and holds the charge on the tab before it answers.
    pub async fn submit_intent(
        &self,
        intent: &Signed<Intent>,
        request: &InferenceRequest,
    ) -> Result<Accepted> {
        self.submit(intent, request.clone().into()).await
    }

    /// `POST /v1/intents` with a workload of any kind under its key: the one way every kind
    /// is submitted ([`Client::submit_intent`], [`Client::submit_matmul`] and
    /// [`Client::submit_train`] name the kinds the exchange has always had).
    pub async fn submit(&self, intent: &Signed<Intent>, workload: Workload) -> Result<Accepted> {
        let body = IntentSubmission::new(intent.clone(), workload);
        self.send(Method::POST, "/v1/intents", Some(&body)).await
    }

    /// `POST /v1/intents` for a product `C = A·B` (the intent's `want` is `cx/matmul-f32`, its
    /// `min_tier` T2, its `request_hash` [`cx_protocol::matmul::MatmulRequest::hash`]); the job's
    /// product comes back in [`Client::job`] once done ([`JobRecord::checked_product`]).
    pub async fn submit_matmul(
        &self,
        intent: &Signed<Intent>,
        matmul: &cx_protocol::matmul::MatmulRequest,
    ) -> Result<Accepted> {
        self.submit(intent, (*matmul).into()).await
    }

    // ---- session keys and the OpenAI-compatible door -----------------------------------------

    /// `POST /v1/sessions`: stores a signed session grant; the bearer of the secret whose SHA-256
    /// is its `bearer_hash` may then spend from its tab within its cap.
    pub async fn open_session(&self, grant: &Signed<SessionGrant>) -> Result<SessionOpened> {
        self.send(Method::POST, "/v1/sessions", Some(&OpenSession { grant }))
            .await
    }

    /// `GET /v1/sessions/{id}` with the session's bearer key.
    pub async fn session(&self, id: B256, bearer: &str) -> Result<SessionInfo> {
        self.send_as::<_, ()>(
            Method::GET,
            &format!("/v1/sessions/{id}"),
            None,
            Some(bearer),
        )
        .await
    }

    /// `DELETE /v1/sessions/{id}` with the session's bearer key: later calls are refused.
    pub async fn revoke_session(&self, id: B256, bearer: &str) -> Result<serde_json::Value> {
        self.send_as::<_, ()>(
            Method::DELETE,
            &format!("/v1/sessions/{id}"),
            None,
            Some(bearer),
        )
        .await
    }

    /// `POST /v1/chat/completions` with a session key: an OpenAI chat completion request (not
    /// streamed) in, the completion out. The answer comes when a provider's result is in, so
    /// give the client a timeout past the call's deadline ([`Client::with_timeout`]).
    pub async fn chat(&self, bearer: &str, body: &serde_json::Value) -> Result<serde_json::Value> {
        self.send_as(
            Method::POST,
            "/v1/chat/completions",
            Some(body),
            Some(bearer),
        )
        .await
    }

    // ---- adapters -----------------------------------------------------------------------------

    /// `PUT /v1/adapters`: stores an adapter's `adapter_config.json` text and
    /// `adapter_model.safetensors` bytes under their content id (checked against `id` when
    /// given), owned by the account of [`Client::with_credential`] and counted against its
    /// store quota; an intent or a call then names it by that id.
    pub async fn put_adapter(
        &self,
        config: &str,
        weights: &[u8],
        id: Option<&str>,
    ) -> Result<StoredAdapter> {
        use base64::Engine as _;
        let body = AdapterFiles {
            id,
            adapter_config: config,
            adapter_model_safetensors_base64: base64::engine::general_purpose::STANDARD
                .encode(weights),
        };
        let body =
            serde_json::to_vec(&body).expect("request bodies are plain data and always serialize");
        self.send_scoped(
            Method::PUT,
            "/v1/adapters",
            Some(Bytes::from(body)),
            Scope::Store,
        )
        .await
    }

    /// `PUT /v1/datasets`: stores a training dataset file (`{"sequences": …, "loss_mask": …}`,
    /// [`cx_protocol::train::Dataset`]) as sent, under its content id
    /// ([`cx_protocol::train::dataset_id`] of these bytes), which a train order's `data` names;
    /// owned by the account of [`Client::with_credential`], counted against its store quota.
    pub async fn put_dataset(&self, file: &[u8]) -> Result<StoredDataset> {
        let body = Some(Bytes::copy_from_slice(file));
        self.send_scoped(Method::PUT, "/v1/datasets", body, Scope::Store)
            .await
    }

    /// `POST /v1/intents` for a train order (the intent's `want` is `cx/train/<base>`, its
    /// `request_hash` [`cx_protocol::train::TrainRequest::hash`]); the trained adapter's id
    /// comes back in [`Client::job`] once done ([`JobRecord::trained`]).
    pub async fn submit_train(
        &self,
        intent: &Signed<Intent>,
        train: &cx_protocol::train::TrainRequest,
    ) -> Result<Accepted> {
        self.submit(intent, train.clone().into()).await
    }

    // ---- providers ----------------------------------------------------------------------------

    /// `POST /v1/providers/register`: registers a provider's signed offer of bundles.
    pub async fn register_provider(&self, offer: &SignedOffer) -> Result<Registered> {
        self.send(Method::POST, "/v1/providers/register", Some(offer))
            .await
    }

    /// `POST /v1/providers/jobs` with the provider's dispatch token: up to `max_jobs` assigned
    /// jobs, waiting up to `wait_s` seconds for one (give the client a longer timeout).
    pub async fn pull_jobs(
        &self,
        token: &str,
        max_jobs: u32,
        wait_s: u32,
    ) -> Result<Vec<Assignment>> {
        let body = Pull { max_jobs, wait_s };
        let pulled: Pulled = self
            .send_as(Method::POST, "/v1/providers/jobs", Some(&body), Some(token))
            .await?;
        Ok(pulled.jobs)
    }

    /// `POST /v1/jobs/{id}/result` with the provider's dispatch token: the output and its signed
    /// receipt ([`crate::provider::sign_receipt`]).
    pub async fn submit_result(
        &self,
        token: &str,
        job_id: B256,
        output: &Output,
        receipt: &SignedReceipt,
    ) -> Result<Completed> {
        let body = ResultSubmission {
            output: output.clone(),
            receipt: receipt.clone(),
        };
        self.send_as(
            Method::POST,
            &format!("/v1/jobs/{job_id}/result"),
            Some(&body),
            Some(token),
        )
        .await
    }

    // ---- jobs and tabs ------------------------------------------------------------------------

    /// `GET /v1/jobs/{id}` with the account's credential ([`Client::with_credential`]): the
    /// job, its output once the buyer owes for it.
    pub async fn job(&self, id: B256) -> Result<JobRecord> {
        self.get_as_account(&format!("/v1/jobs/{id}")).await
    }

    /// `GET /v1/jobs?account=&status=&limit=`: an account's jobs, newest first.
    pub async fn jobs(&self, query: &JobsQuery) -> Result<Vec<JobRecord>> {
        let mut path = format!("/v1/jobs?account={}", query.account);
        if let Some(status) = &query.status {
            path.push_str("&status=");
            path.push_str(&percent_encode(status));
        }
        if let Some(limit) = query.limit {
            path.push_str(&format!("&limit={limit}"));
        }
        self.get_as_account(&path).await
    }

    /// `GET /v1/tabs/{chain_id}/{escrow_id}`: the tab as the books see it (once the chain
    /// watcher has mirrored the escrow's `JobOpened`).
    pub async fn tab(&self, chain_id: u64, escrow_id: u64) -> Result<Tab> {
        self.get(&format!("/v1/tabs/{chain_id}/{escrow_id}")).await
    }

    /// `POST /v1/searches`: submits a signed search (a SHA-256 preimage below a target, paid
    /// to the first provider whose witness checks); answers with the standing order (its id,
    /// what it holds, when it ends).
    pub async fn submit_search(
        &self,
        search: &Signed<cx_protocol::order::Search>,
    ) -> Result<StandingAccepted> {
        self.send(
            Method::POST,
            "/v1/searches",
            Some(&serde_json::json!({ "search": search })),
        )
        .await
    }

    /// `POST /v1/rents`: submits a signed rent (an adapter kept resident for a term); answers
    /// with the standing order, `committed` at once to the bundle that holds it, or refuses it
    /// (`no_capable_bundle`) holding nothing. `GET /v1/orders/{id}` then shows the bundle, the
    /// measured residency and the rebate.
    pub async fn submit_rent(
        &self,
        rent: &Signed<cx_protocol::order::Rent>,
    ) -> Result<StandingAccepted> {
        self.send(
            Method::POST,
            "/v1/rents",
            Some(&serde_json::json!({ "rent": rent })),
        )
        .await
    }

    /// `POST /v1/reserves`: submits a signed reserve (capacity over a window, take-or-pay);
    /// answers with the standing order (its id, what it holds, when it ends). Providers bid
    /// until the window starts; `GET /v1/orders/{id}` then shows the winner, draws and charge.
    pub async fn submit_reserve(
        &self,
        reserve: &Signed<cx_protocol::order::Reserve>,
    ) -> Result<StandingAccepted> {
        self.send(
            Method::POST,
            "/v1/reserves",
            Some(&serde_json::json!({ "reserve": reserve })),
        )
        .await
    }

    /// `GET /v1/orders/{id}`: a standing order (reserve, rent, search) and its status.
    pub async fn standing_order(&self, id: cx_protocol::order::B256) -> Result<serde_json::Value> {
        self.get(&format!("/v1/orders/{id}")).await
    }

    /// `POST /v1/tabs/{chain_id}/{escrow_id}/close`: asks the exchange to settle the tab now,
    /// signed by `keys`' ML-DSA identity for the chain's `settlement` contract; the tab takes
    /// no more jobs and the next batch pays what it spent and returns the rest.
    pub async fn close_tab(
        &self,
        keys: &crate::AgentKeys,
        chain_id: u64,
        settlement: cx_protocol::order::Address,
        escrow_id: u64,
    ) -> Result<Tab> {
        use cx_protocol::tab_close::{TAB_CLOSE_CONTEXT, tab_close_message};
        let signature = keys.identity().sign(
            TAB_CLOSE_CONTEXT,
            &tab_close_message(chain_id, settlement, escrow_id),
        )?;
        let body = serde_json::json!({
            "account": keys.account(),
            "mldsa_signature": format!("0x{}", hex::encode(signature)),
        });
        self.send(
            Method::POST,
            &format!("/v1/tabs/{chain_id}/{escrow_id}/close"),
            Some(&body),
        )
        .await
    }

    /// `GET /v1/claims/{chain_id}/{account}`: `account`'s credit on `chain_id` and its proof.
    pub async fn claim(
        &self,
        chain_id: u64,
        account: cx_protocol::order::Address,
    ) -> Result<Claim> {
        self.get(&format!("/v1/claims/{chain_id}/{account}")).await
    }

    // ---- market data --------------------------------------------------------------------------

    /// `GET /v1/chains`: the chains served and their Settlement contracts (the EIP-712 domains).
    pub async fn chains(&self) -> Result<Vec<ChainInfo>> {
        self.get("/v1/chains").await
    }

    /// `GET /v1/eip712/{kind}?chain_id=`: the `{types, primaryType, domain}` a wallet's
    /// `eth_signTypedData_v4` takes for `kind` on `chain_id`.
    pub async fn eip712(&self, kind: Kind, chain_id: u64) -> Result<serde_json::Value> {
        self.get(&format!("/v1/eip712/{kind}?chain_id={chain_id}"))
            .await
    }

    /// `GET /v1/models`: the catalog.
    pub async fn models(&self) -> Result<Vec<ModelInfo>> {
        #[derive(serde::Deserialize)]
        struct List {
            data: Vec<ModelInfo>,
        }
        let list: List = self.get("/v1/models").await?;
        Ok(list.data)
    }

    /// `GET /v1/market`: every open market's quote and regime.
    pub async fn market(&self) -> Result<Vec<MarketQuote>> {
        self.get("/v1/market").await
    }

    /// `GET /v1/providers`: the registered bundles.
    pub async fn providers(&self) -> Result<Vec<Bundle>> {
        self.get("/v1/providers").await
    }

    // ---- operations ---------------------------------------------------------------------------

    /// `GET /healthz`.
    pub async fn health(&self) -> Result<Health> {
        self.get("/healthz").await
    }

    /// `GET /metrics`: Prometheus text.
    pub async fn metrics(&self) -> Result<String> {
        let (_, bytes, _) = self.call(Method::GET, "/metrics", None, None).await?;
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// What the pooled connection negotiated, read off a `GET /healthz`: `None` over plain
    /// HTTP, else the TLS key exchange group (`X25519MLKEM768` against our exchange), version,
    /// cipher suite and ALPN.
    pub async fn connection_info(&self) -> Result<Option<TlsInfo>> {
        let (_, _, tls) = self.call(Method::GET, "/healthz", None, None).await?;
        Ok(tls)
    }

    // ---- plumbing -----------------------------------------------------------------------------

    async fn get<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send::<T, ()>(Method::GET, path, None).await
    }

    /// The `Authorization` value for `scope` from the account's credential (none without
    /// [`Client::with_credential`]: the exchange then answers 401, which says what to send).
    async fn authorization(&self, scope: Scope) -> Result<Option<String>> {
        let Some(Account { how, exchange }) = &self.account else {
            return Ok(None);
        };
        let key = match how {
            Credential::Session(key) => return Ok(Some(format!("Bearer {key}"))),
            Credential::Account(key) => key,
        };
        let exchange = *exchange
            .get_or_try_init(|| async {
                let info: serde_json::Value = self.get("/v1/exchange").await?;
                info["mldsa_key_hash"]
                    .as_str()
                    .and_then(|h| h.parse::<B256>().ok())
                    .ok_or_else(|| Error::Decode {
                        method: "GET",
                        path: "/v1/exchange".into(),
                        source: serde::de::Error::custom(
                            "no mldsa_key_hash: an exchange names its key there",
                        ),
                    })
            })
            .await?;
        let now_s = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let grant = AccessGrant {
            scope,
            account: cx_protocol::order::account_of(key),
            exchange,
            expires_s: now_s + CREDENTIAL_S,
        };
        Ok(Some(grant.authorization(key)))
    }

    /// A GET with the account's read credential.
    async fn get_as_account<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.send_scoped(Method::GET, path, None, Scope::Read).await
    }

    /// A request carrying the account's credential for `scope`, its JSON answer.
    async fn send_scoped<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        scope: Scope,
    ) -> Result<T> {
        let authorization = self.authorization(scope).await?;
        self.call_json(method, path, body, authorization.as_deref())
            .await
    }

    async fn send<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
    ) -> Result<T> {
        self.send_as(method, path, body, None).await
    }

    /// [`Client::send`] with `Authorization: Bearer` when `bearer` is given.
    async fn send_as<T: DeserializeOwned, B: Serialize + ?Sized>(
        &self,
        method: Method,
        path: &str,
        body: Option<&B>,
        bearer: Option<&str>,
    ) -> Result<T> {
        let body = body
            .map(|b| serde_json::to_vec(b).map(Bytes::from))
            .transpose()
            .expect("request bodies are plain data and always serialize");
        let authorization = bearer.map(|token| format!("Bearer {token}"));
        self.call_json(method, path, body, authorization.as_deref())
            .await
    }

    /// [`Client::call`], its answer decoded as JSON.
    async fn call_json<T: DeserializeOwned>(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        authorization: Option<&str>,
    ) -> Result<T> {
        let method_name = method_name(&method);
        let (_, bytes, _) = self.call(method, path, body, authorization).await?;
        serde_json::from_slice(&bytes).map_err(|source| Error::Decode {
            method: method_name,
            path: strip_query(path).to_owned(),
            source,
        })
    }

    /// One request, with `authorization` as its `Authorization` header when given: its status,
    /// body and the connection's TLS details, or the server's error.
    async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<Bytes>,
        authorization: Option<&str>,
    ) -> Result<(u16, Bytes, Option<TlsInfo>)> {
        let url = format!("{}{path}", self.base);
        let method_name = method_name(&method);
        let uri: Uri = url.parse().map_err(|e| Error::InvalidUrl {
            url: url.clone(),
            reason: format!("{e}"),
        })?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri)
            .header(header::ACCEPT, "application/json")
            .header(
                header::USER_AGENT,
                concat!("cx-client/", env!("CARGO_PKG_VERSION")),
            );
        if body.is_some() {
            request = request.header(header::CONTENT_TYPE, "application/json");
        }
        if let Some(value) = authorization {
            request = request.header(header::AUTHORIZATION, value);
        }
        let request = request
            .body(Full::new(body.unwrap_or_default()))
            .map_err(|e| Error::InvalidUrl {
                url: url.clone(),
                reason: e.to_string(),
            })?;
        let transport = |reason: String| Error::Transport {
            method: method_name,
            url: url.clone(),
            reason,
        };
        let exchange = async {
            let response = self
                .http
                .request(request)
                .await
                .map_err(|e| transport(causes(&e)))?;
            let status = response.status().as_u16();
            let tls = response.extensions().get::<TlsInfo>().cloned();
            let bytes = Limited::new(response.into_body(), MAX_BODY_BYTES)
                .collect()
                .await
                .map_err(|e| transport(format!("reading the answer: {}", causes(&*e))))?
                .to_bytes();
            Ok::<_, Error>((status, bytes, tls))
        };
        let (status, bytes, tls) = tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| Error::Timeout {
                method: method_name,
                url: url.clone(),
                timeout_s: self.timeout.as_secs(),
            })??;
        if (200..300).contains(&status) {
            return Ok((status, bytes, tls));
        }
        Err(match serde_json::from_slice::<ErrorBody>(&bytes) {
            Ok(ErrorBody { error }) => Error::Api {
                status,
                code: error.code,
                message: error.message,
                field: error.field,
            },
            Err(_) => Error::UnexpectedStatus {
                method: method_name,
                path: strip_query(path).to_owned(),
                status,
                body: String::from_utf8_lossy(&bytes[..bytes.len().min(200)]).replace('\n', " "),
            },
        })
    }
}

/// Checks the base URL: `http` or `https`, a host, no query; returns it without a trailing slash
/// and whether it is `https`.
fn parse_base(base_url: &str) -> Result<(String, bool)> {
    let invalid = |reason: &str| Error::InvalidUrl {
        url: base_url.to_owned(),
        reason: reason.to_owned(),
    };
    let uri: Uri = base_url
        .parse()
        .map_err(|e| invalid(&format!("not a URL ({e})")))?;
    let https = match uri.scheme_str() {
        Some("https") => true,
        Some("http") => false,
        Some(other) => {
            return Err(invalid(&format!(
                "scheme `{other}`: use https:// (or http:// for an exchange behind --insecure-http)"
            )));
        }
        None => return Err(invalid("no scheme: write https://HOST:PORT")),
    };
    if uri.host().is_none_or(str::is_empty) {
        return Err(invalid("no host"));
    }
    if uri.query().is_some() {
        return Err(invalid("a base URL takes no query"));
    }
    Ok((base_url.trim_end_matches('/').to_owned(), https))
}

fn method_name(method: &Method) -> &'static str {
    match *method {
        Method::GET => "GET",
        Method::POST => "POST",
        Method::PUT => "PUT",
        Method::DELETE => "DELETE",
        _ => "request",
    }
}

fn strip_query(path: &str) -> &str {
    path.split_once('?').map_or(path, |(p, _)| p)
}

/// An error and its causes, outermost first, on one line (hyper's own message is terse; the
/// cause — refused, certificate unknown — is in the chain).
fn causes(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        let text = cause.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = cause.source();
    }
    parts.join(": ")
}

/// Percent-encodes a query value (RFC 3986 unreserved characters pass as they are).
fn percent_encode(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for byte in value.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base_urls_need_a_scheme_and_a_host_and_lose_their_trailing_slash() {
        assert_eq!(
            parse_base("https://127.0.0.1:8443/").unwrap(),
            ("https://127.0.0.1:8443".to_owned(), true)
        );
        assert_eq!(
            parse_base("http://localhost:8080/cx").unwrap(),
            ("http://localhost:8080/cx".to_owned(), false)
        );
        for bad in ["127.0.0.1:8443", "ftp://x", "https://x/?a=1", "not a url"] {
            let err = parse_base(bad).unwrap_err();
            assert!(matches!(err, Error::InvalidUrl { .. }), "{bad}: {err}");
            assert!(err.to_string().contains(bad), "{err}");
        }
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(percent_encode("assigned"), "assigned");
        assert_eq!(percent_encode("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
    }

    #[test]
    fn a_missing_ca_file_is_named() {
        let err = Client::new(
            "https://127.0.0.1:1",
            Some(Path::new("/nonexistent/cx-ca.pem")),
        )
        .unwrap_err();
        assert!(
            err.to_string().starts_with("/nonexistent/cx-ca.pem: "),
            "{err}"
        );
    }

    #[test]
    fn api_errors_carry_code_field_and_status_on_one_line() {
        let err = Error::Api {
            status: 402,
            code: "tab_overspent".into(),
            message: "the tab holds 10 wei".into(),
            field: Some("intent.order.tab_id".into()),
        };
        assert_eq!(err.code(), Some("tab_overspent"));
        assert_eq!(err.field(), Some("intent.order.tab_id"));
        assert_eq!(err.status(), Some(402));
        assert_eq!(
            err.to_string(),
            "tab_overspent (HTTP 402) at intent.order.tab_id: the tab holds 10 wei"
        );
    }

    #[tokio::test]
    async fn nothing_listening_is_a_transport_error_naming_the_url() {
        // Port 9 (discard) on loopback: nothing of ours listens there.
        let client = Client::new("http://127.0.0.1:9", None).unwrap();
        let err = client.health().await.unwrap_err();
        assert!(matches!(err, Error::Transport { .. }), "{err}");
        assert!(
            err.to_string().contains("http://127.0.0.1:9/healthz"),
            "{err}"
        );
    }
}
