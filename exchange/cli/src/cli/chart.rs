//! The comparison as a picture: bars per allocator for deadline hit rate, mean cost and cold
//! loads, and hit rate over the trace.

use cx_exchange::sim::Report;
use plotters::prelude::*;
use std::path::Path;

const COLOURS: [RGBColor; 3] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(127, 127, 127),
];

/// Writes the chart as SVG.
pub(crate) fn write_svg(report: &Report, path: &Path) -> Result<(), Box<dyn std::error::Error>> {
    let root = SVGBackend::new(path, (1200, 800)).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!(
            "cx simulate — {} bundles, {} jobs, seed {}",
            report.bundles, report.jobs, report.seed
        ),
        ("sans-serif", 24),
    )?;
    let panels = root.split_evenly((2, 2));
    let names: Vec<String> = report
        .allocators
        .iter()
        .map(|o| {
            serde_json::to_value(o.allocator)
                .map_or(String::new(), |v| v.as_str().unwrap_or("").to_owned())
        })
        .collect();
    let hit: Vec<f64> = report
        .allocators
        .iter()
        .map(|o| o.deadline_hit_rate * 100.0)
        .collect();
    let cost: Vec<f64> = report.allocators.iter().map(|o| o.mean_cost).collect();
    let cold: Vec<f64> = report
        .allocators
        .iter()
        .map(|o| o.cold_base_loads as f64)
        .collect();
    bars(
        &panels[0],
        "deadline hit rate (%) — higher is better",
        &names,
        &hit,
        |v| format!("{v:.1} %"),
    )?;
    bars(
        &panels[1],
        "mean cost per job — lower is better",
        &names,
        &cost,
        |v| format!("{v:.5}"),
    )?;
    bars(
        &panels[2],
        "cold base loads — lower is better",
        &names,
        &cold,
        |v| format!("{v:.0}"),
    )?;
    lines(&panels[3], report, &names)?;
    root.present()?;
    Ok(())
}

fn bars<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    title: &str,
    names: &[String],
    values: &[f64],
    label: impl Fn(f64) -> String,
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let top = values.iter().copied().fold(0.0, f64::max).max(1e-9) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(0f64..values.len() as f64, 0f64..top)?;
    chart.configure_mesh().disable_x_mesh().x_labels(0).draw()?;
    for (i, v) in values.iter().enumerate() {
        let x = i as f64;
        chart.draw_series(std::iter::once(Rectangle::new(
            [(x + 0.15, 0.0), (x + 0.85, *v)],
            COLOURS[i % COLOURS.len()].filled(),
        )))?;
        chart.draw_series(std::iter::once(Text::new(
            format!("{}: {}", names[i], label(*v)),
            (x + 0.15, *v + top * 0.06),
            ("sans-serif", 13),
        )))?;
    }
    Ok(())
}

fn lines<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    report: &Report,
    names: &[String],
) -> Result<(), Box<dyn std::error::Error>>
where
    DB::ErrorType: 'static,
{
    let mut chart = ChartBuilder::on(area)
        .caption("hit rate (%) over the trace, by tenth", ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(30)
        .y_label_area_size(60)
        .build_cartesian_2d(1f64..10f64, 0f64..105f64)?;
    chart.configure_mesh().draw()?;
    for (i, o) in report.allocators.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                o.hit_rate_by_decile
                    .iter()
                    .enumerate()
                    .map(|(k, h)| (k as f64 + 1.0, h * 100.0)),
                colour.stroke_width(3),
            ))?
            .label(names[i].clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    Ok(())
}
