//! `cx bench load`: an open-loop load generator against the exchange's intake (signed intents)
//! or its OpenAI-compatible door (chat completions under session keys), on loopback HTTPS, with
//! the server's default rate limits on.
//!
//! Requests leave on a fixed schedule whatever the server answers (open loop), and each one's
//! latency counts from when it was due, not from when a connection was free to send it, so a
//! slow server cannot hide its queue (coordinated omission). The generator holds at most
//! [`MAX_QUEUED`] requests due and unanswered; past that it sheds and counts them, so its memory
//! is bounded whatever the server does.
//!
//! A run climbs a ladder of rates (×√2 a step) until p99 first exceeds the target (the knee;
//! a step over it is run once more, and counts only if it is over again),
//! then runs 1×, 2× and 4× the knee and, with `soak_s`, holds half the knee for that long,
//! sampling the process's resident memory and the database's size. Past its capacity the
//! exchange must answer 429 or 503 with `Retry-After` (backpressure), never anything else.
//!
//! The door's provider is this generator too: it registers a signed offer, long-polls for jobs
//! and answers each at once with a fixed text and an ML-DSA-signed receipt, so the figures are
//! the exchange's (session check, hold, clearing, dispatch, receipt check, release of the rest of
//! the hold), not a model's. Server, database and generator share this machine's cores.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cx_exchange_server::books::Books;
use cx_exchange_server::intake::{Intake, request_hash};
use cx_exchange_server::limits::RateConfig;
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{self, SessionGrant};
use cx_protocol::pq::Identity;
use cx_protocol::wire::{Assignment, Output, Pulled, ResultSubmission};
use cx_protocol::{DeterminismClass, Tier};
use http_body_util::{BodyExt, Full};
use serde::Serialize;
use tokio::sync::{Mutex, mpsc};

use super::intake::{
    Agent, CHAIN, Server, agents, bench_err, books_and_market, bundle, connect, intent, now_s,
    open_tabs, request, seed_tabs,
};
use crate::error::{Error, Result};

/// Requests due and not yet answered that the generator holds at most; more are shed.
pub const MAX_QUEUED: usize = 20_000;

/// How long one request may take before the generator counts it as failed.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// The text the door's provider answers with.
const ANSWER: &str = "Residency is priced.";

/// What is loaded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Target {
    /// `POST /v1/intents`: signed intents, verified, persisted and cleared (no provider runs
    /// them; they wait for their deadline).
    Intake,
    /// `POST /v1/chat/completions` under session keys, each answered by the generator's provider.
    Door,
}

/// What to run.
#[derive(Clone, Copy, Debug)]
pub struct LoadConfig {
    /// What is loaded.
    pub target: Target,
    /// Agents (accounts with a tab, and a session key for the door), requests spread evenly.
    pub agents: usize,
    /// Keep-alive connections the requests share.
    pub connections: usize,
    /// Seconds at each rate.
    pub step_s: f64,
    /// The ladder's first rate, requests a second.
    pub start_rate: f64,
    /// The ladder stops here if p99 never passes the target.
    pub max_rate: f64,
    /// The p99 whose first excess is the knee, ms.
    pub p99_target_ms: f64,
    /// Seconds held at half the knee afterwards, sampling memory and database size (0: none).
    pub soak_s: u64,
    /// The server's rate limits (its defaults unless a run says otherwise).
    pub limits: RateConfig,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            target: Target::Intake,
            agents: 64,
            connections: 64,
            step_s: 5.0,
            start_rate: 50.0,
            max_rate: 20_000.0,
            p99_target_ms: 50.0,
            soak_s: 0,
            limits: RateConfig::default(),
        }
    }
}

/// One rate held for a while.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Step {
    /// Requests due a second.
    pub rate_per_s: f64,
    /// Seconds it ran (until the last answer).
    pub seconds: f64,
    /// Requests due.
    pub sent: u64,
    /// Answered 2xx, a second.
    pub ok_per_s: f64,
    /// Answered 2xx.
    pub ok: u64,
    /// Answered 429 `rate_limited`.
    pub rate_limited: u64,
    /// Answered 503.
    pub unavailable: u64,
    /// 429s and 503s without a `Retry-After` header.
    pub without_retry_after: u64,
    /// Any other answer, or none within the timeout: each one a defect.
    pub unexpected: u64,
    /// The first unexpected answer, for the report.
    pub first_unexpected: Option<String>,
    /// Shed by the generator (more than [`MAX_QUEUED`] due and unanswered).
    pub shed: u64,
    /// Latency of 2xx answers from when they were due, ms.
    pub p50_ms: f64,
    /// 99th percentile of the same.
    pub p99_ms: f64,
    /// The slowest.
    pub max_ms: f64,
}

