//! The serving layer: what connects the engine to NBD, in both directions.
//!
//! The engine (`iocache-engine`) runs a cache over block devices and knows
//! nothing of NBD; the NBD crate (`iocache-nbd`) serves any export and knows
//! nothing of caches. This crate is the only one that knows both:
//!
//! - [`EngineCell`] is where the engine of a cache device is found: it may
//!   be replaced while serving (a live line size change);
//! - [`EngineExport`] serves one volume of an engine as an NBD export (what
//!   the server calls for each command);
//! - [`NbdBackend`] is a remote NBD export as the backend device of a volume
//!   (a pool of connections, reconnection and a circuit breaker);
//! - [`admin_client::request`] asks a running server's admin socket.

pub mod admin_client;
mod cell;
mod export;
mod nbd_backend;

pub use cell::{CurrentEngine, EngineCell};
pub use export::EngineExport;
pub use nbd_backend::{NbdBackend, NBD_BACKEND_CONNECTIONS, NBD_BACKEND_REQUEST_TIMEOUT};
