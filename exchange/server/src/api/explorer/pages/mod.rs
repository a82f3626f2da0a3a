//! One module per page: the data a page shows (what its JSON is) and how it renders. The links
//! every page shares are here.

pub(crate) mod accounts;
pub(crate) mod batches;
pub(crate) mod index;
pub(crate) mod job;
pub(crate) mod jobs;
pub(crate) mod markets;
pub(crate) mod providers;

use super::html::{self, Dl, Html, esc, link_with, short_link};
use super::queries::settlement::Part;
use axum::http::StatusCode;

/// The HTML page of an error: its status, code and message.
pub(crate) fn error_page(status: StatusCode, code: &str, message: &str) -> String {
    let mut body = Html::default();
    let mut dl = Dl::new();
    dl.text(Some("error-status"), "status", status.as_str())
        .text(Some("error-code"), "code", code)
        .text(Some("error-message"), "message", message);
    body.push(&dl.finish(Some("error")));
    body.push(&Html::raw(
        "<p class=\"note\"><a href=\"/explorer\">back to the explorer</a></p>",
    ));
    let title = format!(
        "{} {}",
        status.as_str(),
        status.canonical_reason().unwrap_or("error")
    );
    html::page(&title, "error", &body)
}

/// `/explorer/jobs/{id}`.
pub(crate) fn job_href(id: &str) -> String {
    format!("/explorer/jobs/{id}")
}

/// A link to a job, its id shortened.
pub(crate) fn job_link(id: &str) -> Html {
    Html::raw(format!(
        "<a class=\"job-link\" href=\"{}\">{}</a>",
        esc(&job_href(id)),
        html::short(id).as_str()
    ))
}

/// A link to a provider, its key hash shortened.
pub(crate) fn provider_link(key_hash: &str) -> Html {
    Html::raw(format!(
        "<a class=\"provider-link\" href=\"/explorer/providers/{}\">{}</a>",
        esc(key_hash),
        html::short(key_hash).as_str()
    ))
}

/// A link to an account, shortened.
pub(crate) fn account_link(account: &str) -> Html {
    short_link(&format!("/explorer/accounts/{account}"), account)
}

/// A link to a batch.
pub(crate) fn batch_link(id: i64) -> Html {
    link_with(
        "class",
        "batch-link",
        &format!("/explorer/batches/{id}"),
        &format!("batch {id}"),
    )
}

/// An amount in wei.
pub(crate) fn wei(amount: &str) -> Html {
    Html::raw(format!("{} wei", esc(amount)))
}

/// An optional amount in wei.
pub(crate) fn wei_opt(amount: Option<&str>) -> Html {
    amount.map_or_else(|| Html::text("—"), wei)
}

/// Text, or a dash.
pub(crate) fn text_opt(text: Option<&str>) -> Html {
    Html::text(text.unwrap_or("—"))
}

/// A part's transaction hash, linked to its chain's explorer if it has one, in a `<span>` with
/// the id `tx-<chain id>` a browser test finds.
pub(crate) fn tx_cell(part: &Part) -> Html {
    let id = format!("tx-{}", part.chain_id);
    match (&part.tx_hash, &part.tx_url) {
        (Some(hash), Some(url)) => Html::raw(format!(
            "<a id=\"{}\" class=\"tx\" href=\"{}\"><code>{}</code></a>",
            esc(&id),
            esc(url),
            esc(hash)
        )),
        (Some(hash), None) => Html::raw(format!(
            "<code id=\"{}\" class=\"tx\">{}</code>",
            esc(&id),
            esc(hash)
        )),
        (None, _) if part.status == "posted" => Html::raw(format!(
            "<span id=\"{}\" class=\"note\">posted (found on chain; no transaction of ours)</span>",
            esc(&id)
        )),
        (None, _) => Html::raw(format!(
            "<span id=\"{}\" class=\"note\">not posted yet</span>",
            esc(&id)
        )),
    }
}

/// The pager of a list: a link to the previous page and to the next (`next` is the URL).
pub(crate) fn pager(prev: Option<&str>, next: Option<&str>) -> Html {
    let mut out = Html::raw("<div class=\"pager\">");
    if let Some(p) = prev {
        out.push(&link_with("id", "prev-page", p, "← newer"));
    }
    if let Some(n) = next {
        out.push(&link_with("id", "next-page", n, "older →"));
    }
    out.lit("</div>");
    out
}

/// `?page=` links of a list that pages by number.
pub(crate) fn page_links(base: &str, page: u32, more: bool) -> (Option<String>, Option<String>) {
    let prev = (page > 1).then(|| format!("{base}?page={}", page - 1));
    let next = more.then(|| format!("{base}?page={}", page + 1));
    (prev, next)
}

/// A JSON object's members as a definition list: scalars as text, the rest as compact JSON.
pub(crate) fn json_fields(value: &serde_json::Value, id_prefix: &str) -> Html {
    let Some(map) = value.as_object() else {
        return html::code(&value.to_string());
    };
    let mut dl = Dl::new();
    for (k, v) in map {
        let id = format!("{id_prefix}{}", html::id_token(k));
        let shown = match v {
            serde_json::Value::String(s) => html::code(s),
            serde_json::Value::Null => Html::text("—"),
            serde_json::Value::Bool(_) | serde_json::Value::Number(_) => html::code(&v.to_string()),
            _ => {
                let text = v.to_string();
                let text = if text.len() > 300 {
                    format!("{}…", &text[..text.floor_char_boundary(300)])
                } else {
                    text
                };
                html::code(&text)
            }
        };
        dl.html(Some(&id), k, shown);
    }
    dl.finish(None)
}
