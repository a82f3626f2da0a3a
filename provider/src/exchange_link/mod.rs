//! The provider on an exchange's market, as any third-party provider: it connects out over
//! HTTPS, registers an ML-DSA-signed offer, long-polls for jobs, runs them on the same engine the
//! OpenAI endpoints use (so they batch with other requests), and returns each output with a
//! signed receipt.
//!
//! * `https` — the HTTPS client (rustls on aws-lc-rs, X25519MLKEM768 first).
//! * `key_file` — the provider's ML-DSA-65 identity in a 0600 file (`cx-provider keygen`).
//! * `wire` — the exchange's JSON bodies as the provider reads and writes them.
//! * `search` — SHA-256 preimage searches: the first valid witness is paid.
//! * `reserve` — bids on open reserves below the ask, and take-or-pay claims on those won.
//!
//! The flow ([`Link::run`]): measure FLOP/s with a short self-benchmark, sign and register the
//! offer (two bundles: the loaded base as resident with the resident adapters by id, and the
//! `cx/matmul-f32` products of `matmul`; both at the ask), then
//! loop on `POST /v1/providers/jobs`. Each job runs in its own task: a named adapter that is not
//! registered is fetched from the exchange (`GET /v1/adapters/{id}`), its content id checked
//! against the id asked for, and loaded through [`Engine::load_adapter`]; the prompt runs
//! greedily; the receipt ([`Receipt::for_output`]) claims the job's whole assigned price (the
//! exchange's quote for the job as cleared; it refuses more). A job that fails is logged and left
//! unanswered: the exchange's deadline sweep refunds its tab. The offer is re-signed and
//! registered every [`REREGISTER_EVERY`] (offers expire after
//! [`cx_protocol::offer::MAX_OFFER_AGE_S`]) and whenever the resident adapters change.
//!
//! The dispatch token is 32 random bytes chosen here; only its SHA-256 is signed into the offer,
//! and neither the token nor the identity's seed is ever logged.

pub mod follow;
mod https;
mod inference;
pub mod key_file;
mod matmul;
mod rent;
mod reserve;
mod search;
mod train;
mod wire;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use cx_protocol::class::{ClassSet, Tier, TierSet};
use cx_protocol::offer::{Offer, SignedOffer};
use cx_protocol::order::{Address, InferenceRequest};
use cx_protocol::pq::{Identity, PublicIdentity};
use cx_protocol::receipt::{Receipt, SignedReceipt};
use cx_protocol::{Bundle, DeterminismClass};
use tokio::sync::Notify;
use tokio::sync::mpsc::unbounded_channel;
use zeroize::Zeroizing;

use crate::bases::Bases;
use crate::chat_template::ChatMessage;
use crate::engine::{Conversation, Engine, Event, FinishReason, GenerateRequest, Sampling};
use crate::error::{Error, Result};
use crate::lora::{ADAPTER_CONFIG, ADAPTER_WEIGHTS, adapter_id};
use crate::model::{KvCache, SeqInput};
use cx_protocol::wire::{
    Assignment, Completed, Output, Pull, Pulled, Registered, ResultSubmission,
};
use cx_protocol::workload::Request;
use https::Https;
use wire::{AdapterFiles, ExchangeInfo};

/// One workload kind on a provider: how it runs an assignment of its kind (checked and
/// within its deadline) and returns the result with its signed receipt. Implemented by the
/// kind's request type in `exchange_link/<kind>.rs`; [`Link::serve_job`] reaches it through
/// the protocol's one list of kinds ([`cx_protocol::each_workload!`]).
trait Serve: Request {
    /// Runs job `job` (whose request is `self`) on `link` and posts its result.
    async fn serve(&self, link: &Link, job: &Assignment) -> Result<Completed>;
}

/// How long a provider waits before sending a result again to an exchange that is away.
const RESULT_RETRY_S: Duration = Duration::from_secs(1);

/// How often the offer is re-signed and registered (offers expire after 300 s).
pub const REREGISTER_EVERY: Duration = Duration::from_secs(30);
/// Seconds one long poll waits on the exchange for a job (its limit is 30).
const PULL_WAIT_S: u32 = 25;
/// Jobs taken per poll at most (the exchange's limit is 32).
const PULL_MAX_JOBS: u32 = 8;
/// How often a running job's new text goes to the exchange, for buyers who stream.
const PROGRESS_EVERY: Duration = Duration::from_millis(100);
/// How long the self-benchmark runs at most.
const BENCH_BUDGET: Duration = Duration::from_millis(800);

