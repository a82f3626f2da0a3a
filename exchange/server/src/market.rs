//! The market the service clears on: the model catalog and the matching engine, whose memory is a
//! cache of the books' bundles (rebuilt at start, written through on every registration).

use crate::books::{Books, MarketQuote, OpenWork, Provider};
use crate::error::Result;
use crate::jobs::placement::DECISION_KEEPS;
use crate::preferences::{PreferenceView, Preferences};
use alloy::primitives::Address;
use alloy::primitives::B256;
use cx_exchange::clearing::Decision;
use cx_exchange::engine::Engine;
use cx_exchange::feasibility::{PriceCeiling, price_ceiling};
use cx_exchange::objective::Weights;
use cx_exchange::pricing::load::{Arrivals, MarketLoad, WINDOW_S};
use cx_exchange::pricing::market::{MARKET_TIERS, MarketMaker, MarketParams, Quote, tier_index};
use cx_exchange::pricing::tenant::DeltaParts;
use cx_exchange::routing::catalog::Catalog;
use cx_protocol::{Bundle, Job, Tier};
use std::collections::HashMap;
use std::sync::{Mutex, RwLock};

/// The catalog, the engine and the market maker.
#[derive(Debug)]
pub struct Market {
    catalog: Catalog,
    engine: RwLock<Engine>,
    maker: RwLock<MarketMaker>,
    /// Work arriving into each market over the last seconds, refused orders included: the
    /// maker's offered load, by catalog model (its index) and tier. Counted here as orders are
    /// cleared (a refused order leaves nothing in the books to read back).
    arrivals: Mutex<Vec<PerTier<Arrivals>>>,
    /// Every tenant's preference over the shared quote, learned from its market orders.
    preferences: Mutex<Preferences>,
    /// The live inference bundles' median throughput, FLOP/s as f64 bits (0: none), kept at
    /// every change of the fleet so that an order's arrival does not sort the fleet.
    median_flops_per_s: std::sync::atomic::AtomicU64,
    policy: cx_exchange::clearing::Policy,
    /// Held across an offer's transaction and its write to the engine: two offers of one
    /// provider committed A then B but applied to the engine B then A would leave A's
    /// withdrawn bundles live in the engine, out of the books' reach until a restart.
    offers: tokio::sync::Mutex<()>,
    /// Each bundle's fellows under one on-chain identity, as the books last said: read once per
    /// bundle instead of once per verification run placed. Only a registration changes them,
    /// and every registration goes through this market, which forgets them then.
    identities: Mutex<Identities>,
}

/// [`Market::same_identity_bundles`]' memory: the groups read since the last registration,
/// and how many registrations there were (a read that straddles one is not kept).
#[derive(Debug, Default)]
struct Identities {
    generation: u64,
    groups: HashMap<String, std::sync::Arc<[String]>>,
}

/// Bundles whose identity groups are kept at most; past it the memory starts over (the books
/// have them all).
const IDENTITIES_KEPT: usize = 100_000;

impl Market {
    /// A market over `catalog` with no bundles yet.
    pub fn new(catalog: Catalog, weights: Weights) -> Result<Self> {
        let models = catalog.models().len();
        Ok(Self {
            preferences: Mutex::new(Preferences::new(models)),
            catalog,
            engine: RwLock::new(Engine::new(weights)?),
            maker: RwLock::new(MarketMaker::new(MarketParams::default())?),
            arrivals: Mutex::new(vec![PerTier::default(); models]),
            median_flops_per_s: std::sync::atomic::AtomicU64::new(0),
            policy: Default::default(),
            offers: tokio::sync::Mutex::new(()),
            identities: Mutex::default(),
        })
    }

    /// The same market ranking feasible bundles by `policy` (residency-aware by default;
    /// cheapest-capable to measure what pricing residency is worth).
    pub fn with_policy(mut self, policy: cx_exchange::clearing::Policy) -> Self {
        self.policy = policy;
        self
    }

    /// How it ranks feasible bundles.
    pub fn policy(&self) -> cx_exchange::clearing::Policy {
        self.policy
    }

