//! The devnet's seeded agents: each binds its ML-DSA key to an Anvil account, keeps one tab open
//! on every chain with a session key, a reserve and a rent on it, and sends a steady mix of work through
//! cx-client — OpenAI-door chats on the session key and signed intents (T0, T1, T3) over
//! adapters drawn with Zipf popularity, matrix products (T2) and searches — and closes each tab
//! every 20–30 s (the first sooner) so that batches settle while one watches. Every closed tab
//! goes to the tally, which counts what settled.

use anyhow::Context;
use cx_client::types::ChainInfo;
use cx_client::{AgentKeys, Client, Credential, InferenceRequest};
use cx_contracts::Deployment;
use cx_protocol::order::{B256, Intent, SessionGrant, TabTerms, U256};
use cx_protocol::pq::Identity;
use cx_protocol::workload::Workload;
use cx_protocol::{DeterminismClass, Tier};
use cx_settlement::evm::EvmClient;
use rand::distributions::{Distribution, WeightedIndex};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha20Rng;
use serde_json::json;
use std::io::Write as _;
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::mpsc;

/// What a tab holds, wei (Anvil's accounts hold 10^24).
pub(super) const TAB_WEI: u128 = 1_000_000_000_000_000;
/// Seconds a tab stays open on chain at most (the exchange closes it `--settle-margin-s` before).
const TAB_DEADLINE_S: u64 = 3_600;
/// A call's price limit, wei (the asks are around 10^6 wei per compute-second; a call takes
/// milliseconds).
pub(super) const MAX_PRICE_WEI: u128 = 10_000_000;
/// A reserve's limit, wei per compute-second (above the devnet's asks, so providers bid).
const RESERVE_MAX_RATE_WEI_PER_S: u64 = 5_000_000;
/// Zipf exponent of adapter popularity (s ≈ 1: the k-th most popular is asked 1/k as often).
const ZIPF_S: f64 = 1.1;

/// One chain as the agents use it.
#[derive(Clone, Debug)]
pub(super) struct Side {
    pub(super) info: ChainInfo,
    pub(super) rpc_url: String,
    pub(super) deployment: Deployment,
}

/// What every agent shares: the exchange, the chains, the catalog model and the adapters stored
/// at the exchange (content ids, most popular first).
pub(super) struct Market {
    pub(super) client: Client,
    pub(super) sides: Vec<Side>,
    pub(super) model: String,
    pub(super) adapters: Vec<String>,
    /// Whether `adapters` are stored at the exchange yet: storing needs an account with a tab,
    /// so the first agent's first tabs open before it, and a rent on an adapter the exchange
    /// does not hold yet is refused (`unknown_adapter`).
    pub(super) adapters_stored: std::sync::atomic::AtomicBool,
    /// The verified tier the traffic asks: T1 (class D, re-executed on a second provider) when
    /// the devnet has two providers or more, else T0 (one provider cannot verify another).
    pub(super) verified_tier: Tier,
    /// Whether some intents ask T3 (three providers of distinct operators agree by majority):
    /// only on a fleet of three operators or more.
    pub(super) t3: bool,
    pub(super) stats: Stats,
    pub(super) log: Mutex<std::fs::File>,
}

/// Counters the summary prints.
#[derive(Debug, Default)]
pub(super) struct Stats {
    pub(super) chats: AtomicU64,
    pub(super) intents: AtomicU64,
    pub(super) searches: AtomicU64,
    pub(super) matmuls: AtomicU64,
    pub(super) trains: AtomicU64,
    pub(super) reserves: AtomicU64,
    pub(super) rents: AtomicU64,
    pub(super) tabs_closed: AtomicU64,
    pub(super) errors: AtomicU64,
}

impl Market {
    /// Counts and logs a standing order the exchange refused: the traffic's error, not the
    /// tab's.
    pub(super) fn count_refused(&self, agent: &str, outcome: anyhow::Result<()>) {
        if let Err(refused) = outcome {
            self.stats.errors.fetch_add(1, Ordering::Relaxed);
            self.note(&format!("{agent}: {refused:#}"));
        }
    }

    fn note(&self, line: &str) {
        if let Ok(mut log) = self.log.lock() {
            let _ = writeln!(log, "{line}");
        }
    }
}

