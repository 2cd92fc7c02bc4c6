//! `--plot`: live and reserved bytes over each trace, one panel per trace, one line per
//! strategy (plotters, SVG).
//!
//! A panel is three bands, top to bottom: the title (wrapped to [`TITLE_CHARS`] a line: titles
//! carry the trace's file name, which can be longer than the panel is wide), the chart, and the
//! legend. The legend has a band of its own below the chart's axis labels so that it never
//! covers data: inside the chart, wherever it sat, some trace's lines ran under it.
//!
//! Lines that coincide must still be told apart: a strategy that holds exactly what the trace
//! asks for (platform) draws its reserved line on the live line, and two strategies that
//! preallocate the same pool draw one flat line. So each strategy's line has its own dash
//! pattern (the first solid), all strategies' lines are wide, the live line is narrow, black
//! and drawn last — on top, with the colour of a line under it showing at both its edges — and
//! the legend names every overlap it finds ("under the live line", "mostly on vmm's line").

use std::path::Path;

use plotters::element::DashedPathElement;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use portalloc::replay::{ReplayResult, Sample};

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
/// Each strategy's dash pattern by position, (dash, gap) in pixels; `None` is solid. Two
/// strategies on one line show as alternating colours along it.
const DASHES: [Option<(i32, i32)>; 5] = [
    None,
    Some((14, 6)),
    Some((4, 4)),
    Some((22, 5)),
    Some((8, 3)),
];
/// A strategy's line width: wide enough to show at both edges of the live line on top.
const STRATEGY_WIDTH: u32 = 5;
const LIVE_WIDTH: u32 = 1;
/// The chart's frame (its plotting area's edge) and the legend box's border, each in a grey
/// of its own: tests/suite/cli.rs finds the two boxes in the SVG by these colours.
const FRAME: RGBColor = RGBColor(160, 160, 160);
const LEGEND_BORDER: RGBColor = RGBColor(200, 200, 200);
const GIB: f64 = (1u64 << 30) as f64;

const WIDTH: u32 = 960;
/// The chart band's height (axes included).
const CHART_HEIGHT: u32 = 340;
const MARGIN: i32 = 12;
const TITLE_FONT: u32 = 18;
const TITLE_LINE: u32 = 24;
/// A title line's most characters: plotters draws the 18-point title font 14.5 pixels high,
/// and even wide letters (0.8 em, against 0.55 for digits and most lower case) leave 80 of
/// them inside the 936 pixels between the margins.
const TITLE_CHARS: usize = 80;
/// At most this many title lines; the last is cut with an ellipsis.
const TITLE_LINES: usize = 3;
const LEGEND_FONT: u32 = 13;
const LEGEND_ROW: u32 = 20;
/// Legend labels up to this long fit half the width, so the legend takes two columns.
const TWO_COLUMN_CHARS: usize = 58;

/// How a series is drawn.
#[derive(Clone, Copy)]
struct Look {
    colour: RGBColor,
    width: u32,
    dash: Option<(i32, i32)>,
}

/// A legend entry: the line's look and its label.
struct Entry {
    look: Look,
    label: String,
}

/// A panel laid out: its title lines, legend entries and columns, and its height.
struct Layout {
    title: Vec<String>,
    entries: Vec<Entry>,
    columns: usize,
}

impl Layout {
    fn new(panel: &Panel<'_>) -> Layout {
        let entries = legend(panel);
        let columns = if entries.len() > 2
            && entries
                .iter()
                .all(|e| e.label.chars().count() <= TWO_COLUMN_CHARS)
        {
            2
        } else {
            1
        };
        Layout {
            title: wrap(&panel.title, TITLE_CHARS, TITLE_LINES),
            entries,
            columns,
        }
    }

    fn title_height(&self) -> u32 {
        10 + TITLE_LINE * self.title.len() as u32
    }

    fn legend_height(&self) -> u32 {
        let rows = self.entries.len().div_ceil(self.columns) as u32;
        16 + LEGEND_ROW * rows
    }

    fn height(&self) -> u32 {
        self.title_height() + CHART_HEIGHT + self.legend_height()
    }
}

