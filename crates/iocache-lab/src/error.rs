//! The lab's one error type. Every failure names what it concerns: the
//! file and key of an experiment, the tool that failed, the workload or
//! the reproduction it happened in.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LabError {
    /// A file could not be read or written.
    #[error("{}: {source}", path.display())]
    File {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// An experiment, a setting or a result file that is not valid; the
    /// message names the file and the key or line.
    #[error("{0}")]
    Invalid(String),
    /// A program the lab runs (fio, nbdkit, the server) is missing or failed.
    #[error("{0}")]
    Tool(String),
    #[error(transparent)]
    Trace(#[from] iocache_trace::TraceError),
    #[error(transparent)]
    Sim(#[from] iocache_sim::SimError),
    #[error(transparent)]
    Core(#[from] iocache_core::CoreError),
    #[error(transparent)]
    Timing(#[from] iocache_sim::timing::TimingError),
    #[error(transparent)]
    Report(#[from] iocache_report::ReportError),
    #[error(transparent)]
    Json(#[from] serde_json::Error),
    #[error(transparent)]
    Admin(#[from] iocache_serving::admin_client::AdminError),
    /// The run was stopped (Ctrl-C, SIGTERM) before it finished.
    #[error("interrupted")]
    Interrupted,
    /// A failure inside a named step: a workload, a point, a reproduction.
    #[error("{context}")]
    Within {
        context: String,
        #[source]
        source: Box<LabError>,
    },
}

pub type Result<T, E = LabError> = std::result::Result<T, E>;

/// `LabError::Invalid` from a format string.
macro_rules! invalid {
    ($($arg:tt)*) => {
        $crate::error::LabError::Invalid(format!($($arg)*))
    };
}
pub(crate) use invalid;

/// `LabError::Tool` from a format string.
macro_rules! tool {
    ($($arg:tt)*) => {
        $crate::error::LabError::Tool(format!($($arg)*))
    };
}
pub(crate) use tool;

/// Names the step an error happened in, or the file it concerns.
pub(crate) trait Within<T> {
    fn within(self, context: impl FnOnce() -> String) -> Result<T>;
    fn at_file(self, path: &std::path::Path) -> Result<T>;
}

impl<T, E: Into<LabError>> Within<T> for std::result::Result<T, E> {
    fn within(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| LabError::Within {
            context: context(),
            source: Box::new(e.into()),
        })
    }

    fn at_file(self, path: &std::path::Path) -> Result<T> {
        self.map_err(|e| match e.into() {
            LabError::Io(source) => LabError::File {
                path: path.to_path_buf(),
                source,
            },
            other => LabError::Within {
                context: path.display().to_string(),
                source: Box::new(other),
            },
        })
    }
}