    /// The engine rebuilt from every bundle the books hold, and the tenants' preferences read
    /// back (at start: the books are the truth).
    pub async fn load(&self, books: &Books) -> Result<usize> {
        {
            let stored = books.tenant_preferences().await?;
            let mut preferences = self.preferences.lock().unwrap_or_else(|e| e.into_inner());
            for (account, parts, observations) in &stored {
                preferences.restore(*account, parts, *observations);
            }
        }
        self.forget_identities();
        let bundles = books.bundles().await?;
        let mut engine = Engine::new(*self.engine_read().weights())?;
        for bundle in bundles {
            engine.upsert(bundle)?;
        }
        let count = engine.len();
        *self.engine.write().unwrap_or_else(|e| e.into_inner()) = engine;
        self.reopen()?;
        Ok(count)
    }

    /// Registers a bundle: validated, written to the books first, then to the engine.
    pub async fn register(&self, books: &Books, bundle: Bundle) -> Result<()> {
        bundle.validate().map_err(|e| e.within("bundle"))?;
        books.upsert_bundle(&bundle).await?;
        self.forget_identities();
        self.engine
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .upsert(bundle)?;
        self.reopen()
    }

    /// Registers a provider's offered bundles: validated, written to the books with the provider
    /// in one transaction, then to the engine. The offer replaces the provider's set: the
    /// bundles it no longer offers leave the engine ([`Books::register_provider`] says what
    /// becomes of their rows and jobs).
    pub async fn register_offer(
        &self,
        books: &Books,
        provider: &Provider,
        token_hash: B256,
        offer: &serde_json::Value,
        bundles: Vec<Bundle>,
    ) -> Result<()> {
        for (i, bundle) in bundles.iter().enumerate() {
            bundle
                .validate()
                .map_err(|e| e.within(&format!("offer.bundles[{i}]")))?;
        }
        let _one_at_a_time = self.offers.lock().await;
        let withdrawn = books
            .register_provider(provider, token_hash, offer, &bundles)
            .await?;
        self.forget_identities();
        {
            let mut engine = self.engine.write().unwrap_or_else(|e| e.into_inner());
            for id in &withdrawn {
                // Absent already when its provider had gone silent.
                if engine.bundle(id).is_some() {
                    engine.remove(id)?;
                }
            }
            for bundle in bundles {
                engine.upsert(bundle)?;
            }
        }
        self.reopen()
    }

    /// Every bundle of the same on-chain identity as bundle `id` (its provider's key, or its
    /// payout address), from [`Books::same_identity_bundles`] once per registration.
    pub async fn same_identity_bundles(
        &self,
        books: &Books,
        id: &str,
    ) -> Result<std::sync::Arc<[String]>> {
        let generation = {
            let identities = self.identities.lock().unwrap_or_else(|e| e.into_inner());
            if let Some(group) = identities.groups.get(id) {
                return Ok(group.clone());
            }
            identities.generation
        };
        let group: std::sync::Arc<[String]> = books.same_identity_bundles(id).await?.into();
        let mut identities = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        // A registration committed while the books were read may have changed the group.
        if identities.generation == generation {
            if identities.groups.len() >= IDENTITIES_KEPT {
                identities.groups.clear();
            }
            identities.groups.insert(id.to_owned(), group.clone());
        }
        Ok(group)
    }

    /// A registration was written to the books: the identity groups read before it may be stale.
    fn forget_identities(&self) {
        let mut identities = self.identities.lock().unwrap_or_else(|e| e.into_inner());
        identities.generation += 1;
        identities.groups.clear();
    }

    /// Takes the bundles `ids` out of the engine (their provider went silent); the books keep
    /// them, and the provider's next offer puts them back. Returns how many were live.
    pub fn drop_bundles(&self, ids: &[String]) -> Result<usize> {
        let mut dropped = 0;
        {
            let mut engine = self.engine.write().unwrap_or_else(|e| e.into_inner());
            for id in ids {
                if engine.bundle(id).is_some() {
                    engine.remove(id)?;
                    dropped += 1;
                }
            }
        }
        if dropped > 0 {
            self.reopen()?;
        }
        Ok(dropped)
    }

