//! Tabs: on-chain escrows mirrored by the chain watcher, and what jobs hold of each.

use super::store::{Books, parse_wei, to_i64};
use crate::error::{Error, Result};
use alloy::primitives::{Address, B256};
use serde::Serialize;

/// A tab as the books see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct Tab {
    /// EIP-155 chain id.
    pub chain_id: u64,
    /// The escrow's id on that chain's Settlement contract.
    pub escrow_id: u64,
    /// Who opened it (and alone may draw on it).
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{40}$")]
    pub buyer: Address,
    /// What the escrow holds, wei.
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub amount_wei: u128,
    /// What jobs hold of it, wei (never more than `amount_wei`).
    #[serde(with = "cx_protocol::price::wei_string")]
    #[schema(value_type = String, pattern = "^[0-9]{1,38}$")]
    pub held_wei: u128,
    /// After this time (unix seconds) the buyer may reclaim the escrow on chain.
    pub deadline_s: u64,
    /// The escrow's `ref`: the hash of the buyer's signed tab terms.
    #[schema(value_type = String, pattern = "^0x[0-9a-fA-F]{64}$")]
    pub reference: B256,
    /// `open`, `closing`, `submitted`, `settled`, `unspent` or `reclaimed`.
    pub status: String,
    /// Jobs it has taken (at most [`MAX_JOBS_PER_TAB`]).
    pub jobs: u32,
}

impl Tab {
    /// What is left to hold, wei.
    pub fn available_wei(&self) -> u128 {
        self.amount_wei.saturating_sub(self.held_wei)
    }
}

impl Books {
    /// The tab `(chain_id, escrow_id)`, if the watcher has seen it.
    pub async fn tab(&self, chain_id: u64, escrow_id: u64) -> Result<Option<Tab>> {
        let row: Option<TabRow> = sqlx::query_as(TAB_SELECT)
            .bind(to_i64(chain_id, "chain id")?)
            .bind(to_i64(escrow_id, "escrow id")?)
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| r.into_tab(chain_id, escrow_id)).transpose()
    }

    /// Why a hold of `amount_wei` on `tab` for `buyer`, needed until `needed_until_s`, did not
    /// take: the tab is unknown (or not the buyer's — the same answer, so whose it is stays
    /// private), reclaimed, ends too soon, or has less left.
    pub(super) async fn why_not_held(
        &self,
        tab: (u64, u64),
        buyer: Address,
        amount_wei: u128,
        needed_until_s: u64,
    ) -> Result<Error> {
        let (chain_id, escrow_id) = (to_i64(tab.0, "chain id")?, to_i64(tab.1, "escrow id")?);
        let row: Option<TabRow> = sqlx::query_as(TAB_SELECT)
            .bind(chain_id)
            .bind(escrow_id)
            .fetch_optional(&self.pool)
            .await?;
        let unknown = Error::UnknownTab {
            chain_id: tab.0,
            escrow_id: tab.1,
        };
        let Some(current) = row.map(|r| r.into_tab(tab.0, tab.1)).transpose()? else {
            return Ok(unknown);
        };
        Ok(if current.buyer != buyer {
            unknown
        } else if current.status != "open" {
            Error::TabClosed {
                chain_id: tab.0,
                escrow_id: tab.1,
            }
        } else if current.jobs >= MAX_JOBS_PER_TAB {
            Error::TabFull {
                chain_id: tab.0,
                escrow_id: tab.1,
                jobs: MAX_JOBS_PER_TAB,
            }
        } else if current.deadline_s < needed_until_s {
            Error::TabEndsTooSoon {
                tab_deadline_s: current.deadline_s,
                needed_until_s,
            }
        } else {
            Error::TabOverspent {
                available_wei: current.available_wei(),
                needed_wei: amount_wei,
            }
        })
    }
}

/// Jobs a tab takes at most: it settles whole in one batch part (the holds' SQL says 400 too).
pub(super) const MAX_JOBS_PER_TAB: u32 = cx_settlement::ledger::MAX_RECEIPTS_PER_BATCH as u32;

const TAB_SELECT: &str = "SELECT buyer, amount_wei::text AS amount_wei, held_wei::text AS held_wei, \
                          deadline_s, ref, status, jobs FROM exchange_tabs \
                          WHERE chain_id = $1 AND escrow_id = $2";

#[derive(sqlx::FromRow)]
struct TabRow {
    buyer: Vec<u8>,
    amount_wei: String,
    held_wei: String,
    deadline_s: i64,
    #[sqlx(rename = "ref")]
    reference: Vec<u8>,
    status: String,
    jobs: i32,
}

impl TabRow {
    fn into_tab(self, chain_id: u64, escrow_id: u64) -> Result<Tab> {
        Ok(Tab {
            chain_id,
            escrow_id,
            buyer: Address::try_from(self.buyer.as_slice()).map_err(|_| Error::Corrupt {
                what: "an address",
                value: hex::encode(&self.buyer),
            })?,
            amount_wei: parse_wei(&self.amount_wei)?,
            held_wei: parse_wei(&self.held_wei)?,
            deadline_s: self.deadline_s as u64,
            reference: B256::try_from(self.reference.as_slice()).map_err(|_| Error::Corrupt {
                what: "a tab ref",
                value: hex::encode(&self.reference),
            })?,
            status: self.status,
            jobs: self.jobs.max(0) as u32,
        })
    }
}
