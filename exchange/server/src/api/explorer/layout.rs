//! The document every page sits in: head with the inline style sheet, navigation, the page's
//! heading and markup, footer.

use super::format::id_token;
use maud::{DOCTYPE, Markup, PreEscaped, html};

/// The pages' navigation, in order.
const NAV: [(&str, &str); 6] = [
    ("index", "/explorer"),
    ("jobs", "/explorer/jobs"),
    ("batches", "/explorer/batches"),
    ("providers", "/explorer/providers"),
    ("markets", "/explorer/markets"),
    ("accounts", "/explorer/accounts"),
];

/// The whole document: title, navigation (`current` marked), the page's markup.
pub(crate) fn page(title: &str, current: &str, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · cx explorer" }
                // Our own constant, not data; a `<style>` element's text is not parsed as
                // markup, so escaping it would only corrupt a selector such as `a>b`.
                style { (PreEscaped(STYLE)) }
            }
            body {
                nav {
                    @for (name, href) in NAV {
                        a id={ "nav-" (name) } class=[(name == current).then_some("current")] href=(href) {
                            (if name == "index" { "cx explorer" } else { name })
                        }
                    }
                }
                main id={ "page-" (id_token(current)) } {
                    h1 { (title) }
                    (body)
                }
                footer {
                    "compute-exchange explorer · every page is also JSON with "
                    code { "Accept: application/json" }
                }
            }
        }
    }
}

/// The style sheet, inline so the pages need nothing else.
const STYLE: &str = "\
:root{--fg:#1b1f24;--muted:#5a6270;--line:#d8dde3;--bg:#fafbfc;--accent:#2454c5}\
*{box-sizing:border-box}\
body{margin:0;font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;color:var(--fg);background:var(--bg)}\
nav{display:flex;gap:18px;padding:10px 24px;background:#131a2a}\
nav a{color:#c9d3e6;text-decoration:none}nav a.current,nav a:hover{color:#fff}\
#nav-index{font-weight:700;color:#fff}\
main{max-width:1180px;margin:0 auto;padding:8px 24px 40px}\
h1{font-size:22px;margin:18px 0 10px;word-break:break-all}h2{font-size:16px;margin:26px 0 8px;\
border-bottom:1px solid var(--line);padding-bottom:4px}\
a{color:var(--accent)}\
table{border-collapse:collapse;width:100%;background:#fff;font-size:13px}\
th,td{border:1px solid var(--line);padding:4px 8px;text-align:left;vertical-align:top}\
th{background:#eef1f5;font-weight:600}td code,td .badge{white-space:nowrap}\
dl{display:grid;grid-template-columns:max-content 1fr;gap:3px 16px;margin:0}\
dt{color:var(--muted)}dd{margin:0;word-break:break-all}\
code{font:12px ui-monospace,SFMono-Regular,Menlo,monospace}\
pre{background:#fff;border:1px solid var(--line);padding:8px;overflow:auto;font-size:12px}\
.badge{display:inline-block;padding:0 7px;border-radius:9px;background:#e6e9ee;font-size:12px}\
.s-settled,.s-posted{background:#cdebd3;color:#11532a}.s-done,.s-batched,.s-submitted{background:#d9e6fb;color:#1a3f86}\
.s-expired,.s-failed,.s-cancelled,.s-rejected,.s-reclaimed,.s-refused{background:#f8d7d7;color:#7d1a1a}\
.s-running,.s-assigned,.s-pending,.s-created,.s-signed,.s-closing{background:#fdf0c4;color:#6b4f00}\
.empty,.note{color:var(--muted)}\
form.filters{display:flex;flex-wrap:wrap;gap:8px;margin:8px 0 12px}\
form.filters input,form.filters select{font-size:13px;padding:3px 5px}\
.pager{margin:10px 0;display:flex;gap:16px}\
.cards{display:flex;flex-wrap:wrap;gap:12px}.card{background:#fff;border:1px solid var(--line);\
padding:10px 14px;min-width:150px}.card b{display:block;font-size:20px}\
footer{color:var(--muted);font-size:12px;text-align:center;padding:20px}\
svg{background:#fff;border:1px solid var(--line)}";
