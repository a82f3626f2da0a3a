//! Standing orders (reserves, rents, searches): accepted with their hold on the tab in one
//! statement, as intents are, and swept when they end unfilled.

use super::jobs::NewOrder;
use super::store::constraint;
use super::store::{Books, json_text, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use serde::Serialize;

/// A standing order as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StandingOrder {
    /// The order's EIP-712 digest (its id).
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub id: B256,
    /// `reserve`, `rent` or `search`.
    pub kind: String,
    /// The account that signed it.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: Address,
    /// The tab's chain.
    pub chain_id: u64,
    /// The tab.
    pub escrow_id: u64,
    /// `open` (waiting for a provider), `expired` (ended unfilled; hold returned), …
    pub status: String,
    /// What it holds on the tab, wei.
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub held_wei: u128,
    /// When it ends, unix seconds.
    pub ends_s: u64,
    /// The order as signed and received.
    #[schema(value_type = Object)]
    pub order: serde_json::Value,
    /// A reserve's bids, commitment, draws and take-or-pay (absent for other kinds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub reserve: Option<super::fills::ReserveFill>,
    /// A rent's commitment, measured residency and rebate (absent for other kinds).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rent: Option<super::fills::RentFill>,
}

/// The terms of a standing order that the books' statements compare, copied from the signed
/// order into columns when it is accepted (the order itself is kept whole, as received): what a
/// kind declares of itself ([`crate::intake::Standing`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StandingTerms {
    /// When it ends: a reserve's window end, a rent's term end, a search's deadline.
    pub ends_s: u64,
    /// A reserve's window start (a rent's term starts when it is committed).
    pub starts_s: Option<u64>,
    /// A reserve's catalog model.
    pub model: Option<String>,
    /// A reserve's compute, milliseconds.
    pub compute_ms: Option<u64>,
    /// A rent's target, by content id.
    pub target: Option<B256>,
    /// What a rent's target is.
    pub target_kind: Option<cx_protocol::order::RentTarget>,
    /// A rent's SLA tolerance, parts per million.
    pub epsilon_ppm: Option<u32>,
}

impl Books {
    /// Accepts a standing order with its `terms`: the nonce spent, `held_wei` held on its tab
    /// (which must stay open until `needed_until_s`) and the order written, or nothing.
    pub async fn accept_standing(
        &self,
        order: &NewOrder,
        escrow_id: u64,
        held_wei: u128,
        terms: &StandingTerms,
        needed_until_s: u64,
    ) -> Result<()> {
        let optional = |v: Option<u64>, what| v.map(|v| to_i64(v, what)).transpose();
        let done: Result<(i64, i64), sqlx::Error> = sqlx::query_as(
            "WITH hold AS ( \
                 UPDATE exchange_tabs SET jobs = jobs + 1, held_wei = held_wei + $8::numeric, \
                        updated_at = now() \
                 WHERE chain_id = $4 AND escrow_id = $7 AND buyer = $3 AND status = 'open' \
                   AND deadline_s >= $10 AND held_wei + $8::numeric <= amount_wei AND jobs < 400 \
                 RETURNING 1), \
             ord AS ( \
                 INSERT INTO exchange_orders (digest, kind, account, chain_id, nonce, body, \
                                              mldsa_signature) \
                 SELECT $1, $2, $3, $4, $5::numeric, $6::jsonb, $17 WHERE EXISTS (SELECT 1 FROM hold) \
                 RETURNING digest), \
             standing AS ( \
                 INSERT INTO exchange_standing_orders (digest, kind, account, chain_id, escrow_id, \
                                                       held_wei, ends_s, starts_s, model, \
                                                       compute_ms, target, epsilon_ppm, \
                                                       target_kind) \
                 SELECT digest, $2, $3, $4, $7, $8::numeric, $9, $11, $12, $13, $14, $15, $16 \
                 FROM ord RETURNING 1) \
             SELECT (SELECT count(*) FROM hold), (SELECT count(*) FROM standing)",
        )
        .bind(order.digest.as_slice())
        .bind(order.kind)
        .bind(order.account.as_slice())
        .bind(to_i64(order.chain_id, "chain id")?)
        .bind(order.nonce.to_string())
        .bind(json_text(&order.body))
        .bind(to_i64(escrow_id, "escrow id")?)
        .bind(wei_text(held_wei))
        .bind(to_i64(terms.ends_s, "end")?)
        .bind(to_i64(needed_until_s, "deadline")?)
        .bind(optional(terms.starts_s, "start")?)
        .bind(terms.model.as_deref())
        .bind(optional(terms.compute_ms, "compute_ms")?)
        .bind(terms.target.map(|t| hex::encode(t.as_slice())))
        .bind(terms.epsilon_ppm.map(i64::from))
        .bind(terms.target_kind.map(|k| k.as_str()))
        .bind(order.mldsa_signature.as_ref().map(|s| &s[..]))
        .fetch_one(&self.pool)
        .await;
        match done {
            Ok((1, 1)) => Ok(()),
            Ok(_) => Err(self
                .why_not_held(
                    (order.chain_id, escrow_id),
                    order.account,
                    held_wei,
                    needed_until_s,
                )
                .await?),
            Err(err) => Err(match constraint(&err) {
                Some("exchange_orders_nonce_unique") => Error::NonceReused { nonce: order.nonce },
                Some("exchange_orders_pkey") => Error::OrderExists,
                _ => err.into(),
            }),
        }
    }

