//! Charts as inline SVG, written with maud like the pages (so labels are escaped as any text
//! is): a time series line chart with axes, a few ticks and a legend. No script, no fonts of its
//! own.

use super::format::{id_token, time_ms};
use maud::{Markup, html};

/// One line of a chart.
pub(crate) struct Series {
    /// The legend's label.
    pub(crate) label: String,
    /// `(unix ms, value)`, in time order.
    pub(crate) points: Vec<(i64, f64)>,
}

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 320.0;
const LEFT: f64 = 90.0;
const RIGHT: f64 = 200.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 40.0;
const COLOURS: [&str; 8] = [
    "#2454c5", "#c2410c", "#15803d", "#9333ea", "#b91c1c", "#0e7490", "#a16207", "#4b5563",
];

/// A line chart `id` of `series` with the y axis labelled `unit`; the note `empty` instead when
/// no series has a point.
pub(crate) fn line_chart(id: &str, unit: &str, series: &[Series], empty: &str) -> Markup {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (Some(t0), Some(t1)) = (all().map(|p| p.0).min(), all().map(|p| p.0).max()) else {
        return html! { p id=(id) class="empty" { (empty) } };
    };
    let y_max = all().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0) * 1.1;
    let span = (t1 - t0).max(1) as f64;
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x = |t: i64| LEFT + (t - t0) as f64 / span * plot_w;
    let y = |v: f64| TOP + plot_h - v / y_max * plot_h;
    let (right, bottom) = (LEFT + plot_w, TOP + plot_h);
    html! {
        svg id=(id) xmlns="http://www.w3.org/2000/svg" viewBox={ "0 0 " (WIDTH) " " (HEIGHT) }
            width="100%" role="img" aria-label={ (unit) " over time" } font-size="11"
            font-family="system-ui,sans-serif" {
            // Axes and horizontal grid with four value ticks.
            line x1=(LEFT) y1=(TOP) x2=(LEFT) y2=(d1(bottom)) stroke="#888" {}
            line x1=(LEFT) y1=(d1(bottom)) x2=(d1(right)) y2=(d1(bottom)) stroke="#888" {}
            @for i in 0..=4 {
                @let v = y_max * f64::from(i) / 4.0;
                line x1=(LEFT) y1=(d1(y(v))) x2=(d1(right)) y2=(d1(y(v))) stroke="#eee" {}
                text x=(d1(LEFT - 6.0)) y=(d1(y(v) + 4.0)) text-anchor="end" { (compact(v)) }
            }
            text x=(LEFT) y=(d1(HEIGHT - 12.0)) { (time_ms(t0)) }
            text x=(d1(right)) y=(d1(HEIGHT - 12.0)) text-anchor="end" { (time_ms(t1)) }
            text x="12" y=(d1(TOP + plot_h / 2.0))
                transform={ "rotate(-90 12 " (d1(TOP + plot_h / 2.0)) ")" } text-anchor="middle" {
                (unit)
            }
            @for (i, s) in series.iter().enumerate() {
                @let colour = COLOURS[i % COLOURS.len()];
                @let ly = TOP + 12.0 + 16.0 * i as f64;
                polyline id={ "series-" (id_token(&s.label)) } fill="none" stroke=(colour)
                    stroke-width="1.6" points=(polyline_points(&s.points, x, y)) {}
                @for (t, v) in &s.points {
                    circle cx=(d1(x(*t))) cy=(d1(y(*v))) r="2.2" fill=(colour) {
                        title { (s.label) ": " (compact(*v)) " at " (time_ms(*t)) }
                    }
                }
                rect x=(d1(right + 14.0)) y=(d1(ly - 9.0)) width="10" height="10" fill=(colour) {}
                text x=(d1(right + 30.0)) y=(d1(ly)) { (s.label) }
            }
        }
    }
}

/// A coordinate to one decimal.
fn d1(v: f64) -> String {
    format!("{v:.1}")
}

/// A polyline's `points`: `x,y` pairs to one decimal, space-separated.
fn polyline_points(
    points: &[(i64, f64)],
    x: impl Fn(i64) -> f64,
    y: impl Fn(f64) -> f64,
) -> String {
    points
        .iter()
        .map(|(t, v)| format!("{:.1},{:.1}", x(*t), y(*v)))
        .collect::<Vec<_>>()
        .join(" ")
}

/// A value for an axis label: `1.2k`, `3.4M`, `5.6G`.
fn compact(v: f64) -> String {
    let (div, suffix) = match v.abs() {
        a if a >= 1e12 => (1e12, "T"),
        a if a >= 1e9 => (1e9, "G"),
        a if a >= 1e6 => (1e6, "M"),
        a if a >= 1e3 => (1e3, "k"),
        _ => (1.0, ""),
    };
    let s = format!("{:.2}", v / div);
    let s = s.trim_end_matches('0').trim_end_matches('.');
    format!("{s}{suffix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_draws_every_series_and_escapes_labels() {
        let chart = line_chart(
            "c",
            "wei",
            &[Series {
                label: "<m> T1".into(),
                points: vec![(0, 10.0), (1000, 20.0)],
            }],
            "none",
        );
        let s = chart.into_string();
        assert!(s.starts_with("<svg id=\"c\""));
        assert!(s.contains("<polyline id=\"series--m--t1\""));
        assert!(s.contains("&lt;m&gt; T1") && !s.contains("<m>"));
        assert!(
            line_chart("c", "wei", &[], "none")
                .into_string()
                .contains("class=\"empty\"")
        );
        assert_eq!(compact(1500.0), "1.5k");
        assert_eq!(compact(0.0), "0");
    }
}