/// Memory and database size over a long hold.
#[derive(Clone, Debug, Serialize)]
pub struct Soak {
    /// The rate held.
    pub step: Step,
    /// Resident memory of this process (server and generator), MiB: at the start, the end,
    /// the most seen.
    pub rss_start_mib: f64,
    /// At the end.
    pub rss_end_mib: f64,
    /// The most seen.
    pub rss_max_mib: f64,
    /// Growth over the second half of the hold, MiB a minute (a leak shows as a steady slope
    /// once caches are warm).
    pub rss_slope_mib_per_min: f64,
    /// The database's size at the start and the end, MiB.
    pub db_start_mib: f64,
    /// At the end.
    pub db_end_mib: f64,
    /// Database growth per 2xx answer, bytes.
    pub db_bytes_per_ok: f64,
}

/// Figures of one run.
#[derive(Clone, Debug, Serialize)]
pub struct LoadReport {
    /// What was loaded.
    pub target: Target,
    /// Agents.
    pub agents: usize,
    /// Connections.
    pub connections: usize,
    /// The p99 target, ms.
    pub p99_target_ms: f64,
    /// The ladder, in order.
    pub ladder: Vec<Step>,
    /// The first rate whose p99 exceeded the target twice running (None: not reached by
    /// `max_rate`).
    pub knee_per_s: Option<f64>,
    /// 1×, 2× and 4× the knee.
    pub past_knee: Vec<Step>,
    /// The soak, if asked.
    pub soak: Option<Soak>,
    /// Answers other than 2xx, 429 and 503-with-`Retry-After`, in the whole run.
    pub unexpected: u64,
}

impl LoadReport {
    /// The human table.
    pub fn table(&self) -> String {
        let mut out = format!(
            "load: {:?} from {} agents on {} connections, p99 target {} ms\n",
            self.target, self.agents, self.connections, self.p99_target_ms
        );
        out += &format!(
            "  {:>8} {:>9} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9} {:>9}\n",
            "rate/s", "ok/s", "ok", "429", "503", "other", "shed", "noRA", "p50 ms", "p99 ms"
        );
        let row = |label: &str, s: &Step| {
            format!(
                "  {:>8.0} {:>9.1} {:>8} {:>8} {:>8} {:>6} {:>6} {:>6} {:>9.1} {:>9.1}  {label}\n",
                s.rate_per_s,
                s.ok_per_s,
                s.ok,
                s.rate_limited,
                s.unavailable,
                s.unexpected,
                s.shed,
                s.without_retry_after,
                s.p50_ms,
                s.p99_ms
            )
        };
        for s in &self.ladder {
            out += &row("ladder", s);
        }
        for (s, label) in self.past_knee.iter().zip(["1x knee", "2x knee", "4x knee"]) {
            out += &row(label, s);
        }
        match self.knee_per_s {
            Some(k) => out += &format!("  knee: {k:.0}/s (first rate with p99 > target)\n"),
            None => out += "  knee: not reached\n",
        }
        if let Some(soak) = &self.soak {
            out += &row(&format!("soak {:.0} s", soak.step.seconds), &soak.step);
            out += &format!(
                "  soak memory {:.1} → {:.1} MiB (max {:.1}, {:+.2} MiB/min over the second half); database {:.1} → {:.1} MiB ({:.0} bytes per answer)\n",
                soak.rss_start_mib,
                soak.rss_end_mib,
                soak.rss_max_mib,
                soak.rss_slope_mib_per_min,
                soak.db_start_mib,
                soak.db_end_mib,
                soak.db_bytes_per_ok
            );
        }
        for s in self.all_steps() {
            if let Some(first) = &s.first_unexpected {
                out += &format!("  unexpected at {:.0}/s: {first}\n", s.rate_per_s);
                break;
            }
        }
        out
    }

