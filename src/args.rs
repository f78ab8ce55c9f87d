//! What several commands take and give: a trace to read (`--trace`,
//! `--format`), output files opened before a run starts (so a bad path
//! fails fast and a failed run leaves no half-written file), stdout that
//! may be a closed pipe, and a line size.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use clap::Args;
use iocache_core::LineSize;
use iocache_sim::SimError;
use iocache_trace::{ReaderOptions, TraceFormat, TraceReader};

#[derive(Args)]
pub struct TraceInput {
    /// Trace file (plain, gzip, zstd or bzip2; detected from content), or `-` for stdin.
    #[arg(long, value_name = "PATH|-")]
    pub trace: PathBuf,
    /// Trace format: msr, systor, tencent, fiu, vscsi-csv, disksim, arc, blkparse, fio, lba
    /// (with parameters, e.g. blkparse:action=D, lba:block=4096). Detected when omitted.
    #[arg(long, value_name = "NAME")]
    pub format: Option<String>,
    /// Skip malformed lines (and report how many) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

/// The format flags of a command that takes its trace as an argument
/// (`iocache trace stats PATH`), read as [`TraceInput`] reads them.
#[derive(Args)]
pub struct TraceFormatArgs {
    /// Trace format (detected when omitted).
    #[arg(long, value_name = "NAME")]
    pub format: Option<String>,
    /// Skip malformed lines (and report how many) instead of stopping at the first.
    #[arg(long)]
    pub skip_bad_lines: bool,
}

impl TraceFormatArgs {
    /// The trace at `trace`, read with these flags.
    pub fn input(&self, trace: PathBuf) -> TraceInput {
        TraceInput {
            trace,
            format: self.format.clone(),
            skip_bad_lines: self.skip_bad_lines,
        }
    }
}

impl TraceInput {
    pub fn open(&self) -> Result<TraceReader> {
        let format = self
            .format
            .as_deref()
            .map(|f| f.parse::<TraceFormat>())
            .transpose()
            .map_err(|e| anyhow::anyhow!("--format: {e}"))?;
        let options = ReaderOptions {
            skip_bad_lines: self.skip_bad_lines,
        };
        if self.is_stdin() {
            return Ok(TraceReader::from_reader(
                "stdin",
                Box::new(std::io::stdin()),
                format,
                options,
            )?);
        }
        Ok(TraceReader::open(&self.trace, format, options)?)
    }

    pub fn is_stdin(&self) -> bool {
        self.trace.as_os_str() == "-"
    }

    /// Adds the way out to an error reading the trace: a malformed line
    /// names the format the file looks like when `--format` chose another,
    /// and `--skip-bad-lines` otherwise.
    pub fn explain(&self, error: anyhow::Error) -> anyhow::Error {
        let trace_error = error.chain().find_map(|c| {
            c.downcast_ref::<iocache_trace::TraceError>()
                .or_else(|| match c.downcast_ref::<SimError>() {
                    Some(SimError::Trace(t)) => Some(t),
                    _ => None,
                })
        });
        let Some(iocache_trace::TraceError::Parse { .. }) = trace_error else {
            return error;
        };
        let detected = (!self.is_stdin() && self.format.is_some())
            .then(|| TraceReader::open(&self.trace, None, ReaderOptions::default()).ok())
            .flatten()
            .map(|r| r.format().to_string())
            .filter(|detected| Some(detected.as_str()) != self.format.as_deref());
        let hint = match detected {
            Some(detected) => format!(
                "the file looks like `{detected}` traces: try --format {detected}, or leave --format out to detect it"
            ),
            None if self.skip_bad_lines => return error,
            None => "to skip malformed lines (they are counted and reported), add --skip-bad-lines".to_string(),
        };
        anyhow::anyhow!(
            "{}\n  hint: {hint}",
            iocache_serving::error_chain_text(error.as_ref())
        )
    }
}

/// A text table of `items`, a row each as `row` makes it.
pub fn table_of<T>(
    header: &[&str],
    items: impl IntoIterator<Item = T>,
    row: impl FnMut(T) -> Vec<String>,
) -> String {
    iocache_sim::report::table(header, &items.into_iter().map(row).collect::<Vec<_>>())
}

/// The JSON of a series file: `{"runs": [...]}`, per run of `report` its
/// policy, its cache size and the fields of the object `more` gives.
pub fn runs_json(
    report: &iocache_sim::SimReport,
    more: impl Fn(&iocache_sim::RunResult) -> serde_json::Value,
) -> serde_json::Value {
    let runs: Vec<serde_json::Value> = (report.runs.iter())
        .map(|run| {
            let mut fields = serde_json::json!({
                "policy": run.spec.policy.to_string(),
                "cache_size": run.spec.size.to_string(),
            });
            if let (Some(map), serde_json::Value::Object(more)) = (fields.as_object_mut(), more(run)) {
                map.extend(more);
            }
            fields
        })
        .collect();
    serde_json::json!({ "runs": runs })
}

/// An output file named before a long run, opened (created when missing)
/// before the run starts so a mistyped directory fails at once; a file this
/// created is removed again when the run fails.
pub struct OutputFile {
    pub path: PathBuf,
    file: std::fs::File,
    created: bool,
    kept: bool,
}

impl OutputFile {
    /// Opens `path` for `flag`; `-` (stdout) is `None`.
    pub fn check(flag: &str, path: Option<&str>) -> Result<Option<OutputFile>> {
        let Some(path) = path.filter(|p| *p != "-") else {
            return Ok(None);
        };
        let path = PathBuf::from(path);
        let created = !path.exists();
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(false)
            .open(&path)
            .with_context(|| format!("{flag} {}: cannot write there", path.display()))?;
        Ok(Some(OutputFile {
            path,
            file,
            created,
            kept: false,
        }))
    }

