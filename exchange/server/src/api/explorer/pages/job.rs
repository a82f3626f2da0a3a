//! `/explorer/jobs/{id}`: one job from its signed order to the transaction that settled it.

use super::{
    account_link, batch_link, job_link, json_fields, provider_link, text_opt, tx_cell, wei, wei_opt,
};
use crate::api::explorer::html::{
    self, Dl, Html, Table, badge, code, esc, id_token, json_details, num, section, time_ms, time_s,
};
use crate::api::explorer::queries::jobs::JobDetail;
use crate::api::state::ExplorerConfig;
use cx_protocol::decision::DecisionRecord;
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

fn decision_section(d: &DecisionRecord, job: &JobDetail) -> Html {
    let mut out = Html::default();
    let mut dl = Dl::new();
    dl.text(
        Some("decision-tier"),
        "cleared at tier",
        &d.tier.map_or_else(|| "—".to_owned(), |t| t.to_string()),
    );
    dl.text(
        Some("chosen-bundle"),
        "chosen bundle",
        d.chosen.as_deref().unwrap_or("none"),
    );
    match job.residency {
        Some(r) => {
            dl.text(
                Some("beta"),
                "β base resident then",
                if r.base_resident {
                    "1 (resident)"
                } else {
                    "0 (loaded for this job)"
                },
            );
            dl.text(
                Some("alpha"),
                "α adapter resident then",
                match (r.adapter_resident, job.summary.adapter.is_some()) {
                    (_, false) => "1 (no adapter)",
                    (true, true) => "1 (resident)",
                    (false, true) => "0 (loaded for this job)",
                },
            );
        }
        None => {
            dl.text(Some("beta"), "β base resident then", "not recorded");
            dl.text(Some("alpha"), "α adapter resident then", "not recorded");
        }
    }
    if let Some(prefix) = &d.prefix_id {
        let held = d.terms.is_some_and(|t| t.prefix_hit);
        dl.text(
            Some("prefix"),
            "π conversation prefix",
            &format!(
                "{prefix}: {}",
                if held {
                    "1 (held by the chosen bundle: its prefill skipped)"
                } else {
                    "0 (not held: prefilled again)"
                }
            ),
        );
    }
    if let Some(t) = d.terms {
        dl.text(
            Some("completion"),
            "t̂ estimated completion",
            &format!("{} s", num(t.completion_s)),
        );
    }
    out.push(&dl.finish(Some("decision")));

    // Every cost term of the chosen bundle.
    out.lit("<h3>Cost terms of the chosen bundle</h3>");
    match d.terms {
        Some(t) => {
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
            let mut table = Table::new("cost-terms", &["term", "symbol", "prices", "value"]);
            for (name, symbol, what) in TERMS {
                table.row(
                    Some(&format!("term-{}", id_token(name))),
                    vec![
                        code(name),
                        Html::text(symbol),
                        Html::text(what),
                        Html::raw(format!(
                            "<span class=\"term-value\">{}</span>",
                            esc(&num(value(name)))
                        )),
                    ],
                );
            }
            table.row(
                Some("term-total"),
                vec![
                    Html::raw("<b>total</b>"),
                    Html::text("Σ"),
                    Html::text("what clearing minimised over the feasible bundles"),
                    Html::raw(format!(
                        "<b class=\"term-value\">{}</b>",
                        esc(&num(t.total))
                    )),
                ],
            );
            out.push(&table.finish(""));
            out.lit(
                "<p class=\"note\">Terms in whole units of the asset; residency (β, α) is read \
                 from the load terms: a zero term means the bundle held it when the job cleared.</p>",
            );
        }
        None => out.lit("<p id=\"cost-terms\" class=\"empty\">no cost terms recorded</p>"),
    }

    // Feasible bundles, cheapest first.
    out.lit(&format!(
        "<h3>Feasible bundles ({} of {} shown)</h3>",
        d.feasible.len(),
        d.feasible_total
    ));
    let mut feasible = Table::new("feasible", &["bundle", "total", "t̂ (s)", ""]);
    for r in &d.feasible {
        let chosen = d.chosen.as_deref() == Some(r.id.as_str());
        feasible.row(
            Some(&format!("feasible-{}", id_token(&r.id))),
            vec![
                Html::text(&r.id),
                Html::text(&num(r.total)),
                Html::text(&num(r.completion_s)),
                Html::text(if chosen { "chosen" } else { "" }),
            ],
        );
    }
    out.push(&feasible.finish("none recorded"));

    // Refused bundles, each with its binding constraint and factor.
    out.lit(&format!(
        "<h3>Rejected bundles ({} of {} shown, nearest first)</h3>",
        d.rejected.len(),
        d.rejected_total
    ));
    let mut rejected = Table::new(
        "rejected",
        &[
            "bundle",
            "binding constraint",
            "missed by",
            "every violation",
        ],
    );
    for r in &d.rejected {
        let mut violations = Html::raw("<ul>");
        for v in &r.violations {
            violations.lit("<li>");
            violations.push(&code(&v.constraint.to_string()));
            violations.lit(" ");
            if let Some(f) = v.factor {
                violations.push_text(&format!("×{} ", num(f)));
            }
            violations.push_text(&v.detail);
            violations.lit("</li>");
        }
        violations.lit("</ul>");
        rejected.row(
            Some(&format!("rejected-{}", id_token(&r.id))),
            vec![
                Html::text(&r.id),
                Html::raw(format!(
                    "<span class=\"binding\">{}</span>",
                    esc(&r.binding.to_string())
                )),
                Html::raw(format!(
                    "<span class=\"factor\">{}</span>",
                    esc(&r
                        .factor
                        .map_or_else(|| "categorical".to_owned(), |f| format!("×{}", num(f))))
                )),
                violations,
            ],
        );
    }
    out.push(&rejected.finish("no bundle was refused"));
    out
}