    fn all_steps(&self) -> impl Iterator<Item = &Step> {
        self.ladder
            .iter()
            .chain(&self.past_knee)
            .chain(self.soak.iter().map(|s| &s.step))
    }
}

/// One request: where it goes, under which bearer, with what body.
#[derive(Clone)]
struct Call {
    path: &'static str,
    bearer: Option<Arc<str>>,
    body: Bytes,
}

/// Jobs one tab takes (the books' cap: all one settlement batch holds); an agent moves to a
/// fresh tab when its current one is full.
const JOBS_PER_TAB: u64 = 400;

/// What each request needs, made ahead so the generator only sends.
struct Source {
    target: Target,
    agents: Vec<Agent>,
    domain: order::Eip712Domain,
    books: Books,
    /// Where sessions are opened (the door).
    server: (std::net::SocketAddr, Arc<rustls::ClientConfig>),
    /// The next nonce of each agent's intents.
    nonces: Vec<u64>,
    /// Requests put on each agent's current tab, and which of its tabs that is (round `k`:
    /// agent `a`'s escrow id is `a + k × agents`).
    used: Vec<u64>,
    round: Vec<u64>,
    /// Rounds of tabs opened so far.
    rounds_open: u64,
    /// The door's session secrets, by round then agent.
    secrets: Vec<Vec<Arc<str>>>,
    next: usize,
}

impl Source {
    /// `count` calls, round robin over the agents, opening fresh tabs (and sessions) as the
    /// current ones fill.
    async fn calls(&mut self, count: usize) -> Result<Vec<Call>> {
        let n = self.agents.len();
        let share = (count.div_ceil(n) + 1) as u64;
        let needed = (0..n)
            .map(|a| self.round[a] + (self.used[a] + share) / JOBS_PER_TAB)
            .max()
            .unwrap_or(0);
        while self.rounds_open <= needed {
            self.open_round().await?;
        }
        let hash = request_hash(&request());
        let deadline = now_s() + 3_000;
        (0..count)
            .map(|_| {
                let a = self.next % n;
                self.next += 1;
                if self.used[a] == JOBS_PER_TAB {
                    self.round[a] += 1;
                    self.used[a] = 0;
                }
                self.used[a] += 1;
                let round = self.round[a];
                match self.target {
                    Target::Door => Ok(Call {
                        path: "/v1/chat/completions",
                        bearer: Some(self.secrets[round as usize][a].clone()),
                        body: Bytes::from(door_body().to_string()),
                    }),
                    Target::Intake => {
                        let nonce = self.nonces[a];
                        self.nonces[a] += 1;
                        let tab_id = a as u64 + round * n as u64;
                        let intent = intent(hash, tab_id, nonce, deadline, Tier::T0);
                        let agent = &self.agents[a];
                        let signed = order::sign(intent, &self.domain, &agent.key, &agent.pq)
                            .map_err(bench_err)?;
                        let body = serde_json::json!({"intent": signed, "request": request()});
                        Ok(Call {
                            path: "/v1/intents",
                            bearer: None,
                            body: Bytes::from(body.to_string()),
                        })
                    }
                }
            })
            .collect()
    }

    /// One more tab per agent (as if each opened it on chain), and for the door a session on it.
    async fn open_round(&mut self) -> Result<()> {
        let n = self.agents.len() as u64;
        let first = self.rounds_open * n;
        if self.rounds_open > 0 {
            open_tabs(&self.books, &self.agents, first, now_s() + 86_400).await?;
        }
        if self.target == Target::Door {
            let secrets: Vec<Arc<str>> = (0..n)
                .map(|a| Arc::from(format!("cxs_load_{}", first + a)))
                .collect();
            open_sessions(&self.server, &self.agents, &secrets, &self.domain, first).await?;
            self.secrets.push(secrets);
        }
        self.rounds_open += 1;
        Ok(())
    }
}

pub(crate) fn door_body() -> serde_json::Value {
    serde_json::json!({
        "model": "llama-8b",
        "messages": [{"role": "user", "content": "Say hello."}],
        "max_tokens": 8,
        "cx": {"deadline_in_s": 20},
    })
}

/// A request due at `due`.
struct Due {
    call: Call,
    due: Instant,
}

