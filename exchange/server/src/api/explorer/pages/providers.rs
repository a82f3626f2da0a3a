//! `/explorer/providers` and `/explorer/providers/{key_hash}`: stake, asks, residency, slot
//! shadow price, observed failure rate and earnings.

use super::{page_links, pager, provider_link, wei};
use crate::api::explorer::html::{self, Dl, Html, Table, esc, id_token, num, time_ms};
use crate::api::explorer::queries::providers::{ProviderDetail, ProviderSummary};
use serde::Serialize;

/// The providers list's data.
#[derive(Debug, Serialize)]
pub(crate) struct ProvidersPage {
    /// The providers, most recently registered first.
    pub(crate) providers: Vec<ProviderSummary>,
    /// The page number.
    pub(crate) page: u32,
    /// Whether another page follows.
    pub(crate) more: bool,
}

fn rate(r: Option<f64>) -> String {
    r.map_or_else(
        || "no job ended yet".to_owned(),
        |r| format!("{:.1} %", r * 100.0),
    )
}

/// The list page.
pub(crate) fn render_list(p: &ProvidersPage) -> String {
    let mut t = Table::new(
        "providers",
        &[
            "provider",
            "operator",
            "bundles",
            "completed",
            "expired / failed",
            "failure rate",
            "earnings",
            "settled",
            "last seen",
        ],
    );
    for s in &p.providers {
        t.row(
            Some(&format!("provider-{}", s.key_hash)),
            vec![
                provider_link(&s.key_hash),
                Html::text(&s.operator),
                Html::text(&s.bundles.to_string()),
                Html::text(&s.completed.to_string()),
                Html::text(&s.failed.to_string()),
                Html::text(&rate(s.failure_rate)),
                wei(&s.earnings_wei),
                wei(&s.settled_wei),
                Html::text(&time_ms(s.seen_at_ms)),
            ],
        );
    }
    let mut body = t.finish("no provider has registered");
    let (prev, next) = page_links("/explorer/providers", p.page, p.more);
    body.push(&pager(prev.as_deref(), next.as_deref()));
    html::page("Providers", "providers", &body)
}

/// One provider's page.
pub(crate) fn render_one(p: &ProviderDetail) -> String {
    let s = &p.summary;
    let asks: Vec<u64> = p.bundles.iter().map(|b| b.bundle.price_wei_per_s).collect();
    let asks_text = match (asks.iter().min(), asks.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => format!("{lo} wei per compute-second"),
        (Some(lo), Some(hi)) => format!("{lo} – {hi} wei per compute-second"),
        _ => "no bundles".to_owned(),
    };
    let mut dl = Dl::new();
    dl.html(Some("key-hash"), "key hash", html::code(&s.key_hash))
        .text(Some("operator"), "operator", &s.operator)
        .html(
            Some("payout"),
            "payout account",
            super::account_link(&s.payout),
        )
        .text(
            Some("stake"),
            "stake",
            &if !p.stakes.is_empty() {
                p.stakes
                    .iter()
                    .map(|s| format!("{} wei on chain {}", s.staked_wei, s.chain_id))
                    .collect::<Vec<_>>()
                    .join("; ")
            } else {
                p.stake_wei.as_ref().map_or_else(
                    || "not known (no chain's ProviderRegistry answered)".to_owned(),
                    |w| format!("{w} wei (as its offer states)"),
                )
            },
        )
        .text(Some("asks"), "asks", &asks_text)
        .text(
            Some("shadow-price"),
            "slot shadow price",
            &p.slot_shadow_price
                .map_or_else(|| "not reported".to_owned(), num),
        )
        .text(
            Some("failure-rate"),
            "observed failure rate",
            &format!(
                "{} ({} completed, {} expired or failed, {} open)",
                rate(s.failure_rate),
                s.completed,
                s.failed,
                s.open
            ),
        )
        .text(
            Some("residency-misses"),
            "residency misses",
            &format!(
                "{} of {} jobs cleared on a residency claim ({} missed the deadline, {} fetched \
                 the adapter it claimed)",
                p.residency_misses.deadline + p.residency_misses.fetched,
                p.residency_misses.claims,
                p.residency_misses.deadline,
                p.residency_misses.fetched
            ),
        )
        .html(
            Some("earnings"),
            "earnings (receipts)",
            wei(&s.earnings_wei),
        )
        .html(
            Some("settled"),
            "of which settled on chain",
            wei(&s.settled_wei),
        )
        .text(None, "registered", &time_ms(s.registered_at_ms))
        .text(None, "last seen", &time_ms(s.seen_at_ms));
    let mut body = dl.finish(Some("summary"));
    body.lit(&format!(
        "<p><a id=\"provider-jobs\" href=\"/explorer/jobs?provider={}\">this provider's jobs</a></p>",
        esc(&s.key_hash)
    ));

    let mut bundles = Table::new(
        "bundles",
        &[
            "bundle",
            "device",
            "ask (wei/s)",
            "free memory (B)",
            "bandwidth (bit/s)",
            "rtt (s)",
            "context",
            "tiers",
            "classes",
            "φ",
            "live",
        ],
    );
    let mut residency = Table::new(
        "residency",
        &["bundle", "resident bases", "resident adapters"],
    );
    for b in &p.bundles {
        let x = &b.bundle;
        let tiers = serde_json::to_value(x.tiers)
            .map(|v| v.to_string())
            .unwrap_or_default();
        let classes = serde_json::to_value(x.determinism)
            .map(|v| v.to_string())
            .unwrap_or_default();
        bundles.row(
            Some(&format!("bundle-{}", id_token(&x.id))),
            vec![
                Html::text(&x.id),
                Html::text(&x.device),
                Html::raw(format!("<span class=\"ask\">{}</span>", x.price_wei_per_s)),
                Html::text(&x.memory_bytes.to_string()),
                Html::text(&num(x.bandwidth_bps)),
                Html::text(&num(x.rtt_s)),
                Html::text(&x.context_max.to_string()),
                html::code(&tiers),
                html::code(&classes),
                Html::text(&num(x.failure_rate)),
                Html::text(if b.live { "yes" } else { "no (silent)" }),
            ],
        );
        let mut adapters = Html::text(&format!("{}", x.resident_adapters.len()));
        if !x.resident_adapters.is_empty() {
            adapters.lit(": ");
            for (i, a) in x.resident_adapters.iter().take(20).enumerate() {
                if i > 0 {
                    adapters.lit(", ");
                }
                adapters.push(&html::short(a));
            }
            if x.resident_adapters.len() > 20 {
                adapters.lit(" …");
            }
        }
        residency.row(
            None,
            vec![
                Html::text(&x.id),
                Html::text(&if x.resident_bases.is_empty() {
                    "none".to_owned()
                } else {
                    x.resident_bases.join(", ")
                }),
                adapters,
            ],
        );
    }
    body.push(&html::section(
        "bundles",
        "Bundles and asks",
        &bundles.finish("no bundles"),
    ));
    body.push(&html::section(
        "residency",
        "Residency (what each bundle holds in accelerator memory)",
        &residency.finish("no bundles"),
    ));
    html::page(&format!("Provider {}", s.operator), "providers", &body)
}