/// What settled batches credited `account` on `chain_id`, as the exchange at `url` (trusting
/// `ca`, else Mozilla's roots) serves it: `None` when nothing is credited yet.
pub async fn fetch_claim(
    url: &str,
    ca: Option<&std::path::Path>,
    chain_id: u64,
    account: cx_protocol::order::Address,
) -> Result<Option<wire::Claim>> {
    let https = https::Https::new(url, ca)?;
    match https
        .get(
            &format!("/v1/claims/{chain_id}/{account}"),
            std::time::Duration::from_secs(30),
        )
        .await
    {
        Ok(claim) => Ok(Some(claim)),
        Err(Error::Exchange(message)) if message.contains("(HTTP 404)") => Ok(None),
        Err(e) => Err(e),
    }
}

/// Who the provider is on the market and what it asks.
#[derive(Clone, Debug)]
pub struct LinkConfig {
    /// The exchange's URL (`https://…`; `http://…` only when it says so).
    pub exchange: String,
    /// The CA certificates to trust (PEM), instead of Mozilla's roots.
    pub exchange_ca: Option<PathBuf>,
    /// The exchange's assignment key, pinned by its hash (else the one it publishes at start).
    pub exchange_key_hash: Option<cx_protocol::order::B256>,
    /// The operator name (T3 committees are diverse in it).
    pub operator: String,
    /// Where receipts are paid.
    pub payout: Address,
    /// The ask at start, wei per compute-second ([`Link::ask`] changes it while running).
    pub ask_wei_per_s: u64,
    /// Tiers priced apart at start, each offered as its own bundle at its own ask.
    pub tier_asks: Vec<(Tier, u64)>,
    /// What reserves are bid below the ask, basis points (a reserve is priced below spot);
    /// 0: no bids on reserves.
    pub reserve_discount_bps: u32,
    /// The bundle's id.
    pub bundle_id: String,
    /// The catalog model the weights loaded at start are registered as (the primary base;
    /// reserves, ask following and training are for it).
    pub model_name: String,
    /// Free memory offered beside what is resident (the adapter cache's budget).
    pub memory_bytes: u64,
    /// Ingress bandwidth, bits per second (stated, not measured).
    pub bandwidth_bps: f64,
    /// Network round trip to buyers, seconds (stated).
    pub rtt_s: f64,
    /// Where adapters fetched from the exchange are written (one folder per content id).
    pub fetched_adapters: PathBuf,
    /// A misbehaviour to put on, for tests of the exchange's verification only (`None` for
    /// an honest provider).
    pub fault: Option<Fault>,
    /// Asks that follow the market's quote ([`follow`]; `None`: they stay where they are set).
    pub ask_follow: Option<follow::Follow>,
}

/// A way to cheat on purpose — a testing aid (`cx-provider serve --fault …`) that lets tests
/// show the exchange catches and slashes a provider that does it. No honest provider sets one.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// Return altered output text, with a receipt correctly signed over the altered bytes: what
    /// T1 and T3 replication must catch (its output hash is not the other providers').
    WrongOutput,
    /// Return every `cx/matmul-f32` product with one entry moved far beyond Freivalds'
    /// tolerance, under an honest receipt over the wrong bytes: what T2's check must catch.
    WrongProduct,
}

/// A provider registered at an exchange.
pub struct Link {
    config: LinkConfig,
    identity: Arc<Identity>,
    https: Https,
    /// The bases held and loadable ([`crate::bases`]), the served one's engine among them.
    bases: Arc<Bases>,
    /// The dispatch token: a secret, never logged.
    token: Arc<Zeroizing<String>>,
    flops_per_s: f64,
    /// FLOP/s of `C = A·B` on the CPU kernels (the matmul bundle's throughput).
    matmul_flops_per_s: f64,
    /// Trials per second of the search worker (the offer's `search_trials_per_s`).
    search_trials_per_s: u64,
    /// Rung when the resident adapters change, so the offer says so now, not at the next period
    /// (and when a poll fails, so an exchange that forgot the offer hears it again).
    residency_changed: Arc<Notify>,
    /// One cold fetch at a time: two jobs naming one adapter fetch and load it once.
    fetching: Arc<tokio::sync::Mutex<()>>,
    /// The exchange's assignment key, fixed for the run at the first registration.
    exchange_key: Arc<std::sync::OnceLock<PublicIdentity>>,
    /// The ask now, wei per compute-second: the operator may change it while running.
    ask: Ask,
    /// The training clients, when this provider takes train orders ([`Link::with_trainer`]).
    trainer: Option<Arc<crate::training::Trainer>>,
    /// Jobs being served now: an exchange that restarted hands out again the jobs an earlier
    /// process handed out (their answer may have died with it); one already here is not run
    /// twice.
    serving: std::sync::Mutex<std::collections::HashSet<cx_protocol::order::B256>>,
}

