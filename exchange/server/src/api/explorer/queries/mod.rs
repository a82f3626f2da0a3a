//! What the explorer reads: read-only, parameterised, bounded (every list has a `LIMIT`) runtime
//! queries over the books' tables (`exchange_*`) and the settlement coordinator's outbox
//! (`settlement_*`), each returning the view a page renders and its JSON serialises.
//!
//! Amounts stay decimal strings (`NUMERIC::text`), as the API writes wei; times are unix
//! milliseconds. Nothing here writes.

pub(crate) mod accounts;
pub(crate) mod jobs;
pub(crate) mod markets;
pub(crate) mod providers;
pub(crate) mod settlement;

use crate::error::{Error, Result};
use alloy::primitives::U256;

/// A timestamp column as unix milliseconds.
macro_rules! ms {
    ($col:literal) => {
        concat!("(extract(epoch FROM ", $col, ") * 1000)::bigint")
    };
}
pub(crate) use ms;

/// The status a job shows (see [`crate::api::explorer::params::STATUSES`]), given the job `j`, its
/// settlement receipt `sr` and that receipt's batch part on the job's chain `bp`.
pub(crate) const SHOWN_STATUS: &str = "CASE WHEN bp.status = 'posted' THEN 'settled' \
     WHEN sr.batch_id IS NOT NULL THEN 'batched' ELSE j.status END";

/// The joins [`SHOWN_STATUS`] needs. A receipt belongs to one batch; a batch has one part per
/// chain, so the part on the receipt's chain is at most one row.
pub(crate) const SETTLEMENT_JOINS: &str = "LEFT JOIN settlement_receipts sr ON sr.job_id = j.id \
     LEFT JOIN settlement_batch_parts bp ON bp.batch_id = sr.batch_id AND bp.chain_id = sr.chain_id";

/// Bytes as `0x`-hex.
pub(crate) fn hex0x(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

/// Optional bytes as `0x`-hex.
pub(crate) fn hex0x_opt(bytes: Option<&Vec<u8>>) -> Option<String> {
    bytes.map(|b| hex0x(b))
}

/// A JSON column read as text.
pub(crate) fn json(text: &str) -> Result<serde_json::Value> {
    Ok(serde_json::from_str(text)?)
}

/// A decimal wei string as a `u128` (a corrupt one is an error: this code never writes one).
pub(crate) fn wei(text: &str) -> Result<u128> {
    text.parse().map_err(|_| Error::Corrupt {
        what: "a wei amount",
        value: text.to_owned(),
    })
}

/// A JSON amount as the protocol writes them (a decimal string, a `0x` hex string or a number)
/// as a decimal string; `None` if it is none of these.
pub(crate) fn amount_text(value: &serde_json::Value) -> Option<String> {
    match value {
        serde_json::Value::String(s) => s.parse::<U256>().ok().map(|u| u.to_string()),
        serde_json::Value::Number(n) => n.as_u64().map(|u| u.to_string()),
        _ => None,
    }
}