/// A tab the exchange was asked to settle, with the jobs it paid for.
#[derive(Debug)]
pub(super) struct Closed {
    pub(super) chain_id: u64,
    pub(super) escrow_id: u64,
    pub(super) jobs: Vec<B256>,
    /// The exchange as the tab's buyer reads it (job reads are the buyer's).
    pub(super) reader: Client,
}

/// A tab open on one chain, with the session key its chats use.
#[derive(Debug)]
pub(super) struct OpenTab {
    pub(super) escrow_id: u64,
    pub(super) session_key: String,
    opened: Instant,
    close_after: Duration,
    jobs: Vec<B256>,
}

/// One seeded agent: its keys and one EVM client per chain acting with its account.
pub(super) struct Agent {
    pub(super) name: String,
    pub(super) keys: AgentKeys,
    evm: Vec<EvmClient>,
    /// The market's client acting as this agent (made at first use).
    own: std::sync::OnceLock<Client>,
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// Unique per account: microseconds, and never the same twice in one process.
fn fresh_nonce() -> u64 {
    static LAST: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64);
    let mut last = LAST.load(Ordering::Relaxed);
    loop {
        let next = now.max(last + 1);
        match LAST.compare_exchange(last, next, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return next,
            Err(seen) => last = seen,
        }
    }
}

