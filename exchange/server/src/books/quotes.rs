//! The market maker's quotes over time: sampled by the sweep ([`crate::sweeps::run_sweeps`])
//! so the explorer can chart bid, ask and regime per market; pruned to [`QUOTE_HISTORY_S`].

use super::store::Books;
use crate::error::Result;
use cx_exchange::pricing::hmm::Regime;
use cx_protocol::Tier;
use serde::Serialize;

/// One market's open quote, as `GET /v1/market` shows it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct MarketQuote {
    /// The catalog model (the market's class).
    pub model: String,
    /// The verification tier.
    pub tier: Tier,
    /// What the exchange pays a provider, wei per compute-second (the open quote: no deadline
    /// pressure).
    #[serde(with = "cx_protocol::price::rate_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,19}$")]
    pub bid_wei_per_s: u64,
    /// What a buyer pays, wei per compute-second; a bundle asking more is not eligible.
    #[serde(with = "cx_protocol::price::rate_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,19}$")]
    pub ask_wei_per_s: u64,
    /// The regime the quote was made in: `calm`, `busy` or `surge`.
    #[schema(value_type = String)]
    pub regime: Regime,
    /// The regime belief (calm, busy, surge).
    pub belief: [f64; 3],
    /// Load reports folded in so far.
    pub observations: u64,
    /// The reference the market opened at: the median ask of the live bundles, wei per
    /// compute-second.
    #[serde(with = "cx_protocol::price::rate_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,19}$")]
    pub reference_wei_per_s: u64,
}

/// How long sampled quotes are kept, seconds (a day).
pub const QUOTE_HISTORY_S: u64 = 86_400;

/// One sampled quote.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct QuotePoint {
    /// The catalog model.
    pub model: String,
    /// The tier, as `T0`…`T3`.
    pub tier: String,
    /// When it was sampled, unix ms.
    pub at_ms: i64,
    /// What the exchange paid a provider, wei per compute-second.
    pub bid_wei_per_s: u64,
    /// What a buyer paid, wei per compute-second.
    pub ask_wei_per_s: u64,
    /// `calm`, `busy` or `surge`.
    pub regime: String,
}

impl Books {
    /// Stores one sample of every market's open quote, and forgets samples older than
    /// [`QUOTE_HISTORY_S`] (one transaction).
    pub async fn record_quotes(&self, quotes: &[MarketQuote]) -> Result<()> {
        let mut tx = self.pool.begin().await?;
        for q in quotes {
            let regime = serde_json::to_value(q.regime)?
                .as_str()
                .unwrap_or_default()
                .to_owned();
            sqlx::query(
                "INSERT INTO exchange_quotes (model, tier, bid_wei_per_s, ask_wei_per_s, regime) \
                 VALUES ($1, $2, $3::numeric, $4::numeric, $5) ON CONFLICT DO NOTHING",
            )
            .bind(&q.model)
            .bind(format!("{:?}", q.tier))
            .bind(q.bid_wei_per_s.to_string())
            .bind(q.ask_wei_per_s.to_string())
            .bind(regime)
            .execute(&mut *tx)
            .await?;
        }
        sqlx::query("DELETE FROM exchange_quotes WHERE at < now() - make_interval(secs => $1)")
            .bind(QUOTE_HISTORY_S as f64)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// The newest `limit` samples, oldest first.
    pub async fn quote_history(&self, limit: i64) -> Result<Vec<QuotePoint>> {
        let rows: Vec<(String, String, i64, String, String, String)> = sqlx::query_as(
            "SELECT model, tier, (extract(epoch FROM at) * 1000)::bigint, \
                    bid_wei_per_s::text, ask_wei_per_s::text, regime \
             FROM exchange_quotes ORDER BY at DESC LIMIT $1",
        )
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        let rate = |text: String| {
            text.parse::<u64>()
                .map_err(|_| crate::error::Error::Corrupt {
                    what: "a quoted rate",
                    value: text,
                })
        };
        rows.into_iter()
            .rev()
            .map(|(model, tier, at_ms, bid, ask, regime)| {
                Ok(QuotePoint {
                    model,
                    tier,
                    at_ms,
                    bid_wei_per_s: rate(bid)?,
                    ask_wei_per_s: rate(ask)?,
                    regime,
                })
            })
            .collect()
    }
}
