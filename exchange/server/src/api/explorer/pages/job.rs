//! `/explorer/jobs/{id}`: one job from its signed order to the transaction that settled it.

use super::{
    account_link, batch_link, job_link, json_fields, provider_link, text_opt, tx_cell, wei, wei_opt,
};
use crate::api::explorer::format::{id_token, num, time_ms, time_s};
use crate::api::explorer::html::{badge, code, json_details, section, short, table};
use crate::api::explorer::layout;
use crate::api::explorer::queries::jobs::JobDetail;
use crate::api::state::ExplorerConfig;
use cx_protocol::decision::DecisionRecord;
use maud::{Markup, html};
use serde::Serialize;

/// The job page's data: the job, with each settlement part's explorer link filled in.
#[derive(Debug, Serialize)]
pub(crate) struct JobPage {
    /// Everything about the job.
    #[serde(flatten)]
    pub(crate) job: JobDetail,
}

impl JobPage {
    pub(crate) fn new(mut job: JobDetail, config: &ExplorerConfig) -> Self {
        if let Some(s) = &mut job.settlement {
            for part in &mut s.parts {
                part.tx_url = part
                    .tx_hash
                    .as_deref()
                    .and_then(|h| config.tx_url(part.chain_id, h));
            }
        }
        Self { job }
    }
}

/// The cost terms in the objective's order: (name, symbol, what it prices).
const TERMS: [(&str, &str, &str); 8] = [
    (
        "compute",
        "p(b)·t_compute",
        "the bundle's ask for the compute time",
    ),
    ("latency", "λ_L·ℓ", "estimated completion time t̂"),
    ("failure", "λ_F·φ", "the bundle's failure history"),
    ("verification", "λ_V·v(τ)", "verifying at the job's tier"),
    (
        "deadline_risk",
        "λ_D·δ",
        "how little slack t̂ leaves before the deadline (δ = t̂/Δ)",
    ),
    (
        "base_load",
        "μ1·(1−β)",
        "loading the base model (0 when resident)",
    ),
    (
        "adapter_load",
        "μ2·(1−α)",
        "loading the adapter (0 when resident or none)",
    ),
    (
        "prefix_miss",
        "μ_P·(1−π)",
        "rebuilding the conversation prefix the job continues (0 when held or none)",
    ),
];

/// What clearing decided: the tier, the chosen bundle, residency (β, α, π), every cost term of
/// the chosen bundle, the feasible bundles and the rejected ones with their binding constraint.
fn decision_section(d: &DecisionRecord, job: &JobDetail) -> Markup {
    let (beta, alpha) = match job.residency {
        Some(r) => (
            if r.base_resident {
                "1 (resident)"
            } else {
                "0 (loaded for this job)"
            },
            match (r.adapter_resident, job.summary.adapter.is_some()) {
                (_, false) => "1 (no adapter)",
                (true, true) => "1 (resident)",
                (false, true) => "0 (loaded for this job)",
            },
        ),
        None => ("not recorded", "not recorded"),
    };
    html! {
        dl #decision {
            dt { "cleared at tier" }
            dd #decision-tier {
                @match d.tier {
                    Some(t) => (t),
                    None => "—",
                }
            }
            dt { "chosen bundle" } dd #chosen-bundle { (d.chosen.as_deref().unwrap_or("none")) }
            dt { "β base resident then" } dd #beta { (beta) }
            dt { "α adapter resident then" } dd #alpha { (alpha) }
            @if let Some(prefix) = &d.prefix_id {
                dt { "π conversation prefix" }
                dd #prefix {
                    (prefix) ": "
                    @if d.terms.is_some_and(|t| t.prefix_hit) {
                        "1 (held by the chosen bundle: its prefill skipped)"
                    } @else {
                        "0 (not held: prefilled again)"
                    }
                }
            }
            @if let Some(t) = d.terms {
                dt { "t̂ estimated completion" } dd #completion { (num(t.completion_s)) " s" }
            }
        }
        @if let Some(route) = &d.route {
            (route_section(route))
        }
        // Every cost term of the chosen bundle.
        h3 { "Cost terms of the chosen bundle" }
        (cost_terms(d))
        // Feasible bundles, cheapest first.
        h3 { "Feasible bundles (" (d.feasible.len()) " of " (d.feasible_total) " shown)" }
        (feasible_table(d))
        // Refused bundles, each with its binding constraint and factor.
        h3 {
            "Rejected bundles (" (d.rejected.len()) " of " (d.rejected_total)
            " shown, nearest first)"
        }
        (rejected_table(d))
    }
}