fn bundle_section(job: &JobDetail) -> Html {
    let Some(b) = &job.bundle else {
        return Html::raw(
            "<p id=\"bundle-now\" class=\"empty\">the bundle is no longer registered</p>",
        );
    };
    let mut dl = Dl::new();
    dl.text(None, "id", &b.id)
        .text(None, "operator", &b.provider)
        .text(None, "device", &b.device)
        .html(
            None,
            "ask",
            Html::text(&format!("{} wei per compute-second", b.price_wei_per_s)),
        )
        .text(None, "free memory", &format!("{} bytes", b.memory_bytes))
        .text(
            None,
            "bandwidth",
            &format!("{} bit/s", num(b.bandwidth_bps)),
        )
        .text(None, "round trip", &format!("{} s", num(b.rtt_s)))
        .text(
            None,
            "throughput",
            &format!("{} FLOP/s", num(b.flops_per_s)),
        )
        .text(None, "resident bases", &list_or_none(&b.resident_bases))
        .text(
            None,
            "resident adapters",
            &format!(
                "{} ({})",
                b.resident_adapters.len(),
                list_or_none(&b.resident_adapters)
            ),
        );
    let mut out = dl.finish(Some("bundle-now"));
    out.lit("<p class=\"note\">As the bundle is registered now; β and α above are what it held when the job cleared.</p>");
    out
}

fn list_or_none(items: &[String]) -> String {
    if items.is_empty() {
        "none".to_owned()
    } else {
        items.join(", ")
    }
}