    /// The median ask of the live bundles, wei per compute-second (none: no market).
    fn reference_wei_per_s(&self) -> Option<u64> {
        median(
            self.engine_read().bundles().map(|b| b.price_wei_per_s),
            Ord::cmp,
        )
    }

    /// Opens (or re-references) every catalog model's markets at the fleet's median ask, so
    /// quotes follow what providers ask; the maker's state (phase, belief) carries over.
    fn reopen(&self) -> Result<()> {
        let flops_per_s = median(
            self.engine_read()
                .bundles()
                .filter(|b| sells_inference(b))
                .map(|b| b.flops_per_s),
            f64::total_cmp,
        );
        self.median_flops_per_s.store(
            flops_per_s.unwrap_or(0.0).to_bits(),
            std::sync::atomic::Ordering::Relaxed,
        );
        let Some(reference) = self.reference_wei_per_s().filter(|r| *r > 0) else {
            return Ok(());
        };
        let per_hour = cx_protocol::price::to_units(reference) * 3600.0;
        let mut maker = self.maker.write().unwrap_or_else(|e| e.into_inner());
        for model in self.catalog.models() {
            maker.open(&model.name, per_hour)?;
        }
        Ok(())
    }

    /// Every open market's quote with no deadline pressure, by model then tier.
    pub fn quotes(&self) -> Result<Vec<MarketQuote>> {
        let Some(reference_wei_per_s) = self.reference_wei_per_s() else {
            return Ok(Vec::new());
        };
        let maker = self.maker.read().unwrap_or_else(|e| e.into_inner());
        let mut out = Vec::new();
        for (model, tier, state) in maker.markets() {
            let quote = self.at_least_a_seller(maker.quote(model, tier, 3600.0, 0.0)?, tier);
            out.push(MarketQuote {
                model: model.to_owned(),
                tier,
                bid_wei_per_s: quote.bid_wei_per_s,
                ask_wei_per_s: quote.ask_wei_per_s,
                regime: quote.regime,
                belief: state.belief,
                observations: state.observations,
                reference_wei_per_s,
            });
        }
        Ok(out)
    }

    /// Counts `compute_s` of work placed on bundle `bundle_id` into its queue at once: the next
    /// clear sees it, before the sweep reads the books again.
    pub fn placed(&self, bundle_id: &str, compute_s: f64) {
        let compute_s = if compute_s.is_finite() {
            compute_s.max(0.0)
        } else {
            0.0
        };
        let mut engine = self.engine.write().unwrap_or_else(|e| e.into_inner());
        if let Some(queued) = engine.queue_s(bundle_id) {
            // Finite and ≥ 0 both: accepted.
            let _ = engine.set_queue_s(bundle_id, queued + compute_s);
        }
    }

    /// Counts `job` arriving at `now_s` into its market (model × tier) — demand, whether it
    /// is then placed or refused: refused orders are load the fleet did not take, and a maker
    /// that saw only placed work would stay calm while orders bounce. Its work is its t_compute
    /// at the fleet's median throughput times its tier's executions (a T1 job runs twice).
    pub fn arrived(&self, job: &Job, now_s: u64) {
        let (Some(flops_per_s), Some(model), Ok(tier)) = (
            self.median_flops_per_s(),
            self.model_index(&job.base_model),
            tier_index(job.tier),
        ) else {
            return;
        };
        let work_s = job.compute_flops / flops_per_s * (1.0 + job.tier.verification_work());
        self.arrivals.lock().unwrap_or_else(|e| e.into_inner())[model][tier].record(now_s, work_s);
    }

    /// The position of catalog model `name` (the index of its markets' state here).
    fn model_index(&self, name: &str) -> Option<usize> {
        self.catalog.models().iter().position(|m| m.name == name)
    }