impl Agent {
    /// One signed search on the tab (a SHA-256 preimage with 12 leading zero bits, about
    /// 4,000 hashes), waiting until a provider's witness fills it; returns its job (the
    /// search's digest).
    async fn search(
        &self,
        market: &Market,
        side: usize,
        tab: &OpenTab,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<B256> {
        let now = now_s();
        let mut prefix = [0u8; 16];
        rng.fill(&mut prefix);
        let search = cx_protocol::order::Search {
            prefix: prefix.to_vec().into(),
            target: B256::from(cx_exchange::lifecycle::search::target_for_zero_bits(12)),
            success_ppm: 990_000,
            deadline_s: now + 20,
            max_price_wei: SEARCH_PRICE_WEI,
            tab_id: tab.escrow_id,
            nonce: fresh_nonce(),
            expiry_s: now + 20,
        };
        let signed = self.keys.sign(search, &market.sides[side].info.domain())?;
        let accepted = market
            .client
            .submit_search(&signed)
            .await
            .context("search")?;
        market.stats.searches.fetch_add(1, Ordering::Relaxed);
        let id = accepted.order_id;
        let waited = Instant::now();
        loop {
            let order = market.client.standing_order(id).await?;
            match order["status"].as_str() {
                Some("filled") => return Ok(id),
                Some("open") if waited.elapsed() < Duration::from_secs(25) => {}
                other => anyhow::bail!("search {id} ended {other:?}"),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// An agent acting with the Anvil account `signer`, its key file written to `path` (0600).
    pub(super) fn new(
        name: String,
        signer: &alloy::signers::local::PrivateKeySigner,
        sides: &[Side],
        path: &Path,
    ) -> anyhow::Result<Self> {
        let secret: [u8; 32] = signer.to_bytes().into();
        let keys = AgentKeys::from_secrets(&secret, Identity::generate())?;
        keys.write(path, true)
            .with_context(|| format!("{}", path.display()))?;
        let evm = sides
            .iter()
            .map(|s| {
                EvmClient::connect(&s.rpc_url, signer.clone(), s.deployment)
                    .with_context(|| format!("chain {} at {}", s.info.chain_id, s.rpc_url))
            })
            .collect::<anyhow::Result<_>>()?;
        Ok(Self {
            name,
            keys,
            evm,
            own: std::sync::OnceLock::new(),
        })
    }

    /// The market's client acting as this agent, with its signed credentials (reading its
    /// jobs, storing its datasets and adapters).
    pub(super) fn own(&self, market: &Market) -> &Client {
        self.own.get_or_init(|| {
            market
                .client
                .clone()
                .with_credential(Credential::Account(self.keys.signing_key().clone()))
        })
    }

    /// Binds the ML-DSA key to the account (once; any served chain carries it).
    pub(super) async fn bind(&self, market: &Market) -> anyhow::Result<()> {
        let binding = self.keys.binding(&market.sides[0].info.domain(), 0)?;
        market
            .client
            .bind(&binding)
            .await
            .with_context(|| format!("{}: binding", self.name))?;
        Ok(())
    }

    /// Opens a tab on chain `side` (as `cx agent open-tab` does) and a session key on it, and
    /// waits until the exchange mirrors the tab.
    pub(super) async fn open_tab(
        &self,
        market: &Market,
        side: usize,
        close_after: Duration,
    ) -> anyhow::Result<OpenTab> {
        let chain = &market.sides[side].info;
        let evm = &self.evm[side];
        let domain = chain.domain();
        let terms = TabTerms {
            buyer: self.keys.account(),
            amount_wei: TAB_WEI,
            deadline_s: now_s() + TAB_DEADLINE_S,
            nonce: fresh_nonce(),
        };
        let reference = terms.tab_ref(&domain);
        let at = || format!("{}: chain {}", self.name, chain.chain_id);
        evm.approve_all().await.with_context(at)?;
        let free = evm
            .escrow_balance(self.keys.account())
            .await
            .with_context(at)?;
        let amount = U256::from(TAB_WEI);
        if free < amount {
            evm.deposit(amount - free).await.with_context(at)?;
        }
        let (escrow_id, _) = evm
            .open_job(TAB_WEI, terms.deadline_s, reference)
            .await
            .with_context(at)?;
        let waited = Instant::now();
        while market.client.tab(chain.chain_id, escrow_id).await.is_err() {
            if waited.elapsed() > Duration::from_secs(30) {
                anyhow::bail!(
                    "{}: the exchange never saw tab {escrow_id} on chain {}",
                    self.name,
                    chain.chain_id
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let session_key = self.session(market, side, escrow_id).await?;
        // Standing orders on the tab; one refused (say, no bundle with room for the rent yet)
        // is the traffic's error, not the tab's.
        market.count_refused(&self.name, self.reserve(market, side, escrow_id).await);
        if market.adapters_stored.load(Ordering::Acquire) {
            market.count_refused(&self.name, self.rent(market, side, escrow_id).await);
        }
        Ok(OpenTab {
            escrow_id,
            session_key,
            opened: Instant::now(),
            close_after,
            jobs: Vec::new(),
        })
    }

    /// A reserve on fresh tab `escrow_id`: 300 ms of T0 compute over a 10 s window starting in
    /// 3 s, below spot; the providers bid, the lowest feasible bid wins at the start, this
    /// agent's T0 intents in the window draw on it, and the winner claims its take-or-pay at the
    /// end (the tab settles after that).
    async fn reserve(&self, market: &Market, side: usize, escrow_id: u64) -> anyhow::Result<()> {
        let start = now_s() + 3;
        let reserve = cx_protocol::order::Reserve {
            model: market.model.clone(),
            tier: Tier::T0,
            window_start_s: start,
            window_end_s: start + 10,
            compute_ms: 300,
            max_price_wei_per_s: RESERVE_MAX_RATE_WEI_PER_S,
            tab_id: escrow_id,
            nonce: fresh_nonce(),
            expiry_s: start,
        };
        let signed = self.keys.sign(reserve, &market.sides[side].info.domain())?;
        market
            .client
            .submit_reserve(&signed)
            .await
            .context("reserve")?;
        market.stats.reserves.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// A rent on fresh tab `escrow_id`: the most popular adapter kept resident for 12 s (half
    /// the term may be missed before a rebate: the holder fetches it after the rent is
    /// committed). The exchange commits it to the cheapest bundle with room, which pins it and
    /// claims the term at its end (the tab settles after that).
    pub(super) async fn rent(
        &self,
        market: &Market,
        side: usize,
        escrow_id: u64,
    ) -> anyhow::Result<()> {
        let Some(adapter) = market.adapters.first() else {
            return Ok(());
        };
        let rent = cx_protocol::order::Rent {
            target_kind: cx_protocol::order::RentTarget::Adapter,
            target: format!("0x{adapter}").parse()?,
            term_s: 12,
            max_rent_wei: MAX_PRICE_WEI,
            epsilon_ppm: 500_000,
            tab_id: escrow_id,
            nonce: fresh_nonce(),
            expiry_s: now_s() + 60,
        };
        let signed = self.keys.sign(rent, &market.sides[side].info.domain())?;
        market.client.submit_rent(&signed).await.context("rent")?;
        market.stats.rents.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    /// One matrix product in the `cx/matmul-f32` market (T2: the exchange checks it by
    /// Freivalds before it is done), waiting until its job ends; returns its job.
    async fn matmul(
        &self,
        market: &Market,
        side: usize,
        tab: &OpenTab,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<B256> {
        let request = cx_protocol::matmul::MatmulRequest {
            m: rng.gen_range(16..=64),
            k: rng.gen_range(16..=64),
            n: rng.gen_range(16..=64),
            seed_a: rng.r#gen(),
            seed_b: rng.r#gen(),
        };
        let order = Order {
            want: cx_protocol::matmul::MATMUL_MODEL.to_owned(),
            workload: request.into(),
            adapter_id: None,
            min_tier: Tier::T2,
            determinism: DeterminismClass::DInf,
        };
        self.order(market, side, tab, order, &market.stats.matmuls)
            .await
    }

    /// One train order in the model's `cx/train/<base>` market: a few random byte sequences
    /// stored as a dataset, a rank-4 LoRA on q and v trained for a few steps (T0, class S),
    /// waiting until its job ends; returns its job. The adapter it yields is resident on its
    /// trainer and in the store, like any other.
    async fn train(
        &self,
        market: &Market,
        side: usize,
        tab: &OpenTab,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<B256> {
        use cx_protocol::train::{Dataset, TrainRequest, train_market};
        let (sequences, loss_mask) = (0..rng.gen_range(2..=6))
            .map(|_| {
                let len = rng.gen_range(3..=12);
                // BOS, then bytes: the generated models' byte tokenizer.
                let tokens: Vec<u32> = std::iter::once(256)
                    .chain((1..len).map(|_| rng.gen_range(32..127)))
                    .collect();
                let mask = std::iter::once(0.0).chain((1..len).map(|_| 1.0)).collect();
                (tokens, mask)
            })
            .unzip();
        let file = serde_json::to_vec(&Dataset {
            sequences,
            loss_mask,
        })?;
        let data = self
            .own(market)
            .put_dataset(&file)
            .await
            .context("storing a dataset")?
            .id;
        let mut request = TrainRequest::example(&data);
        request.steps = rng.gen_range(3..=8);
        request.batch_size = 2;
        request.lora.rank = 4;
        request.lora.lora_alpha = 8.0;
        request.lora.target_modules = vec!["q_proj".into(), "v_proj".into()];
        request.lora.seed = rng.r#gen();
        let order = Order {
            want: train_market(&market.model),
            workload: request.into(),
            adapter_id: None,
            min_tier: Tier::T0,
            determinism: DeterminismClass::S,
        };
        self.order(market, side, tab, order, &market.stats.trains)
            .await
    }

    /// A session key on tab `escrow_id` (as `cx agent session` makes one).
    async fn session(
        &self,
        market: &Market,
        side: usize,
        escrow_id: u64,
    ) -> anyhow::Result<String> {
        let mut secret = [0u8; 32];
        getrandom::fill(&mut secret).map_err(|e| anyhow::anyhow!("no randomness: {e}"))?;
        let key = format!("cxs_{}", hex::encode(secret));
        let grant = SessionGrant {
            tab_id: escrow_id,
            spend_cap_wei: TAB_WEI,
            expiry_s: now_s() + TAB_DEADLINE_S - 300,
            default_deadline_s: 60,
            default_tier: market.verified_tier,
            default_determinism: DeterminismClass::D,
            default_max_price_wei: MAX_PRICE_WEI,
            bearer_hash: SessionGrant::bearer_hash_of(key.as_bytes()),
            nonce: fresh_nonce(),
        };
        let signed = self.keys.sign(grant, &market.sides[side].info.domain())?;
        market
            .client
            .open_session(&signed)
            .await
            .with_context(|| format!("{}: session on tab {escrow_id}", self.name))?;
        Ok(key)
    }

    /// Sends work until the task is aborted: one call at a time, alternating chains; each tab
    /// closed when its time is up and replaced by a fresh one.
    pub(super) async fn run(
        self,
        market: Arc<Market>,
        mut tabs: Vec<OpenTab>,
        closed: mpsc::UnboundedSender<Closed>,
        seed: u64,
    ) {
        let mut rng = ChaCha20Rng::seed_from_u64(seed);
        let weights: Vec<f64> = (1..=market.adapters.len())
            .map(|k| 1.0 / (k as f64).powf(ZIPF_S))
            .collect();
        let popularity = WeightedIndex::new(&weights).ok();
        let mut turn = 0usize;
        loop {
            turn += 1;
            let side = turn % tabs.len();
            if tabs[side].opened.elapsed() >= tabs[side].close_after {
                self.rotate(&market, &mut tabs, side, &closed, &mut rng)
                    .await;
            }
            // A fifth of the calls on the base model alone; the rest on an adapter.
            let adapter = match &popularity {
                Some(p) if rng.gen_bool(0.8) => Some(market.adapters[p.sample(&mut rng)].clone()),
                _ => None,
            };
            let done = if rng.gen_bool(0.05) {
                self.search(&market, side, &tabs[side], &mut rng).await
            } else if rng.gen_bool(0.05) {
                self.matmul(&market, side, &tabs[side], &mut rng).await
            } else if rng.gen_bool(0.03) {
                self.train(&market, side, &tabs[side], &mut rng).await
            } else if rng.gen_bool(0.25) {
                self.intent(&market, side, &tabs[side], adapter, &mut rng)
                    .await
            } else {
                self.chat(&market, &tabs[side], adapter, &mut rng).await
            };
            match done {
                Ok(job) => tabs[side].jobs.push(job),
                Err(e) => {
                    market.stats.errors.fetch_add(1, Ordering::Relaxed);
                    market.note(&format!("{}: {e:#}", self.name));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
            let pause = rng.gen_range(300..900);
            tokio::time::sleep(Duration::from_millis(pause)).await;
        }
    }

    /// Asks the exchange to settle tab `side` and opens a fresh one in its place.
    async fn rotate(
        &self,
        market: &Market,
        tabs: &mut [OpenTab],
        side: usize,
        closed: &mpsc::UnboundedSender<Closed>,
        rng: &mut ChaCha20Rng,
    ) {
        let chain = &market.sides[side].info;
        let old = &tabs[side];
        match market
            .client
            .close_tab(
                &self.keys,
                chain.chain_id,
                chain.verifying_contract,
                old.escrow_id,
            )
            .await
        {
            Ok(_) => {
                market.stats.tabs_closed.fetch_add(1, Ordering::Relaxed);
                let _ = closed.send(Closed {
                    chain_id: chain.chain_id,
                    escrow_id: old.escrow_id,
                    jobs: old.jobs.clone(),
                    reader: self.own(market).clone(),
                });
            }
            Err(e) => {
                market.stats.errors.fetch_add(1, Ordering::Relaxed);
                market.note(&format!(
                    "{}: closing tab {} on chain {}: {e}",
                    self.name, old.escrow_id, chain.chain_id
                ));
            }
        }
        let close_after = Duration::from_secs(rng.gen_range(20..=30));
        match self.open_tab(market, side, close_after).await {
            Ok(tab) => tabs[side] = tab,
            Err(e) => {
                market.stats.errors.fetch_add(1, Ordering::Relaxed);
                market.note(&format!("{}: {e:#}", self.name));
                // Tried again after the next close_after.
                tabs[side].opened = Instant::now();
                tabs[side].jobs.clear();
            }
        }
    }

    /// One OpenAI-door chat on the tab's session key; returns its job.
    async fn chat(
        &self,
        market: &Market,
        tab: &OpenTab,
        adapter: Option<String>,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<B256> {
        let mut body = json!({
            "model": market.model,
            "messages": [{"role": "user", "content": prompt(rng)}],
            "max_tokens": rng.gen_range(4..=16),
        });
        if let Some(id) = adapter {
            body["cx"] = json!({"adapter_id": format!("0x{id}")});
        }
        let completion = market
            .client
            .chat(&tab.session_key, &body)
            .await
            .context("chat")?;
        market.stats.chats.fetch_add(1, Ordering::Relaxed);
        completion["cx"]["job_id"]
            .as_str()
            .and_then(|id| id.parse().ok())
            .ok_or_else(|| anyhow::anyhow!("a completion without cx.job_id: {completion}"))
    }

    /// One signed intent on the tab, waiting until its job is done (so no tab closes under a
    /// job still running); returns its job.
    async fn intent(
        &self,
        market: &Market,
        side: usize,
        tab: &OpenTab,
        adapter: Option<String>,
        rng: &mut ChaCha20Rng,
    ) -> anyhow::Result<B256> {
        let request = InferenceRequest::completion(prompt(rng), rng.gen_range(4..=16));
        // Mostly T1 (class D: re-executed on a second provider, paid only once both agree),
        // some T0 (stake only), some T3 (three operators, majority) where the fleet has them.
        let min_tier = match rng.gen_range(0..20) {
            0..=5 => Tier::T0,
            6..=8 if market.t3 => Tier::T3,
            _ => market.verified_tier,
        };
        let order = Order {
            want: market.model.clone(),
            workload: request.into(),
            adapter_id: adapter.map(|a| format!("0x{a}").parse()).transpose()?,
            min_tier,
            determinism: DeterminismClass::D,
        };
        self.order(market, side, tab, order, &market.stats.intents)
            .await
    }

    /// Signs an intent on `tab` for `order` (due in 60 s at the traffic's price limit, with a
    /// fresh nonce), submits it, counts it in `counted` and waits until its job ends (so no tab
    /// closes under a job still running); returns its job.
    async fn order(
        &self,
        market: &Market,
        side: usize,
        tab: &OpenTab,
        order: Order,
        counted: &AtomicU64,
    ) -> anyhow::Result<B256> {
        let now = now_s();
        let intent = Intent {
            want: order.want,
            adapter_id: order.adapter_id,
            request_hash: order.workload.hash(),
            deadline_s: now + 60,
            max_price_wei: MAX_PRICE_WEI,
            market_limit: false,
            min_tier: order.min_tier,
            determinism: order.determinism,
            tab_id: tab.escrow_id,
            nonce: fresh_nonce(),
            expiry_s: now + 60,
        };
        let kind = order.workload.kind().as_str();
        let signed = self.keys.sign(intent, &market.sides[side].info.domain())?;
        let accepted = market
            .client
            .submit(&signed, order.workload)
            .await
            .context(kind)?;
        counted.fetch_add(1, Ordering::Relaxed);
        wait_ended(self.own(market), accepted.job_id).await
    }
}

/// What one of the traffic's intents orders.
struct Order {
    /// The market.
    want: String,
    /// What it computes.
    workload: Workload,
    /// The adapter, by content id.
    adapter_id: Option<B256>,
    /// The weakest tier accepted.
    min_tier: Tier,
    /// The class.
    determinism: DeterminismClass,
}

/// Waits until job `id` ends (so no tab closes under a job still running); returns it.
async fn wait_ended(reader: &Client, id: B256) -> anyhow::Result<B256> {
    let waited = Instant::now();
    loop {
        let job = reader.job(id).await?;
        if job.status.is_terminal() {
            return Ok(id);
        }
        if waited.elapsed() > Duration::from_secs(30) {
            anyhow::bail!("job {id} still {}", job.status);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The most a search may cost, wei: its budget (99 % at 12 zero bits, ~19 000 trials) at the
/// devnet's asks (~10^6 wei/s) and a search worker's rate (~10^5 trials/s in a debug build,
/// ~3·10^6 in a release one) is ~6 000–200 000 wei; a witness is paid ~22 % of it.
const SEARCH_PRICE_WEI: u128 = 1_000_000;

/// A short prompt, different each call (so the receipts' output hashes differ).
fn prompt(rng: &mut ChaCha20Rng) -> String {
    const WORDS: [&str; 12] = [
        "hello",
        "market",
        "adapter",
        "residency",
        "batch",
        "settle",
        "tab",
        "chain",
        "signer",
        "provider",
        "escrow",
        "receipt",
    ];
    (0..rng.gen_range(3..8))
        .map(|_| WORDS[rng.gen_range(0..WORDS.len())])
        .collect::<Vec<_>>()
        .join(" ")
}

/// One adapter directory's two files and their content id.
fn read_adapter(dir: &Path) -> anyhow::Result<(String, Vec<u8>, String)> {
    let config = std::fs::read(dir.join("adapter_config.json"))
        .with_context(|| format!("{}", dir.display()))?;
    let weights = std::fs::read(dir.join("adapter_model.safetensors"))
        .with_context(|| format!("{}", dir.display()))?;
    let id = cx_protocol::content_id(&[
        ("adapter_config.json", &config),
        ("adapter_model.safetensors", &weights),
    ]);
    let text = String::from_utf8(config).context("adapter_config.json is not UTF-8")?;
    Ok((text, weights, id))
}

/// The content id of the adapter in `dir`.
pub(super) fn adapter_id(dir: &Path) -> anyhow::Result<String> {
    Ok(read_adapter(dir)?.2)
}

/// Stores the adapter in `dir` at the exchange with `client`'s account (it owns it, its quota
/// pays); returns its content id.
pub(super) async fn put_adapter(client: &Client, dir: &Path) -> anyhow::Result<String> {
    let (text, weights, id) = read_adapter(dir)?;
    let stored = client
        .put_adapter(&text, &weights, Some(&id))
        .await
        .with_context(|| format!("storing {}", dir.display()))?;
    Ok(stored.id)
}
