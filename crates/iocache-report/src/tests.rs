//! Unit tests of the page: well-formed markup, every series drawn, nothing
//! that would make a browser fetch anything.

use super::*;

/// Checks that `text` is well-formed as XML would have it (every tag
/// closed in order, attributes quoted, no stray `<` or `&`), allowing the
/// one `<!DOCTYPE html>`. Returns the names of the elements, in order.
fn well_formed(text: &str) -> Vec<String> {
    let mut stack: Vec<String> = Vec::new();
    let mut elements = Vec::new();
    let mut rest = text;
    while let Some(open) = rest.find(['<', '&']) {
        let (before, at) = rest.split_at(open);
        assert!(
            !before.contains('>'),
            "stray `>` before {:?}",
            &at[..at.len().min(60)]
        );
        if at.starts_with('&') {
            let end = at.find(';').expect("entity ends with ;");
            let name = &at[1..end];
            assert!(
                ["lt", "gt", "amp", "quot", "apos", "#39"].contains(&name),
                "unknown entity &{name};"
            );
            rest = &at[end + 1..];
            continue;
        }
        let end = at.find('>').expect("tag ends");
        let tag = &at[1..end];
        rest = &at[end + 1..];
        if tag.starts_with("!DOCTYPE") {
            assert!(stack.is_empty() && elements.is_empty(), "DOCTYPE first");
            continue;
        }
        assert!(
            !tag.starts_with('!') && !tag.starts_with('?'),
            "unexpected <{tag}>"
        );
        if let Some(name) = tag.strip_prefix('/') {
            assert_eq!(stack.pop().as_deref(), Some(name.trim()), "closing </{name}>");
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().expect("a name").to_string();
        assert!(
            name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'),
            "name {name}"
        );
        // Attributes: name="value", values without `<` or a bare `"`.
        let mut attrs = body[name.len()..].trim();
        while !attrs.is_empty() {
            let eq = attrs
                .find("=\"")
                .unwrap_or_else(|| panic!("attribute in <{tag}>"));
            let close = attrs[eq + 2..].find('"').expect("quoted value") + eq + 2;
            assert!(!attrs[eq + 2..close].contains('<'));
            attrs = attrs[close + 1..].trim_start();
        }
        elements.push(name.clone());
        if !self_closing {
            stack.push(name);
        }
    }
    assert!(!rest.contains('>'), "stray `>` at the end");
    assert!(stack.is_empty(), "unclosed: {stack:?}");
    elements
}

/// Fails on anything a browser would load: a URL other than the SVG
/// namespace (an identifier, never fetched), or an attribute that loads.
fn assert_self_contained(html: &str) {
    let without_ns = html.replace("xmlns=\"http://www.w3.org/2000/svg\"", "");
    for needle in [
        "http://",
        "https://",
        "//",
        "src=",
        "href=\"http",
        "url(",
        "@import",
        "<script",
        "<link",
    ] {
        // `//` is fine inside text as long as it is not a URL: no text of
        // the tests' reports has it.
        assert!(!without_ns.contains(needle), "the page holds `{needle}`");
    }
}

fn sample() -> Report {
    let curve = |name: &str, f: fn(f64) -> f64| Series {
        name: name.into(),
        points: (10..=20).map(|e| 2f64.powi(e)).map(|x| (x, f(x))).collect(),
    };
    Report {
        title: "A <test> & report".into(),
        facts: vec![("trace".into(), "t.csv".into())],
        sections: vec![
            Section {
                heading: "Hit ratio".into(),
                blocks: vec![
                    Block::Text("Curves per policy.".into()),
                    Block::Chart(Chart {
                        title: "hit ratio vs cache size".into(),
                        x: Axis {
                            label: "cache size".into(),
                            scale: Scale::Log,
                            ticks: Ticks::Bytes,
                            range: None,
                        },
                        y: Axis {
                            label: "hit ratio".into(),
                            ticks: Ticks::Percent,
                            range: Some((0.0, 1.0)),
                            ..Axis::default()
                        },
                        series: vec![
                            curve("lru-series", |x| (x.log2() - 9.0) / 12.0),
                            curve("arc-series", |x| (x.log2() - 8.0) / 13.0),
                        ],
                    }),
                    Block::Chart(Chart {
                        title: "latency CDF".into(),
                        x: Axis {
                            label: "latency".into(),
                            scale: Scale::Log,
                            ticks: Ticks::Nanoseconds,
                            range: None,
                        },
                        y: Axis {
                            label: "fraction".into(),
                            ..Axis::default()
                        },
                        series: vec![Series {
                            name: "reads <p99>".into(),
                            points: (1..=100).map(|i| (i as f64 * 1000.0, i as f64 / 100.0)).collect(),
                        }],
                    }),
                ],
            },
            Section {
                heading: "Table".into(),
                blocks: vec![
                    Block::Table(Table {
                        caption: Some("runs".into()),
                        header: vec!["policy".into(), "hit ratio".into()],
                        rows: vec![vec!["lru".into(), "0.5".into()], vec!["a&b".into(), "12%".into()]],
                    }),
                    Block::Facts(vec![("k".into(), "v".into())]),
                ],
            },
        ],
    }
}

#[test]
fn page_is_well_formed_and_self_contained() {
    let html = render(&sample()).unwrap();
    let elements = well_formed(&html);
    assert_eq!(elements.iter().filter(|e| *e == "svg").count(), 2);
    assert_eq!(elements.iter().filter(|e| *e == "table").count(), 1);
    assert!(elements.iter().any(|e| e == "polyline" || e == "path"));
    assert_self_contained(&html);
    assert!(html.contains("<title>A &lt;test&gt; &amp; report</title>"));
    assert!(html.contains("<td>a&amp;b</td>"));
    assert!(html.contains("<td class=\"n\">12%</td>"));
}

#[test]
fn every_series_is_drawn_with_its_name() {
    let report = sample();
    let Block::Chart(chart) = &report.sections[0].blocks[1] else {
        panic!("a chart")
    };
    let svg = render_svg(chart).unwrap();
    well_formed(&svg);
    for name in ["lru-series", "arc-series"] {
        assert!(svg.contains(name), "legend names {name}");
    }
    // One line per series (a polyline each) and a marker per point.
    assert!(svg.matches("<polyline").count() >= 2, "{svg}");
    assert_eq!(svg.matches("<circle").count(), 22 + 2);
    // Names are escaped by plotters too.
    let Block::Chart(cdf) = &report.sections[0].blocks[2] else {
        panic!("a chart")
    };
    let svg = render_svg(cdf).unwrap();
    assert!(svg.contains("reads &lt;p99&gt;"));
    // 100 points: a line without markers (the one circle is the legend's).
    assert_eq!(svg.matches("<circle").count(), 1);
}

#[test]
fn the_checks_catch_what_they_look_for() {
    let bad = "<!DOCTYPE html><html><body><img src=\"http://example.invalid/x.png\"/></body></html>";
    well_formed(bad);
    assert!(std::panic::catch_unwind(|| assert_self_contained(bad)).is_err());
    assert!(std::panic::catch_unwind(|| well_formed("<html><body></html>")).is_err());
    assert!(std::panic::catch_unwind(|| well_formed("<p>a < b</p>")).is_err());
}

#[test]
fn charts_without_data_say_so() {
    let report = Report {
        title: "empty".into(),
        facts: vec![],
        sections: vec![Section {
            heading: "nothing".into(),
            blocks: vec![Block::Chart(Chart {
                title: "log of nothing".into(),
                x: Axis {
                    scale: Scale::Log,
                    ..Axis::default()
                },
                series: vec![Series {
                    name: "zeros".into(),
                    points: vec![(0.0, 1.0), (f64::NAN, 2.0)],
                }],
                ..Chart::default()
            })],
        }],
    };
    let html = render(&report).unwrap();
    well_formed(&html);
    assert!(!html.contains("<svg"));
    assert!(html.contains("log of nothing: no data to plot"));
}

#[test]
fn single_points_and_flat_lines_plot() {
    for scale in [Scale::Linear, Scale::Log] {
        let chart = Chart {
            title: "one point".into(),
            x: Axis {
                scale,
                ..Axis::default()
            },
            y: Axis {
                scale,
                ..Axis::default()
            },
            series: vec![Series {
                name: "p".into(),
                points: vec![(5.0, 5.0)],
            }],
        };
        well_formed(&render_svg(&chart).unwrap());
    }
}

#[test]
fn long_series_are_thinned_and_long_legends_grow_the_picture() {
    let chart = Chart {
        title: "many".into(),
        series: (0..40)
            .map(|i| Series {
                name: format!("series {i}"),
                points: (0..10_000).map(|x| (x as f64, (x * i) as f64)).collect(),
            })
            .collect(),
        ..Chart::default()
    };
    let svg = render_svg(&chart).unwrap();
    well_formed(&svg);
    // About 2000 points a line: 40 lines of 10,000 points would be ~5 MB.
    assert!(svg.len() < 2_000_000, "{} bytes", svg.len());
    assert!(svg.contains("series 39"));
    let height: u32 = svg
        .split("height=\"")
        .nth(1)
        .unwrap()
        .split('"')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(height >= 50 + 40 * 18, "height {height}");
}

#[test]
fn forty_series_have_forty_styles() {
    let styles: std::collections::HashSet<(u8, u8, u8, usize)> = (0..40)
        .map(|i| {
            let s = plot::Style::of(i);
            let c = s.colour;
            (c.0, c.1, c.2, s.shape)
        })
        .collect();
    assert_eq!(styles.len(), 40);
}

#[test]
fn tick_labels() {
    use plot::{short, tick};
    assert_eq!(short(0.25), "0.25");
    assert_eq!(short(1234.5678), "1235");
    assert_eq!(short(2.0), "2");
    assert_eq!(short(1.5e7), "1.50e7");
    assert_eq!(tick(16.0 * 1024.0 * 1024.0, Ticks::Bytes), "16MiB");
    assert_eq!(tick(1536.0, Ticks::Bytes), "1.5KiB");
    assert_eq!(tick(0.5, Ticks::Percent), "50%");
    assert_eq!(tick(120_000.0, Ticks::Nanoseconds), "120µs");
    assert_eq!(tick(3e6, Ticks::Nanoseconds), "3ms");
    // Rounding noise on an axis from -0.1 to 0.1 is 0; a small real value is not.
    assert_eq!(short(plot::snap_to_zero(-5.55e-17, 0.2)), "0");
    assert_eq!(short(plot::snap_to_zero(-0.02, 0.2)), "-0.02");
}