/// Answers of one step, as the connections see them.
#[derive(Default)]
struct Tally {
    ok_ms: Vec<f64>,
    rate_limited: u64,
    unavailable: u64,
    without_retry_after: u64,
    unexpected: u64,
    first_unexpected: Option<String>,
}

/// The connections and the queue they share.
struct Generator {
    server: std::net::SocketAddr,
    client_config: Arc<rustls::ClientConfig>,
    connections: usize,
}

impl Generator {
    /// Sends `calls` at `rate` a second and waits for every answer.
    async fn step(&self, rate: f64, calls: Vec<Call>) -> Result<Step> {
        let sent = calls.len() as u64;
        let (queue, rx) = mpsc::channel::<Due>(MAX_QUEUED);
        let rx = Arc::new(Mutex::new(rx));
        let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
        let queued = Arc::new(AtomicUsize::new(0));
        let mut workers = Vec::new();
        for _ in 0..self.connections {
            let (rx, tally, queued) = (rx.clone(), tally.clone(), queued.clone());
            let (server, config) = (self.server, self.client_config.clone());
            workers.push(tokio::spawn(async move {
                let mut sender = connect(server, config.clone()).await?;
                loop {
                    let next = rx.lock().await.recv().await;
                    let Some(due) = next else { break };
                    if sender.ready().await.is_err() {
                        // The server closed this connection (after an error answer, say): the
                        // next request goes on a fresh one.
                        sender = connect(server, config.clone()).await?;
                    }
                    let answer = send(&mut sender, &due.call).await;
                    queued.fetch_sub(1, Ordering::Relaxed);
                    let ms = due.due.elapsed().as_secs_f64() * 1e3;
                    let mut t = tally.lock().expect("tally lock");
                    match answer {
                        Ok((status, _, _)) if status.is_success() => t.ok_ms.push(ms),
                        Ok((status, retry_after, body))
                            if status == hyper::StatusCode::TOO_MANY_REQUESTS
                                || status == hyper::StatusCode::SERVICE_UNAVAILABLE =>
                        {
                            if status == hyper::StatusCode::TOO_MANY_REQUESTS {
                                t.rate_limited += 1;
                            } else {
                                t.unavailable += 1;
                            }
                            if !retry_after {
                                t.without_retry_after += 1;
                                t.first_unexpected.get_or_insert_with(|| {
                                    format!("{status} without Retry-After: {body}")
                                });
                            }
                        }
                        Ok((status, _, body)) => {
                            t.unexpected += 1;
                            t.first_unexpected
                                .get_or_insert_with(|| format!("{status}: {body}"));
                        }
                        Err(e) => {
                            t.unexpected += 1;
                            t.first_unexpected.get_or_insert_with(|| e.to_string());
                        }
                    }
                }
                Ok::<_, Error>(())
            }));
        }
        let started = Instant::now();
        let mut shed = 0u64;
        for (i, call) in calls.into_iter().enumerate() {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
            if queued.load(Ordering::Relaxed) >= MAX_QUEUED {
                shed += 1;
                continue;
            }
            queued.fetch_add(1, Ordering::Relaxed);
            queue
                .send(Due { call, due })
                .await
                .map_err(|_| Error::BenchFailed("every connection failed".into()))?;
        }
        drop(queue);
        for worker in workers {
            worker
                .await
                .map_err(|e| Error::BenchFailed(format!("connection task: {e}")))??;
        }
        let seconds = started.elapsed().as_secs_f64();
        let mut t = std::mem::take(&mut *tally.lock().expect("tally lock"));
        t.ok_ms.sort_by(f64::total_cmp);
        let quantile = |q: f64| {
            if t.ok_ms.is_empty() {
                0.0
            } else {
                t.ok_ms[((t.ok_ms.len() - 1) as f64 * q).round() as usize]
            }
        };
        Ok(Step {
            rate_per_s: rate,
            seconds,
            sent,
            ok_per_s: t.ok_ms.len() as f64 / seconds,
            ok: t.ok_ms.len() as u64,
            rate_limited: t.rate_limited,
            unavailable: t.unavailable,
            without_retry_after: t.without_retry_after,
            unexpected: t.unexpected,
            first_unexpected: t.first_unexpected,
            shed,
            p50_ms: quantile(0.5),
            p99_ms: quantile(0.99),
            max_ms: t.ok_ms.last().copied().unwrap_or(0.0),
        })
    }
}

