//! HTML by hand: one escaping function every piece of data passes through, the page layout with
//! its inline style sheet, and the few building blocks the pages share (definition lists, tables,
//! links, times).
//!
//! The rule that keeps the pages safe: markup is only ever written as literals in this module and
//! in `pages/`; every value that comes from the books, a provider, a buyer or the query string is
//! written through [`esc`] (or [`Html::text`], which calls it), and every value put in a URL's
//! query through [`query_value`]. An [`Html`] is markup already made safe.

use std::fmt::Write as _;

/// Markup that is safe to emit as it is (built from literals and escaped text).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Html(String);

impl Html {
    /// Escaped text.
    pub(crate) fn text(text: &str) -> Self {
        Self(esc(text))
    }

    /// Markup written by this crate (a literal or built from escaped parts).
    pub(crate) fn raw(markup: impl Into<String>) -> Self {
        Self(markup.into())
    }

    /// The markup.
    pub(crate) fn as_str(&self) -> &str {
        &self.0
    }

    /// Appends markup.
    pub(crate) fn push(&mut self, more: &Html) {
        self.0.push_str(&more.0);
    }

    /// Appends a literal piece of markup.
    pub(crate) fn lit(&mut self, markup: &str) {
        self.0.push_str(markup);
    }

    /// Appends escaped text.
    pub(crate) fn push_text(&mut self, text: &str) {
        self.0.push_str(&esc(text));
    }
}

/// Escapes text for an HTML element's content or a double- or single-quoted attribute value:
/// `& < > " '` become character references, nothing else changes.
pub(crate) fn esc(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

/// Percent-encodes a value for a URL's query string (RFC 3986 unreserved characters kept).
pub(crate) fn query_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for b in value.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b => {
                let _ = write!(out, "%{b:02X}");
            }
        }
    }
    out
}

/// A token safe in an `id` attribute and a CSS selector: ASCII letters, digits and `-`, every
/// other character as `-`, lowercased.
pub(crate) fn id_token(text: &str) -> String {
    text.chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect()
}

/// `<a href="…">text</a>`, both escaped.
pub(crate) fn link(href: &str, text: &str) -> Html {
    Html(format!("<a href=\"{}\">{}</a>", esc(href), esc(text)))
}

/// A link with an `id` (for the browser test to follow) or a `class`.
pub(crate) fn link_with(attr: &str, value: &str, href: &str, text: &str) -> Html {
    Html(format!(
        "<a {attr}=\"{}\" href=\"{}\">{}</a>",
        esc(value),
        esc(href),
        esc(text)
    ))
}

/// A long hex value shortened for a table cell (`0x1234…cdef`), the full value in its title.
pub(crate) fn short(hex: &str) -> Html {
    if hex.len() <= 18 {
        return Html::raw(format!("<code>{}</code>", esc(hex)));
    }
    let (head, tail) = (&hex[..10], &hex[hex.len() - 6..]);
    Html(format!(
        "<code title=\"{}\">{}…{}</code>",
        esc(hex),
        esc(head),
        esc(tail)
    ))
}

/// A link whose text is a shortened hex value.
pub(crate) fn short_link(href: &str, hex: &str) -> Html {
    Html(format!(
        "<a href=\"{}\">{}</a>",
        esc(href),
        short(hex).as_str()
    ))
}

/// `<code>` around escaped text.
pub(crate) fn code(text: &str) -> Html {
    Html(format!("<code>{}</code>", esc(text)))
}

/// A definition list, one `<dt>/<dd>` pair per row; a row's `id` (if any) is on its `<dd>`.
#[derive(Default)]
pub(crate) struct Dl {
    rows: Html,
}

impl Dl {
    /// An empty list.
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// A row of escaped text.
    pub(crate) fn text(&mut self, id: Option<&str>, label: &str, value: &str) -> &mut Self {
        self.html(id, label, Html::text(value))
    }

    /// A row of markup.
    pub(crate) fn html(&mut self, id: Option<&str>, label: &str, value: Html) -> &mut Self {
        self.rows.lit("<dt>");
        self.rows.push_text(label);
        match id {
            Some(id) => {
                let _ = write!(self.rows.0, "</dt><dd id=\"{}\">", esc(id));
            }
            None => self.rows.lit("</dt><dd>"),
        }
        self.rows.push(&value);
        self.rows.lit("</dd>");
        self
    }

    /// The list.
    pub(crate) fn finish(&self, id: Option<&str>) -> Html {
        let open = match id {
            Some(id) => format!("<dl id=\"{}\">", esc(id)),
            None => "<dl>".to_owned(),
        };
        Html(format!("{open}{}</dl>", self.rows.as_str()))
    }
}

/// A table with a header row; each body row has an optional `id`.
pub(crate) struct Table {
    id: String,
    head: Html,
    body: Html,
    rows: usize,
}

