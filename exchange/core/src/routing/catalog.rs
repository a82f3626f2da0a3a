//! The model catalog: models, their ordered route rungs, aliases, and the rules checked at load.
//!
//! Each model lists **rungs** in order of preference; a rung is one way to serve it: an
//! upstream (the model as a provider names it), the provider that serves it, the context limit
//! there, and two price pairs per million tokens (input, output) — **retail** (what the buyer
//! pays) and **cost** (what the upstream charges us). Prices are integers in wei (the settlement
//! asset's smallest unit, [`cx_protocol::price`]).
//!
//! Rules, each checked at load with the rung (or model, or provider) named in the error:
//! - a free rung (retail 0/0) routes only to a zero-priced upstream (cost 0/0): free must not
//!   mean "we pay for it silently";
//! - no rung serves below cost (retail ≥ cost, input and output each);
//! - every rung (arm) names a known provider;
//! - names and aliases resolve to one model only; a model has at least one rung; context
//!   limits are positive; quality is in [0, 1] and latency positive and finite.
//!
//! The file format is TOML (see `exchange/core/catalog.example.toml`); unknown keys are refused so a
//! typo is an error, not a silently ignored setting. Reading the file is the caller's job (this
//! module is part of the pure core): `Catalog::from_toml_str(&std::fs::read_to_string(path)?)`.

use crate::error::{Error, Result};
use crate::routing::utility::Arm;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// A price pair per million tokens, wei.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PricePair {
    /// Per million input (prompt) tokens.
    pub input_wei_per_mtok: u64,
    /// Per million output (generated) tokens.
    pub output_wei_per_mtok: u64,
}

impl PricePair {
    /// Whether both prices are zero.
    pub fn is_zero(&self) -> bool {
        self.input_wei_per_mtok == 0 && self.output_wei_per_mtok == 0
    }

    /// Mean of input and output price (the router's single cost number).
    pub fn mean_wei_per_mtok(&self) -> u64 {
        self.input_wei_per_mtok / 2
            + self.output_wei_per_mtok / 2
            + (self.input_wei_per_mtok % 2 + self.output_wei_per_mtok % 2) / 2
    }
}

/// One way to serve a model.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rung {
    /// The model's name at the upstream.
    pub upstream: String,
    /// The provider that serves it (must be in the catalog's providers).
    pub provider: String,
    /// Longest context served on this rung, tokens.
    pub context_limit_tokens: u32,
    /// What the buyer pays.
    pub retail: PricePair,
    /// What the upstream charges.
    pub cost: PricePair,
}

impl Rung {
    /// A free rung: the buyer pays nothing.
    pub fn is_free(&self) -> bool {
        self.retail.is_zero()
    }
}

/// A provider the catalog can route to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Provider {
    /// Unique name.
    pub name: String,
    /// Free text for people.
    #[serde(default)]
    pub description: String,
}

/// A model and how to reach it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Model {
    /// Canonical name.
    pub name: String,
    /// Other names that resolve to it.
    #[serde(default)]
    pub aliases: Vec<String>,
    /// Quality score in [0, 1] (router profile).
    pub quality: f64,
    /// Typical latency to a full answer, seconds (router profile).
    pub latency_s: f64,
    /// Code skill in [0, 1] (router profile).
    #[serde(default)]
    pub code: f64,
    /// Vision skill in [0, 1]; 0 = takes no images (router profile).
    #[serde(default)]
    pub vision: f64,
    /// Rungs in order of preference (missing = none, which validation refuses by name).
    #[serde(default)]
    pub rungs: Vec<Rung>,
    /// The model's size and work, which clearing on the exchange's own fleet needs (SPEC §2:
    /// |w_m| and t_compute); a model without it can be routed but not cleared.
    #[serde(default)]
    pub shape: Option<Shape>,
}

/// A model's size and work as the feasibility test and t_compute see them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Shape {
    /// |w_m|: bytes of the base weights as served.
    pub base_bytes: u64,
    /// Parameters: a token of context costs 2 × parameters FLOPs.
    pub parameters: u64,
    /// KV cache bytes per token of context.
    pub kv_bytes_per_token: u64,
}

