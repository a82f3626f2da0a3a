//! `/explorer/markets`: the market maker's open quote in every market (model × tier: bid, ask,
//! regime and its belief), its quotes over time (bid and ask per market, with the regimes they
//! were made in) and the prices jobs paid, as SVG charts.

use crate::api::explorer::format::{id_token, num, query_value, time_ms};
use crate::api::explorer::html::{badge, link, section, table};
use crate::api::explorer::layout;
use crate::api::explorer::queries::markets::PricePoint;
use crate::api::explorer::svg::{self, Series};
use crate::books::MarketQuote;
use crate::books::QuotePoint;
use maud::{Markup, html};
use serde::Serialize;
use std::collections::BTreeMap;

/// The markets page's data.
#[derive(Debug, Serialize)]
pub(crate) struct MarketsPage {
    /// Every open market's quote now.
    pub(crate) quotes: Vec<MarketQuote>,
    /// The sampled quotes, oldest first.
    pub(crate) quote_history: Vec<QuotePoint>,
    /// The newest jobs' prices, oldest first.
    pub(crate) history: Vec<PricePoint>,
}

/// The page.
pub(crate) fn render(p: &MarketsPage) -> Markup {
    let quotes: Vec<Markup> = p
        .quotes
        .iter()
        .map(|q| {
            let tier = format!("{:?}", q.tier);
            let regime = serde_json::to_value(q.regime)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let belief = q
                .belief
                .iter()
                .map(|b| format!("{b:.2}"))
                .collect::<Vec<_>>()
                .join(" / ");
            let jobs = format!(
                "/explorer/jobs?model={}&tier={}",
                query_value(&q.model),
                query_value(&tier)
            );
            html! {
                tr id={ "quote-" (id_token(&q.model)) "-" (id_token(&tier)) } {
                    td { (link(&jobs, &q.model)) }
                    td { (tier) }
                    td { span.bid { (q.bid_wei_per_s) } }
                    td { span.ask { (q.ask_wei_per_s) } }
                    td { (badge(&regime)) }
                    td { (belief) }
                    td { (q.observations) }
                    td { (q.reference_wei_per_s) }
                }
            }
        })
        .collect();
    let columns = [
        "model",
        "tier",
        "bid (wei/s)",
        "ask (wei/s)",
        "regime",
        "belief calm / busy / surge",
        "load reports",
        "reference (wei/s)",
    ];
    let mut by_market: BTreeMap<(String, String), Vec<(i64, f64)>> = BTreeMap::new();
    for point in &p.history {
        if let Ok(price) = point.price_wei.parse::<f64>() {
            by_market
                .entry((point.model.clone(), point.tier.clone()))
                .or_default()
                .push((point.at_ms, price));
        }
    }
    let series: Vec<Series> = by_market
        .into_iter()
        .map(|((model, tier), points)| Series {
            label: format!("{model} {tier}"),
            points,
        })
        .collect();
    let body = html! {
        (table("quotes", &columns, &quotes, "no open markets: no provider bundle is registered"))
        p.note {
            "Open quotes with no deadline pressure; a job's quote is modulated by its deadline \
             and tier. Bid < ask always."
        }
        (section("quote-history", "Quotes over time", quote_chart(&p.quote_history)))
        (section("price-history", "Price over time", html! {
            (svg::line_chart(
                "price-chart",
                "wei per job",
                &series,
                "no prices yet: the chart draws the jobs' prices once there are jobs",
            ))
            p.note {
                "What each of the latest " (p.history.len()) " jobs paid (its receipt's amount, \
                 or what it holds while unfinished), by model × tier; mean "
                (num(mean(&p.history))) " wei."
            }
        }))
    };
    layout::page("Markets", "markets", body)
}

/// A market (model, tier) and a side of its quote (`bid` or `ask`).
type Line<'a> = (String, String, &'a str);

/// Bid and ask per market over time, and when each market's regime changed.
fn quote_chart(points: &[QuotePoint]) -> Markup {
    let mut lines: BTreeMap<Line, Vec<(i64, f64)>> = BTreeMap::new();
    let mut regimes: BTreeMap<(String, String), Vec<(i64, &str)>> = BTreeMap::new();
    for q in points {
        let market = (q.model.clone(), q.tier.clone());
        for (side, rate) in [("bid", q.bid_wei_per_s), ("ask", q.ask_wei_per_s)] {
            lines
                .entry((market.0.clone(), market.1.clone(), side))
                .or_default()
                .push((q.at_ms, rate as f64));
        }
        let changes = regimes.entry(market).or_default();
        if changes.last().is_none_or(|(_, r)| *r != q.regime) {
            changes.push((q.at_ms, &q.regime));
        }
    }
    let series: Vec<Series> = lines
        .into_iter()
        .map(|((model, tier, side), points)| Series {
            label: format!("{model} {tier} {side}"),
            points,
        })
        .collect();
    let rows: Vec<Markup> = regimes
        .iter()
        .flat_map(|((model, tier), changes)| {
            changes.iter().map(move |(at_ms, regime)| {
                html! {
                    tr {
                        td { (model) }
                        td { (tier) }
                        td { (badge(regime)) }
                        td { (time_ms(*at_ms)) }
                    }
                }
            })
        })
        .collect();
    html! {
        (svg::line_chart(
            "quote-chart",
            "wei per compute-second",
            &series,
            "no quotes yet: the exchange samples every market's quote while providers are registered",
        ))
        (table("regimes", &["model", "tier", "regime", "since"], &rows, "no quotes sampled yet"))
        p.note {
            "The open quote of every market, sampled every few seconds (" (points.len())
            " samples kept, the last day at most)."
        }
    }
}

fn mean(points: &[PricePoint]) -> f64 {
    let prices: Vec<f64> = points
        .iter()
        .filter_map(|p| p.price_wei.parse::<f64>().ok())
        .collect();
    if prices.is_empty() {
        0.0
    } else {
        prices.iter().sum::<f64>() / prices.len() as f64
    }
}
