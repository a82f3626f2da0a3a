//! The request path as separate pure stages:
//! **classify → policy → route → replica → ring**.
//!
//! 1. [`classify`]: the request's features and the context it needs.
//! 2. [`policy`]: the tenant's ceilings, tightened (never loosened) by the request's own
//!    limits, and how many arms to fan out to.
//! 3. [`route`]: admissible arms ranked by utility (the offline W, or a tenant's bandit), or by
//!    expected free energy over the market maker's regime belief; top N.
//! 4. [`replica`]: for each chosen model, the first catalog rung whose context fits.
//! 5. [`ring_stage`]: the node of that rung's provider that owns the request's affinity key on
//!    the consistent-hash ring of [`crate::ring`] — the same hashing the clearing engine uses
//!    for affinity and tie-breaks, so an agent lands where its state already is.
//!
//! Each stage is a function of its inputs only; [`plan`] runs them in order.

use super::bandit::LinUcb;
use super::efe::EfeRouter;
use super::features::{Classifier, Features, Request, context_tokens};
use super::outcome::Preferences;
use super::utility::{Arm, Ceilings, Scored, Utility, rank};
use crate::error::{Result, invalid};
use crate::pricing::hmm::REGIMES;
use crate::ring::{Ring, hash64};
use crate::routing::catalog::Catalog;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Output of the classify stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Classified {
    /// x.
    pub features: Features,
    /// Prompt plus answer allowance, tokens.
    pub context_tokens: u32,
}

/// Stage 1: features and context size.
pub fn classify(classifier: &impl Classifier, request: &Request) -> Classified {
    Classified {
        features: classifier.features(request),
        context_tokens: context_tokens(request),
    }
}

/// Limits a request may add to its tenant's (each only tightens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct RequestLimits {
    /// Longest acceptable latency, seconds.
    pub max_latency_s: Option<f64>,
    /// Dearest acceptable price per million tokens, wei.
    pub max_cost_wei_per_mtok: Option<u64>,
    /// Lowest acceptable quality.
    pub min_quality: Option<f64>,
    /// Arms to dispatch to (1 = no fan-out).
    pub fan_out: Option<usize>,
}

/// Output of the policy stage.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Policy {
    /// The ceilings that gate arms.
    pub ceilings: Ceilings,
    /// Arms to dispatch to (≥ 1).
    pub fan_out: usize,
}

/// Stage 2: the tenant's ceilings tightened by the request's; NaN limits are refused.
pub fn policy(tenant: &Ceilings, limits: &RequestLimits) -> Result<Policy> {
    for (field, value) in [
        ("limits.max_latency_s", limits.max_latency_s),
        ("limits.min_quality", limits.min_quality),
    ] {
        if value.is_some_and(|v| v.is_nan() || v < 0.0) {
            return Err(invalid(field, "must be a number >= 0"));
        }
    }
    let fan_out = limits.fan_out.unwrap_or(1);
    if fan_out == 0 {
        return Err(invalid("limits.fan_out", "must be at least 1"));
    }
    Ok(Policy {
        ceilings: Ceilings {
            max_latency_s: limits
                .max_latency_s
                .map_or(tenant.max_latency_s, |v| v.min(tenant.max_latency_s)),
            max_cost_wei_per_mtok: limits
                .max_cost_wei_per_mtok
                .map_or(tenant.max_cost_wei_per_mtok, |v| {
                    v.min(tenant.max_cost_wei_per_mtok)
                }),
            min_quality: limits
                .min_quality
                .map_or(tenant.min_quality, |v| v.max(tenant.min_quality)),
        },
        fan_out,
    })
}

/// What scores arms in the route stage.
#[derive(Debug, Clone, Copy)]
pub enum Scorer<'a> {
    /// The offline W.
    Offline(&'a Utility),
    /// A tenant's bandit (optimistic scores).
    Bandit(&'a LinUcb),
    /// Expected free energy under the market maker's regime belief and the order's
    /// preferences; the score is `−G`, so the smallest G ranks first.
    Efe {
        /// The outcome models, learned from the meter.
        router: &'a EfeRouter,
        /// The market maker's filtered regime belief.
        belief: &'a [f64; REGIMES],
        /// The buyer's preferences from the order.
        preferences: &'a Preferences,
    },
}

/// Stage 3: admissible arms by score, the top `fan_out` of them.
pub fn route(
    arms: &[Arm],
    policy: &Policy,
    classified: &Classified,
    scorer: Scorer<'_>,
) -> Vec<Scored> {
    let mut ranked = match scorer {
        Scorer::Offline(u) => rank(
            arms,
            &policy.ceilings,
            u,
            &classified.features,
            classified.context_tokens,
        ),
        Scorer::Bandit(b) => b.rank(
            arms,
            &policy.ceilings,
            &classified.features,
            classified.context_tokens,
        ),
        Scorer::Efe {
            router,
            belief,
            preferences,
        } => router
            .rank(
                arms,
                &policy.ceilings,
                &classified.features,
                classified.context_tokens,
                belief,
                preferences,
            )
            .into_iter()
            .map(|s| Scored {
                arm: s.arm,
                utility: -s.efe.total,
            })
            .collect(),
    };
    ranked.truncate(policy.fan_out);
    ranked
}

/// Output of the replica stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Replica {
    /// Canonical model name.
    pub model: String,
    /// Index of the rung chosen.
    pub rung: usize,
    /// Upstream name of the model on that rung.
    pub upstream: String,
    /// Provider of that rung.
    pub provider: String,
}