/// Splits `text` into lines of at most `width` characters at spaces (a word longer than a
/// line is cut), at most `max_lines` of them, the last ending in `…` when text is left over.
fn wrap(text: &str, width: usize, max_lines: usize) -> Vec<String> {
    let width = width.max(1);
    let mut lines: Vec<String> = Vec::new();
    let mut line: Vec<char> = Vec::new();
    for word in text.split_whitespace() {
        let mut word: &[char] = &word.chars().collect::<Vec<char>>();
        while !word.is_empty() {
            // A word goes after a space on this line, else at the start of a line of its own,
            // else (longer than a line) is cut at the line's end.
            if !line.is_empty() && line.len() + 1 + word.len() <= width {
                line.push(' ');
                line.extend(word);
                word = &[];
            } else if !line.is_empty() {
                lines.push(line.drain(..).collect());
            } else {
                let take = word.len().min(width);
                line.extend(&word[..take]);
                word = &word[take..];
                if !word.is_empty() {
                    lines.push(line.drain(..).collect());
                }
            }
        }
    }
    if !line.is_empty() {
        lines.push(line.into_iter().collect());
    }
    if lines.len() > max_lines {
        lines.truncate(max_lines);
        let last = &mut lines[max_lines - 1];
        let kept: String = last.chars().take(width - 1).collect();
        *last = kept + "…";
    }
    lines
}

/// The share of samples at which series `a` and `b` (bytes at the same sample indices) draw
/// the same line: within `tolerance` bytes, about a pixel.
fn shared(
    a: &[Sample],
    b: &[Sample],
    pick: fn(&Sample) -> u64,
    other: fn(&Sample) -> u64,
    tolerance: u64,
) -> f64 {
    if a.is_empty() || a.len() != b.len() {
        return 0.0;
    }
    let close = a
        .iter()
        .zip(b)
        .filter(|(x, y)| x.index == y.index && pick(x).abs_diff(other(y)) <= tolerance)
        .count();
    close as f64 / a.len() as f64
}

/// How the legend names a line lying on another for `share` of the trace (`None`: too little
/// of it to hide either).
fn overlap(share: f64, what: &str) -> Option<String> {
    if share >= 0.9 {
        Some(what.to_string())
    } else if share >= 0.5 {
        Some(format!("mostly {what}"))
    } else {
        None
    }
}

/// The panel's legend: one entry per strategy, naming any line it lies on, then live.
fn legend(panel: &Panel<'_>) -> Vec<Entry> {
    let (max_y, _) = extent(panel);
    // About a pixel of the chart's height.
    let tolerance = (max_y / 300.0 * GIB) as u64;
    let reserved = |s: &Sample| s.reserved;
    let live = |s: &Sample| s.live;
    let mut entries = Vec::new();
    let first = panel.results.first();
    for (i, r) in panel.results.iter().enumerate() {
        let mut overlaps = Vec::new();
        if let Some(first) = first {
            let share = shared(&r.samples, &first.samples, reserved, live, tolerance);
            overlaps.extend(overlap(share, "under the live line"));
        }
        // The earlier strategy this line covers most of (it is drawn after them).
        let below = panel.results[..i]
            .iter()
            .map(|o| {
                let share = shared(&r.samples, &o.samples, reserved, reserved, tolerance);
                (share, o.strategy)
            })
            .max_by(|x, y| x.0.total_cmp(&y.0));
        if let Some((share, strategy)) = below {
            overlaps.extend(overlap(share, &format!("on {strategy}'s line")));
        }
        let note = if overlaps.is_empty() {
            String::new()
        } else {
            format!("; {}", overlaps.join(", "))
        };
        entries.push(Entry {
            look: Look {
                colour: COLOURS[i % COLOURS.len()],
                width: STRATEGY_WIDTH,
                dash: DASHES[i % DASHES.len()],
            },
            label: format!(
                "{} reserved (peak {:.2} GiB, {:.0}% utilised{note})",
                r.strategy,
                r.peak_reserved as f64 / GIB,
                r.utilisation * 100.0
            ),
        });
    }
    if first.is_some() {
        entries.push(Entry {
            look: Look {
                colour: BLACK,
                width: LIVE_WIDTH,
                dash: None,
            },
            label: "live (the trace's own demand), drawn on top".into(),
        });
    }
    entries
}

/// The chart's y extent in GiB (8% above the highest line) and its x extent in events.
fn extent(panel: &Panel<'_>) -> (f64, u64) {
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
    (max_y.max(1e-3), max_x)
}

