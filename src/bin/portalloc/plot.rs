//! `--plot`: live and reserved bytes over each trace, one panel per trace, one line per
//! strategy (plotters, SVG).

use std::path::Path;

use plotters::prelude::*;
use portalloc::replay::ReplayResult;

/// One panel: a trace's title and the results with timelines.
pub struct Panel<'a> {
    pub title: String,
    pub results: Vec<&'a ReplayResult>,
}

const COLOURS: [RGBColor; 5] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
];
const GIB: f64 = (1u64 << 30) as f64;

pub fn draw(path: &Path, panels: &[Panel<'_>]) -> Result<(), String> {
    let height = 380 * panels.len().max(1) as u32;
    let root = SVGBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let areas = root.split_evenly((panels.len().max(1), 1));
    for (panel, area) in panels.iter().zip(areas.iter()) {
        draw_panel(area, panel).map_err(|e| e.to_string())?;
    }
    // The path as messages show paths: cut, control characters escaped.
    root.present()
        .map_err(|e| format!("writing {}: {e}", portalloc::error::shown_path(path)))?;
    Ok(())
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel<'_>,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let max_x = panel
        .results
        .iter()
        .flat_map(|r| r.samples.last().map(|s| s.index))
        .max()
        .unwrap_or(1)
        .max(1);
    let max_y = panel
        .results
        .iter()
        .flat_map(|r| r.samples.iter().map(|s| s.live.max(s.reserved)))
        .max()
        .unwrap_or(1) as f64
        / GIB
        * 1.08;
    let mut chart = ChartBuilder::on(area)
        .caption(&panel.title, ("sans-serif", 18))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_x, 0f64..max_y.max(1e-3))?;
    chart
        .configure_mesh()
        .x_desc("event")
        .y_desc("GiB")
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    for (i, r) in panel.results.iter().enumerate() {
        let colour = COLOURS[i % COLOURS.len()];
        chart
            .draw_series(LineSeries::new(
                r.samples.iter().map(|s| (s.index, s.reserved as f64 / GIB)),
                colour.stroke_width(2),
            ))?
            .label(format!(
                "{} reserved (peak {:.2} GiB, {:.0}% utilised)",
                r.strategy,
                r.peak_reserved as f64 / GIB,
                r.utilisation * 100.0
            ))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], colour.stroke_width(2))
            });
    }
    if let Some(first) = panel.results.first() {
        chart
            .draw_series(LineSeries::new(
                first.samples.iter().map(|s| (s.index, s.live as f64 / GIB)),
                BLACK.stroke_width(2),
            ))?
            .label("live (the trace's own demand)")
            .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], BLACK.stroke_width(2)));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(RGBColor(200, 200, 200))
        .label_font(("sans-serif", 13))
        .draw()?;
    Ok(())
}
