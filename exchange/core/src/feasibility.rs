//! Hard feasibility (SPEC §2), evaluated before any cost:
//!
//! ```text
//! M ≥ (1−β)|w_m| + (1−α)|a| + |kv(c)|  ∧  c ≤ c_max(d)  ∧  κ ∈ K(d)  ∧  τ ∈ T(b)  ∧  t̂(j,b) ≤ Δ
//! t̂(j,b) = ℓ0 + (1−β)·|w_m|/B_w + (1−α)·|a|/B + t_queue + t_compute
//! ```
//!
//! `B_w` is the rate the bundle's provider measured its own base loads at (B where it reported
//! none), and β = 0 is feasible only on a bundle that can load the base at all.
//!
//! `t_queue` is the work already assigned to the bundle and not yet done (SPEC §2's t̂ with the
//! congestion it leaves implicit): without it, affinity sends every call of an agent to the one
//! provider holding its adapter whatever that provider's queue, and residency turns into a hot
//! spot. With it, a resident adapter is worth exactly the fetch it saves: a holder whose queue is
//! longer than a cold bundle's fetch is later, and loses on ℓ and δ.
//!
//! Memory counts what is resident: a resident base or adapter needs no bytes again. Every
//! violated constraint is reported with the factor by which it was missed, so a buyer sees not
//! only *that* a bundle was refused but how far off it was.

use crate::candidate::View;
use crate::pricing::market::Quote;
pub use cx_protocol::decision::{Constraint, Violation};
use cx_protocol::{Job, price};

/// Estimated completion time t̂(j, b) in seconds.
pub fn completion_s(job: &Job, view: &View) -> f64 {
    let base_s = if view.base_resident {
        0.0
    } else {
        job.base_bytes as f64 * 8.0 / view.base_load_bps
    };
    let adapter_s = if adapter_present(job, view) {
        0.0
    } else {
        job.adapter_bytes as f64 * 8.0 / view.bandwidth_bps
    };
    view.rtt_s + base_s + adapter_s + view.queue_s + view.compute_s
}

/// α as the job sees it: a job without an adapter never waits for one.
pub fn adapter_present(job: &Job, view: &View) -> bool {
    view.adapter_resident || !job.needs_adapter()
}

/// Bytes the job needs free on the bundle: what is not resident, plus its KV cache.
pub fn memory_needed_bytes(job: &Job, view: &View) -> u64 {
    let base = if view.base_resident {
        0
    } else {
        job.base_bytes
    };
    let adapter = if adapter_present(job, view) {
        0
    } else {
        job.adapter_bytes
    };
    base.saturating_add(adapter).saturating_add(job.kv_bytes)
}

/// Whether every constraint holds; the allocation-free test the engine's hot path uses.
pub fn is_feasible(job: &Job, view: &View, t_hat_s: f64) -> bool {
    memory_needed_bytes(job, view) <= view.memory_bytes
        && job.context_tokens <= view.context_max
        && view.determinism.contains(job.determinism)
        && view.tiers.contains(job.tier)
        && t_hat_s <= job.deadline_s
        && base_available(job, view)
}

/// β, or a base the bundle can load: the job's weights exist to fetch and it can fetch them.
pub fn base_available(job: &Job, view: &View) -> bool {
    view.base_resident || (view.base_fetchable && !job.needs_resident_base())
}

/// The price gates of one job, integers in wei ([`cx_protocol::price`]): a bundle's ask must be at
/// most the market's quoted ask (providers' asks are reservation prices, SPEC §10), and its charge
/// for the job — ask × compute-seconds, rounded up — at most the buyer's limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PriceCeiling {
    /// The quote's ask, wei per compute-second, when a market quote applies.
    pub quote_ask_wei_per_s: Option<u64>,
    /// The buyer's `max_price_wei` for the whole job.
    pub max_price_wei: Option<u128>,
}