    /// One sweep's load at `now_s`, from the books' `open` work: every live bundle's queue set
    /// to its open work (t̂ counts it), and every open market that some bundle offers (its tier,
    /// holding its base) observed by the maker — its regime and price move. Returns how many
    /// markets were observed.
    pub fn observe_load(&self, open: &[OpenWork], now_s: u64) -> Result<usize> {
        let models = self.catalog.models().len();
        let mut loads = vec![PerTier::<MarketLoad>::default(); models];
        let mut queues: HashMap<&str, f64> = HashMap::new();
        for w in open {
            *queues.entry(&w.bundle_id).or_default() += w.compute_s;
            if let (Some(m), Ok(t)) = (self.model_index(&w.model), tier_index(w.tier)) {
                loads[m][t].committed_jobs += w.jobs;
                loads[m][t].committed_s += w.compute_s;
            }
        }
        {
            let mut engine = self.engine.write().unwrap_or_else(|e| e.into_inner());
            let ids: Vec<String> = engine.bundles().map(|b| b.id.clone()).collect();
            for id in ids {
                engine.set_queue_s(&id, queues.get(id.as_str()).copied().unwrap_or(0.0))?;
            }
            for b in engine.bundles() {
                for m in b.resident_bases.iter().filter_map(|n| self.model_index(n)) {
                    for t in b.tiers.iter().filter_map(|t| tier_index(t).ok()) {
                        loads[m][t].servers += 1;
                    }
                }
            }
        }
        let arrivals = self.arrivals.lock().unwrap_or_else(|e| e.into_inner());
        let mut maker = self.maker.write().unwrap_or_else(|e| e.into_inner());
        let mut observed = 0;
        for (m, model) in self.catalog.models().iter().enumerate() {
            for (t, tier) in MARKET_TIERS.into_iter().enumerate() {
                if maker.state(&model.name, tier).is_none() {
                    continue;
                }
                let load = &mut loads[m][t];
                (load.arrived_jobs, load.arrived_s) = arrivals[m][t].in_window(now_s);
                if let Some(observation) = load.observation(WINDOW_S as f64) {
                    maker.observe(&model.name, tier, &observation)?;
                    observed += 1;
                }
            }
        }
        Ok(observed)
    }

    /// The market's quote for `job` (its model, the tier it is cleared at, its deadline and its
    /// work at the fleet's median throughput), seen through its buyer's preference: deterministic
    /// given the job and the market's state. `None` where no market is open for it (no live
    /// bundle yet, or a model outside the catalog).
    pub fn quote_for(&self, job: &Job) -> Result<Option<Quoted>> {
        let Some(flops_per_s) = self.median_flops_per_s() else {
            return Ok(None);
        };
        let Some(model_index) = self.model_index(&job.base_model) else {
            return Ok(None);
        };
        let compute_s = job.compute_flops / flops_per_s;
        let shared = {
            let maker = self.maker.read().unwrap_or_else(|e| e.into_inner());
            if maker.state(&job.base_model, job.tier).is_none() {
                return Ok(None);
            }
            maker.quote(&job.base_model, job.tier, job.deadline_s, compute_s)?
        };
        let cell = cx_exchange::pricing::tenant::cell(model_index, compute_s / job.deadline_s);
        let cheapest = self.cheapest_able(job);
        let shared = at_least(shared, cheapest);
        let log_multiplier = job.agent.parse::<Address>().map_or(0.0, |account| {
            self.preferences
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .multiplier(account, shared.regime, cell)
        });
        let preferred = cx_exchange::pricing::market::with_preference(&shared, log_multiplier)?;
        Ok(Some(Quoted {
            quote: at_least(preferred, cheapest),
            shared_ask_wei_per_s: shared.ask_wei_per_s,
            cell,
            log_multiplier,
        }))
    }

    /// `quote` with its ask raised, if need be, to the cheapest live inference bundle offering
    /// `tier` (what `GET /v1/market` shows; a job's own quote is floored at the cheapest bundle
    /// able to run it, [`Market::quote_for`]): the maker leans its price down to fill idle
    /// capacity (to e^−1.5 of the fleet's median ask when a market sits empty), but a quote
    /// under every seller's ask is no price at all — no market order could fill at it. A calm
    /// market trades at its cheapest seller; a busy one admits dearer ones. Bundles of the
    /// exchange's own job kinds (`cx/…`) sell no inference and do not count.
    fn at_least_a_seller(&self, quote: Quote, tier: Tier) -> Quote {
        let cheapest = self
            .engine_read()
            .bundles()
            .filter(|b| b.tiers.contains(tier) && sells_inference(b))
            .map(|b| b.price_wei_per_s)
            .min();
        at_least(quote, cheapest)
    }

