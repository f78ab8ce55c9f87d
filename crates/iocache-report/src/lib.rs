//! Why this crate exists: results are easier to read as plots than as
//! columns of numbers, and a report should open anywhere, offline, years
//! later. This crate turns a [`Report`] (sections of charts, tables and
//! facts, built by `iocache lab report`, `sim --report` and
//! `trace mrc --report`) into one self-contained HTML page: inline CSS,
//! inline SVG drawn with `plotters`, no JavaScript, no fonts, no URL of any
//! kind. It does no I/O: data in, a string out.

mod plot;

pub use plot::render_svg;

/// A whole page.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// The page's title and first heading.
    pub title: String,
    /// Facts shown under the title (what was run, on what, by which version).
    pub facts: Vec<(String, String)>,
    pub sections: Vec<Section>,
}

/// A heading and what follows it.
#[derive(Clone, Debug, Default)]
pub struct Section {
    pub heading: String,
    pub blocks: Vec<Block>,
}

/// One piece of a section.
#[derive(Clone, Debug)]
pub enum Block {
    /// A paragraph of plain text.
    Text(String),
    /// Name–value pairs.
    Facts(Vec<(String, String)>),
    Table(Table),
    Chart(Chart),
}

/// A table of text cells; cells that read as numbers are right-aligned.
#[derive(Clone, Debug, Default)]
pub struct Table {
    pub caption: Option<String>,
    pub header: Vec<String>,
    pub rows: Vec<Vec<String>>,
}

/// How an axis maps values to positions.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Scale {
    #[default]
    Linear,
    /// Logarithmic; values at or below 0 are left out of the plot.
    Log,
}

/// How axis tick values are written.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Ticks {
    /// A plain number, shortened (`0.25`, `1.5e6`).
    #[default]
    Number,
    /// A byte count with a binary unit (`16MiB`).
    Bytes,
    /// A fraction written as a percentage (`25%`).
    Percent,
    /// Nanoseconds written with a unit (`120µs`, `3ms`).
    Nanoseconds,
}

/// An axis of a chart.
#[derive(Clone, Debug, Default)]
pub struct Axis {
    pub label: String,
    pub scale: Scale,
    pub ticks: Ticks,
    /// Fixed bounds; by default the data's extent.
    pub range: Option<(f64, f64)>,
}

/// A line chart: one line (with markers when points are few) per series,
/// and a legend beside the plot naming them.
#[derive(Clone, Debug, Default)]
pub struct Chart {
    pub title: String,
    pub x: Axis,
    pub y: Axis,
    pub series: Vec<Series>,
}

/// One named line of a chart. Points are drawn in the order given; a
/// series of more than 2000 is thinned to about 2000 (every k-th point and
/// the last).
#[derive(Clone, Debug, Default)]
pub struct Series {
    pub name: String,
    pub points: Vec<(f64, f64)>,
}

/// Why a report could not be rendered.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The plotting library refused a chart.
    #[error("chart `{chart}`: {message}")]
    Draw { chart: String, message: String },
}

