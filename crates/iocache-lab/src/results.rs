//! Result files of experiments: one JSON line per point, with side files
//! beside them (the series and the per-volume rows), read back each point
//! once, joined from slices, written as CSV and as an HTML page.

use std::collections::{BTreeMap, BTreeSet};
use std::io::BufRead;
use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::error::{invalid, Result, Within};

/// The side files beside a results file: `R.series.jsonl` (the cache
/// series, one line per point per window) and `R.volumes.jsonl` (one line
/// per point per volume), for results `R.jsonl`.
pub(crate) const SERIES: &str = "series.jsonl";
pub(crate) const VOLUMES: &str = "volumes.jsonl";
/// `R.decisions.jsonl`: an adaptive controller's windows or intervals, one
/// line per point per decision.
pub(crate) const DECISIONS: &str = "decisions.jsonl";

pub(crate) fn side_path(results: &Path, kind: &str) -> PathBuf {
    results.with_extension(kind)
}

/// Whether `path` is a side file (`R.series.jsonl`, ...) by its name.
fn is_side_file(path: &Path) -> bool {
    let name = path.file_name().map(|n| n.to_string_lossy()).unwrap_or_default();
    [SERIES, VOLUMES, DECISIONS]
        .iter()
        .any(|kind| name.ends_with(&format!(".{kind}")))
}

/// The side file `kind` beside `results`, opened for appending on first use.
pub(crate) fn side_file<'a>(
    files: &'a mut BTreeMap<&'static str, std::fs::File>,
    results: &Path,
    kind: &'static str,
) -> Result<&'a mut std::fs::File> {
    if !files.contains_key(kind) {
        let path = side_path(results, kind);
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .at_file(&path)?;
        files.insert(kind, file);
    }
    Ok(files.get_mut(kind).expect("inserted above"))
}

pub(crate) fn to_object(value: &impl serde::Serialize) -> Result<serde_json::Map<String, Value>> {
    match serde_json::to_value(value)? {
        Value::Object(map) => Ok(map),
        other => Err(invalid!("expected an object, got {other}")),
    }
}

/// Each row of a JSON-lines file, with where it is (`PATH:LINE`), blank
/// lines skipped.
fn each_row(path: &Path, mut row: impl FnMut(&dyn Fn() -> String, Value) -> Result<()>) -> Result<()> {
    let file = std::fs::File::open(path).at_file(path)?;
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line?;
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{}:{}", path.display(), n + 1);
        let value: Value = serde_json::from_str(&line)
            .within(|| format!("{}: not a JSON object (a run cut short? remove that line)", at()))?;
        row(&at, value)?;
    }
    Ok(())
}

/// The ids of the points a results file holds (none if it does not exist).
pub(crate) fn done_ids(path: &Path) -> Result<BTreeSet<String>> {
    let mut ids = BTreeSet::new();
    if path.exists() {
        each_row(path, |_, row| {
            ids.extend(crate::live::row_key(&row));
            Ok(())
        })?;
    }
    Ok(ids)
}

/// The rows of result files, each point once (the first seen), in grid order.
pub fn read_rows(paths: &[PathBuf]) -> Result<Vec<Value>> {
    let mut rows: BTreeMap<String, Value> = BTreeMap::new();
    for path in paths {
        each_row(path, |at, row| {
            let id = crate::live::row_key(&row).ok_or_else(|| invalid!("{}: no point_id", at()))?;
            rows.entry(id).or_insert(row);
            Ok(())
        })?;
    }
    let mut rows: Vec<Value> = rows.into_values().collect();
    rows.sort_by_key(|r| r["point"].as_u64().unwrap_or(u64::MAX));
    Ok(rows)
}

/// The rows of side files (series or volumes), each (point, window,
/// volume) once, in point, window and volume order (a rerun after an
/// interruption may have written some twice).
pub fn read_side_rows(paths: &[PathBuf]) -> Result<Vec<Value>> {
    let mut rows: BTreeMap<(u64, u64, i64, String), Value> = BTreeMap::new();
    for path in paths {
        each_row(path, |at, row| {
            let id = row["point_id"]
                .as_str()
                .ok_or_else(|| invalid!("{}: no point_id", at()))?
                .to_string();
            let key = (
                row["point"].as_u64().unwrap_or(u64::MAX),
                row["index"].as_u64().unwrap_or(0),
                row["volume"].as_i64().unwrap_or(-1),
                id,
            );
            rows.entry(key).or_insert(row);
            Ok(())
        })?;
    }
    Ok(rows.into_values().collect())
}

