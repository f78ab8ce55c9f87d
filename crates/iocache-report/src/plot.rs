//! The one place that talks to `plotters`. A
//! [`Chart`] becomes an SVG string here (axes, grid, one line per series,
//! markers, a legend); the rest of the crate only assembles HTML.

use plotters::coord::ranged1d::{AsRangedCoord, Ranged, ValueFormatter};
use plotters::coord::Shift;
use plotters::prelude::*;

use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::{Axis, Chart, ReportError, Scale, Series, Ticks};

/// Width and height of every chart's plot, in SVG user units (scaled to
/// fit by the page's CSS); the legend is to its right, as wide as the
/// longest name needs.
const SIZE: (u32, u32) = (600, 400);
/// Legend: height of a row, width of a character (estimated: SVG text is
/// laid out by the browser), and the widest it gets.
const LEGEND_ROW: i32 = 18;
const LEGEND_TOP: i32 = 50;
const LEGEND_CHAR: f64 = 7.2;
const LEGEND_MAX: u32 = 420;

/// Series colours: distinct on white and for the common colour blindnesses
/// (after the Okabe–Ito and Tableau palettes), then repeated.
const COLOURS: [RGBColor; 10] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(230, 159, 0),
    RGBColor(86, 180, 233),
    RGBColor(120, 120, 120),
    RGBColor(140, 86, 75),
    RGBColor(148, 103, 189),
    RGBColor(0, 0, 0),
];

/// Marker shapes: with the colours, 40 series are told apart before a
/// style repeats.
const SHAPES: usize = 4;

/// Series with at most this many points get a marker at each.
const MARKERS_UP_TO: usize = 60;
/// Series with more points are thinned to about this many (every k-th
/// point and the last), so a long time series keeps the page small.
const POINTS_UP_TO: usize = 2000;

/// A series' marker: the colours repeat after ten series, the shapes tell
/// those apart (up to 40).
#[derive(Clone, Copy)]
pub(crate) struct Style {
    pub(crate) colour: RGBColor,
    pub(crate) shape: usize,
}

impl Style {
    pub(crate) fn of(i: usize) -> Style {
        Style {
            colour: COLOURS[i % COLOURS.len()],
            shape: (i / COLOURS.len()) % SHAPES,
        }
    }

    fn marker<DB: DrawingBackend>(self, at: (i32, i32)) -> DynElement<'static, DB, (i32, i32)> {
        let style = self.colour.filled();
        match self.shape {
            0 => Circle::new(at, 3, style).into_dyn(),
            1 => TriangleMarker::new(at, 4, style).into_dyn(),
            2 => Cross::new(at, 4, self.colour.stroke_width(2)).into_dyn(),
            _ => Rectangle::new([(at.0 - 3, at.1 - 3), (at.0 + 3, at.1 + 3)], style).into_dyn(),
        }
    }
}

/// The points of `series` that `chart`'s axes can show: finite, and above
/// 0 on a logarithmic axis.
pub(crate) fn drawable<'a>(chart: &'a Chart, series: &'a Series) -> impl Iterator<Item = (f64, f64)> + 'a {
    series.points.iter().copied().filter(move |&(x, y)| {
        let ok = |v: f64, axis: &Axis| v.is_finite() && (axis.scale == Scale::Linear || v > 0.0);
        ok(x, &chart.x) && ok(y, &chart.y)
    })
}

/// The extent of one axis: `range` if given, else the data's, widened when
/// it is a single value.
fn extent(axis: &Axis, values: impl Iterator<Item = f64>) -> (f64, f64) {
    let (mut lo, mut hi) = values.fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
        (lo.min(v), hi.max(v))
    });
    if let Some((a, b)) = axis.range {
        (lo, hi) = (a, b);
    }
    if !lo.is_finite() || !hi.is_finite() {
        return match axis.scale {
            Scale::Linear => (0.0, 1.0),
            Scale::Log => (1.0, 10.0),
        };
    }
    match axis.scale {
        Scale::Log => {
            let lo = if lo > 0.0 { lo } else { hi.max(1.0) / 10.0 };
            if hi <= lo {
                (lo / 2.0, lo * 2.0)
            } else {
                (lo, hi)
            }
        }
        Scale::Linear if hi <= lo => {
            let pad = if lo == 0.0 { 1.0 } else { lo.abs() / 10.0 };
            (lo - pad, hi + pad)
        }
        Scale::Linear => (lo, hi),
    }
}