/// Stage 4: the first rung of the model that fits the context.
pub fn replica(catalog: &Catalog, model: &str, context_tokens: u32) -> Result<Replica> {
    let m = catalog.resolve(model)?;
    let (rung, r) = m.rung_for(context_tokens).ok_or_else(|| {
        invalid(
            "request.context_tokens",
            format!("{context_tokens} tokens exceed every rung of `{}`", m.name),
        )
    })?;
    Ok(Replica {
        model: m.name.clone(),
        rung,
        upstream: r.upstream.clone(),
        provider: r.provider.clone(),
    })
}

/// Output of the ring stage.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Placement {
    /// The affinity key's stable hash (what the clearing engine's tie-break uses).
    pub affinity_hash: u64,
    /// The provider node owning the key, if the provider has nodes on its ring.
    pub node: Option<String>,
}

/// Stage 5: the owner of `affinity_key` on the provider's ring.
pub fn ring_stage(ring: Option<&Ring>, affinity_key: &str) -> Placement {
    Placement {
        affinity_hash: hash64(affinity_key),
        node: ring.and_then(|r| r.owner(affinity_key)).map(str::to_owned),
    }
}

/// One dispatch of a planned request.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dispatch {
    /// Arm index and score.
    pub scored: Scored,
    /// Model and rung.
    pub replica: Replica,
    /// Node on the provider's ring.
    pub placement: Placement,
}

/// Everything [`plan`] needs besides the request.
#[derive(Debug, Clone, Copy)]
pub struct PathContext<'a> {
    /// The catalog (its arms are what is routed over).
    pub catalog: &'a Catalog,
    /// Arms, index-aligned with how `scorer` was trained (normally `catalog.arms()`).
    pub arms: &'a [Arm],
    /// Per provider, the ring of its nodes.
    pub rings: &'a BTreeMap<String, Ring>,
    /// The tenant's ceilings.
    pub tenant_ceilings: &'a Ceilings,
}