/// Writes rows as CSV: one column per key any row has, in reading order:
/// the workload, the point and its target, the knobs in grid order, the
/// results (in order of first appearance), and the long `point_id` last.
pub fn write_csv(rows: &[Value], path: &Path) -> Result<()> {
    std::fs::write(path, csv_text(rows)).at_file(path)
}

/// The CSV [`write_csv`] writes.
pub fn csv_text(rows: &[Value]) -> String {
    let mut columns: Vec<String> = Vec::new();
    for row in rows {
        for key in row.as_object().into_iter().flat_map(|m| m.keys()) {
            if !columns.contains(key) {
                columns.push(key.clone());
            }
        }
    }
    // A stable sort: results keep their order among themselves.
    columns.sort_by_key(|c| match c.as_str() {
        "workload" => (0, 0),
        "point" => (0, 1),
        "target" => (0, 2),
        "point_id" => (3, 0),
        knob => match crate::experiment::knob_rank(knob) {
            Some(rank) => (1, rank),
            None => (2, 0),
        },
    });
    let mut out = columns.join(",") + "\n";
    for row in rows {
        let cells: Vec<String> = columns
            .iter()
            .map(|c| match &row[c] {
                Value::String(s) => iocache_sim::report::csv_field(s),
                Value::Null => String::new(),
                other => other.to_string(),
            })
            .collect();
        out += &(cells.join(",") + "\n");
    }
    out
}

/// Joins result files (slices of one experiment) into `output`, each
/// point once, in grid order, with their side files; also as CSV when
/// asked. Returns how many points.
pub fn merge(parts: &[PathBuf], output: &Path, csv: Option<&Path>) -> Result<usize> {
    // A shell glob over the parts (`part.*.jsonl`) also names their side
    // files: they are joined beside the results, never as results.
    let (sides, parts): (Vec<PathBuf>, Vec<PathBuf>) = parts.iter().cloned().partition(|p| is_side_file(p));
    for side in &sides {
        log::info!("{}: a side file, joined with its results file", side.display());
    }
    if parts.is_empty() {
        return Err(invalid!(
            "no results files among the parts: only side files (*.series.jsonl, ...)"
        ));
    }
    let parts = &parts[..];
    let rows = read_rows(parts)?;
    let mut out = String::new();
    for row in &rows {
        out += &(row.to_string() + "\n");
    }
    std::fs::write(output, out).at_file(output)?;
    if let Some(csv) = csv {
        write_csv(&rows, csv)?;
    }
    // The side files of the parts that have them, joined the same way.
    for kind in [SERIES, VOLUMES, DECISIONS] {
        let parts: Vec<PathBuf> = parts
            .iter()
            .map(|p| side_path(p, kind))
            .filter(|p| p.exists())
            .collect();
        if parts.is_empty() {
            continue;
        }
        let out = side_path(output, kind);
        let mut text = String::new();
        for row in read_side_rows(&parts)? {
            text += &(row.to_string() + "\n");
        }
        std::fs::write(&out, text).at_file(&out)?;
    }
    Ok(rows.len())
}

/// The HTML page of result files (and the series beside them).
pub fn report(results: &[PathBuf]) -> Result<iocache_report::Report> {
    let rows = read_rows(results)?;
    if rows.is_empty() {
        return Err(invalid!("{}: no results", results[0].display()));
    }
    let sources: Vec<String> = results.iter().map(|p| p.display().to_string()).collect();
    // The series beside the results, when the experiment asked for one.
    let series_files: Vec<PathBuf> = results
        .iter()
        .map(|p| side_path(p, SERIES))
        .filter(|p| p.exists())
        .collect();
    let series = read_side_rows(&series_files)?;
    crate::reports::lab(&rows, &series, &sources.join(", "))
}