/// The gates for `job` under an optional market `quote`.
pub fn price_ceiling(job: &Job, quote: Option<&Quote>) -> PriceCeiling {
    PriceCeiling {
        quote_ask_wei_per_s: quote.map(|q| q.ask_wei_per_s),
        max_price_wei: job.max_price_wei,
    }
}

/// Whether a view's ask passes both gates; exact integer comparisons, no allocation.
pub fn price_eligible(view: &View, ceiling: &PriceCeiling) -> bool {
    ceiling
        .quote_ask_wei_per_s
        .is_none_or(|q| view.price_wei_per_s <= q)
        && ceiling
            .max_price_wei
            .is_none_or(|m| price::charge_within(view.price_wei_per_s, view.compute_s, m))
}

/// The price violation of a view over its gates, if any; the factor is the larger of
/// ask / quote and charge / limit, always a finite number (the limit and the quote are ≥ 1 wei).
pub fn price_violation(view: &View, ceiling: &PriceCeiling) -> Option<Violation> {
    let ask = view.price_wei_per_s;
    let mut factor = 0.0f64;
    let mut details = Vec::new();
    if let Some(quote) = ceiling.quote_ask_wei_per_s.filter(|q| ask > *q) {
        factor = factor.max(ask as f64 / quote.max(1) as f64);
        details.push(format!("asks {ask} wei/s over the quote {quote} wei/s"));
    }
    // The gate's own test first: the exact charge (a decimal of the time, formatted) only for
    // a bundle over the limit, whose violation states it.
    if let Some(limit) = ceiling
        .max_price_wei
        .filter(|m| !price::charge_within(ask, view.compute_s, *m))
    {
        let charge = price::charge_wei(ask, view.compute_s);
        factor = factor.max(charge as f64 / limit.max(1) as f64);
        details.push(format!(
            "charges {charge} wei for {:.3} s over the limit {limit} wei",
            view.compute_s
        ));
    }
    (!details.is_empty()).then(|| Violation {
        constraint: Constraint::Price,
        factor: Some(factor),
        detail: details.join(", "),
    })
}

/// Every violated constraint, in the order of [`Constraint`]; empty when feasible.
pub fn violations(job: &Job, view: &View) -> Vec<Violation> {
    misses(job, view)
        .into_iter()
        .flatten()
        .map(|(constraint, factor)| Violation {
            constraint,
            factor,
            detail: detail(job, view, constraint),
        })
        .collect()
}

/// The factor by which `view` misses `job` under `ceiling` — its binding violation's
/// ([`binding`]; infinite for a categorical one) — or `None` when it is feasible. What ranks a
/// refusal, with no allocation for a bundle that is feasible or not among those explained.
pub fn miss_factor(job: &Job, view: &View, ceiling: &PriceCeiling) -> Option<f64> {
    misses(job, view)
        .into_iter()
        .flatten()
        .map(|(_, factor)| factor.unwrap_or(f64::INFINITY))
        .chain(price_violation(view, ceiling).and_then(|v| v.factor))
        .reduce(f64::max)
}

/// The constraints `view` misses for `job` and by what factor (`None`: categorical), in the
/// order of [`Constraint`]: the one place feasibility's conditions are written out in full.
fn misses(job: &Job, view: &View) -> [Option<(Constraint, Option<f64>)>; 6] {
    let needed = memory_needed_bytes(job, view);
    let t_hat = completion_s(job, view);
    [
        (needed > view.memory_bytes).then(|| {
            (
                Constraint::Memory,
                Some(needed as f64 / view.memory_bytes as f64),
            )
        }),
        (job.context_tokens > view.context_max).then(|| {
            (
                Constraint::Context,
                Some(f64::from(job.context_tokens) / f64::from(view.context_max)),
            )
        }),
        (!view.determinism.contains(job.determinism)).then_some((Constraint::Determinism, None)),
        (!view.tiers.contains(job.tier)).then_some((Constraint::Tier, None)),
        (!base_available(job, view)).then_some((Constraint::Kind, None)),
        (t_hat > job.deadline_s).then(|| (Constraint::Deadline, Some(t_hat / job.deadline_s))),
    ]
}

