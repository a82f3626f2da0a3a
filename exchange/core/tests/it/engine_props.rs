//! The engine's indexed branch and bound must equal a brute-force argmin over every bundle,
//! and feasibility must be sound, on random fleets and jobs.

use cx_exchange::candidate::{Candidate, View};
use cx_exchange::clearing::{Policy, explain};
use cx_exchange::engine::Engine;
use cx_exchange::feasibility::{completion_s, memory_needed_bytes, price_ceiling, violations};
use cx_exchange::objective::Weights;
use cx_exchange::pricing::hmm::Regime;
use cx_exchange::pricing::market::Quote;
use cx_protocol::{Bundle, ClassSet, DeterminismClass, Job, Tier, TierSet};
use proptest::prelude::*;

const MODELS: [&str; 3] = ["m0", "m1", "m2"];
const ADAPTERS: [&str; 4] = ["a0", "a1", "a2", "a3"];
/// Conversation prefixes bundles hold and jobs continue (ids of the prefix-id form).
const PREFIXES: [&str; 2] = [
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb",
];

fn bundle() -> impl Strategy<Value = Bundle> {
    (
        (0u32..6, 1u64..100, 1u64..8, 0u32..4),
        (1u32..4, 1u8..8, 1u8..16, 0u32..3),
        (
            proptest::collection::vec(0usize..3, 0..3),
            proptest::collection::vec(0usize..4, 0..3),
            proptest::collection::btree_set(0usize..2, 0..3),
        ),
        // What it can load: any base, or some (maybe none), at a measured rate or over B.
        (
            proptest::option::of(proptest::collection::vec(0usize..3, 0..3)),
            proptest::option::of(1u32..20),
        ),
    )
        .prop_map(
            |(
                (price, mem_gb, bw, rtt),
                (flops, classes, tiers, fail),
                (bases, adapters, prefixes),
                (fetchable, load_gbps),
            )| Bundle {
                id: String::new(),
                provider: String::new(),
                device: String::new(),
                // Few distinct values on purpose: exact cost ties exercise the ring tie-break.
                price_wei_per_s: u64::from(price) * 300,
                memory_bytes: mem_gb * 1_000_000_000,
                bandwidth_bps: bw as f64 * 5e9,
                rtt_s: f64::from(rtt) * 0.01,
                flops_per_s: f64::from(flops) * 1e14,
                context_max: 8192,
                determinism: DeterminismClass::ALL
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| classes & (1 << i) != 0)
                    .map(|(_, c)| c)
                    .collect::<ClassSet>(),
                tiers: [Tier::T0, Tier::T1, Tier::T2, Tier::T3]
                    .into_iter()
                    .enumerate()
                    .filter(|(i, _)| tiers & (1 << i) != 0)
                    .map(|(_, t)| t)
                    .collect::<TierSet>(),
                failure_rate: f64::from(fail) * 0.01,
                resident_bases: bases.into_iter().map(|i| MODELS[i].to_owned()).collect(),
                resident_adapters: adapters
                    .into_iter()
                    .map(|i| ADAPTERS[i].to_owned())
                    .collect(),
                kernel_corpus: None,
                fetchable_bases: fetchable
                    .map(|l| l.into_iter().map(|i| MODELS[i].to_owned()).collect()),
                base_load_bps: load_gbps.map(|g| f64::from(g) * 1e9),
                resident_prefixes: prefixes
                    .into_iter()
                    .map(|i| PREFIXES[i].to_owned())
                    .collect(),
            },
        )
}