/// The provider's live asks, wei per compute-second: one for the model, and one per tier the
/// operator prices apart (an ask per model and tier: each such tier is offered as its own
/// bundle at its own ask). Read at every offer, set by the operator (`--tier-ask`, `PUT
/// /v1/exchange/ask` on the provider's own server), which re-signs and registers the offer at
/// once. Cheap to clone.
#[derive(Clone, Debug)]
pub struct Ask {
    wei_per_s: Arc<std::sync::atomic::AtomicU64>,
    tiers: Arc<std::sync::Mutex<std::collections::BTreeMap<Tier, u64>>>,
    changed: Arc<Notify>,
}

/// The tiers an inference bundle offers (replication asks nothing of a provider beyond
/// running the job as asked; T2 is the matmul bundle's).
const INFERENCE_TIERS: [Tier; 3] = [Tier::T0, Tier::T1, Tier::T3];

impl Ask {
    /// The model's ask now.
    pub fn get(&self) -> u64 {
        self.wei_per_s.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The tiers priced apart, and their asks.
    pub fn tiers(&self) -> Vec<(Tier, u64)> {
        let tiers = self.tiers.lock().unwrap_or_else(|e| e.into_inner());
        tiers.iter().map(|(t, a)| (*t, *a)).collect()
    }

    /// Sets the model's ask, or `tier`'s (T0, T1 or T3), above zero, and has the offer
    /// registered again now; jobs already assigned keep the price they were assigned at.
    pub fn set(&self, wei_per_s: u64, tier: Option<Tier>) -> Result<()> {
        if wei_per_s == 0 {
            return Err(Error::BadRequest(
                "ask_wei_per_s must be above zero".to_owned(),
            ));
        }
        match tier {
            None => self
                .wei_per_s
                .store(wei_per_s, std::sync::atomic::Ordering::Relaxed),
            Some(tier) if INFERENCE_TIERS.contains(&tier) => {
                let mut tiers = self.tiers.lock().unwrap_or_else(|e| e.into_inner());
                tiers.insert(tier, wei_per_s);
            }
            Some(tier) => {
                return Err(Error::BadRequest(format!(
                    "tier {tier:?} is not offered for inference (T0, T1, T3; T2 is the \
                     matmul bundle's, at the model's ask)"
                )));
            }
        }
        self.changed.notify_one();
        Ok(())
    }
}

impl std::fmt::Debug for Link {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Link")
            .field("exchange", &self.config.exchange)
            .field("bundle_id", &self.config.bundle_id)
            .field("key", &self.identity.id())
            .finish_non_exhaustive()
    }
}

impl Link {
    /// Unix time on the exchange's clock ([`Https::now_s`]): what deadlines are measured on.
    pub(crate) fn now_s(&self) -> u64 {
        self.https.now_s()
    }

    /// The primary base's engine (the one the provider's own HTTP door serves).
    pub fn engine(&self) -> &Engine {
        self.bases.primary()
    }

    /// The bases held and loadable.
    pub fn bases(&self) -> &Bases {
        &self.bases
    }

    /// The live ask (hand it to the provider's server so the operator can change it).
    pub fn ask(&self) -> Ask {
        self.ask.clone()
    }