/// How a task was routed to the job's model: the target, the arm and every arm scored (utility,
/// G's parts, score, cost, t̂), the arms gated with why and those passed over.
fn route_section(r: &cx_protocol::decision::RouteRecord) -> Markup {
    let rows: Vec<Markup> = r
        .candidates
        .iter()
        .map(|c| {
            html! {
                tr id={ "route-" (id_token(&c.arm)) } {
                    td { (c.arm) @if c.arm == r.arm { " (chosen)" } }
                    td { (num(c.utility)) }
                    td { (num(c.risk)) }
                    td { (num(c.ambiguity)) }
                    td { (num(c.information_gain)) }
                    td { (num(c.efe)) }
                    td { b { (num(c.score)) } }
                    td { (c.cost_wei) }
                    td { (num(c.completion_s)) }
                }
            }
        })
        .collect();
    let gated: Vec<Markup> = r
        .gated
        .iter()
        .map(|g| html! { tr { td { (g.arm) } td { (g.reason) } } })
        .collect();
    html! {
        h3 { "Route: " (code(&r.target)) " → " (r.arm) }
        p #route-why {
            "Ranked by u(x, p) − G: the request's utility (the prior) minus the expected free \
             energy of the arm's outcomes under its market's regime belief (calm, busy, surge: "
            (r.belief.iter().map(|b| format!("{b:.2}")).collect::<Vec<_>>().join(", "))
            "), learned from the meter. Request " (code(&r.request))
            @if r.fan_out > 1 { ", arm " (r.rank + 1) " of a fan-out of " (r.fan_out) }
            "."
            @if !r.passed_over.is_empty() {
                " Passed over (no bundle took them): " (r.passed_over.join(", ")) "."
            }
        }
        (table(
            "route",
            &["arm", "utility", "risk", "ambiguity", "info gain", "G", "score", "cost (wei)", "t̂ (s)"],
            &rows,
            "none scored",
        ))
        (table("route-gated", &["left out", "why"], &gated, "none"))
    }
}

/// The chosen bundle's cost terms in the objective's order, and their total.
fn cost_terms(d: &DecisionRecord) -> Markup {
    let Some(t) = d.terms else {
        return html! { p id="cost-terms" class="empty" { "no cost terms recorded" } };
    };
    let value = |name: &str| match name {
        "compute" => t.compute,
        "latency" => t.latency,
        "failure" => t.failure,
        "verification" => t.verification,
        "deadline_risk" => t.deadline_risk,
        "base_load" => t.base_load,
        "adapter_load" => t.adapter_load,
        "prefix_miss" => t.prefix_miss,
        _ => f64::NAN,
    };
    let mut rows: Vec<Markup> = TERMS
        .iter()
        .map(|(name, symbol, what)| {
            html! {
                tr id={ "term-" (id_token(name)) } {
                    td { (code(name)) }
                    td { (symbol) }
                    td { (what) }
                    td { span.term-value { (num(value(name))) } }
                }
            }
        })
        .collect();
    rows.push(html! {
        tr #term-total {
            td { b { "total" } }
            td { "Σ" }
            td { "what clearing minimised over the feasible bundles" }
            td { b.term-value { (num(t.total)) } }
        }
    });
    html! {
        (table("cost-terms", &["term", "symbol", "prices", "value"], &rows, ""))
        p.note {
            "Terms in whole units of the asset; residency (β, α) is read from the load terms: a \
             zero term means the bundle held it when the job cleared."
        }
    }
}