fn job() -> impl Strategy<Value = Job> {
    (
        (
            0usize..3,
            proptest::option::of(0usize..4),
            1u64..40,
            0u64..5,
        ),
        (1u32..16384, 1u32..60, 0usize..3, 0usize..4, 0u32..50),
        (
            0u32..5,
            proptest::option::of(0u32..5),
            proptest::option::of((0usize..2, 0u32..=10)),
        ),
    )
        .prop_map(
            |(
                (m, a, base_gb, kv_gb),
                (ctx, deadline, class, tier, flops),
                (agent, max_price, prefix),
            )| {
                Job {
                    agent: format!("agent-{agent}"),
                    base_model: MODELS[m].to_owned(),
                    adapter: a.map(|i| ADAPTERS[i].to_owned()),
                    base_bytes: base_gb * 1_000_000_000,
                    adapter_bytes: if a.is_some() { 20_000_000 } else { 0 },
                    kv_bytes: kv_gb * 1_000_000_000,
                    context_tokens: ctx,
                    deadline_s: f64::from(deadline),
                    determinism: DeterminismClass::ALL[class],
                    tier: [Tier::T0, Tier::T1, Tier::T2, Tier::T3][tier],
                    compute_flops: f64::from(flops) * 1e14,
                    value_wei: 0,
                    // Limits that bind on some bundles and not on others (charges run to ~75k wei).
                    max_price_wei: max_price.map(|m| u128::from(m + 1) * 5_000),
                    // A prefix worth 0–100 % of the job's work.
                    prefix: prefix.map(|(i, tenths)| cx_protocol::PrefixNeed {
                        id: PREFIXES[i].to_owned(),
                        flops: (f64::from(flops) * 1e14 * f64::from(tenths) / 10.0)
                            .min(f64::from(flops) * 1e14),
                    }),
                }
            },
        )
}

/// The work queued on a bundle in these tests (0–2 s, from its id): enough to move t̂ past some
/// deadlines and to turn some holders' affinity into a loss.
fn queue_of(id: &str) -> f64 {
    let i: u32 = id.trim_start_matches('b').parse().unwrap_or(0);
    f64::from(i * 7 % 5) * 0.5
}

/// β, α, π, t_compute and the queue computed here, independently of the engine's indexes.
/// An engine holding `fleet`, its bundles named `b0`, `b1`, … and queued by [`queue_of`].
fn engine_of(fleet: Vec<Bundle>, weights: Weights) -> (Engine, Vec<Bundle>) {
    let mut engine = Engine::new(weights).unwrap();
    let bundles: Vec<Bundle> = fleet
        .into_iter()
        .enumerate()
        .map(|(i, mut b)| {
            b.id = format!("b{i}");
            b
        })
        .collect();
    for b in &bundles {
        engine.upsert(b.clone()).unwrap();
        engine.set_queue_s(&b.id, queue_of(&b.id)).unwrap();
    }
    (engine, bundles)
}

