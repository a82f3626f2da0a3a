//! `/explorer/accounts` and `/explorer/accounts/{address}`: an account's binding, its tabs
//! (amount, held, spent, settled, open), standing orders and what it can claim.

use super::{account_link, batch_link, page_links, pager, wei};
use crate::api::explorer::format::{query_value, time_ms, time_s};
use crate::api::explorer::html::{badge, code, section, short, table};
use crate::api::explorer::layout;
use crate::api::explorer::queries::accounts::{AccountDetail, AccountSummary};
use maud::{Markup, html};
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
pub(crate) fn render_list(p: &AccountsPage) -> Markup {
    let rows: Vec<Markup> = p
        .accounts
        .iter()
        .map(|a| {
            html! {
                tr id={ "account-" (a.account) } {
                    td { (account_link(&a.account)) }
                    td { (a.tabs) }
                    td { (wei(&a.amount_wei)) }
                    td { (a.jobs) }
                }
            }
        })
        .collect();
    let (prev, next) = page_links("/explorer/accounts", p.page, p.more);
    let body = html! {
        (table("accounts", &["account", "tabs", "amount", "jobs"], &rows, "no account has opened a tab"))
        (pager(prev.as_deref(), next.as_deref()))
    };
    layout::page("Accounts", "accounts", body)
}

/// One account's page.
pub(crate) fn render_one(p: &AccountDetail) -> Markup {
    let tabs: Vec<Markup> = p
        .tabs
        .iter()
        .map(|t| {
            html! {
                tr id={ "tab-" (t.chain_id) "-" (t.escrow_id) } {
                    td { (t.chain_id) }
                    td { (t.escrow_id) }
                    td { span.amount { (wei(&t.amount_wei)) } }
                    td { span.held { (wei(&t.held_wei)) } }
                    td { span.spent { (wei(&t.spent_wei)) } }
                    td { span.settled { (wei(&t.settled_wei)) } }
                    td {
                        (badge(&t.status))
                        @if let (Some(at), Some(n)) = (t.submitted_at_ms, t.jobs_paid) {
                            " (" (n) " jobs sent to settlement " (time_ms(at)) ")"
                        }
                    }
                    td { (time_s(u64::try_from(t.deadline_s).unwrap_or(0))) }
                    td { (t.jobs) }
                    td { (t.open_jobs) }
                }
            }
        })
        .collect();
    let standing: Vec<Markup> = p
        .standing_orders
        .iter()
        .map(|s| {
            html! {
                tr {
                    td { (short(&s.id)) }
                    td { (s.kind) }
                    td { (badge(&s.status)) }
                    td { (wei(&s.held_wei)) }
                    td { (time_s(u64::try_from(s.ends_s).unwrap_or(0))) }
                }
            }
        })
        .collect();
    let claims: Vec<Markup> = p
        .claims
        .iter()
        .map(|c| {
            html! {
                tr id={ "claim-" (c.chain_id) } {
                    td { (c.chain_id) }
                    td { (batch_link(c.batch_id)) }
                    td { (c.nonce) }
                    td { (wei(&c.cumulative_wei)) }
                }
            }
        })
        .collect();
    let tab_columns = [
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
    ];
    let body = html! {
        dl #summary {
            dt { "account" } dd #address { (code(&p.account)) }
            dt { "ML-DSA key bound" }
            dd #binding {
                @if let (Some(k), Some(at)) = (&p.mldsa_key_hash, p.bound_at_ms) {
                    (short(k)) " since " (time_ms(at))
                } @else {
                    "not bound"
                }
            }
        }
        p {
            a id="account-jobs" href={ "/explorer/jobs?account=" (query_value(&p.account)) } {
                "this account's jobs"
            }
        }
        (section("tabs", "Tabs", table("tabs", &tab_columns, &tabs, "no tabs")))
        (section(
            "standing-orders",
            "Standing orders (reserves, rents, searches)",
            table("standing-orders", &["order", "kind", "status", "held", "ends"], &standing, "none"),
        ))
        (section("preference", "Market preference", html! {
            @if let Some(pref) = &p.preference {
                (table(
                    "preference",
                    &["regime", "bias (log ×)", "scale (log ×)", "quote × (cells below / above)"],
                    &pref.layers.iter().map(|(regime, bias, scale)| html! {
                        tr {
                            td { (regime) }
                            td { (format!("{bias:+.3}")) }
                            td { (format!("{scale:.3}")) }
                            td { (format!("{:.3} / {:.3}", (bias - scale).exp(), (bias + scale).exp())) }
                        }
                    }).collect::<Vec<_>>(),
                    "none",
                ))
                p.note {
                    "Learned from " (pref.observations) " of this account's market orders (\"max_price_wei\": \
                     \"market\"): one sign bit per model × deadline bucket and a scale and bias per \
                     regime, " (pref.bytes) " bytes. Its market orders are quoted the shared quote \
                     times e^(bias ± scale); no other account's quote moves."
                }
            } @else {
                p.note { "None yet: this account's market orders get the shared quote." }
            }
        }))
        (section("claims", "Claims", html! {
            (table(
                "claims",
                &["chain", "latest posted batch", "nonce", "cumulative balance"],
                &claims,
                "nothing to claim: no posted batch credits this account yet",
            ))
            p.note {
                "A batch credits each party a cumulative balance; the Escrow pays out the part \
                 not yet withdrawn against a Merkle proof (" code { "cx agent claim" } "). \
                 Withdrawals happen on chain and are not tracked here."
            }
        }))
    };
    layout::page(&format!("Account {}", p.account), "accounts", body)
}
