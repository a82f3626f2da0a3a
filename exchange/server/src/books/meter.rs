//! The meter as the books keep it (SPEC §10): a routed job that ended becomes one row of
//! `exchange_meter`, and the task router reads the rows back by sequence.

use super::store::Books;
use crate::error::Result;
use cx_exchange::meter::MeterRecord;
use cx_exchange::routing::features::FEATURES;
use cx_exchange::routing::utility::PROFILE;

/// Rows a metering pass reads back at most (the router catches up over sweeps).
pub const METER_BATCH: i64 = 10_000;

/// How far behind the last pass's start a pass looks again, milliseconds: a job's terminal
/// change is stamped when its transaction starts and may commit after a pass began.
const METER_OVERLAP_MS: i64 = 60_000;

#[derive(sqlx::FromRow)]
struct MeterRow {
    seq: i64,
    request: String,
    account: Vec<u8>,
    arm: String,
    cost_wei: String,
    latency_s: f64,
    quality: f64,
    deadline_s: f64,
    max_cost_wei: Option<String>,
    tier: String,
    belief: serde_json::Value,
    features: Option<serde_json::Value>,
    profile: Option<serde_json::Value>,
}

/// One meter row: the record, and the request's x and the arm's p it was routed on (absent
/// or unreadable: `None`).
#[derive(Debug, Clone, PartialEq)]
pub struct Metered {
    /// Its sequence.
    pub seq: i64,
    /// What the arm did.
    pub record: MeterRecord,
    /// x.
    pub features: Option<[f64; FEATURES]>,
    /// p.
    pub profile: Option<[f64; PROFILE]>,
}

impl MeterRow {
    /// The record, or `None` for a row that does not read as one (skipped, not fatal: the
    /// router learns from the rest).
    fn metered(self) -> Option<Metered> {
        let account = alloy::primitives::Address::try_from(self.account.as_slice()).ok()?;
        Some(Metered {
            seq: self.seq,
            features: self.features.and_then(|v| serde_json::from_value(v).ok()),
            profile: self.profile.and_then(|v| serde_json::from_value(v).ok()),
            record: MeterRecord {
                request: u64::from_str_radix(&self.request, 16).ok()?,
                tenant: account.to_string(),
                arm: self.arm,
                cost_wei: self.cost_wei.parse().ok()?,
                latency_s: self.latency_s,
                quality: self.quality,
                deadline_s: self.deadline_s,
                max_cost_wei: match self.max_cost_wei {
                    None => None,
                    Some(w) => Some(w.parse().ok()?),
                },
                tier: serde_json::from_value(serde_json::Value::String(self.tier)).ok()?,
                belief: serde_json::from_value(self.belief).ok()?,
            },
        })
    }
}

impl Books {
    /// Meters the routed jobs (a decision with a `route`; verification runs are not requests)
    /// that ended — done (charged what they hold, quality 1), or expired, refunded, failed or
    /// cancelled (nothing charged, quality 0: the buyer got no answer from that arm) — and
    /// changed since `since_ms` (unix milliseconds, the value the previous pass returned; 0 the
    /// first time). Latency is from the order to its end. A job is metered once; a route that
    /// lacks the arm, the request or the belief is skipped (it would stop every pass). Returns
    /// how many were metered and the `since_ms` of the next pass.
    pub async fn meter_ended(&self, since_ms: i64) -> Result<(u64, i64)> {
        let mut tx = self.pool.begin().await?;
        let started_ms: i64 =
            sqlx::query_scalar("SELECT (extract(epoch FROM now()) * 1000)::bigint")
                .fetch_one(&mut *tx)
                .await?;
        let metered = sqlx::query(
            "INSERT INTO exchange_meter (job_id, request, account, arm, cost_wei, latency_s, \
                 quality, deadline_s, max_cost_wei, tier, belief, features, profile) \
             SELECT j.id, j.decision->'route'->>'request', j.account, \
                    j.decision->'route'->>'arm', \
                    CASE WHEN j.status = 'done' THEN j.held_wei ELSE 0 END, \
                    greatest(extract(epoch FROM j.updated_at - j.created_at), 0)::float8, \
                    CASE WHEN j.status = 'done' THEN 1 ELSE 0 END, \
                    greatest((j.decision->'route'->>'deadline_s')::float8, 0.001), \
                    (j.decision->'route'->>'max_cost_wei')::numeric, \
                    coalesce(j.decision->>'tier', 'T0'), j.decision->'route'->'belief', \
                    j.decision->'route'->'features', j.decision->'route'->'profile' \
             FROM exchange_jobs j \
             WHERE j.verifies IS NULL AND j.decision ? 'route' \
               AND j.decision->'route' ?& array['arm', 'request', 'belief'] \
               AND j.updated_at >= to_timestamp($1::float8 / 1000) \
               AND j.status IN ('done', 'expired', 'refunded', 'failed', 'cancelled') \
             ON CONFLICT (job_id) DO NOTHING",
        )
        .bind(since_ms)
        .execute(&mut *tx)
        .await?
        .rows_affected();
        tx.commit().await?;
        Ok((metered, started_ms.saturating_sub(METER_OVERLAP_MS).max(0)))
    }

    /// Routed jobs not ended yet (assigned, running, verifying), counted per arm: outcomes on
    /// their way to the meter.
    pub async fn open_routes(&self) -> Result<Vec<(String, i64)>> {
        Ok(sqlx::query_as(
            "SELECT decision->'route'->>'arm' AS arm, count(*) FROM exchange_jobs \
             WHERE verifies IS NULL AND decision ? 'route' \
               AND status IN ('assigned', 'running', 'verifying') \
             GROUP BY 1",
        )
        .fetch_all(&self.pool)
        .await?)
    }

    /// Meter rows after sequence `after`, oldest first, at most [`METER_BATCH`].
    pub async fn meter_since(&self, after: i64) -> Result<Vec<Metered>> {
        let rows: Vec<MeterRow> = sqlx::query_as(
            "SELECT seq, request, account, arm, cost_wei::text AS cost_wei, latency_s, quality, \
                    deadline_s, max_cost_wei::text AS max_cost_wei, tier, belief, features, profile \
             FROM exchange_meter WHERE seq > $1 ORDER BY seq LIMIT $2",
        )
        .bind(after)
        .bind(METER_BATCH)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().filter_map(MeterRow::metered).collect())
    }
}
