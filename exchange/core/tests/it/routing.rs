//! Property tests of the router and catalog: ceilings gate, new arms need no refit, fusion is
//! weightless, invalid catalogs are refused with the rung named, placement is the ring's.

use cx_exchange::Error;
use cx_exchange::ring::{Ring, hash64};
use cx_exchange::routing::catalog::{Catalog, rules};
use cx_exchange::routing::fanout::synthesise;
use cx_exchange::routing::features::{Classifier, Heuristic, Request, Task};
use cx_exchange::routing::path::{PathContext, RequestLimits, Scorer, plan, ring_stage};
use cx_exchange::routing::utility::{Arm, Ceilings, Utility, rank};
use cx_protocol::DeterminismClass;
use proptest::prelude::*;
use std::collections::BTreeMap;

fn arm() -> impl Strategy<Value = Arm> {
    (
        0.0..1.0f64,
        0.05..20.0f64,
        0u64..5_000_000,
        0.0..1.0f64,
        prop::bool::ANY,
        1u32..200_000,
    )
        .prop_map(|(quality, latency_s, cost, code, vision, ctx)| Arm {
            name: String::new(),
            quality,
            latency_s,
            cost_wei_per_mtok: cost,
            code,
            vision: if vision { 0.7 } else { 0.0 },
            context_tokens: ctx,
        })
}

fn request() -> impl Strategy<Value = Request> {
    (
        "[a-z ]{0,200}",
        0u32..3,
        0u32..50_000,
        prop::option::of(prop::sample::select(vec![
            Task::Chat,
            Task::Code,
            Task::Reasoning,
            Task::Extraction,
        ])),
    )
        .prop_map(|(text, images, max_output_tokens, task)| Request {
            text,
            images,
            max_output_tokens,
            task,
            ..Request::default()
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(128))]

    #[test]
    fn every_ranked_arm_passes_the_ceilings(
        arms in prop::collection::vec(arm(), 1..12),
        req in request(),
        max_latency_s in 0.1..25.0f64,
        max_cost in 0u64..6_000_000,
        min_quality in 0.0..1.0f64,
    ) {
        let ceilings = Ceilings { max_latency_s, max_cost_wei_per_mtok: max_cost, min_quality };
        let x = Heuristic.features(&req);
        let ctx = cx_exchange::routing::features::context_tokens(&req);
        let ranked = rank(&arms, &ceilings, &Utility::default(), &x, ctx);
        for s in &ranked {
            let a = &arms[s.arm];
            prop_assert!(a.latency_s <= max_latency_s && a.cost_wei_per_mtok <= max_cost && a.quality >= min_quality);
            prop_assert!(a.context_tokens >= ctx);
            prop_assert!(req.images == 0 || a.vision > 0.0);
        }
        let admissible = arms.iter().filter(|a| a.latency_s <= max_latency_s && a.cost_wei_per_mtok <= max_cost
            && a.quality >= min_quality && a.context_tokens >= ctx && (req.images == 0 || a.vision > 0.0)).count();
        prop_assert_eq!(ranked.len(), admissible);
        for pair in ranked.windows(2) {
            prop_assert!(pair[0].utility >= pair[1].utility);
        }
    }

    /// A new arm is a new profile row: the others keep their scores and order, W is untouched.
    #[test]
    fn a_new_arm_needs_no_refit(arms in prop::collection::vec(arm(), 1..10), extra in arm(), req in request()) {
        let u = Utility::default();
        let x = Heuristic.features(&req);
        let before = rank(&arms, &Ceilings::default(), &u, &x, 0);
        let mut more = arms.clone();
        more.push(extra);
        let after = rank(&more, &Ceilings::default(), &u, &x, 0);
        let old: Vec<_> = after.iter().filter(|s| s.arm < arms.len()).copied().collect();
        prop_assert_eq!(old, before);
        prop_assert_eq!(u, Utility::default());
    }

    #[test]
    fn class_d_fusion_returns_the_strict_majority(
        majority in "[a-c]{1,4}",
        others in prop::collection::vec("[a-c]{1,4}", 0..4),
        extra_votes in 0usize..3,
        seed in any::<u64>(),
    ) {
        let votes = others.len() + 1 + extra_votes;
        let mut answers: Vec<String> = vec![majority.clone(); votes];
        answers.extend(others.iter().cloned());
        // Rotate so the majority is not always first.
        let len = answers.len();
        answers.rotate_left((seed % len as u64) as usize);
        let refs: Vec<&str> = answers.iter().map(String::as_str).collect();
        let fused = synthesise(&refs, DeterminismClass::D).unwrap();
        prop_assert!(fused.majority);
        prop_assert_eq!(refs[fused.chosen], majority.as_str());
    }

    #[test]
    fn placement_is_the_rings_owner(key in "[a-z0-9-]{1,20}", nodes in prop::collection::btree_set("[a-z]{1,6}", 1..8)) {
        let mut ring = Ring::new();
        nodes.iter().for_each(|n| ring.insert(n));
        let placed = ring_stage(Some(&ring), &key);
        prop_assert_eq!(placed.node.as_deref(), ring.owner(&key));
        prop_assert_eq!(placed.affinity_hash, hash64(&key));
    }

    /// Every invalid rung is refused at load, with the rung and the rule named.
    #[test]
    fn invalid_rungs_are_refused_with_rung_and_rule(
        retail_in in 0u64..100, retail_out in 0u64..100, cost_in in 0u64..100, cost_out in 0u64..100,
        known_provider in prop::bool::ANY, rung_index in 0usize..3,
    ) {
        let good = "upstream = \"ok\"\nprovider = \"fleet\"\ncontext_limit_tokens = 100\nretail = { input_wei_per_mtok = 5, output_wei_per_mtok = 5 }\ncost = { input_wei_per_mtok = 1, output_wei_per_mtok = 1 }\n";
        let provider = if known_provider { "fleet" } else { "ghost" };
        let candidate = format!("upstream = \"up\"\nprovider = \"{provider}\"\ncontext_limit_tokens = 100\nretail = {{ input_wei_per_mtok = {retail_in}, output_wei_per_mtok = {retail_out} }}\ncost = {{ input_wei_per_mtok = {cost_in}, output_wei_per_mtok = {cost_out} }}\n");
        let mut text = String::from("[[providers]]\nname = \"fleet\"\n[[models]]\nname = \"m\"\nquality = 0.5\nlatency_s = 1.0\n");
        for i in 0..3 {
            text.push_str("[[models.rungs]]\n");
            text.push_str(if i == rung_index { &candidate } else { good });
        }
        let free = retail_in == 0 && retail_out == 0;
        let expected = if !known_provider {
            Some(rules::KNOWN_PROVIDER)
        } else if free && (cost_in > 0 || cost_out > 0) {
            Some(rules::FREE_IS_FREE)
        } else if retail_in < cost_in || retail_out < cost_out {
            Some(rules::NOT_BELOW_COST)
        } else {
            None
        };
        match (Catalog::from_toml_str(&text), expected) {
            (Ok(_), None) => {}
            (Err(Error::Catalog { at, rule, .. }), Some(want)) => {
                prop_assert_eq!(rule, want);
                let wanted_at = format!("models[0] (m).rungs[{rung_index}] (up via {provider})");
                prop_assert_eq!(at, wanted_at);
            }
            (got, want) => prop_assert!(false, "got {got:?}, wanted {want:?}"),
        }
    }
}

