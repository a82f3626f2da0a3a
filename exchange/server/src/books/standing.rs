//! Standing orders (reserves, rents, searches): accepted with their hold on the tab in one
//! statement, as intents are, and swept when they end unfilled.

use super::jobs::constraint;
use super::{Books, NewOrder, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use serde::Serialize;

/// A standing order as the API reports it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct StandingOrder {
    /// The order's EIP-712 digest (its id).
    #[schema(value_type = String)]
    pub id: B256,
    /// `reserve`, `rent` or `search`.
    pub kind: String,
    /// The account that signed it.
    #[schema(value_type = String)]
    pub account: Address,
    /// The tab's chain.
    pub chain_id: u64,
    /// The tab.
    pub escrow_id: u64,
    /// `open` (waiting for a provider), `expired` (ended unfilled; hold returned), …
    pub status: String,
    /// What it holds on the tab, wei.
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String)]
    pub held_wei: u128,
    /// When it ends, unix seconds.
    pub ends_s: u64,
    /// The order as signed and received.
    #[schema(value_type = Object)]
    pub order: serde_json::Value,
}

impl Books {
    /// Accepts a standing order: the nonce spent, `held_wei` held on its tab (which must stay
    /// open until `needed_until_s`) and the order written, or nothing.
    pub async fn accept_standing(
        &self,
        order: &NewOrder,
        escrow_id: u64,
        held_wei: u128,
        ends_s: u64,
        needed_until_s: u64,
    ) -> Result<()> {
        let done: Result<(i64, i64), sqlx::Error> = sqlx::query_as(
            "WITH hold AS ( \
                 UPDATE exchange_tabs SET jobs = jobs + 1, held_wei = held_wei + $8::numeric, \
                        updated_at = now() \
                 WHERE chain_id = $4 AND escrow_id = $7 AND buyer = $3 AND status = 'open' \
                   AND deadline_s >= $10 AND held_wei + $8::numeric <= amount_wei AND jobs < 400 \
                 RETURNING 1), \
             ord AS ( \
                 INSERT INTO exchange_orders (digest, kind, account, chain_id, nonce, body) \
                 SELECT $1, $2, $3, $4, $5::numeric, $6::jsonb WHERE EXISTS (SELECT 1 FROM hold) \
                 RETURNING digest), \
             standing AS ( \
                 INSERT INTO exchange_standing_orders (digest, kind, account, chain_id, escrow_id, \
                                                       held_wei, ends_s) \
                 SELECT digest, $2, $3, $4, $7, $8::numeric, $9 FROM ord RETURNING 1) \
             SELECT (SELECT count(*) FROM hold), (SELECT count(*) FROM standing)",
        )
        .bind(order.digest.as_slice())
        .bind(order.kind)
        .bind(order.account.as_slice())
        .bind(to_i64(order.chain_id, "chain id")?)
        .bind(order.nonce.to_string())
        .bind(order.body.to_string())
        .bind(to_i64(escrow_id, "escrow id")?)
        .bind(wei_text(held_wei))
        .bind(to_i64(ends_s, "end")?)
        .bind(to_i64(needed_until_s, "deadline")?)
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
                    s.held_wei::text AS held_wei, s.ends_s, o.body::text AS body \
             FROM exchange_standing_orders s JOIN exchange_orders o ON o.digest = s.digest \
             WHERE s.digest = $1",
        )
        .bind(id.as_slice())
        .fetch_optional(&self.pool)
        .await?;
        row.map(StandingRow::into_order).transpose()
    }

    /// Expires the open standing orders that ended before `now_s` with no provider filling them:
    /// their holds return to their tabs. Returns how many.
    pub async fn expire_standing(&self, now_s: u64) -> Result<u64> {
        let (count,): (i64,) = sqlx::query_as(
            "WITH due AS ( \
                 UPDATE exchange_standing_orders SET status = 'expired', updated_at = now() \
                 WHERE status = 'open' AND ends_s < $1 \
                 RETURNING chain_id, escrow_id, held_wei), \
             tabs AS ( \
                 UPDATE exchange_tabs t SET held_wei = t.held_wei - d.released, updated_at = now() \
                 FROM (SELECT chain_id, escrow_id, sum(held_wei) AS released FROM due \
                       GROUP BY chain_id, escrow_id) d \
                 WHERE t.chain_id = d.chain_id AND t.escrow_id = d.escrow_id RETURNING 1) \
             SELECT count(*) FROM due",
        )
        .bind(to_i64(now_s, "time")?)
        .fetch_one(&self.pool)
        .await?;
        Ok(count as u64)
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
        })
    }
}
