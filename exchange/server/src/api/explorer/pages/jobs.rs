//! `/explorer/jobs`: jobs newest first, filtered by account, provider, model, adapter, tier and
//! status, paged by number or by the `before` cursor.

use super::{account_link, batch_link, job_link, pager, provider_link, text_opt, wei};
use crate::api::explorer::html::{self, Html, Table, badge, esc, query_value, time_ms};
use crate::api::explorer::params::{Before, JobFilter, MAX_LIMIT, Paging, STATUSES, TIERS};
use crate::api::explorer::queries::jobs::{JobList, JobSummary};
use alloy::primitives::B256;
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
pub(crate) fn table(id: &str, jobs: &[JobSummary]) -> Html {
    let mut t = Table::new(
        id,
        &[
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
        ],
    );
    for j in jobs {
        t.row(
            Some(&format!("job-{}", j.id)),
            vec![
                job_link(&j.id),
                Html::text(&time_ms(j.created_at_ms)),
                badge(&j.status),
                account_link(&j.account),
                Html::text(&j.model),
                j.adapter.as_deref().map_or(Html::text("—"), html::short),
                text_opt(j.tier.as_deref()),
                text_opt(j.bundle_id.as_deref()),
                j.provider_key_hash
                    .as_deref()
                    .map_or(Html::text("—"), provider_link),
                wei(j.charged_wei.as_deref().unwrap_or(&j.held_wei)),
                j.batch_id.map_or(Html::text("—"), batch_link),
            ],
        );
    }
    t.finish("no jobs match")
}

fn input(name: &str, value: Option<&str>, placeholder: &str) -> Html {
    Html::raw(format!(
        "<input name=\"{}\" id=\"filter-{}\" value=\"{}\" placeholder=\"{}\">",
        esc(name),
        esc(name),
        esc(value.unwrap_or("")),
        esc(placeholder)
    ))
}

fn select(name: &str, value: Option<&str>, options: &[&str]) -> Html {
    let mut out = Html::raw(format!(
        "<select name=\"{}\" id=\"filter-{}\"><option value=\"\">any {}</option>",
        esc(name),
        esc(name),
        esc(name)
    ));
    for o in options {
        let selected = if value == Some(*o) { " selected" } else { "" };
        out.lit(&format!(
            "<option value=\"{}\"{selected}>{}</option>",
            esc(o),
            esc(o)
        ));
    }
    out.lit("</select>");
    out
}

/// The page.
pub(crate) fn render(p: &JobsPage) -> String {
    let f = &p.filter;
    let mut body = Html::raw(
        "<form class=\"filters\" id=\"filters\" method=\"get\" action=\"/explorer/jobs\">",
    );
    body.push(&input(
        "account",
        f.account.map(|a| a.to_string()).as_deref(),
        "account 0x…",
    ));
    body.push(&input(
        "provider",
        f.provider.map(|a| a.to_string()).as_deref(),
        "provider key hash 0x…",
    ));
    body.push(&input("model", f.model.as_deref(), "model"));
    body.push(&input("adapter", f.adapter.as_deref(), "adapter id"));
    body.push(&select("tier", f.tier.as_deref(), &TIERS));
    body.push(&select("status", f.status.as_deref(), &STATUSES));
    body.lit(&format!(
        "<input name=\"limit\" id=\"filter-limit\" type=\"number\" min=\"1\" max=\"{MAX_LIMIT}\" value=\"{}\">",
        p.limit
    ));
    body.lit("<button type=\"submit\">filter</button> <a href=\"/explorer/jobs\">clear</a></form>");
    body.push(&table("jobs", &p.jobs));
    body.push(&pager(p.prev.as_deref(), p.next.as_deref()));
    body.lit(
        "<p class=\"note\">Status: the job's own state, or <b>batched</b> once its receipt is in a \
         settlement batch and <b>settled</b> once that batch is posted on the job's chain.</p>",
    );
    html::page("Jobs", "jobs", &body)
}
