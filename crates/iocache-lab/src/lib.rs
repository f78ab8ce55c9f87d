//! The experiment lab: what a cache researcher runs on top of the
//! simulator and the live engine.
//!
//! - [`experiment`]: a grid of knobs over workloads, run resumably and in
//!   shards ([`experiment::run`]), one JSON line per point;
//! - [`results`]: result files read back, merged, written as CSV and as a page;
//! - [`live`]: the same points against a real `iocache serve` driven by fio;
//! - [`replay`]: a real trace's requests replayed over NBD by our own client;
//! - [`reports`]: the HTML reports of `lab report`, `sim --report` and
//!   `trace mrc --report` (what is plotted and tabulated);
//! - [`reproduce`]: the seed papers' findings re-run, with verdicts
//!   computed from the numbers.
//! - [`reca_table`]: ReCA's category vectors measured on generated
//!   reference workloads (`lab reca-table`).
//!
//! Errors are [`LabError`]; they name the file and key, the tool or the
//! step they come from, never a command-line flag.

pub mod error;
pub mod experiment;
pub mod live;
pub mod reca_table;
pub mod replay;
pub mod reports;
pub mod reproduce;
pub mod results;

pub use error::{LabError, Result};

/// What a long pass over a workload reports as it goes (a bar on a
/// terminal, or nothing).
pub trait Progress {
    /// A pass begins; `label` names it.
    fn start(&mut self, _label: &str) {}
    /// `records` requests read so far from `reader`.
    fn update(&mut self, _reader: &iocache_trace::TraceReader, _records: u64) {}
    /// The pass ended.
    fn finish(&mut self) {}
}

/// No progress shown.
impl Progress for () {}
