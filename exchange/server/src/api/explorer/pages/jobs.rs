//! `/explorer/jobs`: jobs newest first, filtered by account, provider, model, adapter, tier and
//! status, paged by number or by the `before` cursor.

use super::{account_link, batch_link, job_link, pager, provider_link, text_opt, wei};
use crate::api::explorer::format::{query_value, time_ms};
use crate::api::explorer::html::{badge, short, table};
use crate::api::explorer::layout;
use crate::api::explorer::params::{Before, JobFilter, MAX_LIMIT, Paging, STATUSES, TIERS};
use crate::api::explorer::queries::jobs::{JobList, JobSummary};
use alloy::primitives::B256;
use maud::{Markup, html};
use serde::Serialize;

/// The jobs page's data.
#[derive(Debug, Serialize)]
pub(crate) struct JobsPage {
    /// The filters applied.
    pub(crate) filter: JobFilter,
    /// Rows per page.
    pub(crate) limit: u32,
    /// The page number (1 when a cursor is used).
    pub(crate) page: u32,
    /// The cursor this page started after, if any.
    pub(crate) before: Option<String>,
    /// The jobs.
    pub(crate) jobs: Vec<JobSummary>,
    /// The next (older) page, if there is one.
    pub(crate) next: Option<String>,
    /// The previous (newer) page, if there is one.
    pub(crate) prev: Option<String>,
}

impl JobsPage {
    pub(crate) fn new(
        filter: JobFilter,
        paging: Paging,
        before: Before<B256>,
        list: JobList,
    ) -> Self {
        let url = |extra: &[(&str, String)]| {
            let mut pairs = filter.pairs();
            if paging.limit != crate::api::explorer::params::DEFAULT_LIMIT {
                pairs.push(("limit", paging.limit.to_string()));
            }
            pairs.extend(extra.iter().map(|(k, v)| (*k, v.clone())));
            list_url(&pairs)
        };
        let next = match list.jobs.last() {
            Some(last) if list.more => Some(url(&[("before", last.id.clone())])),
            _ => None,
        };
        let prev = match before {
            // A cursor page's newer neighbour is not known without a query: offer the newest.
            Before::After(_) => Some(url(&[])),
            Before::Start if paging.page > 1 => {
                Some(url(&[("page", (paging.page - 1).to_string())]))
            }
            Before::Start => None,
        };
        Self {
            limit: paging.limit,
            page: paging.page,
            before: match before {
                Before::After(id) => Some(id.to_string()),
                Before::Start => None,
            },
            jobs: list.jobs,
            next,
            prev,
            filter,
        }
    }
}

/// `/explorer/jobs?k=v&…`, values percent-encoded.
pub(crate) fn list_url(pairs: &[(&str, String)]) -> String {
    if pairs.is_empty() {
        return "/explorer/jobs".to_owned();
    }
    let query: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}={}", query_value(v)))
        .collect();
    format!("/explorer/jobs?{}", query.join("&"))
}

/// The jobs table (shared with the index and account pages).
pub(crate) fn jobs_table(id: &str, jobs: &[JobSummary]) -> Markup {
    let rows: Vec<Markup> = jobs
        .iter()
        .map(|j| {
            html! {
                tr id={ "job-" (j.id) } {
                    td { (job_link(&j.id)) }
                    td { (time_ms(j.created_at_ms)) }
                    td { (badge(&j.status)) }
                    td { (account_link(&j.account)) }
                    td { (j.model) }
                    td {
                        @match &j.adapter {
                            Some(a) => (short(a)),
                            None => "—",
                        }
                    }
                    td { (text_opt(j.tier.as_deref())) }
                    td { (text_opt(j.bundle_id.as_deref())) }
                    td {
                        @match &j.provider_key_hash {
                            Some(k) => (provider_link(k)),
                            None => "—",
                        }
                    }
                    td { (wei(j.charged_wei.as_deref().unwrap_or(&j.held_wei))) }
                    td {
                        @match j.batch_id {
                            Some(b) => (batch_link(b)),
                            None => "—",
                        }
                    }
                }
            }
        })
        .collect();
    let columns = [
        "job",
        "accepted",
        "status",
        "account",
        "model",
        "adapter",
        "tier",
        "bundle",
        "provider",
        "charged / held",
        "batch",
    ];
    table(id, &columns, &rows, "no jobs match")
}

/// A filter's text field, holding the value the list is filtered by.
fn input(name: &str, value: Option<&str>, placeholder: &str) -> Markup {
    html! {
        input name=(name) id={ "filter-" (name) } value=(value.unwrap_or("")) placeholder=(placeholder);
    }
}

/// A filter's choice among `options`, or any.
fn select(name: &str, value: Option<&str>, options: &[&str]) -> Markup {
    html! {
        select name=(name) id={ "filter-" (name) } {
            option value="" { "any " (name) }
            @for o in options {
                option value=(o) selected[value == Some(*o)] { (o) }
            }
        }
    }
}

/// The page.
pub(crate) fn render(p: &JobsPage) -> Markup {
    let f = &p.filter;
    let body = html! {
        form class="filters" id="filters" method="get" action="/explorer/jobs" {
            (input("account", f.account.map(|a| a.to_string()).as_deref(), "account 0x…"))
            (input(
                "provider",
                f.provider.map(|a| a.to_string()).as_deref(),
                "provider key hash 0x…",
            ))
            (input("model", f.model.as_deref(), "model"))
            (input("adapter", f.adapter.as_deref(), "adapter id"))
            (select("tier", f.tier.as_deref(), &TIERS))
            (select("status", f.status.as_deref(), &STATUSES))
            input name="limit" id="filter-limit" type="number" min="1" max=(MAX_LIMIT) value=(p.limit);
            button type="submit" { "filter" }
            " "
            a href="/explorer/jobs" { "clear" }
        }
        (jobs_table("jobs", &p.jobs))
        (pager(p.prev.as_deref(), p.next.as_deref()))
        p.note {
            "Status: the job's own state, or " b { "batched" } " once its receipt is in a \
             settlement batch and " b { "settled" } " once that batch is posted on the job's chain."
        }
    };
    layout::page("Jobs", "jobs", body)
}
