//! `cx clear`: one job against a list of bundles, explained.

use anyhow::{Context, bail};
use cx_exchange::candidate::Candidate;
use cx_exchange::clearing::{Decision, explain};
use cx_exchange::feasibility::price_ceiling;
use cx_exchange::objective::Weights;
use cx_protocol::Job;
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
    bundles: Vec<Candidate>,
    #[serde(default)]
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
    let decision = explain(&input.job, &input.bundles, &input.weights, ceiling);
    super::emit(args.json, &table(&input, &decision), &decision)
}

/// Parses and validates; every error names the field (`bundles[2].rtt_s: …`).
fn parse(text: &str) -> anyhow::Result<Input> {
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
    for (i, b) in input.bundles.iter().enumerate() {
        b.validate()
            .map_err(|e| e.within(&format!("bundles[{i}]")))?;
        if !ids.insert(b.id.as_str()) {
            bail!("bundles[{i}].id: duplicate id `{}`", b.id);
        }
    }
    Ok(input)
}

fn table(input: &Input, d: &Decision) -> String {
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