    /// Opens `path` for `flag`, where stdout is no choice (an HTML page).
    pub fn check_path(flag: &str, path: Option<&std::path::Path>) -> Result<Option<OutputFile>> {
        match path {
            Some(p) if p.as_os_str() == "-" => bail!("{flag}: give a file name (the page is HTML)"),
            Some(p) => OutputFile::check(flag, Some(&p.to_string_lossy())),
            None => Ok(None),
        }
    }

    /// Replaces the file's contents with `text`.
    pub fn write(mut self, text: &str) -> Result<()> {
        // Only a regular file is truncated (`/dev/null` and pipes cannot be).
        if self.file.metadata()?.is_file() {
            self.file.set_len(0)?;
        }
        self.file.write_all(text.as_bytes())?;
        self.file.flush()?;
        self.kept = true;
        Ok(())
    }
}

impl Drop for OutputFile {
    fn drop(&mut self) {
        if self.created && !self.kept {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

/// Refuses two output flags that name one file, where the second would
/// overwrite the first (`-`, stdout, is left to each flag).
pub fn distinct_outputs(outputs: &[(&str, Option<&str>)]) -> Result<()> {
    let mut seen: Vec<(&str, PathBuf)> = Vec::new();
    for &(flag, path) in outputs {
        let Some(path) = path.filter(|p| *p != "-") else {
            continue;
        };
        let key = same_file_key(std::path::Path::new(path));
        if let Some((other, _)) = seen.iter().find(|(_, k)| *k == key) {
            bail!(
                "{other} and {flag} both name {path}: one would overwrite the other; give each its own file"
            );
        }
        seen.push((flag, key));
    }
    Ok(())
}

/// A path in the form two spellings of one file share: its directory
/// resolved, where it exists.
fn same_file_key(path: &std::path::Path) -> PathBuf {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    };
    match (dir.canonicalize(), path.file_name()) {
        (Ok(dir), Some(name)) => dir.join(name),
        _ => path.to_path_buf(),
    }
}

/// Refuses `-` for an output that cannot share stdout.
pub fn not_stdout(flag: &str, path: Option<&str>, why: &str) -> Result<()> {
    if path == Some("-") {
        bail!("{flag} -: give a file name ({why})");
    }
    Ok(())
}

/// A `--line-size` value.
pub fn parse_line_size(text: &str) -> Result<LineSize> {
    let bytes =
        iocache_core::units::parse_byte_size(text).map_err(|e| anyhow::anyhow!("--line-size: {e}"))?;
    LineSize::new(bytes).map_err(|e| anyhow::anyhow!("--line-size: {e}"))
}

/// Writes `text` and a newline to stdout; a closed pipe (`| head`) ends quietly.
/// Writes `value` as JSON where the flag's `path` asked: stdout for `-`
/// (then true: the command prints nothing else), or `file`, opened by
/// [`OutputFile::check`] before the work. No flag: false, nothing written.
pub fn write_json(
    path: Option<&str>,
    file: Option<OutputFile>,
    value: &impl serde::Serialize,
) -> Result<bool> {
    let Some(path) = path else { return Ok(false) };
    let json = serde_json::to_string_pretty(value)?;
    match file {
        None => print_stdout(&json).map(|()| true),
        Some(file) => {
            file.write(&(json + "\n"))
                .with_context(|| format!("writing {path}"))?;
            Ok(false)
        }
    }
}

pub fn print_stdout(text: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}