#[test]
fn the_example_catalog_plans_deterministically_with_fan_out() {
    let catalog = Catalog::from_toml_str(include_str!("../../catalog.example.toml")).unwrap();
    let arms = catalog.arms();
    let mut ring = Ring::new();
    ["n1", "n2", "n3", "n4"].iter().for_each(|n| ring.insert(n));
    let rings = BTreeMap::from([("cx-fleet".to_owned(), ring)]);
    let ctx = PathContext {
        catalog: &catalog,
        arms: &arms,
        rings: &rings,
        tenant_ceilings: &Ceilings::default(),
    };
    let req = Request {
        text: "prove that the sum of two even numbers is even".into(),
        ..Request::default()
    };
    let limits = RequestLimits {
        fan_out: Some(3),
        ..RequestLimits::default()
    };
    let a = plan(
        &ctx,
        &Heuristic,
        Scorer::Offline(&Utility::default()),
        &req,
        &limits,
        "agent-9",
    )
    .unwrap();
    let b = plan(
        &ctx,
        &Heuristic,
        Scorer::Offline(&Utility::default()),
        &req,
        &limits,
        "agent-9",
    )
    .unwrap();
    assert_eq!(a, b);
    assert_eq!(a.len(), 3);
    let models: std::collections::BTreeSet<_> = a.iter().map(|d| d.replica.model.clone()).collect();
    assert_eq!(models.len(), 3, "fan-out dispatches distinct arms");
}