    /// The standing order `id`.
    pub async fn standing_order(&self, id: B256) -> Result<Option<StandingOrder>> {
        let row: Option<StandingRow> = sqlx::query_as(
            "SELECT s.digest, s.kind, s.account, s.chain_id, s.escrow_id, s.status, \
                    s.held_wei::text AS held_wei, s.ends_s, exchange_order_body(o)::text AS body \
             FROM exchange_standing_orders s JOIN exchange_orders o ON o.digest = s.digest \
             WHERE s.digest = $1",
        )
        .bind(id.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        let Some(mut order) = row.map(StandingRow::into_order).transpose()? else {
            return Ok(None);
        };
        if order.kind == "reserve" {
            order.reserve = Some(self.reserve_fill(id).await?);
        }
        if order.kind == "rent" {
            order.rent = Some(self.rent_fill(id).await?);
        }
        Ok(Some(order))
    }

    /// The standing orders `ids` (as a query returns them), in that order.
    pub(super) async fn standing_orders(&self, ids: Vec<(Vec<u8>,)>) -> Result<Vec<StandingOrder>> {
        let mut out = Vec::with_capacity(ids.len());
        for (id,) in ids {
            let id = B256::try_from(id.as_slice()).map_err(|_| Error::Corrupt {
                what: "an order digest",
                value: hex::encode(&id),
            })?;
            if let Some(order) = self.standing_order(id).await? {
                out.push(order);
            }
        }
        Ok(out)
    }

    /// Expires the open standing orders that ended before `now_s` with no provider filling them:
    /// their holds return to their tabs. Returns how many.
    pub async fn expire_standing(&self, now_s: u64) -> Result<u64> {
        let (count,): (i64,) =
            sqlx::query_as(&release_sql("status = 'open' AND ends_s < $1", "'expired'"))
                .bind(to_i64(now_s, "time")?)
                .fetch_one(&self.pool)
                .await?;
        Ok(count as u64)
    }
}

/// The statement that ends the standing orders matching `condition`, setting `status` (an SQL
/// expression), and returns their holds to their tabs, in one statement: each order is either
/// ended with its hold released or untouched. Its one row counts the orders ended.
pub(super) fn release_sql(condition: &str, status: &str) -> String {
    format!(
        "WITH due AS ( \
             UPDATE exchange_standing_orders SET status = {status}, updated_at = now() \
             WHERE {condition} \
             RETURNING chain_id, escrow_id, held_wei), \
         tabs AS ( \
             UPDATE exchange_tabs t SET held_wei = t.held_wei - d.released, updated_at = now() \
             FROM (SELECT chain_id, escrow_id, sum(held_wei) AS released FROM due \
                   GROUP BY chain_id, escrow_id) d \
             WHERE t.chain_id = d.chain_id AND t.escrow_id = d.escrow_id RETURNING 1) \
         SELECT count(*) FROM due"
    )
}

/// A standing order a provider filled, as its `UPDATE … RETURNING` gave it: what turning it
/// into a paid job of its tab needs.
pub(super) struct Filled<'a> {
    /// The job's id: the order's, or for a rent's later holder one derived from it.
    pub(super) id: B256,
    /// The order's id (its EIP-712 digest).
    pub(super) order: B256,
    /// The buyer.
    pub(super) account: Vec<u8>,
    /// Its tab.
    pub(super) tab: (i64, i64),
    /// What it held.
    pub(super) held_wei: u128,
    /// When it ended (the job's deadline).
    pub(super) ends_s: i64,
    /// The job's model column (`search` for a search).
    pub(super) model: &'a str,
    /// The job's adapter (a rent's), hex.
    pub(super) adapter: Option<&'a str>,
}