/// The feasible bundles with their total and estimated completion, the chosen one marked.
fn feasible_table(d: &DecisionRecord) -> Markup {
    let rows: Vec<Markup> = d
        .feasible
        .iter()
        .map(|r| {
            html! {
                tr id={ "feasible-" (id_token(&r.id)) } {
                    td { (r.id) }
                    td { (num(r.total)) }
                    td { (num(r.completion_s)) }
                    td {
                        @if d.chosen.as_deref() == Some(r.id.as_str()) { "chosen" }
                    }
                }
            }
        })
        .collect();
    table(
        "feasible",
        &["bundle", "total", "t̂ (s)", ""],
        &rows,
        "none recorded",
    )
}

/// The rejected bundles: the binding constraint, by how much it was missed, every violation.
fn rejected_table(d: &DecisionRecord) -> Markup {
    let rows: Vec<Markup> = d
        .rejected
        .iter()
        .map(|r| {
            let factor = r
                .factor
                .map_or_else(|| "categorical".to_owned(), |f| format!("×{}", num(f)));
            html! {
                tr id={ "rejected-" (id_token(&r.id)) } {
                    td { (r.id) }
                    td { span.binding { (r.binding) } }
                    td { span.factor { (factor) } }
                    td {
                        ul {
                            @for v in &r.violations {
                                li {
                                    (code(&v.constraint.to_string()))
                                    " "
                                    @if let Some(f) = v.factor { "×" (num(f)) " " }
                                    (v.detail)
                                }
                            }
                        }
                    }
                }
            }
        })
        .collect();
    let columns = [
        "bundle",
        "binding constraint",
        "missed by",
        "every violation",
    ];
    table("rejected", &columns, &rows, "no bundle was refused")
}

/// The chosen bundle as it is registered now.
fn bundle_section(job: &JobDetail) -> Markup {
    let Some(b) = &job.bundle else {
        return html! {
            p id="bundle-now" class="empty" { "the bundle is no longer registered" }
        };
    };
    html! {
        dl #bundle-now {
            dt { "id" } dd { (b.id) }
            dt { "operator" } dd { (b.provider) }
            dt { "device" } dd { (b.device) }
            dt { "ask" } dd { (b.price_wei_per_s) " wei per compute-second" }
            dt { "free memory" } dd { (b.memory_bytes) " bytes" }
            dt { "bandwidth" } dd { (num(b.bandwidth_bps)) " bit/s" }
            dt { "round trip" } dd { (num(b.rtt_s)) " s" }
            dt { "throughput" } dd { (num(b.flops_per_s)) " FLOP/s" }
            dt { "resident bases" } dd { (list_or_none(&b.resident_bases)) }
            dt { "resident adapters" }
            dd { (b.resident_adapters.len()) " (" (list_or_none(&b.resident_adapters)) ")" }
        }
        p.note {
            "As the bundle is registered now; β and α above are what it held when the job cleared."
        }
    }
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// The job at a glance: status, account, tab, model, tier, bundle, provider, amounts, times.
fn summary(j: &JobDetail) -> Markup {
    let s = &j.summary;
    html! {
        dl #summary {
            dt { "status" } dd #status { (badge(&s.status)) }
            dt { "lifecycle state" } dd #job-status { (s.job_status) }
            dt { "account" } dd #account { (account_link(&s.account)) }
            dt { "tab" } dd #tab { "chain " (s.chain_id) " · escrow " (s.escrow_id) }
            dt { "model" } dd #model { (s.model) }
            dt { "adapter" } dd #adapter { (text_opt(s.adapter.as_deref())) }
            dt { "tier" } dd #tier { (text_opt(s.tier.as_deref())) }
            dt { "bundle" } dd #bundle { (text_opt(s.bundle_id.as_deref())) }
            dt { "provider" }
            dd #provider {
                @match &s.provider_key_hash {
                    Some(k) => a id="provider-link" href={ "/explorer/providers/" (k) } { (k) },
                    None => "—",
                }
            }
            dt { "held on the tab" } dd #held { (wei(&s.held_wei)) }
            dt { "charged" } dd #charged { (wei_opt(s.charged_wei.as_deref())) }
            dt { "accepted" } dd #accepted { (time_ms(s.created_at_ms)) }
            dt { "deadline" } dd #deadline { (time_s(u64::try_from(j.deadline_s).unwrap_or(0))) }
            dt { "settlement batch" }
            dd #batch {
                @match s.batch_id {
                    Some(b) => a id="batch-link" href={ "/explorer/batches/" (b) } { "batch " (b) },
                    None => "—",
                }
            }
            @if let Some(session) = &j.session_id {
                dt { "session" } dd #session { (short(session)) }
            }
            @if let Some(t) = &j.trained {
                dt { "trained adapter" } dd #trained-adapter { (t.adapter_id) }
                dt { "loss" }
                dd #trained-loss {
                    (num(t.loss_first)) " → " (num(t.loss_last)) " in " (t.steps) " steps"
                }
            }
        }
    }
}

