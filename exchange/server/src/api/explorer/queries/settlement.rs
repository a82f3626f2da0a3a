//! Settlement batches as the coordinator's outbox records them: parts per chain (nonce, status,
//! transaction hash), the steps it took, and the receipts (jobs) each batch settles.

use super::{hex0x, hex0x_opt, ms};
use crate::api::explorer::params::{Before, Paging};
use crate::error::Result;
use serde::Serialize;
use sqlx::PgPool;

/// One chain's part of a batch.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Part {
    /// The batch.
    pub(crate) batch_id: i64,
    /// The chain.
    pub(crate) chain_id: i64,
    /// The batch nonce on that chain's Settlement contract.
    pub(crate) nonce: i64,
    /// `created`, `signed` or `posted`.
    pub(crate) status: String,
    /// The FROST message (32 bytes).
    pub(crate) digest: String,
    /// The transaction that posted it, once posted (none: it was found on chain already).
    pub(crate) tx_hash: Option<String>,
    /// The transaction on the chain's block explorer (EIP-3091), where one is configured.
    pub(crate) tx_url: Option<String>,
    /// Receipts in this part.
    pub(crate) receipts: i64,
    /// Gas the posting transaction used, where the coordinator recorded it.
    pub(crate) gas_used: Option<u64>,
    /// Last change, unix ms.
    pub(crate) updated_at_ms: i64,
}

/// One step the coordinator took with a batch.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Step {
    /// The chain (none: the whole batch).
    pub(crate) chain_id: Option<i64>,
    /// `built`, `signed`, `posted`, `refused`, `waiting`, `replaced`, `abandoned`, …
    pub(crate) step: String,
    /// What it says.
    pub(crate) detail: String,
    /// When, unix ms.
    pub(crate) at_ms: i64,
}

/// A batch with its parts.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BatchSummary {
    /// The batch id.
    pub(crate) id: i64,
    /// When it was built, unix ms.
    pub(crate) created_at_ms: i64,
    /// Receipts (jobs) it settles.
    pub(crate) size: i64,
    /// `posted` when every part is, else the least advanced part's status.
    pub(crate) status: String,
    /// Its parts, by chain.
    pub(crate) parts: Vec<Part>,
    /// Gas of all parts, if every posted part's was recorded.
    pub(crate) gas_used: Option<u64>,
}

/// A batch with its steps, signers and jobs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BatchDetail {
    /// Size, status, parts, gas.
    #[serde(flatten)]
    pub(crate) summary: BatchSummary,
    /// Gas per job, if the gas was recorded.
    pub(crate) gas_per_job: Option<u64>,
    /// The signers whose shares made its signatures, where the steps name them.
    pub(crate) signers: Vec<String>,
    /// Every step.
    pub(crate) steps: Vec<Step>,
    /// The jobs it settles (at most [`BATCH_JOBS_SHOWN`]).
    pub(crate) jobs: Vec<BatchJob>,
}

/// A job a batch settles.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BatchJob {
    /// The job.
    pub(crate) job_id: String,
    /// Its chain.
    pub(crate) chain_id: i64,
    /// Its tab.
    pub(crate) escrow_id: i64,
    /// What its receipt charged, wei.
    pub(crate) amount_owed_wei: Option<String>,
}

/// Jobs a batch page lists at most.
pub(crate) const BATCH_JOBS_SHOWN: i64 = 1000;

#[derive(sqlx::FromRow)]
struct PartRow {
    batch_id: i64,
    chain_id: i64,
    nonce: i64,
    status: String,
    digest: Vec<u8>,
    tx_hash: Option<Vec<u8>>,
    receipts: Option<i32>,
    gas_used: Option<String>,
    updated_ms: i64,
}

