//! The query strings and path segments the explorer accepts, checked before any SQL runs: every
//! bad value is a 400 naming its field (our JSON error shape for JSON, an error page for HTML).

use crate::api::error::ApiError;
use alloy::primitives::{Address, B256};
use serde::{Deserialize, Serialize};

/// Rows a list shows unless `?limit=` says otherwise.
pub(crate) const DEFAULT_LIMIT: u32 = 25;
/// Rows a list shows at most.
pub(crate) const MAX_LIMIT: u32 = 100;
/// The deepest `?page=` accepted (deeper: use the `?before=` cursor, which costs nothing).
pub(crate) const MAX_PAGE: u32 = 1000;

/// What the explorer shows as a job's status: the job's own lifecycle state, or `batched` /
/// `settled` once its receipt is in a settlement batch / that batch's part is posted on the
/// job's chain.
pub(crate) const STATUSES: [&str; 8] = [
    "assigned",
    "running",
    "done",
    "batched",
    "settled",
    "expired",
    "failed",
    "cancelled",
];

/// Tiers a job can be cleared at.
pub(crate) const TIERS: [&str; 4] = ["T0", "T1", "T2", "T3"];

/// `/explorer/jobs?…` as received: every value text, so each bad one is named.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct JobsQuery {
    account: Option<String>,
    provider: Option<String>,
    model: Option<String>,
    adapter: Option<String>,
    tier: Option<String>,
    status: Option<String>,
    page: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

/// The filters of the jobs list, checked.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub(crate) struct JobFilter {
    /// The buyer's account.
    pub(crate) account: Option<Address>,
    /// The provider (SHA-256 of its ML-DSA key) whose bundles ran the jobs.
    pub(crate) provider: Option<B256>,
    /// The catalog model.
    pub(crate) model: Option<String>,
    /// The adapter's content id (64 lowercase hex digits).
    pub(crate) adapter: Option<String>,
    /// The tier it was cleared at.
    pub(crate) tier: Option<String>,
    /// The status shown ([`STATUSES`]).
    pub(crate) status: Option<String>,
}

impl JobFilter {
    /// The filters as query-string pairs (for links to other pages of the same list).
    pub(crate) fn pairs(&self) -> Vec<(&'static str, String)> {
        let mut out = Vec::new();
        if let Some(a) = &self.account {
            out.push(("account", a.to_string()));
        }
        if let Some(p) = &self.provider {
            out.push(("provider", p.to_string()));
        }
        if let Some(m) = &self.model {
            out.push(("model", m.clone()));
        }
        if let Some(a) = &self.adapter {
            out.push(("adapter", a.clone()));
        }
        if let Some(t) = &self.tier {
            out.push(("tier", t.clone()));
        }
        if let Some(s) = &self.status {
            out.push(("status", s.clone()));
        }
        out
    }
}

/// Where a list starts and how long it is.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub(crate) struct Paging {
    /// Rows per page, 1..=[`MAX_LIMIT`].
    pub(crate) limit: u32,
    /// 1-based page number (offset paging), 1..=[`MAX_PAGE`].
    pub(crate) page: u32,
}

/// A list's cursor: rows strictly older than this one (a job id, or a batch id).
#[derive(Debug, Clone, Copy, PartialEq)]
pub(crate) enum Before<T> {
    /// From the newest.
    Start,
    /// After the row with this key.
    After(T),
}

impl JobsQuery {
    /// The checked filters, paging and cursor.
    pub(crate) fn check(self) -> Result<(JobFilter, Paging, Before<B256>), ApiError> {
        let filter = JobFilter {
            // An empty value is no filter: what a browser's form sends for an empty field.
            account: non_empty(self.account).map(|a| account(&a)).transpose()?,
            provider: non_empty(self.provider)
                .map(|p| key_hash("provider", &p))
                .transpose()?,
            model: non_empty(self.model)
                .map(|m| {
                    if m.len() > 200 {
                        Err(ApiError::invalid(
                            "model",
                            "a model name is at most 200 bytes",
                        ))
                    } else {
                        Ok(m)
                    }
                })
                .transpose()?,
            adapter: non_empty(self.adapter).map(adapter).transpose()?,
            tier: non_empty(self.tier)
                .map(|t| one_of("tier", &t, &TIERS))
                .transpose()?,
            status: non_empty(self.status)
                .map(|s| one_of("status", &s, &STATUSES))
                .transpose()?,
        };
        let (paging, before) = paging(
            self.limit.as_deref(),
            self.page.as_deref(),
            self.before.as_deref(),
            |b| job_id("before", b),
        )?;
        Ok((filter, paging, before))
    }
}

/// `?limit=&page=&before=` of a list without filters.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    page: Option<String>,
    before: Option<String>,
    limit: Option<String>,
}

