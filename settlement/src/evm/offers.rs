//! The books of a sender's offers (`chain_offers`, PostgreSQL): what holds an account's nonces
//! survives the process, so a restarted exchange replaces or recognises its own pending
//! transaction instead of discovering it by the pool's refusals (see [`super::sender`]).

use alloy::primitives::{Address, B256};
use cx_contracts::Fees;
use sqlx::{PgPool, Row};

use crate::error::{Error, Result};

/// The offers of one nonce that are still pending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Held {
    /// The nonce they hold.
    pub nonce: u64,
    /// What they call (`keccak256(to ‖ value ‖ input)`).
    pub call: B256,
    /// Every offer's hash, oldest first.
    pub hashes: Vec<B256>,
    /// The highest fees offered (what a replacement must beat).
    pub fees: Fees,
}

/// The offer books on the exchange's database (schema of `migrations/`).
#[derive(Clone, Debug)]
pub struct OfferBook {
    pool: PgPool,
}

fn to_i64(value: u128, what: &'static str) -> Result<i64> {
    i64::try_from(value).map_err(|_| Error::OutOfRange {
        what,
        value: u64::try_from(value).unwrap_or(u64::MAX),
    })
}

impl OfferBook {
    /// The books on `pool`.
    pub fn new(pool: PgPool) -> Self {
        Self { pool }
    }

    /// Records an offer sent.
    pub async fn offered(
        &self,
        chain_id: u64,
        account: Address,
        nonce: u64,
        call: B256,
        hash: B256,
        fees: Fees,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO chain_offers (tx_hash, chain_id, account, nonce, call_hash, \
             max_fee_per_gas, max_priority_fee_per_gas) VALUES ($1, $2, $3, $4, $5, $6, $7) \
             ON CONFLICT (tx_hash) DO NOTHING",
        )
        .bind(hash.as_slice())
        .bind(to_i64(chain_id.into(), "chain id")?)
        .bind(account.as_slice())
        .bind(to_i64(nonce.into(), "nonce")?)
        .bind(call.as_slice())
        .bind(to_i64(fees.max_fee_per_gas, "max fee per gas")?)
        .bind(to_i64(
            fees.max_priority_fee_per_gas,
            "priority fee per gas",
        )?)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Closes `nonce`: `mined` is the offer in a block (`None`: a transaction not ours took it);
    /// every other pending offer of it is replaced.
    pub async fn closed(
        &self,
        chain_id: u64,
        account: Address,
        nonce: u64,
        mined: Option<B256>,
    ) -> Result<()> {
        sqlx::query(
            "UPDATE chain_offers SET outcome = CASE WHEN tx_hash = $4 THEN 'mined' ELSE \
             'replaced' END WHERE chain_id = $1 AND account = $2 AND nonce = $3 \
             AND outcome = 'pending'",
        )
        .bind(to_i64(chain_id.into(), "chain id")?)
        .bind(account.as_slice())
        .bind(to_i64(nonce.into(), "nonce")?)
        .bind(mined.map(|h| h.to_vec()))
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The pending offers of `account`'s nonce `nonce` (its mined count: the one a send uses),
    /// if any; offers of lower nonces still pending are closed as `used` (their nonces are
    /// taken, and no sender watched by which).
    pub async fn held(&self, chain_id: u64, account: Address, nonce: u64) -> Result<Option<Held>> {
        let chain = to_i64(chain_id.into(), "chain id")?;
        let n = to_i64(nonce.into(), "nonce")?;
        sqlx::query(
            "UPDATE chain_offers SET outcome = 'used' WHERE chain_id = $1 AND account = $2 \
             AND nonce < $3 AND outcome = 'pending'",
        )
        .bind(chain)
        .bind(account.as_slice())
        .bind(n)
        .execute(&self.pool)
        .await?;
        let rows = sqlx::query(
            "SELECT tx_hash, call_hash, max_fee_per_gas, max_priority_fee_per_gas \
             FROM chain_offers WHERE chain_id = $1 AND account = $2 AND nonce = $3 \
             AND outcome = 'pending' ORDER BY sent_at, tx_hash",
        )
        .bind(chain)
        .bind(account.as_slice())
        .bind(n)
        .fetch_all(&self.pool)
        .await?;
        let mut held: Option<Held> = None;
        for row in rows {
            let hash = B256::from_slice(&row.try_get::<Vec<u8>, _>("tx_hash")?);
            let call = B256::from_slice(&row.try_get::<Vec<u8>, _>("call_hash")?);
            let fees = Fees {
                max_fee_per_gas: u128::try_from(row.try_get::<i64, _>("max_fee_per_gas")?)
                    .unwrap_or_default(),
                max_priority_fee_per_gas: u128::try_from(
                    row.try_get::<i64, _>("max_priority_fee_per_gas")?,
                )
                .unwrap_or_default(),
            };
            let h = held.get_or_insert_with(|| Held {
                nonce,
                call,
                hashes: Vec::new(),
                fees,
            });
            // Offers of one nonce made by one send share a call; should two calls ever share
            // a nonce in the books, the latest's call is the one a replacement may be.
            h.call = call;
            h.hashes.push(hash);
            h.fees.max_fee_per_gas = h.fees.max_fee_per_gas.max(fees.max_fee_per_gas);
            h.fees.max_priority_fee_per_gas = h
                .fees
                .max_priority_fee_per_gas
                .max(fees.max_priority_fee_per_gas);
        }
        Ok(held)
    }
}