/// The page.
pub(crate) fn render(p: &JobPage) -> String {
    let j = &p.job;
    let s = &j.summary;
    let mut body = Html::default();

    let mut dl = Dl::new();
    dl.html(Some("status"), "status", badge(&s.status))
        .text(Some("job-status"), "lifecycle state", &s.job_status)
        .html(Some("account"), "account", account_link(&s.account))
        .text(
            Some("tab"),
            "tab",
            &format!("chain {} · escrow {}", s.chain_id, s.escrow_id),
        )
        .text(Some("model"), "model", &s.model)
        .html(Some("adapter"), "adapter", text_opt(s.adapter.as_deref()))
        .html(Some("tier"), "tier", text_opt(s.tier.as_deref()))
        .html(Some("bundle"), "bundle", text_opt(s.bundle_id.as_deref()))
        .html(
            Some("provider"),
            "provider",
            s.provider_key_hash.as_deref().map_or(Html::text("—"), |k| {
                Html::raw(format!(
                    "<a id=\"provider-link\" href=\"/explorer/providers/{}\">{}</a>",
                    esc(k),
                    esc(k)
                ))
            }),
        )
        .html(Some("held"), "held on the tab", wei(&s.held_wei))
        .html(
            Some("charged"),
            "charged",
            wei_opt(s.charged_wei.as_deref()),
        )
        .text(Some("accepted"), "accepted", &time_ms(s.created_at_ms))
        .text(
            Some("deadline"),
            "deadline",
            &time_s(u64::try_from(j.deadline_s).unwrap_or(0)),
        )
        .html(
            Some("batch"),
            "settlement batch",
            s.batch_id.map_or(Html::text("—"), |b| {
                Html::raw(format!(
                    "<a id=\"batch-link\" href=\"/explorer/batches/{b}\">batch {b}</a>"
                ))
            }),
        );
    if let Some(session) = &j.session_id {
        dl.html(Some("session"), "session", html::short(session));
    }
    if let Some(t) = &j.trained {
        dl.text(Some("trained-adapter"), "trained adapter", &t.adapter_id)
            .text(
                Some("trained-loss"),
                "loss",
                &format!(
                    "{} → {} in {} steps",
                    num(t.loss_first),
                    num(t.loss_last),
                    t.steps
                ),
            );
    }
    body.push(&dl.finish(Some("summary")));

    // The signed order.
    let o = &j.order;
    let mut order = Dl::new();
    order
        .html(Some("order-digest"), "digest", code(&o.digest))
        .text(Some("order-kind"), "kind", &o.kind)
        .html(None, "signer", account_link(&o.account))
        .text(None, "domain chain", &o.chain_id.to_string())
        .text(None, "nonce", &o.nonce)
        .text(None, "received", &time_ms(o.received_at_ms));
    let mut order_html = order.finish(Some("order"));
    order_html.lit("<h3>Signed terms</h3>");
    order_html.push(&json_fields(
        o.signed.get("order").unwrap_or(&serde_json::Value::Null),
        "order-",
    ));
    if let Some(sig) = o.signed.get("signature").and_then(|v| v.as_str()) {
        let mut sigs = Dl::new();
        sigs.html(
            Some("order-signature"),
            "EIP-712 signature",
            html::short(sig),
        );
        if let Some(pq) = o.signed.get("mldsa_signature").and_then(|v| v.as_str()) {
            sigs.html(
                Some("order-mldsa-signature"),
                "ML-DSA-65 co-signature",
                Html::text(&format!("{} bytes", pq.len().saturating_sub(2) / 2)),
            );
        }
        order_html.push(&sigs.finish(None));
    }
    order_html.push(&json_details("the signed order as received", &o.signed));
    body.push(&section("order", "Signed order", &order_html));

    body.push(&section(
        "decision",
        "Clearing decision",
        &decision_section(&j.decision, j),
    ));
    body.push(&section("bundle", "Chosen bundle", &bundle_section(j)));

    // The assignment.
    let assignment = match &j.assignment {
        Some(a) => {
            let mut dl = Dl::new();
            dl.text(Some("assignment-bundle"), "bundle", &a.bundle_id)
                .html(
                    Some("assignment-provider"),
                    "provider",
                    a.provider_key_hash
                        .as_deref()
                        .map_or(Html::text("—"), provider_link),
                )
                .html(None, "operator", text_opt(a.operator.as_deref()))
                .html(
                    Some("assignment-price"),
                    "price (most the receipt may claim)",
                    wei(&a.price_wei),
                )
                .text(
                    None,
                    "due",
                    &time_s(u64::try_from(a.deadline_s).unwrap_or(0)),
                )
                .text(
                    Some("assignment-taken"),
                    "taken by the provider",
                    &a.taken_at_ms.map_or_else(|| "not yet".to_owned(), time_ms),
                );
            let mut out = dl.finish(Some("assignment"));
            if let Some(signed) = &a.signed {
                out.push(&json_details(
                    "the exchange's signed assignment (from the job's voucher)",
                    signed,
                ));
            }
            out
        }
        None => Html::raw("<p id=\"assignment\" class=\"empty\">not assigned</p>"),
    };
    body.push(&section("assignment", "Assignment", &assignment));

    // The receipt.
    let receipt = match &j.receipt {
        Some(r) => {
            let mut dl = Dl::new();
            dl.html(
                Some("receipt-amount"),
                "amount owed",
                wei(&r.amount_owed_wei),
            )
            .html(None, "signed by", provider_link(&r.provider_key_hash))
            .text(None, "received", &time_ms(r.received_at_ms));
            let mut out = dl.finish(Some("receipt"));
            out.push(&json_fields(
                r.signed.get("receipt").unwrap_or(&serde_json::Value::Null),
                "receipt-",
            ));
            out.push(&json_details("the signed receipt as received", &r.signed));
            out
        }
        None => Html::raw("<p id=\"receipt\" class=\"empty\">no receipt yet</p>"),
    };
    body.push(&section("receipt", "Receipt", &receipt));

    // Verification.
    let v = &j.verification;
    let mut dl = Dl::new();
    dl.html(
        Some("verification-tier"),
        "tier",
        text_opt(v.tier.as_deref()),
    )
    .text(
        Some("verification-cost"),
        "cost (λ_V·v(τ) when cleared)",
        &v.cost.map_or_else(|| "—".to_owned(), num),
    )
    .text(
        Some("verification-result"),
        "result",
        v.result.as_deref().unwrap_or(match v.tier.as_deref() {
            Some("T0") => "none needed (T0: stake only)",
            _ => "none recorded yet",
        }),
    );
    if let Some(method) = &v.method {
        dl.text(Some("verification-method"), "method", method)
            .text(
                Some("verification-passed"),
                "passed",
                match v.passed {
                    Some(true) => "yes",
                    Some(false) => "no",
                    None => "—",
                },
            )
            .html(
                Some("verification-cost-wei"),
                "cost of the check",
                wei_opt(v.cost_wei.as_deref()),
            )
            .text(
                Some("verification-check-ms"),
                "check took",
                &v.check_ms
                    .map_or_else(|| "—".to_owned(), |ms| format!("{ms} ms")),
            );
    }
    let mut verification = dl.finish(Some("verification"));
    if !v.runs.is_empty() {
        let mut runs = Table::new("verification-runs", &["job", "provider", "output hash"]);
        let s =
            |r: &serde_json::Value, k: &str| r.get(k).and_then(|x| x.as_str()).map(str::to_owned);
        for r in &v.runs {
            runs.row(
                None,
                vec![
                    s(r, "job").map_or_else(|| Html::text("—"), |j| job_link(&j)),
                    s(r, "provider").map_or_else(|| Html::text("—"), |p| provider_link(&p)),
                    s(r, "output_hash").map_or_else(|| Html::text("—"), |h| html::short(&h)),
                ],
            );
        }
        verification.push(&runs.finish("no runs"));
    }
    for e in &v.events {
        verification.push(&json_details(
            &format!("{} at {}", e.status, time_ms(e.at_ms)),
            &e.detail,
        ));
    }
    body.push(&section("verification", "Verification", &verification));

    // Settlement.
    let settlement = match &j.settlement {
        Some(st) => {
            let mut dl = Dl::new();
            dl.html(Some("settlement-state"), "state", badge(&st.state));
            if let Some(b) = st.batch_id {
                dl.html(None, "batch", batch_link(b));
            }
            if let Some(reason) = &st.rejected_reason {
                dl.text(Some("settlement-rejected"), "refused because", reason);
            }
            if let Some(at) = st.received_at_ms {
                dl.text(None, "receipt taken by the coordinator", &time_ms(at));
            }
            let mut out = dl.finish(Some("settlement"));
            let mut parts = Table::new("parts", &["chain", "nonce", "status", "transaction"]);
            for part in &st.parts {
                parts.row(
                    Some(&format!("part-{}", part.chain_id)),
                    vec![
                        Html::text(&part.chain_id.to_string()),
                        Html::text(&part.nonce.to_string()),
                        badge(&part.status),
                        tx_cell(part),
                    ],
                );
            }
            out.push(&parts.finish("no batch parts yet"));
            out.push(&super::batches::steps_table(&st.steps));
            out
        }
        None => Html::raw(
            "<p id=\"settlement\" class=\"empty\">not in settlement (no receipt handed to the committee yet)</p>",
        ),
    };
    body.push(&section("settlement", "Settlement", &settlement));

    // Every event.
    let mut events = Html::raw("<ol id=\"events\">");
    for e in &j.events {
        events.lit(&format!("<li id=\"event-{}\">", e.seq));
        events.push_text(&time_ms(e.at_ms));
        events.lit(" ");
        events.push(&badge(&e.status));
        if e.detail.as_object().is_some_and(|m| !m.is_empty()) {
            events.lit(" ");
            events.push(&code(&e.detail.to_string()));
        }
        events.lit("</li>");
    }
    events.lit("</ol>");
    body.push(&section("events", "Timeline", &events));

    html::page(&format!("Job {}", s.id), "jobs", &body)
}