fn brute_candidates(bundles: &[Bundle], job: &Job) -> Vec<Candidate> {
    bundles
        .iter()
        .map(|b| {
            (
                b,
                job.prefix
                    .as_ref()
                    .filter(|p| b.resident_prefixes.contains(&p.id)),
            )
        })
        .map(|(b, hit)| Candidate {
            id: b.id.clone(),
            view: View {
                price_wei_per_s: b.price_wei_per_s,
                memory_bytes: b.memory_bytes,
                bandwidth_bps: b.bandwidth_bps,
                base_resident: b.resident_bases.contains(&job.base_model),
                base_fetchable: b
                    .fetchable_bases
                    .as_ref()
                    .is_none_or(|l| l.contains(&job.base_model)),
                base_load_bps: b.base_load_bps.unwrap_or(b.bandwidth_bps),
                adapter_resident: job
                    .adapter
                    .as_ref()
                    .is_some_and(|a| b.resident_adapters.contains(a)),
                prefix_resident: hit.is_some(),
                rtt_s: b.rtt_s,
                compute_s: (job.compute_flops - hit.map_or(0.0, |p| p.flops)) / b.flops_per_s,
                queue_s: queue_of(&b.id),
                context_max: b.context_max,
                determinism: b.determinism,
                tiers: b.tiers,
                failure_rate: b.failure_rate,
            },
        })
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn engine_argmin_equals_brute_force(
        fleet in proptest::collection::vec(bundle(), 1..40),
        jobs in proptest::collection::vec(job(), 1..8),
        removed in proptest::collection::vec(0usize..40, 0..5),
        quoted_ask in proptest::option::of(0u64..6),
        // The index key weighs a bundle's time by λ_L and λ_D: the walks must stay exact for
        // any weights, none included.
        time_weights in proptest::option::of((0u32..4, 0u32..4, 0u32..3)),
    ) {
        // A market quote whose ask gates bundles, as the market maker's would.
        let quote = quoted_ask.map(|ask| Quote {
            bid_wei_per_s: 0,
            ask_wei_per_s: ask * 300,
            regime: Regime::Busy,
        });
        let weights = time_weights.map_or_else(Weights::default, |(l, d, v)| Weights {
            lambda_latency: f64::from(l) * 0.0005,
            lambda_deadline: f64::from(d) * 0.01,
            lambda_verification: f64::from(v),
            ..Weights::default()
        });
        let (mut engine, mut bundles) = engine_of(fleet, weights);
        // Churn: removals and residency changes must keep every index consistent (and the
        // queues, which a re-upsert of the same bundle keeps).
        for r in removed {
            if r < bundles.len() {
                let gone = bundles.remove(r);
                engine.remove(&gone.id).unwrap();
            }
        }
        if let Some(first) = bundles.first_mut() {
            engine.set_base_resident(&first.id, "m1", true).unwrap();
            engine.set_adapter_resident(&first.id, "a2", false).unwrap();
            first.resident_bases.retain(|m| m != "m1");
            first.resident_bases.push("m1".into());
            first.resident_adapters.retain(|a| a != "a2");
        }
        for job in &jobs {
            let ceiling = price_ceiling(job, quote.as_ref());
            let reference = explain(job, &brute_candidates(&bundles, job), engine.weights(), &ceiling);
            let got = engine.clear(job, quote.as_ref()).unwrap();
            prop_assert_eq!(got.as_ref().map(|c| c.bundle_id.clone()), reference.chosen.clone());
            if let (Some(c), Some(t)) = (&got, &reference.terms) {
                prop_assert_eq!(c.terms.total.to_bits(), t.total.to_bits());
            }
            let scanned = engine.clear_by_scan(job, quote.as_ref()).unwrap();
            prop_assert_eq!(scanned.map(|c| c.bundle_id), reference.chosen);
        }
    }

    /// What a job keeps (the engine's bounded explanation) is the full explanation over the
    /// same fleet, cut: the `keep` cheapest feasible bundles in rank order, the `keep` refusals
    /// with the smallest binding factor (categorical last, candidate order among equals), each
    /// with every violation, and the totals of both.
    #[test]
    fn the_kept_explanation_is_the_full_one_cut(
        fleet in proptest::collection::vec(bundle(), 1..40),
        job in job(),
        keep in 0usize..12,
        quoted_ask in proptest::option::of(0u64..6),
    ) {
        let quote = quoted_ask.map(|ask| Quote {
            bid_wei_per_s: 0,
            ask_wei_per_s: ask * 300,
            regime: Regime::Busy,
        });
        let (engine, bundles) = engine_of(fleet, Weights::default());
        let ceiling = price_ceiling(&job, quote.as_ref());
        let full = explain(&job, &brute_candidates(&bundles, &job), engine.weights(), &ceiling);
        let kept = engine
            .explain_kept(&job, &ceiling, Policy::ResidencyAware, keep, |_| true)
            .unwrap();
        prop_assert_eq!(&kept.chosen, &full.chosen);
        prop_assert_eq!(kept.feasible_total, full.feasible.len());
        prop_assert_eq!(kept.rejected_total, full.rejected.len());
        prop_assert_eq!(&kept.feasible[..], &full.feasible[..keep.min(full.feasible.len())]);
        let mut nearest = full.rejected.clone();
        nearest.sort_by(|a, b| {
            a.factor.unwrap_or(f64::INFINITY).total_cmp(&b.factor.unwrap_or(f64::INFINITY))
        });
        nearest.truncate(keep);
        prop_assert_eq!(kept.rejected, nearest);
    }

    #[test]
    fn feasibility_is_sound(fleet in proptest::collection::vec(bundle(), 1..10), job in job()) {
        for (i, c) in brute_candidates(&fleet, &job).into_iter().enumerate() {
            let mut c = c;
            c.id = format!("b{i}");
            let view = c.view;
            let violated = violations(&job, &view);
            // No violation reported ⇔ every constraint, recomputed from scratch, holds.
            let holds = memory_needed_bytes(&job, &view) <= view.memory_bytes
                && job.context_tokens <= view.context_max
                && view.determinism.contains(job.determinism)
                && view.tiers.contains(job.tier)
                && (view.base_resident || (view.base_fetchable && !job.needs_resident_base()))
                && completion_s(&job, &view) <= job.deadline_s;
            prop_assert_eq!(violated.is_empty(), holds);
            for v in &violated {
                if let Some(f) = v.factor {
                    prop_assert!(f > 1.0, "a reported factor must exceed 1: {:?}", v);
                }
            }
        }
    }
}