    /// The least ask among the live bundles that could run `job` by its deadline, price aside
    /// (memory, context, class, tier, t̂ with their queues).
    fn cheapest_able(&self, job: &Job) -> Option<u64> {
        let engine = self.engine_read();
        engine
            .candidates(job)
            .iter()
            .filter(|c| {
                let t_hat = cx_exchange::feasibility::completion_s(job, &c.view);
                cx_exchange::feasibility::is_feasible(job, &c.view, t_hat)
            })
            .map(|c| c.view.price_wei_per_s)
            .min()
    }

    /// Teaches `job`'s buyer what its market order `quoted` met in `decision`: the log
    /// multiplier of the shared quote that would just have sufficed — the chosen bundle's ask
    /// over the shared ask, or, refused only on price, the cheapest such bundle's.
    pub fn learn(&self, job: &Job, quoted: &Quoted, decision: &Decision) {
        let Ok(account) = job.agent.parse::<Address>() else {
            return;
        };
        let ask = {
            let engine = self.engine_read();
            let ask_of = |id: &str| engine.bundle(id).map(|b| b.price_wei_per_s);
            match decision.chosen.as_deref() {
                Some(id) => ask_of(id),
                None => decision
                    .rejected
                    .iter()
                    .filter(|r| {
                        r.violations.len() == 1
                            && r.binding == cx_protocol::decision::Constraint::Price
                    })
                    .filter_map(|r| ask_of(&r.id))
                    .min(),
            }
        };
        let Some(ask) = ask.filter(|a| *a > 0) else {
            return;
        };
        let target = (ask as f64 / quoted.shared_ask_wei_per_s.max(1) as f64).ln();
        self.preferences
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .learn(account, quoted.quote.regime, quoted.cell, target);
    }

    /// The preferences changed since the last call, to be written to the books.
    pub fn changed_preferences(&self) -> Vec<(Address, DeltaParts, u64)> {
        self.preferences
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take_changed()
    }

    /// `account`'s preference, as the explorer shows it.
    pub fn preference_of(&self, account: Address) -> Option<PreferenceView> {
        self.preferences
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .view(account)
    }

    /// The median throughput of the live inference bundles, FLOP/s (none: no market).
    fn median_flops_per_s(&self) -> Option<f64> {
        let bits = self
            .median_flops_per_s
            .load(std::sync::atomic::Ordering::Relaxed);
        Some(f64::from_bits(bits)).filter(|f| *f > 0.0)
    }

    /// The catalog.
    pub fn catalog(&self) -> &Catalog {
        &self.catalog
    }

    /// Every live bundle, by id.
    pub fn bundles(&self) -> Vec<Bundle> {
        let engine = self.engine_read();
        let mut out: Vec<Bundle> = engine.bundles().cloned().collect();
        out.sort_by(|a, b| a.id.cmp(&b.id));
        out
    }

    /// The maker's regime belief (calm, busy, surge) for `model`'s market at `tier`; uniform
    /// where no market is open (nothing is known of its regime).
    pub fn belief(&self, model: &str, tier: Tier) -> [f64; cx_exchange::pricing::hmm::REGIMES] {
        let maker = self.maker.read().unwrap_or_else(|e| e.into_inner());
        maker.state(model, tier).map_or(
            [1.0 / cx_exchange::pricing::hmm::REGIMES as f64; cx_exchange::pricing::hmm::REGIMES],
            |s| s.belief,
        )
    }

    /// The clearing decision for `job` as a job keeps it (the chosen bundle and its terms, the
    /// [`DECISION_KEEPS`] cheapest feasible and nearest refused bundles, how many of each), and
    /// what the chosen bundle would charge for it, wei. Under a market `quote`, a bundle asking
    /// more than its ask is refused (binding: price).
    pub fn clear(&self, job: &Job, quote: Option<&Quote>) -> Result<(Decision, Option<u128>)> {
        self.clear_where(job, &price_ceiling(job, quote), |_| true)
    }

