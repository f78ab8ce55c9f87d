//! NBD (Network Block Device) for iocache: the wire protocol, a server and a
//! client.
//!
//! The cache will be served to its clients over NBD, and a remote NBD export
//! can be one of its backends, so both ends of the protocol live here:
//!
//! - [`proto`]: every constant of the protocol and sans-I/O encoders and
//!   parsers for the handshake, options, requests and replies (simple and
//!   structured).
//! - [`handshake`]: the server side of fixed newstyle option negotiation,
//!   generic over any byte stream so it can be tested without sockets.
//! - [`export`]: the [`Export`] trait the cache implements, its errors and
//!   their NBD error numbers, and [`MemExport`], a RAM-backed export.
//! - [`server`]: [`Server`], listening on a Unix socket and/or TCP, one thread
//!   per connection plus a small worker pool that answers pipelined requests
//!   out of order.
//! - [`client`]: [`Client`], a minimal blocking client, and
//!   [`parse_nbd_uri`] for `nbd://` and `nbd+unix://` URIs.
//!
//! It depends on nothing but `std` and `thiserror`: no async runtime; the
//! server uses threads and bounded queues.

pub mod client;
pub mod export;
pub mod handshake;
pub mod proto;
pub mod server;

pub use client::{
    list_exports, parse_nbd_uri, Client, ClientError, ConnectOptions, NbdAddr, NbdUri, UriError,
};
pub use export::{Export, ExportError, Exports, MemExport};
pub use handshake::{HandshakeError, Negotiated, NegotiationLimits};
pub use proto::{CmdFlags, Command, ProtoError, Request, RequestHeader};
pub use server::{RunningServer, Server, ServerConfig, ServerError, ServerStats, ShutdownHandle};
