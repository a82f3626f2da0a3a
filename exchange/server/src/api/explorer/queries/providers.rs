//! Providers: who registered, their bundles (asks and what each holds resident), how their jobs
//! went (completed against expired or failed) and what their receipts earned.

use super::{hex0x, json, ms};
use crate::api::explorer::params::Paging;
use crate::error::Result;
use alloy::primitives::B256;
use cx_protocol::Bundle;
use serde::Serialize;
use sqlx::PgPool;

/// One provider's row.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProviderSummary {
    /// SHA-256 of its ML-DSA-65 key (its id).
    pub(crate) key_hash: String,
    /// Its operator.
    pub(crate) operator: String,
    /// The account its receipts pay.
    pub(crate) payout: String,
    /// When it first registered, unix ms.
    pub(crate) registered_at_ms: i64,
    /// When it last re-registered, unix ms.
    pub(crate) seen_at_ms: i64,
    /// Bundles its latest offer registered (not those it withdrew).
    pub(crate) bundles: i64,
    /// Its jobs that ended with a receipt.
    pub(crate) completed: i64,
    /// Its jobs that expired or failed.
    pub(crate) failed: i64,
    /// Its jobs still assigned or running.
    pub(crate) open: i64,
    /// failed / (completed + failed); none before any job ended.
    pub(crate) failure_rate: Option<f64>,
    /// What its receipts charged in all, wei.
    pub(crate) earnings_wei: String,
    /// Of which in batches posted on chain, wei.
    pub(crate) settled_wei: String,
}

/// A provider's page.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ProviderDetail {
    /// The row the list shows.
    #[serde(flatten)]
    pub(crate) summary: ProviderSummary,
    /// Its stake in each chain's ProviderRegistry, read now (chains that answered).
    pub(crate) stakes: Vec<StakeView>,
    /// A stake its offer states, if it states one.
    pub(crate) stake_wei: Option<String>,
    /// The shadow price of a residency slot it last reported (from its offer).
    pub(crate) slot_shadow_price: Option<f64>,
    /// Its bundles as registered, with whether the engine holds each live now.
    pub(crate) bundles: Vec<BundleView>,
    /// Residency claims of its that the work revealed false (SPEC §8).
    pub(crate) residency_misses: crate::books::ResidencyMisses,
}

/// What a provider has at stake on one chain.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StakeView {
    /// The chain.
    pub(crate) chain_id: u64,
    /// Its stake there, wei.
    pub(crate) staked_wei: String,
}

/// A bundle and whether it is live.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BundleView {
    /// The bundle as registered (ask, memory, link, resident bases and adapters, …).
    #[serde(flatten)]
    pub(crate) bundle: Bundle,
    /// In the matching engine now (its provider has not gone silent).
    pub(crate) live: bool,
}

#[derive(sqlx::FromRow)]
struct Row {
    key_hash: Vec<u8>,
    operator: String,
    payout: Vec<u8>,
    registered_ms: i64,
    seen_ms: i64,
    bundles: i64,
    completed: i64,
    failed: i64,
    open: i64,
    earnings: String,
    settled: String,
}

const SELECT: &str = concat!(
    "SELECT p.key_hash, p.operator, p.payout, ",
    ms!("p.registered_at"),
    " AS registered_ms, ",
    ms!("p.seen_at"),
    " AS seen_ms, \
     (SELECT count(*) FROM exchange_bundles b \
      WHERE b.provider_key_hash = p.key_hash AND b.withdrawal IS NULL) AS bundles, \
     coalesce(js.completed, 0) AS completed, coalesce(js.failed, 0) AS failed, \
     coalesce(js.open, 0) AS open, \
     (SELECT coalesce(sum(r.amount_owed_wei), 0)::text FROM exchange_receipts r \
      WHERE r.provider_key_hash = p.key_hash) AS earnings, \
     (SELECT coalesce(sum(r.amount_owed_wei), 0)::text FROM exchange_receipts r \
      JOIN settlement_receipts sr ON sr.job_id = r.job_id \
      JOIN settlement_batch_parts bp ON bp.batch_id = sr.batch_id AND bp.chain_id = sr.chain_id \
      WHERE r.provider_key_hash = p.key_hash AND bp.status = 'posted') AS settled \
     FROM exchange_providers p \
     LEFT JOIN LATERAL ( \
         SELECT count(*) FILTER (WHERE EXISTS (SELECT 1 FROM exchange_receipts r \
                                               WHERE r.job_id = j.id)) AS completed, \
                count(*) FILTER (WHERE j.status IN ('expired', 'failed')) AS failed, \
                count(*) FILTER (WHERE j.status IN ('assigned', 'running')) AS open \
         FROM exchange_jobs j JOIN exchange_bundles b ON b.id = j.bundle_id \
         WHERE b.provider_key_hash = p.key_hash) js ON true"
);