impl Table {
    /// A table `id` with the given column headings.
    pub(crate) fn new(id: &str, columns: &[&str]) -> Self {
        let mut head = Html::default();
        for c in columns {
            head.lit("<th>");
            head.push_text(c);
            head.lit("</th>");
        }
        Self {
            id: id.to_owned(),
            head,
            body: Html::default(),
            rows: 0,
        }
    }

    /// A row of cells (markup each).
    pub(crate) fn row(&mut self, id: Option<&str>, cells: Vec<Html>) {
        match id {
            Some(id) => {
                let _ = write!(self.body.0, "<tr id=\"{}\">", esc(id));
            }
            None => self.body.lit("<tr>"),
        }
        for c in cells {
            self.body.lit("<td>");
            self.body.push(&c);
            self.body.lit("</td>");
        }
        self.body.lit("</tr>");
        self.rows += 1;
    }

    /// The table, or `empty` (escaped, in a paragraph with the table's id) when it has no rows.
    pub(crate) fn finish(self, empty: &str) -> Html {
        if self.rows == 0 {
            return Html(format!(
                "<p id=\"{}\" class=\"empty\">{}</p>",
                esc(&self.id),
                esc(empty)
            ));
        }
        Html(format!(
            "<table id=\"{}\"><thead><tr>{}</tr></thead><tbody>{}</tbody></table>",
            esc(&self.id),
            self.head.as_str(),
            self.body.as_str()
        ))
    }
}

/// A section with a heading and an id.
pub(crate) fn section(id: &str, heading: &str, content: &Html) -> Html {
    Html(format!(
        "<section id=\"section-{}\"><h2>{}</h2>{}</section>",
        esc(id),
        esc(heading),
        content.as_str()
    ))
}

/// Pretty JSON in a collapsed `<details>` (escaped).
pub(crate) fn json_details(summary: &str, value: &serde_json::Value) -> Html {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    Html(format!(
        "<details><summary>{}</summary><pre>{}</pre></details>",
        esc(summary),
        esc(&text)
    ))
}

/// A status as a badge whose class names it (`settled`, `failed`, …).
pub(crate) fn badge(status: &str) -> Html {
    Html(format!(
        "<span class=\"badge s-{}\">{}</span>",
        id_token(status),
        esc(status)
    ))
}

/// Unix milliseconds as `YYYY-MM-DD HH:MM:SS UTC`.
pub(crate) fn time_ms(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02} UTC",
        rest / 3600,
        rest / 60 % 60,
        rest % 60
    )
}

/// Unix seconds as [`time_ms`] does.
pub(crate) fn time_s(s: u64) -> String {
    time_ms(
        i64::try_from(s)
            .unwrap_or(i64::MAX / 1000)
            .saturating_mul(1000),
    )
}

/// The proleptic Gregorian date of a day count from 1970-01-01 (Howard Hinnant's
/// `civil_from_days`, exact for every `i64` day this page will see).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

/// A float for a cost term: four significant decimals, no exponent for ordinary magnitudes.
pub(crate) fn num(x: f64) -> String {
    if x == 0.0 {
        "0".to_owned()
    } else if x.abs() >= 1e-4 && x.abs() < 1e15 {
        let s = format!("{x:.6}");
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_owned()
    } else {
        format!("{x:.4e}")
    }
}

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
pub(crate) fn page(title: &str, current: &str, body: &Html) -> String {
    let mut nav = String::new();
    for (name, href) in NAV {
        let class = if name == current {
            " class=\"current\""
        } else {
            ""
        };
        let _ = write!(
            nav,
            "<a id=\"nav-{name}\"{class} href=\"{href}\">{}</a>",
            if name == "index" { "cx explorer" } else { name }
        );
    }
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} · cx explorer</title><style>{STYLE}</style></head>\
         <body><nav>{nav}</nav><main id=\"page-{}\"><h1>{}</h1>{}</main>\
         <footer>compute-exchange explorer · every page is also JSON with \
         <code>Accept: application/json</code></footer></body></html>\n",
        esc(title),
        id_token(current),
        esc(title),
        body.as_str()
    )
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_leaves_no_markup() {
        assert_eq!(
            esc("<script>alert('x' & \"y\")</script>"),
            "&lt;script&gt;alert(&#39;x&#39; &amp; &quot;y&quot;)&lt;/script&gt;"
        );
        assert_eq!(query_value("a b&c=d/é"), "a%20b%26c%3Dd%2F%C3%A9");
        assert_eq!(id_token("Llama-3.1 8B"), "llama-3-1-8b");
    }

    #[test]
    fn times_are_utc_calendar_dates() {
        assert_eq!(time_ms(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(time_ms(951_782_400_000), "2000-02-29 00:00:00 UTC");
        assert_eq!(time_s(1_798_761_599), "2026-12-31 23:59:59 UTC");
    }
}
