//! Session keys: a grant's terms and bearer hash, what its calls spent, and the one transaction a
//! call is accepted in (the session's cap and the tab's hold taken together, or neither).

use super::jobs::{NewJob, NewOrder};
use super::store::constraint;
use super::store::{Books, json_text, parse_wei, to_i64, wei_text};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use cx_protocol::order::SessionGrant;
use serde::Serialize;

/// A session as the books keep it.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
pub struct Session {
    /// The grant's EIP-712 digest (the session's id).
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub id: B256,
    /// The account that signed the grant.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub account: Address,
    /// The chain of its tab (and of the grant's domain).
    pub chain_id: u64,
    /// The signed grant: tab, cap, expiry and the calls' defaults.
    pub grant: SessionGrant,
    /// What its calls hold or were charged, wei.
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub spent_wei: u128,
    /// Whether the bearer revoked it.
    pub revoked: bool,
}

impl Session {
    /// Refuses a revoked session, or one whose grant expired by `now_s`.
    pub fn check_live(&self, now_s: u64) -> Result<()> {
        if self.revoked {
            return Err(Error::SessionRevoked);
        }
        if self.grant.expiry_s <= now_s {
            return Err(Error::SessionExpired {
                expiry_s: self.grant.expiry_s,
            });
        }
        Ok(())
    }
}

impl Books {
    /// Stores a verified grant: its order (nonce spent) and the session, in one statement, only
    /// if the tab it names is the signer's and open; otherwise nothing, and the error says why.
    pub async fn open_session(&self, order: &NewOrder, grant: &SessionGrant) -> Result<()> {
        let chain_id = to_i64(order.chain_id, "chain id")?;
        let escrow_id = to_i64(grant.tab_id, "escrow id")?;
        let done: Result<(i64,), sqlx::Error> = sqlx::query_as(
            "WITH tab AS ( \
                 SELECT 1 FROM exchange_tabs WHERE chain_id = $4 AND escrow_id = $7 \
                   AND buyer = $3 AND status = 'open'), \
             ord AS ( \
                 INSERT INTO exchange_orders (digest, kind, account, chain_id, nonce, body, \
                                              mldsa_signature) \
                 SELECT $1, $2, $3, $4, $5::numeric, $6::jsonb, $12 WHERE EXISTS (SELECT 1 FROM tab) \
                 RETURNING digest), \
             sess AS ( \
                 INSERT INTO exchange_sessions (id, account, chain_id, escrow_id, spend_cap_wei, \
                                                expiry_s, grant_terms, bearer_hash) \
                 SELECT digest, $3, $4, $7, $8::numeric, $9, $10::jsonb, $11 FROM ord \
                 RETURNING 1) \
             SELECT (SELECT count(*) FROM sess)",
        )
        .bind(order.digest.as_slice())
        .bind(order.kind)
        .bind(order.account.as_slice())
        .bind(chain_id)
        .bind(order.nonce.to_string())
        .bind(json_text(&order.body))
        .bind(escrow_id)
        .bind(wei_text(grant.spend_cap_wei))
        .bind(to_i64(grant.expiry_s, "expiry")?)
        .bind(serde_json::to_string(grant)?)
        .bind(grant.bearer_hash.as_slice())
        .bind(order.mldsa_signature.as_ref().map(|s| &s[..]))
        .fetch_one(&self.pool)
        .await;
        match done {
            Ok((1,)) => Ok(()),
            Ok(_) => Err(self
                .why_not_held((order.chain_id, grant.tab_id), order.account, 0, 0)
                .await?),
            Err(err) => Err(match constraint(&err) {
                Some("exchange_orders_nonce_unique") => Error::NonceReused { nonce: order.nonce },
                Some("exchange_orders_pkey") => Error::OrderExists,
                Some("exchange_sessions_bearer_unique") => Error::BearerReused,
                _ => err.into(),
            }),
        }
    }

    /// The session whose bearer secret hashes to `bearer_hash`, revoked or not.
    pub async fn session_by_bearer(&self, bearer_hash: B256) -> Result<Option<Session>> {
        let row: Option<SessionRow> =
            sqlx::query_as(&format!("{SESSION_SELECT} WHERE bearer_hash = $1"))
                .bind(bearer_hash.as_slice())
                .fetch_optional(&self.pool)
                .await?;
        row.map(SessionRow::into_session).transpose()
    }

