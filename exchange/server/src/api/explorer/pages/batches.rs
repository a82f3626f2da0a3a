//! `/explorer/batches` and `/explorer/batches/{id}`: settlement batches, their parts on each
//! chain, gas, the signers that signed, and the jobs they settle.

use super::{batch_link, job_link, pager, tx_cell, wei_opt};
use crate::api::explorer::format::time_ms;
use crate::api::explorer::html::{badge, code, section, short, short_link, table};
use crate::api::explorer::layout;
use crate::api::explorer::params::Paging;
use crate::api::explorer::queries::settlement::{
    BATCH_JOBS_SHOWN, BatchDetail, BatchSummary, Part, Step,
};
use crate::api::state::ExplorerConfig;
use maud::{Markup, html};
use serde::Serialize;

fn link_parts<'a>(parts: impl Iterator<Item = &'a mut Part>, config: &ExplorerConfig) {
    for part in parts {
        part.tx_url = part
            .tx_hash
            .as_deref()
            .and_then(|h| config.tx_url(part.chain_id, h));
    }
}

/// The batches list's data.
#[derive(Debug, Serialize)]
pub(crate) struct BatchesPage {
    /// The batches, newest first.
    pub(crate) batches: Vec<BatchSummary>,
    /// The next (older) page.
    pub(crate) next: Option<String>,
}

impl BatchesPage {
    pub(crate) fn new(
        mut batches: Vec<BatchSummary>,
        more: bool,
        paging: Paging,
        config: &ExplorerConfig,
    ) -> Self {
        link_parts(batches.iter_mut().flat_map(|b| b.parts.iter_mut()), config);
        let next = match batches.last() {
            Some(last) if more => Some(format!(
                "/explorer/batches?before={}&limit={}",
                last.id, paging.limit
            )),
            _ => None,
        };
        Self { batches, next }
    }
}

/// One batch's data.
#[derive(Debug, Serialize)]
pub(crate) struct BatchPage {
    /// The batch.
    #[serde(flatten)]
    pub(crate) batch: BatchDetail,
}

impl BatchPage {
    pub(crate) fn new(mut batch: BatchDetail, config: &ExplorerConfig) -> Self {
        link_parts(batch.summary.parts.iter_mut(), config);
        Self { batch }
    }
}

fn gas_text(gas: Option<u64>) -> String {
    gas.map_or_else(|| "not recorded".to_owned(), |g| g.to_string())
}

/// The batches table (shared with the index).
pub(crate) fn batches_table(id: &str, batches: &[BatchSummary]) -> Markup {
    let rows: Vec<Markup> = batches
        .iter()
        .map(|b| {
            html! {
                tr id={ "batch-" (b.id) } {
                    td { (batch_link(b.id)) }
                    td { (time_ms(b.created_at_ms)) }
                    td { (b.size) }
                    td { (badge(&b.status)) }
                    td {
                        @for p in &b.parts {
                            (p.chain_id) " (#" (p.nonce) ") " (badge(&p.status)) br;
                        }
                    }
                    td {
                        @for p in &b.parts {
                            @match (&p.tx_hash, &p.tx_url) {
                                (Some(h), Some(u)) => (short_link(u, h)),
                                (Some(h), None) => (short(h)),
                                (None, _) => "—",
                            }
                            br;
                        }
                    }
                    td { (gas_text(b.gas_used)) }
                }
            }
        })
        .collect();
    let columns = [
        "batch",
        "built",
        "jobs",
        "status",
        "chains (nonce)",
        "transactions",
        "gas",
    ];
    table(id, &columns, &rows, "no batches yet")
}

/// The steps table (shared with the job page).
pub(crate) fn steps_table(steps: &[Step]) -> Markup {
    let rows: Vec<Markup> = steps
        .iter()
        .map(|s| {
            html! {
                tr {
                    td { (time_ms(s.at_ms)) }
                    td {
                        @match s.chain_id {
                            Some(c) => (c),
                            None => "all",
                        }
                    }
                    td { (code(&s.step)) }
                    td { (s.detail) }
                }
            }
        })
        .collect();
    table(
        "steps",
        &["when", "chain", "step", "detail"],
        &rows,
        "no steps recorded",
    )
}

/// The list page.
pub(crate) fn render_list(p: &BatchesPage) -> Markup {
    let body = html! {
        (batches_table("batches", &p.batches))
        (pager(None, p.next.as_deref()))
    };
    layout::page("Batches", "batches", body)
}

/// One batch's page.
pub(crate) fn render_one(p: &BatchPage) -> Markup {
    let b = &p.batch;
    let s = &b.summary;
    let chains: Vec<String> = s.parts.iter().map(|p| p.chain_id.to_string()).collect();
    let parts: Vec<Markup> = s
        .parts
        .iter()
        .map(|part| {
            html! {
                tr id={ "part-" (part.chain_id) } {
                    td { (part.chain_id) }
                    td { (part.nonce) }
                    td { (badge(&part.status)) }
                    td { (part.receipts) }
                    td { (short(&part.digest)) }
                    td { (tx_cell(part)) }
                    td { (gas_text(part.gas_used)) }
                    td { (time_ms(part.updated_at_ms)) }
                }
            }
        })
        .collect();
    let jobs: Vec<Markup> = b
        .jobs
        .iter()
        .map(|j| {
            html! {
                tr id={ "job-" (j.job_id) } {
                    td { (job_link(&j.job_id)) }
                    td { (j.chain_id) }
                    td { (j.escrow_id) }
                    td { (wei_opt(j.amount_owed_wei.as_deref())) }
                }
            }
        })
        .collect();
    let part_columns = [
        "chain",
        "nonce",
        "status",
        "receipts",
        "digest",
        "transaction",
        "gas",
        "updated",
    ];
    let body = html! {
        dl #summary {
            dt { "status" } dd #status { (badge(&s.status)) }
            dt { "jobs" } dd #batch-size { (s.size) }
            dt { "gas" } dd #gas { (gas_text(s.gas_used)) }
            dt { "gas per job" } dd #gas-per-job { (gas_text(b.gas_per_job)) }
            dt { "signers that signed" }
            dd #signers {
                @if b.signers.is_empty() {
                    "not named in the coordinator's steps"
                } @else {
                    (b.signers.join(", "))
                }
            }
            dt { "chains" } dd #chains { (chains.join(", ")) }
            dt { "built" } dd { (time_ms(s.created_at_ms)) }
        }
        (section("parts", "Parts (one per chain)", table("parts", &part_columns, &parts, "no parts")))
        (section("jobs", "Jobs settled", html! {
            (table("jobs", &["job", "chain", "tab", "charged"], &jobs, "no jobs"))
            @if b.jobs.len() as i64 >= BATCH_JOBS_SHOWN {
                p.note { "the first " (BATCH_JOBS_SHOWN) " of " (s.size) " jobs" }
            }
        }))
        (section("steps", "Steps", steps_table(&b.steps)))
    };
    layout::page(&format!("Batch {}", s.id), "batches", body)
}
