//! Charts as inline SVG: a time series line chart with axes, a few ticks and a legend. No
//! script, no fonts of its own; labels go through [`esc`].

use super::html::{Html, esc, id_token, time_ms};
use std::fmt::Write as _;

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
pub(crate) fn line_chart(id: &str, unit: &str, series: &[Series], empty: &str) -> Html {
    let all = || series.iter().flat_map(|s| s.points.iter());
    let (Some(t0), Some(t1)) = (all().map(|p| p.0).min(), all().map(|p| p.0).max()) else {
        return Html::raw(format!(
            "<p id=\"{}\" class=\"empty\">{}</p>",
            esc(id),
            esc(empty)
        ));
    };
    let y_max = all().map(|p| p.1).fold(0.0_f64, f64::max).max(1.0) * 1.1;
    let span = (t1 - t0).max(1) as f64;
    let (plot_w, plot_h) = (WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM);
    let x = |t: i64| LEFT + (t - t0) as f64 / span * plot_w;
    let y = |v: f64| TOP + plot_h - v / y_max * plot_h;
    let mut svg = String::new();
    let _ = write!(
        svg,
        "<svg id=\"{}\" xmlns=\"http://www.w3.org/2000/svg\" viewBox=\"0 0 {WIDTH} {HEIGHT}\" \
         width=\"100%\" role=\"img\" aria-label=\"{} over time\" font-size=\"11\" \
         font-family=\"system-ui,sans-serif\">",
        esc(id),
        esc(unit)
    );
    // Axes and horizontal grid with four value ticks.
    let _ = write!(
        svg,
        "<line x1=\"{LEFT}\" y1=\"{TOP}\" x2=\"{LEFT}\" y2=\"{:.1}\" stroke=\"#888\"/>\
         <line x1=\"{LEFT}\" y1=\"{:.1}\" x2=\"{:.1}\" y2=\"{:.1}\" stroke=\"#888\"/>",
        TOP + plot_h,
        TOP + plot_h,
        LEFT + plot_w,
        TOP + plot_h
    );
    for i in 0..=4 {
        let v = y_max * f64::from(i) / 4.0;
        let _ = write!(
            svg,
            "<line x1=\"{LEFT}\" y1=\"{0:.1}\" x2=\"{1:.1}\" y2=\"{0:.1}\" stroke=\"#eee\"/>\
             <text x=\"{2:.1}\" y=\"{3:.1}\" text-anchor=\"end\">{4}</text>",
            y(v),
            LEFT + plot_w,
            LEFT - 6.0,
            y(v) + 4.0,
            esc(&compact(v))
        );
    }
    let _ = write!(
        svg,
        "<text x=\"{LEFT}\" y=\"{0:.1}\">{1}</text>\
         <text x=\"{2:.1}\" y=\"{0:.1}\" text-anchor=\"end\">{3}</text>\
         <text x=\"12\" y=\"{4:.1}\" transform=\"rotate(-90 12 {4:.1})\" text-anchor=\"middle\">{5}</text>",
        HEIGHT - 12.0,
        esc(&time_ms(t0)),
        LEFT + plot_w,
        esc(&time_ms(t1)),
        TOP + plot_h / 2.0,
        esc(unit)
    );
    for (i, s) in series.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        let mut path = String::new();
        for (t, v) in &s.points {
            let _ = write!(path, "{:.1},{:.1} ", x(*t), y(*v));
        }
        let _ = write!(
            svg,
            "<polyline id=\"series-{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\" \
             points=\"{}\"/>",
            esc(&id_token(&s.label)),
            path.trim_end()
        );
        for (t, v) in &s.points {
            let _ = write!(
                svg,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"2.2\" fill=\"{colour}\"><title>{}: {} at {}</title></circle>",
                x(*t),
                y(*v),
                esc(&s.label),
                esc(&compact(*v)),
                esc(&time_ms(*t))
            );
        }
        let ly = TOP + 12.0 + 16.0 * i as f64;
        let _ = write!(
            svg,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"10\" height=\"10\" fill=\"{colour}\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            LEFT + plot_w + 14.0,
            ly - 9.0,
            LEFT + plot_w + 30.0,
            ly,
            esc(&s.label)
        );
    }
    svg.push_str("</svg>");
    Html::raw(svg)
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
        let s = chart.as_str();
        assert!(s.starts_with("<svg id=\"c\""));
        assert!(s.contains("<polyline id=\"series--m--t1\""));
        assert!(s.contains("&lt;m&gt; T1") && !s.contains("<m>"));
        assert!(
            line_chart("c", "wei", &[], "none")
                .as_str()
                .contains("class=\"empty\"")
        );
        assert_eq!(compact(1500.0), "1.5k");
        assert_eq!(compact(0.0), "0");
    }
}