#[test]
fn cheap_bundle_that_must_fetch_the_base_loses_to_a_dear_one_that_holds_it() {
    // The cheapest bundle must pull 140 GB over 1 Gb/s (1120 s): outside the feasible set for a
    // 30 s deadline, whatever its price. The chosen one costs 20× more per hour.
    let mut engine = Engine::new(Weights::default()).unwrap();
    let mk = |id: &str, price_wei_per_s: u64, bw: f64, bases: Vec<String>| Bundle {
        id: id.into(),
        provider: String::new(),
        device: String::new(),
        price_wei_per_s,
        memory_bytes: 200_000_000_000,
        bandwidth_bps: bw,
        rtt_s: 0.05,
        flops_per_s: 1e15,
        context_max: 32768,
        determinism: [DeterminismClass::D].into_iter().collect(),
        tiers: [Tier::T1].into_iter().collect(),
        failure_rate: 0.0,
        resident_bases: bases,
        resident_adapters: vec![],
        kernel_corpus: None,
        fetchable_bases: None,
        base_load_bps: None,
        resident_prefixes: vec![],
    };
    engine.upsert(mk("cheap", 139, 1e9, vec![])).unwrap();
    engine
        .upsert(mk("dear", 2_778, 1e9, vec!["llama-70b".into()]))
        .unwrap();
    let job = Job {
        agent: "a".into(),
        base_model: "llama-70b".into(),
        adapter: None,
        base_bytes: 140_000_000_000,
        adapter_bytes: 0,
        kv_bytes: 2_000_000_000,
        context_tokens: 8192,
        deadline_s: 30.0,
        determinism: DeterminismClass::D,
        tier: Tier::T1,
        compute_flops: 1e16,
        value_wei: 0,
        max_price_wei: None,
        prefix: None,
    };
    assert_eq!(engine.clear(&job, None).unwrap().unwrap().bundle_id, "dear");
    let why = engine.explain(&job, None).unwrap();
    let cheap = why.rejected.iter().find(|r| r.id == "cheap").unwrap();
    assert_eq!(cheap.binding.to_string(), "deadline");
    assert!(cheap.factor.unwrap() > 30.0);
}

#[test]
fn a_bundle_that_cannot_load_the_base_is_never_chosen_and_a_measured_load_rate_sets_the_fetch() {
    // "cheap" asks a tenth of "holder"'s price but names no base it can load; "fetcher" can load
    // the 10 GB base and measured its loads at 80 Gb/s (1 s), far above its 1 Gb/s link (80 s).
    let mut engine = Engine::new(Weights::default()).unwrap();
    let mk = |id: &str,
              price_wei_per_s: u64,
              bases: Vec<String>,
              fetchable: Option<Vec<String>>| Bundle {
        id: id.into(),
        provider: String::new(),
        device: String::new(),
        price_wei_per_s,
        memory_bytes: 80_000_000_000,
        bandwidth_bps: 1e9,
        rtt_s: 0.01,
        flops_per_s: 1e14,
        context_max: 8192,
        determinism: [DeterminismClass::S].into_iter().collect(),
        tiers: [Tier::T0].into_iter().collect(),
        failure_rate: 0.0,
        resident_bases: bases,
        resident_adapters: vec![],
        kernel_corpus: None,
        fetchable_bases: fetchable,
        base_load_bps: None,
        resident_prefixes: vec![],
    };
    engine
        .upsert(mk("cheap", 100, vec![], Some(vec![])))
        .unwrap();
    let job = Job {
        agent: "agent".into(),
        base_model: "m".into(),
        adapter: None,
        base_bytes: 10_000_000_000,
        adapter_bytes: 0,
        kv_bytes: 1_000_000,
        context_tokens: 100,
        deadline_s: 10.0,
        determinism: DeterminismClass::S,
        tier: Tier::T0,
        compute_flops: 1e13,
        value_wei: 0,
        max_price_wei: None,
        prefix: None,
    };
    assert_eq!(engine.clear(&job, None).unwrap(), None);
    let why = engine.explain(&job, None).unwrap();
    assert_eq!(why.rejected[0].binding.to_string(), "kind");
    // Over its link the fetch misses the deadline; at its measured load rate it makes it.
    let fetcher = mk("fetcher", 1_000, vec![], Some(vec!["m".into()]));
    engine.upsert(fetcher.clone()).unwrap();
    assert_eq!(engine.clear(&job, None).unwrap(), None);
    engine
        .upsert(Bundle {
            base_load_bps: Some(80e9),
            ..fetcher
        })
        .unwrap();
    let chosen = engine.clear(&job, None).unwrap().unwrap();
    assert_eq!(chosen.bundle_id, "fetcher");
    assert!((chosen.terms.completion_s - (0.01 + 1.0 + 0.1)).abs() < 1e-9);
    assert_eq!(chosen, engine.clear_by_scan(&job, None).unwrap().unwrap());
}

