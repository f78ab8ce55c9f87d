//! The serving layer: what connects the engine to NBD, in both directions,
//! and runs a server.
//!
//! The engine (`iocache-engine`) runs a cache over block devices and knows
//! nothing of NBD; the NBD crate (`iocache-nbd`) serves any export and knows
//! nothing of caches. This crate is the only one that knows both:
//!
//! - [`EngineCell`] is where the engine of a cache device is found: it may
//!   be replaced while serving (a live line size change, [`relayout`]);
//! - [`EngineExport`] serves one volume of an engine as an NBD export (what
//!   the server calls for each command);
//! - [`NbdBackend`] is a remote NBD export as the backend device of a volume
//!   (a pool of connections, reconnection and a circuit breaker);
//! - [`start::serve`] runs a server for a [`config::ServeConfig`]: devices
//!   opened ([`devices`]), one engine per cache device, the NBD listeners,
//!   the admin socket ([`admin`]) and metrics ([`metrics`]), and the state
//!   they share while it runs ([`running::Running`]: attach, detach, flush,
//!   settings);
//! - [`stats::Snapshot`] is a server's statistics, typed, as the admin
//!   socket, `iocache stats` and the metrics all show them;
//! - [`admin_client::request`] asks a running server's admin socket.
//!
//! Errors are [`ServeError`]; they name configuration keys as the
//! configuration's [`config::Origin`] names them, and a refusal that the
//! operator may override says so with an [`Acknowledgement`].

pub mod admin;
pub mod admin_client;
mod cell;
pub mod config;
pub mod devices;
mod error;
mod export;
pub mod metrics;
mod nbd_backend;
pub mod reca;
pub mod relayout;
pub mod running;
pub mod service;
pub mod start;
pub mod stats;
pub mod stats_csv;
pub mod stats_text;

pub use cell::{CurrentEngine, EngineCell};
pub use error::{error_chain_text, Acknowledgement, Result, ServeError};
pub use export::EngineExport;
pub use nbd_backend::{NbdBackend, NBD_BACKEND_CONNECTIONS, NBD_BACKEND_REQUEST_TIMEOUT};

/// A scratch directory for a unit test, emptied first, named after the
/// test and this process so that concurrent runs do not meet.
#[cfg(test)]
pub(crate) fn scratch_dir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("iocache-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