/// One keep-alive HTTP/1 connection to the exchange, ready to send.
pub(crate) type Sender = hyper::client::conn::http1::SendRequest<Full<Bytes>>;

/// Sends one call: its status, whether it carried `Retry-After`, and (for reports) the start
/// of its body when it is not 2xx.
async fn send(sender: &mut Sender, call: &Call) -> Result<(hyper::StatusCode, bool, String)> {
    let (status, retry_after, body) =
        send_raw(sender, call.path, call.bearer.as_deref(), call.body.clone()).await?;
    let body = if status.is_success() {
        String::new()
    } else {
        String::from_utf8_lossy(&body[..body.len().min(300)]).into_owned()
    };
    Ok((status, retry_after, body))
}

/// POSTs `body` to `path` on `sender`'s connection: the status, whether `Retry-After` came with
/// it, and the whole body.
pub(crate) async fn send_raw(
    sender: &mut Sender,
    path: &str,
    bearer: Option<&str>,
    body: Bytes,
) -> Result<(hyper::StatusCode, bool, Bytes)> {
    // HTTP/1: the connection takes the next request only once it has finished the last one.
    sender
        .ready()
        .await
        .map_err(|e| Error::BenchFailed(format!("{path}: connection closed: {e}")))?;
    let mut request = hyper::Request::post(path)
        .header("host", "localhost")
        .header("content-type", "application/json");
    if let Some(bearer) = bearer {
        request = request.header("authorization", format!("Bearer {bearer}"));
    }
    let request = request.body(Full::new(body)).map_err(bench_err)?;
    let response = tokio::time::timeout(REQUEST_TIMEOUT, sender.send_request(request))
        .await
        .map_err(|_| Error::BenchFailed(format!("{path}: no answer within {REQUEST_TIMEOUT:?}")))?
        .map_err(|e| Error::BenchFailed(format!("{path}: {e}")))?;
    let status = response.status();
    let retry_after = response.headers().contains_key("retry-after");
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| Error::BenchFailed(format!("{path}: {e}")))?
        .to_bytes();
    Ok((status, retry_after, body))
}

/// The door's provider: one signed offer, then `tasks` loops that long-poll for jobs and
/// answer each at once with [`ANSWER`] and a signed receipt, until `stop` is set.
pub(crate) struct Responder {
    stop: Arc<std::sync::atomic::AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<Result<()>>>,
    answered: Arc<AtomicU64>,
}