/// The parts of `batch_ids`, by batch then chain.
pub(crate) async fn parts(pool: &PgPool, batch_ids: &[i64]) -> Result<Vec<Part>> {
    let rows: Vec<PartRow> = sqlx::query_as(concat!(
        "SELECT batch_id, chain_id, nonce, status, digest, tx_hash, \
                jsonb_array_length(CASE WHEN jsonb_typeof(body->'receipts') = 'array' \
                                   THEN body->'receipts' ELSE '[]'::jsonb END) AS receipts, \
                coalesce(body->>'gas_used', body->>'gas') AS gas_used, ",
        ms!("updated_at"),
        " AS updated_ms FROM settlement_batch_parts WHERE batch_id = ANY($1) \
         ORDER BY batch_id DESC, chain_id LIMIT 1000"
    ))
    .bind(batch_ids)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|r| Part {
            batch_id: r.batch_id,
            chain_id: r.chain_id,
            nonce: r.nonce,
            status: r.status,
            digest: hex0x(&r.digest),
            tx_hash: hex0x_opt(r.tx_hash.as_ref()),
            tx_url: None,
            receipts: i64::from(r.receipts.unwrap_or(0)),
            gas_used: r.gas_used.and_then(|g| g.parse().ok()),
            updated_at_ms: r.updated_ms,
        })
        .collect())
}

/// The steps of batch `batch_id`, in order (at most 500).
pub(crate) async fn steps(pool: &PgPool, batch_id: i64) -> Result<Vec<Step>> {
    let rows: Vec<(Option<i64>, String, String, i64)> = sqlx::query_as(concat!(
        "SELECT chain_id, step, detail, ",
        ms!("at"),
        " FROM settlement_steps WHERE batch_id = $1 ORDER BY id LIMIT 500"
    ))
    .bind(batch_id)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(chain_id, step, detail, at_ms)| Step {
            chain_id,
            step,
            detail,
            at_ms,
        })
        .collect())
}

/// A page of batches, newest first.
pub(crate) async fn list(
    pool: &PgPool,
    paging: Paging,
    before: Before<i64>,
) -> Result<(Vec<BatchSummary>, bool)> {
    let before = match before {
        Before::Start => None,
        Before::After(id) => Some(id),
    };
    let rows: Vec<(i64, i64, i64)> = sqlx::query_as(concat!(
        "SELECT s.id, ",
        ms!("s.created_at"),
        ", (SELECT count(*) FROM settlement_receipts r WHERE r.batch_id = s.id) \
         FROM settlement_batches s WHERE ($1::bigint IS NULL OR s.id < $1) \
         ORDER BY s.id DESC LIMIT $2 OFFSET $3"
    ))
    .bind(before)
    .bind(i64::from(paging.limit) + 1)
    .bind(i64::from(paging.page - 1) * i64::from(paging.limit))
    .fetch_all(pool)
    .await?;
    let more = rows.len() > paging.limit as usize;
    let rows: Vec<_> = rows.into_iter().take(paging.limit as usize).collect();
    let ids: Vec<i64> = rows.iter().map(|r| r.0).collect();
    let parts = parts(pool, &ids).await?;
    let batches = rows
        .into_iter()
        .map(|(id, created_at_ms, size)| {
            summary(
                id,
                created_at_ms,
                size,
                parts.iter().filter(|p| p.batch_id == id).cloned().collect(),
            )
        })
        .collect();
    Ok((batches, more))
}

fn summary(id: i64, created_at_ms: i64, size: i64, parts: Vec<Part>) -> BatchSummary {
    let rank = |s: &str| match s {
        "created" => 0,
        "signed" => 1,
        "posted" => 2,
        _ => -1,
    };
    let status = parts
        .iter()
        .map(|p| p.status.as_str())
        .min_by_key(|s| rank(s))
        .unwrap_or("empty")
        .to_owned();
    let gas_used = (!parts.is_empty())
        .then(|| parts.iter().map(|p| p.gas_used).sum::<Option<u64>>())
        .flatten();
    BatchSummary {
        id,
        created_at_ms,
        size,
        status,
        parts,
        gas_used,
    }
}