/// What a violation of `constraint` by `view` says, for a buyer.
fn detail(job: &Job, view: &View, constraint: Constraint) -> String {
    match constraint {
        Constraint::Memory => format!(
            "needs {} B free, has {} B",
            memory_needed_bytes(job, view),
            view.memory_bytes
        ),
        Constraint::Context => format!(
            "context {} tokens over c_max {}",
            job.context_tokens, view.context_max
        ),
        Constraint::Determinism => {
            let offered: Vec<String> = view.determinism.iter().map(|c| c.to_string()).collect();
            format!(
                "class {} not honoured (offers {})",
                job.determinism,
                offered.join(",")
            )
        }
        Constraint::Tier => {
            let offered: Vec<String> = view.tiers.iter().map(|t| t.to_string()).collect();
            format!(
                "tier {} not offered (offers {})",
                job.tier,
                offered.join(",")
            )
        }
        Constraint::Kind if job.needs_resident_base() => {
            format!("does not offer the job kind {}", job.base_model)
        }
        Constraint::Kind => format!("neither holds nor can load the base {}", job.base_model),
        Constraint::Deadline => format!(
            "t̂ {:.3} s over deadline {:.3} s",
            completion_s(job, view),
            job.deadline_s
        ),
        // Not one of `misses`: a price violation, with its figures, is `price_violation`'s.
        Constraint::Price => "over the price ceiling".to_owned(),
    }
}

