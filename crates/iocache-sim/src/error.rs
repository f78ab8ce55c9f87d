//! Errors of the simulator.

use thiserror::Error;

#[derive(Debug, Error)]
pub enum SimError {
    #[error(transparent)]
    Trace(#[from] iocache_trace::TraceError),
    #[error(transparent)]
    Core(#[from] iocache_core::CoreError),
    #[error("{0}")]
    Spec(String),
    /// A ReCA category table that is not valid (its error names the file, line and field).
    #[error(transparent)]
    Table(#[from] iocache_core::reca::TableError),
    /// A file the run needs (a category table, say) could not be read.
    #[error("reading {path}: {source}")]
    File {
        path: String,
        #[source]
        source: std::io::Error,
    },
}
