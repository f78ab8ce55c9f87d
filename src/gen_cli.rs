//! `iocache gen`, the command line of the workload
//! generator (`iocache_sim::workload`): reads a TOML spec, writes the trace
//! (MSR Cambridge CSV, gzip or zstd by the file name, or stdout to pipe
//! into `iocache sim --trace -`) and, if asked, the equivalent fio job.

use std::io::Write;
use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::Args;
use iocache_sim::workload::WorkloadSpec;

#[derive(Args)]
pub struct GenArgs {
    /// The workload spec (TOML; docs/workloads.md, examples/workloads/).
    #[arg(value_name = "SPEC")]
    spec: PathBuf,
    /// Write the trace here (MSR Cambridge CSV; compressed when the name ends in .gz or .zst),
    /// or to stdout with `-` (e.g. `iocache gen w.toml | iocache sim --trace - --format msr`).
    #[arg(short, long, default_value = "-", value_name = "PATH|-")]
    output: String,
    /// Also write the equivalent fio job file to FILE.
    #[arg(long, value_name = "FILE")]
    fio: Option<PathBuf>,
    /// The fio job's target: an NBD URI (fio's nbd engine) or a file.
    #[arg(
        long,
        value_name = "URI|PATH",
        default_value = "nbd+unix:///iocache?socket=iocache-data/iocache.sock"
    )]
    fio_target: String,
}

/// `iocache gen`.
pub fn run(args: GenArgs) -> Result<()> {
    let text = std::fs::read_to_string(&args.spec).with_context(|| format!("{}", args.spec.display()))?;
    let spec: WorkloadSpec =
        toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", args.spec.display()))?;
    let generator = spec
        .generator()
        .map_err(|e| anyhow::anyhow!("{}: {e}", args.spec.display()))?;
    if let Some(path) = &args.fio {
        let job = spec
            .fio_job(&args.fio_target)
            .map_err(|e| anyhow::anyhow!("{}: {e}", args.spec.display()))?;
        std::fs::write(path, job).with_context(|| format!("--fio {}", path.display()))?;
    }
    let sink: Box<dyn Write> = if args.output == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        Box::new(std::fs::File::create(&args.output).with_context(|| format!("--output {}", args.output))?)
    };
    let mut out: Box<dyn Write> = if args.output.ends_with(".gz") {
        Box::new(flate2::write::GzEncoder::new(
            sink,
            flate2::Compression::default(),
        ))
    } else if args.output.ends_with(".zst") {
        Box::new(zstd::Encoder::new(sink, 3)?.auto_finish())
    } else {
        sink
    };
    let written = match generator.write_msr(&mut out) {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => return Ok(()),
        other => other?,
    };
    drop(out);
    if args.output != "-" {
        log::info!(
            "wrote {} to {}",
            iocache_core::units::count(written, "request"),
            args.output
        );
    }
    Ok(())
}