    /// The clearing decision for `job` on bundle `bundle_id` alone, with no price gate: a job a
    /// reserve pays for goes to the committed bundle if it is feasible there by its deadline
    /// (`chosen` is `None` otherwise, with the binding constraint among `rejected`).
    pub fn clear_on(&self, job: &Job, bundle_id: &str) -> Result<Decision> {
        let (decision, _) =
            self.clear_where(job, &PriceCeiling::default(), |b| b.id == bundle_id)?;
        Ok(decision)
    }

    /// [`Market::clear`] over only the live bundles `keep` accepts (a verification run goes to a
    /// provider other than those already running the job), ranked by the same policy.
    pub fn clear_among(
        &self,
        job: &Job,
        keep: impl Fn(&Bundle) -> bool,
    ) -> Result<(Decision, Option<u128>)> {
        self.clear_where(job, &price_ceiling(job, None), keep)
    }

    fn clear_where(
        &self,
        job: &Job,
        ceiling: &PriceCeiling,
        accept: impl Fn(&Bundle) -> bool,
    ) -> Result<(Decision, Option<u128>)> {
        let engine = self.engine_read();
        let decision = engine.explain_kept(job, ceiling, self.policy, DECISION_KEEPS, accept)?;
        let charge = decision
            .chosen
            .as_deref()
            .and_then(|id| engine.bundle(id))
            .map(|b| charge_on(b, job));
        Ok((decision, charge))
    }

    /// The operator of live bundle `id`.
    pub fn operator_of(&self, id: &str) -> Option<String> {
        self.engine_read().bundle(id).map(|b| b.provider.clone())
    }

    /// The kernel corpus bundle `id` runs class D on (`None`: it names none, or is unknown).
    pub fn kernel_corpus_of(&self, id: &str) -> Option<String> {
        self.engine_read()
            .bundle(id)
            .and_then(|b| b.kernel_corpus.clone())
    }

    fn engine_read(&self) -> std::sync::RwLockReadGuard<'_, Engine> {
        // A panic while holding the lock cannot leave the engine half-written: every mutation is
        // one `upsert`, which validates before it changes anything.
        self.engine.read().unwrap_or_else(|e| e.into_inner())
    }
}

/// One value per market tier ([`MARKET_TIERS`], by [`tier_index`]).
type PerTier<T> = [T; MARKET_TIERS.len()];

/// The median of `values` under `cmp` (the upper one of an even count; none of none).
fn median<T: Copy>(
    values: impl Iterator<Item = T>,
    cmp: impl Fn(&T, &T) -> std::cmp::Ordering,
) -> Option<T> {
    let mut values: Vec<T> = values.collect();
    values.sort_unstable_by(cmp);
    values.get(values.len() / 2).copied()
}

/// `quote` with its ask raised to `floor` if it is under it.
fn at_least(quote: Quote, floor: Option<u64>) -> Quote {
    match floor {
        Some(ask) if ask > quote.ask_wei_per_s => Quote {
            ask_wei_per_s: ask,
            ..quote
        },
        _ => quote,
    }
}

/// Whether bundle `b` sells inference: not one of the exchange's own job kinds' bundles (`cx/…`
/// bases: products, training), whose asks and throughputs are of other work.
fn sells_inference(b: &Bundle) -> bool {
    !b.resident_bases
        .iter()
        .any(|m| m.starts_with(cx_protocol::job::KERNEL_MARKET_PREFIX))
}

/// What `job` costs on bundle `b` at its ask: a holder of the job's prefix charges for the rest
/// of the prefill only.
fn charge_on(b: &Bundle, job: &Job) -> u128 {
    let holds = cx_exchange::engine::holds_prefix(b, job);
    let flops = cx_exchange::objective::compute_flops_on(job, holds);
    cx_protocol::price::charge_wei(b.price_wei_per_s, flops / b.flops_per_s)
}

/// A market order's quote: the maker's quote for the job seen through its buyer's preference
/// (what gates the bundles), and what it was made of.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Quoted {
    /// The quote the order is cleared under.
    pub quote: Quote,
    /// The shared quote's ask (before the buyer's preference), wei per compute-second.
    pub shared_ask_wei_per_s: u64,
    /// The preference cell (model × deadline bucket).
    pub cell: usize,
    /// The buyer's log multiplier applied (0: none yet).
    pub log_multiplier: f64,
}