/// A chart as one `<svg>` element.
pub fn render_svg(chart: &Chart) -> Result<String, ReportError> {
    let x = extent(
        &chart.x,
        chart.series.iter().flat_map(|s| drawable(chart, s).map(|p| p.0)),
    );
    let y = extent(
        &chart.y,
        chart.series.iter().flat_map(|s| drawable(chart, s).map(|p| p.1)),
    );
    let base = |axis: &Axis| if axis.ticks == Ticks::Bytes { 2.0 } else { 10.0 };
    let names = chart
        .series
        .iter()
        .filter(|s| drawable(chart, s).next().is_some());
    let (count, longest) = names.fold((0, 0), |(n, longest), s| {
        (n + 1, longest.max(s.name.chars().count()))
    });
    let legend_width = ((longest as f64 * LEGEND_CHAR) as u32 + 44).min(LEGEND_MAX);
    // A long legend makes the picture taller, never the plot.
    let height = SIZE.1.max(LEGEND_TOP as u32 + count * LEGEND_ROW as u32 + 10);
    let mut svg = String::new();
    {
        let whole = SVGBackend::with_string(&mut svg, (SIZE.0 + legend_width, height)).into_drawing_area();
        let (left, legend) = whole.split_horizontally(SIZE.0);
        let (root, _) = left.split_vertically(SIZE.1);
        let result = draw_legend(&legend, chart).and_then(|()| match (chart.x.scale, chart.y.scale) {
            (Scale::Linear, Scale::Linear) => draw(&root, chart, (x.1 - x.0, y.1 - y.0), x.0..x.1, y.0..y.1),
            (Scale::Log, Scale::Linear) => draw(
                &root,
                chart,
                (x.1 - x.0, y.1 - y.0),
                (x.0..x.1).log_scale().base(base(&chart.x)),
                y.0..y.1,
            ),
            (Scale::Linear, Scale::Log) => draw(
                &root,
                chart,
                (x.1 - x.0, y.1 - y.0),
                x.0..x.1,
                (y.0..y.1).log_scale().base(base(&chart.y)),
            ),
            (Scale::Log, Scale::Log) => draw(
                &root,
                chart,
                (x.1 - x.0, y.1 - y.0),
                (x.0..x.1).log_scale().base(base(&chart.x)),
                (y.0..y.1).log_scale().base(base(&chart.y)),
            ),
        });
        let result = result.and_then(|()| whole.present().map_err(|e| e.to_string()));
        result.map_err(|message| ReportError::Draw {
            chart: chart.title.clone(),
            message,
        })?;
    }
    Ok(svg)
}

/// `spans`: the width of each axis's range, below which a tick value is
/// rounding noise (a tick at `-5.55e-17` is 0).
fn draw<X, Y>(
    root: &DrawingArea<SVGBackend<'_>, Shift>,
    chart: &Chart,
    spans: (f64, f64),
    x: X,
    y: Y,
) -> Result<(), String>
where
    X: AsRangedCoord<Value = f64>,
    Y: AsRangedCoord<Value = f64>,
    X::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
    Y::CoordDescType: Ranged<ValueType = f64> + ValueFormatter<f64>,
{
    let text = |e: &dyn std::fmt::Display| e.to_string();
    root.fill(&WHITE).map_err(|e| text(&e))?;
    let mut context = ChartBuilder::on(root)
        .caption(&chart.title, ("sans-serif", 18))
        .margin(14)
        .x_label_area_size(48)
        .y_label_area_size(72)
        .build_cartesian_2d(x, y)
        .map_err(|e| text(&e))?;
    let x_format = |v: &f64| tick(snap_to_zero(*v, spans.0), chart.x.ticks);
    let y_format = |v: &f64| tick(snap_to_zero(*v, spans.1), chart.y.ticks);
    context
        .configure_mesh()
        .x_desc(&chart.x.label)
        .y_desc(&chart.y.label)
        .x_labels(8)
        .y_labels(8)
        .x_label_formatter(&x_format)
        .y_label_formatter(&y_format)
        .axis_desc_style(("sans-serif", 14))
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(238, 238, 238))
        .bold_line_style(RGBColor(215, 215, 215))
        .draw()
        .map_err(|e| text(&e))?;
    for (i, series) in chart.series.iter().enumerate() {
        let style = Style::of(i);
        let mut points: Vec<(f64, f64)> = drawable(chart, series).collect();
        if points.is_empty() {
            continue;
        }
        if points.len() > POINTS_UP_TO {
            let step = points.len().div_ceil(POINTS_UP_TO);
            let last = *points.last().expect("not empty");
            points = points.into_iter().step_by(step).collect();
            if points.last() != Some(&last) {
                points.push(last);
            }
        }
        context
            .draw_series(LineSeries::new(
                points.iter().copied(),
                style.colour.stroke_width(2),
            ))
            .map_err(|e| text(&e))?;
        if points.len() <= MARKERS_UP_TO {
            context
                .draw_series(points.iter().map(|&p| EmptyElement::at(p) + style.marker((0, 0))))
                .map_err(|e| text(&e))?;
        }
    }
    Ok(())
}