    /// Prepares the link (TLS, the fetched-adapters folder as an adapter root, the dispatch
    /// token) and measures FLOP/s; nothing is sent yet. Blocking for up to about a second.
    pub fn new(config: LinkConfig, identity: Identity, bases: Arc<Bases>) -> Result<Self> {
        let engine = bases.primary();
        let https = Https::new(&config.exchange, config.exchange_ca.as_deref())?;
        std::fs::create_dir_all(&config.fetched_adapters)
            .map_err(|e| Error::io(&config.fetched_adapters, e))?;
        engine.add_adapter_roots(std::slice::from_ref(&config.fetched_adapters))?;
        let mut secret = Zeroizing::new([0u8; 32]);
        getrandom::fill(secret.as_mut()).expect("the operating system's random source");
        let token = Zeroizing::new(hex::encode(secret.as_ref()));
        let flops_per_s = measure_flops(engine)?;
        let matmul_flops_per_s = matmul::measure_flops(engine.model().device())?;
        let search_trials_per_s = search::measure_trials_per_s();
        let residency_changed = Arc::new(Notify::new());
        let ask = Ask {
            wei_per_s: Arc::new(std::sync::atomic::AtomicU64::new(config.ask_wei_per_s)),
            tiers: Arc::default(),
            changed: residency_changed.clone(),
        };
        for (tier, wei) in &config.tier_asks {
            ask.set(*wei, Some(*tier))?;
        }
        Ok(Self {
            config,
            identity: Arc::new(identity),
            https,
            bases,
            token: Arc::new(token),
            flops_per_s,
            matmul_flops_per_s,
            search_trials_per_s,
            residency_changed,
            fetching: Arc::new(tokio::sync::Mutex::new(())),
            exchange_key: Arc::new(std::sync::OnceLock::new()),
            ask,
            trainer: None,
            serving: std::sync::Mutex::default(),
        })
    }

    /// Takes train orders for the served base with `trainer` (over the same engine): a training
    /// bundle is offered beside the others.
    pub fn with_trainer(mut self, trainer: Arc<crate::training::Trainer>) -> Self {
        self.trainer = Some(trainer);
        self
    }

    /// The FLOP/s the self-benchmark measured (what the offer states).
    pub fn flops_per_s(&self) -> f64 {
        self.flops_per_s
    }

    /// The bundle as offered now.
    pub fn bundle(&self) -> Bundle {
        let mut determinism = ClassSet::EMPTY;
        // Greedy decoding on the deterministic kernels: bit-equal across runs of the same kernel
        // corpus (class D, naming the corpus). `--fast` (FMA) and `--gpu` differ from them in the
        // last bits, which greedy decoding can turn into other tokens: they offer D∞, so a class-D
        // replica never votes them down and slashes an honest provider for being fast.
        let kernel_corpus = self.engine().model().kernel_corpus();
        determinism.insert(match kernel_corpus {
            Some(_) => DeterminismClass::D,
            None => DeterminismClass::DInf,
        });
        // Replication (T1, T3) asks nothing of a provider beyond running the job as asked; a
        // tier priced apart is its own bundle's ([`Link::bundles`]).
        let apart = self.ask.tiers();
        let tiers: TierSet = INFERENCE_TIERS
            .into_iter()
            .filter(|t| !apart.iter().any(|(a, _)| a == t))
            .collect();
        let resident_adapters = self
            .bases
            .engines()
            .iter()
            .flat_map(Engine::adapters)
            .filter(|a| a.resident)
            .map(|a| a.id)
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        Bundle {
            id: self.config.bundle_id.clone(),
            provider: self.config.operator.clone(),
            device: self.engine().model().device_name(),
            price_wei_per_s: self.ask.get(),
            // The adapter budget, and the room bases that can be evicted leave for a fetch.
            memory_bytes: self.config.memory_bytes + self.bases.room_bytes(),
            bandwidth_bps: self.config.bandwidth_bps,
            rtt_s: self.config.rtt_s,
            flops_per_s: self.flops_per_s,
            context_max: u32::try_from(self.engine().model().config().max_position_embeddings)
                .unwrap_or(u32::MAX),
            determinism,
            kernel_corpus: kernel_corpus.map(str::to_owned),
            tiers,
            failure_rate: 0.0,
            resident_bases: self.bases.resident().into_iter().map(|b| b.name).collect(),
            resident_adapters,
            fetchable_bases: Some(self.bases.fetchable()),
            base_load_bps: Some(self.bases.load_bps()),
            // The exchange reads them from the residency report (one memory, every bundle).
            resident_prefixes: Vec::new(),
        }
    }

    /// Every bundle offered: the model at its ask, one bundle per tier priced apart
    /// (`<bundle-id>-t1`, …: the same memory and throughput, that tier only, its ask), the
    /// matmul kernel's, and the training market's when this provider trains.
    pub fn bundles(&self) -> Vec<Bundle> {
        let main = self.bundle();
        let mut out = Vec::new();
        for (tier, wei) in self.ask.tiers() {
            out.push(Bundle {
                id: format!("{}-{}", main.id, format!("{tier:?}").to_ascii_lowercase()),
                price_wei_per_s: wei,
                tiers: [tier].into_iter().collect(),
                ..main.clone()
            });
        }
        out.insert(0, main);
        out.push(self.matmul_bundle());
        out.extend(self.train_bundle());
        out
    }