impl Filled<'_> {
    /// Charges `charged_wei` (at most what the order held; the rest returns to the tab) and
    /// writes the job (`done`, with `decision`), the provider `key_hash`'s `receipt` and the
    /// job's event, in `tx`. Its job slot on the tab was taken when the order was accepted.
    pub(super) async fn into_job(
        self,
        tx: &mut sqlx::Transaction<'_, sqlx::Postgres>,
        key_hash: B256,
        charged_wei: u128,
        receipt: &serde_json::Value,
        decision: &serde_json::Value,
    ) -> Result<()> {
        if charged_wei > self.held_wei {
            return Err(Error::OverCharged {
                charged_wei,
                price_wei: self.held_wei,
            });
        }
        let (chain_id, escrow_id) = self.tab;
        sqlx::query(
            "UPDATE exchange_tabs SET held_wei = held_wei - $3::numeric, updated_at = now() \
             WHERE chain_id = $1 AND escrow_id = $2",
        )
        .bind(chain_id)
        .bind(escrow_id)
        .bind(wei_text(self.held_wei - charged_wei))
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_jobs (id, order_digest, account, chain_id, escrow_id, model, \
                                        status, held_wei, decision, deadline_s, adapter) \
             VALUES ($1, $10, $2, $3, $4, $8, 'done', $5::numeric, $6::jsonb, $7, $9)",
        )
        .bind(self.id.as_slice())
        .bind(&self.account)
        .bind(chain_id)
        .bind(escrow_id)
        .bind(wei_text(charged_wei))
        .bind(json_text(decision))
        .bind(self.ends_s)
        .bind(self.model)
        .bind(self.adapter)
        .bind(self.order.as_slice())
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_receipts (job_id, provider_key_hash, amount_owed_wei, receipt) \
             VALUES ($1, $2, $3::numeric, $4::jsonb)",
        )
        .bind(self.id.as_slice())
        .bind(key_hash.as_slice())
        .bind(wei_text(charged_wei))
        .bind(json_text(receipt))
        .execute(&mut **tx)
        .await?;
        sqlx::query(
            "INSERT INTO exchange_job_events (job_id, seq, status, detail) \
             VALUES ($1, 0, 'done', $2::jsonb || jsonb_build_object('charged_wei', $3::text, \
                     'provider_key_hash', $4::text))",
        )
        .bind(self.id.as_slice())
        .bind(json_text(decision))
        .bind(charged_wei.to_string())
        .bind(key_hash.to_string())
        .execute(&mut **tx)
        .await?;
        Ok(())
    }
}

#[derive(sqlx::FromRow)]
struct StandingRow {
    digest: Vec<u8>,
    kind: String,
    account: Vec<u8>,
    chain_id: i64,
    escrow_id: i64,
    status: String,
    held_wei: String,
    ends_s: i64,
    body: String,
}

impl StandingRow {
    fn into_order(self) -> Result<StandingOrder> {
        let corrupt = |what, bytes: &[u8]| Error::Corrupt {
            what,
            value: hex::encode(bytes),
        };
        Ok(StandingOrder {
            id: B256::try_from(self.digest.as_slice())
                .map_err(|_| corrupt("an order digest", &self.digest))?,
            kind: self.kind,
            account: Address::try_from(self.account.as_slice())
                .map_err(|_| corrupt("an address", &self.account))?,
            chain_id: self.chain_id as u64,
            escrow_id: self.escrow_id as u64,
            status: self.status,
            held_wei: parse_wei(&self.held_wei)?,
            ends_s: self.ends_s as u64,
            order: serde_json::from_str(&self.body)?,
            reserve: None,
            rent: None,
        })
    }
}