/// The signed order: its digest, kind, signer and nonce, its signed terms, its signatures.
fn order_section(j: &JobDetail) -> Markup {
    let o = &j.order;
    let signature = o.signed.get("signature").and_then(|v| v.as_str());
    let mldsa = o.signed.get("mldsa_signature").and_then(|v| v.as_str());
    html! {
        dl #order {
            dt { "digest" } dd #order-digest { (code(&o.digest)) }
            dt { "kind" } dd #order-kind { (o.kind) }
            dt { "signer" } dd { (account_link(&o.account)) }
            dt { "domain chain" } dd { (o.chain_id) }
            dt { "nonce" } dd { (o.nonce) }
            dt { "received" } dd { (time_ms(o.received_at_ms)) }
        }
        h3 { "Signed terms" }
        (json_fields(o.signed.get("order").unwrap_or(&serde_json::Value::Null), "order-"))
        @if let Some(sig) = signature {
            dl {
                dt { "EIP-712 signature" } dd #order-signature { (short(sig)) }
                @if let Some(pq) = mldsa {
                    dt { "ML-DSA-65 co-signature" }
                    dd #order-mldsa-signature { (pq.len().saturating_sub(2) / 2) " bytes" }
                }
            }
        }
        (json_details("the signed order as received", &o.signed))
    }
}

/// Who the job was assigned to, at what price, and when the provider took it.
fn assignment_section(j: &JobDetail) -> Markup {
    let Some(a) = &j.assignment else {
        return html! { p id="assignment" class="empty" { "not assigned" } };
    };
    html! {
        dl #assignment {
            dt { "bundle" } dd #assignment-bundle { (a.bundle_id) }
            dt { "provider" }
            dd #assignment-provider {
                @match &a.provider_key_hash {
                    Some(k) => (provider_link(k)),
                    None => "—",
                }
            }
            dt { "operator" } dd { (text_opt(a.operator.as_deref())) }
            dt { "price (most the receipt may claim)" } dd #assignment-price { (wei(&a.price_wei)) }
            dt { "due" } dd { (time_s(u64::try_from(a.deadline_s).unwrap_or(0))) }
            dt { "taken by the provider" }
            dd #assignment-taken {
                @match a.taken_at_ms {
                    Some(at) => (time_ms(at)),
                    None => "not yet",
                }
            }
        }
        @if let Some(signed) = &a.signed {
            (json_details("the exchange's signed assignment (from the job's voucher)", signed))
        }
    }
}

/// The provider's signed receipt: what it claims and when it came.
fn receipt_section(j: &JobDetail) -> Markup {
    let Some(r) = &j.receipt else {
        return html! { p id="receipt" class="empty" { "no receipt yet" } };
    };
    html! {
        dl #receipt {
            dt { "amount owed" } dd #receipt-amount { (wei(&r.amount_owed_wei)) }
            dt { "signed by" } dd { (provider_link(&r.provider_key_hash)) }
            dt { "received" } dd { (time_ms(r.received_at_ms)) }
        }
        (json_fields(r.signed.get("receipt").unwrap_or(&serde_json::Value::Null), "receipt-"))
        (json_details("the signed receipt as received", &r.signed))
    }
}

