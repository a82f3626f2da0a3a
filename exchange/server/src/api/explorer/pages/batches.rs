//! `/explorer/batches` and `/explorer/batches/{id}`: settlement batches, their parts on each
//! chain, gas, the signers that signed, and the jobs they settle.

use super::{batch_link, job_link, pager, tx_cell, wei_opt};
use crate::api::explorer::html::{self, Dl, Html, Table, badge, time_ms};
use crate::api::explorer::params::Paging;
use crate::api::explorer::queries::settlement::{
    BATCH_JOBS_SHOWN, BatchDetail, BatchSummary, Part, Step,
};
use crate::api::state::ExplorerConfig;
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
pub(crate) fn table(id: &str, batches: &[BatchSummary]) -> Html {
    let mut t = Table::new(
        id,
        &[
            "batch",
            "built",
            "jobs",
            "status",
            "chains (nonce)",
            "transactions",
            "gas",
        ],
    );
    for b in batches {
        let mut chains = Html::default();
        let mut txs = Html::default();
        for p in &b.parts {
            chains.push_text(&format!("{} (#{}) ", p.chain_id, p.nonce));
            chains.push(&badge(&p.status));
            chains.lit("<br>");
            txs.push(&match &p.tx_hash {
                Some(h) => match &p.tx_url {
                    Some(u) => html::short_link(u, h),
                    None => html::short(h),
                },
                None => Html::text("—"),
            });
            txs.lit("<br>");
        }
        t.row(
            Some(&format!("batch-{}", b.id)),
            vec![
                batch_link(b.id),
                Html::text(&time_ms(b.created_at_ms)),
                Html::text(&b.size.to_string()),
                badge(&b.status),
                chains,
                txs,
                Html::text(&gas_text(b.gas_used)),
            ],
        );
    }
    t.finish("no batches yet")
}

/// The steps table (shared with the job page).
pub(crate) fn steps_table(steps: &[Step]) -> Html {
    let mut t = Table::new("steps", &["when", "chain", "step", "detail"]);
    for s in steps {
        t.row(
            None,
            vec![
                Html::text(&time_ms(s.at_ms)),
                Html::text(
                    &s.chain_id
                        .map_or_else(|| "all".to_owned(), |c| c.to_string()),
                ),
                html::code(&s.step),
                Html::text(&s.detail),
            ],
        );
    }
    t.finish("no steps recorded")
}

/// The list page.
pub(crate) fn render_list(p: &BatchesPage) -> String {
    let mut body = table("batches", &p.batches);
    body.push(&pager(None, p.next.as_deref()));
    html::page("Batches", "batches", &body)
}

/// One batch's page.
pub(crate) fn render_one(p: &BatchPage) -> String {
    let b = &p.batch;
    let s = &b.summary;
    let mut dl = Dl::new();
    let chains: Vec<String> = s.parts.iter().map(|p| p.chain_id.to_string()).collect();
    dl.html(Some("status"), "status", badge(&s.status))
        .text(Some("batch-size"), "jobs", &s.size.to_string())
        .text(Some("gas"), "gas", &gas_text(s.gas_used))
        .text(Some("gas-per-job"), "gas per job", &gas_text(b.gas_per_job))
        .text(
            Some("signers"),
            "signers that signed",
            &if b.signers.is_empty() {
                "not named in the coordinator's steps".to_owned()
            } else {
                b.signers.join(", ")
            },
        )
        .text(Some("chains"), "chains", &chains.join(", "))
        .text(None, "built", &time_ms(s.created_at_ms));
    let mut body = dl.finish(Some("summary"));

    let mut parts = Table::new(
        "parts",
        &[
            "chain",
            "nonce",
            "status",
            "receipts",
            "digest",
            "transaction",
            "gas",
            "updated",
        ],
    );
    for part in &s.parts {
        parts.row(
            Some(&format!("part-{}", part.chain_id)),
            vec![
                Html::text(&part.chain_id.to_string()),
                Html::text(&part.nonce.to_string()),
                badge(&part.status),
                Html::text(&part.receipts.to_string()),
                html::short(&part.digest),
                tx_cell(part),
                Html::text(&gas_text(part.gas_used)),
                Html::text(&time_ms(part.updated_at_ms)),
            ],
        );
    }
    body.push(&html::section(
        "parts",
        "Parts (one per chain)",
        &parts.finish("no parts"),
    ));

    let mut jobs = Table::new("jobs", &["job", "chain", "tab", "charged"]);
    for j in &b.jobs {
        jobs.row(
            Some(&format!("job-{}", j.job_id)),
            vec![
                job_link(&j.job_id),
                Html::text(&j.chain_id.to_string()),
                Html::text(&j.escrow_id.to_string()),
                wei_opt(j.amount_owed_wei.as_deref()),
            ],
        );
    }
    let mut jobs_html = jobs.finish("no jobs");
    if b.jobs.len() as i64 >= BATCH_JOBS_SHOWN {
        jobs_html.lit(&format!(
            "<p class=\"note\">the first {BATCH_JOBS_SHOWN} of {} jobs</p>",
            s.size
        ));
    }
    body.push(&html::section("jobs", "Jobs settled", &jobs_html));
    body.push(&html::section("steps", "Steps", &steps_table(&b.steps)));
    html::page(&format!("Batch {}", s.id), "batches", &body)
}
