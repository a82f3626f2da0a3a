//! Routing by task, live (SPEC §10): a want that names a task instead of a model —
//! `task:<chat|code|reasoning|extraction>` in an intent, `task:<name>` or `cx/auto` (no hint: the
//! featuriser reads the text) at the OpenAI door, and `cx/fanout:N` there — is sent to a catalog
//! model chosen here; the clearing then picks the bundle as for any want.
//!
//! **The arms** are the catalog's models the exchange can clear (a shape, not one of its own
//! `cx/…` job kinds), each sounded on the live market with the job the request would be there:
//! an arm no bundle can take now is left out (with the nearest refusal as the reason), and the
//! others carry live numbers — the cost is what the bundle it would clear to charges, the latency
//! that bundle's t̂ (queue included) — beside the catalog's profile (quality, code, vision).
//! **The ceilings** gate before scoring: t̂ within the deadline, the cost within the order's
//! limit, the context within the model's. **The score** is `u(x, p) − G`
//! ([`cx_exchange::routing::efe::EfeRouter::rank_with_prior`]): the request's utility under the
//! hand-set W is the prior (a code request leans to the coder before anything is known), and
//! G, the expected free energy of the arm's outcomes under its own market's regime belief and
//! the order's preferences, is learned from the meter only. Under a regime shift the beliefs
//! move first, and the outcome counts of the new regime decide. Live, an outcome is known only
//! when its job ends, a deadline later, and an arm can change within a regime: routed jobs
//! still open count as outcomes on their way (the information gain of one more request is
//! taken after them), each outcome keeps [`RETENTION`] of its regime's counts, and all evidence
//! fades with a half-life of [`EVIDENCE_HALF_LIFE_S`] (an arm left alone is probed again).
//!
//! **The meter** is the books' `exchange_meter`: every sweep meters the routed jobs that ended
//! (cost charged, latency from order to end, quality 1 when answered and paid, 0 when not) and
//! the router folds the new rows in by sequence, so what it learned survives a restart.
//!
//! The decision of every routed job names its arm and why ([`RouteRecord`]): the features,
//! every arm scored with its utility and G's parts, the arms gated and better arms passed over
//! because no bundle took them when cleared.

use crate::books::Books;
use crate::error::{Error, Result};
use crate::jobs::placement::Want;
use crate::market::Market;
use cx_exchange::meter::Meter;
use cx_exchange::routing::bandit::LinUcb;
use cx_exchange::routing::efe::{EfeConfig, EfeRouter, PriorScored};
use cx_exchange::routing::features::{Classifier, Heuristic, Request, Task};
use cx_exchange::routing::outcome::{OrderTerms, Outcome, Preferences};
use cx_exchange::routing::utility::{Arm, Ceilings, Utility};
use cx_protocol::Job;
use cx_protocol::decision::{RouteCandidate, RouteGate, RouteRecord};
use cx_protocol::order::InferenceRequest;
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::{Mutex, RwLock};

/// The door's model name for "route it": no task hint, the featuriser reads the request.
pub const AUTO: &str = "cx/auto";
/// An intent's `want` (or the door's `model`) naming a task: `task:code`.
pub const TASK_PREFIX: &str = "task:";
/// The door's model name for a fan-out over the top N arms: `cx/fanout:3`.
pub const FAN_OUT_PREFIX: &str = "cx/fanout:";
/// Arms one fanned-out call may go to at most (each is a job the buyer pays for).
pub const MAX_FAN_OUT: usize = 4;

/// Arms whose pending requests are counted at most (the catalog's models: bounded by it).
const MAX_PENDING_ARMS: usize = 4096;

/// The field a routing target is read from (the door names it `model`).
const WANT_FIELD: &str = "intent.order.want";

/// A want naming a task rather than a model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// As the buyer wrote it.
    pub name: String,
    /// The task hint (`None` for `cx/auto` and a fan-out: read from the text).
    pub task: Option<Task>,
    /// Arms to dispatch to (1 but for a fan-out).
    pub fan_out: usize,
}