/// Runs all five stages; an empty plan is an error naming the ceilings that gated every arm.
pub fn plan(
    context: &PathContext<'_>,
    classifier: &impl Classifier,
    scorer: Scorer<'_>,
    request: &Request,
    limits: &RequestLimits,
    affinity_key: &str,
) -> Result<Vec<Dispatch>> {
    let classified = classify(classifier, request);
    let policy = policy(context.tenant_ceilings, limits)?;
    let routed = route(context.arms, &policy, &classified, scorer);
    if routed.is_empty() {
        return Err(invalid(
            "request",
            format!(
                "no model passes the ceilings {:?} for {} tokens of context",
                policy.ceilings, classified.context_tokens
            ),
        ));
    }
    routed
        .into_iter()
        .map(|scored| {
            let arm = &context.arms[scored.arm];
            let replica = replica(context.catalog, &arm.name, classified.context_tokens)?;
            let placement = ring_stage(context.rings.get(&replica.provider), affinity_key);
            Ok(Dispatch {
                scored,
                replica,
                placement,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routing::features::Heuristic;

    fn context_parts() -> (Catalog, Vec<Arm>, BTreeMap<String, Ring>) {
        let catalog = Catalog::from_toml_str(include_str!("../../catalog.example.toml")).unwrap();
        let arms = catalog.arms();
        let mut rings = BTreeMap::new();
        let mut ring = Ring::new();
        for n in ["h200-a", "h200-b", "h200-c"] {
            ring.insert(n);
        }
        rings.insert("cx-fleet".to_owned(), ring);
        (catalog, arms, rings)
    }

    #[test]
    fn the_path_routes_code_to_the_coder_and_places_it_on_the_ring() {
        let (catalog, arms, rings) = context_parts();
        let ctx = PathContext {
            catalog: &catalog,
            arms: &arms,
            rings: &rings,
            tenant_ceilings: &Ceilings::default(),
        };
        let request = Request {
            text: "fix this fn: it does not compile".into(),
            max_output_tokens: 500,
            ..Request::default()
        };
        let plan1 = plan(
            &ctx,
            &Heuristic,
            Scorer::Offline(&Utility::default()),
            &request,
            &RequestLimits::default(),
            "agent-1",
        )
        .unwrap();
        assert_eq!(plan1.len(), 1);
        assert_eq!(plan1[0].replica.model, "qwen2.5-coder-32b-instruct");
        let node = plan1[0].placement.node.clone().unwrap();
        assert_eq!(rings["cx-fleet"].owner("agent-1").unwrap(), node);
        // Same inputs, same plan.
        let plan2 = plan(
            &ctx,
            &Heuristic,
            Scorer::Offline(&Utility::default()),
            &request,
            &RequestLimits::default(),
            "agent-1",
        )
        .unwrap();
        assert_eq!(plan1, plan2);
    }

    #[test]
    fn request_limits_only_tighten_and_fan_out_takes_top_n() {
        let tenant = Ceilings {
            max_latency_s: 3.0,
            max_cost_wei_per_mtok: 1_000_000,
            min_quality: 0.5,
        };
        let loosen = RequestLimits {
            max_latency_s: Some(100.0),
            min_quality: Some(0.1),
            fan_out: Some(2),
            ..RequestLimits::default()
        };
        let p = policy(&tenant, &loosen).unwrap();
        assert_eq!(
            (p.ceilings.max_latency_s, p.ceilings.min_quality, p.fan_out),
            (3.0, 0.5, 2)
        );
        assert!(
            policy(
                &tenant,
                &RequestLimits {
                    fan_out: Some(0),
                    ..RequestLimits::default()
                }
            )
            .is_err()
        );
        assert!(
            policy(
                &tenant,
                &RequestLimits {
                    max_latency_s: Some(f64::NAN),
                    ..RequestLimits::default()
                }
            )
            .is_err()
        );

        let (catalog, arms, rings) = context_parts();
        let ctx = PathContext {
            catalog: &catalog,
            arms: &arms,
            rings: &rings,
            tenant_ceilings: &tenant,
        };
        let request = Request {
            text: "hello".into(),
            ..Request::default()
        };
        let plan = plan(
            &ctx,
            &Heuristic,
            Scorer::Offline(&Utility::default()),
            &request,
            &loosen,
            "k",
        )
        .unwrap();
        assert_eq!(plan.len(), 2);
        assert!(plan[0].scored.utility >= plan[1].scored.utility);
        for d in &plan {
            let arm = &arms[d.scored.arm];
            assert!(arm.latency_s <= 3.0 && arm.quality >= 0.5);
        }
    }

    #[test]
    fn the_path_fans_out_to_the_arms_of_smallest_expected_free_energy() {
        use crate::routing::efe::EfeConfig;
        use crate::routing::outcome::OrderTerms;
        let (catalog, arms, rings) = context_parts();
        let tenant = Ceilings {
            max_latency_s: 3.0,
            ..Ceilings::default()
        };
        let ctx = PathContext {
            catalog: &catalog,
            arms: &arms,
            rings: &rings,
            tenant_ceilings: &tenant,
        };
        let router = EfeRouter::new(EfeConfig::default()).unwrap();
        let preferences = Preferences::from_order(&OrderTerms {
            deadline_s: 5.0,
            tier: cx_protocol::Tier::T1,
            max_cost_wei: None,
        })
        .unwrap();
        let belief = [0.2, 0.5, 0.3];
        let request = Request {
            text: "hello".into(),
            ..Request::default()
        };
        let limits = RequestLimits {
            fan_out: Some(2),
            ..RequestLimits::default()
        };
        let scorer = Scorer::Efe {
            router: &router,
            belief: &belief,
            preferences: &preferences,
        };
        let p = plan(&ctx, &Heuristic, scorer, &request, &limits, "k").unwrap();
        assert_eq!(p.len(), 2);
        assert!(p[0].scored.utility >= p[1].scored.utility);
        for d in &p {
            assert!(
                arms[d.scored.arm].latency_s <= 3.0,
                "the ceilings still gate"
            );
        }
    }

    #[test]
    fn an_image_request_goes_to_a_vision_model_and_a_huge_one_to_a_long_rung() {
        let (catalog, arms, rings) = context_parts();
        let ctx = PathContext {
            catalog: &catalog,
            arms: &arms,
            rings: &rings,
            tenant_ceilings: &Ceilings::default(),
        };
        let request = Request {
            text: "what is in this picture".into(),
            images: 1,
            ..Request::default()
        };
        let p = plan(
            &ctx,
            &Heuristic,
            Scorer::Offline(&Utility::default()),
            &request,
            &RequestLimits::default(),
            "k",
        )
        .unwrap();
        assert_eq!(p[0].replica.model, "llama-3.2-11b-vision-instruct");
        assert_eq!(p[0].replica.rung, 0);
        // The free rung holds 8 Ki tokens; a longer request falls through to the next rung.
        let long = Request {
            text: "x".repeat(60_000),
            images: 1,
            ..Request::default()
        };
        let p = plan(
            &ctx,
            &Heuristic,
            Scorer::Offline(&Utility::default()),
            &long,
            &RequestLimits::default(),
            "k",
        )
        .unwrap();
        assert_eq!(
            (p[0].replica.rung, p[0].replica.provider.as_str()),
            (1, "partner-cloud")
        );
        assert!(p[0].placement.node.is_none()); // the partner has no ring of ours
    }
}