    /// Signs the offer now and registers it.
    pub async fn register(&self) -> Result<()> {
        let offer = Offer {
            operator: self.config.operator.clone(),
            payout: self.config.payout,
            bundles: self.bundles(),
            token_hash: Offer::token_hash_of(self.token.as_bytes()),
            issued_at_s: self.now_s(),
            residency: Some(cx_protocol::offer::Residency {
                bases: self.bases.resident(),
                ..self.engine().residency()
            }),
            search_trials_per_s: Some(self.search_trials_per_s),
        };
        let signed = SignedOffer::sign(offer, &self.identity)?;
        let registered: Registered = self
            .https
            .post(
                "/v1/providers/register",
                None,
                &signed,
                Duration::from_secs(20),
            )
            .await?;
        if registered.key_hash.0 != self.identity.id().0 {
            return Err(Error::Exchange(format!(
                "{} registered key {} for an offer signed by {}",
                self.https.base(),
                registered.key_hash,
                self.identity.id()
            )));
        }
        tracing::info!(
            "registered at {}: bundles {:?}, key {}, {:.3e} FLOP/s",
            self.https.base(),
            registered.bundles,
            self.identity.id(),
            self.flops_per_s
        );
        Ok(())
    }

    /// Registers, then serves the exchange's jobs until the process ends. Returns only if the
    /// first registration fails (a wrong URL, CA, payout or operator should stop the start).
    pub async fn run(self) -> Result<()> {
        self.pin_exchange_key().await?;
        self.register().await?;
        let link = Arc::new(self);
        tokio::spawn(search::run(link.clone()));
        tokio::spawn(rent::run(link.clone()));
        if link.config.reserve_discount_bps > 0 {
            tokio::spawn(reserve::run(link.clone()));
        }
        if let Some(follow) = link.config.ask_follow {
            tokio::spawn(follow::run(link.clone(), follow));
        }
        let reregister = link.clone();
        tokio::spawn(async move {
            let held_changed = reregister.engine().residency_changed();
            loop {
                tokio::select! {
                    () = tokio::time::sleep(REREGISTER_EVERY) => {}
                    () = reregister.residency_changed.notified() => {}
                    // A conversation prefix kept, taken or evicted: the report names them.
                    () = held_changed.notified() => {}
                }
                if let Err(e) = reregister.register().await {
                    tracing::warn!("re-registering the offer failed (retrying): {e}");
                }
            }
        });
        loop {
            let pulled: Result<Pulled> = link
                .https
                .post(
                    "/v1/providers/jobs",
                    Some(link.token.as_str()),
                    &Pull {
                        max_jobs: PULL_MAX_JOBS,
                        wait_s: PULL_WAIT_S,
                    },
                    Duration::from_secs(u64::from(PULL_WAIT_S) + 20),
                )
                .await;
            match pulled {
                Ok(pulled) => {
                    for job in pulled.jobs {
                        let id = job.job_id;
                        if !link
                            .serving
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id)
                        {
                            continue;
                        }
                        let link = link.clone();
                        tokio::spawn(async move {
                            let served = link.serve_job(job).await;
                            link.serving
                                .lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .remove(&id);
                            match served {
                                Ok(done) => tracing::info!(
                                    "job {id}: done, charged {} wei, released {} wei",
                                    done.charged_wei,
                                    done.released_wei
                                ),
                                Err(e) => {
                                    tracing::warn!("job {id} failed: {e}");
                                    link.release(id, &e.to_string()).await;
                                }
                            }
                        });
                    }
                }
                Err(e) => {
                    tracing::warn!("pulling jobs failed (retrying in 2 s): {e}");
                    // An exchange that restarted, or expired the offer while this one could not
                    // reach it, no longer knows the token: register again before the next poll.
                    link.residency_changed.notify_one();
                    tokio::time::sleep(Duration::from_secs(2)).await;
                }
            }
        }
    }

    /// Gives job `id` back to the exchange with the reason it could not run (best effort): it
    /// is re-cleared elsewhere or refunded at once, not held until its deadline. A job that
    /// already ended (its result was taken or refused) is not released again.
    async fn release(&self, id: cx_protocol::order::B256, reason: &str) {
        #[derive(serde::Serialize)]
        struct Release<'a> {
            reason: &'a str,
        }
        #[derive(serde::Deserialize)]
        struct Released {
            moved_to: Option<String>,
        }
        let reason: String = reason.chars().take(1000).collect();
        let released: Result<Released> = self
            .https
            .post(
                &format!("/v1/jobs/{id}/release"),
                Some(self.token.as_str()),
                &Release { reason: &reason },
                Duration::from_secs(20),
            )
            .await;
        match released {
            Ok(Released { moved_to: Some(to) }) => {
                tracing::info!("job {id}: released, now on {to}")
            }
            Ok(Released { moved_to: None }) => tracing::info!("job {id}: released and refunded"),
            Err(e) => tracing::warn!("job {id}: not released ({e})"),
        }
    }

    /// Reads the key the exchange signs assignments with and pins it for the run; with
    /// `--exchange-key-hash`, refuses any other.
    async fn pin_exchange_key(&self) -> Result<()> {
        let info: ExchangeInfo = self
            .https
            .get("/v1/exchange", Duration::from_secs(20))
            .await?;
        let bytes = hex::decode(info.mldsa_key.trim_start_matches("0x"))
            .map_err(|e| Error::Exchange(format!("GET /v1/exchange: mldsa_key: {e}")))?;
        let key = PublicIdentity::from_bytes(&bytes)?;
        if let Some(pinned) = self.config.exchange_key_hash
            && pinned.0 != key.id().0
        {
            return Err(Error::Exchange(format!(
                "{} signs with key {}, not the pinned --exchange-key-hash {pinned}",
                self.https.base(),
                key.id()
            )));
        }
        tracing::info!(
            "exchange key {} (assignments must be signed by it)",
            key.id()
        );
        let _ = self.exchange_key.set(key);
        Ok(())
    }

    /// Checks the exchange's signed assignment: under the pinned key, for this provider's key,
    /// and naming exactly the job handed out (id, tab, buyer, price, deadline, request, adapter).
    fn check_assignment(&self, job: &Assignment) -> Result<()> {
        let refused =
            |why: &str| Error::Exchange(format!("assignment of job {}: {why}", job.job_id));
        let key = self
            .exchange_key
            .get()
            .ok_or_else(|| refused("no exchange key pinned"))?;
        let signed = job.signed.as_ref().ok_or_else(|| refused("not signed"))?;
        signed
            .verify(key)
            .map_err(|e| refused(&format!("signature: {e}")))?;
        let terms = &signed.assignment;
        let mut adapter_hash = [0u8; 32];
        if let Some(id) = &job.adapter {
            hex::decode_to_slice(id, &mut adapter_hash)
                .map_err(|_| refused("adapter is not a content id"))?;
        }
        let matches = terms.job_id == job.job_id.0
            && terms.chain_id == job.chain_id
            && terms.escrow_id == job.escrow_id
            && terms.buyer == job.buyer.0.0
            && terms.provider_key == self.identity.id().0
            && terms.price_wei == job.price_wei
            && terms.deadline_s == job.deadline_s
            && terms.input_hash == job.workload.hash().0
            && terms.adapter_hash == adapter_hash;
        if !matches {
            return Err(refused("the signed terms are not the job handed out"));
        }
        Ok(())
    }

    /// Runs one job and returns its result to the exchange.
    async fn serve_job(&self, job: Assignment) -> Result<Completed> {
        // The exchange's signed word first: nothing runs on an assignment it did not sign.
        self.check_assignment(&job)?;
        if job.deadline_s <= self.now_s() {
            return Err(Error::BadRequest("its deadline has passed".into()));
        }
        cx_protocol::each_workload!(&job.workload, request => request.serve(self, &job).await)
    }

    /// Signs `receipt` and sends it with `output` as job `job`'s result.
    async fn post_result(
        &self,
        job: &Assignment,
        output: Output,
        receipt: Receipt,
    ) -> Result<Completed> {
        let body = ResultSubmission {
            output,
            receipt: SignedReceipt::sign(receipt, &self.identity)?,
        };
        // The work is done: an exchange that is away (restarting after a crash, its database
        // restarting) gets the result again until the job's deadline, rather than the job
        // expiring there with its output thrown away. The exchange takes a result once (only
        // from `running`), so sending it again cannot charge twice.
        loop {
            let sent = self
                .https
                .post(
                    &format!("/v1/jobs/{}/result", job.job_id),
                    Some(self.token.as_str()),
                    &body,
                    Duration::from_secs(60),
                )
                .await;
            match sent {
                Err(Error::ExchangeAway(e))
                    if self.now_s() + RESULT_RETRY_S.as_secs() < job.deadline_s =>
                {
                    tracing::warn!(
                        "job {}: sending the result failed (again in 1 s): {e}",
                        job.job_id
                    );
                    tokio::time::sleep(RESULT_RETRY_S).await;
                }
                sent => return sent,
            }
        }
    }

    /// Sends a piece of a job's output (best effort: a piece lost only shortens the buyer's
    /// preview; the result carries it all).
    async fn progress(&self, job: &Assignment, offset: usize, piece: &str) {
        let sent: Result<serde_json::Value> = self
            .https
            .post(
                &format!("/v1/jobs/{}/progress", job.job_id),
                Some(self.token.as_str()),
                &serde_json::json!({"offset": offset, "text": piece}),
                Duration::from_secs(5),
            )
            .await;
        if let Err(e) = sent {
            tracing::warn!("job {}: streaming a piece failed: {e}", job.job_id);
        }
    }

    /// Generation through the scheduler of the job's base (`engine`), as `/v1/completions`
    /// runs it.
    async fn generate(
        &self,
        engine: &Engine,
        job: &Assignment,
        request: &InferenceRequest,
        adapter: Option<crate::engine::AdapterRef>,
    ) -> Result<Output> {
        request.check()?;
        let tokenizer = engine.tokenizer();
        // A chat is rendered by this model's own template; what was signed is the messages.
        let prompt = if request.messages.is_empty() {
            tokenizer.encode(&request.prompt)?
        } else {
            let messages: Vec<ChatMessage> = request
                .messages
                .iter()
                .map(|m| ChatMessage::new(m.role.clone(), m.content.clone()))
                .collect();
            tokenizer.encode_chat(&messages)?.1
        };
        let limit = engine.model().config().max_position_embeddings;
        let max_tokens = request.max_tokens as usize;
        if prompt.is_empty() || max_tokens == 0 || prompt.len() + max_tokens > limit {
            return Err(Error::BadRequest(format!(
                "a prompt of {} tokens and max_tokens {max_tokens} do not fit the context of \
                 {limit}",
                prompt.len()
            )));
        }
        let (tx, mut events) = unbounded_channel();
        engine.submit(GenerateRequest {
            prompt,
            adapter,
            max_tokens,
            stop: request
                .sampling
                .as_ref()
                .map_or_else(Vec::new, |s| s.stop.clone()),
            sampling: sampling_of(request.sampling.as_ref()),
            events: tx,
            stream: true,
            // Named by the catalog model and the request's text in the protocol's role-tagged
            // form, as the exchange names the prefix it routes by (the KV held is of the tokens
            // this model's template made; a continuation reuses it token by token).
            conversation: Some(Conversation {
                model: job.model.clone(),
                prompt_text: request.text(),
            }),
        });
        let mut text = String::new();
        // What of `text` the exchange has seen, and when it last did: pieces go out at most
        // every PROGRESS_EVERY, for the buyer's stream (a preview: the signed result counts).
        let mut sent = 0;
        let mut last = Instant::now();
        loop {
            match events.recv().await {
                Some(Event::Text { delta, .. }) => {
                    text.push_str(&delta);
                    if last.elapsed() >= PROGRESS_EVERY && sent < text.len() {
                        self.progress(job, sent, &text[sent..]).await;
                        sent = text.len();
                        last = Instant::now();
                    }
                }
                Some(Event::Done {
                    finish_reason,
                    prompt_tokens,
                    completion_tokens,
                }) => {
                    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
                    let finish_reason = match finish_reason {
                        FinishReason::Stop => "stop",
                        FinishReason::Length => "length",
                    };
                    return Ok(Output::text(
                        text,
                        finish_reason,
                        count(prompt_tokens),
                        count(completion_tokens),
                    ));
                }
                Some(Event::Failed(error)) => {
                    return Err(Error::BadRequest(format!("generation: {error}")));
                }
                None => return Err(Error::SchedulerStopped),
            }
        }
    }

    /// The adapter `id` on the base `engine` serves, fetched from the exchange and loaded if
    /// that base does not know it.
    async fn ensure_adapter(&self, engine: &Engine, id: &str) -> Result<crate::engine::AdapterRef> {
        let id = id.strip_prefix("0x").unwrap_or(id);
        if !is_content_id(id) {
            return Err(Error::BadRequest(format!(
                "adapter `{id}` is not a 64-hex-digit content id"
            )));
        }
        let id = id.to_ascii_lowercase();
        if let Ok(known) = engine.resolve(&id) {
            return Ok(known);
        }
        let _one_at_a_time = self.fetching.lock().await;
        if let Ok(known) = engine.resolve(&id) {
            return Ok(known);
        }
        let started = Instant::now();
        let files: AdapterFiles = self
            .https
            // With the dispatch token: the exchange learns which provider lacked the adapter.
            .get_with_token(
                &format!("/v1/adapters/{id}"),
                self.token.as_str(),
                Duration::from_secs(120),
            )
            .await?;
        let weights = BASE64
            .decode(files.adapter_model_safetensors_base64.as_bytes())
            .map_err(|e| Error::Exchange(format!("adapter {id}: weights are not base64: {e}")))?;
        let got = adapter_id(files.adapter_config.as_bytes(), &weights);
        if got != id {
            return Err(Error::Exchange(format!(
                "adapter {id}: the exchange served files whose content id is {got}"
            )));
        }
        let dir = self.config.fetched_adapters.join(&id);
        let loading = engine.clone();
        let name = id.clone();
        let loaded = tokio::task::spawn_blocking(move || {
            write_adapter(&dir, files.adapter_config.as_bytes(), &weights)?;
            loading.load_adapter(&name, &dir, false)
        })
        .await
        .unwrap_or(Err(Error::LoadPanicked))?;
        tracing::info!(
            "adapter {id}: fetched and loaded in {} ms ({} bytes, rank {}, evicted {})",
            started.elapsed().as_millis(),
            loaded.bytes,
            loaded.rank,
            loaded.evicted.len()
        );
        self.residency_changed.notify_one();
        engine.resolve(&id)
    }
}