#[test]
fn a_holder_busier_than_the_fetch_it_saves_loses_to_an_idle_bundle() {
    // Both hold the base; only "holder" holds the agent's 20 MB adapter, which "idle" would fetch
    // in 0.16 s over 1 Gb/s. Idle, the holder wins (affinity); with 3 s of work queued ahead of
    // the job it is later than the fetch saves, and the job goes to the idle bundle.
    let mut engine = Engine::new(Weights::default()).unwrap();
    let mk = |id: &str, adapters: Vec<String>| Bundle {
        id: id.into(),
        provider: String::new(),
        device: String::new(),
        price_wei_per_s: 1_000,
        memory_bytes: 80_000_000_000,
        bandwidth_bps: 1e9,
        rtt_s: 0.01,
        flops_per_s: 1e14,
        context_max: 8192,
        determinism: [DeterminismClass::S].into_iter().collect(),
        tiers: [Tier::T0].into_iter().collect(),
        failure_rate: 0.0,
        resident_bases: vec!["m".into()],
        resident_adapters: adapters,
        kernel_corpus: None,
        fetchable_bases: None,
        base_load_bps: None,
        resident_prefixes: vec![],
    };
    engine.upsert(mk("holder", vec!["a".into()])).unwrap();
    engine.upsert(mk("idle", vec![])).unwrap();
    let job = Job {
        agent: "agent".into(),
        base_model: "m".into(),
        adapter: Some("a".into()),
        base_bytes: 1_000_000_000,
        adapter_bytes: 20_000_000,
        kv_bytes: 1_000_000,
        context_tokens: 512,
        deadline_s: 10.0,
        determinism: DeterminismClass::S,
        tier: Tier::T0,
        compute_flops: 1e14,
        value_wei: 0,
        max_price_wei: None,
        prefix: None,
    };
    assert_eq!(
        engine.clear(&job, None).unwrap().unwrap().bundle_id,
        "holder"
    );
    engine.set_queue_s("holder", 3.0).unwrap();
    let busy = engine.clear(&job, None).unwrap().unwrap();
    assert_eq!(busy.bundle_id, "idle");
    // A re-offer of the holder (residency report) keeps the exchange's count of its queue.
    engine.set_adapter_resident("holder", "b", true).unwrap();
    assert_eq!(engine.queue_s("holder"), Some(3.0));
    let why = engine.explain(&job, None).unwrap();
    let holder = why.feasible.iter().find(|r| r.id == "holder").unwrap();
    assert!(
        (holder.completion_s - (0.01 + 3.0 + 1.0)).abs() < 1e-9,
        "{holder:?}"
    );
    // A queue past the deadline makes the holder infeasible, named as the deadline.
    engine.set_queue_s("holder", 20.0).unwrap();
    let why = engine.explain(&job, None).unwrap();
    let refused = why.rejected.iter().find(|r| r.id == "holder").unwrap();
    assert_eq!(refused.binding.to_string(), "deadline");
    assert!(engine.set_queue_s("holder", f64::NAN).is_err());
    assert!(engine.set_queue_s("nope", 1.0).is_err());
}
