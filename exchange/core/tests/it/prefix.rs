//! Routing a continuation to the bundle holding its conversation prefix (SPEC §4): a cost term
//! (π in t̂ and μ_P in the objective) over the feasible set, never a filter.

use cx_exchange::engine::Engine;
use cx_exchange::objective::Weights;
use cx_protocol::{Bundle, DeterminismClass, Job, PrefixNeed, Tier};

const PREFIX: &str = "5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e5e";

fn bundle(id: &str, price_wei_per_s: u64, holds_prefix: bool) -> Bundle {
    Bundle {
        id: id.into(),
        provider: String::new(),
        device: String::new(),
        price_wei_per_s,
        memory_bytes: 10_000_000_000,
        bandwidth_bps: 1e10,
        rtt_s: 0.01,
        flops_per_s: 1e12,
        context_max: 8192,
        determinism: [DeterminismClass::D].into_iter().collect(),
        tiers: [Tier::T0, Tier::T1].into_iter().collect(),
        failure_rate: 0.0,
        resident_bases: vec!["m".into()],
        resident_adapters: vec![],
        kernel_corpus: None,
        fetchable_bases: None,
        base_load_bps: None,
        resident_prefixes: if holds_prefix {
            vec![PREFIX.into()]
        } else {
            vec![]
        },
    }
}

/// A continuation whose prefix is 80 % of its work.
fn continuation() -> Job {
    Job {
        agent: "agent".into(),
        base_model: "m".into(),
        adapter: None,
        base_bytes: 1_000_000_000,
        adapter_bytes: 0,
        kv_bytes: 1_000_000,
        context_tokens: 1000,
        deadline_s: 30.0,
        determinism: DeterminismClass::D,
        tier: Tier::T0,
        compute_flops: 1e12,
        value_wei: 0,
        max_price_wei: None,
        prefix: Some(PrefixNeed {
            id: PREFIX.into(),
            flops: 0.8e12,
        }),
    }
}

fn engine(bundles: impl IntoIterator<Item = Bundle>) -> Engine {
    let mut engine = Engine::new(Weights::default()).unwrap();
    for b in bundles {
        engine.upsert(b).unwrap();
    }
    engine
}

#[test]
fn the_holder_wins_a_continuation_when_otherwise_equal() {
    // Both orders of registration: the win is the prefix term's, not the tie-break's.
    for holder_first in [true, false] {
        let (holder, other) = (bundle("holder", 1_000, true), bundle("other", 1_000, false));
        let engine = if holder_first {
            engine([holder, other])
        } else {
            engine([other, holder])
        };
        let job = continuation();
        let chosen = engine.clear(&job, None).unwrap().unwrap();
        assert_eq!(chosen.bundle_id, "holder");
        assert!(chosen.terms.prefix_hit);
        assert_eq!(chosen.terms.prefix_miss, 0.0);
        // The decision names the hit and what the miss costs the other: its t̂ carries the
        // prefix's prefill (0.8 s here) and μ_P is added.
        let decision = engine.explain(&job, None).unwrap();
        assert_eq!(decision.chosen.as_deref(), Some("holder"));
        let terms = decision.terms.unwrap();
        assert!(terms.prefix_hit);
        let other = engine
            .candidates(&job)
            .into_iter()
            .find(|c| c.id == "other")
            .unwrap();
        let other_terms = cx_exchange::objective::evaluate(&job, &other.view, engine.weights());
        assert!(!other_terms.prefix_hit);
        assert_eq!(other_terms.prefix_miss, Weights::default().mu_prefix);
        assert!((other_terms.completion_s - terms.completion_s - 0.8).abs() < 1e-9);
        assert!(other_terms.compute > terms.compute);
    }
}

#[test]
fn without_a_prefix_nobody_pays_a_miss() {
    let engine = engine([bundle("holder", 1_000, true), bundle("other", 1_000, false)]);
    let job = Job {
        prefix: None,
        ..continuation()
    };
    for c in engine.candidates(&job) {
        let t = cx_exchange::objective::evaluate(&job, &c.view, engine.weights());
        assert_eq!(t.prefix_miss, 0.0);
        assert!(!t.prefix_hit);
    }
}

#[test]
fn the_holder_loses_when_infeasible() {
    // The holder does not offer the tier the buyer requires: the prefix cannot buy feasibility.
    let mut holder = bundle("holder", 1_000, true);
    holder.tiers = [Tier::T0].into_iter().collect();
    let engine = engine([holder, bundle("other", 1_000, false)]);
    let job = Job {
        tier: Tier::T1,
        ..continuation()
    };
    assert_eq!(
        engine.clear(&job, None).unwrap().unwrap().bundle_id,
        "other"
    );
    let decision = engine.explain(&job, None).unwrap();
    let refused = decision.rejected.iter().find(|r| r.id == "holder").unwrap();
    assert_eq!(refused.binding.to_string(), "tier");

    // Nor a deadline it cannot meet: a slow holder misses it even without the prefill.
    let mut slow = bundle("holder", 1_000, true);
    slow.flops_per_s = 1e9;
    let engine = self::engine([slow, bundle("other", 1_000, false)]);
    assert_eq!(
        engine
            .clear(&continuation(), None)
            .unwrap()
            .unwrap()
            .bundle_id,
        "other"
    );
}

#[test]
fn the_holder_loses_when_far_dearer() {
    // Ten times the ask: the prefill saved (80 % of the work) and μ_P do not make up for it.
    let engine = engine([
        bundle("holder", 10_000_000, true),
        bundle("other", 1_000_000, false),
    ]);
    let job = continuation();
    let chosen = engine.clear(&job, None).unwrap().unwrap();
    assert_eq!(chosen.bundle_id, "other");
    assert!(!chosen.terms.prefix_hit);
    assert_eq!(
        engine.explain(&job, None).unwrap().chosen.as_deref(),
        Some("other")
    );
    // A little dearer still wins: the holder computes a fifth of the work.
    let engine = self::engine([
        bundle("holder", 1_500_000, true),
        bundle("other", 1_000_000, false),
    ]);
    assert_eq!(
        engine.clear(&job, None).unwrap().unwrap().bundle_id,
        "holder"
    );
}

#[test]
fn a_prefix_worth_more_than_the_job_is_refused_by_name() {
    let mut job = continuation();
    job.prefix.as_mut().unwrap().flops = 2e12;
    let err = job.validate().unwrap_err();
    assert_eq!(err.field(), "prefix.flops");
}