/// The legend, beside the plot: a line and marker per series with data,
/// and its name.
fn draw_legend(area: &DrawingArea<SVGBackend<'_>, Shift>, chart: &Chart) -> Result<(), String> {
    let text = |e: &dyn std::fmt::Display| e.to_string();
    area.fill(&WHITE).map_err(|e| text(&e))?;
    let mut y = LEGEND_TOP;
    for (i, series) in chart.series.iter().enumerate() {
        if drawable(chart, series).next().is_none() {
            continue;
        }
        let style = Style::of(i);
        area.draw(&PathElement::new(
            vec![(4, y), (28, y)],
            style.colour.stroke_width(2),
        ))
        .map_err(|e| text(&e))?;
        area.draw(&style.marker((16, y))).map_err(|e| text(&e))?;
        area.draw(&Text::new(
            series.name.as_str(),
            (36, y),
            TextStyle::from(("sans-serif", 13).into_font()).pos(Pos::new(HPos::Left, VPos::Center)),
        ))
        .map_err(|e| text(&e))?;
        y += LEGEND_ROW;
    }
    Ok(())
}

/// A tick label.
/// `v`, or 0 when it is within a billionth of `span` of it (the sum of
/// steps that should have met 0 exactly).
pub(crate) fn snap_to_zero(v: f64, span: f64) -> f64 {
    if v.abs() <= span.abs() * 1e-9 {
        0.0
    } else {
        v
    }
}

pub(crate) fn tick(v: f64, ticks: Ticks) -> String {
    match ticks {
        Ticks::Number => short(v),
        Ticks::Percent => format!("{}%", short(v * 100.0)),
        Ticks::Bytes => with_unit(v, 1024.0, &["B", "KiB", "MiB", "GiB", "TiB", "PiB"]),
        Ticks::Nanoseconds => {
            let a = v.abs();
            let (div, unit) = if a >= 1e9 {
                (1e9, "s")
            } else if a >= 1e6 {
                (1e6, "ms")
            } else if a >= 1e3 {
                (1e3, "µs")
            } else {
                (1.0, "ns")
            };
            format!("{}{unit}", short(v / div))
        }
    }
}

fn with_unit(v: f64, step: f64, units: &[&str]) -> String {
    let mut v = v;
    let mut unit = 0;
    while v.abs() >= step && unit + 1 < units.len() {
        v /= step;
        unit += 1;
    }
    format!("{}{}", short(v), units[unit])
}

/// A number in at most four significant digits, without trailing zeros.
pub(crate) fn short(v: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return if v.is_finite() { "0".into() } else { v.to_string() };
    }
    let a = v.abs();
    if !(1e-3..1e6).contains(&a) {
        return format!("{v:.2e}");
    }
    let decimals = (3 - a.log10().floor() as i32).max(0) as usize;
    let text = format!("{v:.decimals$}");
    if text.contains('.') {
        text.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        text
    }
}