/// Batch `id` with its steps, signers and jobs, or `None`.
pub(crate) async fn detail(pool: &PgPool, id: i64) -> Result<Option<BatchDetail>> {
    let row: Option<(i64, i64)> = sqlx::query_as(concat!(
        "SELECT (SELECT count(*) FROM settlement_receipts r WHERE r.batch_id = s.id), ",
        ms!("s.created_at"),
        " FROM settlement_batches s WHERE s.id = $1"
    ))
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let Some((size, created_at_ms)) = row else {
        return Ok(None);
    };
    let parts = parts(pool, &[id]).await?;
    let steps = steps(pool, id).await?;
    let mut summary = summary(id, created_at_ms, size, parts);
    // A gas figure may also be in the step that posted the part ("… gas 51234 …").
    if summary.gas_used.is_none() && !summary.parts.is_empty() {
        for part in &mut summary.parts {
            if part.gas_used.is_none() {
                part.gas_used = steps
                    .iter()
                    .filter(|s| s.step == "posted" && s.chain_id == Some(part.chain_id))
                    .find_map(|s| gas_in(&s.detail));
            }
        }
        summary.gas_used = summary.parts.iter().map(|p| p.gas_used).sum();
    }
    let jobs: Vec<(Vec<u8>, i64, i64, Option<String>)> = sqlx::query_as(
        "SELECT sr.job_id, sr.chain_id, sr.escrow_id, er.amount_owed_wei::text \
         FROM settlement_receipts sr LEFT JOIN exchange_receipts er ON er.job_id = sr.job_id \
         WHERE sr.batch_id = $1 ORDER BY sr.chain_id, sr.escrow_id, sr.job_id LIMIT $2",
    )
    .bind(id)
    .bind(BATCH_JOBS_SHOWN)
    .fetch_all(pool)
    .await?;
    let gas_per_job = match (summary.gas_used, u64::try_from(size)) {
        (Some(gas), Ok(n)) if n > 0 => Some(gas / n),
        _ => None,
    };
    let mut signers: Vec<String> = Vec::new();
    for s in steps.iter().filter(|s| s.step == "signed") {
        for signer in signers_in(&s.detail) {
            if !signers.contains(&signer) {
                signers.push(signer);
            }
        }
    }
    Ok(Some(BatchDetail {
        summary,
        gas_per_job,
        signers,
        steps,
        jobs: jobs
            .into_iter()
            .map(|(job, chain_id, escrow_id, amount)| BatchJob {
                job_id: hex0x(&job),
                chain_id,
                escrow_id,
                amount_owed_wei: amount,
            })
            .collect(),
    }))
}

/// The number after `gas` (or `gas_used`, `gas used`) in a step's text.
fn gas_in(detail: &str) -> Option<u64> {
    let lower = detail.to_ascii_lowercase();
    let at = lower.find("gas")?;
    let rest = &lower[at + 3..];
    let rest = rest.trim_start_matches(|c: char| !c.is_ascii_digit() && c != ',' && c != ';');
    let digits: String = rest.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

/// The signers a step's text names: the list after `signers` (`signers [1, 3, 4]`,
/// `signers: 1,3,4`, `signers=a b c`), up to the first `]`, `)` or `;`.
pub(crate) fn signers_in(detail: &str) -> Vec<String> {
    let Some(at) = detail.find("signers") else {
        return Vec::new();
    };
    let rest = detail[at + "signers".len()..].trim_start_matches([' ', ':', '=', '[', '(', '{']);
    let end = rest.find([']', ')', '}', ';']).unwrap_or(rest.len());
    rest[..end]
        .split([',', ' '])
        .map(|s| s.trim().trim_matches('"').to_owned())
        .filter(|s| !s.is_empty())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signers_and_gas_are_read_from_step_text() {
        assert_eq!(
            signers_in("digest 0xab, sent with balance changes; signers [1, 3, 4]"),
            ["1", "3", "4"]
        );
        assert_eq!(signers_in("signers: a,b"), ["a", "b"]);
        assert!(signers_in("digest 0xab").is_empty());
        assert_eq!(gas_in("tx 0xab, gas 51234"), Some(51_234));
        assert_eq!(gas_in("gas_used=900"), Some(900));
        assert_eq!(gas_in("tx 0xab"), None);
    }
}