/// The page as HTML: a complete document, readable offline.
pub fn render(report: &Report) -> Result<String, ReportError> {
    let mut out = String::with_capacity(64 * 1024);
    out.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\"/>\n");
    out.push_str("<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\n");
    out.push_str(&format!("<title>{}</title>\n", escape(&report.title)));
    out.push_str("<style>\n");
    out.push_str(STYLE);
    out.push_str("</style>\n</head>\n<body>\n");
    out.push_str(&format!("<h1>{}</h1>\n", escape(&report.title)));
    if !report.facts.is_empty() {
        facts(&mut out, &report.facts);
    }
    if report.sections.len() > 1 {
        out.push_str("<nav><ol>\n");
        for (i, section) in report.sections.iter().enumerate() {
            out.push_str(&format!(
                "<li><a href=\"#s{i}\">{}</a></li>\n",
                escape(&section.heading)
            ));
        }
        out.push_str("</ol></nav>\n");
    }
    for (i, section) in report.sections.iter().enumerate() {
        out.push_str(&format!(
            "<section id=\"s{i}\">\n<h2>{}</h2>\n",
            escape(&section.heading)
        ));
        let mut in_charts = false;
        for block in &section.blocks {
            // Consecutive charts share one wrapping row.
            let chart = matches!(block, Block::Chart(_));
            if chart && !in_charts {
                out.push_str("<div class=\"charts\">\n");
            } else if !chart && in_charts {
                out.push_str("</div>\n");
            }
            in_charts = chart;
            match block {
                Block::Text(text) => out.push_str(&format!("<p>{}</p>\n", escape(text))),
                Block::Facts(pairs) => facts(&mut out, pairs),
                Block::Table(t) => table(&mut out, t),
                Block::Chart(c) => {
                    // The SVG has the title; the figure names it for
                    // readers that do not read SVG text.
                    out.push_str(&format!(
                        "<figure class=\"chart\" aria-label=\"{}\">\n",
                        escape(&c.title)
                    ));
                    if c.series.iter().all(|s| plot::drawable(c, s).next().is_none()) {
                        out.push_str(&format!(
                            "<p class=\"empty\">{}: no data to plot</p>\n",
                            escape(&c.title)
                        ));
                    } else {
                        out.push_str(&render_svg(c)?);
                    }
                    out.push_str("</figure>\n");
                }
            }
        }
        if in_charts {
            out.push_str("</div>\n");
        }
        out.push_str("</section>\n");
    }
    out.push_str("</body>\n</html>\n");
    Ok(out)
}

/// Escapes text for HTML content and attribute values.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '&' => out.push_str("&amp;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}

fn facts(out: &mut String, pairs: &[(String, String)]) {
    out.push_str("<dl class=\"facts\">\n");
    for (name, value) in pairs {
        out.push_str(&format!("<dt>{}</dt><dd>{}</dd>\n", escape(name), escape(value)));
    }
    out.push_str("</dl>\n");
}

fn table(out: &mut String, t: &Table) {
    out.push_str("<div class=\"table\"><table>\n");
    if let Some(caption) = &t.caption {
        out.push_str(&format!("<caption>{}</caption>\n", escape(caption)));
    }
    out.push_str("<thead><tr>");
    for h in &t.header {
        out.push_str(&format!("<th>{}</th>", escape(h)));
    }
    out.push_str("</tr></thead>\n<tbody>\n");
    for row in &t.rows {
        out.push_str("<tr>");
        for cell in row {
            if is_number(cell) {
                out.push_str(&format!("<td class=\"n\">{}</td>", escape(cell)));
            } else {
                out.push_str(&format!("<td>{}</td>", escape(cell)));
            }
        }
        out.push_str("</tr>\n");
    }
    out.push_str("</tbody>\n</table></div>\n");
}

fn is_number(cell: &str) -> bool {
    let t = cell.trim_end_matches('%');
    !t.is_empty() && t.parse::<f64>().is_ok()
}

/// The page's look: system fonts only, and no character that could start
/// markup, so the style needs no escaping.
const STYLE: &str = "body { font-family: system-ui, sans-serif; margin: 1.5em auto; max-width: 1500px; padding: 0 1em; color: #222; }
h1 { font-size: 1.5em; }
h2 { font-size: 1.2em; border-bottom: 1px solid #ccc; padding-bottom: 0.2em; margin-top: 2em; }
nav ol { columns: 2; }
dl.facts { display: grid; grid-template-columns: max-content auto; gap: 0.15em 1em; }
dl.facts dt { font-weight: 600; }
dl.facts dd { margin: 0; font-family: ui-monospace, monospace; }
div.charts { display: flex; flex-wrap: wrap; gap: 1em; }
figure.chart { margin: 0; border: 1px solid #ddd; padding: 0.5em; background: #fff; }
figure.chart svg { max-width: 100%; height: auto; display: block; }
div.table { overflow-x: auto; margin: 1em 0; }
table { border-collapse: collapse; font-size: 0.85em; }
caption { text-align: left; font-weight: 600; padding: 0.3em 0; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.5em; white-space: nowrap; }
th { background: #f3f3f3; position: sticky; top: 0; }
td.n { text-align: right; font-variant-numeric: tabular-nums; }
tbody tr:nth-child(even) { background: #fafafa; }
p.empty { color: #888; font-style: italic; }
";

#[cfg(test)]
mod tests;