pub fn draw(path: &Path, panels: &[Panel<'_>]) -> Result<(), String> {
    let layouts: Vec<Layout> = panels.iter().map(Layout::new).collect();
    let height = layouts.iter().map(Layout::height).sum::<u32>().max(1);
    let root = SVGBackend::new(path, (WIDTH, height)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| e.to_string())?;
    let mut rest = root.clone();
    for (panel, layout) in panels.iter().zip(&layouts) {
        let (area, below) = rest.split_vertically(layout.height());
        draw_panel(&area, panel, layout).map_err(|e| e.to_string())?;
        rest = below;
    }
    // The path as messages show paths: cut, control characters escaped.
    root.present()
        .map_err(|e| format!("writing {}: {e}", portalloc::error::shown_path(path)))?;
    Ok(())
}

/// Draws `points` (in the chart's coordinates or the area's pixels) with `look`.
fn draw_line<DB: DrawingBackend, CT: plotters::coord::CoordTranslate>(
    area: &DrawingArea<DB, CT>,
    points: Vec<CT::From>,
    look: Look,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>>
where
    CT::From: Clone + 'static,
{
    let style = look.colour.stroke_width(look.width);
    match look.dash {
        None => area.draw(&PathElement::new(points, style)),
        Some((dash, gap)) => area.draw(&DashedPathElement::new(points, dash, gap, style)),
    }
}

fn draw_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    panel: &Panel<'_>,
    layout: &Layout,
) -> Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let (title_band, rest) = area.split_vertically(layout.title_height());
    let (chart_band, legend_band) = rest.split_vertically(CHART_HEIGHT);

    let title_style = ("sans-serif", TITLE_FONT)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (k, line) in layout.title.iter().enumerate() {
        title_band.draw_text(
            line,
            &title_style,
            (WIDTH as i32 / 2, 8 + (TITLE_LINE * k as u32) as i32),
        )?;
    }

    let (max_y, max_x) = extent(panel);
    let mut chart = ChartBuilder::on(&chart_band)
        .margin_left(MARGIN)
        .margin_right(MARGIN + 8)
        .margin_top(4)
        .x_label_area_size(36)
        .y_label_area_size(60)
        .build_cartesian_2d(0u64..max_x, 0f64..max_y)?;
    chart
        .configure_mesh()
        .x_desc("event")
        .y_desc("GiB")
        .light_line_style(RGBColor(235, 235, 235))
        .draw()?;
    let plot = chart.plotting_area();
    plot.draw(&Rectangle::new(
        [(0, 0.0), (max_x, max_y)],
        FRAME.stroke_width(1),
    ))?;
    let gib = |b: u64| b as f64 / GIB;
    for (r, entry) in panel.results.iter().zip(&layout.entries) {
        let points = r
            .samples
            .iter()
            .map(|s| (s.index, gib(s.reserved)))
            .collect();
        draw_line(plot, points, entry.look)?;
    }
    // The live line last, narrow, on top of any strategy's line it coincides with.
    if let (Some(first), Some(entry)) = (panel.results.first(), layout.entries.last()) {
        let points = first
            .samples
            .iter()
            .map(|s| (s.index, gib(s.live)))
            .collect();
        draw_line(plot, points, entry.look)?;
    }

    // The legend, in its own band below the chart.
    let (w, h) = legend_band.dim_in_pixel();
    let (left, right) = (MARGIN, w as i32 - MARGIN);
    legend_band.draw(&Rectangle::new(
        [(left, 4), (right, h as i32 - 4)],
        LEGEND_BORDER.stroke_width(1),
    ))?;
    let label_style = ("sans-serif", LEGEND_FONT)
        .into_font()
        .color(&BLACK)
        .pos(Pos::new(HPos::Left, VPos::Center));
    let column_width = (right - left) / layout.columns as i32;
    let rows = layout.entries.len().div_ceil(layout.columns);
    for (k, entry) in layout.entries.iter().enumerate() {
        let (column, row) = (k / rows, k % rows);
        let x = left + 10 + column as i32 * column_width;
        let y = 4 + 8 + LEGEND_ROW as i32 / 2 + row as i32 * LEGEND_ROW as i32;
        draw_line(&legend_band, vec![(x, y), (x + 36, y)], entry.look)?;
        legend_band.draw_text(&entry.label, &label_style, (x + 44, y))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::wrap;

    #[test]
    fn wrap_splits_at_spaces_cuts_long_words_and_keeps_every_character() {
        let text = "transformer-train (layers 12, hidden 768, batch 8, seq 1024, vocab 50257, \
                    4-byte elements, 2 steps) on h100-80g (fraction 0.75)";
        for width in [1, 5, 10, 16, 20, 40, 79, 80, 81, 200] {
            let lines = wrap(text, width, usize::MAX);
            assert!(
                lines.iter().all(|l| l.chars().count() <= width),
                "{width}: {lines:?}"
            );
            assert!(
                lines.iter().all(|l| !l.is_empty() && l.trim() == l),
                "{lines:?}"
            );
            let joined: String = lines.concat().split_whitespace().collect();
            let want: String = text.split_whitespace().collect();
            assert_eq!(joined, want, "{width}: {lines:?}");
        }
        // A line filled exactly, then another word.
        assert_eq!(wrap("abcd efgh ij", 9, 9), ["abcd efgh", "ij"]);
        assert_eq!(wrap("abcdefghij k", 4, 9), ["abcd", "efgh", "ij k"]);
        assert_eq!(wrap("", 10, 3), Vec::<String>::new());
        assert_eq!(wrap("aa bb cc dd ee", 5, 2), ["aa bb", "cc d…"]);
    }
}
