//! `--ask-follow`: the provider's asks track its market's quote (SPEC §10) instead of staying
//! where the operator set them.
//!
//! Every [`EVERY`] the provider reads the exchange's open quotes (`GET /v1/market`) and sets the
//! model's ask to its market's ask — the quote of the lowest tier the model's bundle offers —
//! times `1 + margin`, and each tier priced apart to that tier's quote likewise; always within
//! `[floor, cap]`: the floor is the ask the operator started with (`--ask-wei-per-s`, the price
//! below which serving does not pay), the cap bounds what a surge can do to the provider's
//! price. A negative margin undercuts the quote, so the bundle stays eligible for market orders
//! (a bundle asking more than a market order's quote cannot take it). An ask moves only when it
//! changes by more than [`DEADBAND`]: every change re-signs and re-registers the offer.
//!
//! The quote is referenced to the fleet's median ask, so followers feed back into it: in calm
//! markets their asks drift down toward their floors, in surges up toward their caps. The floor
//! and the cap are what keep that loop bounded.

use std::sync::Arc;
use std::time::Duration;

use cx_protocol::Tier;
use serde::Deserialize;

use super::Link;
use crate::error::Result;

/// How often the quotes are read.
pub const EVERY: Duration = Duration::from_secs(5);

/// Relative change below which an ask is left as it is.
pub const DEADBAND: f64 = 0.01;

/// How an ask follows the quote.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Follow {
    /// Added to the quote's ask, basis points of it (negative: under the quote).
    pub margin_bps: i32,
    /// The least the ask may be, wei per compute-second.
    pub floor_wei_per_s: u64,
    /// The most the ask may be, wei per compute-second.
    pub cap_wei_per_s: u64,
}

impl Follow {
    /// The ask for a market whose quote asks `quote_ask_wei_per_s`: the quote plus the margin,
    /// rounded down, within `[floor, cap]`.
    pub fn ask_for(&self, quote_ask_wei_per_s: u64) -> u64 {
        let scaled =
            i128::from(quote_ask_wei_per_s) * (10_000 + i128::from(self.margin_bps)) / 10_000;
        let floor = self.floor_wei_per_s.max(1);
        let cap = self.cap_wei_per_s.max(floor);
        u64::try_from(scaled.max(0))
            .unwrap_or(u64::MAX)
            .clamp(floor, cap)
    }

    /// Whether moving an ask from `current` to `next` is worth an offer.
    pub fn moves(current: u64, next: u64) -> bool {
        current == 0 || (next as f64 - current as f64).abs() / current as f64 > DEADBAND
    }
}

/// One market's quote as `GET /v1/market` lists it (only what following needs).
#[derive(Debug, Deserialize)]
struct Quote {
    model: String,
    tier: Tier,
    #[serde(with = "cx_protocol::price::rate_string")]
    ask_wei_per_s: u64,
}

/// Follows the quotes until the process ends.
pub(super) async fn run(link: Arc<Link>, follow: Follow) {
    loop {
        tokio::time::sleep(EVERY).await;
        if let Err(e) = once(&link, &follow).await {
            tracing::warn!("following the market's quote failed (retrying): {e}");
        }
    }
}

async fn once(link: &Link, follow: &Follow) -> Result<()> {
    let quotes: Vec<Quote> = link
        .https
        .get("/v1/market", Duration::from_secs(20))
        .await?;
    let model = &link.config.model_name;
    let quote_of = |tier: Tier| {
        quotes
            .iter()
            .find(|q| &q.model == model && q.tier == tier)
            .map(|q| q.ask_wei_per_s)
    };
    let ask = link.ask();
    let apart = ask.tiers();
    for (tier, current) in &apart {
        if let Some(quoted) = quote_of(*tier) {
            let next = follow.ask_for(quoted);
            if Follow::moves(*current, next) {
                tracing::info!(
                    ?tier,
                    from = current,
                    to = next,
                    quoted,
                    "ask follows the quote"
                );
                ask.set(next, Some(*tier))?;
            }
        }
    }
    // The model's own bundle: its lowest tier's market.
    let lowest = link
        .bundle()
        .tiers
        .iter()
        .filter(|t| !apart.iter().any(|(a, _)| a == t))
        .min();
    if let Some(quoted) = lowest.and_then(quote_of) {
        let (current, next) = (ask.get(), follow.ask_for(quoted));
        if Follow::moves(current, next) {
            tracing::info!(from = current, to = next, quoted, "ask follows the quote");
            ask.set(next, None)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ask_is_the_quote_plus_the_margin_within_floor_and_cap() {
        let f = Follow {
            margin_bps: -200,
            floor_wei_per_s: 900_000,
            cap_wei_per_s: 4_000_000,
        };
        assert_eq!(f.ask_for(1_000_000), 980_000);
        assert_eq!(f.ask_for(500_000), 900_000, "never under the floor");
        assert_eq!(f.ask_for(10_000_000), 4_000_000, "never over the cap");
        let above = Follow {
            margin_bps: 500,
            ..f
        };
        assert_eq!(above.ask_for(1_000_000), 1_050_000);
        assert_eq!(above.ask_for(u64::MAX), 4_000_000);
        assert!(Follow::moves(1_000_000, 1_020_000));
        assert!(!Follow::moves(1_000_000, 1_005_000));
    }
}
