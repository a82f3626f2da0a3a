//! `/explorer/providers` and `/explorer/providers/{key_hash}`: stake, asks, residency, slot
//! shadow price, observed failure rate and earnings.

use super::{account_link, page_links, pager, provider_link, wei};
use crate::api::explorer::format::{id_token, num, time_ms};
use crate::api::explorer::html::{code, section, short, table};
use crate::api::explorer::layout;
use crate::api::explorer::queries::providers::{ProviderDetail, ProviderSummary};
use maud::{Markup, html};
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
pub(crate) fn render_list(p: &ProvidersPage) -> Markup {
    let rows: Vec<Markup> = p
        .providers
        .iter()
        .map(|s| {
            html! {
                tr id={ "provider-" (s.key_hash) } {
                    td { (provider_link(&s.key_hash)) }
                    td { (s.operator) }
                    td { (s.bundles) }
                    td { (s.completed) }
                    td { (s.failed) }
                    td { (rate(s.failure_rate)) }
                    td { (wei(&s.earnings_wei)) }
                    td { (wei(&s.settled_wei)) }
                    td { (time_ms(s.seen_at_ms)) }
                }
            }
        })
        .collect();
    let columns = [
        "provider",
        "operator",
        "bundles",
        "completed",
        "expired / failed",
        "failure rate",
        "earnings",
        "settled",
        "last seen",
    ];
    let (prev, next) = page_links("/explorer/providers", p.page, p.more);
    let body = html! {
        (table("providers", &columns, &rows, "no provider has registered"))
        (pager(prev.as_deref(), next.as_deref()))
    };
    layout::page("Providers", "providers", body)
}

/// One provider's page.
pub(crate) fn render_one(p: &ProviderDetail) -> Markup {
    let s = &p.summary;
    let asks: Vec<u64> = p.bundles.iter().map(|b| b.bundle.price_wei_per_s).collect();
    let asks_text = match (asks.iter().min(), asks.iter().max()) {
        (Some(lo), Some(hi)) if lo == hi => format!("{lo} wei per compute-second"),
        (Some(lo), Some(hi)) => format!("{lo} – {hi} wei per compute-second"),
        _ => "no bundles".to_owned(),
    };
    let stake = if !p.stakes.is_empty() {
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
    };
    let misses = &p.residency_misses;
    let mut bundles = Vec::with_capacity(p.bundles.len());
    let mut residency = Vec::with_capacity(p.bundles.len());
    for b in &p.bundles {
        let x = &b.bundle;
        let tiers = serde_json::to_value(x.tiers)
            .map(|v| v.to_string())
            .unwrap_or_default();
        let classes = serde_json::to_value(x.determinism)
            .map(|v| v.to_string())
            .unwrap_or_default();
        bundles.push(html! {
            tr id={ "bundle-" (id_token(&x.id)) } {
                td { (x.id) }
                td { (x.device) }
                td { span.ask { (x.price_wei_per_s) } }
                td { (x.memory_bytes) }
                td { (num(x.bandwidth_bps)) }
                td { (num(x.rtt_s)) }
                td { (x.context_max) }
                td { (code(&tiers)) }
                td { (code(&classes)) }
                td { (num(x.failure_rate)) }
                td { (if b.live { "yes" } else { "no (silent)" }) }
            }
        });
        residency.push(html! {
            tr {
                td { (x.id) }
                td {
                    @if x.resident_bases.is_empty() {
                        "none"
                    } @else {
                        (x.resident_bases.join(", "))
                    }
                }
                td {
                    (x.resident_adapters.len())
                    @if !x.resident_adapters.is_empty() {
                        ": "
                        @for (i, a) in x.resident_adapters.iter().take(20).enumerate() {
                            @if i > 0 { ", " }
                            (short(a))
                        }
                        @if x.resident_adapters.len() > 20 { " …" }
                    }
                }
            }
        });
    }
    let bundle_columns = [
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
    ];
    let body = html! {
        dl #summary {
            dt { "key hash" } dd #key-hash { (code(&s.key_hash)) }
            dt { "operator" } dd #operator { (s.operator) }
            dt { "payout account" } dd #payout { (account_link(&s.payout)) }
            dt { "stake" } dd #stake { (stake) }
            dt { "asks" } dd #asks { (asks_text) }
            dt { "slot shadow price" }
            dd #shadow-price {
                @match p.slot_shadow_price {
                    Some(price) => (num(price)),
                    None => "not reported",
                }
            }
            dt { "observed failure rate" }
            dd #failure-rate {
                (rate(s.failure_rate)) " (" (s.completed) " completed, " (s.failed)
                " expired or failed, " (s.open) " open)"
            }
            dt { "residency misses" }
            dd #residency-misses {
                (misses.deadline + misses.fetched) " of " (misses.claims) " jobs cleared on a \
                 residency claim (" (misses.deadline) " missed the deadline, " (misses.fetched)
                " fetched the adapter it claimed)"
            }
            dt { "earnings (receipts)" } dd #earnings { (wei(&s.earnings_wei)) }
            dt { "of which settled on chain" } dd #settled { (wei(&s.settled_wei)) }
            dt { "registered" } dd { (time_ms(s.registered_at_ms)) }
            dt { "last seen" } dd { (time_ms(s.seen_at_ms)) }
        }
        p {
            a id="provider-jobs" href={ "/explorer/jobs?provider=" (s.key_hash) } {
                "this provider's jobs"
            }
        }
        (section("bundles", "Bundles and asks", table("bundles", &bundle_columns, &bundles, "no bundles")))
        (section(
            "residency",
            "Residency (what each bundle holds in accelerator memory)",
            table(
                "residency",
                &["bundle", "resident bases", "resident adapters"],
                &residency,
                "no bundles",
            ),
        ))
    };
    layout::page(&format!("Provider {}", s.operator), "providers", body)
}
