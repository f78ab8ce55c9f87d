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
}
