//! `/explorer/accounts` and `/explorer/accounts/{address}`: an account's binding, its tabs
//! (amount, held, spent, settled, open), standing orders and what it can claim.

use super::{account_link, batch_link, page_links, pager, wei};
use crate::api::explorer::html::{self, Dl, Html, Table, badge, esc, query_value, time_ms, time_s};
use crate::api::explorer::queries::accounts::{AccountDetail, AccountSummary};
use serde::Serialize;

/// The accounts list's data.
#[derive(Debug, Serialize)]
pub(crate) struct AccountsPage {
    /// Accounts with tabs, by address.
    pub(crate) accounts: Vec<AccountSummary>,
    /// The page number.
    pub(crate) page: u32,
    /// Whether another page follows.
    pub(crate) more: bool,
}

/// The list page.
pub(crate) fn render_list(p: &AccountsPage) -> String {
    let mut t = Table::new("accounts", &["account", "tabs", "amount", "jobs"]);
    for a in &p.accounts {
        t.row(
            Some(&format!("account-{}", a.account)),
            vec![
                account_link(&a.account),
                Html::text(&a.tabs.to_string()),
                wei(&a.amount_wei),
                Html::text(&a.jobs.to_string()),
            ],
        );
    }
    let mut body = t.finish("no account has opened a tab");
    let (prev, next) = page_links("/explorer/accounts", p.page, p.more);
    body.push(&pager(prev.as_deref(), next.as_deref()));
    html::page("Accounts", "accounts", &body)
}

/// One account's page.
pub(crate) fn render_one(p: &AccountDetail) -> String {
    let mut dl = Dl::new();
    dl.html(Some("address"), "account", html::code(&p.account))
        .html(
            Some("binding"),
            "ML-DSA key bound",
            match (&p.mldsa_key_hash, p.bound_at_ms) {
                (Some(k), Some(at)) => {
                    let mut h = html::short(k);
                    h.push_text(&format!(" since {}", time_ms(at)));
                    h
                }
                _ => Html::text("not bound"),
            },
        );
    let mut body = dl.finish(Some("summary"));
    body.lit(&format!(
        "<p><a id=\"account-jobs\" href=\"/explorer/jobs?account={}\">this account's jobs</a></p>",
        esc(&query_value(&p.account))
    ));

    let mut tabs = Table::new(
        "tabs",
        &[
            "chain",
            "tab",
            "amount",
            "held now",
            "spent",
            "settled",
            "status",
            "reclaimable from",
            "jobs",
            "open jobs",
        ],
    );
    for t in &p.tabs {
        tabs.row(
            Some(&format!("tab-{}-{}", t.chain_id, t.escrow_id)),
            vec![
                Html::text(&t.chain_id.to_string()),
                Html::text(&t.escrow_id.to_string()),
                Html::raw(format!(
                    "<span class=\"amount\">{}</span>",
                    wei(&t.amount_wei).as_str()
                )),
                Html::raw(format!(
                    "<span class=\"held\">{}</span>",
                    wei(&t.held_wei).as_str()
                )),
                Html::raw(format!(
                    "<span class=\"spent\">{}</span>",
                    wei(&t.spent_wei).as_str()
                )),
                Html::raw(format!(
                    "<span class=\"settled\">{}</span>",
                    wei(&t.settled_wei).as_str()
                )),
                {
                    let mut status = badge(&t.status);
                    if let (Some(at), Some(n)) = (t.submitted_at_ms, t.jobs_paid) {
                        status
                            .push_text(&format!(" ({n} jobs sent to settlement {})", time_ms(at)));
                    }
                    status
                },
                Html::text(&time_s(u64::try_from(t.deadline_s).unwrap_or(0))),
                Html::text(&t.jobs.to_string()),
                Html::text(&t.open_jobs.to_string()),
            ],
        );
    }
    body.push(&html::section("tabs", "Tabs", &tabs.finish("no tabs")));

    let mut standing = Table::new(
        "standing-orders",
        &["order", "kind", "status", "held", "ends"],
    );
    for s in &p.standing_orders {
        standing.row(
            None,
            vec![
                html::short(&s.id),
                Html::text(&s.kind),
                badge(&s.status),
                wei(&s.held_wei),
                Html::text(&time_s(u64::try_from(s.ends_s).unwrap_or(0))),
            ],
        );
    }
    body.push(&html::section(
        "standing-orders",
        "Standing orders (reserves, rents, searches)",
        &standing.finish("none"),
    ));

    let mut claims = Table::new(
        "claims",
        &[
            "chain",
            "latest posted batch",
            "nonce",
            "cumulative balance",
        ],
    );
    for c in &p.claims {
        claims.row(
            Some(&format!("claim-{}", c.chain_id)),
            vec![
                Html::text(&c.chain_id.to_string()),
                batch_link(c.batch_id),
                Html::text(&c.nonce.to_string()),
                wei(&c.cumulative_wei),
            ],
        );
    }
    let mut claims_html =
        claims.finish("nothing to claim: no posted batch credits this account yet");
    claims_html.lit(
        "<p class=\"note\">A batch credits each party a cumulative balance; the Escrow pays out \
         the part not yet withdrawn against a Merkle proof (<code>cx agent claim</code>). \
         Withdrawals happen on chain and are not tracked here.</p>",
    );
    body.push(&html::section("claims", "Claims", &claims_html));
    html::page(&format!("Account {}", p.account), "accounts", &body)
}