impl From<Row> for ProviderSummary {
    fn from(r: Row) -> Self {
        let ended = r.completed + r.failed;
        Self {
            key_hash: hex0x(&r.key_hash),
            operator: r.operator,
            payout: hex0x(&r.payout),
            registered_at_ms: r.registered_ms,
            seen_at_ms: r.seen_ms,
            bundles: r.bundles,
            completed: r.completed,
            failed: r.failed,
            open: r.open,
            failure_rate: (ended > 0).then(|| r.failed as f64 / ended as f64),
            earnings_wei: r.earnings,
            settled_wei: r.settled,
        }
    }
}

/// A page of providers, most recently registered first.
pub(crate) async fn list(pool: &PgPool, paging: Paging) -> Result<(Vec<ProviderSummary>, bool)> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "{SELECT} ORDER BY p.registered_at DESC, p.key_hash LIMIT $1 OFFSET $2"
    ))
    .bind(i64::from(paging.limit) + 1)
    .bind(i64::from(paging.page - 1) * i64::from(paging.limit))
    .fetch_all(pool)
    .await?;
    let more = rows.len() > paging.limit as usize;
    Ok((
        rows.into_iter()
            .take(paging.limit as usize)
            .map(ProviderSummary::from)
            .collect(),
        more,
    ))
}

/// Provider `key_hash`, or `None`; `live` says which bundle ids the engine holds now.
pub(crate) async fn detail(
    pool: &PgPool,
    key_hash: B256,
    live: impl Fn(&str) -> bool,
) -> Result<Option<ProviderDetail>> {
    let row: Option<Row> = sqlx::query_as(&format!("{SELECT} WHERE p.key_hash = $1"))
        .bind(key_hash.as_slice())
        .fetch_optional(pool)
        .await?;
    let Some(row) = row else { return Ok(None) };
    let offer: (String,) =
        sqlx::query_as("SELECT offer::text FROM exchange_providers WHERE key_hash = $1")
            .bind(key_hash.as_slice())
            .fetch_one(pool)
            .await?;
    let offer = json(&offer.0)?;
    let bodies: Vec<(String,)> = sqlx::query_as(
        "SELECT body::text FROM exchange_bundles WHERE provider_key_hash = $1 ORDER BY id LIMIT 500",
    )
    .bind(key_hash.as_slice())
    .fetch_all(pool)
    .await?;
    let bundles = bodies
        .into_iter()
        .filter_map(|(b,)| serde_json::from_str::<Bundle>(&b).ok())
        .map(|bundle| BundleView {
            live: live(&bundle.id),
            bundle,
        })
        .collect();
    Ok(Some(ProviderDetail {
        summary: row.into(),
        stakes: Vec::new(),
        stake_wei: find(&offer, &["stake_wei", "stake"]).and_then(super::amount_text),
        slot_shadow_price: find(&offer, &["slot_shadow_price", "shadow_price"])
            .or_else(|| {
                offer
                    .get("offer")
                    .and_then(|o| o.get("residency"))
                    .and_then(|r| r.get("slot_shadow_price"))
            })
            .and_then(|v| v.as_f64()),
        bundles,
        residency_misses: crate::books::ResidencyMisses::default(),
    }))
}

/// The first of `keys` in the signed offer or the offer inside it.
fn find<'a>(offer: &'a serde_json::Value, keys: &[&str]) -> Option<&'a serde_json::Value> {
    [Some(offer), offer.get("offer")]
        .into_iter()
        .flatten()
        .find_map(|o| keys.iter().find_map(|k| o.get(*k)))
        .filter(|v| !v.is_null())
}
