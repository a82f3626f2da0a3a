//! `cx clear`: one job against a list of bundles, explained.

use anyhow::{Context, bail};
use cx_exchange::candidate::{Candidate, View};
use cx_exchange::clearing::{Decision, explain};
use cx_exchange::feasibility::price_ceiling;
use cx_exchange::objective::Weights;
use cx_protocol::price::{self, Rounding};
use cx_protocol::{ClassSet, Job, TierSet};
use serde::Deserialize;
use std::collections::HashSet;
use std::fmt::Write as _;
use std::io::Read;
use std::path::PathBuf;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// JSON file `{"job": {...}, "bundles": [...], "weights": {...}}`; `-` or absent reads stdin.
    input: Option<PathBuf>,
    /// Print the decision as one JSON object, last.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
    job: Job,
    bundles: Vec<CandidateInput>,
    #[serde(default)]
    weights: Weights,
}

/// A bundle as `cx clear` reads it: β, α and t_compute already resolved for the job. The ask is
/// `price_wei_per_s` (an integer, or a decimal string of one), or — as people write it and as
/// the format always accepted — `price_per_hour` in whole units of the asset, converted once to
/// wei per compute-second, rounded up ([`price::wei_per_s_from_units_per_hour`]).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CandidateInput {
    id: String,
    #[serde(default, with = "cx_protocol::price::wei_string_opt")]
    price_wei_per_s: Option<u128>,
    #[serde(default)]
    price_per_hour: Option<f64>,
    memory_bytes: u64,
    bandwidth_bps: f64,
    base_resident: bool,
    adapter_resident: bool,
    rtt_s: f64,
    compute_s: f64,
    /// Work queued ahead of the job, seconds (0 when left out).
    #[serde(default)]
    queue_s: f64,
    context_max: u32,
    determinism: ClassSet,
    tiers: TierSet,
    #[serde(default)]
    failure_rate: f64,
}

impl CandidateInput {
    /// The candidate, or what is wrong with its price fields, named under `within`.
    fn into_candidate(self, within: &str) -> anyhow::Result<Candidate> {
        let price_wei_per_s = match (self.price_wei_per_s, self.price_per_hour) {
            (Some(wei), None) => u64::try_from(wei).with_context(|| {
                format!("{within}.price_wei_per_s: a rate must be below 2^64 wei/s, got {wei}")
            })?,
            (None, Some(per_hour)) => price::wei_per_s_from_units_per_hour(per_hour, Rounding::Up)
                .with_context(|| {
                    format!("{within}.price_per_hour: must be a finite number >= 0, got {per_hour}")
                })?,
            (Some(_), Some(_)) => bail!(
                "{within}.price_wei_per_s: give the ask once, as price_wei_per_s or price_per_hour"
            ),
            (None, None) => bail!("{within}.price_wei_per_s: missing (or price_per_hour)"),
        };
        Ok(Candidate {
            id: self.id,
            view: View {
                price_wei_per_s,
                memory_bytes: self.memory_bytes,
                bandwidth_bps: self.bandwidth_bps,
                base_resident: self.base_resident,
                // A candidate file states β; without it the bundle fetches over B.
                base_fetchable: true,
                base_load_bps: self.bandwidth_bps,
                adapter_resident: self.adapter_resident,
                prefix_resident: false,
                rtt_s: self.rtt_s,
                compute_s: self.compute_s,
                queue_s: self.queue_s,
                context_max: self.context_max,
                determinism: self.determinism,
                tiers: self.tiers,
                failure_rate: self.failure_rate,
            },
        })
    }
}

/// What `cx clear` clears: the job, its candidates, the weights.
struct Clearing {
    job: Job,
    candidates: Vec<Candidate>,
    weights: Weights,
}