/// The binding constraint: a categorical one if any (no resource fixes it), else the largest
/// factor.
pub fn binding(violations: &[Violation]) -> Option<&Violation> {
    violations.iter().find(|v| v.factor.is_none()).or_else(|| {
        violations.iter().max_by(|a, b| {
            a.factor
                .unwrap_or(f64::INFINITY)
                .total_cmp(&b.factor.unwrap_or(f64::INFINITY))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use cx_protocol::{DeterminismClass, Tier};

    fn job() -> Job {
        Job {
            agent: String::new(),
            base_model: "m".into(),
            adapter: Some("a".into()),
            base_bytes: 16_000_000_000,
            adapter_bytes: 20_000_000,
            kv_bytes: 1_000_000_000,
            context_tokens: 4096,
            deadline_s: 10.0,
            determinism: DeterminismClass::D,
            tier: Tier::T1,
            compute_flops: 0.0,
            value_wei: 0,
            max_price_wei: None,
            prefix: None,
        }
    }

    fn view() -> View {
        View {
            price_wei_per_s: 1_000,
            memory_bytes: 80_000_000_000,
            bandwidth_bps: 10e9,
            base_resident: false,
            base_fetchable: true,
            base_load_bps: 10e9,
            adapter_resident: false,
            prefix_resident: false,
            rtt_s: 0.05,
            compute_s: 2.0,
            queue_s: 0.0,
            context_max: 8192,
            determinism: [DeterminismClass::D].into_iter().collect(),
            tiers: [Tier::T0, Tier::T1].into_iter().collect(),
            failure_rate: 0.0,
        }
    }

    #[test]
    fn completion_time_adds_what_must_be_fetched() {
        // 16 GB + 20 MB over 10 Gb/s = 12.816 s, plus 0.05 rtt and 2 s compute.
        let t = completion_s(&job(), &view());
        assert!((t - 14.866).abs() < 1e-9, "{t}");
        let resident = View {
            base_resident: true,
            adapter_resident: true,
            ..view()
        };
        assert!((completion_s(&job(), &resident) - 2.05).abs() < 1e-12);
    }

    #[test]
    fn deadline_violation_reports_its_factor() {
        let v = violations(&job(), &view());
        assert_eq!(v.len(), 1);
        assert_eq!(v[0].constraint, Constraint::Deadline);
        assert!((v[0].factor.unwrap() - 1.4866).abs() < 1e-9);
    }

    #[test]
    fn resident_base_needs_no_memory_again() {
        let small = View {
            memory_bytes: 2_000_000_000,
            ..view()
        };
        let v = violations(&job(), &small);
        let mem = v
            .iter()
            .find(|v| v.constraint == Constraint::Memory)
            .unwrap();
        assert!((mem.factor.unwrap() - 17.02 / 2.0).abs() < 1e-9);
        let resident = View {
            base_resident: true,
            ..small
        };
        assert!(memory_needed_bytes(&job(), &resident) <= resident.memory_bytes);
    }

    #[test]
    fn categorical_violation_binds_before_any_factor() {
        let bad = View {
            tiers: [Tier::T0].into_iter().collect(),
            context_max: 1024,
            ..view()
        };
        let v = violations(&job(), &bad);
        assert_eq!(binding(&v).unwrap().constraint, Constraint::Tier);
        let only_numeric = View {
            context_max: 1024,
            ..view()
        };
        let v = violations(&job(), &only_numeric);
        // context 4.0 beats deadline 1.4866
        assert_eq!(binding(&v).unwrap().constraint, Constraint::Context);
    }

    #[test]
    fn a_kernel_market_job_goes_only_to_a_bundle_offering_it() {
        // A `cx/…` market has no weights to fetch: a bundle that does not list it among its
        // resident bases is refused by name (categorically), however much memory it has.
        let matmul = Job {
            base_model: cx_protocol::matmul::MATMUL_MODEL.into(),
            adapter: None,
            adapter_bytes: 0,
            base_bytes: 1,
            kv_bytes: 0,
            context_tokens: 1,
            ..job()
        };
        let v = violations(&matmul, &view());
        assert_eq!(binding(&v).unwrap().constraint, Constraint::Kind);
        assert!(!is_feasible(
            &matmul,
            &view(),
            completion_s(&matmul, &view())
        ));
        let offering = View {
            base_resident: true,
            ..view()
        };
        assert!(violations(&matmul, &offering).is_empty());
        assert!(is_feasible(
            &matmul,
            &offering,
            completion_s(&matmul, &offering)
        ));
    }

    #[test]
    fn price_gates_compare_integers_exactly() {
        let mut j = job();
        let v = View {
            compute_s: 2.0,
            ..view()
        };
        assert_eq!(price_ceiling(&j, None), PriceCeiling::default());
        assert!(price_eligible(&v, &price_ceiling(&j, None)));
        // 1000 wei/s for 2 s is 2000 wei: a limit of 2000 admits it, 1999 does not.
        j.max_price_wei = Some(2_000);
        assert!(price_eligible(&v, &price_ceiling(&j, None)));
        assert!(price_violation(&v, &price_ceiling(&j, None)).is_none());
        j.max_price_wei = Some(1_999);
        let over = price_violation(&v, &price_ceiling(&j, None)).unwrap();
        assert!(!price_eligible(&v, &price_ceiling(&j, None)));
        assert_eq!(over.constraint, Constraint::Price);
        assert_eq!(over.factor, Some(2_000.0 / 1_999.0));
        let quote = Quote {
            bid_wei_per_s: 400,
            ask_wei_per_s: 500,
            regime: crate::pricing::hmm::Regime::Busy,
        };
        j.max_price_wei = None;
        let gates = price_ceiling(&j, Some(&quote));
        assert_eq!(gates.quote_ask_wei_per_s, Some(500));
        let over = price_violation(&v, &gates).unwrap();
        assert_eq!(over.factor, Some(2.0));
        let at_quote = View {
            price_wei_per_s: 500,
            ..v
        };
        assert!(price_eligible(&at_quote, &gates));
        let one_over = View {
            price_wei_per_s: 501,
            ..v
        };
        assert!(!price_eligible(&one_over, &gates));
    }
}