    /// Revokes a session; its later calls are refused, its jobs already accepted run on. Returns
    /// whether it was live.
    pub async fn revoke_session(&self, id: B256) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE exchange_sessions SET revoked_at = now() WHERE id = $1 AND revoked_at IS NULL",
        )
        .bind(id.as_slice())
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() == 1)
    }

    /// Accepts one call of a session at `now_s` as `job`: within the session's cap, on its tab,
    /// in one transaction (the session's tab row, then the session row, are locked first, so
    /// concurrent calls of one session queue and none can take the cap past its limit; the tab
    /// hold is the same conditional update as an intent's). Either the cap is spent, the tab
    /// held and the job written, or nothing is.
    pub async fn accept_call(&self, session_id: B256, now_s: u64, job: &NewJob) -> Result<()> {
        self.accept_call_with_runs(session_id, now_s, job, &[])
            .await
    }

    /// [`Books::accept_call`] with the job's verification runs (T1, T3), held and written in the
    /// same transaction (see [`Books::accept_with_runs`]).
    pub async fn accept_call_with_runs(
        &self,
        session_id: B256,
        now_s: u64,
        job: &NewJob,
        runs: &[super::jobs::NewRun],
    ) -> Result<()> {
        let total_wei = super::jobs::total_held(job, runs)?;
        let mut tx = self.pool.begin().await?;
        // Rows are locked in one order everywhere — job, tab, session — and a result or an
        // expiry releasing a hold goes job → tab → session. Locking the session before its tab
        // here deadlocked them under load (`cx bench load --target door`).
        sqlx::query(
            "SELECT 1 FROM exchange_tabs t JOIN exchange_sessions s \
             ON s.chain_id = t.chain_id AND s.escrow_id = t.escrow_id \
             WHERE s.id = $1 FOR UPDATE OF t",
        )
        .bind(session_id.as_slice())
        .execute(&mut *tx)
        .await?;
        let row: Option<SessionRow> =
            sqlx::query_as(&format!("{SESSION_SELECT} WHERE id = $1 FOR UPDATE"))
                .bind(session_id.as_slice())
                .fetch_optional(&mut *tx)
                .await?;
        let session = row
            .map(SessionRow::into_session)
            .transpose()?
            .ok_or(Error::UnknownSession)?;
        session.check_live(now_s)?;
        let left = session
            .grant
            .spend_cap_wei
            .saturating_sub(session.spent_wei);
        if total_wei > left {
            return Err(Error::SessionCapReached {
                left_wei: left,
                needed_wei: total_wei,
            });
        }
        // The hold, the spend, the job and its runs in one statement: the spend and the job
        // only once the tab held.
        let sql = format!(
            "WITH {}, \
             gate AS ( \
                 UPDATE exchange_sessions SET spent_wei = spent_wei + $23::numeric \
                 WHERE id = $15 AND EXISTS (SELECT 1 FROM hold) \
                 RETURNING 1), \
             {} \
             SELECT count(*) FROM hold",
            super::jobs::TAB_HOLD,
            super::jobs::JOB_WITH_RUNS
        );
        let (held,): (i64,) = super::jobs::bind_job_with_runs(
            sqlx::query_as(&sql),
            session_id,
            session.account,
            session.chain_id,
            job,
            runs,
            Some(session_id),
        )?
        .fetch_one(&mut *tx)
        .await?;
        if held != 1 {
            drop(tx);
            return Err(self
                .why_not_held(
                    (session.chain_id, session.grant.tab_id),
                    session.account,
                    total_wei,
                    job.needed_until_s,
                )
                .await?);
        }
        tx.commit().await?;
        Ok(())
    }
}

const SESSION_SELECT: &str = "SELECT id, account, chain_id, spent_wei::text AS spent_wei, \
                              grant_terms::text AS grant_terms, revoked_at IS NOT NULL AS revoked \
                              FROM exchange_sessions";

#[derive(sqlx::FromRow)]
struct SessionRow {
    id: Vec<u8>,
    account: Vec<u8>,
    chain_id: i64,
    spent_wei: String,
    grant_terms: String,
    revoked: bool,
}

impl SessionRow {
    fn into_session(self) -> Result<Session> {
        let corrupt = |what, bytes: &[u8]| Error::Corrupt {
            what,
            value: hex::encode(bytes),
        };
        Ok(Session {
            id: B256::try_from(self.id.as_slice())
                .map_err(|_| corrupt("a session id", &self.id))?,
            account: Address::try_from(self.account.as_slice())
                .map_err(|_| corrupt("an address", &self.account))?,
            chain_id: self.chain_id as u64,
            grant: serde_json::from_str(&self.grant_terms)?,
            spent_wei: parse_wei(&self.spent_wei)?,
            revoked: self.revoked,
        })
    }
}