impl Responder {
    /// The provider of [`Responder::identity`], paid to `payout`, on the exchange at `server`.
    pub(crate) async fn start(
        server: (std::net::SocketAddr, Arc<rustls::ClientConfig>),
        payout: alloy::primitives::Address,
        tasks: usize,
    ) -> Result<Self> {
        let id = Arc::new(Self::identity());
        let token: Arc<str> = "cx-bench-load-provider".into();
        let mut sender = connect(server.0, server.1.clone()).await?;
        register(&mut sender, &id, &token, payout).await?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let answered = Arc::new(AtomicU64::new(0));
        let tasks = (0..tasks)
            .map(|_| {
                let (id, token, stop, answered) =
                    (id.clone(), token.clone(), stop.clone(), answered.clone());
                let (address, config) = (server.0, server.1.clone());
                tokio::spawn(async move {
                    let mut sender = connect(address, config.clone()).await?;
                    while !stop.load(Ordering::Relaxed) {
                        if sender.ready().await.is_err() {
                            sender = connect(address, config.clone()).await?;
                        }
                        let pulled: Pulled = serde_json::from_value(
                            post_json(
                                &mut sender,
                                "/v1/providers/jobs",
                                &token,
                                serde_json::json!({"max_jobs": 32, "wait_s": 1}),
                            )
                            .await?,
                        )
                        .map_err(bench_err)?;
                        for job in &pulled.jobs {
                            let (path, body) = answer(&id, payout, job)?;
                            post_json(&mut sender, &path, &token, body).await?;
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    Ok(())
                })
            })
            .collect::<Vec<_>>();
        // Offered again every 30 s, as `cx-provider` does: the exchange's sweeps take a provider
        // silent for longer than its offer's life out of the engine.
        let mut tasks = tasks;
        tasks.push({
            let (id, token, stop) = (id.clone(), token.clone(), stop.clone());
            let (server_address, server_config) = (server.0, server.1.clone());
            tokio::spawn(async move {
                let mut last = Instant::now();
                while !stop.load(Ordering::Relaxed) {
                    tokio::time::sleep(Duration::from_millis(200)).await;
                    if last.elapsed() >= REREGISTER_EVERY {
                        if sender.ready().await.is_err() {
                            sender = connect(server_address, server_config.clone()).await?;
                        }
                        register(&mut sender, &id, &token, payout).await?;
                        last = Instant::now();
                    }
                }
                Ok(())
            })
        });
        Ok(Self {
            stop,
            tasks,
            answered,
        })
    }

    /// The provider's ML-DSA identity (fixed: runs are comparable, and a chain's registry can
    /// hold its key hash ahead).
    pub(crate) fn identity() -> Identity {
        Identity::from_seed([0x70; 32])
    }

    pub(crate) async fn stop(self) -> Result<u64> {
        self.stop.store(true, Ordering::Relaxed);
        for task in self.tasks {
            task.await
                .map_err(|e| Error::BenchFailed(format!("provider task: {e}")))??;
        }
        Ok(self.answered.load(Ordering::Relaxed))
    }
}

/// How often the door's provider signs and sends its offer again (`cx-provider`'s period).
const REREGISTER_EVERY: Duration = Duration::from_secs(30);

/// Signs the door's provider's offer (four bundles, issued now) and registers it.
async fn register(
    sender: &mut Sender,
    id: &Identity,
    token: &Arc<str>,
    payout: alloy::primitives::Address,
) -> Result<()> {
    let bundles = (0..4)
        .map(|i| {
            let mut b = bundle(4 * i)?;
            b.provider = "op-load".into();
            Ok(b)
        })
        .collect::<Result<Vec<_>>>()?;
    let offer = Offer {
        operator: "op-load".into(),
        payout,
        bundles,
        token_hash: Offer::token_hash_of(token.as_bytes()),
        issued_at_s: now_s(),
        residency: None,
        search_trials_per_s: None,
    };
    let signed = SignedOffer::sign(offer, id).map_err(bench_err)?;
    let call = Call {
        path: "/v1/providers/register",
        bearer: None,
        body: Bytes::from(serde_json::to_string(&signed).map_err(bench_err)?),
    };
    let (status, _, body) = send(sender, &call).await?;
    if !status.is_success() {
        return Err(Error::BenchFailed(format!(
            "the load provider's offer was refused ({status}): {body}"
        )));
    }
    Ok(())
}

/// Posts `body` as the provider, waiting out `Retry-After` (the provider shares the agents'
/// loopback address and so their per-IP limit); the answer's JSON.
pub(crate) async fn post_json(
    sender: &mut Sender,
    path: &str,
    token: &Arc<str>,
    body: serde_json::Value,
) -> Result<serde_json::Value> {
    let body = Bytes::from(body.to_string());
    loop {
        let (status, _, bytes) = send_raw(sender, path, Some(token), body.clone()).await?;
        if status == hyper::StatusCode::TOO_MANY_REQUESTS
            || status == hyper::StatusCode::SERVICE_UNAVAILABLE
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        }
        if !status.is_success() {
            return Err(Error::BenchFailed(format!(
                "the bench's provider: {path} was refused ({status}): {}",
                String::from_utf8_lossy(&bytes)
            )));
        }
        return serde_json::from_slice(&bytes).map_err(bench_err);
    }
}

/// The result and receipt for one pulled job, signed as `cx-client`'s providers sign theirs.
fn answer(
    id: &Identity,
    payout: alloy::primitives::Address,
    job: &Assignment,
) -> Result<(String, serde_json::Value)> {
    let output = Output::text(ANSWER.to_owned(), "length", 6, 8);
    let receipt = cx_client::provider::sign_receipt(
        job,
        &output,
        id,
        payout,
        job.price_wei / 2,
        1,
        DeterminismClass::D,
    )
    .map_err(bench_err)?;
    let body = ResultSubmission { output, receipt };
    Ok((
        format!("/v1/jobs/{}/result", job.job_id),
        serde_json::to_value(&body).map_err(bench_err)?,
    ))
}

/// Resident memory of this process, MiB.
fn rss_mib() -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmRSS:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse::<f64>().ok())
        })
        .map_or(0.0, |kib| kib / 1024.0)
}