fn refuse(reason: String) -> Error {
    cx_protocol::Error::InvalidField {
        field: WANT_FIELD.to_owned(),
        reason,
    }
    .into()
}

impl Target {
    /// `model` as a routing target; `None` when it names a model (or an adapter). A task
    /// outside the router's, or a fan-out outside 2..=[`MAX_FAN_OUT`], is refused by name.
    pub fn parse(model: &str) -> Result<Option<Self>> {
        if model == AUTO {
            return Ok(Some(Self {
                name: model.to_owned(),
                task: None,
                fan_out: 1,
            }));
        }
        if let Some(name) = model.strip_prefix(TASK_PREFIX) {
            let task = serde_json::from_value(serde_json::Value::String(name.to_owned())).map_err(
                |_| {
                    refuse(format!(
                        "unknown task {name:?}: task:chat, task:code, task:reasoning or \
                         task:extraction"
                    ))
                },
            )?;
            return Ok(Some(Self {
                name: model.to_owned(),
                task: Some(task),
                fan_out: 1,
            }));
        }
        if let Some(n) = model.strip_prefix(FAN_OUT_PREFIX) {
            let fan_out = n
                .parse::<usize>()
                .ok()
                .filter(|n| (2..=MAX_FAN_OUT).contains(n))
                .ok_or_else(|| {
                    refuse(format!(
                        "cx/fanout:N takes N from 2 to {MAX_FAN_OUT}, got {n:?}"
                    ))
                })?;
            return Ok(Some(Self {
                name: model.to_owned(),
                task: None,
                fan_out,
            }));
        }
        Ok(None)
    }
}

/// How the router ranks the arms that pass the ceilings.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum RouterPolicy {
    /// `u(x, p) − G`, G learned from the meter (the default).
    #[default]
    Efe,
    /// LinUCB on `z = x ⊗ p` from the hand-set W, its reward the metered outcome's `ln C(o)`
    /// under the order's preferences (the baseline the issue measures EFE against).
    LinUcb,
    /// Always the named catalog model while it passes the ceilings (a fixed arm, to measure
    /// regret against).
    Fixed(String),
}

impl std::str::FromStr for RouterPolicy {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s {
            "efe" => Ok(Self::Efe),
            "linucb" => Ok(Self::LinUcb),
            _ => match s.strip_prefix("fixed:") {
                Some(model) if !model.is_empty() => Ok(Self::Fixed(model.to_owned())),
                _ => Err(format!("{s:?}: efe, linucb or fixed:<model>")),
            },
        }
    }
}

impl std::fmt::Display for RouterPolicy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Efe => f.write_str("efe"),
            Self::LinUcb => f.write_str("linucb"),
            Self::Fixed(model) => write!(f, "fixed:{model}"),
        }
    }
}

/// Half-life of what an outcome teaches, seconds: the market maker's regimes last about fifty
/// sweeps (its HMM's 0.98 stay), so evidence older than a spell says little about now, and an
/// arm left alone that long is worth a probe again.
const EVIDENCE_HALF_LIFE_S: f64 = 50.0;

/// Share of an arm's outcome counts kept per outcome metered: live, an arm can change within a
/// regime (its provider fails while its market looks calm), so the router remembers about the
/// last twenty outcomes per regime rather than every one (`cx bench router`'s shift).
const RETENTION: f64 = 0.95;

/// LinUCB's exploration α and ridge λ (the replay's, `cx_exchange::routing::shift`).
const LINUCB_ALPHA: f64 = 0.3;
const LINUCB_LAMBDA: f64 = 1.0;

/// The live router: its outcome models, learned from the books' meter.
#[derive(Debug)]
pub struct TaskRouter {
    policy: RouterPolicy,
    efe: RwLock<EfeRouter>,
    /// Learned from the same meter whatever the policy, so a switch starts warm.
    bandit: RwLock<LinUcb>,
    utility: Utility,
    /// The last meter sequence folded in.
    folded: AtomicI64,
    /// Where the next metering pass starts, unix milliseconds.
    meter_since_ms: AtomicI64,
    /// When the outcome models were last faded.
    faded_at: Mutex<std::time::Instant>,
    /// Per arm, routed jobs placed and not ended yet (what EFE's information gain counts as
    /// already on its way): read from the books every sweep, and counted up here as jobs are
    /// placed between sweeps.
    pending: Mutex<HashMap<String, f64>>,
}

