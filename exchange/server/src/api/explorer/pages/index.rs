//! `/explorer`: how many jobs are in each state, the latest jobs and batches, and where to go.

use super::batches::batches_table;
use super::jobs::jobs_table;
use crate::api::explorer::format::{id_token, query_value};
use crate::api::explorer::html::section;
use crate::api::explorer::layout;
use crate::api::explorer::queries::jobs::JobSummary;
use crate::api::explorer::queries::settlement::BatchSummary;
use maud::{Markup, html};
use serde::Serialize;

/// How many jobs show one status.
#[derive(Debug, Serialize)]
pub(crate) struct StatusCount {
    /// The status shown.
    pub(crate) status: String,
    /// Jobs in it.
    pub(crate) jobs: i64,
}

/// The index's data.
#[derive(Debug, Serialize)]
pub(crate) struct IndexPage {
    /// Jobs per shown status.
    pub(crate) statuses: Vec<StatusCount>,
    /// The newest jobs.
    pub(crate) recent_jobs: Vec<JobSummary>,
    /// The newest batches.
    pub(crate) recent_batches: Vec<BatchSummary>,
}

/// The page.
pub(crate) fn render(p: &IndexPage) -> Markup {
    let total: i64 = p.statuses.iter().map(|c| c.jobs).sum();
    let body = html! {
        div class="cards" id="status-counts" {
            a class="card" id="count-all" href="/explorer/jobs" { b { (total) } "jobs" }
            @for StatusCount { status, jobs } in &p.statuses {
                a class="card" id={ "count-" (id_token(status)) }
                    href={ "/explorer/jobs?status=" (query_value(status)) } {
                    b { (jobs) }
                    (status)
                }
            }
        }
        (section("recent-jobs", "Latest jobs", jobs_table("recent-jobs", &p.recent_jobs)))
        (section(
            "recent-batches",
            "Latest batches",
            batches_table("recent-batches", &p.recent_batches),
        ))
    };
    layout::page("Explorer", "index", body)
}
