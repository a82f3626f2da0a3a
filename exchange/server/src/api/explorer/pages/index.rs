//! `/explorer`: how many jobs are in each state, the latest jobs and batches, and where to go.

use super::batches;
use crate::api::explorer::html::{self, Html, esc, query_value};
use crate::api::explorer::queries::jobs::JobSummary;
use crate::api::explorer::queries::settlement::BatchSummary;
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
pub(crate) fn render(p: &IndexPage) -> String {
    let mut body = Html::raw("<div class=\"cards\" id=\"status-counts\">");
    let total: i64 = p.statuses.iter().map(|c| c.jobs).sum();
    body.lit(&format!(
        "<a class=\"card\" id=\"count-all\" href=\"/explorer/jobs\"><b>{total}</b>jobs</a>"
    ));
    for StatusCount { status, jobs: n } in &p.statuses {
        body.lit(&format!(
            "<a class=\"card\" id=\"count-{}\" href=\"/explorer/jobs?status={}\"><b>{n}</b>{}</a>",
            esc(&html::id_token(status)),
            esc(&query_value(status)),
            esc(status)
        ));
    }
    body.lit("</div>");
    body.push(&html::section(
        "recent-jobs",
        "Latest jobs",
        &super::jobs::table("recent-jobs", &p.recent_jobs),
    ));
    body.push(&html::section(
        "recent-batches",
        "Latest batches",
        &batches::table("recent-batches", &p.recent_batches),
    ));
    html::page("Explorer", "index", &body)
}