impl Model {
    /// The first rung (in order) whose context limit fits `context_tokens`.
    pub fn rung_for(&self, context_tokens: u32) -> Option<(usize, &Rung)> {
        self.rungs
            .iter()
            .enumerate()
            .find(|(_, r)| r.context_limit_tokens >= context_tokens)
    }

    /// The model as a router arm: cost of its first rung, context of its largest rung.
    pub fn arm(&self) -> Arm {
        Arm {
            name: self.name.clone(),
            quality: self.quality,
            latency_s: self.latency_s,
            cost_wei_per_mtok: self
                .rungs
                .first()
                .map_or(0, |r| r.retail.mean_wei_per_mtok()),
            code: self.code,
            vision: self.vision,
            context_tokens: self
                .rungs
                .iter()
                .map(|r| r.context_limit_tokens)
                .max()
                .unwrap_or(0),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    #[serde(default)]
    providers: Vec<Provider>,
    #[serde(default)]
    models: Vec<Model>,
}

/// A validated catalog.
#[derive(Debug, Clone, PartialEq)]
pub struct Catalog {
    providers: Vec<Provider>,
    models: Vec<Model>,
    /// Every name and alias → model index.
    names: BTreeMap<String, usize>,
}

fn broken(at: String, rule: &'static str, detail: String) -> Error {
    Error::Catalog { at, rule, detail }
}

/// Rule names, as they appear in errors.
pub mod rules {
    /// TOML syntax and known keys.
    pub const WELL_FORMED: &str = "well-formed TOML with known keys";
    /// Unique provider names.
    pub const UNIQUE_PROVIDER: &str = "provider names are unique";
    /// Unique model names and aliases.
    pub const UNIQUE_NAME: &str = "model names and aliases resolve to one model";
    /// Non-empty names.
    pub const NAMED: &str = "names are not empty";
    /// At least one rung.
    pub const HAS_RUNG: &str = "a model has at least one rung";
    /// A model's shape has weights and parameters.
    pub const SHAPE: &str = "a model's shape has base_bytes and parameters > 0";
    /// Known providers.
    pub const KNOWN_PROVIDER: &str = "every arm names a known provider";
    /// Free rungs are free upstream too.
    pub const FREE_IS_FREE: &str = "a free rung routes only to a zero-priced upstream";
    /// No loss-making rung.
    pub const NOT_BELOW_COST: &str = "no rung serves below cost";
    /// Positive context.
    pub const CONTEXT: &str = "context limit is above zero";
    /// Router profile in range.
    pub const PROFILE: &str = "quality, code and vision in [0, 1], latency finite and > 0";
}

impl Catalog {
    /// Parses and validates a TOML catalog.
    pub fn from_toml_str(text: &str) -> Result<Self> {
        let file: CatalogFile = toml::from_str(text).map_err(|e| {
            let at = match e.span() {
                Some(span) => {
                    let before = &text[..span.start.min(text.len())];
                    let line = before.matches('\n').count() + 1;
                    let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
                    format!("line {line}, column {column}")
                }
                None => "file".to_owned(),
            };
            broken(at, rules::WELL_FORMED, e.message().to_owned())
        })?;
        Self::new(file.providers, file.models)
    }

    /// Validates providers and models; the first broken rule is the error.
    pub fn new(providers: Vec<Provider>, models: Vec<Model>) -> Result<Self> {
        let mut provider_names = BTreeMap::new();
        for (i, p) in providers.iter().enumerate() {
            let at = format!("providers[{i}]");
            if p.name.is_empty() {
                return Err(broken(at, rules::NAMED, "provider name is empty".into()));
            }
            if let Some(first) = provider_names.insert(p.name.as_str(), i) {
                return Err(broken(
                    at,
                    rules::UNIQUE_PROVIDER,
                    format!("`{}` is also providers[{first}]", p.name),
                ));
            }
        }
        let mut names: BTreeMap<String, usize> = BTreeMap::new();
        for (m, model) in models.iter().enumerate() {
            let at_model = format!("models[{m}] ({})", model.name);
            if model.name.is_empty() {
                return Err(broken(
                    format!("models[{m}]"),
                    rules::NAMED,
                    "model name is empty".into(),
                ));
            }
            for (k, name) in std::iter::once(&model.name)
                .chain(&model.aliases)
                .enumerate()
            {
                if name.is_empty() {
                    return Err(broken(
                        at_model,
                        rules::NAMED,
                        format!("alias {} is empty", k - 1),
                    ));
                }
                if let Some(&other) = names.get(name) {
                    return Err(broken(
                        at_model,
                        rules::UNIQUE_NAME,
                        format!(
                            "`{name}` already resolves to models[{other}] ({})",
                            models[other].name
                        ),
                    ));
                }
                names.insert(name.clone(), m);
            }
            let unit = |v: f64| v.is_finite() && (0.0..=1.0).contains(&v);
            let profile_ok = unit(model.quality)
                && unit(model.code)
                && unit(model.vision)
                && model.latency_s.is_finite()
                && model.latency_s > 0.0;
            if !profile_ok {
                return Err(broken(
                    at_model,
                    rules::PROFILE,
                    format!(
                        "quality {}, code {}, vision {}, latency_s {}",
                        model.quality, model.code, model.vision, model.latency_s
                    ),
                ));
            }
            if let Some(shape) = model.shape
                && (shape.base_bytes == 0 || shape.parameters == 0)
            {
                return Err(broken(
                    at_model,
                    rules::SHAPE,
                    format!(
                        "shape.base_bytes {} and shape.parameters {} must be > 0",
                        shape.base_bytes, shape.parameters
                    ),
                ));
            }
            if model.rungs.is_empty() {
                return Err(broken(
                    at_model,
                    rules::HAS_RUNG,
                    "add a [[models.rungs]] table".into(),
                ));
            }
            for (r, rung) in model.rungs.iter().enumerate() {
                let at = format!(
                    "{at_model}.rungs[{r}] ({} via {})",
                    rung.upstream, rung.provider
                );
                if rung.upstream.is_empty() {
                    return Err(broken(at, rules::NAMED, "upstream is empty".into()));
                }
                if !provider_names.contains_key(rung.provider.as_str()) {
                    let known: Vec<&str> = provider_names.keys().copied().collect();
                    return Err(broken(
                        at,
                        rules::KNOWN_PROVIDER,
                        format!("provider `{}` is not one of {known:?}", rung.provider),
                    ));
                }
                if rung.context_limit_tokens == 0 {
                    return Err(broken(
                        at,
                        rules::CONTEXT,
                        "context_limit_tokens is 0".into(),
                    ));
                }
                if rung.is_free() && !rung.cost.is_zero() {
                    return Err(broken(
                        at,
                        rules::FREE_IS_FREE,
                        format!(
                            "retail is 0/0 but the upstream costs {}/{} wei per Mtok",
                            rung.cost.input_wei_per_mtok, rung.cost.output_wei_per_mtok
                        ),
                    ));
                }
                for (side, retail, cost) in [
                    (
                        "input",
                        rung.retail.input_wei_per_mtok,
                        rung.cost.input_wei_per_mtok,
                    ),
                    (
                        "output",
                        rung.retail.output_wei_per_mtok,
                        rung.cost.output_wei_per_mtok,
                    ),
                ] {
                    if retail < cost {
                        return Err(broken(
                            at,
                            rules::NOT_BELOW_COST,
                            format!("{side} retail {retail} < cost {cost} wei per Mtok"),
                        ));
                    }
                }
            }
        }
        Ok(Self {
            providers,
            models,
            names,
        })
    }

    /// Resolves a model name or alias.
    pub fn resolve(&self, name: &str) -> Result<&Model> {
        self.names
            .get(name)
            .map(|&i| &self.models[i])
            .ok_or_else(|| Error::UnknownModel(name.to_owned()))
    }

    /// Models in file order.
    pub fn models(&self) -> &[Model] {
        &self.models
    }

    /// Providers in file order.
    pub fn providers(&self) -> &[Provider] {
        &self.providers
    }

    /// Every model as a router arm, in file order: a new model is a new profile row.
    pub fn arms(&self) -> Vec<Arm> {
        self.models.iter().map(Model::arm).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EXAMPLE: &str = include_str!("../../catalog.example.toml");

    #[test]
    fn the_example_catalog_loads_and_resolves_aliases() {
        let c = Catalog::from_toml_str(EXAMPLE).unwrap();
        assert!(c.models().len() >= 3);
        let by_alias = c.resolve("llama-8b").unwrap();
        assert_eq!(by_alias.name, "llama-3.1-8b-instruct");
        assert!(matches!(c.resolve("gpt-9"), Err(Error::UnknownModel(_))));
        assert_eq!(c.arms().len(), c.models().len());
    }

    fn rule_of(text: &str) -> (String, &'static str) {
        match Catalog::from_toml_str(text).unwrap_err() {
            Error::Catalog { at, rule, .. } => (at, rule),
            other => panic!("unexpected {other}"),
        }
    }

    const HEAD: &str = r#"
[[providers]]
name = "fleet"
[[models]]
name = "m"
quality = 0.5
latency_s = 1.0
"#;

    fn with_rung(rung: &str) -> String {
        format!("{HEAD}[[models.rungs]]\n{rung}")
    }

    #[test]
    fn a_free_rung_to_a_paid_upstream_is_refused_with_the_rung_named() {
        let (at, rule) = rule_of(&with_rung(
            r#"upstream = "up"
provider = "fleet"
context_limit_tokens = 1000
retail = { input_wei_per_mtok = 0, output_wei_per_mtok = 0 }
cost = { input_wei_per_mtok = 5, output_wei_per_mtok = 0 }"#,
        ));
        assert_eq!(rule, rules::FREE_IS_FREE);
        assert_eq!(at, "models[0] (m).rungs[0] (up via fleet)");
    }

    #[test]
    fn below_cost_and_unknown_provider_are_refused() {
        let (at, rule) = rule_of(&with_rung(
            r#"upstream = "up"
provider = "fleet"
context_limit_tokens = 1000
retail = { input_wei_per_mtok = 10, output_wei_per_mtok = 10 }
cost = { input_wei_per_mtok = 5, output_wei_per_mtok = 11 }"#,
        ));
        assert_eq!(rule, rules::NOT_BELOW_COST);
        assert!(at.ends_with("rungs[0] (up via fleet)"));
        let (_, rule) = rule_of(&with_rung(
            r#"upstream = "up"
provider = "elsewhere"
context_limit_tokens = 1000
retail = { input_wei_per_mtok = 10, output_wei_per_mtok = 10 }
cost = { input_wei_per_mtok = 5, output_wei_per_mtok = 5 }"#,
        ));
        assert_eq!(rule, rules::KNOWN_PROVIDER);
    }

    #[test]
    fn structure_errors_name_where() {
        let (_, rule) = rule_of(HEAD);
        assert_eq!(rule, rules::HAS_RUNG);
        let (at, rule) = rule_of(&format!("{HEAD}colour = \"red\"\n"));
        assert_eq!(rule, rules::WELL_FORMED);
        assert!(at.starts_with("line "), "{at}");
        let dup = format!(
            "{}\n[[models]]\nname = \"m2\"\naliases = [\"m\"]\nquality = 0.5\nlatency_s = 1.0\n",
            with_rung(
                r#"upstream = "up"
provider = "fleet"
context_limit_tokens = 1000
retail = { input_wei_per_mtok = 0, output_wei_per_mtok = 0 }
cost = { input_wei_per_mtok = 0, output_wei_per_mtok = 0 }"#
            )
        );
        let (at, rule) = rule_of(&dup);
        assert_eq!(rule, rules::UNIQUE_NAME);
        assert!(at.starts_with("models[1]"), "{at}");
    }

    #[test]
    fn rung_for_walks_the_rungs_in_order() {
        let c = Catalog::from_toml_str(EXAMPLE).unwrap();
        let m = c.resolve("llama-3.1-8b-instruct").unwrap();
        let (first, _) = m.rung_for(1000).unwrap();
        assert_eq!(first, 0);
        let big = m
            .rungs
            .iter()
            .map(|r| r.context_limit_tokens)
            .max()
            .unwrap();
        assert!(m.rung_for(big + 1).is_none());
    }
}
