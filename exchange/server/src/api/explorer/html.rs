//! The building blocks the pages share, as maud templates: tables, sections, links, shortened
//! hex values, badges and JSON shown as text.
//!
//! What keeps the pages safe: markup is only ever written as template literals (here and in
//! `pages/`), and maud escapes every value spliced into a template, in element text and in
//! attribute values alike. Nothing built from the books, a provider, a buyer or the query string
//! is marked pre-escaped; a value put in a URL's query goes through
//! [`query_value`](super::format::query_value) first.

use super::format::id_token;
use maud::{Markup, html};

/// `<a href="…">text</a>`.
pub(crate) fn link(href: &str, text: &str) -> Markup {
    html! { a href=(href) { (text) } }
}

/// A long hex value shortened for a table cell (`0x1234…cdef`), the full value in its title.
pub(crate) fn short(hex: &str) -> Markup {
    // By characters, not bytes: what is shortened is hex today, but a value that is not must
    // not panic the page on a character boundary.
    let chars = hex.chars().count();
    if chars <= 18 {
        return code(hex);
    }
    let head: String = hex.chars().take(10).collect();
    let tail: String = hex.chars().skip(chars - 6).collect();
    html! { code title=(hex) { (head) "…" (tail) } }
}

/// A link whose text is a shortened hex value.
pub(crate) fn short_link(href: &str, hex: &str) -> Markup {
    html! { a href=(href) { (short(hex)) } }
}

/// `<code>` around text.
pub(crate) fn code(text: &str) -> Markup {
    html! { code { (text) } }
}

/// A table `id` with the given column headings and body rows (each a `<tr>`), or `empty` in a
/// paragraph with the table's id when there are no rows.
pub(crate) fn table(id: &str, columns: &[&str], rows: &[Markup], empty: &str) -> Markup {
    if rows.is_empty() {
        return html! { p id=(id) class="empty" { (empty) } };
    }
    html! {
        table id=(id) {
            thead { tr { @for c in columns { th { (c) } } } }
            tbody { @for row in rows { (row) } }
        }
    }
}

/// A section with a heading and an id.
pub(crate) fn section(id: &str, heading: &str, content: Markup) -> Markup {
    html! {
        section id={ "section-" (id) } {
            h2 { (heading) }
            (content)
        }
    }
}

/// Pretty JSON in a collapsed `<details>`.
pub(crate) fn json_details(summary: &str, value: &serde_json::Value) -> Markup {
    let text = serde_json::to_string_pretty(value).unwrap_or_default();
    html! { details { summary { (summary) } pre { (text) } } }
}

/// A status as a badge whose class names it (`settled`, `failed`, …).
pub(crate) fn badge(status: &str) -> Markup {
    html! { span class={ "badge s-" (id_token(status)) } { (status) } }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spliced_values_are_escaped_in_text_and_attributes() {
        let hostile = "<script>alert('x' & \"y\")</script>";
        assert_eq!(
            code(hostile).into_string(),
            "<code>&lt;script&gt;alert('x' &amp; &quot;y&quot;)&lt;/script&gt;</code>"
        );
        assert_eq!(
            link(hostile, "t").into_string(),
            "<a href=\"&lt;script&gt;alert('x' &amp; &quot;y&quot;)&lt;/script&gt;\">t</a>"
        );
        assert_eq!(
            badge("Posted <b>").into_string(),
            "<span class=\"badge s-posted--b-\">Posted &lt;b&gt;</span>"
        );
    }

    #[test]
    fn a_shortened_value_keeps_its_ends_and_never_splits_a_character() {
        assert_eq!(
            short("0x0123456789abcdef0123").into_string(),
            "<code title=\"0x0123456789abcdef0123\">0x01234567…ef0123</code>"
        );
        let wide = "ééééééééééééééééééééé";
        assert_eq!(
            short(wide).into_string(),
            format!("<code title=\"{wide}\">éééééééééé…éééééé</code>")
        );
    }

    #[test]
    fn an_empty_table_is_its_note() {
        assert_eq!(
            table("t", &["a"], &[], "none").into_string(),
            "<p id=\"t\" class=\"empty\">none</p>"
        );
        let rows = [html! { tr { td { "1" } } }];
        assert_eq!(
            table("t", &["a"], &rows, "none").into_string(),
            "<table id=\"t\"><thead><tr><th>a</th></tr></thead><tbody><tr><td>1</td></tr></tbody></table>"
        );
    }
}