/// The job's verification: tier, cost, result, the check's method and runs, its events.
fn verification_section(j: &JobDetail) -> Markup {
    let v = &j.verification;
    let result = v.result.as_deref().unwrap_or(match v.tier.as_deref() {
        Some("T0") => "none needed (T0: stake only)",
        _ => "none recorded yet",
    });
    let field =
        |r: &serde_json::Value, k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_owned);
    let runs: Vec<Markup> = v
        .runs
        .iter()
        .map(|r| {
            html! {
                tr {
                    td {
                        @match field(r, "job") {
                            Some(job) => (job_link(&job)),
                            None => "—",
                        }
                    }
                    td {
                        @match field(r, "provider") {
                            Some(p) => (provider_link(&p)),
                            None => "—",
                        }
                    }
                    td {
                        @match field(r, "output_hash") {
                            Some(h) => (short(&h)),
                            None => "—",
                        }
                    }
                }
            }
        })
        .collect();
    html! {
        dl #verification {
            dt { "tier" } dd #verification-tier { (text_opt(v.tier.as_deref())) }
            dt { "cost (λ_V·v(τ) when cleared)" }
            dd #verification-cost {
                @match v.cost {
                    Some(c) => (num(c)),
                    None => "—",
                }
            }
            dt { "result" } dd #verification-result { (result) }
            @if let Some(method) = &v.method {
                dt { "method" } dd #verification-method { (method) }
                dt { "passed" }
                dd #verification-passed {
                    @match v.passed {
                        Some(true) => "yes",
                        Some(false) => "no",
                        None => "—",
                    }
                }
                dt { "cost of the check" }
                dd #verification-cost-wei { (wei_opt(v.cost_wei.as_deref())) }
                dt { "check took" }
                dd #verification-check-ms {
                    @match v.check_ms {
                        Some(ms) => { (ms) " ms" }
                        None => "—",
                    }
                }
            }
        }
        @if !v.runs.is_empty() {
            (table("verification-runs", &["job", "provider", "output hash"], &runs, "no runs"))
        }
        @for e in &v.events {
            (json_details(&format!("{} at {}", e.status, time_ms(e.at_ms)), &e.detail))
        }
    }
}

/// The job's settlement: its state and batch, the batch's parts on each chain, its steps.
fn settlement_section(j: &JobDetail) -> Markup {
    let Some(st) = &j.settlement else {
        return html! {
            p id="settlement" class="empty" {
                "not in settlement (no receipt handed to the committee yet)"
            }
        };
    };
    let parts: Vec<Markup> = st
        .parts
        .iter()
        .map(|part| {
            html! {
                tr id={ "part-" (part.chain_id) } {
                    td { (part.chain_id) }
                    td { (part.nonce) }
                    td { (badge(&part.status)) }
                    td { (tx_cell(part)) }
                }
            }
        })
        .collect();
    html! {
        dl #settlement {
            dt { "state" } dd #settlement-state { (badge(&st.state)) }
            @if let Some(b) = st.batch_id {
                dt { "batch" } dd { (batch_link(b)) }
            }
            @if let Some(reason) = &st.rejected_reason {
                dt { "refused because" } dd #settlement-rejected { (reason) }
            }
            @if let Some(at) = st.received_at_ms {
                dt { "receipt taken by the coordinator" } dd { (time_ms(at)) }
            }
        }
        (table("parts", &["chain", "nonce", "status", "transaction"], &parts, "no batch parts yet"))
        (super::batches::steps_table(&st.steps))
    }
}

/// Every event of the job, in order.
fn timeline(j: &JobDetail) -> Markup {
    html! {
        ol #events {
            @for e in &j.events {
                li id={ "event-" (e.seq) } {
                    (time_ms(e.at_ms)) " " (badge(&e.status))
                    @if e.detail.as_object().is_some_and(|m| !m.is_empty()) {
                        " " (code(&e.detail.to_string()))
                    }
                }
            }
        }
    }
}

/// The page.
pub(crate) fn render(p: &JobPage) -> Markup {
    let j = &p.job;
    let body = html! {
        (summary(j))
        (section("order", "Signed order", order_section(j)))
        (section("decision", "Clearing decision", decision_section(&j.decision, j)))
        (section("bundle", "Chosen bundle", bundle_section(j)))
        (section("assignment", "Assignment", assignment_section(j)))
        (section("receipt", "Receipt", receipt_section(j)))
        (section("verification", "Verification", verification_section(j)))
        (section("settlement", "Settlement", settlement_section(j)))
        (section("events", "Timeline", timeline(j)))
    };
    layout::page(&format!("Job {}", j.summary.id), "jobs", body)
}