pub(crate) fn run(args: Args) -> anyhow::Result<()> {
    let text = match &args.input {
        Some(path) if path.as_os_str() != "-" => std::fs::read_to_string(path)
            .with_context(|| format!("cannot read {}", path.display()))?,
        _ => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .context("cannot read stdin")?;
            s
        }
    };
    let input = parse(&text)?;
    let ceiling = price_ceiling(&input.job, None);
    let decision = explain(&input.job, &input.candidates, &input.weights, &ceiling);
    super::emit(args.json, &table(&input, &decision), &decision)
}

/// Parses and validates; every error names the field (`bundles[2].rtt_s: …`).
fn parse(text: &str) -> anyhow::Result<Clearing> {
    let de = &mut serde_json::Deserializer::from_str(text);
    let input: Input = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        if path == "." {
            anyhow::anyhow!("invalid input: {inner}")
        } else {
            anyhow::anyhow!("{path}: {inner}")
        }
    })?;
    input.job.validate().map_err(|e| e.within("job"))?;
    input.weights.validate()?;
    let mut ids = HashSet::new();
    let mut candidates = Vec::with_capacity(input.bundles.len());
    for (i, b) in input.bundles.into_iter().enumerate() {
        let within = format!("bundles[{i}]");
        let c = b.into_candidate(&within)?;
        if c.id.is_empty() {
            bail!("{within}.id: must not be empty");
        }
        c.view.validate().map_err(|e| e.within(&within))?;
        if !ids.insert(c.id.clone()) {
            bail!("{within}.id: duplicate id `{}`", c.id);
        }
        candidates.push(c);
    }
    Ok(Clearing {
        job: input.job,
        candidates,
        weights: input.weights,
    })
}

fn table(input: &Clearing, d: &Decision) -> String {
    let j = &input.job;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "job: base {:.2} GB, adapter {:.1} MB, KV {:.2} GB, context {} tokens, deadline {} s, class {}, tier {}",
        j.base_bytes as f64 / 1e9,
        j.adapter_bytes as f64 / 1e6,
        j.kv_bytes as f64 / 1e9,
        j.context_tokens,
        j.deadline_s,
        j.determinism,
        j.tier
    );
    match (&d.chosen, &d.terms) {
        (Some(id), Some(t)) => {
            let _ = writeln!(
                out,
                "chosen: {id}  (total {:.6}, t̂ {:.3} s)",
                t.total, t.completion_s
            );
            let _ = writeln!(
                out,
                "  {:<14}{:>14}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}\n  {:<14}{:>14.6}",
                "term",
                "cost",
                "compute",
                t.compute,
                "latency",
                t.latency,
                "failure",
                t.failure,
                "verification",
                t.verification,
                "deadline_risk",
                t.deadline_risk,
                "base_load",
                t.base_load,
                "adapter_load",
                t.adapter_load,
            );
        }
        _ => {
            let _ = writeln!(out, "chosen: none (no bundle is feasible)");
        }
    }
    if !d.feasible.is_empty() {
        let _ = writeln!(out, "feasible ({}):", d.feasible.len());
        let _ = writeln!(out, "  {:<24}{:>14}{:>12}", "id", "total", "t̂ s");
        for f in &d.feasible {
            let _ = writeln!(
                out,
                "  {:<24}{:>14.6}{:>12.3}",
                f.id, f.total, f.completion_s
            );
        }
    }
    if !d.rejected.is_empty() {
        let _ = writeln!(out, "rejected ({}):", d.rejected.len());
        let _ = writeln!(
            out,
            "  {:<24}{:<13}{:>9}  violations",
            "id", "binding", "factor"
        );
        for r in &d.rejected {
            let factor = r.factor.map_or("-".to_owned(), |f| format!("{f:.3}×"));
            let all: Vec<String> = r
                .violations
                .iter()
                .map(|v| format!("{} ({})", v.constraint, v.detail))
                .collect();
            let _ = writeln!(
                out,
                "  {:<24}{:<13}{:>9}  {}",
                r.id,
                r.binding.to_string(),
                factor,
                all.join("; ")
            );
        }
    }
    out
}
