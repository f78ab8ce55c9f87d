//! Writes a generated burst workload (`iocache_sim::burst`) as a DiskSim
//! trace on stdout, for `iocache sim --trace`:
//!
//! ```text
//! cargo run -p iocache-sim --example burst_trace -- \
//!     --phase 2s@500:read=0.9:hot=0.95 --phase 500ms@20000:read=0.9:hot=0.95 \
//!     --repeat 4 --hot-lines 16384 --cold-lines 4194304 > burst.disksim
//! ```
//!
//! The number of warm-up requests (the read of the hot set, to pass to
//! `--warmup`) goes to stderr.

use std::io::Write;

use iocache_sim::burst::BurstSpec;

fn main() {
    if let Err(e) = run() {
        eprintln!("burst_trace: {e}");
        std::process::exit(2);
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let mut spec = BurstSpec {
        phases: Vec::new(),
        repeat: 1,
        hot_lines: 16384,
        cold_lines: 1 << 22,
        line_bytes: 4096,
        warm_lines_per_request: 64,
        warm_gap_ns: 2_000_000,
        seed: 1,
    };
    let mut args = std::env::args().skip(1);
    while let Some(flag) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--phase" => spec.phases.push(value()?.parse()?),
            "--repeat" => spec.repeat = value()?.parse()?,
            "--hot-lines" => spec.hot_lines = value()?.parse()?,
            "--cold-lines" => spec.cold_lines = value()?.parse()?,
            "--line-bytes" => spec.line_bytes = value()?.parse()?,
            "--seed" => spec.seed = value()?.parse()?,
            other => {
                return Err(format!(
                    "unknown flag {other}; flags: --phase DURATION@IOPS[:read=F][:hot=F] (repeatable), \
                     --repeat N, --hot-lines N, --cold-lines N, --line-bytes N, --seed N"
                )
                .into())
            }
        }
    }
    if spec.phases.is_empty() {
        return Err("give at least one --phase".into());
    }
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    spec.write_disksim(&mut out)?;
    out.flush()?;
    eprintln!("warm-up requests: {}", spec.warm_requests());
    Ok(())
}
