//! One module per page: the data a page shows (what its JSON is) and how it renders. The links
//! every page shares are here.

pub(crate) mod accounts;
pub(crate) mod batches;
pub(crate) mod index;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod markets;
pub(crate) mod providers;

use super::format::id_token;
use super::html::{code, short, short_link};
use super::layout;
use super::queries::settlement::Part;
use axum::http::StatusCode;
use maud::{Markup, html};

/// The HTML page of an error: its status, code and message.
pub(crate) fn error_page(status: StatusCode, code: &str, message: &str) -> Markup {
    let title = format!(
        "{} {}",
        status.as_str(),
        status.canonical_reason().unwrap_or("error")
    );
    let body = html! {
        dl #error {
            dt { "status" } dd #error-status { (status.as_str()) }
            dt { "code" } dd #error-code { (code) }
            dt { "message" } dd #error-message { (message) }
        }
        p.note { a href="/explorer" { "back to the explorer" } }
    };
    layout::page(&title, "error", body)
}

/// `/explorer/jobs/{id}`.
pub(crate) fn job_href(id: &str) -> String {
    format!("/explorer/jobs/{id}")
}

/// A link to a job, its id shortened.
pub(crate) fn job_link(id: &str) -> Markup {
    html! { a class="job-link" href=(job_href(id)) { (short(id)) } }
}

/// A link to a provider, its key hash shortened.
pub(crate) fn provider_link(key_hash: &str) -> Markup {
    html! { a class="provider-link" href={ "/explorer/providers/" (key_hash) } { (short(key_hash)) } }
}

/// A link to an account, shortened.
pub(crate) fn account_link(account: &str) -> Markup {
    short_link(&format!("/explorer/accounts/{account}"), account)
}

/// A link to a batch.
pub(crate) fn batch_link(id: i64) -> Markup {
    html! { a class="batch-link" href={ "/explorer/batches/" (id) } { "batch " (id) } }
}

/// An amount in wei.
pub(crate) fn wei(amount: &str) -> Markup {
    html! { (amount) " wei" }
}

/// An optional amount in wei.
pub(crate) fn wei_opt(amount: Option<&str>) -> Markup {
    amount.map_or_else(|| html! { "—" }, wei)
}

/// Text, or a dash.
pub(crate) fn text_opt(text: Option<&str>) -> &str {
    text.unwrap_or("—")
}

/// A part's transaction hash, linked to its chain's explorer if it has one, in an element with
/// the id `tx-<chain id>` a browser test finds.
pub(crate) fn tx_cell(part: &Part) -> Markup {
    let id = format!("tx-{}", part.chain_id);
    match (&part.tx_hash, &part.tx_url) {
        (Some(hash), Some(url)) => html! { a id=(id) class="tx" href=(url) { code { (hash) } } },
        (Some(hash), None) => html! { code id=(id) class="tx" { (hash) } },
        (None, _) if part.status == "posted" => html! {
            span id=(id) class="note" { "posted (found on chain; no transaction of ours)" }
        },
        (None, _) => html! { span id=(id) class="note" { "not posted yet" } },
    }
}

/// The pager of a list: a link to the previous page and to the next (`next` is the URL).
pub(crate) fn pager(prev: Option<&str>, next: Option<&str>) -> Markup {
    html! {
        div.pager {
            @if let Some(p) = prev { a #prev-page href=(p) { "← newer" } }
            @if let Some(n) = next { a #next-page href=(n) { "older →" } }
        }
    }
}

/// `?page=` links of a list that pages by number.
pub(crate) fn page_links(base: &str, page: u32, more: bool) -> (Option<String>, Option<String>) {
    let prev = (page > 1).then(|| format!("{base}?page={}", page - 1));
    let next = more.then(|| format!("{base}?page={}", page + 1));
    (prev, next)
}

/// A JSON object's members as a definition list: scalars as text, the rest as compact JSON.
pub(crate) fn json_fields(value: &serde_json::Value, id_prefix: &str) -> Markup {
    let Some(map) = value.as_object() else {
        return code(&value.to_string());
    };
    html! {
        dl {
            @for (k, v) in map {
                dt { (k) }
                dd id={ (id_prefix) (id_token(k)) } { (json_value(v)) }
            }
        }
    }
}

/// One member's value for [`json_fields`]: a string as itself, null as a dash, the rest as
/// compact JSON cut at 300 bytes.
fn json_value(v: &serde_json::Value) -> Markup {
    match v {
        serde_json::Value::String(s) => code(s),
        serde_json::Value::Null => html! { "—" },
        serde_json::Value::Bool(_) | serde_json::Value::Number(_) => code(&v.to_string()),
        _ => {
            let text = v.to_string();
            if text.len() > 300 {
                code(&format!("{}…", &text[..text.floor_char_boundary(300)]))
            } else {
                code(&text)
            }
        }
    }
}