async fn db_mib(books: &Books) -> Result<f64> {
    let bytes: i64 = sqlx::query_scalar("SELECT pg_database_size(current_database())")
        .fetch_one(books.pool())
        .await
        .map_err(bench_err)?;
    Ok(bytes as f64 / (1024.0 * 1024.0))
}

/// Runs the load: server, database, generator (and for the door its provider) on this machine.
pub async fn load_bench(config: LoadConfig) -> Result<LoadReport> {
    if config.agents == 0 || config.connections == 0 || config.step_s <= 0.0 {
        return Err(Error::BenchFailed(
            "--agents, --connections and --step-s must be > 0".into(),
        ));
    }
    // The door's bundles are its provider's offer; intake clears onto registered ones.
    let bundles = if config.target == Target::Intake {
        200
    } else {
        0
    };
    let (_db, books, market) = books_and_market(bundles).await?;
    let settlement = alloy::primitives::Address::repeat_byte(0x5e);
    let domain = order::domain(CHAIN, settlement);
    let agents = agents(config.agents);
    seed_tabs(&books, &agents, now_s() + 86_400).await?;
    let mut intake = Intake::new(books.clone(), market, [(CHAIN, settlement)], 60)
        .with_rate_limits(config.limits);
    if config.target == Target::Intake {
        // Intake's bundles stand for providers that are always there (none runs, none offers
        // again), so the silence sweep must not take them out during a soak.
        intake = intake.with_provider_silence_s(7 * 86_400);
    }
    let server = Server::start("cx-bench-load", intake).await?;

    let responder = match config.target {
        Target::Intake => None,
        Target::Door => Some(
            Responder::start(
                (server.address, server.client_config.clone()),
                alloy::primitives::Address::repeat_byte(0x77),
                4,
            )
            .await?,
        ),
    };
    let mut source = Source {
        target: config.target,
        nonces: vec![0; agents.len()],
        used: vec![0; agents.len()],
        round: vec![0; agents.len()],
        rounds_open: 0,
        agents,
        domain,
        books: books.clone(),
        server: (server.address, server.client_config.clone()),
        secrets: Vec::new(),
        next: 0,
    };
    let generator = Generator {
        server: server.address,
        client_config: server.client_config.clone(),
        connections: config.connections,
    };
    let count = |rate: f64, seconds: f64| ((rate * seconds).round() as usize).max(1);

    let mut ladder = Vec::new();
    let mut knee = None;
    let mut rate = config.start_rate;
    while rate <= config.max_rate {
        // A step over the target is run again before it counts: on a shared machine one
        // stall of another process can push a single step's p99 past it.
        let mut over = 0;
        for _ in 0..2 {
            let calls = source.calls(count(rate, config.step_s)).await?;
            let step = generator.step(rate, calls).await?;
            let failed = step.p99_ms > config.p99_target_ms || step.ok < step.sent;
            ladder.push(step);
            if !failed {
                break;
            }
            over += 1;
        }
        if over == 2 {
            knee = Some(rate);
            break;
        }
        rate *= std::f64::consts::SQRT_2;
    }
    let mut past_knee = Vec::new();
    if let Some(knee) = knee {
        for factor in [1.0, 2.0, 4.0] {
            let calls = source.calls(count(knee * factor, config.step_s)).await?;
            past_knee.push(generator.step(knee * factor, calls).await?);
        }
    }
    let soak = if config.soak_s > 0 {
        let rate = knee.unwrap_or(config.max_rate) / 2.0;
        Some(soak(&generator, &mut source, &books, rate, config.soak_s).await?)
    } else {
        None
    };
    if let Some(responder) = responder {
        responder.stop().await?;
    }
    server.stop().await;
    let mut report = LoadReport {
        target: config.target,
        agents: config.agents,
        connections: config.connections,
        p99_target_ms: config.p99_target_ms,
        ladder,
        knee_per_s: knee,
        past_knee,
        soak,
        unexpected: 0,
    };
    report.unexpected = report
        .all_steps()
        .map(|s| s.unexpected + s.without_retry_after)
        .sum();
    Ok(report)
}