impl ListQuery {
    /// The checked paging, with a numeric (batch id) cursor.
    pub(crate) fn check_numeric(self) -> Result<(Paging, Before<i64>), ApiError> {
        paging(
            self.limit.as_deref(),
            self.page.as_deref(),
            self.before.as_deref(),
            |b| {
                b.parse::<i64>()
                    .ok()
                    .filter(|n| *n > 0)
                    .ok_or_else(|| ApiError::invalid("before", "a batch id: a positive integer"))
            },
        )
    }

    /// The checked paging; a list without a cursor refuses `before`.
    pub(crate) fn check_paged(self) -> Result<Paging, ApiError> {
        if self.before.is_some() {
            return Err(ApiError::invalid(
                "before",
                "this list pages with ?page= only",
            ));
        }
        let (paging, _) = paging(
            self.limit.as_deref(),
            self.page.as_deref(),
            None,
            |_| Ok(()),
        )?;
        Ok(paging)
    }
}

/// `?page=` and `?before=` are two ways to say where to start: one at a time.
fn paging<T>(
    limit: Option<&str>,
    page: Option<&str>,
    before: Option<&str>,
    cursor: impl FnOnce(&str) -> Result<T, ApiError>,
) -> Result<(Paging, Before<T>), ApiError> {
    let limit = match limit.filter(|l| !l.is_empty()) {
        None => DEFAULT_LIMIT,
        Some(l) => l
            .parse::<u32>()
            .ok()
            .filter(|l| (1..=MAX_LIMIT).contains(l))
            .ok_or_else(|| {
                ApiError::invalid("limit", format!("an integer within 1..={MAX_LIMIT}"))
            })?,
    };
    let page_n = match page.filter(|p| !p.is_empty()) {
        None => 1,
        Some(p) => p
            .parse::<u32>()
            .ok()
            .filter(|p| (1..=MAX_PAGE).contains(p))
            .ok_or_else(|| {
                ApiError::invalid(
                    "page",
                    format!(
                        "an integer within 1..={MAX_PAGE} (deeper: follow the ?before= cursor)"
                    ),
                )
            })?,
    };
    let before = match before.filter(|b| !b.is_empty()) {
        None => Before::Start,
        Some(b) => {
            if page_n != 1 {
                return Err(ApiError::invalid(
                    "before",
                    "give ?page= or the ?before= cursor, not both",
                ));
            }
            Before::After(cursor(b)?)
        }
    };
    Ok((
        Paging {
            limit,
            page: page_n,
        },
        before,
    ))
}

fn non_empty(value: Option<String>) -> Option<String> {
    value.filter(|v| !v.is_empty())
}

fn one_of(field: &str, value: &str, allowed: &[&str]) -> Result<String, ApiError> {
    if allowed.contains(&value) {
        Ok(value.to_owned())
    } else {
        Err(ApiError::invalid(
            field,
            format!("one of {}", allowed.join(", ")),
        ))
    }
}

/// A 0x-hex account (20 bytes).
pub(crate) fn account(text: &str) -> Result<Address, ApiError> {
    text.parse()
        .map_err(|_| ApiError::invalid("account", "an account is a 0x-hex address (20 bytes)"))
}

/// A job id: 32 bytes of 0x-hex.
pub(crate) fn job_id(field: &str, text: &str) -> Result<B256, ApiError> {
    strict_b256(text).ok_or_else(|| ApiError::invalid(field, "a job id is 32 bytes of 0x-hex"))
}

/// A provider's key hash: 32 bytes of 0x-hex.
pub(crate) fn key_hash(field: &str, text: &str) -> Result<B256, ApiError> {
    strict_b256(text).ok_or_else(|| {
        ApiError::invalid(
            field,
            "a provider is the SHA-256 of its ML-DSA key: 32 bytes of 0x-hex",
        )
    })
}

fn strict_b256(text: &str) -> Option<B256> {
    let hex = text.strip_prefix("0x").unwrap_or(text);
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| text.parse().ok())
        .flatten()
}

/// An adapter's content id, as the books keep it (64 lowercase hex digits; `0x` and capitals
/// accepted).
fn adapter(text: String) -> Result<String, ApiError> {
    let hex = text
        .strip_prefix("0x")
        .unwrap_or(&text)
        .to_ascii_lowercase();
    if hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()) {
        Ok(hex)
    } else {
        Err(ApiError::invalid(
            "adapter",
            "an adapter is its content id: 64 hex digits",
        ))
    }
}

/// A batch id: a positive integer.
pub(crate) fn batch_id(text: &str) -> Result<i64, ApiError> {
    text.parse::<i64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| ApiError::invalid("id", "a batch id is a positive integer"))
}