impl Default for TaskRouter {
    fn default() -> Self {
        Self::new(RouterPolicy::Efe)
    }
}

impl TaskRouter {
    /// A router that knows nothing yet, ranking by `policy`.
    pub fn new(policy: RouterPolicy) -> Self {
        let utility = Utility::default();
        Self {
            policy,
            efe: RwLock::new(
                EfeRouter::new(EfeConfig {
                    retention: RETENTION,
                    ..EfeConfig::default()
                })
                .expect("the EFE config is valid"),
            ),
            bandit: RwLock::new(
                LinUcb::new(&utility, LINUCB_LAMBDA, LINUCB_ALPHA)
                    .expect("the LinUCB constants are valid"),
            ),
            utility,
            folded: AtomicI64::new(0),
            meter_since_ms: AtomicI64::new(0),
            faded_at: Mutex::new(std::time::Instant::now()),
            pending: Mutex::new(HashMap::new()),
        }
    }

    /// A job routed to `arm` was placed: its outcome is on its way.
    pub fn dispatched(&self, arm: &str) {
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = pending.get_mut(arm) {
            *n += 1.0;
        } else if pending.len() < MAX_PENDING_ARMS {
            pending.insert(arm.to_owned(), 1.0);
        }
    }

    /// The arms `target` goes to for `request`, best first, each as `want` with the arm's model
    /// and the record its job's decision keeps: every admissible arm for one
    /// target (the caller clears them in turn, passing over any no bundle takes by then), the
    /// top N of a fan-out. `job_for` is the job a want would be (the request's context and
    /// work at the arm's shape). Refused when the want names an adapter (an adapter names its
    /// base: there is nothing to route), and `no_match` when no arm passes, naming why each
    /// was left out.
    pub fn route(
        &self,
        market: &Market,
        target: &Target,
        want: &Want,
        request: &InferenceRequest,
        job_for: impl Fn(&Want) -> Result<Job>,
    ) -> Result<Vec<Want>> {
        if want.adapter_id.is_some() {
            return Err(cx_protocol::Error::InvalidField {
                field: "intent.order.adapter_id".to_owned(),
                reason: format!(
                    "an adapter is trained on one base: name its model, not {:?}",
                    target.name
                ),
            }
            .into());
        }
        let text = request.text();
        let features = Heuristic.features(&Request {
            text,
            max_output_tokens: request.max_tokens,
            task: target.task,
            ..Request::default()
        });
        let mut arms: Vec<Arm> = Vec::new();
        let mut sounded: Vec<(Job, u128, f64)> = Vec::new();
        let mut gated: Vec<RouteGate> = Vec::new();
        for model in market.catalog().models() {
            if model.shape.is_none()
                || model
                    .name
                    .starts_with(cx_protocol::job::KERNEL_MARKET_PREFIX)
            {
                continue;
            }
            let arm_want = Want {
                model: model.name.clone(),
                ..want.clone()
            };
            let job = match job_for(&arm_want) {
                Ok(job) => job,
                Err(err) => {
                    gated.push(gate(&model.name, err.to_string()));
                    continue;
                }
            };
            let (decision, charge) = market.clear(&job, None)?;
            let (Some(charge), Some(terms)) = (charge, decision.terms) else {
                let why = crate::jobs::placement::no_match(&decision).to_string();
                gated.push(gate(&model.name, why));
                continue;
            };
            let context = f64::from(job.context_tokens.max(1));
            let mut arm = model.arm();
            arm.latency_s = terms.completion_s;
            arm.cost_wei_per_mtok = per_mtok(charge, context);
            arm.context_tokens = arm.context_tokens.max(job.context_tokens);
            arms.push(arm);
            sounded.push((job, charge, terms.completion_s));
        }
        let Some((job, _, _)) = sounded.first() else {
            return Err(nothing_routes(target, &gated));
        };
        let context_tokens = job.context_tokens;
        let ceilings = Ceilings {
            max_latency_s: job.deadline_s,
            max_cost_wei_per_mtok: per_mtok(want.max_price_wei, f64::from(context_tokens.max(1))),
            min_quality: want.min_quality,
        };
        for (arm, (_, charge, t_hat)) in arms.iter().zip(&sounded) {
            if *t_hat > ceilings.max_latency_s {
                gated.push(gate(
                    &arm.name,
                    format!(
                        "t̂ {t_hat:.3} s is past the deadline, {:.3} s away",
                        job.deadline_s
                    ),
                ));
            } else if arm.quality < want.min_quality {
                gated.push(gate(
                    &arm.name,
                    format!(
                        "quality {} is under the call's min_quality {}",
                        arm.quality, want.min_quality
                    ),
                ));
            } else if *charge > want.max_price_wei {
                gated.push(gate(
                    &arm.name,
                    format!(
                        "costs {charge} wei, over the limit of {}",
                        want.max_price_wei
                    ),
                ));
            }
        }
        let beliefs: Vec<_> = sounded
            .iter()
            .map(|(job, _, _)| market.belief(&job.base_model, job.tier))
            .collect();
        let pending: Vec<f64> = {
            let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
            arms.iter()
                .map(|a| pending.get(&a.name).copied().unwrap_or(0.0))
                .collect()
        };
        let preferences = Preferences::from_order(&OrderTerms {
            deadline_s: job.deadline_s,
            tier: want.min_tier,
            max_cost_wei: Some(want.max_price_wei),
        })?;
        let ranked = {
            let efe = self.efe.read().unwrap_or_else(|e| e.into_inner());
            let prior = efe.rank_with_prior(
                &arms,
                &ceilings,
                &self.utility,
                &features,
                context_tokens,
                &beliefs,
                &preferences,
                &pending,
            );
            match &self.policy {
                RouterPolicy::Efe => prior,
                RouterPolicy::Fixed(model) => {
                    for s in prior.iter().filter(|s| &arms[s.arm].name != model) {
                        gated.push(gate(
                            &arms[s.arm].name,
                            format!("the router is fixed on {model}"),
                        ));
                    }
                    prior
                        .into_iter()
                        .filter(|s| &arms[s.arm].name == model)
                        .collect()
                }
                RouterPolicy::LinUcb => self
                    .bandit
                    .read()
                    .unwrap_or_else(|e| e.into_inner())
                    .rank(&arms, &ceilings, &features, context_tokens)
                    .into_iter()
                    .map(|s| PriorScored {
                        arm: s.arm,
                        utility: s.utility,
                        efe: efe.evaluate(&arms[s.arm].name, &beliefs[s.arm], &preferences),
                        score: s.utility,
                    })
                    .collect(),
            }
        };
        if ranked.is_empty() {
            return Err(nothing_routes(target, &gated));
        }
        let candidates: Vec<RouteCandidate> = ranked
            .iter()
            .map(|s| RouteCandidate {
                arm: arms[s.arm].name.clone(),
                utility: s.utility,
                risk: s.efe.risk,
                ambiguity: s.efe.ambiguity,
                information_gain: s.efe.information_gain,
                efe: s.efe.total,
                score: s.score,
                cost_wei: sounded[s.arm].1.to_string(),
                completion_s: sounded[s.arm].2,
            })
            .collect();
        let request_id = {
            let mut id = [0u8; 8];
            getrandom::fill(&mut id).map_err(|e| Error::Chain(format!("no randomness: {e}")))?;
            format!("{:016x}", u64::from_be_bytes(id))
        };
        let take = if target.fan_out > 1 {
            target.fan_out
        } else {
            ranked.len()
        };
        Ok(ranked
            .iter()
            .take(take)
            .enumerate()
            .map(|(rank, s)| {
                let arm = &arms[s.arm];
                let record = RouteRecord {
                    target: target.name.clone(),
                    arm: arm.name.clone(),
                    rank: if target.fan_out > 1 { rank } else { 0 },
                    fan_out: target.fan_out,
                    request: request_id.clone(),
                    features: features.to_vec(),
                    profile: arm.profile().to_vec(),
                    context_tokens,
                    belief: beliefs[s.arm],
                    deadline_s: job.deadline_s,
                    max_cost_wei: want.max_price_wei.to_string(),
                    candidates: candidates.clone(),
                    gated: gated.clone(),
                    passed_over: Vec::new(),
                };
                Want {
                    model: arm.name.clone(),
                    route: Some(std::sync::Arc::new(record)),
                    ..want.clone()
                }
            })
            .collect())
    }