/// Holds `rate` for `seconds` in 10 s pieces, sampling memory and database size between them.
async fn soak(
    generator: &Generator,
    source: &mut Source,
    books: &Books,
    rate: f64,
    seconds: u64,
) -> Result<Soak> {
    let piece_s = 10.0_f64.min(seconds as f64);
    let pieces = ((seconds as f64 / piece_s).round() as usize).max(1);
    let (rss_start, db_start) = (rss_mib(), db_mib(books).await?);
    let mut samples = vec![(0.0, rss_start)];
    let mut total = Step {
        rate_per_s: rate,
        ..Step::default()
    };
    let mut ok_ms = Vec::new();
    let started = Instant::now();
    for _ in 0..pieces {
        let calls = source
            .calls(((rate * piece_s).round() as usize).max(1))
            .await?;
        let step = generator.step(rate, calls).await?;
        total.sent += step.sent;
        total.ok += step.ok;
        total.rate_limited += step.rate_limited;
        total.unavailable += step.unavailable;
        total.without_retry_after += step.without_retry_after;
        total.unexpected += step.unexpected;
        total.shed += step.shed;
        if total.first_unexpected.is_none() {
            total.first_unexpected = step.first_unexpected.clone();
        }
        // Each piece's p99 stands for its share of answers; the soak reports the worst piece's.
        total.p99_ms = total.p99_ms.max(step.p99_ms);
        ok_ms.push(step.p50_ms);
        total.max_ms = total.max_ms.max(step.max_ms);
        samples.push((started.elapsed().as_secs_f64(), rss_mib()));
    }
    total.seconds = started.elapsed().as_secs_f64();
    total.ok_per_s = total.ok as f64 / total.seconds;
    ok_ms.sort_by(f64::total_cmp);
    total.p50_ms = ok_ms[ok_ms.len() / 2];
    let db_end = db_mib(books).await?;
    let second_half = &samples[samples.len() / 2..];
    let slope = match (second_half.first(), second_half.last()) {
        (Some(a), Some(b)) if b.0 > a.0 => (b.1 - a.1) / (b.0 - a.0) * 60.0,
        _ => 0.0,
    };
    Ok(Soak {
        rss_start_mib: rss_start,
        rss_end_mib: samples.last().map_or(rss_start, |s| s.1),
        rss_max_mib: samples.iter().map(|s| s.1).fold(0.0, f64::max),
        rss_slope_mib_per_min: slope,
        db_start_mib: db_start,
        db_end_mib: db_end,
        db_bytes_per_ok: (db_end - db_start) * 1024.0 * 1024.0 / (total.ok.max(1) as f64),
        step: total,
    })
}

/// Opens one session per agent on its tab `first + i`, its bearer secret `secrets[i]`, capped far
/// beyond any run.
pub(crate) async fn open_sessions(
    server: &(std::net::SocketAddr, Arc<rustls::ClientConfig>),
    agents: &[Agent],
    secrets: &[Arc<str>],
    domain: &order::Eip712Domain,
    first: u64,
) -> Result<()> {
    let mut sender = connect(server.0, server.1.clone()).await?;
    for (i, (agent, secret)) in agents.iter().zip(secrets).enumerate() {
        let tab_id = first + i as u64;
        let grant = SessionGrant {
            tab_id,
            spend_cap_wei: u128::MAX / 8,
            expiry_s: now_s() + 86_400,
            default_deadline_s: 20,
            default_tier: Tier::T0,
            default_determinism: DeterminismClass::D,
            default_max_price_wei: 10_000_000,
            bearer_hash: SessionGrant::bearer_hash_of(secret.as_bytes()),
            nonce: 1_000_000_000 + tab_id,
        };
        let signed = order::sign(grant, domain, &agent.key, &agent.pq).map_err(bench_err)?;
        let call = Call {
            path: "/v1/sessions",
            bearer: None,
            body: Bytes::from(serde_json::json!({ "grant": signed }).to_string()),
        };
        let (status, _, body) = send(&mut sender, &call).await?;
        if !status.is_success() {
            return Err(Error::BenchFailed(format!(
                "a session was refused ({status}): {body}"
            )));
        }
    }
    Ok(())
}