fn is_content_id(id: &str) -> bool {
    id.len() == 64 && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// Writes an adapter's two files into `dir` (each through a temporary name, so a crash never
/// leaves a half-written file under the real one).
fn write_adapter(dir: &Path, config: &[u8], weights: &[u8]) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
    for (name, bytes) in [(ADAPTER_CONFIG, config), (ADAPTER_WEIGHTS, weights)] {
        let path = dir.join(name);
        let tmp = dir.join(format!(".{name}.tmp"));
        std::fs::write(&tmp, bytes).map_err(|e| Error::io(&tmp, e))?;
        std::fs::rename(&tmp, &path).map_err(|e| Error::io(&path, e))?;
    }
    Ok(())
}

/// FLOP/s of the loaded model on this machine: prefill forwards of a short prompt, timed for at
/// most [`BENCH_BUDGET`] (at least one), counted as 2 FLOPs per weight per token — the same
/// count the exchange's catalog uses (`2 · parameters` per token) to turn a job into seconds.
fn measure_flops(engine: &Engine) -> Result<f64> {
    let model = engine.model();
    let config = model.config();
    let tokens: Vec<u32> = (0..16
        .min(config.max_position_embeddings.saturating_sub(1))
        .max(1))
        .map(|i| (i % config.vocab_size) as u32)
        .collect();
    let parameters = model.parameters() as f64;
    let started = Instant::now();
    let mut best = f64::INFINITY;
    while best.is_infinite() || started.elapsed() < BENCH_BUDGET {
        let mut cache = KvCache::default();
        let t = Instant::now();
        model.forward(&mut [SeqInput {
            tokens: &tokens,
            cache: &mut cache,
            adapter: None,
        }])?;
        best = best.min(t.elapsed().as_secs_f64());
        if started.elapsed() >= BENCH_BUDGET {
            break;
        }
    }
    Ok(2.0 * parameters * tokens.len() as f64 / best.max(1e-9))
}

/// The engine's sampling for a job's request: greedy when it names none; the request's
/// thousandths as the OpenAI values they stand for.
fn sampling_of(params: Option<&cx_protocol::order::SamplingParams>) -> Sampling {
    match params {
        None => Sampling::default(),
        Some(p) => Sampling {
            temperature: p.temperature_milli as f32 / 1000.0,
            top_p: p.top_p_milli as f32 / 1000.0,
            top_k: p.top_k,
            presence_penalty: p.presence_penalty_milli as f32 / 1000.0,
            frequency_penalty: p.frequency_penalty_milli as f32 / 1000.0,
            seed: p.seed,
            ..Sampling::default()
        },
    }
}