    /// One metering pass and what it taught: the routed jobs that ended since the last pass
    /// are metered in the books, the open ones counted as pending per arm, what was learned
    /// faded by the time since the last pass, and every meter row not folded in yet (up to a batch) goes
    /// into the outcome models. Returns how many rows were folded in.
    pub async fn learn(&self, books: &Books) -> Result<usize> {
        let since = self.meter_since_ms.load(Ordering::Relaxed);
        let (_, next) = books.meter_ended(since).await?;
        self.meter_since_ms.store(next, Ordering::Relaxed);
        let open: HashMap<String, f64> = books
            .open_routes()
            .await?
            .into_iter()
            .take(MAX_PENDING_ARMS)
            .map(|(arm, n)| (arm, n as f64))
            .collect();
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = open;
        {
            let mut at = self.faded_at.lock().unwrap_or_else(|e| e.into_inner());
            let elapsed = at.elapsed().as_secs_f64();
            *at = std::time::Instant::now();
            self.efe
                .write()
                .unwrap_or_else(|e| e.into_inner())
                .fade(0.5f64.powf(elapsed / EVIDENCE_HALF_LIFE_S));
        }
        let rows = books
            .meter_since(self.folded.load(Ordering::Relaxed))
            .await?;
        let Some(last) = rows.last().map(|m| m.seq) else {
            return Ok(0);
        };
        // Through the core's meter, whose check refuses a record with a measurement out of
        // range: the router never learns from one.
        let mut meter = Meter::new();
        let mut contexts = Vec::new();
        for row in rows {
            if meter.record(row.record).is_ok() {
                contexts.push(row.features.zip(row.profile));
            }
        }
        self.efe
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .fold(meter.records());

        let mut bandit = self.bandit.write().unwrap_or_else(|e| e.into_inner());
        for (record, context) in meter.records().iter().zip(contexts) {
            let Some((x, p)) = context else { continue };
            let reward = Preferences::from_order(&OrderTerms {
                deadline_s: record.deadline_s,
                tier: record.tier,
                max_cost_wei: record.max_cost_wei,
            })
            .map(|prefs| prefs.log_joint(&Outcome::of(record)));
            if let Ok(reward) = reward {
                // A non-finite reward or feature is refused and changes nothing.
                let _ = bandit.update(&x, &p, reward);
            }
        }
        self.folded.store(last, Ordering::Relaxed);
        Ok(meter.len())
    }

    /// Meter rows folded in so far (the last sequence).
    pub fn folded(&self) -> i64 {
        self.folded.load(Ordering::Relaxed)
    }
}

fn gate(arm: &str, reason: String) -> RouteGate {
    RouteGate {
        arm: arm.to_owned(),
        reason,
    }
}

/// `wei` for `tokens` of context as wei per million tokens (saturating).
fn per_mtok(wei: u128, tokens: f64) -> u64 {
    let v = wei as f64 * 1e6 / tokens;
    if v >= u64::MAX as f64 {
        u64::MAX
    } else {
        v as u64
    }
}

/// `no_match` for a target no arm takes, naming each arm and why.
fn nothing_routes(target: &Target, gated: &[RouteGate]) -> Error {
    let why = if gated.is_empty() {
        "the catalog has no model the exchange can clear".to_owned()
    } else {
        gated
            .iter()
            .map(|g| format!("{}: {}", g.arm, g.reason))
            .collect::<Vec<_>>()
            .join("; ")
    };
    Error::NoMatch {
        detail: format!("no model can take {}: {why}", target.name),
    }
}
